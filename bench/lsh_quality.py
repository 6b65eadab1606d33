#!/usr/bin/env python3
"""Reformer LSH attention against dense attention on inputs with real clustering:

    python bench/lsh_quality.py --n 16384 --heads 2 --d 64

Tokens are drawn around `--clusters` random centres (norm --spread apart, noise 0.3 per
channel), shared q = k as Reformer uses them. For each number of hash rounds it prints the time
as a share of dense attention (same inputs, same threads, best of --reps), and the relative error
||O_lsh - O_dense|| / ||O_dense||. The dense output averages a whole cluster, so missing a few of
its members already shows in this error.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import attn


def best_time(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=16384, help="tokens (queries = keys)")
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--d", type=int, default=64, help="head dim")
    ap.add_argument("--clusters", type=int, default=256)
    ap.add_argument("--spread", type=float, default=8.0, help="norm of the cluster centres")
    ap.add_argument("--buckets", type=int, default=64)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--rounds", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args(argv)

    rng = np.random.default_rng(0)
    centres = rng.standard_normal((a.heads, a.clusters, a.d))
    centres *= a.spread / np.linalg.norm(centres, axis=-1, keepdims=True)
    which = rng.integers(0, a.clusters, size=(a.heads, a.n))
    x = np.take_along_axis(centres, which[..., None], axis=1) + 0.3 * rng.standard_normal((a.heads, a.n, a.d))
    x = np.ascontiguousarray(x.transpose(1, 0, 2)[None], dtype=np.float32)  # (1, N, H, D)
    v = rng.standard_normal(x.shape, dtype=np.float32)
    flags = ",causal" if a.causal else ""
    dense_text = "softmax:causal" if a.causal else "softmax"
    dense = attn.attend(x, x, v, dense_text, threads=a.threads)
    t_dense = best_time(lambda: attn.attend(x, x, v, dense_text, threads=a.threads), a.reps)
    print(f"N={a.n} heads={a.heads} d={a.d} clusters={a.clusters} ({a.n // a.clusters} tokens each), "
          f"dense {dense_text}: {t_dense * 1e3:.1f} ms")
    print(f"{'mechanism':58s} {'ms':>8s} {'share':>7s} {'rel.err':>8s}")
    for r in a.rounds:
        text = f"lsh:buckets={a.buckets},rounds={r},chunk={a.chunk},seed=1{flags}"
        out = attn.attend(x, x, v, text, threads=a.threads)
        t = best_time(lambda: attn.attend(x, x, v, text, threads=a.threads), a.reps)
        err = np.linalg.norm(out - dense) / np.linalg.norm(dense)
        print(f"{text:58s} {t * 1e3:8.1f} {t / t_dense:7.3f} {err:8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
