"""Sequence-parallel attention over MPI (mpi4py): one sequence split by tokens across ranks.

Launch one Python process per rank, e.g. ``mpirun -np 4 python script.py``; every function
here is collective (every rank of ``comm`` calls it, in the same order). ``comm=None`` means
``mpi4py.MPI.COMM_WORLD``.

* :func:`shard` / :func:`unshard` -- this rank's rows of a whole array (zig-zag pieces when
  ``causal``: rank r holds pieces r and 2R-1-r of 2R, which balances causal work) and back.
* :func:`attention` -- exact softmax attention on shards (ring attention: K/V shards travel
  around the ring, partials merge by the log-sum-exp rule); equals :func:`attn.attention` on
  the whole sequence, rows of this rank.
* :func:`attention_backward` -- its gradients (dq of this rank's queries, dk/dv of its shard;
  the dK/dV accumulators travel around the ring with their shard).
* :func:`linear_attention` -- linear attention across ranks (LASP-2: one all-gather of the
  per-rank states); returns ``(o, final_state)``, the final state of the whole sequence.
* :func:`linear_attention_backward` -- its gradients (one all-gather of state gradients).
* :func:`decode` -- the same queries on every rank against a KV cache sharded by tokens.

Any sequence length works (pieces differ by at most one token; a rank may hold none). The C++
library does the work (attn/distributed.hpp); mpi4py only provides the communicator. Layouts as
in :func:`attn.attention`: ``"bnhd"`` (B, N, H, D) by default or ``"bhnd"``. Arrays are NumPy
or torch CPU tensors; results are float32 NumPy arrays (torch tensors for torch inputs), without
autograd (a tensor that requires grad gets a RuntimeWarning naming it; the backward functions give
the gradients). Every call first agrees across ranks: a rank whose arguments are refused fails
every rank, and a mechanism that differs between ranks is an error naming both texts.
See docs/distributed.md.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from . import _args, _attn
from ._args import is_torch as _is_torch

__all__ = ["shard", "unshard", "attention", "attention_backward", "linear_attention", "linear_attention_backward",
           "decode", "shard_pieces"]


def _mpi():
    try:
        from mpi4py import MPI
    except ImportError as e:  # pragma: no cover - mpi4py is installed by scripts/test.sh
        raise ImportError("attn.distributed needs mpi4py: pip install mpi4py==4.1.2 (and Open MPI: "
                          "apt-get install openmpi-bin libopenmpi-dev)") from e
    return MPI


def _comm(comm):
    MPI = _mpi()
    if comm is None:
        return MPI.COMM_WORLD
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"comm must be an mpi4py communicator (MPI.Comm) or None, got {type(comm).__name__}")
    if comm == MPI.COMM_NULL:
        raise ValueError("comm must be a communicator of ranks, got MPI.COMM_NULL")
    return comm


def _native() -> None:
    if not getattr(_attn, "has_mpi", False):
        raise RuntimeError("attn was built without MPI, so attn.distributed cannot run: install Open MPI "
                           "(Debian: apt-get install openmpi-bin libopenmpi-dev) and rebuild attn (pip install .)")


def _token_axis(layout: str) -> int:
    _args.text(layout, "layout")
    if layout not in ("bnhd", "bhnd"):
        raise ValueError(f"layout must be 'bnhd' or 'bhnd', got {layout!r}")
    return 1 if layout == "bnhd" else 2


def shard_pieces(n: int, ranks: int, rank: int, causal: bool = False) -> List[Tuple[int, int]]:
    """(start, length) of the pieces of n tokens rank `rank` of `ranks` holds, in shard order.

    Contiguous (R pieces) or zig-zag when causal (2R pieces, rank r holds r and 2R-1-r); the
    first n mod P pieces are one token longer (attn::distributed::shard_pieces, attn/shards.hpp).
    """
    n, ranks = _args.integer(n, "n"), _args.integer(ranks, "ranks", -2**31, 2**31 - 1)
    rank, causal = _args.integer(rank, "rank", -2**31, 2**31 - 1), _args.flag(causal, "causal")
    return [tuple(p) for p in _attn.shard_pieces(n, ranks, rank, causal)]


_NO_AUTOGRAD = "attn.distributed's functions"
_BY_HAND = "attention_backward and linear_attention_backward give the gradients when called"


def _numpy(x: Any, name: str) -> np.ndarray:
    _args.detached(x, name, _NO_AUTOGRAD, _BY_HAND)
    return np.asarray(_args.host(x, name, "a tensor of a dtype NumPy holds (not bfloat16)"))


def _agreed(comm, where: str, prepare):
    """prepare() -> (mechanism text or None, the call's arguments), run on every rank, then one
    all-gather of each rank's canonical mechanism and error. A rank whose arguments Python refuses
    fails every rank (the others would wait forever in the collective call), and a mechanism that
    differs between ranks is named by its text (C++ compares fingerprints only)."""
    error, mine, args = None, (None, ""), None
    try:
        text, args = prepare()
        mine = (None if text is None else _attn.canonical_mechanism(text), "")
    except (TypeError, ValueError) as e:
        error, mine = e, (None, f"{type(e).__name__}: {e}")
    everyone = comm.allgather(mine)
    if error is not None:
        raise error
    for r, (_, problem) in enumerate(everyone):
        if problem:
            raise ValueError(f"{where}: rank {r} refused its arguments ({problem}), so no rank runs the call")
    texts = [t for t, _ in everyone]
    for r, t in enumerate(texts):
        if t != texts[0]:
            raise ValueError(f"{where}: the mechanism differs between ranks: rank 0 has {texts[0]!r}, rank {r} has "
                             f"{t!r} (every rank must pass the same mechanism arguments)")
    return args


def _like(y: np.ndarray, x: Any) -> Any:
    if _is_torch(x):
        import torch
        return torch.from_numpy(np.ascontiguousarray(y))
    return y


def shard(x: Any, comm=None, causal: bool = False, layout: str = "bnhd") -> Any:
    """This rank's part of the whole array x (every rank passes the same x): its pieces along the
    token axis (axis 1 for "bnhd", 2 for "bhnd"), zig-zag when causal."""
    comm = _comm(comm)
    axis = _token_axis(layout)
    a = _numpy(x, "x")
    if a.ndim != 4:
        raise ValueError(f"x must have 4 dimensions ({layout}), got {a.ndim}")
    pieces = shard_pieces(a.shape[axis], comm.Get_size(), comm.Get_rank(), causal)
    parts = [np.take(a, np.arange(s, s + n), axis=axis) for s, n in pieces]
    return _like(np.ascontiguousarray(np.concatenate(parts, axis=axis)), x)


def unshard(y: Any, comm=None, causal: bool = False, layout: str = "bnhd") -> Any:
    """The whole array on every rank from every rank's shard y (the inverse of :func:`shard`)."""
    comm = _comm(comm)
    axis = _token_axis(layout)
    a = _numpy(y, "y")
    if a.ndim != 4:
        raise ValueError(f"y must have 4 dimensions ({layout}), got {a.ndim}")
    shards = comm.allgather(np.ascontiguousarray(a))
    others = [s.shape[:axis] + s.shape[axis + 1:] for s in shards]
    if any(o != others[0] for o in others):
        raise ValueError(f"unshard: every rank's shard must agree outside the token axis, got {[s.shape for s in shards]}")
    n = sum(s.shape[axis] for s in shards)
    shape = list(a.shape)
    shape[axis] = n
    out = np.empty(shape, dtype=a.dtype)
    for r, s in enumerate(shards):
        pieces = shard_pieces(n, comm.Get_size(), r, causal)
        if sum(p[1] for p in pieces) != s.shape[axis]:
            raise ValueError(f"unshard: rank {r} holds {s.shape[axis]} tokens; its shard of {n} tokens has "
                             f"{sum(p[1] for p in pieces)}")
        local = 0
        for start, length in pieces:
            index = [slice(None)] * 4
            index[axis] = slice(start, start + length)
            src = [slice(None)] * 4
            src[axis] = slice(local, local + length)
            out[tuple(index)] = s[tuple(src)]
            local += length
    return _like(out, y)


def _array(x: Any, name: str) -> np.ndarray:
    """x (a NumPy array or torch tensor of floats) as NumPy, as the rest of the API takes arrays."""
    if not (_is_torch(x) or isinstance(x, np.ndarray)):
        raise TypeError(f"{name} must be a numpy.ndarray or torch.Tensor, got {type(x).__name__}")
    kind = str(x.dtype)
    if _is_torch(x):
        if not x.dtype.is_floating_point:
            raise TypeError(f"{name} must hold floats, got {kind}")
        _args.detached(x, name, _NO_AUTOGRAD, _BY_HAND)
        x = x.detach().cpu()
        x = x.float() if x.dtype.itemsize < 4 else x
        return x.numpy()
    if x.dtype.kind != "f":
        raise TypeError(f"{name} must hold floats, got {kind}")
    return x


def _bhnd(x: Any, layout: str, name: str) -> np.ndarray:
    a = _array(x, name)
    if a.ndim != 4:
        raise ValueError(f"{name} must have 4 dimensions ({layout}), got {a.ndim}")
    if layout == "bnhd":
        a = a.transpose(0, 2, 1, 3)
    return np.ascontiguousarray(a, dtype=np.float32)


def _offsets(cu_seqlens: Optional[Sequence[int]]) -> List[int]:
    if cu_seqlens is None:
        return []
    if isinstance(cu_seqlens, (str, bytes)) or not hasattr(cu_seqlens, "__len__"):
        raise TypeError(f"cu_seqlens must be a sequence of integers or None, got {type(cu_seqlens).__name__}")
    return [_args.integer(int(x) if isinstance(x, np.integer) else x, f"cu_seqlens[{i}]")
            for i, x in enumerate(_numpy(cu_seqlens, "cu_seqlens").tolist() if _is_torch(cu_seqlens) else cu_seqlens)]


def _back(y: np.ndarray, layout: str, like: Any) -> Any:
    if layout == "bnhd":
        y = y.transpose(0, 2, 1, 3)
    return _like(y, like)


def _window_text(window_size: Sequence[int]) -> List[str]:
    if isinstance(window_size, (str, bytes)) or not hasattr(window_size, "__len__") or len(window_size) != 2:
        raise TypeError(f"window_size must be a pair (left, right), got {window_size!r}")
    left, right = (_args.integer(w, f"window_size[{i}]") for i, w in enumerate(window_size))
    if left == -1 and right == -1:
        return []
    if left < -1 or right < -1:
        raise ValueError(f"window_size must be (left, right) with -1 = unbounded, got {tuple(window_size)}")
    return [f"window={left}:{right}"]


def attention(q: Any, k: Any, v: Any, comm=None, causal: bool = False,
              window_size: Tuple[int, int] = (-1, -1), layout: str = "bnhd", *,
              softmax_scale: Optional[float] = None, return_lse: bool = False,
              cu_seqlens: Optional[Sequence[int]] = None) -> Any:
    """Exact softmax attention on this rank's shards of q, k, v (as :func:`shard` cuts them:
    zig-zag when causal); returns this rank's rows of the output (and (B, H, n_local) lse when
    asked). Equals :func:`attn.attention` on the whole sequence up to float32 rounding (the
    partials merge in ring order).

    cu_seqlens: packed sequences (batch 1): sequence t is tokens cu_seqlens[t] .. cu_seqlens[t+1]-1
    of the whole stream (the same offsets on every rank); causal and windows apply within each
    sequence, as :func:`attn.flash_attn_varlen_func` on the whole stream."""
    _native()
    comm = _comm(comm)

    def prepare():
        _token_axis(layout)
        text = _softmax_text(causal, window_size, softmax_scale)
        return text, (_bhnd(q, layout, "q"), _bhnd(k, layout, "k"), _bhnd(v, layout, "v"), text,
                      _args.flag(return_lse, "return_lse"), _offsets(cu_seqlens))

    bq, bk, bv, text, return_lse, cu = _agreed(comm, "attn.distributed.attention", prepare)
    out, lse, _ = _attn.distributed_attention(bq, bk, bv, comm.py2f(), text, return_lse, cu)
    out = _back(out, layout, q)
    return (out, _like(lse, q)) if return_lse else out


def _softmax_text(causal: bool, window_size: Sequence[int], softmax_scale: Optional[float]) -> str:
    opts = (["causal"] if _args.flag(causal, "causal") else []) + _window_text(window_size)
    if softmax_scale is not None:
        opts.append(f"scale={_args.real(softmax_scale, 'softmax_scale')!r}")
    return "softmax" + (":" + ",".join(opts) if opts else "")


def attention_backward(dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, comm=None, causal: bool = False,
                       window_size: Tuple[int, int] = (-1, -1), layout: str = "bnhd", *,
                       softmax_scale: Optional[float] = None,
                       cu_seqlens: Optional[Sequence[int]] = None) -> Tuple[Any, Any, Any]:
    """Gradients of :func:`attention` for this rank's shards: (dq, dk, dv) in ``layout``.

    dout: the loss's gradient with respect to this rank's rows of the output; out and lse
    ((B, H, n_local)): what :func:`attention` returned (``return_lse=True``) with the same
    arguments. Equals :func:`attn.attend_backward` on the whole sequence, this rank's rows, up to
    float32 rounding."""
    _native()
    comm = _comm(comm)

    def prepare():
        _token_axis(layout)
        text = _softmax_text(causal, window_size, softmax_scale)
        lse4 = np.ascontiguousarray(_array(lse, "lse"), dtype=np.float32)[..., None]
        return text, (_bhnd(dout, layout, "dout"), _bhnd(q, layout, "q"), _bhnd(k, layout, "k"),
                      _bhnd(v, layout, "v"), _bhnd(out, layout, "out"), lse4, text, _offsets(cu_seqlens))

    bdout, bq, bk, bv, bout, lse4, text, cu = _agreed(comm, "attn.distributed.attention_backward", prepare)
    dq, dk, dv = _attn.distributed_attention_backward(bdout, bq, bk, bv, bout, lse4, comm.py2f(), text, cu)
    return _back(dq, layout, q), _back(dk, layout, k), _back(dv, layout, v)


def linear_attention(q: Any, k: Any, v: Any, comm=None, feature_map: str = "elu", causal: bool = True, *,
                     decay: Optional[float] = None, normalize: bool = True, layout: str = "bnhd") -> Tuple[Any, Any]:
    """Linear attention on this rank's contiguous shards (LASP-2: one all-gather of the ranks'
    states); returns (o, final_state): this rank's rows of o and the whole sequence's final
    state (B, H, D, Dv [+ 1]), the same on every rank. Equals :func:`attn.linear_attention` on
    the whole sequence up to float32 rounding."""
    _native()
    comm = _comm(comm)

    def prepare():
        _token_axis(layout)
        text = _linear_text(feature_map, causal, decay, normalize)
        return text, (_bhnd(q, layout, "q"), _bhnd(k, layout, "k"), _bhnd(v, layout, "v"), text)

    bq, bk, bv, text = _agreed(comm, "attn.distributed.linear_attention", prepare)
    out, state = _attn.distributed_linear_attention(bq, bk, bv, comm.py2f(), text)
    return _back(out, layout, q), _like(state, q)


def _linear_text(feature_map: str, causal: bool, decay: Optional[float], normalize: bool) -> str:
    feature_map = _args.text(feature_map, "feature_map")
    causal, normalize = _args.flag(causal, "causal"), _args.flag(normalize, "normalize")
    if "," in feature_map or ":" in feature_map:
        raise ValueError(f"feature_map must be one name such as 'elu', got {feature_map!r}")
    text = f"linear:map={feature_map}" + (",causal" if causal else "") + ("" if normalize else ",normalize=0")
    if decay is not None:
        text += f",decay={_args.real(decay, 'decay')!r}"
    return text


def linear_attention_backward(dout: Any, q: Any, k: Any, v: Any, comm=None, feature_map: str = "elu",
                              causal: bool = True, *, dfinal_state: Any = None, decay: Optional[float] = None,
                              normalize: bool = True, layout: str = "bnhd") -> Tuple[Any, Any, Any]:
    """Gradients of :func:`linear_attention` for this rank's shards: (dq, dk, dv) in ``layout``.

    dout: the loss's gradient with respect to this rank's rows of o; dfinal_state: with respect
    to the whole sequence's final state (the same on every rank), or None. One all-gather of the
    ranks' initial-state gradients. Equals :func:`attn.attend_backward` on the whole sequence."""
    _native()
    comm = _comm(comm)

    def prepare():
        _token_axis(layout)
        text = _linear_text(feature_map, causal, decay, normalize)
        df = (None if dfinal_state is None else
              np.ascontiguousarray(_array(dfinal_state, "dfinal_state"), dtype=np.float32))
        return text, (_bhnd(dout, layout, "dout"), _bhnd(q, layout, "q"), _bhnd(k, layout, "k"),
                      _bhnd(v, layout, "v"), text, df)

    bdout, bq, bk, bv, text, df = _agreed(comm, "attn.distributed.linear_attention_backward", prepare)
    dq, dk, dv = _attn.distributed_linear_attention_backward(bdout, bq, bk, bv, comm.py2f(), text, df)
    return _back(dq, layout, q), _back(dk, layout, k), _back(dv, layout, v)


def decode(q: Any, k_shard: Any, v_shard: Any, comm=None, *, layout: str = "bnhd", return_lse: bool = False) -> Any:
    """Attention of the same queries q (every rank) to a KV cache sharded by tokens (this rank's
    k_shard, v_shard; a rank may hold none). One all-gather of (out, lse) and a merge in rank order:
    every rank gets the same result, bitwise."""
    _native()
    comm = _comm(comm)

    def prepare():
        _token_axis(layout)
        return None, (_bhnd(q, layout, "q"), _bhnd(k_shard, layout, "k_shard"), _bhnd(v_shard, layout, "v_shard"),
                      _args.flag(return_lse, "return_lse"))

    bq, bk, bv, return_lse = _agreed(comm, "attn.distributed.decode", prepare)
    out, lse = _attn.distributed_decode(bq, bk, bv, comm.py2f(), return_lse)
    out = _back(out, layout, q)
    return (out, _like(lse, q)) if return_lse else out
