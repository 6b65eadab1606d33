"""attn's attention as torch custom operators, so autograd and torch.compile see through it.

``torch.ops.attn.attend(q, k, v, mechanism, layout, attn_mask, key_padding_lengths, alibi_slopes)``
returns ``(out, lse)`` and has a registered backward (``torch.ops.attn.attend_backward``, which is
:func:`attn.attend_backward`) and fake (meta) kernels, so ``torch.compile(fullgraph=True)`` traces
it without a graph break and ``torch.library.opcheck`` passes. :func:`attn.attend` and
:func:`attn.attention` call it when given torch tensors that require grad; the gradient then flows
to q, k and v (masks, padding and slopes are constants).

Families with a backward today: softmax (score=dot) and the patterns over it; asking another
family for a gradient raises the ValueError that says so, at backward time.
"""
from __future__ import annotations

import functools
from typing import List, Optional, Tuple

import torch

import attn

_OPTIONS = "Tensor? attn_mask, int[] key_padding_lengths, Tensor? alibi_slopes"


@functools.lru_cache(maxsize=256)
def _has_lse(mechanism: str) -> bool:
    """Whether the mechanism's family has an LSE (asked once per text, not once per step)."""
    return attn.info(mechanism)["has_lse"]


def _kwargs(attn_mask, key_padding_lengths, alibi_slopes):
    return dict(attn_mask=attn_mask, key_padding_lengths=list(key_padding_lengths) or None,
                alibi_slopes=alibi_slopes)


@torch.library.custom_op("attn::attend", mutates_args=())
def attend_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mechanism: str, layout: str,
              attn_mask: Optional[torch.Tensor], key_padding_lengths: List[int],
              alibi_slopes: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out, lse); lse is NaN for a family without one (its backward then says it has none)."""
    kw = _kwargs(attn_mask, key_padding_lengths, alibi_slopes)
    if _has_lse(mechanism):
        out, lse = attn.attend(q.detach(), k.detach(), v.detach(), mechanism, layout=layout, return_lse=True, **kw)
    else:
        out = attn.attend(q.detach(), k.detach(), v.detach(), mechanism, layout=layout, **kw)
        b, h, n = (q.shape[0], q.shape[2], q.shape[1]) if layout == "bnhd" else q.shape[:3]
        lse = torch.full((b, h, n), float("nan"))
    return out.contiguous(), lse.contiguous()


@attend_op.register_fake
def _attend_fake(q, k, v, mechanism, layout, attn_mask, key_padding_lengths, alibi_slopes):
    if layout == "bnhd":
        b, n, h, _ = q.shape
        out = q.new_empty((b, n, h, v.shape[-1]))
    else:
        b, h, n, _ = q.shape
        out = q.new_empty((b, h, n, v.shape[-1]))
    return out, q.new_empty((b, h, n), dtype=torch.float32)


@torch.library.custom_op("attn::attend_backward", mutates_args=())
def attend_backward_op(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, mechanism: str, layout: str, attn_mask: Optional[torch.Tensor],
                       key_padding_lengths: List[int], alibi_slopes: Optional[torch.Tensor],
                       dlse: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dq, dk, dv = attn.attend_backward(dout.detach(), q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(),
                                      mechanism, layout=layout, dlse=None if dlse is None else dlse.detach(),
                                      **_kwargs(attn_mask, key_padding_lengths, alibi_slopes))
    return dq.contiguous(), dk.contiguous(), dv.contiguous()


@attend_backward_op.register_fake
def _attend_backward_fake(dout, q, k, v, out, lse, mechanism, layout, attn_mask, key_padding_lengths, alibi_slopes,
                          dlse):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, mechanism, layout, attn_mask, key_padding_lengths, alibi_slopes = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.options = (mechanism, layout, attn_mask, key_padding_lengths, alibi_slopes)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    mechanism, layout, attn_mask, key_padding_lengths, alibi_slopes = ctx.options
    dq, dk, dv = attend_backward_op(dout.contiguous(), q, k, v, out, lse, mechanism, layout, attn_mask,
                                    key_padding_lengths, alibi_slopes, None if dlse is None else dlse.contiguous())
    return dq, dk, dv, None, None, None, None, None


attend_op.register_autograd(_backward, setup_context=_setup_context)


def attend(q, k, v, mechanism: str, layout: str, attn_mask=None, key_padding_lengths=None,
           alibi_slopes=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) through the custom op (differentiable in q, k and v)."""
    if alibi_slopes is not None and not isinstance(alibi_slopes, torch.Tensor):
        alibi_slopes = torch.as_tensor(alibi_slopes, dtype=torch.float32)
    return attend_op(q, k, v, mechanism, layout, attn_mask,
                     [] if key_padding_lengths is None else [int(x) for x in key_padding_lengths], alibi_slopes)
