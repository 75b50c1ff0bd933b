// Test hook of the point-to-point matching (p2p/matcher.h; tests/test_p2p_matcher.py).
#include <pybind11/stl.h>
#include <pybind11/pybind11.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "p2p/matcher.h"

namespace py = pybind11;

namespace fairring {

void register_p2p_hooks(py::module& m) {
  // events: (kind, id, src, tag), kind "post" (a receive; src -1: any),
  // "arrive" (a message), "cancel" (a receive), "drop" (a kept message).
  // Returns, per event, the id it matched (cancel/drop: the id if it was
  // there) or None.
  m.def("_matcher_for_test", [](const std::vector<std::tuple<std::string, uint64_t, int, int>>& events) {
    Matcher matcher;
    std::vector<std::optional<uint64_t>> out;
    for (const auto& [kind, id, src, tag] : events) {
      if (kind == "post") {
        out.push_back(matcher.post_recv(id, src, tag));
      } else if (kind == "arrive") {
        out.push_back(matcher.arrive(id, src, tag));
      } else if (kind == "cancel") {
        out.push_back(matcher.cancel_recv(id) ? std::optional<uint64_t>(id) : std::nullopt);
      } else if (kind == "drop") {
        out.push_back(matcher.cancel_message(id) ? std::optional<uint64_t>(id) : std::nullopt);
      } else {
        throw std::invalid_argument("event kind must be post, arrive, cancel or drop, got " + kind);
      }
    }
    return out;
  });
}

}  // namespace fairring
