"""The engine-agnostic helpers every engine plugin uses (foundry_core.engine: worker, capture,
flags, values, options, logs, adapter, environment, registration, contract), tested directly with
fakes: no torch, no GPU, no engine."""

from __future__ import annotations

import argparse
import collections
import dataclasses
import enum
import logging
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from plugin_support import FakeDevice

from foundry_core.engine import (
    EngineAdapter,
    Mode,
    PluginContract,
    Seam,
    SeamTable,
    Settings,
    add_foundry_args,
    address_mismatch,
    env_flag,
    graph_name,
    instantiate_mode,
    plain,
    plugin_child_environment,
    settings_from_args,
    setup_logging,
    swapped,
    tensor_addresses,
)
from foundry_core.engine import capture, flags, worker
from foundry_core.engine.adapter import distribution_version
from foundry_core.engine.contract import directory_reader
from foundry_core.engine.patching import SeamError
from foundry_core.engine.registration import PluginRegistration
from foundry_core.errors import InvalidArgumentError, MismatchError, StateError

FOUNDRY_ENV = ("FOUNDRY_MODE", "FOUNDRY_ARCHIVE", "FOUNDRY_LOG", "FOUNDRY_STRICT")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for key in FOUNDRY_ENV:
        # setenv first: monkeypatch then restores the original (absent) value at teardown, also
        # when the code under test wrote the variable itself (flags.export does).
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    foundry_logger = logging.getLogger("foundry")
    saved = (list(foundry_logger.handlers), foundry_logger.propagate, foundry_logger.level)
    yield
    foundry_logger.handlers[:], foundry_logger.propagate, foundry_logger.level = saved


# ---- fakes ---------------------------------------------------------------------------------------


class FakeSession:
    def __init__(self, mode: Mode, log: list[str], *, off_at_boundary: bool = False, archive: Any = None,
                 state: Any = None) -> None:
        self.mode = mode
        self.log = log
        self.off_at_boundary = off_at_boundary
        self.archive = archive
        self.state = state

    def begin(self) -> None:
        self.log.append("begin")

    def determinism_boundary(self) -> None:
        self.log.append("boundary")
        if self.off_at_boundary:
            self.mode = Mode.OFF

    def load_images_ahead(self, bind: Any, warm_execs: bool = False) -> None:
        self.log.append("images_ahead+warm" if warm_execs else "images_ahead")

    def end(self) -> None:
        self.log.append("end")

    def fall_back(self, cause: Exception) -> Mode:
        self.log.append(f"fall_back:{cause}")
        self.mode = Mode.OFF
        return self.mode

    def recorded_state(self) -> Any:
        return self.state

    def load(self, *, instantiate: str, threads: int, defer: Any = None) -> Any:
        self.log.append(f"load:{instantiate}:{threads}")
        return self.archive


class FakeArchive:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def close(self) -> None:
        self.log.append("archive_closed")


class Runtime(worker.WorkerRuntime):
    logger = logging.getLogger("foundry.testengine")
    no_capture_warning = "TestEngine captured no CUDA graphs"


def make_runtime(mode: Mode = Mode.SAVE, **session: Any) -> tuple[Runtime, list[str]]:
    log: list[str] = []
    return Runtime(FakeSession(mode, log, **session), adapter=None, device=FakeDevice(log, free=1 << 30)), log


class FakeTensor:
    is_cuda = True

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


class CpuTensor(FakeTensor):
    is_cuda = False


# ---- worker runtime: pauses, life cycle ----------------------------------------------------------


def test_pause_stops_the_region_around_a_private_pool_in_order():
    rt, log = make_runtime()
    with rt.paused():
        log.append("body")
    assert log == ["empty_cache", "stop_region", "new_pool", "use:pool", "body", "unuse", "empty_cache",
                   "resume_region"]
    log.clear()
    with rt.paused():
        with rt.paused():  # nested: nothing more
            log.append("inner")
    assert log == ["empty_cache", "stop_region", "new_pool", "use:pool", "inner", "unuse", "empty_cache",
                   "resume_region"]


def test_each_pause_lets_its_pool_go_before_the_closing_flush():
    # A pool kept for the whole start would hold the memory profile's cached peak activations
    # beyond the engine's budget: PyTorch returns a pool's cache only once the pool is released.
    rt, log = make_runtime()
    alive_at_flush: list[bool] = []
    device_flush = rt.device.empty_cache

    def empty_cache() -> None:
        alive_at_flush.append(any(ref() is not None for ref in rt.device.pools))
        device_flush()

    rt.device.empty_cache = empty_cache
    for _ in range(2):
        with rt.paused():
            assert rt.device.pools[-1]() is not None  # the body allocates from a live pool
    assert len(rt.device.pools) == 2 and all(ref() is None for ref in rt.device.pools)
    assert alive_at_flush == [False, False, False, False]  # opening flushes, and closing ones after the release


def test_a_pause_says_how_much_memory_its_pool_and_cache_gave_back(caplog):
    rt, log = make_runtime()
    device_flush = rt.device.empty_cache

    def empty_cache() -> None:  # the profile's cached activations go back when the pool is let go
        device_flush()
        if "new_pool" in log:
            rt.device.free += 5 << 30

    rt.device.empty_cache = empty_cache
    with caplog.at_level(logging.DEBUG, logger="foundry"), rt.paused():
        pass
    returned = [(r.levelno, r.getMessage()) for r in caplog.records if "returned" in r.getMessage()]
    assert returned == [(logging.INFO, "foundry: the pause's pool and cache returned 5.00 GiB to the device")]
    caplog.clear()
    rt.device.empty_cache = device_flush
    with caplog.at_level(logging.DEBUG, logger="foundry"), rt.paused():  # nothing given back: debug only
        pass
    assert [r.levelno for r in caplog.records if "returned" in r.getMessage()] == [logging.DEBUG]


def test_pause_resumes_the_region_when_the_body_raises():
    rt, log = make_runtime()
    with pytest.raises(RuntimeError, match="boom"):
        with rt.paused():
            raise RuntimeError("boom")
    assert log[-2:] == ["empty_cache", "resume_region"]
    log.clear()
    with rt.paused():  # the depth was restored: a new pause stops the region again
        pass
    assert "stop_region" in log


def test_pause_outside_the_region_does_nothing():
    rt, log = make_runtime(Mode.OFF)
    with rt.paused():
        log.append("body")
    assert log == ["body"]
    rt, log = make_runtime(Mode.SAVE)
    rt.finish()
    log.clear()
    with rt.paused():
        log.append("body")
    assert log == ["body"]


def test_skipped_makes_the_same_flushes_and_logs_at_the_skip_level(caplog):
    rt, log = make_runtime(Mode.LOAD)
    with caplog.at_level(logging.DEBUG, logger="foundry"):
        rt.skipped("kernel warmup")

    class Quiet(Runtime):
        skip_level = logging.DEBUG

    quiet = Quiet(FakeSession(Mode.LOAD, []), adapter=None, device=FakeDevice([], free=1 << 30))
    with caplog.at_level(logging.INFO, logger="foundry"):
        quiet.skipped("not shown at INFO")
    assert log == ["empty_cache", "stop_region", "new_pool", "use:pool", "unuse", "empty_cache", "resume_region"]
    records = [r for r in caplog.records if "LOAD skips" in r.getMessage()]
    assert [(r.name, r.levelno, r.getMessage()) for r in records] == [
        ("foundry.testengine", logging.INFO, "foundry: LOAD skips kernel warmup")]


def test_timed_logs_the_step_on_the_given_logger_even_when_it_raises(caplog):
    log = logging.getLogger("foundry.testengine")
    with caplog.at_level(logging.INFO, logger="foundry"):
        with worker.timed("step one", log):
            pass
        with pytest.raises(ValueError):
            with worker.timed("step two"):
                raise ValueError
    lines = [(r.name, r.getMessage()) for r in caplog.records]
    assert len(lines) == 2
    assert lines[0][0] == "foundry.testengine" and lines[0][1].startswith("foundry: step one took ")
    assert lines[1][0] == "foundry" and lines[1][1].startswith("foundry: step two took ")
    assert lines[0][1].endswith(" s")


def test_in_phase_sets_the_phase_then_the_next_and_ends_the_region(caplog):
    rt, log = make_runtime(Mode.SAVE)
    rt.capture_seen = True
    seen = []
    with caplog.at_level(logging.INFO, logger="foundry"):
        with pytest.raises(KeyError):
            with rt.in_phase("capture", "serving", "capture step"):
                seen.append(rt.phase)
                raise KeyError
    assert seen == ["capture"] and rt.phase == "serving"
    assert log == ["end"] and not rt.region_open
    assert any("capture step took" in r.getMessage() for r in caplog.records)


def test_finish_warns_once_when_the_capture_seam_was_never_reached(caplog):
    rt, log = make_runtime(Mode.LOAD)
    with caplog.at_level(logging.WARNING, logger="foundry"):
        rt.finish()
        rt.finish()
    assert log == ["end"]
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == ["foundry: TestEngine captured no CUDA graphs; no graph was restored"]


def test_boundary_ends_the_region_only_where_the_plugin_says_so():
    rt, log = make_runtime(Mode.SAVE, off_at_boundary=True)
    rt.boundary()
    rt.finish()
    assert log == ["boundary", "end"]  # default: finish still ends the session

    class EndsAtBoundary(Runtime):
        end_when_off_at_boundary = True

    log2: list[str] = []
    rt2 = EndsAtBoundary(FakeSession(Mode.SAVE, log2, off_at_boundary=True), adapter=None,
                         device=FakeDevice(log2, free=1 << 30))
    rt2.boundary()
    rt2.finish()
    assert log2 == ["boundary"]


def test_boundary_starts_loading_the_images_ahead_in_load_mode_only(monkeypatch):
    for mode, expected in ((Mode.LOAD, ["boundary", "images_ahead"]), (Mode.SAVE, ["boundary"])):
        rt, log = make_runtime(mode)
        rt.boundary()
        assert log == expected
    monkeypatch.setenv("FOUNDRY_EXEC_WARMUP", "1")  # read here, on the engine's thread
    rt, log = make_runtime(Mode.LOAD)
    rt.boundary()
    assert log == ["boundary", "images_ahead+warm"]
    monkeypatch.setenv("FOUNDRY_IMAGES_AHEAD", "0")
    rt, log = make_runtime(Mode.LOAD)
    rt.boundary()
    assert log == ["boundary"]


def test_no_images_ahead_for_lazy_instantiation_or_without_a_context():
    class Lazy(Runtime):
        def lazy_instantiation(self) -> bool:
            return True

    log: list[str] = []
    Lazy(FakeSession(Mode.LOAD, log), adapter=None, device=FakeDevice(log, free=1 << 30)).boundary()
    assert log == ["boundary"]

    class NoContext(FakeDevice):
        def thread_binder(self):
            raise StateError("no current CUDA context to hand to another thread (cuCtxGetCurrent: 201)")

    log2: list[str] = []
    Runtime(FakeSession(Mode.LOAD, log2), adapter=None, device=NoContext(log2, free=1 << 30)).boundary()
    assert log2 == ["boundary"]  # the restore loads the images itself


def test_fall_back_to_off_closes_the_region_and_the_restored_archive():
    log: list[str] = []
    archive = FakeArchive(log)
    rt = Runtime(FakeSession(Mode.LOAD, log, archive=archive, state=types.SimpleNamespace(adapter={"a": 1})),
                 adapter=None, device=FakeDevice(log, free=1 << 30))
    assert rt.recorded_adapter_state() == {"a": 1}
    loaded = rt.load_archive("lazy", 3)
    assert loaded is not None and loaded[0] is archive and loaded[1] >= 0 and rt.archive is archive
    assert rt.fall_back(MismatchError("sizes differ")) is Mode.OFF
    assert log == ["load:lazy:3", "fall_back:sizes differ", "archive_closed"]
    assert rt.archive is None and not rt.region_open
    rt.finish()
    assert "end" not in log


def test_load_archive_is_none_when_the_session_could_not_load():
    rt, log = make_runtime(Mode.LOAD)
    assert rt.recorded_adapter_state() == {}
    assert rt.load_archive("eager", 1) is None and rt.archive is None


def test_start_runtime_is_none_when_off_and_launches_otherwise(monkeypatch, tmp_path, caplog):
    made = []
    assert worker.start_runtime(0, lambda: made.append("adapter"), Runtime) is None
    assert made == []
    monkeypatch.setenv("FOUNDRY_ARCHIVE", str(tmp_path))
    monkeypatch.setenv("FOUNDRY_MODE", "save")
    log: list[str] = []
    calls = []

    def session_factory(archive, mode, rank, pm, **kwargs):
        calls.append((archive, mode, rank, sorted(kwargs)))
        return FakeSession(Mode(mode), log)

    class Adapter:
        def foundry_engine_identity(self):
            return "test", "1"

        def foundry_model_identity(self):
            return {}

        def foundry_capture_sizes(self):
            return [1]

        def foundry_parallel_config(self):
            return {"tp": 1}

    slot: worker.RuntimeSlot[Runtime] = worker.RuntimeSlot()
    with caplog.at_level(logging.INFO, logger="foundry"):
        rt = slot.keep(worker.start_runtime(
            2, Adapter, lambda session, adapter: Runtime(session, adapter, FakeDevice(log, free=1 << 30)),
            session_factory=session_factory, region=lambda: "region"))
    assert isinstance(rt, Runtime) and isinstance(rt.adapter, Adapter) and slot.runtime is rt
    assert calls == [(tmp_path, Mode.SAVE, 2, ["runtime"])] and log == ["begin"]
    assert any(r.getMessage() == f"foundry: rank 2 runs in mode {Mode.SAVE} with archive {tmp_path}"
               for r in caplog.records)
    assert slot.keep(None) is None and slot.runtime is rt
    slot.reset()
    assert slot.runtime is None


# ---- capture helpers -----------------------------------------------------------------------------


class Variant(enum.Enum):
    FULL = 1
    PIECEWISE = 2


@dataclasses.dataclass(frozen=True)
class Desc:
    num_tokens: int
    mode: Variant
    uniform: bool = True


Key = collections.namedtuple("Key", "size stream_idx variant_label")


def test_graph_name_of_dataclasses_named_tuples_enums_and_others():
    assert graph_name(Desc(8, Variant.FULL)) == "num_tokens=8,mode=FULL,uniform=True"
    assert graph_name(Key(4, None, Variant.PIECEWISE)) == "size=4,stream_idx=None,variant_label=PIECEWISE"
    assert graph_name(Variant.FULL) == "FULL"
    assert graph_name(16) == "16"
    assert graph_name(Desc) == str(Desc)  # a class is not an instance


def test_tensor_addresses_walks_nested_containers():
    shared = FakeTensor(0x10)

    @dataclasses.dataclass
    class Metadata:
        seq_lens: Any
        block_table: Any
        extra: Any = None

    class Plain:
        def __init__(self) -> None:
            self.b = FakeTensor(0x40)
            self.a = [shared, CpuTensor(0x99)]

    meta = Metadata(seq_lens=shared, block_table={"k": (FakeTensor(0x20), Key(FakeTensor(0x30), 1, None))},
                    extra=Plain())
    assert tensor_addresses(meta) == {
        ".seq_lens": 0x10,
        ".block_table[k][0]": 0x20,
        ".block_table[k][1].size": 0x30,
        ".extra.a[0]": 0x10,
        ".extra.b": 0x40,
    }
    assert tensor_addresses(FakeTensor(0x50)) == {"": 0x50}
    assert tensor_addresses(None) == {} and tensor_addresses("text") == {}


def test_tensor_addresses_survives_cycles_and_stops_at_max_depth():
    loop: dict[str, Any] = {"t": FakeTensor(1)}
    loop["self"] = loop
    assert tensor_addresses(loop) == {"[t]": 1}
    deep: Any = FakeTensor(2)
    for _ in range(capture.MAX_DEPTH + 2):
        deep = [deep]
    assert tensor_addresses(deep) == {}  # the container at depth MAX_DEPTH + 1 is not followed
    assert tensor_addresses(deep[0]) == {"[0]" * (capture.MAX_DEPTH + 1): 2}


def test_address_mismatch_names_the_first_differences():
    saved = {"g1": {".a": 0x10, ".b": 0x20}, "g2": {"": 0x30}, "gone": {".a": 1}}
    assert address_mismatch(saved, {"g1": {".a": 0x10, ".b": 0x20, ".new": 5}, "g2": {"": 0x30}}) is None
    assert address_mismatch(saved, {"g1": {".a": 0x11}, "g2": {"": 0x30}}) == (
        "graph 'g1' metadata .a at 0x11, at SAVE 0x10")
    many = {"g": {f".{i}": i + 1 for i in range(5)}}
    text = address_mismatch(many, {"g": {f".{i}": 0 for i in range(5)}})
    assert text is not None and text.count("graph 'g'") == 3 and text.endswith(" (and 2 more)")
    assert address_mismatch({"g2": {"": 0x30}}, {"g2": {"": 0x31}}) == "graph 'g2' metadata <root> at 0x31, at SAVE 0x30"


def test_swapped_puts_the_attributes_back_even_when_the_block_raises():
    owner = types.SimpleNamespace(a=1, b=2)
    with pytest.raises(RuntimeError):
        with swapped(owner, a=10, b=20):
            assert (owner.a, owner.b) == (10, 20)
            raise RuntimeError
    assert (owner.a, owner.b) == (1, 2)
    with pytest.raises(AttributeError):
        with swapped(owner, a=5, missing=1):
            pass
    assert owner.a == 1 and not hasattr(owner, "missing")


def test_the_placeholders_capture_nothing_and_refuse_to_replay():
    class Pending(capture.PendingGraph):
        plugin = "test-foundry"

    graph = Pending(pool=None)
    with pytest.raises(RuntimeError, match="^test-foundry: a CUDA graph placeholder was replayed"):
        graph.replay()
    with capture.NoCapture(graph, stream=None) as value:
        assert value is None
    assert capture.NoCapture().__exit__(None, None, None) is False


def test_neutralised_and_keep_graphs_swap_torch_cuda(monkeypatch):
    cuda = types.SimpleNamespace(CUDAGraph="torch graph", graph="torch context")
    fake_torch = types.ModuleType("torch")
    fake_torch.cuda = cuda  # type: ignore[attr-defined]
    fake_cuda_graph = types.ModuleType("foundry_core.cuda_graph")
    fake_cuda_graph.CUDAGraph = "foundry graph"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setitem(sys.modules, "foundry_core.cuda_graph", fake_cuda_graph)
    with capture.neutralised():
        assert (cuda.CUDAGraph, cuda.graph) == (capture.PendingGraph, capture.NoCapture)
    with capture.neutralised(str, "mine"):
        assert (cuda.CUDAGraph, cuda.graph) == (str, "mine")
    with capture.keep_graphs():
        assert (cuda.CUDAGraph, cuda.graph) == ("foundry graph", "torch context")
    with capture.keep_graphs(graph="tracking"):
        assert (cuda.CUDAGraph, cuda.graph) == ("foundry graph", "tracking")
    assert (cuda.CUDAGraph, cuda.graph) == ("torch graph", "torch context")


# ---- command-line flags --------------------------------------------------------------------------


def test_add_foundry_args_adds_the_flags_once_with_the_engine_named():
    parser = argparse.ArgumentParser()
    assert add_foundry_args(parser, engine="TestEngine", plugin="test-foundry", graphs="decode graphs") is parser
    add_foundry_args(parser, engine="Other", plugin="other")  # a second call: nothing
    flags_seen = [s for a in parser._actions for s in a.option_strings if s.startswith("--foundry")]
    assert flags_seen == ["--foundry-archive", "--foundry-mode"]
    help_text = parser.format_help()
    assert "Persist the decode graphs TestEngine captures and restore them at the next start (test-foundry)." in \
        " ".join(help_text.split())
    assert "Other" not in help_text
    args = parser.parse_args(["--foundry-archive", "a", "--foundry-mode", "load"])
    assert (args.foundry_archive, args.foundry_mode) == ("a", "load")
    with pytest.raises(SystemExit):
        parser.parse_args(["--foundry-mode", "sometimes"])


def test_settings_from_args_export_and_apply(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert settings_from_args(argparse.Namespace()) is None
    events = []
    assert flags.apply_cli_args(argparse.Namespace(foundry_archive=None, foundry_mode=None),
                                events.append) is None
    args = argparse.Namespace(foundry_archive="arch", foundry_mode="save")
    settings = flags.apply_cli_args(args, lambda s: events.append(("activate", s.mode, s.archive)),
                                    check=lambda: events.append("check"))
    assert settings is not None and settings.mode is Mode.SAVE and settings.mode_source == "flag"
    assert events == ["check", ("activate", Mode.SAVE, tmp_path / "arch")]
    assert os.environ["FOUNDRY_MODE"] == "save" and os.environ["FOUNDRY_ARCHIVE"] == str(tmp_path / "arch")
    events.clear()
    assert flags.apply_cli_args(argparse.Namespace(foundry_mode="off"), events.append,
                                check=lambda: events.append("check")).mode is Mode.OFF
    assert events == [] and os.environ["FOUNDRY_MODE"] == "off"


def test_cli_wrappers_and_their_installation():
    added, applied = [], []
    add = flags.wrap_add_cli_args(lambda parser, *a: None, added.append)
    assert add("parser") is None and added == ["parser"]
    add = flags.wrap_add_cli_args(lambda parser, *a: "returned", added.append)
    assert add("parser") == "returned" and added[-1] == "returned"
    from_args = flags.wrap_from_cli_args(lambda cls, args, *rest: ("engine", cls, args),
                                         lambda args, engine: applied.append((args, engine)))
    assert from_args("Cls", "ns") == ("engine", "Cls", "ns")
    assert applied == [("ns", ("engine", "Cls", "ns"))]

    installed = []
    assert flags.install_cli_seams(lambda name, make: installed.append(name), add, from_args, strict=True,
                                   log=logging.getLogger("foundry.testengine"))
    assert installed == ["cli.add_cli_args", "cli.from_cli_args"]

    def missing(name, make):
        raise SeamError(f"seam {name} moved")

    log = logging.getLogger("foundry.testengine")
    assert flags.install_cli_seams(missing, add, from_args, strict=False, log=log) is False
    with pytest.raises(SeamError, match="cli.add_cli_args moved"):
        flags.install_cli_seams(missing, add, from_args, strict=True, log=log)


# ---- plain values ----------------------------------------------------------------------------------


class Level(enum.IntEnum):
    LOW = 1


class Name(str, enum.Enum):
    AUTO = "auto"


def test_plain_values_are_json_and_stable():
    @dataclasses.dataclass
    class Config:
        level: Level
        ratio: float
        tags: frozenset

    assert plain(Level.LOW) == "LOW" and plain(Name.AUTO) == "AUTO"
    assert plain(Config(Level.LOW, 0.5, frozenset({"b", "a"}))) == {"level": "LOW", "ratio": 0.5, "tags": ["a", "b"]}
    assert plain({1: {3, 2}, "t": (1, [True, None])}) == {"1": [2, 3], "t": [1, [True, None]]}
    assert [plain(float("nan")), plain(float("inf")), plain(float("-inf")), plain(1.25)] == ["nan", "inf", "-inf", 1.25]
    assert plain(object()) == "object"  # its str holds an address
    assert plain(Path("/x")) == "/x"
    deep: Any = "leaf"
    for _ in range(12):
        deep = [deep]
    assert "list" in str(plain(deep))


def test_plain_reads_models_through_the_dump_methods_it_is_given():
    class Pydantic:
        def model_dump(self):
            return {"a": Level.LOW}

    class Msgspec:
        def to_dict(self):
            return {"b": 2}

        def __str__(self):
            return "Msgspec()"

    class Broken:
        def model_dump(self):
            raise TypeError("no")

        def __str__(self):
            return "Broken()"

    assert plain(Pydantic()) == {"a": "LOW"}
    assert plain(Msgspec()) == "Msgspec()"  # default: model_dump only
    assert plain([Msgspec()], dumps=("model_dump", "to_dict")) == [{"b": 2}]
    assert plain(Broken()) == "Broken()"


# ---- options, logging, environment, adapter, registration, contract -------------------------------------


def test_env_flag_and_instantiate_mode():
    env = {"ON": "yes", "OFF": " Off ", "EMPTY": ""}
    assert env_flag("ON", environ=env) and not env_flag("OFF", environ=env)
    assert env_flag("EMPTY", environ=env) and not env_flag("UNSET", default=False, environ=env)
    assert instantiate_mode("M", "T", {}) == ("eager", 4)
    assert instantiate_mode("M", "T", {"M": "LAZY", "T": "0"}) == ("lazy", 1)
    with pytest.raises(InvalidArgumentError, match="^M='sometimes': choose one of"):
        instantiate_mode("M", "T", {"M": "sometimes"})
    with pytest.raises(InvalidArgumentError, match="^T must be an integer"):
        instantiate_mode("M", "T", {"T": "many"})


def test_setup_logging_gives_the_foundry_logger_one_handler():
    root = logging.getLogger("foundry")
    root.handlers[:] = []
    setup_logging({"FOUNDRY_LOG": "debug"})
    setup_logging({"FOUNDRY_LOG": "error"})
    assert len(root.handlers) == 1 and root.level == logging.DEBUG and root.propagate is False


def test_plugin_child_environment(tmp_path):
    settings = Settings(Mode.SAVE, tmp_path, "flag", "flag")
    seen = []

    def prepare(**kwargs):
        seen.append(kwargs)
        return {"LD_PRELOAD": "libfoundry.so"}

    env = plugin_child_environment(settings, plugin="test-foundry", off_hint="Run with --off.", prepare=prepare)
    assert env == {"LD_PRELOAD": "libfoundry.so", "FOUNDRY_STRICT": "1"}
    assert seen == [{"archive": tmp_path, "mode": Mode.SAVE}]
    kept = plugin_child_environment(settings, plugin="p", off_hint="", prepare=lambda **k: {"FOUNDRY_STRICT": "0"})
    assert kept == {"FOUNDRY_STRICT": "0"}

    def missing(**kwargs):
        raise FileNotFoundError("nowhere")

    with pytest.raises(StateError, match=r"^test-foundry: libfoundry.so was not found \(nowhere\); reinstall "
                                         r"foundry-core, or Run with --off\.$"):
        plugin_child_environment(settings, plugin="test-foundry", off_hint="Run with --off.", prepare=missing)


def test_engine_adapter_keeps_state_and_fallbacks(caplog):
    adapter = EngineAdapter(engine_version="9.9")
    assert adapter.installed_engine_version() == "9.9"
    assert adapter.foundry_record_state() is None
    adapter.state["kv_cache_bytes"] = 10
    assert adapter.foundry_record_state() is None
    adapter.state["kv_cache_blocks"] = 2
    record = adapter.foundry_record_state()
    assert record == {"kv_cache_bytes": 10, "kv_cache_blocks": 2} and record is not adapter.state
    with caplog.at_level(logging.DEBUG, logger="foundry"):
        adapter.foundry_on_fallback("sizes differ", Mode.SAVE)
    assert adapter.fallback_reasons == ["sizes differ"]
    assert any("fallback to mode" in r.getMessage() for r in caplog.records)
    assert distribution_version("pytest") == pytest.__version__


def test_plugin_registration_is_idempotent_and_reports_errors(monkeypatch, tmp_path):
    log = logging.getLogger("foundry.testengine")
    reg = PluginRegistration("test-foundry", log)
    events = []
    reg.register(lambda: events.append("cli"), lambda s: events.append(("activate", s.mode)))
    reg.register(lambda: events.append("cli again"), lambda s: events.append("again"))
    assert events == ["cli"]  # no archive: Foundry is off

    reg.reset()
    monkeypatch.setenv("FOUNDRY_ARCHIVE", str(tmp_path))
    monkeypatch.setenv("FOUNDRY_MODE", "sometimes")
    errors = []
    with pytest.raises(InvalidArgumentError):
        reg.register(lambda: None, lambda s: None, on_error=errors.append)
    assert len(errors) == 1 and isinstance(errors[0], InvalidArgumentError)

    monkeypatch.setattr("foundry_core.engine.registration.setup_logging", lambda: events.append("logging"))
    monkeypatch.setenv("FOUNDRY_MODE", "save")
    events.clear()
    settings = Settings(Mode.SAVE, tmp_path, "flag", "flag")
    reg.activate(settings, lambda s: {"FOUNDRY_TEST_CHILD": "1"}, lambda: events.append("seams"))
    reg.activate(settings, lambda s: {"FOUNDRY_TEST_CHILD": "2"}, lambda: events.append("seams"))
    reg.activate(Settings(Mode.OFF, None, "flag", "default"), lambda s: {"FOUNDRY_TEST_CHILD": "3"}, lambda: None)
    import os

    assert events == ["logging", "seams"] and os.environ.pop("FOUNDRY_TEST_CHILD") == "2"


def test_plugin_contract_binds_the_checks_to_a_table(tmp_path, capsys):
    table = SeamTable(engine="TestEngine", package="testengine_not_installed", tested_versions=("1.0",), seams=(
        Seam("a.run", "testengine_not_installed.mod", "run", "function", purpose="test"),))
    contract = PluginContract(table)
    (tmp_path / "testengine_not_installed").mkdir()
    (tmp_path / "testengine_not_installed" / "mod.py").write_text("def run(x):\n    return x\n\nrun(1)\n")
    read = directory_reader(tmp_path)
    results = contract.check_sources(read)
    assert [r.status for r in results] == ["ok"] and read("missing.py") is None
    assert contract.format_table(results, "1.0").splitlines()[0].split() == [
        "seam", "status", "testengine_not_installed", "1.0", "detail"]
    assert contract.installed_version() is None and contract.installed_root() is None
    assert contract.main([str(tmp_path)]) == 0 and "a.run" in capsys.readouterr().out
    assert contract.main([]) == 2
