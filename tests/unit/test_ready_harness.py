"""`foundry ready` run for real against a fake engine: a small Python server that writes vLLM's log
lines from two processes (a server and its engine core), keeps a compile cache, saves and loads an
"archive", and answers /health and /v1/completions over http.server after a delay. The harness's
process handling (its own group, stamped lines, SIGINT then SIGTERM), timing, kinds and files are
exercised on the CPU."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import socket
import sys
from pathlib import Path

import pytest

from foundry_core import cli
from foundry_core.ready import caches, engines, harness, kinds, logparse, report, server

FAKE_ENGINE = r'''
import http.server, json, os, signal, subprocess, sys, tempfile, time

args = sys.argv[1:]
def flag(name, default=None):
    return args[args.index(name) + 1] if name in args else default
model, port = args[0], int(flag("--port"))
archive, mode = flag("--foundry-archive"), flag("--foundry-mode")
delay = float(flag("--delay", "0.2"))
# Its own handler, as uvicorn installs one: a harness started in the background passes SIGINT ignored.
signal.signal(signal.SIGINT, signal.SIG_IGN if "--ignore-sigint" in args else signal.default_int_handler)
pids_dir = os.environ.get("FAKE_PIDS_DIR")
if pids_dir:
    open(os.path.join(pids_dir, str(os.getpid())), "w").close()
print("INFO 11-30 10:36:13 [__init__.py:246] Automatically detected platform cuda.")
pid = os.getpid()
if "--exit-early" in args:
    print("ValueError: the fake engine was told to fail")
    sys.exit(3)
for i in range(int(flag("--filler", "0"))):
    print(f"(APIServer pid={pid}) DEBUG filler line {i}")
    if i == int(flag("--warn-at", "-1")):
        print(f"(APIServer pid={pid}) WARNING 11-30 10:36:20 [host_caches.py:90] Foundry: 2 files in the "
              "Triton cache were not placed by it")
        print("Traceback (most recent call last):")
        print(f"(APIServer pid={pid}) INFO 11-30 10:36:20 [activation.py:40] vllm_foundry placed 3 cache files")
time.sleep(delay)
if flag("--run-compiler"):  # what a JIT build runs as a child (a copy of sleep, named as a compiler)
    subprocess.run([flag("--run-compiler"), "0.7"], check=True)
print(f"(APIServer pid={pid}) INFO 11-30 10:36:34 [api_utils.py:273] non-default args: {{'model': {model!r}}}")
cache = os.path.join(os.environ.get("VLLM_CACHE_ROOT") or os.path.expanduser("~/.cache/vllm"), "torch_compile_cache")
state = tempfile.mkdtemp()
worker = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN if os.environ.get("FAKE_IGNORE_SIGINT") else lambda *a: sys.exit(0))
cache, state, archive, mode, delay = sys.argv[1:6]
pid = os.getpid()
if os.environ.get("FAKE_PIDS_DIR"):
    open(os.path.join(os.environ["FAKE_PIDS_DIR"], str(pid)), "w").close()
p = f"(EngineCore pid={pid}) INFO 11-30 10:36:57"
print(f"{p} [core.py:115] Initializing a V1 LLM engine (v0.25.0) with config: model='fake'", flush=True)
hit = os.path.exists(os.path.join(cache, "model.bin"))
print(f"{p} [fake.py:1] compile cache {'hit' if hit else 'miss'} in {cache}", flush=True)
if not hit:
    os.makedirs(cache, exist_ok=True)
    open(os.path.join(cache, "model.bin"), "w").write("compiled")
time.sleep(float(delay))
if mode == "save":
    os.makedirs(archive)
    open(os.path.join(archive, "manifest.json"), "w").write("{}")
    print(f"{p} [capture_patches.py:155] foundry: captured 3 graphs in 0.05 s, saved in 0.01 s", flush=True)
elif mode == "load":
    if os.path.exists(os.path.join(archive, "manifest.json")):
        print(f"{p} [capture_patches.py:263] foundry: restored 3 graphs in 0.02 s (instantiate=eager; "
              "images 0.00 s) instead of capturing", flush=True)
    else:
        print(f"{p} [session.py:270] foundry: rank 0 cannot load the archive (no manifest); starting normally",
              flush=True)
if mode:
    print(f"{p} [worker.py:282] foundry: critical path in this process (rank 0): 0.050 s (archive check 0.020, "
          "images wait 0.030); overlapped, not in the total: images thread cpu 0.100", flush=True)
print(f"{p} [core.py:345] init engine (profile, create kv cache, warmup model) took 0.42 s", flush=True)
open(os.path.join(state, "ready"), "w").close()
while True:
    time.sleep(1)
"""
env = dict(os.environ, FAKE_IGNORE_SIGINT="1" if "--ignore-sigint" in args else "")
subprocess.Popen([sys.executable, "-c", worker, cache, state, archive or "", mode or "", str(delay)], env=env)
while not os.path.exists(os.path.join(state, "ready")):
    time.sleep(0.02)
if "--hang" in args:
    while True:
        time.sleep(1)
up = time.monotonic() + delay

class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        self.send_response(200 if self.path == "/health" and time.monotonic() > up else 503)
        self.end_headers()
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        out = json.dumps({"choices": [{"text": " fake " + str(body.get("max_tokens"))}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
print(f"(APIServer pid={pid}) INFO:     Application startup complete.", flush=True)
try:
    httpd.serve_forever()
except KeyboardInterrupt:
    print(f"(APIServer pid={pid}) INFO:     Shutting down", flush=True)
    if archive:  # Foundry's line of a process without a rank comes at its exit
        print(f"(APIServer pid={pid}) INFO foundry: critical path in this process: 0.075 s (restart 0.060, "
              "plugin import 0.015)", flush=True)
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """The fake engine's script, an empty host compile cache, and a folder its processes sign in."""
    script = tmp_path / "fake_engine.py"
    script.write_text(FAKE_ENGINE)
    host_cache = tmp_path / "host-vllm-cache"
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(host_cache))
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("FAKE_PIDS_DIR", str(pids))
    monkeypatch.setattr(harness, "GPU_WAIT_S", 5.0)
    monkeypatch.setattr(harness, "SAVE_SETTLE_S", 0.05)
    return {"script": script, "pids": pids, "model": tmp_path / "model", "host_cache": host_cache}


def _command(fake) -> str:
    return f"{{python}} {fake['script']} {{model}}"


@pytest.mark.parametrize("caches", ["host", "run"])
def test_a_run_of_every_kind_against_a_fake_engine(fake, tmp_path, caches):
    fake["model"].mkdir()
    results, work = tmp_path / "results", tmp_path / "work"
    code = cli.main(["ready", "vllm", str(fake["model"]), "--rounds", "2", "--results", str(results),
                     "--command", _command(fake), "--port", str(_free_port()), "--timeout", "60",
                     "--work", str(work), "--python", sys.executable, "--caches", caches, "--", "--delay", "0.25"])
    assert code == 0
    result = report.read(results / "ready-vllm.json")
    starts = result["starts"]

    # The compile cache was empty: one unrecorded unmodified start warmed it first.
    assert starts[0]["kind"] == "base-warm" and starts[0]["recorded"] is False
    recorded = [s for s in starts if s["recorded"]]
    assert [(s["round"], s["kind"]) for s in recorded] == [(r, k) for r in (1, 2) for k in kinds.KINDS]
    assert all(s["ok"] for s in starts), [s["error"] for s in starts]
    assert result["summary"]["load-cold"]["ok"] == 2

    for s in recorded:
        lines = logparse.read_stamped(results / s["log"])
        text = "\n".join(line for _, line in lines)
        if caches == "host":
            # Warm kinds found the host's compile cache, cold ones a fresh empty one of their own.
            if s["kind"] in kinds.COLD_KINDS:
                assert "compile cache miss" in text and str(fake["host_cache"]) not in text
                assert Path(s["env"]["VLLM_CACHE_ROOT"]).is_relative_to(work)
                assert s["archive"] is None or Path(s["archive"]).is_relative_to(work)
            else:
                assert f"compile cache hit in {fake['host_cache']}" in text
                assert "VLLM_CACHE_ROOT" not in s["env"]
        else:
            # Every kind at the run's own cache path; the cold ones found it empty, the warm ones
            # found what the warm-up (and not a cold start) left there.
            assert s["env"]["VLLM_CACHE_ROOT"] == starts[0]["env"]["VLLM_CACHE_ROOT"]
            assert Path(s["env"]["VLLM_CACHE_ROOT"]).is_relative_to(work)
            assert str(fake["host_cache"]) not in text
            cache_line = "compile cache miss" if s["kind"] in kinds.COLD_KINDS else "compile cache hit in"
            assert cache_line in text, s["kind"]
        expected = {"save": "saved", "load-warm": "restored", "load-cold": "restored"}.get(s["kind"], "-")
        assert s["foundry"] == expected, s["kind"]
        p = s["phases"]
        times = [p[name] for name in engines.PHASES]
        assert times == sorted(times) and times[0] > 0, p
        assert p["worker_first_line"] - p["first_line"] >= 0.25  # the fake sleeps before it starts its core
        assert p["health"] - p["engine_init_end"] >= 0.25  # /health answers 503 for --delay after init
        assert s["durations"]["init_engine_s"] == 0.42
        assert s["markers"]["app_startup_complete"] <= p["health"]
        assert s["completion_text"] == " fake 8"
        assert s["stopped_by"] == "SIGINT" and s["port_free"] is True
        if s["kind"] in ("save", "load-warm", "load-cold"):
            # The API server's exit line and the engine core's, as one critical path.
            assert s["foundry_critical_s"] == pytest.approx(0.125) and s["foundry_critical_lines"] == 2
            assert s["foundry_critical"] == pytest.approx({"archive check": 0.02, "images wait": 0.03,
                                                           "restart": 0.06, "plugin import": 0.015})
            assert s["foundry_overlapped"] == pytest.approx({"images thread cpu": 0.1})
        else:
            assert s["foundry_critical_s"] is None and s["foundry_critical"] == {}
        assert "Shutting down" in text  # SIGINT let the server stop cleanly; its last lines were read

    # Each LOAD read the archive of the SAVE just before it.
    for r in (1, 2):
        save, *loads = [s for s in recorded if s["round"] == r and s["kind"] in ("save", "load-warm", "load-cold")]
        assert all(load["archive"] == save["archive"] for load in loads)
    critical = result["summary"]["load-warm"]["foundry_critical_s"]
    assert critical["median"] == pytest.approx(0.125) and critical["n"] == 2
    assert result["summary"]["base-warm"]["foundry_critical_s"] is None
    assert list(work.iterdir()) == []  # the run's archives and cold caches removed at the end
    # Every process the fake started, engine cores included, is gone.
    assert [p for p in os.listdir(fake["pids"]) if _alive(int(p))] == []
    assert result["environment"]["foundry_core_version"]
    if importlib.util.find_spec("matplotlib") is not None:
        assert (results / "ready-vllm.png").stat().st_size > 10_000


def test_a_server_that_ignores_sigint_is_stopped_by_sigterm(fake, tmp_path, monkeypatch):
    monkeypatch.setattr(server, "STOP_SIGNALS", ((signal.SIGINT, 1.0), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)))
    spec = kinds.ServerSpec(engines.VLLM, str(fake["model"]), sys.executable, ("--delay", "0", "--ignore-sigint"),
                            _free_port(), _command(fake))
    result = harness.Run(harness.Options(spec, ("base-warm",), 1, tmp_path / "r", warm_up="never")).execute()
    (start,) = result["starts"]
    assert start["ok"] and start["stopped_by"] == "SIGTERM"
    assert [p for p in os.listdir(fake["pids"]) if _alive(int(p))] == []


def test_a_server_that_exits_is_a_failed_start_and_the_run_goes_on(fake, tmp_path):
    spec = kinds.ServerSpec(engines.VLLM, str(fake["model"]), sys.executable, ("--exit-early",), _free_port(),
                            _command(fake))
    lines: list[str] = []
    result = harness.Run(harness.Options(spec, ("base-warm", "base-cold"), 1, tmp_path / "r", warm_up="never"),
                         progress=lines.append).execute()
    assert [s["ok"] for s in result["starts"]] == [False, False]
    assert "exited before /health answered 200" in result["starts"][0]["error"]
    assert "(exit status 3)" in result["starts"][0]["error"]
    assert result["starts"][0]["phases"]["first_line"] is not None  # its log was still read
    assert result["summary"]["base-warm"] == {"starts": 1, "ok": 0, "phases": {}, "durations": {}, "foundry": {},
                                              "foundry_critical_s": None, "foundry_critical": {},
                                              "foundry_overlapped": {}}
    assert "FAILED" in lines[0] and "logs/01-r1-base-warm.log" in lines[0]


def test_a_start_that_never_answers_times_out_and_is_stopped(fake, tmp_path):
    spec = kinds.ServerSpec(engines.VLLM, str(fake["model"]), sys.executable, ("--delay", "0", "--hang"),
                            _free_port(), _command(fake))
    result = harness.Run(harness.Options(spec, ("base-warm",), 1, tmp_path / "r", timeout_s=2.0,
                                         warm_up="never")).execute()
    (start,) = result["starts"]
    assert not start["ok"] and start["error"].startswith("timed out waiting for /health 200")
    assert start["phases"]["engine_init_end"] is not None and start["phases"]["health"] is None
    assert [p for p in os.listdir(fake["pids"]) if _alive(int(p))] == []


def test_load_without_a_save_that_reached_ready_is_not_started(fake, tmp_path):
    spec = kinds.ServerSpec(engines.VLLM, str(fake["model"]), sys.executable, ("--exit-early",), _free_port(),
                            _command(fake))
    result = harness.Run(harness.Options(spec, ("save", "load-warm"), 1, tmp_path / "r", warm_up="never")).execute()
    save, load = result["starts"]
    assert not save["ok"]
    assert load["error"] == "no archive to load: no SAVE start has reached ready yet"
    assert "command" not in load  # nothing was started


def test_keep_logs_tail_keeps_the_marker_lines_and_the_last_lines(fake, tmp_path):
    spec = kinds.ServerSpec(engines.VLLM, str(fake["model"]), sys.executable,
                            ("--delay", "0.05", "--filler", "600", "--warn-at", "300"), _free_port(), _command(fake))
    options = harness.Options(spec, ("base-warm",), 1, tmp_path / "r", keep_logs="tail", warm_up="never")
    result = harness.Run(options).execute()
    (start,) = result["starts"]
    assert start["ok"] and start["log_lines"] > 600
    kept = logparse.read_stamped(tmp_path / "r" / start["log"])
    text = [line for _, line in kept]
    assert len(kept) <= harness.TAIL_LINES + 10
    assert "Automatically detected platform cuda" in text[0]  # the first line marks a phase: kept
    assert any("non-default args" in line for line in text)
    assert "filler line 0" not in " ".join(text)
    # From the middle of the log, far from its tail: Foundry's lines, its warning and a traceback.
    assert any("WARNING" in line and "Foundry: 2 files in the Triton cache" in line for line in text)
    assert "Traceback (most recent call last):" in text
    assert any("vllm_foundry placed 3 cache files" in line for line in text)
    assert not any(f"filler line {i}" in line for line in text for i in (299, 301))
    assert "Shutting down" in text[-1]
    assert [t for t, _ in kept] == sorted(t for t, _ in kept)


def test_a_port_in_use_is_refused_before_anything_starts(fake, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        spec = kinds.ServerSpec(engines.VLLM, str(fake["model"]), sys.executable, (), busy.getsockname()[1],
                                _command(fake))
        with pytest.raises(ValueError, match="is in use"):
            harness.Run(harness.Options(spec, ("base-warm",), 1, tmp_path / "r")).execute()
    assert not (tmp_path / "r").exists()


def test_the_result_file_is_written_after_every_start(fake, tmp_path, monkeypatch):
    spec = kinds.ServerSpec(engines.VLLM, str(fake["model"]), sys.executable, ("--exit-early",), _free_port(),
                            _command(fake))
    seen: list[int] = []
    run = harness.Run(harness.Options(spec, ("base-warm", "base-cold"), 1, tmp_path / "r", warm_up="never"),
                      progress=lambda line: seen.append(len(json.loads(run.path.read_text())["starts"])
                                                        if run.path.exists() else 0))
    run.execute()
    assert seen == [0, 1]  # the first start's line comes before its record; the second's after the first's


@pytest.mark.parametrize("caches_option", ["host", "run"])
def test_a_cold_start_records_what_its_caches_held_and_a_warm_one_does_not(fake, tmp_path, caches_option):
    spec = kinds.ServerSpec(engines.VLLM, str(fake["model"]), sys.executable, ("--delay", "0"), _free_port(),
                            _command(fake))
    options = harness.Options(spec, ("base-warm", "base-cold"), 1, tmp_path / "r", warm_up="never",
                              work=tmp_path / "work", caches=caches_option)
    warm, cold = harness.Run(options).execute()["starts"]
    assert warm["ok"] and cold["ok"]
    assert "caches_after" not in warm
    after = cold["caches_after"]
    assert list(after) == [var.name for var in caches.CACHE_VARIABLES]
    # Read before the directories were emptied (run) or removed (host): what the cold start compiled.
    assert after["VLLM_CACHE_ROOT"] == {"files": 1, "bytes": len("compiled"), "top": ["torch_compile_cache"]}
    assert all(v["files"] == 0 for name, v in after.items() if name != "VLLM_CACHE_ROOT")
    assert report.read(tmp_path / "r" / "ready-vllm.json")["starts"][1]["caches_after"] == after
    assert list((tmp_path / "work").iterdir()) == []


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_inventory_counts_files_and_bytes_below_each_variables_directory(tmp_path):
    triton = _tree(tmp_path / "home" / "triton", {"abc/kernel.cubin": "x" * 10, "abc/kernel.json": "{}",
                                                  "def/other.so": "y" * 100})
    outside = _tree(tmp_path / "outside", {"big.bin": "z" * 1000})
    (triton / "linked-dir").symlink_to(outside)
    (triton / "linked-file").symlink_to(outside / "big.bin")
    env = {"TRITON_CACHE_DIR": str(triton), "HOME": str(tmp_path / "home"),
           "VLLM_CACHE_ROOT": str(tmp_path / "gone"), "TVM_FFI_CACHE_DIR": None, "PATH": "/usr/bin"}
    listed = caches.inventory(env)
    # Links are listed but not followed, nor counted; unset variables and other variables are left out.
    assert listed["TRITON_CACHE_DIR"] == {"files": 3, "bytes": 112,
                                          "top": ["abc", "def", "linked-dir", "linked-file"]}
    # A directory inside another listed one counts in both.
    assert listed["HOME"] == {"files": 3, "bytes": 112, "top": ["triton"]}
    assert listed["VLLM_CACHE_ROOT"] == {"files": 0, "bytes": 0, "top": [], "missing": True}
    assert list(listed) == ["VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "HOME"]  # CACHE_VARIABLES' order


def test_inventory_lists_the_first_names_only(tmp_path):
    root = _tree(tmp_path / "c", {f"f{i:02d}": "" for i in range(caches.TOP_ENTRIES + 5)})
    listed = caches.inventory({"CUDA_CACHE_PATH": str(root)})["CUDA_CACHE_PATH"]
    assert listed["files"] == caches.TOP_ENTRIES + 5 and listed["bytes"] == 0
    assert listed["top"] == [f"f{i:02d}" for i in range(caches.TOP_ENTRIES)]


def test_inventory_skips_what_it_cannot_read(tmp_path, monkeypatch):
    root = _tree(tmp_path / "c", {"ok/a": "aaa", "locked/b": "bbbb"})
    other = _tree(tmp_path / "d", {"x": "x"})
    real_scandir = os.scandir

    def scandir(path):
        if Path(path).name in ("locked", "d"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)  # as root, chmod would not stop the walk
    listed = caches.inventory({"SGLANG_CACHE_DIR": str(root), "SGLANG_DG_CACHE_DIR": str(other)})
    assert listed["SGLANG_CACHE_DIR"] == {"files": 1, "bytes": 3, "top": ["locked", "ok"], "unreadable": 1}
    assert listed["SGLANG_DG_CACHE_DIR"] == {"files": 0, "bytes": 0, "top": [], "unreadable": 1}


def test_inventory_names_the_files_a_cold_start_wrote_that_the_archive_does_not_carry(tmp_path):
    archive = tmp_path / "archive"
    (archive / "rank0").mkdir(parents=True)
    (archive / "rank0" / "host_caches.json").write_text(json.dumps({"format": "x", "version": 1, "caches": {
        "triton": {"abc/kernel.cubin": {}, "abc/__grp__kernel.json": {}},
        "tvm-ffi": {"sgl/act/act.so": {}},
        "vllm": {"torch_compile_cache/h1/rank_0_0/backbone/computation_graph.py": {}}}}))
    carried = caches.carried_paths(archive)
    assert ("abc", "kernel.cubin") in carried and ("sgl", "act", "act.so") in carried
    triton = _tree(tmp_path / "triton", {"abc/kernel.cubin": "x", "abc/__grp__kernel.json": "{}",
                                         "new/__triton_launcher.so": "so", "new/other.json": "{}",
                                         "tmp.pid_7_x/partial.cubin": "", "lock": ""})
    tvm = _tree(tmp_path / "tvm", {"cache/sgl/act/act.so": "so", "cache/sgl/act/act.so.lock": ""})  # another root
    # vLLM compiled again under another hash: same last names, another path
    vllm = _tree(tmp_path / "vllm", {"torch_compile_cache/h2/rank_0_0/backbone/computation_graph.py": ""})
    env = {"TRITON_CACHE_DIR": str(triton), "TVM_FFI_CACHE_DIR": str(tvm), "VLLM_CACHE_ROOT": str(vllm)}
    listed = caches.inventory(env, carried)
    assert listed["TRITON_CACHE_DIR"]["not_carried"] == 2  # a lock and a writer's temporary are never carried
    assert listed["TRITON_CACHE_DIR"]["not_carried_paths"] == ["new/__triton_launcher.so", "new/other.json"]
    assert listed["TVM_FFI_CACHE_DIR"]["not_carried"] == 0 and listed["TVM_FFI_CACHE_DIR"]["files"] == 2
    assert listed["VLLM_CACHE_ROOT"]["not_carried_paths"] == ["torch_compile_cache/h2/rank_0_0/backbone/computation_graph.py"]
    assert "not_carried" not in caches.inventory({"TRITON_CACHE_DIR": str(triton)})["TRITON_CACHE_DIR"]


def test_an_archive_without_carried_caches_compares_nothing(tmp_path):
    assert caches.carried_paths(None) is None
    assert caches.carried_paths(tmp_path) is None  # no rank lists a file
    (tmp_path / "rank0").mkdir()
    (tmp_path / "rank0" / "host_caches.json").write_text("not json")
    assert caches.carried_paths(tmp_path) is None


def test_a_save_start_serves_on_for_a_while_after_its_first_completion(fake, tmp_path, monkeypatch):
    # SAVE keeps carrying the compile caches its first requests used; stopped at once, it would not.
    monkeypatch.setattr(harness, "SAVE_SETTLE_S", 0.5)
    fake["model"].mkdir()
    spec = kinds.ServerSpec(engines.VLLM, str(fake["model"]), sys.executable, ("--delay", "0"), _free_port(),
                            _command(fake))
    base, save = harness.Run(harness.Options(spec, ("base-warm", "save"), 1, tmp_path / "r", warm_up="never",
                                             work=tmp_path / "work")).execute()["starts"]
    assert base["ok"] and save["ok"]
    assert "settled_s" not in base and save["settled_s"] == 0.5
    assert save["wall_s"] - save["phases"]["first_completion"] >= 0.5


def test_the_compilers_a_start_runs_are_recorded_and_reported(fake, tmp_path):
    compiler = tmp_path / "bin" / "ptxas"
    compiler.parent.mkdir()
    shutil.copy(shutil.which("sleep"), compiler)
    spec = kinds.ServerSpec(engines.VLLM, str(fake["model"]), sys.executable, ("--delay", "0"), _free_port(),
                            _command(fake))
    compiling = dataclasses.replace(spec, extra_args=("--delay", "0", "--run-compiler", str(compiler)))
    base = harness.Run(harness.Options(spec, ("base-warm",), 1, tmp_path / "a", warm_up="never")).execute()
    built = harness.Run(harness.Options(compiling, ("base-warm",), 1, tmp_path / "b", warm_up="never")).execute()
    assert base["starts"][0]["compilers"] == []
    assert built["starts"][0]["compilers"] == [f"{compiler} 0.7"]
    assert report.compiled(built) == ["round 1 base-warm ran 1 compiler processes: ptxas (1)"]
    assert report.compiled(base) == []
