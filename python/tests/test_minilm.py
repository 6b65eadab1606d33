"""A real model through our kernels: all-MiniLM-L6-v2 with every self-attention computed by attn."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import minilm  # noqa: E402


def test_minilm_embeddings_match_the_shipped_model():
    r = minilm.compare()
    # every layer went through attn, and each call was handed the padding mask
    assert r["layers"] == r["num_layers"] == 6
    assert r["calls"] == 6 and r["masked_calls"] == 6
    assert r["min_cosine"] >= 0.99999, r["min_cosine"]
    assert r["max_abs_diff"] <= 1e-4, r["max_abs_diff"]

    # padding is honoured: each sentence alone gives the same embedding as inside the padded batch
    model = r["model"]
    for i, s in enumerate(minilm.SENTENCES[:3]):
        alone = minilm.encode(model, [s])[0]
        assert np.abs(alone - r["ours"][i]).max() <= 1e-4


def test_minilm_attention_rows_are_distributions():
    r = minilm.compare(sentences=minilm.SENTENCES[:2], keep_probs=True)
    assert len(r["probs"]) == 6
    for p in r["probs"]:
        assert p.shape[:2] == (2, 12)
        sums = p.sum(-1)
        # rows of padded queries still see the real keys; every row sums to 1
        assert np.allclose(sums, 1.0, atol=1e-5)
