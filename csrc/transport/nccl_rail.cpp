#ifdef FAIRRING_WITH_CUDA

#include "transport/nccl_rail.h"

#include <dlfcn.h>
#if __has_include(<nccl.h>)
#include <nccl.h>  // only to check the declarations below
#define FAIRRING_HAVE_NCCL_H 1
#endif
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstring>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "common/log.h"

namespace fairring {

namespace {

// The slice of NCCL's C API used here, declared by hand (it has been stable
// since NCCL 2.7): results and data types are C enums (int), the unique id is
// 128 opaque bytes, a communicator an opaque pointer.
constexpr int kNcclSuccess = 0;
constexpr int kNcclUint8 = 1;
struct UniqueId {
  char internal[128];
};

#ifdef FAIRRING_HAVE_NCCL_H
// Where NCCL's header is present at build time, check the declarations.
static_assert(kNcclSuccess == ncclSuccess && kNcclUint8 == ncclUint8, "NCCL enum values changed");
static_assert(sizeof(UniqueId) == sizeof(ncclUniqueId), "NCCL unique id size changed");
#endif

struct NcclApi {
  int (*get_unique_id)(UniqueId*) = nullptr;
  int (*comm_init_rank)(void**, int, UniqueId, int) = nullptr;
  int (*comm_destroy)(void*) = nullptr;
  int (*comm_abort)(void*) = nullptr;
  int (*send)(const void*, size_t, int, int, void*, cudaStream_t) = nullptr;
  int (*recv)(void*, size_t, int, int, void*, cudaStream_t) = nullptr;
  int (*group_start)() = nullptr;
  int (*group_end)() = nullptr;
  const char* (*error_string)(int) = nullptr;
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
    bind(lib, "ncclCommInitRank", api.comm_init_rank, e);
    bind(lib, "ncclCommDestroy", api.comm_destroy, e);
    bind(lib, "ncclCommAbort", api.comm_abort, e);
    bind(lib, "ncclSend", api.send, e);
    bind(lib, "ncclRecv", api.recv, e);
    bind(lib, "ncclGroupStart", api.group_start, e);
    bind(lib, "ncclGroupEnd", api.group_end, e);
    bind(lib, "ncclGetErrorString", api.error_string, e);
    Dl_info info;
    const bool found = api.get_unique_id && dladdr(reinterpret_cast<void*>(api.get_unique_id), &info) != 0;
    FAIRRING_DEBUG_LOG(rank, "FAIRRING_GPU_TRANSPORT=nccl: using %s",
                       found && info.dli_fname ? info.dli_fname : "libnccl.so.2 (path unknown)");
  });
  if (!api.load_error.empty()) {
    throw std::runtime_error("fairring: FAIRRING_GPU_TRANSPORT=nccl: " + api.load_error +
                             " (install NCCL, or use FAIRRING_GPU_TRANSPORT=tcp)");
  }
  return api;
}

void check(int result, const char* what) {
  if (result != kNcclSuccess) {
    throw std::runtime_error(std::string("fairring: NCCL ") + what + " failed: " + nccl().error_string(result));
  }
}

}  // namespace

NcclRail::NcclRail(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key, int size, int index,
                   std::chrono::milliseconds timeout, int rank) {
  const NcclApi& api = nccl(rank);
  UniqueId id;
  if (index == 0) {
    check(api.get_unique_id(&id), "ncclGetUniqueId");
    store->set(key, std::vector<uint8_t>(reinterpret_cast<uint8_t*>(&id), reinterpret_cast<uint8_t*>(&id) + sizeof(id)));
  } else {
    store->wait({key}, timeout);
    const std::vector<uint8_t> raw = store->get(key);
    if (raw.size() != sizeof(id)) throw std::runtime_error("fairring: malformed NCCL unique id in the store");
    std::memcpy(&id, raw.data(), sizeof(id));
  }
  check(api.comm_init_rank(&comm_, size, id, index), "ncclCommInitRank");
}

NcclRail::~NcclRail() {
  if (!comm_) return;
  if (abort_) {
    nccl().comm_abort(comm_);
  } else {
    nccl().comm_destroy(comm_);
  }
}

void NcclRail::group_start() { check(nccl().group_start(), "ncclGroupStart"); }
void NcclRail::group_end() { check(nccl().group_end(), "ncclGroupEnd"); }

void NcclRail::send(const void* buf, size_t bytes, int peer, cudaStream_t stream) {
  check(nccl().send(buf, bytes, kNcclUint8, peer, comm_, stream), "ncclSend");
}

void NcclRail::recv(void* buf, size_t bytes, int peer, cudaStream_t stream) {
  check(nccl().recv(buf, bytes, kNcclUint8, peer, comm_, stream), "ncclRecv");
}

}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
