"""The README and docs/ hold together: short README, every link and anchor resolves, every page is
linked, no folder a clone lacks, errors named by import path, layouts documented once.

The code blocks themselves run as their own tests (pytest-codeblocks; see conftest.py and docs/README.md).
"""
import importlib
import re
from pathlib import Path

import pytest

import pixfeed.errors
from pixfeed import registry

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(`{3,})(\S*)", re.M)


def _prose(page: Path) -> str:
    """The page without its fenced blocks."""
    return re.sub(r"^\s*(`{3,}).*?^\s*\1\s*$", "", page.read_text(), flags=re.M | re.S)


def _anchors(page: Path) -> set:
    """GitHub's anchors for the page's headings: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for heading in re.findall(r"^#+\s+(.*)$", _prose(page), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def _links(page: Path):
    for target in LINK.findall(_prose(page)):
        if not re.match(r"[a-z]+://|mailto:", target):
            yield target


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 260


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_and_anchor_resolves(page):
    broken = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(target)
    assert broken == []


def test_every_docs_page_is_linked_from_the_readme_or_the_docs_index():
    linked = {(p.parent / t.partition("#")[0]).resolve()
              for p in (ROOT / "README.md", DOCS / "README.md") for t in _links(p)}
    assert [p.name for p in DOCS.glob("*.md") if p.name != "README.md" and p.resolve() not in linked] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_folder_a_clone_lacks_and_no_history_wording(page):
    text = page.read_text()
    assert "../shared" not in text and "/work/" not in text
    assert re.findall(r"this round|the issue|the kit\b|previous round|before this round", text, re.I) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_error_classes_are_named_by_their_import_path(page):
    names = [n for n, v in vars(pixfeed.errors).items() if isinstance(v, type) and issubclass(v, Exception)
             and v.__module__ == "pixfeed.errors"]
    bare = re.findall(r"(?<![\w.])(%s)\b" % "|".join(names), _prose(page))  # code blocks run: their imports are checked
    assert bare == [], "write pixfeed.errors.NAME"


@pytest.mark.parametrize("page", sorted(set(DOCS.glob("*.md")) - {DOCS / "README.md"}), ids=lambda p: p.name)
def test_a_page_starts_with_a_title_and_an_example(page):
    text = page.read_text()
    assert text.startswith("# ")
    first_section = text.find("\n## ")
    first_block = FENCE.search(text)
    assert first_block is not None and (first_section < 0 or first_block.start() < first_section)


def test_benchmarks_page_names_every_script():
    text = (DOCS / "benchmarks.md").read_text()
    scripts = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py"))
    assert scripts and [s for s in scripts if f"benchmarks/{s}" not in text] == []


@pytest.mark.parametrize("name", list(registry.FORMATS))
def test_layout_modules_point_to_their_section_of_formats_md(name):
    layout = importlib.import_module(registry.FORMATS[name].layout)
    assert f"docs/formats.md#{name}" in layout.__doc__
    assert name in _anchors(DOCS / "formats.md")


def test_code_blocks_are_collected_from_every_page(pytestconfig):
    """The doc blocks run only when pytest-codeblocks is enabled (pyproject's addopts) and the pages are
    in testpaths: a page whose blocks silently stopped running would be drift again."""
    assert pytestconfig.getoption("codeblocks")
    paths = pytestconfig.getini("testpaths")
    assert "README.md" in paths and "docs" in paths


def test_readme_starts_with_a_light_install_for_the_benchmark_then_the_tests():
    """The first command installs what `pixfeed bench` needs, not the 2 GB test extra; the second adds the test
    extra and runs the suite; .ci/run installs every extra the two lines do."""
    first = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1).splitlines()
    assert len(first) == 2 and first[0].endswith("pixfeed bench") and "test" not in first[0]
    assert "'.[test]'" in first[1] and first[1].endswith("python -m pytest -q")
    extras = {e for line in first for spec in re.findall(r"'\.\[([\w,-]+)\]'", line) for e in spec.split(",")}
    ci = set(re.search(r"-e '\.\[([\w,-]+)\]'", (ROOT / ".ci" / "run").read_text()).group(1).split(","))
    assert extras == {"fast", "plot", "test"} and extras <= ci
