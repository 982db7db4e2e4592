// The engine's counts: row_counts(), stats() (the store's, the telemetry's and the slots')
// and recommend() (the Claim Test's advice for one SKU, with what auto decided for it).
#include "engine/internal.hpp"
#include "hotrow/auto_slots.hpp"
#include "hotrow/slot_router.hpp"

namespace stockade {

StoreCounts Engine::row_counts() const {
  check_process();
  return store_->exact_counts();
}

StoreStats Engine::stats(std::size_t sku_limit) const {
  check_process();
  StoreStats out = telemetry_->snapshot(sku_limit);
  for (SkuStats& sku : out.hottest_skus) {
    const SkuHeat h = tracker_.heat(sku.key);
    sku.mode = h.mode;
    sku.in_flight = h.in_flight;
    sku.peak_in_flight = h.peak_in_flight;
    sku.row_queue = h.row_queue;
    sku.slots = slots_->known_slots(sku.key);
  }
  out.slots.auto_slots_max = options_.auto_slots_max;
  out.slots.auto_splits = auto_slots_->splits();
  out.slots.learned = auto_slots_->learned();
  out.slots.kept = auto_slots_->refused();
  out.slots.auto_merges = auto_slots_->merges();
  const std::int64_t now = steady_now_us();
  for (const detail::AutoSlotDecision& d : auto_slots_->recent()) {
    out.slots.recent.push_back(
        {d.key, d.slots, d.split, d.merged, d.why, static_cast<double>(now - d.at_us) / 1e6});
  }
  out.backend = store_->backend_name();
  const StoreCounts counts = store_->counts();
  out.sku_count = counts.sku_count;
  out.reservation_count = counts.reservation_count;
  out.held_count = counts.held_count;
  out.counts_exact = counts.exact;
  out.pool = store_->pool_stats();
  std::lock_guard<std::mutex> lock(lazy_mutex_);
  if (batcher_) out.batcher.queued = batcher_->queued();
  return out;
}

Advice Engine::recommend(const SkuKey& key) const {
  check_process();
  validate_sku_key(key);
  Advice advice = advise(key, tracker_.heat(key), options_.automatic);
  const int slots = slots_->known_slots(key);
  if (const auto decided = auto_slots_->decision(key)) {
    advice.reasons.push_back("slots: " + detail::outcome_of(*decided, "it") + ": " + decided->why);
  }
  if (slots > 1) {
    advice.reasons.push_back("slots: its units are spread over " + std::to_string(slots) +
                             " rows; this engine reserves and sells on slot " +
                             std::to_string(slots_->home_of(slots)) +
                             " (batched: first on a row whose batcher is idle)");
  } else if (advice.strategy == Strategy::batched) {
    // What this process cannot see is whether others batch the same row: say when it pays.
    advice.reasons.push_back(
        "slots: if several processes batch this SKU at once, their batches take turns at "
        "one row lock, one commit flush each; auto sees that (the row's version moves "
        "between its batches) and splits the SKU into auto_slots_max slots by itself, and "
        "set_slots(k) does it by hand. It pays most where a commit flush is slow against CPU "
        "(network disks, a synchronous standby; docs/scaling-out.md)");
  }
  return advice;
}

}  // namespace stockade
