// The causal recurrence, one token at a time: S = decay S + phi(k_t) v_t^T, z = decay z + phi(k_t),
// o_t = phi(q_t) S / phi(q_t) . z. O(F Dv) per token whatever its position: the decoding form
// (pass the state along with initial_state / final_state).
#include "base/parallel.hpp"
#include "linear/head_state.hpp"

namespace attn::linear {
namespace {

constexpr int64_t kMaxTokens = 64;

// One thread's state and rows, sized before the parallel region (which must not allocate).
struct Scratch {
  HeadState st;
  std::vector<float> fq, fk, v, num, raw;
  explicit Scratch(const LinearProblem& p)
      : st(p), fq(static_cast<size_t>(p.F)), fk(static_cast<size_t>(p.F)), v(static_cast<size_t>(p.Dv)),
        num(static_cast<size_t>(p.Dv)), raw(static_cast<size_t>(p.D)) {}
};

}  // namespace

void refuse_recurrent(const LinearProblem& p, const core::Outputs& o, core::Reasons& why) {
  if (!p.mech.causal) why.push_back("not causal (the right product sums all keys at once)");
  if (p.N > kMaxTokens)
    why.push_back([&] {
      return std::to_string(p.N) + " tokens > " + std::to_string(kMaxTokens) +
             " (the chunked form runs them as matrix products)";
    });
  core::refuse_probs(p, o, why);  // row statistics: linear_row_stats after the form
}

void run_recurrent(const LinearProblem& p, const core::Outputs& o, const core::Context& ctx) {
  const kernels::TileKernels& kern = *ctx.kern;
  const int64_t items = p.B * p.H;
  const int threads = resolve_threads(ctx.threads, items);
  std::vector<Scratch> scratch(static_cast<size_t>(threads), Scratch(p));
  parallel_for(items, threads, [&](int64_t item, int thread) {
    const int64_t b = item / p.H, h = item % p.H, hk = p.kv_head(h), len = p.kv_len[static_cast<size_t>(b)];
    const float lambda = static_cast<float>(p.decay[static_cast<size_t>(h)]);
    Scratch& s = scratch[static_cast<size_t>(thread)];  // every buffer is written before it is read
    HeadState& st = s.st;
    st.load(p, b, h);
    if (len == 0) st.store(p, o, b, h);
    std::vector<float> &fq = s.fq, &fk = s.fk, &v = s.v, &num = s.num, &raw = s.raw;
    for (int64_t t = 0; t < p.N; ++t) {
      st.decay(lambda);
      if (t < len) {
        load_features(kern, p, false, b, hk, t, 1, len, 1.0f, raw.data(), fk.data());
        load_rows(kern, p.v, b, hk, t, 1, len, v.data(), p.Dv);
        kern.axpy_rows(fk.data(), p.F, v.data(), DType::f32, p.Dv, st.S.data());
        if (p.mech.normalize)
          for (int64_t f = 0; f < p.F; ++f) st.z[static_cast<size_t>(f)] += fk[static_cast<size_t>(f)];
        if (t == len - 1) st.store(p, o, b, h);
      }
      load_features(kern, p, true, b, h, t, 1, p.N, static_cast<float>(p.scale), raw.data(), fq.data());
      kern.gemm(1, p.Dv, p.F, fq.data(), p.F, 1, st.S.data(), p.Dv, num.data(), p.Dv, false);
      const float den = p.mech.normalize ? dot(fq.data(), st.z.data(), p.F) : 0.0f;
      write_row(kern, p, o, b, h, t, num.data(), den);
    }
  });
}

}  // namespace attn::linear
