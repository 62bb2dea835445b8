"""How large is the package? Its lines per feature area, each against its budget.

    python benchmarks/size.py

Counts the lines of every module of ``idempotency_django`` (migrations aside: Django
writes them) and sums them per feature area (:data:`AREAS`, a module's first
matching pattern). Prints one PASS/FAIL line per area against its budget (issue 35),
one for the total (about 8,000 lines, at most 10 % over), and the modules over 400
lines as a warning only: a module is split along a seam, never to meet a number.
An area over its budget is a design question. docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
from fnmatch import fnmatch

import common

PACKAGE = common.ROOT / "idempotency_django"
#: (area, budget in lines, module patterns relative to the package); first match wins.
AREAS: list[tuple[str, int, tuple[str, ...]]] = [
    ("heartbeat", 130, ("protocol/heartbeat.py",)),
    ("OpenAPI", 280, ("openapi.py", "protocol/openapi_contract.py", "ninja/openapi.py")),
    ("core protocol", 2100, ("protocol/*", "conf.py", "models.py", "signals.py", "apps.py")),
    ("encryption", 120, ("stores/encryption.py",)),
    ("testing and the store contract", 580, ("testing.py", "stores/contract.py")),
    ("checks", 280, ("checks.py", "stores/*_checks.py")),
    ("stores", 1640, ("stores/*",)),
    ("DRF", 170, ("drf/*",)),
    ("ninja", 300, ("ninja/*",)),
    # Issue 39's own budget for it: about 300 lines.
    ("GraphQL", 300, ("graphql/*",)),
    ("webhooks", 450, ("webhooks/*",)),
    ("tasks and their adapters", 380, ("tasks/*", "contrib/celery.py", "contrib/django_tasks.py")),
    (
        "admin, purge and the command",
        950,
        ("admin/*", "purge.py", "management/*", "templatetags/*"),
    ),
    ("downstream", 50, ("downstream.py",)),
    ("Prometheus", 90, ("contrib/prometheus.py",)),
    ("entry points", 470, ("*",)),
]
TOTAL_BUDGET = 8000
MODULE_WARNING = 400


def module_lines() -> dict[str, int]:
    return {
        path.relative_to(PACKAGE).as_posix(): len(path.read_text().splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
        if "migrations" not in path.parts
    }


def area_of(module: str) -> str:
    return next(name for name, _, patterns in AREAS if any(fnmatch(module, p) for p in patterns))


def measure(args: argparse.Namespace) -> None:
    lines = module_lines()
    per_area = dict.fromkeys((name for name, _, _ in AREAS), 0)
    for module, count in lines.items():
        per_area[area_of(module)] += count
    common.table(
        ["Area", "Lines", "Budget"], [[name, per_area[name], budget] for name, budget, _ in AREAS]
    )
    for name, budget, _ in AREAS:
        common.verdict(
            f"{name} within {budget:,} lines", per_area[name] <= budget, f"{per_area[name]:,}"
        )
    total = sum(lines.values())
    common.verdict(
        f"the package at about {TOTAL_BUDGET:,} lines",
        total <= TOTAL_BUDGET * 1.1,
        f"{total:,} lines in {len(lines)} modules",
    )
    large = sorted(((count, name) for name, count in lines.items() if count > MODULE_WARNING))
    for count, name in reversed(large):
        print(f"warning: {name} has {count} lines (over {MODULE_WARNING}): a seam, or a reason")


if __name__ == "__main__":
    common.run(common.parser(__doc__), measure)
