"""By-value parameter structs with stale slots (ATen's cat, stack and foreach kernels): SAVE keeps a
word that points into freed region memory as a value, and the restored graphs are bit-identical
in a fresh process; FOUNDRY_STRICT=1 refuses such a word and says why."""

from __future__ import annotations

import os
import re

import pytest

pytestmark = pytest.mark.gpu


def _env(tmp_path, **extra: str) -> dict[str, str]:
    # FOUNDRY_LOG=debug: the SAVE log shows every per-graph summary line, whatever its level.
    env = dict(os.environ, FOUNDRY_LOG="debug", FOUNDRY_TEST_TMP=str(tmp_path))
    env.pop("FOUNDRY_STRICT", None)
    env.update(extra)
    return env


def _summary(log: list[str], name: str) -> str | None:
    """SAVE's summary line for graph ``name`` about words into freed memory, if it wrote one."""
    return next((line for line in log if f"({name})" in line and "freed" in line), None)


def _counts(line: str, name: str) -> list[int]:
    """The numbers between the graph's name and the word "freed" (where the count stands)."""
    return [int(n) for n in re.findall(r"\b\d+\b", line.split(f"({name})", 1)[1].split("freed", 1)[0])]


def _check_summaries(saved: dict, report) -> None:
    """Where a graph holds words into freed region memory, SAVE's log has one summary line for
    it reporting their count; where none was seen, the output says so."""
    for name, words in saved["stale"].items():
        line = _summary(saved["log"], name)
        if not words:
            report(f"{name}: no parameter word points into freed region memory on this host stack")
            assert line is None, f"{name}: SAVE reports words into freed memory that the graph does not hold: {line}"
            continue
        report(f"{name}: {len(words)} words into freed region memory, e.g. {words[0]}; SAVE logged: {line}")
        assert line is not None, f"{name}: SAVE logged no summary line for {len(words)} stale words: {saved['log']}"
        assert len(words) in _counts(line, name), (
            f"{name}: the summary line does not report the {len(words)} words found in the graph: {line}")
        lines = [ln for ln in saved["log"] if f"({name})" in ln and "freed" in ln]
        assert len(lines) == 1, f"{name}: one summary line per graph, not one per word: {lines}"


@pytest.mark.parametrize("case", ["block", "block-single"])
def test_cat_stack_and_foreach_graphs_restore_bit_identical(case, program, tmp_path, report):
    saved = program("byvalue_probe", "save", case, str(tmp_path / "archive"), env=_env(tmp_path))
    assert "error" not in saved, f"SAVE refused the graphs without FOUNDRY_STRICT: {saved.get('message')}"
    kernels = saved["kernels"]
    assert any("CatArrayBatchedCopy" in k for k in kernels), kernels
    assert any("multi_tensor_apply_kernel" in k for k in kernels), kernels
    report(f"\n{case}: temporaries freed before capture at {saved['temporaries']}")
    _check_summaries(saved, report)
    loaded = program("byvalue_probe", "load", case, str(tmp_path / "archive"), env=_env(tmp_path))
    assert loaded["digests"] == saved["digests"]


def test_a_word_into_freed_memory_is_kept_verbatim(program, tmp_path, report):
    """An int64 add whose by-value scalar is the address of a freed region temporary: the stale
    word exists whatever the host stack holds, and LOAD must keep its value."""
    saved = program("byvalue_probe", "save", "planted", str(tmp_path / "archive"), env=_env(tmp_path))
    assert "error" not in saved, f"SAVE refused the graph without FOUNDRY_STRICT: {saved.get('message')}"
    assert [w["word"] for w in saved["stale"]["planted"]] == [saved["planted"]], saved["stale"]
    assert saved["planted_kept"]
    _check_summaries(saved, report)
    loaded = program("byvalue_probe", "load", "planted", str(tmp_path / "archive"), env=_env(tmp_path))
    assert loaded["difference"] == [int(saved["planted"], 16)]
    assert loaded["digests"] == saved["digests"]


def test_strict_mode_refuses_a_word_into_freed_memory_and_says_why(program, tmp_path, report):
    saved = program("byvalue_probe", "save", "planted", str(tmp_path / "archive"),
                    env=_env(tmp_path, FOUNDRY_STRICT="1"))
    assert saved.get("error") == "AuditError", saved
    message = saved["message"]
    report(f"\nstrict SAVE: {message}")
    assert "freed" in message and "strict" in message.lower(), message
    assert saved["planted"] in message, "the refusal names the word"
    assert not (tmp_path / "archive").exists(), "a refused SAVE must leave no archive"
