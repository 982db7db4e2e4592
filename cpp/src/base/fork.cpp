#include "base/fork.hpp"

#include <pthread.h>

#include <atomic>

namespace stockade::detail {
namespace {

std::atomic<std::uint64_t> generation{0};

void count_fork_in_child() {
  generation.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

std::uint64_t fork_generation() noexcept {
  static const bool registered = pthread_atfork(nullptr, nullptr, &count_fork_in_child) == 0;
  (void)registered;
  return generation.load(std::memory_order_relaxed);
}

}  // namespace stockade::detail
