// PostgresStore retention: purge(), which the sweeper also runs when retention is set.
//
// Plain batched deletes, oldest first, through the two indexes of migration 002: each
// statement deletes at most purge_batch keys (with their reservations) or reservations
// and commits by itself, so a purge never holds many locks or one long transaction, and
// it never touches a stock row. A cursor carries each phase past what it deleted. (Time partitions
// that are dropped whole were measured against this; see benchmarks/retention.py and
// docs/design.md for why the deletes were kept.)
#include "postgres_store_impl.hpp"

namespace stockade::detail::pg {

PurgeCounts PostgresStore::purge_with(std::uint64_t limit, const PurgeStatement& delete_some,
                                      const std::function<bool()>& stop) {
  PurgeCounts out;
  std::uint64_t taken = 0;  // keys, and reservations without a key: what `limit` bounds
  for (Stmt statement : {Stmt::purge_keys, Stmt::purge_reservations}) {
    std::int64_t cursor = purge_cursor_start;
    for (;;) {
      const std::uint64_t room = limit - taken;
      if (room == 0 || (stop && stop())) return out;
      const std::uint64_t want = std::min<std::uint64_t>(room, options_.purge_batch);
      const PurgeStep step = delete_some(statement, want, cursor);
      const PurgeCounts got{step.reservations, step.keys};
      out.keys += got.keys;
      out.reservations += got.reservations;
      telemetry().purged(got);
      const std::uint64_t examined = statement == Stmt::purge_keys ? got.keys : got.reservations;
      taken += examined;
      cursor = step.cursor;
      if (examined < want) break;  // nothing more is old enough (or all of it is locked)
    }
  }
  return out;
}

PurgeStep PostgresStore::purge_step(Tx& tx, Stmt statement, std::int64_t older_than_us,
                                    std::uint64_t n, std::int64_t cursor) {
  const pqxx::result r = tx.exec(statement, older_than_us, static_cast<std::int64_t>(n), cursor);
  return PurgeStep{r[0][0].as<std::uint64_t>(), r[0][1].as<std::uint64_t>(),
                   r[0][2].as<std::int64_t>()};
}

PurgeCounts PostgresStore::purge(std::int64_t older_than_us, std::uint64_t limit) {
  if (statements_->citus()) throw citus_not_built("purge");
  const auto delete_some = [&](Stmt statement, std::uint64_t n, std::int64_t cursor) {
    return run<RunMode::one_statement>(nullptr, ErrorContext{}, [&](Tx& tx) {
      return purge_step(tx, statement, older_than_us, n, cursor);
    });
  };
  return purge_with(limit, delete_some, nullptr);
}

}  // namespace stockade::detail::pg
