"""A bounded fuzzer of the Python argument layer (hardening issue): random dtypes, ranks, shapes,
strides, byte orders and options thrown at attn.attention / attn.attend / attn.explain, and (issue
37) at the KV cache (flash_attn_with_kvcache), the linear state (linear_attention with
initial_state / output_final_state), a tiny GGUF model (logits, perplexity, generate, Decoder)
and its tokenizer: None, bytes, floats where integers go, out-of-range integers; and at what came
after: attend_backward, int8 K/V rows (quantize_rows, attend's kv_scales) and the model-level blocks
(Titans, attention refinement, SANA, MoE, the output softmaxes). Every outcome must be a correct
result or the project's own error (ValueError/TypeError, MemoryError for sizes too large, with a
message that names an argument) -- never a crash, a foreign message from the binding layer, or NaN
from finite inputs."""
import math
import os
import re

import numpy as np
import pytest
import torch
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


# ---- the APIs added since: attend_backward, int8 K/V rows, the model-level blocks ---------------
# The same rule and budget (SOME calls each), stricter on the message: an error must be a
# ValueError, TypeError or MemoryError whose message names an argument *of the call at hand* (as a
# word: "x" in "x must be", not in "max"), and holds none of the fragments below -- Python's, NumPy's
# or torch's own words, which name nothing the caller passed. Every answered call is checked against
# its documented shape, and against an oracle where one is cheap.

FOREIGN_MORE = FOREIGN + ("unpack", "ScalarType", "float() argument", "int() argument", "object of type",
                          "has no attribute", "not subscriptable", "unsupported operand", "could not convert",
                          "cannot reshape", "could not be broadcast", "only integer scalar arrays", "not iterable",
                          "unhashable", "index out of range", "Python int too large", "out of bounds for axis",
                          "object cannot be interpreted", "ufunc", "Cannot cast")


def names_one(msg, names):
    """Whether msg names one of `names` as a word (not inside another: "v" in "values" is no name);
    C++ may spell an underscore as a space ("qkv weight" names qkv_weight)."""
    return any(re.search(r"(?<![\w.])" + re.escape(n).replace("_", "[_ ]") + r"(?!\w)", msg) for n in names)


def check_named(fn, names, errors=(ValueError, TypeError, MemoryError)):
    """fn() or None, as check_ours: a refusal must be one of `errors`, name one of `names` (the call's
    arguments) and hold no FOREIGN_MORE fragment. Any other exception fails the test."""
    try:
        out = fn()
    except errors as e:
        msg = str(e)
        assert not any(f in msg for f in FOREIGN_MORE), msg
        assert names_one(msg, names), (names, msg)
        event(f"refused: {type(e).__name__}")
        return None
    event("answered")
    return out


def tensor(draw, shape, dtype="float32", p=0.85, scale=1.0):
    """(x, clean): a finite standard-normal array of `shape` and `dtype` (times `scale`) `p` of the
    time -- now and then a non-contiguous or read-only view, still clean -- else a hostile stand-in:
    another dtype, a torch tensor, NaN or inf inside, one dimension fewer or more, a wrong size, no
    rows, a list, None, a str, a number. clean: a finite array of `shape` (of any dtype)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = np.asarray(rng.standard_normal(shape) * scale).astype(dtype)
    if coin(draw, p):
        if coin(draw, 0.1) and x.ndim and x.shape[-1]:
            x = np.repeat(x, 2, axis=-1)[..., ::2]  # the same values, a non-contiguous view
        if coin(draw, 0.05):
            x.flags.writeable = False
        return x, True
    kind = draw(st.sampled_from(["float16", "float64", "int32", "bool", "object", "complex64", ">f4", "torch",
                                 "torch.bfloat16", "torch.float16", "torch.int64", "nan", "inf", "fewer", "more",
                                 "size", "empty", "list", "None", "str", "number"]))
    if kind in ("float16", "float64", "int32", "bool", "object", "complex64", ">f4"):
        with np.errstate(over="ignore", invalid="ignore"):  # 1e30 as float16 is inf: that is the point
            return x.astype(kind), kind in ("float64",)
    if kind.startswith("torch"):
        t = torch.from_numpy(np.ascontiguousarray(x))
        return (t, True) if kind == "torch" else (t.to(getattr(torch, kind.split(".")[1])), False)
    if kind in ("nan", "inf"):
        if x.size:
            x.reshape(-1)[draw(st.integers(0, x.size - 1))] = np.nan if kind == "nan" else -np.inf
        return x, not x.size
    if kind == "fewer":
        return (x[..., 0] if x.ndim and x.shape[-1] else np.float32(1.0)), False
    if kind == "more":
        return x[..., None], False
    if kind == "empty":  # no rows: a size of 0 where the call wants more
        return (x[:0], not x.ndim or not x.shape[0]) if x.ndim else (x.reshape(1)[:0], False)
    if kind == "size":
        return (np.concatenate([x, x[..., :1] if x.shape[-1] else np.ones(x.shape[:-1] + (1,), x.dtype)], -1)
                if x.ndim else x[None]), False
    return {"list": x.tolist(), "None": None, "str": "abc", "number": 1.5}[kind], False


def sizes(draw, good):
    """`good` (a size) nine times in ten, else 0, 1, an odd size, a large one that must be refused
    (2**40, 2**63 - 1), or no size at all."""
    if coin(draw, 0.9):
        return good
    return draw(st.sampled_from([0, 1, 7, -1, 2**31, 2**40, 2**63 - 1, 2**64, 1.5, None, "2", True, np.int64(3)]))


def finite(*xs):
    return all(np.isfinite(np.asarray(x.float() if isinstance(x, torch.Tensor) else x, dtype=np.float64)).all()
               for x in xs)


def shape_of(x):
    return tuple(int(s) for s in x.shape)


def numpy_of(x):
    if isinstance(x, torch.Tensor):
        return (x.float() if x.dtype == torch.bfloat16 else x).numpy()
    return np.asarray(x)


BACKWARD = ("dout", "q", "k", "v", "out", "lse", "mechanism", "attn_mask", "key_padding_lengths", "layout",
            "threads", "form", "dlse", "params", "block_size", "block_mask")
BACKWARD_MECHANISMS = ("softmax", "softmax:causal", "softmax:causal,window=2:0", "softmax:window=1:1",
                       "softmax:scale=0.5,softcap=20", "softmax:causal,window=1:0,sinks=1", "longformer:window=1:1",
                       "softmax:window=0:0,causal")


@settings(max_examples=SOME, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_attend_backward_arguments(data):
    """attend_backward on a forward that ran (softmax family, causal and windows, GQA, both layouts,
    float32 and float16), then one of its arguments spoiled: dout of a wrong shape, dtype or kind,
    strided, holding NaN; lse None, misshapen or NaN; out, dlse, form, threads, mechanism."""
    draw = data.draw
    B, N, M, Hkv, D = (draw(st.sampled_from(x)) for x in ([1, 2, 2, 0], [1, 3, 5, 0], [1, 4, 2, 0], [1, 2], [4, 1, 8]))
    H = Hkv * draw(st.sampled_from([1, 2]))
    layout = draw(st.sampled_from(["bnhd", "bnhd", "bhnd"]))
    mech = draw(st.sampled_from(BACKWARD_MECHANISMS))
    dt = draw(st.sampled_from(["float32"] * 5 + ["float16"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    def shaped(b, n, h, d):
        return (b, n, h, d) if layout == "bnhd" else (b, h, n, d)

    q = rng.standard_normal(shaped(B, N, H, D)).astype(dt)
    k, v = (rng.standard_normal(shaped(B, M, Hkv, D)).astype(dt) for _ in range(2))
    kw = {"layout": layout}
    if coin(draw, 0.3):
        kw["key_padding_lengths"] = [draw(st.integers(0, M)) for _ in range(B)]
    out, lse = attn.attend(q, k, v, mech, return_lse=True, **kw)
    dout = rng.standard_normal(out.shape).astype(dt)
    args = {"dout": dout, "out": out, "lse": lse, "mechanism": mech}
    spoiled = None  # the argument made hostile, if any
    if coin(draw, 0.6):
        spoiled = draw(st.sampled_from(["dout"] * 4 + ["lse", "lse", "out", "dlse", "form", "threads", "mechanism"]))
        pick = draw(st.integers(0, 10**6))
        choices = {
            "dout": [dout[..., :-1], dout[:, :-1] if dout.shape[1] else dout[:, :, None], dout[..., None],
                     np.swapaxes(dout, 1, 2), dout.astype(np.float64), dout.astype(np.int32), dout.astype(bool),
                     dout.astype(object), dout.astype(np.float16 if dt == "float32" else np.float32),
                     dout.astype(dout.dtype.newbyteorder(">")), None, dout.tolist(), torch.from_numpy(dout),
                     "strided", "strided", "nan", "nan", "nan"],
            "lse": [None, lse[..., None], lse[:, :, :-1] if lse.shape[2] else lse[..., None], lse.astype(np.float64),
                    np.swapaxes(lse, 1, 2), "nan"],
            "out": [out[..., :-1], out.astype(np.float64), None, "nan"],
            "dlse": [np.zeros_like(lse), np.ones_like(lse)[..., None], np.zeros(lse.shape, np.float64), "abc"],
            "form": [None, "rows", "reference", "tiled", "chunked", "bogus", 3],
            "threads": [0, 1, 2, 257, -1, 2**40, 1.5, None, "2"],
            "mechanism": ["linear:map=elu", "lsh", "efficient", "qsoftmax", "softmax:causal", "nope", None, 3, b"softmax",
                          ""],
        }[spoiled]
        bad = choices[pick % len(choices)]
        if isinstance(bad, str) and bad == "strided":
            bad = np.repeat(dout, 2, axis=-1)[..., ::2]  # dout's values, a non-contiguous view
        elif isinstance(bad, str) and bad == "nan" and spoiled in ("dout", "lse", "out"):
            bad = args[spoiled].copy()
            if bad.size:
                bad.reshape(-1)[pick % bad.size] = np.nan
        args[spoiled] = bad
        if spoiled == "mechanism" and bad == "linear:map=elu" and coin(draw, 0.5):
            args["lse"] = None  # the linear family has no lse: answered without one
    extra = {key: args.pop(key) for key in ("dlse", "form", "threads") if key in args}
    # an error about the mechanism names it by the family the caller wrote
    family = (args["mechanism"].split(":")[0],) if isinstance(args["mechanism"], str) and args["mechanism"] else ()
    grads = check_named(lambda: attn.attend_backward(args["dout"], q, k, v, args["out"], args["lse"],
                                                     args["mechanism"], **kw, **extra), BACKWARD + family)
    if grads is None:
        return
    assert len(grads) == 3
    for g, x in zip(grads, (q, k, v)):
        assert shape_of(g) == x.shape and g.dtype == x.dtype
    if dt != "float32" or spoiled not in (None, "dout", "threads", "form") or args["mechanism"] != mech:
        return
    clean = attn.attend_backward(dout, q, k, v, out, lse, mech, **kw)
    if spoiled in (None, "threads", "form"):
        # fully masked rows (causal with N > M, a window past every key) give 0, not NaN
        assert finite(*grads)
        ref = attn.attend_backward(dout, q, k, v, out, lse, mech, form="reference", **kw)
        for g, r in zip(grads, ref):
            assert np.allclose(g, r, atol=1e-4 * max(1.0, float(np.abs(r).max(initial=0))), rtol=1e-4)
    elif np.isfinite(args["dout"]).all():  # dout's values through a strided view: the same bits
        assert all(np.array_equal(g, c) for g, c in zip(grads, clean))
    else:  # NaN in one batch entry's dout leaves every other entry's gradients finite and as they were
        # (within rounding only: a non-finite input sends the whole call to the rows form, whose
        # sums run in another order than the tiled form's; softmax_backward_tiled.cpp says why)
        b = int(np.argwhere(np.isnan(args["dout"]))[0][0])
        for g, c in zip(grads, clean):
            g, c = np.delete(g, b, 0), np.delete(c, b, 0)
            assert np.isfinite(g).all() and np.allclose(g, c, atol=1e-5 * max(1.0, float(np.abs(c).max(initial=0))))


INT8 = ("q", "k", "v", "x", "layout", "kv_scales", "k_scale", "v_scale", "mechanism", "return_lse", "form",
        "key_padding_lengths", "attn_mask", "threads")


@settings(max_examples=SOME, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_int8_rows_arguments(data):
    """quantize_rows on hostile x and layouts; attend on int8 k and v rows with kv_scales of wrong
    shapes, dtypes and kinds, holding NaN, 0, inf or negative scales, made for the other layout, or
    not given at all. Every answered call equals attend on the float rows the scales and rows as
    given stand for (scale * row), NaN for NaN."""
    draw = data.draw
    B, N, M, Hkv, D = (draw(st.sampled_from(x)) for x in ([1, 2, 0], [1, 3, 0], [1, 4, 5, 0], [1, 2], [4, 1, 8]))
    H = Hkv * draw(st.sampled_from([1, 2]))
    layout = draw(st.sampled_from(["bnhd", "bnhd", "bhnd"]))

    def shaped(b, n, h, d):
        return (b, n, h, d) if layout == "bnhd" else (b, h, n, d)

    if coin(draw, 0.3):  # quantize_rows itself
        x, clean = tensor(draw, shaped(B, M, Hkv, D), scale=draw(st.sampled_from([1.0, 1e-40, 1e30])))
        lay = hostile(draw, layout)
        res = check_named(lambda: attn.quantize_rows(x, lay), ("x", "layout"))
        if res is not None:
            rows, scales = (numpy_of(r) if isinstance(r, torch.Tensor) else r for r in res)
            assert rows.dtype == np.int8 and rows.shape == shape_of(x) and type(res[0]) is type(res[1])
            assert scales.dtype == np.float32 and scales.shape == shape_of(x)[:-1]
            xs = numpy_of(x).astype(np.float64)
            ok = np.isfinite(xs).all(-1)
            err = np.abs(scales[..., None].astype(np.float64) * rows - xs).max(-1, initial=0)
            # half a step of its row, plus the scale's own rounding where it is subnormal (rows of 1e-40)
            assert (err[ok] <= 0.5 * scales[ok] * (1 + 1e-5) + 127 * 2.0**-150).all()
            assert np.isnan(scales[~ok]).all()
        return
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    q = rng.standard_normal(shaped(B, N, H, D)).astype(np.float32)
    k, v = (rng.standard_normal(shaped(B, M, Hkv, D)).astype(np.float32) for _ in range(2))
    (k8, ks), (v8, vs) = attn.quantize_rows(k, layout), attn.quantize_rows(v, layout)
    if coin(draw, 0.5):
        which = draw(st.sampled_from(["ks", "vs"]))
        s = ks if which == "ks" else vs
        other = np.swapaxes(s, 1, 2)  # the other layout's scales
        bad = draw(st.sampled_from(["nan", "zero", "inf", "negative", "strided", "other layout", "more", "fewer",
                                    "short", "float64", "float16", "int32", "bool", "object", "torch", "list", "None"]))
        s = {"nan": lambda: np.where(rng.random(s.shape) < 0.3, np.float32(np.nan), s),
             "zero": lambda: np.where(rng.random(s.shape) < 0.3, np.float32(0), s),
             "inf": lambda: np.where(rng.random(s.shape) < 0.3, np.float32(np.inf), s),
             "negative": lambda: -s,
             "strided": lambda: np.repeat(s, 2, axis=-1)[..., ::2],
             "other layout": lambda: np.ascontiguousarray(other),
             "more": lambda: s[..., None], "fewer": lambda: s.reshape(s.shape[0], -1 if s.shape[0] else 0),
             "short": lambda: s[:, :-1] if s.shape[1] else s[:, :, :-1],
             "float64": lambda: s.astype(np.float64), "float16": lambda: s.astype(np.float16),
             "int32": lambda: s.astype(np.int32), "bool": lambda: s > 0, "object": lambda: s.astype(object),
             "torch": lambda: torch.from_numpy(s), "list": lambda: s.tolist(), "None": lambda: None}[bad]()
        ks, vs = (s, vs) if which == "ks" else (ks, s)
    scales = draw(st.sampled_from(["pair"] * 6 + ["list", "one", "triple", "dict", "none"]))
    kv_scales = {"pair": (ks, vs), "list": [ks, vs], "one": ks, "triple": (ks, vs, vs), "dict": {"k": ks, "v": vs},
                 "none": None}[scales]
    kk, vv = k8, v8
    if coin(draw, 0.15):  # rows that are not int8 rows, or int8 rows of the other layout
        kk = draw(st.sampled_from([k, k8.astype(np.uint8), np.swapaxes(k8, 1, 2), k8.astype(np.int16), q]))
    mech = draw(st.sampled_from(["softmax", "softmax:causal", "softmax:causal,window=2:0,softcap=20",
                                 "longformer:window=1:1", "linear:map=elu", "softmax:causal,dilation=2"]))
    kw = {}
    if draw(st.booleans()):
        kw["return_lse"] = hostile(draw, True)
    if coin(draw, 0.2):
        kw["form"] = draw(st.sampled_from(["rows", "tiled", "reference", "chunked"]))
    if coin(draw, 0.2):
        kw["key_padding_lengths"] = [draw(st.integers(0, M)) for _ in range(B)]
    res = check_named(lambda: attn.attend(q, kk, vv, mech, layout=layout, kv_scales=kv_scales, **kw), INT8)
    if res is None:
        return
    out = res[0] if isinstance(res, tuple) else res
    assert out.shape == q.shape and out.dtype == np.float32
    # the oracle: the float rows that the rows and their scales, as given, stand for
    ks, vs = (np.asarray(numpy_of(s), dtype=np.float32) for s in kv_scales)
    with np.errstate(over="ignore", invalid="ignore"):
        kf, vf = ks[..., None] * kk, vs[..., None] * vv
    if np.isinf(kf).any() or (np.isnan(kf) & ~np.isnan(ks)[..., None]).any():
        return  # k rows that are infinite as floats: the forms disagree (see the xfail test below)
    want = attn.attend(q, kf, vf, mech, layout=layout, **kw)
    want = want[0] if isinstance(want, tuple) else want
    size = float(np.abs(want[np.isfinite(want)]).max(initial=1.0))
    assert np.allclose(out, want, atol=1e-5 * size, equal_nan=True)


TITANS = ("q", "k", "v", "theta", "eta", "alpha", "memory", "w0", "s0", "batch_size", "loss", "threads",
          "return_momentum", "d", "heads", "seed", "dtype", "window", "persistent", "pk", "pv", "memory_qkv", "scale",
          "weights")


def gate(draw, shape, lo, hi):
    """(gate, clean) for theta, eta or alpha: a number or an array in [lo, hi] of `shape` (or (H, N)
    or (N,), which broadcast), else NaN, out of range, a wrong shape, a str, None or a bool."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if coin(draw, 0.85):
        return draw(st.sampled_from([lo, hi, (lo + hi) / 2, rng.uniform(lo, hi, shape),
                                     rng.uniform(lo, hi, shape[1:]).astype(np.float32), rng.uniform(lo, hi, shape[2:]),
                                     np.float32(hi)])), True
    return draw(st.sampled_from([float("nan"), float("inf"), -1.0, hi + 1.0, np.zeros(shape + (1,)), np.zeros((7,)),
                                 "0.1", None, True, [0.1], np.zeros(shape, np.int32), np.zeros(shape, object)])), False


@settings(max_examples=SOME, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_titans_arguments(data):
    """titans_init, titans_memory, titans_read and titans_mag with hostile sizes (0, odd, 2**40),
    dtypes, kinds, gates, initial weights and momenta, windows and persistent tokens. An answered
    call returns y (B, H, N, d) and the weights (B, H, ...) of its memory; from finite inputs with
    gates in range, finite ones."""
    draw = data.draw
    which = draw(st.sampled_from(["init", "memory", "memory", "memory", "read", "mag"]))
    B, H, N, d = (draw(st.sampled_from(x)) for x in ([1, 2, 0], [1, 2], [1, 3, 5, 0], [2, 1, 3]))
    memory = draw(st.sampled_from(["linear", "mlp"]))
    shapes = {"W": (d, d)} if memory == "linear" else {"W1": (4 * d, d), "W2": (d, 4 * d)}
    if which == "init":
        args = (sizes(draw, d), hostile(draw, memory))
        kw = {"heads": hostile(draw, draw(st.sampled_from([None, 1, 2, 2**40, 0]))), "seed": hostile(draw, 3),
              "dtype": draw(st.sampled_from([np.float32, np.float64, "float16", "nope", None, object(), int]))}
        w = check_named(lambda: attn.titans_init(*args, **kw), TITANS)
        if w is not None:
            lead = () if kw["heads"] is None else (kw["heads"],)
            want = {"W": (args[0],) * 2} if args[1] == "linear" else {"W1": (4 * args[0], args[0]),
                                                                       "W2": (args[0], 4 * args[0])}
            assert {n: a.shape for n, a in w.items()} == {n: lead + s for n, s in want.items()}
            assert all(np.isfinite(a).all() for a in w.values() if a.dtype.kind == "f")
        return
    dt = draw(st.sampled_from(["float32"] * 4 + ["float64"]))
    (q, cq), (k, ck), (v, cv) = (tensor(draw, (B, H, N, d), dt) for _ in range(3))
    (theta, ct), (eta, ce), (alpha, ca) = gate(draw, (B, H, N), 0.0, 0.2), gate(draw, (B, H, N), 0.0, 1.0), \
        gate(draw, (B, H, N), 0.0, 1.0)
    clean = cq and ck and cv and ct and ce and ca
    kw = {"memory": hostile(draw, memory)}
    if coin(draw, 0.3):
        lead = draw(st.sampled_from([(), (H,), (B, H), (B + 1, H), (3,)]))
        w0 = {n: np.full(lead + s, 0.01, dt) for n, s in shapes.items()}
        kw["w0"] = draw(st.sampled_from([w0, w0, w0.get("W", w0), {"W": np.zeros((d, d + 1))}, {"X": 1}, "W", None,
                                         {n: a.astype(np.float16) for n, a in w0.items()}]))
        clean = clean and lead in ((), (H,), (B, H))
    if coin(draw, 0.2):
        kw["s0"] = draw(st.sampled_from([{n: np.zeros((H,) + s, dt) for n, s in shapes.items()}, {"W": 0.0}, 1.5]))
    for name, good in (("batch_size", 16), ("loss", "sum"), ("threads", 0), ("return_momentum", False)):
        if coin(draw, 0.3):
            kw[name] = hostile(draw, draw(st.sampled_from({"batch_size": [1, 2, 3, 16, 0, -1, 2**40, 2**64, 1.5],
                                                          "loss": ["sum", "mean", "max", ""],
                                                          "threads": [0, 1, 2, 257, -1, 2**40],
                                                          "return_momentum": [True, False, 1]}[name])))
    if which == "read":
        w = kw.get("w0", {n: np.full((H,) + s, 0.01, dt) for n, s in shapes.items()})
        y = check_named(lambda: attn.titans_read(w, q, kw["memory"]), TITANS)
        if y is not None:
            assert shape_of(y) == shape_of(q)  # (B, H, N, d) of any B (an empty q too)
            if clean:
                assert finite(y)
        return
    if which == "mag":
        mk = {x: kw[x] for x in ("memory", "w0", "batch_size", "loss", "threads") if x in kw}
        if coin(draw, 0.5):
            mk["window"] = draw(st.sampled_from([None, 0, 1, 2, 2**40, -1, 1.5, "2"]))
        if coin(draw, 0.3):
            pk = np.ones((2, d), np.float32)
            mk["persistent"] = draw(st.sampled_from([(pk, pk), (pk[None].repeat(H, 0), pk), (pk, pk[:1]), (pk,), pk,
                                                     (pk.astype(np.float64), pk), (np.ones((2, d + 1), np.float32), pk)]))
        if coin(draw, 0.2):
            mk["memory_qkv"] = draw(st.sampled_from([(q, k, v), (q, k), q, (q, k, np.zeros((B, H, N, 0), np.float32))]))
        if coin(draw, 0.3):
            mk["scale"] = draw(st.sampled_from([None, 0.5, 0.0, -1.0, float("nan"), "1", 2**70]))
        res = check_named(lambda: attn.titans_mag(q, k, v, theta, eta, alpha, **mk), TITANS)
        if res is not None:
            o, w = res
            assert shape_of(o) == (B, H, N, d) and set(w) == set(shapes)
        return
    res = check_named(lambda: attn.titans_memory(q, k, v, theta, eta, alpha, **kw), TITANS)
    if res is None:
        return
    assert len(res) == (3 if kw.get("return_momentum") is True else 2)
    y, w = res[0], res[1]
    assert shape_of(y) == (B, H, N, d)
    assert {n: shape_of(a) for n, a in w.items()} == {n: (B, H) + s for n, s in shapes.items()}
    if clean and kw.get("s0") is None:
        assert finite(y, *w.values())


REFINE = ("a", "v", "w1", "w2", "w_mu", "w_sigma", "form", "gamma", "row_sum_tolerance", "threads")


@settings(max_examples=SOME, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_refinement_arguments(data):
    """refine_attention and refined_weights on causal row-stochastic weights a (..., N, N) -- or
    weights that are not causal, do not sum to 1, hold NaN -- with hostile v, w1, w2, forms, gamma,
    tolerances and threads. Answered: (..., N, dv) (refined_weights: (..., N, N), causal rows
    summing to 1 from clean inputs)."""
    draw = data.draw
    lead = draw(st.sampled_from([(), (2,), (1, 2), (0,)]))
    N, r, dv = (draw(st.sampled_from(x)) for x in ([1, 3, 4, 0], [2, 1, 3], [2, 1, 5]))
    dt = draw(st.sampled_from(["float32"] * 4 + ["float64"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    a = np.tril(rng.random(lead + (N, N)) + 0.1)
    a = (a / a.sum(-1, keepdims=True)).astype(dt)
    clean = True
    if coin(draw, 0.2):
        bad = draw(st.sampled_from(["not causal", "rows", "nan", "float16", "int", "torch", "fewer", "oblong", "list"]))
        clean = bad == "torch"
        a = {"not causal": lambda: np.full_like(a, 1.0 / max(N, 1)), "rows": lambda: a * 2, "torch": lambda: torch.from_numpy(a),
             "nan": lambda: np.where(rng.random(a.shape) < 0.2, np.nan, a).astype(dt), "float16": lambda: a.astype(np.float16),
             "int": lambda: (a > 0).astype(np.int32), "fewer": lambda: a.reshape(lead + (N * N,)),
             "oblong": lambda: a[..., :-1] if N else a[..., None], "list": lambda: a.tolist()}[bad]()
    (v, cv), (w1, c1), (w2, c2) = tensor(draw, lead + (N, dv), dt), tensor(draw, (N, r), dt), tensor(draw, (N, r), dt)
    clean = clean and cv and c1 and c2
    kw = {}
    for name, good, choices in (("form", "simple", ["simple", "value_weighted", "additive", "stochastic", "bogus"]),
                                ("gamma", 0.5, [0.0, 1.0, 0.5, -0.1, 1.5, float("nan"), "0.5", None, 2**1100]),
                                ("row_sum_tolerance", 1e-4, [1e-4, 0.0, -1.0, float("inf"), float("nan")]),
                                ("threads", 0, [0, 1, 2, 256, 257, -1, 2**40, 2**64])):
        if draw(st.booleans()):
            kw[name] = hostile(draw, draw(st.sampled_from(choices)))
            clean = clean and (name != "row_sum_tolerance" or kw[name] == 1e-4)
    if coin(draw, 0.3):
        kw.pop("threads", None)
        res = check_named(lambda: attn.refined_weights(a, w1, w2, **kw), REFINE)
        if res is not None:
            assert shape_of(res) == lead + (N, N)
            if clean:
                w = numpy_of(res).astype(np.float64)
                assert finite(w) and np.allclose(w.sum(-1), 1.0, atol=1e-4) and not np.triu(w, 1).any()
        return
    res = check_named(lambda: attn.refine_attention(a, v, w1, w2, **kw), REFINE)
    if res is not None:
        assert shape_of(res) == lead + (N, shape_of(v)[-1]) and type(res) is type(a)  # dv is v's
        if clean:
            assert finite(res)


SANA = ("x", "hw", "qkv_weight", "proj_weight", "proj_bias", "inverted_weight", "inverted_bias", "depth_weight",
        "depth_bias", "point_weight", "head_dim", "eps", "norm_eps", "threads")


@settings(max_examples=SOME, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_sana_arguments(data):
    """lite_la, mix_ffn and sana_block on x (B, H W, C) with hostile weights (torch's conv layouts
    and others), hw pairs that do not multiply to N (or do, as (2**40, 0) with N = 0), head_dim
    that does not divide C, eps, threads. Answered: (B, N, C), finite from clean inputs."""
    draw = data.draw
    which = draw(st.sampled_from(["lite_la", "mix_ffn", "sana_block"]))
    B, Hh, Ww, C = (draw(st.sampled_from(x)) for x in ([1, 2, 0], [1, 2, 3, 0], [1, 2], [8, 16, 4]))
    h = draw(st.sampled_from([C, 2 * C, 3]))
    dt = draw(st.sampled_from(["float32"] * 4 + ["float64"]))
    N = Hh * Ww
    x, clean = tensor(draw, (B, N, C), dt)
    ws = {"qkv_weight": (3 * C, C), "proj_weight": (C, C), "proj_bias": (C,),
          "inverted_weight": draw(st.sampled_from([(2 * h, C), (2 * h, C, 1, 1)])), "inverted_bias": (2 * h,),
          "depth_weight": draw(st.sampled_from([(2 * h, 3, 3), (2 * h, 1, 3, 3), (2 * h, 9)])), "depth_bias": (2 * h,),
          "point_weight": draw(st.sampled_from([(C, h), (C, h, 1, 1)]))}
    kw = {}
    for name, shape in ws.items():
        kw[name], ok = tensor(draw, shape, dt, p=0.93, scale=0.3)
        clean = clean and ok
    if coin(draw, 0.1):
        kw["proj_bias"] = None
    hw = (Hh, Ww)
    if coin(draw, 0.15):
        hw = draw(st.sampled_from([(Ww, Hh), (N, 1), (Hh, Ww + 1), (2**40, 0), (0, 2**40), (2**32, 2**32), (-Hh, -Ww),
                                   (Hh,), [Hh, Ww], "ab", None, (1.5, 2), np.array([Hh, Ww]), (2**64, 1)]))
    head = draw(st.sampled_from([C, C // 2, C // 4]))
    if coin(draw, 0.2):
        head = hostile(draw, sizes(draw, draw(st.sampled_from([3, 0, -1, C + 1]))))
    opts = {"head_dim": head}
    for name, good, bad in (("eps", 1e-15, [0.0, -1.0, float("nan"), float("inf"), "1e-6", None]),
                            ("norm_eps", 1e-6, [0.0, -1.0, float("nan"), 2**1100]),
                            ("threads", 0, [1, 2, 257, -1, 2**40, 1.5])):
        if coin(draw, 0.2):
            opts[name] = draw(st.sampled_from(bad))
            clean = False
    lite = {n: kw[n] for n in ("qkv_weight", "proj_weight", "proj_bias")}
    ffn = {n: kw[n] for n in ("inverted_weight", "inverted_bias", "depth_weight", "depth_bias", "point_weight")}
    if which == "lite_la":
        opts.pop("norm_eps", None)
        res = check_named(lambda: attn.lite_la(x, **lite, **opts), SANA)
    elif which == "mix_ffn":
        opts = {n: opts[n] for n in ("threads",) if n in opts}
        res = check_named(lambda: attn.mix_ffn(x, hw, **ffn, **opts), SANA)
    else:
        res = check_named(lambda: attn.sana_block(x, hw, **lite, **ffn, **opts), SANA)
    if res is not None:
        assert shape_of(res) == shape_of(x) and type(res) is type(x)  # (B, N, C) of any B (an empty x too)
        if clean:
            assert finite(res)


MOE = ("x", "router", "w1", "w2", "w3", "top_k", "threads", "return_routing")


@settings(max_examples=SOME, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_moe_arguments(data):
    """moe_feed_forward with hostile tokens, router and expert weights (wrong shapes, dtypes, kinds,
    NaN), top_k from 0 to 2**40, threads, return_routing. Answered: y (N, d) of x's kind and a float
    aux loss; the routing (N, top_k) ids in [0, E) whose weights sum to 1 per token."""
    draw = data.draw
    N, d, E, F = (draw(st.sampled_from(x)) for x in ([1, 3, 5, 0], [4, 1, 3], [1, 2, 3], [2, 1, 5]))
    dt = draw(st.sampled_from(["float32"] * 4 + ["float64"]))
    (x, cx), (router, cr) = tensor(draw, (N, d), dt), tensor(draw, (E, d), dt)
    (w1, c1), (w2, c2), (w3, c3) = (tensor(draw, s, dt, p=0.93, scale=0.3) for s in ((E, F, d), (E, d, F), (E, F, d)))
    if coin(draw, 0.05) and all(getattr(w, "ndim", 0) == 3 for w in (w1, w2, w3)):
        w1, w2, w3 = (w.swapaxes(1, 2) for w in (w1, w2, w3))  # the other Linear layout (numpy or torch)
    clean = cx and cr and c1 and c2 and c3
    top_k = hostile(draw, draw(st.sampled_from([1, E, min(2, E)])))
    if coin(draw, 0.15):
        top_k = sizes(draw, E + 1)
    kw = {}
    if coin(draw, 0.3):
        kw["threads"] = hostile(draw, draw(st.sampled_from([0, 1, 2, 256, 257, 2**40])))
    if draw(st.booleans()):
        kw["return_routing"] = hostile(draw, True)
    res = check_named(lambda: attn.moe_feed_forward(x, router, w1, w2, w3, top_k, **kw), MOE)
    if res is None:
        return
    y, aux = res[0], res[1]
    assert shape_of(y) == shape_of(x) and type(y) is type(x) and isinstance(aux, float)
    if clean:
        assert finite(y) and math.isfinite(aux)
    if kw.get("return_routing") is True:
        ids, weights = res[2], res[3]
        assert ids.shape == weights.shape == (shape_of(x)[0], top_k) and ((ids >= 0) & (ids < E)).all()
        if clean:
            assert np.allclose(weights.sum(-1), 1.0, atol=1e-5)


SOFTMAXES = ("x", "axis", "counts", "theta", "h", "targets", "target", "word", "head_weight", "tail_weights",
             "cutoffs", "head_bias")


@settings(max_examples=SOME, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_output_softmax_arguments(data):
    """log_softmax (any rank, hostile axes), HierarchicalSoftmax (hostile counts, theta, rows,
    targets and words) and AdaptiveLogSoftmaxWithLoss (hostile cutoffs, tail pairs, biases, rows
    and targets). Answered calls have the documented shape, and from finite rows their
    probabilities sum to 1."""
    draw = data.draw
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dt = draw(st.sampled_from(["float32"] * 4 + ["float64"]))
    which = draw(st.sampled_from(["log_softmax", "hierarchical", "adaptive"]))
    if which == "log_softmax":
        shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 0]), max_size=3)))
        x, clean = tensor(draw, shape, dt, scale=draw(st.sampled_from([1.0, 1.0, 1e4])))
        axis = hostile(draw, draw(st.integers(-max(len(shape), 1), max(len(shape), 1) - 1)))
        if coin(draw, 0.1):
            axis = sizes(draw, len(shape))
        y = check_named(lambda: attn.log_softmax(x, axis) if axis is not None or coin(draw, 0.5) else
                        attn.log_softmax(x), SOFTMAXES)
        if y is not None:
            assert shape_of(y) == shape_of(x) and type(y) is type(x)
            if clean and numpy_of(x).size:
                lse = np.log(np.exp(numpy_of(y).astype(np.float64)).sum(axis if axis is not None else -1))
                assert np.allclose(lse, 0.0, atol=1e-5)
        return
    d, N = draw(st.sampled_from([3, 1, 4])), draw(st.sampled_from([2, 1, 0, 3]))
    h, ch = tensor(draw, (N, d), dt)
    if which == "hierarchical":
        V = draw(st.sampled_from([4, 2, 1, 5]))
        counts = [int(c) for c in rng.integers(1, 10, V)]
        if coin(draw, 0.15):
            counts = draw(st.sampled_from([[], [0] * V, [-1] * V, [1.5] * V, [2**63] * V, [2**64] * V, "abc", None,
                                           [[1, 2]], np.array([3, 2], np.uint64), np.full(V, 2**40), [True] * V]))
        theta, ct = tensor(draw, (max(len(counts) - 1, 0) if isinstance(counts, list) else 1, d), dt)
        hs = check_named(lambda: attn.HierarchicalSoftmax.from_counts(counts, theta), SOFTMAXES)
        if hs is None:
            return
        V = hs.vocab_size
        op = draw(st.sampled_from(["log_prob", "log_prob_all", "codes", "path"]))
        if op in ("codes", "path"):
            word = hostile(draw, draw(st.sampled_from([0, V - 1, V, -1, 2**40])))
            out = check_named(lambda: getattr(hs, op)(word), SOFTMAXES)
            if out is not None:
                assert 0 <= word < V and len(out) <= max(V - 1, 0)
            return
        if op == "log_prob_all":
            out = check_named(lambda: hs.log_prob_all(h), SOFTMAXES)
            if out is not None:
                assert shape_of(out) == (shape_of(h)[0], V)
                if ch and ct:
                    assert np.allclose(np.exp(numpy_of(out).astype(np.float64)).sum(-1), 1.0, atol=1e-5)
            return
        targets = [int(t) for t in rng.integers(0, V, N)]
        if coin(draw, 0.2):
            targets = draw(st.sampled_from([targets + [0], [V] * N, [-1] * N, [1.5] * N, None, "a",
                                            np.array(targets, np.float32), np.array(targets, np.uint64),
                                            [2**64] * N, np.full(N, 2**63, np.uint64)]))
        out = check_named(lambda: hs.log_prob(h, targets), SOFTMAXES)
        if out is not None:
            assert shape_of(out) == shape_of(h)[:1]
            if ch and ct:
                assert finite(out) and (numpy_of(out) <= 1e-6).all()
        return
    cutoffs = draw(st.sampled_from([[2], [2, 4], [1], [3, 5, 6]]))
    last = draw(st.sampled_from([1, 2, 3]))
    bounds = cutoffs + [cutoffs[-1] + last]
    head, cw = tensor(draw, (cutoffs[0] + len(cutoffs), d), dt)
    tail, clean = [], cw and ch
    for i in range(len(cutoffs)):
        hi = max(d // 2 ** (i + 1), 1)
        (p, cp), (o, co) = tensor(draw, (hi, d), dt, p=0.95), tensor(draw, (bounds[i + 1] - bounds[i], hi), dt, p=0.95)
        tail.append((p, o))
        clean = clean and cp and co
    bias, cb = (None, True) if draw(st.booleans()) else tensor(draw, (cutoffs[0] + len(cutoffs),), dt, p=0.9)
    clean = clean and cb
    if coin(draw, 0.15):
        cutoffs = draw(st.sampled_from([[], [0], [cutoffs[-1], 1], [2**40] * len(cutoffs), [1.5] * len(cutoffs),
                                        None, "ab", [-1] * len(cutoffs), [None] * len(cutoffs)]))
    if coin(draw, 0.1):
        tail = draw(st.sampled_from([tail[:-1], tail + tail[:1], [p for p, _ in tail], None, "ab", [(None, None)] * len(tail)]))
    m = check_named(lambda: attn.AdaptiveLogSoftmaxWithLoss(head, tail, cutoffs, bias), SOFTMAXES)
    if m is None:
        return
    V = m.n_classes
    assert V == bounds[-1]
    op = draw(st.sampled_from(["log_prob", "predict", "call"]))
    if op == "log_prob":
        out = check_named(lambda: m.log_prob(h), SOFTMAXES)
        if out is not None:
            assert shape_of(out) == (shape_of(h)[0], V)
            if clean:
                assert np.allclose(np.exp(numpy_of(out).astype(np.float64)).sum(-1), 1.0, atol=1e-4)
    elif op == "predict":
        out = check_named(lambda: m.predict(h), SOFTMAXES)
        if out is not None:
            assert shape_of(out) == shape_of(h)[:1] and ((numpy_of(out) >= 0) & (numpy_of(out) < V)).all()
    else:
        target = [int(t) for t in rng.integers(0, V, N)]
        if coin(draw, 0.2):
            target = draw(st.sampled_from([target + [0], [V] * N, [-1] * N, [1.5] * N, None, "a", 3,
                                           np.array(target, np.float64), [2**64] * N]))
        out = check_named(lambda: m(h, target), SOFTMAXES)
        if out is not None:
            assert shape_of(out.output) == shape_of(h)[:1] and shape_of(out.loss) == ()
            if clean and N:
                want = numpy_of(m.log_prob(h))[np.arange(N), target]
                assert np.allclose(numpy_of(out.output), want, atol=1e-4)


# ---- regressions: what the fuzzers above found (each once, so that no seed is needed) ----------

def test_titans_with_an_empty_batch_or_no_heads_and_given_weights_is_empty_not_a_reshape_error():
    """w0 per head or per sequence (or s0) with B = 0 or H = 0 ended in NumPy's "cannot reshape
    array of size 0 into shape (0,newaxis)" (a reshape(g, -1) with g = 0)."""
    for B, H in ((0, 2), (1, 0)):
        q = np.zeros((B, H, 3, 2), np.float32)
        for w0, s0 in ((np.zeros((H, 2, 2), np.float32), np.zeros((2, 2), np.float32)),
                       (np.zeros((B, H, 2, 2), np.float32), None)):
            y, w = attn.titans_memory(q, q, q, 0.1, 0.5, 0.5, "linear", w0, s0=s0)
            assert y.shape == (B, H, 3, 2) and w["W"].shape == (B, H, 2, 2)


def test_titans_attention_forms_name_q_and_k_of_a_wrong_rank():
    """titans_mag/mal/mac and titans_read unpacked q.shape: "not enough values to unpack" or an
    IndexError instead of naming q."""
    q = np.zeros((2, 3, 4), np.float32)
    for fn in (lambda: attn.titans_mag(q, q, q, 0.1, 0.5, 0.5), lambda: attn.titans_mal(q, q, q, 0.1, 0.5, 0.5),
               lambda: attn.titans_mac(q, q, q, 0.1, 0.5, 0.5, segment=2), lambda: attn.titans_read({"W": q[0]}, q[0, 0])):
        try:
            fn()
        except ValueError as e:
            assert str(e).startswith("q must have 4 dimensions (B, H, N, d)"), e
        else:
            raise AssertionError("a 3-D q was answered")
    # k (or v) of another shape met the persistent tokens in np.concatenate: NumPy's "all the input
    # arrays must have same number of dimensions" before anything named k
    q, pk = np.zeros((1, 2, 3, 4), np.float32), np.ones((2, 4), np.float32)
    for fn in (lambda: attn.titans_mag(q, q[0], q, 0.1, 0.5, 0.5, persistent=(pk, pk)),
               lambda: attn.titans_mal(q, q[0], q, 0.1, 0.5, 0.5, persistent=(pk, pk)),
               lambda: attn.titans_mac(q, q[0], q, 0.1, 0.5, 0.5, segment=2, persistent=(pk, pk))):
        try:
            fn()
        except ValueError as e:
            assert str(e) == "k must have q's shape (B, H, N, d) = (1, 2, 3, 4), got (2, 3, 4)", e
        else:
            raise AssertionError("a 3-D k was answered")


def test_blocks_name_threads_beyond_a_cpp_int():
    """threads=2**40 reached the binding's int in refine_attention, lite_la, mix_ffn and sana_block:
    nanobind's "incompatible function arguments" dump, naming nothing."""
    a = np.tril(np.ones((3, 3), np.float32))
    a /= a.sum(-1, keepdims=True)
    w = np.ones((3, 2), np.float32)
    x, C = np.zeros((1, 4, 8), np.float32), 8
    ffn = (np.zeros((2 * C, C), np.float32), np.zeros(2 * C, np.float32), np.zeros((2 * C, 3, 3), np.float32),
           np.zeros(2 * C, np.float32), np.zeros((C, C), np.float32))
    lite = (np.zeros((3 * C, C), np.float32), np.zeros((C, C), np.float32), None)
    for fn in (lambda t: attn.refine_attention(a, w, w, w, threads=t),
               lambda t: attn.lite_la(x, *lite, head_dim=4, threads=t),
               lambda t: attn.mix_ffn(x, (2, 2), *ffn, threads=t),
               lambda t: attn.sana_block(x, (2, 2), *lite, *ffn, head_dim=4, threads=t)):
        for t in (2**40, 257, -1):
            try:
                fn(t)
            except ValueError as e:
                assert str(e) == f"threads must be in [0, 256], got {t}", e
            else:
                raise AssertionError(f"threads={t} was answered")


def test_refinement_of_no_tokens_names_a_not_a_reshape_error():
    """a (..., 0, 0) was reshaped to (-1, 0, 0): NumPy's "cannot reshape array of size 0 into shape
    (0,0)" instead of C++'s refusal naming a. An empty leading dimension is answered, empty."""
    w = np.ones((0, 1), np.float32)
    for a in (np.zeros((0, 0), np.float32), np.zeros((2, 0, 0), np.float32)):
        for fn in (lambda: attn.refine_attention(a, np.zeros(a.shape[:-1] + (3,), np.float32), w, w),
                   lambda: attn.refined_weights(a, w, w)):
            try:
                fn()
            except ValueError as e:
                assert "a must have at least one row" in str(e), e
            else:
                raise AssertionError("N = 0 was answered")
    a, v, w = np.zeros((0, 2, 2), np.float32), np.zeros((0, 2, 3), np.float32), np.ones((2, 1), np.float32)
    assert attn.refine_attention(a, v, w, w).shape == (0, 2, 3)
    assert attn.refined_weights(a, w, w).shape == (0, 2, 2)


def test_log_softmax_of_a_0d_array_keeps_its_shape():
    """A 0-d x came back 1-d (np.ascontiguousarray gives a 0-d array one dimension)."""
    for x in (np.array(3.0, np.float32), torch.tensor(3.0, dtype=torch.float64)):
        y = attn.log_softmax(x)
        assert tuple(y.shape) == () and float(y) == 0.0


def test_adaptive_softmax_with_one_class_names_its_arguments():
    """cutoffs=[0] and a last cluster of one row: C++'s "n_classes must be at least 2", and
    n_classes is no argument of this constructor."""
    d = 2
    try:
        attn.AdaptiveLogSoftmaxWithLoss(np.zeros((2, d), np.float32),
                                        [(np.zeros((1, d), np.float32), np.zeros((1, 1), np.float32))], [0])
    except ValueError as e:
        assert str(e).startswith("cutoffs[-1] + the rows of tail_weights[-1][1] (the classes V) must be at least 2"), e
    else:
        raise AssertionError("one class was answered")


def test_sana_conv_weight_without_rows_is_named_not_a_reshape_error():
    """A 1x1 conv weight (0, C, 1, 1) was flattened with reshape(0, -1): NumPy's "cannot reshape
    array of size 0" instead of C++'s refusal naming the inverted weight."""
    C, x = 4, np.zeros((1, 4, 4), np.float32)
    z = np.zeros(0, np.float32)
    try:
        attn.mix_ffn(x, (2, 2), np.zeros((0, C, 1, 1), np.float32), z, np.zeros((0, 1, 3, 3), np.float32), z,
                     np.zeros((C, 0, 1, 1), np.float32))
    except ValueError as e:
        assert "inverted weight must have an even number 2h >= 2 of rows" in str(e), e
    else:
        raise AssertionError("2h = 0 was answered")


@pytest.mark.xfail(strict=True, reason="C++ (src/): with an infinite k scale (or one whose products overflow "
                   "float32) form 'rows' answers finite values while 'tiled' and 'reference' answer NaN, as "
                   "attend on the float rows scale * row does")
def test_int8_rows_with_an_infinite_k_scale_agree_across_forms():
    """Found by test_int8_rows_arguments: k row j stands for scale[j] * row, so a scale of inf (or
    1e38, whose products overflow) makes that key's float row infinite and the output NaN -- as
    'tiled' and 'reference' answer. The 'rows' form answers finite numbers, as if the key were not
    there (the default form for a single query row)."""
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 1, 2, 4)).astype(np.float32)
    (k8, ks), (v8, vs) = (attn.quantize_rows(rng.standard_normal((1, 3, 1, 4)).astype(np.float32)) for _ in range(2))
    for bad in (np.inf, 1e38):
        ks[0, 1, 0] = bad
        outs = [attn.attend(q, k8, v8, kv_scales=(ks, vs), form=f) for f in ("rows", "tiled", "reference")]
        assert all(np.array_equal(o, outs[-1], equal_nan=True) for o in outs), (bad, outs)
