// Umbrella header of the attention library (target attn::attn): attend and its backward, the
// mechanisms and their facts, masks, KV caches, RoPE, concentration, .npy files. The other wings
// have their own: attn/blocks.hpp (attn::blocks) and attn/llm.hpp (attn::llm).
#pragma once
#include "attn/attend.hpp"
#include "attn/backward.hpp"
#include "attn/concentration.hpp"
#include "attn/dtype.hpp"
#include "attn/error.hpp"
#include "attn/info.hpp"
#include "attn/isa.hpp"
#include "attn/kv_cache.hpp"
#include "attn/kv_quant.hpp"
#include "attn/mechanism.hpp"
#include "attn/npy.hpp"
#include "attn/params.hpp"
#include "attn/pattern.hpp"
#include "attn/rope.hpp"
#include "attn/tensor.hpp"
#include "attn/theory.hpp"
