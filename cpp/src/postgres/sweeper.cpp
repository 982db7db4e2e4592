// The background sweeper: one per database, elected with a session advisory lock.
#include <chrono>

#include "postgres_store_impl.hpp"
#include "stockade/hash.hpp"

namespace stockade::detail::pg {

// One sweeper per database: the instance holding the session advisory lock sweeps, the
// others retry the election every interval. Errors never stop the loop: they are counted
// (stats().sweeper), and the sweeper reconnects and stands again.
void PostgresStore::sweep_loop() {
  const std::int64_t election_key =
      static_cast<std::int64_t>(stable_hash64({options_.schema, "stockade-sweeper"}));
  std::unique_ptr<pqxx::connection> leader;
  bool elected = false;
  std::unique_lock<std::mutex> lock(sweeper_mutex_);
  while (!stopping_) {
    lock.unlock();
    std::uint64_t expired = 0;
    std::string error;
    try {
      if (!leader || !leader->is_open()) {
        elected = false;
        leader = connect(options_.dsn);
      }
      if (!elected) {
        pqxx::nontransaction session(*leader);
        const std::string sql = "SELECT pg_try_advisory_lock(" + std::to_string(election_key) + ")";
        elected = session.exec(sql)[0][0].as<bool>();
      }
      for (bool more = elected; more;) {
        const std::size_t n = expire_due(options_.sweep_batch);
        expired += n;
        std::lock_guard<std::mutex> check(sweeper_mutex_);
        more = n == options_.sweep_batch && !stopping_;
      }
    } catch (const std::exception& e) {
      error = e.what();
      leader.reset();  // closing the session also gives up the election
      elected = false;
    }
    lock.lock();
    telemetry().sweeper_round(elected, expired, error);
    sweeper_wake_.wait_for(lock, std::chrono::milliseconds(options_.sweep_interval_ms),
                           [this] { return stopping_; });
  }
  lock.unlock();
  telemetry().sweeper_round(false, 0, "");
}

}  // namespace stockade::detail::pg
