"""One argument set: attn.attention, attn.attend and attn.linear_attention given torch tensors that
require grad take the arguments of the plain path. The run options (threads, isa, form, precision,
use_reference) reach the custom ops -- threads, isa and precision the backward too, form the forward
only --; return_stats gives tensors without grad; lse carries its gradient; an argument that cannot
apply (return_probs, block_mask, kv_scales, ...) is refused with a message that names it and says
why."""
import pytest
import torch

import attn
from attn import torch_ops
from conftest import literal_attention


def tensors(seed, B=2, N=33, M=40, H=4, Hkv=2, D=16, Dv=12, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, N, H, D, generator=g).to(dtype).requires_grad_()
    k = torch.randn(B, M, Hkv, D, generator=g).to(dtype).requires_grad_()
    v = torch.randn(B, M, Hkv, Dv, generator=g).to(dtype).requires_grad_()
    return q, k, v


def run(fn, xs, seed=100):
    """(out, grads of xs) of fn() for a fixed random dout."""
    for x in xs:
        x.grad = None
    out = fn()
    out = out[0] if isinstance(out, tuple) else out
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.dtype)
    out.backward(dout)
    return out.detach(), [x.grad.clone() for x in xs]


@pytest.fixture
def spy(monkeypatch):
    """The keyword arguments the custom ops hand attn.attend and attn.attend_backward (by call)."""
    calls = {"attend": [], "attend_backward": []}
    for name in calls:
        real = getattr(attn, name)

        def spied(*args, _real=real, _name=name, **kwargs):
            calls[_name].append(kwargs)
            return _real(*args, **kwargs)
        monkeypatch.setattr(attn, name, spied)
    return calls


# ---- (1) threads ----------------------------------------------------------------------------------

def test_threads_gradients_are_bitwise_those_of_one_thread_and_the_default():
    q, k, v = tensors(1)
    one = run(lambda: attn.attention(q, k, v, causal=True, threads=1), (q, k, v))
    two = run(lambda: attn.attention(q, k, v, causal=True, threads=2), (q, k, v))
    default = run(lambda: attn.attention(q, k, v, causal=True), (q, k, v))
    for a, b, c in zip([one[0], *one[1]], [two[0], *two[1]], [default[0], *default[1]]):
        assert torch.equal(a, b) and torch.equal(a, c)
    with torch.no_grad():  # the same bits as the plain path
        assert torch.equal(two[0], attn.attention(q, k, v, causal=True, threads=2))


def test_threads_reach_the_forward_and_the_backward(spy):
    q, k, v = tensors(2)
    run(lambda: attn.attention(q, k, v, causal=True, threads=2), (q, k, v))
    assert spy["attend"][-1]["threads"] == 2 and spy["attend_backward"][-1]["threads"] == 2


def test_threads_with_attend_and_linear_attention():
    q, k, v = tensors(3)
    one = run(lambda: attn.attend(q, k, v, "softmax:causal,window=8:0", threads=1), (q, k, v))
    two = run(lambda: attn.attend(q, k, v, "softmax:causal,window=8:0", threads=2), (q, k, v))
    assert all(torch.equal(a, b) for a, b in zip([one[0], *one[1]], [two[0], *two[1]]))
    q, k, v = tensors(4, N=40)
    one = run(lambda: attn.linear_attention(q, k, v, threads=1, chunk_size=8)[0], (q, k, v))
    two = run(lambda: attn.linear_attention(q, k, v, threads=2, chunk_size=8)[0], (q, k, v))
    assert all(torch.equal(a, b) for a, b in zip([one[0], *one[1]], [two[0], *two[1]]))


def test_a_bad_threads_is_named():
    q, k, v = tensors(5)
    with pytest.raises(TypeError, match="threads must be an integer"):
        attn.attention(q, k, v, threads=1.5)
    with pytest.raises(TypeError, match="threads must be an integer"):
        attn.linear_attention(q, k, q, threads="2")


# ---- (2) isa --------------------------------------------------------------------------------------

def test_isa_portable_gradients_are_close_to_the_default_isa(spy):
    q, k, v = tensors(6)
    portable = run(lambda: attn.attend(q, k, v, "softmax:causal", isa="portable"), (q, k, v))
    assert spy["attend"][-1]["isa"] == "portable" and spy["attend_backward"][-1]["isa"] == "portable"
    default = run(lambda: attn.attend(q, k, v, "softmax:causal"), (q, k, v))
    for a, b in zip([portable[0], *portable[1]], [default[0], *default[1]]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match=r"isa: expected portable \(or scalar\), avx2 or avx512, got 'sse9'"):
        attn.attend(q, k, v, isa="sse9")
    with pytest.raises(TypeError, match="isa must be a str"):
        attn.attend(q, k, v, isa=2)


def test_isa_with_linear_attention():
    q, k, v = tensors(7, N=40)
    portable = run(lambda: attn.linear_attention(q, k, v, isa="portable")[0], (q, k, v))
    default = run(lambda: attn.linear_attention(q, k, v)[0], (q, k, v))
    for a, b in zip([portable[0], *portable[1]], [default[0], *default[1]]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


# ---- (3) precision --------------------------------------------------------------------------------

def test_precision_f32_and_bf16_products_on_bfloat16_inputs(spy):
    q, k, v = tensors(8, D=32, Dv=32, dtype=torch.bfloat16)
    default = run(lambda: attn.attention(q, k, v, causal=True), (q, k, v))
    f32 = run(lambda: attn.attention(q, k, v, causal=True, precision="f32"), (q, k, v))
    assert spy["attend"][-1]["precision"] == "f32" and spy["attend_backward"][-1]["precision"] == "f32"
    assert any(not torch.equal(a, b) for a, b in zip(default[1], f32[1]))  # bf16 products by default
    dout = torch.randn(default[0].shape, generator=torch.Generator().manual_seed(100)).to(torch.bfloat16)
    x64 = [x.detach().double().transpose(1, 2).requires_grad_() for x in (q, k, v)]
    literal_attention(*x64, causal=True)[0].backward(dout.double().transpose(1, 2))
    plain = [x.detach().clone().transpose(1, 2).requires_grad_() for x in (q, k, v)]  # torch in bfloat16
    literal_attention(*plain, causal=True, dtype=torch.bfloat16)[0].backward(dout.transpose(1, 2))
    for name, d, f, w, p in zip("qkv", default[1], f32[1], x64, plain):
        want = w.grad.transpose(1, 2)
        plain_err = (p.grad.transpose(1, 2).double() - want).abs().max().item()
        floor = 2**-8 * max(1.0, want.abs().max().item())  # bfloat16's rounding of the largest gradient
        for how, got in (("auto", d), ("f32", f)):
            err = (got.double() - want).abs().max().item()
            assert err <= 2 * plain_err + floor, f"d{name} ({how}): {err} vs bfloat16 torch {plain_err}"


def test_precision_reaches_the_backward_on_float32_inputs(spy):
    q, k, v = tensors(9)
    f32 = run(lambda: attn.attend(q, k, v, "softmax", precision="f32"), (q, k, v))
    bf16 = run(lambda: attn.attend(q, k, v, "softmax", precision="bf16"), (q, k, v))
    assert spy["attend_backward"][-1]["precision"] == "bf16"
    assert any(not torch.equal(a, b) for a, b in zip(f32[1], bf16[1]))
    with pytest.raises(ValueError, match="precision: expected auto, f32 or bf16, got 'fp8'"):
        attn.attend(q, k, v, precision="fp8")
    q, k, v = tensors(10, N=40)
    with pytest.raises(ValueError, match="precision: linear computes in float32 only"):
        attn.linear_attention(q, k, v, precision="bf16")


# ---- (4) form -------------------------------------------------------------------------------------

@pytest.mark.parametrize("form", ["tiled", "reference"])
def test_form_applies_to_the_forward_only(spy, form):
    q, k, v = tensors(11)
    got = run(lambda: attn.attend(q, k, v, "softmax:causal", form=form), (q, k, v))
    assert spy["attend"][-1]["form"] == form
    assert spy["attend_backward"][-1].get("form") is None  # the backward picks its own form
    want = run(lambda: attn.attend(q, k, v, "softmax:causal"), (q, k, v))
    for a, b in zip([got[0], *got[1]], [want[0], *want[1]]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_use_reference_is_the_reference_form(spy):
    q, k, v = tensors(12)
    run(lambda: attn.attend(q, k, v, use_reference=True), (q, k, v))
    assert spy["attend"][-1]["form"] == "reference"
    with pytest.raises(ValueError, match="use_reference=True conflicts with form='tiled'"):
        attn.attend(q, k, v, use_reference=True, form="tiled")


def test_an_unknown_form_is_a_value_error_naming_form():
    q, k, v = tensors(13)
    with pytest.raises(ValueError, match=r"form must be one of .* got 'fast'"):
        attn.attend(q, k, v, "softmax:causal", form="fast")
    with pytest.raises(TypeError, match="form must be a str"):
        attn.attend(q, k, v, form=3)
    q, k, v = tensors(14, N=40)
    assert run(lambda: attn.linear_attention(q, k, v, form="chunked", chunk_size=8)[0], (q, k, v))[1][0].shape == q.shape
    with pytest.raises(ValueError, match=r"form must be one of .* got 'fast'"):
        attn.linear_attention(q, k, v, form="fast")


# ---- (5) return_stats and return_lse --------------------------------------------------------------

def test_return_stats_equal_the_plain_calls_and_carry_no_gradient():
    q, k, v = tensors(15)
    out, stats = attn.attention(q, k, v, causal=True, return_stats=True, stats_topk=3, threads=2)
    assert isinstance(stats, attn.Stats) and out.requires_grad
    with torch.no_grad():
        plain_out, plain = attn.attention(q, k, v, causal=True, return_stats=True, stats_topk=3, threads=2)
    assert torch.equal(out.detach(), plain_out)
    for name, a, b in zip(attn.Stats._fields, stats, plain):
        assert not a.requires_grad and a.grad_fn is None, name
        assert torch.equal(a.nan_to_num(-7), b.nan_to_num(-7)), name
    got = run(lambda: attn.attention(q, k, v, causal=True, return_stats=True), (q, k, v))
    want = run(lambda: attn.attention(q, k, v, causal=True), (q, k, v))
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1]))


def test_return_lse_and_stats_with_attend_in_attends_order():
    q, k, v = tensors(16)
    out, lse, stats = attn.attend(q, k, v, "softmax:causal", return_lse=True, return_stats=True, precision="f32")
    assert lse.requires_grad and not stats.entropy.requires_grad
    with torch.no_grad():
        _, plain_lse, plain = attn.attend(q, k, v, "softmax:causal", return_lse=True, return_stats=True,
                                          precision="f32")
    assert torch.equal(lse.detach(), plain_lse)
    for a, b in zip(stats, plain):
        assert torch.equal(a.nan_to_num(-7), b.nan_to_num(-7))
    (out.sum() + lse.sum()).backward()  # lse carries its gradient (dlse)
    assert all(x.grad is not None for x in (q, k, v))
    with pytest.raises(ValueError, match="stats_topk"):
        attn.attend(q, k, v, return_stats=True, stats_topk=0)


def test_return_final_state_runs_the_linear_op():
    q, k, v = tensors(17, N=40)
    s0 = torch.rand(2, 4, 16, 13, generator=torch.Generator().manual_seed(18)).requires_grad_()
    xs = (q, k, v, s0)

    def with_state(fn):
        for x in xs:
            x.grad = None
        o, state = fn()
        (o.square().sum() + state.sum()).backward()
        return [o.detach(), state.detach()] + [x.grad.clone() for x in xs]
    got = with_state(lambda: attn.attend(q, k, v, "linear:map=elu,causal,chunk=8", params={"initial_state": s0},
                                         return_final_state=True, threads=2))
    want = with_state(lambda: attn.linear_attention(q, k, v, initial_state=s0, chunk_size=8, output_final_state=True))
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    o, state, stats = attn.attend(q, k, v, "linear:causal", return_final_state=True, return_stats=True)
    assert state.requires_grad and not stats.sparsity.requires_grad


# ---- (6) what is still refused says which argument and why ----------------------------------------

def test_what_cannot_apply_is_refused_by_name_with_the_reason():
    q, k, v = tensors(19)
    with pytest.raises(ValueError, match=r"^return_probs does not apply to tensors that require grad: the weights "
                                         r"have no gradient here.*attn\.attend\(\.\.\.\) under torch\.no_grad\(\)"):
        attn.attention(q, k, v, return_probs=True)
    with pytest.raises(ValueError, match=r"^block_mask does not apply to tensors that require grad: .* no block mask"):
        attn.attend(q, k, v, block_mask=torch.ones(1, 1, 1, 1, dtype=torch.bool))
    k8, ks = attn.quantize_rows(k.detach())
    v8, vs = attn.quantize_rows(v.detach())
    with pytest.raises(ValueError, match=r"kv_scales \(int8 k and v rows\) have no backward pass"):
        attn.attend(q, k8, v8, kv_scales=(ks, vs))
    with pytest.raises(ValueError, match=r"requires grad, but attn has no gradient for a float attn_mask"):
        attn.attend(q, k, v, attn_mask=torch.zeros(33, 40, requires_grad=True))
    with pytest.raises(ValueError, match=r"return_final_state does not apply to tensors that require grad with "
                                         r"params coefficients, power: .* takes initial_state and decay only"):
        attn.attend(q, k, v, "polaformer", params={"power": torch.full((16,), 2.0), "coefficients": torch.ones(12)},
                    return_final_state=True)
    with pytest.raises(ValueError, match="has no recurrent state"):  # a family without state, as without grad
        attn.attend(q, k, v, return_final_state=True)
    with pytest.raises(ValueError, match="linear has no log-sum-exp"):
        attn.attend(q, k, v, "linear", return_lse=True)
    with torch.no_grad():  # no gradient wanted: every option of the plain path
        assert attn.attention(q, k, v, return_probs=True)[1].shape == (2, 4, 33, 40)


# ---- (7) the ops' schemas: opcheck and torch.compile ----------------------------------------------

def test_opcheck_with_the_run_options():
    q, k, v = (x.detach().requires_grad_() for x in tensors(20, N=9, M=13, D=8, Dv=6))
    run_args = (2, "tiled", "portable", "f32")
    torch.library.opcheck(torch.ops.attn.attend.default,
                          (q, k, v, "softmax:causal", "bnhd", None, [], None, "", None, *run_args))
    out, lse = torch.ops.attn.attend(q, k, v, "softmax:causal", "bnhd", None, [], None, "", None, *run_args)
    torch.library.opcheck(torch.ops.attn.attend_backward.default,
                          (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(),
                           "softmax:causal", "bnhd", None, [], None, torch.randn_like(lse), "", None, 2, "portable",
                           "f32"))
    torch.library.opcheck(torch.ops.attn.attend_stats.default,
                          (q.detach(), k.detach(), v.detach(), "softmax:causal", "bnhd", None, [], None, "", None, 3,
                           *run_args))
    q, k, v = (x.detach() for x in tensors(21, N=11, M=11, D=8, Dv=6))
    torch.library.opcheck(torch.ops.attn.linear_attention.default,
                          (q, k, v, "linear:causal,chunk=4", "bnhd", None, None, [], 2, "chunked", "portable", "f32"))
    out, state = torch.ops.attn.linear_attention(q, k, v, "linear:causal,chunk=4", "bnhd", None, None, [], 2)
    torch.library.opcheck(torch.ops.attn.linear_attention_backward.default,
                          (torch.randn_like(out), torch.randn_like(state), q, k, v, out, "linear:causal,chunk=4",
                           "bnhd", None, None, [], 2, "portable", "f32"))


def test_torch_compile_fullgraph_with_the_run_options_lse_and_stats():
    q, k, v = tensors(22, N=9, M=13, D=8, Dv=6)

    def loss(q, k, v):
        out, lse, stats = attn.attention(q, k, v, causal=True, threads=2, precision="f32", return_lse=True,
                                         return_stats=True, stats_topk=2)
        tiled = attn.attend(q, k, v, "softmax:causal", threads=2, form="tiled", isa="portable")
        o, state = attn.linear_attention(q[:, :9], k[:, :9], v[:, :9], threads=2, isa="portable", chunk_size=4,
                                         output_final_state=True)
        return (out ** 2).sum() + lse.sum() + tiled.sum() + (o ** 2).sum() + state.sum(), stats

    compiled = torch.compile(loss, fullgraph=True, backend="aot_eager")
    got, got_stats = compiled(q, k, v)
    got.backward()
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    want, want_stats = loss(q, k, v)
    want.backward()
    assert torch.equal(got, want)
    assert all(torch.equal(a.nan_to_num(-7), b.nan_to_num(-7)) for a, b in zip(got_stats, want_stats))
    for g, x in zip(grads, (q, k, v)):
        assert torch.equal(g, x.grad)


def test_the_op_wrappers_take_the_run_options():
    """torch_ops.attend / linear_attention / attend_stats: the Python face of the ops."""
    q, k, v = tensors(23, N=9, M=13, D=8, Dv=6)
    out, lse = torch_ops.attend(q, k, v, "softmax", "bnhd", threads=2, form="tiled", isa="portable", precision="f32")
    assert out.requires_grad and lse.shape == (2, 4, 9)
    stats = torch_ops.attend_stats(q, k, v, "softmax", "bnhd", stats_topk=2, threads=2)
    assert len(stats) == 4 and not any(s.requires_grad for s in stats)


def test_additive_weights_are_params_with_their_gradients():
    """additive_weights is params for score=additive: the forward runs, and the backward gives q, k, v
    and the weights that require grad their gradients, the same as passed through params."""
    q, k, v = tensors(24, N=9, M=13, D=8, Dv=6)
    g = torch.Generator().manual_seed(25)
    weights = [torch.randn(3, 8, generator=g), torch.randn(3, 8, generator=g), torch.randn(3, generator=g)]
    weights = [w.requires_grad_() for w in weights]
    out = attn.attend(q, k, v, "softmax:score=additive", additive_weights=weights)
    with torch.no_grad():
        assert torch.equal(out.detach(), attn.attend(q, k, v, "softmax:score=additive", additive_weights=weights))
    out.sum().backward()
    first = [x.grad.clone() for x in (q, k, v, *weights)]
    for x in (q, k, v, *weights):
        x.grad = None
    attn.attend(q, k, v, "softmax:score=additive", params=dict(zip(("wq", "wk", "w"), weights))).sum().backward()
    for a, x in zip(first, (q, k, v, *weights)):
        assert torch.equal(a, x.grad)
    with pytest.raises(ValueError, match="wq is given both in additive_weights and in params"):
        attn.attend(q, k, v, "softmax:score=additive", additive_weights=weights, wq=weights[0])
