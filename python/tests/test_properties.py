"""Property tests: random shapes, strides, layouts, masks and head counts against a float64
oracle, with NumPy arrays and torch tensors."""
import os

import numpy as np
import torch
from hypothesis import given, settings, strategies as st

import attn
from conftest import assert_rule, literal_attention


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
    seed = draw(st.integers(0, 2**31 - 1))
    dtype = draw(st.sampled_from(["float32", "float32", "bfloat16", "float16"]))
    return dict(dtype=dtype, B=B, H=H, Hkv=Hkv, N=N, M=M, D=D, Dv=Dv, layout=layout, causal=causal, window=(left, right),
                strided=strided, use_mask=use_mask, use_torch=use_torch, pad=pad, seed=seed)


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
    out, lse = attn.attention(*args, causal=p["causal"], window_size=p["window"], attn_mask=mask,
                              key_padding_lengths=kv_len, layout=p["layout"], return_lse=True)
    to_bhnd = (lambda x: torch.as_tensor(np.ascontiguousarray(x)).transpose(1, 2)) if p["layout"] == "bnhd" \
        else (lambda x: torch.as_tensor(np.ascontiguousarray(x)))
    qb, kb, vb = (to_bhnd(np.asarray(x)) for x in (q, k, v))
    m = torch.as_tensor(np.asarray(mask)) if mask is not None else None
    kw = dict(causal=p["causal"], window=p["window"], mask=m, kv_len=kv_len)
    oracle, lse64 = literal_attention(qb, kb, vb, dtype=torch.float64, **kw)
    plain, _ = literal_attention(qb, kb, vb, dtype=tdtype if tdtype == torch.bfloat16 else torch.float32, **kw)
    plain = plain.to(tdtype)  # float16: float32 math rounded to the storage dtype
    out = out.float() if isinstance(out, torch.Tensor) else out.astype(np.float32)
    assert_rule(to_bhnd(np.asarray(out)), oracle, plain, tdtype)
    lse = torch.as_tensor(np.asarray(lse)).double()
    fin = torch.isfinite(lse64)
    assert torch.equal(torch.isfinite(lse), fin)
    assert torch.allclose(lse[fin], lse64[fin], atol=1e-5, rtol=1e-5)
