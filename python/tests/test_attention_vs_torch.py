"""attn.attention against PyTorch: SDPA where it has the feature (in float64 as the oracle, in the
storage dtype as the 'plain' baseline), a literal torch implementation where it does not."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import attn
from conftest import assert_rule, bhnd, literal_attention

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def make(B, H, Hkv, N, M, D, Dv, dtype, layout, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    shape = (lambda h, n, d: (B, n, h, d)) if layout == "bnhd" else (lambda h, n, d: (B, h, n, d))
    q = (torch.randn(*shape(H, N, D), generator=g) * scale).to(dtype)
    k = (torch.randn(*shape(Hkv, M, D), generator=g) * scale).to(dtype)
    v = torch.randn(*shape(Hkv, M, Dv), generator=g).to(dtype)
    return q, k, v


def sdpa(q, k, v, dtype, mask=None, scale=None):
    """SDPA in bhnd with GQA expanded and an explicit (bottom-right) mask."""
    g = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q.to(dtype), k.repeat_interleave(g, 1).to(dtype),
                                          v.repeat_interleave(g, 1).to(dtype), attn_mask=mask, scale=scale)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_rule_fails_a_small_error(dtype):
    """The float64 oracle stored in the dtype passes the rule; off by 1 % (half types) or 0.1 %
    (float32) in its largest element, or everywhere, it fails."""
    q, k, v = make(2, 4, 2, 33, 47, 40, 24, dtype, "bhnd")
    oracle, plain = sdpa(q, k, v, torch.float64), sdpa(q, k, v, dtype)
    assert_rule(oracle.to(dtype), oracle, plain, dtype)
    rel = 1e-3 if dtype == torch.float32 else 1e-2
    largest = torch.zeros_like(oracle).flatten()
    largest[oracle.abs().argmax()] = 1
    for sign in (1, -1):
        for where in (largest.view_as(oracle), torch.ones_like(oracle)):
            with pytest.raises(AssertionError):
                assert_rule((oracle * (1 + sign * rel * where)).to(dtype), oracle, plain, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["bnhd", "bhnd"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("N,M", [(1, 1), (7, 65), (65, 63), (129, 129), (100, 30)])
def test_sdpa_features(dtype, layout, causal, N, M):
    q, k, v = make(2, 4, 2, N, M, 40, 24, dtype, layout)
    out, lse = attn.attention(q, k, v, causal=causal, layout=layout, return_lse=True)
    assert out.dtype == dtype and out.shape == q.shape[:-1] + (24,)
    qb, kb, vb = bhnd(q, layout), bhnd(k, layout), bhnd(v, layout)
    # torch's is_causal is top-left aligned when N != M: compare through an explicit mask
    mask = torch.ones(N, M, dtype=torch.bool).tril(M - N) if causal else None
    oracle = sdpa(qb, kb, vb, torch.float64, mask)
    plain = sdpa(qb, kb, vb, dtype, mask)
    if causal and N > M:  # rows before the first key: SDPA gives NaN, we define 0
        oracle, plain = oracle.nan_to_num(0.0), plain.nan_to_num(0.0)
    assert_rule(bhnd(out, layout), oracle, plain, dtype, per_element=dtype != torch.bfloat16)  # bf16 inputs: bf16 products
    _, lse64 = literal_attention(qb, kb, vb, causal=causal)
    finite = torch.isfinite(lse64)
    assert torch.equal(torch.isfinite(lse), finite)
    assert torch.allclose(lse[finite].double(), lse64[finite], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_scale_and_masks_vs_sdpa(dtype):
    q, k, v = make(2, 4, 4, 33, 70, 64, 64, dtype, "bhnd", seed=3)
    g = torch.Generator().manual_seed(5)
    bool_mask = torch.rand(2, 1, 33, 70, generator=g) > 0.3
    float_mask = torch.randn(1, 4, 33, 70, generator=g)
    for mask in (bool_mask, float_mask):
        out = attn.attention(q, k, v, softmax_scale=0.07, attn_mask=mask, layout="bhnd")
        m64 = mask if mask.dtype == torch.bool else mask.double()
        oracle = sdpa(q, k, v, torch.float64, m64, scale=0.07)
        plain = sdpa(q, k, v, dtype, mask if mask.dtype == torch.bool else mask.to(dtype), scale=0.07)
        assert_rule(out, oracle, plain, dtype, per_element=dtype != torch.bfloat16)  # bf16 inputs: bf16 products


LITERAL_CASES = [
    dict(alibi=True), dict(softcap=20.0), dict(softcap=5.0, causal=True), dict(window=(16, 3)),
    dict(window=(8, 0), causal=True), dict(entropy_m=64), dict(entropy_m=16, causal=True),
    dict(cosine=True, scale=6.0), dict(kv_len=[70, 11]),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", LITERAL_CASES, ids=lambda c: "-".join(f"{k}" for k in c))
def test_literal_torch_features(dtype, case):
    """Options SDPA lacks (ALiBi, softcap, window, entropy-invariant scale, cosine, padding)."""
    q, k, v = make(2, 4, 2, 50, 70, 32, 32, dtype, "bnhd", seed=7)
    qb, kb, vb = bhnd(q, "bnhd"), bhnd(k, "bnhd"), bhnd(v, "bnhd")
    alibi = np.array([2.0 ** (-8 * (h + 1) / 4) for h in range(4)], np.float32) if case.get("alibi") else None
    mech = []
    if case.get("causal"):
        mech.append("causal")
    if case.get("scale"):
        mech.append(f"scale={case['scale']}")
    if case.get("softcap"):
        mech.append(f"softcap={case['softcap']}")
    if "window" in case:
        mech.append("window={}:{}".format(*case["window"]))
    if case.get("entropy_m"):
        mech.append(f"entropy_scale={case['entropy_m']}")
    if case.get("cosine"):
        mech.append("score=cosine")
    text = "softmax" + (":" + ",".join(mech) if mech else "")
    out, lse = attn.attend(q, k, v, text, alibi_slopes=alibi, key_padding_lengths=case.get("kv_len"), return_lse=True)
    kw = dict(causal=case.get("causal", False), scale=case.get("scale"), window=case.get("window", (-1, -1)),
              softcap=case.get("softcap", 0.0), alibi=alibi, kv_len=case.get("kv_len"),
              cosine=case.get("cosine", False), entropy_m=case.get("entropy_m", 0))
    oracle, lse64 = literal_attention(qb, kb, vb, dtype=torch.float64, **kw)
    plain, _ = literal_attention(qb, kb, vb, dtype=dtype if dtype != torch.float16 else torch.float32, **kw)
    if dtype == torch.float16:  # CPU half matmul is slow/unsupported in places: round the fp32 result
        plain = plain.to(torch.float16)
    assert_rule(bhnd(out, "bnhd"), oracle, plain, dtype, per_element=dtype != torch.bfloat16)  # bf16 inputs: bf16 products
    fin = torch.isfinite(lse64)
    assert torch.allclose(lse[fin].double(), lse64[fin], atol=1e-5, rtol=1e-5)


def test_additive_bahdanau_score():
    q, k, v = make(1, 2, 2, 9, 12, 8, 8, torch.float32, "bhnd", seed=9)
    g = torch.Generator().manual_seed(2)
    wq, wk, w = torch.randn(5, 8, generator=g) * 0.3, torch.randn(5, 8, generator=g) * 0.3, torch.randn(5, generator=g)
    out, probs = attn.attend(q, k, v, "softmax:score=additive", additive_weights=(wq, wk, w), layout="bhnd",
                             return_probs=True)
    hq = q.double() @ wq.double().T  # (B,H,N,A)
    hk = k.double() @ wk.double().T  # (B,H,M,A)
    s = torch.tanh(hq.unsqueeze(3) + hk.unsqueeze(2)) @ w.double()  # (B,H,N,M)
    p = torch.softmax(s, -1)
    assert torch.allclose(probs.double(), p, atol=1e-6)
    assert torch.allclose(out.double(), p @ v.double(), atol=1e-5)
    # the same weights as named params, as keyword arguments, and in numpy
    by_params = attn.attend(q, k, v, "softmax:score=additive", params={"wq": wq, "wk": wk, "w": w}, layout="bhnd")
    by_kwargs = attn.attend(q, k, v, "softmax:score=additive", wq=wq, wk=wk, w=w, layout="bhnd")
    assert torch.equal(by_params, out) and torch.equal(by_kwargs, out)
    by_numpy = attn.attend(q.numpy(), k.numpy(), v.numpy(), "softmax:score=additive", wq=wq.numpy(), wk=wk.numpy(),
                           w=w.numpy(), layout="bhnd")
    assert np.array_equal(by_numpy, out.numpy())


def test_forced_forms_agree_with_the_walk():
    q, k, v = make(1, 8, 2, 2, 300, 32, 32, torch.float32, "bnhd", seed=3)
    walk = attn.attend(q, k, v, "softmax:causal")
    assert "runs form 'rows'" in attn.explain(q, k, v, "softmax:causal")
    for form in ("rows", "tiled", "reference"):
        forced = attn.attend(q, k, v, "softmax:causal", form=form)
        assert torch.allclose(forced, walk, atol=2e-6), form
    assert torch.equal(attn.attend(q, k, v, "softmax:causal", form="rows"), walk)
    text = attn.explain(q, k, v, "softmax:causal", return_probs=True)
    assert "runs form 'tiled'" in text and "rows        refused: probabilities requested" in text


def test_isa_argument_applies_to_one_call():
    q, k, v = make(1, 2, 2, 70, 90, 24, 24, torch.float32, "bnhd", seed=6)
    before = attn.active_isa()
    for isa in attn.supported_isas():
        out = attn.attend(q, k, v, "softmax:causal", isa=isa)
        assert torch.allclose(out, attn.attend(q, k, v, "softmax:causal", isa="scalar"), atol=2e-6), isa
        assert f"(isa {isa})" in attn.explain(q, k, v, isa=isa)
    assert attn.active_isa() == before


def test_probs_match_sdpa_weights():
    q, k, v = make(1, 2, 2, 20, 30, 16, 16, torch.float32, "bhnd", seed=4)
    out, lse, probs = attn.attention(q, k, v, causal=True, layout="bhnd", return_lse=True, return_probs=True)
    mask = torch.ones(20, 30, dtype=torch.bool).tril(10)
    s = (q.double() @ k.double().transpose(-1, -2)) / 4.0
    p = torch.softmax(s.masked_fill(~mask, -math.inf), -1)
    assert torch.allclose(probs.double(), p, atol=1e-6)
    assert (probs[..., ~mask] == 0).all()


def test_dropout_reproducible_and_unbiased():
    q, k, v = make(1, 4, 4, 64, 64, 16, 16, torch.float32, "bnhd", seed=8)
    a = attn.attention(q, k, v, dropout_p=0.3, seed=11, threads=1)
    b = attn.attention(q, k, v, dropout_p=0.3, seed=11, threads=2)
    c = attn.attention(q, k, v, dropout_p=0.3, seed=12)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    # averaged over many seeds, dropout is unbiased: mean output approaches the no-dropout output
    ref = attn.attention(q, k, v)
    mean = sum(attn.attention(q, k, v, dropout_p=0.3, seed=s) for s in range(200)) / 200
    assert (mean - ref).abs().mean() < 0.02


def test_numpy_and_torch_agree():
    q, k, v = make(2, 4, 1, 31, 47, 16, 16, torch.float32, "bnhd", seed=2)
    out_t = attn.attention(q, k, v, causal=True)
    out_n = attn.attention(q.numpy(), k.numpy(), v.numpy(), causal=True)
    assert isinstance(out_n, np.ndarray) and isinstance(out_t, torch.Tensor)
    assert np.array_equal(out_n, out_t.numpy())


def test_every_isa_agrees():
    q, k, v = make(1, 2, 2, 70, 90, 24, 24, torch.float32, "bnhd", seed=6)
    before = attn.active_isa()
    outs = {}
    for isa in attn.supported_isas():
        attn.set_isa(isa)
        outs[isa] = attn.attention(q, k, v, causal=True)
    attn.set_isa(before)
    for isa, o in outs.items():
        assert torch.allclose(o, outs["portable"], atol=2e-6), isa


def test_linformer_matches_a_literal_projection():
    """linformer: K' = E K, V' = F V along the sequence, then softmax attention over the k rows."""
    q, k, v = make(2, 4, 2, 9, 30, 16, 8, torch.float32, "bhnd", seed=12)
    g = torch.Generator().manual_seed(3)
    E, F = torch.randn(6, 30, generator=g) / 6**0.5, torch.randn(6, 30, generator=g) / 6**0.5
    out, lse = attn.attend(q, k, v, "linformer:k=6", E=E, F=F, layout="bhnd", return_lse=True)
    kp = (E.double() @ k.double()).repeat_interleave(2, dim=1)  # (B, H, k, D): GQA groups of 2
    vp = (F.double() @ v.double()).repeat_interleave(2, dim=1)
    s = q.double() @ kp.transpose(-1, -2) / 4.0
    assert torch.allclose(out.double(), torch.softmax(s, -1) @ vp, atol=1e-5)
    assert torch.allclose(lse.double(), torch.logsumexp(s, -1), atol=1e-5)
    assert "runs form 'projected'" in attn.explain(q, k, v, "linformer:k=6", E=E, F=F, layout="bhnd")
