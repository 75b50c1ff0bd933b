// Fresh memory.  Trainers pass outputs that are new each step (FSDP and ZeRO
// allocate their all-gather output with torch.empty), and a large
// torch.empty is anonymous memory that the kernel maps in at its first
// write: one page fault per 4 KiB page, paid by whoever writes it first (a
// collective's gather step, after the wait for its peers).  With the
// machine's transparent huge pages in "madvise" mode, advising the range
// makes that one fault per 2 MiB page, several times cheaper.
#pragma once

#include <cstdint>

namespace fairring {

// The machine's transparent-huge-page mode, read once: "always",
// "madvise", "never", or "unknown" (no THP support).
const char* thp_mode();

// Advises huge pages (MADV_HUGEPAGE) for the 2 MiB-aligned interior of
// [p, p + bytes), if it holds at least one huge page, THP is in "madvise"
// mode, and the interior's first page is not resident yet (a warm buffer,
// mapped already, is left as it is).  Changes no byte and never fails: a
// refusal is ignored.  Returns the bytes advised (0 if none).
int64_t advise_fresh_memory(void* p, int64_t bytes);

}  // namespace fairring
