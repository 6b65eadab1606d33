"""A bounded fuzzer of the Python argument layer (hardening issue): random dtypes, ranks, shapes,
strides, byte orders and options thrown at attn.attention / attn.attend / attn.explain. Every
outcome must be a correct result or the project's own error (ValueError/TypeError with a message
that names an argument) -- never a crash, a foreign message from the binding layer, or NaN from
finite inputs."""
import os

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

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
