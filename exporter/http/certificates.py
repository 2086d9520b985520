"""When a served certificate expires: the ``notAfter`` of X.509 certificates in PEM, read from their DER.

Python's ``ssl`` loads a certificate chain into a context but has no public call that returns the
validity of a certificate it did not receive from a peer (``get_ca_certs`` lists CA certificates
only), and the ``cryptography`` package is not a dependency of the exporter's image. The one field
needed sits at a fixed place of RFC 5280's structure, so it is read here with a small DER reader::

    Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm, signature }
    TBSCertificate ::= SEQUENCE { [0] version OPTIONAL, serialNumber, signature, issuer,
                                  validity ::= SEQUENCE { notBefore Time, notAfter Time }, ... }
    Time ::= UTCTime "YYMMDDHHMMSSZ" (YY < 50: 20YY, else 19YY) | GeneralizedTime "YYYYMMDDHHMMSSZ"

Every length is checked against what holds it; anything else (a truncated block, another tag
where one is required, a time with fractions or an offset, which RFC 5280 forbids) is
``CertificateError`` with a one-line reason, never another exception.

``CertificateExpiryGauge`` exposes the value for a server (``ccl_exporter_*`` and ``ccl_webhook_*``).
"""

from __future__ import annotations

import base64
import binascii
import calendar
import re
from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

_PEM_CERTIFICATE = re.compile(rb"-----BEGIN CERTIFICATE-----\s*(.*?)-----END CERTIFICATE-----", re.DOTALL)
_SEQUENCE = 0x30
_INTEGER = 0x02
_VERSION = 0xA0  # [0] EXPLICIT
_UTC_TIME = 0x17
_GENERALIZED_TIME = 0x18
_MAX_LENGTH_OCTETS = 4  # a certificate of 4 GiB is not one
_UTC = re.compile(rb"(\d{2})(\d{2})(\d{2})(\d{2})(\d{2})(\d{2})Z")
_GENERALIZED = re.compile(rb"(\d{4})(\d{2})(\d{2})(\d{2})(\d{2})(\d{2})Z")


class CertificateError(ValueError):
    """A certificate whose notAfter cannot be read; the message is one line."""


def _element(der: bytes, at: int, end: int, tag: int, what: str) -> tuple[int, int]:
    """(start, end) of the content of the element at ``at`` (within ``end``), which must have ``tag``."""
    if at + 2 > end:
        raise CertificateError(f"{what}: truncated")
    if der[at] != tag:
        raise CertificateError(f"{what}: tag 0x{der[at]:02x}, expected 0x{tag:02x}")
    first, at = der[at + 1], at + 2
    if first < 0x80:
        length = first
    else:
        octets = first & 0x7F
        if not 0 < octets <= _MAX_LENGTH_OCTETS or at + octets > end:
            raise CertificateError(f"{what}: bad length")
        length, at = int.from_bytes(der[at : at + octets], "big"), at + octets
    if at + length > end:
        raise CertificateError(f"{what}: truncated")
    return at, at + length


def _seconds(tag: int, text: bytes) -> float:
    """Seconds since the epoch of a UTCTime or GeneralizedTime value."""
    match = (_UTC if tag == _UTC_TIME else _GENERALIZED).fullmatch(text)
    if match is None:
        raise CertificateError(f"notAfter: {text[:32]!r} is not a time RFC 5280 allows")
    year, month, day, hour, minute, second = (int(part) for part in match.groups())
    if tag == _UTC_TIME:
        year += 2000 if year < 50 else 1900
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour <= 23 and minute <= 59 and second <= 60):
        raise CertificateError(f"notAfter: {text[:32]!r} is not a date")
    return float(calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0)))


def not_after(der: bytes) -> float:
    """The ``notAfter`` of one DER certificate, in seconds since the epoch."""
    start, end = _element(der, 0, len(der), _SEQUENCE, "certificate")
    at, tbs_end = _element(der, start, end, _SEQUENCE, "tbsCertificate")
    if at < tbs_end and der[at] == _VERSION:
        at = _element(der, at, tbs_end, _VERSION, "version")[1]
    at = _element(der, at, tbs_end, _INTEGER, "serialNumber")[1]
    at = _element(der, at, tbs_end, _SEQUENCE, "signature")[1]
    at = _element(der, at, tbs_end, _SEQUENCE, "issuer")[1]
    at, validity_end = _element(der, at, tbs_end, _SEQUENCE, "validity")
    for what in ("notBefore", "notAfter"):
        if at >= validity_end or der[at] not in (_UTC_TIME, _GENERALIZED_TIME):
            raise CertificateError(f"{what}: not a UTCTime or GeneralizedTime")
        tag = der[at]
        content, at = _element(der, at, validity_end, tag, what)
    return _seconds(tag, der[content:at])


def pem_certificates(pem: bytes) -> list[bytes]:
    """The DER of every ``CERTIFICATE`` block of a PEM text, in order."""
    found = []
    for match in _PEM_CERTIFICATE.finditer(pem):
        try:
            found.append(base64.b64decode(b"".join(match.group(1).split()), validate=True))
        except (binascii.Error, ValueError):
            raise CertificateError("a CERTIFICATE block is not base64") from None
    return found


def earliest_not_after(pem: bytes) -> float:
    """When the first certificate of a served chain (the leaf, or an intermediate sent with it)
    expires: the earliest ``notAfter`` of the PEM's certificates. CertificateError when it holds
    none, or one that does not read."""
    certificates = pem_certificates(pem)
    if not certificates:
        raise CertificateError("no CERTIFICATE block")
    return min(not_after(der) for der in certificates)


class CertificateExpiryGauge:
    """A client_python collector: the gauge ``name`` at what ``expiry`` returns on each scrape (the
    certificate in force, so a renewal shows at once); no sample while it returns None."""

    def __init__(self, name: str, documentation: str, expiry: Callable[[], float | None]) -> None:
        self._name = name
        self._documentation = documentation
        self._expiry = expiry

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        seconds = self._expiry()
        if seconds is not None:
            yield GaugeMetricFamily(self._name, self._documentation, value=seconds)
