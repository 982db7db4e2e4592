// Connection strings: parsing them without echoing them, and keeping their secrets out of
// every message. libpq's own errors may quote the string they failed on (a bad percent
// escape quotes the password; an unclosed IPv6 bracket quotes the whole URI), so nothing
// libpq says about a connection string reaches a caller before scrub_secrets().
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace stockade::detail::pg {

// The keyword/value pairs a connection string sets (libpq's PQconninfoParse, so key=value
// strings and URIs alike). A string libpq cannot parse raises InvalidArgument with a
// message that does not quote it.
std::vector<std::pair<std::string, std::string>> parse_conninfo(const std::string& dsn);

// `message` with every secret of `dsn` replaced by "********": the password and
// sslpassword values, the raw password of a URI (before percent-decoding), and the
// PGPASSWORD environment variable's value. If `dsn` cannot be parsed, nothing of libpq's
// message is kept.
std::string scrub_secrets(const std::string& message, const std::string& dsn);

// `dsn` with application_name set to `name`, unless the DSN or PGAPPNAME already sets one
// (the operator's choice wins). Works for key=value strings and URIs alike.
std::string with_application_name(const std::string& dsn, const std::string& name);

}  // namespace stockade::detail::pg
