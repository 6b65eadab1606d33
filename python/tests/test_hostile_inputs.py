"""The third round's hostile-input findings in the Python module (docs/reliability.md, "Third round"):
each test names what went wrong before. Every error names the argument and what was expected and
given; a gradient attn cannot give is an error (the caller asked for it) or a warning naming the
tensor that gets none (a function without a backward), never a silent detach."""
from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

import attn
from attn import _attn
from conftest import HANG_SECONDS

rng = np.random.default_rng(3)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


# ---- 1. info() str()-ed whatever it was given -----------------------------------------------------


@pytest.mark.parametrize("bad", [None, b"softmax", 123])
def test_info_refuses_what_is_not_a_str_instead_of_looking_up_its_str(bad):
    # before: info(None) looked up the mechanism 'None' (ValueError "unknown mechanism 'None'")
    with pytest.raises(TypeError, match=re.escape(f"text must be a str, got {bad!r} ({type(bad).__name__})")):
        attn.info(bad)


def test_info_still_takes_a_typed_mechanism():
    mech = _attn.linear_mechanism(map="elu", causal=True, normalize=True, decay=None, chunk=64, scale=None)
    assert attn.info(mech)["family"] == attn.info("linear:causal")["family"]


# ---- 2. attend_backward(lse=None) reported an lse of shape (0, 0, 0, 0) -----------------------------


def test_attend_backward_says_lse_is_required_for_a_softmax():
    q, k, v = f32(1, 5, 2, 8), f32(1, 7, 2, 8), f32(1, 7, 2, 8)
    out, lse = attn.attend(q, k, v, "softmax:causal", return_lse=True)
    with pytest.raises(ValueError, match=r"attend_backward: lse is required for 'softmax:causal' .*got None") as e:
        attn.attend_backward(out, q, k, v, out, None, "softmax:causal")
    assert "(0, 0, 0, 0)" not in str(e.value)
    # a family without an lse takes None, as documented
    o = attn.attend(q, k[:, :5], v[:, :5], "linear:causal")
    assert len(attn.attend_backward(o, q, k[:, :5], v[:, :5], o, None, "linear:causal")) == 3


# ---- 3. kv_scales: a transposed shape in the message; dropped on the autograd path ------------------


@pytest.mark.parametrize("layout", ["bnhd", "bhnd"])
def test_kv_scales_shape_error_shows_the_callers_shape(layout):
    # before: "kv_scales.k must have shape (B, Hkv, M, 1) = (1, 2, 4, 1), got (1, 2, 3, 1)" for a
    # (1, 3, 2) scale in layout bnhd: C++'s transposed view, with a dimension the caller never gave
    q, kv = f32(1, 4, 2, 8), f32(1, 4, 2, 8)
    k8, ks = attn.quantize_rows(kv, layout)
    v8, vs = attn.quantize_rows(kv, layout)
    bad = ks[:, :3]  # (1, 3, 2): the caller's shape, whatever the layout names its dimensions
    dims = "(B, M, Hkv)" if layout == "bnhd" else "(B, Hkv, M)"
    want = (1, 4, 2)
    with pytest.raises(ValueError, match=re.escape(f"kv_scales[0] (k_scale) must have k's shape without head_dim, "
                                                   f"{dims} = {want} for layout={layout!r}, got {bad.shape}")):
        attn.attend(q, k8, v8, "softmax", layout=layout, kv_scales=(bad, vs))
    with pytest.raises(ValueError, match=re.escape(f"kv_scales[1] (v_scale) must have v's shape without head_dim, "
                                                   f"{dims} = {want} for layout={layout!r}, got {vs[0].shape}")):
        attn.attend(q, k8, v8, "softmax", layout=layout, kv_scales=(ks, vs[0]))


def test_kv_scales_with_tensors_that_require_grad_are_refused_not_dropped():
    # before: the autograd path dropped kv_scales, then said "k must be float32 ..., got int8"
    q = torch.randn(1, 4, 2, 8, requires_grad=True)
    k8, ks = attn.quantize_rows(torch.randn(1, 4, 2, 8))
    v8, vs = attn.quantize_rows(torch.randn(1, 4, 2, 8))
    with pytest.raises(ValueError, match=r"kv_scales \(int8 k and v rows\) have no backward pass"):
        attn.attend(q, k8, v8, "softmax", kv_scales=(ks, vs))
    with torch.no_grad():  # inference: the int8 path runs
        assert attn.attend(q, k8, v8, "softmax", kv_scales=(ks, vs)).shape == (1, 4, 2, 8)


# ---- 4. gamma / eps / norm_eps: float() of None, strings accepted -----------------------------------


BAD_NUMBERS = [(None, "None", "NoneType"), ("0.5", "'0.5'", "str"), (True, "True", "bool")]


def _sana_inputs():
    x = f32(1, 4, 32)
    return x, f32(96, 32), f32(32, 32)


def _ffn_weights(c=32, h=8):
    return f32(2 * h, c), f32(2 * h), f32(2 * h, 3, 3), f32(2 * h), f32(c, h)


def _refine_inputs():
    a = np.tril(np.ones((4, 4), np.float32))
    return a / a.sum(1, keepdims=True), f32(4, 3), f32(4, 2), f32(4, 2)


CALLS = {
    "gamma (refine_attention)": ("gamma", lambda x: attn.refine_attention(*_refine_inputs(), "additive", gamma=x)),
    "gamma (refined_weights)": ("gamma", lambda x: attn.refined_weights(*(_refine_inputs()[i] for i in (0, 2, 3)),
                                                                        "additive", gamma=x)),
    "row_sum_tolerance": ("row_sum_tolerance",
                          lambda x: attn.refine_attention(*_refine_inputs(), row_sum_tolerance=x)),
    "eps (lite_la)": ("eps", lambda x: attn.lite_la(*_sana_inputs(), eps=x)),
    "eps (sana_block)": ("eps", lambda x: attn.sana_block(_sana_inputs()[0], (2, 2), *_sana_inputs()[1:], None,
                                                          *_ffn_weights(), eps=x)),
    "norm_eps": ("norm_eps", lambda x: attn.sana_block(_sana_inputs()[0], (2, 2), *_sana_inputs()[1:], None,
                                                       *_ffn_weights(), norm_eps=x)),
    "gamma (theory)": ("gamma", lambda x: attn.theory.sparsity_exp(0.0, x)),
    "beta (theory)": ("beta", lambda x: attn.theory.sparsity_identity(x, 1.0)),
    "lam (theory)": ("lam", lambda x: attn.theory.sparsity_decay(x, 10)),
    "mean (theory)": ("mean", lambda x: attn.theory.sparsity_linear_iid([1.0, 2.0], x, 1.0)),
}


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("bad,shown,kind", BAD_NUMBERS)
def test_numbers_only_for_float_arguments(call, bad, shown, kind):
    # before: None gave "float() argument must be a string or a real number", "0.5" and True ran
    name, f = CALLS[call]
    f(0.5)  # a number runs
    with pytest.raises(TypeError, match=f"^{re.escape(name)} must be a number .*got {re.escape(shown)} \\({kind}\\)$"):
        f(bad)


def test_theory_arrays_are_numbers_only():
    with pytest.raises(TypeError, match="gamma must be a number or an array of numbers, got <U3 values"):
        attn.theory.sparsity_exp(0.0, ["0.5", "1.0", "2.0"])
    np.testing.assert_allclose(attn.theory.sparsity_exp(0.0, [0.5, 1.0]), np.exp(-np.array([0.5, 1.0]) ** 2 / 2))


# ---- 5. Titans: memory_qkv unpacked blindly; bfloat16 gave torch's ScalarType message ----------------


def _titans_qkv():
    return f32(1, 2, 5, 4), f32(1, 2, 5, 4), f32(1, 2, 5, 4)


@pytest.mark.parametrize("bad,match,kind", [
    ((f32(1, 2, 5, 4),) * 2, r"memory_qkv must be None or a triple \(mq, mk, mv\) .*got a tuple of 2", TypeError),
    (5, r"memory_qkv must be None or a triple \(mq, mk, mv\) .*got int", TypeError),
    ((f32(1, 2, 5, 4), f32(1, 2, 4, 4), f32(1, 2, 5, 4)),
     r"memory_qkv\[1\] must have q's shape \(B, H, N, d\) = \(1, 2, 5, 4\), got \(1, 2, 4, 4\)", ValueError),
    ((f32(1, 2, 5, 4), [1.0], f32(1, 2, 5, 4)), r"memory_qkv\[1\] must be a numpy.ndarray, torch.Tensor or number, "
                                                 r"got list", TypeError),
])
def test_titans_mag_names_a_bad_memory_qkv(bad, match, kind):
    # before: "not enough values to unpack (expected 3, got 2)", "cannot unpack non-iterable int object"
    with pytest.raises(kind, match=match):
        attn.titans_mag(*_titans_qkv(), 0.1, 0.9, 0.01, memory_qkv=bad)


@pytest.mark.parametrize("where", ["q", "theta", "w0['W']"])
def test_titans_names_a_bfloat16_tensor_and_the_dtypes_it_takes(where):
    # before: TypeError "Got unsupported ScalarType BFloat16", naming nothing
    q = torch.randn(1, 2, 5, 4)
    args = dict(q=q, theta=0.1, w0={"W": torch.zeros(4, 4)})
    bf = {"q": q.bfloat16(), "theta": torch.full((1, 2, 5), 0.1, dtype=torch.bfloat16),
          "w0['W']": {"W": torch.zeros(4, 4, dtype=torch.bfloat16)}}
    args[where.split("[")[0]] = bf[where]
    with pytest.raises(TypeError, match=f"^{re.escape(where)} must be float32 or float64, got torch.bfloat16$"):
        attn.titans_memory(args["q"], q, q, args["theta"], 0.9, 0.01, "linear", args["w0"])


# ---- 7. sizes that end in NumPy's MemoryError naming no argument ------------------------------------


def test_titans_init_too_large_names_d_and_the_bytes_before_allocating():
    # before: "Unable to allocate 32.0 TiB for an array with shape (4194304, 1048576) and data type float64"
    with pytest.raises(MemoryError, match=r"^d = 1048576 needs 64\.0 TiB for titans_init's W1 .* more than this "
                                          r"machine's .* of memory$"):
        attn.titans_init(2**20, "mlp")
    with pytest.raises(MemoryError, match=r"^d = 1048576 needs 4\.0 TiB for titans_init's W \(d, d\)"):
        attn.titans_init(2**20, "linear")
    assert attn.titans_init(8, "mlp")["W1"].shape == (32, 8)


def test_cem_population_too_large_names_population_when_made():
    # before: the first step() ended in NumPy's MemoryError naming no argument
    with pytest.raises(MemoryError, match=r"^population = 2147483647 needs 256\.0 GiB for a generation's samples "
                                          r"\(population x n_experts = 2147483647 x 4 float64"):
        attn.CEM(4, population=2**31 - 1)
    assert attn.CEM(4, population=10).sample().shape == (10, 4)


# ---- 8. attn report: [Errno 17] / [Errno 28] with temporary paths -----------------------------------


def _report(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "attn.lab.report", *args], capture_output=True, text=True,
                          timeout=HANG_SECONDS, cwd=tmp_path)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_report_to_a_full_device_names_the_out_path(tmp_path):
    # before: "error: [Errno 28] No space left on device"
    p = _report(tmp_path, "--out", "/dev/full")
    assert p.returncode == 2
    assert "error: attn.report: --out /dev/full: cannot write the page (No space left on device)" in p.stderr, p.stderr
    assert "Errno" not in p.stderr


def test_report_run_directory_that_is_a_file_names_it(tmp_path):
    # before: "error: [Errno 17] File exists: '.../r-data'"
    (tmp_path / "r-data").write_text("not a directory")
    p = _report(tmp_path, "--out", str(tmp_path / "r.html"), "--run", "curves")
    assert p.returncode == 2 and "Errno" not in p.stderr, p.stderr
    assert (f"cannot make {tmp_path / 'r-data'}, the directory the runs write into (for --out {tmp_path / 'r.html'}) "
            "(File exists: something that is not a directory") in p.stderr, p.stderr
    assert not (tmp_path / "r.html").exists()


def test_report_write_failure_names_the_out_path_not_the_temporary_file(tmp_path, monkeypatch):
    # before: "[Errno 18] Invalid cross-device link: '.../.r.html.x1y2.tmp' -> '.../r.html'"
    out = tmp_path / "r.html"

    def failing_replace(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(src), None, str(dst))

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError) as e:
        attn.report.build(tmp_path, out)
    assert str(e.value) == f"attn.report: --out {out}: cannot write the page (No space left on device)"
    assert e.value.errno == errno.ENOSPC and ".tmp" not in str(e.value)
    assert list(tmp_path.iterdir()) == []  # the temporary file is removed


# ---- 9. double backward gave torch's "no autograd formula was registered" ---------------------------


def test_double_backward_through_attend_is_refused_by_name():
    q = torch.randn(1, 5, 2, 8, requires_grad=True)
    k, v = torch.randn(1, 5, 2, 8), torch.randn(1, 5, 2, 8)
    (g,) = torch.autograd.grad(attn.attention(q, k, v, causal=True).pow(2).sum(), q, create_graph=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                           is_causal=True).transpose(1, 2)
    (want,) = torch.autograd.grad(ref.pow(2).sum(), q)
    torch.testing.assert_close(g, want, atol=1e-5, rtol=1e-4)  # the first gradient is right with create_graph
    with pytest.raises(RuntimeError, match=r"^attn.attend \(torch.ops.attn.attend\): double backward is not supported"):
        g.sum().backward()


def test_double_backward_through_linear_attention_is_refused_by_name():
    q = torch.randn(1, 6, 2, 4, requires_grad=True)
    o, _ = attn.linear_attention(q, q, q)
    (g,) = torch.autograd.grad(o.sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match=r"^attn.linear_attention \(torch.ops.attn.linear_attention\): double "
                                           r"backward is not supported"):
        g.sum().backward()


# ---- 10. gradients that were silently absent ---------------------------------------------------------


def _grad_inputs():
    q = torch.randn(1, 4, 2, 8, requires_grad=True)
    return q, torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8)


@pytest.mark.parametrize("call", ["attend", "attention"])
def test_a_float_attn_mask_that_requires_grad_is_refused(call):
    q, k, v = _grad_inputs()
    bias = torch.zeros(1, 2, 4, 4, requires_grad=True)
    f = attn.attend if call == "attend" else attn.attention
    for qq in (q, q.detach()):  # with or without q's gradient: the mask's cannot exist
        with pytest.raises(ValueError, match=r"^attn_mask requires grad, but attn has no gradient for a float "
                                             r"attn_mask .*pass attn_mask.detach\(\)"):
            f(qq, k, v, attn_mask=bias)
    f(q, k, v, attn_mask=bias.detach()).sum().backward()  # detached: a constant bias, as documented
    with torch.no_grad():
        f(q, k, v, attn_mask=bias)


def test_alibi_slopes_that_require_grad_are_refused():
    q, k, v = _grad_inputs()
    slopes = torch.tensor([0.5, 0.25], requires_grad=True)
    for call in (lambda: attn.attention(q, k, v, alibi_slopes=slopes),
                 lambda: attn.attention(q.detach(), k, v, alibi_slopes=slopes),
                 lambda: attn.flash_attn_with_kvcache(q.detach(), k, v, alibi_slopes=slopes)):
        with pytest.raises(ValueError, match=r"^alibi_slopes requires grad, but attn has no gradient for alibi_slopes"):
            call()


def test_alibi_slopes_are_numbers_only():
    q, k, v = (x.detach().numpy() for x in _grad_inputs())
    with pytest.raises(TypeError, match="alibi_slopes must be a number or an array of numbers, got <U3 values"):
        attn.attention(q, k, v, alibi_slopes=["0.5", "0.1"])


def test_the_custom_op_refuses_a_mask_gradient_at_backward():
    q, k, v = _grad_inputs()
    bias = torch.zeros(1, 2, 4, 4, requires_grad=True)
    out, _ = torch.ops.attn.attend(q, k, v, "softmax", "bnhd", bias, [], None)
    with pytest.raises(ValueError, match=r"attend_backward: attn_mask requires grad, but attn has no gradient"):
        out.sum().backward()


def _warned_at_the_call(w, name):
    mine = [x for x in w if issubclass(x.category, RuntimeWarning) and f"attn: {name} requires grad" in str(x.message)]
    assert mine, [str(x.message) for x in w]
    assert all(x.filename == __file__ for x in mine), [x.filename for x in mine]  # the caller's line
    assert f"{name} gets no gradient" in str(mine[0].message)


def _no_grad_calls():
    p = lambda t: torch.from_numpy(t).requires_grad_()  # noqa: E731
    q, k, v = (torch.from_numpy(x) for x in _titans_qkv())
    a, _, w1, w2 = _refine_inputs()
    return {
        # titans_memory and moe_feed_forward train now (test_block_gradients_moe_titans.py); the
        # attention forms do not, and keep their gates constant with the warning
        ("titans_mag", "theta"): lambda: attn.titans_mag(q, k, v, p(np.full((1, 2, 5), 0.1, np.float32)), 0.9, 0.0),
        ("titans_mag", "q"): lambda: attn.titans_mag(q.clone().requires_grad_(), k, v, 0.1, 0.9, 0.0),
        ("refined_weights", "w1"): lambda: attn.refined_weights(a, p(w1), w2),
    }


@pytest.mark.parametrize("call,name", list(_no_grad_calls()))
def test_a_tensor_that_gets_no_gradient_is_named_in_a_warning(call, name):
    # before: Titans, the refinement's weights, the MoE's router and experts and LiteLA's weights were
    # detached without a word (refine_attention and LiteLA train now: they get gradients instead)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        _no_grad_calls()[(call, name)]()
    _warned_at_the_call(w, name)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # under no_grad: no gradient wanted, no warning
        with torch.no_grad():
            _no_grad_calls()[(call, name)]()
