// --model (attn generate, chat, eval-ppl, demo): a GGUF file's path, or the name of a model package
// installed from PyPI ("smollm2", "gemma3-270m"), which attn's Python package resolves
// (python -m attn.llm --path NAME; attn models lists the names).
#pragma once
#include <CLI/CLI.hpp>

namespace attn::cli {

// Leaves an existing file's path as given; replaces a name (no '/', not ending in .gguf) with its
// file's path; refuses anything else, with the Python side's reason for a name it cannot resolve.
CLI::Validator model_file();

}  // namespace attn::cli
