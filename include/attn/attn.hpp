// Umbrella header for the attn library.
#pragma once
#include "attn/attend.hpp"
#include "attn/dtype.hpp"
#include "attn/error.hpp"
#include "attn/isa.hpp"
#include "attn/mechanism.hpp"
#include "attn/npy.hpp"
#include "attn/pattern.hpp"
#include "attn/kv_cache.hpp"
#include "attn/model.hpp"
#include "attn/rope.hpp"
#include "attn/safetensors.hpp"
#include "attn/tensor.hpp"
