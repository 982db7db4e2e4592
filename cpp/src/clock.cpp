#include "stockade/clock.hpp"

#include <chrono>

namespace stockade {

TimestampUs SystemClock::now_us() const {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
}

TimestampUs ManualClock::advance_us(std::int64_t delta_us) {
  return now_us_.fetch_add(delta_us, std::memory_order_acq_rel) + delta_us;
}

std::shared_ptr<Clock> system_clock() {
  static const std::shared_ptr<Clock> clock = std::make_shared<SystemClock>();
  return clock;
}

}  // namespace stockade
