"""attn serve end to end with the Python standard library only, so that ctest runs it against the
release build and against the ASan/UBSan build (python/tests/test_serve.py checks the API in depth
with the openai client, against the release build): a tiny model (tests/data/tiny_text_model.gguf,
written by python/tests/tiny_text_model.py) served on a free port; a completion streamed and not
(the same text), concurrent requests, a chat, bad requests, a client that hangs up mid-stream (its
blocks come back), and SIGTERM (exit 0, nothing reported by a sanitizer).

usage: serve_smoke.py ATTN_CLI MODEL.gguf"""
import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time

cli, model = sys.argv[1], sys.argv[2]
proc = subprocess.Popen([cli, "serve", "--model", model, "--port", "0", "--parallel", "4", "--ctx-size", "128",
                         "--kv-memory", "4", "--timeout", "60"], stderr=subprocess.PIPE, text=True)
log = []


def fail(message):
    proc.kill()
    rest = proc.stderr.read() if proc.stderr else ""
    sys.exit(f"serve_smoke: {message}\n--- server log ---\n" + "".join(log) + rest)


port = None
deadline = time.time() + 120
while port is None and time.time() < deadline:
    line = proc.stderr.readline()
    if not line:
        fail("the server ended before listening")
    log.append(line)
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", line)
    if m:
        port = int(m.group(1))
if port is None:
    fail("no 'listening on' line")
threading.Thread(target=lambda: [log.append(l) for l in proc.stderr], daemon=True).start()


def request(method, path, body=None, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request(method, path, body=json.dumps(body) if isinstance(body, dict) else body,
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read().decode()
    c.close()
    return r.status, data


def metrics():
    status, text = request("GET", "/metrics")
    if status != 200:
        fail(f"/metrics answered {status}")
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(attn_[a-z_]+) ([0-9.e+-]+)$", text, re.M)}


while time.time() < deadline:
    try:
        if request("GET", "/health")[0] == 200:
            break
    except OSError:
        pass
    time.sleep(0.05)
else:
    fail("/health never answered 200")

body = {"prompt": "hello there", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
status, data = request("POST", "/v1/completions", body)
if status != 200:
    fail(f"a completion answered {status}: {data}")
reply = json.loads(data)
text = reply["choices"][0]["text"]
if reply["usage"]["completion_tokens"] != 12:
    fail(f"expected 12 completion tokens: {data}")

status, data = request("POST", "/v1/completions", dict(body, stream=True))
pieces = []
for line in data.splitlines():
    if line.startswith("data: ") and line != "data: [DONE]":
        pieces.append(json.loads(line[6:])["choices"][0]["text"])
if status != 200 or not data.rstrip().endswith("data: [DONE]") or "".join(pieces) != text:
    fail(f"the streamed reply differs: {status} {data!r} vs {text!r}")

results = [None] * 6
threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, request("POST", "/v1/completions", body)))
           for i in range(6)]
for t in threads:
    t.start()
for t in threads:
    t.join()
for status, data in results:
    if status != 200 or json.loads(data)["choices"][0]["text"] != text:
        fail(f"a concurrent request differs from the solo one: {status} {data}")

status, data = request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5})
if status != 200 or json.loads(data)["object"] != "chat.completion":
    fail(f"a chat answered {status}: {data}")
status, data = request("POST", "/v1/completions", "{not json")
if status != 400 or "error" not in json.loads(data):
    fail(f"bad JSON answered {status}: {data}")
status, data = request("POST", "/v1/completions", {"prompt": "x", "temperature": 7})
if status != 400 or json.loads(data)["error"]["param"] != "temperature":
    fail(f"temperature 7 answered {status}: {data}")
if request("GET", "/nope")[0] != 404:
    fail("an unknown path did not answer 404")

# a client that hangs up mid-stream: its sequence ends and its blocks come back
s = socket.create_connection(("127.0.0.1", port))
payload = json.dumps({"prompt": "a", "max_tokens": 100, "stream": True, "ignore_eos": True})
s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(payload)}\r\n\r\n{payload}").encode())
s.recv(200)
s.close()
for _ in range(600):  # its log line (prompt "a" is one token) says the server is done with it
    if any(l.startswith("POST /v1/completions 200 prompt 1 ") for l in log):
        break
    time.sleep(0.05)
else:
    fail("the hung-up request was never logged")
for _ in range(600):
    m = metrics()
    if m.get("attn_running_sequences") == 0 and m.get("attn_kv_blocks_in_use") == 0:
        break
    time.sleep(0.05)
else:
    fail(f"the hung-up request still holds the engine: {m}")

proc.send_signal(signal.SIGTERM)
try:
    code = proc.wait(timeout=60)
except subprocess.TimeoutExpired:
    fail("SIGTERM: the server did not stop in 60 s")
time.sleep(0.2)
text_log = "".join(log)
if code != 0 or "Sanitizer" in text_log or "runtime error" in text_log:
    fail(f"the server exited {code}")
print(f"serve_smoke: passed ({len(pieces)} streamed pieces, port {port})")
