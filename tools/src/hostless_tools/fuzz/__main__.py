"""``python -m hostless_tools.fuzz innocent ROLE NAME --dir DIR --seed S``: one innocent process (the
fuzzer, :func:`hostless_tools.fuzz.run`, starts them; run ``hostless fuzz``)."""

from __future__ import annotations

import sys

from .._tooling import subcommand_main
from .innocent import USAGE, _innocent_main

if __name__ == "__main__":
    sys.exit(subcommand_main(sys.argv[1:], "innocent", _innocent_main, USAGE))
