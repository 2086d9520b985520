"""Bus-bandwidth probe and pre-flight checks.

``formulas`` (nccl-tests arithmetic), ``results`` (the result file), ``runner`` (spawns the
workers), ``command`` (``ccl-exporter probe``), ``preflight`` (``ccl-exporter preflight``),
``schedule`` and ``occupancy`` (idle-time probes in ``serve``). Only ``worker``, run as its own
process, imports torch.
"""
