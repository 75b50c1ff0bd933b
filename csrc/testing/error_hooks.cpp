// Test hooks of what users read when something fails: the engine's Error as
// each kind reaches Python, and each collective's words in messages
// (tests/test_error_kinds.py).
#include <c10/core/ScalarType.h>
#include <pybind11/pybind11.h>

#include <string>

#include "collectives/collectives.h"
#include "common/error.h"
#include "common/op_key.h"
#include "common/reduce_op.h"

namespace py = pybind11;

namespace fairring {

void register_error_hooks(py::module& m) {
  m.def(
      "_raise_for_test",
      [](const std::string& kind, const std::string& what) {
        const ErrorKind k = kind == "network"    ? ErrorKind::kNetwork
                            : kind == "store"    ? ErrorKind::kStore
                            : kind == "argument" ? ErrorKind::kInvalidArgument
                                                 : ErrorKind::kBackend;
        throw Error(k, what);
      },
      "Throws the engine's Error of `kind` (backend, network, store, argument) with message `what`.");
  m.def(
      "_describe_for_test",
      [](const std::string& collective, int64_t numel, int root) {
        OpKey k;
        k.collective = static_cast<int32_t>(collective_named(collective));
        k.numel = numel;
        k.dtype = static_cast<int32_t>(c10::ScalarType::Float);
        k.op = static_cast<int32_t>(RedOp::kSum);
        k.root = root;
        return describe(k);
      },
      "describe() of a float32 SUM op of `collective`, as mismatch messages word it.");
}

}  // namespace fairring
