"""attn.lab: experiments and the report built on the library, not part of its API.

    python -m attn.lab.experiments curves --out out/      # concentration experiments (matplotlib)
    python -m attn.lab gemma --out out/                   # the same (gemma: Gemma 3's local and global layers)
    python -m attn.lab.report --out report.html           # the HTML report of their results

``attn.lab.svf`` holds the singular-value fine-tuning adapter (SVF, CEM); its names are also
importable from ``attn``. ``experiments`` and ``report`` load matplotlib and are imported on
first use.
"""
from .svf import CEM, SVFAdapter, svf_compose, svf_decompose, svf_mix

__all__ = ["CEM", "SVFAdapter", "svf_compose", "svf_decompose", "svf_mix"]
