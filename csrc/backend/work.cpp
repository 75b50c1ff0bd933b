#include "backend/work.h"

namespace fairring {

FairringWork::FairringWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
                           std::thread::id completer)
    : c10d::Work(rank, type),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))),
      completer_(completer) {}

bool FairringWork::wait(std::chrono::milliseconds timeout) {
  const bool ok = c10d::Work::wait(timeout);  // throws on error or timeout
  // The future is marked right after, by the completion thread; from that
  // thread (a callback waiting on another op) it would wait on itself.
  if (std::this_thread::get_id() != completer_) future_->wait();
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
