#include "backend/reconfigurable.h"

#ifdef C10D_BACKEND_HAS_RECONFIGURE

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <cstdio>
#include <random>
#include <unordered_set>
#include <utility>
#include <variant>

#include "common/gil.h"

namespace fairring {
namespace {

constexpr const char* kPrefix = "fairring:";

std::string random_token() {
  std::random_device rd;
  const uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// host:port of the TCPStore under `store` (through prefixes), or "" if it
// is another kind of store: what tells one job's handles from another's.
std::string store_address(const c10::intrusive_ptr<c10d::Store>& store) {
  c10::intrusive_ptr<c10d::Store> s = store;
  if (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(s.get())) s = prefixed->getUnderlyingNonPrefixStore();
  if (auto* tcp = dynamic_cast<c10d::TCPStore*>(s.get())) {
    return tcp->getHost() + ":" + std::to_string(tcp->getPort());
  }
  return "";
}

struct Handle {
  std::string token;
  std::string store_address;
};

Handle parse(const c10d::ReconfigureHandle& h) {
  // fairring:<rank>:<uuid>:<token>:<store address (itself host:port)>
  std::vector<size_t> colons;
  for (size_t at = h.find(':'); at != std::string::npos && colons.size() < 4; at = h.find(':', at + 1)) {
    colons.push_back(at);
  }
  TORCH_CHECK_VALUE(h.rfind(kPrefix, 0) == 0 && colons.size() == 4, "fairring: reconfigure: '", h,
                    "' is not a Fairring reconfigure handle (get_reconfigure_handle() of a group created with "
                    "enable_reconfigure=True gives one)");
  return {h.substr(colons[2] + 1, colons[3] - colons[2] - 1), h.substr(colons[3] + 1)};
}

std::string digest(const std::vector<c10d::ReconfigureHandle>& handles) {
  std::string all;
  for (const auto& h : handles) all += h + "\n";
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016zx", std::hash<std::string>{}(all));
  return buf;
}

c10::intrusive_ptr<c10d::Work> completed_work() {
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                         std::vector<c10::Device>{});
  future->markCompleted(c10::IValue(std::vector<at::Tensor>()));
  return c10d::Work::create_from_future(future);
}

}  // namespace

ReconfigurableBackend::ReconfigurableBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                             std::chrono::milliseconds timeout, FairringBackend::ChildFactory make)
    : c10d::Backend(rank, size),
      store_(store),
      make_(std::move(make)),
      token_(random_token()),
      store_address_(store_address(store)),
      timeout_(timeout) {}

c10d::ReconfigureHandle ReconfigurableBackend::get_reconfigure_handle() const {
  std::lock_guard<std::mutex> lock(mu_);
  // The rank first, zero-padded: a set of handles sorts in the order of the
  // ranks they had, so the ranks that stay keep their order.
  char rank[16];
  std::snprintf(rank, sizeof rank, "%08d", getRank());
  return std::string(kPrefix) + rank + ":" + std::to_string(uuid_) + ":" + token_ + ":" + store_address_;
}

c10::intrusive_ptr<c10d::Work> ReconfigurableBackend::reconfigure(const c10d::ReconfigureOptions& opts) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    TORCH_CHECK_VALUE(!used_uuids_.count(opts.uuid), "fairring: reconfigure: uuid ", opts.uuid,
                      " was used before by this group; each reconfigure needs a fresh uuid");
  }
  std::vector<c10d::ReconfigureHandle> handles;
  std::visit([&](const auto& given) { handles.assign(given.begin(), given.end()); }, opts.handles);
  if (std::holds_alternative<std::unordered_set<c10d::ReconfigureHandle>>(opts.handles)) {
    std::sort(handles.begin(), handles.end());
  }
  TORCH_CHECK_VALUE(!handles.empty(), "fairring: reconfigure with no handle: a group needs at least one member");
  TORCH_CHECK_VALUE(
      std::unordered_set<c10d::ReconfigureHandle>(handles.begin(), handles.end()).size() == handles.size(),
      "fairring: reconfigure: a handle is listed twice");
  const c10d::ReconfigureHandle mine = get_reconfigure_handle();
  int new_rank = -1;
  for (size_t i = 0; i < handles.size(); ++i) {
    const Handle h = parse(handles[i]);
    TORCH_CHECK_VALUE(store_address_.empty() || h.store_address.empty() || h.store_address == store_address_,
                      "fairring: reconfigure: handle '", handles[i], "' is of another job (its store is ",
                      h.store_address, ", this group's ", store_address_, ")");
    if (handles[i] == mine) new_rank = static_cast<int>(i);
  }
  TORCH_CHECK_VALUE(new_rank >= 0, "fairring: reconfigure: this rank's handle (", mine,
                    ") is not among the handles: only the new group's members call reconfigure, each with the "
                    "handle it has now (get_reconfigure_handle() changes with every reconfigure)");
  {
    // Spent from here on, even if this reconfigure fails: a retry's
    // rendezvous must not meet what the failed one left in the store.
    std::lock_guard<std::mutex> lock(mu_);
    used_uuids_.insert(opts.uuid);
  }
  const auto timeout = opts.timeout.value_or(timeout_);
  const int new_size = static_cast<int>(handles.size());
  c10::intrusive_ptr<FairringBackend> next;
  {
    GilReleaseIfHeld no_gil;
    // The uuid names the members' corner of the store.  Every member claims
    // it for this set of handles: a uuid used before by another set fails on
    // every member at once (none waits for a rendezvous that cannot happen).
    const std::string root = "fairring-reconfigure/" + std::to_string(opts.uuid) + "/";
    const std::string ours = digest(handles);
    const auto claimed = store_->compareSet(root + "claimed", {}, std::vector<uint8_t>(ours.begin(), ours.end()));
    TORCH_CHECK_VALUE(std::string(claimed.begin(), claimed.end()) == ours, "fairring: reconfigure: uuid ", opts.uuid,
                      " was already used by another reconfigure of this job; each reconfigure needs a fresh uuid");
    auto store = c10::make_intrusive<c10d::PrefixStore>(root + ours + "/", store_);
    auto made = make_(store, new_rank, new_size, timeout);
    next = c10::dynamic_intrusive_pointer_cast<FairringBackend>(made);
    TORCH_CHECK(next, "fairring: reconfigure: the group factory did not make a FairringBackend");
  }
  if (timeout != timeout_) next->setTimeout(timeout_);
  for (auto& [id, hook] : hooks_.list()) next->abort_hooks().add(id, hook);
  c10::intrusive_ptr<FairringBackend> before;
  {
    std::lock_guard<std::mutex> lock(mu_);
    before = std::exchange(current_, next);
    uuid_ = opts.uuid;
    rank_ = new_rank;
    size_ = new_size;
  }
  if (before) {
    before->retire("rank " + std::to_string(before->getRank()) + ": this process group was reconfigured (uuid " +
                   std::to_string(opts.uuid) + ")");
  }
  return completed_work();
}

c10::intrusive_ptr<FairringBackend> ReconfigurableBackend::current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

c10::intrusive_ptr<FairringBackend> ReconfigurableBackend::members(const char* what) const {
  auto now = current();
  TORCH_CHECK(now, "fairring: ", what,
              " on a process group created with enable_reconfigure=True before its first reconfigure: it has no "
              "members yet (torch.distributed._reconfigure(uuid, handles) gives it its members)");
  return now;
}

void ReconfigurableBackend::registerAbortHook(int64_t hook_id, c10d::AbortHook hook) {
  hooks_.add(hook_id, hook);
  if (auto now = current()) now->abort_hooks().add(hook_id, std::move(hook));
}

void ReconfigurableBackend::unregisterAbortHook(int64_t hook_id) {
  hooks_.remove(hook_id);
  if (auto now = current()) now->abort_hooks().remove(hook_id);
}

void ReconfigurableBackend::abort() {
  if (auto now = current()) {
    now->abort();
  } else {
    hooks_.run_once(getRank());
  }
}

void ReconfigurableBackend::shutdown() {
  if (auto now = current()) now->shutdown();
}

void ReconfigurableBackend::setTimeout(std::chrono::milliseconds timeout) {
  TORCH_CHECK_VALUE(timeout.count() > 0, "fairring: set_timeout(", timeout.count(),
                    " ms): a process group's timeout must be positive");
  {
    std::lock_guard<std::mutex> lock(mu_);
    timeout_ = timeout;
  }
  if (auto now = current()) now->setTimeout(timeout);
}

void ReconfigurableBackend::addEphemeralTimeout(const std::chrono::milliseconds& timeout) {
  members("add_ephemeral_timeout")->addEphemeralTimeout(timeout);
}

c10d::ErrorType ReconfigurableBackend::getError() {
  auto now = current();
  return now ? now->getError() : c10d::ErrorType::SUCCESS;
}

c10::intrusive_ptr<c10d::Backend::Options> ReconfigurableBackend::getBackendOptions() {
  std::lock_guard<std::mutex> lock(mu_);
  auto opts = c10::make_intrusive<Options>(getBackendName(), timeout_);
  opts->enable_reconfigure = true;
  return opts;
}

c10::intrusive_ptr<c10d::Backend> ReconfigurableBackend::shrink(const std::vector<int64_t>& ranks_to_exclude,
                                                                int shrink_flags,
                                                                const c10::intrusive_ptr<Options>& opts_override) {
  return members("shrink")->shrink(ranks_to_exclude, shrink_flags, opts_override);
}

c10::intrusive_ptr<c10d::Backend> ReconfigurableBackend::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                               const std::vector<int>& ranks,
                                                               const c10::intrusive_ptr<Options>& opts) {
  return members("split")->split(store, ranks, opts);
}

uint64_t ReconfigurableBackend::getSequenceNumberForGroup() {
  auto now = current();
  return now ? now->getSequenceNumberForGroup() : 0;
}

// Every op goes to the current members' group.
#define FAIRRING_FORWARD(name, params, args) \
  c10::intrusive_ptr<c10d::Work> ReconfigurableBackend::name params { return members(#name)->name args; }
FAIRRING_RECONFIGURABLE_OPS(FAIRRING_FORWARD)
#undef FAIRRING_FORWARD

void ReconfigurableBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  members("monitored_barrier")->monitoredBarrier(opts, wait_all_ranks);
}

}  // namespace fairring

#endif  // C10D_BACKEND_HAS_RECONFIGURE
