"""attn behind other libraries' extension points.

* :mod:`attn.integrations.transformers` -- an attention implementation for Hugging Face
  transformers: ``attn.integrations.transformers.register()``, then
  ``from_pretrained(..., attn_implementation="attn")``.

Nothing here is imported by ``import attn``; each module imports its library when used.
"""
