// Hot-row slots, above the stores (docs/design.md, section 10): the SlotRouter.
//
// A slotted SKU keeps its units in its own row and in slot rows of `stock`, each an
// ordinary row (types.hpp: slot_key), so every store path, invariant, lock order, batch,
// transition and expiry works on them unchanged and no row can oversell. The router
// decides what is new: where a reserve or sell goes (this engine's home slot), what
// happens when that slot is short (free units move into it from the SKU's other rows, all
// locked in key order, in one transaction that also decides whether the SKU as a whole
// has them), and the SKU-level answers (stock() sums the rows; restock and set_on_hand
// spread over them; If-Match names the sum of the rows' versions).
//
// The engine calls the router, never the other way: a call that runs on a slot hands the
// router two callables, one that runs an attempt on a row and one that records the call's
// outcome when the call ends inside the router.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "hotrow/slot_directory.hpp"
#include "stockade/async.hpp"
#include "stockade/store.hpp"

namespace stockade::detail {

// A reservation of a slot's row names its SKU (callers never see a slot; an error about a
// slot's row names its SKU already: the slot is in neither its context nor its message).
void unslot(Reservation& r);

// What one attempt of a slotted call carries besides its row: the version the row must
// have (If-Match on the row, after the router has checked the SKU's summed version), and
// whether the attempt counts the request and records an OutOfStock (see SlotRouter::run).
struct SlotAttempt {
  std::optional<Version> expected_version;
  bool count_request = true;
  bool count_refusal = true;
};

// A refused request frees lapsed holds at most this often per engine (SlotRouter), and at
// most this many per check.
inline constexpr std::int64_t lapsed_check_gap_us = 10'000;
inline constexpr std::size_t lapsed_check_batch = 1000;

struct SlotRouterOptions {
  int home = 0;                     // this engine's slot of every slotted SKU (mod its slots)
  std::size_t directory = 4096;     // slotted SKUs remembered (SlotDirectory)
  std::size_t probe_entries = 256;  // entries of the shared refusal reads (SlotProbes)
  std::int64_t lock_timeout_ms = 10000;
  int retries_max = 5;  // rounds of moving units into the slot: max(2, retries_max + 1)
};

class SlotRouter {
 public:
  // Which of a slotted SKU's `slots` rows a batched reserve or sell tries first, given
  // this engine's `home` slot (the batcher's pick_slot: a row whose flusher is idle).
  using SlotChooser = std::function<int(const SkuKey& key, int slots, int home)>;

  SlotRouter(Store& store, SlotRouterOptions options);
  // Set once, before the router is used; without it every call starts on the home slot.
  void choose_slots_with(SlotChooser chooser) { chooser_ = std::move(chooser); }

  // How many rows the SKU spreads its units over, as this process last saw (1: not known
  // to be slotted), and this engine's slot among `slots`.
  int known_slots(const SkuKey& key) const { return directory_.get(key); }
  int home_of(int slots) const { return options_.home % slots; }
  // The row a reserve or sell of `key` goes to first: this engine's slot, if known; with
  // `spread` (a batched call), the row the chooser picks, so that a process's batches on
  // one SKU are in flight on several rows at once.
  SkuKey first_row(const SkuKey& key, bool spread) const;

  // Reads the SKU's rows (remembering how many there are).
  std::vector<StockLevel> learn(const SkuKey& key);
  // The SKU's summed level (NotFound when it has no row).
  StockLevel stock(const SkuKey& key);
  // How many of the SKU's rows take new reserves (its active slots), read now.
  int slot_count(const SkuKey& key);
  // set_slots: spreads the SKU's free units over `slots` rows, adding rows or retiring
  // those past `slots` (taking slots away).
  StockLevel set_slots(const SkuKey& key, int slots);
  // Restock and set_on_hand of the SKU as a whole: the store's own call on a SKU with
  // one row, else spread over its rows.
  // A keyed restock of a SKU with slots adds its units to the SKU's own row (its key and
  // outcome with that row's write) and answers with the SKU's level as it is then; a
  // keyed set_on_hand there raises NotSupported (it writes every row).
  StockLevel restock(const SkuKey& key, Quantity qty, const std::optional<Version>& expected,
                     const std::optional<FencingToken>& token,
                     const std::optional<std::string>& idempotency_key);
  StockLevel set_on_hand(const SkuKey& key, Quantity on_hand,
                         const std::optional<Version>& expected,
                         const std::optional<FencingToken>& token,
                         const std::optional<std::string>& idempotency_key);
  // discontinue and reinstate, on every row of the SKU at once.
  StockLevel set_tombstone(const SkuKey& key, bool discontinued,
                           const std::optional<Version>& expected,
                           const std::optional<FencingToken>& token);
  // Raises NotSupported when the SKU has slots: `feature` is not built for them.
  void refuse_on_slots(const SkuKey& key, const char* feature);
  // After a sell on one of the SKU's rows: the SKU's level (summed when it has slots).
  StockLevel level_after_sell(const SkuKey& key, StockLevel row_level);
  // After a write that committed on one row of a slotted SKU: the SKU's level, read now,
  // or the row's own level (keyed as the SKU) if that read fails.
  StockLevel summed_or(const SkuKey& key, const StockLevel& row_level);

  // Runs `attempt(row, SlotAttempt)` on this engine's slot of `key` (the SKU's own row
  // while it is not known to have slots; with `spread` and no `expected`, first on the
  // row first_row() picks). When that row is short, the SKU's rows are
  // read: with none but its own, the refusal stands; else free units move into the slot
  // from the others (which refuses for the SKU as a whole when they are short too) and
  // the attempt runs again, a bounded number of times. Before the first refusal stands,
  // lapsed holds are freed (freed_lapsed_holds): if some were, the attempt runs again in
  // the same round. With `expected` (If-Match: the sum
  // of the rows' versions), the rows are checked and filled first, and the attempt takes
  // the slot's own version after that.
  //
  // The call is counted once, however many attempts it takes: the first attempt counts
  // the request per SKU (unless `continued`: an async call's first attempt did), and an
  // attempt's OutOfStock is left unrecorded (count_refusal false), since it may not stand.
  // Whatever ends the call records it: an attempt that succeeds or fails otherwise, or
  // `record(error, request_counted)` when the call ends here (a refusal that stands,
  // Overloaded, an error while moving units).
  template <class Result, class Attempt, class Record>
  Result run(const SkuKey& key, Quantity qty, const std::optional<Version>& expected,
             bool continued, bool spread, Attempt&& attempt, Record&& record) {
    bool request_counted = continued;
    int k = known_slots(key);
    std::optional<Version> row_expected = expected;
    if (expected) {
      try {
        k = check_and_fill(key, qty, *expected, &row_expected);
      } catch (const Error& e) {
        record(e, request_counted);
        throw;
      }
    }
    bool lapsed_tried = false;
    for (int round = 1;; ++round) {
      std::optional<Error> refusal;
      try {
        SlotAttempt a{row_expected, !request_counted, expected.has_value()};
        request_counted = true;
        // Later rounds go home: the units moved there (after_refusal).
        const bool pick = round == 1 && spread && !expected;
        return attempt(k <= 1 ? key : pick ? first_row(key, true) : slot_key(key, home_of(k)), a);
      } catch (const Error& e) {
        if (e.code() != ErrorCode::out_of_stock || expected) throw;
        refusal = e;
      }
      if (!lapsed_tried) {
        lapsed_tried = true;
        if (freed_lapsed_holds()) {
          --round;  // the same round again: the lapsed holds' units are back
          continue;
        }
      }
      try {
        k = after_refusal(key, qty, *refusal, k, round);
      } catch (const Error& e) {
        record(e, request_counted);
        throw;
      }
    }
  }

  // An async call's first attempt, on this engine's slot, was refused: whether that
  // refusal is the SKU's (it has no other rows, and no lapsed holds were freed). An
  // error reading the rows propagates.
  bool refusal_stands(const SkuKey& key, const Error& refusal);
  // A request was refused for want of units: frees lapsed holds (Store::free_lapsed, a
  // no-op when the store's sweeper is off), at most once per lapsed_check_gap_us in this
  // engine, so that the refusals of a sold-out SKU do not each cost a sweep. True when
  // it freed some: the request should run again. An error freeing them is logged at
  // DEBUG and leaves the refusal as it was.
  bool freed_lapsed_holds();
  // An order's line was refused on the SKU's own row (`refusal` names it): moves units
  // into that row from the SKU's slots so that the order may run again. Throws when the
  // refusal stands (no slots, or they are short too).
  void refill_order_line(const std::vector<OrderLine>& lines, const Error& refusal);
  // A resize of a hold on `row` was refused there: moves `qty` free units into that row
  // from the SKU's other rows. Throws `refusal` when it stands (no slots, a retired row,
  // or the SKU is short too).
  void refill_row(const SkuKey& row, Quantity qty, const Error& refusal);
  // How many rounds a call may take before it gives up as Overloaded.
  int rounds() const { return std::max(2, options_.retries_max + 1); }

 private:
  // If-Match on a slotted call: checks the SKU's summed version against `expected` and
  // fills this engine's slot; returns the slot count and sets the slot's own version.
  int check_and_fill(const SkuKey& key, Quantity qty, Version expected,
                     std::optional<Version>* row_expected);
  // After the attempt of `round` was refused on its row: returns the slot count for the
  // next attempt, having moved units into this engine's slot; throws what ends the call.
  int after_refusal(const SkuKey& key, Quantity qty, const Error& refusal, int k, int round);
  std::vector<StockLevel> rows_after_refusal(const SkuKey& key, std::optional<Version> refused_at);
  // Records in the directory what `rows` (one snapshot, the own row first) say.
  const std::vector<StockLevel>& remember(const SkuKey& key, const std::vector<StockLevel>& rows);
  // The row a fill moves units into: slot `target` (0: the SKU's own row, an order's
  // line; a hold's row, a resize), or this engine's slot among the active ones `rows`
  // show (home_target).
  static constexpr int home_target = -1;
  int target_of(const std::vector<StockLevel>& rows, int target) const;
  // Moves free units into the target row (target_of, decided on the rows as locked) so
  // that it has `qty`; OutOfStock when all of them together are short, or the target is
  // a retired slot. Returns the rows.
  std::vector<StockLevel> fill_slot(const SkuKey& key, const std::vector<StockLevel>& rows,
                                    int target, Quantity qty,
                                    const std::optional<Version>& expected);

  Store& store_;
  const SlotRouterOptions options_;
  SlotChooser chooser_;
  SlotDirectory directory_;
  SlotProbes probes_;
  std::atomic<std::int64_t> lapsed_checked_us_{0};  // steady_now_us of the last check
};

// The sink of an async reserve or sell whose refusal `retry` checks against the SKU's
// slots (answering it itself); a refusal it cannot check ends the call as Overloaded,
// which `record` records. Every reservation it passes on names its SKU, not a slot.
std::shared_ptr<CompletionSink> slot_checked_sink(
    std::shared_ptr<CompletionSink> inner,
    std::function<void(std::uint64_t, std::shared_ptr<CompletionSink>, const Error&)> retry,
    std::function<void(const Error&)> record);

}  // namespace stockade::detail
