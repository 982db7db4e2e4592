// MemoryStore: the embedded, in-process store. Same semantics and errors as the
// PostgreSQL store, no durability. It serves notebooks, fast tests and the demo.
#pragma once

#include <memory>

#include "stockade/clock.hpp"
#include "stockade/store.hpp"

namespace stockade {

std::shared_ptr<Store> make_memory_store(std::shared_ptr<Clock> clock,
                                         std::shared_ptr<Telemetry> telemetry = nullptr);

}  // namespace stockade
