"""The strict base of detrkit's configs and the field types they share (devices, paths), with
error messages that name the value and suggest the closest valid keyword."""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable
from typing import Annotated, Any, ClassVar

import torch
from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator
from pydantic_core import PydanticCustomError


def default_device() -> str:
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


_DEVICE = re.compile(r"(cpu|mps|cuda)(:\d+)?")


def device_string(value: object) -> str:
    """`value` (a str or torch.device) as torch writes it; ValueError unless detrkit can run on it."""
    try:
        text = str(torch.device(value))  # type: ignore[arg-type]
    except (RuntimeError, TypeError, ValueError):
        text = ""
    if not _DEVICE.fullmatch(text):
        raise ValueError(f"device={value!r} is not a device to run on: use 'cpu', 'cuda', 'cuda:N' or 'mps'")
    return text


def path_string(value: object) -> object:
    """A pathlib.Path (any os.PathLike) as its str; anything else as it is, for the field to check."""
    return os.fspath(value) if isinstance(value, os.PathLike) else value


DeviceStr = Annotated[str, BeforeValidator(device_string)]
PathStr = Annotated[str, BeforeValidator(path_string)]


def unknown_keyword_message(unknown: Iterable[str], valid: Iterable[str], where: str) -> str:
    """Each unknown keyword with the closest valid names (difflib), and where the full list is."""
    hints = []
    for key in unknown:
        close = " or ".join(f"`{name}`" for name in difflib.get_close_matches(key, sorted(valid), n=3))
        hints.append(f"`{key}`" + (f" (did you mean {close}?)" if close else ""))
    return f"unknown keyword {', '.join(hints)}; see {where} for every accepted name"


class StrictConfig(BaseModel):
    """Unknown keys are errors that name each key and its closest valid spellings."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())
    legacy_keys: ClassVar[frozenset[str]] = frozenset()  # deprecated keywords that `_upgrade` rewrites

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:  # each unknown keyword named, with its closest valid spellings
        if not isinstance(data, dict):
            return data
        data = cls._upgrade(dict(data))
        unknown = [key for key in data if key not in cls.model_fields]
        if unknown:
            raise PydanticCustomError("unknown_keyword", unknown_keyword_message(
                unknown, cls.model_fields, _public_name(cls)))
        return data

    @classmethod
    def _upgrade(cls, data: dict[str, Any]) -> dict[str, Any]:  # deprecated keywords into current fields
        return data



def _public_name(cls: type) -> str:
    """Where users find a config class: detrkit.config.X for the classes of this package."""
    module = "detrkit.config" if cls.__module__.startswith("detrkit.config.") else cls.__module__
    return f"{module}.{cls.__qualname__}"
