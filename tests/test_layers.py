"""Every import in the package points down the layers: base -> image -> contract -> formats -> loaders -> tools,
no tool imports another (what two tools share moves down), and no module imports
another's private names (``_read``; a private module such as ``packers/_tar.py``
belongs to its package).

``LAYERS`` is the one table of layers; only this test reads it, so it lives
here rather than in a package module that nothing would import.  A key is a
file (``"errors.py"``) or a folder (``"loaders/"``) relative to ``pixfeed/``;
the most specific key wins, and a module that no key covers fails the test.

Only ``import`` statements count (anywhere in a module, inside functions too).
The import strings of the lazy export tables (``pixfeed``, ``pixfeed.loaders``,
``pixfeed.bench``), ``registry.FORMATS`` and ``cli.COMMANDS`` are looked up by
name at run time: that is how a lower layer lists what sits above it without
importing it.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, Optional, Tuple

import pixfeed

BASE, IMAGE, CONTRACT, FORMATS, LOADERS, TOOLS = range(6)
LAYERS = {
    # base: errors, what the machine gives (CPUs, memory, cgroup limits, a process's delay accounting, the
    # distributed world), words and tables for the console, checksums, per-sample seeds
    "errors.py": BASE, "machine/": BASE, "console/": BASE, "checksum.py": BASE, "seeds.py": BASE,
    # image: every path from stored bytes to pixels, and the geometry of resizes and crops
    "image/": IMAGE,
    # contract: records, manifest, format registry and on-disk layouts, typed fields, keys, the sources a
    # pack reads, where datasets are stored (URLs, the local cache of remote datasets, chunked reads), samples
    "__init__.py": CONTRACT, "record.py": CONTRACT, "manifest.py": CONTRACT, "registry.py": CONTRACT,
    "keyindex.py": CONTRACT, "layouts/": CONTRACT, "fields/": CONTRACT, "storage/": CONTRACT,
    "sources/": CONTRACT, "sample.py": CONTRACT, "sample_index.py": CONTRACT, "decode.py": CONTRACT,
    # formats: writers, readers, several datasets read as one (mixing), and checking a packed dataset
    "packers/": FORMATS, "datasets/": FORMATS, "verify/": FORMATS, "mixing/": FORMATS,
    "loaders/": LOADERS,
    "cli.py": TOOLS, "verify/cli.py": TOOLS, "bench/": TOOLS, "diagnose/": TOOLS,
}
PACKAGE = Path(pixfeed.__file__).parent


def entry(path: str) -> Optional[str]:
    """The most specific key of ``LAYERS`` that covers a module's path under ``pixfeed/``, or None."""
    keys = [k for k in LAYERS if path == k or (k.endswith("/") and path.startswith(k))]
    return max(keys, key=len) if keys else None


def layer(path: str) -> Optional[int]:
    return None if entry(path) is None else LAYERS[entry(path)]


def allowed(path: str, target: Optional[str]) -> bool:
    """Down or sideways; but a tool imports no other tool (``diagnose/`` does not use ``bench/``)."""
    if target is None or layer(target) is None or layer(target) > layer(path):
        return False
    return layer(path) != TOOLS or layer(target) != TOOLS or entry(target) == entry(path)


def module_path(root: Path, module: str) -> Optional[str]:
    """``pixfeed.a.b`` -> ``"a/b.py"`` or ``"a/b/__init__.py"``, whichever exists under ``root``."""
    parts = module.split(".")[1:]
    for candidate in (Path(*parts, "__init__.py"), Path(*parts[:-1], f"{parts[-1]}.py") if parts else None):
        if candidate is not None and (root / candidate).is_file():
            return candidate.as_posix()
    return None


def from_module(path: str, node: ast.ImportFrom) -> Optional[str]:
    """The absolute name of the module a ``from ... import`` in ``path`` names, if it is pixfeed's."""
    if node.level:
        package = ["pixfeed", *Path(path).parent.parts]
        return ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
    return node.module if (node.module or "").split(".")[0] == "pixfeed" else None


def imported(root: Path, path: str, node: ast.AST) -> Iterator[str]:
    """The ``pixfeed`` modules an import statement in ``path`` loads, as module names."""
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names if a.name.split(".")[0] == "pixfeed")
    elif isinstance(node, ast.ImportFrom) and (base := from_module(path, node)):
        subs = (f"{base}.{alias.name}" for alias in node.names)  # ``from pixfeed import machine``: pixfeed.machine
        yield from dict.fromkeys(sub if module_path(root, sub) else base for sub in subs)


def private_names(root: Path, path: str, node: ast.AST) -> Iterator[str]:
    """Another module's private names (``_read``) that ``node`` imports; private modules are the package's."""
    if isinstance(node, ast.ImportFrom) and (base := from_module(path, node)):
        names = (f"{base}.{a.name}" for a in node.names if a.name.startswith("_") and not a.name.startswith("__"))
        yield from (f"{name} (private)" for name in names if module_path(root, name) is None)


def modules(root: Path) -> Iterator[str]:
    return (p.relative_to(root).as_posix() for p in sorted(root.rglob("*.py")))


def bad_imports(root: Path) -> Iterator[Tuple[str, int, str]]:
    """(path, line, imported module) for every import not allowed, and unassigned modules."""
    for path in modules(root):
        if layer(path) is None:
            yield path, 0, "(no layer: add it to LAYERS)"
            continue
        for node in ast.walk(ast.parse((root / path).read_text(encoding="utf-8"), path)):
            for module in imported(root, path, node):
                if not allowed(path, module_path(root, module)):
                    yield path, node.lineno, module
            yield from ((path, node.lineno, name) for name in private_names(root, path, node))


def test_every_import_points_down_and_takes_no_private_name():
    bad = [f"pixfeed/{path}:{line} imports {module}" for path, line, module in bad_imports(PACKAGE)]
    assert not bad, "imports up the layers, across tools or of private names:\n" + "\n".join(bad)


def test_every_layer_entry_names_modules():
    paths = list(modules(PACKAGE))
    stale = [k for k in LAYERS if not any(p == k or (k.endswith("/") and p.startswith(k)) for p in paths)]
    assert not stale


def write(root: Path, path: str, text: str = "") -> None:
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text(text)


def test_the_check_finds_upward_sideways_private_and_unassigned(tmp_path):
    for path in ("__init__.py", "loaders/__init__.py", "loaders/plan.py", "packers/__init__.py"):
        write(tmp_path, path)
    write(tmp_path, "errors.py", "def f():\n    from .loaders.plan import x\n")   # core -> loaders, in a function
    write(tmp_path, "machine/cpus.py", "from pixfeed import loaders\n")           # absolute, a package
    write(tmp_path, "packers/mmap.py", "from ..loaders import plan\nfrom .. import errors\n")  # relative, 2 up
    write(tmp_path, "loaders/shm.py", "import pixfeed.packers\nfrom . import plan\n")  # downward and sideways: fine
    write(tmp_path, "bench/report.py", "from pixfeed.bench import chart\nfrom ..loaders import plan\n")  # fine
    write(tmp_path, "bench/chart.py")
    write(tmp_path, "diagnose/doctor.py", "from pixfeed.bench.report import x\n")  # one tool uses another
    write(tmp_path, "diagnose/system.py", "from pixfeed.machine.cpus import _read, __doc__\n")  # a private name
    write(tmp_path, "packers/_tar.py")
    write(tmp_path, "packers/wds.py", "from . import _tar\n")  # a private module of its package: fine
    write(tmp_path, "newthing.py")
    assert sorted(bad_imports(tmp_path)) == [
        ("diagnose/doctor.py", 1, "pixfeed.bench.report"),
        ("diagnose/system.py", 1, "pixfeed.machine.cpus._read (private)"),
        ("errors.py", 2, "pixfeed.loaders.plan"), ("machine/cpus.py", 1, "pixfeed.loaders"), ("newthing.py", 0, "(no layer: add it to LAYERS)"),
        ("packers/mmap.py", 1, "pixfeed.loaders.plan")]


def import_graph(root: Path) -> dict:
    """module path -> the pixfeed module paths it imports (anywhere in it, functions too)."""
    graph = {}
    for path in modules(root):
        tree = ast.parse((root / path).read_text(encoding="utf-8"), path)
        targets = (module_path(root, m) for node in ast.walk(tree) for m in imported(root, path, node))
        graph[path] = {t for t in targets if t is not None and t != path}
    return graph


def circles(graph: dict) -> list:
    """Every group of modules that reach each other through imports (Tarjan's strongly connected
    components of more than one module), each sorted."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
                on.discard(group[-1])
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_modules_import_each_other():
    """A package's ``__init__`` importing its submodules is the one exception it needs (a submodule
    importing a sibling goes through the package); none of pixfeed's does so both ways."""
    assert circles(import_graph(PACKAGE)) == []


def test_the_circle_check_finds_a_circle_through_a_function(tmp_path):
    write(tmp_path, "__init__.py")
    write(tmp_path, "a.py", "from . import b\n")
    write(tmp_path, "b.py", "def f():\n    from .c import x\n")
    write(tmp_path, "c.py", "import pixfeed.a\n")
    write(tmp_path, "d.py", "from . import a\n")
    assert circles(import_graph(tmp_path)) == [["a.py", "b.py", "c.py"]]


def test_the_core_lies_in_rooms():
    """At most 14 modules lie flat in ``pixfeed/``; every room (a folder) is named in ``LAYERS``."""
    flat = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(flat) <= 14, flat
    rooms = sorted(f"{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    assert [r for r in rooms if r not in LAYERS] == []


def test_the_old_decode_path_still_reads_as_the_new_one():
    """``pixfeed.decode`` stays a re-export of ``pixfeed.image.decode`` for one release (the README
    documented ``pixfeed.decode.decode``)."""
    import pixfeed.decode as old
    from pixfeed.image import decode as new

    assert old.decode is new.decode and old.sniff is new.sniff and old.parse_size is new.parse_size
