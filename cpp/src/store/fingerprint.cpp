#include "store/fingerprint.hpp"

#include <algorithm>
#include <cstdio>

#include "stockade/hash.hpp"
#include "store/error_helpers.hpp"

namespace stockade::detail {
namespace {

std::string hex64(std::uint64_t value) {
  char out[17];
  std::snprintf(out, sizeof(out), "%016llx", static_cast<unsigned long long>(value));
  return out;
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
  return "r1:" + hex64(h);
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
  return "o1:" + hex64(h);
}

namespace {

Asked sorted(Asked asked) {
  std::sort(asked.lines.begin(), asked.lines.end());
  return asked;
}

// A line as "'sku' at 'location'", and with its quantity ("... x2") in a list of lines.
std::string line_of(const std::pair<SkuKey, Quantity>& line, bool with_qty) {
  std::string out = shown(line.first.sku) + " at " + shown(line.first.location);
  return with_qty ? out + " x" + std::to_string(line.second) : out;
}

std::string lines_of(const Asked& asked) {
  constexpr std::size_t shown_lines = 4;
  std::string out;
  for (std::size_t i = 0; i < asked.lines.size() && i < shown_lines; ++i) {
    out += (i ? ", " : "") + line_of(asked.lines[i], true);
  }
  if (asked.lines.size() > shown_lines) {
    out += " and " + std::to_string(asked.lines.size() - shown_lines) + " more";
  }
  return "[" + out + "]";
}

std::string seconds(std::int64_t us) {
  return us % 1'000'000 == 0 ? std::to_string(us / 1'000'000) + " s" : std::to_string(us) + " us";
}

// "what: A first, B now"
void differ(std::vector<std::string>& out, const char* what, const std::string& first,
            const std::string& now) {
  if (first != now) out.push_back(std::string(what) + " " + first + " first, " + now + " now");
}

}  // namespace

Asked asked_by(const ReserveRequest& request) {
  return {{{base_key(request.key), request.qty}}, request.ttl_us, request.options.buyer};
}

Asked asked_by(const OrderRequest& request) {
  Asked out{{}, request.ttl_us, request.options.buyer};
  for (const OrderLine& line : request.lines) out.lines.emplace_back(base_key(line.key), line.qty);
  return sorted(std::move(out));
}

Asked asked_by(const std::vector<Reservation>& made) {
  Asked out;
  bool unchanged = !made.empty();
  for (const Reservation& r : made) {
    out.lines.emplace_back(base_key(r.key), r.qty);
    unchanged = unchanged && r.version == 1;
    out.buyer = r.buyer;
  }
  if (unchanged) out.ttl_us = made.front().expires_at_us - made.front().created_at_us;
  return sorted(std::move(out));
}

Error idempotency_conflict(const std::string& key, const Asked& first, const Asked& now) {
  const Asked a = sorted(first);
  const Asked b = sorted(now);
  std::vector<std::string> found;
  if (a.lines.size() == 1 && b.lines.size() == 1) {
    differ(found, "sku", line_of(a.lines[0], false), line_of(b.lines[0], false));
    differ(found, "qty", std::to_string(a.lines[0].second), std::to_string(b.lines[0].second));
  } else if (a.lines != b.lines) {
    differ(found, "lines", lines_of(a), lines_of(b));
  }
  if (a.ttl_us && b.ttl_us) differ(found, "ttl", seconds(*a.ttl_us), seconds(*b.ttl_us));
  differ(found, "buyer", a.buyer ? shown(*a.buyer) : "none", b.buyer ? shown(*b.buyer) : "none");
  std::string message = "idempotency key " + shown(key) + " was used for a different request";
  if (found.empty()) {
    message +=
        ": the same lines and buyer, so the TTL must differ (the first hold was extended "
        "since, so its own TTL no longer shows)";
  } else {
    message += ": ";
    for (std::size_t i = 0; i < found.size(); ++i) message += (i ? "; " : "") + found[i];
  }
  if (!a.ttl_us || (b.ttl_us && a.ttl_us != b.ttl_us)) {
    message += ". A request without ttl= takes the engine's default_ttl (15 min unless set)";
  }
  return Error(ErrorCode::idempotency_conflict, message);
}

}  // namespace stockade::detail
