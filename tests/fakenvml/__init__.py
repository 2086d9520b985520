"""Build the fake ``libnvidia-ml.so.1`` (fake_nvml.c) with the system C compiler.

The real pynvml binding finds the library by its SONAME, so a process that should load the
fake needs ``LD_LIBRARY_PATH`` pointing at the build folder before it starts
(``fake_nvml_env``).
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "fake_nvml.c"
LIBRARY_NAME = "libnvidia-ml.so.1"


def build_fake_nvml(gcc: str, out_dir: Path, defines: Sequence[str] = ()) -> Path:
    """Compile the fake into ``out_dir/libnvidia-ml.so.1``; returns the folder."""
    out_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            gcc,
            "-shared",
            "-fPIC",
            "-O2",
            "-Wall",
            "-Werror",
            f"-Wl,-soname,{LIBRARY_NAME}",
            *(f"-D{d}" for d in defines),
            "-o",
            str(out_dir / LIBRARY_NAME),
            str(SOURCE),
            "-lpthread",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return out_dir


def fake_nvml_env(lib_dir: Path, **settings: object) -> dict[str, str]:
    """Environment for a subprocess that loads the fake: ``gpu_count=8`` → FAKE_NVML_GPU_COUNT=8."""
    env = {"LD_LIBRARY_PATH": str(lib_dir)}
    env.update({f"FAKE_NVML_{key.upper()}": str(value) for key, value in settings.items()})
    return env


def read_call_log(path: Path) -> Mapping[str, int]:
    """The fake's FAKE_NVML_CALL_LOG file: function name → calls so far."""
    if not path.exists():
        return {}
    counts = {}
    for line in path.read_text().splitlines():
        name, _, count = line.partition(" ")
        counts[name] = int(count)
    return counts
