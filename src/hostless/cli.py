"""The ``hostless`` command: inspect, check and recover domains (and, with hostless-tools, run
the benchmarks and the protocol tools).

::

    hostless ls [--dir DIR] [--json]   domains: owner, size, live participants, stale or not
    hostless info NAME [--json]        participants, capacities, object counts, heap, epoch
    hostless check NAME                invariant violations: exit status 0 consistent, 1 corrupt,
                                       3 dead participants not recovered yet (run `hostless reap`)
    hostless reap NAME                 recover dead participants, print their ids
    hostless gc [--dry-run] [--min-age S] [--dir DIR]
                                       remove domains no live participant uses
    hostless trace NAME -o out.json    the domain's trace ring as Chrome / Perfetto JSON
    hostless top NAME [--interval S] [--once]
                                       a live view (keys sort, q quits): participants, agents'
                                       packets/s, busy %, failures and why, timelines, heaps

Commands of other distributions join through the entry points of the group
``hostless.commands`` (:data:`PLUGIN_GROUP`): each entry point, named after its command, is a
function that adds its parser to the CLI's subcommands (``add(subparsers)``) and sets
``func``.  hostless-tools (``tools/`` in the repository) registers::

    hostless bench fences|buffers|pipeline [--quick] [-o DIR] ...
    hostless chaos [--kills N] [--workers W] [--seconds S] ...   protocol stress
    hostless fuzz NAME [--cases N] [--seed S] ...                 hostile-memory fuzzer

Without it those three say how to install it (:data:`TOOLS_HINT`) and exit with status 2.

``info``, ``check``, ``trace``, ``top`` and ``ls`` only look: they map the domain
read-only (:class:`hostless.view.DomainView`) and take no participant slot,
no lock and no reference, so they show the domain as it is and cannot change
it.  ``reap`` acts: it joins as a participant labelled ``hostless-cli`` (with
no watchdog) and leaves before exiting.  Tables use rich when it is installed and
plain text otherwise (or with ``--plain`` / ``HOSTLESS_NO_RICH=1``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from typing import Any

from . import __version__, trace
from .cleanup import gc, listing
from .domain import Domain
from .errors import HostlessError
from .info import domain_info
from .recovery import split_findings
from .tables import print_table
from .termtext import safe
from .view import open_view

__all__ = ["main", "build_parser", "domain_info", "PLUGIN_GROUP", "TOOLS", "TOOLS_HINT", "EXIT_UNRECOVERED"]

CLI_LABEL = "hostless-cli"

PLUGIN_GROUP = "hostless.commands"
EXIT_UNRECOVERED = 3
"""``hostless check``'s exit status when the only findings are dead participants that nobody
has recovered yet (0: consistent, 1: corrupt, 2: usage or the domain cannot be opened)."""
"""The entry-point group of the commands other distributions add to ``hostless``."""
TOOLS = {
    "bench": "benchmarks (JSON + Markdown report)",
    "chaos": "protocol stress with SIGKILLs",
    "fuzz": "hostile-memory fuzzer",
}
"""The commands hostless-tools adds (named here so that the CLI can say where they went)."""
_INSTALL = (
    "pip install ./tools (from a clone of the repository; `make test` and `make bench` install it) "
    "or pip install hostless-tools"
)
TOOLS_HINT = f"it is part of hostless-tools, which is not installed: {_INSTALL}"


def _open(name: str) -> Domain:
    return Domain.open(name, label=CLI_LABEL, watchdog_interval=0)


def _print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], plain: bool) -> None:
    print_table(title, headers, rows, plain=plain)


def _safe(text: str, keep_newlines: bool = False) -> str:
    """``text`` from a domain fit for a terminal (:func:`hostless.termtext.safe`)."""
    return safe(text, keep_newlines)


def _size(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


def cmd_info(args: argparse.Namespace) -> int:
    with open_view(args.name) as view:  # read-only: no participant slot taken
        info = domain_info(view)
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    cap = info["capacity"]
    print(
        f"domain {info['name']}: ABI v{info['abi_version']}, {_size(info['total_size'])}, "
        f"created {info['created']}"
    )
    print(
        f"capacity: {cap['fences']} fence slots ({info['free_slots']} free), "
        f"{cap['participants']} participants, "
        f"heap {_size(cap['heap'])}, queues {_size(cap['queues'])}, trace {_size(cap['trace'])}"
    )
    print(
        f"epoch {info['epoch']}, {info['recovered']} recoveries so far (header stats_recovered), "
        f"poll interval {info['poll_interval_s'] * 1e3:g} ms"
    )
    print()
    rows = [
        [
            str(p["id"]),
            str(p["index"]),
            str(p["pid"]),
            _safe(p["label"]),
            _safe(p["kind"]),
            p["state"],
            p["joined"] or "-",
        ]
        for p in info["participants"]
    ]
    _print_table("participants", ["id", "slot", "pid", "label", "kind", "state", "joined"], rows, args.plain)
    orows = []
    for k in ("fence", "timeline", "merged", "buffer", "queue"):
        counts = info["objects"].get(k, {})
        if not counts:
            continue
        detail = ", ".join(f"{n} {s}" for s, n in sorted(info["live"].get(k, {}).items()))
        orows.append(
            [
                k,
                str(counts.get("live", 0)),
                _safe(detail) or "-",
                str(counts.get("alloc", 0)),
                str(counts.get("dying", 0)),
            ]
        )
    if orows:
        _print_table("objects", ["kind", "live", "live by completion", "alloc", "dying"], orows, args.plain)
    else:
        print("objects: none")
    _print_heap(info["heap"], args.plain)
    _print_device_heaps(info.get("device_heaps", []), args.plain)
    nrows = [[_safe(n), e["kind"], e["handle"]] for n, e in sorted(info["names"].items())]
    if nrows:
        _print_table("names (Domain.publish / lookup)", ["name", "kind", "handle"], nrows, args.plain)
    for handle, text in sorted(info["errors"].items()):
        text = _safe(text.rstrip(), keep_newlines=True)
        print(f"\nwhy {handle} failed (hostless.records):\n  " + text.replace("\n", "\n  "))
    return 0


def _print_heap(heap: dict[str, Any], plain: bool) -> None:
    if not heap.get("size"):
        print("heap: none (this domain has no heap; create it with heap=...)")
        return
    row = [
        _size(heap["size"]),
        f"{_size(heap['used'])} ({heap['used'] / heap['size']:.1%})",
        _size(heap["free"]),
        _size(heap["largest_free"]),
        str(heap["free_runs"]),
        f"{heap['fragmentation']:.2%}",
        str(heap.get("buffers", 0)),
        str(heap["allocs"]),
        str(heap["repairs"]),
    ]
    headers = [
        "size",
        "used",
        "free",
        "largest free run",
        "free runs",
        "fragmentation",
        "buffers",
        "allocs",
        "repairs",
    ]
    what = "heap (fragmentation = 1 - largest free run / free)"
    if heap.get("metadata_only"):
        what = "heap: metadata of device buffers only (no heap for host buffers; create with heap=...)"
    _print_table(what, headers, [row], plain)


def _print_device_heaps(heaps: list[dict[str, Any]], plain: bool) -> None:
    if not heaps:
        print("device heaps: none")
        return
    rows = [
        [
            _safe(h["name"]),
            _size(h["size"]),
            f"{_size(h['used'])} ({h['used'] / h['size']:.1%})" if h["size"] else "-",
            _size(h["largest_free"]),
            str(h["granule"]),
            str(h["buffers"]),
            str(h["allocs"]),
            str(h["repairs"]),
        ]
        for h in heaps
        if h.get("gpu_here", True)
    ]
    for h in heaps:
        if not h.get("gpu_here", True):
            print(
                f"device heap {_safe(h['name'])}: declared ({_size(h['size'])}), no GPU here "
                "(no memory backs it on this machine)"
            )
    if not rows:
        return
    headers = ["device", "size", "used", "largest free run", "granule", "buffers", "allocs", "repairs"]
    _print_table("device heaps (bookkeeping; memory mapped by hostless.devmem)", headers, rows, plain)


def cmd_check(args: argparse.Namespace) -> int:
    with open_view(args.name) as view:  # read-only: checking takes no participant slot
        problems = view.check()
    if not problems:
        print(f"{args.name}: consistent")
        return 0
    unreaped, corrupt = split_findings(problems)
    if corrupt:
        print(f"{args.name}: {len(corrupt)} violation(s): the tables are inconsistent")
        for p in corrupt:
            print(f"  {p}")
    if unreaped:
        print(
            f"{args.name}: not recovered yet ({len(unreaped)} finding(s) of dead participants that "
            "nobody has recovered; no live participant runs a watchdog here):"
        )
        for p in unreaped:
            print(f"  {p}")
        print(f"run `hostless reap {args.name}` to recover them, then check again")
    return 1 if corrupt else EXIT_UNRECOVERED


def cmd_reap(args: argparse.Namespace) -> int:
    dom = _open(args.name)
    try:
        before = {p.id: p for p in dom.participants}
        ids = dom.reap()
    finally:
        dom.close()
    if not ids:
        print(f"{args.name}: no dead participant to recover")
        return 0
    print(f"{args.name}: recovered {len(ids)} participant(s)")
    for pid in ids:
        p = before.get(pid)
        who = f" (pid {p.pid}, label {p.label!r}, kind {p.kind!r})" if p is not None else ""
        print(f"  {pid}{who}")
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    found = gc(args.dir, args.min_age, args.dry_run)
    verb = {"removed": "removed", "stale": "would remove"}
    gone = [d for d in found if d.state in verb]
    for d in found:
        what = verb.get(d.state, f"kept ({d.state})")
        print(f"{what:<14} {d.path}  {_size(d.size)}, {d.age:.0f} s old: {d.reason}")
    print(f"{len(gone)} of {len(found)} domain file(s) {'would be ' if args.dry_run else ''}removed")
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    rows = listing(args.dir, args.min_age)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    if not rows:
        print(f"no hostless domain in {args.dir}")
        return 0
    table = [
        [
            _safe(str(r["name"])),
            _safe(str(r["owner"])),
            _size(int(str(r["size"]))),
            "?" if r["participants"] == -1 else str(r["participants"]),
            f"{r['age_s']:.0f} s",
            "stale" if r["stale"] else str(r["state"]),
            _safe(str(r["reason"])),
        ]
        for r in rows
    ]
    headers = ["name", "owner", "size", "live participants", "age", "state", "why"]
    _print_table(f"domains in {args.dir} (read without joining)", headers, table, args.plain)
    stale = sum(1 for r in rows if r["stale"])
    if stale:
        print(f"{stale} stale: `hostless gc` removes them (`hostless gc --dry-run` lists what it would)")
    return 0


def cmd_top(args: argparse.Namespace) -> int:
    """``hostless top``: read-only, refreshes every ``--interval`` s (:mod:`hostless.top`)."""
    from . import top

    if not 0.02 <= args.interval <= 60:
        print("hostless: --interval is in 0.02..60 seconds", file=sys.stderr)
        return 2
    open_view(args.name).close()  # a name that is no domain: the usual message, exit 2
    if args.once:
        mon = top.Monitor(args.name)
        try:
            first = mon.read()
            time.sleep(args.interval)
            cur = top.remember(mon.read(), first)
        finally:
            mon.close()
        print("\n".join(top.render(cur, first, width=shutil.get_terminal_size((200, 50)).columns)))
        return 1 if cur.error else 0
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        print("hostless: top needs a terminal (or --once for one refresh as text)", file=sys.stderr)
        return 2
    return top.main(args.name, args.interval)


def cmd_trace(args: argparse.Namespace) -> int:
    with open_view(args.name) as view:  # read-only: the exporter is no participant of the trace
        if not view.trace_enabled():
            print(f"{args.name}: this domain has no trace ring (create it with trace=...)", file=sys.stderr)
            return 1
        n = trace.export(view, args.output)
    print(f"wrote {n} trace events to {args.output} (open it in ui.perfetto.dev or chrome://tracing)")
    return 0


def _tool_missing(args: argparse.Namespace) -> int:
    """What a tool's command runs when its distribution is not installed (or did not load)."""
    print(f"hostless {args.command}: {args.tool_missing}", file=sys.stderr)
    return 2


def _plugins() -> dict[str, Any]:
    """The entry points of :data:`PLUGIN_GROUP` by command name (the first of a name wins)."""
    from importlib.metadata import entry_points

    found: dict[str, Any] = {}
    for ep in entry_points(group=PLUGIN_GROUP):
        found.setdefault(ep.name, ep)
    return found


def _add_plugins(sub: Any) -> None:
    """Each plugin's command, and for a tool that none provides a command that says how to get it."""
    added = set()
    for name, ep in sorted(_plugins().items()):
        if name in sub.choices:
            continue  # a built-in command keeps its name
        try:
            add = ep.load()
        except Exception as e:  # a broken install: say so when the command is used
            why = f"{ep.value} did not load ({type(e).__name__}: {e}); reinstall it: {_INSTALL}"
            _add_missing(sub, name, TOOLS.get(name, ep.value), why)
        else:
            add(sub)
        added.add(name)
    for name, what in TOOLS.items():
        if name not in added:
            _add_missing(sub, name, what, TOOLS_HINT)


def _add_missing(sub: Any, name: str, what: str, why: str) -> None:
    s = sub.add_parser(name, help=f"{what} (needs hostless-tools)", add_help=False)
    s.set_defaults(func=_tool_missing, tool_missing=why)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser: the built-in commands, then those of :data:`PLUGIN_GROUP`."""
    p = argparse.ArgumentParser(prog="hostless", description="Inspect hostless domains (and run the tools).")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--plain", action="store_true", help="plain-text tables even when rich is installed")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("ls", help="list domains: owner, size, live participants, stale or not")
    s.add_argument("--dir", default="/dev/shm", help="directory to scan (default /dev/shm)")
    s.add_argument("--min-age", type=float, default=1.0, metavar="S", help="younger files are never stale")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_ls)

    s = sub.add_parser("info", help="participants, capacities, object counts, epoch")
    s.add_argument("name", help="domain name (/dev/shm/NAME)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_info)

    s = sub.add_parser(
        "check",
        help="print invariant violations: exit status 1 if corrupt, 3 if dead participants need a reap",
    )
    s.add_argument("name", help="domain name (/dev/shm/NAME)")
    s.set_defaults(func=cmd_check)

    s = sub.add_parser("reap", help="recover dead participants now; print their ids")
    s.add_argument("name", help="domain name (/dev/shm/NAME)")
    s.set_defaults(func=cmd_reap)

    s = sub.add_parser("gc", help="remove domain files that no live participant uses (see hostless.cleanup)")
    s.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    s.add_argument(
        "--min-age",
        type=float,
        default=1.0,
        metavar="S",
        help="leave files younger than S seconds alone (a creator may be starting; default 1)",
    )
    s.add_argument("--dir", default="/dev/shm", help="directory to scan (default /dev/shm)")
    s.set_defaults(func=cmd_gc)

    t = sub.add_parser("trace", help="export the domain's trace ring as Chrome / Perfetto JSON")
    t.add_argument("name", help="domain name (/dev/shm/NAME)")
    t.add_argument("-o", "--output", required=True, metavar="FILE", help="output JSON file")
    t.set_defaults(func=cmd_trace)

    t = sub.add_parser("top", help="a live view: participants, agents' rates and failures, timelines, heaps")
    t.add_argument("name", help="domain name (/dev/shm/NAME)")
    t.add_argument("--interval", type=float, default=0.25, metavar="S", help="seconds between refreshes")
    t.add_argument("--once", action="store_true", help="print one refresh (rates over --interval) and exit")
    t.set_defaults(func=cmd_top)

    _add_plugins(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hostless`` console script; returns the exit status."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if getattr(args, "tool_missing", None) is not None:  # whatever its arguments
        return _tool_missing(args)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        rc: int = args.func(args)
    except FileNotFoundError as e:
        name = getattr(args, "name", None)
        if name is None:
            raise
        if e.filename and os.path.basename(str(e.filename)) != name.lstrip("/"):
            print(f"hostless: {e.strerror or e}: {e.filename}", file=sys.stderr)  # e.g. an output path
        else:
            print(f"hostless: no domain named {name!r} ({e.filename or e})", file=sys.stderr)
        return 2
    except ValueError as e:
        if getattr(args, "name", None) is None:
            raise
        print(f"hostless: {e}", file=sys.stderr)
        return 2
    except HostlessError as e:
        print(f"hostless: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `hostless info NAME --json | head`
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except OSError:
            pass
        return 141
    except OSError as e:  # a directory, a symlink, permissions, an output path...
        if getattr(args, "name", None) is None:
            raise
        print(f"hostless: {e.strerror or e}: {e.filename or args.name}", file=sys.stderr)
        return 2
    return rc


if __name__ == "__main__":
    sys.exit(main())
