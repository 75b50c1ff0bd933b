// The sparse all-reduce (nn.Embedding(sparse=True) gradients) of a CPU COO
// tensor with SUM, composed of native all-gathers:
//
//   1. this rank's tensor coalesced (one row per index), after every op
//      issued before it (a sparse tensor's memory is not one span);
//   2. every rank's row count and shape, all-gathered, waited for: the
//      only step that blocks the caller (until every rank has reached the
//      call), and where ranks with tensors of different shapes all fail
//      with a mismatch, before anything else moves;
//   3. every rank's indices and values all-gathered straight into one
//      buffer of all ranks' rows in rank order (two pairwise uneven
//      all-gathers on the point-to-point engine, numbered like the group's
//      other ops, not waited for);
//   4. when both are done: those rows coalesced once (duplicates summed),
//      copied into the caller's tensor.
//
// Every rank merges the same bytes the same way, so the result is the same
// on every rank.  Measured against gloo's (which gathers the same data and
// then sums the ranks' tensors pairwise): docs/BENCHMARKS_HISTORY.md, "Uneven reduce_scatter
// list, sparse all-reduce, stand-in cache".
#include <ATen/core/grad_mode.h>

#include "backend/backend.h"
#include "backend/stand_in.h"
#include "backend/torch_error.h"
#include "common/dtype_name.h"
#include "common/error.h"
#include "common/gil.h"
#include "common/op_key.h"
#include "devices/host_engine.h"

namespace fairring {

namespace {
// A tensor's shape as ranks compare it: sizes, sparse dimensions, dtype,
// hashed as the blockwise lists' layouts are (common/op_key.h).
int64_t shape_key(const at::Tensor& t) {
  std::vector<int64_t> v(t.sizes().begin(), t.sizes().end());
  v.push_back(t.sparse_dim());
  v.push_back(static_cast<int64_t>(t.scalar_type()));
  return block_layout(v.data(), static_cast<int>(v.size()));
}
}  // namespace

bool FairringBackend::sparse_native(const std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  return tensors.size() == 1 && tensors[0].layout() == c10::kSparse && tensors[0].is_cpu() &&
         opts.reduceOp == c10d::ReduceOp::SUM && tensors[0].scalar_type() != at::kBool;
}

c10::intrusive_ptr<c10d::Work> FairringBackend::allreduce_sparse_cpu(at::Tensor& t) {
  check_same_process("all_reduce (sparse)");
  const int world = getSize();
  const int me = getRank();
  // 1. After every op issued before (their tensors may be this one's parts).
  Footprint fp;
  fp.write(t);  // a sparse tensor: everything
  order_after_delegated(fp);
  {
    GilReleaseIfHeld no_gil;
    if (engine_) engine_->wait_idle();
    wait_idle_device();
  }
  const at::Tensor local = t.coalesce();
  const int64_t sparse_dim = local.sparse_dim();
  const int64_t nnz = local._nnz();
  const at::Tensor indices = local._indices().contiguous();  // [sparse_dim, nnz]
  const at::Tensor values = local._values().contiguous();    // [nnz, dense sizes...]
  const int64_t dense_row = [&] {                            // elements per row of values
    int64_t n = 1;
    for (int64_t d = sparse_dim; d < t.dim(); ++d) n *= t.size(d);
    return n;
  }();

  // The op's record, numbered before its parts (three all-gathers).
  auto work =
      c10::make_intrusive<FairringWork>(me, c10d::OpType::ALLREDUCE, std::vector<at::Tensor>{t}, "fairring:all_reduce");
  work->set_interrupt_hook(abort_hook_, "all_reduce (sparse)");
  auto recent = recent_;
  // (Not in torch's flight recorder: its parts are, as all_gathers.)
  auto handle = recent->start(
      number_collective(), "all_reduce (sparse)", "",
      std::to_string(nnz) + " row(s) of " + std::to_string(dense_row) + " " + dtype_name(t.scalar_type()) + " here",
      nnz * dense_row * values.element_size(), nullptr);
  const auto finish = [work, recent, handle](std::exception_ptr error) {
    recent->finish(handle, error ? error_of(error).what() : "");
    work->mark_done(error);
    work->complete_future(error);
  };

  // 2. Row counts and shapes.
  at::Tensor meta = at::empty({2}, at::kLong);
  meta[0] = nnz;
  meta[1] = shape_key(t);
  at::Tensor metas = at::empty({2 * world}, at::kLong);
  c10d::AllgatherOptions ag;
  try {
    auto w = _allgather_base(metas, meta, ag);
    GilReleaseIfHeld no_gil;
    w->wait();
  } catch (...) {
    finish(std::current_exception());
    throw;
  }
  const int64_t* m = metas.const_data_ptr<int64_t>();
  int64_t total = 0;  // rows of all ranks
  std::vector<int64_t> counts(world);
  for (int r = 0; r < world; ++r) {
    if (m[2 * r + 1] != m[2 * me + 1]) {
      // Every rank sees every shape: all of them fail here, none hangs.
      const auto why = to_torch(std::make_exception_ptr(
          Error(ErrorKind::kBackend,
                "fairring: sparse all_reduce mismatch between ranks: rank " + std::to_string(me) +
                    " has a tensor of sizes " + c10::str(t.sizes()) + " with " + std::to_string(sparse_dim) +
                    " sparse dimension(s) of " + dtype_name(t.scalar_type()) + ", but rank " + std::to_string(r) +
                    "'s differs in its sizes, sparse dimensions or dtype. Every rank must pass a tensor of the same "
                    "shape and dtype.")));
      finish(why);
      std::rethrow_exception(why);
    }
    counts[r] = m[2 * r];
    total += counts[r];
  }

  if (total == 0 || world == 1) {  // the sum is this rank's tensor (every one is empty, or it is alone)
    at::NoGradGuard no_grad;
    t.copy_(local);
    finish(nullptr);
    return work;
  }

  // 3. Indices and values: every rank's rows straight into their place in
  // one buffer of all the ranks' rows, in rank order (the pairwise uneven
  // all-gather: no padding, nothing copied together afterwards).
  std::vector<int64_t> value_shape(t.sizes().begin() + sparse_dim, t.sizes().end());
  value_shape.insert(value_shape.begin(), total);
  at::Tensor all_values = stand_in(total * dense_row, values.options()).view(value_shape);
  // Row i of all_rows: the indices of value row i.
  at::Tensor all_rows = stand_in(total * sparse_dim, values.options().dtype(at::kLong)).view({total, sparse_dim});
  std::vector<at::Tensor> value_blocks, row_blocks;
  int64_t offset = 0;
  for (int r = 0; r < world; offset += counts[r], ++r) {
    value_blocks.push_back(all_values.narrow(0, offset, counts[r]));
    row_blocks.push_back(all_rows.narrow(0, offset, counts[r]));
  }
  const at::Tensor my_rows = indices.t().contiguous();
  auto wi = exchange_blocks(std::vector<at::Tensor>(world, my_rows), row_blocks, {all_rows}, c10d::OpType::ALLGATHER,
                            "all_gather (pairwise)");
  auto wv = exchange_blocks(std::vector<at::Tensor>(world, values), value_blocks, {all_values}, c10d::OpType::ALLGATHER,
                            "all_gather (pairwise)");

  // 4. The merge, once both have arrived (on whichever thread completes
  // the second: a completion worker, or this one if both are done).
  auto merge = [t, all_rows, all_values, finish]() mutable {
    std::exception_ptr error;
    try {
      at::NoGradGuard no_grad;
      at::Tensor sum = at::_sparse_coo_tensor_unsafe(all_rows.t().contiguous(), all_values, t.sizes(),
                                                     t.options().layout(c10::kSparse))
                           .coalesce();
      t.copy_(sum);
    } catch (const std::exception& e) {
      error = std::make_exception_ptr(error_of(e));
    }
    finish(error);
  };
  auto values_done = wv->getFuture();
  wi->getFuture()->addCallback([values_done, merge, finish](c10::ivalue::Future& f) mutable {
    if (f.hasError()) return finish(f.exception_ptr());
    values_done->addCallback([merge, finish](c10::ivalue::Future& g) mutable {
      if (g.hasError()) return finish(g.exception_ptr());
      merge();
    });
  });
  // Later ops on this tensor's memory wait for the merge (as for a delegated op).
  remember_delegated(work, std::move(fp));
  return work;
}

}  // namespace fairring
