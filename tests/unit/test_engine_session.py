"""foundry_core.engine.session: SAVE/LOAD lifecycle and the fallback policy, with a fake region
runtime and stand-ins for save_graphs / load_graphs (no GPU)."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import pytest

from test_engine_support import REGION_BASE, FakeAdapter, FakeGraphIO, FakeRuntime, adapter_fingerprint, write_archive

from foundry_core.engine.layout import Topology, rank_dir, read_topology
from foundry_core.engine.mode import Mode
from foundry_core.engine.plugin_manager import get_plugin_manager
from foundry_core.engine.session import DEFAULT_REGION_SIZE, DEFAULT_SCRATCH_SIZE, EngineSession, fallback_enabled
from foundry_core.engine.state import STATE_NAME, read_state
from foundry_core.manifest import MANIFEST_NAME, read_manifest, write_manifest
from foundry_core.errors import (
    AuditError,
    CudaError,
    DivergenceError,
    FormatError,
    InvalidArgumentError,
    MismatchError,
    NotFoundError,
    StateError,
)

GRAPHS = {"bs=1": ("graph-1", None), "bs=2": ("graph-2", None)}
NO_ENV: dict[str, str] = {}


@pytest.fixture
def io(monkeypatch):
    return FakeGraphIO().install(monkeypatch)


@pytest.fixture
def archive(tmp_path):
    return tmp_path / "archive"


def make(archive, requested="auto", rank=0, adapter=None, runtime=None, environ=NO_ENV, **kwargs):
    adapter = adapter or FakeAdapter()
    session = EngineSession(archive, requested, rank, get_plugin_manager(adapter), runtime=runtime or FakeRuntime(),
                            environ=environ, **kwargs)
    return session, adapter


def run_save(archive, adapter=None, rank=0, prefix=64 << 20):
    """A SAVE start as a plugin drives it; returns the session and its runtime."""
    runtime = FakeRuntime()
    session, _ = make(archive, "auto", rank, adapter, runtime)
    assert session.mode is Mode.SAVE
    session.begin()
    runtime.allocate(prefix)          # NCCL bring-up
    session.determinism_boundary()
    runtime.allocate(10 << 30)        # weights, KV, capture
    assert session.load() is None
    assert session.save(GRAPHS) is not None
    session.end()
    return session, runtime


def fallback_lines(caplog, level):
    return [r for r in caplog.records if r.name == "foundry" and r.levelno == level and "archive" in r.getMessage()]


# ---- off ------------------------------------------------------------------------------------

@pytest.mark.parametrize("archive_arg,requested", [(None, "auto"), (None, "off"), ("x", "off")])
def test_off_does_nothing(tmp_path, io, archive_arg, requested):
    runtime = FakeRuntime()
    session, adapter = make(tmp_path / archive_arg if archive_arg else None, requested, runtime=runtime)
    assert session.mode is Mode.OFF
    session.begin()
    assert session.determinism_boundary() is None
    assert session.load() is None and session.recorded_state() is None
    session.end()
    assert runtime.calls == [] and io.saved == [] and adapter.fallbacks == []
    with pytest.raises(StateError, match="mode off"):
        session.save(GRAPHS)


def test_off_does_not_query_the_adapter(tmp_path):
    class Broken:
        def foundry_engine_identity(self):
            raise AssertionError("queried")

    pm = get_plugin_manager(Broken(), require=False)
    assert EngineSession(tmp_path, "off", 0, pm, runtime=FakeRuntime()).mode is Mode.OFF


def test_explicit_mode_without_archive_is_an_error():
    with pytest.raises(InvalidArgumentError, match="needs an archive"):
        make(None, "load")


# ---- SAVE then LOAD ---------------------------------------------------------------------------

def test_missing_archive_means_save(archive, io, caplog):
    caplog.set_level(logging.INFO, logger="foundry")
    session, adapter = make(archive)
    assert session.mode is Mode.SAVE and session.fallback_reason is None
    assert adapter.fallbacks == []
    assert any("no archive for rank 0" in r.getMessage() and r.levelno == logging.INFO for r in caplog.records)


def test_save_writes_rank_archive_state_and_topology(archive, io):
    session, runtime = run_save(archive)
    assert runtime.calls[0] == ("set_region", REGION_BASE, DEFAULT_REGION_SIZE)
    assert runtime.calls[1] == ("seal", DEFAULT_SCRATCH_SIZE)  # max(4 GiB, 2 * 64 MiB)
    assert runtime.calls[-1] == ("stop",)
    directory, graphs, fingerprint = io.saved[0]
    assert directory == archive / "rank0" and graphs == GRAPHS
    assert fingerprint == adapter_fingerprint(FakeAdapter())
    state = read_state(archive / "rank0")
    assert (state.kv_cache_bytes, state.kv_cache_blocks) == (8 << 30, 4096)
    assert (state.region_base, state.region_size, state.scratch_boundary) == (REGION_BASE, DEFAULT_REGION_SIZE,
                                                                            DEFAULT_SCRATCH_SIZE)
    assert state.region_high_water == DEFAULT_SCRATCH_SIZE + (10 << 30)
    assert state.capture_sizes == (1, 2, 4, 8) and state.adapter == {"block_size": 16}
    assert read_topology(archive) == Topology("fakeengine", "1.2.3", 1)


def test_next_start_loads_with_the_recorded_state(archive, io):
    run_save(archive)
    runtime = FakeRuntime()
    session, adapter = make(archive, runtime=runtime)
    assert session.mode is Mode.LOAD
    session.begin()
    assert runtime.calls[0] == ("set_region", REGION_BASE, DEFAULT_REGION_SIZE)
    runtime.allocate(100 << 20)  # a bigger NCCL prefix than SAVE's still fits under the boundary
    assert session.determinism_boundary() == DEFAULT_SCRATCH_SIZE
    assert session.recorded_state().kv_cache_bytes == 8 << 30
    restored = session.load(instantiate="lazy", defer=str.isupper)
    assert restored == ["restored", "restored"]
    assert io.loaded[0][1:] == ("lazy", session.fingerprint, str.isupper)
    with pytest.raises(StateError, match="mode load"):
        session.save(GRAPHS)
    assert adapter.fallbacks == []


def test_a_load_reads_its_manifest_and_state_once(archive, io, monkeypatch):
    from foundry_core import manifest
    from foundry_core.engine import state

    run_save(archive)
    reads: list[str] = []
    for module, name in ((manifest, "read_archive_file"), (state, "read_json_file")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda path, *a, _real=real: (reads.append(Path(path).name), _real(path, *a))[1])
    session, _ = make(archive)
    assert session.mode is Mode.LOAD  # on the start's critical path: each file parsed once
    assert sorted(reads) == ["engine_state.json", "manifest.json"]
    assert session.recorded_state().kv_cache_bytes == 8 << 30
    session.begin()
    assert session.load() == ["restored", "restored"]
    assert sorted(reads) == ["engine_state.json", "manifest.json"]  # the restore used the checked manifest
    assert io.known[0].manifest["fingerprint"] == read_manifest(archive / "rank0" / MANIFEST_NAME)["fingerprint"]


def test_a_manifest_replaced_after_the_check_is_read_again(archive, io):
    run_save(archive)
    session, _ = make(archive)
    assert session.mode is Mode.LOAD
    path = archive / "rank0" / MANIFEST_NAME
    known = session._known
    assert known is not None and known.current(path) is not None
    doc = read_manifest(path)
    doc["graphs"] = doc["graphs"][:1]
    write_manifest(path, doc)  # as a new SAVE writes it: a new file renamed into place
    assert known.current(path) is None and known.current(archive / "elsewhere.json") is None
    session.begin()
    assert session.load() == ["restored"]  # what the file holds now, not what the check read


def test_a_manifest_swapped_for_a_link_to_itself_is_read_again(archive, io):
    """The check read a plain file; a symbolic link put in its place (even to the same file) is
    not that file: the restore reads the manifest again (and read_manifest refuses a link)."""
    run_save(archive)
    session, _ = make(archive)
    path = archive / "rank0" / MANIFEST_NAME
    known = session._known
    kept = path.with_name("kept.json")
    path.rename(kept)
    path.symlink_to(kept.name)
    assert known.current(path) is None


def test_load_uses_the_archive_region_not_the_configured_one(archive, io):
    run_save(archive)
    runtime = FakeRuntime()
    session, _ = make(archive, runtime=runtime, region_base="0x7000_0000_0000".replace("_", ""), region_size="1TiB")
    session.begin()
    assert runtime.calls[0] == ("set_region", REGION_BASE, DEFAULT_REGION_SIZE)


def test_region_settings_from_the_environment(archive, io):
    runtime = FakeRuntime()
    env = {"FOUNDRY_REGION_BASE": "0x700000000000", "FOUNDRY_REGION_SIZE": "64GiB", "FOUNDRY_SCRATCH_SIZE": "1GiB"}
    session, _ = make(archive, runtime=runtime, environ=env)
    session.begin()
    runtime.allocate(600 << 20)
    assert session.determinism_boundary() == 1200 << 20  # 2 * cursor, 2 MiB aligned
    assert runtime.calls[0] == ("set_region", 0x7000_0000_0000, 64 << 30)


def test_bad_region_setting_names_the_variable(archive):
    with pytest.raises(InvalidArgumentError, match="FOUNDRY_REGION_SIZE"):
        make(archive, environ={"FOUNDRY_REGION_SIZE": "lots"})


def test_boundary_that_does_not_fit_the_region(archive, io):
    session, _ = make(archive, region_size="2GiB")
    session.begin()
    with pytest.raises(StateError, match="FOUNDRY_REGION_SIZE"):
        session.determinism_boundary()


def test_lifecycle_order_is_enforced(archive, io):
    session, _ = make(archive)
    with pytest.raises(StateError, match="begin"):
        session.determinism_boundary()
    session.begin()
    with pytest.raises(StateError, match="already"):
        session.begin()
    with pytest.raises(StateError, match="determinism_boundary"):
        session.save(GRAPHS)


def test_context_manager_sets_and_stops_the_region(archive, io):
    runtime = FakeRuntime()
    session, _ = make(archive, runtime=runtime)
    with session:
        assert runtime.active
    assert not runtime.active


# ---- fallback: stale archives ------------------------------------------------------------------

def test_stale_fingerprint_in_auto_resaves_naming_the_field(archive, io, caplog):
    run_save(archive)
    adapter = FakeAdapter(knobs={"cudagraph_mode": "PIECEWISE"})
    session, _ = make(archive, adapter=adapter)
    assert session.mode is Mode.SAVE
    assert "engine.knob.cudagraph_mode: saved 'FULL_DECODE_ONLY', now 'PIECEWISE'" in session.fallback_reason
    lines = fallback_lines(caplog, logging.WARNING)
    assert len(lines) == 1 and "engine.knob.cudagraph_mode" in lines[0].getMessage()
    assert "saving a fresh one" in lines[0].getMessage()
    assert adapter.fallbacks == [(session.fallback_reason, Mode.SAVE)]
    assert session.recorded_state() is None
    session.begin()
    session.determinism_boundary()
    session.save(GRAPHS)
    assert make(archive, adapter=adapter)[0].mode is Mode.LOAD


def test_engine_upgraded_under_the_archive_is_refused_naming_the_version(archive, io, caplog):
    # A fleet upgrades the engine below an archive: LOAD must not use graphs of another release.
    run_save(archive)
    session, _ = make(archive, "load", adapter=FakeAdapter(identity=("fakeengine", "1.3.0")))
    assert session.mode is Mode.OFF
    assert "engine_version '1.2.3' vs '1.3.0'" in session.fallback_reason
    assert "this engine runs fakeengine 1.3.0" in session.fallback_reason


def test_stale_fingerprint_in_explicit_load_starts_normally_and_keeps_the_archive(archive, io, caplog):
    run_save(archive)
    before = (archive / "rank0" / "manifest.json").read_text()
    adapter = FakeAdapter(model={"architecture": "Llama"})
    session, _ = make(archive, "load", adapter=adapter)
    assert session.mode is Mode.OFF
    lines = fallback_lines(caplog, logging.ERROR)
    assert len(lines) == 1 and "engine.model_hash" in lines[0].getMessage()
    assert "FOUNDRY_FALLBACK=0" in lines[0].getMessage()
    assert adapter.fallbacks[0][1] is Mode.OFF
    session.begin()
    assert session.load() is None
    assert (archive / "rank0" / "manifest.json").read_text() == before


@pytest.mark.parametrize("requested", ["auto", "load"])
def test_fallback_disabled_raises_the_cause(archive, io, requested):
    run_save(archive)
    with pytest.raises(MismatchError) as info:
        make(archive, requested, adapter=FakeAdapter(sizes=[1, 2]), environ={"FOUNDRY_FALLBACK": "0"})
    assert "engine.capture_sizes" in str(info.value) and "FOUNDRY_FALLBACK=0" in str(info.value)


def test_fallback_disabled_by_argument(archive, io):
    run_save(archive)
    with pytest.raises(MismatchError):
        make(archive, adapter=FakeAdapter(dtype="float16"), fallback=False)


def test_explicit_load_of_missing_archive_falls_back_or_raises(archive, io, caplog):
    session, adapter = make(archive, "load")
    assert session.mode is Mode.OFF and "no archive at" in session.fallback_reason
    assert len(fallback_lines(caplog, logging.ERROR)) == 1
    with pytest.raises(NotFoundError):
        make(archive, "load", environ={"FOUNDRY_FALLBACK": "no"})


def test_topology_change_resaves_naming_both_sides(archive, io, caplog):
    write_archive(archive, Topology("fakeengine", "1.2.3", 2, tp=2),
                  [adapter_fingerprint(FakeAdapter(parallel={"tp": 2}), r) for r in range(2)])
    session, _ = make(archive)  # now tp=1
    assert session.mode is Mode.SAVE
    assert "world_size=2, tp=2" in session.fallback_reason and "world_size=1, tp=1" in session.fallback_reason


def test_every_rank_must_be_complete(archive, io):
    adapter = FakeAdapter(parallel={"tp": 2})
    write_archive(archive, Topology("fakeengine", "1.2.3", 2, tp=2),
                  [adapter_fingerprint(adapter, r) for r in range(2)])
    assert make(archive, rank=1, adapter=adapter)[0].mode is Mode.LOAD
    (rank_dir(archive, 1) / STATE_NAME).unlink()
    session, _ = make(archive, rank=0, adapter=adapter)
    assert session.mode is Mode.SAVE and "rank 1 of 2" in session.fallback_reason


# ---- fallback: corrupt archives ----------------------------------------------------------------

@pytest.mark.parametrize("damage", ["manifest", "state", "engine.json"])
def test_corrupt_archive_in_auto_resaves(archive, io, caplog, damage):
    run_save(archive)
    target = {"manifest": archive / "rank0" / "manifest.json", "state": archive / "rank0" / STATE_NAME,
              "engine.json": archive / "engine.json"}[damage]
    target.write_text(target.read_text()[:20])
    session, adapter = make(archive)
    assert session.mode is Mode.SAVE
    assert str(target.name) in session.fallback_reason
    assert len(fallback_lines(caplog, logging.WARNING)) == 1


def test_corrupt_archive_with_fallback_disabled_raises(archive, io):
    run_save(archive)
    (archive / "rank0" / "manifest.json").write_text("{")
    with pytest.raises(FormatError, match="manifest"):
        make(archive, "load", environ={"FOUNDRY_FALLBACK": "false"})


def test_interrupted_save_leaves_an_archive_auto_rewrites(archive, io):
    run_save(archive)
    (archive / "rank0" / STATE_NAME).unlink()  # crash between the graphs and engine_state.json
    session, _ = make(archive)
    assert session.mode is Mode.SAVE and "did not finish" in session.fallback_reason


# ---- fallback found late, at load() --------------------------------------------------------------

def test_environment_mismatch_at_load_falls_back_and_resaves(archive, io, caplog):
    run_save(archive)
    io.environment["driver_version"] = 13010  # a new driver on this machine
    runtime = FakeRuntime()
    session, adapter = make(archive, runtime=runtime)
    assert session.mode is Mode.LOAD
    session.begin()
    session.determinism_boundary()
    assert session.load() is None
    assert session.mode is Mode.SAVE and "'driver_version'" in session.fallback_reason
    lines = fallback_lines(caplog, logging.WARNING)
    assert len(lines) == 1 and "driver_version" in lines[0].getMessage()
    assert adapter.fallbacks[0][1] is Mode.SAVE
    assert runtime.active  # the region stays: this start captures and saves
    assert session.save(GRAPHS) is not None
    assert read_state(archive / "rank0").scratch_boundary == DEFAULT_SCRATCH_SIZE


@pytest.mark.parametrize("error", [FormatError("graphs.fgr: section 3 checksum mismatch"),
                                   DivergenceError("allocation sequence diverged at seq 12")])
def test_corrupt_payload_at_load_in_explicit_load(archive, io, caplog, error):
    run_save(archive)
    io.load_error = error
    runtime = FakeRuntime()
    session, _ = make(archive, "load", runtime=runtime)
    session.begin()
    session.determinism_boundary()
    assert session.load() is None
    assert session.mode is Mode.OFF and str(error) in session.fallback_reason
    assert not runtime.active  # explicit LOAD that fell back: the region is stopped, nothing is saved
    assert len(fallback_lines(caplog, logging.ERROR)) == 1


def test_failure_at_load_with_fallback_disabled_raises(archive, io):
    run_save(archive)
    io.load_error = FormatError("graphs.fgr: truncated")
    session, _ = make(archive, environ={"FOUNDRY_FALLBACK": "0"})
    session.begin()
    session.determinism_boundary()
    with pytest.raises(FormatError, match="truncated"):
        session.load()


def test_errors_that_are_not_about_the_archive_propagate(archive, io):
    run_save(archive)
    io.load_error = CudaError("cuGraphInstantiate failed: out of memory")
    session, _ = make(archive)
    session.begin()
    session.determinism_boundary()
    with pytest.raises(CudaError):
        session.load()


def test_prefix_past_the_recorded_boundary_falls_back(archive, io):
    run_save(archive)
    runtime = FakeRuntime()
    session, _ = make(archive, runtime=runtime)
    session.begin()
    runtime.allocate(5 << 30)  # more than SAVE's 4 GiB boundary
    boundary = session.determinism_boundary()
    assert session.mode is Mode.SAVE and "determinism boundary" in session.fallback_reason
    assert boundary == 10 << 30  # SAVE's rule applied afresh: 2 * cursor


def test_load_before_begin_is_refused(archive, io):
    run_save(archive)
    session, _ = make(archive)
    with pytest.raises(StateError, match="begin"):
        session.load()


# ---- kernel images loaded ahead ------------------------------------------------------------------

def start_load(archive, environ=NO_ENV):
    """A LOAD session past its determinism boundary, from a SAVE made first."""
    run_save(archive)
    session, _ = make(archive, environ=environ)
    assert session.mode is Mode.LOAD
    session.begin()
    session.determinism_boundary()
    return session


def test_images_are_loaded_on_a_thread_that_the_restore_waits_for(archive, io, caplog):
    session = start_load(archive)
    bound = []
    session.load_images_ahead(lambda: bound.append(threading.current_thread().name))
    session.load_images_ahead(lambda: bound.append("again"))  # one thread per session
    with caplog.at_level(logging.INFO, logger="foundry"):
        assert session.load() is not None
    assert bound == ["foundry-images-ahead"]  # the device made current on that thread, first
    assert io.images_loaded == [(rank_dir(archive, 0), "foundry-images-ahead")]
    assert len(io.loaded) == 1
    assert any("kernel images loaded ahead on a thread" in r.getMessage() for r in caplog.records)


def test_a_failure_ahead_is_left_to_the_restore(archive, io, caplog):
    session = start_load(archive)
    io.images_error = FormatError("images/0123.img: checksum mismatch")
    session.load_images_ahead(lambda: None)
    with caplog.at_level(logging.INFO, logger="foundry"):
        assert session.load() is not None  # the fake restore does not load images itself
    assert io.images_loaded == [] and len(io.loaded) == 1
    assert any("loading the kernel images ahead failed (FormatError: images/0123.img: checksum mismatch)"
               in r.getMessage() for r in caplog.records)


def test_no_images_of_an_archive_made_for_another_machine(archive, io):
    session = start_load(archive)
    io.environment["driver_version"] = 13100  # the machine changed since SAVE
    session.load_images_ahead(lambda: None)
    assert session.load() is None  # the restore refuses it: a normal start
    assert io.images_loaded == [] and "driver_version" in session.fallback_reason


@pytest.mark.parametrize("stop", ["fall_back", "end"])
def test_a_fallback_or_the_end_before_the_restore_joins_the_images_thread(archive, io, caplog, monkeypatch, stop):
    import foundry_core.images

    session = start_load(archive)
    release = threading.Event()

    def slow_load(directory, lazy=False):
        release.wait(5)
        return io.load_images(directory, lazy)

    monkeypatch.setattr(foundry_core.images, "load_cuda_modules_and_libraries", slow_load)
    session.load_images_ahead(lambda: None)
    threading.Timer(0.05, release.set).start()
    with caplog.at_level(logging.INFO, logger="foundry"):
        if stop == "fall_back":
            session.fall_back(MismatchError("the engine wants other capture sizes"))
        else:
            session.end()
    # Joined before the new mode or the end took effect: nothing of the archive loads afterwards.
    assert io.images_loaded == [(rank_dir(archive, 0), "foundry-images-ahead")]
    assert any("kernel images loaded ahead" in r.getMessage() for r in caplog.records)
    session.load_images_ahead(lambda: None)  # not again
    assert len(io.images_loaded) == 1 and io.loaded == []


@pytest.fixture
def warmups(monkeypatch):
    """foundry_core.exec_memory.warm replaced: records (payload, thread) per call; raises
    ``warmups.error`` when set."""
    import foundry_core.exec_memory as exec_memory

    class Calls(list):
        error: Exception | None = None
        until_stopped: threading.Event | None = None

    calls = Calls()

    def warm(payload, stop=None):
        calls.append((Path(payload), threading.current_thread().name))
        if calls.error is not None:
            raise calls.error
        if calls.until_stopped is not None:  # a long warm-up: runs until the restore stops it
            calls.until_stopped.set()
            deadline = time.monotonic() + 5
            while not stop.value and time.monotonic() < deadline:
                time.sleep(0.001)
            return exec_memory.ExecWarmup(graphs=3, execs=1, nodes=500, seconds=0.02)
        return exec_memory.ExecWarmup(graphs=3, execs=3, nodes=1500, seconds=0.01)

    monkeypatch.setattr(exec_memory, "warm", warm)
    return calls


def test_exec_memory_is_grown_on_the_thread_after_the_images(archive, io, warmups, caplog):
    session = start_load(archive)
    with caplog.at_level(logging.INFO, logger="foundry"):  # the thread logs as soon as it is done
        session.load_images_ahead(lambda: None, warm_execs=True)
        assert session.load() is not None
    assert io.images_loaded == [(rank_dir(archive, 0), "foundry-images-ahead")]
    assert warmups == [(rank_dir(archive, 0) / "graphs.fgr", "foundry-images-ahead")]  # the manifest's payload
    assert any("driver memory for 3 graph execs (1500 nodes) grown ahead" in r.getMessage() for r in caplog.records)


def test_exec_memory_is_grown_only_when_asked_and_only_after_images_loaded(archive, io, warmups):
    session = start_load(archive)
    session.load_images_ahead(lambda: None)  # the default: no warm-up
    assert session.load() is not None and warmups == []
    session, _ = make(archive)  # a second LOAD start from the same archive
    session.begin()
    session.determinism_boundary()
    io.images_error = FormatError("images/0123.img: checksum mismatch")
    session.load_images_ahead(lambda: None, warm_execs=True)
    assert session.load() is not None and warmups == []  # the restore meets the image problem itself


def test_the_restore_stops_a_warm_up_still_running(archive, io, warmups, caplog):
    session = start_load(archive)
    warmups.until_stopped = threading.Event()
    with caplog.at_level(logging.INFO, logger="foundry"):
        session.load_images_ahead(lambda: None, warm_execs=True)
        assert warmups.until_stopped.wait(5)  # the warm-up is under way when the restore begins
        start = time.monotonic()
        assert session.load() is not None
    assert time.monotonic() - start < 2  # stopped, not waited out (the fake gives up after 5 s)
    assert any("driver memory for 1 graph execs (of 3: stopped when the restore began)" in r.getMessage()
               for r in caplog.records)


def test_a_failed_warm_up_leaves_the_restore_as_it_was(archive, io, warmups, caplog):
    session = start_load(archive)
    warmups.error = CudaError("cuGraphInstantiate (stand-in) failed: CUDA_ERROR_OUT_OF_MEMORY")
    with caplog.at_level(logging.INFO, logger="foundry"):
        session.load_images_ahead(lambda: None, warm_execs=True)
        assert session.load() is not None  # restored as without the warm-up
    assert session.mode is Mode.LOAD and session.fallback_reason is None
    messages = [r.getMessage() for r in caplog.records]
    assert any("kernel images loaded ahead on a thread" in m for m in messages)
    assert any("the work after loading the images ahead failed (CudaError: cuGraphInstantiate (stand-in)" in m
               for m in messages)


def test_no_images_ahead_outside_load(archive, io):
    session, _ = make(archive)
    assert session.mode is Mode.SAVE
    session.begin()
    session.determinism_boundary()
    session.load_images_ahead(lambda: None)
    assert session.load() is None and io.images_loaded == []


# ---- SAVE failures ------------------------------------------------------------------------------

def test_failed_save_keeps_the_engine_running(archive, io, caplog):
    io.save_error = AuditError("graph 'bs=1' node 4 kernel k parameter at offset 8 points outside the region")
    session, _ = make(archive)
    session.begin()
    session.determinism_boundary()
    assert session.save(GRAPHS) is None
    assert session.mode is Mode.OFF
    assert any("could not save" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    assert not (archive / "rank0" / STATE_NAME).exists()


def test_failed_save_with_fallback_disabled_raises(archive, io):
    io.save_error = AuditError("outside the region")
    session, _ = make(archive, environ={"FOUNDRY_FALLBACK": "0"})
    session.begin()
    session.determinism_boundary()
    with pytest.raises(AuditError):
        session.save(GRAPHS)


@pytest.mark.parametrize("state,error,match", [
    (None, StateError, "foundry_record_state"),
    ({"kv_cache_blocks": 1}, InvalidArgumentError, "kv_cache_bytes"),
    ([1], InvalidArgumentError, "expected a dict"),
    ({"kv_cache_bytes": -1, "kv_cache_blocks": 1}, InvalidArgumentError, "kv_cache_bytes"),
])
def test_unusable_recorded_state_is_named(archive, io, state, error, match):
    session, _ = make(archive, adapter=FakeAdapter(state=state))
    session.begin()
    session.determinism_boundary()
    with pytest.raises(error, match=match):
        session.save(GRAPHS)
    assert io.saved == []


# ---- adapter answers and settings ----------------------------------------------------------------

@pytest.mark.parametrize("change,match", [
    (dict(identity="vllm"), "expected \\(name, version\\)"),
    (dict(identity=None), "foundry_engine_identity"),
    (dict(parallel={"tp": 2, "cp": 2}), "foundry_parallel_config"),
    (dict(sizes=None), "foundry_capture_sizes"),
    (dict(knobs=[("a", 1)]), "foundry_graph_knobs"),
])
def test_unusable_adapter_answers_are_named(archive, change, match):
    with pytest.raises(InvalidArgumentError, match=match):
        make(archive, adapter=FakeAdapter(**change))


def test_conflicting_knobs_from_two_adapters(archive):
    class Other:
        def foundry_graph_knobs(self):
            return {"cudagraph_mode": "PIECEWISE"}

    pm = get_plugin_manager(FakeAdapter(), Other())
    with pytest.raises(InvalidArgumentError, match="cudagraph_mode"):
        EngineSession(archive, "auto", 0, pm, runtime=FakeRuntime(), environ=NO_ENV)


@pytest.mark.parametrize("value,expected", [("", True), ("1", True), ("yes", True), ("0", False), ("OFF", False),
                                            ("false", False)])
def test_fallback_setting(value, expected):
    assert fallback_enabled({"FOUNDRY_FALLBACK": value}) is expected


def test_bad_fallback_setting():
    with pytest.raises(InvalidArgumentError, match="FOUNDRY_FALLBACK"):
        fallback_enabled({"FOUNDRY_FALLBACK": "maybe"})


def test_ranks_write_their_own_directories(archive, io):
    adapter = FakeAdapter(parallel={"tp": 2})
    for r in range(2):
        run_save(archive, adapter, rank=r)
    assert [d for d, _, _ in io.saved] == [archive / "rank0", archive / "rank1"]
    assert [fp["engine.rank"] for _, _, fp in io.saved] == [0, 1]
    assert json.loads((archive / "engine.json").read_text())["world_size"] == 2
    assert make(archive, rank=1, adapter=adapter)[0].mode is Mode.LOAD
