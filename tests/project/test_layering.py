"""The package's layers (docs/architecture.md): a module imports only from its own layer or below.

Imports under ``if TYPE_CHECKING:`` are for annotations and do not count. The check reads
every module's imports (function-level ones included) with ``ast``, so a late import that
hides a cycle is caught too.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

LAYERS: dict[str, int] = {
    # the vocabulary: values and errors that everything speaks
    "errors": 0,
    "limit": 0,
    "decision": 0,
    "clock": 0,
    "op": 0,
    "bounded": 0,  # a bound on what clients may create
    "keys": 0,  # a rendered key kept within the stores' bound
    # the reference algorithms: pure functions over the vocabulary
    "algorithms": 1,
    # what users declare
    "rule": 2,
    "quota": 2,
    # where state lives and is decided
    "stores": 3,
    # the shell: Limiter / AsyncLimiter, failure policy, breaker, observer
    "limiter": 4,
    "testing": 5,
    "metrics": 5,  # an Observer: Prometheus metrics of the limiter
    "otel": 5,  # a backend of metrics: its instruments and a span per decision through OpenTelemetry
    # what comes around the library
    "config": 6,
    "web": 7,
    "server": 8,
    "cli": 9,
    "loadtest": 9,  # ratekeeper loadtest's engine: an app of the library, like the CLI
    "tour": 9,  # ratekeeper tour: the service and the load test's recording, in one walk-through
    "__main__": 9,
    "": 9,  # ratekeeper/__init__.py: the public surface
}


def _layer(module: str) -> str:
    """``ratekeeper.stores.redis.store`` -> ``stores``; ``ratekeeper`` -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _runtime_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, module) of every ``ratekeeper`` import outside ``if TYPE_CHECKING:`` blocks."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                skipped.update(id(n) for n in ast.walk(inner))
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [(node.lineno, name) for name in names if name.split(".")[0] in ("ratekeeper", "ratekeeper_bench")]
    return found


def _modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted((SRC / "ratekeeper").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out.append((module, path))
    return out


def test_every_layer_of_the_package_is_known() -> None:
    layers = {_layer(module) for module, _ in _modules()}
    assert set() == layers - set(LAYERS), "add the new layer to LAYERS and to docs/architecture.md"


BENCH_COMMANDS = frozenset({"ratekeeper.cli.bench"})
"""The command whose engine lives in ``ratekeeper_bench`` (imported when it runs)."""


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    wrong = []
    for module, path in _modules():
        own = LAYERS[_layer(module)]
        for line, imported in _runtime_imports(ast.parse(path.read_text())):
            if imported.startswith("ratekeeper_bench"):
                if module not in BENCH_COMMANDS:
                    wrong.append(f"{path.name}:{line} imports {imported} (only `ratekeeper bench` may)")
                continue
            if LAYERS[_layer(imported)] > own:
                wrong.append(f"{module}:{line} ({_layer(module) or 'ratekeeper'}) imports {imported}")
    assert [] == wrong


def test_the_check_sees_a_violation() -> None:
    """The checker itself: an import from above is found, one under TYPE_CHECKING is not."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "from ratekeeper.limiter import Limiter\n"
        "if TYPE_CHECKING:\n"
        "    from ratekeeper.cli import main\n"
        "def f():\n"
        "    import ratekeeper.web\n"
    )
    assert [(2, "ratekeeper.limiter"), (6, "ratekeeper.web")] == sorted(_runtime_imports(ast.parse(source)))


def test_the_runtime_package_never_imports_the_benchmarks_or_their_peers() -> None:
    """The benchmark harness and the peers it measures are not dependencies of ratekeeper."""
    peers = ("limits", "pyrate_limiter", "throttled", "ratekeeper_bench")
    wrong = []
    for module, path in _modules():
        if module in BENCH_COMMANDS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            wrong += [f"{module} imports {n}" for n in names if n.split(".")[0] in peers]
    assert [] == wrong
