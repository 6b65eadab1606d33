#!/usr/bin/env python3
"""MiniMax-01's MoE feed-forward (attn.moe_feed_forward) against dense SwiGLU and torch, same run,
same thread count (the target: MoE <= 1.3x the time of two dense SwiGLU
feed-forwards of the same size over the same tokens, the FLOPs a top-2 MoE does).

    python bench/moe_peers.py                       # 32 experts, top-2, d 512, d_ff 1024, 2048 tokens, 2 threads
    python bench/moe_peers.py --experts 8 --tokens 512 --threads 1

attn's dense SwiGLU is attn.moe_feed_forward with one expert and top_k = 1 (p = 1, weight 1: the
same code without routing spread). torch's MoE is the usual gather loop (index the tokens of each
expert, three matmuls, index_add_ back); torch's dense is three matmuls. Prints times, the ratios,
GFLOP/s and torch's same-run sgemm rate as a roofline.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

import attn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import best_time, sgemm_gflops  # noqa: E402


def torch_moe(x, router, w1, w2, w3, k):
    p = torch.softmax(x @ router.T, dim=-1)
    top_p, top_i = torch.topk(p, k, dim=-1)
    w = top_p / top_p.sum(-1, keepdim=True)
    y = torch.zeros_like(x)
    for e in range(router.shape[0]):
        token, slot = torch.where(top_i == e)
        if token.numel():
            h = x[token]
            y.index_add_(0, token, ((F.silu(h @ w1[e].T) * (h @ w3[e].T)) @ w2[e].T) * w[token, slot, None])
    return y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = np.random.default_rng(0)
    E, d, F_, n, k = a.experts, a.dim, a.hidden, a.tokens, a.top_k
    x = g.standard_normal((n, d), dtype=np.float32)
    router = (g.standard_normal((E, d), dtype=np.float32) / np.sqrt(d)).astype(np.float32)
    w1 = (g.standard_normal((E, F_, d), dtype=np.float32) / np.sqrt(d)).astype(np.float32)
    w3 = (g.standard_normal((E, F_, d), dtype=np.float32) / np.sqrt(d)).astype(np.float32)
    w2 = (g.standard_normal((E, d, F_), dtype=np.float32) / np.sqrt(F_)).astype(np.float32)

    moe = best_time(lambda: attn.moe_feed_forward(x, router, w1, w2, w3, top_k=k, threads=a.threads), a.reps)
    dense = best_time(lambda: attn.moe_feed_forward(x, router[:1], w1[:1], w2[:1], w3[:1], top_k=1, threads=a.threads),
                      a.reps)
    tx, tr, t1, t2, t3 = (torch.from_numpy(v) for v in (x, router, w1, w2, w3))
    with torch.no_grad():
        t_moe = best_time(lambda: torch_moe(tx, tr, t1, t2, t3, k), a.reps)
        t_dense = best_time(lambda: (F.silu(tx @ t1[0].T) * (tx @ t3[0].T)) @ t2[0].T, a.reps)
        y_ref = torch_moe(tx, tr, t1, t2, t3, k).numpy()
    y, _ = attn.moe_feed_forward(x, router, w1, w2, w3, top_k=k, threads=a.threads)
    err = float(np.abs(y - y_ref).max() / np.abs(y_ref).max())
    flops = 2 * 3 * d * F_ * n * k  # the experts' products (the router's 2 n d E is left out)
    roof = sgemm_gflops(a.threads)
    print(f"MoE feed-forward: {E} experts, top-{k}, d {d}, d_ff {F_}, {n} tokens, fp32, {a.threads} threads; "
          f"attn isa {attn.active_isa()}, torch {torch.__version__}")
    print(f"  {'':34} {'ms':>9} {'GFLOP/s':>9}")
    print(f"  {'attn MoE':34} {moe * 1e3:9.2f} {flops / moe / 1e9:9.1f}")
    print(f"  {'attn dense SwiGLU x ' + str(k):34} {k * dense * 1e3:9.2f} {flops / (k * dense) / 1e9:9.1f}")
    print(f"  {'torch MoE (gather loop)':34} {t_moe * 1e3:9.2f} {flops / t_moe / 1e9:9.1f}")
    print(f"  {'torch dense SwiGLU x ' + str(k):34} {k * t_dense * 1e3:9.2f} {flops / (k * t_dense) / 1e9:9.1f}")
    print(f"  torch sgemm (2048^3, same run): {roof:.1f} GFLOP/s; attn MoE at {flops / moe / 1e9 / roof:.2f} of it")
    print(f"ratios: attn MoE / {k} attn dense = {moe / (k * dense):.2f} (target <= 1.3); "
          f"torch MoE / attn MoE = {t_moe / moe:.2f} (> 1: attn faster); max rel. diff vs torch {err:.1e}")


if __name__ == "__main__":
    main()
