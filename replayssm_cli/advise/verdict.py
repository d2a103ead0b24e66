"""The one-screen verdict: per batch size, whether ReplaySSM pays, what to set, how sure it is and where it came from."""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Sequence

WIDTH = 100
MIB = 2**20
# (header, width, align) of the verdict's columns; two spaces between columns.
COLUMNS = (
    ("batch", 5, ">"),
    ("pays", 4, "<"),
    ("set", 25, "<"),
    ("kernel speedup", 15, "<"),
    ("e2e", 5, ">"),
    ("MiB/seq", 7, ">"),
    ("fits", 6, ">"),
    ("error", 5, ">"),
    ("time", 8, "<"),
)


@dataclass
class Line:
    """One batch size and mode: the recommendation in figures, each with where it came from."""

    batch: int
    mode: str
    pays: bool | None
    label: str
    variant: str | None = None
    window: int | None = None
    state_dtype: str | None = None
    read_dtype: str | None = None
    draft: int = 0
    speedup: float | None = None
    speedup_lo: float | None = None
    speedup_hi: float | None = None
    speedup_over: str | None = None
    e2e_speedup: float | None = None
    e2e_speedup_lo: float | None = None
    e2e_speedup_hi: float | None = None
    e2e_origin: str | None = None
    tokens_per_j_gain: float | None = None
    tokens_per_j: float | None = None
    energy_origin: str | None = None
    mem_per_seq_model: int | None = None
    largest_batch: int | None = None
    error: float | None = None
    error_budget: float | None = None
    source: str | None = None
    origin: str | None = None
    confirm: str | None = None
    reason: str = ""

    @property
    def margin(self) -> float | None:
        """Share of the error budget the recommendation's error uses."""
        if self.error is None or not self.error_budget:
            return None
        return self.error / self.error_budget

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "error_budget_used": self.margin}


def confirm_command(preset: str, candidate: Any, batch: int, *, tp: int = 1, io_dtype: str = "bf16",
                    accept_rate: float | None = None) -> str:
    """The `replayssm profile` command that measures a candidate (and its conventional baseline) at one batch."""
    c = candidate
    args = ["replayssm", "profile", "-p", preset, "-b", str(batch)]
    if c.window:
        args += ["-w", str(c.window)]
    args += ["--state-dtype", c.state_dtype]
    if c.read_dtype:
        args += ["--read-dtype", c.read_dtype]
    if c.draft:
        args += ["--draft", str(c.draft)]
        if accept_rate is not None:
            args += ["--accept-rate", f"{accept_rate:g}"]
    if tp != 1:
        args += ["--tp", str(tp)]
    if io_dtype != "bf16":
        args += ["--io-dtype", io_dtype]
    return " ".join(shlex.quote(a) for a in args + ["--require-gpu"])


def e2e_speedup(rows: Iterable[dict[str, Any]], preset: str, candidate: Any, batch: int) -> tuple[float, float, float, str] | None:
    """(speedup, lo, hi, origin) of a whole-model decode step with the candidate over conventional at its state
    dtype, from `replayssm e2e` rows (kind 'e2e') that measured both at this batch; None where none did."""
    c = candidate
    e2e = [r for r in rows if r.get("kind") == "e2e" and r.get("preset") == preset and r.get("batch") == batch
           and r.get("status") == "ok" and r.get("source") == "measured" and r.get("us")]

    def find(variant: str, window: int | None, read: str | None) -> dict[str, Any] | None:
        return next((r for r in e2e if r.get("variant") == variant and r.get("window") == window
                     and r.get("state_dtype") == c.state_dtype and r.get("read_dtype") == read and not r.get("draft")
                     and (r.get("rounding") or "nearest") == c.rounding), None)

    if c.draft or not c.is_replay:
        return None
    mine, base = find(c.variant, c.window, c.read_dtype), find("conventional", None, None)
    if mine is None or base is None:
        return None
    s = base["us"] / mine["us"]
    lo = base.get("x_us_p25", base["us"]) / mine.get("x_us_p75", mine["us"])
    hi = base.get("x_us_p75", base["us"]) / mine.get("x_us_p25", mine["us"])
    return s, lo, hi, str(mine.get("x_origin") or "measured")


def energy_gain(rows: Iterable[dict[str, Any]], preset: str, candidate: Any, baseline: Any, batch: int
                ) -> tuple[float, float, str] | None:
    """(tokens per joule of the candidate, its gain over the baseline's, origin) from measured kernel rows with NVML
    energy (x_energy, `--energy`) for both at this batch, whole-window averages; None where either lacks it. The
    origin is the candidate row's: 'measured here' or the file it was measured in."""
    from replayssm_cli.report import provenance

    found = [r for r in rows if r.get("kind", "kernel") == "kernel" and r.get("preset") == preset and r.get("batch") == batch
             and r.get("phase", "avg") == "avg" and r.get("source") == "measured" and r.get("status", "ok") == "ok"
             and (r.get("x_energy") or {}).get("j_per_step")]

    def find(c: Any) -> dict[str, Any] | None:
        return next((r for r in found if r.get("variant") == c.variant and r.get("state_dtype") == c.state_dtype
                     and r.get("window") == (c.window if c.is_replay else None) and r.get("read_dtype") == c.read_dtype
                     and (r.get("draft") or 0) == c.draft and r.get("rounding", "nearest") == c.rounding), None)

    mine, base = find(candidate), find(baseline)
    if mine is None or base is None:
        return None
    gain = base["x_energy"]["j_per_step"] / mine["x_energy"]["j_per_step"]
    return mine["x_energy"].get("tokens_per_j"), gain, provenance.row_label(mine)


def lines_from(decisions: Sequence[Any], *, preset: str, error_budget: float | None, e2e_rows: Sequence[dict[str, Any]] = (),
               energy_rows: Sequence[dict[str, Any]] = (), tp: int = 1, io_dtype: str = "bf16",
               accept_rate: float | None = None) -> list[Line]:
    """One Line per tuner.Decision."""
    out = []
    for d in decisions:
        a = d.choice
        if a is None:
            out.append(Line(d.batch, d.mode, None, "nothing within the budgets", error_budget=error_budget,
                            reason=d.summary))
            continue
        c, t = a.candidate, a.timing
        base = d.baseline.candidate.label() if d.baseline is not None else None
        line = Line(
            d.batch, d.mode, bool(d.replay_pays), c.label(), c.variant, c.window, c.state_dtype, c.read_dtype, c.draft,
            a.speedup, a.speedup_lo, a.speedup_hi, base,
            mem_per_seq_model=a.mem_per_seq, largest_batch=a.seqs_fit, error=a.error, error_budget=error_budget,
            source=t.source, origin=t.label(), reason=a.reason,
        )
        found = e2e_speedup(e2e_rows, preset, c, d.batch) if d.replay_pays else None
        if found is not None:
            line.e2e_speedup, line.e2e_speedup_lo, line.e2e_speedup_hi, line.e2e_origin = found
        energy = energy_gain(energy_rows, preset, c, d.baseline.candidate, d.batch) if d.baseline is not None else None
        if energy is not None:
            line.tokens_per_j, line.tokens_per_j_gain, line.energy_origin = energy
        if d.predicted:
            line.confirm = confirm_command(preset, c, d.batch, tp=tp, io_dtype=io_dtype, accept_rate=accept_rate)
        out.append(line)
    return out


def _cell(text: str, width: int, align: str) -> str:
    return f"{text:{align}{width}}"


def _row(cells: Sequence[str]) -> str:
    return "  ".join(_cell(t, w, a) for t, (_, w, a) in zip(cells, COLUMNS)).rstrip()


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def wrap(text: str, indent: str = "    ") -> list[str]:
    """Words of `text` in lines of at most WIDTH columns, the later ones indented."""
    lines, cur = [], ""
    for word in text.split(" "):
        if cur and len(cur) + 1 + len(word) > WIDTH - (2 if not lines else 0):
            lines.append(cur)
            cur = indent + word
        else:
            cur = f"{cur} {word}" if cur else word
    return lines + [cur] if cur else lines


def _command_lines(cmd: str) -> list[str]:
    """A shell command within WIDTH columns, continued with backslashes."""
    words = cmd.split(" ")
    # An option and its value stay on one line.
    units = []
    for w in words:
        if units and units[-1].startswith("-") and " " not in units[-1] and not w.startswith("-"):
            units[-1] += " " + w
        else:
            units.append(w)
    out, cur = [], "    "
    for unit in units:
        if len(cur) + len(unit) + 3 > WIDTH and cur.strip():
            out.append(cur.rstrip() + " \\")
            cur = "      "
        cur += unit + " "
    return out + [cur.rstrip()]


def render(lines: Sequence[Line], *, title: str, over: str, notes: Sequence[str] = ()) -> str:
    """The verdict as plain text, every line within WIDTH columns: a title, the table, then the sources."""
    sources: dict[str, int] = {}
    body = [_row([h for h, _, _ in COLUMNS])]
    for ln in lines:
        if ln.pays is None:
            body.append(_row([str(ln.batch), "-", ln.label]))
            continue
        tag = sources.setdefault(ln.origin or ln.source or "", len(sources) + 1)
        sp = _x(ln.speedup) + (f" {ln.speedup_lo:.2f}-{ln.speedup_hi:.2f}" if ln.speedup_lo and ln.speedup_hi else "")
        if ln.e2e_origin:
            sources.setdefault(f"e2e: {ln.e2e_origin}", len(sources) + 1)
        body.append(_row([
            f"{ln.batch}", "yes" if ln.pays else "no", ln.label, sp if ln.speedup else "-", _x(ln.e2e_speedup),
            "-" if ln.mem_per_seq_model is None else f"{ln.mem_per_seq_model / MIB:,.0f}",
            "-" if ln.largest_batch is None else f"{ln.largest_batch:,}",
            "-" if ln.margin is None else (f"{ln.margin:.0%}" if ln.margin >= 0.01 else "<1%"),
            f"{'meas' if ln.source == 'measured' else 'pred'} [{tag}]",
        ]))
    energy = [ln for ln in lines if ln.tokens_per_j_gain is not None]
    if energy:
        cells = []
        for ln in energy:
            tag = sources.setdefault(f"energy: {ln.energy_origin}", len(sources) + 1)
            cells.append(f"batch {ln.batch} {_x(ln.tokens_per_j_gain)} [{tag}]")
        body += wrap(f"tokens per joule over {energy[0].speedup_over} (NVML's energy counter, idle "
                     "draw subtracted): " + ", ".join(cells))
    out = wrap(title) + wrap(over) + [""] + body + [""]
    for label, n in sources.items():
        out += wrap(f"[{n}] {label}")
    for ln in lines:
        if ln.confirm:
            out += wrap(f"batch {ln.batch} {ln.label} rests on a prediction: confirm with")
            out += _command_lines(ln.confirm)
    for note in notes:
        out += wrap(note)
    return "\n".join(out)


def column_notes(error_budget: float, layers: int, budget_note: str) -> list[str]:
    """What the verdict's columns mean, in two lines."""
    return [
        f"e2e: a whole-model decode step where `replayssm e2e` measured it. MiB/seq: over the {layers} SSM layers; "
        f"fits: sequences in the memory budget ({budget_note}).",
        f"error: share of the {error_budget:.0e} error budget (relative output error vs fp64, longest bucket) "
        "that the recommendation uses.",
    ]


def profile_verdict(rows: Sequence[dict[str, Any]], presets: Sequence[Any], *, gpu: str) -> str:
    """The verdict over a profile's rows, for `replayssm profile` to print last: per preset (as the run resolved it,
    from a name or a file) and batch, whether the ReplaySSM step it timed pays over conventional decode at the
    preset's own state dtype, on speed alone (profile runs no quality check: `replayssm tune` adds the error budget
    and the other precisions)."""
    from replayssm_cli.advise import tuner
    from replayssm_cli.model.presets import preset_names

    shipped = set(preset_names())
    out = []
    for p in presets:
        mine = [r for r in rows if r.get("preset") == p.name and r.get("kind", "kernel") == "kernel" and r.get("phase", "avg") == "avg"]
        cands = list(dict.fromkeys(
            tuner.Candidate(r["variant"], r["state_dtype"], r.get("window") if r["variant"] in tuner.REPLAY else None,
                            r.get("read_dtype"), r.get("draft") or 0, r.get("accepted") if r.get("draft") else None,
                            rounding=r.get("rounding") or "nearest")
            for r in mine if r["variant"] in tuner.CONVENTIONAL + tuner.REPLAY
            and r.get("state_dtype") == p.state_dtype and not r.get("read_dtype")
        ))
        batches = sorted({r["batch"] for r in mine})
        if not cands or not any(not c.is_replay for c in cands):
            continue

        def memory(c):
            try:
                return tuner.memory_of(p.shape, c)
            except ValueError:
                return None

        decisions = tuner.tune(batches, cands, timing=lambda c, b: tuner.timing_from_rows(mine, c, b, preset=p.name),
                               error=lambda c: None, memory=memory, layers=p.ssm_layers, baseline_dtype=p.state_dtype)
        lines = lines_from([d for d in decisions if d.choice is not None or d.baseline is not None], preset=p.name,
                           error_budget=None, tp=p.tp)
        notes = []
        if any(ln.confirm for ln in lines):
            notes.append("Predicted rows: the same `replayssm profile` on a CUDA GPU measures them (--require-gpu).")
            for ln in lines:
                ln.confirm = None
        title = f"replayssm profile: {p.name} on {gpu}: does ReplaySSM pay? (speed alone)"
        spec = "; verify rows over the snapshot-writing verify" if any(c.draft for c in cands) else ""
        tune = f"`replayssm tune -p {p.name}`" if p.name in shipped else "`replayssm tune` on the same preset file"
        over = (f"Kernel speedup over conventional {p.state_dtype} at the same batch, with its interval{spec}. Precision "
                f"is not checked here: {tune} adds the error budget and the other precisions.")
        out.append(render(lines, title=title, over=over, notes=notes))
    return "\n\n".join(out)
