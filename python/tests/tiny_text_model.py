"""A tiny llama GGUF language model for argument tests: the tokenizer of
tests/data/tiny_tokenizer.gguf (271 tokens; scripts/make_tiny_tokenizer_gguf.py) and random
float32 weights (2 layers, dim 32, tied embeddings), written with the gguf package's writer.
`poison` puts non-finite values in the weights: "all" (the final norm: every logit NaN) or "one"
(embedding row 5: logit 5 NaN at every position whose input is not token 5)."""
import importlib.util
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DIM, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, LAYERS = 32, 48, 2, 1, 16, 2


def _tokenizer_spec():
    spec = importlib.util.spec_from_file_location("make_tiny_tokenizer_gguf", ROOT / "scripts/make_tiny_tokenizer_gguf.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + mod.byte_alphabet() + [m.replace(" ", "") for m in mod.MERGES]
    return tokens, [3, 3, 3] + [1] * (len(tokens) - 3), mod.MERGES, mod.TEMPLATE


def write_tiny_text_model(path, *, context=64, poison=None, seed=0) -> int:
    """Writes the file; returns its vocabulary size."""
    import gguf

    tokens, types, merges, template = _tokenizer_spec()
    vocab = len(tokens)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(LAYERS), w.add_context_length(context), w.add_embedding_length(DIM)
    w.add_feed_forward_length(HIDDEN), w.add_head_count(HEADS), w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0), w.add_layer_norm_rms_eps(1e-5), w.add_rope_dimension_count(HEAD_DIM)
    w.add_tokenizer_model("gpt2"), w.add_tokenizer_pre("smollm"), w.add_token_list(tokens)
    w.add_token_types(types), w.add_token_merges(merges), w.add_bos_token_id(1), w.add_eos_token_id(2)
    w.add_chat_template(template)

    def matrix(name, rows, cols):
        w.add_tensor(name, (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32))

    def vector(name, n, value=None):
        x = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
        if value is not None:
            x[:] = value
        w.add_tensor(name, x)

    embed = (rng.standard_normal((vocab, DIM))).astype(np.float32)
    if poison == "one":
        embed[5] = np.nan
    w.add_tensor("token_embd.weight", embed)
    for i in range(LAYERS):
        b = f"blk.{i}."
        vector(b + "attn_norm.weight", DIM)
        matrix(b + "attn_q.weight", HEADS * HEAD_DIM, DIM)
        matrix(b + "attn_k.weight", KV_HEADS * HEAD_DIM, DIM)
        matrix(b + "attn_v.weight", KV_HEADS * HEAD_DIM, DIM)
        matrix(b + "attn_output.weight", DIM, HEADS * HEAD_DIM)
        vector(b + "ffn_norm.weight", DIM)
        matrix(b + "ffn_gate.weight", HIDDEN, DIM)
        matrix(b + "ffn_up.weight", HIDDEN, DIM)
        matrix(b + "ffn_down.weight", DIM, HIDDEN)
    vector("output_norm.weight", DIM, np.nan if poison == "all" else None)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return vocab
