// What a decoder layer needs to know about its mechanism: whether it is causal, and whether it
// keeps a recurrent state (instead of a KV cache).
#pragma once
#include <type_traits>

#include "attn/mechanism.hpp"
#include "core/internal_api.hpp"

namespace attn::model {

// DCA is causal by construction; Linformer's projection mixes all keys, so it never is.
inline bool is_causal(const Mechanism& mechanism) {
  return std::visit(
      [](const auto& m) {
        using M = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<M, Dca>) return true;
        else if constexpr (requires { m.causal; }) return static_cast<bool>(m.causal);
        else return false;
      },
      mechanism);
}

inline bool has_state(const Mechanism& mechanism) { return core::has_state(mechanism); }

}  // namespace attn::model
