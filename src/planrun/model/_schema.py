"""Strict JSON Schema: a schema made acceptable to strict structured output, and back;
and the portable form without validation keywords."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from planrun.core import (
    UsageError,
)

Decoder = Callable[[Any], Any]

_KEEP = frozenset(
    {
        "description",
        "enum",
        "const",
        "pattern",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minItems",
        "maxItems",
    }
)
"""Keywords strict mode accepts as they are; everything else is rebuilt or dropped."""

_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)
"""String formats strict mode accepts; other formats (``uri``, ``binary``, ...) are dropped."""

_ENCODED_NOTE = "Encoded as JSON text: this string holds a JSON value."


def _decode_json_text(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"a field sent as JSON text is not valid JSON: {exc}") from exc


def _base_type(node: Mapping[str, Any]) -> str | None:
    """The one non-null type of a node, or None when it has none or several."""
    kind = node.get("type")
    if isinstance(kind, str):
        return kind
    if isinstance(kind, list):
        rest = [k for k in kind if k != "null"]
        return rest[0] if len(rest) == 1 else None
    return None


def _allows_null(node: Mapping[str, Any]) -> bool:
    kind = node.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    return any(_allows_null(b) for b in node.get("anyOf", ()))


def _nullable(node: dict[str, Any]) -> dict[str, Any]:
    if _allows_null(node):
        return node
    if "anyOf" in node:
        return {**node, "anyOf": [*node["anyOf"], {"type": "null"}]}
    if isinstance(node.get("type"), str) and not {"enum", "const", "$ref"} & node.keys():
        return {**node, "type": [node["type"], "null"]}
    return {"anyOf": [node, {"type": "null"}]}


def _is_free_form(node: Mapping[str, Any]) -> bool:
    """An object with no fixed properties, or a schema with no type at all (``Any``)."""
    if not {"type", "$ref", "anyOf", "oneOf", "allOf", "enum", "const"} & node.keys():
        return True
    if _base_type(node) != "object":
        return False
    extra = node.get("additionalProperties")
    if "patternProperties" in node or (extra is not None and extra is not False):
        return True
    return "properties" not in node and extra is not False


def _json_types(value: Any) -> set[str]:
    if value is None:
        return {"null"}
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"number"}
    if isinstance(value, str):
        return {"string"}
    return {"array"} if isinstance(value, list) else {"object"}


@dataclass(frozen=True)
class StrictSchema:
    """A JSON Schema made acceptable to ``strict`` structured output, and its way back.

    ``schema`` is what is sent. ``decode(reply)`` turns a reply that follows it into data
    that follows the original schema: free-form values sent as JSON text (``encoded`` lists
    their paths) are parsed, ``null``\\ s for originally optional properties are dropped (so
    defaults apply), and a non-object root wrapped as ``{"value": ...}`` is unwrapped.
    """

    schema: dict[str, Any]
    encoded: tuple[str, ...] = ()
    wrapped: bool = False
    decoder: Decoder | None = field(default=None, repr=False, compare=False)

    def decode(self, reply: Any) -> Any:
        """Map a reply to the shape of the original schema."""
        value = self.decoder(reply) if self.decoder is not None else reply
        if self.wrapped and isinstance(value, dict):
            return value.get("value")
        return value


class _Strictifier:
    """Rebuilds a schema node by node, collecting a decoder for the reply alongside."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root
        self.defs: dict[str, dict[str, Any]] = {}
        self.def_decoders: dict[str, Decoder | None] = {}
        self.encoded: list[str] = []

    def resolve(self, ref: str) -> tuple[str, Mapping[str, Any]]:
        if not ref.startswith("#/"):
            raise UsageError(f"strict_schema: only local $refs are supported, got {ref!r}")
        node: Any = self.root
        for part in ref[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return ref.rsplit("/", 1)[-1], node

    def ref(self, ref: str) -> tuple[dict[str, Any], Decoder | None]:
        name, target = self.resolve(ref)
        if name not in self.def_decoders:
            self.def_decoders[name] = None  # a placeholder ends recursion
            self.defs[name], self.def_decoders[name] = self.convert(target, f"$defs/{name}")
        decoders = self.def_decoders

        def decode(value: Any) -> Any:
            inner = decoders[name]
            return inner(value) if inner is not None else value

        return {"$ref": f"#/$defs/{name}"}, decode

    def convert(self, node: Any, path: str) -> tuple[dict[str, Any], Decoder | None]:
        if node is True or not isinstance(node, Mapping):
            return self.encode({}, path)
        node = dict(node)
        all_of = node.pop("allOf", None)
        if all_of is not None:
            if len(all_of) != 1:
                return self.encode(node, path)
            node = {**all_of[0], **node}
        while "$ref" in node:
            # Strict mode refuses keywords beside a $ref: inline the target instead.
            if not _KEEP & node.keys():
                return self.ref(node["$ref"])
            _, target = self.resolve(node.pop("$ref"))
            node = {**target, **node}
        if "oneOf" in node:
            node["anyOf"] = node.pop("oneOf")
        if "anyOf" in node:
            return self.union(node, path)
        if _is_free_form(node):
            return self.encode(node, path)
        kind = _base_type(node)
        if kind == "object":
            return self.object(node, path)
        if kind == "array":
            return self.array(node, path)
        return self.scalar(node), None

    def scalar(self, node: Mapping[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in node.items() if k in _KEEP}
        if "type" in node:
            out["type"] = node["type"]
        if node.get("format") in _FORMATS:
            out["format"] = node["format"]
        return out

    def encode(self, node: Mapping[str, Any], path: str) -> tuple[dict[str, Any], Decoder]:
        self.encoded.append("/" + path)
        description = (
            f"{node['description']} ({_ENCODED_NOTE})" if node.get("description") else _ENCODED_NOTE
        )
        kind: str | list[str] = ["string", "null"] if _allows_null(node) else "string"
        return {"type": kind, "description": description}, _decode_json_text

    def object(self, node: Mapping[str, Any], path: str) -> tuple[dict[str, Any], Decoder | None]:
        required = set(node.get("required", ()))
        properties: dict[str, Any] = {}
        decoders: dict[str, Decoder] = {}
        optional: set[str] = set()
        for name, sub in node["properties"].items():
            converted, decoder = self.convert(sub, f"{path}/{name}" if path else name)
            if name not in required and not _allows_null(converted):
                converted, optional = _nullable(converted), optional | {name}
            properties[name] = converted
            if decoder is not None:
                decoders[name] = decoder
        out = self.scalar(node) | {
            "type": node["type"],
            "properties": properties,
            "required": list(properties),
            "additionalProperties": False,
        }
        if not decoders and not optional:
            return out, None

        def decode(value: Any) -> Any:
            if not isinstance(value, dict):
                return value
            return {
                key: decoders[key](item) if key in decoders and item is not None else item
                for key, item in value.items()
                if not (item is None and key in optional)
            }

        return out, decode

    def array(self, node: Mapping[str, Any], path: str) -> tuple[dict[str, Any], Decoder | None]:
        if "prefixItems" in node:
            return self.encode(node, path)
        items, decoder = self.convert(node.get("items", {}), f"{path}/*" if path else "*")
        out = self.scalar(node) | {"items": items}
        if decoder is None:
            return out, None
        item_decoder = decoder

        def decode(value: Any) -> Any:
            if not isinstance(value, list):
                return value
            return [item_decoder(v) if v is not None else v for v in value]

        return out, decode

    def union(self, node: Mapping[str, Any], path: str) -> tuple[dict[str, Any], Decoder | None]:
        branches = [self.convert(b, path) for b in node["anyOf"]]
        out: dict[str, Any] = {"anyOf": [b for b, _ in branches]}
        if node.get("description"):
            out["description"] = node["description"]
        if all(d is None for _, d in branches):
            return out, None
        # Plain branches are tried before JSON-text ones, so `str | dict[str, Any]` keeps a
        # string a string; an object goes to the first branch whose properties match its keys.
        ordered = sorted(branches, key=lambda b: b[1] is _decode_json_text)

        def decode(value: Any) -> Any:
            for schema, decoder in ordered:
                if self.accepts(schema, value):
                    return decoder(value) if decoder is not None else value
            return value

        return out, decode

    def accepts(self, schema: Mapping[str, Any], value: Any) -> bool:
        if "$ref" in schema:
            schema = self.defs.get(schema["$ref"].rsplit("/", 1)[-1], {})
        if "anyOf" in schema:
            return any(self.accepts(b, value) for b in schema["anyOf"])
        kinds = schema.get("type")
        allowed = {kinds} if isinstance(kinds, str) else set(kinds or ())
        if not allowed & _json_types(value):
            return False
        if isinstance(value, dict) and "properties" in schema:
            return set(schema["properties"]) == set(value)
        return True


def _inside_value(inner: Decoder) -> Decoder:
    def decode(reply: Any) -> Any:
        if isinstance(reply, dict) and reply.get("value") is not None:
            return {**reply, "value": inner(reply["value"])}
        return reply

    return decode


def strict_schema(model_or_schema: type[BaseModel] | Mapping[str, Any]) -> StrictSchema:
    """Make a pydantic model's (or a raw) JSON Schema acceptable to strict structured output.

    Every object gets ``additionalProperties: false`` and lists all its properties as
    required (optional ones become nullable; ``decode`` drops their ``null`` so defaults
    apply). ``$defs`` are kept (``definitions`` moved there); a ``$ref`` with sibling
    keywords and a one-element ``allOf`` are inlined; ``oneOf`` becomes ``anyOf``.
    Keywords strict mode rejects (``default``, ``title``, ``minLength``, unsupported
    ``format`` values, ...) are dropped; local validation against the original still
    enforces them.

    Free-form values (``dict[str, Any]``, ``{"type": "object"}`` without properties,
    ``Any``) cannot be expressed in strict mode. They are sent as **strings holding JSON
    text** and parsed back by ``decode``, so the rest of the schema keeps strict's
    guarantees. A non-object root is wrapped as ``{"value": ...}``.
    """
    if isinstance(model_or_schema, type) and issubclass(model_or_schema, BaseModel):
        source: Mapping[str, Any] = model_or_schema.model_json_schema()
    elif isinstance(model_or_schema, Mapping):
        source = model_or_schema
    else:
        raise UsageError(f"strict_schema needs a pydantic model or a dict, got {model_or_schema!r}")
    work = _Strictifier(source)
    schema, decoder = work.convert(source, "")
    if "$ref" in schema:
        schema = dict(work.defs[schema["$ref"].rsplit("/", 1)[-1]])
    wrapped = _base_type(schema) != "object" or "properties" not in schema
    if wrapped:
        schema = {
            "type": "object",
            "properties": {"value": schema},
            "required": ["value"],
            "additionalProperties": False,
        }
        decoder = None if decoder is None else _inside_value(decoder)
    if work.defs:
        schema = {**schema, "$defs": work.defs}
    return StrictSchema(schema, tuple(work.encoded), wrapped, decoder)


VALIDATION_KEYWORDS = frozenset(
    {
        "minItems",
        "maxItems",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "pattern",
        "format",
        "minLength",
        "maxLength",
        "contains",
        "minContains",
        "maxContains",
    }
)
"""What ``schema="portable"`` leaves out of the schema sent (some models reject them)."""

_NAMED = frozenset({"properties", "$defs", "definitions", "patternProperties"})
_LITERAL = frozenset({"enum", "const", "default", "examples", "required", "description"})


def portable_schema(schema: Any) -> Any:
    """``schema`` without :data:`VALIDATION_KEYWORDS`: what models that reject them accept.

    Fine-tuned OpenAI models and several local servers refuse ``minItems``, ``pattern``,
    ``format``, ...; the reply is still validated locally against the full schema, so the
    constraints hold all the same (a violation fails the call, or is repaired).
    Property names are never touched: a property called ``format`` stays.
    """
    if isinstance(schema, list):
        return [portable_schema(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in VALIDATION_KEYWORDS:
            continue
        if key in _NAMED and isinstance(value, Mapping):
            out[key] = {name: portable_schema(sub) for name, sub in value.items()}
        elif key in _LITERAL:
            out[key] = value
        else:
            out[key] = portable_schema(value)
    return out




# ---- the output bound a schema implies ---------------------------------------------------------

FREE_TEXT_TOKENS = 160
"""Tokens allowed for a string with no ``maxLength``, ``enum`` or ``format``."""
FREE_ITEMS = 6
"""Items allowed for an array with no ``maxItems``."""
MIN_OUTPUT_BOUND = 64
MAX_OUTPUT_BOUND = 8_192


def check_max_tokens(value: int | None, owner: str) -> int | None:
    """``value`` when it is None or a whole number >= 1; else a one-line UsageError."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 1):
        raise UsageError(f"{owner}: max_tokens must be a whole number >= 1, got {value!r}")
    return value


def output_bound(schema: Mapping[str, Any]) -> int:
    """The completion tokens a reply matching ``schema`` may need: the bound sent with it.

    Counted from the schema, not guessed from a sample: a string takes ``maxLength`` / 3
    tokens (an ``enum`` its longest value, a ``format`` a date's worth, free text
    :data:`FREE_TEXT_TOKENS`), a number 8, an array ``maxItems`` items (else
    :data:`FREE_ITEMS`), an object its keys and values, a choice its largest branch; each
    value adds its punctuation. The sum gets a quarter more for spacing the model may add, and
    lies between :data:`MIN_OUTPUT_BOUND` and :data:`MAX_OUTPUT_BOUND`.
    """
    defs = {**schema.get("definitions", {}), **schema.get("$defs", {})}
    raw = _bound(schema, defs, frozenset())
    return int(min(MAX_OUTPUT_BOUND, max(MIN_OUTPUT_BOUND, math.ceil(raw * 1.25) + 16)))


def _bound(node: Any, defs: Mapping[str, Any], seen: frozenset[str]) -> float:
    if not isinstance(node, Mapping):
        return FREE_TEXT_TOKENS
    ref = node.get("$ref")
    if isinstance(ref, str):
        name = ref.rsplit("/", 1)[-1]
        if name in seen or name not in defs:  # a recursive type: one free-text worth
            return FREE_TEXT_TOKENS
        return _bound(defs[name], defs, seen | {name})
    branches = [b for key in ("anyOf", "oneOf", "allOf") for b in node.get(key, ())]
    if branches:
        sizes = [_bound(b, defs, seen) for b in branches]
        return sum(sizes) if "allOf" in node else max(sizes)
    if "enum" in node or "const" in node:
        values = node.get("enum", [node.get("const")])
        return max((len(json.dumps(v)) for v in values), default=4) / 3 + 1
    kind = _base_type(node) or ("object" if "properties" in node else "string")
    if kind == "object":
        props = node.get("properties") or {}
        if not props:  # free-form object: as much as free text
            return FREE_TEXT_TOKENS
        return 2 + sum(len(key) / 3 + 2 + _bound(value, defs, seen)
                       for key, value in props.items())
    if kind == "array":
        items = int(node.get("maxItems", FREE_ITEMS))
        return 2 + items * (1 + _bound(node.get("items", {}), defs, seen))
    if kind == "string":
        if "maxLength" in node:
            return int(node["maxLength"]) / 3 + 2
        return 12 if "format" in node else FREE_TEXT_TOKENS
    if kind in ("integer", "number"):
        return 8
    return 2  # boolean, null


TYPICAL_TEXT_TOKENS = 24
"""Tokens a string with no ``maxLength``, ``enum`` or ``format`` is expected to take: about
one sentence (its bound, :data:`FREE_TEXT_TOKENS`, allows a paragraph)."""


def expected_output(schema: Mapping[str, Any]) -> int:
    """The completion tokens a reply matching ``schema`` is expected to take: a typical
    answer, where :func:`output_bound` counts the largest one. An ``enum`` takes its average
    value, a string half its ``maxLength`` (free text :data:`TYPICAL_TEXT_TOKENS`), an array
    half-way between its ``minItems`` and ``maxItems``, at four characters a token."""
    defs = {**schema.get("definitions", {}), **schema.get("$defs", {})}
    return max(1, math.ceil(_typical(schema, defs, frozenset())))


def _typical(node: Any, defs: Mapping[str, Any], seen: frozenset[str]) -> float:
    if not isinstance(node, Mapping):
        return TYPICAL_TEXT_TOKENS
    ref = node.get("$ref")
    if isinstance(ref, str):
        name = ref.rsplit("/", 1)[-1]
        if name in seen or name not in defs:
            return TYPICAL_TEXT_TOKENS
        return _typical(defs[name], defs, seen | {name})
    branches = [b for key in ("anyOf", "oneOf", "allOf") for b in node.get(key, ())]
    if branches:
        sizes = [_typical(b, defs, seen) for b in branches]
        return sum(sizes) if "allOf" in node else sum(sizes) / len(sizes)
    if "enum" in node or "const" in node:
        values = node.get("enum", [node.get("const")]) or [None]
        return sum(len(json.dumps(v)) for v in values) / len(values) / 4
    kind = _base_type(node) or ("object" if "properties" in node else "string")
    if kind == "object":
        props = node.get("properties") or {}
        if not props:
            return TYPICAL_TEXT_TOKENS
        return 1 + sum((len(key) + 4) / 4 + _typical(value, defs, seen)
                       for key, value in props.items())
    if kind == "array":
        items = (int(node.get("minItems", 0)) + int(node.get("maxItems", FREE_ITEMS))) / 2
        return 1 + items * (0.5 + _typical(node.get("items", {}), defs, seen))
    if kind == "string":
        if "maxLength" in node:
            return int(node["maxLength"]) / 8 + 1
        return 4 if "format" in node else TYPICAL_TEXT_TOKENS
    if kind in ("integer", "number"):
        return 2
    return 1.5  # boolean, null
