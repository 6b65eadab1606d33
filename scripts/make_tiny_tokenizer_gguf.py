#!/usr/bin/env python3
"""Writes tests/data/tiny_tokenizer.gguf: a GGUF file with nothing but a small byte-level BPE
tokenizer (the 3 ChatML control tokens, the 256 byte tokens and 12 merges spelling " hello" and
" world"), SmolLM2's pre-tokenizer name and chat template. The ctest checks of `attn tokenize` read
it. Usage: python3 scripts/make_tiny_tokenizer_gguf.py [OUT]"""
import struct
import sys
from pathlib import Path

MERGES = ["h e", "l l", "he ll", "hell o", "Ġ hello", "o r", "w or", "l d", "wor ld", "Ġ world", "4 2", "Ġ 4"]
TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
            "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
            "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def byte_alphabet():
    printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF]
    others = [b for b in range(256) if b not in printable]
    table = {b: chr(b) for b in printable}
    table.update({b: chr(256 + i) for i, b in enumerate(others)})
    return [table[b] for b in range(256)]


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "tests/data/tiny_tokenizer.gguf"
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + byte_alphabet() + [m.replace(" ", "") for m in MERGES]
    types = [3, 3, 3] + [1] * (len(tokens) - 3)

    def string(s: str) -> bytes:
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    kvs = [
        ("general.architecture", 8, string("llama")),
        ("tokenizer.ggml.model", 8, string("gpt2")),
        ("tokenizer.ggml.pre", 8, string("smollm")),
        ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, len(tokens)) + b"".join(string(t) for t in tokens)),
        ("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, len(types)) + struct.pack(f"<{len(types)}i", *types)),
        ("tokenizer.ggml.merges", 9, struct.pack("<IQ", 8, len(MERGES)) + b"".join(string(m) for m in MERGES)),
        ("tokenizer.ggml.bos_token_id", 4, struct.pack("<I", 1)),
        ("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", 2)),
        ("tokenizer.chat_template", 8, string(TEMPLATE)),
    ]
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs))
    for key, kind, value in kvs:
        data += string(key) + struct.pack("<I", kind) + value
    out.write_bytes(data)
    print(f"{out}: {len(tokens)} tokens, {len(MERGES)} merges, {len(data)} bytes")


if __name__ == "__main__":
    main()
