"""replayssm_kernels: Triton decode kernels (conventional and ReplaySSM) for Mamba-2 and Gated DeltaNet, with plain-PyTorch references."""
