"""The names of the files an engine's archive holds beside each rank's manifest.

They belong to the archive format: ``foundry verify`` (the core) checks an archive by them, and
the engine layer (:mod:`foundry_core.engine`) writes and reads the files under them.

::

    <archive>/engine.json                  ENGINE_INFO_NAME: the engine and topology (layout.py)
    <archive>/host_caches/<sha256>         CACHES_DIR, files named as BLOB_NAME matches (host_caches.py)
    <archive>/rank<r>/engine_state.json    STATE_NAME: what SAVE measured (state.py)
    <archive>/rank<r>/host_caches.json     LIST_NAME: rank r's carried files (host_caches.py)
"""

from __future__ import annotations

import re

__all__ = ["BLOB_NAME", "CACHES_DIR", "ENGINE_INFO_NAME", "LIST_NAME", "STATE_NAME"]

ENGINE_INFO_NAME = "engine.json"
STATE_NAME = "engine_state.json"
CACHES_DIR = "host_caches"
LIST_NAME = "host_caches.json"
BLOB_NAME = re.compile(r"[0-9a-f]{64}")  # a carried file's name: the SHA-256 of its content
