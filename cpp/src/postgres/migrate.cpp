// PostgresStore::migrate: applies the compiled-in sql/ files that the database lacks.
#include <cstdio>
#include <map>

#include "postgres_store_impl.hpp"
#include "stockade/hash.hpp"
#include "stockade/log.hpp"

namespace stockade::detail::pg {
namespace {

std::string checksum(const std::string& sql) {
  char out[17];
  std::snprintf(out, sizeof(out), "%016llx",
                static_cast<unsigned long long>(stable_hash64({"migration", sql})));
  return out;
}

std::string with_schema(std::string sql, const std::string& schema) {
  const std::string token = "{{schema}}";
  for (std::size_t at = sql.find(token); at != std::string::npos; at = sql.find(token, at)) {
    sql.replace(at, token.size(), schema);
    at += schema.size();
  }
  return sql;
}

// The files of the Citus layout, applied only to a schema opened with layout='citus'.
constexpr const char* citus_prefix = "citus/";

bool citus_only(const std::string& name) {
  return name.rfind(citus_prefix, 0) == 0;
}

int version_of(const std::string& name) {
  int version = 0;
  for (char c :
       citus_only(name) ? name.substr(std::char_traits<char>::length(citus_prefix)) : name) {
    if (c < '0' || c > '9') break;
    version = version * 10 + (c - '0');
  }
  return version;
}

std::string bookkeeping_sql(const std::string& s) {
  return "CREATE SCHEMA IF NOT EXISTS " + s + ";\nCREATE TABLE IF NOT EXISTS " + s +
         ".schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
         " checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());";
}

}  // namespace

// The migrations numbered up to `up_to` (0: all) that `applied` (version -> name, checksum)
// lacks; InvalidState if an applied one differs from the compiled one.
std::vector<const Migration*> PostgresStore::pending(
    const std::map<int, std::pair<std::string, std::string>>& applied, int up_to) const {
  std::vector<const Migration*> out;
  for (const auto& [version, done] : applied) {
    if (citus_only(done.first) && options_.layout != Layout::citus) {
      throw Error(ErrorCode::invalid_state, "schema '" + options_.schema +
                                                "' has the Citus layout (" + done.first +
                                                " is applied): open it with layout='citus'");
    }
  }
  for (const Migration& m : migrations()) {
    const std::string name = m.name;
    if (citus_only(name) && options_.layout != Layout::citus) continue;
    const int version = version_of(name);
    if (up_to > 0 && version > up_to) break;
    auto it = applied.find(version);
    if (it == applied.end()) {
      out.push_back(&m);
    } else if (it->second.second != checksum(m.sql)) {
      throw Error(ErrorCode::invalid_state, "migration " + name +
                                                " differs from the one applied to schema '" +
                                                options_.schema + "' as " + it->second.first +
                                                "; released migrations must never change");
    }
  }
  return out;
}

// What migrate(up_to) would run here and now, as (name, SQL) pairs, without running it:
// "(create schema)" or "(bookkeeping)" first if the schema or its migration table is
// missing, then each missing migration.
std::vector<std::pair<std::string, std::string>> PostgresStore::migration_plan(int up_to) {
  const std::string& s = options_.schema;
  std::vector<std::pair<std::string, std::string>> out;
  try {
    std::unique_ptr<pqxx::connection> conn = connect(options_.dsn);
    pqxx::nontransaction session(*conn);
    std::map<int, std::pair<std::string, std::string>> applied;
    const bool kept =
        !session.exec("SELECT to_regclass(" + session.quote(s + ".schema_migrations") + ")")[0][0]
             .is_null();
    if (kept) {
      for (const auto& row :
           session.exec("SELECT version, name, checksum FROM " + s + ".schema_migrations")) {
        applied[row[0].as<int>()] = {row[1].as<std::string>(), row[2].as<std::string>()};
      }
    } else {
      // "(create schema)" when the schema itself does not exist yet (migrate() would make
      // it, so whoever runs this made it: the demo drops only such a schema), else
      // "(bookkeeping)": a schema that exists but has no migration table.
      const bool schema_exists =
          !session.exec("SELECT to_regnamespace(" + session.quote(s) + ")")[0][0].is_null();
      out.emplace_back(schema_exists ? "(bookkeeping)" : "(create schema)", bookkeeping_sql(s));
    }
    for (const Migration* m : pending(applied, up_to)) {
      out.emplace_back(m->name, with_schema(m->sql, s));
    }
  } catch (const pqxx::sql_error& e) {
    throw translate(e, Failure{nullptr, ErrorContext{}, s});
  } catch (const pqxx::broken_connection& e) {
    throw Error(ErrorCode::unavailable,
                std::string("the connection broke while reading the migrations: ") + e.what());
  } catch (const pqxx::failure& e) {
    throw Error(ErrorCode::database_error,
                std::string("reading the migrations failed: ") + e.what());
  }
  return out;
}

void PostgresStore::drop_schema() {
  const std::string& s = options_.schema;
  try {
    std::unique_ptr<pqxx::connection> conn = connect(options_.dsn);
    pqxx::nontransaction session(*conn);
    session.exec("DROP SCHEMA IF EXISTS " + s + " CASCADE");
  } catch (const pqxx::sql_error& e) {
    throw translate(e, Failure{nullptr, ErrorContext{}, s});
  } catch (const pqxx::failure& e) {
    throw Error(ErrorCode::unavailable, std::string("dropping the schema failed: ") + e.what());
  }
  pool_.drop_idle();  // their prepared statements name the dropped tables
  log(LogLevel::info, "stockade.postgres", "dropped schema '" + s + "'");
}

// Each file runs in a transaction of its own, together with the row that records it, so a
// failed file leaves nothing behind. Two processes migrating at once serialize on a
// transaction-scoped advisory lock that each of these transactions takes first, then read
// what is applied: no session state, so migrate() works through a transaction-mode pooler
// too.
std::vector<std::string> PostgresStore::migrate(int up_to) {
  const std::string& s = options_.schema;
  const std::string lock_key =
      std::to_string(static_cast<std::int64_t>(stable_hash64({"stockade-migrate", s})));
  std::unique_ptr<pqxx::connection> conn = connect(options_.dsn);
  std::vector<std::string> applied;
  try {
    for (;;) {
      pqxx::work work(*conn);
      work.exec("SELECT pg_advisory_xact_lock(" + lock_key + ")");
      work.exec(bookkeeping_sql(s));
      std::map<int, std::pair<std::string, std::string>> done;
      for (const auto& row :
           work.exec("SELECT version, name, checksum FROM " + s + ".schema_migrations")) {
        done[row[0].as<int>()] = {row[1].as<std::string>(), row[2].as<std::string>()};
      }
      const std::vector<const Migration*> next = pending(done, up_to);
      if (next.empty()) {
        work.commit();  // the bookkeeping table, if this made it
        break;
      }
      const Migration* m = next.front();
      const std::string name = m->name;
      work.exec(with_schema(m->sql, s));
      work.exec("INSERT INTO " + s + ".schema_migrations (version, name, checksum) VALUES (" +
                std::to_string(version_of(name)) + ", " + work.quote(name) + ", " +
                work.quote(checksum(m->sql)) + ")");
      work.commit();
      applied.push_back(name);
      log(LogLevel::info, "stockade.postgres",
          "applied migration " + name + " to schema '" + s + "'");
    }
  } catch (const pqxx::sql_error& e) {
    throw translate(e, Failure{nullptr, ErrorContext{}, s});
  } catch (const pqxx::broken_connection& e) {
    throw Error(ErrorCode::unavailable,
                std::string("the connection broke while migrating: ") + e.what());
  } catch (const pqxx::failure& e) {
    throw Error(ErrorCode::database_error, std::string("migration failed: ") + e.what());
  }
  return applied;
}

}  // namespace stockade::detail::pg
