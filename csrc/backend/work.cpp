#include "backend/work.h"

namespace fairring {

FairringWork::FairringWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, const char* profiling_title)
    // With a title, the base class opens an async profiler range with the
    // tensors' shapes, closed by finish(): the trace shows the op's real span.
    : c10d::Work(rank, type, profiling_title, outputs),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

bool FairringWork::wait(std::chrono::milliseconds timeout) {
  const bool ok = c10d::Work::wait(timeout);  // throws on error or timeout
  // The future is marked right after, by a completion worker (the pool
  // starts another if this is a callback that blocks one).
  future_->wait();
  return ok;
}

void FairringWork::mark_done(std::exception_ptr error) { finish(error); }

void FairringWork::complete_future(std::exception_ptr error) {
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
}

}  // namespace fairring
