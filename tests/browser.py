"""Headless Debian Chromium for the browser tests (never a downloaded browser)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
DOCS_IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"
#: The flags this offline machine needs: no background traffic, no sandbox as root.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def publish_screenshot(shot: Path, name: str) -> None:
    """Copy a screenshot into docs/images, when ``UPDATE_SCREENSHOTS=1`` asks for it.

    Only then: a plain test run must not rewrite files the repository tracks.
    """
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, DOCS_IMAGES / name)
