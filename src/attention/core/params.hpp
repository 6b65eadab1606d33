// Validation of the named parameter map (attn/params.hpp) against what a mechanism declares.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "attn/params.hpp"
#include "base/lazy_text.hpp"

namespace attn::core {

// One declared parameter: its name, its shape as symbols or numbers ("A", "D", "3"), and a
// short description for messages. Symbols already bound (e.g. D = head dim) must match; an
// unbound symbol is bound by its first use (A from wq's first dimension).
struct ParamSpec {
  std::string name;
  std::vector<std::string> dims;
  std::string meaning;
  bool optional = false;  // may be left out
  // How tests draw a valid value (attn::ParamInfo::generate): "normal:S", "decay", "state",
  // "positive:S", "ones".
  std::string generate = "normal:1";
  bool gradient = false;  // attend_backward returns its gradient (AttendGradients::dparams, d_initial_state)
};

using Symbols = std::map<std::string, int64_t, std::less<>>;

// Checks that `given` holds exactly the names of `specs` (none missing but optional ones, none
// extra), each a float array of the declared shape with finite values. `mechanism` is the text
// form, for messages (made only for one). Binds new symbols into `symbols`.
void check_params(const Params& given, const std::vector<ParamSpec>& specs, LazyText mechanism, Symbols& symbols);

// The data of a float32 parameter laid out in C order without gaps, or null.
const float* contiguous_f32(const ArrayView& a);

// Element (i0, i1, i2, i3) of a validated 4-D parameter, as float.
float element_at(const ArrayView& a, int64_t i0, int64_t i1, int64_t i2, int64_t i3);

// A contiguous float32 copy of a validated parameter (C order).
std::vector<float> to_floats(const ArrayView& a);

}  // namespace attn::core
