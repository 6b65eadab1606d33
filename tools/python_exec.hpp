// The commands that live in the Python package (attn concentration, attn report, attn models) run
// it with the Python that has attn installed: ATTN_PYTHON, else .venv/bin/python beside the
// working directory, else python3. A Python without attn (or without a module a command needs)
// gets a message naming what to install, not a traceback.
#pragma once
#include <string>
#include <vector>

namespace attn::cli {

// The Python to run: ATTN_PYTHON, else .venv/bin/python (if executable), else python3.
std::string find_python();

// Replaces this process with `PYTHON -m MODULE ARGS...` (through a bootstrap that names a missing
// module and the pip command). Returns only if that cannot start: then it prints why (naming
// `command`, e.g. "attn report") and how to fix it, and returns 2.
int exec_python_module(const std::string& command, const std::string& module, const std::vector<std::string>& args);

// Runs `PYTHON -m MODULE ARGS...` (the same bootstrap) and waits: its exit status (127 if it
// could not start) and its standard output and standard error, together.
struct PythonRun {
  int status = 127;
  std::string out;
};
PythonRun run_python_module(const std::string& command, const std::string& module, const std::vector<std::string>& args);

}  // namespace attn::cli
