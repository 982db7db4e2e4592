#include "store/keyed.hpp"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "stockade/hash.hpp"
#include "store/error_helpers.hpp"

namespace stockade::detail {
namespace {

std::string print(KeyedKind kind, std::initializer_list<std::string_view> parts) {
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(stable_hash64(parts)));
  return std::string(1, static_cast<char>(kind)) + "1:" + hex;
}

std::string opt(const std::optional<std::int64_t>& value) {
  return value ? std::to_string(*value) : std::string("-");
}

// Length-prefixed fields: "<bytes>:<text>" one after another.
class Writer {
 public:
  explicit Writer(char tag) : out_(1, tag) {}
  Writer& text(const std::string& value) {
    out_ += std::to_string(value.size()) + ':' + value;
    return *this;
  }
  Writer& number(std::int64_t value) { return text(std::to_string(value)); }
  Writer& maybe(const std::optional<std::string>& value) {
    number(value ? 1 : 0);
    return value ? text(*value) : *this;
  }
  std::string done() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  Reader(const std::string& text, char tag) : text_(text) {
    if (text_.empty() || text_[0] != tag) fail();
    at_ = 1;
  }
  std::string text() {
    const std::size_t colon = text_.find(':', at_);
    if (colon == std::string::npos || colon == at_ || colon - at_ > 12) fail();
    std::size_t size = 0;
    for (std::size_t i = at_; i < colon; ++i) {
      if (text_[i] < '0' || text_[i] > '9') fail();
      size = size * 10 + static_cast<std::size_t>(text_[i] - '0');
    }
    if (size > text_.size() - colon - 1) fail();
    at_ = colon + 1 + size;
    return text_.substr(colon + 1, size);
  }
  std::int64_t number() {
    const std::string digits = text();
    try {
      std::size_t used = 0;
      const long long value = std::stoll(digits, &used);
      if (used != digits.size()) fail();
      return value;
    } catch (const std::logic_error&) {
      fail();
    }
  }
  std::optional<std::string> maybe() {
    if (number() == 0) return std::nullopt;
    return text();
  }
  bool at_end() const { return at_ == text_.size(); }
  void end() const {
    if (!at_end()) fail();
  }

 private:
  [[noreturn]] static void fail() {
    throw Error(ErrorCode::invariant_violation,
                "the outcome stored with an idempotency key could not be read");
  }
  const std::string& text_;
  std::size_t at_ = 0;
};

SkuKey read_key(Reader& in) {
  SkuKey key;
  key.sku = in.text();
  key.location = in.text();
  key.slot = static_cast<int>(in.number());
  return key;
}

void write_key(Writer& out, const SkuKey& key) {
  out.text(key.sku).text(key.location).number(key.slot);
}

}  // namespace

const char* keyed_kind_name(const std::string& fingerprint) {
  switch (fingerprint.empty() ? '\0' : fingerprint[0]) {
    case 'r':
      return "reserve";
    case 'o':
      return "reserve_order";
    case 'a':
      return "allocate";
    case 's':
      return "sell";
    case 'k':
      return "restock";
    case 'h':
      return "set_on_hand";
    case 'c':
      return "confirm";
    case 'l':
      return "release";
    case 'x':
      return "extend";
    case 'z':
      return "resize";
    case 't':
      return "return_units";
    case 'm':
      return "move_units";
    case 'n':
      return "transfer";
    case 'e':
      return "receive";
    case 'q':
      return "cancel_transfer";
    case 'C':
      return "confirm_order";
    case 'L':
      return "release_order";
    case 'X':
      return "extend_order";
    default:
      return "another write";
  }
}

bool reserves(const std::string& fingerprint) {
  return !fingerprint.empty() &&
         (fingerprint[0] == 'r' || fingerprint[0] == 'o' || fingerprint[0] == 'a');
}

std::string fingerprint(const SellRequest& request) {
  // A slot's row prints as its SKU, as a reserve's does: a retry may sell from another slot.
  const SkuKey key = base_key(request.key);
  return print(KeyedKind::sell,
               {key.sku, key.location, std::to_string(request.qty),
                opt(request.options.expected_version), opt(request.options.fencing_token)});
}

std::string stock_fingerprint(const SkuKey& row, Quantity value, bool add,
                              const std::optional<Version>& expected,
                              const std::optional<FencingToken>& token) {
  const SkuKey key = base_key(row);
  return print(add ? KeyedKind::restock : KeyedKind::set_on_hand,
               {key.sku, key.location, std::to_string(value), opt(expected), opt(token)});
}

std::string fingerprint(const MoveRequest& request) {
  const SkuKey key = base_key(request.key);
  return print(KeyedKind::move_units, {key.sku, key.location, std::to_string(request.qty),
                                       unit_state_name(request.from), unit_state_name(request.to),
                                       opt(request.expected_version), opt(request.fencing_token)});
}

std::string fingerprint(const TransferRequest& request) {
  // Not the id: a retry's engine makes a new one, and the key names the first.
  return print(KeyedKind::transfer,
               {request.sku, std::to_string(request.qty), request.source, request.destination,
                request.reason.value_or(""), request.actor.value_or("")});
}

std::string fingerprint(const TransferStepRequest& request) {
  return print(
      request.cancel ? KeyedKind::cancel_transfer : KeyedKind::receive,
      {request.id.to_string(), std::to_string(request.accepted), std::to_string(request.rejected)});
}

std::string fingerprint(const TransitionRequest& request) {
  const KeyedKind kind = request.kind == Transition::confirm   ? KeyedKind::confirm
                         : request.kind == Transition::release ? KeyedKind::release
                                                               : KeyedKind::extend;
  return print(
      kind, {request.id.to_string(), std::to_string(request.ttl_us), opt(request.expected_version),
             opt(request.qty), request.release_rest ? "rest" : "-"});
}

std::string fingerprint(const OrderStepRequest& request) {
  const KeyedKind kind = request.kind == Transition::confirm   ? KeyedKind::confirm_order
                         : request.kind == Transition::release ? KeyedKind::release_order
                                                               : KeyedKind::extend_order;
  std::vector<std::pair<Uuid, Quantity>> parts = request.parts;  // the same parts, any order
  std::sort(parts.begin(), parts.end());
  std::string named;
  for (const auto& [id, qty] : parts) named += id.to_string() + '=' + std::to_string(qty) + ';';
  return print(kind, {request.order_id.to_string(), std::to_string(request.ttl_us), named,
                      request.release_rest ? "rest" : "-"});
}

std::string fingerprint(const ResizeRequest& request) {
  return print(KeyedKind::resize, {request.id.to_string(), std::to_string(request.qty),
                                   opt(request.expected_version)});
}

std::string fingerprint(const ReturnRequest& request) {
  return print(KeyedKind::return_units,
               {request.id.to_string(), std::to_string(request.qty), request.restock ? "1" : "0",
                request.location.value_or("\x01"), opt(request.expected_version)});
}

Error keyed_conflict(const std::string& key, const std::string& stored, const std::string& now) {
  std::string message = "idempotency key " + shown(key) + " was used for a different request: ";
  const std::string first = keyed_kind_name(stored);
  const std::string asked = keyed_kind_name(now);
  if (first != asked) {
    message += "it was used for a " + first + ", this is a " + asked;
  } else {
    message += "it was used for a " + first +
               " with other arguments (a key names one request: use a new key for a new one)";
  }
  return Error(ErrorCode::idempotency_conflict, message);
}

std::string encode_outcome(const StockLevel& level) {
  Writer out('L');
  write_key(out, level.key);
  out.number(level.on_hand).number(level.reserved).number(level.version);
  out.number(level.updated_at_us).number(level.backorder_limit).number(level.discontinued);
  out.number(level.lease_token).number(level.leased).number(level.lease_expires_at_us);
  out.number(level.low_stock ? 1 : 0).number(level.low_stock.value_or(0));
  out.number(level.active_slots);
  // Last: an outcome stored before the quantity states reads as it was (none withheld).
  out.number(level.safety_stock).number(level.damaged).number(level.quality_control);
  out.number(level.incoming);
  return out.done();
}

std::string encode_outcome(const Reservation& r) {
  Writer out('R');
  out.text(r.id.to_string());
  write_key(out, r.key);
  out.number(r.qty).number(r.confirmed).number(r.released).number(r.expired).number(r.returned);
  out.number(static_cast<std::int64_t>(r.state)).number(r.version);
  out.number(r.expires_at_us).number(r.created_at_us).number(r.updated_at_us);
  out.maybe(r.idempotency_key).maybe(r.buyer).maybe(r.limit_group);
  // Last, and only when one is there: an outcome stored before orders and references reads
  // as it was.
  if (r.order_id || r.ref || r.metadata) {
    out.text(r.order_id ? r.order_id->to_string() : std::string());
    out.maybe(r.ref).maybe(r.metadata);
  }
  return out.done();
}

std::string encode_outcome(const Transfer& t) {
  Writer out('T');
  out.text(t.id.to_string()).text(t.sku).text(t.source).text(t.destination);
  out.number(t.qty).number(t.received).number(t.rejected).number(t.cancelled);
  out.number(static_cast<std::int64_t>(t.state)).number(t.version);
  out.number(t.created_at_us).number(t.updated_at_us);
  out.maybe(t.reason).maybe(t.actor);
  return out.done();
}

std::string encode_outcome(const std::vector<Reservation>& lines) {
  Writer out('O');
  out.number(static_cast<std::int64_t>(lines.size()));
  for (const Reservation& r : lines) out.text(encode_outcome(r));
  return out.done();
}

// 'B': the batched form (keyed.hpp). Its fields are the Writer's, so a tail made in SQL
// is read as one made here.
std::string batched_level_prefix(const std::string& attempt, const SkuKey& key, Quantity sold_after,
                                 Quantity held_after, std::int64_t changes_after) {
  Writer out('B');
  out.text(attempt);
  write_key(out, key);
  out.number(sold_after).number(held_after).number(changes_after);
  return out.done();
}

std::string batched_level_tail(const std::vector<std::int64_t>& values) {
  Writer out('\0');
  for (std::int64_t value : values) out.number(value);
  return out.done().substr(1);
}

std::string batched_level_tail_sql(const std::vector<std::string>& values) {
  std::string sql;
  for (const std::string& value : values) {
    const std::string digits = "(" + value + ")::bigint::text";
    sql += std::string(sql.empty() ? "" : " || ") + "length(" + digits + ") || ':' || " + digits;
  }
  return "(" + sql + ")";
}

namespace {

// A level's quantity states, when the outcome has them (one stored before them has not).
void read_states(Reader& in, StockLevel& level) {
  if (in.at_end()) return;
  level.safety_stock = in.number();
  level.damaged = in.number();
  level.quality_control = in.number();
  level.incoming = in.number();
}

StockLevel decode_batched_level(const std::string& text) {
  Reader in(text, 'B');
  (void)in.text();  // the attempt that wrote it (a lost commit's probe compares it)
  StockLevel level;
  level.key = read_key(in);
  const Quantity sold_after = in.number();
  const Quantity held_after = in.number();
  const std::int64_t changes_after = in.number();
  level.on_hand = in.number() + sold_after;
  level.reserved = in.number() - held_after;
  level.version = in.number() - changes_after;
  level.updated_at_us = in.number();
  level.backorder_limit = in.number();
  read_states(in, level);
  in.end();
  return level;  // a fast batch moves an open row only: not discontinued, not leased
}

}  // namespace

template <>
StockLevel decode_outcome<StockLevel>(const std::string& text) {
  if (!text.empty() && text[0] == 'B') return decode_batched_level(text);
  Reader in(text, 'L');
  StockLevel level;
  level.key = read_key(in);
  level.on_hand = in.number();
  level.reserved = in.number();
  level.version = in.number();
  level.updated_at_us = in.number();
  level.backorder_limit = in.number();
  level.discontinued = in.number() != 0;
  level.lease_token = in.number();
  level.leased = in.number() != 0;
  level.lease_expires_at_us = in.number();
  const bool low = in.number() != 0;
  const Quantity threshold = in.number();
  if (low) level.low_stock = threshold;
  level.active_slots = static_cast<int>(in.number());
  read_states(in, level);
  in.end();
  return level;
}

template <>
Reservation decode_outcome<Reservation>(const std::string& text) {
  Reader in(text, 'R');
  Reservation r;
  r.id = Uuid::parse(in.text());
  r.key = read_key(in);
  r.qty = in.number();
  r.confirmed = in.number();
  r.released = in.number();
  r.expired = in.number();
  r.returned = in.number();
  const std::int64_t state = in.number();
  if (state < 0 || state > static_cast<std::int64_t>(ReservationState::expired)) {
    throw Error(ErrorCode::invariant_violation,
                "the outcome stored with an idempotency key could not be read");
  }
  r.state = static_cast<ReservationState>(state);
  r.version = in.number();
  r.expires_at_us = in.number();
  r.created_at_us = in.number();
  r.updated_at_us = in.number();
  r.idempotency_key = in.maybe();
  r.buyer = in.maybe();
  r.limit_group = in.maybe();
  if (!in.at_end()) {
    const std::string order = in.text();
    if (!order.empty()) r.order_id = Uuid::parse(order);
    r.ref = in.maybe();
    r.metadata = in.maybe();
  }
  in.end();
  return r;
}

template <>
Transfer decode_outcome<Transfer>(const std::string& text) {
  Reader in(text, 'T');
  Transfer t;
  t.id = Uuid::parse(in.text());
  t.sku = in.text();
  t.source = in.text();
  t.destination = in.text();
  t.qty = in.number();
  t.received = in.number();
  t.rejected = in.number();
  t.cancelled = in.number();
  const std::int64_t state = in.number();
  if (state < 0 || state > static_cast<std::int64_t>(TransferState::cancelled)) {
    throw Error(ErrorCode::invariant_violation,
                "the outcome stored with an idempotency key could not be read");
  }
  t.state = static_cast<TransferState>(state);
  t.version = in.number();
  t.created_at_us = in.number();
  t.updated_at_us = in.number();
  t.reason = in.maybe();
  t.actor = in.maybe();
  in.end();
  return t;
}

template <>
std::vector<Reservation> decode_outcome<std::vector<Reservation>>(const std::string& text) {
  Reader in(text, 'O');
  const std::int64_t count = in.number();
  if (count < 0 || count > static_cast<std::int64_t>(text.size())) {
    throw Error(ErrorCode::invariant_violation,
                "the outcome stored with an idempotency key could not be read");
  }
  std::vector<Reservation> lines;
  for (std::int64_t i = 0; i < count; ++i) lines.push_back(decode_outcome<Reservation>(in.text()));
  in.end();
  return lines;
}

}  // namespace stockade::detail
