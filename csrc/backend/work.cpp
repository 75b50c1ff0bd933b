#include "backend/work.h"

#include "backend/torch_error.h"

#include <ATen/record_function.h>
#include <Python.h>
#include <sys/syscall.h>
#include <torch/csrc/Exceptions.h>
#include <unistd.h>

namespace fairring {

namespace {
// How often a wait on the main thread runs pending signal handlers: a
// Ctrl-C takes effect within this.
constexpr auto kSignalPoll = std::chrono::milliseconds(50);

bool on_main_thread() {
  static thread_local const bool main = syscall(SYS_gettid) == getpid();
  return main;
}

// Whether a profiler (or any RecordFunction observer) listens.  Without one
// the base class's range would only be built to be dropped: a heap
// allocation and a copy of the tensor list on every op's latency path.
bool profiling() { return at::hasCallbacks(); }
}  // namespace

FairringWork::FairringWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, const char* profiling_title)
    // With a title, the base class opens an async profiler range with the
    // tensors' shapes, closed by finish(): the trace shows the op's real span.
    : c10d::Work(rank, type, profiling() ? profiling_title : nullptr,
                 profiling() ? std::optional<std::vector<at::Tensor>>(outputs) : std::nullopt),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors())) {}

void FairringWork::wait_interruptibly(std::chrono::milliseconds timeout) {
  // Only the main thread runs Python's signal handlers.
  if (!on_main_thread() || !Py_IsInitialized()) return;
  std::unique_lock<std::mutex> lock(mutex_);
  if (completed_) return;  // small ops are often done by the time wait() is called
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    auto slice = kSignalPoll;
    if (timeout != kNoTimeout) {
      const auto left =
          timeout - std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
      if (left <= std::chrono::milliseconds::zero()) return;
      slice = std::min(slice, left);
    }
    if (cv_.wait_for(lock, slice, [&] { return completed_; })) return;
    lock.unlock();
    {
      pybind11::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() != 0) {
        python_error interrupted;  // torch's carrier of a Python exception through C++
        interrupted.persist();
        const std::string kind = interrupted.type ? reinterpret_cast<PyTypeObject*>(interrupted.type)->tp_name : "?";
        {
          pybind11::gil_scoped_release no_gil;  // the abort joins nothing, but takes the engine's locks
          if (interrupt_hook_) {
            (*interrupt_hook_)("rank " + std::to_string(rank_) + ": interrupted by a signal (" + kind +
                               ") while waiting for " + what_);
          }
        }
        throw interrupted;
      }
    }
    lock.lock();
  }
}

void FairringWork::poll(std::chrono::microseconds budget) {
  if (poller_ && !marked_.load(std::memory_order_acquire)) {
    (*poller_)([this] { return marked_.load(std::memory_order_acquire); }, budget);
  }
}

bool FairringWork::isCompleted() {
  poll(std::chrono::microseconds::zero());
  return c10d::Work::isCompleted();
}

bool FairringWork::wait(std::chrono::milliseconds timeout) {
  poll(poll_budget_);
  wait_interruptibly(timeout);
  const bool ok = c10d::Work::wait(timeout);  // throws on error or timeout
  // The future is marked right after, by a completion worker (the pool
  // starts another if this is a callback that blocks one).
  future_->wait();
  return ok;
}

void FairringWork::mark_done(std::exception_ptr error) {
  finish(to_torch(error));
  marked_.store(true, std::memory_order_release);
}

void FairringWork::complete_future(std::exception_ptr error) {
  if (error) {
    future_->setError(to_torch(error));
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
}

bool FairringWork::complete_future_if_untaken(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(future_mu_);
  if (future_taken_) return false;
  complete_future(error);
  return true;
}

OnceWaitedWork::OnceWaitedWork(c10::intrusive_ptr<c10d::Work> inner, int rank, c10d::OpType type)
    : c10d::Work(rank, type), inner_(std::move(inner)) {}

bool OnceWaitedWork::wait(std::chrono::milliseconds timeout) {
  {
    std::lock_guard<std::mutex> lock(wait_mu_);
    if (!waited_.load()) {
      try {
        inner_->wait(timeout);
      } catch (...) {
        // A caller's own timeout ran out: the op may still end; not kept.
        if (timeout != kNoTimeout) throw;
        error_ = std::current_exception();
      }
      waited_.store(true);
    }
  }
  if (error_) std::rethrow_exception(error_);
  return true;
}

bool OnceWaitedWork::isCompleted() { return waited_.load() || inner_->isCompleted(); }

bool OnceWaitedWork::isSuccess() const { return waited_.load() ? !error_ : inner_->isSuccess(); }

}  // namespace fairring
