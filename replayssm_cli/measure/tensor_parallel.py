"""Tensor parallelism of the whole-model decode step as vLLM shards it: the collectives, every weight's split, a
plain-PyTorch step of one rank's shard (the check of the split), the collectives put into the timed step, the ranks."""

from __future__ import annotations

import datetime
import os
import socket
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from replayssm_cli.errors import UserError
from replayssm_cli.measure.e2e import TP_LAUNCHES as LAUNCHES, Op, Step
from replayssm_cli.model.hybrid import BLOCK_KIND, CONV_WIDTH, Family, Inventory, inventory
from replayssm_cli.model import ops
from replayssm_cli.model.presets import Preset, with_tp

# NVLink multicast stays off in every rank, also under torchrun: a program using it can take a shared host's GPUs down.
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# A rank that fails on its own leaves the others in a collective: they give up after this long.
COLLECTIVE_TIMEOUT_S = 600
STOP_WAIT_S = 5
INTERRUPT_GRACE_S = 30
EXIT_INTERRUPTED = 130
ITEMSIZE = {"bf16": 2, "fp32": 4}
EPS = 1e-6


@dataclass(frozen=True)
class Collective:
    """One collective of a decode step on every rank: its kind, the op it follows, elements per sequence and dtype."""

    kind: str
    after: str
    elems: int
    dtype: str = "bf16"

    @property
    def name(self) -> str:
        return f"{self.after}.{self.kind}"


def reduce_point(letter: str, i: int) -> str:
    """The op after which block i's partial output is all-reduced (its row-parallel projection, or the MLP/MoE op)."""
    kind = BLOCK_KIND[letter]
    return f"{letter}{i}." + {"ssm": "out_proj", "attn": "o_proj"}.get(kind, kind)


def global_norm(inv: Inventory) -> bool:
    """Whether the SSM's gated norm spans the ranks: one Mamba-2 group split over them, whose sum of squares vLLM all-reduces."""
    p = inv.preset
    return ops.named(p.kind).tp_norm_spans_ranks(p.full_shape or p.shape, p.has_z, p.tp)


def collectives(inv: Inventory) -> list[Collective]:
    """The collectives of one decode step of `inv` (sizes per rank, inv.preset.tp ranks), in model order, as vLLM runs them.

    The vocabulary-parallel embedding's all-reduce; after every mixer and MLP/MoE block the all-reduce of its row-parallel
    output (a MoE block's routed and shared experts summed first); a single-group Mamba-2 gated norm's sum of squares;
    the LM head's all-gather of the logits. None on one rank.
    """
    if inv.preset.tp == 1:
        return []
    hidden = inv.dims["hidden"]
    out = [Collective("all_reduce", "embed", hidden)]
    for i, letter in enumerate(inv.order):
        if BLOCK_KIND[letter] == "ssm" and global_norm(inv):
            out.append(Collective("all_reduce", f"{letter}{i}.gated_norm", 1, "fp32"))
        out.append(Collective("all_reduce", reduce_point(letter, i), hidden))
    out.append(Collective("all_gather", "lm_head", inv.dims["vocab"]))
    return out


def plan_summary(inv: Inventory, batch: int | None = None) -> dict[str, Any]:
    """Counts of a step's collectives and the bytes each rank contributes per sequence (and per step at `batch`)."""
    plan = collectives(inv)
    per_seq = sum(c.elems * ITEMSIZE[c.dtype] for c in plan)
    out: dict[str, Any] = {"ranks": inv.preset.tp, "all_reduce": sum(c.kind == "all_reduce" for c in plan),
                           "all_gather": sum(c.kind == "all_gather" for c in plan), "bytes_per_seq": per_seq}
    if batch is not None:
        out["bytes_per_step"] = per_seq * batch
    return out


# A tensor dimension is a list of segments (full size, rule): "split" takes the rank's 1/tp chunk (heads, groups,
# intermediate features), "whole" replicates it, ("kv", heads, head_dim) splits KV heads or, with fewer KV heads than
# ranks, gives rank r head r // (tp / heads), as vLLM's QKVParallelLinear does.


def _piece(size: int, rule: Any, rank: int, tp: int) -> tuple[int, int]:
    if rule == "whole":
        return 0, size
    if rule == "split":
        return rank * size // tp, size // tp
    _, heads, width = rule
    if heads >= tp:
        return rank * size // tp, size // tp
    return rank // (tp // heads) * width, width


def _take(t: torch.Tensor, dim: int, segments: list[tuple[int, Any]], rank: int, tp: int) -> torch.Tensor:
    parts, offset = [], 0
    for size, rule in segments:
        start, length = _piece(size, rule, rank, tp)
        parts.append(t.narrow(dim, offset + start, length))
        offset += size
    if offset != t.shape[dim]:
        raise ValueError(f"segments cover {offset} of dimension {dim} ({t.shape[dim]})")
    return torch.cat(parts, dim=dim)


def _mixer_segments(full: Inventory, tp: int) -> dict[str, list[tuple[int, Any]]]:
    """The segments of the SSM mixer's in_proj outputs, conv channels and per-head vectors (full sizes) over tp ranks."""
    p = full.preset
    return ops.named(p.kind).tp_segments(p.shape, tp)


def _segments(full: Inventory, tp: int) -> dict[tuple[str, str], tuple[int, list[tuple[int, Any]]]]:
    """(block kind, tensor name) -> (dimension, segments) for every split tensor of the full inventory; the rest replicate."""
    out: dict[tuple[str, str], tuple[int, list]] = {}
    m = _mixer_segments(full, tp)
    out.update({("ssm", "in_proj"): (0, m["in_proj"]), ("ssm", "conv_w"): (0, m["conv"]), ("ssm", "conv_b"): (0, m["conv"]),
                ("ssm", "A_log"): (0, m["heads"]), ("ssm", "D"): (0, m["heads"]), ("ssm", "dt_bias"): (0, m["heads"]),
                ("ssm", "gnorm"): (0, m["inner"]), ("ssm", "out_proj"): (1, m["inner"])})
    up = full.family.up_factor
    if "attn" in full.blocks:
        a = full.blocks["attn"].sizes
        q = a["heads"] * a["head_dim"]
        kv = (a["kv_heads"] * a["head_dim"], ("kv", a["kv_heads"], a["head_dim"]))
        out[("attn", "qkv_proj")] = (0, [(q, "split")] * (2 if full.family.attn_gate else 1) + [kv, kv])
        out[("attn", "o_proj")] = (1, [(q, "split")])
    if "mlp" in full.blocks:
        inter = full.blocks["mlp"].sizes["intermediate"]
        out[("mlp", "up_proj")] = (0, [(inter, "split")] * up)
        out[("mlp", "down_proj")] = (1, [(inter, "split")])
    if "moe" in full.blocks:
        s = full.blocks["moe"].sizes
        out[("moe", "experts_up")] = (1, [(s["intermediate"], "split")] * up)
        out[("moe", "experts_down")] = (2, [(s["intermediate"], "split")])
        if s["shared"]:
            out[("moe", "shared_up")] = (0, [(s["shared"], "split")] * up)
            out[("moe", "shared_down")] = (1, [(s["shared"], "split")])
    return out


def _padded_vocab(t: torch.Tensor, tp: int) -> torch.Tensor:
    """Rows padded to a multiple of tp (vLLM pads the vocabulary so every rank holds the same number of rows)."""
    rows = -(-t.shape[0] // tp) * tp
    return torch.cat([t, t.new_zeros(rows - t.shape[0], *t.shape[1:])]) if rows > t.shape[0] else t


def shard_weights(full: Inventory, weights: dict[str, Any], rank: int, tp: int) -> dict[str, Any]:
    """Rank `rank`'s shard of the full model's `weights` (full_weights), split as vLLM splits them."""
    rules = _segments(full, tp)
    blocks = []
    for letter, block in zip(full.order, weights["blocks"]):
        kind = BLOCK_KIND[letter]
        blocks.append({name: (_take(t, *rules[kind, name], rank, tp) if (kind, name) in rules else t) for name, t in block.items()})
    head = dict(weights["head"])
    for name in ("embedding", "lm_head"):
        head[name] = _padded_vocab(head[name], tp).chunk(tp)[rank]
    return {"blocks": blocks, "head": head}


def shard_cache(full: Inventory, cache: dict[str, Any], rank: int, tp: int) -> dict[str, Any]:
    """Rank `rank`'s part of the full model's decode cache: its heads' SSM states, conv channels and KV heads."""
    m = _mixer_segments(full, tp)
    kv_rule = [(0, "whole")]
    if "attn" in full.blocks:
        kv_heads = full.blocks["attn"].sizes["kv_heads"]
        kv_rule = [(kv_heads, ("kv", kv_heads, 1))]
    return {
        "pos": cache["pos"],
        "ssm": [_take(s, 1, m["heads"], rank, tp).clone() for s in cache["ssm"]],
        "conv": [_take(c, 2, m["conv"], rank, tp).clone() for c in cache["conv"]],
        "kv": [tuple(_take(t, 1, kv_rule, rank, tp).clone() for t in pair) for pair in cache["kv"]],
    }


@dataclass
class Comm:
    """One rank's collectives over torch.distributed (`group`, None: the default group), identities on one rank.

    Every call on several ranks is recorded as (kind, the op it follows), so a step's collectives can be counted.
    """

    tp: int = 1
    rank: int = 0
    group: Any = None
    calls: list[tuple[str, str]] = field(default_factory=list)

    def all_reduce(self, x: torch.Tensor, after: str) -> torch.Tensor:
        """Sum x over the ranks, in place."""
        if self.tp > 1:
            self.calls.append(("all_reduce", after))
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, after: str, out: torch.Tensor | None = None) -> torch.Tensor:
        """Every rank's x stacked in rank order on a new first axis, into `out` (tp, *x.shape) when given."""
        if self.tp == 1:
            return x[None] if out is None else out.copy_(x[None])
        self.calls.append(("all_gather", after))
        out = out if out is not None else x.new_empty(self.tp, *x.shape)
        # The concatenated form (tp * rows, ...), which every backend takes; the same memory as the stacked one.
        dist.all_gather_into_tensor(out.view(-1, *x.shape[1:]), x.contiguous(), group=self.group)
        return out


def _rms(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight


def _act(family: Family, x: torch.Tensor) -> torch.Tensor:
    if family.mlp == "swiglu":
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
    return torch.relu(x).square()


def full_weights(full: Inventory, *, seed: int = 0, dtype: torch.dtype = torch.float32, device: str = "cpu") -> dict[str, Any]:
    """Random weights of the whole model at the full inventory's sizes (every block its own), drawn from `seed`."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(dtype)

    def ones(n: int) -> torch.Tensor:
        return 1.0 + randn(n, scale=0.1)

    def matrices(kind: str) -> dict[str, torch.Tensor]:
        out = {}
        for lin in full.blocks[kind].linears if kind != "head" else full.head.linears:
            if lin.name == "embedding":
                out[lin.name] = randn(lin.k, lin.n)
            else:
                out[lin.name] = randn(*((lin.experts,) if lin.experts > 1 else ()), lin.n, lin.k, scale=lin.k**-0.5)
        return out

    p = full.preset
    blocks = []
    for letter in full.order:
        kind = BLOCK_KIND[letter]
        block = {**matrices(kind), "norm": ones(full.dims["hidden"])}
        if kind == "ssm":
            sizes = full.blocks["ssm"].sizes
            heads = ops.of(p.shape).state_heads(p.shape)
            lo, hi = p.a_log_range or (1.0, 16.0)
            block.update(conv_w=randn(sizes["conv_dim"], CONV_WIDTH, scale=0.5), conv_b=randn(sizes["conv_dim"], scale=0.1),
                         A_log=torch.log(lo + (hi - lo) * torch.rand(heads, generator=gen, device=device)).to(dtype),
                         dt_bias=randn(heads, scale=0.5), gnorm=ones(sizes["inner"]))
            if ops.named(p.kind).has_D:
                block["D"] = ones(heads)
        elif kind == "attn":
            block["qk_norm"] = ones(2 * full.blocks["attn"].sizes["head_dim"]).view(2, -1)
        blocks.append(block)
    return {"blocks": blocks, "head": {**matrices("head"), "norm": ones(full.dims["hidden"])}}


def full_cache(full: Inventory, batch: int, context: int, *, seed: int = 0, dtype: torch.dtype = torch.float32,
               device: str = "cpu") -> dict[str, Any]:
    """A decode cache of the whole model: SSM states and conv states of every SSM layer, KV caches holding
    context - 1 tokens (the step writes token `context - 1`), all random from `seed`."""
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    s = full.preset.shape
    state = ops.of(s).state_shape(s)
    conv_dim = full.blocks["ssm"].sizes["conv_dim"]
    out: dict[str, Any] = {"pos": context - 1, "ssm": [], "conv": [], "kv": []}
    for letter in full.order:
        kind = BLOCK_KIND[letter]
        if kind == "ssm":
            out["ssm"].append((torch.randn(batch, *state, generator=gen, device=device) * 0.5).to(dtype))
            out["conv"].append(torch.randn(batch, CONV_WIDTH - 1, conv_dim, generator=gen, device=device).to(dtype))
        elif kind == "attn":
            a = full.blocks["attn"].sizes
            shape = (batch, a["kv_heads"], context, a["head_dim"])
            out["kv"].append(tuple(torch.randn(*shape, generator=gen, device=device).to(dtype) for _ in range(2)))
    return out


def _conv(xbc: torch.Tensor, state: torch.Tensor, w: dict[str, torch.Tensor]) -> torch.Tensor:
    """The causal conv's decode step (taps over the last CONV_WIDTH inputs, then SiLU); state shifted in place."""
    window = torch.cat([state, xbc[:, None]], dim=1)
    state.copy_(window[:, 1:])
    return F.silu((window * w["conv_w"].t()[None]).sum(1) + w["conv_b"])


def _ssm(inv: Inventory, w: dict[str, torch.Tensor], xn: torch.Tensor, cache: dict[str, Any], j: int, tag: str,
         comm: Comm) -> torch.Tensor:
    p, s = inv.preset, inv.preset.shape
    sizes = inv.blocks["ssm"].sizes
    inner, conv_dim, batch = sizes["inner"], sizes["conv_dim"], xn.shape[0]
    op = ops.named(p.kind)
    proj = xn @ w["in_proj"].t()
    if op.z_first:
        z, xbc, rest = proj[:, :inner], proj[:, inner:inner + conv_dim], proj[:, inner + conv_dim:]
    else:
        xbc, z, rest = proj[:, :conv_dim], proj[:, conv_dim:conv_dim + inner], proj[:, conv_dim + inner:]
    xbc = _conv(xbc, cache["conv"][j], w)
    y = op.reference_mixer(s, cache["ssm"][j], xbc, rest, z, w, has_z=p.has_z, dt_softplus=p.dt_softplus)
    if op.output_norm == "head":
        heads = y.reshape(batch, -1, sizes["norm_group"])
        normed = (heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + EPS)).reshape(batch, inner)
        return (normed * w["gnorm"] * F.silu(z)) @ w["out_proj"].t()
    if p.has_z:
        return y @ w["out_proj"].t()
    gated = y * F.silu(z)
    if global_norm(inv):
        sums = gated.pow(2).sum(-1, keepdim=True)
        comm.all_reduce(sums, f"{tag}.gated_norm")
        normed = gated * torch.rsqrt(sums / (inner * p.tp) + EPS)
    else:
        groups = gated.view(batch, -1, sizes["norm_group"])
        normed = (groups * torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + EPS)).view(batch, inner)
    return (normed * w["gnorm"]) @ w["out_proj"].t()


def _rope(x: torch.Tensor, pos: int, rot: int) -> torch.Tensor:
    if not rot:
        return x
    inv_freq = 10000.0 ** (-torch.arange(0, rot, 2, dtype=torch.float64, device=x.device) / rot)
    cos, sin = (f(pos * inv_freq).to(x.dtype) for f in (torch.cos, torch.sin))
    x1, x2 = x[..., :rot // 2], x[..., rot // 2:rot]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., rot:]], dim=-1)


def _attn(inv: Inventory, w: dict[str, torch.Tensor], xn: torch.Tensor, cache: dict[str, Any], j: int, tag: str,
          comm: Comm) -> torch.Tensor:
    a = inv.blocks["attn"].sizes
    heads, kv, hd, batch = a["heads"], a["kv_heads"], a["head_dim"], xn.shape[0]
    qkv = xn @ w["qkv_proj"].t()
    q = qkv[:, :heads * hd].reshape(batch, heads, hd)
    off = heads * hd
    gate = None
    if inv.family.attn_gate:
        gate, off = qkv[:, off:off + heads * hd], off + heads * hd
    k, v = (qkv[:, off + i * kv * hd:off + (i + 1) * kv * hd].reshape(batch, kv, hd) for i in range(2))
    if inv.family.qk_norm:
        q, k = _rms(q, w["qk_norm"][0]), _rms(k, w["qk_norm"][1])
    pos = cache["pos"]
    q, k = _rope(q, pos, a["rotary"]), _rope(k, pos, a["rotary"])
    k_cache, v_cache = cache["kv"][j]
    k_cache[:, :, pos], v_cache[:, :, pos] = k, v
    grouped = q.reshape(batch, kv, heads // kv, hd)
    scores = torch.einsum("bgqd,bgtd->bgqt", grouped, k_cache[:, :, :pos + 1]) * hd**-0.5
    o = torch.einsum("bgqt,bgtd->bgqd", scores.softmax(-1), v_cache[:, :, :pos + 1]).reshape(batch, heads * hd)
    if gate is not None:
        o = o * torch.sigmoid(gate)
    return o @ w["o_proj"].t()


def _mlp(inv: Inventory, w: dict[str, torch.Tensor], xn: torch.Tensor, cache: dict[str, Any], j: int, tag: str,
         comm: Comm) -> torch.Tensor:
    return _act(inv.family, xn @ w["up_proj"].t()) @ w["down_proj"].t()


def _moe(inv: Inventory, w: dict[str, torch.Tensor], xn: torch.Tensor, cache: dict[str, Any], j: int, tag: str,
         comm: Comm) -> torch.Tensor:
    s = inv.blocks["moe"].sizes
    values, picks = torch.topk(xn @ w["router"].t(), s["topk"], dim=-1)
    gates = values.softmax(-1)
    x = xn @ w["latent_in"].t() if "latent_in" in w else xn
    routed = torch.zeros_like(x)
    for e in range(s["experts"]):
        weight = (gates * (picks == e)).sum(-1, keepdim=True)
        routed = routed + weight * (_act(inv.family, x @ w["experts_up"][e].t()) @ w["experts_down"][e].t())
    if "latent_out" in w:
        routed = routed @ w["latent_out"].t()
    if "shared_up" in w:
        shared = _act(inv.family, xn @ w["shared_up"].t()) @ w["shared_down"].t()
        if "shared_gate" in w:
            shared = shared * torch.sigmoid(xn @ w["shared_gate"].t())
        routed = routed + shared
    return routed


BLOCKS = {"ssm": _ssm, "attn": _attn, "mlp": _mlp, "moe": _moe}


def step_ref(inv: Inventory, weights: dict[str, Any], cache: dict[str, Any], tokens: torch.Tensor, comm: Comm) -> torch.Tensor:
    """One decode step of the model on one rank of comm.tp (sizes per rank in `inv`), in plain PyTorch; returns the
    logits over the whole vocabulary (batch, vocab), the same on every rank, and advances `cache` in place.

    As vLLM runs it: a vocabulary-parallel embedding (each rank looks up its rows, zero elsewhere), norms and residuals
    replicated, column-parallel input projections, row-parallel output projections whose partial sums are all-reduced,
    the LM head's logits all-gathered.
    """
    rows = weights["head"]["embedding"].shape[0]
    local = tokens - comm.rank * rows
    hit = (local >= 0) & (local < rows)
    h = torch.where(hit[:, None], weights["head"]["embedding"][local.clamp(0, rows - 1)], 0.0)
    comm.all_reduce(h, "embed")
    seen = {kind: 0 for kind in BLOCKS}
    out = None
    for i, letter in enumerate(inv.order):
        kind = BLOCK_KIND[letter]
        w = weights["blocks"][i]
        if out is not None:
            h = h + out
        out = BLOCKS[kind](inv, w, _rms(h, w["norm"]), cache, seen[kind], f"{letter}{i}", comm)
        comm.all_reduce(out, reduce_point(letter, i))
        seen[kind] += 1
    h = h + out
    logits = _rms(h, weights["head"]["norm"]) @ weights["head"]["lm_head"].t()
    gathered = comm.all_gather(logits, "lm_head")
    vocab = inv.preset.e2e["vocab_size"]
    return gathered.permute(1, 0, 2).reshape(tokens.shape[0], -1)[:, :vocab]


def _to(obj: Any, device: torch.device | str) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(v, device) for v in obj)
    return obj


def check_shard(preset: Preset, tp: int, comm: Comm, *, batch: int = 3, context: int = 5, seed: int = 0,
                family: Family | None = None, device: torch.device | str = "cpu") -> dict[str, Any]:
    """On rank comm.rank: the whole model's step (tp=1, plain PyTorch, fp32) against this rank's shard of it run with the
    collectives of `comm`, on `device` (the model drawn on the CPU, the same on every rank). Returns the largest
    relative differences of the logits, SSM states, conv states and KV caches, and the collectives run next to those
    modelled by `collectives`."""
    full = inventory(preset, family)
    inv = inventory(with_tp(preset, tp), family)
    weights = _to(full_weights(full, seed=seed), device)
    cache = _to(full_cache(full, batch, context, seed=seed), device)
    tokens = torch.randint(preset.e2e["vocab_size"], (batch,), generator=torch.Generator().manual_seed(seed + 2)).to(device)
    shard = shard_cache(full, cache, comm.rank, tp)
    want = step_ref(full, weights, cache, tokens, Comm())
    got = step_ref(inv, shard_weights(full, weights, comm.rank, tp), shard, tokens, comm)
    mine = shard_cache(full, cache, comm.rank, tp)

    def rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
        return max((float((x - y).abs().max() / y.abs().max().clamp_min(1.0)) for x, y in zip(a, b)), default=0.0)

    return {
        "rank": comm.rank,
        "logits": rel([got], [want]),
        "ssm": rel(shard["ssm"], mine["ssm"]),
        "conv": rel(shard["conv"], mine["conv"]),
        "kv": rel([t for pair in shard["kv"] for t in pair], [t for pair in mine["kv"] for t in pair]),
        "calls": comm.calls,
        "modelled": [(c.kind, c.after) for c in collectives(inv)],
        "shapes": {"ssm": [tuple(t.shape) for t in shard["ssm"]], "logits": tuple(got.shape)},
    }


def attach(step: Step, comm: Comm, launch: str) -> dict[str, Any]:
    """Put this rank's collectives into `step` (category 'comm', each after the op it follows) and return the row fields
    that say so. The block outputs and the embedding are all-reduced in place; the LM head writes its logits into a
    buffer that is all-gathered, and sampling takes the argmax over every rank's logits."""
    inv = step.inv
    plan = {c.after: c for c in collectives(inv)}
    batch, vocab = step.batch, inv.dims["vocab"]
    logits = step._empty(batch, vocab)
    gathered = step._empty(comm.tp, batch, vocab)
    sums = torch.zeros(batch, 1, dtype=torch.float32, device=step.device)
    head = step.w.head["lm_head"]

    def target(after: str) -> torch.Tensor:
        return step.h if after == "embed" else sums if after.endswith(".gated_norm") else step.bo

    out: list[Op] = []
    for op in step.ops:
        if op.name == "lm_head":
            out.append(Op("other", "lm_head", lambda: torch.mm(step.xn, head.t(), out=logits)))
        elif op.name == "sample":
            out.append(Op("other", "sample", lambda: torch.argmax(gathered.permute(1, 0, 2).reshape(batch, -1), dim=-1,
                                                                  out=step.next_tokens)))
        else:
            out.append(op)
        c = plan.get(op.name)
        if c is None:
            continue
        if c.kind == "all_gather":
            out.append(Op("comm", c.name, lambda c=c: comm.all_gather(logits, c.after, out=gathered)))
        else:
            out.append(Op("comm", c.name, lambda c=c: comm.all_reduce(target(c.after), c.after)))
    placed = sum(op.category == "comm" for op in out)
    if placed != len(plan):
        raise RuntimeError(f"{placed} of the step's {len(plan)} collectives found the op they follow")
    step.ops[:] = out
    summary = plan_summary(inv, batch)
    return {"x_tp_launch": launch, "x_tp_ranks": comm.tp, "x_tp_backend": dist.get_backend(comm.group) if comm.tp > 1 else None,
            "x_allreduces_per_step": summary["all_reduce"], "x_allgathers_per_step": summary["all_gather"],
            "x_comm_bytes_per_step": summary["bytes_per_step"]}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_world() -> tuple[int, int, int] | None:
    """(rank, local rank, world size) when torchrun (or another launcher setting WORLD_SIZE > 1) started this process."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world <= 1:
        return None
    return int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))), world


def check_launch(tp: int, launch: str, *, cuda: bool, visible: int) -> None:
    """Raise UserError (one line) when `launch` cannot run `tp` ranks here: an unknown launch, nothing to launch at
    --tp 1, fewer visible GPUs than ranks, or a torchrun world of another size (or a torchrun world not asked for)."""
    if launch not in LAUNCHES:
        raise UserError(f"--tp-launch {launch!r} is not a launch the e2e step knows", f"choose from {', '.join(LAUNCHES)}")
    world = torchrun_world()
    if launch == "one-gpu":
        if world is not None:
            raise UserError(f"this process is rank {world[0]} of a {world[2]}-process launch, and --tp-launch one-gpu times "
                            "one GPU's shard alone", f"pass --tp {world[2]} --tp-launch torchrun")
        return
    if tp < 2:
        raise UserError(f"--tp-launch {launch} runs --tp ranks, and --tp {tp} is one", "pass --tp 2 or more")
    if not cuda:
        raise UserError(f"--tp-launch {launch} runs one rank per CUDA GPU over NCCL, and no CUDA GPU is visible",
                        "run it on a machine with several NVIDIA GPUs, or pass --dry-run for the plan")
    if launch == "torchrun":
        if world is None:
            raise UserError("--tp-launch torchrun needs the processes torchrun starts (WORLD_SIZE is not set)",
                            f"run `torchrun --nproc-per-node {tp} -m replayssm_cli.main e2e --tp {tp} --tp-launch torchrun ...`, "
                            "or pass --tp-launch spawn")
        if world[2] != tp:
            raise UserError(f"--tp {tp} asks for {tp} ranks, and torchrun started {world[2]}", f"pass --tp {world[2]}")
        if world[1] >= visible:
            raise UserError(f"rank {world[0]} has local rank {world[1]}, and {visible} GPU(s) are visible", "start one process per GPU")
        return
    if tp > visible:
        raise UserError(f"--tp {tp} --tp-launch spawn needs {tp} GPUs, one per rank, and {visible} are visible",
                        f"pass --tp {visible}" if visible > 1 else "run it on a machine with several GPUs (CUDA_VISIBLE_DEVICES selects them)")


def spawn(fn: Callable[..., Any], tp: int, args: tuple = (), *, start_method: str = "spawn") -> None:
    """Run fn(rank, tp, port, *args) in tp processes with NCCL_ENV set; raise typer.Exit with the first failing rank's code.

    On Ctrl-C every rank stops (rank 0 closes its results file with the rows it finished, see stop); a rank still
    running after that, stuck in a collective its peers left, is killed.
    """
    import torch.multiprocessing as mp
    import typer

    os.environ.update(NCCL_ENV)
    ctx = mp.start_processes(fn, args=(tp, free_port(), *args), nprocs=tp, start_method=start_method, join=False)
    try:
        while not ctx.join(timeout=1):
            pass
    except KeyboardInterrupt:
        stop(ctx.processes)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except mp.ProcessExitedException as exc:
        raise typer.Exit(exc.exit_code or 1) from None


def stop(procs: list[Any]) -> None:
    """Stop child processes after a Ctrl-C: a terminal's or timeout's SIGINT reaches their whole process group, so each
    gets STOP_WAIT_S to finish on its own, then SIGINT, then INTERRUPT_GRACE_S before it is killed."""
    import signal
    import time

    def join_all(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))

    join_all(STOP_WAIT_S)
    for proc in procs:
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGINT)
    join_all(INTERRUPT_GRACE_S)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join()


def init(rank: int, tp: int, port: int | None, backend: str, local_rank: int | None = None) -> Comm:
    """Join the process group of tp ranks (on 127.0.0.1:port, or torchrun's env:// when port is None) and return the comm."""
    os.environ.update(NCCL_ENV)
    kw: dict[str, Any] = {}
    if backend == "nccl":
        torch.cuda.set_device(rank if local_rank is None else local_rank)
        kw["device_id"] = torch.device("cuda", torch.cuda.current_device())
    method = "env://" if port is None else f"tcp://127.0.0.1:{port}"
    dist.init_process_group(backend, init_method=method, rank=rank, world_size=tp,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S), **kw)
    return Comm(tp=tp, rank=rank)


def min_over_ranks(value: int | None, device: torch.device | str) -> int | None:
    """The smallest of every rank's value (free memory), so that every rank skips the same configurations."""
    if value is None:
        return None
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def run_rank(rank: int, tp: int, port: int | None, launch: str, main: Callable[..., None], main_args: tuple,
             quiet: Callable[..., None], local_rank: int | None = None, backend: str = "nccl") -> None:
    """One rank of `e2e --tp N`: join the group; rank 0 runs `main(*main_args, **hooks)` (it prints and writes the results
    file), the others `quiet(*main_args, **hooks)`; hooks attach the collectives to every step and make the free memory
    each rank plans with the smallest of any rank's (gloo, on the CPU: no memory figure)."""
    import typer

    comm = init(rank, tp, port, backend, local_rank)
    if backend == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
        free_fn: Callable[[], int | None] = lambda: min_over_ranks(int(torch.cuda.mem_get_info()[0]), device)
    else:
        free_fn = lambda: None
    hooks = {"step_hook": lambda step: attach(step, comm, launch), "free_fn": free_fn}
    code = 0
    try:
        (main if rank == 0 else quiet)(*main_args, **hooks)
    except UserError as exc:
        print(f"error: rank {rank}: {exc.line()}", file=sys.stderr)
        code = 2
    except typer.Exit as exc:
        code = exc.exit_code
    finally:
        dist.destroy_process_group()
    if code:
        sys.exit(code)


def quiet_run(spec: Any, presets: list[Preset], *_: Any, step_hook: Callable, free_fn: Callable) -> None:
    """A rank other than 0: the same configurations in the same order, no progress, rows to a file that is then removed."""
    from replayssm_cli.measure import e2e
    from replayssm_cli.report.results import ResultsWriter

    env = e2e.environment(torch.cuda.current_device())
    with tempfile.TemporaryDirectory(prefix="replayssm-rank-") as tmp:
        writer = ResultsWriter(Path(tmp) / "rows.json", env, spec.to_dict())
        e2e.run(spec, presets, writer, device="cuda", progress=False, l2_bytes=env["gpu"].get("l2_bytes"),
                step_hook=step_hook, free_fn=free_fn)
