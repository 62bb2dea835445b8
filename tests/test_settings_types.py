"""The settings object declares each setting with the type its reads give."""

from __future__ import annotations

import collections.abc
import types
import typing
from typing import Any

from django.test import override_settings

from idempotency_django.conf import DEFAULTS, IdempotencySettings, idempotency_settings


def fits(value: Any, declared: Any) -> bool:
    """``isinstance`` for the few kinds of type the settings are declared with."""
    origin = typing.get_origin(declared)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, member) for member in typing.get_args(declared))
    if declared is Any:
        return True
    if origin is typing.Literal:
        return value in typing.get_args(declared)
    if declared is type(None):
        return value is None
    if origin is collections.abc.Callable:
        return callable(value)
    if declared is float:
        return isinstance(value, int | float)
    base = origin or declared
    if not isinstance(value, base):
        return False
    if base in (frozenset, tuple, collections.abc.Sequence) and typing.get_args(declared):
        item = typing.get_args(declared)[0]
        return all(fits(member, item) for member in value)
    return True


def test_every_setting_is_declared_once() -> None:
    assert list(IdempotencySettings.__annotations__) == list(DEFAULTS)


@override_settings(IDEMPOTENCY={})
def test_each_default_reads_as_its_declared_type() -> None:
    declared = typing.get_type_hints(IdempotencySettings)
    wrong = {
        name: getattr(idempotency_settings, name)
        for name in DEFAULTS
        if not fits(getattr(idempotency_settings, name), declared[name])
    }
    assert wrong == {}


@override_settings(IDEMPOTENCY={"METHODS": ["post"], "REQUIRED_PATHS": [r"^/api/"]})
def test_a_users_values_read_as_the_declared_types_too() -> None:
    declared = typing.get_type_hints(IdempotencySettings)
    methods = idempotency_settings.METHODS
    assert methods == frozenset({"POST"})
    assert fits(methods, declared["METHODS"])
    assert fits(idempotency_settings.REQUIRED_PATHS, declared["REQUIRED_PATHS"])
    assert not fits(["POST"], declared["METHODS"])  # the check itself can fail


@override_settings(
    IDEMPOTENCY={"HEARTBEAT": {"INTERVAL": 2}, "MARKER_HEADERS": {"KEY_ECHO": "Idempotency-Key"}}
)
def test_the_dict_settings_read_merged_with_their_defaults() -> None:
    declared = typing.get_type_hints(IdempotencySettings)
    heartbeat, markers = idempotency_settings.HEARTBEAT, idempotency_settings.MARKER_HEADERS
    assert heartbeat is not None and (heartbeat.interval, heartbeat.max_run_time) == (2, 300)
    assert markers == ("Idempotency-Replayed", "Idempotency-Key-Ignored", "Idempotency-Key")
    assert fits(heartbeat, declared["HEARTBEAT"]) and fits(markers, declared["MARKER_HEADERS"])
    assert not fits({"INTERVAL": 2}, declared["HEARTBEAT"])  # the dict itself does not fit
