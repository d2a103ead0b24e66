"""Energy per step from NVML's total-energy counter around a replayed CUDA graph, the idle draw measured before the run
subtracted: joules per layer-step and per model step, and tokens per joule, with their spread."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

COUNTER = "nvmlDeviceGetTotalEnergyConsumption"
# The counter (mJ) advances at its update interval, tens of milliseconds on Volta and newer: a loop of at least a
# second keeps that step under a few percent of what it reads.
MIN_SECONDS = 1.0
IDLE_SECONDS = 1.0
REPEATS = 3


def _nvml_text(exc: Exception) -> str:
    return str(exc).strip() or type(exc).__name__


@dataclass
class Session:
    """NVML's energy counter of one GPU and the idle draw measured when the session started."""

    nvml: Any
    handle: Any
    idle_w: float
    idle_s: float
    clock: Callable[[], float] = time.perf_counter

    def read_mj(self) -> int:
        return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))

    @classmethod
    def start(cls, index: int = 0, *, nvml: Any = None, idle_seconds: float = IDLE_SECONDS,
              clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep,
              say: Callable[[str], None] | None = None) -> "Session | None":
        """Open GPU `index`'s counter and measure the idle draw over `idle_seconds` (call it before any work); where
        the counter is missing (no NVML, an older GPU, no permission) say so in one line and return None, so the run
        goes on without it."""
        from replayssm_cli.console import note, warn

        say = say or warn
        try:
            if nvml is None:
                import pynvml as nvml
            nvml.nvmlInit()
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            e0, t0 = int(nvml.nvmlDeviceGetTotalEnergyConsumption(handle)), clock()
        except ImportError:
            say("energy not measured: nvidia-ml-py is not installed (pip install nvidia-ml-py)")
            return None
        except Exception as exc:
            if nvml is not None and isinstance(exc, getattr(nvml, "NVMLError", ())):
                why = _nvml_text(exc)
                if isinstance(exc, getattr(nvml, "NVMLError_NotSupported", ())):
                    why = f"this GPU has no {COUNTER} counter (Volta and newer have it)"
                elif isinstance(exc, getattr(nvml, "NVMLError_NoPermission", ())):
                    why = f"no permission to read {COUNTER}"
                say(f"energy not measured: {why}; the run goes on without it")
                return None
            raise
        sleep(idle_seconds)
        e1, t1 = int(nvml.nvmlDeviceGetTotalEnergyConsumption(handle)), clock()
        idle = (e1 - e0) / 1e3 / (t1 - t0) if t1 > t0 else 0.0
        note(f"energy: {COUNTER} around {REPEATS} loops of at least {MIN_SECONDS:g} s per configuration, less the idle "
             f"draw of {idle:.0f} W measured over {t1 - t0:.1f} s before the run")
        return cls(nvml, handle, idle, t1 - t0, clock)

    def measure(self, replay: Callable[[], None], *, sync: Callable[[], None], steps_per_replay: int,
                min_seconds: float = MIN_SECONDS, repeats: int = REPEATS) -> dict[str, Any]:
        """Joules per step of `replay` (which runs `steps_per_replay` steps): as many replays as fill min_seconds,
        `repeats` times, each time the counter's joules less the idle draw over the loop's seconds."""
        if steps_per_replay < 1 or repeats < 1 or not min_seconds > 0:
            raise ValueError("steps per replay and repeats must be at least 1, the loop longer than 0 s")
        sync()
        t0 = self.clock()
        replay()
        sync()
        one = max(self.clock() - t0, 1e-9)
        n = max(1, math.ceil(min_seconds / one))
        per_step, seconds, draw = [], [], []
        for _ in range(repeats):
            sync()
            e0, t0 = self.read_mj(), self.clock()
            for _ in range(n):
                replay()
            sync()
            e1, t1 = self.read_mj(), self.clock()
            joules, secs = (e1 - e0) / 1e3, t1 - t0
            per_step.append((joules - self.idle_w * secs) / (n * steps_per_replay))
            seconds.append(secs)
            draw.append(joules / secs if secs > 0 else math.nan)
        med = statistics.median(per_step)
        return {
            "j_per_step": med,
            "spread": (max(per_step) - min(per_step)) / med if med > 0 else None,
            "samples_j_per_step": per_step,
            "loop_s": statistics.median(seconds),
            "replays": n,
            "repeats": repeats,
            "draw_w": statistics.median(draw),
            "idle_w": self.idle_w,
            "idle_s": self.idle_s,
            "counter": COUNTER,
        }


def layer_fields(m: dict[str, Any], *, model_layers: int, tokens_per_step: float) -> dict[str, Any]:
    """A profile row's x_energy: per layer-step, per model step (the preset's SSM layers) and tokens per joule of
    those layers, from a measurement over layer-steps."""
    j = m["j_per_step"]
    model = j * model_layers
    return {**m, "j_per_layer_step": j, "j_per_model_step": model, "tokens_per_j": tokens_per_step / model if model > 0 else None,
            "scope": f"the SSM layers only ({model_layers} per model step), idle draw subtracted"}


def model_fields(m: dict[str, Any], *, tokens_per_step: float) -> dict[str, Any]:
    """An e2e row's x_energy: per whole-model step and tokens per joule."""
    j = m["j_per_step"]
    return {**m, "j_per_model_step": j, "tokens_per_j": tokens_per_step / j if j > 0 else None,
            "scope": "the whole model step, idle draw subtracted"}


class GraphMeter:
    """What a timing loop hands its captured graph's replay to (on_graph): measured once, the fields kept."""

    def __init__(self, session: Session, steps_per_replay: int):
        self.session = session
        self.steps_per_replay = steps_per_replay
        self.measured: dict[str, Any] | None = None

    @classmethod
    def of(cls, session: Session | None, steps_per_replay: int) -> "GraphMeter | None":
        return cls(session, steps_per_replay) if session is not None else None

    def __call__(self, replay: Callable[[], None]) -> None:
        import torch

        self.measured = self.session.measure(replay, sync=torch.cuda.synchronize, steps_per_replay=self.steps_per_replay)

    def fields(self, *, tokens_per_step: float, model_layers: int | None = None) -> dict[str, Any] | None:
        """x_energy of the row: per layer-step and model step given the preset's SSM layers, else per model step."""
        if self.measured is None:
            return None
        if model_layers is None:
            return model_fields(self.measured, tokens_per_step=tokens_per_step)
        return layer_fields(self.measured, model_layers=model_layers, tokens_per_step=tokens_per_step)
