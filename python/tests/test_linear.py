"""Linear attention from Python: attn.linear_attention and attend("linear:...") against a literal
NumPy quadratic formula, the state passed between calls, torch in / torch out, errors."""
import numpy as np
import pytest
import torch

import attn
from conftest import assert_half_ulps

MAPS = {
    "elu": lambda x: np.where(x > 0, x + 1, np.exp(np.minimum(x, 0))),
    "relu": lambda x: np.maximum(x, 0),
    "identity": lambda x: x,
    "exp": np.exp,
    "relu2": lambda x: np.maximum(x, 0) ** 2,
}


def literal(q, k, v, feature_map="elu", causal=True, decay=None, normalize=True, scale=1.0):
    """The formula written out in float64, (B, T, H, D) layout, grouped heads."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, n, h, _ = q.shape
    m, hkv = k.shape[1], k.shape[2]
    phi = MAPS[feature_map]
    out = np.zeros((b, n, h, v.shape[3]))
    lam = np.broadcast_to(np.asarray(1.0 if decay is None else decay, np.float64), (h,))
    for hh in range(h):
        kv = hh // (h // hkv)
        w = scale * np.einsum("bid,bjd->bij", phi(q[:, :, hh]), phi(k[:, :, kv]))
        if causal:
            i, j = np.arange(n)[:, None], np.arange(m)[None, :]
            w = np.where(j <= i, w * lam[hh] ** np.maximum(i - j, 0), 0.0)
        num = np.einsum("bij,bjd->bid", w, v[:, :, kv])
        if normalize:
            den = w.sum(-1, keepdims=True)
            num = np.where(den != 0, num / np.where(den != 0, den, 1), 0)
        out[:, :, hh] = num
    return out


def qkv(seed, b=2, n=150, h=4, hkv=2, d=16, dv=12, m=None):
    rng = np.random.default_rng(seed)
    m = n if m is None else m
    return (rng.standard_normal((b, n, h, d), dtype=np.float32), rng.standard_normal((b, m, hkv, d), dtype=np.float32),
            rng.standard_normal((b, m, hkv, dv), dtype=np.float32))


@pytest.mark.parametrize("feature_map", sorted(MAPS))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("normalize", [True, False])
def test_matches_the_literal_formula(feature_map, causal, normalize):
    q, k, v = qkv(1)
    q, k = q * 0.5, k * 0.5  # exp features stay moderate
    o, _ = attn.linear_attention(q, k, v, feature_map=feature_map, causal=causal, normalize=normalize, chunk_size=32)
    want = literal(q, k, v, feature_map, causal, normalize=normalize)
    np.testing.assert_allclose(o, want, rtol=2e-4, atol=2e-4 * np.abs(want).max())


@pytest.mark.parametrize("decay", [0.97, 0.5, np.array([0.9, 0.8, 0.99, 1.0], np.float32)])
def test_retention_and_per_head_decay(decay):
    q, k, v = qkv(2, n=200)
    o, _ = attn.linear_attention(q, k, v, feature_map="identity", decay=decay, normalize=False, scale=0.25)
    want = literal(q, k, v, "identity", True, decay=decay, normalize=False, scale=0.25)
    np.testing.assert_allclose(o, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    if np.ndim(decay) == 0:
        same = attn.attend(q, k, v, f"retention:decay={decay},scale=0.25")
        np.testing.assert_array_equal(same, o)


@pytest.mark.parametrize("cut", [1, 64, 97])
def test_state_carries_a_sequence_across_calls(cut):
    q, k, v = qkv(3, n=180)
    whole, state = attn.linear_attention(q, k, v, decay=0.95, output_final_state=True, chunk_size=16)
    a, s = attn.linear_attention(q[:, :cut], k[:, :cut], v[:, :cut], decay=0.95, output_final_state=True,
                                 chunk_size=16)
    b, s2 = attn.linear_attention(q[:, cut:], k[:, cut:], v[:, cut:], decay=0.95, initial_state=s,
                                  output_final_state=True, chunk_size=16)
    assert state.shape == (2, 4, 16, 13)  # (B, H, F, Dv + 1): the last column is the normaliser
    np.testing.assert_allclose(np.concatenate([a, b], axis=1), whole, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s2, state, rtol=1e-5, atol=1e-4)


def test_decoding_one_token_at_a_time_equals_the_prefill():
    q, k, v = qkv(4, b=1, n=40)
    whole, _ = attn.linear_attention(q, k, v, feature_map="relu2", normalize=False)
    state = np.zeros((1, 4, 16, 12), np.float32)
    for t in range(40):
        o, state = attn.linear_attention(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], feature_map="relu2",
                                         normalize=False, initial_state=state, output_final_state=True)
        np.testing.assert_allclose(o[:, 0], whole[:, t], rtol=1e-5, atol=1e-4)


def test_torch_in_torch_out_and_bfloat16():
    q, k, v = (torch.from_numpy(x) for x in qkv(5, n=70))
    o, s = attn.linear_attention(q, k, v, output_final_state=True)
    assert isinstance(o, torch.Tensor) and isinstance(s, torch.Tensor) and s.dtype == torch.float32
    np.testing.assert_allclose(o.numpy(), literal(q.numpy(), k.numpy(), v.numpy()), rtol=1e-4, atol=1e-4)
    ob, _ = attn.linear_attention(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert ob.dtype == torch.bfloat16
    want = literal(q.bfloat16().float().numpy(), k.bfloat16().float().numpy(), v.bfloat16().float().numpy())
    assert_half_ulps(ob, torch.from_numpy(want), torch.bfloat16)


def test_non_causal_cross_attention_and_padding():
    q, k, v = qkv(6, n=33, m=90)
    o, _ = attn.linear_attention(q, k, v, causal=False, key_padding_lengths=[90, 41])
    want = np.concatenate([literal(q[:1], k[:1], v[:1], causal=False),
                           literal(q[1:], k[1:, :41], v[1:, :41], causal=False)])
    np.testing.assert_allclose(o, want, rtol=1e-4, atol=1e-4)


def test_bad_input_names_the_argument():
    q, k, v = qkv(7, n=8)
    with pytest.raises(ValueError, match="feature_map: .*map must be elu, relu, identity, exp or relu2, got 'tanh'"):
        attn.linear_attention(q, k, v, feature_map="tanh")
    with pytest.raises(ValueError, match="a decay needs causal"):
        attn.linear_attention(q, k, v, causal=False, decay=0.9)
    # the caller's names, not attend's (params['initial_state'], linear chunk)
    with pytest.raises(ValueError, match=r"^attend: initial_state must have shape"):
        attn.linear_attention(q, k, v, initial_state=np.zeros((2, 4, 16, 12), np.float32))
    with pytest.raises(TypeError, match=r"^initial_state must be float32, float16 or bfloat16, got float64"):
        attn.linear_attention(q, k, v, initial_state=np.zeros((2, 4, 16, 13)))
    with pytest.raises(ValueError, match=r"^attend: chunk_size must be in \[1, "):
        attn.linear_attention(q, k, v, chunk_size=0)
    with pytest.raises(ValueError, match=r"^attend: decay must be in \(0, 1\]"):
        attn.linear_attention(q, k, v, decay=1.5)
    o, _ = attn.linear_attention(q, k, v, decay=[0.5] * q.shape[2])  # a list: one decay per head
    assert np.array_equal(o, attn.linear_attention(q, k, v, decay=np.full(q.shape[2], 0.5, np.float32))[0])
    with pytest.raises(ValueError, match="has no log-sum-exp"):
        attn.attend(q, k, v, "linear", return_lse=True)
    with pytest.raises(ValueError, match="has no recurrent state"):
        attn.attend(q, k, v, "softmax", return_final_state=True)
    with pytest.raises(ValueError, match="N .queries. must equal M"):
        attn.linear_attention(q, k[:, :5], v[:, :5])


@pytest.mark.parametrize("causal", [False, True])
def test_gau_squared_relu_matches_its_formula(causal):
    q, k, v = qkv(8, n=100, m=100)
    o = attn.attend(q, k, v, "gau:bias=0.3" + (",causal" if causal else ""))
    q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
    want = np.zeros(o.shape)
    for h in range(4):
        s = np.einsum("bid,bjd->bij", q64[:, :, h], k64[:, :, h // 2]) / 4.0 + 0.3  # d = 16: 1/sqrt(d)
        a = np.maximum(s, 0) ** 2 / 100
        if causal:
            a = np.tril(a)
        want[:, :, h] = np.einsum("bij,bjd->bid", a, v64[:, :, h // 2])
    np.testing.assert_allclose(o, want, rtol=1e-4, atol=1e-5)


def test_performer_normattn_sana_through_attend():
    q, k, v = qkv(9, n=64)
    exact = attn.attend(q * 0.5, k * 0.5, v, "softmax")
    est = attn.attend(q * 0.5, k * 0.5, v, "performer:features=2048,seed=3")
    assert np.abs(est - exact).mean() < 0.02  # FAVOR+ estimates softmax attention
    o, state = attn.attend(q, k, v, "performer:features=32,seed=1,causal", return_final_state=True)
    assert state.shape == (2, 4, 32, 13)  # F = features
    n = attn.attend(q, k, v, "normattn:map=relu,norm=layer,causal")
    np.testing.assert_allclose(n.mean(-1), 0, atol=1e-5)  # each row layer-normalised
    s = attn.attend(q, k, v, "sana")
    np.testing.assert_allclose(s, literal(q, k, v, "relu", causal=False), rtol=1e-4, atol=1e-5)


def test_polaformer_streams_match_their_formula():
    q, k, v = qkv(10, n=40, h=2, hkv=2, d=8, dv=6)
    o, state = attn.attend(q, k, v, "polaformer:power=2,causal", return_final_state=True)
    assert state.shape == (2, 2, 32, 4)  # (B, H, 4 D, Dv / 2 + 1): both streams
    pos, neg = np.maximum(q, 0) ** 2, np.maximum(-q, 0) ** 2
    kp, kn = np.maximum(k, 0) ** 2, np.maximum(-k, 0) ** 2
    for s, (a, b) in enumerate(((kp, kn), (kn, kp))):  # same-sign, opposite-sign
        w = np.einsum("bihd,bjhd->bhij", pos.astype(np.float64), a) + np.einsum("bihd,bjhd->bhij", neg, b)
        w = np.tril(w)
        num = np.einsum("bhij,bjhd->bihd", w, v[..., 3 * s:3 * s + 3].astype(np.float64))
        want = num / w.sum(-1).transpose(0, 2, 1)[..., None]
        np.testing.assert_allclose(o[..., 3 * s:3 * s + 3], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_efficient_attention_matches_its_formula(causal):
    q, k, v = qkv(11, n=50, h=2, hkv=2, d=8, dv=6)
    q, k = q * 3, k * 3  # wide softmaxes
    o = attn.attend(q, k, v, "efficient:causal" if causal else "efficient", key_padding_lengths=[50, 31])
    q64, k64, v64 = (np.asarray(x, np.float64) for x in (q, k, v))
    qs = np.exp(q64 - q64.max(-1, keepdims=True))
    qs = qs / qs.sum(-1, keepdims=True) / np.sqrt(8)
    want = np.zeros(o.shape)
    for b, length in enumerate([50, 31]):
        for i in range(50):
            end = min(i + 1, length) if causal else length
            ks = np.exp(k64[b, :end] - k64[b, :end].max(0))  # (end, H, D): softmax over the tokens
            ks = ks / ks.sum(0)
            ctx = np.einsum("jhf,jhc->hfc", ks, v64[b, :end])
            want[b, i] = np.einsum("hf,hfc->hc", qs[b, i], ctx)
    np.testing.assert_allclose(o, want, rtol=1e-4, atol=1e-5)


def test_polaformer_refuses_probabilities_instead_of_crashing():
    """PolaFormer has two weight matrices (one per stream): return_probs is an error, not a read of
    weights that do not exist (it crashed before)."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, 1, 16)).astype(np.float32)
    k = rng.standard_normal((1, 1, 50, 16)).astype(np.float32)
    with pytest.raises(ValueError, match="return_probs: polaformer has no single weight matrix"):
        attn.attend(q, k, k, "polaformer:power=3", layout="bhnd", return_probs=True)
    out = attn.attend(q, k, k, "polaformer:power=3", layout="bhnd")
    assert out.shape == (1, 1, 1, 16) and np.isfinite(out).all()
