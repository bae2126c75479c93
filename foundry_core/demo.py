"""`foundry demo`: SAVE then LOAD of decode graphs of the built-in model."""

from __future__ import annotations

import argparse
import sys


def main(args: argparse.Namespace) -> int:
    # The graph SAVE/LOAD layer and the built-in decoder model are not part of this release yet.
    print(
        "foundry demo needs the graph SAVE/LOAD layer and the built-in decoder model, which are not "
        "in this version yet. What works today: `foundry doctor` (driver, GPU, preload, region) and "
        "`foundry run -- CMD` (deterministic region and kernel-image capture under the preload).",
        file=sys.stderr,
    )
    return 2
