// attn serve's GET /metrics: the engine's figures (attn/engine.hpp, EngineMetrics) and the HTTP
// responses by status, in Prometheus' text exposition format (version 0.0.4): a # HELP and a
// # TYPE line per family, counters ending in _total, histograms as cumulative _bucket{le=...}
// lines up to le="+Inf", then _sum and _count.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "attn/engine.hpp"

namespace attn::cli::serve {

// `requests`: responses sent by HTTP status. `engine` null (the model still loading): the
// engine's families are written with zeros, so that scrapers see every name from the start.
std::string metrics_text(const EngineMetrics* engine, const std::map<int, int64_t>& requests);

}  // namespace attn::cli::serve
