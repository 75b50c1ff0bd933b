// The Python module fairring_py._C.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>

#include <c10/util/ApproximateClock.h>
#include <c10/util/Logging.h>

#include "plan/plan.h"
#include "node/node_arena.h"
#include "backend/backend.h"
#include "backend/live_groups.h"
#include "backend/init_store.h"
#include "backend/reconfigurable.h"
#include "common/config.h"
#include "common/error.h"
#include "backend/stand_in.h"
#include "pipeline/pipeline.h"
#include "servers/reduction_server.h"
#include "topology/topology.h"

namespace py = pybind11;

namespace fairring {
void register_kernel_bindings(py::module& m);       // testing/kernel_hooks.cpp
void register_cuda_kernel_bindings(py::module& m);  // testing/cuda_kernel_hooks.cpp
void register_held_ops_bindings(py::module& m);     // testing/held_ops_hooks.cpp
void register_plan_hooks(py::module& m);            // testing/plan_hooks.cpp
void register_error_hooks(py::module& m);           // testing/error_hooks.cpp
void register_p2p_hooks(py::module& m);             // testing/p2p_hooks.cpp
}  // namespace fairring

namespace {

py::dict topology_dict(const fairring::Topology& t) {
  py::dict d;
  d["rank"] = t.rank;
  d["size"] = t.size;
  d["num_nodes"] = t.num_nodes;
  d["ranks_per_node"] = t.ranks_per_node;
  d["node"] = t.node;
  d["local_rank"] = t.local_rank;
  d["rails"] = t.rails;
  d["uneven"] = t.uneven;
  d["flattened"] = t.flattened;
  d["node_ranks"] = t.node_ranks;
  d["rail"] = t.rail();
  return d;
}

// make(store, rank, size, timeout) -> FairringBackend, callable from any
// thread and GIL state; the function is released under the GIL too.
fairring::FairringBackend::ChildFactory wrap_factory(py::function make) {
  auto fn = std::shared_ptr<py::function>(new py::function(std::move(make)), [](py::function* f) {
    py::gil_scoped_acquire gil;
    delete f;
  });
  return [fn](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::milliseconds timeout) {
    py::gil_scoped_acquire gil;
    return (*fn)(store, rank, size, timeout).cast<c10::intrusive_ptr<fairring::FairringBackend>>();
  };
}

// Recent ops as dump_recent and the status view return them.
py::list records_to_python(const std::vector<fairring::RecentOps::Record>& records) {
  const int64_t now = c10::getTime();
  auto ms = [](int64_t ns) { return static_cast<double>(ns) / 1e6; };
  py::list out;
  for (const auto& r : records) {
    py::dict d;
    d["seq"] = r.seq;
    d["p2p"] = r.p2p;
    d["kind"] = r.kind;
    d["what"] = r.what;
    d["bytes"] = r.bytes;
    d["state"] = r.state;
    d["error"] = r.error;
    // None where torch's recorder no longer holds the op (state "unknown"),
    // and, for the duration, until it ended.
    d["started_ms_ago"] = r.start_ns ? py::cast(ms(now - *r.start_ns)) : py::none();
    d["duration_ms"] = r.start_ns && r.end_ns ? py::cast(ms(*r.end_ns - *r.start_ns)) : py::none();
    out.append(d);
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace fairring;
  m.doc() = "Fairring: hierarchical, reduction-server all-reduce for torch.distributed";
  // The base class is registered by torch's own module.
  py::module::import("torch.distributed");
  // An engine Error reaching Python through this module's functions (group
  // creation, the test hooks) raises torch's type for its kind, as the
  // Works do (backend/torch_error.h).
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::kInvalidArgument) {
        PyErr_SetString(PyExc_ValueError, e.what());
        return;
      }
      const char* type = e.kind() == ErrorKind::kNetwork ? "DistNetworkError"
                         : e.kind() == ErrorKind::kStore ? "DistStoreError"
                                                         : "DistBackendError";
      PyErr_SetString(py::module::import("torch.distributed").attr(type).ptr(), e.what());
    }
  });

  py::class_<Config>(m, "Config")
      .def(py::init<>())
      .def_readwrite("slice_size", &Config::slice_size)
      .def_readwrite("slice_size_auto", &Config::slice_size_auto)
      .def_readwrite("total_memory", &Config::total_memory)
      .def_readwrite("parallelism", &Config::parallelism)
      .def_readwrite("socket_ifname", &Config::socket_ifname)
      .def_readwrite("gpu_transport", &Config::gpu_transport)
      .def_readwrite("wire_dtype", &Config::wire_dtype)
      .def_readwrite("huge_pages", &Config::huge_pages)
      .def_readwrite("reduction_servers", &Config::reduction_servers)
      .def_readwrite("rail_radix", &Config::rail_radix)
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
  defaults["huge_pages"] = Config().huge_pages;
  defaults["reduction_servers"] = Config().reduction_servers;
  defaults["rail_radix"] = Config().rail_radix;
  m.attr("DEFAULTS") = defaults;
  py::dict bounds;
  bounds["slice_size"] = py::make_tuple(limits::kMinSliceSize, limits::kMaxSliceSize);
  bounds["total_memory"] = py::make_tuple(1, limits::kMaxTotalMemory);
  bounds["parallelism"] = py::make_tuple(1, limits::kMaxParallelism);
  bounds["reduction_servers"] = py::make_tuple(0, limits::kMaxReductionServers);
  bounds["rail_radix"] = py::make_tuple(0, limits::kMaxRailRadix);
  m.attr("LIMITS") = bounds;

  m.def(
      "_flight_recorder",
      [] {
        py::dict d;
        d["on"] = FlightRecord::on();
        d["problem"] = FlightRecord::problem();
        return d;
      },
      "Whether Fairring's ops go into torch's flight recorder, and if not why");
  m.def("_dumps_after_failure", &FlightRecord::dumps_after_failure,
        "Whether a failed group dumps torch's flight recorder (TORCH_FR_DUMP_ON_TIMEOUT, read once)");
  m.def("_dump_flight_recorder", &FlightRecord::dump_to_file, py::arg("rank"), py::arg("stack_traces") = true,
        "torch's flight-recorder dump into $TORCH_FR_DUMP_TEMP_FILE<rank>; returns the file ('' when off)",
        py::call_guard<py::gil_scoped_release>());

  m.def(
      "_live_groups",
      []() {
        std::vector<GroupStatus> groups;
        {
          py::gil_scoped_release no_gil;  // a group being destroyed waits for the reading
          groups = live_group_status();
        }
        py::list out;
        for (const GroupStatus& g : groups) {
          py::dict d;
          d["group_name"] = g.name;
          d["group_desc"] = g.desc;
          d["rank"] = g.rank;
          d["size"] = g.size;
          d["global_ranks"] = g.global_ranks;
          d["collectives_issued"] = g.collectives_issued;
          d["collectives_ended"] = g.ended.collectives;
          d["p2p_issued"] = g.p2p_issued;
          d["p2p_ended"] = g.ended.p2p;
          d["ops"] = records_to_python(g.ops);
          d["error"] = g.error;
          out.append(d);
        }
        return out;
      },
      "This process's Fairring groups that have issued an op, oldest first, as the status view "
      "(fairring_py.status) shows them: names, counts of ops issued and ended, recent ops, first error");

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
      .def("node_keys", &FairringBackend::node_keys)
      .def("order_waits", &FairringBackend::order_waits,
           "How many ops of this group waited for an earlier op whose memory they share (one of them "
           "writing it): the issue-order rule at work")
      .def(
          "recent_ops", [](const FairringBackend& b) { return records_to_python(b.recent_ops().snapshot()); },
          "The group's last collectives, oldest first (fairring_py.dump_recent)")
      .def(
          "format_recent_ops", [](const FairringBackend& b) { return b.recent_ops().format(); },
          "recent_ops() as text, one line per collective, as logged at the group's first failure")
      .def("_set_global_ranks", &FairringBackend::set_global_ranks, py::arg("ranks"),
           "The group's ranks in the default group (torch's flight recorder names them in its dumps)",
           py::call_guard<py::gil_scoped_release>())
      .def(
          "_set_child_factory",
          [](FairringBackend& b, py::function make) { b.set_child_factory(wrap_factory(std::move(make))); },
          "make(store, rank, size, timeout) -> the FairringBackend of a child group (shrink, split); set by "
          "fairring_py at creation")
      .def(
          "error",
          [](FairringBackend& b) {
            const auto first = b.first_error();
            return py::make_tuple(static_cast<int>(b.getError()), first ? std::string(first->what()) : std::string());
          },
          "(getError() as an int: 0 SUCCESS, 1 TIMEOUT, 2 COMM_ERROR, 3 REMOTE_ERROR; the group's first error "
          "or '')");

#ifdef C10D_BACKEND_HAS_RECONFIGURE
  py::class_<ReconfigurableBackend, c10d::Backend, c10::intrusive_ptr<ReconfigurableBackend>>(m,
                                                                                              "ReconfigurableBackend")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, py::function make) {
             return c10::make_intrusive<ReconfigurableBackend>(store, rank, size, timeout,
                                                               wrap_factory(std::move(make)));
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("make"),
           "A group created with enable_reconfigure=True; make(store, rank, size, timeout) builds its members' "
           "FairringBackend at each reconfigure")
      .def("current", &ReconfigurableBackend::current,
           "The FairringBackend of the last reconfigure, or None before the first");
  m.attr("HAS_RECONFIGURE") = true;
#else
  m.attr("HAS_RECONFIGURE") = false;
#endif

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
  m.def(
      "_sweep_stale_segments", [] { return sweep_stale_segments(); },
      "Removes this user's /dev/shm segments of Fairring jobs whose creator exited over a minute ago; "
      "returns how many");
  m.def(
      "_quiesce_all", [] { Pipeline::quiesce_all(); }, py::call_guard<py::gil_scoped_release>(),
      "Waits for in-flight all_reduces and lets the engines' threads drop their "
      "tensors; registered with atexit by fairring_py.");
  // python -m fairring_py.server (fairring_py/server.py).
  py::class_<ReductionServer>(m, "ReductionServer")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, const std::string& ifname, int threads,
                       std::chrono::milliseconds store_poll) {
             ServerOptions o;
             o.ifname = ifname;
             o.threads = threads;
             o.store_poll = store_poll;
             return std::make_unique<ReductionServer>(store, o);
           }),
           py::arg("store"), py::arg("ifname") = "", py::arg("threads") = 1,
           py::arg("store_poll") = std::chrono::milliseconds(1000), py::call_guard<py::gil_scoped_release>(),
           "Joins the job whose root store this is as its next reduction server.")
      .def_property_readonly("index", &ReductionServer::index)
      .def_property_readonly("address", &ReductionServer::address)
      .def("wait", &ReductionServer::wait, py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
           "Blocks up to timeout; False once the server has stopped.")
      .def("stop", &ReductionServer::stop, py::arg("why"), py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("stop_reason", &ReductionServer::stop_reason)
      .def_property_readonly("reductions", &ReductionServer::reductions)
      .def_property_readonly("bytes_in", &ReductionServer::bytes_in)
      .def_property_readonly("sessions", &ReductionServer::sessions);
  // The server learns that the job ended when the store's connection fails,
  // which torch's store client logs as a warning with a C++ backtrace.
  m.def("_quiet_torch_warnings", [] {
    FLAGS_caffe2_log_level = 2; /* errors only */
  });
  m.def("_topology_for_test",
        [](const std::vector<std::string>& keys, int rank) { return topology_dict(build_topology(keys, rank)); });
  m.def(
      "_stand_in_for_test", [](int64_t numel, const at::Tensor& like) { return stand_in(numel, like.options()); },
      "stand_in (backend/stand_in.h) of `like`'s dtype and device: from the block cache on CPU.");
  m.def("_stand_in_cached_bytes_for_test", &host_blocks_cached_bytes,
        "Bytes the host block cache (common/host_blocks.h) holds now.");
  register_kernel_bindings(m);
  register_cuda_kernel_bindings(m);
  register_held_ops_bindings(m);
  register_error_hooks(m);
  register_plan_hooks(m);
  register_p2p_hooks(m);
}
