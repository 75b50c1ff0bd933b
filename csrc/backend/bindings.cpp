// The Python module fairring_py._C.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/extension.h>
#include <torch/version.h>

#include "allreduce/plan.h"
#include "allreduce/rail_plan.h"
#include "pipeline/slice_schedule.h"
#include "allreduce/node_arena.h"
#include "backend/backend.h"
#include "backend/init_store.h"
#include "common/config.h"
#include "pipeline/pipeline.h"
#include "topology/topology.h"

namespace py = pybind11;

namespace fairring {
void register_kernel_bindings(py::module& m);  // kernels/kernel_bindings.cpp
void register_cuda_kernel_bindings(py::module& m);  // kernels/cuda_kernel_bindings.cpp
void register_held_ops_bindings(py::module& m);  // pipeline/held_ops_bindings.cpp
}

namespace {

py::dict topology_dict(const fairring::Topology& t) {
  py::dict d;
  d["rank"] = t.rank;
  d["size"] = t.size;
  d["num_nodes"] = t.num_nodes;
  d["ranks_per_node"] = t.ranks_per_node;
  d["node"] = t.node;
  d["local_rank"] = t.local_rank;
  d["flattened"] = t.flattened;
  d["node_ranks"] = t.node_ranks;
  d["rail"] = t.rail();
  return d;
}

py::list ranges(const std::vector<fairring::Range>& rs) {
  py::list out;
  for (const auto& r : rs) out.append(py::make_tuple(r.offset, r.count));
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace fairring;
  m.doc() = "Fairring: hierarchical, reduction-server all-reduce for torch.distributed";
  // The base class is registered by torch's own module.
  py::module::import("torch.distributed");

  py::class_<Config>(m, "Config")
      .def(py::init<>())
      .def_readwrite("slice_size", &Config::slice_size)
      .def_readwrite("total_memory", &Config::total_memory)
      .def_readwrite("parallelism", &Config::parallelism)
      .def_readwrite("socket_ifname", &Config::socket_ifname)
      .def_readwrite("gpu_transport", &Config::gpu_transport)
      .def_readwrite("wire_dtype", &Config::wire_dtype)
      .def_readwrite("timeout", &Config::timeout);

  // What the extension was built with, for fairring_py.info (bug reports).
  m.def("_build_info", [] {
    py::dict d;
    d["torch_built_against"] = TORCH_VERSION;
#ifdef FAIRRING_WITH_CUDA
    d["cuda"] = true;
    d["cuda_arch_list"] = FAIRRING_CUDA_ARCH_LIST;
#else
    d["cuda"] = false;
    d["cuda_arch_list"] = "";
#endif
    return d;
  });

  // The one copy of the defaults and bounds; fairring_py/options.py reads them.
  py::dict defaults;
  defaults["slice_size"] = limits::kDefaultSliceSize;
  defaults["total_memory"] = limits::kDefaultTotalMemory;
  defaults["parallelism"] = limits::kDefaultParallelism;
  defaults["wire_dtype"] = Config().wire_dtype;
  m.attr("DEFAULTS") = defaults;
  py::dict bounds;
  bounds["slice_size"] = py::make_tuple(limits::kMinSliceSize, limits::kMaxSliceSize);
  bounds["total_memory"] = py::make_tuple(1, limits::kMaxTotalMemory);
  bounds["parallelism"] = py::make_tuple(1, limits::kMaxParallelism);
  m.attr("LIMITS") = bounds;

  py::class_<FairringBackend, c10d::Backend, c10::intrusive_ptr<FairringBackend>>(m, "FairringBackend")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, const Config& config,
                       const std::string& node_key, const c10::intrusive_ptr<c10d::Backend>& fallback) {
             return c10::make_intrusive<FairringBackend>(store, rank, size, config, node_key, fallback);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("config"), py::arg("node_key"),
           py::arg("fallback"), py::call_guard<py::gil_scoped_release>())
      .def("listen_address", &FairringBackend::listen_address,
           "ip:port of this rank's TCP listener, or '' when the group is a single node")
      .def("topology", [](const FairringBackend& b) { return topology_dict(b.topology()); })
      .def("order_waits", &FairringBackend::order_waits,
           "How many ops of this group waited for an earlier op whose memory they share (one of them "
           "writing it): the issue-order rule at work")
      .def(
          "recent_ops",
          [](const FairringBackend& b) {
            const auto now = std::chrono::steady_clock::now();
            auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
            py::list out;
            for (const auto& r : b.recent_ops().snapshot()) {
              py::dict d;
              d["seq"] = r.seq;
              d["kind"] = r.kind;
              d["what"] = r.what;
              d["bytes"] = r.bytes;
              d["state"] = r.state;
              d["error"] = r.error;
              d["started_ms_ago"] = ms(now - r.start);
              d["duration_ms"] = r.ended() ? py::cast(ms(r.end - r.start)) : py::none();
              out.append(d);
            }
            return out;
          },
          "The group's last collectives, oldest first (fairring_py.dump_recent)")
      .def("format_recent_ops", [](const FairringBackend& b) { return b.recent_ops().format(); },
           "recent_ops() as text, one line per collective, as logged at the group's first failure");

  // Group creation steps run from Python (fairring_py._create_backend),
  // through the same failure-aware store as the C++ ones.
  m.def(
      "_init_checkpoint",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout,
         const std::string& stage) { c10::make_intrusive<InitStore>(store, rank, size, timeout)->checkpoint(stage); },
      py::call_guard<py::gil_scoped_release>(),
      "Returns once every rank of the group reached `stage` of its creation; raises the first rank's failure.");
  m.def(
      "_init_failed",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout,
         const std::string& why) {
        auto init = c10::make_intrusive<InitStore>(store, rank, size, timeout);
        // The first failure is this rank's: let the others read it before this rank raises.
        if (init->publish_failure(why)) init->await_failure_read();
      },
      py::call_guard<py::gil_scoped_release>(), "Tells the group's other ranks why this rank cannot create it.");
  m.def("_sweep_stale_segments", [] { return sweep_stale_segments(); },
        "Removes this user's /dev/shm segments of Fairring jobs whose creator exited over a minute ago; "
        "returns how many");
  m.def("_quiesce_all", [] { Pipeline::quiesce_all(); },
      py::call_guard<py::gil_scoped_release>(),
        "Waits for in-flight all_reduces and lets the engines' threads drop their "
        "tensors; registered with atexit by fairring_py.");
  m.def("_topology_for_test", [](const std::vector<std::string>& keys, int rank) {
    return topology_dict(build_topology(keys, rank));
  });
  m.def("_split_even_for_test", [](int64_t count, int parts, int64_t align) {
    return ranges(split_even(count, parts, align));
  });
  // A collective by its name ("all_reduce", "reduce_scatter", ...).
  const auto collective_named = [](const std::string& name) {
    for (int32_t c = 1; c <= static_cast<int32_t>(Collective::kAllGather); ++c) {
      if (name == collective_name(static_cast<Collective>(c))) return static_cast<Collective>(c);
    }
    throw std::invalid_argument("fairring: no collective named " + name);
  };
  m.def(
      "_plan_for_test",
      [collective_named](int64_t numel, int64_t elem_size, int ranks_per_node, int num_nodes, int64_t slice_bytes,
                         int64_t min_chunk_bytes, int64_t min_shard_bytes, const std::string& collective) {
        const Collective c = collective_named(collective);
        PlanParams p;
        p.slice_bytes = slice_bytes;
        p.min_chunk_bytes = min_chunk_bytes;
        p.min_shard_bytes = min_shard_bytes;
        py::list slices;
        const int64_t n = num_slices(c, numel, elem_size, ranks_per_node * num_nodes, p);
        for (int64_t i = 0; i < n; ++i) {
          SlicePlan s = plan_slice(c, numel, elem_size, i, ranks_per_node, num_nodes, p);
          py::dict d;
          d["slice"] = py::make_tuple(s.slice.offset, s.slice.count);
          d["chunks"] = ranges(s.chunks);
          py::list shards;
          for (const auto& sh : s.shards) shards.append(ranges(sh));
          d["shards"] = shards;
          d["replicated"] = s.replicated;
          slices.append(d);
        }
        return slices;
      },
      py::arg("numel"), py::arg("elem_size"), py::arg("ranks_per_node"), py::arg("num_nodes"),
      py::arg("slice_bytes") = PlanParams().slice_bytes, py::arg("min_chunk_bytes") = PlanParams().min_chunk_bytes,
      py::arg("min_shard_bytes") = PlanParams().min_shard_bytes, py::arg("collective") = "all_reduce");
  m.def("_blockwise_fits_for_test", [](int64_t elem_size, int world, int64_t slice_bytes) {
    PlanParams p;
    p.slice_bytes = slice_bytes;
    return blockwise_fits(elem_size, world, p);
  });

  // The rail exchange of a chunk with these shards, seen from `node`.
  m.def("_rail_walk_for_test", [](const std::vector<std::pair<int64_t, int64_t>>& shards, int node, int num_nodes) {
    std::vector<Range> rs;
    for (const auto& s : shards) rs.push_back(Range{s.first, s.second});
    const RailPlan p = plan_rail(rs, node, num_nodes);
    py::dict d;
    py::list remote;
    for (const auto& r : p.remote) remote.append(py::make_tuple(r.node, r.shard.offset, r.shard.count));
    d["remote"] = remote;
    d["serves"] = p.serves;
    d["served"] = py::make_tuple(p.served.offset, p.served.count);
    d["contributors"] = p.contributors;
    return d;
  });

  // The phase list of a collective (by name) on a node of `ranks_per_node`.
  m.def("_phases_for_test", [collective_named](const std::string& collective, int ranks_per_node) {
    const PhaseList l = phases_of(collective_named(collective), ranks_per_node);
    std::vector<std::string> names;
    for (Phase p : l.phases) names.push_back(phase_name(p));
    return py::make_tuple(names, l.front);
  });

  m.def(
      "_max_shard_bytes_for_test",
      [](int ranks_per_node, int num_nodes, int64_t slice_bytes, int64_t min_chunk_bytes, int64_t min_shard_bytes) {
        PlanParams p;
        p.slice_bytes = slice_bytes;
        p.min_chunk_bytes = min_chunk_bytes;
        p.min_shard_bytes = min_shard_bytes;
        return max_shard_bytes(p, ranks_per_node, num_nodes);
      });

  register_kernel_bindings(m);
  register_cuda_kernel_bindings(m);
  register_held_ops_bindings(m);
}
