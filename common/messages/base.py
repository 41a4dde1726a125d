"""The base every message derives from, and the decorator that makes one.

A message is a frozen, slotted dataclass. Its class carries:
- ``ROUTING_KEY``: the topic it is published under. It may name fields in braces
  (``"worker.cmd.{worker_id}.run"``), which ``routing_key()`` fills in; subscribers bind the
  pattern with ``*`` in their place (see ``common.topics.binding_pattern``).
- ``SCHEMA``: its stable wire name (the envelope's ``schema``), set to the class name by
  ``@message``. Renaming a class is a wire change.
- ``VERSION``: bumped when a field changes meaning. New fields get defaults instead, so older
  readers keep working (unknown fields are ignored on decode).

Events are past tense (``JobSubmitted``), commands imperative (``RunJobs``).
"""

from __future__ import annotations

import dataclasses
import string
from typing import Any, ClassVar, TypeVar, dataclass_transform

_M = TypeVar("_M", bound="Message")


class Message:
    """Base of every message. Subclasses are made with ``@message(routing_key)``."""

    __slots__ = ()
    ROUTING_KEY: ClassVar[str]
    SCHEMA: ClassVar[str]
    VERSION: ClassVar[int] = 1
    # Field names that appear in ROUTING_KEY, computed once by @message.
    _KEY_FIELDS: ClassVar[tuple[str, ...]] = ()

    def routing_key(self) -> str:
        """The concrete routing key of this message (placeholders filled from its fields)."""
        if not self._KEY_FIELDS:
            return self.ROUTING_KEY
        return self.ROUTING_KEY.format(**{name: getattr(self, name) for name in self._KEY_FIELDS})


@dataclass_transform(frozen_default=True, kw_only_default=False)
def message(routing_key: str, *, version: int = 1):
    """Make ``cls`` a frozen, slotted message dataclass published under ``routing_key``."""

    def wrap(cls: type[_M]) -> type[_M]:
        made = dataclasses.dataclass(frozen=True, slots=True)(cls)
        fields = {f.name for f in dataclasses.fields(made)}
        key_fields = tuple(
            name for _, name, _, _ in string.Formatter().parse(routing_key) if name is not None
        )
        missing = [name for name in key_fields if name not in fields]
        if missing:
            raise TypeError(f"{cls.__name__}: routing key {routing_key!r} names unknown fields {missing}")
        made.ROUTING_KEY = routing_key
        made.SCHEMA = cls.__name__
        made.VERSION = version
        made._KEY_FIELDS = key_fields
        return made

    return wrap


@dataclass_transform(frozen_default=True)
def value(cls: type[Any]) -> type[Any]:
    """A frozen, slotted dataclass nested inside messages (not published on its own)."""
    return dataclasses.dataclass(frozen=True, slots=True)(cls)
