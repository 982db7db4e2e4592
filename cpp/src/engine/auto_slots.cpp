// The engine's side of auto's hot-row slots (detail::AutoSlots decides): what a flusher
// reports of a row several writers batch, and what the routing reports of a slotted SKU,
// turned into splits and merges that run on an async worker.
#include "hotrow/auto_slots.hpp"
#include "engine/internal.hpp"
#include "hotrow/slot_router.hpp"
#include "stockade/log.hpp"
#include "store/error_helpers.hpp"

namespace stockade {

// On a flusher's thread: decides cheaply, and leaves the reads and the split to a worker
// (dropped when the workers' queue is full or closed: the next trace asks again).
void Engine::on_row_shared(const SkuKey& row, std::size_t batch, std::optional<Strategy> routed) {
  if (row.slot != 0 || slots_->known_slots(row) > 1) return;  // slotted, and known to be
  auto action = auto_slots_->on_shared(row, batch, steady_now_us());
  if (action == detail::AutoSlots::Action::none) return;
  // Only `auto` splits; any strategy learns a split another engine made.
  const bool split = action == detail::AutoSlots::Action::split && routed == Strategy::automatic;
  bool queued = false;
  try {
    queued = executor().try_submit([this, row, split, batch] { settle_slots(row, split, batch); });
  } catch (const Error&) {  // the engine is closing
  }
  if (!queued) auto_slots_->done(row);
}

void Engine::settle_slots(const SkuKey& key, bool split, std::size_t batch) {
  struct Done {  // however this ends, the SKU may have its next action
    detail::AutoSlots& slots;
    const SkuKey& key;
    ~Done() { slots.done(key); }
  } done{*auto_slots_, key};
  const std::int64_t now = steady_now_us();
  detail::AutoSlotDecision decision{key, 1, false, "", now};
  try {
    decision.slots = slots_->slot_count(key);  // reads the rows; remembers a split
    if (decision.slots > 1) {
      decision.why = "another engine split it into " + std::to_string(decision.slots) +
                     " slots; this one found them when its row was shared";
    } else if (split) {
      const std::int64_t shared_ms = auto_slots_->shared_ms(key, now);
      (void)slots_->set_slots(key, options_.auto_slots_max);
      decision.slots = options_.auto_slots_max;
      decision.split = true;
      decision.why = "its row was shared with another writer for " + std::to_string(shared_ms) +
                     " ms in batches of " + std::to_string(batch) +
                     " requests: several processes took turns at one row lock";
    } else {
      return;
    }
  } catch (const Error& e) {
    // set_slots refuses what slots do not support; anything else (a pool or lock timeout,
    // a lost connection) failed for now, and the next trace of the other writer asks again.
    const ErrorCode c = e.code();
    const bool refused = c == ErrorCode::invalid_state || c == ErrorCode::discontinued ||
                         c == ErrorCode::not_supported || c == ErrorCode::invalid_argument;
    if (!split || !refused) return;
    decision.slots = 1;
    decision.why = std::string("kept on one row: ") + e.what();
  }
  log(LogLevel::info, "stockade.slots",
      detail::outcome_of(decision, detail::describe(key)) + ": " + decision.why);
  auto_slots_->record(std::move(decision));
}

void Engine::on_slotted_routed(const SkuKey& key, bool hot) {
  if (auto_slots_->on_slotted(key, hot, steady_now_us()) != detail::AutoSlots::Action::merge) {
    return;
  }
  bool queued = false;
  try {
    queued = executor().try_submit([this, key] { cool_slots(key); });
  } catch (const Error&) {  // the engine is closing
  }
  if (!queued) auto_slots_->cooled(key);
}

void Engine::cool_slots(const SkuKey& key) {
  struct Done {  // however this ends, the measure starts over
    detail::AutoSlots& slots;
    const SkuKey& key;
    ~Done() { slots.cooled(key); }
  } done{*auto_slots_, key};
  const std::int64_t now = steady_now_us();
  const std::int64_t cool_ms = auto_slots_->cool_ms(key, now);
  detail::AutoSlotDecision decision{key, 1, false, "", now};
  try {
    const int had = slots_->slot_count(key);
    if (had <= 1) return;  // another engine (or a caller) took them away first
    (void)slots_->set_slots(key, 1);
    decision.merged = true;
    decision.why = "none of its requests here ran batched for " + std::to_string(cool_ms) +
                   " ms: its " + std::to_string(had) + " slots were merged back into one row";
  } catch (const Error& e) {
    // A lock or pool timeout, a lost connection: the SKU keeps its slots for now, and the
    // measure starts over.
    log(LogLevel::info, "stockade.slots",
        "auto could not merge the slots of " + detail::describe(key) + " back: " + e.what());
    return;
  }
  log(LogLevel::info, "stockade.slots",
      detail::outcome_of(decision, detail::describe(key)) + ": " + decision.why);
  auto_slots_->record(std::move(decision));
}

}  // namespace stockade
