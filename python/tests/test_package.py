"""The installed package: docstrings explain every argument, type stubs ship with it."""
import inspect
import os
from pathlib import Path

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
