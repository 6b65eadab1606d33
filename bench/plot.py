#!/usr/bin/env python3
"""Plots of the recorded benchmark figures (needs matplotlib: pip install matplotlib).

    python bench/plot.py                       # reads docs/figures/*.jsonl, writes docs/figures/*.png
    python bench/plot.py --bench my.jsonl --peers my_peers.jsonl --out /tmp
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

FIG = Path(__file__).resolve().parents[1] / "docs" / "figures"


def rows(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def label(r) -> str:
    return f"{r.get('q_len')}/{r.get('head_dim')}\n{'causal' if r.get('causal') else 'full'}\n{r.get('dtype')}"


def plot_bars(data, key: str, ylabel: str, title: str, lines, out: Path) -> None:
    """Grouped bars of `key` per case, one bar per thread count; `lines`: (y, style, label)."""
    threads = sorted({r["threads"] for r in data})
    cases = [r for r in data if r["threads"] == threads[-1]]
    fig, ax = plt.subplots(figsize=(12, 4.5))
    xs = range(len(cases))
    for k, t in enumerate(threads):
        vals = [next(r[key] for r in data if r["threads"] == t and label(r) == label(c)) for c in cases]
        ax.bar([x + k * 0.4 - 0.2 for x in xs], vals, width=0.4, label=f"{t} thread{'s' if t > 1 else ''}")
    for y, style, text in lines:
        ax.axhline(y, color="k" if style == "-" else "r", ls=style, lw=0.8, label=text)
    ax.set_xticks(list(xs), [label(c) for c in cases], fontsize=7)
    ax.set_xlabel("N=M / head dim, mask, dtype")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", type=Path, default=FIG / "bench_exact.jsonl")
    ap.add_argument("--peers", type=Path, default=FIG / "peers_sdpa.jsonl")
    ap.add_argument("--out", type=Path, default=FIG)
    a = ap.parse_args()
    if a.bench.exists():
        plot_bars(rows(a.bench), "ratio", "GFLOP/s ÷ same-run sgemm GFLOP/s",
                  "attn exact attention vs the OpenBLAS sgemm roofline (B=1, H=8)",
                  [(1.0, "-", None), (0.6, "--", "issue target 0.60")], a.out / "exact_vs_roofline.png")
    if a.peers.exists():
        data = [r for r in rows(a.peers) if not r.get("window")]
        plot_bars(data, "speedup", "speedup over torch SDPA (CPU)",
                  "attn.attention vs torch.nn.functional.scaled_dot_product_attention (B=1, H=8)",
                  [(1.0, "-", "torch SDPA")], a.out / "peers_sdpa.png")
    print(f"plots written to {a.out}")


if __name__ == "__main__":
    main()
