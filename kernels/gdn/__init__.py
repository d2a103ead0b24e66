"""Gated DeltaNet decode kernels: conventional, ReplaySSM and speculative, with their plain-PyTorch references."""

from replayssm_kernels.gdn.cache import ReplayCache
from replayssm_kernels.gdn.decode import accept_snapshot, decode, decode_multi
from replayssm_kernels.gdn.reference import (
    accept_ref,
    accept_snapshot_ref,
    decode_multi_ref,
    decode_ref,
    materialize_ref,
    random_inputs,
    replay_ref,
    verify_ref,
)
from replayssm_kernels.gdn.replay import materialize, replay
from replayssm_kernels.gdn.verify import accept, verify

__all__ = [
    "ReplayCache",
    "accept",
    "accept_ref",
    "accept_snapshot",
    "accept_snapshot_ref",
    "decode",
    "decode_multi",
    "decode_multi_ref",
    "decode_ref",
    "materialize",
    "materialize_ref",
    "random_inputs",
    "replay",
    "replay_ref",
    "verify",
    "verify_ref",
]
