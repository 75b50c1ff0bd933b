// Test hooks of the point-to-point matching (p2p/matcher.h; tests/test_p2p_matcher.py) and of the
// buffers kept for early messages (p2p/spare_buffers.h).
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "p2p/matcher.h"
#include "p2p/spare_buffers.h"

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
  // steps: ("take", slot, bytes) takes a buffer into slot, ("give", slot, 0)
  // gives it back.  Returns, per step, (which earlier slot's buffer a take
  // got, or -1 for a new one; its capacity; the bytes kept after the step).
  m.def("_spare_buffers_for_test", [](uint64_t keep, const std::vector<std::tuple<std::string, int, uint64_t>>& steps) {
    SpareBuffers spares(keep);
    std::vector<SpareBuffers::Buffer> slots(64);
    std::vector<const char*> first(64, nullptr);  // the pointer each slot first held
    std::vector<std::tuple<int, uint64_t, uint64_t>> out;
    for (const auto& [kind, slot, bytes] : steps) {
      if (kind == "take") {
        slots.at(slot) = spares.take(bytes);
        int from = -1;
        for (int s = 0; s < 64; ++s) {
          if (s != slot && first[s] == slots[slot].data.get()) from = s;
        }
        if (!first[slot]) first[slot] = slots[slot].data.get();
        out.emplace_back(from, slots[slot].capacity, spares.held());
      } else if (kind == "give") {
        spares.give(std::move(slots.at(slot)));
        out.emplace_back(-1, 0, spares.held());
      } else {
        throw std::invalid_argument("step kind must be take or give, got " + kind);
      }
    }
    return out;
  });
}

}  // namespace fairring
