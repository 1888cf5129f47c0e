"""docs/api.md is what scripts/apiref.py writes from the docstrings of pixfeed.__all__: CI fails while they differ."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pixfeed

ROOT = Path(__file__).resolve().parent.parent


def _apiref():
    spec = importlib.util.spec_from_file_location("apiref", ROOT / "scripts" / "apiref.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_api_md_is_up_to_date_with_the_docstrings():
    expected = _apiref().render()
    assert (ROOT / "docs" / "api.md").read_text(encoding="utf-8") == expected, \
        "docs/api.md differs from the docstrings of pixfeed.__all__: run python scripts/apiref.py"


def test_every_public_name_has_its_section():
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    missing = [n for n in pixfeed.__all__ if not n.startswith("_") and f"\n## pixfeed.{n}\n" not in text]
    assert missing == []


def test_check_mode_notices_a_stale_page(tmp_path, monkeypatch, capsys):
    apiref = _apiref()
    monkeypatch.setattr(apiref, "OUT", tmp_path / "api.md")
    (tmp_path / "api.md").write_text(apiref.render().replace("## pixfeed.pack\n", "## pixfeed.pack\n\nedited\n"))
    assert apiref.main(["--check"]) == 1 and "run python scripts/apiref.py" in capsys.readouterr().err
    assert apiref.main([]) == 0 and apiref.main(["--check"]) == 0
