"""attn's attention as torch custom operators, so autograd and torch.compile see through it.

``torch.ops.attn.attend(q, k, v, mechanism, layout, attn_mask, key_padding_lengths, alibi_slopes,
param_names="", params=None, threads=0, form=None, isa=None, precision=None)`` returns ``(out, lse)``
and has a registered backward
(``torch.ops.attn.attend_backward``, which is :func:`attn.attend_backward`) and fake (meta) kernels,
so ``torch.compile(fullgraph=True)`` traces it without a graph break and ``torch.library.opcheck``
passes. :func:`attn.attend` and :func:`attn.attention` call it when given torch tensors that require
grad; the gradient then flows to q, k and v (masks, padding and slopes are constants: a float mask
or slopes that require grad are a ValueError, never a silent None) and to the
named params that have one: ``param_names`` is their names joined by commas (a schema takes no list
of str), ``params`` the tensors in that order. Linformer's "E" and "F" get gradients
(``attn.attend(q, k, v, "linformer:k=64", params={"E": E, "F": F})``), as do PolaFormer's "power"
and "coefficients" and a linear mechanism's "initial_state" (through the output); a param that
requires grad but has none (decay, omega, ...) is a ValueError at backward time.

Families with a backward: every one. Softmax (dot, cosine and additive scores; the additive score's
"wq", "wk" and "w" get gradients) and the patterns over it, GAU, linformer, LSH (its buckets are
constants: LSH's "rotations" param gets no gradient), DCA, efficient attention (with its
"initial_state"), qsoftmax (its "initial_state" gets a gradient, as the linear family's) and the
linear family (linear, retention, sana, normattn, performer, polaformer); a param without a gradient
that requires grad raises the ValueError that says so, at backward time.

``torch.ops.attn.linear_attention(q, k, v, mechanism, layout, initial_state, decay,
key_padding_lengths)`` returns ``(o, final_state)`` of a linear mechanism (the text of
:func:`attn.linear_attention`'s mechanism), with ``torch.ops.attn.linear_attention_backward`` as its
registered backward: gradients flow to q, k, v and initial_state, and in through the final state
(``decay`` per head and the padding are constants). :func:`attn.linear_attention` calls it when
given torch tensors that require grad. Its last argument ``cu_seqlens`` (a list of ints, or None)
packs sequences of different lengths into batch 1, as fla's: the state starts afresh at each
boundary, initial_state and final_state hold one state per sequence, and the backward
(``attn::attend_varlen_backward``) gives each sequence's gradients as if it ran alone.

Run options: both forward ops also take ``threads`` (0 = every CPU this process may use), ``form``,
``isa`` and ``precision`` (None = the defaults of :func:`attn.attend`). ``threads``, ``isa`` and
``precision`` reach the backward too (``torch.ops.attn.attend_backward(..., threads, isa,
precision)``); ``form`` names a forward form and applies to the forward only: the backward picks its
own form (its names differ: ``attn check --backward`` lists them). The results are bitwise the same
for any thread count.

``torch.ops.attn.attend_stats(q, k, v, mechanism, layout, attn_mask, key_padding_lengths,
alibi_slopes, param_names, params, stats_topk, threads, form, isa, precision)`` returns the row
statistics (sparsity, entropy, max_weight, topk_mass) of :func:`attn.attend`'s ``return_stats``, each
(B, H, N) float32: a second forward call with the same options (the statistics have no gradient,
and the differentiable op returns out and lse only); it has no backward.

Both backward ops are first-order only: differentiating a gradient again (``create_graph=True``
and a second backward) raises a RuntimeError naming the op.
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


@torch.compiler.assume_constant_result
def has_lse(mechanism: str) -> bool:
    """_has_lse, which torch.compile evaluates while tracing (a fact of the text, not a graph break)."""
    return _has_lse(mechanism)


def _names(param_names: str) -> List[str]:
    return param_names.split(",") if param_names else []


def _kwargs(attn_mask, key_padding_lengths, alibi_slopes, param_names="", params=None, **run):
    """attn.attend's keyword arguments for the op's inputs; `run`: threads, form, isa, precision."""
    names, tensors = _names(param_names), list(params or [])
    if len(names) != len(tensors):
        raise ValueError(f"param_names names {len(names)} params ({param_names!r}), but {len(tensors)} tensors "
                         f"were given")
    return dict(attn_mask=attn_mask, key_padding_lengths=list(key_padding_lengths) or None,
                alibi_slopes=alibi_slopes, params={n: t.detach() for n, t in zip(names, tensors)} or None, **run)


@torch.library.custom_op("attn::attend", mutates_args=())
def attend_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mechanism: str, layout: str,
              attn_mask: Optional[torch.Tensor], key_padding_lengths: List[int],
              alibi_slopes: Optional[torch.Tensor], param_names: str = "",
              params: Optional[List[torch.Tensor]] = None, threads: int = 0, form: Optional[str] = None,
              isa: Optional[str] = None, precision: Optional[str] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out, lse); lse is zeros for a family without one, a placeholder its backward ignores (not NaN:
    opcheck compares the op's outputs with NaN != NaN)."""
    kw = _kwargs(attn_mask, key_padding_lengths, alibi_slopes, param_names, params, threads=threads, form=form,
                 isa=isa, precision=precision)
    if _has_lse(mechanism):
        out, lse = attn.attend(q.detach(), k.detach(), v.detach(), mechanism, layout=layout, return_lse=True, **kw)
    else:
        out = attn.attend(q.detach(), k.detach(), v.detach(), mechanism, layout=layout, **kw)
        b, h, n = (q.shape[0], q.shape[2], q.shape[1]) if layout == "bnhd" else q.shape[:3]
        lse = torch.zeros((b, h, n))
    return out.contiguous(), lse.contiguous()


@attend_op.register_fake
def _attend_fake(q, k, v, mechanism, layout, attn_mask, key_padding_lengths, alibi_slopes, param_names="",
                 params=None, threads=0, form=None, isa=None, precision=None):
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
                       dlse: Optional[torch.Tensor], param_names: str = "",
                       params: Optional[List[torch.Tensor]] = None, threads: int = 0, isa: Optional[str] = None,
                       precision: Optional[str] = None
                       ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, List[torch.Tensor]]:
    """(dq, dk, dv, dparams): dparams one tensor per param in its dtype, or an empty tensor for a
    param without a gradient (an op returns tensors, not None). No form: the backward picks its own
    (the forward's form names are not the backward's)."""
    if _has_lse(mechanism):
        lse, dlse = lse.detach(), None if dlse is None else dlse.detach()
    else:  # linear, GAU, qsoftmax: no lse (the forward's is a placeholder) and so no gradient through it
        lse = dlse = None
    grads = attn.attend_backward(dout.detach(), q.detach(), k.detach(), v.detach(), out.detach(), lse,
                                 mechanism, layout=layout, dlse=dlse,
                                 **_kwargs(attn_mask, key_padding_lengths, alibi_slopes, param_names, params,
                                           threads=threads, isa=isa, precision=precision))
    found = dict(grads[-1]) if isinstance(grads[-1], dict) else {}
    if "initial_state" in _names(param_names) and len(grads) > 3 and not isinstance(grads[3], dict):
        found["initial_state"] = grads[3]
    dparams = [found[n].to(p.dtype).contiguous() if n in found else p.new_empty((0,))
               for n, p in zip(_names(param_names), params or [])]
    return grads[0].contiguous(), grads[1].contiguous(), grads[2].contiguous(), dparams


@functools.lru_cache(maxsize=256)
def _has_gradient(mechanism: str, name: str) -> bool:
    """Whether attend_backward returns a gradient for params[name] of this mechanism (its facts)."""
    return any(s["name"] == name and s["gradient"] for s in attn.info(mechanism)["param_specs"])


@attend_backward_op.register_fake
def _attend_backward_fake(dout, q, k, v, out, lse, mechanism, layout, attn_mask, key_padding_lengths, alibi_slopes,
                          dlse, param_names="", params=None, threads=0, isa=None, precision=None):
    dparams = [torch.empty_like(p) if _has_gradient(mechanism, n) else p.new_empty((0,))
               for n, p in zip(_names(param_names), params or [])]
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dparams


def _setup_context(ctx, inputs, output):
    # torch gives every input, those left out of the call at their defaults
    (q, k, v, mechanism, layout, attn_mask, key_padding_lengths, alibi_slopes, param_names, params, threads, form,
     isa, precision) = inputs
    params = list(params) if params is not None else []
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, *params)
    ctx.options = (mechanism, layout, attn_mask, key_padding_lengths, alibi_slopes, param_names)
    ctx.run = (threads, isa, precision)  # not form: a forward form's name is not the backward's
    ctx.shape_of_inputs = (len(inputs), inputs[9] is not None)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, *params = ctx.saved_tensors
    mechanism, layout, attn_mask, key_padding_lengths, alibi_slopes, param_names = ctx.options
    count, params_given = ctx.shape_of_inputs
    for i, name in ((5, "attn_mask"), (7, "alibi_slopes")):  # constants of the op: say so, not a silent None
        if ctx.needs_input_grad[i]:
            raise ValueError(f"attend_backward: {name} requires grad, but attn has no gradient for {name}: "
                             f"pass {name}.detach()")
    dq, dk, dv, dparams = attend_backward_op(dout.contiguous(), q, k, v, out, lse, mechanism, layout, attn_mask,
                                             key_padding_lengths, alibi_slopes,
                                             None if dlse is None else dlse.contiguous(), param_names, params,
                                             *ctx.run)
    wanted = ctx.needs_input_grad[9] if params_given else []
    grads = []
    for i, (name, p, g) in enumerate(zip(_names(param_names), params, dparams)):
        has = g.shape == p.shape and _has_gradient(mechanism, name)
        if not has and wanted[i]:
            raise ValueError(f"attend_backward: {mechanism} returns no gradient for params['{name}'] (detach it)")
        grads.append(g if has and wanted[i] else None)
    # one entry per input: an empty int list counts as an (empty) list of tensors
    result = [dq, dk, dv, None, None, None, [] if len(key_padding_lengths) == 0 else None, None, None,
              grads if params_given else None, None, None, None, None]
    return tuple(result[:count])


attend_op.register_autograd(_backward, setup_context=_setup_context)


def _no_double_backward(op: str):
    """The autograd formula of a backward op: differentiating it again (create_graph=True, then a
    gradient of the gradient) is refused by name, not with torch's "no autograd formula"."""
    def backward(ctx, *grads):
        raise RuntimeError(f"{op}: double backward is not supported (attn's backward has no gradient of its own; a "
                           f"gradient penalty or Hessian-vector product through {op} needs a differentiable "
                           f"implementation, e.g. torch's scaled_dot_product_attention)")
    return backward


def _nothing_to_save(ctx, inputs, output):
    pass


attend_backward_op.register_autograd(_no_double_backward("attn.attend (torch.ops.attn.attend)"),
                                     setup_context=_nothing_to_save)


def _op_inputs(attn_mask, key_padding_lengths, alibi_slopes, params):
    """The ops' form of attend's mask, padding, slopes and params: (attn_mask, lengths, slopes,
    param_names, params)."""
    if alibi_slopes is not None and not isinstance(alibi_slopes, torch.Tensor):
        alibi_slopes = torch.as_tensor(alibi_slopes, dtype=torch.float32)
    names = sorted(params or {})
    if any("," in n for n in names):
        raise ValueError(f"param names must not contain ',', got {names}")
    tensors = [params[n] if isinstance(params[n], torch.Tensor) else torch.as_tensor(params[n]) for n in names]
    return (attn_mask, [] if key_padding_lengths is None else [int(x) for x in key_padding_lengths], alibi_slopes,
            ",".join(names), tensors or None)


def attend(q, k, v, mechanism: str, layout: str, attn_mask=None, key_padding_lengths=None,
           alibi_slopes=None, params=None, threads: int = 0, form: Optional[str] = None, isa: Optional[str] = None,
           precision: Optional[str] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) through the custom op (differentiable in q, k, v and the params that have a
    gradient); params: a dict of named tensors, or None. threads, isa and precision apply to the
    forward and the backward, form to the forward only."""
    return attend_op(q, k, v, mechanism, layout, *_op_inputs(attn_mask, key_padding_lengths, alibi_slopes, params),
                     threads, form, isa, precision)


@torch.library.custom_op("attn::attend_stats", mutates_args=())
def attend_stats_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mechanism: str, layout: str,
                    attn_mask: Optional[torch.Tensor], key_padding_lengths: List[int],
                    alibi_slopes: Optional[torch.Tensor], param_names: str = "",
                    params: Optional[List[torch.Tensor]] = None, stats_topk: int = 8, threads: int = 0,
                    form: Optional[str] = None, isa: Optional[str] = None, precision: Optional[str] = None
                    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sparsity, entropy, max_weight, topk_mass), each (B, H, N) float32: attn.attend's
    return_stats for these inputs and options (no gradient: the op has no backward)."""
    kw = _kwargs(attn_mask, key_padding_lengths, alibi_slopes, param_names, params, threads=threads, form=form,
                 isa=isa, precision=precision)
    *_, stats = attn.attend(q.detach(), k.detach(), v.detach(), mechanism, layout=layout, return_stats=True,
                            stats_topk=stats_topk, **kw)
    return tuple(x.contiguous() for x in stats)


@attend_stats_op.register_fake
def _attend_stats_fake(q, k, v, mechanism, layout, attn_mask, key_padding_lengths, alibi_slopes, param_names="",
                       params=None, stats_topk=8, threads=0, form=None, isa=None, precision=None):
    b, h, n = (q.shape[0], q.shape[2], q.shape[1]) if layout == "bnhd" else q.shape[:3]
    return tuple(q.new_empty((b, h, n), dtype=torch.float32) for _ in range(4))


def attend_stats(q, k, v, mechanism: str, layout: str, attn_mask=None, key_padding_lengths=None, alibi_slopes=None,
                 params=None, stats_topk: int = 8, threads: int = 0, form: Optional[str] = None,
                 isa: Optional[str] = None, precision: Optional[str] = None) -> Tuple[torch.Tensor, ...]:
    """attn.attend's row statistics through the op (a second forward call with the same options),
    as tensors without grad: the inputs are detached (the statistics have no gradient)."""
    inputs = _op_inputs(attn_mask, key_padding_lengths, alibi_slopes, params)
    return attend_stats_op(q.detach(), k.detach(), v.detach(), mechanism, layout, *inputs[:4],
                           None if inputs[4] is None else [t.detach() for t in inputs[4]], stats_topk, threads, form,
                           isa, precision)


# ---- the linear family: (o, final_state) and its backward --------------------------------------


@functools.lru_cache(maxsize=256)
def _extra_state_columns(mechanism: str) -> int:
    """The state's columns past Dv: 1 for a linear mechanism's normaliser (Dv + 1), 2 for efficient
    attention's z and m (Dv + 2), else 0."""
    shape = attn.info(mechanism)["state_shape"]
    return int(shape[shape.rindex("+") + 1:-1]) if shape.endswith(")") and "+" in shape else 0


def _linear_params(initial_state, decay):
    params = {}
    if initial_state is not None:
        params["initial_state"] = initial_state.detach()
    if decay is not None:
        params["decay"] = decay.detach()
    return params


@torch.library.custom_op("attn::linear_attention", mutates_args=())
def linear_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mechanism: str, layout: str,
                        initial_state: Optional[torch.Tensor], decay: Optional[torch.Tensor],
                        key_padding_lengths: List[int], threads: int = 0, form: Optional[str] = None,
                        isa: Optional[str] = None, precision: Optional[str] = None, cu_seqlens: Optional[List[int]] = None
                        ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(o, final_state) of a linear mechanism (or efficient attention); final_state (B, H, F, Dv [+ 1])
    float32 (efficient: (B, H, D, Dv + 2)). cu_seqlens (packed sequences in batch 1, the state reset
    at each boundary): initial_state and final_state one per sequence, (S, H, F, Dv [+ 1])."""
    run = dict(threads=threads, form=form, isa=isa, precision=precision)
    if cu_seqlens:
        out, state = attn._linear_varlen(q.detach(), k.detach(), v.detach(), mechanism, list(cu_seqlens),
                                         _linear_params(initial_state, decay), True, layout, run)
        return out.contiguous(), state.contiguous()
    out, state = attn.attend(q.detach(), k.detach(), v.detach(), mechanism, layout=layout, return_final_state=True,
                             params=_linear_params(initial_state, decay),
                             key_padding_lengths=list(key_padding_lengths) or None, **run)
    return out.contiguous(), state.contiguous()


@linear_attention_op.register_fake
def _linear_attention_fake(q, k, v, mechanism, layout, initial_state, decay, key_padding_lengths, threads=0, form=None,
                           isa=None, precision=None, cu_seqlens=None):
    b, h = q.shape[0], (q.shape[2] if layout == "bnhd" else q.shape[1])
    if cu_seqlens:
        b = len(cu_seqlens) - 1
    out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
    state = q.new_empty((b, h, q.shape[-1], v.shape[-1] + _extra_state_columns(mechanism)), dtype=torch.float32)
    return out, state


@torch.library.custom_op("attn::linear_attention_backward", mutates_args=())
def linear_attention_backward_op(dout: torch.Tensor, dfinal_state: Optional[torch.Tensor], q: torch.Tensor,
                                 k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, mechanism: str, layout: str,
                                 initial_state: Optional[torch.Tensor], decay: Optional[torch.Tensor],
                                 key_padding_lengths: List[int], threads: int = 0, isa: Optional[str] = None,
                                 precision: Optional[str] = None, cu_seqlens: Optional[List[int]] = None
                                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, d_initial_state); d_initial_state in initial_state's dtype, or an empty tensor
    when there is no initial state (an op returns tensors, not None). No form: the backward picks
    its own. cu_seqlens: the packed sequences' gradients (attn::attend_varlen_backward)."""
    df = None if dfinal_state is None else dfinal_state.detach()
    if cu_seqlens:
        grads = attn._linear_varlen_backward(dout.detach(), q.detach(), k.detach(), v.detach(), out.detach(),
                                             mechanism, list(cu_seqlens), _linear_params(initial_state, decay), df,
                                             layout, dict(threads=threads, isa=isa, precision=precision))
    else:
        grads = attn.attend_backward(dout.detach(), q.detach(), k.detach(), v.detach(), out.detach(), None, mechanism,
                                     layout=layout, params=_linear_params(initial_state, decay),
                                     key_padding_lengths=list(key_padding_lengths) or None, dfinal_state=df,
                                     threads=threads, isa=isa, precision=precision)
    dq, dk, dv = (g.contiguous() for g in grads[:3])
    ds0 = grads[3].to(initial_state.dtype).contiguous() if initial_state is not None else q.new_empty((0,))
    return dq, dk, dv, ds0


@linear_attention_backward_op.register_fake
def _linear_attention_backward_fake(dout, dfinal_state, q, k, v, out, mechanism, layout, initial_state, decay,
                                    key_padding_lengths, threads=0, isa=None, precision=None, cu_seqlens=None):
    ds0 = torch.empty_like(initial_state) if initial_state is not None else q.new_empty((0,))
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), ds0


def _linear_setup_context(ctx, inputs, output):
    (q, k, v, mechanism, layout, initial_state, decay, key_padding_lengths, threads, form, isa, precision,
     cu_seqlens) = inputs
    out, _ = output
    ctx.save_for_backward(q, k, v, out, initial_state, decay)
    ctx.options = (mechanism, layout, list(key_padding_lengths))
    # not form: a forward form's name is not the backward's
    ctx.run = (threads, isa, precision, None if cu_seqlens is None else list(cu_seqlens))


def _linear_backward(ctx, dout, dfinal_state):
    q, k, v, out, initial_state, decay = ctx.saved_tensors
    mechanism, layout, key_padding_lengths = ctx.options
    if ctx.needs_input_grad[6]:  # a constant of the op: say so, not a silent None
        raise ValueError("linear_attention_backward: decay requires grad, but attn has no gradient for decay: "
                         "pass decay.detach()")
    dq, dk, dv, ds0 = linear_attention_backward_op(
        dout.contiguous(), None if dfinal_state is None else dfinal_state.contiguous(), q, k, v, out, mechanism,
        layout, initial_state, decay, key_padding_lengths, *ctx.run)
    return (dq, dk, dv, None, None, (ds0 if initial_state is not None else None), None, None, None, None, None, None,
            None)


linear_attention_op.register_autograd(_linear_backward, setup_context=_linear_setup_context)
linear_attention_backward_op.register_autograd(
    _no_double_backward("attn.linear_attention (torch.ops.attn.linear_attention)"), setup_context=_nothing_to_save)


def linear_attention(q, k, v, mechanism: str, layout: str, initial_state=None, decay=None,
                     key_padding_lengths=None, threads: int = 0, form: Optional[str] = None, isa: Optional[str] = None,
                     precision: Optional[str] = None, cu_seqlens=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(o, final_state) through the custom op (differentiable in q, k, v and initial_state);
    threads, isa and precision apply to the forward and the backward, form to the forward only;
    cu_seqlens: packed sequences (a list of ints), the state reset at each boundary."""
    if decay is not None and not isinstance(decay, torch.Tensor):
        decay = torch.as_tensor(decay, dtype=torch.float32)
    return linear_attention_op(q, k, v, mechanism, layout, initial_state, decay,
                               [] if key_padding_lengths is None else [int(x) for x in key_padding_lengths],
                               threads, form, isa, precision,
                               None if cu_seqlens is None else [int(x) for x in cu_seqlens])
