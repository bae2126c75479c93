"""Summarises the samples of scripts/stack_sampler/sitecustomize.py: per process, one line per
second with the sample count and the most frequent innermost frames (library code first).

Usage: python scripts/stack_sampler/summarize.py DIR [--frames N] [--from UNIX --to UNIX]
       python scripts/stack_sampler/summarize.py DIR --within FRAME [--frames N] [--top K]

--within FRAME: only the samples taken inside FRAME (a function name, or `file.py:function`), as one
profile per process: seconds per innermost frames, each sample counting until the next one (so
a C call that held the GIL counts in full).

Either way, each process's long garbage collections (DIR/gc-<pid>.txt) follow: their count, total
and the longest, with their Unix times to match against a gap in the samples.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import pathlib

# Frames from these files say little about what is being waited for.
_NOISE = ("threading.py", "selectors.py", "queues.py", "connection.py", "<frozen")


def _tail(stack: str, frames: int) -> str:
    parts = [p for p in stack.split(";") if not p.startswith(_NOISE)]
    return " > ".join(parts[-frames:])


def summarize(path: pathlib.Path, frames: int, start: float, stop: float) -> list[str]:
    lines, per_second = [], collections.OrderedDict()
    for raw in path.read_text(errors="replace").splitlines():
        if raw.startswith("#"):
            lines.append(raw)
            continue
        stamp, _, stack = raw.partition("\t")
        t = float(stamp)
        if start <= t <= stop:
            per_second.setdefault(int(t), collections.Counter())[_tail(stack, frames)] += 1
    for second, counts in per_second.items():
        clock = datetime.datetime.fromtimestamp(second, datetime.timezone.utc).strftime("%H:%M:%S")
        top, n = counts.most_common(1)[0]
        lines.append(f"{clock} {sum(counts.values()):2d} samples, {n:2d}x {top}")
    return lines


def _inside(stack: str, frame: str) -> bool:
    """Whether one of the stack's `file:function:line` frames is `frame` (`function` or `file:function`)."""
    for part in stack.split(";"):
        file, _, rest = part.partition(":")
        function = rest.rpartition(":")[0]
        if frame in (function, f"{file}:{function}"):
            return True
    return False


def profile(path: pathlib.Path, frames: int, within: str, top: int) -> list[str]:
    """Seconds spent inside `within`, by innermost frames; a sample lasts until the next one."""
    samples = []
    for raw in path.read_text(errors="replace").splitlines():
        if not raw.startswith("#"):
            stamp, _, stack = raw.partition("\t")
            samples.append((float(stamp), stack))
    seconds: collections.Counter = collections.Counter()
    for (t, stack), (t_next, _) in zip(samples, samples[1:]):
        if _inside(stack, within):
            seconds[_tail(stack, frames)] += t_next - t
    if not seconds:
        return []
    lines = [f"{sum(seconds.values()):.3f} s inside {within}"]
    lines += [f"{s:8.3f} s  {tail}" for tail, s in seconds.most_common(top)]
    return lines


def gc_pauses(path: pathlib.Path, top: int = 5) -> list[str]:
    """The collections in one gc-<pid>.txt: count, total seconds, the ``top`` longest."""
    pauses = []
    for raw in path.read_text(errors="replace").splitlines():
        fields = raw.split("\t")
        try:
            pauses.append((float(fields[2]), float(fields[0]), fields[1], " ".join(fields[3:])))
        except (IndexError, ValueError):
            continue
    if not pauses:
        return []
    lines = [f"{len(pauses)} garbage collections, {sum(p[0] for p in pauses):.3f} s in all"]
    lines += [f"{s:8.3f} s  at {t:.3f} {gen} {rest}" for s, t, gen, rest in sorted(pauses, reverse=True)[:top]]
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", type=pathlib.Path)
    p.add_argument("--frames", type=int, default=4)
    p.add_argument("--from", dest="start", type=float, default=0.0)
    p.add_argument("--to", dest="stop", type=float, default=float("inf"))
    p.add_argument("--within", help="profile only the samples inside this frame (function or file.py:function)")
    p.add_argument("--top", type=int, default=15)
    args = p.parse_args()
    for path in sorted(args.dir.glob("stacks-*.txt")):
        if args.within:
            lines = profile(path, args.frames, args.within, args.top)
            if lines:
                print(f"== {path.name}")
                print("\n".join(lines))
            continue
        print(f"== {path.name}")
        print("\n".join(summarize(path, args.frames, args.start, args.stop)))
    for path in sorted(args.dir.glob("gc-*.txt")):
        lines = gc_pauses(path)
        if lines:
            print(f"== {path.name}")
            print("\n".join(lines))


if __name__ == "__main__":
    main()
