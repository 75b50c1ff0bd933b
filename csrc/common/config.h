// Options of one Fairring process group, already validated by the Python side
// (fairring_py/options.py) and checked again here where it matters.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace fairring {

struct Config {
  int64_t slice_size = 1 << 20;      // bytes per pipelined slice
  int64_t total_memory = 64 << 20;   // staging bytes per rank (upper bound)
  int parallelism = 4;               // slices in flight (pipeline depth)
  std::string socket_ifname;         // "" = address of the hostname
  std::string gpu_transport = "tcp"; // CUDA all-reduce between nodes: "tcp" or "nccl"
  std::chrono::milliseconds timeout{30 * 60 * 1000};
};

}  // namespace fairring
