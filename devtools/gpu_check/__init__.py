"""``scripts/gpu-check``: the exporter against a real GPU, a real NCCL and real NVML, on one machine.

One run writes a folder (``docs/gpu-check/<UTC date>/``) that says, step by step, what the
exporter's readers make of real output, and keeps that output so that a later run on a CPU
machine (``--recorded FOLDER``) repeats every analysis step on it. The modules, each used only
by those after it:

* ``report``: the steps' outcomes (OK, SKIPPED, FAILED, with the seconds each took), the time
  budget, and subprocesses that can never outlive their timeout.
* ``sources``: where the machine's CUDA, PyTorch's NCCL, an MPI and the carried source trees
  (NCCL Inspector plugin, nccl-tests) are.
* ``hardware``: our NVML collector and GPU x NIC matrix next to ``nvidia-smi``.
* ``two_hosts``: two NCCL processes on the one GPU made to look like two hosts
  (``NCCL_HOSTID``), their per-rank logs, ``ccl-exporter analyze`` on them, and what the logs show.
* ``pod_logs``: those logs laid out as CRI pod logs and read by ``ccl-exporter serve``.
* ``inspector``: the NCCL Inspector plugin built from source, its output of an all-reduce loop,
  and its records as the exporter reads them.
* ``bandwidth``: ``ccl-exporter probe`` on the NCCL backend beside nccl-tests' ``all_reduce_perf``.
* ``main``: the command line and the order of the steps.
"""
