"""A hybrid model's whole decode step as data: its blocks in layer order, their weights and per-sequence bytes, the weight
plan that fits a GPU, and the bytes each category moves per step; no torch at import."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from replayssm_cli.errors import UserError
from replayssm_cli.model import cost, ops
from replayssm_cli.model.presets import Preset, pattern_counts, unwrap_config
from replayssm_cli.model.shapes import state_bytes

# The short causal convolution before every SSM kernel: its taps (replayssm_kernels.e2e_ops.conv_update unrolls 4).
CONV_WIDTH = 4
# Matrices the engines' FP8 and NVFP4 checkpoints keep in bf16 (ModelOpt excludes the LM head; the router and
# the shared-expert gate are tiny); a matrix whose sizes are not multiples of QUANT_ALIGN stays bf16 too.
KEPT_BF16 = ("embedding", "lm_head", "router", "shared_gate")
# A shared MLP/MoE weight pool must exceed the L2 this many times over what one step reads of it, so weights come from DRAM.
L2_MULTIPLE = 4
CATEGORIES = ("ssm", "attn", "mlp", "other")
# Block letters as in Nemotron-H's hybrid_override_pattern: M SSM mixer, * attention, - dense MLP, E MoE.
BLOCK_KIND = {"M": "ssm", "*": "attn", "-": "mlp", "E": "moe"}
IO_DTYPE = "bf16"
WEIGHT_ITEMSIZE = 2
# Weight precisions: bf16 and fp8 run; nvfp4 (Blackwell's FP4 tensor cores) is a --dry-run plan only.
WEIGHT_DTYPES = ("bf16", "fp8", "nvfp4")
RUNNABLE_WEIGHT_DTYPES = ("bf16", "fp8")
KV_DTYPES = ("bf16", "fp8")
QUANT_ALIGN = 16
# Bytes per weight: fp8 e4m3 with one fp32 scale per tensor (per expert for MoE); NVFP4 e2m1 with one fp8 scale per
# 16 weights and one fp32 scale per tensor.
WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0, "nvfp4": 0.5 + 1 / 16}
SCALE_BYTES = {"bf16": 0, "fp8": 4, "nvfp4": 4}
# Static activation scale of the fp8 products: inputs up to this magnitude are represented (RMS-normed activations are ~1).
ACT_AMAX = 16.0
# FlashInfer's paged KV: tokens per page (vLLM's default block size) and the decode wrapper's workspace.
PAGE_SIZE = 16
KV_ITEMSIZE = {"bf16": 2, "fp8": 1}
FLASHINFER_WORKSPACE = 128 * 2**20
# Without --max-weights-gib, the weights may take this share of the free memory; the rest holds KV caches and states.
WEIGHT_SHARE = 0.3
# Share of the free memory the batch-dependent tensors may plan for, and what stays aside for workspaces and graph pools.
MEMORY_SHARE = 0.9
RESERVE_BYTES = 2 * 2**30
# Activations are planned at this many times the widest per-token tensors (temporaries live in the graph's pool).
ACTIVATION_COPIES = 4
GIB = 2**30
MIB = 2**20


@dataclass(frozen=True)
class Family:
    """What a model family's blocks look like beyond the preset's sizes."""

    name: str
    mlp: str
    attn_gate: bool
    qk_norm: bool
    rotary: float
    shared_gate: bool
    source: str

    @property
    def up_factor(self) -> int:
        """Up-projection width over the intermediate size: 2 for SwiGLU (gate and up), 1 for squared ReLU."""
        return 2 if self.mlp == "swiglu" else 1
FAMILIES = {
    "nemotron-h": Family(
        "nemotron-h", mlp="relu2", attn_gate=False, qk_norm=False, rotary=0.0, shared_gate=False,
        source="transformers models/nemotron_h: squared-ReLU MLP and experts (up, down), attention without positional embedding",
    ),
    "qwen3-next": Family(
        "qwen3-next", mlp="swiglu", attn_gate=True, qk_norm=True, rotary=0.25, shared_gate=True,
        source="transformers models/qwen3_next: gated attention (query projection twice as wide), QK RMSNorm, "
        "RoPE on a quarter of the head dim, SwiGLU experts, sigmoid-gated shared expert",
    ),
    "generic": Family(
        "generic", mlp="swiglu", attn_gate=False, qk_norm=False, rotary=1.0, shared_gate=False,
        source="Llama-style blocks: SwiGLU MLP, RoPE over the whole head dim",
    ),
}


def family_of(preset: Preset) -> Family:
    """The block family of a preset: Gated DeltaNet presets are Qwen3-Next/3.5, Nemotron Mamba-2 presets Nemotron-H, others generic."""
    if ops.named(preset.kind).family:
        return FAMILIES[ops.named(preset.kind).family]
    names = f"{preset.name} {preset.display} {preset.hf_id or ''}".lower()
    return FAMILIES["nemotron-h" if "nemotron" in names else "generic"]


@dataclass(frozen=True)
class Linear:
    """One weight matrix as a decode step uses it: k input features, n outputs, stacked `experts` times for MoE."""

    name: str
    k: int
    n: int
    experts: int = 1

    @property
    def params(self) -> int:
        return self.experts * self.k * self.n

    def quantized(self, weight_dtype: str) -> bool:
        """Whether this matrix is stored at `weight_dtype` (else bf16): not a kept matrix, and its sizes aligned."""
        return (weight_dtype != "bf16" and self.name not in KEPT_BF16
                and self.k % QUANT_ALIGN == 0 and self.n % QUANT_ALIGN == 0)

    def nbytes(self, weight_dtype: str = "bf16") -> int:
        """Bytes of this matrix (all experts) at `weight_dtype`, scales included."""
        if not self.quantized(weight_dtype):
            return self.params * WEIGHT_ITEMSIZE
        return math.ceil(self.params * WEIGHT_BYTES[weight_dtype]) + self.experts * SCALE_BYTES[weight_dtype]

    def label(self) -> str:
        return (f"{self.experts}x " if self.experts > 1 else "") + f"{self.name} {self.k}→{self.n}"


@dataclass(frozen=True)
class Block:
    """One kind of block (ssm, attn, mlp, moe or head) on one GPU: its matrices and the sizes its other ops need."""

    kind: str
    linears: tuple[Linear, ...]
    sizes: dict[str, int] = field(default_factory=dict)

    def linear(self, name: str) -> Linear:
        for lin in self.linears:
            if lin.name == name:
                return lin
        raise KeyError(f"{self.kind} block has no matrix {name!r}")

    def has(self, name: str) -> bool:
        return any(lin.name == name for lin in self.linears)

    @property
    def params(self) -> int:
        """Matrix parameters plus the vectors (norm weights, conv taps) listed under sizes['vector_params']."""
        return sum(lin.params for lin in self.linears) + self.sizes.get("vector_params", 0)

    def nbytes(self, weight_dtype: str = "bf16") -> int:
        """Bytes of the block's weights at `weight_dtype` (vectors stay bf16)."""
        return sum(lin.nbytes(weight_dtype) for lin in self.linears) + self.sizes.get("vector_params", 0) * WEIGHT_ITEMSIZE


@dataclass(frozen=True)
class Inventory:
    """Every block of one decode step of a preset, as one GPU of `tp` sees it, in model order."""

    preset: Preset
    family: Family
    order: str
    order_source: str
    blocks: dict[str, Block]
    head: Block
    dims: dict[str, int]
    weight_dtype: str = "bf16"

    def count(self, kind: str) -> int:
        return sum(1 for c in self.order if BLOCK_KIND[c] == kind)

    @property
    def ffn_blocks(self) -> int:
        return self.count("mlp") + self.count("moe")

    def unique_bytes(self) -> int:
        """Bytes of the weights every SSM and attention block owns, plus the embedding, final norm and LM head."""
        wd = self.weight_dtype
        return sum(self.blocks[k].nbytes(wd) * self.count(k) for k in ("ssm", "attn") if k in self.blocks) + self.head.nbytes(wd)

    def ffn_set_bytes(self) -> int:
        """Bytes of one weight set of the shared pool: one block of each MLP/MoE kind the model has, all experts."""
        return sum(self.blocks[k].nbytes(self.weight_dtype) for k in ("mlp", "moe") if k in self.blocks)

    def full_bytes(self) -> int:
        ffn = sum(self.blocks[k].nbytes(self.weight_dtype) * self.count(k) for k in ("mlp", "moe") if k in self.blocks)
        return self.unique_bytes() + ffn

    def ffn_read_bytes(self, batch: int) -> int:
        """Weight bytes one MLP/MoE block reads per step at `batch`: every matrix, but only the experts the batch touches."""
        out = 0
        for kind in ("mlp", "moe"):
            if kind not in self.blocks:
                continue
            block = self.blocks[kind]
            touched = experts_touched(self.dims["experts"], self.dims["topk"], batch) if kind == "moe" else 1
            out = max(out, sum(lin.nbytes(self.weight_dtype) // lin.experts * (touched if lin.experts > 1 else 1) for lin in block.linears))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "preset": self.preset.name,
            "tp": self.preset.tp,
            "family": asdict(self.family),
            "order": self.order,
            "order_source": self.order_source,
            "counts": {k: self.count(k) for k in ("ssm", "attn", "mlp", "moe")},
            "dims": self.dims,
            "blocks": {k: {"linears": [asdict(lin) for lin in b.linears], "sizes": b.sizes, "params": b.params}
                       for k, b in {**self.blocks, "head": self.head}.items()},
            "weight_dtype": self.weight_dtype,
            "weights_bytes": {"unique": self.unique_bytes(), "ffn_set": self.ffn_set_bytes(), "full": self.full_bytes()},
            "kept_bf16": sorted({lin.name for b in (*self.blocks.values(), self.head) for lin in b.linears
                                 if not lin.quantized(self.weight_dtype)}) if self.weight_dtype != "bf16" else [],
        }


def experts_touched(experts: int, topk: int, batch: int) -> int:
    """Distinct experts a batch routes to, in expectation under uniform routing: E (1 - (1 - k/E)^batch), at least k."""
    if experts <= 0 or topk <= 0:
        return 0
    expected = experts * (1.0 - (1.0 - topk / experts) ** batch)
    return max(topk, min(experts, round(expected)))


def _needed(preset: Preset, counts: dict[str, int]) -> list[str]:
    need = ["hidden_size", "vocab_size"]
    if preset.attn_layers:
        need += ["num_attention_heads", "num_key_value_heads", "head_dim"]
    if counts["mlp"]:
        need += ["intermediate_size"]
    if counts["moe"]:
        need += ["num_experts", "experts_per_token", "moe_intermediate_size"]
    return need


def _ffn_counts(preset: Preset) -> dict[str, int]:
    e2e = preset.e2e or {}
    return {"mlp": int(e2e.get("mlp_layers", 0)), "moe": int(e2e.get("moe_layers", 0))}


def required_fields(preset: Preset) -> list[str]:
    """The [e2e] fields the estimate needs from this preset that it lacks (empty when complete)."""
    e2e = preset.e2e or {}
    return [k for k in _needed(preset, _ffn_counts(preset)) if k not in e2e]


def _pattern_from_file(preset: Preset) -> str | None:
    """The layer pattern written in the preset's own file (a TOML layer_pattern or a config's hybrid_override_pattern)."""
    path = Path(preset.origin) if preset.origin else None
    if path is None or not path.is_file():
        return None
    try:
        if path.suffix.lower() == ".toml":
            import tomllib

            with open(path, "rb") as f:
                value = tomllib.load(f).get("layer_pattern")
        else:
            value = unwrap_config(json.loads(path.read_text(encoding="utf-8"))).get("hybrid_override_pattern")
    except (OSError, ValueError):
        return None
    return str(value) if value else None


def _spread(total: int, picked: int, i: int) -> int:
    """How many of `picked` items land at slot i when spread evenly over `total` slots."""
    return (i + 1) * picked // total - i * picked // total


def layer_order(preset: Preset) -> tuple[str, str]:
    """The model's blocks in order as a pattern (M, *, -, E) and where it came from.

    The preset file's own pattern when its counts match the preset; otherwise attention spread evenly
    among the mixers, and the MLP/MoE blocks spread evenly after them (one after each mixer when the
    counts are equal, as in Qwen3.5's decoder layers).
    """
    counts = _ffn_counts(preset)
    written = _pattern_from_file(preset)
    if written:
        try:
            got = pattern_counts(written)
        except UserError:
            got = None
        if got == {"ssm": preset.ssm_layers, "attn": preset.attn_layers, **counts}:
            return written, "preset file"
    mixers = preset.ssm_layers + preset.attn_layers
    ffn = counts["mlp"] + counts["moe"]
    out = []
    j = 0
    for i in range(mixers):
        out.append("*" if _spread(mixers, preset.attn_layers, i) else "M")
        for _ in range(_spread(mixers, ffn, i)):
            out.append("-" if _spread(ffn, counts["mlp"], j) else "E")
            j += 1
    return "".join(out), "spread evenly"


def _per_gpu(value: int, tp: int, what: str, preset: Preset) -> int:
    if value % tp:
        raise UserError(f"tp={tp} does not divide {preset.display}'s {what}={value}", "choose a --tp that divides it")
    return value // tp


def inventory(preset: Preset, family: Family | None = None, weight_dtype: str = "bf16") -> Inventory:
    """The layer inventory of one decode step of `preset` on one GPU of its tensor-parallel group (preset.tp).

    Raises UserError, in one line naming every missing [e2e] field, when the preset lacks what the
    step needs, and when tp does not divide the attention heads or the MLP sizes.
    """
    missing = required_fields(preset)
    if missing:
        raise UserError(
            f"preset {preset.name} lacks what the e2e estimate needs: {', '.join('e2e.' + k for k in missing)}",
            "the config.json lacks them: write a preset .toml with them under [e2e] (see profiles/models/)"
            if preset.origin.endswith(".json") else "add them under [e2e] in the preset file, each with a source",
        )
    family = family or family_of(preset)
    e2e = dict(preset.e2e or {})
    tp = preset.tp
    order, order_source = layer_order(preset)
    hidden = e2e["hidden_size"]
    dims: dict[str, int] = {"hidden": hidden, "vocab": -(-e2e["vocab_size"] // tp), "tp": tp}
    blocks: dict[str, Block] = {}

    mixer = ops.of(preset.shape).mixer_sizes(preset.shape)
    inner, conv_dim, in_n, group = mixer["inner"], mixer["conv_dim"], mixer["in_proj"], mixer["norm_group"]
    blocks["ssm"] = Block(
        "ssm",
        (Linear("in_proj", hidden, in_n), Linear("out_proj", inner, hidden)),
        {"inner": inner, "conv_dim": conv_dim, "norm_group": group, "conv_width": CONV_WIDTH,
         "vector_params": hidden + conv_dim * (CONV_WIDTH + 1) + inner},
    )
    if preset.attn_layers:
        heads = _per_gpu(e2e["num_attention_heads"], tp, "num_attention_heads", preset)
        kv = e2e["num_key_value_heads"]
        if kv >= tp:
            kv = _per_gpu(kv, tp, "num_key_value_heads", preset)
        elif tp % kv:
            raise UserError(f"tp={tp} is not a multiple of {preset.display}'s num_key_value_heads={kv}", "choose another --tp")
        else:
            # Fewer KV heads than GPUs: each GPU keeps one, replicated, as vLLM does.
            kv = 1
        if heads % kv:
            raise UserError(f"{preset.display}: {heads} attention heads per GPU are not a multiple of {kv} KV heads")
        hd = e2e["head_dim"]
        q_width = heads * (2 if family.attn_gate else 1)
        rotary = int(hd * family.rotary) // 2 * 2
        blocks["attn"] = Block(
            "attn",
            (Linear("qkv_proj", hidden, (q_width + 2 * kv) * hd), Linear("o_proj", heads * hd, hidden)),
            {"heads": heads, "kv_heads": kv, "head_dim": hd, "q_width": q_width, "rotary": rotary,
             "vector_params": hidden + 2 * hd},
        )
        dims.update(heads=heads, kv_heads=kv, head_dim=hd)
    up = family.up_factor
    if _ffn_counts(preset)["mlp"]:
        inter = _per_gpu(e2e["intermediate_size"], tp, "intermediate_size", preset)
        blocks["mlp"] = Block(
            "mlp", (Linear("up_proj", hidden, up * inter), Linear("down_proj", inter, hidden)),
            {"intermediate": inter, "vector_params": hidden},
        )
        dims["intermediate"] = inter
    if _ffn_counts(preset)["moe"]:
        experts, topk = e2e["num_experts"], e2e["experts_per_token"]
        if not 1 <= topk <= experts:
            raise UserError(f"{preset.display}: experts_per_token={topk} must be between 1 and num_experts={experts}")
        inter = _per_gpu(e2e["moe_intermediate_size"], tp, "moe_intermediate_size", preset)
        latent = e2e.get("moe_latent_size", 0)
        width = latent or hidden
        lins = [Linear("router", hidden, experts)]
        if latent:
            lins.append(Linear("latent_in", hidden, latent))
        lins += [Linear("experts_up", width, up * inter, experts), Linear("experts_down", inter, width, experts)]
        if latent:
            lins.append(Linear("latent_out", latent, hidden))
        shared = e2e.get("shared_expert_intermediate_size", 0)
        if shared:
            shared = _per_gpu(shared, tp, "shared_expert_intermediate_size", preset)
            lins += [Linear("shared_up", hidden, up * shared), Linear("shared_down", shared, hidden)]
            if family.shared_gate:
                lins.append(Linear("shared_gate", hidden, 1))
        blocks["moe"] = Block(
            "moe", tuple(lins),
            {"experts": experts, "topk": topk, "intermediate": inter, "latent": latent, "shared": shared, "vector_params": hidden},
        )
        dims.update(experts=experts, topk=topk, moe_intermediate=inter, latent=latent)
    head = Block(
        "head",
        (Linear("embedding", dims["vocab"], hidden), Linear("lm_head", hidden, dims["vocab"])),
        {"vocab": dims["vocab"], "vector_params": hidden},
    )
    if weight_dtype not in WEIGHT_DTYPES:
        raise UserError(f"weight dtype {weight_dtype!r} is not one the estimate knows", f"choose from {', '.join(WEIGHT_DTYPES)}")
    return Inventory(preset=preset, family=family, order=order, order_source=order_source, blocks=blocks, head=head, dims=dims,
                     weight_dtype=weight_dtype)


@dataclass(frozen=True)
class WeightPlan:
    """How the weights are laid out: unique for SSM, attention and head; `sets` MLP/MoE sets shared round-robin."""

    unique: int
    set_bytes: int
    ffn_blocks: int
    sets: int
    full: int
    budget: int | None
    l2_bytes: int | None
    read_per_block: int
    weight_dtype: str = "bf16"

    @property
    def total(self) -> int:
        return self.unique + self.sets * self.set_bytes if self.shared else self.full

    @property
    def shared(self) -> bool:
        return self.sets < self.ffn_blocks

    def describe(self) -> str:
        if not self.shared:
            return f"weights {self.total / GIB:.1f} GiB {self.weight_dtype}, every block its own"
        pool = self.sets * self.read_per_block
        l2 = f", {pool / self.l2_bytes:.0f}x the {self.l2_bytes / MIB:.0f} MiB L2" if self.l2_bytes else ""
        return (
            f"weights {self.total / GIB:.1f} GiB {self.weight_dtype}: the {self.ffn_blocks} MLP/MoE blocks share {self.sets} weight "
            f"set{'s' if self.sets > 1 else ''} of {self.set_bytes / GIB:.2f} GiB round-robin; one pass over the pool "
            f"reads {pool / MIB:.0f} MiB at batch 1{l2}, so its weights come from DRAM (a product's time depends on "
            "its shape, not on which weights it reads)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total, "shared": self.shared}


def plan_weights(inv: Inventory, budget: int | None, l2_bytes: int | None) -> WeightPlan:
    """Every block its own weights when they fit in `budget` bytes (None: no limit), else a pool of MLP/MoE sets.

    Raises UserError when not even the unique weights and one set fit, or when the pool that fits
    would be read from L2 (its batch-1 read under L2_MULTIPLE times the L2).
    """
    n, set_bytes, unique = inv.ffn_blocks, inv.ffn_set_bytes(), inv.unique_bytes()
    read = inv.ffn_read_bytes(1)
    sets = n
    if budget is not None and inv.full_bytes() > budget:
        sets = int((budget - unique) // set_bytes) if set_bytes else 0
        if sets < 1:
            raise UserError(
                f"{inv.preset.name}: the weights need at least {(unique + set_bytes) / GIB:.1f} GiB (every SSM and attention "
                f"block's own plus one MLP/MoE set), over the {budget / GIB:.1f} GiB weight budget",
                "raise --max-weights-gib, or free GPU memory",
            )
        sets = min(sets, n)
        needed = math.ceil(L2_MULTIPLE * l2_bytes / read) if l2_bytes and read else 1
        if sets < min(needed, n):
            raise UserError(
                f"{inv.preset.name}: {sets} shared MLP/MoE weight set(s) would be served from the {l2_bytes / MIB:.0f} MiB L2 "
                f"(a step reads {read / MIB:.0f} MiB of each; {needed} are needed)",
                "raise --max-weights-gib",
            )
    return WeightPlan(unique=unique, set_bytes=set_bytes, ffn_blocks=n, sets=sets, full=inv.full_bytes(), budget=budget,
                      l2_bytes=l2_bytes, read_per_block=read, weight_dtype=inv.weight_dtype)


def _ssm_input_elems(inv: Inventory) -> int:
    s = inv.preset.shape
    return ops.of(s).input_elems(s)


def seq_bytes(inv: Inventory, *, variant: str, context: int, window: int | None, state_dtype: str, read_dtype: str | None,
              kv_dtype: str = "bf16") -> dict[str, int]:
    """Bytes one sequence adds to the step, by part: KV cache, SSM states and buffers, conv states, activations."""
    shape = inv.preset.shape
    d = inv.dims
    kv = inv.count("attn") * 2 * d.get("kv_heads", 0) * context * d.get("head_dim", 0) * KV_ITEMSIZE[kv_dtype]
    ssm = inv.blocks["ssm"]
    conv = inv.count("ssm") * (CONV_WIDTH - 1) * ssm.sizes["conv_dim"] * WEIGHT_ITEMSIZE
    kept = cost.memory_per_seq(
        shape, variant, window=window if variant != "conventional" else None, state_dtype=state_dtype,
        read_dtype=read_dtype if variant == "split" else None, io_dtype=IO_DTYPE,
    )["total"]
    from replayssm_cli.measure import bench

    inputs = _ssm_input_elems(inv) * WEIGHT_ITEMSIZE * bench.INPUT_SETS * 2
    initial = state_bytes(shape, state_dtype)
    # As bench.Case allocates: each layer's pool and input sets, one initial state shared by all layers, and the check's copies.
    states = inv.count("ssm") * (kept + inputs) + initial + bench.CHECK_LAYERS * (kept + initial)
    widths = [lin.n for b in inv.blocks.values() for lin in b.linears if lin.experts == 1]
    if "moe" in inv.blocks:
        moe = inv.blocks["moe"]
        widths.append(d["topk"] * (moe.linear("experts_up").n + 2 * moe.linear("experts_up").k))
    act = ACTIVATION_COPIES * WEIGHT_ITEMSIZE * (3 * d["hidden"] + max(widths) + 3 * d["vocab"])
    parts = {"kv": kv, "ssm": states, "conv": conv, "activations": act}
    parts["total"] = sum(parts.values())
    return parts


def max_batch(per_seq: int, free: int | None) -> int | None:
    """The largest batch whose per-sequence tensors fit in `free` bytes (after the weights), or None when unknown."""
    if free is None:
        return None
    return max(0, int((free * MEMORY_SHARE - RESERVE_BYTES) // max(per_seq, 1)))
PREDICTION_METHOD = ("predicted: DRAM bytes one decode step moves per category (weights read at the batch's experts, KV cache, "
                     "SSM state traffic from the cost model averaged over the window, conv states, embedding rows and LM "
                     "head) over one bandwidth; no compute or launch term, so a kernel that runs below the bandwidth takes "
                     "a larger share of the step than predicted")


def step_bytes(inv: Inventory, *, variant: str, batch: int, context: int, window: int, state_dtype: str, read_dtype: str | None,
               kv_dtype: str = "bf16") -> dict[str, int]:
    """DRAM bytes of one decode step of the whole model by category (ssm, attn, mlp, other): the prediction's input."""
    p, d, wd = inv.preset, inv.dims, inv.weight_dtype
    ssm_block = inv.blocks["ssm"]
    kernel = cost.step_cost(p.shape, variant, "avg", batch=batch, window=window if variant != "conventional" else None,
                            state_dtype=state_dtype, read_dtype=read_dtype if variant == "split" else None, io_dtype=IO_DTYPE,
                            has_z=p.has_z).total_bytes
    conv = 2 * (CONV_WIDTH - 1) * ssm_block.sizes["conv_dim"] * WEIGHT_ITEMSIZE * batch
    out = {"ssm": inv.count("ssm") * (ssm_block.nbytes(wd) + kernel + conv), "attn": 0, "mlp": 0,
           "other": batch * d["hidden"] * WEIGHT_ITEMSIZE + inv.head.linear("lm_head").nbytes(wd)}
    if "attn" in inv.blocks:
        kv = 2 * d["kv_heads"] * context * d["head_dim"] * KV_ITEMSIZE[kv_dtype] * batch
        out["attn"] = inv.count("attn") * (inv.blocks["attn"].nbytes(wd) + kv)
    out["mlp"] = inv.ffn_blocks * inv.ffn_read_bytes(batch)
    return out


def predicted_shares(inv: Inventory, spec: Any, state_dtype: str) -> list[dict[str, Any]]:
    """Per context and batch: the step's bytes, each category's predicted share of the conventional step, and ReplaySSM's
    predicted end-to-end speedup over it (bytes over bytes), all marked predicted."""
    out = []
    replay = next((v for v in spec.variants if v != "conventional"), "replay")
    for c in spec.contexts:
        for b in spec.batches:
            kw = dict(batch=b, context=c, window=spec.window, state_dtype=state_dtype, read_dtype=spec.read_dtype, kv_dtype=spec.kv_dtype)
            base = step_bytes(inv, variant="conventional", **kw)
            fast = step_bytes(inv, variant=replay, **kw)
            total = sum(base.values())
            out.append({
                "context": c, "batch": b, "source": "predicted", "method": PREDICTION_METHOD, "weight_dtype": inv.weight_dtype,
                "bytes": base, "weight_bytes_read": _weight_read(inv, b), "shares": {k: v / total for k, v in base.items()},
                "variant": replay, "speedup": total / sum(fast.values()), "speedup_over": "conventional",
            })
    return out


def _weight_read(inv: Inventory, batch: int) -> int:
    """Weight bytes one step reads at `batch` (MoE: the experts the batch touches)."""
    wd = inv.weight_dtype
    mixers = sum(inv.blocks[k].nbytes(wd) * inv.count(k) for k in ("ssm", "attn") if k in inv.blocks)
    return mixers + inv.ffn_blocks * inv.ffn_read_bytes(batch) + inv.head.linear("lm_head").nbytes(wd)
