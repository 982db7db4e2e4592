// PostgreSQL array literals, the form in which a statement takes a list of values as one
// parameter (`$1::text[]`), and the one list the store reads back as text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "stockade/uuid.hpp"

namespace stockade::detail::pg {

// Text elements are double-quoted, with backslashes and quotes escaped, so any text but
// NUL (which validation already refuses) survives.
std::string text_array(const std::vector<std::string>& values);
std::string int_array(const std::vector<std::int64_t>& values);
std::string uuid_array(const std::vector<Uuid>& ids);

// The ids of `list`, comma-separated (array_to_string of a uuid[]).
std::vector<Uuid> parse_ids(const std::string& list);

}  // namespace stockade::detail::pg
