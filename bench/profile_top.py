"""The hottest functions of a py-spy raw (collapsed-stack) profile, by own time and by total time.

Usage: .venv/bin/python bench/profile_top.py FILE.collapsed [--top 25] [--filter SUBSTRING] [--ours]
"""

import argparse
from collections import Counter
from pathlib import Path


def tops(path: Path, substring: str | None) -> tuple[Counter[str], Counter[str], int]:
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [frame for frame in stack.split(";") if not frame.startswith("process ")
                  and not frame.startswith("thread ")]
        if substring and not any(substring in frame for frame in frames):
            continue
        samples += count
        if frames:
            own[frames[-1]] += count
        for frame in set(frames):
            total[frame] += count
    return own, total, samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--filter", default=None, help="only the stacks with a frame containing this")
    parser.add_argument("--ours", action="store_true", help="totals of our own frames only (services/, contracts/)")
    args = parser.parse_args()
    own, total, samples = tops(args.file, args.filter)
    print(f"{samples} samples")
    for title, counter in (("own", own), ("total", total)):
        print(f"\n-- by {title} time")
        ranked = [(frame, count) for frame, count in counter.most_common() if not args.ours
                  or "services/" in frame or "contracts/" in frame or "infra/" in frame][:args.top]
        for frame, count in ranked:
            print(f"{count / max(samples, 1) * 100:5.1f}%  {frame}")


if __name__ == "__main__":
    main()
