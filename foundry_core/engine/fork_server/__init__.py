"""The fork server: an engine's child processes forked from a process that has already imported
the engine (:mod:`.client` in the main process, :mod:`.preload` in the fork server,
:mod:`.device_facts` for its imports). Imports nothing: the early starts import :mod:`.client` at
interpreter start-up."""
