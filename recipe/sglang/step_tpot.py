"""Decode TPOT from SGLang's own per-step log lines, added to a start's JSON.

Usage: python recipe/sglang/step_tpot.py SERVER_LOG RESULT_JSON BATCHES

With ``--decode-log-interval 1`` SGLang's scheduler logs every decode step as ``Decode batch,
#running-req: N, ..., gen throughput (token/s): T``, where T is the N tokens of that step over the
time since the previous step's line: N / T is the time of one decode step, measured inside the
scheduler, without the HTTP, tokenizer and detokenizer processes that the request-level TPOT
(``tpot_ms``) includes. For each batch size in BATCHES (e.g. 1,8,32,128) this writes the median
step time over the lines with exactly that many running requests to RESULT_JSON as
``step_tpot_ms`` (and the number of steps as ``step_tpot_steps``). The first step after a prefill
also spans the prefill; the median leaves those few out.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

LINE = re.compile(r"Decode batch[^,]*, #running-req: (\d+),.*gen throughput \(token/s\): ([0-9.]+)")


def step_times_ms(log_text: str) -> dict[int, list[float]]:
    """{running requests: [step time in ms, ...]} from every decode line with a throughput."""
    steps: dict[int, list[float]] = {}
    for m in LINE.finditer(log_text):
        running, throughput = int(m.group(1)), float(m.group(2))
        if throughput > 0:
            steps.setdefault(running, []).append(running / throughput * 1e3)
    return steps


def step_tpot(log_text: str, batches: list[int]) -> tuple[dict[str, float], dict[str, int]]:
    """({batch: median step ms}, {batch: steps seen}) for the batch sizes that have steps."""
    steps = step_times_ms(log_text)
    medians = {str(b): statistics.median(steps[b]) for b in batches if steps.get(b)}
    return medians, {str(b): len(steps[b]) for b in batches if steps.get(b)}


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    log, result, batches = Path(argv[0]), Path(argv[1]), [int(b) for b in argv[2].split(",") if b.strip()]
    data = json.loads(result.read_text())
    data["step_tpot_ms"], data["step_tpot_steps"] = step_tpot(log.read_text(errors="replace"), batches)
    result.write_text(json.dumps(data))
    shown = " ".join(f"b{b}={ms:.2f}ms" for b, ms in data["step_tpot_ms"].items())
    print(f"scheduler step time (median over each batch's decode steps): {shown or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
