// The architectures the decoder knows. Adding one: its file in this folder (an Architecture named
// k<Name>) and one line in each list below.
#include <string>

#include "model/architecture.hpp"
#include "attn/error.hpp"

namespace attn::model {

extern const Architecture kLlama;    // arch/llama.cpp
extern const Architecture kMinimax;  // arch/minimax.cpp
extern const Architecture kGemma3;   // arch/gemma3.cpp

const std::vector<const Architecture*>& all_architectures() {
  static const std::vector<const Architecture*> all{&kLlama, &kMinimax, &kGemma3};
  return all;
}

const Architecture& architecture(std::string_view name, const std::string& where) {
  std::string known;
  for (const Architecture* a : all_architectures()) {
    if (a->name == name) return *a;
    known += (known.empty() ? "" : ", ") + std::string(a->name);
  }
  fail(where, "unknown architecture '" + std::string(name) + "' (known: " + known + ")");
}

}  // namespace attn::model

namespace attn {

std::vector<ArchitectureInfo> architectures() {
  std::vector<ArchitectureInfo> out;
  for (const model::Architecture* a : model::all_architectures())
    out.push_back({std::string(a->name), std::string(a->summary), std::string(a->baseline), a->gguf != nullptr});
  return out;
}

}  // namespace attn
