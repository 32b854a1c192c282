"""Validation errors as short lines for people: each setting, what is wrong, and the nearest valid values."""

from __future__ import annotations

import difflib
import re
from typing import Any

from pydantic import ValidationError

_QUOTED = re.compile(r"'([^']*)'")
_BOUNDS = {"greater_than_equal": ("ge", "smallest valid: {}"), "less_than_equal": ("le", "largest valid: {}"),
           "greater_than": ("gt", "must be above {}"), "less_than": ("lt", "must be below {}")}


def nearest_multiples(value: int, block: int) -> list[int]:
    """The multiples of `block` next to `value` (at least `block`), the nearer one first: 250, 32 -> [256, 224]."""
    lower, upper = max(block, value // block * block), max(block, -(-value // block) * block)
    return sorted({lower, upper}, key=lambda candidate: (abs(candidate - value), -candidate))


def describe_validation_error(error: ValidationError) -> list[str]:
    """One line per problem of `error`, without pydantic's type names and documentation links."""
    return [_describe(item) for item in error.errors(include_url=False)]


def _describe(item: dict[str, Any]) -> str:
    name = ".".join(str(part) for part in item["loc"])
    kind, context = item["type"], item.get("ctx") or {}
    if kind == "value_error":  # a validator's own message already names the setting and the value
        message = str(context.get("error", item["msg"]))
        return f"{name}: {message}" if name and not message.startswith(name) else message
    if kind == "unknown_keyword" or not name:
        return item["msg"]
    line = f"{name}={item['input']!r}: {item['msg'][0].lower()}{item['msg'][1:]}"
    if kind == "literal_error":
        close = difflib.get_close_matches(str(item["input"]), _QUOTED.findall(context.get("expected", "")), n=2)
        if close:
            line += f" (did you mean {' or '.join(repr(option) for option in close)}?)"
    elif kind in _BOUNDS:
        key, hint = _BOUNDS[kind]
        if kind in ("greater_than_equal", "less_than_equal"):
            line += f" ({hint.format(format(context[key], 'g'))})"
    return line
