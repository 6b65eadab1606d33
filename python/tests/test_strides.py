"""Views with unusual strides give bitwise the same result as contiguous copies."""
import numpy as np
import pytest
import torch

import attn


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_qkv_views(dtype):
    qkv = torch.randn(2, 77, 3, 4, 32).to(dtype)  # (B, N, 3, H, D), as a fused projection writes it
    q, k, v = qkv.unbind(2)                       # strided views, no copies
    assert not q.is_contiguous()
    out = attn.attention(q, k, v, causal=True)
    ref = attn.attention(q.contiguous(), k.contiguous(), v.contiguous(), causal=True)
    assert torch.equal(out, ref)


def test_non_unit_inner_stride():
    big = np.random.default_rng(0).standard_normal((1, 50, 2, 64)).astype(np.float32)
    q = big[..., ::2]  # head_dim stride 2
    out = attn.attention(q, q, q)
    assert np.array_equal(out, attn.attention(np.ascontiguousarray(q), np.ascontiguousarray(q), np.ascontiguousarray(q)))


def test_output_layout_follows_input_layout():
    q = torch.randn(1, 8, 3, 16)  # bhnd
    out = attn.attention(q, q, q, layout="bhnd")
    assert out.shape == q.shape and out.is_contiguous()
