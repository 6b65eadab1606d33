"""Gradients of the softmax family's cosine and additive scores (and the additive score's learned
params wq, wk, w) against float64 torch autograd of a plain torch implementation written here (no
code shared with the kernels); the custom ops pass torch.library.opcheck and trace under
torch.compile(fullgraph=True)."""
import math

import numpy as np
import pytest
import torch

import attn
from attn import torch_ops  # noqa: F401  (registers torch.ops.attn.*)


def plain_scores(q, k, v, score, causal=False, scale=None, softcap=0.0, kv_len=None, wq=None, wk=None, w=None):
    """out (B, H, N, Dv) of softmax attention with cosine or additive scores, bhnd, any float dtype:
    cosine q.k / (|q| |k|) (norms clamped as attn's: sqrt(max(x.x, 1e-30))), additive
    w . tanh(Wq q + Wk k); scale (None: 1/sqrt(D) for cosine, 1 for additive), softcap, causal
    (bottom-right), key padding."""
    B, H, N, D = q.shape
    M = k.shape[2]
    group = H // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    if score == "cosine":
        nq = q.pow(2).sum(-1, keepdim=True).clamp(min=1e-30).sqrt()
        nk = k.pow(2).sum(-1, keepdim=True).clamp(min=1e-30).sqrt()
        r = (q / nq) @ (k / nk).transpose(-1, -2)
        s = r * (1 / math.sqrt(D) if scale is None else scale)
    else:
        u = (q @ wq.T)[:, :, :, None, :] + (k @ wk.T)[:, :, None, :, :]  # (B, H, N, M, A)
        s = torch.tanh(u) @ w * (1.0 if scale is None else scale)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    visible = torch.ones(B, 1, N, M, dtype=torch.bool)
    if causal:
        visible &= (torch.arange(M)[None, :] <= torch.arange(N)[:, None] + M - N)[None, None]
    if kv_len is not None:
        visible &= (torch.arange(M)[None, :] < torch.tensor(kv_len)[:, None])[:, None, None, :]
    s = s.masked_fill(~visible, float("-inf"))
    return torch.softmax(s, -1) @ v


def tensors(seed, B=2, H=4, Hkv=2, N=19, M=23, D=8, Dv=6, A=5):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*shape, generator=g, dtype=torch.float64)
               for shape in ((B, H, N, D), (B, Hkv, M, D), (B, Hkv, M, Dv)))
    weights = (0.3 * torch.randn(A, D, generator=g, dtype=torch.float64),
               0.3 * torch.randn(A, D, generator=g, dtype=torch.float64),
               0.9 * torch.randn(A, generator=g, dtype=torch.float64))
    dout = torch.randn(B, H, N, Dv, generator=g, dtype=torch.float64)
    return (q, k, v), weights, dout


CASES = [
    ("softmax:score=cosine", dict(score="cosine"), {}),
    ("softmax:score=cosine,causal,scale=4", dict(score="cosine", causal=True, scale=4.0), {}),
    ("softmax:score=cosine,softcap=2", dict(score="cosine", softcap=2.0), {}),
    ("softmax:score=cosine", dict(score="cosine", kv_len=[23, 9]), dict(key_padding_lengths=[23, 9])),
    ("softmax:score=additive", dict(score="additive"), {}),
    ("softmax:score=additive,causal,scale=0.5", dict(score="additive", causal=True, scale=0.5), {}),
    ("softmax:score=additive,softcap=3", dict(score="additive", softcap=3.0), {}),
    ("softmax:score=additive", dict(score="additive", kv_len=[23, 9]), dict(key_padding_lengths=[23, 9])),
]


def close(got, want, name, rel=1e-5):
    err = (got.double() - want).abs().max().item()
    assert err <= rel * max(1.0, want.abs().max().item()), f"{name}: max error {err:.3g}"


@pytest.mark.parametrize("mechanism,plain_kw,attn_kw", CASES, ids=[c[0] + str(i) for i, c in enumerate(CASES)])
def test_gradients_equal_float64_autograd_of_a_plain_implementation(mechanism, plain_kw, attn_kw):
    (q, k, v), weights, dout = tensors(1)
    additive = plain_kw["score"] == "additive"
    x64 = [x.clone().requires_grad_() for x in (q, k, v, *(weights if additive else ()))]
    names = ["q", "k", "v"] + (["wq", "wk", "w"] if additive else [])
    out64 = plain_scores(*x64[:3], **plain_kw, **dict(zip(("wq", "wk", "w"), x64[3:])))
    out64.backward(dout)
    leaves = [x.float().detach().requires_grad_() for x in x64]
    params = dict(zip(("wq", "wk", "w"), leaves[3:])) if additive else None
    out = attn.attend(*leaves[:3], mechanism, layout="bhnd", params=params, **attn_kw)
    close(out.detach(), out64.detach(), "out")
    out.backward(dout.float())
    for name, got, want in zip(names, leaves, x64):
        assert got.grad is not None and got.grad.dtype == torch.float32, name
        close(got.grad, want.grad, "d" + name)
    if "key_padding_lengths" in attn_kw:
        assert (leaves[1].grad[1, :, 9:] == 0).all() and (leaves[2].grad[1, :, 9:] == 0).all()


def test_numpy_callers_get_the_params_gradients_from_attend_backward():
    (q, k, v), (wq, wk, w), dout = tensors(2)
    args = [x.float().numpy() for x in (q, k, v)]
    params = {"wq": wq.float().numpy(), "wk": wk.float().numpy(), "w": w.float().numpy()}
    out, lse = attn.attend(*args, "softmax:score=additive", layout="bhnd", params=params, return_lse=True)
    dq, dk, dv, dparams = attn.attend_backward(dout.float().numpy(), *args, out, lse, "softmax:score=additive",
                                               layout="bhnd", params=params)
    x64 = [x.clone().requires_grad_() for x in (q, k, v, wq, wk, w)]
    plain_scores(*x64[:3], score="additive", wq=x64[3], wk=x64[4], w=x64[5]).backward(dout)
    for name, got, want in zip(("dq", "dk", "dv"), (dq, dk, dv), x64[:3]):
        close(torch.from_numpy(got), want.grad, name)
    assert sorted(dparams) == ["w", "wk", "wq"]
    for name, want in zip(("wq", "wk", "w"), x64[3:]):
        assert dparams[name].shape == tuple(want.shape), name
        close(torch.from_numpy(dparams[name]), want.grad, "d" + name)


def test_forms_agree_and_the_threads_change_no_bit():
    """the scores form (the walk's choice) against the float64 reference form, and on 1 and 3 threads."""
    (q, k, v), (wq, wk, w), dout = tensors(3, N=150, M=70)
    args = [x.float() for x in (q, k, v)]
    params = {"wq": wq.float(), "wk": wk.float(), "w": w.float()}
    for mech, p in (("softmax:score=cosine,causal", None), ("softmax:score=additive", params)):
        out, lse = attn.attend(*args, mech, layout="bhnd", params=p, return_lse=True)
        runs = [attn.attend_backward(dout.float(), *args, out, lse, mech, layout="bhnd", params=p, threads=t, form=f)
                for t, f in ((1, None), (3, None), (0, "reference"))]
        for a, b in zip(runs[0][:3], runs[1][:3]):
            assert torch.equal(a, b), mech
        for a, b in zip(runs[0][:3], runs[2][:3]):
            assert (a - b).abs().max().item() <= 1e-4 * max(1.0, b.abs().max().item()), mech
        if p:
            for name in params:
                assert torch.equal(runs[0][3][name], runs[1][3][name]), name


def test_opcheck_with_the_additive_params():
    (q, k, v), (wq, wk, w), dout = tensors(4, N=7, M=9)
    q, k, v, dout, wq, wk, w = (x.float() for x in (q, k, v, dout, wq, wk, w))
    args = (q, k, v, "softmax:score=additive", "bhnd", None, [], None, "w,wk,wq", [w, wk, wq])
    torch.library.opcheck(torch.ops.attn.attend.default, args)
    out, lse = torch.ops.attn.attend(*args)
    bargs = (dout, q, k, v, out, lse, "softmax:score=additive", "bhnd", None, [], None, None, "w,wk,wq", [w, wk, wq])
    torch.library.opcheck(torch.ops.attn.attend_backward.default, bargs)
    dq, dk, dv, (dw, dwk, dwq) = torch.ops.attn.attend_backward(*bargs)
    assert dw.shape == w.shape and dwq.shape == wq.shape and dwk.shape == wk.shape
    cargs = (q, k, v, "softmax:score=cosine,causal", "bhnd", None, [], None)
    torch.library.opcheck(torch.ops.attn.attend.default, cargs)


@pytest.mark.parametrize("mechanism", ["softmax:score=cosine,causal", "softmax:score=additive"])
def test_compile_fullgraph_backward_gives_the_eager_gradients(mechanism):
    (q, k, v), weights, _ = tensors(5)
    additive = "additive" in mechanism

    def loss(q, k, v, wq, wk, w):
        params = {"wq": wq, "wk": wk, "w": w} if additive else None
        return (attn.attend(q, k, v, mechanism, layout="bhnd", params=params) ** 2).sum()

    grads = []
    for fn in (torch.compile(loss, fullgraph=True, backend="aot_eager"), loss):
        leaves = [x.float().detach().requires_grad_(additive or i < 3) for i, x in enumerate((q, k, v, *weights))]
        fn(*leaves).backward()
        grads.append([x.grad for x in leaves])
    for a, b in zip(*grads):
        assert (a is None and b is None) or torch.equal(a, b)


# ---- packed sequences of the linear family (cu_seqlens) ------------------------------------------

PHI = {"elu": lambda x: torch.where(x > 0, x + 1, torch.exp(x)), "relu": torch.relu, "identity": lambda x: x}


def plain_linear_packed(q, k, v, cu, feature_map="elu", causal=True, normalize=True, decay=1.0, initial_state=None):
    """o (1, T, H, Dv) and the final states (S, H, D, C) of packed sequences (bnhd, batch 1), token by
    token through the state, which starts afresh (from initial_state[s], or zeros) at each sequence."""
    H, D, Dv = q.shape[2], q.shape[3], v.shape[3]
    group = H // k.shape[2]
    phi = PHI[feature_map]
    outs, finals = [], []
    for s, (a, b) in enumerate(zip(cu, cu[1:])):
        fq = phi(q[0, a:b])
        fk = phi(k[0, a:b].repeat_interleave(group, 1))
        u = v[0, a:b].repeat_interleave(group, 1)
        if normalize:
            u = torch.cat([u, torch.ones_like(u[..., :1])], -1)
        S = initial_state[s] if initial_state is not None else q.new_zeros(H, D, u.shape[-1])
        rows = []
        if causal:
            for t in range(b - a):
                S = decay * S + fk[t, :, :, None] * u[t, :, None, :]
                rows.append(torch.einsum("hd,hdc->hc", fq[t], S))
        else:
            S = S + torch.einsum("nhd,nhc->hdc", fk, u)
            rows = [torch.einsum("hd,hdc->hc", fq[t], S) for t in range(b - a)]
        if rows:
            y = torch.stack(rows)
            if normalize:
                den = y[..., -1:]
                y = y[..., :-1] / torch.where(den != 0, den, torch.ones_like(den))
            outs.append(y)
        finals.append(S)
    return torch.cat(outs)[None], torch.stack(finals)


def packed_tensors(seed, cu, H=4, Hkv=2, D=8, Dv=6, normalize=True):
    g = torch.Generator().manual_seed(seed)
    T, S = cu[-1], len(cu) - 1
    q, k = (torch.randn(1, T, h, D, generator=g, dtype=torch.float64) for h in (H, Hkv))
    v = torch.randn(1, T, Hkv, Dv, generator=g, dtype=torch.float64)
    s0 = torch.rand(S, H, D, Dv + normalize, generator=g, dtype=torch.float64) + 0.1
    do = torch.randn(1, T, H, Dv, generator=g, dtype=torch.float64)
    dstate = torch.randn(S, H, D, Dv + normalize, generator=g, dtype=torch.float64)
    return q, k, v, s0, do, dstate


PACKED = [
    (dict(feature_map="elu", causal=True, chunk_size=4), [0, 7, 7, 20, 23]),  # an empty sequence
    (dict(feature_map="identity", causal=True, normalize=False, decay=0.8, chunk_size=3), [0, 5, 16]),  # retention
    (dict(feature_map="relu", causal=False), [0, 9, 10, 18]),
]


@pytest.mark.parametrize("kw,cu", PACKED, ids=["elu", "retention", "noncausal"])
@pytest.mark.parametrize("with_state", [False, True])
def test_packed_gradients_equal_float64_autograd_of_a_plain_recurrence(kw, cu, with_state):
    normalize = kw.get("normalize", True)
    q, k, v, s0, do, dstate = packed_tensors(6, cu, normalize=normalize)
    x64 = [x.clone().requires_grad_() for x in (q, k, v, s0)]
    lit = {key: val for key, val in kw.items() if key != "chunk_size"}
    o64, st64 = plain_linear_packed(*x64[:3], cu, initial_state=x64[3] if with_state else None, **lit)
    ((o64 * do).sum() + (st64 * dstate).sum()).backward()
    leaves = [x.float().detach().requires_grad_() for x in x64]
    o, state = attn.linear_attention(*leaves[:3], cu_seqlens=cu, initial_state=leaves[3] if with_state else None,
                                     output_final_state=True, **kw)
    assert state.shape == (len(cu) - 1, 4, 8, 6 + normalize)
    close(o.detach(), o64.detach(), "o")
    close(state.detach(), st64.detach(), "final_state")
    ((o * do.float()).sum() + (state * dstate.float()).sum()).backward()
    for name, got, want in zip(("q", "k", "v", "initial_state"), leaves, x64):
        if name == "initial_state" and not with_state:
            assert got.grad is None
            continue
        close(got.grad, want.grad, "d" + name)


def test_a_packed_batch_has_each_sequences_gradients_alone():
    """bitwise: the packed call's gradients, sequence by sequence, are those of the sequence run alone
    (its own call on the same memory), the state reset at every boundary."""
    cu = [0, 11, 11, 40, 47]
    q, k, v, s0, do, dstate = (x.float() for x in packed_tensors(7, cu))
    leaves = [x.clone().requires_grad_() for x in (q, k, v, s0)]
    o, state = attn.linear_attention(*leaves[:3], cu_seqlens=cu, initial_state=leaves[3], output_final_state=True,
                                     chunk_size=8)
    ((o * do).sum() + (state * dstate).sum()).backward()
    for s, (a, b) in enumerate(zip(cu, cu[1:])):
        alone = [x.detach()[:, a:b].requires_grad_() for x in (q, k, v)] + [s0[s:s + 1].clone().requires_grad_()]
        if a == b:  # nothing runs: the initial state is the final state
            assert torch.equal(leaves[3].grad[s], dstate[s])
            continue
        oa, sa = attn.linear_attention(*alone[:3], initial_state=alone[3], output_final_state=True, chunk_size=8)
        assert torch.equal(oa, o[:, a:b].detach()) and torch.equal(sa[0], state[s].detach())
        ((oa * do[:, a:b]).sum() + (sa * dstate[s:s + 1]).sum()).backward()
        for x, y in zip(alone[:3], leaves[:3]):
            assert torch.equal(x.grad, y.grad[:, a:b]), s
        assert torch.equal(alone[3].grad[0], leaves[3].grad[s]), s


def test_packed_numpy_calls_and_bad_input():
    cu = [0, 4, 9]
    q, k, v, s0, _, _ = (x.float().numpy() for x in packed_tensors(8, cu))
    o, state = attn.linear_attention(q, k, v, cu_seqlens=cu, initial_state=s0, output_final_state=True)
    assert isinstance(o, np.ndarray) and o.shape == (1, 9, 4, 6) and state.shape == (2, 4, 8, 7)
    ob, _ = attn.linear_attention(q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3),
                                  cu_seqlens=cu, initial_state=s0, layout="bhnd")
    assert np.array_equal(ob.transpose(0, 2, 1, 3), o)
    with pytest.raises(ValueError, match="cu_seqlens_q must end at the packed tokens 9, got 8"):
        attn.linear_attention(q, k, v, cu_seqlens=[0, 4, 8])
    with pytest.raises(ValueError, match=r"initial_state must hold one state per sequence, \(2, H, F"):
        attn.linear_attention(q, k, v, cu_seqlens=cu, initial_state=s0[:1])
    with pytest.raises(ValueError, match="not both"):
        attn.linear_attention(q, k, v, cu_seqlens=cu, key_padding_lengths=[9])
    with pytest.raises(ValueError, match="one packed batch"):
        attn.linear_attention(np.concatenate([q, q]), k, v, cu_seqlens=cu)


def test_packed_ops_pass_opcheck_and_compile_fullgraph():
    cu = [0, 6, 6, 13]
    q, k, v, s0, do, dstate = (x.float() for x in packed_tensors(9, cu))
    text = "linear:map=elu,causal,chunk=4"
    args = (q, k, v, text, "bnhd", s0, None, [], 0, None, None, None, cu)
    torch.library.opcheck(torch.ops.attn.linear_attention.default, args)
    o, _ = torch.ops.attn.linear_attention(*args)
    torch.library.opcheck(torch.ops.attn.linear_attention_backward.default,
                          (do, dstate, q, k, v, o, text, "bnhd", s0, None, [], 0, None, None, cu))

    def loss(q, k, v, s0):
        o, state = attn.linear_attention(q, k, v, cu_seqlens=cu, initial_state=s0, output_final_state=True,
                                         chunk_size=4)
        return (o * do).sum() + (state * dstate).sum()

    grads = []
    for fn in (torch.compile(loss, fullgraph=True, backend="aot_eager"), loss):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v, s0)]
        fn(*leaves).backward()
        grads.append([x.grad for x in leaves])
    for a, b in zip(*grads):
        assert torch.equal(a, b)
