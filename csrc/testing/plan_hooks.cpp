// Test hooks of the pure planning: slices, chunks and shards, the rail walk,
// each collective's script (tests/test_plan_topology.py, test_rail_walk.py).
#include <pybind11/stl.h>
#include <pybind11/pybind11.h>

#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "common/config.h"
#include "common/op_key.h"
#include "plan/plan.h"
#include "plan/rail_levels.h"
#include "plan/rail_walk.h"
#include "topology/machine.h"

namespace py = pybind11;

namespace fairring {

namespace {

py::list ranges(const std::vector<Range>& rs) {
  py::list out;
  for (const auto& r : rs) out.append(py::make_tuple(r.offset, r.count));
  return out;
}

// Ranges as Python passes them: (offset, count) pairs.
using Pairs = std::vector<std::pair<int64_t, int64_t>>;
std::vector<Range> to_ranges(const Pairs& ps) {
  std::vector<Range> rs;
  for (const auto& p : ps) rs.push_back(Range{p.first, p.second});
  return rs;
}

}  // namespace

void register_plan_hooks(py::module& m) {
  m.def("_parse_cache_size_for_test", &parse_cache_size);
  m.def("_shared_cache_bytes", &shared_cache_bytes);
  m.def("_auto_slice_size_for_test", &auto_slice_size);
  m.def("_wait_spin_us_for_test",
        [](int ranks_here, int cpus) { return static_cast<int64_t>(wait_spin_for(ranks_here, cpus).count()); });
  m.def("_split_even_for_test",
        [](int64_t count, int parts, int64_t align) { return ranges(split_even(count, parts, align)); });
  m.def(
      "_plan_for_test",
      [](int64_t numel, int64_t elem_size, int ranks_per_node, int num_nodes, int64_t slice_bytes,
         int64_t min_chunk_bytes, int64_t min_shard_bytes, const std::string& collective, std::vector<int> node_sizes) {
        const Cut c = collective_def(collective_named(collective)).cut();
        PlanParams p;
        p.slice_bytes = slice_bytes;
        p.min_chunk_bytes = min_chunk_bytes;
        p.min_shard_bytes = min_shard_bytes;
        // node_sizes given: nodes of those rank counts (ranks_per_node and
        // num_nodes are ignored).
        if (node_sizes.empty()) node_sizes.assign(static_cast<size_t>(num_nodes), ranks_per_node);
        py::list slices;
        const int64_t n = num_slices(c, numel, elem_size, blockwise_slice_pieces(node_sizes), p);
        for (int64_t i = 0; i < n; ++i) {
          SlicePlan s = plan_slice(c, numel, elem_size, i, node_sizes, p);
          py::dict d;
          d["slice"] = py::make_tuple(s.slice.offset, s.slice.count);
          d["chunks"] = ranges(s.chunks);
          py::list shards;
          for (const auto& sh : s.shards) shards.append(ranges(sh));
          d["shards"] = shards;
          d["replicated"] = s.replicated;
          if (c == Cut::kBlockwise) {
            py::dict at;  // (node, local rank) -> where its piece is staged
            for (size_t j = 0; j < node_sizes.size(); ++j) {
              for (int x = 0; x < node_sizes[j]; ++x) {
                at[py::make_tuple(j, x)] = blockwise_staged_at(s, static_cast<int>(j), x);
              }
            }
            d["staged_at"] = at;
          }
          slices.append(d);
        }
        return slices;
      },
      py::arg("numel"), py::arg("elem_size"), py::arg("ranks_per_node"), py::arg("num_nodes"),
      py::arg("slice_bytes") = PlanParams().slice_bytes, py::arg("min_chunk_bytes") = PlanParams().min_chunk_bytes,
      py::arg("min_shard_bytes") = PlanParams().min_shard_bytes, py::arg("collective") = "all_reduce",
      py::arg("node_sizes") = std::vector<int>{});
  m.def("_blockwise_slice_pieces_for_test", &blockwise_slice_pieces);
  m.def("_blockwise_fits_for_test", [](int64_t elem_size, int world, int64_t slice_bytes) {
    PlanParams p;
    p.slice_bytes = slice_bytes;
    return blockwise_fits(elem_size, world, p);
  });

  // The rail walk of a chunk with these shards, seen from `node`; pattern
  // "reduce", "share" or "exchange" (with `received`), back_to a node, "all"
  // or "none".
  m.def(
      "_rail_walk_for_test",
      [](const std::string& pattern, const std::string& back_to, const Pairs& shards, int node, int num_nodes,
         const Pairs& received) {
        const RailPattern pat = pattern == "share"      ? RailPattern::kShare
                                : pattern == "exchange" ? RailPattern::kExchange
                                                        : RailPattern::kReduce;
        const int to = back_to == "all" ? kBackToAll : back_to == "none" ? kBackToNone : std::stoi(back_to);
        const RailWalk w = walk_rail(pat, to, to_ranges(shards), node, num_nodes, to_ranges(received));
        auto transfers = [](const std::vector<Transfer>& v) {
          py::list out;
          for (const auto& t : v) out.append(py::make_tuple(t.node, t.shard, t.count));
          return out;
        };
        py::dict d;
        d["sends"] = transfers(w.sends);
        d["receives"] = transfers(w.receives);
        d["reduces"] = w.reduces;
        d["served"] = w.served;
        d["served_count"] = w.served_count;
        d["sum_sends"] = transfers(w.sum_sends);
        d["sum_receives"] = transfers(w.sum_receives);
        d["sends_sum_data"] = w.sends_sum_data();
        d["shards_read"] = w.shards_read();
        d["shards_written"] = w.shards_written();
        return d;
      },
      py::arg("pattern"), py::arg("back_to"), py::arg("shards"), py::arg("node"), py::arg("num_nodes"),
      py::arg("received") = Pairs{});

  // The all-reduce's rail levels (plan/rail_levels.h).
  m.def("_rail_levels_for_test", &rail_levels);
  m.def("_auto_rail_radix_for_test", &auto_rail_radix);
  m.def(
      "_chunk_in_levels_for_test",
      [](const Pairs& shards, int num_nodes, int64_t elem_size, bool by_node_count) {
        return chunk_in_levels(to_ranges(shards), num_nodes, elem_size, by_node_count);
      },
      py::arg("shards"), py::arg("num_nodes"), py::arg("elem_size"), py::arg("by_node_count") = true);
  m.def("_shards_per_part_for_test", &shards_per_part);
  m.def("_level_of_peer_for_test", &level_of_peer);
  m.def("_walk_levels_for_test", [](const std::vector<int>& dims, const Pairs& shards, int node, int num_nodes) {
    py::list out;
    for (const RailLevel& lv : walk_levels(dims, to_ranges(shards), node, num_nodes)) {
      py::dict d;
      d["group"] = lv.group;
      d["me"] = lv.me;
      d["parts"] = ranges(lv.parts);
      out.append(d);
    }
    return out;
  });

  // The phase list of a collective (by name) on a node of `ranks_per_node`.
  m.def("_phases_for_test", [](const std::string& collective, int ranks_per_node) {
    const Script& script = collective_def(collective_named(collective)).script(/*alone=*/ranks_per_node == 1);
    std::vector<std::string> names;
    for (const Step& step : script.steps) names.push_back(step.name);
    return py::make_tuple(names, script.front);
  });

  // The list of collectives (FAIRRING_COLLECTIVES) as each layer sees it:
  // per kind its number, its name, its definition's kind, cut and shape,
  // its scripts' halves, and how a message describes an op of it.
  m.def("_collectives_for_test", [] {
    py::list out;
    for (Collective c : all_collectives()) {
      const CollectiveDef& def = collective_def(c);
      const auto halves = [](const Script& script) {
        std::vector<std::string> front, back;
        for (size_t i = 0; i < script.steps.size(); ++i)
          (i < script.front ? front : back).push_back(script.steps[i].name);
        return py::make_tuple(front, back);
      };
      OpKey key;
      key.collective = static_cast<int32_t>(c);
      key.numel = 7;
      const Shape shape = def.shape();
      py::dict d;
      d["number"] = static_cast<int>(c);
      d["name"] = std::string(collective_name(c));
      d["named"] = static_cast<int>(collective_named(collective_name(c)));
      d["def_kind"] = static_cast<int>(def.kind());
      d["blockwise"] = def.cut() == Cut::kBlockwise;
      d["input_per_rank"] = shape.input_per_rank;
      d["output_per_rank"] = shape.output_per_rank;
      d["rooted"] = shape.rooted;
      d["node_script"] = halves(def.script(false));
      d["alone_script"] = halves(def.script(true));
      d["describe"] = describe(key);
      out.append(d);
    }
    return out;
  });
  m.def("_describe_kind_for_test", [](int kind) {
    OpKey key;
    key.collective = kind;
    return describe(key);
  });

  m.def("_exchange_staging_bytes_for_test", &exchange_staging_bytes);
  m.def(
      "_max_shard_bytes_for_test",
      [](int ranks_per_node, int num_nodes, int64_t slice_bytes, int64_t min_chunk_bytes, int64_t min_shard_bytes,
         int largest_node) {
        PlanParams p;
        p.slice_bytes = slice_bytes;
        p.min_chunk_bytes = min_chunk_bytes;
        p.min_shard_bytes = min_shard_bytes;
        return max_shard_bytes(p, ranks_per_node, num_nodes, largest_node);
      },
      py::arg("ranks_per_node"), py::arg("num_nodes"), py::arg("slice_bytes"), py::arg("min_chunk_bytes"),
      py::arg("min_shard_bytes"), py::arg("largest_node") = 0);
}

}  // namespace fairring
