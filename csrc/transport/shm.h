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

  // The name for a new segment `base`, tagged with the creating process so
  // that sweep_stale() can tell when it is gone.
  static std::string name_for(const std::string& base);
  // Removes names (made by name_for) of this user's segments under
  // /dev/shm/`prefix`* whose creator has exited and that are older than a
  // minute: what a crash during group creation (before every rank mapped the
  // segment and removed its name) leaves behind.  Returns how many.
  static int sweep_stale(const std::string& prefix);

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
