"""The concentration experiments of issue 20, one function (and one command) each; every one
writes a table (CSV and JSON) and a plot (PNG and SVG) into a directory.

    python -m attn.experiments curves --out docs/figures/concentration
    >>> attn.experiments.curves("out/")       # also from Python; returns the table's rows

curves: the closed forms of attn.theory — sparsity S against gamma for several beta, for softmax
(exp), GAU (relu^2) and plain linear attention (identity); and S against the number of keys for
pure decay rows.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
from typing import Dict, List

import numpy as np

from . import theory

__all__ = ["curves"]

BETAS = (-1.0, 0.0, 1.0)
GAMMAS = tuple(float(g) for g in np.round(np.linspace(0.25, 4.0, 16), 4))
LAMBDAS = (0.9, 0.99, 0.999)
KEYS = tuple(int(n) for n in np.unique(np.round(np.logspace(0, 5, 26)).astype(int)))


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
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m attn.experiments", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment", choices=["curves"])
    ap.add_argument("--out", default="concentration", help="directory for the table and the plot")
    a = ap.parse_args(argv)
    rows = {"curves": curves}[a.experiment](a.out)
    print(f"{a.experiment}: {len(rows)} rows -> {a.out}/{a.experiment}.{{csv,json,png,svg}}")


if __name__ == "__main__":
    main()
