"""Where a frame's time goes: the steps of a packet's travel, from the domain's trace ring.

:func:`traced_frames` runs a few frames of a compiled chain graph in a
domain created with a trace ring, each frame's bounds taken as a host span's
(the host's clock just before and after ``run``), and :func:`frame_steps`
cuts every frame into the steps of its packets' travel, from the ring's events:

* ``submit``: the host's span begins -> the first packet's ENQUEUE (inputs
  written, packet patched and pushed);
* per stage ``k``: ``wake`` (ENQUEUE -> the agent's START: doorbell, wake-up
  or poll, pop), ``run`` (START -> END: checks, input waits, kernel),
  ``signal`` (END -> the stage's SIGNAL of its timeline; that event is
  stamped after the futex wake, so it is counted up to the next step at
  most), then ``next``
  (SIGNAL -> the next packet's ENQUEUE: the agent's follow-up push in direct
  dispatch; the host's wake-up, copy and push in host dispatch);
* ``host_wake``: the last SIGNAL -> the host's span ends (its wait returns,
  the outputs are read).

The steps of one frame add up to its span.  Each step is the median over the
frames (with p10 / p90).  Tracing costs a few tens of ns per event, so these
frames are measured apart from the timed ones.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["traced_frames", "frame_steps", "step_summary"]


def traced_frames(
    dom: Any, cg: Any, inputs: Mapping[str, np.ndarray], frames: int, warmup: int = 10
) -> list[dict[str, int]]:
    """Run ``warmup`` then ``frames`` frames of ``cg`` (in a domain with a trace ring);
    returns the ring's events of the measured frames with each frame's bounds as the
    begin and end records of a host span (oldest first).  The bounds are the host's
    ``time.monotonic_ns()`` (CLOCK_MONOTONIC, the ring's clock) just before and after
    ``cg.run``, not a :func:`hostless.trace.span` around it, whose own Python work (about
    0.7 us a block on the 2-core VM beyond its two records) would land in ``submit`` and
    ``host_wake``."""
    from hostless import trace
    from hostless._abi import C
    from hostless.trace import USER_MAGIC
    from hostless.wire import TRACE_SPAN_BEGIN, TRACE_SPAN_END

    for _ in range(warmup):
        cg.run(inputs)
    mono, run = time.monotonic_ns, cg.run
    bounds = np.empty((frames, 2), dtype=np.int64)
    t_from = mono()
    for i in range(frames):
        t0 = mono()
        run(inputs)
        bounds[i] = (t0, mono())
    evs = [e for e in trace.events(dom) if e["ts"] >= t_from]
    user, begin, end = int(C.EV_USER), USER_MAGIC | TRACE_SPAN_BEGIN, USER_MAGIC | TRACE_SPAN_END
    for i, (t0, t1) in enumerate(bounds.tolist(), 1):
        evs.append({"type": user, "a": begin, "b": i, "ts": t0})
        evs.append({"type": user, "a": end, "b": i, "ts": t1})
    return sorted(evs, key=lambda e: e["ts"])


def _is_span(e: Mapping[str, int], sub: int) -> bool:
    from hostless._abi import C
    from hostless.trace import USER_MAGIC

    return bool(e["type"] == int(C.EV_USER) and e["a"] & ~0xFF == USER_MAGIC and e["a"] & 0xFF == sub)


def frame_steps(evs: Sequence[Mapping[str, int]], stages: Sequence[str]) -> list[dict[str, float]]:
    """Cut each host ``frame`` span of ``evs`` into the steps of its packets (see the module
    doc), in ns; ``stages`` names the chain's stages in order.  A frame whose packets cannot
    all be found (a wrapped ring, a failed packet, a graph that is not a chain) is skipped."""
    from hostless._abi import C

    ev_enq, ev_start, ev_end, ev_sig = int(C.EV_ENQUEUE), int(C.EV_START), int(C.EV_END), int(C.EV_SIGNAL)
    from hostless.wire import TRACE_SPAN_BEGIN as begin_sub
    from hostless.wire import TRACE_SPAN_END as end_sub

    spans: list[tuple[int, int]] = []
    open_at: dict[int, int] = {}
    for e in evs:
        if _is_span(e, begin_sub):
            open_at[e["b"]] = e["ts"]
        elif _is_span(e, end_sub) and e["b"] in open_at:
            spans.append((open_at.pop(e["b"]), e["ts"]))
    enq = sorted((e["ts"], e["a"], e["b"]) for e in evs if e["type"] == ev_enq)
    enq_ts = [t for t, _, _ in enq]
    start = {(e["a"], e["b"]): e["ts"] for e in evs if e["type"] == ev_start}
    end = {(e["a"], e["b"]): (e["ts"], e["c"]) for e in evs if e["type"] == ev_end}
    sigs: dict[int, list[int]] = {}
    for e in evs:
        if e["type"] == ev_sig:
            sigs.setdefault(e["a"], []).append(e["ts"])
    for v in sigs.values():
        v.sort()
    n = len(stages)
    out: list[dict[str, float]] = []
    for b, f_end in spans:
        lo, hi = bisect.bisect_left(enq_ts, b), bisect.bisect_right(enq_ts, f_end)
        # the packets of this frame, in order of enqueue: the stages' packets are those that
        # ran and signaled a timeline (copy packets of copy mode signal nothing of their own)
        pk = [(t, q, i) for t, q, i in enq[lo:hi] if (q, i) in start and (q, i) in end]
        chain: list[tuple[int, int, int, int]] = []  # enqueue, start, end, signal
        for t, q, i in pk:
            te, h = end[(q, i)]
            ts_list = sigs.get(h, [])
            j = bisect.bisect_left(ts_list, te)
            if not h or j >= len(ts_list):
                continue
            chain.append((t, start[(q, i)], te, ts_list[j]))
        # A signal's event is stamped after its futex wake: a signaler that lost its CPU to the
        # process it woke stamps it late.  It is counted up to the next step at most.
        for k in range(len(chain)):
            nxt = chain[k + 1][0] if k + 1 < len(chain) else f_end
            t, s, te, sg = chain[k]
            chain[k] = (t, s, te, max(te, min(sg, nxt)))
        if len(chain) != n:
            continue
        row: dict[str, float] = {"frame": float(f_end - b), "submit": float(chain[0][0] - b)}
        for k, (t, s, te, sg) in enumerate(chain):
            nm = stages[k]
            row[f"{nm}.wake"] = float(s - t)
            row[f"{nm}.run"] = float(te - s)
            row[f"{nm}.signal"] = float(sg - te)
            if k + 1 < n:
                row[f"{nm}.next"] = float(chain[k + 1][0] - sg)
        row["host_wake"] = float(f_end - chain[-1][3])
        out.append(row)
    return out


def step_summary(rows: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """Median, p10 and p90 of every step over the frames (keys in travel order), the frame's
    own, the sums of the ``run`` steps (kernels and input waits) and of all the others
    (the hand-offs), and the number of frames."""
    if not rows:
        return {"frames": 0, "steps": {}}
    keys = list(rows[0])
    steps: dict[str, dict[str, float]] = {}
    for k in keys:
        a = np.asarray([r[k] for r in rows], dtype=np.float64)
        p10, p50, p90 = (float(x) for x in np.percentile(a, [10, 50, 90]))
        steps[k] = {"p50": p50, "p10": p10, "p90": p90}
    runs = np.asarray([sum(v for k, v in r.items() if k.endswith(".run")) for r in rows])
    hand = np.asarray([r["frame"] - sum(v for k, v in r.items() if k.endswith(".run")) for r in rows])
    return {
        "frames": len(rows),
        "steps": steps,
        "kernels_p50": float(np.median(runs)),
        "handoffs_p50": float(np.median(hand)),
    }
