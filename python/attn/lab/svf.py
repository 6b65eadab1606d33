"""Transformer-squared's singular-value fine-tuning (SVF; Sun et al. 2025; docs/svf.md).

A weight matrix W (m, n) is decomposed once, W = U diag(s) V^T (thin: r = min(m, n)), and adapted
by scaling its singular values with a vector z of r entries:

    W' = U diag(s * z) V^T,   with preserve_scale:  W' <- W' * sum(s) / sum(s * z)

* :func:`svf_decompose` -- the thin SVD, by LAPACK (NumPy's ``linalg.svd``, gesdd), float64 by
  default (``dtype="float32"`` for a cheaper SVD; float32 or wider is enough).
* :func:`svf_compose` -- W' from (U, s, V^T) and z.
* :func:`svf_mix` -- sum_k alpha_k z_k: expert vectors mixed (arrays, or dicts of one z per matrix).
* :class:`CEM` -- the cross-entropy method that chooses alpha from a fitness callback (the
  few-shot adaptation of the reference): one seeded step per call.
* :class:`SVFAdapter` -- the pieces applied to a loaded :class:`attn.Model`: its MLP matrices
  read as float32, decomposed once, and replaced by W'(z).

NumPy arrays in give NumPy arrays out, torch tensors in give torch tensors out (CPU, no
gradient: training z, REINFORCE in the reference, is outside the library). Bad input (a 2-D
shape that is not one, z of the wrong length, alpha not matching the experts, non-finite values)
raises ValueError naming the argument.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _args
from .._args import is_torch as _is_torch

__all__ = ["svf_decompose", "svf_compose", "svf_mix", "CEM", "SVFAdapter"]

_DTYPES = {"float64": np.float64, "float32": np.float32}


def _array(x: Any, name: str, ndim: int, dims: str) -> np.ndarray:
    """x as a float NumPy array (torch: detached, CPU) of `ndim` dimensions, every value finite."""
    if _is_torch(x):
        x = x.detach().cpu()
        x = x.double().numpy() if x.dtype.is_floating_point and x.dtype.itemsize < 4 else x.numpy()
    if isinstance(x, (list, tuple)):
        x = np.asarray(x, dtype=np.float64)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray or torch.Tensor, got {type(x).__name__}")
    if x.dtype.kind not in "fiu":
        raise TypeError(f"{name} must hold real numbers, got {x.dtype}")
    if x.dtype.kind != "f" or x.dtype.itemsize < 4:
        x = x.astype(np.float64)
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension{'s' if ndim > 1 else ''} {dims}, got shape {x.shape}")
    if not np.isfinite(x).all():
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(x))[0])
        raise ValueError(f"{name} must be finite, got {x[bad]} at index {bad if len(bad) > 1 else bad[0]}")
    return x


def _out(a: np.ndarray, torch_out: bool) -> Any:
    if torch_out:
        import torch

        return torch.from_numpy(np.ascontiguousarray(a))
    return a


def svf_decompose(w: Any, dtype: str = "float64") -> Tuple[Any, Any, Any]:
    """The thin SVD of a matrix: ``(U, s, Vt)`` with ``w = U @ diag(s) @ Vt``.

    w: (m, n) real array or tensor, finite. dtype: the SVD's precision, ``"float64"`` (default)
    or ``"float32"``. Returns U (m, r), s (r,) descending and non-negative, Vt (r, n), r = min(m, n),
    in that dtype and w's kind. Computed by LAPACK's gesdd through ``numpy.linalg.svd``."""
    torch_in = _is_torch(w)
    dt = _args.text(dtype, "dtype")
    if dt not in _DTYPES:
        raise ValueError(f"dtype must be 'float64' or 'float32', got {dtype!r}")
    a = _array(w, "w", 2, "(m, n)")
    if 0 in a.shape:
        raise ValueError(f"w must not be empty, got shape {a.shape}")
    u, s, vt = np.linalg.svd(a.astype(_DTYPES[dt], copy=False), full_matrices=False)
    return _out(u, torch_in), _out(s, torch_in), _out(vt, torch_in)


def svf_compose(u: Any, s: Any, vt: Any, z: Any, preserve_scale: bool = True) -> Any:
    """``W' = U diag(s * z) Vt``, rescaled by ``sum(s) / sum(s * z)`` when preserve_scale (the
    reference's setting: the adapted matrix keeps the sum of the singular values).

    u (m, r), s (r,), vt (r, n): :func:`svf_decompose`'s factors; z (r,): one factor per singular
    value (z = 1 gives W back; a constant z = c gives W with preserve_scale, c W without).
    Computed in the widest float dtype of the arguments (the sums in float64). Returns (m, n),
    torch when u is a tensor. preserve_scale with sum(s * z) = 0 is an error (W' would be 0 / 0)."""
    torch_in = _is_torch(u)
    preserve = _args.flag(preserve_scale, "preserve_scale")
    u_, s_, vt_ = _array(u, "u", 2, "(m, r)"), _array(s, "s", 1, "(r,)"), _array(vt, "vt", 2, "(r, n)")
    z_ = _array(z, "z", 1, "(r,)")
    r = s_.shape[0]
    if u_.shape[1] != r:
        raise ValueError(f"u must have shape (m, r) = (m, {r}) for s of {r} values, got {u_.shape}")
    if vt_.shape[0] != r:
        raise ValueError(f"vt must have shape (r, n) = ({r}, n) for s of {r} values, got {vt_.shape}")
    if z_.shape[0] != r:
        raise ValueError(f"z must have r = {r} values (one per singular value), got {z_.shape[0]}")
    dt = np.result_type(u_.dtype, s_.dtype, vt_.dtype, z_.dtype)
    sz64 = s_.astype(np.float64) * z_.astype(np.float64)
    scale = 1.0
    if preserve:
        total = float(sz64.sum())
        if total == 0.0:
            raise ValueError("z: sum(s * z) is 0, so preserve_scale cannot rescale W' (use preserve_scale=False)")
        scale = float(s_.astype(np.float64).sum()) / total
    w = (u_.astype(dt, copy=False) * (sz64 * scale).astype(dt)) @ vt_.astype(dt, copy=False)
    return _out(w, torch_in)


Experts = Union[Any, Sequence[Mapping[str, Any]]]


def svf_mix(zs: Experts, alpha: Any) -> Any:
    """``z' = sum_k alpha_k z_k``: K expert vectors mixed by the weights alpha (K,).

    zs: a (K, r) array or tensor (the result is (r,), of its kind), a sequence of K vectors of
    one length, or a sequence of K dicts ``{matrix name: z}`` with the same names (the result is
    a dict: each matrix's z mixed). alpha is used as given (CEM's are clipped to [0, 1] and sum
    to 1)."""
    a = _array(alpha, "alpha", 1, "(K,)")
    if isinstance(zs, (list, tuple)) and zs and all(isinstance(e, Mapping) for e in zs):
        if len(zs) != a.shape[0]:
            raise ValueError(f"alpha must have one weight per expert: {len(zs)} experts, got {a.shape[0]} weights")
        names = list(zs[0].keys())
        for k, e in enumerate(zs):
            if set(e.keys()) != set(names):
                raise ValueError(f"zs[{k}] must have the names of zs[0] ({sorted(names)}), got {sorted(e.keys())}")
        return {n: svf_mix([e[n] for e in zs], a) for n in names}
    torch_in = _is_torch(zs) or (isinstance(zs, (list, tuple)) and bool(zs) and _is_torch(zs[0]))
    if isinstance(zs, (list, tuple)):
        if not zs:
            raise ValueError("zs must hold at least one expert vector, got none")
        rows = [_array(z, f"zs[{k}]", 1, "(r,)") for k, z in enumerate(zs)]
        for k, z in enumerate(rows):
            if z.shape != rows[0].shape:
                raise ValueError(f"zs[{k}] must have the length of zs[0] ({rows[0].shape[0]}), got {z.shape[0]}")
        m = np.stack(rows)
    else:
        m = _array(zs, "zs", 2, "(K, r)")
    if m.shape[0] != a.shape[0]:
        raise ValueError(f"alpha must have one weight per expert: {m.shape[0]} experts, got {a.shape[0]} weights")
    dt = np.result_type(m.dtype, a.dtype)
    return _out(a.astype(dt) @ m.astype(dt), torch_in)


Score = Union[float, Tuple[float, ...]]


class CEM:
    """The cross-entropy method over mixing weights alpha (K,), as the reference's few-shot
    adaptation: per generation, ``population`` samples of N(mean, std), clipped to [0, 1] and
    normalised to sum 1 (a sample clipped to all zeros becomes uniform); slot 0 holds the best
    alpha so far (from the second generation on); each is scored by ``fitness(alpha)`` (higher
    is better: a float, or a tuple compared in order, e.g. ``(accuracy, mean log-likelihood)``
    for the reference's tie rule); mean and std become the elites' mean and sample std
    (ddof = 1), the elites being the best ``floor(elite_frac * population)`` samples.

    Starts at mean 1/K and std ``init_std`` (0.5). ``seed`` makes every draw reproducible: the same
    seed and fitness give the same steps on every machine (NumPy's PCG64). A population whose
    samples would not fit in this machine's memory is a MemoryError when the CEM is made."""

    def __init__(self, n_experts: int, population: int = 32, elite_frac: float = 0.2, init_std: float = 0.5,
                 seed: int = 0):
        self.n_experts = _args.integer(n_experts, "n_experts", 1, 2**31 - 1)
        self.population = _args.integer(population, "population", 2, 2**31 - 1)
        frac = _args.real(elite_frac, "elite_frac")
        if not 0.0 < frac <= 1.0:
            raise ValueError(f"elite_frac must be in (0, 1], got {elite_frac}")
        self.elites = int(np.floor(frac * self.population))
        if self.elites < 2:
            raise ValueError(f"elite_frac * population must give at least 2 elites (a sample std needs 2), got "
                             f"floor({frac} * {self.population}) = {self.elites}")
        std = _args.real(init_std, "init_std")
        if not (std >= 0.0 and np.isfinite(std)):
            raise ValueError(f"init_std must be finite and >= 0, got {init_std}")
        # a generation holds about 4 (population, n_experts) float64 arrays (draws, samples, temporaries)
        _args.memory(4 * 8 * self.population * self.n_experts, "population", self.population,
                     f"a generation's samples (population x n_experts = {self.population} x {self.n_experts} "
                     "float64, 4 arrays at once)")
        self.seed = _args.seed(seed)
        self._rng = np.random.Generator(np.random.PCG64(self.seed))
        self.mean = np.full(self.n_experts, 1.0 / self.n_experts)
        self.std = np.full(self.n_experts, std)
        self.best_alpha: Optional[np.ndarray] = None
        self.best_score: Optional[Score] = None
        self.generation = 0

    @staticmethod
    def _normalise(a: np.ndarray) -> np.ndarray:
        a = np.clip(a, 0.0, 1.0)
        total = a.sum(axis=-1, keepdims=True)
        uniform = np.full_like(a, 1.0 / a.shape[-1])
        return np.where(total > 0, a / np.where(total > 0, total, 1.0), uniform)

    def sample(self) -> np.ndarray:
        """This generation's population (population, K), without scoring it (advances the draws)."""
        draws = self._rng.standard_normal((self.population, self.n_experts))
        alphas = self._normalise(self.mean + self.std * draws)
        if self.best_alpha is not None:
            alphas[0] = self.best_alpha
        return alphas

    def step(self, fitness: Callable[[np.ndarray], Score]) -> Tuple[np.ndarray, Score]:
        """One generation: sample, score each alpha with ``fitness``, update mean, std and the best.
        Returns ``(best alpha so far, its score)``. A score that is not a finite real (or tuple of
        them) is a ValueError naming the sample."""
        if not callable(fitness):
            raise TypeError(f"fitness must be callable (alpha -> score), got {type(fitness).__name__}")
        alphas = self.sample()
        scores: List[Tuple[float, ...]] = []
        for i, a in enumerate(alphas):
            raw = fitness(a.copy())
            t = tuple(raw) if isinstance(raw, (tuple, list)) else (raw,)
            try:
                t = tuple(float(x) for x in t)
            except (TypeError, ValueError):
                raise ValueError(f"fitness(alpha[{i}]) must return a real number or a tuple of them, "
                                 f"got {raw!r}") from None
            if not t or not all(np.isfinite(t)):
                raise ValueError(f"fitness(alpha[{i}]) must be finite, got {raw!r}")
            if scores and len(t) != len(scores[0]):
                raise ValueError(f"fitness(alpha[{i}]) returned {len(t)} values, the first sample {len(scores[0])}")
            scores.append(t)
        order = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)  # stable: ties keep slot order
        elite = alphas[order[:self.elites]]
        self.mean = elite.mean(axis=0)
        self.std = elite.std(axis=0, ddof=1)
        top = order[0]
        if self.best_score is None or scores[top] > self._key(self.best_score):
            self.best_alpha, self.best_score = alphas[top].copy(), self._unwrap(scores[top])
        self.generation += 1
        return self.best_alpha.copy(), self.best_score

    @staticmethod
    def _key(score: Score) -> Tuple[float, ...]:
        return tuple(score) if isinstance(score, tuple) else (score,)

    @staticmethod
    def _unwrap(t: Tuple[float, ...]) -> Score:
        return t[0] if len(t) == 1 else t


class SVFAdapter:
    """SVF applied to a loaded :class:`attn.Model`: the matrices ``names`` (default: every MLP
    matrix, gate/up/down of each layer, as the reference adapts) are read as float32
    (:meth:`attn.Model.weight`: quantized ones dequantized), decomposed once (:func:`svf_decompose`,
    ``dtype``), and :meth:`apply` replaces each by its W'(z) (:meth:`attn.Model.set_weight`:
    float32 from then on).

    The decomposition costs one SVD per matrix (SmolLM2-135M: 90 of 1536 x 576, about 0.3 s
    each on one core) and holds U and Vt in ``dtype`` (float32: about 5 MB per SmolLM2 matrix) and the float32 originals
    (3.5 MB each, for :meth:`restore`)."""

    def __init__(self, model: Any, names: Optional[Sequence[str]] = None, dtype: str = "float32"):
        self.model = model
        self.names = list(model.mlp_weight_names() if names is None else names)
        if not self.names:
            raise ValueError("names must list at least one matrix, got none")
        self.factors: Dict[str, Tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.base: Dict[str, np.ndarray] = {}
        for i, n in enumerate(self.names):
            if not isinstance(n, str):
                raise TypeError(f"names[{i}] must be a str, got {type(n).__name__}")
            w = model.weight(n)
            if w.ndim != 2:
                raise ValueError(f"names[{i}]: '{n}' is not a matrix (shape {w.shape})")
            self.base[n] = w
            self.factors[n] = svf_decompose(w, dtype)

    @property
    def sizes(self) -> Dict[str, int]:
        """Entries of z per matrix: r = min(rows, cols)."""
        return {n: int(f[1].shape[0]) for n, f in self.factors.items()}

    def _zs(self, z: Any) -> Dict[str, np.ndarray]:
        if isinstance(z, Mapping):
            extra = sorted(set(z) - set(self.names))
            if extra:
                raise ValueError(f"z names matrices this adapter does not hold: {extra}")
            return {n: z[n] for n in self.names if n in z}
        return {n: z for n in self.names}

    def compose(self, z: Any, preserve_scale: bool = True) -> Dict[str, np.ndarray]:
        """``{name: W'(z)}`` as float32 arrays, without touching the model. z: one vector for every
        matrix (all must then have its length) or a dict ``{name: z}`` (names left out are left out)."""
        out = {}
        for n, zn in self._zs(z).items():
            u, s, vt = self.factors[n]
            try:
                w = svf_compose(u, s, vt, zn, preserve_scale)
            except ValueError as e:
                raise ValueError(f"z for '{n}': {e}") from None
            out[n] = np.ascontiguousarray(np.asarray(w, dtype=np.float32))
        return out

    def apply(self, z: Any, preserve_scale: bool = True) -> None:
        """Sets each matrix of the model to W'(z) (see :meth:`compose`); every W' is made before
        the first is set, so a bad z leaves the model as it was."""
        for n, w in self.compose(z, preserve_scale).items():
            self.model.set_weight(n, w)

    def restore(self) -> None:
        """Sets every matrix back to the float32 weights read when the adapter was made."""
        for n, w in self.base.items():
            self.model.set_weight(n, w)
