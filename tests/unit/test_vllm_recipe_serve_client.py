"""recipe/vllm/serve_client.py against a stand-in server whose requests take a known time per token."""

import importlib.util
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "recipe" / "vllm" / "serve_client.py"
_spec = importlib.util.spec_from_file_location("vllm_recipe_serve_client", _PATH)
client = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(client)

PREFILL_S = 0.1  # each request sleeps this "prefill", plus per_token_s per generated token


class _Completions(BaseHTTPRequestHandler):
    requests: list[dict] = []
    per_token_s = 0.010
    in_flight = most_in_flight = 0
    lock = threading.Lock()

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body["replica header"] = self.headers.get("X-data-parallel-rank")  # kept for the assertions
        cls = type(self)
        with cls.lock:
            cls.requests.append(body)
            cls.in_flight += 1
            cls.most_in_flight = max(cls.most_in_flight, cls.in_flight)
        time.sleep(PREFILL_S + cls.per_token_s * body["max_tokens"])
        with cls.lock:
            cls.in_flight -= 1
        # Tokens that depend on the prompt, as a greedy model's would.
        seed = sum(body["prompt"].encode())
        tokens = [(seed + i) % 1000 for i in range(body["max_tokens"])]
        choice = {"text": "x", "token_ids": tokens}
        if body.get("logprobs") is not None:  # vLLM's completions API: the chosen tokens' log-probabilities
            choice["logprobs"] = {"token_logprobs": [-t / 997 for t in tokens]}
        data = json.dumps({"choices": [choice]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args):
        pass


@pytest.fixture
def server():
    _Completions.requests, _Completions.most_in_flight = [], 0
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Completions)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def test_tpot_is_the_extra_time_per_decode_step_without_the_prefill(monkeypatch):
    # Batches that take a fixed 100 ms "prefill" plus 50 ms per token: the prefill cancels out.
    # Dividing by the 2 tokens of the long requests would give 25 ms and leave the prefill in.
    monkeypatch.setattr(client, "timed_batch", lambda base, batch, max_tokens, pool, replica=None:
                        PREFILL_S + 0.050 * max_tokens)
    samples = client.tpot_samples_ms("http://127.0.0.1:9", batch=4, tokens=1, reps=3)
    assert samples == pytest.approx([50.0, 50.0, 50.0])


def test_tpot_rounds_send_short_and_long_greedy_batches_concurrently(server):
    client.tpot_samples_ms(f"http://127.0.0.1:{server}", batch=4, tokens=1, reps=3)
    assert _Completions.most_in_flight == 4  # each batch's requests at once: the engine decodes them together
    sent = _Completions.requests
    # warm (4 x 2 tokens), then per round 4 x 1 token and 4 x 2 tokens, all greedy.
    assert [r["max_tokens"] for r in sent].count(1) == 12
    assert [r["max_tokens"] for r in sent].count(2) == 16
    assert all(r["temperature"] == 0.0 and r["ignore_eos"] for r in sent)
    assert not any("logprobs" in r for r in sent)  # timed requests compute nothing extra


def _run_main(monkeypatch, out: Path, port: int, tpot: str, replicas: str, tokens: int, prompts: int) -> dict:
    """serve_client.main on a short run (few prompts and tokens, one round of 4 timed tokens)."""
    for name, value in (("TOKENS", tokens), ("PROMPTS", prompts), ("TPOT_TOKENS", 4), ("TPOT_REPS", 1)):
        monkeypatch.setattr(client, name, value)
    assert client.main([str(port), str(out), tpot, replicas, "12.5"]) == 0
    return json.loads(out.read_text())


def test_main_writes_tokens_ready_time_and_tpot(server, tmp_path, monkeypatch):
    result = _run_main(monkeypatch, tmp_path / "start.json", server, "1,2", "1", tokens=3, prompts=8)
    assert result["ready_s"] == 12.5
    assert len(result["tokens"]) == client.PROMPTS
    assert all(len(t) == 3 for t in result["tokens"])
    assert result["tokens"][0] != result["tokens"][1]  # each prompt's own completion, in order
    # Each chosen token's log-probability, in the order of its tokens.
    assert result["logprobs"] == [[-t / 997 for t in tokens] for tokens in result["tokens"]]
    completions = [r for r in _Completions.requests if r["max_tokens"] == 3]
    assert len(completions) == client.PROMPTS and all(r["logprobs"] == 0 for r in completions)
    assert all(r["replica header"] is None for r in _Completions.requests)  # one engine: no header
    assert set(result["tpot_ms"]) == {"1", "2"}
    assert all(ms > 0 for ms in result["tpot_ms"].values())


def test_main_without_tpot_writes_only_the_completions(server, tmp_path, monkeypatch):
    result = _run_main(monkeypatch, tmp_path / "start.json", server, "", "1", tokens=2, prompts=4)
    assert "tpot_ms" not in result and len(result["tokens"]) == client.PROMPTS


def test_main_with_replicas_times_each_replica_on_its_own(server, tmp_path, monkeypatch):
    result = _run_main(monkeypatch, tmp_path / "start.json", server, "2", "2", tokens=2, prompts=4)
    assert "tpot_ms" not in result  # left to the server, the split between replicas varies
    assert set(result["tpot_ms_replica0"]) == set(result["tpot_ms_replica1"]) == {"2"}
    sent = _Completions.requests
    completions = [r for r in sent if r.get("logprobs") == 0]
    assert [r["replica header"] for r in completions] == ["0", "1", "0", "1"]  # prompt i on replica i % 2
    timed = [r for r in sent if "logprobs" not in r]
    # warm, then one round of 1 and 5 tokens: 2 requests each, 6 per replica, each pinned.
    assert sorted(r["replica header"] for r in timed) == ["0"] * 6 + ["1"] * 6
    assert client.tpot_line(result).startswith("replica0 b2=")


@pytest.mark.parametrize("argv", [["8000", "out.json"], ["8000", "out.json", "1", "0", "3.0"],
                                  ["8000", "out.json", "1", "two", "3.0"]])
def test_main_with_missing_or_bad_arguments_prints_usage(capsys, argv):
    assert client.main(argv) == 2
    assert "REPLICAS" in capsys.readouterr().err
