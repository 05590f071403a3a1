"""Every route of each surface's /openapi.json (decision, and admin with the store API)
fuzzed by schemathesis against the running service: valid and invalid bodies, wrong
types, odd paths and methods. No answer may be a 5xx, and the document and the service
may not disagree: what the schema allows is accepted (200 or 429), what it forbids is
refused (a 4xx)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from .conftest import Served

pytestmark = pytest.mark.slow  # schemathesis fuzzes the running service


def schemathesis() -> list[str]:
    found = shutil.which("schemathesis") or str(Path(sys.executable).with_name("schemathesis"))
    return [found]


def test_no_route_answers_a_5xx_to_anything_schemathesis_sends(
    serve: Callable[..., Served], uid: str, tmp_path: Path
) -> None:
    native = f"""
rules:
  - name: {uid}.tight
    limits: ["1/minute"]
  - name: {uid}.loose
    limits: ["1000/minute", "100/s"]
    algorithm: sliding_window_counter
  - name: {uid}.conc
    limits: ["3/minute"]
    algorithm: concurrency
"""
    envoy = f"""
domain: {uid}
descriptors:
  - key: user
    rate_limit: {{unit: minute, requests_per_unit: 3}}
    descriptors:
      - key: path
        rate_limit: {{unit: second, requests_per_unit: 1}}
"""
    served = serve(rules=[native, envoy], args=["--store-api"])
    for url, routes in ((served.url, 6), (served.admin_url, 7)):
        doc = httpx.get(f"{url}/openapi.json", timeout=5).json()
        assert routes == len(doc["paths"])
        fuzz(url, tmp_path)
    # the service lives on and never logged an internal error
    assert 200 == httpx.get(f"{served.url}/healthz", timeout=5).status_code
    assert [] == [e for e in served.events() if e.get("event") == "error"]
    assert 0 == served.stop()


CONFIG = """
[checks]
enabled = false

[checks.not_a_server_error]
enabled = true

[checks.positive_data_acceptance]
enabled = true
expected-statuses = ["200", "429"]

[checks.negative_data_rejection]
enabled = true
expected-statuses = ["400", "404", "405", "413", "415"]

# What /v1/store accepts also depends on what no schema can say (its description says it):
# an op's rule_index names one of the call's rules, an atomic call holds d ops only, a
# bucket's capacity x period / count stays below 2**53 us, the body fits in 64 KiB. So a
# schema-valid call may be refused; a schema-invalid one never passes (checked above).
[[operations]]
include-path = "/v1/store"
checks.positive_data_acceptance.enabled = false
"""


def fuzz(url: str, tmp_path: Path) -> None:
    (tmp_path / "schemathesis.toml").write_text(CONFIG)
    out = subprocess.run(
        [
            *schemathesis(),
            "run",
            f"{url}/openapi.json",
            "--max-examples",
            "50",
            "--seed",
            "1",
            "--workers",
            "1",
            "--generation-database",
            "none",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=False,
    )
    assert 0 == out.returncode, out.stdout[-4000:]
    assert "Dropped" not in out.stdout, "a pattern schemathesis cannot use: the schema is not followed"
    counts = re.search(r"(\d+) generated, (\d+) passed", out.stdout)
    assert counts is not None and counts.group(1) == counts.group(2), out.stdout[-2000:]
