"""The concentration experiments write their tables and plots, with the closed forms' values."""
import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import attn

import matplotlib  # noqa: E402,F401  (installed by scripts/test.sh: a missing plotter fails loudly)
from conftest import HANG_SECONDS


def test_curves_table_and_plots(tmp_path):
    rows = attn.experiments.curves(str(tmp_path))
    for ext in ("csv", "json", "png", "svg"):
        assert (tmp_path / f"curves.{ext}").stat().st_size > 0
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in (tmp_path / "curves.svg").read_text()
    assert json.loads((tmp_path / "curves.json").read_text()) == rows
    assert len(list(csv.DictReader(open(tmp_path / "curves.csv")))) == len(rows)
    exp = {(r["beta"], r["gamma"]): r["sparsity"] for r in rows if r["curve"] == "exp (softmax)"}
    assert exp[(0.0, 2.0)] == pytest.approx(np.exp(-2.0), rel=1e-15)
    lin = [r["sparsity"] for r in rows if r["curve"] == "identity (linear)"]
    assert min(lin) >= np.sqrt(2 / np.pi) - 1e-12  # linear attention never concentrates
    decay = [r for r in rows if r["curve"] == "decay" and r["lambda"] == 0.9]
    assert decay[-1]["n"] == 100000 and decay[-1]["sparsity"] == pytest.approx(attn.theory.sparsity_decay(0.9, 100000))


def test_experiments_command(tmp_path):
    p = subprocess.run([sys.executable, "-m", "attn.lab.experiments", "curves", "--out", str(tmp_path / "c")],
                       capture_output=True, text=True, timeout=HANG_SECONDS)
    assert p.returncode == 0, p.stderr
    assert "RuntimeWarning" not in p.stderr and (tmp_path / "c" / "curves.png").exists()
    # hardening: an --out that is not a directory is a usage error, not a traceback
    for out, fragment in (("/dev/full", "'/dev/full' exists and is not a directory"),
                          (tmp_path / "c" / "curves.png", "exists and is not a directory"),
                          (tmp_path / "c" / "curves.png" / "sub", "cannot create the directory")):
        p = subprocess.run([sys.executable, "-m", "attn.lab.experiments", "curves", "--out", str(out)],
                           capture_output=True, text=True, timeout=HANG_SECONDS)
        assert p.returncode == 2 and p.stderr.startswith("error: attn concentration: --out: ") and fragment in p.stderr, p.stderr


def test_needle_softmax_concentrates_linear_cannot_windows_do_not_see(tmp_path):
    rows = attn.experiments.needle(str(tmp_path), keys=(64, 1024))
    for ext in ("csv", "json", "png", "svg"):
        assert (tmp_path / f"needle.{ext}").stat().st_size > 0
    at = {(r["mechanism"], r["n"]): r for r in rows}
    soft, elu = at[("softmax", 1024)], at[("linear elu+1", 1024)]
    assert soft["needle_weight"] > 100 * elu["needle_weight"]  # softmax picks the far key out
    assert elu["sparsity"] > 0.9 and soft["sparsity"] < 0.5    # linear stays near uniform
    assert elu["needle_weight"] < 3 / 1024
    win = at[("softmax window 256", 1024)]
    assert not win["sees_needle"] and win["needle_weight"] == 0  # key 256 is outside the window of 256
    assert at[("softmax window 256", 64)]["sees_needle"]
    assert np.isnan(at[("retention 0.999", 64)]["entropy"])    # signed weights: entropy undefined


def test_scale_entropy_invariant_keeps_more_weight_on_the_needle(tmp_path):
    rows = attn.experiments.scale(str(tmp_path), keys=(64, 4096))
    w = {(r["text"], r["n"]): r["needle_weight"] for r in rows}
    assert w[("softmax:entropy_scale=512", 4096)] > 2 * w[("softmax", 4096)]


def test_model_statistics_of_real_attention(tmp_path):
    rows = attn.experiments.model(str(tmp_path), smollm2_tokens=96, minilm_sentences=4)
    for ext in ("csv", "json", "png", "svg"):
        assert (tmp_path / f"model.{ext}").stat().st_size > 0
    mini = [r for r in rows if r["model"] == "all-MiniLM-L6-v2"]
    smol = [r for r in rows if r["model"] == "SmolLM2-135M"]
    assert len(mini) == 6 * 12 and len(smol) == 30 * 9  # every layer and head
    for r in rows:
        assert 0 < r["sparsity"] <= 1 + 1e-9 and 0 <= r["entropy"] <= np.log(r["keys"]) + 1e-9 and 0 <= r["sink_mass"] <= 1 + 1e-6
    assert all(r["keys"] == 96 and r["rows"] == 96 for r in smol)
    # SmolLM2 leans on its first tokens in the deeper layers (attention sinks)
    assert max(r["sink_mass"] for r in smol if r["layer"] >= 2) > 0.5


def test_attn_concentration_command_runs_the_experiment(tmp_path):
    import os
    from test_cli import cli_path
    env = dict(os.environ, ATTN_PYTHON=sys.executable)
    p = subprocess.run([str(cli_path()), "concentration", "curves", "--out", str(tmp_path / "c")], capture_output=True,
                       text=True, timeout=HANG_SECONDS, env=env)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "c" / "curves.svg").exists() and "222 rows" in p.stdout
    p = subprocess.run([str(cli_path()), "concentration", "curves"], capture_output=True, text=True, timeout=HANG_SECONDS,
                       env=dict(os.environ, ATTN_PYTHON=str(tmp_path / "no-python")))
    assert p.returncode == 2 and "set ATTN_PYTHON" in p.stderr


def _run_without_matplotlib(module, *args):
    """`python -m module args` in a process where `import matplotlib` raises ImportError."""
    code = ("import runpy, sys; sys.modules['matplotlib'] = None; "
            f"sys.argv = [{module!r}] + {list(args)!r}; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_SECONDS)


def test_experiments_without_matplotlib_say_which_extra_in_one_line(tmp_path):
    p = _run_without_matplotlib("attn.lab.experiments", "curves", "--out", str(tmp_path / "c"))
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and 'pip install "attn[plots]"' in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "c").exists()


def test_report_run_without_matplotlib_says_which_extra_in_one_line(tmp_path):
    p = _run_without_matplotlib("attn.lab.report", "--out", str(tmp_path / "r.html"), "--from", str(tmp_path),
                                "--run", "curves")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and 'pip install "attn[plots]"' in p.stderr, p.stderr
    assert not (tmp_path / "r.html").exists() and list(tmp_path.iterdir()) == []


TRAIN_COLUMNS = ["mechanism", "description", "in_view", "step", "loss", "accuracy", "answer_weight", "answer_sparsity",
                 "answer_layer", "seconds", "note", "pairs",
                 "seq_len", "vocab", "d_model", "heads", "batch", "steps", "window", "sinks", "seed"]


@pytest.fixture(scope="module")
def quick_training(tmp_path_factory):
    out = tmp_path_factory.mktemp("train")
    return out, attn.experiments.train(str(out), quick=True)


def test_train_quick_writes_every_mechanism_with_the_columns(quick_training):
    out, rows = quick_training
    for ext in ("csv", "json", "png", "svg"):
        assert (out / f"train.{ext}").stat().st_size > 0
    assert json.loads((out / "train.json").read_text()) == rows
    table = list(csv.DictReader(open(out / "train.csv")))
    assert list(table[0]) == TRAIN_COLUMNS and len(table) == len(rows)
    assert list(dict.fromkeys(r["mechanism"] for r in rows)) == list(attn.experiments.TRAIN_MECHANISMS)
    for mech in attn.experiments.TRAIN_MECHANISMS:
        mine = [r for r in rows if r["mechanism"] == mech]
        if mine[0]["note"]:  # a mechanism attn cannot differentiate yet: one row that says so, no numbers
            assert len(mine) == 1 and mine[0]["note"].startswith("not trainable yet: ")
            assert mine[0]["loss"] is None and mine[0]["accuracy"] is None
            continue
        assert [r["step"] for r in mine] == [0, 10, 20, 30]  # evaluations at step 0, every 10 and the last
        assert all(np.isfinite(r["loss"]) and 0 <= r["accuracy"] <= 1 for r in mine)
        assert all(0 <= r["answer_weight"] <= 1 and 0 < r["answer_sparsity"] <= 1 for r in mine)
        assert all(r["answer_layer"] in (1, 2) for r in mine)


def test_train_quick_learns_with_softmax(quick_training):
    _, rows = quick_training
    soft = [r for r in rows if r["mechanism"] == "softmax"]
    assert soft[0]["note"] == "" and soft[-1]["step"] == 30
    # seeded weights and data: 30 steps take the loss from about ln(vocab) well down
    assert soft[0]["loss"] > np.log(32) - 0.5 and soft[-1]["loss"] < soft[0]["loss"] - 0.5


def test_train_window_cannot_see_every_pair(quick_training):
    _, rows = quick_training
    seen = {r["mechanism"]: r["in_view"] for r in rows}
    assert seen["softmax"] == 1.0 and seen["elu-linear"] == 1.0
    assert 0 < seen["window+sinks"] < 0.75  # a window of 6 and 2 sinks, pairs 8 tokens long, queries after them
    # a row cannot weigh a key its pattern hides: at most the share of queries whose answer is in view
    assert all(r["answer_weight"] <= r["in_view"] + 1e-6 for r in rows if r["mechanism"] == "window+sinks")


def test_train_same_seed_same_curves(tmp_path):
    from attn.lab.recall import QUICK, train_mechanism
    from dataclasses import replace
    cfg = replace(QUICK, steps=4, eval_every=2)
    a, b = (train_mechanism("softmax", cfg, log=open(os.devnull, "w")) for _ in range(2))
    assert [(r["loss"], r["accuracy"]) for r in a] == [(r["loss"], r["accuracy"]) for r in b]


def test_recall_batch_asks_each_key_once_for_the_value_that_followed_it():
    from attn.lab.recall import IGNORE, QUICK, recall_batch
    tokens, targets, value_at = recall_batch(np.random.default_rng(3), QUICK, 8)
    P, half = QUICK.pairs, QUICK.vocab // 2
    for t, y, at in zip(tokens, targets, value_at):
        keys, values = t[0:2 * P:2], t[1:2 * P:2]
        assert len(set(keys)) == P and (keys < half).all() and (keys > 0).all() and (values >= half).all()
        q = np.nonzero(y != IGNORE)[0]
        assert sorted(t[q]) == sorted(keys) and (q >= 2 * P).all()
        assert (y[q] == t[at[q]]).all() and (t[at[q] - 1] == t[q]).all()  # the value stored right after the key


def test_linear_mechanisms_are_never_replaced_by_another_attention(monkeypatch):
    # a mechanism whose backward raises is recorded with attn's reason, not trained with something else
    from attn import recall

    def no_backward(q, k, v, cfg):
        raise ValueError("attend_backward: linear has no backward yet")

    monkeypatch.setitem(recall.MECHANISMS, "elu-linear", (no_backward, no_backward))
    rows = recall.train_mechanism("elu-linear", recall.QUICK, log=open(os.devnull, "w"))
    assert len(rows) == 1 and rows[0]["note"] == ("not trainable yet: no_backward: ValueError: attend_backward: "
                                                  "linear has no backward yet")


def test_train_command_options(tmp_path):
    p = subprocess.run([sys.executable, "-m", "attn.lab.experiments", "--help"], capture_output=True, text=True, timeout=HANG_SECONDS)
    assert p.returncode == 0 and "--steps" in p.stdout and "--quick" in p.stdout and "train" in p.stdout
    p = subprocess.run([sys.executable, "-m", "attn.lab.experiments", "curves", "--steps", "3", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=HANG_SECONDS)
    assert p.returncode == 2 and "belong to the train experiment" in p.stderr
    p = subprocess.run([sys.executable, "-m", "attn.lab.experiments", "train", "--quick", "--steps", "2", "--out",
                        str(tmp_path / "t")], capture_output=True, text=True, timeout=HANG_SECONDS)
    assert p.returncode == 0, p.stderr
    assert "train: softmax      step     2/2" in p.stderr and (tmp_path / "t" / "train.png").exists()


def test_gemma_command_options_and_python_m_attn_lab(tmp_path):
    # the gemma experiment's lengths are its own; bad ones are usage errors before any work
    run = lambda *args: subprocess.run([sys.executable, "-m", "attn.lab.experiments", *args, "--out", str(tmp_path / "g")],  # noqa: E731
                                       capture_output=True, text=True, timeout=HANG_SECONDS)
    for args, fragment in ((("curves", "--tokens", "600"), "belong to the gemma experiment"),
                           (("curves", "--quick"), "--quick belongs to the train and gemma experiments"),
                           (("gemma", "--tokens", "600,1"), "every length must be >= 2"),
                           (("gemma", "--tokens", "many"), "expected comma-separated token counts"),
                           (("gemma", "--stats-tokens", "1"), "--stats-tokens must be >= 2"),
                           (("gemma", "--quick", "--tokens", "700"), "--quick sets the gemma lengths")):
        p = run(*args)
        assert p.returncode == 2 and fragment in p.stderr, (args, p.stderr)
    assert not (tmp_path / "g").exists()
    # python -m attn.lab runs the same experiments
    p = subprocess.run([sys.executable, "-m", "attn.lab", "curves", "--out", str(tmp_path / "c")],
                       capture_output=True, text=True, timeout=HANG_SECONDS)
    assert p.returncode == 0 and (tmp_path / "c" / "curves.png").exists(), p.stderr
    p = subprocess.run([sys.executable, "-m", "attn.lab", "--help"], capture_output=True, text=True, timeout=HANG_SECONDS)
    assert p.returncode == 0 and "gemma" in p.stdout and "--stats-tokens" in p.stdout


@pytest.mark.parametrize("name,calls", [("softmax", {"attention": 2}), ("window+sinks", {"attend": 2}),
                                        ("elu-linear", {"linear_attention": 2}), ("retention", {"linear_attention": 2}),
                                        ("hybrid", {"linear_attention": 1, "attention": 1})])
def test_every_layer_runs_attn_and_never_torch_attention(monkeypatch, name, calls):
    import torch
    from attn import recall
    counted, depth = {}, [0]
    for op in ("attention", "attend", "linear_attention"):
        def counting(*a, _op=op, _real=getattr(attn, op), **k):  # the model's calls, not attn's calls inside them
            if depth[0] == 0:
                counted[_op] = counted.get(_op, 0) + 1
            depth[0] += 1
            try:
                return _real(*a, **k)
            finally:
                depth[0] -= 1
        monkeypatch.setattr(attn, op, counting)

    def refused(*a, **k):
        raise AssertionError("torch's attention was called")
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", refused)
    tokens, targets, _ = recall.recall_batch(np.random.default_rng(0), recall.QUICK, 2)
    model = recall.RecallModel(recall.QUICK, recall.MECHANISMS[name])
    loss, _ = recall.loss_and_accuracy(model, torch.from_numpy(tokens), torch.from_numpy(targets))
    loss.backward()
    assert counted == calls
    assert all(p.grad is not None for p in model.blocks[0].qkv.parameters())  # the gradient went through attn


def test_titans_needle_memory_retrieves_beyond_the_window(tmp_path):
    rows = attn.experiments.titans_needle(str(tmp_path), distances=(4, 40), trials=4, d=32, window=16)
    for ext in ("csv", "json", "png", "svg"):
        assert (tmp_path / f"titans_needle.{ext}").stat().st_size > 0
    at = {(r["form"][:3], r["distance"]): r for r in rows}
    assert at[("sli", 4)]["accuracy"] == 1.0 and at[("sli", 4)]["cosine"] > 0.99  # inside the window
    assert at[("sli", 40)]["beyond_window"] and at[("sli", 40)]["accuracy"] == 0.0
    assert abs(at[("sli", 40)]["cosine"]) < 0.3
    for form in ("mem", "MAC"):  # the memory still holds the needle 40 tokens back
        assert at[(form, 40)]["cosine"] > 0.5 and at[(form, 40)]["accuracy"] == 1.0
    assert at[("MAG", 40)]["accuracy"] == 0.0  # a gate scales what the window found: it cannot bring v* back
