"""What the docs promise about installing the service is what the package does: the
``server`` extra installs every package the service imports, and no doc
tells the reader to add one of them by hand."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICE_MD = (ROOT / "docs" / "service.md").read_text()


def server_extra() -> set[str]:
    """The distributions ``pip install 'ratekeeper[server]'`` adds, by name (no extras, no versions)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {re.split(r"[\[<>=~! ]", spec, maxsplit=1)[0].lower() for spec in extras["server"]}
    return names - {"ratekeeper"}


def test_the_gRPC_health_module_comes_with_the_server_extra() -> None:
    """``ratekeeper.server.grpc_service`` imports ``grpc_health``: its distribution is in the extra."""
    source = (ROOT / "src" / "ratekeeper" / "server" / "grpc_service.py").read_text()
    assert "from grpc_health.v1 import" in source
    distributions = {d.lower() for d in importlib.metadata.packages_distributions()["grpc_health"]}
    assert distributions & server_extra() == {"grpcio-health-checking"}


def test_service_md_lists_what_the_server_extra_installs_and_asks_for_nothing_more() -> None:
    start = SERVICE_MD.index("`pip install 'ratekeeper[server]'`")
    sentence = SERVICE_MD[start : SERVICE_MD.index("\n\n", start)]
    for name in server_extra():
        assert name in sentence, name
    for doc in (ROOT / "docs").glob("*.md"):
        for name in server_extra():
            assert not re.search(rf"needs\s+`{re.escape(name)}`", doc.read_text()), f"{doc.name} asks for {name}"
    readme = (ROOT / "README.md").read_text()
    for name in server_extra():
        assert not re.search(rf"needs\s+`{re.escape(name)}`", readme), f"README asks for {name}"
