"""Decoder tables derived at import time from the protocol definitions shipped in ``specs/``.

``specs/amqp-rabbitmq-0.9.1.json`` is RabbitMQ's machine-readable AMQP 0-9-1 definition (with its
extensions: confirm, basic.nack, connection.blocked, exchange.bind, update-secret); the
``specs/amqp-1.0/*.xml`` files are the type definitions of the OASIS AMQP 1.0 specification.
Nothing here is retyped from the documents: method ids, argument lists, encodings, descriptor codes
and composite field lists are all read from those files.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources

_SPEC_PACKAGE = "amqpscope.ingest"
_AMQP10_NS = {"a": "https://www.amqp.org/schema/amqp.xsd"}
AMQP10_SPEC_FILES = ("types.xml", "transport.xml", "messaging.xml", "security.xml", "transactions.xml")


# --- AMQP 0-9-1 -------------------------------------------------------------------------------


@dataclass(frozen=True)
class MethodSpec:
    """One 0-9-1 method: ``basic.publish`` is class 60 method 40 with its typed arguments."""

    class_id: int
    method_id: int
    name: str  # "class.method"
    arguments: tuple[tuple[str, str], ...]  # (argument name, domain's primitive type)
    synchronous: bool
    content: bool  # followed by a content header and body frames


@dataclass(frozen=True)
class Amqp091Spec:
    methods: Mapping[tuple[int, int], MethodSpec]
    class_names: Mapping[int, str]
    basic_properties: tuple[tuple[str, str], ...]  # (property name, primitive type), flag order
    constants: Mapping[str, int]


@cache
def amqp091() -> Amqp091Spec:
    """The 0-9-1 tables: methods by (class id, method id), basic properties, constants."""
    raw = json.loads(resources.files(_SPEC_PACKAGE).joinpath("specs/amqp-rabbitmq-0.9.1.json").read_text())
    domains = dict(raw["domains"])

    def primitive(argument: Mapping[str, str]) -> str:
        # An argument names either a primitive type or a domain that resolves to one.
        return argument.get("type") or domains[argument["domain"]]

    methods: dict[tuple[int, int], MethodSpec] = {}
    class_names: dict[int, str] = {}
    basic_properties: tuple[tuple[str, str], ...] = ()
    for cls in raw["classes"]:
        class_names[cls["id"]] = cls["name"]
        if cls["name"] == "basic":
            basic_properties = tuple((p["name"], primitive(p)) for p in cls.get("properties", []))
        for method in cls["methods"]:
            methods[(cls["id"], method["id"])] = MethodSpec(
                class_id=cls["id"],
                method_id=method["id"],
                name=f"{cls['name']}.{method['name']}",
                arguments=tuple((a["name"], primitive(a)) for a in method["arguments"]),
                synchronous=bool(method.get("synchronous", False)),
                content=bool(method.get("content", False)),
            )
    constants = {c["name"]: c["value"] for c in raw["constants"]}
    return Amqp091Spec(methods, class_names, basic_properties, constants)


# --- AMQP 1.0 ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Encoding:
    """One primitive encoding of the AMQP 1.0 type system (types.xml, section 1.6)."""

    code: int
    type_name: str  # "uint"
    name: str  # "smalluint"; the type name when the encoding has no name of its own
    category: str  # fixed | variable | compound | array
    width: int  # fixed: value bytes; variable/compound/array: bytes of the size prefix


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # a primitive, a restricted or composite type name, or "*" (any that provides `requires`)
    multiple: bool
    mandatory: bool
    default: str | None


@dataclass(frozen=True)
class Composite:
    """A described list type: a performative, a SASL frame, a section, a delivery state ..."""

    name: str
    code: int  # descriptor code as one ulong: domain << 32 | id
    symbol: str  # descriptor name, e.g. "amqp:flow:list"
    source: str  # "list" for composites; the underlying type for restricted described types
    provides: tuple[str, ...]
    fields: tuple[Field, ...]


@dataclass(frozen=True)
class Amqp10Spec:
    encodings: Mapping[int, Encoding]
    described: Mapping[int, Composite]  # by descriptor code
    described_by_symbol: Mapping[str, Composite]
    restricted: Mapping[str, str]  # restricted type -> its source type
    choices: Mapping[str, Mapping[str, str]]  # restricted type -> value -> choice name
    definitions: Mapping[str, str]  # constants such as MIN-MAX-FRAME-SIZE -> their value, as text


def _attr(element: ET.Element, name: str) -> str:
    """An attribute that every element of its kind carries in the AMQP 1.0 spec XML."""
    value = element.get(name)
    if value is None:
        raise ValueError(f"AMQP 1.0 spec: <{element.tag}> without its {name!r} attribute")
    return value


def _descriptor_code(code: str) -> int:
    domain, ident = code.split(":")
    return int(domain, 16) << 32 | int(ident, 16)


@cache
def amqp10() -> Amqp10Spec:
    """The 1.0 tables: encodings by constructor byte, described types by descriptor."""
    encodings: dict[int, Encoding] = {}
    described: dict[int, Composite] = {}
    restricted: dict[str, str] = {}
    choices: dict[str, dict[str, str]] = {}
    definitions: dict[str, str] = {}
    base = resources.files(_SPEC_PACKAGE).joinpath("specs/amqp-1.0")
    for file_name in AMQP10_SPEC_FILES:
        root = ET.fromstring(base.joinpath(file_name).read_text())
        for d in root.iterfind(".//a:definition", _AMQP10_NS):
            definitions[_attr(d, "name")] = _attr(d, "value")
        for t in root.iterfind(".//a:type", _AMQP10_NS):
            name, cls = _attr(t, "name"), _attr(t, "class")
            for e in t.iterfind("a:encoding", _AMQP10_NS):
                code = int(_attr(e, "code"), 16)
                encodings[code] = Encoding(
                    code, name, e.get("name") or name, _attr(e, "category"), int(_attr(e, "width"))
                )
            if cls == "restricted":
                restricted[name] = _attr(t, "source")
                values = {_attr(c, "value"): _attr(c, "name") for c in t.iterfind("a:choice", _AMQP10_NS)}
                if values:
                    choices[name] = values
            descriptor = t.find("a:descriptor", _AMQP10_NS)
            if descriptor is not None:
                composite = Composite(
                    name=name,
                    code=_descriptor_code(_attr(descriptor, "code")),
                    symbol=_attr(descriptor, "name"),
                    source=_attr(t, "source"),
                    provides=tuple(p.strip() for p in (t.get("provides") or "").split(",") if p.strip()),
                    fields=tuple(
                        Field(
                            name=_attr(f, "name"),
                            type=_attr(f, "type"),
                            multiple=f.get("multiple") == "true",
                            mandatory=f.get("mandatory") == "true",
                            default=f.get("default"),
                        )
                        for f in t.iterfind("a:field", _AMQP10_NS)
                    ),
                )
                described[composite.code] = composite
    by_symbol = {c.symbol: c for c in described.values()}
    return Amqp10Spec(encodings, described, by_symbol, restricted, choices, definitions)


def amqp10_primitive(type_name: str) -> str:
    """Follow restricted types down to their primitive source (``handle`` -> ``uint``)."""
    spec = amqp10()
    seen = set()
    while type_name in spec.restricted and type_name not in seen:
        seen.add(type_name)
        type_name = spec.restricted[type_name]
    return type_name
