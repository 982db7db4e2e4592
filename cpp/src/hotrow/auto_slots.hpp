// Automatic hot-row slots (docs/design.md, section 10): when `auto` splits a SKU.
//
// The measure: the batcher watches the version of the row it batches (batcher.hpp, "a
// short wait when another writer shares the row"). A row whose version moves between two
// of this engine's batches is written by someone else as well; when that goes on for
// `shared_for_ms`, with batches of several requests each, several processes batch one row
// and take turns at its lock, one commit flush per turn: the row, not the CPU, sets the
// pace. Then a SKU's own row becomes `slots_max` rows (set_slots), each process starts on
// its own one, and their batches commit side by side.
//
// What does not split a SKU: one process alone on its row (its batches are whole, and
// slots measured 0.95-1.03x of one row there: docs/benchmarks.md); a writer that comes
// and goes (the row must stay shared, each trace within contention_memory_ms of the last);
// batches of one request. A SKU set_slots refuses (discontinued, leased, with a backorder
// limit or withheld units) stays on one row, and is not asked again for `refused_ms`.
//
// Learning: a replica that has not seen a split still writes the SKU's own row, which the
// replicas that split share with it; so the same signal makes it read the SKU's rows
// (at most once per `recheck_ms` per SKU), and it finds the slots.
//
// Merging back: a SKU this engine knows as slotted, whose requests `auto` has routed here
// without running any of them batched (the contention tracker's mode) for `cool_ms`, has
// cooled: the engine takes its slots away (set_slots(key, 1)). The measure is this
// process's: a replica whose own load on the SKU fell merges it while others may still be
// hot, and they split it again after `shared_for_ms` of sharing its row; so a SKU hot in
// some replicas and cool in others changes at most once per `cool_ms` each way. A SKU
// that gets no request at all here is not measured (nothing to route, nothing to cost).
//
// Bounded: a fixed table of `entries` SKUs by hash (a collision only restarts the
// measure), the same for cooling, and the last `recent_max` decisions.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "stockade/types.hpp"

namespace stockade::detail {

struct AutoSlotsOptions {
  int slots_max = 4;                 // rows a split makes; 1 turns splitting off
  std::int64_t shared_for_ms = 200;  // shared this long, continuously, before a split
  std::int64_t recheck_ms = 100;     // at most one read of a SKU's rows per this long
  std::int64_t refused_ms = 60000;   // a SKU set_slots refused is not asked again for this long
  std::int64_t cool_ms = 60000;  // cool this long (none of its requests batched): merge; 0: never
  std::size_t entries = 256;
};

// What `auto` did about a SKU's slots, for recommend() and stats().
struct AutoSlotDecision {
  SkuKey key;
  int slots = 1;       // what it has now (1: kept on one row, or merged)
  bool split = false;  // false: learned from another replica, refused, or merged
  std::string why;
  std::int64_t at_us = 0;  // steady clock
  bool merged = false;     // this engine took its slots away: it had cooled
};

// What a decision did to `what` (a SKU, or "it"), in words, for the log line and
// recommend(): "auto split it", "learned the slots of it", "auto merged it", ...
std::string outcome_of(const AutoSlotDecision& decision, const std::string& what);

class AutoSlots {
 public:
  enum class Action { none, learn, split, merge };

  explicit AutoSlots(AutoSlotsOptions options);

  const AutoSlotsOptions& options() const { return options_; }

  // The batcher found the SKU's own row `key` changed by another writer since its last
  // batch there, which carried `batch` requests. What to do, off the flusher's thread:
  // nothing; read the SKU's rows (learn a split another replica made); or split it. An
  // action is given once until done(key): one task per SKU at a time.
  Action on_shared(const SkuKey& key, std::size_t batch, std::int64_t now_us);
  void done(const SkuKey& key);
  // A request of the slotted SKU `key` that `auto` routed; `hot`: it runs batched. merge
  // once none has been hot for cool_ms (given once until cooled(key)); else none.
  Action on_slotted(const SkuKey& key, bool hot, std::int64_t now_us);
  void cooled(const SkuKey& key);
  // How long the SKU has been cool, for the log line (0 if not tracked).
  std::int64_t cool_ms(const SkuKey& key, std::int64_t now_us) const;
  // How long the row has been shared, for the log line (0 if not tracked).
  std::int64_t shared_ms(const SkuKey& key, std::int64_t now_us) const;

  // The outcomes of an action, for recommend() and stats().
  void record(AutoSlotDecision decision);
  std::optional<AutoSlotDecision> decision(const SkuKey& key) const;
  std::vector<AutoSlotDecision> recent() const;
  std::uint64_t splits() const;
  std::uint64_t learned() const;
  std::uint64_t refused() const;
  std::uint64_t merges() const;

  static constexpr std::size_t recent_max = 16;

 private:
  struct Entry {
    SkuKey key{"", ""};
    std::int64_t first_us = 0;  // shared, continuously, since
    std::int64_t last_us = 0;   // the last trace of another writer
    std::int64_t next_us = 0;   // no action before this
    bool busy = false;          // an action is under way
  };

  // The table's entry for `key` (by hash; the caller holds mutex_ and checks its key).
  Entry& entry(const SkuKey& key) const;
  // When a request of a SKU whose hash falls in this cell last ran batched (or, if none
  // did, when the measure started; 0: not started). Lock-free: every routed request of a
  // slotted SKU reads it. SKUs that share a cell keep each other hot, never cool.
  std::atomic<std::int64_t>& hot_us(const SkuKey& key) const;

  const AutoSlotsOptions options_;
  mutable std::mutex mutex_;
  mutable std::vector<Entry> entries_;
  mutable std::vector<std::atomic<std::int64_t>> hot_us_;
  std::vector<SkuKey> merging_;  // SKUs whose merge is under way
  std::deque<AutoSlotDecision> recent_;
  std::uint64_t splits_ = 0;
  std::uint64_t learned_ = 0;
  std::uint64_t refused_ = 0;
  std::uint64_t merges_ = 0;
};

// Throws InvalidArgument unless 1 <= slots_max <= slots_max (types.hpp).
void validate_auto_slots_max(int slots);

}  // namespace stockade::detail
