"""YAML as the tests read the large files (chart renders, rule files): PyYAML's safe loader, in its
LibYAML build where PyYAML has one. The same documents, parsed many times faster: a render of the
chart carries thousands of lines of rules and dashboards in block scalars."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml

SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(text: str) -> Any:
    return yaml.load(text, Loader=SAFE_LOADER)


def load_all(text: str) -> Iterator[Any]:
    return yaml.load_all(text, Loader=SAFE_LOADER)
