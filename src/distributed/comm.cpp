#include "distributed/comm.hpp"

#include <climits>
#include <cstring>

#include "attn/error.hpp"

namespace attn::distributed::detail {

Comm::Comm(MPI_Comm c) : comm(c) {
  MPI_Comm_rank(c, &rank);
  MPI_Comm_size(c, &size);
}

void agree(const Comm& c, const std::string& where, const std::string& local_error, bool global) {
  int mine = local_error.empty() ? 0 : 1;
  std::vector<int> flags(static_cast<size_t>(c.size));
  MPI_Allgather(&mine, 1, MPI_INT, flags.data(), 1, MPI_INT, c.comm);
  int first = -1;
  for (int r = 0; r < c.size && first < 0; ++r)
    if (flags[static_cast<size_t>(r)]) first = r;
  if (first < 0) return;
  // The first failing rank's message, to every rank.
  std::string text = c.rank == first ? local_error : std::string();
  int length = static_cast<int>(text.size());
  MPI_Bcast(&length, 1, MPI_INT, first, c.comm);
  text.resize(static_cast<size_t>(length));
  MPI_Bcast(text.data(), length, MPI_CHAR, first, c.comm);
  const std::string prefix = where + ": ";  // said once, in front
  if (text.compare(0, prefix.size(), prefix) == 0) text = text.substr(prefix.size());
  int failing = 0;
  for (int f : flags) failing += f;
  if (global) throw Error(where + ": " + text);
  std::string msg = where + ": rank " + std::to_string(first) + " of " + std::to_string(c.size) + ": " + text;
  if (failing > 1) msg += " (and " + std::to_string(failing - 1) + " more rank" + (failing > 2 ? "s" : "") + " failed)";
  throw Error(msg);
}

std::vector<int64_t> allgather(const Comm& c, const std::vector<int64_t>& mine) {
  std::vector<int64_t> out(mine.size() * static_cast<size_t>(c.size));
  MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_INT64_T, out.data(), static_cast<int>(mine.size()),
                MPI_INT64_T, c.comm);
  return out;
}

int64_t fingerprint(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ull;
  return static_cast<int64_t>(h);
}

int64_t fingerprint(const std::vector<int64_t>& values) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t x : values) h = (h ^ static_cast<uint64_t>(x)) * 1099511628211ull;
  return static_cast<int64_t>(h);
}

std::string dims(const std::array<int64_t, 4>& s) {
  std::string out = "(";
  for (size_t i = 0; i < 4; ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + ")";
}
std::string dims(const TensorView& v) { return dims(v.shape); }

char* pack(const TensorView& x, char* dst) {
  const auto [B, H, N, D] = x.shape;
  const size_t es = dtype_size(x.dtype);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t c = 0; c < D; ++c, dst += es) std::memcpy(dst, x.ptr(b, h, n, c), es);
  return dst;
}

TensorView f32_view(float* data, int64_t B, int64_t H, int64_t N, int64_t D) {
  return make_view(data, DType::f32, B, H, N, D, Layout::bhnd);
}

TensorView rows(TensorView x, int64_t first, int64_t count) {
  x.data = static_cast<char*>(x.data) + x.strides[2] * first * static_cast<int64_t>(dtype_size(x.dtype));
  x.shape[2] = count;
  return x;
}

Layout layout_of(const TensorView& x) {
  return x.shape[1] > 1 && x.shape[2] > 1 && x.strides[2] > x.strides[1] ? Layout::bnhd : Layout::bhnd;
}

int mpi_count(int64_t n, const std::string& where) {
  if (n > INT_MAX) fail(where, "a message of " + std::to_string(n) + " floats exceeds MPI's int count (INT_MAX)");
  return static_cast<int>(n);
}

}  // namespace attn::distributed::detail
