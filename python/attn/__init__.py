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
* :func:`linear_attention` -- linear attention and retention with flash-linear-attention's
  argument names (``feature_map``, ``causal``, ``decay``, ``chunk_size``, ``initial_state``,
  ``output_final_state``), returning ``(o, final_state)``.
* :func:`flash_attn_with_kvcache` and :func:`flash_attn_varlen_func` -- decoding against a KV
  cache (contiguous or paged, appended in place) and packed sequences of different lengths,
  with flash-attn's names and semantics.
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

from typing import TYPE_CHECKING as _TYPE_CHECKING, NamedTuple as _NamedTuple

if _TYPE_CHECKING:  # annotations only (they stay text at run time): not names of attn
    from typing import Any, Mapping, Optional, Sequence, Tuple

import numpy as _np

from . import _args, _attn
from ._args import is_torch as _is_torch
from . import theory
from . import distributed  # mpi4py is imported only when a call runs
from .concentration import effective_keys, entropy, max_weight, sparsity, summarize, topk_mass
# The other wings, re-exported so that every name stays importable from attn:
# attn.llm (the LLM runtime), attn.blocks (model-level blocks), attn.lab (experiments, SVF).
from . import blocks, lab, llm
from .llm import (Decoder, Model, Tokenizer, architectures, load_model, model_path, models, moe_feed_forward,
                  smollm2_path)
from .blocks import (AdaptiveLogSoftmaxWithLoss, HierarchicalSoftmax, lite_la, log_softmax, mix_ffn,
                     refine_attention, refined_weights, sana_block, titans_init, titans_mac, titans_mag, titans_mal,
                     titans_memory, titans_read)
from .lab import CEM, SVFAdapter, svf_compose, svf_decompose, svf_mix

from .sdpa import scaled_dot_product_attention  # noqa: E402  (torch's name and conventions)

__all__ = ["scaled_dot_product_attention", "quantize_rows", "Decoder", "Model", "Tokenizer", "Stats", "theory", "distributed", "sparsity", "entropy", "max_weight", "topk_mass", "effective_keys", "summarize", "load_model", "model_path", "models", "smollm2_path", "attention", "attend", "attend_backward", "linear_attention", "flash_attn_with_kvcache", "flash_attn_varlen_func", "explain", "rope", "mask_of", "info", "families", "lsh_buckets", "active_isa", "supported_isas", "set_isa",
           "canonical_mechanism", "log_softmax", "HierarchicalSoftmax", "AdaptiveLogSoftmaxWithLoss",
           "titans_memory", "titans_init", "titans_read", "titans_mag", "titans_mal",
           "titans_mac", "refine_attention", "refined_weights", "lite_la", "mix_ffn", "sana_block",
           "moe_feed_forward", "architectures", "svf_decompose", "svf_compose", "svf_mix", "CEM", "SVFAdapter"]
__version__ = "0.1.0"

active_isa = _attn.active_isa
supported_isas = _attn.supported_isas


def set_isa(name: str) -> None:
    """Sets the process-wide default kernel set ("portable"/"scalar", "avx2", "avx512"); raises if
    the CPU cannot run it."""
    _attn.set_isa(_args.text(name, "name"))


def canonical_mechanism(text: str) -> str:
    """Parses a mechanism text form and returns its canonical spelling."""
    return _attn.canonical_mechanism(_args.text(text, "text"))


def _dims(x: Any, layout: str, name: str) -> Tuple[int, int, int, int]:
    """(B, H, N, D) of a 4-D q/k/v array in the given layout."""
    if getattr(x, "ndim", None) != 4:
        order = "(B, N, H, D)" if layout == "bnhd" else "(B, H, N, D)"
        raise ValueError(f"{name} must have 4 dimensions {order} for layout={layout!r}, got shape "
                         f"{tuple(getattr(x, 'shape', ()))}")
    b, a1, a2, d = (int(s) for s in x.shape)
    return (b, a2, a1, d) if layout == "bnhd" else (b, a1, a2, d)


def _prepare(x: Any, name: str, int8: bool = False) -> Any:
    """A view the C++ side can read without copying (torch: detached CPU tensor). int8: an 8-bit
    KV cache's rows are welcome too."""
    if _is_torch(x):
        if x.device.type != "cpu":
            raise ValueError(f"{name} must be on the CPU, got device {x.device}")
        _args.detached(x, name, "attn's functions other than attend, attention and linear_attention",
                       "those three have one")
        return x.detach()
    if isinstance(x, _np.ndarray):
        if int8 and x.dtype == _np.int8:
            return x
        if x.dtype.kind not in "fb":
            raise TypeError(f"{name} must be float32, float16 or bfloat16 (bool for masks), got {x.dtype}")
        if x.dtype.kind == "f" and x.dtype.itemsize not in (2, 4):  # named here, not by the binding's names
            raise TypeError(f"{name} must be float32, float16 or bfloat16, got {x.dtype}")
        if not x.dtype.isnative:
            raise TypeError(f"{name} must be in native (little-endian) byte order, got {x.dtype.str}; "
                            f"use {name}.astype({name}.dtype.newbyteorder('='))")
        if any(st % x.itemsize for st in x.strides):
            raise ValueError(f"{name} has byte strides {x.strides} that are not multiples of its element size "
                             f"{x.itemsize}; pass _np.ascontiguousarray({name})")
        return x
    raise TypeError(f"{name} must be a numpy.ndarray or torch.Tensor, got {type(x).__name__}")


def _expand_mask(mask: Any, b: int, h: int, n: int, m: int, name: str, dims: str = "(B, H, N, M)") -> Any:
    """Broadcast a mask/bias to (B, H, N, M) as a zero-copy view (stride 0 on broadcast dims)."""
    mask = _prepare(mask, name)
    if mask.ndim > 4 or mask.ndim < 2:
        raise ValueError(f"{name} must have 2 to 4 dimensions broadcastable to {dims} = "
                         f"({b}, {h}, {n}, {m}), got shape {tuple(mask.shape)}")
    try:
        if _is_torch(mask):
            return mask.expand(b, h, n, m)
        return _np.broadcast_to(mask, (b, h, n, m))
    except (RuntimeError, ValueError):
        raise ValueError(f"{name} must be broadcastable to {dims} = ({b}, {h}, {n}, {m}), "
                         f"got shape {tuple(mask.shape)}") from None


# the shared argument checks (python/attn/_args.py), under the names this module has used
_integer, _flag, _real = _args.integer, _args.flag, _args.real


_INT64_MAX = 2**63 - 1


def _options(**fields: Any) -> Any:
    """One _attn.Options (attn::AttendOptions by field name); None leaves a field at its default."""
    o = _attn.Options()
    for name, x in fields.items():
        if x is not None:
            setattr(o, name, x)
    return o


# why a float attn_mask or alibi_slopes that requires grad is refused (not detached in silence)
_NO_MASK_GRADIENT = ("attn has no gradient for {} (the backward gives q, k, v and the named params theirs; "
                     "a learned bias needs the N x M score gradient)")


def _as_float32_1d(x: Any, name: str) -> Optional[_np.ndarray]:
    """Numbers (alibi_slopes) as a flat float32 array: strings, None items and bools are refused."""
    if x is None:
        return None
    _args.constant(x, name, _NO_MASK_GRADIENT.format(name))
    return _np.ascontiguousarray(_args.reals(x, name).astype(_np.float32).reshape(-1))


def _call_args(q: Any, k: Any, v: Any, layout: str, attn_mask: Any, key_padding_lengths: Any,
               alibi_slopes: Any, params: Optional[Mapping[str, Any]], additive_weights: Any,
               form: Optional[str], use_reference: bool, isa: Optional[str], block_mask: Any, block_size: Any,
               kv_scales: Any = None, precision: Optional[str] = None, **scalars: Any):
    """(q, k, v, options): zero-copy views and the one _attn.Options shared by attend() and explain().
    Python converts types (TypeError); ranges, shapes and names are checked by C++ (ValueError)."""
    if not isinstance(layout, str) or layout not in ("bnhd", "bhnd"):
        raise ValueError(f"layout must be 'bnhd' or 'bhnd', got {layout!r}")
    int8 = kv_scales is not None
    q, k, v = _prepare(q, "q"), _prepare(k, "k", int8), _prepare(v, "v", int8)
    if _is_torch(q) != _is_torch(k) or _is_torch(q) != _is_torch(v):
        raise TypeError("q, k and v must all be numpy arrays or all torch tensors")
    scales = {}
    if int8:
        if not isinstance(kv_scales, (tuple, list)) or len(kv_scales) != 2:
            raise ValueError("kv_scales must be (k_scale, v_scale), the float32 scales of k's and v's rows "
                             "(attn.quantize_rows gives them)")
        for i, (name, rows, x) in enumerate(zip(("k_scale", "v_scale"), ("k", "v"), kv_scales)):
            x = _prepare(x, f"kv_scales[{i}]")
            # checked here, in the caller's layout: C++ sees (B, Hkv, M, 1) views and would name those
            # (rows that are not int8 are C++'s to refuse first: "k must be int8 with options.kv_scales")
            of = k if rows == "k" else v
            want = tuple(int(s) for s in of.shape[:-1])
            if str(of.dtype) in ("int8", "torch.int8") and tuple(int(s) for s in x.shape) != want:
                raise ValueError(f"kv_scales[{i}] ({name}) must have {rows}'s shape without head_dim, "
                                 f"{'(B, M, Hkv)' if layout == 'bnhd' else '(B, Hkv, M)'} = {want} for "
                                 f"layout={layout!r}, got {tuple(int(s) for s in x.shape)}")
            scales[name] = x[..., None]
    b, h, n, _ = _dims(q, layout, "q")
    m = _dims(k, layout, "k")[2]
    _dims(v, layout, "v")
    mask = bias = None
    if attn_mask is not None:
        _args.constant(attn_mask, "attn_mask", _NO_MASK_GRADIENT.format("a float attn_mask"))
        full = _expand_mask(attn_mask, b, h, n, m, "attn_mask")
        is_bool = (full.dtype == _np.bool_) if not _is_torch(full) else (str(full.dtype) == "torch.bool")
        is_float = (full.dtype.kind == "f") if not _is_torch(full) else full.dtype.is_floating_point
        if not is_bool and not is_float:
            raise TypeError(f"attn_mask must be bool (True = may attend) or float (added to the scores), "
                            f"got {full.dtype}")
        mask, bias = (full, None) if is_bool else (None, full)
    if not isinstance(block_size, (tuple, list)) or len(block_size) != 2:
        raise ValueError(f"block_size must be (query rows, keys) per block, got {block_size!r}")
    bq, bk = (_integer(x, f"block_size[{i}]", 1) for i, x in enumerate(block_size))  # Python divides by them
    blocks = None
    if block_mask is not None:
        blocks = _expand_mask(block_mask, b, h, -(-n // bq), -(-m // bk), "block_mask",
                              f"(B, H, ceil(N / {bq}), ceil(M / {bk}))")
        if (blocks.dtype != _np.bool_) if not _is_torch(blocks) else (str(blocks.dtype) != "torch.bool"):
            raise TypeError(f"block_mask must be bool (True = the block may attend), got {blocks.dtype}")
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
    lengths = ([_integer(x, f"key_padding_lengths[{i}]") for i, x in enumerate(key_padding_lengths)]
               if key_padding_lengths is not None else [])
    if form is not None and not isinstance(form, str):
        raise TypeError(f"form must be a str such as 'tiled', got {type(form).__name__}")
    if isa is not None and not isinstance(isa, str):
        raise TypeError(f"isa must be a str such as 'avx2', got {type(isa).__name__}")
    if precision is not None and not isinstance(precision, str):
        raise TypeError(f"precision must be a str such as 'bf16', got {type(precision).__name__}")
    opts = _options(layout=layout, key_padding_lengths=lengths, mask=mask, bias=bias,
                    alibi_slopes=_as_float32_1d(alibi_slopes, "alibi_slopes"), block_mask=blocks, block_size=(bq, bk),
                    params=named, form=form, isa=isa, precision=precision, torch=_is_torch(q), **scales, **scalars)
    return q, k, v, opts


def _check_scalars(mechanism: Any, threads: Any, stats_topk: Any = 8, **flags: Any) -> dict:
    """The scalar options as C++ types: threads and stats_topk integers, the flags bools."""
    if not isinstance(mechanism, (str, _attn.Mechanism)):
        raise TypeError(f"mechanism must be a str such as 'softmax:causal', got {type(mechanism).__name__}")
    out = {name: _flag(x, name) for name, x in flags.items()}
    out.pop("use_reference", None)
    return dict(out, threads=_integer(threads, "threads"), stats_topk=_integer(stats_topk, "stats_topk"))


def quantize_rows(x: Any, layout: str = "bnhd") -> Tuple[Any, Any]:
    """An 8-bit KV cache's rows: x (a float array of 4 dimensions, K or V) as (rows, scales), rows
    int8 of x's shape and scales float32 of x's shape without its last dimension, so that
    ``scales[..., None] * rows`` is x within half a step of its row: per row (the last
    dimension) scale = max|x| / 127 and rows = round(x / scale) (ties to even). A row of zeros has
    scale 0; a row holding NaN or inf has scale NaN (it reads back as NaN). The pair is what
    :func:`attend` takes as k or v with ``kv_scales``. ``layout`` only names x's dimensions
    ("bnhd": (B, N, H, D)); the rounding is per row either way. Torch in, torch out.

        >>> k8, ks = attn.quantize_rows(k)
        >>> v8, vs = attn.quantize_rows(v)
        >>> out = attn.attend(q, k8, v8, "softmax:causal", kv_scales=(ks, vs))
    """
    torch_in = _is_torch(x)
    if not isinstance(layout, str) or layout not in ("bnhd", "bhnd"):
        raise ValueError(f"layout must be 'bnhd' or 'bhnd', got {layout!r}")
    rows, scales = _attn.quantize_rows(_prepare(x, "x"), layout)
    if torch_in:
        import torch
        return torch.from_numpy(rows), torch.from_numpy(scales)
    return rows, scales


class Stats(_NamedTuple):
    """Row statistics of the weights one call applied, each (B, H, N) float32 (see :func:`attend`,
    ``return_stats``): the same quantities as :func:`sparsity`, :func:`entropy`,
    :func:`max_weight` and :func:`topk_mass` on each row, streamed without the N x M matrix."""
    sparsity: Any
    entropy: Any
    max_weight: Any
    topk_mass: Any


def attend(q: Any, k: Any, v: Any, mechanism: str = "softmax", *, attn_mask: Any = None,
           key_padding_lengths: Optional[Sequence[int]] = None, alibi_slopes: Any = None,
           block_mask: Any = None, block_size: Tuple[int, int] = (128, 128),
           params: Optional[Mapping[str, Any]] = None, additive_weights: Optional[Tuple[Any, Any, Any]] = None,
           layout: str = "bnhd", return_lse: bool = False, return_probs: bool = False,
           return_final_state: bool = False, return_stats: bool = False, stats_topk: int = 8, threads: int = 0,
           form: Optional[str] = None, isa: Optional[str] = None, precision: Optional[str] = None,
           use_reference: bool = False, kv_scales: Optional[Tuple[Any, Any]] = None, **named_params: Any):
    """Attention by mechanism text form.

    Args:
        q: queries, (B, N, H, D) for layout "bnhd" or (B, H, N, D) for "bhnd"; float32,
            float16 or bfloat16 (torch only), any strides.
        k: keys, same layout with Hkv heads (Hkv divides H) and M tokens.
        v: values, like k with head dim Dv.
        mechanism: text form, e.g. "softmax", "softmax:causal,scale=0.1,window=128:0,softcap=30",
            "softmax:score=cosine", "softmax:entropy_scale=512", "softmax:dropout=0.1,seed=7";
            sparse patterns "softmax:causal,window=256:0,sinks=4", "softmax:causal,dilation=4",
            "softmax:causal,strided=64", "softmax:chunk=512", "longformer:window=128:128,global=0;17;33",
            "bigbird:block=64,window=3,global=2,random=3,seed=7" (see :func:`mask_of`);
            Reformer "lsh:buckets=32,rounds=2,chunk=64,seed=1" (add ",causal", ",shared_qk"; see
            :func:`lsh_buckets`); Dual Chunk Attention "dca:chunk=4096,local=1024,theta=10000"
            (q and k without RoPE: it rotates them); "linformer:k=256,seed=1"; linear attention
            "linear:map=elu", "linear:map=relu,causal", "linear:map=identity,causal,normalize=0",
            "retention:decay=0.97" (see :func:`linear_attention`).
        attn_mask: bool (True = may attend) or float (added to the scores) array broadcastable
            to (B, H, N, M), as in torch SDPA; always in (B, H, N, M) order whatever the layout.
            A constant: a float mask (or alibi_slopes) that requires grad is a ValueError.
        key_padding_lengths: valid keys per batch entry; keys at or past it are hidden.
        alibi_slopes: H or (B, H) slopes; adds -slope * |i + M - N - j|.
        block_mask: your own block sparsity, as FlexAttention's BlockMask: bool, broadcastable
            to (B, H, ceil(N / bq), ceil(M / bk)); False hides a block of queries x keys, whose
            keys are then never read. Combines with attn_mask (the element mask) and the
            mechanism's pattern.
        block_size: (bq, bk), query rows and keys per block of block_mask.
        params: named parameter tensors the mechanism takes, e.g. for "softmax:score=additive"
            {"wq": (A, D), "wk": (A, D), "w": (A,)}. A missing or unexpected name, or a wrong
            shape, raises ValueError naming it. Also accepted as keyword arguments
            (``attend(q, k, v, "softmax:score=additive", wq=wq, wk=wk, w=w)``).
        additive_weights: (wq, wk, w), the same as params for score=additive.
        layout: "bnhd" (default) or "bhnd".
        return_lse: also return the row log-sum-exp, (B, H, N) float32 (natural log).
        return_probs: also return the weights (B, H, N, M) float32, before dropout.
        return_final_state: also return the recurrent state after the last token (linear
            attention), (B, H, F, Dv [+ 1]) float32; pass it back as params["initial_state"].
        return_stats: also return :class:`Stats` (sparsity, entropy, max_weight, topk_mass), each
            (B, H, N) float32: how concentrated each query's row of weights is, computed while
            the row streams by (never the N x M matrix). The row is exactly what the mechanism
            applies: softmax probabilities before dropout over the keys every mask leaves; a
            linear mechanism's phi(q).phi(k) weights over the keys it may see (scale-free, so
            normalised or not is the same); a pattern's visible keys only. NaN for a row with no
            key, all-zero weights or a NaN; entropy NaN where a weight is negative.
        stats_topk: k of ``topk_mass`` (1 to 1024).
        threads: 0 = the CPUs this process may use (OMP_NUM_THREADS lowers it).
        form: force an implementation ("rows", "tiled", "reference" for softmax); None = the
            first that supports the call. See :func:`explain`.
        isa: kernel set for this call ("portable", "avx2", "avx512"); None = the active one.
        precision: products of exact attention: "auto" (None, the default: bf16 when q, k, v are
            all bfloat16), "f32", "bf16" (operands rounded to bf16, float32 sums; ~1.5x faster on
            CPUs with AVX512-BF16). Other families compute in float32 and refuse "bf16".
        use_reference: same as form="reference": the float64 reference (slow, for checking).
        kv_scales: (k_scale, v_scale) for an 8-bit KV cache: k and v are then int8 rows and row j
            stands for scale[j] * row, the scales float32 shaped as k without its head_dim
            ((B, M, Hkv) for "bnhd"). :func:`quantize_rows` makes both. Softmax family only
            (softmax, longformer, bigbird); q stays float; no backward.
        **named_params: named parameter tensors given as keyword arguments (merged into params).

    Returns:
        out in the layout and dtype of q (same kind: NumPy or torch), or a tuple
        (out[, lse][, probs][, final_state][, stats]) when those are requested.

    Gradients: given torch tensors that require grad (q, k, v or params), the call runs the custom
    op ``torch.ops.attn.attend`` (attn/torch_ops.py) with the same options: gradients flow to q, k,
    v and the params that have one, and through lse (softmax families). ``threads``, ``isa`` and
    ``precision`` apply to the forward and the backward; ``form`` and ``use_reference`` choose the
    forward's form only (the backward picks its own: ``attn check --backward`` lists its forms).
    ``return_final_state`` (linear families, params ``initial_state`` and ``decay`` only) runs
    ``torch.ops.attn.linear_attention``, differentiable through the state. ``return_stats`` gives
    tensors without grad (the statistics carry no gradient), from a second forward call with the
    same options. Refused by name, each with its reason: ``return_probs`` (the weights have no
    gradient here), ``block_mask`` (the op carries attn_mask only) and ``kv_scales`` (int8 rows
    have no backward).

    Example::

        >>> out, st = attn.attend(q, k, v, "softmax:causal", return_stats=True)
        >>> st.sparsity.shape          # (B, H, N); 1/sqrt(n) = one key, 1 = uniform
        >>> _np.exp(st.entropy)         # effective number of keys per row
    """
    given_params = {**(params or {}), **named_params}
    if kv_scales is not None and _wants_autograd(q, k, v, *given_params.values()):
        raise ValueError("kv_scales (int8 k and v rows) have no backward pass, but q, k, v or params require grad: "
                         "run under torch.no_grad() or pass q.detach() (int8 rows are for inference)")
    if _wants_autograd(q, k, v, *given_params.values()):  # torch tensors that require grad: the custom op
        return _attend_differentiable(q, k, v, mechanism, attn_mask, key_padding_lengths, alibi_slopes, layout,
                                      return_lse, given_params, block_mask=block_mask, block_size=block_size,
                                      additive_weights=additive_weights, return_probs=return_probs,
                                      return_final_state=return_final_state, return_stats=return_stats,
                                      stats_topk=stats_topk, threads=threads, form=form, isa=isa,
                                      precision=precision, use_reference=use_reference)
    scalars = _check_scalars(mechanism, threads, stats_topk, return_lse=return_lse, return_probs=return_probs,
                             return_final_state=return_final_state, return_stats=return_stats,
                             use_reference=use_reference)
    q, k, v, opts = _call_args(q, k, v, layout, attn_mask, key_padding_lengths, alibi_slopes,
                               {**(params or {}), **named_params}, additive_weights, form, use_reference, isa,
                               block_mask, block_size, kv_scales, precision=precision, **scalars)
    out, lse, probs, state, stats = _attn.attend(q, k, v, mechanism, opts)  # C++ allocates every output
    extra = tuple(x for x in (lse, probs, state, None if stats is None else Stats(*stats)) if x is not None)
    return (out,) + extra if extra else out


def attend_backward(dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, mechanism: str = "softmax", *,
                    attn_mask: Any = None, key_padding_lengths: Optional[Sequence[int]] = None,
                    alibi_slopes: Any = None, block_mask: Any = None, block_size: Tuple[int, int] = (128, 128),
                    layout: str = "bnhd", threads: int = 0, form: Optional[str] = None, dlse: Any = None,
                    params: Optional[Mapping[str, Any]] = None, dfinal_state: Any = None,
                    precision: Optional[str] = None, isa: Optional[str] = None):
    """Gradients of :func:`attend`'s output with respect to q, k and v (training).

    As flash-attention's backward, nothing of size N x M is kept: the scores are recomputed from
    q, k and the forward's ``lse``, and D_i = dout_i . out_i comes from its ``out``. Give the same
    mechanism and options as the forward call (dropout regenerates its mask from the seed).

    Args:
        dout: gradient of the loss with respect to out, out's shape and q's dtype.
        q, k, v: the forward's inputs.
        out, lse: what ``attend(q, k, v, mechanism, ..., return_lse=True)`` returned; lse None for
            the families whose weights are no softmax (GAU, the linear family), required for the
            others (None there is a ValueError saying so).
        mechanism: softmax (dot, cosine or additive scores; additive: the gradients of its params
            "wq", "wk", "w") with any option, or the patterns over it ("longformer:...",
            "bigbird:..."); GAU ("gau:..."); linformer ("linformer:...", with E and F's gradients);
            the linear family ("linear:...", "retention:...", "sana:...", "normattn:...",
            "performer:...", "polaformer:...", every feature map, normalised or not, decays);
            lsh (the buckets are constants); efficient ("efficient:...", with its initial_state's
            gradient); dca ("dca:...", with lse and dlse); qsoftmax ("qsoftmax[:causal]", no lse, with
            "initial_state" and dfinal_state as the linear family).
        attn_mask, key_padding_lengths, alibi_slopes, block_mask, block_size, layout, threads: as
            in :func:`attend`.
        form: None (the walk's choice: "tiled" for softmax and GAU, "scores" for cosine and additive
            scores, "chunked" or "right" for the linear family, "projected" for linformer, "parts" for
            dca, "right" or "recurrent" for qsoftmax, "chunked" for lsh, "online" for efficient), "rows"
            (softmax: row by row, float32) or "reference"
            (float64, for checking);
            :func:`explain` lists a mechanism's forward forms, ``attn check --backward`` the backward's.
        precision: the arithmetic of the backward's products, as in :func:`attend` ("auto", "f32",
            "bf16"; None = "auto"); a family or form without bf16 products refuses "bf16".
        isa: kernel set for this call ("portable", "avx2", "avx512"); None = the active one.
        dlse: the loss's gradient with respect to lse, (B, H, N) float32, when the loss uses lse
            (merging partial results); None = 0.
        params: the forward's named params (linear: "decay" per head, "initial_state"; linformer: its
            projections "E" and "F", (k, M) each; polaformer: "power" (D), "coefficients" (Dv)).
        dfinal_state: linear, qsoftmax: the loss's gradient with respect to the final state (what
            ``return_final_state`` gave, (B, H, F, Dv [+ 1]) float32); None = 0.

    Returns:
        (dq, dk, dv) in q's, k's and v's shapes, dtype and kind (NumPy or torch), in ``layout``;
        with ``params["initial_state"]``, (dq, dk, dv, d_initial_state), the last float32 of the
        state's shape. A mechanism with learned params given in ``params`` (linformer's "E" and
        "F", polaformer's "power" and "coefficients") adds one last element, a dict of their
        gradients by name, float32 in each param's shape:
        ``dq, dk, dv, dparams = attend_backward(..., "linformer:k=64", params={"E": E, "F": F})``
        with ``dparams["E"]``, ``dparams["F"]``. Calls without such params return what they did
        before. The result is bitwise the same for any thread count.

    Example::

        >>> out, lse = attn.attend(q, k, v, "softmax:causal", return_lse=True)
        >>> dq, dk, dv = attn.attend_backward(dout, q, k, v, out, lse, "softmax:causal")
    """
    scalars = _check_scalars(mechanism, threads)
    q, k, v, opts = _call_args(q, k, v, layout, attn_mask, key_padding_lengths, alibi_slopes,
                               params, None, form,
                               False, isa, block_mask, block_size, precision=precision, **scalars)
    dout, out = _prepare(dout, "dout"), _prepare(out, "out")
    lse, dlse = (None if x is None else _prepare(x, name) for name, x in (("lse", lse), ("dlse", dlse)))
    dfinal_state = None if dfinal_state is None else _prepare(dfinal_state, "dfinal_state")
    if any(x is not None and _is_torch(x) != _is_torch(q) for x in (dout, out, lse, dlse, dfinal_state)):
        raise TypeError("dout, out, lse, dlse and dfinal_state must be of q's kind (all numpy arrays or all torch "
                        "tensors)")
    return _attn.attend_backward(dout, q, k, v, out, lse, mechanism, opts, dlse, dfinal_state)


def _wants_autograd(*xs: Any) -> bool:
    """Torch tensors that require grad, with grad enabled (attend then runs the custom op)."""
    if not _is_torch(xs[0]):
        return False
    import torch
    return torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in xs)


# What attend cannot do with tensors that require grad, and why (every other argument applies: the run
# options threads, form, isa, precision and use_reference reach the custom op; return_stats gives
# tensors without grad; return_final_state runs the linear op). The message names the argument.
_NO_GRADIENT_PATH = {
    "return_probs": "the weights have no gradient here (the backward recomputes them tile by tile and never "
                    "returns them); call attn.attend(...) under torch.no_grad() for them",
    "block_mask": "the differentiable op (torch.ops.attn.attend) carries attn_mask, an element mask, but no block "
                  "mask; pass the blocks as a bool attn_mask (block_mask.repeat_interleave(bq, -2)"
                  ".repeat_interleave(bk, -1), cut to (N, M)), or run attn.attend under torch.no_grad() and "
                  "attn.attend_backward yourself",
}


def _refuse_without_gradient(name: str) -> None:
    raise ValueError(f"{name} does not apply to tensors that require grad: {_NO_GRADIENT_PATH[name]}")


def _run_options(threads: Any, form: Any, isa: Any, precision: Any, use_reference: Any = False) -> dict:
    """threads, form, isa and precision as the custom ops take them, checked as the plain path
    checks them (TypeError naming the argument); names and ranges are C++'s to check."""
    for name, x, example in (("form", form, "'tiled'"), ("isa", isa, "'avx2'"), ("precision", precision, "'bf16'")):
        if x is not None and not isinstance(x, str):
            raise TypeError(f"{name} must be a str such as {example}, got {type(x).__name__}")
    if _flag(use_reference, "use_reference"):
        if form not in (None, "reference"):
            raise ValueError(f"use_reference=True conflicts with form={form!r}")
        form = "reference"
    return dict(threads=_integer(threads, "threads"), form=form, isa=isa, precision=precision)


def _attend_differentiable(q, k, v, mechanism, attn_mask, key_padding_lengths, alibi_slopes, layout, return_lse,
                           params, *, block_mask=None, block_size=(128, 128), additive_weights=None,
                           return_probs=False, return_final_state=False, return_stats=False, stats_topk=8,
                           threads=0, form=None, isa=None, precision=None, use_reference=False):
    """attend through torch.ops.attn.attend (attn/torch_ops.py): gradients flow to q, k, v and the
    params that have one (Linformer's E and F). Takes attend's arguments; see its "Gradients"."""
    if _flag(return_probs, "return_probs"):
        _refuse_without_gradient("return_probs")
    if block_mask is not None:  # by identity: a tensor must not be compared with == here
        _refuse_without_gradient("block_mask")
    if not isinstance(block_size, (tuple, list)) or len(block_size) != 2:  # checked as without gradients
        raise ValueError(f"block_size must be (query rows, keys) per block, got {block_size!r}")
    for i, x in enumerate(block_size):
        _integer(x, f"block_size[{i}]", 1)
    return_lse, return_final_state, return_stats = (_flag(x, name) for name, x in (
        ("return_lse", return_lse), ("return_final_state", return_final_state), ("return_stats", return_stats)))
    stats_topk = _integer(stats_topk, "stats_topk")
    run = _run_options(threads, form, isa, precision, use_reference)
    if isinstance(mechanism, _attn.Mechanism):
        mechanism = str(mechanism)  # its canonical text: the op's schema takes a str
    if not isinstance(mechanism, str):
        raise TypeError(f"mechanism must be a str such as 'softmax:causal', got {type(mechanism).__name__}")
    if additive_weights is not None:  # the same as params for score=additive (as without gradients)
        if len(additive_weights) != 3:
            raise ValueError("additive_weights must be (wq, wk, w)")
        for name in ("wq", "wk", "w"):
            if name in params:
                raise ValueError(f"{name} is given both in additive_weights and in params")
        params = {**params, **dict(zip(("wq", "wk", "w"), additive_weights))}
    _args.constant(attn_mask, "attn_mask", _NO_MASK_GRADIENT.format("a float attn_mask"))
    _args.constant(alibi_slopes, "alibi_slopes", _NO_MASK_GRADIENT.format("alibi_slopes"))
    from . import torch_ops
    if return_lse and not torch_ops.has_lse(mechanism):  # the same error as without gradients
        attend(q.detach(), k.detach(), v.detach(), mechanism, layout=layout, return_lse=True)
    state = None
    if return_final_state:  # the linear op: differentiable through the final state
        if attn_mask is not None or alibi_slopes is not None:  # C++'s refusal, as without gradients
            attend(q.detach(), k.detach(), v.detach(), mechanism, layout=layout, attn_mask=attn_mask,
                   alibi_slopes=alibi_slopes, return_final_state=True)
            raise ValueError("attn_mask and alibi_slopes do not apply with return_final_state to tensors that "
                             "require grad: torch.ops.attn.linear_attention takes neither")
        others = sorted(set(params) - {"initial_state", "decay"})
        if others:
            raise ValueError(f"return_final_state does not apply to tensors that require grad with params "
                             f"{', '.join(others)}: the differentiable path through the final state "
                             f"(torch.ops.attn.linear_attention) takes initial_state and decay only; detach the "
                             f"inputs, or leave return_final_state out (torch.ops.attn.attend then gives the "
                             f"params theirs)")
        out, state = torch_ops.linear_attention(q, k, v, mechanism, layout, params.get("initial_state"),
                                                params.get("decay"), key_padding_lengths, **run)
        lse = None
    else:
        out, lse = torch_ops.attend(q, k, v, mechanism, layout, attn_mask, key_padding_lengths, alibi_slopes, params,
                                    **run)
    stats = None
    if return_stats:  # no gradient: a second forward call with the same options, as tensors without grad
        stats = Stats(*torch_ops.attend_stats(q, k, v, mechanism, layout, attn_mask, key_padding_lengths,
                                              alibi_slopes, params, stats_topk, **run))
    extra = tuple(x for x, asked in ((lse, return_lse), (state, return_final_state), (stats, return_stats)) if asked)
    return (out,) + extra if extra else out


def _int_list(x: Any, name: str, count: Optional[int] = None) -> list:
    """Integers from an int, a list, a NumPy array or a torch tensor (cache_seqlens, cu_seqlens)."""
    if _is_torch(x):
        x = x.detach().cpu().numpy()
    if isinstance(x, (int, _np.integer)) and not isinstance(x, (bool, _np.bool_)):
        if count is None:
            raise TypeError(f"{name} must be a sequence of integers, got {x!r}")
        return [_integer(x, name)] * count
    arr = _np.asarray(x)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise TypeError(f"{name} must be a 1-D sequence of integers, got {arr.dtype} with shape {arr.shape}")
    if count is not None and arr.size != count:
        raise ValueError(f"{name} must have one value per sequence ({count}), got {arr.size}")
    return [_integer(v, f"{name}[{i}]") for i, v in enumerate(arr.tolist())]


def flash_attn_with_kvcache(q: Any, k_cache: Any, v_cache: Any, k: Any = None, v: Any = None,
                            rotary_cos: Any = None, rotary_sin: Any = None, cache_seqlens: Any = None,
                            block_table: Any = None, softmax_scale: Optional[float] = None, causal: bool = False,
                            window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                            rotary_interleaved: bool = True, alibi_slopes: Any = None,
                            return_softmax_lse: bool = False, *, threads: int = 0):
    """Attention against a KV cache, with flash-attn's names and semantics (decoding).

    If k and v are given, they are first written into the caches at positions
    cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 of each sequence (in place; the caches
    must be writable), rotated by rotary_cos/rotary_sin when given; then q attends to the first
    cache_seqlens[b] + seqlen_new keys of its sequence. Causal masks and windows are aligned
    bottom-right to each sequence's own length. Every argument is checked before the first
    write: a call that raises leaves the caches as they were. cache_seqlens is not updated
    (add seqlen_new yourself, as with flash-attn).

    Args:
        q: (batch, seqlen, nheads, headdim).
        k_cache, v_cache: (batch, capacity, nheads_k, headdim) or, with block_table, page pools
            (num_blocks, page_block_size, nheads_k, headdim) (vLLM's paged layout; any block size).
        k, v: new keys and values (batch, seqlen_new, nheads_k, headdim), the caches' dtype.
        rotary_cos, rotary_sin: (seqlen_ro, rotary_dim / 2); rotate the new k at its positions and
            q at cache_seqlens + i (causal or windowed) or at cache_seqlens (otherwise).
        cache_seqlens: int or (batch,) ints: tokens already cached per sequence; None = the whole
            capacity.
        block_table: (batch, max_blocks_per_seq) int32: sequence b's key j is row
            j % page_block_size of block block_table[b, j // page_block_size].
        softmax_scale: None = 1/sqrt(headdim).
        causal, window_size, softcap, alibi_slopes: as in :func:`attention`.
        rotary_interleaved: rotate channel pairs (2i, 2i+1) (True) or (i, i + rotary_dim/2).
        return_softmax_lse: also return the log-sum-exp (batch, nheads, seqlen) float32.
        threads: 0 = the CPUs this process may use.

    Returns:
        out (batch, seqlen, nheads, headdim) like q; (out, lse) with return_softmax_lse.

    Example::

        k_cache = torch.zeros(1, 4096, 8, 128); v_cache = torch.zeros_like(k_cache)
        out = attn.flash_attn_with_kvcache(q_prompt, k_cache, v_cache, k_prompt, v_prompt,
                                           cache_seqlens=0, causal=True)          # prefill
        out = attn.flash_attn_with_kvcache(q_tok, k_cache, v_cache, k_tok, v_tok,
                                           cache_seqlens=len_prompt, causal=True)  # one token
    """
    mechanism = _softmax_mechanism(causal, softmax_scale, window_size, softcap)
    update = _attn.KvCacheUpdate()
    update.rotary_interleaved = _flag(rotary_interleaved, "rotary_interleaved")
    _flag(return_softmax_lse, "return_softmax_lse")
    q = _prepare(q, "q")
    k_cache, v_cache = _prepare(k_cache, "k_cache"), _prepare(v_cache, "v_cache")
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        _args.writable(cache, name, "the caches are buffers attn appends to in place")
    if (k is None) != (v is None):
        raise ValueError("give both k and v (the new tokens), or neither")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("give both rotary_cos and rotary_sin, or neither")
    for name, x in (("k", k), ("v", v), ("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if x is not None:
            setattr(update, name, _prepare(x, name))
    if cache_seqlens is not None:  # an int stands for every sequence of the batch
        update.cache_seqlens = _int_list(cache_seqlens, "cache_seqlens", int(q.shape[0]) if q.ndim else None)
    if block_table is not None:
        if _is_torch(block_table):
            block_table = block_table.detach().cpu().numpy()
        table = _np.asarray(block_table)
        if table.ndim != 2 or table.dtype.kind not in "iu":
            raise TypeError(f"block_table must be a 2-D integer array (batch, blocks per sequence), got "
                            f"{table.dtype} with shape {table.shape}")
        if table.size and (table.min() < -2**31 or table.max() >= 2**31):
            raise ValueError("block_table entries must fit int32")
        update.block_table = _np.ascontiguousarray(table, dtype=_np.int32)
    opts = _options(alibi_slopes=_as_float32_1d(alibi_slopes, "alibi_slopes"), threads=_integer(threads, "threads"),
                    return_lse=bool(return_softmax_lse), torch=_is_torch(q))
    out, lse = _attn.attend_with_kvcache(q, k_cache, v_cache, update, mechanism, opts)  # C++ allocates out, lse
    return (out, lse) if return_softmax_lse else out


def flash_attn_varlen_func(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, max_seqlen_q: int,
                           max_seqlen_k: int, softmax_scale: Optional[float] = None, causal: bool = False,
                           window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes: Any = None,
                           return_attn_probs: bool = False, *, threads: int = 0):
    """Attention over packed sequences of different lengths, with flash-attn's names (no padding).

    Sequence b is rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1 of q against rows
    cu_seqlens_k[b] .. cu_seqlens_k[b+1] - 1 of k and v; causal masks are aligned bottom-right
    per sequence.

    Args:
        q: (total_q, nheads, headdim); k, v: (total_k, nheads_k, headdim).
        cu_seqlens_q, cu_seqlens_k: (batch + 1,) ints from 0 to the totals, non-decreasing.
        max_seqlen_q, max_seqlen_k: at least the longest sequence (checked).
        softmax_scale, causal, window_size, softcap, alibi_slopes: as in :func:`attention`.
        return_attn_probs: also return the log-sum-exp (nheads, total_q) float32 (flash-attn
            returns (out, lse, S_dmask); the third is None here: no dropout).

    Returns:
        out (total_q, nheads, headdim) like q; (out, lse, None) with return_attn_probs.
    """
    mechanism = _softmax_mechanism(causal, softmax_scale, window_size, softcap)
    _flag(return_attn_probs, "return_attn_probs")
    q, k, v = _prepare(q, "q"), _prepare(k, "k"), _prepare(v, "v")
    cq, ck = _int_list(cu_seqlens_q, "cu_seqlens_q"), _int_list(cu_seqlens_k, "cu_seqlens_k")
    opts = _options(alibi_slopes=_as_float32_1d(alibi_slopes, "alibi_slopes"), threads=_integer(threads, "threads"),
                    return_lse=bool(return_attn_probs), torch=_is_torch(q))
    out, lse, _ = _attn.attend_varlen(q, k, v, cq, ck, _integer(max_seqlen_q, "max_seqlen_q"),  # C++ allocates out, lse
                                   _integer(max_seqlen_k, "max_seqlen_k"), mechanism, opts)
    return (out, lse, None) if return_attn_probs else out


# attend's names of linear_attention's arguments, as they appear in its messages
_LINEAR_NAMES = (("params['initial_state']", "initial_state"), ("params['decay']", "decay"),
                 ("linear chunk ", "chunk_size "), ("linear decay ", "decay "))


def _linear_text(feature_map, causal, normalize, decay, chunk_size, scale) -> str:
    """The linear mechanism's text in plain Python (under torch.compile a call into the extension
    would break the graph; C++ checks the text when the op runs)."""
    text = f"linear:map={feature_map}" + (",causal" if causal else "") + ("" if normalize else ",normalize=0")
    text += ("" if decay is None else f",decay={float(decay)!r}") + f",chunk={int(chunk_size)}"
    return text + ("" if scale is None else f",scale={float(scale)!r}")


def _linear_differentiable(q, k, v, feature_map, causal, decay, chunk_size, initial_state, output_final_state,
                           normalize, scale, key_padding_lengths, layout, others, cu_seqlens=None):
    """linear_attention through torch.ops.attn.linear_attention (attn/torch_ops.py): gradients flow
    to q, k, v and initial_state, and in through the final state."""
    import torch
    run = _run_options(**others)
    # (isinstance only: torch.compile traces it, not _np.ndim)
    per_head_kinds = isinstance(decay, (torch.Tensor, list, tuple)) or (isinstance(decay, _np.ndarray) and decay.ndim > 0)
    per_head = decay if per_head_kinds else None
    if isinstance(decay, torch.Tensor) and decay.requires_grad:  # a constant of the op: say so, not a silent zero
        raise ValueError("decay requires grad, but linear_attention has no gradient for decay yet (q, k, v and "
                         "initial_state have one): pass decay.detach()")
    scalar = None if decay is None or per_head is not None else decay
    if torch.compiler.is_compiling():
        text = _linear_text(feature_map, causal, normalize, scalar, chunk_size, scale)
    else:
        if not isinstance(feature_map, str):
            raise TypeError(f"feature_map must be a str such as 'elu', got {type(feature_map).__name__}")
        _flag(output_final_state, "output_final_state")
        text = str(_attn.linear_mechanism(
            map=feature_map, causal=_flag(causal, "causal"), normalize=_flag(normalize, "normalize"),
            decay=None if scalar is None else _real(scalar, "decay"), chunk=_integer(chunk_size, "chunk_size"),
            scale=None if scale is None else _real(scale, "scale")))
    from . import torch_ops
    try:
        cu = None if cu_seqlens is None else (cu_seqlens if isinstance(cu_seqlens, (list, tuple))
                                              else _int_list(cu_seqlens, "cu_seqlens"))
        o, state = torch_ops.linear_attention(q, k, v, text, layout, initial_state, per_head, key_padding_lengths,
                                              **run, cu_seqlens=cu)
    except (TypeError, ValueError) as e:  # attend's names for what linear_attention's caller named
        text = str(e)
        for inner, outer in _LINEAR_NAMES:
            text = text.replace(inner, outer)
        raise type(e)(text) from None
    return (o, state) if output_final_state else (o, None)


def _packed(x: Any, layout: str, name: str) -> Any:
    """A batch of one packed sequence stream, (1, T, H, D) (bnhd) or (1, H, T, D) (bhnd), as the
    (T, H, D) view attend_varlen takes (no copy)."""
    x = _prepare(x, name)
    if x.ndim != 4 or x.shape[0] != 1:
        raise ValueError(f"{name} must be one packed batch with cu_seqlens, "
                         f"{'(1, T, H, D)' if layout == 'bnhd' else '(1, H, T, D)'}, got shape {tuple(x.shape)}")
    x = x[0]
    if layout == "bnhd":
        return x
    return x.transpose(0, 1) if _is_torch(x) else x.transpose(1, 0, 2)


def _unpacked(x: Any, layout: str) -> Any:
    """attend_varlen's (T, H, D) result in the caller's batch-of-one layout."""
    if layout == "bhnd":
        x = x.transpose(0, 1) if _is_torch(x) else x.transpose(1, 0, 2)
    return x[None]


def _linear_varlen(q: Any, k: Any, v: Any, mechanism: Any, cu_seqlens: Any, params: dict, output_final_state: bool,
                   layout: str, run: dict) -> Tuple[Any, Any]:
    """(o, final_state or None) of packed sequences in batch 1 (attn::attend_varlen): the state
    starts afresh at each boundary; params["initial_state"] and the final state one per sequence."""
    if layout not in ("bnhd", "bhnd"):
        raise ValueError(f"layout must be 'bnhd' or 'bhnd', got {layout!r}")
    cu = _int_list(cu_seqlens, "cu_seqlens")
    longest = max([b - a for a, b in zip(cu, cu[1:])] or [0])
    qp, kp, vp = _packed(q, layout, "q"), _packed(k, layout, "k"), _packed(v, layout, "v")
    named = {name: _prepare(x, f"params[{name!r}]") for name, x in params.items()}
    opts = _options(params=named, return_final_state=bool(output_final_state), torch=_is_torch(qp),
                    threads=_integer(run.get("threads", 0), "threads"), form=run.get("form"), isa=run.get("isa"),
                    precision=run.get("precision"))
    out, _, state = _attn.attend_varlen(qp, kp, vp, cu, cu, longest, longest, mechanism, opts)
    return _unpacked(out, layout), state


def _linear_varlen_backward(dout: Any, q: Any, k: Any, v: Any, out: Any, mechanism: Any, cu_seqlens: Any, params: dict,
                            dfinal_state: Any, layout: str, run: dict) -> Tuple[Any, ...]:
    """(dq, dk, dv[, d_initial_state]) of _linear_varlen (attn::attend_varlen_backward), in its layout."""
    cu = _int_list(cu_seqlens, "cu_seqlens")
    longest = max([b - a for a, b in zip(cu, cu[1:])] or [0])
    packed = [_packed(x, layout, name) for name, x in (("dout", dout), ("q", q), ("k", k), ("v", v), ("out", out))]
    named = {name: _prepare(x, f"params[{name!r}]") for name, x in params.items()}
    opts = _options(params=named, torch=_is_torch(packed[1]), threads=_integer(run.get("threads", 0), "threads"),
                    isa=run.get("isa"), precision=run.get("precision"))
    df = None if dfinal_state is None else _prepare(dfinal_state, "dfinal_state")
    grads = _attn.attend_varlen_backward(*packed, None, cu, cu, longest, longest, mechanism, opts, None, df)
    return tuple(_unpacked(g, layout) for g in grads[:3]) + tuple(grads[3:4] if "initial_state" in params else ())


def linear_attention(q: Any, k: Any, v: Any, *, feature_map: str = "elu", causal: bool = True,
                     decay: Any = None, chunk_size: int = 64, initial_state: Any = None,
                     output_final_state: bool = False, normalize: bool = True, scale: Optional[float] = None,
                     key_padding_lengths: Optional[Sequence[int]] = None, layout: str = "bnhd", threads: int = 0,
                     form: Optional[str] = None, isa: Optional[str] = None,
                     precision: Optional[str] = None, cu_seqlens: Any = None) -> Tuple[Any, Any]:
    """Linear attention with flash-linear-attention's argument names; returns (o, final_state).

    Weights w_ij = scale * phi(q_i) . phi(k_j) * decay^(i - j) over the keys j <= i (causal) or
    all keys, and o_i = sum_j w_ij v_j / sum_j w_ij (normalize) or sum_j w_ij v_j. Computed in
    O(N d^2) without the N x M matrix: the right product (non-causal), token by token through
    the state (a few tokens: decoding) or in chunks of chunk_size (Lightning), chosen per call.

    Args:
        q, k, v: (B, T, H, D) for layout "bnhd" (default, as fla) or (B, H, T, D); k and v may
            have fewer heads. Causal calls take as many queries as keys.
        feature_map: "elu" (elu + 1), "relu", "identity", "exp" or "relu2".
        causal: each token sees itself and the tokens before it (default True, as fla's ops).
        decay: None, a float in (0, 1] (retention), or one per query head (H,); needs causal.
        chunk_size: rows per block of the chunked form.
        initial_state: the state of earlier tokens, (B, H, D, Dv + 1) with normalize (the last
            column is the normaliser z) or (B, H, D, Dv) without; float32.
        output_final_state: also return the state after the last token (same shape).
        normalize: divide by the weights' row sum (a zero sum gives a zero row).
        scale: multiplies every weight; None = 1 (the formula's plain phi(q).phi(k); fla's ops
            default to D^-0.5, which only matters with normalize=False).
        key_padding_lengths: valid tokens per batch entry; the state stops at the last one.
        layout, threads, form, isa: as in :func:`attend`.
        precision: "auto" (None) or "f32": linear attention computes in float32 ("bf16" is a
            ValueError).
        cu_seqlens: packed sequences of different lengths in one batch (fla's varlen): q, k, v
            (1, T, H, D) (bnhd) or (1, H, T, D), sequence s the tokens cu_seqlens[s] ..
            cu_seqlens[s+1] - 1 ((S + 1,) ints from 0 to T, non-decreasing). The state starts
            afresh at each sequence: initial_state and final_state hold one state per sequence,
            (S, H, D, Dv [+ 1]), and the gradients are each sequence's as if it ran alone. No
            key_padding_lengths with it.

    Returns:
        (o, final_state): o like q with v's head dim; final_state None unless asked for.

    Gradients: given torch tensors that require grad (q, k, v or initial_state), the call runs the
    custom op ``torch.ops.attn.linear_attention`` (attn/torch_ops.py): gradients flow to q, k, v
    and initial_state, and in through final_state; it traces under ``torch.compile``. ``threads``,
    ``isa`` and ``precision`` apply to the forward and the backward, ``form`` to the forward only
    (the backward picks its own). NumPy users call :func:`attend_backward` with ``lse=None``.

    Example::

        o, state = attn.linear_attention(q[:, :100], k[:, :100], v[:, :100], output_final_state=True)
        o2, state = attn.linear_attention(q[:, 100:], k[:, 100:], v[:, 100:], initial_state=state,
                                          output_final_state=True)   # == one call on all tokens
    """
    if cu_seqlens is not None and key_padding_lengths is not None:
        raise ValueError("give cu_seqlens (packed sequences) or key_padding_lengths (a padded batch), not both")
    if _wants_autograd(q, k, v, *(() if initial_state is None else (initial_state,))):
        return _linear_differentiable(q, k, v, feature_map, causal, decay, chunk_size, initial_state,
                                      output_final_state, normalize, scale, key_padding_lengths, layout,
                                      dict(threads=threads, form=form, isa=isa, precision=precision), cu_seqlens)
    if not isinstance(feature_map, str):
        raise TypeError(f"feature_map must be a str such as 'elu', got {type(feature_map).__name__}")
    _flag(output_final_state, "output_final_state")
    params = {}
    scalar_decay = None
    if decay is not None:
        if not _is_torch(decay) and _np.ndim(decay) == 0:
            scalar_decay = _real(decay, "decay")
        else:
            if isinstance(decay, (list, tuple)):
                try:
                    decay = _np.asarray(decay, dtype=_np.float32)
                except (TypeError, ValueError):
                    raise TypeError(f"decay must be a number or one number per query head, got {decay!r}") from None
            params["decay"] = _prepare(decay, "decay")  # checked under the name the caller used
    if initial_state is not None:
        params["initial_state"] = _prepare(initial_state, "initial_state")
    mechanism = _attn.linear_mechanism(  # typed values, not text; C++ checks the names and ranges
        map=feature_map, causal=_flag(causal, "causal"), normalize=_flag(normalize, "normalize"), decay=scalar_decay,
        chunk=_integer(chunk_size, "chunk_size"), scale=None if scale is None else _real(scale, "scale"))
    try:
        if cu_seqlens is not None:
            return _linear_varlen(q, k, v, mechanism, cu_seqlens, params, output_final_state, layout,
                                  dict(threads=threads, form=form, isa=isa, precision=precision))
        res = attend(q, k, v, mechanism, params=params, key_padding_lengths=key_padding_lengths,
                     layout=layout, return_final_state=output_final_state, threads=threads, form=form, isa=isa,
                     precision=precision)
    except (TypeError, ValueError) as e:  # attend's names for what this function's caller named
        text = str(e)
        for inner, outer in _LINEAR_NAMES:
            text = text.replace(inner, outer)
        raise type(e)(text) from None
    return (res[0], res[1]) if output_final_state else (res, None)


def explain(q: Any, k: Any, v: Any, mechanism: str = "softmax", *, attn_mask: Any = None,
            key_padding_lengths: Optional[Sequence[int]] = None, alibi_slopes: Any = None,
            block_mask: Any = None, block_size: Tuple[int, int] = (128, 128),
            params: Optional[Mapping[str, Any]] = None, additive_weights: Optional[Tuple[Any, Any, Any]] = None,
            layout: str = "bnhd", return_lse: bool = False, return_probs: bool = False,
            return_stats: bool = False, stats_topk: int = 8, threads: int = 0,
            form: Optional[str] = None, isa: Optional[str] = None, precision: Optional[str] = None,
            use_reference: bool = False, **named_params: Any) -> str:
    """Which form :func:`attend` would run for these arguments, and why each other form would not.

    Takes exactly :func:`attend`'s arguments (q, k, v, mechanism, attn_mask, key_padding_lengths,
    alibi_slopes, block_mask, block_size, params, additive_weights, layout, return_lse, return_probs, return_stats,
    stats_topk, threads, form, isa, precision, use_reference, **named_params) and validates them the same way (bad input raises the same
    error), but computes nothing. Example::

        >>> print(attn.explain(q, k, v, "softmax:causal", return_probs=True))
        softmax:causal (isa avx512): runs form 'tiled'
          rows      refused: probabilities requested  [...]
          tiled     chosen  [...]
          reference supported (lower priority)  [...]
    """
    scalars = _check_scalars(mechanism, threads, stats_topk, return_lse=return_lse, return_probs=return_probs,
                             return_stats=return_stats, use_reference=use_reference)
    q, k, v, opts = _call_args(q, k, v, layout, attn_mask, key_padding_lengths, alibi_slopes,
                               {**(params or {}), **named_params}, additive_weights, form, use_reference, isa,
                               block_mask, block_size, precision=precision, **scalars)
    return _attn.explain(q, k, v, mechanism, opts)


def _softmax_mechanism(causal: Any, softmax_scale: Any, window_size: Any, softcap: Any, dropout_p: Any = 0.0,
                       seed: Any = 0) -> Any:
    """The softmax mechanism for flash-attn's arguments, built from typed values (C++ checks them)."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(f"window_size must be a pair (left, right), got {window_size!r}")
    window = tuple(_integer(x, f"window_size[{i}]") for i, x in enumerate(window_size))
    return _attn.softmax_mechanism(
        causal=_flag(causal, "causal"),
        scale=None if softmax_scale is None else _real(softmax_scale, "softmax_scale"), window=window,
        softcap=_real(softcap, "softcap"), dropout=_real(dropout_p, "dropout_p"),
        seed=_integer(seed, "seed", 0, 2**64 - 1))  # an unsigned 64-bit integer in C++


def _softmax_text(causal: Any, softmax_scale: Any, window_size: Any, softcap: Any, dropout_p: Any, seed: Any) -> str:
    """flash-attn's arguments as mechanism text (C++ parses and checks it when the op runs)."""
    opts = ["causal"] if causal else []
    if softmax_scale is not None:
        opts.append(f"scale={float(softmax_scale)!r}")
    if tuple(window_size) != (-1, -1):
        opts.append(f"window={int(window_size[0])}:{int(window_size[1])}")
    if softcap:
        opts.append(f"softcap={float(softcap)!r}")
    if dropout_p:
        opts.append(f"dropout={float(dropout_p)!r},seed={int(seed)}")
    return "softmax" + (":" + ",".join(opts) if opts else "")


def attention(q: Any, k: Any, v: Any, *, causal: bool = False, softmax_scale: Optional[float] = None,
              window_size: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes: Any = None,
              attn_mask: Any = None, key_padding_lengths: Optional[Sequence[int]] = None,
              dropout_p: float = 0.0, seed: int = 0, layout: str = "bnhd", return_lse: bool = False,
              return_probs: bool = False, return_stats: bool = False, stats_topk: int = 8, threads: int = 0,
              precision: Optional[str] = None):
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
        return_stats / stats_topk: also return each row's concentration, :class:`Stats`
            (see :func:`attend`), streamed without the weights.
        threads: 0 = the CPUs this process may use.
        precision: the products' arithmetic: "auto" (None, the default: bf16 when q, k, v are all
            bfloat16), "f32", "bf16" (operands rounded to bf16, float32 sums; ~1.5x faster on CPUs
            with AVX512-BF16). See :func:`attend`.

    Returns:
        out with q's layout, dtype and kind; or (out[, lse][, probs][, stats]) when requested.
        A row that sees no key returns zeros and lse = -inf.

    Gradients: given torch tensors that require grad, the call is differentiable (the custom op
    ``torch.ops.attn.attend``) with every argument but ``return_probs`` (the weights have no
    gradient here: a ValueError says so). ``threads`` and ``precision`` apply to the forward and
    the backward; lse carries its gradient; ``return_stats`` gives tensors without grad (computed
    by a second forward call with the same options). See :func:`attend`.

    Example:
        >>> import numpy as np, attn
        >>> q = _np.random.randn(1, 128, 8, 64).astype(_np.float32)
        >>> out = attn.attention(q, q, q, causal=True)
        >>> out.shape
        (1, 128, 8, 64)
    """
    if _wants_autograd(q, k, v):
        import torch
        # eager: the typed, checked mechanism's text; under torch.compile the text in plain Python
        # (a call into the extension would break the graph; C++ checks it when the op runs)
        text = (_softmax_text(causal, softmax_scale, window_size, softcap, dropout_p, seed)
                if torch.compiler.is_compiling() else
                str(_softmax_mechanism(causal, softmax_scale, window_size, softcap, dropout_p, seed)))
        return _attend_differentiable(q, k, v, text, attn_mask, key_padding_lengths, alibi_slopes, layout,
                                      return_lse, {}, return_probs=return_probs, return_stats=return_stats,
                                      stats_topk=stats_topk, threads=threads, precision=precision)
    mechanism = _softmax_mechanism(causal, softmax_scale, window_size, softcap, dropout_p, seed)
    return attend(q, k, v, mechanism, attn_mask=attn_mask, key_padding_lengths=key_padding_lengths,
                  alibi_slopes=alibi_slopes, layout=layout, return_lse=return_lse,
                  return_probs=return_probs, return_stats=return_stats, stats_topk=stats_topk, threads=threads,
                  precision=precision)


def info(text: str, context: Optional[int] = None) -> dict:
    """What a mechanism is, as its family declares it (C++ ``attn::info``)::

        attn.info("softmax:causal,window=255:0,sinks=4", context=32768)["cache_rows"]   # 260
        attn.info("linear:causal")["cache"]                                             # "state"

    Keys: ``family``, ``text`` (canonical), ``causal``, ``can_be_causal``, ``has_lse``,
    ``applies_positions`` (rotates q and k itself: DCA), ``position_mask``, ``cache`` (``"kv"``,
    ``"state"`` or ``"none"``), ``cache_rows`` (K/V rows one decoder layer keeps at ``context``
    tokens; with ``context=None``: the bound when the mechanism has one, else None for a KV cache
    that grows with the context, 0 for a state or none), ``cache_bound``, ``lookback``, ``sinks``,
    ``align``, ``state_shape`` (the rule), ``params`` (names), ``param_specs`` (name, shape,
    dtype, meaning, optional, generate, gradient: whether attend_backward returns its gradient),
    ``forms`` (priority order), ``grammar`` (the text form's options), ``limits``, ``option_ranges``
    (every float option's range, e.g. ``"scale in [1e-30, 1e+12]"``: values outside are refused,
    they would overflow float32)."""
    import json
    if isinstance(text, _attn.Mechanism):  # what softmax_mechanism() and linear_mechanism() make
        text = str(text)
    text = _args.text(text, "text")  # None, b"softmax" or 123 are refused, not str()-ed into a name
    d = json.loads(_attn.info_json(text, 0 if context is None else _integer(context, "context", 0, _INT64_MAX)))
    if context is None:
        d["context"] = None
        d["cache_rows"] = (d["cache_bound"] if d["cache_bound"] >= 0 else None) if d["cache"] == "kv" else 0
    return d


def families() -> list:
    """One :func:`info` dict per mechanism family (its default mechanism), in the order C++ declares
    them: what ``attn list --json`` prints."""
    import json
    return [json.loads(x) for x in _attn.family_infos_json()]


def mask_of(mechanism: str, n: int, m: Optional[int] = None) -> _np.ndarray:
    """The key pattern a mechanism implies, as a dense (n, m) bool array (True = query i sees key j).

    Positions are aligned bottom-right as in :func:`attend`: query i sits at position i + m - n.
    Key padding and your own masks are not part of it. Useful to look at a pattern
    (``plt.imshow(attn.mask_of("bigbird:block=64,random=3", 1024))``) or to check one.

    Args:
        mechanism: text form, e.g. "softmax:causal,window=256:0,sinks=4",
            "longformer:window=128:128,global=0;17;33", "bigbird:block=64,window=3,global=2,random=3,seed=7".
        n: queries. m: keys (default n); n * m at most 2^32.

    Example:
        >>> attn.mask_of("softmax:causal,window=2:0", 4).astype(int)
        array([[1, 0, 0, 0],
               [1, 1, 0, 0],
               [1, 1, 1, 0],
               [0, 1, 1, 1]])
    """
    if not isinstance(mechanism, str):
        raise TypeError(f"mechanism must be a str such as 'softmax:causal,window=256:0', got {type(mechanism).__name__}")
    n = _integer(n, "n", 0, _INT64_MAX)
    m = n if m is None else _integer(m, "m", 0, _INT64_MAX)
    return _attn.mask_of(mechanism, n, m)


def lsh_buckets(q: Any, k: Any, mechanism: str = "lsh", *, layout: str = "bnhd",
                key_padding_lengths: Optional[Sequence[int]] = None, params: Optional[Mapping[str, Any]] = None,
                **named_params: Any) -> Tuple[_np.ndarray, _np.ndarray]:
    """The buckets Reformer's LSH attention uses for these q and k (an "lsh:..." mechanism).

    Per round r, bucket(x) = argmax([x R_r, -x R_r]) with a random rotation R_r of shape
    (D, buckets / 2), drawn from the mechanism's seed or given as ``rotations=`` (rounds, D,
    buckets / 2). In :func:`attend`, queries and keys are each sorted by (bucket, position) and
    cut into chunks; query chunk c sees key chunks c and c - 1, and a query sees the union over
    rounds. With ``shared_qk`` the keys are hashed from the queries.

    Returns:
        (query_buckets, key_buckets): int32 arrays (B, H, rounds, N) and (B, Hk, rounds, M), Hk = H
        under shared_qk else k's heads; -1 for keys at or past ``key_padding_lengths``.

    Example:
        >>> qb, kb = attn.lsh_buckets(q, k, "lsh:buckets=8,rounds=2,seed=1")
    """
    if not isinstance(mechanism, str):
        raise TypeError(f"mechanism must be a str such as 'lsh:buckets=32', got {type(mechanism).__name__}")
    if not isinstance(layout, str) or layout not in ("bnhd", "bhnd"):
        raise ValueError(f"layout must be 'bnhd' or 'bhnd', got {layout!r}")
    q, k = _prepare(q, "q"), _prepare(k, "k")
    lengths = ([_integer(x, f"key_padding_lengths[{i}]") for i, x in enumerate(key_padding_lengths)]
               if key_padding_lengths is not None else [])
    named = {str(n): _prepare(x, f"params[{n!r}]") for n, x in {**(params or {}), **named_params}.items()}
    return _attn.lsh_buckets(q, k, mechanism, _options(layout=layout, key_padding_lengths=lengths, params=named))


def rope(x: Any, *, offset: int = 0, theta: float = 10000.0, style: str = "half", rotary_dim: Optional[int] = None,
         batch_offsets: Optional[Sequence[int]] = None, layout: str = "bnhd", inplace: bool = False):
    """Rotary position embedding (RoPE) of q or k.

    Pair c of the first ``rotary_dim`` channels of the token at position p is rotated by the
    angle p * theta^(-2c / rotary_dim), so that q_i . k_j depends on i - j only.

    Args:
        x: (B, N, H, D) for layout "bnhd" (default) or (B, H, N, D) for "bhnd"; float32,
            float16 or bfloat16 (torch only); NumPy array or CPU torch tensor, any strides.
        offset: position of the first token (e.g. the number of cached tokens).
        theta: the base (10000 for llama 2, 500000 for llama 3, 100000 for SmolLM2).
        style: "half" (rotate-half: pairs (c, c + R/2), as Hugging Face llama) or
            "interleaved" (pairs (2c, 2c + 1), as GPT-J and flash-attn's rotary_interleaved=True).
        rotary_dim: rotate only the first rotary_dim channels (even); None = all.
        batch_offsets: per-batch positions added to offset (e.g. each sequence's cache length).
        layout: "bnhd" or "bhnd".
        inplace: rotate x itself (it must be writable) instead of a copy.

    Returns:
        The rotated array, of x's kind, dtype and shape (x itself when inplace).

    Example:
        >>> q = attn.rope(q, offset=cache_len, theta=1e5)
    """
    given = x
    x = _prepare(x, "x")
    _dims(x, layout, "x")
    if not _flag(inplace, "inplace"):
        x = given = x.clone() if _is_torch(x) else _np.array(x, copy=True)
    _args.writable(x, "x", "inplace=True rotates x itself")
    if not isinstance(layout, str):
        raise TypeError(f"layout must be 'bnhd' or 'bhnd', got {layout!r}")
    offs = ([_integer(o, f"batch_offsets[{i}]", -2**63, _INT64_MAX) for i, o in enumerate(batch_offsets)]
            if batch_offsets is not None else [])
    if not isinstance(style, str):
        raise TypeError(f"style must be 'half' or 'interleaved', got {style!r}")
    _attn.rope_inplace(x, layout, _integer(offset, "offset", -2**63, _INT64_MAX), _real(theta, "theta"), style,
                       0 if rotary_dim is None else _integer(rotary_dim, "rotary_dim", 0, _INT64_MAX), offs)
    return given


def __getattr__(name: str):
    # attn.lab.experiments loads matplotlib, attn.lab.report builds the HTML page of its results:
    # imported on first use (and `python -m attn.lab.experiments` runs it without a second copy);
    # attn.experiments, attn.report and attn.recall name them as before
    if name in ("experiments", "report", "recall"):
        import importlib
        return importlib.import_module(".lab." + name, __name__)
    raise AttributeError(f"module 'attn' has no attribute {name!r}")

del annotations  # bound by the __future__ import above; not a name of attn
