"""Hardening: the model, sampler and tokenizer refuse what they would
otherwise get silently wrong -- NaN weights, seeds outside [0, 2**64 - 1], token ids that are not
integers or not in the vocabulary, max_tokens beyond the context, one Model from many threads --
each with our own message naming the argument. The model is tiny_text_model.py's GGUF file."""
import math
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import attn
from conftest import HANG_SECONDS, cli_path
from tiny_text_model import write_tiny_text_model

gguf = pytest.importorskip("gguf")

FOREIGN = ("incompatible function arguments", "Invoked with", "nanobind")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    vocab = write_tiny_text_model(path)
    return path, vocab


@pytest.fixture(scope="module")
def model(tiny):
    return attn.load_model(tiny[0], dtype="f32", threads=1, max_seq_len=64)


def raises(kind, pattern, fn):
    with pytest.raises(kind, match=pattern) as e:
        fn()
    assert not any(f in str(e.value) for f in FOREIGN), str(e.value)


# ---- 2c: non-finite logits ----------------------------------------------------------------------

@pytest.mark.parametrize("poison, said", [("all", r"\d+ NaN and 0 \+inf of 271"),
                                          ("one", r"1 NaN and 0 \+inf of 271 \(the first at token 5\)")])
def test_nan_weights_are_an_error_naming_the_step(tmp_path, poison, said):
    """A model with NaN weights used to generate '' without a word (all-NaN logits became token 0)."""
    path = tmp_path / "nan.gguf"
    write_tiny_text_model(path, poison=poison)
    m = attn.load_model(path, dtype="f32", threads=1)
    for kw in ({}, {"temperature": 0.8, "top_p": 0.9, "seed": 3}, {"temperature": 1.0}):
        raises(ValueError, r"^sampling: the logits at step 0 \(new token 1\) are not finite: " + said,
               lambda: m.generate([10, 11, 12], max_tokens=4, **kw))
    p = subprocess.run([str(cli_path()), "generate", "--model", str(path), "--dtype", "f32", "--prompt", "hello",
                        "--max-tokens", "4", "-q"], capture_output=True, text=True, timeout=HANG_SECONDS)
    assert p.returncode == 2 and "error: attn generate: sampling: the logits at step 0 (new token 1) are not finite" in p.stderr, p.stderr


def test_cli_benchmark_generate_refuses_nan_weights(tmp_path):
    """attn generate-random --weights (the benchmark's greedy loop) took argmax of NaN logits: token 0."""
    import json
    import struct

    cfg = dict(vocab_size=32, dim=16, hidden_dim=16, heads=2, kv_heads=1, head_dim=8, max_seq_len=16,
               layers=attn.Decoder.softmax_layers(1))
    path = tmp_path / "nan.safetensors"
    attn.Decoder.random(cfg, seed=1).save(path)
    raw = bytearray(path.read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    begin, end = json.loads(raw[8:8 + n])["model.norm.weight"]["data_offsets"]
    raw[8 + n + begin:8 + n + end] = np.full((end - begin) // 4, np.nan, np.float32).tobytes()
    path.write_bytes(bytes(raw))
    p = subprocess.run([str(cli_path()), "generate-random", "--weights", str(path), "--prompt-tokens", "4",
                        "--new-tokens", "2", "-q"], capture_output=True, text=True, timeout=HANG_SECONDS)
    assert p.returncode == 2 and "error: attn generate-random: sampling: the logits at step 0 (new token 1) are not finite: 32 NaN" in p.stderr, \
        p.stderr


# ---- 2c: seeds ----------------------------------------------------------------------------------

def test_seeds_outside_the_unsigned_64_bit_range_are_refused(model):
    """-1 and 2**64 used to be taken modulo 2**64."""
    for bad in (-1, 2**64, -2**63, 2**70):
        raises(ValueError, rf"^seed must be in \[0, 18446744073709551615\], got {bad}$",
               lambda: model.generate([10, 11], max_tokens=2, temperature=1.0, seed=bad))
    for bad in (1.5, True, "3", None, np.float64(2.0)):
        raises(TypeError, r"^seed must be an integer", lambda: model.generate([10, 11], max_tokens=2, temperature=1.0, seed=bad))
    for good in (0, 2**64 - 1, np.uint64(2**64 - 1), np.int8(7)):
        out = model.generate([10, 11], max_tokens=3, temperature=1.0, top_p=0.9, seed=good, stop=[])
        assert len(out) == 3 and all(0 <= t < 271 for t in out)
    assert model.generate([10, 11], max_tokens=5, temperature=1.0, seed=2**64 - 1, stop=[]) == \
        model.generate([10, 11], max_tokens=5, temperature=1.0, seed=np.uint64(2**64 - 1), stop=[])
    raises(ValueError, r"^seed must be in \[0, 18446744073709551615\], got -1$", lambda: attn.Decoder.random(
        dict(vocab_size=8, dim=8, hidden_dim=8, heads=1, kv_heads=1, head_dim=8, max_seq_len=8,
             layers=attn.Decoder.softmax_layers(1)), seed=-1))


def test_cli_seeds_outside_the_unsigned_64_bit_range_are_refused(tiny):
    for command in (["generate-random"], ["chat", "--model", str(tiny[0])]):
        for bad in ("-1", "18446744073709551616", "99999999999999999999", "0x10", "010", "1.5", "", " 1", "1e3"):
            p = subprocess.run([str(cli_path())] + command + ["--seed", bad], capture_output=True, text=True,
                               input="", timeout=HANG_SECONDS)
            assert p.returncode != 0 and "--seed" in p.stderr and \
                "expected an integer in [0, 2^64 - 1] (decimal digits), got '" + bad + "'" in p.stderr, \
                (command, bad, p.stderr)
    tiny_model = ["--layers", "1", "--dim", "16", "--heads", "2", "--kv-heads", "1", "--head-dim", "8", "--hidden", "16",
                  "--vocab", "32", "--prompt-tokens", "4", "--new-tokens", "2", "-q"]
    for good in ("0", "18446744073709551615"):
        p = subprocess.run([str(cli_path()), "generate-random", "--seed", good] + tiny_model,
                           capture_output=True, text=True, timeout=HANG_SECONDS)
        assert p.returncode == 0, p.stderr


def test_cli_chat_bounds_a_turn_read_from_stdin(tiny):
    """attn chat reads a turn per line, at most 1 MiB: /dev/zero as stdin is an error, not a read until
    memory runs out; an ordinary line gets its reply."""
    with open("/dev/zero", "rb") as zero:
        p = subprocess.run([str(cli_path()), "chat", "--model", str(tiny[0]), "--max-tokens", "2", "-q"],
                           stdin=zero, capture_output=True, text=True, timeout=HANG_SECONDS)
    assert p.returncode != 0 and "a line of stdin holds more than 1048576 bytes (1 MiB)" in p.stderr, p.stderr
    p = subprocess.run([str(cli_path()), "chat", "--model", str(tiny[0]), "--max-tokens", "2", "-q"],
                       input="hello\n", capture_output=True, text=True, timeout=HANG_SECONDS)
    assert p.returncode == 0, p.stderr


# ---- 2c: token ids ------------------------------------------------------------------------------

def test_token_ids_must_be_integers_in_the_vocabulary(model, tiny):
    """Floats (3.7), float arrays and bools used to be truncated silently."""
    d = attn.Decoder.load  # noqa: F841 (the Decoder wrapper is checked below through Model's impl)
    calls = (("ids", model.logits), ("ids", model.perplexity),
             ("prompt", lambda x: model.generate(x, max_tokens=1)), ("ids", model.tokenizer.decode))
    for name, fn in calls:
        for bad, kind, said in (([3.7], TypeError, r"\[0\] must be an integer token id, got 3\.7"),
                                ([1, True], TypeError, r"\[1\] must be an integer token id, got True"),
                                (np.array([1.0, 2.0]), TypeError, r" must be a 1-D sequence of integer token ids, got a float64"),
                                (np.array([True]), TypeError, r" must be a 1-D sequence of integer token ids, got a bool"),
                                (np.array([[1, 2]]), TypeError, r" must be a 1-D sequence of integer token ids, got a int64 array of shape \(1, 2\)"),
                                ([271], ValueError, r"\[0\] = 271 is not a token id in \[0, 271\) \(the vocabulary's size\)"),
                                ([5, -1], ValueError, r"\[1\] = -1 is not a token id in \[0, 271\)"),
                                ([2**40], ValueError, r"\[0\] = 1099511627776 is not a token id"),
                                ([2**70], ValueError, r"\[0\] = 1180591620717411303424 is not a token id"),
                                (None, TypeError, r" must be a sequence of token ids, got NoneType"),
                                (b"\x01\x02", TypeError, r" must be a sequence of token ids, got bytes"),
                                (7, TypeError, r" must be a sequence of token ids, got 7")):
            raises(kind, "^" + name + said, lambda: fn(bad))
    raises(ValueError, r"^stop\[0\] = 271 is not a token id", lambda: model.generate([5], max_tokens=1, stop=[271]))
    raises(TypeError, r"^stop\[0\] must be an integer token id, got 1\.5", lambda: model.generate([5], max_tokens=1, stop=[1.5]))
    raises(ValueError, r"^id = 271 is not a token id in \[0, 271\)", lambda: model.tokenizer.token_text(271))
    raises(TypeError, r"^id must be an integer, got 3\.0", lambda: model.tokenizer.is_special(3.0))
    # integer arrays of any width are fine and mean the same ids
    want = model.logits([10, 11, 12])
    for same in (np.array([10, 11, 12], np.int8), np.array([10, 11, 12], np.uint64), (10, 11, 12)):
        assert np.array_equal(model.logits(same), want)


def test_decoder_token_ids_and_arguments(tmp_path):
    cfg = dict(vocab_size=16, dim=16, hidden_dim=16, heads=2, kv_heads=1, head_dim=8, max_seq_len=8,
               layers=attn.Decoder.softmax_layers(1))
    d = attn.Decoder.random(cfg, seed=1)
    raises(TypeError, r"^tokens\[0\] must be an integer token id, got 3\.7", lambda: d.forward([3.7]))
    raises(ValueError, r"^ids\[0\] = 16 is not a token id in \[0, 16\)", lambda: d.logits([16]))  # Model.logits(ids)
    raises(TypeError, r"^pos must be an integer, got 0\.0", lambda: d.forward([1], 0.0))
    raises(TypeError, r"^all_logits must be True or False", lambda: d.forward([1], all_logits=None))
    raises(TypeError, r"^config must be a dict", lambda: attn.Decoder.random(None))
    raises(TypeError, r"^config must hold JSON values", lambda: attn.Decoder.random({**cfg, "dim": object()}))
    raises(TypeError, r"^dtype must be a str", lambda: attn.Decoder.random(cfg, dtype=None))
    raises(TypeError, r"^form must be a str", lambda: d.set_attention_form(None))
    raises(ValueError, r"^ratio: expected L:S", lambda: attn.Decoder.hybrid_layers(4, "a:b"))
    raises(TypeError, r"^path must be a path", lambda: d.save(None))
    d.save(str(tmp_path / "d.safetensors").encode())  # a bytes path is a path
    e = attn.Decoder.load(str(tmp_path / "d.safetensors").encode())
    assert np.array_equal(e.logits([1, 2, 3]), d.logits([1, 2, 3]))
    raises(TypeError, r"^mechanisms\[0\] must be a str", lambda: attn.Decoder.load(tmp_path / "d.safetensors", mechanisms=[None]))


# ---- 7: max_tokens and the other generate arguments, up front ----------------------------------

def test_max_tokens_is_checked_before_decoding(model):
    streamed = []
    for bad, kind, said in ((1e12, TypeError, r"^max_tokens must be an integer, got 1000000000000\.0"),
                            (2.0, TypeError, r"^max_tokens must be an integer"),
                            (None, TypeError, r"^max_tokens must be an integer"),
                            (10**12, ValueError, r"^max_tokens: 1000000000000 new tokens after a prompt of 3 exceed "
                                                 r"the context of 64 tokens \(at most 61\)"),
                            (62, ValueError, r"^max_tokens: 62 new tokens after a prompt of 3 exceed"),
                            (-1, ValueError, r"^max_tokens: must be >= 0, got -1"),
                            (2**70, ValueError, r"^max_tokens must be a 64-bit integer")):
        raises(kind, said, lambda: model.generate([10, 11, 12], max_tokens=bad, stream=streamed.append))
    assert streamed == []  # refused before the first token
    assert len(model.generate([10, 11, 12], max_tokens=61, stop=[])) == 61  # exactly the context
    for kw, kind, said in (({"temperature": "0.5"}, TypeError, r"^temperature must be a number"),
                           ({"temperature": -1.0}, ValueError, r"temperature must be a finite number >= 0"),
                           ({"top_p": None}, TypeError, r"^top_p must be a number"),
                           ({"top_p": 1.5}, ValueError, r"top_p must be in \(0, 1\]"),
                           ({"top_k": -1}, ValueError, r"top_k must be >= 0 \(0: off\), got -1"),
                           ({"top_k": 1.5}, TypeError, r"^top_k must be an integer"),
                           ({"min_p": 2.0}, ValueError, r"min_p must be in \[0, 1\] \(0: off\), got 2"),
                           ({"repeat_penalty": 0.0}, ValueError, r"repeat_penalty must be a finite number > 0 \(1: off\), got 0"),
                           ({"repeat_last_n": -2}, ValueError, r"repeat_last_n must be >= -1"),
                           ({"chat": 1}, TypeError, r"^chat must be True or False"),
                           ({"mechanism": b"softmax"}, TypeError, r"^mechanism must be a str or None"),
                           ({"stream": 5}, TypeError, r"^stream must be a callable or None")):
        raises(kind, said, lambda: model.generate("hello", max_tokens=2, **kw))


def test_generate_repeat_penalty_follows_llama_cpps_rule(model):
    """Greedy decoding with repeat_penalty: each distinct id among the last repeat_last_n tokens of
    the context has a positive logit divided by the penalty, a negative one multiplied."""
    prompt, n, penalty, last = [10, 11, 12, 10], 8, 3.0, 5
    got = model.generate(prompt, max_tokens=n, repeat_penalty=penalty, repeat_last_n=last, stop=[])
    ids = list(prompt)
    for _ in range(n):
        row = model.logits(ids)[-1].astype(np.float64)
        for t in set(ids[-last:]):
            row[t] = row[t] / penalty if row[t] > 0 else row[t] * penalty
        ids.append(int(np.argmax(row)))
    assert got == ids[len(prompt):]
    assert got != [10] * n == model.generate(prompt, max_tokens=n, stop=[])  # plain greedy repeats token 10
    assert model.generate(prompt, max_tokens=n, repeat_penalty=1.0, stop=[]) == model.generate(prompt, max_tokens=n, stop=[])
    # top_k=1 and min_p=1 keep only the most likely token: sampling is greedy
    greedy = model.generate(prompt, max_tokens=n, stop=[])
    assert model.generate(prompt, max_tokens=n, temperature=5.0, top_k=1, seed=3, stop=[]) == greedy
    assert model.generate(prompt, max_tokens=n, temperature=5.0, min_p=1.0, seed=3, stop=[]) == greedy


def test_cli_sampling_options_as_llama_cpp_spells_them(tiny, model):
    def run(*extra):
        p = subprocess.run([str(cli_path()), "generate", "--model", str(tiny[0]), "-p", "hello world", "--dtype", "f32",
                            "-c", "64", "-t", "1", "-q", *extra], capture_output=True, text=True, errors="replace",
                           timeout=HANG_SECONDS)
        assert p.returncode == 0, p.stderr
        return p.stdout
    greedy = run("-n", "8")
    assert greedy == "hello world" + model.generate("hello world", max_tokens=8) + "\n"
    assert run("--n-predict", "8", "--temp", "5", "--top-k", "1", "--seed", "3") == greedy
    assert run("--max-tokens", "8", "--temperature", "5", "--min-p", "1") == greedy
    assert run("-n", "8", "--repeat-penalty", "3", "--repeat-last-n", "5") == \
        "hello world" + model.generate("hello world", max_tokens=8, repeat_penalty=3.0, repeat_last_n=5) + "\n"
    assert run("-n", "8", "--temp", "0.9", "--top-k", "5", "--top-p", "0.9", "--min-p", "0.05", "--seed", "7") == \
        "hello world" + model.generate("hello world", max_tokens=8, temperature=0.9, top_k=5, top_p=0.9, min_p=0.05,
                                       seed=7) + "\n"


def test_cli_log_level_sets_what_stderr_says(tiny):
    def run(*args, stdin=None):
        return subprocess.run([str(cli_path()), *args], capture_output=True, text=True, errors="replace", input=stdin,
                              timeout=HANG_SECONDS)
    model = ["--model", str(tiny[0]), "--dtype", "f32", "-c", "64", "-t", "1"]
    info = run("generate", *model, "-p", "hello", "-n", "2")
    assert info.returncode == 0 and info.stderr.startswith("[prefill ") and "[debug]" not in info.stderr, info.stderr
    quiet = run("generate", *model, "-p", "hello", "-n", "2", "--log-level", "error")  # after the command too
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout == info.stdout, quiet.stderr
    chat = run("--log-level", "warn", "chat", "--model", str(tiny[0]), "-c", "1024", "-n", "2", stdin="hello\n")
    assert chat.returncode == 0 and chat.stderr == "", chat.stderr
    debug = run("--log-level", "debug", "generate", *model, "-p", "hello", "-n", "2")
    assert debug.returncode == 0 and debug.stdout == info.stdout, debug.stderr
    assert f"[debug] load {tiny[0]}: llama architecture" in debug.stderr and "tensors (F32 x " in debug.stderr, debug.stderr
    assert "[debug] dtype f32, activations auto, cache f32, repack yes, context 64 tokens; 1 threads, isa " in debug.stderr
    assert "[prefill " in debug.stderr
    bad = run("--log-level", "loud", "generate", *model, "-p", "hello")
    assert bad.returncode == 2 and "error: attn generate: --log-level: expected one of {error,warn,info,debug}, got 'loud'" in bad.stderr, \
        bad.stderr


def test_cli_max_tokens_goes_through_the_same_check(tiny):
    for command in (["generate", "--prompt", "hello world"], ["chat"]):
        p = subprocess.run([str(cli_path())] + command + ["--model", str(tiny[0]), "--max-context", "16",
                                                          "--max-tokens", "1000", "-q"],
                           capture_output=True, text=True, input="hello\n", timeout=HANG_SECONDS)
        assert p.returncode == 2 and f"error: attn {command[0]}: --max-tokens: 1000 new tokens after a prompt of" in p.stderr \
            and "exceed the context of 16 tokens" in p.stderr, (command, p.stderr)


def test_paths_and_options_of_load_model(tiny):
    raises(TypeError, r"^path must be a path \(str, bytes or os\.PathLike\), got 5", lambda: attn.load_model(5))
    raises(TypeError, r"^dtype must be a str", lambda: attn.load_model(tiny[0], dtype=5))  # None: as stored
    raises(TypeError, r"^threads must be an integer", lambda: attn.load_model(tiny[0], threads=1.0))
    raises(TypeError, r"^max_seq_len must be an integer", lambda: attn.load_model(tiny[0], max_seq_len=None))
    raises(TypeError, r"^mechanism must be a str or None", lambda: attn.load_model(tiny[0], mechanism=3))
    with pytest.raises(FileNotFoundError, match="path: no such file"):
        attn.load_model(b"/nonexistent/x.gguf")
    m = attn.load_model(str(tiny[0]).encode(), dtype="f32", threads=1)  # a bytes path is a path
    assert m.config["vocab_size"] == tiny[1]
    assert attn.Tokenizer.from_gguf(str(tiny[0]).encode()).vocab_size == tiny[1]
    raises(TypeError, r"^path must be a path", lambda: attn.Tokenizer.from_gguf(None))
    raises(TypeError, r"^messages must be a list", lambda: m.tokenizer.chat_prompt("hi"))
    raises(TypeError, r"^add_generation_prompt must be True or False",
           lambda: m.tokenizer.chat_prompt([{"role": "user", "content": "a"}], add_generation_prompt=None))
    raises(TypeError, r"^layer must be an integer", lambda: m.set_mechanism(None, layer=0.0))


# ---- 2c: one Model from many threads ------------------------------------------------------------

def test_one_model_from_many_threads_gives_the_single_threaded_results(model):
    """Model released the GIL and was not thread-safe: threads got each other's logits. A lock per
    Model serialises the calls; each result equals the one computed alone."""
    prompts = [[(7 * i + 13 * j) % 271 for j in range(24)] for i in range(12)]
    want_logits = [model.logits(p) for p in prompts]
    want_text = [model.generate(p, max_tokens=6, temperature=0.9, seed=i, stop=[]) for i, p in enumerate(prompts)]
    want_ppl = [model.perplexity(p)["nll"] for p in prompts]

    def work(i):
        p = prompts[i % len(prompts)]
        return (i, model.logits(p), model.generate(p, max_tokens=6, temperature=0.9, seed=i % len(prompts), stop=[]),
                model.perplexity(p)["nll"])

    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(work, range(96)))
    for i, logits, text, nll in results:
        j = i % len(prompts)
        assert np.array_equal(logits, want_logits[j]) and text == want_text[j] and np.array_equal(nll, want_ppl[j]), i


def test_a_stream_callback_may_not_reenter_its_model(model):
    with pytest.raises(RuntimeError, match="Model is already running a call on this thread"):
        model.generate([10, 11], max_tokens=3, stop=[], stream=lambda piece: model.logits([1]))
    assert model.logits([10, 11]).shape == (2, 271)  # the lock was released


def test_one_model_class_with_or_without_a_tokenizer():
    """attn.Decoder is attn.Model: a random model (no tokenizer) generates from ids, refuses text."""
    assert attn.Decoder is attn.Model and attn.llm.Decoder is attn.llm.Model
    cfg = dict(vocab_size=16, dim=16, hidden_dim=16, heads=2, kv_heads=1, head_dim=8, max_seq_len=16,
               layers=attn.Model.softmax_layers(2))
    m = attn.Model.random(cfg, seed=3)
    assert m.tokenizer is None and m.stop_ids() == [] and "random weights" in repr(m)
    z = m.logits([1, 2, 3])
    assert z.shape == (3, 16) and m.position == 3  # the context holds the ids: forward continues it
    nxt = m.forward([4])
    m.reset()
    assert np.array_equal(m.logits([1, 2, 3, 4])[-1:], nxt)
    out = m.generate([1, 2, 3], max_tokens=4)
    assert len(out) == 4 and all(0 <= t < 16 for t in out) and out == m.generate([1, 2, 3], max_tokens=4)
    assert out[0] == int(z[-1].argmax())
    raises(TypeError, r"^ids: this model has no tokenizer", lambda: m.logits("text"))
    raises(TypeError, r"^prompt: this model has no tokenizer", lambda: m.generate("text"))
    raises(TypeError, r"^stream: this model has no tokenizer", lambda: m.generate([1], stream=print))


def test_set_weight_names_a_bfloat16_tensor(model):
    torch = pytest.importorskip("torch")
    name = model.mlp_weight_names()[0]
    w = torch.from_numpy(model.weight(name)).bfloat16()
    raises(TypeError, r"^values must be a real dtype NumPy holds .*got torch\.bfloat16$",
           lambda: model.set_weight(name, w))


def test_cli_eval_ppl_default_set_runs_causally(tiny, tmp_path):
    """The default mechanisms are the ones that can score a text left to right: every row has a
    perplexity (Linformer, not causal, was in the set and could only answer n/a)."""
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    p = subprocess.run([str(cli_path()), "eval-ppl", "--model", str(tiny[0]), "--text", str(text), "--tokens", "200",
                        "-q", "--out", str(tmp_path / "ppl")], capture_output=True, text=True, timeout=HANG_SECONDS)
    assert p.returncode == 0, p.stderr
    import json
    rows = json.loads((tmp_path / "ppl.json").read_text())["rows"]
    assert len(rows) == 11 and all(r["perplexity"] is not None and math.isfinite(r["perplexity"]) for r in rows), rows
    assert all(attn.info(r["mechanism"].split("@")[0])["causal"] for r in rows), rows
