"""Titans memory as torch custom operators, so autograd and torch.compile see through it
(imported by :func:`attn.blocks.titans_memory` and :func:`attn.blocks.titans_read` when a tensor
requires grad; importing this module needs torch).

``torch.ops.attn.titans_memory(q, k, v, theta, eta, alpha, w0, s0, memory, loss, batch_size,
threads=0)`` takes q, k, v (B, H, N, d), the gates (B, H, N) and M_0, S_0 flattened to (groups,
count) (groups 1, H or B*H; None: zeros) and returns ``(y (B, H, N, d), w (B, H, count), s (B, H,
count))``: the reads, the final weights and the final momentum. Its registered backward,
``torch.ops.attn.titans_memory_backward(dy, dw, ds, q, k, v, theta, eta, alpha, w0, s0, memory, loss,
batch_size, threads)``, differentiates through the memory's own gradient steps (the write uses the
inner loss's gradient, so the outer gradient carries its second-order terms) and returns the
gradients of q, k, v, theta, eta, alpha, w0 and s0 (an empty tensor for an absent w0 or s0).
float32 runs the fast forward and the float32 backward loop, float64 the reference token loop and
the float64 reference backward. The backward op is first-order only.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from .. import _attn


def _np(t: Optional[torch.Tensor]):
    return None if t is None else t.detach().contiguous().numpy()


def count_of(memory: str, d: int) -> int:
    return d * d if memory == "linear" else 8 * d * d


@torch.library.custom_op("attn::titans_memory", mutates_args=())
def titans_memory_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, theta: torch.Tensor, eta: torch.Tensor,
                     alpha: torch.Tensor, w0: Optional[torch.Tensor], s0: Optional[torch.Tensor], memory: str,
                     loss: str, batch_size: int, threads: int = 0
                     ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, final weights (B, H, count), final momentum (B, H, count))."""
    fn = _attn.titans_memory_f32 if q.dtype == torch.float32 else _attn.titans_memory_f64
    y, w, s = fn(*(_np(t) for t in (q, k, v, theta, eta, alpha, w0, s0)), memory, loss, batch_size, threads)
    return torch.from_numpy(y), torch.from_numpy(w), torch.from_numpy(s)


@titans_memory_op.register_fake
def _titans_fake(q, k, v, theta, eta, alpha, w0, s0, memory, loss, batch_size, threads=0):
    B, H, _, d = q.shape
    c = count_of(memory, d)
    return q.new_empty(q.shape), q.new_empty((B, H, c)), q.new_empty((B, H, c))


@torch.library.custom_op("attn::titans_memory_backward", mutates_args=())
def titans_memory_backward_op(dy: torch.Tensor, dw: torch.Tensor, ds: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                              v: torch.Tensor, theta: torch.Tensor, eta: torch.Tensor, alpha: torch.Tensor,
                              w0: Optional[torch.Tensor], s0: Optional[torch.Tensor], memory: str, loss: str,
                              batch_size: int, threads: int = 0
                              ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                         torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dtheta, deta, dalpha, dw0, ds0); dw0 / ds0 are empty when w0 / s0 is None."""
    B, H, d = q.shape[0], q.shape[1], q.shape[3]
    fn = _attn.titans_memory_backward_f32 if q.dtype == torch.float32 else _attn.titans_memory_backward_f64
    flat = [_np(t.to(q.dtype).reshape(B * H, count_of(memory, d))) for t in (dw, ds)]
    g = fn(*(_np(t) for t in (q, k, v, theta, eta, alpha, w0, s0)), _np(dy.to(q.dtype)), *flat, memory, loss,
           batch_size, threads)
    out = [torch.from_numpy(x) for x in g]
    if w0 is None:
        out[6] = q.new_empty((0,))
    if s0 is None:
        out[7] = q.new_empty((0,))
    return tuple(out)


@titans_memory_backward_op.register_fake
def _titans_backward_fake(dy, dw, ds, q, k, v, theta, eta, alpha, w0, s0, memory, loss, batch_size, threads=0):
    return (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(theta),
            torch.empty_like(eta), torch.empty_like(alpha), torch.empty_like(w0) if w0 is not None else q.new_empty((0,)),
            torch.empty_like(s0) if s0 is not None else q.new_empty((0,)))


def _setup_context(ctx, inputs, output):
    q, k, v, theta, eta, alpha, w0, s0, memory, loss, batch_size, threads = inputs
    ctx.save_for_backward(q, k, v, theta, eta, alpha, w0, s0)
    ctx.run = (memory, loss, batch_size, threads)


def _backward(ctx, dy, dw, ds):
    q, k, v, theta, eta, alpha, w0, s0 = ctx.saved_tensors
    g = titans_memory_backward_op(dy.contiguous(), dw.contiguous(), ds.contiguous(), q, k, v, theta, eta, alpha, w0,
                                  s0, *ctx.run)
    return (*g[:6], g[6] if w0 is not None else None, g[7] if s0 is not None else None, None, None, None, None)


def _no_double_backward(ctx, *grads):
    raise RuntimeError("attn.titans_memory's backward (torch.ops.attn.titans_memory_backward) is first-order only: "
                       "it cannot be differentiated again")


def _nothing(ctx, inputs, output):
    pass


titans_memory_op.register_autograd(_backward, setup_context=_setup_context)
titans_memory_backward_op.register_autograd(_no_double_backward, setup_context=_nothing)
