"""The admission webhook under hostile AdmissionReviews: what one review costs in time, memory
and answer size, against what reading the same body costs at all.

Each review is decided by ``WebhookService.mutate`` in a fresh process (the body read from a
file first), which reports the time, the HTTP status, the answer's and the patch's bytes, its
RSS before the call and its peak RSS during it (``VmHWM`` after resetting it through
``/proc/self/clear_refs``; ``ru_maxrss`` would start from the parent's peak). The peer, in the same kind of process,
is the floor of any webhook reading the review: ``json.loads`` of the body and ``json.dumps``
of the result. The reviews (debug files, pre-flight and readiness gate all on):

* ``4 MiB tiny GPU containers``: the review of the issue that asked for the bounds, 50k
  containers of ``{"name", "image", "resources": {"limits": {"nvidia.com/gpu": 1}}}``;
* ``4 MiB long-named containers``: 36k such containers with longer names and images, under
  the value bound, so it is parsed and then refused for its container count;
* ``env flood``: 128 GPU containers whose ``env`` set ``CCL_POD_NAME`` 640 times each (each
  one replaced: the patch would grow past its bound);
* ``7 MiB, values at the bound``: 125,000 empty objects and a 6 MiB non-ASCII string (the most
  memory a review that is parsed can take);
* ``deep nesting``: 100,000 nested arrays;
* ``largest patched pod``: 127 GPU containers (the most a pod may have, with the pre-flight);
* ``typical pod``: an 8-GPU PyTorchJob worker.

``--exporter-root`` measures the ``exporter`` package of another checkout (before/after).

    python -m bench.webhook_review [--exporter-root PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import BenchResult

REPO = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024
POD_MEMORY_LIMIT_MIB = 128  # the webhook Deployment's limit (manifests/overlays/webhook/webhook.yaml)

# One review in a fresh process: JSON out on stdout. Only the exporter is imported, so an older
# checkout's webhook (--exporter-root) runs the same measurement.
CHILD = r"""
import base64, json, sys, time

def kib(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))

def start():
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # the peak (VmHWM) starts again from the current RSS
    return kib("VmRSS")

body = open(sys.argv[2], "rb").read()
kind = sys.argv[1]
if kind == "peer":
    before = start()
    started = time.perf_counter()
    try:
        out = json.dumps(json.loads(body)).encode()
        status = 200
    except (ValueError, RecursionError):
        out, status = b"", 400
    seconds = time.perf_counter() - started
    patch = b""
else:
    from exporter.webhook.admission import WebhookConfig
    from exporter.webhook.metrics import WebhookService
    service = WebhookService(WebhookConfig(nccl_debug_file_host_path="/var/log/nccl"))
    before = start()
    started = time.perf_counter()
    try:
        answer = service.mutate(body)
        out, status = answer.body, answer.status
    except BaseException as exc:
        out, status = type(exc).__name__.encode(), 500
    seconds = time.perf_counter() - started
    patch = b""
    if status == 200:
        response = json.loads(out)["response"]
        patch = base64.b64decode(response.get("patch", ""))
print(json.dumps({"seconds": seconds, "status": status, "answer": len(out), "patch": len(patch),
                  "before_kib": before, "peak_kib": kib("VmHWM")}))
"""


def review_of(containers: list[dict[str, Any]], **extra: Any) -> bytes:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "worker-0",
            "namespace": "ml",
            "labels": {"training.kubeflow.org/job-name": "llama"},
            "annotations": {"ccl-health.io/preflight": "true", "ccl-health.io/readiness-gate": "true"},
        },
        "spec": {"containers": containers, **extra},
    }
    request = {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "kind": {"group": "", "version": "v1", "kind": "Pod"},
               "operation": "CREATE", "object": pod}  # fmt: skip
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}).encode()


def gpu_container(name: str, image: str = "x", **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": image, "resources": {"limits": {"nvidia.com/gpu": 1}}, **extra}


def filled(size: int, make: Callable[[int], dict[str, Any]]) -> list[dict[str, Any]]:
    """As many ``make(i)`` as fit in ``size`` bytes of JSON."""
    items: list[dict[str, Any]] = []
    used = 0
    while used < size:
        item = make(len(items))
        items.append(item)
        used += len(json.dumps(item)) + 2
    return items


def reviews() -> dict[str, bytes]:
    long_image = "registry.example.com/ml-platform/training-image:2026.01"
    worst = review_of([gpu_container("a")])
    flood = b'"flood":[' + b",".join([b"{}"] * 124_000) + b'],"blob":"' + ("\u00e9\U0001f600" * (6 * MIB // 6)).encode()
    return {
        "4 MiB tiny GPU containers": review_of(filled(4 * MIB - 1024, lambda i: gpu_container(f"c{i}"))),
        "4 MiB long-named containers": review_of(
            filled(4 * MIB - 1024, lambda i: gpu_container(f"container-with-a-long-name-{i:08d}", long_image))
        ),
        "env flood": review_of(
            [gpu_container(f"c{i}", env=[{"name": "CCL_POD_NAME", "value": "victim"}] * 640) for i in range(128)]
        ),
        "7 MiB, values at the bound": worst[:-2] + b"," + flood + b'"}}',
        "deep nesting": worst[:-2] + b',"deep":' + b"[" * 100_000 + b"]" * 100_000 + b"}}",
        "largest patched pod": review_of([gpu_container(f"worker-{i}") for i in range(127)]),
        "typical pod": review_of(
            [
                gpu_container("pytorch", "llama-train:2024.06", env=[{"name": "NCCL_IB_HCA", "value": "mlx5"}]),
                {"name": "log-shipper", "image": "fluent-bit:3", "resources": {"limits": {"cpu": "100m"}}},
            ]
        ),
    }


def measure(kind: str, body_file: Path, exporter_root: Path) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(exporter_root))
    done = subprocess.run(
        [sys.executable, "-c", CHILD, kind, str(body_file)],
        capture_output=True,
        text=True,
        env=env,
        cwd=exporter_root,  # ``python -c`` puts the working folder first on sys.path
        timeout=600,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run(exporter_root: Path = REPO) -> BenchResult:
    rows = []
    with tempfile.TemporaryDirectory(prefix="ccl-bench-webhook-") as tmp:
        for name, body in reviews().items():
            path = Path(tmp) / "body.json"
            path.write_bytes(body)
            ours, peer = measure("ours", path, exporter_root), measure("peer", path, exporter_root)
            rows.append((name, len(body), ours, peer))
    table = [
        "| review | body | answer | time | patch | peak RSS (growth) | peer: parse + encode | peer peak RSS (growth) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, size, ours, peer in rows:
        table.append(
            f"| {name} | {size / MIB:.2f} MiB | {ours['status']} ({ours['answer'] / 1000:,.1f} kB) "
            f"| {ours['seconds'] * 1000:,.0f} ms | {ours['patch'] / 1000:,.1f} kB "
            f"| {ours['peak_kib'] / 1024:.0f} MiB (+{(ours['peak_kib'] - ours['before_kib']) / 1024:.0f}) "
            f"| {peer['seconds'] * 1000:,.0f} ms{'' if peer['status'] == 200 else ' (fails)'} "
            f"| {peer['peak_kib'] / 1024:.0f} MiB (+{(peer['peak_kib'] - peer['before_kib']) / 1024:.0f}) |"
        )
    issue = rows[0][2]
    peak = max(ours["peak_kib"] for _, _, ours, _ in rows) / 1024
    worst_ms = max(ours["seconds"] for _, _, ours, _ in rows) * 1000
    largest_patch = max(ours["patch"] for _, _, ours, _ in rows)
    peer_issue = rows[0][3]["seconds"]
    summary = (
        f"The issue's 4 MiB review: answered {issue['status']} in {issue['seconds'] * 1000:.0f} ms "
        f"({issue['seconds'] / peer_issue:.2f}x the peer's parse and encode of it), patch "
        f"{issue['patch'] / 1000:.1f} kB. Every review: at most {worst_ms:.0f} ms, a patch of at most "
        f"{largest_patch / 1000:.0f} kB, peak RSS at most {peak:.0f} MiB of the pod's {POD_MEMORY_LIMIT_MIB} MiB."
    )
    notes = [
        "",
        "Peak RSS is the measuring process's during the call (the exporter's webhook modules imported and "
        "the body read, no HTTP server); growth is what the one review added to the RSS before it.",
        "",
        "Before the bounds (this benchmark with `--exporter-root` on a checkout of the commit before them): "
        "the 4 MiB tiny-container review answered 200 in 4,421 ms with a 45.6 MB AdmissionReview "
        "(a 34.2 MB patch) at 361 MiB peak RSS (+333); the long-named one 200 in 1,467 ms, 22.6 MB "
        "(16.9 MB patch), 219 MiB (+191); deep nesting raised RecursionError (HTTP 500, not counted).",
    ]
    return BenchResult(
        title="Admission webhook under hostile reviews",
        command="python -m bench.webhook_review",
        peer="json.loads + json.dumps of the same body (the floor of reading it), in the same kind of process",
        ratio=issue["seconds"] / peer_issue,
        summary=summary,
        markdown="\n".join(table + notes),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exporter-root", type=Path, default=REPO, help="checkout whose exporter package to measure")
    args = parser.parse_args()
    result = run(args.exporter_root)
    print(result.section())


if __name__ == "__main__":
    main()
