"""Reformer LSH and Dual Chunk Attention through the public API, each against a literal NumPy
version written from the papers (independent of the C++ code): LSH's buckets are argmax([xR, -xR]),
its chunks a dense mask we build here from those buckets (then torch SDPA attends with it); DCA is
one softmax over scores whose RoPE positions are remapped per chunk."""
import numpy as np
import pytest
import torch

import attn


def rng_qkv(seed, b, n, h, d, m=None, hk=None, scale=1.0):
    r = np.random.default_rng(seed)
    m, hk = m or n, hk or h
    q = (scale * r.standard_normal((b, n, h, d))).astype(np.float32)
    k = (scale * r.standard_normal((b, m, hk, d))).astype(np.float32)
    v = r.standard_normal((b, m, hk, d)).astype(np.float32)
    return q, k, v


# ---- LSH ---------------------------------------------------------------------------------------

def lsh_mask(qb, kb, n, m, chunk, causal, shared, lengths):
    """(B, H, N, M) bool from the buckets: per round, sort each side by (bucket, position); query
    chunk c sees key chunks c and c - 1; the union over rounds; causal; under shared_qk no self
    unless nothing else is visible."""
    b_, h_, rounds, _ = qb.shape
    out = np.zeros((b_, h_, n, m), dtype=bool)
    for b in range(b_):
        L = lengths[b]
        for h in range(h_):
            hk = h if shared else h * kb.shape[1] // h_
            for r in range(rounds):
                qkey = qb[b, h, r] + (np.arange(n) >= L) * 10**6 if shared else qb[b, h, r]
                q_rank = np.empty(n, int)
                q_rank[np.lexsort((np.arange(n), qkey))] = np.arange(n)
                k_rank = np.full(m, -1)
                kk = kb[b, hk, r, :L]
                k_rank[np.lexsort((np.arange(L), kk))] = np.arange(L)
                qc = (q_rank // chunk)[:, None]
                kc = np.where(k_rank >= 0, k_rank // chunk, -10**9)[None, :]
                out[b, h] |= (qc - kc == 0) | (qc - kc == 1)
            i, j = np.arange(n)[:, None], np.arange(m)[None, :]
            if causal:
                out[b, h] &= j <= i + m - n
            if shared:
                others = out[b, h] & (i != j)
                lonely = ~others.any(axis=1)
                out[b, h] = others
                for t in np.nonzero(lonely)[0]:
                    out[b, h, t, t] = t < L
    return out


def test_lsh_buckets_are_the_argmax_of_the_given_rotations():
    q, k, _ = rng_qkv(1, 2, 40, 3, 8, hk=1)
    rot = np.random.default_rng(2).standard_normal((3, 8, 4)).astype(np.float32)
    qb, kb = attn.lsh_buckets(q, k, "lsh:buckets=8,rounds=3", rotations=rot)
    assert qb.shape == (2, 3, 3, 40) and kb.shape == (2, 1, 3, 40) and qb.dtype == np.int32

    def buckets(x):  # x (B, N, H, D) -> (B, H, rounds, N)
        proj = np.einsum("bnhd,rdk->bhrnk", x.astype(np.float64), rot.astype(np.float64))
        return np.argmax(np.concatenate([proj, -proj], axis=-1), axis=-1)

    np.testing.assert_array_equal(qb, buckets(q))
    np.testing.assert_array_equal(kb, buckets(k))


@pytest.mark.parametrize("text", ["lsh:buckets=8,rounds=2,chunk=8,seed=1",
                                  "lsh:buckets=4,rounds=3,chunk=16,seed=2,causal",
                                  "lsh:buckets=8,rounds=2,chunk=8,seed=3,shared_qk",
                                  "lsh:buckets=6,rounds=3,chunk=5,seed=4,causal,shared_qk"])
@pytest.mark.parametrize("pad", [False, True])
def test_lsh_attends_to_its_buckets_chunks(text, pad):
    n, h, d = 90, 4, 16
    q, k, v = rng_qkv(3, 2, n, h, d, hk=2)
    lengths = [n, 61] if pad else [n, n]
    shared = "shared_qk" in text
    kw = dict(key_padding_lengths=lengths) if pad else {}
    qb, kb = attn.lsh_buckets(q, k, text, **kw)
    chunk = int(text.split("chunk=")[1].split(",")[0])
    mask = lsh_mask(qb, kb, n, n, chunk, "causal" in text, shared, lengths)
    out, lse = attn.attend(q, k, v, text, return_lse=True, **kw)
    tq, tk, tv = (torch.from_numpy(x).transpose(1, 2).double() for x in (q, k, v))
    tk, tv = tk.repeat_interleave(2, dim=1), tv.repeat_interleave(2, dim=1)
    want = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=torch.from_numpy(mask))
    np.testing.assert_allclose(out, want.transpose(1, 2).numpy(), atol=2e-5)
    scores = (tq @ tk.transpose(-1, -2)) / np.sqrt(d)
    want_lse = torch.logsumexp(scores.masked_fill(~torch.from_numpy(mask), -np.inf), dim=-1).numpy()
    np.testing.assert_allclose(lse, want_lse, atol=2e-5)


def test_lsh_errors_name_the_argument():
    q, k, v = rng_qkv(4, 1, 5, 2, 8, m=6)
    with pytest.raises(ValueError, match="lsh shared_qk needs as many queries as keys"):
        attn.attend(q, k, v, "lsh:shared_qk")
    with pytest.raises(ValueError, match="lsh_buckets needs an lsh mechanism"):
        attn.lsh_buckets(q, k, "softmax")
    with pytest.raises(ValueError, match="lsh has no fixed key pattern"):
        attn.mask_of("lsh", 4)


# ---- DCA ---------------------------------------------------------------------------------------

def rope64(x, pos, theta):
    """x (..., D) rotated (rotate-half) at positions pos (broadcast over x's leading dims)."""
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d, 2) / d)
    ang = pos[..., None] * inv
    a, b = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([a * np.cos(ang) - b * np.sin(ang), a * np.sin(ang) + b * np.cos(ang)], axis=-1)


def dca_literal(q, k, v, s, w, theta, lengths=None):
    """An et al. 2024, written out: keys at j mod s; the query at i mod s (same chunk), at
    min(s + i mod s, s + w - 1) (the chunk before), at s + w - 1 (older chunks); causal; one softmax."""
    b_, n, h, d = q.shape
    m, hk = k.shape[1], k.shape[2]
    out = np.zeros((b_, n, h, v.shape[-1]))
    p = np.arange(n) + m - n
    j = np.arange(m)
    kr = rope64(k.astype(np.float64).transpose(0, 2, 1, 3), (j % s).astype(float), theta)  # (B, Hk, M, D)
    qpos = [p % s, np.minimum(s + p % s, s + w - 1), np.full(n, s + w - 1)]
    qr = [rope64(q.astype(np.float64).transpose(0, 2, 1, 3), x.astype(float), theta) for x in qpos]
    lag = (p // s)[:, None] - (j // s)[None, :]
    part = np.where(lag == 0, 0, np.where(lag == 1, 1, 2))
    for b in range(b_):
        for hh in range(h):
            kk = kr[b, hh * hk // h]
            sc = np.stack([qr[t][b, hh] @ kk.T for t in range(3)])  # (3, N, M)
            scores = np.take_along_axis(sc, part[None], axis=0)[0] / np.sqrt(d)
            vis = j[None, :] <= p[:, None]
            if lengths is not None:
                vis = vis & (j[None, :] < lengths[b])
            scores = np.where(vis, scores, -np.inf)
            e = np.exp(scores - scores.max(axis=1, keepdims=True))
            out[b, :, hh] = (e / e.sum(axis=1, keepdims=True)) @ v[b, :, hh * hk // h].astype(np.float64)
    return out


@pytest.mark.parametrize("n,m,s,w", [(70, 70, 16, 4), (70, 70, 24, 24), (3, 150, 32, 8), (90, 90, 128, 16)])
def test_dca_is_the_papers_remapped_softmax(n, m, s, w):
    q, k, v = rng_qkv(5, 2, n, 4, 16, m=m, hk=2, scale=2.0)
    got = attn.attend(q, k, v, f"dca:chunk={s},local={w},theta=500")
    np.testing.assert_allclose(got, dca_literal(q, k, v, s, w, 500.0), atol=3e-5)


def test_dca_with_one_chunk_is_causal_rope_attention():
    q, k, v = rng_qkv(6, 1, 64, 2, 32)
    got = attn.attend(q, k, v, "dca:chunk=64,local=16")
    qr, kr = attn.rope(q.copy()), attn.rope(k.copy())
    np.testing.assert_allclose(got, attn.attend(qr, kr, v, "softmax:causal"), atol=2e-5)
