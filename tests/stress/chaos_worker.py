"""Worker of test_chaos.py: a participant doing random operations until it is killed.

argv: domain name, handles file, seed, graceful (1: leave with close() after a
while instead of waiting to be killed).

It joins the domain, prints "ready <participant id>", then loops over random
create / import / signal / wait / release / merge / timeline operations on its
own objects and on the handles published (one "<kind> <handle>" line each) in
the shared handles file, to which it appends the handles it creates.  Only the
errors the API documents for these races are tolerated; anything else is
printed and the worker exits with status 3 (InvalidHandle, in particular, is
only accepted from an import: an object this worker holds must never go stale).
"""

from __future__ import annotations

import os
import random
import sys
import traceback

import hostless as hl

EXPECTED = (
    hl.AlreadySignaled,  # someone else signaled it first / failed timeline
    hl.InvalidOperation,  # merged fence signaled, or a fence already in two merges
    hl.DomainFull,
    TimeoutError,
)
STATUSES = [2, 2, 2, 3, 4, 64, 1000]


def main() -> int:
    name, path, seed, graceful = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
    rnd = random.Random(seed)
    d = hl.Domain.open(name, label=f"w{seed}", watchdog_interval=0.02 if rnd.random() < 0.5 else 0)
    out = os.open(path, os.O_WRONLY | os.O_APPEND)
    src = open(path)
    tail = ""
    pub: list[tuple[str, int]] = []
    held: list[hl.Fence | hl.Timeline] = []
    print("ready", d.participant_id, flush=True)
    limit = rnd.randrange(200, 3000) if graceful else -1

    def publish(kind: str, h: int) -> None:
        os.write(out, f"{kind} {h}\n".encode())

    ops = 0
    while ops != limit:
        ops += 1
        if ops % 16 == 1:
            tail += src.read()
            *lines, tail = tail.split("\n")
            for line in lines:
                # a read racing an O_APPEND write may see the grown file before its bytes
                # (NULs): such a line is garbled for this reader; skip it
                parts = line.split()
                if len(parts) == 2 and parts[0] in ("F", "T", "M") and parts[1].isdigit():
                    pub.append((parts[0], int(parts[1])))
            del pub[:-300]
        r = rnd.random()
        try:
            if r < 0.14:
                f = d.fence()
                held.append(f)
                publish("F", f.handle)
            elif r < 0.18:
                t = d.timeline(rnd.randrange(3))
                held.append(t)
                publish("T", t.handle)
            elif r < 0.34 and pub:
                k, h = rnd.choice(pub)
                try:
                    held.append(d.import_timeline(h) if k == "T" else d.import_fence(h))
                except hl.InvalidHandle:
                    pass  # released by everyone meanwhile; objects we hold never go stale
            elif r < 0.48 and held:
                o = rnd.choice(held)
                if isinstance(o, hl.Timeline):
                    if rnd.random() < 0.05:
                        o.fail(rnd.choice([3, 4, 99]))
                    else:
                        v = o.value + rnd.randrange(1, 3)
                        try:
                            o.signal(v)
                        except ValueError:
                            if o.failure is None and o.value < v:  # only a concurrent advance may refuse it
                                raise
                else:
                    o.signal(rnd.choice(STATUSES))
            elif r < 0.58 and held:
                o = rnd.choice(held)
                tmo = rnd.choice([0, 0, 0.001, 0.003])
                if isinstance(o, hl.Timeline):
                    o.wait(o.value + rnd.randrange(0, 2), tmo)
                else:
                    o.wait(tmo)
            elif r < 0.68:
                fs = [o for o in held if isinstance(o, hl.Fence)]
                if fs:
                    kids = rnd.sample(fs, min(len(fs), rnd.randrange(1, 5)))
                    kids = list({f.handle: f for f in kids}.values())
                    m = d.merge(kids)
                    held.append(m)
                    publish("M", m.handle)
            elif r < 0.70:
                d.reap()
            elif held:
                held.pop(rnd.randrange(len(held))).release()
            while len(held) > 24:
                held.pop(rnd.randrange(len(held))).release()
        except EXPECTED:
            pass
    for o in held:
        o.release()
    d.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(3)
