"""The restore's steps as the engine plugins log them."""

from __future__ import annotations

from foundry_core.graphs import LoadTimes


def test_breakdown_names_every_step_of_the_restore_in_order():
    times = LoadTimes(images_s=0.004, read_s=0.012, claim_s=0.03, build_s=0.031, update_s=0.026, instantiate_s=0.271,
                      outputs_s=0.118)
    assert times.breakdown() == ("images 0.00 s, read 0.01 s, claims 0.03 s, build 0.03 s, deltas 0.03 s, "
                                 "instantiate 0.27 s, outputs 0.12 s")
