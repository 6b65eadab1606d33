"""A GGUF file's tokenizer (C++: attn::Tokenizer), giving the same ids as Hugging Face's
``tokenizers`` built from the same vocabulary: byte-level BPE (``tokenizer.ggml.model`` "gpt2":
SmolLM2, Qwen) or SentencePiece BPE ("llama": Gemma, Llama 2, Mistral).

    >>> tok = attn.Tokenizer.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")
    >>> ids = tok.encode(tok.chat_prompt([{"role": "user", "content": "Hi!"}]))
    >>> tok.decode(ids[-4:])
    '<|im_start|>assistant\\n'

Special tokens (control tokens such as ``<|im_start|>``) are matched verbatim in the text unless
``special=False``. Byte-level BPE: the SmolLM2 pre-tokenizer puts every digit in a piece of its
own, then cuts the text with GPT-2's regex; BPE merges each piece's bytes by rank. SentencePiece:
the text's spaces become "▁", pieces merge by score, bytes without a token become ``<0xXX>``
tokens. ``encode`` adds no BOS (``add_bos`` says whether the file asks for one; :class:`attn.Model`
adds it to text prompts).
"""
from __future__ import annotations

from typing import Any, List, Mapping, Sequence, Union

from .. import _args, _attn

__all__ = ["Tokenizer"]


class Tokenizer:
    """Immutable; ``encode`` releases the GIL, so threads may encode at once."""

    def __init__(self, impl: Any):
        self._impl = impl

    @staticmethod
    def from_gguf(path: str) -> "Tokenizer":
        """Reads ``tokenizer.ggml.*`` (model "gpt2" with pre-tokenizer "smollm" or "gpt2", or model
        "llama") and ``tokenizer.chat_template`` from a GGUF file."""
        return Tokenizer(_attn.Tokenizer.from_gguf(_args.path(path)))

    def encode(self, text: Union[str, bytes], special: bool = True) -> List[int]:
        """Token ids of ``text`` (str, or bytes: any bytes, not only UTF-8). ``special=False``
        treats the texts of special tokens as plain text."""
        if not isinstance(text, (str, bytes)):
            raise TypeError(f"text must be str or bytes, got {type(text).__name__}")
        if not isinstance(special, bool):
            raise TypeError(f"special must be True or False, got {special!r}")
        return self._impl.encode(text, special)

    def decode_bytes(self, ids: Sequence[int]) -> bytes:
        """The bytes ``ids`` stand for; incomplete UTF-8 sequences are kept as they are."""
        return self._impl.decode(_args.token_ids(ids, "ids", self._impl.vocab_size, empty=True))

    def decode(self, ids: Sequence[int]) -> str:
        """The text ``ids`` stand for; bytes that are not UTF-8 (a sequence cut between tokens)
        become U+FFFD, as in Hugging Face's decoders."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def token_text(self, id: int) -> str:
        """The token as the vocabulary writes it (the space is "Ġ": ``"Ġthe"``)."""
        return self._impl.token_text(self._id(id))

    def is_special(self, id: int) -> bool:
        """Whether the token is a control or user-defined token (matched and decoded verbatim)."""
        return self._impl.is_special(self._id(id))

    def chat_prompt(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
        """The file's chat template (ChatML) applied to ``messages``, a list of
        ``{"role": ..., "content": ...}``; with the template's default system turn when the first
        message is not a system message, and ``<|im_start|>assistant\\n`` at the end when
        ``add_generation_prompt``."""
        if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
            raise TypeError(f"messages must be a list of {{'role': ..., 'content': ...}} dicts, got {type(messages).__name__}")
        pairs = []
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise TypeError(f"messages[{i}] must be a dict with str 'role' and 'content', got {m!r}")
            pairs.append((m["role"], m["content"]))
        return self._impl.chat_prompt(pairs, _args.flag(add_generation_prompt, "add_generation_prompt"))

    @property
    def bos_id(self) -> int:
        """The BOS token id (-1 when the file names none)."""
        return self._impl.bos_id

    @property
    def add_bos(self) -> bool:
        """Whether a prompt starts with BOS (the file's tokenizer.ggml.add_bos_token; :meth:`encode`
        never adds it, :class:`attn.Model` does for text prompts)."""
        return self._impl.add_bos

    @property
    def eos_id(self) -> int:
        """The EOS token id (-1 when the file names none)."""
        return self._impl.eos_id

    @property
    def vocab_size(self) -> int:
        return self._impl.vocab_size

    @staticmethod
    def unicode_version() -> str:
        """The Unicode version of the letter/number/space tables ("16.0.0")."""
        return _attn.Tokenizer.unicode_version()

    def _id(self, id: Any) -> int:
        """One token id: an integer in [0, vocab_size)."""
        vocab = self._impl.vocab_size
        if not 0 <= _args.integer(id, "id") < vocab:
            raise ValueError(f"id = {int(id)} is not a token id in [0, {vocab}) (the vocabulary's size)")
        return int(id)
