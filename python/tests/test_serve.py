"""attn serve: the OpenAI-compatible HTTP server (docs/serve.md), run as users run it. A server on a
free loopback port with the real SmolLM2-135M answers the official `openai` client; its replies
are checked against `attn generate` and against themselves run alone, streamed and not; every
error status is provoked; a client that hangs up must free its KV blocks; /metrics must parse;
the chat page must work in a real headless Chromium (Selenium + Debian's chromium-driver).
Tests that need no real model use the tiny random one (tiny_text_model.py). No sleep is an
assertion: waits poll with deadlines."""
import http.client
import json
import math
import os
import re
import signal
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

import attn
from conftest import HANG_SECONDS, cli_path
from tiny_text_model import write_tiny_text_model

START_SECONDS = 120  # loading, not a speed limit: far above SmolLM2's load on a busy 2-core machine
PROMPT = "Once upon a time"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`attn serve` on a free loopback port; stderr (one line per request) goes to a file."""

    def __init__(self, model, tmp: Path, *args):
        self.model = model
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / f"serve-{self.port}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([str(cli_path()), "serve", "--model", str(model), "--port", str(self.port), *args],
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + START_SECONDS
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"attn serve exited with {self.proc.returncode}: {self.stderr()}", pytrace=False)
            try:
                status, _, _ = self.request("GET", "/health")
                if status == 200:
                    break
                assert status == 503, status  # loading
            except OSError:
                pass  # not listening yet
            assert time.monotonic() < deadline, f"/health never said ok: {self.stderr()}"
            time.sleep(0.05)

    def stderr(self) -> str:
        self.log.flush()
        return self.log_path.read_text()[-4000:]

    def request(self, method, path, body=None, headers=None, timeout=HANG_SECONDS):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
            c.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
            r = c.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            c.close()

    def json(self, method, path, body=None, headers=None):
        status, hdrs, data = self.request(method, path, body, headers)
        return status, hdrs, json.loads(data)

    def metrics(self) -> dict:
        status, _, data = self.request("GET", "/metrics")
        assert status == 200
        return parse_metrics(data.decode())

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0, **kw)

    def stop(self, expect=0, signal_it=True):
        if signal_it and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=HANG_SECONDS)
        finally:
            self.log.close()
        assert rc == expect, f"attn serve exited with {rc} after SIGTERM: {self.log_path.read_text()[-4000:]}"


def parse_metrics(text: str) -> dict:
    """{name or name{labels}: value}; checks every sample's family has # HELP and # TYPE lines first."""
    out, typed = {}, {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            typed[name] = kind
        elif line.startswith("# HELP ") or not line:
            continue
        else:
            m = re.fullmatch(r'([a-z_]+)(\{[^}]*\})? (\S+)', line)
            assert m, f"not a Prometheus sample line: {line!r}"
            family = re.sub(r"_(bucket|sum|count)$", "", m[1]) if m[1] not in typed else m[1]
            assert family in typed, f"{m[1]} has no # TYPE line before it"
            out[m[1] + (m[2] or "")] = float(m[3])
    return out


@pytest.fixture(scope="module")
def smollm2():
    return attn.smollm2_path()


@pytest.fixture(scope="module")
def server(smollm2, tmp_path_factory):
    s = Server(smollm2, tmp_path_factory.mktemp("serve"), "--parallel", "16")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write_tiny_text_model(path, context=4096)
    return path


def generate_text(model, prompt, n):
    """What `attn generate` continues `prompt` with (greedy), as it prints it: the prompt, the text, a newline."""
    p = subprocess.run([str(cli_path()), "generate", "--model", str(model), "-p", prompt, "-n", str(n), "--temp", "0", "-q"],
                       capture_output=True, text=True, timeout=HANG_SECONDS)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(prompt) and p.stdout.endswith("\n"), p.stdout
    return p.stdout[len(prompt):-1]


# ---- 1. the openai client: completions and chat, streamed and not --------------------------------

def test_completion_streamed_and_not_equal_attn_generate(server, smollm2):
    client = server.client()
    r = client.completions.create(model="anything", prompt=PROMPT, max_tokens=24, temperature=0)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.model == Path(smollm2).stem  # whatever the request named
    choice = r.choices[0]
    assert choice.index == 0 and choice.finish_reason in ("length", "stop")
    assert r.usage.prompt_tokens == 4 and 0 < r.usage.completion_tokens <= 24
    assert (r.usage.completion_tokens == 24) == (choice.finish_reason == "length")
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    chunks = list(client.completions.create(model="x", prompt=PROMPT, max_tokens=24, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed == choice.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens and not chunks[-1].choices
    assert choice.text == generate_text(smollm2, PROMPT, 24)
    assert len(choice.text) > 20


def test_chat_streamed_and_not(server):
    client = server.client()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    r = client.chat.completions.create(model="m", messages=messages, max_tokens=40, temperature=0)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    msg = r.choices[0].message
    assert msg.role == "assistant" and len(msg.content) > 0 and "<|im_end|>" not in msg.content
    assert r.choices[0].finish_reason in ("stop", "length")
    chunks = list(client.chat.completions.create(model="m", messages=messages, max_completion_tokens=40, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].object == "chat.completion.chunk"
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == r.choices[0].finish_reason
    assert finals[0].choices[0].delta.content is None
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == msg.content
    assert chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens
    assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_ignore_eos_runs_past_the_end_of_the_turn(server):
    client = server.client()
    messages = [{"role": "user", "content": "Say hello."}]
    short = client.chat.completions.create(model="m", messages=messages, max_tokens=200, temperature=0)
    assert short.choices[0].finish_reason == "stop" and short.usage.completion_tokens < 200
    long = client.chat.completions.create(model="m", messages=messages, max_tokens=200, temperature=0,
                                          extra_body={"ignore_eos": True})
    assert long.choices[0].finish_reason == "length" and long.usage.completion_tokens == 200
    assert long.choices[0].message.content.startswith(short.choices[0].message.content)


def test_a_stop_string_cuts_the_text_before_it(server):
    client = server.client()
    full = client.completions.create(model="m", prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
    words = full.split()
    stop = " " + words[3]  # a stop string in the middle of the text
    cut = full[:full.index(stop)]
    for stream in (False, True):
        if stream:
            chunks = list(client.completions.create(model="m", prompt=PROMPT, max_tokens=24, temperature=0,
                                                    stop=[stop, "never appears"], stream=True))
            text = "".join(c.choices[0].text for c in chunks)
            reason = chunks[-1].choices[0].finish_reason
        else:
            r = client.completions.create(model="m", prompt=PROMPT, max_tokens=24, temperature=0, stop=stop)
            text, reason = r.choices[0].text, r.choices[0].finish_reason
        assert (text, reason) == (cut, "stop")
    # a stop string whose start appears but not the rest: held back, then sent; the text is whole
    chunks = list(client.completions.create(model="m", prompt=PROMPT, max_tokens=24, temperature=0,
                                            stop=stop + "\u2603", stream=True))
    assert "".join(c.choices[0].text for c in chunks) == full and chunks[-1].choices[0].finish_reason == "length"


def test_tiny_model_streamed_equals_unstreamed_and_timeout(tiny, tmp_path):
    """The tiny random model writes byte tokens that are no UTF-8 (sent as U+FFFD): pieces still join
    to the unstreamed text. --timeout ends a long request with finish_reason "timeout"."""
    s = Server(tiny, tmp_path, "--timeout", "0.05")
    try:
        client = s.client()
        for seed in range(4):
            kw = dict(model="m", prompt="hello world", max_tokens=200, temperature=1.0, seed=seed)
            whole = client.completions.create(**kw).choices[0]
            chunks = list(client.completions.create(stream=True, **kw))
            assert "".join(c.choices[0].text for c in chunks) == whole.text
            assert chunks[-1].choices[0].finish_reason == whole.finish_reason
        r = client.completions.create(model="m", prompt="hello world", max_tokens=4000, temperature=0)
        assert r.choices[0].finish_reason == "timeout" and 0 < r.usage.completion_tokens < 4000
    finally:
        s.stop()


# ---- 2. batching changes no reply ---------------------------------------------------------------

def test_concurrent_requests_equal_each_run_alone(server):
    client = server.client()
    words = "the cat sat on a mat while the dog watched the birds fly over the old red barn at dawn".split()
    jobs = [dict(prompt=" ".join(words[:3 + i]), max_tokens=6 + i % 5,
                 **({"temperature": 0} if i % 2 == 0 else {"temperature": 0.8, "seed": 100 + i}))
            for i in range(16)]

    def run(job):
        return client.completions.create(model="m", **job).choices[0].text

    alone = [run(j) for j in jobs]
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(run, jobs))
    assert together == alone
    assert len(set(alone)) > 8  # different prompts, different replies: the comparison means something


# ---- 3. echo and logprobs -----------------------------------------------------------------------

def test_echo_with_logprobs(server):
    r = server.client().completions.create(model="m", prompt=PROMPT, max_tokens=6, temperature=0, echo=True, logprobs=3)
    choice = r.choices[0]
    assert choice.text.startswith(PROMPT) and len(choice.text) > len(PROMPT)
    lp = choice.logprobs
    n = r.usage.prompt_tokens + r.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(math.isfinite(x) and x <= 0 for x in lp.token_logprobs[1:])
    assert all(1 <= len(t) <= 3 for t in lp.top_logprobs[1:])
    assert sum(len(t) == 3 for t in lp.top_logprobs[1:]) >= n - 2  # two tokens may decode alike
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert "".join(lp.tokens) == choice.text
    for i in range(1, n):
        best_token, best = max(lp.top_logprobs[i].items(), key=lambda kv: kv[1])
        assert best >= lp.token_logprobs[i] - 1e-5
        if lp.tokens[i] == best_token:  # the chosen token is the argmax: the same number twice
            assert abs(best - lp.token_logprobs[i]) < 1e-5
    for i in range(r.usage.prompt_tokens, n):  # greedy: every generated token is its position's argmax
        assert abs(max(lp.top_logprobs[i].values()) - lp.token_logprobs[i]) < 1e-5
    # streamed: the same text and numbers
    chunks = list(server.client().completions.create(model="m", prompt=PROMPT, max_tokens=6, temperature=0, echo=True,
                                                     logprobs=3, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    streamed = [x for c in chunks if c.choices[0].logprobs for x in c.choices[0].logprobs.token_logprobs]
    assert streamed == lp.token_logprobs
    offsets = [x for c in chunks if c.choices[0].logprobs for x in c.choices[0].logprobs.text_offset]
    assert offsets == lp.text_offset


def test_chat_logprobs(server):
    r = server.client().chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=5,
                                                temperature=0, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert all(len(c.top_logprobs) == 2 and abs(c.top_logprobs[0].logprob - c.logprob) < 1e-5 for c in content)
    assert "".join(c.token for c in content) == r.choices[0].message.content


# ---- 4. errors ----------------------------------------------------------------------------------

BAD_COMPLETIONS = [
    ({"max_tokens": 4}, "prompt"),
    ({"prompt": 17}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": [1, 2, 10 ** 7]}, "prompt"),
    ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "x", "max_tokens": "5"}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 5000}, "max_tokens"),
    ({"prompt": [1] * 4096, "max_tokens": 1}, "prompt"),
    ({"prompt": "x", "temperature": 2.5}, "temperature"),
    ({"prompt": "x", "temperature": -0.1}, "temperature"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "top_p": 1.5}, "top_p"),
    ({"prompt": "x", "logprobs": 6}, "logprobs"),
    ({"prompt": "x", "logprobs": -1}, "logprobs"),
    ({"prompt": "x", "n": 2}, "n"),
    ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"prompt": "x", "stop": 5}, "stop"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": "x", "echo": 1}, "echo"),
    ({"prompt": "x", "seed": 1.5}, "seed"),
]
BAD_CHATS = [
    ({"max_tokens": 4}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -3}, "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 9, "logprobs": True}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 3}, "n"),
]


@pytest.mark.parametrize("path,body,param", [("/v1/completions", b, p) for b, p in BAD_COMPLETIONS] +
                         [("/v1/chat/completions", b, p) for b, p in BAD_CHATS])
def test_a_bad_field_is_a_400_naming_it(server, path, body, param):
    status, _, r = server.json("POST", path, body)
    assert status == 400, r
    e = r["error"]
    assert e["type"] == "invalid_request_error" and e["param"] == param and param in e["message"], e


def test_the_context_error_names_the_numbers(server):
    status, _, r = server.json("POST", "/v1/completions", {"prompt": "hello there", "max_tokens": 4095})
    assert status == 400
    message = r["error"]["message"]
    assert "4096" in message and "4095" in message and "2 tokens" in message, message


def test_bad_json_is_a_400_and_the_client_raises(server):
    for body in (b"{not json", b"[1, 2]", b""):
        status, _, r = server.json("POST", "/v1/completions", body)
        assert status == 400 and r["error"]["type"] == "invalid_request_error", r
    with pytest.raises(openai.BadRequestError) as e:
        server.client().completions.create(model="m", prompt="x", n=2)
    assert e.value.body["param"] == "n"


def test_unknown_paths_are_404_json(server):
    for method, path in (("GET", "/v1/nothing"), ("POST", "/v2/completions"), ("GET", "/v1/completions")):
        status, _, r = server.json(method, path)
        assert status == 404 and "error" in r and path in r["error"]["message"], (method, path, r)


def test_a_body_over_the_limit_is_413(server):
    status, _, r = server.json("POST", "/v1/completions", b"x" * (9 << 20))
    assert status == 413 and r["error"]["code"] == "payload_too_large"
    status, _, _ = server.request("GET", "/health")  # the server goes on
    assert status == 200


def test_api_key(tiny, tmp_path):
    s = Server(tiny, tmp_path, "--api-key", "sesame", "--parallel", "2")
    try:
        body = {"prompt": "hello", "max_tokens": 3}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sesame"}):
            status, hdrs, r = s.json("POST", "/v1/completions", body, headers)
            assert status == 401 and r["error"]["type"] == "authentication_error", (headers, r)
        status, _, _ = s.json("GET", "/v1/models")
        assert status == 401
        with pytest.raises(openai.AuthenticationError):
            s.client(api_key="wrong").completions.create(model="m", prompt="hello", max_tokens=3)
        r = s.client(api_key="sesame").completions.create(model="m", prompt="hello", max_tokens=3, temperature=0)
        assert r.usage.prompt_tokens > 0
        for path in ("/health", "/metrics", "/"):  # open without the key
            assert s.request("GET", path)[0] == 200, path
    finally:
        s.stop()


def test_a_full_queue_is_429_with_retry_after(tiny, tmp_path):
    s = Server(tiny, tmp_path, "--parallel", "1", "--queue", "1")
    try:
        n, tokens = 12, 3000
        barrier = threading.Barrier(n)

        def send(i):  # one prompt whose greedy reply never meets an end token: every reply is `tokens` long
            barrier.wait()
            return s.json("POST", "/v1/completions", {"prompt": "hello world", "max_tokens": tokens, "temperature": 0})

        with ThreadPoolExecutor(n) as pool:
            results = list(pool.map(send, range(n)))
        busy = [r for r in results if r[0] == 429]
        done = [r for r in results if r[0] != 429]
        assert busy and done, [r[0] for r in results]
        assert all(h.get("Retry-After") == "1" and r["error"]["type"] == "rate_limit_error" for _, h, r in busy)
        summary = [(status, r.get("usage"), r.get("choices", [{}])[0].get("finish_reason")) for status, _, r in done]
        assert all(x == (200, {"prompt_tokens": 2, "completion_tokens": tokens, "total_tokens": tokens + 2}, "length")
                   for x in summary), summary
        assert len({r["id"] for _, _, r in done}) == len(done)  # each answered once
        m = s.metrics()
        assert m['attn_requests_total{status="429"}'] == len(busy)
        assert m['attn_requests_total{status="200"}'] >= len(done) + 1  # and /health
        assert m["attn_generated_tokens_total"] == tokens * len(done)  # every admitted one ran once, to the end
    finally:
        s.stop()


def test_sigterm_lets_the_running_request_finish_and_refuses_new_ones(smollm2, tmp_path):
    s = Server(smollm2, tmp_path, "--parallel", "2")
    try:
        sigterm_while_streaming(s)
    finally:
        if s.proc.poll() is None:  # a failure above: no server left behind
            s.proc.kill()
    s.stop(expect=0, signal_it=False)  # (a second signal would end it at once)


def sigterm_while_streaming(s):
    c = http.client.HTTPConnection("127.0.0.1", s.port, timeout=HANG_SECONDS)
    c.request("POST", "/v1/completions", json.dumps({"prompt": PROMPT, "max_tokens": 300, "temperature": 0, "stream": True,
                                                      "stream_options": {"include_usage": True}}),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200
    first = r.readline()
    assert first.startswith(b"data: {")
    s.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    while True:  # new requests: 503 while the running one finishes, then no connection at all
        try:
            status, _, body = s.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2}, timeout=5)
            if status == 503:
                assert json.loads(body)["error"]["type"] == "server_error"
                break
            assert status == 200 and time.monotonic() < deadline  # the signal may not have arrived yet
        except OSError:
            break
    rest = r.read().decode()
    events = [line[6:] for line in (first.decode() + rest).split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-2]["choices"][0]["finish_reason"] in ("length", "stop")  # not "shutdown": it was let finish
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == generate_text(
        s.model, PROMPT, chunks[-1]["usage"]["completion_tokens"])
    c.close()
    s.proc.wait(timeout=HANG_SECONDS)


# ---- 5. a client that hangs up ------------------------------------------------------------------

def wait_idle(server, deadline_s=60):
    deadline = time.monotonic() + deadline_s
    while True:
        m = server.metrics()
        if m["attn_running_sequences"] == 0 and m["attn_kv_blocks_in_use"] == 0 and m["attn_queue_length"] == 0:
            return m
        assert time.monotonic() < deadline, f"still busy after {deadline_s} s: {m}"
        time.sleep(0.05)


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_hangs_up_frees_its_blocks(server, stream):
    before = wait_idle(server)["attn_generated_tokens_total"]
    sock = socket.create_connection(("127.0.0.1", server.port))
    body = json.dumps({"prompt": "List the numbers from 1 to 1000: 1, 2, 3,", "max_tokens": 3000, "temperature": 0,
                       "stream": stream}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    if stream:  # read a few events
        got = b""
        while got.count(b"data: ") < 4:
            got += sock.recv(4096)
    else:  # wait until it runs
        deadline = time.monotonic() + 60
        while server.metrics()["attn_running_sequences"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    sock.close()
    m = wait_idle(server)
    # cancelled, not run to its end (3000 tokens take minutes here)
    assert m["attn_generated_tokens_total"] - before < 2000
    deadline = time.monotonic() + 10
    while "cancelled" not in server.stderr():
        assert time.monotonic() < deadline, server.stderr()
        time.sleep(0.05)


# ---- 6. /metrics, /v1/models, /health -----------------------------------------------------------

METRICS = ["attn_prompt_tokens_total", "attn_generated_tokens_total", "attn_queue_length", "attn_running_sequences",
           "attn_kv_blocks_in_use", "attn_kv_blocks_cached", "attn_kv_blocks_total", "attn_prefix_cache_hits_total"]
HISTOGRAMS = ["attn_time_to_first_token_seconds", "attn_inter_token_latency_seconds"]


def test_metrics_models_health(server, smollm2):
    status, _, r = server.json("GET", "/health")
    assert (status, r) == (200, {"status": "ok"})
    status, _, r = server.json("GET", "/v1/models")
    assert status == 200 and r["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in r["data"]] == [(Path(smollm2).stem, "model", "attn")]
    assert server.client().models.list().data[0].id == Path(smollm2).stem

    before = server.metrics()
    for name in METRICS:
        assert name in before, name
    assert before["attn_kv_blocks_total"] > 0
    server.client().completions.create(model="m", prompt="Hello there, how", max_tokens=5, temperature=0)
    after = server.metrics()
    assert after['attn_requests_total{status="200"}'] >= before['attn_requests_total{status="200"}'] + 1
    assert after["attn_generated_tokens_total"] >= before["attn_generated_tokens_total"] + 5
    assert after["attn_prompt_tokens_total"] >= before["attn_prompt_tokens_total"] + 1
    for h in HISTOGRAMS:
        buckets = [(k, v) for k, v in after.items() if k.startswith(h + "_bucket{")]
        assert buckets[-1][0] == h + '_bucket{le="+Inf"}'
        bounds = [float(re.search(r'le="([^"]+)"', k)[1].replace("+Inf", "inf")) for k, _ in buckets]
        counts = [v for _, v in buckets]
        assert bounds == sorted(bounds) and counts == sorted(counts), buckets  # cumulative
        assert counts[-1] == after[h + "_count"] > 0 and after[h + "_sum"] > 0
        assert after[h + "_count"] > before[h + "_count"]


# ---- 7. the chat page in a real browser ---------------------------------------------------------

def test_chat_page_in_chromium(server, smollm2):
    if not os.path.exists("/usr/bin/chromedriver"):
        pytest.fail("the chat page test needs chromedriver: install the Debian package 'chromium-driver' "
                    "(scripts/install-deps.sh --test does)", pytrace=False)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.get(server.url + "/")
        assert driver.find_element(By.ID, "model").text == Path(smollm2).stem
        driver.find_element(By.ID, "prompt").send_keys("What is the capital of France?")
        driver.find_element(By.ID, "send").click()
        wait = WebDriverWait(driver, 120, poll_frequency=0.1)
        wait.until(lambda d: "tokens/s" in d.find_element(By.ID, "speed").text)
        reply = driver.find_element(By.ID, "reply").text
        assert reply and not reply.startswith("error"), reply
        assert driver.find_element(By.CSS_SELECTOR, "#messages .user").text == "What is the capital of France?"
        assert re.search(r"\d+ tokens in [\d.]+ s: [\d.]+ tokens/s", driver.find_element(By.ID, "speed").text)
        # the same reply as the API gives (the page asks greedy, 512 tokens at most)
        r = server.client().chat.completions.create(
            model="m", messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=512,
            temperature=0)
        assert reply == r.choices[0].message.content.strip()
        severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not severe, severe
    finally:
        driver.quit()
