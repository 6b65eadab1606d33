// attn._attn's output-layer softmaxes (attn/output_softmax.hpp): log_softmax and the
// hierarchical and adaptive softmaxes for float32 and float64. The Python side
// (python/attn/output_softmax.py) hands over C-contiguous arrays of the model's dtype; results
// are new NumPy arrays. The GIL is released while C++ computes.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <string>

#include "attn/output_softmax.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

template <class T, class... Extra>
using In = nb::ndarray<const T, nb::c_contig, nb::device::cpu, Extra...>;
using Ids = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// Memory for a result, not zero-filled (every entry is written: (N, V) log_prob is 200 MB at
// V = 50,000, and a zero pass would cost as much as the exps). Results of 4 MB or more are
// aligned to 2 MB and marked for transparent huge pages: first touching 200 MB in 4 KB pages
// costs 50,000 page faults, a fifth of log_prob's time.
template <class T>
struct Buffer {
  T* p = nullptr;
  explicit Buffer(size_t n) {
    constexpr size_t kHuge = size_t{2} << 20;
    const size_t bytes = std::max<size_t>(n * sizeof(T), 1);
    if (bytes >= 2 * kHuge) {
      p = static_cast<T*>(std::aligned_alloc(kHuge, (bytes + kHuge - 1) / kHuge * kHuge));
#ifdef MADV_HUGEPAGE
      if (p != nullptr) madvise(p, (bytes + kHuge - 1) / kHuge * kHuge, MADV_HUGEPAGE);  // a hint only
#endif
    } else {
      p = static_cast<T*>(std::malloc(bytes));
    }
    if (p == nullptr) throw std::bad_alloc();
  }
  ~Buffer() { std::free(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  T* data() { return p; }
};
// A new NumPy array of `shape` whose memory a Buffer owns.
template <class T>
struct Owned {
  Buffer<T>* data;
  nb::ndarray<nb::numpy, T> array(std::initializer_list<size_t> shape) {
    nb::capsule owner(data, [](void* p) noexcept { delete static_cast<Buffer<T>*>(p); });
    return nb::ndarray<nb::numpy, T>(data->data(), shape, owner);
  }
};
template <class T>
Owned<T> owned(int64_t n) {
  return {new Buffer<T>(static_cast<size_t>(n))};
}

template <class T>
const char* suffix() {
  return sizeof(T) == 4 ? "F32" : "F64";
}

template <class T>
void bind_type(nb::module_& m) {
  m.def(
      (std::string("log_softmax_") + (sizeof(T) == 4 ? "f32" : "f64")).c_str(),
      [](In<T, nb::ndim<2>> x, int threads) {
        const int64_t rows = static_cast<int64_t>(x.shape(0)), n = static_cast<int64_t>(x.shape(1));
        auto out = owned<T>(rows * n);
        {
          nb::gil_scoped_release release;
          attn::log_softmax(x.data(), out.data->data(), rows, n, threads);
        }
        return out.array({static_cast<size_t>(rows), static_cast<size_t>(n)});
      },
      "x"_a, "threads"_a = 0, "attn::log_softmax over the rows of a C-contiguous (rows, n) array.");

  using H = attn::HierarchicalSoftmax<T>;
  nb::class_<H>(m, (std::string("HierarchicalSoftmax") + suffix<T>()).c_str(),
                "attn::HierarchicalSoftmax: word2vec's Huffman tree and one theta row per inner node.")
      .def(
          "__init__",
          [](H* self, Ids counts, In<T, nb::ndim<2>> theta) {
            const std::span<const int64_t> c(counts.data(), counts.shape(0));
            new (self) H(H::from_counts(c, std::span<const T>(theta.data(), theta.size()),
                                        static_cast<int64_t>(theta.shape(1))));
          },
          "counts"_a, "theta"_a)
      .def_prop_ro("vocab_size", &H::vocab_size)
      .def_prop_ro("dim", &H::dim)
      .def("code", [](const H& h, int64_t w) { return h.tree().code_string(w); }, "word"_a)
      .def(
          "path",
          [](const H& h, int64_t w) {
            const auto p = h.tree().path(w);
            return std::vector<int32_t>(p.begin(), p.end());
          },
          "word"_a)
      .def(
          "log_prob",
          [](const H& self, In<T, nb::ndim<2>> h, Ids targets, int threads) {
            const int64_t rows = static_cast<int64_t>(h.shape(0));
            auto out = owned<T>(rows);
            {
              nb::gil_scoped_release release;
              self.log_prob(h.data(), rows, targets.data(), out.data->data(), threads);
            }
            return out.array({static_cast<size_t>(rows)});
          },
          "h"_a, "targets"_a, "threads"_a = 0)
      .def(
          "log_prob_all",
          [](const H& self, In<T, nb::ndim<2>> h, int threads) {
            const int64_t rows = static_cast<int64_t>(h.shape(0)), V = self.vocab_size();
            auto out = owned<T>(rows * V);
            {
              nb::gil_scoped_release release;
              self.log_prob_all(h.data(), rows, out.data->data(), threads);
            }
            return out.array({static_cast<size_t>(rows), static_cast<size_t>(V)});
          },
          "h"_a, "threads"_a = 0);

  using A = attn::AdaptiveLogSoftmaxWithLoss<T>;
  using Mat = In<T, nb::ndim<2>>;
  nb::class_<A>(m, (std::string("AdaptiveLogSoftmaxWithLoss") + suffix<T>()).c_str(),
                "attn::AdaptiveLogSoftmaxWithLoss: torch's module of that name over copied weights.")
      .def(
          "__init__",
          [](A* self, int64_t n_classes, std::vector<int64_t> cutoffs, Mat head, std::optional<In<T, nb::ndim<1>>> bias,
             std::vector<std::pair<Mat, Mat>> tail) {
            const auto ref = [](const Mat& a) {
              return attn::MatrixRef<T>{a.data(), static_cast<int64_t>(a.shape(0)), static_cast<int64_t>(a.shape(1))};
            };
            std::vector<std::pair<attn::MatrixRef<T>, attn::MatrixRef<T>>> t;
            for (const auto& [p, o] : tail) t.push_back({ref(p), ref(o)});
            const std::span<const T> b = bias ? std::span<const T>(bias->data(), bias->shape(0)) : std::span<const T>();
            new (self) A(n_classes, std::move(cutoffs), ref(head), b, t);
          },
          "n_classes"_a, "cutoffs"_a, "head_weight"_a, "head_bias"_a.none(), "tail"_a)
      .def_prop_ro("in_features", &A::in_features)
      .def_prop_ro("n_classes", &A::n_classes)
      .def_prop_ro("cutoffs", &A::cutoffs)
      .def(
          "log_prob",
          [](const A& a, Mat x, int threads) {
            const int64_t rows = static_cast<int64_t>(x.shape(0));
            auto out = owned<T>(rows * a.n_classes());
            {
              nb::gil_scoped_release release;
              a.log_prob(x.data(), rows, out.data->data(), threads);
            }
            return out.array({static_cast<size_t>(rows), static_cast<size_t>(a.n_classes())});
          },
          "x"_a, "threads"_a = 0)
      .def(
          "predict",
          [](const A& a, Mat x, int threads) {
            const int64_t rows = static_cast<int64_t>(x.shape(0));
            auto out = owned<int64_t>(rows);
            {
              nb::gil_scoped_release release;
              a.predict(x.data(), rows, out.data->data(), threads);
            }
            return out.array({static_cast<size_t>(rows)});
          },
          "x"_a, "threads"_a = 0)
      .def(
          "forward",
          [](const A& a, Mat x, Ids target, int threads) {
            const int64_t rows = static_cast<int64_t>(x.shape(0));
            auto out = owned<T>(rows);
            T loss;
            {
              nb::gil_scoped_release release;
              loss = a.forward(x.data(), rows, target.data(), out.data->data(), threads);
            }
            return nb::make_tuple(out.array({static_cast<size_t>(rows)}), loss);
          },
          "x"_a, "target"_a, "threads"_a = 0, "(log p(target) per row, mean of its negation).");
}

}  // namespace

void bind_output_softmax(nb::module_& m) {
  bind_type<float>(m);
  bind_type<double>(m);
}
