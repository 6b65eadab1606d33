// What a decoder of a given config will allocate, computed from the config alone (64-bit,
// overflow-checked), so that absurd sizes from a file or a caller are refused with the sizes
// named before anything is allocated.
#pragma once
#include <cstdint>
#include <string>

#include "attn/model.hpp"

namespace attn::model {

// Tokens per forward step (the activation buffers hold this many rows).
constexpr int64_t kStepTokens = 256;
// Queries per attention call of a layer whose cache is bounded: the rows its cache holds beyond
// the mechanism's own bound.
constexpr int64_t kBoundedSlack = 32;

// 64-bit products and sums of a config's sizes: an overflow is an Error from `where` naming `what`
// ("weights", "run state") and the config's sizes.
class SizeCheck {
 public:
  SizeCheck(const DecoderConfig& c, const std::string& where, const char* what) : c_(c), where_(where), what_(what) {}
  int64_t mul(int64_t a, int64_t b) const;
  int64_t add(int64_t a, int64_t b) const;

 private:
  [[noreturn]] void overflow() const;
  const DecoderConfig& c_;
  const std::string& where_;
  const char* what_;
};

struct MemoryNeed {
  int64_t weights = 0;  // bytes of weights made, packed or converted in memory (0 for mapped matrices)
  int64_t state = 0;    // activations, logits and KV caches for max_seq_len positions
};

// bytes_per_32: bytes held in memory per 32 matrix values (random weights: 32 x the dtype's size;
// dequantized GGUF: 128; quantized GGUF: 34, the most a packed or Q8_0-converted block takes), 0
// when matrices are read in place from a mapped file. Throws Error from `where` naming the
// config's sizes when a size overflows 64 bits.
MemoryNeed memory_need(const DecoderConfig& config, int64_t bytes_per_32, const std::string& where);

// The bound every decoder is checked against: this machine's physical memory.
int64_t memory_limit();

// memory_need, refused (Error from `where`, naming the sizes) above memory_limit().
void check_memory_need(const DecoderConfig& config, int64_t bytes_per_32, const std::string& where);

}  // namespace attn::model
