#include "postgres/dsn.hpp"

#include <libpq-fe.h>

#include <cstdlib>
#include <memory>
#include <set>

#include "stockade/errors.hpp"

namespace stockade::detail::pg {
namespace {

struct ConninfoFree {
  void operator()(PQconninfoOption* options) const { PQconninfoFree(options); }
};

// The password between "scheme://user:" and "@" of a URI, as written (still encoded).
std::string uri_password(const std::string& dsn) {
  for (const char* scheme : {"postgresql://", "postgres://"}) {
    if (dsn.rfind(scheme, 0) != 0) continue;
    const std::size_t start = std::char_traits<char>::length(scheme);
    const std::size_t at = dsn.find('@', start);
    if (at == std::string::npos) return {};
    const std::size_t colon = dsn.find(':', start);
    if (colon == std::string::npos || colon > at) return {};
    return dsn.substr(colon + 1, at - colon - 1);
  }
  return {};
}

void replace_all(std::string& text, const std::string& secret) {
  if (secret.empty()) return;
  for (std::size_t at = text.find(secret); at != std::string::npos;
       at = text.find(secret, at + 8)) {
    text.replace(at, secret.size(), "********");
  }
}

}  // namespace

std::vector<std::pair<std::string, std::string>> parse_conninfo(const std::string& dsn) {
  char* error = nullptr;
  std::unique_ptr<PQconninfoOption, ConninfoFree> options(PQconninfoParse(dsn.c_str(), &error));
  if (error != nullptr) PQfreemem(error);  // it may quote the string: never shown
  if (!options) {
    throw_invalid_argument(
        "dsn is not a connection string libpq can parse (key=value pairs or a "
        "postgresql:// URI; it is not shown here, since it may hold a password)");
  }
  std::vector<std::pair<std::string, std::string>> out;
  for (const PQconninfoOption* o = options.get(); o->keyword != nullptr; ++o) {
    if (o->val != nullptr) out.emplace_back(o->keyword, o->val);
  }
  return out;
}

namespace {

// `dsn` with `keyword=value` added. `value` is printable ASCII without quotes or
// backslashes (validated, or one of ours), so it needs no escaping beyond the quotes of a
// key=value string; in a URI, only these characters.
std::string with_setting(const std::string& dsn, const std::string& keyword,
                         const std::string& value) {
  const bool uri = dsn.rfind("postgresql://", 0) == 0 || dsn.rfind("postgres://", 0) == 0;
  if (!uri) return dsn + (dsn.empty() ? "" : " ") + keyword + "='" + value + "'";
  std::string encoded;
  for (char c : value) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '-' || c == '_' || c == '.';
    if (plain) {
      encoded += c;
    } else {
      static const char hex[] = "0123456789ABCDEF";
      encoded += '%';
      encoded += hex[static_cast<unsigned char>(c) >> 4];
      encoded += hex[static_cast<unsigned char>(c) & 15];
    }
  }
  return dsn + (dsn.find('?') == std::string::npos ? "?" : "&") + keyword + "=" + encoded;
}

bool env_set(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0';
}

}  // namespace

std::string with_connection_defaults(const std::string& dsn, const std::string& name,
                                     int connect_timeout_s) {
  std::set<std::string> given;
  for (const auto& [keyword, value] : parse_conninfo(dsn)) given.insert(keyword);
  std::string out = dsn;
  if (!given.count("application_name") && !env_set("PGAPPNAME") && !name.empty()) {
    out = with_setting(out, "application_name", name);
  }
  if (!given.count("connect_timeout") && !env_set("PGCONNECT_TIMEOUT")) {
    out = with_setting(out, "connect_timeout", std::to_string(connect_timeout_s));
  }
  // A peer that vanished without closing (a host gone, a network partition) is noticed
  // within about a minute on an idle connection, and within tcp_user_timeout on one
  // with data unacknowledged; over a Unix socket libpq ignores them.
  const std::pair<const char*, int> tcp[] = {{"keepalives_idle", keepalives_idle_s},
                                             {"keepalives_interval", keepalives_interval_s},
                                             {"keepalives_count", keepalives_count},
                                             {"tcp_user_timeout", tcp_user_timeout_ms}};
  for (const auto& [keyword, value] : tcp) {
    if (!given.count(keyword)) out = with_setting(out, keyword, std::to_string(value));
  }
  return out;
}

std::string scrub_secrets(const std::string& message, const std::string& dsn) {
  std::string out = message;
  try {
    for (const auto& [keyword, value] : parse_conninfo(dsn)) {
      if (keyword == "password" || keyword == "sslpassword") replace_all(out, value);
    }
  } catch (const Error&) {
    return "(libpq's message is not shown: the connection string could not be parsed, and "
           "the message may quote it)";
  }
  replace_all(out, uri_password(dsn));
  if (const char* env = std::getenv("PGPASSWORD")) replace_all(out, env);
  return out;
}

}  // namespace stockade::detail::pg

namespace stockade {

std::vector<std::pair<std::string, std::string>> parse_conninfo(const std::string& dsn) {
  return detail::pg::parse_conninfo(dsn);
}

}  // namespace stockade
