"""Sweep the Gated DeltaNet kernels' launch settings on a GPU at the Qwen3.5-122B layer shape: time, GB/s, ratio."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep_common as common  # noqa: E402
from sweep_common import KERNELS, Result, add_ratios  # noqa: E402, F401

from replayssm_cli.model.shapes import GDNShape  # noqa: E402

SHAPE = {"H": 16, "HV": 64, "K": 128, "V": 128}
WINDOW = 16
DRAFT = 4
ACCEPTED = 3
# Fields of each kernel's launch configuration (DecodeConfig, ReplayConfig, VerifyConfig) put into the row the kernel
# chooses at the timed batch; flush_FIELD sets a field of a two-launch replay row's FlushConfig, fold_FIELD of a
# verify row's FoldConfig (where the row has no field of that name itself).
GRID = {
    "decode": [{"rows": 4, "warps": 1}, {"rows": 8, "warps": 1},
               {"rows": 8, "state_first": 1, "block_strides": 1, "warps": 1, "maxnreg": 64},
               {"rows": 16, "warps": 1}, {"rows": 32, "warps": 4}, {"rows": 128, "warps": 4, "maxnreg": 96}],
    # maxnreg 255 lifts the replay row's cap for settings that hold the whole tile; rows < 128 splits each head's
    # rows over programs.
    "replay": [{"rows": 128, "chunk": 32, "stages": 2, "maxnreg": 96}, {"rows": 128, "chunk": 32, "stages": 3},
               {"rows": 128, "chunk": 128, "stages": 1, "warps": 4, "maxnreg": 255},
               {"rows": 32, "chunk": 32, "stages": 1, "warps": 2, "maxnreg": 255},
               {"rows": 16, "chunk": 16, "stages": 1, "warps": 1, "maxnreg": 255}],
    "split-bf16": [{}, {"chunk": 32, "stages": 2}, {"flush_flush_chunk": 16}, {"flush_maxnreg": 255}],
    "decode-multi": [{"rows": 8, "warps": 1}, {"rows": 16, "warps": 4}, {"rows": 32, "warps": 4}],
    # mma False: the shuffle row sums; key_pass 0 with the folds in the verify (fold none)
    "verify": [{}, {"fold_stages": 1}, {"key_pass": 1, "weights_fill": 0, "chunk": 64, "warps": 4},
               {"mma": 0, "key_pass": 0, "fold": None, "arrive": 1, "ksplit": 1, "fold_stages": 1, "chunk": 16}],
}
GRID["replay-nonflush"] = GRID["replay-flush"] = GRID["replay"]
GRID["split-bf16-nonflush"] = GRID["split-bf16-flush"] = GRID["split-fp8"] = GRID["split-bf16"]
# flash-linear-attention's fused recurrent decode (fla-core), timed only when named: "fla" as its function runs it
# (a new final state each step), "fla-inplace" its kernel with the final state written over the initial one, as a
# server's state pool is. V_FIRST=1 holds the state as ours, (V, K) per head; 0 as (K, V).
# "decode-direct" is our decode without a slot table (row b in slot b, no slot read), as fla indexes its states.
FLA_KERNELS = ("fla", "fla-inplace")
EXTRA_KERNELS = FLA_KERNELS + ("decode-direct",)
GRID["fla"] = GRID["fla-inplace"] = [{"V_FIRST": 1}, {"V_FIRST": 0}]
GRID["decode-direct"] = GRID["decode"]
QUICK_GRID = {
    "decode": [{"rows": 4, "warps": 1}, {"rows": 32, "warps": 4}],
    "replay": [{"rows": 128, "chunk": 32, "stages": 2, "maxnreg": 96},
               {"rows": 32, "chunk": 32, "stages": 1, "warps": 2, "maxnreg": 255}],
    "split-bf16": [{}],
    "decode-multi": [{"rows": 32, "warps": 4}],
    "verify": [{}, {"key_pass": 1, "weights_fill": 0, "chunk": 64, "warps": 4}],
}
QUICK_GRID["replay-nonflush"] = QUICK_GRID["replay-flush"] = QUICK_GRID["replay"]
QUICK_GRID["split-bf16-nonflush"] = QUICK_GRID["split-bf16-flush"] = QUICK_GRID["split-fp8"] = QUICK_GRID["split-bf16"]
QUICK_GRID["fla"] = QUICK_GRID["fla-inplace"] = [{"V_FIRST": 1}]
QUICK_GRID["decode-direct"] = QUICK_GRID["decode"]


def config_for(kernel: str, target, batch: int, fields: dict):
    """The launch row `kernel` chooses for `target` (a state pool or cache) at `batch` rows, with `fields` put in
    (flush_FIELD and fold_FIELD into its nested flush or fold configuration)."""
    import dataclasses
    import importlib

    from replayssm_kernels import common as kc

    gd, gr, gv = (importlib.import_module(f"replayssm_kernels.gdn.{m}") for m in ("decode", "replay", "verify"))
    if kernel in ("decode", "decode-direct"):
        row = gd.DECODE_LAUNCH[gd.select(target, batch)]
    elif kernel == "decode-multi":
        row = gd.DECODE_LAUNCH["decode-multi"]
    elif kernel == "verify":
        row = gv.VERIFY_LAUNCH[gv.select_verify(target, batch)]
    else:
        row = gr.REPLAY_LAUNCH[gr.select(target, batch)]
    fields = dict(fields)
    for nested in ("flush", "fold"):
        # (a field of the row itself, such as fold_stages or flush_chunk, is not a nested one)
        own = {f.name for f in dataclasses.fields(row)}
        inner = {k[len(nested) + 1:]: fields.pop(k) for k in list(fields) if k.startswith(nested + "_") and k not in own}
        if inner:
            if getattr(row, nested, None) is None:
                raise ValueError(f"{nested}_ fields apply only to a row with a {nested} launch")
            fields[nested] = kc.override(getattr(row, nested), inner)
    return kc.override(row, fields) if fields else dataclasses.replace(row)


def parse_launch(text: str) -> tuple[str, dict]:
    """'replay:chunk=64,warps=8' -> ('replay', {'chunk': 64, 'warps': 8})."""
    return common.parse_launch(text, KERNELS + EXTRA_KERNELS)


def plan(kernels: list[str], quick: bool, overrides: list[tuple[str, dict]]) -> dict[str, list[dict]]:
    """The launch settings to time per kernel: those given on the command line, else the built-in grid."""
    return common.plan(kernels, QUICK_GRID if quick else GRID, overrides)


def fill_trajectory(kernel: str, start: int, steps: int) -> list[int]:
    return common.fill_trajectory(kernel, start, steps, WINDOW, ACCEPTED)


def start_fills(kernel: str, batch: int) -> list[int]:
    return common.start_fills(kernel, batch, WINDOW)


def graph_steps(kernel: str) -> int:
    return common.graph_steps(kernel, WINDOW)


def bytes_per_layer_step(kernel: str, batch: int) -> float:
    return common.bytes_per_layer_step(kernel, batch, GDNShape(**SHAPE), WINDOW, DRAFT, ACCEPTED)


def layer_count(kernel: str, batch: int, l2_bytes: int) -> int:
    return common.layer_count(kernel, batch, l2_bytes, SHAPE["HV"] * SHAPE["V"] * SHAPE["K"])


def random_inputs(batch: int, T: int | None, device: str) -> dict:
    """One step's inputs (T drafts' with T) in bf16, g too, as `replayssm profile` draws them and the cost model
    counts them."""
    import torch

    from replayssm_kernels import gdn

    inp = gdn.random_inputs(batch, SHAPE["H"], SHAPE["HV"], SHAPE["K"], SHAPE["V"], T=T, io_dtype=torch.bfloat16,
                            device=device)
    return {**inp, "g": inp["g"].to(torch.bfloat16)}


def _cache(gdn, kernel: str, batch: int, device: str):
    H, HV, K, V = SHAPE["H"], SHAPE["HV"], SHAPE["K"], SHAPE["V"]
    return gdn.ReplayCache.create(batch, H, HV, K, V, WINDOW, state_dtype=common.STATE["dtype"],
                                  read_dtype=common.read_dtype(kernel), io_dtype="bf16",
                                  max_draft=DRAFT if kernel == "verify" else 0,
                                  buffer_dtype=common.STATE.get("buffer") or "fp32", device=device)


def _fla_step(state, inp, v_first: bool, inplace: bool):
    """One fla decode step on dense per-row states; returns (o, the new state)."""
    import torch
    import triton
    from fla.ops.gated_delta_rule import fused_recurrent as fla

    q, k, v = (inp[name][:, None] for name in ("q", "k", "v"))
    g, beta = inp["g"][:, None], inp["beta"][:, None]
    if not inplace:
        o, state = fla.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=state,
                                                        output_final_state=True, use_qk_l2norm_in_kernel=True,
                                                        state_v_first=v_first)
        return o[:, 0], state
    # The kernel fla's function launches, with its final state pointed at its initial one (each program reads its
    # rows before it writes them).
    N, _, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    BV = min(8, triton.next_power_of_2(V))
    o = torch.empty_like(v)
    fla.fused_recurrent_gated_delta_rule_fwd_kernel[(triton.cdiv(V, BV) * N * HV,)](
        q=q, k=k, v=v, g=g, gk=None, gv=None, beta=beta, A_log=None, dt_bias=None, o=o, h0=state, ht=state,
        cu_seqlens=None, scale=K**-0.5, T=1, H=H, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), BV=BV,
        IS_BETA_HEADWISE=True, USE_QK_L2NORM_IN_KERNEL=True, APPLY_BETA_SIGMOID=False, ALLOW_NEG_EIGVAL=False,
        STATE_V_FIRST=v_first, num_warps=1, num_stages=3,
    )
    return o[:, 0], state


class Stack:
    """L layers of one kernel at one batch: their state pools or caches, shared inputs, and one step."""

    def __init__(self, kernel: str, batch: int, layers: int, launch: dict, device: str):
        import torch

        from replayssm_kernels import gdn

        self.m, self.torch = gdn, torch
        self.kernel, self.batch, self.launch = kernel, batch, launch
        HV, K, V = SHAPE["HV"], SHAPE["K"], SHAPE["V"]
        T = DRAFT if kernel in ("decode-multi", "verify") else None
        self.inp = random_inputs(batch, T, device)
        self.slots = common.row_slots(batch, device)
        self.n = torch.full((batch,), ACCEPTED, dtype=torch.int32, device=device)
        self.layers = []
        for _ in range(layers):
            if kernel in FLA_KERNELS:
                state = torch.randn(batch, HV, V, K, device=device) * 0.5
                self.layers.append([state if launch["V_FIRST"] else state.transpose(-1, -2).contiguous()])
            elif kernel in ("decode", "decode-direct", "decode-multi"):
                state = (torch.randn(batch, HV, V, K, device=device) * 0.5).to(common.state_torch_dtype())
                snaps = torch.empty(batch, DRAFT, HV, V, K, device=device) if kernel == "decode-multi" else None
                self.layers.append((state, snaps))
            else:
                cache = _cache(gdn, kernel, batch, device)
                cache.load(torch.randn(batch, HV, V, K, device=device) * 0.5)
                self.layers.append(cache)
        fills = torch.tensor(start_fills(kernel, batch), dtype=torch.int32, device=device)
        # row r starts at fill start_fills[r]; the fills are indexed by its slot
        self.start = torch.empty_like(fills)
        self.start[self.slots.long()] = fills
        if kernel == "verify":
            for cache in self.layers:
                self.m.verify(cache, **self.inp, use_qk_l2norm_in_kernel=True, slots=self.slots)

    def rewind(self) -> None:
        """Put every row back at its starting fill (between timed replays, outside the timing)."""
        for layer in self.layers:
            if isinstance(layer, self.m.ReplayCache):
                layer.fill.copy_(self.start[:, None].expand_as(layer.fill))

    def step(self) -> None:
        m, kw = self.m, dict(use_qk_l2norm_in_kernel=True, slots=self.slots, check=False)
        if self.kernel not in FLA_KERNELS:
            first = self.layers[0][0] if isinstance(self.layers[0], (tuple, list)) else self.layers[0]
            kw["config"] = config_for(self.kernel, first, self.batch, self.launch)
        for layer in self.layers:
            if self.kernel in FLA_KERNELS:
                _, layer[0] = _fla_step(layer[0], self.inp, bool(self.launch["V_FIRST"]), self.kernel == "fla-inplace")
            elif self.kernel == "decode":
                m.decode(layer[0], **self.inp, **kw)
            elif self.kernel == "decode-direct":
                m.decode(layer[0], **self.inp, **dict(kw, slots=None))
            elif self.kernel == "decode-multi":
                m.decode_multi(layer[0], layer[1], **self.inp, **kw)
            elif self.kernel == "verify":
                m.verify(layer, **self.inp, **kw)
                m.accept(layer, self.n, self.slots, check=False)
            else:
                m.replay(layer, **self.inp, **kw)


def unavailable(kernel: str) -> str | None:
    """Why `kernel` cannot run here (its package missing), or None."""
    if kernel in FLA_KERNELS:
        try:
            import fla.ops.gated_delta_rule.fused_recurrent  # noqa: F401
        except ImportError as exc:
            return f"{kernel} needs flash-linear-attention (pip install fla-core einops): {exc}"
    return None


def check_config(kernel: str, launch: dict, device: str, slots: list[int] = (2, -1, 0)) -> float:
    """Max relative error of the kernel with these settings against its reference over a window, one row per
    entry of `slots` (its slot, -1 for padding)."""
    import torch

    from replayssm_kernels import gdn

    HV, K, V = SHAPE["HV"], SHAPE["K"], SHAPE["V"]
    rows = torch.tensor(list(slots), dtype=torch.int32, device=device)
    n = len(rows)
    live = rows >= 0
    kw = dict(use_qk_l2norm_in_kernel=True, slots=rows)
    err = 0.0

    def rel(a, b):
        return ((a[live].float() - b[live].float()).abs().max() / b[live].float().abs().max()).item()

    if kernel in EXTRA_KERNELS:
        # Dense states (no slot table): every row live, row b in slot b, the state as fla or ours holds it.
        live = torch.ones(n, dtype=torch.bool, device=device)
        direct = kernel == "decode-direct"
        v_first = direct or bool(launch["V_FIRST"])
        want = (torch.randn(n, HV, V, K, device=device) * 0.5).to(common.state_torch_dtype() if direct else torch.float32)
        state = want.clone() if v_first else want.transpose(-1, -2).contiguous()
        for _ in range(3):
            inp = random_inputs(n, None, device)
            if direct:
                y = gdn.decode(state, **inp, use_qk_l2norm_in_kernel=True, config=config_for(kernel, state, n, launch))
            else:
                y, state = _fla_step(state, inp, v_first, kernel == "fla-inplace")
            y_ref = gdn.decode_ref(want, **inp, use_qk_l2norm_in_kernel=True)
            err = max(err, rel(y, y_ref), rel(state if v_first else state.transpose(-1, -2), want))
        return err

    if kernel in ("decode", "decode-multi"):
        state = (torch.randn(n, HV, V, K, device=device) * 0.5).to(common.state_torch_dtype())
        want = state.clone()
        for _ in range(3):
            if kernel == "decode":
                inp = random_inputs(n, None, device)
                y = gdn.decode(state, **inp, **kw, config=config_for(kernel, state, n, launch))
                err = max(err, rel(y, gdn.decode_ref(want, **inp, **kw)), rel(state, want))
            else:
                inp = random_inputs(n, DRAFT, device)
                snaps, want_snaps = (torch.zeros(n, DRAFT, HV, V, K, device=device) for _ in range(2))
                y = gdn.decode_multi(state, snaps, **inp, **kw, config=config_for(kernel, state, n, launch))
                y_ref = gdn.decode_multi_ref(state, want_snaps, **inp, **kw)
                err = max(err, rel(y, y_ref), rel(snaps, want_snaps))
        return err
    cache = _cache(gdn, kernel, n, device)
    cache.load(torch.randn(n, HV, V, K, device=device) * 0.5)
    want = cache.clone()
    for step in range(WINDOW + 2):
        if kernel == "verify":
            inp = random_inputs(n, DRAFT, device)
            y = gdn.verify(cache, **inp, **kw, config=config_for(kernel, cache, n, launch))
            err = max(err, rel(y, gdn.verify_ref(want, **inp, **kw)))
            n_acc = torch.randint(0, DRAFT + 1, (n,), dtype=torch.int32, device=device)
            gdn.accept(cache, n_acc, rows)
            gdn.accept_ref(want, n_acc, rows)
        else:
            inp = random_inputs(n, None, device)
            y = gdn.replay(cache, **inp, **kw, config=config_for(kernel, cache, n, launch))
            err = max(err, rel(y, gdn.replay_ref(want, **inp, **kw)))
    got, ref = gdn.materialize(cache), gdn.materialize_ref(want)
    return max(err, ((got - ref).abs().max() / ref.abs().max()).item())


def print_table(results: list[Result], out) -> None:
    common.print_table(results, out, f"Gated DeltaNet H{SHAPE['H']}-HV{SHAPE['HV']}-K{SHAPE['K']}-V{SHAPE['V']}, "
                                     f"W={WINDOW}, {common.STATE['dtype']} state, bf16 io; ratio = baseline's best / this "
                                     "(verify vs decode-multi, others vs decode)")


def build_parser():
    parser = common.build_parser(
        "sweep_gdn.py",
        __doc__,
        "examples:\n"
        "  python benchmarks/sweep_gdn.py --quick --out runs/sweep_gdn_quick.json\n"
        "  python benchmarks/sweep_gdn.py --kernel replay --kernel decode --batch 256 \\\n"
        "      --launch replay:chunk=16,warps=1 --launch decode:rows=16,warps=4 --out runs/sweep_gdn.json\n"
        "  python benchmarks/sweep_gdn.py --kernel decode --kernel fla --kernel fla-inplace --batch 256 --slots identity\n"
        "  python benchmarks/sweep_gdn.py --dry-run   # the plan, layer counts and bytes; no GPU needed",
        extra=EXTRA_KERNELS,
    )
    parser.add_argument("--buffer-dtype", choices=("fp32", "bf16", "fp16"),
                        help="the caches' buffered updates and keys: fp32 (default) or a 2-byte state's own dtype")
    return parser


def main(argv: list[str] | None = None) -> int:
    return common.main(sys.modules[__name__], argv, reuse_checks=False)


if __name__ == "__main__":
    sys.exit(main())
