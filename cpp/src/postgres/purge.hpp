// The pieces of a purge (retention.cpp) that the store's declarations name.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

namespace stockade::detail::pg {

// One purge statement's outcome, and where the next one of its phase starts.
struct PurgeStep {
  std::uint64_t keys = 0;
  std::uint64_t reservations = 0;
  std::int64_t cursor = 0;  // epoch microseconds
};

// The first cursor of a purge: 0001-01-01, before any row.
inline constexpr std::int64_t purge_cursor_start = -62135596800LL * 1000000;

// The sweeper's pause after each purge step: half of `took` if the step deleted
// something (it paces itself), else none (`took` is zero); false: stop now.
using Rest = std::function<bool(std::chrono::steady_clock::duration took)>;

}  // namespace stockade::detail::pg
