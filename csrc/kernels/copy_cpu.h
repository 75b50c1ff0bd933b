// Copies for the CPU data path.
#pragma once

#include <cstddef>

namespace fairring {

// memcpy into memory that nobody will read again soon (the caller's tensor at
// the end of a large all-reduce).  Non-temporal stores skip the read for
// ownership of every destination line, which nearly halves the memory traffic
// of the copy, and leave the cache to the staging areas.  Ends with a store
// fence, so a counter published afterwards is seen after the data.
void copy_streaming(void* dst, const void* src, size_t bytes);

}  // namespace fairring
