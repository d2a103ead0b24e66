"""Measuring: the profile grid and its run, the instrumented loop and its timer, outside baselines, Nsight Compute, ceilings, quality, the whole-model step, energy."""
