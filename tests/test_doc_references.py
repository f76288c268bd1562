"""Every ``monailabel_xflow.…`` dotted name written in the docs and the code resolves to a real
module or attribute, so a move or a rename cannot leave prose pointing at nothing.

Scanned: README.md, CHANGELOG.md, docs/*.md, reports/**/*.md, benchmarks/ (scripts and README),
and the whole text of every Python file of the package and of tests/ but this one (docstrings, comments and
strings alike; names in code resolve anyway). A reference resolves when its longest importable
prefix is a module and the rest are attributes (or submodules) of it.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from sources import package_files

REPO = Path(__file__).resolve().parents[1]
REF = re.compile(r"(?<![\w/.-])monailabel_xflow(?:\.[A-Za-z_]\w*)+(?![\w-])")

# (file, reference) pairs allowed to stay stale for a while (e.g. while another branch rewrites
# their folder). Each entry must still be there and still be stale: fix the reference, then
# remove its entry. Empty since the issue 28 branches landed.
KNOWN_STALE: dict[tuple[str, str], str] = {}


def _files() -> list[Path]:
    out = [REPO / "README.md", REPO / "CHANGELOG.md", REPO / "benchmarks" / "README.md"]
    out += sorted((REPO / "docs").glob("*.md")) + sorted((REPO / "reports").rglob("*.md"))
    out += package_files() + sorted((REPO / "benchmarks").glob("*.py"))
    out += sorted((REPO / "tests").glob("*.py"))
    return [p for p in out if p.is_file() and p.name != Path(__file__).name]  # this file names stale ones


def resolves(ref: str) -> bool:
    """Whether ``ref`` names a module, or an attribute reached from its longest importable prefix."""
    parts = ref.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            if hasattr(obj, name):
                obj = getattr(obj, name)
            elif hasattr(obj, "__path__"):  # a submodule its package does not import
                try:
                    obj = importlib.import_module(f"{obj.__name__}.{name}")
                except ModuleNotFoundError:
                    return False
            else:
                return False
        return True
    return False


@pytest.fixture(scope="module")
def stale() -> dict[tuple[str, str], int]:
    """``{(file, reference): count}`` of every reference that does not resolve."""
    found: dict[tuple[str, str], int] = {}
    cache: dict[str, bool] = {}
    for path in _files():
        for match in REF.finditer(path.read_text(encoding="utf-8")):
            ref = match.group(0)
            if not cache.setdefault(ref, resolves(ref)):
                key = (str(path.relative_to(REPO)), ref)
                found[key] = found.get(key, 0) + 1
    return found


def test_scan_finds_references():
    text = (REPO / "monailabel_xflow" / "segmenter" / "official.py").read_text()
    refs = set(REF.findall(text))
    assert "monailabel_xflow.segmenter.base.PromptableSegmenter" in refs
    assert not any(r.endswith(".") for r in refs)


@pytest.mark.parametrize(
    "ref, ok",
    [
        ("monailabel_xflow.geometry", True),  # a module
        ("monailabel_xflow.geometry.connected_components", True),  # a function
        ("monailabel_xflow.segmenter.base.PromptableSegmenter.predict", True),  # a method
        ("monailabel_xflow.geometry.no_such_name", False),
        ("monailabel_xflow.no_such_module.thing", False),
        ("monailabel_xflow.segmenter.sam3.load_segmenter", False),  # moved to segmenter.loading
    ],
)
def test_resolver(ref, ok):
    assert resolves(ref) is ok


def test_every_reference_resolves(stale):
    unexpected = {k: n for k, n in stale.items() if k not in KNOWN_STALE}
    assert not unexpected, "references to names that do not exist:\n" + "\n".join(
        f"  {f}: {r} (x{n})" for (f, r), n in sorted(unexpected.items())
    )


def test_known_stale_entries_are_still_stale(stale):
    """The allow-list only ever shrinks: an entry fixed (or its file moved) must be removed."""
    fixed = sorted(set(KNOWN_STALE) - set(stale))
    assert not fixed, f"fixed or gone; remove from KNOWN_STALE: {fixed}"
