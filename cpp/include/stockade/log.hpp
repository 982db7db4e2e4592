// Logging: what the engine has to say about faults, in a bounded ring that Python drains.
//
// The core never calls into Python. Threads of the engine (flushers, the sweeper, callers)
// append records to one process-wide ring of `log_capacity` records; the Python package
// drains it on a thread of its own and hands each record to the stdlib logger it names
// (`stockade`, `stockade.postgres`, `stockade.batcher`, `stockade.sweeper`). A full ring
// drops new records and counts them, so logging never blocks or grows with traffic, and a
// record below the level Python asked for is never even formatted.
//
// Messages never carry secrets or unbounded input: they are built from error messages
// (which quote caller input through shown() and scrub connection strings) and from
// figures.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace stockade {

enum class LogLevel : int { debug = 10, info = 20, warning = 30, error = 40 };

struct LogRecord {
  LogLevel level = LogLevel::info;
  const char* logger = "stockade";  // a static string
  std::string message;
  std::int64_t unix_us = 0;
};

inline constexpr std::size_t log_capacity = 1024;
inline constexpr std::size_t log_message_max = 2048;  // longer messages are cut

// The least level kept (default warning, until Python sets its logger's level).
void set_log_level(LogLevel level) noexcept;
bool log_enabled(LogLevel level) noexcept;

// Appends a record (if its level is enabled and the ring has room).
void log(LogLevel level, const char* logger, std::string message);

// Takes up to `max` records, oldest first, waiting at most `timeout_ms` for the first one;
// `dropped` receives how many records were dropped (ring full) since the last call.
std::vector<LogRecord> take_logs(std::size_t max, std::int64_t timeout_ms, std::uint64_t* dropped);

// Makes take_logs() return at once from now on, records or not (the Python side calls it
// at exit, so that its reader thread is out of C++ before the interpreter finalizes).
void stop_taking_logs() noexcept;

// At most one record per `interval_us` from one place in the code (a fault under load
// would otherwise log per request); the next one that passes says how many were held back.
class LogLimiter {
 public:
  explicit LogLimiter(std::int64_t interval_us = 1'000'000) : interval_us_(interval_us) {}
  void log(LogLevel level, const char* logger, const std::string& message);

 private:
  const std::int64_t interval_us_;
  std::atomic<std::int64_t> next_us_{0};
  std::atomic<std::uint64_t> held_back_{0};
};

}  // namespace stockade
