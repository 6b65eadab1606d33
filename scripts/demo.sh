#!/usr/bin/env bash
# Installs what attn needs, builds it (release) and runs `attn demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target attn_cli
./build/release/attn demo "$@"
