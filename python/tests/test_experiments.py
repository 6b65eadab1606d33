"""The concentration experiments write their tables and plots, with the closed forms' values."""
import csv
import json
import subprocess
import sys

import numpy as np
import pytest

import attn

import matplotlib  # noqa: E402,F401  (installed by scripts/test.sh: a missing plotter fails loudly)


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
    p = subprocess.run([sys.executable, "-m", "attn.experiments", "curves", "--out", str(tmp_path / "c")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "RuntimeWarning" not in p.stderr and (tmp_path / "c" / "curves.png").exists()
    # hardening (issue 37): an --out that is not a directory is a usage error, not a traceback
    for out, fragment in (("/dev/full", "'/dev/full' exists and is not a directory"),
                          (tmp_path / "c" / "curves.png", "exists and is not a directory"),
                          (tmp_path / "c" / "curves.png" / "sub", "cannot create the directory")):
        p = subprocess.run([sys.executable, "-m", "attn.experiments", "curves", "--out", str(out)],
                           capture_output=True, text=True, timeout=120)
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
                       text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "c" / "curves.svg").exists() and "222 rows" in p.stdout
    p = subprocess.run([str(cli_path()), "concentration", "curves"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, ATTN_PYTHON=str(tmp_path / "no-python")))
    assert p.returncode == 2 and "set ATTN_PYTHON" in p.stderr


def _run_without_matplotlib(module, *args):
    """`python -m module args` in a process where `import matplotlib` raises ImportError."""
    code = ("import runpy, sys; sys.modules['matplotlib'] = None; "
            f"sys.argv = [{module!r}] + {list(args)!r}; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_experiments_without_matplotlib_say_which_extra_in_one_line(tmp_path):
    p = _run_without_matplotlib("attn.experiments", "curves", "--out", str(tmp_path / "c"))
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and 'pip install "attn[plots]"' in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "c").exists()


def test_report_run_without_matplotlib_says_which_extra_in_one_line(tmp_path):
    p = _run_without_matplotlib("attn.report", "--out", str(tmp_path / "r.html"), "--from", str(tmp_path),
                                "--run", "curves")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and 'pip install "attn[plots]"' in p.stderr, p.stderr
    assert not (tmp_path / "r.html").exists() and list(tmp_path.iterdir()) == []
