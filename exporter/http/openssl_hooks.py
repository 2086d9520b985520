"""Two settings of OpenSSL that Python's ``ssl`` module does not expose, reached through ctypes.

exporter-toolkit's web configuration asks for both, and Go's ``crypto/tls`` has them:

* ``accept_any_client_certificate``: ask the client for a certificate and take whichever one it
  sends without verifying its chain (Go's ``RequestClientCert`` and ``RequireAnyClientCert``).
  ``ssl.CERT_OPTIONAL`` and ``CERT_REQUIRED`` always verify what is sent, and a handshake whose
  chain does not verify fails; a verify callback that accepts every chain is the OpenSSL way.
  Python keeps a context's callback when ``verify_mode`` is set again (``_set_verify_mode`` in
  CPython's ``_ssl.c``), and ``getpeercert()`` still decodes the certificate, since the context
  verifies peers.
* ``set_groups``: the key-exchange groups a server accepts, several of them, in order of
  preference (Go's ``curve_preferences``); ``SSLContext.set_ecdh_curve`` takes one.

Both call the libssl that the ``_ssl`` extension itself is linked to (symbols are looked up
through ``_ssl``'s own handle), on the context's ``SSL_CTX``, the first field of CPython's
``_ssl._SSLContext`` after the object header. Before anything is set, the pointer is checked
against what Python reports of the same context (its options and verify mode, both read back
through libssl); on another interpreter, a libssl without the symbols or a pointer that does not
check out, ``native_context`` returns None and the caller degrades (``exporter.http.webconfig``
says how).
"""

from __future__ import annotations

import ctypes
import ssl
import sys

_VerifyCallback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p)
# int verify_callback(int preverify_ok, X509_STORE_CTX *ctx): 1 takes the chain whatever its verdict.
# A constant for the life of the process: OpenSSL keeps the bare function pointer.
_ACCEPT_EVERY_CHAIN = _VerifyCallback(lambda preverify_ok, store: 1)
_SSL_VERIFY_PEER = 0x01
_SSL_VERIFY_FAIL_IF_NO_PEER_CERT = 0x02
_SSL_CTRL_SET_GROUPS_LIST = 92  # SSL_CTX_set1_groups_list is a macro over SSL_CTX_ctrl


def _libssl() -> ctypes.CDLL | None:
    if sys.implementation.name != "cpython":
        return None
    try:
        import _ssl

        library = ctypes.CDLL(_ssl.__file__)
        library.SSL_CTX_get_options.argtypes = [ctypes.c_void_p]
        library.SSL_CTX_get_options.restype = ctypes.c_uint64
        library.SSL_CTX_get_verify_mode.argtypes = [ctypes.c_void_p]
        library.SSL_CTX_get_verify_mode.restype = ctypes.c_int
        library.SSL_CTX_set_verify.argtypes = [ctypes.c_void_p, ctypes.c_int, _VerifyCallback]
        library.SSL_CTX_set_verify.restype = None
        library.SSL_CTX_ctrl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_void_p]
        library.SSL_CTX_ctrl.restype = ctypes.c_long
    except (ImportError, OSError, AttributeError):
        return None
    return library


class NativeContext:
    """An ``ssl.SSLContext`` with its ``SSL_CTX`` at hand (see the module doc)."""

    def __init__(self, context: ssl.SSLContext, library: ctypes.CDLL, pointer: int) -> None:
        self._context = context
        self._library = library
        self._pointer = pointer

    def accept_any_client_certificate(self, required: bool) -> None:
        """Request a client certificate (``required``: and refuse a client without one), never verify it."""
        self._context.verify_mode = ssl.CERT_REQUIRED if required else ssl.CERT_OPTIONAL
        mode = _SSL_VERIFY_PEER | (_SSL_VERIFY_FAIL_IF_NO_PEER_CERT if required else 0)
        self._library.SSL_CTX_set_verify(self._pointer, mode, _ACCEPT_EVERY_CHAIN)

    def set_groups(self, groups: list[str]) -> bool:
        """Accept only ``groups`` (OpenSSL names such as ``P-256``, ``X25519``), first preferred."""
        names = ctypes.c_char_p(":".join(groups).encode())
        return bool(self._library.SSL_CTX_ctrl(self._pointer, _SSL_CTRL_SET_GROUPS_LIST, 0, names))


def native_context(context: ssl.SSLContext) -> NativeContext | None:
    """``context``'s ``SSL_CTX``, checked, or None where it cannot be reached safely."""
    library = _libssl()
    if library is None:
        return None
    import _ssl

    base = _ssl._SSLContext
    if not isinstance(context, base) or base.__basicsize__ < object.__basicsize__ + ctypes.sizeof(ctypes.c_void_p):
        return None
    pointer = ctypes.c_void_p.from_address(id(context) + object.__basicsize__).value
    if not pointer:
        return None
    if context.check_hostname:  # a client context: CERT_NONE cannot be set to check the pointer
        return None
    saved = context.verify_mode
    try:
        if library.SSL_CTX_get_options(pointer) != int(context.options):
            return None
        for mode, expected in ((ssl.CERT_OPTIONAL, 0x01), (ssl.CERT_REQUIRED, 0x03), (ssl.CERT_NONE, 0x00)):
            context.verify_mode = mode
            if library.SSL_CTX_get_verify_mode(pointer) != expected:
                return None
    finally:
        context.verify_mode = saved
    return NativeContext(context, library, pointer)
