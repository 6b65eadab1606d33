#!/usr/bin/env python3
"""attn.attention vs torch.nn.functional.scaled_dot_product_attention on the CPU, same inputs,
same thread count, in one run. Prints time per call and the speed ratio (torch time / attn time,
> 1 means attn is faster) for every case, plus torch's own sgemm as a same-run roofline.

    python bench/peers.py                          # the issue's 32 cases (a few minutes)
    python bench/peers.py --sizes 1024 --json peers.jsonl
    python bench/peers.py --sparse --sizes 16384 --dims 64 --dtypes f32   # patterns vs FlexAttention
    python bench/peers.py --linear --sizes 4096 16384 --dims 128 --dtypes f32  # chunked linear vs a torch loop
    python bench/peers.py --kvcache --heads 32 --kv-heads 8 --dims 128 --threads 1 2  # KV-cache decode, paged too
    python bench/peers.py --backward --sizes 4096 --dims 128 --dtypes f32 --threads 2  # training: vs SDPA's backward,
                                                                    # and the linear chunk loop in torch autograd
    python bench/peers.py --model-level            # the three model-level ratios: adaptive/hierarchical softmax,
                                                   # Titans vs sgemm, MoE vs two dense feed-forwards
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
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


class ReadRoofline:
    """torch summing a buffer far larger than the last-level cache, one timed sum at a time, so
    that each timing of a kernel can be paired with a roofline sample taken just before it (this
    VM's read bandwidth moves between ~31 and ~65 GB/s on two threads, sometimes within a
    minute). Random values, so that nothing about the data (pages of one constant) can make the
    sum cheaper than a read of it."""

    def __init__(self, threads: int, nbytes: int = 1 << 30):
        torch.set_num_threads(threads)
        self.x = torch.rand(nbytes // 4, generator=torch.Generator().manual_seed(0))
        self.x.sum()
        self.nbytes = nbytes

    def sample(self, sums: int = 3) -> float:
        """GB/s of the best of a few sums (as the kernels' times are a best of a few calls)."""
        return self.nbytes / best_time(self.x.sum, sums - 1) / 1e9


def paired_ratios(fn, nbytes: int, roof: ReadRoofline, rounds: int, calls: int):
    """Rounds of (one roofline sample, then the best of `calls` calls of fn, which reads nbytes):
    returns fn's best time and, per round, fn's GB/s over the roofline sample just before it."""
    fn()
    best, ratios = float("inf"), []
    for _ in range(rounds):
        rf = roof.sample()
        sec = best_time(fn, calls)
        best = min(best, sec)
        ratios.append(nbytes / sec / 1e9 / rf)
    return best, sorted(ratios)


def kvcache(args, out) -> int:
    """The issue's decode case: one token per head against a cache of M keys through
    flash_attn_with_kvcache (contiguous, and paged with two block sizes) and torch SDPA, in GB/s of
    K+V read and as a ratio to the read bandwidth measured here. Several caches are cycled so
    each call reads from memory, not the last-level cache."""
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    h, hkv, d = args.heads, args.kv_heads, args.dims[0]
    print(f"torch {torch.__version__}, attn isa {attn.active_isa()}; B=1, H={h}, Hkv={hkv}, d={d}, one new token")
    print("ratio: GB/s over the read roofline sampled just before, per round (8 rounds): median [min, max];")
    print("roof: the median roofline sample")
    print(f"{'M':>6} {'dtype':>5} {'T':>2} {'roof GB/s':>9} {'form':>14} {'ms':>8} {'GB/s':>6} {'ratio':>6} "
          f"{'range':>13} {'vs torch':>8}")
    rounds = 8
    for m in args.kvcache:
        for dt in args.dtypes:
            for t in args.threads:
                roof = ReadRoofline(t)
                torch.set_num_threads(t)
                g = torch.Generator().manual_seed(0)
                nbytes = 2 * hkv * m * d * torch.tensor([], dtype=dtypes[dt]).element_size()
                copies = max(2, -(-(768 << 20) // nbytes))  # >= 768 MiB in all: far past any LLC here
                q = torch.randn(1, 1, h, d, generator=g).to(dtypes[dt])
                caches = [(torch.randn(1, m, hkv, d, generator=g).to(dtypes[dt]),
                           torch.randn(1, m, hkv, d, generator=g).to(dtypes[dt])) for _ in range(copies)]
                cycle = {"i": 0}

                def nxt():
                    cycle["i"] = (cycle["i"] + 1) % copies
                    return caches[cycle["i"]]

                def contiguous():
                    kc, vc = nxt()
                    attn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=m, threads=t)

                def paged_of(page):
                    table = torch.randperm(m // page, generator=g).to(torch.int32)[None]
                    pools = [(kc.reshape(m // page, page, hkv, d), vc.reshape(m // page, page, hkv, d))
                             for kc, vc in caches]

                    def run():
                        cycle["i"] = (cycle["i"] + 1) % copies
                        kp, vp = pools[cycle["i"]]
                        attn.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=m, block_table=table, threads=t)
                    return run

                qt = q.transpose(1, 2)

                def sdpa():
                    kc, vc = nxt()
                    F.scaled_dot_product_attention(qt, kc.transpose(1, 2), vc.transpose(1, 2), enable_gqa=hkv != h)

                calls = max(3, args.reps * 5 // rounds)
                forms = {"contiguous": contiguous, "paged 256": paged_of(256), "paged 16": paged_of(16),
                         "torch sdpa": sdpa}
                timed = {form: paired_ratios(fn, nbytes, roof, rounds, calls) for form, fn in forms.items()}
                samples = sorted(roof.sample() for _ in range(5))
                for form, (sec, ratios) in timed.items():
                    gbs = nbytes / sec / 1e9
                    ratio = statistics.median(ratios)
                    row = dict(kv_len=m, heads=h, kv_heads=hkv, head_dim=d, dtype=dt, threads=t, form=form,
                               seconds=sec, gbs=gbs, ratio=ratio, ratio_min=ratios[0], ratio_max=ratios[-1],
                               read_gbs=statistics.median(samples),
                               speedup_vs_torch=timed["torch sdpa"][0] / sec)
                    print(f"{m:>6} {dt:>5} {t:>2} {row['read_gbs']:>9.1f} {form:>14} {sec*1e3:>8.3f} {gbs:>6.1f} "
                          f"{ratio:>6.3f} [{ratios[0]:.2f}, {ratios[-1]:.2f}] {row['speedup_vs_torch']:>7.2f}x",
                          flush=True)
                    if out:
                        out.write(json.dumps(row) + "\n")
    return 0


# Sparse patterns: attn's text form and the same pattern as a FlexAttention mask_mod, written the
# way a FlexAttention user writes it (BigBird's random blocks through a block table taken from
# attn.mask_of, so both run the same pattern). Checked equal to attn.mask_of before timing.
def flex_patterns(n: int):
    import numpy as np
    bb_text = "bigbird:block=64,window=3,global=2,random=3,seed=7"
    bb = attn.mask_of(bb_text, n)
    table = torch.from_numpy(np.ascontiguousarray(bb[::64, ::64]))
    return [
        ("softmax:causal,window=256:0", lambda b, h, i, j: (j <= i) & (i - j <= 256)),
        ("softmax:causal,window=256:0,sinks=4", lambda b, h, i, j: (j <= i) & ((i - j <= 256) | (j < 4))),
        ("longformer:window=128:128,global=0;17;33",
         lambda b, h, i, j: ((i - j).abs() <= 128) | (i == 0) | (i == 17) | (i == 33) | (j == 0) | (j == 17) | (j == 33)),
        (bb_text, lambda b, h, i, j: table[i // 64, j // 64]),
        ("softmax:chunk=512", lambda b, h, i, j: i // 512 == j // 512),
    ]


def sparse(args, out) -> int:
    """Each pattern: attn.attend with its text form vs FlexAttention (torch.compile'd, block size 64,
    compile time reported apart) and vs SDPA with the dense boolean mask. GFLOP/s count the visible
    (query, key) pairs only (4 d per pair)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    for t in args.threads:
        roof = sgemm_gflops(t)
        print(f"torch {torch.__version__}, attn isa {attn.active_isa()}; {t} threads; torch sgemm n=2048 "
              f"{roof:.0f} GFLOP/s")
        print(f"{'N':>6} {'d':>4} {'dtype':>5} {'pattern':<52} {'attn ms':>8} {'flex ms':>8} {'sdpa ms':>9} "
              f"{'attn/sg':>7} {'flex/sg':>7} {'vs flex':>7} {'vs sdpa':>8} {'compile s':>9}")
        for n in args.sizes:
            for text, mod in flex_patterns(n):
                dense = attn.mask_of(text, n)
                rows = min(n, 1024)  # the mask_mod is the same pattern (first rows, all keys)
                same = mod(0, 0, torch.arange(rows)[:, None], torch.arange(n)[None, :]).numpy() == dense[:rows]
                assert same.all(), f"FlexAttention mask_mod differs from {text}"
                for d in args.dims:
                    for dt in args.dtypes:
                        torch.set_num_threads(t)
                        g = torch.Generator().manual_seed(0)
                        q, k, v = (torch.randn(1, args.heads, n, d, generator=g).to(dtypes[dt]) for _ in range(3))
                        # A fresh compile per pattern: each new mask_mod recompiles, and past
                        # dynamo's recompile limit flex_attention silently runs unfused (seconds).
                        torch._dynamo.reset()
                        flex = torch.compile(flex_attention)
                        t0 = time.perf_counter()
                        bm = create_block_mask(mod, 1, 1, n, n, device="cpu", BLOCK_SIZE=64)
                        theirs_out = flex(q, k, v, block_mask=bm)
                        compile_s = time.perf_counter() - t0
                        ours = best_time(lambda: attn.attend(q, k, v, text, layout="bhnd", threads=t), args.reps)
                        theirs = best_time(lambda: flex(q, k, v, block_mask=bm), args.reps)
                        err = (attn.attend(q, k, v, text, layout="bhnd").float() - theirs_out.float()).abs().max()
                        mask = torch.from_numpy(dense)
                        sdpa = (best_time(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), 1)
                                if n <= 8192 else float("nan"))  # the dense mask alone is N^2 bytes
                        flops = 4.0 * args.heads * float(dense.sum()) * d
                        row = dict(q_len=n, head_dim=d, heads=args.heads, dtype=dt, threads=t, mechanism=text,
                                   attn_seconds=ours, flex_seconds=theirs, sdpa_dense_seconds=sdpa,
                                   flex_compile_seconds=compile_s, attn_ratio=flops / ours / 1e9 / roof,
                                   flex_ratio=flops / theirs / 1e9 / roof, vs_flex=theirs / ours, vs_sdpa=sdpa / ours,
                                   max_abs_diff_vs_flex=float(err), torch_sgemm_gflops=roof)
                        print(f"{n:>6} {d:>4} {dt:>5} {text:<52} {ours*1e3:>8.2f} {theirs*1e3:>8.2f} "
                              f"{sdpa*1e3:>9.1f} {row['attn_ratio']:>7.3f} {row['flex_ratio']:>7.3f} "
                              f"{row['vs_flex']:>6.2f}x {row['vs_sdpa']:>7.1f}x {compile_s:>9.1f}", flush=True)
                        if out:
                            out.write(json.dumps(row) + "\n")
    return 0


def torch_chunked_linear(q, k, v, chunk: int, normalize: bool):
    """The chunked causal form written in PyTorch the way a user would (fla's naive chunk loop):
    per block the masked left product inside it, the running state for the blocks before.
    q and k are feature-mapped already; (B, H, N, d)."""
    b, h, n, d = q.shape
    state = q.new_zeros(b, h, d, v.shape[-1])
    z = q.new_zeros(b, h, d, 1)
    tril = torch.ones(chunk, chunk, dtype=q.dtype).tril()
    out = torch.empty(b, h, n, v.shape[-1], dtype=q.dtype)
    for s0 in range(0, n, chunk):
        qc, kc, vc = q[:, :, s0:s0 + chunk], k[:, :, s0:s0 + chunk], v[:, :, s0:s0 + chunk]
        c = qc.shape[2]
        a = (qc @ kc.transpose(-1, -2)) * tril[:c, :c]
        o = qc @ state + a @ vc
        if normalize:
            o = o / (qc @ z + a.sum(-1, keepdim=True))
            z = z + kc.sum(-2).unsqueeze(-1)
        state = state + kc.transpose(-1, -2) @ vc
        out[:, :, s0:s0 + c] = o
    return out


def linear(args, out) -> int:
    """Chunked causal linear attention: attn.linear_attention vs the same chunk loop in PyTorch, on
    the FLOPs the chunked form does, 4 H N d (C + d); then the time per decoded token with a
    recurrent state after 1k and 64k tokens, beside softmax decoding against a KV cache that long."""
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    chunk = args.chunk
    for t in args.threads:
        roof = sgemm_gflops(t)
        print(f"torch {torch.__version__}, attn isa {attn.active_isa()}; {t} threads; torch sgemm n=2048 "
              f"{roof:.0f} GFLOP/s; chunk {chunk}")
        print(f"{'N':>6} {'d':>4} {'dtype':>5} {'map':<9} {'attn ms':>9} {'torch ms':>9} {'attn/sg':>7} {'torch/sg':>8} "
              f"{'speedup':>8} {'max|diff|':>9} {'t(N)/t(N/2)':>11}")
        for d in args.dims:
            for dt in args.dtypes:
                for fmap, normalize in (("identity", False), ("elu", True)):
                    last = None
                    for n in args.sizes:
                        torch.set_num_threads(t)
                        g = torch.Generator().manual_seed(0)
                        q, k, v = (torch.randn(1, args.heads, n, d, generator=g).to(dtypes[dt]) * 0.3 for _ in range(3))
                        call = lambda: attn.linear_attention(q, k, v, feature_map=fmap, normalize=normalize,
                                                             chunk_size=chunk, layout="bhnd", threads=t)[0]
                        phi = (lambda x: F.elu(x) + 1) if fmap == "elu" else (lambda x: x)
                        theirs_fn = lambda: torch_chunked_linear(phi(q), phi(k), v, chunk, normalize)
                        ours = best_time(call, args.reps)
                        theirs = best_time(theirs_fn, args.reps)
                        ref = theirs_fn().float()
                        err = float((call().float() - ref).abs().max() / ref.abs().max())
                        flops = 4.0 * args.heads * n * d * (min(chunk, n) + d)
                        scaling = ours / last[1] if last and n == 2 * last[0] else float("nan")
                        last = (n, ours)
                        row = dict(q_len=n, head_dim=d, heads=args.heads, dtype=dt, threads=t, feature_map=fmap,
                                   normalize=normalize, chunk=chunk, attn_seconds=ours, torch_seconds=theirs,
                                   attn_ratio=flops / ours / 1e9 / roof, torch_ratio=flops / theirs / 1e9 / roof,
                                   speedup=theirs / ours, rel_diff=err, time_ratio_vs_half=scaling,
                                   torch_sgemm_gflops=roof)
                        print(f"{n:>6} {d:>4} {dt:>5} {fmap:<9} {ours*1e3:>9.2f} {theirs*1e3:>9.2f} "
                              f"{row['attn_ratio']:>7.3f} {row['torch_ratio']:>8.3f} {row['speedup']:>7.2f}x "
                              f"{err:>9.1e} {scaling:>11.3f}", flush=True)
                        if out:
                            out.write(json.dumps(row) + "\n")
        # Decoding: one token against a recurrent state vs one query against a KV cache, per step.
        d, h = args.dims[-1], args.heads
        print(f"decode, one token, H={h}, d={d}: {'position':>9} {'linear us':>10} {'softmax us':>11}")
        for pos in (1024, 65536):
            g = torch.Generator().manual_seed(1)
            q, k, v = (torch.randn(1, pos + 1, h, d, generator=g) * 0.3 for _ in range(3))
            _, state = attn.linear_attention(q[:, :pos], k[:, :pos], v[:, :pos], feature_map="identity",
                                             normalize=False, output_final_state=True, threads=t)
            step = lambda: attn.linear_attention(q[:, pos:], k[:, pos:], v[:, pos:], feature_map="identity",
                                                 normalize=False, initial_state=state, output_final_state=True,
                                                 threads=t)
            lin = best_time(step, max(args.reps, 20))
            soft = best_time(lambda: attn.attention(q[:, pos:], k, v, causal=True, threads=t), max(args.reps, 20))
            print(f"{'':>35} {pos:>9} {lin*1e6:>10.1f} {soft*1e6:>11.1f}", flush=True)
            if out:
                out.write(json.dumps(dict(decode_position=pos, heads=h, head_dim=d, threads=t,
                                          linear_seconds=lin, softmax_seconds=soft)) + "\n")
    return 0


# ---- --backward: training, the gradients of q, k and v ------------------------------------------
# FLOPs of a backward: 2.5 x the forward's (recompute q.k, then dO.v, dV, dQ, dK: 10 d per visible
# pair against the forward's 4 d; the count of `attn bench --backward` and flash-attention's
# benchmarks). The linear rows use the same 2.5 x on the chunked form's forward count.
BACKWARD_FLOPS_PER_FORWARD = 2.5


def torch_fwd_bwd(fn, q, k, v, dout):
    """A training step's attention as torch users run it: forward, then backward into .grad."""
    def step():
        for x in (q, k, v):
            x.grad = None
        fn(q, k, v).backward(dout)
    return step


def torch_bwd_alone(fn, q, k, v, dout):
    """The backward alone: autograd.grad on a graph built once and retained."""
    out = fn(q, k, v)
    return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)


def max_rel_diff(ours, theirs) -> float:
    """max |ours - theirs| / max |theirs| over the three gradients."""
    return max(float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))
               for a, b in zip(ours, theirs))


def leaves(g, shape, dtype, count):
    return [torch.randn(*shape, generator=g).to(dtype).requires_grad_() for _ in range(count)]


def backward_softmax(args, out, dtypes) -> None:
    """attn.attend_backward (from attn.attend's out and lse) vs torch SDPA's CPU backward, same
    inputs and dout. Two timings on each side: the backward alone (attn: attend_backward; torch:
    autograd.grad on a retained graph) and a whole step, forward then backward (attn: attend with
    return_lse, then attend_backward; torch: SDPA then .backward). max|diff|: attn's gradients
    against torch's, relative to their largest."""
    masks = ["full", "causal"] + (["window"] if args.window else [])
    for t in args.threads:
        roof = sgemm_gflops(t)
        print(f"torch {torch.__version__}, attn isa {attn.active_isa()}; {t} threads; torch sgemm n=2048 "
              f"{roof:.0f} GFLOP/s; backward FLOPs = {BACKWARD_FLOPS_PER_FORWARD} x the forward's")
        print(f"{'N=M':>6} {'d':>4} {'mask':>6} {'dtype':>5} {'attn bwd ms':>11} {'torch bwd ms':>12} "
              f"{'attn/sg':>7} {'torch/sg':>8} {'bwd speedup':>11} {'attn step ms':>12} {'torch step ms':>13} "
              f"{'step speedup':>12} {'max|diff|':>9}")
        for n in args.sizes:
            for d in args.dims:
                for mask in masks:
                    for dt in args.dtypes:
                        torch.set_num_threads(t)
                        g = torch.Generator().manual_seed(0)
                        q, k, v, dout = leaves(g, (1, args.heads, n, d), dtypes[dt], 4)
                        dout = dout.detach()
                        window = args.window if mask == "window" else 0
                        if window:
                            band = torch.ones(n, n, dtype=torch.bool).tril().triu(-window)  # j in [i - window, i]
                            text = f"softmax:causal,window={window}:0"
                            sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=band)
                            pairs = float(band.sum())
                        else:
                            causal = mask == "causal"
                            text = "softmax:causal" if causal else "softmax"
                            sdpa = lambda q, k, v, c=causal: F.scaled_dot_product_attention(q, k, v, is_causal=c)
                            pairs = n * (n + 1) / 2 if causal else float(n * n)
                        qd, kd, vd = q.detach(), k.detach(), v.detach()
                        o, lse = attn.attend(qd, kd, vd, text, layout="bhnd", return_lse=True, threads=t)
                        ours_bwd = best_time(lambda: attn.attend_backward(dout, qd, kd, vd, o, lse, text, layout="bhnd",
                                                                          threads=t), args.reps)

                        def attn_step():
                            o2, lse2 = attn.attend(qd, kd, vd, text, layout="bhnd", return_lse=True, threads=t)
                            return attn.attend_backward(dout, qd, kd, vd, o2, lse2, text, layout="bhnd", threads=t)
                        ours_step = best_time(attn_step, args.reps)
                        theirs_bwd = best_time(torch_bwd_alone(sdpa, q, k, v, dout), args.reps)
                        theirs_step = best_time(torch_fwd_bwd(sdpa, q, k, v, dout), args.reps)
                        diff = max_rel_diff(attn.attend_backward(dout, qd, kd, vd, o, lse, text, layout="bhnd", threads=t),
                                            torch.autograd.grad(sdpa(q, k, v), (q, k, v), dout))
                        flops = BACKWARD_FLOPS_PER_FORWARD * 4.0 * args.heads * pairs * d
                        row = dict(direction="backward", mechanism=text, q_len=n, kv_len=n, head_dim=d,
                                   heads=args.heads, mask=mask,
                                   window=window, dtype=dt, threads=t, flops=flops, attn_bwd_seconds=ours_bwd,
                                   torch_bwd_seconds=theirs_bwd, attn_step_seconds=ours_step,
                                   torch_step_seconds=theirs_step, attn_ratio=flops / ours_bwd / 1e9 / roof,
                                   torch_ratio=flops / theirs_bwd / 1e9 / roof, speedup=theirs_bwd / ours_bwd,
                                   step_speedup=theirs_step / ours_step, max_rel_diff=diff, torch_sgemm_gflops=roof)
                        label = f"win{window}" if window else ("causal" if mask == "causal" else "-")
                        print(f"{n:>6} {d:>4} {label:>6} {dt:>5} {ours_bwd*1e3:>11.2f} {theirs_bwd*1e3:>12.2f} "
                              f"{row['attn_ratio']:>7.3f} {row['torch_ratio']:>8.3f} {row['speedup']:>10.2f}x "
                              f"{ours_step*1e3:>12.2f} {theirs_step*1e3:>13.2f} {row['step_speedup']:>11.2f}x "
                              f"{diff:>9.1e}", flush=True)
                        if out:
                            out.write(json.dumps(row) + "\n")
                            out.flush()


def attn_linear_mechanism(chunk: int) -> str:
    return f"linear:map=elu,causal,chunk={chunk}"


def attn_linear_backward_refusal(chunk: int):
    """None when attn differentiates causal elu linear attention (through torch autograd of
    attn.linear_attention, as a torch user trains with it), else attn's own reason, asked of a
    tiny call: nothing here decides it from a version or a list."""
    g = torch.Generator().manual_seed(1)
    q, k, v = leaves(g, (1, 1, 8, 4), torch.float32, 3)
    try:
        o, _ = attn.linear_attention(q, k, v, feature_map="elu", causal=True, chunk_size=chunk, layout="bhnd")
        torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
    except (ValueError, RuntimeError, TypeError, NotImplementedError) as e:
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return None


def backward_linear(args, out, dtypes) -> None:
    """Chunked causal linear attention (elu + 1, normalised): attn's backward vs the same chunk
    loop as --linear written in plain torch and differentiated by torch autograd. attn is
    differentiated the way a torch user trains with it (autograd of attn.linear_attention); it
    runs on attn's default thread count (all cores / OMP_NUM_THREADS)."""
    chunk = args.chunk
    refusal = attn_linear_backward_refusal(chunk)
    phi = lambda x: F.elu(x) + 1
    loop = lambda q, k, v: torch_chunked_linear(phi(q), phi(k), v, chunk, True)
    ours_fn = lambda q, k, v: attn.linear_attention(q, k, v, feature_map="elu", causal=True, chunk_size=chunk,
                                                    layout="bhnd")[0]
    omp = os.environ.get("OMP_NUM_THREADS", "").split(",")[0]
    attn_threads = int(omp) if omp.isdigit() and int(omp) > 0 else (os.cpu_count() or 1)
    for t in args.threads:
        roof = sgemm_gflops(t)
        print(f"\nlinear (elu, causal, normalised, chunk {chunk}): torch {torch.__version__}; {t} threads; torch sgemm "
              f"n=2048 {roof:.0f} GFLOP/s; backward FLOPs = {BACKWARD_FLOPS_PER_FORWARD} x the chunked forward's "
              f"4 H N d (C + d)")
        if refusal is not None:
            print(f"attn: linear backward not available in this build ({refusal}); torch's times only")
        elif t != attn_threads:
            print(f"note: attn's autograd path runs on {attn_threads} threads (OMP_NUM_THREADS), torch on {t}")
        print(f"{'N':>6} {'d':>4} {'dtype':>5} {'attn bwd ms':>11} {'torch bwd ms':>12} {'attn/sg':>7} {'torch/sg':>8} "
              f"{'bwd speedup':>11} {'attn step ms':>12} {'torch step ms':>13} {'step speedup':>12} {'max|diff|':>9}")
        for n in args.sizes:
            for d in args.dims:
                for dt in args.dtypes:
                    torch.set_num_threads(t)
                    g = torch.Generator().manual_seed(0)
                    q, k, v, dout = (x * 0.3 for x in leaves(g, (1, args.heads, n, d), dtypes[dt], 4))
                    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
                    dout = dout.detach()
                    flops = BACKWARD_FLOPS_PER_FORWARD * 4.0 * args.heads * n * d * (min(chunk, n) + d)
                    theirs_bwd = best_time(torch_bwd_alone(loop, q, k, v, dout), args.reps)
                    theirs_step = best_time(torch_fwd_bwd(loop, q, k, v, dout), args.reps)
                    row = dict(direction="backward", mechanism=attn_linear_mechanism(chunk), q_len=n, head_dim=d,
                               heads=args.heads, dtype=dt, threads=t, chunk=chunk, flops=flops,
                               torch_bwd_seconds=theirs_bwd, torch_step_seconds=theirs_step,
                               torch_ratio=flops / theirs_bwd / 1e9 / roof, torch_sgemm_gflops=roof)
                    if refusal is None:
                        ours_bwd = best_time(torch_bwd_alone(ours_fn, q, k, v, dout), args.reps)
                        ours_step = best_time(torch_fwd_bwd(ours_fn, q, k, v, dout), args.reps)
                        diff = max_rel_diff(torch.autograd.grad(ours_fn(q, k, v), (q, k, v), dout),
                                            torch.autograd.grad(loop(q, k, v), (q, k, v), dout))
                        row.update(attn_bwd_seconds=ours_bwd, attn_step_seconds=ours_step,
                                   attn_ratio=flops / ours_bwd / 1e9 / roof, speedup=theirs_bwd / ours_bwd,
                                   step_speedup=theirs_step / ours_step, max_rel_diff=diff, attn_threads=attn_threads)
                        print(f"{n:>6} {d:>4} {dt:>5} {ours_bwd*1e3:>11.2f} {theirs_bwd*1e3:>12.2f} "
                              f"{row['attn_ratio']:>7.3f} {row['torch_ratio']:>8.3f} {row['speedup']:>10.2f}x "
                              f"{ours_step*1e3:>12.2f} {theirs_step*1e3:>13.2f} {row['step_speedup']:>11.2f}x "
                              f"{diff:>9.1e}", flush=True)
                    else:
                        row.update(attn_unavailable=refusal)
                        print(f"{n:>6} {d:>4} {dt:>5} {'-':>11} {theirs_bwd*1e3:>12.2f} {'-':>7} "
                              f"{row['torch_ratio']:>8.3f} {'-':>11} {'-':>12} {theirs_step*1e3:>13.2f} {'-':>12} "
                              f"{'-':>9}", flush=True)
                    if out:
                        out.write(json.dumps(row) + "\n")
                        out.flush()


def backward(args, out) -> int:
    """Training: softmax against torch SDPA's CPU backward, then linear attention against the torch
    autograd chunk loop, in one run."""
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    backward_softmax(args, out, dtypes)
    backward_linear(args, out, dtypes)
    return 0


def model_level(args) -> int:
    """The model-level pieces' benchmarks (bench/output_softmax_peers.py, titans_peers.py,
    moe_peers.py), each in its own process on the first --threads count, their output shown, then
    the model-level ratios gathered in one table."""
    import re
    import subprocess
    here = os.path.dirname(os.path.abspath(__file__))
    t = str(args.threads[0])
    runs = {"output softmax": ["output_softmax_peers.py", "--threads", t],
            "titans": ["titans_peers.py", "--threads", t, "--torch-tokens", "0"],
            "moe": ["moe_peers.py", "--threads", t]}
    text = {}
    for name, cmd in runs.items():
        print(f"==== {name}: python bench/{' '.join(cmd)}", flush=True)
        p = subprocess.run([sys.executable, os.path.join(here, cmd[0])] + cmd[1:], capture_output=True, text=True)
        print(p.stdout + p.stderr, flush=True)
        if p.returncode != 0:
            print(f"{name}: exit {p.returncode}", file=sys.stderr)
            return p.returncode
        text[name] = p.stdout

    def grab(name, pattern):
        m = re.search(pattern, text[name], re.M)
        return float(m.group(1)) if m else float("nan")

    rows = [("adaptive log_prob: torch module / attn", grab("output softmax", r"ratio torch / attn = ([\d.]+)x"), ">= 1.5"),
            ("hierarchical vs full softmax: full / hierarchical", grab("output softmax", r"ratio full / hierarchical = ([\d.]+)x"),
             ">= 10"),
            ("Titans linear memory: of same-run sgemm", grab("titans", r"^\s*linear\s+\d+\s+\S+\s+\S+\s+\S+\s+([\d.]+)"),
             ">= 0.4"),
            ("Titans MLP memory: of same-run sgemm", grab("titans", r"^\s*mlp\s+\d+\s+\S+\s+\S+\s+\S+\s+([\d.]+)"), ">= 0.4"),
            ("MoE / two dense SwiGLU feed-forwards (time)", grab("moe", r"attn dense = ([\d.]+)"), "<= 1.3")]
    print(f"the model-level ratios, {t} threads, attn isa {attn.active_isa()}:")
    for what, value, target in rows:
        print(f"  {what:52} {value:8.2f}   target {target}")
        if out := getattr(args, "_out", None):
            out.write(json.dumps(dict(case=what, value=value, target=target, threads=int(t))) + "\n")
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
    ap.add_argument("--kvcache", type=int, nargs="*", default=None, metavar="M",
                    help="instead: flash_attn_with_kvcache decode (contiguous and paged) vs torch SDPA against "
                         "caches of M keys (default 32768), H=--heads, Hkv=--kv-heads, d=--dims[0], caches cycled")
    ap.add_argument("--kv-heads", type=int, default=8, help="kv heads for --kvcache")
    ap.add_argument("--sparse", action="store_true",
                    help="time the sparse patterns against FlexAttention and SDPA with a dense mask")
    ap.add_argument("--linear", action="store_true",
                    help="time chunked causal linear attention against the same chunk loop in PyTorch, its scaling "
                         "in N, and decoding with a recurrent state")
    ap.add_argument("--backward", action="store_true",
                    help="time training's backward: attn.attend_backward vs torch SDPA's CPU backward (the backward "
                         "alone, autograd.grad on a retained graph, and a forward + backward step), then causal elu "
                         "linear attention's backward vs the --linear chunk loop in torch autograd; ratios on 2.5 x "
                         "the forward's FLOPs; --window adds a causal band (torch: SDPA with the band mask)")
    ap.add_argument("--chunk", type=int, default=64, help="chunk size for --linear and --backward's linear rows")
    ap.add_argument("--model-level", action="store_true",
                    help="the three model-level ratios (output softmaxes, Titans, MoE), each benchmark in its own process")
    ap.add_argument("--json", help="write one JSON object per case to this file")
    args = ap.parse_args(argv)
    dtypes = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
    out = open(args.json, "w") if args.json else None
    if args.decode is not None:
        return decode(args, out)
    if args.kvcache is not None:
        args.kvcache = args.kvcache or [32768]
        return kvcache(args, out)
    if args.sparse:
        return sparse(args, out)
    if args.linear:
        return linear(args, out)
    if args.backward:
        return backward(args, out)
    if args.model_level:
        args._out = out
        return model_level(args)
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
