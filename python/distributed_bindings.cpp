// attn._attn's distributed calls (attn/distributed.hpp), compiled only when CMake finds MPI. The
// Python side (python/attn/distributed.py) passes C-contiguous float32 (B, H, N, D) arrays and
// mpi4py's communicator as its Fortran handle (comm.py2f()), turned back with MPI_Comm_f2c: mpi4py
// and this module load the same libmpi. The GIL is released while the ranks communicate.
#include <mpi.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <utility>

#include "attn/distributed.hpp"
#include "attn/error.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using In = nb::ndarray<const float, nb::ndim<4>, nb::c_contig, nb::device::cpu>;

attn::TensorView view_of(const In& a) {
  return attn::make_view(const_cast<float*>(a.data()), attn::DType::f32, static_cast<int64_t>(a.shape(0)),
                         static_cast<int64_t>(a.shape(1)), static_cast<int64_t>(a.shape(2)),
                         static_cast<int64_t>(a.shape(3)));
}

// A NumPy array owning t (float32, contiguous (B, H, N, D)); `dims` of its 4 (lse: 3).
nb::object numpy_of(attn::Tensor&& t, int dims = 4) {
  if (!t.defined()) return nb::none();
  auto* owned = new attn::Tensor(std::move(t));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<attn::Tensor*>(p); });
  const auto& s = owned->view().shape;
  const size_t shape[4] = {static_cast<size_t>(s[0]), static_cast<size_t>(s[1]), static_cast<size_t>(s[2]),
                           static_cast<size_t>(s[3])};
  return nb::cast(nb::ndarray<nb::numpy, float>(owned->view().data, static_cast<size_t>(dims), shape, owner));
}

MPI_Comm comm_of(int64_t handle) {
  int ready = 0;
  MPI_Initialized(&ready);
  if (!ready) throw attn::Error("attn.distributed: MPI is not initialised (import mpi4py.MPI first)");
  return MPI_Comm_f2c(static_cast<MPI_Fint>(handle));
}

}  // namespace

void bind_distributed(nb::module_& m) {
  m.attr("has_mpi") = true;
  m.def(
      "distributed_attention",
      [](const In& q, const In& k, const In& v, int64_t comm, const std::string& mechanism, bool return_lse,
         const std::vector<int64_t>& cu_seqlens) {
        const attn::Mechanism mech = attn::parse_mechanism(mechanism);
        attn::distributed::RingOptions o;
        o.return_lse = return_lse;
        o.cu_seqlens = cu_seqlens;
        attn::distributed::RingStats st;
        o.stats = &st;
        attn::AttendResult r;
        {
          nb::gil_scoped_release release;
          r = attn::distributed::ring_attention(view_of(q), view_of(k), view_of(v), comm_of(comm), mech, o);
        }
        nb::dict stats;
        stats["steps"] = st.steps, stats["blocks_computed"] = st.blocks_computed;
        stats["blocks_skipped"] = st.blocks_skipped, stats["bytes_sent"] = st.bytes_sent;
        stats["compute_seconds"] = st.compute_seconds, stats["wait_seconds"] = st.wait_seconds;
        stats["total_seconds"] = st.total_seconds;
        return nb::make_tuple(numpy_of(std::move(r.out)), numpy_of(std::move(r.lse), 3), stats);
      },
      "q"_a, "k"_a, "v"_a, "comm"_a, "mechanism"_a, "return_lse"_a, "cu_seqlens"_a = std::vector<int64_t>{},
      "Ring attention over the ranks of comm (a Fortran handle); (B, H, n_local, D) float32 shards.");
  m.def(
      "distributed_attention_backward",
      [](const In& dout, const In& q, const In& k, const In& v, const In& out, const In& lse, int64_t comm,
         const std::string& mechanism, const std::vector<int64_t>& cu_seqlens) {
        const attn::Mechanism mech = attn::parse_mechanism(mechanism);
        attn::distributed::RingOptions o;
        o.cu_seqlens = cu_seqlens;
        attn::AttendGradients g;
        {
          nb::gil_scoped_release release;
          g = attn::distributed::ring_attention_backward(view_of(dout), view_of(q), view_of(k), view_of(v), view_of(out),
                                                         view_of(lse), comm_of(comm), mech, o);
        }
        return nb::make_tuple(numpy_of(std::move(g.dq)), numpy_of(std::move(g.dk)), numpy_of(std::move(g.dv)));
      },
      "dout"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "comm"_a, "mechanism"_a, "cu_seqlens"_a = std::vector<int64_t>{},
      "The ring's backward: (dq, dk, dv) of this rank's shards, float32 (B, H, n_local, D) arrays.");
  m.def(
      "distributed_linear_attention_backward",
      [](const In& dout, const In& q, const In& k, const In& v, int64_t comm, const std::string& mechanism,
         std::optional<In> dfinal_state) {
        const attn::Mechanism mech = attn::parse_mechanism(mechanism);
        const auto* lin = std::get_if<attn::Linear>(&mech);
        if (!lin) throw attn::Error("attn.distributed.linear_attention_backward: mechanism must be linear, got '" + mechanism + "'");
        attn::AttendGradients g;
        {
          nb::gil_scoped_release release;
          const attn::TensorView df = dfinal_state ? view_of(*dfinal_state) : attn::TensorView{};
          g = attn::distributed::linear_attention_backward(view_of(dout), view_of(q), view_of(k), view_of(v),
                                                           comm_of(comm), *lin, dfinal_state ? &df : nullptr);
        }
        return nb::make_tuple(numpy_of(std::move(g.dq)), numpy_of(std::move(g.dk)), numpy_of(std::move(g.dv)));
      },
      "dout"_a, "q"_a, "k"_a, "v"_a, "comm"_a, "mechanism"_a, "dfinal_state"_a.none() = nb::none(),
      "LASP-2's backward: (dq, dk, dv) of this rank's shards, float32 (B, H, n_local, D) arrays.");
  m.def(
      "distributed_decode",
      [](const In& q, const In& k, const In& v, int64_t comm, bool return_lse) {
        attn::AttendResult r;
        {
          nb::gil_scoped_release release;
          r = attn::distributed::decode(view_of(q), view_of(k), view_of(v), comm_of(comm), {}, return_lse);
        }
        return nb::make_tuple(numpy_of(std::move(r.out)), numpy_of(std::move(r.lse), 3));
      },
      "q"_a, "k_shard"_a, "v_shard"_a, "comm"_a, "return_lse"_a);
  m.def(
      "distributed_linear_attention",
      [](const In& q, const In& k, const In& v, int64_t comm, const std::string& mechanism) {
        const attn::Mechanism mech = attn::parse_mechanism(mechanism);
        const auto* lin = std::get_if<attn::Linear>(&mech);
        if (!lin) throw attn::Error("attn.distributed.linear_attention: mechanism must be linear, got '" + mechanism + "'");
        attn::AttendResult r;
        {
          nb::gil_scoped_release release;
          r = attn::distributed::linear_attention(view_of(q), view_of(k), view_of(v), comm_of(comm), *lin, true);
        }
        return nb::make_tuple(numpy_of(std::move(r.out)), numpy_of(std::move(r.final_state)));
      },
      "q"_a, "k"_a, "v"_a, "comm"_a, "mechanism"_a);
}
