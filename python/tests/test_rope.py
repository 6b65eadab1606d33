"""attn.rope against a literal float64 implementation of both conventions (Hugging Face's
rotate-half and the interleaved GPT-J/flash-attn form), in place and not, NumPy and torch."""
import numpy as np
import pytest
import torch

import attn
from conftest import assert_half_ulps


def literal_rope(x, offset, theta, style, rotary_dim=None, layout="bnhd"):
    """x (B, N, H, D) float64 -> rotated, written the way model code writes it."""
    x = np.asarray(x, np.float64)
    if layout == "bhnd":
        x = x.transpose(0, 2, 1, 3)
    B, N, H, D = x.shape
    R = D if rotary_dim is None else rotary_dim
    inv_freq = theta ** (-np.arange(0, R, 2, dtype=np.float64) / R)  # (R/2,)
    pos = offset + np.arange(N, dtype=np.float64)
    ang = pos[:, None] * inv_freq[None, :]  # (N, R/2)
    out = x.copy()
    xr = x[..., :R]
    if style == "half":  # cat(freqs, freqs); q*cos + rotate_half(q)*sin
        cos = np.cos(np.concatenate([ang, ang], -1))[None, :, None, :]
        sin = np.sin(np.concatenate([ang, ang], -1))[None, :, None, :]
        rot = np.concatenate([-xr[..., R // 2:], xr[..., :R // 2]], -1)
        out[..., :R] = xr * cos + rot * sin
    else:
        cos, sin = np.cos(ang)[None, :, None, :], np.sin(ang)[None, :, None, :]
        a, b = xr[..., 0::2], xr[..., 1::2]
        out[..., 0:R:2] = a * cos - b * sin
        out[..., 1:R:2] = a * sin + b * cos
    return out.transpose(0, 2, 1, 3) if layout == "bhnd" else out


@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("layout", ["bnhd", "bhnd"])
@pytest.mark.parametrize("rotary_dim", [None, 16])
def test_rope_matches_literal(style, layout, rotary_dim):
    x = np.random.default_rng(1).standard_normal((2, 19, 3, 32)).astype(np.float32)
    got = attn.rope(x, offset=500, theta=1e5, style=style, rotary_dim=rotary_dim, layout=layout)
    want = literal_rope(x, 500, 1e5, style, rotary_dim, layout)
    assert np.abs(got - want).max() < 2e-6
    assert not np.array_equal(got, x)  # a copy; x untouched
    assert np.array_equal(x, np.random.default_rng(1).standard_normal((2, 19, 3, 32)).astype(np.float32))


def test_rope_inplace_torch_bf16_and_batch_offsets():
    x = torch.randn(2, 7, 4, 16)
    want = torch.from_numpy(np.concatenate([literal_rope(x[:1].numpy(), 3, 1e4, "half"),
                                            literal_rope(x[1:].numpy(), 3 + 40, 1e4, "half")]))
    y = x.clone()
    out = attn.rope(y, offset=3, batch_offsets=[0, 40], inplace=True)
    assert out is y and torch.allclose(y.double(), want, atol=2e-6)
    xb = x.to(torch.bfloat16)
    got = attn.rope(xb, offset=3, batch_offsets=[0, 40])
    want_b = np.concatenate([literal_rope(xb[:1].float().numpy(), 3, 1e4, "half"),
                             literal_rope(xb[1:].float().numpy(), 3 + 40, 1e4, "half")])
    assert got.dtype == torch.bfloat16
    assert_half_ulps(got, torch.from_numpy(want_b), torch.bfloat16)


def test_rope_then_attention_depends_on_relative_position():
    r = np.random.default_rng(2)
    q = r.standard_normal((1, 1, 1, 32)).astype(np.float32)
    k = r.standard_normal((1, 1, 1, 32)).astype(np.float32)
    s1 = (attn.rope(q, offset=10) * attn.rope(k, offset=3)).sum()
    s2 = (attn.rope(q, offset=4010) * attn.rope(k, offset=4003)).sum()
    assert abs(s1 - s2) < 1e-4


@pytest.mark.parametrize("kw,exc,fragment", [
    (dict(style="rotate"), ValueError, "style must be 'half' or 'interleaved'"),
    (dict(rotary_dim=3), ValueError, "rotary_dim must be even"),
    (dict(theta=0.5), ValueError, "theta must be a finite number > 1"),
    (dict(offset=1.5), TypeError, "offset must be an integer"),
    (dict(offset=-3), ValueError, "offset gives positions outside"),
    (dict(batch_offsets=[1, 2, 3]), ValueError, "batch_offsets must have one value per batch"),
])
def test_rope_bad_arguments(kw, exc, fragment):
    x = np.zeros((2, 3, 1, 8), np.float32)
    with pytest.raises(exc) as e:
        attn.rope(x, **kw)
    assert fragment in str(e.value)
