"""Every bad input raises ValueError/TypeError with a message naming the problem."""
import numpy as np
import pytest
import torch

import attn
from conftest import HANG_SECONDS


def qkv(B=2, N=5, M=6, H=4, Hkv=2, D=8):
    r = np.random.default_rng(0)
    return (r.standard_normal((B, N, H, D)).astype(np.float32), r.standard_normal((B, M, Hkv, D)).astype(np.float32),
            r.standard_normal((B, M, Hkv, D)).astype(np.float32))


def _odd_strides(q):
    """A float32 array shaped like q whose byte strides (5 per element) are not multiples of 4."""
    strides = tuple(st // 4 * 5 for st in q.strides)
    raw = np.zeros(sum((n - 1) * st for n, st in zip(q.shape, strides)) + 4, np.uint8)
    return np.ndarray(q.shape, np.float32, raw.data, 0, strides)


@pytest.mark.parametrize("make,exc,fragment", [
    (lambda q, k, v: attn.attention(q, k[:, :, :1].repeat(3, 2), v[:, :, :1].repeat(3, 2)), ValueError,
     "k has 3 heads, which does not divide q's 4"),
    (lambda q, k, v: attn.attention(q, k[..., :7], v), ValueError, "k has head_dim 7, q has 8"),
    (lambda q, k, v: attn.attention(q, k, v[:, :5]), ValueError, "v must have shape"),
    (lambda q, k, v: attn.attention(q[0], k, v), ValueError, "must have 4 dimensions"),
    (lambda q, k, v: attn.attention(q.astype(np.float64), k, v), TypeError, "q must be float32, float16 or bfloat16, got float64"),
    (lambda q, k, v: attn.attention(q, k.astype(np.float16), v), ValueError, "must share a dtype"),
    (lambda q, k, v: attn.attention(q, k, v, softmax_scale=float("nan")), ValueError, "scale"),
    (lambda q, k, v: attn.attention(q, k, v, softmax_scale=-1.0), ValueError, "softmax scale must be in [1e-30, 1e+12], got -1"),
    (lambda q, k, v: attn.attention(q, k, v, window_size=(-2, 0)), ValueError, "window"),
    (lambda q, k, v: attn.attention(q, k, v, softcap=-3.0), ValueError, "softmax softcap must be in [1e-30, 1e+30], got -3 (0 = off)"),
    (lambda q, k, v: attn.attention(q, k, v, dropout_p=1.0), ValueError, "softmax dropout must be in [0, 1), got 1"),
    (lambda q, k, v: attn.attention(q, k, v, attn_mask=np.ones((5, 7), bool)), ValueError, "broadcastable to (B, H, N, M) = (2, 4, 5, 6)"),
    (lambda q, k, v: attn.attention(q, k, v, key_padding_lengths=[6]), ValueError, "one length per batch (2), got 1"),
    (lambda q, k, v: attn.attention(q, k, v, key_padding_lengths=[6, 9]), ValueError, "key_padding_lengths[1] must be in [0, 6], got 9"),
    (lambda q, k, v: attn.attention(q, k, v, alibi_slopes=np.ones(3, np.float32)), ValueError, "alibi_slopes must have H (4) or B*H (8) values, got 3"),
    (lambda q, k, v: attn.attention(q, k, v, alibi_slopes=np.array([1, 1, 1, np.inf], np.float32)), ValueError, "must be finite"),
    (lambda q, k, v: attn.attend(q, k, v, "softmax:casual"), ValueError, "unknown softmax option 'casual'"),
    (lambda q, k, v: attn.attend(q, k, v, "flash"), ValueError, "unknown mechanism 'flash'"),
    (lambda q, k, v: attn.attend(q, k, v, "softmax:score=additive"), ValueError,
     "softmax:score=additive needs params['wq'] of shape (A, D)"),
    (lambda q, k, v: attn.attend(q, k, v, "softmax", wq=np.ones((3, 8), np.float32)), ValueError,
     "params has 'wq', which softmax does not take"),
    (lambda q, k, v: attn.attend(q, k, v, "softmax:score=additive", params={"wq": np.ones((3, 8), np.float32),
                                 "wk": np.ones((3, 7), np.float32), "w": np.ones(3, np.float32)}), ValueError,
     "params['wk'] must have shape (A, D) with D = 8, got (3, 7)"),
    (lambda q, k, v: attn.attend(q, k, v, form="fast"), ValueError, "form must be one of rows, tiled_bf16, tiled, reference"),
    (lambda q, k, v: attn.attend(q, k, v, "softmax:dropout=0.5", form="rows"), ValueError,
     "form 'rows' cannot run softmax:dropout=0.5 for these inputs; forms: rows: dropout; tiled_bf16: q, k, v are float32, float32, float32 (precision auto computes in bf16 when all three are bfloat16); tiled: supported"),
    (lambda q, k, v: attn.attend(q, k, v, isa="sse9"), ValueError, "isa: expected portable (or scalar), avx2 or avx512"),
    (lambda q, k, v: attn.attend(q, k, v, use_reference=True, form="tiled"), ValueError, "conflicts with form='tiled'"),
    (lambda q, k, v: attn.explain(q, k[..., :7], v), ValueError, "k has head_dim 7, q has 8"),
    (lambda q, k, v: attn.attend(q, k, v, "softmax:scale=1,scale=2"), ValueError, "option 'scale' is given twice"),
    # hardening, class 6: the message names the argument the user passed
    (lambda q, k, v: attn.attention(q, k, v, attn_mask=np.ones((5, 6), np.int32)), TypeError,
     "attn_mask must be float32, float16 or bfloat16 (bool for masks), got int32"),
    (lambda q, k, v: attn.attention(q, k[0], v), ValueError, "k must have 4 dimensions (B, N, H, D)"),
    (lambda q, k, v: attn.attention(q, k, v[0]), ValueError, "v must have 4 dimensions"),
    (lambda q, k, v: attn.attention(q.astype(">f4"), k, v), TypeError, "q must be in native (little-endian) byte order"),
    (lambda q, k, v: attn.attention(q.astype(object), k, v), TypeError, "q must be float32, float16 or bfloat16"),
    (lambda q, k, v: attn.attention(_odd_strides(q), k, v), ValueError,
     "not multiples of its element size 4"),
    # integers that do not fit the C++ type are Python's to refuse; every range is C++'s
    (lambda q, k, v: attn.attention(q, k, v, threads=2**70), ValueError,
     "threads must be a 64-bit integer, got 1180591620717411303424"),
    (lambda q, k, v: attn.attention(q, k, v, threads=2**40), ValueError, "threads must fit a 32-bit int, got 1099511627776"),
    (lambda q, k, v: attn.attention(q, k, v, threads=100000), ValueError, "attend: threads must be in [0, 256]"),
    (lambda q, k, v: attn.attention(q, k, v, key_padding_lengths=[2**64, 3]), ValueError,
     "key_padding_lengths[0] must be a 64-bit integer, got 18446744073709551616"),
    (lambda q, k, v: attn.attend(q, k, v, None), TypeError, "mechanism must be a str such as 'softmax:causal', got NoneType"),
    # class 7: no silent coercion
    (lambda q, k, v: attn.attention(q, k, v, window_size=(1.7, 0)), TypeError, "window_size[0] must be an integer, got 1.7"),
    (lambda q, k, v: attn.attention(q, k, v, causal="no"), TypeError, "causal must be True or False, got 'no'"),
    (lambda q, k, v: attn.attention(q, k, v, softmax_scale="0.5"), TypeError, "softmax_scale must be a number"),
    (lambda q, k, v: attn.attention(q, k, v, return_lse=1), TypeError, "return_lse must be True or False"),
    # class 3: finite as a double, infinite as float32
    (lambda q, k, v: attn.attention(q, k, v, softmax_scale=1e39), ValueError, "softmax scale must be in [1e-30, 1e+12], got 1e+39"),
    (lambda q, k, v: attn.attend(q, k, v, layout="nhd"), ValueError, "layout must be 'bnhd' or 'bhnd'"),
    (lambda q, k, v: attn.attention(q, torch.from_numpy(k), v), TypeError, "must all be numpy arrays or all torch tensors"),
    (lambda q, k, v: attn.attention([1.0], k, v), TypeError, "q must be a numpy.ndarray or torch.Tensor"),
])
def test_bad_input_raises_with_message(make, exc, fragment):
    q, k, v = qkv()
    with pytest.raises(exc) as e:
        make(q, k, v)
    assert fragment in str(e.value), str(e.value)


def test_set_isa_rejects_unknown():
    with pytest.raises(ValueError, match=r"set_isa: expected portable \(or scalar\), avx2 or avx512, got 'sse9'"):
        attn.set_isa("sse9")


def test_empty_inputs():
    q, k, v = qkv(N=0)
    assert attn.attention(q, k, v).shape == (2, 0, 4, 8)
    q, k, v = qkv(M=0)
    out, lse = attn.attention(q, k, v, return_lse=True)
    assert (out == 0).all() and np.isneginf(lse).all()


def test_requires_grad_gives_a_differentiable_result():
    """Tensors that require grad go through the custom op (test_torch_ops.py has the values)."""
    q = torch.randn(1, 4, 2, 8, requires_grad=True)
    out = attn.attention(q, q, q)
    assert out.requires_grad and out.grad_fn is not None
    out.sum().backward()
    assert q.grad is not None and q.grad.shape == q.shape
    with torch.no_grad():
        assert not attn.attention(q, q, q).requires_grad


def _child_attention(q):
    return attn.attention(q, q, q, causal=True)


def test_works_in_a_forked_child():
    """Hardening, class 8: OpenMP's pool does not survive fork(); attn runs single-threaded in the child."""
    import multiprocessing
    q = np.random.default_rng(1).standard_normal((1, 300, 4, 32)).astype(np.float32)
    want = attn.attention(q, q, q, causal=True, threads=2)  # the parent's pool exists
    with multiprocessing.get_context("fork").Pool(1) as pool:
        got = pool.apply_async(_child_attention, (q,)).get(timeout=HANG_SECONDS)
    assert np.array_equal(got, want)


def test_every_family_answers_every_output_request_or_refuses_it():
    """return_probs / return_lse / return_final_state on every family: values of the right shape or a
    ValueError naming the request, never a crash (PolaFormer and efficient attention used to read a
    weight matrix their references do not keep)."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 2, 1, 16)).astype(np.float32)
    k = rng.standard_normal((1, 2, 50, 16)).astype(np.float32)
    mechanisms = ["softmax", "softmax:window=9:0,sinks=2", "linear:map=elu", "linear:map=relu,normalize=0",
                  "gau:bias=0", "performer:features=16,seed=2", "polaformer:power=2", "sana", "efficient",
                  "normattn:map=relu,norm=layer", "lsh:buckets=8,rounds=1,chunk=16,seed=1", "linformer:k=8",
                  "dca:chunk=16,local=4,theta=10000", "longformer:window=4:4,global=0",
                  "bigbird:block=8,window=1,global=1,random=1,seed=1"]
    for m in mechanisms:
        for request in ("return_probs", "return_lse", "return_final_state"):
            try:
                res = attn.attend(q, k, k, m, layout="bhnd", **{request: True})
            except ValueError as e:
                assert request.replace("return_", "") in str(e) or "final_state" in str(e) or "probabilit" in str(e), (m, request, e)
                continue
            out, extra = res
            assert out.shape == (1, 2, 1, 16) and np.isfinite(out).all(), (m, request)
            if request == "return_probs":
                assert extra.shape == (1, 2, 1, 50) and np.isfinite(extra).all(), m
            elif request == "return_lse":
                assert extra.shape[:3] == (1, 2, 1), m


@pytest.mark.parametrize("mechanism", ["polaformer:power=3", "gau", "softmax:softcap=20", "linear:map=relu",
                                       "efficient", "qsoftmax", "linformer:k=8"])
def test_a_nan_query_or_inf_key_poisons_exactly_its_rows(mechanism):
    """Hardening: a NaN query makes its row NaN and no other (PolaFormer and
    GAU's non-causal form used to drop it); +inf in a key reaches every row that sees it (softcap's
    tanh used to swallow it). All these mechanisms see every key: every row of the key's heads."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 12, 2, 8)).astype(np.float32) for _ in range(3))
    clean = attn.attend(q, k, v, mechanism)
    bad_q = q.copy()
    bad_q[0, 5, 1, 3] = np.nan
    out = attn.attend(bad_q, k, v, mechanism)
    assert np.isnan(out[0, 5, 1]).all()
    mask = np.ones(out.shape, bool)
    mask[0, 5, 1] = False
    assert np.array_equal(out[mask], clean[mask])
    bad_k = k.copy()
    bad_k[0, 7, 0] = np.inf
    out = attn.attend(q, bad_k, v, mechanism)
    assert np.isnan(out[:, :, 0]).all() and np.array_equal(out[:, :, 1], clean[:, :, 1])
