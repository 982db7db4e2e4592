// Transfers between locations (statements.hpp): the transfer's own rows, and the writes of
// its stock rows, which the store decides on the rows as locked (store/transfers.hpp).
#include <string>

#include "postgres/statements.hpp"

namespace stockade::detail::pg {

std::string transfer_columns() {
  return "id::text, sku, source, destination, qty, received, rejected, cancelled, state,"
         " version, " +
         epoch_us("created_at") + ", " + epoch_us("updated_at") + ", reason, actor";
}

void add_transfer_statements(const std::string& schema, const StatementSink& set) {
  const std::string stock = schema + ".stock";
  const std::string transfer = schema + ".transfer";
  const std::string key = sql::row_key;
  // Timestamps leave through a CTE: Citus refuses non-immutable functions in RETURNING.
  const auto returning = [](const std::string& write) {
    return "WITH w AS (" + write + " RETURNING *) SELECT " + transfer_columns() + " FROM w";
  };
  const auto returning_stock = [](const std::string& write) {
    return "WITH w AS (" + write + " RETURNING *) SELECT " + stock_columns_sql() + " FROM w";
  };
  set(Stmt::stock_set_transit,
      returning_stock("UPDATE " + stock +
                      " SET on_hand = $3, incoming = $4, version = version + 1,"
                      " updated_at = now()" +
                      key));
  set(Stmt::transfer_insert,
      returning("INSERT INTO " + transfer +
                " (id, sku, source, destination, qty, state, version, reason, actor, created_at,"
                " updated_at@SKC) VALUES ($1::uuid, $2, $3, $4, $5, 'in_transit', 1,"
                " NULLIF($6, ''), NULLIF($7, ''), now(), now()@SKV)"));
  const std::string get =
      "SELECT " + transfer_columns() + " FROM " + transfer + " WHERE id = $1::uuid@PIN";
  set(Stmt::transfer_get, get);
  set(Stmt::transfer_lock, get + " FOR UPDATE");
  set(Stmt::transfer_set,
      returning("UPDATE " + transfer +
                " SET received = $2, rejected = $3, cancelled = $4, state = $5,"
                " version = version + 1, updated_at = now() WHERE id = $1::uuid@PIN"));
  // transfers(): by id, after $3 (the nil id for none), one SKU's ('' for any) in one state
  // ('' for any). `t.id`: the column, which the primary key orders, not the text of it
  // that the SELECT list names `id`.
  set(Stmt::transfers_list, "SELECT " + transfer_columns() + " FROM " + transfer +
                                " AS t WHERE ($1 = '' OR sku = $1) AND ($2 = '' OR state = $2)"
                                " AND t.id > $3::uuid ORDER BY t.id LIMIT $4");
  // Retention: up to $2 finished transfers last changed more than $1 us ago, then their
  // DELETE (two statements: on Citus a DELETE by id runs on every shard, a LIMIT in it
  // would not plan). The DELETE checks the state again: a transfer never comes back to
  // transit, but the guard costs nothing.
  set(Stmt::transfers_finished, "SELECT id::text FROM " + transfer +
                                    " WHERE state <> 'in_transit' AND updated_at < now() -"
                                    " $1::bigint * interval '1 microsecond'"
                                    " ORDER BY updated_at LIMIT $2");
  set(Stmt::transfers_purge,
      "DELETE FROM " + transfer + " WHERE id = ANY($1::uuid[]) AND state <> 'in_transit'");
  // The audit's incoming_matches_transfers: the own rows with units incoming, and the
  // transfers in transit by destination, each read apart (on Citus a transfer lives on its
  // source's shard, its destination's row on another) and compared by
  // PostgresStore::audit_transit; at most $2 of each.
  const std::string sku_is = "($1 = '' OR sku = $1)";
  set(Stmt::audit_incoming, "SELECT sku, location, incoming FROM " + stock +
                                " WHERE slot = 0 AND incoming <> 0 AND " + sku_is +
                                " LIMIT $2::bigint");
  set(Stmt::audit_transit,
      "SELECT sku, destination, sum(qty - received - rejected -"
      " cancelled)::bigint FROM " +
          transfer + " WHERE state = 'in_transit' AND " + sku_is +
          " GROUP BY sku, destination LIMIT $2::bigint");
}

}  // namespace stockade::detail::pg
