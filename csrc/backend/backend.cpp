#include "backend/backend.h"

#include <sys/random.h>


#include "allreduce/cuda_engine.h"
#include "allreduce/engine.h"
#include "allreduce/op.h"
#include "backend/work.h"
#include "common/gil.h"
#include "kernels/reduce_cpu.h"

namespace fairring {

namespace {

std::vector<uint8_t> bytes_of(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
std::string string_of(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

RedOp to_redop(const c10d::ReduceOp& op, c10::ScalarType dtype) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return RedOp::kSum;
    case c10d::ReduceOp::AVG: return RedOp::kAvg;
    case c10d::ReduceOp::PRODUCT: return RedOp::kProduct;
    case c10d::ReduceOp::MIN: return RedOp::kMin;
    case c10d::ReduceOp::MAX: return RedOp::kMax;
    case c10d::ReduceOp::BAND: return RedOp::kBand;
    case c10d::ReduceOp::BOR: return RedOp::kBor;
    case c10d::ReduceOp::BXOR: return RedOp::kBxor;
    default:
      TORCH_CHECK(false, "fairring: all_reduce does not support ReduceOp PREMUL_SUM (tensor of ",
                  dtype_name(dtype), "); scale the tensor and use SUM instead");
  }
}

// A random id for names that must not collide between jobs (shared memory).
std::string random_hex(int bytes) {
  std::vector<uint8_t> raw(bytes);
  size_t got = 0;
  while (got < raw.size()) {
    ssize_t n = getrandom(raw.data() + got, raw.size() - got, 0);
    TORCH_CHECK(n >= 0, "fairring: getrandom failed");
    got += static_cast<size_t>(n);
  }
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (uint8_t b : raw) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

}  // namespace

FairringBackend::FairringBackend(
    const c10::intrusive_ptr<c10d::Store>& store,
    int rank,
    int size,
    const Config& config,
    const std::string& node_key,
    c10::intrusive_ptr<c10d::Backend> fallback)
    : c10d::Backend(rank, size), config_(config), fallback_(std::move(fallback)) {
  // Which ranks share a machine, and the settings that must agree between
  // ranks (they fix the shared-memory layout and the slices).
  const std::string settings = "FAIRRING_SLICE_SIZE=" + std::to_string(config.slice_size) +
      ", FAIRRING_PARALLELISM=" + std::to_string(config.parallelism);
  store->set("fairring/node/" + std::to_string(rank), bytes_of(node_key));
  store->set("fairring/settings/" + std::to_string(rank), bytes_of(settings));
  std::vector<std::string> keys(size);
  for (int r = 0; r < size; ++r) {
    keys[r] = string_of(store->get("fairring/node/" + std::to_string(r)));
    const std::string theirs = string_of(store->get("fairring/settings/" + std::to_string(r)));
    TORCH_CHECK_VALUE(theirs == settings, "fairring: ranks of one process group must use the same options, but rank ",
                rank, " has ", settings, " and rank ", r, " has ", theirs,
                ". Set them the same way on every rank (environment or pg_options).");
  }
  topo_ = build_topology(keys, rank);
  // The group's secret (TCP peers must present it) and a unique name for its
  // shared memory, chosen by rank 0.
  Secret secret;
  std::string uid;
  if (rank == 0) {
    secret = random_secret();
    uid = random_hex(8);
    std::vector<uint8_t> blob(secret.begin(), secret.end());
    blob.insert(blob.end(), uid.begin(), uid.end());
    store->set("fairring/secret", blob);
  } else {
    auto blob = store->get("fairring/secret");
    TORCH_CHECK(blob.size() > secret.size(), "fairring: malformed secret in the store");
    std::copy(blob.begin(), blob.begin() + secret.size(), secret.begin());
    uid.assign(blob.begin() + secret.size(), blob.end());
  }
  engine_ = std::make_unique<Engine>(store, topo_, config_, uid, secret);
  store_ = store;  // for the CUDA engine, created at the first CUDA all-reduce
  job_uid_ = uid;
  secret_ = secret;
}

FairringBackend::~FairringBackend() {
  // The engines join their threads, which may need the GIL.
  GilReleaseIfHeld no_gil;
  cuda_engine_.reset();
  engine_.reset();
}

std::string FairringBackend::listen_address() const { return engine_->listen_address(); }

c10::intrusive_ptr<c10d::Work> FairringBackend::allreduce(
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(tensors.size() == 1, "fairring: all_reduce takes one tensor per rank, got ", tensors.size());
  at::Tensor& t = tensors[0];
  TORCH_CHECK(t.layout() == c10::kStrided, "fairring: all_reduce supports dense tensors only, got layout ",
              t.layout());
  const RedOp op = to_redop(opts.reduceOp, t.scalar_type());
  if (!t.device().is_cpu()) return allreduce_device(t, tensors, op);  // backend_cuda.cpp

  at::Tensor buffer = t.is_contiguous() ? t : t.contiguous();
  c10::ScalarType dtype = buffer.scalar_type();
  int64_t numel = buffer.numel();
  if (buffer.is_complex()) {
    TORCH_CHECK(op == RedOp::kSum || op == RedOp::kAvg, "fairring: all_reduce of complex tensors supports SUM and AVG only, got ",
                redop_name(op));
    dtype = c10::toRealValueType(dtype);
    numel *= 2;
  }
  const std::string why = reduce_unsupported_reason(dtype, op);
  TORCH_CHECK(why.empty(), "fairring: all_reduce: ", why);

  auto work = c10::make_intrusive<FairringWork>(getRank(), c10d::OpType::ALLREDUCE, tensors,
                                                engine_->completion_thread());
  auto aop = std::make_shared<AllreduceOp>();
  aop->buffer = buffer;
  if (!buffer.is_same(t)) aop->user = t;
  aop->dtype = dtype;
  aop->op = op;
  aop->numel = numel;
  aop->on_complete = [work](std::exception_ptr error) { work->mark_done(error); };
  aop->after_complete = [work](std::exception_ptr error) { work->complete_future(error); };
  engine_->submit(std::move(aop));
  return work;
}

c10d::Backend& FairringBackend::delegate() {
  engine_->wait_idle();
  wait_idle_device();
  return *fallback_;
}

c10::intrusive_ptr<c10d::Work> FairringBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  return delegate().broadcast(tensors, opts);
}
c10::intrusive_ptr<c10d::Work> FairringBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                    const c10d::AllreduceCoalescedOptions& opts) {
  return delegate().allreduce_coalesced(tensors, opts);
}
c10::intrusive_ptr<c10d::Work> FairringBackend::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  return delegate().reduce(tensors, opts);
}
c10::intrusive_ptr<c10d::Work> FairringBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllgatherOptions& opts) {
  return delegate().allgather(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> FairringBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::AllgatherOptions& opts) {
  return delegate()._allgather_base(output, input, opts);
}
c10::intrusive_ptr<c10d::Work> FairringBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                    std::vector<at::Tensor>& inputs,
                                                                    const c10d::AllgatherOptions& opts) {
  return delegate().allgather_coalesced(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> FairringBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                std::vector<at::Tensor>& inputs,
                                                                                const c10d::AllgatherOptions& opts) {
  return delegate().allgather_into_tensor_coalesced(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> FairringBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::GatherOptions& opts) {
  return delegate().gather(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> FairringBackend::scatter(std::vector<at::Tensor>& outputs,
                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                        const c10d::ScatterOptions& opts) {
  return delegate().scatter(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> FairringBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                               std::vector<std::vector<at::Tensor>>& inputs,
                                                               const c10d::ReduceScatterOptions& opts) {
  return delegate().reduce_scatter(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> FairringBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                     const c10d::ReduceScatterOptions& opts) {
  return delegate()._reduce_scatter_base(output, input, opts);
}
c10::intrusive_ptr<c10d::Work> FairringBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  return delegate().reduce_scatter_tensor_coalesced(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> FairringBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_splits,
                                                              std::vector<int64_t>& input_splits,
                                                              const c10d::AllToAllOptions& opts) {
  return delegate().alltoall_base(output, input, output_splits, input_splits, opts);
}
c10::intrusive_ptr<c10d::Work> FairringBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  return delegate().alltoall(outputs, inputs, opts);
}
c10::intrusive_ptr<c10d::Work> FairringBackend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  return delegate().send(tensors, dst, tag);
}
c10::intrusive_ptr<c10d::Work> FairringBackend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  return delegate().recv(tensors, src, tag);
}
c10::intrusive_ptr<c10d::Work> FairringBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return delegate().recvAnysource(tensors, tag);
}
c10::intrusive_ptr<c10d::Work> FairringBackend::barrier(const c10d::BarrierOptions& opts) {
  return delegate().barrier(opts);
}

}  // namespace fairring
