"""GraphArchive.native_times / graphs._native_times: the native load times read now (no GPU: the
native call is replaced)."""

import ctypes

from foundry_core import _native, graphs


def test_native_times_copy_every_field(monkeypatch):
    def call(name, handle, count, templates, times):
        assert name == "foundry_graphset_info" and count is None and templates is None
        t = times._obj
        t.read_s, t.claim_s, t.build_s, t.update_s, t.mapped_blocks, t.existing_blocks = 0.5, 0.1, 0.2, 0.3, 7, 2

    monkeypatch.setattr(_native, "call", call)
    t = graphs._native_times(ctypes.c_void_p())
    assert (t.read_s, t.claim_s, t.build_s, t.update_s, t.mapped_blocks, t.existing_blocks) == (0.5, 0.1, 0.2, 0.3, 7, 2)
    assert t.instantiate_s == 0.0 and t.images_s == 0.0  # not native: measured by load_graphs
