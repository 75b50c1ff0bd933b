#ifdef FAIRRING_WITH_CUDA

#include "transport/cuda_ipc.h"
#include "common/error.h"

#include <cuda_runtime.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cstring>
#include <stdexcept>

namespace fairring {

namespace {

template <typename Handle>
std::vector<uint8_t> to_bytes(const Handle& h) {
  std::vector<uint8_t> out(sizeof(Handle));
  std::memcpy(out.data(), &h, sizeof(Handle));
  return out;
}

template <typename Handle>
Handle from_bytes(const std::vector<uint8_t>& raw, const std::string& what) {
  if (raw.size() != sizeof(Handle)) {
    throw Error(ErrorKind::kBackend,
                "fairring: malformed " + what + " in the store (" + std::to_string(raw.size()) + " bytes)");
  }
  Handle h;
  std::memcpy(&h, raw.data(), sizeof(Handle));
  return h;
}

int current_device() {
  int d = -1;
  cuda_check(cudaGetDevice(&d), "cudaGetDevice");
  return d;
}

}  // namespace

SharedDeviceMemory::SharedDeviceMemory(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key,
                                       const std::vector<int>& local_ranks, int me, size_t bytes,
                                       std::chrono::milliseconds timeout)
    : bases_(local_ranks.size(), nullptr), me_(me), rank_(local_ranks[me]) {
  void* mine = nullptr;
  cuda_check(cudaMalloc(&mine, bytes), "cannot allocate " + std::to_string(bytes) +
                                           " bytes of CUDA staging memory (FAIRRING_TOTAL_MEMORY bounds it)");
  bases_[me] = static_cast<char*>(mine);
  const int device = current_device();
  try {
    cudaIpcMemHandle_t handle;
    cuda_check(cudaIpcGetMemHandle(&handle, mine), "cudaIpcGetMemHandle");
    // The handle, then our device index (for error messages).
    std::vector<uint8_t> blob(sizeof(handle) + 4);
    const int32_t dev = device;
    std::memcpy(blob.data(), &handle, sizeof(handle));
    std::memcpy(blob.data() + sizeof(handle), &dev, 4);
    store->set(key + "/" + std::to_string(local_ranks[me]), blob);
    for (size_t x = 0; x < local_ranks.size(); ++x) {
      if (static_cast<int>(x) == me) continue;
      const std::string k = key + "/" + std::to_string(local_ranks[x]);
      store->wait({k}, timeout);
      std::vector<uint8_t> raw = store->get(k);
      if (raw.size() != sizeof(cudaIpcMemHandle_t) + 4) {
        throw Error(ErrorKind::kBackend,
                    "fairring: malformed CUDA memory handle of rank " + std::to_string(local_ranks[x]));
      }
      int32_t peer_dev = 0;
      std::memcpy(&peer_dev, raw.data() + sizeof(cudaIpcMemHandle_t), 4);
      raw.resize(sizeof(cudaIpcMemHandle_t));
      auto h = from_bytes<cudaIpcMemHandle_t>(raw, "CUDA memory handle");
      void* p = nullptr;
      cuda_check(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess),
                 "rank " + std::to_string(local_ranks[me]) + " (cuda:" + std::to_string(device) +
                     ") cannot map the CUDA staging memory of rank " + std::to_string(local_ranks[x]) +
                     " (cuda:" + std::to_string(peer_dev) +
                     "); the GPUs of a node must be able to access each other's "
                     "memory (peer access / NVLink, or the same GPU)");
      bases_[x] = static_cast<char*>(p);
    }
  } catch (...) {
    // Peers may have mapped ours already: it is left to the process's exit.
    close_peers();
    throw;
  }
}

void SharedDeviceMemory::close_peers() {
  for (size_t x = 0; x < bases_.size(); ++x) {
    if (static_cast<int>(x) == me_ || !bases_[x]) continue;
    cuda_ok_or_log(cudaIpcCloseMemHandle(bases_[x]), rank_, "cudaIpcCloseMemHandle");
    bases_[x] = nullptr;
  }
}

SharedDeviceMemory::~SharedDeviceMemory() {
  close_peers();
  if (bases_[me_]) cuda_ok_or_log(cudaFree(bases_[me_]), rank_, "cudaFree (CUDA staging memory)");
}

SharedEvents::SharedEvents(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key,
                           const std::vector<int>& local_ranks, int me, int count, std::chrono::milliseconds timeout)
    : events_(local_ranks.size() * static_cast<size_t>(count), nullptr),
      count_(count),
      me_(me),
      rank_(local_ranks[me]) {
  try {
    std::vector<uint8_t> blob;
    for (int i = 0; i < count; ++i) {
      cudaEvent_t ev = nullptr;
      cuda_check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess),
                 "cannot create an interprocess CUDA event");
      events_[static_cast<size_t>(me) * count + i] = ev;
      cudaIpcEventHandle_t h;
      cuda_check(cudaIpcGetEventHandle(&h, ev), "cudaIpcGetEventHandle");
      auto b = to_bytes(h);
      blob.insert(blob.end(), b.begin(), b.end());
    }
    store->set(key + "/" + std::to_string(local_ranks[me]), blob);
    for (size_t x = 0; x < local_ranks.size(); ++x) {
      if (static_cast<int>(x) == me) continue;
      const std::string k = key + "/" + std::to_string(local_ranks[x]);
      store->wait({k}, timeout);
      const std::vector<uint8_t> raw = store->get(k);
      if (raw.size() != sizeof(cudaIpcEventHandle_t) * count) {
        throw Error(ErrorKind::kBackend,
                    "fairring: malformed CUDA event handles of rank " + std::to_string(local_ranks[x]));
      }
      for (int i = 0; i < count; ++i) {
        std::vector<uint8_t> one(raw.begin() + i * sizeof(cudaIpcEventHandle_t),
                                 raw.begin() + (i + 1) * sizeof(cudaIpcEventHandle_t));
        cudaEvent_t ev = nullptr;
        cuda_check(cudaIpcOpenEventHandle(&ev, from_bytes<cudaIpcEventHandle_t>(one, "CUDA event handle")),
                   "cannot open a CUDA event of rank " + std::to_string(local_ranks[x]));
        events_[x * count + i] = ev;
      }
    }
  } catch (...) {
    // Peers may have opened ours already: they are left to the process's exit.
    close_peers();
    throw;
  }
}

void SharedEvents::close_peers() {
  for (size_t i = 0; i < events_.size(); ++i) {
    if (static_cast<int>(i / count_) == me_ || !events_[i]) continue;
    cuda_ok_or_log(cudaEventDestroy(events_[i]), rank_, "cudaEventDestroy (a peer's IPC event)");
    events_[i] = nullptr;
  }
}

void SharedEvents::leak_own() {
  for (int i = 0; i < count_; ++i) events_[static_cast<size_t>(me_) * count_ + i] = nullptr;
}

SharedEvents::~SharedEvents() {
  close_peers();
  for (cudaEvent_t ev : events_) {
    if (ev) cuda_ok_or_log(cudaEventDestroy(ev), rank_, "cudaEventDestroy (an IPC event)");
  }
}

}  // namespace fairring

#endif  // FAIRRING_WITH_CUDA
