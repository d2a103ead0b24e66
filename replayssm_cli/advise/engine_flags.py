"""A recommendation in the serving engines' own words: the vLLM and SGLang flags that select it, or that none does."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

# Where each engine's switches were read; the flags below are those sources' names.
VLLM_VERSION = "vLLM 0.27.1+"
VLLM_SOURCE = "vllm/config/cache.py (CacheConfig), vllm-project/vllm main at 002f10e"
SGLANG_VERSION = "SGLang main at 001067f"
SGLANG_SOURCE = "python/sglang/srt/server_args.py (ServerArgs), sgl-project/sglang main at 001067f"
# Our dtype names in the engines' spelling (vLLM's MambaDType, SGLang's --mamba-ssm-dtype choices).
DTYPE = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass
class EngineSettings:
    """How one engine selects a recommendation: its CLI flags, the same as config keys, and what it cannot select."""

    engine: str
    version: str
    source: str
    flags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    def line(self) -> str:
        said = " ".join(self.flags) if self.flags else "(nothing to set)"
        return f"{self.version}: {said}" + (f"; {'; '.join(self.missing)}" if self.missing else "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _set(s: EngineSettings, flag: str, key: str, value: Any) -> None:
    s.flags.append(flag if value is True else f"{flag} {value}")
    s.config[key] = value


def _state(s: EngineSettings, flag: str, key: str, op: str, c: Any, replay_op: str, why: str) -> bool:
    """Set the state dtype; whether the engine's ReplaySSM switches apply (else `why` is said)."""
    if c.state_dtype in DTYPE:
        _set(s, flag, key, DTYPE[c.state_dtype])
    else:
        s.missing.append(f"replayssm knows no {s.engine} switch for an {c.state_dtype} state with row scales "
                         f"({flag} as read in {s.source})")
    if getattr(c, "rounding", "nearest") == "stochastic":
        s.missing.append(f"replayssm knows no {s.engine} switch for stochastic rounding of the state")
    if c.is_replay and op != replay_op:
        s.missing.append(why)
    return c.is_replay and op == replay_op


def vllm(op: str, candidate: Any) -> EngineSettings:
    """vLLM's switches for a candidate: --mamba-ssm-cache-dtype for the state, --use-replayssm and
    --replayssm-buffer-len for a Mamba-2 ReplaySSM decode (standard decode only, per CacheConfig.use_replayssm)."""
    c = candidate
    s = EngineSettings("vllm", VLLM_VERSION, VLLM_SOURCE)
    if not _state(s, "--mamba-ssm-cache-dtype", "mamba_ssm_cache_dtype", op, c, "mamba2",
                  "vLLM's ReplaySSM switch (--use-replayssm) is for Mamba-2 layers only: no switch for Gated DeltaNet"):
        return s
    if c.draft:
        s.missing.append("vLLM's --use-replayssm covers standard decode only: no switch for a ReplaySSM speculative verify")
        return s
    _set(s, "--use-replayssm", "use_replayssm", True)
    _set(s, "--replayssm-buffer-len", "replayssm_buffer_len", c.window)
    if c.read_dtype:
        s.missing.append(f"no switch for a {c.read_dtype} read copy of the checkpoint (split precision)")
    s.missing.append("needs the Triton or FlashInfer mamba backend and mamba_cache_mode none or align")
    return s


def sglang(op: str, candidate: Any) -> EngineSettings:
    """SGLang's switches for a candidate: --mamba-ssm-dtype for the state; --enable-linear-replayssm with
    --linear-replayssm-cache-len for a GDN (linear attention) ReplaySSM decode, --enable-linear-replayssm-spec
    for its speculative verify."""
    c = candidate
    s = EngineSettings("sglang", SGLANG_VERSION, SGLANG_SOURCE)
    if not _state(s, "--mamba-ssm-dtype", "mamba_ssm_dtype", op, c, "gdn",
                  "SGLang's ReplaySSM switches are for linear-attention (GDN, KDA) layers: no switch for Mamba-2"):
        return s
    if c.draft:
        _set(s, "--enable-linear-replayssm-spec", "enable_linear_replayssm_spec", True)
    else:
        _set(s, "--enable-linear-replayssm", "enable_linear_replayssm", True)
        _set(s, "--linear-replayssm-cache-len", "linear_replayssm_cache_len", c.window)
        s.missing.append("needs the Triton linear-attn decode backend and --mamba-radix-cache-strategy no_buffer (its default)")
    if c.read_dtype:
        s.missing.append(f"no switch for a {c.read_dtype} read copy of the checkpoint (split precision)")
    return s


def settings(op: str, decisions: Sequence[Any]) -> list[dict[str, Any]]:
    """For each distinct recommendation (with the batch sizes and modes it answers), the vLLM and SGLang settings."""
    groups: dict[Any, list[Any]] = {}
    for d in decisions:
        if d.choice is not None:
            groups.setdefault(d.choice.candidate, []).append(d)
    out = []
    for cand, ds in groups.items():
        out.append({
            "label": cand.label(),
            "batches": [d.batch for d in ds],
            "modes": sorted({d.mode for d in ds}),
            "vllm": vllm(op, cand).to_dict(),
            "sglang": sglang(op, cand).to_dict(),
        })
    return out


def lines(op: str, decisions: Sequence[Any]) -> list[str]:
    """The settings as text: per distinct recommendation a heading, then one line per engine."""
    text = []
    for entry in settings(op, decisions):
        batches = ", ".join(str(b) for b in entry["batches"])
        text.append(f"{entry['label']} (batch {batches}) in the engines' own words:")
        for engine in ("vllm", "sglang"):
            text.append("- " + EngineSettings(**entry[engine]).line())
    return text
