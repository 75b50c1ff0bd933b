// Byte buffers whose resize() leaves the new bytes as they are: staging that
// is always written before it is read.  A std::vector<char> zeroes what it
// grows by, which faults in every page at once: for the rails of a group of
// 16 nodes, about 15 MiB per rank written when the group is created, most of
// it never used by a job of small ops.
#pragma once

#include <memory>
#include <new>
#include <utility>
#include <vector>

namespace fairring {

template <typename T>
struct NoInitAllocator : std::allocator<T> {
  using value_type = T;
  template <typename U>
  struct rebind {
    using other = NoInitAllocator<U>;
  };
  NoInitAllocator() noexcept = default;
  template <typename U>
  NoInitAllocator(const NoInitAllocator<U>&) noexcept {}
  // Value-initialisation (zeroing) becomes default-initialisation (nothing).
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

using RawBytes = std::vector<char, NoInitAllocator<char>>;

}  // namespace fairring
