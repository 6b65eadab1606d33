"""A decoder whose attention layers are attn mechanisms (C++: attn::Decoder), of any architecture
the registry knows (:func:`attn.llm.architectures`).

    >>> import attn
    >>> cfg = dict(vocab_size=256, dim=64, hidden_dim=128, heads=4, kv_heads=2, head_dim=16,
    ...            max_seq_len=512, layers=attn.Decoder.hybrid_layers(8, "7:1"))
    >>> m = attn.Decoder.random(cfg, seed=1)
    >>> logits = m.forward([1, 2, 3])          # (3, 256): the prompt
    >>> nxt = m.forward([int(logits[-1].argmax())])  # (1, 256): one more token, from the cache
    >>> m.save("tiny.safetensors"); m2 = attn.Decoder.load("tiny.safetensors")

Blocks of the default architecture (llama): RMSNorm -> attention (RoPE, GQA, a KV cache, or a
recurrent state for linear mechanisms) -> residual -> RMSNorm -> SwiGLU -> residual. Lightning layers (MiniMax-01) apply silu to q, k, v,
decay per head, RMS-normalise and gate their output. Weights are safetensors files with Hugging
Face llama tensor names and the config in the metadata entry "attn.decoder".
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from .. import _args, _attn
from .._serial import Serial

__all__ = ["Decoder"]

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


class Decoder:
    """A decoder with its weights and run state (KV caches and recurrent states, allocated once
    for ``max_seq_len`` tokens). One sequence at a time: calls from several threads are
    serialised by a lock per Decoder."""

    def __init__(self, impl: Any):
        self._impl = impl
        self._serial = Serial("Decoder")
        self._vocab = int(json.loads(impl.config_json)["vocab_size"])

    @staticmethod
    def load(path: str, *, mechanisms: Union[None, str, Sequence[str]] = None, threads: int = 0) -> "Decoder":
        """Maps a safetensors file written by :meth:`save`. ``mechanisms``: one text for every
        layer that is not a lightning layer, or one text per layer (None: the file's)."""
        if isinstance(mechanisms, str):
            mechanisms = [mechanisms]
        elif mechanisms is not None:
            if isinstance(mechanisms, bytes) or not isinstance(mechanisms, Sequence):
                raise TypeError(f"mechanisms must be a str, a sequence of str or None, got {type(mechanisms).__name__}")
            mechanisms = [_args.text(m, f"mechanisms[{i}]") for i, m in enumerate(mechanisms)]
        return Decoder(_attn.Decoder.load(_args.path(path), _args.integer(threads, "threads", -2**31, 2**31 - 1),
                                          mechanisms))

    @staticmethod
    def random(config: Mapping[str, Any], seed: int = 0, *, dtype: str = "float32", threads: int = 0) -> "Decoder":
        """Random weights for ``config`` (keys: vocab_size, dim, hidden_dim, heads, kv_heads,
        head_dim, max_seq_len, rope_theta, rope_style, norm_eps, tied_embeddings, layers: a list of
        {"mechanism": text, "rope": bool, "lightning": bool}; architecture: "llama" (the default) or
        another of :func:`attn.llm.architectures`, e.g. "minimax" with moe_experts, moe_top_k,
        docs/minimax.md), the same for a seed everywhere."""
        if not isinstance(config, Mapping):
            raise TypeError(f"config must be a dict, got {type(config).__name__}")
        try:
            text = json.dumps(dict(config), allow_nan=False)
        except (TypeError, ValueError) as e:
            raise TypeError(f"config must hold JSON values (numbers, str, lists, dicts): {e}") from None
        return Decoder(_attn.Decoder.random(text, _args.seed(seed), _args.text(dtype, "dtype"),
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
        layers = Decoder.softmax_layers(count, mechanism)
        for i in range(len(layers)):
            if i % (lin + soft) < lin:
                layers[i] = {"mechanism": _LIGHTNING, "rope": False, "lightning": True}
        return layers

    def forward(self, tokens: Sequence[int], pos: Optional[int] = None, *, all_logits: bool = True) -> np.ndarray:
        """Runs ``tokens`` after the ``pos`` tokens already in the context (default: all of them)
        and returns float32 logits, (len(tokens), vocab) or (1, vocab) for the last only."""
        ids = _args.token_ids(tokens, "tokens", self._vocab)
        pos = None if pos is None else _args.integer(pos, "pos")
        all_logits = _args.flag(all_logits, "all_logits")
        with self._serial:
            return self._impl.forward(ids, self._impl.position if pos is None else pos, all_logits)

    def logits(self, tokens: Sequence[int]) -> np.ndarray:
        """Logits of every position of ``tokens`` from an empty context."""
        ids = _args.token_ids(tokens, "tokens", self._vocab)
        with self._serial:
            self._impl.reset()
            return self._impl.forward(ids, 0, True)

    def reset(self) -> None:
        """Forgets the context."""
        with self._serial:
            self._impl.reset()

    def save(self, path: str) -> None:
        """Writes weights and config to a safetensors file (atomically)."""
        self._impl.save(_args.path(path))

    @property
    def position(self) -> int:
        return self._impl.position

    @property
    def config(self) -> dict:
        return json.loads(self._impl.config_json)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes the KV caches grow by per token of context (softmax-like layers)."""
        return self._impl.kv_bytes_per_token

    @property
    def state_bytes(self) -> int:
        """Bytes of recurrent states (linear layers), whatever the context length."""
        return self._impl.state_bytes

    def set_attention_form(self, form: str) -> None:
        """Forces an attention form ("reference", "tiled", ...; "" for the engine's choice)."""
        self._impl.set_attention_form(_args.text(form, "form"))
