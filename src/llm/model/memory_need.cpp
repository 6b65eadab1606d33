// The bytes a decoder allocates, from its config: checked before the first allocation.
#include "model/memory_need.hpp"

#include <unistd.h>

#include <algorithm>

#include "attn/error.hpp"
#include "attn/info.hpp"
#include "model/architecture.hpp"

namespace attn::model {
namespace {

std::string sizes_text(const DecoderConfig& c) {
  return "vocab_size " + std::to_string(c.vocab_size) + ", dim " + std::to_string(c.dim) + ", hidden_dim " +
         std::to_string(c.hidden_dim) + ", heads " + std::to_string(c.heads) + ", kv_heads " + std::to_string(c.kv_heads) +
         ", head_dim " + std::to_string(c.head_dim) + ", " + std::to_string(c.layers.size()) + " layers, max_seq_len " +
         std::to_string(c.max_seq_len);
}

// Sums of products that fail, naming the config, on overflow.
class Bytes {
 public:
  Bytes(const DecoderConfig& c, const std::string& where, const char* what) : size_(c, where, what) {}
  int64_t mul(int64_t a, int64_t b) const { return size_.mul(a, b); }
  void add(int64_t a) { total_ = size_.add(total_, a); }
  void add(int64_t a, int64_t b, int64_t c = 1, int64_t d = 1) { add(mul(mul(a, b), mul(c, d))); }
  int64_t total() const { return total_; }
  const SizeCheck& size() const { return size_; }

 private:
  SizeCheck size_;
  int64_t total_ = 0;
};

}  // namespace

int64_t SizeCheck::mul(int64_t a, int64_t b) const {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) overflow();
  return r;
}

int64_t SizeCheck::add(int64_t a, int64_t b) const {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) overflow();
  return r;
}

void SizeCheck::overflow() const {
  fail(where_, std::string("the ") + what_ + " of this decoder overflow 64-bit byte counts (" + sizes_text(c_) + ")");
}

MemoryNeed memory_need(const DecoderConfig& c, int64_t bytes_per_32, const std::string& where) {
  Bytes w(c, where, "weights"), s(c, where, "run state");
  // the bytes of `values` matrix values, rounded up
  auto matrix_bytes = [&](int64_t values) { return w.size().add(w.mul(values, bytes_per_32), 31) / 32; };
  const int64_t f = sizeof(float), q_out = w.mul(c.heads, c.head_dim);
  // weights: matrices (held in memory unless mapped) and float32 norm vectors (always copied)
  w.add(matrix_bytes(w.mul(c.vocab_size, c.dim)));
  if (!c.tied_embeddings) w.add(matrix_bytes(w.mul(c.vocab_size, c.dim)));
  w.add(c.dim, f);
  // run state: one step's activations and logits
  const int64_t step = std::min(kStepTokens, c.max_seq_len);
  s.add(step, f, s.mul(3, c.dim));
  s.add(step, f, s.mul(5, q_out));
  s.add(step, f, s.mul(2, c.hidden_dim));
  s.add(step, f, c.vocab_size);
  const Architecture& arch = architecture(c.architecture, where);
  for (size_t i = 0; i < c.layers.size(); ++i) {
    const DecoderLayerSpec& l = c.layers[i];
    const int64_t kv_out = w.mul(l.lightning ? c.heads : c.kv_heads, c.head_dim);
    const WeightCount layer = arch.layer_weight_count(c, i, w.size());  // the architecture's tensors
    w.add(matrix_bytes(layer.matrix)), w.add(layer.vector, f);
    // a KV cache of max_seq_len rows (fewer when the mechanism looks back a bounded distance);
    // a state's size does not grow with the sequence and is left out
    const MechanismInfo facts = info(l.mechanism);
    if (facts.cache == CacheKind::state) continue;
    int64_t rows = c.max_seq_len;
    if (facts.lookback >= 0) {
      Bytes bound(c, where, "cache rows");
      bound.add(facts.sinks), bound.add(facts.lookback), bound.add(facts.align), bound.add(kBoundedSlack - 1);
      rows = std::min(rows, bound.total());
    }
    s.add(kv_out, rows, f, 2);
  }
  return {w.total(), s.total()};
}

int64_t memory_limit() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return INT64_MAX;  // unknown: only overflow is refused
  int64_t bytes;
  return __builtin_mul_overflow(static_cast<int64_t>(pages), static_cast<int64_t>(page), &bytes) ? INT64_MAX : bytes;
}

void check_memory_need(const DecoderConfig& c, int64_t bytes_per_32, const std::string& where) {
  const MemoryNeed need = memory_need(c, bytes_per_32, where);
  const int64_t limit = memory_limit();
  if (need.weights > limit || need.state > limit - need.weights)
    fail(where, "this decoder needs " + std::to_string(need.weights) + " bytes of weights and " +
                    std::to_string(need.state) + " bytes of run state, more than this machine's memory (" +
                    std::to_string(limit) + " bytes): " + sizes_text(c));
}

}  // namespace attn::model
