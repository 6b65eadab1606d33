"""The MoE feed-forward as torch custom operators, so autograd and torch.compile see through it
(imported by :func:`attn.moe_feed_forward` when a tensor requires grad; importing this module
needs torch).

``torch.ops.attn.moe_feed_forward(x, router, w1, w2, w3, top_k, threads=0)`` returns ``(y, aux)``
(aux a 0-d tensor in x's dtype) with ``torch.ops.attn.moe_feed_forward_backward(dy, daux, x,
router, w1, w2, w3, top_k, threads)`` as its registered backward: gradients flow to x, the router
and every expert's w1, w2, w3, and from the auxiliary loss into the router and x. The top-k choice
is a constant; the chosen experts' weights (softmax, then renormalised) carry gradients. float32
runs the gathered form (forward and backward), float64 the per-token reference; results do not
depend on ``threads``. The backward op is first-order only.
"""
from __future__ import annotations

from typing import Tuple

import torch

from .. import _attn


def _np(t: torch.Tensor):
    return t.detach().contiguous().numpy()


def _fn(name: str, dtype: torch.dtype):
    return getattr(_attn, name + ("_f32" if dtype == torch.float32 else "_f64"))


@torch.library.custom_op("attn::moe_feed_forward", mutates_args=())
def moe_feed_forward_op(x: torch.Tensor, router: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor,
                        top_k: int, threads: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """(y (N, d), aux (0-d)) of MiniMax-01's MoE; every tensor one dtype, float32 or float64."""
    y, aux, _, _ = _fn("moe_feed_forward", x.dtype)(_np(x), _np(router), _np(w1), _np(w2), _np(w3), top_k, threads)
    return torch.from_numpy(y), torch.tensor(aux, dtype=x.dtype)


@moe_feed_forward_op.register_fake
def _moe_fake(x, router, w1, w2, w3, top_k, threads=0):
    return x.new_empty(x.shape), x.new_empty(())


@torch.library.custom_op("attn::moe_feed_forward_backward", mutates_args=())
def moe_feed_forward_backward_op(dy: torch.Tensor, daux: torch.Tensor, x: torch.Tensor, router: torch.Tensor,
                                 w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor, top_k: int, threads: int = 0
                                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, drouter, dw1, dw2, dw3) given dy = dL/dy and daux = dL/daux (0-d)."""
    grads = _fn("moe_feed_forward_backward", x.dtype)(_np(dy.to(x.dtype)), float(daux), _np(x), _np(router), _np(w1),
                                                      _np(w2), _np(w3), top_k, threads)
    return tuple(torch.from_numpy(g) for g in grads)


@moe_feed_forward_backward_op.register_fake
def _moe_backward_fake(dy, daux, x, router, w1, w2, w3, top_k, threads=0):
    return tuple(torch.empty_like(t) for t in (x, router, w1, w2, w3))


def _setup_context(ctx, inputs, output):
    x, router, w1, w2, w3, top_k, threads = inputs
    ctx.save_for_backward(x, router, w1, w2, w3)
    ctx.run = (top_k, threads)


def _backward(ctx, dy, daux):
    x, router, w1, w2, w3 = ctx.saved_tensors
    grads = moe_feed_forward_backward_op(dy.contiguous(), daux, x, router, w1, w2, w3, *ctx.run)
    return (*grads, None, None)


def _no_double_backward(ctx, *grads):
    raise RuntimeError("attn.moe_feed_forward's backward (torch.ops.attn.moe_feed_forward_backward) is first-order "
                       "only: it cannot be differentiated again")


def _nothing(ctx, inputs, output):
    pass


moe_feed_forward_op.register_autograd(_backward, setup_context=_setup_context)
moe_feed_forward_backward_op.register_autograd(_no_double_backward, setup_context=_nothing)
