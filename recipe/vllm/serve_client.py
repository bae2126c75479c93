"""Measures a running ``vllm serve``: greedy completions and, optionally, decode TPOT over HTTP.

Usage: python serve_client.py PORT OUT.json TPOT READY_S
  TPOT     batch sizes to time decode at, e.g. 1,8,32,128 ("" for none)
  READY_S  seconds from the server's start to /health 200 (written to OUT.json as ``ready_s``)

Writes OUT.json with ``ready_s``, ``tokens`` (32 prompts, 64 tokens, temperature 0, the token ids
when the server returns them), ``logprobs`` (each chosen token's log-probability) and, with TPOT,
``tpot_ms``: per batch size, the median over three rounds of (time of N concurrent requests of T+1
tokens - time of N requests of 1 token) / T, the decode step time without the prefill, HTTP
included; the samples in ``tpot_samples_ms``. With data
parallel the server spreads the N requests over its replicas, in every start alike.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

MODEL = "tiny"  # the recipe's --served-model-name
PROMPTS, TOKENS = 32, 64
TPOT_TOKENS, TPOT_REPS = 64, 3


def complete(base: str, prompt: str, max_tokens: int, logprobs: bool = False) -> dict:
    """One greedy /v1/completions request; its first choice (with each chosen token's
    log-probability when ``logprobs``)."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}
    if logprobs:
        body["logprobs"] = 0
    request = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.load(response)["choices"][0]


def greedy_outputs(base: str) -> dict:
    """The completions of the recipe's prompts, one request at a time (the order is the prompts'):
    ``tokens`` and ``logprobs``."""
    tokens, logprobs = [], []
    for i in range(PROMPTS):
        # Digits apart, as start.py's prompts: the tiny model's vocabulary knows 0-9, not "12".
        choice = complete(base, f"hello world the model number {' '.join(str(i))} said", TOKENS, logprobs=True)
        tokens.append(choice.get("token_ids") or choice["text"])
        logprobs.append((choice.get("logprobs") or {}).get("token_logprobs"))
    return {"tokens": tokens, "logprobs": logprobs}


def timed_batch(base: str, batch: int, max_tokens: int, pool: ThreadPoolExecutor) -> float:
    """Seconds for ``batch`` concurrent requests of ``max_tokens`` tokens, all answered."""
    start = time.perf_counter()
    list(pool.map(lambda i: complete(base, f"hello world the model number {1000 + i} said", max_tokens),
                  range(batch)))
    return time.perf_counter() - start


def tpot_samples_ms(base: str, batch: int, tokens: int, reps: int) -> list[float]:
    """Per round: the extra time ``tokens`` more decode steps take at this batch size, per step."""
    with ThreadPoolExecutor(max_workers=batch) as pool:
        timed_batch(base, batch, tokens + 1, pool)  # warm: the first batch of this size
        samples = []
        for _ in range(reps):
            first = timed_batch(base, batch, 1, pool)
            full = timed_batch(base, batch, tokens + 1, pool)
            samples.append((full - first) / tokens * 1e3)
    return samples


def measure(port: int, batches: list[int], ready_s: float) -> dict:
    base = f"http://127.0.0.1:{port}"
    result: dict = {"ready_s": ready_s, **greedy_outputs(base)}
    if batches:
        samples = {str(b): tpot_samples_ms(base, b, TPOT_TOKENS, TPOT_REPS) for b in batches}
        result["tpot_ms"] = {b: statistics.median(s) for b, s in samples.items()}
        result["tpot_samples_ms"] = samples
    return result


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    port, out, tpot, ready = int(argv[0]), argv[1], argv[2], float(argv[3])
    batches = [int(b) for b in tpot.split(",") if b.strip()]
    result = measure(port, batches, ready)
    with open(out, "w") as f:
        json.dump(result, f)
    shown = " ".join(f"b{b}={ms:.2f}ms" for b, ms in result.get("tpot_ms", {}).items())
    print(f"/health 200 after {ready:.1f} s; TPOT {shown or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
