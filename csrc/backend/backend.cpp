#include "backend/backend.h"
#include "collectives/collectives.h"

#include <unistd.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <numeric>
#include <optional>

#include "devices/cuda_engine.h"
#include "devices/host_engine.h"
#include "backend/dump_everywhere.h"
#include "backend/init_store.h"
#include "backend/live_groups.h"
#include "backend/torch_error.h"
#include "common/current_pid.h"
#include "common/log.h"
#include "backend/work.h"
#include "common/gil.h"
#include "common/same_settings.h"
#include "p2p/p2p_engine.h"
#include "topology/machine.h"

namespace fairring {

namespace {
// A rank's record at group creation: its fields, each prefixed by its length
// (a node key or the secret may hold any byte).
std::string pack_fields(const std::vector<std::string>& fields) {
  std::string out;
  for (const std::string& f : fields) out += std::to_string(f.size()) + ":" + f;
  return out;
}

std::vector<std::string> unpack_fields(const std::string& record, size_t count, int rank) {
  std::vector<std::string> fields;
  size_t at = 0;
  while (fields.size() < count) {
    const size_t colon = record.find(':', at);
    size_t len = 0;
    bool ok = colon != std::string::npos && colon > at && colon - at <= 12;
    for (size_t i = at; ok && i < colon; ++i) {
      ok = record[i] >= '0' && record[i] <= '9';
      len = len * 10 + static_cast<size_t>(record[i] - '0');
    }
    if (!ok || record.size() - colon - 1 < len) {
      throw Error(ErrorKind::kBackend, "fairring: malformed group-creation record of rank " + std::to_string(rank) +
                                           " in the store (another job's keys under this prefix?)");
    }
    fields.push_back(record.substr(colon + 1, len));
    at = colon + 1 + len;
  }
  return fields;
}
}  // namespace

FairringBackend::FairringBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, const Config& config,
                                 const std::string& node_key, c10::intrusive_ptr<c10d::Backend> fallback)
    : c10d::Backend(rank, size),
      config_(config),
      fallback_(std::move(fallback)),
      fr_(std::make_shared<FlightRecord>(rank, size)),
      recent_(std::make_shared<RecentOps>(kRecentOps, fr_)) {
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
  const std::string settings =
      "FAIRRING_SLICE_SIZE=" + std::to_string(config_.slice_size) + (config_.slice_size_auto ? " (default)" : "") +
      ", FAIRRING_PARALLELISM=" + std::to_string(config_.parallelism) + ", FAIRRING_WIRE_DTYPE=" + config_.wire_dtype +
      ", FAIRRING_REDUCTION_SERVERS=" + std::to_string(config_.reduction_servers) +
      ", FAIRRING_RAIL_RADIX=" + std::to_string(config_.rail_radix);
  // One record per rank, read in one wait: which machine and node it is on,
  // its settings, and from rank 0 the group's secret (TCP peers must present
  // it) and a unique name for its shared memory.  Each wait in the store is
  // a wait for the slowest rank, so all of this comes in one.
  std::string secret_blob;
  if (rank == 0) {
    secret_ = random_secret();
    job_uid_ = random_hex(8);
    secret_blob.assign(secret_.begin(), secret_.end());
    secret_blob += job_uid_;
  }
  const std::string machine = machine_key();
  const std::string mine = pack_fields({node_key, machine, settings, secret_blob});
  store->set("meet/" + std::to_string(rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> keys, machines, all_settings;
  const std::vector<std::string> records = read_every_rank(store, "meet", size);
  for (int r = 0; r < size; ++r) {
    std::vector<std::string> fields = unpack_fields(records[r], 4, r);
    keys.push_back(std::move(fields[0]));
    machines.push_back(std::move(fields[1]));
    all_settings.push_back(std::move(fields[2]));
    if (r == 0 && rank != 0) secret_blob = std::move(fields[3]);
  }
  check_settings_agree(all_settings, rank, settings);
  if (rank != 0) {
    TORCH_CHECK(secret_blob.size() > secret_.size(), "fairring: malformed secret in the store");
    std::copy(secret_blob.begin(), secret_blob.begin() + secret_.size(), secret_.begin());
    job_uid_.assign(secret_blob.begin() + secret_.size(), secret_blob.end());
  }
  // The real machine too (a simulated node is one of several on it): for
  // whether the ranks here each have a core (wait_spin_for).
  const int ranks_here = static_cast<int>(std::count(machines.begin(), machines.end(), machine));
  topo_ = build_topology(keys, rank);
  node_keys_ = std::move(keys);
  if (config_.slice_size_auto) {
    // Larger slices with many ranks between nodes (config.h), within the
    // staging memory the group may use.
    const int64_t given = config_.slice_size;
    config_.slice_size = auto_slice_size(given, size, topo_.num_nodes);
    while (config_.slice_size > given && host_staging_bytes(config_, topo_) > config_.total_memory) {
      config_.slice_size = std::max(given, config_.slice_size / 2);
    }
  }
  blockwise_pieces_ = blockwise_slice_pieces(topo_.node_sizes());
  config_.wait_spin = wait_spin_for(ranks_here, usable_cpus());
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
  // it now, not when they next wait for this rank in vain.  Best effort: an
  // exception out of a destructor ends the process (std::terminate), and a
  // group that failed or was aborted has nothing more to tell its peers.
  try {
    leave("dropped it (its last reference went away)");
  } catch (const std::exception& e) {
    FAIRRING_DEBUG_LOG(getRank(), "leaving the group as it was dropped failed: %s", e.what());
  } catch (...) {
    FAIRRING_DEBUG_LOG(getRank(), "leaving the group as it was dropped failed");
  }
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
  // torch's flight recorder: what the op reads and writes, as the pipeline has it.
  std::optional<RecentOps::InTorch> in_torch;
  if (FlightRecord::on()) {
    // Its input blocks, or its buffer; one tensor sent to every rank (an
    // all-gather of unequal blocks) is the one input the caller passed.
    std::vector<at::Tensor> reads = op.input_blocks.empty() ? std::vector<at::Tensor>{op.buffer} : op.input_blocks;
    const auto same_as_first = [&](const at::Tensor& t) {
      return t.data_ptr() == reads[0].data_ptr() && t.numel() == reads[0].numel();
    };
    if (std::all_of(reads.begin(), reads.end(), same_as_first)) reads.resize(1);
    in_torch = in_torch_record(kind, "", std::move(reads),
                               !op.output_blocks.empty()
                                   ? op.output_blocks
                                   : std::vector<at::Tensor>{op.output.defined() ? op.output : op.buffer});
  }
  auto handle = recent->start(op.number, kind, suffix, op.key(), bytes, in_torch ? &*in_torch : nullptr);
  const int rank = getRank();
  FAIRRING_LOG_AT(kLogOps, rank, "#%llu %s%s of %s: issued", static_cast<unsigned long long>(handle.seq), kind, suffix,
                  describe_args(op.key()).c_str());
  // The job's store, to ask every rank to dump too; only when dumps are wanted.
  auto store = FlightRecord::dumps_after_failure() ? store_ : c10::intrusive_ptr<c10d::Store>();
  auto fr = fr_;
  return [recent, hooks, ephemeral, fr, number, handle, rank, kind, suffix, store,
          done = std::move(done)](std::exception_ptr error) {
    ephemeral->op_ended(number);
    const std::string why = error ? error_of(error).what() : "";
    recent->finish(handle, why);
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

RecentOps::InTorch FairringBackend::in_torch_record(const char* name, std::string detail,
                                                    std::vector<at::Tensor> inputs,
                                                    std::vector<at::Tensor> outputs) const {
  RecentOps::InTorch t;
  t.uid = getGroupUid();
  t.desc = getGroupDesc();
  t.name = name;
  t.detail = std::move(detail);
  t.inputs = std::move(inputs);
  t.outputs = std::move(outputs);
  t.timeout = config_.timeout;
  return t;
}

std::string FairringBackend::listen_address() const { return engine_->listen_address(); }

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
  recent_->delegated(number_collective(), kind);
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

}  // namespace fairring
