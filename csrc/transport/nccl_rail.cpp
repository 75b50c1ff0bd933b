#ifdef FAIRRING_WITH_CUDA

#include "transport/nccl_rail.h"

#include <dlfcn.h>
#if __has_include(<nccl.h>)
#include <nccl.h>  // only to check the declarations below
#define FAIRRING_HAVE_NCCL_H 1
#endif
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstring>
#include <mutex>
#include <stdexcept>
#include <vector>

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
  if (!fn && error.empty()) error = std::string("libnccl.so.2 has no ") + name;
  return fn != nullptr;
}

const NcclApi& nccl() {
  static NcclApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) lib = dlopen("libnccl.so", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
      const char* why = dlerror();
      api.load_error = std::string("cannot load libnccl.so.2: ") + (why ? why : "not found");
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
                   std::chrono::milliseconds timeout) {
  const NcclApi& api = nccl();
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
