"""attn.distributed under mpirun: a script (distributed_scripts/check_distributed.py) runs on 1-4
ranks and saves its unsharded results; each must equal the single-process call on the whole
inputs (attn.attention / attn.linear_attention, and torch's SDPA where it has the thing)."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import attn
from attn import _attn
from conftest import HANG_SECONDS, cli_path

SCRIPT = os.path.join(os.path.dirname(__file__), "distributed_scripts", "check_distributed.py")
MPIRUN = shutil.which("mpirun")


def test_without_mpi_the_error_names_what_to_install(monkeypatch):
    monkeypatch.setattr(_attn, "has_mpi", False)  # as a build without MPI says it
    with pytest.raises(RuntimeError, match="openmpi-bin libopenmpi-dev"):
        attn.distributed.attention(np.zeros((1, 2, 1, 4), np.float32), np.zeros((1, 2, 1, 4), np.float32),
                                   np.zeros((1, 2, 1, 4), np.float32))


def test_shard_pieces():
    # zig-zag: rank r holds pieces r and 2R-1-r; 10 tokens in 6 pieces: lengths 2,2,2,2,1,1
    assert attn.distributed.shard_pieces(10, 3, 0, causal=True) == [(0, 2), (9, 1)]
    assert attn.distributed.shard_pieces(10, 3, 2, causal=True) == [(4, 2), (6, 2)]
    assert attn.distributed.shard_pieces(2, 4, 3) == [(2, 0)]
    for n in (0, 1, 7, 16):
        for ranks in (1, 3, 4):
            for causal in (False, True):
                covered = sorted(p for r in range(ranks) for p in attn.distributed.shard_pieces(n, ranks, r, causal))
                tokens = [t for s, length in covered for t in range(s, s + length)]
                assert tokens == list(range(n))
    # the one rule is C++'s (attn/shards.hpp): its checks, named
    with pytest.raises(ValueError, match=r"rank must be in \[0, 3\), got 3"):
        attn.distributed.shard_pieces(10, 3, 3)
    with pytest.raises(ValueError, match="n must be >= 0, got -1"):
        attn.distributed.shard_pieces(-1, 3, 0)
    with pytest.raises(TypeError, match="causal must be True or False"):
        attn.distributed.shard_pieces(10, 3, 0, causal=1)


def run_script(ranks, tmp_path_factory, *extra):
    """The check script under mpirun on `ranks` ranks: (ranks, its arrays)."""
    if MPIRUN is None:
        pytest.skip("mpirun is not installed (Debian: apt-get install openmpi-bin libopenmpi-dev)")
    if not _attn.has_mpi:
        pytest.skip("attn was built without MPI")
    path = tmp_path_factory.mktemp("dist") / "out.npz"
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(attn.__file__)),
                                           os.environ.get("PYTHONPATH", "")]))
    cmd = [MPIRUN, "-np", str(ranks), "--oversubscribe", "--allow-run-as-root", sys.executable, SCRIPT, str(path), *extra]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=HANG_SECONDS)
    assert run.returncode == 0, run.stdout + run.stderr
    return ranks, dict(np.load(path))


@pytest.fixture(scope="module", params=[1, 2, 3, 4])
def results(request, tmp_path_factory):
    return run_script(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def torch_results(tmp_path_factory):
    """Torch inputs on 2 ranks only: importing torch costs seconds per rank."""
    return run_script(2, tmp_path_factory, "--torch")


CASES = {"noncausal_n13": (False, (-1, -1)), "causal_n11": (True, (-1, -1)), "causal_n1": (True, (-1, -1)),
         "causal_n3": (True, (-1, -1)), "window_n17": (True, (4, 0)), "window2_n10": (False, (2, 3))}


@pytest.mark.parametrize("name", CASES)
def test_attention_equals_single_process(results, name):
    ranks, r = results
    causal, window = CASES[name]
    q, k, v = r[name + "_q"], r[name + "_k"], r[name + "_v"]
    want, lse = attn.attention(q, k, v, causal=causal, window_size=window, return_lse=True)
    # The float32 tolerance: 1e-5 on outputs of magnitude <= ~3 and on the log-sum-exp
    np.testing.assert_allclose(r[name], want, rtol=0, atol=1e-5, err_msg=f"{name} on {ranks} ranks")
    np.testing.assert_allclose(r[name + "_lse"], lse, rtol=0, atol=1e-5)
    if window == (-1, -1):  # torch's SDPA on the whole sequence (N = M: causal alignments agree)
        t = lambda x: torch.from_numpy(x).transpose(1, 2)  # noqa: E731
        ref = torch.nn.functional.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=causal,
                                                               enable_gqa=True).transpose(1, 2)
        np.testing.assert_allclose(r[name], ref.numpy(), rtol=0, atol=1e-5)


def test_attention_backward_equals_single_process(results):
    ranks, r = results
    q, k, v, dout = r["bwd_q"], r["bwd_k"], r["bwd_v"], r["bwd_dout"]
    mech = "softmax:causal,window=6:0"
    out, lse = attn.attention(q, k, v, causal=True, window_size=(6, 0), return_lse=True)
    dq, dk, dv = attn.attend_backward(dout, q, k, v, out, lse, mech)
    for name, want in (("dq", dq), ("dk", dk), ("dv", dv)):
        np.testing.assert_allclose(r["bwd_" + name], want, rtol=0, atol=2e-5, err_msg=f"{name} on {ranks} ranks")
    # and against torch autograd through SDPA (no window there: a windowed mask by hand)
    t = lambda x: torch.from_numpy(x).transpose(1, 2).requires_grad_()  # noqa: E731
    tq, tk, tv = t(q), t(k), t(v)
    n = q.shape[1]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    mask = torch.from_numpy((j <= i) & (j >= i - 6))
    o = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask, enable_gqa=True)
    o.backward(torch.from_numpy(dout).transpose(1, 2))
    np.testing.assert_allclose(r["bwd_dk"], tk.grad.transpose(1, 2).numpy(), rtol=0, atol=5e-5)


def test_attention_varlen_equals_flash_attn_varlen_func(results):
    ranks, r = results
    cu = np.array([0, 4, 4, 13, 21], dtype=np.int32)
    want = attn.flash_attn_varlen_func(r["varlen_q"][0], r["varlen_k"][0], r["varlen_v"][0], cu, cu, 9, 9,
                                       causal=True, window_size=(5, 0))
    np.testing.assert_allclose(r["varlen"][0], want, rtol=0, atol=1e-5, err_msg=f"varlen on {ranks} ranks")


def test_attention_torch_bhnd(torch_results):
    ranks, r = torch_results
    q, k, v = r["torch_bhnd_q"], r["torch_bhnd_k"], r["torch_bhnd_v"]
    want = attn.attention(q, k, v, causal=True)
    np.testing.assert_allclose(r["torch_bhnd"].transpose(0, 2, 1, 3), want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("name,kw", [("linear_elu", {}), ("linear_decay", {"decay": 0.9}),
                                     ("linear_noncausal", {"causal": False})])
def test_linear_attention_equals_single_process(results, name, kw):
    ranks, r = results
    want, state = attn.linear_attention(r[name + "_q"], r[name + "_k"], r[name + "_v"], output_final_state=True, **kw)
    np.testing.assert_allclose(r[name], want, rtol=0, atol=2e-5, err_msg=f"{name} on {ranks} ranks")
    np.testing.assert_allclose(r[name + "_state"], state, rtol=1e-5, atol=1e-4)
    assert r[name + "_state_same"], "every rank returns the same final state"


def test_linear_attention_backward_equals_single_process(results):
    ranks, r = results
    q, k, v, dout = r["lbwd_q"], r["lbwd_k"], r["lbwd_v"], r["lbwd_dout"]
    o, state = attn.linear_attention(q, k, v, decay=0.95, output_final_state=True)
    want = attn.attend_backward(dout, q, k, v, o, None, "linear:map=elu,causal,decay=0.95", dfinal_state=r["lbwd_dfinal"])
    for name, w in zip(("dq", "dk", "dv"), want[:3]):
        np.testing.assert_allclose(r["lbwd_" + name], w, rtol=0, atol=5e-5, err_msg=f"{name} on {ranks} ranks")


@pytest.mark.parametrize("m", [9, 2])
def test_decode_equals_single_process(results, m):
    ranks, r = results
    want = attn.attention(r[f"decode{m}_q"], r[f"decode{m}_k"], r[f"decode{m}_v"])
    np.testing.assert_allclose(r[f"decode{m}"], want, rtol=0, atol=1e-5, err_msg=f"M={m} on {ranks} ranks")
    assert r[f"decode{m}_same"], "every rank gets the same bits"


def test_arguments_follow_the_rest_of_the_api(results):
    # no float read as an int, no string as a flag, no silent cast of ints or lists, no crash on COMM_NULL
    _, r = results
    assert list(r["arg_errors"]) == [
        "TypeError: window_size[0] must be an integer, got 1.7 (float)",
        "TypeError: causal must be True or False, got 'no' (str)",
        "TypeError: q must hold floats, got int32",
        "TypeError: q must be a numpy.ndarray or torch.Tensor, got list",
        "ValueError: comm must be a communicator of ranks, got MPI.COMM_NULL",
        "TypeError: comm must be an mpi4py communicator (MPI.Comm) or None, got object",
        "ValueError: comm must be a communicator of ranks, got MPI.COMM_NULL",
        "TypeError: return_lse must be True or False, got 1 (int)"]


def test_comm_that_is_no_communicator_is_named_by_every_function(results):
    _, r = results
    assert list(r["comm_errors"]) == ["TypeError: comm must be an mpi4py communicator (MPI.Comm) or None, got object"] * 7


@pytest.mark.parametrize("name,rank0,last", [
    ("linear", "linear:map=elu,causal", "linear:map=relu,causal"),
    ("linear_backward", "linear:map=elu,causal", "linear:map=elu,causal,decay=0.5"),
    ("ring", "softmax", "softmax:scale=0.25")])
def test_a_mechanism_that_differs_between_ranks_is_named_by_its_text(results, name, rank0, last):
    # before (LASP): "the mechanism (fingerprint) must agree on every rank: rank 0 has 4840...,
    # rank 1 has -7362...", two hashes; the ring said only "rank 1's differs from rank 0's"
    ranks, r = results
    errors = list(r[f"mismatch_{name}"])
    if ranks == 1:
        assert errors == [""]
        return
    assert len(set(errors)) == 1, errors
    assert errors[0].startswith("ValueError: attn.distributed.") and "the mechanism differs between ranks: rank 0 has " \
        f"'{attn.canonical_mechanism(rank0)}', rank {ranks - 1} has '{attn.canonical_mechanism(last)}'" in errors[0], errors


def test_a_python_level_refusal_on_one_rank_fails_every_rank(results):
    ranks, r = results
    errors = list(r["mismatch_refused"])
    refusal = "TypeError: causal must be True or False, got 'no' (str)"
    if ranks == 1:
        assert errors == [""]
        return
    assert errors[-1] == refusal, errors  # the rank that was given it raises it as ever
    assert errors[:-1] == [f"ValueError: attn.distributed.attention: rank {ranks - 1} refused its arguments ({refusal}), "
                           "so no rank runs the call"] * (ranks - 1), errors


def test_tensors_that_require_grad_are_named_in_a_warning(torch_results):
    # before: detached without a word
    _, r = torch_results
    warned = list(r["grad_warnings"])
    assert [w.split(":")[1].strip() for w in warned] == ["attn"] * 3, warned
    for name, w in zip("qkv", warned):
        assert w.startswith(f"RuntimeWarning: attn: {name} requires grad, but attn.distributed's functions have no "
                            f"backward pass yet") and w.endswith("check_distributed.py"), w


def test_disagreeing_shard_is_the_same_error_everywhere(results):
    ranks, r = results
    errors = list(r["errors"])
    if ranks == 1:
        assert errors == [""]  # one rank: nothing to disagree with (head dim 4 is fine on its own)
        return
    assert len(set(errors)) == 1, errors
    assert f"head dim must agree on every rank: rank 0 has 8, rank {ranks - 1} has 4" in errors[0]


@pytest.mark.parametrize("mechanism,causal,window", [("softmax:causal,window=4:0", True, (4, 0)), ("softmax", False, (-1, -1))])
def test_cli_run_distributed_writes_the_whole_output(tmp_path, mechanism, causal, window):
    if MPIRUN is None:
        pytest.skip("mpirun is not installed (Debian: apt-get install openmpi-bin libopenmpi-dev)")
    if not _attn.has_mpi:
        pytest.skip("attn was built without MPI")
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 13, 4, 8), dtype=np.float32) for _ in range(3))
    for name, x in zip("qkv", (q, k, v)):
        np.save(tmp_path / f"{name}.npy", x)
    cmd = [MPIRUN, "-np", "3", "--oversubscribe", "--allow-run-as-root", str(cli_path()), "run", "--distributed",
           "-m", mechanism, "--layout", "bnhd", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy",
           "--lse", "l.npy"]
    run = subprocess.run(cmd, cwd=tmp_path, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                         timeout=HANG_SECONDS)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "distributed over 3 ranks" in run.stdout
    want, lse = attn.attention(q, k, v, causal=causal, window_size=window, return_lse=True)
    np.testing.assert_allclose(np.load(tmp_path / "o.npy"), want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.load(tmp_path / "l.npy"), lse, rtol=0, atol=1e-5)
