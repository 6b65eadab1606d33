#!/usr/bin/env python3
"""The wings' one-way doors, read off the sources (a ctest entry; no build needed).

attn has three wings, each a library: the attention library (src/attention, attn::attn), the
model-level blocks (src/blocks, attn::blocks) and the LLM runtime (src/llm, attn::llm). Both upper
wings stand on the attention library and know nothing of each other. This check fails when
  - a source file includes a folder or a public header of a wing it may not see,
  - a public header of the attention library includes another wing's header,
  - two folders include each other, directly or around a longer loop (the folder graph has a cycle),
  - the harness's case files are reached from inside a wing (cases/ and harness/ sit above them).
Usage: check_doors.py SOURCE_DIR
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

INCLUDE = re.compile(r'^\s*#\s*include\s+[<"]([^">]+)[">]', re.M)
SOURCES = (".cpp", ".hpp", ".inl", ".inc")

# the public headers of each upper wing (include/attn/<name>.hpp); every other one is the attention library's
PUBLIC = {
    "blocks": {"blocks", "output_softmax", "refinement", "sana", "titans"},
    "llm": {"llm", "engine", "gguf", "model", "moe", "safetensors", "sampler", "tokenizer"},
}
# which wings each wing may see (itself included)
SEES = {"attention": {"attention"}, "blocks": {"blocks", "attention"}, "llm": {"llm", "attention"}}


def wing_of_header(name: str) -> str:
    for wing, names in PUBLIC.items():
        if name in names:
            return wing
    return "attention"


def main(root: Path) -> int:
    src = root / "src"
    folders: dict[str, str] = {}  # folder name -> wing (names are unique across wings: one include root each)
    for wing in SEES:
        for d in sorted((src / wing).iterdir()):
            if d.is_dir():
                if d.name in folders:
                    print(f"check_doors: folder name '{d.name}' is in two wings ({folders[d.name]}, {wing})")
                    return 1
                folders[d.name] = wing
    problems: list[str] = []
    edges: dict[tuple[str, str], set[str]] = {}  # (wing, folder) -> folders it includes
    for wing in SEES:
        for f in sorted((src / wing).rglob("*")):
            if f.suffix not in SOURCES:
                continue
            rel = f.relative_to(src / wing)
            here = rel.parts[0] if len(rel.parts) > 1 else "."
            for inc in INCLUDE.findall(f.read_text(errors="replace")):
                if inc.startswith("attn/"):
                    target = wing_of_header(Path(inc).stem)
                    if target not in SEES[wing]:
                        problems.append(f"src/{wing}/{rel} includes <{inc}> of the {target} wing")
                    continue
                first = inc.split("/")[0]
                if first in ("harness", "cases", "tools", "python"):
                    problems.append(f"src/{wing}/{rel} includes \"{inc}\", which sits above the wings")
                elif first in folders and "/" in inc:
                    target = folders[first]
                    if target not in SEES[wing]:
                        problems.append(f"src/{wing}/{rel} includes \"{inc}\" of the {target} wing")
                    elif first != here and here != ".":
                        edges.setdefault((wing, here), set()).add(first)
    for h in sorted((root / "include" / "attn").glob("*.hpp")):
        wing = wing_of_header(h.stem)
        for inc in INCLUDE.findall(h.read_text()):
            if inc.startswith("attn/") and wing_of_header(Path(inc).stem) not in SEES[wing]:
                problems.append(f"include/attn/{h.name} ({wing}) includes <{inc}>")
    # folder cycles: depth-first search over the folder graph
    graph: dict[str, set[str]] = {}
    for (_, a), bs in edges.items():
        graph.setdefault(a, set()).update(bs)
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                problems.append("folders include each other: " + " -> ".join(stack[stack.index(m):] + [m]))
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)
    for p in problems:
        print("check_doors:", p)
    if not problems:
        n_files = sum(1 for w in SEES for f in (src / w).rglob("*") if f.suffix in SOURCES)
        print(f"check_doors: {n_files} files in {len(folders)} folders of 3 wings; every door one way, no folder loop")
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    sys.exit(main(Path(sys.argv[1])))
