"""Mixture-of-experts feed-forward (C++: attn/moe.hpp; docs/minimax.md).

:func:`moe_feed_forward` -- MiniMax-01's MoE: a router picks ``top_k`` SwiGLU experts per
token (softmax in float32 for float32 inputs, top-k with ties to the lower id, weights
renormalised) and returns the output with the auxiliary load-balance loss. No gradient flows
back (a torch tensor that requires grad gets a RuntimeWarning naming it).
"""
from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from .. import _args, _attn
from .._args import floats as _floats, is_torch as _is_torch, torch_if as _out

__all__ = ["moe_feed_forward"]


def moe_feed_forward(x: Any, router: Any, w1: Any, w2: Any, w3: Any, top_k: int = 2, *, threads: int = 0,
                     return_routing: bool = False) -> Tuple[Any, float]:
    """``y = sum_k w_k W2_e (silu(W1_e x) * W3_e x)`` over each token's ``top_k`` experts.

    x: (N, d) tokens (float32 or float64, NumPy or torch; the result has its kind and dtype);
    router: (E, d); w1, w3: (E, d_ff, d); w2: (E, d, d_ff) -- torch ``nn.Linear`` layouts
    (out, in), as MiniMax-01's and Mixtral's checkpoints hold them. The weights are converted to
    x's dtype. Returns ``(y, aux_loss)`` with ``aux_loss = 0.001 * E * sum_e f_e P_e`` (f_e: the
    share of tokens whose top-k holds e, P_e: the mean router probability of e), a float. With
    ``return_routing=True``: ``(y, aux_loss, ids, weights)``, ids (N, top_k) int32 in descending
    probability and weights (N, top_k) summing to 1 per token (NumPy arrays).

    float32 inputs run the gathered form (each expert one matrix product over its tokens);
    float64 inputs run the per-token float64 reference. Results do not depend on ``threads``."""
    torch_in = _is_torch(x)
    what = "the MoE functions"  # no backward: a tensor that requires grad gets a warning, not a silent detach
    a = _floats(x, "x", input=True, what=what)
    dtype = a.dtype
    r = _floats(router, "router", dtype, input=True, what=what)
    m1, m2, m3 = (_floats(w, name, dtype, input=True, what=what) for w, name in ((w1, "w1"), (w2, "w2"), (w3, "w3")))
    k = _args.integer(top_k, "top_k")
    threads = _args.integer(threads, "threads", 0, 256)
    if a.ndim != 2:
        raise ValueError(f"x must have shape (N, d), got {tuple(a.shape)}")
    d = a.shape[1]
    if r.ndim != 2 or r.shape[1] != d:
        raise ValueError(f"router must have shape (E, d) = (E, {d}), got {tuple(r.shape)}")
    E = r.shape[0]
    if m1.ndim != 3 or m1.shape[0] != E or m1.shape[2] != d:
        raise ValueError(f"w1 must have shape (E, d_ff, d) = ({E}, d_ff, {d}), got {tuple(m1.shape)}")
    F = m1.shape[1]
    if m3.shape != (E, F, d):
        raise ValueError(f"w3 must have shape (E, d_ff, d) = {(E, F, d)}, got {tuple(m3.shape)}")
    if m2.shape != (E, d, F):
        raise ValueError(f"w2 must have shape (E, d, d_ff) = {(E, d, F)}, got {tuple(m2.shape)}")
    if not 1 <= k <= E:
        raise ValueError(f"top_k must be in [1, experts = {E}], got {k}")
    fn = _attn.moe_feed_forward_f32 if dtype == np.float32 else _attn.moe_feed_forward_f64
    y, aux, ids, weights = fn(a, r, m1, m2, m3, k, threads)
    if return_routing:
        return _out(y, torch_in), float(aux), ids, weights
    return _out(y, torch_in), float(aux)
