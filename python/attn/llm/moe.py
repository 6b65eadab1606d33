"""Mixture-of-experts feed-forward (C++: attn/moe.hpp; docs/minimax.md).

:func:`moe_feed_forward` -- MiniMax-01's MoE: a router picks ``top_k`` SwiGLU experts per
token (softmax in float32 for float32 inputs, top-k with ties to the lower id, weights
renormalised) and returns the output with the auxiliary load-balance loss. It trains: given
torch tensors that require grad, it runs through the custom ops of :mod:`attn.llm.moe_torch`
(``torch.ops.attn.moe_feed_forward`` and its backward), and gradients flow to x, the router and
every expert's weights (the top-k choice is a constant; the chosen experts' weights carry their
gradient through the renormalisation and the softmax); the auxiliary loss is then a 0-d tensor
whose gradient reaches the router and x.
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
    float64 inputs run the per-token float64 reference. Results do not depend on ``threads``.

    Training: when x or a weight is a torch tensor that requires grad (grad enabled), the call goes
    through ``torch.ops.attn.moe_feed_forward``: y and aux_loss (then a 0-d tensor in x's dtype)
    carry gradients back to x, router, w1, w2 and w3 (NumPy weights are constants), e.g.
    ``y, aux = moe_feed_forward(x, router, w1, w2, w3); (y.square().sum() + aux).backward()``."""
    torch_in = _is_torch(x)
    if _wants_grad(x, router, w1, w2, w3):
        return _differentiable(x, router, w1, w2, w3, top_k, threads, return_routing)
    what = "the MoE functions"
    a = _floats(x, "x", input=True, what=what)
    dtype = a.dtype
    r = _floats(router, "router", dtype, input=True, what=what)
    m1, m2, m3 = (_floats(w, name, dtype, input=True, what=what) for w, name in ((w1, "w1"), (w2, "w2"), (w3, "w3")))
    k = _args.integer(top_k, "top_k")
    threads = _args.integer(threads, "threads", 0, 256)
    _check_shapes([a.shape, r.shape, m1.shape, m2.shape, m3.shape], k)
    fn = _attn.moe_feed_forward_f32 if dtype == np.float32 else _attn.moe_feed_forward_f64
    y, aux, ids, weights = fn(a, r, m1, m2, m3, k, threads)
    if return_routing:
        return _out(y, torch_in), float(aux), ids, weights
    return _out(y, torch_in), float(aux)


def _wants_grad(*xs: Any) -> bool:
    if not any(_is_torch(a) and a.requires_grad for a in xs):
        return False
    import torch

    return torch.is_grad_enabled()


def _differentiable(x, router, w1, w2, w3, top_k, threads, return_routing):
    """The torch custom-op path: the same checks, then torch.ops.attn.moe_feed_forward."""
    import torch

    from . import moe_torch  # noqa: F401  (registers the ops)

    if not _is_torch(x):  # NumPy tokens with weights that require grad: a constant input, a torch result
        x = torch.from_numpy(_floats(x, "x"))
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"x must be float32 or float64, got {x.dtype}")
    if x.device.type != "cpu":
        raise ValueError(f"x must be on the CPU, got {x.device}")
    ts = [x]
    for a, name in ((router, "router"), (w1, "w1"), (w2, "w2"), (w3, "w3")):
        t = a if _is_torch(a) else torch.as_tensor(_floats(a, name))
        if not t.dtype.is_floating_point:
            raise TypeError(f"{name} must be float32 or float64, got {t.dtype}")
        ts.append(t.to(x.dtype).contiguous())
    # the plain path's shape checks and messages, on detached copies (no data copied for those)
    k = _args.integer(top_k, "top_k")
    threads = _args.integer(threads, "threads", 0, 256)
    _check_shapes([t.shape for t in ts], k)
    y, aux = torch.ops.attn.moe_feed_forward(ts[0].contiguous(), *ts[1:], k, threads)
    if return_routing:
        _, _, ids, weights = moe_feed_forward(*(t.detach() for t in ts), top_k=k, threads=threads,
                                              return_routing=True)
        return y, aux, ids, weights
    return y, aux


def _check_shapes(shapes, k):
    xs, rs, s1, s2, s3 = (tuple(int(n) for n in s) for s in shapes)
    if len(xs) != 2:
        raise ValueError(f"x must have shape (N, d), got {xs}")
    d = xs[1]
    if len(rs) != 2 or rs[1] != d:
        raise ValueError(f"router must have shape (E, d) = (E, {d}), got {rs}")
    E = rs[0]
    if len(s1) != 3 or s1[0] != E or s1[2] != d:
        raise ValueError(f"w1 must have shape (E, d_ff, d) = ({E}, d_ff, {d}), got {s1}")
    F = s1[1]
    if s3 != (E, F, d):
        raise ValueError(f"w3 must have shape (E, d_ff, d) = {(E, F, d)}, got {s3}")
    if s2 != (E, d, F):
        raise ValueError(f"w2 must have shape (E, d, d_ff) = {(E, d, F)}, got {s2}")
    if not 1 <= k <= E:
        raise ValueError(f"top_k must be in [1, experts = {E}], got {k}")
