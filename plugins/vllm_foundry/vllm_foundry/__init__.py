"""vllm-foundry: vLLM starts from a Foundry archive of its CUDA graphs (no fork, no source edits).

Installed, it registers under vLLM's ``vllm.general_plugins`` entry point (``register`` below).
``vllm serve MODEL --foundry-archive DIR`` (or ``FOUNDRY_ARCHIVE=DIR`` for the offline ``LLM``
API): the first start captures as usual and writes the archive, later starts restore it.
Everything here imports without vLLM; vLLM is imported only by the seams, when Foundry is active.
"""

from __future__ import annotations

from vllm_foundry.register import register

__version__ = "0.1.0"
__all__ = ["register", "__version__"]
