"""What the compiler made of each step kernel, without a GPU: registers, spills, shared memory, SASS mix.

Compiles the Mamba-2 and GDN step kernels for a target architecture (default sm_90, the H200) exactly as
their Python entry points would launch them at the sweep shapes (Nemotron-3-Super and Qwen3.5-122B layers),
with Triton's own ptxas, then reads the cubin with the cuobjdump shipped beside it: registers per thread,
local memory (spills), shared memory per block, and the static SASS instruction mix (global loads and
stores, shuffles, shared-memory traffic, barriers, FP32 arithmetic, special functions). Nothing is launched.

    python benchmarks/compile_report.py
    python benchmarks/compile_report.py --op mamba2 --launch replay:rows=64,warps=4
    python benchmarks/compile_report.py --op mamba2 --launch verify:rows=32,warps=4
    python benchmarks/compile_report.py --op gdn --state-dtype bf16 --launch replay:maxnreg=96
    python benchmarks/compile_report.py --op gdn --launch replay:early=1,rows=16,chunk=16,stages=1,warps=1,maxnreg=255 \
        --sass _replay_kernel

With --sass KERNEL it also lists, for each compiled kernel whose name contains KERNEL, its memory and
synchronisation instructions (global loads, stores and atomics, shared-memory stores and matrix loads, barriers,
index shuffles, uniform-register moves, exits) in program order, each with its index among all the kernel's
instructions: what a program waits on, and in which order its loads are issued.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep_common as common  # noqa: E402

from replayssm_cli.measure.compile_check import CompileOnly, resource_usage, sass  # noqa: E402

OPCODE_GROUPS = {
    "LDG": "global ld", "STG": "global st", "SHFL": "shfl", "LDS": "shared ld", "STS": "shared st",
    "BAR": "barrier", "FFMA": "fp32", "FMUL": "fp32", "FADD": "fp32", "MUFU": "mufu", "HMMA": "mma",
    "ATOMG": "atomic", "RED": "atomic",
}
CASES = ("decode", "replay", "split-bf16", "verify")
# the instructions --sass lists: what a program issues to memory and where it may wait
ORDER_OPCODES = re.compile(r"^(LDG|STG|ATOMG|RED|STSM|LDSM|STS|LDS|BAR|SHFL\.IDX|R2UR|EXIT|MEMBAR)\b")
STATE_DTYPES = ("fp32", "bf16", "fp16")


def compile_kernels(op: str, launches: dict[str, dict], arch: int,
                    state_dtype: str = "fp32") -> list[tuple[str, str, object]]:
    """(case, kernel name, CompiledKernel) for each step kernel of `op`, compiled and not launched."""
    import torch
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    compiled: list[tuple[str, str, object]] = []
    real_run = JITFunction.run

    def run(self, *a, grid, warmup, **kw):
        kernel = real_run(self, *a, grid=grid, warmup=True, **kw)
        # a replay that takes its flushes in a second launch (PHASES=2) compiles a second kernel, its flush kernel
        compiled.append((case, self.fn.__name__, kernel))
        return kernel

    # The decode's, the replay's and Mamba-2's verify's state (checkpoint) dtype; split precision and GDN's verify keep
    # fp32 checkpoints.
    state = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[state_dtype]
    driver.set_active(CompileOnly(arch))
    JITFunction.run = run
    # A slot table, as the sweeps and `replayssm profile` pass: without one some kernels compile a variant without its read.
    slots = torch.arange(4, dtype=torch.int32)
    try:
        if op == "mamba2":
            from replayssm_kernels import common as kc
            from replayssm_kernels import mamba2 as m

            md, mr, mv = (sys.modules[f"replayssm_kernels.mamba2.{name}"] for name in ("decode", "replay", "verify"))
            kc.check_device = lambda *a, **k: None
            H, P, N, G = 128, 64, 128, 8
            inp = m.random_inputs(4, H, P, N, G, io_dtype=torch.bfloat16)
            case = "decode"
            pool = torch.zeros(4, H, P, N, dtype=state)
            m.decode(pool, **inp, dt_softplus=True, slots=slots, check=False,
                     config=kc.override(md.DECODE_LAUNCH[md.select(pool, 4)], launches.get(case)))
            for case, read in (("replay", None), ("split-bf16", "bf16")):
                cache = m.ReplayCache.create(4, H, P, N, G, 16, state_dtype=state if read is None else
                                             torch.float32, read_dtype=read, io_dtype="bf16", device="cpu")
                m.replay(cache, **inp, dt_softplus=True, slots=slots, check=False,
                         config=kc.override(mr.STEP_LAUNCH[mr.select(cache, 4)], launches.get(case)))
            case = "verify"
            cache = m.ReplayCache.create(4, H, P, N, G, 16, state_dtype=state, io_dtype="bf16", max_draft=4,
                                         device="cpu")
            m.verify(cache, **m.random_inputs(4, H, P, N, G, T=4, io_dtype=torch.bfloat16), dt_softplus=True,
                     slots=slots, check=False, config=kc.override(mv.VERIFY_LAUNCH[mv.select(cache, 4)],
                                                                  launches.get(case)))
        else:
            from replayssm_kernels import common as kc
            from replayssm_kernels import gdn as g

            gd, gr, gv = (sys.modules[f"replayssm_kernels.gdn.{name}"] for name in ("decode", "replay", "verify"))
            kc.check_device = lambda *a, **k: None
            H, HV, K, V = 16, 64, 128, 128
            inp = g.random_inputs(4, H, HV, K, V, io_dtype=torch.bfloat16)
            case = "decode"
            pool = torch.zeros(4, HV, V, K, dtype=state)
            g.decode(pool, **inp, use_qk_l2norm_in_kernel=True, slots=slots, check=False,
                     config=kc.override(gd.DECODE_LAUNCH[gd.select(pool, 4)], launches.get(case)))
            for case, read in (("replay", None), ("split-bf16", "bf16")):
                cache = g.ReplayCache.create(4, H, HV, K, V, 16, state_dtype=state_dtype if read is None else "fp32",
                                             read_dtype=read, io_dtype="bf16", device="cpu")
                g.replay(cache, **inp, use_qk_l2norm_in_kernel=True, slots=slots, check=False,
                         config=kc.override(gr.REPLAY_LAUNCH[gr.select(cache, 4)], launches.get(case)))
            case = "verify"
            cache = g.ReplayCache.create(4, H, HV, K, V, 16, state_dtype="fp32", io_dtype="bf16", max_draft=4,
                                         device="cpu")
            g.verify(cache, **g.random_inputs(4, H, HV, K, V, T=4, io_dtype=torch.bfloat16),
                     use_qk_l2norm_in_kernel=True, slots=slots, check=False,
                     config=kc.override(gv.VERIFY_LAUNCH[gv.select_verify(cache, 4)], launches.get(case)))
    finally:
        JITFunction.run = real_run
        driver._active = None
    return compiled


def sass_order(listing: str) -> list[tuple[int, str]]:
    """(index among the kernel's instructions, instruction) of each one ORDER_OPCODES names in a one-kernel cubin's
    SASS (`sass(cubin, "-sass")`), in program order."""
    listed = []
    index = 0
    for line in listing.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;", line)
        if not m:
            continue
        text = m.group(1)
        opcode = re.sub(r"^@!?U?P\w+\s+", "", text)
        if ORDER_OPCODES.match(opcode):
            listed.append((index, text))
        index += 1
    return listed


def cubin_report(cubin: bytes, shared: int, listing: str) -> dict:
    """Registers, local (spill) bytes, shared bytes (static plus Triton's dynamic) and SASS opcode counts of a
    one-kernel cubin, given its SASS (`sass(cubin, "-sass")`)."""
    usage = resource_usage(cubin, shared)
    ops: collections.Counter = collections.Counter()
    for line in listing.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if m:
            ops[m.group(1)] += 1
    groups: collections.Counter = collections.Counter()
    for opcode, count in ops.items():
        groups[OPCODE_GROUPS.get(opcode.split(".")[0], "other")] += count
    return {"regs": usage["regs"], "local": usage["spills"], "shared": usage["shared"], "total": sum(ops.values()),
            **groups}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", choices=("mamba2", "gdn", "both"), default="both")
    parser.add_argument("--arch", type=int, default=90, help="compute capability as an integer (default 90)")
    parser.add_argument("--state-dtype", choices=STATE_DTYPES, default="fp32",
                        help="the decode's, the replay's and Mamba-2's verify's state dtype (split precision and GDN's "
                             "verify keep fp32)")
    parser.add_argument("--launch", action="append", default=[],
                        help="CASE:key=value,... with CASE decode, replay, split-bf16 or verify (repeat)")
    parser.add_argument("--sass", metavar="KERNEL", default=None,
                        help="also list the memory and synchronisation instructions, in order, of each kernel whose "
                             "name contains KERNEL")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("error: TRITON_INTERPRET=1 runs the kernels in Triton's interpreter instead of compiling them; "
              "run compile_report without it", file=sys.stderr)
        return 2
    launches: dict[str, dict] = {}
    for text in args.launch:
        case, sep, body = text.partition(":")
        if not sep or case not in CASES:
            print(f"error: --launch {text!r}: expected CASE:key=value,... with CASE one of {', '.join(CASES)}",
                  file=sys.stderr)
            return 2
        try:
            launches[case] = common.parse_launch(f"replay:{body}")[1]
        except ValueError as e:
            print(f"error: --launch {text!r}: {str(e).split(': ', 1)[-1]}", file=sys.stderr)
            return 2
    cols = ("regs", "local", "shared", "total", "global ld", "global st", "shfl", "shared ld", "shared st", "barrier",
            "fp32", "mufu", "mma", "atomic")
    print(f"{'op':7s} {'case':11s} {'kernel':24s} " + " ".join(f"{c:>9s}" for c in cols))
    listings = []
    for op in ("mamba2", "gdn") if args.op == "both" else (args.op,):
        for case, name, kernel in compile_kernels(op, launches, args.arch, args.state_dtype):
            listing = sass(kernel.asm["cubin"], "-sass")
            rep = cubin_report(kernel.asm["cubin"], kernel.metadata.shared, listing)
            print(f"{op:7s} {case:11s} {name:24s} " + " ".join(f"{rep.get(c, 0):9d}" for c in cols))
            if args.sass is not None and args.sass in name:
                listings.append((f"{op} {case} {name}", sass_order(listing)))
    if args.sass is not None and not listings:
        print(f"error: --sass {args.sass!r}: no compiled kernel's name contains it (the table above names them)",
              file=sys.stderr)
        return 2
    for title, listed in listings:
        print(f"\n{title}: memory and synchronisation instructions in order (index among all instructions)")
        for index, text in listed:
            print(f"{index:6d}  {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
