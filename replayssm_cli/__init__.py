"""replayssm: profile, place on the roofline and tune ReplaySSM decode kernels."""

__version__ = "0.1.0"
