// attn::info: the facts a family declares (core/facts.hpp), its forms and its text grammar, as
// one public record. The edges (decoder, caches, CLI, harness, Python) read this.
#include "attn/info.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "attn/error.hpp"
#include "core/out_of_memory.hpp"
#include "families/internal_api.hpp"
#include "families/table.hpp"
#include "mechanism/family_text.hpp"

namespace attn {
namespace {

std::vector<std::string> substituted(const std::vector<std::string>& dims, const std::map<std::string, std::string>& symbols) {
  std::vector<std::string> out;
  for (const std::string& d : dims) {
    const auto it = symbols.find(d);
    out.push_back(it == symbols.end() ? d : it->second);
  }
  return out;
}

}  // namespace

std::string to_string(CacheKind c) {
  switch (c) {
    case CacheKind::kv: return "kv";
    case CacheKind::state: return "state";
    case CacheKind::none: return "none";
  }
  return "?";
}

int64_t MechanismInfo::rows_at(int64_t tokens) const {
  if (cache != CacheKind::kv) return 0;
  if (lookback < 0) return tokens;
  return std::min(tokens, sinks + lookback + 1);
}

MechanismInfo info(const Mechanism& mechanism, int64_t context) {
  if (context < 0) fail("info", "context must be >= 0 tokens, got " + std::to_string(context));
  MechanismInfo r;
  families::visit_family(mechanism, [&](const auto& mech, auto family) {
    using Family = decltype(family);
    const core::Facts f = Family::facts(mech);
    r.family = std::string(kind_of(mechanism));
    r.text = to_string(mechanism);
    r.causal = f.causal;
    r.can_be_causal = f.can_be_causal;
    r.has_lse = families::has_lse<Family>();
    r.applies_positions = f.applies_positions;
    r.position_mask = f.position_mask;
    r.cache = f.cache;
    r.lookback = f.cache == CacheKind::kv ? f.lookback : -1;
    r.sinks = r.lookback >= 0 ? f.sinks : 0;
    r.align = r.lookback >= 0 ? f.align : 1;
    r.state_shape = f.state_shape;
    r.no_key_pattern = f.no_key_pattern;
    for (const core::ParamSpec& s : f.params)
      r.params.push_back({s.name, substituted(s.dims, f.symbols), "float32", s.meaning, s.optional, s.generate,
                           s.gradient});
    for (const auto& form : Family::forms()) r.forms.emplace_back(form.name);
    for (const core::OptionRange& range : f.ranges) r.option_ranges.push_back(range.text());
    r.limits = r.option_ranges;
    r.limits.insert(r.limits.end(), f.limits.begin(), f.limits.end());
    if ((f.cache == CacheKind::state) != families::has_state<Family>())
      fail("info", r.text + ": the family's facts and its state shape disagree");  // a family bug, caught by tests
  });
  std::string grammar = r.family;
  const std::vector<std::string> options = mechanism::options_of(mechanism);
  for (size_t i = 0; i < options.size(); ++i) grammar += (i ? "," : "[:") + options[i];
  r.grammar = options.empty() ? grammar : grammar + "]";
  r.context = context;
  r.cache_rows = r.rows_at(context);
  return r;
}

std::vector<MechanismInfo> family_infos() {
  std::vector<MechanismInfo> out;
  [&]<size_t... I>(std::index_sequence<I...>) {
    (out.push_back(info(Mechanism{std::variant_alternative_t<I, Mechanism>{}})), ...);
  }(std::make_index_sequence<std::variant_size_v<Mechanism>>{});
  return out;
}

std::string MechanismInfo::to_json() const {
  nlohmann::json params_json = nlohmann::json::array(), names = nlohmann::json::array();
  for (const ParamInfo& p : params) names.push_back(p.name);
  for (const ParamInfo& p : params)
    params_json.push_back({{"name", p.name}, {"shape", p.shape}, {"dtype", p.dtype}, {"meaning", p.meaning},
                           {"optional", p.optional}, {"generate", p.generate},
                           {"gradient", p.gradient}});
  nlohmann::json j = {{"family", family},
                      {"text", text},
                      {"causal", causal},
                      {"can_be_causal", can_be_causal},
                      {"has_lse", has_lse},
                      {"applies_positions", applies_positions},
                      {"position_mask", position_mask},
                      {"cache", to_string(cache)},
                      {"context", context},
                      {"cache_rows", cache_rows},
                      {"cache_bound", cache == CacheKind::kv && lookback >= 0 ? sinks + lookback + 1 : -1},
                      {"lookback", lookback},
                      {"sinks", sinks},
                      {"align", align},
                      {"state_shape", state_shape},
                      {"no_key_pattern", no_key_pattern},
                      {"params", names},
                      {"param_specs", params_json},
                      {"forms", forms},
                      {"grammar", grammar},
                      {"limits", limits},
                      {"option_ranges", option_ranges}};
  return j.dump();
}

namespace families {

core::ReferenceResult reference_outputs(const TensorView& q, const TensorView& k, const TensorView& v,
                                        const Mechanism& mechanism, const AttendOptions& options,
                                        core::RefPrecision precision) try {
  return visit_family(mechanism, [&](const auto& mech, auto family) {
    using Family = decltype(family);
    return Family::reference(Family::validate(q, k, v, mech, options, core::Outputs{}), precision);
  });
} catch (const std::bad_alloc&) {
  core::fail_out_of_memory("reference", "computing the reference of", mechanism, q);
}

}  // namespace families
}  // namespace attn
