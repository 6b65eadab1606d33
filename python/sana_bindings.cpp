// attn._attn's SANA pieces (attn/sana.hpp): lite_la_{f32,f64}, mix_ffn_{f32,f64} and
// sana_block_{f32,f64}; lite_la_backward_{f32,f64} (-> (dx, dqkv, dproj, dproj_bias: zeros without a bias)) and
// mix_ffn_backward_{f32,f64} (-> (dx, dinverted, dinverted_bias, ddepth, ddepth_bias, dpoint)).
// The Python side (python/attn/blocks/sana.py) reshapes torch's conv weights to matrices and hands
// over C-contiguous arrays of x's dtype; C++ checks every shape. Results are new NumPy arrays; the
// GIL is released while C++ computes.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "binding_arrays.hpp"
#include "attn/sana.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using attn::python::In;
using attn::python::owned_array;

template <class T>
attn::MatrixRef<T> matrix(const In<T>& w) {
  return {w.data(), w.ndim() > 0 ? static_cast<int64_t>(w.shape(0)) : 0,
          w.ndim() > 1 ? static_cast<int64_t>(w.shape(1)) : 1};
}
template <class T>
std::span<const T> vec(const std::optional<In<T>>& b) {
  return b ? std::span<const T>(b->data(), b->size()) : std::span<const T>();
}

template <class T>
struct Result {
  std::vector<T>* data;
  nb::ndarray<nb::numpy, T> array(size_t b, size_t n, size_t c) {
    return owned_array(data, {b, n, c});
  }
};

// Runs fn(out) with a new (B, N, C) buffer, the GIL released; frees it if fn throws.
template <class T, class F>
nb::ndarray<nb::numpy, T> run(const In<T, nb::ndim<3>>& x, F&& fn) {
  const size_t b = x.shape(0), n = x.shape(1), c = x.shape(2);
  Result<T> r{new std::vector<T>(b * n * c)};
  try {
    nb::gil_scoped_release release;
    fn(r.data->data());
  } catch (...) {
    delete r.data;
    throw;
  }
  return r.array(b, n, c);
}

template <class T>
attn::LiteLaWeights<T> lite_weights(const In<T>& qkv, const In<T>& proj, const std::optional<In<T>>& bias,
                                    int64_t head_dim, double eps) {
  return {matrix(qkv), matrix(proj), vec(bias), head_dim, eps};
}
template <class T>
attn::MixFfnWeights<T> ffn_weights(const In<T>& inv, const In<T>& inv_b, const In<T>& dw, const In<T>& dw_b,
                                   const In<T>& point) {
  return {matrix(inv), std::span<const T>(inv_b.data(), inv_b.size()), matrix(dw),
          std::span<const T>(dw_b.data(), dw_b.size()), matrix(point)};
}

template <class T>
void bind_type(nb::module_& m, const std::string& suffix) {
  m.def(
      ("lite_la_" + suffix).c_str(),
      [](In<T, nb::ndim<3>> x, In<T> qkv, In<T> proj, std::optional<In<T>> bias, int64_t head_dim, double eps,
         int threads) {
        const auto w = lite_weights<T>(qkv, proj, bias, head_dim, eps);
        return run<T>(x, [&](T* out) {
          attn::lite_la(x.data(), x.shape(0), x.shape(1), x.shape(2), w, out, threads);
        });
      },
      "x"_a, "qkv"_a, "proj"_a, "proj_bias"_a.none(), "head_dim"_a, "eps"_a, "threads"_a = 0);
  m.def(
      ("mix_ffn_" + suffix).c_str(),
      [](In<T, nb::ndim<3>> x, int64_t height, int64_t width, In<T> inv, In<T> inv_b, In<T> dw, In<T> dw_b,
         In<T> point, int threads) {
        const auto w = ffn_weights<T>(inv, inv_b, dw, dw_b, point);
        return run<T>(x, [&](T* out) {
          attn::mix_ffn(x.data(), x.shape(0), x.shape(1), x.shape(2), height, width, w, out, threads);
        });
      },
      "x"_a, "height"_a, "width"_a, "inverted"_a, "inverted_bias"_a, "depth"_a, "depth_bias"_a, "point"_a,
      "threads"_a = 0);
  m.def(
      ("sana_block_" + suffix).c_str(),
      [](In<T, nb::ndim<3>> x, int64_t height, int64_t width, In<T> qkv, In<T> proj, std::optional<In<T>> bias,
         In<T> inv, In<T> inv_b, In<T> dw, In<T> dw_b, In<T> point, int64_t head_dim, double eps, double norm_eps,
         int threads) {
        const auto a = lite_weights<T>(qkv, proj, bias, head_dim, eps);
        const auto f = ffn_weights<T>(inv, inv_b, dw, dw_b, point);
        return run<T>(x, [&](T* out) {
          attn::sana_block(x.data(), x.shape(0), x.shape(1), x.shape(2), height, width, a, f, out, threads, norm_eps);
        });
      },
      "x"_a, "height"_a, "width"_a, "qkv"_a, "proj"_a, "proj_bias"_a.none(), "inverted"_a, "inverted_bias"_a,
      "depth"_a, "depth_bias"_a, "point"_a, "head_dim"_a, "eps"_a, "norm_eps"_a, "threads"_a = 0);
}

// a new array of `shape`, zeros
template <class T>
std::unique_ptr<std::vector<T>> buffer(std::initializer_list<size_t> shape) {
  size_t n = 1;
  for (size_t s : shape) n *= s;
  return std::make_unique<std::vector<T>>(n);
}

template <class T>
void check_dout(const In<T, nb::ndim<3>>& dout, const In<T, nb::ndim<3>>& x, const char* where) {
  if (dout.shape(0) != x.shape(0) || dout.shape(1) != x.shape(1) || dout.shape(2) != x.shape(2))
    throw nb::value_error((std::string(where) + ": dout must have x's shape (B, N, C)").c_str());
}

template <class T>
void bind_backward(nb::module_& m, const std::string& suffix) {
  m.def(
      ("lite_la_backward_" + suffix).c_str(),
      [](In<T, nb::ndim<3>> dout, In<T, nb::ndim<3>> x, In<T> qkv, In<T> proj, std::optional<In<T>> bias,
         int64_t head_dim, double eps, int threads) {
        check_dout(dout, x, "lite_la_backward");
        const auto w = lite_weights<T>(qkv, proj, bias, head_dim, eps);
        const size_t b = x.shape(0), n = x.shape(1), c = x.shape(2);
        auto gx = buffer<T>({b, n, c}), gq = buffer<T>({3 * c, c}), gp = buffer<T>({c, c}), gb = buffer<T>({c});
        {
          nb::gil_scoped_release release;
          attn::lite_la_backward(dout.data(), x.data(), b, n, c, w, {gx->data(), gq->data(), gp->data(), gb->data()},
                                 threads);
        }
        return nb::make_tuple(owned_array(gx.release(), {b, n, c}), owned_array(gq.release(), {3 * c, c}),
                              owned_array(gp.release(), {c, c}), owned_array(gb.release(), {c}));
      },
      "dout"_a, "x"_a, "qkv"_a, "proj"_a, "proj_bias"_a.none(), "head_dim"_a, "eps"_a, "threads"_a = 0);
  m.def(
      ("mix_ffn_backward_" + suffix).c_str(),
      [](In<T, nb::ndim<3>> dout, In<T, nb::ndim<3>> x, int64_t height, int64_t width, In<T> inv, In<T> inv_b,
         In<T> dw, In<T> dw_b, In<T> point, int threads) {
        check_dout(dout, x, "mix_ffn_backward");
        const auto w = ffn_weights<T>(inv, inv_b, dw, dw_b, point);
        const size_t b = x.shape(0), n = x.shape(1), c = x.shape(2);
        const size_t h2 = static_cast<size_t>(w.inverted.rows), h = h2 / 2;
        auto gx = buffer<T>({b, n, c}), gi = buffer<T>({h2, c}), gib = buffer<T>({h2}), gd = buffer<T>({h2, 9});
        auto gdb = buffer<T>({h2}), gp = buffer<T>({c, h});
        {
          nb::gil_scoped_release release;
          attn::mix_ffn_backward(dout.data(), x.data(), b, n, c, height, width, w,
                                 {gx->data(), gi->data(), gib->data(), gd->data(), gdb->data(), gp->data()}, threads);
        }
        return nb::make_tuple(owned_array(gx.release(), {b, n, c}), owned_array(gi.release(), {h2, c}),
                              owned_array(gib.release(), {h2}), owned_array(gd.release(), {h2, 9}),
                              owned_array(gdb.release(), {h2}), owned_array(gp.release(), {c, h}));
      },
      "dout"_a, "x"_a, "height"_a, "width"_a, "inverted"_a, "inverted_bias"_a, "depth"_a, "depth_bias"_a, "point"_a,
      "threads"_a = 0);
}

}  // namespace

void bind_sana(nb::module_& m) {
  bind_type<float>(m, "f32");
  bind_type<double>(m, "f64");
  bind_backward<float>(m, "f32");
  bind_backward<double>(m, "f64");
}
