#include "postgres/dsn.hpp"

#include <libpq-fe.h>

#include <cstdlib>
#include <memory>

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

std::string with_application_name(const std::string& dsn, const std::string& name) {
  for (const auto& [keyword, value] : parse_conninfo(dsn)) {
    if (keyword == "application_name") return dsn;
  }
  const char* env = std::getenv("PGAPPNAME");
  if ((env != nullptr && *env != '\0') || name.empty()) return dsn;
  // `name` is printable ASCII without quotes or backslashes (validated), so it needs no
  // escaping beyond the quotes of a key=value string; in a URI, only these characters.
  const bool uri = dsn.rfind("postgresql://", 0) == 0 || dsn.rfind("postgres://", 0) == 0;
  if (!uri) return dsn + (dsn.empty() ? "" : " ") + "application_name='" + name + "'";
  std::string encoded;
  for (char c : name) {
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
  return dsn + (dsn.find('?') == std::string::npos ? "?" : "&") + "application_name=" + encoded;
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
