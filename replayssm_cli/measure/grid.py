"""The profile grid: what a profile runs (its spec), its points in run order and the phases each point gives; no torch."""

from __future__ import annotations
from dataclasses import asdict, dataclass
from typing import Any
from replayssm_cli.model.dtypes import EIGHT_BIT, IODtype, ReadDtype, Rounding, StateDtype, precision_problem
from replayssm_cli.model import ops
from replayssm_cli.errors import UserError


DEFAULT_BATCHES = (1, 16, 64, 256)


DEFAULT_WINDOWS = (16,)


DEFAULT_ACCEPT_RATE = 0.8


MAX_WINDOW = 64


MAX_DRAFT = 8


PHASED_VARIANTS = ("replay", "split")


# The row fields that say which configuration a row measured; compare matches rows on them.
CONFIG_KEYS = (
    "kind", "op", "preset", "variant", "phase", "batch", "window", "state_dtype",
    "read_dtype", "io_dtype", "draft", "tp", "flush", "rounding",
)


def config_key(row: dict[str, Any], keys: tuple[str, ...] = CONFIG_KEYS) -> tuple:
    """A row's configuration as a tuple of `keys`; a row written before `rounding` existed rounded to nearest."""
    return tuple((row.get(k) or "nearest") if k == "rounding" and row.get("kind", "kernel") == "kernel" else row.get(k)
                 for k in keys)


@dataclass(frozen=True)
class ProfileSpec:
    """What a profile runs: the grid's axes and the timing settings; written whole into the results file."""

    presets: tuple[str, ...]
    batches: tuple[int, ...] = DEFAULT_BATCHES
    windows: tuple[int, ...] = DEFAULT_WINDOWS
    state_dtypes: tuple[str, ...] = ()
    read_dtypes: tuple[str, ...] = ()
    io_dtype: str = "bf16"
    drafts: tuple[int, ...] = ()
    accept_rate: float = DEFAULT_ACCEPT_RATE
    accept_dist: tuple[float, ...] = ()
    tp: int = 1
    layers: int | None = None
    aligned_flush: bool = False
    phases: bool = True
    windows_per_graph: int = 2
    repeats: int = 30
    seed: int = 0
    baselines: tuple[str, ...] = ()
    energy: bool = False
    # "stochastic": every 16-bit and 8-bit state is timed rounded stochastically beside rounded to nearest (fp32
    # states are stored exactly).
    rounding: str = "nearest"

    def validate(self) -> None:
        """Raise UserError (one line) for an option the kernels or the grid cannot take."""
        if not self.presets:
            raise UserError("no preset to profile", "pass --preset NAME (see `replayssm presets`)")
        for b in self.batches:
            if b < 1:
                raise UserError(f"--batch {b} is not a batch size", "batch sizes are positive integers, e.g. --batch 1,16,64,256")
        for w in self.windows:
            if not 1 <= w <= MAX_WINDOW:
                raise UserError(f"--window {w} is out of range", f"the window W takes 1 to {MAX_WINDOW}")
        for t in self.drafts:
            if not 1 <= t <= MAX_DRAFT:
                raise UserError(f"--draft {t} is out of range", f"speculative widths take 1 to {MAX_DRAFT}")
        for d in self.state_dtypes:
            _enum(StateDtype, d, "--state-dtype")
        for d in self.read_dtypes:
            _enum(ReadDtype, d, "--read-dtype")
        _enum(IODtype, self.io_dtype, "--io-dtype")
        if self.state_dtypes:
            refuse_rounding(self.state_dtypes, self.rounding)
        if not 0.0 <= self.accept_rate <= 1.0:
            raise UserError(f"--accept-rate {self.accept_rate} is not a probability", "pass a value in [0, 1]")
        if self.accept_dist:
            if len(self.drafts) != 1 or len(self.accept_dist) != self.drafts[0] + 1:
                raise UserError(
                    "--accept-dist needs exactly one --draft T and T+1 weights (for 0..T drafts accepted)",
                    "e.g. --draft 4 --accept-dist 0.1,0.1,0.2,0.3,0.3",
                )
            if any(w < 0 for w in self.accept_dist) or sum(self.accept_dist) <= 0:
                raise UserError("--accept-dist weights must be non-negative and not all zero")
        if self.drafts and any(mean_accepted(accept_probs(t, self.accept_rate, self.accept_dist)) <= 0 for t in self.drafts):
            raise UserError("the acceptance given accepts no draft at all", "pass an --accept-rate or --accept-dist that accepts some")
        if self.tp < 1:
            raise UserError(f"--tp {self.tp} is not a tensor-parallel degree", "pass a positive integer")
        if self.layers is not None and self.layers < 1:
            raise UserError(f"--layers {self.layers} is not a layer count", "pass a positive integer")
        if self.repeats < 3:
            raise UserError(f"--repeats {self.repeats} is too few to give percentiles", "pass 3 or more")
        from replayssm_cli.measure import baselines

        for name in self.baselines:
            if name != baselines.ALL and name not in baselines.REGISTRY:
                raise UserError(f"--baseline {name!r} is not a baseline this replayssm knows", f"choose from {', '.join(baselines.names())} or all")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _enum(enum: type, value: str, option: str) -> str:
    try:
        return enum(value).value
    except ValueError:
        choices = ", ".join(e.value for e in enum)
        raise UserError(f"{option} {value!r} is not a dtype the kernels take", f"choose from {choices}") from None


def refuse_rounding(state_dtypes: tuple[str, ...], rounding: str) -> None:
    """One line where stochastic rounding would apply to no state of the run (every state fp32)."""
    if rounding == Rounding.stochastic.value and all(d == StateDtype.fp32.value for d in state_dtypes):
        raise UserError(f"--stochastic-rounding with --state-dtype {','.join(state_dtypes)}: {precision_problem('fp32', None, rounding)}",
                        "add --state-dtype bf16, fp16, fp8 or int8 (fp32 rows stay exact), or drop --stochastic-rounding")


def roundings(rounding: str) -> tuple[str, ...]:
    """The roundings a run times: nearest, and stochastic too when asked."""
    return (Rounding.nearest.value,) + ((Rounding.stochastic.value,) if rounding == Rounding.stochastic.value else ())


def rounding_for(state_dtype: str, rounding: str) -> str:
    """The rounding a run's rows of `state_dtype` take: the run's, except an fp32 state's (stored exactly: nearest)."""
    return Rounding.nearest.value if state_dtype == StateDtype.fp32.value else rounding


def accept_probs(draft: int, rate: float = DEFAULT_ACCEPT_RATE, dist: tuple[float, ...] = ()) -> list[float]:
    """Probabilities of accepting n = 0..draft drafts in one verify step.

    With `dist`, its weights normalised. Otherwise each draft is accepted with probability `rate`
    and the first rejection ends the run, as in speculative decoding: P(n) = rate^n (1 - rate) for
    n < draft and rate^draft for n = draft.
    """
    if dist:
        total = float(sum(dist))
        return [w / total for w in dist]
    probs = [rate**n * (1.0 - rate) for n in range(draft)]
    probs.append(rate**draft)
    return probs


def mean_accepted(probs: list[float]) -> float:
    return sum(n * p for n, p in enumerate(probs))


@dataclass(frozen=True)
class Point:
    """One configuration of the grid; it gives one row, or three (avg, nonflush, flush) for ReplaySSM."""

    preset: str
    source_name: str
    op: str
    variant: str
    batch: int
    window: int | None
    state_dtype: str
    read_dtype: str | None
    io_dtype: str
    draft: int = 0
    accept: tuple[float, ...] = ()
    tp: int = 1
    layers_cap: int | None = None
    flush: str = "staggered"
    phases: bool = False
    competes: str | None = None
    rounding: str = "nearest"

    @property
    def cost_variant(self) -> str:
        """The variant whose cost model the row uses: ours, or the one a baseline competes with."""
        return self.competes or self.variant

    def label(self) -> str:
        parts = [self.preset, self.variant, f"B{self.batch}"]
        if self.window:
            parts.append(f"W{self.window}")
        parts.append(self.state_dtype + (f"-{self.read_dtype}" if self.read_dtype else "")
                     + ("-SR" if self.rounding == Rounding.stochastic.value else ""))
        if self.draft:
            parts.append(f"T{self.draft}")
        return " ".join(parts)

    def case_spec(self, seed: int = 0, phase: str = "avg") -> dict[str, Any]:
        """What `bench.make_case` takes: JSON-able, so a child process can rebuild the case (at one phase's fill)."""
        return {
            "preset": self.source_name,
            "op": self.op,
            "phase": phase,
            "tp": self.tp,
            "variant": self.variant,
            "batch": self.batch,
            "window": self.window,
            "state_dtype": self.state_dtype,
            "read_dtype": self.read_dtype,
            "io_dtype": self.io_dtype,
            "rounding": self.rounding,
            "draft": self.draft,
            "accept": list(self.accept),
            "flush": self.flush,
            "layers": self.layers_cap,
            "seed": seed,
        }


def plan(spec: ProfileSpec, presets: list[Any], left_out: list[dict[str, str]] | None = None, baselines: list[Any] = ()) -> list[Point]:
    """The grid in run order: within a preset, state dtype and batch, the conventional kernel first (the speedup baseline).

    A split read copy that is not narrower than the state is left out (appended to `left_out` with why). A run
    rounding stochastically times each 16-bit and 8-bit state both ways, rounded to nearest and stochastically (so the
    file holds what stochastic rounding costs); fp32 rows round to nearest (they are the fp32 baseline).
    `baselines` (replayssm_cli.measure.baselines adapters, already found importable) add a point after ours for
    each configuration of their op and variant that they can run; the others go to `left_out`.
    """
    points: list[Point] = []
    flush = "aligned" if spec.aligned_flush else "staggered"
    for given, preset in zip(spec.presets, presets):
        state_dtypes = spec.state_dtypes or (preset.state_dtype,)
        refuse_rounding(state_dtypes, spec.rounding)
        for sd, ro in dict.fromkeys((sd, rounding_for(sd, r)) for sd in state_dtypes for r in roundings(spec.rounding)):
            if ro == Rounding.stochastic.value and (why := ops.of(preset.shape).rounding_problem(preset.shape)):
                if left_out is not None:
                    left_out.append({"what": f"{preset.name} {sd} stochastic rounding", "why": why})
                continue
            common = dict(preset=preset.name, source_name=given, op=preset.kind, io_dtype=spec.io_dtype, tp=spec.tp,
                          layers_cap=spec.layers, rounding=ro)
            for b in spec.batches:
                points.append(Point(**common, variant="conventional", batch=b, window=None, state_dtype=sd, read_dtype=None))
                for w in spec.windows:
                    points.append(
                        Point(**common, variant="replay", batch=b, window=w, state_dtype=sd, read_dtype=None, flush=flush, phases=spec.phases)
                    )
                    for rd in spec.read_dtypes:
                        if why := precision_problem(sd, rd):
                            if left_out is not None and b == spec.batches[0] and w == spec.windows[0]:
                                left_out.append({"what": f"{preset.name} split {sd}-{rd}", "why": why})
                            continue
                        points.append(
                            Point(**common, variant="split", batch=b, window=w, state_dtype=sd, read_dtype=rd, flush=flush, phases=spec.phases)
                        )
                for t in spec.drafts:
                    acc = tuple(accept_probs(t, spec.accept_rate, spec.accept_dist))
                    if sd in EIGHT_BIT:
                        if left_out is not None and b == spec.batches[0]:
                            left_out.append({"what": f"{preset.name} spec-conventional T{t} {sd}",
                                             "why": "decode_multi writes fp32 or 16-bit snapshots, not 8-bit rows"})
                    else:
                        points.append(
                            Point(**common, variant="spec-conventional", batch=b, window=None, state_dtype=sd, read_dtype=None, draft=t, accept=acc)
                        )
                    for w in spec.windows:
                        points.append(
                            Point(**common, variant="spec-replay", batch=b, window=w, state_dtype=sd, read_dtype=None, draft=t, accept=acc, flush=flush)
                        )
                for bl in baselines:
                    if bl.op != preset.kind:
                        continue
                    for w in spec.windows if bl.variant == "replay" else (None,):
                        why = (bl.unsupported(window=w, state_dtype=sd, io_dtype=spec.io_dtype, shape=preset.shape)
                               or bl.unstored(sd, common["rounding"]))
                        if why:
                            if left_out is not None and b == spec.batches[0]:
                                left_out.append({"what": f"{preset.name} baseline:{bl.name}" + (f" W{w}" if w else "") + f" {sd}", "why": why})
                            continue
                        points.append(
                            Point(**common, variant=f"baseline:{bl.name}", batch=b, window=w, state_dtype=sd, read_dtype=None,
                                  flush=flush if w else "staggered", competes=bl.variant)
                        )
    return points


def nonflush_fill(window: int) -> int:
    """The fill at which the nonflush phase is measured: the middle of 0..W-2."""
    return (window - 2) // 2


def point_phases(point: Point) -> list[str]:
    """The rows a point gives: avg, and for ReplaySSM with phases the non-flush (W > 1) and flush steps alone."""
    if point.variant in PHASED_VARIANTS and point.phases:
        return ["avg", "nonflush", "flush"] if point.window and point.window > 1 else ["avg", "flush"]
    return ["avg"]
