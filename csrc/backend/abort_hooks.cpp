#include "backend/abort_hooks.h"

#include <exception>

#include "common/log.h"

namespace fairring {

void AbortHooks::add(int64_t id, Hook hook) {
  std::lock_guard<std::mutex> lock(mu_);
  hooks_[id] = std::move(hook);
}

void AbortHooks::remove(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  hooks_.erase(id);
}

void AbortHooks::run_once(int rank) {
  std::map<int64_t, Hook> hooks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ran_) return;
    ran_ = true;
    hooks = hooks_;  // run outside the lock: a hook may (un)register
  }
  for (auto& [id, hook] : hooks) {
    try {
      hook();
    } catch (const std::exception& e) {
      FAIRRING_LOG(rank, "abort hook %lld raised: %s", static_cast<long long>(id), e.what());
    } catch (...) {
      FAIRRING_LOG(rank, "abort hook %lld raised", static_cast<long long>(id));
    }
  }
}

std::vector<std::pair<int64_t, AbortHooks::Hook>> AbortHooks::list() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {hooks_.begin(), hooks_.end()};
}

}  // namespace fairring
