// PostgresStore's TestHooks: the oversell canary and holding a lock as another session.
// Not on any production path.
#include <chrono>
#include <thread>

#include "postgres/postgres_store_impl.hpp"
#include "stockade/hash.hpp"

namespace stockade::detail::pg {

Reservation PostgresStore::naive_reserve_unsafe(const SkuKey& key, Quantity qty,
                                                std::int64_t ttl_us, std::int64_t window_us) {
  const Uuid id = make_uuid_v7(SystemClock().now_us() / 1000, row_shard_key(key.sku, key.location));
  return run(nullptr, context_of(key), [&](Tx& tx) {
    // SELECT on_hand, reserved ...; the application decides on what it read.
    const Level read = read_row(tx, Stmt::stock_get, key);
    if (!read) throw_stock_not_found(key);
    if (read->available() < qty) throw_out_of_stock(key, read->available(), qty);
    if (window_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(window_us));
    // UPDATE stock SET reserved = :value_computed_from_the_stale_read  (the lost update)
    tx.exec_on(shard_of(key), Stmt::stock_overwrite_reserved, key.sku, key.location,
               read->reserved + qty, key.slot);
    return insert_reservation(tx, id, key, qty, ttl_us, std::nullopt);
  });
}

Reservation PostgresStore::limited_reserve_by_check(const SkuKey& key, Quantity qty,
                                                    const std::string& buyer, bool serializable,
                                                    std::int64_t window_us) {
  const Uuid id = make_uuid_v7(SystemClock().now_us() / 1000, row_shard_key(key.sku, key.location));
  WriteOptions options;  // counted as atomic; serialization failures are retried by run()
  return run(&options, context_of(key), [&](Tx& tx) {
    if (serializable) tx.conn.exec_sql(tx.work, "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE");
    const pqxx::result limit = tx.exec(Stmt::limit_lookup, text_array({key.sku}));
    if (limit.empty()) throw_invalid_argument("sku " + shown(key.sku) + " has no purchase limit");
    const std::string group = limit[0][1].as<std::string>();
    const Quantity per_buyer = limit[0][2].as<std::int64_t>();
    // SELECT sum(qty) FROM reservation WHERE buyer = :buyer AND sku IN (the group's skus)
    const Quantity held =
        tx.conn
            .exec_sql(tx.work,
                      "SELECT coalesce(sum(r.qty - r.released - r.expired - r.returned), 0) FROM " +
                          options_.schema + ".reservation r JOIN " + options_.schema +
                          ".purchase_limit_sku s ON s.sku = r.sku WHERE s.group_name = " +
                          tx.work.quote(group) + " AND r.buyer = " + tx.work.quote(buyer) +
                          " AND r.state IN ('held', 'confirmed')")[0][0]
            .as<std::int64_t>();
    if (held + qty > per_buyer) throw limit_exceeded(key, group, buyer, held, per_buyer, qty);
    if (window_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(window_us));
    const pqxx::result rows =
        tx.exec_on(shard_of(key), Stmt::stock_delta, key.sku, key.location, Quantity{0}, qty, qty,
                   std::int64_t{-1}, std::int64_t{-1}, key.slot);
    if (rows.empty()) refuse(tx, key, qty, std::nullopt, std::nullopt, true);
    return insert_reservation(tx, id, key, qty, 15LL * 60 * 1000 * 1000, std::nullopt, buyer,
                              group);
  });
}

namespace {

// A lock held by its own connection and transaction, as another session would hold it.
class HeldLock final : public LockHold {
 public:
  explicit HeldLock(std::unique_ptr<pqxx::connection> conn) : conn_(std::move(conn)) {
    work_ = std::make_unique<pqxx::work>(*conn_);
  }
  pqxx::work& work() { return *work_; }
  ~HeldLock() override {
    work_.reset();  // rolls back, releasing the lock
    conn_.reset();
  }

 private:
  std::unique_ptr<pqxx::connection> conn_;
  std::unique_ptr<pqxx::work> work_;
};

}  // namespace

std::unique_ptr<LockHold> PostgresStore::hold_lock(const SkuKey& key, Strategy kind,
                                                   std::int64_t timeout_ms) {
  if (kind != Strategy::pessimistic && kind != Strategy::advisory) {
    throw_invalid_argument(std::string("hold_lock takes 'pessimistic' or 'advisory', not '") +
                           strategy_name(kind) + "'");
  }
  auto held = std::make_unique<HeldLock>(connect(options_.dsn));
  pqxx::work& work = held->work();
  WriteOptions options;
  options.lock_timeout_ms = timeout_ms;
  try {
    work.exec("SET LOCAL lock_timeout = " + std::to_string(timeout_ms));
    const pqxx::result row =
        work.exec("SELECT 1 FROM " + options_.schema + ".stock WHERE sku = " + work.quote(key.sku) +
                  " AND location = " + work.quote(key.location) +
                  (statements_->citus()
                       ? " AND shard_key = " + std::to_string(row_shard_key(key.sku, key.location))
                       : std::string()) +
                  (kind == Strategy::pessimistic ? " FOR UPDATE" : ""));
    if (row.empty()) throw_stock_not_found(key);
    if (kind == Strategy::advisory) {
      work.exec("SELECT pg_advisory_xact_lock(" + std::to_string(advisory_key(key)) + ")");
    }
  } catch (const pqxx::sql_error& e) {
    throw translate(e, Failure{&options, context_of(key), options_.schema});
  } catch (const pqxx::failure& e) {
    throw Error(ErrorCode::database_error, std::string("database error: ") + e.what(),
                context_of(key));
  }
  return held;
}

}  // namespace stockade::detail::pg
