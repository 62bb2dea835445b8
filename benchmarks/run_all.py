"""Run every overhead benchmark and regenerate the docs outputs (same as ``overhead.py``).

.venv/bin/python benchmarks/run_all.py [--quick] [--skip-http] [--skip-growth] ...
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.overhead import main

if __name__ == "__main__":
    sys.exit(main())
