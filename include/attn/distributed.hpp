// Sequence-parallel attention over MPI: one sequence split by tokens across the ranks of a
// communicator (library attn_distributed, built when CMake finds MPI; see docs/distributed.md).
//
// Sharding: attn/shards.hpp (the one rule, also the CLI's and Python's). Every shard is laid out like attend()'s inputs, (B, H, n_local, D) views of any strides and
// dtype; the functions below find each token's global position from the shard lengths (one small
// all-gather that also checks that every rank agrees on B, heads and dims: a disagreement is an
// attn::Error with the same message on every rank, never a hang).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "attn/attend.hpp"
#include "attn/backward.hpp"
#include "attn/mechanism.hpp"
#include "attn/shards.hpp"
#include "attn/tensor.hpp"

namespace attn::distributed {

// What a ring call did, for benchmarks and the communication model (docs/distributed.md).
struct RingStats {
  int64_t steps = 0;           // ring steps (ranks)
  int64_t blocks_computed = 0; // (query piece, key piece) pairs attended
  int64_t blocks_skipped = 0;  // pairs the pattern hides entirely (never computed)
  int64_t bytes_sent = 0;      // K/V bytes this rank sent
  double compute_seconds = 0;  // local attention and merging
  double wait_seconds = 0;     // blocked in MPI_Waitall after the local work of a step
  double total_seconds = 0;
};

struct RingOptions {
  bool zigzag_auto = true;      // shards are zig-zag when the mechanism is causal, else contiguous
  bool return_lse = false;
  int threads = 0;              // threads per rank (0: the CPUs the rank may use)
  // Packed sequences (as attend_varlen): sequence t is global tokens [cu_seqlens[t],
  // cu_seqlens[t + 1]) of the whole stream (batch 1; the same offsets on every rank, from 0 to
  // the total). Each sequence has its own pattern (causal, window, ... within it); tokens of
  // different sequences never see each other. Empty: one sequence per batch entry.
  std::vector<int64_t> cu_seqlens;
  RingStats* stats = nullptr;   // filled when given
};

// Ring attention: each rank holds its shard of q, k and v (same token positions for all three);
// the K/V shards travel around the ring (MPI_Isend/MPI_Irecv of the next shard overlapped with
// the local work on the current one); the partial results of every (query piece, key piece) pair
// merge by the log-sum-exp rule (core::merge_partials) in ring order. Mechanisms: softmax (causal,
// window, sinks, dilation, strided, chunk, softcap, cosine scores), longformer and bigbird, with
// GQA. Pairs the pattern hides entirely are skipped; partially visible pairs run with the exact
// global positions. Returns this rank's rows of attend() on the whole sequence: out (B, H, n_local,
// Dv) in q's dtype and layout, lse (B, H, n_local, 1) when asked. With options.cu_seqlens: packed
// sequences of different lengths sharded as one stream (equals attend_varlen on the whole).
AttendResult ring_attention(const TensorView& q, const TensorView& k, const TensorView& v, MPI_Comm comm,
                            const Mechanism& mechanism = Softmax{}, const RingOptions& options = {});

// Backward through the ring: the gradients of ring_attention's output for this rank's shards.
// dout, out and lse (B, H, n_local, 1 float32) are this rank's rows (out and lse as ring_attention
// returned them, with the same mechanism and options). The K/V shards travel around the ring as in
// the forward, each with float32 dK/dV accumulators that collect every rank's share (the pair's
// attend_backward with the whole row's out and lse) and come back to their owner after R moves.
// Returns dq (B, H, n_local, D), dk, dv (B, Hkv, n_local, D|Dv) in the inputs' dtypes, bhnd.
// Mechanisms as the forward, score=dot.
AttendGradients ring_attention_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                                        const TensorView& v, const TensorView& out, const TensorView& lse, MPI_Comm comm,
                                        const Mechanism& mechanism = Softmax{}, const RingOptions& options = {});

// Decode against a KV cache sharded by tokens: every rank passes the same q (B, H, Nq, D) and its
// shard of keys/values (B, Hkv, m_r, D|Dv), m_r >= 0; every query sees every cached key (softmax
// with its scale/softcap/score; no pattern). Each rank attends its shard with the log-sum-exp,
// one MPI_Allgather of (out, lse) and a merge in rank order give every rank the same result,
// bitwise, whatever the thread count.
AttendResult decode(const TensorView& q, const TensorView& k_shard, const TensorView& v_shard, MPI_Comm comm,
                    const Softmax& mechanism = {}, bool return_lse = false);

// Linear attention across ranks (LASP-2 style), contiguous shards: each rank computes its shard's
// state contribution (attend() with return_final_state); one MPI_Allgather of the states gives
// every rank its prefix (causal: P_r = decay^(n_(r-1)) P_(r-1) + S_(r-1); non-causal: the sum of
// the other ranks' states); the shard then runs with the prefix as params["initial_state"].
// Returns this rank's out and, when asked, the final state of the whole sequence (the same on
// every rank). Mechanism: linear (any feature map, normalize, scalar decay).
AttendResult linear_attention(const TensorView& q, const TensorView& k, const TensorView& v, MPI_Comm comm,
                              const Linear& mechanism, bool return_final_state = false, int threads = 0);

// Its backward: dq, dk, dv of this rank's shard (bhnd, the inputs' dtypes) for dout (this rank's
// rows of the output's gradient) and, when given, dfinal_state (the gradient of the whole
// sequence's final state, float32, the same on every rank). The prefix states are rebuilt as in
// the forward; each rank's outputs' gradient with respect to its initial state is all-gathered
// once, and every rank folds them (backwards, with the decay, when causal) into the gradient that
// flows into its own final state, which its local backward then takes as dfinal_state.
AttendGradients linear_attention_backward(const TensorView& dout, const TensorView& q, const TensorView& k,
                                          const TensorView& v, MPI_Comm comm, const Linear& mechanism,
                                          const TensorView* dfinal_state = nullptr, int threads = 0);

}  // namespace attn::distributed
