"""The installed package: docstrings explain every argument, type stubs ship with it."""
import inspect
import os
import sys
from pathlib import Path

import pytest

import attn


def test_docstrings_cover_every_argument():
    for fn in (attn.attention, attn.attend, attn.explain, attn.rope):
        doc = inspect.getdoc(fn)
        for name in inspect.signature(fn).parameters:
            assert f"{name}" in doc, f"{fn.__name__}: argument {name} is not documented"
    assert "bottom-right" in inspect.getdoc(attn.attention)
    assert "layout" in attn.__doc__ and "-inf" in attn.__doc__


def test_type_stubs_are_installed():
    pkg = Path(attn.__file__).parent
    stub = (pkg / "_attn.pyi").read_text()
    assert "def attend(" in stub and "class Options" in stub and "def canonical_mechanism(" in stub
    assert (pkg / "py.typed").exists()


def test_canonical_mechanism_round_trip():
    assert attn.canonical_mechanism("softmax:scale=0.5,causal") == "softmax:causal,scale=0.5"


def test_every_isa_required_by_the_environment_runs():
    """ATTN_REQUIRE_ISAS (comma-separated) names ISA paths the run must exercise: one this CPU
    cannot run is a failure, not a silently smaller suite."""
    for name in filter(None, os.environ.get("ATTN_REQUIRE_ISAS", "").split(",")):
        assert name in attn.supported_isas(), (
            f"ATTN_REQUIRE_ISAS names {name}, which this CPU cannot run (it runs {attn.supported_isas()})")


def test_the_wings_and_every_name_of_attn():
    # attn.llm, attn.blocks and attn.lab hold the other wings; every name they export is still attn's
    for wing in (attn.llm, attn.blocks, attn.lab):
        for name in wing.__all__:
            assert getattr(attn, name) is getattr(wing, name), f"attn.{name} is not {wing.__name__}.{name}"
    for name in attn.__all__:
        assert hasattr(attn, name), name
    assert attn.experiments is attn.lab.experiments and attn.report is attn.lab.report
    assert attn.recall is attn.lab.recall


def test_import_attn_exports_only_its_api():
    # numpy as np, typing's names and the __future__ flag were attributes of attn
    import types
    leaked = [n for n in dir(attn) if not n.startswith("_") and n not in attn.__all__
              and not isinstance(getattr(attn, n), types.ModuleType)]
    assert not leaked, leaked
    for wing in (attn.llm, attn.blocks, attn.lab):
        leaked = [n for n in dir(wing) if not n.startswith("_") and n not in wing.__all__
                  and not isinstance(getattr(wing, n), types.ModuleType)]
        assert not leaked, (wing.__name__, leaked)


def test_architectures_come_from_the_registry():
    archs = attn.llm.architectures()
    assert [a["name"] for a in archs][:2] == ["llama", "minimax"]
    llama = archs[0]
    assert llama["gguf"] is True and llama["baseline"] == "" and "SwiGLU" in llama["summary"]
    assert archs[1]["baseline"] == "llama" and archs[1]["gguf"] is False
    cfg = dict(vocab_size=32, dim=16, hidden_dim=24, heads=2, kv_heads=1, head_dim=8, max_seq_len=16,
               layers=attn.Decoder.softmax_layers(1), architecture="gemma-next")
    with pytest.raises(ValueError, match=r"unknown architecture 'gemma-next' \(known: llama, minimax"):
        attn.Decoder.random(cfg)


def test_pip_install_gives_the_attn_command():
    # the wheel carries the CLI: bin/attn beside the environment's python (or in a --target's bin)
    import pathlib
    import subprocess
    candidates = [pathlib.Path(sys.prefix) / "bin" / "attn", pathlib.Path(attn.__file__).parents[1] / "bin" / "attn"]
    found = [c for c in candidates if c.is_file()]
    assert found, f"no attn command in {[str(c) for c in candidates]}"
    p = subprocess.run([str(found[0]), "--version"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and p.stdout == f"attn {attn.__version__}\n", (p.stdout, p.stderr)


def test_committed_figures_name_no_machine_paths():
    """The checked-in outputs (docs/figures: tables, charts, the report page) say which files they
    were made from by name, never where those lay on the machine that made them."""
    import pathlib
    figures = pathlib.Path(__file__).resolve().parents[2] / "docs" / "figures"
    if not figures.is_dir():
        pytest.skip("no docs/figures beside this test (an installed copy)")
    leaks = []
    for f in sorted(figures.rglob("*")):
        if f.suffix in (".svg", ".json", ".jsonl", ".csv", ".html"):
            text = f.read_text(encoding="utf-8", errors="replace")
            leaks += [f"{f.relative_to(figures)}: {m}" for m in ("/work/", "/root/", "/home/", "/tmp/", "site-packages")
                      if m in text]
    assert not leaks, leaks
