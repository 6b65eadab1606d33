"""attn.blocks: model-level blocks over the attention library (the C++ target attn::blocks).

Output-layer softmaxes (full, hierarchical, adaptive), attention-weight refinement, Titans'
neural memory and its three architectures, SANA's LiteLA and Mix-FFN. Every name here is also
importable from ``attn``. ``refine_attention``, ``lite_la``, ``mix_ffn`` and ``sana_block`` train:
with torch tensors that require grad they run the custom ops of ``attn.blocks._torch_ops`` (torch
is imported only then).
"""
from .output_softmax import AdaptiveLogSoftmaxWithLoss, HierarchicalSoftmax, log_softmax
from .refinement import refine_attention, refined_weights
from .sana import lite_la, mix_ffn, sana_block
from .titans import titans_init, titans_mac, titans_mag, titans_mal, titans_memory, titans_read

__all__ = ["AdaptiveLogSoftmaxWithLoss", "HierarchicalSoftmax", "log_softmax", "refine_attention", "refined_weights",
           "lite_la", "mix_ffn", "sana_block", "titans_init", "titans_mac", "titans_mag", "titans_mal",
           "titans_memory", "titans_read"]
