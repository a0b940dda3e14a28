"""One error hierarchy: every Rust error variant maps to exactly one Python class, and every ``raise`` in the package
raises an ``EagleIOError`` (or a module-private signal that the same module catches)."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import re
from pathlib import Path

import pytest

import eagle_io
from eagle_io import errors

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = Path(eagle_io.__file__).resolve().parent


def _rust_variants() -> list[str]:
    text = (SRC / "error.rs").read_text()
    body = text[text.index("pub enum Error {") : text.index("\n}\n", text.index("pub enum Error {"))]
    return re.findall(r"^    (\w+)[ ({,]", body, re.M)


def _rust_mapping() -> dict[str, str]:
    text = (SRC / "python" / "errors.rs").read_text()
    return dict(re.findall(r'Error::(\w+)[^=\n]*=> \(\d+, "(\w+)"\)', text))


def test_every_rust_variant_maps_to_exactly_one_python_class():
    variants, mapping = _rust_variants(), _rust_mapping()
    assert variants == ["Io", "Corrupt", "FormatVersion", "Schema", "Incompatible", "NotFound", "InvalidArgument",
                        "Timeout", "Storage", "Internal", "Interrupted", "Earlier"]  # fmt: skip
    # Earlier (an error raised again under a context) is no class of its own: it takes its cause's. Interrupted (a
    # wait a signal cut short) is no error: it is Python's KeyboardInterrupt (tests/test_ring_interrupt.py).
    text = (SRC / "python" / "errors.rs").read_text()
    assert "match err.root()" in text
    assert "Error::Interrupted => return Ok(py.get_type::<PyKeyboardInterrupt>())" in text
    variants.remove("Earlier")
    variants.remove("Interrupted")
    assert sorted(mapping) == sorted(variants), "each variant has one arm"
    assert len(set(mapping.values())) == len(variants), "no two variants share a class"
    for variant, name in mapping.items():
        cls = getattr(errors, name)
        assert issubclass(cls, eagle_io.EagleIOError), (variant, name)
    assert issubclass(errors.InternalError, RuntimeError) and issubclass(errors.StorageError, OSError)
    indices = re.findall(r"=> \((\d+), ", (SRC / "python" / "errors.rs").read_text())
    assert sorted(map(int, indices)) == list(range(len(variants))), "each class has its own cache slot"


def test_core_errors_arrive_as_their_class_with_fields(tmp_path):
    (tmp_path / "manifest.json").write_text("{}")
    with pytest.raises(eagle_io.CorruptRecordError) as e:
        eagle_io.Dataset(tmp_path)
    assert e.value.path == str(tmp_path / "manifest.json") and isinstance(e.value.offset, int)
    with pytest.raises(eagle_io.StorageError) as e:
        eagle_io.Dataset(tmp_path / "missing")
    assert e.value.errno is not None and "missing" in e.value.path
    w = eagle_io.ShardWriter(tmp_path / "d", [eagle_io.TensorSpec("x", "uint8")], {})
    w.close()
    with pytest.raises(eagle_io.InvalidArgumentError, match="closed"):
        w.write(0, {"x": b"\x01"})


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__main__":
            continue  # importing it runs the command line
        if parts[-1] == "__init__":
            parts.pop()
        out.append((".".join(parts), path))
    return out


def _caught_names(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            for t in node.type.elts if isinstance(node.type, ast.Tuple) else [node.type]:
                if isinstance(t, ast.Name):
                    names.add(t.id)
                elif isinstance(t, ast.Attribute):
                    names.add(t.attr)
    return names


def _raised_classes(module_name: str, path: Path):
    """(line, class) for every ``raise X(...)`` / ``raise X`` whose X names a class."""
    module = importlib.import_module(module_name)
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.Raise) or node.exc is None:
            continue
        target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        if isinstance(target, ast.Name):
            cls = next((getattr(ns, target.id) for ns in (module, builtins, errors) if hasattr(ns, target.id)), None)
        elif isinstance(target, ast.Attribute):
            cls = getattr(errors, target.attr, None)
        else:
            continue
        if inspect.isclass(cls):
            yield node.lineno, cls, tree
        elif isinstance(target, ast.Name) and target.id[:1].isupper():
            raise AssertionError(f"{path}:{node.lineno}: cannot resolve the raised class {target.id}")


def test_every_raise_in_the_package_raises_an_eagle_io_error():
    bad = []
    checked = 0
    for name, path in _modules():
        for line, cls, tree in _raised_classes(name, path):
            checked += 1
            if issubclass(cls, eagle_io.EagleIOError):
                continue
            private_and_caught = cls.__name__.startswith("_") and bool(
                {c.__name__ for c in cls.__mro__} & _caught_names(tree)
            )
            if not private_and_caught:
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: raises {cls.__name__}")
    assert checked > 150, f"the scan found only {checked} raises"
    assert not bad, "\n".join(bad)


def test_the_check_itself_sees_a_bare_raise(tmp_path, monkeypatch):
    """The scan is not vacuous: a module raising ValueError is reported."""
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("def f():\n    raise ValueError('x')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = list(_raised_classes("fakepkg", pkg / "__init__.py"))
    assert [(line, cls) for line, cls, _ in found] == [(2, ValueError)]


def test_check_keywords_names_each_unknown_one_suggests_the_closest_and_lists_the_valid_ones():
    """Issue 47, kind 3: ``eagle_io.capture(url, model=...)`` reached the server as a server-side TypeError. The one
    check of keyword arguments where they enter (``eagle_io.errors.check_keywords``): a one-line ArgumentTypeError,
    still a TypeError as Python's own."""
    from eagle_io.errors import ArgumentTypeError, check_keywords

    valid = ["max_length", "model_path", "precision", "ring_bytes", "sampling_params"]
    check_keywords({"max_length": 3, "precision": "fp8"}, valid, "eagle_io.capture()")  # all known: no error
    check_keywords({}, valid, "eagle_io.capture()")
    with pytest.raises(ArgumentTypeError) as e:
        check_keywords({"model": "m"}, valid, "eagle_io.capture()")
    assert str(e.value) == (
        "eagle_io.capture(): unknown keyword argument 'model' (did you mean 'model_path'?); the valid ones: "
        "max_length, model_path, precision, ring_bytes, sampling_params"
    )
    assert isinstance(e.value, TypeError)
    with pytest.raises(ArgumentTypeError) as e:  # every unknown one at once, in the caller's order; no close match
        check_keywords({"ring_byte": 1, "zzz": 2, "max_lenght": 9}, valid, "eagle_io.capture()")
    assert str(e.value).startswith(
        "eagle_io.capture(): unknown keyword arguments 'ring_byte' (did you mean 'ring_bytes'?), 'zzz', 'max_lenght' "
        "(did you mean 'max_length'?); the valid ones: max_length,"
    )
