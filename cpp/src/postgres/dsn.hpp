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

// What every connection of the store gets unless the DSN (or libpq's environment
// variable for it) sets it: the operator's choice wins.
inline constexpr int connect_timeout_min_s = 2;  // libpq's own floor
inline constexpr int connect_timeout_max_s = 10;
inline constexpr int keepalives_idle_s = 30;       // idle time before the first probe
inline constexpr int keepalives_interval_s = 10;   // between probes
inline constexpr int keepalives_count = 3;         // probes lost before the peer is dead
inline constexpr int tcp_user_timeout_ms = 30000;  // data unacknowledged this long: dead

// `dsn` with application_name set to `name` (unless the DSN or PGAPPNAME sets one),
// connect_timeout (libpq's wait per host, in seconds; unless the DSN or PGCONNECT_TIMEOUT
// sets it), and TCP keepalives and tcp_user_timeout (unless the DSN sets them). Works for
// key=value strings and URIs alike.
std::string with_connection_defaults(const std::string& dsn, const std::string& name,
                                     int connect_timeout_s);

}  // namespace stockade::detail::pg
