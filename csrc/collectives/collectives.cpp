#include "collectives/collectives.h"
#include "common/error.h"

namespace fairring {

const CollectiveDef& collective_def(Collective c) {
  switch (c) {
#define FAIRRING_COLLECTIVE_CASE(kind, number, name) \
  case Collective::k##kind:                          \
    return name##_def();
    FAIRRING_COLLECTIVES(FAIRRING_COLLECTIVE_CASE)
#undef FAIRRING_COLLECTIVE_CASE
  }
  throw Error(ErrorKind::kInvalidArgument,
              "fairring: no definition for collective " + std::to_string(static_cast<int>(c)));
}

const std::vector<Collective>& all_collectives() {
  static const std::vector<Collective> all{
#define FAIRRING_COLLECTIVE_ITEM(kind, number, name) Collective::k##kind,
      FAIRRING_COLLECTIVES(FAIRRING_COLLECTIVE_ITEM)
#undef FAIRRING_COLLECTIVE_ITEM
  };
  return all;
}

namespace {
// Every definition is built (and so its words registered, op_key.h) when the
// library loads: a message may name a peer's collective that this rank has
// not run yet.
const bool kAllDefined = [] {
  for (Collective c : all_collectives()) collective_def(c);
  return true;
}();
}  // namespace

Collective collective_named(const std::string& name) {
  for (Collective c : all_collectives()) {
    if (name == collective_name(c)) return c;
  }
  throw Error(ErrorKind::kInvalidArgument, "fairring: no collective named " + name);
}

}  // namespace fairring
