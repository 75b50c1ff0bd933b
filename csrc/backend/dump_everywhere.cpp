#include "backend/dump_everywhere.h"

#include "common/log.h"
#include "transport/socket.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <chrono>
#include <sstream>
#include <string>

namespace fairring {

namespace {
// Where fairring_py/_status_listener.py writes each rank's listener: "ip:port token pid host".
const std::string kKey = "fairring-status/";
// Per rank: a live listener answers within microseconds; a dead one refuses
// at once.  Only an unreachable machine costs the whole of it.
constexpr auto kConnectLimit = std::chrono::milliseconds(300);
}  // namespace

void ask_every_rank_to_dump(const c10::intrusive_ptr<c10d::Store>& store, int rank) {
  try {
    c10::intrusive_ptr<c10d::Store> root = store;
    while (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(root.get())) root = prefixed->getUnderlyingStore();
    if (root->add(kKey + "dump-asked", 1) != 1) return;  // another rank asked already
    if (!root->check({kKey + "world"})) return;          // the listeners are off (FAIRRING_STATUS=off)
    const auto raw_world = root->get(kKey + "world");
    const int world = std::stoi(std::string(raw_world.begin(), raw_world.end()));
    int asked = 0;
    for (int r = 0; r < world; ++r) {
      const std::string key = kKey + std::to_string(r);
      if (!root->check({key})) continue;
      const auto raw = root->get(key);
      std::istringstream entry(std::string(raw.begin(), raw.end()));
      std::string addr, token;
      entry >> addr >> token;
      try {
        Socket s = connect_to(addr, Clock::now() + kConnectLimit);
        const std::string request = token + " dump\n";
        s.send_all(request.data(), request.size(), Clock::now() + kConnectLimit);
        ++asked;
      } catch (const std::exception&) {
        // Gone, or unreachable: it cannot dump anyway.
      }
    }
    FAIRRING_LOG(rank, "asked %d rank(s) of the job to dump torch's flight recorder", asked);
  } catch (const std::exception& e) {
    FAIRRING_LOG(rank, "could not ask the other ranks to dump torch's flight recorder: %s", e.what());
  }
}

}  // namespace fairring
