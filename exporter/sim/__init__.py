"""The simulated node behind ``ccl-exporter serve --simulate``.

It writes the same trees and files the real sources read (a sysfs tree with living RDMA
counters, pod logs with NCCL output, ...), so the exporter runs its real code paths on a
laptop with no GPU and no NIC. Each part of the node is a ``SimPart``; later parts (NVML,
pod logs, probe results) plug into ``SimulatedNode`` the same way.
"""
