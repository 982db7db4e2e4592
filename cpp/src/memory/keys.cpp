// MemoryStore: idempotency keys. A reserve's key keeps the ids of its reservations, read
// back on a replay; any other write's key keeps its outcome (store/keyed.hpp).
#include "memory/memory_store_impl.hpp"
#include "store/error_helpers.hpp"
#include "store/keyed.hpp"

namespace stockade::detail {

// The first request with a key claims it (a pending entry) and runs; a concurrent
// duplicate waits for it (at most `wait_ms`) and then replays; a later duplicate replays
// at once. A key whose first request failed is free again, so a retry after OutOfStock
// runs afresh. Returns the entry found done (to replay), or nothing when this call claimed
// the key. Another request's key raises IdempotencyConflict through `conflict`, with the
// entry as found.
std::optional<MemoryStore::IdempotencyEntry> MemoryStore::claim_key(
    const std::string& key, const std::string& fingerprint, std::int64_t wait_ms,
    const std::function<void(const IdempotencyEntry&)>& conflict) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  std::unique_lock<std::mutex> lock(idempotency_mutex_);
  for (;;) {
    auto it = idempotency_.find(key);
    if (it == idempotency_.end()) {
      const TimestampUs now = clock_->now_us();
      idempotency_.emplace(key, IdempotencyEntry{fingerprint, {}, true, now, {}});
      keys_by_time_.emplace_back(now, key);
      return std::nullopt;
    }
    if (it->second.fingerprint != fingerprint) {
      const IdempotencyEntry found = it->second;
      lock.unlock();
      conflict(found);
      throw keyed_conflict(key, found.fingerprint, fingerprint);
    }
    if (!it->second.pending) return it->second;
    if (idempotency_done_.wait_until(lock, deadline) == std::cv_status::timeout) {
      throw Error(ErrorCode::lock_timeout,
                  "a request with idempotency key " + shown(key) + " is still in flight");
    }
  }
}

void MemoryStore::free_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(idempotency_mutex_);
  idempotency_.erase(key);
  idempotency_done_.notify_all();
}

void MemoryStore::settle_key(const std::string& key, std::vector<Uuid> ids, std::string outcome) {
  std::lock_guard<std::mutex> lock(idempotency_mutex_);
  IdempotencyEntry& entry = idempotency_.at(key);
  entry.ids = std::move(ids);
  entry.outcome = std::move(outcome);
  entry.pending = false;
  idempotency_done_.notify_all();
}

std::vector<Reservation> MemoryStore::with_idempotency(
    const std::string& key, const std::string& fingerprint, const Asked& asked,
    const WriteOptions& options, const std::function<std::vector<Reservation>()>& run) {
  for (;;) {
    const auto conflict = [&](const IdempotencyEntry& found) {
      if (found.pending || !reserves(found.fingerprint)) return;  // keyed_conflict says it
      std::vector<Reservation> made;
      try {
        made = fetch_all(found.ids);
      } catch (const Error& e) {
        if (e.code() != ErrorCode::not_found) throw;  // purged meanwhile: say no more
        throw idempotency_conflict(key);
      }
      throw idempotency_conflict(key, asked_by(made, found.fingerprint), asked);
    };
    const std::optional<IdempotencyEntry> done =
        claim_key(key, fingerprint, options.lock_timeout_ms, conflict);
    if (done) {
      try {
        return fetch_all(done->ids);
      } catch (const Error& e) {
        // A purge took the key, then its reservations, after we read it: the key is
        // gone, so this request runs afresh, as it would have a moment later.
        if (e.code() != ErrorCode::not_found) throw;
      }
      continue;
    }
    std::vector<Reservation> result;
    try {
      result = run();
    } catch (...) {
      free_key(key);
      throw;
    }
    std::vector<Uuid> ids;
    for (const auto& r : result) ids.push_back(r.id);
    settle_key(key, std::move(ids), {});
    return result;
  }
}

}  // namespace stockade::detail
