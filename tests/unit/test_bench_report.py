"""The bench report's tables from a result dict (no GPU: the numbers are made up here)."""

from rich.console import Console

from foundry_core.bench import report


def _result(same_process) -> dict:
    load = {"phases_s": {"images": 0.1}, "all_ready_s": 1.0, "first_replay_s": 0.5,
            "latency_us": {"1": 101.0, "8": 200.0}, "launch_us": {"1": 30.0, "8": 31.0}}
    return {"modes": ["eager"], "identical": {"eager": True}, "archive_bytes": 3000, "image_bytes": 1000,
            "save": {"graphs": 2, "groups": 1, "nodes": 10, "warmup_s": 1.0, "capture_s": 2.0,
                     "latency_us": {"1": 100.0, "8": 200.0}, "launch_us": {"1": 40.0, "8": 41.0},
                     "same_process_latency_us": same_process, "native_instantiate_s": 0.25},
            "load": {"eager": load}}


def _render(renderable) -> str:
    console = Console(width=250, record=True)
    console.print(renderable)
    return console.export_text()


def test_latency_table_gives_both_comparisons_and_launch_times():
    same = {"1": {"captured": 100.0, "restored": 100.5}, "8": {"captured": 200.0, "restored": 198.0}}
    text = _render(report.latency_table(_result(same)))
    assert "+1.00%" in text  # cross-process, batch 1: 101 vs 100
    assert "+0.50%" in text  # same process, batch 1
    assert "-1.00%" in text  # same process, batch 8
    assert "40.0" in text and "30.0" in text  # host launch times


def test_report_names_why_the_same_process_comparison_is_missing():
    console = Console(width=250, record=True)
    report.print_report(_result({"error": "MismatchError: region"}), "t", console)
    text = console.export_text()
    assert "same-process comparison not made: MismatchError: region" in text
    assert "instantiates the 2 captured graphs again in 0.25 s" in text


def test_latency_table_absent_without_latency_numbers():
    r = _result({})
    r["save"]["latency_us"] = {}
    assert report.latency_table(r) is None


def test_first_replay_table_lists_each_modes_phases():
    r = _result({})
    r["load"]["lazy"] = dict(r["load"]["eager"], first_replay_phases_s={
        "delta_read": 0.001, "images_attributes_template_build": 0.0812, "delta_writes": 0.002, "replay": 0.018,
        "instantiation_and_first_launch": 0.0121})
    text = _render(report.first_replay_table(r))
    assert "lazy" in text and "0.0812" in text and "0.0121" in text
    assert "eager" not in text  # a mode without the breakdown gets no row


def test_first_replay_table_absent_without_breakdowns():
    assert report.first_replay_table(_result({})) is None


def test_first_replay_phases_split_the_time_between_native_phases_and_the_rest():
    from types import SimpleNamespace

    from foundry_core.bench import worker

    replays = []
    graph = SimpleNamespace(replay=lambda: replays.append(1))
    torch = SimpleNamespace(cuda=SimpleNamespace(synchronize=lambda: None))
    before = SimpleNamespace(read_s=0.10, build_s=0.05, update_s=0.0)
    after = SimpleNamespace(read_s=0.11, build_s=0.13, update_s=0.02)
    phases = worker._first_replay_phases(torch, graph, before, after, total_s=0.2)
    assert replays == [1]  # the second replay, timed on its own
    assert abs(phases["delta_read"] - 0.01) < 1e-9 and abs(phases["images_attributes_template_build"] - 0.08) < 1e-9
    assert abs(phases["delta_writes"] - 0.02) < 1e-9
    rest = 0.2 - 0.01 - 0.08 - 0.02 - phases["replay"]
    assert abs(phases["instantiation_and_first_launch"] - rest) < 1e-9
