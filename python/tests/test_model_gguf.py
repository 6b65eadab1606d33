"""A llama GGUF file through attn's decoder.

1. A tiny llama written here with the gguf package's writer (Q8_0, Q4_1, Q4_0 and F32 tensors,
   Wq/Wk rows in llama.cpp's RoPE order, tied and untied output) against the literal float64
   PyTorch model of test_decoder.py fed the dequantized weights in Hugging Face order: checks the
   names, the row reordering, the quantized kernels and --dtype f32 loading.
2. The real SmolLM2-135M-Instruct (Q4_1) against transformers loading the same file (dequantized
   to float32): logits on 300 positions of real English text, 40 greedy tokens.
"""
import os
import pydoc_data.topics

import numpy as np
import pytest

import attn
from attn import _attn
from test_decoder import torch_logits
from conftest import HANG_SECONDS

torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType


def to_llama_cpp_rope_order(w, heads):
    """Hugging Face rotate-half rows -> llama.cpp's adjacent-pair rows (its converter's order)."""
    rows, cols = w.shape
    hd = rows // heads
    return w.reshape(heads, 2, hd // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def write_tiny_llama(path, *, tied, seed=0, qtypes=(Q.Q8_0, Q.Q4_1, Q.Q4_0)):
    """Returns (cfg, weights by HF name as float64 torch tensors: what the file decodes to)."""
    rng = np.random.default_rng(seed)
    cfg = dict(vocab_size=96, dim=64, hidden_dim=96, heads=4, kv_heads=2, head_dim=16, max_seq_len=64,
               rope_theta=10000.0, norm_eps=1e-5, layers=[{"lightning": False}] * 2)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2), w.add_context_length(64), w.add_embedding_length(64)
    w.add_feed_forward_length(96), w.add_head_count(4), w.add_head_count_kv(2)
    w.add_rope_freq_base(10000.0), w.add_layer_norm_rms_eps(1e-5), w.add_rope_dimension_count(16)
    values = {}
    counter = [0]

    def matrix(hf, name, shape, heads=None):
        x = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
        qt = qtypes[counter[0] % len(qtypes)]
        counter[0] += 1
        decoded = gguf.quants.dequantize(gguf.quants.quantize(x, qt), qt).reshape(shape)
        values[hf] = decoded.astype(np.float64)
        stored = to_llama_cpp_rope_order(decoded, heads) if heads else decoded
        q = gguf.quants.quantize(stored.astype(np.float32), qt)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qt)

    def vector(hf, name, n):
        x = (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)
        values[hf] = x.astype(np.float64)
        w.add_tensor(name, x)

    matrix("model.embed_tokens.weight", "token_embd.weight", (96, 64))
    for i in range(2):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        vector(p + "input_layernorm.weight", b + "attn_norm.weight", 64)
        matrix(p + "self_attn.q_proj.weight", b + "attn_q.weight", (64, 64), heads=4)
        matrix(p + "self_attn.k_proj.weight", b + "attn_k.weight", (32, 64), heads=2)
        matrix(p + "self_attn.v_proj.weight", b + "attn_v.weight", (32, 64))
        matrix(p + "self_attn.o_proj.weight", b + "attn_output.weight", (64, 64))
        vector(p + "post_attention_layernorm.weight", b + "ffn_norm.weight", 64)
        matrix(p + "mlp.gate_proj.weight", b + "ffn_gate.weight", (96, 64))
        matrix(p + "mlp.up_proj.weight", b + "ffn_up.weight", (96, 64))
        matrix(p + "mlp.down_proj.weight", b + "ffn_down.weight", (64, 96))
    vector("model.norm.weight", "output_norm.weight", 64)
    if not tied:
        matrix("lm_head.weight", "output.weight", (96, 64))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    cfg["tied_embeddings"] = tied
    return cfg, {k: torch.from_numpy(v) for k, v in values.items()}


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("dequantize", [False, True])
def test_tiny_gguf_llama_matches_the_torch_model(tmp_path, tied, dequantize):
    cfg, weights = write_tiny_llama(tmp_path / "tiny.gguf", tied=tied)
    tokens = [int(t) for t in np.random.default_rng(1).integers(0, 96, 40)]
    ref = torch_logits(cfg, weights, tokens)
    d = _attn.Decoder.from_gguf(str(tmp_path / "tiny.gguf"), 0, dequantize, 64, "f32")
    ours = d.forward(tokens, 0, True)
    assert ours.shape == (40, 96)
    err = np.abs(ours - ref).max()
    assert err <= 2e-5 * max(1.0, np.abs(ref).max()), err
    # incremental decoding (the in-register kernels for 1 row) equals the prefill (float panels)
    d.reset()
    d.forward(tokens[:30], 0, False)
    steps = [d.forward([t], 30 + i, False)[0] for i, t in enumerate(tokens[30:])]
    assert np.abs(np.stack(steps) - ours[30:]).max() <= 2e-5 * max(1.0, np.abs(ref).max())
    # 8-bit activations: the same up to the rounding of the inputs (quantized matrices only)
    d.activations = "q8"
    d.reset()
    d.forward(tokens[:30], 0, False)
    steps = np.stack([d.forward([t], 30 + i, False)[0] for i, t in enumerate(tokens[30:])])
    diff = np.abs(steps - ours[30:]).max()
    assert diff <= (2e-5 if dequantize else 0.05) * max(1.0, np.abs(ref).max()), diff
    if not dequantize:
        assert diff > 0  # the integer path ran


def test_gguf_files_that_are_not_llama_or_not_readable_are_refused(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "gpt2.gguf"), "gpt2")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(ValueError, match="general.architecture is 'gpt2'"):
        _attn.Decoder.from_gguf(str(tmp_path / "gpt2.gguf"), 0, False, 0)
    cfg, _ = write_tiny_llama(tmp_path / "tiny.gguf", tied=True)
    raw = (tmp_path / "tiny.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(raw[: len(raw) - 100])
    with pytest.raises(ValueError, match="cut.gguf"):
        _attn.Decoder.from_gguf(str(tmp_path / "cut.gguf"), 0, False, 0)
    d = _attn.Decoder.from_gguf(str(tmp_path / "tiny.gguf"), 0, False, 16)
    with pytest.raises(ValueError, match="exceed max_seq_len 16"):
        d.forward(list(range(17)), 0, False)
    with pytest.raises(ValueError, match="not causal"):
        d.set_mechanism(-1, "softmax")
    base = d.forward([1, 2, 3], 0, True)
    with pytest.raises(ValueError, match="keeps a recurrent state where 'softmax:causal' keeps a KV cache, and the "
                                         "context holds 3 tokens: reset"):
        d.set_mechanism(0, "linear:causal")
    d.reset()  # on an empty context a layer's KV cache may become a state, and back
    d.set_mechanism(0, "linear:map=elu,causal")
    z = d.forward([1, 2, 3], 0, True)
    assert z.shape == base.shape and np.isfinite(z).all() and not np.array_equal(z, base)
    d.reset()
    d.set_mechanism(0, "softmax:causal")
    assert np.array_equal(d.forward([1, 2, 3], 0, True), base)


# ---- the real model ---------------------------------------------------------------------------

def real_text(chars=6000):
    topics = pydoc_data.topics.topics
    return "\n".join(topics[k] for k in sorted(topics))[:chars]


@pytest.fixture(scope="module")
def smollm2():
    return attn.smollm2_path()


@pytest.fixture(scope="module")
def hf_smollm2(smollm2):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d, f = os.path.dirname(smollm2), os.path.basename(smollm2)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    model.eval()
    return tok, model


def test_smollm2_f32_logits_and_greedy_tokens_match_transformers(smollm2, hf_smollm2):
    tok, hf = hf_smollm2
    ids = tok(real_text())["input_ids"][:300]
    assert len(ids) == 300
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].numpy()
    m = _attn.Decoder.from_gguf(smollm2, 0, True, 512)
    ours = m.forward(ids, 0, True)
    err = np.abs(ours - ref).max()
    assert err <= 1e-3, err
    # 40 greedy tokens after a prompt, token by token from the cache
    prompt = ids[:64]
    with torch.no_grad():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False,
                           attention_mask=torch.ones(1, 64, dtype=torch.long))[0, 64:].tolist()
    m.reset()
    got, logits = [], m.forward(prompt, 0, False)
    for _ in range(40):
        got.append(int(logits[-1].argmax()))
        logits = m.forward([got[-1]], m.position, False)
    assert got == want


def test_smollm2_q4_1_as_stored_agrees_with_f32(smollm2):
    ids = list(range(1000, 1200))
    # float panels for the prompt (q8-decode): the same dequantized values as the float32 copy,
    # summed in the same order except Q4_1's fused q*d + m
    a = _attn.Decoder.from_gguf(smollm2, 0, False, 256, "q8-decode").forward(ids, 0, True)
    b = _attn.Decoder.from_gguf(smollm2, 0, True, 256).forward(ids, 0, True)
    assert np.abs(a - b).max() <= 1e-3 * np.abs(b).max()
    assert (a.argmax(-1) == b.argmax(-1)).mean() >= 0.99


def test_smollm2_q8_prompts_stay_near_the_float_panels(smollm2, hf_smollm2):
    """With q8 activations (the default) a prompt's rows go through the integer products of decode
    steps: within the 8-bit rounding of the float panels (q8-decode) over real text (measured:
    perplexity 0.2 % apart), perplexity within 0.5 %, greedy >= 93 % the same."""
    ids = hf_smollm2[0](real_text())["input_ids"][:300]
    d = _attn.Decoder.from_gguf(smollm2, 0, False, 512)
    assert d.activations == "q8"
    prompt = d.forward(ids, 0, True)
    d.activations = "q8-decode"
    d.reset()
    panels = d.forward(ids, 0, True)

    def perplexity(z):
        z = z[:-1].astype(np.float64)
        lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
        return float(np.exp(np.mean(lse - z[np.arange(len(z)), ids[1:]])))

    assert abs(perplexity(prompt) / perplexity(panels) - 1) <= 0.005, (perplexity(prompt), perplexity(panels))
    assert (prompt.argmax(-1) == panels.argmax(-1)).mean() >= 0.93


@pytest.mark.parametrize("tied", [True, False])
def test_tiny_gguf_packed_matrices_give_the_products_of_the_blocks_in_place(tmp_path, tied):
    """Quantized matrices packed in 16-row groups at load (the default) against the file's blocks
    read in place: float prefill (q8-decode) and float-activation steps multiply the same rows
    rebuilt (the same bits); 8-bit steps the same integer dots, their block terms summed in another
    order."""
    write_tiny_llama(tmp_path / "tiny.gguf", tied=tied)
    tokens = [int(t) for t in np.random.default_rng(2).integers(0, 96, 40)]
    packed, in_place = (_attn.Decoder.from_gguf(str(tmp_path / "tiny.gguf"), 0, False, 64, "q8-decode", "f32", repack)
                        for repack in (True, False))
    full = packed.forward(tokens, 0, True)
    assert np.array_equal(full, in_place.forward(tokens, 0, True))

    def steps(d, activations):
        d.activations = activations
        d.reset()
        d.forward(tokens[:30], 0, False)
        return np.stack([d.forward([t], 30 + i, False)[0] for i, t in enumerate(tokens[30:])])

    assert np.array_equal(steps(packed, "f32"), steps(in_place, "f32"))
    a, b = steps(packed, "q8"), steps(in_place, "q8")
    assert np.abs(a - b).max() <= 1e-5 * max(1.0, np.abs(full).max())
    assert np.abs(a - full[30:]).max() > 0  # 8-bit activations ran


def test_saving_a_quantized_gguf_model_asks_for_the_float_copy(tmp_path):
    """Regression: Decoder.save wrote a block-quantized matrix's bytes as a float32 tensor of its
    shape (reading past them), or a null pointer once matrices were packed. Now an error naming the
    tensor; the dequantized model saves and reloads to the same logits."""
    write_tiny_llama(tmp_path / "tiny.gguf", tied=False)
    tokens = [3, 1, 4, 1, 5]
    for repack in (True, False):
        d = _attn.Decoder.from_gguf(str(tmp_path / "tiny.gguf"), 0, False, 64, "q8", "f32", repack)
        with pytest.raises(ValueError, match=r"save: tensor 'model\.\S+\.weight' is block-quantized .*\(dtype \"f32\"\)"):
            d.save(str(tmp_path / "q.safetensors"))
        assert not (tmp_path / "q.safetensors").exists()
    f = _attn.Decoder.from_gguf(str(tmp_path / "tiny.gguf"), 0, True, 64)
    f.save(str(tmp_path / "f.safetensors"))
    back = _attn.Decoder.load(str(tmp_path / "f.safetensors"), 0, None)
    assert np.array_equal(back.forward(tokens, 0, True), f.forward(tokens, 0, True))


def test_smollm2_q8_activations_agree_with_float_activations(smollm2, hf_smollm2):
    """Decode steps with 8-bit activations and integer dot products against float activations on
    the same Q4_1 matrices, token by token over real text: the logits move by the rounding of the
    inputs to 8 bits (measured: max 1.1 of logits up to 41, greedy 97 % the same, perplexity
    within 1 %), never more."""
    ids = hf_smollm2[0](real_text())["input_ids"][:300]
    runs, ppl = {}, {}
    for act in ("f32", "q8"):
        d = _attn.Decoder.from_gguf(smollm2, 0, False, 512, act)
        assert d.activations == act
        rows = [d.forward(ids[:36], 0, False)[-1]]
        for t in ids[36:-1]:
            rows.append(d.forward([t], d.position, False)[-1])
        z = np.stack(rows).astype(np.float64)
        lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
        ppl[act] = float(np.exp(np.mean(lse - z[np.arange(len(z)), ids[36:]])))
        runs[act] = z
    a, b = runs["q8"], runs["f32"]
    assert np.abs(a - b).max() <= 0.05 * np.abs(b).max()
    assert (a.argmax(-1) == b.argmax(-1)).mean() >= 0.93
    assert abs(ppl["q8"] / ppl["f32"] - 1) <= 0.03, ppl


# ---- the Python contract: attn.load_model ------------------------------------------------------

@pytest.fixture(scope="module")
def model(smollm2):
    return attn.load_model(smollm2, max_seq_len=1024)


def test_load_model_logits_generate_and_mechanisms(model, smollm2):
    assert model.config["heads"] == 9 and model.config["kv_heads"] == 3 and len(model.config["layers"]) == 30
    assert model.kv_bytes_per_token == 30 * 2 * 3 * 64 * 4
    ids = model.tokenizer.encode(real_text(3000))[:400]
    z = model.logits(ids)
    assert z.shape == (400, 49152) and z.dtype == np.float32
    # a window the text is shorter than changes nothing; a short one changes later rows only
    same = model.logits(ids, mechanism="softmax:causal,window=1023:0")
    assert np.array_equal(same, z)
    w = model.logits(ids, mechanism="softmax:causal,window=31:0")
    assert np.array_equal(w[:32], z[:32]) and np.abs(w[32:] - z[32:]).max() > 0.1
    assert np.array_equal(model.logits(ids), z)  # the call's mechanism did not stick
    # greedy generation: text in, text out; ids in, ids out; the same as argmax decoding by hand
    out_ids = model.generate(ids[:50], max_tokens=12)
    d = _attn.Decoder.from_gguf(smollm2, 0, False, 256)
    want, logits = [], d.forward(ids[:50], 0, False)
    for _ in range(12):
        want.append(int(logits[-1].argmax()))
        logits = d.forward([want[-1]], d.position, False)
    assert out_ids == want
    pieces = []
    text = model.generate("The capital of France is", max_tokens=8, stream=pieces.append)
    assert isinstance(text, str) and "".join(pieces) == text and "Paris" in text
    # float activations answer this chat prompt with Paris; 8-bit ones (the default, as llama.cpp's)
    # tip its first token ("The" 25.33 vs "L" 25.24 in float) to llama.cpp's own reply
    reply = attn.load_model(smollm2, max_seq_len=64, activations="f32").generate(
        "What is the capital of France?", max_tokens=20, chat=True)
    assert "Paris" in reply
    assert model.generate("What is the capital of France?", max_tokens=6, chat=True).startswith("L'Étoile")
    # sampling: the same seed gives the same text
    a = model.generate("Once upon a time", max_tokens=10, temperature=0.9, top_p=0.95, seed=5)
    b = model.generate("Once upon a time", max_tokens=10, temperature=0.9, top_p=0.95, seed=5)
    assert a == b


def test_perplexity_with_windows_and_sinks(model):
    ids = model.tokenizer.encode(real_text(8000))[:1024]
    exact = model.perplexity(ids)
    assert exact["tokens"] == 1024 and exact["nll"].shape == (1023,)
    # the mean of per-token NLLs from the logits themselves
    z = model.logits(ids).astype(np.float64)
    lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
    nll = lse[:-1] - z[np.arange(1023), ids[1:]]
    assert np.abs(nll - exact["nll"]).max() <= 1e-4
    window = model.perplexity(ids, mechanism="softmax:causal,window=63:0")["perplexity"]
    sinks = model.perplexity(ids, mechanism="softmax:causal,window=63:0,sinks=4")["perplexity"]
    # sinks recover much of what a short window loses (StreamingLLM's observation)
    assert exact["perplexity"] < sinks < window


def test_load_model_errors(smollm2, tmp_path):
    with pytest.raises(ValueError, match=r"dtype: expected None \(as stored\) or 'f32', got 'int8'"):
        attn.load_model(smollm2, dtype="int8")
    with pytest.raises(ValueError, match="activations: expected 'auto', 'q8', 'q8-decode' or 'f32', got 'int4'"):
        attn.load_model(smollm2, activations="int4")
    assert attn.load_model(smollm2, max_seq_len=32, activations="f32").activations == "f32"
    assert attn.load_model(smollm2, max_seq_len=32).activations == "q8"
    with pytest.raises(FileNotFoundError, match="no such file"):
        attn.load_model(str(tmp_path / "missing.gguf"))
    m = attn.load_model(smollm2, max_seq_len=32)
    with pytest.raises(ValueError, match="exceed max_seq_len 32"):
        m.logits(list(range(40)))
    with pytest.raises(ValueError, match="^ids must hold one token id at least, got none"):
        m.logits([])
    with pytest.raises(ValueError, match="not causal"):
        m.logits([1, 2, 3], mechanism="softmax")
    with pytest.raises(ValueError, match="top_p must be in"):
        m.generate([1, 2, 3], max_tokens=2, temperature=1.0, top_p=0.0)


# ---- the command line ------------------------------------------------------------------------

def _cli(*args, stdin=None):
    import subprocess
    from test_cli import cli_path
    return subprocess.run([str(cli_path())] + [str(a) for a in args], input=stdin, capture_output=True, text=True,
                          timeout=HANG_SECONDS)


def test_cli_generate_and_chat_with_the_real_model(smollm2, model):
    p = _cli("generate", "--model", smollm2, "--prompt", "What is the capital of France?", "--chat", "--max-tokens", 20)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == model.generate("What is the capital of France?", max_tokens=20, chat=True).strip()
    assert "prefill" in p.stderr and "decode" in p.stderr and "KV 30 layers x 1.5 KiB per token" in p.stderr
    q8 = p.stdout
    p = _cli("generate", "--model", smollm2, "--prompt", "What is the capital of France?", "--chat", "--max-tokens", 20,
             "--activations", "q8", "--cache-type", "f16")
    assert p.returncode == 0, p.stderr
    assert "KV 30 layers x 768 B per token" in p.stderr, p.stderr
    assert p.stdout.split(",")[0] == q8.split(",")[0]  # a 16-bit cache moves logits by its rounding only
    # float activations, for the answers (8-bit ones tip this prompt's first token, as llama.cpp's)
    p = _cli("chat", "--model", smollm2, "--max-tokens", 16, "-q", "--activations", "f32",
             stdin="What is the capital of France?\nAnd of Italy?\n")
    assert p.returncode == 0, p.stderr
    replies = p.stdout.strip().split("\n")
    assert len(replies) >= 2 and "Paris" in replies[0] and "Rome" in p.stdout
    p = _cli("generate", "--model", smollm2, "--prompt", "x", "-m", "softmax")
    assert p.returncode == 2 and "not causal" in p.stderr


def test_cli_chat_defaults_answer_the_capital_of_france(smollm2):
    """attn chat with 8-bit prompts and plain greedy decoding answered "L'Étoile, la Marseillaise, la
    femme, la femme, ..." (the first token tipped by the prompt's 8-bit rounding, then a loop). Its
    defaults, float panels for each turn's prompt (--activations q8-decode) and --repeat-penalty 1.1
    (llama.cpp's older default), answer plainly; each default alone is what the other options show."""
    question = "What is the capital of France?\n"
    p = _cli("chat", "--model", smollm2, "-q", stdin=question)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("The capital of France is Paris."), p.stdout
    p = _cli("chat", "--model", smollm2, "-q", "--activations", "q8", "-n", "16", stdin=question)
    assert p.returncode == 0 and p.stdout.startswith("L'Étoile: Paris"), p.stdout  # the penalty alone
    p = _cli("chat", "--model", smollm2, "-q", "--activations", "q8", "--repeat-penalty", "1", "-n", "40", stdin=question)
    assert p.returncode == 0 and "la femme au martyre, la femme au martyre" in p.stdout, p.stdout  # plain greedy


def test_cli_eval_ppl_table_and_files(smollm2, model, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text(real_text(6000))
    out = tmp_path / "ppl"
    p = _cli("eval-ppl", "--model", smollm2, "--text", text, "--tokens", 600, "-q", "--out", out,
             "-m", "softmax:causal", "-m", "softmax:causal,window=63:0,sinks=4", "-m", "softmax:causal,window=63:0@exact-every=2",
             "-m", "linformer:k=64")
    assert p.returncode == 0, p.stderr
    import json
    rows = json.loads((tmp_path / "ppl.json").read_text())["rows"]
    assert [r["mechanism"] for r in rows][:2] == ["softmax:causal", "softmax:causal,window=63:0,sinks=4"]
    ids = model.tokenizer.encode(text.read_text(), special=False)[:600]
    assert abs(rows[0]["perplexity"] - model.perplexity(ids)["perplexity"]) <= 1e-3 * rows[0]["perplexity"]
    assert rows[1]["kv_ratio"] == pytest.approx(68 / 600, rel=1e-3)
    assert rows[2]["kv_ratio"] == pytest.approx((600 + 64) / 1200, rel=1e-3)  # half the layers exact
    assert rows[3]["perplexity"] is None and "not causal" in rows[3]["note"]
    svg = (tmp_path / "ppl.svg").read_text()
    assert svg.startswith("<svg") and svg.count("<circle") == 6 and "softmax:causal,window=63:0,sinks=4" in svg
    assert (tmp_path / "ppl.csv").read_text().splitlines()[0] == "mechanism,perplexity,seconds,kv_mib,kv_ratio,note"
    p = _cli("eval-ppl", "--model", smollm2, "--text", text, "--tokens", 100000)
    assert p.returncode == 2 and "fewer than --tokens 100000" in p.stderr
