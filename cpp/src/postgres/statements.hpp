// The SQL of every statement the PostgreSQL store prepares, in one place, with the schema
// name filled in. Long statements are built from named pieces in statements.cpp.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

namespace stockade::detail::pg {

// Every statement, once: X(name) for each. The enum, the names of the prepared statements
// ("stockade_" and the name) and the routines' names come from this one list.
#define STOCKADE_STATEMENTS(X) \
  X(stock_get)                 \
  X(stock_lock)                \
  X(stock_lock_nowait)         \
  X(stock_lock_skip)           \
  X(stock_insert)              \
  X(stock_set_on_hand)         \
  X(stock_delta)               \
  X(stock_settle)              \
  X(stock_set_backorder_limit) \
  X(stock_set_discontinued)    \
  X(lease_next_token)          \
  X(lease_acquire)             \
  X(lease_renew)               \
  X(lease_release)             \
  X(stock_cas)                 \
  X(stock_overwrite_reserved)  \
  X(hold_atomic)               \
  X(reservation_insert)        \
  X(reservation_get)           \
  X(reservation_lock)          \
  X(reservation_set)           \
  X(reservation_get_many)      \
  X(expire_pick)               \
  X(purge_keys)                \
  X(purge_reservations)        \
  X(counts_estimate)           \
  X(idempotency_claim)         \
  X(idempotency_get)           \
  X(limit_lookup)              \
  X(allowance_take)            \
  X(allowance_get)             \
  X(allowance_give)            \
  X(limit_upsert)              \
  X(limit_skus_set)            \
  X(limit_sku_owner)           \
  X(limit_delete)              \
  X(batch_allowance_make)      \
  X(allowance_make_one)        \
  X(batch_allowance_lock)      \
  X(batch_allowance_write)     \
  X(advisory_lock)             \
  X(advisory_try_lock)         \
  X(batch_claim)               \
  X(batch_keys_get)            \
  X(batch_lock)                \
  X(batch_write)               \
  X(batch_unclaim)             \
  X(batch_fast)                \
  X(batch_fast_one)            \
  X(batch_fast_one_keyed)      \
  X(batch_fast_one_limited)    \
  X(batch_lock_reservations)   \
  X(batch_transition)          \
  X(due_shards)                \
  X(citus_move_one)            \
  X(citus_keys_taken)          \
  X(citus_move)                \
  X(expire_lock)               \
  X(expire_set)                \
  X(purge_key_shards)          \
  X(citus_shard_groups)        \
  X(purge_reservation_shards)  \
  X(purge_keys_lock)           \
  X(purge_blockers)            \
  X(purge_keys_delete)         \
  X(purge_reservations_lock)   \
  X(purge_keys_present)        \
  X(purge_reservations_delete) \
  X(sku_rows)

// Every statement the store runs on its hot paths; each is prepared once per connection,
// on first use (so that a connection to an unmigrated database still opens).
enum class Stmt : std::size_t {
#define STOCKADE_STMT_ENUM(name) name,
  STOCKADE_STATEMENTS(STOCKADE_STMT_ENUM)
#undef STOCKADE_STMT_ENUM
      count_
};

inline constexpr std::size_t stmt_count = static_cast<std::size_t>(Stmt::count_);
// How many old entries one read of a Citus purge step takes (purge_key_shards).
inline constexpr int purge_read_citus = 2048;

// The SQL of every statement, with the schema name filled in.
//
// Statements are written once, with markers where the Citus layout names the shard key:
// `@PIN` (` AND shard_key = $k`), `@PIN(a)` (the same on alias a), `@SKC` and `@SKV` (the
// column and its value in an INSERT) and `@SKF` (first in an ON CONFLICT target). $k is
// one past the statement's last parameter. The plain layout drops the markers, so its
// SQL is what it was before the Citus layout existed.
class Statements {
 public:
  // `schema_version` names the tables the statements run on (the store passes its
  // migrations' names): it goes into the routines' names with their SQL.
  explicit Statements(const std::string& schema, bool citus = false,
                      std::string schema_version = std::string());
  const std::string& sql(Stmt s) const { return sql_[static_cast<std::size_t>(s)]; }
  // Whether the statement takes the shard key as its last parameter (Citus layout only).
  bool pinned(Stmt s) const { return pinned_[static_cast<std::size_t>(s)]; }
  bool citus() const { return citus_; }
  const std::string& schema() const { return schema_; }
  static const char* name(Stmt s);

  // Statement routines, for connections that keep no session state (behind a transaction
  // pooler, where named prepared statements cannot live): a PL/pgSQL function per hot
  // statement whose body is the statement itself, so that each server session plans it
  // once, as it would a prepared statement, instead of on every execution. migrate()
  // makes them; a connection uses them once they all exist. Not on the Citus layout.
  // The statements that have one (none on Citus); the accessors below give "" for others.
  const std::vector<Stmt>& routines() const { return routines_; }
  bool has_routine(Stmt s) const { return routine_[static_cast<std::size_t>(s)]; }
  // The function's name, unqualified: the statement's name and a hash of its SQL and of
  // the schema version, so that a release whose statement or tables differ makes a
  // function of its own beside the old one, which engines of the earlier release may
  // still call (a function keeps the column types it was made with).
  const std::string& routine_name(Stmt s) const {
    return routine_names_[static_cast<std::size_t>(s)];
  }
  // How many parameters the statement takes ($1..$n).
  int parameters(Stmt s) const { return parameters_[static_cast<std::size_t>(s)]; }
  // "SELECT * FROM schema.routine(" (close it with the arguments and ")").
  const std::string& routine_call_head(Stmt s) const { return heads_[static_cast<std::size_t>(s)]; }
  // The call with its parameters: "SELECT * FROM schema.routine($1, ..., $n)".
  const std::string& routine_call(Stmt s) const { return calls_[static_cast<std::size_t>(s)]; }

 private:
  template <class Set>
  void add_stock_statements(const std::string& schema, Set& set);
  template <class Set>
  void add_reservation_statements(const std::string& schema, Set& set);
  template <class Set>
  void add_limit_statements(const std::string& schema, Set& set);
  template <class Set>
  void add_batch_statements(const std::string& schema, Set& set);
  template <class Set>
  void add_batch_fast_statements(const std::string& schema, Set& set);

  std::array<std::string, stmt_count> sql_;
  std::array<bool, stmt_count> pinned_{};
  std::array<int, stmt_count> parameters_{};
  std::array<bool, stmt_count> routine_{};
  std::array<std::string, stmt_count> routine_names_, heads_, calls_;
  std::vector<Stmt> routines_;
  bool citus_ = false;
  std::string schema_;
  std::string schema_version_;
};

// `sql` with its shard-key markers rendered for the layout; sets *pinned when the result
// takes the shard key as a parameter. Exposed for tests.
std::string render_shard_markers(const std::string& sql, bool citus, bool* pinned);

}  // namespace stockade::detail::pg
