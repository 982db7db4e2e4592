// Time for reservations. TTLs and expiry follow one clock per store: the database clock
// (now()) for PostgreSQL, and for the memory store an injectable Clock, so tests can move
// time forward without sleeping. All times are microseconds since the Unix epoch, UTC,
// the resolution of PostgreSQL's timestamptz.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace stockade {

using TimestampUs = std::int64_t;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimestampUs now_us() const = 0;
};

class SystemClock final : public Clock {
 public:
  TimestampUs now_us() const override;
};

// A clock that only moves when told to. Thread-safe.
class ManualClock final : public Clock {
 public:
  // Times stay between the years 1 and 9999 (what Python's datetime holds); outside them
  // the constructor, set_us and advance_us raise InvalidArgument.
  explicit ManualClock(TimestampUs start_us);
  TimestampUs now_us() const override { return now_us_.load(std::memory_order_acquire); }
  void set_us(TimestampUs value);
  // Moves the clock by delta_us (which may be negative); returns the new time.
  TimestampUs advance_us(std::int64_t delta_us);

 private:
  std::atomic<TimestampUs> now_us_;
};

std::shared_ptr<Clock> system_clock();

}  // namespace stockade
