#ifdef FAIRRING_WITH_CUDA

#include "transport/nccl_rail.h"

#include <dlfcn.h>
#if __has_include(<nccl.h>)
#include <nccl.h>  // only to check the declarations below
#define FAIRRING_HAVE_NCCL_H 1
#endif
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/backoff.h"
#include "common/log.h"
#include "common/error.h"

namespace fairring {

namespace {

// The slice of NCCL's C API used here, declared by hand (stable since NCCL
// 2.14): results and data types are C enums (int), the unique id is 128
// opaque bytes, a communicator an opaque pointer.
// settle(): an NCCL call in progress is polled with a back-off, and a
// peer's published failure checked this often.
constexpr auto kSettleNapFirst = std::chrono::microseconds(10);
constexpr auto kSettleNapCap = std::chrono::microseconds(1000);
constexpr auto kInterruptCheckEvery = std::chrono::milliseconds(100);

constexpr int kNcclSuccess = 0;
constexpr int kNcclInProgress = 7;
constexpr int kNcclUint8 = 1;
struct UniqueId {
  char internal[128];
};
// The head of ncclConfig_t as NCCL 2.14 declared it.  Later versions only
// append fields, read `size` bytes of the caller's struct, and take the
// defaults for what a config of an older `version` lacks.  The struct ends
// with cgaClusterSize, declared rather than left as padding: NCCL reads
// those 4 bytes too.
struct CommConfig {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cga_cluster_size;
};
constexpr int kNcclConfigUndefInt = INT_MIN;  // NCCL_CONFIG_UNDEF_INT: NCCL's default
constexpr unsigned int kNcclApiMagic = 0xcafebeef;
constexpr unsigned int kConfigVersion = 21400;  // NCCL_VERSION(2, 14, 0)

#ifdef FAIRRING_HAVE_NCCL_H
// Where NCCL's header is present at build time, check the declarations.
static_assert(kNcclSuccess == ncclSuccess && kNcclInProgress == ncclInProgress && kNcclUint8 == ncclUint8,
              "NCCL enum values changed");
static_assert(sizeof(UniqueId) == sizeof(ncclUniqueId), "NCCL unique id size changed");
static_assert(kNcclApiMagic == NCCL_API_MAGIC, "NCCL config magic changed");
static_assert(offsetof(CommConfig, magic) == offsetof(ncclConfig_t, magic) &&
                  offsetof(CommConfig, version) == offsetof(ncclConfig_t, version) &&
                  offsetof(CommConfig, blocking) == offsetof(ncclConfig_t, blocking) &&
                  offsetof(CommConfig, cga_cluster_size) == offsetof(ncclConfig_t, cgaClusterSize),
              "ncclConfig_t's first fields moved");
static_assert(kNcclConfigUndefInt == NCCL_CONFIG_UNDEF_INT, "NCCL's undefined config value changed");
#endif

struct NcclApi {
  int (*get_unique_id)(UniqueId*) = nullptr;
  int (*comm_init_rank_config)(void**, int, UniqueId, int, CommConfig*) = nullptr;
  int (*comm_get_async_error)(void*, int*) = nullptr;
  int (*comm_finalize)(void*) = nullptr;
  int (*comm_destroy)(void*) = nullptr;
  int (*comm_abort)(void*) = nullptr;
  int (*send)(const void*, size_t, int, int, void*, cudaStream_t) = nullptr;
  int (*recv)(void*, size_t, int, int, void*, cudaStream_t) = nullptr;
  int (*group_start)() = nullptr;
  int (*group_end)() = nullptr;
  const char* (*error_string)(int) = nullptr;
  const char* (*last_error)(void*) = nullptr;  // optional
  std::string load_error;
};

template <typename F>
bool bind(void* lib, const char* name, F& fn, std::string& error) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn && error.empty()) error = std::string("the loaded NCCL library has no ") + name;
  return fn != nullptr;
}

// libnccl.so.2 of torch's pip NVIDIA packages (site-packages/nvidia/nccl/lib),
// found from where torch's own libraries are (site-packages/torch/lib).
std::string torch_pip_nccl() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&c10::cuda::device_count), &info) == 0 || !info.dli_fname) return "";
  std::string path = info.dli_fname;
  for (int up = 0; up < 3; ++up) {  // libc10_cuda.so -> lib -> torch -> site-packages
    const size_t slash = path.rfind('/');
    if (slash == std::string::npos) return "";
    path.resize(slash);
  }
  return path + "/nvidia/nccl/lib/libnccl.so.2";
}

// The NCCL torch uses if it has loaded one; else the one of torch's pip
// packages; else whatever the loader finds.
void* open_nccl(std::string& tried) {
  if (void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD)) return lib;
  const std::string pip = torch_pip_nccl();
  for (const std::string& name : {pip, std::string("libnccl.so.2"), std::string("libnccl.so")}) {
    if (name.empty()) continue;
    if (void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_GLOBAL)) return lib;
    const char* why = dlerror();
    tried += (tried.empty() ? "" : "; ") + std::string(why ? why : name + ": not found");
  }
  return nullptr;
}

const NcclApi& nccl(int rank = -1) {
  static NcclApi api;
  static std::once_flag once;
  std::call_once(once, [rank] {
    std::string tried;
    void* lib = open_nccl(tried);
    if (!lib) {
      api.load_error = "cannot load NCCL (" + tried + ")";
      return;
    }
    std::string& e = api.load_error;
    bind(lib, "ncclGetUniqueId", api.get_unique_id, e);
    bind(lib, "ncclCommInitRankConfig", api.comm_init_rank_config, e);
    bind(lib, "ncclCommGetAsyncError", api.comm_get_async_error, e);
    bind(lib, "ncclCommFinalize", api.comm_finalize, e);
    bind(lib, "ncclCommDestroy", api.comm_destroy, e);
    bind(lib, "ncclCommAbort", api.comm_abort, e);
    bind(lib, "ncclSend", api.send, e);
    bind(lib, "ncclRecv", api.recv, e);
    bind(lib, "ncclGroupStart", api.group_start, e);
    bind(lib, "ncclGroupEnd", api.group_end, e);
    bind(lib, "ncclGetErrorString", api.error_string, e);
    if (!e.empty()) e += " (Fairring needs NCCL 2.14 or newer)";
    api.last_error = reinterpret_cast<const char* (*)(void*)>(dlsym(lib, "ncclGetLastError"));
    Dl_info info;
    const bool found = api.get_unique_id && dladdr(reinterpret_cast<void*>(api.get_unique_id), &info) != 0;
    FAIRRING_DEBUG_LOG(rank, "FAIRRING_GPU_TRANSPORT=nccl: using %s",
                       found && info.dli_fname ? info.dli_fname : "libnccl.so.2 (path unknown)");
  });
  if (!api.load_error.empty()) {
    throw Error(ErrorKind::kBackend, "fairring: FAIRRING_GPU_TRANSPORT=nccl: " + api.load_error +
                                         " (install NCCL, or use FAIRRING_GPU_TRANSPORT=tcp)");
  }
  return api;
}

// NCCL's name for `result`, and its last error message where it has one.
std::string describe(int result, void* comm) {
  std::string d = nccl().error_string(result);
  const char* last = nccl().last_error ? nccl().last_error(comm) : nullptr;
  if (last && *last) d += std::string(" (") + last + ")";
  return d;
}

void check(int result, const char* what, void* comm = nullptr) {
  if (result != kNcclSuccess && result != kNcclInProgress) {
    throw Error(ErrorKind::kBackend, std::string("fairring: NCCL ") + what + " failed: " + describe(result, comm));
  }
}

}  // namespace

std::string nccl_environment_refusal(const char* comm_blocking) {
  if (!comm_blocking || !*comm_blocking) return "";
  // As NCCL reads its parameters (strtoll, base 0, the rest of the text
  // ignored); it applies 0 or 1 over the config and ignores other values.
  if (std::strtoll(comm_blocking, nullptr, 0) != 1) return "";
  return std::string(
             "fairring: FAIRRING_GPU_TRANSPORT=nccl needs a non-blocking NCCL communicator, but "
             "NCCL_COMM_BLOCKING=") +
         comm_blocking +
         " is set in the environment, and NCCL applies it over Fairring's config: its calls would then block "
         "without the group's timeout (a dead rail peer would hang this rank). Unset NCCL_COMM_BLOCKING (or set "
         "it to 0) for this process, or use FAIRRING_GPU_TRANSPORT=tcp.";
}

NcclRail::NcclRail(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key, int size, int index,
                   std::chrono::milliseconds timeout, int rank, std::function<void()> interrupted)
    : rank_(rank), timeout_(timeout) {
  const std::string refusal = nccl_environment_refusal(std::getenv("NCCL_COMM_BLOCKING"));
  if (!refusal.empty()) throw Error(ErrorKind::kInvalidArgument, refusal);
  const NcclApi& api = nccl(rank);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  UniqueId id;
  if (index == 0) {
    check(api.get_unique_id(&id), "ncclGetUniqueId");
    store->set(key,
               std::vector<uint8_t>(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof(id)));
  } else {
    store->wait({key}, timeout);
    const std::vector<uint8_t> raw = store->get(key);
    if (raw.size() != sizeof(id)) throw Error(ErrorKind::kBackend, "fairring: malformed NCCL unique id in the store");
    std::memcpy(&id, raw.data(), sizeof(id));
  }
  // Zeroed first, then every field set: NCCL copies `size` bytes of it.
  CommConfig config;
  std::memset(&config, 0, sizeof(config));
  config.size = sizeof(CommConfig);
  config.magic = kNcclApiMagic;
  config.version = kConfigVersion;
  config.blocking = 0;
  config.cga_cluster_size = kNcclConfigUndefInt;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const int r = api.comm_init_rank_config(&comm_, size, id, index, &config);
    if (r != kNcclSuccess && r != kNcclInProgress) {
      const std::string why = describe(r, comm_);
      if (comm_) api.comm_abort(comm_);
      comm_ = nullptr;
      throw Error(ErrorKind::kBackend, "fairring: NCCL ncclCommInitRankConfig failed: " + why);
    }
  }
  try {
    settle("ncclCommInitRankConfig (the rail's peers joining its communicator)", deadline, interrupted);
  } catch (...) {
    abort();
    throw;
  }
}

NcclRail::~NcclRail() {
  if (!comm_) return;  // aborted
  if (abort_on_destroy_) {
    abort();
    return;
  }
  // Finalize (flushes what is left, waits for nothing but NCCL's own
  // teardown), bounded; a communicator that does not get there is aborted.
  try {
    check(nccl().comm_finalize(comm_), "ncclCommFinalize", comm_);
    settle("ncclCommFinalize", std::chrono::steady_clock::now() + timeout_);
  } catch (const std::exception& e) {
    FAIRRING_LOG(rank_, "NCCL rail teardown: %s; aborting its communicator", e.what());
    abort();
    return;
  }
  const int r = nccl().comm_destroy(comm_);
  if (r != kNcclSuccess) FAIRRING_LOG(rank_, "NCCL rail teardown: ncclCommDestroy: %s", describe(r, comm_).c_str());
  comm_ = nullptr;
}

void NcclRail::check_live(const char* what) const {
  if (!comm_) {
    throw Error(ErrorKind::kBackend,
                std::string("fairring: NCCL ") + what + ": the rail's communicator was aborted (the group failed)");
  }
}

void NcclRail::settle(const char* what, std::chrono::steady_clock::time_point deadline,
                      const std::function<void()>& interrupted) {
  Backoff pause(kSettleNapFirst, kSettleNapCap);
  auto next_interrupt_check = std::chrono::steady_clock::now();
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      check_live(what);
      int state = kNcclInProgress;
      check(nccl().comm_get_async_error(comm_, &state), "ncclCommGetAsyncError", comm_);
      if (state == kNcclSuccess) return;
      if (state != kNcclInProgress) {
        throw Error(ErrorKind::kBackend, std::string("fairring: NCCL ") + what + " failed: " + describe(state, comm_));
      }
    }
    const auto now = std::chrono::steady_clock::now();
    if (now > deadline) {
      throw Error(ErrorKind::kBackend, std::string("fairring: Timed out: NCCL ") + what + " did not finish within " +
                                           std::to_string(timeout_.count()) + " ms (is a rail peer stalled or gone?)");
    }
    if (interrupted && now >= next_interrupt_check) {
      next_interrupt_check = now + kInterruptCheckEvery;
      interrupted();
    }
    pause.sleep();
  }
}

void NcclRail::group_start() {
  group_lock_.lock();
  if (!comm_) {
    group_lock_.unlock();
    throw Error(ErrorKind::kBackend,
                "fairring: NCCL rail exchange: the rail's communicator was aborted (the group failed)");
  }
  const int r = nccl().group_start();
  if (r != kNcclSuccess) {
    group_lock_.unlock();
    check(r, "ncclGroupStart");
  }
}

void NcclRail::check_in_group(int result, const char* what) {
  if (result == kNcclSuccess || result == kNcclInProgress) return;
  (void)nccl().group_end();  // close the group this thread opened
  group_lock_.unlock();
  check(result, what, comm_);
}

void NcclRail::group_end() {
  if (!group_lock_.owns_lock()) throw Error(ErrorKind::kBackend, "fairring: NCCL group_end() without group_start()");
  const int r = nccl().group_end();
  group_lock_.unlock();
  check(r, "ncclGroupEnd (a rail exchange)");
  if (r == kNcclInProgress) {
    settle("ncclGroupEnd (a rail exchange)", std::chrono::steady_clock::now() + timeout_);
  }
}

void NcclRail::send(const void* buf, size_t bytes, int peer, cudaStream_t stream) {
  if (!group_lock_.owns_lock())
    throw Error(ErrorKind::kBackend, "fairring: NCCL send outside group_start()/group_end()");
  check_in_group(nccl().send(buf, bytes, kNcclUint8, peer, comm_, stream), "ncclSend");
}

void NcclRail::recv(void* buf, size_t bytes, int peer, cudaStream_t stream) {
  if (!group_lock_.owns_lock())
    throw Error(ErrorKind::kBackend, "fairring: NCCL recv outside group_start()/group_end()");
  check_in_group(nccl().recv(buf, bytes, kNcclUint8, peer, comm_, stream), "ncclRecv");
}

std::string NcclRail::async_error() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!comm_) return "";
  int state = kNcclSuccess;
  const int r = nccl().comm_get_async_error(comm_, &state);
  if (r != kNcclSuccess) return std::string("ncclCommGetAsyncError failed: ") + describe(r, comm_);
  if (state == kNcclSuccess || state == kNcclInProgress) return "";
  return describe(state, comm_);
}

void NcclRail::abort() {
  std::lock_guard<std::mutex> lock(mu_);  // an exchange being enqueued is quick: nothing in it waits
  if (!comm_) return;
  const int r = nccl().comm_abort(comm_);
  if (r != kNcclSuccess) FAIRRING_LOG(rank_, "NCCL rail: ncclCommAbort: %s", nccl().error_string(r));
  comm_ = nullptr;
}

}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
