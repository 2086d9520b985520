"""Certificates for TLS tests, made with the ``openssl`` command line: a CA and certificates it signs."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import require_tool


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run([require_tool("openssl"), *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(folder: Path, name: str = "ca", subject: str = "/CN=test CA") -> None:
    """``name.key``/``name.crt``: a self-signed CA valid for two days."""
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.crt",
        "-days",
        "2",
        "-subj",
        subject,
        cwd=folder,
    )


def issue(folder: Path, name: str, subject: str, san: str, ca: str = "ca") -> None:
    """``name.key``/``name.crt`` signed by ``ca`` with subjectAltName ``san``."""
    openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        subject,
        cwd=folder,
    )
    (folder / f"{name}.ext").write_text(f"subjectAltName={san}\n")
    openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        f"{ca}.crt",
        "-CAkey",
        f"{ca}.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-out",
        f"{name}.crt",
        "-extfile",
        f"{name}.ext",
        cwd=folder,
    )


def self_signed(folder: Path, name: str, subject: str, san: str) -> None:
    """``name.key``/``name.crt``: a certificate that signs itself (its own CA), with subjectAltName ``san``."""
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.crt",
        "-days",
        "2",
        "-subj",
        subject,
        "-addext",
        f"subjectAltName={san}",
        cwd=folder,
    )
