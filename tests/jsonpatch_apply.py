"""A minimal RFC 6902 ``add`` applier for tests, written from the RFC (not from the webhook's code).

It resolves JSON Pointers (RFC 6901: ``~1`` is ``/``, ``~0`` is ``~``), inserts into arrays at an
index or appends with ``-``, and fails loudly on anything the RFC forbids (a missing parent, an
index past the end), so a patch that a real API server would reject fails the test.
"""

from __future__ import annotations

import copy
from typing import Any


class PatchError(ValueError):
    pass


def _tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise PatchError(f"pointer {pointer!r} does not start with /")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def apply_patch(document: Any, operations: list[dict[str, Any]]) -> Any:
    result = copy.deepcopy(document)
    for operation in operations:
        if operation.get("op") != "add":
            raise PatchError(f"unsupported op {operation.get('op')!r}")
        tokens = _tokens(operation["path"])
        if not tokens:
            raise PatchError("cannot add at the root")
        parent = result
        for token in tokens[:-1]:
            if isinstance(parent, list):
                parent = parent[int(token)]
            elif isinstance(parent, dict) and token in parent:
                parent = parent[token]
            else:
                raise PatchError(f"{operation['path']}: {token!r} does not exist")
        last = tokens[-1]
        value = copy.deepcopy(operation["value"])
        if isinstance(parent, list):
            if last == "-":
                parent.append(value)
            else:
                index = int(last)
                if not 0 <= index <= len(parent):
                    raise PatchError(f"{operation['path']}: index out of range")
                parent.insert(index, value)
        elif isinstance(parent, dict):
            parent[last] = value
        else:
            raise PatchError(f"{operation['path']}: parent is not a container")
    return result
