"""One options object crosses the binding; C++ validates, checks ranges and names, and allocates the
outputs: Python converts types only, and outputs keep the inputs' kind and dtype."""
import numpy as np
import pytest
import torch

import attn
from attn import _attn


def qkv(B=2, N=9, M=9, H=4, Hkv=2, D=8, seed=0):
    r = np.random.default_rng(seed)
    return (r.standard_normal((B, N, H, D)).astype(np.float32), r.standard_normal((B, M, Hkv, D)).astype(np.float32),
            r.standard_normal((B, M, Hkv, D)).astype(np.float32))


@pytest.mark.parametrize("call,message", [
    # "attend: " is the C++ entry's prefix: the range is checked there, not restated in Python
    (lambda q, k, v: attn.attend(q, k, v, threads=300), "attend: threads must be in [0, 256] (0 = all CPUs), got 300"),
    (lambda q, k, v: attn.attention(q, k, v, threads=-1), "attend: threads must be in [0, 256] (0 = all CPUs), got -1"),
    (lambda q, k, v: attn.attend(q, k, v, return_stats=True, stats_topk=2000),
     "attend: stats_topk must be in [1, 1024], got 2000"),
    (lambda q, k, v: attn.explain(q, k, v, return_stats=True, stats_topk=0), "attend: stats_topk must be in [1, 1024], got 0"),
    (lambda q, k, v: attn.linear_attention(q, k, v, chunk_size=5000), "attend: chunk_size must be in [1, 4096], got 5000"),
    (lambda q, k, v: attn.linear_attention(q, k, v, chunk_size=0), "attend: chunk_size must be in [1, 4096], got 0"),
    (lambda q, k, v: attn.linear_attention(q, k, v, decay=1.5), "attend: decay must be in (0, 1], got 1.5"),
    (lambda q, k, v: attn.linear_attention(q, k, v, scale=-2.0), "attend: linear scale must be in [1e-30, 1e+12], got -2"),
    (lambda q, k, v: attn.linear_attention(q, k, v, feature_map="relu3"),
     "feature_map: mechanism: in 'map=relu3': map must be elu, relu, identity, exp or relu2, got 'relu3'"),
    (lambda q, k, v: attn.linear_attention(q, k, v, feature_map="elu,causal"),
     "feature_map must be one name such as 'elu', got 'elu,causal'"),
    (lambda q, k, v: attn.attention(q, k, v, window_size=(-3, 0)), "attend: window must be LEFT:RIGHT with each >= 0"),
    (lambda q, k, v: attn.flash_attn_varlen_func(q[0], k[0], v[0], [0, 9], [0, 9], 9, 9, threads=999),
     "threads must be in [0, 256]"),
])
def test_ranges_are_checked_by_cpp_and_its_message_reaches_python(call, message):
    q, k, v = qkv()
    with pytest.raises(ValueError) as e:
        call(q, k, v)
    assert message in str(e.value), str(e.value)


def test_a_cache_call_refused_by_cpp_leaves_the_cache_as_it_was():
    q, k, v = qkv(B=1, N=1, M=1)
    k_cache, v_cache = np.zeros((1, 16, 2, 8), np.float32), np.zeros((1, 16, 2, 8), np.float32)
    with pytest.raises(ValueError, match=r"threads must be in \[0, 256\]"):
        attn.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=0, threads=1000)
    assert not k_cache.any() and not v_cache.any()


def test_typed_mechanisms_equal_their_text_and_keep_every_bit_of_a_float():
    q, k, v = qkv(N=20, M=20, seed=1)
    third = 1 / 3
    typed = _attn.softmax_mechanism(causal=True, scale=third, window=(5, 0), softcap=0.0, dropout=0.0, seed=0)
    assert str(typed) == "softmax:causal,scale=0.3333333333333333,window=5:0"
    assert np.array_equal(attn.attention(q, k, v, causal=True, softmax_scale=third, window_size=(5, 0)),
                          attn.attend(q, k, v, "softmax:causal,scale=0.3333333333333333,window=5:0"))
    lin = _attn.linear_mechanism(map="relu", causal=True, normalize=False, decay=0.9, chunk=16, scale=None)
    assert str(lin) == "linear:map=relu,causal,normalize=0,decay=0.9,chunk=16"
    o, _ = attn.linear_attention(q, k, v, feature_map="relu", normalize=False, decay=0.9, chunk_size=16)
    assert np.array_equal(o, attn.attend(q, k, v, "linear:map=relu,causal,normalize=0,decay=0.9,chunk=16"))
    assert np.array_equal(o, attn.attend(q, k, v, lin))  # attend takes the mechanism object beside text


def test_one_options_object_by_field_name():
    o = _attn.Options()
    assert (o.layout, o.threads, o.stats_topk, o.block_size, o.return_lse) == ("bnhd", 0, 8, (128, 128), False)
    q, k, v = qkv()
    o.return_lse, o.threads = True, 1
    out, lse, probs, state, stats = _attn.attend(q, k, v, "softmax:causal", o)
    assert probs is None and state is None and stats is None
    want, want_lse = attn.attention(q, k, v, causal=True, return_lse=True)
    assert np.array_equal(out, want) and np.array_equal(lse, want_lse)


@pytest.mark.parametrize("layout", ["bnhd", "bhnd"])
@pytest.mark.parametrize("kind,dtype", [("numpy", np.float32), ("numpy", np.float16), ("torch", torch.float32),
                                        ("torch", torch.bfloat16), ("torch", torch.float16)])
def test_outputs_allocated_by_cpp_have_the_inputs_kind_dtype_and_layout(kind, dtype, layout):
    q, k, v = qkv(N=7, M=11)
    if layout == "bhnd":
        q, k, v = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (q, k, v))
    if kind == "torch":
        q, k, v = (torch.from_numpy(x).to(dtype) for x in (q, k, v))
    else:
        q, k, v = (x.astype(dtype) for x in (q, k, v))
    out, lse, probs, stats = attn.attend(q, k, v, "softmax", layout=layout, return_lse=True, return_probs=True,
                                         return_stats=True)
    array = torch.Tensor if kind == "torch" else np.ndarray
    assert all(isinstance(x, array) for x in (out, lse, probs, *stats))
    assert out.dtype == q.dtype and out.shape == q.shape
    f32 = torch.float32 if kind == "torch" else np.float32
    assert lse.dtype == probs.dtype == stats.entropy.dtype == f32
    assert lse.shape == (2, 4, 7) and probs.shape == (2, 4, 7, 11) and stats.sparsity.shape == (2, 4, 7)
    if kind == "torch":
        assert out.is_contiguous() and lse.is_contiguous()
        out += 1  # writable, owned by the array
    else:
        assert out.flags.c_contiguous and out.flags.writeable
        out += 1


def test_final_state_comes_from_cpp_and_a_transposed_q_still_gives_its_layout():
    q, k, v = qkv(N=12, M=12)
    o, state = attn.linear_attention(q, k, v, output_final_state=True)
    assert state.shape == (2, 4, 8, 9) and state.dtype == np.float32  # (B, H, D, Dv + 1)
    tq = torch.from_numpy(q).transpose(1, 2).contiguous().transpose(1, 2)  # (B, N, H, D) of (B, H, N, D) memory
    out = attn.attention(tq, torch.from_numpy(k), torch.from_numpy(v))
    assert out.is_contiguous() and out.shape == tq.shape  # the layout asked for, not q's memory order


def test_cache_and_varlen_outputs_are_packed_like_flash_attn():
    q, k, v = qkv(B=1, N=5, M=5)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    kc, vc = torch.zeros(1, 8, 2, 8), torch.zeros(1, 8, 2, 8)
    out, lse = attn.flash_attn_with_kvcache(tq, kc, vc, tk, tv, cache_seqlens=0, causal=True, return_softmax_lse=True)
    assert isinstance(out, torch.Tensor) and out.shape == (1, 5, 4, 8) and out.is_contiguous() and lse.shape == (1, 4, 5)
    vo, vlse, _ = attn.flash_attn_varlen_func(q[0], k[0], v[0], [0, 2, 5], [0, 2, 5], 3, 3, causal=True,
                                              return_attn_probs=True)
    assert isinstance(vo, np.ndarray) and vo.shape == (5, 4, 8) and vo.flags.c_contiguous and vlse.shape == (4, 5)


@pytest.mark.parametrize("mechanism,message", [
    # Hardening: options whose computation overflows float32 are refused
    ("polaformer:power=100", "attend: polaformer power must be in (1, 10], got 100"),
    ("linear:scale=3e38", "attend: linear scale must be in [1e-30, 1e+12], got 3e+38"),
    ("gau:bias=3e38", "attend: gau bias must be in [-1e+12, 1e+12], got 3e+38"),
    ("efficient:scale=3e38", "attend: efficient scale must be in [1e-30, 1e+12], got 3e+38"),
    ("softmax:softcap=1e39", "attend: softmax softcap must be in [1e-30, 1e+30], got 1e+39"),
    # class 5: sizes beyond what the input can use, before anything is allocated
    ("linformer:k=1048576", "attend: linformer k must be in [1, M] (E K and F V have rank at most the key count M = 6), got k = 1048576"),
    ("performer:features=65536", "attend: performer features x head dim must be at most 2^20"),
])
def test_options_past_their_range_are_refused(mechanism, message):
    q = np.random.default_rng(2).standard_normal((1, 6, 2, 32)).astype(np.float32)
    with pytest.raises(ValueError) as e:
        attn.attend(q, q, q, mechanism)
    assert message in str(e.value), str(e.value)
    ranges = attn.info(mechanism.split(":")[0])["option_ranges"]  # performer has no float option
    assert (ranges or mechanism.startswith("performer")) and all(" in " in r for r in ranges)


def test_python_options_are_the_bindings_fields():
    # One declaration of each option: attn::AttendOptions, bound once as _attn.Options. Every name the
    # package sets on it (_options(...) keywords, _check_scalars' flags, k_scale/v_scale) must be one
    # of its fields, and every field must be set somewhere: a renamed or new field fails here.
    import ast
    import pathlib
    fields = {n for n in dir(_attn.Options()) if not n.startswith("_")}
    assert {"layout", "mask", "params", "return_lse", "torch"} <= fields
    used = {"k_scale", "v_scale", "threads", "stats_topk"}  # set through **scales / _check_scalars
    for path in (pathlib.Path(attn.__file__).parent).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("_options", "_check_scalars"):
                used |= {kw.arg for kw in node.keywords if kw.arg is not None}
    used.discard("use_reference")  # _check_scalars turns it into form="reference"
    assert used - fields == set(), f"set by Python but not a field of _attn.Options: {sorted(used - fields)}"
    assert fields - used == set(), f"fields of _attn.Options no Python function sets: {sorted(fields - used)}"
