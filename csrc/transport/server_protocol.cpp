#include "transport/server_protocol.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>

#include "common/error.h"

namespace fairring {

namespace {
constexpr const char* kSecretKey = "fairring/servers/secret";
}

std::string server_count_key() { return "fairring/servers/count"; }
std::string server_addr_key(int index) { return "fairring/servers/" + std::to_string(index); }

c10::intrusive_ptr<c10d::Store> root_store(const c10::intrusive_ptr<c10d::Store>& store) {
  if (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(store.get())) return prefixed->getUnderlyingNonPrefixStore();
  return store;
}

Secret job_server_secret(c10d::Store& root) {
  const Secret mine = random_secret();
  // compareSet with an empty expected value sets a missing key and returns
  // what is stored: ours if we came first, the first one's otherwise.
  const std::vector<uint8_t> got = root.compareSet(kSecretKey, {}, std::vector<uint8_t>(mine.begin(), mine.end()));
  Secret s;
  if (got.size() != s.size())
    throw Error(ErrorKind::kStore, "fairring: malformed reduction-server secret in the store");
  std::copy(got.begin(), got.end(), s.begin());
  return s;
}

std::string server_name(int index, const std::string& address) {
  return "reduction server " + std::to_string(index) + " (" + address + ")";
}

}  // namespace fairring
