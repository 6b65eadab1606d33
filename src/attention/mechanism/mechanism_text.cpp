// The text form of mechanisms, parsed in one place for the CLI, benchmarks and Python:
//   <kind>[:<option>(,<option>)*]
// The list of kinds is the Mechanism variant itself; each family reads and writes its own
// options (family_text.hpp) with the shared strict OptionReader/OptionWriter.
#include <utility>

#include "attn/error.hpp"
#include "attn/mechanism.hpp"
#include "mechanism/family_text.hpp"

namespace attn {
namespace {

using mechanism::quoted;

template <size_t I = 0>
Mechanism parse_kind(std::string_view text, std::string_view kind, std::string_view opts) {
  if constexpr (I == std::variant_size_v<Mechanism>) {
    fail("mechanism", "unknown mechanism " + quoted(kind) + " in " + quoted(text) + " (known: " + known_kinds() + ")");
  } else {
    using Family = std::variant_alternative_t<I, Mechanism>;
    if (kind != Family::kind) return parse_kind<I + 1>(text, kind, opts);
    mechanism::OptionReader reader(kind, opts);
    Family m;
    mechanism::read_options(reader, m);
    reader.finish();
    return m;
  }
}

template <size_t... I>
std::string kinds(std::index_sequence<I...>) {
  std::string out;
  ((out += (I ? ", " : "") + std::string(std::variant_alternative_t<I, Mechanism>::kind)), ...);
  return out;
}

}  // namespace

std::string known_kinds() { return kinds(std::make_index_sequence<std::variant_size_v<Mechanism>>{}); }
// (and the alias retention, for linear:map=identity,causal,normalize=0)

std::string to_string(ScoreKind s) {
  switch (s) {
    case ScoreKind::dot: return "dot";
    case ScoreKind::cosine: return "cosine";
    case ScoreKind::additive: return "additive";
  }
  return "?";
}

Mechanism parse_mechanism(std::string_view text) {
  const size_t colon = text.find(':');
  const std::string_view kind = text.substr(0, colon);
  const std::string_view opts = colon == std::string_view::npos ? std::string_view{} : text.substr(colon + 1);
  if (colon != std::string_view::npos && opts.empty()) fail("mechanism", "nothing after ':' in " + quoted(text));
  if (kind == "retention") {  // an alias: written back as linear:map=identity,causal,normalize=0,...
    mechanism::OptionReader reader(kind, opts);
    Linear m;
    mechanism::read_retention(reader, m);
    reader.finish();
    return m;
  }
  return parse_kind(text, kind, opts);
}

std::string to_string(const Mechanism& mech) {
  return std::visit(
      [](const auto& m) {
        mechanism::OptionWriter w(m.kind);
        mechanism::write_options(w, m);
        return w.str();
      },
      mech);
}

std::vector<std::string> mechanism::options_of(const Mechanism& mech) {
  return std::visit(
      [](const auto& m) {
        mechanism::OptionReader reader(m.kind, "");
        std::decay_t<decltype(m)> unused;
        mechanism::read_options(reader, unused);
        return reader.known();
      },
      mech);
}

std::string_view kind_of(const Mechanism& mech) {
  return std::visit([](const auto& m) { return std::decay_t<decltype(m)>::kind; }, mech);
}

}  // namespace attn
