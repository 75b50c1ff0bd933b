// _held_ops_scenario_for_test: HeldOps (held_ops.h) against a scripted
// device, for tests/test_held_ops.py: when each op's device work finishes
// (or never), which op faults, when a peer dies or the group fails from
// elsewhere.  Returns what HeldOps did, with the time of each event.
//
// _failed_op_fence_scenario_for_test: a failed op whose device work is
// still queued, on deferred streams (devices/deferred_mover.h) that, like a
// device's, run it after the failure; with or without the engine's fence
// (fence_failed_op).  Returns whether HeldOps let the op go before its
// queued writes into its memory had run.
#include <pybind11/stl.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "devices/deferred_mover.h"
#include "pipeline/held_ops.h"
#include "common/error.h"

namespace py = pybind11;

namespace fairring {

namespace {

using Clock = std::chrono::steady_clock;
using Event = std::tuple<double, std::string, int64_t, std::string>;  // ms, kind, op seq (-1: none), text

struct Recorder {
  const Clock::time_point t0 = Clock::now();
  std::mutex mu;
  std::vector<Event> events;

  double ms() const { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }
  void add(const std::string& kind, int64_t seq, const std::string& text) {
    const double at = ms();
    std::lock_guard<std::mutex> lock(mu);
    events.emplace_back(at, kind, seq, text);
  }
};

std::vector<Event> run_scenario(int64_t timeout_ms, const std::vector<int64_t>& finish_ms, int64_t error_op,
                                int64_t peer_dies_ms, int64_t fail_ms, int64_t run_ms) {
  auto rec = std::make_shared<Recorder>();
  HeldOps* held_ptr = nullptr;
  HeldOps::Hooks hooks;
  hooks.finished = [rec, finish_ms, error_op](const PipelineOp& op) {
    const int64_t due = finish_ms.at(op.seq);
    if (static_cast<int64_t>(op.seq) == error_op && rec->ms() >= std::max<int64_t>(due, 0)) {
      throw std::runtime_error("an illegal memory access was encountered (scripted)");
    }
    return due >= 0 && rec->ms() >= due;
  };
  hooks.check_peers = [rec, peer_dies_ms] {
    if (peer_dies_ms >= 0 && rec->ms() >= peer_dies_ms) {
      throw Error(ErrorKind::kNetwork, "rank 1 (pid 4242) exited while this rank's CUDA work waited for it");
    }
  };
  // As the engine: fail() tells HeldOps through on_failed.
  hooks.fault = [rec, &held_ptr](const Error& why) {
    rec->add("fault", -1, why.what());
    held_ptr->group_failed(why);
  };
  hooks.device_failed = [rec](const PipelineOp& op, const Error& why) {
    rec->add("device_failed", static_cast<int64_t>(op.seq), why.what());
  };
  HeldOps held(0, std::move(hooks), std::chrono::milliseconds(timeout_ms));
  held_ptr = &held;
  for (size_t i = 0; i < finish_ms.size(); ++i) {
    std::shared_ptr<PipelineOp> op(new PipelineOp, [rec](PipelineOp* p) {
      rec->add("released", static_cast<int64_t>(p->seq), "");
      delete p;
    });
    op->seq = i;
    op->number = i;
    held.hold(std::move(op));
  }
  auto sleep_until_ms = [&](int64_t t) { std::this_thread::sleep_until(rec->t0 + std::chrono::milliseconds(t)); };
  if (fail_ms >= 0) {
    sleep_until_ms(fail_ms);
    rec->add("group_failed", -1, "");
    held.group_failed(Error(ErrorKind::kBackend, "the group failed elsewhere (scripted)"));
  }
  sleep_until_ms(run_ms);
  rec->add("stop", -1, "");
  held.stop();
  rec->add("stopped", -1, "");
  std::lock_guard<std::mutex> lock(rec->mu);
  return rec->events;
}

// What became of the op's memory: writes queued on its streams, how many
// had run when HeldOps released it, how many ran after.
struct FenceOutcome {
  std::atomic<int> written{0};
  std::atomic<int> after_release{0};
  std::atomic<bool> released{false};
  std::atomic<int> written_at_release{-1};
  std::atomic<bool> done_recorded{false};  // a CUDA event never recorded reads as complete
  std::atomic<bool> done_reached{false};
  std::atomic<int> reported{0};  // device_failed calls
};

std::tuple<bool, int, int, int, int> run_fence_scenario(int streams, int writes_per_stream, int64_t step_ms,
                                                        bool fence) {
  auto out = std::make_shared<FenceOutcome>();
  // The op's streams (slots, the rail's) and the tail, the last one.
  DeferredStreams device(streams + 1, 7);
  const int tail = streams;
  for (int s = 0; s < streams; ++s) {
    for (int w = 0; w < writes_per_stream; ++w) {
      device.enqueue(s, [out, step_ms] {
        std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
        if (out->released.load()) out->after_release.fetch_add(1);
        out->written.fetch_add(1);
      });
    }
  }
  HeldOps::Hooks hooks;
  hooks.finished = [out](const PipelineOp&) { return !out->done_recorded.load() || out->done_reached.load(); };
  hooks.check_peers = [] {};
  hooks.fault = [](const Error&) {};
  hooks.device_failed = [out](const PipelineOp&, const Error&) { out->reported.fetch_add(1); };
  HeldOps held(0, std::move(hooks), std::chrono::milliseconds(10000));
  // As the engine: the group fails (on_failed), the op is settled (the
  // fence), then held (completion_call).
  held.group_failed(Error(ErrorKind::kBackend, "the group failed (scripted)"));
  if (fence) {
    fence_failed_op(
        streams, [&](int s) { device.join(tail, s); },
        [&] {
          out->done_recorded = true;
          device.enqueue(tail, [out] { out->done_reached = true; });
        });
  }
  std::shared_ptr<PipelineOp> op(new PipelineOp, [out](PipelineOp* p) {
    out->written_at_release = out->written.load();
    out->released = true;
    delete p;
  });
  held.hold(std::move(op));
  const auto give_up = Clock::now() + std::chrono::seconds(10);
  while (!out->released.load() && Clock::now() < give_up) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  device.synchronize();
  held.stop();
  return {out->released.load(), out->written_at_release.load(), out->written.load(), out->after_release.load(),
          out->reported.load()};
}

}  // namespace

void register_held_ops_bindings(py::module& m) {
  m.def(
      "_failed_op_fence_scenario_for_test",
      [](int streams, int writes_per_stream, int64_t step_ms, bool fence) {
        py::gil_scoped_release no_gil;
        return run_fence_scenario(streams, writes_per_stream, step_ms, fence);
      },
      py::arg("streams"), py::arg("writes_per_stream"), py::arg("step_ms"), py::arg("fence"));
  m.def(
      "_held_ops_scenario_for_test",
      [](int64_t timeout_ms, const std::vector<int64_t>& finish_ms, int64_t error_op, int64_t peer_dies_ms,
         int64_t fail_ms, int64_t run_ms) {
        py::gil_scoped_release no_gil;
        return run_scenario(timeout_ms, finish_ms, error_op, peer_dies_ms, fail_ms, run_ms);
      },
      py::arg("timeout_ms"), py::arg("finish_ms"), py::arg("error_op") = -1, py::arg("peer_dies_ms") = -1,
      py::arg("fail_ms") = -1, py::arg("run_ms"));
}

}  // namespace fairring
