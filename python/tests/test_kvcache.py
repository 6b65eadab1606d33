"""flash_attn_with_kvcache and flash_attn_varlen_func against a literal float64 implementation of
flash-attn's semantics written here in torch: append (with rotary), then attend per sequence,
causal and windows aligned bottom-right to each sequence's own length."""
import math

import numpy as np
import pytest
import torch

import attn
from conftest import assert_half_ulps


def rotate(x, cos, sin, positions, interleaved):
    """x (n, h, d) rotated at positions (n,) by tables (P, r/2), float64."""
    x = x.double().clone()
    r2 = cos.shape[1]
    c, s = cos.double()[positions][:, None, :], sin.double()[positions][:, None, :]
    if interleaved:
        a, b = x[..., 0:2 * r2:2].clone(), x[..., 1:2 * r2:2].clone()
        x[..., 0:2 * r2:2], x[..., 1:2 * r2:2] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., :r2].clone(), x[..., r2:2 * r2].clone()
        x[..., :r2], x[..., r2:2 * r2] = a * c - b * s, a * s + b * c
    return x


def reference_attention(q, k, v, causal, window, softcap, scale, slopes=None):
    """One sequence: q (n, h, d), k/v (m, hk, d); float64; returns out (n, h, d), lse (h, n)."""
    n, h, d = q.shape
    m, hk = k.shape[0], k.shape[1]
    g = h // hk
    k, v = k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    s = torch.einsum("ihd,jhd->hij", q.double(), k) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(n)[:, None] + m - n
    j = torch.arange(m)[None, :]
    if slopes is not None:
        s = s - torch.as_tensor(slopes).double()[:, None, None] * (i - j).abs()
    visible = torch.ones(n, m, dtype=torch.bool)
    left, right = window
    if causal:
        right = 0
    if left >= 0:
        visible &= j >= i - left
    if right >= 0:
        visible &= j <= i + right
    s = s.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
    return torch.einsum("hij,jhd->ihd", p, v), lse


def tables(positions, rotary_dim, theta=10000.0):
    inv = theta ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    ang = torch.arange(positions, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def paged_copy(cache, page, rng):
    """A contiguous cache (B, cap, hk, d) as a shuffled page pool and its block table."""
    b, cap, hk, d = cache.shape
    per = cap // page
    ids = rng.permutation(b * per + 2)
    table = torch.tensor(ids[:b * per].reshape(b, per), dtype=torch.int32)
    pool = torch.full((b * per + 2, page, hk, d), float("nan"), dtype=cache.dtype)
    for s in range(b):
        for i in range(per):
            pool[table[s, i]] = cache[s, i * page:(i + 1) * page]
    return pool, table


def unpage(pool, table, cap):
    b, per = table.shape
    page = pool.shape[1]
    return torch.stack([torch.cat([pool[table[s, i]] for i in range(per)])[:cap] for s in range(b)])


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (True, (5, 0)), (False, (-1, -1)), (False, (3, 2))])
@pytest.mark.parametrize("rotary", [None, True, False])
def test_with_kvcache_matches_the_reference(paged, causal, window, rotary):
    rng = np.random.default_rng(0)
    torch.manual_seed(1)
    B, H, HK, D, cap, page, new = 3, 6, 2, 32, 64, 16, 3
    seqlens = torch.tensor([0, 17, 61], dtype=torch.int32)
    k_cache = torch.randn(B, cap, HK, D)
    v_cache = torch.randn(B, cap, HK, D)
    q = torch.randn(B, new, H, D)
    k, v = torch.randn(B, new, HK, D), torch.randn(B, new, HK, D)
    cos = sin = None
    if rotary is not None:
        cos, sin = tables(cap, 16)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    kw = dict(rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens, causal=causal, window_size=window,
              softcap=5.0, rotary_interleaved=bool(rotary), return_softmax_lse=True)
    if paged:
        kp, table = paged_copy(k_cache, page, rng)
        vp = torch.full_like(kp, float("nan"))
        for s in range(B):
            for i in range(cap // page):
                vp[table[s, i]] = v_cache[s, i * page:(i + 1) * page]
        out, lse = attn.flash_attn_with_kvcache(q, kp, vp, k, v, block_table=table, **kw)
        k_after, v_after = unpage(kp, table, cap), unpage(vp, table, cap)
    else:
        out, lse = attn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, **kw)
        k_after, v_after = k_cache, v_cache
    for b in range(B):
        L = int(seqlens[b])
        pos = torch.arange(L, L + new)
        kb = k[b] if rotary is None else rotate(k[b], cos, sin, pos, rotary).float()
        want_k = torch.cat([before_k[b, :L], kb, before_k[b, L + new:]])
        want_v = torch.cat([before_v[b, :L], v[b], before_v[b, L + new:]])
        if rotary is None:
            assert torch.equal(k_after[b], want_k), b
        else:  # rotated in float32 here, in float64 by the reference
            torch.testing.assert_close(k_after[b], want_k, atol=1e-5, rtol=0)
        assert torch.equal(v_after[b], want_v), b
        qpos = pos if (causal or window != (-1, -1)) else torch.full((new,), L)
        qb = q[b] if rotary is None else rotate(q[b], cos, sin, qpos, rotary)
        ref, ref_lse = reference_attention(qb, want_k[:L + new], want_v[:L + new], causal, window, 5.0, D ** -0.5)
        torch.testing.assert_close(out[b].double(), ref, atol=2e-5, rtol=0)
        finite = torch.isfinite(ref_lse)
        torch.testing.assert_close(lse[b].double()[finite], ref_lse[finite], atol=2e-5, rtol=0)
        assert torch.all(lse[b][~finite] == -math.inf)


def test_paged_and_contiguous_give_the_same_bits_and_decoding_equals_one_call():
    rng = np.random.default_rng(3)
    torch.manual_seed(3)
    H, HK, D, cap, total = 8, 2, 64, 96, 40
    q, k, v = torch.randn(1, total, H, D), torch.randn(1, total, HK, D), torch.randn(1, total, HK, D)
    kc, vc = torch.zeros(1, cap, HK, D), torch.zeros(1, cap, HK, D)
    kp, table = paged_copy(kc, 16, rng)
    vp = kp.clone()
    outs, pouts, n = [], [], 0
    for step in (30, 1, 1, 1, 7):
        sl = slice(n, n + step)
        outs.append(attn.flash_attn_with_kvcache(q[:, sl], kc, vc, k[:, sl], v[:, sl], cache_seqlens=n, causal=True))
        pouts.append(attn.flash_attn_with_kvcache(q[:, sl], kp, vp, k[:, sl], v[:, sl], cache_seqlens=n,
                                                 block_table=table, causal=True))
        n += step
    for a, b in zip(outs, pouts):
        assert torch.equal(a, b)
    full = attn.attention(q, k, v, causal=True)
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-5, rtol=0)
    ref, _ = reference_attention(q[0], k[0], v[0], True, (-1, -1), 0.0, D ** -0.5)
    torch.testing.assert_close(torch.cat(outs, 1)[0].double(), ref, atol=1e-5, rtol=0)


def test_bf16_caches_and_alibi():
    torch.manual_seed(4)
    B, H, D, cap = 2, 4, 64, 32
    q = torch.randn(B, 1, H, D, dtype=torch.bfloat16)
    kc, vc = torch.randn(B, cap, H, D, dtype=torch.bfloat16), torch.randn(B, cap, H, D, dtype=torch.bfloat16)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    out = attn.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=[20, 32], causal=True, alibi_slopes=slopes)
    assert out.dtype == torch.bfloat16
    for b, L in enumerate((20, 32)):
        ref, _ = reference_attention(q[b], kc[b, :L], vc[b, :L], True, (-1, -1), 0.0, D ** -0.5, slopes)
        assert_half_ulps(out[b], ref, torch.bfloat16)


def test_failed_calls_write_nothing():
    B, H, D, cap = 2, 2, 16, 8
    q, k, v = torch.randn(B, 2, H, D), torch.randn(B, 2, H, D), torch.randn(B, 2, H, D)
    kc, vc = torch.zeros(B, cap, H, D), torch.zeros(B, cap, H, D)
    with pytest.raises(ValueError, match="the cache of sequence 1 overflows: it holds 7 tokens"):
        attn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=[0, 7], causal=True)
    with pytest.raises(ValueError, match="sequence 1 needs rotary positions up to 6, the tables have 4"):
        cos, sin = tables(4, 8)
        attn.flash_attn_with_kvcache(q, kc, vc, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=[0, 5])
    with pytest.raises(ValueError, match="must name a block in"):
        attn.flash_attn_with_kvcache(q, torch.zeros(3, 4, H, D), torch.zeros(3, 4, H, D), k, v, cache_seqlens=[0, 4],
                                     block_table=torch.tensor([[0, 1], [2, 7]], dtype=torch.int32))
    with pytest.raises(ValueError, match="give both k and v"):
        attn.flash_attn_with_kvcache(q, kc, vc, k, None)
    with pytest.raises(ValueError, match="cache_seqlens must have one value per sequence"):
        attn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=[1, 2, 3])
    assert not kc.any() and not vc.any()


# Regression: new k/v (and q) that are numpy views of the cache rows being
# written were read after those rows were overwritten. Each call must equal the same call on
# copies made before it (output and caches bitwise).
@pytest.mark.parametrize("k_from,v_from,q_from,at", [
    ("k_cache", None, None, 2), ("k_cache", None, None, 4), (None, "k_cache", None, 3), ("v_cache", None, None, 3),
    ("v_cache", "k_cache", None, 3), ("k_cache", "v_cache", None, 3), (None, None, "k_cache", 3),
    ("v_cache", "k_cache", "v_cache", 2)])
def test_new_rows_that_are_views_of_the_cache_are_read_as_they_were(k_from, v_from, q_from, at):
    rng = np.random.default_rng(11)
    B, H, D, cap, new = 2, 2, 8, 16, 3
    caches = {"k_cache": rng.standard_normal((B, cap, H, D), dtype=np.float32),
              "v_cache": rng.standard_normal((B, cap, H, D), dtype=np.float32)}
    own = {n: rng.standard_normal((B, new, H, D), dtype=np.float32) for n in "kvq"}
    k, v, q = ((own[n] if src is None else caches[src][:, at:at + new]) for n, src in
               (("k", k_from), ("v", v_from), ("q", q_from)))
    assert any(np.shares_memory(x, c) for x in (k, v, q) for c in caches.values())
    kc_ref, vc_ref = caches["k_cache"].copy(), caches["v_cache"].copy()
    out_ref = attn.flash_attn_with_kvcache(q.copy(), kc_ref, vc_ref, k.copy(), v.copy(), cache_seqlens=3, causal=True)
    out = attn.flash_attn_with_kvcache(q, caches["k_cache"], caches["v_cache"], k, v, cache_seqlens=3, causal=True)
    np.testing.assert_array_equal(out, out_ref)
    np.testing.assert_array_equal(caches["k_cache"], kc_ref)
    np.testing.assert_array_equal(caches["v_cache"], vc_ref)


def test_caches_or_block_tables_that_would_overwrite_their_own_rows_are_refused():
    rng = np.random.default_rng(12)
    B, H, D = 2, 2, 8
    q, k, v = (rng.standard_normal((B, 2, H, D), dtype=np.float32) for _ in range(3))
    kp, vp = rng.standard_normal((6, 4, H, D), dtype=np.float32), rng.standard_normal((6, 4, H, D), dtype=np.float32)
    kp0, vp0 = kp.copy(), vp.copy()
    # a block listed twice for a sequence that writes it (regression: accepted, its keys overwritten)
    for table, lens, message in [
            ([[0, 0], [2, 3]], [3, 0], r"block_table\[0\] lists block 0 at entries 0 and 1 \(positions 0\.\.3 and 4\.\.7 "
                                       r"of sequence 0\), and this call writes it"),
            ([[1, 2], [3, 3]], [0, 4], r"block_table\[1\] lists block 3 at entries 0 and 1"),
            ([[1, 2], [2, 3]], [4, 4], r"block 2 is written by sequence 0 and read by sequence 1"),
            ([[1, 2], [3, 1]], [0, 4], r"block 1 is written by sequences 0 and 1")]:
        with pytest.raises(ValueError, match=message):
            attn.flash_attn_with_kvcache(q, kp, vp, k, v, cache_seqlens=lens, block_table=np.array(table, np.int32),
                                         causal=True)
    np.testing.assert_array_equal(kp, kp0)
    np.testing.assert_array_equal(vp, vp0)
    # one buffer as both caches, or v_cache a row past k_cache: refused, the buffer unchanged
    buf = rng.standard_normal((B, 9, H, D), dtype=np.float32)
    buf0 = buf.copy()
    for kc, vc in [(buf[:, :8], buf[:, :8]), (buf[:, :8], buf[:, 1:9])]:
        with pytest.raises(ValueError, match=r"written by this call, shares memory with v_cache"):
            attn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=[2, 5], causal=True)
    np.testing.assert_array_equal(buf, buf0)
    # a packed cache (B, cap, 2, H, D): k and v share a buffer but no element, and work
    packed = np.zeros((B, 8, 2, H, D), np.float32)
    kc, vc = np.zeros((B, 8, H, D), np.float32), np.zeros((B, 8, H, D), np.float32)
    out = attn.flash_attn_with_kvcache(q, packed[:, :, 0], packed[:, :, 1], k, v, cache_seqlens=[2, 5], causal=True)
    want = attn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=[2, 5], causal=True)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(packed[:, :, 0], kc)
    np.testing.assert_array_equal(packed[:, :, 1], vc)


@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (False, (-1, -1)), (False, (2, 1))])
def test_varlen_matches_the_reference(causal, window):
    torch.manual_seed(5)
    lq, lk = [3, 0, 12, 1], [3, 4, 20, 9]
    if causal:
        lk = [max(a, b) for a, b in zip(lq, lk)]
    cq = torch.tensor(np.cumsum([0] + lq), dtype=torch.int32)
    ck = torch.tensor(np.cumsum([0] + lk), dtype=torch.int32)
    H, HK, D = 4, 2, 32
    q, k, v = torch.randn(int(cq[-1]), H, D), torch.randn(int(ck[-1]), HK, D), torch.randn(int(ck[-1]), HK, D)
    out, lse, none = attn.flash_attn_varlen_func(q, k, v, cq, ck, max(lq), max(lk), causal=causal,
                                                 window_size=window, return_attn_probs=True)
    assert none is None and lse.shape == (H, int(cq[-1]))
    for b in range(len(lq)):
        qs, ks = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
        if lq[b] == 0:
            continue
        ref, ref_lse = reference_attention(q[qs], k[ks], v[ks], causal, window, 0.0, D ** -0.5)
        torch.testing.assert_close(out[qs].double(), ref, atol=2e-5, rtol=0)
        finite = torch.isfinite(ref_lse)
        torch.testing.assert_close(lse[:, qs].double()[finite], ref_lse[finite], atol=2e-5, rtol=0)


def test_varlen_bad_offsets():
    q = torch.randn(10, 2, 8)
    with pytest.raises(ValueError, match="cu_seqlens_q must end at the packed tokens 10, got 9"):
        attn.flash_attn_varlen_func(q, q, q, [0, 4, 9], [0, 4, 10], 5, 6)
    with pytest.raises(ValueError, match="max_seqlen_k must be at least the longest sequence 6, got 5"):
        attn.flash_attn_varlen_func(q, q, q, [0, 4, 10], [0, 4, 10], 6, 5)
    with pytest.raises(ValueError, match="3 dimensions"):
        attn.flash_attn_varlen_func(q[None], q, q, [0, 10], [0, 10], 10, 10)
