"""recipe/vllm/start.py: decode step times from vLLM's engine loop, driven directly."""

import importlib.util
import sys
import statistics
import types
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "recipe" / "vllm" / "start.py"
_spec = importlib.util.spec_from_file_location("vllm_recipe_start", _PATH)
start = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(start)


class FakeEngine:
    """Each step() advances a fake clock by the next of `step_ms` (cycled) and returns one output
    per running request, `finished` on its last token. Requests added before a step's start join
    it; `late` of each round's requests join one step later (a prefill spread over two steps)."""

    def __init__(self, clock: list[float], step_ms: list[float], late: int = 0) -> None:
        self.clock, self.step_ms, self.late, self.steps = clock, step_ms, late, 0
        self.left: dict[str, int] = {}
        self.waiting: list[str] = []
        self.added: list[str] = []

    def add_request(self, request_id, prompt, params) -> None:
        assert request_id not in self.added, "request ids must be unique across rounds"
        assert params.output_kind == "DELTA", "every step must return each request's new token"
        self.added.append(request_id)
        target = self.waiting if len(self.waiting) < self.late else self.left
        if target is self.waiting:
            self.waiting.append(request_id)
        self.left[request_id] = params.max_tokens

    def has_unfinished_requests(self) -> bool:
        return bool(self.left)

    def step(self) -> list:
        self.clock[0] += self.step_ms[self.steps % len(self.step_ms)] / 1e3
        self.steps += 1
        running = [r for r in self.left if r not in self.waiting]
        self.waiting = []
        outputs = []
        for r in running:
            self.left[r] -= 1
            outputs.append(types.SimpleNamespace(finished=self.left[r] == 0))
        self.left = {r: n for r, n in self.left.items() if n > 0}
        return outputs


@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    sampling = types.ModuleType("vllm.sampling_params")
    sampling.RequestOutputKind = types.SimpleNamespace(DELTA="DELTA", CUMULATIVE="CUMULATIVE")
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sampling)
    clock = [100.0]
    monkeypatch.setattr(start.time, "perf_counter", lambda: clock[0])
    return clock


def test_step_times_are_the_intervals_between_whole_decode_steps(fake_vllm):
    # 11 steps a round (max_tokens 10 + 1): a 50 ms prefill, then 6 ms steps and one 40 ms hiccup.
    per_round = [50.0] + [6.0] * 6 + [40.0] + [6.0] * 3
    engine = FakeEngine(fake_vllm, per_round)
    times = start.step_times_ms(types.SimpleNamespace(llm_engine=engine), batch=4, tokens=10, reps=2)
    # Round 0 warms up; each timed round keeps the intervals between its 10 steps that returned a
    # token for all 4 requests and finished none (steps 1-10 of 11, the last finishes them all).
    assert len(times) == 2 * 9
    assert sorted(round(t, 6) for t in times[:9]) == [6.0] * 8 + [40.0]  # the 50 ms prefill is not an interval
    assert len(engine.added) == 3 * 4 and len(set(engine.added)) == 12
    assert statistics.median(times) == pytest.approx(6.0)  # the hiccup leaves the median where it is


def test_steps_that_decode_only_some_requests_do_not_count(fake_vllm):
    # One of the 4 requests joins a step late: the steps where it still prefills, and where the
    # other three finish before it, decode fewer than 4 requests and are left out.
    engine = FakeEngine(fake_vllm, [9.0, 7.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0], late=1)
    times = start.step_times_ms(types.SimpleNamespace(llm_engine=engine), batch=4, tokens=10, reps=1)
    assert times and all(round(t, 6) == 5.0 for t in times)
