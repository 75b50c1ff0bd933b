// The machine a rank runs on, as the node steps' waits need to know it.
// A simulated node (FAIRRING_NODE_ID) is one of several on a machine, so
// this is not the topology's node.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace fairring {

// Hostname and boot id: the same for every rank of one machine (container).
std::string machine_key();
// CPUs this process may run on (its affinity mask).
int usable_cpus();
// The largest CPU cache of this machine's CPU 0 (the last level, which the
// ranks of a node share), from sysfs as the kernel sees it; 0 if unknown.
// (sysconf's figure comes from cpuid, which a VM may report for the whole
// host: 384 MiB where the guest's L3 is 32 MiB.)
int64_t shared_cache_bytes();
// "32768K", "1M", "512" as sysfs writes cache sizes, in bytes; 0 if malformed.  Pure.
int64_t parse_cache_size(const std::string& text);
// How long a blocking wait on a node peer spins before it sleeps, with
// `ranks_here` ranks of the group sharing `cpus` CPUs.  Pure.
std::chrono::microseconds wait_spin_for(int ranks_here, int cpus);

}  // namespace fairring
