#include "stockade/log.hpp"

#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <new>

namespace stockade {
namespace {

std::int64_t unix_now_us() {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
}

struct Ring {
  std::mutex mutex;
  std::condition_variable ready;
  std::deque<LogRecord> records;
  std::uint64_t dropped = 0;
  bool stopped = false;
};

std::atomic<int> min_level{static_cast<int>(LogLevel::warning)};

// A forked child may inherit the ring's mutex held by a thread that does not exist there:
// it starts with a fresh, empty ring (the parent's records are the parent's to drain).
alignas(Ring) unsigned char ring_storage[sizeof(Ring)];
Ring* ring_ptr = nullptr;

void fresh_ring_in_child() {
  ring_ptr = new (ring_storage) Ring();  // the old one is abandoned, not destroyed
}

Ring& ring() {
  static const bool made = [] {
    ring_ptr = new (ring_storage) Ring();
    pthread_atfork(nullptr, nullptr, &fresh_ring_in_child);
    return true;
  }();
  (void)made;
  return *ring_ptr;
}

}  // namespace

void set_log_level(LogLevel level) noexcept {
  min_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

bool log_enabled(LogLevel level) noexcept {
  return static_cast<int>(level) >= min_level.load(std::memory_order_relaxed);
}

void log(LogLevel level, const char* logger, std::string message) {
  if (!log_enabled(level)) return;
  if (message.size() > log_message_max) {
    message.resize(log_message_max);
    message += "... (cut)";
  }
  Ring& r = ring();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    if (r.records.size() >= log_capacity) {
      ++r.dropped;
      return;
    }
    r.records.push_back(LogRecord{level, logger, std::move(message), unix_now_us()});
  }
  r.ready.notify_one();
}

std::vector<LogRecord> take_logs(std::size_t max, std::int64_t timeout_ms, std::uint64_t* dropped) {
  Ring& r = ring();
  std::unique_lock<std::mutex> lock(r.mutex);
  r.ready.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                   [&] { return r.stopped || !r.records.empty() || r.dropped > 0; });
  std::vector<LogRecord> out;
  while (!r.records.empty() && out.size() < max) {
    out.push_back(std::move(r.records.front()));
    r.records.pop_front();
  }
  if (dropped != nullptr) *dropped = r.dropped;
  r.dropped = 0;
  return out;
}

void stop_taking_logs() noexcept {
  Ring& r = ring();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    r.stopped = true;
  }
  r.ready.notify_all();
}

void LogLimiter::log(LogLevel level, const char* logger, const std::string& message) {
  if (!log_enabled(level)) return;
  const std::int64_t now = unix_now_us();
  std::int64_t next = next_us_.load(std::memory_order_relaxed);
  if (now < next || !next_us_.compare_exchange_strong(next, now + interval_us_)) {
    held_back_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const std::uint64_t held = held_back_.exchange(0, std::memory_order_relaxed);
  stockade::log(
      level, logger,
      held == 0 ? message : message + " (" + std::to_string(held) + " more like it held back)");
}

}  // namespace stockade
