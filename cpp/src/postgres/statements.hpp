// The SQL of every statement the PostgreSQL store prepares, in one place, with the schema
// name filled in. Long statements are built from named pieces in statements.cpp.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace stockade::detail::pg {

// Every statement, once: X(name, kind) for each. The enum, the names of the prepared
// statements ("stockade_" and the name) and the routines' names come from this one list.
// The kinds: `routine`, a statement that also has a statement routine behind poolers (see
// routines()); `plain`, one that has none; `citus`, one that only the Citus layout runs.
#define STOCKADE_STATEMENTS(X)        \
  X(stock_get, routine)               \
  X(stock_lock, routine)              \
  X(stock_lock_nowait, routine)       \
  X(stock_lock_skip, routine)         \
  X(stock_insert, routine)            \
  X(stock_set_on_hand, plain)         \
  X(stock_set_slots, plain)           \
  X(stock_delta, routine)             \
  X(stock_settle, routine)            \
  X(stock_set_backorder_limit, plain) \
  X(stock_set_safety_stock, plain)    \
  X(stock_set_units, plain)           \
  X(stock_set_transit, plain)         \
  X(transfer_insert, plain)           \
  X(transfer_get, plain)              \
  X(transfer_lock, plain)             \
  X(transfer_set, plain)              \
  X(transfers_list, plain)            \
  X(transfers_finished, plain)        \
  X(transfers_purge, plain)           \
  X(stock_set_discontinued, plain)    \
  X(lease_next_token, plain)          \
  X(lease_acquire, plain)             \
  X(lease_renew, plain)               \
  X(lease_release, plain)             \
  X(stock_cas, routine)               \
  X(stock_overwrite_reserved, plain)  \
  X(hold_atomic, routine)             \
  X(reservation_insert, routine)      \
  X(reservation_get, routine)         \
  X(reservation_lock, routine)        \
  X(reservation_set, routine)         \
  X(reservation_return, plain)        \
  X(reservation_resize, plain)        \
  X(reservation_get_many, routine)    \
  X(order_lines, plain)               \
  X(order_lock, plain)                \
  X(pool_lock, plain)                 \
  X(pool_lock_nowait, plain)          \
  X(sku_locations, plain)             \
  X(order_key_get, plain)             \
  X(find_by_ref, plain)               \
  X(find_by_order, plain)             \
  X(find_by_buyer, plain)             \
  X(expire_pick, plain)               \
  X(purge_keys, plain)                \
  X(purge_reservations, plain)        \
  X(counts_estimate, plain)           \
  X(idempotency_claim, routine)       \
  X(idempotency_get, routine)         \
  X(idempotency_outcome_set, plain)   \
  X(idempotency_unclaim, plain)       \
  X(idempotency_ids_set, plain)       \
  X(limit_lookup, plain)              \
  X(allowance_take, plain)            \
  X(allowance_get, plain)             \
  X(allowance_give, plain)            \
  X(limit_upsert, plain)              \
  X(limit_skus_set, plain)            \
  X(limit_sku_owner, plain)           \
  X(limit_delete, plain)              \
  X(batch_allowance_make, plain)      \
  X(allowance_make_one, plain)        \
  X(batch_allowance_lock, plain)      \
  X(batch_allowance_write, plain)     \
  X(advisory_lock, plain)             \
  X(advisory_try_lock, plain)         \
  X(batch_claim, routine)             \
  X(batch_keys_get, routine)          \
  X(batch_lock, routine)              \
  X(batch_write, plain)               \
  X(batch_unclaim, plain)             \
  X(batch_key_outcomes, plain)        \
  X(batch_fast, routine)              \
  X(batch_fast_one, routine)          \
  X(batch_fast_one_keyed, routine)    \
  X(batch_fast_one_limited, routine)  \
  X(batch_fast_one_steps, routine)    \
  X(batch_lock_reservations, routine) \
  X(batch_transition, plain)          \
  X(due_shards, citus)                \
  X(citus_move_one, citus)            \
  X(citus_reserve_one, citus)         \
  X(citus_reserve_routed, citus)      \
  X(citus_batch_one, citus)           \
  X(citus_sell_one, citus)            \
  X(citus_step_one, citus)            \
  X(citus_purge_shard, citus)         \
  X(citus_keys_taken, citus)          \
  X(citus_move, citus)                \
  X(expire_lock, citus)               \
  X(expire_set, citus)                \
  X(purge_key_shards, citus)          \
  X(citus_shard_groups, citus)        \
  X(citus_shard_ranges, citus)        \
  X(citus_purge_delegable, citus)     \
  X(citus_batch_holds, citus)         \
  X(citus_batch_keys, citus)          \
  X(citus_batch_outcomes, citus)      \
  X(citus_batch_delegable, citus)     \
  X(citus_shard_path_usable, citus)   \
  X(purge_reservation_shards, citus)  \
  X(purge_keys_lock, citus)           \
  X(purge_blockers, citus)            \
  X(purge_keys_delete, citus)         \
  X(purge_reservations_lock, citus)   \
  X(purge_keys_present, citus)        \
  X(purge_reservations_delete, citus) \
  X(sku_rows, plain)                  \
  X(note_set, plain)                  \
  X(stock_set_low_stock, plain)       \
  X(movements_all, plain)             \
  X(movements_sku, plain)             \
  X(feed_open, plain)                 \
  X(feed_state, plain)                \
  X(feed_read, plain)                 \
  X(feed_commit, plain)               \
  X(feed_drop, plain)                 \
  X(feed_notify, plain)               \
  X(purge_movements, plain)           \
  X(feed_consumers_live, citus)       \
  X(purge_movements_citus, citus)     \
  X(audit_reserved, plain)            \
  X(audit_lapsed, plain)              \
  X(audit_units, plain)               \
  X(audit_limits, plain)              \
  X(audit_slots, plain)               \
  X(audit_incoming, plain)            \
  X(audit_transit, plain)             \
  X(audit_keys, plain)                \
  X(audit_journal, plain)             \
  X(audit_journal_rows, plain)        \
  X(audit_counts, plain)

// Every statement the store runs on its hot paths; each is prepared once per connection,
// on first use (so that a connection to an unmigrated database still opens).
enum class Stmt : std::size_t {
#define STOCKADE_STMT_ENUM(name, kind) name,
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
  // Whether only the Citus layout runs the statement (kind `citus`).
  static bool citus_only(Stmt s);

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
  void add_lease_statements(const std::string& schema, Set& set);
  template <class Set>
  void add_reservation_statements(const std::string& schema, Set& set);
  template <class Set>
  void add_order_statements(const std::string& schema, Set& set);
  template <class Set>
  void add_retention_statements(const std::string& schema, Set& set);
  template <class Set>
  void add_count_statements(const std::string& schema, Set& set);
  template <class Set>
  void add_key_statements(const std::string& schema, Set& set);
  template <class Set>
  void add_limit_statements(const std::string& schema, Set& set);
  template <class Set>
  void add_expiry_statements(const std::string& schema, Set& set);
  template <class Set>
  void add_citus_statements(const std::string& schema, Set& set);
  void name_routines();

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

// What the statement builders hand each statement's SQL to.
using StatementSink = std::function<void(Stmt, const std::string&)>;
// The hot-row batcher's statements (statements_batch.cpp): the full path's, the fast path
// on several rows, on one row (with keys, and on Citus), and on one row with buyers.
void add_batch_statements(const std::string& schema, const StatementSink& set);
// Transfers between locations: the transfer's rows and its stock rows' writes
// (statements_transfers.cpp).
void add_transfer_statements(const std::string& schema, const StatementSink& set);
// The Citus layout's delegated call (migration citus/105): an atomic reserve, keyless or
// keyed, as one call that Citus runs on the worker that holds the row
// (statements_citus_batch.cpp).
void add_delegated_statements(const std::string& schema, const StatementSink& set);
// A transfer's columns as transfer_from (postgres/transfers.cpp) reads them.
std::string transfer_columns();
void add_batch_fast_statements(const std::string& schema, const StatementSink& set);
void add_batch_fast_one_statements(const std::string& schema, const StatementSink& set);
void add_batch_fast_limited_statement(const std::string& schema, const StatementSink& set);
void add_batch_fast_steps_statement(const std::string& schema, const StatementSink& set);

// Pieces of SQL that several statement builders share.
namespace sql {
// The predicate on one stock row: $1 and $2 its SKU, and its hot-row slot.
inline constexpr const char* row_key = " WHERE sku = $1 AND location = $2 AND slot = @SLOT@PIN";
// The units a row can still promise (migration 003: backorders; 013: the units withheld
// from sale): the SQL form of available_units() (types.hpp), unclamped, for guards that
// compare it with a positive quantity. Every guarded write and the batch's checks use it.
inline constexpr const char* room =
    "on_hand + backorder_limit - reserved - safety_stock - damaged - quality_control";
// A stock row's quantity states, in this order, wherever a row is read (level_from, and
// the batch's statements, which read them right after backorder_limit).
inline constexpr const char* states = "safety_stock, damaged, quality_control, incoming";
// Whether a write without a fencing token may change the row: not discontinued, and no
// lease live (the rule of check_writable, which classifies a refusal afterwards).
inline constexpr const char* open_row =
    "discontinued_at IS NULL AND (lease_expires_at IS NULL OR lease_expires_at <= now())";
}  // namespace sql

// A reservation's columns as read_reservation reads them.
std::string reservation_columns();
// The journal's, the feed's and the audit's statements (statements_record.cpp).
void add_record_statements(const std::string& schema, bool citus, const StatementSink& set);
// A stock row's columns as the store reads them (level_from in stock.cpp), and how many
// there are: a statement that reads more puts them after these.
std::string stock_columns_sql();
inline constexpr int stock_column_count = 15;

// `sql` with its slot marker rendered: `@SLOT` is the stock row's hot-row slot, a parameter
// one past the statement's last (so the callers pass the row's slot after the statement's
// other parameters, before the shard key that @PIN adds). Exposed for tests.
std::string render_slot_marker(const std::string& sql);

// `sql` with its shard-key markers rendered for the layout; sets *pinned when the result
// takes the shard key as a parameter. Exposed for tests.
std::string render_shard_markers(const std::string& sql, bool citus, bool* pinned);

// A timestamp as it travels: microseconds since the epoch (UTC), the unit of TimestampUs.
std::string epoch_us(const std::string& column);

// `table` and the columns of a new reservation, in the one order every INSERT of one lists
// them (`buyer`: with its buyer and purchase-limit group; `order`: and its order id, ref and
// metadata), with the `@SKC` marker.
std::string new_reservation(const std::string& table, bool buyer, bool order = false);

// A value quoted as an SQL literal (the connection's quoting).
using Quote = std::function<std::string(const std::string&)>;

// The reservations a Citus batch inserts, one element per reservation (`buyers`, `groups`,
// `refs`, `metadata` and `orders`, the order ids, may be empty: none).
struct CitusHolds {
  const std::vector<std::string>& ids;
  const std::vector<std::string>& skus;
  const std::vector<std::string>& locations;
  const std::vector<std::int64_t>& slots;
  const std::vector<std::int64_t>& qtys;
  const std::vector<std::int64_t>& ttls;
  const std::vector<std::string>& keys;
  const std::vector<std::string>& buyers;
  const std::vector<std::string>& groups;
  const std::vector<std::string>& refs;
  const std::vector<std::string>& metadata;
  const std::vector<std::string>& orders;
};

// The Citus layout's multi-row INSERTs of a batch's reservations and of its keys
// (statements_citus_batch.cpp); `skip_taken`: ON CONFLICT DO NOTHING RETURNING the keys
// claimed. A key's id is its reservation's ('' for a sell's key), and its outcome a sell's
// (`outcomes` empty, or '' for a reserve's key: none).
std::string citus_holds_sql(const Quote& quote, const std::string& schema, std::uint16_t shard,
                            std::int64_t now_us, const CitusHolds& h);
std::string citus_keys_sql(const Quote& quote, const std::string& schema, std::uint16_t shard,
                           const std::vector<std::string>& names,
                           const std::vector<std::string>& prints,
                           const std::vector<std::string>& ids, bool skip_taken,
                           const std::vector<std::string>& outcomes = {});
// The outcomes of a batch's keyed sells, stored with their keys (batch_key_outcomes).
std::string citus_key_outcomes_sql(const Quote& quote, const std::string& schema,
                                   std::uint16_t shard, const std::vector<std::string>& names,
                                   const std::vector<std::string>& outcomes);

}  // namespace stockade::detail::pg
