// The SlotRouter (slot_router.hpp): hot-row slots above the stores.
#include "hotrow/slot_router.hpp"

#include <algorithm>

#include "stockade/log.hpp"
#include "stockade/telemetry.hpp"
#include "store/error_helpers.hpp"

namespace stockade::detail {
namespace {

StockLevel summed(const SkuKey& key, const std::vector<StockLevel>& rows) {
  StockLevel out = rows.front();  // the SKU's own row: its limit, tombstone and lease
  out.key = key;
  out.active_slots = active_rows(rows);
  if (rows.size() == 1) return out;
  out.on_hand = 0;
  out.reserved = 0;
  out.version = 0;
  for (const StockLevel& row : rows) {
    out.on_hand += row.on_hand;
    out.reserved += row.reserved;
    out.version += row.version;  // every write moves one row's: the sum moves on every write
    out.updated_at_us = std::max(out.updated_at_us, row.updated_at_us);
  }
  return out;
}

// `total` units over `n` rows: `target` gets at least `least` (and at least its fair
// share), the others the rest, evenly.
std::vector<Quantity> spread(Quantity total, std::size_t n, std::size_t target, Quantity least) {
  std::vector<Quantity> out(n, 0);
  const Quantity count = static_cast<Quantity>(n);
  Quantity mine = std::min(total, std::max(least, total / count + total % count));
  if (n == 1) mine = total;
  out[target] = mine;
  Quantity rest = total - mine;
  const Quantity others = count - 1;
  for (std::size_t i = 0, seen = 0; i < n && others > 0; ++i) {
    if (i == target) continue;
    out[i] = rest / others + (static_cast<Quantity>(seen) < rest % others ? 1 : 0);
    ++seen;
  }
  return out;
}

std::vector<SkuKey> keys_of(const std::vector<StockLevel>& rows) {
  std::vector<SkuKey> keys;
  keys.reserve(rows.size());
  for (const StockLevel& row : rows) keys.push_back(row.key);
  return keys;
}

// The units of a row that may move: those neither held nor owed, nor withheld from sale
// (a SKU that once had slots may withhold units on its own row: they stay there).
Quantity movable(const StockLevel& row) {
  return std::max<Quantity>(0, row.on_hand - row.reserved - row.withheld());
}

// New on_hand for each row so that the movable units (and `add`) are spread as spread()
// says over the first `active` rows, `target` among them; a retired row (past `active`)
// keeps only what it holds. The sum of on_hand stays what it was, plus `add`.
std::vector<Quantity> respread(const std::vector<StockLevel>& rows, int active, std::size_t target,
                               Quantity least, Quantity add) {
  Quantity total = add;
  for (const StockLevel& row : rows) total += movable(row);
  const std::size_t n = std::clamp<std::size_t>(static_cast<std::size_t>(active), 1, rows.size());
  const std::vector<Quantity> share = spread(total, n, std::min(target, n - 1), least);
  std::vector<Quantity> out(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    out[i] = rows[i].on_hand - movable(rows[i]) + (i < n ? share[i] : 0);
  }
  return out;
}

}  // namespace

void unslot(Reservation& r) {
  r.key.slot = 0;
}

namespace {

// Passes completions on to `inner`, except a refusal, which `retry` checks against the
// SKU's slots (and answers itself).
class SlotCheckedSink final : public CompletionSink {
 public:
  using Retry = std::function<void(std::uint64_t, std::shared_ptr<CompletionSink>, const Error&)>;
  using Record = std::function<void(const Error&)>;
  SlotCheckedSink(std::shared_ptr<CompletionSink> inner, Retry retry, Record record)
      : inner_(std::move(inner)), retry_(std::move(retry)), record_(std::move(record)) {}

  void post(std::vector<Completion>& completions) override {
    std::vector<Completion> pass;
    pass.reserve(completions.size());
    for (Completion& c : completions) {
      if (c.error && c.error->code() == ErrorCode::out_of_stock) {
        try {
          retry_(c.token, inner_, *c.error);
          continue;
        } catch (const Error& e) {
          c.error = Error(ErrorCode::overloaded,
                          std::string("a refusal could not be checked against the SKU's "
                                      "hot-row slots (") +
                              e.what() + "); nothing was reserved or sold");
          record_(*c.error);  // the refusal was left unrecorded: this is the outcome
        }
      }
      if (auto* r = std::get_if<Reservation>(&c.value)) unslot(*r);
      pass.push_back(std::move(c));
    }
    completions.clear();
    if (!pass.empty()) inner_->post(pass);
  }

 private:
  std::shared_ptr<CompletionSink> inner_;
  Retry retry_;
  Record record_;
};

}  // namespace

SlotRouter::SlotRouter(Store& store, SlotRouterOptions options)
    : store_(store),
      options_(options),
      directory_(options.directory),
      probes_(options.probe_entries) {}

SkuKey SlotRouter::first_row(const SkuKey& key, bool spread) const {
  const int slots = known_slots(key);
  if (slots <= 1) return key;
  const int home = home_of(slots);
  if (!spread || !chooser_) return slot_key(key, home);
  const int picked = chooser_(key, slots, home);
  return slot_key(key, picked >= 0 && picked < slots ? picked : home);
}

std::vector<StockLevel> SlotRouter::learn(const SkuKey& key) {
  std::vector<StockLevel> rows = store_.sku_rows(key);
  remember(key, rows);
  return rows;
}

const std::vector<StockLevel>& SlotRouter::remember(const SkuKey& key,
                                                    const std::vector<StockLevel>& rows) {
  if (!rows.empty()) {
    directory_.put(key, active_rows(rows), static_cast<int>(rows.size()), rows.front().version);
  }
  return rows;
}

int SlotRouter::slot_count(const SkuKey& key) {
  return active_rows(learn(key));
}

// After a refusal on one of the SKU's rows (decided at version `refused_at` of its own
// row, if known): the SKU's rows from one snapshot read after the refusal (shared by the
// callers refused meanwhile; SlotProbes), or none when an earlier read found the own row
// alone at that very version (slot rows never appear without moving it).
std::vector<StockLevel> SlotRouter::rows_after_refusal(const SkuKey& key,
                                                       std::optional<Version> refused_at) {
  return probes_.rows_after(key, refused_at, [&] { return learn(key); });
}

StockLevel SlotRouter::stock(const SkuKey& key) {
  const std::vector<StockLevel> rows = learn(key);
  if (rows.empty()) throw_stock_not_found(key);
  return summed(key, rows);
}

// discontinue and reinstate: every row of the SKU (its own and its hot-row slots', if it
// has any) at once, so that no slot keeps selling a SKU its own row calls discontinued.
// `expected` names the SKU's version (on a slotted SKU the sum of its rows' versions, as
// stock() reports it); a fencing token checks the own row's lease, which a slotted SKU
// cannot have.
StockLevel SlotRouter::set_tombstone(const SkuKey& key, bool discontinued,
                                     const std::optional<Version>& expected,
                                     const std::optional<FencingToken>& token) {
  const auto check = [&](const std::vector<StockLevel>& rows) {
    if (token) refuse_if_slots(key, "a fencing token (leases)", rows);
    StockLevel sku = summed(key, rows);
    bool already = true;
    for (const StockLevel& row : rows) already = already && row.discontinued == discontinued;
    if (already) {
      check_expected(key, expected, sku.version);  // nothing to change
      return;
    }
    sku.discontinued = false;  // reinstating is a write to a discontinued SKU
    check_writable(sku, expected, token);
  };
  return summed(key, remember(key, store_.set_discontinued(key, discontinued,
                                                           options_.lock_timeout_ms, check)));
}

void SlotRouter::refuse_on_slots(const SkuKey& key, const char* feature) {
  refuse_if_slots(key, feature, learn(key));
}

int SlotRouter::target_of(const std::vector<StockLevel>& rows, int target) const {
  return target != home_target ? target : home_of(std::max(1, active_rows(rows)));
}

std::vector<StockLevel> SlotRouter::fill_slot(const SkuKey& key,
                                              const std::vector<StockLevel>& rows, int target,
                                              Quantity qty,
                                              const std::optional<Version>& expected) {
  // The target is decided on the rows as locked: the SKU's slots may have been taken away
  // (or added) since `rows` were read.
  const auto plan = [&](const std::vector<StockLevel>& levels) {
    check_expected(key, expected, summed(key, levels).version);
    Quantity free = 0;
    for (const StockLevel& row : levels) free += movable(row);
    // Every row is locked: true of the SKU at this instant (the caller counts it, if it
    // stands).
    if (free < qty) throw_out_of_stock(key, free, qty);
    const int into = target_of(levels, target);
    if (into >= std::max(1, active_rows(levels))) {  // retired meanwhile: try again
      Error refusal = out_of_stock(key, 0, qty);
      ErrorContext context = refusal.context();
      context.available = free;  // what the SKU has (allocate's walk reads it)
      throw Error(ErrorCode::out_of_stock, refusal.what(), context);
    }
    return respread(levels, active_rows(levels), static_cast<std::size_t>(into), qty, 0);
  };
  const NoteScope note({"slot_move", "", "", ""});
  return remember(key, store_.reshape(keys_of(rows), /*create=*/false, /*write_all=*/false,
                                      options_.lock_timeout_ms, plan));
}

namespace {

// set_slots refuses to give slots to a SKU that is discontinued, leased, has a backorder
// limit or withholds units from sale. (Taking them all away is allowed on a discontinued SKU: it
// only moves free units.)
void check_slottable(const SkuKey& key, const StockLevel& own) {
  if (own.discontinued) {
    throw Error(ErrorCode::discontinued, describe(key) + " is discontinued", context_of(key));
  }
  if (own.leased) {
    throw Error(ErrorCode::invalid_state,
                describe(key) + " is leased; hot-row slots are not built for a leased SKU",
                context_of(key));
  }
  if (own.backorder_limit > 0) {
    throw Error(
        ErrorCode::invalid_state,
        describe(key) + " has a backorder limit; hot-row slots are not built for backorders",
        context_of(key));
  }
  if (own.withheld() > 0) {
    throw Error(ErrorCode::invalid_state,
                describe(key) +
                    " withholds units from sale (safety stock, damaged or quality control); "
                    "hot-row slots are not built for them",
                context_of(key));
  }
}

}  // namespace

// Adding slots makes the missing rows (or takes retired ones back); taking them away
// retires the rows past `slots`: their free units move to the active rows now, and the
// holds on them stay there until they end (a later refusal, set_on_hand or set_slots
// moves what those leave free). Either way one reshape, which writes the count on the own row.
StockLevel SlotRouter::set_slots(const SkuKey& key, int slots) {
  const std::vector<StockLevel> have = learn(key);
  if (have.size() <= 1 && slots <= 1) {
    if (have.empty()) throw_stock_not_found(key);
    return summed(key, have);  // one row, and it stays one
  }
  const int rows = std::max(slots, static_cast<int>(have.size()));
  std::vector<SkuKey> keys;
  for (int i = 0; i < rows; ++i) keys.push_back(slot_key(key, i));
  const auto plan = [&](const std::vector<StockLevel>& levels) {
    if (slots > 1) check_slottable(key, levels.front());
    return respread(levels, slots, 0, 0, 0);
  };
  const NoteScope note({"slot_move", "", "", ""});
  const bool create = slots > static_cast<int>(have.size());
  return summed(key, remember(key, store_.reshape(keys, create, /*write_all=*/create,
                                                  options_.lock_timeout_ms, plan, slots)));
}

StockLevel SlotRouter::restock(const SkuKey& key, Quantity qty,
                               const std::optional<Version>& expected,
                               const std::optional<FencingToken>& token,
                               const std::optional<std::string>& idempotency_key) {
  // Units added to the SKU's own row are the SKU's, slotted or not (a short slot takes
  // them from there); only If-Match, a token, a key, or a SKU known to have slots looks
  // further.
  std::vector<StockLevel> rows;
  if (expected || token || idempotency_key || known_slots(key) > 1) rows = learn(key);
  if (rows.size() <= 1) return store_.restock(key, qty, expected, token, idempotency_key);
  if (idempotency_key) {
    // One row takes the units with the key, in one transaction: the SKU's own row, whose
    // units are the SKU's (a short slot takes them from there). The answer is the SKU's
    // level, summed as it is now (on a replay too).
    if (expected || token) {
      refuse_on_slots(key, "an idempotency key with expected_version or a fencing token");
    }
    // ON_HAND_MAX bounds the SKU's rows together: they merge into one (a check of the rows
    // as learned: a restock racing this one is checked by its own)
    checked_on_hand(summed(key, rows).on_hand, qty, "restock");
    return summed_or(key, store_.restock(key, qty, std::nullopt, std::nullopt, idempotency_key));
  }
  if (token) refuse_on_slots(key, "a fencing token (leases)");
  const auto plan = [&](const std::vector<StockLevel>& levels) {
    const StockLevel sum = summed(key, levels);
    check_expected(key, expected, sum.version);
    if (levels.front().discontinued) {
      throw Error(ErrorCode::discontinued, describe(key) + " is discontinued", context_of(key));
    }
    checked_on_hand(sum.on_hand, qty, "restock");  // the rows together: they may merge
    return respread(levels, active_rows(levels), 0, 0, qty);
  };
  return summed(key, store_.reshape(keys_of(rows), false, false, options_.lock_timeout_ms, plan));
}

StockLevel SlotRouter::set_on_hand(const SkuKey& key, Quantity on_hand,
                                   const std::optional<Version>& expected,
                                   const std::optional<FencingToken>& token,
                                   const std::optional<std::string>& idempotency_key) {
  const std::vector<StockLevel> rows = learn(key);
  if (rows.size() <= 1) {
    return store_.set_on_hand(key, on_hand, expected, token, idempotency_key);
  }
  if (idempotency_key) refuse_on_slots(key, "an idempotency key on set_on_hand");
  if (token) refuse_on_slots(key, "a fencing token (leases)");
  const auto plan = [&](const std::vector<StockLevel>& levels) {
    const StockLevel sum = summed(key, levels);
    check_expected(key, expected, sum.version);
    const Quantity unsellable = sum.damaged + sum.quality_control;  // the own row's
    check_covers(key, on_hand, sum.reserved, 0, unsellable);
    // Every row keeps what it holds (and the own row its damaged and quality-control
    // units); the free units are spread anew.
    std::vector<StockLevel> held = levels;
    for (StockLevel& row : held) row.on_hand = row.reserved + row.damaged + row.quality_control;
    return respread(held, active_rows(levels), 0, 0, on_hand - sum.reserved - unsellable);
  };
  return summed(key, store_.reshape(keys_of(rows), false, false, options_.lock_timeout_ms, plan));
}

// A slot's row (the SKU's own row too) is a part of the SKU: answer with the SKU, read
// right after the sale. (An engine that has not seen the SKU's slots yet answers with the
// row it sold from.) The sale has committed: if that read fails (the server went away
// meanwhile), the answer is the row's level, never the read's error, which would tell
// the caller that nothing changed.
StockLevel SlotRouter::level_after_sell(const SkuKey& key, StockLevel row_level) {
  if (directory_.rows(key) > 1) row_level = summed_or(key, row_level);
  row_level.key = key;
  return row_level;
}

StockLevel SlotRouter::summed_or(const SkuKey& key, const StockLevel& row_level) {
  try {
    return summed(key, learn(key));
  } catch (const Error&) {
    StockLevel out = row_level;
    out.key = key;
    return out;
  }
}

int SlotRouter::check_and_fill(const SkuKey& key, Quantity qty, Version expected,
                               std::optional<Version>* row_expected) {
  const std::vector<StockLevel> rows = learn(key);
  if (rows.size() <= 1) return 1;
  const std::vector<StockLevel> filled = fill_slot(key, rows, home_target, qty, expected);
  *row_expected = filled[static_cast<std::size_t>(target_of(filled, home_target))].version;
  return std::max(1, active_rows(filled));
}

int SlotRouter::after_refusal(const SkuKey& key, Quantity qty, const Error& refusal, int k,
                              int round) {
  // The row is short. Is the SKU? A read since the refusal says (the version of a refusal
  // on the own row may prove at once that it has no slot rows).
  const std::vector<StockLevel> rows =
      rows_after_refusal(key, k <= 1 ? refusal.context().actual_version : std::nullopt);
  if (rows.size() <= 1) throw refusal;  // not slotted: the row's refusal is the SKU's
  // The read is one snapshot of every row: when they are short together, the SKU was
  // short at that instant, and no lock is needed to say so (a sold-out slotted SKU under
  // a flood of requests). This comes before giving up on the rounds, so that a request
  // that lost its moved units to others as the SKU sold out hears OutOfStock.
  Quantity free = 0;
  for (const StockLevel& row : rows) free += movable(row);
  if (free < qty) throw_out_of_stock(key, free, qty);
  if (round >= rounds()) {
    throw Error(ErrorCode::overloaded,
                "units were moved into this engine's slot of " + describe(key) + " " +
                    std::to_string(round - 1) +
                    " times and taken by others each time; nothing was reserved or sold",
                context_of(key));
  }
  try {
    k = std::max(1, active_rows(fill_slot(key, rows, home_target, qty, std::nullopt)));
  } catch (const Error& e) {
    if (e.code() == ErrorCode::in_doubt) {
      // Only units moved between the SKU's rows, if anything: nothing was reserved or
      // sold, and no unit was lost either way.
      throw Error(ErrorCode::unavailable,
                  "moving units between the hot-row slots of " + describe(key) +
                      " lost its connection; nothing was reserved or sold: " + e.what(),
                  context_of(key));
    }
    // A refusal over every row the read found is the SKU's, unless slots were added since
    // (their units were not counted): then the next round reads them.
    if (e.code() != ErrorCode::out_of_stock) throw;
    const std::vector<StockLevel> now = learn(key);
    if (now.size() == rows.size()) throw;
    k = std::max(1, active_rows(now));
  }
  return k;
}

bool SlotRouter::refusal_stands(const SkuKey& key, const Error& refusal) {
  if (freed_lapsed_holds()) return false;
  return rows_after_refusal(key, refusal.context().actual_version).size() <= 1;
}

bool SlotRouter::freed_lapsed_holds() {
  const std::int64_t now = steady_now_us();
  std::int64_t last = lapsed_checked_us_.load(std::memory_order_relaxed);
  if (last != 0 && now - last < lapsed_check_gap_us) return false;
  if (!lapsed_checked_us_.compare_exchange_strong(last, now)) return false;  // another did
  try {
    return store_.free_lapsed(lapsed_check_batch) > 0;
  } catch (const Error& e) {
    log(LogLevel::debug, "stockade", std::string("freeing lapsed holds failed: ") + e.what());
    return false;
  }
}

// The order takes every line from the SKU's own row: a line short there takes units from
// its slots, if it has any.
void SlotRouter::refill_order_line(const std::vector<OrderLine>& lines, const Error& refusal) {
  const SkuKey line{refusal.context().sku, refusal.context().location};
  auto it =
      std::find_if(lines.begin(), lines.end(), [&](const OrderLine& l) { return l.key == line; });
  if (it == lines.end()) throw refusal;
  const std::vector<StockLevel> rows = rows_after_refusal(
      line, known_slots(line) <= 1 ? refusal.context().actual_version : std::nullopt);
  if (rows.size() <= 1) throw refusal;
  fill_slot(line, rows, /*target=*/0, it->qty, std::nullopt);
}

void SlotRouter::refill_row(const SkuKey& row, Quantity qty, const Error& refusal) {
  const SkuKey base{row.sku, row.location, 0};
  const std::vector<StockLevel> rows = rows_after_refusal(base, std::nullopt);
  if (rows.size() <= 1 || row.slot >= std::max(1, active_rows(rows))) throw refusal;
  fill_slot(base, rows, row.slot, qty, std::nullopt);
}

std::shared_ptr<CompletionSink> slot_checked_sink(
    std::shared_ptr<CompletionSink> inner,
    std::function<void(std::uint64_t, std::shared_ptr<CompletionSink>, const Error&)> retry,
    std::function<void(const Error&)> record) {
  return std::make_shared<SlotCheckedSink>(std::move(inner), std::move(retry), std::move(record));
}

}  // namespace stockade::detail
