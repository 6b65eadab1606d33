"""Sparse patterns through the public API: attn.mask_of against the patterns' definitions written
out in NumPy (an oracle independent of the C++ pattern code), attend() with a pattern against
torch SDPA given the same dense mask, and the caller's block mask against its expanded element
mask."""
import numpy as np
import pytest
import torch

import attn


def positions(n, m):
    p = (np.arange(n) + m - n)[:, None]  # query positions, bottom-right aligned
    j = np.arange(m)[None, :]
    return p, j


def literal(kind, n, m, **o):
    """The rule each pattern's paper states, for query position p and key j."""
    p, j = positions(n, m)
    d = p - j
    causal = j <= p
    if kind == "sinks":  # causal window + the first `sinks` keys
        return causal & ((d <= o["window"]) | (j < o["sinks"]))
    if kind == "dilation":
        return causal & (d % o["k"] == 0)
    if kind == "window_dilation":
        return causal & (d <= o["window"]) & (d % o["k"] == 0)
    if kind == "strided":
        return causal & ((d <= o["s"]) | (d % o["s"] == 0))
    if kind == "chunk":
        return (np.floor_divide(p, o["c"]) == j // o["c"]) & (causal if o.get("causal") else True)
    if kind == "longformer":
        gq = np.isin(p, o["glob"])
        gk = np.isin(j, o["glob"])
        return (np.abs(d) <= o["w"]) | gq | gk
    raise ValueError(kind)


CASES = [
    ("softmax:causal,window=7:0,sinks=3", "sinks", dict(window=7, sinks=3)),
    ("softmax:causal,dilation=4", "dilation", dict(k=4)),
    ("softmax:causal,window=20:0,dilation=3", "window_dilation", dict(window=20, k=3)),
    ("softmax:causal,strided=6", "strided", dict(s=6)),
    ("softmax:chunk=10", "chunk", dict(c=10)),
    ("softmax:causal,chunk=16", "chunk", dict(c=16, causal=True)),
    ("longformer:window=3:3,global=0;17;33", "longformer", dict(w=3, glob=[0, 17, 33])),
]


@pytest.mark.parametrize("text,kind,opts", CASES)
@pytest.mark.parametrize("n,m", [(50, 50), (13, 70), (70, 40), (1, 90)])
def test_mask_of_is_the_papers_rule(text, kind, opts, n, m):
    got = attn.mask_of(text, n, m)
    assert got.dtype == np.bool_ and got.shape == (n, m)
    np.testing.assert_array_equal(got, literal(kind, n, m, **opts))


def test_bigbird_mask_is_blocks_of_window_global_and_random():
    n, block = 256, 16
    mask = attn.mask_of("bigbird:block=16,window=3,global=2,random=3,seed=7", n)
    blocks = mask.reshape(n // block, block, n // block, block)
    # every block pair is all-visible or all-hidden
    assert np.all(blocks.all(axis=(1, 3)) == blocks.any(axis=(1, 3)))
    b = blocks.any(axis=(1, 3))
    nb = n // block
    assert b[:2].all() and b[:, :2].all()  # global rows and columns
    for a in range(2, nb):
        window = {c for c in (a - 1, a, a + 1) if 2 <= c < nb}
        assert all(b[a, c] for c in window)
        extra = set(np.flatnonzero(b[a])) - window - {0, 1}
        assert len(extra) == 3, (a, extra)  # random blocks, outside window and globals
    again = attn.mask_of("bigbird:block=16,window=3,global=2,random=3,seed=7", n)
    other = attn.mask_of("bigbird:block=16,window=3,global=2,random=3,seed=8", n)
    np.testing.assert_array_equal(mask, again)
    assert (mask != other).any()


def sdpa(q, k, v, mask):
    """torch SDPA in float64 with a dense boolean mask; rows that see nothing give zeros."""
    t = lambda x: torch.from_numpy(np.ascontiguousarray(x.transpose(0, 2, 1, 3), dtype=np.float64))
    m = torch.from_numpy(mask)
    out = torch.nn.functional.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=m)
    out = torch.where(m.any(-1)[None, None, :, None], out, torch.zeros_like(out))
    return out.numpy().transpose(0, 2, 1, 3)


@pytest.mark.parametrize("text", [c[0] for c in CASES] + [
    "bigbird:block=16,window=3,global=1,random=2,seed=3", "bigbird:block=8,window=1,global=0,random=2,causal",
    "longformer:window=5:0,dilation=2,global=4,causal"])
@pytest.mark.parametrize("n,m", [(90, 90), (3, 200)])
def test_attend_with_pattern_matches_sdpa_with_its_dense_mask(text, n, m):
    rng = np.random.default_rng(len(text) + n)
    q = rng.standard_normal((2, n, 4, 32), dtype=np.float32)
    k = rng.standard_normal((2, m, 2, 32), dtype=np.float32)
    v = rng.standard_normal((2, m, 2, 32), dtype=np.float32)
    mask = attn.mask_of(text, n, m)
    want = sdpa(q, np.repeat(k, 2, axis=2), np.repeat(v, 2, axis=2), mask)
    for form in ("tiled", "rows", "reference"):
        if form == "rows" and n > 8:
            continue
        got = attn.attend(q, k, v, text, form=form)
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4, err_msg=form)
    # and the same as plain softmax with the mask given as attn_mask
    np.testing.assert_allclose(attn.attend(q, k, v, "softmax", attn_mask=mask), attn.attend(q, k, v, text),
                               atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("n,bq,bk", [(100, 16, 24), (3, 1, 64), (64, 64, 64)])
def test_block_mask_is_its_expanded_element_mask(n, bq, bk):
    rng = np.random.default_rng(n)
    m = 150
    q = rng.standard_normal((2, n, 2, 16), dtype=np.float32)
    k = rng.standard_normal((2, m, 2, 16), dtype=np.float32)
    blocks = rng.random((2, 1, -(-n // bq), -(-m // bk))) < 0.5
    dense = np.kron(blocks, np.ones((1, 1, bq, bk), bool))[..., :n, :m]
    elem = rng.random((n, m)) < 0.8
    for text in ("softmax", "softmax:causal,window=40:0,sinks=2"):
        want = attn.attend(q, k, k, text, attn_mask=dense & elem, return_lse=True)
        got = attn.attend(q, k, k, text, block_mask=blocks, block_size=(bq, bk), attn_mask=elem, return_lse=True)
        np.testing.assert_allclose(got[0], want[0], atol=1e-6, rtol=1e-6)
        np.testing.assert_array_equal(np.isneginf(got[1]), np.isneginf(want[1]))


def test_bad_patterns_and_block_masks_name_themselves():
    q = np.zeros((1, 8, 1, 4), np.float32)
    with pytest.raises(ValueError, match="dilation must be >= 1"):
        attn.attend(q, q, q, "softmax:dilation=0")
    with pytest.raises(ValueError, match="bigbird window must be an odd number"):
        attn.mask_of("bigbird:window=2", 8)
    with pytest.raises(ValueError, match="linformer has no fixed key pattern"):
        attn.mask_of("linformer:k=4", 8)
    with pytest.raises(ValueError, match=r"block_mask must be broadcastable to \(B, H, ceil\(N / 4\), ceil\(M / 4\)\)"):
        attn.attend(q, q, q, block_mask=np.ones((3, 3), bool), block_size=(4, 4))
    with pytest.raises(TypeError, match="block_mask must be bool"):
        attn.attend(q, q, q, block_mask=np.ones((2, 2), np.float32), block_size=(4, 4))
    with pytest.raises(ValueError, match="block_size"):
        attn.attend(q, q, q, block_mask=np.ones((2, 2), bool), block_size=(0, 4))
    with pytest.raises(ValueError, match="n must be"):
        attn.mask_of("softmax", -1)


def test_pattern_integers_at_the_top_of_int64_act_as_past_every_distance():
    """dilation / strided / chunk of 2^63 - 1 (once a crash) equal N + M + 1, in attend and mask_of."""
    r = np.random.default_rng(5)
    q, k, v = (r.standard_normal((1, 37, 2, 8)).astype(np.float32) for _ in range(3))
    top, far = 2**63 - 1, 37 + 37 + 1
    for opt in ("dilation", "strided", "chunk"):
        huge, small = f"softmax:causal,{opt}={top}", f"softmax:causal,{opt}={far}"
        np.testing.assert_array_equal(attn.attend(q, k, v, huge), attn.attend(q, k, v, small))
        np.testing.assert_array_equal(attn.mask_of(huge, 37), attn.mask_of(small, 37))
