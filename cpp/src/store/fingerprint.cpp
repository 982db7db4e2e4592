#include "store/fingerprint.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

#include "stockade/hash.hpp"
#include "store/error_helpers.hpp"

namespace stockade::detail {
namespace {

std::string hex64(std::uint64_t value) {
  char out[17];
  std::snprintf(out, sizeof(out), "%016llx", static_cast<unsigned long long>(value));
  return out;
}

// A ref and metadata join the print only when there are some, so keys made without them
// still replay.
std::uint64_t with_references(std::uint64_t h, const WriteOptions& options) {
  if (options.ref) h = stable_hash64({hex64(h), "ref", *options.ref});
  if (options.metadata) h = stable_hash64({hex64(h), "metadata", *options.metadata});
  return h;
}

}  // namespace

std::string fingerprint(const ReserveRequest& request) {
  const std::string qty = std::to_string(request.qty);
  const std::string ttl = std::to_string(request.ttl_us);
  // A hot-row slot's row prints as its SKU: a replay may reach another slot than the
  // first request did, and is the same request.
  const SkuKey key = base_key(request.key);
  std::uint64_t h = stable_hash64({"reserve", key.sku, key.location, qty, ttl});
  // A buyer joins the print only when there is one, so keys made without one still replay.
  if (request.options.buyer) h = stable_hash64({hex64(h), "buyer", *request.options.buyer});
  return "r1:" + hex64(with_references(h, request.options));
}

std::string fingerprint(const OrderRequest& request) {
  std::vector<const OrderLine*> lines;
  lines.reserve(request.lines.size());
  for (const auto& line : request.lines) lines.push_back(&line);
  std::sort(lines.begin(), lines.end(), [](auto* a, auto* b) { return a->key < b->key; });
  std::uint64_t h = stable_hash64({"order", std::to_string(request.ttl_us)});
  for (const auto* line : lines) {
    const std::string qty = std::to_string(line->qty);
    const std::string prev = hex64(h);
    const SkuKey key = base_key(line->key);
    h = stable_hash64({prev, key.sku, key.location, qty});
  }
  if (request.options.buyer) h = stable_hash64({hex64(h), "buyer", *request.options.buyer});
  return "o1:" + hex64(with_references(h, request.options));
}

std::string fingerprint(const AllocateRequest& request) {
  std::vector<const AllocationWant*> wants;
  for (const AllocationWant& want : request.wants) wants.push_back(&want);
  std::sort(wants.begin(), wants.end(), [](auto* a, auto* b) { return a->sku < b->sku; });
  std::uint64_t h =
      stable_hash64({"allocate", std::to_string(request.ttl_us),
                     allocation_policy_name(request.policy), request.split ? "split" : "whole"});
  for (const AllocationWant* want : wants) {
    h = stable_hash64({hex64(h), want->sku, std::to_string(want->qty)});
  }
  for (const std::string& location : request.locations) {
    h = stable_hash64({hex64(h), "at", location});
  }
  if (request.options.buyer) h = stable_hash64({hex64(h), "buyer", *request.options.buyer});
  return "a1:" + hex64(with_references(h, request.options));
}

namespace {

Asked sorted(Asked asked) {
  std::sort(asked.lines.begin(), asked.lines.end());
  return asked;
}

std::string seconds(std::int64_t us) {
  return us % 1'000'000 == 0 ? std::to_string(us / 1'000'000) + " s" : std::to_string(us) + " us";
}

}  // namespace

Asked asked_by(const ReserveRequest& request) {
  return {false, {{base_key(request.key), request.qty}}, request.ttl_us, request.options.buyer};
}

Asked asked_by(const OrderRequest& request) {
  Asked out{true, {}, request.ttl_us, request.options.buyer};
  for (const OrderLine& line : request.lines) out.lines.emplace_back(base_key(line.key), line.qty);
  return sorted(std::move(out));
}

Asked asked_by(const AllocateRequest& request) {
  Asked out{true, {}, request.ttl_us, request.options.buyer, /*allocation=*/true};
  for (const AllocationWant& want : request.wants) {
    out.lines.emplace_back(SkuKey{want.sku, ""}, want.qty);
  }
  return sorted(std::move(out));
}

Asked asked_by(const std::vector<Reservation>& made, const std::string& fingerprint) {
  Asked out;
  out.allocation = fingerprint.rfind("a", 0) == 0;               // "a1:...": allocate's
  out.order = out.allocation || fingerprint.rfind("o", 0) == 0;  // "o1:...": reserve_order's
  bool unchanged = !made.empty();
  std::map<std::string, Quantity> totals;  // an allocation's, by SKU
  for (const Reservation& r : made) {
    if (out.allocation) {
      totals[r.key.sku] += r.qty;
    } else {
      out.lines.emplace_back(base_key(r.key), r.qty);
    }
    unchanged = unchanged && r.version == 1;
    out.buyer = r.buyer;
  }
  for (const auto& [sku, qty] : totals) out.lines.emplace_back(SkuKey{sku, ""}, qty);
  if (unchanged) out.ttl_us = made.front().expires_at_us - made.front().created_at_us;
  return sorted(std::move(out));
}

Error idempotency_conflict(const std::string& key, const Asked& first, const Asked& now) {
  const Asked& a = first;
  const Asked& b = now;
  std::vector<std::string> found;
  if (a.allocation != b.allocation) {
    found.emplace_back(a.allocation ? "the key was used for an allocation (allocate), this is not"
                                    : "the key was not used for an allocation, this is one");
  } else if (a.order != b.order) {
    found.emplace_back(a.order ? "the key was used for an order (reserve_order), this is a reserve"
                               : "the key was used for a reserve, this is an order");
  } else if (a.lines.size() == 1 && b.lines.size() == 1) {
    if (a.lines[0].first != b.lines[0].first) found.emplace_back("its sku or location differs");
    if (a.lines[0].second != b.lines[0].second) {
      found.emplace_back("its qty differs (this request: " + std::to_string(b.lines[0].second) +
                         ")");
    }
  } else if (a.lines != b.lines) {
    found.emplace_back("its lines differ");
  }
  const std::string ttl_hint = "; without ttl= a request takes the engine's default_ttl";
  if (a.ttl_us && b.ttl_us && a.ttl_us != b.ttl_us) {
    found.push_back("its ttl differs (this request: " + seconds(*b.ttl_us) + ttl_hint + ")");
  }
  if (a.buyer != b.buyer) found.emplace_back("its buyer differs");
  std::string message = "idempotency key " + shown(key) + " was used for a different request";
  if (found.empty() && a.allocation) {
    // Where the units came from does not tell the pool it was asked of.
    message +=
        ": its reservations hold this request's skus and quantities, so its locations,"
        " policy, split, ref or metadata differ (or its ttl" +
        ttl_hint + ")";
  } else if (found.empty()) {
    // The TTL is the one field left, and the first hold has changed since: unknown.
    message += ": nothing its reservations still show differs, so its ttl may (this request: " +
               (b.ttl_us ? seconds(*b.ttl_us) : std::string("none")) + ttl_hint + ")";
  } else {
    message += ": ";
    for (std::size_t i = 0; i < found.size(); ++i) message += (i ? "; " : "") + found[i];
  }
  return Error(ErrorCode::idempotency_conflict, message);
}

}  // namespace stockade::detail
