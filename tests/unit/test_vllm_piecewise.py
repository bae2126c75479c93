"""vllm-foundry's piecewise graphs (vLLM's default mode, FULL_AND_PIECEWISE): naming pieces,
collecting them at SAVE, installing restored ones at their first call at LOAD, the mode checks. vLLM's objects
are stood in for by small fakes with the attributes vLLM 0.25 has (see seams.py)."""

from __future__ import annotations

import dataclasses
import logging
import types

import pytest

from foundry_core.errors import FoundryError, InvalidArgumentError, UnsupportedError
from vllm_foundry import capture_patches, modes, piecewise


# vLLM's CUDAGraphMode members, as the plugin reads them: by name.
Mode = types.SimpleNamespace(**{n: types.SimpleNamespace(name=n)
                                for n in ("NONE", "PIECEWISE", "FULL", "FULL_AND_PIECEWISE")})


@dataclasses.dataclass(frozen=True)
class BatchDescriptor:  # vllm.forward_context.BatchDescriptor's fields
    num_tokens: int
    num_reqs: int | None = None
    uniform: bool = False
    has_lora: bool = False
    num_active_loras: int = 0


@dataclasses.dataclass
class Entry:  # vllm.compilation.cuda_graph.CUDAGraphEntry
    batch_descriptor: BatchDescriptor
    cudagraph: object | None = None
    output: object | None = None
    input_addresses: list[int] | None = None


class Tensor:
    is_cuda = True

    def __init__(self, ptr: int):
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


def wrapper(index: int, total: int = 3, prefix: str = "backbone", mode=Mode.PIECEWISE) -> types.SimpleNamespace:
    backend = types.SimpleNamespace(piecewise_compile_index=index, total_piecewise_compiles=total,
                                    vllm_backend=types.SimpleNamespace(prefix=prefix))
    return types.SimpleNamespace(runnable=backend, runtime_mode=mode, concrete_cudagraph_entries={})


@pytest.fixture(autouse=True)
def piecewise_on(monkeypatch):
    monkeypatch.delenv(piecewise.ENV, raising=False)  # on by default
    monkeypatch.setattr(piecewise, "_unavailable", None)  # another test's vLLM may have lacked the seam


def test_pieces_are_named_by_module_index_and_count():
    assert piecewise.wrapper_key(wrapper(2)) == "backbone:2/3"
    assert piecewise.wrapper_key(types.SimpleNamespace(runnable=object())) is None
    name = piecewise.piece_name("backbone:2/3", BatchDescriptor(8))
    assert name == "pw:backbone:2/3:num_tokens=8,num_reqs=None,uniform=False,has_lora=False,num_active_loras=0"
    assert piecewise.is_piece(name) and not piecewise.is_piece("cg_mode=FULL,num_tokens=8")


def test_save_collects_every_captured_piece_with_its_inputs_and_sizes():
    first, last, full = wrapper(0), wrapper(2), wrapper(0, mode=Mode.FULL)
    for w, base in ((first, 0x1000), (last, 0x2000)):
        for n in (8, 1):
            w.concrete_cudagraph_entries[BatchDescriptor(n)] = Entry(BatchDescriptor(n), f"graph{base}-{n}",
                                                                     (Tensor(base + 0x100 + n),), [base + n, 0x9000])
    last.concrete_cudagraph_entries[BatchDescriptor(4)] = Entry(BatchDescriptor(4))  # never captured
    full.concrete_cudagraph_entries[BatchDescriptor(8)] = Entry(BatchDescriptor(8), "full-graph")
    graphs, state = piecewise.collect([last, full, first])
    assert sorted(graphs) == sorted(piecewise.piece_name(k, BatchDescriptor(n))
                                    for k in ("backbone:0/3", "backbone:2/3") for n in (1, 8))
    graph, outputs = graphs[piecewise.piece_name("backbone:2/3", BatchDescriptor(8))]
    assert graph == "graph8192-8" and outputs[0].data_ptr() == 0x2108
    assert state["pieces"] == ["backbone:0/3", "backbone:2/3"]
    assert state["sizes"] == [1, 8]
    assert state["inputs"][piecewise.piece_name("backbone:0/3", BatchDescriptor(1))] == [0x1001, 0x9000]


def test_two_pieces_with_one_name_are_refused():
    with pytest.raises(UnsupportedError, match="same name"):
        piecewise.collect([wrapper(1), wrapper(1)])


def test_the_piecewise_sizes_vllm_wants():
    desc = types.SimpleNamespace
    manager = types.SimpleNamespace(_capture_descs={
        "PIECEWISE": [desc(cg_mode=Mode.PIECEWISE, num_tokens=n) for n in (16, 8)],
        "FULL": [desc(cg_mode=Mode.FULL, num_tokens=4)]})
    assert piecewise.wanted_sizes(manager) == [8, 16]
    assert piecewise.wanted_sizes(types.SimpleNamespace(_capture_descs={"FULL": [desc(cg_mode=Mode.FULL, num_tokens=4)]})) is None


class Restored:
    """A restored graph as Pieces sees it: a name, and instantiate() (which the driver may refuse)."""

    def __init__(self, name: str, refuse: bool = False):
        self.name, self.refuse, self.instantiated = name, refuse, 0

    def instantiate(self) -> None:
        if self.refuse:
            raise FoundryError(f"cuGraphInstantiate of graph 7 ({self.name}): CUDA_ERROR_OUT_OF_MEMORY")
        self.instantiated += 1


def _restored(names_inputs: dict[str, list[int]], pieces: int = 3, asked: list[str] | None = None,
              refused: tuple[str, ...] = ()) -> piecewise.Pieces:
    """Pieces over fake graphs; ``asked`` collects the names whose outputs were asked for; the
    driver refuses to instantiate the graphs named in ``refused``."""
    graphs = {n: Restored(n, refuse=n in refused) for n in names_inputs}

    def outputs(name: str) -> tuple[str]:
        if asked is not None:
            asked.append(name)
        return (f"out:{name}",)

    return piecewise.Pieces(graphs, outputs, {"inputs": names_inputs, "pieces": [f"k{i}" for i in range(pieces)]})


def _context(n: int, mode=Mode.PIECEWISE) -> types.SimpleNamespace:
    return types.SimpleNamespace(cudagraph_runtime_mode=mode, batch_descriptor=BatchDescriptor(n))


def test_load_installs_a_restored_piece_at_its_first_call(caplog):
    w = wrapper(1)
    name = piecewise.piece_name("backbone:1/3", BatchDescriptor(8))
    other = piecewise.piece_name("backbone:1/3", BatchDescriptor(16))
    asked: list[str] = []
    pieces = _restored({name: [0x100, 0x200], other: [0x100]}, pieces=1, asked=asked)
    assert asked == []  # no output tensors made before a piece is installed
    with caplog.at_level(logging.INFO, logger="foundry.vllm"):
        assert pieces.prepare(w, (Tensor(0x100), 3, Tensor(0x200)), Entry, _context(8)) == piecewise.READY
    assert asked == [name]  # only the installed piece's
    entry = w.concrete_cudagraph_entries[BatchDescriptor(8)]
    assert (entry.cudagraph.name, entry.output, entry.input_addresses) == (name, (f"out:{name}",), [0x100, 0x200])
    assert entry.cudagraph.instantiated == 1  # instantiated (a no-op when the restore did it) before vLLM replays it
    assert pieces.installed == 1
    assert "restored pieces in use for num_tokens=8" in caplog.text and "ms to instantiate" in caplog.text
    # Later calls find the entry and change nothing.
    assert pieces.prepare(w, (Tensor(0x999),), Entry, _context(8)) == piecewise.READY
    assert pieces.installed == 1


def test_load_runs_a_piece_eagerly_when_the_driver_refuses_its_graph(caplog):
    w = wrapper(1)
    name = piecewise.piece_name("backbone:1/3", BatchDescriptor(8))
    pieces = _restored({name: [0x100]}, refused=(name,))
    with caplog.at_level(logging.WARNING, logger="foundry.vllm"):
        assert pieces.prepare(w, (Tensor(0x100),), Entry, _context(8)) == piecewise.EAGER
        assert pieces.prepare(w, (Tensor(0x100),), Entry, _context(8)) == piecewise.EAGER  # decided once
    assert BatchDescriptor(8) not in w.concrete_cudagraph_entries and pieces.installed == 0
    assert caplog.text.count("runs without a CUDA graph") == 1
    assert "the driver did not instantiate its graph" in caplog.text and "CUDA_ERROR_OUT_OF_MEMORY" in caplog.text


@pytest.mark.parametrize("value, mode", [(None, "background"), ("", "background"), ("first-use", "first-use"),
                                         (" Restore ", "restore")])
def test_when_pieces_are_instantiated(value, mode):
    env = {} if value is None else {piecewise.INSTANTIATE_ENV: value}
    assert piecewise.instantiation(env) == mode


def test_a_wrong_piece_instantiation_names_the_variable_and_the_choices():
    with pytest.raises(InvalidArgumentError, match="FOUNDRY_VLLM_PIECE_INSTANTIATE='later': choose one of restore, "
                                                   "first-use, background"):
        piecewise.instantiation({piecewise.INSTANTIATE_ENV: "later"})


def test_load_runs_a_piece_eagerly_when_its_inputs_moved(caplog):
    w = wrapper(1)
    name = piecewise.piece_name("backbone:1/3", BatchDescriptor(8))
    asked: list[str] = []
    pieces = _restored({name: [0x100]}, asked=asked)
    with caplog.at_level(logging.WARNING, logger="foundry.vllm"):
        assert pieces.prepare(w, (Tensor(0x180),), Entry, _context(8)) == piecewise.EAGER
        assert pieces.prepare(w, (Tensor(0x100),), Entry, _context(8)) == piecewise.EAGER  # decided once
    assert asked == []
    assert BatchDescriptor(8) not in w.concrete_cudagraph_entries
    assert caplog.text.count("runs without a CUDA graph") == 1 and "not where they were at SAVE" in caplog.text


def test_load_runs_a_piece_eagerly_when_the_archive_lacks_it(caplog):
    w = wrapper(1)
    pieces = _restored({piecewise.piece_name("backbone:1/3", BatchDescriptor(8)): [0x100]})
    with caplog.at_level(logging.WARNING, logger="foundry.vllm"):
        assert pieces.prepare(w, (Tensor(0x100),), Entry, _context(16)) == piecewise.EAGER
    assert "holds no graph" in caplog.text and w.concrete_cudagraph_entries == {}


def test_load_leaves_other_calls_to_vllm():
    w = wrapper(1)
    name = piecewise.piece_name("backbone:1/3", BatchDescriptor(8))
    pieces = _restored({name: [0x100]})
    args = (Tensor(0x100),)
    assert pieces.prepare(w, args, Entry, None) == piecewise.OTHER  # no forward context
    assert pieces.prepare(w, args, Entry, _context(8, Mode.NONE)) == piecewise.OTHER  # warmup, profile, FULL capture
    assert pieces.prepare(wrapper(1, mode=Mode.FULL), args, Entry, _context(8)) == piecewise.OTHER
    assert w.concrete_cudagraph_entries == {} and pieces.installed == 0


def _seam(monkeypatch, rt, context):
    monkeypatch.setattr(capture_patches.runtime, "current", lambda: rt)
    monkeypatch.setattr(capture_patches, "_piece_seams", lambda: (Entry, lambda: context, lambda: True))


def test_the_call_seam_lets_vllm_replay_an_installed_piece(monkeypatch):
    w = wrapper(0)
    name = piecewise.piece_name("backbone:0/3", BatchDescriptor(2))
    rt = types.SimpleNamespace(pieces=_restored({name: [0x10]}))
    _seam(monkeypatch, rt, _context(2))
    seen = []

    def original(self, *args, **kwargs):
        seen.append(self.concrete_cudagraph_entries.get(BatchDescriptor(2)))
        return "replayed"

    assert capture_patches.wrap_piece_call(original)(w, Tensor(0x10)) == "replayed"
    assert seen[0].cudagraph.name == name  # vLLM's own call found the entry


def test_the_call_seam_runs_an_unrestorable_piece_without_vllms_capture(monkeypatch):
    ran = []

    class Backend:  # a PiecewiseBackend: named as before, and callable (the piece without a graph)
        piecewise_compile_index, total_piecewise_compiles = 0, 3
        vllm_backend = types.SimpleNamespace(prefix="backbone")

        def __call__(self, *args, **kwargs):
            ran.append(args)
            return "eager output"

    w = wrapper(0)
    w.runnable = Backend()
    rt = types.SimpleNamespace(pieces=_restored({piecewise.piece_name("backbone:0/3", BatchDescriptor(2)): [0x10]}))
    _seam(monkeypatch, rt, _context(2))

    def original(self, *args, **kwargs):
        raise AssertionError("vLLM would capture this piece in a real batch")

    assert capture_patches.wrap_piece_call(original)(w, Tensor(0x20)) == "eager output"
    assert len(ran) == 1


def test_save_refuses_a_piece_whose_outputs_are_not_tensors():
    w = wrapper(0)
    w.concrete_cudagraph_entries[BatchDescriptor(8)] = Entry(BatchDescriptor(8), "g", (Tensor(1), 7), [1])
    with pytest.raises(UnsupportedError, match=r"piece pw:backbone:0/3:num_tokens=8.* returns int"):
        piecewise.collect([w])


def test_the_default_mode_is_supported_unless_turned_off_and_refuses_what_cannot_be_restored(monkeypatch):
    config = types.SimpleNamespace(compilation_config=types.SimpleNamespace(
        cudagraph_mode=Mode.FULL_AND_PIECEWISE, use_inductor_graph_partition=False))
    monkeypatch.delenv(piecewise.ENV, raising=False)
    assert modes.cudagraph_mode_problem(Mode.FULL_AND_PIECEWISE) is None  # vLLM's default mode
    # Pieces alone: vLLM makes no decode graph and no decode output buffer, so nothing is saved.
    alone = modes.cudagraph_mode_problem(Mode.PIECEWISE)
    assert "pieces without decode graphs are not saved" in alone and "or leave vLLM's default" in alone
    monkeypatch.setenv(piecewise.ENV, "0")
    problem = modes.cudagraph_mode_problem(Mode.FULL_AND_PIECEWISE)
    assert "FULL_AND_PIECEWISE is not supported" in problem and f"{piecewise.ENV}=0" in problem
    assert "pass -cc.cudagraph_mode=FULL_DECODE_ONLY;" in problem  # not "leave vLLM's default": refused too
    assert "supported: FULL_DECODE_ONLY)" in problem
    monkeypatch.delenv(piecewise.ENV, raising=False)
    # A vLLM without the piece seam: the piecewise modes are refused, naming the seam.
    monkeypatch.setattr(piecewise, "_unavailable", "seam piece.call: CUDAGraphWrapper.__call__ is missing")
    assert not piecewise.enabled()
    assert "lacks a seam" in modes.cudagraph_mode_problem(Mode.FULL_AND_PIECEWISE)
    monkeypatch.setattr(piecewise, "_unavailable", None)
    assert "FULL_DECODE_ONLY or leave vLLM's default" in modes.cudagraph_mode_problem(Mode.FULL)
    assert "-cc.mode=none" in modes.cudagraph_mode_problem(Mode.NONE)
    assert modes.piecewise_problems(config, environ={}) == []
    config.compilation_config.use_inductor_graph_partition = True
    assert "use_inductor_graph_partition" in modes.piecewise_problems(config, environ={})[0]
    config.compilation_config.use_inductor_graph_partition = False
    assert "BREAKABLE" in modes.piecewise_problems(config, environ={"VLLM_USE_BREAKABLE_CUDAGRAPH": "1"})[0]
    # Pieces with tensor parallel (all-reduces inside the pieces) restore like the FULL graphs.
    config.parallel_config = types.SimpleNamespace(tensor_parallel_size=2)
    assert modes.piecewise_problems(config, environ={}) == []


def test_cpu_weight_offload_is_refused():
    config = types.SimpleNamespace(
        model_config=types.SimpleNamespace(enforce_eager=False),
        compilation_config=types.SimpleNamespace(cudagraph_mode=Mode.FULL_AND_PIECEWISE),
        offload_config=types.SimpleNamespace(uva=types.SimpleNamespace(cpu_offload_gb=4),
                                             prefetch=types.SimpleNamespace(offload_group_size=0)))
    problems = modes.unsupported_settings(config, use_v2_model_runner=True)
    assert any("CPU weight offload" in p for p in problems)


def test_load_checks_the_archives_pieces_against_the_sizes_vllm_wants():
    desc = types.SimpleNamespace
    manager = types.SimpleNamespace(_capture_descs={"PIECEWISE": [desc(cg_mode=Mode.PIECEWISE, num_tokens=n)
                                                                     for n in (8, 1)]})
    piece = types.SimpleNamespace(name=piecewise.piece_name("backbone:0/1", BatchDescriptor(8)))
    full = types.SimpleNamespace(name="cg_mode=FULL,num_tokens=8")
    assert capture_patches._pieces_problem(manager, [piece, full], {"piecewise": {"sizes": [1, 8]}}) is None
    assert "sizes" in capture_patches._pieces_problem(manager, [piece], {"piecewise": {"sizes": [8]}})
    assert "pieces" in capture_patches._pieces_problem(manager, [full], {})
    no_pieces_wanted = types.SimpleNamespace(_capture_descs={})
    assert capture_patches._pieces_problem(no_pieces_wanted, [full], {}) is None
    assert "vLLM captures none" in capture_patches._pieces_problem(no_pieces_wanted, [piece, full], {})
