#include "cache_summary.hpp"

#include <fmt/core.h>

#include <map>

#include "text_model.hpp"

namespace attn::cli {

std::string cache_summary(const Decoder& d) {
  struct Group {
    int64_t layers = 0, rows = 0, bytes = 0;
  };
  std::map<std::string, Group> kinds;
  for (const LayerCache& l : d.layer_caches()) {
    Group& g = kinds[l.kind];
    ++g.layers, g.rows = l.rows, g.bytes = l.bytes;  // every layer of a kind has the same shape here
  }
  const auto layers = [](int64_t n) { return std::to_string(n) + (n == 1 ? " layer" : " layers"); };
  std::string out;
  const int64_t kv_layers = kinds.count("kv") ? kinds["kv"].layers : 0;
  if (kv_layers)
    out += fmt::format("KV {} x {} per token", layers(kv_layers),
                       bytes_text(static_cast<double>(d.kv_bytes_per_token() / kv_layers)));
  if (kinds.count("kv-bounded")) {
    const Group& g = kinds["kv-bounded"];
    out += fmt::format("{}bounded KV (window/chunk) {} x {} rows = {} each, fixed", out.empty() ? "" : "; ", layers(g.layers),
                       g.rows, bytes_text(static_cast<double>(g.bytes)));
  }
  if (kinds.count("state")) {
    const Group& g = kinds["state"];
    out += fmt::format("{}recurrent states {} x {}, fixed", out.empty() ? "" : "; ", layers(g.layers),
                       bytes_text(static_cast<double>(g.bytes)));
  }
  return out;
}

int64_t cache_bytes_at(const Decoder& d, int64_t tokens) {
  return d.kv_bytes_per_token() * tokens + d.bounded_cache_bytes() + d.state_bytes();
}

}  // namespace attn::cli
