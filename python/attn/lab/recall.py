"""Multi-query associative recall, and a tiny transformer whose attention is attn's, trained on it:
the training experiment (``python -m attn.lab.experiments train``).

The task (multi-query associative recall, MQAR, after Zoology: Arora et al. 2023). A sequence of
``seq_len`` tokens opens with ``pairs`` key-value pairs ``k1 v1 k2 v2 ...`` (keys and values from
the two halves of the vocabulary, keys distinct); the rest is a query region of blanks (token 0)
in which each of the keys appears once, at a random position. At a query the model must output
the value that followed that key; only query positions are scored (loss and accuracy).

The model. Token embedding plus a previous-token embedding (a width-2 short convolution over the
tokens, as Zoology's and Based's recall models carry: a value's position then also holds its key,
so one attention layer can match a query against it), then ``len(layers)`` blocks of pre-norm
attention and pre-norm MLP (GELU, 4x wide), a final LayerNorm and a separate output head.
Attention is one function per mechanism, (B, T, H, D) -> (B, T, H, D), each calling attn's
differentiable operators (attn.attention, attn.attend, attn.linear_attention), never torch's:

    softmax       attn.attention(q, k, v, causal=True)
    window+sinks  attn.attend(q, k, v, "softmax:causal,window=W-1:0,sinks=S"): W keys back plus the
                  first S tokens, too few to see every pair from the query region
    elu-linear    attn.linear_attention(q, k, v, feature_map="elu"): phi(q).phi(k), normalised
    retention     attn.linear_attention(q, k, v, feature_map="identity", decay=per head,
                  normalize=False, scale=1/sqrt(D)), RetNet's decays 1 - 2^(-5-h), outputs
                  RMS-normalised per head (RetNet's group norm without its affine)
    hybrid        layer 1 elu-linear, layer 2 softmax: MiniMax's 7:1 hybrid (softmax every eighth
                  layer, on top of linear ones) scaled to two layers. Taken literally, 7:1 over two
                  layers (attn.Decoder.hybrid_layers(2, "7:1")) has no softmax layer at all.

A mechanism whose backward attn does not have yet is not trained and not replaced: it gets a row
saying "not trainable yet" and why (see :func:`untrainable_reason`).
"""
from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

import attn

__all__ = ["RecallConfig", "FULL", "QUICK", "MECHANISMS", "recall_batch", "RecallModel", "untrainable_reason",
           "train_mechanism"]

BLANK = 0
IGNORE = -100  # targets of positions that are not queries (torch's cross_entropy ignore_index)


@dataclass(frozen=True)
class RecallConfig:
    """Task, model and training sizes of one run."""
    vocab: int = 128        # token 0 is the blank; keys 1 .. vocab/2 - 1, values vocab/2 .. vocab - 1
    pairs: int = 32         # key-value pairs per sequence (each queried once)
    seq_len: int = 128      # pairs take 2 * pairs tokens, the query region the rest
    d_model: int = 64
    heads: int = 4
    batch: int = 64
    steps: int = 600
    lr: float = 1e-2        # softmax leaves its plateau near step 250 (at 3e-3 it was still climbing at 400)
    eval_every: int = 25
    eval_size: int = 256    # sequences of the fixed evaluation set
    window: int = 32        # window+sinks: keys a query sees back, itself included
    sinks: int = 4          # window+sinks: the first tokens every query also sees
    seed: int = 0

    def check(self) -> None:
        """Raises ValueError naming the size that does not fit."""
        if not 1 <= self.pairs <= self.vocab // 2 - 1:
            raise ValueError(f"train: pairs must be in [1, vocab/2 - 1 = {self.vocab // 2 - 1}] (distinct keys), "
                             f"got {self.pairs}")
        if self.seq_len < 3 * self.pairs:
            raise ValueError(f"train: seq_len must hold the pairs and one query per key (>= 3 * pairs = "
                             f"{3 * self.pairs}), got {self.seq_len}")
        if self.d_model % self.heads:
            raise ValueError(f"train: heads ({self.heads}) must divide d_model ({self.d_model})")
        if self.steps < 1 or self.eval_every < 1 or self.batch < 1 or self.eval_size < 1:
            raise ValueError("train: steps, eval_every, batch and eval_size must be >= 1")
        if not 1 <= self.window < self.seq_len or self.sinks < 0:
            raise ValueError(f"train: window must be in [1, seq_len) and sinks >= 0, got {self.window}, {self.sinks}")


FULL = RecallConfig()
QUICK = RecallConfig(vocab=32, pairs=4, seq_len=24, d_model=32, heads=2, batch=16, steps=30, eval_every=10,
                     eval_size=32, window=6, sinks=2)


# ---- the task -------------------------------------------------------------------------------

def recall_batch(rng: np.random.Generator, cfg: RecallConfig, batch: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, targets, value_at): int64 (batch, seq_len) inputs; targets the value at each query
    position and IGNORE elsewhere; value_at the position of the value a query asks for (-1 elsewhere)."""
    half, T, P = cfg.vocab // 2, cfg.seq_len, cfg.pairs
    tokens = np.full((batch, T), BLANK, dtype=np.int64)
    targets = np.full((batch, T), IGNORE, dtype=np.int64)
    value_at = np.full((batch, T), -1, dtype=np.int64)
    for b in range(batch):
        keys = rng.choice(np.arange(1, half), size=P, replace=False)
        values = rng.integers(half, cfg.vocab, size=P)
        tokens[b, 0:2 * P:2], tokens[b, 1:2 * P:2] = keys, values
        where = 2 * P + np.sort(rng.choice(T - 2 * P, size=P, replace=False))  # query positions, in order
        asked = rng.permutation(P)                                               # which pair each asks for
        tokens[b, where], targets[b, where], value_at[b, where] = keys[asked], values[asked], 2 * asked + 1
    return tokens, targets, value_at


def share_in_view(value_at: np.ndarray, visible: np.ndarray) -> float:
    """The share of queries whose value token the pattern `visible` ((T, T) bool, query x key) shows
    to the query in one attention hop."""
    b, t = np.nonzero(value_at >= 0)
    return float(visible[t, value_at[b, t]].mean())


# ---- attention, one function per mechanism: (B, T, H, D) -> (B, T, H, D) ------------------

def softmax_attention(q, k, v, cfg: RecallConfig):
    return attn.attention(q, k, v, causal=True)


def window_sinks_text(cfg: RecallConfig) -> str:
    """The window+sinks mechanism: cfg.window keys back (itself included) and the first cfg.sinks."""
    return f"softmax:causal,window={cfg.window - 1}:0,sinks={cfg.sinks}"


def window_sinks_attention(q, k, v, cfg: RecallConfig):
    return attn.attend(q, k, v, window_sinks_text(cfg))


def elu_linear_attention(q, k, v, cfg: RecallConfig):
    return attn.linear_attention(q, k, v, feature_map="elu", causal=True)[0]


def retention_decays(heads: int) -> torch.Tensor:
    """RetNet's per-head decays 1 - 2^(-5-h)."""
    return torch.tensor([1 - 2.0 ** (-5 - h) for h in range(heads)], dtype=torch.float32)


def retention_attention(q, k, v, cfg: RecallConfig):
    o, _ = attn.linear_attention(q, k, v, feature_map="identity", causal=True, decay=retention_decays(q.shape[2]),
                                 normalize=False, scale=q.shape[-1] ** -0.5)
    return o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6)


Attention = Callable[..., torch.Tensor]

# name -> the attention of each of the two layers
MECHANISMS: Dict[str, Tuple[Attention, Attention]] = {
    "softmax": (softmax_attention, softmax_attention),
    "window+sinks": (window_sinks_attention, window_sinks_attention),
    "elu-linear": (elu_linear_attention, elu_linear_attention),
    "retention": (retention_attention, retention_attention),
    "hybrid": (elu_linear_attention, softmax_attention),
}
DESCRIPTIONS = {
    "softmax": "softmax, causal (attn.attention)",
    "window+sinks": "softmax over a window and the first tokens (attn.attend)",
    "elu-linear": "linear attention, elu+1 features, normalised (attn.linear_attention)",
    "retention": "retention: identity features, decay per head, RMS-normalised (attn.linear_attention)",
    "hybrid": "layer 1 elu-linear, layer 2 softmax (7:1 scaled to two layers)",
}


def row_mechanism(attention: Attention, cfg: RecallConfig) -> Tuple[str, Dict]:
    """(mechanism text, params) for attn.attend whose weight rows are those `attention` applies
    (up to a positive factor per row, which changes neither S nor a weight's share)."""
    if attention is softmax_attention:
        return "softmax:causal", {}
    if attention is window_sinks_attention:
        return window_sinks_text(cfg), {}
    if attention is elu_linear_attention:
        return "linear:map=elu,causal", {}
    if attention is retention_attention:
        return "linear:map=identity,causal,normalize=0", {"decay": retention_decays(cfg.heads)}
    raise ValueError(f"row_mechanism: no weight rows known for {attention.__name__}")


def answer_rows(attention: Attention, cfg: RecallConfig, qkv, value_at: np.ndarray) -> Tuple[float, float]:
    """(weight on the answer, S) of a layer's weight rows at the query positions, each query read
    in the head that puts the most weight on the position of the value it asks for; the weight
    as a share of the row's sum of |a|, S = mean|a| / sqrt(mean a^2) over the keys the row sees
    (attn's streamed statistics). Means over the queries."""
    text, params = row_mechanism(attention, cfg)
    q, k, v = qkv
    _, probs, stats = attn.attend(q, k, v, text, params=params, return_probs=True, return_stats=True)
    rows = torch.as_tensor(probs).abs()                                       # (B, H, T, T)
    b, t = (torch.from_numpy(x) for x in np.nonzero(value_at >= 0))
    at = torch.from_numpy(value_at)[b, t]
    share = rows[b, :, t, at] / rows[b, :, t, :].sum(-1).clamp_min(1e-30)   # (queries, H)
    best, head = share.max(-1)
    sparsity = torch.as_tensor(stats.sparsity)[b, head, t]
    return float(best.mean()), float(sparsity.nanmean())


def visible_keys(name: str, cfg: RecallConfig) -> np.ndarray:
    """(T, T) bool: the keys a query of the mechanism's last layer can see in one hop."""
    if name == "window+sinks":
        return attn.mask_of(window_sinks_text(cfg), cfg.seq_len)
    return np.tril(np.ones((cfg.seq_len, cfg.seq_len), dtype=bool))


def untrainable_reason(name: str, cfg: RecallConfig) -> Optional[str]:
    """None if every layer's attention of `name` runs forward and backward on a tiny input; else
    attn's refusal (a family without a backward yet), in one line. Other errors propagate."""
    g = torch.Generator().manual_seed(0)
    for fn in dict.fromkeys(MECHANISMS[name]):
        q, k, v = (torch.randn(1, 8, cfg.heads, 4, generator=g, requires_grad=True) for _ in range(3))
        try:
            fn(q, k, v, cfg).sum().backward()
        except ValueError as e:  # only attn's refusal; any other failure is a bug to see, not a row
            if "has no backward" not in str(e):
                raise
            return f"{fn.__name__}: {type(e).__name__}: {str(e).splitlines()[0]}"
        if any(x.grad is None or not torch.isfinite(x.grad).all() for x in (q, k, v)):
            return f"{fn.__name__}: no finite gradient reached q, k and v"
    return None


# ---- the model ------------------------------------------------------------------------------

class Block(nn.Module):
    """x + attention(LayerNorm(x)), then x + MLP(LayerNorm(x))."""

    def __init__(self, cfg: RecallConfig, attention: Attention):
        super().__init__()
        self.cfg, self.attention = cfg, attention
        d = cfg.d_model
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.cfg.heads, d // self.cfg.heads).unbind(2)  # (B, T, H, D)
        if not self.training:  # kept for answer_rows
            self.last_qkv = (q.detach(), k.detach(), v.detach())
        x = x + self.proj(self.attention(q, k, v, self.cfg).reshape(B, T, d))
        return x + self.mlp(self.norm2(x))


class RecallModel(nn.Module):
    """Embeddings (token + previous token), one Block per layer's attention, LayerNorm, output head."""

    def __init__(self, cfg: RecallConfig, attentions: Sequence[Attention]):
        super().__init__()
        self.embed, self.embed_prev = nn.Embedding(cfg.vocab, cfg.d_model), nn.Embedding(cfg.vocab, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, a) for a in attentions)
        self.norm, self.head = nn.LayerNorm(cfg.d_model), nn.Linear(cfg.d_model, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) int64 -> (B, T, vocab) logits."""
        prev = torch.nn.functional.pad(tokens[:, :-1], (1, 0), value=BLANK)
        x = self.embed(tokens) + self.embed_prev(prev)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


# ---- training -------------------------------------------------------------------------------

def loss_and_accuracy(model: RecallModel, tokens: torch.Tensor, targets: torch.Tensor) -> Tuple[torch.Tensor, float]:
    """Cross-entropy and the share of exact answers, over the query positions."""
    logits = model(tokens)
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)
    scored = targets != IGNORE
    accuracy = (logits.argmax(-1)[scored] == targets[scored]).float().mean().item()
    return loss, accuracy


def learning_rate(step: int, cfg: RecallConfig) -> float:
    """Linear warm-up over the first 5 % of the steps, then cosine down to a tenth."""
    warm = max(1, cfg.steps // 20)
    if step < warm:
        return cfg.lr * (step + 1) / warm
    t = (step - warm) / max(1, cfg.steps - warm)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


@contextlib.contextmanager
def torch_on_one_thread():
    """torch's own operations on one thread for the block, attn's on all cores. torch and attn
    each bring an OpenMP runtime; on 2 cores the threads of one spin-wait while the other's work,
    and a step took 8x longer (1.8 s against 0.23 s, measured). torch's matmuls here are small."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_mechanism(name: str, cfg: RecallConfig, log=None) -> List[Dict]:
    """Trains the model with mechanism `name` for cfg.steps steps; one row per evaluation (step 0,
    every cfg.eval_every steps and the last): step, eval loss, eval accuracy, the weight on the
    answer and the rows' S at the queries (answer_rows) of the layer that weighs the answer most
    (answer_layer, 1-based), seconds so far. The
    same initial weights (cfg.seed) and batches for every mechanism. A mechanism attn cannot
    differentiate yet gives one row with no loss and accuracy (None) and the reason in `note`."""
    log = sys.stderr if log is None else log
    cfg.check()
    eval_tokens, eval_targets, eval_value_at = recall_batch(np.random.default_rng([cfg.seed, 2]), cfg, cfg.eval_size)
    base = {"mechanism": name, "description": DESCRIPTIONS[name],
            "in_view": share_in_view(eval_value_at, visible_keys(name, cfg))}
    reason = untrainable_reason(name, cfg)
    if reason is not None:
        print(f"train: {name}: not trainable yet ({reason})", file=log, flush=True)
        return [dict(base, step=0, loss=None, accuracy=None, answer_weight=None, answer_sparsity=None,
                     answer_layer=None, seconds=0.0,
                     note=f"not trainable yet: {reason}")]
    torch.manual_seed(cfg.seed)
    model = RecallModel(cfg, MECHANISMS[name])
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.1, betas=(0.9, 0.98))
    rng = np.random.default_rng([cfg.seed, 1])
    eval_tokens, eval_targets = torch.from_numpy(eval_tokens), torch.from_numpy(eval_targets)
    rows: List[Dict] = []
    t0 = time.monotonic()

    def evaluate(step: int) -> None:
        model.eval()
        with torch.no_grad():
            loss, acc = loss_and_accuracy(model, eval_tokens, eval_targets)
            per_layer = [answer_rows(b.attention, cfg, b.last_qkv, eval_value_at) for b in model.blocks]
        model.train()
        layer = max(range(len(per_layer)), key=lambda i: per_layer[i][0])
        weight, sparsity = per_layer[layer]
        rows.append(dict(base, step=step, loss=float(loss), accuracy=acc, answer_weight=weight,
                         answer_sparsity=sparsity, answer_layer=layer + 1, seconds=round(time.monotonic() - t0, 2),
                         note=""))
        print(f"train: {name:12s} step {step:5d}/{cfg.steps}  loss {float(loss):.4f}  accuracy {acc:.3f}  "
              f"weight on the answer {weight:.3f} (S {sparsity:.2f}, layer {layer + 1})  "
              f"({time.monotonic() - t0:.0f} s)", file=log, flush=True)

    with torch_on_one_thread():
        evaluate(0)
        for step in range(cfg.steps):
            tokens, targets, _ = recall_batch(rng, cfg, cfg.batch)
            for group in opt.param_groups:
                group["lr"] = learning_rate(step, cfg)
            loss, _ = loss_and_accuracy(model, torch.from_numpy(tokens), torch.from_numpy(targets))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
                evaluate(step + 1)
    return rows


def config_row(cfg: RecallConfig) -> Dict:
    """The run's sizes, for the table's metadata."""
    return asdict(cfg)
