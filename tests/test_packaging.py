"""What a release would ship: the wheel and the sdist built from this checkout.

The sdist leaves the tests out (they need the whole repository: test settings and
apps, the example project, the docs); the wheel and the sdist both carry every file
of the package. The metadata is the one a published release would have, and the
classifiers claim only the Python and Django versions CI runs the suite on.
.ci/package-check goes further: it installs the wheel into a fresh virtualenv with
Django alone and runs ``manage.py check`` on a minimal project.
"""

from __future__ import annotations

import email
import email.message
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest

from idempotency_django import __version__

REPO_ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


def test_the_version_is_written_in_one_place_and_the_changelog_agrees() -> None:
    """pyproject.toml reads __version__; a .devN version is unreleased, so the changelog
    has one Unreleased section on top and upgrading.md calls that version unreleased."""
    assert "version" not in PYPROJECT["project"]
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "idempotency_django.__version__"
    }
    release = re.fullmatch(r"(\d+\.\d+\.\d+)(\.dev\d+)?", __version__)
    assert release, __version__
    changelog = (REPO_ROOT / "CHANGELOG.md").read_text()
    sections = re.findall(r"^## \[([^\]]+)\](.*)$", changelog, re.M)
    upgrading = (REPO_ROOT / "docs" / "upgrading.md").read_text()
    if release[2]:
        assert [name for name, _ in sections].count("Unreleased") == 1
        assert sections[0][0] == "Unreleased"
        assert f"{release[1]} (unreleased)" in upgrading
        assert f"`{__version__}`" in changelog
    else:
        assert sections[0][0] == release[1] and re.match(r" - \d{4}-\d{2}-\d{2}$", sections[0][1])
    released = {name for name, _ in sections if name != "Unreleased"}
    for heading in re.findall(r"^## From ([\d.]+) to ([\d.]+)(.*)$", upgrading, re.M):
        assert heading[0] in released, heading
        assert heading[1] in released or "(unreleased)" in heading[2], heading


def test_the_client_distribution_keeps_in_step_with_the_package() -> None:
    """idempotency-client (its own folder, its own pyproject.toml): the same license,
    version and Pythons, no dependency of its own, and the HTTP libraries' extras,
    which the Django package no longer has. .ci/client-check builds and tests it."""
    import idempotency_client

    folder = REPO_ROOT / "idempotency-client"
    client = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
    assert (folder / "LICENSE").read_text() == (REPO_ROOT / "LICENSE").read_text()
    assert client["name"] == "idempotency-client"
    assert idempotency_client.__version__ == __version__
    assert client["requires-python"] == PYPROJECT["project"]["requires-python"]
    assert classified("Programming Language :: Python :: ", client) == classified(
        "Programming Language :: Python :: "
    )
    assert client["dependencies"] == []
    assert {"requests", "httpx"} <= set(client["optional-dependencies"])
    assert not {"requests", "httpx"} & set(PYPROJECT["project"]["optional-dependencies"])
    assert not (REPO_ROOT / "idempotency_django" / "client.py").exists()


pytest.importorskip("build", reason="the build package is missing (pip install -e '.[dev]')")


def repository_files() -> list[str]:
    """The files git tracks or would track: what a fresh clone (plus this work) holds."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return [name for name in listed.stdout.splitlines() if (REPO_ROOT / name).is_file()]


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | str]:
    """Build from a copy of the repository's files, so the build leaves no egg-info here."""
    work = tmp_path_factory.mktemp("package")
    source = work / "source"
    for name in repository_files():
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, target)
    built = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(work / "dist"), "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (sdist,) = (work / "dist").glob("*.tar.gz")
    (wheel,) = (work / "dist").glob("*.whl")
    return {"sdist": sdist, "wheel": wheel, "log": built.stdout + built.stderr}


def package_files() -> set[str]:
    return {
        name
        for name in repository_files()
        if name.startswith("idempotency_django/") and "__pycache__" not in name
    }


def wheel_metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(archive.read(name))


def test_the_build_has_no_deprecation_warnings(dists: dict[str, Path | str]) -> None:
    assert "Deprecat" not in str(dists["log"]), dists["log"]


def test_the_sdist_is_the_package_without_the_tests(dists: dict[str, Path | str]) -> None:
    with tarfile.open(dists["sdist"]) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml", "PKG-INFO"} <= names
    assert package_files() <= names
    shipped_elsewhere = {
        name.split("/", 1)[0]
        for name in names
        if "/" in name and not name.startswith(("idempotency_django/", "idempotency_django."))
    }
    assert shipped_elsewhere == set(), "only the package's own folders belong in the sdist"


def test_the_wheel_has_every_file_of_the_package(dists: dict[str, Path | str]) -> None:
    with zipfile.ZipFile(dists["wheel"]) as archive:
        names = set(archive.namelist())
    assert package_files() <= names
    assert {n.split("/", 1)[0] for n in names} == {
        "idempotency_django",
        f"idempotency_django-{__version__}.dist-info",
    }
    assert f"idempotency_django-{__version__}.dist-info/licenses/LICENSE" in names


def test_the_wheel_metadata_is_a_releases(dists: dict[str, Path | str]) -> None:
    metadata = wheel_metadata(Path(dists["wheel"]))
    assert metadata["Name"] == "idempotency-django"
    assert metadata["Version"] == __version__
    assert metadata["License-Expression"] == "MIT"
    assert metadata["License-File"] == "LICENSE"
    assert not [c for c in metadata.get_all("Classifier", []) if c.startswith("License ::")]
    assert set(metadata.get_all("Provides-Extra", [])) >= {"drf", "redis", "postgres"}
    assert metadata.get_all("Requires-Dist", [])[0] == "django>=5.2"
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL", []))
    assert {"Homepage", "Documentation", "Repository", "Issues", "Changelog"} <= set(urls)
    assert metadata["Keywords"]
    assert metadata["Description-Content-Type"] == "text/markdown"


def test_twine_check_passes(dists: dict[str, Path | str]) -> None:
    pytest.importorskip("twine", reason="twine is missing (pip install -e '.[dev]')")
    checked = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", dists["sdist"], dists["wheel"]],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_classifiers_exist() -> None:
    trove = pytest.importorskip("trove_classifiers", reason="pip install -e '.[dev]'")
    assert set(PYPROJECT["project"]["classifiers"]) - trove.classifiers == set()


def classified(prefix: str, project: dict[str, Any] | None = None) -> set[str]:
    return {
        classifier.removeprefix(prefix)
        for classifier in (project or PYPROJECT["project"])["classifiers"]
        if re.fullmatch(re.escape(prefix) + r"\d+\.\d+", classifier)
    }


def test_the_classifiers_claim_what_ci_runs() -> None:
    tox = (REPO_ROOT / "tox.ini").read_text()
    matrix = (REPO_ROOT / ".ci" / "django-matrix").read_text()
    tox_django = {f"{m[0]}.{m[1]}" for m in re.findall(r"\bdj(\d)(\d)\b", tox)}
    matrix_django = set(re.findall(r'^\w+_DJANGO="django==(\d+\.\d+)', matrix, re.MULTILINE))
    assert classified("Framework :: Django :: ") == tox_django | matrix_django
    # tox's factors: py311 or py{310,311,312}
    factors = re.findall(r"\bpy(?:\{([\d,]+)\}|(\d+))", tox)
    tox_python = {f"{v[0]}.{v[1:]}" for group in factors for v in ",".join(group).split(",") if v}
    assert classified("Programming Language :: Python :: ") == tox_python
    oldest_python = min(tox_python, key=lambda v: tuple(map(int, v.split("."))))
    assert PYPROJECT["project"]["requires-python"] == f">={oldest_python}"


def test_the_readme_and_docs_state_the_supported_versions() -> None:
    """README and docs/index.md name the floors pyproject.toml admits."""
    python = PYPROJECT["project"]["requires-python"].removeprefix(">=")
    django = PYPROJECT["project"]["dependencies"][0].removeprefix("django>=")
    drf = PYPROJECT["project"]["optional-dependencies"]["drf"][0].split(">=")[1]
    assert (python, django, drf) == ("3.11", "5.2", "3.15")
    for page in ("README.md", "docs/index.md"):
        text = (REPO_ROOT / page).read_text()
        assert "## Supported versions" in text, page
        section = text.split("## Supported versions", 1)[1].split("\n## ", 1)[0]
        assert f"Python {python} or newer" in section, page
        assert f"Django {django} LTS and newer" in section, page
        assert f"Django REST framework {drf} or newer" in section, page
        assert "no longer supported" in section, page
