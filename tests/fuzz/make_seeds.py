#!/usr/bin/env python3
"""Writes the hostile seeds of the GGUF and safetensors fuzzers (tests/fuzz/corpus/{gguf,safetensors}).

Run from the repository root: python3 tests/fuzz/make_seeds.py. Every seed is small (< 4096
bytes, the fuzzers' -max_len) and deterministic; the files are committed, this script says how
they were made. GGUF seeds: a whole llama model of one block (F32 and F16) so that the fuzzer
reaches the decoder-config path, the same with a block_count of 10^8 or 2^63 and a context of
2^50, one tensor of each Q5 and K-quant type, metadata arrays of arrays nested three deep, and counts, lengths and dimensions near
2^63 / 2^64. Safetensors seeds: a header length of 2^63, a shape nested 200 deep, shapes and
offsets near 2^64, and decoder configs whose sizes overflow or exceed any machine.
"""
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")

# GGUF value types
U32, I32, F32, BOOL, STR, ARR, U64 = 4, 5, 6, 7, 8, 9, 10


def s(text):
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, payload):
    return s(key) + struct.pack("<I", vtype) + payload


def gguf(kvs, tensors=(), data=b"", n_tensors=None, n_kv=None):
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tensors)
    body += b"\0" * (-len(body) % 32)
    return body + data


def tensor(name, dims, ggml_type, offset):
    return s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + \
        struct.pack("<IQ", ggml_type, offset)


def llama(block_count=1, context=16, ggml_type=0, blocks=1):
    """A llama GGUF of `blocks` blocks (dim 4, one head, hidden 4, vocab 3), F32 (0) or F16 (1)."""
    elem = 4 if ggml_type == 0 else 2
    shapes = [("token_embd.weight", [4, 3], ggml_type), ("output_norm.weight", [4], 0)]
    for i in range(blocks):
        shapes += [(f"blk.{i}.attn_norm.weight", [4], 0), (f"blk.{i}.ffn_norm.weight", [4], 0)]
        shapes += [(f"blk.{i}.{n}.weight", [4, 4], ggml_type)
                   for n in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")]
    tensors, data = [], b""
    for name, dims, t in shapes:
        count = dims[0] * (dims[1] if len(dims) > 1 else 1)
        tensors.append(tensor(name, dims, t, len(data)))
        value = struct.pack("<f", 0.25) if t == 0 else struct.pack("<e", 0.25)
        data += value * count
        data += b"\0" * (-len(data) % 32)
    kvs = [kv("general.architecture", STR, s("llama")),
           kv("llama.block_count", U64, struct.pack("<Q", block_count)),
           kv("llama.context_length", U64, struct.pack("<Q", context)),
           kv("llama.embedding_length", U32, struct.pack("<I", 4)),
           kv("llama.feed_forward_length", U32, struct.pack("<I", 4)),
           kv("llama.attention.head_count", U32, struct.pack("<I", 1))]
    return gguf(kvs, tensors, data)


def quant_tensors():
    """One matrix of 2 rows x 256 values of each block type attn decodes and packs beyond
    Q4_0/Q4_1/Q8_0 (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), deterministic bytes, and a Q4_K block whose
    float16 scale is infinite."""
    types = {"q5_0": (6, 22 * 8), "q5_1": (7, 24 * 8), "q4_k": (12, 144), "q5_k": (13, 176), "q6_k": (14, 210)}
    tensors, data = [], b""
    for name, (ggml_type, size) in types.items():
        tensors.append(tensor(name, [256, 2], ggml_type, len(data)))
        data += bytes((i * 37 + ggml_type) % 251 for i in range(2 * size))
        data += b"\0" * (-len(data) % 32)
    tensors.append(tensor("q4_k_inf_scale", [256], 12, len(data)))
    data += b"\x00\x7c" + bytes(range(142))  # d = +inf
    return gguf([kv("general.architecture", STR, s("none"))], tensors, data)


def nested_array(depth, count):
    """An array whose elements are arrays ... (depth levels), each level claiming `count` items."""
    inner = struct.pack("<IQ", U32, 1) + struct.pack("<I", 7)
    for _ in range(depth):
        inner = struct.pack("<IQ", ARR, count) + inner
    return inner


GGUF_SEEDS = {
    "llama_f32.gguf": llama(),
    "llama_f16.gguf": llama(ggml_type=1),
    "llama_block_count_1e8.gguf": llama(block_count=10**8),
    "llama_block_count_2e63.gguf": llama(block_count=2**63),
    "llama_block_count_0.gguf": llama(block_count=0),
    "llama_context_2e50.gguf": llama(context=2**50),
    "quant_tensors.gguf": quant_tensors(),
    "arrays_of_arrays.gguf": gguf([kv("a.nested", ARR, nested_array(3, 2))]),
    "arrays_of_arrays_huge.gguf": gguf([kv("a.nested", ARR, nested_array(3, 2**62))]),
    "array_count_2e63.gguf": gguf([kv("a.big", ARR, struct.pack("<IQ", U32, 2**63) + b"\1\0\0\0")]),
    "string_array_count_2e60.gguf": gguf([kv("tokenizer.ggml.tokens", ARR, struct.pack("<IQ", STR, 2**60) + s("a"))]),
    "string_length_2e64.gguf": gguf([kv("general.name", STR, struct.pack("<Q", 2**64 - 1) + b"abc")]),
    "kv_count_2e62.gguf": gguf([kv("general.architecture", STR, s("llama"))], n_kv=2**62),
    "tensor_count_2e62.gguf": gguf([], [tensor("t", [4], 0, 0)], b"\0" * 16, n_tensors=2**62),
    "tensor_dims_2e62.gguf": gguf([], [tensor("t", [2**62, 4], 0, 0)], b"\0" * 16),
    "tensor_offset_2e64.gguf": gguf([], [tensor("t", [4], 0, 2**64 - 32)], b"\0" * 16),
}


def safetensors(header, data=b"", length=None):
    h = json.dumps(header, separators=(",", ":")).encode() if not isinstance(header, bytes) else header
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h) if length is None else length) + h + data


def decoder(**sizes):
    config = dict(vocab_size=3, dim=4, hidden_dim=4, heads=1, head_dim=4, max_seq_len=8,
                  layers=[{"mechanism": "softmax:causal"}])
    config.update(sizes)
    return safetensors({"__metadata__": {"attn.decoder": json.dumps(config)}})


SAFETENSORS_SEEDS = {
    "header_length_2e63.safetensors": safetensors({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
                                                  b"\0" * 4, length=2**63),
    "shape_nested_200.safetensors": safetensors(
        b'{"t":{"dtype":"F32","shape":' + b"[" * 200 + b"1" + b"]" * 200 + b',"data_offsets":[0,4]}}', b"\0" * 4),
    "shape_2e62.safetensors": safetensors({"t": {"dtype": "F32", "shape": [2**62, 2**62], "data_offsets": [0, 4]}},
                                          b"\0" * 4),
    "offsets_2e64.safetensors": safetensors({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 2**64 - 1]}},
                                            b"\0" * 4),
    "decoder_vocab_dim_huge.safetensors": decoder(vocab_size=2**31 - 1, dim=2**40, heads=2**20, head_dim=2**20),
    "decoder_hidden_2e62.safetensors": decoder(hidden_dim=2**62),
    "decoder_context_2e62.safetensors": decoder(max_seq_len=2**62),
    "decoder_layers_many.safetensors": decoder(layers=[{}] * 600),
    "decoder_sizes_not_integers.safetensors": decoder(dim=1.5e300, heads=-1),
}


def main():
    for folder, seeds in (("gguf", GGUF_SEEDS), ("safetensors", SAFETENSORS_SEEDS)):
        os.makedirs(os.path.join(ROOT, folder), exist_ok=True)
        for name, blob in seeds.items():
            assert len(blob) < 4096, (name, len(blob))
            with open(os.path.join(ROOT, folder, name), "wb") as f:
                f.write(blob)
    print(f"{len(GGUF_SEEDS)} GGUF and {len(SAFETENSORS_SEEDS)} safetensors seeds in {ROOT}")


if __name__ == "__main__":
    main()
