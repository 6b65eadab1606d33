"""attn: attention mechanisms on the CPU behind one API.

Two entry points, both zero-copy on NumPy arrays and PyTorch CPU tensors (any strides) and
returning the same kind of array they were given:

* :func:`attention` -- exact softmax attention with the argument names of flash-attn and
  torch SDPA (``causal``, ``softmax_scale``, ``window_size``, ``softcap``, ``alibi_slopes``,
  ``attn_mask``, ``dropout_p``, ``return_lse``).
* :func:`attend` -- any mechanism by its text form, e.g. ``"softmax:causal,window=128:0"``;
  mechanisms added to the C++ library are reachable here without new bindings. Extra tensors
  a mechanism takes (e.g. the additive score's ``wq``, ``wk``, ``w``) go in ``params={...}``
  or as keyword arguments.
* :func:`explain` -- which implementation ("form") :func:`attend` would run, and why the
  others would not.

Layout: ``layout="bnhd"`` (default) means q is (batch, tokens, heads, head_dim) as in
flash-attn and most model code; ``layout="bhnd"`` means (batch, heads, tokens, head_dim) as
in torch SDPA. k and v may have fewer heads than q (MQA/GQA) when that number divides q's.

Causal masks are aligned bottom-right: query i sees key j iff j <= i + M - N (like
flash-attn; torch's ``is_causal`` is top-left when N != M). A query row that sees no key
returns zeros and its log-sum-exp is -inf.
"""
from __future__ import annotations

import warnings
from typing import Any, Mapping, Optional, Sequence, Tuple

import numpy as np

from . import _attn

__all__ = ["attention", "attend", "explain", "active_isa", "supported_isas", "set_isa", "canonical_mechanism"]
__version__ = "0.1.0"

active_isa = _attn.active_isa
supported_isas = _attn.supported_isas
set_isa = _attn.set_isa
canonical_mechanism = _attn.canonical_mechanism


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _dims(x: Any, layout: str) -> Tuple[int, int, int, int]:
    """(B, H, N, D) of a 4-D q/k/v array in the given layout."""
    if getattr(x, "ndim", None) != 4:
        raise ValueError(f"attention inputs must have 4 dimensions, got shape {tuple(getattr(x, 'shape', ()))}")
    b, a1, a2, d = (int(s) for s in x.shape)
    return (b, a2, a1, d) if layout == "bnhd" else (b, a1, a2, d)


def _prepare(x: Any, name: str) -> Any:
    """A view the C++ side can read without copying (torch: detached CPU tensor)."""
    if _is_torch(x):
        if x.device.type != "cpu":
            raise ValueError(f"{name} must be on the CPU, got device {x.device}")
        if x.requires_grad:
            import torch

            if torch.is_grad_enabled():
                warnings.warn(f"attn: {name} requires grad, but attn has no backward pass yet: the result "
                              "is detached (run under torch.no_grad() to silence this)", RuntimeWarning,
                              stacklevel=4)
        return x.detach()
    if isinstance(x, np.ndarray):
        return x
    raise TypeError(f"{name} must be a numpy.ndarray or torch.Tensor, got {type(x).__name__}")


def _empty_like_kind(ref: Any, shape: Sequence[int], dtype: Any = None) -> Any:
    if _is_torch(ref):
        import torch

        return torch.empty(tuple(shape), dtype=dtype if dtype is not None else ref.dtype)
    return np.empty(tuple(shape), dtype=dtype if dtype is not None else ref.dtype)


def _float32_of(ref: Any) -> Any:
    if _is_torch(ref):
        import torch

        return torch.float32
    return np.float32


def _expand_mask(mask: Any, b: int, h: int, n: int, m: int, name: str) -> Any:
    """Broadcast a mask/bias to (B, H, N, M) as a zero-copy view (stride 0 on broadcast dims)."""
    mask = _prepare(mask, name)
    if mask.ndim > 4 or mask.ndim < 2:
        raise ValueError(f"{name} must have 2 to 4 dimensions broadcastable to (B, H, N, M) = "
                         f"({b}, {h}, {n}, {m}), got shape {tuple(mask.shape)}")
    try:
        if _is_torch(mask):
            return mask.expand(b, h, n, m)
        return np.broadcast_to(mask, (b, h, n, m))
    except (RuntimeError, ValueError):
        raise ValueError(f"{name} must be broadcastable to (B, H, N, M) = ({b}, {h}, {n}, {m}), "
                         f"got shape {tuple(mask.shape)}") from None


def _as_float32_1d(x: Any, name: str) -> Optional[np.ndarray]:
    if x is None:
        return None
    if _is_torch(x):
        x = x.detach().cpu().numpy()
    return np.ascontiguousarray(np.asarray(x, dtype=np.float32).reshape(-1))


def _call_args(q: Any, k: Any, v: Any, layout: str, attn_mask: Any, key_padding_lengths: Any,
               alibi_slopes: Any, params: Optional[Mapping[str, Any]], additive_weights: Any,
               form: Optional[str], use_reference: bool, isa: Optional[str]):
    """Validated, zero-copy arguments shared by attend() and explain()."""
    if layout not in ("bnhd", "bhnd"):
        raise ValueError(f"layout must be 'bnhd' or 'bhnd', got {layout!r}")
    q, k, v = _prepare(q, "q"), _prepare(k, "k"), _prepare(v, "v")
    if _is_torch(q) != _is_torch(k) or _is_torch(q) != _is_torch(v):
        raise TypeError("q, k and v must all be numpy arrays or all torch tensors")
    b, h, n, _ = _dims(q, layout)
    m = _dims(k, layout)[2]
    mask = bias = None
    if attn_mask is not None:
        full = _expand_mask(attn_mask, b, h, n, m, "attn_mask")
        is_bool = (full.dtype == np.bool_) if not _is_torch(full) else (str(full.dtype) == "torch.bool")
        mask, bias = (full, None) if is_bool else (None, full)
    named = {}
    for name, x in (params or {}).items():
        named[str(name)] = _prepare(x, f"params[{name!r}]")
    if additive_weights is not None:
        if len(additive_weights) != 3:
            raise ValueError("additive_weights must be (wq, wk, w)")
        for name, x in zip(("wq", "wk", "w"), additive_weights):
            if name in named:
                raise ValueError(f"{name} is given both in additive_weights and in params")
            named[name] = _prepare(x, name)
    if use_reference:
        if form not in (None, "reference"):
            raise ValueError(f"use_reference=True conflicts with form={form!r}")
        form = "reference"
    lengths = [int(x) for x in key_padding_lengths] if key_padding_lengths is not None else []
    return (q, k, v, (b, h, n, m), mask, bias, lengths, _as_float32_1d(alibi_slopes, "alibi_slopes"), named,
            form or "", isa or "")


def attend(q: Any, k: Any, v: Any, mechanism: str = "softmax", *, attn_mask: Any = None,
           key_padding_lengths: Optional[Sequence[int]] = None, alibi_slopes: Any = None,
           params: Optional[Mapping[str, Any]] = None, additive_weights: Optional[Tuple[Any, Any, Any]] = None,
           layout: str = "bnhd", return_lse: bool = False, return_probs: bool = False, threads: int = 0,
           form: Optional[str] = None, isa: Optional[str] = None, use_reference: bool = False, **named_params: Any):
    """Attention by mechanism text form.

    Args:
        q: queries, (B, N, H, D) for layout "bnhd" or (B, H, N, D) for "bhnd"; float32,
            float16 or bfloat16 (torch only), any strides.
        k: keys, same layout with Hkv heads (Hkv divides H) and M tokens.
        v: values, like k with head dim Dv.
        mechanism: text form, e.g. "softmax", "softmax:causal,scale=0.1,window=128:0,softcap=30",
            "softmax:score=cosine", "softmax:entropy_scale=512", "softmax:dropout=0.1,seed=7".
        attn_mask: bool (True = may attend) or float (added to the scores) array broadcastable
            to (B, H, N, M), as in torch SDPA; always in (B, H, N, M) order whatever the layout.
        key_padding_lengths: valid keys per batch entry; keys at or past it are hidden.
        alibi_slopes: H or (B, H) slopes; adds -slope * |i + M - N - j|.
        params: named parameter tensors the mechanism takes, e.g. for "softmax:score=additive"
            {"wq": (A, D), "wk": (A, D), "w": (A,)}. A missing or unexpected name, or a wrong
            shape, raises ValueError naming it. Also accepted as keyword arguments
            (``attend(q, k, v, "softmax:score=additive", wq=wq, wk=wk, w=w)``).
        additive_weights: (wq, wk, w), the same as params for score=additive.
        layout: "bnhd" (default) or "bhnd".
        return_lse: also return the row log-sum-exp, (B, H, N) float32 (natural log).
        return_probs: also return the weights (B, H, N, M) float32, before dropout.
        threads: 0 = all cores (OMP_NUM_THREADS).
        form: force an implementation ("rows", "tiled", "reference" for softmax); None = the
            first that supports the call. See :func:`explain`.
        isa: kernel set for this call ("portable", "avx2", "avx512"); None = the active one.
        use_reference: same as form="reference": the float64 reference (slow, for checking).
        **named_params: named parameter tensors given as keyword arguments (merged into params).

    Returns:
        out in the layout and dtype of q (same kind: NumPy or torch), or a tuple
        (out, lse[, probs]) / (out, probs) when those are requested.
    """
    q, k, v, (b, h, n, m), mask, bias, lengths, slopes, named, form_, isa_ = _call_args(
        q, k, v, layout, attn_mask, key_padding_lengths, alibi_slopes, {**(params or {}), **named_params},
        additive_weights, form, use_reference, isa)
    dv = _dims(v, layout)[3]
    out = _empty_like_kind(q, (b, n, h, dv) if layout == "bnhd" else (b, h, n, dv))
    f32 = _float32_of(q)
    lse = _empty_like_kind(q, (b, h, n), f32) if return_lse else None
    probs = _empty_like_kind(q, (b, h, n, m), f32) if return_probs else None
    _attn.attend_into(q, k, v, mechanism, out, lse, probs, layout, lengths, mask, bias, slopes, named, int(threads),
                      form_, isa_)
    extra = tuple(x for x in (lse, probs) if x is not None)
    return (out,) + extra if extra else out


def explain(q: Any, k: Any, v: Any, mechanism: str = "softmax", *, attn_mask: Any = None,
            key_padding_lengths: Optional[Sequence[int]] = None, alibi_slopes: Any = None,
            params: Optional[Mapping[str, Any]] = None, additive_weights: Optional[Tuple[Any, Any, Any]] = None,
            layout: str = "bnhd", return_lse: bool = False, return_probs: bool = False, threads: int = 0,
            form: Optional[str] = None, isa: Optional[str] = None, use_reference: bool = False,
            **named_params: Any) -> str:
    """Which form :func:`attend` would run for these arguments, and why each other form would not.

    Takes exactly :func:`attend`'s arguments (q, k, v, mechanism, attn_mask, key_padding_lengths,
    alibi_slopes, params, additive_weights, layout, return_lse, return_probs, threads, form, isa,
    use_reference, **named_params) and validates them the same way (bad input raises the same
    error), but computes nothing. Example::

        >>> print(attn.explain(q, k, v, "softmax:causal", return_probs=True))
        softmax:causal (isa avx512): runs form 'tiled'
          rows      refused: probabilities requested  [...]
          tiled     chosen  [...]
          reference supported (lower priority)  [...]
    """
    q, k, v, _, mask, bias, lengths, slopes, named, form_, isa_ = _call_args(
        q, k, v, layout, attn_mask, key_padding_lengths, alibi_slopes, {**(params or {}), **named_params},
        additive_weights, form, use_reference, isa)
    return _attn.explain(q, k, v, mechanism, layout, lengths, mask, bias, slopes, named, int(threads), form_, isa_,
                         bool(return_lse), bool(return_probs))


def attention(q: Any, k: Any, v: Any, *, causal: bool = False, softmax_scale: Optional[float] = None,
              window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes: Any = None,
              attn_mask: Any = None, key_padding_lengths: Optional[Sequence[int]] = None,
              dropout_p: float = 0.0, seed: int = 0, layout: str = "bnhd", return_lse: bool = False,
              return_probs: bool = False, threads: int = 0):
    """Exact softmax attention, O = softmax(scale * q k^T + mask) v, with flash-attn's names.

    Args:
        q: (B, N, H, D) for layout "bnhd" (default) or (B, H, N, D) for "bhnd"; float32,
            float16 or bfloat16 (torch only); NumPy array or CPU torch tensor, any strides.
        k: (B, M, Hkv, D) / (B, Hkv, M, D); Hkv divides H (MQA: 1, GQA: H/groups).
        v: (B, M, Hkv, Dv) / (B, Hkv, M, Dv).
        causal: query i sees keys j <= i + M - N (bottom-right aligned, as flash-attn).
        softmax_scale: score scale; None = 1/sqrt(D).
        window_size: (left, right) sliding window around the diagonal i + M - N; -1 = unbounded.
        softcap: > 0 caps scores smoothly: cap * tanh(score / cap).
        alibi_slopes: H or (B, H) float32 slopes; adds -slope * |i + M - N - j|.
        attn_mask: bool (True = may attend) or additive float mask broadcastable to
            (B, H, N, M), as torch SDPA's attn_mask.
        key_padding_lengths: valid keys per batch entry (keys past it are hidden).
        dropout_p: dropout on the weights (training); reproducible for a given seed
            whatever the thread count.
        seed: dropout seed.
        layout: "bnhd" or "bhnd".
        return_lse / return_probs: also return the row log-sum-exp (B, H, N) and the weights
            (B, H, N, M), both float32 (weights before dropout).
        threads: 0 = all cores.

    Returns:
        out with q's layout, dtype and kind; or (out, lse[, probs]) when requested.
        A row that sees no key returns zeros and lse = -inf.

    Example:
        >>> import numpy as np, attn
        >>> q = np.random.randn(1, 128, 8, 64).astype(np.float32)
        >>> out = attn.attention(q, q, q, causal=True)
        >>> out.shape
        (1, 128, 8, 64)
    """
    opts = []
    if causal:
        opts.append("causal")
    if softmax_scale is not None:
        opts.append(f"scale={float(softmax_scale)!r}")
    left, right = (int(x) for x in window_size)
    if (left, right) != (-1, -1):
        opts.append(f"window={left}:{right}")
    if softcap:
        opts.append(f"softcap={float(softcap)!r}")
    if dropout_p:
        opts.append(f"dropout={float(dropout_p)!r}")
        opts.append(f"seed={int(seed)}")
    mechanism = "softmax" + (":" + ",".join(opts) if opts else "")
    return attend(q, k, v, mechanism, attn_mask=attn_mask, key_padding_lengths=key_padding_lengths,
                  alibi_slopes=alibi_slopes, layout=layout, return_lse=return_lse,
                  return_probs=return_probs, threads=threads)
