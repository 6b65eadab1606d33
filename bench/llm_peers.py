#!/usr/bin/env python3
"""A model's GGUF file (SmolLM2-135M, or --model gemma3-270m) through several engines, same prompt, same thread count:
attn (decode with 8-bit activations on matrices packed at load in 16-row groups, "attn"; the same
on the file's blocks read in place, "attn-inplace"; float activations on blocks in place, "attn-f32";
"attn-kv16": a float16 KV cache; "attn-kv8": an int8 one, a scale per row), llama.cpp (llama-cpp-python, the same file, its default f16 KV cache) and
transformers (the file dequantized to float32, eager PyTorch). Prefill of a prompt of each
--contexts length, then decode of 128 tokens (greedy) after it, peak RSS. Each engine runs in its
own process so its RSS is its own. Beside each decode figure: the bandwidth bound, the bytes a
token must read (every matrix once, the output projection included, plus the KV cache of the
context) divided by the read bandwidth measured in the same run.

    python bench/llm_peers.py --threads 2                 # all engines, 3 runs each, best of runs
    python bench/llm_peers.py --model gemma3-270m --engines attn llama.cpp --contexts 512 8192
    python bench/llm_peers.py --engines attn llama.cpp --threads 1 2 --contexts 512 4096 8192 --json llm.jsonl
    python bench/llm_peers.py --agreement 512         # logits vs llama.cpp (argmax agreement, max |diff|)
    python bench/llm_peers.py --cache-perplexity 8192 # perplexity of 8192 tokens with f32/f16/bf16/int8 caches

Setup (not part of the test command: llama-cpp-python compiles llama.cpp, ~6 minutes):
    .venv/bin/pip install llama-cpp-python
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time


# What a decode step reads of the KV cache, per model: layers (each: kv heads, head dim, and the
# rows a local layer keeps at most: its window), from the files' metadata.
MODELS = {
    "smollm2": {"layers": [None] * 30, "kv_heads": 3, "head_dim": 64},
    "gemma3-270m": {"layers": ([512] * 5 + [None]) * 3, "kv_heads": 1, "head_dim": 256},
}
MODEL = "smollm2"  # --model


def model_path() -> str:
    import attn
    return attn.model_path(MODEL)


def prompt_ids(n: int) -> list:
    """n token ids of real English text (pydoc's topics), by attn's tokenizer (identical to HF's)."""
    import pydoc_data.topics
    import attn
    topics = pydoc_data.topics.topics
    text = "\n".join(topics[k] for k in sorted(topics))
    tok = attn.Tokenizer.from_gguf(model_path())
    return ([tok.bos_id] if tok.add_bos else []) + tok.encode(text, special=False)[:n - int(tok.add_bos)]


def read_bandwidth_gbs(threads: int, mib: int = 1024, reps: int = 5) -> float:
    """Best-of-reps streaming read bandwidth: `threads` threads each summing its part of a buffer
    much larger than the caches (numpy's reduction releases the GIL)."""
    import threading
    import numpy as np
    a = np.ones(mib * 2**20 // 8)
    parts = np.array_split(a, threads)
    best = 0.0
    for _ in range(reps):
        ts = [threading.Thread(target=np.add.reduce, args=(p,)) for p in parts]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        best = max(best, a.nbytes / (time.perf_counter() - t0) / 1e9)
    return best


def bytes_per_token(engine: str, context: int) -> float:
    """What one decode step must read: every matrix of the file once (the token embedding's one
    row aside: the tied output projection reads it all), and K and V of `context` positions in
    each layer (a local layer: at most its window) (attn: float32, llama.cpp: float16, attn-kv8:
    int8 + a float32 scale per row)."""
    m = MODELS[MODEL]
    hd = m["head_dim"]
    weights = os.path.getsize(model_path())  # matrices are nearly all of the file
    row = {"llama.cpp": hd * 2, "attn-kv16": hd * 2, "attn-kv8": hd + 4}.get(engine, hd * 4)  # bytes per row
    rows = sum(context if w is None else min(context, w) for w in m["layers"])
    return weights + 2 * m["kv_heads"] * row * rows


EXTRA = {}  # engine-specific figures of the child's run, added to its JSON row


def run_attn(path, ids, new, threads, reps, activations="auto", cache_dtype="f32", repack=True):
    from attn import _attn
    d = _attn.Decoder.from_gguf(path, threads, False, len(ids) + new + 8, activations, cache_dtype, repack)
    best_p = best_d = float("inf")
    for _ in range(reps):
        d.reset()
        t0 = time.perf_counter()
        logits = d.forward(ids, 0, False)
        t1 = time.perf_counter()
        tok = int(logits[-1].argmax())
        regions = _attn.parallel_regions()
        for _ in range(new):
            logits = d.forward([tok], d.position, False)
            tok = int(logits[-1].argmax())
        t2 = time.perf_counter()
        # parallel regions (each ending in a barrier) per decoded token
        EXTRA["regions_per_token"] = (_attn.parallel_regions() - regions) / new
        best_p, best_d = min(best_p, t1 - t0), min(best_d, t2 - t1)
    return best_p, best_d


def run_llama_cpp(path, ids, new, threads, reps):
    from llama_cpp import Llama
    m = Llama(model_path=path, n_ctx=len(ids) + new + 8, n_threads=threads, n_threads_batch=threads, n_batch=512,
              verbose=False, logits_all=False)
    best_p = best_d = float("inf")
    for _ in range(reps):
        m.reset()
        t0 = time.perf_counter()
        m.eval(ids)
        t1 = time.perf_counter()
        for _ in range(new):
            tok = int(m.sample(temp=0.0))
            m.eval([tok])
        t2 = time.perf_counter()
        best_p, best_d = min(best_p, t1 - t0), min(best_d, t2 - t1)
    return best_p, best_d


def run_transformers(path, ids, new, threads, reps):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(threads)
    m = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32)
    m.eval()
    x = torch.tensor([ids])
    best_p = best_d = float("inf")
    with torch.no_grad():
        for _ in range(reps):
            t0 = time.perf_counter()
            out = m(x, use_cache=True)
            t1 = time.perf_counter()
            past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
            for _ in range(new):
                out = m(tok, past_key_values=past, use_cache=True)
                past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
            t2 = time.perf_counter()
            best_p, best_d = min(best_p, t1 - t0), min(best_d, t2 - t1)
    return best_p, best_d


def agreement(n: int, threads: int) -> dict:
    """Logits on n tokens of real text from: attn's float path (Q4_1 as stored, float activations:
    the prefill's, equal to the file dequantized to float32), attn's decode steps with 8-bit
    activations (token by token, as generation runs them), and llama.cpp on the same file (which
    rounds activations to 8 bits before its quantized products). Each against the float path:
    largest logit difference, argmax agreement, perplexity of the text."""
    import numpy as np
    from attn import _attn
    from llama_cpp import Llama
    import attn
    path, ids = model_path(), prompt_ids(n)
    f32 = _attn.Decoder.from_gguf(path, threads, False, n + 8, "f32").forward(ids, 0, True)
    d = _attn.Decoder.from_gguf(path, threads, False, n + 8, "q8")
    q8 = np.stack([d.forward([t], i, False)[-1] for i, t in enumerate(ids)])
    m = Llama(model_path=path, n_ctx=n + 8, n_threads=threads, n_batch=512, logits_all=True, verbose=False)
    m.eval(ids)
    llama = np.asarray(m.scores[:n], dtype=np.float32)

    def perplexity(z):
        z = z[:-1].astype(np.float64)
        lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
        return float(np.exp(np.mean(lse - z[np.arange(len(z)), ids[1:]])))

    out = {"tokens": n, "logit_range": float(np.abs(f32).max()), "perplexity_f32": perplexity(f32)}
    for name, z in (("attn_q8", q8), ("llama_cpp", llama)):
        out[name] = {"max_abs_diff_vs_f32": float(np.abs(z - f32).max()),
                     "argmax_agree_vs_f32": float((z.argmax(-1) == f32.argmax(-1)).mean()),
                     "perplexity": perplexity(z)}
    out["argmax_agree_attn_q8_vs_llama_cpp"] = float((q8.argmax(-1) == llama.argmax(-1)).mean())
    return out


def cache_perplexity(n: int, threads: int) -> dict:
    """Perplexity of n tokens of real text with each KV cache storage (8-bit activations, the
    decode path's products; the prompt runs in chunks whose attention reads the cache as stored,
    so every query meets the rounded keys and values of every earlier token)."""
    import numpy as np
    from attn import _attn
    import attn
    path, ids = model_path(), prompt_ids(n)
    target = np.asarray(ids[1:])
    out = {"tokens": len(ids)}
    for cd in ("f32", "f16", "bf16", "int8"):
        z = np.asarray(_attn.Decoder.from_gguf(path, threads, False, len(ids) + 8, "q8", cd).forward(ids, 0, True))
        nll = 0.0
        for i0 in range(0, len(ids) - 1, 512):  # in slices: a float64 copy of 8k x 49152 would be 3 GB
            s = z[i0:min(i0 + 512, len(ids) - 1)].astype(np.float64)
            mx = s.max(-1, keepdims=True)
            lse = np.log(np.exp(s - mx).sum(-1)) + mx[:, 0]
            nll += float((lse - s[np.arange(len(s)), target[i0:i0 + len(s)]]).sum())
        out[cd] = float(np.exp(nll / (len(ids) - 1)))
        print(f"cache {cd:>4}: perplexity {out[cd]:.4f} ({100 * (out[cd] / out['f32'] - 1):+.3f} % vs f32)", flush=True)
    return out


ENGINES = {"attn": run_attn, "attn-inplace": lambda *a: run_attn(*a, repack=False),
           "attn-f32": lambda *a: run_attn(*a, activations="f32"),
           "attn-kv16": lambda *a: run_attn(*a, cache_dtype="f16"),
           "attn-kv8": lambda *a: run_attn(*a, cache_dtype="int8"), "llama.cpp": run_llama_cpp,
           "transformers": run_transformers}


def child(args):
    import attn
    path = model_path()
    ids = prompt_ids(args.contexts[0])
    p, d = ENGINES[args.child](path, ids, args.new, args.threads[0], args.reps)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"engine": args.child, "threads": args.threads[0], "context": len(ids), "prefill_tok_s": len(ids) / p,
                      "decode_tok_s": args.new / d, "peak_rss_mib": rss / 2**20,
                      "file_mib": os.path.getsize(path) / 2**20, **EXTRA}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", choices=list(MODELS), help="the model package's name")
    ap.add_argument("--engines", nargs="+", default=list(ENGINES), choices=list(ENGINES))
    ap.add_argument("--threads", type=int, nargs="+", default=[2])
    ap.add_argument("--contexts", type=int, nargs="+", default=[512],
                    help="prompt tokens (prefill), then decode after them: one row per length")
    ap.add_argument("--new", type=int, default=128, help="tokens decoded greedily")
    ap.add_argument("--reps", type=int, default=3, help="runs per engine; the best is reported")
    ap.add_argument("--json", help="append the rows to this JSON-lines file")
    ap.add_argument("--agreement", type=int, metavar="N", help="compare logits with llama.cpp on N tokens instead")
    ap.add_argument("--cache-perplexity", type=int, metavar="N",
                    help="perplexity of N tokens with float32, float16, bfloat16 and int8 KV caches instead")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--bandwidth", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    global MODEL
    MODEL = args.model
    if args.bandwidth:
        return print(read_bandwidth_gbs(args.bandwidth))
    if args.child:
        return child(args)
    if args.cache_perplexity:
        print(json.dumps(cache_perplexity(args.cache_perplexity, args.threads[0]), indent=1))
        return
    if args.agreement:
        print(json.dumps(agreement(args.agreement, args.threads[0]), indent=1))
        return
    print(f"{os.path.basename(model_path())}: prefill a prompt, decode {args.new} after it, best of {args.reps}")
    print(f"{'engine':<13} {'threads':>7} {'context':>7} {'prefill tok/s':>14} {'decode tok/s':>13} {'bound tok/s':>12} "
          f"{'of bound':>8} {'read GB/s':>9} {'peak RSS MiB':>13}")
    rows = []
    for t in args.threads:
        for c in args.contexts:
            for e in args.engines:
                # the machine's bandwidth can move between minutes: each row its own, in a process of its
                # own (a child forked from a parent that held the buffer would report its peak RSS)
                bw = float(subprocess.run([sys.executable, __file__, "--bandwidth", str(t)], capture_output=True,
                                          text=True, check=True).stdout)
                p = subprocess.run([sys.executable, __file__, "--model", MODEL, "--child", e, "--threads", str(t),
                                    "--contexts", str(c),
                                    "--new", str(args.new), "--reps", str(args.reps)], capture_output=True, text=True)
                if p.returncode != 0:
                    err = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode
                    print(f"{e:<13} {t:>7} {c:>7}  failed: {err}")
                    continue
                r = json.loads(p.stdout.strip().splitlines()[-1])
                r["read_gbs"] = bw
                r["bound_tok_s"] = bw * 1e9 / bytes_per_token(e, c + args.new // 2)
                r["of_bound"] = r["decode_tok_s"] / r["bound_tok_s"]
                rows.append(r)
                print(f"{e:<13} {t:>7} {c:>7} {r['prefill_tok_s']:>14.1f} {r['decode_tok_s']:>13.1f} "
                      f"{r['bound_tok_s']:>12.1f} {r['of_bound']:>8.2f} {bw:>9.1f} {r['peak_rss_mib']:>13.1f}", flush=True)
    if rows:
        print(f"(file {rows[0]['file_mib']:.1f} MiB; KV caches: attn float32, attn-kv16 and llama.cpp float16, "
              f"attn-kv8 int8 + a scale per row)")
    if args.json:
        with open(args.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
