"""SANA's attention block pieces (C++: attn/sana.hpp; docs/sana.md).

Tokens x are (B, N, C) and lay out an H x W image row-major (N = H W, token n = y W + x).

* :func:`lite_la` -- LiteLA: q, k, v = x W_qkv^T (no bias), heads of ``head_dim`` (32) channels,
  ReLU linear attention (non-causal, eps 1e-15 in the denominator, no 1/sqrt(d)), then
  x W_proj^T + b. float32 runs the library's ``sana`` mechanism (linear family).
* :func:`mix_ffn` -- Mix-FFN (GLUMBConv): 1x1 conv C -> 2h with bias and SiLU, 3x3 depthwise
  conv with bias (zero padding), split [a | g], a * silu(g), 1x1 conv h -> C without bias.
* :func:`sana_block` -- ``y = x + lite_la(LN(x)); out = y + mix_ffn(LN(y))`` with LayerNorm over
  C without affine (eps 1e-6): our composition (the pieces fix no norm or residual); SANA's own
  block adds timestep modulation (adaLN-single) and cross-attention, which are not here.

Weights take torch's layouts: nn.Linear weights (out, in); conv weights (2h, C, 1, 1),
(2h, 1, 3, 3), (C, h, 1, 1) or the same without the unit dimensions ((2h, C), (2h, 9) or
(2h, 3, 3), (C, h)). float32 runs the fast C++ forms, float64 the plain references; the weights
are converted to x's dtype. NumPy in, NumPy out; torch in, torch out.

They train: given torch tensors that require grad (grad enabled), :func:`lite_la` and
:func:`mix_ffn` run the custom ops ``torch.ops.attn.lite_la`` and ``torch.ops.attn.mix_ffn``
(attn/blocks/_torch_ops.py; C++ ``lite_la_backward``, ``mix_ffn_backward``) and gradients flow to x
and to every weight and bias, in the weights' own shapes (a conv weight (2h, C, 1, 1) gets a
(2h, C, 1, 1) gradient); :func:`sana_block` then composes the two ops with torch's
``layer_norm`` and the residual sums (its float32 norms then sum in float32, the C++ block's in
float64). ``torch.compile(fullgraph=True)`` traces the ops.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import numpy as np

from .. import _args, _attn
from .._args import floats as _floats, is_torch as _is_torch, torch_if as _out

__all__ = ["lite_la", "mix_ffn", "sana_block"]


def _x(x: Any) -> Tuple[np.ndarray, bool]:
    torch_in = _is_torch(x)
    a = _floats(x, "x", input=True, what="the SANA functions")
    if a.ndim != 3:
        raise ValueError(f"x must have 3 dimensions (B, N, C), got shape {tuple(a.shape)}")
    return a, torch_in


def _sfx(a: np.ndarray) -> str:
    return "f32" if a.dtype == np.float32 else "f64"


def _hw(hw: Any, n: int) -> Tuple[int, int]:
    if isinstance(hw, (str, bytes)) or not hasattr(hw, "__len__") or len(hw) != 2:
        raise TypeError(f"hw must be a pair (H, W), got {hw!r}")
    h, w = (_args.integer(v, f"hw[{i}]") for i, v in enumerate(hw))
    if h < 0 or w < 0 or h * w != n:
        raise ValueError(f"hw = ({h}, {w}) must multiply to the tokens N = {n} (N = H * W), got H * W = {h * w}")
    return h, w


def _matrix(w: Any, name: str, dt: np.dtype, depthwise: bool = False) -> np.ndarray:
    """A 2-D weight (out, in); a 1x1 conv weight (out, in, 1, 1) becomes (out, in). A depthwise
    weight is (out, 9), (out, 3, 3) or (out, 1, 3, 3): a 3x3 kernel per channel, nothing else."""
    m = _floats(w, name, dt, input=True, what="the SANA functions")
    shape = tuple(m.shape)
    if depthwise:
        if not (m.ndim == 2 or (m.ndim == 3 and shape[1:] == (3, 3)) or (m.ndim == 4 and shape[1:] == (1, 3, 3))):
            raise ValueError(f"{name} must be a 3x3 depthwise kernel, (2h, 3, 3) or (2h, 1, 3, 3), got shape {shape}")
    elif m.ndim == 4 and shape[2:] != (1, 1):
        raise ValueError(f"{name} must be (out, in) or a 1x1 conv weight (out, in, 1, 1), got shape {shape}")
    elif m.ndim == 3:
        raise ValueError(f"{name} must be (out, in) or a 1x1 conv weight (out, in, 1, 1), got shape {shape}")
    if m.ndim in (3, 4):
        m = m.reshape(m.shape[0], int(np.prod(m.shape[1:])))  # not -1: out may be 0
    if m.ndim != 2:
        raise ValueError(f"{name} must have 2 or 4 dimensions, got shape {shape}")
    return np.ascontiguousarray(m)


def _vector(b: Any, name: str, dt: np.dtype) -> np.ndarray:
    v = _floats(b, name, dt, input=True, what="the SANA functions")
    if v.ndim != 1:
        raise ValueError(f"{name} must have 1 dimension, got shape {tuple(v.shape)}")
    return v


def _lite_args(dt, qkv_weight, proj_weight, proj_bias, head_dim, eps):
    return (_matrix(qkv_weight, "qkv_weight", dt), _matrix(proj_weight, "proj_weight", dt),
            None if proj_bias is None else _vector(proj_bias, "proj_bias", dt),
            _args.integer(head_dim, "head_dim"), _args.real(eps, "eps"))


def _ffn_args(dt, inverted_weight, inverted_bias, depth_weight, depth_bias, point_weight):
    return (_matrix(inverted_weight, "inverted_weight", dt), _vector(inverted_bias, "inverted_bias", dt),
            _matrix(depth_weight, "depth_weight", dt, depthwise=True), _vector(depth_bias, "depth_bias", dt),
            _matrix(point_weight, "point_weight", dt))


def lite_la(x: Any, qkv_weight: Any, proj_weight: Any, proj_bias: Any = None, head_dim: int = 32,
            eps: float = 1e-15, threads: int = 0) -> Any:
    """SANA's LiteLA on x (B, N, C): qkv_weight (3C, C) (rows of q, then k, then v),
    proj_weight (C, C), proj_bias (C,) or None. head_dim must divide C. Returns (B, N, C).
    Differentiable in x and every weight when given torch tensors that require grad."""
    if _args.wants_grad(x, qkv_weight, proj_weight, proj_bias):
        return _lite_la_differentiable(x, qkv_weight, proj_weight, proj_bias, head_dim, eps, threads)
    a, torch_in = _x(x)
    args = _lite_args(a.dtype, qkv_weight, proj_weight, proj_bias, head_dim, eps)
    out = getattr(_attn, "lite_la_" + _sfx(a))(a, *args, _args.integer(threads, "threads", 0, 256))
    return _out(out, torch_in)


def mix_ffn(x: Any, hw: Sequence[int], inverted_weight: Any, inverted_bias: Any, depth_weight: Any,
            depth_bias: Any, point_weight: Any, threads: int = 0) -> Any:
    """SANA's Mix-FFN (GLUMBConv) on x (B, N, C) laid out as hw = (H, W), N = H W:
    inverted_weight (2h, C[, 1, 1]) and inverted_bias (2h,), depth_weight (2h, [1,] 3, 3) and
    depth_bias (2h,), point_weight (C, h[, 1, 1]). Returns (B, N, C)."""
    if _args.wants_grad(x, inverted_weight, inverted_bias, depth_weight, depth_bias, point_weight):
        return _mix_ffn_differentiable(x, hw, inverted_weight, inverted_bias, depth_weight, depth_bias, point_weight,
                                       threads)
    a, torch_in = _x(x)
    h, w = _hw(hw, a.shape[1])
    args = _ffn_args(a.dtype, inverted_weight, inverted_bias, depth_weight, depth_bias, point_weight)
    out = getattr(_attn, "mix_ffn_" + _sfx(a))(a, h, w, *args, _args.integer(threads, "threads", 0, 256))
    return _out(out, torch_in)


def sana_block(x: Any, hw: Sequence[int], qkv_weight: Any, proj_weight: Any, proj_bias: Any,
               inverted_weight: Any, inverted_bias: Any, depth_weight: Any, depth_bias: Any, point_weight: Any,
               head_dim: int = 32, eps: float = 1e-15, norm_eps: float = 1e-6, threads: int = 0) -> Any:
    """A SANA block without conditioning: ``y = x + lite_la(LN(x)); out = y + mix_ffn(LN(y))``,
    LN over C without affine (eps ``norm_eps``). Weights as :func:`lite_la` and :func:`mix_ffn`."""
    if _args.wants_grad(x, qkv_weight, proj_weight, proj_bias, inverted_weight, inverted_bias, depth_weight,
                        depth_bias, point_weight):
        return _sana_block_differentiable(x, hw, qkv_weight, proj_weight, proj_bias, inverted_weight, inverted_bias,
                                          depth_weight, depth_bias, point_weight, head_dim, eps, norm_eps, threads)
    a, torch_in = _x(x)
    h, w = _hw(hw, a.shape[1])
    la = _lite_args(a.dtype, qkv_weight, proj_weight, proj_bias, head_dim, eps)
    ff = _ffn_args(a.dtype, inverted_weight, inverted_bias, depth_weight, depth_bias, point_weight)
    out = getattr(_attn, "sana_block_" + _sfx(a))(a, h, w, *la[:3], *ff, la[3], la[4], _args.real(norm_eps, "norm_eps"),
                                                  _args.integer(threads, "threads", 0, 256))
    return _out(out, torch_in)


# ---- the differentiable path: torch tensors that require grad -------------------------------------


def _torch_args(*xs):
    """torch tensors of xs (NumPy arrays become constant tensors; None stays None)."""
    import torch

    return [x if x is None or _is_torch(x) else torch.as_tensor(x) for x in xs]


def _flat(w, dt):
    """A weight as the C++ matrix, (out, in) or (2h, 9), in dtype dt: a reshape, so its gradient
    comes back in the weight's own shape."""
    if w.ndim in (3, 4):
        w = w.reshape(w.shape[0], w[0].numel())
    return w.to(dt).contiguous()


def _compiling() -> bool:
    import torch

    return torch.compiler.is_compiling()


def _lite_la_differentiable(x, qkv_weight, proj_weight, proj_bias, head_dim, eps, threads):
    from . import _torch_ops

    x, qkv_weight, proj_weight, proj_bias = _torch_args(x, qkv_weight, proj_weight, proj_bias)
    if not _compiling():  # the plain path's checks and messages, on detached views
        a, _ = _x(x.detach())
        _lite_args(a.dtype, qkv_weight.detach(), proj_weight.detach(),
                   None if proj_bias is None else proj_bias.detach(), head_dim, eps)
        threads = _args.integer(threads, "threads", 0, 256)
    dt = x.dtype
    return _torch_ops.lite_la_op(x.contiguous(), _flat(qkv_weight, dt), _flat(proj_weight, dt),
                                 None if proj_bias is None else proj_bias.to(dt).contiguous(), int(head_dim),
                                 float(eps), int(threads))


def _mix_ffn_differentiable(x, hw, inverted_weight, inverted_bias, depth_weight, depth_bias, point_weight, threads):
    from . import _torch_ops

    x, iw, ib, dw, db, pw = _torch_args(x, inverted_weight, inverted_bias, depth_weight, depth_bias, point_weight)
    if not _compiling():
        a, _ = _x(x.detach())
        _hw(hw, a.shape[1])
        _ffn_args(a.dtype, iw.detach(), ib.detach(), dw.detach(), db.detach(), pw.detach())
        threads = _args.integer(threads, "threads", 0, 256)
    dt = x.dtype
    return _torch_ops.mix_ffn_op(x.contiguous(), int(hw[0]), int(hw[1]), _flat(iw, dt), ib.to(dt).contiguous(),
                                 _flat(dw, dt), db.to(dt).contiguous(), _flat(pw, dt), int(threads))


def _sana_block_differentiable(x, hw, qkv_weight, proj_weight, proj_bias, inverted_weight, inverted_bias,
                               depth_weight, depth_bias, point_weight, head_dim, eps, norm_eps, threads):
    import torch

    x, = _torch_args(x)
    if not _compiling():
        a, _ = _x(x.detach())
        _hw(hw, a.shape[1])
        norm_eps = _args.real(norm_eps, "norm_eps")
        if not norm_eps >= 0:
            raise ValueError(f"sana_block: norm_eps must be non-negative, got {norm_eps}")
    c = x.shape[-1]
    ln = torch.nn.functional.layer_norm
    y = x + _lite_la_differentiable(ln(x, (c,), eps=float(norm_eps)), qkv_weight, proj_weight, proj_bias, head_dim,
                                    eps, threads)
    return y + _mix_ffn_differentiable(ln(y, (c,), eps=float(norm_eps)), hw, inverted_weight, inverted_bias,
                                       depth_weight, depth_bias, point_weight, threads)
