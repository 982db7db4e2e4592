// The PostgreSQL store's pure parts, without a server: the SQLSTATE mapping, the prepared
// statements' SQL, schema names and options. The store against a real server is tested
// from pytest (tests/python/test_postgres.py), which starts one.
#include <gtest/gtest.h>

#include "postgres/postgres_store_impl.hpp"
#include "postgres/sqlstate.hpp"
#include "postgres/statements.hpp"
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
  EXPECT_EQ(map("42P01").code(), ErrorCode::invalid_state);
  EXPECT_EQ(map("3F000").code(), ErrorCode::invalid_state);
  EXPECT_EQ(map("08006").code(), ErrorCode::unavailable);
  EXPECT_EQ(map("53300").code(), ErrorCode::unavailable);
  EXPECT_EQ(map("57P01").code(), ErrorCode::unavailable);
  EXPECT_EQ(map("XX000").code(), ErrorCode::database_error);
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
    EXPECT_TRUE(schema || lock) << sql;
    EXPECT_EQ(sql.find("stockade."), std::string::npos) << sql;
  }
  // The sweeper orders stock rows bytewise, as std::string does: the engine's lock order.
  EXPECT_NE(statements.sql(Stmt::expire_pick).find("COLLATE \"C\""), std::string::npos);
  EXPECT_NE(statements.sql(Stmt::expire_pick).find("SKIP LOCKED"), std::string::npos);
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

}  // namespace
}  // namespace stockade::detail::pg
