"""Gated DeltaNet decode kernels."""
