// Send, receive, and the pairwise exchange of blocks of unequal sizes:
// their c10d entry points and their work on the point-to-point engine
// (p2p/), ordered against the group's other ops by the order rule.
#include "backend/backend.h"
#include "collectives/collectives.h"

#include <atomic>
#include <mutex>

#include "backend/stand_in.h"
#include "backend/tensor_args.h"
#include "backend/torch_error.h"
#include "common/dtype_name.h"
#include "common/gil.h"
#include "devices/host_engine.h"
#include "kernels/first_touch.h"
#include "p2p/p2p_engine.h"

namespace fairring {

namespace {
c10::intrusive_ptr<c10d::Work> once_waited(c10::intrusive_ptr<c10d::Work> inner, int rank, c10d::OpType type) {
  return c10::make_intrusive<OnceWaitedWork>(std::move(inner), rank, type);
}

// Ends the Work of a send, receive or pairwise exchange once its transfers
// are over: its record, its wait(), its future (here when nothing can be
// chained on it, else on the pool: callbacks may block).
void settle_p2p_work(const c10::intrusive_ptr<FairringWork>& work, RecentOps& recent, const RecentOps::Handle& handle,
                     CompletionPool& pool, std::exception_ptr error, bool on_caller) {
  recent.finish(handle, error ? error_of(error).what() : "");
  work->mark_done(error);
  if (on_caller) {
    work->complete_future(error);  // nothing can be chained on it yet
  } else if (!work->complete_future_if_untaken(error)) {
    pool.post([work, error] { work->complete_future(error); });
  }
}
}  // namespace

void FairringBackend::check_rank(const char* kind, const char* arg, int64_t rank) const {
  TORCH_CHECK_VALUE(rank >= 0 && rank < getSize(), "fairring: ", kind, " with ", arg, "=", rank,
                    ", which is not a rank of this group: it has ", getSize(), " ranks (0 to ", getSize() - 1, ")");
}

bool FairringBackend::p2p_native(const char* kind, const char* arg, const std::vector<at::Tensor>& tensors,
                                 int peer) const {
  if (arg) {
    check_rank(kind, arg, peer);
    TORCH_CHECK_VALUE(peer != getRank(), "fairring: ", kind, " with ", arg, "=", peer,
                      ", which is this rank: a rank cannot send to or receive from itself");
  }
  if (!p2p_ || tensors.size() != 1) return false;
  const at::Tensor& t = tensors[0];
  return (t.device().is_cpu() || device_native(t)) && t.layout() == c10::kStrided;
}

void FairringBackend::order_p2p(const Footprint& fp) {
  order_after_delegated(fp);  // delegated ops, and the pending sends and receives
  GilReleaseIfHeld no_gil;
  if (engine_) engine_->wait_conflicts(fp);  // the pipeline's
}

void FairringBackend::order_device(const Footprint& fp) {
  // A device collective on this memory is over once its device work is.
  GilReleaseIfHeld no_gil;
  with_torch_errors([&] {
    with_device_pipeline([&](Pipeline& p) {
      p.wait_conflicts_on_device(fp);
      return true;
    });
  });
}

c10::intrusive_ptr<c10d::Work> FairringBackend::submit_p2p(bool is_send, const at::Tensor& t, int peer, int tag) {
  const char* kind = is_send ? "send" : peer == kAnySource ? "recv_any_source" : "recv";
  check_same_process(kind);
  TORCH_CHECK_VALUE(tag >= 0, "fairring: ", kind, " with tag ", tag, ": tags must be >= 0 (as on gloo)");
  // The order rule: after the ops issued before it whose memory it shares
  // (a later op waits for it in turn, in submit_cpu and here).
  Footprint fp;
  if (is_send) {
    fp.read(t);
  } else {
    fp.write(t);
  }
  order_p2p(fp);
  // The engine moves contiguous bytes in host memory: a strided tensor goes
  // through a copy, a device tensor through a host copy.
  const bool device = !t.is_cpu();
  if (device) order_device(fp);
  const bool staged = device || !t.is_contiguous();
  at::Tensor buffer;
  std::function<void(const at::Tensor&)> land;  // a staged receive: into `t`
  if (!staged) {
    buffer = t;
    // A receive buffer is often new each call (a pipeline stage's
    // activations): first-touch faults, as a collective's output.
    if (!is_send && config_.huge_pages == "advise") {
      advise_fresh_memory(t.data_ptr(), static_cast<int64_t>(t.nbytes()));
    }
  } else if (is_send) {
    buffer = device ? host_copy(t, kind) : t.contiguous();
  } else {
    buffer = stand_in(t.numel(), t.options().device(at::kCPU)).view(t.sizes());
    land = device ? device_landing(t, kind) : [target = t](const at::Tensor& host) mutable {
      at::NoGradGuard no_grad;  // the caller's tensor may be a leaf that requires grad
      target.copy_(host);
    };
  }
  const auto type = is_send              ? c10d::OpType::SEND
                    : peer == kAnySource ? c10d::OpType::RECVANYSOURCE
                                         : c10d::OpType::RECV;
  auto work = c10::make_intrusive<FairringWork>(getRank(), type, std::vector<at::Tensor>{t},
                                                is_send ? "fairring:send" : "fairring:recv");
  work->set_interrupt_hook(abort_hook_, kind);
  const bool polled = p2p_poller_ && p2p_->polls_for(peer);
  if (polled) work->set_wait_poller(p2p_poller_, config_.wait_spin);
  const std::string what =
      "tag " + std::to_string(tag) + ", " + std::to_string(t.numel()) + " element(s) of " +
      dtype_name(t.scalar_type()) +
      (peer == kAnySource ? ", from any rank" : (is_send ? ", to rank " : ", from rank ") + std::to_string(peer));
  auto recent = recent_;
  if (ephemeral_->changed()) apply_timeout();
  std::optional<RecentOps::InTorch> in_torch;
  if (FlightRecord::on()) {
    // As NCCL names them: "send 0->1", "recv 1<-0" (ranks of this group).
    std::string route =
        is_send ? std::to_string(getRank()) + "->" + std::to_string(peer)
                : std::to_string(getRank()) + "<-" + (peer == kAnySource ? std::string("any") : std::to_string(peer));
    in_torch = in_torch_record(is_send ? "send" : "recv", std::move(route), {t}, {t});
  }
  auto handle = recent->start(number_p2p(), kind, "", what, t.numel() * t.element_size(),
                              in_torch ? &*in_torch : nullptr, /*p2p=*/true);
  CompletionPool* pool = &p2p_->completions();
  // A receive into device memory lands off the engine's threads (the copy
  // waits for the caller's stream); until then it is remembered like a
  // delegated op, so that later ops on the tensor wait for it.
  if (device && !is_send) remember_delegated(work, fp, /*p2p=*/true);
  auto done = [work, recent, handle, pool, is_send, device, land = std::move(land), buffer](
                  std::exception_ptr error, int from, bool on_caller) mutable {
    if (!is_send) work->set_source_rank(from);
    auto finish = [work, recent, handle, pool, land = std::move(land), buffer](std::exception_ptr error,
                                                                               bool on_caller) {
      if (!error && land) {
        try {
          land(buffer);
        } catch (const std::exception& e) {
          error = std::make_exception_ptr(error_of(e));
        }
      }
      settle_p2p_work(work, *recent, handle, *pool, error, on_caller);
    };
    if (device && !error && !is_send) {
      pool->post([finish = std::move(finish)]() mutable { finish(nullptr, false); });
    } else {
      finish(error, on_caller);
    }
  };
  // The engine's op stands for the caller's tensor (fp), not the stand-in.
  if (is_send) {
    p2p_->send(buffer, peer, tag, std::move(done), &fp);
  } else {
    p2p_->recv(buffer, peer, tag, std::move(done), &fp, /*waited=*/polled);
  }
  return work;
}

c10::intrusive_ptr<c10d::Work> FairringBackend::exchange_blocks(const std::vector<at::Tensor>& sends,
                                                                const std::vector<at::Tensor>& recvs,
                                                                std::vector<at::Tensor> outputs, c10d::OpType type,
                                                                const char* kind) {
  check_same_process(kind);
  // Its messages carry a negative tag (users' are >= 0), the same on every
  // rank: the group's exchanges are numbered alike everywhere, counted
  // before any check that may fail on one rank only.
  const int tag = -1 - static_cast<int>(exchange_seq_++ % (1u << 30));
  const int world = getSize();
  const int me = getRank();
  for (int j = 0; j < world; ++j) {
    TORCH_CHECK_TYPE(
        sends[j].scalar_type() == sends[0].scalar_type() && recvs[j].scalar_type() == sends[0].scalar_type(),
        "fairring: ", kind, " needs one dtype for every input and output block, but got ",
        dtype_name(sends[j].scalar_type()), " and ", dtype_name(recvs[j].scalar_type()), " besides ",
        dtype_name(sends[0].scalar_type()));
  }
  TORCH_CHECK_VALUE(sends[me].numel() == recvs[me].numel(), "fairring: ", kind, ": this rank's block for itself has ",
                    sends[me].numel(), " element(s) in the input but room for ", recvs[me].numel(), " in the output");
  Footprint fp;
  for (const at::Tensor& t : sends) fp.read(t);
  for (const at::Tensor& t : recvs) fp.write(t);
  order_p2p(fp);
  auto work = c10::make_intrusive<FairringWork>(
      me, type, outputs, type == c10d::OpType::ALLGATHER ? "fairring:all_gather" : "fairring:all_to_all");
  work->set_interrupt_hook(abort_hook_, kind);
  // Its wait() moves the node-mates' blocks too (no promise: the sparse
  // all-reduce's exchanges are waited on by a callback, not a caller).
  if (p2p_poller_) work->set_wait_poller(p2p_poller_, config_.wait_spin);
  int64_t bytes = 0;
  for (const at::Tensor& t : sends) bytes += t.numel() * t.element_size();
  auto recent = recent_;
  // torch's flight recorder: under the collective's own name, as the pipeline's are.
  std::optional<RecentOps::InTorch> in_torch;
  if (FlightRecord::on()) {
    const bool gather = type == c10d::OpType::ALLGATHER;
    in_torch = in_torch_record(gather ? "all_gather" : "all_to_all", "",
                               gather ? std::vector<at::Tensor>{sends[me]} : sends, outputs);
  }
  auto handle =
      recent->start(number_collective(), kind, "", std::to_string(bytes) + " bytes to send, blocks of unequal sizes",
                    bytes, in_torch ? &*in_torch : nullptr);
  struct State {
    std::atomic<int> left{0};
    std::mutex mu;
    std::exception_ptr error;
    std::vector<std::pair<at::Tensor, at::Tensor>> copy_back;  // (caller's block, its contiguous stand-in)
  };
  auto st = std::make_shared<State>();
  // Our own block, here and now (after the ops it had to follow).
  recvs[me].copy_(sends[me]);
  std::vector<at::Tensor> landing(world);
  for (int j = 0; j < world; ++j) {
    if (j == me) continue;
    landing[j] =
        recvs[j].is_contiguous() ? recvs[j] : stand_in(recvs[j].numel(), recvs[j].options()).view(recvs[j].sizes());
    if (!recvs[j].is_contiguous()) st->copy_back.emplace_back(recvs[j], landing[j]);
  }
  st->left = 2 * (world - 1) + 1;  // + 1: this call, until everything is posted
  CompletionPool* pool = &p2p_->completions();
  auto done = [st, work, recent, handle, pool](std::exception_ptr error, int, bool on_caller) {
    if (error) {
      std::lock_guard<std::mutex> lock(st->mu);
      if (!st->error) st->error = error;
    }
    if (st->left.fetch_sub(1) != 1) return;
    std::exception_ptr first = st->error;
    if (!first) {
      try {
        for (auto& [block, stand_in] : st->copy_back) block.copy_(stand_in);
      } catch (const std::exception& e) {
        first = std::make_exception_ptr(error_of(e));
      }
    }
    settle_p2p_work(work, *recent, handle, *pool, first, on_caller);
  };
  for (int j = 0; j < world; ++j) {
    if (j == me) continue;
    Footprint block;  // the caller's block, which a stand-in may stand for
    block.write(recvs[j]);
    p2p_->recv(landing[j], j, tag, done, &block);
  }
  for (int k = 1; k < world; ++k) {  // rank me + k first: not everyone at rank 0 at once
    const int j = (me + k) % world;
    Footprint block;
    block.read(sends[j]);
    p2p_->send(sends[j].contiguous(), j, tag, done, &block);
  }
  done(nullptr, me, /*on_caller=*/true);
  return work;
}

// Delegated sends and receives are remembered like delegated collectives:
// what is issued after them on their memory waits for them.
c10::intrusive_ptr<c10d::Work> FairringBackend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  if (p2p_native("send", "dst", tensors, dst)) return submit_p2p(true, tensors[0], dst, tag);
  return run_delegated(
      "send", read_only(tensors),
      [&](c10d::Backend& b) { return once_waited(b.send(tensors, dst, tag), getRank(), c10d::OpType::SEND); }, true);
}

c10::intrusive_ptr<c10d::Work> FairringBackend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  if (p2p_native("recv", "src", tensors, src)) return submit_p2p(false, tensors[0], src, tag);
  return run_delegated(
      "recv", touched(tensors),
      [&](c10d::Backend& b) { return once_waited(b.recv(tensors, src, tag), getRank(), c10d::OpType::RECV); }, true);
}

c10::intrusive_ptr<c10d::Work> FairringBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  if (p2p_native("recv", nullptr, tensors, kAnySource)) return submit_p2p(false, tensors[0], kAnySource, tag);
  return run_delegated(
      "recvAnysource", touched(tensors),
      [&](c10d::Backend& b) {
        return once_waited(b.recvAnysource(tensors, tag), getRank(), c10d::OpType::RECVANYSOURCE);
      },
      true);
}

}  // namespace fairring
