"""``python -m ratekeeper.server.status_page.screenshot OUT.png``: the status page's picture.

Starts ``ratekeeper serve`` with its example rules on free loopback ports, sends it a
little traffic for ``--seconds`` (a key within ``items.list``, one over it, logins over
``auth.create_token``'s 5/3s, Envoy's ``example`` domain), opens the admin surface's
status page in headless Chromium, tries a check in its form and saves the window as a
PNG. Bounded in time; traffic goes to the service it started only.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ratekeeper.server.status_page.browser import open_chromium

__all__ = ["main", "submit_try", "wait_for_page"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _post(url: str, doc: object) -> int:
    request = urllib.request.Request(url, json.dumps(doc).encode(), {"content-type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            status: int = reply.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    return status


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=1):
            return True
    except OSError:
        return False


def _traffic(url: str, stop: threading.Event) -> None:
    """A few checks a second until ``stop``: an allowed user, a user over the limit, a
    burst of logins, Envoy descriptors."""
    i = 0
    while not stop.is_set():
        _post(f"{url}/v1/check", {"rule": "items.list", "key": "alice"})
        for _ in range(3):
            _post(f"{url}/v1/check", {"rule": "items.list", "key": "mallory"})
        for _ in range(2 + i % 3):
            _post(f"{url}/v1/check", {"rule": "auth.create_token", "key": "10.0.0.7"})
        descriptor = {"entries": [{"key": "remote_address", "value": "10.0.0.9"}]}
        _post(f"{url}/json", {"domain": "example", "descriptors": [descriptor] * 4})
        i += 1
        stop.wait(0.5)


def wait_for_page(driver: Any, timeout: float = 15.0) -> None:
    """Until the page has drawn ``/status.json`` (its rules table has rows)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#rules-body tr"))


def submit_try(driver: Any, rule: str, key: str, timeout: float = 10.0) -> str:
    """Fill the page's form with ``rule`` and ``key``, submit it, and return the verdict shown."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select
    from selenium.webdriver.support.ui import WebDriverWait

    find = driver.find_element
    WebDriverWait(driver, timeout).until(
        lambda d: rule in [o.get_attribute("value") for o in Select(find(By.ID, "try-rule")).options]
    )
    Select(find(By.ID, "try-rule")).select_by_value(rule)
    box = find(By.ID, "try-key")
    box.clear()
    box.send_keys(key)
    before = find(By.ID, "try-result").text
    find(By.ID, "try-submit").click()
    WebDriverWait(driver, timeout).until(lambda d: find(By.ID, "try-result").text not in ("", before))
    verdict: str = find(By.ID, "try-verdict").text
    return verdict


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ratekeeper.server.status_page.screenshot", description=__doc__)
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of traffic before the picture")
    args = parser.parse_args(argv)
    http_port, admin_port = _free_port(), _free_port()
    url, admin = f"http://127.0.0.1:{http_port}", f"http://127.0.0.1:{admin_port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RATEKEEPER_")}
    cmd = [sys.executable, "-m", "ratekeeper", "serve", "--http-port", str(http_port), "--grpc-port", "off"]
    cmd += ["--admin-port", str(admin_port)]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 30
        while not _up(url):
            if server.poll() is not None or time.monotonic() > deadline:
                print("the service did not start", file=sys.stderr)
                return 1
            time.sleep(0.1)
        stop = threading.Event()
        sender = threading.Thread(target=_traffic, args=(url, stop), daemon=True)
        sender.start()  # still sending while the picture is taken: the charts end live
        try:
            stop.wait(args.seconds)
            driver = open_chromium()
            try:
                driver.get(admin + "/")
                wait_for_page(driver)
                verdict = submit_try(driver, "auth.create_token", "10.0.0.7")
                driver.save_screenshot(str(args.out))
            finally:
                driver.quit()
        finally:
            stop.set()
            sender.join(timeout=10)
    finally:
        server.terminate()
        server.wait(timeout=20)
    print(f"{args.out}: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
