"""The request body read within bounds (exporter/webhook/body.py) and answered through
``WebhookService.mutate`` whatever the server in front let through: too large is a counted 413,
malformed (not UTF-8, not JSON as an API server writes it, too deep) a counted 400, and no body
makes ``mutate`` raise.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from exporter.webhook.admission import WebhookConfig
from exporter.webhook.body import (
    MAX_JSON_DEPTH,
    MAX_REVIEW_BYTES,
    MAX_REVIEW_VALUES,
    MalformedReview,
    ReviewTooLarge,
    parse_review,
    value_bound,
)
from exporter.webhook.metrics import WebhookService
from tests.metrics_text import value
from tests.webhook.test_webhook_admission import admission, gpu_pod

REVIEW = json.dumps(admission(gpu_pod())).encode()


def counted(service: WebhookService, decision: str) -> float:
    found = value(service.render_metrics().body.decode(), "ccl_webhook_admission_reviews_total", decision=decision)
    assert found is not None
    return found


def nested(depth: int, opener: str = "[", closer: str = "]") -> bytes:
    """A review ``depth`` levels deep in all (the review itself is level 1, its request level 2)."""
    inner = opener * (depth - 2) + ("" if opener == "[" else "0") + closer * (depth - 2)
    return (
        b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","x":'
        + inner.encode()
        + b"}}"
    )


def test_a_body_up_to_the_limit_is_read_and_one_byte_more_is_too_large() -> None:
    padded = REVIEW + b" " * (MAX_REVIEW_BYTES - len(REVIEW))
    assert len(padded) == MAX_REVIEW_BYTES and parse_review(padded)["kind"] == "AdmissionReview"
    with pytest.raises(ReviewTooLarge, match=f"over the {MAX_REVIEW_BYTES}"):
        parse_review(padded + b" ")


def test_the_limit_holds_what_an_api_server_sends() -> None:
    """An object of 3 MiB (the API server's --max-resource-write-bytes) as object and oldObject."""
    pod = gpu_pod()
    pod["metadata"]["annotations"] = {"example.com/blob": "x" * (3 * 1024 * 1024 - 1024)}
    document = admission(pod, operation="UPDATE")
    document["request"]["oldObject"] = pod
    body = json.dumps(document).encode()
    assert len(body) > 6 * 1024 * 1024
    assert parse_review(body)["request"]["operation"] == "UPDATE"


@pytest.mark.parametrize("element", [b"{}", b"[]", b"0", b'""'])
def test_more_values_than_read_are_too_large_before_parsing(element: bytes) -> None:
    """7 MiB of ``{},`` would be 2.4 million dicts (about 180 MiB): refused from the byte count."""

    def body(count: int) -> bytes:
        return REVIEW[:-2] + b',"flood":[' + b",".join([element] * count) + b"]}}"

    each = 1 + element.count(b"[") + element.count(b"{")  # its comma, and its own container
    fits = (MAX_REVIEW_VALUES - value_bound(body(0)) + 1) // each
    assert value_bound(body(fits)) <= MAX_REVIEW_VALUES < value_bound(body(fits + 1))
    assert parse_review(body(fits))["request"]["flood"] == json.loads(b"[" + b",".join([element] * fits) + b"]")
    with pytest.raises(ReviewTooLarge, match=f"over the {MAX_REVIEW_VALUES}"):
        parse_review(body(fits + 1))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=40,
)


def count_values(document: Any) -> int:
    stack, count = [document], 0
    while stack:
        node = stack.pop()
        count += 1
        stack.extend(node.values() if isinstance(node, dict) else node if isinstance(node, list) else ())
    return count


@given(json_values, st.booleans())
@settings(max_examples=300)
def test_the_value_bound_is_never_below_the_values_parsed(document: Any, compact: bool) -> None:
    text = json.dumps(document, separators=(",", ":") if compact else None, ensure_ascii=False)
    assert value_bound(text.encode()) >= count_values(document)


@pytest.mark.parametrize(("opener", "closer"), [("[", "]"), ('{"a":', "}")])
def test_nesting_to_the_limit_is_read_and_deeper_is_malformed(opener: str, closer: str) -> None:
    assert parse_review(nested(MAX_JSON_DEPTH, opener, closer))["kind"] == "AdmissionReview"
    for depth in (MAX_JSON_DEPTH + 1, 900, 5_000, 200_000):
        with pytest.raises(MalformedReview, match=f"nested deeper than {MAX_JSON_DEPTH} levels"):
            parse_review(nested(depth, opener, closer))


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (REVIEW.replace(b'"llama"', b'"ll\xe9ma"', 1), "not UTF-8"),  # Latin-1
        (REVIEW.replace(b'"llama"', b'"ll\xc0\xafma"', 1), "not UTF-8"),  # an overlong "/"
        (REVIEW.replace(b'"llama"', b'"\xed\xa0\x80"', 1), "not UTF-8"),  # a surrogate encoded in UTF-8
        (REVIEW.decode().encode("utf-16"), "not UTF-8"),  # json.loads would take it
        (REVIEW.decode().encode("utf-16-le"), "not JSON"),
        (b"\xef\xbb\xbf" + REVIEW, "not JSON"),  # a byte order mark
        (REVIEW.replace(b'"8"', b"NaN", 1), "NaN is not JSON"),
        (REVIEW.replace(b'"8"', b"-Infinity", 1), "-Infinity is not JSON"),
        (REVIEW.replace(b'"8"', b"1e400", 1), "beyond a float"),
        (REVIEW.replace(b'"8"', b"9" * 5000, 1), "not JSON"),  # over Python's int digits limit
        (REVIEW[:-1] + b',"kind":"AdmissionReview"}', "appears twice"),
        (REVIEW.replace(b'"kind": "Pod"', b'"kind": "Pod", "kind": "Pod"', 1), "appears twice"),
        (REVIEW[:-1], "not JSON"),
    ],
)
def test_what_an_api_server_never_writes_is_malformed(body: bytes, reason: str) -> None:
    with pytest.raises(MalformedReview, match=reason) as raised:
        parse_review(body)
    assert "\n" not in str(raised.value) and len(str(raised.value)) < 200


def test_json_loads_alone_would_have_taken_some_of_them() -> None:
    """The cases above are not all JSON errors: Python's parser takes these as they are."""
    for body in (
        REVIEW.decode().encode("utf-16"),
        REVIEW.replace(b'"8"', b"NaN", 1),
        REVIEW[:-1] + b',"kind":"AdmissionReview"}',
    ):
        json.loads(body)


def test_an_unpaired_surrogate_escape_is_read_and_answered_in_ascii() -> None:
    """Valid JSON text (RFC 8259 §8.2 leaves its meaning open): read, and echoed escaped."""
    pod = gpu_pod()
    pod["spec"]["containers"][0]["name"] = "\ud800"
    pod["spec"]["containers"][0]["envFrom"] = [{"configMapRef": {"name": "x"}}]
    answer = WebhookService(WebhookConfig()).mutate(json.dumps(admission(pod)).encode())
    assert answer.status == 200 and answer.body.isascii()
    assert "\ud800" in json.loads(answer.body)["response"]["warnings"][0]


def test_every_refusal_is_counted_with_its_status() -> None:
    service = WebhookService(WebhookConfig())
    cases = [
        (b"x" * (MAX_REVIEW_BYTES + 1), 413),
        (b"[" + b"{}," * MAX_REVIEW_VALUES + b"{}]", 413),
        (nested(100_000), 400),
        (nested(MAX_JSON_DEPTH + 1, '{"a":', "}"), 400),
        (b"\xff", 400),
        (REVIEW.replace(b'"8"', b"NaN", 1), 400),
        (REVIEW.replace(b"705ab4f5", b"7" * 200, 1), 400),
    ]
    for body, status in cases:
        answer = service.mutate(body)
        assert answer.status == status, (body[:40], answer)
        assert answer.content_type.startswith("text/plain") and answer.body.count(b"\n") == 1
    assert counted(service, "oversized") == 2
    assert counted(service, "malformed") == 5
    assert counted(service, "error") == 0


PIECES = [
    b"{",
    b"[",
    b"]",
    b"}",
    b",",
    b":",
    b'"',
    b"\\",
    b"\x00",
    b"\xff",
    b"NaN",
    b"1e999",
    b'"\\ud800"',
    b"-",
    b"9" * 30,
    b'"kind":"Pod",',
]


@st.composite
def mutated(draw: st.DrawFn, body: bytes) -> bytes:
    """The review with pieces of JSON syntax (and what is not) replaced, inserted or cut."""
    out = bytearray(body)
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(out)))
        choice = draw(st.sampled_from(["replace", "insert", "cut"]))
        piece = draw(st.sampled_from(PIECES))
        if choice == "replace":
            out[at : at + len(piece)] = piece
        elif choice == "insert":
            out[at:at] = piece
        else:
            del out[at : at + draw(st.integers(1, 40))]
    return bytes(out)


@given(st.one_of(st.binary(max_size=300), mutated(REVIEW)))
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_mutate_answers_any_body_and_counts_it(body: bytes) -> None:
    service = WebhookService(WebhookConfig(nccl_debug_file_host_path="/var/log/nccl"))
    answer = service.mutate(body)
    assert answer.status in (200, 400, 413)
    event(f"HTTP {answer.status}")
    if answer.status == 200:
        assert json.loads(answer.body)["response"]["allowed"] is True
    total = sum(
        counted(service, d) for d in ("mutated", "unchanged", "no_gpu", "skipped", "malformed", "oversized", "error")
    )
    assert total == 1 and counted(service, "error") == 0
