"""LSH and efficient attention are differentiable: attn's float32 gradients against torch autograd of
a literal float64 implementation written here (LSH: the dense mask of its buckets' chunks, the
buckets held as constants; efficient: softmax over q's features times the per-feature softmax of
k over the sequence, its initial state as one more key), torch.library.opcheck of both custom ops,
and torch.compile(fullgraph=True) backward equal to eager (efficient attention's final state too,
through torch.ops.attn.linear_attention)."""
import numpy as np
import pytest
import torch

import attn
import attn.torch_ops  # noqa: F401  (registers torch.ops.attn.*)
from test_lsh_dca import lsh_mask


def qkv(seed, B=2, N=29, M=29, H=4, Hkv=2, D=12, Dv=7, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = scale * torch.randn(B, N, H, D, generator=g, dtype=torch.float64)
    k = scale * torch.randn(B, M, Hkv, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, M, Hkv, Dv, generator=g, dtype=torch.float64)
    dout = torch.randn(B, N, H, Dv, generator=g, dtype=torch.float64)
    return q, k, v, dout


def close(got, want, name, rel=1e-5):
    err = (got.double() - want).abs().max().item()
    assert err <= rel * max(1.0, want.abs().max().item()), (name, err)


# ---- LSH ---------------------------------------------------------------------------------------

def lsh_literal(q, k, v, mask, scale):
    """(out, lse) of softmax over the mask's keys (bnhd in and out), rows with no key: 0 and -inf."""
    tq, tk, tv = (x.transpose(1, 2) for x in (q, k, v))
    group = tq.shape[1] // tk.shape[1]
    tk, tv = tk.repeat_interleave(group, dim=1), tv.repeat_interleave(group, dim=1)
    seen = mask.any(dim=-1)
    # rows with no key get a stand-in score row of zeros: no NaN in autograd, out 0 and lse -inf after
    s = torch.where(mask, scale * tq @ tk.transpose(-1, -2), torch.where(seen[..., None], -torch.inf, 0.0))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]) * mask
    return (p @ tv).transpose(1, 2), torch.where(seen, lse, -torch.inf)


LSH = ["lsh:buckets=8,rounds=2,chunk=8,seed=1", "lsh:buckets=4,rounds=3,chunk=5,seed=2,causal",
       "lsh:buckets=6,rounds=3,chunk=5,seed=4,causal,shared_qk"]


@pytest.mark.parametrize("text", LSH)
@pytest.mark.parametrize("pad", [False, True])
def test_lsh_gradients_match_float64_autograd(text, pad):
    """dq, dk, dv through out and lse: attn.attend with torch tensors that require grad against
    autograd of the literal masked softmax (the mask from attn.lsh_buckets: constants)."""
    q, k, v, dout = qkv(21)
    shared = "shared_qk" in text
    n, m = q.shape[1], k.shape[1]
    lengths = [n, 17] if pad else [n, n]
    kw = dict(key_padding_lengths=lengths) if pad else {}
    qb, kb = attn.lsh_buckets(q.float().numpy(), k.float().numpy(), text, **kw)
    chunk = int(text.split("chunk=")[1].split(",")[0])
    mask = torch.from_numpy(lsh_mask(qb, kb, n, m, chunk, "causal" in text, shared, lengths))
    g = torch.Generator().manual_seed(22)
    dlse = torch.randn(q.shape[0], q.shape[2], n, generator=g, dtype=torch.float64)

    ref = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out, lse = lsh_literal(*ref, mask, q.shape[-1] ** -0.5)
    ((out * dout).sum() + (torch.where(torch.isfinite(lse), lse, 0) * dlse).sum()).backward()

    leaves = [x.float().detach().requires_grad_() for x in (q, k, v)]
    got_out, got_lse = attn.attend(*leaves, text, return_lse=True, **kw)
    close(got_out.detach(), out.detach(), "out")
    ((got_out * dout.float()).sum() + (torch.where(torch.isfinite(got_lse), got_lse, 0) * dlse.float()).sum()).backward()
    for name, a, b in zip(["dq", "dk", "dv"], leaves, ref):
        close(a.grad, b.grad, name)


def test_lsh_rotations_get_no_gradient():
    """The rotations only choose buckets (an argmax): asking for their gradient is named, not zero."""
    q, k, v, _ = qkv(23, H=2, Hkv=2, D=8)
    rot = torch.randn(2, 8, 4, requires_grad=True)
    out = attn.attend(*(x.float().requires_grad_() for x in (q, k, v)), "lsh:buckets=8,rounds=2,chunk=8",
                      params={"rotations": rot})
    with pytest.raises(ValueError, match=r"returns no gradient for params\['rotations'\]"):
        out.sum().backward()


def test_lsh_custom_ops_pass_opcheck_and_compile_fullgraph():
    q, k, v, dout = (x.float() for x in qkv(24, N=21, M=21))
    text = "lsh:buckets=4,rounds=2,chunk=4,seed=3,causal"
    args = (q, k, v, text, "bnhd", None, [], None)
    torch.library.opcheck(torch.ops.attn.attend.default, args)
    out, lse = torch.ops.attn.attend(*args)
    torch.library.opcheck(torch.ops.attn.attend_backward.default,
                          (dout, q, k, v, out, lse, text, "bnhd", None, [], None, torch.randn_like(lse)))

    def loss(q, k, v):
        o, l = attn.attend(q, k, v, text, return_lse=True)
        return (o ** 2).sum() + l.sum()

    grads = []
    for fn in (torch.compile(loss, fullgraph=True, backend="aot_eager"), loss):
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        fn(*leaves).backward()
        grads.append([x.grad for x in leaves])
    for a, b in zip(*grads):
        assert torch.equal(a, b)


# ---- efficient attention -----------------------------------------------------------------------

def efficient_literal(q, k, v, scale, causal, state=None, lengths=None):
    """o_i = sum_f a_if C_if, a_i = scale softmax(q_i), C_if = sum_j w_ijf v_j with w_i.f the softmax
    of k_jf over the keys of row i (valid ones; causal: j <= i) and the state's pseudo key (log
    weight log z0 + m0, value C0; none where z0 = 0). bnhd in and out."""
    B, N, H, D = q.shape
    M, Hkv, Dv = k.shape[1], k.shape[2], v.shape[-1]
    group = H // Hkv
    outs = []
    for b in range(B):
        L = M if lengths is None else lengths[b]
        tk = k[b, :L].repeat_interleave(group, dim=1).transpose(0, 1)  # (H, L, D)
        tv = v[b, :L].repeat_interleave(group, dim=1).transpose(0, 1)  # (H, L, Dv)
        a = scale * torch.softmax(q[b].transpose(0, 1), dim=-1)       # (H, N, D)
        logits = tk[:, None, :, :].expand(H, N, L, D)
        vals = tv[:, None, :, None, :].expand(H, N, L, D, Dv)
        if causal:
            allowed = torch.arange(L)[None, :] <= torch.arange(N)[:, None]  # (N, L)
            logits = logits.masked_fill(~allowed[None, :, :, None], -torch.inf)
        if state is not None:
            c0, z0, m0 = state[b, :, :, :Dv], state[b, :, :, Dv], state[b, :, :, Dv + 1]  # (H, D, Dv), (H, D)
            lw = torch.where(z0 > 0, torch.log(torch.where(z0 > 0, z0, 1.0)) + m0, -torch.inf)
            logits = torch.cat([lw[:, None, None, :].expand(H, N, 1, D), logits], dim=2)
            vals = torch.cat([c0[:, None, None].expand(H, N, 1, D, Dv), vals], dim=2)
        w = torch.softmax(logits, dim=2)
        w = torch.where(torch.isnan(w), torch.zeros_like(w), w)  # a row with no key: C = 0
        C = (w[..., None] * vals).sum(dim=2)  # (H, N, D, Dv)
        outs.append((a[..., None] * C).sum(dim=2).transpose(0, 1))
    return torch.stack(outs)


def random_state(seed, B, H, D, Dv):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(B, H, D, Dv + 2, generator=g, dtype=torch.float64)
    s[..., Dv] = 0.5 + torch.rand(B, H, D, generator=g, dtype=torch.float64)
    return s


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
def test_efficient_gradients_match_float64_autograd(causal, with_state):
    """dq, dk, dv (and the initial state's gradient) through attn.attend with torch tensors that
    require grad, against autograd of the literal formula; padded keys."""
    N, M = (23, 23) if causal else (23, 31)
    q, k, v, dout = qkv(31, N=N, M=M, scale=2.0)
    lengths = [M, 15]
    state = random_state(32, 2, 4, 12, 7) if with_state else None
    ref = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    ref_state = state.clone().requires_grad_() if with_state else None
    want = efficient_literal(*ref, 12 ** -0.5, causal, ref_state, lengths)
    (want * dout).sum().backward()

    text = "efficient:causal" if causal else "efficient"
    leaves = [x.float().detach().requires_grad_() for x in (q, k, v)]
    params = {"initial_state": state.float().requires_grad_()} if with_state else None
    got = attn.attend(*leaves, text, key_padding_lengths=lengths, params=params)
    close(got.detach(), want.detach(), "out")
    (got * dout.float()).sum().backward()
    for name, a, b in zip(["dq", "dk", "dv"], leaves, ref):
        close(a.grad, b.grad, name)
    if with_state:
        close(params["initial_state"].grad, ref_state.grad, "d_initial_state")


def test_efficient_numpy_backward_takes_dfinal_state():
    """attn.attend_backward (NumPy) with dfinal_state: the final state's C, z and m columns against
    float64 autograd (z = sum_j e^(k_j - m), m = max_j k_j, the forward's own definitions)."""
    q, k, v, dout = qkv(33, N=11, M=11, H=2, Hkv=2, D=6, Dv=5, scale=2.0)
    g = torch.Generator().manual_seed(34)
    dS = torch.randn(2, 2, 6, 7, generator=g, dtype=torch.float64)
    ref = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = efficient_literal(*ref, 6 ** -0.5, True)
    kk = ref[1].transpose(1, 2)  # (B, H, M, D)
    m = kk.max(dim=2).values
    z = torch.exp(kk - m[:, :, None]).sum(dim=2)
    w = torch.softmax(kk, dim=2)
    C = torch.einsum("bhmf,bhmc->bhfc", w, ref[2].transpose(1, 2))
    final = torch.cat([C, z[..., None], m[..., None]], dim=-1)
    ((out * dout).sum() + (final * dS).sum()).backward()

    args = [x.float().numpy() for x in (q, k, v)]
    o, state = attn.attend(*args, "efficient:causal", return_final_state=True)
    np.testing.assert_allclose(state, final.detach().numpy(), rtol=1e-5, atol=1e-5)
    grads = attn.attend_backward(dout.float().numpy(), *args, o, None, "efficient:causal",
                                 dfinal_state=dS.float().numpy())
    for name, a, b in zip(["dq", "dk", "dv"], grads[:3], ref):
        close(torch.from_numpy(np.asarray(a)), b.grad, name)

    # torch: the final state as an output that takes a gradient (torch.ops.attn.linear_attention), eager
    # and under torch.compile(fullgraph=True)
    def loss(q, k, v):
        o, st = attn.attend(q, k, v, "efficient:causal", return_final_state=True)
        return (o * dout.float()).sum() + (st * dS.float()).sum()

    for fn in (loss, torch.compile(loss, fullgraph=True, backend="aot_eager")):
        leaves = [x.float().detach().requires_grad_() for x in (q, k, v)]
        fn(*leaves).backward()
        for name, a, b in zip(["dq", "dk", "dv"], leaves, ref):
            close(a.grad, b.grad, name)


def test_efficient_custom_ops_pass_opcheck_and_compile_fullgraph():
    q, k, v, dout = (x.float() for x in qkv(35, N=17, M=17, scale=2.0))
    state = random_state(36, 2, 4, 12, 7).float()
    # efficient attention has no lse (attend's second output is NaN, which opcheck cannot compare):
    # its forward is checked through the op that returns (out, final_state), both backward ops too
    state_args = (q, k, v, "efficient:causal", "bnhd", state, None, [17, 9])
    torch.library.opcheck(torch.ops.attn.linear_attention.default, state_args)
    o, final = torch.ops.attn.linear_attention(*state_args)
    assert final.shape == (2, 4, 12, 9)
    torch.library.opcheck(torch.ops.attn.linear_attention_backward.default,
                          (torch.randn_like(o), torch.randn_like(final), q, k, v, o, "efficient:causal", "bnhd", state,
                           None, [17, 9]))
    args = (q, k, v, "efficient:causal", "bnhd", None, [], None, "initial_state", [state])
    out, lse = torch.ops.attn.attend(*args)
    torch.library.opcheck(torch.ops.attn.attend_backward.default,
                          (dout, q, k, v, out, lse, "efficient:causal", "bnhd", None, [], None, None, "initial_state",
                           [state]))
    dq, dk, dv, (ds0,) = torch.ops.attn.attend_backward(dout, q, k, v, out, lse, "efficient:causal", "bnhd", None, [],
                                                        None, None, "initial_state", [state])
    assert ds0.shape == state.shape

    def loss(q, k, v, s):
        return (attn.attend(q, k, v, "efficient:causal", params={"initial_state": s}) ** 2).sum()

    grads = []
    for fn in (torch.compile(loss, fullgraph=True, backend="aot_eager"), loss):
        leaves = [x.detach().requires_grad_() for x in (q, k, v, state)]
        fn(*leaves).backward()
        grads.append([x.grad for x in leaves])
    for a, b in zip(*grads):
        assert torch.equal(a, b)
