// Completions for callers that do not block: an event loop (Python's asyncio) submits a
// request with a token and later collects the outcome.
//
// Outcomes arrive in bulk. A producer (a batch flusher, an async worker) posts a whole
// group of completions under one lock and signals an eventfd only when the channel goes
// from empty to non-empty; the loop watches the fd and drains everything at once. So a
// batch of 4,000 reservations costs the loop one wake-up and one drain, and C++ threads
// never take the GIL.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <variant>
#include <vector>

#include "stockade/errors.hpp"
#include "stockade/types.hpp"

namespace stockade {

struct Completion {
  std::uint64_t token = 0;
  std::variant<std::monostate, Reservation, StockLevel, std::vector<Reservation>> value;
  std::optional<Error> error;  // set when the call failed; value is then empty
};

// Where completions go.
class CompletionSink {
 public:
  virtual ~CompletionSink() = default;
  // Takes every completion out of `completions` (which is left empty).
  virtual void post(std::vector<Completion>& completions) = 0;
};

// A sink an event loop can watch: an eventfd becomes readable while completions wait.
class AsyncChannel final : public CompletionSink {
 public:
  AsyncChannel();
  ~AsyncChannel() override;
  AsyncChannel(const AsyncChannel&) = delete;
  AsyncChannel& operator=(const AsyncChannel&) = delete;

  int fd() const noexcept { return fd_; }
  void post(std::vector<Completion>& completions) override;
  // Everything posted so far, oldest first; resets the fd to not readable.
  std::vector<Completion> drain();
  std::size_t waiting() const;

 private:
  int fd_ = -1;
  mutable std::mutex mutex_;
  std::vector<Completion> ready_;
};

// A fixed pool of C++ worker threads for async calls that run per request (every strategy
// but batched, and the reservation transitions). Its queue is bounded: a submit that finds
// it full waits at most `enqueue_timeout_ms`, then raises Overloaded.
class AsyncExecutor {
 public:
  AsyncExecutor(std::size_t workers, std::size_t queue_max, std::int64_t enqueue_timeout_ms);
  ~AsyncExecutor();
  AsyncExecutor(const AsyncExecutor&) = delete;
  AsyncExecutor& operator=(const AsyncExecutor&) = delete;

  void submit(std::function<void()> task);
  // Queues `task` unless the queue is full or closed; never waits. Whether it was queued.
  bool try_submit(std::function<void()> task);
  // Runs what is queued, then stops the workers. Later submits raise InvalidState.
  void close();

 private:
  void work();

  const std::size_t queue_max_;
  const std::int64_t enqueue_timeout_ms_;
  std::mutex close_mutex_;  // one close() joins the workers; a concurrent one waits for it
  std::mutex mutex_;
  std::condition_variable has_work_;
  std::condition_variable has_room_;
  std::deque<std::function<void()>> queue_;
  bool closed_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace stockade
