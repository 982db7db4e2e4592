// Benchmark: the per-request strategies of the memory store, side by side, driven from C++.
//
// One hot SKU (every thread reserves from one row) and many cold SKUs (each request picks
// one of `skus` rows at random), for each strategy, in one run, so the ratios compare
// like with like on a noisy machine. Each reservation creates its record, as in use.
// Prints reservations/s, p50/p99 latency and each strategy's ratio to atomic.
//
//   stockade_bench_memory [threads=4] [seconds_per_case=1.0] [cold_skus=10000]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "stockade/engine.hpp"
#include "stockade/errors.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using stockade::Strategy;

struct Result {
  double per_second = 0;
  double p50_us = 0;
  double p99_us = 0;
  std::uint64_t conflicts = 0;
};

Result run_case(Strategy strategy, int threads, double seconds, int skus) {
  auto engine = stockade::Engine::memory();
  std::vector<stockade::SkuKey> keys;
  for (int i = 0; i < skus; ++i) {
    keys.push_back({"sku-" + std::to_string(i), "default"});
    engine->restock(keys.back(), 1'000'000'000);
  }
  stockade::CallOptions call;
  call.strategy = strategy;
  std::atomic<bool> go{false}, stop{false};
  std::vector<std::vector<double>> latencies(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::minstd_rand rng(static_cast<unsigned>(t) + 1);
      std::uniform_int_distribution<int> pick(0, skus - 1);
      auto& mine = latencies[t];
      mine.reserve(1 << 20);
      while (!go.load()) std::this_thread::yield();
      while (!stop.load(std::memory_order_relaxed)) {
        const auto start = Clock::now();
        try {
          engine->reserve(keys[pick(rng)], 1, {}, {}, call);
        } catch (const stockade::Error& e) {
          if (e.code() != stockade::ErrorCode::retries_exhausted) throw;
        }
        mine.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
      }
    });
  }
  const auto begin = Clock::now();
  go.store(true);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop.store(true);
  for (auto& t : pool) t.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - begin).count();
  std::vector<double> all;
  for (auto& v : latencies) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  Result r;
  r.per_second = static_cast<double>(all.size()) / elapsed;
  r.p50_us = all.empty() ? 0 : all[all.size() / 2];
  r.p99_us = all.empty() ? 0 : all[std::min(all.size() - 1, all.size() * 99 / 100)];
  r.conflicts = engine->stats().strategies[static_cast<std::size_t>(strategy)].conflicts;
  return r;
}

void run_table(const char* title, int threads, double seconds, int skus) {
  std::printf("\n%s: %d threads, %d SKU(s), %.1f s per strategy\n", title, threads, skus, seconds);
  std::printf("%-12s %14s %9s %9s %11s %10s\n", "strategy", "reservations/s", "p50 us", "p99 us",
              "conflicts", "vs atomic");
  double atomic_rate = 0;
  for (Strategy s :
       {Strategy::atomic, Strategy::pessimistic, Strategy::advisory, Strategy::optimistic}) {
    const Result r = run_case(s, threads, seconds, skus);
    if (s == Strategy::atomic) atomic_rate = r.per_second;
    std::printf("%-12s %14.0f %9.2f %9.2f %11llu %9.2fx\n", stockade::strategy_name(s),
                r.per_second, r.p50_us, r.p99_us, static_cast<unsigned long long>(r.conflicts),
                r.per_second / atomic_rate);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 4;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 1.0;
  const int cold_skus = argc > 3 ? std::atoi(argv[3]) : 10000;
  if (threads < 1 || threads > 1024 || seconds <= 0 || seconds > 600 || cold_skus < 1) {
    std::fprintf(stderr, "usage: %s [threads 1..1024] [seconds 0..600] [cold_skus >= 1]\n",
                 argv[0]);
    return 2;
  }
  std::printf("stockade memory store, per-request strategies (C++ driver)\n");
  run_table("hot SKU", threads, seconds, 1);
  run_table("cold SKUs, uniform", threads, seconds, cold_skus);
  return 0;
}
