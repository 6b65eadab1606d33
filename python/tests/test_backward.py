"""attn.attend_backward against torch autograd through the literal float64 implementation (no
code shared with the kernels), for the options of exact attention, NumPy and torch, and half
types under the gradient rule (3x a plain same-dtype implementation's error)."""
import numpy as np
import pytest
import torch

import attn
from conftest import literal_attention

CASES = [
    ("softmax", {}, {}),
    ("softmax:causal", dict(causal=True), {}),
    ("softmax:window=6:2", dict(window=(6, 2)), {}),
    ("softmax:causal,softcap=3", dict(causal=True, softcap=3.0), {}),
    ("softmax:scale=0.3", dict(scale=0.3), {}),
    ("softmax:entropy_scale=64", dict(entropy_m=64), {}),
    ("softmax:causal", dict(causal=True, alibi="slopes"), dict(alibi_slopes="slopes")),
    ("softmax", dict(mask="bool"), dict(attn_mask="bool")),
    ("softmax", dict(mask="float"), dict(attn_mask="float")),
    ("softmax", dict(kv_len=[33, 12]), dict(key_padding_lengths=[33, 12])),
]


def problem(seed, B=2, H=4, Hkv=2, N=21, M=33, D=16, Dv=12):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, N, D, generator=g, dtype=torch.float64)
    k = torch.randn(B, Hkv, M, D, generator=g, dtype=torch.float64)
    v = torch.randn(B, Hkv, M, Dv, generator=g, dtype=torch.float64)
    dout = torch.randn(B, H, N, Dv, generator=g, dtype=torch.float64)
    extras = dict(slopes=torch.tensor([0.5, 0.25, 0.125, 0.0625]),
                  bool=torch.rand(B, 1, N, M, generator=g) > 0.3,
                  float=torch.randn(B, 1, N, M, generator=g, dtype=torch.float64).float())
    return q, k, v, dout, extras


def autograd(q, k, v, dout, dtype, **kw):
    """dq, dk, dv of the literal implementation in `dtype`, by torch autograd."""
    q, k, v = (x.to(dtype).detach().requires_grad_() for x in (q, k, v))
    out, _ = literal_attention(q, k, v, dtype=dtype, **kw)
    out.backward(dout.to(dtype))
    return q.grad.double(), k.grad.double(), v.grad.double()


def resolve(d, extras):
    return {key: extras[val] if isinstance(val, str) else val for key, val in d.items()}


@pytest.mark.parametrize("mechanism,literal_kw,attn_kw", CASES)
def test_float32_gradients_match_float64_autograd(mechanism, literal_kw, attn_kw):
    q, k, v, dout, extras = problem(1)
    lit = resolve(literal_kw, extras)
    if "mask" in lit and lit["mask"].dtype != torch.bool:
        lit["mask"] = lit["mask"].double()
    want = autograd(q, k, v, dout, torch.float64, **lit)
    kw = resolve(attn_kw, extras)
    args = [x.float().numpy() for x in (q, k, v)]
    kw = {key: (val.numpy() if isinstance(val, torch.Tensor) else val) for key, val in kw.items()}
    out, lse = attn.attend(*args, mechanism, layout="bhnd", return_lse=True, **kw)
    got = attn.attend_backward(dout.float().numpy(), *args, out, lse, mechanism, layout="bhnd", **kw)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert isinstance(g, np.ndarray) and g.dtype == np.float32 and g.shape == tuple(w.shape), name
        err = np.abs(g.astype(np.float64) - w.numpy()).max()
        assert err <= 1e-5 * max(1.0, w.abs().max().item()), f"{name}: max error {err:.3g}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_half_types_within_three_times_a_plain_implementation(dtype, causal):
    q, k, v, dout, _ = problem(2)
    q, k, v, dout = (x.to(dtype).double() for x in (q, k, v, dout))  # the inputs attn sees, exactly
    want = autograd(q, k, v, dout, torch.float64, causal=causal)
    # plain: the literal in float32 with its result rounded to the dtype (CPU half autograd varies)
    plain = [x.to(dtype).double() for x in autograd(q, k, v, dout, torch.float32, causal=causal)]
    args = [x.to(dtype).transpose(1, 2) for x in (q, k, v)]  # bnhd torch tensors
    mech = "softmax:causal" if causal else "softmax"
    out, lse = attn.attend(*args, mech, return_lse=True)
    got = attn.attend_backward(dout.to(dtype).transpose(1, 2), *args, out, lse, mech)
    for name, g, w, p in zip(("dq", "dk", "dv"), got, want, plain):
        assert isinstance(g, torch.Tensor) and g.dtype == dtype, name
        g = g.transpose(1, 2).double()
        err, plain_err = (g - w).abs().max().item(), (p - w).abs().max().item()
        assert err <= 3 * plain_err + 1e-5 * max(1.0, w.abs().max().item()), \
            f"{name}: error {err:.3g} > 3 * plain {plain_err:.3g}"


def test_dropout_gradients_regenerate_the_forward_mask():
    """With dropout, a finite difference of the forward (same seed) equals the gradient."""
    q, k, v, dout, _ = problem(3, B=1, H=2, Hkv=1, N=5, M=6, D=4, Dv=3)
    args = [x.float().numpy() for x in (q, k, v)]
    mech = "softmax:dropout=0.4,seed=9"
    out, lse = attn.attend(*args, mech, layout="bhnd", return_lse=True, use_reference=True)
    dq, dk, dv = attn.attend_backward(dout.float().numpy(), *args, out, lse, mech, layout="bhnd", form="reference")
    loss = lambda *a: float((attn.attend(*a, mech, layout="bhnd", use_reference=True).astype(np.float64)
                             * dout.numpy()).sum())
    for which, grad in ((0, dq), (1, dk), (2, dv)):
        x = args[which]
        for idx in [(0, 0, 1, 2), (0, 0, 3, 1)]:
            up, down = [a.copy() for a in args], [a.copy() for a in args]
            up[which][idx] += 1e-2
            down[which][idx] -= 1e-2
            fd = (loss(*up) - loss(*down)) / (float(up[which][idx]) - float(down[which][idx]))
            assert abs(fd - grad[idx]) <= 2e-3 * max(1.0, abs(fd)), (which, idx, fd, grad[idx])
        assert x is args[which]


def test_bad_input_is_named():
    q, k, v, dout, _ = problem(4)
    args = [x.float().numpy() for x in (q, k, v)]
    out, lse = attn.attend(*args, layout="bhnd", return_lse=True)
    d = dout.float().numpy()
    with pytest.raises(ValueError, match="lse does not apply to qsoftmax"):
        attn.attend_backward(d, *args, out, lse, "qsoftmax", layout="bhnd")
    with pytest.raises(ValueError, match="lse does not apply to linear"):
        attn.attend_backward(d, *args, out, lse, "linear", layout="bhnd")
    with pytest.raises(ValueError, match="dout must have out's shape"):
        attn.attend_backward(d[:, :, :3], *args, out, lse, layout="bhnd")
    with pytest.raises(ValueError, match="lse must have 3 dimensions"):
        attn.attend_backward(d, *args, out, lse[..., None], layout="bhnd")
    with pytest.raises(ValueError, match="form must be one of tiled_bf16, tiled, rows, scores, reference for softmax, got 'fast'"):
        attn.attend_backward(d, *args, out, lse, layout="bhnd", form="fast")
    with pytest.raises(TypeError, match="of q's kind"):
        attn.attend_backward(torch.from_numpy(d), *args, out, lse, layout="bhnd")


@pytest.mark.parametrize("causal", [False, True])
def test_gau_gradients_through_torch_match_float64_autograd(causal):
    """GAU (no LSE) is differentiable through attn.attend: its tiled backward against torch autograd
    of relu(q.k / sqrt(d) + bias)^2 / n in float64, grouped heads and a ragged last block."""
    q, k, v, dout, _ = problem(7, N=70, M=70)
    mech = "gau:bias=0.1" + (",causal" if causal else "")
    leaves = [x.float().requires_grad_() for x in (q, k, v)]
    attn.attend(*leaves, mech, layout="bhnd").backward(dout.float())
    ref = [x.double().requires_grad_() for x in (q, k, v)]
    kk, vv = (x.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for x in ref[1:])
    w = torch.relu(ref[0] @ kk.transpose(-1, -2) / q.shape[-1] ** 0.5 + 0.1) ** 2 / k.shape[2]
    if causal:
        w = w * torch.ones(70, 70, dtype=torch.float64).tril()
    (w @ vv).backward(dout.double())
    for got, want in zip(leaves, ref):
        err = (got.grad.double() - want.grad).abs().max().item()
        assert err <= 1e-5 * max(1.0, want.grad.abs().max().item()), err


def linformer_literal(q, k, v, E, F, scale, kv_len=None):
    """Linformer in plain torch: K' = E K, V' = F V over each batch entry's valid keys, then
    softmax(scale q K'^T) V' with grouped heads (bhnd)."""
    outs = []
    for b in range(q.shape[0]):
        n = k.shape[2] if kv_len is None else kv_len[b]
        kp = E[:, :n] @ k[b, :, :n]  # (Hkv, k, D)
        vp = F[:, :n] @ v[b, :, :n]
        group = q.shape[1] // k.shape[1]
        kp, vp = kp.repeat_interleave(group, dim=0), vp.repeat_interleave(group, dim=0)
        outs.append(torch.softmax(scale * q[b] @ kp.transpose(-1, -2), dim=-1) @ vp)
    return torch.stack(outs)


@pytest.mark.parametrize("kv_len", [None, [33, 20]])
def test_linformer_gradients_with_its_projections_match_float64_autograd(kv_len):
    """attend_backward (NumPy) returns dq, dk, dv and a dict of E and F's gradients when they are
    params, and only dq, dk, dv when they are drawn from the seed; torch autograd through
    attn.attend reaches E and F. Both against float64 torch autograd of the literal formula."""
    q, k, v, dout, _ = problem(9)
    g = torch.Generator().manual_seed(10)
    E, F = (torch.randn(16, 33, generator=g, dtype=torch.float64) / 4 for _ in range(2))
    mech, scale = "linformer:k=16", 16 ** -0.5
    leaves = [x.detach().requires_grad_() for x in (q, k, v, E, F)]
    linformer_literal(*leaves, scale, kv_len).backward(dout)
    want = [x.grad for x in leaves]

    args = [x.float().numpy() for x in (q, k, v)]
    params = {"E": E.float().numpy(), "F": F.float().numpy()}
    out, lse = attn.attend(*args, mech, layout="bhnd", return_lse=True, params=params, key_padding_lengths=kv_len)
    grads = attn.attend_backward(dout.float().numpy(), *args, out, lse, mech, layout="bhnd", params=params,
                                 key_padding_lengths=kv_len)
    assert len(grads) == 4 and isinstance(grads[3], dict) and sorted(grads[3]) == ["E", "F"]
    got = list(grads[:3]) + [grads[3]["E"], grads[3]["F"]]
    for name, a, b in zip(["dq", "dk", "dv", "dE", "dF"], got, want):
        assert a.shape == tuple(b.shape) and a.dtype == np.float32, name
        err = np.abs(a - b.numpy()).max()
        assert err <= 1e-5 * max(1.0, b.abs().max().item()), (name, err)

    # drawn from the seed: no learned params, the usual triple
    out, lse = attn.attend(*args, mech, layout="bhnd", return_lse=True)
    assert len(attn.attend_backward(dout.float().numpy(), *args, out, lse, mech, layout="bhnd")) == 3

    # torch: E and F as tensors that require grad
    tq, tk, tv, tE, tF = (x.float().detach().requires_grad_() for x in (q, k, v, E, F))
    attn.attend(tq, tk, tv, mech, layout="bhnd", params={"E": tE, "F": tF},
                key_padding_lengths=kv_len).backward(dout.float())
    for name, x, b in zip(["dq", "dk", "dv", "dE", "dF"], (tq, tk, tv, tE, tF), want):
        err = (x.grad.double() - b).abs().max().item()
        assert err <= 1e-5 * max(1.0, b.abs().max().item()), (name, err)


def test_linformer_params_through_the_custom_ops_pass_opcheck():
    q, k, v, dout, _ = problem(11)
    q, k, v, dout = (x.float() for x in (q, k, v, dout))
    g = torch.Generator().manual_seed(12)
    E, F = (torch.randn(16, 33, generator=g) / 4 for _ in range(2))
    args = (q, k, v, "linformer:k=16", "bhnd", None, [], None, "E,F", [E, F])
    torch.library.opcheck(torch.ops.attn.attend.default, args)
    out, lse = torch.ops.attn.attend(*args)
    torch.library.opcheck(torch.ops.attn.attend_backward.default,
                          (dout, q, k, v, out, lse, "linformer:k=16", "bhnd", None, [], None, None, "E,F", [E, F]))
    dq, dk, dv, (dE, dF) = torch.ops.attn.attend_backward(dout, q, k, v, out, lse, "linformer:k=16", "bhnd", None, [],
                                                          None, None, "E,F", [E, F])
    assert dE.shape == E.shape and dF.shape == F.shape


def test_a_param_without_a_gradient_that_requires_one_is_named():
    """linear's decay has no gradient: asking for one is an error at backward time, not a silent zero."""
    q, k, v, dout, _ = problem(13, N=12, M=12)
    leaves = [x.float().requires_grad_() for x in (q, k, v)]
    decay = torch.full((4,), 0.9, requires_grad=True)
    out = attn.attend(*leaves, "linear:causal", layout="bhnd", params={"decay": decay})
    with pytest.raises(ValueError, match=r"returns no gradient for params\['decay'\]"):
        out.backward(dout.float())


def test_linformer_params_compile_fullgraph():
    """torch.compile(fullgraph=True) traces attend with E and F through forward and backward, and gives
    the eager gradients."""
    q, k, v, _, _ = problem(14)
    g = torch.Generator().manual_seed(15)
    E, F = (torch.randn(16, 33, generator=g) / 4 for _ in range(2))

    def loss(q, k, v, E, F):
        return (attn.attend(q, k, v, "linformer:k=16", layout="bhnd", params={"E": E, "F": F}) ** 2).sum()

    grads = []
    for fn in (torch.compile(loss, fullgraph=True, backend="aot_eager"), loss):
        leaves = [x.float().detach().requires_grad_() for x in (q, k, v, E, F)]
        fn(*leaves).backward()
        grads.append([x.grad for x in leaves])
    for a, b in zip(*grads):
        assert torch.equal(a, b)
