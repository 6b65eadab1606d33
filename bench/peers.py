#!/usr/bin/env python3
"""attn.attention vs torch.nn.functional.scaled_dot_product_attention on the CPU, same inputs,
same thread count, in one run. Prints time per call and the speed ratio (torch time / attn time,
> 1 means attn is faster) for every case, plus torch's own sgemm as a same-run roofline.

    python bench/peers.py                          # the issue's 32 cases (a few minutes)
    python bench/peers.py --sizes 1024 --json peers.jsonl
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F

import attn


def best_time(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def sgemm_gflops(threads: int, n: int = 2048) -> float:
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    t = best_time(lambda: a @ b, 3)
    return 2 * n**3 / t / 1e9


def decode(args, out) -> int:
    """One new token per head against a cache of M keys: memory-bound, so GB/s of K+V read."""
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    print(f"torch {torch.__version__}, attn isa {attn.active_isa()}; decode, B=1, H={args.heads}")
    print(f"{'M':>6} {'d':>4} {'Hkv':>4} {'dtype':>5} {'T':>2} {'attn ms':>9} {'torch ms':>9} {'attn GB/s':>9} "
          f"{'torch GB/s':>10} {'speedup':>8}")
    for m in args.decode or [4096, 16384]:
        for d in args.dims:
            for hkv in (args.heads, max(1, args.heads // 4)):
                for dt in args.dtypes:
                    for t in args.threads:
                        torch.set_num_threads(t)
                        g = torch.Generator().manual_seed(0)
                        q = torch.randn(1, args.heads, 1, d, generator=g).to(dtypes[dt])
                        k, v = (torch.randn(1, hkv, m, d, generator=g).to(dtypes[dt]) for _ in range(2))
                        gqa = hkv != args.heads
                        ours = best_time(lambda: attn.attention(q, k, v, layout="bhnd", threads=t), args.reps * 5)
                        theirs = best_time(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa), args.reps * 5)
                        nbytes = 2 * k.numel() * k.element_size()
                        row = dict(q_len=1, kv_len=m, head_dim=d, heads=args.heads, kv_heads=hkv, dtype=dt, threads=t,
                                   attn_seconds=ours, torch_seconds=theirs, speedup=theirs / ours,
                                   attn_gbs=nbytes / ours / 1e9, torch_gbs=nbytes / theirs / 1e9)
                        print(f"{m:>6} {d:>4} {hkv:>4} {dt:>5} {t:>2} {ours*1e3:>9.3f} {theirs*1e3:>9.3f} "
                              f"{row['attn_gbs']:>9.1f} {row['torch_gbs']:>10.1f} {row['speedup']:>7.2f}x", flush=True)
                        if out:
                            out.write(json.dumps(row) + "\n")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--dtypes", nargs="+", default=["f32", "bf16"], choices=["f32", "bf16", "f16"])
    ap.add_argument("--threads", type=int, nargs="+", default=[2])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--window", type=int, default=0,
                    help="also time causal sliding-window attention of this width (torch: SDPA with a band mask)")
    ap.add_argument("--decode", type=int, nargs="*", default=None, metavar="M",
                    help="instead: decode-shaped calls (one query per head against M cached keys, MHA and GQA 4:1), "
                         "reported in GB/s of K+V read")
    ap.add_argument("--json", help="write one JSON object per case to this file")
    args = ap.parse_args(argv)
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    out = open(args.json, "w") if args.json else None
    if args.decode is not None:
        return decode(args, out)
    roof = {t: sgemm_gflops(t) for t in args.threads}
    print(f"torch {torch.__version__}, attn isa {attn.active_isa()}; torch sgemm n=2048: "
          + ", ".join(f"{t}T {g:.0f} GFLOP/s" for t, g in roof.items()))
    print(f"{'N=M':>6} {'d':>4} {'mask':>6} {'dtype':>5} {'T':>2} {'attn ms':>9} {'torch ms':>9} {'attn/sgemm':>10} "
          f"{'torch/sgemm':>11} {'speedup':>8}")
    masks = ["full", "causal"] + (["window"] if args.window else [])
    cases = [(n, d, m, dt, t) for n in args.sizes for d in args.dims for m in masks for dt in args.dtypes
             for t in args.threads]
    for n, d, mask, dt, t in cases:
        causal = mask != "full"
        window = args.window if mask == "window" else 0
        torch.set_num_threads(t)
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, args.heads, n, d, generator=g).to(dtypes[dt]) for _ in range(3))
        if window:
            band = torch.ones(n, n, dtype=torch.bool).tril().triu(-window)  # j in [i - window, i]
            ours = best_time(lambda: attn.attention(q, k, v, causal=True, window_size=(window, 0), layout="bhnd",
                                                    threads=t), args.reps)
            theirs = best_time(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=band), args.reps)
            pairs = float(band.sum())
        else:
            ours = best_time(lambda: attn.attention(q, k, v, causal=causal, layout="bhnd", threads=t), args.reps)
            theirs = best_time(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), args.reps)
            pairs = n * (n + 1) / 2 if causal else float(n * n)
        flops = 4.0 * args.heads * pairs * d
        label = f"win{window}" if window else ("causal" if causal else "-")
        row = dict(q_len=n, kv_len=n, head_dim=d, heads=args.heads, causal=causal, window=window, dtype=dt, threads=t,
                   attn_seconds=ours, torch_seconds=theirs, speedup=theirs / ours,
                   attn_ratio=flops / ours / 1e9 / roof[t], torch_ratio=flops / theirs / 1e9 / roof[t],
                   torch_sgemm_gflops=roof[t])
        print(f"{n:>6} {d:>4} {label:>6} {dt:>5} {t:>2} {ours*1e3:>9.2f} {theirs*1e3:>9.2f} "
              f"{row['attn_ratio']:>10.3f} {row['torch_ratio']:>11.3f} {row['speedup']:>7.2f}x", flush=True)
        if out:
            out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
