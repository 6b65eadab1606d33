"""Argument checks shared by every public function of the package: Python refuses a wrong type
(TypeError) or a value the binding layer would truncate, wrap or reject with its own message
(ValueError), naming the argument the user passed. Ranges that are facts of a mechanism or a
model are C++'s to check; these only make sure C++ receives the value the user meant."""
from __future__ import annotations

import os
import sys
import warnings
from typing import Any, List, Optional

import numpy as np

UINT64_MAX = 2**64 - 1


def is_torch(x: Any) -> bool:
    """Whether x is a torch object (checked by its type's module: torch is never imported here)."""
    return type(x).__module__.startswith("torch")


def integer(x: Any, name: str, lo: int = -2**63, hi: int = 2**63 - 1) -> int:
    """A true integer (int or NumPy integer, not bool or float) in [lo, hi]; by default the range of
    the C++ int64_t it becomes (the limits of a value are C++'s to check, not repeated here)."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {x!r} ({type(x).__name__})")
    if not lo <= int(x) <= hi:
        if (lo, hi) == (-2**63, 2**63 - 1):
            raise ValueError(f"{name} must be a 64-bit integer, got {int(x)}")
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {int(x)}")
    return int(x)


def seed(x: Any, name: str = "seed") -> int:
    """A seed: an integer in [0, 2**64 - 1] (C++ uint64_t); -1 or 2**64 are refused, not wrapped."""
    return integer(x, name, 0, UINT64_MAX)


def flag(x: Any, name: str) -> bool:
    if not isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {x!r} ({type(x).__name__})")
    return bool(x)


def real(x: Any, name: str) -> float:
    """A number (int, float or a NumPy scalar) as a float: None, str ("0.5"), bool and arrays are
    refused (TypeError naming the argument), never float()-ed."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number (int or float), got {x!r} ({type(x).__name__})")
    try:
        return float(x)
    except OverflowError:
        raise ValueError(f"{name} must be a finite number, got {x!r}") from None


def reals(x: Any, name: str) -> np.ndarray:
    """Numbers as a float64 array: a number, a sequence or array of them, or a torch tensor. Strings,
    None, bools and objects are refused (TypeError naming the argument): the array form of `real`."""
    if is_torch(x):
        x = host(x, name, "a tensor of numbers of a dtype NumPy holds (float32, float64, integers)")
    if isinstance(x, (bool, np.bool_, str, bytes)) or x is None:
        raise TypeError(f"{name} must be a number or an array of numbers, got {x!r} ({type(x).__name__})")
    try:
        a = np.asarray(x)
    except (TypeError, ValueError):  # ragged nesting
        raise TypeError(f"{name} must be a number or an array of numbers, got {type(x).__name__}") from None
    if a.dtype.kind not in "iuf" or (a.dtype.kind == "f" and a.dtype.itemsize > 8):
        raise TypeError(f"{name} must be a number or an array of numbers, got {a.dtype} values")
    return a.astype(np.float64)


def text(x: Any, name: str, none: bool = False) -> Optional[str]:
    """A str (None too when `none`); bytes and other objects are refused, not str()-ed."""
    if x is None and none:
        return None
    if not isinstance(x, str):
        raise TypeError(f"{name} must be a str{' or None' if none else ''}, got {x!r} ({type(x).__name__})")
    return x


def path(x: Any, name: str = "path") -> str:
    """A file path: str, bytes (file-system encoding) or os.PathLike."""
    if isinstance(x, (str, bytes, os.PathLike)):
        p = os.fsdecode(x)
        if "\0" in p:
            raise ValueError(f"{name} must not contain a NUL character, got {p!r}")
        return p
    raise TypeError(f"{name} must be a path (str, bytes or os.PathLike), got {x!r} ({type(x).__name__})")


def writable(x: Any, name: str, why: str) -> Any:
    """x itself, if attn may write into it (a NumPy array whose writeable flag is off may not)."""
    if isinstance(x, np.ndarray) and not x.flags.writeable:
        raise ValueError(f"{name} must be writable ({why}), got a read-only array; pass {name}.copy()")
    return x


def token_ids(x: Any, name: str, vocab: int, empty: bool = False) -> List[int]:
    """Token ids from a sequence of integers or a 1-D integer array, each in [0, vocab). Floats
    (3.7, a float array), bools and nested sequences are refused, never truncated."""
    if isinstance(x, (str, bytes)) or x is None:
        raise TypeError(f"{name} must be a sequence of token ids, got {type(x).__name__}")
    if type(x).__module__.startswith("torch"):
        x = x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        if x.ndim != 1 or (x.size and x.dtype.kind not in "iu"):
            raise TypeError(f"{name} must be a 1-D sequence of integer token ids, got a {x.dtype} array of shape {x.shape}")
        items = x.tolist()
    else:
        try:
            items = list(x)
        except TypeError:
            raise TypeError(f"{name} must be a sequence of token ids, got {x!r} ({type(x).__name__})") from None
    if not items and not empty:
        raise ValueError(f"{name} must hold one token id at least, got none")
    out = []
    for i, t in enumerate(items):
        if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, np.integer)):
            raise TypeError(f"{name}[{i}] must be an integer token id, got {t!r} ({type(t).__name__})")
        if not 0 <= int(t) < vocab:
            raise ValueError(f"{name}[{i}] = {int(t)} is not a token id in [0, {vocab}) (the vocabulary's size)")
        out.append(int(t))
    return out


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def detached(x: Any, name: str, what: str, hint: str = "") -> None:
    """A RuntimeWarning when x is a torch tensor that requires grad (grad enabled) and `what` (a
    plural: "the Titans functions") have no backward: the result is detached, x gets no gradient.
    The warning points at the caller's line outside the attn package, however deep this is called."""
    if not (is_torch(x) and getattr(x, "requires_grad", False)):
        return
    import torch

    if not torch.is_grad_enabled():
        return
    frame, level = sys._getframe(0), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(f"attn: {name} requires grad, but {what} have no backward pass yet: the result is detached and "
                  f"{name} gets no gradient ({hint + '; ' if hint else ''}run under torch.no_grad() or pass "
                  f"{name}.detach() to silence this)", RuntimeWarning, stacklevel=level)


def constant(x: Any, name: str, why: str) -> None:
    """A ValueError when x is a torch tensor that requires grad (grad enabled) where attn has no
    gradient for it (`why`): the caller asked for a gradient path that does not exist, and a
    silent zero would train nothing."""
    if is_torch(x) and getattr(x, "requires_grad", False):
        import torch

        if torch.is_grad_enabled():
            raise ValueError(f"{name} requires grad, but {why}: pass {name}.detach() (or run under torch.no_grad())")


def host(x: Any, name: str, accepted: str) -> Any:
    """A torch tensor as a NumPy array (detached, on the CPU); anything else as it is. A dtype NumPy
    has no equivalent for (bfloat16, the float8 types, ...) is a TypeError naming the argument and
    the `accepted` dtypes, not torch's "Got unsupported ScalarType"."""
    if not is_torch(x):
        return x
    try:
        return x.detach().cpu().numpy()
    except TypeError:
        raise TypeError(f"{name} must be {accepted}, got {x.dtype}") from None


def memory(nbytes: int, name: str, value: Any, what: str) -> None:
    """A MemoryError, before anything is allocated, when `what` (made for argument name = value)
    would take more bytes than this machine has memory (NumPy's own message names no argument,
    and an over-committed allocation ends in the OOM killer instead)."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # no sysconf: NumPy's own MemoryError
        return
    if nbytes > total:
        raise MemoryError(f"{name} = {value!r} needs {_bytes(nbytes)} for {what}, more than this machine's "
                          f"{_bytes(total)} of memory")


def _bytes(n: int) -> str:
    """1536 -> "1.5 KiB"."""
    if n < 1024:
        return f"{n} bytes"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024:
            return f"{size:.1f} {unit}"
    return f"{size / 1024:.1f} PiB"


def floats(x: Any, name: str, dtype: Optional[np.dtype] = None, input: bool = False,
           what: str = "the output-layer softmaxes") -> np.ndarray:
    """A C-contiguous float32/float64 NumPy copy or view of x (torch: detached, on the CPU).
    With `dtype`, x is converted to it (a model computes in its weights' dtype). An `input` (a
    tensor this call's result depends on; not a weight a constructor copies) that requires grad
    gets a warning: no gradient flows back to it through `what`."""
    if is_torch(x):
        if input:
            detached(x, name, what)
        x = x.detach().cpu().numpy() if x.dtype.is_floating_point and x.dtype.itemsize >= 4 else x
    if is_torch(x) or not isinstance(x, np.ndarray):
        kind = str(x.dtype) if is_torch(x) else type(x).__name__
        raise TypeError(f"{name} must be a float32 or float64 numpy.ndarray or torch.Tensor, got {kind}")
    if x.dtype not in (np.float32, np.float64):
        raise TypeError(f"{name} must be float32 or float64, got {x.dtype}")
    return np.ascontiguousarray(x, dtype=dtype if dtype is not None else x.dtype)


def torch_if(a: np.ndarray, torch_out: bool) -> Any:
    """a as a torch tensor (sharing its memory) when torch_out, else a itself."""
    if torch_out:
        import torch

        return torch.from_numpy(a)
    return a


def wants_grad(*xs: Any) -> bool:
    """Whether any of xs is a torch tensor that requires grad, with grad enabled (a block then runs
    its differentiable custom op)."""
    if not any(is_torch(x) and getattr(x, "requires_grad", False) for x in xs):
        return False
    import torch

    return torch.is_grad_enabled()
