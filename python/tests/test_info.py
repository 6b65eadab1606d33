"""attn.info: what each mechanism is, from the C++ family that owns it (no rule restated here)."""
import json
import subprocess

import pytest

import attn
from conftest import cli_path

KINDS = [d["family"] for d in attn.families()]


def test_families_are_every_kind_once():
    assert len(KINDS) == len(set(KINDS)) >= 14
    assert {"softmax", "linear", "dca", "gau", "qsoftmax"} <= set(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_every_family_answers(kind):
    d = attn.info(kind)
    assert isinstance(d, dict)
    assert d["family"] == kind
    assert d["cache"] in ("kv", "state", "none")
    assert isinstance(d["causal"], bool) and isinstance(d["params"], list)
    assert all(isinstance(p, str) for p in d["params"])
    assert d["forms"][-1] == "reference"
    assert d["grammar"].startswith(kind)


def test_cache_rows_at_a_context():
    w = attn.info("softmax:causal,window=255:0,sinks=4", context=32768)
    assert (w["family"], w["causal"], w["cache"], w["cache_rows"]) == ("softmax", True, "kv", 260)
    assert attn.info("softmax:causal,window=255:0,sinks=4")["cache_rows"] == 260  # the bound, any context
    assert attn.info("softmax:causal,window=255:0,sinks=4", context=100)["cache_rows"] == 100
    assert attn.info("softmax:causal", context=4096)["cache_rows"] == 4096
    assert attn.info("softmax:causal")["cache_rows"] is None  # grows with the context
    s = attn.info("linear:causal", context=4096)
    assert (s["cache"], s["cache_rows"], s["state_shape"]) == ("state", 0, "(B, H, D, Dv + 1)")
    assert attn.info("linformer:k=8")["cache"] == "none"
    assert attn.info("dca")["causal"] and attn.info("dca")["applies_positions"]


def test_params_are_names_with_specs_beside_them():
    d = attn.info("softmax:score=additive")
    assert d["params"] == ["wq", "wk", "w"]
    assert [s["name"] for s in d["param_specs"]] == d["params"]
    assert d["param_specs"][0]["shape"] == ["A", "D"]
    assert attn.info("performer:features=16")["param_specs"][-1]["shape"] == ["16", "D"]
    assert "decay" in attn.info("retention:decay=0.9")["params"]


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="unknown mechanism 'nope'"):
        attn.info("nope")
    with pytest.raises(ValueError, match="context"):
        attn.info("softmax", context=-1)


def test_cli_list_json_agrees():
    out = json.loads(subprocess.run([str(cli_path()), "list", "--json"], check=True, capture_output=True, text=True).stdout)
    assert [o["family"] for o in out] == KINDS
    for o in out:
        assert o == attn.info(o["text"], context=0)
