// The journal's rules that both stores share: the note in scope, the checks of its texts,
// and how a change's cause and alerts are read from it. The PostgreSQL trigger of
// migration 007 reads them the same way (sql/007_journal.sql); test_journal.py checks that
// both stores journal a change alike.
#include "stockade/journal.hpp"

#include <string_view>

#include "stockade/errors.hpp"

namespace stockade {

namespace {

thread_local const JournalNote* current = nullptr;

constexpr std::size_t note_text_bytes_max = 200;
constexpr std::size_t consumer_bytes_max = 128;

void check_plain_text(const std::string& text, const char* field, std::size_t bytes_max,
                      bool may_be_empty) {
  const std::string name(field);
  if (text.empty() && !may_be_empty) throw_invalid_argument(name + " must not be empty");
  if (text.size() > bytes_max) {
    throw_invalid_argument(name + " is " + std::to_string(text.size()) +
                           " bytes long (UTF-8); the limit is " + std::to_string(bytes_max));
  }
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      throw_invalid_argument(name + " must not contain control characters");
    }
  }
  if (!is_valid_utf8(text)) throw_invalid_argument(name + " must be valid UTF-8");
}

bool between(Quantity before, Quantity after, Quantity line) {
  return before >= line && after < line;
}

}  // namespace

const char* feed_wake_name(FeedWake wake) noexcept {
  switch (wake) {
    case FeedWake::changed:
      return "changed";
    case FeedWake::timeout:
      return "timeout";
    case FeedWake::unsupported:
      return "unsupported";
  }
  return "timeout";
}

void validate_note_text(const std::string& text, const char* field) {
  check_plain_text(text, field, note_text_bytes_max, true);
}

void validate_consumer_name(const std::string& name) {
  check_plain_text(name, "consumer", consumer_bytes_max, false);
}

NoteScope::NoteScope(JournalNote note) : note_(std::move(note)), outer_(current) {
  current = &note_;
}

NoteScope::~NoteScope() {
  current = outer_;
}

const JournalNote* current_note() noexcept {
  return current;
}

std::string cause_of(const RowChange& before, const RowChange& after, const std::string& said) {
  if (after.created) {
    if (said == "set_on_hand" || said == "slot_move" || said == "return") return said;
    return after.on_hand > 0 ? "restock" : "create";
  }
  if (after.discontinued != before.discontinued) {
    return after.discontinued ? "discontinue" : "reinstate";
  }
  const Quantity d_on = after.on_hand - before.on_hand;
  if ((said == "transfer" || said == "receive" || said == "cancel_transfer") &&
      (d_on != 0 || after.incoming != before.incoming)) {
    if (said == "transfer") return d_on < 0 ? "transfer_out" : "transfer_in";
    if (said == "receive") return d_on > 0 ? "receive" : "reject";
    return "transfer_cancel";
  }
  if (after.safety_stock != before.safety_stock) return "safety_stock";
  if (after.damaged != before.damaged || after.quality_control != before.quality_control) {
    return after.on_hand < before.on_hand ? "write_off" : "move";
  }
  if (after.backorder_limit != before.backorder_limit) return "backorder_limit";
  if (after.low_stock != before.low_stock) return "low_stock";
  if (after.lease_token != before.lease_token ||
      after.lease_expires_us != before.lease_expires_us) {
    return "lease";
  }
  const Quantity d_res = after.reserved - before.reserved;
  if (d_on == 0 && d_res == 0) return said == "set_on_hand" ? said : "touch";  // a count
  if (d_on == 0 && d_res != 0 && said == "resize") return said;
  if (d_on == 0 && d_res > 0) return "hold";
  if (d_on == 0) {
    // A confirm that finds its hold lapsed expires it.
    return said == "expire" || said == "confirm" ? "expire" : "release";
  }
  if (d_res == d_on) return "confirm";
  if (d_res == 0) {
    if (said == "set_on_hand" || said == "slot_move" || said == "restock" || said == "return" ||
        said == "write_off") {
      return said;
    }
    return d_on > 0 ? "restock" : "sell";
  }
  // A confirm that releases the rest of its hold (release_rest) frees more than it sells.
  if (said == "confirm" && d_on < 0 && d_res < d_on) return "confirm";
  return "batch";
}

void add_violation(AuditReport& report, const AuditOptions& options, AuditViolation v) {
  if (report.violations.size() >= options.limit) {
    report.truncated = true;
    return;
  }
  report.violations.push_back(std::move(v));
}

void add_unchecked_journal(AuditReport& report, const std::string& why) {
  for (const char* check : {"journal_chain", "journal_adds_up", "journal_matches_row"}) {
    report.unchecked.push_back({check, why});
  }
}

void add_unchecked_scope(AuditReport& report, const AuditOptions& options) {
  if (!options.sku) return;
  for (const char* check : {"limit_matches_holds", "key_has_reservations"}) {
    report.unchecked.push_back(
        {check, "it spans every SKU, and this audit read one SKU's rows: audit without a SKU"});
  }
}

void add_unchecked_rows(AuditReport& report, std::uint64_t rows) {
  if (rows == 0) return;
  report.unchecked.push_back(
      {"journal_matches_row",
       std::to_string(rows) + (rows == 1 ? " stock row has" : " stock rows have") +
           " no journal entry (retention purged their entries, or they have not changed "
           "since the journal began, or only while it was off): nothing checks their values "
           "against the journal"});
}

Quantity available_of(const RowChange& row) {
  return available_units(row.on_hand, row.backorder_limit, row.reserved,
                         row.safety_stock + row.damaged + row.quality_control);
}

std::uint32_t alerts_of(const RowChange& before, const RowChange& after) {
  const Quantity was = after.created ? 0 : available_of(before);
  const Quantity now = available_of(after);
  std::uint32_t flags = 0;
  if (after.low_stock && !after.created && before.low_stock == after.low_stock) {
    if (between(was, now, *after.low_stock)) flags |= alert_low_stock;
    if (between(now, was, *after.low_stock)) flags |= alert_recovered;
  }
  if (!after.created && was > 0 && now <= 0) flags |= alert_sold_out;
  if ((after.created || was <= 0) && now > 0) flags |= alert_back_in_stock;
  return flags;
}

}  // namespace stockade
