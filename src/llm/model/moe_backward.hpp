// What the MoE backward's two forms share (model/moe_backward.cpp, the float32 gathered form;
// model/moe_backward_reference.cpp, the plain per-token loop): the argument checks and the plain
// loop itself, a template so that tests can run it in float32 as the "plain same-dtype
// implementation" the fast form's error is measured against.
#pragma once
#include <cstdint>
#include <span>

#include "attn/moe.hpp"

namespace attn::model {

// Sizes, threads, every span's length (dy, the inputs, the gradients); gradients must not overlap
// the inputs. Error names "moe_feed_forward_backward", the argument, expected and actual values.
template <class T>
void check_moe_backward(const MoeSizes& z, std::span<const T> dy, std::span<const T> x, std::span<const T> router,
                        std::span<const T> w1, std::span<const T> w2, std::span<const T> w3,
                        const MoeGradients<T>& g, int threads);

// The plain loop (see moe_backward_reference.cpp): token by token, the forward recomputed in T,
// gradients accumulated in T in token order. Unchecked raw pointers; outputs overwritten.
template <class T>
void moe_backward_plain(const MoeSizes& z, const T* dy, double daux, const T* x, const T* router, const T* w1,
                        const T* w2, const T* w3, T* dx, T* drouter, T* dw1, T* dw2, T* dw3);

}  // namespace attn::model
