"""Triton pieces every Mamba-2 kernel shares: Δ, the D and gate terms, folding buffered entries, the read copy."""

from __future__ import annotations

import triton
import triton.language as tl

FP8_MAX = tl.constexpr(448.0)


@triton.jit
def flat_program_ids(NH, NPB):
    """(row, head, block) of a program in a flat grid of rows x NH heads x NPB blocks, a head's blocks adjacent.

    Programs that run together then read neighbouring memory (measured on an H200: 5-8% faster decode than a
    grid whose fastest axis is the row, benchmarks/notes/).
    """
    pid = tl.program_id(0)
    return pid // (NPB * NH), (pid // NPB) % NH, pid % NPB


@triton.jit
def dot_fp32(a, b, IS_A_EXACT: tl.constexpr, IS_B_EXACT: tl.constexpr, acc=None):
    # acc + a @ b to about fp32 accuracy on TF32 tensor cores; an operand exact in TF32 (16-bit data) needs no low
    # part
    if IS_A_EXACT and IS_B_EXACT:
        b_ab = tl.dot(a, b, acc, input_precision="tf32")
    elif IS_A_EXACT:
        b_hi = (b.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
        b_ab = tl.dot(a, b - b_hi, tl.dot(a, b_hi, acc, input_precision="tf32"), input_precision="tf32")
    elif IS_B_EXACT:
        a_hi = (a.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
        b_ab = tl.dot(a - a_hi, b, tl.dot(a_hi, b, acc, input_precision="tf32"), input_precision="tf32")
    else:
        b_ab = tl.dot(a, b, acc, input_precision="tf32x3")
    return b_ab


@triton.jit
def slot_of(slots, i_b, HAS_SLOTS: tl.constexpr):
    """The state slot of row i_b as int64: slots[i_b] (-1 for a padding row) or, without a slot table, i_b."""
    if HAS_SLOTS:
        i_s = tl.load(slots + i_b).to(tl.int64)
    else:
        i_s = i_b.to(tl.int64)
    return i_s


@triton.jit
def fills_read():
    """Order every thread's read of the program's fills before what comes next: a fill's store, or an arrival that
    lets another program store it. Triton loads a scalar in every thread, so without this barrier a warp that has
    not yet read a fill can see the value another warp just stored and take the other branch of the step
    (kernels/README.md, "The fill protocol")."""
    tl.debug_barrier()


# A replay in two launches passes the heads that flush from its first launch to its second in `work`, int32: a header
# of LIST_HEADER words, all zero between steps ([0] the count, [1] the programs done with the list, and for a tail
# (TAIL): [2] the tickets taken, [3] the heads programs done, [4] the entries claimed), then LIST_ENTRY words per
# listed head: (row, head, fill, and with TAIL a flag set once the other three are written).
LIST_HEADER = tl.constexpr(8)
LIST_ENTRY = tl.constexpr(4)


@triton.jit
def list_flush(work, i_b, i_h, f, TAIL: tl.constexpr):
    """Append (row, head, fill) to the list of heads that flush (the non-flush launch); with TAIL, publish it to the
    programs of the same launch that wait for it."""
    i_e = tl.atomic_add(work, 1, sem="relaxed")
    p_e = work + LIST_HEADER + LIST_ENTRY * i_e
    tl.store(p_e, i_b)
    tl.store(p_e + 1, i_h)
    tl.store(p_e + 2, f)
    if TAIL:
        tl.atomic_xchg(p_e + 3, 1, sem="release")


@triton.jit
def list_heads(work, i_b, o_h, f, m_l):
    """Append (row, head o_h, fill f) for each lane of m_l to the list of heads that flush, with one atomic for the
    whole row: its entries take consecutive places in lane order."""
    b_n = m_l.to(tl.int32)
    n = tl.sum(b_n, 0)
    if n > 0:
        i_e = tl.atomic_add(work, n, sem="relaxed") + tl.cumsum(b_n, 0) - 1
        p_e = work + LIST_HEADER + LIST_ENTRY * i_e
        tl.store(p_e, tl.zeros_like(b_n) + i_b, mask=m_l)
        tl.store(p_e + 1, o_h, mask=m_l)
        tl.store(p_e + 2, f, mask=m_l)


@triton.jit
def advance_heads(p_fill, work, i_b, h0, f, W: tl.constexpr, HPP: tl.constexpr, TAIL: tl.constexpr):
    """After a non-flush launch's step of heads h0 .. h0 + HPP of row i_b at fill f (p_fill: the slot's fills): their
    fills to f + 1, or, where the step fills the window, to 0 with each head listed for the flushes."""
    o_hh = tl.arange(0, HPP)
    fills_read()
    if f + 1 < W:
        tl.store(p_fill + h0 + o_hh, tl.zeros([HPP], dtype=tl.int32) + f + 1)
    else:
        tl.store(p_fill + h0 + o_hh, tl.zeros([HPP], dtype=tl.int32))
        for hh in tl.static_range(HPP):
            list_flush(work, i_b, h0 + hh, f, TAIL)


@triton.jit
def listed_flush(work, i_e):
    """(row, head, fill) of the list's entry i_e (the flushes)."""
    p_e = work + LIST_HEADER + LIST_ENTRY * i_e
    # From L2: with TAIL the entry was written during this launch, maybe after its line came into this SM's L1.
    return (tl.load(p_e, cache_modifier=".cg"), tl.load(p_e + 1, cache_modifier=".cg"),
            tl.load(p_e + 2, cache_modifier=".cg"))


@triton.jit
def listed_ahead(work, i_e, m_e):
    """(row, head, fill) of the list's entry i_e where m_e, zeros where not: an entry loaded before it is needed
    (an entry past the list's count is never read)."""
    p_e = work + LIST_HEADER + LIST_ENTRY * i_e
    return tl.load(p_e, mask=m_e, other=0), tl.load(p_e + 1, mask=m_e, other=0), tl.load(p_e + 2, mask=m_e, other=0)


@triton.jit
def list_done(work, n_programs):
    """Each of the n_programs that take the list's flushes calls this after its last entry; the last of them zeroes
    the header for the next step."""
    if tl.atomic_add(work + 1, 1, sem="acq_rel") == n_programs - 1:
        for i in tl.static_range(5):
            if i != 1:
                tl.store(work + i, 0)
        tl.store(work + 1, 0)


@triton.jit
def tail_ticket(work):
    """A tail launch's order of starting: its first tickets take the heads programs, the rest the flushes. Programs
    that start later take later tickets, so a flushing program waits only on heads programs already running."""
    return tl.atomic_add(work + 2, 1, sem="relaxed")


@triton.jit
def tail_heads_done(work):
    """A tail launch's heads program after its heads, its list entries published."""
    tl.atomic_add(work + 3, 1, sem="release")


@triton.jit
def tail_claim(work):
    """The next list entry for a tail launch's flushing program."""
    return tl.atomic_add(work + 4, 1, sem="relaxed")


@triton.jit
def tail_wait(work, i_e, n_heads, n_entries):
    """Wait until the list's entry i_e is published (True; its fields then readable, its flag cleared for the next
    step) or all n_heads heads programs are done with fewer entries (False; at once past the list's n_entries).
    Polls with atomics: each is made by one thread and its value given to the program's others, so that all take
    the same branch."""
    p_flag = work + LIST_HEADER + LIST_ENTRY * i_e + 3
    state = tl.where(i_e < n_entries, 0, 2)
    while state == 0:
        if tl.atomic_add(p_flag, 0, sem="acquire") != 0:
            tl.store(p_flag, 0)
            state = 1
        elif tl.atomic_add(work + 3, 0, sem="acquire") == n_heads:
            # Every heads program has listed its entries: i_e is among them if the count passed it (then its
            # flag shows on the next poll).
            if tl.atomic_add(work, 0, sem="relaxed") <= i_e:
                state = 2
    return state == 1


@triton.jit
def step_delta(b_dt, dt_bias, i_h, HAS_DT_BIAS: tl.constexpr, USE_SOFTPLUS: tl.constexpr):
    b_dt = b_dt.to(tl.float32)
    if HAS_DT_BIAS:
        b_dt += tl.load(dt_bias + i_h).to(tl.float32)
    if USE_SOFTPLUS:
        b_dt = tl.where(b_dt <= 20.0, tl.log(1.0 + tl.exp(b_dt)), b_dt)
    return b_dt


@triton.jit
def finish_output(b_y, b_x, D, z, o_z, m_p, i_h, HAS_D: tl.constexpr, HAS_Z: tl.constexpr):
    if HAS_D:
        b_y += tl.load(D + i_h).to(tl.float32) * b_x
    if HAS_Z:
        b_y = z_gate(b_y, tl.load(z + o_z, mask=m_p, other=0.0))
    return b_y


@triton.jit
def z_gate(b_y, b_z):
    """y gated by the SiLU of z (as loaded)."""
    b_z = b_z.to(tl.float32)
    return b_y * b_z * tl.sigmoid(b_z)


@triton.jit
def scalar_mask(cond):
    """A scalar condition that block masks may take in: `True &` folds away when compiled, and in Triton's interpreter
    makes it boolean (there a bare comparison takes its operands' integer type, which 3.9's loads refuse as a mask)."""
    return True & cond


@triton.jit
def fold_entries(b_s, b_lam, p_x, p_b, p_dt, p_lam, n, o_p, o_n, m_p, m_n, P, N,
                 CAP: tl.constexpr, JB: tl.constexpr):
    # b_s [BP, BN] -> exp(lam) b_s + sum_{j<n} exp(lam - lam_j) dt_j x_j B_j^T, as rank-1 updates JB at a time
    b_s = b_s * tl.exp(b_lam)
    for j0 in range(0, CAP, JB):
        if j0 < n:
            for jj in tl.static_range(JB):
                j = j0 + jj
                m_j = scalar_mask(j < n)
                b_lj = tl.load(p_lam + j, mask=m_j, other=0.0)
                b_c = tl.where(m_j, tl.load(p_dt + j, mask=m_j, other=0.0) * tl.exp(b_lam - b_lj), 0.0)
                b_xj = tl.load(p_x + j * P + o_p, mask=m_p & m_j, other=0.0).to(tl.float32)
                b_bj = tl.load(p_b + j * N + o_n, mask=m_n & m_j, other=0.0).to(tl.float32)
                b_s += (b_c * b_xj)[:, None] * b_bj[None, :]
    return b_s


@triton.jit
def store_read_copy(b_s, p_copy, read_scale, o_scale, m_s, m_p, IS_FP8: tl.constexpr):
    if IS_FP8:
        b_scale = tl.max(tl.abs(b_s), axis=1) / FP8_MAX
        b_q = b_s / tl.where(b_scale > 0, b_scale, 1.0)[:, None]
        # Round to e4m3's 3 mantissa bits here so the cast is exact: Triton's interpreter does not round fp8 casts.
        b_bits = b_q.to(tl.int32, bitcast=True)
        b_bits = (b_bits + 0x7FFFF + ((b_bits >> 20) & 1)) & -0x100000
        b_q = b_bits.to(tl.float32, bitcast=True)
        tl.store(read_scale + o_scale, b_scale, mask=m_p)
        tl.store(p_copy, b_q.to(p_copy.dtype.element_ty), mask=m_s)
    else:
        tl.store(p_copy, b_s.to(p_copy.dtype.element_ty), mask=m_s)
