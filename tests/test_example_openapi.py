"""The example project's OpenAPI schema documents the contract, and schemathesis finds no 5xx."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.test_example_project import BASIC, PASSWORD, REPO_ROOT, example_server

pytest.importorskip("drf_spectacular")
pytest.importorskip("schemathesis")
pytestmark = pytest.mark.skipif(
    os.environ.get("TEST_DATABASE", "sqlite") != "sqlite",
    reason="runs its own server on its own SQLite file: once per CI run is enough",
)


def test_schema_documents_keys_and_schemathesis_finds_no_server_error(tmp_path: Path) -> None:
    with example_server(tmp_path) as base:
        request = urllib.request.Request(
            base + "/api/schema/?format=json", headers={"Authorization": BASIC}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            schema = json.loads(response.read())
        create = schema["paths"]["/api/bookings/"]["post"]
        header = next(p for p in create["parameters"] if p["name"] == "Idempotency-Key")
        assert header["in"] == "header" and not header.get("required", False)
        assert {"409", "503"} <= set(create["responses"])
        assert "Idempotency-Replayed" in create["responses"]["201"]["headers"]
        listing = schema["paths"]["/api/bookings/"]["get"]
        assert all(p["name"] != "Idempotency-Key" for p in listing.get("parameters", []))
        (tmp_path / "schema.json").write_text(json.dumps(schema))

        # Bounded: 25 generated cases per operation, every one sent to this local server.
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "schemathesis.cli",
                "run",
                str(tmp_path / "schema.json"),
                "--url",
                base,
                "--auth",
                f"alice:{PASSWORD}",
                "--checks",
                "not_a_server_error",
                "--max-examples",
                "25",
                "--phases",
                "fuzzing",
                "--include-path-regex",
                "^/api/bookings/",
                "--seed",
                "20261202",
                "--request-timeout",
                "30",
                "--workers",
                "1",
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
