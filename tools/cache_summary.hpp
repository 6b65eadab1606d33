// What a decoder's caches hold, per layer kind, for `attn generate` and `attn chat`.
#pragma once
#include <cstdint>
#include <string>

#include "attn/model.hpp"

namespace attn::cli {

// "KV 2 layers x 12 KiB per token; window/chunk KV 28 layers x 292 rows = 876 KiB; states ...".
std::string cache_summary(const Decoder& d);
// Bytes the caches hold at `tokens` of context.
int64_t cache_bytes_at(const Decoder& d, int64_t tokens);

}  // namespace attn::cli
