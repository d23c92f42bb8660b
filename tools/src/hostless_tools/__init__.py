"""hostless-tools: the benchmarks (:mod:`hostless_tools.bench`), the protocol stress tool
(:mod:`hostless_tools.chaos`) and the hostile-memory fuzzer (:mod:`hostless_tools.fuzz`) of
hostless, outside the library's package.  Their commands, ``hostless bench|chaos|fuzz``, join
the ``hostless`` CLI through entry points (:mod:`hostless_tools.cli`)."""
