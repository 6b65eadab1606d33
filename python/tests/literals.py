"""Independent float64 literals of attn's mechanisms, written from published formulas and the rules
documented in include/attn/mechanism.hpp, docs/usage.md ("Semantics worth knowing") and
docs/seeded-draws.md (the seeded draws). Nothing here calls attn: no mask_of, no lsh_buckets, no
kernel. Arrays are NumPy, layout (B, N, H, D) as attend's default, GQA by explicit head mapping
h -> h // (H // Hkv)."""
from __future__ import annotations

import math

import numpy as np

# ---- the counter-based generator (docs/seeded-draws.md) ------------------------------------------

_MASK = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """SplitMix64's output function on a Python int (mod 2^64)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def unit_uniform(x: int) -> float:
    """The top 53 bits of x as a double in [0, 1)."""
    return (x >> 11) * 2.0**-53


def counter_normal(seed: int, a: int, b: int, c: int) -> float:
    """N(0, 1) for (seed, a, b, c): Box-Muller's cosine branch on two uniforms of one hash chain."""
    h = splitmix64(splitmix64(splitmix64(splitmix64(seed) ^ a) ^ b) ^ c)
    u1 = 1.0 - unit_uniform(h)
    u2 = unit_uniform(splitmix64(h))
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)


def normals(seed: int, a: int, rows: int, cols: int) -> np.ndarray:
    """(rows, cols) of counter_normal(seed, a, r, c)."""
    return np.array([[counter_normal(seed, a, r, c) for c in range(cols)] for r in range(rows)])


# ---- exact softmax over a dense visibility mask --------------------------------------------------

def softmax_rows(scores: np.ndarray, visible: np.ndarray):
    """(weights, lse) of float64 score rows over the visible entries; a row with none: 0, -inf."""
    s = np.where(visible, scores, -np.inf)
    top = s.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.where(visible, np.exp(s - top), 0.0)
    tot = e.sum(axis=-1, keepdims=True)
    w = np.where(tot > 0, e / np.where(tot > 0, tot, 1.0), 0.0)
    with np.errstate(divide="ignore"):
        lse = np.where(tot[..., 0] > 0, np.log(np.where(tot[..., 0] > 0, tot[..., 0], 1.0)) + top[..., 0], -np.inf)
    return w, lse


def masked_softmax_attention(q, k, v, visible, scale=None, kv_len=None):
    """O = softmax(scale q k^T over `visible`) v in float64. visible (N, M) or (B, H, N, M) bool.
    Returns (out (B, N, H, Dv), lse (B, H, N), weights (B, H, N, M))."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, N, H, D = q.shape
    M, Hk = k.shape[1], k.shape[2]
    g = H // Hk
    kh = np.repeat(k.transpose(0, 2, 1, 3), g, axis=1)  # (B, H, M, D): head h reads h // g
    vh = np.repeat(v.transpose(0, 2, 1, 3), g, axis=1)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    s = scale * np.einsum("bhnd,bhmd->bhnm", q.transpose(0, 2, 1, 3), kh)
    vis = np.broadcast_to(visible, (B, H, N, M)).copy()
    if kv_len is not None:
        for b, n in enumerate(kv_len):
            vis[b, :, :, n:] = False
    w, lse = softmax_rows(s, vis)
    out = np.einsum("bhnm,bhmd->bnhd", w, vh)
    return out, lse, w


# ---- sparse patterns (positions p = i + M - N) ---------------------------------------------------

def positions(n, m):
    return (np.arange(n) + m - n)[:, None], np.arange(m)[None, :]


def softmax_pattern(n, m, *, causal=False, window=(-1, -1), sinks=0, dilation=1, strided=0, chunk=0):
    """The softmax options as documented: the band is the window (bottom-right; causal caps its right
    side at 0) cut to distances that are multiples of `dilation`, or (strided) |p - j| <= s or
    (p - j) mod s = 0, and to the same chunk; keys j < sinks are visible too; causal on top."""
    p, j = positions(n, m)
    d = p - j
    band = np.ones((n, m), bool)
    left, right = window
    if left >= 0:
        band &= d <= left
    if right >= 0:
        band &= -d <= right
    if dilation > 1:
        band &= d % dilation == 0
    if strided > 0:
        band &= (np.abs(d) <= strided) | (d % strided == 0)
    if chunk > 0:
        band &= (p // chunk) == (j // chunk)
    vis = band | (j < sinks)
    if causal:
        vis &= j <= p
    return vis


def longformer_pattern(n, m, *, window, dilation=1, glob=(), causal=False):
    """Window (dilated) around the diagonal, plus global key positions and global query positions."""
    p, j = positions(n, m)
    d = p - j
    left, right = window
    band = (d <= left) & (-d <= right)
    if dilation > 1:
        band &= d % dilation == 0
    vis = band | np.isin(j, glob) | np.isin(p, glob)
    if causal:
        vis &= j <= p
    return vis


def bigbird_random_blocks(nkb, size_half, glob, random, seed, causal):
    """docs/seeded-draws.md, BigBird: {query block a: sorted random key blocks}."""
    out = {}
    for a in range(glob, nkb):
        rng_end = a + 1 if causal else nkb
        cand = [c for c in range(rng_end) if abs(a - c) > size_half and c >= glob]
        if len(cand) <= random:
            out[a] = cand
            continue
        chosen = []
        draw = 0
        while len(chosen) < random:
            h = splitmix64(splitmix64(splitmix64(seed) ^ a) ^ draw)
            c = int(unit_uniform(h) * rng_end)
            if c in cand and c not in chosen:
                chosen.append(c)
            draw += 1
        out[a] = sorted(chosen)
    return out


def bigbird_pattern(n, m, *, block, window, glob, random, seed, causal=False):
    size = min(block, max(m, 1))
    nkb = -(-m // size)
    half = (window - 1) // 2
    rnd = bigbird_random_blocks(nkb, half, glob, random, seed, causal)
    p, j = positions(n, m)
    a, c = np.broadcast_arrays(p // size, j // size)
    vis = (np.abs(a - c) <= half) | (a < glob) | (c < glob)
    for qa, cs in rnd.items():
        vis |= (a == qa) & np.isin(c, cs)
    vis = np.where(p >= 0, vis, c < glob)  # a query before the first key is in no block: global keys only
    if causal:
        vis &= j <= p
    return vis, rnd


# ---- RoPE, DCA ------------------------------------------------------------------------------------

def rope(x, pos, theta, interleaved=False):
    """x (..., D) at positions pos (broadcast to x's leading dims): pairs (c, c + D/2) (rotate-half)
    or (2c, 2c + 1) (interleaved), pair c turned by pos * theta^(-2c / D)."""
    d = x.shape[-1]
    ang = np.asarray(pos, np.float64)[..., None] * theta ** (-np.arange(0, d, 2) / d)
    cos, sin = np.cos(ang), np.sin(ang)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x, dtype=np.float64)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out
    a, b = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def dca(q, k, v, chunk, local, theta, *, interleaved=False, kv_len=None):
    """Dual Chunk Attention (docs/usage.md / mechanism.hpp): key j at j mod s; the query at p mod s for its
    own chunk, min(s + p mod s, s + local - 1) for the chunk before, s + local - 1 for older ones;
    causal; one softmax. Returns (out, lse, weights)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, N, H, D = q.shape
    M, Hk = k.shape[1], k.shape[2]
    s = chunk
    p, j = positions(N, M)
    p, j = p[:, 0], j[0]
    kt = rope(k.transpose(0, 2, 1, 3), j % s, theta, interleaved)  # (B, Hk, M, D)
    qt = q.transpose(0, 2, 1, 3)
    qpos = [p % s, np.minimum(s + p % s, s + local - 1), np.full(N, s + local - 1)]
    lag = (p // s)[:, None] - (j // s)[None, :]
    part = np.where(lag == 0, 0, np.where(lag == 1, 1, 2))
    scores = np.zeros((B, H, N, M))
    for t in range(3):
        qr = rope(qt, qpos[t], theta, interleaved)
        st = np.einsum("bhnd,bhmd->bhnm", qr, np.repeat(kt, H // Hk, axis=1))
        scores = np.where(part == t, st, scores)
    vis = np.broadcast_to(j[None, :] <= p[:, None], (B, H, N, M)).copy()
    if kv_len is not None:
        for b, n in enumerate(kv_len):
            vis[b, :, :, n:] = False
    w, lse = softmax_rows(scores / math.sqrt(D), vis)
    out = np.einsum("bhnm,bhmd->bnhd", w, np.repeat(v.transpose(0, 2, 1, 3), H // Hk, axis=1))
    return out, lse, w


# ---- LSH ------------------------------------------------------------------------------------------

def lsh_rotations(seed, rounds, d, half):
    """docs/seeded-draws.md: R_r[c, t] = counter_normal(seed, 2, c, r * half + t), stored float32."""
    g = normals(seed, 2, d, rounds * half).astype(np.float32).astype(np.float64)
    return g.reshape(d, rounds, half).transpose(1, 0, 2)  # (rounds, D, half)


def lsh_buckets(x, rot):
    """x (B, N, H, D), rot (rounds, D, half) -> (buckets (B, H, rounds, N), margin): argmax of
    [xR, -xR], the first index on ties; margin = the smallest gap between the top two values."""
    proj = np.einsum("bnhd,rdk->bhrnk", np.asarray(x, np.float64), rot)
    full = np.concatenate([proj, -proj], axis=-1)
    srt = np.sort(full, axis=-1)
    return np.argmax(full, axis=-1), (srt[..., -1] - srt[..., -2]).min()


def lsh_visible(qb, kb, n, m, chunk, causal, kv_len):
    """(B, H, N, M) from the buckets: per round, queries and keys each ordered by (bucket, position)
    (keys past the valid length left out), cut into chunks; query chunk c sees key chunks c, c - 1;
    the union over rounds; causal on top. (No shared_qk here.)"""
    B, H, R, _ = qb.shape
    Hk = kb.shape[1]
    vis = np.zeros((B, H, n, m), bool)
    for b in range(B):
        L = kv_len[b]
        for h in range(H):
            for r in range(R):
                qorder = sorted(range(n), key=lambda i: (qb[b, h, r, i], i))
                korder = sorted(range(L), key=lambda t: (kb[b, h // (H // Hk), r, t], t))
                qc = np.empty(n, int)
                qc[qorder] = np.arange(n) // chunk
                kc = np.full(m, -(10**9))
                kc[korder] = np.arange(L) // chunk
                lag = qc[:, None] - kc[None, :]
                vis[b, h] |= (lag == 0) | (lag == 1)
    if causal:
        p, j = positions(n, m)
        vis &= j <= p
    return vis


# ---- Linformer ------------------------------------------------------------------------------------

def linformer_projections(seed, k, m):
    """docs/seeded-draws.md: E[r, j] = counter_normal(seed, 0, r, j) / sqrt(k), F with stream 1,
    stored float32."""
    sd = 1.0 / math.sqrt(k)
    e = (sd * normals(seed, 0, k, m)).astype(np.float32).astype(np.float64)
    f = (sd * normals(seed, 1, k, m)).astype(np.float32).astype(np.float64)
    return e, f


def linformer(q, k, v, E, F, *, scale=None, kv_len=None):
    """K' = E K, V' = F V over the valid keys (padded columns count 0), then softmax attention to
    the k projected rows. Returns (out, lse, weights (B, H, N, k))."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, N, H, D = q.shape
    M = k.shape[1]
    kv_len = kv_len or [M] * B
    kp = np.zeros((B, E.shape[0], k.shape[2], D))
    vp = np.zeros((B, F.shape[0], v.shape[2], v.shape[3]))
    for b, L in enumerate(kv_len):
        kp[b] = np.einsum("rj,jhd->rhd", E[:, :L], k[b, :L])
        vp[b] = np.einsum("rj,jhd->rhd", F[:, :L], v[b, :L])
    vis = np.ones((N, E.shape[0]), bool)
    return masked_softmax_attention(q, kp, vp, vis, scale=scale)


# ---- Performer ------------------------------------------------------------------------------------

def performer_omega(seed, features, d):
    """docs/seeded-draws.md: block b of d rows = the Q of a QR factorisation (R's diagonal made
    positive) of G_b[r, c] = counter_normal(seed, 0, b, c d + r), transposed; row f then rescaled to
    the norm of (counter_normal(seed, 1, f, r))_r."""
    rows = []
    for b in range(-(-features // d)):
        g = np.array([[counter_normal(seed, 0, b, c * d + r) for c in range(d)] for r in range(d)])
        qm, rm = np.linalg.qr(g)
        qm = qm * np.sign(np.diag(rm))[None, :]
        for c in range(d):
            f = b * d + c
            if f >= features:
                break
            length = math.sqrt(sum(counter_normal(seed, 1, f, r) ** 2 for r in range(d)))
            rows.append(length * qm[:, c])
    return np.array(rows)


def performer_features(x, omega):
    """phi(x) = exp(omega x' - |x'|^2 / 2) / sqrt(m), x' = x d^(-1/4) (FAVOR+); x (..., D)."""
    d = x.shape[-1]
    xs = np.asarray(x, np.float64) * d**-0.25
    return np.exp(xs @ omega.T - 0.5 * (xs * xs).sum(-1, keepdims=True)) / math.sqrt(omega.shape[0])


# ---- linear families: the weight matrix written out ----------------------------------------------

FEATURE_MAPS = {
    "elu": lambda x: np.where(x > 0, x + 1, np.exp(np.minimum(x, 0))),
    "relu": lambda x: np.maximum(x, 0),
    "identity": lambda x: x,
    "exp": np.exp,
    "relu2": lambda x: np.maximum(x, 0) ** 2,
}


def kernel_weights(fq, fk, *, causal=False, kv_len=None, decay=None):
    """w (B, H, N, M) = phi(q_i) . psi(k_j) over the keys row i sees (all valid ones, or j <= p when
    causal), times decay^(p - j); fq (B, N, H, F), fk (B, M, Hk, F)."""
    B, N, H, _ = fq.shape
    M, Hk = fk.shape[1], fk.shape[2]
    w = np.einsum("bnhf,bmhf->bhnm", fq, np.repeat(fk, H // Hk, axis=2))
    vis = np.ones((B, H, N, M), bool)
    p, j = positions(N, M)
    if causal:
        vis &= j <= p
    if kv_len is not None:
        for b, L in enumerate(kv_len):
            vis[b, :, :, L:] = False
    if decay is not None:
        lam = np.broadcast_to(np.asarray(decay, np.float64), (H,))[None, :, None, None]
        w = w * lam ** np.maximum(p - j, 0)
    return np.where(vis, w, 0.0), vis


def apply_weights(w, v, normalize=True, eps=0.0):
    """o_i = sum_j w_ij v_j (/ (sum_j w_ij + eps); a zero denominator gives a zero row)."""
    B, H, N, M = w.shape
    Hk = v.shape[2]
    vh = np.repeat(np.asarray(v, np.float64).transpose(0, 2, 1, 3), H // Hk, axis=1)
    num = np.einsum("bhnm,bhmd->bnhd", w, vh)
    if not normalize:
        return num
    den = (w.sum(-1) + eps).transpose(0, 2, 1)[..., None]
    return np.where(den != 0, num / np.where(den != 0, den, 1.0), 0.0)


def norm_rows(x, kind, eps=1e-6):
    """RMSNorm or LayerNorm (no affine) over the last axis."""
    mean = x.mean(-1, keepdims=True) if kind == "layer" else 0.0
    c = x - mean
    return c / np.sqrt((c * c).mean(-1, keepdims=True) + eps)


# ---- the row statistics (docs/concentration.md) --------------------------------------------------

def row_stats(w, vis, topk):
    """(sparsity, entropy, max_weight, topk_mass) of every row of w over its visible keys (zeros
    included): S = mean|a| / sqrt(mean a^2), H = -sum p log p of p = a / sum a (NaN when a row has a
    negative entry), max and top-k shares of |a|. A row with no key or all zeros: NaN."""
    a = np.where(vis, w, 0.0)
    n = vis.sum(-1)
    ab = np.abs(a)
    l1, l2 = ab.sum(-1), np.sqrt((a * a).sum(-1))
    with np.errstate(divide="ignore", invalid="ignore"):
        S = (l1 / np.maximum(n, 1)) / (l2 / np.sqrt(np.maximum(n, 1)))
        p = a / a.sum(-1, keepdims=True)
        ent = -np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0).sum(-1)
        ent = np.where((a < 0).any(-1), np.nan, ent)
        mx = ab.max(-1) / l1
        top = -np.sort(-ab, axis=-1)[..., :topk].sum(-1) / l1
    bad = (n == 0) | (l1 == 0)
    return tuple(np.where(bad, np.nan, x) for x in (S, ent, mx, top))
