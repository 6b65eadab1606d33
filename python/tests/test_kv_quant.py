"""8-bit KV rows: attn.quantize_rows, attend(..., kv_scales=...) on int8 K/V, and SmolLM2 with an
int8 KV cache (load_model(cache_dtype="int8")) against its float32 cache."""
import numpy as np
import pytest
import torch

import attn
from attn import _attn


def numpy_rows(x):
    """The rule written in NumPy: scale = max|x| / 127 per row, rows = round(x / scale), ties to even."""
    amax = np.abs(x.astype(np.float64)).max(-1)
    scale = (amax / 127.0).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        rows = np.rint(x.astype(np.float64) * (127.0 / amax)[..., None])
    return np.nan_to_num(rows).astype(np.int8), scale


def test_quantize_rows_follows_the_rule_and_its_bound():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 3, 64)).astype(np.float32) * 3
    x[0, 1, 2] = 0  # a row of zeros: scale 0
    rows, scales = attn.quantize_rows(x)
    assert rows.dtype == np.int8 and rows.shape == x.shape and scales.dtype == np.float32 and scales.shape == (2, 5, 3)
    want_rows, want_scales = numpy_rows(x)
    assert np.array_equal(rows, want_rows) and np.array_equal(scales, want_scales)
    assert scales[0, 1, 2] == 0 and not rows[0, 1, 2].any()
    assert np.abs(scales[..., None] * rows - x).max() <= 0.5 * scales.max() * (1 + 1e-5)
    assert (np.abs(rows).max(-1)[scales > 0] == 127).all()
    # a non-finite row reads back as NaN; torch in, torch out; the layout does not change the rule
    x[1, 0, 0, 5] = np.inf
    rows, scales = attn.quantize_rows(x)
    assert np.isnan(scales[1, 0, 0]) and not rows[1, 0, 0].any()
    t_rows, t_scales = attn.quantize_rows(torch.from_numpy(x), layout="bhnd")
    assert t_rows.dtype == torch.int8 and np.array_equal(t_rows.numpy(), rows)
    with pytest.raises(TypeError, match="x must be float32"):
        attn.quantize_rows(rows)


@pytest.mark.parametrize("form", ["rows", "tiled", "reference"])
def test_attend_on_int8_rows_equals_attend_on_the_rows_they_stand_for(form):
    rng = np.random.default_rng(1)
    B, N, M, H, Hkv, D = 2, 3 if form == "rows" else 40, 300, 6, 2, 32
    q = rng.standard_normal((B, N, H, D)).astype(np.float32)
    k = rng.standard_normal((B, M, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((B, M, Hkv, D)).astype(np.float32)
    (k8, ks), (v8, vs) = attn.quantize_rows(k), attn.quantize_rows(v)
    kf, vf = ks[..., None] * k8, vs[..., None] * v8  # float32, the values the int8 rows stand for
    for mech in ("softmax:causal", "softmax:causal,window=50:0,softcap=20"):
        got, lse = attn.attend(q, k8, v8, mech, kv_scales=(ks, vs), form=form, return_lse=True,
                               key_padding_lengths=[M, 250])
        want, want_lse = attn.attend(q, kf, vf, mech, form=form, return_lse=True, key_padding_lengths=[M, 250])
        assert np.abs(got - want).max() <= 1e-5, mech
        assert np.abs(lse - want_lse).max() <= 1e-5, mech
    # torch SDPA on the dequantized rows (GQA by repeating the kv heads), no mask
    got = attn.attend(q, k8, v8, "softmax", kv_scales=(ks, vs), form=form)
    tq, tk, tv = (torch.from_numpy(a).transpose(1, 2) for a in (q, kf, vf))
    ref = torch.nn.functional.scaled_dot_product_attention(tq, tk.repeat_interleave(3, 1), tv.repeat_interleave(3, 1))
    assert np.abs(got - ref.transpose(1, 2).numpy()).max() <= 1e-5


def test_int8_rows_bad_calls_name_the_argument():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 2, 2, 8)).astype(np.float32)
    k8, ks = attn.quantize_rows(rng.standard_normal((1, 5, 2, 8)).astype(np.float32))
    with pytest.raises(TypeError, match="k must be float32, float16 or bfloat16"):
        attn.attend(q, k8, k8, "softmax")  # int8 rows without their scales
    with pytest.raises(ValueError, match=r"kv_scales must be \(k_scale, v_scale\)"):
        attn.attend(q, k8, k8, "softmax", kv_scales=ks)
    # in the caller's layout, (B, M, Hkv), not C++'s (B, Hkv, M, 1) view (test_hostile_inputs.py has both layouts)
    with pytest.raises(ValueError, match=r"kv_scales\[1\] \(v_scale\) must have v's shape without head_dim, "
                                         r"\(B, M, Hkv\) = \(1, 5, 2\) for layout='bnhd', got \(1, 4, 2\)"):
        attn.attend(q, k8, k8, "softmax", kv_scales=(ks, ks[:, :4]))
    with pytest.raises(ValueError, match="read by the softmax family only"):
        attn.attend(q, k8, k8, "linear:map=elu", kv_scales=(ks, ks))
    with pytest.raises(ValueError, match="k must be int8 with options.kv_scales, got float32"):
        attn.attend(q, q, q, "softmax", kv_scales=(ks, ks))


def test_smollm2_with_an_int8_cache_follows_its_float32_cache():
    path = attn.smollm2_path()
    import pydoc_data.topics
    text = "\n".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))[:6000]
    f32 = attn.load_model(path, max_seq_len=600)
    int8 = attn.load_model(path, max_seq_len=600, cache_dtype="int8")
    assert int8.kv_bytes_per_token == 30 * 2 * 3 * (64 + 4)  # a quarter of float32's, plus a scale per row
    ids = f32.tokenizer.encode(text)[:400]
    za, zb = f32.logits(ids), int8.logits(ids)

    def perplexity(z):
        z = z[:-1].astype(np.float64)
        lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
        return float(np.exp(np.mean(lse - z[np.arange(len(z)), ids[1:]])))

    a, b = perplexity(za), perplexity(zb)
    assert abs(b / a - 1) <= 0.01, (a, b)  # the bound: within 1 % of the float32 cache
    assert (za.argmax(-1) == zb.argmax(-1)).mean() >= 0.95
    assert 0 < np.abs(za - zb).max() <= 0.05 * np.abs(za).max()
    # decode steps, token by token from each cache, teacher-forced (float activations, so that only
    # the cache differs: 8-bit ones requantize its rounding and tip more near-ties, 93 % vs 97 %)
    steps = {}
    for cd in ("f32", "int8"):
        d = _attn.Decoder.from_gguf(path, 0, False, 128, "f32", cd)
        steps[cd] = np.stack([d.forward([t], i, False)[-1] for i, t in enumerate(ids[:64])])
    a, b = steps["f32"], steps["int8"]
    assert (a.argmax(-1) == b.argmax(-1)).mean() >= 0.93
    assert 0 < np.abs(a - b).max() <= 0.03 * np.abs(a).max()
    assert len(int8.generate(ids[:40], max_tokens=8)) == 8
    with pytest.raises(ValueError, match="cache_dtype: expected 'f32', 'f16', 'bf16' or 'int8'"):
        attn.load_model(path, cache_dtype="q8_0")
