// AutoSlots (auto_slots.hpp): when `auto` splits a SKU into hot-row slots.
#include "hotrow/auto_slots.hpp"

#include <algorithm>

#include "stockade/batcher.hpp"
#include "stockade/errors.hpp"
#include "stockade/hash.hpp"

namespace stockade::detail {

void validate_auto_slots_max(int slots) {
  if (slots < 1 || slots > stockade::slots_max) {
    throw_invalid_argument("auto_slots_max must be between 1 (no automatic slots) and " +
                           std::to_string(stockade::slots_max));
  }
}

std::string outcome_of(const AutoSlotDecision& decision, const std::string& what) {
  if (decision.split) return "auto split " + what;
  if (decision.merged) return "auto merged the slots of " + what + " back";
  return (decision.slots > 1 ? "learned the slots of " : "auto did not split ") + what;
}

AutoSlots::AutoSlots(AutoSlotsOptions options)
    : options_(options),
      entries_(std::max<std::size_t>(1, options.entries)),
      hot_us_(std::max<std::size_t>(1, options.entries)) {}

AutoSlots::Entry& AutoSlots::entry(const SkuKey& key) const {
  return entries_[SkuKeyHash{}(key) % entries_.size()];
}

std::atomic<std::int64_t>& AutoSlots::hot_us(const SkuKey& key) const {
  return hot_us_[SkuKeyHash{}(key) % hot_us_.size()];
}

AutoSlots::Action AutoSlots::on_slotted(const SkuKey& key, bool hot, std::int64_t now_us) {
  if (options_.cool_ms <= 0) return Action::none;
  std::atomic<std::int64_t>& last = hot_us(key);
  const std::int64_t seen = last.load(std::memory_order_relaxed);
  if (hot || seen == 0) {
    // At most one store per millisecond per cell: hot requests do not fight over it.
    if (now_us - seen > 1000) last.store(now_us, std::memory_order_relaxed);
    return Action::none;
  }
  if (now_us - seen < options_.cool_ms * 1000) return Action::none;
  std::lock_guard<std::mutex> lock(mutex_);
  if (std::find(merging_.begin(), merging_.end(), key) != merging_.end()) return Action::none;
  merging_.push_back(key);
  return Action::merge;
}

void AutoSlots::cooled(const SkuKey& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  merging_.erase(std::remove(merging_.begin(), merging_.end(), key), merging_.end());
  hot_us(key).store(0, std::memory_order_relaxed);  // the next measure starts over
}

std::int64_t AutoSlots::cool_ms(const SkuKey& key, std::int64_t now_us) const {
  const std::int64_t seen = hot_us(key).load(std::memory_order_relaxed);
  return seen == 0 ? 0 : (now_us - seen) / 1000;
}

AutoSlots::Action AutoSlots::on_shared(const SkuKey& key, std::size_t batch, std::int64_t now_us) {
  std::lock_guard<std::mutex> lock(mutex_);
  Entry& e = entry(key);
  const bool continued = e.key == key && now_us - e.last_us <= contention_memory_ms * 1000;
  if (e.key != key) {
    e.key = key;
    e.next_us = 0;
    e.busy = false;  // another SKU's task, if any, ends in done(), which then finds no match
  }
  if (!continued) e.first_us = now_us;
  e.last_us = now_us;
  if (e.busy || now_us < e.next_us) return Action::none;
  e.next_us = now_us + options_.recheck_ms * 1000;
  e.busy = true;
  const bool long_enough = now_us - e.first_us >= options_.shared_for_ms * 1000;
  return options_.slots_max > 1 && long_enough && batch >= 2 ? Action::split : Action::learn;
}

void AutoSlots::done(const SkuKey& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  Entry& e = entry(key);
  if (e.key == key) e.busy = false;
}

std::int64_t AutoSlots::shared_ms(const SkuKey& key, std::int64_t now_us) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Entry& e = entry(key);
  return e.key == key ? (now_us - e.first_us) / 1000 : 0;
}

void AutoSlots::record(AutoSlotDecision decision) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (decision.split) {
    ++splits_;
  } else if (decision.merged) {
    ++merges_;
  } else if (decision.slots > 1) {
    ++learned_;
  } else {
    ++refused_;
    Entry& e = entry(decision.key);
    if (e.key == decision.key) e.next_us = decision.at_us + options_.refused_ms * 1000;
  }
  for (auto it = recent_.begin(); it != recent_.end(); ++it) {
    if (it->key == decision.key) {
      recent_.erase(it);
      break;
    }
  }
  recent_.push_back(std::move(decision));
  if (recent_.size() > recent_max) recent_.pop_front();
}

std::optional<AutoSlotDecision> AutoSlots::decision(const SkuKey& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const AutoSlotDecision& d : recent_) {
    if (d.key == key) return d;
  }
  return std::nullopt;
}

std::vector<AutoSlotDecision> AutoSlots::recent() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {recent_.begin(), recent_.end()};
}

std::uint64_t AutoSlots::splits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return splits_;
}

std::uint64_t AutoSlots::learned() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return learned_;
}

std::uint64_t AutoSlots::refused() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return refused_;
}

std::uint64_t AutoSlots::merges() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return merges_;
}

}  // namespace stockade::detail
