"""A rollout gate: thresholds set in advance that a plan must meet, against results from the traffic's own GPU, driver
and software."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from replayssm_cli.errors import UserError

EXIT_GATE_FAILED = 1
KEYS = {
    "min-gain": "practical: the traffic-weighted decode tokens/s gain is at least this (e.g. 1.05)",
    "min-gain-lo": "statistical: the gain's pessimistic bound (every time at its interval's end) exceeds this (default 1.0)",
    "quality-margin": "every cohort's error budget over its error at its generation lengths is at least this (e.g. 2)",
    "memory-headroom": "every cohort's peak leaves at least this share of the memory budget free (e.g. 0.1 or 10%)",
}
HINT = "e.g. --gate min-gain=1.05,quality-margin=2,memory-headroom=10%; keys: " + ", ".join(KEYS)
ENV_FIELDS = ("gpu", "driver", "torch", "triton")


@dataclass(frozen=True)
class Gate:
    """The thresholds; None where not set."""

    min_gain: float | None = None
    min_gain_lo: float | None = None
    quality_margin: float | None = None
    memory_headroom: float | None = None

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self.min_gain, self.min_gain_lo, self.quality_margin, self.memory_headroom))


def parse(specs: Iterable[str] | None) -> Gate:
    """`KEY=VALUE[,KEY=VALUE]`, repeatable, into a Gate; min-gain alone also sets the statistical floor at 1."""
    values: dict[str, float] = {}
    for spec in specs or []:
        for part in (p.strip() for p in spec.split(",")):
            if not part:
                continue
            key, eq, raw = part.partition("=")
            key = key.strip()
            if not eq or key not in KEYS:
                raise UserError(f"--gate {part!r} is not a threshold", HINT)
            raw = raw.strip()
            try:
                value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
            except ValueError:
                raise UserError(f"--gate {key}={raw!r} is not a number", HINT) from None
            if key == "memory-headroom":
                if not 0 <= value < 1:
                    raise UserError(f"--gate memory-headroom={raw} must be a share from 0 to below 1 (or a percentage)", HINT)
            elif not value > 0:
                raise UserError(f"--gate {key}={raw} must be positive", HINT)
            values[key.replace("-", "_")] = value
    if "min_gain" in values and "min_gain_lo" not in values:
        values["min_gain_lo"] = 1.0
    return Gate(**values)


@dataclass
class Target:
    """The environment the traffic is served in: from options, else from the traffic file's metadata."""

    gpu: str | None = None
    driver: str | None = None
    torch: str | None = None
    triton: str | None = None
    from_where: dict[str, str] = field(default_factory=dict)

    @classmethod
    def resolve(cls, options: dict[str, str | None], metadata: dict[str, Any]) -> "Target":
        t = cls()
        for key in ENV_FIELDS:
            if options.get(key):
                setattr(t, key, str(options[key]))
                t.from_where[key] = f"--{key}"
            elif metadata.get(key):
                setattr(t, key, str(metadata[key]))
                t.from_where[key] = "the traffic file"
        return t


def _environment_of(env: dict[str, Any]) -> dict[str, str | None]:
    gpu = env.get("gpu") if isinstance(env.get("gpu"), dict) else {}
    return {"gpu": gpu.get("name") or env.get("device_name"), "driver": gpu.get("driver") or env.get("driver"),
            "torch": env.get("torch"), "triton": env.get("triton")}


def _same_gpu(a: str, b: str) -> bool:
    from replayssm_cli.model import gpus

    if a.strip().lower() == b.strip().lower():
        return True
    sa, sb = gpus.match_spec(a), gpus.match_spec(b)
    if sa is None and a.lower() in gpus.gpu_keys():
        sa = gpus.load_gpu(a.lower())
    return sa is not None and sb is not None and sa.key == sb.key


def _same_version(target: str, have: str) -> bool:
    """`2.11` matches 2.11.0 and 2.11.0+cu130; every component the target names must agree."""
    want = target.replace("+", ".").split(".")
    got = have.replace("+", ".").split(".")
    return got[: len(want)] == want


def check_environment(target: Target, files: Iterable[tuple[str, dict[str, Any]]]) -> list[str]:
    """Refuse (UserError) results from another GPU, driver, torch or triton than the target's; returns the fields the
    target does not name, which go unchecked."""
    if not target.gpu:
        raise UserError("the gate needs the GPU the traffic is served on",
                        "pass --gpu NAME (e.g. --gpu h200), or record it with `vllm bench serve --metadata gpu=NAME`")
    for label, env in files:
        have = _environment_of(env)
        for key in ENV_FIELDS:
            want = getattr(target, key)
            if not want:
                continue
            got = have[key]
            if not got:
                raise UserError(f"the gate cannot compare: {label} does not record its {key}",
                                f"pass --results measured with this version of replayssm on the target {target.gpu}")
            same = _same_gpu(want, got) if key == "gpu" else (got == want if key == "driver" else _same_version(want, got))
            if not same:
                raise UserError(
                    f"the gate refuses {label}: measured with {key} {got}, the traffic's target has {want} "
                    f"({target.from_where[key]})",
                    f"measure on the target: `replayssm profile --preset NAME --out F` there, then --results F",
                )
    return [k for k in ENV_FIELDS if not getattr(target, k)]


def evaluate(gate: Gate, plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Each threshold against a plan (Plan.to_dict()): value, threshold, passed, and in words."""
    out: list[dict[str, Any]] = []
    totals = plan.get("totals") or {}
    cohorts = [c for c in plan.get("cohorts") or []]

    def add(key: str, value: float | None, threshold: float, passed: bool, text: str) -> None:
        out.append({"threshold": key, "value": value, "limit": threshold, "passed": passed, "text": text})

    for key, field_, threshold in (("min-gain", "tokens_per_s_gain", gate.min_gain), ("min-gain-lo", "tokens_per_s_gain_lo", gate.min_gain_lo)):
        if threshold is None:
            continue
        value = totals.get(field_)
        if value is None:
            add(key, None, threshold, False, f"{key} {threshold:g}: the traffic-weighted gain could not be computed ({totals.get('note', 'no ITL')})")
            continue
        passed = value >= threshold if key == "min-gain" else value > threshold
        what = "decode tokens/s gain" if key == "min-gain" else "its pessimistic bound"
        add(key, value, threshold, passed, f"{key} {threshold:g}: {what} {value:.3f}x")
    if gate.quality_margin is not None:
        worst = None
        for c in cohorts:
            m = c.get("quality_margin")
            if m is None:
                worst = ("unknown", c["cohort"])
                break
            if worst is None or m < worst[0]:
                worst = (m, c["cohort"])
        if worst is None or worst[0] == "unknown":
            where = f" in cohort {worst[1]}" if worst else ""
            add("quality-margin", None, gate.quality_margin, False,
                f"quality-margin {gate.quality_margin:g}: no quality margin{where} (a quality run is needed: --steps > 0)")
        else:
            add("quality-margin", worst[0], gate.quality_margin, worst[0] >= gate.quality_margin,
                f"quality-margin {gate.quality_margin:g}: smallest {worst[0]:.2f}x, cohort {worst[1]}")
    if gate.memory_headroom is not None:
        heads = [(c.get("memory_headroom"), c["cohort"]) for c in cohorts]
        if not heads or any(h is None for h, _ in heads):
            add("memory-headroom", None, gate.memory_headroom, False,
                f"memory-headroom {gate.memory_headroom:.0%}: memory per sequence or the budget unknown (pass --memory-budget)")
        else:
            h, where = min(heads)
            add("memory-headroom", h, gate.memory_headroom, h >= gate.memory_headroom,
                f"memory-headroom {gate.memory_headroom:.0%}: least {h:.1%} free, at cohort {where}'s peak")
    return out
