"""``stockade audit``: the invariants checked from the data."""

from __future__ import annotations

import argparse

from ...engine import Engine
from ...journal import AuditReport
from ._common import DSN_HELP, Commands, add_layout, emit_json, number

# The exit status of an audit that found nothing but could not check everything.
INCOMPLETE = 3


def _print(report: AuditReport) -> None:
    for v in report.violations:
        slot = f" slot {v.slot}" if v.slot else ""
        where = f" {v.sku}@{v.location}{slot}" if v.sku else ""
        subject = f" {v.subject}" if v.subject else ""
        print(f"{v.check}:{where}{subject}: expected {v.expected}, found {v.found}")
    for u in report.unchecked:
        print(f"not checked: {u.check}: {u.reason}")
    more = " (and more: raise --limit)" if report.truncated else ""
    gaps = ""
    if report.unchecked:
        parts = len({u.check for u in report.unchecked})
        gaps = f"; {parts} checks did not cover everything (listed above)"
    print(
        f"audited {report.rows} rows, {report.reservations} reservations and "
        f"{report.movements} journal entries in {report.seconds:.2f} s: "
        f"{len(report.violations)} violations{more}{gaps}"
    )


def audit(args: argparse.Namespace) -> int:
    with Engine.postgres(
        # No sweeper: the audit reads the holds as the service's sweeper left them.
        args.dsn,
        schema=args.schema,
        layout=args.layout,
        pool_size=1,
        sweeper=False,
    ) as engine:
        report = engine.audit(sku=args.sku, limit=args.limit, expiry_lag=args.expiry_lag)
    if args.json:
        emit_json({"schema": args.schema, **report.to_dict()})
    else:
        _print(report)
    if not report.ok:
        return 1
    return 0 if report.complete or args.allow_unchecked else INCOMPLETE


def add(commands: Commands) -> None:
    a = commands.command(
        "audit",
        "check the invariants from the data; exit 1 on a violation",
        "Reads the schema (no row lock) and lists every broken invariant with the row and "
        "what was expected: reserved against the holds, lapsed holds, purchase-limit "
        "counts, slot rows, keys, and the movement journal against the rows "
        "(docs/journal.md), and what it could not check (the journal off, rows whose "
        "journal entries are gone, checks that span every SKU under --sku). Exits 0 when "
        "clean, 1 on a violation, 2 on an error, 3 when clean but a part could not be "
        "checked (0 with --allow-unchecked).",
    )
    a.add_argument("--dsn", help=DSN_HELP)
    a.add_argument("--schema", default="stockade", help="the schema to audit")
    add_layout(a, "citus: the schema is distributed on a Citus coordinator")
    a.add_argument("--sku", help="audit this SKU's rows only")
    a.add_argument(
        "--limit", type=number(int, 1, 100_000), default=1000, help="report at most this many"
    )
    a.add_argument(
        "--expiry-lag",
        type=number(float, 0, 366 * 86_400),
        default=300.0,
        help="seconds a hold may outlive its expiry before it counts (the sweeper's lag)",
    )
    a.add_argument(
        "--allow-unchecked",
        action="store_true",
        help="exit 0 on a clean audit even when a part could not be checked (it is still listed)",
    )
    a.set_defaults(run=audit)
