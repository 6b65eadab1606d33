// The shared blocks every architecture builds its layers from, run by the decoder's run state
// (decoder.cpp) on one step's rows:
//   norm       h = RMSNorm(x) · w                      (x: the residual stream)
//   attention  f = the layer's attention block on h    (q, k, v projections; per-head RMSNorm of q
//              and k when the layer has q_norm/k_norm; RoPE at the layer's base; the layer's
//              mechanism against its KV cache or recurrent state; lightning layers' silu, output
//              norm and gate; the output projection)
//   swiglu     f = (silu(h W1^T) ⊙ h W3^T) W2^T
//   geglu      f = (gelu_tanh(h W1^T) ⊙ h W3^T) W2^T
//   norm_output  f = RMSNorm(f) · w                  (a block's output normed before its residual)
//   moe        f = the mixture of SwiGLU experts (attn/moe.hpp)
//   residual   x = x + f, or x = a·h + f (a residual that keeps the normed input, scaled)
// The decoder declares and implements this interface; the architectures (arch/) call it.
#pragma once
#include <cstddef>
#include <vector>

#include "attn/model.hpp"
#include "model/weights.hpp"

namespace attn::model {

// One step of a decoder's forward pass as an architecture's layer sees it (the rows, positions and
// buffers are the run state's).
class LayerRun {
 public:
  virtual const DecoderConfig& config() const = 0;
  virtual const LayerWeights& layer(size_t i) const = 0;
  virtual void norm(const std::vector<float>& weight) = 0;
  virtual void attention(size_t i) = 0;
  virtual void swiglu(size_t i) = 0;
  virtual void geglu(size_t i) = 0;
  virtual void norm_output(const std::vector<float>& weight) = 0;
  virtual void moe(size_t i) = 0;
  virtual void residual(double scale = 1.0) = 0;  // 1: x = x + f; otherwise x = scale·h + f

 protected:
  ~LayerRun() = default;
};

}  // namespace attn::model
