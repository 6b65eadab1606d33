// The backward mode of the case list: every (case, backward form, ISA) whose mechanism has a
// backward, its dq, dk, dv against the family's float64 backward reference under the gradients'
// rule, and bitwise the same on 1 and 3 threads (harness/backward_check.hpp). Test names are the
// run names: --gtest_filter='Backward/*rows*avx2*'.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <set>

#include "families/internal_api.hpp"
#include "harness/backward_check.hpp"

namespace attn::harness {
namespace {

// The inputs and gradient references of the last case checked: runs of one case are consecutive.
struct Prepared {
  const Case* c = nullptr;
  std::unique_ptr<Inputs> in;
  GradientReferences ref;
};

const Prepared& prepared(const Case& c) {
  static Prepared cache;
  if (cache.c != &c) {
    cache.in = std::make_unique<Inputs>();
    make_inputs(c, *cache.in);
    cache.ref = gradient_references_for(c, *cache.in);
    cache.c = &c;
  }
  return cache;
}

class BackwardCaseList : public ::testing::TestWithParam<harness::Run> {};

TEST_P(BackwardCaseList, WithinTolerance) {
  const harness::Run& r = GetParam();
  const Prepared& p = prepared(*r.c);
  const Outcome o = check_backward_run(r, *p.in, p.ref);
  EXPECT_TRUE(o.pass) << o.failure;
  EXPECT_EQ(o.form, r.form) << "the forced backward form did not run";
}

INSTANTIATE_TEST_SUITE_P(Backward, BackwardCaseList, ::testing::ValuesIn(expand_backward(case_list(), {})),
                         [](const auto& info) { return info.param.name(); });

TEST(BackwardCaseListShape, NamesAreUniqueAndEveryFastFormIsCovered) {
  std::set<std::string> names, forms;
  for (const harness::Run& r : expand_backward(case_list(), {})) {
    EXPECT_TRUE(names.insert(r.name()).second) << "duplicate run " << r.name();
    forms.insert(r.form);
  }
  // every fast backward form of every family (softmax: tiled, rows, scores; GAU: tiled; linear: chunked,
  // right; linformer: projected; lsh: chunked; efficient: online; dca: parts; qsoftmax: right, recurrent)
  EXPECT_EQ(forms, (std::set<std::string>{"chunked", "online", "parts", "projected", "recurrent", "right", "rows",
                                          "scores", "tiled", "tiled_bf16"}));
  EXPECT_GE(names.size(), 450u);  // about 190 problems of the softmax family, each on 3 ISAs at least
}

// A family whose default mechanism has a backward is in the backward mode, through at least
// one of its check cases; a family without one is not (asked of the family, not listed here).
TEST(BackwardCaseListShape, EveryFamilyWithABackwardIsIn) {
  std::set<std::string> ops;
  for (const harness::Run& r : expand_backward(case_list(), {})) ops.insert(r.c->op());
  for (const MechanismInfo& family : family_infos()) {
    Case c;
    c.mechanism = family.text;
    c.N = c.M = 256, c.D = c.Dv = 8;  // (linformer's default k = 256 needs as many keys)
    Inputs in;
    make_inputs(c, in, /*shapes_only=*/true);
    const std::string why = families::backward_refusal(in.q.view, in.k.view, in.v.view, in.mechanism, in.options);
    EXPECT_EQ(ops.count(family.family), why.empty() ? 1u : 0u) << family.family << ": " << (why.empty() ? "has a backward" : why);
  }
  EXPECT_FALSE(ops.empty());
}

// The backward runs are a committed manifest (tests/harness/backward_runs.txt, one `case__form`
// per line, the same on every ISA), as the check runs are (test_case_list.cpp). After a deliberate
// change: ATTN_UPDATE_MANIFEST=1 attn_check --gtest_filter='*BackwardManifest*'.
TEST(BackwardCaseListShape, RunsEqualTheBackwardManifest) {
  const std::string path = std::string(ATTN_SOURCE_DIR) + "/tests/harness/backward_runs.txt";
  std::map<Isa, std::set<std::string>> by_isa;
  for (const harness::Run& r : expand_backward(case_list(), {})) {
    const std::string name = r.name();
    by_isa[r.isa].insert(name.substr(0, name.rfind("__")));
  }
  ASSERT_EQ(by_isa.size(), supported_isas().size());
  const std::set<std::string>& ours = by_isa.at(Isa::portable);
  if (const char* u = std::getenv("ATTN_UPDATE_MANIFEST"); u && std::string(u) == "1") {
    std::ofstream out(path);
    for (const std::string& n : ours) out << n << "\n";
    ASSERT_TRUE(out.good()) << "cannot write " << path;
  }
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "cannot read " << path;
  std::set<std::string> listed;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) listed.insert(line);
  for (const auto& [isa, names] : by_isa) {
    SCOPED_TRACE(isa_name(isa));
    std::vector<std::string> missing, extra;
    std::set_difference(listed.begin(), listed.end(), names.begin(), names.end(), std::back_inserter(missing));
    std::set_difference(names.begin(), names.end(), listed.begin(), listed.end(), std::back_inserter(extra));
    for (const std::string& n : missing) ADD_FAILURE() << "listed backward run does not run (gone or refused): " << n;
    for (const std::string& n : extra) ADD_FAILURE() << "backward run not in the manifest: " << n;
    if (!missing.empty() || !extra.empty())
      ADD_FAILURE() << "after a deliberate change, rewrite " << path
                    << " with ATTN_UPDATE_MANIFEST=1 attn_check --gtest_filter='*BackwardManifest*' and review its diff";
  }
}

TEST(BackwardCaseListShape, FiltersSelectRuns) {
  Filter f;
  f.form = "reference";
  f.isa = "portable";
  f.case_substring = "longformer";
  const auto runs = expand_backward(case_list(), f);
  ASSERT_FALSE(runs.empty());
  for (const harness::Run& r : runs) {
    EXPECT_EQ(r.form, "reference");
    EXPECT_EQ(r.isa, Isa::portable);
    EXPECT_EQ(r.c->op(), "longformer");
  }
}

// The rule itself, for the first case of every (family, dtype) in the backward mode whose three
// gradients are not all (near) zero: the float64
// reference passes, and the same gradients with the largest element of one of them off by 0.1 %
// (float32) or 10 % (bf16, fp16: the plain baseline's intermediates are rounded to 8 or 11 bits),
// or all of it scaled by as much, fail.
TEST(BackwardToleranceRule, APerturbationFailsEveryFamilyAndDtype) {
  std::set<std::pair<std::string, DType>> seen, in_mode;
  for (const harness::Run& r : expand_backward(case_list(), {})) {
    const Case& c = *r.c;
    in_mode.insert({c.op(), c.dtype});
    if (seen.count({c.op(), c.dtype})) continue;
    const Prepared& p = prepared(c);
    bool all_nonzero = true;  // a gradient that is all zeros (one key: dk = 0) cannot be perturbed
    for (const Tensor* g : {&p.ref.f64.dq, &p.ref.f64.dk, &p.ref.f64.dv}) {
      double largest = 0;
      for (int64_t e = 0; e < g->view().numel(); ++e) largest = std::max(largest, double(std::abs(load_as_float(g->view().data, DType::f32, e))));
      all_nonzero = all_nonzero && largest > 0.1;
    }
    if (!all_nonzero) continue;
    seen.insert({c.op(), c.dtype});
    SCOPED_TRACE(c.name());
    const double rel = c.dtype == DType::f32 ? 1e-3 : 1e-1;
    auto perturbed = [&](int which, int64_t poke, double factor) {  // poke: flat index (-1: all)
      AttendGradients g;
      Tensor* out[3] = {&g.dq, &g.dk, &g.dv};
      const Tensor* ref[3] = {&p.ref.f64.dq, &p.ref.f64.dk, &p.ref.f64.dv};
      for (int w = 0; w < 3; ++w) {
        const TensorView& from = ref[w]->view();
        *out[w] = Tensor(DType::f32, from.shape);
        for (int64_t e = 0; e < from.numel(); ++e) {
          const bool poked = w == which && (poke < 0 || poke == e);
          store_from_float(out[w]->view().data, DType::f32, e,
                           static_cast<float>(load_as_float(from.data, DType::f32, e) * (poked ? factor : 1.0)));
        }
      }
      return g;
    };
    auto passes = [&](const AttendGradients& g) {
      Outcome o;
      check_gradients(g, p.ref, "stored", o);
      return o.pass;
    };
    EXPECT_TRUE(passes(perturbed(-1, -1, 1.0))) << "the reference itself fails";
    const Tensor* ref[3] = {&p.ref.f64.dq, &p.ref.f64.dk, &p.ref.f64.dv};
    for (int w = 0; w < 3; ++w) {
      const TensorView& v = ref[w]->view();
      int64_t largest = 0;
      for (int64_t e = 0; e < v.numel(); ++e)
        if (std::abs(load_as_float(v.data, DType::f32, e)) > std::abs(load_as_float(v.data, DType::f32, largest))) largest = e;
      for (double sign : {1.0, -1.0}) {
        EXPECT_FALSE(passes(perturbed(w, largest, 1 + sign * rel))) << "gradient " << w << ": the largest element off by " << sign * rel;
        EXPECT_FALSE(passes(perturbed(w, -1, 1 + sign * rel))) << "gradient " << w << ": every element scaled by 1 + " << sign * rel;
      }
    }
  }
  EXPECT_FALSE(seen.empty());
  EXPECT_EQ(seen, in_mode) << "a (family, dtype) of the backward mode has no case with three non-zero gradients";
}

}  // namespace
}  // namespace attn::harness
