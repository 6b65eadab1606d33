"""Attention-weight refinement (our reading of Liu et al. 2024 [unverified]): attn.refine_attention
against a NumPy float64 transcription of the formulas, the forms' invariants, torch in/out and bad
input."""
import numpy as np
import pytest
import torch

import attn

FORMS = ["simple", "value_weighted", "additive", "stochastic"]


def causal_weights(shape, n, seed):
    s = np.random.default_rng(seed).standard_normal(tuple(shape) + (n, n)) * 1.5
    s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def softmax_causal(s):
    n = s.shape[-1]
    s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def numpy_refine(a, v, w1, w2, form, gamma):
    r = w1.shape[1]
    if form == "stochastic":
        mu = a @ w1
        x = a @ w2
        sig = np.where(x > 0, x + 1, np.exp(x))
        d = ((mu[..., :, None, :] - mu[..., None, :, :]) ** 2).sum(-1) + \
            ((sig[..., :, None, :] - sig[..., None, :, :]) ** 2).sum(-1)
        hat = softmax_causal(-d)
    else:
        hat = softmax_causal((a @ w1) @ np.swapaxes(a @ w2, -1, -2) / np.sqrt(r))
    R = {"simple": hat, "stochastic": hat, "value_weighted": hat @ a,
         "additive": (1 - gamma) * a + gamma * hat}[form]
    return R @ v, R


@pytest.mark.parametrize("form", FORMS)
def test_matches_numpy_formulas_in_both_dtypes(form):
    n, r, dv = 35, 4, 6
    rng = np.random.default_rng(1)
    a = causal_weights((2, 3), n, 2)
    v = rng.standard_normal((2, 3, n, dv))
    scale = 0.6 if form == "stochastic" else 2.0
    w1, w2 = rng.standard_normal((n, r)) * scale, rng.standard_normal((n, r)) * scale
    want, R = numpy_refine(a, v, w1, w2, form, 0.3)
    got = attn.refine_attention(a, v, w1, w2, form=form, gamma=0.3)
    assert got.shape == (2, 3, n, dv) and got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(attn.refined_weights(a, w1, w2, form=form, gamma=0.3), R, rtol=0, atol=1e-12)
    f32 = attn.refine_attention(*(x.astype(np.float32) for x in (a, v, w1, w2)), form=form, gamma=0.3)
    assert f32.dtype == np.float32
    np.testing.assert_allclose(f32, want, rtol=0, atol=3e-5)


def test_invariants_of_the_spec():
    n, dv = 7, 3
    rng = np.random.default_rng(3)
    a = causal_weights((), n, 4)
    v = rng.standard_normal((n, dv))
    w1, w2 = rng.standard_normal((n, 3)) * 2, rng.standard_normal((n, 3)) * 2
    for form in FORMS:
        R = attn.refined_weights(a, w1, w2, form=form)
        np.testing.assert_allclose(R.sum(-1), 1, atol=1e-12)
        assert np.all(np.triu(R, 1) == 0)
    zero = np.zeros((n, 3))
    uniform = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    np.testing.assert_allclose(attn.refined_weights(a, zero, zero), uniform, atol=1e-15)
    np.testing.assert_allclose(attn.refine_attention(a, v, w1, w2, form="additive", gamma=0.0), a @ v, atol=1e-14)


def test_torch_in_torch_out():
    n = 9
    a = torch.from_numpy(causal_weights((2,), n, 5)).float()
    v, w1, w2 = torch.randn(2, n, 4), torch.randn(n, 2), torch.randn(n, 2)
    out = attn.refine_attention(a, v, w1, w2, form="value_weighted")
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.shape == (2, n, 4)
    want, _ = numpy_refine(a.double().numpy(), v.double().numpy(), w1.double().numpy(), w2.double().numpy(),
                           "value_weighted", 0.5)
    np.testing.assert_allclose(out.numpy(), want, atol=3e-5)


def test_bad_input_names_the_argument():
    n = 4
    a = causal_weights((), n, 6)
    v, w = np.ones((n, 2)), np.full((n, 2), 0.1)
    with pytest.raises(ValueError, match=r"a must be square"):
        attn.refine_attention(np.ones((3, 4)) / 4, v, w, w)
    bad = a.copy()
    bad[0, 2] = 0.5
    with pytest.raises(ValueError, match=r"a must be causal .* got a\[0\]\[2\] = 0.5"):
        attn.refine_attention(bad, v, w, w)
    bad = a.copy()
    bad[3] *= 2
    with pytest.raises(ValueError, match=r"every row of a must sum to 1 .* got sum of a\[3\] = 2"):
        attn.refine_attention(bad, v, w, w)
    with pytest.raises(ValueError, match=r"gamma must be in \[0, 1\], got -0.1"):
        attn.refine_attention(a, v, w, w, form="additive", gamma=-0.1)
    with pytest.raises(ValueError, match=r"form must be one of"):
        attn.refine_attention(a, v, w, w, form="nope")
    with pytest.raises(ValueError, match=r"v must have shape \(4,\) \+ \(dv,\)"):
        attn.refine_attention(a, np.ones((5, 2)), w, w)
    with pytest.raises(ValueError, match=r"w2 must have the shape of w1"):
        attn.refine_attention(a, v, w, np.ones((n, 3)))
    with pytest.raises(ValueError, match=r"w_mu must have N = 4 rows"):
        attn.refine_attention(a, v, np.ones((3, 2)), np.ones((3, 2)), form="stochastic")


def test_refined_weights_of_a_torch_input_that_requires_grad_warn_and_are_detached():
    # refine_attention trains (test_block_gradients_refinement_sana.py); refined_weights has no gradient
    n = 5
    a = torch.from_numpy(causal_weights((), n, 8)).requires_grad_()
    with pytest.warns(RuntimeWarning, match="the refinement functions have no backward pass"):
        out = attn.refined_weights(a, torch.randn(n, 2, dtype=torch.float64), torch.randn(n, 2, dtype=torch.float64))
    assert not out.requires_grad
