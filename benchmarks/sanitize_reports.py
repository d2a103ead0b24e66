"""Each case's distinct compute-sanitizer reports in a log of benchmarks/sanitize.sh, with their hazard counts.

    python benchmarks/sanitize_reports.py LOG [LOG ...]

A case with no report reads "clean"; a racecheck report is "severity: access kernel file:line / access file:line".
"""

from __future__ import annotations

import collections
import re
import sys

CASE = re.compile(r"== case (\S+)")
RACE = re.compile(r"(Error|Warning|Info): Race reported between (\w+) access at (\w+)\+\w+ in (\S+)")
OTHER = re.compile(r"and (\w+) access at \w+\+\w+ in (\S+) \[(\d+) hazards?\]")
ERROR = re.compile(r"========= (Invalid |Barrier |Program hit |Error: (?!Race))")


def reports(text: str) -> dict[str, collections.Counter]:
    """{case: Counter(report: hazards)} in the order the cases ran."""
    per: dict[str, collections.Counter] = {}
    case = None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if m := CASE.match(line):
            case = m.group(1)
            per.setdefault(case, collections.Counter())
        elif case and (m := RACE.search(line)) and i + 1 < len(lines) and (n := OTHER.search(lines[i + 1])):
            key = f"{m.group(1)}: {m.group(2)} {m.group(3)} {m.group(4)} / {n.group(1)} {n.group(2)}"
            per[case][key] += int(n.group(3))
        elif case and ERROR.search(line):
            per[case][line.strip("= ")[:120]] += 1
    return per


def main(paths: list[str]) -> int:
    for path in paths:
        print(f"## {path}")
        for case, counts in reports(open(path, errors="replace").read()).items():
            print(f"{case:36s} {'' if counts else 'clean'}")
            for key, n in counts.most_common():
                print(f"    {n:8d}  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
