// What the Python bindings of the model-level pieces share: the arrays they take (C-contiguous
// CPU arrays of one element type) and the NumPy arrays they return, owning a vector the C++ call
// filled.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <initializer_list>
#include <vector>

namespace attn::python {

template <class T, class... Extra>
using In = nanobind::ndarray<const T, nanobind::c_contig, nanobind::device::cpu, Extra...>;

// A NumPy array over *v of `shape`, which owns v (deleted with the array).
template <class T>
nanobind::ndarray<nanobind::numpy, T> owned_array(std::vector<T>* v, std::initializer_list<size_t> shape) {
  nanobind::capsule owner(v, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nanobind::ndarray<nanobind::numpy, T>(v->data(), shape, owner);
}

}  // namespace attn::python
