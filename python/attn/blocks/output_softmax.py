"""Output-layer softmax variants (C++: attn/output_softmax.hpp; docs/output-softmax.md).

* :func:`log_softmax` -- stable log-softmax over one axis; a row of all -inf stays all -inf.
* :class:`HierarchicalSoftmax` -- word2vec's ``-hs``: a Huffman tree over word counts and one
  vector per inner node; ``log_prob`` costs O(log V) dot products per target.
* :class:`AdaptiveLogSoftmaxWithLoss` -- PyTorch's module of that name (same weights, same
  results), computed by attn's C++ code.

Every function takes NumPy arrays or torch tensors (float32 or float64) and returns the same kind.
The math runs in C++ in the array's dtype (the models: in their weights' dtype) with dot products
accumulated in float64 (the adaptive softmax's float32 log_prob: float sums in the kernel table's
gemm). Torch results carry no gradient (there is no backward pass here yet; a tensor that
requires grad gives a RuntimeWarning).
"""
from __future__ import annotations

from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from .. import _args, _attn
from .._args import floats as _floats, is_torch as _is_torch, torch_if as _out

__all__ = ["log_softmax", "HierarchicalSoftmax", "AdaptiveLogSoftmaxWithLoss", "ASMoutput"]

_IMPL = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64"}


def _ids(x: Any, name: str) -> np.ndarray:
    """A 1-D int64 array of ids (range checks are C++'s, which name the entry)."""
    if _is_torch(x):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.size and a.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers, got {a.dtype}")
    if a.ndim != 1:
        raise ValueError(f"{name} must have 1 dimension (N), got shape {a.shape}")
    if a.dtype.kind == "u" and a.size and a.max() > 2**63 - 1:
        raise ValueError(f"{name} holds {a.max()}, more than a 64-bit integer")
    return np.ascontiguousarray(a, dtype=np.int64)


def _rows(x: Any, name: str, d: int, dims: str) -> Tuple[np.ndarray, bool]:
    torch_in = _is_torch(x)
    a = _floats(x, name, input=True)
    if a.ndim != 2 or a.shape[1] != d:
        raise ValueError(f"{name} must have shape {dims} = (N, {d}), got {tuple(a.shape)}")
    return a, torch_in


def log_softmax(x: Any, axis: int = -1) -> Any:
    """``x_i - m - log sum_j exp(x_j - m)`` with ``m = max_j x_j`` along ``axis``.

    x: a float32 or float64 NumPy array or torch tensor of any shape; the result has its
    shape, dtype and kind. A row of all -inf gives all -inf (never NaN); a row holding NaN gives
    NaN; (1000, 1000) gives (-ln 2, -ln 2). axis: the axis to normalise (negative counts from the
    end)."""
    torch_in = _is_torch(x)
    a = _floats(x, "x", input=True)
    a = a.reshape(tuple(x.shape))  # np.ascontiguousarray gave a 0-d x one dimension: its shape is x's
    axis = _args.integer(axis, "axis")
    nd = max(a.ndim, 1)
    if not -nd <= axis < nd:
        raise ValueError(f"axis must be in [{-nd}, {nd - 1}] for x with {a.ndim} dimensions, got {axis}")
    shape = a.shape
    if a.ndim == 0:
        a = a.reshape(1)
    moved = np.ascontiguousarray(np.moveaxis(a, axis, -1))
    n = moved.shape[-1]
    flat = moved.reshape(int(np.prod(moved.shape[:-1])), n)
    y = getattr(_attn, "log_softmax_f32" if a.dtype == np.float32 else "log_softmax_f64")(flat)
    y = np.ascontiguousarray(np.moveaxis(y.reshape(moved.shape), -1, axis)).reshape(shape)
    return _out(y, torch_in)


class HierarchicalSoftmax:
    """word2vec's hierarchical softmax: log P(w | h) = sum over w's path of
    log sigmoid((1 - 2 b_l) theta[n_l] . h), each term evaluated as -softplus(-z).

    The tree is word2vec's Huffman tree: words sorted by count (descending, stable), inner nodes
    0 .. V-2 in creation order (the root is V-2), the two smallest nodes joined at each step
    (on equal counts the inner node is taken first); the first taken gets bit 0, the second bit 1.
    Word ids are the positions in ``counts``."""

    def __init__(self, impl: Any):
        self._impl = impl
        self.dtype = np.dtype(np.float32) if impl.__class__.__name__.endswith("F32") else np.dtype(np.float64)

    @staticmethod
    def from_counts(counts: Sequence[int], theta: Any) -> "HierarchicalSoftmax":
        """counts: V positive integers (word w's count); theta: (V - 1, d) float32 or float64,
        row n the vector of inner node n (copied). Computes in theta's dtype."""
        c = _ids(counts, "counts")
        t = _floats(theta, "theta")
        if t.ndim != 2 or t.shape[0] != max(len(c) - 1, 0):
            raise ValueError(f"theta must have shape (V - 1, d) = ({max(len(c) - 1, 0)}, d) for V = {len(c)} counts, "
                             f"got {tuple(t.shape)}")
        return HierarchicalSoftmax(getattr(_attn, "HierarchicalSoftmax" + _IMPL[t.dtype])(c, t))

    @property
    def vocab_size(self) -> int:
        return self._impl.vocab_size

    @property
    def dim(self) -> int:
        return self._impl.dim

    def codes(self, word: int) -> str:
        """Word's Huffman code as a string of '0'/'1', root first: counts (5, 3, 1, 1) give
        "1", "01", "001", "000"."""
        return self._impl.code(_args.integer(word, "word"))

    def path(self, word: int) -> List[int]:
        """The inner nodes on word's path, root (V - 2) first; node n uses theta[n]."""
        return self._impl.path(_args.integer(word, "word"))

    def log_prob(self, h: Any, targets: Any) -> Any:
        """log P(targets[i] | h[i]) for each row: h (N, d), targets N ids in [0, V); returns (N,).
        Costs one dot product per node on each target's path (O(log V))."""
        a, torch_in = _rows(h, "h", self.dim, "(N, d)")
        t = _ids(targets, "targets")
        if len(t) != a.shape[0]:
            raise ValueError(f"targets must hold one id per row of h ({a.shape[0]}), got {len(t)}")
        return _out(self._impl.log_prob(a.astype(self.dtype, copy=False), t), torch_in)

    def log_prob_all(self, h: Any) -> Any:
        """(N, V): every word's log P(w | h[i]) in one top-down pass over the tree (V - 1 dot
        products per row); each row's exp sums to 1."""
        a, torch_in = _rows(h, "h", self.dim, "(N, d)")
        return _out(self._impl.log_prob_all(a.astype(self.dtype, copy=False)), torch_in)

    def __repr__(self) -> str:
        return f"HierarchicalSoftmax(vocab_size={self.vocab_size}, dim={self.dim}, dtype={self.dtype})"


class ASMoutput(NamedTuple):
    """What calling an :class:`AdaptiveLogSoftmaxWithLoss` returns (torch's ASMoutput)."""
    output: Any  # (N,): log p(target) of each row
    loss: Any    # scalar: mean of -output


class AdaptiveLogSoftmaxWithLoss:
    """torch.nn.AdaptiveLogSoftmaxWithLoss with given weights, laid out as torch's module holds them.

    head_weight: (c_1 + n_clusters, d), the shortlist's rows then one per cluster.
    tail_weights: one (projection, output) pair per cluster i: projection (h_i, d) (torch:
    h_i = d // div_value**(i + 1)), output (c_{i+1} - c_i, h_i), no biases.
    cutoffs: c_1 < ... < c_m in [1, V - 1] (torch's argument, without V); V is c_m plus the last
    output's rows. head_bias: None or (c_1 + n_clusters,). Computes in head_weight's dtype
    (float32 or float64); the other weights are converted to it. Ids are frequency-ranked
    (0 the most frequent); a target outside [0, V) is a ValueError."""

    def __init__(self, head_weight: Any, tail_weights: Sequence[Tuple[Any, Any]], cutoffs: Sequence[int],
                 head_bias: Any = None):
        head = _floats(head_weight, "head_weight")
        dt = head.dtype
        if head.ndim != 2:
            raise ValueError(f"head_weight must have shape (c_1 + n_clusters, d), got {tuple(head.shape)}")
        if isinstance(cutoffs, (str, bytes)) or not hasattr(cutoffs, "__len__"):
            raise TypeError(f"cutoffs must be a sequence of integers, got {type(cutoffs).__name__}")
        cuts = [_args.integer(c, f"cutoffs[{i}]") for i, c in enumerate(cutoffs)]
        if isinstance(tail_weights, (str, bytes)) or not hasattr(tail_weights, "__len__"):
            raise TypeError(f"tail_weights must be a sequence of (projection, output) pairs, got "
                            f"{type(tail_weights).__name__}")
        if len(tail_weights) != len(cuts):
            raise ValueError(f"tail_weights must hold one (projection, output) pair per cutoff ({len(cuts)}), "
                             f"got {len(tail_weights)}")
        tail = []
        for i, pair in enumerate(tail_weights):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise TypeError(f"tail_weights[{i}] must be a (projection, output) pair, got {type(pair).__name__}")
            p, o = (_floats(w, f"tail_weights[{i}][{j}]", dt) for j, w in enumerate(pair))
            for j, w in enumerate((p, o)):
                if w.ndim != 2:
                    raise ValueError(f"tail_weights[{i}][{j}] must have 2 dimensions, got shape {tuple(w.shape)}")
            tail.append((p, o))
        bias = None
        if head_bias is not None:
            bias = _floats(head_bias, "head_bias", dt)
            if bias.ndim != 1:
                raise ValueError(f"head_bias must have 1 dimension (c_1 + n_clusters,), got shape {tuple(bias.shape)}")
        n_classes = cuts[-1] + tail[-1][1].shape[0] if cuts else 0
        if cuts and n_classes < 2:  # C++ would say "n_classes", which is no argument here
            raise ValueError(f"cutoffs[-1] + the rows of tail_weights[-1][1] (the classes V) must be at least 2, "
                             f"got {cuts[-1]} + {tail[-1][1].shape[0]} = {n_classes}")
        self._impl = getattr(_attn, "AdaptiveLogSoftmaxWithLoss" + _IMPL[dt])(n_classes, cuts, head, bias, tail)
        self.dtype = dt

    @classmethod
    def from_torch(cls, module: Any) -> "AdaptiveLogSoftmaxWithLoss":
        """The same model as a torch.nn.AdaptiveLogSoftmaxWithLoss (its weights copied)."""
        import torch

        if not isinstance(module, torch.nn.AdaptiveLogSoftmaxWithLoss):
            raise TypeError(f"module must be a torch.nn.AdaptiveLogSoftmaxWithLoss, got {type(module).__name__}")
        tail = [(seq[0].weight, seq[1].weight) for seq in module.tail]
        return cls(module.head.weight, tail, list(module.cutoffs[:-1]), module.head.bias)

    @property
    def in_features(self) -> int:
        return self._impl.in_features

    @property
    def n_classes(self) -> int:
        return self._impl.n_classes

    @property
    def cutoffs(self) -> List[int]:
        """torch's ``module.cutoffs``: the cutoffs, then n_classes."""
        return list(self._impl.cutoffs)

    @property
    def shortlist_size(self) -> int:
        return self.cutoffs[0]

    @property
    def n_clusters(self) -> int:
        return len(self.cutoffs) - 1

    @property
    def head_size(self) -> int:
        return self.shortlist_size + self.n_clusters

    def _x(self, x: Any) -> Tuple[np.ndarray, bool]:
        a, torch_in = _rows(x, "x", self.in_features, "(N, in_features)")
        return a.astype(self.dtype, copy=False), torch_in

    def log_prob(self, x: Any) -> Any:
        """(N, V) log probabilities of every class for x (N, in_features), as torch's log_prob."""
        a, torch_in = self._x(x)
        return _out(self._impl.log_prob(a), torch_in)

    def predict(self, x: Any) -> Any:
        """(N,) int64: the most likely class of each row, as torch's predict (the head's argmax if
        it is a shortlist class, else the argmax of the full log_prob; first maximum on ties)."""
        a, torch_in = self._x(x)
        return _out(self._impl.predict(a), torch_in)

    def __call__(self, x: Any, target: Any) -> ASMoutput:
        """torch's forward: x (N, in_features) or (in_features,), target (N,) or a scalar id.
        Returns ASMoutput(output, loss): output[i] = log p(target[i] | x[i]) (shape of target),
        loss = mean(-output) (a scalar)."""
        unbatched = getattr(x, "ndim", None) == 1
        if unbatched:
            x = x.reshape(1, -1)
        a, torch_in = self._x(x)
        t = _ids(target.reshape(-1) if unbatched and hasattr(target, "reshape") else
                 ([target] if unbatched else target), "target")
        if len(t) != a.shape[0]:
            raise ValueError(f"target must hold one id per row of x ({a.shape[0]}), got {len(t)}")
        out, loss = self._impl.forward(a, t)
        loss = np.asarray(loss, dtype=self.dtype)
        if unbatched:
            out = out.reshape(())
        return ASMoutput(_out(out, torch_in), _out(loss, torch_in))

    def __repr__(self) -> str:
        return (f"AdaptiveLogSoftmaxWithLoss(in_features={self.in_features}, n_classes={self.n_classes}, "
                f"cutoffs={self.cutoffs[:-1]}, dtype={self.dtype})")

