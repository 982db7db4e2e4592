// BatchTx: one batch of requests while its transaction runs (PostgresStore::apply_batch,
// batch.cpp). Its methods live in batch_tx.cpp, and the purchase-limit part in
// batch_limits.cpp.
//
// The fast path, for a batch of reserves and sells: one statement in autocommit (one
// round trip, its own commit) locks the touched rows in sorted order and, if every row
// has room for all of its requests, writes the summed deltas and inserts every
// reservation; if not, it changes nothing. That is the common case under a flash sale
// until the last units go. A batch on one row with distinct idempotency keys takes it
// too: its statement moves the row and claims the keys; a key that exists already fails
// the claim, which rolls the statement back (a replay, a conflict, or no room: the full
// path decides those). It saves most of the round trips of the full path. A batch on one
// row with confirms and releases takes it too, on the plain layout, if nothing in it has a
// key, a buyer or a reference: the engine first reads the steps' holds without locks
// (read_steps), decides each step on them in C++ as the full path would, and one statement
// writes those decisions if every hold is still at the version read, with the row's deltas
// and the new reservations (batch_fast_one_steps in statements_batch.cpp).
//
// The full path, one transaction whose statements run once per batch, whatever its size,
// with arrays for arguments:
//   1. claim the batch's new idempotency keys (sorted), and read the keys that exist;
//   2. lock every touched stock row, in sorted key order, and read it;
//   3. decide each request in arrival order against the rows as read, in C++;
//   4. write every row's summed deltas and insert every reservation, in one statement;
//   5. free the keys of requests that were refused, so that a retry can run afresh.
// The runner commits. A batch whose fast statement found no room runs the full path, as
// a new transaction that reads the rows afresh; either way one transaction commits the
// batch's changes. After a miss the store skips the fast path for a few batches, so a
// sold-out SKU does not pay for it on every batch. The full path's lock order is the one every
// other path keeps: idempotency keys before stock rows, stock rows sorted. So batches from many
// engines, and per-request calls, cannot deadlock with each other. The one exception is the
// keyed one-row statement, whose key claims follow its row's UPDATE: a request with one of its
// keys claimed by a per-request call at that very moment (two calls with one key, on two paths)
// can meet it in a deadlock, which PostgreSQL ends after deadlock_timeout by failing one side,
// with nothing changed; the store runs that side again, as it does any deadlock (40P01).
//
// A granted change moves a row's version by one, as a per-request write would: a batch
// that grants 40 units in 40 requests moves the version by 40, and the stock level a sell
// returns is the row as it stood right after that sale.
#pragma once

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/invariant.hpp"
#include "postgres/postgres_store_impl.hpp"
#include "store/fingerprint.hpp"

namespace stockade::detail::pg {

struct RowState {
  Quantity on_hand = 0;
  Quantity reserved = 0;
  Version version = 0;
  Quantity backorder_limit = 0;
  Quantity safety_stock = 0, damaged = 0, quality_control = 0, incoming = 0;  // sql::states
  bool discontinued = false;
  bool leased = false;
  Quantity sold = 0;
  Quantity held = 0;
  std::int64_t changes = 0;

  Quantity available() const {
    return available_units(on_hand, backorder_limit, reserved,
                           safety_stock + damaged + quality_control);
  }
};

// The row as the batch has decided it so far (its lease, if live, is not this batch's).
inline StockLevel level_of(const SkuKey& key, const RowState& row) {
  StockLevel level{key, row.on_hand, row.reserved, row.version + row.changes, 0};
  level.backorder_limit = row.backorder_limit;
  level.safety_stock = row.safety_stock;
  level.damaged = row.damaged;
  level.quality_control = row.quality_control;
  level.incoming = row.incoming;
  level.discontinued = row.discontinued;
  level.leased = row.leased;
  return level;
}

// The batch's statements read a row's backorder limit and then its quantity states
// (sql::states) from column `at` on: this reads them into `state`.
inline void read_limits(const pqxx::row& row, int at, RowState& state) {
  state.backorder_limit = row[at].as<std::int64_t>();
  state.safety_stock = row[at + 1].as<std::int64_t>();
  state.damaged = row[at + 2].as<std::int64_t>();
  state.quality_control = row[at + 3].as<std::int64_t>();
  state.incoming = row[at + 4].as<std::int64_t>();
}
// The column after them, in a statement that reads more (a slot, a group).
inline constexpr int after_limits = 11;

// A key's first request in the batch, and what the database said about the key.
struct KeyClaim {
  std::size_t first = 0;
  std::string fingerprint;  // of the first request
  bool claimed = false;     // this batch inserted the key: its first request decides
  std::optional<std::string> stored_fingerprint;  // the key existed: its request's
  std::vector<Reservation> stored;                // ... and the reservations it made
  std::optional<std::string> stored_outcome;      // ... or the outcome it stored
};

// A reservation a transition in the batch is about, as locked (and as changed so far).
struct Hold {
  Reservation reservation;
  bool lapsed = false;   // expires_at <= now() when it was locked
  bool changed = false;  // a transition of the batch changed it: in transitions_ once
};

// A fast statement undid itself: the keyed one found a key claimed elsewhere meanwhile
// (23505), or the limited or multi-row one moved some rows but not all (abort_statement,
// SK001). It rolled back whole, and the full path decides the batch.
struct FastMiss {};

// The statements layer's quoting (Quote), by the transaction's connection.
inline Quote quoting(pqxx::transaction_base& work) {
  return [&work](const std::string& value) { return work.quote(value); };
}

inline void fail(BatchItem& item, Error error) {
  item.ok = false;
  item.error = std::move(error);
}

struct OneRowHolds;
struct NewKeys;

// A keyed request's fingerprint (a reserve's, a sell's, a confirm's or a release's), as its
// per-request form prints it; and the outcome its key stores (not a reserve's: its key
// names its reservation).
std::string print_of(const BatchItem& item);
std::string outcome_of(const BatchItem& item);

class BatchTx {
 public:
  BatchTx(const std::vector<BatchItem*>& items, std::int64_t now_ms)
      : items_(items),
        ids_(items.size()),
        prints_(items.size()),
        decided_(items.size(), false),
        shard_(items.empty() ? 0 : items.front()->shard_key()) {
    for (std::size_t i = 0; i < items.size(); ++i) {
      items[i]->clear_outcome();
      ids_[i] = make_uuid_v7(now_ms, row_shard_key(items[i]->key.sku, items[i]->key.location));
    }
  }

  // The id the fast path gave its first reserve request, if it has one.
  std::optional<Uuid> first_reservation_id() const {
    for (std::size_t i = 0; i < items_.size(); ++i) {
      if (items_[i]->op == BatchOp::reserve) return ids_[i];
    }
    return std::nullopt;
  }

  // A reservation the full path decided to make in this attempt (not a replay), if any:
  // the attempt's transaction committed if and only if it is in the database.
  std::optional<Uuid> made_reservation_id() const {
    for (std::size_t i = 0; i < items_.size(); ++i) {
      const BatchItem& item = *items_[i];
      if (item.ok && item.op == BatchOp::reserve && item.reservation.id == ids_[i]) return ids_[i];
    }
    return std::nullopt;
  }

  // A keyed sell, confirm or release of the batch (the first), as its key's write, and the
  // outcome the attempt would have stored with it: the fast path claims every key or none,
  // so its key tells whether the statement landed, as a reservation does, if it holds this
  // statement's own prefix (an older call's or a concurrent duplicate's outcome says
  // nothing of this attempt). With `made`, one that this attempt of the full path decided
  // to make and whose key it claimed, whose key then holds exactly its outcome if the
  // attempt committed.
  struct KeyProbe {
    KeyedWrite write;
    std::string expected;
    bool whole = true;  // the whole outcome, or its start (a fast prefix)
  };
  std::optional<KeyProbe> keyed_write(bool made) const {
    for (std::size_t i = 0; i < items_.size(); ++i) {
      const BatchItem& item = *items_[i];
      if (!keyed(i) || item.op == BatchOp::reserve) continue;
      const KeyedWrite write{*item.idempotency_key, print_of(item), shard_};
      if (!made) {
        const auto prefix = fast_prefixes_.find(*item.idempotency_key);
        if (prefix != fast_prefixes_.end()) return KeyProbe{write, prefix->second, false};
        continue;
      }
      const auto claim = keys_.find(*item.idempotency_key);
      if (item.ok && claim != keys_.end() && claim->second.claimed && claim->second.first == i) {
        return KeyProbe{write, outcome_of(item), true};
      }
    }
    return std::nullopt;
  }

  // The fast statement landed though its answer was lost: every request was granted.
  // Reservations are read back, and so are keyed sells' levels (from their keys); a keyless
  // sell's resulting level is unknown, so it is in doubt. A step keeps the hold as the
  // attempt decided it (exact, whatever wrote the hold since), with the statement's time,
  // which its new reservations were made at: a batch with steps and no new reservation is
  // never adopted (resolve_fast).
  void adopt_landed(PostgresStore& store, Tx& tx, const Error& in_doubt_error) {
    std::vector<Uuid> ids;
    std::vector<std::string> names;
    for (std::size_t i = 0; i < items_.size(); ++i) {
      if (items_[i]->op == BatchOp::reserve) ids.push_back(ids_[i]);
      if (items_[i]->op == BatchOp::sell && keyed(i)) names.push_back(*items_[i]->idempotency_key);
    }
    const std::vector<Reservation> made = store.fetch(tx, ids);
    std::map<std::string, std::string> levels;  // each keyed sell's, if its key holds it
    if (!names.empty()) {
      for (const auto& row : tx.exec_on(shard_, Stmt::batch_keys_get, text_array(names))) {
        const std::string name = row[0].as<std::string>();
        const auto prefix = fast_prefixes_.find(name);
        if (row[3].is_null() || prefix == fast_prefixes_.end()) continue;
        const std::string outcome = row[3].as<std::string>();
        if (outcome.compare(0, prefix->second.size(), prefix->second) == 0) {
          levels.emplace(name, outcome);  // this statement's: its prefix names the attempt
        }
      }
    }
    std::size_t next = 0;
    for (BatchItem* item : items_) {
      item->clear_outcome();
      const auto level = item->idempotency_key ? levels.find(*item->idempotency_key) : levels.end();
      if (item->op == BatchOp::reserve) {
        item->reservation = made[next++];
        item->ok = true;
      } else if (is_transition(item->op) && !made.empty() && item->reservation.id == item->id) {
        item->reservation.updated_at_us = made.front().created_at_us;
        item->ok = true;
      } else if (level != levels.end()) {
        item->level = decode_outcome<StockLevel>(level->second);
        item->ok = true;
      } else {
        item->error = in_doubt_error;
      }
    }
  }

  // Transitions need the full path here (apply_batch tries the statement with steps for
  // them first: has_steps, steps_may_run_fast, read_steps), and so do idempotency keys,
  // unless the batch is on one row and its keys are distinct: then the keyed fast statement
  // claims them all or none.
  bool needs_full_path() const {
    std::set<std::string_view> names;
    bool buyers = false;
    for (std::size_t i = 0; i < items_.size(); ++i) {
      if (is_transition(items_[i]->op)) return true;
      buyers = buyers || items_[i]->buyer.has_value();
      if (keyed(i) && !names.insert(*items_[i]->idempotency_key).second) return true;
    }
    const bool one = one_row();
    // Buyers (purchase limits): the one-row statement takes their allowances, without keys.
    if (buyers && (!one || !names.empty())) return true;
    return !names.empty() && !one;
  }

  // Whether the fast path can take the batch (after needs_full_path): on Citus a batch on
  // one row without buyers (batch_fast would run as a two-phase transaction there; buyers'
  // counts lie on the shards of their own shard keys); on the plain layout any, except
  // refs or metadata with keys or buyers, which no fast statement carries together.
  bool fast_fits(bool citus) const {
    if (citus) return one_row() && !has_buyer();
    return !has_ref() || (!any_keyed() && !has_buyer());
  }

  bool has_ref() const {
    return std::any_of(items_.begin(), items_.end(), [](const BatchItem* item) {
      return item->ref.has_value() || item->metadata.has_value() || item->order_id.has_value();
    });
  }

  bool has_buyer() const {
    return std::any_of(items_.begin(), items_.end(),
                       [](const BatchItem* item) { return item->buyer.has_value(); });
  }

  // Whether every request of the batch is for one row.
  bool one_row() const {
    for (const BatchItem* item : items_) {
      if (is_transition(item->op) || !(item->key == items_.front()->key)) return false;
    }
    return true;
  }

  // Once the batch committed: each reserve and sell, and each confirm or release that
  // went through, learns its row's version as the batch found it and as it left it
  // (BatchItem::row_found; a transition's row is its reservation's). A row the batch did
  // not read (an unknown SKU, an answer adopted after a lost commit) has version 0 and
  // says nothing.
  // Also reports what each row moved to (Store::report_write, for `auto`'s tracker): a row that
  // moved by more than this batch's changes since this process's last write has other writers.
  template <class Report>
  void report_row_versions(const Report& report) const {
    for (const auto& [key, row] : rows_) {
      if (row.version != 0 && row.changes > 0) {
        report(key, row.version + row.changes, static_cast<std::uint32_t>(row.changes));
      }
    }
    const SkuKey* last = nullptr;
    const RowState* row = nullptr;
    for (BatchItem* item : items_) {
      if (is_transition(item->op) && !item->ok) continue;
      const SkuKey& key = item->row_key();
      if (last == nullptr || !(key == *last)) {
        const auto it = rows_.find(key);
        row = it == rows_.end() ? nullptr : &it->second;
        last = &key;
      }
      if (row == nullptr || row->version == 0) continue;
      item->row_found = row->version;
      item->row_left = row->version + row->changes;
    }
  }

  // Whether the fast path can run as one delegated call on Citus (migration citus/107):
  // one row without buyers (fast_fits), no keyed sell (its key stores the level the batch
  // leaves, which the statement form writes), no journal note (set in a transaction).
  bool delegable() const {
    for (std::size_t i = 0; i < items_.size(); ++i) {
      if (keyed(i) && items_[i]->op == BatchOp::sell) return false;
    }
    return one_row() && !has_buyer() && !note_in_scope();
  }
  // run_fast() then makes that call, its lock_timeout set inside.
  void delegate(std::optional<std::int64_t> lock_timeout_ms) {
    delegated_lock_timeout_ms_ = lock_timeout_ms;
  }
  // Whether the writes of the Citus statement forms (the full path, and write_one's when
  // the batch is not delegable) go as the delegated calls of citus/113 inside the
  // transaction, else as literal SQL (PostgresStore::batch_writes_delegable).
  void delegate_writes(bool yes) { delegated_writes_ = yes; }
  // The group of the node the delegated call ran on (direct routing), once it moved the row.
  std::int32_t ran_on() const { return ran_on_; }
  std::uint16_t shard() const { return shard_; }

  // Whether the batch asks for new units (a reserve or a sell).
  bool has_new_units() const {
    return std::any_of(items_.begin(), items_.end(),
                       [](const BatchItem* item) { return !is_transition(item->op); });
  }

  // Whether the batch has confirms or releases.
  bool has_steps() const {
    return std::any_of(items_.begin(), items_.end(),
                       [](const BatchItem* item) { return is_transition(item->op); });
  }

  // Whether its confirms and releases may take the fast path (batch_fast_one_steps; the
  // plain layout only): no key, buyer or reference anywhere in the batch, and its reserves
  // and sells on one row. read_steps() then checks the holds themselves.
  bool steps_may_run_fast() const {
    const SkuKey* row = nullptr;
    for (const BatchItem* item : items_) {
      if (is_transition(item->op)) continue;
      if (row != nullptr && !(item->key == *row)) return false;
      row = &item->key;
    }
    return !any_keyed() && !has_buyer() && !has_ref();
  }

  // Reads the holds of the batch's steps, without locks, in one statement (reset by no
  // attempt: run_fast decides the steps on them). True if every one is held, not lapsed,
  // and lies on the row of the batch's reserves and sells, and if the lifecycle's rules
  // grant every step and none gives units back to a buyer's count (a release of a limited
  // hold: the full path writes that count): the fast path may take the batch. Otherwise the
  // full path decides it, under the locks.
  bool read_steps(Tx& tx);

  // A step's hold and its version as read_steps found it: the fast statement writes every
  // hold it names or none, each with a new version, so a hold still at that version after a
  // lost connection says that the statement did not land.
  std::optional<std::pair<Uuid, Version>> step_probe() const {
    if (read_.empty()) return std::nullopt;
    return std::make_pair(read_.begin()->first, read_.begin()->second.reservation.version);
  }

  bool any_keyed() const {
    for (std::size_t i = 0; i < items_.size(); ++i) {
      if (keyed(i)) return true;
    }
    return false;
  }

  // The fast path; false if some row lacked room, or a step's hold changed after
  // read_steps (nothing was changed). `citus`: the layout's (fast_fits).
  bool run_fast(Tx& tx, bool citus) {
    reset();
    holds_ = read_;  // the steps' holds, as read_steps read them (none without steps)
    for (const BatchItem* item : items_) {
      RowState& row =
          rows_[is_transition(item->op) ? holds_.at(item->id).reservation.key : item->key];
      row.on_hand = std::numeric_limits<Quantity>::max() / 2;  // decide as if all fit
      row.reserved = row.on_hand / 2;  // and as if every step's units were reserved
    }
    decide();
    // quantity_max keeps a batch's sums far below the made-up level, so every request was
    // granted; should that ever fail, the full path decides against the rows as they are.
    for (const BatchItem* item : items_) {
      if (!item->ok) return false;
    }
    // One row: its own statements, which carry no refs or metadata on the plain layout
    // (batch_fast does, for any number of rows).
    const bool one_row = rows_.size() == 1 && (citus || !has_ref());
    const pqxx::result moved = !read_.empty() ? write_steps(tx)
                               : one_row      ? write_one(tx)
                                              : write_fast(tx);
    if (moved.empty()) return false;
    // Decide again from the rows as they stood before the write: every request fits, and
    // each gets the row's values right after it.
    for (const auto& row : moved) {
      // One row: its key; several (batch_fast): the row's slot is its last column.
      RowState& state = one_row
                            ? rows_.begin()->second
                            : rows_.at(SkuKey{row[0].as<std::string>(), row[1].as<std::string>(),
                                              row[after_limits].as<int>()});
      state.on_hand = row[2].as<std::int64_t>() + state.sold;
      state.reserved = row[3].as<std::int64_t>() - state.held;
      state.version = row[4].as<std::int64_t>() - state.changes;
      read_limits(row, 6, state);
      state.sold = state.held = state.changes = 0;
      now_us_ = row[5].as<std::int64_t>();
    }
    std::fill(decided_.begin(), decided_.end(), false);
    holds_ = read_;  // the steps again, from the holds as read
    transitions_.clear();
    decide();
    // The limited one-row statement names the SKU's purchase-limit group last.
    if (one_row && !citus && moved[0].size() > after_limits &&
        !moved[0][after_limits].as<std::string>().empty()) {
      for (BatchItem* item : items_) {
        if (item->ok && item->op == BatchOp::reserve && item->buyer) {
          item->reservation.limit_group = moved[0][after_limits].as<std::string>();
        }
      }
    }
    return true;
  }

  void run_full(PostgresStore& store, Tx& tx) {
    reset();
    claim_keys(store, tx);
    lock_reservations(tx);
    lock_allowances(tx);
    lock_rows(tx);
    decide();
    const std::size_t inserted = write_full(tx);
    if (inserted != reservations_written_) {
      // The rows are locked, so every update matches; anything else is a bug. Throwing
      // rolls the whole batch back.
      throw Error(ErrorCode::invariant_violation,
                  "a batch wrote " + std::to_string(inserted) + " of " +
                      std::to_string(reservations_written_) + " reservations; rolled back");
    }
    write_transitions(tx);
    write_allowances(tx);
    write_key_outcomes(tx);
    unclaim_refused(tx);
    settle_duplicates();
  }

 private:
  // A retried attempt starts from clean outcomes.
  void reset() {
    rows_.clear();
    keys_.clear();
    holds_.clear();
    transitions_.clear();
    fast_prefixes_.clear();
    limits_.clear();
    allowances_.clear();
    std::fill(decided_.begin(), decided_.end(), false);
    for (BatchItem* item : items_) item->clear_outcome();
  }

  // A request with an idempotency key (a reserve, a sell, a confirm or a release).
  bool keyed(std::size_t i) const { return items_[i]->idempotency_key.has_value(); }

  void claim_keys(PostgresStore& store, Tx& tx);
  void replay(PostgresStore& store, Tx& tx, const std::vector<std::string>& names);
  void lock_reservations(Tx& tx);
  void lock_allowances(Tx& tx);
  void write_allowances(Tx& tx);
  std::vector<pqxx::result> allowance_statement(Tx& tx, Stmt statement,
                                                const std::vector<std::string>& groups,
                                                const std::vector<std::string>& buyers,
                                                const std::vector<std::int64_t>& deltas);
  // Purchase limits for a reserve with a buyer: LimitExceeded (true) or room (false).
  bool limit_refuses(BatchItem& item);
  void lock_rows(Tx& tx);
  void decide();
  void decide_transition(BatchItem& item);
  void write_transitions(Tx& tx);
  pqxx::result write(Tx& tx, Stmt statement);
  pqxx::result write_fast(Tx& tx);
  // write() for the full path: the reservations it inserted.
  std::size_t write_full(Tx& tx);
  // The Citus forms' writes of new reservations and of keys (delegated_writes_: citus/113's
  // calls, else literal SQL); the keys written, for batch_keys.
  pqxx::result write_holds_citus(Tx& tx, std::int64_t now_us, const CitusHolds& h);
  pqxx::result write_keys_citus(Tx& tx, const std::vector<std::string>& names,
                                const std::vector<std::string>& prints,
                                const std::vector<std::string>& ids, bool skip_taken,
                                const std::vector<std::string>& outcomes = {});
  pqxx::result write_one(Tx& tx);
  pqxx::result write_steps(Tx& tx);
  OneRowHolds one_row_holds();
  pqxx::result write_one_citus(Tx& tx, const OneRowHolds& h, const NewKeys& k);
  pqxx::result write_one_delegated(Tx& tx, const OneRowHolds& h, const NewKeys& k);
  NewKeys new_keys(const RowState& row) const;
  void write_key_outcomes(Tx& tx);
  void unclaim_refused(Tx& tx);
  void settle_stored(BatchItem& item, const std::string& print, const KeyClaim& claim) const;
  void settle_duplicates();

  const std::vector<BatchItem*>& items_;
  std::vector<Uuid> ids_;
  std::vector<std::string> prints_;  // fingerprints of keyed requests
  std::vector<bool> decided_;
  std::map<std::string, KeyClaim> keys_;
  std::map<SkuKey, RowState> rows_;
  std::map<Uuid, Hold> holds_;  // the reservations transitions are about, as locked
  std::map<Uuid, Hold> read_;   // ... as read_steps read them, for the fast path
  // The reservations a transition changed (in holds_, with their new units and version),
  // each once: two partial steps of one hold in a batch write it once, as it ends up.
  std::vector<Uuid> transitions_;
  // The fast statement's keyed sells: each key's outcome prefix (store/keyed.hpp), which
  // names this batch's attempt (a lost commit's probe, adopt_landed).
  std::map<std::string, std::string> fast_prefixes_;
  // Purchase limits: each limited SKU's (group, per_buyer), and each (group, buyer) parent
  // row as locked, with the change this batch makes to it.
  struct Allowance {
    Quantity held = 0;
    Quantity delta = 0;
  };
  std::map<std::string, std::pair<std::string, Quantity>> limits_;
  std::map<std::pair<std::string, std::string>, Allowance> allowances_;
  TimestampUs now_us_ = 0;
  std::size_t reservations_written_ = 0;
  // The shard key of the batch's rows: on the Citus layout, apply_batch gives a BatchTx the
  // requests of one shard key only, so that each statement runs on one shard.
  std::uint16_t shard_ = 0;
  std::optional<std::int64_t> delegated_lock_timeout_ms_;  // delegate()
  bool delegated_writes_ = false;                          // delegate_writes()
  std::int32_t ran_on_ = -1;
};

}  // namespace stockade::detail::pg
