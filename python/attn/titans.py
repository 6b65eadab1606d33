"""Titans neural long-term memory (C++: attn/titans.hpp; SPEC §6.3; docs/titans.md).

:func:`titans_memory` writes each token's key-value pair into a small network M by a gradient
step on ``||M(k_t) - v_t||^2`` (with momentum and forgetting) and reads ``y_t = M_t(q_t)``.
float32 inputs run the fast mini-batch form (batched matrix products); float64 inputs run the
float64 reference, the plain token loop. NumPy in gives NumPy out, torch in gives torch out (no
gradient flows back through the call).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

from . import _args, _attn

__all__ = ["titans_memory", "titans_init"]

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _array(x: Any, name: str, dtype: Optional[np.dtype] = None) -> np.ndarray:
    if _is_torch(x):
        x = x.detach().cpu().numpy()
    if isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_)):
        x = np.asarray(x, dtype=dtype or np.float64)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, torch.Tensor or number, got {type(x).__name__}")
    if dtype is None and x.dtype not in _FLOATS:
        raise TypeError(f"{name} must be float32 or float64, got {x.dtype}")
    return x if dtype is None else x.astype(dtype, copy=False)


def _names(memory: str) -> Tuple[str, ...]:
    return ("W",) if memory == "linear" else ("W1", "W2")


def _shapes(memory: str, d: int) -> Tuple[Tuple[int, int], ...]:
    return ((d, d),) if memory == "linear" else ((4 * d, d), (d, 4 * d))


def titans_init(d: int, memory: str = "mlp", heads: Optional[int] = None, seed: int = 0,
                dtype: Any = np.float32) -> Dict[str, np.ndarray]:
    """Initial weights M_0: linear ``{"W": zeros (d, d)}``; mlp ``{"W1", "W2"}`` drawn from
    N(0, 1/fan_in) with NumPy's default_rng(seed) (an MLP memory started at 0 never learns: its
    gradients are 0). With ``heads``, each array gets a leading (heads,) axis (one per head)."""
    d = _args.integer(d, "d", 1)
    memory = _args.text(memory, "memory")
    if memory not in ("linear", "mlp"):
        raise ValueError(f"memory must be 'linear' or 'mlp', got {memory!r}")
    lead = () if heads is None else (_args.integer(heads, "heads", 1),)
    if memory == "linear":
        return {"W": np.zeros(lead + (d, d), dtype=dtype)}
    rng = np.random.default_rng(_args.seed(seed))
    return {"W1": (rng.standard_normal(lead + (4 * d, d)) / np.sqrt(d)).astype(dtype),
            "W2": (rng.standard_normal(lead + (d, 4 * d)) / np.sqrt(4 * d)).astype(dtype)}


def titans_memory(q: Any, k: Any, v: Any, theta: Any, eta: Any, alpha: Any, memory: str = "linear",
                  w0: Any = None, batch_size: int = 16, loss: str = "sum", *, threads: int = 0,
                  return_momentum: bool = False) -> Tuple[Any, ...]:
    """Titans memory over sequences of tokens, per head.

    q, k, v: (B, H, N, d), one dtype (float32: the fast form; float64: the reference).
    theta (>= 0), eta, alpha (in [0, 1]): (B, H, N), or anything that broadcasts to it (a number).
    memory: "linear" (M(k) = W k) or "mlp" (M(k) = W2 gelu(W1 k), W1 (4d, d), W2 (d, 4d)).
    w0: M_0 as a dict of arrays (linear {"W"}, mlp {"W1", "W2"}), each of shape (...) shared,
    (H, ...) per head or (B, H, ...) per sequence; a bare array for linear; None: zeros for linear,
    ``titans_init(d, "mlp")`` for mlp. batch_size b: mini-batches of b tokens take their gradients
    at the state before the mini-batch (1: the online rule). loss: "sum" ||e||^2 or "mean" (/ d).

    Update per token: S_t = eta_t S_{t-1} - theta_t grad, M_t = (1 - alpha_t) M_{t-1} + S_t
    (S_0 = 0); y_t = M_t(q_t), read after token t's update.
    Returns (y (B, H, N, d), weights: dict of the final M_N, arrays (B, H, ...)), plus the final
    momentum S_N (a dict alike) with return_momentum=True."""
    torch_out = _is_torch(q)
    memory = _args.text(memory, "memory")
    loss = _args.text(loss, "loss")
    if memory not in ("linear", "mlp"):
        raise ValueError(f"memory must be 'linear' or 'mlp', got {memory!r}")
    if loss not in ("sum", "mean"):
        raise ValueError(f"loss must be 'sum' or 'mean', got {loss!r}")
    batch_size = _args.integer(batch_size, "batch_size", 1)
    threads = _args.integer(threads, "threads", 0, 256)
    return_momentum = _args.flag(return_momentum, "return_momentum")
    qa = _array(q, "q")
    dt = qa.dtype
    if qa.ndim != 4:
        raise ValueError(f"q must have 4 dimensions (B, H, N, d), got shape {tuple(qa.shape)}")
    B, H, N, d = qa.shape
    arrays = [np.ascontiguousarray(qa)]
    for name, x in (("k", k), ("v", v)):
        a = _array(x, name)
        if a.shape != qa.shape:
            raise ValueError(f"{name} must have q's shape (B, H, N, d) = {tuple(qa.shape)}, got {tuple(a.shape)}")
        arrays.append(np.ascontiguousarray(a, dtype=dt))
    for name, x in (("theta", theta), ("eta", eta), ("alpha", alpha)):
        a = _array(x, name)
        try:
            a = np.broadcast_to(a, (B, H, N))
        except ValueError:
            raise ValueError(f"{name} must have shape (B, H, N) = {(B, H, N)} (or broadcast to it), "
                             f"got {tuple(a.shape)}") from None
        arrays.append(np.ascontiguousarray(a, dtype=dt))
    if w0 is None and memory == "mlp":
        w0 = titans_init(d, "mlp", dtype=dt)
    flat = None
    if w0 is not None:
        if not isinstance(w0, dict):
            if memory != "linear":
                raise TypeError("w0 for memory='mlp' must be a dict {'W1': ..., 'W2': ...}")
            w0 = {"W": w0}
        names = _names(memory)
        if set(w0) != set(names):
            raise ValueError(f"w0 must hold the keys {list(names)} for memory={memory!r}, got {sorted(w0)}")
        parts, groups = [], None
        for name, shp in zip(names, _shapes(memory, d)):
            a = _array(w0[name], f"w0[{name!r}]")
            lead = a.shape[:-2]
            if a.shape[-2:] != shp or lead not in ((), (H,), (B, H)):
                raise ValueError(f"w0[{name!r}] must have shape {shp}, (H, *{shp}) or (B, H, *{shp}) with "
                                 f"B, H = {B}, {H}, got {tuple(a.shape)}")
            g = int(np.prod(lead)) if lead else 1
            if groups is not None and g != groups:
                raise ValueError(f"w0's arrays must have the same leading axes, got {g} and {groups} sets")
            groups = g
            parts.append(np.ascontiguousarray(a, dtype=dt).reshape(g, -1))
        flat = np.ascontiguousarray(np.concatenate(parts, axis=1))
    fn = _attn.titans_memory_f32 if dt == np.float32 else _attn.titans_memory_f64
    y, w, s = fn(*arrays, flat, memory, loss, batch_size, threads)

    def unflat(x: np.ndarray) -> Dict[str, Any]:
        out, at = {}, 0
        for name, shp in zip(_names(memory), _shapes(memory, d)):
            n = shp[0] * shp[1]
            out[name] = _out(np.ascontiguousarray(x[:, :, at:at + n].reshape(B, H, *shp)), torch_out)
            at += n
        return out

    result = (_out(y, torch_out), unflat(w))
    return result + (unflat(s),) if return_momentum else result


def _out(a: np.ndarray, torch_out: bool) -> Any:
    if torch_out:
        import torch

        return torch.from_numpy(a)
    return a
