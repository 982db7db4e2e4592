// The engine's directory of slotted SKUs: how many rows each spreads its units over (and
// how many of them take new reserves), as this process last saw it. A routing hint only: a SKU
// missing from it runs on its own row, and the first refusal there looks the SKU's rows up
// (Store::sku_rows) and adds it. Bounded by EngineOptions::slot_directory; the oldest entry makes
// room for a new one.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "stockade/errors.hpp"
#include "stockade/types.hpp"

namespace stockade::detail {

class SlotDirectory {
 public:
  explicit SlotDirectory(std::size_t capacity) : capacity_(capacity) {}

  // The SKU's active slot count as last seen (StockLevel::active_slots), or 1 when it is
  // not known to have slots.
  int get(const SkuKey& key) const { return find(key).active; }
  // How many rows it has, retired slots included (1 when not known to have more).
  int rows(const SkuKey& key) const { return find(key).rows; }

  // Records what a read of the SKU's rows found: `active` of its `rows` take new reserves,
  // as of version `version` of its own row. Slots can be taken away, so counts are
  // ordered by that version (a new split or merge moves it): an older read is ignored.
  void put(const SkuKey& key, int active, int rows, Version version) {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    auto it = slots_.find(key);
    if (it != slots_.end()) {
      if (version >= it->second.version) it->second = Entry{active, rows, version};
      return;
    }
    if (rows <= 1) return;  // never slotted: nothing to remember
    if (slots_.size() >= capacity_ && !order_.empty()) {
      slots_.erase(order_.front());
      order_.pop_front();
    }
    slots_.emplace(key, Entry{active, rows, version});
    order_.push_back(key);
    size_.store(slots_.size(), std::memory_order_release);
  }

 private:
  struct Entry {
    int active = 1;
    int rows = 1;
    Version version = 0;
  };
  Entry find(const SkuKey& key) const {
    if (size_.load(std::memory_order_acquire) == 0) return {};  // no slotted SKU: no lock
    std::shared_lock<std::shared_mutex> lock(mutex_);
    auto it = slots_.find(key);
    return it == slots_.end() ? Entry{} : it->second;
  }

  const std::size_t capacity_;
  std::atomic<std::size_t> size_{0};
  mutable std::shared_mutex mutex_;
  std::unordered_map<SkuKey, Entry, SkuKeyHash> slots_;
  std::deque<SkuKey> order_;  // insertion order, for eviction
};

// Shared reads of a SKU's rows after refusals. A refusal on a row is the SKU's when the
// SKU has no other rows, or when its rows together were short: a snapshot of them taken
// *after* the refusal shows either (rows are never removed: taking slots away retires
// them). Refusals come in floods (a sold-out
// hot SKU), so the callers refused at about the same time share one such read: each waits
// for a read that began after its call did, or starts one. And a read that found the own
// row alone at version V proves, without another read, every later refusal decided at V
// (slot rows appear only together with a new version of the own row). A fixed table of
// entries (by the key's hash) bounds the memory; a collision only makes callers wait.
class SlotProbes {
 public:
  explicit SlotProbes(std::size_t entries) {
    for (std::size_t i = 0; i < entries; ++i) entries_.push_back(std::make_unique<Entry>());
  }

  // The SKU's rows from a read (`read`, one snapshot) that started after this call
  // began; or none at all (empty) when a read found the own row alone at `refused_at`.
  std::vector<StockLevel> rows_after(const SkuKey& key, std::optional<Version> refused_at,
                                     const std::function<std::vector<StockLevel>()>& read) {
    Entry& e = *entries_[SkuKeyHash{}(key) % entries_.size()];
    const std::uint64_t called = clock_.fetch_add(1, std::memory_order_acq_rel) + 1;
    std::unique_lock<std::mutex> lock(e.mutex);
    for (;;) {
      if (refused_at && e.alone_key == key && e.alone_at == *refused_at) return {};
      if (e.key == key && e.done_started > called) return e.rows;
      if (e.busy) {  // a read runs: wait for it (ours if it started after us, else its end)
        e.done.wait(lock);
        continue;
      }
      e.busy = true;
      e.key = key;
      e.started = clock_.fetch_add(1, std::memory_order_acq_rel) + 1;
      lock.unlock();
      std::vector<StockLevel> found;
      try {
        found = read();
      } catch (...) {
        lock.lock();
        e.busy = false;
        e.done.notify_all();
        throw;
      }
      lock.lock();
      e.busy = false;
      e.done_started = e.started;
      e.rows = found;
      if (found.size() == 1) {
        e.alone_key = key;
        e.alone_at = found.front().version;
      }
      e.done.notify_all();
      return found;
    }
  }

 private:
  struct Entry {
    std::mutex mutex;
    std::condition_variable done;
    SkuKey key{"", ""};
    bool busy = false;
    std::uint64_t started = 0;       // of the read running now
    std::uint64_t done_started = 0;  // of the last read that finished
    std::vector<StockLevel> rows;    // what it found
    SkuKey alone_key{"", ""};        // a SKU a read found without slot rows,
    Version alone_at = 0;            // and its own row's version then
  };
  std::atomic<std::uint64_t> clock_{0};
  std::vector<std::unique_ptr<Entry>> entries_;
};

}  // namespace stockade::detail
