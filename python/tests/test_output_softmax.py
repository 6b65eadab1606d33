"""Output-layer softmax variants: log_softmax, word2vec's hierarchical softmax and
torch's AdaptiveLogSoftmaxWithLoss, on worked cases with known answers, against float64 formulas and
against torch's module given the same weights."""
import math

import numpy as np
import pytest
import torch

import attn


# ---- log_softmax ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-6), (np.float64, 1e-13)])
def test_log_softmax_rows_have_logsumexp_zero_and_match_float64(dtype, tol):
    x = (np.random.default_rng(0).standard_normal((5, 63)) * 4).astype(dtype)
    y = attn.log_softmax(x)
    assert y.dtype == dtype and y.shape == x.shape
    x64 = x.astype(np.float64)
    ref = x64 - x64.max(1, keepdims=True) - np.log(np.exp(x64 - x64.max(1, keepdims=True)).sum(1, keepdims=True))
    np.testing.assert_allclose(y, ref, rtol=0, atol=tol * 4)
    lse = np.log(np.exp(y.astype(np.float64)).sum(1))
    np.testing.assert_allclose(lse, 0, atol=tol * 4)


def test_log_softmax_shift_invariance_large_values_and_minus_inf():
    x = np.random.default_rng(1).standard_normal((3, 10))
    np.testing.assert_allclose(attn.log_softmax(x + 777.25), attn.log_softmax(x), atol=1e-11)
    for big in (1000.0, -1000.0):
        for dt in (np.float32, np.float64):
            y = attn.log_softmax(np.array([big, big], dt))
            np.testing.assert_allclose(y, [-math.log(2)] * 2, rtol=1e-6)
    y = attn.log_softmax(np.array([[-np.inf] * 4, [-np.inf, 0, 0, -np.inf]], np.float32))
    assert np.all(y[0] == -np.inf) and not np.isnan(y).any()
    np.testing.assert_allclose(y[1], [-np.inf, -math.log(2), -math.log(2), -np.inf])


def test_log_softmax_any_axis_and_torch_tensors():
    x = np.random.default_rng(2).standard_normal((4, 5, 6)).astype(np.float32)
    for axis in (0, 1, -1, -3):
        np.testing.assert_allclose(attn.log_softmax(x, axis=axis),
                                   torch.log_softmax(torch.from_numpy(x), dim=axis).numpy(), atol=2e-6)
    t = torch.from_numpy(x.astype(np.float64)).transpose(0, 2)  # non-contiguous view
    y = attn.log_softmax(t, axis=1)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float64 and y.shape == t.shape
    torch.testing.assert_close(y, torch.log_softmax(t, dim=1), atol=1e-12, rtol=0)
    assert attn.log_softmax(np.array(3.0)) == 0.0  # a 0-d array: one element
    assert attn.log_softmax(np.zeros((0, 3), np.float32)).shape == (0, 3)


@pytest.mark.parametrize("call,exc,fragment", [
    (lambda: attn.log_softmax(np.zeros((2, 3)), axis=2), ValueError,
     "axis must be in [-2, 1] for x with 2 dimensions, got 2"),
    (lambda: attn.log_softmax(np.zeros(3, np.int64)), TypeError, "x must be float32 or float64, got int64"),
    (lambda: attn.log_softmax(torch.zeros(3, dtype=torch.float16)), TypeError, "got torch.float16"),
    (lambda: attn.log_softmax([1.0, 2.0]), TypeError, "x must be a float32 or float64 numpy.ndarray or torch.Tensor"),
])
def test_log_softmax_bad_input(call, exc, fragment):
    with pytest.raises(exc) as e:
        call()
    assert fragment in str(e.value)


# ---- hierarchical softmax ------------------------------------------------------------------------

def test_hierarchical_codes_of_the_spec_and_powers_of_one_half():
    hs = attn.HierarchicalSoftmax.from_counts([5, 3, 1, 1], np.zeros((3, 4)))
    assert [hs.codes(w) for w in range(4)] == ["1", "01", "001", "000"]
    assert hs.path(3) == [2, 1, 0] and hs.path(0) == [2]  # root V - 2 first
    h = np.random.default_rng(3).standard_normal((2, 4))
    np.testing.assert_allclose(np.exp(hs.log_prob_all(h)), [[1 / 2, 1 / 4, 1 / 8, 1 / 8]] * 2, rtol=1e-15)
    np.testing.assert_allclose(np.exp(hs.log_prob(h, [2, 0])), [1 / 8, 1 / 2], rtol=1e-15)
    # word ids are positions in counts: permuted counts permute the codes (stable on ties)
    perm = attn.HierarchicalSoftmax.from_counts(np.array([1, 5, 1, 3]), np.zeros((3, 1)))
    assert [perm.codes(w) for w in range(4)] == ["001", "1", "000", "01"]


def test_hierarchical_kraft_sum_and_rows_sum_to_one():
    rng = np.random.default_rng(4)
    V, d, N = 500, 24, 7
    counts = rng.integers(1, 1000, V)
    theta = rng.standard_normal((V - 1, d)) * 0.5
    h = rng.standard_normal((N, d))
    hs = attn.HierarchicalSoftmax.from_counts(counts, theta)
    assert sum(2.0 ** -len(hs.codes(w)) for w in range(V)) == pytest.approx(1.0, abs=1e-15)
    # more frequent words never get longer codes (Huffman)
    lengths = np.array([len(hs.codes(w)) for w in range(V)])
    order = np.argsort(-counts, kind="stable")
    assert np.all(np.diff(lengths[order]) >= 0)
    all_lp = hs.log_prob_all(h)
    assert all_lp.shape == (N, V) and all_lp.dtype == np.float64
    np.testing.assert_allclose(np.exp(all_lp).sum(1), 1.0, atol=1e-6)
    targets = rng.integers(0, V, N)
    np.testing.assert_allclose(hs.log_prob(h, targets), all_lp[np.arange(N), targets], atol=1e-12)
    # the float64 formula along one word's path
    w = int(targets[0])
    z = np.array([theta[n] @ h[0] for n in hs.path(w)])
    signs = np.array([1 - 2 * int(b) for b in hs.codes(w)])
    assert all_lp[0, w] == pytest.approx(np.sum(-np.logaddexp(0, -signs * z)), abs=1e-12)


def test_hierarchical_float32_and_torch():
    rng = np.random.default_rng(5)
    theta = torch.from_numpy(rng.standard_normal((99, 16)).astype(np.float32))
    h = torch.from_numpy(rng.standard_normal((6, 16)).astype(np.float32))
    hs = attn.HierarchicalSoftmax.from_counts(torch.arange(100, 0, -1), theta)
    lp = hs.log_prob(h, torch.tensor([0, 5, 99, 3, 3, 50]))
    all_lp = hs.log_prob_all(h)
    assert isinstance(lp, torch.Tensor) and lp.dtype == torch.float32 and all_lp.shape == (6, 100)
    torch.testing.assert_close(lp, all_lp[torch.arange(6), torch.tensor([0, 5, 99, 3, 3, 50])], atol=1e-5, rtol=0)
    torch.testing.assert_close(all_lp.double().exp().sum(1), torch.ones(6, dtype=torch.float64), atol=1e-5, rtol=0)
    hs64 = attn.HierarchicalSoftmax.from_counts(np.arange(100, 0, -1), theta.double().numpy())
    ref = hs64.log_prob_all(h.double().numpy())
    np.testing.assert_allclose(all_lp.numpy(), ref, atol=2e-5)


@pytest.mark.parametrize("call,exc,fragment", [
    (lambda: attn.HierarchicalSoftmax.from_counts([3, 0, 1], np.zeros((2, 2))), ValueError,
     "counts[1] = 0 must be positive"),
    (lambda: attn.HierarchicalSoftmax.from_counts([3, -2, 1], np.zeros((2, 2))), ValueError,
     "counts[1] = -2 must be positive"),
    (lambda: attn.HierarchicalSoftmax.from_counts([3, 2, 1], np.zeros((3, 2))), ValueError,
     "theta must have shape (V - 1, d) = (2, d) for V = 3 counts, got (3, 2)"),
    (lambda: attn.HierarchicalSoftmax.from_counts([3.5, 2], np.zeros((1, 2))), TypeError, "counts must hold integers"),
    (lambda: attn.HierarchicalSoftmax.from_counts([3, 2, 1], np.zeros((2, 2))).log_prob(np.zeros((2, 2)), [0, 3]),
     ValueError, "targets[1] = 3 is outside [0, 3)"),
    (lambda: attn.HierarchicalSoftmax.from_counts([3, 2, 1], np.zeros((2, 2))).log_prob(np.zeros((2, 2)), [0]),
     ValueError, "targets must hold one id per row of h (2), got 1"),
    (lambda: attn.HierarchicalSoftmax.from_counts([3, 2, 1], np.zeros((2, 2))).log_prob_all(np.zeros((2, 3))),
     ValueError, "h must have shape (N, d) = (N, 2), got (2, 3)"),
    (lambda: attn.HierarchicalSoftmax.from_counts([3, 2, 1], np.zeros((2, 2))).codes(3), ValueError,
     "word 3 is outside [0, 3)"),
])
def test_hierarchical_bad_input(call, exc, fragment):
    with pytest.raises(exc) as e:
        call()
    assert fragment in str(e.value)


# ---- adaptive softmax ----------------------------------------------------------------------------

def _torch_module(d, V, cutoffs, head_bias=False, seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    m = torch.nn.AdaptiveLogSoftmaxWithLoss(d, V, cutoffs, div_value=4.0, head_bias=head_bias).to(dtype)
    with torch.no_grad():  # larger than the default init, so that probabilities differ a lot
        for p in m.parameters():
            p.normal_(0, 0.5)
    return m


def test_adaptive_zero_weights_give_the_spec_probabilities():
    d, V = 16, 10
    tail = [(np.zeros((4, d), np.float32), np.zeros((4, 4), np.float32)),
            (np.zeros((1, d), np.float32), np.zeros((2, 1), np.float32))]
    a = attn.AdaptiveLogSoftmaxWithLoss(np.zeros((6, d), np.float32), tail, [4, 8])
    assert (a.n_classes, a.head_size, a.cutoffs, a.in_features) == (10, 6, [4, 8, 10], 16)
    x = np.random.default_rng(6).standard_normal((3, d)).astype(np.float32)
    p = np.exp(a.log_prob(x))
    np.testing.assert_allclose(p, [[1 / 6] * 4 + [1 / 24] * 4 + [1 / 12] * 2] * 3, rtol=1e-6)
    np.testing.assert_allclose(p.sum(1), 1, atol=1e-6)
    out, loss = a(x, [0, 5, 9])
    np.testing.assert_allclose(out, np.log([1 / 6, 1 / 24, 1 / 12]), rtol=1e-6)
    assert loss == pytest.approx(-np.mean(np.log([1 / 6, 1 / 24, 1 / 12])), rel=1e-6)
    # the same shapes as torch's module (projections d / 4 = 4 and d / 16 = 1)
    m = torch.nn.AdaptiveLogSoftmaxWithLoss(d, V, [4, 8])
    assert [tuple(s[0].weight.shape) for s in m.tail] == [(4, 16), (1, 16)]


# the last cluster's projection has d // 4**3 = 0 rows (uniform within the cluster); torch warns
@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
@pytest.mark.parametrize("head_bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_adaptive_equals_torch_module(head_bias, dtype):
    d, V, cutoffs, N = 32, 200, [10, 50, 120], 40
    m = _torch_module(d, V, cutoffs, head_bias, seed=7, dtype=dtype)
    tail = [(s[0].weight.detach(), s[1].weight.detach()) for s in m.tail]
    ours = attn.AdaptiveLogSoftmaxWithLoss(m.head.weight.detach(), tail, cutoffs,
                                           m.head.bias.detach() if head_bias else None)
    from_torch = attn.AdaptiveLogSoftmaxWithLoss.from_torch(m)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(N, d, generator=g, dtype=dtype) * 2
    target = torch.randint(0, V, (N,), generator=g)
    target[:4] = torch.tensor([0, 10, 50, 199])  # each cluster's edges
    tol = dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=1e-12, rtol=1e-12)
    with torch.no_grad():
        want_lp, want_pred = m.log_prob(x), m.predict(x)
        want = m(x, target)
    for a in (ours, from_torch):
        lp = a.log_prob(x)
        assert isinstance(lp, torch.Tensor) and lp.dtype == dtype and lp.shape == (N, V)
        torch.testing.assert_close(lp, want_lp, **tol)
        torch.testing.assert_close(a.predict(x), want_pred)
        out, loss = a(x, target)
        torch.testing.assert_close(out, want.output, **tol)
        torch.testing.assert_close(loss, want.loss, **tol)
        # NumPy in, NumPy out, same values
        np.testing.assert_allclose(a.log_prob(x.numpy()), want_lp.numpy(), **tol)
    torch.testing.assert_close(lp.double().exp().sum(1), torch.ones(N, dtype=torch.float64), atol=1e-5, rtol=0)
    # one row without a batch dimension, as torch's forward takes it
    out1, loss1 = from_torch(x[3], target[3])
    assert out1.shape == () and float(out1) == pytest.approx(float(want.output[3]), abs=1e-5)
    assert float(loss1) == pytest.approx(-float(want.output[3]), abs=1e-5)


@pytest.mark.filterwarnings("ignore:Initializing zero-element tensors")
def test_adaptive_predict_picks_cluster_words_like_torch():
    """Rows whose head argmax is a cluster: torch's predict takes the full log_prob's argmax."""
    d, V, cutoffs = 8, 30, [2, 12]
    m = _torch_module(d, V, cutoffs, seed=9)
    with torch.no_grad():
        m.head.weight[2:] *= 6  # cluster logits dominate the head
    x = torch.randn(64, d, generator=torch.Generator().manual_seed(10))
    with torch.no_grad():
        want = m.predict(x)
    assert (want >= cutoffs[0]).any()
    torch.testing.assert_close(attn.AdaptiveLogSoftmaxWithLoss.from_torch(m).predict(x), want)


def _weights(d=16):
    z = np.zeros
    return z((6, d)), [(z((4, d)), z((4, 4))), (z((1, d)), z((2, 1)))]


@pytest.mark.parametrize("call,exc,fragment", [
    (lambda h, t: attn.AdaptiveLogSoftmaxWithLoss(h, t, [5, 4]), ValueError,
     "cutoffs[1] = 4 must be greater than cutoffs[0] = 5 (cutoffs must be increasing)"),
    (lambda h, t: attn.AdaptiveLogSoftmaxWithLoss(h, t, [4, 4]), ValueError,
     "cutoffs[1] = 4 repeats cutoffs[0] (duplicates)"),
    (lambda h, t: attn.AdaptiveLogSoftmaxWithLoss(h, t, [0, 8]), ValueError,
     "cutoffs[0] = 0 must be in [1, n_classes - 1] = [1, 9]"),
    (lambda h, t: attn.AdaptiveLogSoftmaxWithLoss(h, [t[0], (t[1][0], np.zeros((0, 1)))], [4, 8]), ValueError,
     "cutoffs[1] = 8 must be in [1, n_classes - 1] = [1, 7]"),
    (lambda h, t: attn.AdaptiveLogSoftmaxWithLoss(h[:5], t, [4, 8]), ValueError,
     "head_weight must have shape (c_1 + n_clusters, d) = (6, 16), got (5, 16)"),
    (lambda h, t: attn.AdaptiveLogSoftmaxWithLoss(h, [t[0], (np.zeros((1, 15)), t[1][1])], [4, 8]), ValueError,
     "tail_weights[1][0] (projection) must have shape (hidden, d) = (hidden, 16), got (1, 15)"),
    (lambda h, t: attn.AdaptiveLogSoftmaxWithLoss(h, [(t[0][0], np.zeros((3, 4))), t[1]], [4, 8]), ValueError,
     "tail_weights[0][1] (output) must have shape (c_2 - c_1, hidden) = (4, 4), got (3, 4)"),
    (lambda h, t: attn.AdaptiveLogSoftmaxWithLoss(h, t[:1], [4, 8]), ValueError,
     "tail_weights must hold one (projection, output) pair per cutoff (2), got 1"),
    (lambda h, t: attn.AdaptiveLogSoftmaxWithLoss(h, t, [4, 8], head_bias=np.zeros(5)), ValueError,
     "head_bias must have c_1 + n_clusters = 6 values, got 5"),
    (lambda h, t: attn.AdaptiveLogSoftmaxWithLoss(h, t, [4, 8.0]), TypeError, "cutoffs[1] must be an integer"),
    (lambda h, t: attn.AdaptiveLogSoftmaxWithLoss(h, t, [4, 8])(np.zeros((2, 16)), [3, 10]), ValueError,
     "target[1] = 10 is outside [0, n_classes) = [0, 10)"),
    (lambda h, t: attn.AdaptiveLogSoftmaxWithLoss(h, t, [4, 8])(np.zeros((2, 16)), [-1, 2]), ValueError,
     "target[0] = -1 is outside [0, n_classes) = [0, 10)"),
    (lambda h, t: attn.AdaptiveLogSoftmaxWithLoss(h, t, [4, 8])(np.zeros((2, 16)), [1]), ValueError,
     "target must hold one id per row of x (2), got 1"),
    (lambda h, t: attn.AdaptiveLogSoftmaxWithLoss(h, t, [4, 8]).log_prob(np.zeros((2, 15))), ValueError,
     "x must have shape (N, in_features) = (N, 16), got (2, 15)"),
    (lambda h, t: attn.AdaptiveLogSoftmaxWithLoss.from_torch(torch.nn.Linear(2, 2)), TypeError,
     "module must be a torch.nn.AdaptiveLogSoftmaxWithLoss, got Linear"),
])
def test_adaptive_bad_input_names_the_argument(call, exc, fragment):
    with pytest.raises(exc) as e:
        call(*_weights())
    assert fragment in str(e.value)


def test_empty_batches_and_detached_gradients():
    hs = attn.HierarchicalSoftmax.from_counts([4, 2, 1], np.ones((2, 3)))
    assert hs.log_prob(np.zeros((0, 3)), []).shape == (0,)
    assert hs.log_prob_all(np.zeros((0, 3))).shape == (0, 3)
    single = attn.HierarchicalSoftmax.from_counts([9], np.zeros((0, 3)))  # one word: empty code, P = 1
    assert single.codes(0) == "" and single.log_prob_all(np.ones((2, 3))).tolist() == [[0.0], [0.0]]
    h, t = _weights()
    a = attn.AdaptiveLogSoftmaxWithLoss(h, t, [4, 8])
    assert a.log_prob(np.zeros((0, 16))).shape == (0, 10) and a.predict(np.zeros((0, 16))).shape == (0,)
    out, loss = a(np.zeros((0, 16)), np.zeros(0, np.int64))
    assert out.shape == (0,) and np.isnan(loss)  # torch's mean of nothing
    x = torch.randn(2, 5, requires_grad=True)
    with pytest.warns(RuntimeWarning, match="x requires grad"):
        y = attn.log_softmax(x)
    assert not y.requires_grad
    with torch.no_grad():
        torch.testing.assert_close(attn.log_softmax(x), torch.log_softmax(x, -1))
