// PostgresStore's TestHooks: the oversell canary and holding a lock as another session.
// Not on any production path.
#include <chrono>
#include <thread>

#include "postgres_store_impl.hpp"
#include "stockade/hash.hpp"

namespace stockade::detail::pg {

Reservation PostgresStore::naive_reserve_unsafe(const SkuKey& key, Quantity qty,
                                                std::int64_t ttl_us, std::int64_t window_us) {
  const Uuid id = make_uuid_v7(SystemClock().now_us() / 1000, shard_key_of(key.sku, key.location));
  return run(nullptr, context_of(key), [&](Tx& tx) {
    // SELECT on_hand, reserved ...; the application decides on what it read.
    const Level read = read_row(tx, Stmt::stock_get, key);
    if (!read) throw_stock_not_found(key);
    if (read->available() < qty) throw_out_of_stock(key, read->available(), qty);
    if (window_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(window_us));
    // UPDATE stock SET reserved = :value_computed_from_the_stale_read  (the lost update)
    tx.exec(Stmt::stock_overwrite_reserved, key.sku, key.location, read->reserved + qty);
    return insert_reservation(tx, id, key, qty, ttl_us, std::nullopt);
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
