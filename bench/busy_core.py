#!/usr/bin/env python3
"""Rates on a machine shared with other work: each measurement runs quiet, then beside a
CPU-bound process pinned to CPU 0 (another program busy on one core), and the ratio busy/quiet is
printed beside the peers' under the same load. Every engine runs with its default thread count:
the CPUs this process may use (attn; affinity and cgroup quota), the core count (llama.cpp's
n_threads, torch's intra-op threads).

    python bench/busy_core.py                                  # SmolLM2 (attn, llama.cpp), exact attention (attn, torch)
    python bench/busy_core.py --engines attn --cli build/release/attn --cli /tmp/old/attn   # attn binaries side by side
    python bench/busy_core.py --json busy.jsonl

SmolLM2-135M (Q4_1): prefill of --prompt tokens and greedy decode of --new tokens, through
bench/llm_peers.py's engines (llama.cpp needs `pip install llama-cpp-python`), or through `attn
generate --model` for each --cli binary (an older build compared with this one). Exact attention:
causal softmax, B = 1, N = 2048, 8 heads of 64, float32, attn.attention vs torch SDPA.
Medians of --reps runs (under load, best-of would report the lucky run). Needs 2 or more CPUs.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
HOG = "import os\nos.sched_setaffinity(0, {0})\nwhile True:\n    pass\n"


@contextlib.contextmanager
def busy_core(on: bool):
    """A CPU-bound process pinned to CPU 0 while the block runs (nothing when `on` is False)."""
    hog = subprocess.Popen([sys.executable, "-c", HOG]) if on else None
    try:
        if hog:
            time.sleep(0.5)  # running before the measurement starts
        yield
    finally:
        if hog:
            hog.kill()
            hog.wait()


def smollm2_engine(engine: str, prompt: int, new: int, reps: int) -> dict:
    """Prefill and decode tok/s of one llm_peers.py engine in its own process (median of reps)."""
    rows = []
    for _ in range(reps):
        p = subprocess.run([sys.executable, os.path.join(HERE, "llm_peers.py"), "--child", engine, "--threads",
                            str(len(os.sched_getaffinity(0))), "--contexts", str(prompt), "--new", str(new),
                            "--reps", "1"], capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"{engine}: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}")
        rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
    return {k: statistics.median(r[k] for r in rows) for k in ("prefill_tok_s", "decode_tok_s")}


def smollm2_cli(cli: str, prompt: int, new: int, reps: int) -> dict:
    """The same through `attn generate --model` of a given attn binary (its printed rates)."""
    import attn
    words = " ".join(["attention"] * prompt)  # ~1 token a word: the prompt's length is what matters
    rows = []
    for _ in range(reps):
        p = subprocess.run([cli, "generate", "--model", attn.smollm2_path(), "--prompt", words, "--max-tokens", str(new)],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"{cli}: {p.stderr.strip()[-300:]}")
        text = p.stdout + p.stderr
        pre = re.search(r"prefill[^\n]*?([\d.]+) tok/s", text)
        dec = re.search(r"decode[^\n]*?([\d.]+) tok/s", text)
        if not (pre and dec):
            raise RuntimeError(f"{cli}: no prefill/decode tok/s in its output:\n{text[-500:]}")
        rows.append({"prefill_tok_s": float(pre.group(1)), "decode_tok_s": float(dec.group(1))})
    return {k: statistics.median(r[k] for r in rows) for k in ("prefill_tok_s", "decode_tok_s")}


def exact_attention(engine: str, reps: int) -> dict:
    """Calls per second of causal softmax attention (B = 1, N = 2048, H = 8, D = 64, float32)."""
    import numpy as np
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2048, 8, 64), dtype=np.float32) for _ in range(3))
    if engine == "attn":
        import attn
        run = lambda: attn.attention(q, k, v, causal=True)  # noqa: E731
    else:
        import torch
        tq, tk, tv = (torch.from_numpy(a).transpose(1, 2) for a in (q, k, v))
        run = lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)  # noqa: E731
    run()
    times = []
    for _ in range(reps * 5):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return {"calls_s": 1.0 / statistics.median(times)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", nargs="+", default=["attn", "llama.cpp", "torch"],
                    choices=["attn", "llama.cpp", "torch"], help="attn and llama.cpp: SmolLM2; attn and torch: exact attention")
    ap.add_argument("--cli", action="append", default=[], help="an attn binary whose `generate --model` is measured too")
    ap.add_argument("--prompt", type=int, default=256, help="prompt tokens (SmolLM2)")
    ap.add_argument("--new", type=int, default=64, help="tokens decoded (SmolLM2)")
    ap.add_argument("--reps", type=int, default=3, help="runs per measurement; the median is reported")
    ap.add_argument("--json", help="append the rows to this JSON-lines file")
    ap.add_argument("--exact-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.exact_child:
        return print(json.dumps(exact_attention(args.exact_child, args.reps)))
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("busy_core.py: needs 2 or more CPUs (one is kept busy)")

    jobs = []  # (what, engine, function returning {figure: rate})
    for e in args.engines:
        if e in ("attn", "llama.cpp"):
            jobs.append(("SmolLM2", e, lambda e=e: smollm2_engine(e, args.prompt, args.new, args.reps)))
    for cli in args.cli:
        jobs.append(("SmolLM2", cli, lambda cli=cli: smollm2_cli(cli, args.prompt, args.new, args.reps)))
    for e in args.engines:
        if e in ("attn", "torch"):
            def exact(e=e):
                p = subprocess.run([sys.executable, __file__, "--exact-child", e, "--reps", str(args.reps)],
                                   capture_output=True, text=True, check=True)
                return json.loads(p.stdout.strip().splitlines()[-1])
            jobs.append(("exact attention", e, exact))

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"CPU: {cpu}, {len(os.sched_getaffinity(0))} usable CPUs; busy = a CPU-bound process pinned to CPU 0")
    print(f"{'what':<16} {'engine':<22} {'figure':<14} {'quiet':>10} {'busy':>10} {'busy/quiet':>10}")
    rows = []
    for what, engine, fn in jobs:
        try:
            with busy_core(False):
                quiet = fn()
            with busy_core(True):
                busy = fn()
        except (RuntimeError, subprocess.CalledProcessError) as e:
            print(f"{what:<16} {engine:<22} failed: {e}")
            continue
        for figure in quiet:
            r = {"what": what, "engine": engine, "figure": figure, "quiet": quiet[figure], "busy": busy[figure],
                 "ratio": busy[figure] / quiet[figure], "cpu": cpu}
            rows.append(r)
            print(f"{what:<16} {engine:<22} {figure:<14} {r['quiet']:>10.1f} {r['busy']:>10.1f} {r['ratio']:>10.2f}",
                  flush=True)
    if args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
