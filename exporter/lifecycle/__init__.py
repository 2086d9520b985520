"""The lifecycle hooks of ``serve``: what this node's exporter knows, written where Kubernetes acts on it.

``decisions`` is pure (verdicts, pre-flight results and RDMA ports in; the pod condition
``ccl-health.io/fabric-ready``, the pod Events and the node condition ``CclFabricDegraded`` out);
``writes`` talks to the API server (status patches and Events, with backoff); ``controller``
ties them to the NCCL verdict feed, the pod list and the node's files. They run behind the
``lifecycle`` collector's opt-in flags (``exporter.collectors.lifecycle``).
"""
