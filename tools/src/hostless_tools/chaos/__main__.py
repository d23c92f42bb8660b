"""``python -m hostless_tools.chaos worker DOMAIN LOG --config JSON``: one chaos worker process (the driver,
:func:`hostless_tools.chaos.run`, starts them; run ``hostless chaos``)."""

from __future__ import annotations

import sys

from .._tooling import subcommand_main
from .worker import USAGE, worker_main

if __name__ == "__main__":
    sys.exit(subcommand_main(sys.argv[1:], "worker", worker_main, USAGE))
