// Waiting politely: short spins for latches held for nanoseconds, and exponential backoff
// with full jitter for retries, so that colliding writers spread out instead of colliding
// again in lockstep.
#pragma once

#include <cstdint>
#include <thread>

namespace stockade::detail {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spin a little, then yield the core: on a 2-core machine with hundreds of threads, a
// latch holder that was preempted needs the core back more than we need to spin.
class SpinWait {
 public:
  void once() {
    if (rounds_ < spin_rounds_max) {
      for (std::uint32_t i = 0; i < (1u << rounds_); ++i) cpu_relax();
    } else {
      std::this_thread::yield();
    }
    ++rounds_;
  }
  std::uint32_t rounds() const { return rounds_; }

 private:
  static constexpr std::uint32_t spin_rounds_max = 6;
  std::uint32_t rounds_ = 0;
};

// Sleeps a uniformly random time in [0, min(cap_us, base_us * 2^attempt)).
void sleep_full_jitter(int attempt, std::int64_t base_us, std::int64_t cap_us);

}  // namespace stockade::detail
