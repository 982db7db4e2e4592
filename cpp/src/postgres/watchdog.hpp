// The watchdog: a deadline on every wait of a PostgreSQL call.
//
// libpq's calls block on the socket for as long as the server takes to answer, and a
// server may never answer: a COMMIT waiting for a synchronous standby that is gone, a
// server paused with SIGSTOP, a network that drops packets without closing. A call must
// not wait without a bound, so each transaction arms its connection here with the call's
// deadline, and disarms it when the transaction is over.
//
// What happens past the deadline, in two steps:
//   1. A cancel request. A canceller thread asks the server, from a connection of its
//      own, to cancel the session's statement (pg_cancel_backend of its PID, matched with
//      the session's start so that a reused PID is never hit). A statement then fails
//      with 57014, and a COMMIT waiting for a synchronous standby returns: committed
//      locally, maybe not replicated. Either way the server answers, and the connection
//      stays sound.
//   2. `grace_ms` later, if the call is still waiting (the server does not answer at all,
//      or the cancel could not be delivered), the socket is shut down from this side:
//      libpq's wait ends with a broken connection at once.
// The caller learns from its Guard that the deadline fired, and answers: a definite
// DeadlineExceeded while no COMMIT had been sent (the server cannot commit a transaction
// whose COMMIT never reached it), InDoubt once one had. A connection whose deadline fired
// is discarded, never reused, so that a cancel delivered late cannot hit a later call.
//
// What it does not do: behind a transaction-mode pooler the server session is unknown,
// so there is no cancel request, only the cut. A session whose socket was cut may go on
// running on the server (PostgreSQL notices a gone client only when it next reads or
// writes): its locks stay until it ends, and its COMMIT, if it was sent, may still
// complete. That is why a cut after COMMIT is InDoubt, never a failure.
//
// Bounds: one thread for the deadlines and one for the cancel requests; at most
// `cancel_queue_max` requests wait for the canceller, and one that finds the queue full
// is dropped (its cut still comes). The canceller's own statements are armed too, and
// its connect is bounded by libpq's connect_timeout, which the store's DSN always sets.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <pqxx/pqxx>
#include <string>
#include <thread>
#include <vector>

#include "postgres/pool.hpp"

namespace stockade::detail::pg {

class Watchdog {
 public:
  static constexpr std::size_t cancel_queue_max = 64;

  Watchdog(std::string dsn, std::int64_t grace_ms);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  struct Entry;

  // Disarms on destruction. An empty Guard was never armed.
  class Guard {
   public:
    Guard() = default;
    Guard(Guard&& other) noexcept;
    Guard& operator=(Guard&& other) noexcept;
    ~Guard();
    // The deadline passed while armed: a cancel request went out, or the socket was cut.
    bool fired() const;
    void disarm();

   private:
    friend class Watchdog;
    Guard(Watchdog* owner, std::shared_ptr<Entry> entry)
        : owner_(owner), entry_(std::move(entry)) {}
    Watchdog* owner_ = nullptr;
    std::shared_ptr<Entry> entry_;
  };

  // Arms `conn` until the Guard goes: at `deadline_us` (steady clock, microseconds) a
  // cancel request for `backend` (none if its pid is 0), then the cut `grace_ms` later.
  Guard arm(pqxx::connection& conn, const Backend& backend, std::int64_t deadline_us);
  // Stops both threads (the canceller first, then the watcher). Guards armed after it
  // never fire: a closed store leases no connection any more.
  void stop();
  std::int64_t grace_ms() const { return grace_ms_; }

 private:
  void watch();
  void cancel_loop();
  void cancel_one(const Backend& backend);
  void release(const std::shared_ptr<Entry>& entry);

  const std::string dsn_;
  const std::int64_t grace_ms_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::condition_variable cancels_ready_;
  std::vector<std::shared_ptr<Entry>> armed_;
  // When the watcher wakes next (steady microseconds): arm() wakes it only for a sooner
  // deadline, so a call costs it no context switch.
  std::int64_t next_wake_us_ = std::numeric_limits<std::int64_t>::max();
  std::deque<Backend> cancels_;
  bool stopping_ = false;          // the watcher stops
  bool cancels_stopping_ = false;  // the canceller stops (first)
  std::thread watcher_;
  std::thread canceller_;
};

// The deadline of the call this thread runs (steady clock, microseconds), when a scope
// set one: a call that runs several transactions (a batch's fast statement, then its full
// path; a reserve's one statement, then its transaction) keeps one bound over all of
// them. Scopes nest; the inner one never extends the outer one's deadline.
class CallDeadline {
 public:
  // `timeout_ms` from `since_us` (steady clock, microseconds; 0: now).
  explicit CallDeadline(std::int64_t timeout_ms, std::int64_t since_us = 0);
  ~CallDeadline();
  CallDeadline(const CallDeadline&) = delete;
  CallDeadline& operator=(const CallDeadline&) = delete;
  // The deadline in force, or 0 when no scope is open on this thread.
  static std::int64_t current();

 private:
  std::int64_t outer_;
};

}  // namespace stockade::detail::pg
