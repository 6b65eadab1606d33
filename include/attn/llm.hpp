// Umbrella header of the LLM runtime (target attn::llm, over attn::attn): the decoder and its
// architectures, GGUF and safetensors files, the mixture-of-experts feed-forward, tokenizers,
// the sampler, the serving engine.
#pragma once
#include "attn/attn.hpp"
#include "attn/engine.hpp"
#include "attn/gguf.hpp"
#include "attn/model.hpp"
#include "attn/moe.hpp"
#include "attn/safetensors.hpp"
#include "attn/sampler.hpp"
#include "attn/tokenizer.hpp"
