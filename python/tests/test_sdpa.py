"""attn.scaled_dot_product_attention against torch.nn.functional.scaled_dot_product_attention on a
grid of its arguments: both in float32 against torch's own float64 result, attn's error at most
twice torch's plus a floor (the project's rule), gradients included."""
import itertools

import numpy as np
import pytest

import attn

torch = pytest.importorskip("torch")
F = torch.nn.functional

FLOOR = 2e-6  # float32 rounding of outputs of magnitude ~1


def _inputs(B, Hq, H, L, S, E, Ev, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, L, E, generator=g)
    k = torch.randn(B, H, S, E, generator=g)
    v = torch.randn(B, H, S, Ev, generator=g)
    return q, k, v


def _mask(kind, B, Hq, L, S, seed):
    g = torch.Generator().manual_seed(seed + 1)
    if kind is None:
        return None
    shape = {"LS": (L, S), "B1LS": (B, 1, L, S), "BHLS": (B, Hq, L, S)}[kind[1]]
    if kind[0] == "bool":
        m = torch.rand(*shape, generator=g) < 0.7
        m[..., 0] = True  # every row sees a key (torch's math path gives NaN for a row that sees none)
        return m
    return torch.randn(*shape, generator=g)


def _check(ours, theirs, ref, what):
    err_ours = (ours.double() - ref).abs().max().item()
    err_torch = (theirs.double() - ref).abs().max().item()
    assert err_ours <= 2 * err_torch + FLOOR, f"{what}: attn err {err_ours:.3g}, torch err {err_torch:.3g}"


GRID = list(itertools.product(
    [(1, 2, 2), (2, 4, 2), (1, 4, 1)],          # (B, Hq, H)
    [(16, 16), (7, 19), (19, 7), (1, 33)],      # (L, S)
    [None, ("bool", "LS"), ("float", "B1LS"), ("bool", "BHLS")],
    [False, True],                              # is_causal
    [None, 0.3],                                # scale
))


@pytest.mark.parametrize("heads,ls,mask,causal,scale", GRID)
def test_matches_torch_forward_and_backward(heads, ls, mask, causal, scale):
    (B, Hq, H), (L, S) = heads, ls
    if causal and mask is not None:
        return  # torch refuses the pair (test_refusals)
    q, k, v = _inputs(B, Hq, H, L, S, 8, 5, seed=L * 31 + S)
    m = _mask(mask, B, Hq, L, S, seed=L + S)
    kw = dict(attn_mask=m, is_causal=causal, scale=scale, enable_gqa=Hq != H)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    ours = attn.scaled_dot_product_attention(*leaves, **kw)
    tleaves = [t.clone().requires_grad_() for t in (q, k, v)]
    theirs = F.scaled_dot_product_attention(*tleaves, **kw)
    dleaves = [t.double().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*dleaves, **{**kw, "attn_mask": m.double() if m is not None and
                                                       m.dtype != torch.bool else m})
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    _check(ours.detach(), theirs.detach(), ref.detach(), "out")
    dout = torch.randn_like(theirs)
    ours.backward(dout), theirs.backward(dout), ref.backward(dout.double())
    for name, a, b, r in zip("qkv", leaves, tleaves, dleaves):
        err_ours = (a.grad.double() - r.grad).abs().max().item()
        err_torch = (b.grad.double() - r.grad).abs().max().item()
        assert err_ours <= 3 * err_torch + 4 * FLOOR, f"d{name}: attn err {err_ours:.3g}, torch err {err_torch:.3g}"


def test_causal_is_top_left_when_queries_and_keys_differ():
    """torch's is_causal with L < S: query i sees keys 0..i (attn.attention's causal sees 0..i+S-L)."""
    q, k, v = _inputs(1, 2, 2, 3, 8, 4, 4, seed=5)
    ours = attn.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(ours, F.scaled_dot_product_attention(q, k, v, is_causal=True), rtol=1e-5, atol=1e-6)
    bottom_right = attn.attention(q, k, v, causal=True, layout="bhnd")
    assert not torch.allclose(ours, bottom_right)
    # the first query sees key 0 only: its output is v's first row
    torch.testing.assert_close(ours[0, :, 0], v[0, :, 0], rtol=1e-6, atol=1e-6)


def test_three_dimensional_inputs_and_numpy():
    q, k, v = _inputs(1, 3, 3, 6, 9, 8, 8, seed=2)
    ours = attn.scaled_dot_product_attention(q[0], k[0], v[0])
    torch.testing.assert_close(ours, F.scaled_dot_product_attention(q[0], k[0], v[0]), rtol=1e-5, atol=1e-6)
    out_np = attn.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), is_causal=True, scale=0.5)
    assert isinstance(out_np, np.ndarray)
    np.testing.assert_allclose(out_np, F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5).numpy(),
                               rtol=1e-5, atol=1e-6)


def test_dropout_keeps_the_expectation_and_follows_torch_manual_seed():
    q, k, v = _inputs(1, 2, 2, 64, 64, 16, 16, seed=9)
    torch.manual_seed(3)
    a = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(3)
    b = attn.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert torch.equal(a, b)
    full = attn.scaled_dot_product_attention(q, k, v)
    assert not torch.allclose(a, full)
    mean = torch.stack([attn.scaled_dot_product_attention(q, k, v, dropout_p=0.5) for _ in range(200)]).mean(0)
    assert (mean - full).abs().mean().item() < 0.05 * full.abs().mean().item() + 0.02


def test_refusals_name_the_argument_as_torch_does():
    q, k, v = _inputs(1, 4, 2, 5, 5, 8, 8, seed=1)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        attn.scaled_dot_product_attention(q, k, v)
    q2, k2, v2 = _inputs(1, 2, 2, 5, 5, 8, 8, seed=1)
    with pytest.raises(ValueError, match="attn_mask and is_causal"):
        attn.scaled_dot_product_attention(q2, k2, v2, attn_mask=torch.ones(5, 5, dtype=torch.bool), is_causal=True)
    with pytest.raises(TypeError, match="^is_causal"):
        attn.scaled_dot_product_attention(q2, k2, v2, is_causal="yes")
    with pytest.raises(TypeError, match="^scale"):
        attn.scaled_dot_product_attention(q2, k2, v2, scale="0.5")
    with pytest.raises(ValueError, match=r"^query must be \(B, H, L, E\) or \(H, L, E\)"):
        attn.scaled_dot_product_attention(q2[0, 0], k2[0, 0], v2[0, 0])
    with pytest.raises(ValueError, match="^key must have query's 4 dimensions"):
        attn.scaled_dot_product_attention(q2, k2[0], v2)
