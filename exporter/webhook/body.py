"""The AdmissionReview request body, read within bounds: strict JSON, never deeper, larger or more
numerous than what an API server sends.

An API server writes an object of at most 3 MiB (``--max-resource-write-bytes``) and an
AdmissionReview carries ``object`` and ``oldObject`` plus its envelope, so ``MAX_REVIEW_BYTES``
is 7 MiB, the cap controller-runtime's webhooks use. Bytes alone do not bound memory: 7 MiB of
``{},{},...`` are 2.4 million dicts, about 180 MiB once parsed, so the values a body can hold are
counted before parsing (``MAX_REVIEW_VALUES``, an upper bound read from the bytes in C: each
value but the first follows a ``,`` or opens its container's ``[``/``{``). Both refusals raise
``ReviewTooLarge`` (HTTP 413).

What the API server's Go encoder never writes is ``MalformedReview`` (HTTP 400): bytes that are
not UTF-8 (RFC 8259 §8.1; Python would otherwise guess UTF-16 or UTF-32), a byte order mark,
``NaN`` or ``Infinity`` or a number beyond a float, a key twice in one object (which of the two
the API server meant cannot be known), nesting deeper than ``MAX_JSON_DEPTH`` (a Pod is about
fifteen levels below the review; deeper input would otherwise exhaust the recursion limit of the
parser or of anything that later copies or encodes a part of it).
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_REVIEW_BYTES = 7 * 1024 * 1024
# About 30 MiB of parsed objects at worst; a 3 MiB Pod of realistic content holds a few tens of
# thousands of values (a container with 200 variables is about 700).
MAX_REVIEW_VALUES = 250_000
# The deepest Pod field (managedFields' fieldsV1 of a node affinity's match expression) is about
# twenty levels below the AdmissionReview.
MAX_JSON_DEPTH = 64
MAX_UID_CHARS = 128  # an object uid is a 36-character UUID


class MalformedReview(ValueError):
    """The body is not an AdmissionReview v1 request as an API server sends it; one line."""


class ReviewTooLarge(ValueError):
    """The body is larger than any AdmissionReview an API server sends; one line."""


def value_bound(body: bytes) -> int:
    """At least the number of JSON values in ``body`` (objects, arrays, keys' values, elements)."""
    return 1 + body.count(b",") + body.count(b"[") + body.count(b"{")


def parse_review(body: bytes) -> dict[str, Any]:
    """The body as a JSON object; ``ReviewTooLarge`` or ``MalformedReview`` otherwise."""
    if len(body) > MAX_REVIEW_BYTES:
        raise ReviewTooLarge(f"body of {len(body)} bytes is over the {MAX_REVIEW_BYTES} an API server sends")
    if (values := value_bound(body)) > MAX_REVIEW_VALUES:
        raise ReviewTooLarge(f"body holds up to {values} JSON values, over the {MAX_REVIEW_VALUES} read")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedReview(f"body is not UTF-8 (byte {exc.start})") from None
    try:
        document = json.loads(text, object_pairs_hook=_object, parse_constant=_constant, parse_float=_float)
    except RecursionError:
        raise MalformedReview(f"body is nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, and what the hooks raise
        raise MalformedReview(f"body is not JSON: {str(exc).splitlines()[0][:120]}") from None
    if not isinstance(document, dict):
        raise MalformedReview("body is not a JSON object")
    if _deeper_than(document, MAX_JSON_DEPTH):
        raise MalformedReview(f"body is nested deeper than {MAX_JSON_DEPTH} levels")
    return document


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"key {json.dumps(key)[:64]} appears twice in one object")
            seen.add(key)
    return found


def _constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def _float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"number {text[:32]} is beyond a float")
    return number


def _deeper_than(document: object, limit: int) -> bool:
    """True when containers nest more than ``limit`` levels (the document itself is level 1)."""
    stack: list[tuple[object, int]] = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False
