"""Bus-bandwidth probe and pre-flight checks.

``formulas`` (nccl-tests arithmetic), ``runner`` (spawns the workers), ``command``
(``ccl-exporter probe``), ``preflight`` (``ccl-exporter preflight``), ``schedule`` and
``occupancy`` (idle-time probes in ``serve``). The result file they write is
``exporter.results``. Only ``worker``, run as its own process, imports torch.
"""
