"""precision= (attn::AttendOptions::precision): the arithmetic of exact softmax attention's products.

"auto" (the default) computes in bf16 when q, k and v are all bfloat16, "f32" in float32, "bf16"
rounds the operands to bf16 and sums bf16 products in float32 (the form tiled_bf16)."""
import subprocess

import numpy as np
import pytest
import torch

import attn
from conftest import HANG_SECONDS, cli_path


def _qkv(dtype=torch.float32, shape=(2, 4, 200, 64), seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(shape, generator=g).to(dtype) for _ in range(3))


def _chosen(text):
    return text.splitlines()[0].split("runs form ")[1].strip("'")


def test_auto_computes_bf16_inputs_in_bf16():
    q, k, v = _qkv(torch.bfloat16)
    assert _chosen(attn.explain(q, k, v, layout="bhnd")) == "tiled_bf16"
    assert _chosen(attn.explain(q, k, v, layout="bhnd", precision="auto")) == "tiled_bf16"
    assert _chosen(attn.explain(q, k, v, layout="bhnd", precision="f32")) == "tiled"
    q32, k32, v32 = (x.float() for x in (q, k, v))  # auto on float32 inputs: float32
    assert _chosen(attn.explain(q32, k32, v32, layout="bhnd")) == "tiled"
    assert _chosen(attn.explain(q32, k32, v32, layout="bhnd", precision="bf16")) == "tiled_bf16"
    # explain tells what attend runs: auto on bf16 inputs is precision bf16, f32 differs from it
    auto = attn.attend(q, k, v, layout="bhnd")
    assert torch.equal(auto, attn.attend(q, k, v, layout="bhnd", precision="bf16"))
    assert auto.dtype == torch.bfloat16


def test_attention_takes_precision():
    q, k, v = _qkv(torch.bfloat16, shape=(1, 100, 2, 32), seed=6)
    auto = attn.attention(q, k, v, causal=True)
    assert torch.equal(auto, attn.attend(q, k, v, "softmax:causal", precision="bf16"))
    f32 = attn.attention(q, k, v, causal=True, precision="f32")
    assert torch.equal(f32, attn.attend(q, k, v, "softmax:causal", precision="f32"))
    with pytest.raises(ValueError, match=r"precision: expected auto, f32 or bf16, got 'fp8'"):
        attn.attention(q, k, v, precision="fp8")


def test_bf16_rounds_float32_operands():
    """float32 inputs with precision bf16 are bitwise the call on the inputs rounded to bf16."""
    q, k, v = _qkv(shape=(2, 4, 200, 64), seed=1)
    rounded = tuple(x.to(torch.bfloat16).to(torch.float32) for x in (q, k, v))
    for mech in ("softmax", "softmax:causal"):
        out, lse = attn.attend(q, k, v, mech, layout="bhnd", precision="bf16", return_lse=True)
        out_r, lse_r = attn.attend(*rounded, mech, layout="bhnd", precision="bf16", return_lse=True)
        assert out.dtype == torch.float32
        assert torch.equal(out, out_r), mech
        assert torch.equal(lse, lse_r), mech


def _plain_bf16(q, k, v):
    """A plain bf16 implementation: float32 scores of bf16 operands, P rounded to bf16, P V in float32."""
    qb, kb, vb = (x.to(torch.bfloat16).float() for x in (q, k, v))
    p = torch.softmax((qb @ kb.transpose(-1, -2)) / q.shape[-1] ** 0.5, dim=-1)
    return p.to(torch.bfloat16).float() @ vb


def test_bf16_error_is_bounded_by_a_plain_bf16_implementation():
    q, k, v = (x.to(torch.bfloat16).to(torch.float32) for x in _qkv(shape=(2, 4, 200, 64), seed=2))
    q64, k64, v64 = (x.double() for x in (q, k, v))
    ref = torch.softmax((q64 @ k64.transpose(-1, -2)) / q.shape[-1] ** 0.5, dim=-1) @ v64
    ours = attn.attend(q, k, v, layout="bhnd", precision="bf16").double()
    plain = _plain_bf16(q, k, v).double()
    err, plain_err = (ours - ref).abs().max().item(), (plain - ref).abs().max().item()
    assert err <= 2 * plain_err + 1e-3, (err, plain_err)
    f32 = attn.attend(q, k, v, layout="bhnd", precision="f32").double()
    assert (f32 - ref).abs().max().item() < 1e-5  # and f32 really is float32 arithmetic


def test_precision_errors():
    q, k, v = _qkv(shape=(1, 2, 16, 8))
    with pytest.raises(ValueError, match=r"precision: expected auto, f32 or bf16, got 'fp8'"):
        attn.attend(q, k, v, precision="fp8")
    with pytest.raises(ValueError, match=r"precision: expected auto, f32 or bf16, got 'fp8'"):
        attn.explain(q, k, v, precision="fp8")
    with pytest.raises(TypeError, match="precision"):
        attn.attend(q, k, v, precision=3)
    with pytest.raises(TypeError, match="precision"):
        attn.explain(q, k, v, precision=3)
    with pytest.raises(ValueError, match="computes in float32 only"):
        attn.attend(q, k, v, "linear:map=elu", precision="bf16")
    with pytest.raises(ValueError, match="computes in float32 only"):
        attn.linear_attention(q, k, v, precision="bf16")
    o, _ = attn.linear_attention(q, k, v, precision="f32")
    assert torch.equal(o, attn.linear_attention(q, k, v)[0])


def test_backward_takes_precision():
    q, k, v = _qkv(shape=(1, 16, 2, 8), seed=3)
    out, lse = attn.attend(q, k, v, "softmax:causal", return_lse=True)
    dout = torch.ones_like(out)
    grads = attn.attend_backward(dout, q, k, v, out, lse, "softmax:causal")
    for p in ("auto", "f32"):  # float32 inputs: auto is f32
        for a, b in zip(grads, attn.attend_backward(dout, q, k, v, out, lse, "softmax:causal", precision=p)):
            assert torch.equal(a, b), p
    with pytest.raises(ValueError, match=r"precision: expected auto, f32 or bf16, got 'fp8'"):
        attn.attend_backward(dout, q, k, v, out, lse, "softmax:causal", precision="fp8")
    with pytest.raises(TypeError, match="precision"):
        attn.attend_backward(dout, q, k, v, out, lse, "softmax:causal", precision=b"bf16")


def test_autograd_path_takes_precision():
    """attend with tensors that require grad takes precision like the plain path: its gradients are
    those attend_backward gives with the same precision (bf16 products on float32 inputs here)."""
    q, k, v = (x.requires_grad_() for x in _qkv(shape=(1, 2, 70, 32), seed=4))
    for p in ("bf16", "f32"):
        out = attn.attend(q, k, v, "softmax:causal", layout="bhnd", precision=p)
        dout = torch.randn_like(out)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
        with torch.no_grad():
            ref, lse = attn.attend(q, k, v, "softmax:causal", layout="bhnd", precision=p, return_lse=True)
            assert torch.equal(out, ref), p
            g = attn.attend_backward(dout, q, k, v, ref, lse, "softmax:causal", layout="bhnd", precision=p)
        for got, want in zip((dq, dk, dv), g):
            assert torch.equal(got, torch.as_tensor(want)), p


def _save(tmp_path, **arrays):
    for name, x in arrays.items():
        np.save(tmp_path / f"{name}.npy", x)
    return [str(cli_path()), "run", "--layout", "bhnd", "--q", str(tmp_path / "q.npy"), "--k", str(tmp_path / "k.npy"),
            "--v", str(tmp_path / "v.npy")]


def test_cli_run_precision(tmp_path):
    q, k, v = (x.numpy() for x in _qkv(shape=(1, 2, 70, 32), seed=5))
    base = _save(tmp_path, q=q, k=k, v=v)
    for p in ("bf16", "f32", "auto"):
        out = tmp_path / f"o_{p}.npy"
        subprocess.run(base + ["-m", "softmax:causal", "--precision", p, "--out", str(out)], check=True,
                       capture_output=True, timeout=HANG_SECONDS)
        want = attn.attend(q, k, v, "softmax:causal", layout="bhnd", precision=p)
        assert np.array_equal(np.load(out), want), p
    assert not np.array_equal(np.load(tmp_path / "o_bf16.npy"), np.load(tmp_path / "o_f32.npy"))
    explained = subprocess.run(base + ["--precision", "bf16", "--explain"], capture_output=True, text=True,
                               timeout=HANG_SECONDS)
    assert explained.returncode == 0 and "runs form 'tiled_bf16'" in explained.stdout
    bad = subprocess.run(base + ["--precision", "fp8", "--out", str(tmp_path / "x.npy")], capture_output=True,
                         text=True, timeout=HANG_SECONDS)
    assert bad.returncode == 2 and "--precision" in bad.stderr and "'fp8'" in bad.stderr, bad.stderr
    assert not (tmp_path / "x.npy").exists()
    linear = subprocess.run(base + ["-m", "linear:map=elu", "--precision", "bf16", "--out", str(tmp_path / "x.npy")],
                            capture_output=True, text=True, timeout=HANG_SECONDS)
    assert linear.returncode == 2 and "computes in float32 only" in linear.stderr, linear.stderr
    assert not (tmp_path / "x.npy").exists()
