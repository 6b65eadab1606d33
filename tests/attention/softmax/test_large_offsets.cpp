// No index above 2^31 is computed in 32 bits: inputs whose second head, and whose later keys,
// sit past element 2^31 of their buffer give the same values as the same problem in a small
// contiguous copy, through the tiled, rows and decode (N = 1 and KV cache) forms.
//
// The buffer is one sparse anonymous mapping of ~55 GB address space (MAP_NORESERVE): only the
// pages of the rows the test writes are ever touched (a few MiB), so any machine runs it.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cmath>
#include <cstring>
#include <random>

#include "attn/attn.hpp"

namespace attn {
namespace {

constexpr int64_t D = 24, kKeys = 1100;
constexpr int64_t kTokenStride = int64_t{1} << 21;  // elements: key 1099 sits at ~2^31.1
// elements: head 1 starts past every row of head 0, and past 2^31
constexpr int64_t kHeadStride = kKeys * kTokenStride + 4096;

// A sparse float32 region of `elements` elements, unmapped on destruction.
struct Sparse {
  explicit Sparse(int64_t elements) : bytes(static_cast<size_t>(elements) * sizeof(float)) {
    p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  }
  ~Sparse() {
    if (p != MAP_FAILED) munmap(p, bytes);
  }
  float* data() const { return static_cast<float*>(p); }
  size_t bytes;
  void* p;
};

// (1, 2, n, D) with head stride kHeadStride and token stride `token_stride`, at `base` elements
// into the region; filled with the same values as the small contiguous `small`.
TensorView spread(const Sparse& s, int64_t base, int64_t n, int64_t token_stride, const std::vector<float>& small) {
  TensorView v;
  v.data = s.data() + base;
  v.dtype = DType::f32;
  v.shape = {1, 2, n, D};
  v.strides = {2 * kHeadStride, kHeadStride, token_stride, 1};
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(v.ptr(0, h, i), &small[static_cast<size_t>((h * n + i) * D)], D * sizeof(float));
  return v;
}

void expect_same(const AttendResult& a, const AttendResult& b, const std::string& what) {
  const TensorView &x = a.out.view(), &y = b.out.view();
  ASSERT_EQ(x.shape, y.shape) << what;
  double worst = 0;
  for (int64_t h = 0; h < x.shape[1]; ++h)
    for (int64_t i = 0; i < x.shape[2]; ++i)
      for (int64_t d = 0; d < x.shape[3]; ++d) worst = std::max(worst, double(std::abs(x.at(0, h, i, d) - y.at(0, h, i, d))));
  EXPECT_LE(worst, 1e-6) << what << ": the spread-out problem differs from its contiguous copy";
}

TEST(LargeOffsets, HeadsAndKeysPastTwoToThe31GiveTheSmallCopysValues) {
  const int64_t N = 70, M = kKeys;
  ASSERT_GT((M - 1) * kTokenStride, int64_t{1} << 31);
  // q, k, v one after another: q's rows are close together, k's and v's far apart
  const int64_t q_at = 0, k_at = 2 * kHeadStride, v_at = 4 * kHeadStride;
  Sparse s(6 * kHeadStride);
  ASSERT_NE(s.p, MAP_FAILED) << "cannot reserve " << s.bytes << " bytes of address space";
  std::mt19937 rng(31);
  std::normal_distribution<float> nd;
  auto fill = [&](int64_t n) {
    std::vector<float> x(static_cast<size_t>(2 * n * D));
    for (float& e : x) e = nd(rng);
    return x;
  };
  const std::vector<float> qs = fill(N), ks = fill(M), vs = fill(M);
  const TensorView q = spread(s, q_at, N, D, qs), k = spread(s, k_at, M, kTokenStride, ks),
                   v = spread(s, v_at, M, kTokenStride, vs);
  EXPECT_GT(q.offset(0, 1, 0, 0), int64_t{1} << 31);
  auto small = [](const std::vector<float>& x, int64_t n) {
    return make_view(const_cast<float*>(x.data()), DType::f32, 1, 2, n, D);
  };
  // the first n rows of each head of q, spread and small
  auto first_rows = [&](int64_t n) {
    TensorView spread_q = q;
    spread_q.shape[2] = n;
    std::vector<float> x(static_cast<size_t>(2 * n * D));
    for (int64_t h = 0; h < 2; ++h) std::copy_n(qs.begin() + h * N * D, n * D, x.begin() + h * n * D);
    return std::make_pair(spread_q, x);
  };
  for (const char* form : {"tiled", "rows"})
    for (const char* mech : {"softmax", "softmax:causal", "softmax:window=300:0"}) {
      AttendOptions o;
      o.form = form;
      const auto [qf, qx] = first_rows(std::string(form) == "rows" ? 16 : N);  // rows: up to 16 query rows
      expect_same(attend(qf, k, v, parse_mechanism(mech), o),
                  attend(small(qx, qf.shape[2]), small(ks, M), small(vs, M), parse_mechanism(mech), o),
                  std::string(form) + " " + mech);
    }
  // decode: one query against every key
  const auto [q1, q1small] = first_rows(1);
  expect_same(attend(q1, k, v, parse_mechanism("softmax:causal")),
              attend(small(q1small, 1), small(ks, M), small(vs, M), parse_mechanism("softmax:causal")), "decode");
  // a KV cache whose rows lie past 2^31, with new keys appended there
  KvCacheUpdate up;
  up.cache_seqlens = {M - 5};
  std::vector<float> knew(static_cast<size_t>(2 * 5 * D)), vnew(knew.size());
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 5; ++i)
      for (int64_t d = 0; d < D; ++d) {
        knew[static_cast<size_t>((h * 5 + i) * D + d)] = ks[static_cast<size_t>((h * M + M - 5 + i) * D + d)];
        vnew[static_cast<size_t>((h * 5 + i) * D + d)] = vs[static_cast<size_t>((h * M + M - 5 + i) * D + d)];
      }
  up.k = small(knew, 5);
  up.v = small(vnew, 5);
  for (int64_t h = 0; h < 2; ++h)  // the cache's last 5 rows are written by the call
    for (int64_t i = M - 5; i < M; ++i) std::memset(k.ptr(0, h, i), 0, D * sizeof(float)), std::memset(v.ptr(0, h, i), 0, D * sizeof(float));
  expect_same(attend_with_kvcache(q1, k, v, up, parse_mechanism("softmax:causal")),
              attend(small(q1small, 1), small(ks, M), small(vs, M), parse_mechanism("softmax:causal")), "kv cache");
  for (int64_t h = 0; h < 2; ++h)
    EXPECT_EQ(k.at(0, h, M - 1, D - 1), ks[static_cast<size_t>((h * M + M - 1) * D + D - 1)]) << "the appended key";
}

}  // namespace
}  // namespace attn
