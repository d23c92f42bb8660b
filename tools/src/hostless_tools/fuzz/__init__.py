"""Hostile-memory fuzzer: an innocent process that has a domain mapped gets errors, never a crash,
a hang or a write outside the mapping, whatever another participant writes into the shared memory.

``hostless fuzz NAME --cases N --seed S -o DIR`` (and :func:`run`) runs N *cases*.  Each case:

1. starts the *innocents*, fresh interpreters (``python -m hostless_tools.fuzz innocent ...``): the
   ``creator`` creates a fresh domain ``NAME-<pid>-<case>`` (heap, trace ring, a small fence table)
   with shared objects (fences, a merge of two of them, a timeline, a small and a large heap
   buffer, a command queue it consumes) and ``joiner`` processes open it and import them.  They all
   attach BEFORE the corruption and then keep doing ordinary work: fence / merge / timeline /
   buffer / queue life cycles, waits with timeouts on the shared objects, imports of the shared
   handles, queue pushes and pops, ``Domain.check()``, ``hostless info``'s ``domain_info()``,
   ``heap_stats()``, trace export, ``reap()``, and at the end releases and ``close()``;
2. corrupts the live domain with one ``pwrite()`` into its file (repeated once half-way through
   the window): a boundary value (0, 1, -1, 2^31, 2^32, 2^63, a size just past the region, an
   offset that overflows when added, ...), a random value or a structured one (a slot control
   word with another kind / state / participant, a link or handle to an index past the table,
   a queue cell of another lap, a dtype string such as ``'|V2147483647'``) into one field of one
   region: the header, a participant entry, a fence slot (of each kind, or a free one), the heap
   header or its bitmap, a buffer's metadata, the queue header, its cells or packets, the trace
   ring's header or its events.  In toggle cases (30 %) it alternates the hostile and the original
   bytes for half the window (a reader that validates a field and then reads it again sees both).
   In some cases it also runs ``hostless info`` / ``hostless check`` subprocesses that attach AFTER
   the corruption (they are innocents too), and in some a third participant (``victim``) is
   SIGKILLed right after the write, so that the innocents' watchdogs run recovery over the
   corrupted tables (the victim itself is not classified), and in some a ``late`` innocent joins
   right after the write and does the same work (refusing to join with an accepted error is clean);
3. tells the innocents to stop and waits for them.

A separate case class, ``--truncate N``, truncates the file under the innocents instead (to 0, to
the header, into a table, ...; sometimes extended back to its size, i.e. zeroed), which a process
survives only if it handles SIGBUS; its counts are reported apart.

**Outcome of a case** (the worst of its innocents):

* ``crash``: an innocent died by a signal (SIGSEGV, SIGBUS, SIGFPE, SIGABRT...), a sanitizer
  reported an error (``make sanitize``), or an operation raised an exception of a type that is not
  accepted (the innocent prints the traceback and exits with status 3), or a CLI probe ended with
  such a traceback;
* ``hang``: an innocent was still running ``deadline`` seconds (10 by default) after it was asked
  to stop (every operation it does has a timeout, so nothing may block that long); it is sent
  SIGUSR1 (``faulthandler`` dumps every thread's Python stack to its stderr), then SIGKILL;
* ``clean``: only accepted errors, or no visible effect at all;
* ``error``: the harness could not set the case up (the domain was never created): not a finding
  about the core, but the run is not valid either.

**Accepted exceptions**, and why: :class:`~hostless.errors.HostlessError` and its subclasses (the
library's documented answer to a corrupt domain, a stale or forged handle, a full table or heap),
:class:`TimeoutError` (a wait on an object whose word was overwritten may never complete; every wait
of an innocent has a timeout; :class:`~hostless.errors.QueueFull` is one) and :class:`ValueError`
(the documented error for bad values: :class:`~hostless.errors.InvalidHandle` is one; ``Status(w)``
of an overwritten status word, NumPy refusing a view of a table whose offset was overwritten).
Every other type (TypeError, IndexError, KeyError, OverflowError, a plain MemoryError, OSError,
SystemError, RuntimeError, struct.error, BufferError, ...) shows a code path that trusts shared
memory, and is a crash.

Every field offset comes from the ABI: the ``hostless._core`` constants (``H_*``, ``P_*``, ``F_*``,
``PK_*``, ``BM_*``) where the extension exports them, otherwise from the ``struct`` definitions of
the ``hostless.h`` installed with the extension (``abi_layout()`` parses them and checks them
against every exported constant and size, so the two cannot drift apart silently).

Reproduction: the region, field, target and value of case K are a function of ``(seed, K)`` only
(the region is ``REGIONS[K % len(REGIONS)]``), so ``hostless fuzz NAME --seed S --case K`` (``--case
tK`` for a truncation case) repeats the same corruption (the interleaving with the innocents' work
differs from run to run).

**Modules** (one idea each): :mod:`~hostless_tools.fuzz.policy` (regions, outcomes, accepted
exceptions), :mod:`~hostless_tools.fuzz.layout` (the header's structs, checked against the core),
:mod:`~hostless_tools.fuzz.innocent` (the innocent process), :mod:`~hostless_tools.fuzz.plan` (which field of
which instance), :mod:`~hostless_tools.fuzz.values` (which value), :mod:`~hostless_tools.fuzz.config` (run
configuration, ``--set``, reproduction lines), :mod:`~hostless_tools.fuzz.procs` (child processes),
:mod:`~hostless_tools.fuzz.classify` (an innocent's outcome), :mod:`~hostless_tools.fuzz.case` (one case),
:mod:`~hostless_tools.fuzz.driver` (:func:`run`), :mod:`~hostless_tools.fuzz.report`.
"""

from __future__ import annotations

from .config import Config, Forced, parse_set
from .driver import run
from .layout import Field, Struct, _fuzzable, abi_layout, header_path, header_text
from .policy import ACCEPTED, EXIT_UNEXPECTED, OUTCOMES, REGIONS
from .report import findings_markdown, report_markdown, summary_lines, write_results

__all__ = [
    "REGIONS",
    "OUTCOMES",
    "ACCEPTED",
    "EXIT_UNEXPECTED",
    "Field",
    "Struct",
    "Config",
    "Forced",
    "abi_layout",
    "header_path",
    "header_text",
    "parse_set",
    "run",
    "summary_lines",
    "report_markdown",
    "write_results",
    "findings_markdown",
    "_fuzzable",
]
