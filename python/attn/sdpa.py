"""PyTorch's ``torch.nn.functional.scaled_dot_product_attention`` with its arguments, layout and
causal convention, computed by attn.

    >>> import torch, attn
    >>> q, k, v = torch.randn(2, 8, 128, 64), torch.randn(2, 8, 128, 64), torch.randn(2, 8, 128, 64)
    >>> out = attn.scaled_dot_product_attention(q, k, v, is_causal=True)   # (B, H, N, D), as torch's

Differences from attn's own :func:`attn.attention`, all torch's conventions:

- layout (..., H, L, E): heads before tokens (attn.attention takes flash-attn's (B, N, H, D));
  3-D inputs (H, L, E) are a batch of one.
- ``is_causal`` aligns the mask top-left: query i sees keys j <= i whatever L and S are (attn's
  ``causal`` aligns bottom-right, j <= i + S - L, as flash-attn); the two agree when L == S.
- GQA (fewer key/value heads than query heads) only with ``enable_gqa=True``.
- ``attn_mask`` (bool: True takes part; float: added to the scores) broadcasts to (B, H, L, S);
  ``attn_mask`` and ``is_causal`` together are an error, as in torch.

Where the results differ from torch's: a row that sees no key is zeros here (torch's math path
gives NaN); dropout draws from the same distribution with attn's counter-based generator (a hash
of a seed taken from torch's default generator, so ``torch.manual_seed`` makes it reproducible),
not torch's sequence. Gradients flow to query, key and value as through :func:`attn.attention`.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from . import _args

__all__ = ["scaled_dot_product_attention"]


def _dims(x: Any, name: str) -> int:
    shape = getattr(x, "shape", None)
    if shape is None:
        raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(x).__name__}")
    if len(shape) not in (3, 4):
        raise ValueError(f"{name} must be (B, H, L, E) or (H, L, E), got {len(shape)} dimensions {tuple(shape)}")
    return len(shape)


def _top_left_causal(query: Any, L: int, S: int) -> Any:
    """The (L, S) bool mask of torch's is_causal: query i sees keys j <= i."""
    if _args.is_torch(query):
        import torch
        return torch.ones(L, S, dtype=torch.bool).tril()
    import numpy as np
    return np.tril(np.ones((L, S), dtype=bool))


def _dropout_seed(query: Any) -> int:
    if _args.is_torch(query):
        import torch
        return int(torch.randint(0, 2**62, (1,)).item())
    import numpy as np
    return int(np.random.randint(0, 2**62, dtype=np.int64))


def scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False) -> Any:
    """softmax(query key^T * scale + mask) value, with torch.nn.functional.scaled_dot_product_attention's
    arguments and semantics (module docstring: the top-left causal mask, the (B, H, L, E) layout).

    Args:
        query: (B, Hq, L, E) or (Hq, L, E); float32, float16 or bfloat16 (torch), any strides.
        key: (B, H, S, E) / (H, S, E); H == Hq, or H divides Hq with ``enable_gqa=True``.
        value: (B, H, S, Ev) / (H, S, Ev).
        attn_mask: bool (True = takes part) or float (added), broadcastable to (B, Hq, L, S).
        dropout_p: probability of dropping a weight (the rest scaled by 1 / (1 - p)).
        is_causal: top-left causal mask (query i sees keys j <= i); not with attn_mask.
        scale: score scale; None = 1 / sqrt(E).
        enable_gqa: allow fewer key/value heads than query heads.

    Returns:
        (B, Hq, L, Ev) (or (Hq, L, Ev)), query's kind and dtype.
    """
    from . import attention

    rank = _dims(query, "query")
    for x, name in ((key, "key"), (value, "value")):
        if _dims(x, name) != rank:
            raise ValueError(f"{name} must have query's {rank} dimensions, got {tuple(x.shape)} for query "
                             f"{tuple(query.shape)}")
    is_causal = _args.flag(is_causal, "is_causal")
    enable_gqa = _args.flag(enable_gqa, "enable_gqa")
    dropout_p = _args.real(dropout_p, "dropout_p")
    if scale is not None:
        scale = _args.real(scale, "scale")
    if is_causal and attn_mask is not None:
        raise ValueError("attn_mask and is_causal: give one of them (as torch's scaled_dot_product_attention)")
    if rank == 3:
        query, key, value = query[None], key[None], value[None]
        if attn_mask is not None and len(getattr(attn_mask, "shape", ())) == 3:
            attn_mask = attn_mask[None]
    hq, h = query.shape[1], key.shape[1]
    if hq != h and not enable_gqa:
        raise ValueError(f"key has {h} heads and query {hq}: fewer key/value heads than query heads need "
                         f"enable_gqa=True (as torch's scaled_dot_product_attention)")
    L, S, E = query.shape[2], key.shape[2], query.shape[3]
    causal = False
    if is_causal:
        if L == S:
            causal = True  # top-left and bottom-right agree
        else:
            attn_mask = _top_left_causal(query, L, S)
    out = attention(query, key, value, causal=causal, softmax_scale=scale if scale is not None or E == 0 else 1.0 / math.sqrt(E),
                    attn_mask=attn_mask, dropout_p=dropout_p, seed=_dropout_seed(query) if dropout_p > 0 else 0,
                    layout="bhnd")
    return out[0] if rank == 3 else out
