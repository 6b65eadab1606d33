// attn models: the models attn knows by name (the GGUF files model packages from PyPI install),
// whether each is installed, its path and size, and how to install it. The list lives in the
// Python package (attn.llm.models); this command runs it as attn report does.
#include "commands.hpp"
#include "python_exec.hpp"

namespace attn::cli {

Runner add_models(CLI::App& app) {
  CLI::App* c = app.add_subcommand(
      "models", "The models attn knows by name (--model NAME): installed?, path, size, how to install");
  c->footer("Examples:\n  attn models\n  attn generate --model smollm2 --prompt \"Hello\"\n"
            "  attn chat --model gemma3-270m");
  return [] { return exec_python_module("attn models", "attn.llm", {}); };
}

}  // namespace attn::cli
