from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.real_stack.middleware import STARTPROJECT

TEMPLATES_DIR = Path(__file__).parent / "templates"


@pytest.fixture(autouse=True)
def real_project(settings: Any) -> None:
    """This package's URLs, templates and ``startproject``'s middleware list."""
    settings.ROOT_URLCONF = "tests.real_stack.urls"
    settings.LOCALE_PATHS = [Path(__file__).parent / "locale"]
    settings.MIDDLEWARE = STARTPROJECT
    settings.TEMPLATES = [
        {
            "BACKEND": "django.template.backends.django.DjangoTemplates",
            "DIRS": [TEMPLATES_DIR],
            "APP_DIRS": True,
            "OPTIONS": {
                "context_processors": [
                    "django.template.context_processors.request",
                    "django.contrib.auth.context_processors.auth",
                    "django.contrib.messages.context_processors.messages",
                ]
            },
        }
    ]
