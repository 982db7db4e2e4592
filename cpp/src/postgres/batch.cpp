// PostgresStore::apply_batch: many reserve and sell requests, one transaction (the paths
// are described in batch_tx.hpp). Here: which path a batch takes, a lost commit resolved,
// and the per-SKU counts.
#include <map>

#include "postgres/batch_tx.hpp"

namespace stockade::detail::pg {

// Citus runs a statement on one shard only when it names one shard key: a batch whose
// requests span several runs as one batch per shard key, each in arrival order (and
// returns true; false for a batch of one shard key, which runs whole). A group's failure
// is its own requests' answer: the other groups are transactions of their own (on another
// shard, perhaps another worker, that may be up), and one that committed before it must
// not be reported as failed.
bool PostgresStore::apply_by_shard(const std::vector<BatchItem*>& items,
                                   const BatchOptions& options) {
  std::map<std::uint16_t, std::vector<BatchItem*>> by_shard;
  for (BatchItem* item : items) {
    item->clear_outcome();
    by_shard[item->shard_key()].push_back(item);
  }
  if (by_shard.size() == 1) return false;
  for (const auto& [shard, group] : by_shard) {
    try {
      apply_batch(group, options);
    } catch (const Error& e) {
      for (BatchItem* item : group) {
        item->ok = false;
        item->error = e;
      }
    }
  }
  return true;
}

void PostgresStore::apply_batch(const std::vector<BatchItem*>& items, const BatchOptions& options) {
  if (items.empty()) return;
  // One bound over the fast statement, the full path and the resolution of a lost commit:
  // the deadline of the batch's oldest request, so that a batch queued behind one whose
  // commit hung keeps its callers' bound instead of waiting call_timeout anew.
  std::int64_t oldest_us = 0;
  for (const BatchItem* item : items) {
    if (item->started_us != 0 && (oldest_us == 0 || item->started_us < oldest_us)) {
      oldest_us = item->started_us;
    }
  }
  const CallDeadline deadline(options_.call_timeout_ms, oldest_us);
  if (statements_->citus() && apply_by_shard(items, options)) return;
  WriteOptions write;
  write.strategy = Strategy::batched;
  write.lock_timeout_ms = options.lock_timeout_ms;
  const std::int64_t now_ms = SystemClock().now_us() / 1000;
  const ErrorContext context = context_of(items.front()->key);
  BatchTx batch(items, now_ms);
  // Take one skip if any are left (flushers of several shards share the count).
  int skips = fast_skips_.load(std::memory_order_relaxed);
  while (skips > 0 && !fast_skips_.compare_exchange_weak(skips, skips - 1)) {
  }
  const bool fast = skips == 0 && takes_fast_path(batch, context);
  if (fast) {
    std::optional<bool> done;
    try {
      done = run_fast_path(batch, write, context);
    } catch (const FastMiss&) {
      done = false;
    } catch (const LostCommit& e) {
      done = resolve_fast(batch, e, context);  // empty: it did not land, run the full path
    }
    if (done && *done) {
      batch.report_row_versions(
          [this](const SkuKey& k, Version v, std::uint32_t n) { report_write(k, v, n); });
      count_batch(items);
      return;
    }
    // A miss: no room, likely for the next batches too. A batch of steps alone misses only
    // when a hold changed after the read, which says nothing of the next batches.
    if (done && batch.has_new_units()) {
      fast_skips_.store(fast_skips_after_miss, std::memory_order_relaxed);
    }
  }
  with_batch_writes(batch, [&] {
    run_full_resolving(batch, write, context);
    return true;
  });
  batch.report_row_versions(
      [this](const SkuKey& k, Version v, std::uint32_t n) { report_write(k, v, n); });
  count_batch(items);
}

// Whether the fast path may take the batch. One with confirms or releases on the plain
// layout first reads their holds (one statement, no locks), on which it decides them; holds
// that the fast path cannot take (a buyer's count to give units back to, a lapsed hold, a
// step the rules refuse) make the next batches skip it, as a miss does, so that a limited
// drop's confirms do not pay for that read on every batch.
bool PostgresStore::takes_fast_path(BatchTx& batch, const ErrorContext& context) {
  const bool citus = statements_->citus();
  if (!batch.has_steps()) return !batch.needs_full_path() && batch.fast_fits(citus);
  if (citus || !batch.steps_may_run_fast()) return false;
  if (run<RunMode::read>(nullptr, context, [&](Tx& tx) { return batch.read_steps(tx); })) {
    return true;
  }
  fast_skips_.store(fast_skips_after_miss, std::memory_order_relaxed);
  return false;
}

bool PostgresStore::run_fast_path(BatchTx& batch, const WriteOptions& write,
                                  const ErrorContext& context) {
  if (statements_->citus() && batch.delegable()) {
    batch.delegate(write.lock_timeout_ms);
    const std::optional<bool> done = run_delegated(Delegated::batch, batch.shard(), &write, context,
                                                   [&](Tx& tx, std::int32_t* ran_on) {
                                                     const bool moved = batch.run_fast(tx, true);
                                                     if (ran_on != nullptr && moved)
                                                       *ran_on = batch.ran_on();
                                                     return moved;
                                                   });
    if (done) return *done;
    batch.delegate(std::nullopt);  // no delegated functions: the transaction
  }
  return with_batch_writes(batch, [&] {
    return run_on<RunMode::one_statement>(batch.shard(), &write, context, [&](Tx& tx) {
      return batch.run_fast(tx, statements_->citus());
    });
  });
}

// On Citus, fn() with the batch's writes of reservations and keys through citus/113's
// calls where batch_writes_delegable says so (read once; only a batch that takes a
// statement form asks). A call that finds its function gone (42883: the schema was
// migrated back, or a function dropped by hand) stops the store using them, said once, and
// fn() runs again with the SQL text: the transaction that failed rolled back whole.
// migrate() makes the store ask again.
template <class Fn>
bool PostgresStore::with_batch_writes(BatchTx& batch, Fn&& fn) {
  const bool delegated = statements_->citus() && batch_writes_delegable();
  batch.delegate_writes(delegated);
  if (!delegated) return fn();
  try {
    return fn();
  } catch (const Error& e) {
    if (e.code() != ErrorCode::schema_not_migrated || e.context().sqlstate != undefined_function) {
      throw;
    }
    if (batch_writes_.exchange(-1) != -1) say_no_batch_writes();
    batch.delegate_writes(false);
    return fn();
  }
}

// The full path, one transaction. If its commit is lost and the session was ended, a
// reservation the attempt made, or else the key of a keyed write it made, tells whether it
// committed: if so, every decision of the attempt stands (grants, refusals, replays,
// transitions, sells, all in that one transaction); if not, nothing changed and the batch
// runs once more. A batch that made neither (only keyless sells, transitions or replays)
// stays InDoubt.
void PostgresStore::run_full_resolving(BatchTx& batch, const WriteOptions& write,
                                       const ErrorContext& context) {
  for (int lost = 0;; ++lost) {
    try {
      run_on(batch.shard(), &write, context, [&](Tx& tx) {
        batch.run_full(*this, tx);
        return true;
      });
      return;
    } catch (const LostCommit& e) {
      if (lost > 0) throw;
      // Unsettled, each look answers only if the attempt is there; InDoubt otherwise.
      if (const std::optional<Uuid> probe = batch.made_reservation_id()) {
        if (!find_landed({*probe}, e, context).empty()) return;
      } else if (const auto key = batch.keyed_write(true)) {
        const OutcomeMatch ours{key->expected, true};
        if (landed_outcome(key->write, e, context, &ours)) return;
      } else {
        throw;
      }
    }
  }
}

// The fast statement's connection broke while it ran, or before it was sent (a pooled
// connection that a server restart killed looks alive until used). run() ended its server
// session first, so the statement has landed or not for good (a statement still waiting
// for a row lock could otherwise commit after we looked). It inserts every reservation of
// the batch or none, so one of them tells which: if not, nothing changed and the batch
// runs the full path; if so, the reservations are read back, and only sells (which leave
// no row to look for) stay in doubt. A keyed sell's key tells as a reservation does, and
// gives its level back. A batch with steps and no new reservation (the statement with
// steps) is told by its first hold: still at the version read, the statement did not land;
// moved, it may have, or another write moved it, so InDoubt. A batch of sells alone, or a
// session that could not be ended, fails with InDoubt.
std::optional<bool> PostgresStore::resolve_fast(BatchTx& batch, const LostCommit& lost,
                                                const ErrorContext& context) {
  // Unsettled, each look answers only if the batch is there already; InDoubt otherwise.
  if (const std::optional<Uuid> probe = batch.first_reservation_id()) {
    if (find_landed({*probe}, lost, context).empty()) return std::nullopt;
  } else if (const auto step = batch.step_probe()) {
    // Still at the version read: not landed. Moved: by this statement or another, unknown.
    if (step_moved(step->first, step->second, lost, context)) throw lost;
    settle_landing(lost, false, "");
    return std::nullopt;
  } else if (const auto key = batch.keyed_write(false)) {
    const OutcomeMatch ours{key->expected, false};
    if (!landed_outcome(key->write, lost, context, &ours)) return std::nullopt;
  } else {
    throw lost;
  }
  run<RunMode::read>(nullptr, context, [&](Tx& tx) {
    batch.adopt_landed(*this, tx, lost);
    return true;
  });
  return true;
}

bool PostgresStore::step_moved(const Uuid& id, Version version, const LostCommit& lost,
                               const ErrorContext& context) {
  const std::vector<Reservation> rows = read_after_loss({id}, lost, context);
  return rows.empty() || rows.front().version != version;
}

// Per-SKU counters, as the per-request paths keep them: one count per run of requests
// for the same key.
void PostgresStore::count_batch(const std::vector<BatchItem*>& items) {
  const SkuKey* last = nullptr;
  std::uint64_t requests = 0;
  std::uint64_t refused = 0;
  auto flush = [&] {
    if (last == nullptr) return;
    if (requests > 0) telemetry().count(*last, SkuEvent::request, requests);
    if (refused > 0) telemetry().count(*last, SkuEvent::refused, refused);
  };
  for (const BatchItem* item : items) {
    if (is_transition(item->op)) continue;  // counted per SKU as reserve and sell only
    if (last == nullptr || !(item->key == *last)) {
      flush();
      last = &item->key;
      requests = refused = 0;
    }
    if (item->count_request) ++requests;
    if (item->error && item->error->code() == ErrorCode::out_of_stock && item->count_refusal) {
      ++refused;
    }
  }
  flush();
}

}  // namespace stockade::detail::pg
