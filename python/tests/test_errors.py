"""Every bad input raises ValueError/TypeError with a message naming the problem."""
import numpy as np
import pytest
import torch

import attn


def qkv(B=2, N=5, M=6, H=4, Hkv=2, D=8):
    r = np.random.default_rng(0)
    return (r.standard_normal((B, N, H, D)).astype(np.float32), r.standard_normal((B, M, Hkv, D)).astype(np.float32),
            r.standard_normal((B, M, Hkv, D)).astype(np.float32))


@pytest.mark.parametrize("make,exc,fragment", [
    (lambda q, k, v: attn.attention(q, k[:, :, :1].repeat(3, 2), v[:, :, :1].repeat(3, 2)), ValueError,
     "k has 3 heads, which does not divide q's 4"),
    (lambda q, k, v: attn.attention(q, k[..., :7], v), ValueError, "k has head_dim 7, q has 8"),
    (lambda q, k, v: attn.attention(q, k, v[:, :5]), ValueError, "v must have shape"),
    (lambda q, k, v: attn.attention(q[0], k, v), ValueError, "must have 4 dimensions"),
    (lambda q, k, v: attn.attention(q.astype(np.float64), k, v), TypeError, "q must be float32, float16 or bfloat16, got float64"),
    (lambda q, k, v: attn.attention(q, k.astype(np.float16), v), ValueError, "must share a dtype"),
    (lambda q, k, v: attn.attention(q, k, v, softmax_scale=float("nan")), ValueError, "scale"),
    (lambda q, k, v: attn.attention(q, k, v, softmax_scale=-1.0), ValueError, "scale must be > 0"),
    (lambda q, k, v: attn.attention(q, k, v, window_size=(-2, 0)), ValueError, "window"),
    (lambda q, k, v: attn.attention(q, k, v, softcap=-3.0), ValueError, "softcap must be >= 0"),
    (lambda q, k, v: attn.attention(q, k, v, dropout_p=1.0), ValueError, "dropout must be in [0, 1)"),
    (lambda q, k, v: attn.attention(q, k, v, attn_mask=np.ones((5, 7), bool)), ValueError, "broadcastable to (B, H, N, M) = (2, 4, 5, 6)"),
    (lambda q, k, v: attn.attention(q, k, v, key_padding_lengths=[6]), ValueError, "one length per batch (2), got 1"),
    (lambda q, k, v: attn.attention(q, k, v, key_padding_lengths=[6, 9]), ValueError, "key_padding_lengths[1] must be in [0, 6], got 9"),
    (lambda q, k, v: attn.attention(q, k, v, alibi_slopes=np.ones(3, np.float32)), ValueError, "alibi_slopes must have H (4) or B*H (8) values, got 3"),
    (lambda q, k, v: attn.attention(q, k, v, alibi_slopes=np.array([1, 1, 1, np.inf], np.float32)), ValueError, "must be finite"),
    (lambda q, k, v: attn.attend(q, k, v, "softmax:casual"), ValueError, "unknown softmax option 'casual'"),
    (lambda q, k, v: attn.attend(q, k, v, "linear"), ValueError, "unknown mechanism 'linear'"),
    (lambda q, k, v: attn.attend(q, k, v, "softmax:score=additive"), ValueError,
     "softmax:score=additive needs params['wq'] of shape (A, D)"),
    (lambda q, k, v: attn.attend(q, k, v, "softmax", wq=np.ones((3, 8), np.float32)), ValueError,
     "params has 'wq', which softmax does not take"),
    (lambda q, k, v: attn.attend(q, k, v, "softmax:score=additive", params={"wq": np.ones((3, 8), np.float32),
                                 "wk": np.ones((3, 7), np.float32), "w": np.ones(3, np.float32)}), ValueError,
     "params['wk'] must have shape (A, D) with D = 8, got (3, 7)"),
    (lambda q, k, v: attn.attend(q, k, v, form="fast"), ValueError, "form must be one of rows, tiled, reference"),
    (lambda q, k, v: attn.attend(q, k, v, "softmax:dropout=0.5", form="rows"), ValueError,
     "form 'rows' cannot run softmax:dropout=0.5 for these inputs; forms: rows: dropout; tiled: supported"),
    (lambda q, k, v: attn.attend(q, k, v, isa="sse9"), ValueError, "isa: expected portable (or scalar), avx2 or avx512"),
    (lambda q, k, v: attn.attend(q, k, v, use_reference=True, form="tiled"), ValueError, "conflicts with form='tiled'"),
    (lambda q, k, v: attn.explain(q, k[..., :7], v), ValueError, "k has head_dim 7, q has 8"),
    (lambda q, k, v: attn.attend(q, k, v, "softmax:scale=1,scale=2"), ValueError, "option 'scale' is given twice"),
    (lambda q, k, v: attn.attend(q, k, v, layout="nhd"), ValueError, "layout must be 'bnhd' or 'bhnd'"),
    (lambda q, k, v: attn.attention(q, torch.from_numpy(k), v), TypeError, "must all be numpy arrays or all torch tensors"),
    (lambda q, k, v: attn.attention([1.0], k, v), TypeError, "q must be a numpy.ndarray or torch.Tensor"),
])
def test_bad_input_raises_with_message(make, exc, fragment):
    q, k, v = qkv()
    with pytest.raises(exc) as e:
        make(q, k, v)
    assert fragment in str(e.value), str(e.value)


def test_set_isa_rejects_unknown():
    with pytest.raises(ValueError, match=r"set_isa: expected portable \(or scalar\), avx2 or avx512, got 'sse9'"):
        attn.set_isa("sse9")


def test_empty_inputs():
    q, k, v = qkv(N=0)
    assert attn.attention(q, k, v).shape == (2, 0, 4, 8)
    q, k, v = qkv(M=0)
    out, lse = attn.attention(q, k, v, return_lse=True)
    assert (out == 0).all() and np.isneginf(lse).all()


def test_requires_grad_warns_that_the_result_is_detached():
    q = torch.randn(1, 4, 2, 8, requires_grad=True)
    with pytest.warns(RuntimeWarning, match="no backward pass yet"):
        out = attn.attention(q, q, q)
    assert not out.requires_grad
    with torch.no_grad():
        attn.attention(q, q, q)  # no warning needed
