"""Tests of the kustomize manifests and the Helm chart: renders, schemas, conventions."""
