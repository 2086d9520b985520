"""Generated Python for the kubelet pod-resources v1 gRPC API (see api.proto)."""
