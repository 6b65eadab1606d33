"""How concentrated rows of attention weights are, on arrays (C++: attn::concentration;
docs/concentration.md).

    >>> p = attn.attention(q, k, v, return_probs=True)[1]      # (B, H, N, M)
    >>> attn.sparsity(p)             # (B, H, N): E|a| / sqrt(E a^2), 1/sqrt(M) (one key) .. 1 (uniform)
    >>> attn.entropy(p)              # (B, H, N): -sum p log p, 0 .. log M
    >>> attn.topk_mass(p, 8)         # the 8 largest weights' share
    >>> attn.summarize(attn.sparsity(p), axis=(0, 2))   # per head: mean and quantiles

Sparsity applies to unnormalised and signed weights (a linear mechanism's rows); entropy needs
non-negative ones and normalises them. An all-zero row gives NaN. Sums run in float64.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Sequence, Tuple, Union

import numpy as np

from . import _args, _attn

__all__ = ["sparsity", "entropy", "max_weight", "topk_mass", "effective_keys", "summarize"]


def _measure(a: Any, axis: int, what: str, k: int = 0, name: str = "a") -> np.ndarray:
    arr = np.asarray(a.detach().cpu().numpy() if hasattr(a, "detach") else a, dtype=np.float64)
    if arr.ndim == 0:
        raise ValueError(f"{name}: expected an array with at least one axis, got a scalar")
    axis = _args.integer(axis, "axis")
    if not -arr.ndim <= axis < arr.ndim:
        raise ValueError(f"axis: expected an axis of the {arr.ndim}-D array {name}, got {axis}")
    moved = np.moveaxis(arr, axis, -1)
    rows = np.ascontiguousarray(moved).reshape(-1, moved.shape[-1])
    try:
        out = _attn.row_measure(rows, what, int(k))
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    return np.asarray(out).reshape(moved.shape[:-1])


def sparsity(a: Any, axis: int = -1) -> np.ndarray:
    """S(a) = E|a| / sqrt(E[a^2]) along ``axis``: 1/sqrt(n) for one key, 1 for equal weights."""
    return _measure(a, axis, "sparsity")


def entropy(p: Any, axis: int = -1) -> np.ndarray:
    """-sum p log p (natural log) of the row normalised to sum 1; weights must be >= 0."""
    return _measure(p, axis, "entropy", name="p")


def max_weight(a: Any, axis: int = -1) -> np.ndarray:
    """The largest |a| as a share of sum |a|."""
    return _measure(a, axis, "max_weight")


def topk_mass(a: Any, k: int, axis: int = -1) -> np.ndarray:
    """The k largest |a| as a share of sum |a| (1 when k >= n)."""
    k = _args.integer(k, "k")
    if k < 1:
        raise ValueError(f"k: expected >= 1, got {k}")
    return _measure(a, axis, "topk_mass", k)


def effective_keys(p: Any, axis: int = -1) -> np.ndarray:
    """exp(entropy): how many keys the row spreads over (1 .. n)."""
    return np.exp(entropy(p, axis))


def summarize(values: Any, axis: Union[int, Sequence[int], None] = None,
              quantiles: Tuple[float, ...] = (0.1, 0.5, 0.9)) -> Dict[str, np.ndarray]:
    """Mean and quantiles of per-row values over ``axis`` (e.g. the batch and query axes, leaving
    one figure per head), NaN rows left out: ``{"mean": ..., "q0.1": ..., "q0.5": ..., ...}``.

    Several statistics at once (an :class:`attn.Stats` from ``return_stats``, or a dict of arrays)
    are summarized each apart, never averaged together: ``{"sparsity": {"mean": ...}, "entropy":
    {...}, ...}`` (statistics that are None are left out)."""
    if isinstance(values, tuple) and hasattr(values, "_fields"):  # attn.Stats and other named tuples
        values = {name: getattr(values, name) for name in values._fields}
    if isinstance(values, Mapping):
        return {str(name): summarize(v, axis, quantiles) for name, v in values.items() if v is not None}
    x = np.asarray(values, dtype=np.float64)
    if axis is not None:
        axes = [axis] if not isinstance(axis, (tuple, list)) else list(axis)
        for i, ax in enumerate(axes):
            if not -x.ndim <= _args.integer(ax, "axis" if not isinstance(axis, (tuple, list)) else f"axis[{i}]") < x.ndim:
                raise ValueError(f"axis: expected axes of the {x.ndim}-D array values, got {axis}")
    out = {"mean": np.nanmean(x, axis=axis)}
    for q in quantiles:
        out[f"q{q:g}"] = np.nanquantile(x, q, axis=axis)
    return out
