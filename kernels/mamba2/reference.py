"""Plain-PyTorch Mamba-2 decode, replay and speculative steps: the definition of what the kernels compute."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from replayssm_kernels import rounding as rnd

FP8_MAX = 448.0


def _compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def _rows(batch: int, slots: torch.Tensor | None) -> list[tuple[int, int]]:
    if slots is None:
        return [(b, b) for b in range(batch)]
    return [(b, s) for b, s in enumerate(slots.tolist()) if s >= 0]


def _delta(dt: torch.Tensor, dt_bias: torch.Tensor | None, dt_softplus: bool, cd: torch.dtype) -> torch.Tensor:
    delta = dt.to(cd)
    if dt_bias is not None:
        delta = delta + dt_bias.to(cd)
    if dt_softplus:
        delta = torch.where(delta <= 20.0, torch.log1p(torch.exp(delta)), delta)
    return delta


def _per_head(t: torch.Tensor, H: int) -> torch.Tensor:
    """(..., G, N) group tensor to (..., H, N): head h reads group h // (H / G)."""
    return t.repeat_interleave(H // t.shape[-2], dim=-2)


def _finish(y: torch.Tensor, x: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None, cd) -> torch.Tensor:
    if D is not None:
        y = y + D.to(cd)[:, None] * x
    if z is not None:
        y = y * F.silu(z.to(cd))
    return y


def _output(out: torch.Tensor | None, shape: tuple, dtype: torch.dtype, device) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device) if out is None else out


def quantize_ref(state: torch.Tensor, read_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The read copy of a (..., P, N) state: a plain cast, or fp8 e4m3 with one fp32 scale amax/448 per row p."""
    s = state.float()
    if read_dtype != torch.float8_e4m3fn:
        return s.to(read_dtype), None
    scale = s.abs().amax(dim=-1) / FP8_MAX
    q = s / torch.where(scale > 0, scale, torch.ones_like(scale))[..., None]
    return q.to(read_dtype), scale


def dequantize_ref(copy: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    s = copy.to(dtype)
    return s if scale is None else s * scale.to(dtype)[..., None]


def load_state(state: torch.Tensor, scale: torch.Tensor | None, cd) -> torch.Tensor:
    """A stored (..., P, N) state as values: 8-bit rows times their (..., P) scales, any other dtype as it is."""
    return state.to(cd) if scale is None else (state.float() * scale[..., None]).to(cd)


def store_state(state: torch.Tensor, scale: torch.Tensor | None, s: int, S: torch.Tensor,
                bits: torch.Tensor | None) -> None:
    """state[s] (and scale[s] for 8-bit rows) from the values S (H, P, N), as a kernel stores them: to nearest without
    bits, else stochastically by the (H, P·N) bits of `rounding.draw_bits`."""
    bits = None if bits is None else bits.reshape(S.shape)
    if scale is not None:
        q, scale[s] = rnd.quantized_rows_reference(S.float(), bits, state.dtype)
        state[s] = q
    elif bits is None or state.dtype == torch.float32:
        state[s] = S.to(state.dtype)
    else:
        state[s] = rnd.rounded_reference(S.float(), bits, state.dtype).to(state.dtype)


def _slot_bits(rounding, s: int, H: int, elements: int, ahead: int = 0) -> torch.Tensor | None:
    if rounding is None:
        return None
    return rnd.draw_bits(rounding, torch.tensor([s]), H, elements, ahead, paired=True)[0]


def decode_ref(state, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False, slots=None, out=None,
               state_scale=None, rounding=None):
    """One conventional step: S = exp(AΔ) S + Δ x Bᵀ, y = S C + D x (times silu(z)); state updated in place.

    Computes in fp32 (fp64 when the state or x is fp64) and rounds the state to its dtype on store, as the
    kernel does: to nearest, or stochastically by `rounding`'s bits (whose rows' step counts then advance), an
    8-bit state as rows with their scales (state_scale, updated in place). Rows whose slot is -1 are skipped; their
    output rows stay as `out` had them (NaN by default).
    """
    cd = _compute_dtype(state, x)
    batch, H, P = x.shape
    N = state.shape[-1]
    y = _output(out, (batch, H, P), x.dtype, x.device)
    for b, s in _rows(batch, slots):
        delta = _delta(dt[b], dt_bias, dt_softplus, cd)
        xb = x[b].to(cd)
        Bh, Ch = _per_head(B[b].to(cd), H), _per_head(C[b].to(cd), H)
        S0 = load_state(state[s], None if state_scale is None else state_scale[s], cd)
        S = torch.exp(A.to(cd) * delta)[:, None, None] * S0
        S = S + (delta[:, None] * xb)[:, :, None] * Bh[:, None, :]
        store_state(state, state_scale, s, S, _slot_bits(rounding, s, H, P * N))
        yb = torch.einsum("hpn,hn->hp", S, Ch)
        y[b] = _finish(yb, xb, D, None if z is None else z[b], cd).to(y.dtype)
    if rounding is not None:
        rounding.advance(slots, batch)
    return y


def decode_multi_ref(state, snapshots, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False,
                     slots=None, out=None, state_scale=None, snapshot_scale=None, rounding=None):
    """T conventional steps from one state read: snapshots[slot, t] holds the state after draft t; state untouched.

    x, z (batch, T, H, P); dt (batch, T, H); B, C (batch, T, G, N). Returns y (batch, T, H, P). With `rounding`,
    snapshot t is rounded stochastically at its slot's step count + t, and the counts advance by T. An 8-bit state
    reads its rows times state_scale, and snapshot t's scales go to snapshot_scale[slot, t].
    """
    batch, T, H, P = x.shape
    N = state.shape[-1]
    y = _output(out, (batch, T, H, P), x.dtype, x.device)
    for b, s in _rows(batch, slots):
        work, work_scale = state.clone(), None if state_scale is None else state_scale.clone()
        row = torch.tensor([s], device=state.device)
        for t in range(T):
            # draft t's bits: its slot's, at the slot's count + t
            at = None if rounding is None else rnd.StateRounding(rounding.seed, rounding.step + t)
            yt = decode_ref(work, x[b : b + 1, t], dt[b : b + 1, t], A, B[b : b + 1, t], C[b : b + 1, t], D=D,
                            z=None if z is None else z[b : b + 1, t], dt_bias=dt_bias, dt_softplus=dt_softplus,
                            slots=row, state_scale=work_scale, rounding=at)
            snapshots[s, t] = work[s].to(snapshots.dtype)
            if work_scale is not None:
                snapshot_scale[s, t] = work_scale[s]
            y[b, t] = yt[0]
    if rounding is not None:
        rounding.advance(slots, batch, by=T)
    return y


def accept_snapshot_ref(state, snapshots, n_accepted, slots=None, *, state_scale=None, snapshot_scale=None):
    """Copy snapshots[slot, n - 1] into state[slot] (and an 8-bit state's scales) for the rows with n ≥ 1."""
    for b, s in _rows(n_accepted.shape[0], slots):
        n = int(n_accepted[b])
        if n >= 1:
            state[s] = snapshots[s, n - 1]
            if state_scale is not None:
                state_scale[s] = snapshot_scale[s, n - 1]


def _checkpoint(cache, s: int, cd) -> torch.Tensor:
    scale = cache.checkpoint_scale
    return load_state(cache.checkpoint[s], None if scale is None else scale[s], cd)


def _read_state(cache, s: int, cd) -> torch.Tensor:
    if cache.read_copy is None:
        return _checkpoint(cache, s, cd)
    return dequantize_ref(cache.read_copy[s], None if cache.read_scale is None else cache.read_scale[s], cd)


def _store_checkpoint(cache, s: int, S: torch.Tensor) -> None:
    """A new checkpoint for slot s, rounded as the cache's stores are (bits at the slot's current count)."""
    _, H, P, N = cache.checkpoint.shape
    store_state(cache.checkpoint, cache.checkpoint_scale, s, S, _slot_bits(cache.rounding, s, H, P * N))
    if cache.read_copy is not None:
        copy, scale = quantize_ref(S, cache.read_copy.dtype)
        cache.read_copy[s] = copy
        if scale is not None:
            cache.read_scale[s] = scale


def _entries(cache, s: int, f: int, cd):
    """The first f buffered entries of slot s: x (H, f, P), B per head (H, f, N), Δ (H, f), lam (H, f)."""
    H = cache.checkpoint.shape[1]
    xs = cache.x_buf[s, :, :f].to(cd)
    bs = cache.b_buf[s, :, :f].to(cd).repeat_interleave(H // cache.b_buf.shape[1], dim=0)
    return xs, bs, cache.dt_buf[s, :, :f].to(cd), cache.lam_buf[s, :, :f].to(cd)


def _fold(S0: torch.Tensor, xs, bs, ds, ls, lam_end: torch.Tensor) -> torch.Tensor:
    """exp(lam_end) S0 + Σ_j exp(lam_end − lam_j) Δ_j x_j B_jᵀ over the given entries (per head)."""
    w = torch.exp(lam_end[:, None] - ls) * ds
    return torch.exp(lam_end)[:, None, None] * S0 + torch.einsum("hj,hjp,hjn->hpn", w, xs, bs)


def _lam_last(cache, s: int, f: int, cd) -> torch.Tensor:
    H = cache.checkpoint.shape[1]
    return cache.lam_buf[s, :, f - 1].to(cd) if f > 0 else torch.zeros(H, dtype=cd, device=cache.lam_buf.device)


def replay_ref(cache, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False, slots=None, out=None):
    """One ReplaySSM step on a ReplayCache, mutating it exactly as the kernel does.

    A row at fill f appends its entry and answers from the checkpoint (its read copy when there is one; 8-bit rows
    times their scales) plus the buffer while f + 1 < W; otherwise it folds the buffer and this token into a new
    checkpoint (stored as the cache rounds: to nearest or stochastically by `cache.rounding`, 8-bit rows with their
    scales; read copy rewritten from the fp32 value), answers from the fp32 value and empties the buffer; the
    slot's rounding count then advances by one. Computes in fp32.
    """
    cd = torch.float32
    batch, H, P = x.shape
    io = cache.x_buf.dtype
    y = _output(out, (batch, H, P), x.dtype, x.device)
    for b, s in _rows(batch, slots):
        f = int(cache.fill[s, 0])
        delta = _delta(dt[b], dt_bias, dt_softplus, cd)
        lam = _lam_last(cache, s, f, cd) + A.to(cd) * delta
        xb, Bb = x[b].to(io), B[b].to(io)
        Ch = _per_head(C[b].to(cd), H)
        xs, bs, ds, ls = _entries(cache, s, f, cd)
        xs = torch.cat([xs, xb.to(cd)[:, None]], dim=1)
        bs = torch.cat([bs, _per_head(Bb.to(cd), H)[:, None]], dim=1)
        ds = torch.cat([ds, delta[:, None]], dim=1)
        ls = torch.cat([ls, lam[:, None]], dim=1)
        if f + 1 < cache.window:
            w = torch.exp(lam[:, None] - ls) * ds * torch.einsum("hjn,hn->hj", bs, Ch)
            S0 = _read_state(cache, s, cd)
            yb = torch.exp(lam)[:, None] * torch.einsum("hpn,hn->hp", S0, Ch) + torch.einsum("hj,hjp->hp", w, xs)
            cache.x_buf[s, :, f] = xb
            cache.b_buf[s, :, f] = Bb
            cache.dt_buf[s, :, f] = delta
            cache.lam_buf[s, :, f] = lam
            cache.fill[s] = f + 1
        else:
            S = _fold(_checkpoint(cache, s, cd), xs, bs, ds, ls, lam)
            _store_checkpoint(cache, s, S)
            if cache.rounding is not None:
                cache.rounding.step[s] += 1
            yb = torch.einsum("hpn,hn->hp", S, Ch)
            cache.fill[s] = 0
        y[b] = _finish(yb, xb.to(cd), D, None if z is None else z[b], cd).to(y.dtype)
    return y


def verify_ref(cache, x, dt, A, B, C, *, D=None, z=None, dt_bias=None, dt_softplus=False, slots=None, out=None):
    """Outputs of T drafts from one checkpoint read; drafts appended after the committed entries, fill unchanged.

    x, z (batch, T, H, P); dt (batch, T, H); B, C (batch, T, G, N). A row whose fill is ≥ W first folds its
    committed entries into the checkpoint (as a flush does) and answers from that fp32 value. The drafts' x,
    Δ and lam go to the buffer at fill..fill+T-1, their B to the draft area that `accept_ref` commits. A fold stores
    as `replay_ref`'s flush does, and every row's slot's rounding count advances by one.
    """
    cd = torch.float32
    batch, T, H, P = x.shape
    io = cache.x_buf.dtype
    y = _output(out, (batch, T, H, P), x.dtype, x.device)
    for b, s in _rows(batch, slots):
        f = int(cache.fill[s, 0])
        if f >= cache.window:
            xs, bs, ds, ls = _entries(cache, s, f, cd)
            S0 = _fold(_checkpoint(cache, s, cd), xs, bs, ds, ls, _lam_last(cache, s, f, cd))
            _store_checkpoint(cache, s, S0)
            f = 0
            cache.fill[s] = 0
        else:
            S0 = _read_state(cache, s, cd)
        delta = _delta(dt[b], dt_bias, dt_softplus, cd)
        lam = _lam_last(cache, s, f, cd)[None, :] + torch.cumsum(A.to(cd)[None, :] * delta, dim=0)
        xd, Bd = x[b].to(io), B[b].to(io)
        xs, bs, ds, ls = _entries(cache, s, f, cd)
        xs = torch.cat([xs, xd.to(cd).transpose(0, 1)], dim=1)
        bs = torch.cat([bs, _per_head(Bd.to(cd), H).transpose(0, 1)], dim=1)
        ds = torch.cat([ds, delta.transpose(0, 1)], dim=1)
        ls = torch.cat([ls, lam.transpose(0, 1)], dim=1)
        for t in range(T):
            Ch = _per_head(C[b, t].to(cd), H)
            n = f + t + 1
            w = torch.exp(lam[t][:, None] - ls[:, :n]) * ds[:, :n] * torch.einsum("hjn,hn->hj", bs[:, :n], Ch)
            yt = torch.exp(lam[t])[:, None] * torch.einsum("hpn,hn->hp", S0, Ch)
            yt = yt + torch.einsum("hj,hjp->hp", w, xs[:, :n])
            y[b, t] = _finish(yt, xd[t].to(cd), D, None if z is None else z[b, t], cd).to(y.dtype)
        cache.x_buf[s, :, f : f + T] = xd.transpose(0, 1)
        cache.dt_buf[s, :, f : f + T] = delta.transpose(0, 1)
        cache.lam_buf[s, :, f : f + T] = lam.transpose(0, 1)
        cache.b_draft[s, :, :T] = Bd.transpose(0, 1)
    if cache.rounding is not None:
        cache.rounding.advance(slots, batch)
    return y


def accept_ref(cache, n_accepted, slots=None):
    """Commit the first n drafts of the last verify: their B joins the buffer and the fill advances by n."""
    for b, s in _rows(n_accepted.shape[0], slots):
        n = int(n_accepted[b])
        f = int(cache.fill[s, 0])
        cache.b_buf[s, :, f : f + n] = cache.b_draft[s, :, :n]
        cache.fill[s] = f + n


def materialize_ref(cache, slots=None) -> torch.Tensor:
    """Full fp32 states (len(slots), H, P, N): each checkpoint folded with its committed buffer entries."""
    idx = range(cache.checkpoint.shape[0]) if slots is None else slots.tolist()
    states = []
    for s in idx:
        f = int(cache.fill[s, 0])
        xs, bs, ds, ls = _entries(cache, s, f, torch.float32)
        states.append(_fold(_checkpoint(cache, s, torch.float32), xs, bs, ds, ls,
                            _lam_last(cache, s, f, torch.float32)))
    if not states:
        return cache.checkpoint.new_zeros((0, *cache.checkpoint.shape[1:]), dtype=torch.float32)
    return torch.stack(states)


def random_inputs(batch: int, H: int, P: int, N: int, G: int, *, T: int | None = None, io_dtype=torch.bfloat16,
                  device="cpu", optional: bool = True, generator: torch.Generator | None = None) -> dict:
    """Inputs of one step (or of T drafts, with a token axis) shaped like a trained layer's.

    Keys x, dt, A, B, C and, when `optional`, D, z, dt_bias (use with dt_softplus=True): A in [-1.5, -0.5],
    softplus(dt + dt_bias) around 0.3, so A·Δ is about -0.3 and a window's entries all matter.
    """
    lead = (batch,) if T is None else (batch, T)

    def randn(*shape, scale=1.0, shift=0.0):
        return torch.randn(shape, generator=generator, device="cpu") * scale + shift

    out = {
        "x": randn(*lead, H, P).to(device, io_dtype),
        "dt": randn(*lead, H, scale=0.5, shift=-1.0).to(device),
        "A": (-0.5 - torch.rand(H, generator=generator)).to(device),
        "B": randn(*lead, G, N).to(device, io_dtype),
        "C": randn(*lead, G, N).to(device, io_dtype),
    }
    if optional:
        out["D"] = randn(H).to(device)
        out["z"] = randn(*lead, H, P).to(device, io_dtype)
        out["dt_bias"] = randn(H, scale=0.1).to(device)
    else:
        out["dt"] = torch.nn.functional.softplus(out["dt"])
    return out
