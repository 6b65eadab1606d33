// Umbrella header of the model-level blocks (target attn::blocks, over attn::attn): output-layer
// softmaxes, attention-weight refinement, Titans' memory, SANA's LiteLA and Mix-FFN.
#pragma once
#include "attn/attn.hpp"
#include "attn/output_softmax.hpp"
#include "attn/refinement.hpp"
#include "attn/sana.hpp"
#include "attn/titans.hpp"
