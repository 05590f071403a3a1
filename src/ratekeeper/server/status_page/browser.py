"""Headless Chromium for the status page's screenshot command and its test.

Debian's ``chromium`` and ``chromium-driver`` (``/usr/bin/chromedriver``), driven by
selenium (the ``test`` extra; imported here only when a browser is opened). The flags
keep the browser off the network beyond the page it is pointed at.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["CHROMEDRIVER", "FLAGS", "open_chromium"]

CHROMEDRIVER = os.environ.get("RATEKEEPER_CHROMEDRIVER", "/usr/bin/chromedriver")

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,1250",
)


def open_chromium() -> Any:
    """A selenium ``WebDriver`` of a new headless Chromium; ``quit()`` it when done."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "the status page's browser needs selenium: pip install selenium",
            name=exc.name,
        ) from exc
    if not os.path.exists(CHROMEDRIVER):
        raise FileNotFoundError(f"{CHROMEDRIVER} is missing: apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    for flag in FLAGS:
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
