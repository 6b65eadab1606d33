"""Run under mpirun by python/tests/test_distributed.py: every rank builds the same whole inputs,
runs attn.distributed on its shards, and rank 0 saves the unsharded results (and every rank's
error messages) to the .npz named on the command line, for the test to compare with the
single-process calls."""
import sys

import numpy as np

import attn
from attn import distributed as dist
from mpi4py import MPI

comm = MPI.COMM_WORLD
out = {}
rng = np.random.default_rng(42)


def inputs(n, h=4, hkv=2, d=8, dv=6, b=2):
    return (rng.standard_normal((b, n, h, d), dtype=np.float32), rng.standard_normal((b, n, hkv, d), dtype=np.float32),
            rng.standard_normal((b, n, hkv, dv), dtype=np.float32))


cases = {"noncausal_n13": (13, False, (-1, -1)), "causal_n11": (11, True, (-1, -1)), "causal_n1": (1, True, (-1, -1)),
         "causal_n3": (3, True, (-1, -1)), "window_n17": (17, True, (4, 0)), "window2_n10": (10, False, (2, 3))}
for name, (n, causal, window) in cases.items():
    q, k, v = inputs(n)
    out[name + "_q"], out[name + "_k"], out[name + "_v"] = q, k, v
    sq, sk, sv = (dist.shard(x, comm, causal=causal) for x in (q, k, v))
    y, lse = dist.attention(sq, sk, sv, comm, causal=causal, window_size=window, return_lse=True)
    out[name] = dist.unshard(y, comm, causal=causal)
    out[name + "_lse"] = dist.unshard(lse[..., None], comm, causal=causal, layout="bhnd")[..., 0]

# the ring's backward (causal, GQA, a window): gradients unsharded
q, k, v = inputs(15)
dout = rng.standard_normal((2, 15, 4, 6), dtype=np.float32)
sh = [dist.shard(x, comm, causal=True) for x in (q, k, v, dout)]
y, lse = dist.attention(*sh[:3], comm, causal=True, window_size=(6, 0), return_lse=True)
dq, dk, dv = dist.attention_backward(sh[3], *sh[:3], y, lse, comm, causal=True, window_size=(6, 0))
out["bwd_q"], out["bwd_k"], out["bwd_v"], out["bwd_dout"] = q, k, v, dout
out["bwd_dq"], out["bwd_dk"], out["bwd_dv"] = (dist.unshard(g, comm, causal=True) for g in (dq, dk, dv))

# packed sequences (varlen), causal with a window inside each sequence
cu = [0, 4, 4, 13, 21]
q, k, v = inputs(21, b=1)
y = dist.attention(*(dist.shard(x, comm, causal=True) for x in (q, k, v)), comm, causal=True, window_size=(5, 0),
                   cu_seqlens=cu)
out["varlen"], out["varlen_q"], out["varlen_k"], out["varlen_v"] = dist.unshard(y, comm, causal=True), q, k, v

# layout bhnd and torch tensors (only when asked: importing torch costs seconds per rank)
q, k, v = inputs(9)
if "--torch" in sys.argv:
    import torch
    qt, kt, vt = (torch.from_numpy(np.ascontiguousarray(x.transpose(0, 2, 1, 3))) for x in (q, k, v))
    y = dist.attention(*(dist.shard(x, comm, causal=True, layout="bhnd") for x in (qt, kt, vt)), causal=True,
                       layout="bhnd")
    assert isinstance(y, torch.Tensor), type(y)
    out["torch_bhnd_q"], out["torch_bhnd_k"], out["torch_bhnd_v"] = q, k, v
    out["torch_bhnd"] = dist.unshard(y, comm, causal=True, layout="bhnd").numpy()

for name, (n, kw) in {"linear_elu": (14, {}), "linear_decay": (7, {"decay": 0.9}),
                      "linear_noncausal": (5, {"causal": False})}.items():
    q, k, v = inputs(n, h=2, hkv=2)
    out[name + "_q"], out[name + "_k"], out[name + "_v"] = q, k, v
    o, state = dist.linear_attention(dist.shard(q, comm), dist.shard(k, comm), dist.shard(v, comm), comm, **kw)
    out[name] = dist.unshard(o, comm)
    states = comm.allgather(state)
    out[name + "_state"] = state
    out[name + "_state_same"] = np.array(all(np.array_equal(s, state) for s in states))

# linear attention's backward (causal, decay, a final-state gradient)
q, k, v = inputs(12, h=2, hkv=2)
dout = rng.standard_normal((2, 12, 2, 6), dtype=np.float32)
dfinal = rng.standard_normal((2, 2, 8, 7), dtype=np.float32)
g = dist.linear_attention_backward(*(dist.shard(x, comm) for x in (dout, q, k, v)), comm, decay=0.95,
                                   dfinal_state=dfinal)
out["lbwd_q"], out["lbwd_k"], out["lbwd_v"], out["lbwd_dout"], out["lbwd_dfinal"] = q, k, v, dout, dfinal
out["lbwd_dq"], out["lbwd_dk"], out["lbwd_dv"] = (dist.unshard(x, comm) for x in g)

# decode: the same q everywhere, the cache sharded (some ranks hold none when M < ranks)
for m in (9, 2):
    q, k, v = inputs(1)
    kc, vc = inputs(m)[1:]
    y = dist.decode(q, dist.shard(kc, comm), dist.shard(vc, comm), comm)
    ys = comm.allgather(y)
    out[f"decode{m}"], out[f"decode{m}_q"], out[f"decode{m}_k"], out[f"decode{m}_v"] = y, q, kc, vc
    out[f"decode{m}_same"] = np.array(all(np.array_equal(x, y) for x in ys))

# arguments the rest of the Python API refuses, refused here too (before any rank communicates)
q, k, v = inputs(8)
sq, sk, sv = (dist.shard(x, comm) for x in (q, k, v))
arg_errors = []
for call in (lambda: dist.attention(sq, sk, sv, comm, window_size=(1.7, 0)),
             lambda: dist.attention(sq, sk, sv, comm, causal="no"),
             lambda: dist.attention(sq.astype(np.int32), sk, sv, comm),
             lambda: dist.attention(sq.tolist(), sk, sv, comm),
             lambda: dist.attention(sq, sk, sv, MPI.COMM_NULL),
             lambda: dist.decode(sq, sk, sv, object()),
             lambda: dist.linear_attention(sq, sk, sv, MPI.COMM_NULL),
             lambda: dist.attention(sq, sk, sv, comm, return_lse=1)):
    try:
        call()
        arg_errors.append("no error")
    except (TypeError, ValueError) as e:
        arg_errors.append(f"{type(e).__name__}: {e}")
out["arg_errors"] = np.array(arg_errors)

# comm that is no communicator, for every function: a TypeError naming comm (not "'object' has no attribute 'py2f'")
comm_errors = []
for call in (lambda c: dist.shard(q, c), lambda c: dist.unshard(sq, c), lambda c: dist.attention(sq, sk, sv, c),
             lambda c: dist.attention_backward(sq, sq, sk, sv, sq, sq[..., 0], c),
             lambda c: dist.linear_attention(sq, sk, sv, c), lambda c: dist.linear_attention_backward(sq, sq, sk, sv, c),
             lambda c: dist.decode(sq, sk, sv, c)):
    try:
        call(object())
        comm_errors.append("no error")
    except TypeError as e:
        comm_errors.append(f"{type(e).__name__}: {e}")
out["comm_errors"] = np.array(comm_errors)

# a mechanism that differs on the last rank: every rank names both texts (C++ compares fingerprints only)
q, k, v = inputs(8, h=2, hkv=2)
sq, sk, sv = (dist.shard(x, comm) for x in (q, k, v))
last = comm.rank == comm.size - 1 and comm.size > 1
gathered = {}
for name, call in (("linear", lambda: dist.linear_attention(sq, sk, sv, comm, feature_map="relu" if last else "elu")),
                   ("linear_backward", lambda: dist.linear_attention_backward(sv, sq, sk, sv, comm,
                                                                              decay=0.5 if last else None)),
                   ("ring", lambda: dist.attention(sq, sk, sv, comm, softmax_scale=0.25 if last else None)),
                   # a Python-level refusal on one rank fails every rank (the others used to wait forever)
                   ("refused", lambda: dist.attention(sq, sk, sv, comm, causal="no" if last else False))):
    try:
        call()
        message = ""
    except (TypeError, ValueError) as e:
        message = f"{type(e).__name__}: {e}"
    gathered[name] = comm.gather(message)
if comm.rank == 0:
    for name, messages in gathered.items():
        out[f"mismatch_{name}"] = np.array(messages)

if "--torch" in sys.argv:  # tensors that require grad get no gradient here: a warning names each
    import warnings

    import torch
    q, k, v = (torch.from_numpy(dist.shard(x, comm)).requires_grad_() for x in inputs(8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.attention(q, k, v, comm)
    out["grad_warnings"] = np.array([f"{w.category.__name__}: {w.message} @ {w.filename}" for w in caught])

# a shard that disagrees on one rank: the same ValueError on every rank
q, k, v = inputs(8)
sq, sk, sv = (dist.shard(x, comm) for x in (q, k, v))
if comm.rank == comm.size - 1:
    sq, sk = sq[:, :, :, :4].copy(), sk[:, :, :, :4].copy()  # head dim 4 instead of 8
try:
    dist.attention(sq, sk, sv, comm)
    message = ""
except ValueError as e:
    message = str(e)
messages = comm.gather(message)
if comm.rank == 0:
    out["errors"] = np.array(messages)
    np.savez(sys.argv[1], **out)
