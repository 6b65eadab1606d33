#!/usr/bin/env bash
# Builds this consumer against an installed attn twice, with find_package (CMake) and with
# pkg-config, and runs both binaries (each checks attend against float64 and exits non-zero on
# a mismatch):
#   cmake --install build/release --prefix /tmp/attn-prefix
#   examples/cpp_consumer/build_against_install.sh /tmp/attn-prefix
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 PREFIX   (the --prefix attn was installed to)" >&2
  exit 2
fi
prefix=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "build_against_install: $*" >&2; exit 1; }

# 1. CMake: find_package(attn) through CMAKE_PREFIX_PATH, nothing else (no package registry).
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
cmake -S "$here" -B "$work/cmake" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF >"$work/configure.log" 2>&1 \
  || { cat "$work/configure.log" >&2; fail "cmake configure failed (find_package(attn) in $prefix)"; }
attn_dir=$(sed -n 's/^attn_DIR:PATH=//p' "$work/cmake/CMakeCache.txt")
case "$attn_dir" in
  "$prefix"/*) ;;
  *) fail "find_package(attn) found '$attn_dir', not the package in $prefix" ;;
esac
cmake --build "$work/cmake" >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; fail "cmake build failed"; }
echo "find_package(attn): $attn_dir"
"$work/cmake/attn_consumer" || fail "the find_package build's check failed"
"$work/cmake/attn_llm_consumer" || fail "the find_package build's attn::llm check failed"
# the attention library alone holds none of the other wings (the pkg-config build below links -lattn alone)
lib=$(find "$prefix" -name libattn.a -path '*/lib*' | head -n 1)
[ -n "$lib" ] || fail "no libattn.a under $prefix"
# demangled names of the symbols libattn.a defines, not those it only references (U)
leaks=$(nm -C --defined-only "$lib" 2>/dev/null | grep -E ' [TtWwBbDdRrVv] ' |
        grep -E 'attn::(model|Model|Tokenizer|tokenizer|Gguf|gguf|read_gguf|moe|Moe|safetensors|Safetensors|Sampler|sample|titans|Titans|sana|refinement|hierarchical|adaptive)' | head -n 5 || true)
[ -z "$leaks" ] || fail "libattn.a defines symbols of another wing: $leaks"
echo "libattn.a: no tokenizer, GGUF, safetensors, model, MoE, sampler or block symbols"

# 2. pkg-config: only the flags attn.pc gives (plus -std=c++20, which the headers need).
pc=$(find "$prefix" -name attn.pc -path '*/pkgconfig/*' | head -n 1)
[ -n "$pc" ] || fail "no attn.pc under $prefix"
PKG_CONFIG_PATH="$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export PKG_CONFIG_PATH
flags=$(pkg-config --cflags --libs attn) || fail "pkg-config --cflags --libs attn failed"
echo "pkg-config --cflags --libs attn: $flags"
# shellcheck disable=SC2086  # the flags are words
"${CXX:-c++}" -std=c++20 -O2 "$here/main.cpp" -o "$work/attn_consumer_pc" $flags \
  || fail "compiling with pkg-config's flags failed"
"$work/attn_consumer_pc" || fail "the pkg-config build's check failed"
llm_flags=$(pkg-config --cflags --libs attn-llm) || fail "pkg-config --cflags --libs attn-llm failed"
echo "pkg-config --cflags --libs attn-llm: $llm_flags"
# shellcheck disable=SC2086
"${CXX:-c++}" -std=c++20 -O2 "$here/llm_main.cpp" -o "$work/attn_llm_consumer_pc" $llm_flags \
  || fail "compiling with pkg-config attn-llm's flags failed"
"$work/attn_llm_consumer_pc" || fail "the pkg-config attn-llm build's check failed"
