"""The ``hostless`` command: inspect, check and recover domains, and run the benchmarks.

::

    hostless info NAME [--json]        participants, capacities, object counts, heap, epoch
    hostless check NAME                invariant violations (exit status 1 if any)
    hostless reap NAME                 recover dead participants, print their ids
    hostless gc [--dry-run] [--min-age S] [--dir DIR]
                                       remove domains no live participant uses
    hostless bench fences [--quick] [-o DIR] [-n N] [--no-write]
    hostless bench buffers [--quick] [-o DIR] [--max-size SIZE] [--no-write]
    hostless bench pipeline [--quick] [-o DIR] [-n N] [--agents SETS] [--no-ray] [--no-pin] [--no-write]
    hostless trace NAME -o out.json    the domain's trace ring as Chrome / Perfetto JSON
    hostless chaos [--kills N] [--workers W] [--seconds S] [--fences F] [--seed X] [-o DIR]
                                       protocol stress (exit status 1 on any anomaly, hang or leak)
    hostless fuzz NAME [--cases N] [--seed S] [--case K] [--truncate N] [-o DIR]
                                       hostile-memory fuzzer (exit status 1 on any crash or hang)

``info``, ``check`` and ``reap`` join the domain as a participant labelled
``hostless-cli`` (with no watchdog, so that they report the domain as they
found it) and leave before exiting.  Tables use rich when it is installed and
plain text otherwise (or with ``--plain`` / ``HOSTLESS_NO_RICH=1``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any

from .info import domain_info

__all__ = ["main", "build_parser", "domain_info"]

CLI_LABEL = "hostless-cli"


def _open(name: str) -> Any:
    import hostless as hl

    return hl.Domain.open(name, label=CLI_LABEL, watchdog_interval=0)


def _print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], plain: bool) -> None:
    from hostless.bench import print_table

    print_table(title, headers, rows, plain=plain)


def _safe(text: str, keep_newlines: bool = False) -> str:
    """``text`` from a domain (labels, kinds, names, records: anyone who may write the
    domain chose them) fit for a terminal: control and format characters (escape
    sequences, bidirectional overrides) are shown as Python escapes (``\\x1b``)."""
    out = []
    for ch in text:
        if (keep_newlines and ch == "\n") or unicodedata.category(ch) not in ("Cc", "Cf", "Cs"):
            out.append(ch)
        else:
            out.append(ascii(ch)[1:-1])
    return "".join(out)


def _size(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


def cmd_info(args: argparse.Namespace) -> int:
    dom = _open(args.name)
    try:
        info = domain_info(dom)
    finally:
        dom.close()
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
            _safe(p["label"]) + (" (this command)" if p["this_cli"] else ""),
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
            f"{_size(h['used'])} ({h['used'] / h['size']:.1%})",
            _size(h["largest_free"]),
            str(h["granule"]),
            str(h["buffers"]),
            str(h["allocs"]),
            str(h["repairs"]),
        ]
        for h in heaps
    ]
    headers = ["device", "size", "used", "largest free run", "granule", "buffers", "allocs", "repairs"]
    _print_table("device heaps (bookkeeping; memory mapped by hostless.devmem)", headers, rows, plain)


def cmd_check(args: argparse.Namespace) -> int:
    dom = _open(args.name)
    try:
        problems = dom.check()
    finally:
        dom.close()
    if not problems:
        print(f"{args.name}: consistent")
        return 0
    print(f"{args.name}: {len(problems)} violation(s)")
    for p in problems:
        print(f"  {p}")
    return 1


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
    from hostless.cleanup import gc

    found = gc(args.dir, args.min_age, args.dry_run)
    verb = {"removed": "removed", "stale": "would remove"}
    gone = [d for d in found if d.state in verb]
    for d in found:
        what = verb.get(d.state, f"kept ({d.state})")
        print(f"{what:<14} {d.path}  {_size(d.size)}, {d.age:.0f} s old: {d.reason}")
    print(f"{len(gone)} of {len(found)} domain file(s) {'would be ' if args.dry_run else ''}removed")
    return 0


def cmd_bench_fences(args: argparse.Namespace) -> int:
    from hostless.bench import fences

    cfg = fences.FenceBenchConfig.quick_config() if args.quick else fences.FenceBenchConfig()
    if args.round_trips is not None:
        cfg.round_trips = args.round_trips
        cfg.warmup = max(100, args.round_trips // 10)
    if args.spin is not None:
        cfg.spin = args.spin
    if args.rounds is not None:
        cfg.rounds = max(1, min(args.rounds, cfg.round_trips))
    if args.no_pin:
        cfg.pin = False
    return _report(fences, fences.run(cfg), args)


def _report(bench: Any, result: dict[str, Any], args: argparse.Namespace) -> int:
    """Print a benchmark's report and (unless --no-write) write its result files."""
    print()
    bench.print_report(result, plain=args.plain)
    if not args.no_write:
        paths = bench.write_results(result, args.output)
        print("wrote " + " and ".join(str(x) for x in paths))
        if result.get("plot"):
            print(result["plot"])
    return 0


def cmd_bench_buffers(args: argparse.Namespace) -> int:
    from hostless.bench import buffers
    from hostless.domain import parse_size

    cfg = buffers.BufferBenchConfig.quick_config() if args.quick else buffers.BufferBenchConfig()
    if args.max_size is not None:
        cfg.max_size = parse_size(args.max_size)
    if args.no_pin:
        cfg.pin = False
    return _report(buffers, buffers.run(cfg), args)


def cmd_bench_pipeline(args: argparse.Namespace) -> int:
    from hostless.bench import pipeline

    cfg = pipeline.PipelineBenchConfig.quick_config() if args.quick else pipeline.PipelineBenchConfig()
    if args.frames is not None:
        cfg.frames = max(1, args.frames)
        cfg.rounds = max(1, min(cfg.rounds, cfg.frames))
    if args.agents:
        cfg.agent_sets = tuple(a.strip() for a in args.agents.split(",") if a.strip())
    if args.no_ray:
        cfg.ray = False
    if args.no_pin:
        cfg.pin = False
    return _report(pipeline, pipeline.run(cfg), args)


def cmd_trace(args: argparse.Namespace) -> int:
    from hostless import trace

    dom = _open(args.name)
    try:
        if not dom.trace_enabled():
            print(f"{args.name}: this domain has no trace ring (create it with trace=...)", file=sys.stderr)
            return 1
        n = trace.export(dom, args.output)
    finally:
        dom.close()
    print(f"wrote {n} trace events to {args.output} (open it in ui.perfetto.dev or chrome://tracing)")
    return 0


def cmd_chaos(args: argparse.Namespace) -> int:
    from hostless import chaos
    from hostless._tooling import print_run

    if args.workers < 1 or args.seconds <= 0 or args.kills < 0 or args.fences < 16:
        print("hostless: need --workers >= 1, --seconds > 0, --kills >= 0, --fences >= 16", file=sys.stderr)
        return 2
    result = chaos.run(
        workers=args.workers,
        seconds=args.seconds,
        kills=args.kills,
        fences=args.fences,
        seed=args.seed,
        mode=args.mode,
        iterations=args.iterations,
        nested=not args.no_nested,
        buffers=not args.no_buffers,
        shared=not args.no_shared,
        progress=print,
    )
    print_run(
        chaos.summary_lines(result),
        None if args.no_write else lambda: chaos.write_results(result, args.output),
    )
    return 0 if result["ok"] else 1


def cmd_fuzz(args: argparse.Namespace) -> int:
    from hostless import fuzz
    from hostless._tooling import print_run

    if args.cases < 0 or args.truncate < 0 or args.innocents < 1 or args.deadline <= 0:
        print("hostless: need --cases, --truncate >= 0, --innocents >= 1, --deadline > 0", file=sys.stderr)
        return 2
    result = fuzz.run(
        args.name,
        cases=args.cases,
        seed=args.seed,
        case=args.case,
        truncate=args.truncate,
        innocents=args.innocents,
        window=args.window,
        deadline=args.deadline,
        cli=args.cli_probes,
        victims=args.victims,
        dry=args.dry_run,
        force=fuzz.parse_set(args.set, args.toggle) if args.set else None,
        progress=None if args.quiet else print,
    )
    print_run(
        fuzz.summary_lines(result), None if args.no_write else lambda: fuzz.write_results(result, args.output)
    )
    if args.findings and result["findings"]:
        with open(args.findings, "a", encoding="utf-8") as fh:
            fh.write(fuzz.findings_markdown(result))
    return 0 if result["ok"] else 1


def _bench_parser(
    bsub: Any, name: str, help: str, quick: str, no_pin: str, func: Callable[[argparse.Namespace], int]
) -> argparse.ArgumentParser:
    """A ``bench NAME`` parser with the options every benchmark has: --quick, -o, --no-pin, --no-write."""
    p: argparse.ArgumentParser = bsub.add_parser(name, help=help)
    p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument(
        "-o",
        "--output",
        default="benchmarks/results",
        metavar="DIR",
        help="output directory (default: %(default)s)",
    )
    p.add_argument("--no-pin", action="store_true", help=no_pin)
    p.add_argument("--no-write", action="store_true", help="print the tables only")
    p.set_defaults(func=func)
    return p


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (``bench`` is a group: later ``bench buffers`` and ``bench pipeline`` join it)."""
    p = argparse.ArgumentParser(
        prog="hostless", description="Inspect hostless domains and run the benchmarks."
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    p.add_argument("--plain", action="store_true", help="plain-text tables even when rich is installed")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("info", help="participants, capacities, object counts, epoch")
    s.add_argument("name", help="domain name (/dev/shm/NAME)")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_info)

    s = sub.add_parser("check", help="print invariant violations; exit status 1 if any")
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

    b = sub.add_parser("bench", help="benchmarks (JSON + Markdown report)")
    bsub = b.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    f = _bench_parser(
        bsub,
        "fences",
        "cross-process signal->wake round trips vs C, NumPy and Pipe references; fence throughput",
        "a small run (a few seconds)",
        "do not pin the two processes to CPUs",
        cmd_bench_fences,
    )
    f.add_argument("-n", "--round-trips", type=int, default=None, metavar="N", help="round trips per figure")
    f.add_argument(
        "--spin", type=float, default=None, metavar="SECONDS", help="spin budget of spin mode (50e-6)"
    )
    f.add_argument(
        "--rounds", type=int, default=None, metavar="R", help="interleaved rounds (default 4, --quick 1)"
    )
    bb = _bench_parser(
        bsub,
        "buffers",
        "process-to-process buffer hand-off (zero-copy vs copy mode, shared_memory, pickle); allocator",
        "sizes up to 64 MiB, fewer repetitions (~10 s)",
        "do not pin the two processes to CPUs",
        cmd_bench_buffers,
    )
    bb.add_argument("--max-size", default=None, metavar="SIZE", help="largest size (default 1G, --quick 64M)")
    bp = _bench_parser(
        bsub,
        "pipeline",
        "graphs in the four modes (host/direct x copy/shared) on native and Python agents, per-hop "
        "cost, C references, Ray peers (benchmarks/peers/ray_pipelines.py)",
        "a small run (well under a minute)",
        "do not pin the agents to CPUs",
        cmd_bench_pipeline,
    )
    bp.add_argument("-n", "--frames", type=int, default=None, metavar="N", help="frames per latency figure")
    bp.add_argument(
        "--agents",
        default=None,
        metavar="SETS",
        help="comma-separated agent sets (default: native-poll,native-park,python-poll,python-park; "
        "the first one's figures are the goals')",
    )
    bp.add_argument("--no-ray", action="store_true", help="skip the Ray peers even when ray is importable")

    t = sub.add_parser("trace", help="export the domain's trace ring as Chrome / Perfetto JSON")
    t.add_argument("name", help="domain name (/dev/shm/NAME)")
    t.add_argument("-o", "--output", required=True, metavar="FILE", help="output JSON file")
    t.set_defaults(func=cmd_trace)

    c = sub.add_parser(
        "chaos",
        help="protocol stress: workers on private objects (any anomaly is a bug), random SIGKILLs; "
        "exit status 1 on any anomaly, hung waiter, leak or check() finding",
    )
    c.add_argument("--kills", type=int, default=0, metavar="N", help="SIGKILLs to do (0: no-kill stress)")
    c.add_argument("--workers", type=int, default=3, metavar="W", help="workers at once (default 3)")
    c.add_argument(
        "--seconds",
        type=float,
        default=10.0,
        metavar="S",
        help="run time without kills, time limit with kills or --mode repro (default 10)",
    )
    c.add_argument("--fences", type=int, default=512, metavar="F", help="fence-table slots (default 512)")
    c.add_argument("--seed", type=int, default=None, metavar="X", help="random seed (default: random)")
    c.add_argument(
        "--mode",
        choices=["mix", "repro"],
        default="mix",
        help="mix: random operations; repro: the fence/fence/merge/signal/wait/release loop",
    )
    c.add_argument("--iterations", type=int, default=0, metavar="N", help="loops per worker (--mode repro)")
    c.add_argument("--no-nested", action="store_true", help="no merges of merges")
    c.add_argument("--no-buffers", action="store_true", help="no heap buffers")
    c.add_argument("--no-shared", action="store_true", help="no objects published to the driver's waiters")
    c.add_argument(
        "-o",
        "--output",
        default="benchmarks/results",
        metavar="DIR",
        help="output directory (default: %(default)s)",
    )
    c.add_argument("--no-write", action="store_true", help="print the summary only")
    c.set_defaults(func=cmd_chaos)

    z = sub.add_parser(
        "fuzz",
        help="hostile-memory fuzzer: corrupt fields of live domains under innocent processes; "
        "exit status 1 on any crash or hang",
    )
    z.add_argument("name", help="prefix of the cases' domain names (/dev/shm/NAME-<pid>-<case>)")
    z.add_argument("--cases", type=int, default=100, metavar="N", help="field-corruption cases (default 100)")
    z.add_argument("--seed", type=int, default=None, metavar="S", help="random seed (default: random)")
    z.add_argument("--case", default=None, metavar="K", help="run only case K (tK: truncation case K)")
    z.add_argument("--truncate", type=int, default=0, metavar="N", help="truncation cases, reported apart")
    z.add_argument("--innocents", type=int, default=2, metavar="P", help="innocent processes per case (2)")
    z.add_argument("--window", type=float, default=0.4, metavar="S", help="seconds of work after the write")
    z.add_argument("--deadline", type=float, default=10.0, metavar="S", help="hang deadline (default 10 s)")
    z.add_argument(
        "--cli-probes", type=float, default=0.25, metavar="P", help="share of cases with a CLI probe (0.25)"
    )
    z.add_argument(
        "-o",
        "--output",
        default="benchmarks/results",
        metavar="DIR",
        help="output directory (default: %(default)s)",
    )
    z.add_argument(
        "--victims",
        type=float,
        default=0.3,
        metavar="P",
        help="share of cases where one more participant is SIGKILLed after the write (recovery; 0.3)",
    )
    z.add_argument(
        "--set",
        default=None,
        metavar="REGION.FIELD[@TARGET]=VALUE",
        help="write exactly this in every field case (e.g. 'header.trace_offset=0x8000000000000000', "
        "'fence.ctl@timeline=0', 'queue.*=hex:00ff...')",
    )
    z.add_argument("--toggle", action="store_true", help="with --set: alternate it with the original bytes")
    z.add_argument(
        "--dry-run", action="store_true", help="plan the cases but corrupt nothing (harness baseline)"
    )
    z.add_argument("--no-write", action="store_true", help="print the summary only")
    z.add_argument("--findings", default=None, metavar="FILE", help="append crashes and hangs to FILE")
    z.add_argument("--quiet", action="store_true", help="no line per case")
    z.set_defaults(func=cmd_fuzz)
    return p


def _version() -> str:
    try:
        from hostless import __version__

        return __version__
    except Exception:  # pragma: no cover - broken install
        return "?"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hostless`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from hostless.errors import HostlessError

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
