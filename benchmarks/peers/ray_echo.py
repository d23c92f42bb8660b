"""The Ray Compiled Graphs peer of ``hostless bench pipeline``: a two-actor echo.

    python benchmarks/peers/ray_echo.py N WARMUP

Run by ``hostless bench pipeline`` in a child interpreter when ``ray`` is
importable (an optional peer, not installed by the project).  Prints one JSON
line: ``{"version": ray.__version__, "samples_ns": [...]}``, N round trips of
a 4 KiB float32 array through ``a.echo -> b.echo`` compiled with
``experimental_compile()``, after WARMUP dropped ones.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def measure(n: int, warm: int) -> dict[str, Any]:
    """``n`` timed round trips through the compiled two-actor echo, after ``warm`` dropped ones."""
    import numpy as np
    import ray
    from ray.dag import InputNode

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")

    @ray.remote
    class Echo:
        def echo(self, x: Any) -> Any:
            return x

    a, b = Echo.remote(), Echo.remote()  # type: ignore[attr-defined]
    with InputNode() as inp:
        dag = b.echo.bind(a.echo.bind(inp))
    cdag = dag.experimental_compile()
    x = np.zeros(1024, np.float32)
    out = []
    for i in range(n + warm):
        t0 = time.perf_counter_ns()
        ray.get(cdag.execute(x))
        if i >= warm:
            out.append(time.perf_counter_ns() - t0)
    cdag.teardown()
    ray.shutdown()
    return {"version": ray.__version__, "samples_ns": out}


def main(argv: list[str]) -> int:
    """``ray_echo.py N WARMUP``: measure, print the result as one JSON line."""
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(measure(int(argv[0]), int(argv[1]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
