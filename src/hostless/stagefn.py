"""Plain Python functions as Graph stages, and the errors they raise.

``g.stage("grad", cpu, my_function, ["x"], ("g", (64, 64), "f4"), scalars=[0.5])``
runs ``my_function`` in the cpu agent's process.  The contract:

- **How it is found.**  The agent imports the function by its qualified name:
  ``my_function.__module__`` and ``__qualname__``, with this process's
  ``sys.path`` (so a module next to your script, or an installed package, is
  found without setting ``PYTHONPATH``).  A function of the script you ran
  (``__main__``) is found by loading that script's file under another module
  name, as ``multiprocessing``'s spawn does: keep the script's own work under
  ``if __name__ == "__main__":``.  Lambdas, nested functions and functions
  defined in an interactive session cannot be imported: :func:`describe`
  refuses them with a TypeError when the stage is added.
- **How it is called.**  ``fn(*inputs, *scalars)``: one NumPy array per input
  of the stage (views of the domain's buffers, with the inputs' shapes and
  dtypes: do not keep them past the call), then the stage's scalars with
  their Python types (int, float, bool, str, None, and lists or dicts of
  those: anything JSON carries).  A function with a parameter named ``out``
  also gets the stage's output array as ``out=``.
- **What it returns.**  An array-like, written into the stage's output
  (its shape must be the output's; values are cast with NumPy's
  ``same_kind`` rule, so a float result into an integer output is an error,
  not a silent truncation), or None after writing ``out`` in place.
- **When it raises.**  The stage fails with ERROR and the exception's type,
  message and traceback travel to :class:`~hostless.graph.StageFailed`
  (see :func:`format_error`).

The agent loads each (function, scalars) pair once, when the graph is
compiled (:meth:`hostless.agents.Agent.load_function`), on its spawner's word
alone: the request travels through the spawner's private channel
(:mod:`hostless.agents.control`), never through the domain, so the module,
``sys.path`` entries and script file it names are the spawner's.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from ._abi import C

__all__ = ["describe", "Described", "load", "bind", "format_error", "MAX_ERROR_BYTES"]

MAX_ERROR_BYTES = int(C.RECORD_MAX)
"""Longest error record (type, message and traceback, UTF-8) kept for a failed stage
(``HLE_RECORD_MAX``: the engine writes every record)."""

_MAIN_ALIAS = "__hl_main__"


def describe(fn: Callable[..., Any], scalars: Sequence[Any] = ()) -> dict[str, Any]:
    """What an agent needs to import ``fn`` and call it with ``scalars``:
    a JSON-able dict.  TypeError, saying why, when ``fn`` cannot be imported by
    name in another process or a scalar cannot travel."""
    if not callable(fn):
        raise TypeError(f"a stage function must be callable, got {type(fn).__name__}")
    if isinstance(fn, Described):  # described where it was defined (a cluster's driver)
        return {**fn.desc, "scalars": _scalars(scalars)}
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise TypeError(f"{fn!r} has no module and qualified name: pass a module-level function")
    if "<lambda>" in qualname or "<locals>" in qualname:
        raise TypeError(
            f"stage function {qualname!r} is a lambda or a nested function: the agent imports stage "
            "functions by name, so define it at module level"
        )
    desc: dict[str, Any] = {"module": module, "qualname": qualname, "path": [p for p in sys.path if p]}
    if module == "__main__":
        main = sys.modules.get("__main__")
        file = getattr(main, "__file__", None)
        if not file:
            raise TypeError(
                f"stage function {qualname!r} is defined in an interactive session: the agent cannot "
                "import it; put it in a module (a .py file next to your script)"
            )
        desc["file"] = os.path.abspath(file)
    desc["scalars"] = _scalars(scalars)
    return desc


def _scalars(scalars: Sequence[Any]) -> list[Any]:
    """``scalars`` as JSON carries them; TypeError when they would not arrive unchanged."""
    try:
        out = json.loads(json.dumps(list(scalars), allow_nan=True))
    except (TypeError, ValueError) as e:
        raise TypeError(f"stage scalars must be JSON values (numbers, strings, lists, dicts): {e}") from None
    if out != list(scalars):  # e.g. a tuple inside: it would arrive as a list
        raise TypeError("stage scalars must survive JSON unchanged (use lists, not tuples)")
    return out  # type: ignore[no-any-return]


class Described:
    """A stage function :func:`describe`d in another process (a cluster's driver,
    :mod:`hostless.cluster`), standing for it in a graph built where it cannot be
    found by name (a Ray worker's ``__main__`` is not the driver's script).
    :func:`describe` returns its description with the stage's scalars; an agent
    loads it as it would the function itself.  It is not called here."""

    def __init__(self, desc: dict[str, Any]) -> None:
        module, qualname, path = desc.get("module"), desc.get("qualname"), desc.get("path", [])
        file = desc.get("file")
        if not isinstance(module, str) or not isinstance(qualname, str):
            raise TypeError("a described stage function needs a module and a qualname (strings)")
        if not isinstance(path, list) or not all(isinstance(p, str) for p in path):
            raise TypeError("a described stage function's path is a list of strings")
        if module == "__main__" and not isinstance(file, str):
            raise TypeError("a described stage function of __main__ needs its script's file")
        self.desc: dict[str, Any] = {"module": module, "qualname": qualname, "path": list(path)}
        if module == "__main__":
            self.desc["file"] = file
        self.__module__, self.__qualname__ = module, qualname

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{self.__qualname__} is described here, run by an agent: it is not called here")


def _main_module(file: str) -> ModuleType:
    mod = sys.modules.get(_MAIN_ALIAS)
    if mod is not None and getattr(mod, "__file__", None) == file:
        return mod
    spec = importlib.util.spec_from_file_location(_MAIN_ALIAS, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {file}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[_MAIN_ALIAS] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[_MAIN_ALIAS]
        raise
    return mod


def load(desc: dict[str, Any]) -> Callable[..., Any]:
    """Import the function :func:`describe` described (in the agent).  Raises
    what the import raises (ImportError, AttributeError, the module's own
    errors)."""
    for p in desc.get("path", []):
        if isinstance(p, str) and p not in sys.path:
            sys.path.append(p)
    module, qualname = str(desc["module"]), str(desc["qualname"])
    mod = _main_module(str(desc["file"])) if module == "__main__" else importlib.import_module(module)
    obj: Any = mod
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{module}:{qualname} is not callable")
    return obj  # type: ignore[no-any-return]


def bind(
    fn: Callable[..., Any], scalars: Sequence[Any], what: str
) -> Callable[[Sequence[np.ndarray], Any], None]:
    """The kernel an agent runs for a stage function: ``kernel(buffers, _words)``
    with the inputs first and the output last (the argument block's order)."""
    try:
        wants_out = "out" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature
        wants_out = False
    args = tuple(scalars)

    def kernel(buffers: Sequence[np.ndarray], _words: Any) -> None:
        *ins, out = buffers
        r = fn(*ins, *args, out=out) if wants_out else fn(*ins, *args)
        if r is None:
            if not wants_out:
                raise TypeError(f"{what} returned None and has no 'out' parameter: return the output array")
            return
        if r is out:
            return
        a = np.asarray(r)
        if a.shape != out.shape:
            raise ValueError(f"{what} returned shape {a.shape}, the stage's output has shape {out.shape}")
        np.copyto(out, a, casting="same_kind")

    return kernel


def format_error(e: BaseException, limit: int = MAX_ERROR_BYTES) -> str:
    """``"Type: message"`` and the traceback, cut to ``limit`` UTF-8 bytes
    (the end of the traceback, where the error is, is kept)."""
    head = f"{type(e).__name__}: {e}"
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    text = f"{head}\n{tb}"
    raw = text.encode("utf-8", errors="replace")
    if len(raw) <= limit:
        return text
    keep_head = head.encode("utf-8", errors="replace")[: limit // 4]
    tail = raw[-(limit - len(keep_head) - 8) :]
    return (keep_head + b"\n...\n" + tail).decode("utf-8", errors="replace")
