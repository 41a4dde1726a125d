"""The wire format: msgpack of an envelope around a message's fields.

Wire form (a msgpack map; short keys because every message pays for them)::

    {"schema": "JobSubmitted", "ver": 1, "id": "<message id>", "cid": "<correlation id>" | nil,
     "src": "<source service>", "at": <sent-at seconds>, "body": {<fields>}}

Decoding is strict, and every failure is one ``DecodeError`` whose reason says what was wrong:
the size limit is checked before unpacking; ExtTypes (and msgpack timestamps) are refused; string,
binary, array and map lengths are bounded by the limits; the schema must be registered; required
fields must be present with the right types; floats must be finite. Unknown fields are ignored so
that newer senders can add fields without breaking older readers.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgpack

from common.errors import DecodeError, EncodeError
from common.messages.base import Message
from common.schema import Decoder, Encoder, FieldError, compile_dataclass
from common.topics import MESSAGE_TYPES

#: Default ceiling on an encoded message. RabbitMQ's own limit (max_message_size) is set to the
#: same figure in deploy/; the codec checks it before unpacking anything.
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class CodecLimits:
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_str_bytes: int = 64 * 1024  # any one string (ids, reasons, commands)
    max_items: int = 256 * 1024  # any one array or map


@dataclasses.dataclass(frozen=True, slots=True)
class Envelope:
    """Who sent a message, when, and what it answers. ``sent_at_s`` is on the sender's clock."""

    message_id: str
    schema: str
    version: int
    source: str
    sent_at_s: float
    correlation_id: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Decoded:
    envelope: Envelope
    message: Message


def new_message_id() -> str:
    return uuid.uuid4().hex


def id_sequence() -> Callable[[], str]:
    """Message ids that are unique across processes but cheap: a random prefix and a counter."""
    prefix = uuid.uuid4().hex[:12]
    counter = itertools.count(1)
    return lambda: f"{prefix}-{next(counter)}"


class Codec:
    """Encodes and decodes the registered message types under the given limits."""

    def __init__(self, types: Iterable[type[Message]] = MESSAGE_TYPES, limits: CodecLimits = CodecLimits()) -> None:
        self.limits = limits
        self._by_schema: dict[str, tuple[type[Message], Encoder, Decoder]] = {}
        for cls in types:
            if cls.SCHEMA in self._by_schema:
                raise ValueError(f"duplicate message schema {cls.SCHEMA!r}")
            enc, dec = compile_dataclass(cls)
            self._by_schema[cls.SCHEMA] = (cls, enc, dec)

    # -- encode ---------------------------------------------------------------------------------

    def validate(self, message: Message) -> None:
        """Raise EncodeError if ``message`` could not be encoded (about 1 us: no bytes are made).

        The in-memory bus hands messages over as objects; this keeps it as strict as a wire
        (all but the size limit, which only the bytes can tell).
        """
        self._body(message)

    def _body(self, message: Message) -> tuple[type[Message], dict[str, Any]]:
        entry = self._by_schema.get(type(message).SCHEMA) if isinstance(message, Message) else None
        if entry is None or entry[0] is not type(message):
            raise EncodeError(f"{type(message).__name__} is not a registered message type")
        cls, enc, _ = entry
        try:
            return cls, enc(message)
        except FieldError as e:
            raise EncodeError(e.describe(cls.SCHEMA)) from None

    def encode(
        self,
        message: Message,
        *,
        source: str,
        sent_at_s: float,
        message_id: str | None = None,
        correlation_id: str | None = None,
    ) -> bytes:
        """The wire bytes of ``message``. EncodeError names the field that cannot be sent."""
        cls, body = self._body(message)
        if not math.isfinite(sent_at_s):
            raise EncodeError(f"sent_at_s is not finite ({sent_at_s})")
        wire = {
            "schema": cls.SCHEMA,
            "ver": cls.VERSION,
            "id": message_id or new_message_id(),
            "cid": correlation_id,
            "src": source,
            "at": float(sent_at_s),
            "body": body,
        }
        data = msgpack.packb(wire, use_bin_type=True)
        if len(data) > self.limits.max_body_bytes:
            raise EncodeError(
                f"{cls.SCHEMA}: encoded size {len(data)} bytes exceeds the limit of {self.limits.max_body_bytes}"
            )
        return data

    # -- decode ---------------------------------------------------------------------------------

    def decode(self, data: Any) -> Decoded:
        """Envelope and message from wire bytes; DecodeError (with a reason) for anything else."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise DecodeError(f"body is {type(data).__name__}, not bytes")
        size = len(data)
        if size > self.limits.max_body_bytes:
            raise DecodeError(f"body too large: {size} bytes > limit {self.limits.max_body_bytes}")
        if size == 0:
            raise DecodeError("empty body")
        lim = self.limits
        try:
            wire = msgpack.unpackb(
                data,
                raw=False,
                strict_map_key=True,
                max_str_len=lim.max_str_bytes,
                max_bin_len=lim.max_str_bytes,
                max_array_len=lim.max_items,
                max_map_len=lim.max_items,
                max_ext_len=0,
            )
        except DecodeError:
            raise
        except ValueError as e:
            if "max_ext_len" in str(e):  # every ext type, timestamps included, has length > 0
                raise DecodeError("msgpack ext types (timestamps included) are not allowed") from None
            raise DecodeError(f"not valid msgpack (ValueError: {str(e)[:200]})") from None
        except Exception as e:  # msgpack raises many unrelated types; all mean "not our format"
            detail = f"{type(e).__name__}: {str(e)[:200]}" if str(e) else type(e).__name__
            raise DecodeError(f"not valid msgpack ({detail})") from None
        return self._from_wire(wire)

    def _from_wire(self, wire: Any) -> Decoded:
        if type(wire) is not dict:
            raise DecodeError(f"envelope: expected map, got {type(wire).__name__}")
        schema = _envelope_field(wire, "schema", str)
        entry = self._by_schema.get(schema)
        if entry is None:
            raise DecodeError(f"envelope: unknown schema {schema[:64]!r}")
        version = _envelope_field(wire, "ver", int)
        if version < 1:
            raise DecodeError(f"envelope: version must be >= 1, got {version}")
        message_id = _envelope_field(wire, "id", str)
        if not message_id:
            raise DecodeError("envelope: empty message id")
        source = _envelope_field(wire, "src", str)
        sent_at = wire.get("at")
        if type(sent_at) not in (int, float) or not math.isfinite(sent_at):
            raise DecodeError("envelope: 'at' must be a finite number")
        cid = wire.get("cid")
        if cid is not None and type(cid) is not str:
            raise DecodeError("envelope: 'cid' must be a string or nil")
        cls, _, dec = entry
        try:
            message = dec(wire.get("body"))
        except FieldError as e:
            raise DecodeError(e.describe(schema)) from None
        except (TypeError, ValueError) as e:  # a dataclass __post_init__ refusing a value
            raise DecodeError(f"{schema}: {e}") from None
        envelope = Envelope(message_id, schema, version, source, float(sent_at), cid)
        return Decoded(envelope, message)


def _envelope_field(wire: Mapping[str, Any], key: str, kind: type) -> Any:
    if key not in wire:
        raise DecodeError(f"envelope: missing field {key!r}")
    v = wire[key]
    if type(v) is not kind:
        raise DecodeError(f"envelope: {key!r} must be {kind.__name__}, got {type(v).__name__}")
    return v


#: The codec of every message type with default limits; services share it.
DEFAULT_CODEC = Codec()
