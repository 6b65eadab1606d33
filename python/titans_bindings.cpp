// attn._attn's Titans memory (attn/titans.hpp): the fast float32 form and the float64 token loop.
// The Python side (python/attn/titans.py) checks shapes and hands over C-contiguous arrays;
// results are new NumPy arrays (y, final weights, final momentum). The GIL is released while
// C++ computes.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "binding_arrays.hpp"
#include "attn/titans.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using attn::python::In;
using attn::python::owned_array;

template <class T>
void bind_type(nb::module_& m) {
  m.def(
      sizeof(T) == 4 ? "titans_memory_f32" : "titans_memory_f64",
      [](In<T, nb::ndim<4>> q, In<T, nb::ndim<4>> k, In<T, nb::ndim<4>> v, In<T, nb::ndim<3>> theta,
         In<T, nb::ndim<3>> eta, In<T, nb::ndim<3>> alpha, std::optional<In<T, nb::ndim<2>>> w0, std::optional<In<T, nb::ndim<2>>> s0,
         const std::string& memory, const std::string& loss, int64_t batch_size, int threads) {
        attn::TitansShape s{int64_t(q.shape(0)), int64_t(q.shape(1)), int64_t(q.shape(2)), int64_t(q.shape(3))};
        attn::TitansConfig cfg{attn::titans_memory_from_text(memory), attn::titans_loss_from_text(loss), batch_size};
        const int64_t count = attn::titans_weight_count(cfg.memory, s.dim), seqs = s.batch * s.heads;
        // the wrapper checked the shapes; these guard the raw pointers all the same
        for (const auto* a : {&k, &v})
          for (size_t i = 0; i < 4; ++i)
            if (a->shape(i) != q.shape(i)) throw nb::value_error("titans_memory: q, k and v must have one shape");
        for (const auto* a : {&theta, &eta, &alpha})
          for (size_t i = 0; i < 3; ++i)
            if (a->shape(i) != q.shape(i)) throw nb::value_error("titans_memory: gates must have shape (B, H, N)");
        if (w0 && int64_t(w0->shape(1)) != count)
          throw nb::value_error("titans_memory: w0 must have one row of weights per group");
        if (s0 && (!w0 || s0->shape(0) != w0->shape(0) || s0->shape(1) != w0->shape(1)))
          throw nb::value_error("titans_memory: s0 must have w0's shape");
        auto* y = new std::vector<T>(static_cast<size_t>(seqs * s.tokens * s.dim));
        auto* w = new std::vector<T>(static_cast<size_t>(seqs * count));
        auto* st = new std::vector<T>(w->size());
        try {
          nb::gil_scoped_release release;
          if constexpr (sizeof(T) == 4) {
            attn::TitansArgs a{q.data(), k.data(), v.data(), theta.data(), eta.data(), alpha.data(),
                               w0 ? w0->data() : nullptr, w0 ? int64_t(w0->shape(0)) : 1, s0 ? s0->data() : nullptr};
            attn::titans_memory(s, cfg, a, y->data(), w->data(), st->data(), threads);
          } else {
            attn::TitansArgs64 a{q.data(), k.data(), v.data(), theta.data(), eta.data(), alpha.data(),
                                 w0 ? w0->data() : nullptr, w0 ? int64_t(w0->shape(0)) : 1, s0 ? s0->data() : nullptr};
            attn::titans_memory_reference(s, cfg, a, y->data(), w->data(), st->data());
          }
        } catch (...) {
          delete y;
          delete w;
          delete st;
          throw;
        }
        const auto B = size_t(s.batch), H = size_t(s.heads);
        return std::make_tuple(owned_array(y, {B, H, size_t(s.tokens), size_t(s.dim)}),
                               owned_array(w, {B, H, size_t(count)}), owned_array(st, {B, H, size_t(count)}));
      },
      "q"_a, "k"_a, "v"_a, "theta"_a, "eta"_a, "alpha"_a, "w0"_a.none(), "s0"_a.none(), "memory"_a, "loss"_a, "batch_size"_a,
      "threads"_a = 0,
      sizeof(T) == 4 ? "attn::titans_memory (float32 fast form): (y, weights (B, H, count), momentum)."
                     : "attn::titans_memory_reference (float64 token loop): (y, weights (B, H, count), momentum).");
}

template <class T>
void bind_backward(nb::module_& m) {
  m.def(
      sizeof(T) == 4 ? "titans_memory_backward_f32" : "titans_memory_backward_f64",
      [](In<T, nb::ndim<4>> q, In<T, nb::ndim<4>> k, In<T, nb::ndim<4>> v, In<T, nb::ndim<3>> theta,
         In<T, nb::ndim<3>> eta, In<T, nb::ndim<3>> alpha, std::optional<In<T, nb::ndim<2>>> w0,
         std::optional<In<T, nb::ndim<2>>> s0, std::optional<In<T, nb::ndim<4>>> dy,
         std::optional<In<T, nb::ndim<2>>> dw_out, std::optional<In<T, nb::ndim<2>>> ds_out, const std::string& memory,
         const std::string& loss, int64_t batch_size, int threads) {
        attn::TitansShape s{int64_t(q.shape(0)), int64_t(q.shape(1)), int64_t(q.shape(2)), int64_t(q.shape(3))};
        attn::TitansConfig cfg{attn::titans_memory_from_text(memory), attn::titans_loss_from_text(loss), batch_size};
        const int64_t count = attn::titans_weight_count(cfg.memory, s.dim), seqs = s.batch * s.heads;
        const int64_t groups = w0 ? int64_t(w0->shape(0)) : 1;
        for (const auto* a : {&k, &v})
          for (size_t i = 0; i < 4; ++i)
            if (a->shape(i) != q.shape(i))
              throw nb::value_error("titans_memory_backward: q, k and v must have one shape");
        if (dy)
          for (size_t i = 0; i < 4; ++i)
            if (dy->shape(i) != q.shape(i)) throw nb::value_error("titans_memory_backward: dy must have q's shape");
        for (const auto* a : {&theta, &eta, &alpha})
          for (size_t i = 0; i < 3; ++i)
            if (a->shape(i) != q.shape(i))
              throw nb::value_error("titans_memory_backward: gates must have shape (B, H, N)");
        if (w0 && int64_t(w0->shape(1)) != count)
          throw nb::value_error("titans_memory_backward: w0 must have one row of weights per group");
        if (s0 && (!w0 || s0->shape(0) != w0->shape(0) || s0->shape(1) != w0->shape(1)))
          throw nb::value_error("titans_memory_backward: s0 must have w0's shape");
        for (const auto* a : {&dw_out, &ds_out})
          if (*a && (int64_t((*a)->shape(0)) != seqs || int64_t((*a)->shape(1)) != count))
            throw nb::value_error("titans_memory_backward: dw_out and ds_out must have shape (B*H, count)");
        const size_t n = q.size(), rows = theta.size(), wn = size_t(groups * count);
        auto vec = [](size_t c) { return std::make_unique<std::vector<T>>(c); };
        auto dq = vec(n), dk = vec(n), dv = vec(n), dth = vec(rows), det = vec(rows), dal = vec(rows), dw0 = vec(wn),
             ds0 = vec(wn);
        {
          nb::gil_scoped_release release;
          if constexpr (sizeof(T) == 4) {
            attn::TitansArgs a{q.data(), k.data(), v.data(), theta.data(), eta.data(), alpha.data(),
                               w0 ? w0->data() : nullptr, groups, s0 ? s0->data() : nullptr};
            attn::titans_memory_backward(s, cfg, a, dy ? dy->data() : nullptr, dw_out ? dw_out->data() : nullptr,
                                         ds_out ? ds_out->data() : nullptr,
                                         {dq->data(), dk->data(), dv->data(), dth->data(), det->data(), dal->data(),
                                          dw0->data(), ds0->data()},
                                         threads);
          } else {
            attn::TitansArgs64 a{q.data(), k.data(), v.data(), theta.data(), eta.data(), alpha.data(),
                                 w0 ? w0->data() : nullptr, groups, s0 ? s0->data() : nullptr};
            attn::titans_memory_backward_reference(
                s, cfg, a, dy ? dy->data() : nullptr, dw_out ? dw_out->data() : nullptr,
                ds_out ? ds_out->data() : nullptr,
                {dq->data(), dk->data(), dv->data(), dth->data(), det->data(), dal->data(), dw0->data(), ds0->data()});
          }
        }
        const auto B = size_t(s.batch), H = size_t(s.heads), N = size_t(s.tokens), D = size_t(s.dim);
        return nb::make_tuple(owned_array(dq.release(), {B, H, N, D}), owned_array(dk.release(), {B, H, N, D}),
                              owned_array(dv.release(), {B, H, N, D}), owned_array(dth.release(), {B, H, N}),
                              owned_array(det.release(), {B, H, N}), owned_array(dal.release(), {B, H, N}),
                              owned_array(dw0.release(), {size_t(groups), size_t(count)}),
                              owned_array(ds0.release(), {size_t(groups), size_t(count)}));
      },
      "q"_a, "k"_a, "v"_a, "theta"_a, "eta"_a, "alpha"_a, "w0"_a.none(), "s0"_a.none(), "dy"_a.none(),
      "dw_out"_a.none(), "ds_out"_a.none(), "memory"_a, "loss"_a, "batch_size"_a, "threads"_a = 0,
      sizeof(T) == 4 ? "attn::titans_memory_backward (float32): (dq, dk, dv, dtheta, deta, dalpha, dw0, ds0)."
                     : "attn::titans_memory_backward_reference (float64): (dq, dk, dv, dtheta, deta, dalpha, dw0, "
                       "ds0).");
}

}  // namespace

void bind_titans(nb::module_& m) {
  bind_type<float>(m);
  bind_type<double>(m);
  bind_backward<float>(m);
  bind_backward<double>(m);
}
