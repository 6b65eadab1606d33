// Read orders of a decode call's KV cache, without arithmetic: how fast each order reads memory.
//
// The issue-18 case (32768 keys, 8 kv heads of 128 bfloat16 channels, flash-attn's (B, M, Hkv, D)
// layout, so each key's rows of all heads are one 2 KiB stretch) on two threads, each thread
// taking half of the keys. Every order touches each byte of K and V once, with one vector load
// per 64-byte line added into four accumulators; four K/V pairs are cycled so that each pass reads
// from memory. Prints the best of 8 passes per order in ms, GB/s and the ratio to `sequential`.
//
//   g++ -O2 -mavx512f -fopenmp -std=c++20 bench/read_orders.cpp -o /tmp/read_orders && /tmp/read_orders
//
// Orders (PF: software prefetch distance in keys, env PF, default 16):
//   sequential    K then V of the thread's keys in address order; hardware prefetch only
//   kernel        what the rows form does today: per 256-key block, per kv head, its K rows (the
//                 row PF keys ahead prefetched, and the same key's V row prefetched beside), then
//                 that head's V rows
//   kernel-hw     the same order without software prefetch
//   key-major     per key, heads in fours as a 1-key x 4-head tile loads them (line l of the four
//                 rows, then line l + 1), K then V; hardware prefetch only
//   pairs         per pair of keys, head by head (2 KiB jumps inside the pair); hardware only
//   pairs-pf      the same with each pair's K stretch prefetched PF keys ahead, V beside
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr size_t kKeys = 32768, kHeads = 8, kRow = 256, kKeyBytes = kHeads * kRow, kBlock = 256;
constexpr int kThreads = 2, kCaches = 4;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Acc {
  __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  void row(const char* p) {  // the four lines of one head's row
    for (int l = 0; l < 4; ++l) line(l, p + 64 * l);
  }
  void line(int x, const char* p) { a[x] = _mm512_add_ps(a[x], _mm512_load_ps(reinterpret_cast<const float*>(p))); }
  float sum() const {
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
  }
};

void prefetch(const char* p, size_t bytes) {
  for (size_t l = 0; l < bytes; l += 64) _mm_prefetch(p + l, _MM_HINT_T1);
}

// Keys [k0, k1) of K and V in `order`.
float pass(const std::string& order, const char* k, const char* v, size_t k0, size_t k1, size_t pf) {
  Acc acc;
  const auto at = [](const char* base, size_t key, size_t head) { return base + key * kKeyBytes + head * kRow; };
  if (order == "sequential") {
    for (const char* base : {k, v})
      for (size_t j = k0; j < k1; ++j)
        for (size_t h = 0; h < kHeads; ++h) acc.row(at(base, j, h));
  } else if (order == "key-major") {  // as a tile of 1 key x 4 heads loads: line l of the four rows, then l + 1
    for (const char* base : {k, v})
      for (size_t j = k0; j < k1; ++j)
        for (size_t h = 0; h < kHeads; h += 4)
          for (int l = 0; l < 4; ++l)
            for (size_t x = 0; x < 4; ++x)
              acc.line(static_cast<int>(x), at(base, j, h + x) + 64 * l);
  } else if (order == "kernel" || order == "kernel-hw") {
    const bool soft = order == "kernel";
    for (size_t b = k0; b < k1; b += kBlock)
      for (size_t h = 0; h < kHeads; ++h) {
        for (size_t j = b; j < b + kBlock; ++j) {
          if (soft) prefetch(at(k, j + pf, h), kRow), prefetch(at(v, j, h), kRow);
          acc.row(at(k, j, h));
        }
        for (size_t j = b; j < b + kBlock; ++j) acc.row(at(v, j, h));
      }
  } else if (order == "pairs" || order == "pairs-pf") {
    const bool soft = order == "pairs-pf";
    for (size_t b = k0; b < k1; b += kBlock) {
      for (size_t g = b; g < b + kBlock; g += 2) {
        if (soft) prefetch(at(k, g + pf, 0), 2 * kKeyBytes), prefetch(at(v, g, 0), 2 * kKeyBytes);
        for (size_t h = 0; h < kHeads; ++h) acc.row(at(k, g, h)), acc.row(at(k, g + 1, h));
      }
      for (size_t g = b; g < b + kBlock; g += 2)
        for (size_t h = 0; h < kHeads; ++h) acc.row(at(v, g, h)), acc.row(at(v, g + 1, h));
    }
  } else {
    std::fprintf(stderr, "unknown order '%s'\n", order.c_str());
    std::exit(2);
  }
  return acc.sum();
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = kKeys * kKeyBytes;
  const size_t pf = std::getenv("PF") ? std::strtoul(std::getenv("PF"), nullptr, 10) : 16;
  std::vector<char*> ks, vs;
  for (int c = 0; c < kCaches; ++c)
    for (auto* list : {&ks, &vs}) {
      // room for prefetches past the end; values are random so that no page is all one value
      char* p = static_cast<char*>(std::aligned_alloc(4096, bytes + 64 * kKeyBytes));
      for (size_t i = 0; i < bytes + 64 * kKeyBytes; i += 4) *reinterpret_cast<int*>(p + i) = std::rand() & 0x3fff;
      list->push_back(p);
    }
  std::vector<std::string> orders(argv + 1, argv + argc);
  if (orders.empty()) orders = {"sequential", "kernel", "kernel-hw", "key-major", "pairs", "pairs-pf"};
  double first = 0;
  int turn = 0;
  for (const std::string& order : orders) {
    double best = 1e9;
    for (int rep = 0; rep < 8; ++rep, ++turn) {
      const char* k = ks[turn % kCaches];
      const char* v = vs[turn % kCaches];
      float total = 0;
      const double t0 = now();
#pragma omp parallel num_threads(kThreads) reduction(+ : total)
      {
        const size_t t = static_cast<size_t>(omp_get_thread_num()), half = kKeys / kThreads;
        total += pass(order, k, v, t * half, (t + 1) * half, pf);
      }
      best = std::min(best, now() - t0);
      if (total == -1) std::puts("");  // keeps the sums
    }
    if (first == 0) first = best;
    std::printf("%-12s %6.2f ms %6.1f GB/s %5.2f\n", order.c_str(), best * 1e3, 2.0 * bytes / best / 1e9, first / best);
  }
}
