// How the quadratic backward forms (softmax tiled, GAU tiled) split their work so the result is
// bitwise the same for any thread count: tasks are (batch entry, kv head, segment of query blocks).
// A task walks its kv head's query heads and its query blocks in a fixed order, owns their dQ rows
// and sums dK and dV of its kv head over them. Problems with few (batch, kv head) pairs split the
// query blocks into segments so that at least kMinTasks tasks exist; each segment then keeps its
// own dK/dV partial sums, added in segment order afterwards. The segment count depends on the
// problem only, never on the thread count.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "base/aligned_buffer.hpp"
#include "base/parallel.hpp"
#include "core/backward_views.hpp"
#include "core/io_checks.hpp"
#include "kernels/kernel_table.hpp"

namespace attn::core {

class KvGradientTasks {
 public:
  static constexpr int64_t kMinTasks = 8;

  // q_blocks: the query blocks of one head; requested: the caller's thread count (0: default).
  KvGradientTasks(const Dims& p, int64_t q_blocks, int requested)
      : p_(p), q_blocks_(std::max<int64_t>(1, q_blocks)), pairs_(p.B * p.Hkv),
        segments_(std::min(q_blocks_, (kMinTasks + pairs_ - 1) / std::max<int64_t>(pairs_, 1))),
        threads_(resolve_threads(requested, pairs_ * segments_)) {}

  // The thread count the parallel region runs on: size one scratch per thread before run().
  int threads() const { return threads_; }
  // How many tasks there are, and the index in [0, count()) of the task run() hands (b, hk, qb0):
  // for sums of the caller's own (learned params' gradients) kept per task and added in task order.
  int64_t count() const { return pairs_ * segments_; }
  int64_t index(int64_t b, int64_t hk, int64_t qb0) const {
    int64_t seg = 0;
    while (seg + 1 < segments_ && q_blocks_ * (seg + 1) / segments_ <= qb0) ++seg;
    return (b * p_.Hkv + hk) * segments_ + seg;
  }

  // fn(b, hk, qb0, qb1, dk, dv, thread) for every task, in parallel: query blocks [qb0, qb1) of
  // kv head hk of batch entry b, dk (M x D) and dv (M x Dv) float32 sums zeroed for it. Then dK
  // and dV are written from the sums (keys past the batch's valid length get 0). Allocates before
  // its parallel regions only.
  template <class Fn>
  void run(const BackwardViews& g, const kernels::TileKernels& kern, Fn&& fn) const {
    const int64_t M = p_.M, D = p_.D, Dv = p_.Dv, tasks = pairs_ * segments_;
    const bool split = segments_ > 1;
    // split: one (M x D, M x Dv) pair per task, kept for the reduction; else one per thread
    const int64_t holders = split ? tasks : threads_;
    AlignedFloats sum_k(static_cast<size_t>(holders * M * D)), sum_v(static_cast<size_t>(holders * M * Dv));
    std::vector<AlignedFloats> rows(static_cast<size_t>(threads_));
    for (AlignedFloats& r : rows) r.resize(static_cast<size_t>(D + Dv + std::max(D, Dv)));
    parallel_for(tasks, threads_, [&](int64_t task, int tid) {
      const int64_t pair = task / segments_, seg = task % segments_;
      const int64_t holder = split ? task : tid;
      float* dk = sum_k.data() + holder * M * D;
      float* dv = sum_v.data() + holder * M * Dv;
      std::fill(dk, dk + M * D, 0.0f);
      std::fill(dv, dv + M * Dv, 0.0f);
      fn(pair / p_.Hkv, pair % p_.Hkv, q_blocks_ * seg / segments_, q_blocks_ * (seg + 1) / segments_, dk, dv, tid);
      if (!split)
        for (int64_t j = 0; j < M; ++j) write(g, kern, pair, j, dk + j * D, dv + j * Dv, rows[static_cast<size_t>(tid)].data());
    });
    if (!split) return;
    // The segments' partial sums, added in segment order: one item per (pair, block of 64 keys).
    constexpr int64_t kKeys = 64;
    const int64_t key_blocks = (M + kKeys - 1) / kKeys;
    parallel_for(pairs_ * key_blocks, threads_, [&](int64_t item, int tid) {
      const int64_t pair = item / key_blocks, j0 = item % key_blocks * kKeys;
      float* dk = rows[static_cast<size_t>(tid)].data();
      float* dv = dk + D;
      for (int64_t j = j0; j < std::min(j0 + kKeys, M); ++j) {
        std::fill(dk, dk + D, 0.0f);
        std::fill(dv, dv + Dv, 0.0f);
        for (int64_t seg = 0; seg < segments_; ++seg) {
          const int64_t task = pair * segments_ + seg;
          const float* pk = sum_k.data() + (task * M + j) * D;
          const float* pv = sum_v.data() + (task * M + j) * Dv;
          for (int64_t c = 0; c < D; ++c) dk[c] += pk[c];
          for (int64_t c = 0; c < Dv; ++c) dv[c] += pv[c];
        }
        write(g, kern, pair, j, dk, dv, dv + Dv);
      }
    });
  }

 private:
  // Row j of dK and dV of (batch, kv head) pair `pair` from float32 sums; `zeros` has
  // max(D, Dv) floats of scratch.
  void write(const BackwardViews& g, const kernels::TileKernels& kern, int64_t pair, int64_t j, const float* dk,
             const float* dv, float* zeros) const {
    const int64_t b = pair / p_.Hkv, hk = pair % p_.Hkv;
    const bool valid = j < p_.kv_len[static_cast<size_t>(b)];
    if (!valid) std::fill(zeros, zeros + std::max(p_.D, p_.Dv), 0.0f);
    kern.from_float(valid ? dk : zeros, g.dk.dtype, g.dk.strides[3], p_.D, g.dk.ptr(b, hk, j));
    kern.from_float(valid ? dv : zeros, g.dv.dtype, g.dv.strides[3], p_.Dv, g.dv.ptr(b, hk, j));
  }

  const Dims& p_;
  int64_t q_blocks_, pairs_, segments_;
  int threads_;
};

}  // namespace attn::core
