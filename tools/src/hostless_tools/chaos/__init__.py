"""Protocol stress harness: processes hammer one domain, and any anomaly is a protocol bug.

``hostless chaos`` (and :func:`run`) starts worker processes on one small
domain (a few hundred fence slots, so that slots are reused all the time),
optionally SIGKILLs random workers at random times and starts replacements,
then stops the rest and checks the domain.

**What an anomaly is, and why every anomaly is a protocol bug.**  Each worker
only uses objects that are *private* to it: fences, merged fences (and merges
of merges), timelines and heap buffers that it created and whose handles it
never gives away.  Nobody else may signal, fail, advance, free or write them.
So the worker knows exactly what every one of its objects must read at every
moment, and keeps that knowledge in a model (:class:`ChaosWorker`).  An
anomaly is any observation that differs from the model:

* ``fresh_not_active``: a new fence or merge (of ACTIVE children) is not
  ACTIVE, a new timeline is not at its initial value;
* ``unexpected_completion``: a fence it has not signaled reads signaled (or a
  wait on it returns), a timeline moved or failed without it;
* ``already_signaled``: AlreadySignaled from its first signal of its own fence
  (or from a timeline it never failed);
* ``wrong_status``: a signaled fence reads another status than the one given;
* ``merge_early``: a merged fence completed while a child was still ACTIVE;
* ``merge_status``: a merged fence completed with a status other than the
  documented one: SUCCESS when every child succeeded, else the first failure
  propagated (see :meth:`ChaosWorker._child_done` for the exact rule);
* ``timeline_value``: a timeline value or failure it did not set;
* ``hung``: a wait on an object it had already completed timed out (2 s);
* ``wait_status``: such a wait returned another status than the object's;
* ``invalid_handle``: InvalidHandle on an object it holds;
* ``refused`` / ``not_refused``: an operation the API documents as valid was
  refused, or one it documents as an error (second signal, signal of a merge,
  a third live merge of one fence, a timeline value that does not grow) was
  accepted;
* ``buffer_corrupt``: a heap buffer's contents changed behind its back;
* ``unexpected_exception``: any other exception from the library;
* from the driver: ``worker_crash`` (a worker died on its own), ``worker_stuck``
  (a worker did not stop when asked), ``shared_status`` (see below).

Since no other participant may legally touch these objects, a correct
protocol produces *no* anomaly at all, whatever the interleaving, however
loaded the machine and whoever is killed: there is no "flaky" anomaly.

**The mix** (:meth:`ChaosWorker.step`): create fences and timelines (new
objects are checked at once), merge 1-4 of its fences or merges (trees up to
4 levels; a fence in at most two live merges), signal fences with random
statuses (SUCCESS, ERROR, CANCEL, OWNER_DIED, custom), complete a merge (signal
every ACTIVE leaf under it, then wait on it: it must return at once), advance
and fail timelines, wait (2 s on what it completed, which must return at once;
0-0.5 ms on what is ACTIVE, which must time out), release in random order (an
ACTIVE fence's release is a CANCEL its merges see), probe refused operations,
buffers with a per-buffer pattern, and *churn*: the reported pattern (fences,
a merge of them, signal all, wait, release the merge then the fences, then a
new timeline in a just-freed slot), where freed slots are reused at once by
the other workers while late propagations may still aim at them.  Every
object is checked after each operation that may change it, before its
release, and all of them every 16 operations.  Mode ``"repro"`` runs only the
reported loop.

**Shared objects.**  Some workers also publish fences and timelines (in their
log) that the driver's threads import.  The owner signals a fence with the
status it published in advance, or never; a published timeline only advances;
the owner may also drop its own reference while the driver still holds one.
The driver either waits on the object or holds it a moment and drops it
(which may free it, maybe while its dead owner is being recovered).  When the
owner is SIGKILLed or leaves, every wait must return (OWNER_DIED, OWNER_LEFT, or the
fence's published status): a wait still pending ``hung_after`` seconds after
its owner died is a *hung waiter*.

**After the run** (every worker stopped or killed and reaped): ``dom.check()``
must be empty and, once the driver released what it holds, every slot of the
fence table must be FREE with no reference bit and the heap empty (a *leak*
otherwise).

Workers are separate interpreters started with ``sys.executable -m
hostless_tools.chaos worker ...`` (``__main__.py``; never forked from a process that
has a domain open).  A worker appends JSON lines to its log file with one ``write()`` each
(``ready``, every ``anomaly`` at once, cumulative ``stats`` every 0.2 s,
``pub`` for shared objects, ``done``), so that what it found survives a
SIGKILL.

**Modules** (one idea each): :mod:`~hostless_tools.chaos.record` (statuses, anomaly
kinds, the :class:`Recorder`), :mod:`~hostless_tools.chaos.model` (what a worker
knows of each object, :class:`WorkerConfig`), :mod:`~hostless_tools.chaos.checks`
(readings against the model, the merge rule), :mod:`~hostless_tools.chaos.operations`
(create, signal, fail, wait, release), :mod:`~hostless_tools.chaos.worker` (the mix,
probes, buffers, published objects, the worker process),
:mod:`~hostless_tools.chaos.waiters` (the driver's waiter threads),
:mod:`~hostless_tools.chaos.driver` (:func:`run`), :mod:`~hostless_tools.chaos.report`.
"""

from __future__ import annotations

from .driver import leaked_slots, run
from .model import WorkerConfig
from .record import ANOMALY_KINDS, CANCEL, ERROR, HUNG_TIMEOUT, OWNER_DIED, SUCCESS, Recorder
from .report import report_markdown, summary_lines, write_results
from .waiters import _Waiters
from .worker import ChaosWorker, worker_main

__all__ = [
    "ANOMALY_KINDS",
    "WorkerConfig",
    "Recorder",
    "ChaosWorker",
    "worker_main",
    "run",
    "report_markdown",
    "summary_lines",
    "write_results",
    "leaked_slots",
    "HUNG_TIMEOUT",
    "SUCCESS",
    "ERROR",
    "CANCEL",
    "OWNER_DIED",
    "_Waiters",
]
