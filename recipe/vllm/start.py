"""One offline vLLM start, measured: time to ready, greedy completions, decode TPOT.

Usage: python start.py MODEL_DIR OUT.json [--sizes "1 2 4 8"] [--eager | --no-compile] [--tpot 1,8,32,128 [--step-times]]
                       [--max-model-len 2048] [--gpu-memory-utilization 0.5]

Foundry is configured by the environment (FOUNDRY_ARCHIVE, FOUNDRY_MODE), as for any offline
``LLM(...)`` program. Writes OUT.json with:

- ``ready_s``: process start (the kernel's start time of this process) to ``LLM(...)`` returning,
  ``init_s``: the ``LLM(...)`` call alone;
- ``tokens``: greedy completions (temperature 0, ``--tokens`` tokens, ``--prompts`` prompts),
  ``logprobs``: each chosen token's log-probability;
- ``tpot_ms``: per batch size, the median over ``--reps`` of (time of a generate with N+1 tokens -
  time of one with 1 token) / N, i.e. the decode step time without the prefill; the samples
  themselves in ``tpot_samples_ms``;
- ``step_tpot_ms`` (with ``--step-times``): per batch size, the median time between consecutive
  engine steps while exactly that many requests decode (``LLMEngine.step()`` driven directly,
  ``--reps`` rounds of about ``--tpot-tokens`` steps pooled; ``step_tpot_steps``: how many). One slow step
  moves a difference of two generate calls by its whole delay but leaves a median of per-step
  times where it is, so this is the sharper measure when starts are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def process_start_time() -> float:
    """This process's start (wall clock), from /proc: includes the interpreter's start."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    start_ticks = int(fields[19])  # field 22: starttime, in clock ticks since boot
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return time.time() - uptime + start_ticks / os.sysconf("SC_CLK_TCK")


def load_format(model_dir: str) -> str:
    """The folder's weights where it has some (recipe/random_weights.py), else vLLM's dummy ones."""
    return "auto" if any(Path(model_dir).glob("*.safetensors")) else "dummy"


def prompts(n: int, offset: int = 0) -> list[str]:
    return [f"hello world the model number {i + offset} said" for i in range(n)]


def completion_prompts(n: int) -> list[str]:
    """The compared completions' prompts, digits apart: the tiny model's word-level vocabulary
    knows 0-9, not "12", so each prompt is its own."""
    return [f"hello world the model number {' '.join(str(i))} said" for i in range(n)]


def chosen_logprobs(completion) -> list[float]:
    """The log-probability of each token a completion chose (vLLM's ``logprobs=0``)."""
    return [step[token].logprob for token, step in zip(completion.token_ids, completion.logprobs)]


def tpot_samples_ms(llm, batch: int, tokens: int, reps: int) -> list[float]:
    from vllm import SamplingParams

    def timed_generate(max_tokens: int) -> float:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        start = time.perf_counter()
        llm.generate(prompts(batch, 1000), params, use_tqdm=False)
        return time.perf_counter() - start

    timed_generate(tokens + 1)  # warm: first use of this batch size
    samples = []
    for _ in range(reps):
        first = timed_generate(1)
        full = timed_generate(tokens + 1)
        samples.append((full - first) / tokens * 1e3)
    return samples


def step_times_ms(llm, batch: int, tokens: int, reps: int) -> list[float]:
    """Milliseconds between consecutive outputs of vLLM's engine while ``batch`` requests decode.

    Each ``step()`` returns once the engine core has sent the outputs of its next step, so the
    time between two returns is one step of the core's loop, scheduling and sampling included.
    An interval counts only when both steps around it returned a token for every one of the
    ``batch`` requests and finished none: steps that still prefill some requests, or that end
    some, are left out. About ``tokens`` intervals per round, ``reps`` rounds after a warm one."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    # DELTA: every step returns each request's new token, so a step shows which requests decoded.
    params = SamplingParams(max_tokens=tokens + 1, temperature=0.0, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)
    times: list[float] = []
    for rep in range(reps + 1):  # round 0 warms this batch size up
        for i, prompt in enumerate(prompts(batch, 2000)):
            engine.add_request(f"step-{batch}-{rep}-{i}", prompt, params)
        stamps, whole = [], []
        while engine.has_unfinished_requests():
            outputs = engine.step()
            stamps.append(time.perf_counter())
            whole.append(len(outputs) == batch and not any(o.finished for o in outputs))
        if rep:
            times += [(stamps[i] - stamps[i - 1]) * 1e3 for i in range(1, len(stamps)) if whole[i] and whole[i - 1]]
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--sizes", default="", help="CUDA-graph capture sizes (default: vLLM's)")
    parser.add_argument("--eager", action="store_true", help="enforce_eager (no torch.compile, no graphs)")
    parser.add_argument("--no-compile", action="store_true",
                        help="compilation mode NONE (-cc.mode=none): no torch.compile, decode graphs still captured")
    parser.add_argument("--tpot", default="", help="batch sizes to measure TPOT at, e.g. 1,8,32,128")
    parser.add_argument("--tpot-tokens", type=int, default=64)
    parser.add_argument("--step-times", action="store_true",
                        help="also the engine's per-step decode time at the --tpot batch sizes (step_tpot_ms)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    parser.add_argument("--num-gpu-blocks", type=int, default=None,
                        help="KV-cache blocks, overriding what the memory profile allows (num_gpu_blocks_override)")
    parser.add_argument("--cudagraph-mode", default="",
                        help="vLLM's CUDA-graph mode (default: vLLM's, FULL_AND_PIECEWISE; FULL_DECODE_ONLY with "
                             "--no-compile, where vLLM would capture no graphs)")
    parser.add_argument("--tp", type=int, default=1,
                        help="tensor parallel size (all-reduce through NCCL: custom all-reduce off in every start)")
    parser.add_argument("--ep", action="store_true",
                        help="expert parallel over the tensor-parallel group (a mixture-of-experts model)")
    args = parser.parse_args()

    t0 = time.time()
    from vllm import LLM, SamplingParams

    compilation: dict = {}
    if args.cudagraph_mode or args.no_compile:
        compilation["cudagraph_mode"] = args.cudagraph_mode or "FULL_DECODE_ONLY"
    if args.no_compile:
        compilation["mode"] = 0  # CompilationMode.NONE: the model runs eagerly, vLLM's custom ops
    if args.sizes:
        compilation["cudagraph_capture_sizes"] = [int(s) for s in args.sizes.split()]
    llm = LLM(model=args.model, load_format=load_format(args.model), attention_backend="FLASH_ATTN", seed=0,
              max_model_len=args.max_model_len, gpu_memory_utilization=args.gpu_memory_utilization,
              enforce_eager=args.eager, compilation_config=None if args.eager else compilation,
              tensor_parallel_size=args.tp, disable_custom_all_reduce=args.tp > 1, enable_expert_parallel=args.ep,
              num_gpu_blocks_override=args.num_gpu_blocks)
    ready = time.time()
    result: dict = {"ready_s": ready - process_start_time(), "init_s": ready - t0,
                    "foundry_mode": os.environ.get("FOUNDRY_MODE", "off"), "eager": args.eager,
                    "compile": not (args.eager or args.no_compile)}
    # logprobs=0: each chosen token's log-probability comes back with it (the sampler computes it
    # outside the graphs from all the logits they wrote), so a change in the logits shows.
    outs = llm.generate(completion_prompts(args.prompts), SamplingParams(max_tokens=args.tokens, temperature=0.0,
                                                              ignore_eos=True, logprobs=0), use_tqdm=False)
    result["tokens"] = [list(o.outputs[0].token_ids) for o in outs]
    result["logprobs"] = [chosen_logprobs(o.outputs[0]) for o in outs]
    samples = {b: tpot_samples_ms(llm, int(b), args.tpot_tokens, args.reps) for b in args.tpot.split(",") if b.strip()}
    result["tpot_ms"] = {b: statistics.median(s) for b, s in samples.items()}
    result["tpot_samples_ms"] = samples
    if args.step_times:
        try:
            steps = {b: step_times_ms(llm, int(b), args.tpot_tokens, args.reps) for b in samples}
            result["step_tpot_ms"] = {b: statistics.median(s) for b, s in steps.items() if s}
            result["step_tpot_steps"] = {b: len(s) for b, s in steps.items()}
        except Exception as exc:  # noqa: BLE001 - the start's other measurements stand without it
            result["step_tpot_error"] = f"{type(exc).__name__}: {exc}"
    with open(args.out, "w") as f:
        json.dump(result, f)
    tpot = " ".join(f"b{b}={ms:.2f}ms" for b, ms in result["tpot_ms"].items())
    step = " ".join(f"b{b}={ms:.3f}ms" for b, ms in result.get("step_tpot_ms", {}).items())
    print(f"ready {result['ready_s']:.1f} s (LLM() {result['init_s']:.1f} s), "
          f"{sum(map(len, result['tokens']))} tokens; TPOT {tpot or '-'}; step {step or '-'}", flush=True)


if __name__ == "__main__":
    main()
