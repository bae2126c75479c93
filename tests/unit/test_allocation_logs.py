"""Allocation-log comparison (pure Python; the logs themselves come from the region)."""

from __future__ import annotations

from foundry_core.region import LogEntry, compare_logs, compare_placements, placement_divergence

SAVED = [
    LogEntry(0, "alloc", 0x000000, 2 << 20, "weights"),
    LogEntry(1, "alloc", 0x200000, 20 << 20, "inputs"),
    LogEntry(2, "alloc", 0x1600000, 2 << 20, "warmup"),
    LogEntry(3, "free", 0x1600000, 2 << 20, "capture"),
    LogEntry(4, "alloc", 0x1600000, 4 << 20, "graph pool"),
]


def test_a_load_that_places_a_prefix_agrees():
    current = [SAVED[0], LogEntry(1, "alloc", 0x200000, 20 << 20), LogEntry(2, "free", 0x200000, 20 << 20)]
    # Frees differ harmlessly (LOAD skips the warmup); only placements are compared.
    assert compare_placements(SAVED, current) is None


def test_a_buffer_placed_elsewhere_is_named_by_sequence_number():
    current = [SAVED[0], LogEntry(1, "alloc", 0x200000, 22 << 20, "inputs")]
    d = compare_placements(SAVED, current)
    assert d is not None and d.seq == 1
    assert d.expected.size == 20 << 20 and d.actual.size == 22 << 20
    assert "diverged at seq 1" in str(d) and "inputs" in str(d)


def test_more_placements_than_saved_is_a_divergence():
    placed = [e for e in SAVED if e.kind == "alloc"]
    current = [LogEntry(i, e.kind, e.offset, e.size) for i, e in enumerate(placed)]
    current.append(LogEntry(len(current), "alloc", 0x1a00000, 2 << 20))
    d = compare_placements(SAVED, current)
    assert d is not None and d.expected is None and d.actual.seq == len(placed)
    assert "expected nothing" in str(d)


def test_compare_logs_reports_the_first_difference_of_any_event():
    other = list(SAVED)
    other[3] = LogEntry(3, "free", 0x200000, 20 << 20)
    d = compare_logs(SAVED, other)
    assert d is not None and d.seq == 3
    assert compare_logs(SAVED, SAVED[:3]) is None


def test_a_claim_of_the_block_save_allocated_there_stands_for_that_allocation():
    # LOAD claims SAVE's graph pool (placed by a capture it does not redo), then places more.
    saved = SAVED + [LogEntry(5, "alloc", 0x1a00000, 2 << 20, "decode inputs")]
    current = [SAVED[0], SAVED[1], SAVED[2], SAVED[3], LogEntry(4, "claim", 0x1600000, 4 << 20),
               LogEntry(5, "alloc", 0x1a00000, 2 << 20)]
    assert compare_placements(saved, current) is None


def test_other_claims_are_not_placements_but_a_buffer_after_them_must_still_agree():
    saved = SAVED + [LogEntry(5, "alloc", 0x1a00000, 2 << 20, "decode inputs")]
    # A claim of another block than SAVE's at that position (a restore's graph memory) is skipped...
    current = [SAVED[0], LogEntry(1, "claim", 0x4000000, 2 << 20), LogEntry(2, "alloc", 0x200000, 20 << 20)]
    assert compare_placements(saved, current) is None
    # ...and does not excuse a buffer placed elsewhere.
    current = [*SAVED[:4], LogEntry(4, "claim", 0x1600000, 2 << 20), LogEntry(5, "alloc", 0x1a00000, 2 << 20)]
    d = compare_placements(saved, current)
    assert d is not None and d.seq == 5 and d.expected.offset == 0x1600000


def test_the_divergence_message_names_the_events_before_it_on_both_sides():
    current = [SAVED[0], LogEntry(1, "alloc", 0x200000, 22 << 20, "inputs")]
    message = placement_divergence(SAVED, current)
    assert message.startswith("allocation sequence diverged at seq 1")
    assert "before it, at SAVE: alloc 0x200000 at 0x0 (weights); here: alloc 0x200000 at 0x0 (weights)" in message
    assert placement_divergence(SAVED, SAVED[:2]) is None
