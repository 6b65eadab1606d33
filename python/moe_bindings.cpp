// attn._attn's mixture-of-experts feed-forward (attn/moe.hpp) for float32 and float64. The Python
// side (python/attn/moe.py) checks shapes and hands over C-contiguous arrays of one dtype; the
// results are new NumPy arrays. The GIL is released while C++ computes.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <string>
#include <vector>

#include "binding_arrays.hpp"
#include "attn/moe.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using attn::python::In;
using attn::python::owned_array;

template <class T>
void bind_type(nb::module_& m) {
  m.def(
      (std::string("moe_feed_forward_") + (sizeof(T) == 4 ? "f32" : "f64")).c_str(),
      [](In<T, nb::ndim<2>> x, In<T, nb::ndim<2>> router, In<T, nb::ndim<3>> w1, In<T, nb::ndim<3>> w2,
         In<T, nb::ndim<3>> w3, int64_t top_k, int threads) {
        attn::MoeSizes z;
        z.tokens = static_cast<int64_t>(x.shape(0)), z.dim = static_cast<int64_t>(x.shape(1));
        z.experts = static_cast<int64_t>(router.shape(0)), z.hidden = static_cast<int64_t>(w1.shape(1));
        z.top_k = top_k;
        auto* y = new std::vector<T>(static_cast<size_t>(z.tokens * z.dim));
        auto* ids = new std::vector<int32_t>();
        auto* weights = new std::vector<T>();
        double aux = 0;
        try {
          attn::MoeRouting<T> routing;
          {
            nb::gil_scoped_release release;
            aux = attn::moe_feed_forward(z, std::span<const T>(x.data(), x.size()),
                                         std::span<const T>(router.data(), router.size()),
                                         std::span<const T>(w1.data(), w1.size()), std::span<const T>(w2.data(), w2.size()),
                                         std::span<const T>(w3.data(), w3.size()), std::span<T>(*y), threads, &routing);
          }
          *ids = std::move(routing.ids), *weights = std::move(routing.weights);
        } catch (...) {
          delete y, delete ids, delete weights;
          throw;
        }
        const size_t n = static_cast<size_t>(z.tokens), k = static_cast<size_t>(z.top_k);
        return nb::make_tuple(owned_array(y, {n, static_cast<size_t>(z.dim)}), aux, owned_array(ids, {n, k}),
                              owned_array(weights, {n, k}));
      },
      "x"_a, "router"_a, "w1"_a, "w2"_a, "w3"_a, "top_k"_a, "threads"_a = 0,
      "attn::moe_feed_forward: (y, aux_loss, expert ids, routing weights).");
}

}  // namespace

void bind_moe(nb::module_& m) {
  bind_type<float>(m);
  bind_type<double>(m);
}
