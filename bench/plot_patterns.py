#!/usr/bin/env python3
"""Draws the key patterns of the sparse mechanisms (attn.mask_of) side by side, for docs/:

    python bench/plot_patterns.py --n 256 --out docs/figures/patterns.png

Black: query i (row) sees key j (column). Needs matplotlib (pip install matplotlib).
"""
from __future__ import annotations

import argparse
import sys

import attn

PATTERNS = [
    ("causal window 32", "softmax:causal,window=32:0"),
    ("window 32 + 4 sinks", "softmax:causal,window=32:0,sinks=4"),
    ("dilated 4", "softmax:causal,dilation=4"),
    ("window 64, dilation 2", "softmax:causal,window=64:0,dilation=2"),
    ("strided 16", "softmax:causal,strided=16"),
    ("chunked 64", "softmax:chunk=64"),
    ("Longformer w=16, globals 0;17;100", "longformer:window=16:16,global=0;17;100"),
    ("BigBird block 16, 3+2+2", "bigbird:block=16,window=3,global=2,random=2,seed=7"),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=256, help="queries = keys")
    ap.add_argument("--out", default="docs/figures/patterns.png", help=".png or .svg")
    args = ap.parse_args(argv)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 4, figsize=(14, 8.6))
    for ax, (title, text) in zip(axes.flat, PATTERNS):
        mask = attn.mask_of(text, args.n)
        ax.imshow(~mask, cmap="gray", interpolation="nearest")
        ax.set_title(f"{title}\n{mask.mean() * 100:.1f} % of pairs", fontsize=9)
        ax.set_xlabel(text, fontsize=6.5)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f"attn.mask_of(text, {args.n}): query i (rows) sees key j (columns) where black", fontsize=11)
    fig.tight_layout(h_pad=3.0)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
