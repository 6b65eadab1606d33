"""attn as an attention implementation of Hugging Face transformers.

    import attn.integrations.transformers as attn_hf
    from transformers import AutoModelForCausalLM

    backend = attn_hf.register()            # registers the name "attn"
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="attn")
    model.generate(**inputs, max_new_tokens=32)
    backend.calls, backend.prefill_calls, backend.decode_calls   # what went through attn

Every attention call of the model -- prefill, decoding against the KV cache (the cache's full keys
and values, the new tokens' queries), padded batches, encoders -- then runs in attn. The model's
projections, RoPE, caches and everything else stay transformers' own.

What :func:`register` installs under the name
---------------------------------------------
* an attention function (``AttentionInterface``): an :class:`AttnBackend`, which transformers
  calls as ``backend(module, query, key, value, attention_mask, scaling=, dropout=, **kwargs)``
  with query (B, H, N, D) and key/value (B, Hkv, M, D) (GQA: Hkv divides H), and which returns
  (output (B, N, H, D), weights or None);
* a mask builder (``AttentionMaskInterface``), :func:`build_mask`. It is needed: for an
  implementation without one, transformers passes no mask at all, so padding would be ignored.
  It returns the cheapest mask that says the same thing:

  - ``None`` for a causal mask that is exactly "causal": the queries are the last N of the M key
    positions (prefill, and every step of decoding with a ``DynamicCache``) and nothing is padded;
  - a (B, 1, 1, M) bool key mask (True = a real token) for such a causal mask with padding;
  - for a bidirectional (encoder) mask: ``None`` without padding, with padding the key mask
    broadcast (stride 0, no copy) to (B, 1, N, M);
  - anything else -- sliding windows, chunked attention, a ``StaticCache`` (keys past the
    queries), packed sequences, overlays a model adds -- transformers' own dense bool mask, the
    one ``sdpa`` gets.

  The attention function reads it back this way: a call is causal when the layer is
  (``is_causal`` keyword, else ``module.is_causal``, else True, as for sdpa), N > 1, and the mask
  is None or the same for every query (its dimension -2 is 1). attn then applies the causal
  mask aligned bottom-right -- query i sees keys j <= i + M - N --, which is transformers' mask
  exactly when the queries are the last N positions. A mask with N rows already holds the causal
  pattern and is used as given (torch's ``is_causal`` is top-left when N < M; attn's is not).

Mechanism override
------------------
``register(name="attn_window", mechanism="softmax:causal,window=255:0")`` runs every call with
that mechanism text (see ``attn.attend``) instead of exact softmax: a sliding window, sinks,
BigBird, ... on an unchanged pretrained model, to see what it does to its outputs. The text is
used as written, with the model's masks (padding, and the dense masks above) applied on top:

- it decides causality: for a decoder it must be causal (say ``causal``; ``window=W:0`` alone is
  causal too). A text whose pattern lets a query see a later key is refused (ValueError) in a
  call that needs causality; mechanisms without a fixed pattern (lsh, linformer) are not checked;
- transformers' ``sliding_window=W`` (keys with q - k < W) is attn's ``window=W-1:0``;
- the scale: if the text sets no ``scale=`` and the layer's ``scaling`` is not 1/sqrt(head_dim),
  the call is refused (say ``scale=`` yourself); likewise a model's ``softcap`` or, in training,
  a dropout the text does not set.

Not supported (ValueError naming the argument): learned attention sinks (``s_aux``),
``position_bias``, continuous batching's paged cache, flex_attention's BlockMask, masks that do
not broadcast to (B, H, N, M). ``output_attentions=True`` is supported: the weights (float32,
before dropout) come back as the attentions.
"""
from __future__ import annotations

import math
import re
from typing import Any, List, Optional

import attn

__all__ = ["register", "AttnBackend", "build_mask"]

# names transformers reads as its own implementations (substrings it tests) or as hub kernels
_TAKEN_WORDS = ("sdpa", "flash", "flex_attention")


class AttnBackend:
    """The attention function registered with transformers; counts what it runs.

    Attributes:
        mechanism: the mechanism text used instead of exact softmax (canonical form), or None.
        calls: attention calls so far; ``prefill_calls`` those with more than one query row,
            ``decode_calls`` those with one (a decoding step against the cache).
        masked_calls: calls that received a mask (padding, or a dense mask).
        causal_calls: calls where the backend applied attn's causal mask itself.
        layers: the ``layer_idx`` (or ``id``) of every module that called it.
        keep_probs: if True, every call's weights (B, H, N, M) float32 are appended to ``probs``.
        keep_stats: if True, every call's row statistics (:class:`attn.Stats`, each (B, H, N),
            streamed without the weights) and log-sum-exp (B, H, N) are appended to ``row_stats``
            as (stats, lse) pairs.
        threads: attn's thread count per call (0 = all cores).
    """

    def __init__(self, mechanism: Optional[str] = None, keep_probs: bool = False, threads: int = 0,
                 keep_stats: bool = False):
        if mechanism is not None and not isinstance(mechanism, str):
            raise TypeError(f"mechanism must be None or a mechanism text such as 'softmax:causal,window=255:0', "
                            f"got {type(mechanism).__name__}")
        for name, flag in (("keep_probs", keep_probs), ("keep_stats", keep_stats)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be True or False, got {flag!r}")
        if isinstance(threads, bool) or not isinstance(threads, int):
            raise TypeError(f"threads must be an integer, got {threads!r}")
        _check_threads(threads)
        self.mechanism = attn.canonical_mechanism(mechanism) if mechanism is not None else None
        self._options = _option_names(self.mechanism) if mechanism is not None else set()
        self._pattern_causal = _pattern_is_causal(self.mechanism) if mechanism is not None else None
        self.keep_probs = keep_probs
        self.keep_stats = keep_stats
        self.threads = threads
        self.reset()

    def reset(self) -> None:
        """Zero the counters and drop the kept weights."""
        self.calls = 0
        self.prefill_calls = 0
        self.decode_calls = 0
        self.masked_calls = 0
        self.causal_calls = 0
        self.layers: set = set()
        self.probs: List[Any] = []
        self.row_stats: List[Any] = []

    def __repr__(self) -> str:
        return f"AttnBackend(mechanism={self.mechanism!r}, calls={self.calls})"

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        _refuse_unsupported(kwargs)
        for name, x in (("query", query), ("key", key), ("value", value)):
            if getattr(x, "ndim", None) != 4:
                raise ValueError(f"{name} must be a 4-D tensor (B, heads, tokens, head_dim), got shape "
                                 f"{tuple(getattr(x, 'shape', ()))}")
        b, h, n, d = (int(s) for s in query.shape)
        m = int(key.shape[2])
        mask = _checked_mask(attention_mask, b, h, n, m)

        is_causal = kwargs.get("is_causal")
        if is_causal is None:
            is_causal = getattr(module, "is_causal", True)
        # a mask that is the same for every query row carries padding only: causality is ours to add
        causal = bool(is_causal) and n > 1 and (mask is None or mask.shape[2] == 1)
        p = float(dropout) if module.training else 0.0
        softcap = kwargs.get("softcap") or 0.0
        want_probs = self.keep_probs or bool(kwargs.get("output_attentions", False))

        # (B, N, H, D) views of transformers' (B, H, N, D) tensors: attn writes its output in this
        # layout, which is the (B, N, H, D) transformers wants back, without a copy
        q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
        extra = dict(return_probs=want_probs, return_lse=self.keep_stats, return_stats=self.keep_stats)
        if self.mechanism is None:
            res = attn.attention(q, k, v, causal=causal, softmax_scale=scaling, softcap=float(softcap),
                                 attn_mask=mask, dropout_p=p, seed=_seed() if p else 0, layout="bnhd",
                                 threads=self.threads, **extra)
        else:
            self._check_override(module, causal, scaling, softcap, p, d)
            res = attn.attend(q, k, v, self.mechanism, attn_mask=mask, layout="bnhd", threads=self.threads, **extra)
        res = list(res) if isinstance(res, tuple) else [res]
        out = res.pop(0)
        lse = res.pop(0) if self.keep_stats else None
        probs = res.pop(0) if want_probs else None
        if self.keep_stats:
            self.row_stats.append((res.pop(0), lse))

        self.calls += 1
        if n > 1:
            self.prefill_calls += 1
        else:
            self.decode_calls += 1
        self.masked_calls += mask is not None
        self.causal_calls += causal
        layer = getattr(module, "layer_idx", None)
        self.layers.add(layer if layer is not None else id(module))
        if self.keep_probs:
            self.probs.append(probs)
        return out, probs

    def _check_override(self, module, causal: bool, scaling, softcap, p: float, head_dim: int) -> None:
        where = f"{type(module).__name__} (layer {getattr(module, 'layer_idx', '?')})"
        if causal and self._pattern_causal is False:
            raise ValueError(f"mechanism {self.mechanism!r} lets a query see later keys, but {where} is causal and its "
                             "mask leaves causality to the backend; add 'causal' to the mechanism")
        if scaling is not None and "scale" not in self._options and \
                not math.isclose(float(scaling), head_dim ** -0.5, rel_tol=1e-6):
            raise ValueError(f"scaling: {where} scales scores by {float(scaling)!r}, not 1/sqrt(head_dim) = "
                             f"{head_dim ** -0.5!r}, and mechanism {self.mechanism!r} sets no scale=; add "
                             f"scale={float(scaling)!r} to it")
        if softcap and "softcap" not in self._options:
            raise ValueError(f"softcap: {where} caps scores at {float(softcap)!r}, and mechanism {self.mechanism!r} "
                             f"sets no softcap=; add softcap={float(softcap)!r} to it")
        if p and "dropout" not in self._options:
            raise ValueError(f"dropout: {where} is training with attention dropout {p!r}, and mechanism "
                             f"{self.mechanism!r} sets no dropout=; add dropout={p!r},seed=N or call model.eval()")


def build_mask(batch_size: int, q_length: int, kv_length: int, q_offset: Any = 0, kv_offset: int = 0,
               mask_function: Any = None, attention_mask: Any = None, local_size: Optional[int] = None,
               allow_is_causal_skip: bool = True, allow_is_bidirectional_skip: bool = False, **kwargs):
    """The mask builder registered with ``AttentionMaskInterface`` (see the module's docstring).

    Takes transformers' mask-builder arguments (those of ``masking_utils.sdpa_mask``): the query
    and key lengths and offsets (positions), the mask pattern as a function of (batch, head,
    query position, key position), and the 2-D padding mask (batch, positions), True = token.
    """
    from transformers import masking_utils as mu

    if mask_function is None:
        mask_function = mu.causal_mask_function
    padding = _key_padding(attention_mask, kv_length, kv_offset)
    first_query = _plain_int(q_offset)
    if (mask_function is mu.causal_mask_function and allow_is_causal_skip and first_query is not None
            and first_query + q_length == kv_offset + kv_length):
        return None if padding is None else padding[:, None, None, :]
    if mask_function is mu.bidirectional_mask_function:
        if padding is not None:
            return padding[:, None, None, :].expand(padding.shape[0], 1, q_length, kv_length)
        if allow_is_bidirectional_skip:
            return None
    # every other pattern: transformers' dense mask (never None for a causal pattern, since None
    # means bottom-right causal here, while sdpa_mask's None can mean top-left with a static cache)
    return mu.sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                        kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                        local_size=local_size, allow_is_causal_skip=False,
                        allow_is_bidirectional_skip=allow_is_bidirectional_skip, **kwargs)


def register(name: str = "attn", mechanism: Optional[str] = None, *, keep_probs: bool = False,
             threads: int = 0) -> AttnBackend:
    """Register attn with transformers as the attention implementation ``name``.

    Afterwards ``from_pretrained(..., attn_implementation=name)`` or
    ``model.set_attn_implementation(name)`` runs every attention call of the model in attn.
    Registering a name again replaces its backend (models look it up at every call).

    Args:
        name: the implementation name; letters, digits, '_' and '-', not one transformers reads
            as its own ("eager", or containing "sdpa", "flash", "flex_attention").
        mechanism: None for exact softmax (with the model's scaling, softcap, dropout and masks),
            or a mechanism text used instead for every call, e.g. "softmax:causal,window=255:0"
            (see the module's docstring for how it meets the model's masks and scaling).
        keep_probs: keep every call's attention weights in ``backend.probs`` (costs a
            (B, H, N, M) float32 tensor per call).
        threads: attn's thread count per call; 0 = all cores (attn's default).

    Returns:
        The :class:`AttnBackend` now registered: its counters show what ran through attn.
    """
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_\-]*", name):
        raise ValueError(f"name must be a word of letters, digits, '_' and '-' such as 'attn', got {name!r}")
    taken = [w for w in _TAKEN_WORDS if w in name] + (["eager"] if name == "eager" else [])
    if taken:
        raise ValueError(f"name {name!r} contains {taken[0]!r}, which transformers reads as one of its own attention "
                         "implementations; choose another name such as 'attn'")
    backend = AttnBackend(mechanism, keep_probs=keep_probs, threads=threads)
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as e:
        raise ImportError("attn.integrations.transformers needs transformers with AttentionInterface and "
                          f"masking_utils.AttentionMaskInterface (5.x is tested): {e}") from e
    AttentionInterface.register(name, backend)
    AttentionMaskInterface.register(name, build_mask)
    return backend


def _refuse_unsupported(kwargs) -> None:
    if kwargs.get("s_aux") is not None:
        raise ValueError("s_aux: learned attention sinks (a logit per head added to every softmax row) are not "
                         f"supported by the attn backend; got a tensor of shape {tuple(kwargs['s_aux'].shape)}")
    if kwargs.get("position_bias") is not None:
        raise ValueError("position_bias: a learned per-layer score bias is not supported by the attn backend; got "
                         f"a tensor of shape {tuple(kwargs['position_bias'].shape)}")
    cache = kwargs.get("cache")
    if cache is not None:
        raise ValueError(f"cache: the attn backend does not update a {type(cache).__name__} (continuous batching); "
                         "use generate() or forward() with a DynamicCache or StaticCache")


def _checked_mask(mask: Any, b: int, h: int, n: int, m: int) -> Any:
    if mask is None:
        return None
    import torch

    if not isinstance(mask, torch.Tensor):
        raise ValueError(f"attention_mask must be a torch.Tensor or None for the attn backend, got "
                         f"{type(mask).__name__}")
    shape = tuple(mask.shape)
    if not (len(shape) == 4 and shape[0] in (1, b) and shape[1] in (1, h) and shape[2] in (1, n) and shape[3] == m):
        raise ValueError(f"attention_mask must have shape (B or 1, H or 1, N or 1, M) = ({b}, {h}, {n}, {m}) for "
                         f"these queries and keys, got {shape}")
    if mask.dtype != torch.bool and not mask.dtype.is_floating_point:
        raise ValueError(f"attention_mask must be bool (True = attend) or float (added to the scores), got {mask.dtype}")
    return mask


def _key_padding(attention_mask: Any, kv_length: int, kv_offset: int) -> Any:
    """The (B, kv_length) bool key mask of the key positions, or None if no key is padding."""
    if attention_mask is None:
        return None
    import torch
    from transformers.masking_utils import prepare_padding_mask

    keys = prepare_padding_mask(attention_mask.to(torch.bool), kv_length, kv_offset)
    keys = keys[:, kv_offset:kv_offset + kv_length]
    return None if bool(keys.all()) else keys


def _plain_int(x: Any) -> Optional[int]:
    """x as an int, or None if it is a tensor being traced (a StaticCache's offset under compile)."""
    import torch

    if isinstance(x, torch.Tensor):
        if torch.compiler.is_compiling() or x.numel() != 1:
            return None
        return int(x.item())
    return int(x)


def _option_names(mechanism: str) -> set:
    options = mechanism.partition(":")[2]
    return {o.partition("=")[0] for o in options.split(",") if o}


def _pattern_is_causal(mechanism: str) -> Optional[bool]:
    """Whether no query of the pattern sees a later key (checked on 64 x 64); None without a fixed pattern."""
    import numpy as np

    try:
        visible = attn.mask_of(mechanism, 64, 64)
    except ValueError:
        return None
    return not bool(np.triu(visible, 1).any())


def _check_threads(threads: int) -> None:
    """Refuses a thread count now rather than at the model's first call, with attn's own check (C++ owns
    the range): explain() validates a one-token call without running it."""
    import numpy as np

    one = np.zeros((1, 1, 1, 1), np.float32)
    attn.explain(one, one, one, threads=threads)


def _seed() -> int:
    """A dropout seed from torch's generator, so torch.manual_seed makes training runs repeat."""
    import torch

    return int(torch.randint(0, 2**62, ()).item())
