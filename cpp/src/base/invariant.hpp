// STOCKADE_ASSERT: assertions on what the engine itself guarantees, in TigerBeetle's
// spirit: after every decision, the row it produced must keep 0 <= reserved <= on_hand +
// backorder_limit. They are on in the test builds (ctest, ThreadSanitizer: STOCKADE_ASSERTIONS) and
// in any build without NDEBUG; a failure prints the condition and aborts, since the engine's state
// can no longer be trusted. Invalid input from callers is never asserted: it is an Error
// (invalid_argument).
#pragma once

#include <cstdint>

namespace stockade::detail {

[[noreturn]] void assertion_failed(const char* condition, const char* file, int line) noexcept;

}  // namespace stockade::detail

#if defined(STOCKADE_ASSERTIONS) || !defined(NDEBUG)
#define STOCKADE_ASSERT(condition) \
  ((condition) ? void(0) : ::stockade::detail::assertion_failed(#condition, __FILE__, __LINE__))
#else
#define STOCKADE_ASSERT(condition) ((void)sizeof(condition))
#endif

// The stock row invariant, as the schema's CHECK constraint states it.
#define STOCKADE_ASSERT_ROW(on_hand, reserved, backorder_limit) \
  STOCKADE_ASSERT((backorder_limit) >= 0 && (reserved) >= 0 &&  \
                  (reserved) <= (on_hand) + (backorder_limit))
