#!/usr/bin/env python3
"""How well Performer's random features estimate softmax attention as their number grows.

For each feature count, attn.attend(q, k, v, "performer:features=m,seed=s") against exact softmax
attention on the same inputs, over several seeds: the mean and max absolute error of the output
and the mean relative error, as a table (and JSON lines with --json).

    python bench/performer_error.py                       # N = 1024, d = 64, m = 64 .. 1024
    python bench/performer_error.py --n 4096 --d 128 --seeds 4 --json performer.jsonl
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

import attn


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1024, help="tokens (queries = keys)")
    ap.add_argument("--d", type=int, default=64, help="head dim")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--features", type=int, nargs="+", default=[64, 128, 256, 512, 1024])
    ap.add_argument("--seeds", type=int, default=4, help="random feature draws per count")
    ap.add_argument("--scale", type=float, default=0.5,
                    help="std of q and k entries (FAVOR+ variance grows like exp(|q|^2 + |k|^2) / sqrt(d))")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--json", help="write one JSON object per feature count to this file")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    q, k = (rng.standard_normal((1, args.n, args.heads, args.d), dtype=np.float32) * args.scale for _ in range(2))
    v = rng.standard_normal((1, args.n, args.heads, args.d), dtype=np.float32)
    causal = ",causal" if args.causal else ""
    exact = attn.attend(q, k, v, "softmax" + causal)
    print(f"Performer vs exact softmax: N = {args.n}, d = {args.d}, H = {args.heads}, q, k ~ N(0, {args.scale}^2), "
          f"{args.seeds} seeds{', causal' if causal else ''}")
    print(f"{'features':>8} {'mean |err|':>11} {'max |err|':>10} {'rel err':>8}")
    out = open(args.json, "w") if args.json else None
    for m in args.features:
        errs = [np.abs(attn.attend(q, k, v, f"performer:features={m},seed={s}{causal}") - exact)
                for s in range(1, args.seeds + 1)]
        mean = float(np.mean([e.mean() for e in errs]))
        worst = float(max(e.max() for e in errs))
        rel = float(np.mean([np.linalg.norm(e) / np.linalg.norm(exact) for e in errs]))
        print(f"{m:>8} {mean:>11.4f} {worst:>10.4f} {rel:>8.3f}", flush=True)
        if out:
            out.write(json.dumps(dict(features=m, n=args.n, d=args.d, heads=args.heads, seeds=args.seeds,
                                      causal=bool(causal), mean_abs_err=mean, max_abs_err=worst, rel_err=rel)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
