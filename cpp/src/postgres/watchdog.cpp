#include "postgres/watchdog.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <utility>

#include "postgres/sqlstate.hpp"
#include "stockade/log.hpp"
#include "stockade/telemetry.hpp"

namespace stockade::detail::pg {

// One armed connection. Guarded by the watchdog's mutex, except `fired`, which the
// owner's thread reads without it. `socket` is a duplicate of the connection's descriptor,
// closed on release: shutdown() acts on the socket itself, and the duplicate keeps that
// socket alive, so even if libpq closed and reopened its descriptor meanwhile, the cut
// can only reach the socket that was armed, never one that reused its number.
struct Watchdog::Entry {
  int socket = -1;
  Backend backend;
  std::int64_t deadline_us = 0;
  enum class State { armed, cancelled, cut, done } state = State::armed;
  std::atomic<bool> fired{false};
};

namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point at_us(std::int64_t us) {
  return Clock::time_point(std::chrono::microseconds(us));
}

thread_local std::int64_t call_deadline_us = 0;

LogLimiter undelivered_cancels;

}  // namespace

Watchdog::Watchdog(std::string dsn, std::int64_t grace_ms)
    : dsn_(std::move(dsn)), grace_ms_(grace_ms) {
  watcher_ = std::thread([this] { watch(); });
  canceller_ = std::thread([this] { cancel_loop(); });
}

Watchdog::~Watchdog() {
  stop();
}

void Watchdog::stop() {
  // The canceller may be inside a connect (bounded by the DSN's connect_timeout) or a
  // statement (armed, so cut by the watcher within grace_ms): it stops first, while the
  // watcher still runs.
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (cancels_stopping_) return;
    cancels_stopping_ = true;
  }
  cancels_ready_.notify_all();
  if (canceller_.joinable()) canceller_.join();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

Watchdog::Guard Watchdog::arm(pqxx::connection& conn, const Backend& backend,
                              std::int64_t deadline_us) {
  auto entry = std::make_shared<Entry>();
  const int socket = conn.sock();
  entry->socket = socket >= 0 ? ::dup(socket) : -1;
  entry->backend = backend;
  entry->deadline_us = deadline_us;
  bool sooner = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_.push_back(entry);
    sooner = deadline_us < next_wake_us_;
  }
  // Deadlines mostly come later than the one the watcher sleeps for: then it sleeps on.
  if (sooner) changed_.notify_all();
  return Guard(this, std::move(entry));
}

void Watchdog::release(const std::shared_ptr<Entry>& entry) {
  std::lock_guard<std::mutex> lock(mutex_);
  entry->state = Entry::State::done;  // the watcher never touches its socket again
  armed_.erase(std::remove(armed_.begin(), armed_.end(), entry), armed_.end());
  if (entry->socket >= 0) ::close(entry->socket);
  entry->socket = -1;
}

// The watcher: sleeps until the next deadline or cut is due, and acts on what is due.
// The cut happens under the mutex on the entry's own duplicate descriptor, which release()
// closes under the same mutex: a released entry is never cut.
void Watchdog::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  const std::int64_t grace_us = grace_ms_ * 1000;
  while (!stopping_) {
    const std::int64_t now = steady_now_us();
    std::int64_t next = std::numeric_limits<std::int64_t>::max();
    for (const auto& e : armed_) {
      if (e->state == Entry::State::armed && e->deadline_us <= now) {
        e->state = Entry::State::cancelled;
        e->fired.store(true, std::memory_order_release);
        if (e->backend.pid != 0 && cancels_.size() < cancel_queue_max) {
          cancels_.push_back(e->backend);
          cancels_ready_.notify_one();
        }
      }
      if (e->state == Entry::State::cancelled && e->deadline_us + grace_us <= now) {
        e->state = Entry::State::cut;
        if (e->socket >= 0) ::shutdown(e->socket, SHUT_RDWR);
      }
      if (e->state == Entry::State::armed) next = std::min(next, e->deadline_us);
      if (e->state == Entry::State::cancelled) next = std::min(next, e->deadline_us + grace_us);
    }
    next_wake_us_ = next;
    if (next == std::numeric_limits<std::int64_t>::max()) {
      changed_.wait(lock);
    } else {
      changed_.wait_until(lock, at_us(next));
    }
  }
}

void Watchdog::cancel_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cancels_ready_.wait(lock, [this] { return cancels_stopping_ || !cancels_.empty(); });
    if (cancels_stopping_) return;
    const Backend backend = cancels_.front();
    cancels_.pop_front();
    lock.unlock();
    cancel_one(backend);
    lock.lock();
  }
}

// pg_cancel_backend from a connection of the canceller's own (a role may cancel its own
// role's sessions). Its statement is armed like any other, without a cancel of its own.
void Watchdog::cancel_one(const Backend& backend) {
  try {
    pqxx::connection conn(dsn_);
    Guard guard = arm(conn, Backend{}, steady_now_us() + grace_ms_ * 1000);
    pqxx::nontransaction session(conn);
    const std::string sql = "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE pid = " +
                            std::to_string(backend.pid) +
                            " AND (extract(epoch FROM backend_start) * 1000000)::bigint = " +
                            std::to_string(backend.started_us);
    session.exec(sql);
  } catch (const std::exception& e) {
    // The server does not answer, or refuses: the cut follows in grace_ms anyway.
    undelivered_cancels.log(
        LogLevel::info, "stockade.postgres",
        std::string("a cancel request past a call's deadline could not be delivered (") +
            plain_cause(e.what()) + "); the connection is cut instead");
  }
}

Watchdog::Guard::Guard(Guard&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)), entry_(std::move(other.entry_)) {}

Watchdog::Guard& Watchdog::Guard::operator=(Guard&& other) noexcept {
  if (this != &other) {
    disarm();
    owner_ = std::exchange(other.owner_, nullptr);
    entry_ = std::move(other.entry_);
  }
  return *this;
}

Watchdog::Guard::~Guard() {
  disarm();
}

bool Watchdog::Guard::fired() const {
  return entry_ && entry_->fired.load(std::memory_order_acquire);
}

void Watchdog::Guard::disarm() {
  if (owner_ != nullptr && entry_) owner_->release(entry_);
  owner_ = nullptr;
}

CallDeadline::CallDeadline(std::int64_t timeout_ms, std::int64_t since_us)
    : outer_(call_deadline_us) {
  const std::int64_t mine = (since_us != 0 ? since_us : steady_now_us()) + timeout_ms * 1000;
  call_deadline_us = outer_ == 0 ? mine : std::min(outer_, mine);
}

CallDeadline::~CallDeadline() {
  call_deadline_us = outer_;
}

std::int64_t CallDeadline::current() {
  return call_deadline_us;
}

}  // namespace stockade::detail::pg
