// What the distributed calls share: agreeing on errors and sizes across ranks, packing shards.
#pragma once
#include <mpi.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "attn/tensor.hpp"

namespace attn::distributed::detail {

struct Comm {
  MPI_Comm comm;
  int rank = 0, size = 1;
  explicit Comm(MPI_Comm c);
};

// Every rank passes its own error (empty: none). If any rank has one, every rank throws
// attn::Error with the first failing rank's message ("<where>: rank r of R: ..."), so no rank is
// left waiting in a later collective. global: the error comes from checks every rank made on the
// same all-gathered data (no rank to name).
void agree(const Comm& c, const std::string& where, const std::string& local_error, bool global = false);

// Runs f() and returns the attn::Error (or std::exception) message it threw, or "".
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

// All-gathers a fixed-size record of int64 from every rank: out[rank * n + i].
std::vector<int64_t> allgather(const Comm& c, const std::vector<int64_t>& mine);

// FNV-1a of a text (a mechanism's canonical form) or of integers, to compare what every rank
// passed within the size all-gather (a mechanism that differs on one rank must fail everywhere).
int64_t fingerprint(const std::string& text);
int64_t fingerprint(const std::vector<int64_t>& values);

// A 4-d view's dims as "(2, 4, 7, 16)".
std::string dims(const TensorView& v);
std::string dims(const std::array<int64_t, 4>& s);

// Copies a view (any strides) into a contiguous (B, H, N, D) buffer of its own dtype at dst;
// returns the byte after the last one written.
char* pack(const TensorView& x, char* dst);
// A contiguous float32 (B, H, N, D) view over data.
TensorView f32_view(float* data, int64_t B, int64_t H, int64_t N, int64_t D);
// Rows [first, first + count) of the token dimension of x.
TensorView rows(TensorView x, int64_t first, int64_t count);
// Does x look like (B, N, H, D) memory (heads innermost after D)?
Layout layout_of(const TensorView& x);

// MPI counts are ints: fails (the same way on every rank, from agreed sizes) beyond INT_MAX.
int mpi_count(int64_t n, const std::string& where);

}  // namespace attn::distributed::detail
