#include "model_option.hpp"

#include <sys/stat.h>

#include "python_exec.hpp"

namespace attn::cli {
namespace {

bool is_name(const std::string& s) {
  const std::string gguf = ".gguf";
  return !s.empty() && s.find('/') == std::string::npos &&
         !(s.size() >= gguf.size() && s.compare(s.size() - gguf.size(), gguf.size(), gguf) == 0);
}

std::string trimmed(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

CLI::Validator model_file() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        struct stat st;
        if (stat(s.c_str(), &st) == 0) return S_ISDIR(st.st_mode) ? "expected a .gguf file, got the directory " + s : "";
        if (!is_name(s)) return "File does not exist: " + s;
        const PythonRun r = run_python_module("", "attn.llm", {"--path", s});
        std::string said = trimmed(r.out);
        if (r.status == 0 && !said.empty() && said.find('\n') == std::string::npos) {
          s = said;
          return {};
        }
        if (said.rfind("error: ", 0) == 0) said.erase(0, 7);
        return "'" + s + "' is no file, and as a model name: " + (said.empty() ? "python -m attn.llm failed" : said);
      },
      "FILE|NAME");
}

}  // namespace attn::cli
