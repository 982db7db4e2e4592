// PostgresStore: the movement journal, the change feed, low-stock thresholds and the audit
// (migration 007, docs/journal.md).
//
// The feed. A consumer's position is a pair of snapshots: every change that committed in
// `from` was delivered; a poll takes the current snapshot `to` and reads the changes that
// committed in `to` but not in `from`, in position order. Per row, a change committed
// later than another (it waited for that one's row lock) is never in an earlier batch,
// and within a batch its position is the higher one (drawn after the lock), so each
// row's changes arrive in version order. A batch larger than the poll's limit is read in
// parts (`after`, the last position delivered of it). This is the PgQ scheme: it needs no
// lock and skips nothing, whatever order transactions commit in.
//
// On the Citus layout the journal lies on the shards beside its rows (citus/103) and each
// node counts its own transactions: a snapshot becomes one per node group, and each shard
// reads its node's, so the same reads run on every shard at once. Per row the order holds
// as on one server, for a row's entries all lie on its node.
#include <algorithm>
#include <cstdio>
#include <map>
#include <thread>

#include "postgres/postgres_store_impl.hpp"
#include "stockade/hash.hpp"

namespace stockade::detail::pg {

namespace {

Movement movement_from(const pqxx::row& r) {
  Movement m;
  m.position = r[0].as<std::int64_t>();
  m.key = SkuKey{r[1].as<std::string>(), r[2].as<std::string>(), r[3].as<int>()};
  m.version_before = r[4].as<std::int64_t>();
  m.version_after = r[5].as<std::int64_t>();
  m.on_hand_delta = r[6].as<std::int64_t>();
  m.reserved_delta = r[7].as<std::int64_t>();
  m.on_hand = r[8].as<std::int64_t>();
  m.reserved = r[9].as<std::int64_t>();
  m.available = r[10].as<std::int64_t>();
  m.cause = r[11].as<std::string>();
  m.reason = r[12].as<std::string>();
  m.actor = r[13].as<std::string>();
  m.ref = r[14].as<std::string>();
  m.requests = r[15].as<std::int64_t>();
  m.alerts = r[16].as<std::uint32_t>();
  m.at_us = r[17].as<std::int64_t>();
  return m;
}

std::vector<Movement> movements_from(const pqxx::result& rows) {
  std::vector<Movement> out;
  out.reserve(rows.size());
  for (const auto& r : rows) out.push_back(movement_from(r));
  return out;
}

[[noreturn]] void throw_overrun(const std::string& consumer) {
  throw Error(ErrorCode::feed_overrun,
              "feed consumer " + shown(consumer) +
                  " fell behind what the journal keeps: retention dropped changes it had not "
                  "read (feed_lag_max); drop it and open it again to go on from the journal's "
                  "start");
}

[[noreturn]] void throw_no_consumer(const std::string& consumer) {
  throw Error(ErrorCode::not_found, "no feed consumer " + shown(consumer) + " (it was dropped)");
}

SkuKey key_at(const pqxx::row& r) {
  return SkuKey{r[0].as<std::string>(), r[1].as<std::string>(), r[2].as<int>()};
}

}  // namespace

bool note_in_scope() noexcept {
  const JournalNote* note = current_note();
  return note != nullptr && !note->empty();
}

std::string note_text() {
  const JournalNote* note = current_note();
  if (note == nullptr || note->empty()) return std::string();
  const std::string sep = "\x1f";
  return note->cause + sep + note->reason + sep + note->actor + sep + note->ref;
}

void set_note(Tx& tx) {
  const std::string text = note_text();
  if (text.empty()) return;
  if (!tx.conn.statements().citus()) {
    tx.exec(Stmt::note_set, text);
    return;
  }
  // Citus carries a SET LOCAL to the workers, where the trigger runs (the transaction
  // began with citus.propagate_set_commands = 'local'), but not a set_config() call; in a
  // query of its own, as lock_timeout's (pool.cpp). The text is checked (no control
  // characters but the separators, bounded) and quoted.
  tx.work.exec("SET LOCAL stockade.note = " + tx.work.quote(text));
}

std::vector<Movement> PostgresStore::movements(const MovementQuery& q) {
  const auto limit = static_cast<std::int64_t>(q.limit);
  return run<RunMode::read>(nullptr, ErrorContext{}, [&](Tx& tx) {
    if (!q.sku) return movements_from(tx.exec(Stmt::movements_all, q.after, q.since_us, limit));
    return movements_from(tx.exec(Stmt::movements_sku, q.after, q.since_us, limit, *q.sku,
                                  q.location.value_or(std::string())));
  });
}

FeedPosition PostgresStore::feed_open(const std::string& consumer, bool from_start) {
  return run(nullptr, ErrorContext{}, [&](Tx& tx) {
    const pqxx::result r = tx.exec(Stmt::feed_open, consumer, from_start);
    if (r[0][3].as<bool>()) throw_overrun(consumer);
    return FeedPosition{r[0][0].as<std::string>(), r[0][1].as<std::string>(),
                        r[0][2].as<std::int64_t>()};
  });
}

FeedBatch PostgresStore::feed_poll(const std::string& consumer, const FeedPosition& from,
                                   std::size_t limit) {
  drain_listener();
  return run<RunMode::read>(nullptr, ErrorContext{}, [&](Tx& tx) {
    const pqxx::result state = tx.exec(Stmt::feed_state, consumer);
    if (state.empty()) throw_no_consumer(consumer);
    if (state[0][0].as<bool>()) throw_overrun(consumer);
    FeedBatch batch;
    batch.next = from;
    // The snapshot is taken before the read, in a statement of its own: every change it
    // shows as committed is visible to the read's later snapshot.
    if (batch.next.to.empty()) {
      batch.next.to = state[0][1].as<std::string>();
      batch.next.after = 0;
    }
    batch.changes = movements_from(tx.exec(Stmt::feed_read, batch.next.from, batch.next.to,
                                           batch.next.after, static_cast<std::int64_t>(limit)));
    if (batch.changes.size() < limit) {  // the batch is read: the next poll starts a new one
      batch.next = FeedPosition{batch.next.to, "", 0};
    } else {
      batch.next.after = batch.changes.back().position;
    }
    return batch;
  });
}

// Storing a position writes the same values however often it runs, so a commit whose
// COMMIT was lost runs once more, within the same call_timeout, instead of telling the
// caller InDoubt; only if that one is lost too does the caller hear of it, with what it
// can do (commit again: it is safe).
// A second attempt that cannot run or is cut too leaves the caller with an InDoubt that says
// so, and so does any other InDoubt of the call; a deadline that passed before the second
// attempt sent anything does not mean that nothing was stored (the first may have), so it
// is InDoubt as well. (Two processes that
// commit one consumer's positions at once may store either, retried or not: one consumer,
// one committer.)
void PostgresStore::feed_commit(const std::string& consumer, const FeedPosition& at) {
  const CallDeadline deadline(options_.call_timeout_ms);
  const auto unknown = [](const std::string& why) {
    return Error(ErrorCode::in_doubt,
                 "the feed's position may or may not be stored (" + why +
                     "); committing the same position again is safe: storing it is idempotent");
  };
  for (int lost = 0;; ++lost) {
    try {
      run(nullptr, ErrorContext{}, [&](Tx& tx) {
        if (!tx.exec(Stmt::feed_commit, consumer, at.from, at.to, at.after).empty()) return 0;
        const pqxx::result state = tx.exec(Stmt::feed_state, consumer);
        if (state.empty()) throw_no_consumer(consumer);
        throw_overrun(consumer);
      });
      return;
    } catch (const LostCommit& e) {
      if (lost > 0) throw unknown("the connection was lost twice: " + e.prelude);
    } catch (const Error& e) {
      // Any InDoubt (a deadline that fired after COMMIT was sent), and after a lost
      // commit a deadline that fired before the retry sent anything.
      const bool unsure =
          e.code() == ErrorCode::in_doubt || (lost > 0 && e.code() == ErrorCode::deadline_exceeded);
      if (unsure) throw unknown(e.what());
      throw;
    }
  }
}

bool PostgresStore::feed_drop(const std::string& consumer) {
  return run(nullptr, ErrorContext{},
             [&](Tx& tx) { return !tx.exec(Stmt::feed_drop, consumer).empty(); });
}

StockLevel PostgresStore::set_low_stock(const SkuKey& key, std::optional<Quantity> threshold) {
  return run(nullptr, context_of(key), [&](Tx& tx) {
    const pqxx::result r =
        tx.exec_on(shard_of(key), Stmt::stock_set_low_stock, key.sku, key.location,
                   threshold.value_or(0), threshold.has_value(), key.slot);
    if (r.empty()) throw_stock_not_found(key);
    return observed_write(level_from(key, r[0]));
  });
}

std::uint64_t PostgresStore::purge_movements(std::int64_t older_than_us, std::uint64_t limit) {
  const bool citus = options_.layout == Layout::citus;
  const std::int64_t lag_max_us = options_.feed_lag_max_ms * 1000;
  std::uint64_t gone = 0;
  while (gone < limit) {
    const auto n =
        static_cast<std::int64_t>(std::min<std::uint64_t>(limit - gone, options_.purge_batch));
    const std::uint64_t step = run(nullptr, ErrorContext{}, [&](Tx& tx) {
      if (!citus) {
        return tx.exec(Stmt::purge_movements, older_than_us, lag_max_us, n)[0][0]
            .as<std::uint64_t>();
      }
      const pqxx::row live = tx.exec(Stmt::feed_consumers_live)[0];
      return tx
          .exec(Stmt::purge_movements_citus, older_than_us, lag_max_us, n,
                live[0].as<std::string>(), live[1].as<std::string>())[0][0]
          .as<std::uint64_t>();
    });
    gone += step;
    if (step == 0) break;
  }
  return gone;
}

AuditReport PostgresStore::audit(const AuditOptions& options) {
  const std::string sku = options.sku.value_or(std::string());
  const auto limit = static_cast<std::int64_t>(options.limit) + 1;
  AuditReport report;
  report.checks = {"reservation_units", "reserved_matches_holds", "hold_not_expired",
                   "slot_row_has_sku", "incoming_matches_transfers"};
  if (!options.sku) {
    report.checks.insert(report.checks.end(), {"limit_matches_holds", "key_has_reservations"});
  }
  add_unchecked_scope(report, options);
  // Each check is one read-only statement: no row lock, and a snapshot held only for the
  // statement (about a second per million reservations).
  std::uint64_t rows_without_entry = 0;
  run<RunMode::read>(nullptr, ErrorContext{}, [&](Tx& tx) {
    const pqxx::row counts = tx.exec(Stmt::audit_counts, sku)[0];
    report.rows = counts[0].as<std::uint64_t>();
    report.reservations = counts[1].as<std::uint64_t>();
    report.movements = counts[2].as<std::uint64_t>();
    report.journal_checked = counts[3].as<bool>();
    rows_without_entry = counts[4].as<std::uint64_t>();
    return 0;
  });
  audit_holds(options, sku, limit, report);
  audit_transit(options, sku, report);
  if (!report.journal_checked) {
    add_unchecked_journal(report, "the journal is off (the trigger stock_journal of " +
                                      options_.schema +
                                      ".stock is disabled): changes made since are not journaled");
    return report;
  }
  report.checks.insert(report.checks.end(),
                       {"journal_chain", "journal_adds_up", "journal_matches_row"});
  add_unchecked_rows(report, rows_without_entry);
  run<RunMode::read>(nullptr, ErrorContext{}, [&](Tx& tx) {
    for (const Stmt s : {Stmt::audit_journal, Stmt::audit_journal_rows}) {
      for (const auto& r : tx.exec(s, sku, limit)) {
        // Both read: sku, location, slot, position, check, expected, found.
        add_violation(report, options,
                      {r[4].as<std::string>(), key_at(r), "position " + r[3].as<std::string>(),
                       r[5].as<std::string>(), r[6].as<std::string>()});
      }
    }
    return 0;
  });
  return report;
}

// Each own row's incoming against its transfers in transit (audit_incoming, audit_transit:
// each read on its own, in one snapshot). More than `most` of either, and the check says
// it compared none.
void PostgresStore::audit_transit(const AuditOptions& options, const std::string& sku,
                                  AuditReport& report) {
  constexpr std::int64_t most = 100000;
  std::map<SkuKey, std::pair<Quantity, Quantity>> seen;  // incoming, in transit
  bool whole = true;
  run<RunMode::read>(nullptr, ErrorContext{}, [&](Tx& tx) {
    const pqxx::result incoming = tx.exec(Stmt::audit_incoming, sku, most + 1);
    const pqxx::result transit = tx.exec(Stmt::audit_transit, sku, most + 1);
    whole = incoming.size() <= most && transit.size() <= most;
    for (const auto& r : incoming) {
      seen[SkuKey{r[0].as<std::string>(), r[1].as<std::string>(), 0}].first =
          r[2].as<std::int64_t>();
    }
    for (const auto& r : transit) {
      seen[SkuKey{r[0].as<std::string>(), r[1].as<std::string>(), 0}].second =
          r[2].as<std::int64_t>();
    }
    return 0;
  });
  if (!whole) {
    report.unchecked.push_back(
        {"incoming_matches_transfers",
         "more than " + std::to_string(most) + " rows with units incoming: not compared"});
    return;
  }
  for (const auto& [key, units] : seen) {
    if (units.first == units.second) continue;
    add_violation(report, options,
                  {"incoming_matches_transfers", key, "",
                   "incoming = " + std::to_string(units.second) + " (its transfers in transit)",
                   "incoming = " + std::to_string(units.first)});
  }
}

void PostgresStore::audit_holds(const AuditOptions& options, const std::string& sku,
                                std::int64_t limit, AuditReport& report) {
  run<RunMode::read>(nullptr, ErrorContext{}, [&](Tx& tx) {
    for (const auto& row : tx.exec(Stmt::audit_units, sku, limit)) {
      const Reservation r = read_reservation(row);
      add_violation(report, options,
                    {"reservation_units", r.key, r.id.to_string(),
                     "held + confirmed + released + expired = qty, returned <= confirmed, "
                     "state held exactly while units are held",
                     units_of(r)});
    }
    for (const auto& r : tx.exec(Stmt::audit_reserved, sku, limit)) {
      add_violation(
          report, options,
          {"reserved_matches_holds", key_at(r), "", "reserved = " + r[4].as<std::string>(),
           r[3].is_null() ? "no such row" : "reserved = " + r[3].as<std::string>()});
    }
    for (const auto& r : tx.exec(Stmt::audit_lapsed, sku, options.expiry_lag_us, limit)) {
      add_violation(report, options,
                    {"hold_not_expired",
                     SkuKey{r[1].as<std::string>(), r[2].as<std::string>(), r[3].as<int>()},
                     r[0].as<std::string>(), "expired by the sweeper", "still held"});
    }
    for (const auto& r : tx.exec(Stmt::audit_slots, sku, limit)) {
      add_violation(
          report, options,
          {"slot_row_has_sku", key_at(r), "", "the SKU's own row (slot 0)", "no such row"});
    }
    if (!sku.empty()) return 0;
    for (const auto& r : tx.exec(Stmt::audit_limits, limit)) {
      add_violation(
          report, options,
          {"limit_matches_holds", SkuKey{"", "", 0},
           r[0].as<std::string>() + "/" + r[1].as<std::string>(),
           "held >= " + r[2].as<std::string>() + " and <= per_buyer " + r[4].as<std::string>(),
           "held = " + r[3].as<std::string>()});
    }
    for (const auto& r : tx.exec(Stmt::audit_keys, limit)) {
      add_violation(report, options,
                    {"key_has_reservations", SkuKey{"", "", 0}, shown(r[0].as<std::string>(), 128),
                     "reservation " + r[1].as<std::string>(), "no such reservation"});
    }
    return 0;
  });
}

}  // namespace stockade::detail::pg

namespace stockade::detail::pg {

namespace {

// How long the notifier gathers commits before one NOTIFY, and how long one waiter holds
// the listening connection before it looks at its deadline again.
constexpr auto notify_interval = std::chrono::milliseconds(20);
constexpr std::int64_t listen_slice_us = 100'000;

}  // namespace

std::string feed_channel(const std::string& schema) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx",
                static_cast<unsigned long long>(stable_hash64({"feed", schema})));
  return std::string("stockade_feed_") + hex;  // within NAMEDATALEN, whatever the schema
}

// One NOTIFY on the feed's channel for the commits of each interval: a pg_notify in the
// writing transaction would take the server's notify lock through every COMMIT and its
// flush, one committer at a time. A writer that dies between its COMMIT and the NOTIFY
// leaves the waiters to their bounded wait.
void PostgresStore::notify_loop() {
  std::unique_lock<std::mutex> lock(sweeper_mutex_);
  while (!stopping_) {
    notify_wake_.wait_for(lock, std::chrono::seconds(1), [this] {
      return stopping_ || feed_dirty_.load(std::memory_order_relaxed);
    });
    if (stopping_) break;
    if (!feed_dirty_.load(std::memory_order_relaxed)) continue;
    notify_wake_.wait_for(lock, notify_interval, [this] { return stopping_; });
    feed_dirty_.store(false, std::memory_order_relaxed);
    lock.unlock();
    send_notify();
    lock.lock();
  }
}

// On a connection of the notifier's own, not the pool's: it never takes a caller's
// connection, and it never holds one across a migrate(). Bounded by call_timeout; a
// failure drops the connection (the next NOTIFY opens another).
void PostgresStore::send_notify() {
  try {
    if (!notifier_conn_) {
      notifier_conn_ = std::make_unique<Connection>(options_.dsn, statements_, options_.pooler,
                                                    &watchdog_, call_deadline_us());
    }
    Connection& conn = *notifier_conn_;
    const Watchdog::Guard guard = watchdog_.arm(conn.raw(), conn.backend(), call_deadline_us());
    pqxx::nontransaction work(conn.raw());
    Tx tx{work, conn};
    tx.exec(Stmt::feed_notify, channel_);
    if (guard.fired()) notifier_conn_.reset();
  } catch (const std::exception& e) {  // the waiters fall back on their bounded wait
    notifier_conn_.reset();
    log(LogLevel::debug, "stockade.feed", std::string("a feed NOTIFY failed: ") + e.what());
  }
}

FeedWake PostgresStore::feed_wait(std::int64_t timeout_us) {
  const std::int64_t until = steady_now_us() + timeout_us;
  std::unique_lock<std::mutex> lock(listen_mutex_);
  const std::uint64_t seen = listen_generation_;
  while (listen_generation_ == seen) {
    if (listen_refused_) return FeedWake::unsupported;
    const std::int64_t now = steady_now_us();
    if (now >= until) return FeedWake::timeout;
    if (listening_) {  // another waiter holds the connection: wait for its news
      listen_cv_.wait_for(lock, std::chrono::microseconds(std::min(until - now, listen_slice_us)));
      continue;
    }
    listening_ = true;
    lock.unlock();
    bool heard = false;
    try {
      heard = listen_once(std::min(until, now + listen_slice_us));
    } catch (...) {
      lock.lock();
      listening_ = false;
      listen_cv_.notify_all();
      throw;
    }
    lock.lock();
    listening_ = false;
    if (heard) ++listen_generation_;
    listen_cv_.notify_all();
  }
  return FeedWake::changed;
}

// A consumer that keeps finding changes never waits, so the NOTIFYs its listening session
// receives would pile up unread (and hold back the server's notification queue): each
// poll reads them off, without blocking, unless a waiter holds the session.
void PostgresStore::drain_listener() {
  std::unique_lock<std::mutex> lock(listen_mutex_, std::try_to_lock);
  if (!lock.owns_lock() || listening_ || !listener_) return;
  try {
    listener_->raw().get_notifs();
  } catch (const std::exception&) {
    listener_.reset();  // the next wait opens another
  }
}

// Waits on the listening connection until `until_us` (steady clock); true if a
// notification came. Opens the connection (and LISTENs) first if there is none; a broken
// one is dropped, and the wait ends as a timeout.
bool PostgresStore::listen_once(std::int64_t until_us) {
  try {
    if (!listener_) {
      {
        std::lock_guard<std::mutex> stop(sweeper_mutex_);
        if (stopping_) return false;
      }
      // The Citus layout runs its pool as if pooled (effective(), store.cpp); LISTEN on
      // the coordinator works all the same unless a pooler really stands before it.
      const Pooler pooler = options_.layout == Layout::citus ? Pooler::detect : options_.pooler;
      auto conn = std::make_unique<Connection>(options_.dsn, statements_, pooler, &watchdog_,
                                               call_deadline_us());
      if (conn->pooled()) {
        log(LogLevel::info, "stockade.feed",
            "LISTEN does not work through a transaction-mode pooler: the change feed's "
            "poll(timeout=...) polls with backoff instead");
        std::lock_guard<std::mutex> lock(listen_mutex_);
        listen_refused_ = true;
        return false;
      }
      pqxx::nontransaction(conn->raw()).exec("LISTEN " + channel_);
      listener_ = std::move(conn);
    }
    const std::int64_t left = std::max<std::int64_t>(until_us - steady_now_us(), 0);
    return listener_->raw().await_notification(left / 1'000'000, left % 1'000'000) > 0;
  } catch (const std::exception& e) {
    listener_.reset();
    log(LogLevel::debug, "stockade.feed", std::string("the feed's LISTEN broke: ") + e.what());
    std::this_thread::sleep_for(std::chrono::microseconds(
        std::min<std::int64_t>(std::max<std::int64_t>(until_us - steady_now_us(), 0), 100'000)));
    return false;
  }
}

}  // namespace stockade::detail::pg
