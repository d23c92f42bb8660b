"""Hostile-memory fuzzer (hostless_tools.fuzz): innocent processes that attached before a field of the
live domain was overwritten get errors, never a crash or a hang.

* a small seeded run (two cases per region) must have no crash and no hang;
* the fuzzer can fail: an innocent that kills itself with SIGSEGV is a ``crash``, one that raises
  an exception of a type that is not accepted is a ``crash``, one that never stops is a ``hang``
  (dry runs: nothing is corrupted, so that only the hooked innocent can fail);
* a dry run (the same work on an intact domain) is clean: the harness itself raises nothing;
* a case is a function of (seed, case number): ``--case K`` repeats its field and value;
  ``--set REGION.FIELD@TARGET=VALUE`` writes exactly that;
* the field offsets parsed from hostless.h agree with the extension's constants;
* ``hostless fuzz`` writes its JSON and Markdown report.

The seeded run asserts 0 crashes and 0 hangs on purpose: while the core is being hardened it may
fail, and its message lists each finding with the command that reproduces it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from conftest import full_or, unique_name
from hostless import cli
from hostless._abi import C
from hostless_tools import fuzz


def _explain(r: dict[str, Any]) -> str:
    return "\n".join(fuzz.summary_lines(r))


def test_layout_matches_abi() -> None:
    L = fuzz.abi_layout()
    assert L["header"].size == int(C.HEADER_SIZE)
    assert L["fence"].fields["parents"].count == int(C.MAX_PARENTS)
    assert L["fence"].fields["err"].offset == L["fence"].fields["wake"].offset == int(C.F_ERR)
    assert L["packet"].fields["wait"].offset == int(C.PK_WAIT)
    assert L["queue"].size == 256 and L["queue"].fields["write_index"].offset == 64
    assert L["heap"].size == 128 and L["trace_event"].size == 64
    assert L["buffer_meta"].fields["shape"].count == int(C.BUFFER_MAX_DIMS)
    assert L["participant"].fields["label"].text and L["participant"].fields["label"].nbytes == 32
    # every region has fields to corrupt
    for role in ("header", "participant", "fence", "heap", "buffer_meta", "queue", "packet", "trace"):
        assert fuzz._fuzzable(L[role])


def test_small_run_no_crash_or_hang() -> None:
    n = full_or(1, 2) * len(fuzz.REGIONS)  # every region at least once (hostless fuzz: longer runs)
    r = fuzz.run(unique_name("hlfuzz"), cases=n, seed=20261201, window=0.25, cli=0.2)
    msg = _explain(r)
    assert sum(r["totals"].values()) == n
    assert set(r["counts"]) == set(fuzz.REGIONS)
    assert r["totals"]["error"] == 0, msg
    assert r["totals"]["crash"] == 0, msg
    assert r["totals"]["hang"] == 0, msg
    assert r["ok"], msg


def test_detects_crash_by_signal() -> None:
    r = fuzz.run(unique_name("hlfuzz"), cases=1, seed=1, window=0.1, cli=0, hook="segv", dry=True)
    assert not r["ok"]
    (case,) = r["cases"]
    assert case["outcome"] == "crash", _explain(r)
    bad = [i for i in case["innocents"] if i["outcome"] == "crash"]
    assert len(bad) == 1 and "SIGSEGV" in bad[0]["why"], bad
    assert bad[0]["stderr_tail"], "the crashed innocent's stderr is recorded"
    assert r["findings"][0]["repro"].endswith("--case 0")


def test_detects_unexpected_exception() -> None:
    r = fuzz.run(unique_name("hlfuzz"), cases=1, seed=1, window=0.1, cli=0, hook="raise", dry=True)
    (case,) = r["cases"]
    assert case["outcome"] == "crash", _explain(r)
    (bad,) = [i for i in case["innocents"] if i["outcome"] == "crash"]
    assert bad["rc"] == fuzz.EXIT_UNEXPECTED and "IndexError" in bad["why"], bad


def test_detects_hang() -> None:
    r = fuzz.run(
        unique_name("hlfuzz"), cases=1, seed=1, window=0.1, deadline=1.0, cli=0, hook="hang", dry=True
    )
    (case,) = r["cases"]
    assert case["outcome"] == "hang", _explain(r)
    (bad,) = [i for i in case["innocents"] if i["outcome"] == "hang"]
    # the SIGUSR1 faulthandler dump shows where it was
    assert any("in run_hook" in line for line in bad["stderr_tail"]), bad["stderr_tail"]


def test_dry_run_is_clean() -> None:
    r = fuzz.run(unique_name("hlfuzz"), cases=2, seed=5, window=0.2, cli=1.0, victims=1.0, dry=True)
    assert r["ok"], _explain(r)
    assert all(c["victim"] and c.get("cli") for c in r["cases"])


def test_case_is_reproducible_and_cli_writes_reports(tmp_path: Path) -> None:
    name = unique_name("hlfuzz")
    out = tmp_path / "res"
    rc = cli.main(["fuzz", name, "--seed", "7", "--case", "5", "--window", "0.1", "--cli-probes", "0",
                   "-o", str(out), "--quiet"])  # fmt: skip
    js = list(out.glob("fuzz-*.json"))
    md = list(out.glob("fuzz-*.md"))
    assert len(js) == 1 and len(md) == 1
    first = json.loads(js[0].read_text())
    assert rc == (0 if first["ok"] else 1)
    assert "## Outcomes" in md[0].read_text()
    (a,) = first["cases"]
    assert a["case"] == "5" and a["region"] == fuzz.REGIONS[5]
    r = fuzz.run(name, seed=7, case=5, window=0.1, cli=0)
    (b,) = r["cases"]
    for key in ("region", "field", "target", "offset", "size", "how"):
        assert a[key] == b[key], key
    if not a["how"].startswith("orig"):  # values derived from the live contents may differ
        assert a.get("value") == b.get("value") and a.get("bytes") == b.get("bytes")


def test_exact_write() -> None:
    f = fuzz.parse_set("fence.ctl@timeline=-1", toggle=True)
    assert (f.region, f.field, f.target, f.value, f.toggle) == ("fence", "ctl", "timeline", -1, True)
    r = fuzz.run(unique_name("hlfuzz"), case=3, force="participant.pid@creator=0x80000000", window=0.1, cli=0)
    (c,) = r["cases"]
    assert (c["region"], c["field"], c["value"], c["mode"]) == ("participant", "pid", 0x80000000, "write")
    assert c["target"].startswith("creator")
    assert "--set 'participant.pid@creator=0x80000000'" in c["repro"]


def test_truncation_case_is_reported_apart() -> None:
    r = fuzz.run(unique_name("hlfuzz"), cases=0, truncate=1, seed=3, window=0.1, cli=0)
    (case,) = r["cases"]
    assert case["case"] == "t0" and case["region"] == "truncate" and case["field"] == "file size"
    assert set(r["counts"]) == {"truncate"}
    assert case["outcome"] in fuzz.OUTCOMES
    assert "Truncation cases" in fuzz.report_markdown(r)


def test_a_cli_probe_reporting_unrecovered_participants_is_no_crash(tmp_path: Path) -> None:
    """``hostless check`` exits 3 when hostile memory makes a participant look dead and not
    recovered (a documented finding, like 1 for a corrupt table); any other status it does
    not document is a crash.  (A sanitizer run once failed a case on the 3.)"""
    import subprocess
    import types

    from hostless_tools.fuzz.classify import _classify
    from hostless_tools.fuzz.procs import _Proc

    def probe(rc: int) -> dict[str, Any]:
        out, err = tmp_path / f"{rc}.out", tmp_path / f"{rc}.err"
        out.write_text("x: not recovered yet\n")
        err.write_text("")
        popen = types.SimpleNamespace(returncode=rc, pid=1)
        return _classify(_Proc("cli", cast(subprocess.Popen, popen), out, err, cli=True), [])

    assert cli.EXIT_UNRECOVERED == 3
    for rc in (0, 1, 2, cli.EXIT_UNRECOVERED):
        assert probe(rc)["outcome"] == "clean", rc
    assert probe(4)["outcome"] == "crash"
    assert probe(-11)["outcome"] == "crash"
