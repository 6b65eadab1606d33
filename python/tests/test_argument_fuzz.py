"""A bounded fuzzer of the Python argument layer (hardening issue): random dtypes, ranks, shapes,
strides, byte orders and options thrown at attn.attention / attn.attend / attn.explain, and (issue
37) at the KV cache (flash_attn_with_kvcache), the linear state (linear_attention with
initial_state / output_final_state), a tiny GGUF model (logits, perplexity, generate, Decoder)
and its tokenizer: None, bytes, floats where integers go, out-of-range integers. Every
outcome must be a correct result or the project's own error (ValueError/TypeError with a message
that names an argument) -- never a crash, a foreign message from the binding layer, or NaN from
finite inputs."""
import math
import os

import numpy as np
from hypothesis import HealthCheck, event, given, settings, strategies as st

import attn

EXAMPLES = int(os.environ.get("ATTN_HYPOTHESIS_EXAMPLES", "300"))

# Every message of ours names what it is about; nanobind's generic dump does not.
FOREIGN = ("incompatible function arguments", "Invoked with", "nanobind", "TypeError: __call__")
NAMES = ("q", "k", "v", "attn_mask", "mask", "bias", "key_padding_lengths", "alibi_slopes", "window", "scale",
         "softcap", "dropout", "threads", "mechanism", "layout", "form", "isa", "params", "seed", "causal",
         "return_lse", "return_probs", "out", "head", "batch", "dtype", "shape")

dtypes = st.sampled_from(["float32", "float32", "float16", "float64", "int32", "bool", ">f4", "object", "complex64"])


@st.composite
def array(draw, shape):
    dt = draw(dtypes)
    x = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).standard_normal(shape)
    if dt == "object":
        return x.astype(object)
    x = x.astype(np.dtype(dt))
    if draw(st.booleans()) and x.ndim >= 1 and x.shape[-1] > 1:  # a non-contiguous slice
        x = x[..., ::2]
    return x


@st.composite
def calls(draw):
    rank = draw(st.sampled_from([4, 4, 4, 3, 5]))
    B, N, M, H, D = (draw(st.integers(0, 4)) for _ in range(5))
    Hkv = draw(st.sampled_from([H, 1, 2, 3]))
    qs = (B, N, H, D)[:rank] if rank <= 4 else (B, N, H, D, 1)
    ks = (B, M, Hkv, D)[:rank] if rank <= 4 else (B, M, Hkv, D, 1)
    q, k, v = draw(array(qs)), draw(array(ks)), draw(array(ks))
    kw = {}
    if draw(st.booleans()):
        kw["causal"] = draw(st.sampled_from([True, False, 1, "no", None]))
    if draw(st.booleans()):
        kw["softmax_scale"] = draw(st.sampled_from([0.5, -1.0, 0.0, 1e39, float("nan"), "1", 2**70]))
    if draw(st.booleans()):
        kw["window_size"] = draw(st.sampled_from([(-1, -1), (3, 0), (1.7, 0), (2**63 - 1, 0), (0, 2**63 - 1), (-5, 0),
                                                  (2**64, 0), "ab", (1,)]))
    if draw(st.booleans()):
        kw["softcap"] = draw(st.sampled_from([0.0, 30.0, -1.0, 1e39]))
    if draw(st.booleans()):
        kw["threads"] = draw(st.sampled_from([0, 1, 2, 256, 257, -1, 2**70, 1.5]))
    if draw(st.booleans()):
        kw["key_padding_lengths"] = draw(st.sampled_from([[0] * max(B, 1), [M] * B, [-1], [2**64], [1.5]]))
    if draw(st.booleans()):
        kw["attn_mask"] = draw(array((N, M)))
    if draw(st.booleans()):
        kw["layout"] = draw(st.sampled_from(["bnhd", "bhnd", "nhd", None]))
    return q, k, v, kw


def check_outcome(fn):
    try:
        out = fn()
    except (ValueError, TypeError) as e:
        msg = str(e)
        assert not any(f in msg for f in FOREIGN), msg
        assert any(n in msg for n in NAMES), msg
        return None
    return out


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(calls())
def test_attention_arguments(call):
    q, k, v, kw = call
    out = check_outcome(lambda: attn.attention(q, k, v, **kw))
    if out is not None:
        finite_inputs = all(np.isfinite(np.asarray(x, dtype=np.float64)).all() for x in (q, k, v))
        if finite_inputs and kw.get("attn_mask") is None:
            assert np.isfinite(np.asarray(out, dtype=np.float64)).all()


@settings(max_examples=EXAMPLES // 2, deadline=None, suppress_health_check=list(HealthCheck))
@given(calls(), st.sampled_from(["softmax", "softmax:causal", "softmax:score=additive", "softmax:scale=1,scale=2",
                                 "softmax:window=0x10:0", None, 3, "linear"]),
       st.sampled_from([None, "rows", "tiled", "reference", "fast", 7]),
       st.sampled_from([{}, {"wq": np.ones((2, 3), np.float32)}, {"w": "x"}]))
def test_attend_and_explain_arguments(call, mechanism, form, params):
    q, k, v, kw = call
    kw = {key: val for key, val in kw.items() if key in ("attn_mask", "key_padding_lengths", "layout", "threads")}
    check_outcome(lambda: attn.attend(q, k, v, mechanism, form=form, params=params, **kw))
    text = check_outcome(lambda: attn.explain(q, k, v, mechanism, form=form, params=params, **kw))
    assert text is None or "runs form" in text


# ---- the KV cache, the linear state, the model and the tokenizer ------------------------------
# Same rule, same budget idea: each test below tries a bounded number of random calls (a third of
# EXAMPLES) and checks every result that comes back against an oracle, not just for finiteness.

MORE = ("k_cache", "v_cache", "cache_seqlens", "block_table", "rotary_cos", "rotary_sin", "softmax_scale",
        "window_size", "return_softmax_lse", "rotary_interleaved", "initial_state", "output_final_state",
        "feature_map", "decay", "chunk_size", "normalize", "ids", "prompt", "tokens", "max_tokens", "temperature",
        "top_p", "stop", "text", "special", "messages", "id", "sampling", "pos", "all_logits", "path",
        "add_generation_prompt", "stream", "mechanism", "layer", "chat")
SOME = EXAMPLES // 3


def check_ours(fn):
    """fn() or None; an error must be ours and name an argument. (--hypothesis-show-statistics
    shows how many calls were answered and how many refused.)"""
    try:
        out = fn()
    except (ValueError, TypeError) as e:
        msg = str(e)
        assert not any(f in msg for f in FOREIGN), msg
        assert any(n in msg for n in NAMES + MORE), msg
        event(f"refused: {type(e).__name__}")
        return None
    event("answered")
    return out


ints = st.sampled_from([0, 1, 2, 3, 5, -1, 2**31, 2**63, 2**64, 1.0, 2.5, True, None, "1", b"1", np.int64(2),
                        np.uint64(3), np.float32(1.0)])


def coin(draw, p):
    """True with probability p (hypothesis favours small integers, so a draw of 0 is no rare event)."""
    return bool(np.random.default_rng(draw(st.integers(0, 2**32 - 1))).random() < p)


def hostile(draw, good):
    """`good` nine times in ten, else a hostile stand-in: None, bytes, a float, a str, a huge int."""
    if coin(draw, 0.9):
        return good
    return draw(st.sampled_from([None, b"x", 1.5, "abc", 2**64, -1, True, object()]))


@st.composite
def kvcache_calls(draw):
    # sizes from lists: hypothesis favours 0, and empty calls should be the exception
    B, Nq, Hkv, D = (draw(st.sampled_from(x)) for x in ([1, 2, 3, 0], [1, 2, 3, 0], [1, 2], [4, 1, 8]))
    H = Hkv * draw(st.sampled_from([1, 2]))
    cap, new = draw(st.sampled_from([6, 8, 3, 1, 0])), draw(st.sampled_from([1, 2, 0, 3]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dt = draw(st.sampled_from(["float32"] * 6 + ["float16", "float64", "int32", ">f4"]))

    def arr(shape, dtype=dt):
        x = rng.standard_normal(shape).astype(np.dtype(dtype))
        if coin(draw, 0.1) and x.ndim and x.shape[-1] > 1:
            x = x[..., ::2]  # a non-contiguous slice
        if coin(draw, 0.05):
            x.flags.writeable = False  # a read-only cache cannot be appended to
        return x

    q = arr((B, Nq, H, D))
    kc, vc = arr((B, cap, Hkv, D)), arr((B, cap, Hkv, D))
    kw = {}
    if draw(st.booleans()):
        kw["k"], kw["v"] = arr((B, new, Hkv, D)), arr((B, new, Hkv, D))
        if coin(draw, 0.1):
            kw["v"] = None
    if draw(st.booleans()):
        kw["cache_seqlens"] = hostile(draw, draw(st.sampled_from(
            [0, max(cap - new, 0), [max(cap - new, 0)] * B, np.full(B, max(cap - new, 0), np.int32),
             [cap + 1] * B, [-1] * B, [2**40] * B, [1.5] * B, np.zeros(B, np.float32), [True] * B])))
    if draw(st.booleans()):
        kw["causal"] = hostile(draw, draw(st.booleans()))
    if draw(st.booleans()):
        kw["window_size"] = hostile(draw, draw(st.sampled_from([(-1, -1), (2, 0), (0, 0), (0, 2**63 - 1)])))
        if coin(draw, 0.1):
            kw["window_size"] = draw(st.sampled_from([(1.5, 0), (2**63, 0), (1,), (-2, 0)]))
    if draw(st.booleans()):
        kw["softcap"] = hostile(draw, 20.0)
    if draw(st.booleans()):
        kw["softmax_scale"] = hostile(draw, 0.5)
    if coin(draw, 0.25):
        kw["block_table"] = draw(st.sampled_from([np.zeros((B, 1), np.int32), np.zeros((B, 1), np.float32),
                                                  [[0]] * B, None, np.full((B, 1), 2**40)]))
    if coin(draw, 0.25):
        half = max(D // 2, 1)
        kw["rotary_cos"], kw["rotary_sin"] = arr((cap + 4, half), "float32"), arr((cap + 4, half), "float32")
        if draw(st.booleans()):
            kw["rotary_sin"] = draw(st.sampled_from([None, b"x", np.zeros((2, 2), np.float64)]))
    if draw(st.booleans()):
        kw["return_softmax_lse"] = hostile(draw, True)
    if coin(draw, 0.25):
        kw["threads"] = draw(ints)
    return q, kc, vc, kw


@settings(max_examples=SOME, deadline=None, suppress_health_check=list(HealthCheck))
@given(kvcache_calls())
def test_kvcache_arguments(call):
    q, kc, vc, kw = call
    before = (kc.copy(), vc.copy())
    out = check_ours(lambda: attn.flash_attn_with_kvcache(q, kc, vc, **kw))
    if out is None:  # a refused call leaves the caches as they were
        assert np.array_equal(kc, before[0], equal_nan=True) and np.array_equal(vc, before[1], equal_nan=True)
        return
    out = out[0] if isinstance(out, tuple) else out
    assert out.shape == q.shape[:-1] + vc.shape[-1:]  # q's, with v's head dim
    simple = all(kw.get(x) is None for x in ("block_table", "rotary_cos")) and q.dtype == np.float32
    if not simple or kc.dtype != np.float32:
        return
    # the oracle: attention over each sequence's cached keys after the append
    new = 0 if kw.get("k") is None else kw["k"].shape[1]
    seqlens = kw.get("cache_seqlens")
    lens = ([kc.shape[1] - new] * q.shape[0] if seqlens is None else
            [int(seqlens)] * q.shape[0] if np.ndim(seqlens) == 0 else [int(x) for x in seqlens])
    opts = {x: kw[x] for x in ("causal", "window_size", "softcap", "softmax_scale") if x in kw}
    for b in range(q.shape[0]):
        n = lens[b] + new
        if n == 0 or q.shape[1] == 0:
            continue
        want = attn.attention(np.ascontiguousarray(q[b:b + 1]), np.ascontiguousarray(kc[b:b + 1, :n]),
                              np.ascontiguousarray(vc[b:b + 1, :n]), **opts)
        assert np.allclose(out[b:b + 1], want, atol=1e-5, equal_nan=True), b


@st.composite
def linear_calls(draw):
    B, N, H, D = (draw(st.sampled_from(x)) for x in ([1, 2, 0], [5, 2, 6, 1, 0], [1, 2], [4, 1]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dt = draw(st.sampled_from(["float32"] * 6 + ["float64", "float16", "int64", "bool"]))
    q, k, v = (rng.standard_normal((B, N, H, D)).astype(dt) for _ in range(3))
    kw = {"output_final_state": hostile(draw, True)}
    normalize = draw(st.booleans())
    kw["normalize"] = hostile(draw, normalize)
    cols = D + 1 if normalize else D
    if draw(st.booleans()):
        state = np.abs(rng.standard_normal((B, H, D, cols))).astype(np.float32)
        kw["initial_state"] = hostile(draw, draw(st.sampled_from(
            [state, state, state.astype(np.float64), state[..., :-1], state.astype(">f4"), np.ascontiguousarray(state.T).T,
             state.astype(np.int32), state[:, :, ::2] if D > 1 else state])))
    if draw(st.booleans()):
        kw["feature_map"] = hostile(draw, draw(st.sampled_from(["elu", "relu", "identity", "exp", "relu2", "nope"])))
    if draw(st.booleans()):
        kw["decay"] = hostile(draw, draw(st.sampled_from([0.9, 1.0, 0.0, 1.5, np.full(H, 0.8, np.float32), [0.5] * H])))
    if coin(draw, 0.25):
        kw["chunk_size"] = draw(ints)
    if draw(st.booleans()):
        kw["causal"] = hostile(draw, True)
    if draw(st.booleans()):
        kw["key_padding_lengths"] = draw(st.sampled_from([[N] * B, [0] * B, [-1] * B, [1.5] * B, None]))
    return q, k, v, kw


@settings(max_examples=SOME, deadline=None, suppress_health_check=list(HealthCheck))
@given(linear_calls())
def test_linear_state_arguments(call):
    q, k, v, kw = call
    res = check_ours(lambda: attn.linear_attention(q, k, v, **kw))
    if res is None:
        return
    o, state = res
    assert o.shape == q.shape[:-1] + v.shape[-1:]
    if kw.get("output_final_state") is not True:
        assert state is None
        return
    # the oracle: two calls carrying the state equal one call (a causal scan over the same tokens)
    n = q.shape[1]
    if n < 2 or kw.get("causal", True) is not True or kw.get("key_padding_lengths") is not None or q.dtype != np.float32:
        return
    h = n // 2
    first = dict(kw)
    o1, s1 = attn.linear_attention(q[:, :h], k[:, :h], v[:, :h], **first)
    o2, s2 = attn.linear_attention(q[:, h:], k[:, h:], v[:, h:], **{**kw, "initial_state": s1})
    def size(x):
        return max(1.0, float(np.nanmax(np.abs(x)))) if x.size and not np.isnan(x).all() else 1.0

    assert np.allclose(np.concatenate([o1, o2], axis=1), o, atol=1e-4 * size(o), rtol=1e-4, equal_nan=True)
    assert np.allclose(s2, state, atol=1e-4 * size(state), rtol=1e-4, equal_nan=True)


_TINY = {}


def tiny_model():
    """attn.load_model on tiny_text_model.py's GGUF file (written once per session)."""
    if "model" not in _TINY:
        import tempfile

        from tiny_text_model import write_tiny_text_model

        path = os.path.join(tempfile.mkdtemp(), "tiny.gguf")
        write_tiny_text_model(path, context=32)
        _TINY["path"] = path
        _TINY["model"] = attn.load_model(path, dtype="f32", threads=1)
    return _TINY["model"]


def token_lists(draw, vocab=271):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.integers(0, 5))
    good = [int(t) for t in rng.integers(0, vocab, n)]
    kind = draw(st.integers(0, 14))
    if kind == 0:
        return np.array(good, dtype=draw(st.sampled_from(["int16", "uint16", "int32", "int64", "uint64"])))
    if kind == 1:
        return np.array(good, dtype=draw(st.sampled_from(["float32", "float64", "bool", "complex64", "object"])))
    if kind == 2:
        return [t + 0.5 for t in good] or [3.7]
    if kind == 3:
        return good + [draw(st.sampled_from([vocab, -1, 2**31, 2**63, 2**64, True, None, "a", b"a", 1.0]))]
    if kind == 4:
        return draw(st.sampled_from([None, b"\x01\x02", 7, 2.5, np.zeros((2, 2), np.int64), {"a": 1}, [[1, 2]]]))
    if kind == 5:
        return tuple(good)
    if kind == 6:
        return draw(st.text(max_size=12))
    return good


@settings(max_examples=SOME, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_model_arguments(data):
    m = tiny_model()
    draw = data.draw
    ids = token_lists(draw)
    which = draw(st.sampled_from(["logits", "generate", "generate", "perplexity", "decoder"]))
    if which == "logits":
        out = check_ours(lambda: m.logits(ids, mechanism=hostile(draw, None)))
        if out is not None:
            assert out.shape[1] == 271 and np.isfinite(out).all()
            plain = m.tokenizer.encode(ids) if isinstance(ids, str) else [int(t) for t in ids]
            assert np.array_equal(out, m.logits(plain))
    elif which == "perplexity":
        out = check_ours(lambda: m.perplexity(ids))
        if out is not None:
            assert math.isfinite(out["perplexity"]) and out["perplexity"] >= 1.0
    elif which == "decoder":
        d = m._impl
        out = check_ours(lambda: attn.Decoder(d).logits(ids))
        if out is not None:
            assert out.shape[1] == 271 and np.isfinite(out).all()
    else:
        kw = {"max_tokens": draw(st.sampled_from([0, 1, 3, 3, 3, 31, 32, 10**12, 1e12, 2.0, -1, 2**70, None, True]))}
        if draw(st.booleans()):
            kw["temperature"] = draw(st.sampled_from([0.0, 0.7, 1.0, -1.0, float("nan"), float("inf"), "1", None, 10**400]))
        if draw(st.booleans()):
            kw["top_p"] = draw(st.sampled_from([1.0, 0.9, 1e-9, 0.0, 1.5, float("nan"), None]))
        if draw(st.booleans()):
            kw["seed"] = draw(st.sampled_from([0, 1, 2**64 - 1, np.uint64(2**64 - 1), -1, 2**64, 1.5, True, None, "3"]))
        if draw(st.booleans()):
            kw["stop"] = draw(st.sampled_from([[], [2], [271], [1.5], None, "ab", [True], np.array([2], np.int64)]))
        if draw(st.booleans()):
            kw["chat"] = draw(st.sampled_from([True, False, 1, None]))
        out = check_ours(lambda: m.generate(ids, **kw))
        if out is not None:
            ids_out = m.tokenizer.encode(out) if isinstance(out, str) else out
            assert isinstance(out, (str, list))
            if isinstance(out, list):
                assert len(out) <= kw["max_tokens"] and all(0 <= t < 271 for t in out)


@settings(max_examples=SOME, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_tokenizer_arguments(data):
    tok = tiny_model().tokenizer
    draw = data.draw
    which = draw(st.sampled_from(["encode", "decode", "token_text", "chat_prompt"]))
    if which == "encode":
        text = draw(st.one_of(st.text(max_size=20), st.binary(max_size=20),
                              st.sampled_from([None, 5, 1.5, ["a"], "<|im_start|>hello world 42"])))
        special = hostile(draw, draw(st.booleans()))
        ids = check_ours(lambda: tok.encode(text, special))
        if ids is not None:  # byte-level BPE: the ids spell the text back
            assert all(0 <= t < tok.vocab_size for t in ids)
            assert tok.decode_bytes(ids) == (text if isinstance(text, bytes) else text.encode())
    elif which == "decode":
        ids = token_lists(draw)
        out = check_ours(lambda: tok.decode(ids))
        if out is not None:
            assert isinstance(out, str)
    elif which == "token_text":
        i = draw(st.one_of(st.integers(-5, 280), ints))
        out = check_ours(lambda: tok.token_text(i))
        if out is not None:
            assert isinstance(out, str) and out
    else:
        messages = draw(st.sampled_from([[{"role": "user", "content": "hi"}], [], "hi", None, [{"role": "user"}],
                                         [{"role": 1, "content": "x"}], [("user", "hi")], {"role": "user"}, b"hi"]))
        out = check_ours(lambda: tok.chat_prompt(messages, hostile(draw, True)))
        if out is not None:
            assert isinstance(out, str)
