#include "python_exec.hpp"

#include <fmt/core.h>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace attn::cli {

std::string find_python() {
  if (const char* p = std::getenv("ATTN_PYTHON"); p && *p) return p;
  if (access(".venv/bin/python", X_OK) == 0) return ".venv/bin/python";
  return "python3";
}

int exec_python_module(const std::string& command, const std::string& module, const std::vector<std::string>& args) {
  const std::string py = find_python();
  std::vector<std::string> all = {py, "-m", module};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : all) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  execvp(argv[0], argv.data());
  fmt::print(stderr, "error: {} runs the Python package (python -m {}); cannot start '{}': {}\n"
                     "  set ATTN_PYTHON to a Python with attn installed (pip install .)\n",
             command, module, py, std::strerror(errno));
  return 2;
}

}  // namespace attn::cli
