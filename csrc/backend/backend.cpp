#include "backend/backend.h"
#include "collectives/collectives.h"

#include <sys/random.h>
#include <unistd.h>

#include <ATen/MemoryOverlap.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <optional>

#include "devices/cuda_engine.h"
#include "devices/host_engine.h"
#include "devices/host_op.h"
#include "backend/dump_everywhere.h"
#include "backend/init_store.h"
#include "backend/live_groups.h"
#include "backend/reduce_input.h"
#include "backend/stand_in.h"
#include "backend/torch_error.h"
#include "common/current_pid.h"
#include "common/log.h"
#include "backend/work.h"
#include "common/dtype_name.h"
#include "common/gil.h"
#include "common/same_settings.h"
#include "kernels/first_touch.h"
#include "kernels/reduce_cpu.h"
#include "p2p/p2p_engine.h"
#include "topology/machine.h"

namespace fairring {

namespace {

std::vector<at::Tensor> both(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  std::vector<at::Tensor> all(a);
  all.insert(all.end(), b.begin(), b.end());
  return all;
}

std::vector<uint8_t> bytes_of(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
std::string string_of(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

RedOp to_redop(const c10d::ReduceOp& op, c10::ScalarType dtype) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return RedOp::kSum;
    case c10d::ReduceOp::AVG:
      return RedOp::kAvg;
    case c10d::ReduceOp::PRODUCT:
      return RedOp::kProduct;
    case c10d::ReduceOp::MIN:
      return RedOp::kMin;
    case c10d::ReduceOp::MAX:
      return RedOp::kMax;
    case c10d::ReduceOp::BAND:
      return RedOp::kBand;
    case c10d::ReduceOp::BOR:
      return RedOp::kBor;
    case c10d::ReduceOp::BXOR:
      return RedOp::kBxor;
    case c10d::ReduceOp::PREMUL_SUM:
      return RedOp::kSum;  // after premultiply()
    default:
      TORCH_CHECK(false, "fairring: unsupported ReduceOp ", static_cast<int>(op.op_), " (tensor of ", dtype_name(dtype),
                  ")");
  }
}

// PREMUL_SUM is a SUM of every rank's tensors each multiplied by the op's
// factor first (as NCCL defines it).  Checks the op now and returns what
// scales a tensor in place; null for any other op.
std::function<void(at::Tensor&)> premul_factor(const c10d::ReduceOp& op, c10::ScalarType dtype, const char* kind) {
  if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return nullptr;
  const auto* s = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  TORCH_CHECK(s, "fairring: ", kind, " with PREMUL_SUM but no factor");
  TORCH_CHECK(at::isFloatingType(dtype) || at::isComplexType(dtype), "fairring: ", kind,
              " with PREMUL_SUM needs floating-point tensors, got ", dtype_name(dtype));
  return [tensor_factor = s->tensor_factor, factor = s->double_factor](at::Tensor& t) {
    at::NoGradGuard no_grad;  // the caller's tensor may be a leaf that requires grad
    if (tensor_factor.defined()) {
      t.mul_(tensor_factor);
    } else {
      t.mul_(factor);
    }
  };
}

// Every tensor of a delegated call, as written (backend.h, run_delegated).
void touch(Footprint& fp, const at::Tensor& t) { fp.write(t); }
void touch(Footprint& fp, const std::vector<at::Tensor>& ts) {
  for (const at::Tensor& t : ts) fp.write(t);
}
void touch(Footprint& fp, const std::vector<std::vector<at::Tensor>>& tss) {
  for (const auto& ts : tss) touch(fp, ts);
}
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

// What a send reads.
Footprint read_only(const std::vector<at::Tensor>& ts) {
  Footprint fp;
  for (const at::Tensor& t : ts) fp.read(t);
  return fp;
}
template <typename... Groups>
Footprint touched(const Groups&... groups) {
  Footprint fp;
  (touch(fp, groups), ...);
  return fp;
}

// What an op writes that may be fresh memory (kernels/first_touch.h): the
// caller's tensors it writes, and the stand-ins made for them.  Advice only:
// no byte changes, so it may run while an earlier op still writes there.
void advise_fresh(const PipelineOp& op) {
  for (const MemRange& r : op.footprint.writes) {
    advise_fresh_memory(reinterpret_cast<void*>(r.begin), static_cast<int64_t>(r.end - r.begin));
  }
  for (const at::Tensor* t : {&op.output, &op.buffer}) {
    if (t->defined() && t->is_cpu()) advise_fresh_memory(t->data_ptr(), static_cast<int64_t>(t->nbytes()));
  }
}

}  // namespace

FairringBackend::FairringBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, const Config& config,
                                 const std::string& node_key, c10::intrusive_ptr<c10d::Backend> fallback)
    : c10d::Backend(rank, size),
      config_(config),
      fallback_(std::move(fallback)),
      fr_(std::make_shared<FlightRecord>(rank, size)) {
  // Every rank ends group creation the same way: built, or failed with the
  // first rank's cause (a rank that fails tells the others through the store).
  auto init = c10::make_intrusive<InitStore>(store, rank, size, config.timeout);
  build_collectively(*init, [&] {
    validate(config_);
    build(init, node_key);
  });
  store_ = store;  // for the CUDA engine, created at the first CUDA all-reduce
  abort_hook_ = std::make_shared<GroupAbortHook>([this](const std::string& why) { abort_engines(why); });
  if (p2p_ && p2p_->polls()) {
    p2p_poller_ = std::make_shared<WaitPoller>(
        [engine = p2p_.get()](const std::function<bool()>& done, std::chrono::microseconds budget) {
          engine->poll(done, budget);
        });
  }
}

void FairringBackend::build(const c10::intrusive_ptr<InitStore>& store, const std::string& node_key) {
  const int rank = getRank();
  const int size = getSize();
  // Which ranks share a machine, and the settings that must agree between
  // ranks (they fix the shared-memory layout and the slices).
  const std::string settings = "FAIRRING_SLICE_SIZE=" + std::to_string(config_.slice_size) +
                               ", FAIRRING_PARALLELISM=" + std::to_string(config_.parallelism) +
                               ", FAIRRING_WIRE_DTYPE=" + config_.wire_dtype +
                               ", FAIRRING_REDUCTION_SERVERS=" + std::to_string(config_.reduction_servers);
  store->set("node/" + std::to_string(rank), bytes_of(node_key));
  // The real machine too (a simulated node is one of several on it): for
  // whether the ranks here each have a core (wait_spin_for).
  const std::string machine = machine_key();
  store->set("machine/" + std::to_string(rank), bytes_of(machine));
  check_same_settings(store, "settings", rank, size, settings);
  std::vector<std::string> keys(size);
  int ranks_here = 0;
  for (int r = 0; r < size; ++r) {
    keys[r] = string_of(store->get("node/" + std::to_string(r)));
    ranks_here += string_of(store->get("machine/" + std::to_string(r))) == machine;
  }
  topo_ = build_topology(keys, rank);
  blockwise_pieces_ = blockwise_slice_pieces(topo_.node_sizes());
  config_.wait_spin = wait_spin_for(ranks_here, usable_cpus());
  // The group's secret (TCP peers must present it) and a unique name for its
  // shared memory, chosen by rank 0.
  if (rank == 0) {
    secret_ = random_secret();
    job_uid_ = random_hex(8);
    std::vector<uint8_t> blob(secret_.begin(), secret_.end());
    blob.insert(blob.end(), job_uid_.begin(), job_uid_.end());
    store->set("secret", blob);
  } else {
    auto blob = store->get("secret");
    TORCH_CHECK(blob.size() > secret_.size(), "fairring: malformed secret in the store");
    std::copy(blob.begin(), blob.begin() + secret_.size(), secret_.begin());
    job_uid_.assign(blob.begin() + secret_.size(), blob.end());
  }
  engine_ = std::make_unique<HostEngine>(store, topo_, config_, job_uid_, secret_);
  if (size > 1)
    p2p_ = std::make_unique<P2pEngine>(store, topo_, job_uid_, secret_, config_.socket_ifname, config_.timeout,
                                       config_.wait_spin, config_.huge_pages == "advise");
  log_setup();
}

void FairringBackend::log_setup() const {
  if (debug_level() < kLogSetup) return;
  const int rank = getRank();
  FAIRRING_LOG(rank,
               "group of %d ranks: FAIRRING_SLICE_SIZE=%lld FAIRRING_TOTAL_MEMORY=%lld FAIRRING_PARALLELISM=%d "
               "FAIRRING_GPU_TRANSPORT=%s FAIRRING_WIRE_DTYPE=%s, timeout %lld ms",
               getSize(), static_cast<long long>(config_.slice_size), static_cast<long long>(config_.total_memory),
               config_.parallelism, config_.gpu_transport.c_str(), config_.wire_dtype.c_str(),
               static_cast<long long>(config_.timeout.count()));
  auto list = [](const std::vector<int>& v) {
    std::string s;
    for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
    return s;
  };
  std::string layout =
      std::to_string(topo_.num_nodes) + " node(s) x " + std::to_string(topo_.ranks_per_node) + " rank(s)";
  if (topo_.uneven) {
    std::string sizes;
    for (const auto& members : topo_.node_ranks) sizes += (sizes.empty() ? "" : "+") + std::to_string(members.size());
    layout = std::to_string(topo_.num_nodes) + " nodes of " + sizes + " ranks, " + std::to_string(topo_.rails) +
             " rail(s) (uneven: the larger nodes' other ranks are passive)";
  }
  FAIRRING_LOG(rank, "topology: %s; this rank is local rank %d of node %d (ranks %s)", layout.c_str(), topo_.local_rank,
               topo_.node, list(topo_.local_ranks()).c_str());
  if (topo_.num_nodes > 1 && topo_.on_rail()) {
    FAIRRING_LOG(rank, "rail: ranks %s, over TCP, listening on %s", list(topo_.rail()).c_str(),
                 engine_->listen_address().c_str());
  }
}

FairringBackend::~FairringBackend() {
  unfollow_group(this);  // first: the status view may be reading this group
  if (getpid() != creator_pid_) {
    // A fork()ed child: the threads these objects would join exist in the
    // parent only, and their memory maps and sockets are the parent's.
    // Leave them alone (their memory is the child's copy, freed at exit).
    (void)engine_.release();
    (void)p2p_.release();
    (void)cuda_engine_.release();
    (void)fallback_.release();
    return;
  }
  // The engines join their threads, which may need the GIL.
  GilReleaseIfHeld no_gil;
  // Dropped without shutdown() (its last reference gone): the peers learn
  // it now, not when they next wait for this rank in vain.
  leave("dropped it (its last reference went away)");
  if (abort_hook_) abort_hook_->clear();
  if (p2p_poller_) p2p_poller_->clear();  // (waits for a poll in progress)
  cuda_engine_.reset();
  p2p_.reset();
  engine_.reset();
}

void FairringBackend::abort() {
  if (getpid() != creator_pid_) return;  // a fork()ed child: the threads are the parent's
  abort_hooks_->run_once(getRank());     // while the group can still be inspected
  retire("rank " + std::to_string(getRank()) + ": this process group was aborted (abort() was called)");
}

void FairringBackend::retire(const std::string& why) {
  if (getpid() != creator_pid_) return;
  GilReleaseIfHeld no_gil;
  abort_engines(why);
  if (fallback_) fallback_->abort();
}

void FairringBackend::abort_engines(const std::string& text) {
  const Error why(ErrorKind::kBackend, text);
  if (engine_) engine_->abort(why);
  if (p2p_) p2p_->abort(why);
  with_device_pipeline([&](Pipeline& p) {
    p.abort(why);
    return true;
  });
}

void FairringBackend::shutdown() {
  if (getpid() != creator_pid_) return;
  GilReleaseIfHeld no_gil;
  const auto until = std::chrono::steady_clock::now() + config_.timeout;
  const auto left = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
  };
  if (engine_ && (!engine_->drain(left()) || (p2p_ && !p2p_->drain(left())) ||
                  !with_device_pipeline([&](Pipeline& p) { return p.drain(left()); }))) {
    const std::string why =
        "rank " + std::to_string(getRank()) +
        ": this process group was shut down while collectives were still in flight after its timeout (" +
        std::to_string(config_.timeout.count()) + " ms)";
    FAIRRING_LOG(getRank(), "%s; aborting them", why.c_str());
    abort_engines(why);
  } else if (engine_) {
    const std::string closed = "this process group was shut down (shutdown() or destroy_process_group())";
    engine_->close(closed);
    if (p2p_) p2p_->close(closed);
    with_device_pipeline([&](Pipeline& p) {
      p.close(closed);
      return true;
    });
    leave("shut it down or destroyed it");
  }
  if (fallback_) fallback_->shutdown();
}

void FairringBackend::setTimeout(std::chrono::milliseconds timeout) {
  TORCH_CHECK_VALUE(timeout.count() > 0, "fairring: set_timeout(", timeout.count(),
                    " ms): a process group's timeout must be positive");
  config_.timeout = timeout;  // a CUDA engine created later takes it too
  apply_timeout();
}

void FairringBackend::apply_timeout() {
  const auto timeout = config_.timeout + ephemeral_->extra();
  if (engine_) engine_->set_timeout(timeout);
  if (p2p_) p2p_->set_timeout(timeout);
  with_device_pipeline([&](Pipeline& p) {
    p.set_timeout(timeout);
    return true;
  });
  if (fallback_) fallback_->setTimeout(timeout);
}

#ifdef C10D_BACKEND_HAS_RECONFIGURE
void FairringBackend::addEphemeralTimeout(const std::chrono::milliseconds& timeout) {
  TORCH_CHECK_VALUE(timeout.count() >= 0, "fairring: an ephemeral timeout extension must not be negative, got ",
                    timeout.count(), " ms");
  ephemeral_->add(timeout, seq_.load());
  apply_timeout();
}
#endif

std::optional<Error> FairringBackend::first_error() const {
  std::optional<Error> first;
  if (engine_ && engine_->failed()) first = engine_->failure();
  with_device_pipeline([&](Pipeline& p) {
    if (!first && p.failed()) first = p.failure();
    return true;
  });
  return first;
}

c10d::ErrorType FairringBackend::getError() {
  const std::optional<Error> first = first_error();
  if (!first) return c10d::ErrorType::SUCCESS;
  // A lost peer (exited, left, its connection closed), or a failure another
  // rank reported ("rank N: ..." names where it happened).
  const std::string what = first->what();
  int origin = -1;
  if (first->kind() == ErrorKind::kNetwork ||
      (std::sscanf(what.c_str(), "rank %d", &origin) == 1 && origin != getRank())) {
    return c10d::ErrorType::REMOTE_ERROR;
  }
  if (what.find("Timed out") != std::string::npos) return c10d::ErrorType::TIMEOUT;
  return c10d::ErrorType::COMM_ERROR;
}

c10::intrusive_ptr<c10d::Backend::Options> FairringBackend::getBackendOptions() {
  return c10::make_intrusive<Options>(getBackendName(), config_.timeout);
}

c10::intrusive_ptr<c10d::Backend> FairringBackend::shrink(const std::vector<int64_t>& ranks_to_exclude,
                                                          int shrink_flags,
                                                          const c10::intrusive_ptr<Options>& opts_override) {
  check_same_process("shrink");
  const int world = getSize();
  std::vector<bool> excluded(world, false);
  std::string list;
  for (int64_t r : ranks_to_exclude) {
    check_rank("shrink", "ranks_to_exclude", r);
    TORCH_CHECK_VALUE(!excluded[r], "fairring: shrink: rank ", r, " is excluded twice");
    excluded[r] = true;
  }
  for (int r = 0; r < world; ++r) {
    if (excluded[r]) list += (list.empty() ? "" : ",") + std::to_string(r);
  }
  TORCH_CHECK_VALUE(!ranks_to_exclude.empty(), "fairring: shrink with no rank to exclude");
  TORCH_CHECK_VALUE(static_cast<int>(ranks_to_exclude.size()) < world, "fairring: shrink excludes every rank (", world,
                    ")");
  TORCH_CHECK_VALUE(!excluded[getRank()], "fairring: shrink called by rank ", getRank(),
                    ", which it excludes: only the ranks that stay call it");
  if (shrink_flags & 1) {  // SHRINK_ABORT: what is in flight here fails now
    GilReleaseIfHeld no_gil;
    abort_engines("rank " + std::to_string(getRank()) + ": this process group was aborted to shrink it");
  }
  int new_rank = 0;
  for (int r = 0; r < getRank(); ++r) new_rank += excluded[r] ? 0 : 1;
  const int new_size = world - static_cast<int>(ranks_to_exclude.size());
  // The survivors meet in a corner of the parent's store of their own: the
  // how-manieth shrink of this group, and the ranks it excludes (survivors
  // that disagree meet nobody, and their creation says so at its timeout).
  auto store = c10::make_intrusive<c10d::PrefixStore>(
      "fairring-shrink/" + std::to_string(shrinks_++) + "/" + list + "/", store_);
  const auto timeout = opts_override ? opts_override->timeout : config_.timeout;
  std::vector<int> members;
  for (int r = 0; r < world; ++r) {
    if (!excluded[r]) members.push_back(r);
  }
  return make_child("shrink", store, new_rank, new_size, timeout, members);
}

c10::intrusive_ptr<c10d::Backend> FairringBackend::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                         const std::vector<int>& ranks,
                                                         const c10::intrusive_ptr<Options>& opts) {
  check_same_process("split");
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    check_rank("split", "ranks", sorted[i]);
    TORCH_CHECK_VALUE(i == 0 || sorted[i] != sorted[i - 1], "fairring: split: rank ", sorted[i], " is listed twice");
  }
  const auto at = std::find(sorted.begin(), sorted.end(), getRank());
  if (at == sorted.end()) return nullptr;
  // torch may split this backend once per device type it serves (CPU and
  // CUDA), under one group name and store: the second call gets the child of
  // the first (a second child would wait on the first's rendezvous).
  const std::string name = opts ? opts->group_name : "";
  if (!name.empty() && name == last_split_name_) {
    if (auto child = last_split_.lock()) return child;
  }
  const auto timeout = opts && opts->timeout.count() > 0 ? opts->timeout : config_.timeout;
  auto child = make_child("split", store, static_cast<int>(at - sorted.begin()), static_cast<int>(sorted.size()),
                          timeout, sorted);
  last_split_name_ = name;
  last_split_ = c10::weak_intrusive_ptr<c10d::Backend>(child);
  return child;
}

c10::intrusive_ptr<c10d::Backend> FairringBackend::make_child(const char* kind,
                                                              const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                              int size, std::chrono::milliseconds timeout,
                                                              const std::vector<int>& members) {
  TORCH_CHECK(child_factory_, "fairring: ", kind, " of a group created without fairring_py (no child factory)");
  auto child = child_factory_(store, rank, size, timeout);
  const std::vector<uint64_t> ours = global_ranks();
  auto* fairring_child = dynamic_cast<FairringBackend*>(child.get());
  if (fairring_child && !ours.empty()) {
    std::vector<uint64_t> theirs;
    for (int r : members) theirs.push_back(ours[static_cast<size_t>(r)]);
    fairring_child->set_global_ranks(std::move(theirs));
  }
  return child;
}

void FairringBackend::leave(const char* how) {
  if (left_) return;
  left_ = true;
  // What the peers read: how, and after which op (the last one issued).
  std::string why = how;
  const auto ops = recent_->snapshot();
  if (ops.empty()) {
    why += " before its first operation";
  } else {
    why += " after " + ops.back().kind + " #" + std::to_string(ops.back().seq);
  }
  if (engine_) engine_->leave(why);
  if (p2p_) p2p_->leave(why);
  with_device_pipeline([&](Pipeline& p) {
    p.leave(why);
    return true;
  });
}

uint64_t FairringBackend::number_collective() {
  follow_once();
  return seq_++;
}

uint64_t FairringBackend::number_p2p() {
  follow_once();
  return p2p_seq_++;
}

void FairringBackend::follow_once() {
  // At the first op, not at creation: torch names the group (setGroupUid)
  // after creating it, on this thread, and the status view reads the name
  // from its own.
  if (followed_.load(std::memory_order_relaxed)) return;
  if (!followed_.exchange(true)) follow_group(this);
}

void FairringBackend::check_same_process(const char* what) const {
  TORCH_CHECK(current_pid() == creator_pid_, "fairring: ", what, " on a process group created in process ",
              creator_pid_, ", from its fork()ed child ", current_pid(),
              ": a child cannot use its parent's group (it would join the parent's collectives). "
              "Create a new process group in the child.");
}

std::function<void(std::exception_ptr)> FairringBackend::track(const char* kind, PipelineOp& op,
                                                               std::function<void(std::exception_ptr)> done,
                                                               const char* suffix) {
  const int world = getSize();
  int64_t elements = op.numel * (op.def->cut() == Cut::kBlockwise ? world : 1);
  if (!op.block_counts.empty()) {
    const auto row = op.block_counts.begin() + static_cast<int64_t>(getRank()) * world;
    elements = std::accumulate(row, row + world, int64_t{0});
  }
  const int64_t bytes = elements * static_cast<int64_t>(c10::elementSize(op.dtype));
  auto recent = recent_;
  auto hooks = abort_hooks_;
  auto ephemeral = ephemeral_;
  if (ephemeral->changed()) apply_timeout();  // an extension came or went
  op.number = number_collective();
  const uint64_t number = op.number;
  auto handle = recent->start(op.number, kind, suffix, op.key(), bytes);
  // torch's flight recorder: what the op reads and writes, as the pipeline has it.
  auto fr = fr_;
  FlightRecord::Id fr_id;
  if (FlightRecord::on()) {
    fr_id = fr->issued(getGroupUid(), getGroupDesc(), kind, "", /*p2p=*/false,
                       op.input_blocks.empty() ? std::vector<at::Tensor>{op.buffer} : op.input_blocks,
                       !op.output_blocks.empty() ? op.output_blocks
                                                 : std::vector<at::Tensor>{op.output.defined() ? op.output : op.buffer},
                       config_.timeout);
  }
  const int rank = getRank();
  FAIRRING_LOG_AT(kLogOps, rank, "#%llu %s%s of %s: issued", static_cast<unsigned long long>(handle.seq), kind, suffix,
                  describe_args(op.key()).c_str());
  // The job's store, to ask every rank to dump too; only when dumps are wanted.
  auto store = FlightRecord::dumps_after_failure() ? store_ : c10::intrusive_ptr<c10d::Store>();
  return [recent, hooks, ephemeral, fr, fr_id, number, handle, rank, kind, suffix, store,
          done = std::move(done)](std::exception_ptr error) {
    ephemeral->op_ended(number);
    const std::string why = error ? error_of(error).what() : "";
    recent->finish(handle, why);
    fr->ended(fr_id, !error);
    FAIRRING_LOG_AT(kLogOps, rank, "#%llu %s%s: %s", static_cast<unsigned long long>(handle.seq), kind, suffix,
                    error ? ("failed: " + why).c_str() : "done");
    // The group's first failure: what led up to it, for the post-mortem.
    if (error && recent->first_failure()) {
      FAIRRING_LOG(rank, "collective #%llu failed; this group's last collectives:\n%s",
                   static_cast<unsigned long long>(handle.seq), recent->format().c_str());
      const std::string dumped = fr->dump_after_failure();
      if (!dumped.empty()) {
        FAIRRING_LOG(rank, "torch's flight recorder dumped to %s", dumped.c_str());
        if (store) ask_every_rank_to_dump(store, rank);  // the stalled ones too
      }
      hooks->run_once(rank);
    }
    done(error);
  };
}

std::string FairringBackend::listen_address() const { return engine_->listen_address(); }

c10::intrusive_ptr<c10d::Work> FairringBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "fairring: all_reduce got an empty list of tensors");
  check_same_process("all_reduce");
  // Sparse gradients (nn.Embedding(sparse=True)): sparse_all_reduce.cpp, or
  // gloo for what that does not take.  Ordered after the ops issued before.
  if (sparse_native(tensors, opts)) return allreduce_sparse_cpu(tensors[0]);
  if (tensors[0].layout() != c10::kStrided) {
    return run_delegated("allreduce", touched(tensors),
                         [&](c10d::Backend& gloo) { return gloo.allreduce(tensors, opts); });
  }
  const RedOp op = to_redop(opts.reduceOp, tensors[0].scalar_type());
  // c10d's list form means one tensor per device, all reduced together
  // (gloo adds the list's tensors to each other too): not what a list of
  // different tensors wants, and not something Fairring does.
  TORCH_CHECK(tensors.size() == 1, "fairring: all_reduce takes one tensor per call, got ", tensors.size(),
              " (the old one-tensor-per-device form). Issue one all_reduce per tensor, or use "
              "all_reduce_coalesced to reduce several tensors in one op.");
  auto scale = premul_factor(opts.reduceOp, tensors[0].scalar_type(), "all_reduce");
  if (!tensors[0].device().is_cpu()) {
    return allreduce_device(tensors[0], tensors, op, std::move(scale));  // backend_cuda.cpp
  }
  return allreduce_cpu(tensors, op, c10d::OpType::ALLREDUCE, std::move(scale));
}

c10::intrusive_ptr<c10d::Work> FairringBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                    const c10d::AllreduceCoalescedOptions& opts) {
  const bool native = !tensors.empty() && std::all_of(tensors.begin(), tensors.end(), [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && t.device().is_cpu();
  });
  if (!native) {
    return run_delegated("allreduce_coalesced", touched(tensors),
                         [&](c10d::Backend& gloo) { return gloo.allreduce_coalesced(tensors, opts); });
  }
  check_same_process("allreduce_coalesced");
  return allreduce_cpu(tensors, to_redop(opts.reduceOp, tensors[0].scalar_type()), c10d::OpType::ALLREDUCE_COALESCED,
                       premul_factor(opts.reduceOp, tensors[0].scalar_type(), "all_reduce_coalesced"));
}

// One all-reduce of CPU tensors: one tensor reduced in place (through a
// contiguous copy if it is not contiguous), or several flattened into one
// buffer and copied back (the old multi-tensor API, allreduce_coalesced).
c10::intrusive_ptr<c10d::Work> FairringBackend::allreduce_cpu(std::vector<at::Tensor>& tensors, RedOp op,
                                                              c10d::OpType type,
                                                              std::function<void(at::Tensor&)> scale) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_CHECK(t.layout() == c10::kStrided && t.device().is_cpu(),
                "fairring: all_reduce_coalesced needs dense CPU tensors, but tensor ", i, " is a ", t.layout(),
                " tensor on ", t.device().str());
  }
  ReduceInput in = prepare_reduce_input(tensors, op);
  auto aop = std::make_shared<HostOp>();
  aop->buffer = in.buffer;
  aop->users = std::move(in.users);
  aop->dtype = in.dtype;
  aop->op = op;
  aop->numel = in.numel;
  aop->stage = stage_of(in, std::move(scale));
  for (const at::Tensor& t : tensors) aop->footprint.write(t);
  const bool coalesced = type == c10d::OpType::ALLREDUCE_COALESCED;
  return submit_cpu(std::move(aop), type, tensors, coalesced ? "all_reduce_coalesced" : "all_reduce",
                    coalesced ? "fairring:all_reduce_coalesced" : "fairring:all_reduce");
}

c10::intrusive_ptr<c10d::Work> FairringBackend::submit_cpu(std::shared_ptr<HostOp> op, c10d::OpType type,
                                                           std::vector<at::Tensor> outputs, const char* kind,
                                                           const char* title) {
  order_after_delegated(op->footprint);
  if (config_.huge_pages == "advise") advise_fresh(*op);
  auto work = c10::make_intrusive<FairringWork>(getRank(), type, std::move(outputs), title);
  op->def = &collective_def(op->collective);
  op->on_complete = track(kind, *op, [work](std::exception_ptr error) { work->mark_done(error); });
  op->after_complete = [work](std::exception_ptr error) { work->complete_future(error); };
  op->complete_here = [work](std::exception_ptr error) { return work->complete_future_if_untaken(error); };
  work->set_interrupt_hook(abort_hook_, kind);
  engine_->submit(std::move(op));
  return work;
}

c10::intrusive_ptr<c10d::Work> FairringBackend::submit_blockwise(Collective collective,
                                                                 const std::vector<at::Tensor>& inputs,
                                                                 const std::vector<at::Tensor>& outputs,
                                                                 const c10d::ReduceOp& reduce_op, c10d::OpType type,
                                                                 const Padded* padded) {
  const bool scatter = collective == Collective::kReduceScatter;
  const char* kind = collective_name(collective);
  check_same_process(kind);
  const int world = getSize();
  const RedOp redop = to_redop(reduce_op, inputs.empty() ? at::kFloat : inputs[0].scalar_type());
  // The tensors read, as one contiguous buffer (a copy if several or strided,
  // or scaled for PREMUL_SUM: the caller's input is only read).
  auto scale = scatter && !inputs.empty() ? premul_factor(reduce_op, inputs[0].scalar_type(), kind) : nullptr;
  // A reduce-scatter's list of one tensor per rank is read where it is:
  // the same schedule as one tensor of the blocks, no copy first.
  const bool rank_blocks = scatter && !padded && static_cast<int>(inputs.size()) == world && world > 1;
  ReduceInput in = scatter ? prepare_reduce_input(inputs, redop, kind, /*copy=*/scale != nullptr, rank_blocks)
                           : prepare_input(inputs, kind);
  int64_t out_numel = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const at::Tensor& t = outputs[i];
    TORCH_CHECK(t.scalar_type() == inputs[0].scalar_type(), "fairring: ", kind, " needs outputs of the input's dtype (",
                dtype_name(inputs[0].scalar_type()), "), but output ", i, " is ", dtype_name(t.scalar_type()));
    TORCH_CHECK(at::has_internal_overlap(t) != at::MemOverlap::Yes, "fairring: ", kind,
                " into a tensor whose elements share memory (sizes ", t.sizes(), ", strides ", t.strides(),
                "): clone() it first");
    out_numel += t.numel() * (t.is_complex() ? 2 : 1);
  }
  // All-to-all: both hold a block per rank; the others: one of them does.
  const bool exchange = collective == Collective::kAllToAll;
  if (exchange) {
    TORCH_CHECK(in.numel == out_numel && in.numel % world == 0, "fairring: ", kind, " on ", world,
                " ranks needs an input and an output of equal size, a multiple of the world size, but the input has ",
                in.numel, " and the output ", out_numel, " (real elements)");
  }
  const int64_t big = scatter || exchange ? in.numel : out_numel;
  const int64_t reals = in.buffer.is_complex() ? 2 : 1;
  const int64_t small = exchange ? in.numel / world : scatter ? (padded ? padded->block * reals : out_numel) : in.numel;
  TORCH_CHECK(big == small * world, "fairring: ", kind, " on ", world, " ranks needs ",
              scatter ? "an input of world size times the output's elements"
                      : "an output of world size times the input's elements",
              ", but the input has ", in.numel, " and the output ", out_numel, " (real elements)");
  check_blockwise_fits(kind, in.dtype);

  auto op = in.buffer.is_cpu() ? std::make_shared<HostOp>() : new_device_op();
  op->collective = collective;
  op->buffer = in.buffer;
  op->dtype = in.dtype;
  op->op = scatter ? redop : RedOp::kSum;
  op->numel = small;
  op->layout = padded ? padded->layout : 0;
  op->stage = stage_of(in, std::move(scale));
  op->input_blocks = in.blocks;
  for (const at::Tensor& t : inputs) op->footprint.read(t);
  for (const at::Tensor& t : outputs) op->footprint.write(t);
  // The result goes straight into the caller's tensor when it is one plain
  // contiguous tensor that is not the input, or is exactly this rank's block
  // of it (in place, as FSDP does it); otherwise into a stand-in copied back.
  const at::Tensor& out = outputs[0];
  const int64_t esize = c10::elementSize(in.dtype);
  const char* out_at = static_cast<const char*>(out.data_ptr());
  const char* in_at = static_cast<const char*>(op->buffer.data_ptr());
  const char* own_in =
      in.blocks.empty() ? in_at + getRank() * small * esize : static_cast<const char*>(in.blocks[getRank()].data_ptr());
  const bool own_block = !exchange && (scatter ? out_at == own_in : in_at == out_at + getRank() * small * esize);
  const bool out_aliases_input =
      out.is_alias_of(op->buffer) ||
      std::any_of(in.blocks.begin(), in.blocks.end(), [&](const at::Tensor& b) { return out.is_alias_of(b); });
  const bool plain = outputs.size() == 1 && plain_tensor(out);
  // A list of one tensor per rank (all_gather's, all_to_all's): each block
  // straight into its tensor, unless one shares memory with the input (but
  // for exactly our own block, in place).
  const bool list = outputs.size() > 1 && static_cast<int>(outputs.size()) == world && in.buffer.is_cpu() &&
                    std::all_of(outputs.begin(), outputs.end(), plain_tensor);
  bool blocks_apart = list;
  for (int r = 0; list && r < world; ++r) {
    const bool in_place = r == getRank() && outputs[r].data_ptr() == op->buffer.data_ptr();
    if (outputs[r].is_alias_of(op->buffer) && !in_place) blocks_apart = false;
  }
  if (!padded && plain && (!out_aliases_input || own_block)) {
    op->output = out;
  } else if (!padded && blocks_apart) {
    op->output_blocks = outputs;
  } else {
    // A padded block's first elements are the caller's (copy_to_users).
    op->output = stand_in((padded ? small : out_numel) / reals, out.options());
    op->users = outputs;
  }
  if (!op->buffer.is_cpu()) return submit_device(std::move(op), type, outputs, kind);
  return submit_cpu(std::static_pointer_cast<HostOp>(op), type, outputs, kind,
                    exchange                                   ? "fairring:all_to_all"
                    : scatter                                  ? "fairring:reduce_scatter"
                    : collective == Collective::kAllToAllSizes ? "fairring:all_to_all_sizes"
                                                               : "fairring:all_gather");
}

bool FairringBackend::native_tensors(const std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) return true;
  const c10::Device device = tensors[0].device();
  if (!device.is_cpu() && !device_native(tensors[0])) return false;
  return std::all_of(tensors.begin(), tensors.end(),
                     [&](const at::Tensor& t) { return t.layout() == c10::kStrided && t.device() == device; });
}

c10d::Backend& FairringBackend::delegate(const char* kind) {
  check_same_process(kind);
  // torch named our group (setGroupUid, setGroupDesc), not the gloo group
  // we delegate to: its flight-recorder entries would be filed under no
  // group.  It takes our name before its first op (later ones find it set).
  if (fallback_->getGroupUid() != getGroupUid() || fallback_->getGroupDesc() != getGroupDesc()) {
    fallback_->setGroupUid(getGroupUid());
    fallback_->setGroupDesc(getGroupDesc());
  }
  recent_->start(number_collective(), std::string(kind) + " (gloo)", "", 0, /*delegated=*/true);
  if (engine_) engine_->wait_idle();
  wait_idle_device();
  return *fallback_;
}

void FairringBackend::remember_delegated(const c10::intrusive_ptr<c10d::Work>& work, Footprint fp, bool p2p) {
  std::lock_guard<std::mutex> lock(delegated_mu_);
  delegated_.push_back(Delegated{work, std::move(fp), p2p});
  has_delegated_.store(true, std::memory_order_release);
}

void FairringBackend::order_after_delegated(const Footprint& fp, bool with_p2p) {
  if (with_p2p && p2p_ && p2p_->busy()) {
    GilReleaseIfHeld no_gil;
    if (p2p_->wait_conflicts(fp)) delegated_waits_.fetch_add(1, std::memory_order_relaxed);
  }
  if (!has_delegated_.load(std::memory_order_acquire)) return;  // the usual case: no lock
  std::vector<c10::intrusive_ptr<c10d::Work>> wait_for;
  {
    std::lock_guard<std::mutex> lock(delegated_mu_);
    std::vector<Delegated> still;
    for (auto& d : delegated_) {
      if (d.work->isCompleted()) continue;
      if ((with_p2p || !d.p2p) && fp.conflicts_with(d.fp)) {
        wait_for.push_back(d.work);
      } else {
        still.push_back(std::move(d));
      }
    }
    delegated_.swap(still);
    has_delegated_.store(!delegated_.empty(), std::memory_order_release);
  }
  if (wait_for.empty()) return;
  delegated_waits_.fetch_add(1, std::memory_order_relaxed);
  // Their outcomes are their callers' to see through their own Works: only wait here.
  GilReleaseIfHeld no_gil;
  for (auto& work : wait_for) {
    try {
      work->getFuture()->wait();
    } catch (const std::exception&) {
      try {
        work->wait();  // a Work without a future; its error is its caller's
      } catch (const std::exception&) {
      }
    }
  }
}

void FairringBackend::check_blockwise_fits(const char* kind, c10::ScalarType dtype) const {
  PlanParams params;
  params.slice_bytes = config_.slice_size;
  // A slice holds a piece per rank, or more on uneven nodes (plan.h).
  TORCH_CHECK(blockwise_fits(c10::elementSize(dtype), blockwise_pieces_, params), "fairring: ", kind, " on ", getSize(),
              " ranks does not fit a slice of FAIRRING_SLICE_SIZE=", config_.slice_size, " bytes; raise it");
}

uint64_t FairringBackend::order_waits() const {
  uint64_t device = 0;
  with_device_pipeline([&](Pipeline& p) {
    device = p.order_waits();
    return true;
  });
  const uint64_t host = engine_ ? engine_->order_waits() : 0;
  return host + device + delegated_waits_.load(std::memory_order_relaxed);
}

void FairringBackend::wait_idle_device() {
  with_torch_errors([&] {
    with_device_pipeline([](Pipeline& p) {
      p.wait_idle();
      return true;
    });
  });
}

c10::intrusive_ptr<c10d::Work> FairringBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  // One dense tensor on the CPU (or on the GPU, in a CUDA build) is native;
  // the rest (several tensors, sparse, conjugate or negative views) goes to gloo.
  check_rank("broadcast", "src", opts.rootRank);
  const bool native = tensors.size() == 1 && opts.rootTensor == 0 && native_tensors(tensors) && !tensors[0].is_conj() &&
                      !tensors[0].is_neg();
  if (!native) {
    return run_delegated("broadcast", touched(tensors),
                         [&](c10d::Backend& gloo) { return gloo.broadcast(tensors, opts); });
  }
  check_same_process("broadcast");
  // The tensor's bytes, whatever its dtype: the root's reach every rank
  // exactly (pipeline/slice_schedule.h, the broadcast's phases).
  const at::Tensor& t = tensors[0];
  auto op = t.is_cpu() ? std::make_shared<HostOp>() : new_device_op();
  op->collective = Collective::kBroadcast;
  op->root = static_cast<int32_t>(opts.rootRank);
  const bool root = getRank() == opts.rootRank;
  if (t.is_contiguous()) {
    op->buffer = t;
  } else {
    op->buffer = stand_in(t.numel(), t.options());
    if (root) {
      op->stage = [buffer = op->buffer, t] { buffer.view(t.sizes()).copy_(t); };  // only read
    } else {
      op->users = {t};  // receives the result
    }
  }
  if (root) {
    op->footprint.read(t);
  } else {
    op->footprint.write(t);
  }
  op->dtype = at::kByte;
  op->op = RedOp::kSum;  // compared between ranks, not applied
  op->numel = t.numel() * static_cast<int64_t>(t.element_size());
  if (!t.is_cpu()) return submit_device(std::move(op), c10d::OpType::BROADCAST, tensors, "broadcast");
  return submit_cpu(std::static_pointer_cast<HostOp>(op), c10d::OpType::BROADCAST, tensors, "broadcast",
                    "fairring:broadcast");
}
c10::intrusive_ptr<c10d::Work> FairringBackend::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  // One dense CPU tensor is native (collectives/reduce.cpp); the rest
  // (several tensors, sparse, device tensors) goes to gloo.
  check_rank("reduce", "dst", opts.rootRank);
  const bool native = tensors.size() == 1 && opts.rootTensor == 0 && tensors[0].layout() == c10::kStrided &&
                      tensors[0].device().is_cpu();
  if (!native) {
    return run_delegated("reduce", touched(tensors), [&](c10d::Backend& gloo) { return gloo.reduce(tensors, opts); });
  }
  check_same_process("reduce");
  const at::Tensor& t = tensors[0];
  const RedOp redop = to_redop(opts.reduceOp, t.scalar_type());
  const bool root = getRank() == opts.rootRank;
  auto scale = premul_factor(opts.reduceOp, t.scalar_type(), "reduce");
  // The root's tensor gets the result; the others' are only read (a copy
  // when PREMUL_SUM scales it), and nothing is copied back into them.
  ReduceInput in = prepare_reduce_input(tensors, redop, "reduce", /*copy=*/!root && scale != nullptr);
  auto op = std::make_shared<HostOp>();
  op->collective = Collective::kReduce;
  op->root = static_cast<int32_t>(opts.rootRank);
  op->buffer = in.buffer;
  op->dtype = in.dtype;
  op->op = redop;
  op->numel = in.numel;
  op->stage = stage_of(in, std::move(scale));
  if (root) {
    op->users = std::move(in.users);
    op->footprint.write(t);
  } else {
    op->footprint.read(t);
    // On a node of one rank the sums this rank serves need memory of their
    // own (reduce.cpp): never the caller's tensor.
    if (topo_.ranks_per_node == 1 && topo_.num_nodes > 1)
      op->output = stand_in(in.numel, in.buffer.options().dtype(in.dtype));
  }
  return submit_cpu(std::move(op), c10d::OpType::REDUCE, tensors, "reduce", "fairring:reduce");
}
c10::intrusive_ptr<c10d::Work> FairringBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllgatherOptions& opts) {
  // Native when every output has the input's size (blockwise); a list of
  // one tensor per rank of other sizes (each rank's input size) pairwise;
  // other forms go to gloo.
  if (outputs.size() != 1 || inputs.size() != 1 || !native_tensors(both(inputs, outputs[0]))) {
    return run_delegated("allgather", touched(outputs, inputs),
                         [&](c10d::Backend& gloo) { return gloo.allgather(outputs, inputs, opts); });
  }
  if (!std::all_of(outputs[0].begin(), outputs[0].end(),
                   [&](const at::Tensor& t) { return t.numel() == inputs[0].numel(); })) {
    if (!inputs[0].device().is_cpu() || static_cast<int>(outputs[0].size()) != getSize()) {
      return run_delegated("allgather", touched(outputs, inputs),
                           [&](c10d::Backend& gloo) { return gloo.allgather(outputs, inputs, opts); });
    }
    return exchange_blocks(std::vector<at::Tensor>(getSize(), inputs[0]), outputs[0], outputs[0],
                           c10d::OpType::ALLGATHER, "all_gather (pairwise)");
  }
  return submit_blockwise(Collective::kAllGather, inputs, outputs[0], c10d::ReduceOp::SUM, c10d::OpType::ALLGATHER);
}
c10::intrusive_ptr<c10d::Work> FairringBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::AllgatherOptions& opts) {
  if (!native_tensors({output, input})) {
    return run_delegated("_allgather_base", touched(output, input),
                         [&](c10d::Backend& gloo) { return gloo._allgather_base(output, input, opts); });
  }
  return submit_blockwise(Collective::kAllGather, {input}, {output}, c10d::ReduceOp::SUM,
                          c10d::OpType::_ALLGATHER_BASE);
}
c10::intrusive_ptr<c10d::Work> FairringBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                    std::vector<at::Tensor>& inputs,
                                                                    const c10d::AllgatherOptions& opts) {
  // outputs[r][i] receives rank r's inputs[i]: one all-gather of the
  // flattened inputs, whose block r is outputs[r] flattened.
  std::vector<at::Tensor> flat_out;
  bool even = static_cast<int>(outputs.size()) == getSize();
  for (size_t r = 0; even && r < outputs.size(); ++r) {
    even = outputs[r].size() == inputs.size() && native_tensors(both(inputs, outputs[r]));
    for (size_t i = 0; even && i < inputs.size(); ++i) even = outputs[r][i].numel() == inputs[i].numel();
    flat_out.insert(flat_out.end(), outputs[r].begin(), outputs[r].end());
  }
  if (!even || inputs.empty()) {
    return run_delegated("allgather_coalesced", touched(outputs, inputs),
                         [&](c10d::Backend& gloo) { return gloo.allgather_coalesced(outputs, inputs, opts); });
  }
  return submit_blockwise(Collective::kAllGather, inputs, flat_out, c10d::ReduceOp::SUM,
                          c10d::OpType::ALLGATHER_COALESCED);
}
c10::intrusive_ptr<c10d::Work> FairringBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                std::vector<at::Tensor>& inputs,
                                                                                const c10d::AllgatherOptions& opts) {
  if (outputs.empty() || outputs.size() != inputs.size() || !native_tensors(both(inputs, outputs))) {
    return run_delegated("allgather_into_tensor_coalesced", touched(outputs, inputs), [&](c10d::Backend& gloo) {
      return gloo.allgather_into_tensor_coalesced(outputs, inputs, opts);
    });
  }
  // One all-gather per pair, in order; the last one completes after the others.
  c10::intrusive_ptr<c10d::Work> last;
  for (size_t i = 0; i < inputs.size(); ++i) {
    last = submit_blockwise(Collective::kAllGather, {inputs[i]}, {outputs[i]}, c10d::ReduceOp::SUM,
                            c10d::OpType::COALESCED);
  }
  return last;
}
c10::intrusive_ptr<c10d::Work> FairringBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::GatherOptions& opts) {
  // Native for one dense CPU or CUDA input (the same test on every rank);
  // the root's list is checked in submit_rooted.
  check_rank("gather", "dst", opts.rootRank);
  if (inputs.size() != 1 || !native_tensors(inputs) || outputs.size() > 1) {
    return run_delegated("gather", touched(outputs, inputs),
                         [&](c10d::Backend& gloo) { return gloo.gather(outputs, inputs, opts); });
  }
  return submit_rooted(Collective::kGather, static_cast<int>(opts.rootRank), inputs[0],
                       outputs.empty() ? std::vector<at::Tensor>{} : outputs[0], c10d::OpType::GATHER);
}
c10::intrusive_ptr<c10d::Work> FairringBackend::scatter(std::vector<at::Tensor>& outputs,
                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                        const c10d::ScatterOptions& opts) {
  check_rank("scatter", "src", opts.rootRank);
  if (outputs.size() != 1 || !native_tensors(outputs) || inputs.size() > 1) {
    return run_delegated("scatter", touched(outputs, inputs),
                         [&](c10d::Backend& gloo) { return gloo.scatter(outputs, inputs, opts); });
  }
  return submit_rooted(Collective::kScatter, static_cast<int>(opts.rootRank), outputs[0],
                       inputs.empty() ? std::vector<at::Tensor>{} : inputs[0], c10d::OpType::SCATTER);
}

c10::intrusive_ptr<c10d::Work> FairringBackend::submit_rooted(Collective collective, int root, const at::Tensor& one,
                                                              const std::vector<at::Tensor>& blocks,
                                                              c10d::OpType type) {
  const bool gather = collective == Collective::kGather;
  const char* kind = collective_name(collective);
  check_same_process(kind);
  const int world = getSize();
  const bool is_root = getRank() == root;
  if (is_root) {
    TORCH_CHECK(static_cast<int>(blocks.size()) == world, "fairring: ", kind, " needs one tensor per rank (", world,
                ") on the root, but got ", blocks.size());
    for (size_t i = 0; i < blocks.size(); ++i) {
      const at::Tensor& b = blocks[i];
      TORCH_CHECK(b.numel() == one.numel() && b.scalar_type() == one.scalar_type() && b.device() == one.device(),
                  "fairring: ", kind, " needs the root's tensors to be like its own (", one.numel(), " elements of ",
                  dtype_name(one.scalar_type()), " on ", one.device().str(), "), but tensor ", i, " has ", b.numel(),
                  " of ", dtype_name(b.scalar_type()), " on ", b.device().str());
      TORCH_CHECK(b.layout() == c10::kStrided && (!gather || at::has_internal_overlap(b) != at::MemOverlap::Yes),
                  "fairring: ", kind, " into tensor ", i,
                  " of the root's list, whose elements share memory or which "
                  "is not dense: clone() it first");
    }
  } else {
    TORCH_CHECK(blocks.empty(), "fairring: ", kind, " takes a list of tensors on the root (rank ", root,
                ") only, but rank ", getRank(), " got ", blocks.size());
  }
  PlanParams params;
  params.slice_bytes = config_.slice_size;
  auto op = one.is_cpu() ? std::make_shared<HostOp>() : new_device_op();
  op->collective = collective;
  op->root = root;
  op->op = RedOp::kSum;  // compared between ranks, not applied
  if (gather) {
    ReduceInput in = prepare_input({one}, kind);
    op->buffer = in.buffer;
    op->stage = in.fill;
    op->footprint.read(one);
    if (is_root) {
      // Straight into the caller's tensors, or a stand-in copied back.
      if (std::all_of(blocks.begin(), blocks.end(), plain_tensor)) {
        op->output_blocks = blocks;
      } else {
        op->output = stand_in(world * one.numel(), one.options());
        op->users = blocks;
      }
      for (const at::Tensor& b : blocks) op->footprint.write(b);
    }
  } else {
    TORCH_CHECK(at::has_internal_overlap(one) != at::MemOverlap::Yes, "fairring: scatter into a tensor whose ",
                "elements share memory (sizes ", one.sizes(), ", strides ", one.strides(), "): clone() it first");
    bool aliased = false;  // our output shares memory with the root's input
    if (is_root) {
      // Read where the caller has them, or from a contiguous copy.
      if (std::all_of(blocks.begin(), blocks.end(), plain_tensor)) {
        op->input_blocks = blocks;
        op->buffer = blocks[0];  // (its device and dtype)
      } else {
        ReduceInput in = prepare_input(blocks, kind);
        op->buffer = in.buffer;
        op->stage = in.fill;
      }
      for (const at::Tensor& b : blocks) {
        op->footprint.read(b);
        aliased = aliased || one.is_alias_of(b);
      }
      aliased = aliased || one.is_alias_of(op->buffer);
    }
    if (plain_tensor(one) && !aliased) {
      op->output = one;
    } else {
      op->output = stand_in(one.numel(), one.options());
      op->users = {one};
    }
    if (!is_root) op->buffer = op->output;  // not read: only the root's input is
    op->footprint.write(one);
  }
  op->dtype = one.is_complex() ? c10::toRealValueType(one.scalar_type()) : one.scalar_type();
  op->numel = one.numel() * (one.is_complex() ? 2 : 1);
  check_blockwise_fits(kind, op->dtype);
  std::vector<at::Tensor> outputs = gather ? blocks : std::vector<at::Tensor>{one};
  if (!one.is_cpu()) return submit_device(std::move(op), type, std::move(outputs), kind);
  return submit_cpu(std::static_pointer_cast<HostOp>(op), type, std::move(outputs), kind,
                    gather ? "fairring:gather" : "fairring:scatter");
}
c10::intrusive_ptr<c10d::Work> FairringBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                               std::vector<std::vector<at::Tensor>>& inputs,
                                                               const c10d::ReduceScatterOptions& opts) {
  // inputs[0][r] is reduced into rank r's output: one reduce-scatter of the
  // inputs flattened; blocks of unequal sizes padded (CPU).  Other lists
  // (several outputs, device tensors of unequal sizes) go to gloo.
  const auto same_size = [&](const at::Tensor& t) { return t.numel() == outputs[0].numel(); };
  const bool native = outputs.size() == 1 && inputs.size() == 1 && native_tensors(both(inputs[0], outputs)) &&
                      static_cast<int>(inputs[0].size()) == getSize();
  const bool equal = native && std::all_of(inputs[0].begin(), inputs[0].end(), same_size);
  if (equal) {
    return submit_blockwise(Collective::kReduceScatter, inputs[0], outputs, opts.reduceOp,
                            c10d::OpType::REDUCE_SCATTER);
  }
  if (native && outputs[0].is_cpu()) return reduce_scatter_uneven(outputs[0], inputs[0], opts.reduceOp);
  return run_delegated("reduce_scatter", touched(outputs, inputs),
                       [&](c10d::Backend& gloo) { return gloo.reduce_scatter(outputs, inputs, opts); });
}

// Each block padded with zeros to the largest, the padded blocks reduced
// and scattered as equal ones, the first elements of ours copied out.  The
// padding costs (largest - own) elements of copy per block and the same
// extra traffic; the layout in the op's key makes ranks that cut their
// lists differently fail with a mismatch (same total, other cuts included).
c10::intrusive_ptr<c10d::Work> FairringBackend::reduce_scatter_uneven(const at::Tensor& output,
                                                                      const std::vector<at::Tensor>& inputs,
                                                                      const c10d::ReduceOp& op) {
  std::vector<int64_t> sizes;
  for (const at::Tensor& t : inputs) sizes.push_back(t.numel());
  const int64_t block = *std::max_element(sizes.begin(), sizes.end());
  TORCH_CHECK_VALUE(output.numel() == sizes[getRank()], "fairring: reduce_scatter: this rank's output has ",
                    output.numel(), " element(s), but its block of the input list (tensor ", getRank(), ") has ",
                    sizes[getRank()]);
  // The caller's blocks, each followed by its zeros: flattened in order by
  // the op's stage, when the issue order lets it read them.
  std::vector<at::Tensor> padded_inputs;
  for (const at::Tensor& t : inputs) {
    padded_inputs.push_back(t);
    if (t.numel() < block) padded_inputs.push_back(at::zeros({block - t.numel()}, t.options()));
  }
  const Padded padded{block, block_layout(sizes.data(), static_cast<int>(sizes.size()))};
  return submit_blockwise(Collective::kReduceScatter, padded_inputs, {output}, op, c10d::OpType::REDUCE_SCATTER,
                          &padded);
}
c10::intrusive_ptr<c10d::Work> FairringBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                     const c10d::ReduceScatterOptions& opts) {
  if (!native_tensors({output, input})) {
    return run_delegated("_reduce_scatter_base", touched(output, input),
                         [&](c10d::Backend& gloo) { return gloo._reduce_scatter_base(output, input, opts); });
  }
  return submit_blockwise(Collective::kReduceScatter, {input}, {output}, opts.reduceOp,
                          c10d::OpType::_REDUCE_SCATTER_BASE);
}
c10::intrusive_ptr<c10d::Work> FairringBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  if (outputs.empty() || outputs.size() != inputs.size() || !native_tensors(both(inputs, outputs))) {
    return run_delegated("reduce_scatter_tensor_coalesced", touched(outputs, inputs), [&](c10d::Backend& gloo) {
      return gloo.reduce_scatter_tensor_coalesced(outputs, inputs, opts);
    });
  }
  // One reduce-scatter per pair, in order; the last one completes after the others.
  c10::intrusive_ptr<c10d::Work> last;
  for (size_t i = 0; i < inputs.size(); ++i) {
    last =
        submit_blockwise(Collective::kReduceScatter, {inputs[i]}, {outputs[i]}, opts.reduceOp, c10d::OpType::COALESCED);
  }
  return last;
}
namespace {
// `splits` (rows of dim 0 per rank; none: as many each) must cut `t`
// exactly: gloo reads past a tensor they do not fit.  Throws what is wrong.
void check_splits(const std::vector<int64_t>& splits, const at::Tensor& t, int world, const char* which) {
  TORCH_CHECK(t.dim() > 0, "fairring: all_to_all_single needs tensors of at least one dimension, but the ", which,
              " is a scalar");
  if (splits.empty()) {
    TORCH_CHECK(t.size(0) % world == 0, "fairring: all_to_all_single without ", which, " splits cuts dim 0 into ",
                world, " equal blocks, but the ", which, " has ", t.size(0), " rows; give the splits");
    return;
  }
  TORCH_CHECK(static_cast<int>(splits.size()) == world, "fairring: all_to_all_single needs one ", which,
              " split per rank (", world, "), but got ", splits.size());
  int64_t sum = 0;
  for (int64_t n : splits) {
    TORCH_CHECK(n >= 0, "fairring: all_to_all_single got a negative ", which, " split (", n, ")");
    sum += n;
  }
  TORCH_CHECK(sum == t.size(0), "fairring: all_to_all_single's ", which, " splits add up to ", sum, " rows, but the ",
              which, " has ", t.size(0));
}

}  // namespace

c10::intrusive_ptr<c10d::Work> FairringBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_splits,
                                                              std::vector<int64_t>& input_splits,
                                                              const c10d::AllToAllOptions& opts) {
  // Native (CPU and CUDA): without splits, equal blocks (all_to_all.cpp);
  // with splits, equal or not, all_to_all_uneven: the path depends only on
  // whether splits are passed, which every rank must do alike (a rank that
  // passes none while its peers pass some gets a mismatch on CPU tensors).
  const int world = getSize();
  if ((!input_splits.empty() || !output_splits.empty()) && native_tensors({output, input})) {
    // The splits are checked once every rank has its sizes (so a rank's bad
    // splits fail its peers too, at once).
    return all_to_all_uneven(
        {input}, {output},
        [&] {
          check_splits(input_splits, input, world, "input");
          check_splits(output_splits, output, world, "output");
          // Elements per block: rows times the elements of a row.
          const auto elements = [&](const at::Tensor& t, const std::vector<int64_t>& splits) {
            const int64_t per_row = t.size(0) == 0 ? 0 : t.numel() / t.size(0);
            std::vector<int64_t> out(world);
            for (int r = 0; r < world; ++r) out[r] = (splits.empty() ? t.size(0) / world : splits[r]) * per_row;
            return out;
          };
          return Sizes{elements(input, input_splits), elements(output, output_splits)};
        },
        c10d::OpType::ALLTOALL_BASE);
  }
  check_splits(input_splits, input, world, "input");
  check_splits(output_splits, output, world, "output");
  if (!native_tensors({output, input})) {
    return run_delegated("alltoall_base", touched(output, input), [&](c10d::Backend& gloo) {
      return gloo.alltoall_base(output, input, output_splits, input_splits, opts);
    });
  }
  return submit_blockwise(Collective::kAllToAll, {input}, {output}, c10d::ReduceOp::SUM, c10d::OpType::ALLTOALL_BASE);
}
c10::intrusive_ptr<c10d::Work> FairringBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  // Native for W dense tensors each way (CPU and CUDA), of any sizes: the
  // list form always shares its sizes first (all_to_all_uneven), so that
  // ranks whose lists happen to be of one size take the same path as
  // their peers.  Other lists go to gloo.
  if (inputs.empty() || static_cast<int>(inputs.size()) != getSize() || outputs.size() != inputs.size() ||
      !native_tensors(both(inputs, outputs))) {
    return run_delegated("alltoall", touched(outputs, inputs),
                         [&](c10d::Backend& gloo) { return gloo.alltoall(outputs, inputs, opts); });
  }
  return all_to_all_uneven(
      inputs, outputs,
      [&] {
        Sizes sizes;
        for (const at::Tensor& t : inputs) sizes.sends.push_back(t.numel());
        for (const at::Tensor& t : outputs) sizes.recvs.push_back(t.numel());
        return sizes;
      },
      c10d::OpType::ALLTOALL);
}
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
  auto handle =
      recent->start(number_p2p(), kind, what, t.numel() * t.element_size(), /*delegated=*/false, /*p2p=*/true);
  auto fr = fr_;
  FlightRecord::Id fr_id;
  if (FlightRecord::on()) {
    // As NCCL names them: "send 0->1", "recv 1<-0" (ranks of this group).
    const std::string route =
        is_send ? std::to_string(getRank()) + "->" + std::to_string(peer)
                : std::to_string(getRank()) + "<-" + (peer == kAnySource ? std::string("any") : std::to_string(peer));
    fr_id = fr->issued(getGroupUid(), getGroupDesc(), is_send ? "send" : "recv", route, /*p2p=*/true, {t}, {t},
                       config_.timeout);
  }
  CompletionPool* pool = &p2p_->completions();
  // A receive into device memory lands off the engine's threads (the copy
  // waits for the caller's stream); until then it is remembered like a
  // delegated op, so that later ops on the tensor wait for it.
  if (device && !is_send) remember_delegated(work, fp, /*p2p=*/true);
  auto done = [work, recent, handle, fr, fr_id, pool, is_send, device, land = std::move(land), buffer](
                  std::exception_ptr error, int from, bool on_caller) mutable {
    if (!is_send) work->set_source_rank(from);
    auto finish = [work, recent, handle, fr, fr_id, pool, land = std::move(land), buffer](std::exception_ptr error,
                                                                                          bool on_caller) {
      if (!error && land) {
        try {
          land(buffer);
        } catch (const std::exception& e) {
          error = std::make_exception_ptr(error_of(e));
        }
      }
      fr->ended(fr_id, !error);
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
  auto handle = recent->start(number_collective(), kind,
                              std::to_string(bytes) + " bytes to send, blocks of unequal sizes", bytes);
  // torch's flight recorder: under the collective's own name, as the pipeline's are.
  auto fr = fr_;
  FlightRecord::Id fr_id;
  if (FlightRecord::on()) {
    const bool gather = type == c10d::OpType::ALLGATHER;
    fr_id = fr->issued(getGroupUid(), getGroupDesc(), gather ? "all_gather" : "all_to_all", "", /*p2p=*/false,
                       gather ? std::vector<at::Tensor>{sends[me]} : sends, outputs, config_.timeout);
  }
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
  auto done = [st, work, recent, handle, fr, fr_id, pool](std::exception_ptr error, int, bool on_caller) {
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
    fr->ended(fr_id, !first);
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

c10::intrusive_ptr<c10d::Work> FairringBackend::barrier(const c10d::BarrierOptions& opts) {
  check_same_process("barrier");
  // CUDA collectives run on their own engine, which the CPU pipeline does not
  // order against: the caller waits for them (their device work included),
  // as before a delegated call; a group without any returns at once.
  wait_idle_device();
  // And for every delegated collective still running (its memory is not the
  // barrier's).  Not for sends and receives: a receive posted before the
  // barrier may be matched by a send issued after it.
  order_after_delegated(Footprint::all_memory(), /*with_p2p=*/false);
  // Native: one byte all-reduced (MAX) through the pipeline, after every
  // collective issued before it; a small op, so it runs inline when idle.
  std::vector<at::Tensor> token{at::zeros({1}, at::kByte)};
  auto op = std::make_shared<HostOp>();
  op->collective = Collective::kBarrier;
  op->buffer = token[0];
  op->dtype = at::kByte;
  op->op = RedOp::kMax;
  op->numel = 1;
  return submit_cpu(std::move(op), c10d::OpType::BARRIER, token, "barrier", "fairring:barrier");
}
c10::intrusive_ptr<c10d::Work> FairringBackend::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                                 const c10d::AllreduceOptions& opts) {
  if (sparse_native(tensors, opts)) return allreduce_sparse_cpu(tensors[0]);
  return run_delegated("allreduce_sparse", touched(tensors),
                       [&](c10d::Backend& gloo) { return gloo.allreduce_sparse(tensors, opts); });
}
void FairringBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  delegate("monitoredBarrier").monitoredBarrier(opts, wait_all_ranks);
}

}  // namespace fairring
