"""Tests of the simulated node (sim/ccl_sim), the demo and the development stack."""
