"""Plain-PyTorch Gated DeltaNet decode, ReplaySSM and speculative steps: the definition of correctness."""

from __future__ import annotations

import torch

from replayssm_kernels.gdn.cache import ReplayCache, dequantize_read, quantize_read
from replayssm_kernels.gdn.common import (
    L2NORM_EPS,
    default_scale,
    draw_state_bits,
    raw,
    state_value,
    stored_state,
)


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _rows(slots, batch: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, slots) of the non-padding rows."""
    if slots is None:
        slots = torch.arange(batch, device=device)
    slots = slots.long()
    rows = torch.nonzero(slots >= 0).flatten()
    return rows, slots[rows]


def _qk(q, k, HV: int, scale: float, l2norm: bool, acc: torch.dtype):
    """q scaled and k, normalised when asked, in acc precision; returned per key head and per value head."""
    q, k = q.to(acc), k.to(acc)
    if l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + L2NORM_EPS)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + L2NORM_EPS)
    q = q * scale
    group = HV // q.shape[-2]
    return q, k, q.repeat_interleave(group, dim=-2), k.repeat_interleave(group, dim=-2)


def _step(S, q, k, v, g, beta):
    """One delta-rule step on fp32 (or fp64) states S (..., HV, V, K); returns (S_t, u_t, o_t)."""
    alpha = torch.exp(g)[..., None]
    u = beta[..., None] * (v - alpha * torch.einsum("...vk,...k->...v", S, k))
    S = alpha[..., None] * S + u[..., :, None] * k[..., None, :]
    return S, u, torch.einsum("...vk,...k->...v", S, q)


def decode_ref(state, q, k, v, g, beta, *, scale=None, use_qk_l2norm_in_kernel=False, slots=None, state_scale=None,
               rounding=None):
    """One conventional step; updates state (nslots, HV, V, K) (and an 8-bit state's state_scale) in place, rounded
    as `decode` rounds it (stochastically with `rounding`, whose counts it then advances); returns o (batch, HV, V)."""
    HV, K = state.shape[1], state.shape[3]
    acc = _acc(state.dtype)
    rows, idx = _rows(slots, q.shape[0], q.device)
    _, _, qe, ke = _qk(q[rows], k[rows], HV, default_scale(K, scale), use_qk_l2norm_in_kernel, acc)
    S0 = state_value(state[idx], None if state_scale is None else state_scale[idx]).to(acc)
    S, _, o = _step(S0, qe, ke, v[rows].to(acc), g[rows].to(acc), beta[rows].to(acc))
    values, scales = stored_state(S, state.dtype, draw_state_bits(rounding, idx, tuple(S.shape)))
    raw(state)[idx] = raw(values)
    if scales is not None:
        state_scale[idx] = scales
    if rounding is not None:
        rounding.advance(slots, q.shape[0])
    out = torch.full(v.shape, float("nan"), dtype=v.dtype, device=v.device)
    out[rows] = o.to(v.dtype)
    return out


def decode_multi_ref(state, snapshots, q, k, v, g, beta, *, scale=None, use_qk_l2norm_in_kernel=False, slots=None,
                     rounding=None, state_scale=None, snapshot_scale=None):
    """T conventional steps from state (unchanged); the state after draft t goes to snapshots[slot, t], rounded as
    `decode` would store it t steps on (with `rounding`, whose counts then advance by T); an 8-bit state's rows
    with their scales into snapshot_scale[slot, t], the next draft continuing from them."""
    HV, K = state.shape[1], state.shape[3]
    acc = _acc(state.dtype)
    rows, idx = _rows(slots, q.shape[0], q.device)
    _, _, qe, ke = _qk(q[rows], k[rows], HV, default_scale(K, scale), use_qk_l2norm_in_kernel, acc)
    S = state_value(state[idx], None if state_scale is None else state_scale[idx]).to(acc)
    out = torch.full(v.shape, float("nan"), dtype=v.dtype, device=v.device)
    for t in range(q.shape[1]):
        S, _, o = _step(S, qe[:, t], ke[:, t], v[rows, t].to(acc), g[rows, t].to(acc), beta[rows, t].to(acc))
        values, scales = stored_state(S, state.dtype, draw_state_bits(rounding, idx, tuple(S.shape), t))
        raw(snapshots)[idx, t] = raw(values)
        if scales is not None:
            snapshot_scale[idx, t] = scales
        S = state_value(values, scales).to(acc)
        out[rows, t] = o.to(v.dtype)
    if rounding is not None:
        rounding.advance(slots, q.shape[0], q.shape[1])
    return out


def accept_snapshot_ref(state, snapshots, n_accepted, slots=None, *, state_scale=None, snapshot_scale=None):
    """state[slot] = snapshots[slot, n - 1] for the rows with n >= 1 (and an 8-bit state's scales likewise)."""
    rows, idx = _rows(slots, n_accepted.shape[0], n_accepted.device)
    n = n_accepted[rows].long()
    keep = n >= 1
    raw(state)[idx[keep]] = raw(snapshots)[idx[keep], n[keep] - 1]
    if state_scale is not None:
        state_scale[idx[keep]] = snapshot_scale[idx[keep], n[keep] - 1]


def _exact_updates(cache: ReplayCache, slot: int) -> torch.Tensor:
    """The committed updates u_j (C, HV, V) of one slot as the full checkpoint gives them.

    Non-flush steps compute u_j from the read copy; with D = checkpoint - copy carried through the
    entries (D_j = a_j D_{j-1} + d_j k_jᵀ), u_j + d_j with d_j = -beta_j a_j D_{j-1} k_j is the update
    of the full-precision recurrence. Without a read copy the buffer is already exact.
    """
    u = cache.buf_u[slot].to(torch.float32, copy=True)
    if cache.read_copy is None:
        return u
    f = cache.fill[slot].long()
    keys = cache.buf_k[slot].float().repeat_interleave(cache.HV // cache.H, dim=1)
    D = cache.checkpoint_values(slot) - _read_value(cache, slot)
    G_prev = torch.zeros(cache.HV, device=u.device)
    for j in range(int(f.max().item()) if f.numel() else 0):
        used = j < f
        G = torch.where(used, cache.buf_g[slot, j], G_prev)
        a = torch.exp(G - G_prev)
        k_j = torch.where(used[:, None], keys[j], 0.0)
        d = -torch.where(used, cache.buf_beta[slot, j], 0.0)[:, None] * a[:, None] * torch.einsum("hvk,hk->hv", D, k_j)
        D = a[:, None, None] * D + d[..., None] * k_j[:, None, :]
        u[j] = torch.where(used[:, None], u[j] + d, u[j])
        G_prev = G
    return u


def _committed(cache: ReplayCache, slot: int, S0: torch.Tensor, u: torch.Tensor):
    """S after the committed entries of one slot (updates u), from checkpoint value S0 (HV, V, K) fp32, and G there."""
    f = cache.fill[slot].long()
    j = torch.arange(cache.capacity, device=f.device)
    used = j[:, None] < f[None, :]
    G = torch.where(used, cache.buf_g[slot], 0.0)
    G_last = torch.where(f > 0, G.gather(0, (f - 1).clamp(min=0)[None]).squeeze(0), 0.0)
    w = torch.where(used, torch.exp(G_last[None] - G), 0.0)
    group = cache.HV // cache.H
    u = torch.where(used[..., None], u.float(), 0.0)
    k = torch.where(used[..., None], cache.buf_k[slot].float().repeat_interleave(group, dim=1), 0.0)
    S = torch.exp(G_last)[:, None, None] * S0 + torch.einsum("jhv,jhk->hvk", w[..., None] * u, k)
    return S, G_last


def _store_checkpoint(cache: ReplayCache, slot: int, heads: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    """Store S (HV, V, K) fp32 as the checkpoint of `heads`, rounded by the cache's rounding at the slot's store count
    (8-bit rows over their scales); return the value non-flush steps read next."""
    rounding = cache.rounding if heads.numel() else None
    bits = draw_state_bits(rounding, torch.tensor([slot], device=S.device), (1, *S.shape))
    stored, scales = stored_state(S, cache.state_dtype, None if bits is None else bits[0])
    raw(cache.checkpoint)[slot, heads] = raw(stored)[heads]
    if scales is not None:
        cache.checkpoint_scale[slot, heads] = scales[heads]
    cache.fill[slot, heads] = 0
    value = state_value(stored, scales)
    if cache.read_copy is not None:
        copy, scale = quantize_read(value, cache.read_copy.dtype)
        cache.read_copy[slot, heads] = copy[heads]
        if scale is not None:
            cache.read_scale[slot, heads] = scale[heads]
        value = dequantize_read(copy, scale)
    return value


def _read_value(cache: ReplayCache, slot: int) -> torch.Tensor:
    if cache.read_copy is None:
        return cache.checkpoint_values(slot)
    scale = None if cache.read_scale is None else cache.read_scale[slot]
    return dequantize_read(cache.read_copy[slot], scale)


def _correction_row(cache: ReplayCache, slot: int, pos: torch.Tensor, k, beta) -> torch.Tensor:
    """Row t (HV, C) of T for an entry with keys k (H, K) and beta (HV,) appended at per-head positions pos (HV,):
    t = beta (e_pos - sum_{i<pos} (k_i·k) t_i) over the entries before it.

    Entry j's correction key y_j = sum_l t_jl k_l then obeys y_j = beta_j (k_j - sum_{i<j} (k_i·k_j) y_i): carrying D
    through entries 0..j-1 multiplies it on the K side by Q_0 ⋯ Q_{j-1} = I - sum_{i<j} y_i k_iᵀ
    (Q_i = I - beta_i k_i k_iᵀ), so the correction of u_j is -e^{G_j} D y_j (`_exact_updates` carries D entry by
    entry instead).
    """
    group = cache.HV // cache.H
    ke = k.repeat_interleave(group, dim=0)
    j = torch.arange(cache.capacity, device=pos.device)
    used = j[:, None] < pos[None, :]
    keys = cache.buf_k[slot].float().repeat_interleave(group, dim=1)
    gram = torch.where(used, torch.einsum("jhk,hk->jh", keys, ke), 0.0)
    rows = torch.where(used[..., None], cache.buf_t[slot], 0.0)
    unit = (j[None, :] == pos[:, None]).float()
    return beta[:, None] * (unit - torch.einsum("jh,jhl->hl", gram, rows))


def _append(cache: ReplayCache, slot: int, pos: torch.Tensor, u, k, G, beta, heads: torch.Tensor) -> None:
    """Write u (HV, V), k (H, K), G and beta (HV,) at per-head positions pos (HV,) for the value heads in
    `heads` (bool); each key head's k goes with its first value head."""
    hv = torch.nonzero(heads).flatten()
    if cache.buf_t is not None:
        cache.buf_t[slot, pos[hv], hv] = _correction_row(cache, slot, pos, k, beta)[hv]
    cache.buf_u[slot, pos[hv], hv] = u[hv].to(cache.buf_u.dtype)
    cache.buf_g[slot, pos[hv], hv] = G[hv]
    if cache.buf_beta is not None:
        cache.buf_beta[slot, pos[hv], hv] = beta[hv]
    first = torch.arange(cache.H, device=pos.device) * (cache.HV // cache.H)
    h = torch.nonzero(heads[first]).flatten()
    cache.buf_k[slot, pos[first[h]], h] = k[h].to(cache.buf_k.dtype)


def replay_ref(cache: ReplayCache, q, k, v, g, beta, *, scale=None, use_qk_l2norm_in_kernel=False, slots=None):
    """One ReplaySSM step on `cache` (mutated as the kernel mutates it); returns o (batch, HV, V).

    A non-flush step runs the recurrence from the read copy (or checkpoint) plus the buffer and appends
    (u, k, G, beta); the step that fills the window runs it from the full checkpoint plus the corrected
    buffer and stores the result as the new checkpoint (rounded as `replay` rounds it; the slot's rounding count
    then advances by one).
    """
    scale = default_scale(cache.K, scale)
    rows, idx = _rows(slots, q.shape[0], q.device)
    out = torch.full(v.shape, float("nan"), dtype=v.dtype, device=v.device)
    for row, slot in zip(rows.tolist(), idx.tolist()):
        f = cache.fill[slot].long()
        flush = f + 1 >= cache.window
        S, G_last = _committed(cache, slot, _read_value(cache, slot), cache.buf_u[slot])
        if flush.any():
            S_exact, _ = _committed(cache, slot, cache.checkpoint_values(slot), _exact_updates(cache, slot))
            S = torch.where(flush[:, None, None], S_exact, S)
        _, kn, qe, ke = _qk(q[row], k[row], cache.HV, scale, use_qk_l2norm_in_kernel, torch.float32)
        gt, bt = g[row].float(), beta[row].float()
        S, u, o = _step(S, qe, ke, v[row].float(), gt, bt)
        out[row] = o.to(v.dtype)
        _append(cache, slot, f, u, kn, G_last + gt, bt, ~flush)
        cache.fill[slot] += 1
        _store_checkpoint(cache, slot, torch.nonzero(flush).flatten(), S)
        if cache.rounding is not None and flush.any():
            cache.rounding.step[slot] += 1
    return out


def verify_ref(cache: ReplayCache, q, k, v, g, beta, *, scale=None, use_qk_l2norm_in_kernel=False, slots=None):
    """Outputs (batch, T, HV, V) of T drafts from the cache, appended after the committed entries, fill unchanged.

    Rows whose buffer holds a full window or more are flushed first (their fill becomes 0).
    """
    scale = default_scale(cache.K, scale)
    rows, idx = _rows(slots, q.shape[0], q.device)
    out = torch.full(v.shape, float("nan"), dtype=v.dtype, device=v.device)
    for row, slot in zip(rows.tolist(), idx.tolist()):
        full = cache.fill[slot].long() >= cache.window
        S0 = _read_value(cache, slot)
        if full.any():
            S_exact, _ = _committed(cache, slot, cache.checkpoint_values(slot), _exact_updates(cache, slot))
            flushed = _store_checkpoint(cache, slot, torch.nonzero(full).flatten(), S_exact)
            S0 = torch.where(full[:, None, None], flushed, S0)
        S, G = _committed(cache, slot, S0, cache.buf_u[slot])
        f = cache.fill[slot].long()
        _, kn, qe, ke = _qk(q[row], k[row], cache.HV, scale, use_qk_l2norm_in_kernel, torch.float32)
        for t in range(q.shape[1]):
            gt, bt = g[row, t].float(), beta[row, t].float()
            S, u, o = _step(S, qe[t], ke[t], v[row, t].float(), gt, bt)
            G = G + gt
            out[row, t] = o.to(v.dtype)
            _append(cache, slot, f + t, u, kn[t], G, bt, torch.ones_like(full))
    if cache.rounding is not None:
        cache.rounding.advance(slots, q.shape[0])
    return out


def accept_ref(cache: ReplayCache, n_accepted, slots=None) -> None:
    """Commit the first n drafts of each row's last verify: fill += n."""
    rows, idx = _rows(slots, n_accepted.shape[0], n_accepted.device)
    cache.fill[idx] += n_accepted[rows].to(torch.int32)[:, None]


def materialize_ref(cache: ReplayCache, slots=None) -> torch.Tensor:
    """fp32 full states (n, HV, V, K) of `slots`: the checkpoint run through its committed entries one by one,
    each update as the full checkpoint gives it (what the next flush stores)."""
    slots = torch.arange(cache.nslots) if slots is None else slots
    group = cache.HV // cache.H
    states = []
    for slot in slots.tolist():
        S = cache.checkpoint_values(slot).clone()
        u = _exact_updates(cache, slot)
        for h in range(cache.HV):
            G_prev = 0.0
            for j in range(int(cache.fill[slot, h])):
                G = cache.buf_g[slot, j, h]
                S[h] = torch.exp(G - G_prev) * S[h] + torch.outer(u[j, h], cache.buf_k[slot, j, h // group].float())
                G_prev = G
        states.append(S)
    if not states:
        return cache.checkpoint.new_zeros((0, cache.HV, cache.V, cache.K), dtype=torch.float32)
    return torch.stack(states)


def random_inputs(batch: int, H: int, HV: int, K: int, V: int, *, T: int | None = None, io_dtype=torch.bfloat16,
                  device="cpu", generator: torch.Generator | None = None) -> dict:
    """Inputs q, k, v, g, beta of one step (or of T drafts, with a token axis) shaped like a trained layer's.

    q, k, v standard normal in io_dtype (use with use_qk_l2norm_in_kernel=True); g = -softplus(x) / 4 in
    fp32, a decay e^g around 0.8; beta = sigmoid(x) in io_dtype.
    """
    lead = (batch,) if T is None else (batch, T)

    def randn(*shape):
        return torch.randn(shape, generator=generator, device="cpu")

    return {
        "q": randn(*lead, H, K).to(device, io_dtype),
        "k": randn(*lead, H, K).to(device, io_dtype),
        "v": randn(*lead, HV, V).to(device, io_dtype),
        "g": (-torch.nn.functional.softplus(randn(*lead, HV)) / 4).to(device),
        "beta": torch.sigmoid(randn(*lead, HV)).to(device, io_dtype),
    }

