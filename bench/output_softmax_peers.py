#!/usr/bin/env python3
"""The output-layer softmaxes against their peers in one run (with their targets), fp32, same threads:

  (a) attn.AdaptiveLogSoftmaxWithLoss.log_prob vs torch.nn.AdaptiveLogSoftmaxWithLoss.log_prob
      with the same weights (V = 50,000, d = 512, 1,024 rows, cutoffs [2000, 10000], div_value 4);
      target: torch time / attn time >= 1.5;
  (b) attn.HierarchicalSoftmax.log_prob of one target per row vs a full softmax over V on the same
      rows: torch's (N, d) x (d, V) product + log_softmax + the targets' entries (the way one
      computes log p(target) without a tree); target: full time / hierarchical time >= 10;
  plus torch's sgemm GFLOP/s as a same-run roofline (bench/peers.py's style).

    python bench/output_softmax_peers.py                 # 2 threads, about 20 s
    python bench/output_softmax_peers.py --threads 1 --reps 3
"""
from __future__ import annotations

import argparse
import os
import sys
import time

# attn's log_prob runs on its default thread count (OpenMP's, read when the library loads): set it
# from --threads before the import
for _i, _a in enumerate(sys.argv):
    if _a == "--threads" and _i + 1 < len(sys.argv):
        os.environ["OMP_NUM_THREADS"] = sys.argv[_i + 1]
    elif _a.startswith("--threads="):
        os.environ["OMP_NUM_THREADS"] = _a.split("=", 1)[1]
os.environ.setdefault("OMP_NUM_THREADS", "2")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import attn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import best_time, sgemm_gflops  # noqa: E402


def paired_best(f, g, reps: int):
    """Best times of f and g, called alternately (a shared machine's load bursts hit both alike)."""
    f(), g()
    bf = bg = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        t1 = time.perf_counter()
        g()
        t2 = time.perf_counter()
        bf, bg = min(bf, t1 - t0), min(bg, t2 - t1)
    return bf, bg


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=50_000)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--cutoffs", type=int, nargs="+", default=[2000, 10000])
    p.add_argument("--div-value", type=float, default=4.0)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    V, d, N = args.vocab, args.dim, args.rows
    print(f"torch {torch.__version__}, attn isa {attn.active_isa()}, {args.threads} threads, fp32; "
          f"V = {V}, d = {d}, {N} rows")
    roof = sgemm_gflops(args.threads)
    torch.set_num_threads(args.threads)
    print(f"torch sgemm 2048^3: {roof:.1f} GFLOP/s (same-run roofline)")

    # (a) adaptive softmax
    mod = torch.nn.AdaptiveLogSoftmaxWithLoss(d, V, cutoffs=args.cutoffs, div_value=args.div_value).eval()
    ours = attn.AdaptiveLogSoftmaxWithLoss.from_torch(mod)
    x = torch.randn(N, d)
    with torch.no_grad():
        want = mod.log_prob(x)
        got = ours.log_prob(x)
        err = (got - want).abs().max().item()
        t_torch, t_attn = paired_best(lambda: mod.log_prob(x), lambda: ours.log_prob(x), args.reps)
    sizes = [args.cutoffs[0] + len(args.cutoffs)] + [
        f"{d}->{int(d // args.div_value ** (i + 1))}->{c1 - c0}"
        for i, (c0, c1) in enumerate(zip(args.cutoffs, args.cutoffs[1:] + [V]))]
    macs = args.cutoffs[0] * d + len(args.cutoffs) * d + sum(
        int(d // args.div_value ** (i + 1)) * (d + c1 - c0)
        for i, (c0, c1) in enumerate(zip(args.cutoffs, args.cutoffs[1:] + [V])))
    gf = 2 * macs * N / 1e9
    print(f"\n(a) adaptive log_prob, cutoffs {args.cutoffs}, div_value {args.div_value} "
          f"(head {sizes[0]}, clusters {', '.join(sizes[1:])}; {gf:.2f} GFLOP of products), max |diff| {err:.1e}")
    print(f"    torch {t_torch * 1e3:8.2f} ms ({gf / t_torch:6.1f} GFLOP/s)")
    print(f"    attn  {t_attn * 1e3:8.2f} ms ({gf / t_attn:6.1f} GFLOP/s)")
    print(f"    ratio torch / attn = {t_torch / t_attn:.2f}x   (target >= 1.5x)")

    # (b) hierarchical log_prob of targets vs a full softmax over V
    rng = np.random.default_rng(0)
    counts = np.maximum((1e7 / np.arange(1, V + 1)).astype(np.int64), 1)  # Zipf-like word counts
    theta = (rng.standard_normal((V - 1, d)) * 0.05).astype(np.float32)
    hs = attn.HierarchicalSoftmax.from_counts(counts, theta)
    h = torch.randn(N, d)
    targets = torch.from_numpy(rng.integers(0, V, N))
    w_out = torch.randn(V, d) * 0.05
    depth = np.mean([len(hs.codes(int(t))) for t in targets])
    with torch.no_grad():
        full = lambda: F.log_softmax(h @ w_out.T, dim=-1).gather(1, targets[:, None])  # noqa: E731
        t_full, t_hs = paired_best(full, lambda: hs.log_prob(h, targets), args.reps)
    print(f"\n(b) log p(target) for {N} rows: hierarchical (mean path {depth:.1f} nodes) vs full softmax over "
          f"V = {V} (torch: (N, d) x (d, V) + log_softmax + gather)")
    print(f"    full softmax  {t_full * 1e3:8.2f} ms ({2 * N * d * V / t_full / 1e9:6.1f} GFLOP/s in the product)")
    print(f"    hierarchical  {t_hs * 1e3:8.2f} ms")
    print(f"    ratio full / hierarchical = {t_full / t_hs:.1f}x   (target >= 10x)")


if __name__ == "__main__":
    main()
