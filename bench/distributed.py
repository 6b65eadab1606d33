"""Ring attention across MPI ranks on one machine: per-rank time, the overlap of communication
with computation, and the bytes each rank sends against the model of docs/distributed.md.

    mpirun -np 1 python bench/distributed.py --tokens-per-rank 2048
    mpirun -np 2 --oversubscribe python bench/distributed.py --tokens-per-rank 2048

Weak scaling: every rank holds --tokens-per-rank tokens (the sequence grows with the ranks).
Prints one JSON line per run from rank 0 (the maximum over ranks of each time, the rank's own
bytes). wait_fraction is the share of the call spent blocked in MPI_Waitall after a step's local
work (transfer not hidden, plus waiting for a slower neighbour); comm_alone_seconds is the same
ring of K/V shards sent with nothing to compute (what the overlap has to hide). Keep it under a minute on a shared machine: the defaults take a few seconds.
"""
import argparse
import json
import time

import numpy as np
from mpi4py import MPI

from attn import _attn, distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens-per-rank", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    R, r = comm.Get_size(), comm.Get_rank()
    n = a.tokens_per_rank * R
    rng = np.random.default_rng(r)
    local = sum(p[1] for p in dist.shard_pieces(n, R, r, a.causal))
    q = rng.standard_normal((1, a.heads, local, a.dim), dtype=np.float32)
    k = rng.standard_normal((1, a.kv_heads, local, a.dim), dtype=np.float32)
    v = rng.standard_normal((1, a.kv_heads, local, a.dim), dtype=np.float32)
    text = "softmax:causal" if a.causal else "softmax"
    best = None
    for _ in range(a.reps):
        comm.Barrier()
        _, _, st = _attn.distributed_attention(q, k, v, comm.py2f(), text, False)
        if best is None or st["total_seconds"] < best["total_seconds"]:
            best = st
    # communication alone: the same ring of shards, nothing to compute
    buf = np.concatenate([k.ravel(), v.ravel()])
    other = np.empty_like(buf)
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(R - 1):
        comm.Sendrecv(buf, dest=(r + 1) % R, recvbuf=other, source=(r - 1) % R)
    comm_alone = time.perf_counter() - t
    # the model: a rank sends every shard but its successor's, each B*Hkv*n_s*(D+Dv)*4 bytes
    lengths = [sum(p[1] for p in dist.shard_pieces(n, R, s, a.causal)) for s in range(R)]
    model = 4 * a.kv_heads * 2 * a.dim * (n - lengths[(r + 1) % R]) if R > 1 else 0
    worst = {key: comm.allreduce(best[key], op=MPI.MAX) for key in ("total_seconds", "compute_seconds", "wait_seconds")}
    comm_alone = comm.allreduce(comm_alone, op=MPI.MAX)
    pairs = n * n / (2 if a.causal else 1) / R  # (query, key) pairs per rank
    if r == 0:
        print(json.dumps({"ranks": R, "tokens": n, "tokens_per_rank": a.tokens_per_rank, "causal": a.causal,
                          "heads": a.heads, "kv_heads": a.kv_heads, "dim": a.dim,
                          "seconds": round(worst["total_seconds"], 4), "compute_seconds": round(worst["compute_seconds"], 4),
                          "wait_seconds": round(worst["wait_seconds"], 5), "comm_alone_seconds": round(comm_alone, 5),
                          "wait_fraction": round(worst["wait_seconds"] / worst["total_seconds"], 3), "ns_per_pair": round(worst["total_seconds"] / pairs * 1e9, 3),
                          "bytes_sent": best["bytes_sent"], "bytes_model": model,
                          "blocks_computed": best["blocks_computed"], "blocks_skipped": best["blocks_skipped"]}))


if __name__ == "__main__":
    main()
