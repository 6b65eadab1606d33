"""attn.titans_memory (Titans, Behrouz et al. 2024) against a torch token loop whose gradients
come from autograd."""
import numpy as np
import pytest
import torch

import attn


def torch_titans(q, k, v, theta, eta, alpha, w0, memory, batch_size, loss):
    """The update rule written plainly: autograd takes each token's gradient at the state saved
    at its mini-batch's start. q, k, v (B, H, N, d) float64 tensors; w0 a dict of (H, ...)."""
    B, H, N, d = q.shape
    ys = torch.zeros_like(q)
    finals = {name: torch.zeros((B, H) + w.shape[1:], dtype=q.dtype) for name, w in w0.items()}

    def apply(w, x):
        if memory == "linear":
            return w["W"] @ x
        return w["W2"] @ torch.nn.functional.gelu(w["W1"] @ x)  # exact (erf) gelu

    for b in range(B):
        for h in range(H):
            m = {name: w[h].clone() for name, w in w0.items()}
            s = {name: torch.zeros_like(w) for name, w in m.items()}
            for t in range(N):
                if t % batch_size == 0:
                    snap = {name: w.clone().requires_grad_(True) for name, w in m.items()}
                e = apply(snap, k[b, h, t]) - v[b, h, t]
                l = (e * e).sum() / (d if loss == "mean" else 1)
                grads = torch.autograd.grad(l, list(snap.values()))
                for (name, _), g in zip(snap.items(), grads):
                    s[name] = eta[b, h, t] * s[name] - theta[b, h, t] * g
                    m[name] = (1 - alpha[b, h, t]) * m[name] + s[name]
                ys[b, h, t] = apply(m, q[b, h, t])
            for name in m:
                finals[name][b, h] = m[name]
    return ys, finals


def case(memory, B=1, H=2, N=11, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(B, H, N, d, generator=g, dtype=torch.float64), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, H, N, d, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(B, H, N, d, generator=g, dtype=torch.float64)
    theta = 0.2 * torch.rand(B, H, N, generator=g, dtype=torch.float64)
    eta = 0.5 + 0.5 * torch.rand(B, H, N, generator=g, dtype=torch.float64)
    alpha = 0.1 * torch.rand(B, H, N, generator=g, dtype=torch.float64)
    w0 = {name: torch.from_numpy(a).double() for name, a in attn.titans_init(d, memory, heads=H, seed=seed).items()}
    if memory == "linear":
        w0["W"] = torch.randn(H, d, d, generator=g, dtype=torch.float64) / d**0.5
    return q, k, v, theta, eta, alpha, w0


@pytest.mark.parametrize("memory", ["linear", "mlp"])
@pytest.mark.parametrize("batch_size,loss", [(1, "sum"), (4, "mean"), (16, "sum")])
def test_matches_torch_autograd_loop(memory, batch_size, loss):
    q, k, v, theta, eta, alpha, w0 = case(memory)
    y_ref, w_ref = torch_titans(q, k, v, theta, eta, alpha, w0, memory, batch_size, loss)
    # float64: attn's reference token loop, closed-form gradients
    y, w = attn.titans_memory(q, k, v, theta, eta, alpha, memory, w0, batch_size, loss)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float64
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-10)
    for name in w_ref:
        torch.testing.assert_close(w[name], w_ref[name], rtol=1e-10, atol=1e-10)
    # float32: the fast mini-batch form (N = 11 is not a multiple of 4 or 16)
    f32 = [x.float() for x in (q, k, v, theta, eta, alpha)]
    y32, w32 = attn.titans_memory(*f32, memory, {n: x.float() for n, x in w0.items()}, batch_size, loss)
    assert y32.dtype == torch.float32
    torch.testing.assert_close(y32.double(), y_ref, rtol=2e-5, atol=2e-5)
    for name in w_ref:
        torch.testing.assert_close(w32[name].double(), w_ref[name], rtol=2e-5, atol=2e-5)


def test_numpy_in_numpy_out_and_worked_case():
    # linear, W_0 = 0, ||k|| = 1, theta = 1/2, eta = alpha = 0: one step gives M(k) = v
    k = np.array([0.6, 0.0, 0.8], dtype=np.float32).reshape(1, 1, 1, 3)
    v = np.array([1.5, -2.0, 0.25], dtype=np.float32).reshape(1, 1, 1, 3)
    y, w, s = attn.titans_memory(k, k, v, 0.5, 0.0, 0.0, return_momentum=True)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == (1, 1, 1, 3)
    np.testing.assert_allclose(y[0, 0, 0], v[0, 0, 0], atol=1e-6)
    np.testing.assert_allclose(w["W"][0, 0], np.outer(v[0, 0, 0], k[0, 0, 0]), atol=1e-6)
    np.testing.assert_allclose(s["W"], w["W"], atol=1e-7)  # alpha = 0, W_0 = 0: M_1 = S_1


def test_alpha_one_keeps_only_the_momentum():
    q, k, v, theta, eta, alpha, w0 = case("mlp", N=9)
    y, w, s = attn.titans_memory(q.numpy(), k.numpy(), v.numpy(), theta.numpy(), eta.numpy(), 1.0, "mlp",
                                 {n: x.numpy() for n, x in w0.items()}, return_momentum=True)
    for name in w:
        np.testing.assert_array_equal(w[name], s[name])


def test_bad_input_names_the_argument():
    q = np.zeros((1, 2, 5, 4), dtype=np.float32)
    with pytest.raises(ValueError, match=r"theta\[b=0, h=1, t=2\] = -1.000000 must be >= 0"):
        th = np.full((1, 2, 5), 0.1, dtype=np.float32)
        th[0, 1, 2] = -1
        attn.titans_memory(q, q, q, th, 0.5, 0.1)
    with pytest.raises(ValueError, match=r"eta\[b=0, h=0, t=0\] = 1.500000 must be in \[0, 1\]"):
        attn.titans_memory(q, q, q, 0.1, 1.5, 0.1)
    with pytest.raises(ValueError, match=r"alpha\[b=0, h=0, t=0\] = -0.200000 must be in \[0, 1\]"):
        attn.titans_memory(q, q, q, 0.1, 0.5, -0.2)
    with pytest.raises(ValueError, match=r"k must have q's shape \(B, H, N, d\) = \(1, 2, 5, 4\), got \(1, 2, 4, 4\)"):
        attn.titans_memory(q, q[:, :, :4], q, 0.1, 0.5, 0.1)
    with pytest.raises(ValueError, match=r"eta must have shape \(B, H, N\) = \(1, 2, 5\)"):
        attn.titans_memory(q, q, q, 0.1, np.zeros(3), 0.1)
    with pytest.raises(ValueError, match=r"w0\['W1'\] must have shape \(16, 4\)"):
        attn.titans_memory(q, q, q, 0.1, 0.5, 0.1, "mlp", {"W1": np.zeros((4, 4)), "W2": np.zeros((4, 16))})
    with pytest.raises(ValueError, match="memory must be 'linear' or 'mlp', got 'deep'"):
        attn.titans_memory(q, q, q, 0.1, 0.5, 0.1, "deep")
    with pytest.raises(ValueError, match=r"batch_size must be in \[1, "):
        attn.titans_memory(q, q, q, 0.1, 0.5, 0.1, batch_size=0)


def softmax_attention(q, k, v, visible, scale):
    """q (B, H, N, d), k, v (B, H, M, d), visible (N, M) bool: plain float64 softmax attention."""
    s = np.einsum("bhnd,bhmd->bhnm", q.astype(np.float64), k.astype(np.float64)) * scale
    s = np.where(visible, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhnm,bhmd->bhnd", p / p.sum(-1, keepdims=True), v.astype(np.float64))


def window_visible(n, window, np_):
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    return np.concatenate([np.ones((n, np_), dtype=bool), (j <= i) & (j >= i - window)], axis=1)


def layer_case(B=1, H=2, N=13, d=8, Np=2, seed=3):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((B, H, N, d)).astype(np.float32) for _ in range(3))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    pk, pv = (rng.standard_normal((H, Np, d)).astype(np.float32) for _ in range(2))
    gates = (0.3 * rng.random((B, H, N)), 0.5 + 0.5 * rng.random((B, H, N)), 0.1 * rng.random((B, H, N)))
    return q, k, v, [g.astype(np.float32) for g in gates], pk, pv


def test_mag_is_window_attention_gated_by_the_memory():
    q, k, v, gates, pk, pv = layer_case()
    o, w = attn.titans_mag(q, k, v, *gates, window=3, persistent=(pk, pv), memory="mlp", batch_size=4)
    m, w_ref = attn.titans_memory(q, k, v, *gates, "mlp", batch_size=4)
    kk = np.concatenate([np.broadcast_to(pk, (1,) + pk.shape), k], axis=2)
    vv = np.concatenate([np.broadcast_to(pv, (1,) + pv.shape), v], axis=2)
    y = softmax_attention(q, kk, vv, window_visible(13, 3, 2), 8**-0.5)
    np.testing.assert_allclose(o, y / (1 + np.exp(-m)), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(w["W1"], w_ref["W1"])


def test_mal_is_window_attention_over_the_memory_reads():
    q, k, v, gates, pk, pv = layer_case(seed=4)
    rng = np.random.default_rng(0)
    proj = [(rng.standard_normal((8, 8)) / 3).astype(np.float32) for _ in range(3)]
    o, _ = attn.titans_mal(q, k, v, *gates, window=4, persistent=(pk, pv), proj=proj)
    h, _ = attn.titans_memory(q, k, v, *gates)
    hq, hk, hv = (h.astype(np.float64) @ p.T.astype(np.float64) for p in proj)
    kk = np.concatenate([np.broadcast_to(pk, (1,) + pk.shape), hk], axis=2)
    vv = np.concatenate([np.broadcast_to(pv, (1,) + pv.shape), hv], axis=2)
    np.testing.assert_allclose(o, softmax_attention(hq, kk, vv, window_visible(13, 4, 2), 8**-0.5),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("store", ["y", "kv"])
def test_mac_segments_against_a_plain_loop(store):
    q, k, v, gates, pk, pv = layer_case(N=11, seed=5)
    o, w = attn.titans_mac(q, k, v, *gates, segment=4, persistent=(pk, pv), store=store, batch_size=2)
    # the same in float64 with attn's reference memory and plain attention
    W = np.zeros((1, 2, 8, 8))
    S = np.zeros_like(W)
    out = np.zeros(q.shape)
    for t0 in range(0, 11, 4):
        sl = slice(t0, min(11, t0 + 4))
        qs, ks, vs = (x[:, :, sl].astype(np.float64) for x in (q, k, v))
        c = qs.shape[2]
        h = np.einsum("bhod,bhnd->bhno", W, qs)  # M_prev(q)
        causal = np.tril(np.ones((c, c), dtype=bool))
        visible = np.concatenate([np.ones((c, 2), dtype=bool), causal, causal], axis=1)
        kk = np.concatenate([np.broadcast_to(pk, (1,) + pk.shape), qs, ks], axis=2)
        vv = np.concatenate([np.broadcast_to(pv, (1,) + pv.shape), h, vs], axis=2)
        y = softmax_attention(qs, kk, vv, visible, 8**-0.5)
        m, ws, ss = attn.titans_memory(y, ks, y if store == "y" else vs,
                                       *(g[:, :, sl].astype(np.float64) for g in gates), "linear", {"W": W}, 2,
                                       s0={"W": S}, return_momentum=True)
        W, S = ws["W"], ss["W"]
        out[:, :, sl] = y / (1 + np.exp(-m))
    np.testing.assert_allclose(o, out, rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(w["W"], W, rtol=2e-4, atol=2e-5)


def test_continuing_with_the_momentum_equals_one_call():
    q, k, v, theta, eta, alpha, w0 = case("mlp", N=12)
    args = [x.numpy() for x in (q, k, v, theta, eta, alpha)]
    w0 = {n: x.numpy() for n, x in w0.items()}
    y, w = attn.titans_memory(*args, "mlp", w0, 4)
    first = [x[:, :, :8] for x in args]
    second = [x[:, :, 8:] for x in args]
    y1, w1, s1 = attn.titans_memory(*first, "mlp", w0, 4, return_momentum=True)
    y2, w2 = attn.titans_memory(*second, "mlp", w1, 4, s0=s1)
    np.testing.assert_allclose(np.concatenate([y1, y2], axis=2), y, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(w2["W2"], w["W2"], rtol=1e-12, atol=1e-12)


def test_window_none_is_exact_causal_attention():
    q, k, v, gates, pk, pv = layer_case(seed=6)
    exact, _ = attn.titans_mag(q, k, v, *gates, persistent=(pk, pv))
    wide, _ = attn.titans_mag(q, k, v, *gates, window=13, persistent=(pk, pv))
    np.testing.assert_allclose(exact, wide, rtol=1e-6, atol=1e-7)
    m, _ = attn.titans_memory(q, k, v, *gates)
    kk = np.concatenate([np.broadcast_to(pk, (1,) + pk.shape), k], axis=2)
    vv = np.concatenate([np.broadcast_to(pv, (1,) + pv.shape), v], axis=2)
    y = softmax_attention(q, kk, vv, window_visible(13, 13, 2), 8**-0.5)
    np.testing.assert_allclose(exact, y / (1 + np.exp(-m)), rtol=1e-4, atol=1e-5)
    mal, _ = attn.titans_mal(q, k, v, *gates)
    assert mal.shape == q.shape
