#include "base/backoff.hpp"

#include <algorithm>
#include <chrono>
#include <random>

namespace stockade::detail {

void sleep_full_jitter(int attempt, std::int64_t base_us, std::int64_t cap_us) {
  // Jitter needs spread, not secrecy: a per-thread PRNG seeded once is enough.
  thread_local std::minstd_rand rng{std::random_device{}()};
  const int shift = std::min(attempt, 20);
  const std::int64_t ceiling = std::min(cap_us, base_us << shift);
  if (ceiling <= 0) return;
  std::uniform_int_distribution<std::int64_t> pick(0, ceiling - 1);
  std::this_thread::sleep_for(std::chrono::microseconds(pick(rng)));
}

}  // namespace stockade::detail
