#include "transport/shm.h"
#include "common/error.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace fairring {

namespace {
[[noreturn]] void fail(const std::string& what, const std::string& name, int err) {
  throw Error(ErrorKind::kBackend,
              "fairring: " + what + " shared memory segment /dev/shm" + name + ": " + std::strerror(err));
}

void* map(int fd, size_t size, const std::string& name) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) fail("cannot map", name, errno);
  return p;
}
}  // namespace

ShmSegment& ShmSegment::operator=(ShmSegment&& o) noexcept {
  if (this != &o) {
    this->~ShmSegment();
    name_ = std::move(o.name_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    linked_ = std::exchange(o.linked_, false);
  }
  return *this;
}

ShmSegment::~ShmSegment() {
  if (data_ != nullptr) munmap(data_, size_);
  data_ = nullptr;
  unlink();
}

ShmSegment ShmSegment::create(const std::string& name, size_t size) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) fail("cannot create", name, errno);
  ShmSegment s;
  s.name_ = name;
  s.linked_ = true;
  // Reserve the pages now: a /dev/shm too small for the segment is an error
  // here rather than a SIGBUS at first touch.
  int err = posix_fallocate(fd, 0, static_cast<off_t>(size));
  if (err != 0) {
    close(fd);
    shm_unlink(name.c_str());
    fail("cannot allocate " + std::to_string(size) + " bytes (is /dev/shm too small?) for", name, err);
  }
  try {
    s.data_ = map(fd, size, name);
  } catch (...) {
    close(fd);
    shm_unlink(name.c_str());
    throw;
  }
  close(fd);
  s.size_ = size;
  return s;
}

ShmSegment ShmSegment::open(const std::string& name, size_t size) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) fail("cannot open", name, errno);
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != size) {
    close(fd);
    throw Error(ErrorKind::kBackend,
                "fairring: shared memory segment /dev/shm" + name +
                    " does not have the size this rank expects (do the ranks use the same options?)");
  }
  ShmSegment s;
  s.name_ = name;
  s.linked_ = true;  // any holder may remove the name; the first to do so wins
  try {
    s.data_ = map(fd, size, name);
  } catch (...) {
    close(fd);
    throw;
  }
  close(fd);
  s.size_ = size;
  return s;
}

namespace {
// The tag name_for() appends: "-p<pid>".
constexpr const char* kPidTag = "-p";
// A segment younger than this may belong to a group being created in a pid
// namespace we cannot see into: left alone.
constexpr time_t kStaleAfterSeconds = 60;
}  // namespace

std::string ShmSegment::name_for(const std::string& base) { return base + kPidTag + std::to_string(getpid()); }

int ShmSegment::sweep_stale(const std::string& prefix) {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int removed = 0;
  const time_t now = time(nullptr);
  while (struct dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) != 0) continue;
    const size_t tag = name.rfind(kPidTag);
    if (tag == std::string::npos) continue;
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + tag + 2, &end, 10);
    if (pid <= 0 || end == nullptr || *end != '\0') continue;
    struct stat st;
    if (fstatat(dirfd(dir), name.c_str(), &st, 0) != 0) continue;
    if (st.st_uid != geteuid() || now - st.st_mtime < kStaleAfterSeconds) continue;
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // creator alive (or not ours to see)
    if (shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

void ShmSegment::unlink() {
  if (linked_) {
    shm_unlink(name_.c_str());
    linked_ = false;
  }
}

}  // namespace fairring
