"""Every kernel at every shipped launch row compiled for one target on the CPU (nothing launched), fingerprinted:
registers, spills, shared memory and hashes of the PTX and SASS with kernel and parameter names and debug lines
taken out. Two fingerprints of the same rows are the same machine code, so a change that keeps them keeps the
kernels' speed.

    python benchmarks/kernel_fingerprint.py --out before.json            # record (sm_90 by default)
    python benchmarks/kernel_fingerprint.py --out after.json --compare before.json
    python benchmarks/kernel_fingerprint.py --out now.json --compare benchmarks/fingerprints/sm90-c2d9155.json \
        --rename benchmarks/fingerprints/renames-c2d9155.json     # against the rows as they were at c2d9155
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from concurrent.futures import ProcessPoolExecutor


def normalised_ptx(ptx: str, name: str) -> str:
    """The PTX's instructions: no debug lines or sections, the kernel's and its parameters' names replaced."""
    lines = []
    for line in ptx.split(".section")[0].splitlines():
        line = line.split("//")[0].rstrip()
        if not line.strip() or line.lstrip().startswith((".loc", ".file")):
            continue
        lines.append(line)
    text = "\n".join(lines).replace(name, "KERNEL")
    return re.sub(r"\$L__tmp\d+", "TMP", text)


def normalised_sass(sass: str) -> str:
    """SASS instructions without addresses, encodings or the function's name."""
    out = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if m:
            out.append(m.group(1))
    return "\n".join(out)


def fingerprint_case(task: tuple[int, int]) -> tuple[str, list[dict]]:
    """The fingerprint of each kernel one compile-check case launches, compiled for sm_`arch`."""
    from replayssm_cli.measure import compile_check as cc

    index, arch = task
    case = cc.cases()[index]
    rows = []
    for name, kernel in cc.compiled_kernels(lambda: cc.drive(case), arch):
        usage = cc.resource_usage(kernel.asm["cubin"], kernel.metadata.shared)
        ptx = normalised_ptx(kernel.asm["ptx"], name)
        sass = normalised_sass(cc.sass(kernel.asm["cubin"], "-sass"))
        rows.append({"kernel": name, **usage, "num_warps": kernel.metadata.num_warps,
                     "ptx": hashlib.sha256(ptx.encode()).hexdigest()[:16],
                     "sass": hashlib.sha256(sass.encode()).hexdigest()[:16], "sass_lines": sass.count("\n") + 1})
    return case.key, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--compare", help="a fingerprint file to compare with, case by case")
    parser.add_argument("--rename", help="JSON {old case key: new case key} for cases renamed since --compare")
    a = parser.parse_args()
    from replayssm_cli.measure import compile_check as cc

    tasks = [(i, a.arch) for i in range(len(cc.cases()))]
    result: dict[str, list] = {}
    with ProcessPoolExecutor(max_workers=a.jobs) as pool:
        for done, (key, rows) in enumerate(pool.map(fingerprint_case, tasks), 1):
            result[key] = rows
            print(f"{done}/{len(tasks)} {key}: {len(rows)} kernels", file=sys.stderr, flush=True)
    with open(a.out, "w") as f:
        json.dump({"arch": a.arch, "cases": result}, f, indent=1, sort_keys=True)
    if not a.compare:
        return 0
    old = json.load(open(a.compare))["cases"]
    rename = json.load(open(a.rename)) if a.rename else {}
    same, differ = 0, []
    fields = ("regs", "spills", "shared", "num_warps", "ptx", "sass")
    for key, rows in old.items():
        new = result.get(rename.get(key, key))
        if new is None:
            differ.append(f"{key}: not compiled now")
            continue
        a_ = [tuple(r[k] for k in fields) for r in rows]
        b_ = [tuple(r[k] for k in fields) for r in new]
        if a_ == b_:
            same += 1
        else:
            differ.append(f"{key}: {a_} -> {b_}")
    print(f"{same} of {len(old)} cases compile to the same code", flush=True)
    for line in differ:
        print("differs:", line)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
