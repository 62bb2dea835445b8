"""The example project: bookings over DRF and plain Django, and a webhook receiver."""

import sys
from pathlib import Path

# Served by ``gunicorn --chdir example_project example.wsgi`` too: make the
# repository root importable so idempotency_django needs no installing.
_REPO_ROOT = str(Path(__file__).resolve().parent.parent.parent)
if _REPO_ROOT not in sys.path:
    sys.path.append(_REPO_ROOT)
