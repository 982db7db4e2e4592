#include "store/allocation.hpp"

#include <algorithm>
#include <numeric>

#include "store/error_helpers.hpp"

namespace stockade {

const char* allocation_policy_name(AllocationPolicy policy) {
  return policy == AllocationPolicy::priority ? "priority" : "most_available";
}

AllocationPolicy allocation_policy(const std::string& name) {
  if (name == "priority") return AllocationPolicy::priority;
  if (name == "most_available") return AllocationPolicy::most_available;
  throw_invalid_argument("policy must be 'priority' or 'most_available', got " + shown(name));
}

}  // namespace stockade

namespace stockade::detail {

std::vector<PoolRow> pool_rows(const AllocateRequest& request) {
  std::vector<PoolRow> rows;
  rows.reserve(request.wants.size() * request.locations.size());
  for (std::size_t w = 0; w < request.wants.size(); ++w) {
    for (std::size_t l = 0; l < request.locations.size(); ++l) {
      rows.push_back({SkuKey{request.wants[w].sku, request.locations[l]}, w, l});
    }
  }
  std::sort(rows.begin(), rows.end(),
            [](const PoolRow& a, const PoolRow& b) { return a.key < b.key; });
  return rows;
}

Quantity free_units(const StockLevel& level) {
  if (level.discontinued || level.leased) return 0;
  return std::max<Quantity>(0, level.available());
}

namespace {

using Free = std::vector<std::vector<Quantity>>;  // [want][location]

// The locations in the order `policy` takes from them, by `units` per location.
std::vector<std::size_t> in_policy_order(AllocationPolicy policy,
                                         const std::vector<Quantity>& units) {
  std::vector<std::size_t> order(units.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (policy == AllocationPolicy::most_available) {
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return units[a] > units[b]; });
  }
  return order;
}

std::string pool_text(const AllocateRequest& request, const std::vector<Quantity>& units) {
  std::string text;
  for (std::size_t l = 0; l < units.size(); ++l) {
    text += (l ? ", " : "") + shown(request.locations[l]) + " " + std::to_string(units[l]);
  }
  return text;
}

[[noreturn]] void refuse_want(const AllocateRequest& request, const Free& free, std::size_t w,
                              bool whole_at_one) {
  const AllocationWant& want = request.wants[w];
  const std::vector<Quantity>& units = free[w];
  ErrorContext context;
  context.sku = want.sku;
  for (std::size_t l = 0; l < units.size(); ++l) {
    context.pool.emplace_back(request.locations[l], units[l]);
  }
  const Quantity total = std::accumulate(units.begin(), units.end(), Quantity{0});
  std::string message = "out of stock: sku " + shown(want.sku);
  if (whole_at_one) {
    message += ": no one location of the pool has " + std::to_string(want.qty) +
               " free units (split=False); it has ";
  } else {
    message += " has " + std::to_string(total) + " free units over the pool, " +
               std::to_string(want.qty) + " requested; it has ";
  }
  throw Error(ErrorCode::out_of_stock, message + pool_text(request, units), std::move(context));
}

// One SKU's lines by the policy (split: as much as each location has, in order).
void plan_want(const AllocateRequest& request, const Free& free, std::size_t w, bool split,
               std::vector<OrderLine>& lines) {
  const AllocationWant& want = request.wants[w];
  const std::vector<std::size_t> order = in_policy_order(request.policy, free[w]);
  if (!split) {
    for (std::size_t l : order) {
      if (free[w][l] >= want.qty) {
        lines.push_back({SkuKey{want.sku, request.locations[l]}, want.qty});
        return;
      }
    }
    refuse_want(request, free, w, /*whole_at_one=*/true);
  }
  const Quantity total = std::accumulate(free[w].begin(), free[w].end(), Quantity{0});
  if (total < want.qty) refuse_want(request, free, w, /*whole_at_one=*/false);
  Quantity left = want.qty;
  for (std::size_t l : order) {
    const Quantity take = std::min(left, free[w][l]);
    if (take <= 0) continue;
    lines.push_back({SkuKey{want.sku, request.locations[l]}, take});
    left -= take;
    if (left == 0) return;
  }
}

}  // namespace

std::vector<OrderLine> plan_allocation(const AllocateRequest& request, const PoolLevels& levels) {
  const std::size_t n = request.wants.size();
  const std::size_t m = request.locations.size();
  Free free(n, std::vector<Quantity>(m, 0));
  for (std::size_t w = 0; w < n; ++w) {
    bool any = false;
    for (std::size_t l = 0; l < m; ++l) {
      if (!levels[w][l]) continue;
      any = true;
      free[w][l] = free_units(*levels[w][l]);
    }
    if (!any) {
      ErrorContext context;  // a SKU, and no one location: none of them has it
      context.sku = request.wants[w].sku;
      throw Error(
          ErrorCode::not_found,
          "no stock row for sku " + shown(request.wants[w].sku) + " at any location of the pool",
          std::move(context));
    }
  }
  std::vector<OrderLine> lines;
  if (n == 1) {
    plan_want(request, free, 0, request.split, lines);
    allocation_order(request, lines);
    return lines;
  }
  // An order: one location that fills every line first.
  std::vector<Quantity> totals(m, 0);
  for (std::size_t l = 0; l < m; ++l) {
    for (std::size_t w = 0; w < n; ++w) totals[l] += free[w][l];
  }
  for (std::size_t l : in_policy_order(request.policy, totals)) {
    bool fills = true;
    for (std::size_t w = 0; w < n && fills; ++w) fills = free[w][l] >= request.wants[w].qty;
    if (!fills) continue;
    for (const AllocationWant& want : request.wants) {
      lines.push_back({SkuKey{want.sku, request.locations[l]}, want.qty});
    }
    return lines;
  }
  if (!request.split) {
    std::string message =
        "out of stock: no one location of the pool can fill the whole order (split=False): ";
    for (std::size_t l = 0; l < m; ++l) {
      for (std::size_t w = 0; w < n; ++w) {
        if (free[w][l] >= request.wants[w].qty) continue;
        message += (l ? "; " : "") + shown(request.locations[l]) + " has " +
                   std::to_string(free[w][l]) + " of sku " + shown(request.wants[w].sku) + " (" +
                   std::to_string(request.wants[w].qty) + " asked)";
        break;
      }
    }
    throw Error(ErrorCode::out_of_stock, message);
  }
  for (std::size_t w = 0; w < n; ++w) plan_want(request, free, w, /*split=*/true, lines);
  allocation_order(request, lines);
  return lines;
}

namespace {

// Where a line of (sku, location) goes in allocation_order.
std::size_t rank_of(const AllocateRequest& request, const SkuKey& row) {
  const SkuKey key = base_key(row);
  std::size_t w = 0;
  while (w < request.wants.size() && request.wants[w].sku != key.sku) ++w;
  std::size_t l = 0;
  while (l < request.locations.size() && request.locations[l] != key.location) ++l;
  return w * (request.locations.size() + 1) + l;
}

}  // namespace

void allocation_order(const AllocateRequest& request, std::vector<OrderLine>& lines) {
  std::stable_sort(lines.begin(), lines.end(), [&](const OrderLine& a, const OrderLine& b) {
    return rank_of(request, a.key) < rank_of(request, b.key);
  });
}

void allocation_order(const AllocateRequest& request, std::vector<Reservation>& made) {
  std::stable_sort(made.begin(), made.end(), [&](const Reservation& a, const Reservation& b) {
    return rank_of(request, a.key) < rank_of(request, b.key);
  });
}

}  // namespace stockade::detail
