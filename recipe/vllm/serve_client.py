"""Measures a running ``vllm serve``: greedy completions and, optionally, decode TPOT over HTTP.

Usage: python serve_client.py PORT OUT.json TPOT REPLICAS READY_S
  TPOT      batch sizes to time decode at, e.g. 1,8,32,128 ("" for none)
  REPLICAS  the server's data-parallel size (1: one engine)
  READY_S   seconds from the server's start to /health 200 (written to OUT.json as ``ready_s``)

Writes OUT.json with ``ready_s``, ``tokens`` (32 prompts, 64 tokens, temperature 0, the token ids
when the server returns them), ``logprobs`` (each chosen token's log-probability) and, with TPOT,
``tpot_ms``: per batch size, the median over three rounds of (time of N concurrent requests of T+1
tokens - time of N requests of 1 token) / T, the decode step time without the prefill, HTTP
included; the samples in ``tpot_samples_ms``. With REPLICAS > 1 the N requests go to one replica
at a time (vLLM's ``X-data-parallel-rank`` header), so that each replica decodes exactly N and its
step time is its own: ``tpot_ms_replica<R>`` and ``tpot_samples_ms_replica<R>`` per replica. (Left to
the server, N requests split unevenly between the replicas, differently in every round.)
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


def complete(base: str, prompt: str, max_tokens: int, logprobs: bool = False, replica: int | None = None) -> dict:
    """One greedy /v1/completions request; its first choice (with each chosen token's
    log-probability when ``logprobs``), on data-parallel replica ``replica`` when given."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}
    if logprobs:
        body["logprobs"] = 0
    headers = {"Content-Type": "application/json"}
    if replica is not None:
        headers["X-data-parallel-rank"] = str(replica)
    request = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(), headers)
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.load(response)["choices"][0]


def greedy_outputs(base: str, replicas: int = 1) -> dict:
    """The completions of the recipe's prompts, one request at a time (the order is the prompts'):
    ``tokens`` and ``logprobs``. With replicas, prompt i goes to replica i % replicas in every
    start, so each replica's outputs are compared with the same replica's."""
    tokens, logprobs = [], []
    for i in range(PROMPTS):
        # Digits apart, as start.py's prompts: the tiny model's vocabulary knows 0-9, not "12".
        choice = complete(base, f"hello world the model number {' '.join(str(i))} said", TOKENS, logprobs=True,
                          replica=i % replicas if replicas > 1 else None)
        tokens.append(choice.get("token_ids") or choice["text"])
        logprobs.append((choice.get("logprobs") or {}).get("token_logprobs"))
    return {"tokens": tokens, "logprobs": logprobs}


def timed_batch(base: str, batch: int, max_tokens: int, pool: ThreadPoolExecutor, replica: int | None = None) -> float:
    """Seconds for ``batch`` concurrent requests of ``max_tokens`` tokens, all answered."""
    start = time.perf_counter()
    list(pool.map(lambda i: complete(base, f"hello world the model number {1000 + i} said", max_tokens,
                                     replica=replica), range(batch)))
    return time.perf_counter() - start


def tpot_samples_ms(base: str, batch: int, tokens: int, reps: int, replica: int | None = None) -> list[float]:
    """Per round: the extra time ``tokens`` more decode steps take at this batch size, per step."""
    with ThreadPoolExecutor(max_workers=batch) as pool:
        timed_batch(base, batch, tokens + 1, pool, replica)  # warm: the first batch of this size
        samples = []
        for _ in range(reps):
            first = timed_batch(base, batch, 1, pool, replica)
            full = timed_batch(base, batch, tokens + 1, pool, replica)
            samples.append((full - first) / tokens * 1e3)
    return samples


def measure(port: int, batches: list[int], replicas: int, ready_s: float) -> dict:
    base = f"http://127.0.0.1:{port}"
    result: dict = {"ready_s": ready_s, **greedy_outputs(base, replicas)}
    targets = [(None, "")] if replicas == 1 else [(r, f"_replica{r}") for r in range(replicas)]
    for replica, suffix in targets if batches else []:
        samples = {str(b): tpot_samples_ms(base, b, TPOT_TOKENS, TPOT_REPS, replica) for b in batches}
        result["tpot_ms" + suffix] = {b: statistics.median(s) for b, s in samples.items()}
        result["tpot_samples_ms" + suffix] = samples
    return result


def tpot_line(result: dict) -> str:
    """The medians, e.g. ``b1=5.10ms`` or, per replica, ``replica0 b1=5.10ms``."""
    shown = []
    for key, per_batch in result.items():
        if key.startswith("tpot_ms"):
            label = key[len("tpot_ms_"):] + " " if key != "tpot_ms" else ""
            shown += [f"{label}b{b}={ms:.2f}ms" for b, ms in per_batch.items()]
    return " ".join(shown)


def main(argv: list[str]) -> int:
    if len(argv) != 5 or not argv[3].isdigit() or int(argv[3]) < 1:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    port, out, tpot, replicas, ready = int(argv[0]), argv[1], argv[2], int(argv[3]), float(argv[4])
    batches = [int(b) for b in tpot.split(",") if b.strip()]
    result = measure(port, batches, replicas, ready)
    with open(out, "w") as f:
        json.dump(result, f)
    print(f"/health 200 after {ready:.1f} s; TPOT {tpot_line(result) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
