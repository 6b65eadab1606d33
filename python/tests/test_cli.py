"""The attn CLI reads and writes .npy files and agrees with the Python module."""
import subprocess

import numpy as np

import attn
from conftest import cli_path


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
