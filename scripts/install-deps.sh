#!/usr/bin/env bash
# Installs the Debian 12 packages attn builds with (as root; skips what is present); with --test,
# also what only the tests need.
set -euo pipefail
packages=(cmake ninja-build g++ clang libclang-rt-14-dev libomp-dev libgtest-dev libcli11-dev libfmt-dev
          nlohmann-json3-dev libopenblas-dev libcpp-httplib-dev python3 python3-venv python3-dev)
if [ "${1:-}" = --test ]; then
  packages+=(chromium)  # headless, to render attn report's page in python/tests/test_report.py
  packages+=(chromium-driver)  # Selenium drives it through attn serve's chat page (python/tests/test_serve.py)
  packages+=(pkg-config)  # builds examples/cpp_consumer against the installed attn.pc
  packages+=(openmpi-bin libopenmpi-dev)  # attn_distributed and its tests under mpirun (optional to build)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" != 0 ]; then
    echo "attn: missing Debian packages: ${missing[*]} (run as root, or install them)" >&2
    exit 1
  fi
  echo "attn: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
