"""Gradients of two model-level blocks (issue 56): the MoE feed-forward and Titans' memory.

Each against torch autograd of a plain torch implementation written here, in float64 (Titans: the
inner gradient taken with create_graph=True, so autograd differentiates through the memory's own
gradient steps, second-order terms included); float32 against that within 3x a plain float32 torch
implementation's error plus a floor; torch.library.opcheck on every op; torch.compile(fullgraph=True)
forward and backward."""
import numpy as np
import pytest
import torch

import attn
from attn.blocks import titans_init, titans_memory, titans_read
import attn.blocks.titans_torch  # noqa: F401  (registers torch.ops.attn.titans_memory*)
import attn.llm.moe_torch  # noqa: F401  (registers torch.ops.attn.moe_feed_forward*)

# ---- MoE ------------------------------------------------------------------------------------------


def torch_moe(x, router, w1, w2, w3, top_k):
    """MiniMax-01's MoE in torch: softmax router, top-k (indices: constants), renormalised, SwiGLU
    experts; aux = 0.001 E sum_e f_e P_e with f counted (constant) and P the mean probability."""
    p = torch.softmax(x @ router.T, dim=-1)
    top_p, top_i = torch.topk(p, top_k, dim=-1)
    w = top_p / top_p.sum(-1, keepdim=True)
    y = torch.zeros_like(x)
    E = router.shape[0]
    for e in range(E):
        token, slot = torch.where(top_i == e)
        if token.numel() == 0:
            continue
        h = x[token]
        out = (torch.nn.functional.silu(h @ w1[e].T) * (h @ w3[e].T)) @ w2[e].T
        y = y.index_add(0, token, out * w[token, slot, None])
    f = torch.stack([(top_i == e).any(-1).to(x.dtype).mean() for e in range(E)])
    aux = 0.001 * E * (f * p.mean(0)).sum()
    return y, aux


def moe_inputs(n, d, E, F, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64)
    router = torch.randn(E, d, generator=g, dtype=torch.float64) / d ** 0.5
    w1 = torch.randn(E, F, d, generator=g, dtype=torch.float64) / d ** 0.5
    w3 = torch.randn(E, F, d, generator=g, dtype=torch.float64) / d ** 0.5
    w2 = torch.randn(E, d, F, generator=g, dtype=torch.float64) / F ** 0.5
    dy = torch.randn(n, d, generator=g, dtype=torch.float64)
    return [t.to(dtype).requires_grad_() for t in (x, router, w1, w2, w3)], dy


def moe_grads(fn, ts, dy, k, aux_weight=50.0):
    for t in ts:
        t.grad = None
    y, aux = fn(*ts, k)
    ((y * dy.to(y.dtype)).sum() + aux_weight * aux).backward()
    return [t.grad.double().clone() for t in ts]


@pytest.mark.parametrize("n,d,E,F,k", [(37, 23, 5, 19, 2), (9, 16, 4, 7, 1), (20, 12, 3, 10, 3), (70, 8, 6, 33, 2)])
def test_moe_gradients_match_torch_autograd(n, d, E, F, k):
    ts, dy = moe_inputs(n, d, E, F, n + E)
    want = moe_grads(torch_moe, ts, dy, k)
    got = moe_grads(lambda *a: attn.moe_feed_forward(*a[:5], top_k=a[5]), ts, dy, k)  # float64: the reference
    for name, g, w in zip(("x", "router", "w1", "w2", "w3"), got, want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=lambda m: f"d{name}: {m}")
    # float32: the gathered form, within 3x plain float32 torch's error + 1e-5 of max(1, magnitude)
    ts32, _ = moe_inputs(n, d, E, F, n + E, torch.float32)
    got32 = moe_grads(lambda *a: attn.moe_feed_forward(*a[:5], top_k=a[5]), ts32, dy, k)
    plain32 = moe_grads(torch_moe, ts32, dy, k)
    for name, g, p, w in zip(("x", "router", "w1", "w2", "w3"), got32, plain32, want):
        err, plain_err = (g - w).abs().max().item(), (p - w).abs().max().item()
        assert err <= 3 * plain_err + 1e-5 * max(1.0, w.abs().max().item()), \
            f"d{name}: {err} vs plain float32 {plain_err}"


def test_moe_aux_is_a_tensor_and_trains_the_router_alone():
    ts, _ = moe_inputs(16, 8, 4, 6, 3)
    x, router = ts[0].detach(), ts[1]
    y, aux = attn.moe_feed_forward(x, router, *(t.detach() for t in ts[2:]), top_k=2)
    assert isinstance(aux, torch.Tensor) and aux.ndim == 0 and y.requires_grad
    aux.backward()
    r2 = ts[1].detach().clone().requires_grad_()
    _, want = torch_moe(x, r2, *(t.detach() for t in ts[2:]), 2)
    want.backward()
    torch.testing.assert_close(router.grad, r2.grad, rtol=1e-10, atol=1e-15)
    assert router.grad.abs().max() > 0


def test_moe_numpy_weights_are_constants_and_routing_is_returned():
    ts, dy = moe_inputs(12, 8, 4, 6, 5, torch.float32)
    x = ts[0]
    y, aux, ids, w = attn.moe_feed_forward(x, *(t.detach().numpy() for t in ts[1:]), top_k=2, return_routing=True)
    (y * dy.float()).sum().backward()
    assert x.grad is not None and ids.shape == (12, 2)
    np.testing.assert_allclose(w.sum(1), 1.0, rtol=1e-6)


def test_moe_threads_change_no_bit_of_the_gradients():
    ts, dy = moe_inputs(50, 24, 5, 40, 7, torch.float32)
    one = moe_grads(lambda *a: attn.moe_feed_forward(*a[:5], top_k=a[5], threads=1), ts, dy, 2)
    three = moe_grads(lambda *a: attn.moe_feed_forward(*a[:5], top_k=a[5], threads=3), ts, dy, 2)
    for a, b in zip(one, three):
        assert torch.equal(a, b)


def test_moe_bad_input_in_the_differentiable_path():
    ts, _ = moe_inputs(5, 8, 3, 6, 1)
    with pytest.raises(ValueError, match=r"top_k must be in \[1, experts = 3\], got 4"):
        attn.moe_feed_forward(*ts, top_k=4)
    with pytest.raises(ValueError, match=r"w2 must have shape \(E, d, d_ff\) = \(3, 8, 6\), got \(3, 6, 8\)"):
        attn.moe_feed_forward(ts[0], ts[1], ts[2], ts[2], ts[4], top_k=2)


def test_moe_opcheck():
    for dtype in (torch.float32, torch.float64):
        ts, dy = moe_inputs(21, 8, 4, 9, 2, dtype)
        args = tuple(t.detach() for t in ts)
        torch.library.opcheck(torch.ops.attn.moe_feed_forward.default, args + (2, 0))
        torch.library.opcheck(torch.ops.attn.moe_feed_forward_backward.default,
                              (dy.to(dtype), torch.tensor(0.5, dtype=dtype)) + args + (2, 0))


def test_moe_torch_compile_fullgraph_forward_and_backward():
    ts, dy = moe_inputs(30, 12, 4, 20, 9, torch.float32)

    def loss(x, router, w1, w2, w3):
        y, aux = torch.ops.attn.moe_feed_forward(x, router, w1, w2, w3, 2)
        return (y * dy.float()).sum() + aux

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    got = compiled(*ts)
    got.backward()
    grads = [t.grad.clone() for t in ts]
    for t in ts:
        t.grad = None
    want = loss(*ts)
    want.backward()
    assert torch.equal(got, want)
    for g, t in zip(grads, ts):
        assert torch.equal(g, t.grad)


# ---- Titans ---------------------------------------------------------------------------------------


def torch_titans(q, k, v, theta, eta, alpha, w0, s0, memory, batch_size, loss):
    """The update rule in torch, differentiable end to end: each token's inner gradient at its
    mini-batch's snapshot with create_graph=True. q, k, v (B, H, N, d); gates (B, H, N); w0, s0
    dicts of (H, ...) (s0 None: zeros). Returns y and the final weights and momentum (dicts of
    (B, H, ...))."""
    B, H, N, d = q.shape

    def apply(w, x):
        if memory == "linear":
            return w["W"] @ x
        return w["W2"] @ torch.nn.functional.gelu(w["W1"] @ x)

    ys, finals, moms = [], {n: [] for n in w0}, {n: [] for n in w0}
    for b in range(B):
        for h in range(H):
            m = {n: w[h] for n, w in w0.items()}
            s = {n: (s0[n][h] if s0 is not None else torch.zeros_like(w[h])) for n, w in w0.items()}
            for t in range(N):
                if t % batch_size == 0:
                    snap = m
                e = apply(snap, k[b, h, t]) - v[b, h, t]
                l = (e * e).sum() / (d if loss == "mean" else 1)
                grads = torch.autograd.grad(l, list(snap.values()), create_graph=True)
                s = {n: eta[b, h, t] * s[n] - theta[b, h, t] * g for n, g in zip(snap, grads)}
                m = {n: (1 - alpha[b, h, t]) * m[n] + s[n] for n in m}
                ys.append(apply(m, q[b, h, t]))
            for n in m:
                finals[n].append(m[n])
                moms[n].append(s[n])
    y = torch.stack(ys).reshape(B, H, N, d)
    fin = {n: torch.stack(x).reshape(B, H, *x[0].shape) for n, x in finals.items()}
    mom = {n: torch.stack(x).reshape(B, H, *x[0].shape) for n, x in moms.items()}
    return y, fin, mom


def titans_inputs(B, H, N, d, memory, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype).requires_grad_()

    def u(lo, hi):
        return (lo + (hi - lo) * torch.rand(B, H, N, generator=g, dtype=torch.float64)).to(dtype).requires_grad_()

    q, k, v = r(B, H, N, d, scale=d ** -0.5), r(B, H, N, d, scale=d ** -0.5), r(B, H, N, d)
    theta, eta, alpha = u(0.05, 0.25), u(0.3, 0.9), u(0.05, 0.25)
    shapes = {"W": (d, d)} if memory == "linear" else {"W1": (4 * d, d), "W2": (d, 4 * d)}
    w0 = {n: r(H, *s, scale=s[1] ** -0.5) for n, s in shapes.items()}
    s0 = {n: r(H, *s, scale=0.3 * s[1] ** -0.5) for n, s in shapes.items()}
    return (q, k, v, theta, eta, alpha), w0, s0


def titans_grads(fn, xs, w0, s0, memory, b, loss, seed):
    leaves = list(xs) + list(w0.values()) + list(s0.values())
    for t in leaves:
        t.grad = None
    y, fin, mom = fn(*xs, w0, s0, memory, b, loss)
    g = torch.Generator().manual_seed(seed)
    obj = (y * torch.randn(y.shape, generator=g, dtype=torch.float64).to(y.dtype)).sum()
    for n in fin:  # the final weights and momentum carry gradients too
        obj = obj + (fin[n] * torch.randn(fin[n].shape, generator=g, dtype=torch.float64).to(y.dtype)).sum()
        obj = obj + 0.5 * (mom[n] * torch.randn(mom[n].shape, generator=g, dtype=torch.float64).to(y.dtype)).sum()
    obj.backward()
    return [t.grad.double().clone() for t in leaves]


def ours(q, k, v, theta, eta, alpha, w0, s0, memory, b, loss):
    return titans_memory(q, k, v, theta, eta, alpha, memory, w0, b, loss, s0=s0, return_momentum=True)


NAMES = ["q", "k", "v", "theta", "eta", "alpha", "w0", "w0'", "s0", "s0'"]


@pytest.mark.parametrize("memory,B,H,N,d,b,loss", [("linear", 2, 2, 9, 5, 1, "sum"), ("linear", 1, 3, 11, 4, 4, "mean"),
                                                     ("mlp", 1, 2, 7, 3, 3, "sum"), ("mlp", 2, 1, 6, 2, 16, "mean")])
def test_titans_gradients_match_torch_autograd_through_the_inner_steps(memory, B, H, N, d, b, loss):
    xs, w0, s0 = titans_inputs(B, H, N, d, memory, 7 + N)
    want = titans_grads(torch_titans, xs, w0, s0, memory, b, loss, 1)
    got = titans_grads(ours, xs, w0, s0, memory, b, loss, 1)  # float64: the reference
    for name, g, w in zip(NAMES, got, want):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-11, msg=lambda m: f"d{name}: {m}")
        assert w.abs().max() > 0, name
    # float32 against float64 autograd: within 3x plain float32 torch's error + 1e-5 of the magnitude
    xs32, w32, s32 = titans_inputs(B, H, N, d, memory, 7 + N, torch.float32)
    got32 = titans_grads(ours, xs32, w32, s32, memory, b, loss, 1)
    plain32 = titans_grads(torch_titans, xs32, w32, s32, memory, b, loss, 1)
    for name, g, p, w in zip(NAMES, got32, plain32, want):
        err, plain_err = (g - w).abs().max().item(), (p - w).abs().max().item()
        assert err <= 3 * plain_err + 1e-5 * w.abs().max().item(), f"d{name}: {err} vs plain float32 {plain_err}"


def test_titans_numbers_as_gates_and_shared_weights_get_summed_gradients():
    (q, k, v, *_), _, _ = titans_inputs(2, 2, 6, 3, "linear", 3)
    W = (torch.randn(3, 3, dtype=torch.float64) / 3).requires_grad_()  # shared by all four sequences
    theta = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)  # one number for every token
    y, w = titans_memory(q, k, v, theta, 0.8, 0.1, "linear", {"W": W}, batch_size=2)
    (y.square().sum() + w["W"].sum()).backward()
    W2 = W.detach().clone().requires_grad_()
    th2 = theta.detach().clone().requires_grad_()
    full = [torch.broadcast_to(x, (2, 2, 6)) for x in (th2, torch.tensor(0.8, dtype=torch.float64),
                                                      torch.tensor(0.1, dtype=torch.float64))]
    yw, fin, _ = torch_titans(q, k, v, *full, {"W": W2.expand(2, 3, 3)}, None, "linear", 2, "sum")
    (yw.square().sum() + fin["W"].sum()).backward()
    torch.testing.assert_close(W.grad, W2.grad, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(theta.grad, th2.grad, rtol=1e-9, atol=1e-12)


def test_titans_read_is_differentiable_in_q_and_the_weights():
    w = {n: torch.from_numpy(a).double().requires_grad_() for n, a in titans_init(4, "mlp", heads=2, seed=3).items()}
    q = torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True)
    titans_read(w, q, "mlp").sum().backward()
    w2 = {n: a.detach().clone().requires_grad_() for n, a in w.items()}
    q2 = q.detach().clone().requires_grad_()
    want = torch.stack([torch.stack([w2["W2"][h] @ torch.nn.functional.gelu(w2["W1"][h] @ q2[0, h, t])
                                     for t in range(5)]) for h in range(2)])[None]
    want.sum().backward()
    torch.testing.assert_close(q.grad, q2.grad, rtol=1e-10, atol=1e-12)
    for n in w:
        torch.testing.assert_close(w[n].grad, w2[n].grad, rtol=1e-10, atol=1e-12)


def test_titans_threads_change_no_bit_of_the_gradients():
    xs, w0, s0 = titans_inputs(2, 3, 20, 6, "mlp", 5, torch.float32)

    def run(threads):
        def fn(q, k, v, theta, eta, alpha, w0, s0, memory, b, loss):
            return titans_memory(q, k, v, theta, eta, alpha, memory, w0, b, loss, s0=s0, return_momentum=True,
                                 threads=threads)
        return titans_grads(fn, xs, w0, s0, "mlp", 8, "sum", 2)

    for a, b in zip(run(1), run(3)):
        assert torch.equal(a, b)


def test_titans_bad_gate_is_named_in_the_differentiable_path():
    (q, k, v, theta, eta, alpha), w0, _ = titans_inputs(1, 1, 4, 2, "linear", 1)
    with pytest.raises(ValueError, match=r"eta\[b=0, h=0, t=0\] = 1.500000 must be in \[0, 1\]"):
        titans_memory(q, k, v, theta, torch.full((1, 1, 4), 1.5, dtype=torch.float64), alpha, "linear", w0)
    with pytest.raises(ValueError, match=r"theta must have shape \(B, H, N\) = \(1, 1, 4\)"):
        titans_memory(q, k, v, torch.zeros(3, dtype=torch.float64), eta, alpha, "linear", w0)


def _flat(w0, s0, memory):
    names = ["W"] if memory == "linear" else ["W1", "W2"]
    return (torch.cat([w0[n].detach().reshape(w0[n].shape[0], -1) for n in names], 1),
            torch.cat([s0[n].detach().reshape(s0[n].shape[0], -1) for n in names], 1))


@pytest.mark.parametrize("memory", ["linear", "mlp"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_titans_opcheck(memory, dtype):
    xs, w0, s0 = titans_inputs(2, 2, 7, 3, memory, 4, dtype)
    args = tuple(x.detach().contiguous() for x in xs)
    fw, fs = _flat(w0, s0, memory)
    torch.library.opcheck(torch.ops.attn.titans_memory.default, args + (fw, fs, memory, "sum", 3, 0))
    if memory == "linear":  # no M_0, S_0: zeros
        torch.library.opcheck(torch.ops.attn.titans_memory.default, args + (None, None, memory, "mean", 2, 0))
    y, w, s = torch.ops.attn.titans_memory(*args, fw, fs, memory, "sum", 3)
    torch.library.opcheck(torch.ops.attn.titans_memory_backward.default,
                          (torch.randn_like(y), torch.randn_like(w), torch.randn_like(s)) + args
                          + (fw, fs, memory, "sum", 3, 0))


def test_titans_torch_compile_fullgraph_forward_and_backward():
    xs, w0, s0 = titans_inputs(1, 2, 10, 4, "mlp", 6, torch.float32)
    fw, fs = _flat(w0, s0, "mlp")
    fw.requires_grad_()

    def loss(q, k, v, theta, eta, alpha, fw):
        y, w, s = torch.ops.attn.titans_memory(q, k, v, theta, eta, alpha, fw, None, "mlp", "sum", 4)
        return y.square().sum() + w.sum()

    leaves = list(xs) + [fw]
    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    got = compiled(*leaves)
    got.backward()
    grads = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    want = loss(*leaves)
    want.backward()
    assert torch.equal(got, want)
    for g, t in zip(grads, leaves):
        assert torch.equal(g, t.grad)
