"""Concentration measures on arrays and the closed forms of attn.theory (the quadrature and Monte
Carlo checks of the closed forms are in tests/concentration/test_theory.cpp)."""
import math

import numpy as np
import pytest

import attn
from hypothesis import given, settings, strategies as st


def test_measures_equal_their_numpy_definitions_along_any_axis():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 4, 17))
    for axis in (0, 1, 2, -1):
        x = np.moveaxis(a, axis, -1)
        s = np.abs(x).mean(-1) / np.sqrt((x * x).mean(-1))
        assert np.allclose(attn.sparsity(a, axis=axis), s, rtol=1e-13, atol=0)
        m = np.abs(x).max(-1) / np.abs(x).sum(-1)
        assert np.allclose(attn.max_weight(a, axis=axis), m, rtol=1e-13)
        top3 = -np.sort(-np.abs(x), -1)[..., :3].sum(-1) / np.abs(x).sum(-1)
        assert np.allclose(attn.topk_mass(a, 3, axis=axis), top3, rtol=1e-13)
    p = np.abs(a)
    q = p / p.sum(-1, keepdims=True)
    h = -(q * np.log(q)).sum(-1)
    assert np.allclose(attn.entropy(p), h, rtol=1e-13)
    assert np.allclose(attn.effective_keys(p), np.exp(h), rtol=1e-13)


def test_measures_of_real_attention_rows():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 64, 16, generator=g) for _ in range(3))
    out, probs = attn.attention(q, k, v, causal=True, return_probs=True, layout="bhnd")
    s, h = attn.sparsity(probs), attn.entropy(probs)
    assert s.shape == h.shape == (1, 2, 64)
    # row i sees i + 1 keys: S in [1/sqrt(i+1), 1] over its visible keys, entropy <= log(i + 1);
    # over all 64 positions the invisible zeros lower S by sqrt((i+1)/64)
    n_vis = np.arange(1, 65)
    assert np.all(h <= np.log(n_vis) + 1e-9) and np.all(h >= -1e-12)
    assert np.all(s <= np.sqrt(n_vis / 64) + 1e-9) and np.all(s >= 1 / 8 - 1e-12)
    assert np.allclose(h[..., 0], 0) and np.allclose(s[..., 0], 1 / 8)  # the first query sees one key
    summary = attn.summarize(s, axis=(0, 2))
    assert summary["mean"].shape == (2,) and np.all(summary["q0.1"] <= summary["q0.5"]) and np.all(summary["q0.5"] <= summary["q0.9"])


def test_summarize_keeps_each_statistic_apart():
    # a Stats (four different statistics) used to be stacked into one array and averaged together
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 16, 2, 8)).astype(np.float32) for _ in range(3))
    out, stats = attn.attend(q, k, v, "softmax:causal", return_stats=True)
    summary = attn.summarize(stats, axis=(0, 2))
    assert set(summary) == {"sparsity", "entropy", "max_weight", "topk_mass"}
    for name in summary:
        alone = attn.summarize(getattr(stats, name), axis=(0, 2))
        assert set(summary[name]) == {"mean", "q0.1", "q0.5", "q0.9"}
        for key in alone:
            assert np.array_equal(summary[name][key], alone[key]), (name, key)
    assert not np.allclose(summary["sparsity"]["mean"], summary["entropy"]["mean"])
    assert set(attn.summarize({"a": [1.0, 2.0], "b": None})) == {"a"}


def test_undefined_rows_and_bad_arguments():
    z = np.zeros((2, 5))
    assert np.isnan(attn.sparsity(z)).all() and np.isnan(attn.entropy(z)).all()
    with pytest.raises(ValueError, match="p: entropy: weights must be non-negative"):
        attn.entropy([[0.5, -0.1, 0.6]])
    with pytest.raises(ValueError, match="k: expected >= 1, got 0"):
        attn.topk_mass([[1.0, 2.0]], 0)
    with pytest.raises(ValueError, match="axis: expected an axis of the 2-D array"):
        attn.sparsity(z, axis=2)
    with pytest.raises(ValueError, match="scalar"):
        attn.sparsity(3.0)


def test_theory_closed_forms():
    assert attn.theory.sparsity_exp(1.3, 2.0) == pytest.approx(math.exp(-2.0), rel=1e-15)
    assert attn.theory.sparsity_relu2(0.0, 0.7) == pytest.approx(1 / math.sqrt(6), rel=1e-14)
    assert attn.theory.sparsity_identity(0.0, 2.0) == pytest.approx(math.sqrt(2 / math.pi), rel=1e-14)
    gam = np.array([0.25, 1.0, 4.0])
    assert np.allclose(attn.theory.sparsity_exp(0.0, gam), np.exp(-gam ** 2 / 2), rtol=1e-15)
    # relu^2 depends on beta/gamma alone; identity is even in beta
    assert attn.theory.sparsity_relu2(-1.0, 0.5) == pytest.approx(attn.theory.sparsity_relu2(-4.0, 2.0), rel=1e-12)
    assert attn.theory.sparsity_identity(-1.5, 0.8) == pytest.approx(attn.theory.sparsity_identity(1.5, 0.8), rel=1e-15)
    # the literal 1 + erf(u) form: fine at t = -2, nothing at t = -8
    assert attn.theory.sparsity_relu2_erf_form(-2.0, 1.0) == pytest.approx(attn.theory.sparsity_relu2(-2.0, 1.0), rel=1e-9)
    stable, literal = attn.theory.sparsity_relu2(-8.0, 1.0), attn.theory.sparsity_relu2_erf_form(-8.0, 1.0)
    assert 0 < stable < 1e-6 and (math.isnan(literal) or abs(literal / stable - 1) > 0.5)
    # decay: the explicit row, and -> 0 with n
    row = 0.9 ** np.arange(999, -1, -1)
    assert attn.theory.sparsity_decay(0.9, 1000) == pytest.approx(float(attn.sparsity(row)), rel=1e-12)
    assert attn.theory.sparsity_linear_iid([1.0, 1.0], 1.0, 1.0) == pytest.approx(1 / math.sqrt(1.5), rel=1e-15)
    with pytest.raises(ValueError, match="gamma must be a finite number > 0"):
        attn.theory.sparsity_exp(0.0, -1.0)


# ---- streamed statistics: attend(..., return_stats=True) -------------------------------------------

def _measures(w, k):
    """The four statistics of one row of weights held in memory (float64)."""
    w = np.asarray(w, np.float64)
    ent = attn.entropy(np.abs(w)) if np.all(w >= 0) else np.nan
    return np.array([attn.sparsity(w), ent, attn.max_weight(w), attn.topk_mass(w, k)])


@pytest.mark.parametrize("mechanism", ["softmax", "softmax:causal", "softmax:window=4:2,softcap=5",
                                       "longformer:window=3:3,global=0;9", "lsh:buckets=4,rounds=2,chunk=8,seed=1",
                                       "dca:chunk=8,local=3", "gau", "linear:map=elu", "linear:map=identity",
                                       "retention:decay=0.7"])
def test_streamed_statistics_are_the_measures_of_the_applied_weights(mechanism):
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, 24, 4, 16)).astype(np.float32) for _ in range(3))  # (B, N, H, D)
    if mechanism.startswith("retention"):  # causal: N = M, as given
        pass
    _, st = attn.attend(q, k, v, mechanism, return_stats=True, stats_topk=3)
    _, probs = attn.attend(q, k, v, mechanism, return_probs=True, use_reference=True)
    assert st.sparsity.shape == (2, 4, 24) and st.sparsity.dtype == np.float32
    got = np.stack(st, axis=-1)
    causal = "causal" in mechanism or mechanism.startswith("retention")
    for b in range(2):
        for h in range(4):
            for i in range(24):
                row = probs[b, h, i]
                if mechanism.startswith(("linear", "gau", "retention")):
                    row = row[: i + 1] if causal else row  # every key the row may see, zeros included
                else:
                    row = row[row != 0]  # softmax families: the visible keys (none underflows here)
                want = _measures(row, 3)
                np.testing.assert_allclose(got[b, h, i], want, rtol=2e-4, atol=2e-5, equal_nan=True,
                                           err_msg=f"{mechanism} row {(b, h, i)}")


def test_streamed_statistics_of_rows_without_keys_and_bad_arguments():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 5, 2, 8)).astype(np.float32)
    k = rng.standard_normal((1, 3, 2, 8)).astype(np.float32)
    # causal, bottom-right: with N = 5 > M = 3 the first two queries see no key
    _, st = attn.attend(q, k, k, "softmax:causal", return_stats=True)
    assert np.all(np.isnan(np.stack(st)[:, 0, :, :2])) and not np.any(np.isnan(np.stack(st)[:, 0, :, 2:]))
    one = np.stack(st)[:, 0, :, 2]  # one key: S = 1, entropy 0, all weight on it
    np.testing.assert_array_equal(one, np.array([[1, 1], [0, 0], [1, 1], [1, 1]], np.float32))
    with pytest.raises(ValueError, match=r"stats_topk must be in \[1, 1024\], got 0"):
        attn.attend(q, k, k, return_stats=True, stats_topk=0)
    with pytest.raises(TypeError, match="stats_topk must be an integer"):
        attn.attend(q, k, k, return_stats=True, stats_topk=2.0)
    assert "stats" not in attn.explain(q, k, k, "softmax", return_stats=True).split("chosen")[0].split("\n")[-1]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 70), m=st.integers(1, 70), d=st.sampled_from([1, 5, 16]), topk=st.integers(1, 80),
       causal=st.booleans(), seed=st.integers(0, 2**16))
def test_streamed_statistics_property(n, m, d, topk, causal, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, n, 2, d)).astype(np.float32) * 2
    k = rng.standard_normal((1, m, 1, d)).astype(np.float32) * 2
    mech = "softmax:causal" if causal else "softmax"
    _, st = attn.attend(q, k, k, mech, return_stats=True, stats_topk=topk)
    _, probs = attn.attend(q, k, k, mech, return_probs=True, use_reference=True)
    for h in range(2):
        for i in range(n):
            seen = (i + m - n) + 1 if causal else m  # bottom-right causal alignment
            seen = max(0, min(seen, m))
            s, e, mx, tm = (x[0, h, i] for x in st)
            if seen == 0:
                assert np.isnan([s, e, mx, tm]).all()
                continue
            row = probs[0, h, i, :seen]
            assert 1 / np.sqrt(seen) - 1e-5 <= s <= 1 + 1e-6 and -1e-6 <= e <= np.log(seen) + 1e-5
            assert mx <= tm + 1e-6 <= 1 + 2e-6
            if topk >= seen:
                assert tm == 1.0
            np.testing.assert_allclose([s, e, mx, tm], _measures(row, topk), rtol=2e-4, atol=2e-5)
