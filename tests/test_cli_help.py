"""The command line describes itself: every argument has help, --version, and byte sizes take units."""
import argparse
import json

import pytest

import pixfeed
from pixfeed.cli import build_parser, main
from conftest import make_tree


def _arguments(parser: argparse.ArgumentParser, command: str = "pixfeed"):
    """(command, argument, help) for every argument of every subcommand, and every subcommand's summary."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                yield command, choice.dest, choice.help
            for name, sub in action.choices.items():
                yield from _arguments(sub, f"{command} {name}")
        else:
            yield command, "/".join(action.option_strings) or action.dest, action.help


def test_every_argument_and_command_has_help_text():
    rows = list(_arguments(build_parser()))
    assert len({command for command, _, _ in rows}) >= 9  # pixfeed and its subcommands were all walked
    missing = [f"{command} {name}" for command, name, text in rows
               if not text or text == argparse.SUPPRESS or not text.strip()]
    assert missing == []


def test_pack_help_gives_every_default_and_examples(capsys):
    pack = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["pack"]
    silent = [a.option_strings[0] for a in pack._actions if a.option_strings and a.default not in (None, False, [])
              and a.default != argparse.SUPPRESS and "default" not in (a.help or "")]
    assert silent == []
    resize = next(a for a in pack._actions if "--resize" in a.option_strings)
    assert "default crop" in resize.help  # a default pack fills in, though argparse's is None
    with pytest.raises(SystemExit):
        main(["pack", "--help"])
    out = capsys.readouterr().out
    assert "(default)" in out and "examples:\n  pixfeed pack images ds " in out  # the epilog keeps its lines


def test_pack_summary_names_every_kind_of_source(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    words = " ".join(capsys.readouterr().out.split())
    summary = words[words.index(" pack ") + 6:words.index(" info ")]
    assert all(kind in summary for kind in ("image folder", "index file", "shards", "pixfeed dataset", "bucket"))


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out.strip() == f"pixfeed {pixfeed.__version__}"


@pytest.mark.parametrize("text, expected", [("16MiB", 16 << 20), ("1.5KB", 1500), ("20000", 20000), ("2 MiB", 2 << 20)])
def test_shard_bytes_takes_the_units_cache_limit_takes(text, expected):
    args = build_parser().parse_args(["pack", "--format", "wds", "--shard-bytes", text, "SRC", "DST"])
    assert args.shard_bytes == expected


def test_shard_bytes_with_a_unit_bounds_the_shards(tmp_path):
    src = make_tree(tmp_path / "src", per_class=6)  # 18 images of a few KB each
    dst = tmp_path / "ds"
    assert main(["pack", "--format", "wds", "--shard-bytes", "20KiB", "--workers", "1", "-q", str(src), str(dst)]) == 0
    shards = json.loads((dst / "pixfeed.json").read_text())["shards"]
    assert len(shards) > 1
    assert all(s["bytes"] <= 20 << 10 for s in shards if s["count"] > 1)  # a lone sample may exceed the bound


def test_shard_bytes_refuses_a_unit_it_does_not_know(capsys):
    with pytest.raises(SystemExit) as exit:
        build_parser().parse_args(["pack", "--format", "wds", "--shard-bytes", "16XB", "SRC", "DST"])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert "--shard-bytes" in err and "'16XB'" in err and "16MiB" in err
