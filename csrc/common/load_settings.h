// The settings Foundry's own threads need (the images thread, the registry's workers), read from
// the environment once: when the library is loaded (on the thread that loads it, before any of
// those threads exist), not at each use. A read at each use from such a thread could race with
// the engine changing os.environ on its own thread (glibc's setenv may move the environment
// while getenv walks it). The setters are for tests and for programs that choose in code.
#pragma once

#include <cstddef>

namespace foundry {

// FOUNDRY_READ_MAP: archive files are mapped (default) or, with "0", copied (archive/file_bytes.h).
bool map_archive_files();
void set_map_archive_files(bool map);

// FOUNDRY_IMAGE_THREADS: threads for reading and loading kernel images (modules/registry.h);
// 0 when not set or 0 (the registry's default: one for driver loads, several for lazy reads).
size_t image_threads_setting();
void set_image_threads_setting(size_t threads);

// FOUNDRY_NODE_PRIORITY: restored execs honour each kernel node's captured priority, as PyTorch's
// do (default); with "0" they run at the priority of the stream they are launched into
// (graph/exec_flags.h). For comparing the two on a workload.
bool use_node_priority();
void set_use_node_priority(bool use);

}  // namespace foundry
