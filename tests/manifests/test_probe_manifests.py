"""The example manifests: every ccl-exporter command in them parses with the real CLI, pod
templates validate against the Kubernetes schema (kubernetes-validate, strict), pre-flights report
through their termination message with no hostPath, and probe results go to the hostPath the
exporter reads. PyTorchJob and JobSet are CRDs without schemas here: their pod templates are
validated as Pods, the CRD wrapper is checked for the fields used."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from exporter.commands import build_parser
from exporter.flags import DEFAULT_PROBE_RESULTS as DEFAULT_RESULTS
from exporter.probe.runner import Identity

DEFAULT_TERMINATION_LOG = "/dev/termination-log"  # the API server's default terminationMessagePath
EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"
K8S_VERSION = "1.30.0"


def documents() -> list[tuple[str, dict[str, Any]]]:
    return [
        (path.name, doc)
        for path in sorted(EXAMPLES.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def pod_templates(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    kind = doc["kind"]
    if kind == "Job":
        yield doc["spec"]["template"]
    elif kind == "PyTorchJob":
        for replica in doc["spec"]["pytorchReplicaSpecs"].values():
            yield replica["template"]
    elif kind == "JobSet":
        for replicated in doc["spec"]["replicatedJobs"]:
            yield replicated["template"]["spec"]["template"]


def exporter_containers(template: dict[str, Any]) -> list[dict[str, Any]]:
    spec = template["spec"]
    return [
        c for c in spec.get("initContainers", []) + spec["containers"] if c["image"].startswith("ccl-health-exporter")
    ]


def test_examples_exist() -> None:
    kinds = sorted(doc["kind"] for _, doc in documents())
    assert kinds == ["Job", "JobSet", "PyTorchJob", "Service"]


@pytest.mark.parametrize(("name", "doc"), documents(), ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_manifest_is_valid(name: str, doc: dict[str, Any]) -> None:
    if doc["kind"] in ("Job", "Service"):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    templates = list(pod_templates(doc))
    for template in templates:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "example", **template.get("metadata", {})},
            "spec": template["spec"],
        }
        kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    if doc["kind"] != "Service":
        assert templates and all(exporter_containers(t) for t in templates)


@pytest.mark.parametrize(
    ("name", "doc"),
    [d for d in documents() if d[1]["kind"] != "Service"],
    ids=lambda v: v if isinstance(v, str) else v["kind"],
)
def test_commands_parse_and_write_where_the_exporter_reads(name: str, doc: dict[str, Any]) -> None:
    parser = build_parser({})
    for template in pod_templates(doc):
        volumes = {v["name"]: v for v in template["spec"].get("volumes", [])}
        for container in exporter_containers(template):
            args = parser.parse_args(container["args"])  # exits (fails the test) on an unknown flag
            assert args.command in ("probe", "preflight")
            if args.command == "preflight":
                # The termination message, where the kubelet reads it; no file, no hostPath at all.
                assert args.termination_message == container.get("terminationMessagePath", DEFAULT_TERMINATION_LOG)
                assert container.get("terminationMessagePolicy", "File") == "File"
                assert not args.write_results and not [v for v in volumes.values() if "hostPath" in v]
                continue
            mount = next(m for m in container["volumeMounts"] if m["mountPath"] == args.probe_results)
            assert volumes[mount["name"]]["hostPath"]["path"] == DEFAULT_RESULTS
            assert not mount.get("readOnly", False)
            # The pod's identity from the downward API, as the exporter needs it to use the result
            # for this pod (its UID): the variables resolved as the kubelet would.
            pod_object = {"metadata.namespace": "ml", "metadata.name": "worker-0", "metadata.uid": "8c1f-uid"}
            environ = {
                e["name"]: pod_object.get(e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath"), "")
                for e in container["env"]
            }
            identity = Identity.from_env(args.source if args.command == "probe" else "preflight", environ)
            assert (identity.namespace, identity.pod, identity.pod_uid) == ("ml", "worker-0", "8c1f-uid")
            assert identity.unattributable() is None and "JOB_NAME" in environ


def _needs_torch(args: Any) -> bool:
    return bool(args.command == "probe" or getattr(args, "probe", False))


def test_commands_that_run_torch_use_the_probe_image() -> None:
    """``probe`` and ``preflight --probe`` start torch workers: only the Dockerfile's ``probe``
    target has torch. Tags follow the base kustomization's image tag."""
    base = yaml.safe_load((EXAMPLES.parent / "base" / "kustomization.yaml").read_text())
    (image,) = base["images"]
    parser = build_parser({})
    seen = set()
    for _, doc in documents():
        for template in pod_templates(doc):
            for container in exporter_containers(template):
                args = parser.parse_args(container["args"])
                want = f"{image['name']}:{image['newTag']}" + ("-probe" if _needs_torch(args) else "")
                assert container["image"] == want, f"{doc['kind']} {container['name']}: {' '.join(container['args'])}"
                seen.add(_needs_torch(args))
    assert seen == {True, False}, "the examples cover both images"


@pytest.mark.parametrize(
    ("name", "doc"),
    [d for d in documents() if d[1]["kind"] in ("PyTorchJob", "JobSet")],
    ids=lambda v: v if isinstance(v, str) else v["kind"],
)
def test_the_preflights_cost_no_pod_security_level(name: str, doc: dict[str, Any]) -> None:
    """The pods fail or pass Pod Security baseline and restricted exactly as they would without
    their pre-flight init container (no hostPath; its capabilities are the trainer's or none)."""
    from tests.pod_security import BASELINE, RESTRICTED, violations

    for template in pod_templates(doc):
        pod = {"metadata": template.get("metadata", {}), "spec": template["spec"]}
        without = {
            "metadata": pod["metadata"],
            "spec": {
                **pod["spec"],
                "initContainers": [c for c in pod["spec"]["initContainers"] if c["name"] != "ccl-preflight"],
            },
        }
        for level in (BASELINE, RESTRICTED):
            assert set(violations(pod, level)) == set(violations(without, level)), level
