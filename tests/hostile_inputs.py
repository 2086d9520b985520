"""Hypothesis strategies for what a hostile tenant (or a broken writer) can hand a parser: bytes
that are not UTF-8, numbers no parser expects (a 400-digit integer, ``1e400``, NaN, digits that
are not ASCII: ``٣``, ``²``, ``１``), valid JSON of the wrong shape, JSON nested deeper than a
recursive parser goes, and valid documents with any one part swapped for any of the above."""  # noqa: RUF002 - the look-alike digits are the subject

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

# Texts that look like numbers to a human or to ``str.isdigit`` but not to ``int``/``float``, or
# that ``float`` takes and turns into something no counter can hold.
NUMBER_TEXTS = (
    "1" * 400,
    "9" * 5000,  # over Python's int() digit limit
    "٣",  # ARABIC-INDIC DIGIT THREE: isdigit(), int() takes it
    "١٢٣٤",
    "²",  # SUPERSCRIPT TWO: isdigit(), int() refuses it
    "１２",  # noqa: RUF001 - FULLWIDTH digits, a look-alike on purpose
    "𝟗",  # noqa: RUF001 - MATHEMATICAL BOLD DIGIT NINE, a look-alike on purpose
    "1e400",
    "-1e400",
    "1e-400",
    "NaN",
    "nan",
    "inf",
    "-Infinity",
    "-0",
    "0x10",
    "1_000",
    "1.5",
    "−1",  # noqa: RUF001 - MINUS SIGN, a look-alike on purpose
    "",
    " 7 ",
)
number_texts = st.sampled_from(NUMBER_TEXTS)
huge_integers = st.one_of(st.integers(min_value=10**300, max_value=10**400), st.just(-(10**400)), st.just(2**64))
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    huge_integers,
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    number_texts,
)
# Valid JSON values of any shape (wrong types wherever a parser expects something else).
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=24,
)
# JSON text no recursive parser should follow to the end (``json.loads`` stops at ~1000 levels).
deep_json = st.integers(min_value=500, max_value=200_000).flatmap(
    lambda depth: st.sampled_from(["[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth, "[" * depth])
)
invalid_utf8 = st.binary(max_size=300).map(lambda b: b + b"\xff\xfe\xc3\x28")


def dumps(value: Any) -> str:
    """JSON text as a careless writer would produce it: NaN and Infinity included."""
    return json.dumps(value, allow_nan=True)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a node of a JSON value (the root included)."""
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _paths(child, (*prefix, index))
    return found


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _replace(value[path[0]], path[1:], new)
    return copy


@st.composite
def mutated(draw: Callable[..., Any], template: Any, replacements: st.SearchStrategy[Any] = json_values) -> Any:
    """``template`` (a valid document) with one to three of its parts replaced by hostile values,
    or a part removed: a structure-aware fuzz that gets past a parser's first checks."""
    document = template
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(_paths(document)))
        if path and draw(st.booleans()) and isinstance(parent := _at(document, path[:-1]), dict):
            document = _replace(document, path[:-1], {k: v for k, v in parent.items() if k != path[-1]})
        else:
            document = _replace(document, path, draw(replacements))
    return document


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        value = value[step]
    return value
