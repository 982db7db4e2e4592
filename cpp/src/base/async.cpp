#include "stockade/async.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace stockade {

AsyncChannel::AsyncChannel() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (fd_ < 0) {
    throw Error(
        ErrorCode::unavailable,
        std::string("cannot create an eventfd for async completions: ") + std::strerror(errno));
  }
}

AsyncChannel::~AsyncChannel() {
  ::close(fd_);
}

void AsyncChannel::post(std::vector<Completion>& completions) {
  if (completions.empty()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const bool was_empty = ready_.empty();
  if (was_empty) {
    ready_.swap(completions);
  } else {
    for (Completion& c : completions) ready_.push_back(std::move(c));
  }
  completions.clear();
  if (was_empty) {
    // One signal per empty-to-ready edge; drain() resets it under the same lock. An
    // eventfd write only fails when its counter would overflow, which one-per-edge
    // signalling cannot reach.
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(fd_, &one, sizeof(one));
  }
}

std::vector<Completion> AsyncChannel::drain() {
  std::vector<Completion> out;
  std::lock_guard<std::mutex> lock(mutex_);
  out.swap(ready_);
  std::uint64_t count = 0;
  [[maybe_unused]] const ssize_t n = ::read(fd_, &count, sizeof(count));  // EAGAIN if unset
  return out;
}

std::size_t AsyncChannel::waiting() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ready_.size();
}

AsyncExecutor::AsyncExecutor(std::size_t workers, std::size_t queue_max,
                             std::int64_t enqueue_timeout_ms)
    : queue_max_(queue_max), enqueue_timeout_ms_(enqueue_timeout_ms) {
  workers_.reserve(workers);
  for (std::size_t i = 0; i < workers; ++i) workers_.emplace_back([this] { work(); });
}

AsyncExecutor::~AsyncExecutor() {
  close();
}

void AsyncExecutor::submit(std::function<void()> task) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto room = [this] { return closed_ || queue_.size() < queue_max_; };
  if (!has_room_.wait_for(lock, std::chrono::milliseconds(enqueue_timeout_ms_), room)) {
    throw Error(ErrorCode::overloaded, "the async queue is full (" + std::to_string(queue_max_) +
                                           " calls waiting for a worker)");
  }
  if (closed_) throw Error(ErrorCode::unavailable, "the engine is closed");
  queue_.push_back(std::move(task));
  has_work_.notify_one();
}

bool AsyncExecutor::try_submit(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_ || queue_.size() >= queue_max_) return false;
  queue_.push_back(std::move(task));
  has_work_.notify_one();
  return true;
}

void AsyncExecutor::close() {
  std::lock_guard<std::mutex> closing(close_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
  }
  has_work_.notify_all();
  has_room_.notify_all();
  for (std::thread& t : workers_) {
    if (t.joinable()) t.join();
  }
  workers_.clear();
}

void AsyncExecutor::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    has_work_.wait(lock, [this] { return closed_ || !queue_.empty(); });
    if (queue_.empty()) return;  // closed and drained
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    has_room_.notify_one();
    lock.unlock();
    task();  // tasks catch their own errors and post them as completions
    lock.lock();
  }
}

}  // namespace stockade
