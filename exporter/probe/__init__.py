"""The bus-bandwidth probe, behind ``ccl-exporter probe`` and ``preflight`` (``exporter.commands``).

``formulas`` (nccl-tests arithmetic), ``runner`` (spawns the workers), ``schedule`` and
``occupancy`` (idle-time probes in ``serve``). The result file they write is
``exporter.results.probe_file``. Only ``worker``, run as its own process, imports torch.
"""
