"""How large is the package? Its lines and its largest modules, against issue 26's targets.

    python benchmarks/size.py

Counts the lines of every module of ``idempotency_django`` (migrations aside: Django
writes them), prints the modules over 400 lines and two PASS/FAIL lines: the package at
about 5,400 lines (at most 10 % over), and no module over 400. docs/benchmarks.md.
"""

from __future__ import annotations

import argparse

import common

PACKAGE = common.ROOT / "idempotency_django"
TARGET_LINES = 5400
MODULE_LIMIT = 400


def module_lines() -> dict[str, int]:
    return {
        str(path.relative_to(PACKAGE)): len(path.read_text().splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
        if "migrations" not in path.parts
    }


def measure(args: argparse.Namespace) -> None:
    lines = module_lines()
    total = sum(lines.values())
    large = sorted(((count, name) for name, count in lines.items() if count > MODULE_LIMIT))
    common.table(["Module", "Lines"], [[name, count] for count, name in reversed(large)])
    print(f"{len(lines)} modules, {total} lines")
    common.verdict(
        f"the package at about {TARGET_LINES:,} lines",
        total <= TARGET_LINES * 1.1,
        f"{total:,} lines in {len(lines)} modules",
    )
    common.verdict(
        f"no module over {MODULE_LIMIT} lines",
        not large,
        f"{len(large)} over: " + ", ".join(f"{name} {count}" for count, name in large[::-1]),
    )


if __name__ == "__main__":
    common.run(common.parser(__doc__), measure)
