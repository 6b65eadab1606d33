"""Closed forms of how concentrated attention can be as the keys grow without bound
(C++: attn::theory). Keys k ~ N(mu, sigma^2 I) and a query q give scores beta + gamma eps with
beta = q.mu, gamma = sigma ||q||, eps ~ N(0, 1); a mechanism weighting keys by f(score) has, for
n -> infinity, sparsity S = E|f| / sqrt(E f^2) (1: spread evenly; -> 0: concentrated).

    >>> attn.theory.sparsity_exp(0.0, 3.0)          # softmax: exp(-gamma^2/2), arbitrarily sparse
    >>> attn.theory.sparsity_identity(beta, gamma)  # linear attention: bounded away from 0
    >>> attn.theory.sparsity_decay(0.99, n)         # decay alone: sparse, on recent keys only

Every function takes numbers or arrays (broadcast) and returns float64.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import _args, _attn

__all__ = ["sparsity_exp", "sparsity_relu2", "sparsity_relu2_erf_form", "sparsity_identity", "sparsity_linear",
           "sparsity_linear_iid", "sparsity_decay"]


def _closed(f: str, beta: Any, gamma: Any) -> Any:
    b, g = np.broadcast_arrays(_args.reals(beta, "beta"), _args.reals(gamma, "gamma"))
    out = np.array([_attn.theory_sparsity(f, float(x), float(y)) for x, y in zip(b.ravel(), g.ravel())]).reshape(b.shape)
    return float(out) if out.ndim == 0 else out


def _vector(x: Any, name: str) -> list:
    a = _args.reals(x, name)
    if a.ndim != 1:
        raise ValueError(f"{name} must be a vector (d,), got shape {a.shape}")
    return a.tolist()


def sparsity_exp(beta: Any, gamma: Any) -> Any:
    """Softmax (f = exp): exp(-gamma^2 / 2), whatever beta."""
    return _closed("exp", beta, gamma)


def sparsity_relu2(beta: Any, gamma: Any) -> Any:
    """Squared ReLU (GAU): its second and fourth moments, Phi by erfc (stable for beta/gamma << 0)."""
    return _closed("relu2", beta, gamma)


def sparsity_relu2_erf_form(beta: Any, gamma: Any) -> Any:
    """The same written with 1 + erf(u) in place of erfc(-u): loses every digit below
    beta/gamma of about -6 and is NaN near -8. For comparison only."""
    return _closed("relu2_erf_form", beta, gamma)


def sparsity_identity(beta: Any, gamma: Any) -> Any:
    """Plain linear attention (f = identity): even in beta, >= sqrt(2/pi) at beta = 0."""
    return _closed("identity", beta, gamma)


def sparsity_linear(q: Sequence[float], mu: Sequence[float], sigma: Any) -> float:
    """A non-negative feature map: 1/sqrt(1 + q'Sigma q / (q'mu)^2) for feature-mapped keys of mean
    ``mu`` (d) and covariance ``sigma`` (d, d)."""
    return _attn.theory_sparsity_linear(_vector(q, "q"), _vector(mu, "mu"), _args.reals(sigma, "sigma").ravel().tolist())


def sparsity_linear_iid(q: Sequence[float], mean: float, deviation: float) -> float:
    """Its i.i.d. case: 1/sqrt(1 + (deviation/mean * ||q||_2/||q||_1)^2)."""
    return _attn.theory_sparsity_linear_iid(_vector(q, "q"), _args.real(mean, "mean"),
                                            _args.real(deviation, "deviation"))


def sparsity_decay(lam: Any, n: Any) -> Any:
    """The pure decay row (lam^(n-1), ..., lam, 1)."""
    counts = np.asarray(n)
    if counts.dtype.kind not in "iuO" or counts.dtype == np.bool_:
        raise TypeError(f"n must be an integer or integers, got {counts.dtype}")
    l, m = np.broadcast_arrays(_args.reals(lam, "lam"), counts)
    out = np.array([_attn.theory_sparsity_decay(float(x), _args.integer(y, "n"))
                    for x, y in zip(l.ravel(), m.ravel())]).reshape(l.shape)
    return float(out) if out.ndim == 0 else out
