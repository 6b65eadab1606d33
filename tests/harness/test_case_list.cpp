// The check suite: every run of the one case list (case x form x ISA, harness/case_list.cpp)
// against the family's float64 reference under the case's tolerance rule (harness/check.cpp).
// Test names are the run names, so --gtest_filter='*rows*avx2*' picks a form and an ISA.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>

#include "harness/check.hpp"

namespace attn::harness {
namespace {

// The references of the last case checked: runs of one case are consecutive.
struct Cached {
  const Case* c = nullptr;
  std::unique_ptr<Inputs> in;
  References ref;
};

const Cached& prepared(const Case& c) {
  static Cached cache;
  if (cache.c != &c) {
    cache.in = std::make_unique<Inputs>();
    make_inputs(c, *cache.in);
    cache.ref = references_for(c, *cache.in);
    cache.c = &c;
  }
  return cache;
}

class CaseList : public ::testing::TestWithParam<harness::Run> {};

TEST_P(CaseList, WithinTolerance) {
  const harness::Run& r = GetParam();
  const Cached& p = prepared(*r.c);
  const Outcome o = check_run(r, *p.in, p.ref);
  EXPECT_TRUE(o.pass) << o.failure;
  EXPECT_EQ(o.form, r.form) << "the forced form did not run";
}

INSTANTIATE_TEST_SUITE_P(Check, CaseList, ::testing::ValuesIn(expand(case_list(), kCheck, {})),
                         [](const auto& info) { return info.param.name(); });

// Bad input, per family: the list's BadCases must fail with their message, in attend() and in
// explain(), before anything is computed.
class BadInput : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadInput, FailsWithItsMessage) {
  const BadCase& bc = GetParam();
  for (int via_explain : {0, 1}) {
    Inputs in;
    make_inputs(bc.base, in);
    bc.breaks(in);
    try {
      if (via_explain)
        explain(in.q.view, in.k.view, in.v.view, in.mechanism, in.options);
      else
        attend(in.q.view, in.k.view, in.v.view, in.mechanism, in.options);
      ADD_FAILURE() << (via_explain ? "explain" : "attend") << " accepted it";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(bc.message), std::string::npos) << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Check, BadInput, ::testing::ValuesIn(bad_case_list()),
                         [](const auto& info) { return info.param.base.op() + "_" + info.param.name; });

TEST(CaseListShape, NamesAreUniqueAndEveryFastFormIsCovered) {
  std::set<std::string> names, forms;
  for (const harness::Run& r : expand(case_list(), kCheck, {})) {
    EXPECT_TRUE(names.insert(r.name()).second) << "duplicate run " << r.name();
    forms.insert(r.form);
  }
  EXPECT_EQ(forms, (std::set<std::string>{"rows", "tiled", "tiled_bf16", "projected", "chunked", "parts", "right", "recurrent"}));
  EXPECT_GE(names.size(), 450u);  // 150 cases before the list existed, each on 3 ISAs at least once
}

// The check runs are a committed manifest (tests/harness/check_runs.txt, one `case__form` per line,
// the same on every ISA): a case or form that disappears, or a listed form that starts to refuse
// its case (expand keeps only forms that accept), fails here instead of shrinking the suite.
// After a deliberate change: ATTN_UPDATE_MANIFEST=1 attn_check --gtest_filter='*Manifest*'.
TEST(CaseListShape, RunsEqualTheManifest) {
  const std::string path = std::string(ATTN_SOURCE_DIR) + "/tests/harness/check_runs.txt";
  std::map<Isa, std::set<std::string>> by_isa;
  for (const harness::Run& r : expand(case_list(), kCheck, {})) {
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
    for (const std::string& n : missing) ADD_FAILURE() << "listed run does not run (gone or refused): " << n;
    for (const std::string& n : extra) ADD_FAILURE() << "run not in the manifest: " << n;
    if (!missing.empty() || !extra.empty())
      ADD_FAILURE() << "after a deliberate change, rewrite " << path
                    << " with ATTN_UPDATE_MANIFEST=1 attn_check --gtest_filter='*Manifest*' and review its diff";
  }
}

// ISA paths: which ones the check suite runs on this CPU (printed by the test command), and every
// ISA named in ATTN_REQUIRE_ISAS (comma-separated) must be among them, so a machine without AVX-512
// cannot pass a run that requires it by silently running fewer cases.
TEST(IsaCoverage, EveryRequiredIsaRuns) {
  std::set<Isa> ran;
  for (const harness::Run& r : expand(case_list(), kCheck, {})) ran.insert(r.isa);
  std::string ran_text, lacks_text;
  for (Isa i : {Isa::portable, Isa::avx2, Isa::avx512}) {
    std::string& text = ran.count(i) ? ran_text : lacks_text;
    text += (text.empty() ? "" : ", ") + isa_name(i);
  }
  std::printf("attn: check runs on ISA paths %s; this CPU lacks %s\n", ran_text.c_str(),
              lacks_text.empty() ? "none" : lacks_text.c_str());
  EXPECT_EQ(ran.size(), supported_isas().size());
  const char* env = std::getenv("ATTN_REQUIRE_ISAS");
  std::stringstream names(env ? env : "");
  for (std::string name; std::getline(names, name, ',');) {
    if (name.empty()) continue;
    Isa want{};
    ASSERT_NO_THROW(want = parse_isa(name, "ATTN_REQUIRE_ISAS")) << "unknown ISA '" << name << "'";
    EXPECT_TRUE(ran.count(want)) << "ATTN_REQUIRE_ISAS names " << name << ", which this CPU cannot run ("
                                 << isa_name(best_supported_isa()) << " at best): its runs did not happen";
  }
}

TEST(CaseListShape, FiltersSelectRuns) {
  Filter f;
  f.form = "rows";
  f.isa = "portable";
  const auto runs = expand(case_list(), kCheck, f);
  ASSERT_FALSE(runs.empty());
  for (const harness::Run& r : runs) {
    EXPECT_EQ(r.form, "rows");
    EXPECT_EQ(r.isa, Isa::portable);
  }
  f = {};
  f.case_substring = "score_additive";
  EXPECT_EQ(expand(case_list(), kCheck, f).size(), 2 * supported_isas().size());
}

// The rule itself: for one case of every (family, dtype), the float64 reference stored in the
// case's dtype passes, and the same output with its largest element off by 1 % (bf16, fp16) or
// 0.1 % (float32) fails; so does the whole output scaled by as much.
TEST(ToleranceRule, APerturbationOfOnePercentFailsEveryFamilyAndDtype) {
  std::set<std::pair<std::string, DType>> seen;
  for (const Case& c : case_list()) {
    if (!(c.suites & kCheck) || !seen.insert({c.op(), c.dtype}).second) continue;
    SCOPED_TRACE(c.name());
    const Cached& p = prepared(c);
    const core::ReferenceResult& ref = p.ref.f64;
    const double rel = c.dtype == DType::f32 ? 1e-3 : 1e-2;
    auto stored = [&](int64_t poke, double factor) {  // flat index to perturb (-1: all)
      Tensor out(c.dtype, {c.B, c.H, c.N, c.Dv});
      for (int64_t e = 0; e < static_cast<int64_t>(ref.out.size()); ++e)
        store_from_float(out.view().data, c.dtype, e,
                         static_cast<float>(ref.out[static_cast<size_t>(e)] * (poke < 0 || poke == e ? factor : 1.0)));
      return out;
    };
    auto passes = [&](const Tensor& out) {
      Outcome o;
      check_out(c, out.view(), p.ref, "stored", o);
      return o.pass;
    };
    int64_t largest = 0;
    for (size_t e = 0; e < ref.out.size(); ++e)
      if (std::abs(ref.out[e]) > std::abs(ref.out[static_cast<size_t>(largest)])) largest = static_cast<int64_t>(e);
    EXPECT_TRUE(passes(stored(-1, 1.0))) << "the reference itself fails";
    for (double sign : {1.0, -1.0}) {
      EXPECT_FALSE(passes(stored(largest, 1 + sign * rel))) << "the largest element off by " << sign * rel;
      EXPECT_FALSE(passes(stored(-1, 1 + sign * rel))) << "every element scaled by 1 + " << sign * rel;
    }
  }
  EXPECT_EQ(seen.size(), 3 * family_infos().size()) << "a family is not checked in every storage dtype";
}

// Seeded random problems (the C++ twin of the Python property tests, so random shapes also run
// under ASan/UBSan): small sizes, any head grouping, dtype, layout, mask and option, every form.
TEST(RandomProblems, WithinTolerance) {
  std::mt19937 rng(20261123);
  auto pick = [&](auto... xs) {
    const std::vector<int64_t> v{xs...};
    return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
  };
  const char* mechs[] = {"softmax", "softmax:causal", "softmax:window=5:2", "softmax:causal,softcap=15",
                         "softmax:scale=0.3", "softmax:entropy_scale=32"};
  std::vector<Case> cases;
  for (int n = 0; n < 120; ++n) {
    Case c;
    c.Hkv = pick(1, 2, 3);
    c.B = pick(1, 2, 3);
    c.H = c.Hkv * pick(1, 2, 4, 8);
    c.N = pick(1, 2, 3, 5, 17, 64, 65, 130);
    c.M = pick(1, 2, 7, 63, 64, 65, 129, 300);
    c.D = pick(1, 2, 3, 8, 17, 33);
    c.Dv = pick(1, 4, 16, 33);
    c.dtype = std::array{DType::f32, DType::bf16, DType::f16}[pick(0, 1, 2)];
    c.layout = pick(0, 1) ? Layout::bnhd : Layout::bhnd;
    c.mechanism = mechs[pick(0, 1, 2, 3, 4, 5)];
    c.extras.padding = pick(0, 1), c.extras.mask = pick(0, 0, 1), c.extras.bias = pick(0, 0, 1);
    c.extras.alibi = pick(0, 0, 1), c.extras.pad = pick(0, 0, 3);
    c.seed = static_cast<uint32_t>(n);
    cases.push_back(c);
  }
  for (const harness::Run& r : expand(cases, kCheck, {})) {
    SCOPED_TRACE(r.name());
    const Cached& p = prepared(*r.c);
    const Outcome o = check_run(r, *p.in, p.ref);
    ASSERT_TRUE(o.pass) << o.failure;
  }
}

}  // namespace
}  // namespace attn::harness
