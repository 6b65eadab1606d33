"""SANA (Xie et al. 2024): LiteLA against relu(Q) relu(K)^T row-normalised times V, Mix-FFN
against a torch GLUMBConv built from nn.Conv2d, the block as the composition attn/sana.hpp states,
and bad input."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attn


def weights(C, h, seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    s = 1 / np.sqrt(C)
    w = dict(qkv_weight=rng.standard_normal((3 * C, C)) * s, proj_weight=rng.standard_normal((C, C)) * s,
             proj_bias=rng.standard_normal(C) * 0.1,
             inverted_weight=rng.standard_normal((2 * h, C, 1, 1)) * s, inverted_bias=rng.standard_normal(2 * h) * 0.1,
             depth_weight=rng.standard_normal((2 * h, 1, 3, 3)) * 0.3, depth_bias=rng.standard_normal(2 * h) * 0.1,
             point_weight=rng.standard_normal((C, h, 1, 1)) / np.sqrt(h))
    return {k: v.astype(dtype) for k, v in w.items()}


LA = ("qkv_weight", "proj_weight", "proj_bias")
FF = ("inverted_weight", "inverted_bias", "depth_weight", "depth_bias", "point_weight")


def numpy_lite_la(x, w, head_dim=32, eps=1e-15):
    B, N, C = x.shape
    qkv = x @ w["qkv_weight"].T
    q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
    out = np.empty_like(q)
    for h in range(C // head_dim):
        sl = slice(h * head_dim, (h + 1) * head_dim)
        a = np.maximum(q[..., sl], 0) @ np.swapaxes(np.maximum(k[..., sl], 0), -1, -2)  # (B, N, N)
        out[..., sl] = (a @ v[..., sl]) / (a.sum(-1, keepdims=True) + eps)
    return out @ w["proj_weight"].T + w["proj_bias"]


class TorchGLUMBConv(torch.nn.Module):
    """GLUMBConv written with nn.Conv2d: 1x1 (bias) + SiLU, depthwise 3x3 (bias), GLU, 1x1 (no bias)."""

    def __init__(self, C, h):
        super().__init__()
        self.inverted = torch.nn.Conv2d(C, 2 * h, 1)
        self.depth = torch.nn.Conv2d(2 * h, 2 * h, 3, padding=1, groups=2 * h)
        self.point = torch.nn.Conv2d(h, C, 1, bias=False)

    def forward(self, x, H, W):
        B, N, C = x.shape
        y = x.transpose(1, 2).reshape(B, C, H, W)
        y = self.depth(F.silu(self.inverted(y)))
        a, g = y.chunk(2, dim=1)
        return self.point(a * F.silu(g)).flatten(2).transpose(1, 2)


def test_lite_la_is_relu_linear_attention_and_permutation_equivariant():
    B, N, C = 2, 13, 64
    w = weights(C, 160, 1)
    x = np.random.default_rng(2).standard_normal((B, N, C))
    want = numpy_lite_la(x, w)
    np.testing.assert_allclose(attn.lite_la(x, *(w[k] for k in LA)), want, atol=1e-12)
    got = attn.lite_la(x.astype(np.float32), *(w[k] for k in LA))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=2e-5)
    perm = np.random.default_rng(3).permutation(N)
    np.testing.assert_allclose(attn.lite_la(x[:, perm].astype(np.float32), *(w[k] for k in LA)), got[:, perm],
                               atol=2e-5)


@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-5), (np.float64, 1e-12)])
def test_mix_ffn_matches_torch_conv2d_glumbconv(dtype, tol):
    B, H, W, C = 2, 5, 7, 16
    h = int(2.5 * C)
    w = weights(C, h, 4)
    m = TorchGLUMBConv(C, h).double()
    with torch.no_grad():
        for conv, wk, bk in ((m.inverted, "inverted_weight", "inverted_bias"), (m.depth, "depth_weight", "depth_bias"),
                             (m.point, "point_weight", None)):
            conv.weight.copy_(torch.from_numpy(w[wk]))
            if bk:
                conv.bias.copy_(torch.from_numpy(w[bk]))
        x = torch.randn(B, H * W, C, dtype=torch.float64)
        want = m(x, H, W).numpy()
    got = attn.mix_ffn(x.to(getattr(torch, np.dtype(dtype).name)), (H, W), *(w[k] for k in FF))
    assert isinstance(got, torch.Tensor) and got.shape == (B, H * W, C)
    np.testing.assert_allclose(got.double().numpy(), want, atol=tol)


def test_sana_block_is_the_documented_composition():
    B, H, W, C = 1, 3, 4, 32
    w = weights(C, 80, 5)
    x = np.random.default_rng(6).standard_normal((B, H * W, C))

    def ln(t):
        return (t - t.mean(-1, keepdims=True)) / np.sqrt(t.var(-1, keepdims=True) + 1e-6)

    y = x + numpy_lite_la(ln(x), w)
    want = y + attn.mix_ffn(ln(y), (H, W), *(w[k] for k in FF))
    got = attn.sana_block(x, (H, W), *(w[k] for k in LA + FF))
    np.testing.assert_allclose(got, want, atol=1e-12)
    got32 = attn.sana_block(x.astype(np.float32), (H, W), *(w[k] for k in LA + FF))
    np.testing.assert_allclose(got32, want, atol=5e-5)


def test_bad_input_names_the_argument():
    C = 32
    w = weights(C, 80, 7, np.float32)
    x = np.zeros((1, 6, C), np.float32)
    with pytest.raises(ValueError, match=r"hw = \(2, 2\) must multiply to the tokens N = 6"):
        attn.mix_ffn(x, (2, 2), *(w[k] for k in FF))
    with pytest.raises(ValueError, match=r"x must have 3 dimensions"):
        attn.lite_la(x[0], *(w[k] for k in LA))
    with pytest.raises(ValueError, match=r"point weight must have shape \(C, h\) = \(32, 80\), got \(32, 79\)"):
        attn.mix_ffn(x, (2, 3), *(w[k] for k in FF[:-1]), w["point_weight"][:, :79])
    with pytest.raises(ValueError, match=r"head_dim must divide the channels C = 32, got head_dim = 5"):
        attn.lite_la(x, *(w[k] for k in LA), head_dim=5)
    with pytest.raises(ValueError, match=r"qkv weight must have shape \(3 C, C\) = \(96, 32\), got \(95, 32\)"):
        attn.sana_block(x, (3, 2), w["qkv_weight"][:95], *(w[k] for k in LA[1:] + FF))


def test_a_depthwise_kernel_must_be_3x3():
    # (2h, 1, 1, 9) and (2h, 1, 9, 1) hold 9 taps too, and were once run as if they were 3x3
    C = 32
    w = weights(C, 80, 7, np.float32)
    x = np.zeros((1, 6, C), np.float32)
    depth = np.asarray(w["depth_weight"]).reshape(160, 9)
    args = lambda d: (w["inverted_weight"], w["inverted_bias"], d, w["depth_bias"], w["point_weight"])
    want = attn.mix_ffn(x, (2, 3), *args(depth))
    for ok in (depth.reshape(160, 3, 3), depth.reshape(160, 1, 3, 3)):
        np.testing.assert_array_equal(attn.mix_ffn(x, (2, 3), *args(ok)), want)
    for bad in (depth.reshape(160, 1, 1, 9), depth.reshape(160, 1, 9, 1), depth.reshape(160, 9, 1)):
        with pytest.raises(ValueError, match=r"depth_weight must be a 3x3 depthwise kernel, .* got shape \(160, "):
            attn.mix_ffn(x, (2, 3), *args(bad))
    with pytest.raises(ValueError, match=r"point_weight must be \(out, in\) or a 1x1 conv weight .* got shape \(32, 80, 3, 3\)"):
        attn.mix_ffn(x, (2, 3), *args(depth)[:-1], np.zeros((32, 80, 3, 3), np.float32))
