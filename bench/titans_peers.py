#!/usr/bin/env python3
"""Titans memory (attn.titans_memory, float32 mini-batch form) against the same run's sgemm rate
and a torch token loop computing the same rule, one run, same thread count.

    python bench/titans_peers.py                         # b = 16, d = 64, N = 4096, 2 threads
    python bench/titans_peers.py --n 1024 --d 32 --threads 1 2 --json titans.jsonl
    python bench/titans_peers.py --threads 1 --cpu-time --torch-tokens 0   # CPU time: on a busy machine

Per memory (linear, mlp): attn's time per call, GFLOP/s on the matrix-product FLOPs the fast form
does (counted below; the elementwise work, gelu included, is not counted), that rate as a ratio
of torch's sgemm GFLOP/s (2048^3, same threads; the issue's target is >= 0.4), and the time of
the torch token loop (closed-form gradients at the mini-batch's state, one S and M step and one
read per token, every head at once; run on the first --torch-tokens tokens and scaled to N) with
the largest difference between the two outputs there.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

import attn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import best_time, sgemm_gflops  # noqa: E402


def fast_flops(memory: str, n: int, d: int, b: int) -> float:
    """Multiply-adds x 2 of the fast form's gemm calls over a sequence of n tokens (one head)."""
    total = 0.0
    for t0 in range(0, n, b):
        nb = min(b, n - t0)
        tri = nb * (nb + 1)  # the causal products, row j summing j + 1 terms: sum 2 (j + 1) = nb (nb + 1)
        if memory == "linear":
            total += 10 * nb * d * d + 2 * nb * nb * d + tri * d
        else:
            h = 4 * d
            total += 22 * nb * d * h + 2 * nb * nb * d + 2 * nb * nb * h + tri * (h + d)
    return total


def torch_loop(q, k, v, theta, eta, alpha, w0, memory: str, b: int):
    """The rule token by token, all heads at once: q, k, v (H, N, d); gates (H, N); w0 dict of (H, ...)."""
    H, N, d = q.shape
    W = {n: w.clone() for n, w in w0.items()}
    S = {n: torch.zeros_like(w) for n, w in W.items()}
    y = torch.empty_like(q)
    sq2 = 1 / math.sqrt(2)
    for t in range(N):
        if t % b == 0:
            snap = {n: w.clone() for n, w in W.items()}
        kt, vt = k[:, t, :, None], v[:, t, :, None]  # (H, d, 1)
        if memory == "linear":
            e = snap["W"] @ kt - vt
            grads = {"W": 2 * e @ kt.transpose(1, 2)}
        else:
            z = snap["W1"] @ kt
            a = torch.nn.functional.gelu(z)
            e = snap["W2"] @ a - vt
            gp = 0.5 * (1 + torch.erf(z * sq2)) + z * torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
            grads = {"W2": 2 * e @ a.transpose(1, 2),
                     "W1": ((snap["W2"].transpose(1, 2) @ (2 * e)) * gp) @ kt.transpose(1, 2)}
        th, et, keep = theta[:, t, None, None], eta[:, t, None, None], 1 - alpha[:, t, None, None]
        for n in W:
            S[n] = et * S[n] - th * grads[n]
            W[n] = keep * W[n] + S[n]
        qt = q[:, t, :, None]
        out = W["W"] @ qt if memory == "linear" else W["W2"] @ torch.nn.functional.gelu(W["W1"] @ qt)
        y[:, t] = out[..., 0]
    return y, W


def _cpu_best_time(fn, reps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best


def _cpu_sgemm_gflops(threads: int, n: int = 2048) -> float:
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / _cpu_best_time(lambda: a @ b, 3) / 1e9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=4096, help="tokens N")
    ap.add_argument("--d", type=int, default=64, help="head dimension d")
    ap.add_argument("--b", type=int, default=16, help="mini-batch size b")
    ap.add_argument("--heads", type=int, default=2, help="heads H (B = 1): one sequence per thread at 2 threads")
    ap.add_argument("--threads", type=int, nargs="+", default=[2])
    ap.add_argument("--memories", nargs="+", default=["linear", "mlp"], choices=["linear", "mlp"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--torch-tokens", type=int, default=512,
                    help="the torch loop runs the first this many tokens (it takes ~2-10 ms a token); its time is "
                         "scaled to N per token, and the outputs are compared on that prefix (0: skip it)")
    ap.add_argument("--json", help="append one JSON line per case to this file")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time attn and sgemm by this thread's CPU time (threads must be 1): figures that hold on a "
                         "machine shared with other jobs, where wall time is mostly waiting")
    a = ap.parse_args(argv)
    if a.cpu_time:
        if a.threads != [1]:
            ap.error("--cpu-time needs --threads 1 (other threads' CPU time is not this thread's)")
        global best_time, sgemm_gflops
        best_time = lambda fn, reps: _cpu_best_time(fn, reps)  # noqa: E731
        sgemm_gflops = _cpu_sgemm_gflops
    rng = np.random.default_rng(0)
    H, N, d = a.heads, a.n, a.d
    unit = lambda x: (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)
    q, k = (unit(rng.standard_normal((1, H, N, d))) for _ in range(2))
    v = rng.standard_normal((1, H, N, d)).astype(np.float32)
    theta = (0.02 * rng.random((1, H, N))).astype(np.float32)  # larger steps make the mlp diverge
    eta = (0.5 + 0.5 * rng.random((1, H, N))).astype(np.float32)
    alpha = (0.05 * rng.random((1, H, N))).astype(np.float32)
    print(f"torch {torch.__version__}, attn isa {attn.active_isa()}; titans memory B=1 H={H} N={N} d={d} b={a.b}")
    print(f"{'memory':>7} {'T':>2} {'attn ms':>9} {'GFLOP/s':>8} {'sgemm':>7} {'ratio':>6} {'torch ms':>9} "
          f"{'speedup':>8} {'max diff':>9}")
    if a.torch_tokens > 0 and a.torch_tokens < N:
        print(f"(torch ms: the loop over the first {a.torch_tokens} tokens, scaled to N = {N}; max diff on them)")
    for t in a.threads:
        roof = sgemm_gflops(t)
        for memory in a.memories:
            w0 = attn.titans_init(d, memory, heads=H, seed=1)
            args = (q, k, v, theta, eta, alpha, memory, w0, a.b)
            sec = best_time(lambda: attn.titans_memory(*args, threads=t), a.reps)
            flops = fast_flops(memory, N, d, a.b) * H
            rate = flops / sec / 1e9
            row = dict(memory=memory, threads=t, n=N, d=d, b=a.b, heads=H, attn_ms=sec * 1e3, gflops=rate,
                       sgemm_gflops=roof, ratio=rate / roof)
            line = f"{memory:>7} {t:>2} {sec * 1e3:9.2f} {rate:8.1f} {roof:7.1f} {rate / roof:6.2f}"
            if a.torch_tokens > 0:
                nt = min(N, a.torch_tokens)
                torch.set_num_threads(t)
                tq, tk, tv = (torch.from_numpy(x[0, :, :nt]) for x in (q, k, v))
                tg = [torch.from_numpy(x[0, :, :nt]) for x in (theta, eta, alpha)]
                tw = {n: torch.from_numpy(x) for n, x in w0.items()}
                with torch.no_grad():
                    start = time.perf_counter()
                    ty, _ = torch_loop(tq, tk, tv, *tg, tw, memory, a.b)
                    tsec = (time.perf_counter() - start) * N / nt
                prefix = [x[:, :, :nt] for x in (q, k, v, theta, eta, alpha)]
                y, _ = attn.titans_memory(*prefix, memory, w0, a.b, threads=t)
                diff = float(np.max(np.abs(y[0] - ty.numpy())))
                row.update(torch_ms=tsec * 1e3, torch_tokens=nt, speedup=tsec / sec, max_abs_diff=diff)
                line += f" {tsec * 1e3:9.1f} {tsec / sec:7.1f}x {diff:9.2e}"
            print(line, flush=True)
            if a.json:
                with open(a.json, "a") as f:
                    f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
