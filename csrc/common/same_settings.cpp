#include "common/same_settings.h"
#include "common/error.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <stdexcept>
#include <vector>

namespace fairring {

std::vector<std::string> read_every_rank(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key,
                                         int size) {
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(key + "/" + std::to_string(r));
  store->wait(keys);
  std::vector<std::string> values;
  for (const std::vector<uint8_t>& v : store->multiGet(keys)) values.emplace_back(v.begin(), v.end());
  return values;
}

void check_same_settings(const c10::intrusive_ptr<c10d::Store>& store, const std::string& key, int rank, int size,
                         const std::string& mine) {
  store->set(key + "/" + std::to_string(rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  check_settings_agree(read_every_rank(store, key, size), rank, mine);
}

void check_settings_agree(const std::vector<std::string>& all, int rank, const std::string& mine) {
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    const std::string& theirs = all[r];
    if (theirs != mine) {
      throw Error(ErrorKind::kInvalidArgument,
                  "fairring: ranks of one process group must use the same options, but rank " + std::to_string(rank) +
                      " has " + mine + " and rank " + std::to_string(r) + " has " + theirs +
                      ". Set them the same way on every rank (environment or "
                      "pg_options).");
    }
  }
}

}  // namespace fairring
