"""The attn CLI reads and writes .npy files and agrees with the Python module."""
import os
import subprocess

import numpy as np
import pytest

import attn
from conftest import HANG_SECONDS, cli_path


def test_cli_run_round_trip(tmp_path):
    r = np.random.default_rng(3)
    q = r.standard_normal((2, 4, 33, 16)).astype(np.float32)
    k = r.standard_normal((2, 2, 40, 16)).astype(np.float32)
    v = r.standard_normal((2, 2, 40, 16)).astype(np.float32)
    for name, x in (("q", q), ("k", k), ("v", v)):
        np.save(tmp_path / f"{name}.npy", x)
    cmd = [str(cli_path()), "run", "-m", "softmax:causal,softcap=20", "--q", str(tmp_path / "q.npy"),
           "--k", str(tmp_path / "k.npy"), "--v", str(tmp_path / "v.npy"), "--out", str(tmp_path / "o.npy"),
           "--lse", str(tmp_path / "l.npy"), "--probs", str(tmp_path / "p.npy"), "--layout", "bhnd"]
    subprocess.run(cmd, check=True, capture_output=True)
    out, lse, probs = attn.attend(q, k, v, "softmax:causal,softcap=20", layout="bhnd", return_lse=True,
                                  return_probs=True)
    assert np.array_equal(np.load(tmp_path / "o.npy"), out)
    assert np.array_equal(np.load(tmp_path / "l.npy"), lse)
    assert np.array_equal(np.load(tmp_path / "p.npy"), probs)


def test_cli_run_writes_streamed_statistics(tmp_path):
    r = np.random.default_rng(5)
    q = r.standard_normal((1, 2, 20, 8)).astype(np.float32)
    np.save(tmp_path / "q.npy", q)
    cmd = [str(cli_path()), "run", "-m", "softmax:causal", "--q", str(tmp_path / "q.npy"), "--k", str(tmp_path / "q.npy"),
           "--v", str(tmp_path / "q.npy"), "--out", str(tmp_path / "o.npy"), "--stats", str(tmp_path / "s.npy"),
           "--stats-topk", "3", "--layout", "bhnd"]
    subprocess.run(cmd, check=True, capture_output=True)
    _, st = attn.attend(q, q, q, "softmax:causal", layout="bhnd", return_stats=True, stats_topk=3)
    assert np.array_equal(np.load(tmp_path / "s.npy"), np.stack(st, axis=-1))
    bad = subprocess.run(cmd[:-4] + ["--stats-topk", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--stats-topk: expected an integer in [1, 1024], got '0'" in bad.stderr
    assert not (tmp_path / "s.npy").exists() or np.load(tmp_path / "s.npy").shape == (1, 2, 20, 4)


def test_cli_rejects_float64(tmp_path):
    x = np.zeros((1, 1, 2, 2))
    np.save(tmp_path / "x.npy", x)
    p = subprocess.run([str(cli_path()), "run", "--q", str(tmp_path / "x.npy"), "--k", str(tmp_path / "x.npy"),
                        "--v", str(tmp_path / "x.npy"), "--out", str(tmp_path / "o.npy")], capture_output=True, text=True)
    assert p.returncode != 0
    assert "dtype '<f8' is not supported" in p.stderr


def test_cli_run_bnhd_float16(tmp_path):
    r = np.random.default_rng(4)
    q = r.standard_normal((2, 9, 4, 8)).astype(np.float16)  # (B, N, H, D)
    k = r.standard_normal((2, 11, 2, 8)).astype(np.float16)
    for name, x in (("q", q), ("k", k), ("v", k)):
        np.save(tmp_path / f"{name}.npy", x)
    subprocess.run([str(cli_path()), "run", "--layout", "bnhd", "-m", "softmax:causal", "--q", str(tmp_path / "q.npy"),
                    "--k", str(tmp_path / "k.npy"), "--v", str(tmp_path / "v.npy"), "--out", str(tmp_path / "o.npy")],
                   check=True, capture_output=True)
    out = np.load(tmp_path / "o.npy")
    assert out.dtype == np.float16 and out.shape == (2, 9, 4, 8)
    assert np.array_equal(out, attn.attention(q, k, k, causal=True))


def _qkv_files(tmp_path):
    r = np.random.default_rng(5)
    x = r.standard_normal((1, 2, 5, 8)).astype(np.float32)
    for name in ("q", "k", "v"):
        np.save(tmp_path / f"{name}.npy", x)
    return x


def _run(tmp_path, *args):
    base = [str(cli_path()), "run", "--q", str(tmp_path / "q.npy"), "--k", str(tmp_path / "k.npy"),
            "--v", str(tmp_path / "v.npy")]
    return subprocess.run(base + [str(a) for a in args], capture_output=True, text=True)


def test_cli_refuses_outputs_that_alias_inputs_or_each_other(tmp_path):
    """Hardening, class 4: an output path naming an input or another output is refused; nothing is written."""
    x = _qkv_files(tmp_path)
    p = _run(tmp_path, "--out", tmp_path / "q.npy")
    assert p.returncode == 2 and "--out: '" in p.stderr and "is the input --q" in p.stderr
    assert np.array_equal(np.load(tmp_path / "q.npy"), x)
    (tmp_path / "link.npy").symlink_to(tmp_path / "k.npy")
    p = _run(tmp_path, "--out", tmp_path / "link.npy")
    assert "is the input --k" in p.stderr
    p = _run(tmp_path, "--out", tmp_path / "o.npy", "--lse", tmp_path / "o.npy")
    assert "--lse: '" in p.stderr and "is also --out" in p.stderr
    assert not (tmp_path / "o.npy").exists()


def test_cli_writes_all_outputs_or_none(tmp_path):
    """Hardening, class 4: a failing --lse leaves an existing --out as it was, and no temporary files."""
    _qkv_files(tmp_path)
    np.save(tmp_path / "o.npy", np.arange(3, dtype=np.float32))
    p = _run(tmp_path, "--out", tmp_path / "o.npy", "--lse", tmp_path / "missing_dir" / "l.npy")
    assert p.returncode == 2 and "cannot create a file beside it" in p.stderr
    assert np.array_equal(np.load(tmp_path / "o.npy"), np.arange(3, dtype=np.float32))
    assert sorted(f.name for f in tmp_path.iterdir()) == ["k.npy", "o.npy", "q.npy", "v.npy"]
    p = _run(tmp_path, "--out", tmp_path / "o.npy", "--lse", tmp_path / "l.npy")
    assert p.returncode == 0 and np.load(tmp_path / "o.npy").shape == (1, 2, 5, 8)
    assert (tmp_path / "o.npy").stat().st_mode & 0o044  # usual permissions, not mkstemp's 0600


def test_cli_bounded_reads_and_explain(tmp_path):
    """Hardening, class 5: /dev/zero is refused (not a regular file); --explain computes and writes nothing."""
    _qkv_files(tmp_path)
    p = subprocess.run([str(cli_path()), "run", "--q", "/dev/zero", "--k", str(tmp_path / "k.npy"), "--v",
                        str(tmp_path / "v.npy"), "--out", str(tmp_path / "o.npy")], capture_output=True, text=True,
                       timeout=HANG_SECONDS)
    assert p.returncode == 2 and "/dev/zero: is a character device, not a regular file" in p.stderr
    p = _run(tmp_path, "--explain", "--form", "tiled")
    assert p.returncode == 0 and "runs form 'tiled'" in p.stdout and not (tmp_path / "o.npy").exists()


def test_cli_resource_arguments_are_bounded():
    """Hardening, class 1 and 6: thread counts and sizes that cannot be honoured are refused by name."""
    for args, fragment in ((["bench", "--threads", "-1"], "--threads"), (["bench", "--threads", "100000"], "--threads"),
                           (["bench", "--sizes", "-5"], "--sizes"), (["bench", "--layout", "bshd"], "--layout"),
                           (["bench", "--layout", "bnhd"], "--decode"), (["bench", "--page", "16"], "--decode"),
                           (["bench", "--decode", "1000", "--page", "16"], "multiple of 16"),
                           (["demo", "--threads", "100000"], "--threads")):
        p = subprocess.run([str(cli_path())] + args, capture_output=True, text=True, timeout=HANG_SECONDS)
        assert p.returncode != 0 and fragment in p.stderr, (args, p.stderr)


def test_cli_mask_writes_what_mask_of_returns(tmp_path):
    text = "bigbird:block=8,window=3,global=1,random=2,seed=5"
    p = subprocess.run([str(cli_path()), "mask", "-m", text, "--n", "40", "--m", "64", "--out", str(tmp_path / "m.npy"),
                        "--show"], capture_output=True, text=True, check=True)
    got = np.load(tmp_path / "m.npy")
    assert got.dtype == np.bool_ and got.shape == (40, 64)
    assert np.array_equal(got, attn.mask_of(text, 40, 64))
    assert f"{int(got.sum())} of 2560 pairs visible" in p.stdout
    assert "#" in p.stdout and "." in p.stdout  # the picture
    bad = subprocess.run([str(cli_path()), "mask", "-m", "linformer", "--n", "4", "--out", str(tmp_path / "x.npy")],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "linformer has no fixed key pattern" in bad.stderr
    assert not (tmp_path / "x.npy").exists()


def test_cli_run_block_mask(tmp_path):
    r = np.random.default_rng(5)
    q = r.standard_normal((1, 2, 50, 8)).astype(np.float32)
    blocks = r.random((1, 1, 4, 4)) < 0.5
    np.save(tmp_path / "q.npy", q)
    np.save(tmp_path / "b.npy", blocks)
    subprocess.run([str(cli_path()), "run", "-m", "softmax:causal", "--q", str(tmp_path / "q.npy"), "--k",
                    str(tmp_path / "q.npy"), "--v", str(tmp_path / "q.npy"), "--block-mask", str(tmp_path / "b.npy"),
                    "--block-size", "16", "16", "--layout", "bhnd", "--out", str(tmp_path / "o.npy")],
                   check=True, capture_output=True)
    want = attn.attend(q, q, q, "softmax:causal", layout="bhnd", block_mask=blocks, block_size=(16, 16))
    assert np.array_equal(np.load(tmp_path / "o.npy"), want)


def test_cli_kv_cache_appends_and_attends_like_flash_attn_with_kvcache(tmp_path):
    r = np.random.default_rng(8)
    B, cap, Hkv, H, D = 2, 12, 2, 4, 8
    kc, vc = (r.standard_normal((B, cap, Hkv, D)).astype(np.float32) for _ in range(2))
    q = r.standard_normal((B, 1, H, D)).astype(np.float32)
    k, v = (r.standard_normal((B, 1, Hkv, D)).astype(np.float32) for _ in range(2))
    cos, sin = (f(np.arange(cap)[:, None] * 0.1 * np.arange(1, D // 2 + 1)).astype(np.float32) for f in (np.cos, np.sin))
    for name, x in dict(q=q, k=k, v=v, kc=kc, vc=vc, cos=cos, sin=sin).items():
        np.save(tmp_path / f"{name}.npy", x)
    f = lambda n: str(tmp_path / f"{n}.npy")  # noqa: E731
    subprocess.run([str(cli_path()), "run", "-m", "softmax:causal", "--layout", "bnhd", "--q", f("q"), "--k", f("k"),
                    "--v", f("v"), "--k-cache", f("kc"), "--v-cache", f("vc"), "--cache-seqlens", "5,9",
                    "--rotary-cos", f("cos"), "--rotary-sin", f("sin"), "--out", f("o"), "--lse", f("l"),
                    "--k-cache-out", f("kc2"), "--v-cache-out", f("vc2")], check=True, capture_output=True)
    kc_py, vc_py = kc.copy(), vc.copy()
    out, lse = attn.flash_attn_with_kvcache(q, kc_py, vc_py, k, v, rotary_cos=cos, rotary_sin=sin,
                                            cache_seqlens=np.array([5, 9], np.int32), causal=True,
                                            rotary_interleaved=False, return_softmax_lse=True)
    assert np.array_equal(np.load(f("o")), out)
    assert np.array_equal(np.load(f("l")), lse)
    assert np.array_equal(np.load(f("kc2")), kc_py) and np.array_equal(np.load(f("vc2")), vc_py)
    assert not np.array_equal(kc_py, kc)  # the append happened


def test_cli_packed_batches_and_bad_cache_calls(tmp_path):
    r = np.random.default_rng(9)
    q, k, v = (r.standard_normal((7, 2, 8)).astype(np.float32) for _ in range(3))
    for name, x in dict(q=q, k=k, v=v).items():
        np.save(tmp_path / f"{name}.npy", x)
    f = lambda n: str(tmp_path / f"{n}.npy")  # noqa: E731
    subprocess.run([str(cli_path()), "run", "-m", "softmax:causal", "--layout", "bnhd", "--q", f("q"), "--k", f("k"),
                    "--v", f("v"), "--cu-seqlens-q", "0,3,7", "--cu-seqlens-k", "0,3,7", "--out", f("o")],
                   check=True, capture_output=True)
    ref = attn.flash_attn_varlen_func(q, k, v, np.array([0, 3, 7], np.int32), np.array([0, 3, 7], np.int32), 4, 4,
                                      causal=True)
    assert np.array_equal(np.load(f("o")), ref)
    kc = np.zeros((1, 4, 2, 8), np.float32)
    np.save(tmp_path / "kc.npy", kc)
    p = subprocess.run([str(cli_path()), "run", "--layout", "bnhd", "--q", f("q"), "--k-cache", f("kc"), "--v-cache",
                        f("kc"), "--k", f("k"), "--v", f("v"), "--cache-seqlens", "2", "--out", f("o2"),
                        "--k-cache-out", f("kc3")], capture_output=True, text=True)
    assert p.returncode == 2 and "7 new ones do not fit its capacity 4" in p.stderr, p.stderr
    assert not (tmp_path / "o2.npy").exists() and not (tmp_path / "kc3.npy").exists()


def test_cli_refuses_options_that_overflow_or_oversize(tmp_path):
    """Hardening: float options past their range and sizes beyond what
    the input can use are errors naming the option, range or sizes, before anything is computed;
    `attn run --help` prints every family's float option ranges (from attn::info)."""
    _qkv_files(tmp_path)
    for mech, message in [("polaformer:power=100", "polaformer power must be in (1, 10], got 100"),
                          ("gau:bias=3e38", "gau bias must be in [-1e+12, 1e+12], got 3e+38"),
                          ("linformer:k=1048576", "the key count M = 5), got k = 1048576"),
                          ("lsh:buckets=65536", "lsh buckets must be at most max(64, 2 M) = 64 for M = 5 keys")]:
        p = _run(tmp_path, "-m", mech, "--out", tmp_path / "o.npy", "--layout", "bhnd")
        assert p.returncode == 2 and message in p.stderr, (mech, p.stderr)
        assert not (tmp_path / "o.npy").exists()
    help_text = subprocess.run([str(cli_path()), "run", "--help"], capture_output=True, text=True).stdout
    for family in attn.families():
        for r in family["option_ranges"]:
            assert r in help_text, (family["family"], r)
    assert "power in (1, 10]" in help_text and "scale in [1e-30, 1e+12]" in help_text


# ---- usage errors (hardening): every sub-command, one format -------------------
import re  # noqa: E402

_OPTION_LINE = re.compile(r"^  (?:-\w,)?(--[\w-]+)(?: (TEXT|INT|UINT|FLOAT)\b(.*?))?(?: {2,}|$)")


def _attn(*args):
    return subprocess.run([str(cli_path())] + [str(a) for a in args], capture_output=True, text=True, timeout=HANG_SECONDS,
                          stdin=subprocess.DEVNULL)


def _commands():
    text = _attn("--help").stdout
    section = text[text.index("Subcommands:"):]
    return re.findall(r"^  ([a-z][a-z-]*) {2,}", section, flags=re.M)


def _options(command):
    """(name, type, type details) of every option `attn COMMAND --help` lists (flags have no type)."""
    out = []
    for line in _attn(command, "--help").stdout.splitlines():
        m = _OPTION_LINE.match(line)
        if m and m.group(1) != "--help":
            out.append((m.group(1), m.group(2) or "", m.group(3) or ""))
    return out


def _bound(text):
    m = re.fullmatch(r"(-?)2\^(\d+)( - 1)?", text.strip())
    if m:
        v = 2 ** int(m.group(2)) - (1 if m.group(3) else 0)
        return -v if m.group(1) else v
    return float(text) if "." in text or "e" in text else int(text)


def _usage_error(args, *fragments):
    p = _attn(*args)
    assert p.returncode == 2, (args, p.returncode, p.stderr)
    assert p.stderr.startswith("error: attn"), (args, p.stderr)
    for f in fragments:
        assert f in p.stderr, (args, f, p.stderr)
    assert not re.search(r"\d{21,}", p.stderr), (args, p.stderr)  # no numeric_limits printed as bounds
    return p.stderr


# Per sub-command: an option left without its value, a value of the wrong type and a number out of
# range (None where the command takes no such thing: its options are all text or flags).
USAGE_TABLE = {
    "demo": (["--tokens"], ["--heads", "two"], ["--threads", "257"]),
    "run": (["--layout"], ["--stats-topk", "1.5"], ["--stats-topk", "1025"]),
    "bench": (["--json"], ["--reps", "0x10"], ["--sizes", "1048577"]),
    "list": (["--suite"], ["--context", "abc"], ["--context", "-1"]),
    "check": (["--case"], None, None),
    "mask": (["--n"], ["--m", "1e3"], ["--n", "4294967297"]),
    "generate": (["--prompt"], ["--threads", "two"], ["--max-context", "0"]),
    "generate-random": (["--weights"], ["--threads", "two"], ["--layers", "0"]),
    "gguf": (["--dequantize"], None, None),
    "tokenize": (["--decode"], None, None),
    "chat": (["--system"], ["--top-p", "nan"], ["--temperature", "100.5"]),
    "serve": (["--port"], ["--parallel", "four"], ["--port", "65536"]),
    "eval-ppl": (["--out"], ["--tokens", "many"], ["--tokens", "1"]),
    "concentration": (["--out"], ["nope"], None),
    "report": (["--run"], None, None),
    "models": (["extra"], None, None),  # no options: an argument is unexpected
}


def test_cli_usage_table_covers_every_command():
    assert sorted(_commands()) == sorted(USAGE_TABLE)


def test_cli_usage_errors_exit_2_in_the_projects_format():
    """Hardening, class 7: unknown option, missing value, wrong type, out of range, per command."""
    for command, (missing, wrong, out_of_range) in USAGE_TABLE.items():
        assert _attn(command, "--help").returncode == 0
        _usage_error([command, "--no-such-option"], f"attn {command}: unknown option '--no-such-option'")
        _usage_error([command, "--no-such-option=3"], "unknown option '--no-such-option'")
        _usage_error([command] + missing, missing[0])
        if wrong:
            _usage_error([command] + wrong, "expected", wrong[0] if wrong[0].startswith("-") else "experiment")
        if out_of_range:
            _usage_error([command] + out_of_range, out_of_range[0], "expected")
    _usage_error(["bogus"], "attn: unknown command 'bogus'")
    _usage_error([], "a command is required")
    _usage_error(["demo", "extra"], "attn demo: unexpected argument 'extra'")
    _usage_error(["gguf"], "file is required")
    _usage_error(["run", "--q", "q.npy", "--bogus"], "unknown option '--bogus'")  # named before --q's problem
    _usage_error(["demo", "--threads", "1", "--threads", "2"], "--threads: takes 1 value(s), got 2")
    _usage_error(["run", "--block-size", "16"], "--block-size: expects 2 values, got 1")
    _usage_error(["demo", "-n", "99999999999999999999"], "--tokens: expected an integer in [1, 65536], got")
    _usage_error(["list", "--context", "-1"], "--context: expected an integer in [0, 2^62], got '-1'")
    _usage_error(["generate", "--seed", "-1"],
                 "--seed: expected an integer in [0, 2^64 - 1] (decimal digits), got '-1'")
    _usage_error(["run", "--alibi", "x"], "--alibi: expected a finite number, got 'x'")
    _usage_error(["list", "--suite", "nope"], "--suite: expected one of {check,bench,decode,demo}, got 'nope'")
    assert _attn("--help").returncode == 0


# Filters that select nothing, grids that cannot run, options that mean nothing in the mode given:
# each refused before any work (no roofline measured, no half table printed), naming the option.
TINY_TOKENIZER = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "tiny_tokenizer.gguf")
CLI_REFUSALS = [
    (["check", "--isa", "bogus"], "attn check: --isa: expected portable (or scalar), avx2 or avx512, got 'bogus'"),
    (["check", "--form", "bogus"], "attn check: --form: expected rows, tiled_bf16, tiled,", "got 'bogus'"),
    (["check", "--op", "nosuch"], "attn check: --op: expected softmax,", "got 'nosuch'"),
    (["check", "--backward", "--op", "nosuch"], "attn check: --op: expected", "got 'nosuch'"),
    (["check", "--op", "softmax", "--form", "recurrent"], "--op softmax --form recurrent: select no check runs together"),
    (["check", "--case", "no-such-case"], "--case: no case of the check runs has 'no-such-case'"),
    (["list", "--op", "nosuch"], "attn list: --op: expected softmax,"),
    (["bench", "--isa", "bogus"], "attn bench: --isa: expected portable (or scalar), avx2 or avx512, got 'bogus'"),
    (["bench", "--mechanisms", "nosuch"], "attn bench: --mechanisms: ", "unknown mechanism 'nosuch'"),
    (["bench", "--mechanisms", "linformer:k=100000"], "linformer k must be in [1, M]", "got k = 100000"),
    (["bench", "--heads", "3", "--kv-heads", "2"], "attn bench: --heads 3 --kv-heads 2: ", "does not divide q's 3"),
    (["bench", "--dtypes", "f64"], "attn bench: --dtypes: expected f32, bf16 or f16, got 'f64'"),
    (["demo", "-d", "3"], "attn demo: -n 512 -d 3 --heads 8: ", "needs an even head dim", "got D = 3"),
    (["demo", "--form", "recurrent", "--op", "softmax"], "attn demo: ", "form must be one of rows, tiled_bf16, tiled, reference for softmax, got 'recurrent'"),
    (["generate-random", "--arch", "minimax", "--experts", "4", "--top-k", "9"],
     "attn generate-random: --experts-per-token: expected an integer in [1, --experts = 4], got 9"),
    (["generate-random", "--experts", "4"],
     "attn generate-random: --experts does not apply to --arch llama", "architectures with one: minimax"),
    # --top-k is llama.cpp's sampling option in generate (it was experts per token, silently, beside --model)
    (["generate", "--model", TINY_TOKENIZER, "-p", "x", "--top-k", "-1"], "attn generate: --top-k: expected an integer in [0, 1073741824], got '-1'"),
    (["generate", "--model", TINY_TOKENIZER, "-p", "x", "--experts", "4"], "attn generate: unknown option '--experts'"),
    (["generate", "--model", TINY_TOKENIZER, "-p", "x", "--min-p", "1.5"], "attn generate: --min-p: expected a number in [0, 1], got '1.5'"),
    (["generate", "--model", TINY_TOKENIZER, "-p", "x", "--top-p", "0"], "attn generate: --top-p: expected a number in (0, 1] (1 = off), got 0"),
    (["chat", "--model", TINY_TOKENIZER, "--repeat-penalty", "0"], "attn chat: --repeat-penalty: expected a number > 0 (1 = off), got 0"),
    (["chat", "--model", TINY_TOKENIZER, "--repeat-last-n", "-2"], "attn chat: --repeat-last-n: expected an integer in [-1, "),
    (["generate-random", "--heads", "6", "--kv-heads", "4"], "--kv-heads: must divide --heads 6, got 4"),
    (["generate-random", "--head-dim", "7"], "--head-dim: must be even", "got 7"),
    (["generate-random", "--mechanism", "softmax"], "--mechanism: must be causal", "got 'softmax'"),
    (["generate-random", "--hybrid", "99999999999999999999:1"], "--hybrid expects L:S"),
]


@pytest.mark.parametrize("args", [c[0] for c in CLI_REFUSALS], ids=[" ".join(c[0]) for c in CLI_REFUSALS])
def test_cli_refuses_before_any_work(args):
    fragments = next(c[1:] for c in CLI_REFUSALS if c[0] == args)
    said = _usage_error(args, *fragments)
    assert said.count("error: attn") == 1 and "attn generate: generate:" not in said, said
    p = _attn(*args)
    assert "roofline" not in p.stdout and "error" not in p.stdout and len(p.stdout) < 200, (args, p.stdout)


def test_cli_every_option_refuses_a_missing_value_a_wrong_type_and_numbers_out_of_range():
    """The same, swept over every option `--help` lists: each value-taking option given no value,
    each number given text, a fraction, hex or nan, and each bounded number one past either bound."""
    tried = 0
    for command in _commands():
        for name, typ, details in _options(command):
            if not typ:
                continue  # a flag
            if (command, name) != ("bench", "--decode"):  # --decode alone is valid: the list's cache lengths
                _usage_error([command, name], name)
                tried += 1
            count = int(m.group(1)) if (m := re.search(r" x (\d+)$", details)) else 1
            if typ in ("INT", "UINT", "FLOAT"):
                bad = ["abc", "nan"] + (["1.5", "0x10"] if typ != "FLOAT" else ["1e999"])
                for b in bad:
                    _usage_error([command, name] + [b] * count, name, "expected")
                    tried += 1
            if r := re.search(r" in \[([^,\]]+), ([^\]]+)\]", details):
                lo, hi = _bound(r.group(1)), _bound(r.group(2))
                step = 0.5 if isinstance(lo, float) or isinstance(hi, float) or typ == "FLOAT" else 1
                for v in (lo - step, hi + step):
                    _usage_error([command, name] + [str(v)] * count, name, f"in [{r.group(1)}, {r.group(2)}]")
                    tried += 1
    print(f"{tried} hostile values tried")
    assert tried > 150, tried


def test_cli_version_on_attn_and_every_command():
    for command in [[]] + [[c] for c in _commands()]:
        p = _attn(*command, "--version")
        assert p.returncode == 0 and p.stdout == f"attn {attn.__version__}\n", (command, p.stdout, p.stderr)
