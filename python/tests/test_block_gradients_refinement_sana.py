"""Gradients of attention-weight refinement and of SANA's LiteLA, Mix-FFN and block through their
torch custom ops (attn/blocks/_torch_ops.py): against torch autograd of plain torch implementations
of the same formulas (float64), the float32 fast forms near them, torch.library.opcheck, and
torch.compile(fullgraph=True) through forward and backward."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attn

torch.manual_seed(0)
FORMS = ("simple", "value_weighted", "additive", "stochastic")


# ---- plain torch implementations (autograd differentiates them) ------------------------------------


def refine_torch(a, v, w1, w2, form, gamma):
    n, r = a.shape[-1], w1.shape[1]
    p1, p2 = a @ w1, a @ w2
    if form == "stochastic":
        sig = F.elu(p2) + 1
        s = -((p1[..., :, None, :] - p1[..., None, :, :]) ** 2).sum(-1) \
            - ((sig[..., :, None, :] - sig[..., None, :, :]) ** 2).sum(-1)
    else:
        s = p1 @ p2.transpose(-1, -2) / math.sqrt(r)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    hat = torch.softmax(s.masked_fill(~causal, float("-inf")), -1)
    if form == "value_weighted":
        return hat @ (a @ v)
    if form == "additive":
        return ((1 - gamma) * a + gamma * hat) @ v
    return hat @ v


def lite_la_torch(x, qkv, proj, bias, head_dim, eps=1e-15):
    b, n, c = x.shape
    heads = c // head_dim
    q, k, v = (t.reshape(b, n, heads, head_dim).transpose(1, 2) for t in (x @ qkv.T).split(c, -1))
    w = F.relu(q) @ F.relu(k).transpose(-1, -2)
    o = (w @ v) / (w.sum(-1, keepdim=True) + eps)
    return F.linear(o.transpose(1, 2).reshape(b, n, c), proj, bias)


def mix_ffn_torch(x, hw, inverted, inverted_bias, depth, depth_bias, point):
    b, n, c = x.shape
    h2 = inverted.shape[0]
    u = F.silu(F.linear(x, inverted.reshape(h2, c), inverted_bias)).transpose(1, 2).reshape(b, h2, *hw)
    d = F.conv2d(u, depth.reshape(h2, 1, 3, 3), depth_bias, padding=1, groups=h2).reshape(b, h2, n).transpose(1, 2)
    a, g = d.chunk(2, -1)
    return F.linear(a * F.silu(g), point.reshape(c, h2 // 2))


def sana_block_torch(x, hw, qkv, proj, proj_bias, inv, inv_b, dw, dw_b, point, head_dim, norm_eps=1e-6):
    c = x.shape[-1]
    y = x + lite_la_torch(F.layer_norm(x, (c,), eps=norm_eps), qkv, proj, proj_bias, head_dim)
    return y + mix_ffn_torch(F.layer_norm(y, (c,), eps=norm_eps), hw, inv, inv_b, dw, dw_b, point)


# ---- inputs ------------------------------------------------------------------------------------------


def causal_weights(lead, n, seed):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(*lead, n, n, generator=g, dtype=torch.float64) * 1.5
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    return torch.softmax(s.masked_fill(~causal, float("-inf")), -1)


def refine_inputs(lead=(2,), n=7, dv=3, r=2, form="simple", seed=1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    ws = 0.7 if form == "stochastic" else 2.0
    return [causal_weights(lead, n, seed).to(dtype), torch.randn(*lead, n, dv, generator=g).to(dtype),
            (torch.randn(n, r, generator=g) * ws).to(dtype), (torch.randn(n, r, generator=g) * ws).to(dtype)]


def sana_weights(c=16, h=5, seed=2, dtype=torch.float64):
    """qkv (3C, C), proj (C, C), proj_bias (C,), then the Mix-FFN's weights in torch's conv shapes."""
    g = torch.Generator().manual_seed(seed)
    s = 1 / math.sqrt(c)
    ws = [torch.randn(3 * c, c, generator=g) * s, torch.randn(c, c, generator=g) * s, torch.randn(c, generator=g) * 0.1,
          torch.randn(2 * h, c, 1, 1, generator=g) * s, torch.randn(2 * h, generator=g) * 0.1,
          torch.randn(2 * h, 1, 3, 3, generator=g) * 0.3, torch.randn(2 * h, generator=g) * 0.1,
          torch.randn(c, h, 1, 1, generator=g) / math.sqrt(h)]
    return [w.to(dtype) for w in ws]


def leaves(xs):
    return [x.detach().clone().requires_grad_() for x in xs]


def grads_of(fn, xs, dout_seed=9):
    """The gradients of sum(dout * fn(*xs)) for a fixed random dout, and the output."""
    xs = leaves(xs)
    out = fn(*xs)
    # drawn in float64 then rounded: the same dout for a float32 and a float64 run
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(dout_seed), dtype=torch.float64).to(out.dtype)
    (out * dout).sum().backward()
    return out.detach(), [x.grad for x in xs]


def assert_all_close(got, want, names, rtol, atol_frac):
    for g, w, name in zip(got, want, names):
        assert g is not None, f"{name} got no gradient"
        assert g.shape == w.shape, f"{name}: shape {tuple(g.shape)} vs {tuple(w.shape)}"
        atol = atol_frac * max(1.0, w.abs().max().item())
        torch.testing.assert_close(g.double(), w.double(), rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


# ---- refinement ------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
def test_refine_attention_gradients_match_torch_autograd(form):
    xs = refine_inputs(form=form)
    out, got = grads_of(lambda a, v, w1, w2: attn.refine_attention(a, v, w1, w2, form, gamma=0.3), xs)
    want_out, want = grads_of(lambda a, v, w1, w2: refine_torch(a, v, w1, w2, form, 0.3), xs)
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-12)
    # a's gradient in every entry, those above the diagonal included (autograd of a @ w1)
    assert_all_close(got, want, ("a", "v", "w1", "w2"), rtol=1e-9, atol_frac=1e-11)


@pytest.mark.parametrize("form", FORMS)
def test_refine_attention_float32_gradients_are_near_float64(form):
    # 37 positions: the fast form's 32-row blocks and a ragged one; leading dims (2, 2)
    xs = refine_inputs(lead=(2, 2), n=37, dv=5, r=3, form=form, seed=3)
    _, want = grads_of(lambda a, v, w1, w2: refine_torch(a, v, w1, w2, form, 0.3), xs)
    _, got = grads_of(lambda a, v, w1, w2: attn.refine_attention(a, v, w1, w2, form, gamma=0.3),
                      [x.float() for x in xs])
    assert all(g.dtype == torch.float32 for g in got)
    assert_all_close(got, want, ("a", "v", "w1", "w2"), rtol=1e-4, atol_frac=2e-5)


def test_refine_attention_gradient_flows_to_the_weights_alone():
    a, v, w1, w2 = refine_inputs()
    w1.requires_grad_()
    out = attn.refine_attention(a.numpy(), v.numpy(), w1, w2, "simple")  # NumPy a and v: constants
    assert isinstance(out, torch.Tensor) and out.requires_grad
    out.sum().backward()
    w1_ = w1.detach().clone().requires_grad_()
    refine_torch(a, v, w1_, w2, "simple", 0.5).sum().backward()
    torch.testing.assert_close(w1.grad, w1_.grad, rtol=1e-9, atol=1e-12)


def test_refine_attention_bad_input_is_named_on_the_differentiable_path():
    a, v, w1, w2 = leaves(refine_inputs())
    with pytest.raises(ValueError, match=r"w2 must have the shape of w1"):
        attn.refine_attention(a, v, w1, w2[:, :1])
    with pytest.raises(ValueError, match=r"v must have shape \(2, 7\) \+ \(dv,\)"):
        attn.refine_attention(a, v[:, :3], w1, w2)
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\]"):
        attn.refine_attention(a, v, w1, w2, "additive", gamma=1.5)


def test_refine_attention_double_backward_is_refused_by_name():
    a, v, w1, w2 = leaves(refine_inputs())
    (g,) = torch.autograd.grad(attn.refine_attention(a, v, w1, w2).sum(), w1, create_graph=True)
    with pytest.raises(RuntimeError, match="attn.refine_attention: double backward is not supported"):
        g.sum().backward()


# ---- SANA ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bias", [True, False])
def test_lite_la_gradients_match_torch_autograd(bias):
    c, hd = 16, 4
    x = torch.randn(2, 6, c, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    qkv, proj, pb = sana_weights(c)[:3]
    xs = [x, qkv, proj] + ([pb] if bias else [])
    names = ("x", "qkv_weight", "proj_weight", "proj_bias")

    def ours(x, qkv, proj, *b):
        return attn.lite_la(x, qkv, proj, b[0] if b else None, head_dim=hd)

    def plain(x, qkv, proj, *b):
        return lite_la_torch(x, qkv, proj, b[0] if b else None, hd)

    out, got = grads_of(ours, xs)
    want_out, want = grads_of(plain, xs)
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-12)
    assert_all_close(got, want, names, rtol=1e-9, atol_frac=1e-11)
    # float32: the fast form, through the `sana` mechanism's backward
    _, got32 = grads_of(ours, [t.float() for t in xs])
    assert_all_close(got32, want, names, rtol=1e-4, atol_frac=2e-5)


def test_mix_ffn_gradients_match_torch_autograd_in_the_weights_shapes():
    c, h, hw = 12, 5, (3, 5)
    x = torch.randn(2, 15, c, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    xs = [x] + sana_weights(c, h)[3:]
    names = ("x", "inverted_weight", "inverted_bias", "depth_weight", "depth_bias", "point_weight")
    out, got = grads_of(lambda x, *w: attn.mix_ffn(x, hw, *w), xs)
    want_out, want = grads_of(lambda x, *w: mix_ffn_torch(x, hw, *w), xs)
    torch.testing.assert_close(out, want_out, rtol=1e-10, atol=1e-12)
    assert_all_close(got, want, names, rtol=1e-9, atol_frac=1e-11)  # (2h, C, 1, 1) gets (2h, C, 1, 1), ...
    _, got32 = grads_of(lambda x, *w: attn.mix_ffn(x, hw, *w), [t.float() for t in xs])
    assert_all_close(got32, want, names, rtol=1e-4, atol_frac=2e-5)


def test_sana_block_gradients_match_torch_autograd():
    c, h, hd, hw = 16, 6, 8, (2, 3)
    x = torch.randn(2, 6, c, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    xs = [x] + sana_weights(c, h, seed=7)
    names = ("x", "qkv", "proj", "proj_bias", "inverted", "inverted_bias", "depth", "depth_bias", "point")
    out, got = grads_of(lambda x, *w: attn.sana_block(x, hw, *w, head_dim=hd), xs)
    want_out, want = grads_of(lambda x, *w: sana_block_torch(x, hw, *w, head_dim=hd), xs)
    torch.testing.assert_close(out, want_out, rtol=1e-9, atol=1e-11)
    assert_all_close(got, want, names, rtol=1e-8, atol_frac=1e-10)
    # and the differentiable block's value is the C++ block's
    with torch.no_grad():
        torch.testing.assert_close(out, attn.sana_block(x, hw, *xs[1:], head_dim=hd), rtol=1e-10, atol=1e-12)


# ---- the ops: opcheck and torch.compile --------------------------------------------------------------


def test_the_ops_pass_opcheck():
    a, v, w1, w2 = leaves(refine_inputs(form="additive"))
    torch.library.opcheck(torch.ops.attn.refine_attention.default, (a, v, w1, w2, "additive", 0.3, 1e-4, 0))
    c = 8
    x = torch.randn(2, 6, c, dtype=torch.float64).requires_grad_()
    qkv, proj, pb, inv, inv_b, dw, dw_b, point = leaves(sana_weights(c, 3))
    torch.library.opcheck(torch.ops.attn.lite_la.default, (x, qkv, proj, pb, 4, 1e-15, 0))
    torch.library.opcheck(torch.ops.attn.lite_la.default, (x, qkv, proj, None, 4, 1e-15, 0))
    flat = [t.detach().reshape(t.shape[0], -1).requires_grad_() for t in (inv, dw, point)]
    torch.library.opcheck(torch.ops.attn.mix_ffn.default, (x, 2, 3, flat[0], inv_b, flat[1], dw_b, flat[2], 0))
    dout = torch.randn(2, 6, c, dtype=torch.float64)
    torch.library.opcheck(torch.ops.attn.mix_ffn_backward.default,
                          (dout, x.detach(), 2, 3, *(t.detach() for t in (flat[0], inv_b, flat[1], dw_b, flat[2])), 0))


def test_compile_fullgraph_traces_forward_and_backward():
    def loss(a, v, w1, w2, x, qkv, proj, inv, inv_b, dw, dw_b, point):
        r = attn.refine_attention(a, v, w1, w2, "stochastic")
        s = attn.mix_ffn(attn.lite_la(x, qkv, proj, head_dim=4), (2, 3), inv, inv_b, dw, dw_b, point)
        return (r ** 2).sum() + (s ** 2).sum()

    c = 8
    x = torch.randn(2, 6, c)
    ws = sana_weights(c, 3, dtype=torch.float32)
    inputs = [t.float() for t in refine_inputs(form="stochastic")] + [x, ws[0], ws[1]] + ws[3:]
    grads = []
    for fn in (torch.compile(loss, fullgraph=True, backend="aot_eager"), loss):
        xs = leaves(inputs)
        fn(*xs).backward()
        grads.append([t.grad for t in xs])
    for g_compiled, g_eager in zip(*grads):
        assert torch.equal(g_compiled, g_eager)


def test_no_grad_keeps_the_plain_path():
    a, v, w1, w2 = leaves(refine_inputs())
    with torch.no_grad():
        out = attn.refine_attention(a, v, w1, w2)
    assert not out.requires_grad
    np.testing.assert_allclose(out.numpy(), refine_torch(a, v, w1, w2, "simple", 0.5).detach().numpy(), rtol=1e-10)
