// Hardening, class 2a: a non-finite input propagates the same way in every family, form and ISA.
// One case per mechanism of the case list (its boolean mask, bias, block mask and mask_mod
// dropped: tests/exact/test_nonfinite.cpp holds those), poisoned four ways in turn: NaN in one
// query, NaN in one key, NaN in one channel of one value, +inf in every channel of one key. Each
// run (case x form x ISA, as the check suite expands them, the reference form included) must give
// NaN in exactly the rows that can see the poison - every output element and the LSE (where the
// family has one) for a query or key, the value's channel for a value - and leave every other
// element bitwise as the same run without it.
//
// Which rows can see a key (decided per family, docs/reliability.md "Non-finite inputs"):
//   - a mechanism with a key pattern (softmax and its patterns, DCA, GAU, the linear family,
//     efficient, qsoftmax): the rows attn::mask_of marks for that key; a query reaches its own
//     row when the row sees any key;
//   - Linformer: every row of the key's heads (each projected row mixes every key);
//   - LSH: every row of the heads whose q, k or v holds it, every channel (hashing a non-finite
//     vector gives no bucket, so which rows meet which keys is itself undefined);
//   - a value reaches its own channel of those rows only (normattn: the whole row, its output
//     norm mixes the channels); with dropout, a dropped key's value reaches no row (not tested:
//     which keys drop is the seed's).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <set>

#include "harness/check.hpp"

namespace attn::harness {
namespace {

// The first check case of every mechanism, without the caller's masks.
std::vector<Case> one_case_per_mechanism() {
  std::vector<Case> out;
  std::set<std::string> seen;
  for (const Case& c : case_list()) {
    if (!(c.suites & kCheck) || !seen.insert(c.mechanism).second) continue;
    Case r = c;
    r.extras.mask = r.extras.bias = r.extras.block_mask = r.extras.mask_mod = false;
    out.push_back(r);
    // softmax and its patterns once more with few enough queries for the decode-shaped rows form
    // (<= 16 rows per kv head), where rows that see a key and rows that do not share one block
    if (r.mechanism.rfind("softmax", 0) == 0 || r.mechanism.rfind("longformer", 0) == 0 ||
        r.mechanism.rfind("bigbird", 0) == 0) {
      Case few = r;
      few.N = std::min<int64_t>(r.N, 16 / (r.H / r.Hkv));
      if (few.N > 1 && few.N != r.N) out.push_back(few);
    }
  }
  return out;
}

enum class Poison { nan_query, nan_key, nan_value, inf_key };
const char* const kPoisonNames[] = {"NaN in a query", "NaN in a key", "NaN in a value", "+inf in a key"};

// Where the poison goes: batch 0 (padding keeps all its keys), the last kv head's middle key,
// the first query head's middle query.
struct Spot {
  int64_t hk, j, h, i;
};

AttendResult run_once(const Run& r, const Inputs& in) {
  AttendOptions o = in.options;
  o.isa = r.isa;
  o.form = r.form;
  return attend(in.q.view, in.k.view, in.v.view, in.mechanism, o);
}

// Sets element (b, h, n, c) of a view and returns what was there.
float poke(const TensorView& t, int64_t b, int64_t h, int64_t n, int64_t c, float x) {
  const float old = t.at(b, h, n, c);
  store_from_float(t.data, t.dtype, t.offset(b, h, n, c), x);
  return old;
}

void poison(const Inputs& in, Poison what, const Spot& s, bool undo, std::vector<float>& saved) {
  const TensorView& t = what == Poison::nan_query ? in.q.view : what == Poison::nan_value ? in.v.view : in.k.view;
  const int64_t head = what == Poison::nan_query ? s.h : s.hk, tok = what == Poison::nan_query ? s.i : s.j;
  const float x = what == Poison::inf_key ? INFINITY : std::nanf("");
  // +inf: the whole key row (one +inf channel gives a score of -inf for half the queries, which a
  // mask gives too); NaN: one channel (a value's channel cv, the middle one)
  const int64_t c0 = what == Poison::nan_value ? t.dim() / 2 : 0, channels = what == Poison::inf_key ? t.dim() : 1;
  if (!undo) saved.clear();
  for (int64_t c = c0; c < c0 + channels; ++c) {
    if (undo)
      poke(t, 0, head, tok, c, saved[static_cast<size_t>(c - c0)]);
    else
      saved.push_back(poke(t, 0, head, tok, c, x));
  }
}

// Whether row (0, h, i) must be NaN after poisoning `what` at `s`.
std::function<bool(int64_t, int64_t)> poisoned_rows(const Case& c, const Inputs& in, Poison what, const Spot& s) {
  const MechanismInfo facts = info(in.mechanism);
  const int64_t group = c.H / c.Hkv;
  const bool lsh = facts.family == "lsh", linformer = facts.family == "linformer";
  std::vector<uint8_t> sees;  // sees[i * M + j]
  if (!lsh && !linformer) {
    const Tensor m = mask_of(in.mechanism, c.N, c.M);
    sees.resize(static_cast<size_t>(c.N * c.M));
    for (int64_t i = 0; i < c.N; ++i)
      for (int64_t j = 0; j < c.M; ++j)
        sees[static_cast<size_t>(i * c.M + j)] = reinterpret_cast<const uint8_t*>(m.view().ptr(0, 0, i, j))[0] != 0;
  }
  auto sees_any = [=](int64_t i) {
    for (int64_t j = 0; j < c.M; ++j)
      if (sees[static_cast<size_t>(i * c.M + j)]) return true;
    return false;
  };
  if (what == Poison::nan_query) {
    if (lsh) return [=](int64_t h, int64_t) { return h == s.h; };
    if (linformer) return [=](int64_t h, int64_t i) { return h == s.h && i == s.i; };
    const bool any = c.M > 0 && sees_any(s.i);
    return [=](int64_t h, int64_t i) { return any && h == s.h && i == s.i; };
  }
  if (lsh || linformer) return [=](int64_t h, int64_t) { return h / group == s.hk; };
  return [=](int64_t h, int64_t i) { return h / group == s.hk && sees[static_cast<size_t>(i * c.M + s.j)]; };
}

TEST(NonFiniteEveryFamily, PoisonReachesExactlyTheRowsThatSeeIt) {
  const std::vector<Case> cases = one_case_per_mechanism();
  std::set<std::string> families, forms;
  int64_t runs = 0;
  for (const Case& c : cases) {
    Inputs in;
    make_inputs(c, in);
    in.options.return_final_state = false;
    const Spot s{c.Hkv - 1, c.M / 2, 0, c.N / 2};
    std::vector<Case> one{c};
    std::vector<harness::Run> all = expand(one, kCheck, {});
    Filter reference;  // and the reference form, once (it has no ISA)
    reference.form = "reference", reference.isa = "portable";
    for (const harness::Run& r : expand(one, kCheck, reference)) all.push_back(r);
    for (const harness::Run& r : all) {
      families.insert(info(in.mechanism).family);
      forms.insert(r.form);
      SCOPED_TRACE(r.name());
      const AttendResult clean = run_once(r, in);
      std::vector<float> saved;
      for (Poison what : {Poison::nan_query, Poison::nan_key, Poison::nan_value, Poison::inf_key}) {
        SCOPED_TRACE(kPoisonNames[static_cast<int>(what)]);
        // dropout: a dropped key's value reaches no row, and which keys drop is the seed's
        if (what == Poison::nan_value && c.mechanism.find("dropout") != std::string::npos) continue;
        poison(in, what, s, false, saved);
        const AttendResult got = run_once(r, in);
        poison(in, what, s, true, saved);
        ++runs;
        const auto bad = poisoned_rows(c, in, what, s);
        int failures = 0;
        for (int64_t b = 0; b < c.B && failures < 3; ++b)
          for (int64_t h = 0; h < c.H && failures < 3; ++h)
            for (int64_t i = 0; i < c.N && failures < 3; ++i) {
              const bool want_nan = b == 0 && bad(h, i);
              const bool lse = !got.lse.view().empty();
              bool ok = true;
              // a value's channel reaches only that output channel (and not the LSE: the scores
              // do not read V); a query or key reaches every channel and the LSE
              // (LSH poisons its whole head, a query's, key's or value's; normattn's output norm
              // mixes the channels of a row)
              const std::string family = info(in.mechanism).family;
              const bool value = what == Poison::nan_value && family != "lsh" && family != "normattn";
              for (int64_t d = 0; d < c.Dv; ++d) {
                const float x = got.out.at(b, h, i, d), y = clean.out.at(b, h, i, d);
                const bool nan = want_nan && (!value || d == c.Dv / 2);
                ok = ok && (nan ? std::isnan(x) : std::memcmp(&x, &y, sizeof x) == 0);
              }
              if (lse) {
                const float x = got.lse.at(b, h, i, 0), y = clean.lse.at(b, h, i, 0);
                ok = ok && (want_nan && !value ? std::isnan(x) : std::memcmp(&x, &y, sizeof x) == 0);
              }
              if (!ok) {
                ++failures;
                ADD_FAILURE() << "row (" << b << ", " << h << ", " << i << ") should be "
                              << (want_nan ? "NaN" : "as without the poison") << ": out[0] = " << got.out.at(b, h, i, 0)
                              << " (clean " << clean.out.at(b, h, i, 0) << ")"
                              << (lse ? ", lse = " + std::to_string(got.lse.at(b, h, i, 0)) : "");
              }
            }
      }
    }
  }
  // every family and every fast form was walked (a new family or form joins by its case list)
  std::set<std::string> all_families;
  for (const MechanismInfo& f : family_infos()) all_families.insert(f.family);
  EXPECT_EQ(families, all_families);
  EXPECT_EQ(forms, (std::set<std::string>{"rows", "tiled", "tiled_bf16", "projected", "chunked", "parts", "right",
                                          "recurrent", "reference"}));
  EXPECT_GT(runs, 0);
}

}  // namespace
}  // namespace attn::harness
