"""attn.llm: the LLM runtime over the attention library (the C++ target attn::llm).

A real decoder (SmolLM2 and the other architectures the registry knows) from GGUF or safetensors
files, with any attention mechanism swapped in; its tokenizer; the mixture-of-experts
feed-forward. Every name here is also importable from ``attn``.

    import attn
    model = attn.llm.load_model(attn.llm.smollm2_path())
    print(model.generate("The capital of France is", max_new_tokens=8))
"""
from .. import _attn
from .model import Decoder, Model, load_model, smollm2_path
from .models import model_path, models
from .moe import moe_feed_forward
from .tokenizer import Tokenizer



def architectures() -> list:
    """The architectures the decoder knows, one dict each: ``name`` (a config's ``architecture``, a GGUF
    file's ``general.architecture``), ``summary``, ``baseline`` (the architecture ``attn generate-random``
    compares a random model of it with, or ""), ``gguf`` (whether its GGUF files load)."""
    return [dict(a) for a in _attn.architectures()]


__all__ = ["Decoder", "Model", "Tokenizer", "architectures", "load_model", "model_path", "models", "moe_feed_forward",
           "smollm2_path"]
