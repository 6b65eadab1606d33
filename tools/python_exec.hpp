// The commands that live in the Python package (attn concentration, attn report) run it with the
// Python that has attn installed: ATTN_PYTHON, else .venv/bin/python beside the working
// directory, else python3.
#pragma once
#include <string>
#include <vector>

namespace attn::cli {

// The Python to run: ATTN_PYTHON, else .venv/bin/python (if executable), else python3.
std::string find_python();

// Replaces this process with `PYTHON -m MODULE ARGS...`. Returns only if that cannot start: then
// it prints why (naming `command`, e.g. "attn report") and how to fix it, and returns 2.
int exec_python_module(const std::string& command, const std::string& module, const std::vector<std::string>& args);

}  // namespace attn::cli
