"""Plain Django views work when Django REST framework is not installed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_plain_django_without_drf() -> None:
    result = subprocess.run(
        [sys.executable, "tests/nodrf/project.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["drf"] is False
    assert report["runs"] == 2
    assert report["answers"] == [
        [201, None, {"run": 1}],
        [201, "true", {"run": 1}],
        [201, None, {"run": 2}],
        [201, "true", {"run": 2}],
    ]
