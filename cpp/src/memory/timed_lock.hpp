// TimedLock: an exclusive lock with try_lock_for, for the pessimistic row locks and the
// advisory lock stripes.
//
// Why not std::timed_mutex: libstdc++ implements its timed wait with
// pthread_mutex_clocklock, which ThreadSanitizer (as shipped with GCC 12) does not
// intercept, so every timed acquisition looks like a bogus "unlock of an unlocked mutex"
// and hides real reports. This lock is a flag guarded by a std::mutex and a condition
// variable: the same semantics (TimedLockable, usable with std::unique_lock), visible to
// the sanitizer. Waiters are woken one at a time; no fairness is promised, as with
// PostgreSQL's row locks under lock_timeout.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace stockade::detail {

class TimedLock {
 public:
  bool try_lock() {
    std::lock_guard<std::mutex> guard(mutex_);
    if (held_) return false;
    held_ = true;
    return true;
  }

  template <class Rep, class Period>
  bool try_lock_for(const std::chrono::duration<Rep, Period>& timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::unique_lock<std::mutex> guard(mutex_);
    if (!released_.wait_until(guard, deadline, [this] { return !held_; })) return false;
    held_ = true;
    return true;
  }

  void lock() {
    std::unique_lock<std::mutex> guard(mutex_);
    released_.wait(guard, [this] { return !held_; });
    held_ = true;
  }

  void unlock() {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      held_ = false;
    }
    released_.notify_one();
  }

 private:
  std::mutex mutex_;
  std::condition_variable released_;
  bool held_ = false;
};

}  // namespace stockade::detail
