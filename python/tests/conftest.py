"""Shared oracles for the Python tests: literal torch implementations of every exact-attention
option (float64 for the oracle, the storage dtype for the 'plain' baseline of the tolerance rule).

Tolerance rule (as the C++ suite): max|ours - oracle64| <= 2 * max|plain - oracle64| + floor,
floor = 1e-6 * max(1, max|oracle|) plus, for half types, 2 * the dtype's rounding floor."""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import settings

import attn


# Seconds after which a child process (the CLI, python -m ...) counts as hung. Not a speed limit:
# far above what any call takes under ASan on a 2-core machine that other work shares (tests do
# not depend on wall time; this only turns a hang into a failure).
HANG_SECONDS = 1800

torch.set_num_threads(2)

# Hypothesis: the test command runs the derandomized profile (the same examples on every run, drawn
# from a seed derived from each test's name, so a failure in CI reproduces anywhere);
# ATTN_HYPOTHESIS_PROFILE=explore draws new examples each run (`--hypothesis-seed=N` replays one).
# Either way a failure prints the example and a @reproduce_failure blob.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", print_blob=True)
HYPOTHESIS_PROFILE = os.environ.get("ATTN_HYPOTHESIS_PROFILE", "ci")
settings.load_profile(HYPOTHESIS_PROFILE)


def pytest_report_header(config):
    seed = config.getoption("hypothesis_seed", None)
    how = ("derandomized: seeds derived from each test's name" if settings.default.derandomize
           else f"random, seed {seed}" if seed is not None else "random: replay a failure with --hypothesis-seed")
    return f"attn: hypothesis profile '{HYPOTHESIS_PROFILE}' ({how}); ISA paths {attn.supported_isas()}"


def bhnd(x, layout):
    return x.transpose(1, 2) if layout == "bnhd" else x


def literal_attention(q, k, v, *, causal=False, scale=None, window=(-1, -1), softcap=0.0, alibi=None,
                      mask=None, kv_len=None, cosine=False, entropy_m=0, dtype=torch.float64):
    """q (B,H,N,D), k/v (B,Hkv,M,D) torch tensors -> (out (B,H,N,Dv), lse (B,H,N)), computed in `dtype`.
    Causal and windows are bottom-right aligned; a row with no visible key gives 0 and lse -inf."""
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    B, H, N, D = q.shape
    M = k.shape[2]
    g = H // k.shape[1]
    k = k.repeat_interleave(g, dim=1)
    v = v.repeat_interleave(g, dim=1)
    i = torch.arange(N).view(N, 1)
    j = torch.arange(M).view(1, M)
    diag = i + (M - N)
    visible = torch.ones(N, M, dtype=torch.bool)
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if left >= 0:
        visible &= j >= diag - left
    if right >= 0:
        visible &= j <= diag + right
    visible = visible.expand(B, H, N, M).clone()
    if kv_len is not None:
        for b, n in enumerate(kv_len):
            visible[b, :, :, n:] = False
    if mask is not None and mask.dtype == torch.bool:
        visible &= mask.expand(B, H, N, M)
    if cosine:
        q = q / q.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        k = k / k.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    s = q @ k.transpose(-1, -2)
    base = (1.0 / math.sqrt(D)) if scale is None else scale
    row_scale = torch.full((B, H, N, 1), base, dtype=torch.float64)
    if entropy_m:
        n_vis = visible.sum(-1, keepdim=True).to(torch.float64)
        row_scale = torch.where(n_vis > 1, base * torch.log(n_vis.clamp_min(1)) / math.log(entropy_m),
                                torch.zeros_like(n_vis))
    s = s * row_scale.to(dtype)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if alibi is not None:
        slopes = torch.as_tensor(alibi, dtype=dtype).reshape(-1)
        slopes = slopes.view(1, H, 1, 1) if slopes.numel() == H else slopes.view(B, H, 1, 1)
        s = s - slopes * (diag - j).abs().to(dtype)
    if mask is not None and mask.dtype != torch.bool:
        s = s + mask.to(dtype)
    s = s.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    out = (p @ v)
    return out, lse


def rounding_floor(ref: torch.Tensor, dtype) -> float:
    if dtype == torch.float32:
        return 0.0
    r = ref.to(dtype)
    return 2 * ((r + 0.3).to(dtype) - 0.3).to(dtype).double().sub(ref).abs().max().item()


# bfloat16/float16 outputs: every element within HALF_ULPS units in the last place of the storage
# dtype at its float64 value, beyond the float32 floor (docs/testing.md; harness::kHalfUlps)
HALF_ULPS = 0.6


def ulp(x64: torch.Tensor, dtype) -> torch.Tensor:
    """One unit in the last place of `dtype` at |x64| (its subnormal spacing below the normal range)."""
    mantissa, min_exp = {torch.bfloat16: (7, -126), torch.float16: (10, -14), torch.float32: (23, -126)}[dtype]
    _, e = torch.frexp(x64.double().abs())  # |x| = m 2^e, m in [0.5, 1): the binade is 2^(e - 1)
    return torch.pow(2.0, (e - 1).clamp(min=min_exp).double() - mantissa)


def assert_half_ulps(ours, oracle64, dtype, what="out"):
    """Each element of a bfloat16/float16 result within HALF_ULPS ulps of the float64 oracle."""
    if dtype not in (torch.bfloat16, torch.float16):
        return
    ours, oracle64 = torch.as_tensor(ours).double(), torch.as_tensor(oracle64).double()
    if not ours.numel():
        return
    floor32 = 1e-6 * max(1.0, oracle64.abs().max().item())
    ulps = ((ours - oracle64).abs() - floor32) / ulp(oracle64, dtype)
    worst = int(ulps.argmax())
    assert ulps.max().item() <= HALF_ULPS, (
        f"{what}: element {tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), ours.shape))} = "
        f"{ours.flatten()[worst].item():.6g}, oracle {oracle64.flatten()[worst].item():.6g}: "
        f"{ulps.max().item():.3g} {dtype} ulps > {HALF_ULPS}")


def assert_rule(ours, oracle64, plain, dtype, what="out", per_element=True):
    """The max-error rule, then (per_element) each element within HALF_ULPS ulps of a half dtype.
    per_element=False for results whose weights P were rounded to bf16 (precision bf16, the default
    for bfloat16 inputs): a rounded weight moves an output that cancels to ~0 by many of its ulps,
    so per-element ulps do not apply there (as in the C++ case list); the max-error rule does."""
    ours = torch.as_tensor(ours).double()
    oracle64 = torch.as_tensor(oracle64).double()
    plain = torch.as_tensor(plain).double()
    assert torch.isfinite(ours).all(), f"{what}: non-finite values"
    err = (ours - oracle64).abs().max().item() if ours.numel() else 0.0
    plain_err = (plain - oracle64).abs().max().item() if ours.numel() else 0.0
    floor = 1e-6 * max(1.0, oracle64.abs().max().item() if ours.numel() else 1.0) + rounding_floor(oracle64, dtype)
    assert err <= 2 * plain_err + floor, f"{what}: error {err:.3g} > 2 * plain {plain_err:.3g} + {floor:.3g}"
    if per_element:
        assert_half_ulps(ours, oracle64, dtype, what)


def cli_path() -> Path:
    p = os.environ.get("ATTN_CLI")
    path = Path(p) if p else Path(__file__).resolve().parents[2] / "build" / "release" / "attn"
    if not path.exists():
        raise FileNotFoundError(f"attn CLI not found at {path}; build it (cmake --preset release) or set ATTN_CLI")
    return path


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
