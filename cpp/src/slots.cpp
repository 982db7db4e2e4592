// Hot-row slots, the engine's half (docs/design.md, section 10).
//
// A slotted SKU keeps its units in its own row and in slot rows of `stock`, each an
// ordinary row (types.hpp: slot_key), so every store path, invariant, lock order, batch,
// transition and expiry works on them unchanged and no row can oversell. What is new is
// here, above the stores: where a reserve or sell goes (this engine's home slot), what
// happens when that slot is short (free units move into it from the SKU's other rows, all
// locked in key order, in one transaction that also decides whether the SKU as a whole
// has them), and the SKU-level answers (stock() sums the rows; restock and set_on_hand
// spread over them; If-Match names the sum of the rows' versions).
#include <algorithm>

#include "engine_calls.hpp"
#include "error_helpers.hpp"
#include "slot_directory.hpp"
#include "stockade/engine.hpp"

namespace stockade {
namespace detail {
namespace {

StockLevel summed(const SkuKey& key, const std::vector<StockLevel>& rows) {
  StockLevel out = rows.front();  // the SKU's own row: its limit, tombstone and lease
  out.key = key;
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

// The units of a row that may move: those neither held nor owed.
Quantity movable(const StockLevel& row) {
  return std::max<Quantity>(0, row.on_hand - row.reserved);
}

// New on_hand for each row so that the movable units are spread as spread() says; the
// sum of on_hand stays what it was.
std::vector<Quantity> respread(const std::vector<StockLevel>& rows, std::size_t target,
                               Quantity least, Quantity add) {
  Quantity total = add;
  for (const StockLevel& row : rows) total += movable(row);
  const std::vector<Quantity> share = spread(total, rows.size(), target, least);
  std::vector<Quantity> out(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    out[i] = rows[i].on_hand - movable(rows[i]) + share[i];
  }
  return out;
}

}  // namespace

Error unslotted(const Error& e, const SkuKey& key) {
  const ErrorContext& c = e.context();
  if (c.location.find(slot_mark) == std::string::npos) return e;
  ErrorContext context = c;
  context.location = key.location;
  std::string message = e.what();
  const std::string row = shown(c.location);
  const std::string sku = shown(key.location);
  for (std::size_t at = message.find(row); at != std::string::npos;
       at = message.find(row, at + sku.size())) {
    message.replace(at, row.size(), sku);
  }
  return Error(e.code(), message, std::move(context));
}

void unslot(Reservation& r) {
  if (r.key.location.find(slot_mark) != std::string::npos) r.key = base_key(r.key);
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
}  // namespace detail

int Engine::known_slots(const SkuKey& key) const {
  return slot_directory_->get(key);
}

int Engine::home_of(int slots) const {
  return home_ % slots;
}

std::vector<StockLevel> Engine::learn_slots(const SkuKey& key) {
  std::vector<StockLevel> rows = store_->sku_rows(key);
  slot_directory_->put(key, static_cast<int>(rows.size()));
  return rows;
}

std::vector<StockLevel> Engine::rows_after_refusal(const SkuKey& key,
                                                   std::optional<Version> refused_at) {
  return slot_probes_->rows_after(key, refused_at, [&] { return learn_slots(key); });
}

// discontinue and reinstate: every row of the SKU (its own and its hot-row slots', if it
// has any) at once, so that no slot keeps selling a SKU its own row calls discontinued.
// `expected` names the SKU's version (on a slotted SKU the sum of its rows' versions, as
// stock() reports it); a fencing token checks the own row's lease, which a slotted SKU
// cannot have.
StockLevel Engine::set_tombstone(const SkuKey& key, bool discontinued,
                                 const std::optional<Version>& expected,
                                 const std::optional<FencingToken>& token) {
  const auto check = [&](const std::vector<StockLevel>& rows) {
    if (rows.size() > 1 && token) {
      detail::throw_not_built_for_slots(key, "a fencing token (leases)", rows.size());
    }
    StockLevel sku = detail::summed(key, rows);
    bool already = true;
    for (const StockLevel& row : rows) already = already && row.discontinued == discontinued;
    if (already) {
      detail::check_expected(key, expected, sku.version);  // nothing to change
      return;
    }
    sku.discontinued = false;  // reinstating is a write to a discontinued SKU
    detail::check_writable(sku, expected, token);
  };
  const std::vector<StockLevel> rows =
      store_->set_discontinued(key, discontinued, options_.lock_timeout_ms, check);
  slot_directory_->put(key, static_cast<int>(rows.size()));
  return detail::summed(key, rows);
}

void Engine::refuse_on_slots(const SkuKey& key, const char* feature) {
  const std::size_t rows = learn_slots(key).size();
  if (rows > 1) detail::throw_not_built_for_slots(key, feature, rows);
}

std::vector<StockLevel> Engine::fill_slot(const SkuKey& key, const std::vector<StockLevel>& rows,
                                          int target, Quantity qty,
                                          const std::optional<Version>& expected) {
  const auto plan = [&](const std::vector<StockLevel>& levels) {
    detail::check_expected(key, expected, detail::summed(key, levels).version);
    Quantity free = 0;
    for (const StockLevel& row : levels) free += detail::movable(row);
    // Every row is locked: true of the SKU at this instant (the caller counts it, if it
    // stands).
    if (free < qty) detail::throw_out_of_stock(key, free, qty);
    return detail::respread(levels, static_cast<std::size_t>(target), qty, 0);
  };
  return store_->reshape(detail::keys_of(rows), /*create=*/false, /*write_all=*/false,
                         options_.lock_timeout_ms, plan);
}

StockLevel Engine::set_slots(const SkuKey& key, int slots) {
  check_process();
  validate_sku_key(key);
  if (slots < 1 || slots > slots_max) {
    throw_invalid_argument("slots must be between 1 and " + std::to_string(slots_max) + ", got " +
                           std::to_string(slots));
  }
  return observed(Op::set_slots, [&] {
    const std::size_t have = learn_slots(key).size();
    if (static_cast<std::size_t>(slots) < have) {
      throw_invalid_argument(detail::describe(key) + " already spreads its units over " +
                             std::to_string(have) +
                             " rows; slots only grow (taking them "
                             "away is not built)");
    }
    std::vector<SkuKey> keys;
    for (int i = 0; i < slots; ++i) keys.push_back(slot_key(key, i));
    const auto plan = [&](const std::vector<StockLevel>& levels) {
      const StockLevel& own = levels.front();
      if (own.discontinued) {
        throw Error(ErrorCode::discontinued, detail::describe(key) + " is discontinued",
                    detail::context_of(key));
      }
      if (slots > 1 && own.leased) {
        throw Error(ErrorCode::invalid_state,
                    detail::describe(key) +
                        " is leased; hot-row slots are not built for a "
                        "leased SKU",
                    detail::context_of(key));
      }
      if (slots > 1 && own.backorder_limit > 0) {
        throw Error(ErrorCode::invalid_state,
                    detail::describe(key) +
                        " has a backorder limit; hot-row slots are not "
                        "built for backorders",
                    detail::context_of(key));
      }
      return detail::respread(levels, 0, 0, 0);
    };
    const std::vector<StockLevel> rows =
        store_->reshape(keys, /*create=*/true, /*write_all=*/true, options_.lock_timeout_ms, plan);
    slot_directory_->put(key, slots);
    return detail::summed(key, rows);
  });
}

int Engine::slot_count(const SkuKey& key) {
  check_process();
  validate_sku_key(key);
  return observed(Op::stock, [&] { return static_cast<int>(learn_slots(key).size()); });
}

// Runs `attempt(row, route)` on this engine's slot of `key` (the SKU's own row while it
// is not known to have slots), `route` being `first` with the attempt's own If-Match
// version and counting flags. When that row is short,
// the SKU's rows are read: with none but its own, the refusal stands; else free units
// move into the slot from the others (fill_slot, which refuses for the SKU as a whole
// when they are short too) and the attempt runs again, a bounded number of times. With
// the call's `expected` (If-Match: the sum of the rows' versions), the rows are checked
// and filled first, and the attempt takes the slot's own version after that.
//
// The call is counted once, however many attempts it takes: the first attempt counts
// the request per SKU (unless `continued`: an async call's first attempt did), and an
// attempt's OutOfStock is left unrecorded (count_refusal false), since it may not stand.
// Whatever ends the call records it: an attempt that succeeds or fails otherwise, or
// this function when the call ends here (a refusal that stands, Overloaded, an error
// while moving units), as `op` under the strategy asked, timed from `first.started_us`.
template <class Result, class Attempt>
Result Engine::on_slots(const SkuKey& key, Quantity qty, Op op, const Route& first, bool continued,
                        Attempt&& attempt) {
  const std::optional<Version>& expected = first.options.expected_version;
  bool request_counted = continued;
  const auto record = [&](const Error& e) {
    if (!request_counted) telemetry_->count(key, SkuEvent::request);
    record_call_end(op, first.asked, key, e, first.started_us);
  };
  int k = known_slots(key);
  std::optional<Version> row_expected = expected;
  if (expected) {
    try {
      const std::vector<StockLevel> rows = learn_slots(key);
      k = std::max<int>(1, static_cast<int>(rows.size()));
      if (k > 1) {
        const int target = home_of(k);
        row_expected = fill_slot(key, rows, target, qty, expected)[target].version;
      }
    } catch (const Error& e) {
      record(e);
      throw;
    }
  }
  const int rounds = std::max(2, options_.retries_max + 1);
  for (int round = 1;; ++round) {
    std::optional<Error> refusal;
    try {
      Route r = first;
      r.options.expected_version = row_expected;
      r.options.count_request = !request_counted;
      // With If-Match the row's refusal is the call's (no units move then).
      r.options.count_refusal = expected.has_value();
      request_counted = true;
      return attempt(k > 1 ? slot_key(key, home_of(k)) : key, r);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::out_of_stock || expected) throw detail::unslotted(e, key);
      refusal = e;
    }
    try {
      // The row is short. Is the SKU? A read since the refusal says (the version of a
      // refusal on the own row may prove at once that it has no slot rows).
      const std::vector<StockLevel> rows =
          rows_after_refusal(key, k <= 1 ? refusal->context().actual_version : std::nullopt);
      if (rows.size() <= 1) throw *refusal;  // not slotted: the row's refusal is the SKU's
      k = static_cast<int>(rows.size());
      // The read is one snapshot of every row: when they are short together, the SKU was
      // short at that instant, and no lock is needed to say so (a sold-out slotted SKU
      // under a flood of requests). This comes before giving up on the rounds, so that a
      // request that lost its moved units to others as the SKU sold out hears OutOfStock.
      Quantity free = 0;
      for (const StockLevel& row : rows) free += detail::movable(row);
      if (free < qty) detail::throw_out_of_stock(key, free, qty);
      if (round >= rounds) {
        throw Error(ErrorCode::overloaded,
                    "units were moved into this engine's slot of " + detail::describe(key) + " " +
                        std::to_string(round - 1) +
                        " times and taken by others each time; nothing was reserved or sold",
                    detail::context_of(key));
      }
      try {
        fill_slot(key, rows, home_of(k), qty, std::nullopt);
      } catch (const Error& e) {
        if (e.code() == ErrorCode::in_doubt) {
          // Only units moved between the SKU's rows, if anything: nothing was reserved
          // or sold, and no unit was lost either way.
          throw Error(ErrorCode::unavailable,
                      "moving units between the hot-row slots of " + detail::describe(key) +
                          " lost its connection; nothing was reserved or sold: " + e.what(),
                      detail::context_of(key));
        }
        // A refusal over every row the read found is the SKU's, unless slots were added
        // since (their units were not counted): then the next round reads them.
        if (e.code() != ErrorCode::out_of_stock) throw;
        const std::size_t now = learn_slots(key).size();
        if (now == rows.size()) throw;
        k = static_cast<int>(now);
      }
    } catch (const Error& e) {
      record(e);
      throw;
    }
  }
}

Reservation Engine::reserve(const SkuKey& key, Quantity qty, std::optional<std::int64_t> ttl_us,
                            std::optional<std::string> idempotency_key, const CallOptions& call) {
  check_process();
  validate_sku_key(key);
  validate_qty(qty);
  if (ttl_us) validate_ttl_us(*ttl_us);
  if (idempotency_key) validate_idempotency_key(*idempotency_key);
  return reserve_on_slots(key, qty, ttl_us.value_or(options_.default_ttl_us), idempotency_key, call,
                          /*continued=*/false, 0);
}

// reserve(), after its checks; `continued` (from `started_us`) for an async call whose
// first attempt was refused: that attempt counted the request.
Reservation Engine::reserve_on_slots(const SkuKey& key, Quantity qty, std::int64_t ttl_us,
                                     const std::optional<std::string>& idempotency_key,
                                     const CallOptions& call, bool continued,
                                     std::int64_t started_us) {
  Route first = route(key, call);  // entered the tracker
  if (started_us != 0) first.started_us = started_us;
  bool entered = true;  // and no call has taken that over yet
  const auto attempt = [&](const SkuKey& row, const Route& r) {
    if (!entered) tracker_.enter(key);
    entered = false;  // reserve_checked leaves the tracker however it ends
    return reserve_checked(row, qty, ttl_us, idempotency_key, r);
  };
  try {
    Reservation out = on_slots<Reservation>(key, qty, Op::reserve, first, continued, attempt);
    detail::unslot(out);
    return out;
  } catch (...) {
    if (entered) tracker_.leave(key);
    throw;
  }
}

StockLevel Engine::sell(const SkuKey& key, Quantity qty, const CallOptions& call) {
  check_process();
  validate_sku_key(key);
  validate_qty(qty);
  if (call.buyer) {
    throw_invalid_argument("sell takes no buyer: purchase limits count holds (reserve)");
  }
  return sell_on_slots(key, qty, call, /*continued=*/false, 0);
}

StockLevel Engine::sell_on_slots(const SkuKey& key, Quantity qty, const CallOptions& call,
                                 bool continued, std::int64_t started_us) {
  Route first = route(key, call);
  if (started_us != 0) first.started_us = started_us;
  bool entered = true;
  const auto attempt = [&](const SkuKey& row, const Route& r) {
    if (!entered) tracker_.enter(key);
    entered = false;
    return sell_checked(row, qty, r);
  };
  try {
    StockLevel out = on_slots<StockLevel>(key, qty, Op::sell, first, continued, attempt);
    // A slot's row (the SKU's own row too) is a part of the SKU: answer with the SKU,
    // read right after the sale. (An engine that has not seen the SKU's slots yet answers
    // with the row it sold from.)
    if (known_slots(key) > 1) out = detail::summed(key, learn_slots(key));
    out.key = key;
    return out;
  } catch (...) {
    if (entered) tracker_.leave(key);
    throw;
  }
}

// An async call's first attempt, on this engine's slot of `key`, was refused, and that
// refusal was not recorded (see on_slots). If the SKU has no other rows the refusal is
// the call's outcome, as is an error reading them: recorded (as `op` under `asked`,
// timed from `started_us`) and thrown. Else it returns, and the blocking path goes on.
void Engine::throw_if_refusal_stands(const SkuKey& key, const Error& refusal, Op op, Strategy asked,
                                     std::int64_t started_us) {
  std::optional<Error> outcome;
  try {
    if (rows_after_refusal(key, refusal.context().actual_version).size() > 1) return;
    outcome = refusal;
  } catch (const Error& e) {
    outcome = e;
  }
  record_call_end(op, asked, key, *outcome, started_us);
  throw *outcome;
}

// An order is counted once too (see on_slots): its first attempt counts each line's
// request, and a refusal is recorded where it stands.
std::vector<Reservation> Engine::order_on_slots(OrderRequest& request, Strategy asked) {
  const std::int64_t started = steady_now_us();
  const int rounds = std::max(2, options_.retries_max + 1);
  for (int round = 1;; ++round) {
    request.options.count_request = round == 1;
    request.options.count_refusal = false;
    try {
      return counted<std::vector<Reservation>>(Op::reserve_order, asked, /*refusal_final=*/false,
                                               started,
                                               [&] { return store_->reserve_order(request); });
    } catch (const Error& e) {
      if (e.code() != ErrorCode::out_of_stock) throw;  // counted() recorded it
      try {
        // The order takes every line from the SKU's own row: a line short there takes
        // units from its slots, if it has any, and the order runs again.
        if (round >= rounds) throw;
        const SkuKey line{e.context().sku, e.context().location};
        auto it = std::find_if(request.lines.begin(), request.lines.end(),
                               [&](const OrderLine& l) { return l.key == line; });
        if (it == request.lines.end()) throw;
        const std::vector<StockLevel> rows = rows_after_refusal(
            line, known_slots(line) <= 1 ? e.context().actual_version : std::nullopt);
        if (rows.size() <= 1) throw;
        fill_slot(line, rows, 0, it->qty, std::nullopt);
      } catch (const Error& stands) {  // the order's outcome, on the line it names
        record_call_end(Op::reserve_order, asked,
                        SkuKey{stands.context().sku, stands.context().location}, stands, started);
        throw;
      }
    }
  }
}

std::shared_ptr<CompletionSink> Engine::slot_checked_sink(
    std::shared_ptr<CompletionSink> sink,
    std::function<void(std::uint64_t, std::shared_ptr<CompletionSink>, const Error&)> retry, Op op,
    Strategy asked, std::int64_t started_us) {
  return std::make_shared<detail::SlotCheckedSink>(
      std::move(sink), std::move(retry),
      [this, op, asked, started_us](const Error& e) { record_outcome(op, asked, &e, started_us); });
}

StockLevel Engine::stock(const SkuKey& key) {
  check_process();
  validate_sku_key(key);
  return observed(Op::stock, [&] {
    const std::vector<StockLevel> rows = learn_slots(key);
    if (rows.empty()) detail::throw_stock_not_found(key);
    return detail::summed(key, rows);
  });
}

StockLevel Engine::restock(const SkuKey& key, Quantity qty, std::optional<Version> expected,
                           std::optional<FencingToken> token) {
  check_process();
  validate_sku_key(key);
  validate_qty(qty);
  validate_expected_version(expected);
  validate_fencing_token(token);
  return observed(Op::restock, [&] {
    // Units added to the SKU's own row are the SKU's, slotted or not (a short slot takes
    // them from there); only If-Match, a token, or a SKU known to have slots looks further.
    std::vector<StockLevel> rows;
    if (expected || token || known_slots(key) > 1) rows = learn_slots(key);
    if (rows.size() <= 1) return store_->restock(key, qty, expected, token);
    if (token) refuse_on_slots(key, "a fencing token (leases)");
    const auto plan = [&](const std::vector<StockLevel>& levels) {
      detail::check_expected(key, expected, detail::summed(key, levels).version);
      if (levels.front().discontinued) {
        throw Error(ErrorCode::discontinued, detail::describe(key) + " is discontinued",
                    detail::context_of(key));
      }
      return detail::respread(levels, 0, 0, qty);
    };
    return detail::summed(
        key, store_->reshape(detail::keys_of(rows), false, false, options_.lock_timeout_ms, plan));
  });
}

StockLevel Engine::set_on_hand(const SkuKey& key, Quantity on_hand, std::optional<Version> expected,
                               std::optional<FencingToken> token) {
  check_process();
  validate_sku_key(key);
  if (on_hand < 0) {
    throw_invalid_argument("on_hand must not be negative, got " + std::to_string(on_hand));
  }
  validate_expected_version(expected);
  validate_fencing_token(token);
  return observed(Op::set_on_hand, [&] {
    const std::vector<StockLevel> rows = learn_slots(key);
    if (rows.size() <= 1) return store_->set_on_hand(key, on_hand, expected, token);
    if (token) refuse_on_slots(key, "a fencing token (leases)");
    const auto plan = [&](const std::vector<StockLevel>& levels) {
      const StockLevel sum = detail::summed(key, levels);
      detail::check_expected(key, expected, sum.version);
      detail::check_covers(key, on_hand, sum.reserved, 0);
      // Every row keeps what it holds; the free units are spread anew.
      std::vector<StockLevel> held = levels;
      for (StockLevel& row : held) row.on_hand = row.reserved;
      return detail::respread(held, 0, 0, on_hand - sum.reserved);
    };
    return detail::summed(
        key, store_->reshape(detail::keys_of(rows), false, false, options_.lock_timeout_ms, plan));
  });
}

}  // namespace stockade
