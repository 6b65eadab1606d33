"""The backward of Dual Chunk Attention and of qsoftmax from Python: torch tensors that require grad
through attn.attend (and attn.attend_backward for NumPy callers) against float64 torch autograd of a
plain torch implementation of each (no code shared with the kernels), the state's gradients of
qsoftmax (initial state in, final state out), torch.library.opcheck of the custom ops and a
torch.compile(fullgraph=True) backward."""
import numpy as np
import pytest
import torch

import attn
from attn import torch_ops  # noqa: F401  (registers torch.ops.attn.*)


# ---- plain torch implementations (bhnd, any float dtype) -------------------------------------------

def rotate(x, pos, theta, interleaved):
    """x (..., T, D) rotated by RoPE with token t at position pos[t] (every channel)."""
    D = x.shape[-1]
    half = D // 2
    inv = theta ** (-2.0 * torch.arange(half, dtype=torch.float64) / D)
    ang = pos.to(torch.float64)[:, None] * inv[None, :]
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    a, b = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., :half], x[..., half:])
    ra, rb = a * cos - b * sin, a * sin + b * cos
    return torch.stack([ra, rb], -1).flatten(-2) if interleaved else torch.cat([ra, rb], -1)


def literal_dca(q, k, v, chunk, local, theta=10000.0, interleaved=False, scale=None, kv_len=None):
    """out and lse of DCA written out: keys rotated at j mod chunk, the query rotated three ways (its
    position in its chunk against its own chunk, min(chunk + that, chunk + local - 1) against the one
    before, chunk + local - 1 against earlier ones), each pair's score from the rotation of its part,
    one causal (bottom-right) softmax over all keys."""
    B, H, N, D = q.shape
    M = k.shape[2]
    group = H // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scale = D ** -0.5 if scale is None else scale
    p = torch.arange(N) + (M - N)
    j = torch.arange(M)
    kr = rotate(k, j % chunk, theta, interleaved)
    inside = p % chunk
    positions = [inside, torch.minimum(chunk + inside, torch.full_like(inside, chunk + local - 1)),
                 torch.full_like(inside, chunk + local - 1)]
    scores = [scale * rotate(q, pos, theta, interleaved) @ kr.transpose(-1, -2) for pos in positions]
    lag = (p[:, None] // chunk - j[None, :] // chunk).clamp(min=0, max=2)
    s = torch.where(lag == 0, scores[0], torch.where(lag == 1, scores[1], scores[2]))
    lens = torch.tensor(kv_len if kv_len is not None else [M] * B)
    visible = (j[None, :] <= p[:, None])[None, None] & (j[None, None, None, :] < lens[:, None, None, None])
    s = s.masked_fill(~visible, float("-inf"))  # every row here sees key 0
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def literal_qsoftmax(q, k, v, causal=False, scale=1.0, initial_state=None, kv_len=None):
    """out and final state of o_i = scale softmax(q_i)^T (S0 + sum_(j seen) k_j v_j^T) through its
    quadratic weights w_ij = softmax(q_i) . k_j; final state S0 + sum over the valid keys."""
    B, H, N, D = q.shape
    M = k.shape[2]
    group = H // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    a = torch.softmax(q, -1)
    lens = torch.tensor(kv_len if kv_len is not None else [M] * B)
    valid = torch.arange(M)[None, :] < lens[:, None]  # (B, M)
    seen = valid[:, None, None, :]
    if causal:
        seen = seen & (torch.arange(M)[None, :] <= torch.arange(N)[:, None])[None, None]
    w = (a @ k.transpose(-1, -2)) * seen
    y = w @ v
    kv = (k * valid[:, None, :, None]).transpose(-1, -2) @ v
    if initial_state is not None:
        y = y + a @ initial_state.to(q.dtype)
        kv = kv + initial_state.to(q.dtype)
    return scale * y, kv


def tensors(seed, B=2, H=4, Hkv=2, N=37, M=37, D=8, Dv=6, magnitude=1.0):
    g = torch.Generator().manual_seed(seed)
    q = magnitude * torch.randn(B, H, N, D, generator=g, dtype=torch.float64)
    k = magnitude * torch.randn(B, Hkv, M, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, Hkv, M, Dv, generator=g, dtype=torch.float64)
    dout = torch.randn(B, H, N, Dv, generator=g, dtype=torch.float64)
    return q, k, v, dout


def check_close(got, want, name, rel=2e-5):
    err = (got.double() - want).abs().max().item()
    assert err <= rel * max(1.0, want.abs().max().item()), f"{name}: max error {err:.3g}"


# ---- DCA --------------------------------------------------------------------------------------------

DCA = [
    ("dca:chunk=8,local=3", dict(chunk=8, local=3), {}),
    ("dca:chunk=6,local=6,theta=500,interleaved", dict(chunk=6, local=6, theta=500.0, interleaved=True), {}),
    ("dca:chunk=5,local=2,scale=0.4", dict(chunk=5, local=2, scale=0.4), dict(kv_len=[37, 20])),
    ("dca:chunk=7,local=4", dict(chunk=7, local=4), dict(N=13)),  # queries bottom-right of more keys
]


@pytest.mark.parametrize("mech,lit,shape", DCA, ids=[m for m, _, _ in DCA])
def test_dca_gradients_through_torch_match_float64_autograd(mech, lit, shape):
    kv_len = shape.get("kv_len")
    q, k, v, dout = tensors(1, N=shape.get("N", 37), magnitude=1.5)
    leaves = [x.float().requires_grad_() for x in (q, k, v)]
    out, lse = attn.attend(*leaves, mech, layout="bhnd", key_padding_lengths=kv_len, return_lse=True)
    assert out.requires_grad
    g = torch.Generator().manual_seed(2)
    dlse = torch.randn(lse.shape, generator=g)
    ((out * dout.float()).sum() + (lse * dlse).sum()).backward()
    ref = [x.detach().requires_grad_() for x in (q, k, v)]
    o64, lse64 = literal_dca(*ref, kv_len=kv_len, **lit)
    check_close(out.detach(), o64.detach(), "out")
    ((o64 * dout).sum() + (lse64 * dlse.double()).sum()).backward()
    for name, x, w in zip(("dq", "dk", "dv"), leaves, ref):
        check_close(x.grad, w.grad, name)
    if kv_len is not None:
        assert (leaves[1].grad[1, :, 20:] == 0).all() and (leaves[2].grad[1, :, 20:] == 0).all()


def test_dca_numpy_attend_backward_and_its_forms():
    """attend_backward for NumPy callers: the parts form (the default) and the float64 reference agree,
    and equal float64 autograd of the literal."""
    q, k, v, dout = tensors(3, B=1, H=2, Hkv=1, N=45, M=45, D=10, Dv=7)
    mech = "dca:chunk=9,local=4,theta=300"
    args = [x.float().numpy() for x in (q, k, v)]
    out, lse = attn.attend(*args, mech, layout="bhnd", return_lse=True)
    fast = attn.attend_backward(dout.float().numpy(), *args, out, lse, mech, layout="bhnd")
    ref = attn.attend_backward(dout.float().numpy(), *args, out, lse, mech, layout="bhnd", form="reference")
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    literal_dca(*leaves, chunk=9, local=4, theta=300.0)[0].backward(dout)
    for name, a, b, x in zip(("dq", "dk", "dv"), fast, ref, leaves):
        assert a.dtype == np.float32 and a.shape == tuple(x.shape)
        check_close(torch.from_numpy(a), x.grad, name)
        check_close(torch.from_numpy(b), x.grad, name + " (reference form)")
    with pytest.raises(ValueError, match="form must be one of parts, reference for dca"):
        attn.attend_backward(dout.float().numpy(), *args, out, lse, mech, layout="bhnd", form="tiled")


def test_dca_bfloat16_within_three_times_a_plain_bfloat16_implementation():
    q, k, v, dout = tensors(4, N=70, M=70, D=16, Dv=8)
    mech, lit = "dca:chunk=16,local=5", dict(chunk=16, local=5)
    ref = [x.detach().requires_grad_() for x in (q, k, v)]
    literal_dca(*ref, **lit)[0].backward(dout)
    plain = [x.bfloat16().detach().requires_grad_() for x in (q, k, v)]
    literal_dca(*plain, **lit)[0].backward(dout.bfloat16())
    leaves = [x.bfloat16().requires_grad_() for x in (q, k, v)]
    attn.attend(*leaves, mech, layout="bhnd").backward(dout.bfloat16())
    for name, x, p, r in zip(("dq", "dk", "dv"), leaves, plain, ref):
        err = (x.grad.double() - r.grad).abs().max().item()
        plain_err = (p.grad.double() - r.grad).abs().max().item()
        assert err <= 3 * plain_err + 1e-5 * max(1.0, r.grad.abs().max().item()), (name, err, plain_err)


# ---- qsoftmax -----------------------------------------------------------------------------------------

QSOFTMAX = [
    ("qsoftmax", dict(causal=False), {}),
    ("qsoftmax:causal", dict(causal=True), {}),
    ("qsoftmax:scale=0.5", dict(causal=False, scale=0.5), dict(M=53)),
    ("qsoftmax:causal,scale=2", dict(causal=True, scale=2.0), dict(kv_len=[37, 19])),
]


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("mech,lit,shape", QSOFTMAX, ids=[m for m, _, _ in QSOFTMAX])
def test_qsoftmax_gradients_through_torch_match_float64_autograd(mech, lit, shape, with_state):
    """q, k, v and the initial state through attn.attend (the output only), against float64 autograd."""
    kv_len = shape.get("kv_len")
    q, k, v, dout = tensors(5, M=shape.get("M", 37), magnitude=2.0)
    g = torch.Generator().manual_seed(6)
    s0 = torch.randn(2, 4, 8, 6, generator=g, dtype=torch.float64) if with_state else None
    leaves = [x.float().requires_grad_() for x in (q, k, v)]
    params = {"initial_state": s0.float().requires_grad_()} if with_state else None
    out = attn.attend(*leaves, mech, layout="bhnd", key_padding_lengths=kv_len, params=params)
    (out * dout.float()).sum().backward()
    ref = [x.detach().requires_grad_() for x in (q, k, v)]
    s64 = s0.detach().requires_grad_() if with_state else None
    o64, _ = literal_qsoftmax(*ref, initial_state=s64, kv_len=kv_len, **lit)
    check_close(out.detach(), o64.detach(), "out")
    (o64 * dout).sum().backward()
    for name, x, w in zip(("dq", "dk", "dv"), leaves, ref):
        check_close(x.grad, w.grad, name)
    if with_state:
        check_close(params["initial_state"].grad, s64.grad, "d_initial_state")


@pytest.mark.parametrize("causal", [False, True])
def test_qsoftmax_through_the_final_state(causal):
    """return_final_state with tensors that require grad: gradients flow in through the final state
    too (torch.ops.attn.linear_attention serves the state families), equal to float64 autograd."""
    mech = "qsoftmax:causal" if causal else "qsoftmax"
    q, k, v, dout = tensors(7, magnitude=2.0)
    g = torch.Generator().manual_seed(8)
    s0 = torch.randn(2, 4, 8, 6, generator=g, dtype=torch.float64)
    dS = torch.randn(2, 4, 8, 6, generator=g, dtype=torch.float64)
    leaves = [x.float().requires_grad_() for x in (q, k, v, s0)]
    out, state = attn.attend(*leaves[:3], mech, layout="bhnd", params={"initial_state": leaves[3]},
                             key_padding_lengths=[37, 25], return_final_state=True)
    assert state.requires_grad and state.shape == (2, 4, 8, 6)
    ((out * dout.float()).sum() + (state * dS.float()).sum()).backward()
    ref = [x.detach().requires_grad_() for x in (q, k, v, s0)]
    o64, st64 = literal_qsoftmax(*ref[:3], causal=causal, initial_state=ref[3], kv_len=[37, 25])
    check_close(state.detach(), st64.detach(), "final_state")
    ((o64 * dout).sum() + (st64 * dS).sum()).backward()
    for name, x, w in zip(("dq", "dk", "dv", "d_initial_state"), leaves, ref):
        check_close(x.grad, w.grad, name)


def test_qsoftmax_numpy_attend_backward_with_states():
    """attend_backward for NumPy callers returns (dq, dk, dv, d_initial_state) with an initial state;
    dfinal_state reaches k, v and the initial state."""
    q, k, v, dout = tensors(9, B=1, H=3, Hkv=1, N=29, M=29, D=7, Dv=5)
    g = torch.Generator().manual_seed(10)
    s0 = torch.randn(1, 3, 7, 5, generator=g, dtype=torch.float64)
    dS = torch.randn(1, 3, 7, 5, generator=g, dtype=torch.float64)
    args = [x.float().numpy() for x in (q, k, v)]
    params = {"initial_state": s0.float().numpy()}
    out = attn.attend(*args, "qsoftmax:causal", layout="bhnd", params=params)
    grads = attn.attend_backward(dout.float().numpy(), *args, out, None, "qsoftmax:causal", layout="bhnd",
                                 params=params, dfinal_state=dS.float().numpy())
    assert len(grads) == 4
    ref = [x.detach().requires_grad_() for x in (q, k, v, s0)]
    o64, st64 = literal_qsoftmax(*ref[:3], causal=True, initial_state=ref[3])
    ((o64 * dout).sum() + (st64 * dS).sum()).backward()
    for name, a, x in zip(("dq", "dk", "dv", "d_initial_state"), grads, ref):
        check_close(torch.from_numpy(a), x.grad, name)


def test_qsoftmax_half_types_within_three_times_a_plain_implementation():
    q, k, v, dout = tensors(11, N=70, M=70, D=16, Dv=8, magnitude=3.0)
    for dtype in (torch.bfloat16, torch.float16):
        ref = [x.detach().requires_grad_() for x in (q, k, v)]
        literal_qsoftmax(*ref, causal=True)[0].backward(dout)
        plain = [x.to(dtype).detach().requires_grad_() for x in (q, k, v)]
        literal_qsoftmax(*plain, causal=True)[0].backward(dout.to(dtype))
        leaves = [x.to(dtype).requires_grad_() for x in (q, k, v)]
        attn.attend(*leaves, "qsoftmax:causal", layout="bhnd").backward(dout.to(dtype))
        for name, x, p, r in zip(("dq", "dk", "dv"), leaves, plain, ref):
            err = (x.grad.double() - r.grad).abs().max().item()
            plain_err = (p.grad.double() - r.grad).abs().max().item()
            assert err <= 3 * plain_err + 1e-5 * max(1.0, r.grad.abs().max().item()), (dtype, name, err, plain_err)


# ---- the custom ops: opcheck and torch.compile ----------------------------------------------------------

@pytest.mark.parametrize("mech", ["dca:chunk=8,local=3", "qsoftmax:causal", "qsoftmax"])
def test_custom_ops_pass_opcheck(mech):
    q, k, v, dout = (x.float() for x in tensors(12, N=21, M=21))
    args = (q, k, v, mech, "bhnd", None, [], None)
    torch.library.opcheck(torch.ops.attn.attend.default, args)
    out, lse = torch.ops.attn.attend(*args)
    torch.library.opcheck(torch.ops.attn.attend_backward.default,
                          (dout, q, k, v, out, lse, mech, "bhnd", None, [], None, None))
    if mech.startswith("qsoftmax"):  # with a state: its gradient is a param's
        s0 = torch.randn(2, 4, 8, 6)
        sargs = args + ("initial_state", [s0])
        torch.library.opcheck(torch.ops.attn.attend.default, sargs)
        out, lse = torch.ops.attn.attend(*sargs)
        bargs = (dout, q, k, v, out, lse, mech, "bhnd", None, [], None, None, "initial_state", [s0])
        torch.library.opcheck(torch.ops.attn.attend_backward.default, bargs)
        dq, dk, dv, (ds0,) = torch.ops.attn.attend_backward(*bargs)
        assert ds0.shape == s0.shape
        torch.library.opcheck(torch.ops.attn.linear_attention.default,
                              (q, k, v, mech, "bhnd", s0, None, []))


@pytest.mark.parametrize("mech", ["dca:chunk=8,local=3", "qsoftmax:causal"])
def test_compile_fullgraph_backward_equals_eager(mech):
    """torch.compile(fullgraph=True) traces attend through forward and backward (a qsoftmax state
    among the leaves) and gives the eager gradients, bitwise."""
    q, k, v, _ = tensors(13, N=33, M=33)
    s0 = torch.randn(2, 4, 8, 6, generator=torch.Generator().manual_seed(14))
    with_state = mech.startswith("qsoftmax")

    def loss(q, k, v, s0):
        params = {"initial_state": s0} if with_state else None
        return (attn.attend(q, k, v, mech, layout="bhnd", params=params) ** 2).sum()

    grads = []
    for fn in (torch.compile(loss, fullgraph=True, backend="aot_eager"), loss):
        leaves = [x.float().detach().requires_grad_() for x in (q, k, v, s0)]
        fn(*leaves).backward()
        grads.append([x.grad for x in leaves[:4 if with_state else 3]])
    for a, b in zip(*grads):
        assert a is not None and torch.equal(a, b)
