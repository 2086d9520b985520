"""The simulated node: a development package beside ``exporter``, never part of its wheel or image.

It writes the same trees and files the real sources read (a sysfs tree with living RDMA
counters, pod logs with NCCL output, probe result files, ...) and serves what a real node
serves (NVML, the kubelet's pod-resources socket), so the exporter runs its real code paths on
a laptop with no GPU and no NIC. Each part of the node is a ``SimPart`` of ``SimulatedNode``
(``node``); ``paths`` lays out its folder tree, ``clock`` is its time, ``resources`` hands it to
the collectors as the node's ``NodeResources``, ``control`` drives it over
``POST /-/sim/<action>``, and ``serve`` (``python -m ccl_sim serve``) runs ``ccl-exporter serve``
on it through the seam ``serve`` offers any caller (``exporter.commands.serve.ServedNode``). It depends on
``exporter``; nothing in ``exporter`` knows it exists (tests/house/test_layering.py).
"""
