"""The end-to-end decode estimate: one decode step of a whole hybrid model from random weights, timed in CUDA graphs."""

from __future__ import annotations

import gc
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from replayssm_kernels import e2e_ops

from replayssm_cli.measure import bench
from replayssm_cli.model.dtypes import ReadDtype, StateDtype
from replayssm_cli.errors import UserError
from replayssm_cli.measure.timing import graph_samples, is_oom, percentile
from replayssm_cli.model.presets import Preset, shape_dict
from replayssm_cli.model import ops
from replayssm_cli.model.hybrid import (
    ACT_AMAX, BLOCK_KIND, Block, CATEGORIES, CONV_WIDTH, FLASHINFER_WORKSPACE, Family, GIB,
    IO_DTYPE, Inventory, KV_DTYPES, Linear, MEMORY_SHARE, PAGE_SIZE, RESERVE_BYTES, WEIGHT_DTYPES,
    WEIGHT_SHARE, WeightPlan, _ffn_counts, experts_touched, inventory, max_batch, plan_weights, predicted_shares,
    seq_bytes,
)

DEFAULT_BATCHES = (1, 16, 64, 256)
DEFAULT_CONTEXTS = (4096,)
DEFAULT_VARIANTS = ("conventional", "replay")
VARIANTS = ("conventional", "replay", "split")
MAX_WINDOW = 64
# The collectives between ranks: a fifth category, present only when the step runs over several GPUs (tensor_parallel).
COMM = "comm"
FP8_MAX = 448.0
TIMED_WINDOWS = 2
WARMUP_REPLAYS = 2


def scaled_grouped_mm(rows: torch.Tensor, weight: torch.Tensor, row_scale: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """rows (G, M, K) fp8, row-major, through G experts' weight (G, N, K) fp8: torch._scaled_grouped_mm, 3D x 3D, with
    row-wise fp32 scales row_scale (G, M) and weight_scale (G, N); bf16 (G, M, N)."""
    return torch._scaled_grouped_mm(rows, weight.transpose(1, 2), row_scale, weight_scale, out_dtype=torch.bfloat16)


ATTENTION_BACKENDS = ("flashinfer", "flash-attn", "torch-sdpa")


def _installed(module: str) -> bool:
    """Whether `import module` works (a package that is present but fails to import counts as absent)."""
    import importlib

    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - a broken install (missing CUDA libraries, ABI mismatch) is not usable
        return False
    return True


def attention_backend(device: torch.device) -> str:
    """The decode attention the engines run, where it is installed on CUDA: FlashInfer's paged-KV decode
    ('flashinfer'), else flash_attn_with_kvcache ('flash-attn'), else PyTorch SDPA ('torch-sdpa')."""
    if device.type != "cuda":
        return "torch-sdpa"
    for name, module in (("flashinfer", "flashinfer"), ("flash-attn", "flash_attn")):
        if _installed(module):
            return name
    return "torch-sdpa"


def check_spec_runnable(spec: E2ESpec, presets: list[Preset], device: torch.device | str, attention: str | None = None) -> None:
    """check_runnable for every preset of `spec` on `device` (its compute capability; None off CUDA); bf16 runs anywhere."""
    if spec.weight_dtype == "bf16" and spec.kv_dtype == "bf16":
        return
    device = torch.device(device)
    capability = tuple(torch.cuda.get_device_capability(device)) if device.type == "cuda" else None
    for preset in presets:
        check_runnable(spec.weight_dtype, spec.kv_dtype, attention or attention_backend(device), capability,
                       has_moe=_ffn_counts(preset)["moe"] > 0)


def check_runnable(weight_dtype: str, kv_dtype: str, attention: str, capability: tuple[int, int] | None, has_moe: bool) -> None:
    """Raise UserError (one line naming the alternative) for a weight or KV precision this GPU and attention cannot run."""
    if weight_dtype not in WEIGHT_DTYPES:
        raise UserError(f"--weight-dtype {weight_dtype!r} is not one the estimate knows", f"choose from {', '.join(WEIGHT_DTYPES)}")
    if kv_dtype not in KV_DTYPES:
        raise UserError(f"--kv-dtype {kv_dtype!r} is not one the estimate knows", f"choose from {', '.join(KV_DTYPES)}")
    if weight_dtype == "nvfp4":
        raise UserError("--weight-dtype nvfp4 is a plan for Blackwell's FP4 tensor cores, not run here",
                        "pass --dry-run for its weight bytes and predicted shares, or run --weight-dtype fp8")
    sm = f"sm_{capability[0]}{capability[1]}" if capability else "this GPU"
    if weight_dtype == "fp8":
        if capability is not None and capability < (8, 9):
            raise UserError(f"fp8 weights need sm_89 or newer (fp8 tensor cores); {sm} has none", "run --weight-dtype bf16")
        if not hasattr(torch, "_scaled_mm"):
            raise UserError(f"fp8 weights run through torch._scaled_mm, which torch {torch.__version__} lacks", "run --weight-dtype bf16")
        if has_moe and (not hasattr(torch, "_scaled_grouped_mm") or (capability is not None and capability < (9, 0))):
            raise UserError(f"fp8 MoE experts run through torch._scaled_grouped_mm, which needs torch >= 2.8 on sm_90 or newer ({sm}, "
                            f"torch {torch.__version__})", "run --weight-dtype bf16")
    if kv_dtype == "fp8":
        if attention != "flashinfer":
            raise UserError(f"an fp8 KV cache runs through FlashInfer's paged decode attention; the attention here is {attention}",
                            "install flashinfer-python, or run --kv-dtype bf16")
        if capability is not None and capability < (8, 9):
            raise UserError(f"an fp8 KV cache needs sm_89 or newer; {sm} has no fp8", "run --kv-dtype bf16")


class SSMStack(bench.Case):
    """bench.Case over every SSM layer of the model, stepped one layer at a time inside the model step.

    The step's memory plan replaces the Case's own fit check, and one initial state serves every
    layer's load (a copy per layer would double the state memory at large batch).
    """

    def _layer_count(self, spec: dict[str, Any]) -> int:
        return self.ssm_layers

    def _build_layer(self):
        layer = super()._build_layer()
        shared = getattr(self, "_initial", None)
        if shared is None:
            self._initial = (layer.state0, layer.scale0)
        else:
            # an 8-bit state's row scales go with the rows they scale
            layer.state0, layer.scale0 = shared
        return layer

    def run_layer(self, j: int) -> torch.Tensor:
        """One decode step of SSM layer j through the kernels; returns its output (batch, heads, head dim)."""
        return self._run(self._layers[j], 0)


@dataclass
class Op:
    """One launch group of the step: its category, a name (block letter, index, part) and the call."""

    category: str
    name: str
    fn: Callable[[], Any]


class Weights:
    """The model's random weights on a device, at the inventory's weight dtype: SSM and attention blocks each their own,
    MLP/MoE blocks `sets` shared sets. fp8 matrices are e4m3 with a per-tensor fp32 scale under "<name>.scale"
    (one per expert for MoE, repeated along the output rows as torch._scaled_grouped_mm takes it)."""

    def __init__(self, inv: Inventory, sets: int, device: torch.device | str, seed: int = 0):
        self.inv = inv
        self.device = torch.device(device)
        self.sets = sets
        self._gen = torch.Generator(device=self.device).manual_seed(seed)
        self.blocks: list[dict[str, torch.Tensor]] = []
        kinds: list[str] = []
        pools: dict[str, list[dict[str, torch.Tensor]]] = {"mlp": [], "moe": []}
        for letter in inv.order:
            kind = BLOCK_KIND[letter]
            if kind in pools:
                seen = kinds.count(kind)
                if seen < sets:
                    pools[kind].append(self._matrices(inv.blocks[kind]))
                self.blocks.append({**pools[kind][seen % sets], "norm": self._ones(inv.dims["hidden"])})
            else:
                self.blocks.append(self._block(kind))
            kinds.append(kind)
        self.head = {**self._matrices(inv.head), "norm": self._ones(inv.dims["hidden"])}

    def _ones(self, n: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=self._gen, device=self.device).to(torch.bfloat16)

    def _matrix(self, lin: Linear) -> torch.Tensor:
        shape = (lin.n, lin.k) if lin.experts == 1 else (lin.experts, lin.n, lin.k)
        if lin.name == "embedding":
            shape = (lin.k, lin.n)
        w = torch.empty(shape, dtype=torch.bfloat16, device=self.device)
        return w.normal_(0.0, lin.k**-0.5 if lin.name != "embedding" else 1.0, generator=self._gen)

    def _matrices(self, block: Block) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for lin in block.linears:
            w = self._matrix(lin)
            if lin.quantized(self.inv.weight_dtype):
                w, scale = self._fp8(w, lin)
                out[f"{lin.name}.scale"] = scale
            out[lin.name] = w
        return out

    def _fp8(self, w: torch.Tensor, lin: Linear) -> tuple[torch.Tensor, torch.Tensor]:
        """w in fp8 e4m3 and its scale: per tensor, or per expert (E, N) for a stack of experts."""
        dims = tuple(range(1, w.dim())) if lin.experts > 1 else tuple(range(w.dim()))
        amax = w.abs().amax(dim=dims, keepdim=True).float().clamp_min(1e-12)
        scale = amax / FP8_MAX
        q = (w.float() / scale).to(torch.float8_e4m3fn) if lin.experts == 1 else torch.empty_like(w, dtype=torch.float8_e4m3fn)
        if lin.experts > 1:
            # One expert at a time: an fp32 copy of a whole expert stack would need four times its bf16 size.
            for e in range(lin.experts):
                q[e] = (w[e].float() / scale[e]).to(torch.float8_e4m3fn)
            return q, scale.reshape(lin.experts, 1).expand(lin.experts, lin.n).contiguous()
        return q, scale.reshape(())

    def _block(self, kind: str) -> dict[str, torch.Tensor]:
        block = self.inv.blocks[kind]
        out = {**self._matrices(block), "norm": self._ones(self.inv.dims["hidden"])}
        if kind == "ssm":
            c = block.sizes["conv_dim"]
            out["conv_w"] = (torch.randn(c, CONV_WIDTH, generator=self._gen, device=self.device) * 0.5).to(torch.bfloat16)
            out["conv_b"] = (torch.randn(c, generator=self._gen, device=self.device) * 0.1).to(torch.bfloat16)
            out["gnorm"] = self._ones(block.sizes["inner"])
        elif kind == "attn":
            out["qk_norm"] = self._ones(2 * block.sizes["head_dim"]).view(2, -1)
        return out

    @property
    def nbytes(self) -> int:
        seen: set[int] = set()
        total = 0
        for d in [*self.blocks, self.head]:
            for t in d.values():
                if t.data_ptr() not in seen:
                    seen.add(t.data_ptr())
                    total += t.numel() * t.element_size()
        return total


class Step:
    """One decode step of the whole model at one batch, context and SSM variant, as a list of categorised ops.

    Buffers shared between ops are allocated once, so any subset of the ops (one category) can run
    or be captured on its own; `run(select)` runs the ops `select` keeps, in model order.
    """

    def __init__(
        self, inv: Inventory, weights: Weights, *, variant: str, batch: int, context: int, window: int | None,
        state_dtype: str, read_dtype: str | None, device: torch.device | str, seed: int = 0, attention: str | None = None,
        kv_dtype: str = "bf16",
    ):
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {', '.join(VARIANTS)}; got {variant!r}")
        if batch < 1 or context < 1:
            raise ValueError(f"batch and context must be positive; got batch={batch}, context={context}")
        self.inv, self.w = inv, weights
        self.device = torch.device(device)
        self.variant, self.batch, self.context = variant, batch, context
        self.attention = attention or attention_backend(self.device)
        self.kv_dtype = kv_dtype
        self.fp8 = inv.weight_dtype == "fp8"
        self._act_scale = torch.tensor(ACT_AMAX / FP8_MAX, dtype=torch.float32, device=self.device)
        self._q: dict[tuple[int, ...], torch.Tensor] = {}
        self._row_scale: torch.Tensor | None = None
        self._wrapper = None
        self._gen = torch.Generator(device=self.device).manual_seed(seed + 1)
        p = inv.preset
        spec = {
            "shape": {"op": p.kind, **shape_dict(p.shape)}, "ssm_layers": p.ssm_layers, "has_z": p.has_z,
            "has_D": p.has_D, "dt_softplus": p.dt_softplus, "a_log_range": p.a_log_range, "variant": variant,
            "batch": batch, "window": window if variant != "conventional" else None, "state_dtype": state_dtype,
            "read_dtype": read_dtype if variant == "split" else None, "io_dtype": IO_DTYPE, "seed": seed, "l2_bytes": 0,
        }
        self.stack = SSMStack(spec, self.device)
        hidden = inv.dims["hidden"]
        self.tokens = torch.randint(inv.dims["vocab"], (batch,), generator=self._gen, device=self.device)
        self.next_tokens = torch.empty(batch, dtype=torch.int64, device=self.device)
        self.h, self.bo, self.xn = (self._empty(batch, hidden) for _ in range(3))
        self._bufs: dict[str, torch.Tensor] = {}
        self.conv_states: list[torch.Tensor] = []
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.ops: list[Op] = [Op("other", "embed", lambda: torch.index_select(self.w.head["embedding"], 0, self.tokens, out=self.h))]
        self.touched = self.per_expert = None
        if "moe" in inv.blocks:
            self.touched, self.per_expert, self._index, self._weight = self.routing()
        n = {"ssm": 0, "attn": 0, "mlp": 0, "moe": 0}
        for i, letter in enumerate(inv.order):
            kind = BLOCK_KIND[letter]
            w = weights.blocks[i]
            first = i == 0
            self.ops.append(Op("other", f"{letter}{i}.norm", lambda w=w, first=first: e2e_ops.add_rms_norm(self.h, None if first else self.bo, w["norm"], self.xn)))
            getattr(self, f"_{kind}_ops")(f"{letter}{i}", n[kind], w)
            n[kind] += 1
        self._head_ops()

    def _empty(self, *shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=self.device)

    def _quantized(self, x: torch.Tensor) -> torch.Tensor:
        """x in fp8 at the static activation scale, into a buffer per shape (products run one after another)."""
        if x.stride(-1) != 1:
            x = x.contiguous()
        key = tuple(x.shape)
        if key not in self._q:
            self._q[key] = self._empty(*key, dtype=torch.float8_e4m3fn)
        return e2e_ops.fp8_quantize(x.reshape(-1, key[-1]), ACT_AMAX / FP8_MAX, self._q[key].view(-1, key[-1])).view(key)

    def _mm(self, x: torch.Tensor, w: dict[str, torch.Tensor], name: str, out: torch.Tensor | None = None) -> torch.Tensor:
        """x @ w[name].T: torch.mm for a bf16 matrix; for an fp8 one, x quantized with a static per-tensor scale (as the
        engines' FP8 checkpoints ship calibrated activation scales) and torch._scaled_mm with bf16 output."""
        if f"{name}.scale" not in w:
            return torch.mm(x, w[name].t(), out=out) if out is not None else torch.mm(x, w[name].t())
        y = torch._scaled_mm(self._quantized(x), w[name].t(), scale_a=self._act_scale, scale_b=w[f"{name}.scale"],
                             out_dtype=torch.bfloat16)
        return out.copy_(y) if out is not None else y

    def _experts_mm(self, rows: torch.Tensor, w: dict[str, torch.Tensor], name: str, touched: int) -> torch.Tensor:
        """rows (touched, per, k) through the first `touched` experts of w[name]: torch.bmm in bf16, or
        torch._scaled_grouped_mm over fp8 experts (3D x 3D, row-wise scales)."""
        weight = w[name][:touched]
        if f"{name}.scale" not in w:
            return torch.bmm(rows, weight.transpose(1, 2))
        if self._row_scale is None:
            self._row_scale = self._act_scale.expand(touched, rows.shape[1]).contiguous()
        return scaled_grouped_mm(self._quantized(rows), weight, self._row_scale, w[f"{name}.scale"][:touched])

    def _randn(self, *shape: int) -> torch.Tensor:
        # Drawn in bf16 directly: an fp32 draw of a 24 GiB KV cache would need twice that for a moment.
        return self._empty(*shape).normal_(generator=self._gen)

    def _buf(self, name: str, *shape: int) -> torch.Tensor:
        """A buffer shared by every block of a kind (blocks run one after another, so one copy serves them all)."""
        if name not in self._bufs:
            self._bufs[name] = self._empty(self.batch, *shape)
        return self._bufs[name]

    def _ssm_ops(self, tag: str, j: int, w: dict[str, torch.Tensor]) -> None:
        block = self.inv.blocks["ssm"]
        p = self.inv.preset
        inner, conv_dim = block.sizes["inner"], block.sizes["conv_dim"]
        proj = self._buf("ssm_proj", block.linear("in_proj").n)
        conv_out = self._buf("ssm_conv", conv_dim)
        gated = self._buf("ssm_gated", inner)
        if ops.named(p.kind).z_first:
            z, xbc = proj[:, :inner], proj[:, inner:inner + conv_dim]
        else:
            xbc, z = proj[:, :conv_dim], proj[:, conv_dim:conv_dim + inner]
        state = self._randn(self.batch, CONV_WIDTH - 1, conv_dim)
        self.conv_states.append(state)
        held: dict[str, torch.Tensor] = {}
        self.ops += [
            Op("ssm", f"{tag}.in_proj", lambda: self._mm(self.xn, w, "in_proj", proj)),
            Op("ssm", f"{tag}.conv", lambda: e2e_ops.conv_update(xbc, state, w["conv_w"], w["conv_b"], conv_out)),
            # The kernel reads the profile's pre-drawn inputs (same shapes and bytes as the conv's outputs), whose decay is in range.
            Op("ssm", f"{tag}.kernel", lambda: held.__setitem__("y", self.stack.run_layer(j))),
        ]
        if p.has_z:
            self.ops.append(Op("ssm", f"{tag}.out_proj", lambda: self._mm(held["y"].reshape(self.batch, -1), w, "out_proj", self.bo)))
        else:
            self.ops += [
                Op("ssm", f"{tag}.gated_norm", lambda: e2e_ops.gated_rms_norm(held["y"].reshape(self.batch, -1), z, w["gnorm"], gated, block.sizes["norm_group"])),
                Op("ssm", f"{tag}.out_proj", lambda: self._mm(gated, w, "out_proj", self.bo)),
            ]

    def _attn_ops(self, tag: str, j: int, w: dict[str, torch.Tensor]) -> None:
        s = self.inv.blocks["attn"].sizes
        heads, kv, hd, qw, rot = s["heads"], s["kv_heads"], s["head_dim"], s["q_width"], s["rotary"]
        qkv = self._buf("attn_qkv", self.inv.blocks["attn"].linear("qkv_proj").n)
        q = self._buf("attn_q", heads, hd)
        flash = self.attention == "flash-attn"
        paged = self.attention == "flashinfer"
        layout = "bthd" if flash or paged else "bhtd"
        if paged:
            self._decode_wrapper(heads, kv, hd)
            # Pages of PAGE_SIZE tokens, each sequence's pages contiguous: (pages, page, kv, hd) is also (batch, tokens, kv, hd).
            pages = self.batch * self._pages_per_seq()
            k_pages, v_pages = (self._kv_cache(pages, PAGE_SIZE, kv, hd) for _ in range(2))
            k_cache = k_pages.view(self.batch, -1, kv, hd)
            v_cache = v_pages.view(self.batch, -1, kv, hd)
            self.kv.append((k_pages, v_pages))
        else:
            shape = (self.batch, self.context, kv, hd) if flash else (self.batch, kv, self.context, hd)
            k_cache, v_cache = self._randn(*shape), self._randn(*shape)
            self.kv.append((k_cache, v_cache))
        pos = self.context - 1
        inv_freq = 10000.0 ** (-torch.arange(0, max(rot, 2), 2, dtype=torch.float32, device=self.device) / max(rot, 2))
        cos, sin = torch.cos(pos * inv_freq), torch.sin(pos * inv_freq)
        held: dict[str, torch.Tensor] = {}
        seqlens = torch.full((self.batch,), self.context, dtype=torch.int32, device=self.device)

        def attend() -> None:
            if paged:
                o = self._decode_wrapper(heads, kv, hd).run(q, (k_pages, v_pages))
            elif flash:
                from flash_attn import flash_attn_with_kvcache

                o = flash_attn_with_kvcache(q.view(self.batch, 1, heads, hd), k_cache, v_cache, cache_seqlens=seqlens)
            else:
                # A GQA group's query heads ride the query-length axis, so one KV head serves them without expansion.
                o = F.scaled_dot_product_attention(q.view(self.batch, kv, heads // kv, hd), k_cache, v_cache)
            held["o"] = o.reshape(self.batch, heads * hd)

        self.ops += [
            Op("attn", f"{tag}.qkv_proj", lambda: self._mm(self.xn, w, "qkv_proj", qkv)),
            Op("attn", f"{tag}.qk_prepare", lambda: e2e_ops.qk_prepare(
                qkv, q, k_cache, v_cache, w["qk_norm"], cos, sin, pos=pos, heads=heads, kv_heads=kv, q_width=qw,
                rotary=rot, qk_norm=self.inv.family.qk_norm, kv_layout=layout)),
            Op("attn", f"{tag}.attention", attend),
        ]
        if self.inv.family.attn_gate:
            gate = qkv[:, heads * hd:2 * heads * hd]
            self.ops.append(Op("attn", f"{tag}.gate", lambda: held["o"].mul_(torch.sigmoid(gate))))
        self.ops.append(Op("attn", f"{tag}.o_proj", lambda: self._mm(held["o"], w, "o_proj", self.bo)))

    def _pages_per_seq(self) -> int:
        return -(-self.context // PAGE_SIZE)

    def _kv_cache(self, *shape: int) -> torch.Tensor:
        """Random KV pages at the KV dtype; fp8 pages are drawn a page block at a time (an fp32 draw of a whole cache would not fit)."""
        if self.kv_dtype == "bf16":
            return self._randn(*shape)
        out = self._empty(*shape, dtype=torch.float8_e4m3fn)
        for chunk in out.split(max(1, 2**26 // max(1, out[0].numel())), dim=0):
            chunk.copy_(torch.empty(chunk.shape, dtype=torch.bfloat16, device=self.device).normal_(generator=self._gen))
        return out

    def _decode_wrapper(self, heads: int, kv: int, hd: int):
        """FlashInfer's paged-KV decode wrapper for this batch and context, planned once (outside any graph capture) and
        shared by every attention layer; tensor cores for query groups wider than 4, as the engines choose."""
        if self._wrapper is None:
            import flashinfer

            pps = self._pages_per_seq()
            indptr = torch.arange(0, (self.batch + 1) * pps, pps, dtype=torch.int32, device=self.device)
            indices = torch.arange(self.batch * pps, dtype=torch.int32, device=self.device)
            last = torch.full((self.batch,), self.context - (pps - 1) * PAGE_SIZE, dtype=torch.int32, device=self.device)
            workspace = torch.empty(FLASHINFER_WORKSPACE, dtype=torch.uint8, device=self.device)
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                workspace, "NHD", use_cuda_graph=True, use_tensor_cores=heads // kv > 4,
                paged_kv_indptr_buffer=indptr, paged_kv_indices_buffer=indices, paged_kv_last_page_len_buffer=last,
            )
            wrapper.plan(indptr, indices, last, heads, kv, hd, PAGE_SIZE, q_data_type=torch.bfloat16,
                         kv_data_type=torch.float8_e4m3fn if self.kv_dtype == "fp8" else torch.bfloat16)
            self._wrapper = wrapper
        return self._wrapper

    def _act(self, x: torch.Tensor) -> torch.Tensor:
        if self.inv.family.mlp == "swiglu":
            half = x.shape[-1] // 2
            return F.silu(x[..., :half]) * x[..., half:]
        return torch.relu(x).square_()

    def _mlp_ops(self, tag: str, j: int, w: dict[str, torch.Tensor]) -> None:
        self.ops.append(Op("mlp", f"{tag}.mlp", lambda: self._mm(self._act(self._mm(self.xn, w, "up_proj")), w, "down_proj", self.bo)))

    def routing(self) -> tuple[int, int, torch.Tensor, torch.Tensor]:
        """Balanced routing of the batch: experts touched, tokens per expert, the gather index and the combine weights.

        Token t's k picks are (t k + j) mod touched, j < k: distinct experts, every touched expert
        taking the same number of rows (padding rows carry weight 0).
        """
        d = self.inv.dims
        topk = d["topk"]
        touched = experts_touched(d["experts"], topk, self.batch)
        per = -(-self.batch * topk // touched)
        pair = torch.arange(per, device=self.device)[None, :] * touched + torch.arange(touched, device=self.device)[:, None]
        real = pair < self.batch * topk
        index = torch.where(real, pair // topk, torch.zeros_like(pair)).reshape(-1)
        weight = torch.where(real, torch.full_like(pair, 1), torch.zeros_like(pair)).to(torch.bfloat16) / topk
        return touched, per, index, weight.reshape(-1, 1)

    def _moe_ops(self, tag: str, j: int, w: dict[str, torch.Tensor]) -> None:
        block = self.inv.blocks["moe"]
        topk = block.sizes["topk"]
        touched, per, index, weight = self.touched, self.per_expert, self._index, self._weight
        width = block.linear("experts_up").k
        latent = block.has("latent_in")
        shared = block.has("shared_up")

        def routed() -> torch.Tensor:
            logits = torch.mm(self.xn, w["router"].t())
            # The router's top-k is computed for its cost; rows are dispatched by the balanced routing above.
            torch.softmax(torch.topk(logits, topk, dim=-1).values.float(), dim=-1)
            x = self._mm(self.xn, w, "latent_in") if latent else self.xn
            rows = x.index_select(0, index).view(touched, per, width)
            h = self._act(self._experts_mm(rows, w, "experts_up", touched))
            y = self._experts_mm(h.contiguous(), w, "experts_down", touched).view(-1, width) * weight
            out = torch.zeros(self.batch, width, dtype=torch.bfloat16, device=self.device).index_add_(0, index, y)
            return self._mm(out, w, "latent_out") if latent else out

        def moe() -> None:
            r = routed()
            if not shared:
                self.bo.copy_(r)
                return
            s = self._mm(self._act(self._mm(self.xn, w, "shared_up")), w, "shared_down")
            if "shared_gate" in w:
                s = s * torch.sigmoid(torch.mm(self.xn, w["shared_gate"].t()))
            torch.add(r, s, out=self.bo)

        self.ops.append(Op("mlp", f"{tag}.moe", moe))

    def _head_ops(self) -> None:
        held: dict[str, torch.Tensor] = {}
        self.ops += [
            Op("other", "final_norm", lambda: e2e_ops.add_rms_norm(self.h, self.bo, self.w.head["norm"], self.xn)),
            Op("other", "lm_head", lambda: held.__setitem__("logits", torch.mm(self.xn, self.w.head["lm_head"].t()))),
            Op("other", "sample", lambda: torch.argmax(held["logits"], dim=-1, out=self.next_tokens)),
        ]

    def run(self, select: Callable[[Op], bool] | None = None) -> None:
        """Run the ops `select` keeps (all by default), in model order."""
        for op in self.ops:
            if select is None or select(op):
                op.fn()

    def check(self) -> float:
        """The SSM kernels of layer 0 against their reference over whole windows: the max relative error."""
        return self.stack.check()

    def tolerance(self) -> float:
        return self.stack.tolerance()

    def close(self) -> None:
        self.stack.close()
        self.ops.clear()
        self._bufs.clear()
        self.conv_states.clear()
        self.kv.clear()
        self._wrapper = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def select_all(op: Op) -> bool:
    return True


def select_category(category: str) -> Callable[[Op], bool]:
    return lambda op: op.category == category


def select_kernel(op: Op) -> bool:
    return op.name.endswith(".kernel")


Timer = Callable[[Step, Callable[[Op], bool], int, int], list[float]]


def graph_timer(step: Step, select: Callable[[Op], bool], replays: int, warmup: int,
                on_graph: Callable[[Callable[[], None]], None] | None = None) -> list[float]:
    """µs per replay of the selected ops captured in one CUDA graph (timing.graph_samples); then `on_graph`
    (energy.GraphMeter), given the graph's replay."""
    return graph_samples(lambda: step.run(select), replays=replays, warmup=warmup, on_graph=on_graph)


@dataclass
class Measurement:
    """Per-replay µs of the whole step, of each category's ops alone, and of the SSM kernels alone."""

    step: list[float]
    parts: dict[str, list[float]]
    kernel: list[float]

    def category_us(self) -> dict[str, float]:
        present = (*CATEGORIES, COMM) if self.parts.get(COMM) else CATEGORIES
        return {c: statistics.fmean(self.parts[c]) if self.parts.get(c) else 0.0 for c in present}


def measure(step: Step, *, replays: int, warmup: int = WARMUP_REPLAYS, timer: Timer | None = None) -> Measurement:
    """Time the whole step, then each category's ops in their own graph, then the SSM kernels alone.

    The shares of the step are the category times over their sum (the categories partition the
    ops, so the sum is the step less the launch tails between graphs; the ratio is kept).
    """
    timer = timer or graph_timer
    present = {op.category for op in step.ops}
    full = timer(step, select_all, replays, warmup)
    parts = {c: timer(step, select_category(c), replays, warmup) if c in present else [] for c in (*CATEGORIES, COMM)}
    kernel = timer(step, select_kernel, replays, warmup)
    return Measurement(step=full, parts=parts, kernel=kernel)


def shares(category_us: dict[str, float]) -> dict[str, float]:
    """Each category's share of the step: its time over the sum of all four (and comm, when given; the shares add up to 1)."""
    keys = (*CATEGORIES, COMM) if COMM in category_us else CATEGORIES
    total = sum(category_us.get(c, 0.0) for c in keys)
    if not total > 0:
        raise ValueError(f"no category took any time: {category_us}")
    return {c: category_us.get(c, 0.0) / total for c in keys}


# How --tp runs: one GPU's shard with no collectives, --tp processes the command starts, or one of torchrun's processes.
TP_LAUNCHES = ("one-gpu", "spawn", "torchrun")


@dataclass(frozen=True)
class E2ESpec:
    """What an e2e run measures: presets x contexts x batches x variants, at one window and state precision."""

    presets: tuple[str, ...]
    batches: tuple[int, ...] = DEFAULT_BATCHES
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    window: int = 16
    state_dtype: str | None = None
    read_dtype: str = "bf16"
    tp: int = 1
    tp_launch: str = "one-gpu"
    max_weights_gib: float | None = None
    windows: int = TIMED_WINDOWS
    seed: int = 0
    energy: bool = False
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"

    def validate(self) -> None:
        """Raise UserError (one line) for an option the step cannot take."""
        if not self.presets:
            raise UserError("no preset to estimate", "pass --preset NAME (see `replayssm presets`)")
        for b in self.batches:
            if b < 1:
                raise UserError(f"--batch {b} is not a batch size", "batch sizes are positive integers, e.g. --batch 1,16,64,256")
        for c in self.contexts:
            if c < 1:
                raise UserError(f"--context {c} is not a context length", "pass tokens in the KV cache, e.g. --context 4096")
        for v in self.variants:
            if v not in VARIANTS:
                raise UserError(f"--variant {v!r} is not one the step runs", f"choose from {', '.join(VARIANTS)}")
        if not self.variants:
            raise UserError("no --variant to run", f"choose from {', '.join(VARIANTS)}")
        if not 1 <= self.window <= MAX_WINDOW:
            raise UserError(f"--window {self.window} is out of range", f"the window W takes 1 to {MAX_WINDOW}")
        for value, enum, option in ((self.state_dtype, StateDtype, "--state-dtype"), (self.read_dtype, ReadDtype, "--read-dtype")):
            if value is not None and value not in {e.value for e in enum}:
                raise UserError(f"{option} {value!r} is not a dtype the kernels take", f"choose from {', '.join(e.value for e in enum)}")
        if self.tp < 1:
            raise UserError(f"--tp {self.tp} is not a tensor-parallel degree", "pass a positive integer")
        if self.tp_launch not in TP_LAUNCHES:
            raise UserError(f"--tp-launch {self.tp_launch!r} is not a launch the step knows", f"choose from {', '.join(TP_LAUNCHES)}")
        if self.energy and self.tp_launch != "one-gpu":
            raise UserError(f"--energy reads one GPU's energy counter, and --tp-launch {self.tp_launch} runs {self.tp} GPUs",
                            "drop --energy, or --tp-launch")
        if self.max_weights_gib is not None and not self.max_weights_gib > 0:
            raise UserError(f"--max-weights-gib {self.max_weights_gib} is not a size", "pass GiB, e.g. --max-weights-gib 60")
        if self.windows < 1:
            raise UserError(f"timed windows {self.windows} must be at least 1")
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise UserError(f"--weight-dtype {self.weight_dtype!r} is not one the estimate knows", f"choose from {', '.join(WEIGHT_DTYPES)}")
        if self.kv_dtype not in KV_DTYPES:
            raise UserError(f"--kv-dtype {self.kv_dtype!r} is not one the estimate knows", f"choose from {', '.join(KV_DTYPES)}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


WEIGHT_PATHS = {
    "bf16": "bf16 weights: torch.mm, MoE experts through torch.bmm",
    "fp8": "fp8 e4m3 weights with one fp32 scale per tensor (per expert for MoE) and a static per-tensor activation scale: "
           "torch._scaled_mm, MoE experts through torch._scaled_grouped_mm (row-wise scales); the embedding, LM head, "
           "router and shared-expert gate stay bf16",
    "nvfp4": "NVFP4 e2m1 weights (one fp8 scale per 16 weights, one fp32 per tensor): a plan for Blackwell's FP4 tensor "
             "cores, bytes only; nothing is run",
}


def weight_path(inv: Inventory) -> str:
    """The products a step of `inv` runs its weights through, in a few words."""
    if inv.weight_dtype == "fp8":
        return "torch._scaled_mm" + (", torch._scaled_grouped_mm" if "moe" in inv.blocks else "")
    return "torch.mm" + (", torch.bmm" if "moe" in inv.blocks else "")


def weights_note(weight_dtype: str) -> str:
    """What the weights are, for the table's caption and the results file."""
    return "weights are random " + WEIGHT_PATHS[weight_dtype] + (
        " (published serving figures use NVFP4 on Blackwell and FP8 on Hopper: less weight traffic, so a larger SSM share)"
        if weight_dtype == "bf16" else "")


def notes(spec: E2ESpec) -> list[str]:
    """What every e2e figure is and is not, printed with the table and stored in the results file."""
    return [
        "prefill is not timed: each figure is one decode step with the KV cache already holding --context tokens; "
        "a decode optimisation takes no credit from another phase",
        "ITL: mean time of one decode step of the whole model over whole windows (every flush phase in), one token per "
        "sequence; tokens/s = batch / ITL",
        "MoE: the router runs, then every token goes to top-k of the experts a batch touches in expectation under "
        "uniform routing, E(1-(1-k/E)^B), in equal groups (batched products of the touched experts' weights): an "
        "approximation of a grouped-GEMM MoE with balanced routing",
        "shares: each category's ops (SSM layers, attention, MLP/MoE, the rest: embedding, norms and residual adds, LM "
        "head, sampling) timed in their own CUDA graph, over the sum of the four; 'kernel' is the SSM recurrence alone",
        weights_note(spec.weight_dtype),
        f"KV cache {spec.kv_dtype}; attention: FlashInfer's paged decode where flashinfer imports, else flash_attn_with_kvcache, "
        "else PyTorch SDPA (each row's x_attn_backend says which ran)",
        tp_note(spec),
    ]


def tp_title(spec: E2ESpec) -> str:
    """The tensor-parallel path in a few words, for the table's title."""
    if spec.tp == 1:
        return "one GPU"
    return f"tp {spec.tp}, one GPU's shard, no all-reduces" if spec.tp_launch == "one-gpu" else f"tp {spec.tp} over {spec.tp} GPUs (NCCL)"


def tp_note(spec: E2ESpec) -> str:
    """Which tensor-parallel path ran: one GPU, one GPU's shard of --tp without collectives, or --tp ranks over NCCL."""
    if spec.tp == 1:
        return "one GPU, no tensor parallelism"
    if spec.tp_launch == "one-gpu":
        return (f"--tp {spec.tp}: one GPU's shard of the group, timed alone; the all-reduces between GPUs are not run "
                f"(--tp-launch spawn runs {spec.tp} ranks and times them)")
    return (f"--tp {spec.tp} over {spec.tp} GPUs, one process each ({spec.tp_launch}), NCCL with NVLink multicast off: every rank "
            "runs its shard as vLLM splits it; the all-reduces after the embedding and every mixer and MLP/MoE block and the "
            "LM head's all-gather run in the step's CUDA graph ('comm' share; NCCL's, not vLLM's custom all-reduce); rank 0's times")


@dataclass
class E2ERun:
    """What a run did: the results as written, skips with reasons, failed checks, the largest batches that fit."""

    results: Any
    path: Path
    skipped: list[dict[str, str]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    max_batch: dict[str, int | None] = field(default_factory=dict)
    plans: dict[str, str] = field(default_factory=dict)
    interrupted: bool = False


def config_label(preset: str, variant: str, batch: int, context: int) -> str:
    return f"{preset} {variant} B{batch} ctx{context}"


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else ""


def _free_cuda() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def build_row(
    inv: Inventory, spec: E2ESpec, *, variant: str, batch: int, context: int, state_dtype: str, meas: Measurement | None,
    check_err: float | None, status: str, plan: WeightPlan, step_info: dict[str, Any],
) -> dict[str, Any]:
    """One results row of kind 'e2e' from a measurement (or a failed check, which carries no times)."""
    p = inv.preset
    row: dict[str, Any] = {
        "kind": "e2e", "op": p.kind, "preset": p.name, "variant": variant, "phase": "avg", "batch": batch,
        "window": spec.window if variant != "conventional" else None, "state_dtype": state_dtype,
        "read_dtype": spec.read_dtype if variant == "split" else None, "io_dtype": IO_DTYPE, "draft": 0, "accepted": None,
        "tp": p.tp, "layers": p.ssm_layers, "flush": "staggered", "source": "measured", "status": status,
        "tokens_per_step": 1, "check_max_err": check_err,
        "x_context": context, "x_prefill": "not timed", "x_family": inv.family.name,
        "x_blocks": ", ".join(f"{inv.count(k)} {k}" for k in ("ssm", "attn", "mlp", "moe") if inv.count(k)),
        "x_weights_gib": plan.total / GIB, "x_weight_sets": plan.sets, "x_ffn_blocks": plan.ffn_blocks,
        "x_weights_shared": plan.shared, "x_weight_dtype": inv.weight_dtype, "x_weight_path": weight_path(inv),
        "x_kv_dtype": spec.kv_dtype, "x_tp_launch": spec.tp_launch, **step_info,
    }
    if meas is None:
        return row
    us = statistics.fmean(meas.step)
    cat = meas.category_us()
    share = shares(cat)
    kernel_us = statistics.fmean(meas.kernel) if meas.kernel else 0.0
    total = sum(cat.values())
    p25, p75 = percentile(meas.step, 25), percentile(meas.step, 75)
    med = percentile(meas.step, 50)
    row.update({
        "us": us, "us_p50": med, "us_p95": percentile(meas.step, 95), "us_p99": percentile(meas.step, 99),
        "spread": (p75 - p25) / med if med > 0 else None, "us_per_token": us,
        "x_us_p25": p25, "x_us_p75": p75, "x_tokens_per_s": batch * 1e6 / us,
        **{f"x_share_{c}": share[c] for c in share},
        "x_share_ssm_kernel": kernel_us / total if total > 0 else None,
        **{f"x_us_{c}": cat[c] for c in cat}, "x_us_ssm_kernel": kernel_us,
        "x_category_sum_ratio": total / us if us > 0 else None, "x_replays": len(meas.step),
    })
    return row


def attach_speedup(row: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """speedup (and its quartile range) of a non-conventional row over the conventional row of the same preset, batch, context and dtypes."""
    if row["variant"] == "conventional" or row.get("status") != "ok":
        return
    for base in rows:
        if (base["kind"] == "e2e" and base["variant"] == "conventional" and base.get("status") == "ok"
                and all(base.get(k) == row.get(k) for k in ("preset", "batch", "x_context", "state_dtype", "tp", "x_weight_dtype", "x_kv_dtype"))):
            row["speedup"] = base["us"] / row["us"]
            row["speedup_lo"] = base["x_us_p25"] / row["x_us_p75"]
            row["speedup_hi"] = base["x_us_p75"] / row["x_us_p25"]
            if base.get("x_us_ssm_kernel") and row.get("x_us_ssm_kernel"):
                row["x_kernel_speedup"] = base["x_us_ssm_kernel"] / row["x_us_ssm_kernel"]
            return


def _cuda_free() -> int:
    return int(torch.cuda.mem_get_info()[0])


def run(
    spec: E2ESpec,
    presets: list[Preset],
    writer: Any,
    *,
    device: torch.device | str = "cuda",
    progress: bool = True,
    timer: Timer | None = None,
    free_fn: Callable[[], int | None] | None = None,
    l2_bytes: int | None = None,
    attention: str | None = None,
    families: dict[str, Family] | None = None,
    step_hook: Callable[[Step], dict[str, Any]] | None = None,
) -> E2ERun:
    """Estimate every configuration of `spec` for `presets`, writing rows as they finish.

    Per preset the weights are allocated once; per context, batch and variant a step is built (a
    size whose KV cache, states and buffers do not fit beside the weights is skipped with the
    reason and the largest batch that fits), its SSM kernels checked against the reference, and
    timed. An out-of-memory error skips the configuration; Ctrl-C closes the file incomplete.
    free_fn gives the free device memory in bytes (default: CUDA's; None from it skips the checks). step_hook is
    given every step once built (tensor_parallel.attach) and returns fields for its row.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from replayssm_cli.console import err

    from replayssm_cli.measure.energy import Session

    device = torch.device(device)
    check_spec_runnable(spec, presets, device, attention)
    if free_fn is None:
        free_fn = _cuda_free if device.type == "cuda" else (lambda: None)
    meter = Session.start() if spec.energy and device.type == "cuda" else None
    result = E2ERun(results=writer.results, path=writer.results.path)
    labels = [config_label(p.name, v, b, c) for p in presets for c in spec.contexts for b in spec.batches for v in spec.variants]
    done: set[str] = set()
    bar = Progress(
        TextColumn("[bold]e2e[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.description}"),
        console=err, transient=True, disable=not progress,
    )

    def skip(label: str, why: str) -> None:
        writer.skip(label, why)
        result.skipped.append(writer.results.skipped[-1])
        done.add(label)

    try:
        with bar:
            task = bar.add_task("", total=len(labels))
            for preset in presets:
                _run_preset(spec, preset, writer, result, skip, done, bar, task, device=device, timer=timer, free_fn=free_fn,
                            l2_bytes=l2_bytes, attention=attention, family=(families or {}).get(preset.name), meter=meter,
                            step_hook=step_hook)
    except KeyboardInterrupt:
        result.interrupted = True
        for label in labels:
            if label not in done:
                writer.skip(label, "not run: interrupted")
        result.skipped = list(writer.results.skipped)
        writer.results.spec.update(weights=result.plans, max_batch=result.max_batch)
        result.results = writer.close(complete=False)
        _free_cuda()
        return result
    writer.results.spec.update(weights=result.plans, max_batch=result.max_batch)
    result.results = writer.close(complete=True)
    return result


def _run_preset(spec, preset, writer, result, skip, done, bar, task, *, device, timer, free_fn, l2_bytes, attention, family,
                meter=None, step_hook=None) -> None:
    configs = [(c, b, v) for c in spec.contexts for b in spec.batches for v in spec.variants]
    state_dtype = spec.state_dtype or preset.state_dtype
    why = None
    try:
        inv = inventory(preset, family, spec.weight_dtype)
        free = free_fn()
        budget = int(spec.max_weights_gib * GIB) if spec.max_weights_gib else (int(free * WEIGHT_SHARE) if free is not None else None)
        plan = plan_weights(inv, budget, l2_bytes)
        bar.update(task, description=f"{preset.name}: allocating {plan.total / GIB:.1f} GiB of weights")
        weights = Weights(inv, plan.sets, device, seed=spec.seed)
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        why = f"weights do not fit ({_first_line(exc)})" if is_oom(exc) else (exc.line() if isinstance(exc, UserError) else f"{type(exc).__name__}: {_first_line(exc)}")
    if why is not None:
        # Freed here, after the except block: the exception's traceback holds the partial allocation until then.
        _free_cuda()
        for c, b, v in configs:
            skip(config_label(preset.name, v, b, c), why)
            bar.advance(task)
        return
    try:
        result.plans[preset.name] = plan.describe()
        after = free_fn()
        per_seq = {}
        for c in spec.contexts:
            for v in spec.variants:
                per_seq[c, v] = seq_bytes(inv, variant=v, context=c, window=spec.window, state_dtype=state_dtype, read_dtype=spec.read_dtype,
                                          kv_dtype=spec.kv_dtype)
                result.max_batch[f"{preset.name} {v} ctx{c}"] = max_batch(per_seq[c, v]["total"], after)
        for c, b, v in configs:
            label = config_label(preset.name, v, b, c)
            bar.update(task, description=label)
            parts = per_seq[c, v]
            largest = result.max_batch[f"{preset.name} {v} ctx{c}"]
            free = free_fn()
            need = parts["total"] * b
            if free is not None and need > free * MEMORY_SHARE - RESERVE_BYTES:
                skip(label, f"needs {need / GIB:.1f} GiB (KV cache {parts['kv'] * b / GIB:.1f}, SSM states and buffers "
                            f"{parts['ssm'] * b / GIB:.1f}, conv states {parts['conv'] * b / GIB:.2f}, activations "
                            f"{parts['activations'] * b / GIB:.2f}) beside {plan.total / GIB:.1f} GiB of weights, "
                            f"{free / GIB:.1f} GiB free; largest batch that fits: {largest}")
                bar.advance(task)
                continue
            info = {"x_max_batch": largest, "x_kv_gib": parts["kv"] * b / GIB, "x_state_gib": parts["ssm"] * b / GIB}
            why = None
            try:
                row = _measure_config(inv, spec, weights, v, b, c, state_dtype, plan, info, device=device, timer=timer, attention=attention,
                                      meter=meter, step_hook=step_hook)
            except KeyboardInterrupt:
                raise
            except Exception as exc:
                why = (f"out of memory at batch {b} (largest batch planned to fit: {largest})" if is_oom(exc)
                       else f"{type(exc).__name__}: {_first_line(exc)}")
            if why is not None:
                _free_cuda()
                skip(label, why)
                bar.advance(task)
                continue
            attach_speedup(row, writer.rows)
            writer.add(row)
            if row["status"] == "failed":
                result.failed.append(label)
            done.add(label)
            bar.advance(task)
    finally:
        del weights
        _free_cuda()


def _measure_config(inv, spec, weights, variant, batch, context, state_dtype, plan, info, *, device, timer, attention,
                    meter=None, step_hook=None) -> dict[str, Any]:
    step = Step(inv, weights, variant=variant, batch=batch, context=context, window=spec.window, state_dtype=state_dtype,
                read_dtype=spec.read_dtype, device=device, seed=spec.seed, attention=attention, kv_dtype=spec.kv_dtype)
    try:
        info = {**info, "x_attn_backend": step.attention, **(step_hook(step) if step_hook else {})}
        if "moe" in inv.blocks:
            info.update(x_experts_touched=step.touched, x_tokens_per_expert=step.per_expert)
        tol = step.tolerance()
        worst = step.check()
        common = dict(variant=variant, batch=batch, context=context, state_dtype=state_dtype, plan=plan, check_err=worst)
        if not worst <= tol:
            return build_row(inv, spec, meas=None, status="failed", step_info={**info, "x_tolerance": tol}, **common)
        # Conventional steps are timed over as many replays as ReplaySSM's whole windows, so both average alike.
        replays = spec.window * spec.windows
        clocks = None
        if device.type == "cuda":
            from replayssm_cli.model.gpus import ClockSampler

            with ClockSampler(required=False) as sampler:
                meas = measure(step, replays=replays, timer=timer)
            clocks = sampler.summary()
        else:
            meas = measure(step, replays=replays, timer=timer)
        if meter is not None:
            from replayssm_cli.measure.energy import GraphMeter

            whole = GraphMeter(meter, 1)
            graph_timer(step, select_all, 1, 0, on_graph=whole)
            info["x_energy"] = whole.fields(tokens_per_step=batch)
        if clocks and clocks.get("sm_mhz"):
            info["x_sm_mhz"] = clocks["sm_mhz"]["median"]
            info["x_throttle"] = ", ".join(clocks.get("reasons") or [])
        return build_row(inv, spec, meas=meas, status="ok", step_info=info, **common)
    finally:
        step.close()
        del step
        _free_cuda()


def dry_run(spec: E2ESpec, presets: list[Preset], *, free: int | None, l2_bytes: int | None, families: dict[str, Family] | None = None) -> list[dict[str, Any]]:
    """The inventory, weight plan and memory plan of each preset, without allocating anything.

    Per preset: the inventory dict, the weight plan (or the reason none fits), and per context and
    variant the bytes per sequence, the largest batch that fits in `free` bytes (None: unknown)
    and whether each requested batch fits.
    """
    out = []
    for preset in presets:
        inv = inventory(preset, (families or {}).get(preset.name), spec.weight_dtype)
        state_dtype = spec.state_dtype or preset.state_dtype
        budget = int(spec.max_weights_gib * GIB) if spec.max_weights_gib else (int(free * WEIGHT_SHARE) if free is not None else None)
        entry: dict[str, Any] = {"inventory": inv.to_dict(), "state_dtype": state_dtype, "weight_dtype": spec.weight_dtype,
                                 "kv_dtype": spec.kv_dtype, "predicted": predicted_shares(inv, spec, state_dtype)}
        try:
            plan = plan_weights(inv, budget, l2_bytes)
        except UserError as exc:
            entry["weights"] = {"error": exc.line()}
            out.append(entry)
            continue
        entry["weights"] = {**plan.to_dict(), "describe": plan.describe()}
        after = None if free is None else free - plan.total
        memory = []
        for c in spec.contexts:
            for v in spec.variants:
                parts = seq_bytes(inv, variant=v, context=c, window=spec.window, state_dtype=state_dtype, read_dtype=spec.read_dtype,
                                  kv_dtype=spec.kv_dtype)
                mb = max_batch(parts["total"], after)
                memory.append({"context": c, "variant": v, "per_seq": parts, "max_batch": mb,
                               "fits": {b: (mb is None or b <= mb) for b in spec.batches}})
        entry["memory"] = memory
        out.append(entry)
    return out


def environment(device_index: int = 0) -> dict[str, Any]:
    """Software versions, CUDA, and the GPU as NVML and torch see it (NVML missing is recorded, not fatal)."""
    from replayssm_cli.model import gpus
    from replayssm_cli.measure.environment import cuda_runtime, software

    env: dict[str, Any] = {**software(), **cuda_runtime(), "mode": "measured"}
    props = torch.cuda.get_device_properties(device_index)
    free, total = torch.cuda.mem_get_info(device_index)
    gpu: dict[str, Any] = {"name": props.name, "memory_total": total, "memory_free": free, "sm_count": props.multi_processor_count,
                           "l2_bytes": getattr(props, "L2_cache_size", None), "key": None}
    try:
        detected = gpus.detect(device_index)
        gpu.update(driver=detected.driver, uuid=detected.uuid, compute_capability=detected.compute_capability,
                   max_sm_clock_mhz=detected.max_sm_clock_mhz, max_mem_clock_mhz=detected.max_mem_clock_mhz,
                   power_limit_w=detected.power_limit_w, key=detected.spec.key if detected.spec else None)
    except UserError as exc:
        gpu["nvml_error"] = exc.line()
    env["gpu"] = gpu
    env["attention_backend"] = attention_backend(torch.device("cuda"))
    env["flash_attn"] = env["attention_backend"] == "flash-attn"
    return env


