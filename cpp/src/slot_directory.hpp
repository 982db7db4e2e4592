// The engine's directory of slotted SKUs: how many rows each spreads its units over, as
// this process last saw it. A routing hint only: a SKU missing from it runs on its own
// row, and the first refusal there looks the SKU's rows up (Store::sku_rows) and adds it.
// Bounded by EngineOptions::slot_directory; the oldest entry makes room for a new one.
#pragma once

#include <atomic>
#include <deque>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "stockade/errors.hpp"
#include "stockade/types.hpp"

namespace stockade::detail {

class SlotDirectory {
 public:
  explicit SlotDirectory(std::size_t capacity) : capacity_(capacity) {}

  // The SKU's slot count as last seen, or 1 when it is not known to have slots.
  int get(const SkuKey& key) const {
    if (size_.load(std::memory_order_acquire) == 0) return 1;  // no slotted SKU: no lock
    std::shared_lock<std::shared_mutex> lock(mutex_);
    auto it = slots_.find(key);
    return it == slots_.end() ? 1 : it->second;
  }

  // Records what a read of the SKU's rows found (slots only grow, so a smaller count is
  // an older read and is ignored).
  void put(const SkuKey& key, int slots) {
    if (slots <= 1) return;
    std::unique_lock<std::shared_mutex> lock(mutex_);
    auto it = slots_.find(key);
    if (it != slots_.end()) {
      if (slots > it->second) it->second = slots;
      return;
    }
    if (slots_.size() >= capacity_ && !order_.empty()) {
      slots_.erase(order_.front());
      order_.pop_front();
    }
    slots_.emplace(key, slots);
    order_.push_back(key);
    size_.store(slots_.size(), std::memory_order_release);
  }

 private:
  const std::size_t capacity_;
  std::atomic<std::size_t> size_{0};
  mutable std::shared_mutex mutex_;
  std::unordered_map<SkuKey, int, SkuKeyHash> slots_;
  std::deque<SkuKey> order_;  // insertion order, for eviction
};

// An error about a slot's row, told about its SKU (its location, not the slot's).
Error unslotted(const Error& e, const SkuKey& key);
// A reservation of a slot's row names its SKU (callers never see a slot's location).
void unslot(Reservation& r);

}  // namespace stockade::detail
