#include "stockade/testing.hpp"

#include <string>

#include "stockade/errors.hpp"

namespace stockade {

TestHooks& test_hooks(Store& store) {
  if (auto* hooks = dynamic_cast<TestHooks*>(&store)) return *hooks;
  throw Error(ErrorCode::not_supported, std::string("the ") + store.backend_name() +
                                            " store has no test hooks (the oversell canary "
                                            "and hold_lock)");
}

BatcherTestPoints& batcher_test_points() {
  static BatcherTestPoints points;
  return points;
}

}  // namespace stockade
