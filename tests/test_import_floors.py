"""The package's floors (docs/ARCHITECTURE.md): a module imports its own room and rooms on lower floors, never a room
on its own floor or above, so the data path reads bottom-up and a room can be understood from what lies beneath it.

Every import is counted, those inside functions too (``ast``, on the installed package: nothing is imported). The
same idea as polars' ``py-polars/tests/unit/test_polars_import.py``, which pins what ``import polars`` may load.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import eagle_io

PACKAGE = Path(eagle_io.__file__).parent

#: Room (top-level module or subpackage of ``eagle_io``) -> floor. ``sglang`` (what SGLang does) sits beneath both
#: the SGLang capture (``capturing``) and the serving guard (``serving``), which may not import each other.
FLOORS: dict[str, float] = {
    "_native": 0,
    "errors": 1,
    "defaults": 1,
    "host": 1,
    "data": 2,
    "store": 3,
    "sglang": 3.5,
    "capturing": 4,
    "feed": 4,
    "report": 4,
    "interop": 5,
    "serving": 6,
    "draft": 6,
    "spec": 6.5,  # the reference speculative decoder: a draft (draft) loaded as SGLang would serve it (serving)
    "sglang_plugin": 6.5,  # the SGLang entry point: the guard (serving) and the capture's hooks (capturing)
    "cli": 7,
    "__init__": 8,  # the package's face: re-exports, imported by nothing inside the package
}


def room_of(module: str) -> str:
    """``eagle_io.store.reader`` -> ``store``; ``eagle_io`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every ``eagle_io`` module ``path`` imports (relative imports resolved; ``from X import
    name`` counted as the submodule ``X.name`` when that is a module of the package, else as ``X``)."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "eagle_io"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "eagle_io":
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                as_path = PACKAGE.parent.joinpath(*sub.split("."))
                is_module = as_path.with_suffix(".py").exists() or (as_path / "__init__.py").exists()
                is_native = sub == "eagle_io._native"
                out.append((node.lineno, sub if is_module or is_native else target))
    return out


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_every_room_has_a_floor():
    rooms = {room_of(module_name(p)) for p in SOURCES}
    assert rooms - set(FLOORS) == set(), "a new room: give it a floor in FLOORS (and docs/ARCHITECTURE.md)"
    assert {"_native"} | rooms >= set(FLOORS), "a room in FLOORS that no longer exists"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_its_own_floor_or_above(path):
    here = room_of(module_name(path))
    bad = []
    for line, target in imports_of(path):
        there = room_of(target)
        if there != here and FLOORS[there] >= FLOORS[here]:
            bad.append(f"line {line}: {target} (room {there}, floor {FLOORS[there]})")
    assert not bad, f"{path.relative_to(PACKAGE)} (room {here}, floor {FLOORS[here]}) imports upward: {bad}"


def test_the_rule_catches_an_upward_import(tmp_path, monkeypatch):
    """The check itself: an import from serving inside the SGLang room, and one of the package face, are found."""
    fake = tmp_path / "eagle_io"
    (fake / "sglang").mkdir(parents=True)
    (fake / "serving").mkdir()
    for p in ("__init__.py", "sglang/__init__.py", "serving/__init__.py", "serving/plugin.py"):
        (fake / p).write_text("")
    probe = fake / "sglang" / "probe.py"
    probe.write_text("from ..serving import plugin\n\ndef f():\n    from .. import __version__\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    found = imports_of(probe)
    assert found == [(1, "eagle_io.serving.plugin"), (4, "eagle_io")]
    assert [room_of(t) for _, t in found] == ["serving", "__init__"]


#: Rooms on floors that allow the import but must stay independent of each other (docs/ARCHITECTURE.md): the SGLang
#: serving guard and the capture (the plugin entry point, :mod:`eagle_io.sglang_plugin`, registers both), and the
#: training feed and the capture (the feed reads what any capture committed, through ``store``).
INDEPENDENT: list[tuple[str, str]] = [("serving", "capturing"), ("feed", "capturing")]


def import_graph(sources: list[Path]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a package import is an edge to its ``__init__``)."""
    names = {module_name(p) for p in sources}
    return {module_name(p): {t for _, t in imports_of(p) if t in names} for p in sources}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while (w := stack.pop()) != v:
                on_stack.discard(w)
                scc.append(w)
            on_stack.discard(v)
            scc.append(v)
            if len(scc) > 1 or v in graph[v]:
                found.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_import_circles_even_inside_a_room():
    """No module reaches itself through imports, function-local imports included (a circle hidden in a function is
    still two modules that cannot be read one before the other)."""
    assert cycles(import_graph(SOURCES)) == []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_independent_rooms_do_not_import_each_other(path):
    here = room_of(module_name(path))
    apart = {b for a, b in INDEPENDENT if a == here} | {a for a, b in INDEPENDENT if b == here}
    bad = [f"line {line}: {target}" for line, target in imports_of(path) if room_of(target) in apart]
    assert not bad, f"{path.relative_to(PACKAGE)} (room {here}) imports a room it must stay independent of: {bad}"


#: Walls inside a room, where two processes meet: modules on one side never import the other side. The SGLang
#: capture's scheduler side runs inside SGLang's scheduler processes; its client side drives servers over HTTP. What
#: both sides speak (``protocol``, ``live``) stands on its own.
WALLS: list[tuple[str, set[str], set[str]]] = [
    (
        "eagle_io.capturing.sglang",
        {"scheduler", "capture", "operator", "assembly", "handoff"},  # scheduler side
        {"client", "launch"},  # client side
    ),
]


@pytest.mark.parametrize("package,scheduler_side,client_side", WALLS)
def test_the_scheduler_side_never_imports_the_client_side(package, scheduler_side, client_side):
    where = PACKAGE.parent.joinpath(*package.split("."))
    present = {p.stem for p in where.glob("*.py")}
    assert scheduler_side | client_side <= present, "a module named in WALLS no longer exists"
    both = present - scheduler_side - client_side - {"__init__"}
    graph = import_graph(SOURCES)
    for side, other in ((scheduler_side, client_side), (both, scheduler_side | client_side)):
        for m in side:
            bad = {t for t in graph[f"{package}.{m}"] if t.startswith(f"{package}.") and t.rsplit(".", 1)[1] in other}
            assert not bad, f"{package}.{m} imports across the wall: {sorted(bad)}"


def test_the_cycle_check_finds_a_circle_hidden_in_a_function():
    graph = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a.w": {"a.x"}, "a.v": {"a.v"}}
    assert cycles(graph) == [["a.v"], ["a.x", "a.y", "a.z"]]
    assert cycles({"a.x": {"a.y"}, "a.y": set()}) == []


SRC = Path(__file__).resolve().parent.parent / "src"


def rust_module(path: Path, src: Path) -> str:
    """``src/ring/sink.rs`` -> ``ring.sink``; ``src/ring/mod.rs`` -> ``ring``; ``src/lib.rs`` -> ``crate``."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib"):
        parts.pop()
    return ".".join(parts) or "crate"


def rust_graph(src: Path) -> dict[str, set[str]]:
    """Module (one ``.rs`` file) -> the crate's modules its code names through ``crate::`` or ``super::`` paths
    (comments and ``mod tests`` left out; a path to a module's own ancestor is no edge: a child may use what its
    parent defines)."""
    files = {rust_module(p, src): p for p in src.rglob("*.rs")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        text = re.sub(r"#\[cfg\(test\)\]\s*mod tests \{.*", "", path.read_text(), flags=re.S)
        text = re.sub(r"//.*", "", text)
        here = [] if mod == "crate" else mod.split(".")
        edges = set()
        for m in re.finditer(r"\b(?:crate|super)(?:::\w+)+", text):
            segs = m.group(0).split("::")
            base = [] if segs[0] == "crate" else here
            while segs and segs[0] in ("crate", "super"):
                base = base[:-1] if segs.pop(0) == "super" else base
            # the longest prefix of the path that names a module of the crate
            known = [".".join(base + segs[:i]) or "crate" for i in range(len(segs) + 1)]
            target = [k for k in known if k in files][-1:]
            if target and target[0] != mod and not (mod + ".").startswith(target[0] + "."):
                edges.add(target[0])
        graph[mod] = edges
    return graph


def test_no_circles_between_the_rust_cores_modules():
    """The Rust equivalent of the check above: no two files of src/ name each other, even through a third."""
    graph = rust_graph(SRC)
    assert {"ring.sink", "python.sink", "python.slot", "error"} <= set(graph), "the walk finds the crate's files"
    assert "python.slot" in graph["python.sink"] and "error" in graph["ring.slots"], "and their paths"
    assert cycles(graph) == []
