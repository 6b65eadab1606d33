"""Attention-weight refinement, AWRSR (C++: attn/refinement.hpp; docs/attention-refinement.md).

Liu, Liu & Liu, "Pay Attention to Attention for Sequential Recommendation" (RecSys 2024) refine
a causal attention-weight matrix A by treating its rows as features: trained matrices W_1, W_2
(N, r) make new queries A W_1 and keys A W_2, and

    A^ = softmax((A W_1)(A W_2)^T / sqrt(r) + causal mask)

* ``simple``:          O = A^ V
* ``value_weighted``:  O = (A^ A) V
* ``additive``:        O = ((1 - gamma) A + gamma A^) V
* ``stochastic``:      mu = A W_1, sigma = elu(A W_2) + 1 (W_1 = W_mu, W_2 = W_Sigma),
  A^ = softmax(-|mu_i - mu_j|^2 - |sigma_i - sigma_j|^2 + causal mask), O = A^ V.

The paper's equations were not found; these formulas are our reading of its text [unverified].
float32 runs the fast C++ form (products through the kernel table's gemm), float64 the plain
reference. NumPy in, NumPy out; torch in, torch out. :func:`refine_attention` trains: given torch
tensors that require grad (grad enabled), it runs the custom op ``torch.ops.attn.refine_attention``
(attn/blocks/_torch_ops.py) and gradients flow to a, v, w1 and w2 (C++
``refine_attention_backward``: the fast float32 form or the float64 reference, by a's dtype);
``torch.compile(fullgraph=True)`` traces it. a's gradient covers every entry, those above the
diagonal too (what autograd of ``a @ w1`` gives). :func:`refined_weights` has no gradient (a tensor
that requires grad gets a RuntimeWarning naming it).
"""
from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from .. import _args, _attn
from .._args import floats as _floats, is_torch as _is_torch, torch_if as _out

__all__ = ["refine_attention", "refined_weights", "REFINE_FORMS"]

REFINE_FORMS = ("simple", "value_weighted", "additive", "stochastic")


def _prepare(a: Any, w1: Any, w2: Any, form: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray, Tuple[int, ...], bool]:
    torch_in = _is_torch(a)
    form = _args.text(form, "form")
    if form not in REFINE_FORMS:
        raise ValueError(f"form must be one of {', '.join(REFINE_FORMS)}, got {form!r}")
    aa = _floats(a, "a", input=True, what="the refinement functions")
    if aa.ndim < 2 or aa.shape[-1] != aa.shape[-2]:
        raise ValueError(f"a must be square in its last two dimensions (..., N, N), got shape {tuple(aa.shape)}")
    n1, n2 = ("w_mu", "w_sigma") if form == "stochastic" else ("w1", "w2")
    w = []
    for x, name in ((w1, n1), (w2, n2)):
        m = _floats(x, name, aa.dtype, input=True, what="the refinement functions")
        if m.ndim != 2:
            raise ValueError(f"{name} must have 2 dimensions (N, r), got shape {tuple(m.shape)}")
        w.append(m)
    lead = tuple(aa.shape[:-2])
    n = aa.shape[-1]
    return aa.reshape((int(np.prod(lead)), n, n)), w[0], w[1], lead, torch_in  # not -1: a lead of 0


def refine_attention(a: Any, v: Any, w1: Any, w2: Any, form: str = "simple", gamma: float = 0.5,
                     row_sum_tolerance: float = 1e-4, threads: int = 0) -> Any:
    """The refined attention output O = R V (our reading of the paper [unverified]).

    a: (..., N, N) causal weights (zero above the diagonal, each row summing to 1 within
    ``row_sum_tolerance``; rows holding NaN/inf are not checked and propagate). v: (..., N, dv)
    with a's leading dimensions. w1, w2: (N, r) (for ``form="stochastic"``: W_mu, W_Sigma).
    form: "simple", "value_weighted", "additive" or "stochastic"; gamma in [0, 1] (additive only).
    Computes in a's dtype (float32: fast form; float64: reference); returns (..., N, dv).
    Differentiable in a, v, w1 and w2 when given torch tensors that require grad."""
    if _args.wants_grad(a, v, w1, w2):
        return _refine_differentiable(a, v, w1, w2, form, gamma, row_sum_tolerance, threads)
    aa, m1, m2, lead, torch_in = _prepare(a, w1, w2, form)
    n = aa.shape[-1]
    vv = _floats(v, "v", aa.dtype, input=True, what="the refinement functions")
    if vv.ndim != len(lead) + 2 or tuple(vv.shape[:-1]) != lead + (n,):
        raise ValueError(f"v must have shape {lead + (n,)} + (dv,) to match a {tuple(lead) + (n, n)}, "
                         f"got {tuple(vv.shape)}")
    dv = vv.shape[-1]
    fn = getattr(_attn, "refine_attention_" + ("f32" if aa.dtype == np.float32 else "f64"))
    # threads within C++'s int (and its range): 2**40 would be refused by the binding, naming nothing
    out = fn(aa, np.ascontiguousarray(vv.reshape((aa.shape[0], n, dv))), m1, m2, form, _args.real(gamma, "gamma"),
             _args.real(row_sum_tolerance, "row_sum_tolerance"), _args.integer(threads, "threads", 0, 256))
    return _out(out.reshape(lead + (n, dv)), torch_in)


def _refine_differentiable(a, v, w1, w2, form, gamma, row_sum_tolerance, threads):
    """refine_attention through torch.ops.attn.refine_attention: differentiable in a, v, w1, w2
    (NumPy arguments become constant tensors)."""
    import torch

    from . import _torch_ops

    a, v, w1, w2 = [x if _is_torch(x) else torch.as_tensor(x) for x in (a, v, w1, w2)]
    if not torch.compiler.is_compiling():  # the plain path's checks and messages, on detached views
        aa, _, _, lead, _ = _prepare(a.detach(), w1.detach(), w2.detach(), form)
        n = aa.shape[-1]
        vv = _floats(v.detach(), "v", aa.dtype)
        if vv.ndim != len(lead) + 2 or tuple(vv.shape[:-1]) != lead + (n,):
            raise ValueError(f"v must have shape {lead + (n,)} + (dv,) to match a {tuple(lead) + (n, n)}, "
                             f"got {tuple(vv.shape)}")
        gamma, row_sum_tolerance = _args.real(gamma, "gamma"), _args.real(row_sum_tolerance, "row_sum_tolerance")
        threads = _args.integer(threads, "threads", 0, 256)
    lead, n, dv = tuple(a.shape[:-2]), a.shape[-1], v.shape[-1]
    m = 1
    for s in lead:
        m *= s
    dt = a.dtype
    out = _torch_ops.refine_attention_op(a.reshape(m, n, n).contiguous(), v.to(dt).reshape(m, n, dv).contiguous(),
                                         w1.to(dt).contiguous(), w2.to(dt).contiguous(), form, float(gamma),
                                         float(row_sum_tolerance), int(threads))
    return out.reshape(lead + (n, dv))


def refined_weights(a: Any, w1: Any, w2: Any, form: str = "simple", gamma: float = 0.5,
                    row_sum_tolerance: float = 1e-4) -> Any:
    """The refined weights R (..., N, N) with O = R V: A^ (simple, stochastic), A^ A
    (value_weighted), (1 - gamma) A + gamma A^ (additive). Rows sum to 1 and stay causal.
    Computed by the float64 reference whatever a's dtype, returned in a's dtype."""
    aa, m1, m2, lead, torch_in = _prepare(a, w1, w2, form)
    n = aa.shape[-1]
    fn = getattr(_attn, "refined_weights_" + ("f32" if aa.dtype == np.float32 else "f64"))
    out = fn(aa, m1, m2, form, _args.real(gamma, "gamma"), _args.real(row_sum_tolerance, "row_sum_tolerance"))
    return _out(out.reshape(lead + (n, n)), torch_in)
