"""The package's shape, checked: no import cycles and no import from a lower layer into a higher
one (docs/architecture.md), function-level and ``TYPE_CHECKING`` imports included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from sources import package_files

import monailabel_xflow

PACKAGE = Path(monailabel_xflow.__file__).parent

LAYERS = {
    # 0 vocabulary, coordinates, pictures, metrics, where weights come from
    "vocabulary": 0,
    "geometry": 0,
    "rle": 0,
    "metrics": 0,
    "rendering": 0,
    "weights": 0,
    "errors": 0,
    "parameters": 0,  # request values parsed and bounded (ids, numbers, JSON objects)
    "files": 0,  # crash-safe writes: atomic files, model folder swaps, recovery at start
    "transforms": 1,  # loading one radiograph
    "instructions": 2,  # language -> Instruction
    "data": 3,  # phantoms, the MIMIC-ILS format, dataset readers
    "segmenter": 4,  # F_seg
    "policy": 5,  # protocol, conversation, π_init / π_rev, the oracle
    "workflow": 6,  # XFlow: Stage 1, the Stage 2 loop, traces, model configuration
    "task_options": 6,  # what a task request asks (instructions, label numbering, clicks), parsed
    "training": 7,
    "rosalia": 8,  # the baseline (model, predictor, its training)
    "eval": 9,
    "ils": 9,
    "serving": 10,  # what any server of XFlow needs: the ASGI guard, the answering pipeline
    "app": 11,  # MONAI Label tasks
    "commands": 12,
    "cli": 12,
    "testing": 13,  # test doubles: nothing in the package imports them
}
"""Rank of each top-level module or subpackage; a module may import only ranks <= its own."""


def _modules() -> dict[str, Path]:
    found = {}
    for path in package_files(root=PACKAGE):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(["monailabel_xflow"] + parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """``{module: modules of the package it imports}``, every import statement anywhere in it."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges = graph.setdefault(name, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = name.split(".")[: None if is_package else -1]
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target != "monailabel_xflow":
                    edges.add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def layer_of(module: str) -> int:
    return LAYERS[module.split(".")[1]]


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in _modules() if m != "monailabel_xflow" and m.split(".")[1] not in LAYERS)
    assert not unplaced, f"place these in LAYERS and docs/architecture.md: {unplaced}"


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle)


def test_no_module_imports_a_higher_layer():
    upward = [
        f"{a} ({layer_of(a)}) -> {b} ({layer_of(b)})"
        for a, targets in import_graph().items()
        if a != "monailabel_xflow"
        for b in targets
        if layer_of(b) > layer_of(a)
    ]
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize(
    "graph, expected",
    [
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
    ],
)
def test_find_cycle_sees_a_cycle_through_three_modules(graph, expected):
    assert find_cycle(graph) == expected


def test_the_graph_sees_function_level_imports():
    """A function-level import is an edge: the checks above would miss half the cycles otherwise
    (four of the cycles this test was written against went through one)."""
    graph = import_graph()
    # workflow.runtime loads the segmenter only when a model is first used, inside a function
    assert "monailabel_xflow.segmenter.loading" in graph["monailabel_xflow.workflow.runtime"]


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def borrowed_private_names(modules: dict[str, Path] | None = None, package: str = "monailabel_xflow") -> list[str]:
    """Every place a package module imports or uses another package module's ``_private`` name.

    Seen: ``from <package module> import _name`` (absolute or relative, function-level included)
    and ``<alias>._name`` where ``<alias>`` is a package module bound by ``import ... as`` or
    ``from ... import <module>`` (a dotted chain below it included). A module's own private names,
    and dunders, are its own business.
    """
    modules = _modules() if modules is None else modules
    borrowed = []
    for name, path in sorted(modules.items()):
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        aliases: dict[str, str] = {}  # local name -> package module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = name.split(".")[: None if is_package else -1]
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                if base != package and not base.startswith(package + "."):
                    continue
                for a in node.names:
                    if f"{base}.{a.name}" in modules:
                        aliases[a.asname or a.name] = f"{base}.{a.name}"
                    if _is_private(a.name) and base != name:
                        borrowed.append(f"{name}:{node.lineno}: from {base} import {a.name}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == package:
                        local = a.asname or package
                        aliases[local] = a.name if a.asname else package
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
                continue
            chain, value = [], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in aliases:
                target = ".".join([aliases[value.id]] + chain[::-1])
                if target in modules and target != name:
                    borrowed.append(f"{name}:{node.lineno}: {target}.{node.attr}")
    return borrowed


def test_no_module_borrows_another_modules_private_names():
    """Modules use each other's public names only (issue 28 for ``app/``, issue 36 for the whole
    package): a helper two modules share is public, documented and has one home."""
    assert borrowed_private_names() == []


def test_the_private_name_check_sees_each_kind_of_borrowing(tmp_path):
    """The check above is not vacuous: each way of borrowing, written into a scratch package."""
    pkg = tmp_path / "scratch"
    (pkg / "eval").mkdir(parents=True)
    (pkg / "eval" / "__init__.py").write_text("")
    (pkg / "eval" / "helpers.py").write_text("def _secret():\n    return 1\n\n\ndef public():\n    return _secret()\n")
    (pkg / "eval" / "user.py").write_text(
        "from scratch.eval.helpers import _secret\n"
        "from . import helpers\n"
        "import scratch.eval.helpers as h\n\n\n"
        "def f():\n"
        "    from .helpers import _secret as again\n"
        "    return helpers._secret() + h._secret() + helpers.public() + again()\n"
    )
    modules = {
        "scratch.eval": pkg / "eval" / "__init__.py",
        "scratch.eval.helpers": pkg / "eval" / "helpers.py",
        "scratch.eval.user": pkg / "eval" / "user.py",
    }
    found = borrowed_private_names(modules, package="scratch")
    assert [f.split(": ", 1)[1] for f in found] == [
        "from scratch.eval.helpers import _secret",
        "from scratch.eval.helpers import _secret",
        "scratch.eval.helpers._secret",
        "scratch.eval.helpers._secret",
    ]
    assert all(f.startswith("scratch.eval.user:") for f in found)


def test_label_files_are_written_and_read_in_one_module():
    """Label I/O has one owner (docs/architecture.md "Owners"): only ``transforms/labels.py`` writes or
    reads label files with nibabel / pynrrd, and no ``app/`` module imports them at all."""
    users = set()
    for path in package_files(root=PACKAGE):
        text = path.read_text()
        if "import nrrd" in text or ("import nibabel" in text and "app/" in path.as_posix()):
            users.add(path.relative_to(PACKAGE).as_posix())
    assert users <= {"transforms/labels.py", "transforms/loading.py"}


def test_the_owners_table_names_modules_that_exist():
    """Every module the "Owners" table of docs/architecture.md names exists, and each concern of
    issue 28 has a row."""
    import re

    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    section = doc.split("## Owners", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| Concern")]
    concerns = {row.split("|")[1].strip().lower() for row in rows if not set(row) <= set("|- ")}
    for concern in (
        "click budget",
        "specks",
        "answer sentence",
        "colours",
        "label i/o",
        "lateral-view refusal",
        "errors -> http",
        "rosalia's weights",
        "cli parsers",
    ):
        assert concern in concerns, concern
    for path in re.findall(r"`((?:[a-z_]+/)*[a-z_]+\.py)`", section):
        assert (PACKAGE / path).is_file() or (PACKAGE.parent / path).is_file(), path


MAX_APP_LINES = 2500


def test_the_app_is_adapters_only_and_small():
    """``app/`` holds the MONAI Label adapter and nothing else (issue 36): at most 2,500 lines, as
    ``wc -l`` counts them, over every file under it; loading, uploads, the model runtime, the
    ASGI guard and the request pipelines live in the layers that own them."""
    files = [p for p in (PACKAGE / "app").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    lines = sum(p.read_bytes().count(b"\n") for p in files)
    assert 1000 < lines <= MAX_APP_LINES, f"app/ holds {lines} lines; move what is not adapter code out of it"
