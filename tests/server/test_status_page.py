"""The live status page on the admin surface (``ratekeeper.server.status_page``): a real
``ratekeeper serve`` opened in headless Chromium (Debian's chromium and chromium-driver,
through selenium); its JSON and its form over HTTP; its history's bound."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from ratekeeper.metrics import Metrics
from ratekeeper.server.status_page.history import KINDS, DecisionHistory

from .conftest import Served

SECRET = "status-page-secret-0123456789"


def _rules(uid: str) -> list[str]:
    native = f'rules:\n  - name: {uid}.login\n    limits: ["2/minute"]\n  - name: {uid}.shadowed\n'
    native += '    limits: ["1/minute"]\n    shadow: true\n'
    envoy = f"domain: {uid}env\ndescriptors:\n  - key: remote_address\n"
    envoy += "    rate_limit: {unit: minute, requests_per_unit: 3}\n"
    return [native, envoy]


def _check(served: Served, rule: str, key: str) -> int:
    return httpx.post(f"{served.url}/v1/check", json={"rule": rule, "key": key}, timeout=5).status_code


@pytest.fixture
def chromium() -> Iterator[Any]:
    if shutil.which("chromium") is None or shutil.which("chromedriver") is None:
        pytest.fail("chromium and chromium-driver are not installed (.ci/run installs them)")
    from ratekeeper.server.status_page.browser import open_chromium

    driver = open_chromium()
    try:
        yield driver
    finally:
        driver.quit()


def test_the_page_in_chromium_shows_rules_health_charts_and_tries_a_check(
    serve: Callable[..., Served], uid: str, chromium: Any
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from ratekeeper.server.status_page.screenshot import submit_try, wait_for_page

    served = serve(rules=_rules(uid))
    login = f"{uid}.login"
    assert [200, 200, 429, 429, 429] == [_check(served, login, "alice") for _ in range(5)]

    chromium.get(served.admin_url + "/")
    wait_for_page(chromium)
    rows = {
        row.get_attribute("data-rule"): row.text for row in chromium.find_elements(By.CSS_SELECTOR, "#rules-body tr")
    }
    assert "2/minute" in rows[login] and "native" in rows[login]
    assert f"envoy ({uid}env)" in rows[f"{uid}env.remote_address"]
    assert "yes" in rows[f"{uid}.shadowed"]
    assert chromium.find_element(By.ID, "store").text.startswith("reachable")
    assert "closed" == chromium.find_element(By.ID, "breaker").text

    # The sampler reads the metrics every 2 s; the chart of the rule shows the 2 allowed and 3 denied.
    totals = f'.chart[data-rule="{login}"] .totals'
    WebDriverWait(chromium, 10).until(lambda d: "denied 3" in d.find_element(By.CSS_SELECTOR, totals).text)
    assert "allowed 2" in chromium.find_element(By.CSS_SELECTOR, totals).text
    lines = chromium.find_elements(By.CSS_SELECTOR, f'.chart[data-rule="{login}"] svg polyline')
    assert {"allowed", "denied"} == {line.get_attribute("class") for line in lines}

    verdict = submit_try(chromium, login, "alice")
    assert f"{login} / alice: would be denied" in verdict
    result = chromium.find_element(By.ID, "try-result").text
    assert '"denied_by": "2/minute"' in result and '"remaining": 0' in result
    verdict = submit_try(chromium, login, "bob")
    assert f"{login} / bob: would be allowed; remaining 1" == verdict  # after the cost it would charge
    # The form only peeked: bob's whole quota is still there.
    assert [200, 200, 429] == [_check(served, login, "bob") for _ in range(3)]


def test_the_json_and_the_form_change_nothing_and_stay_on_the_admin_surface(
    serve: Callable[..., Served], uid: str
) -> None:
    served = serve(rules=_rules(uid))
    login = f"{uid}.login"
    with httpx.Client(base_url=served.admin_url, timeout=5) as admin:
        for _ in range(4):
            peeked = admin.post("/status/try", json={"rule": login, "key": "carol", "cost": 2})
            assert 200 == peeked.status_code and peeked.json()["allowed"] is True
        assert 400 == admin.post("/status/try", json={"rule": "nope", "key": "carol"}).status_code
        assert 405 == admin.get("/status/try").status_code
        doc = admin.get("/status.json").json()
        page = admin.get("/")
        script = admin.get("/status/page.js")
    assert [200, 200, 429] == [_check(served, login, "carol") for _ in range(3)]  # nothing was charged
    assert {"native", "envoy"} == {r["form"] for r in doc["rules"]}
    assert doc["store"]["reachable"] is True and "closed" == doc["breaker"]
    assert set(KINDS) == set(doc["decisions"]["rules"][login])
    assert "text/html; charset=utf-8" == page.headers["content-type"]
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert "javascript" in script.headers["content-type"] and ".innerHTML" not in script.text
    for path in ("/", "/status.json", "/status/page.js"):  # the decision surface has none of it
        assert 404 == httpx.get(f"{served.url}{path}", timeout=5).status_code


def test_with_admin_tokens_the_page_and_its_json_need_one(serve: Callable[..., Served], uid: str) -> None:
    served = serve(rules=_rules(uid), env={"RATEKEEPER_ADMIN_TOKENS": f"ops:{SECRET}\n"})
    for method, path in [("GET", "/"), ("GET", "/status.json"), ("GET", "/status/page.js"), ("POST", "/status/try")]:
        body = {"rule": f"{uid}.login", "key": "k"} if method == "POST" else None
        reply = httpx.request(method, f"{served.admin_url}{path}", json=body, timeout=5)
        assert 401 == reply.status_code, path
        bearer = {"authorization": f"Bearer {SECRET}"}
        with_token = httpx.request(method, f"{served.admin_url}{path}", json=body, headers=bearer, timeout=5)
        assert 200 == with_token.status_code, path


def test_the_history_is_a_bounded_ring_of_per_interval_counts() -> None:
    metrics = Metrics()
    metrics.configured_rules(["r"])
    history = DecisionHistory(metrics, samples=5)
    counter = metrics.decisions
    for i in range(40):
        counter.labels("r", "within").inc(i)
        counter.labels("r", "over").inc(1)
        counter.labels("r", "fallback").inc(0 if i % 2 else 2)
        if i == 39:
            metrics.reloaded(False)
        history.sample(now=float(i))
    assert 5 == len(history.ring)
    series = history.series()
    assert [36.0, 37.0, 38.0, 39.0] == series["times"]
    assert [36, 37, 38, 39] == series["rules"]["r"]["allowed"]
    assert [1, 1, 1, 1] == series["rules"]["r"]["denied"]
    assert [2, 0, 2, 0] == series["rules"]["r"]["fallback"]
    assert [{"at": 39.0, "result": "failed", "count": 1}] == list(history.reloads)
