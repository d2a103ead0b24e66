"""Mamba-2 decode kernels."""
