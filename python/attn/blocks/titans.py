"""Titans neural long-term memory (Behrouz et al. 2024; C++: attn/titans.hpp; docs/titans.md).

:func:`titans_memory` writes each token's key-value pair into a small network M by a gradient
step on ``||M(k_t) - v_t||^2`` (with momentum and forgetting) and reads ``y_t = M_t(q_t)``.
float32 inputs run the fast mini-batch form (batched matrix products); float64 inputs run the
float64 reference, the plain token loop. NumPy in gives NumPy out, torch in gives torch out
(bfloat16 and float16 are refused, float32 or float64 only).

:func:`titans_memory` and :func:`titans_read` train: given torch tensors that require grad, they run
through the custom ops of :mod:`attn.blocks.titans_torch`, and gradients flow to q, k, v, the gates
theta, eta, alpha, the initial weights w0 and momentum s0, from y and from the returned final
weights and momentum, through the memory's own gradient steps (second-order terms of the inner
loss included). The attention forms (:func:`titans_mag`, :func:`titans_mal`, :func:`titans_mac`)
have no backward yet: a tensor that requires grad there gets a RuntimeWarning naming it.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np

from .. import _args, _attn
from .._args import is_torch as _is_torch

__all__ = ["titans_memory", "titans_init", "titans_read", "titans_mag", "titans_mal", "titans_mac"]

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _array(x: Any, name: str) -> np.ndarray:
    """A number (as float64), or a float32/float64 NumPy array or torch tensor as NumPy (detached, on
    the CPU: a tensor that requires grad gets a warning, no gradient flows back)."""
    if isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_)):
        return np.asarray(x, dtype=np.float64)
    if not (_is_torch(x) or isinstance(x, np.ndarray)):
        raise TypeError(f"{name} must be a numpy.ndarray, torch.Tensor or number, got {type(x).__name__}")
    _args.detached(x, name, "the Titans attention forms (titans_mag, titans_mal, titans_mac)")
    x = _args.host(x, name, "float32 or float64")
    if x.dtype not in _FLOATS:
        raise TypeError(f"{name} must be float32 or float64, got {x.dtype}")
    return x


def _names(memory: str) -> Tuple[str, ...]:
    return ("W",) if memory == "linear" else ("W1", "W2")


def _shapes(memory: str, d: int) -> Tuple[Tuple[int, int], ...]:
    return ((d, d),) if memory == "linear" else ((4 * d, d), (d, 4 * d))


def titans_init(d: int, memory: str = "mlp", heads: Optional[int] = None, seed: int = 0,
                dtype: Any = np.float32) -> Dict[str, np.ndarray]:
    """Initial weights M_0: linear ``{"W": zeros (d, d)}``; mlp ``{"W1", "W2"}`` drawn from
    N(0, 1/fan_in) with NumPy's default_rng(seed) (an MLP memory started at 0 never learns: its
    gradients are 0). With ``heads``, each array gets a leading (heads,) axis (one per head).
    Weights that would not fit in this machine's memory are a MemoryError naming d, before any
    allocation."""
    d = _args.integer(d, "d", 1)
    memory = _args.text(memory, "memory")
    if memory not in ("linear", "mlp"):
        raise ValueError(f"memory must be 'linear' or 'mlp', got {memory!r}")
    lead = () if heads is None else (_args.integer(heads, "heads", 1),)
    try:
        itemsize = np.dtype(dtype).itemsize
    except TypeError:
        raise TypeError(f"dtype must be a NumPy dtype such as np.float32, got {dtype!r}") from None
    count = int(np.prod(lead, dtype=object)) * d * d  # one d x d block per head
    if memory == "linear":
        _args.memory(count * itemsize, "d", d, "titans_init's W (d, d)" + (f" x {lead[0]} heads" if lead else ""))
    else:  # W1 and W2 of 4 d^2 each, each drawn in float64 and then cast
        _args.memory(4 * count * (8 + 2 * itemsize), "d", d, "titans_init's W1 (4d, d) and W2 (d, 4d), drawn in "
                     "float64" + (f", x {lead[0]} heads" if lead else ""))
    if memory == "linear":
        return {"W": np.zeros(lead + (d, d), dtype=dtype)}
    rng = np.random.default_rng(_args.seed(seed))
    return {"W1": (rng.standard_normal(lead + (4 * d, d)) / np.sqrt(d)).astype(dtype),
            "W2": (rng.standard_normal(lead + (d, 4 * d)) / np.sqrt(4 * d)).astype(dtype)}


def titans_memory(q: Any, k: Any, v: Any, theta: Any, eta: Any, alpha: Any, memory: str = "linear",
                  w0: Any = None, batch_size: int = 16, loss: str = "sum", *, s0: Any = None, threads: int = 0,
                  return_momentum: bool = False) -> Tuple[Any, ...]:
    """Titans memory over sequences of tokens, per head.

    q, k, v: (B, H, N, d), one dtype (float32: the fast form; float64: the reference).
    theta (>= 0), eta, alpha (in [0, 1]): (B, H, N), or anything that broadcasts to it (a number).
    memory: "linear" (M(k) = W k) or "mlp" (M(k) = W2 gelu(W1 k), W1 (4d, d), W2 (d, 4d)).
    w0: M_0 as a dict of arrays (linear {"W"}, mlp {"W1", "W2"}), each of shape (...) shared,
    (H, ...) per head or (B, H, ...) per sequence; a bare array for linear; None: zeros for linear,
    ``titans_init(d, "mlp")`` for mlp. batch_size b: mini-batches of b tokens take their gradients
    at the state before the mini-batch (1: the online rule). loss: "sum" ||e||^2 or "mean" (/ d).

    s0: the momentum to start from (a dict like w0, e.g. a previous call's momentum, to continue a
    sequence; then w0 is that call's weights); None: S_0 = 0.

    Update per token: S_t = eta_t S_{t-1} - theta_t grad, M_t = (1 - alpha_t) M_{t-1} + S_t
    (S_0 = 0); y_t = M_t(q_t), read after token t's update.
    Returns (y (B, H, N, d), weights: dict of the final M_N, arrays (B, H, ...)), plus the final
    momentum S_N (a dict alike) with return_momentum=True.

    Training: when q, k, v, a gate or an array of w0 or s0 is a torch tensor that requires grad
    (grad enabled), the call goes through ``torch.ops.attn.titans_memory`` and y, the final weights
    and the final momentum carry gradients back to every torch input (NumPy inputs are constants),
    e.g. ``y, w = titans_memory(q, k, v, theta, eta, alpha, "mlp", w0={"W1": W1, "W2": W2});
    y.square().mean().backward()`` fills q.grad, ..., W1.grad."""
    if _wants_grad(q, k, v, theta, eta, alpha, w0, s0):
        return _differentiable(q, k, v, theta, eta, alpha, memory, w0, batch_size, loss, s0, threads,
                               return_momentum)
    torch_out = _is_torch(q)
    memory = _args.text(memory, "memory")
    loss = _args.text(loss, "loss")
    if memory not in ("linear", "mlp"):
        raise ValueError(f"memory must be 'linear' or 'mlp', got {memory!r}")
    if loss not in ("sum", "mean"):
        raise ValueError(f"loss must be 'sum' or 'mean', got {loss!r}")
    batch_size = _args.integer(batch_size, "batch_size", 1)
    threads = _args.integer(threads, "threads", 0, 256)
    return_momentum = _args.flag(return_momentum, "return_momentum")
    qa = _array(q, "q")
    dt = qa.dtype
    if qa.ndim != 4:
        raise ValueError(f"q must have 4 dimensions (B, H, N, d), got shape {tuple(qa.shape)}")
    B, H, N, d = qa.shape
    arrays = [np.ascontiguousarray(qa)]
    for name, x in (("k", k), ("v", v)):
        a = _array(x, name)
        if a.shape != qa.shape:
            raise ValueError(f"{name} must have q's shape (B, H, N, d) = {tuple(qa.shape)}, got {tuple(a.shape)}")
        arrays.append(np.ascontiguousarray(a, dtype=dt))
    for name, x in (("theta", theta), ("eta", eta), ("alpha", alpha)):
        a = _array(x, name)
        try:
            a = np.broadcast_to(a, (B, H, N))
        except ValueError:
            raise ValueError(f"{name} must have shape (B, H, N) = {(B, H, N)} (or broadcast to it), "
                             f"got {tuple(a.shape)}") from None
        arrays.append(np.ascontiguousarray(a, dtype=dt))
    if w0 is None and (memory == "mlp" or s0 is not None):
        w0 = titans_init(d, memory, dtype=dt)
    flat = None if w0 is None else _flat_weights(w0, "w0", memory, B, H, d, dt)
    sflat = None if s0 is None else _flat_weights(s0, "s0", memory, B, H, d, dt)
    if sflat is not None and sflat.shape != flat.shape:  # one group count for both: per sequence
        def per_sequence(x: np.ndarray) -> np.ndarray:
            lead = (B, H) if x.shape[0] == B * H else (1, H) if x.shape[0] == H else (1, 1)
            # sizes spelled out, not -1: with B or H = 0 NumPy cannot infer them
            return np.ascontiguousarray(np.broadcast_to(x.reshape(*lead, x.shape[1]),
                                                        (B, H, x.shape[1])).reshape(B * H, x.shape[1]))

        flat, sflat = per_sequence(flat), per_sequence(sflat)
    fn = _attn.titans_memory_f32 if dt == np.float32 else _attn.titans_memory_f64
    y, w, s = fn(*arrays, flat, sflat, memory, loss, batch_size, threads)

    def unflat(x: np.ndarray) -> Dict[str, Any]:
        out, at = {}, 0
        for name, shp in zip(_names(memory), _shapes(memory, d)):
            n = shp[0] * shp[1]
            out[name] = _out(np.ascontiguousarray(x[:, :, at:at + n].reshape(B, H, *shp)), torch_out)
            at += n
        return out

    result = (_out(y, torch_out), unflat(w))
    return result + (unflat(s),) if return_momentum else result


def _wants_grad(*xs: Any) -> bool:
    """Whether a torch tensor among xs (or among a dict's values) requires grad, grad enabled."""
    flat = []
    for x in xs:
        flat.extend(x.values() if isinstance(x, dict) else [x])
    if not any(_is_torch(x) and x.requires_grad for x in flat):
        return False
    import torch

    return torch.is_grad_enabled()


def _differentiable(q, k, v, theta, eta, alpha, memory, w0, batch_size, loss, s0, threads, return_momentum):
    """titans_memory through torch.ops.attn.titans_memory: the plain path's checks on torch tensors."""
    import torch

    from . import titans_torch  # noqa: F401  (registers the ops)

    memory = _args.text(memory, "memory")
    loss = _args.text(loss, "loss")
    if memory not in ("linear", "mlp"):
        raise ValueError(f"memory must be 'linear' or 'mlp', got {memory!r}")
    if loss not in ("sum", "mean"):
        raise ValueError(f"loss must be 'sum' or 'mean', got {loss!r}")
    batch_size = _args.integer(batch_size, "batch_size", 1)
    threads = _args.integer(threads, "threads", 0, 256)
    return_momentum = _args.flag(return_momentum, "return_momentum")

    def tensor(x, name, dtype=None):
        if isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_)):
            return torch.tensor(float(x), dtype=dtype)
        if isinstance(x, np.ndarray):
            x = torch.from_numpy(x)
        if not _is_torch(x):
            raise TypeError(f"{name} must be a numpy.ndarray, torch.Tensor or number, got {type(x).__name__}")
        if x.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"{name} must be float32 or float64, got {x.dtype}")
        if x.device.type != "cpu":
            raise ValueError(f"{name} must be on the CPU, got {x.device}")
        return x if dtype is None else x.to(dtype)

    qt = tensor(q, "q")
    dt = qt.dtype
    if qt.ndim != 4:
        raise ValueError(f"q must have 4 dimensions (B, H, N, d), got shape {tuple(qt.shape)}")
    B, H, N, d = (int(n) for n in qt.shape)
    ts = [qt.contiguous()]
    for name, x in (("k", k), ("v", v)):
        a = tensor(x, name, dt)
        if a.shape != qt.shape:
            raise ValueError(f"{name} must have q's shape (B, H, N, d) = {tuple(qt.shape)}, got {tuple(a.shape)}")
        ts.append(a.contiguous())
    for name, x in (("theta", theta), ("eta", eta), ("alpha", alpha)):
        a = tensor(x, name, dt)
        try:
            a = torch.broadcast_to(a, (B, H, N))
        except RuntimeError:
            raise ValueError(f"{name} must have shape (B, H, N) = {(B, H, N)} (or broadcast to it), "
                             f"got {tuple(a.shape)}") from None
        ts.append(a.contiguous())
    if w0 is None and (memory == "mlp" or s0 is not None):
        w0 = titans_init(d, memory, dtype=np.float32 if dt == torch.float32 else np.float64)
    flat = None if w0 is None else _flat_weights_torch(w0, "w0", memory, B, H, d, dt, tensor)
    sflat = None if s0 is None else _flat_weights_torch(s0, "s0", memory, B, H, d, dt, tensor)
    if sflat is not None and sflat.shape != flat.shape:  # one group count for both: per sequence
        def per_sequence(x):
            lead = (B, H) if x.shape[0] == B * H else (1, H) if x.shape[0] == H else (1, 1)
            return torch.broadcast_to(x.reshape(*lead, x.shape[1]), (B, H, x.shape[1])).reshape(B * H, x.shape[1])

        flat, sflat = per_sequence(flat).contiguous(), per_sequence(sflat).contiguous()
    y, w, s = torch.ops.attn.titans_memory(*ts, flat, sflat, memory, loss, batch_size, threads)

    def unflat(x):
        out, at = {}, 0
        for name, shp in zip(_names(memory), _shapes(memory, d)):
            n = shp[0] * shp[1]
            out[name] = x[:, :, at:at + n].reshape(B, H, *shp)
            at += n
        return out

    result = (y, unflat(w))
    return result + (unflat(s),) if return_momentum else result


def _constants(theta: Any, eta: Any, alpha: Any, w0: Any) -> Tuple[Any, Any, Any, Any]:
    """The attention forms have no backward: gates and w0 as NumPy (a tensor that requires grad
    gets the RuntimeWarning), so their titans_memory calls take the plain path."""
    gates = tuple(_array(g, n) for g, n in ((theta, "theta"), (eta, "eta"), (alpha, "alpha")))
    if isinstance(w0, dict):
        w0 = {n: _array(a, f"w0[{n!r}]") for n, a in w0.items()}
    elif w0 is not None:
        w0 = _array(w0, "w0")
    return gates + (w0,)


def _flat_weights_torch(w, name, memory, B, H, d, dt, tensor):
    """_flat_weights on torch tensors (differentiable: reshape and cat)."""
    import torch

    if not isinstance(w, dict):
        if memory != "linear":
            raise TypeError(f"{name} for memory='mlp' must be a dict {{'W1': ..., 'W2': ...}}")
        w = {"W": w}
    names = _names(memory)
    if set(w) != set(names):
        raise ValueError(f"{name} must hold the keys {list(names)} for memory={memory!r}, got {sorted(w)}")
    parts, groups = [], None
    for key, shp in zip(names, _shapes(memory, d)):
        a = tensor(w[key], f"{name}[{key!r}]", dt)
        lead = tuple(a.shape[:-2])
        if tuple(a.shape[-2:]) != shp or lead not in ((), (H,), (B, H)):
            raise ValueError(f"{name}[{key!r}] must have shape {shp}, (H, *{shp}) or (B, H, *{shp}) with "
                             f"B, H = {B}, {H}, got {tuple(a.shape)}")
        g = int(np.prod(lead)) if lead else 1
        if groups is not None and g != groups:
            raise ValueError(f"{name}'s arrays must have the same leading axes, got {g} and {groups} sets")
        groups = g
        parts.append(a.reshape(g, shp[0] * shp[1]))
    return torch.cat(parts, dim=1).contiguous()


def _flat_weights(w: Any, name: str, memory: str, B: int, H: int, d: int, dt: np.dtype) -> np.ndarray:
    """(groups, count) C-contiguous: a dict of arrays (shared, per head or per sequence) flattened."""
    if not isinstance(w, dict):
        if memory != "linear":
            raise TypeError(f"{name} for memory='mlp' must be a dict {{'W1': ..., 'W2': ...}}")
        w = {"W": w}
    names = _names(memory)
    if set(w) != set(names):
        raise ValueError(f"{name} must hold the keys {list(names)} for memory={memory!r}, got {sorted(w)}")
    parts, groups = [], None
    for key, shp in zip(names, _shapes(memory, d)):
        a = _array(w[key], f"{name}[{key!r}]")
        lead = a.shape[:-2]
        if a.shape[-2:] != shp or lead not in ((), (H,), (B, H)):
            raise ValueError(f"{name}[{key!r}] must have shape {shp}, (H, *{shp}) or (B, H, *{shp}) with "
                             f"B, H = {B}, {H}, got {tuple(a.shape)}")
        g = int(np.prod(lead)) if lead else 1
        if groups is not None and g != groups:
            raise ValueError(f"{name}'s arrays must have the same leading axes, got {g} and {groups} sets")
        groups = g
        parts.append(np.ascontiguousarray(a, dtype=dt).reshape(g, shp[0] * shp[1]))  # not -1: g may be 0
    return np.ascontiguousarray(np.concatenate(parts, axis=1))


def _out(a: np.ndarray, torch_out: bool) -> Any:
    if torch_out:
        import torch

        return torch.from_numpy(a)
    return a


# ---- memory with attention (Titans' MAG, MAL, MAC) ----------------------------------------------
# Per-head forms on given q, k, v (B, H, N, d), float32: the library's sliding-window softmax
# attention (attn.attend, "softmax:causal,window=W:0[,sinks=Np]") combined with the memory above.
# Persistent tokens P (pk, pv: (Np, d) or (H, Np, d)) are keys and values placed before the
# sequence that every query sees. The gate y (x) m = y * sigmoid(m) is the reference's; the paper
# first normalises both [unverified].

def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _f32(x: Any, name: str) -> np.ndarray:
    a = _array(x, name)
    if a.dtype != np.float32:
        raise TypeError(f"{name} must be float32 for the attention forms (attn.attend), got {a.dtype}")
    return a


def _bhnd(qa: np.ndarray, *kv: Tuple[str, np.ndarray]) -> Tuple[int, int, int, int]:
    """(B, H, N, d) of q, and k and v (name, array) of q's shape: the attention forms unpack q and
    concatenate k and v with the persistent tokens before anything else checks them."""
    if qa.ndim != 4:
        raise ValueError(f"q must have 4 dimensions (B, H, N, d), got shape {tuple(qa.shape)}")
    for name, a in kv:
        if a.shape != qa.shape:
            raise ValueError(f"{name} must have q's shape (B, H, N, d) = {tuple(qa.shape)}, got {tuple(a.shape)}")
    return qa.shape


def _persistent(persistent: Any, B: int, H: int, d: int) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
    if persistent is None:
        return None, None
    if not isinstance(persistent, (tuple, list)) or len(persistent) != 2:
        raise TypeError("persistent must be None or a pair (pk, pv) of (Np, d) or (H, Np, d) arrays")
    out = []
    for name, x in zip(("persistent[0] (pk)", "persistent[1] (pv)"), persistent):
        a = _f32(x, name)
        if a.ndim == 2:
            a = a[None]
        if a.ndim != 3 or a.shape[0] not in (1, H) or a.shape[2] != d:
            raise ValueError(f"{name} must have shape (Np, d) or (H, Np, d) with H, d = {H}, {d}, got {tuple(a.shape)}")
        out.append(np.broadcast_to(a[None], (B, H, a.shape[1], d)))
    if out[0].shape != out[1].shape:
        raise ValueError(f"pk and pv must have one shape, got {out[0].shape[1:]} and {out[1].shape[1:]}")
    return out[0], out[1]


def _swa(q: np.ndarray, k: np.ndarray, v: np.ndarray, window: Optional[int], pk: Optional[np.ndarray],
         pv: Optional[np.ndarray], scale: Optional[float], threads: int) -> np.ndarray:
    """Causal attention of q over [P | k] (values [P | v]): query i sees P and keys i - window .. i
    (window None: exact causal attention, every earlier key)."""
    from .. import attend

    np_ = 0 if pk is None else pk.shape[2]
    if np_:
        k = np.concatenate([pk, k], axis=2)
        v = np.concatenate([pv, v], axis=2)
    if window is None:
        mech = "softmax:causal"  # bottom-right aligned: every query sees all of P
    else:
        mech = f"softmax:causal,window={window}:0" + (f",sinks={np_}" if np_ else "")
    if scale is not None:
        mech += f",scale={_args.real(scale, 'scale')!r}"
    return attend(np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v), mech, layout="bhnd",
                  threads=threads)


def titans_read(weights: Dict[str, Any], q: Any, memory: str = "linear") -> Any:
    """y = M(q) for q (B, H, N, d) with fixed weights (a dict as titans_memory takes for w0): no
    update (theta = eta = alpha = 0 keep M_0 as it is)."""
    if _wants_grad(q, weights):  # differentiable in q and the weights
        import torch

        qt = q if _is_torch(q) else torch.from_numpy(_array(q, "q"))
        z = torch.zeros((), dtype=qt.dtype)
        y, _ = titans_memory(qt, qt.detach(), torch.zeros_like(qt), z, z, z, memory, weights,
                             batch_size=max(int(qt.shape[2]) if qt.ndim == 4 else 1, 1))
        return y
    qa = _array(q, "q")
    y, _ = titans_memory(qa, qa, np.zeros_like(qa), 0.0, 0.0, 0.0, memory, weights, batch_size=max(_bhnd(qa)[2], 1))
    return _out(y, _is_torch(q))


def titans_mag(q: Any, k: Any, v: Any, theta: Any, eta: Any, alpha: Any, *, window: Optional[int] = None,
               persistent: Any = None,
               memory: str = "linear", w0: Any = None, batch_size: int = 16, loss: str = "sum",
               memory_qkv: Any = None, scale: Optional[float] = None, threads: int = 0) -> Tuple[Any, Dict[str, Any]]:
    """Memory as a gate: o = SWA([P | x]) * sigmoid(M(x)). The attention reads q against
    [pk | k] in a causal window of `window` earlier tokens (P always seen; None: exact causal
    attention over every earlier token); the memory writes
    k -> v (or memory_qkv = (mq, mk, mv), its own projections) and is read at q. Returns
    (o (B, H, N, d), final memory weights)."""
    torch_out = _is_torch(q)
    theta, eta, alpha, w0 = _constants(theta, eta, alpha, w0)  # no backward here: detached, with a warning
    qa, ka, va = (_f32(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    B, H, N, d = _bhnd(qa, ("k", ka), ("v", va))
    window = None if window is None else _args.integer(window, "window", 0)
    pk, pv = _persistent(persistent, B, H, d)
    y = _swa(qa, ka, va, window, pk, pv, scale, threads)
    if memory_qkv is None:
        mq, mk, mv = qa, ka, va
    else:
        if not isinstance(memory_qkv, (tuple, list)) or len(memory_qkv) != 3:
            got = f"a {type(memory_qkv).__name__} of {len(memory_qkv)}" if isinstance(memory_qkv, (tuple, list)) \
                else type(memory_qkv).__name__
            raise TypeError(f"memory_qkv must be None or a triple (mq, mk, mv) of (B, H, N, d) arrays, got {got}")
        mq, mk, mv = (_array(x, f"memory_qkv[{i}]") for i, x in enumerate(memory_qkv))
        for i, x in enumerate((mq, mk, mv)):
            if x.shape != qa.shape:
                raise ValueError(f"memory_qkv[{i}] must have q's shape (B, H, N, d) = {tuple(qa.shape)}, "
                                 f"got {tuple(x.shape)}")
    m, w = titans_memory(mq, mk, mv, theta, eta, alpha, memory, w0, batch_size, loss, threads=threads)
    m = m.numpy() if _is_torch(m) else m
    return _out((y * _sigmoid(m)).astype(np.float32), torch_out), w


def titans_mal(q: Any, k: Any, v: Any, theta: Any, eta: Any, alpha: Any, *, window: Optional[int] = None,
               persistent: Any = None,
               memory: str = "linear", w0: Any = None, batch_size: int = 16, loss: str = "sum",
               proj: Any = None, scale: Optional[float] = None, threads: int = 0) -> Tuple[Any, Dict[str, Any]]:
    """Memory as a layer: h = M(x) (the memory writes k -> v and is read at q), then
    o = SWA([P | h]) (window None: exact causal attention) with h's projections proj = (Wq, Wk, Wv) ((d, d) each, applied as h @ W.T;
    None: identity). Returns (o (B, H, N, d), final memory weights)."""
    torch_out = _is_torch(q)
    theta, eta, alpha, w0 = _constants(theta, eta, alpha, w0)  # no backward here: detached, with a warning
    qa, ka, va = (_f32(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    B, H, N, d = _bhnd(qa, ("k", ka), ("v", va))
    window = None if window is None else _args.integer(window, "window", 0)
    pk, pv = _persistent(persistent, B, H, d)
    h, w = titans_memory(qa, ka, va, theta, eta, alpha, memory, w0, batch_size, loss, threads=threads)
    if proj is None:
        hq = hk = hv = h
    else:
        if not isinstance(proj, (tuple, list)) or len(proj) != 3:
            raise TypeError("proj must be None or a triple (Wq, Wk, Wv) of (d, d) arrays")
        mats = [_f32(p, f"proj[{i}]") for i, p in enumerate(proj)]
        for i, m in enumerate(mats):
            if m.shape != (d, d):
                raise ValueError(f"proj[{i}] must have shape (d, d) = {(d, d)}, got {tuple(m.shape)}")
        hq, hk, hv = (np.ascontiguousarray(h @ m.T) for m in mats)
    return _out(_swa(hq, hk, hv, window, pk, pv, scale, threads), torch_out), w


def titans_mac(q: Any, k: Any, v: Any, theta: Any, eta: Any, alpha: Any, *, segment: int, persistent: Any = None,
               memory: str = "linear", w0: Any = None, batch_size: int = 16, loss: str = "sum", store: str = "y",
               scale: Optional[float] = None, threads: int = 0) -> Tuple[Any, Dict[str, Any]]:
    """Memory as context, over segments of `segment` tokens. Per segment S: the memory as it was
    before S is read at S's queries, h_t = M_prev(q_t); h enters the attention as tokens keyed by
    the queries that read them (key q_t, value h_t: our per-head reading of h W_K, h W_V);
    y = Attn over [P | h | S] (P all seen; h_j and S's token j seen by queries i >= j); then y is
    stored into the memory (store="y": pairs k_t -> y_t; store="kv": the tokens' own k_t -> v_t)
    and o = y * sigmoid(M(y)), M read after the update. Returns (o, final memory weights)."""
    from .. import attend

    torch_out = _is_torch(q)
    theta, eta, alpha, w0 = _constants(theta, eta, alpha, w0)  # no backward here: detached, with a warning
    qa, ka, va = (_f32(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    B, H, N, d = _bhnd(qa, ("k", ka), ("v", va))
    segment = _args.integer(segment, "segment", 1)
    store = _args.text(store, "store")
    if store not in ("y", "kv"):
        raise ValueError(f"store must be 'y' or 'kv', got {store!r}")
    pk, pv = _persistent(persistent, B, H, d)
    np_ = 0 if pk is None else pk.shape[2]
    gates = [np.ascontiguousarray(np.broadcast_to(_array(g, n), (B, H, N)), dtype=np.float32)
             for g, n in ((theta, "theta"), (eta, "eta"), (alpha, "alpha"))]
    weights = titans_init(d, memory) if w0 is None else w0
    momentum = None
    out = np.empty_like(qa)
    mech = "softmax" if scale is None else f"softmax:scale={_args.real(scale, 'scale')!r}"
    for t0 in range(0, N, segment):
        t1 = min(N, t0 + segment)
        c = t1 - t0
        qs, ks, vs = qa[:, :, t0:t1], ka[:, :, t0:t1], va[:, :, t0:t1]
        h = titans_read(weights, qs, memory)
        keys = [qs, ks] if pk is None else [pk, qs, ks]
        vals = [h, vs] if pk is None else [pv, h, vs]
        causal = np.tril(np.ones((c, c), dtype=bool))
        mask = np.concatenate([np.ones((c, np_), dtype=bool), causal, causal], axis=1)
        y = attend(np.ascontiguousarray(qs), np.ascontiguousarray(np.concatenate(keys, axis=2)),
                   np.ascontiguousarray(np.concatenate(vals, axis=2)), mech, attn_mask=mask, layout="bhnd",
                   threads=threads)
        wv = y if store == "y" else vs
        g = [x[:, :, t0:t1] for x in gates]
        m, weights, momentum = titans_memory(np.ascontiguousarray(y), np.ascontiguousarray(ks),
                                             np.ascontiguousarray(wv), *g, memory, weights, batch_size, loss,
                                             s0=momentum, threads=threads, return_momentum=True)
        out[:, :, t0:t1] = y * _sigmoid(m)
    return _out(out, torch_out), {n: _out(np.asarray(x), torch_out) for n, x in weights.items()}
