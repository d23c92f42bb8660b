"""The tools' commands of the ``hostless`` CLI, registered as entry points of the group
``hostless.commands`` (tools/pyproject.toml): ``hostless bench fences|buffers|channel|pipeline``,
``hostless chaos`` and ``hostless fuzz``.  Each ``add_*`` adds its parser to the CLI's
subcommands; the modules behind it are imported when the command runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["add_bench", "add_chaos", "add_fuzz"]


def cmd_bench_fences(args: argparse.Namespace) -> int:
    from hostless_tools.bench import fences

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


def cmd_bench_algebra(args: argparse.Namespace) -> int:
    from hostless_tools.bench import algebra

    cfg = algebra.AlgebraBenchConfig.quick_config() if args.quick else algebra.AlgebraBenchConfig()
    if args.rounds is not None:
        cfg.rounds = max(1, args.rounds)
    if args.n is not None:
        cfg.n = max(100, args.n)
    cfg.old_rev, cfg.old_site, cfg.new_site = args.old, args.old_site, args.new_site
    cfg.pin = not args.no_pin
    return _report(algebra, algebra.run(cfg), args)


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
    from hostless.domain import parse_size
    from hostless_tools.bench import buffers

    cfg = buffers.BufferBenchConfig.quick_config() if args.quick else buffers.BufferBenchConfig()
    if args.max_size is not None:
        cfg.max_size = parse_size(args.max_size)
    if args.no_pin:
        cfg.pin = False
    return _report(buffers, buffers.run(cfg), args)


def cmd_bench_channel(args: argparse.Namespace) -> int:
    from hostless_tools.bench import channel

    cfg = channel.ChannelBenchConfig.quick_config() if args.quick else channel.ChannelBenchConfig()
    if args.no_pin:
        cfg.pin = False
    if args.no_iceoryx2:
        cfg.iceoryx2 = False
    return _report(channel, channel.run(cfg, progress=print), args)


def cmd_bench_pipeline(args: argparse.Namespace) -> int:
    from hostless_tools.bench import pipeline

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


def cmd_chaos(args: argparse.Namespace) -> int:
    from hostless_tools import chaos
    from hostless_tools._tooling import print_run

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
    from hostless_tools import fuzz
    from hostless_tools._tooling import print_run

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


def add_bench(sub: Any) -> None:
    """``hostless bench fences|buffers|pipeline|algebra``."""
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
    bc = _bench_parser(
        bsub,
        "channel",
        "channels (one publisher, 1 and 4 subscriber processes; 64 B and 1080p) vs iceoryx2's "
        "Python publish-subscribe: latency, throughput, CPU per frame",
        "a smoke run (few frames, one round)",
        "do not pin the publisher and subscribers to CPUs",
        cmd_bench_channel,
    )
    bc.add_argument("--no-iceoryx2", action="store_true", help="skip iceoryx2 even when it is importable")
    bp = _bench_parser(
        bsub,
        "pipeline",
        "graphs in the four modes (host/direct x copy/shared) on the agents' C loop, per-hop "
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
        help="comma-separated agent sets (default: native-poll,native-park; "
        "the first one's figures are the goals')",
    )
    bp.add_argument("--no-ray", action="store_true", help="skip the Ray peers even when ray is importable")
    ba = _bench_parser(
        bsub,
        "algebra",
        "fence algebra, old build vs new in one run: create+signal+release, round trips with a "
        "single wait and with wait_any over 8, a watched timeline's signal",
        "2 rounds of 1000 (about a minute after the old build)",
        "do not pin the round trips' two processes to CPUs",
        cmd_bench_algebra,
    )
    ba.add_argument("--old", default="d7c7636", metavar="REV", help="old build's git revision (%(default)s)")
    ba.add_argument("--old-site", default=None, metavar="DIR", help="a folder with a built old hostless")
    ba.add_argument("--new-site", default=None, metavar="DIR", help="the new build's folder (default: ours)")
    ba.add_argument("--rounds", type=int, default=None, metavar="R", help="interleaved rounds (default 6)")
    ba.add_argument("-n", type=int, default=None, metavar="N", help="operations / round trips per figure")


def add_chaos(sub: Any) -> None:
    """``hostless chaos``."""
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


def add_fuzz(sub: Any) -> None:
    """``hostless fuzz``."""
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
