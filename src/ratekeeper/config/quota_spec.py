"""A rule's ``quota:`` field: a provider named by its import path, and the ``Quota`` options.

``quota: billing.limits:lookup`` (or ``billing.limits.lookup``), or a mapping
``{provider: billing.limits:lookup, ttl: 30, ...}`` with the keyword options of
``ratekeeper.quota.Quota``. The provider is imported when the file is loaded, so a wrong
path is a problem of the file, not a failure at the first request.
"""

from __future__ import annotations

import importlib
from typing import Any

from ratekeeper.config.checks import check_fields, type_name
from ratekeeper.config.problems import Problems
from ratekeeper.config.yamlfile import YamlMap
from ratekeeper.errors import ConfigurationError
from ratekeeper.quota import Quota

__all__ = ["QUOTA_FIELDS", "check_quota", "import_object"]

QUOTA_FIELDS = ("provider", "ttl", "retry_after_error", "max_keys", "max_pending", "workers")
_FORMS = "'package.module:function' or 'package.module.function'"


def import_object(path: str) -> Any:
    """The object at ``package.module:attr.attr`` or ``package.module.attr``; ``ImportError`` otherwise."""
    if ":" in path:
        module_name, _, attrs = path.partition(":")
    else:
        module_name, _, attrs = path.rpartition(".")
    if not module_name or not attrs:
        raise ImportError(f"{path!r} is not a dotted path to an object")
    obj: Any = importlib.import_module(module_name)
    for attr in attrs.split("."):
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            raise ImportError(f"module {module_name!r} has no {attrs!r}") from None
    return obj


def check_quota(value: Any, line: int, problems: Problems) -> Quota | None:
    options: dict[str, Any] = {}
    if isinstance(value, str):
        target, target_line = value, line
    elif isinstance(value, YamlMap):
        check_fields(value, QUOTA_FIELDS, "quota", problems)
        if "provider" not in value:
            problems.add(line, f"quota needs a provider: {_FORMS}")
            return None
        target, target_line = value["provider"], value.line_at("provider")
        options = {k: v for k, v in value.items() if k in QUOTA_FIELDS and k != "provider"}
        if len(options) + 1 != len(value):
            return None
        for key, option in options.items():
            if isinstance(option, bool):
                problems.add(value.line_at(key), f"quota {key} must be a number, got {type_name(option)}")
                return None
    else:
        problems.add(line, f"quota must be {_FORMS} or a mapping with provider, got {type_name(value)}")
        return None
    if not isinstance(target, str):
        problems.add(target_line, f"quota provider must be {_FORMS}, got {type_name(target)}")
        return None
    try:
        provider = import_object(target)
    except Exception as exc:  # noqa: BLE001 - importing user code may raise anything; it is a problem of the file
        problems.add(target_line, f"cannot import quota provider {target!r} ({exc}); write {_FORMS}")
        return None
    try:
        return Quota(provider, **options)
    except ConfigurationError as exc:
        problems.add(line, str(exc))
        return None
