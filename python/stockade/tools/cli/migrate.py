"""``stockade migrate``: create or upgrade the schema on a server, or print its GRANTs."""

from __future__ import annotations

import argparse

from ...engine import Engine
from ...grants import runtime_grants
from ._common import DSN_HELP, Commands, add_layout, emit_json


def migrate(args: argparse.Namespace) -> int:
    if args.print_grants is not None:  # no connection: the statements for the owner to run
        grants = runtime_grants(args.print_grants, schema=args.schema, owner=args.owner)
        print(f"-- run as the owner of schema {args.schema}, after migrating")
        print("\n".join(grants))
        return 0
    with Engine.postgres(
        args.dsn, schema=args.schema, pool_size=1, layout=args.layout, sweeper=False
    ) as engine:
        if args.dry_run:
            plan = engine.migration_plan(to=args.to)
        else:
            applied = engine.migrate(to=args.to)
    if args.dry_run:
        if args.json:
            emit_json({"schema": args.schema, "plan": [{"name": n, "sql": sql} for n, sql in plan]})
        elif not plan:
            print(f"-- schema {args.schema} is up to date: nothing would run")
        else:
            for name, sql in plan:
                print(f"-- {name}\n{sql.strip()}\n")
        return 0
    if args.json:
        emit_json({"schema": args.schema, "applied": applied})
    elif applied:
        print(f"applied to schema {args.schema}: " + ", ".join(applied))
    else:
        print(f"schema {args.schema} is up to date")
    return 0


def add(commands: Commands) -> None:
    m = commands.command(
        "migrate",
        "create or upgrade the schema on a server",
        "Applies the migrations the schema lacks, under an advisory lock (safe from "
        "several processes at once). --dry-run prints the SQL instead.",
    )
    m.add_argument("--dsn", help=DSN_HELP)
    m.add_argument("--schema", default="stockade", help="the schema to create or upgrade")
    m.add_argument("--to", type=int, default=None, help="stop after this migration number")
    add_layout(m, "citus: distribute the tables on a Citus coordinator (sql/citus/)")
    m.add_argument(
        "--dry-run", action="store_true", help="print the SQL that would run; change nothing"
    )
    m.add_argument(
        "--print-grants",
        metavar="ROLE",
        help="print the GRANTs that let ROLE serve as a runtime role (no DDL rights), for "
        "the schema's owner to run; connects to nothing",
    )
    m.add_argument(
        "--owner",
        help="with --print-grants: the role that runs later migrations (for the default "
        "privileges; default: whoever runs the statements)",
    )
    m.set_defaults(run=migrate)
