"""recipe/vllm/start.py: decode step times from vLLM's engine loop, driven directly."""

import importlib.util
import sys
import types
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "recipe" / "vllm" / "start.py"
_spec = importlib.util.spec_from_file_location("vllm_recipe_start", _PATH)
start = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(start)


class FakeEngine:
    """Each step() advances a fake clock by the next of `step_ms` (cycled) and decodes one token
    for every running request; a request finishes after max_tokens steps."""

    def __init__(self, clock: list[float], step_ms: list[float]) -> None:
        self.clock, self.step_ms, self.steps = clock, step_ms, 0
        self.left: dict[str, int] = {}
        self.added: list[str] = []

    def add_request(self, request_id, prompt, params) -> None:
        assert request_id not in self.added, "request ids must be unique across rounds"
        self.added.append(request_id)
        self.left[request_id] = params.max_tokens

    def has_unfinished_requests(self) -> bool:
        return any(n > 0 for n in self.left.values())

    def step(self) -> list:
        self.clock[0] += self.step_ms[self.steps % len(self.step_ms)] / 1e3
        self.steps += 1
        self.left = {r: n - 1 for r, n in self.left.items() if n > 1}
        return []


@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    clock = [100.0]
    monkeypatch.setattr(start.time, "perf_counter", lambda: clock[0])
    return clock


def test_step_times_are_the_intervals_between_engine_steps(fake_vllm):
    # Step k of a round takes: 50 ms (prefill), 9 ms (first decode), then 6 ms, except one 40 ms hiccup.
    per_round = [50.0, 9.0] + [6.0] * 5 + [40.0] + [6.0] * 3  # 11 steps = max_tokens (10 + 1)
    engine = FakeEngine(fake_vllm, per_round)
    llm = types.SimpleNamespace(llm_engine=engine)
    times = start.step_times_ms(llm, batch=4, tokens=10, reps=2)
    # Round 0 warms up and is not timed; each timed round keeps its intervals 3..9 of 11 steps.
    assert len(times) == 2 * 7
    assert sorted(round(t, 6) for t in times[:7]) == [6.0] * 6 + [40.0]
    assert len(engine.added) == 3 * 4 and len(set(engine.added)) == 12
    import statistics

    assert statistics.median(times) == pytest.approx(6.0)  # the hiccup and the prefill leave it where it is
