"""Hardening: the files the CLI reads and writes.

Reads: every input (.npy, GGUF, safetensors, texts) must be a regular file; a FIFO or a device is
refused at once, never waited on or read until memory runs out, and texts are bounded (64 MiB).
Writes: outputs replace a regular file only when every output of the command is whole (written,
fsync'ed), devices and FIFOs are written in place and never renamed over, and every write error
(a full device) is an error. Each call has a timeout, so a regression fails instead of hanging."""
import json
import os
import signal
import stat
import subprocess
import threading
import time

import numpy as np
import pytest

from conftest import HANG_SECONDS, cli_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY_TOK = os.path.join(ROOT, "tests", "data", "tiny_tokenizer.gguf")
TIMEOUT = HANG_SECONDS  # turns a hang into a failure; every call here finishes in well under a second


def _cli(*args, **kw):
    return subprocess.run([str(cli_path())] + [str(a) for a in args], capture_output=True, timeout=TIMEOUT, **kw)


def _err(p):
    return p.stderr.decode(errors="replace")


@pytest.fixture
def qkv(tmp_path):
    x = np.random.default_rng(5).standard_normal((1, 2, 5, 8)).astype(np.float32)
    np.save(tmp_path / "q.npy", x)
    return x


def _run_args(tmp_path):
    return ["run", "--q", tmp_path / "q.npy", "--k", tmp_path / "q.npy", "--v", tmp_path / "q.npy"]


def _device_id(path):
    st = os.stat(path)
    return stat.S_ISCHR(st.st_mode), st.st_ino, st.st_rdev


# ---- class 4: reads ---------------------------------------------------------------------------

def _hostile_inputs(tmp_path, fifo):
    """(argv, fragment): every way the CLI reads a file, given a FIFO (no writer) or a device."""
    q = tmp_path / "q.npy"
    cases = []
    for bad, what in ((fifo, "is a FIFO (named pipe), not a regular file"),
                      ("/dev/zero", "is a character device, not a regular file")):
        cases += [
            (["run", "--q", bad, "--k", q, "--v", q, "--out", tmp_path / "o.npy"], what),
            (["run", "--q", q, "--k", q, "--v", bad, "--out", tmp_path / "o.npy"], what),
            (["run", "--q", q, "--k", q, "--v", q, "--mask", bad, "--out", tmp_path / "o.npy"], what),
            (["gguf", bad], what),
            (["tokenize", bad, "--text", "hi"], what),
            (["tokenize", TINY_TOK, "--file", bad], what),
            (["eval-ppl", "--model", TINY_TOK, "--text", bad], what),
            (["eval-ppl", "--model", bad, "--text", TINY_TOK], what),
            (["generate", "--model", bad, "--prompt", "x"], what),
            (["generate-random", "--weights", bad], what),
            (["chat", "--model", bad], what),
            (["demo", "--model", bad, "-n", "8"], what),
        ]
    return cases


def test_cli_refuses_fifos_and_devices_as_inputs_without_waiting(tmp_path, qkv):
    """A FIFO with no writer used to block forever; /dev/zero as a text read until memory ran out."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    cases = _hostile_inputs(tmp_path, fifo)
    assert len(cases) == 24
    for argv, fragment in cases:
        p = _cli(*argv, stdin=subprocess.DEVNULL)  # a timeout, not a hang, if this regresses
        assert p.returncode == 2, (argv, _err(p))
        assert _err(p).startswith("error: ") and fragment in _err(p), (argv, _err(p))
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_cli_texts_are_bounded(tmp_path):
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:  # sparse: 64 MiB + 1 byte costs no disk
        f.truncate((64 << 20) + 1)
    for argv in (["tokenize", TINY_TOK, "--file", big], ["eval-ppl", "--model", TINY_TOK, "--text", big]):
        p = _cli(*argv)
        assert p.returncode == 2, _err(p)
        assert f"{big}: holds 67108865 bytes, more than the 64 MiB (67108864 bytes) a text may have" in _err(p)
    ok = tmp_path / "ok.txt"
    ok.write_bytes(b"hello world")
    p = _cli("tokenize", TINY_TOK, "--file", ok)
    assert p.returncode == 0 and "from 11 bytes" in p.stdout.decode()


# ---- class 3: writes --------------------------------------------------------------------------

def test_cli_writes_devices_in_place_and_never_renames_over_them(tmp_path, qkv):
    before = _device_id("/dev/null")
    for extra in (["--out", "/dev/null"], ["--out", tmp_path / "o.npy", "--lse", "/dev/null"]):
        p = _cli(*_run_args(tmp_path), *extra)
        assert p.returncode == 0, _err(p)
        assert _device_id("/dev/null") == before
    p = _cli("mask", "-m", "softmax:causal", "--n", 4, "--out", "/dev/null")
    assert p.returncode == 0 and _device_id("/dev/null") == before
    assert not [f for f in os.listdir("/dev") if "attn-tmp" in f]
    # /dev/stdout: the data takes stdout, the message goes to stderr
    p = _cli(*_run_args(tmp_path), "--out", "/dev/stdout")
    assert p.returncode == 0, _err(p)
    out_path = tmp_path / "from_stdout.npy"
    out_path.write_bytes(p.stdout)
    assert np.load(out_path).shape == (1, 2, 5, 8) and "-> /dev/stdout" in _err(p)


def test_cli_writes_a_fifo_with_a_reader_and_refuses_one_without(tmp_path, qkv):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    p = _cli(*_run_args(tmp_path), "--out", fifo)
    assert p.returncode == 2 and "is a FIFO with no reader; attn does not wait for one" in _err(p)
    got = {}
    reader = threading.Thread(target=lambda: got.setdefault("bytes", open(fifo, "rb").read()))
    reader.start()
    try:
        for _ in range(200):  # the reader's open() blocks until we open the write end; give it time
            p = _cli(*_run_args(tmp_path), "--out", fifo, "--lse", tmp_path / "l.npy")
            if p.returncode == 0 or "no reader" not in _err(p):
                break
            time.sleep(0.05)
    finally:
        if reader.is_alive():  # unblock the reader whatever happened
            with open(fifo, "wb"):
                pass
        reader.join(TIMEOUT)
    assert p.returncode == 0, _err(p)
    (tmp_path / "via_fifo.npy").write_bytes(got["bytes"])
    assert np.load(tmp_path / "via_fifo.npy").shape == (1, 2, 5, 8)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_cli_full_device_is_an_error_and_leaves_the_other_outputs_as_they_were(tmp_path, qkv):
    old = np.arange(3, dtype=np.float32)
    np.save(tmp_path / "o.npy", old)
    for extra in (["--out", "/dev/full"], ["--out", tmp_path / "o.npy", "--lse", "/dev/full"],
                  ["--out", tmp_path / "o.npy", "--lse", tmp_path / "l.npy", "--probs", "/dev/full"]):
        p = _cli(*_run_args(tmp_path), *extra)
        assert p.returncode == 2 and "/dev/full: write failed: No space left on device" in _err(p), (extra, _err(p))
        assert np.array_equal(np.load(tmp_path / "o.npy"), old)
        assert sorted(f.name for f in tmp_path.iterdir()) == ["o.npy", "q.npy"]
    for argv in (["mask", "-m", "softmax:causal", "--n", 4, "--out", "/dev/full"],
                 ["gguf", os.path.join(ROOT, "tests", "fuzz", "corpus", "gguf", "small.gguf"), "--dequantize", "q",
                  "--out", "/dev/full"],
                 ["generate-random", "--layers", 1, "--dim", 16, "--heads", 1, "--kv-heads", 1,
                  "--head-dim", 16, "--hidden", 16, "--vocab", 16, "--prompt-tokens", 2, "--new-tokens", 0,
                  "--save-weights", "/dev/full"],
                 ["bench", "--sizes", 16, "--dims", 8, "--threads", 1, "--mechanisms", "softmax", "--dtypes", "f32",
                  "--reps", 1, "--json", "/dev/full"]):
        p = _cli(*argv)
        assert p.returncode == 2 and "/dev/full: write failed: No space left on device" in _err(p), (argv, _err(p))


def test_cli_checks_every_output_path_before_computing(tmp_path, qkv):
    np.save(tmp_path / "o.npy", np.arange(3, dtype=np.float32))
    (tmp_path / "adir").mkdir()
    for extra, fragment in ((["--lse", tmp_path / "missing" / "l.npy"], "--lse: "),
                            (["--lse", tmp_path / "adir"], "is a directory; give a file name"),
                            (["--probs", tmp_path / "adir"], "--probs: ")):
        p = _cli(*_run_args(tmp_path), "--out", tmp_path / "o.npy", *extra)
        assert p.returncode == 2 and fragment in _err(p), _err(p)
        assert np.array_equal(np.load(tmp_path / "o.npy"), np.arange(3, dtype=np.float32))
    p = _cli("eval-ppl", "--model", TINY_TOK, "--text", TINY_TOK, "--out", tmp_path / "missing" / "ppl")
    assert p.returncode == 2 and "--out (.csv): " in _err(p) and "cannot create a file beside it" in _err(p)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["adir", "o.npy", "q.npy"]


def test_cli_output_through_a_link_replaces_the_file_and_keeps_the_link(tmp_path, qkv):
    np.save(tmp_path / "real.npy", np.arange(3, dtype=np.float32))
    os.symlink("real.npy", tmp_path / "link.npy")
    os.chmod(tmp_path / "real.npy", 0o640)
    p = _cli(*_run_args(tmp_path), "--out", tmp_path / "link.npy")
    assert p.returncode == 0, _err(p)
    assert os.path.islink(tmp_path / "link.npy") and np.load(tmp_path / "real.npy").shape == (1, 2, 5, 8)
    assert stat.S_IMODE(os.stat(tmp_path / "real.npy").st_mode) == 0o640


def _bench(json_path, sizes):
    return [str(cli_path()), "bench", "--sizes", *[str(s) for s in sizes], "--dims", "8", "--threads", "1",
            "--mechanisms", "softmax", "--dtypes", "f32", "--reps", "1", "--json", str(json_path)]


def test_bench_json_is_written_a_line_per_case_and_replaced_only_at_the_first(tmp_path):
    out = tmp_path / "b.jsonl"
    out.write_text("old line\n")
    p = subprocess.run(_bench(out, [8, 16]) + ["--page", "16"], capture_output=True, timeout=TIMEOUT)
    assert p.returncode == 2 and out.read_text() == "old line\n"  # an error before the first case touches nothing
    p = subprocess.run(_bench(out, [8, 16]), capture_output=True, timeout=TIMEOUT)
    assert p.returncode == 0, _err(p)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["q_len"] for r in rows] == [8, 16]
    # Interrupted after its first case: the finished case is in the file, whole.
    proc = subprocess.Popen(_bench(out, [16, 4096, 4096, 4096]), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=dict(os.environ, ATTN_BLAS_CORETYPE="keep"))
    try:
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline and proc.poll() is None:
            text = out.read_text()
            if text.endswith("\n") and text != "" and json.loads(text.splitlines()[0]).get("q_len") == 16:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        proc.wait(TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and rows[0]["q_len"] == 16


def test_python_loaders_and_savers_share_the_checks(tmp_path):
    """The module reads and writes through the same src/io code: a FIFO or device path is a
    ValueError at once (in a child with a timeout, so a regression fails instead of hanging), and a
    full device is a ValueError, not a silent success."""
    import sys

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    script = f"""
import attn
cfg = dict(vocab_size=16, dim=16, hidden_dim=16, heads=1, kv_heads=1, head_dim=16, max_seq_len=8,
           layers=attn.Decoder.softmax_layers(1))
calls = [
    lambda p: attn.Decoder.load(p),
    lambda p: attn.Tokenizer.from_gguf(p),
    lambda p: attn.load_model(p),
]
for path in ({str(fifo)!r}, "/dev/zero"):
    for call in calls:
        try:
            call(path)
            print("loaded", path)
        except ValueError as e:
            print("ValueError", e)
try:
    attn.Decoder.random(cfg, 1).save("/dev/full")
    print("saved")
except ValueError as e:
    print("ValueError", e)
attn.Decoder.random(cfg, 1).save("/dev/null")
print("saved /dev/null")
"""
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=TIMEOUT,
                       env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[:3] == [f"ValueError {fifo}: is a FIFO (named pipe), not a regular file; attn reads inputs from "
                         "regular files only"] * 3, lines
    assert lines[3:6] == ["ValueError /dev/zero: is a character device, not a regular file; attn reads inputs from "
                          "regular files only"] * 3, lines
    assert lines[6] == "ValueError /dev/full: write failed: No space left on device", lines
    assert lines[7] == "saved /dev/null" and _device_id("/dev/null")[0]
