#include "backend/flight_recorder.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <c10/util/ApproximateClock.h>
#include <c10/util/thread_name.h>
#include <torch/csrc/distributed/c10d/FlightRecorder.hpp>

#include <cstring>
#include <mutex>
#include <thread>

namespace fairring {

using Recorder = c10d::FlightRecorder<c10::Event>;

namespace {

// FlightRecorder<c10::Event>::get()'s `static FlightRecorder* instance`.
constexpr const char* kInstanceSymbol = "_ZZN4c10d14FlightRecorderIN3c105EventEE3getEvE8instance";

struct Found {
  Recorder** slot = nullptr;
  std::string problem;
};

// The address of `kInstanceSymbol` in the loaded library that holds
// `in_library` (libtorch_cpu), read from the library file's symbol table
// (the symbol is local: the dynamic table does not have it).
Found find_slot(const void* in_library) {
  Dl_info info{};
  link_map* map = nullptr;
  if (dladdr1(in_library, &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP) == 0 || map == nullptr ||
      info.dli_fname == nullptr) {
    return {nullptr, "could not tell which library holds torch's flight recorder"};
  }
  const std::string path = info.dli_fname;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {nullptr, "could not open " + path + ": " + std::strerror(errno)};
  struct stat st{};
  if (fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(Elf64_Ehdr))) {
    close(fd);
    return {nullptr, path + " is not a library this build can read"};
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* mem = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (mem == MAP_FAILED) return {nullptr, "could not map " + path + ": " + std::strerror(errno)};
  const auto* base = static_cast<const unsigned char*>(mem);
  auto inside = [&](uint64_t offset, uint64_t bytes) { return offset <= size && bytes <= size - offset; };
  Found out{nullptr, "no symbol " + std::string(kInstanceSymbol) + " in " + path + " (a stripped torch?)"};
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(base);
  if (std::memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
      eh->e_shentsize != sizeof(Elf64_Shdr) || !inside(eh->e_shoff, uint64_t{eh->e_shnum} * sizeof(Elf64_Shdr))) {
    out.problem = path + " is not a 64-bit ELF library";
  } else {
    const auto* sections = reinterpret_cast<const Elf64_Shdr*>(base + eh->e_shoff);
    const size_t name_len = std::strlen(kInstanceSymbol);
    for (int i = 0; i < eh->e_shnum && out.slot == nullptr; ++i) {
      const Elf64_Shdr& symtab = sections[i];
      if (symtab.sh_type != SHT_SYMTAB || symtab.sh_entsize != sizeof(Elf64_Sym) || symtab.sh_link >= eh->e_shnum ||
          !inside(symtab.sh_offset, symtab.sh_size)) {
        continue;
      }
      const Elf64_Shdr& strtab = sections[symtab.sh_link];
      if (!inside(strtab.sh_offset, strtab.sh_size)) continue;
      const auto* syms = reinterpret_cast<const Elf64_Sym*>(base + symtab.sh_offset);
      const char* names = reinterpret_cast<const char*>(base + strtab.sh_offset);
      const size_t count = symtab.sh_size / sizeof(Elf64_Sym);
      for (size_t j = 0; j < count; ++j) {
        const Elf64_Sym& s = syms[j];
        // Only pointer-sized data objects: their names are the only strings read.
        if (ELF64_ST_TYPE(s.st_info) != STT_OBJECT || s.st_size != sizeof(void*) ||
            s.st_name + name_len >= strtab.sh_size) {
          continue;
        }
        if (std::memcmp(names + s.st_name, kInstanceSymbol, name_len + 1) == 0) {
          out.slot = reinterpret_cast<Recorder**>(map->l_addr + s.st_value);
          break;
        }
      }
    }
  }
  munmap(mem, size);
  return out;
}

struct Located {
  Recorder* recorder = nullptr;  // torch's, and on
  std::string problem;
};

const Located& located() {
  static const Located where = [] {
    Located l;
    if (c10d::getCvarInt({"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}, 2000) <= 0) {
      l.problem = "torch's flight recorder is off (TORCH_FR_BUFFER_SIZE=0)";
      return l;
    }
    // Any function of libtorch's that torch exports, to find the library.
    Found f = find_slot(reinterpret_cast<const void*>(&c10d::DebugInfoWriter::getWriter));
    if (f.slot == nullptr) {
      l.problem = f.problem;
      return l;
    }
    // torch makes the recorder at its first use; this is one.
    if (*f.slot == nullptr) (void)c10d::dump_fr_trace(false, false, false);
    Recorder* r = *f.slot;
    // What torch's constructor set, as this build of the header reads it:
    // a check that the object found is the one the header describes.
    if (r == nullptr || !r->enabled_ || r->max_entries_ == 0 || r->entries_.size() > r->max_entries_ ||
        r->next_ >= r->max_entries_) {
      l.problem = std::string("the object at torch's ") + kInstanceSymbol +
                  " does not look like the flight recorder this build was compiled against";
      return l;
    }
    l.recorder = r;
    return l;
  }();
  return where;
}

std::atomic<size_t> groups_made{0};

// The recorder's own record(), retire_id() and record_pg_ranks() are
// templates torch defines in FlightRecorderDetail.hpp, a header an extension
// cannot include (it needs nlohmann/json, which torch does not ship): these
// do the same on the fields FlightRecorder.hpp declares, as gloo calls them
// (no device events).  Templates, so that a field only some torch versions
// have is set where it exists.
template <typename R>
std::pair<size_t, size_t> record_entry(R& r, size_t pg_id, const std::tuple<std::string, std::string>& pg_name,
                                       size_t collective_seq, size_t p2p_seq, size_t op_id, std::string name,
                                       const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                                       std::chrono::milliseconds timeout,
                                       const std::shared_ptr<c10d::ProcessGroupStatus>& status, bool p2p,
                                       std::shared_ptr<torch::CapturedTraceback> traceback) {
  typename R::Entry e{};
  e.pg_id_ = pg_id;
  e.pg_name_ = pg_name;
  e.collective_seq_id_ = collective_seq;
  e.p2p_seq_id_ = p2p_seq;
  e.op_id_ = op_id;
  e.profiling_name_ = std::move(name);
  e.traceback_ = std::move(traceback);
  e.start_ = e.end_ = nullptr;
  e.time_created_ = c10::getTime();
  e.timeout_ms_ = timeout.count();
  if constexpr (requires { e.isP2P_; }) e.isP2P_ = p2p;
  if constexpr (requires { e.thread_id_; }) e.thread_id_ = std::this_thread::get_id();
  if constexpr (requires { e.thread_name_; }) e.thread_name_ = c10::getThreadName();
  for (const at::Tensor& t : inputs) {
    e.input_dtypes_.push_back(t.scalar_type());
    e.input_dims_.push_back(t.dim());
    e.sizes_.insert(e.sizes_.end(), t.sizes().begin(), t.sizes().end());
  }
  for (const at::Tensor& t : outputs) {
    e.output_dtypes_.push_back(t.scalar_type());
    e.output_dims_.push_back(t.dim());
    e.sizes_.insert(e.sizes_.end(), t.sizes().begin(), t.sizes().end());
  }
  std::lock_guard<std::mutex> lock(r.mutex_);
  if constexpr (requires { r.all_pg_status_; }) {
    if (r.all_pg_status_.find(pg_id) == r.all_pg_status_.end()) r.all_pg_status_[pg_id] = status;
  }
  size_t epoch = 0;
  if constexpr (requires {
                  e.reset_epoch_;
                  r.reset_epoch_;
                })
    epoch = e.reset_epoch_ = r.reset_epoch_;
  e.id_ = r.id_;
  const size_t next = r.next_++;
  if (r.entries_.size() < r.max_entries_) {
    r.entries_.emplace_back(std::move(e));
  } else {
    r.entries_[next] = std::move(e);
  }
  if (r.next_ == r.max_entries_) r.next_ = 0;
  return {r.id_++, epoch};
}

// The entry of `id` (recorded in `epoch`), or null once the ring has gone
// round past it or been reset.  Under r.mutex_.
template <typename R>
typename R::Entry* find_entry(R& r, size_t id, size_t epoch) {
  size_t start = 0;
  if constexpr (requires { r.reset_epoch_start_idx_; }) {
    auto it = r.reset_epoch_start_idx_.find(epoch);
    if (it == r.reset_epoch_start_idx_.end()) return nullptr;  // reset since
    start = it->second;
  }
  const size_t idx = (start + id) % r.max_entries_;
  if (idx >= r.entries_.size()) return nullptr;
  auto& e = r.entries_[idx];
  if (e.id_ != id) return nullptr;
  if constexpr (requires { e.reset_epoch_; }) {
    if (e.reset_epoch_ != epoch) return nullptr;
  }
  return &e;
}

// The entry of `id`, if still there: retired, and completed now if `ok`.
template <typename R>
void retire_entry(R& r, size_t id, size_t epoch, bool ok) {
  std::lock_guard<std::mutex> lock(r.mutex_);
  auto* found = find_entry(r, id, epoch);
  if (found == nullptr) return;
  auto& e = *found;
  const auto now = c10::getTime();
  if (!e.time_discovered_started_) e.time_discovered_started_ = e.time_created_;
  if (ok) {
    e.time_discovered_completed_ = now;
    e.duration_ = static_cast<float>(now - e.time_created_) / 1e6f;
  }
  e.retired_ = true;
}

template <typename R>
void record_ranks(R& r, const std::tuple<std::string, std::string>& pg_name, std::vector<uint64_t> ranks) {
  std::lock_guard<std::mutex> lock(r.mutex_);
  r.pg_name_to_ranks_[pg_name] = std::move(ranks);
}

}  // namespace

bool FlightRecord::on() { return located().recorder != nullptr; }

std::string FlightRecord::problem() { return located().problem; }

FlightRecord::FlightRecord(int rank, int size)
    : rank_(rank),
      size_(size),
      pg_id_(groups_made.fetch_add(1)),
      status_(std::make_shared<c10d::ProcessGroupStatus>()) {
  (void)located();  // the search, at the process's first group's creation, not at an op
  ranks_.resize(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) ranks_[static_cast<size_t>(r)] = static_cast<uint64_t>(r);
}

FlightRecord::~FlightRecord() = default;

void FlightRecord::set_global_ranks(std::vector<uint64_t> ranks) {
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<int>(ranks.size()) == size_) {
    ranks_ = std::move(ranks);
    ranks_set_ = true;
  }
  recorded_uid_.reset();  // recorded again with the next op
}

std::vector<uint64_t> FlightRecord::global_ranks() {
  std::lock_guard<std::mutex> lock(mu_);
  return ranks_set_ ? ranks_ : std::vector<uint64_t>{};
}

FlightRecord::Id FlightRecord::issued(const std::string& uid, const std::string& desc, const char* name,
                                      const std::string& detail, bool p2p, const std::vector<at::Tensor>& inputs,
                                      const std::vector<at::Tensor>& outputs, std::chrono::milliseconds timeout) {
  Recorder* r = located().recorder;
  Id out;
  out.name = name;
  // Numbers and status only matter to the recorder (its dump reads them).
  if (r == nullptr) return out;
  // The caller's Python stack where FAIRRING_FR_STACKS=1 asks for it (NCCL
  // takes it always): it is most of the recorder's cost on a small op (2 of
  // 3-4 us on 4 KiB), and the dumps a failure writes leave it out anyway.
  // Taken before mu_: it takes the GIL, which a thread waiting for mu_ may hold.
  static const bool stacks = c10d::getCvarBool({"FAIRRING_FR_STACKS"}, false);
  // An entry must hold a traceback, empty or not: torch's dump reads each.
  auto traceback = torch::CapturedTraceback::gather(stacks, stacks, stacks && r->capture_cpp_stack_);
  std::lock_guard<std::mutex> lock(mu_);
  out.seq = static_cast<int64_t>(++op_id_);
  if (p2p) {
    ++p2p_seq_;
  } else {
    ++collective_seq_;
  }
  {
    std::lock_guard<std::mutex> guard(r->mutex_);  // torch's dump reads the status under it
    status_->lastEnqueuedSeq = out.seq;
    status_->lastEnqueuedWorkName = name;
  }
  const auto pg_name = std::make_tuple(uid, desc);
  if (recorded_uid_ != uid) {
    record_ranks(*r, pg_name, ranks_);
    recorded_uid_ = uid;
  }
  const auto [id, epoch] = record_entry(*r, pg_id_, pg_name, collective_seq_, p2p_seq_, op_id_,
                                        std::string("fairring:") + name + (detail.empty() ? "" : " " + detail), inputs,
                                        outputs, timeout, status_, p2p, std::move(traceback));
  out.id = id;
  out.epoch = epoch;
  return out;
}

void FlightRecord::ended(const Id& id, bool ok) {
  Recorder* r = located().recorder;
  if (r == nullptr || !id.id) return;
  if (ok) {
    std::lock_guard<std::mutex> lock(mu_);
    std::lock_guard<std::mutex> guard(r->mutex_);
    if (id.seq > status_->lastCompletedSeq) {
      status_->lastCompletedSeq = id.seq;
      status_->lastCompletedWorkName = id.name;
    }
  }
  retire_entry(*r, *id.id, id.epoch, ok);
}

std::vector<FlightRecord::Seen> FlightRecord::look(const std::vector<Id>& ids) {
  std::vector<Seen> out(ids.size());
  Recorder* r = located().recorder;
  if (r == nullptr) return out;
  std::lock_guard<std::mutex> lock(r->mutex_);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!ids[i].id) continue;
    const auto* e = find_entry(*r, *ids[i].id, ids[i].epoch);
    if (e == nullptr) continue;
    Seen& s = out[i];
    s.found = true;
    s.retired = e->retired_;
    s.created_ns = e->time_created_;
    if (e->time_discovered_completed_) s.completed_ns = *e->time_discovered_completed_;
  }
  return out;
}

std::string FlightRecord::dump_to_file(int global_rank, bool stack_traces) {
  if (!on()) return "";
  // A failed op's rank dumps as the status listener serves another rank's
  // request to dump: torch's getWriter() makes and registers its writer
  // unguarded, and a second thread's registration frees the first one's
  // writer under it.  Ours take turns.
  static std::mutex dumping;
  std::lock_guard<std::mutex> one_at_a_time(dumping);
  // One writer per process, named after the rank that first asked.
  c10d::DebugInfoWriter& writer = c10d::DebugInfoWriter::getWriter(global_rank);
  writer.write(c10d::dump_fr_trace(true, stack_traces, false));
  return writer.getWriterTarget();
}

bool FlightRecord::dumps_after_failure() {
  static const bool wanted = c10d::getCvarBool({"TORCH_FR_DUMP_ON_TIMEOUT", "TORCH_NCCL_DUMP_ON_TIMEOUT"}, false);
  return wanted;
}

std::string FlightRecord::dump_after_failure() {
  if (!dumps_after_failure()) return "";
  int global = rank_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    global = static_cast<int>(ranks_[static_cast<size_t>(rank_)]);
  }
  return dump_to_file(global, /*stack_traces=*/false);
}

}  // namespace fairring
