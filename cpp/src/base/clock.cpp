#include "stockade/clock.hpp"

#include <chrono>

#include "stockade/errors.hpp"
#include "stockade/types.hpp"

namespace stockade {

TimestampUs SystemClock::now_us() const {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
}

namespace {

// 0001-01-01T00:00:00Z in microseconds since the epoch: the first instant Python's
// datetime holds.
constexpr TimestampUs timestamp_us_min = -62'135'596'800'000'000;

void check_clock_time(TimestampUs value) {
  if (value < timestamp_us_min || value > timestamp_us_max) {
    throw_invalid_argument("a ManualClock must stay between the years 1 and 9999");
  }
}

}  // namespace

ManualClock::ManualClock(TimestampUs start_us) : now_us_(start_us) {
  check_clock_time(start_us);
}

void ManualClock::set_us(TimestampUs value) {
  check_clock_time(value);
  now_us_.store(value, std::memory_order_release);
}

TimestampUs ManualClock::advance_us(std::int64_t delta_us) {
  TimestampUs now = now_us_.load(std::memory_order_acquire);
  for (;;) {
    if ((delta_us > 0 && now > timestamp_us_max - delta_us) ||
        (delta_us < 0 && now < timestamp_us_min - delta_us)) {
      throw_invalid_argument("a ManualClock must stay between the years 1 and 9999");
    }
    if (now_us_.compare_exchange_weak(now, now + delta_us, std::memory_order_acq_rel)) {
      return now + delta_us;
    }
  }
}

std::shared_ptr<Clock> system_clock() {
  static const std::shared_ptr<Clock> clock = std::make_shared<SystemClock>();
  return clock;
}

}  // namespace stockade
