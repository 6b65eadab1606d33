"""attn.moe_feed_forward against a torch implementation written here (a loop over experts that
gathers each expert's tokens), MiniMax-01's worked cases and bad input."""
import numpy as np
import pytest
import torch

import attn


def torch_moe(x, router, w1, w2, w3, top_k):
    """MiniMax-01's MoE in torch: softmax router (in float32 for float32 x), top-k, renormalised,
    SwiGLU experts."""
    p = torch.softmax(x @ router.T, dim=-1)
    top_p, top_i = torch.topk(p, top_k, dim=-1)
    w = (top_p / top_p.sum(-1, keepdim=True)).to(x.dtype)
    y = torch.zeros_like(x)
    E = router.shape[0]
    for e in range(E):
        token, slot = torch.where(top_i == e)
        if token.numel() == 0:
            continue
        h = x[token]
        out = (torch.nn.functional.silu(h @ w1[e].T) * (h @ w3[e].T)) @ w2[e].T
        y.index_add_(0, token, out * w[token, slot, None])
    f = torch.zeros(E, dtype=torch.float64)
    for e in range(E):
        f[e] = (top_i == e).any(-1).double().mean()
    aux = 0.001 * E * float((f * p.double().mean(0)).sum())
    return y, aux, top_i


def weights(n, d, E, F, seed, dtype=np.float32):
    g = np.random.default_rng(seed)
    x = g.standard_normal((n, d)).astype(dtype)
    router = (g.standard_normal((E, d)) / np.sqrt(d)).astype(dtype)
    w1 = (g.standard_normal((E, F, d)) / np.sqrt(d)).astype(dtype)
    w3 = (g.standard_normal((E, F, d)) / np.sqrt(d)).astype(dtype)
    w2 = (g.standard_normal((E, d, F)) / np.sqrt(F)).astype(dtype)
    return x, router, w1, w2, w3


@pytest.mark.parametrize("n,d,E,F,k", [(37, 23, 5, 19, 2), (64, 32, 8, 48, 2), (9, 16, 4, 7, 1), (20, 12, 3, 10, 3)])
def test_matches_torch(n, d, E, F, k):
    x, router, w1, w2, w3 = weights(n, d, E, F, n + E)
    y, aux = attn.moe_feed_forward(x, router, w1, w2, w3, top_k=k)
    ty, taux, ti = torch_moe(*(torch.from_numpy(a) for a in (x, router, w1, w2, w3)), k)
    np.testing.assert_allclose(y, ty.numpy(), rtol=1e-4, atol=1e-5)
    assert aux == pytest.approx(taux, rel=1e-5)
    # float64 (the reference) against torch in float64
    y64, aux64 = attn.moe_feed_forward(*(a.astype(np.float64) for a in (x, router, w1, w2, w3)), top_k=k)
    ty64, taux64, _ = torch_moe(*(torch.from_numpy(a.astype(np.float64)) for a in (x, router, w1, w2, w3)), k)
    np.testing.assert_allclose(y64, ty64.numpy(), rtol=1e-10, atol=1e-12)
    assert aux64 == pytest.approx(taux64, rel=1e-9)


def test_torch_in_torch_out_and_routing():
    x, router, w1, w2, w3 = weights(30, 16, 6, 20, 1)
    y, aux, ids, w = attn.moe_feed_forward(torch.from_numpy(x), router, w1, w2, w3, top_k=2, return_routing=True)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32 and y.shape == (30, 16)
    np.testing.assert_allclose(w.sum(1), 1.0, rtol=1e-6)
    _, _, ti = torch_moe(*(torch.from_numpy(a) for a in (x, router, w1, w2, w3)), 2)
    np.testing.assert_array_equal(ids, ti.numpy())
    y1, _ = attn.moe_feed_forward(x, router, w1, w2, w3, top_k=2, threads=1)
    np.testing.assert_array_equal(y.numpy(), y1)  # threads change no bit


def test_identical_experts_and_uniform_aux():
    x, router, w1, w2, w3 = weights(24, 8, 4, 10, 2)
    w1[:], w2[:], w3[:] = w1[0], w2[0], w3[0]
    y, _ = attn.moe_feed_forward(x, router, w1, w2, w3, top_k=2)
    one, _ = attn.moe_feed_forward(x, router[:1], w1[:1], w2[:1], w3[:1], top_k=1)
    np.testing.assert_allclose(y, one, rtol=1e-5, atol=1e-6)
    for k in (1, 2, 3):
        _, aux = attn.moe_feed_forward(x, np.zeros_like(router), w1, w2, w3, top_k=k)
        assert aux / 0.001 == pytest.approx(k, rel=1e-6)


def test_bad_input():
    x, router, w1, w2, w3 = weights(5, 8, 3, 6, 3)
    with pytest.raises(ValueError, match=r"top_k must be in \[1, experts = 3\], got 4"):
        attn.moe_feed_forward(x, router, w1, w2, w3, top_k=4)
    with pytest.raises(ValueError, match=r"top_k must be in \[1, experts = 3\], got 0"):
        attn.moe_feed_forward(x, router, w1, w2, w3, top_k=0)
    with pytest.raises(ValueError, match=r"router must have shape \(E, d\) = \(E, 8\), got \(3, 7\)"):
        attn.moe_feed_forward(x, router[:, :7], w1, w2, w3)
    with pytest.raises(ValueError, match=r"w2 must have shape"):
        attn.moe_feed_forward(x, router, w1, w2[:, :, :5], w3)
    with pytest.raises(ValueError, match=r"w3 must have shape"):
        attn.moe_feed_forward(x, router, w1, w2, w3[:2])
    with pytest.raises(TypeError, match="x must be float32 or float64"):
        attn.moe_feed_forward(x.astype(np.int32), router, w1, w2, w3)


def test_minimax_decoder_config_prefill_and_decode():
    config = {"vocab_size": 50, "dim": 32, "hidden_dim": 24, "heads": 2, "kv_heads": 1, "head_dim": 16,
              "max_seq_len": 32, "layers": attn.Decoder.hybrid_layers(8, "7:1"),
              "architecture": "minimax", "moe_experts": 4, "moe_top_k": 2}
    model = attn.Decoder.random(config, seed=2)
    assert model.config["architecture"] == "minimax" and model.config["moe_experts"] == 4
    tokens = [3, 14, 15, 9, 26, 5]
    full = model.forward(tokens, 0)
    model.reset()
    steps = np.concatenate([model.forward([t]) for t in tokens])
    np.testing.assert_allclose(steps, full, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match=r"moe_top_k must be in \[1, moe_experts = 4\], got 5"):
        attn.Decoder.random({**config, "moe_top_k": 5})
