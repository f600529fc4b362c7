"""Debian's Chromium for the browser tests (driven by Playwright; its own browser download
cannot work here)."""

from __future__ import annotations

from pathlib import Path

import pytest

import debian

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


def chromium() -> str:
    """Debian's chromium, installed with apt-get where it is missing and we are root."""
    path = Path("/usr/bin/chromium")
    if not path.exists():
        debian.install("chromium")
    if not path.exists():
        pytest.skip("SKIPPED LOUDLY: this browser test needs Debian's chromium at "
                    "/usr/bin/chromium; install it with `apt-get install -y chromium` (as root)")
    return str(path)


def need_playwright() -> None:
    pytest.importorskip("playwright.sync_api", reason="SKIPPED LOUDLY: the browser tests need "
                        "the playwright Python package (pip install playwright; it drives "
                        "Debian's chromium, not browsers of its own)")
