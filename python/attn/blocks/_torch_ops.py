"""The blocks' torch custom operators, so autograd and torch.compile see through them.

* ``torch.ops.attn.refine_attention(a, v, w1, w2, form, gamma, row_sum_tolerance, threads)``:
  a (B, N, N), v (B, N, dv), w1 and w2 (N, r), one dtype (float32: the fast C++ form, float64 the
  reference); its backward ``torch.ops.attn.refine_attention_backward`` gives (da, dv, dw1, dw2).
* ``torch.ops.attn.lite_la(x, qkv, proj, proj_bias, head_dim, eps, threads)``: x (B, N, C),
  qkv (3C, C), proj (C, C), proj_bias (C,) or None; backward ``torch.ops.attn.lite_la_backward``
  gives (dx, dqkv, dproj, dproj_bias) (dproj_bias empty when there is no bias).
* ``torch.ops.attn.mix_ffn(x, height, width, inverted, inverted_bias, depth, depth_bias, point,
  threads)``: the weights as matrices (2h, C), (2h,), (2h, 9), (2h,), (C, h); backward
  ``torch.ops.attn.mix_ffn_backward`` gives the gradient of x and of each weight.

Each op has fake (meta) kernels and its backward registered with ``register_autograd``, so
``torch.compile(fullgraph=True)`` traces it and ``torch.library.opcheck`` passes. The backward ops
are first order: differentiating them again raises a RuntimeError naming the op. The functions of
:mod:`attn.blocks.refinement` and :mod:`attn.blocks.sana` call these ops when given torch tensors
that require grad (with grad enabled); their C++ is attn/refinement.hpp and attn/sana.hpp.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch

from .. import _attn

__all__ = ["refine_attention_op", "lite_la_op", "mix_ffn_op"]


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy()


def _sfx(t: torch.Tensor) -> str:
    if t.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"the blocks' ops take float32 or float64 tensors, got {t.dtype}")
    return "f32" if t.dtype == torch.float32 else "f64"


def _torch(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a)


def _no_double_backward(op: str):
    def backward(ctx, *grads):
        raise RuntimeError(f"{op}: double backward is not supported (the C++ backward has no gradient of its own)")
    return backward


def _nothing_to_save(ctx, inputs, output):
    pass


# ---- attention-weight refinement ----------------------------------------------------------------


@torch.library.custom_op("attn::refine_attention", mutates_args=())
def refine_attention_op(a: torch.Tensor, v: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, form: str,
                        gamma: float, row_sum_tolerance: float, threads: int = 0) -> torch.Tensor:
    """O = R V (B, N, dv) of attn.refine_attention for 3-D a, v."""
    fn = getattr(_attn, "refine_attention_" + _sfx(a))
    return _torch(fn(_np(a), _np(v), _np(w1), _np(w2), form, gamma, row_sum_tolerance, threads))


@refine_attention_op.register_fake
def _refine_attention_fake(a, v, w1, w2, form, gamma, row_sum_tolerance, threads=0):
    return a.new_empty((a.shape[0], a.shape[1], v.shape[2]))


@torch.library.custom_op("attn::refine_attention_backward", mutates_args=())
def refine_attention_backward_op(dout: torch.Tensor, a: torch.Tensor, v: torch.Tensor, w1: torch.Tensor,
                                 w2: torch.Tensor, form: str, gamma: float, row_sum_tolerance: float,
                                 threads: int = 0) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(da, dv, dw1, dw2): da is the derivative in every entry of a (those above the diagonal too)."""
    fn = getattr(_attn, "refine_attention_backward_" + _sfx(a))
    return tuple(_torch(g) for g in fn(_np(dout), _np(a), _np(v), _np(w1), _np(w2), form, gamma, row_sum_tolerance,
                                       threads))


@refine_attention_backward_op.register_fake
def _refine_attention_backward_fake(dout, a, v, w1, w2, form, gamma, row_sum_tolerance, threads=0):
    return a.new_empty(a.shape), v.new_empty(v.shape), w1.new_empty(w1.shape), w2.new_empty(w2.shape)


def _refine_setup(ctx, inputs, output):
    a, v, w1, w2, form, gamma, tol, threads = inputs
    ctx.save_for_backward(a, v, w1, w2)
    ctx.options = (form, gamma, tol, threads)


def _refine_backward(ctx, dout):
    a, v, w1, w2 = ctx.saved_tensors
    da, dv, dw1, dw2 = refine_attention_backward_op(dout.contiguous(), a, v, w1, w2, *ctx.options)
    return da, dv, dw1, dw2, None, None, None, None


refine_attention_op.register_autograd(_refine_backward, setup_context=_refine_setup)
refine_attention_backward_op.register_autograd(_no_double_backward("attn.refine_attention"),
                                               setup_context=_nothing_to_save)


# ---- SANA: LiteLA -------------------------------------------------------------------------------


@torch.library.custom_op("attn::lite_la", mutates_args=())
def lite_la_op(x: torch.Tensor, qkv: torch.Tensor, proj: torch.Tensor, proj_bias: Optional[torch.Tensor],
               head_dim: int, eps: float, threads: int = 0) -> torch.Tensor:
    """attn.lite_la on x (B, N, C) with 2-D weights."""
    fn = getattr(_attn, "lite_la_" + _sfx(x))
    return _torch(fn(_np(x), _np(qkv), _np(proj), None if proj_bias is None else _np(proj_bias), head_dim, eps,
                     threads))


@lite_la_op.register_fake
def _lite_la_fake(x, qkv, proj, proj_bias, head_dim, eps, threads=0):
    return x.new_empty(x.shape)


@torch.library.custom_op("attn::lite_la_backward", mutates_args=())
def lite_la_backward_op(dout: torch.Tensor, x: torch.Tensor, qkv: torch.Tensor, proj: torch.Tensor,
                        proj_bias: Optional[torch.Tensor], head_dim: int, eps: float, threads: int = 0
                        ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dqkv, dproj, dproj_bias); dproj_bias is an empty tensor when there is no bias."""
    fn = getattr(_attn, "lite_la_backward_" + _sfx(x))
    dx, dq, dp, db = fn(_np(dout), _np(x), _np(qkv), _np(proj), None if proj_bias is None else _np(proj_bias),
                        head_dim, eps, threads)
    return _torch(dx), _torch(dq), _torch(dp), (x.new_empty((0,)) if proj_bias is None else _torch(db))


@lite_la_backward_op.register_fake
def _lite_la_backward_fake(dout, x, qkv, proj, proj_bias, head_dim, eps, threads=0):
    db = x.new_empty((0,)) if proj_bias is None else proj_bias.new_empty(proj_bias.shape)
    return x.new_empty(x.shape), qkv.new_empty(qkv.shape), proj.new_empty(proj.shape), db


def _lite_setup(ctx, inputs, output):
    x, qkv, proj, proj_bias, head_dim, eps, threads = inputs
    ctx.save_for_backward(x, qkv, proj, proj_bias)
    ctx.options = (head_dim, eps, threads)


def _lite_backward(ctx, dout):
    x, qkv, proj, proj_bias = ctx.saved_tensors
    dx, dq, dp, db = lite_la_backward_op(dout.contiguous(), x, qkv, proj, proj_bias, *ctx.options)
    return dx, dq, dp, (None if proj_bias is None else db), None, None, None


lite_la_op.register_autograd(_lite_backward, setup_context=_lite_setup)
lite_la_backward_op.register_autograd(_no_double_backward("attn.lite_la"), setup_context=_nothing_to_save)


# ---- SANA: Mix-FFN ------------------------------------------------------------------------------


@torch.library.custom_op("attn::mix_ffn", mutates_args=())
def mix_ffn_op(x: torch.Tensor, height: int, width: int, inverted: torch.Tensor, inverted_bias: torch.Tensor,
               depth: torch.Tensor, depth_bias: torch.Tensor, point: torch.Tensor, threads: int = 0) -> torch.Tensor:
    """attn.mix_ffn on x (B, N, C), N = height * width, with the weights as matrices."""
    fn = getattr(_attn, "mix_ffn_" + _sfx(x))
    return _torch(fn(_np(x), height, width, _np(inverted), _np(inverted_bias), _np(depth), _np(depth_bias),
                     _np(point), threads))


@mix_ffn_op.register_fake
def _mix_ffn_fake(x, height, width, inverted, inverted_bias, depth, depth_bias, point, threads=0):
    return x.new_empty(x.shape)


@torch.library.custom_op("attn::mix_ffn_backward", mutates_args=())
def mix_ffn_backward_op(dout: torch.Tensor, x: torch.Tensor, height: int, width: int, inverted: torch.Tensor,
                        inverted_bias: torch.Tensor, depth: torch.Tensor, depth_bias: torch.Tensor,
                        point: torch.Tensor, threads: int = 0
                        ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dinverted, dinverted_bias, ddepth, ddepth_bias, dpoint)."""
    fn = getattr(_attn, "mix_ffn_backward_" + _sfx(x))
    grads = fn(_np(dout), _np(x), height, width, _np(inverted), _np(inverted_bias), _np(depth), _np(depth_bias),
               _np(point), threads)
    return tuple(_torch(g) for g in grads)


@mix_ffn_backward_op.register_fake
def _mix_ffn_backward_fake(dout, x, height, width, inverted, inverted_bias, depth, depth_bias, point, threads=0):
    return tuple(t.new_empty(t.shape) for t in (x, inverted, inverted_bias, depth, depth_bias, point))


def _mix_setup(ctx, inputs, output):
    x, height, width, inverted, inverted_bias, depth, depth_bias, point, threads = inputs
    ctx.save_for_backward(x, inverted, inverted_bias, depth, depth_bias, point)
    ctx.options = (height, width, threads)


def _mix_backward(ctx, dout):
    x, inverted, inverted_bias, depth, depth_bias, point = ctx.saved_tensors
    height, width, threads = ctx.options
    dx, di, dib, dd, ddb, dp = mix_ffn_backward_op(dout.contiguous(), x, height, width, inverted, inverted_bias, depth,
                                                   depth_bias, point, threads)
    return dx, None, None, di, dib, dd, ddb, dp, None


mix_ffn_op.register_autograd(_mix_backward, setup_context=_mix_setup)
mix_ffn_backward_op.register_autograd(_no_double_backward("attn.mix_ffn"), setup_context=_nothing_to_save)
