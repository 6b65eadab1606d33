// attn bench --backward: one bench run's backward, ready to time. The forward runs once (its out
// and lse are the backward's inputs, as in training); each timed call is one attend_backward,
// allocation of dq, dk, dv included, as a caller pays it.
#pragma once
#include <random>
#include <string>

#include "attn/attn.hpp"
#include "families/internal_api.hpp"
#include "harness/inputs.hpp"
#include "workload.hpp"

namespace attn::cli {

// FLOPs of a backward: 2.5 x the forward's. Per visible (query, key) pair the forward does
// q.k and p.v (2 (D + Dv) FLOPs: 4 d at Dv = D); the backward recomputes q.k (2 D) and does
// dO.v (2 Dv), dV += p dO (2 Dv), dQ += dS k (2 D), dK += dS q (2 D): 10 d = 2.5 x the forward's
// 4 d, the count flash-attention's benchmarks use. A form that does more (a second pass for dQ)
// is not credited for it.
inline constexpr double kBackwardFlopsPerForwardFlop = 2.5;

struct TimedBackward {
  harness::Inputs in;
  AttendResult forward;
  harness::Buffer dout;
  std::string form;     // the backward walk's choice; "" when the mechanism has no backward
  std::string refusal;  // why it has none

  explicit TimedBackward(const harness::Case& c, Precision precision = Precision::automatic) {
    harness::make_inputs(c, in);
    in.options.precision = precision;
    in.options.return_final_state = in.options.return_probs = in.options.return_stats = false;
    AttendOptions o = in.options;
    o.return_lse = false;
    refusal = families::backward_refusal(in.q.view, in.k.view, in.v.view, in.mechanism, o);
    if (!refusal.empty()) return;
    form = explain_backward(in.q.view, in.k.view, in.v.view, in.mechanism, o).chosen;
    forward = attend(in.q.view, in.k.view, in.v.view, in.mechanism, in.options);  // return_lse as the family has it
    std::mt19937 rng(c.seed ^ 0x9e3779b9u);
    dout = harness::random_tensor(rng, c.dtype, c.B, c.H, c.N, c.Dv, c.layout);
    in.options.return_lse = false;  // the backward's options: the forward's, returning nothing
  }

  // Best of `reps` backward calls on `threads` threads (after warm-up).
  double seconds(int threads, int reps) {
    in.options.threads = threads;
    return best_seconds(reps, [&] {
      attend_backward(dout.view, in.q.view, in.k.view, in.v.view, forward.out.view(), forward.lse.view(), in.mechanism,
                      in.options);
    });
  }
};

}  // namespace attn::cli
