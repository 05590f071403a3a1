"""The documentation (docs/, with the API reference built from the docstrings) builds with
no warning: a broken link, a docstring that is not valid reStructuredText or a page left
out of the table of contents fails here, and so fails `.ci/run`."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from sphinx.util.inventory import InventoryFile

import ratekeeper

DOCS = Path(__file__).resolve().parents[2] / "docs"


@dataclass
class Build:
    returncode: int
    warnings: str
    stderr: str
    html: Path


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    out = tmp_path_factory.mktemp("docs")
    warnings = out / "warnings.txt"
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "-w", str(warnings)]
    result = subprocess.run(
        [*command, str(DOCS), str(out / "html")],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return Build(result.returncode, warnings.read_text(), result.stderr, out / "html")


def test_the_docs_build_without_a_warning(build: Build) -> None:
    assert "" == build.warnings
    assert 0 == build.returncode, build.stderr
    for page in ("index", "contracts", "api/limiter", "api/stores", "api/web", "benchmarks"):
        assert (build.html / f"{page}.html").is_file(), page


def test_the_reference_documents_every_public_name(build: Build) -> None:
    """Every name of ``ratekeeper.__all__`` has an entry in the API reference, under
    ``ratekeeper.NAME`` or the module that defines it."""
    with (build.html / "objects.inv").open("rb") as f:
        inventory = InventoryFile.load(f, "", lambda *parts: parts[-1])
    documented = {name for objects in inventory.values() for name in objects}
    missing = []
    for name in ratekeeper.__all__:
        obj = getattr(ratekeeper, name)
        where = f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"
        if f"ratekeeper.{name}" not in documented and where not in documented:
            missing.append(name)
    assert [] == missing
