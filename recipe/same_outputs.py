"""Did the starts give the same greedy outputs? Tokens and, where recorded, log-probabilities, bit for bit.

Usage: python same_outputs.py REFERENCE.json RUN.json...   (exit 1 if any run differs)

Each JSON holds ``tokens`` (one list of token ids, or the text, per prompt) and, when the start
recorded them, ``logprobs`` (the log-probability of each chosen token, per prompt). Equal tokens
alone say little when every prompt gets the same completion (an engine's dummy weights); a
log-probability depends on all of its step's logits (through the normalisation), so equal ones at
every step leave a difference in what the graphs computed little room. The summary says which were
compared and how many of the reference's completions are distinct.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Comparison:
    differences: dict[str, str]  # run name -> its first difference from the reference
    what: str  # "greedy tokens and log-probabilities" or "greedy tokens"
    count: int  # the reference's completions
    distinct: int  # how many of them differ from one another


def _same_number(a, b) -> bool:
    """Bit for bit: -0.0 is not 0.0; a NaN matches a NaN; None (no log-probability) only None."""
    if a is None or b is None:
        return a is b
    return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))


def _logprob_difference(ref: list | None, run: list | None) -> str | None:
    """Where two lists of log-probabilities (or None: the start recorded none) first differ."""
    if ref is None or run is None:
        if ref is run:
            return None
        return "no log-probabilities" if run is None else "log-probabilities where the reference has none"
    at = next((j for j, (x, y) in enumerate(zip(ref, run)) if not _same_number(x, y)), None)
    if at is None and len(ref) != len(run):
        at = min(len(ref), len(run))
    if at is None:
        return None
    got, want = (run[at] if at < len(run) else "none"), (ref[at] if at < len(ref) else "none")
    return f"token {at}: log-probability {got!r}, not {want!r}"


def first_difference(ref: dict, run: dict, with_logprobs: bool) -> str | None:
    """Where ``run``'s outputs first leave ``ref``'s, in words; None when they do not."""
    ref_tokens, run_tokens = ref["tokens"], run["tokens"]
    if len(ref_tokens) != len(run_tokens):
        return f"{len(run_tokens)} completions, not {len(ref_tokens)}"
    for i, (a, b) in enumerate(zip(ref_tokens, run_tokens)):
        if a != b:
            if isinstance(a, str) or isinstance(b, str):
                return f"completion {i}: {b!r}, not {a!r}"
            at = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            return f"completion {i}, token {at}: {b[at:at + 1]}, not {a[at:at + 1]}"
    if with_logprobs:
        ref_lp, run_lp = ref["logprobs"], run["logprobs"]
        if len(ref_lp) != len(run_lp):
            return f"log-probabilities of {len(run_lp)} completions, not {len(ref_lp)}"
        for i, (a, b) in enumerate(zip(ref_lp, run_lp)):
            why = _logprob_difference(a, b)
            if why:
                return f"completion {i}, {why}"
    return None


def compare(ref_name: str, runs: dict[str, dict]) -> Comparison:
    """The first difference of each run from the one named ``ref_name``; log-probabilities are
    compared when every run holds them and the reference recorded some (a server that returned
    none for every completion leaves only the tokens compared, and the summary says so)."""
    ref = runs[ref_name]
    with_logprobs = (all("logprobs" in r for r in runs.values())
                     and any(lp is not None for lp in ref.get("logprobs") or []))
    differences = {}
    for name, run in runs.items():
        if name != ref_name:
            why = first_difference(ref, run, with_logprobs)
            if why:
                differences[name] = why
    what = "greedy tokens and log-probabilities" if with_logprobs else "greedy tokens"
    distinct = len({json.dumps(t) for t in ref["tokens"]})
    return Comparison(differences, what, len(ref["tokens"]), distinct)


def run_names(paths: list[str]) -> dict[str, str]:
    """Each distinct file's name for the report: its stem, or its path where stems collide."""
    unique = list(dict.fromkeys(str(Path(p)) for p in paths))
    stems = [Path(p).stem for p in unique]
    return {p: (s if stems.count(s) == 1 else p) for p, s in zip(unique, stems)}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    names = run_names(argv)
    runs = {name: json.loads(Path(path).read_text()) for path, name in names.items()}
    ref_name = names[str(Path(argv[0]))]
    result = compare(ref_name, runs)
    for name in runs:
        if name != ref_name:
            why = result.differences.get(name)
            print(f"  {name}: " + (f"DIFFERENT from {ref_name}: {why}" if why else
                                   f"identical {result.what} ({result.count} prompts) vs {ref_name}"))
    print(f"  {ref_name}: {result.distinct} distinct completions of {result.count}")
    return 1 if result.differences else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
