"""Typed values from YAML the way Go's ``yaml.v2`` ``UnmarshalStrict`` gives them to a Go struct.

exporter-toolkit reads its web configuration with ``yaml.UnmarshalStrict`` (go.yaml.in/yaml/v2)
into typed fields, and the type decides what a value means: ``X-XSS-Protection: 1`` is the
string ``"1"``, ``http2: "true"`` (quoted) is an error, ``interval: 0`` is a duration of 0
nanoseconds, a key given twice is an error. PyYAML's ``safe_load`` decides types on its own
(``1`` an int, a repeated key silently the last one), so this module reads PyYAML's node tree
(``compose``) and converts each node to the type the Go field has:

* a string field takes any scalar as written (``cert_file: 123`` is ``"123"``); a null
  (``~``, ``null``, nothing) leaves the field unset;
* a bool field takes the plain scalars of YAML 1.1 (``true``, ``yes``, ``on``, ``y``, ... and
  their negatives), nothing quoted;
* an int field takes a plain integer (decimal, ``0x``, ``0o`` or leading ``0``, ``0b``,
  underscores allowed) or a plain float, truncated;
* a ``time.Duration`` field takes a plain integer (nanoseconds) or a string Go's
  ``time.ParseDuration`` accepts (``1.5h``, ``300ms``, ``-2m3s``, ``0``);
* a struct rejects unknown and repeated keys; only the first YAML document is read.

Errors are ``YamlShapeError`` with the path of the offending key.
"""

from __future__ import annotations

import re

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode


class YamlShapeError(ValueError):
    """A document whose shape or values do not fit the Go type they are read into."""


_NULLS = frozenset({"", "~", "null", "Null", "NULL"})
_TRUE = frozenset({"y", "Y", "yes", "Yes", "YES", "on", "On", "ON", "true", "True", "TRUE"})
_FALSE = frozenset({"n", "N", "no", "No", "NO", "off", "Off", "OFF", "false", "False", "FALSE"})
_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
# Go's time.ParseDuration: [-+]?([0-9]*(\.[0-9]*)?[a-z]+)+ with these units.
_DURATION_PART = re.compile(r"([0-9]*)(?:\.([0-9]*))?(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")
_UNIT_NANOSECONDS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,
    "\u03bcs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_INT64_MAX = 2**63 - 1


def _kind(node: Node) -> str:
    if isinstance(node, MappingNode):
        return "a mapping"
    return "a list" if isinstance(node, SequenceNode) else "a scalar"


def _plain(node: ScalarNode) -> bool:
    return node.style is None


def is_null(node: Node | None) -> bool:
    return node is None or (isinstance(node, ScalarNode) and _plain(node) and node.value in _NULLS)


def document(text: str) -> Node | None:
    """The first YAML document of ``text`` as a node tree (None for an empty one)."""
    try:
        return next(iter(yaml.compose_all(text, Loader=yaml.SafeLoader)), None)
    except yaml.YAMLError as exc:
        raise YamlShapeError(f"not YAML: {' '.join(str(exc).split())[:200]}") from None


def fields(node: Node | None, where: str, allowed: set[str]) -> dict[str, Node]:
    """A struct's keys and value nodes: unknown and repeated keys are errors; null is an empty struct."""
    if node is None or is_null(node):
        return {}
    if not isinstance(node, MappingNode):
        raise YamlShapeError(f"{where} must be a mapping, not {_kind(node)}")
    found: dict[str, Node] = {}
    for key_node, value_node in node.value:
        key = string(key_node, where)
        if key not in allowed:
            raise YamlShapeError(f"{where}: unknown field {key!r} (have: {', '.join(sorted(allowed))})")
        if key in found:
            raise YamlShapeError(f"{where}: field {key!r} is set twice")
        found[key] = value_node
    return found


def string(node: Node | None, where: str) -> str:
    """A Go string field: any scalar as written; "" when absent or null."""
    if node is None or is_null(node):
        return ""
    if not isinstance(node, ScalarNode):
        raise YamlShapeError(f"{where} must be a string, not {_kind(node)}")
    return str(node.value)


def boolean(node: Node | None, where: str, default: bool) -> bool:
    if node is None or is_null(node):
        return default
    if isinstance(node, ScalarNode) and _plain(node):
        if node.value in _TRUE:
            return True
        if node.value in _FALSE:
            return False
    raise YamlShapeError(f"{where} must be true or false")


def _go_int(text: str) -> int | None:
    """strconv.ParseInt(text, 0, 64) after yaml.v2 drops underscores; None when it is not one."""
    digits = text.replace("_", "")
    sign = -1 if digits.startswith("-") else 1
    body = digits[1:] if digits[:1] in ("-", "+") else digits
    lowered = body.lower()
    try:
        if lowered.startswith("0x"):
            value = int(body[2:], 16)
        elif lowered.startswith("0b"):
            value = int(body[2:], 2)
        elif lowered.startswith("0o"):
            value = int(body[2:], 8)
        elif len(body) > 1 and body.startswith("0"):
            value = int(body[1:], 8)
        elif body.isascii() and body.isdigit():
            value = int(body, 10)
        else:
            return None
    except ValueError:
        return None
    value *= sign
    return value if -_INT64_MAX - 1 <= value <= _INT64_MAX else None


def integer(node: Node | None, where: str, default: int) -> int:
    """A Go int field: a plain integer, or a plain float truncated toward zero."""
    if node is None or is_null(node):
        return default
    if isinstance(node, ScalarNode) and _plain(node):
        value = _go_int(node.value)
        if value is not None:
            return value
        if _FLOAT.fullmatch(node.value):
            number = float(node.value)
            if -_INT64_MAX - 1 <= number <= _INT64_MAX:  # also false for inf: yaml.v2's overflow check
                return int(number)
    raise YamlShapeError(f"{where} must be a whole number")


def parse_go_duration(text: str) -> int:
    """Go's ``time.ParseDuration``, in nanoseconds; ValueError for what Go refuses."""
    rest = text
    negative = rest[:1] == "-"
    if rest[:1] in ("-", "+"):
        rest = rest[1:]
    if rest == "0":
        return 0
    if not rest:
        raise ValueError(f"invalid duration {text!r}")
    total = 0
    while rest:
        match = _DURATION_PART.match(rest)
        if match is None or not (match.group(1) or match.group(2)):
            raise ValueError(f"invalid duration {text!r}")
        whole, fraction, unit = match.group(1) or "0", match.group(2) or "", match.group(3)
        scale = _UNIT_NANOSECONDS[unit]
        total += int(whole) * scale + (int(fraction) * scale // 10 ** len(fraction) if fraction else 0)
        rest = rest[match.end() :]
        if rest[:1].isalpha():  # a unit Go does not know ("sec", "d")
            raise ValueError(f"unknown unit in duration {text!r}")
    if total > _INT64_MAX + (1 if negative else 0):
        raise ValueError(f"invalid duration {text!r}")
    return -total if negative else total


def duration_seconds(node: Node | None, where: str) -> float:
    """A Go ``time.Duration`` field, in seconds: a plain integer is nanoseconds; 0 when absent."""
    if node is None or is_null(node):
        return 0.0
    if isinstance(node, ScalarNode):
        if _plain(node) and (nanoseconds := _go_int(node.value)) is not None:
            return nanoseconds / 1e9
        try:
            return parse_go_duration(node.value) / 1e9
        except ValueError:
            pass
    raise YamlShapeError(f"{where}: not a duration like 1s, 500ms or 1h30m")


def strings(node: Node | None, where: str) -> tuple[str, ...] | None:
    """A Go []string field; None when absent or null (an empty list is not None)."""
    if node is None or is_null(node):
        return None
    if not isinstance(node, SequenceNode):
        raise YamlShapeError(f"{where} must be a list, not {_kind(node)}")
    return tuple(string(item, f"{where}[{index}]") for index, item in enumerate(node.value))


def string_map(node: Node | None, where: str) -> dict[str, str]:
    """A Go map[string]string field: repeated keys are errors."""
    if node is None or is_null(node):
        return {}
    if not isinstance(node, MappingNode):
        raise YamlShapeError(f"{where} must be a mapping, not {_kind(node)}")
    found: dict[str, str] = {}
    for key_node, value_node in node.value:
        key = string(key_node, where)
        if key in found:
            raise YamlShapeError(f"{where}: key {key!r} is set twice")
        found[key] = string(value_node, f"{where}.{key}")
    return found
