// The movement journal, the change feed over it, and the audit (docs/journal.md).
//
// Every change of a stock row writes one journal entry in the same transaction as the
// change: on PostgreSQL a row trigger on the stock table (migration 007), so that no code
// path, and no manual SQL either, changes a row without its entry; in the memory store
// the row's latch, held while the entry is appended. An entry carries the row's version
// before and after, the deltas and the values after, and its cause. A batch writes one
// entry per row it moved, with its net deltas and its count of requests.
//
// The cause is read from the change itself (a hold moves reserved up, a confirm moves
// on_hand and reserved down together, ...); a call whose cause cannot be read from its
// deltas (set_on_hand, an expiry), or that carries a reason, an actor or a reservation,
// says so through a JournalNote in scope on its thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "stockade/types.hpp"

namespace stockade {

// The flags a change carries when a row's available units cross a line.
enum AlertFlag : std::uint32_t {
  alert_low_stock = 1,      // available fell below the row's low-stock threshold
  alert_sold_out = 2,       // available fell from above zero to zero or below
  alert_back_in_stock = 4,  // available rose from zero or below to above zero
  alert_recovered = 8,      // available rose from below the threshold to it or above
};

// One journal entry: one change of one stock row.
struct Movement {
  std::int64_t position = 0;   // the journal's order; also the feed's
  SkuKey key;                  // with the slot of a hot-row slot's row
  Version version_before = 0;  // 0: the change made the row
  Version version_after = 0;
  Quantity on_hand_delta = 0;
  Quantity reserved_delta = 0;
  Quantity on_hand = 0;  // after the change
  Quantity reserved = 0;
  Quantity available = 0;
  std::string cause;
  std::string reason;  // as the caller gave them ("" when not)
  std::string actor;
  std::string ref;            // the reservation id, where the change has one
  std::int64_t requests = 1;  // a batch's entry: how many requests its net deltas hold
  std::uint32_t alerts = 0;   // AlertFlag bits
  TimestampUs at_us = 0;      // the store's clock (the database's on PostgreSQL)
};

struct MovementQuery {
  std::optional<std::string> sku;
  std::optional<std::string> location;
  std::int64_t after = 0;    // entries with a position above this one
  TimestampUs since_us = 0;  // and made at or after this time (0: any)
  std::size_t limit = 1000;  // 1..movements_limit_max, in position order
};
inline constexpr std::size_t movements_limit_max = 100000;

// Where a feed consumer stands. Opaque to callers: on PostgreSQL the snapshot up to which
// every change was delivered (`from`), the snapshot of the batch being delivered (`to`,
// "" between batches) and the last position delivered of that batch; in the memory store
// the last position alone.
struct FeedPosition {
  std::string from;
  std::string to;
  std::int64_t after = 0;
  friend bool operator==(const FeedPosition& a, const FeedPosition& b) {
    return a.from == b.from && a.to == b.to && a.after == b.after;
  }
};

struct FeedBatch {
  std::vector<Movement> changes;
  FeedPosition next;  // the position after these changes
};

// What a wait for the feed's next change ended with (Store::feed_wait). `unsupported`:
// the store cannot be told (behind a transaction-mode pooler), so the caller polls.
enum class FeedWake { changed, timeout, unsupported };
const char* feed_wake_name(FeedWake wake) noexcept;

// Consumer names: 1..128 bytes of UTF-8 without control characters.
void validate_consumer_name(const std::string& name);
inline constexpr std::size_t feed_limit_max = 100000;

// What a call tells the journal about itself, on its thread, for the changes it makes.
struct JournalNote {
  std::string cause;  // one the deltas cannot show: set_on_hand, expire, confirm, ...
  std::string reason;
  std::string actor;
  std::string ref;
  bool empty() const { return cause.empty() && reason.empty() && actor.empty() && ref.empty(); }
};
// reason and actor: 0..200 bytes of UTF-8 without control characters.
void validate_note_text(const std::string& text, const char* field);

// Puts a note in scope on this thread until it is destroyed (scopes nest; the innermost
// is seen). A store reads it with current_note().
class NoteScope {
 public:
  explicit NoteScope(JournalNote note);
  ~NoteScope();
  NoteScope(const NoteScope&) = delete;
  NoteScope& operator=(const NoteScope&) = delete;

 private:
  JournalNote note_;
  const JournalNote* outer_;
};
const JournalNote* current_note() noexcept;

// The fields of a row a change is read from.
struct RowChange {
  bool created = false;
  Quantity on_hand = 0, reserved = 0, backorder_limit = 0;
  Quantity safety_stock = 0, damaged = 0, quality_control = 0, incoming = 0;
  bool discontinued = false;
  std::optional<Quantity> low_stock;
  FencingToken lease_token = 0;
  TimestampUs lease_expires_us = 0;
  Version version = 0;
};
// The cause of a change from `before` to `after`, as migration 007's trigger reads it:
// the note's cause where the deltas allow it.
std::string cause_of(const RowChange& before, const RowChange& after, const std::string& said);
std::uint32_t alerts_of(const RowChange& before, const RowChange& after);
// The row's available units after the change (StockLevel::available).
Quantity available_of(const RowChange& row);

// The audit (Engine::audit): checks the invariants from the data itself.
struct AuditOptions {
  std::optional<std::string> sku;            // only this SKU's rows (every location and slot)
  std::size_t limit = 1000;                  // report at most this many violations
  std::int64_t expiry_lag_us = 300'000'000;  // a hold may outlive its expiry by this much
};
struct AuditViolation {
  std::string check;    // reserved_matches_holds, hold_not_expired, limit_matches_holds, ...
  SkuKey key;           // the row it concerns ("" sku when none)
  std::string subject;  // a reservation id, a key, a group/buyer
  std::string expected;
  std::string found;
};
// A part of the data a check did not cover, and why: the check did not run at all (the
// journal is off; a check that spans every SKU, in an audit of one SKU), or it ran but not
// over everything (rows whose journal entries retention has purged).
struct AuditUnchecked {
  std::string check;
  std::string reason;
};
struct AuditReport;
// Adds `v` to `report`, or marks it truncated once it holds options.limit violations.
void add_violation(AuditReport& report, const AuditOptions& options, AuditViolation v);
// What both stores report unchecked: the journal's checks when it is off (`why`), the
// checks that span every SKU when options.sku names one, and journal_matches_row for
// `rows` rows without a journal entry.
void add_unchecked_journal(AuditReport& report, const std::string& why);
void add_unchecked_scope(AuditReport& report, const AuditOptions& options);
void add_unchecked_rows(AuditReport& report, std::uint64_t rows);
struct AuditReport {
  std::vector<AuditViolation> violations;
  bool truncated = false;  // more violations than the limit
  std::uint64_t rows = 0;  // stock rows read
  std::uint64_t reservations = 0;
  std::uint64_t movements = 0;
  bool journal_checked = false;
  std::vector<std::string> checks;        // the checks that ran
  std::vector<AuditUnchecked> unchecked;  // what they could not cover (empty: everything)
};

}  // namespace stockade
