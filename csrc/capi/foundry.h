/* The C surface of libfoundry.so: the only functions Python (ctypes) calls.
 *
 * Conventions:
 *   - Every function returns a foundry_status. On failure, foundry_last_error() returns a message
 *     naming the cause (per calling thread, valid until that thread's next failing call).
 *   - Out-parameters are written only on success.
 *   - Nothing here aborts the process.
 */
#ifndef FOUNDRY_CAPI_FOUNDRY_H_
#define FOUNDRY_CAPI_FOUNDRY_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FOUNDRY_API __attribute__((visibility("default")))

typedef enum foundry_status {
  FOUNDRY_OK = 0,
  FOUNDRY_ERR_INVALID_ARGUMENT = 1, /* a bad argument from the caller */
  FOUNDRY_ERR_CUDA = 2,             /* a driver call failed; the message names it and its CUresult */
  FOUNDRY_ERR_NO_DRIVER = 3,        /* libcuda.so.1 could not be loaded (no GPU driver) */
  FOUNDRY_ERR_NO_CONTEXT = 4,       /* no CUDA context and none could be made current */
  FOUNDRY_ERR_STATE = 5,            /* the call does not fit the current state (e.g. no region set) */
  FOUNDRY_ERR_FIXED_ADDRESS = 6,    /* the driver refused a reservation at the requested address */
  FOUNDRY_ERR_REGION_EXHAUSTED = 7, /* an allocation does not fit in the region */
  FOUNDRY_ERR_DIVERGENCE = 8,       /* the allocation sequence differs from the expected one */
  FOUNDRY_ERR_IO = 9,               /* a file could not be read or written */
  FOUNDRY_ERR_FORMAT = 10,          /* corrupt, truncated or foreign data */
  FOUNDRY_ERR_VERSION = 11,         /* a format version this build does not read */
  FOUNDRY_ERR_UNSUPPORTED = 12,     /* something Foundry cannot persist (e.g. a host node) */
  FOUNDRY_ERR_NOT_FOUND = 13,       /* a named thing (image, kernel, file) does not exist */
  FOUNDRY_ERR_BUSY = 14,            /* the resource is still in use */
  FOUNDRY_ERR_AUDIT = 15,           /* the pointer audit refused a graph */
  FOUNDRY_ERR_MISMATCH = 16,        /* a fingerprint or checksum does not match */
} foundry_status;

FOUNDRY_API const char* foundry_last_error(void);
FOUNDRY_API const char* foundry_version(void);

/* ---- runtime / diagnostics ---------------------------------------------------------------- */

/* 1 when this copy of the library was loaded through LD_PRELOAD (so driver calls are seen). */
FOUNDRY_API int foundry_preload_active(void);
/* Counters of what interposition has seen: index 0 = cuGetProcAddress lookups answered with a
 * Foundry handler, 1 = dlsym lookups answered with a handler, 2 = allocations seen,
 * 3 = image loads seen. Returns the count or -1 for an unknown index. */
FOUNDRY_API int64_t foundry_intercept_counter(int index);
/* Loads libcuda (if needed), initialises the driver, and reports its version (e.g. 13000). */
FOUNDRY_API foundry_status foundry_driver_version(int* version);
FOUNDRY_API foundry_status foundry_device_info(int device, char* name, size_t name_len, int* cc_major,
                                               int* cc_minor, uint64_t* total_mem);
/* Log level: 0 debug, 1 info, 2 warning, 3 error. Also read from FOUNDRY_LOG at load. */
FOUNDRY_API void foundry_set_log_level(int level);
/* Strict mode: fallbacks become errors. Also read from FOUNDRY_STRICT at load. */
FOUNDRY_API void foundry_set_strict(int strict);
FOUNDRY_API int foundry_get_strict(void);

/* ---- deterministic region --------------------------------------------------------------- */

FOUNDRY_API foundry_status foundry_region_set(uint64_t base, uint64_t size);
FOUNDRY_API foundry_status foundry_region_release(void);
FOUNDRY_API foundry_status foundry_region_stop(void);
FOUNDRY_API foundry_status foundry_region_resume(void);
/* active: 1 when allocations currently go to the region. */
FOUNDRY_API foundry_status foundry_region_info(uint64_t* base, uint64_t* size, int* active,
                                               uint64_t* cursor_offset, uint64_t* high_water_offset,
                                               uint64_t* live_bytes, uint64_t* live_count);
FOUNDRY_API foundry_status foundry_region_get_offset(uint64_t* offset);
/* Moves the cursor forward to `offset` and seals everything below it (freed space below is not
 * reused), so later allocations no longer depend on what happened before. */
FOUNDRY_API foundry_status foundry_region_set_offset(uint64_t offset);
FOUNDRY_API foundry_status foundry_region_preallocate(uint64_t size);
FOUNDRY_API foundry_status foundry_region_free_preallocated(void);
/* Direct allocation through the region (what the cuMemAlloc handler does). */
FOUNDRY_API foundry_status foundry_region_alloc(uint64_t size, uint64_t* ptr);
FOUNDRY_API foundry_status foundry_region_free(uint64_t ptr);
/* Makes [base+offset, base+offset+size) a live region allocation, mapping it if needed. The range
 * must be free, or be exactly one live allocation (then nothing happens and *mapped is 0). */
FOUNDRY_API foundry_status foundry_region_claim(uint64_t offset, uint64_t size, int* mapped);
/* Classifies an address: 0 outside the region, 1 inside a live allocation, 2 inside the region
 * but not in a live allocation. alloc_offset/alloc_size describe the live allocation (kind 1). */
FOUNDRY_API foundry_status foundry_region_classify(uint64_t addr, int* kind, uint64_t* alloc_offset,
                                                   uint64_t* alloc_size);
/* Driver calls made by the region's allocation paths since the region was set (for tests of the
 * preallocation fast path). */
FOUNDRY_API foundry_status foundry_region_driver_calls(uint64_t* calls);

/* Allocation log. Kinds: 0 alloc, 1 free, 2 reserve, 3 unreserve, 4 outside (fallback),
 * 5 seal (set_offset), 6 prealloc, 7 claim. */
typedef struct foundry_log_entry {
  uint64_t seq;
  uint64_t offset;
  uint64_t size;
  uint32_t kind;
  uint32_t tag; /* index into the tag table (foundry_region_log_tag) */
} foundry_log_entry;

/* Sets the tag recorded with later events (e.g. "capture bs=8"); returns its index. */
FOUNDRY_API foundry_status foundry_region_set_tag(const char* tag, uint32_t* index);
FOUNDRY_API foundry_status foundry_region_log_size(uint64_t* count);
/* Copies up to `capacity` entries starting at `first` into out; *written gets the count. */
FOUNDRY_API foundry_status foundry_region_log_read(uint64_t first, foundry_log_entry* out,
                                                   uint64_t capacity, uint64_t* written);
FOUNDRY_API foundry_status foundry_region_log_tag(uint32_t index, char* buf, size_t buf_len);
/* Installs an expected log: every later region event is compared with the entry of the same
 * sequence number; the first divergence is kept and, in strict mode, fails that allocation. */
FOUNDRY_API foundry_status foundry_region_expect(const foundry_log_entry* entries, uint64_t count);
/* *diverged = 1 and the details when a divergence was seen since foundry_region_expect. */
FOUNDRY_API foundry_status foundry_region_divergence(int* diverged, foundry_log_entry* expected,
                                                     foundry_log_entry* actual);

/* ---- kernel images ---------------------------------------------------------------------- */

/* Image container kinds as classified from their first bytes. */
typedef enum foundry_image_kind {
  FOUNDRY_IMAGE_UNKNOWN = 0,
  FOUNDRY_IMAGE_FATBIN_WRAPPER = 1, /* __fatBinC_Wrapper_t, magic 0x466243B1 */
  FOUNDRY_IMAGE_FATBIN = 2,         /* fatbin container, magic 0xBA55ED50 */
  FOUNDRY_IMAGE_CUBIN = 3,          /* ELF */
  FOUNDRY_IMAGE_PTX = 4,            /* NUL-terminated text */
} foundry_image_kind;

typedef struct foundry_image_record {
  uint64_t hash;          /* content hash (xxh64 of the image bytes; wrappers: of their segments) */
  uint64_t size;          /* bytes of the image */
  uint32_t kind;          /* foundry_image_kind */
  uint32_t loader;        /* 0 module (cuModuleLoad*), 1 library (cuLibraryLoad*) */
  uint32_t segments;      /* fatbin segments (wrapper v2 with -rdc can have several) */
  uint32_t entry_count;   /* kernels found in the image */
  uint32_t nvshmem;       /* 1 when the image references NVSHMEM device state */
  uint32_t from_archive;  /* 1 when read by foundry_images_load or _load_lazy (handed to the driver then,
                             or for _load_lazy at first need) */
} foundry_image_record;

FOUNDRY_API foundry_status foundry_images_count(uint64_t* count);
FOUNDRY_API foundry_status foundry_images_get(uint64_t index, foundry_image_record* out);
/* Entry (kernel) names of an image: copies the i-th name of image `hash`. */
FOUNDRY_API foundry_status foundry_image_entry_name(uint64_t hash, uint32_t i, char* buf, size_t buf_len);
/* Maps a CUfunction (or CUkernel) handle to (image hash, entry name). */
FOUNDRY_API foundry_status foundry_function_lookup(uint64_t handle, uint64_t* image_hash, char* name,
                                                   size_t name_len);
/* Writes the images with the given hashes into `dir` (content-addressed files). arch: the compute
 * capability (e.g. 90) whose cubin is extracted from fatbins, or 0 to keep fatbins whole. */
FOUNDRY_API foundry_status foundry_images_pack(const char* dir, const uint64_t* hashes, uint64_t count,
                                               int arch);
/* Loads every image packed in `dir`; *loaded gets the number of images. _lazy reads and checks
 * them now but hands each to the driver only when one of its kernels is first resolved (or the
 * process loads an identical image itself). */
FOUNDRY_API foundry_status foundry_images_load(const char* dir, uint64_t* loaded);
FOUNDRY_API foundry_status foundry_images_load_lazy(const char* dir, uint64_t* loaded);
/* Resolves (image hash, entry name) to a CUfunction of the current context. */
FOUNDRY_API foundry_status foundry_function_resolve(uint64_t image_hash, const char* name, uint64_t* func);
/* The cache preference (CUfunc_cache: 0 none, 1 shared, 2 L1, 3 equal) last set on a CUfunction in
 * this process: by the process through cuFuncSetCacheConfig (seen by the preload), or by LOAD for a
 * restored graph's kernel. 0 when none was set. The driver itself has no way to read it back. */
FOUNDRY_API foundry_status foundry_function_cache_config(uint64_t func, int32_t* config);
/* Runs nvshmemx_cumodule_init / nvshmemx_culibrary_init for loaded images that need it. */
FOUNDRY_API foundry_status foundry_images_init_nvshmem(uint64_t* initialised);

/* Pure parsing helpers (no driver): classify an image and measure its size. For a wrapper the
 * pointers inside it are followed, so it must come from this process's memory. */
FOUNDRY_API foundry_status foundry_image_inspect(const void* data, uint64_t max_size, uint32_t* kind,
                                                 uint64_t* size, uint32_t* segments);
/* Extracts the uncompressed cubin for `arch` from a fatbin; *out_size 0 when there is none. The
 * cubin is copied into out (capacity bytes); with out NULL only the size is reported. */
FOUNDRY_API foundry_status foundry_fatbin_extract_cubin(const void* fatbin, uint64_t size, int arch,
                                                        void* out, uint64_t capacity, uint64_t* out_size);
FOUNDRY_API uint64_t foundry_hash64(const void* data, uint64_t size, uint64_t seed);

/* ---- graphs ------------------------------------------------------------------------------ */

/* The CUfunction of every kernel node of a CUgraph (top level), in node order. */
FOUNDRY_API foundry_status foundry_graph_kernel_functions(uint64_t graph, uint64_t* out, uint64_t capacity,
                                                          uint64_t* count);
/* Every edge of a CUgraph as two words: (from node index << 16 | to node index) and
 * (type | from_port << 8 | to_port << 16), type 0 = full dependency, 1 = programmatic.
 * `edges` holds 2 * capacity words; *count gets the number of edges. */
FOUNDRY_API foundry_status foundry_graph_edges(uint64_t graph, uint32_t* edges, uint64_t capacity, uint64_t* count);

typedef struct foundry_save_stats {
  uint32_t graphs;
  uint32_t templates; /* topology groups */
  uint64_t nodes;
  uint32_t images;
} foundry_save_stats;

/* SAVE: read graphs (audit included), then write the payload file and <images_root>/images/. */
FOUNDRY_API foundry_status foundry_saver_new(void** out);
FOUNDRY_API foundry_status foundry_saver_add(void* saver, uint64_t graph, const char* name);
FOUNDRY_API foundry_status foundry_saver_write(void* saver, const char* payload_path, const char* images_root,
                                               int arch, foundry_save_stats* stats);
/* Regroups the graphs of several payload files into one payload (shared templates). */
FOUNDRY_API foundry_status foundry_payload_merge(const char* const* inputs, uint64_t count, const char* output,
                                                 uint32_t* templates);
FOUNDRY_API void foundry_saver_free(void* saver);

typedef struct foundry_load_times {
  double read_s;        /* reading and validating the payload, and deltas read since (lazy deltas) */
  double claim_s;       /* mapping referenced region memory */
  double build_s;       /* building template CUgraphs (their kernels' function attributes and events included) */
  double instantiate_s; /* the last instantiate_all, wall time */
  uint64_t mapped_blocks;
  uint64_t existing_blocks;
  double update_s;      /* writing graphs' deltas into template CUgraphs, summed over threads */
  uint64_t nccl_events; /* archived events bound to the live NCCL's serial event (docs/multi-gpu.md) */
} foundry_load_times;

/* LOAD: open a payload (images must be loaded first), instantiate and launch its graphs.
 * _open reads every graph's delta now; _open_lazy reads each when its graph is first instantiated
 * (lazy instantiation), so a corrupt delta is reported then, naming the graph. */
FOUNDRY_API foundry_status foundry_graphset_open(const char* payload_path, void** out);
FOUNDRY_API foundry_status foundry_graphset_open_lazy(const char* payload_path, void** out);
FOUNDRY_API foundry_status foundry_graphset_info(void* set, uint64_t* count, uint64_t* templates,
                                                 foundry_load_times* times);
FOUNDRY_API foundry_status foundry_graphset_name(void* set, uint64_t index, char* buf, size_t len);
FOUNDRY_API foundry_status foundry_graphset_instantiate(void* set, uint64_t index);
FOUNDRY_API foundry_status foundry_graphset_instantiate_all(void* set, int threads);
FOUNDRY_API foundry_status foundry_graphset_start_background(void* set);
FOUNDRY_API foundry_status foundry_graphset_ready(void* set, uint64_t index, int* ready);
FOUNDRY_API foundry_status foundry_graphset_launch(void* set, uint64_t index, uint64_t stream);
/* The template CUgraph graph `index` is instantiated from (owned by the set). */
FOUNDRY_API foundry_status foundry_graphset_template(void* set, uint64_t index, uint64_t* graph);
/* The flags the driver reports for graph `index`'s exec (cuGraphExecGetFlags; Foundry passes
 * PyTorch's AUTO_FREE_ON_LAUNCH | USE_NODE_PRIORITY, and the driver reports the first only, as it
 * does for PyTorch's execs). FOUNDRY_ERR_STATE before it is instantiated. */
FOUNDRY_API foundry_status foundry_graphset_exec_flags(void* set, uint64_t index, uint64_t* flags);
FOUNDRY_API void foundry_graphset_free(void* set);

/* LOAD, ahead of the restore: instantiates and destroys a stand-in exec (a chain of no-op kernel
 * nodes) as large as each graph of the payload, so that the driver holds the device memory the
 * restore's execs will need (see csrc/graph/exec_warmup.h). Needs no loaded image and no region.
 * Stops before the next stand-in once *stop (when not NULL) is non-zero; `out` may be NULL. */
typedef struct foundry_exec_warmup {
  uint64_t graphs;  /* stand-ins asked for */
  uint64_t execs;   /* stand-ins made: fewer when stopped */
  uint64_t nodes;   /* nodes over the stand-ins made */
  double seconds;
} foundry_exec_warmup;
FOUNDRY_API foundry_status foundry_exec_memory_warm(const char* payload_path, const int* stop, foundry_exec_warmup* out);

/* ---- inspection ---------------------------------------------------------------------------- */

/* Pure file readers for the inspection tools (no driver). Strings returned through char** are
 * malloc'd, NUL-terminated JSON documents: release them with foundry_free. */

/* Reads and validates a graph payload (graphs.fgr) and writes it out as JSON (every field of
 * templates, members, deltas and region references; see csrc/graph/payload_json.h). */
FOUNDRY_API foundry_status foundry_payload_dump(const char* payload_path, char** json);
/* The inverse of foundry_payload_dump: validates the JSON as LOAD validates a payload and writes
 * the payload file (atomically). FOUNDRY_ERR_FORMAT names the first bad field. */
FOUNDRY_API foundry_status foundry_payload_from_json(const char* json, const char* payload_path);
/* An archived image file (images/<hash16>.fimg) as JSON: metadata, entry names, stored segment
 * sizes and their total ("stored_size"); no image bytes. */
FOUNDRY_API foundry_status foundry_image_file_dump(const char* path, char** json);
/* Fully validates any section container file (header, table, checksums, padding); *sections
 * (optional) gets its section count. */
FOUNDRY_API foundry_status foundry_container_check(const char* path, uint32_t* sections);
/* For tests without a GPU: writes an image file LOAD would parse, holding `payload` as its one
 * segment. The path must end in <hash as 16 hex digits>.fimg; loader 0 module, 1 library. */
FOUNDRY_API foundry_status foundry_image_file_write_synthetic(const char* path, uint64_t hash, uint32_t loader,
                                                              const char* const* entries, uint32_t n_entries,
                                                              const void* payload, uint64_t size);
/* Releases a string returned by this API (NULL is ignored). */
FOUNDRY_API void foundry_free(void* p);

#ifdef __cplusplus
}
#endif

#endif /* FOUNDRY_CAPI_FOUNDRY_H_ */
