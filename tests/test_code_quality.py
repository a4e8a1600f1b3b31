"""House rules, checked: lint, strict types, no print/assert/exit in library code, modules
and functions of a readable size, and no target named outside its own modules."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("edgekit", "targets", "converters", "profiles", "tui")
# The CLI and the TUI are where output and exit codes belong.
ALLOWED = ("edgekit/cli/", "edgekit/__main__.py", "tui/")
FORBIDDEN = re.compile(r"^\s*(print\(|assert\s|sys\.exit\(|exit\()")


def test_no_print_assert_or_exit_in_library_code() -> None:
    hits = []
    for folder in LIBRARY:
        for f in (ROOT / folder).rglob("*.py"):
            rel = f.relative_to(ROOT).as_posix()
            if rel.startswith(ALLOWED):
                continue
            for n, line in enumerate(f.read_text().splitlines(), 1):
                if FORBIDDEN.match(line):
                    hits.append(f"{rel}:{n}: {line.strip()}")
    assert not hits, hits


def test_ruff() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", str(ROOT)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


def _link_farm(dest: Path) -> Path:
    """The installed package layout as symlinks (what a strict editable install builds),
    so mypy sees edgekit.converters, edgekit.targets, ... as they are imported."""
    package = dest / "edgekit"
    package.mkdir(parents=True)
    for entry in (ROOT / "edgekit").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for folder in LIBRARY[1:]:
        (package / folder).symlink_to(ROOT / folder)
    return dest


def test_mypy_strict(tmp_path: Path) -> None:
    farm = _link_farm(tmp_path / "farm")
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"), "-p", "edgekit"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**__import__("os").environ, "MYPYPATH": str(farm)},
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr


# --- size: modules and functions a reader can hold in their head ---------------------------

SIZED = ("edgekit", "converters", "targets", "tui")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
LONG = "# long:"  # on a def line: why this function must stay long


def _sources() -> list[tuple[str, str]]:
    """(path relative to the root, text) of every library module."""
    return [
        (f.relative_to(ROOT).as_posix(), f.read_text(encoding="utf-8"))
        for folder in SIZED
        for f in sorted((ROOT / folder).rglob("*.py"))
    ]


def _long_functions(text: str, name: str = "<text>") -> list[str]:
    """'line: name is N lines' for every function over the limit whose def line gives no
    ``# long: <reason>`` (nested functions count on their own, and inside their parent)."""
    lines = text.splitlines()
    found = []
    for node in ast.walk(ast.parse(text, name)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        reason = lines[node.lineno - 1].partition(LONG)[2].strip()
        if length > MAX_FUNCTION_LINES and not reason:
            found.append(f"{node.lineno}: {node.name} is {length} lines")
    return found


def test_no_module_over_500_lines() -> None:
    too_long = [
        f"{rel}: {len(text.splitlines())} lines"
        for rel, text in _sources()
        if len(text.splitlines()) > MAX_MODULE_LINES
    ]
    assert not too_long, "split these modules:\n" + "\n".join(too_long)


def test_no_function_over_80_lines_without_a_reason() -> None:
    too_long = [f"{rel}:{hit}" for rel, text in _sources() for hit in _long_functions(text, rel)]
    assert not too_long, "split these functions, or say why:\n" + "\n".join(too_long)


def test_the_function_size_check_sees_long_functions() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    assert _long_functions(f"def f():\n{body}") == [f"1: f is {MAX_FUNCTION_LINES + 1} lines"]
    assert _long_functions(f"def f():  # long: one table, row by row\n{body}") == []
    assert _long_functions(f"def f():  # long:\n{body}") != []  # a reason, not the tag
    assert _long_functions(f"def f():\n{body[: -len('    x79 = 79')]}\n") == []


# --- target names: the registry is the only place that knows them ---------------------------


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes of ``tree`` (prose may name a target)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _name_literals(text: str, names: set[str], name: str = "<text>") -> list[tuple[int, str, str]]:
    """(line, target name, literal) for every string constant, f-string parts included,
    that holds one of ``names`` as a word: "openvino", "openvino:INT4",
    "edgekit.targets.openvino" (not "openvino_genai", not in a docstring)."""
    tree = ast.parse(text, name)
    skip = _docstrings(tree)
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            words = set(re.split(r"[^A-Za-z0-9_]+", node.value))
            hits += [(node.lineno, n, node.value) for n in sorted(names & words)]
    return sorted(hits)


def _own_paths() -> dict[str, tuple[str, ...]]:
    """Each registered target's own modules: targets/<name>*.py and its format package."""
    from edgekit.targets.registry import get_target

    from edgekit.plugins import target_names

    return {
        name: (f"targets/{name}", f"converters/{get_target(name).format.name}/")
        for name in target_names()
    }


def test_no_target_name_outside_its_own_modules() -> None:
    """Core code, the CLI, the planner, pack, load, bench, eval and the TUI loop over the
    registry and read capabilities: a target's name as a literal anywhere else is a
    per-target fact that belongs in the target's module or its format package."""
    own = _own_paths()
    offenders = [
        f"{rel}:{line}: {name!r} in {literal[:70]!r}"
        for rel, text in _sources()
        for line, name, literal in _name_literals(text, set(own), rel)
        if not rel.startswith(own[name])
    ]
    assert not offenders, "move these into the target or read the registry:\n" + "\n".join(
        offenders
    )


def test_the_name_check_sees_literals() -> None:
    source = (
        '"""The openvino module."""\n'
        'a = "openvino"\n'
        'b = f"{a}-openvino:INT4"\n'
        'c = "openvino_genai"\n'
        "def f():\n"
        '    """openvino here is prose."""\n'
        '    return {"llamacpp": 1}\n'
    )
    assert [(line, name) for line, name, _ in _name_literals(source, {"openvino", "llamacpp"})] == [
        (2, "openvino"),
        (3, "openvino"),
        (7, "llamacpp"),
    ]
