"""vllm-foundry: vLLM starts from a Foundry archive of its CUDA graphs (no fork, no source edits).

Installed, it registers under vLLM's ``vllm.general_plugins`` entry point
(``vllm_foundry.register:register``). This package imports nothing itself: the start-up hook
imports ``fork_server.py`` before anything else, and the fork server starts sooner without the
engine layer's imports, which vLLM's plugin load does anyway.
``vllm serve MODEL --foundry-archive DIR`` (or ``FOUNDRY_ARCHIVE=DIR`` for the offline ``LLM``
API): the first start captures as usual and writes the archive, later starts restore it.
Everything here imports without vLLM; vLLM is imported only by the seams, when Foundry is active.
Each module imports only those below it: config reading and the seams at the bottom, the mode
checks (piecewise, ranks, modes), the adapter, the runtime, the patches, the activation and the
CLI seam, and register (the entry point) on top.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
