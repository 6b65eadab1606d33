"""Independent oracles: attn.attend against float64 NumPy literals written from
the papers' formulas and attn's documented rules (literals.py; docs/seeded-draws.md for the seeded
draws). The expected answers never come from attn (no mask_of, lsh_buckets or reference form):
sparse patterns, BigBird's random blocks, LSH with N != M and half types, DCA with padding and
interleaved RoPE, Linformer's seeded E/F with padding, NormAttn's LayerNorm, Performer (given and
seeded features), non-causal PolaFormer, and the streamed statistics of every non-softmax family
(and of the softmax patterns, LSH and DCA).

Tolerances: float32 outputs within 1e-5 * max(1, max|ref|) of the float64 literal (the float32
floor of docs/testing.md's rule, with 10x room for the different summation orders); LSE within
1e-5 * (1 + |ref|); bfloat16/float16 outputs per element within 0.6 ulp (conftest.assert_half_ulps)
of the literal run on the half-rounded inputs; statistics within 2e-5 * max(1, |ref|)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import attn
import literals as L
from conftest import assert_half_ulps, assert_rule


def close32(ours, ref, rel=1e-5):
    """max |ours - ref| <= rel * max(1, max|ref|), and NaN/inf in the same places."""
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    if ours.shape != ref.shape:
        return False
    same_nonfinite = np.array_equal(np.isnan(ours), np.isnan(ref)) and np.array_equal(np.isinf(ours), np.isinf(ref))
    fin = np.isfinite(ref)
    if not same_nonfinite:
        return False
    if np.isinf(ref).any() and not np.array_equal(ours[np.isinf(ref)], ref[np.isinf(ref)]):
        return False
    if not fin.any():
        return True
    err = np.abs(ours[fin] - ref[fin]).max()
    return err <= rel * max(1.0, np.abs(ref[fin]).max())


def assert_close32(ours, ref, what, rel=1e-5):
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    fin = np.isfinite(ref) & np.isfinite(ours)
    err = np.abs(ours[fin] - ref[fin]).max() if fin.any() else 0.0
    top = np.abs(ref[fin]).max() if fin.any() else 0.0
    assert close32(ours, ref, rel), f"{what}: max error {err:.3g} (bound {rel:g} * max(1, {top:.3g}))"


def assert_lse(ours, ref, what="lse"):
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    np.testing.assert_array_equal(np.isneginf(ours), np.isneginf(ref), err_msg=f"{what}: -inf rows")
    fin = np.isfinite(ref)
    assert (np.abs(ours[fin] - ref[fin]) <= 1e-5 * (1 + np.abs(ref[fin]))).all(), f"{what}: off by more than 1e-5"


def each_form(q, k, v, text, **kw):
    """(form, result) of every form of the mechanism (attn.info's list) that runs these inputs: each
    is compared with the literal, the float64 reference form included."""
    ran = []
    for form in attn.info(text)["forms"]:
        try:
            res = attn.attend(q, k, v, text, form=form, **kw)
        except ValueError as e:
            if "cannot run" in str(e):
                continue
            raise
        ran.append(form)
        yield form, res
    assert ran, f"{text}: no form ran"


def qkv(seed, b, n, h, d, m=None, hk=None, dv=None, scale=1.0):
    r = np.random.default_rng(seed)
    m, hk, dv = m or n, hk or h, dv or d
    return ((scale * r.standard_normal((b, n, h, d))).astype(np.float32),
            (scale * r.standard_normal((b, m, hk, d))).astype(np.float32),
            r.standard_normal((b, m, hk, dv)).astype(np.float32))


def as_half(x, dtype):
    """A float32 array as a torch half tensor, and the float64 NumPy array of its exact values."""
    t = torch.from_numpy(x).to(dtype)
    return t, t.double().numpy()


# ---- sparse patterns ------------------------------------------------------------------------------

PATTERNS = [
    # non-causal dilation, strided and sinks
    ("softmax:dilation=3", dict(dilation=3)),
    ("softmax:window=9:5,dilation=2", dict(window=(9, 5), dilation=2)),
    ("softmax:strided=5", dict(strided=5)),
    ("softmax:window=12:7,strided=4", dict(window=(12, 7), strided=4)),
    ("softmax:window=3:2,sinks=4", dict(window=(3, 2), sinks=4)),
    ("softmax:window=0:0,sinks=2,dilation=4", dict(window=(0, 0), sinks=2, dilation=4)),
    # chunk + window + sinks
    ("softmax:chunk=8,window=5:2,sinks=3", dict(chunk=8, window=(5, 2), sinks=3)),
    ("softmax:causal,chunk=7,window=4:0,sinks=2", dict(causal=True, chunk=7, window=(4, 0), sinks=2)),
    ("softmax:causal,chunk=16,window=20:0,sinks=1", dict(causal=True, chunk=16, window=(20, 0), sinks=1)),
]


@pytest.mark.parametrize("text,opts", PATTERNS)
@pytest.mark.parametrize("n,m", [(37, 37), (11, 45), (45, 19), (3, 45)])
def test_softmax_patterns_equal_their_literal(text, opts, n, m):
    q, k, v = qkv(len(text) + n, 2, n, 4, 16, m=m, hk=2)
    vis = L.softmax_pattern(n, m, **opts)
    want, want_lse, want_p = L.masked_softmax_attention(q, k, v, vis)
    for form, (out, lse) in each_form(q, k, v, text, return_lse=True):
        assert_close32(out, want, f"{text} {form}")
        assert_lse(lse, want_lse, f"{text} {form}")
    probs = attn.attend(q, k, v, text, return_probs=True)[1]
    np.testing.assert_array_equal(probs > 0, want_p > 0, err_msg=f"{text}: visible keys")


LONGFORMER = [
    ("longformer:window=6:0,dilation=2,global=3;20,causal", dict(window=(6, 0), dilation=2, glob=[3, 20], causal=True)),
    ("longformer:window=4:4,dilation=3,global=0;31", dict(window=(4, 4), dilation=3, glob=[0, 31])),
    ("longformer:window=5:2,dilation=2,global=7,causal", dict(window=(5, 2), dilation=2, glob=[7], causal=True)),
]


@pytest.mark.parametrize("text,opts", LONGFORMER)
@pytest.mark.parametrize("n,m", [(40, 40), (9, 40), (40, 25), (2, 40)])
def test_longformer_with_dilation_and_causal_equals_its_literal(text, opts, n, m):
    q, k, v = qkv(n + m, 2, n, 2, 8, m=m, hk=1)
    vis = L.longformer_pattern(n, m, **opts)
    want, want_lse, want_p = L.masked_softmax_attention(q, k, v, vis)
    for form, (out, lse) in each_form(q, k, v, text, return_lse=True):
        assert_close32(out, want, f"{text} {form}")
        assert_lse(lse, want_lse, f"{text} {form}")
    probs = attn.attend(q, k, v, text, return_probs=True)[1]
    np.testing.assert_array_equal(probs > 0, want_p > 0, err_msg=f"{text}: visible keys")


def test_sparse_patterns_in_bfloat16_and_float16():
    q, k, v = qkv(3, 1, 30, 2, 16, m=41, hk=1)
    text, opts = "softmax:chunk=8,window=5:2,sinks=3", dict(chunk=8, window=(5, 2), sinks=3)
    for dtype in (torch.bfloat16, torch.float16):
        (tq, q64), (tk, k64), (tv, v64) = (as_half(x, dtype) for x in (q, k, v))
        want = L.masked_softmax_attention(q64, k64, v64, L.softmax_pattern(30, 41, **opts))[0]
        check_half(tq, tk, tv, text, torch.from_numpy(want), dtype)
        lf = "longformer:window=4:4,dilation=3,global=0;31"
        want = L.masked_softmax_attention(q64, k64, v64, L.longformer_pattern(30, 41, window=(4, 4), dilation=3,
                                                                           glob=[0, 31]))[0]
        check_half(tq, tk, tv, lf, torch.from_numpy(want), dtype)


def check_half(tq, tk, tv, text, want, dtype):
    """Half storage with float32 products: each element within HALF_ULPS of float64. bfloat16 inputs
    compute with bf16 products by default (P rounded to bf16, where per-element ulps do not apply):
    their max error at most twice the float32 products' (+ the bf16 rounding floor)."""
    f32 = attn.attend(tq, tk, tv, text, precision="f32")
    assert_half_ulps(f32, want, dtype, text)
    if dtype == torch.bfloat16:
        assert_rule(attn.attend(tq, tk, tv, text), want, f32, dtype, text, per_element=False)


# ---- BigBird's random blocks ----------------------------------------------------------------------

BIGBIRD = [
    dict(block=4, window=1, glob=1, random=2, seed=5, causal=False),
    dict(block=4, window=3, glob=1, random=3, seed=11, causal=False),
    dict(block=5, window=1, glob=0, random=2, seed=7, causal=True),
    dict(block=3, window=3, glob=2, random=1, seed=2**63 + 12345, causal=True),
    dict(block=64, window=1, glob=0, random=2, seed=1, causal=False),  # a block longer than M: one block
    dict(block=6, window=5, glob=1, random=4, seed=3, causal=False),  # fewer candidates than random: all
]


def bigbird_text(o):
    return (f"bigbird:block={o['block']},window={o['window']},global={o['glob']},random={o['random']},"
            f"seed={o['seed']}" + (",causal" if o["causal"] else ""))


@pytest.mark.parametrize("o", BIGBIRD, ids=bigbird_text)
@pytest.mark.parametrize("n,m", [(58, 58), (17, 61), (4, 61)])
def test_bigbird_random_blocks_are_the_documented_draw(o, n, m):
    """Which key blocks each query block sees, from docs/seeded-draws.md's rule in NumPy: the
    weights attn applies are positive on exactly those keys, and the output is softmax over them."""
    text = bigbird_text(o)
    q, k, v = qkv(o["seed"] % 1000 + n, 2, n, 2, 8, m=m, hk=1)
    vis, rnd = L.bigbird_pattern(n, m, **o)
    if o["block"] < m and o["random"] < 3:  # the draw is exercised, not all candidates
        assert any(len(c) == o["random"] for c in rnd.values())
    want, want_lse, want_p = L.masked_softmax_attention(q, k, v, vis)
    probs = attn.attend(q, k, v, text, return_probs=True)[1]
    np.testing.assert_array_equal(probs > 0, want_p > 0, err_msg=f"{text}: visible keys")
    for form, (out, lse) in each_form(q, k, v, text, return_lse=True):
        assert_close32(out, want, f"{text} {form}")
        assert_lse(lse, want_lse, f"{text} {form}")


@pytest.mark.parametrize("seed", [0, 1, 7, 2**64 - 1])
@pytest.mark.parametrize("causal", [False, True])
def test_mask_of_bigbird_is_the_documented_draw(seed, causal):
    """attn.mask_of (which other Python tests use to build torch masks) against the literal draw."""
    for n, m, block, window, glob, random in ((200, 200, 8, 3, 2, 3), (31, 203, 7, 1, 1, 5), (9, 64, 4, 5, 0, 2)):
        text = f"bigbird:block={block},window={window},global={glob},random={random},seed={seed}"
        text += ",causal" if causal else ""
        want, _ = L.bigbird_pattern(n, m, block=block, window=window, glob=glob, random=random, seed=seed,
                                    causal=causal)
        np.testing.assert_array_equal(attn.mask_of(text, n, m), want, err_msg=text)


def test_bigbird_oracle_catches_a_different_draw():
    """The comparison can fail: the literal with the neighbouring seed (or one random block
    dropped) is not what attn computes."""
    o = dict(block=4, window=1, glob=1, random=2, seed=5, causal=False)
    q, k, v = qkv(9, 1, 60, 2, 8, hk=1)
    out = attn.attend(q, k, v, bigbird_text(o))
    right = L.masked_softmax_attention(q, k, v, L.bigbird_pattern(60, 60, **o)[0])[0]
    assert close32(out, right)
    wrong_seed = L.masked_softmax_attention(q, k, v, L.bigbird_pattern(60, 60, **dict(o, seed=6))[0])[0]
    assert not close32(out, wrong_seed)
    vis, rnd = L.bigbird_pattern(60, 60, **o)
    a, c = 7, rnd[7][0]
    vis[a * 4:(a + 1) * 4, c * 4:(c + 1) * 4] = False  # one random block fewer
    assert not close32(out, L.masked_softmax_attention(q, k, v, vis)[0])


def test_bigbird_global_blocks_are_seen_by_queries_before_the_first_key():
    """Non-causal, N > M: the first N - M queries are in no block and see the global key blocks only
    (as Longformer's global keys and sinks are seen by them)."""
    n, m, size, glob = 30, 20, 4, 1
    q, k, v = qkv(1, 1, n, 1, 8, m=m)
    probs = attn.attend(q, k, v, f"bigbird:block={size},window=1,global={glob},random=2,seed=5", return_probs=True)[1]
    early = np.arange(n) + m - n < 0  # the first N - M queries
    assert (probs[0, 0][early][:, :glob * size] > 0).all()
    assert (probs[0, 0][early][:, glob * size:] == 0).all()


def random_pattern(r, n, m):
    """A random softmax / Longformer / BigBird text form and its literal dense mask."""
    kind = int(r.integers(0, 3))
    causal = bool(r.integers(0, 2))
    if kind == 0:
        opts, o = (["causal"] if causal else []), {}
        if r.random() < 0.7:
            o["window"] = (int(r.integers(-1, 10)), int(r.integers(-1, 10)))
            opts.append("window={}:{}".format(*o["window"]))
        if r.random() < 0.5:
            o["sinks"] = int(r.integers(0, 5))
            opts.append(f"sinks={o['sinks']}")
        x = r.random()
        if x < 0.6:
            name = "dilation" if x < 0.3 else "strided"
            o[name] = int(r.integers(1, 6))
            opts.append(f"{name}={o[name]}")
        if r.random() < 0.5:
            o["chunk"] = int(r.integers(1, 12))
            opts.append(f"chunk={o['chunk']}")
        return "softmax" + (":" + ",".join(opts) if opts else ""), L.softmax_pattern(n, m, causal=causal, **o)
    if kind == 1:
        win, dil = (int(r.integers(0, 8)), int(r.integers(0, 8))), int(r.integers(1, 4))
        glob = sorted({int(g) for g in r.integers(0, 50, size=int(r.integers(1, 4)))})
        text = (f"longformer:window={win[0]}:{win[1]},dilation={dil},global=" + ";".join(map(str, glob))
                + (",causal" if causal else ""))
        return text, L.longformer_pattern(n, m, window=win, dilation=dil, glob=glob, causal=causal)
    o = dict(block=int(r.integers(1, 9)), window=int(r.choice([1, 3, 5])), glob=int(r.integers(0, 3)),
             random=int(r.integers(0, 4)), seed=int(r.integers(0, 2**63)), causal=causal)
    return bigbird_text(o), L.bigbird_pattern(n, m, **o)[0]


def test_random_pattern_options_equal_the_literal():
    """150 seeded random combinations of the pattern options and shapes: attn.mask_of, the keys
    attend weighs and its output against the literal."""
    r = np.random.default_rng(2026)
    for it in range(150):
        n, m = int(r.integers(1, 40)), int(r.integers(1, 40))
        text, vis = random_pattern(r, n, m)
        q, k, v = qkv(it, 1, n, 1, 4, m=m)
        np.testing.assert_array_equal(attn.mask_of(text, n, m), vis, err_msg=f"{text} N={n} M={m}")
        out, probs = attn.attend(q, k, v, text, return_probs=True)
        np.testing.assert_array_equal(probs[0, 0] > 0, vis, err_msg=f"{text} N={n} M={m}: weighed keys")
        assert_close32(out, L.masked_softmax_attention(q, k, v, vis)[0], f"{text} N={n} M={m}")


# ---- LSH with N != M and half types ---------------------------------------------------------------

def lsh_case(text, n, m, seed, rotations, kv_len, dtype, hk=2):
    q, k, v = qkv(seed, 2, n, 4, 16, m=m, hk=hk)
    o = dict(part.split("=") for part in text.split(":")[1].split(",") if "=" in part)
    buckets, rounds, chunk = int(o["buckets"]), int(o["rounds"]), int(o["chunk"])
    rot = (L.lsh_rotations(int(o["seed"]), rounds, 16, buckets // 2) if rotations is None
           else rotations.astype(np.float64))
    if dtype == torch.float32:
        args, (q64, k64, v64) = (q, k, v), (q, k, v)
    else:
        (tq, q64), (tk, k64), (tv, v64) = (as_half(x, dtype) for x in (q, k, v))
        args = (tq, tk, tv)
    qb, qmargin = L.lsh_buckets(q64, rot)
    kb, kmargin = L.lsh_buckets(k64, rot)
    # float32 hashing (D = 16 products of magnitude < 10: error < 16 * 10 * 2^-24 = 1e-5) cannot flip
    # a bucket whose top two projections are this far apart
    assert min(qmargin, kmargin) > 1e-4, "near-tie in the literal's buckets: pick another seed"
    vis = L.lsh_visible(qb, kb, n, m, chunk, "causal" in text, kv_len)
    want, want_lse, want_p = L.masked_softmax_attention(q64, k64, v64, vis, kv_len=kv_len)
    kw = dict(key_padding_lengths=kv_len)
    if rotations is not None:
        kw["rotations"] = rotations
    return args, kw, want, want_lse, want_p


@pytest.mark.parametrize("text", ["lsh:buckets=8,rounds=2,chunk=6,seed=3",
                                  "lsh:buckets=4,rounds=3,chunk=5,seed=8,causal"])
@pytest.mark.parametrize("n,m", [(23, 50), (50, 23)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_lsh_with_n_not_m_and_half_types_equals_its_literal(text, n, m, dtype):
    """Seeded rotations from docs/seeded-draws.md; buckets, sort, chunks and union in NumPy."""
    args, kw, want, want_lse, want_p = lsh_case(text, n, m, n * 7 + m, None, [m, m - 6], dtype)
    for form, (out, lse, probs) in each_form(*args, text, return_lse=True, return_probs=True, **kw):
        np.testing.assert_array_equal(np.asarray(probs) > 0, want_p > 0, err_msg=f"{text} {form}: visible keys")
        assert_lse(lse, want_lse, f"{text} {form}")
        if dtype == torch.float32:
            assert_close32(out, want, f"{text} {form}")
        else:
            assert out.dtype == dtype
            assert_half_ulps(out, torch.from_numpy(want), dtype, f"{text} {form}")


@pytest.mark.parametrize("seed", [0, 5, 2**63])
def test_lsh_buckets_use_the_documented_seeded_rotations(seed):
    """attn.lsh_buckets (the buckets attend uses) against argmax([xR, -xR]) of the literal's R."""
    q, k, _ = qkv(seed % 97, 2, 19, 2, 16, m=33, hk=1)
    text = f"lsh:buckets=10,rounds=3,seed={seed}"
    rot = L.lsh_rotations(seed, 3, 16, 5)
    (qb, qmargin), (kb, kmargin) = L.lsh_buckets(q, rot), L.lsh_buckets(k, rot)
    assert min(qmargin, kmargin) > 1e-4, "near-tie in the literal's buckets: pick another seed"
    got_q, got_k = attn.lsh_buckets(q, k, text)
    np.testing.assert_array_equal(got_q, qb)
    np.testing.assert_array_equal(got_k, kb)
    other = L.lsh_buckets(q, L.lsh_rotations(seed + 1, 3, 16, 5))[0]
    assert (other != got_q).any()


def test_lsh_given_rotations_with_n_not_m():
    rot = np.random.default_rng(4).standard_normal((2, 16, 3)).astype(np.float32)
    text = "lsh:buckets=6,rounds=2,chunk=4,seed=0"
    args, kw, want, want_lse, _ = lsh_case(text, 13, 40, 21, rot, [40, 33], torch.bfloat16)
    out, lse = attn.attend(*args, text, return_lse=True, **kw)
    assert_half_ulps(out, torch.from_numpy(want), torch.bfloat16, text)
    assert_lse(lse, want_lse)


# ---- DCA with padding and interleaved rotation ----------------------------------------------------

@pytest.mark.parametrize("n,m,s,w", [(40, 40, 8, 3), (7, 45, 10, 4), (45, 45, 16, 16), (40, 27, 6, 2)])
@pytest.mark.parametrize("interleaved", [False, True])
def test_dca_with_padding_and_interleaved_rope(n, m, s, w, interleaved):
    q, k, v = qkv(n + s, 2, n, 4, 16, m=m, hk=2, scale=1.5)
    kv_len = [m, m - 9]
    text = f"dca:chunk={s},local={w},theta=300" + (",interleaved" if interleaved else "")
    want, want_lse, _ = L.dca(q, k, v, s, w, 300.0, interleaved=interleaved, kv_len=kv_len)
    for form, (out, lse) in each_form(q, k, v, text, key_padding_lengths=kv_len, return_lse=True):
        assert_close32(out, want, f"{text} {form}")
        assert_lse(lse, want_lse, f"{text} {form}")
    # interleaved and rotate-half differ (the option is not ignored)
    other = L.dca(q, k, v, s, w, 300.0, interleaved=not interleaved, kv_len=kv_len)[0]
    assert not close32(out, other)


def test_dca_interleaved_in_bfloat16():
    q, k, v = qkv(5, 1, 30, 2, 16, m=30, hk=1)
    (tq, q64), (tk, k64), (tv, v64) = (as_half(x, torch.bfloat16) for x in (q, k, v))
    want = L.dca(q64, k64, v64, 8, 3, 500.0, interleaved=True, kv_len=[25])[0]
    out = attn.attend(tq, tk, tv, "dca:chunk=8,local=3,theta=500,interleaved", key_padding_lengths=[25])
    assert_half_ulps(out, torch.from_numpy(want), torch.bfloat16, "dca interleaved")


# ---- Linformer ------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,m,kk", [(20, 33, 6), (33, 33, 33), (1, 50, 9)])
def test_linformer_seeded_projections_with_padding(n, m, kk):
    q, k, v = qkv(n + m + kk, 2, n, 4, 8, m=m, hk=2, dv=6)
    kv_len = [m, m - 11]
    E, F = L.linformer_projections(17, kk, m)
    want, want_lse, _ = L.linformer(q, k, v, E, F, kv_len=kv_len)
    for form, (out, lse) in each_form(q, k, v, f"linformer:k={kk},seed=17", key_padding_lengths=kv_len,
                                      return_lse=True):
        assert_close32(out, want, f"linformer seeded {form}")
        assert_lse(lse, want_lse, f"linformer seeded {form}")
    # another seed is another projection
    E2, F2 = L.linformer_projections(18, kk, m)
    assert not close32(out, L.linformer(q, k, v, E2, F2, kv_len=kv_len)[0])


def test_linformer_given_projections_with_padding_and_scale():
    q, k, v = qkv(2, 2, 12, 2, 8, m=30, hk=1)
    r = np.random.default_rng(3)
    E, F = (r.standard_normal((5, 30)).astype(np.float32) * 0.3 for _ in range(2))
    want, want_lse, _ = L.linformer(q, k, v, E.astype(np.float64), F.astype(np.float64), scale=0.2, kv_len=[30, 19])
    out, lse = attn.attend(q, k, v, "linformer:k=5,scale=0.2", E=E, F=F, key_padding_lengths=[30, 19],
                           return_lse=True)
    assert_close32(out, want, "linformer given")
    assert_lse(lse, want_lse)


def test_linformer_seeded_entries_are_n_0_1_over_k():
    """The documented draw has mean 0 and variance 1/k (checked on the literal's matrices, which the
    test above shows are attn's): 2 x 64 x 2000 entries, bounds of 5 standard errors."""
    kk, m = 64, 2000
    for seed in (1, 2):
        E, F = L.linformer_projections(seed, kk, m)
        for x in (E, F):
            n = x.size
            assert abs(x.mean()) < 5 * math.sqrt(1 / kk / n)
            # the sample variance of normals has standard error sigma^2 sqrt(2 / n)
            assert abs(x.var() - 1 / kk) < 5 * (1 / kk) * math.sqrt(2 / n)
            z = x * math.sqrt(kk)  # standardised: the fourth moment of a normal is 3
            assert abs((z**4).mean() - 3) < 5 * math.sqrt(96 / n)
        assert abs(np.corrcoef(E.ravel(), F.ravel())[0, 1]) < 5 / math.sqrt(E.size)  # two streams
    # the same seed's matrix equals attn's: project a one-hot key per column and read E back
    kk, m = 4, 12
    E, _ = L.linformer_projections(9, kk, m)
    for j in (0, 5, 11):
        k = np.zeros((1, m, 1, 1), np.float32)
        k[0, j, 0, 0] = 1.0
        # with q = 1 and scale 1 the scores are E[:, j]: lse = log sum exp E[:, j]
        q = np.ones((1, 1, 1, 1), np.float32)
        _, lse = attn.attend(q, k, k, f"linformer:k={kk},seed=9,scale=1", return_lse=True)
        assert abs(lse[0, 0, 0] - np.log(np.exp(E[:, j]).sum())) < 1e-6


# ---- NormAttn, Performer, PolaFormer --------------------------------------------------------------

@pytest.mark.parametrize("fmap", ["elu", "relu", "identity"])
@pytest.mark.parametrize("causal", [False, True])
def test_normattn_layer_norm_values(fmap, causal):
    q, k, v = qkv(len(fmap) + causal, 2, 30, 4, 8, hk=2, dv=10)
    phi = L.FEATURE_MAPS[fmap]
    w, _ = L.kernel_weights(phi(q.astype(np.float64)), phi(k.astype(np.float64)), causal=causal)
    want = L.norm_rows(L.apply_weights(w, v, normalize=False), "layer")
    for form, out in each_form(q, k, v, f"normattn:map={fmap},norm=layer" + (",causal" if causal else "")):
        assert_close32(out, want, f"normattn layer {form}", rel=2e-5)
    rms = attn.attend(q, k, v, f"normattn:map={fmap},norm=rms" + (",causal" if causal else ""))
    assert_close32(rms, L.norm_rows(L.apply_weights(w, v, normalize=False), "rms"), "normattn rms", rel=2e-5)
    assert not close32(rms, want, rel=2e-5)  # layer is not rms


def test_normattn_layer_with_decay_padding_and_half_types():
    q, k, v = qkv(31, 2, 26, 4, 8, hk=2, dv=6)
    decay = np.array([0.9, 0.6, 1.0, 0.97], np.float32)
    phi = L.FEATURE_MAPS["elu"]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        if dtype == torch.float32:
            args, (q64, k64, v64) = (q, k, v), (q, k, v)
        else:
            (tq, q64), (tk, k64), (tv, v64) = (as_half(x, dtype) for x in (q, k, v))
            args = (tq, tk, tv)
        w, _ = L.kernel_weights(phi(np.asarray(q64, np.float64)), phi(np.asarray(k64, np.float64)), causal=True,
                                decay=decay.astype(np.float64))
        want = L.norm_rows(L.apply_weights(w, v64, normalize=False), "layer")
        for form, out in each_form(*args, "normattn:map=elu,norm=layer,causal,chunk=8", decay=decay):
            if dtype == torch.float32:
                assert_close32(out, want, f"normattn decay {form}", rel=2e-5)
            else:
                assert_half_ulps(out, torch.from_numpy(want), dtype, f"normattn decay {dtype} {form}")


@pytest.mark.parametrize("causal", [False, True])
def test_performer_values_with_given_features(causal):
    q, k, v = qkv(40 + causal, 2, 26, 2, 8, hk=1, dv=5)
    omega = np.random.default_rng(6).standard_normal((24, 8)).astype(np.float32)
    fq = L.performer_features(q, omega.astype(np.float64))
    fk = L.performer_features(k, omega.astype(np.float64))
    want = L.apply_weights(L.kernel_weights(fq, fk, causal=causal)[0], v)
    for form, out in each_form(q, k, v, "performer:features=24" + (",causal" if causal else ""), omega=omega):
        assert_close32(out, want, f"performer given omega {form}")


@pytest.mark.parametrize("features,d", [(16, 8), (20, 8), (5, 4), (3, 8)])
def test_performer_seeded_features_are_the_documented_draw(features, d):
    q, k, v = qkv(features + d, 1, 18, 2, d, hk=2)
    omega = L.performer_omega(3, features, d)
    blocks = [omega[i:i + d] for i in range(0, features, d)]
    for blk in blocks:  # rows of a block are orthogonal
        gram = blk @ blk.T
        np.testing.assert_allclose(gram - np.diag(np.diag(gram)), 0, atol=1e-9)
    want = L.apply_weights(L.kernel_weights(L.performer_features(q, omega), L.performer_features(k, omega))[0], v)
    out = attn.attend(q, k, v, f"performer:features={features},seed=3")
    assert_close32(out, want, "performer seeded", rel=2e-5)
    other = L.performer_omega(4, features, d)
    wrong = L.apply_weights(L.kernel_weights(L.performer_features(q, other), L.performer_features(k, other))[0], v)
    assert not close32(out, wrong, rel=2e-5)


def test_performer_causal_seeded_with_decays_and_half_types():
    q, k, v = qkv(77, 1, 24, 2, 8, hk=1, dv=4)
    decay = np.array([0.8, 0.97], np.float32)
    omega = L.performer_omega(11, 12, 8)
    for dtype in (torch.float32, torch.bfloat16):
        if dtype == torch.float32:
            args, (q64, k64, v64) = (q, k, v), (q, k, v)
        else:
            (tq, q64), (tk, k64), (tv, v64) = (as_half(x, dtype) for x in (q, k, v))
            args = (tq, tk, tv)
        w, _ = L.kernel_weights(L.performer_features(q64, omega), L.performer_features(k64, omega), causal=True,
                                decay=decay.astype(np.float64))
        want = L.apply_weights(w, v64)
        for form, out in each_form(*args, "performer:features=12,seed=11,causal,chunk=5", decay=decay):
            if dtype == torch.float32:
                assert_close32(out, want, f"performer causal decay {form}", rel=2e-5)
            else:
                assert_half_ulps(out, torch.from_numpy(want), dtype, f"performer causal decay {form}")


def polar(x, power, swap):
    x = np.asarray(x, np.float64)
    pos, neg = np.maximum(x, 0) ** power, np.maximum(-x, 0) ** power
    return np.concatenate([neg, pos] if swap else [pos, neg], axis=-1)


def polaformer(q, k, v, power, coef, causal=False, kv_len=None):
    """Two normalised streams: [q+, q-].[k+, k-] on v's first half, [q+, q-].[k-, k+] on its second,
    each output channel times its coefficient. Also returns the two weight matrices."""
    half = v.shape[-1] // 2
    outs, ws = [], []
    for s in range(2):
        w, vis = L.kernel_weights(polar(q, power, False), polar(k, power, s == 1), causal=causal, kv_len=kv_len)
        outs.append(L.apply_weights(w, v[..., s * half:(s + 1) * half]))
        ws.append(w)
    return np.concatenate(outs, axis=-1) * coef, ws, vis


def test_polaformer_non_causal_values_with_powers_and_coefficients():
    q, k, v = qkv(12, 2, 21, 4, 6, m=33, hk=2, dv=8)
    power = np.array([1.5, 2.0, 3.0, 2.5, 1.2, 4.0], np.float32)
    coef = np.random.default_rng(1).standard_normal(8).astype(np.float32)
    want, _, _ = polaformer(q, k, v, power.astype(np.float64), coef.astype(np.float64), kv_len=[33, 20])
    for form, out in each_form(q, k, v, "polaformer", power=power, coefficients=coef, key_padding_lengths=[33, 20]):
        assert_close32(out, want, f"polaformer {form}", rel=2e-5)
    for dtype in (torch.bfloat16, torch.float16):
        (tq, q64), (tk, k64), (tv, v64) = (as_half(x, dtype) for x in (q, k, v))
        want, _, _ = polaformer(q64, k64, v64, power.astype(np.float64), coef.astype(np.float64), kv_len=[33, 20])
        out = attn.attend(tq, tk, tv, "polaformer", power=power, coefficients=coef, key_padding_lengths=[33, 20])
        assert_half_ulps(out, torch.from_numpy(want), dtype, f"polaformer {dtype}")
    plain, _, _ = polaformer(q, k, v, 3.0, 1.0)
    assert_close32(attn.attend(q, k, v, "polaformer:power=3"), plain, "polaformer power=3", rel=2e-5)


# ---- streamed statistics of every non-softmax family ---------------------------------------------

def efficient_weights(q, k, causal, kv_len, scale):
    """a_ij = scale sum_f softmax_f(q_i)[f] softmax_j(k_j[f]) over the keys row i sees (the key
    softmax over exactly those keys)."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    B, N, H, D = q.shape
    M, Hk = k.shape[1], k.shape[2]
    sq = np.exp(q - q.max(-1, keepdims=True))
    sq /= sq.sum(-1, keepdims=True)
    w = np.zeros((B, H, N, M))
    vis = np.zeros((B, H, N, M), bool)
    for b in range(B):
        for i in range(N):
            end = min(i + M - N + 1, kv_len[b]) if causal else kv_len[b]
            if end <= 0:
                continue
            kk = k[b, :end]  # (end, Hk, D)
            sk = np.exp(kk - kk.max(0))
            sk /= sk.sum(0)
            for h in range(H):
                w[b, h, i, :end] = scale * sk[:, h // (H // Hk)] @ sq[b, i, h]
                vis[b, h, i, :end] = True
    return w, vis


def stats_cases():
    """(name, mechanism text, params, literal(q, k, kv_len) -> (weights, visible))."""
    f64 = lambda x: np.asarray(x, np.float64)
    phi = L.FEATURE_MAPS
    omega = np.random.default_rng(8).standard_normal((12, 8)).astype(np.float32)
    power = np.linspace(1.3, 3.5, 8).astype(np.float32)
    decay = np.array([0.9, 0.7, 1.0, 0.95], np.float32)

    def poly(q, k, kv_len):
        _, ws, vis = polaformer(q, k, np.zeros(k.shape[:3] + (2,)), power.astype(np.float64), 1.0, kv_len=kv_len)
        dens = [np.where(vis.any(-1, keepdims=True), w.sum(-1, keepdims=True), 1.0) for w in ws]
        return (ws[0] / dens[0] + ws[1] / dens[1]) / 2, vis

    def gau(q, k, kv_len, causal):
        w, vis = L.kernel_weights(f64(q), f64(k), causal=causal, kv_len=kv_len)
        a = np.maximum(w / math.sqrt(q.shape[-1]) + 0.2, 0) ** 2 / np.maximum(kv_len, 1)[:, None, None, None]
        return np.where(vis, a, 0.0), vis

    def qsoftmax(q, k, kv_len):
        sq = np.exp(f64(q) - f64(q).max(-1, keepdims=True))
        return L.kernel_weights(sq / sq.sum(-1, keepdims=True), f64(k), causal=True, kv_len=kv_len)

    def linformer(q, k, kv_len):
        E, F = L.linformer_projections(5, 7, k.shape[1])
        _, _, w = L.linformer(q, k, np.zeros(k.shape[:3] + (1,), np.float32), E, F, kv_len=kv_len)
        return w, np.ones(w.shape, bool)

    return [
        ("linear elu causal decay", "linear:map=elu,causal", dict(decay=decay),
         lambda q, k, n: L.kernel_weights(phi["elu"](f64(q)), phi["elu"](f64(k)), causal=True, kv_len=n,
                                          decay=decay.astype(np.float64))),
        ("linear identity (signed)", "linear:map=identity,normalize=0", {},
         lambda q, k, n: L.kernel_weights(f64(q), f64(k), kv_len=n)),
        ("linear relu2", "linear:map=relu2", {},
         lambda q, k, n: L.kernel_weights(phi["relu2"](f64(q)), phi["relu2"](f64(k)), kv_len=n)),
        ("normattn exp layer causal", "normattn:map=exp,norm=layer,causal", {},
         lambda q, k, n: L.kernel_weights(np.exp(f64(q)), np.exp(f64(k)), causal=True, kv_len=n)),
        ("performer", "performer:features=12", dict(omega=omega),
         lambda q, k, n: L.kernel_weights(L.performer_features(q, f64(omega)), L.performer_features(k, f64(omega)),
                                          kv_len=n)),
        ("sana causal", "sana:causal", {},
         lambda q, k, n: L.kernel_weights(phi["relu"](f64(q)), phi["relu"](f64(k)), causal=True, kv_len=n)),
        ("polaformer", "polaformer", dict(power=power), poly),
        ("efficient", "efficient", {}, lambda q, k, n: efficient_weights(q, k, False, n, 1 / math.sqrt(8))),
        ("efficient causal", "efficient:causal", {},
         lambda q, k, n: efficient_weights(q, k, True, n, 1 / math.sqrt(8))),
        ("gau", "gau:bias=0.2", {}, lambda q, k, n: gau(q, k, n, False)),
        ("gau causal", "gau:bias=0.2,causal", {}, lambda q, k, n: gau(q, k, n, True)),
        ("qsoftmax causal (signed)", "qsoftmax:causal", {}, qsoftmax),
        ("linformer", "linformer:k=7,seed=5", {}, linformer),
    ]


@pytest.mark.parametrize("name,text,params,weights", stats_cases(), ids=[c[0] for c in stats_cases()])
def test_streamed_statistics_equal_those_of_the_literal_weights(name, text, params, weights):
    n = 29
    q, k, v = qkv(len(name), 3, n, 4, 8, hk=2)
    kv_len = [n, n - 10, 0]  # the last entry has no key: its rows are NaN (linformer: k equal zero rows)
    topk = 5
    w, vis = weights(q, k, kv_len)
    want = L.row_stats(w, vis, topk)
    for form, (out, st) in each_form(q, k, v, text, params=params, key_padding_lengths=kv_len, return_stats=True,
                                     stats_topk=topk):
        for got, ref, what in zip(st, want, ("sparsity", "entropy", "max_weight", "topk_mass")):
            assert_close32(got, ref, f"{name} {form}: {what}", rel=2e-5)


def test_statistics_oracle_catches_a_wrong_row():
    """The comparison can fail: the same literal without GAU's causal cut, or with Linear's decay
    left out, is not what attn streams."""
    q, k, v = qkv(1, 1, 29, 4, 8, hk=2)
    _, st = attn.attend(q, k, v, "gau:bias=0.2,causal", return_stats=True)
    w, vis = L.kernel_weights(np.asarray(q, np.float64), np.asarray(k, np.float64))
    a = np.maximum(w / math.sqrt(8) + 0.2, 0) ** 2
    assert not close32(st.sparsity, L.row_stats(a, vis, 8)[0], rel=2e-5)
    decay = np.array([0.9, 0.7, 1.0, 0.95], np.float32)
    _, st = attn.attend(q, k, v, "linear:map=elu,causal", decay=decay, return_stats=True)
    phi = L.FEATURE_MAPS["elu"]
    w, vis = L.kernel_weights(phi(q.astype(np.float64)), phi(k.astype(np.float64)), causal=True)
    assert not close32(st.entropy, L.row_stats(w, vis, 8)[1], rel=2e-5)


def softmax_stats_cases():
    """Softmax-weighted families too: the statistics of the literal's probabilities (over the keys
    that survive every mask)."""
    return [
        ("bigbird", "bigbird:block=4,window=1,global=1,random=2,seed=5",
         lambda q, k, v, n: L.masked_softmax_attention(q, k, v, L.bigbird_pattern(
             q.shape[1], k.shape[1], block=4, window=1, glob=1, random=2, seed=5)[0], kv_len=n)),
        ("longformer causal dilated", "longformer:window=6:0,dilation=2,global=3;20,causal",
         lambda q, k, v, n: L.masked_softmax_attention(q, k, v, L.longformer_pattern(
             q.shape[1], k.shape[1], window=(6, 0), dilation=2, glob=[3, 20], causal=True), kv_len=n)),
        ("chunk window sinks", "softmax:chunk=8,window=5:2,sinks=3",
         lambda q, k, v, n: L.masked_softmax_attention(q, k, v, L.softmax_pattern(
             q.shape[1], k.shape[1], chunk=8, window=(5, 2), sinks=3), kv_len=n)),
        ("dca interleaved", "dca:chunk=8,local=3,theta=300,interleaved",
         lambda q, k, v, n: L.dca(q, k, v, 8, 3, 300.0, interleaved=True, kv_len=n)),
    ]


@pytest.mark.parametrize("name,text,literal", softmax_stats_cases(), ids=[c[0] for c in softmax_stats_cases()])
def test_streamed_statistics_of_softmax_patterns(name, text, literal):
    q, k, v = qkv(len(text), 3, 21, 2, 8, m=37, hk=1)
    kv_len = [37, 25, 0]
    _, _, w = literal(q, k, v, kv_len)
    want = L.row_stats(w, w > 0, 4)  # softmax weights are positive exactly where visible
    for form, (out, st) in each_form(q, k, v, text, key_padding_lengths=kv_len, return_stats=True, stats_topk=4):
        for got, ref, what in zip(st, want, ("sparsity", "entropy", "max_weight", "topk_mass")):
            assert_close32(got, ref, f"{name} {form}: {what}", rel=2e-5)


def test_lsh_streamed_statistics_with_n_not_m():
    text = "lsh:buckets=4,rounds=3,chunk=5,seed=8,causal"
    args, kw, _, _, w = lsh_case(text, 50, 23, 50 * 7 + 23, None, [23, 17], torch.float32)
    want = L.row_stats(w, w > 0, 3)
    for form, (out, st) in each_form(*args, text, return_stats=True, stats_topk=3, **kw):
        for got, ref, what in zip(st, want, ("sparsity", "entropy", "max_weight", "topk_mass")):
            assert_close32(got, ref, f"lsh {form}: {what}", rel=2e-5)


# (causal linear forms take N = M: each token brings q, k and v)
NM_STATS = ["linear relu2", "performer", "polaformer", "efficient", "gau", "gau causal", "linformer"]


@pytest.mark.parametrize("name", NM_STATS)
@pytest.mark.parametrize("n,m", [(13, 29), (29, 13)])
def test_streamed_statistics_with_n_not_m(name, n, m):
    _, text, params, weights = next(c for c in stats_cases() if c[0] == name)
    q, k, v = qkv(len(name) + n, 2, n, 4, 8, m=m, hk=2)
    kv_len = [m, m - 5]
    w, vis = weights(q, k, kv_len)
    want = L.row_stats(w, vis, 3)
    for form, (out, st) in each_form(q, k, v, text, params=params, key_padding_lengths=kv_len, return_stats=True,
                                     stats_topk=3):
        for got, ref, what in zip(st, want, ("sparsity", "entropy", "max_weight", "topk_mass")):
            assert_close32(got, ref, f"{name} {form} N={n} M={m}: {what}", rel=2e-5)
