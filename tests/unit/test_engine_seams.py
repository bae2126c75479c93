"""foundry_core.engine.seam / patching / contract: the engine-agnostic seam machinery, exercised on
a tiny fake engine package ("toyengine") written to tmp_path."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from foundry_core.engine import Patcher, Seam, SeamError, SeamTable, check_installed, check_sources, directory_reader
from foundry_core.engine import contract
from foundry_core.engine.patching import MARKER
from foundry_core.errors import UnsupportedError

TOY_SOURCES = {
    "toyengine/__init__.py": "",
    "toyengine/warmup.py": """
        def warm(worker):
            return "warm"
    """,
    "toyengine/worker.py": """
        from toyengine.warmup import warm


        def init_distributed(config, rank, backend="nccl"):
            return ("init", config, rank)


        class Worker:
            def init_device(self, device):
                init_distributed(None, 0)
                self.ready = True
                return device

            @staticmethod
            def add_args(parser):
                return ["args", parser]

            @classmethod
            def from_args(cls, args):
                return (cls.__name__, args)

            def run(self):
                return warm(self)
    """,
    "toyengine/config.py": """
        import enum

        GROUP = "toy.plugins"


        class Mode(enum.Enum):
            NONE = 0
            FULL = 1
    """,
}

SEAMS = (
    Seam("worker.init_distributed", "toyengine.worker", "init_distributed", "function",
         params=("config", "rank"), purpose="begins the session before NCCL"),
    Seam("worker.init_device", "toyengine.worker", "Worker.init_device", "method", params=("self", "device"),
         calls=("init_distributed",), assigns=("ready",), purpose="checks the device"),
    Seam("cli.add_args", "toyengine.worker", "Worker.add_args", "staticmethod", params=("parser",),
         purpose="adds the flags"),
    Seam("cli.from_args", "toyengine.worker", "Worker.from_args", "classmethod", params=("cls", "args"),
         purpose="reads the flags"),
    Seam("worker.warm", "toyengine.worker", "warm", "function", params=("worker",), defined_in="toyengine.warmup",
         purpose="skips the warmup"),
    Seam("config.mode", "toyengine.config", "Mode", "enum", members=("NONE", "FULL"), purpose="mode check"),
    Seam("config.group", "toyengine.config", "GROUP", "constant", value="toy.plugins", required=False,
         purpose="plugin group"),
)
TABLE = SeamTable(engine="ToyEngine", package="toyengine", tested_versions=("1.2.3", "1.3.0"), seams=SEAMS)
OFF_HINT = "Run ToyEngine with --no-foundry."


def write_tree(root: Path, sources: dict[str, str]) -> Path:
    for rel, text in sources.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return root


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The fake engine importable as ``toyengine``; returns its ``worker`` and ``config`` modules."""
    root = write_tree(tmp_path / "site", TOY_SOURCES)
    monkeypatch.syspath_prepend(str(root))
    import toyengine.config
    import toyengine.worker

    yield {"root": root, "worker": toyengine.worker, "config": toyengine.config}
    for name in [m for m in sys.modules if m == "toyengine" or m.startswith("toyengine.")]:
        del sys.modules[name]


@pytest.fixture
def patcher():
    p = Patcher(TABLE, plugin="toy-foundry", off_hint=OFF_HINT, version=lambda: "9.9.9")
    yield p
    p.uninstall_all()


def tagging(tag: str, calls: list | None = None):
    """A make_wrapper whose wrapper returns (tag, original result) and logs its calls."""
    def make(original):
        def wrapper(*args, **kwargs):
            if calls is not None:
                calls.append(tag)
            return (tag, original(*args, **kwargs))
        return wrapper
    return make


# ---- SeamTable -----------------------------------------------------------------------------------


def test_table_looks_seams_up_and_lists_their_files():
    assert TABLE.seam("cli.from_args").qualname == "Worker.from_args"
    assert TABLE.by_name["worker.warm"].source_module == "toyengine.warmup"
    with pytest.raises(KeyError, match=r"no ToyEngine seam named 'nope'; known: cli.add_args, cli.from_args"):
        TABLE.seam("nope")
    assert TABLE.source_files() == [
        "toyengine/config.py", "toyengine/config/__init__.py", "toyengine/warmup.py",
        "toyengine/warmup/__init__.py", "toyengine/worker.py", "toyengine/worker/__init__.py"]


def test_table_and_seam_reject_bad_declarations():
    with pytest.raises(ValueError, match="'worker.warm' is listed twice"):
        SeamTable("ToyEngine", "toyengine", ("1",), (SEAMS[4], SEAMS[4]))
    with pytest.raises(ValueError, match="unknown kind 'lambda'"):
        Seam("x", "m", "q", "lambda", purpose="p")


def test_version_is_unknown_for_a_missing_distribution():
    assert TABLE.version() == "unknown"
    assert contract.installed_version(TABLE) is None


# ---- Patcher -------------------------------------------------------------------------------------


def test_wraps_a_function_its_module_calls_by_name(toy, patcher):
    worker, calls = toy["worker"], []
    before = worker.init_distributed
    assert patcher.install("worker.init_distributed", tagging("dist", calls))
    assert worker.init_distributed(1, 2) == ("dist", ("init", 1, 2))
    assert worker.Worker().init_device("cuda:0") == "cuda:0" and calls == ["dist", "dist"]
    assert patcher.is_installed("worker.init_distributed") and patcher.original("worker.init_distributed") is before
    assert worker.init_distributed.__name__ == "init_distributed"
    assert getattr(worker.init_distributed, MARKER) == "worker.init_distributed"


def test_wraps_a_method(toy, patcher):
    assert patcher.install("worker.init_device", tagging("dev"))
    w = toy["worker"].Worker()
    assert w.init_device("cuda:1") == ("dev", "cuda:1") and w.ready is True


def test_wraps_static_and_class_methods_keeping_their_descriptor(toy, patcher):
    Worker = toy["worker"].Worker
    assert patcher.install("cli.add_args", tagging("static"))
    assert patcher.install("cli.from_args", tagging("class"))
    assert isinstance(Worker.__dict__["add_args"], staticmethod)
    assert isinstance(Worker.__dict__["from_args"], classmethod)
    assert Worker.add_args("p") == ("static", ["args", "p"]) and Worker().add_args("q") == ("static", ["args", "q"])

    class Sub(Worker):
        pass

    assert Worker.from_args("a") == ("class", ("Worker", "a")) and Sub.from_args("b") == ("class", ("Sub", "b"))


def test_install_is_idempotent(toy, patcher):
    calls: list = []
    assert patcher.install("worker.init_distributed", tagging("once", calls)) is True
    assert patcher.install("worker.init_distributed", tagging("twice", calls)) is False
    # A second patcher (e.g. a plugin module imported twice) sees the marker and does not re-wrap.
    other = Patcher(TABLE, plugin="toy-foundry")
    assert other.install("worker.init_distributed", tagging("again", calls)) is False and not other.is_installed(
        "worker.init_distributed")
    assert toy["worker"].init_distributed("c", 0) == ("once", ("init", "c", 0)) and calls == ["once"]


def test_uninstall_all_restores_the_originals(toy, patcher):
    worker = toy["worker"]
    raw = {k: worker.Worker.__dict__[k] for k in ("init_device", "add_args", "from_args")}
    function = worker.init_distributed
    for name in ("worker.init_distributed", "worker.init_device", "cli.add_args", "cli.from_args"):
        assert patcher.install(name, tagging(name))
    patcher.uninstall_all()
    assert worker.init_distributed is function
    assert {k: worker.Worker.__dict__[k] for k in raw} == raw
    assert not patcher.is_installed("cli.from_args")
    with pytest.raises(KeyError):
        patcher.original("cli.from_args")
    assert worker.Worker.from_args("x") == ("Worker", "x")
    assert patcher.install("cli.from_args", tagging("back")) is True  # installable again


def test_missing_attribute_names_engine_seam_and_versions(toy, patcher):
    del toy["worker"].Worker.init_device
    with pytest.raises(SeamError) as err:
        patcher.install("worker.init_device", tagging("x"))
    assert str(err.value) == (
        "toy-foundry: ToyEngine seam 'worker.init_device' (toyengine.worker.Worker.init_device) does not exist "
        "in ToyEngine 9.9.9; this toy-foundry was checked against ToyEngine 1.2.3, 1.3.0 (purpose of the seam: "
        "checks the device). Run ToyEngine with --no-foundry.")
    assert isinstance(err.value, UnsupportedError) and not patcher.is_installed("worker.init_device")


def test_missing_owner_or_module(toy, patcher, monkeypatch):
    monkeypatch.delattr(toy["worker"], "Worker")
    with pytest.raises(SeamError, match=r"'cli.add_args' .* does not exist \(Worker is missing\) in ToyEngine 9.9.9"):
        patcher.install("cli.add_args", tagging("x"))
    table = SeamTable("ToyEngine", "toyengine", ("1.2.3",), (
        Seam("gone", "toyengine.gone", "f", "function", purpose="p"),))
    with pytest.raises(SeamError, match=r"ToyEngine seam 'gone' \(toyengine.gone.f\) cannot be imported"):
        Patcher(table).install("gone", tagging("x"))


def test_refuses_changed_leading_parameters(toy, patcher):
    worker = toy["worker"]
    worker.init_distributed = lambda config, world_rank: None
    with pytest.raises(SeamError) as err:
        patcher.install("worker.init_distributed", tagging("x"))
    text = str(err.value)
    assert "'worker.init_distributed'" in text and "ToyEngine 9.9.9" in text
    assert "takes (config, world_rank), expected parameters starting with (config, rank)" in text
    assert worker.init_distributed(1, 2) is None  # left untouched


def test_refuses_a_changed_kind(toy, patcher):
    toy["worker"].Worker.add_args = lambda self, parser: parser  # no longer a staticmethod
    with pytest.raises(SeamError, match="'cli.add_args' .* is a function, expected a staticmethod"):
        patcher.install("cli.add_args", tagging("x"))


def test_message_without_off_hint_and_default_version(toy):
    del toy["worker"].Worker.run
    table = SeamTable("ToyEngine", "toyengine", ("1.2.3",), (
        Seam("run", "toyengine.worker", "Worker.run", "method", params=("self",), purpose="runs"),))
    with pytest.raises(SeamError) as err:
        Patcher(table, plugin="toy-foundry").install("run", tagging("x"))
    assert str(err.value).endswith("in ToyEngine unknown; this toy-foundry was checked against ToyEngine 1.2.3 "
                                   "(purpose of the seam: runs).")


def test_unknown_seam_name(patcher):
    with pytest.raises(KeyError, match="no ToyEngine seam named 'nope'"):
        patcher.install("nope", tagging("x"))


# ---- contract: sources ---------------------------------------------------------------------------


def results_by_name(root: Path, table: SeamTable = TABLE) -> dict[str, contract.SeamResult]:
    return {r.seam.name: r for r in check_sources(table, directory_reader(root))}


def test_source_checker_accepts_the_toy_tree(tmp_path):
    results = results_by_name(write_tree(tmp_path, TOY_SOURCES))
    assert {n: r.status for n, r in results.items()} == {s.name: contract.OK for s in SEAMS}
    assert results["worker.init_device"].location == "toyengine/worker.py:9"
    assert results["worker.init_device"].signature == "(self, device)"
    assert results["worker.init_distributed"].signature == "(config, rank, backend)"
    assert results["worker.warm"].location == "toyengine/warmup.py:1"
    assert results["config.group"].location == "toyengine/config.py:3"


def test_source_checker_reports_moved_and_changed(tmp_path):
    sources = dict(TOY_SOURCES)
    del sources["toyengine/warmup.py"]
    sources["toyengine/worker.py"] = """
        from toyengine.warmup import warm


        def init_distributed(cfg, rank):
            return None


        class Worker:
            @staticmethod
            def add_args(parser):
                return parser

            def from_args(self, args):
                return args

            def run(self):
                return warm(self)
    """
    sources["toyengine/config.py"] = """
        import enum

        GROUP = "toy.other"


        class Mode(enum.Enum):
            NONE = 0
    """
    results = results_by_name(write_tree(tmp_path, sources))
    status = {n: r.status for n, r in results.items()}
    assert status == {
        "worker.init_distributed": contract.CHANGED, "worker.init_device": contract.MOVED,
        "cli.add_args": contract.OK, "cli.from_args": contract.CHANGED, "worker.warm": contract.MOVED,
        "config.mode": contract.CHANGED, "config.group": contract.CHANGED}
    detail = {n: r.detail for n, r in results.items()}
    assert detail["worker.init_distributed"] == ("parameters (cfg, rank), expected to start with (config, rank); "
                                                 "toyengine/worker.py no longer calls init_distributed() by name")
    assert detail["worker.init_device"] == "Worker.init_device is not defined in toyengine/worker.py"
    assert detail["cli.from_args"] == "Worker.from_args is a method, expected a classmethod"
    assert detail["worker.warm"] == "module toyengine.warmup not found"
    assert detail["config.mode"] == "members missing: FULL"
    assert detail["config.group"] == "value is 'toy.other', expected 'toy.plugins'"
    # config.group is optional: everything else that failed blocks.
    assert [r.seam.name for r in contract.blocking(results.values())] == [
        "worker.init_distributed", "worker.init_device", "cli.from_args", "worker.warm", "config.mode"]


def test_read_only_modules_need_not_call_their_functions(tmp_path):
    root = write_tree(tmp_path, {"toyengine/__init__.py": "", "toyengine/plugins.py": "def load(group):\n    pass\n"})
    seams = (Seam("plugins.load", "toyengine.plugins", "load", "function", params=("group",), purpose="p"),)
    strict = SeamTable("ToyEngine", "toyengine", ("1",), seams)
    relaxed = SeamTable("ToyEngine", "toyengine", ("1",), seams, read_only_modules=("toyengine.plugins",))
    assert results_by_name(root, strict)["plugins.load"].detail == (
        "toyengine/plugins.py no longer calls load() by name")
    assert results_by_name(root, relaxed)["plugins.load"].ok


def test_format_table_and_main(tmp_path, capsys):
    good = write_tree(tmp_path / "good", TOY_SOURCES)
    table = contract.format_table(TABLE, check_sources(TABLE, directory_reader(good)), "1.2.3").splitlines()
    assert table[0].split() == ["seam", "status", "toyengine", "1.2.3", "detail"] and len(table) == len(SEAMS) + 1
    assert table[2].split() == ["worker.init_device", "ok", "toyengine/worker.py:9", "(self,", "device)"]

    assert contract.main(TABLE, [str(good)]) == 0
    assert f"toyengine {good}" in capsys.readouterr().out
    bad = write_tree(tmp_path / "bad", {**TOY_SOURCES, "toyengine/warmup.py": "x = 1\n"})
    assert contract.main(TABLE, [str(bad)]) == 1
    assert "worker.warm" in capsys.readouterr().out
    assert contract.main(TABLE, []) == 2  # no toyengine distribution installed
    assert capsys.readouterr().err.strip() == "ToyEngine is not installed"


# ---- contract: the imported engine ---------------------------------------------------------------


def test_installed_checks_import_and_sources(toy):
    assert contract.installed_root(TABLE) == toy["root"]
    assert [r.status for r in check_installed(TABLE)] == [contract.OK] * len(SEAMS)
    toy["worker"].Worker.from_args = lambda self, args: args  # the import check sees runtime changes
    results = {r.seam.name: r for r in check_installed(TABLE)}
    assert results["cli.from_args"].status == contract.CHANGED
    assert results["cli.from_args"].detail == (
        "toyengine.worker.Worker.from_args is a function, expected a classmethod")
    assert contract.check_import(TABLE.seam("worker.init_device")) is None


def test_check_installed_without_the_engine():
    with pytest.raises(ImportError, match="ToyEngine is not installed"):
        check_installed(TABLE)
