// Purchase limits, the part both stores share: what the lines of one request ask of each
// purchase-limit group.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "stockade/store.hpp"

namespace stockade::detail {

// The purchase-limit group of each line of a request (none if its SKU has no limit), in
// line order.
using LineGroups = std::vector<std::optional<std::string>>;

// What a request asks of one group: its lines' units, the group's per_buyer, and the
// first of its lines (the one a LimitExceeded names).
struct GroupAsk {
  Quantity units = 0;
  Quantity per_buyer = 0;
  const SkuKey* first = nullptr;
};

// Sums `lines` per group, sorted by group (the order parent rows are locked in), and fills
// `groups`. limit_of(sku) gives a SKU's (group, per_buyer), or nothing if it has no limit.
template <class LimitOf>
std::map<std::string, GroupAsk> group_asks(const std::vector<OrderLine>& lines, LimitOf&& limit_of,
                                           LineGroups& groups) {
  groups.assign(lines.size(), std::nullopt);
  std::map<std::string, GroupAsk> asks;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const std::optional<std::pair<std::string, Quantity>> limit = limit_of(lines[i].key.sku);
    if (!limit) continue;
    groups[i] = limit->first;
    GroupAsk& ask = asks[limit->first];
    ask.units += lines[i].qty;
    ask.per_buyer = limit->second;
    if (ask.first == nullptr) ask.first = &lines[i].key;
  }
  return asks;
}

}  // namespace stockade::detail
