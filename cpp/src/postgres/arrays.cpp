#include "postgres/arrays.hpp"

#include <string_view>

namespace stockade::detail::pg {

std::string text_array(const std::vector<std::string>& values) {
  std::string out = "{";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ',';
    out += '"';
    for (char c : values[i]) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    out += '"';
  }
  return out + "}";
}

std::string int_array(const std::vector<std::int64_t>& values) {
  std::string out = "{";
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(values[i]);
  }
  return out + "}";
}

std::string uuid_array(const std::vector<Uuid>& ids) {
  std::string out = "{";
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ',';
    out += ids[i].to_string();
  }
  return out + "}";
}

std::vector<Uuid> parse_ids(const std::string& list) {
  std::vector<Uuid> ids;
  for (std::size_t start = 0; start < list.size();) {
    std::size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    ids.push_back(Uuid::parse(std::string_view(list).substr(start, end - start)));
    start = end + 1;
  }
  return ids;
}

}  // namespace stockade::detail::pg
