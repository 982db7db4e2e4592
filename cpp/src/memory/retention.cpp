// MemoryStore retention: purge() and purging as it goes (MemoryOptions::retention_us).
//
// The rules are Store::purge's. Keys go first, each with its reservations, once every one
// of them is terminal and last changed before the horizon. Then terminal reservations that
// last changed before the horizon, unless their key is still there (a replay must find
// them). Each shard keeps its terminal reservations ordered by time and the store keeps
// its keys in the order they were made, so a purge looks only at what is old, never at
// the whole store.
#include <algorithm>
#include <limits>

#include "memory/memory_store_impl.hpp"

namespace stockade::detail {

// Whether every one of `ids` is terminal and last changed before `horizon` (a missing one
// counts as gone).
bool MemoryStore::all_purgeable(const std::vector<Uuid>& ids, TimestampUs horizon) const {
  for (const Uuid& id : ids) {
    ReservationShard& shard = shard_of(id);
    std::lock_guard<std::mutex> lock(shard.mutex);
    auto it = shard.records.find(id);
    if (it == shard.records.end()) continue;
    const Reservation& r = it->second.value;
    if (r.state == ReservationState::held || r.updated_at_us >= horizon) return false;
  }
  return true;
}

bool MemoryStore::erase_reservation(const Uuid& id) {
  ReservationShard& shard = shard_of(id);
  std::lock_guard<std::mutex> lock(shard.mutex);
  auto it = shard.records.find(id);
  if (it == shard.records.end()) return false;
  shard.terminal_by_time.erase({it->second.value.updated_at_us, id});
  forget_line(it->second.value);  // orders_mutex_ is a leaf lock
  shard.records.erase(it);
  return true;
}

PurgeCounts MemoryStore::purge_keys(TimestampUs horizon, std::uint64_t limit) {
  struct Candidate {
    TimestampUs created;
    std::string key;
    std::vector<Uuid> ids;
  };
  std::vector<Candidate> candidates;
  {
    std::lock_guard<std::mutex> lock(idempotency_mutex_);
    // Keys kept back before (a reservation still held, or changed within the window) are
    // looked at again, at most `limit` of them per call; they wait in a list of their own,
    // so they never stand in front of the keys behind them.
    for (std::size_t again = std::min<std::size_t>(keys_kept_.size(), limit); again > 0; --again) {
      auto [created, key] = std::move(keys_kept_.front());
      keys_kept_.pop_front();
      auto it = idempotency_.find(key);
      if (it == idempotency_.end() || it->second.created_us != created) continue;
      candidates.push_back(Candidate{created, std::move(key), it->second.ids});
    }
    const std::size_t room = candidates.size() + limit;
    while (!keys_by_time_.empty() && keys_by_time_.front().first < horizon &&
           candidates.size() < room) {
      auto [created, key] = std::move(keys_by_time_.front());
      keys_by_time_.pop_front();
      auto it = idempotency_.find(key);
      // Gone (its request failed), or made again since: this entry is stale.
      if (it == idempotency_.end() || it->second.created_us != created) continue;
      candidates.push_back(Candidate{created, std::move(key), it->second.ids});
    }
  }
  // Reservations are looked at without idempotency_mutex_ (lock order: shard first).
  std::vector<bool> purgeable(candidates.size());
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    purgeable[i] = all_purgeable(candidates[i].ids, horizon);
  }
  PurgeCounts out;
  std::vector<Uuid> doomed;
  {
    std::lock_guard<std::mutex> lock(idempotency_mutex_);
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      Candidate& c = candidates[i];
      auto it = idempotency_.find(c.key);
      if (it == idempotency_.end() || it->second.created_us != c.created) continue;
      if (!purgeable[i] || it->second.pending || out.keys >= limit) {
        keys_kept_.emplace_back(c.created, std::move(c.key));  // looked at again later
        continue;
      }
      idempotency_.erase(it);
      ++out.keys;
      doomed.insert(doomed.end(), c.ids.begin(), c.ids.end());
    }
  }
  // The key is gone, so no replay can reach these any more (one that read the key just
  // before finds them missing and runs afresh, as a request after the purge would).
  for (const Uuid& id : doomed) {
    if (erase_reservation(id)) ++out.reservations;
  }
  return out;
}

std::uint64_t MemoryStore::purge_reservations(TimestampUs horizon, std::uint64_t limit) {
  std::uint64_t erased = 0;
  std::uint64_t examined = 0;  // bounds the work when old rows are kept by their keys
  const std::size_t first = purge_cursor_.fetch_add(1, std::memory_order_relaxed);
  for (std::size_t n = 0; n < reservation_shards && examined < limit; ++n) {
    ReservationShard& shard = (*reservations_)[(first + n) % reservation_shards];
    std::lock_guard<std::mutex> lock(shard.mutex);
    auto it = shard.terminal_by_time.begin();
    while (it != shard.terminal_by_time.end() && it->first < horizon && examined < limit) {
      ++examined;
      auto record = shard.records.find(it->second);
      if (record != shard.records.end() && record->second.value.idempotency_key) {
        std::lock_guard<std::mutex> keys(idempotency_mutex_);
        if (idempotency_.count(*record->second.value.idempotency_key) != 0) {
          ++it;  // its key can still replay it
          continue;
        }
      }
      if (record != shard.records.end()) {
        forget_line(record->second.value);  // orders_mutex_ is a leaf lock
        shard.records.erase(record);
        ++erased;
      }
      it = shard.terminal_by_time.erase(it);
    }
  }
  return erased;
}

std::uint64_t MemoryStore::purge_transfers(TimestampUs horizon, std::uint64_t limit) {
  std::uint64_t erased = 0;
  std::lock_guard<std::mutex> guard(transfers_mutex_);
  while (!finished_transfers_.empty() && finished_transfers_.begin()->first < horizon &&
         erased < limit) {
    transfers_.erase(finished_transfers_.begin()->second);
    finished_transfers_.erase(finished_transfers_.begin());
    ++erased;
  }
  return erased;
}

PurgeCounts MemoryStore::purge(std::int64_t older_than_us, std::uint64_t limit) {
  const TimestampUs now = clock_->now_us();  // a ManualClock may be far before 1970
  const TimestampUs horizon = now < std::numeric_limits<TimestampUs>::min() + older_than_us
                                  ? std::numeric_limits<TimestampUs>::min()
                                  : now - older_than_us;
  PurgeCounts out = purge_keys(horizon, limit);
  if (out.keys < limit) out.reservations += purge_reservations(horizon, limit - out.keys);
  if (out.keys + out.reservations < limit) {
    out.transfers = purge_transfers(horizon, limit - out.keys - out.reservations);
  }
  telemetry().purged(out);
  return out;
}

void MemoryStore::purge_as_you_go() {
  if (options_.retention_us <= 0 && options_.journal_retention_us <= 0) return;
  if ((reservations_made_.fetch_add(1, std::memory_order_relaxed) & 63) != 63) return;
  if (options_.retention_us > 0) purge(options_.retention_us, 256);
  if (options_.journal_retention_us > 0) {
    journal_->purge(options_.journal_retention_us, options_.feed_lag_max_us, 256);
  }
}

}  // namespace stockade::detail
