"""The linear family's backward from Python: attn.linear_attention is differentiable for torch
tensors that require grad (q, k, v, initial_state, and through the final state), equal to float64
torch autograd of a literal quadratic implementation; the custom ops pass torch.library.opcheck and
trace under torch.compile(fullgraph=True); attn.attend_backward serves NumPy callers."""
import numpy as np
import pytest
import torch

import attn
from attn import torch_ops  # noqa: F401  (registers torch.ops.attn.*)

MAPS = {
    "elu": lambda x: torch.where(x > 0, x + 1, torch.exp(x)),
    "relu": torch.relu,
    "identity": lambda x: x,
    "exp": torch.exp,
    "relu2": lambda x: torch.relu(x) ** 2,
}


def literal_linear(q, k, v, feature_map="elu", causal=True, normalize=True, decay=None, scale=None,
                   initial_state=None, kv_len=None):
    """o and the final state, written out from the weights w_ij = scale phi(q_i).phi(k_j) decay^(i-j)
    (bnhd in and out, any float dtype; no chunks, no recurrence)."""
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))  # (B, H, T, D)
    B, H, N, D = q.shape
    M, Dv = k.shape[2], v.shape[-1]
    group = H // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    phi = MAPS[feature_map]
    fq, fk = phi(q) * (1.0 if scale is None else scale), phi(k)
    lens = torch.tensor(kv_len if kv_len is not None else [M] * B)
    valid = (torch.arange(M)[None, :] < lens[:, None]).to(q.dtype)[:, None, :, None]  # (B, 1, M, 1)
    fk = fk * valid
    u = torch.cat([v, torch.ones_like(v[..., :1])], -1) if normalize else v
    u = u * valid
    lam = torch.ones(H, dtype=q.dtype) if decay is None else torch.as_tensor(decay, dtype=q.dtype).expand(H)
    lam = lam.view(1, H, 1, 1)
    i = torch.arange(N, dtype=q.dtype).view(N, 1)
    j = torch.arange(M, dtype=q.dtype).view(1, M)
    if causal:
        weights = torch.where(j <= i, lam ** (i - j).clamp(min=0), torch.zeros((), dtype=q.dtype))
    else:
        weights = torch.ones(1, 1, N, M, dtype=q.dtype)
    y = ((fq @ fk.transpose(-1, -2)) * weights) @ u
    if initial_state is not None:
        before = lam ** (i + 1) if causal else torch.ones((), dtype=q.dtype)
        y = y + before * (fq @ initial_state.to(q.dtype))
    if normalize:
        den = y[..., -1:]
        safe = torch.where(den != 0, den, torch.ones((), dtype=q.dtype))  # no NaN in the untaken branch's gradient
        o = torch.where(den != 0, y[..., :-1] / safe, torch.zeros((), dtype=q.dtype))
    else:
        o = y
    L = lens.to(q.dtype).view(B, 1, 1, 1)
    back = lam ** (L - 1 - j.view(1, 1, M, 1)).clamp(min=0) if causal else torch.ones((), dtype=q.dtype)
    state = (fk * back).transpose(-1, -2) @ u
    if initial_state is not None:
        state = state + (lam ** L if causal else 1.0) * initial_state.to(q.dtype)
    return o.transpose(1, 2), state


def tensors(seed, B=2, N=37, H=4, Hkv=2, D=8, Dv=6, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, N, H, D, generator=g, dtype=dtype).requires_grad_()
    k = torch.randn(B, N, Hkv, D, generator=g, dtype=dtype).requires_grad_()
    v = torch.randn(B, N, Hkv, Dv, generator=g, dtype=dtype).requires_grad_()
    return q, k, v


def state_of(seed, B, H, F, cols):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(B, H, F, cols, generator=g) + 0.1).requires_grad_()


CASES = [
    dict(feature_map="elu", causal=True),
    dict(feature_map="elu", causal=False),
    dict(feature_map="relu", causal=True, chunk_size=8),
    dict(feature_map="exp", causal=True, scale=0.3),
    dict(feature_map="relu2", causal=True, normalize=False, scale=0.2),
    dict(feature_map="identity", causal=True, normalize=False, decay=0.9, chunk_size=16),  # retention
    dict(feature_map="identity", causal=False, normalize=False),
    dict(feature_map="elu", causal=True, decay=[0.99, 0.9, 0.8, 0.5], chunk_size=8),  # per head
]


def check_close(got, want, name, rel=1e-4):
    err = (got.double() - want).abs().max().item()
    assert err <= rel * max(1.0, want.abs().max().item()), f"{name}: max error {err:.3g}"


@pytest.mark.parametrize("kw", CASES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
@pytest.mark.parametrize("with_state", [False, True])
def test_gradients_equal_float64_autograd_of_the_literal(kw, with_state):
    q, k, v = tensors(1)
    normalize = kw.get("normalize", True)
    s0 = state_of(2, 2, 4, 8, 6 + normalize) if with_state else None
    kv_len = [37, 20]
    o, state = attn.linear_attention(q, k, v, initial_state=s0, output_final_state=True, key_padding_lengths=kv_len,
                                     **kw)
    assert o.requires_grad and state.requires_grad
    g = torch.Generator().manual_seed(3)
    do, ds = torch.randn(o.shape, generator=g), torch.randn(state.shape, generator=g)
    ((o * do).sum() + (state * ds).sum()).backward()
    lit = {key: val for key, val in kw.items() if key != "chunk_size"}
    x64 = [x.detach().double().requires_grad_() for x in (q, k, v)]
    s64 = s0.detach().double().requires_grad_() if with_state else None
    o64, st64 = literal_linear(*x64, initial_state=s64, kv_len=kv_len, **lit)
    check_close(o.detach(), o64.detach(), "o")
    check_close(state.detach(), st64.detach(), "final_state")
    ((o64 * do.double()).sum() + (st64 * ds.double()).sum()).backward()
    for name, x, w in zip(("q", "k", "v"), (q, k, v), x64):
        check_close(x.grad, w.grad, f"d{name}")
    assert (k.grad[1, 20:] == 0).all() and (v.grad[1, 20:] == 0).all(), "keys past the padding: no gradient"
    if with_state:
        check_close(s0.grad, s64.grad, "d_initial_state")


def test_bfloat16_gradients_within_three_times_the_plain_error():
    """The gradients' rule: max|ours - f64| <= 3 max|plain same dtype - f64| + floor."""
    q, k, v = tensors(4, dtype=torch.bfloat16)
    o, _ = attn.linear_attention(q, k, v, chunk_size=16)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    o.backward(do)
    want = [x.detach().double().requires_grad_() for x in (q, k, v)]
    literal_linear(*want)[0].backward(do.double())
    plain = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    literal_linear(*plain)[0].backward(do)
    for name, x, w, p in zip("qkv", (q, k, v), want, plain):
        err = (x.grad.double() - w.grad).abs().max().item()
        plain_err = (p.grad.double() - w.grad).abs().max().item()
        assert err <= 3 * plain_err + 1e-5 * max(1.0, w.grad.abs().max().item()), f"d{name}: {err} vs plain {plain_err}"


def test_opcheck():
    q, k, v = (x.detach() for x in tensors(6, N=11))
    s0 = state_of(7, 2, 4, 8, 7).detach()
    decay = torch.tensor([0.9, 0.8, 0.7, 0.6])
    mech = "linear:causal,chunk=4"
    for args in [(q, k, v, mech, "bnhd", s0, decay, [11, 5]), (q, k, v, "linear", "bnhd", None, None, [])]:
        torch.library.opcheck(torch.ops.attn.linear_attention.default, args)
    out, state = torch.ops.attn.linear_attention(q, k, v, mech, "bnhd", s0, decay, [11, 5])
    torch.library.opcheck(torch.ops.attn.linear_attention_backward.default,
                          (torch.randn_like(out), torch.randn_like(state), q, k, v, out, mech, "bnhd", s0, decay,
                           [11, 5]))
    torch.library.opcheck(torch.ops.attn.linear_attention_backward.default,
                          (torch.randn_like(out), None, q, k, v, out, mech, "bnhd", None, None, []))


def test_torch_compile_fullgraph_forward_and_backward():
    q, k, v = tensors(8)
    s0 = state_of(9, 2, 4, 8, 7)

    def loss(q, k, v, s0):
        o, state = attn.linear_attention(q, k, v, initial_state=s0, output_final_state=True, decay=0.95,
                                         chunk_size=16)
        return (o ** 2).sum() + state.sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    got = compiled(q, k, v, s0)
    got.backward()
    grads = [x.grad.clone() for x in (q, k, v, s0)]
    for x in (q, k, v, s0):
        x.grad = None
    want = loss(q, k, v, s0)
    want.backward()
    assert torch.equal(got, want)
    for g, x in zip(grads, (q, k, v, s0)):
        assert torch.equal(g, x.grad)


def test_only_the_initial_state_requires_grad():
    q, k, v = (x.detach() for x in tensors(10))
    s0 = state_of(11, 2, 4, 8, 7)
    o, _ = attn.linear_attention(q, k, v, initial_state=s0)
    o.sum().backward()
    s64 = s0.detach().double().requires_grad_()
    literal_linear(q.double(), k.double(), v.double(), initial_state=s64)[0].sum().backward()
    check_close(s0.grad, s64.grad, "d_initial_state")


def test_attend_backward_for_numpy_callers():
    q, k, v = (x.detach().numpy() for x in tensors(12, N=9))
    s0 = state_of(13, 2, 4, 8, 7).detach().numpy()
    out, state = attn.attend(q, k, v, "linear:causal", params={"initial_state": s0}, return_final_state=True)
    dout, ds = np.ones_like(out), np.ones_like(state)
    dq, dk, dv, ds0 = attn.attend_backward(dout, q, k, v, out, None, "linear:causal", params={"initial_state": s0},
                                           dfinal_state=ds)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape and ds0.shape == s0.shape
    x64 = [torch.from_numpy(x).double().requires_grad_() for x in (q, k, v)]
    s64 = torch.from_numpy(s0).double().requires_grad_()
    o64, st64 = literal_linear(*x64, initial_state=s64)
    (o64.sum() + st64.sum()).backward()
    for got, w in zip((dq, dk, dv, ds0), (*x64, s64)):
        check_close(torch.from_numpy(np.asarray(got)), w.grad, "numpy gradient")
    # without an initial state: the softmax convention, three gradients
    out = attn.attend(q, k, v, "linear")
    assert len(attn.attend_backward(dout, q, k, v, out, None, "linear")) == 3


def test_a_decay_that_requires_grad_is_refused():
    q, k, v = tensors(17, N=5)
    with pytest.raises(ValueError, match="no gradient for decay yet"):
        attn.linear_attention(q, k, v, decay=torch.full((4,), 0.9, requires_grad=True))


def test_bad_input_is_named():
    q, k, v = (x.detach().numpy() for x in tensors(14, N=9))
    out, state = attn.attend(q, k, v, "linear:causal", return_final_state=True)
    with pytest.raises(ValueError, match="dfinal_state must have the final state's shape"):
        attn.attend_backward(np.ones_like(out), q, k, v, out, None, "linear:causal", dfinal_state=state[:1])
    with pytest.raises(ValueError, match="lse does not apply to qsoftmax"):
        o = attn.attend(q, k, v, "qsoftmax")
        lse = np.zeros((o.shape[0], o.shape[2], o.shape[1]), np.float32)  # (B, H, N) of (B, N, H, Dv) rows
        attn.attend_backward(np.ones_like(o), q, k, v, o, lse, "qsoftmax")


def test_attend_with_a_linear_mechanism_is_differentiable_normattn_too():
    """attn.attend's custom op (torch.ops.attn.attend) runs the linear backward (no lse); normattn's
    output norm included."""
    q, k, v = tensors(15, N=21)
    for text, norm in [("linear:causal,chunk=8", None), ("normattn:causal,chunk=8", "rms"), ("normattn:norm=layer", "layer")]:
        for x in (q, k, v):
            x.grad = None
        out = attn.attend(q, k, v, text)
        do = torch.randn(out.shape, generator=torch.Generator().manual_seed(16))
        out.backward(do)
        x64 = [x.detach().double().requires_grad_() for x in (q, k, v)]
        causal = "causal" in text
        o64, _ = literal_linear(*x64, causal=causal, normalize=norm is None)
        if norm is not None:
            centred = o64 - o64.mean(-1, keepdim=True) if norm == "layer" else o64
            o64 = centred / torch.sqrt((centred ** 2).mean(-1, keepdim=True) + 1e-6)
        o64.backward(do.double())
        for name, x, w in zip("qkv", (q, k, v), x64):
            check_close(x.grad, w.grad, f"{text}: d{name}")


def polaformer_literal(q, k, v, power, coef):
    """PolaFormer in plain torch (bnhd, non-causal): two normalised streams on the halves of the
    value channels, x+ = relu(x)^p, x- = relu(-x)^p per channel, then a coefficient per channel."""
    def parts(x):
        return torch.relu(x) ** power, torch.relu(-x) ** power
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    (qp, qn), (kp, kn) = parts(q), parts(k)
    phi = torch.cat([qp, qn], -1).transpose(1, 2)  # (B, H, N, 2D)
    half = v.shape[-1] // 2
    outs = []
    for s, keys in enumerate((torch.cat([kp, kn], -1), torch.cat([kn, kp], -1))):
        w = phi @ keys.transpose(1, 2).transpose(-1, -2)  # (B, H, N, M)
        vs = v[..., s * half:(s + 1) * half].transpose(1, 2)
        outs.append((w @ vs) / w.sum(-1, keepdim=True))
    return (torch.cat(outs, -1) * coef).transpose(1, 2)


def test_polaformer_gradients_with_its_powers_and_coefficients_match_float64_autograd():
    """attend_backward returns dq, dk, dv and {power, coefficients}; torch autograd through
    attn.attend reaches both params. Against float64 torch autograd of the literal formula."""
    q, k, v = (x.detach().double() for x in tensors(15, N=21))
    g = torch.Generator().manual_seed(16)
    power = 1.5 + 1.5 * torch.rand(8, generator=g, dtype=torch.float64)
    coef = torch.randn(6, generator=g, dtype=torch.float64)
    dout = torch.randn(2, 21, 4, 6, generator=g, dtype=torch.float64)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, power, coef)]
    polaformer_literal(*leaves).backward(dout)
    want = [x.grad for x in leaves]

    args = [x.float().numpy() for x in (q, k, v)]
    params = {"power": power.float().numpy(), "coefficients": coef.float().numpy()}
    out = attn.attend(*args, "polaformer", params=params)
    grads = attn.attend_backward(dout.float().numpy(), *args, out, None, "polaformer", params=params)
    assert len(grads) == 4 and sorted(grads[3]) == ["coefficients", "power"]
    got = list(grads[:3]) + [grads[3]["power"], grads[3]["coefficients"]]
    for name, a, b in zip(["dq", "dk", "dv", "dpower", "dcoefficients"], got, want):
        assert a.shape == tuple(b.shape), name
        err = np.abs(a - b.numpy()).max()
        assert err <= 1e-4 * max(1.0, b.abs().max().item()), (name, err)

    tq, tk, tv, tp, tc = (x.float().detach().requires_grad_() for x in (q, k, v, power, coef))
    attn.attend(tq, tk, tv, "polaformer", params={"power": tp, "coefficients": tc}).backward(dout.float())
    for name, x, b in zip(["dq", "dk", "dv", "dpower", "dcoefficients"], (tq, tk, tv, tp, tc), want):
        err = (x.grad.double() - b).abs().max().item()
        assert err <= 1e-4 * max(1.0, b.abs().max().item()), (name, err)
