// POSIX shared-memory segments for the ranks of one node.
#pragma once

#include <cstddef>
#include <string>

namespace fairring {

class ShmSegment {
 public:
  ShmSegment() = default;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ShmSegment(ShmSegment&& o) noexcept { *this = std::move(o); }
  ShmSegment& operator=(ShmSegment&& o) noexcept;
  ~ShmSegment();

  // Creates a new segment (it must not exist), private to this user (0600).
  static ShmSegment create(const std::string& name, size_t size);
  // Maps a segment another rank created.
  static ShmSegment open(const std::string& name, size_t size);

  // Removes the name; the memory stays mapped until every process unmaps it
  // (or exits), so a crash cannot leak it once this has run.
  void unlink();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  void* data_ = nullptr;
  size_t size_ = 0;
  bool linked_ = false;
};

}  // namespace fairring
