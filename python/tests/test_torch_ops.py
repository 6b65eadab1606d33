"""attn as torch custom ops: autograd through attn.attend / attn.attention equals torch autograd of
the float64 literal, torch.library.opcheck passes, torch.compile(fullgraph=True) traces forward and
backward without a graph break."""
import pytest
import torch

import attn
from attn import torch_ops
from conftest import literal_attention


def tensors(seed, B=2, N=9, M=13, H=4, Hkv=2, D=8, Dv=6, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, N, H, D, generator=g, dtype=dtype).requires_grad_()
    k = torch.randn(B, M, Hkv, D, generator=g, dtype=dtype).requires_grad_()
    v = torch.randn(B, M, Hkv, Dv, generator=g, dtype=dtype).requires_grad_()
    return q, k, v


def literal_grads(q, k, v, dout, **kw):
    q64, k64, v64 = (x.detach().double().transpose(1, 2).requires_grad_() for x in (q, k, v))
    out, _ = literal_attention(q64, k64, v64, **kw)
    out.backward(dout.double().transpose(1, 2))
    return [x.grad.transpose(1, 2) for x in (q64, k64, v64)]


@pytest.mark.parametrize("causal,window,softcap", [(False, (-1, -1), 0.0), (True, (-1, -1), 0.0),
                                                   (True, (4, 0), 5.0)])
def test_attention_backward_equals_autograd_of_the_float64_literal(causal, window, softcap):
    q, k, v = tensors(1)
    out = attn.attention(q, k, v, causal=causal, window_size=window, softcap=softcap)
    assert out.requires_grad and out.grad_fn is not None
    dout = torch.randn_like(out)
    out.backward(dout)
    want = literal_grads(q, k, v, dout, causal=causal, window=window, softcap=softcap)
    for name, x, w in zip(("q", "k", "v"), (q, k, v), want):
        err = (x.grad.double() - w).abs().max().item()
        assert err <= 1e-5 * max(1.0, w.abs().max().item()), f"d{name}: {err:.3g}"


def test_attend_with_masks_padding_and_alibi_is_differentiable():
    q, k, v = tensors(2)
    mask = torch.rand(2, 1, 9, 13, generator=torch.Generator().manual_seed(3)) > 0.3
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    out, lse = attn.attend(q, k, v, "softmax:causal", attn_mask=mask, key_padding_lengths=[13, 7],
                           alibi_slopes=slopes, return_lse=True)
    dout = torch.randn_like(out)
    out.backward(dout)
    want = literal_grads(q, k, v, dout, causal=True, mask=mask, kv_len=[13, 7], alibi=slopes)
    for x, w in zip((q, k, v), want):
        assert (x.grad.double() - w).abs().max().item() <= 1e-5 * max(1.0, w.abs().max().item())


def test_unsupported_options_and_families_say_so():
    q, k, v = tensors(4)
    with pytest.raises(ValueError, match="block_mask"):  # a tensor option: named, not compared with ==
        attn.attend(q, k, v, block_mask=torch.ones(2, 4, 1, 1, dtype=torch.bool))
    with pytest.raises(TypeError, match="causal"):  # flash-attn's flags are checked as without gradients
        attn.attention(q, k, v, causal="no")
    with pytest.raises(ValueError, match="return_probs"):
        attn.attend(q, k, v, return_probs=True)
    out = attn.attend(q, k, v, "qsoftmax")  # every family has a backward now (qsoftmax's: right)
    out.sum().backward()
    assert all(x.grad is not None and torch.isfinite(x.grad).all() for x in (q, k, v))
    with torch.no_grad():  # no gradient wanted: the ordinary path, every option
        assert attn.attend(q, k, v, return_probs=True)[1].shape == (2, 4, 9, 13)


def test_opcheck():
    q, k, v = tensors(5)
    torch.library.opcheck(torch.ops.attn.attend.default, (q, k, v, "softmax:causal", "bnhd", None, [], None))
    out, lse = torch.ops.attn.attend(q, k, v, "softmax:causal", "bnhd", None, [], None)
    torch.library.opcheck(torch.ops.attn.attend_backward.default,
                          (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(),
                           "softmax:causal", "bnhd", None, [], None, torch.randn_like(lse)))


def test_torch_compile_fullgraph_forward_and_backward():
    q, k, v = tensors(6)

    def loss(q, k, v):
        return (attn.attention(q, k, v, causal=True) ** 2).sum()

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    got = compiled(q, k, v)
    got.backward()
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    want = loss(q, k, v)
    want.backward()
    assert torch.allclose(got, want)
    for g, x in zip(grads, (q, k, v)):
        assert torch.equal(g, x.grad)


def test_the_gradient_through_lse():
    """A loss that uses lse (as merging partial results does): d lse_i / d t_ij = P_ij."""
    q, k, v = tensors(7)
    out, lse = attn.attend(q, k, v, "softmax:causal", return_lse=True)
    (out.sum() + (lse * torch.linspace(-1, 1, lse.numel()).view_as(lse)).sum()).backward()
    q64, k64, v64 = (x.detach().double().transpose(1, 2).requires_grad_() for x in (q, k, v))
    o64, l64 = literal_attention(q64, k64, v64, causal=True)
    w = torch.linspace(-1, 1, lse.numel()).view_as(lse).double()
    (o64.sum() + (l64 * w).sum()).backward()
    for x, x64 in zip((q, k, v), (q64, k64, v64)):
        want = x64.grad.transpose(1, 2)
        assert (x.grad.double() - want).abs().max().item() <= 1e-5 * max(1.0, want.abs().max().item())
