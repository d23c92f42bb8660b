"""``hostless bench|chaos|fuzz`` come from hostless-tools (tools/), an entry-point plugin of the
CLI; without it they say how to get it.  The library's package holds no tools."""

from __future__ import annotations

import argparse
import importlib.util
from typing import Any

import pytest

from hostless import cli


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_the_library_ships_no_tools() -> None:
    for name in ("bench", "chaos", "fuzz", "_tooling"):
        assert importlib.util.find_spec(f"hostless.{name}") is None, name


def test_installed_tools_register_their_commands() -> None:
    pytest.importorskip("hostless_tools")
    found = cli._plugins()
    assert {"bench", "chaos", "fuzz"} <= set(found)
    assert all(found[n].value.startswith("hostless_tools.cli:") for n in ("bench", "chaos", "fuzz"))
    cmds = _commands(cli.build_parser())
    for name in ("bench", "chaos", "fuzz"):
        assert cmds[name].get_default("tool_missing") is None, name


def test_without_the_tools_the_commands_say_how_to_get_them(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_plugins", lambda: {})
    calls = (["bench", "fences", "--quick"], ["chaos", "--kills", "3"], ["fuzz", "x", "--cases", "2"])
    for argv in calls:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert f"hostless {argv[0]}:" in err and "hostless-tools" in err and "pip install ./tools" in err
    assert "(needs hostless-tools)" in cli.build_parser().format_help()
    with pytest.raises(SystemExit):  # the built-in commands still refuse what they do not know
        cli.main(["gc", "--bogus"])


def test_a_plugin_that_does_not_load_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class Broken:
        name, value = "fuzz", "hostless_tools.nowhere:add_fuzz"

        def load(self) -> Any:
            raise ImportError("No module named 'hostless_tools.nowhere'")

    monkeypatch.setattr(cli, "_plugins", lambda: {"fuzz": Broken()})
    assert cli.main(["fuzz", "x"]) == 2
    err = capsys.readouterr().err
    assert "did not load" in err and "hostless_tools.nowhere" in err and "pip install ./tools" in err


def test_a_plugin_adds_a_command(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    class Hello:
        name, value = "hello", "example:add"

        def load(self) -> Any:
            def add(sub: Any) -> None:
                p = sub.add_parser("hello", help="says hello")
                p.add_argument("who")
                p.set_defaults(func=lambda args: print(f"hello {args.who}") or 0)

            return add

    monkeypatch.setattr(cli, "_plugins", lambda: {"hello": Hello()})
    assert cli.main(["hello", "world"]) == 0
    assert capsys.readouterr().out == "hello world\n"
