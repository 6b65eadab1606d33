"""Property tests: random shapes, strides, layouts, masks and head counts against a float64
oracle, with NumPy arrays and torch tensors."""
import os

import numpy as np
import torch
from hypothesis import given, settings, strategies as st

import attn
from conftest import assert_half_ulps, assert_rule, literal_attention
from test_linear import MAPS, literal


@st.composite
def problems(draw):
    B = draw(st.integers(1, 3))
    Hkv = draw(st.integers(1, 3))
    H = Hkv * draw(st.integers(1, 3))
    N = draw(st.integers(1, 140))
    M = draw(st.integers(1, 140))
    D = draw(st.sampled_from([1, 3, 8, 17, 32, 64]))
    Dv = draw(st.sampled_from([D, 5, 16]))
    layout = draw(st.sampled_from(["bnhd", "bhnd"]))
    causal = draw(st.booleans())
    left = draw(st.sampled_from([-1, 0, 5, 40]))
    right = draw(st.sampled_from([-1, 0, 3]))
    strided = draw(st.booleans())
    use_mask = draw(st.booleans())
    use_torch = draw(st.booleans())
    pad = draw(st.booleans())
    softcap = draw(st.sampled_from([0.0, 0.0, 5.0, 30.0]))
    alibi = draw(st.booleans())
    bias = draw(st.booleans())  # an additive float mask instead of (or beside) the boolean one
    scale = draw(st.sampled_from([None, None, 0.07, 0.5]))
    entropy_m = draw(st.sampled_from([0, 0, 16, 512]))
    seed = draw(st.integers(0, 2**31 - 1))
    dtype = draw(st.sampled_from(["float32", "float32", "bfloat16", "float16"]))
    return dict(dtype=dtype, B=B, H=H, Hkv=Hkv, N=N, M=M, D=D, Dv=Dv, layout=layout, causal=causal, window=(left, right),
                strided=strided, use_mask=use_mask, use_torch=use_torch, pad=pad, seed=seed, softcap=softcap,
                alibi=alibi, bias=bias, scale=scale, entropy_m=entropy_m)


def tensor(rng, b, h, n, d, layout, strided):
    """A (b,h,n,d) problem tensor in the given layout, optionally a non-contiguous slice."""
    shape = (b, n, h, d) if layout == "bnhd" else (b, h, n, d)
    if strided:  # every other element of a larger buffer along the last-but-one axis
        big = rng.standard_normal(shape[:-2] + (shape[-2] * 2, shape[-1] + 3)).astype(np.float32)
        return big[..., ::2, 1:1 + d]
    return rng.standard_normal(shape).astype(np.float32)


@settings(max_examples=int(os.environ.get("ATTN_HYPOTHESIS_EXAMPLES", "60")), deadline=None)
@given(problems())
def test_random_problems_match_float64(p):
    rng = np.random.default_rng(p["seed"])
    q = tensor(rng, p["B"], p["H"], p["N"], p["D"], p["layout"], p["strided"])
    k = tensor(rng, p["B"], p["Hkv"], p["M"], p["D"], p["layout"], p["strided"])
    v = tensor(rng, p["B"], p["Hkv"], p["M"], p["Dv"], p["layout"], p["strided"])
    mask = rng.random((p["B"], 1, p["N"], p["M"])) > 0.4 if p["use_mask"] else None
    if p["bias"]:  # a float mask: additive, with some -inf
        bias = rng.standard_normal((p["B"], 1, p["N"], p["M"])).astype(np.float32)
        mask = np.where(mask, bias, -np.inf).astype(np.float32) if mask is not None else bias
    slopes = (2.0 ** (-8.0 * np.arange(1, p["H"] + 1) / p["H"])).astype(np.float32) if p["alibi"] else None
    kv_len = [int(x) for x in rng.integers(0, p["M"] + 1, p["B"])] if p["pad"] else None
    tdtype = getattr(torch, p["dtype"])
    if p["dtype"] == "bfloat16":  # numpy has no bfloat16: torch tensors
        p["use_torch"] = True
    if p["dtype"] != "float32":  # round the inputs to the storage dtype first
        q, k, v = (torch.from_numpy(np.ascontiguousarray(x)).to(tdtype).float().numpy() for x in (q, k, v))
    args = (q, k, v)
    if p["use_torch"]:
        args = tuple(torch.from_numpy(x).to(tdtype) for x in args)
        mask = torch.from_numpy(mask) if mask is not None else None
    elif p["dtype"] == "float16":
        args = tuple(x.astype(np.float16) for x in args)
    if p["entropy_m"]:  # the entropy-invariant scale is a mechanism option: through attend's text
        opts = [f"entropy_scale={p['entropy_m']}"] + (["causal"] if p["causal"] else [])
        left, right = p["window"]
        if (left, right) != (-1, -1):
            opts.append(f"window={left}:{right}")
        if p["softcap"]:
            opts.append(f"softcap={p['softcap']:g}")
        if p["scale"] is not None:
            opts.append(f"scale={p['scale']:g}")
        out, lse = attn.attend(*args, "softmax:" + ",".join(opts), attn_mask=mask, alibi_slopes=slopes,
                               key_padding_lengths=kv_len, layout=p["layout"], return_lse=True)
    else:
        out, lse = attn.attention(*args, causal=p["causal"], window_size=p["window"], attn_mask=mask,
                                  key_padding_lengths=kv_len, layout=p["layout"], return_lse=True,
                                  softcap=p["softcap"], alibi_slopes=slopes, softmax_scale=p["scale"])
    to_bhnd = (lambda x: torch.as_tensor(np.ascontiguousarray(x)).transpose(1, 2)) if p["layout"] == "bnhd" \
        else (lambda x: torch.as_tensor(np.ascontiguousarray(x)))
    qb, kb, vb = (to_bhnd(np.asarray(x)) for x in (q, k, v))
    m = torch.as_tensor(np.asarray(mask)) if mask is not None else None
    kw = dict(causal=p["causal"], window=p["window"], mask=m, kv_len=kv_len, softcap=p["softcap"],
              alibi=slopes, scale=p["scale"], entropy_m=p["entropy_m"])
    oracle, lse64 = literal_attention(qb, kb, vb, dtype=torch.float64, **kw)
    plain, _ = literal_attention(qb, kb, vb, dtype=tdtype if tdtype == torch.bfloat16 else torch.float32, **kw)
    plain = plain.to(tdtype)  # float16: float32 math rounded to the storage dtype
    out = out.float() if isinstance(out, torch.Tensor) else out.astype(np.float32)
    assert_rule(to_bhnd(np.asarray(out)), oracle, plain, tdtype,
                per_element=tdtype != torch.bfloat16)  # bf16 inputs: bf16 products (P rounded to bf16)
    lse = torch.as_tensor(np.asarray(lse)).double()
    fin = torch.isfinite(lse64)
    assert torch.equal(torch.isfinite(lse), fin)
    assert torch.allclose(lse[fin], lse64[fin], atol=1e-5, rtol=1e-5)


@st.composite
def linear_problems(draw):
    Hkv = draw(st.integers(1, 2))
    causal = draw(st.booleans())
    N = draw(st.integers(1, 130))
    feature_map = draw(st.sampled_from(sorted(MAPS)))
    # normalising divides by sum_j phi(q).phi(k_j): a convex combination of values for the
    # non-negative maps; with signed features (identity) the sum can cancel to ~0, ill-posed
    normalize = draw(st.booleans()) and feature_map != "identity"
    return dict(B=draw(st.integers(1, 2)), Hkv=Hkv, H=Hkv * draw(st.integers(1, 2)), N=N,
                M=N if causal else draw(st.integers(1, 130)), D=draw(st.sampled_from([1, 4, 16])),
                Dv=draw(st.sampled_from([1, 8, 12])), causal=causal,
                feature_map=feature_map, normalize=normalize,
                decay=draw(st.sampled_from([None, 0.9, 1.0])) if causal else None,
                scale=draw(st.sampled_from([None, 0.25])), chunk=draw(st.sampled_from([16, 64])),
                dtype=draw(st.sampled_from(["float32", "float32", "bfloat16"])), seed=draw(st.integers(0, 2**31 - 1)))


@settings(max_examples=int(os.environ.get("ATTN_HYPOTHESIS_EXAMPLES", "60")) // 2, deadline=None)
@given(linear_problems())
def test_random_linear_problems_match_float64(p):
    """The linear family (every feature map, normalised or not, decay, scale, grouped heads) against
    the quadratic formula in float64."""
    rng = np.random.default_rng(p["seed"])
    q = (rng.standard_normal((p["B"], p["N"], p["H"], p["D"])) * 0.5).astype(np.float32)
    k = (rng.standard_normal((p["B"], p["M"], p["Hkv"], p["D"])) * 0.5).astype(np.float32)
    v = rng.standard_normal((p["B"], p["M"], p["Hkv"], p["Dv"])).astype(np.float32)
    tdtype = getattr(torch, p["dtype"])
    q, k, v = (torch.from_numpy(x).to(tdtype) for x in (q, k, v))
    out, _ = attn.linear_attention(q, k, v, feature_map=p["feature_map"], causal=p["causal"], decay=p["decay"],
                                   normalize=p["normalize"], scale=p["scale"], chunk_size=p["chunk"])
    args = [x.float().numpy() for x in (q, k, v)]
    kw = dict(feature_map=p["feature_map"], causal=p["causal"], decay=p["decay"], normalize=p["normalize"],
              scale=1.0 if p["scale"] is None else p["scale"])
    want = literal(*args, **kw)
    if p["dtype"] == "float32":
        err = np.abs(out.numpy().astype(np.float64) - want).max()
        # float32 sums of up to 130 products of features up to e^(2.5 sigma): relative 1e-5
        assert err <= 1e-5 * max(1.0, np.abs(want).max()), f"max error {err:.3g}"
    else:
        assert_half_ulps(out, torch.from_numpy(want), tdtype)
