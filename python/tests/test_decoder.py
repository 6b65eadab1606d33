"""attn.Decoder against a literal PyTorch implementation of the same blocks with the same weights.

The weight files are written here with a small safetensors writer of our own (so the reader is
checked against a file it did not write), with random weights, and read back by attn. The torch
model is written out plainly in float64: RMSNorm, rotate-half RoPE, GQA by repeating K/V heads,
a causal (optionally windowed, with sinks) softmax, SwiGLU; MiniMax's lightning layers as the
quadratic form o_i = sum_{j<=i} lambda^(i-j) (q_i . k_j) v_j after silu, RMS-normalised, gated.
"""
import json
import math
import struct

import numpy as np
import pytest

import attn

torch = pytest.importorskip("torch")

LIGHTNING = "linear:map=identity,causal,normalize=0,chunk=256"


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name, array in tensors.items():
        raw = np.ascontiguousarray(array).tobytes()
        dtype = {np.dtype(np.float32): "F32", np.dtype(np.uint16): "BF16"}[array.dtype]
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def to_bf16_bits(x):
    """float32 -> bfloat16 bit patterns (round to nearest even) and the float64 values they hold."""
    bits = x.astype(np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return rounded, (rounded.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def make_model(tmp_path, layers, *, bf16=False, tied=False, seed=0, window=None):
    rng = np.random.default_rng(seed)
    cfg = dict(vocab_size=61, dim=32, hidden_dim=48, heads=4, kv_heads=2, head_dim=8, max_seq_len=128,
               rope_theta=1000.0, rope_style="half", norm_eps=1e-5, tied_embeddings=tied, layers=layers)
    hd, H = cfg["head_dim"], cfg["heads"]
    tensors, values = {}, {}

    def add(name, shape, scale, matrix=True):
        x = (rng.standard_normal(shape) * scale).astype(np.float32)
        if not matrix:
            x = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        if bf16 and matrix:
            tensors[name], values[name] = to_bf16_bits(x)
        else:
            tensors[name], values[name] = x, x.astype(np.float64)

    add("model.embed_tokens.weight", (cfg["vocab_size"], cfg["dim"]), 1.0)
    for i, layer in enumerate(layers):
        p = f"model.layers.{i}."
        kv = (H if layer["lightning"] else cfg["kv_heads"]) * hd
        add(p + "input_layernorm.weight", (cfg["dim"],), 0, matrix=False)
        add(p + "self_attn.q_proj.weight", (H * hd, cfg["dim"]), cfg["dim"] ** -0.5)
        add(p + "self_attn.k_proj.weight", (kv, cfg["dim"]), cfg["dim"] ** -0.5)
        add(p + "self_attn.v_proj.weight", (kv, cfg["dim"]), cfg["dim"] ** -0.5)
        add(p + "self_attn.o_proj.weight", (cfg["dim"], H * hd), (H * hd) ** -0.5)
        if layer["lightning"]:
            add(p + "self_attn.norm.weight", (H * hd,), 0, matrix=False)
            add(p + "self_attn.output_gate.weight", (H * hd, cfg["dim"]), cfg["dim"] ** -0.5)
        add(p + "post_attention_layernorm.weight", (cfg["dim"],), 0, matrix=False)
        add(p + "mlp.gate_proj.weight", (cfg["hidden_dim"], cfg["dim"]), cfg["dim"] ** -0.5)
        add(p + "mlp.up_proj.weight", (cfg["hidden_dim"], cfg["dim"]), cfg["dim"] ** -0.5)
        add(p + "mlp.down_proj.weight", (cfg["dim"], cfg["hidden_dim"]), cfg["hidden_dim"] ** -0.5)
    add("model.norm.weight", (cfg["dim"],), 0, matrix=False)
    if not tied:
        add("lm_head.weight", (cfg["vocab_size"], cfg["dim"]), cfg["dim"] ** -0.5)
    path = tmp_path / "model.safetensors"
    write_safetensors(path, tensors, {"attn.decoder": json.dumps(cfg)})
    return path, cfg, {k: torch.from_numpy(v) for k, v in values.items()}


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, theta):  # x (H, N, hd), rotate-half, positions 0..N-1
    hd = x.shape[-1]
    inv = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.arange(x.shape[1], dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    rot = torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1)
    return x * cos + rot * sin


def lightning_decays(H, layer, L):
    s = [2 ** (-8 * h / H) * (1 - layer / (L - 1 + 1e-5) + 1e-5) for h in range(1, H + 1)]
    return torch.tensor([math.exp(-x) for x in s], dtype=torch.float32).double()  # attn keeps them in float32


def torch_logits(cfg, w, tokens, window=None, sinks=0):
    H, Hkv, hd, eps = cfg["heads"], cfg["kv_heads"], cfg["head_dim"], cfg["norm_eps"]
    N, L = len(tokens), len(cfg["layers"])
    x = w["model.embed_tokens.weight"][torch.tensor(tokens)]
    i = torch.arange(N)[:, None]
    j = torch.arange(N)[None, :]
    visible = j <= i
    if window is not None:
        visible &= (j >= i - window) | (j < sinks)
    for li, layer in enumerate(cfg["layers"]):
        p = f"model.layers.{li}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(N, H, hd).transpose(0, 1)
        kvh = H if layer["lightning"] else Hkv
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(N, kvh, hd).transpose(0, 1)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(N, kvh, hd).transpose(0, 1)
        if layer["lightning"]:
            q, k, v = torch.nn.functional.silu(q), torch.nn.functional.silu(k), torch.nn.functional.silu(v)
            lam = lightning_decays(H, li, L)
            dist = (i - j).clamp(min=0).double()
            weights = (q @ k.transpose(1, 2)) * lam[:, None, None] ** dist * (j <= i)
            o = (weights @ v).transpose(0, 1).reshape(N, H * hd)
            o = rms_norm(o, w[p + "self_attn.norm.weight"], eps)
            o = o * torch.sigmoid(h @ w[p + "self_attn.output_gate.weight"].T)
        else:
            q, k = rope(q, cfg["rope_theta"]), rope(k, cfg["rope_theta"])
            k, v = k.repeat_interleave(H // kvh, 0), v.repeat_interleave(H // kvh, 0)
            s = (q @ k.transpose(1, 2)) / math.sqrt(hd)
            s = s.masked_fill(~visible, float("-inf"))
            o = (torch.softmax(s, -1) @ v).transpose(0, 1).reshape(N, H * hd)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
        x = x + g @ w[p + "mlp.down_proj.weight"].T
    out = w["model.embed_tokens.weight"] if cfg["tied_embeddings"] else w["lm_head.weight"]
    return (rms_norm(x, w["model.norm.weight"], eps) @ out.T).numpy()


def assert_close(ours, ref, tol=2e-5):
    scale = max(1.0, float(np.abs(ref).max()))
    err = float(np.abs(ours.astype(np.float64) - ref).max())
    assert err <= tol * scale, f"max |diff| {err:.3g} for logits up to {scale:.3g}"


STACKS = {
    "softmax": attn.Decoder.softmax_layers(3),
    "hybrid_3_1": attn.Decoder.hybrid_layers(4, "3:1"),
    "lightning_first_softmax_last": attn.Decoder.hybrid_layers(2, "1:1"),
}


@pytest.fixture(params=attn.supported_isas())
def each_isa(request):
    """The independent check on every ISA path this CPU runs (the kernels are picked per ISA)."""
    before = attn.active_isa()
    attn.set_isa(request.param)
    yield request.param
    attn.set_isa(before)


@pytest.mark.parametrize("name", sorted(STACKS))
@pytest.mark.parametrize("bf16", [False, True])
def test_decoder_matches_a_literal_torch_implementation(tmp_path, name, bf16, each_isa):
    path, cfg, w = make_model(tmp_path, STACKS[name], bf16=bf16, tied=bf16, seed=len(name))
    tokens = list(np.random.default_rng(1).integers(0, cfg["vocab_size"], 37))
    m = attn.Decoder.load(path)
    ref = torch_logits(cfg, w, tokens)
    assert_close(m.logits(tokens), ref)
    # and one token at a time from the cache
    m.reset()
    rows = [m.forward(tokens[:5])] + [m.forward([t]) for t in tokens[5:]]
    assert_close(np.concatenate(rows), ref)


def test_windowed_layers_with_sinks_match_torch(tmp_path, each_isa):
    layers = attn.Decoder.softmax_layers(2, "softmax:causal,window=5:0,sinks=2")
    path, cfg, w = make_model(tmp_path, layers, seed=3)
    tokens = list(np.random.default_rng(2).integers(0, cfg["vocab_size"], 30))
    ref = torch_logits(cfg, w, tokens, window=5, sinks=2)
    assert_close(attn.Decoder.load(path).logits(tokens), ref)
    # the same file with the mechanism swapped at load time
    full = torch_logits(cfg, w, tokens)
    assert_close(attn.Decoder.load(path, mechanisms="softmax:causal").logits(tokens), full)


def test_random_models_save_and_load(tmp_path):
    cfg = dict(vocab_size=50, dim=16, hidden_dim=24, heads=2, kv_heads=1, head_dim=8, max_seq_len=64,
               layers=attn.Decoder.hybrid_layers(4, "3:1"))
    m = attn.Decoder.random(cfg, seed=5, dtype="bfloat16")
    assert m.config["layers"][3]["mechanism"] == "softmax:causal"
    assert m.kv_bytes_per_token == 2 * 1 * 8 * 4 and m.state_bytes == 3 * 2 * 8 * 8 * 4
    first = m.forward([1, 2, 3])
    assert first.shape == (3, 50) and m.position == 3
    m.save(tmp_path / "r.safetensors")
    again = attn.Decoder.load(tmp_path / "r.safetensors")
    np.testing.assert_array_equal(again.forward([1, 2, 3]), first)


def test_bad_inputs_are_value_errors(tmp_path):
    cfg = dict(vocab_size=50, dim=16, hidden_dim=24, heads=2, kv_heads=1, head_dim=8, max_seq_len=8,
               layers=attn.Decoder.softmax_layers(1))
    m = attn.Decoder.random(cfg)
    with pytest.raises(ValueError, match=r"^tokens\[0\] = 50 is not a token id in \[0, 50\)"):
        m.forward([50])
    with pytest.raises(ValueError, match="exceed max_seq_len 8"):
        m.forward(list(range(9)))
    with pytest.raises(ValueError, match="pos must be the number of tokens run since reset"):
        m.forward([1], pos=3)
    with pytest.raises(ValueError, match="is not causal"):
        attn.Decoder.random(dict(cfg, layers=attn.Decoder.softmax_layers(1, "softmax")))
    with pytest.raises(ValueError, match="ratio"):
        attn.Decoder.hybrid_layers(8, "7:0")
    with pytest.raises(ValueError, match="mechanisms: expected one text or one per layer"):
        m.save(tmp_path / "m.safetensors")
        attn.Decoder.load(tmp_path / "m.safetensors", mechanisms=["softmax:causal"] * 2)
    (tmp_path / "junk.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    with pytest.raises(ValueError, match="header is not valid JSON"):
        attn.Decoder.load(tmp_path / "junk.safetensors")


# Regression: absurd sizes ended in std::bad_alloc (or a Python list of 10^8
# layers); each is now a ValueError naming the sizes, before anything is allocated.
def test_absurd_sizes_are_refused_naming_them():
    cfg = dict(vocab_size=50, dim=16, hidden_dim=24, heads=2, kv_heads=1, head_dim=8, max_seq_len=8,
               layers=attn.Decoder.softmax_layers(1))
    for make in (lambda: attn.Decoder.softmax_layers(10**8), lambda: attn.Decoder.hybrid_layers(10**8),
                 lambda: attn.Decoder.softmax_layers(-1)):
        with pytest.raises(ValueError, match=r"count must be in \[0, 4096\]"):
            make()
    with pytest.raises(TypeError, match="count must be an integer"):
        attn.Decoder.softmax_layers(2.5)
    for change, message in [
            (dict(vocab_size=2**31 - 1, dim=2**20, heads=2**16, kv_heads=1, head_dim=16),
             r"more than this machine's memory .*vocab_size 2147483647, dim 1048576"),
            (dict(hidden_dim=2**40), r"more than this machine's memory .*hidden_dim 1099511627776"),
            (dict(hidden_dim=2**62), r"overflow 64-bit byte counts .*hidden_dim 4611686018427387904"),
            (dict(heads=2**30, kv_heads=2**30, head_dim=2**30), "overflow 64-bit byte counts"),
            (dict(max_seq_len=2**50), r"max_seq_len 1125899906842624"),
            (dict(layers=[{}] * 4097), "decoder config has 4097 layers, more than 4096")]:
        with pytest.raises(ValueError, match=message):
            attn.Decoder.random(dict(cfg, **change))
    # a windowed model's cache does not grow with max_seq_len: a huge context is fine
    m = attn.Decoder.random(dict(cfg, max_seq_len=2**50, layers=attn.Decoder.softmax_layers(1, "softmax:causal,window=7:0")))
    assert m.forward([1, 2]).shape == (2, 50)
