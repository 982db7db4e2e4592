// PostgresStore::migrate: applies the compiled-in sql/ files that the database lacks.
#include <libpq-fe.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <set>
#include <thread>

#include "postgres/dsn.hpp"
#include "postgres/postgres_store_impl.hpp"
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

// What PostgreSQL infers for a statement: its parameters' types and its columns' (type
// OID and modifier), as PQdescribePrepared tells it. libpqxx does not expose that, so
// this takes a libpq connection of its own.
struct Described {
  std::vector<std::pair<unsigned, int>> parameters, columns;
};

// Everything it describes, it describes inside one transaction (BEGIN ... ROLLBACK): a
// transaction-mode pooler keeps one server session for it, so that the describe reaches
// the session that parsed the statement.
class Describer {
 public:
  explicit Describer(const std::string& dsn) : conn_(PQconnectdb(dsn.c_str()), &PQfinish) {
    if (!conn_ || PQstatus(conn_.get()) != CONNECTION_OK) {
      const std::string why = conn_ ? PQerrorMessage(conn_.get()) : "out of memory";
      throw Error(is_refusal(why) ? ErrorCode::misconfigured : ErrorCode::unavailable,
                  "cannot connect to PostgreSQL to make the statement routines: " +
                      scrub_secrets(why, dsn));
    }
    const Result begun(PQexec(conn_.get(), "BEGIN"), &PQclear);
    check(begun.get(), "BEGIN");
  }
  Describer(const Describer&) = delete;
  Describer& operator=(const Describer&) = delete;
  ~Describer() { PQclear(PQexec(conn_.get(), "ROLLBACK")); }

  Described describe(const char* name, const std::string& sql) {
    const Result prepared(PQprepare(conn_.get(), "", sql.c_str(), 0, nullptr), &PQclear);
    check(prepared.get(), name);
    const Result described(PQdescribePrepared(conn_.get(), ""), &PQclear);
    check(described.get(), name);
    Described out;
    for (int i = 0; i < PQnparams(described.get()); ++i) {
      out.parameters.emplace_back(PQparamtype(described.get(), i), -1);
    }
    for (int i = 0; i < PQnfields(described.get()); ++i) {
      out.columns.emplace_back(PQftype(described.get(), i), PQfmod(described.get(), i));
    }
    return out;
  }

 private:
  using Result = std::unique_ptr<PGresult, decltype(&PQclear)>;

  void check(const PGresult* result, const char* name) {
    if (result != nullptr && PQresultStatus(result) == PGRES_COMMAND_OK) return;
    throw Error(
        ErrorCode::database_error,
        std::string("cannot describe statement ") + name + " to make its routine: " +
            (result != nullptr ? PQresultErrorMessage(result) : PQerrorMessage(conn_.get())));
  }

  std::unique_ptr<PGconn, decltype(&PQfinish)> conn_;
};

// The SQL names of the types `types`, in order (format_type, one round trip).
std::vector<std::string> type_names(pqxx::work& work,
                                    const std::vector<std::pair<unsigned, int>>& types) {
  if (types.empty()) return {};
  std::string oids, mods;
  for (const auto& [oid, mod] : types) {
    oids += (oids.empty() ? "" : ",") + std::to_string(oid);
    mods += (mods.empty() ? "" : ",") + std::to_string(mod);
  }
  std::vector<std::string> out;
  for (const auto& row :
       work.exec("SELECT format_type(t.o, t.m) FROM unnest('{" + oids + "}'::oid[], '{" + mods +
                 "}'::int[]) WITH ORDINALITY AS t(o, m, n) ORDER BY t.n")) {
    out.push_back(row[0].as<std::string>());
  }
  return out;
}

}  // namespace

// The statement routines that do not exist in the schema.
std::vector<Stmt> PostgresStore::missing_routines(pqxx::transaction_base& work) {
  if (statements_->routines().empty()) return {};  // the Citus layout has none
  std::set<std::string> present;
  for (const auto& row :
       work.exec("SELECT proname FROM pg_catalog.pg_proc WHERE pronamespace = to_regnamespace(" +
                 work.quote(options_.schema) + ")")) {
    present.insert(row[0].as<std::string>());
  }
  std::vector<Stmt> out;
  for (Stmt r : statements_->routines()) {
    if (present.count(statements_->routine_name(r)) == 0) out.push_back(r);
  }
  return out;
}

// Makes the statement routines that do not exist yet. Each is a PL/pgSQL function whose
// body is its statement: RETURN QUERY with the statement's own parameters ($1..$n, typed
// as PostgreSQL infers them for the statement) and columns. PL/pgSQL plans the statement
// once per server session and keeps the plan, as a prepared statement would, which a
// connection behind a transaction pooler cannot have. The statements are described first,
// on a connection of their own, without the migration lock (behind a pooler with few
// server sessions, other migrators may hold them all while they wait for that lock); then
// the functions are made under it. Returns how many it made.
int PostgresStore::make_routines(pqxx::connection& conn, const std::string& lock_key,
                                 const std::vector<Stmt>& missing) {
  const std::string& s = options_.schema;
  std::map<Stmt, Described> described;
  {
    Describer describer(options_.dsn);
    for (Stmt r : missing) {
      const Described d = describer.describe(Statements::name(r), statements_->sql(r));
      if (d.columns.empty() ||
          static_cast<int>(d.parameters.size()) != statements_->parameters(r)) {
        throw Error(ErrorCode::invariant_violation,
                    std::string("statement ") + Statements::name(r) +
                        " cannot have a routine: it returns no rows, or its parameters are not"
                        " $1..$n");
      }
      described.emplace(r, d);
    }
  }
  pqxx::work work(conn);
  work.exec("SELECT pg_advisory_xact_lock(" + lock_key + ")");
  int made = 0;
  for (Stmt r : missing_routines(work)) {  // another migrator may have made some meanwhile
    const auto found = described.find(r);
    if (found == described.end()) continue;  // (only if a migrator of another release ran)
    const std::vector<std::string> parameters = type_names(work, found->second.parameters);
    const std::vector<std::string> columns = type_names(work, found->second.columns);
    std::string ddl = "CREATE OR REPLACE FUNCTION " + s + "." + statements_->routine_name(r) + "(";
    for (std::size_t i = 0; i < parameters.size(); ++i) ddl += (i ? ", " : "") + parameters[i];
    ddl += ") RETURNS TABLE (";
    for (std::size_t i = 0; i < columns.size(); ++i) {
      ddl += (i ? ", " : "") + std::string("stockade_column_") + std::to_string(i + 1) + " " +
             columns[i];
    }
    ddl += ") LANGUAGE plpgsql VOLATILE AS $stockade_routine$ BEGIN RETURN QUERY " +
           statements_->sql(r) + "; END $stockade_routine$";
    work.exec(ddl);
    ++made;
  }
  work.commit();
  return made;
}

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
    const std::vector<const Migration*> next = pending(applied, up_to);
    for (const Migration* m : next) out.emplace_back(m->name, with_schema(m->sql, s));
    // Then, with every migration applied, the statement routines that are missing.
    if (next.size() == pending(applied, 0).size()) {
      std::string sql;
      for (Stmt r : kept ? missing_routines(session) : statements_->routines()) {
        sql += "-- " + s + "." + statements_->routine_name(r) + "\n";
      }
      if (!sql.empty()) {
        out.emplace_back("(statement routines)",
                         "-- For each statement below, a PL/pgSQL function whose body is RETURN "
                         "QUERY of the statement,\n-- typed as PostgreSQL infers the statement "
                         "(for connections behind a transaction pooler):\n" +
                             sql);
      }
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

// DROP SCHEMA locks the schema's objects one by one, so it can deadlock with a
// transaction that locks two of them in another order (this engine's sweeper, another
// engine's call). The server then rolls the DROP back whole, and it runs again, a bounded
// number of times.
void PostgresStore::drop_schema() {
  const std::string& s = options_.schema;
  constexpr int attempts = 10;
  for (int attempt = 1;; ++attempt) {
    try {
      std::unique_ptr<pqxx::connection> conn = connect(options_.dsn);
      pqxx::nontransaction session(*conn);
      session.exec("DROP SCHEMA IF EXISTS " + s + " CASCADE");
      break;
    } catch (const pqxx::transaction_rollback& e) {  // 40P01 (libpqxx 6.4 and 7)
      if (attempt == attempts) {
        throw Error(ErrorCode::unavailable, "dropping the schema failed " +
                                                std::to_string(attempts) +
                                                " times, the last: " + e.what());
      }
    } catch (const pqxx::sql_error& e) {
      if (!is_retryable(e.sqlstate()) || attempt == attempts) {
        throw translate(e, Failure{nullptr, ErrorContext{}, s});
      }
    } catch (const pqxx::failure& e) {
      throw Error(ErrorCode::unavailable, std::string("dropping the schema failed: ") + e.what());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10 * attempt));
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
  std::vector<Stmt> missing;
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
        // With every migration applied (not short of the last): the routines of this
        // release's statements that are missing.
        if (pending(done, 0).empty()) missing = missing_routines(work);
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
    if (!missing.empty()) {
      if (const int made = make_routines(*conn, lock_key, missing); made > 0) {
        // Connections opened before call no routines: idle ones close, and the ones
        // opened next find them.
        pool_.drop_idle();
        log(LogLevel::info, "stockade.postgres",
            "made " + std::to_string(made) + " statement routines in schema '" + s + "'");
      }
    }
  } catch (const pqxx::sql_error& e) {
    throw translate(e, Failure{nullptr, ErrorContext{}, s});
  } catch (const pqxx::broken_connection& e) {
    throw Error(ErrorCode::unavailable,
                std::string("the connection broke while migrating: ") + e.what());
  } catch (const pqxx::failure& e) {
    throw Error(ErrorCode::database_error, std::string("migration failed: ") + e.what());
  }
  for (DelegationOn& kind : delegation_) {
    kind.on.store(true);  // the delegated functions are there now (Citus layout)
  }
  batch_writes_.store(0);  // read again at the next full path
  return applied;
}

}  // namespace stockade::detail::pg
