#include "stockade/tools/load.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

namespace stockade {
namespace {

using Steady = std::chrono::steady_clock;

struct ClientTally {
  std::vector<double> latencies_us;
  std::uint64_t granted = 0;
  std::uint64_t refused = 0;
  std::uint64_t failed = 0;

  void count(const Error* error) {
    if (error == nullptr) {
      ++granted;
    } else if (error->code() == ErrorCode::out_of_stock) {
      ++refused;
    } else {
      ++failed;
    }
  }
};

// A fresh random idempotency key: 32 hex digits from the client's own generator.
std::optional<std::string> next_key(const LoadSpec& spec, std::mt19937_64& rng) {
  if (!spec.keyed) return std::nullopt;
  static const char* digits = "0123456789abcdef";
  std::string key(32, '0');
  for (int half = 0; half < 2; ++half) {
    std::uint64_t bits = rng();
    for (int i = 0; i < 16; ++i, bits >>= 4) key[half * 16 + i] = digits[bits & 15];
  }
  return key;
}

// The call options of the next request: a random buyer's, when the spec has buyers.
const CallOptions& next_call(const LoadSpec& spec, std::minstd_rand& rng, CallOptions& scratch) {
  if (spec.buyers == 0) return spec.call;
  scratch = spec.call;
  scratch.buyer = "buyer-" + std::to_string(rng() % spec.buyers);
  return scratch;
}

// The call options of the next sell: with a fresh key, when the spec is keyed.
const CallOptions& sell_call(const LoadSpec& spec, std::mt19937_64& key_rng, CallOptions& scratch) {
  if (!spec.keyed) return spec.call;
  scratch = spec.call;
  scratch.idempotency_key = next_key(spec, key_rng);
  return scratch;
}

double micros_since(Steady::time_point start) {
  return std::chrono::duration<double, std::micro>(Steady::now() - start).count();
}

// A client's own completion sink: it wakes the client when any of its requests finish.
class ClientSink final : public CompletionSink {
 public:
  void post(std::vector<Completion>& completions) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Completion& c : completions) done_.push_back(std::move(c));
    completions.clear();
    ready_.notify_one();
  }
  // Waits for at least one completion and takes all that arrived.
  void take(std::vector<Completion>& out) {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [&] { return !done_.empty(); });
    out.swap(done_);
    done_.clear();
  }

 private:
  std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<Completion> done_;
};

// One confirm or release of a client's hold, timed and counted as a request; whether it
// went through.
template <class Call>
bool settle(ClientTally& tally, Call&& call) {
  const auto start = Steady::now();
  bool ok = true;
  try {
    call();
    tally.count(nullptr);
  } catch (const Error& e) {
    tally.count(&e);
    ok = false;
  }
  tally.latencies_us.push_back(micros_since(start));
  return ok;
}

void blocking_client(Engine& engine, const LoadSpec& spec, std::size_t id,
                     const std::atomic<bool>& stop, ClientTally& tally) {
  std::minstd_rand rng(spec.seed + static_cast<std::uint32_t>(id) * 7919u);
  std::mt19937_64 key_rng(std::random_device{}() ^ id);
  std::uniform_int_distribution<std::size_t> pick(0, spec.keys.size() - 1);
  CallOptions scratch;
  while (!stop.load(std::memory_order_relaxed)) {
    auto start = Steady::now();
    std::optional<Uuid> held;
    try {
      const SkuKey& key = spec.keys[pick(rng)];
      if (spec.sell) {
        engine.sell(key, spec.qty, sell_call(spec, key_rng, scratch));
      } else if (!spec.pool.empty()) {
        held = engine
                   .allocate({{key.sku, spec.qty}}, spec.pool, AllocationPolicy::priority,
                             /*split=*/true, spec.ttl_us, next_key(spec, key_rng),
                             next_call(spec, rng, scratch))
                   .front()
                   .id;
      } else {
        held = engine
                   .reserve(key, spec.qty, spec.ttl_us, next_key(spec, key_rng),
                            next_call(spec, rng, scratch))
                   .id;
      }
      tally.count(nullptr);
    } catch (const Error& e) {
      tally.count(&e);
    }
    tally.latencies_us.push_back(micros_since(start));
    if (!spec.confirm || !held) continue;
    const bool part = spec.confirm_qty > 0 && spec.confirm_qty < spec.qty;
    const bool confirmed = settle(tally, [&] {
      engine.confirm(*held, {}, part ? std::optional<Quantity>(spec.confirm_qty) : std::nullopt,
                     spec.release_rest);
    });
    if (confirmed && part && !spec.release_rest) settle(tally, [&] { engine.release(*held); });
  }
}

void windowed_client(Engine& engine, const LoadSpec& spec, std::size_t id,
                     const std::atomic<bool>& stop, ClientTally& tally) {
  std::minstd_rand rng(spec.seed + static_cast<std::uint32_t>(id) * 7919u);
  std::mt19937_64 key_rng(std::random_device{}() ^ id);
  std::uniform_int_distribution<std::size_t> pick(0, spec.keys.size() - 1);
  auto sink = std::make_shared<ClientSink>();
  std::vector<Steady::time_point> started(spec.window);
  std::vector<std::uint64_t> free_tokens;
  for (std::uint64_t t = 0; t < spec.window; ++t) free_tokens.push_back(t);
  std::vector<Completion> done;
  CallOptions scratch;
  std::size_t in_flight = 0;
  while (!stop.load(std::memory_order_relaxed) || in_flight > 0) {
    while (!stop.load(std::memory_order_relaxed) && !free_tokens.empty()) {
      const std::uint64_t token = free_tokens.back();
      started[token] = Steady::now();
      try {
        const SkuKey& key = spec.keys[pick(rng)];
        if (spec.sell) {
          engine.submit_sell(key, spec.qty, sell_call(spec, key_rng, scratch), sink, token);
        } else {
          engine.submit_reserve(key, spec.qty, spec.ttl_us, next_key(spec, key_rng),
                                next_call(spec, rng, scratch), sink, token);
        }
      } catch (const Error& e) {  // could not be queued
        tally.count(&e);
        tally.latencies_us.push_back(micros_since(started[token]));
        continue;
      }
      free_tokens.pop_back();
      ++in_flight;
    }
    if (in_flight == 0) break;
    sink->take(done);
    for (Completion& c : done) {
      tally.count(c.error ? &*c.error : nullptr);
      tally.latencies_us.push_back(micros_since(started[c.token]));
      free_tokens.push_back(c.token);
      --in_flight;
    }
  }
}

double percentile(std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const auto i = static_cast<std::size_t>(p * static_cast<double>(sorted.size() - 1));
  return sorted[i];
}

}  // namespace

LoadResult drive_load(Engine& engine, const LoadSpec& spec) {
  if (spec.keys.empty()) throw_invalid_argument("a load needs at least one sku");
  if (spec.clients < 1 || spec.clients > load_clients_max) {
    throw_invalid_argument("clients must be between 1 and " + std::to_string(load_clients_max));
  }
  if (spec.window < 1 || spec.window > load_window_max) {
    throw_invalid_argument("window must be between 1 and " + std::to_string(load_window_max));
  }
  if (spec.duration_ms < 1) throw_invalid_argument("the load needs a positive duration");
  if (spec.confirm && spec.window != 1) {
    throw_invalid_argument("confirm needs blocking clients (window 1)");
  }
  if (spec.confirm_qty < 0 || (spec.confirm_qty > 0 && !spec.confirm)) {
    throw_invalid_argument("confirm_qty needs confirm, and must not be negative");
  }
  if (!spec.pool.empty() && (spec.window != 1 || spec.sell || spec.confirm)) {
    throw_invalid_argument("an allocating load runs blocking clients, without sells or confirms");
  }
  if (spec.release_rest && spec.confirm_qty == 0) {
    throw_invalid_argument("release_rest needs confirm_qty");
  }
  std::vector<ClientTally> tallies(spec.clients);
  for (ClientTally& t : tallies) t.latencies_us.reserve(1 << 16);
  std::atomic<bool> stop{false};
  std::vector<std::thread> clients;
  const auto start = Steady::now();
  for (std::size_t i = 0; i < spec.clients; ++i) {
    clients.emplace_back([&, i] {
      if (spec.window == 1) {
        blocking_client(engine, spec, i, stop, tallies[i]);
      } else {
        windowed_client(engine, spec, i, stop, tallies[i]);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(spec.duration_ms));
  stop.store(true);
  for (std::thread& t : clients) t.join();
  LoadResult r;
  r.seconds = micros_since(start) / 1e6;
  std::vector<double> all;
  for (ClientTally& t : tallies) {
    r.granted += t.granted;
    r.refused += t.refused;
    r.failed += t.failed;
    all.insert(all.end(), t.latencies_us.begin(), t.latencies_us.end());
  }
  r.requests = r.granted + r.refused + r.failed;
  std::sort(all.begin(), all.end());
  r.p50_us = percentile(all, 0.50);
  r.p90_us = percentile(all, 0.90);
  r.p99_us = percentile(all, 0.99);
  r.p999_us = percentile(all, 0.999);
  r.max_us = all.empty() ? 0 : all.back();
  double sum = 0;
  for (double v : all) sum += v;
  r.mean_us = all.empty() ? 0 : sum / static_cast<double>(all.size());
  return r;
}

}  // namespace stockade
