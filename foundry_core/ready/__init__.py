"""Time to ready as users measure it: an engine's server started in rounds of each kind
(unmodified on warm and on empty caches, SAVE, LOAD on warm and on empty caches), each start timed
from exec to its first completion through its phases.

Use it as ``foundry ready vllm|sglang MODEL ...`` (cli.py); in Python::

    from foundry_core.ready import Options, Run, ServerSpec, engine
    spec = ServerSpec(engine("sglang"), "/models/tiny", "python3", ("--load-format", "dummy"))
    result = Run(Options(spec, ("base-warm", "save", "load-warm"), 3, Path("out"))).execute()

``Options`` and ``Run`` load the harness (HTTP client, process handling, tables) on first use, so
that importing the tables of engines and kinds, as `foundry --help` does, stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from foundry_core.ready.engines import ENGINES, PHASES, Engine, engine
from foundry_core.ready.kinds import KINDS, ServerSpec, StartPlan, Step, plan, schedule

if TYPE_CHECKING:
    from foundry_core.ready.harness import Options, Run

__all__ = ["ENGINES", "KINDS", "PHASES", "Engine", "Options", "Run", "ServerSpec", "StartPlan", "Step", "engine",
           "plan", "schedule"]


def __getattr__(name: str):
    if name in ("Options", "Run"):
        from foundry_core.ready import harness

        return getattr(harness, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
