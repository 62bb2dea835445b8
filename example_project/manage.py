#!/usr/bin/env python
"""The example project's manage.py; run it from anywhere, e.g. the repository root.

It puts the repository root on ``sys.path`` so ``idempotency_django`` imports
without being installed, and this directory so ``example`` and ``bookings`` do.
"""

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
for path in (HERE.parent, HERE):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
