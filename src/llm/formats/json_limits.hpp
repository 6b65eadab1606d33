// JSON from files is hostile input: nesting is bounded at parse time (printing or walking a value
// recurses, so a header of 100000 '[' would overflow the stack), and a value quoted in a message
// is cut to a few dozen characters.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "attn/error.hpp"

namespace attn::io {

// Deeper than any file format attn reads needs (safetensors: 3; the decoder config: 4).
constexpr int kMaxJsonDepth = 64;

// Parses [begin, end); a syntax error or nesting deeper than kMaxJsonDepth is an Error of `where`
// beginning with `what` ("header is not valid JSON").
template <class It>
nlohmann::json parse_json(It begin, It end, const std::string& where, const std::string& what) {
  try {
    return nlohmann::json::parse(begin, end, [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
      if (depth > kMaxJsonDepth)
        fail(where, what + ": nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
      return true;
    });
  } catch (const nlohmann::json::exception& e) {  // its message quotes the input: cut it
    std::string m = e.what();
    if (m.size() > 200) m = m.substr(0, 200) + "...";
    fail(where, what + ": " + m);
  }
}

// A value for a message: its JSON text, cut to `max` characters ("..." marks the cut).
inline std::string json_excerpt(const nlohmann::json& j, size_t max = 60) {
  std::string s = j.dump();
  if (s.size() > max) s = s.substr(0, max) + "...";
  return s;
}

}  // namespace attn::io
