// The hooks a user registers to run before a group aborts (torch >= 2.14's
// registerAbortHook): to capture state while the group can still be
// inspected.  They run once per group, on the first of: abort(), or the
// group's first failed op (on the thread that saw it fail).  A hook that
// throws is logged and the others still run.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

namespace fairring {

class AbortHooks {
 public:
  using Hook = std::function<void()>;
  void add(int64_t id, Hook hook);
  void remove(int64_t id);
  // The registered hooks, if they have not run yet (later calls do nothing).
  // `rank` prefixes the log line of a hook that throws.
  void run_once(int rank);
  // The hooks registered so far (a reconfigured group hands them on).
  std::vector<std::pair<int64_t, Hook>> list() const;

 private:
  mutable std::mutex mu_;
  std::map<int64_t, Hook> hooks_;
  bool ran_ = false;
};

}  // namespace fairring
