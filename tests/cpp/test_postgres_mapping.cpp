// The PostgreSQL store's pure parts, without a server: the SQLSTATE mapping, the prepared
// statements' SQL, schema names and options. The store against a real server is tested
// from pytest (tests/python/test_postgres.py), which starts one.
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "postgres/dsn.hpp"
#include "postgres/postgres_store_impl.hpp"
#include "postgres/routes.hpp"
#include "postgres/sqlstate.hpp"
#include "postgres/statements.hpp"
#include "stockade/hash.hpp"
#include "stockade/postgres_store.hpp"
#include "test_support.hpp"

namespace stockade::detail::pg {
namespace {

Error map(const char* sqlstate, const std::string& message = "boom", bool nowait = false) {
  WriteOptions options;
  options.nowait = nowait;
  options.lock_timeout_ms = 250;
  ErrorContext context;
  context.sku = "sku-1";
  return translate(pqxx::sql_error(message, "SELECT 1", sqlstate),
                   Failure{&options, context, "shop"});
}

TEST(SqlstateMapping, LockErrorsTellNowaitFromLockTimeout) {
  EXPECT_EQ(map("55P03", "could not obtain lock on row in relation \"stock\"", true).code(),
            ErrorCode::lock_not_available);
  const Error timeout = map("55P03", "canceling statement due to lock timeout");
  EXPECT_EQ(timeout.code(), ErrorCode::lock_timeout);
  EXPECT_NE(std::string(timeout.what()).find("250 ms"), std::string::npos) << timeout.what();
}

TEST(SqlstateMapping, LockErrorsFollowTheRequestsNowaitNotTheServersWording) {
  // A server with lc_messages = 'de_DE' words both cases in German; only the request's own
  // option may decide between them.
  const std::string german =
      "konnte Sperre f\u00fcr Zeile in Relation \u00bbstock\u00ab nicht setzen";
  EXPECT_EQ(map("55P03", german, true).code(), ErrorCode::lock_not_available);
  EXPECT_EQ(map("55P03", german, false).code(), ErrorCode::lock_timeout);
  EXPECT_EQ(map("55P03", "canceling statement due to lock timeout", true).code(),
            ErrorCode::lock_not_available);
}

TEST(SqlstateMapping, OneTableDecidesWhatIsRetried) {
  EXPECT_TRUE(is_retryable("40001"));
  EXPECT_TRUE(is_retryable("40P01"));
  EXPECT_FALSE(is_retryable("55P03"));
  EXPECT_FALSE(is_retryable("23505"));
  EXPECT_FALSE(is_retryable("08006"));
  EXPECT_EQ(rule_for("08P01").code, ErrorCode::unavailable);  // by its class
  EXPECT_EQ(rule_for("XX000").code, ErrorCode::database_error);
}

TEST(SqlstateMapping, EveryDocumentedStateHasItsCode) {
  EXPECT_EQ(map("57014").code(), ErrorCode::overloaded);
  EXPECT_EQ(map("23505").code(), ErrorCode::idempotency_conflict);
  EXPECT_EQ(map("23514").code(), ErrorCode::invariant_violation);
  EXPECT_EQ(map("22003").code(), ErrorCode::invalid_argument);
  EXPECT_EQ(map("42P01").code(), ErrorCode::schema_not_migrated);
  EXPECT_EQ(map("3F000").code(), ErrorCode::schema_not_migrated);
  EXPECT_EQ(map("42703").code(), ErrorCode::schema_not_migrated);
  EXPECT_EQ(map("28P01").code(), ErrorCode::misconfigured);
  EXPECT_EQ(map("28000").code(), ErrorCode::misconfigured);
  EXPECT_EQ(map("3D000").code(), ErrorCode::misconfigured);
  EXPECT_EQ(map("42501").code(), ErrorCode::misconfigured);
  EXPECT_EQ(map("08006").code(), ErrorCode::unavailable);
  EXPECT_EQ(map("53300").code(), ErrorCode::unavailable);
  EXPECT_EQ(map("57P01").code(), ErrorCode::unavailable);
  EXPECT_EQ(map("XX000").code(), ErrorCode::database_error);
}

// A failed connection attempt has no SQLSTATE: the server's (English) refusals are told
// apart from an unreachable or restarting server by their wording.
TEST(SqlstateMapping, RefusedConnectionsAreToldFromUnreachableServers) {
  EXPECT_TRUE(is_refusal("FATAL:  password authentication failed for user \"shop\""));
  EXPECT_TRUE(is_refusal("FATAL:  no pg_hba.conf entry for host \"10.0.0.1\", user \"x\""));
  EXPECT_TRUE(is_refusal("FATAL:  database \"shop\" does not exist"));
  EXPECT_TRUE(is_refusal("FATAL:  role \"shop\" does not exist"));
  EXPECT_TRUE(is_refusal("fe_sendauth: no password supplied"));
  EXPECT_TRUE(is_refusal("FATAL:  \"trust\" authentication failed"));  // PgBouncer
  EXPECT_TRUE(is_refusal("ERROR:  no such database: shop"));           // PgBouncer
  EXPECT_FALSE(
      is_refusal("connection to server at \"127.0.0.1\", port 1 failed: Connection "
                 "refused\n\tIs the server running on that host?"));
  EXPECT_FALSE(is_refusal("FATAL:  the database system is starting up"));
  EXPECT_FALSE(is_refusal("FATAL:  sorry, too many clients already"));
  EXPECT_FALSE(is_refusal("server closed the connection unexpectedly"));
}

// libpqxx 6.4 throws insufficient_privilege and others without their SQLSTATE: the
// exception's class stands in for it.
TEST(SqlstateMapping, AnExceptionWithoutItsCodeIsMappedByItsClass) {
  const Error refused = translate(pqxx::insufficient_privilege("must be owner of schema shop"),
                                  Failure{nullptr, ErrorContext{}, "shop"});
  EXPECT_EQ(refused.code(), ErrorCode::misconfigured);
  EXPECT_EQ(refused.context().sqlstate, "42501");
  EXPECT_EQ(sqlstate_of(pqxx::unique_violation("taken")), "23505");
  EXPECT_EQ(sqlstate_of(pqxx::sql_error("x", "SELECT 1", "XX000")), "XX000");
}

// A lost connection is logged in plain words, not in libpqxx's.
TEST(SqlstateMapping, LostConnectionsAreNamedPlainly) {
  EXPECT_EQ(plain_cause("Could not obtain client encoding: not connected."),
            "the server had already closed the connection: a restart or an ended session");
  EXPECT_EQ(plain_cause("FATAL:  terminating connection due to administrator command\nserver "
                        "closed the connection unexpectedly"),
            "the server ended the session: a restart, a shutdown or pg_terminate_backend");
  EXPECT_EQ(plain_cause("Connection to database failed"),
            "the connection broke and could not be opened again: the server was down or "
            "restarting");
  EXPECT_EQ(plain_cause("something new\nand more"), "something new");
  EXPECT_EQ(plain_cause(std::string(500, 'x')).size(), 160U);
}

TEST(SqlstateMapping, ErrorsCarryTheSqlstateAndTheContext) {
  const Error e = map("23514", "violates check constraint \"stock_reserved_within_on_hand\"");
  EXPECT_EQ(e.context().sqlstate, "23514");
  EXPECT_EQ(e.context().sku, "sku-1");
  EXPECT_NE(std::string(e.what()).find("stock_reserved_within_on_hand"), std::string::npos);
  EXPECT_NE(std::string(map("42P01").what()).find("'shop'"), std::string::npos);
}

TEST(Statements, EveryStatementNamesTheSchemaOrALockFunction) {
  const Statements statements("shop");
  for (std::size_t i = 0; i < stmt_count; ++i) {
    const std::string& sql = statements.sql(static_cast<Stmt>(i));
    ASSERT_FALSE(sql.empty()) << Statements::name(static_cast<Stmt>(i));
    const bool schema = sql.find("shop.") != std::string::npos;
    const bool lock = sql.find("pg_") != std::string::npos;
    const bool note = sql.find("set_config('stockade.note'") != std::string::npos;  // journal
    EXPECT_TRUE(schema || lock || note) << sql;
    if (!note) {  // the note's GUC is named stockade.note; no statement names that schema
      EXPECT_EQ(sql.find("stockade."), std::string::npos) << sql;
    }
  }
  // The sweeper orders stock rows bytewise, as std::string does: the engine's lock order.
  EXPECT_NE(statements.sql(Stmt::expire_pick).find("COLLATE \"C\""), std::string::npos);
  EXPECT_NE(statements.sql(Stmt::expire_pick).find("SKIP LOCKED"), std::string::npos);
}

// The statements only the Citus layout runs that name shard keys without a marker: the
// reads of which shard keys have work, and retention's statements on one Citus shard.
bool citus_only(Stmt s) {
  switch (s) {
    case Stmt::due_shards:
    case Stmt::purge_key_shards:
    case Stmt::purge_reservation_shards:
    case Stmt::citus_shard_groups:
    case Stmt::purge_keys_lock:
    case Stmt::purge_blockers:
    case Stmt::purge_keys_delete:
    case Stmt::purge_reservations_lock:
    case Stmt::purge_reservations_delete:
    case Stmt::purge_movements_citus:
      return true;
    default:
      return false;
  }
}

TEST(Statements, TheSlotMarkerIsOneParameterPastTheLastAndComesBeforeTheShardKey) {
  const std::string sql = "UPDATE t SET a = $3 WHERE k = $1 AND l = $2 AND s = @SLOT@PIN";
  const std::string slotted = render_slot_marker(sql);
  EXPECT_EQ(slotted, "UPDATE t SET a = $3 WHERE k = $1 AND l = $2 AND s = $4@PIN");
  bool pinned = false;
  EXPECT_EQ(render_shard_markers(slotted, true, &pinned),
            "UPDATE t SET a = $3 WHERE k = $1 AND l = $2 AND s = $4 AND shard_key = $5::int");
  // Every @SLOT of a statement is the same parameter; a statement without one is as it was.
  EXPECT_EQ(render_slot_marker("INSERT INTO t VALUES ($1, @SLOT) RETURNING @SLOT"),
            "INSERT INTO t VALUES ($1, $2) RETURNING $2");
  EXPECT_EQ(render_slot_marker("SELECT $1"), "SELECT $1");
  // Every statement that names a stock row's key names its slot too.
  const Statements plain("shop", false);
  for (std::size_t i = 0; i < stmt_count; ++i) {
    const std::string& text = plain.sql(static_cast<Stmt>(i));
    EXPECT_EQ(text.find("@SLOT"), std::string::npos) << Statements::name(static_cast<Stmt>(i));
    if (text.find(".stock") != std::string::npos &&
        text.find("location = $2") != std::string::npos && static_cast<Stmt>(i) != Stmt::sku_rows) {
      EXPECT_NE(text.find("slot = $"), std::string::npos) << Statements::name(static_cast<Stmt>(i));
    }
  }
}

TEST(Statements, ShardMarkersVanishOnThePlainLayoutAndPinOnCitus) {
  bool pinned = true;
  const std::string sql = "UPDATE t SET a = $3 WHERE k = $1 AND l = $2@PIN";
  EXPECT_EQ(render_shard_markers(sql, false, &pinned),
            "UPDATE t SET a = $3 WHERE k = $1 AND l = $2");
  EXPECT_FALSE(pinned);
  EXPECT_EQ(render_shard_markers(sql, true, &pinned),
            "UPDATE t SET a = $3 WHERE k = $1 AND l = $2 AND shard_key = $4::int");
  EXPECT_TRUE(pinned);
  EXPECT_EQ(render_shard_markers("INSERT INTO t (a@SKC) VALUES ($1@SKV) ON CONFLICT (@SKFa) "
                                 "DO NOTHING RETURNING (SELECT 1 FROM u s WHERE s.a = $1@PIN(s))",
                                 true, &pinned),
            "INSERT INTO t (a, shard_key) VALUES ($1, $2::int) ON CONFLICT (shard_key, a) DO "
            "NOTHING RETURNING (SELECT 1 FROM u s WHERE s.a = $1 AND s.shard_key = $2::int)");
  EXPECT_EQ(render_shard_markers("SELECT 1 WHERE x = $1", true, &pinned), "SELECT 1 WHERE x = $1");
  EXPECT_FALSE(pinned);  // no marker: takes no shard key
  // No statement keeps a marker; on Citus every stock, reservation and buyer-count
  // statement is pinned,
  // and the plain layout's statements take no shard key at all.
  const Statements plain("shop", false);
  const Statements citus("shop", true);
  for (std::size_t i = 0; i < stmt_count; ++i) {
    const auto s = static_cast<Stmt>(i);
    EXPECT_EQ(plain.sql(s).find('@'), std::string::npos) << Statements::name(s);
    EXPECT_EQ(citus.sql(s).find('@'), std::string::npos) << Statements::name(s);
    EXPECT_FALSE(plain.pinned(s)) << Statements::name(s);
    // Only the Citus layout runs these: they read which shard keys have work, or name
    // the shard keys of one Citus shard as an array.
    if (!citus_only(s)) {
      EXPECT_EQ(plain.sql(s).find("shard_key"), std::string::npos) << Statements::name(s);
    }
  }
  // Retention's statements on one Citus shard name its shard keys for both tables they
  // read: the outer one and the one under NOT EXISTS.
  for (Stmt s : {Stmt::purge_keys_lock, Stmt::purge_reservations_lock}) {
    const std::string& text = citus.sql(s);
    const std::string group = "shard_key = ANY($5::int[])";
    std::size_t count = 0;
    for (std::size_t at = text.find(group); at != std::string::npos;
         at = text.find(group, at + 1)) {
      ++count;
    }
    EXPECT_EQ(count, 2u) << Statements::name(s);
  }
  for (Stmt s : {Stmt::stock_get,
                 Stmt::stock_lock,
                 Stmt::stock_delta,
                 Stmt::stock_settle,
                 Stmt::hold_atomic,
                 Stmt::reservation_insert,
                 Stmt::reservation_lock,
                 Stmt::reservation_set,
                 Stmt::idempotency_claim,
                 Stmt::idempotency_get,
                 Stmt::expire_lock,
                 Stmt::expire_set,
                 Stmt::allowance_take,
                 Stmt::allowance_get,
                 Stmt::allowance_give,
                 Stmt::allowance_make_one,
                 Stmt::batch_allowance_make,
                 Stmt::batch_allowance_lock,
                 Stmt::batch_allowance_write,
                 Stmt::batch_lock,
                 Stmt::batch_write,
                 Stmt::batch_fast,
                 Stmt::batch_fast_one,
                 Stmt::batch_fast_one_keyed,
                 Stmt::batch_lock_reservations,
                 Stmt::batch_transition}) {
    EXPECT_TRUE(citus.pinned(s)) << Statements::name(s);
  }
}

TEST(Statements, RoutinesAreNamedWithinPostgresLimitsAndCalledWithEveryParameter) {
  const Statements plain("shop", false);
  ASSERT_FALSE(plain.routines().empty());
  std::set<std::string> names;
  for (Stmt r : plain.routines()) {
    EXPECT_TRUE(plain.has_routine(r));
    const std::string name = plain.routine_name(r);
    // PostgreSQL cuts identifiers at 63 bytes: a longer name would never be found again.
    EXPECT_LE(name.size(), 63u) << name;
    EXPECT_EQ(name.rfind(std::string(Statements::name(r)) + "_", 0), 0u) << name;
    EXPECT_TRUE(names.insert(name).second) << name;
    std::string call = plain.routine_call_head(r);
    for (int n = 1; n <= plain.parameters(r); ++n)
      call += (n > 1 ? ", $" : "$") + std::to_string(n);
    EXPECT_EQ(plain.routine_call(r), call + ")");
    EXPECT_EQ(plain.routine_call(r).find("SELECT * FROM shop." + name + "("), 0u);
  }
  EXPECT_FALSE(plain.has_routine(Stmt::batch_write));  // no rows back: no routine
  // The name follows the SQL: another schema's statements name other functions.
  EXPECT_NE(Statements("depot").routine_name(Stmt::hold_atomic),
            plain.routine_name(Stmt::hold_atomic));
  // And the tables: a release with another migration makes functions of its own.
  EXPECT_NE(Statements("shop", false, "001,002").routine_name(Stmt::hold_atomic),
            Statements("shop", false, "001").routine_name(Stmt::hold_atomic));
  // Citus runs its statements as they are (a routine would run on the coordinator).
  const Statements citus("shop", true);
  EXPECT_TRUE(citus.routines().empty());
  EXPECT_FALSE(citus.has_routine(Stmt::hold_atomic));
}

// Every migration file with the checksum migrate() records for it (migrate.cpp:
// stable_hash64 of "migration" and its text). A released file must never change: migrate()
// refuses every database that applied it otherwise. A new file adds its line here.
TEST(Migrations, ReleasedFilesNeverChange) {
  const std::map<std::string, std::uint64_t> released = {
      {"001_schema.sql", 0xb0a3d3154b039d92ULL},
      {"002_retention.sql", 0xe1f982a97acac968ULL},
      {"003_stock_row_patterns.sql", 0xb8ae961f03f09017ULL},
      {"004_purchase_limits.sql", 0x2142ec0eecc65a83ULL},
      {"005_slot_column.sql", 0xe57342d11e897d3fULL},
      {"006_limit_group_index.sql", 0xd7cedd58b56efb63ULL},
      {"007_journal.sql", 0xfee8996cc50458a5ULL},
      {"008_active_slots.sql", 0x8bb0536903e59d90ULL},
      {"009_reservation_units.sql", 0x002ab7c2f35c29fbULL},
      {"010_journal_lifecycle.sql", 0xbf97b303c168efd6ULL},
      {"011_keyed_writes.sql", 0x32bf55f928e08b61ULL},
      {"012_orders_and_references.sql", 0x3eb0faf9bb53408cULL},
      {"013_quantity_states.sql", 0x392998813a8ddf09ULL},
      {"citus/100_distribute.sql", 0x05af1c14c51e7c4cULL},
      {"citus/101_purchase_limits.sql", 0x19188da109cfd6feULL},
      {"citus/102_slot_column.sql", 0x737180b9631dc4d1ULL},
      {"citus/103_journal.sql", 0x18eccc09bd6175e0ULL},
      {"citus/104_transfers.sql", 0x8fc6c46e5266ddabULL},
      {"citus/105_delegated_reserve.sql", 0x94c615b69bd319f6ULL},
      {"citus/106_routed_reserve.sql", 0x478474a7ca685db9ULL},
      {"citus/107_delegated_batch.sql", 0x49ab6c4797b64ea5ULL},
      {"citus/108_delegated_purge.sql", 0x8d60236a6985b168ULL},
      {"citus/109_local_shards.sql", 0xa34efab0fd04406bULL},
      {"citus/110_local_journal.sql", 0x451629fb4eb95d0aULL},
      {"citus/111_delegated_writes.sql", 0x0cff9da468f61d0cULL},
      {"citus/112_local_reserve.sql", 0xc851837d3a27742aULL},
      {"citus/113_delegated_batch_writes.sql", 0x094dfaad40d74009ULL},
  };
  for (const Migration& m : migrations()) {
    const std::uint64_t sum = stable_hash64({"migration", m.sql});
    char shown[32];
    std::snprintf(shown, sizeof(shown), "0x%016llxULL", static_cast<unsigned long long>(sum));
    const auto it = released.find(m.name);
    ASSERT_NE(it, released.end()) << m.name << " is not listed (its checksum: " << shown << ")";
    EXPECT_EQ(sum, it->second) << m.name << " changed (its checksum now: " << shown << ")";
  }
  EXPECT_EQ(migrations().size(), released.size());
}

TEST(Migrations, AreCompiledInInOrderWithTheSchemaPlaceholder) {
  ASSERT_FALSE(migrations().empty());
  EXPECT_STREQ(migrations().front().name, "001_schema.sql");
  for (std::size_t i = 1; i < migrations().size(); ++i) {
    EXPECT_LT(std::string(migrations()[i - 1].name), std::string(migrations()[i].name));
  }
  const std::string first = migrations().front().sql;
  EXPECT_NE(first.find("{{schema}}.stock"), std::string::npos);
  EXPECT_NE(first.find("CHECK (reserved >= 0 AND reserved <= on_hand)"), std::string::npos);
}

TEST(PostgresOptions, AreCheckedBeforeConnecting) {
  EXPECT_TRUE(valid_schema_name("stockade"));
  EXPECT_TRUE(valid_schema_name("_shop_eu_2"));
  EXPECT_FALSE(valid_schema_name(""));
  EXPECT_FALSE(valid_schema_name("Shop"));
  EXPECT_FALSE(valid_schema_name("2shop"));
  EXPECT_FALSE(valid_schema_name("shop; DROP TABLE x"));
  EXPECT_FALSE(valid_schema_name(std::string(64, 'a')));

  PostgresOptions options;
  options.dsn = "host=127.0.0.1 port=1";
  options.pool_size = 0;
  EXPECT_STOCKADE_ERROR(make_postgres_store(options), ErrorCode::invalid_argument);
  options.pool_size = 4;
  options.schema = "Bad";
  EXPECT_STOCKADE_ERROR(make_postgres_store(options), ErrorCode::invalid_argument);
  options.schema = "stockade";
  options.pool_timeout_ms = 0;
  EXPECT_STOCKADE_ERROR(make_postgres_store(options), ErrorCode::invalid_argument);
  options.pool_timeout_ms = 100;
  options.dsn = "host=127.0.0.1 port=1 connect_timeout=2";
  EXPECT_STOCKADE_ERROR(make_postgres_store(options), ErrorCode::unavailable);
}

// Every connection gets a connect timeout, TCP keepalives and tcp_user_timeout unless the
// DSN sets them (the operator's choice wins), in key=value strings and URIs alike.
TEST(ConnectionDefaults, AreAddedUnlessTheDsnSetsThem) {
  const auto settings = [](const std::string& dsn) {
    std::map<std::string, std::string> out;
    for (const auto& [keyword, value] : parse_conninfo(dsn)) out[keyword] = value;
    return out;
  };
  auto plain = settings(with_connection_defaults("host=db dbname=shop", "api", 3));
  EXPECT_EQ(plain["application_name"], "api");
  EXPECT_EQ(plain["connect_timeout"], "3");
  EXPECT_EQ(plain["keepalives_idle"], std::to_string(keepalives_idle_s));
  EXPECT_EQ(plain["keepalives_interval"], std::to_string(keepalives_interval_s));
  EXPECT_EQ(plain["keepalives_count"], std::to_string(keepalives_count));
  EXPECT_EQ(plain["tcp_user_timeout"], std::to_string(tcp_user_timeout_ms));

  auto mine = settings(with_connection_defaults(
      "host=db connect_timeout=7 keepalives_idle=5 tcp_user_timeout=0", "api", 3));
  EXPECT_EQ(mine["connect_timeout"], "7");
  EXPECT_EQ(mine["keepalives_idle"], "5");
  EXPECT_EQ(mine["tcp_user_timeout"], "0");
  EXPECT_EQ(mine["keepalives_count"], std::to_string(keepalives_count));

  auto uri = settings(with_connection_defaults("postgresql://db/shop?sslmode=disable", "a b", 2));
  EXPECT_EQ(uri["application_name"], "a b");
  EXPECT_EQ(uri["connect_timeout"], "2");
  EXPECT_EQ(uri["sslmode"], "disable");
  EXPECT_EQ(uri["tcp_user_timeout"], std::to_string(tcp_user_timeout_ms));
}

// Direct routing on Citus hashes each shard key as Citus does (PostgreSQL's hashint4; the
// values are the server's), and reaches a worker with the coordinator DSN's credentials.
TEST(CitusRoutes, HashAsPostgresAndKeepTheDsnButItsAddress) {
  EXPECT_EQ(pg_hash_int4(0), -272711505);
  EXPECT_EQ(pg_hash_int4(1), -1905060026);
  EXPECT_EQ(pg_hash_int4(12345), -78097827);
  EXPECT_EQ(pg_hash_int4(65535), 800703781);
  EXPECT_EQ(pg_hash_int4(-1), 385747274);
  std::map<std::string, std::string> at;
  const std::string uri =
      "postgresql://shop:s3cr'et@coord:5432/db?hostaddr=10.0.0.1&sslmode=require";
  for (const auto& [keyword, value] : parse_conninfo(dsn_at(uri, "10.1.2.3", 6001))) {
    at[keyword] = value;
  }
  EXPECT_EQ(at["host"], "10.1.2.3");
  EXPECT_EQ(at["port"], "6001");
  EXPECT_EQ(at.count("hostaddr"), 0U);
  EXPECT_EQ(at["password"], "s3cr'et");
  EXPECT_EQ(at["user"], "shop");
  EXPECT_EQ(at["dbname"], "db");
  EXPECT_EQ(at["sslmode"], "require");
}

// A purge on Citus calls each Citus shard with one shard key of it: the least of 0..65535
// whose hash falls in the shard's range; a range that no such key hashes into is passed.
TEST(CitusRoutes, OneShardKeyPerShardRange) {
  const std::int32_t lowest = std::numeric_limits<std::int32_t>::min();
  const std::int32_t highest = std::numeric_limits<std::int32_t>::max();
  // Four ranges as Citus splits the hash space, listed out of order, with an empty range
  // among them, which gives no key (the keys keep the other ranges' order).
  const std::vector<std::pair<std::int32_t, std::int32_t>> ranges = {
      {0, 1073741823}, {5, 4}, {lowest, -1073741825}, {-1073741824, -1}, {1073741824, highest}};
  const std::vector<std::uint16_t> keys = one_key_per_shard(shard_of_each_key(ranges), 5);
  ASSERT_EQ(keys.size(), 4U);
  const std::vector<std::size_t> holding = {0, 2, 3, 4};  // the ranges with a key
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto& range = ranges[holding[i]];
    const std::int32_t h = pg_hash_int4(keys[i]);
    EXPECT_TRUE(range.first <= h && h <= range.second) << i;
    for (std::int32_t less = 0; less < keys[i]; ++less) {
      const std::int32_t other = pg_hash_int4(less);
      EXPECT_FALSE(range.first <= other && other <= range.second) << i << " " << less;
    }
  }
  EXPECT_EQ(keys[2], 0U);  // pg_hash_int4(0) is -272711505
}

TEST(PostgresOptions, BoundTheCallAndTheGraceBeforeTheCut) {
  PostgresOptions options;
  options.dsn = "host=127.0.0.1 port=1 connect_timeout=2";
  for (std::int64_t bad : {std::int64_t{0}, lock_timeout_ms_max + 1}) {
    options.call_timeout_ms = bad;
    EXPECT_STOCKADE_ERROR(make_postgres_store(options), ErrorCode::invalid_argument);
  }
  options.call_timeout_ms = 1000;
  for (std::int64_t bad : {std::int64_t{0}, cancel_grace_ms_max + 1}) {
    options.cancel_grace_ms = bad;
    EXPECT_STOCKADE_ERROR(make_postgres_store(options), ErrorCode::invalid_argument);
  }
}

}  // namespace
}  // namespace stockade::detail::pg
