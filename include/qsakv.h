// SPDX-License-Identifier: Apache-2.0
/*
 * qsakv.h -- calibrated FP8 (E4M3) KV caches and sparse (QSA) / dense GQA attention.
 *
 * The only public header of libqsakv. C99, includes no CUDA header, compiles as C and C++.
 * Read it top to bottom: conventions, versions, status codes, types, context, model
 * config, overlay, capacity and caches, store, plan, selection, attention, calibration,
 * tensor-parallel consensus, checkpoint revision, memory helpers.
 *
 * Conventions (shared by every function below)
 * - Every fallible call returns a qsakv_status: 0 is success, every failure a distinct
 *   negative code. On failure a message naming the field, layer, expected and actual
 *   values is stored per thread: qsakv_last_error(). A successful call leaves it alone.
 * - Owned objects are returned through `T** out` in first position and released by the
 *   type's own *_destroy function; *_destroy(NULL) is a no-op. On failure *out is NULL
 *   and nothing is left half-built.
 * - Option and config structs start with `struct_size` and `version`; fill them with
 *   their *_init function (or a preset), or initialize them with their QSAKV_*_INIT macro
 *   (the same defaults, usable in a declaration: `qsakv_cache_options o =
 *   QSAKV_CACHE_OPTIONS_INIT;`), and pass them by const pointer. Output structs start
 *   the same way: set `struct_size` (and `version`) before the call. Structs only ever
 *   grow at the end; the library reads or writes min(struct_size, its own size) bytes of
 *   a struct the caller passes with struct_size set. The exceptions are the *_init
 *   functions and the config presets: they have no struct_size to read yet, so they write
 *   the whole struct as this library's header declares it. A binary that must run against
 *   newer libraries without being rebuilt initialises with the QSAKV_*_INIT macros (its
 *   own struct_size, compiled in) instead, and has a preset or a checkpoint's config
 *   written into a buffer larger than its struct (the bindings use 4 KiB), of which it
 *   keeps its own struct with its own struct_size and version.
 * - Device pointers: with the CUDA backend, "device" buffers are CUDA device memory;
 *   with the CPU backend they are ordinary host memory. Each function says which of
 *   its pointers are device pointers. The CUDA backend reads the activation and key
 *   arrays of the store, select, attention and calibration calls (k, v, keys, index_q, q,
 *   out) with 16-byte accesses: it refuses them unless 16-byte aligned
 *   (QSAKV_ERROR_INVALID_ARGUMENT naming the argument); the CPU backend takes any
 *   alignment.
 * - Enqueuing calls take a stream (qsakv_stream_t, a cudaStream_t; NULL is the legacy
 *   default stream; ignored by the CPU backend, which runs synchronously). Calls marked
 *   "run" never allocate, never synchronise and may be captured in a CUDA graph (the CPU
 *   backend's reference attention keeps per-thread host scratch, grown on a thread's
 *   first calls). Functions that allocate device memory (the create functions) are
 *   blocking and zero what they allocate with a device-wide synchronisation: like
 *   cudaMalloc, call them outside another thread's stream capture.
 * - Thread safety: distinct handles may be used from distinct threads at once. One
 *   handle must not be used by two threads at once unless a function says otherwise.
 * - Checks: every pointer is checked for NULL, every option struct for struct_size and a
 *   known version (1 .. its *_VERSION), every enum as the int32 it is (any value may be
 *   passed; out-of-range ones are refused), every count, stride and size with
 *   overflow-checked arithmetic against what any buffer can hold. A refusal names the
 *   argument and changes nothing. The library cannot check device memory from the host:
 *   the caller guarantees that each device buffer is as large as the function says, lives
 *   on the context's device and stays valid until the enqueued work ran (docs/safety.md).
 * - Every handle's section repeats one shape on purpose (create, *_destroy, a versioned
 *   struct), so the sections read alike; the duplicates tool lists some of them.
 *
 * Stability
 * - Before 1.0 there is no ABI promise (the SONAME stays libqsakv.so.0), but every change
 *   to what this header declares is recorded in CHANGELOG.md and checked against the ABI
 *   baseline (abi/README.md), and the design intends it to hold. Not so what is marked
 *   [experimental]: the tuning knobs and diagnostics of the kernel routes, which follow
 *   the kernels and may change meaning or go away in any release:
 *   qsakv_plan_options.num_splits and .multi_row_min_rows, the route fields of
 *   qsakv_plan_info (rows_per_group, multi_row_min_rows, num_groups, grouped_rows) and
 *   qsakv_context_info.kernel_tier. They are struct fields, so a macro cannot fence them
 *   the way zstd fences whole declarations (ZSTD_STATIC_LINKING_ONLY) without changing
 *   the structs' layout; leave them at their defaults unless you have measured.
 * - Environment variables (QSAKV_CUDA_TIER, QSAKV_GROUPED_MMA, QSAKV_SELECT_MMA,
 *   QSAKV_SELECT_SORT, QSAKV_SELECT_STAGES, QSAKV_DEPENDENT_LAUNCH) exist for the
 *   library's own tests and benchmarks: not an interface, covered by no promise. They are
 *   read when a context is created, and a value the library does not know fails
 *   qsakv_context_create (on either backend) naming the variable; QSAKV_SELECT_STAGES=score
 *   makes qsakv_select_topk score without writing its output. (QSAKV_NCCL_LIBRARY, the
 *   NCCL library to load, is an interface: see qsakv_calib_allreduce.)
 * - Arrays passed to the library must be aligned to their elements (int32: 4 bytes,
 *   int64: 8, FP16/BF16: 2; the CUDA backend wants 16 for Q, K, V, keys and outputs):
 *   a misaligned one is refused with QSAKV_ERROR_INVALID_ARGUMENT naming it.
 */
#ifndef QSAKV_H
#define QSAKV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define QSAKV_API
#elif defined(__GNUC__)
#define QSAKV_API __attribute__((visibility("default")))
#else
#define QSAKV_API
#endif

/* ---------------------------------------------------------------------------------- */
/* Versions                                                                            */
/* ---------------------------------------------------------------------------------- */

/* QSAKV_VERSION_MAJOR / _MINOR / _PATCH, QSAKV_VERSION_NUMBER (major * 10000 + minor * 100
 * + patch) and QSAKV_ABI_VERSION (the SONAME's number): generated by CMake from the
 * project version into qsakv_version.h, installed next to this header. */
#include "qsakv_version.h"

/* Release version of the loaded library, as QSAKV_VERSION_NUMBER. */
QSAKV_API int qsakv_version(void);
/* "major.minor.patch" of the loaded library; static storage. */
QSAKV_API const char* qsakv_version_string(void);
/* ABI version of the loaded library; compare with QSAKV_ABI_VERSION. */
QSAKV_API int qsakv_abi_version(void);

/* ---------------------------------------------------------------------------------- */
/* Status codes and errors                                                             */
/* ---------------------------------------------------------------------------------- */

typedef enum qsakv_status {
  QSAKV_SUCCESS = 0,
  QSAKV_ERROR_INVALID_ARGUMENT = -1, /* a NULL, out-of-range or inconsistent argument */
  QSAKV_ERROR_INVALID_CONFIG = -2,   /* a model config field is inconsistent */
  QSAKV_ERROR_UNSUPPORTED = -3,      /* valid, but not supported by this build/backend */
  QSAKV_ERROR_NO_DEVICE = -4,        /* CUDA asked for: no usable GPU/driver, or no such device */
  QSAKV_ERROR_OUT_OF_MEMORY = -5,
  QSAKV_ERROR_CUDA = -6, /* a CUDA runtime call of the library's failed (the thread's
                            CUDA last error is read and cleared only then: one that the
                            caller's own calls left pending stays the caller's) */
  QSAKV_ERROR_NCCL = -7,
  QSAKV_ERROR_IO = -8,     /* a file could not be opened, read or written */
  QSAKV_ERROR_FORMAT = -9, /* a file is malformed (safetensors, JSON) */
  QSAKV_ERROR_STATE = -10, /* call out of order (e.g. run before update) */
  QSAKV_ERROR_INTERNAL = -11,
  /* Overlay refusals (fail closed): one code per rule. */
  QSAKV_ERROR_OVERLAY_MISSING = -20,        /* no overlay where E4M3 needs one */
  QSAKV_ERROR_OVERLAY_INCOMPLETE = -21,     /* fewer than all K/V scales present */
  QSAKV_ERROR_OVERLAY_BAD_SCALE = -22,      /* a scale is not a normal positive float: NaN,
                                               infinite, zero, negative or subnormal */
  QSAKV_ERROR_OVERLAY_BAD_TENSOR = -23,     /* a scale tensor is not an FP32 scalar */
  QSAKV_ERROR_OVERLAY_DUPLICATE = -24,      /* a name is duplicated or already in the base
                                               (a tensor name, or at materialisation an
                                               overlay file name in the base directory) */
  QSAKV_ERROR_OVERLAY_UNKNOWN_TENSOR = -25, /* a tensor that is not a QSA K/V scale */
  QSAKV_ERROR_REVISION_MISMATCH = -26,      /* base checkpoint index hash differs */
  QSAKV_ERROR_HASH_MISMATCH = -27,          /* scale file hash differs from the manifest, or a
                                               materialised checkpoint's scale file, manifest
                                               or merged index differs from its provenance
                                               record (a file changed since it was built) */
  QSAKV_ERROR_CONTRACT = -28,               /* runtime outside the overlay's contract */
  QSAKV_ERROR_OVERLAY_NOT_VALIDATED = -29,  /* overlay not validated for this config */
  QSAKV_ERROR_CALIB_NON_FINITE = -30,       /* calibration saw NaN or infinite activations */
  QSAKV_ERROR_TP_MISMATCH = -31,         /* tensor-parallel ranks hold different configs/overlays */
  QSAKV_ERROR_OVERLAY_UNIT_SCALES = -32, /* unit scales (a negative control) not asked for */
  QSAKV_STATUS_MAX_ENUM = 0x7FFFFFFF     /* keeps any int32 a valid value of the type */
} qsakv_status;

/* Static, never NULL: "QSAKV_ERROR_OVERLAY_INCOMPLETE" etc.; unknown codes give
 * "QSAKV_ERROR_UNKNOWN". */
QSAKV_API const char* qsakv_status_string(qsakv_status status);
/* The calling thread's message for its last failed call ("" if none). Valid until the
 * thread's next failing qsakv call. */
QSAKV_API const char* qsakv_last_error(void);
/* Clears the calling thread's message. */
QSAKV_API void qsakv_clear_error(void);

/* ---------------------------------------------------------------------------------- */
/* Types                                                                               */
/* ---------------------------------------------------------------------------------- */

typedef struct CUstream_st* qsakv_stream_t; /* = cudaStream_t */

typedef enum qsakv_dtype {
  QSAKV_DTYPE_INVALID = 0,
  QSAKV_DTYPE_FP16 = 1,
  QSAKV_DTYPE_BF16 = 2,
  QSAKV_DTYPE_E4M3 = 3, /* float8 e4m3fn, stored as raw bytes */
  QSAKV_DTYPE_FP32 = 4,
  QSAKV_DTYPE_INT32 = 5,
  QSAKV_DTYPE_INT64 = 6,
  QSAKV_DTYPE_MAX_ENUM = 0x7FFFFFFF /* keeps any int32 a valid value of the type */
} qsakv_dtype;

/* Bytes per element; 0 for QSAKV_DTYPE_INVALID or an unknown value. */
QSAKV_API size_t qsakv_dtype_size(qsakv_dtype dtype);
/* "fp16", "bf16", "e4m3", "fp32", "int32", "int64", or "invalid". */
QSAKV_API const char* qsakv_dtype_name(qsakv_dtype dtype);

typedef struct qsakv_context qsakv_context;
typedef struct qsakv_overlay qsakv_overlay;
typedef struct qsakv_cache qsakv_cache;
typedef struct qsakv_plan qsakv_plan;

/* ---------------------------------------------------------------------------------- */
/* Context: backend and device                                                         */
/* ---------------------------------------------------------------------------------- */

typedef enum qsakv_backend {
  QSAKV_BACKEND_AUTO = 0, /* CUDA when a usable GPU exists, else CPU (and says why) */
  QSAKV_BACKEND_CPU = 1,  /* the reference backend: host memory, synchronous */
  QSAKV_BACKEND_CUDA = 2,
  QSAKV_BACKEND_MAX_ENUM = 0x7FFFFFFF /* keeps any int32 a valid value of the type */
} qsakv_backend;

typedef enum qsakv_decoder {
  QSAKV_DECODER_AUTO = 0,             /* hardware conversion on SM89+, the software one below */
  QSAKV_DECODER_HARDWARE = 1,         /* FP8 conversion instructions; UNSUPPORTED before SM89 */
  QSAKV_DECODER_SOFTWARE = 2,         /* exact bitcast decoder, every GPU (the SM70 tier's) */
  QSAKV_DECODER_MAX_ENUM = 0x7FFFFFFF /* keeps any int32 a valid value of the type */
} qsakv_decoder;

/* [experimental] The CUDA kernel tier a context launches (qsakv_context_info.kernel_tier).
 * Chosen from the GPU's compute capability: SM75 and newer get the tensor-core kernels
 * (SM75), SM70 (V100) gets CUDA-core kernels with the software E4M3 decoder (SM70).
 * Testing only: the environment variable QSAKV_CUDA_TIER (auto, sm70, sm75; read at
 * context creation) forces a tier; an invalid value, or a tier the GPU cannot run, fails
 * the creation. Not an interface for engines. */
typedef enum qsakv_kernel_tier {
  QSAKV_KERNEL_TIER_NONE = 0, /* the CPU backend: no CUDA kernels */
  QSAKV_KERNEL_TIER_SM70 = 70,
  QSAKV_KERNEL_TIER_SM75 = 75,
  QSAKV_KERNEL_TIER_MAX_ENUM = 0x7FFFFFFF /* keeps any int32 a valid value of the type */
} qsakv_kernel_tier;

#define QSAKV_CONTEXT_OPTIONS_VERSION 1
typedef struct qsakv_context_options {
  size_t struct_size; /* sizeof(qsakv_context_options) */
  uint32_t version;   /* QSAKV_CONTEXT_OPTIONS_VERSION */
  qsakv_backend backend;
  int32_t device; /* CUDA device ordinal (CUDA backend only) */
  qsakv_decoder decoder;
} qsakv_context_options;

/* Fills defaults: AUTO backend, device 0, AUTO decoder. */
QSAKV_API qsakv_status qsakv_context_options_init(qsakv_context_options* options);
/* The same defaults as an initializer. */
#define QSAKV_CONTEXT_OPTIONS_INIT                                                       \
  {                                                                                      \
    sizeof(qsakv_context_options), QSAKV_CONTEXT_OPTIONS_VERSION, QSAKV_BACKEND_AUTO, 0, \
        QSAKV_DECODER_AUTO                                                               \
  }

/* Creates a context. Blocking; may initialise the CUDA runtime. With AUTO and no usable
 * GPU it picks the CPU backend; qsakv_context_info.fallback_reason says why. Asking for
 * CUDA where there is none fails with QSAKV_ERROR_NO_DEVICE. options may be NULL. */
QSAKV_API qsakv_status qsakv_context_create(qsakv_context** out,
                                            const qsakv_context_options* options);
/* Releases a context. Caches, plans and calibration handles made on it must be destroyed
 * first (they use it). Synchronises nothing: finish or synchronise the streams that ran
 * work on it first. NULL is a no-op. */
QSAKV_API void qsakv_context_destroy(qsakv_context* context);

#define QSAKV_CONTEXT_INFO_VERSION 1
typedef struct qsakv_context_info {
  size_t struct_size;
  uint32_t version;
  qsakv_backend backend; /* the backend chosen (never AUTO) */
  qsakv_decoder decoder; /* the decoder chosen (never AUTO) */
  int32_t device;        /* -1 for the CPU backend */
  int32_t sm_version;    /* e.g. 90 for SM 9.0; 0 for the CPU backend */
  int32_t multiprocessor_count;
  int32_t has_fp8_conversion; /* 1 when the hardware E4M3 conversion exists (SM89+) */
  uint64_t device_memory_bytes;
  char device_name[128];
  char fallback_reason[256]; /* why AUTO chose the CPU backend; "" otherwise */
  /* Appended (a caller's older, shorter struct simply does not receive it): */
  qsakv_kernel_tier kernel_tier; /* [experimental] the CUDA kernels launched; NONE on CPU */
} qsakv_context_info;

/* Fills *info (set info->struct_size and version first, or call with a zeroed struct
 * whose struct_size is set). Non-blocking. */
QSAKV_API qsakv_status qsakv_context_get_info(const qsakv_context* context,
                                              qsakv_context_info* info);
/* Whether this library was built with the CUDA backend (1) or CPU only (0). */
QSAKV_API int qsakv_built_with_cuda(void);

/* ---------------------------------------------------------------------------------- */
/* Model config: geometry and runtime                                                  */
/* ---------------------------------------------------------------------------------- */

#define QSAKV_MAX_LAYERS 512
#define QSAKV_MODEL_CONFIG_VERSION 1
typedef struct qsakv_model_config {
  size_t struct_size;
  uint32_t version;
  /* Geometry of the whole model (before tensor parallelism). */
  int32_t num_layers;                   /* all layers, QSA or not */
  int32_t num_qsa_layers;               /* entries used in qsa_layers */
  int32_t qsa_layers[QSAKV_MAX_LAYERS]; /* ascending model-layer ids of the QSA layers */
  int32_t num_q_heads;                  /* query heads, all ranks */
  int32_t num_kv_heads;                 /* KV heads, all ranks */
  int32_t head_dim;                     /* 64, 128 or 256 */
  float softmax_scale;                  /* 0 means 1/sqrt(head_dim) */
  int32_t index_num_heads;              /* indexer query heads (4) */
  int32_t index_head_dim;               /* indexer head dim (128) */
  int32_t compress_ratio;               /* tokens per compressed index key (4) */
  int32_t topk_tokens;                  /* token budget of the top-k selection (2048) */
  /* Runtime. */
  int32_t tp_size;
  int32_t tp_rank;
  int32_t speculative_tokens;   /* MTP / draft tokens per step (0 = none) */
  qsakv_dtype activation_dtype; /* FP16 or BF16: Q, K, V, outputs */
  qsakv_dtype kv_dtype;         /* E4M3, FP16 or BF16: the main K/V cache */
  int32_t block_size;           /* tokens per cache block; a multiple of compress_ratio */
  int32_t max_requests;         /* concurrent requests (raw index-key rings) */
  int32_t max_batched_tokens;   /* query rows per step (top-k workspace rows) */
  int32_t max_model_len;        /* tokens per request */
  /* Appended (a caller's older, shorter struct gets the default, FP16): */
  /* The compressed index keys: FP16 (the default), or E4M3 with one FP32 scale per key
   * (max |x| / 448, computed when the key is stored): 132 instead of 256 bytes per key of
   * 128 dims, selection reads half the bytes, the selection may differ slightly (see
   * docs/selection.md). The raw index-key ring and the index queries stay FP16. */
  qsakv_dtype index_key_dtype;
} qsakv_model_config;

/* Zeroes every field and sets struct_size/version: not valid until filled. The one
 * defaulted field is index_key_dtype (FP16). */
QSAKV_API qsakv_status qsakv_model_config_init(qsakv_model_config* config);
/* The same as an initializer (every field zero but index_key_dtype: fill it, or use a
 * preset). */
#define QSAKV_MODEL_CONFIG_INIT                                                                   \
  {                                                                                               \
    sizeof(qsakv_model_config), QSAKV_MODEL_CONFIG_VERSION, 0, 0, {0}, 0, 0, 0, 0.0f, 0, 0, 0, 0, \
        0, 0, 0, QSAKV_DTYPE_INVALID, QSAKV_DTYPE_INVALID, 0, 0, 0, 0, QSAKV_DTYPE_FP16           \
  }
/* The reference model "qwen4_exp": 48 layers, QSA where i % 4 == 3, 24/2 heads,
 * head_dim 256, indexer 4 x 128, ratio 4, budget 2048; runtime: TP1 rank 0, no
 * speculative tokens, FP16 activations, E4M3 KV, block size 64, 256 requests,
 * 8192 batched tokens, 131072 tokens per request. */
QSAKV_API qsakv_status qsakv_model_config_preset(qsakv_model_config* config,
                                                 const char* preset_name);
/* A config from a checkpoint's Hugging Face config.json. `checkpoint_dir_or_config_json`
 * is the checkpoint directory (its config.json is read) or the JSON file itself. The
 * geometry comes from the file; every runtime field (tp_size ... max_model_len) is the
 * qwen4_exp preset's (TP1 rank 0, FP16 activations, E4M3 KV, block size 64, ...), for
 * the caller to set; softmax_scale is 0 (1/sqrt(head_dim)). When the top level has a
 * "text_config" object (multimodal checkpoints), the keys are read from it. Keys:
 *   num_hidden_layers    -> num_layers                      (required)
 *   num_attention_heads  -> num_q_heads                     (required)
 *   num_key_value_heads  -> num_kv_heads                    (required: no MHA default)
 *   head_dim             -> head_dim      (if absent: hidden_size / num_attention_heads)
 *   index_n_heads        -> index_num_heads                 (required)
 *   index_head_dim       -> index_head_dim                  (required)
 *   index_compress_ratio -> compress_ratio                  (required)
 *   index_topk           -> topk_tokens                     (required)
 * and the QSA layers from at least one of (several must name the same layers):
 *   qsa_layers              a list of ascending model-layer ids;
 *   full_attention_interval N: layer i is QSA when (i + 1) % N == 0 (the reference family
 *                           uses 4: layers 3, 7, ..., 47);
 *   layer_types             one string per layer: "full_attention" or "qsa_attention"
 *                           (a QSA layer) or "linear_attention" (not QSA).
 * Other keys are ignored. Strict: integers must be JSON integers; a duplicated key, a
 * missing or ill-typed key, an unknown layer type or no pattern is QSAKV_ERROR_FORMAT
 * naming the file and the key; a missing or unreadable file QSAKV_ERROR_IO; a result
 * that qsakv_model_config_validate refuses QSAKV_ERROR_INVALID_CONFIG naming the field,
 * the key and the file. Fills *config whole (struct_size and version included), like a
 * preset; on failure *config is untouched. Blocking. */
QSAKV_API qsakv_status qsakv_model_config_from_checkpoint(
    qsakv_model_config* config, const char* checkpoint_dir_or_config_json);
/* Checks every field and every combination. QSAKV_ERROR_INVALID_CONFIG with a message
 * naming the field and the bad value. */
QSAKV_API qsakv_status qsakv_model_config_validate(const qsakv_model_config* config);

#define QSAKV_RANK_GEOMETRY_VERSION 1
typedef struct qsakv_rank_geometry {
  size_t struct_size;
  uint32_t version;
  int32_t q_heads;       /* query heads on this rank: num_q_heads / tp_size */
  int32_t kv_heads;      /* KV heads on this rank: max(1, num_kv_heads / tp_size) */
  int32_t group_size;    /* q_heads / kv_heads */
  int32_t first_q_head;  /* global id of this rank's first query head */
  int32_t first_kv_head; /* global id of this rank's (first) KV head */
  int32_t topk_width;    /* topk_tokens + compress_ratio - 1 (2051) */
  int32_t topk_blocks;   /* topk_tokens / compress_ratio (512) */
  int32_t ring_length;   /* raw index-key ring per request: ratio * ceil((ratio+spec)/ratio) */
  float softmax_scale;   /* the effective scale */
} qsakv_rank_geometry;

/* Validates config, then derives this rank's geometry. */
QSAKV_API qsakv_status qsakv_model_config_rank_geometry(const qsakv_model_config* config,
                                                        qsakv_rank_geometry* out);

/* ---------------------------------------------------------------------------------- */
/* Overlay: calibrated per-layer K/V scales bound to a checkpoint revision             */
/* ---------------------------------------------------------------------------------- */

/* Loads an overlay from a materialised checkpoint directory (model.safetensors.index.json
 * + model-kvscales.safetensors + qsakv-overlay.json manifest) or, when `path` names a
 * file, from a bare scale file with `manifest_path` (NULL: "<dir>/qsakv-overlay.json").
 * Parses strictly; checks the scale file's SHA-256 against the manifest. When the scale
 * file's directory holds qsakv-provenance.json (qsakv_overlay_materialize built it), the
 * manifest read (wherever manifest_path puts it), the scale file and the merged index
 * must each have the SHA-256 the record lists: QSAKV_ERROR_HASH_MISMATCH naming the file,
 * the recorded and the actual hash otherwise. Blocking. */
QSAKV_API qsakv_status qsakv_overlay_load(qsakv_overlay** out, const char* path,
                                          const char* manifest_path);
/* Releases an overlay. A cache copies the scales it needs at creation, so the overlay may
 * be destroyed as soon as its caches exist. NULL is a no-op. */
QSAKV_API void qsakv_overlay_destroy(qsakv_overlay* overlay);

/* Validates against a config and the expected base revision (lower-case hex SHA-256 of
 * the base checkpoint's model.safetensors.index.json; required, NULL is an invalid
 * argument). Every rule of fail-closed mode, one status each. Until this succeeds the
 * overlay cannot back an E4M3 cache; a failure leaves it unvalidated. Blocking. */
QSAKV_API qsakv_status qsakv_overlay_validate(qsakv_overlay* overlay,
                                              const qsakv_model_config* config,
                                              const char* expected_base_revision);

#define QSAKV_OVERLAY_INFO_VERSION 1
typedef struct qsakv_overlay_info {
  size_t struct_size;
  uint32_t version;
  int32_t num_scales;                  /* K and V scales found (24 for the reference model) */
  int32_t validated;                   /* 1 after a successful qsakv_overlay_validate */
  int32_t unit_scale_control;          /* 1 when the metadata marks a unit-scale negative control */
  int32_t contract_tp_size;            /* 0 = not constrained */
  int32_t contract_speculative_tokens; /* -1 = not constrained */
  qsakv_dtype contract_activation_dtype; /* INVALID = not constrained */
  int32_t contract_min_sm;               /* 0 = not constrained */
  char base_index_sha256[65];
  char scale_file_sha256[65];
  char layer_prefix[128]; /* e.g. "model.layers" */
} qsakv_overlay_info;
/* What an overlay holds: counts, contract, revision binding, whether validated. Set
 * info->struct_size first. Host only. */
QSAKV_API qsakv_status qsakv_overlay_get_info(const qsakv_overlay* overlay,
                                              qsakv_overlay_info* info);
/* K and V scales of a model layer id. QSAKV_ERROR_INVALID_ARGUMENT if absent. */
QSAKV_API qsakv_status qsakv_overlay_get_scales(const qsakv_overlay* overlay, int32_t layer,
                                                float* k_scale, float* v_scale);

/* Reads the K/V scales a scale file (model-kvscales.safetensors) holds, as they are,
 * for inspection tools: no manifest, no checkpoint revision, no config, nothing
 * validated. The result is bound to nothing and cannot back a cache (qsakv_overlay_load
 * and qsakv_overlay_validate are the way to that). Writes up to `capacity` entries in
 * ascending layer order (layers, k_scales, v_scales: arrays of capacity; NULL allowed
 * when capacity is 0); *num_layers is the number of layers the file holds, which may be
 * more than capacity (call again with room for all). The half of a K/V pair that the
 * file lacks is NaN. sha256_hex (NULL or 65 bytes) receives the file's SHA-256. Refuses
 * a malformed file (QSAKV_ERROR_FORMAT), a tensor that is not a K/V scale name
 * (QSAKV_ERROR_OVERLAY_UNKNOWN_TENSOR) or not an F32 scalar
 * (QSAKV_ERROR_OVERLAY_BAD_TENSOR), a layer's K or V given twice
 * (QSAKV_ERROR_OVERLAY_DUPLICATE); a missing file is QSAKV_ERROR_IO. Blocking. */
QSAKV_API qsakv_status qsakv_overlay_read_scale_file(const char* scale_file, int32_t capacity,
                                                     int32_t* layers, float* k_scales,
                                                     float* v_scales, int32_t* num_layers,
                                                     char sha256_hex[65]);

/* Scale contract recorded in a manifest by qsakv_overlay_write. qsakv_calib_write_overlay
 * reads the two fields marked [calib] otherwise: left unset (0, INVALID) they take the
 * statistics' TP size and activation dtype. */
#define QSAKV_OVERLAY_WRITE_OPTIONS_VERSION 1
typedef struct qsakv_overlay_write_options {
  size_t struct_size;
  uint32_t version;
  const char* layer_prefix;              /* "model.layers" when NULL */
  const char* base_index_path;           /* base checkpoint's model.safetensors.index.json */
  int32_t contract_tp_size;              /* 0 = not constrained, else 1..65536. [calib] 0 =
                                            the statistics' TP size, -1 = not constrained */
  int32_t contract_speculative_tokens;   /* -1 = not constrained, else 0..64 */
  qsakv_dtype contract_activation_dtype; /* INVALID = not constrained. [calib] INVALID = the
                                            statistics' dtype (always constrained) */
  int32_t contract_min_sm;               /* 0 = not constrained, else 1..10000 (70: SM 7.0) */
  int32_t unit_scale_control;            /* 1 marks a unit-scale negative control in the metadata
                                            (informational: a loaded 1.0 is a valid scale) */
} qsakv_overlay_write_options;
/* Fills defaults: every contract field unset (for qsakv_overlay_write: unconstrained;
 * for qsakv_calib_write_overlay: TP size and activation dtype from the statistics), the
 * default layer prefix, no base index (set what the overlay should bind). */
QSAKV_API qsakv_status qsakv_overlay_write_options_init(qsakv_overlay_write_options* options);
/* The same defaults as an initializer. */
#define QSAKV_OVERLAY_WRITE_OPTIONS_INIT                                                         \
  {                                                                                              \
    sizeof(qsakv_overlay_write_options), QSAKV_OVERLAY_WRITE_OPTIONS_VERSION, NULL, NULL, 0, -1, \
        QSAKV_DTYPE_INVALID, 0, 0                                                                \
  }

/* Writes `out_dir`/model-kvscales.safetensors and `out_dir`/qsakv-overlay.json for the
 * given QSA layers' scales (arrays of num_layers). Refuses a scale that is not a normal
 * positive float (NaN, infinite, zero, negative, subnormal: OVERLAY_BAD_SCALE, as
 * qsakv_overlay_validate) and an existing out_dir; builds in a staging directory renamed
 * atomically. Blocking. */
QSAKV_API qsakv_status qsakv_overlay_write(const char* out_dir, const int32_t* layers,
                                           const float* k_scales, const float* v_scales,
                                           int32_t num_layers,
                                           const qsakv_overlay_write_options* options);

/* Materialises a calibrated checkpoint directory `out_dir` from a base checkpoint
 * directory and a scale pack written by qsakv_overlay_write: a merged
 * model.safetensors.index.json (the pack's names mapped to model-kvscales.safetensors,
 * metadata.total_size grown by the scale file's size), symbolic links to every other
 * base file, copies of the scale file and manifest, and qsakv-provenance.json with the
 * hashes. Refuses an existing out_dir (INVALID_ARGUMENT), a base whose index hash is not
 * the manifest's (REVISION_MISMATCH), a scale name the base already has and a base
 * directory that already holds a file named model-kvscales.safetensors,
 * qsakv-overlay.json or qsakv-provenance.json, which the copy would shadow (both
 * OVERLAY_DUPLICATE), a base whose real path is not UTF-8 (INVALID_ARGUMENT: the provenance
 * records it as JSON text) and a pack whose scale file or manifest changed between the
 * load that checks it and the read that copies it (HASH_MISMATCH naming the file and
 * both hashes). Builds in a staging directory renamed atomically; first
 * removes stale staging directories of out_dir whose writer process is gone
 * (docs/overlay.md). Blocking. */
QSAKV_API qsakv_status qsakv_overlay_materialize(const char* out_dir,
                                                 const char* base_checkpoint_dir,
                                                 const char* scale_pack_dir);

/* ---------------------------------------------------------------------------------- */
/* Capacity planning and caches                                                        */
/* ---------------------------------------------------------------------------------- */

#define QSAKV_CAPACITY_VERSION 1
typedef struct qsakv_capacity {
  size_t struct_size;
  uint32_t version;
  /* Per token, per rank, all QSA layers. */
  uint64_t main_bytes_per_token;       /* K + V in kv_dtype */
  uint64_t compressed_bytes_per_token; /* compressed index keys (index_key_dtype) */
  uint64_t bytes_per_token;            /* the two above */
  uint64_t fp16_bytes_per_token;       /* the same with a 16-bit main cache and FP16 keys */
  /* Fixed costs. */
  uint64_t ring_bytes; /* raw index-key rings: all requests, all QSA layers */
  uint64_t ring_bytes_per_request;
  uint64_t topk_bytes;          /* the shared top-k workspace (one, model-level) */
  uint64_t topk_bytes_unshared; /* what one buffer per layer would cost */
  /* For the budget. */
  uint64_t budget_bytes;
  int64_t num_blocks;      /* whole blocks that fit after the fixed costs */
  int64_t num_tokens;      /* num_blocks * block_size */
  int64_t fp16_num_tokens; /* same budget with a 16-bit main cache and FP16 index keys */
  double capacity_ratio;   /* num_tokens / fp16_num_tokens */
  double ideal_ratio;      /* fp16_bytes_per_token / bytes_per_token */
  uint64_t bytes_per_block;
} qsakv_capacity;

/* Pure arithmetic, no allocation. Blocking. */
QSAKV_API qsakv_status qsakv_capacity_plan(const qsakv_model_config* config,
                                           uint64_t memory_budget_bytes, qsakv_capacity* out);

#define QSAKV_CACHE_OPTIONS_VERSION 2
typedef struct qsakv_cache_options {
  size_t struct_size;
  uint32_t version;
  int64_t num_blocks;           /* blocks per QSA layer; 0: from memory_budget_bytes */
  uint64_t memory_budget_bytes; /* used when num_blocks == 0 */
  int32_t share_topk;           /* 1 (default): one model-level top-k buffer for all
                                   layers; 0: a private buffer per layer */
  /* An external top-k buffer (int32, [rows, cols], row-major, 4-byte aligned; memory of
   * the context's GPU, host memory on the CPU backend; with
   * qsakv_cache_create_with_memory, overlapping none of the layers' buffers); NULL:
   * allocate. */
  void* external_topk;
  qsakv_dtype external_topk_dtype;
  int64_t external_topk_rows; /* >= max_batched_tokens */
  int64_t external_topk_cols; /* == topk_width (2051) */
  /* Version 2. 1: an E4M3 cache may run on a unit-scale overlay (one marked as a negative
   * control, unit_scale_control, or whose every scale is 1.0), to measure what calibration
   * buys; 0 (default): such an overlay is refused (QSAKV_ERROR_OVERLAY_UNIT_SCALES). */
  int32_t allow_unit_scales;
} qsakv_cache_options;
/* Fills defaults: num_blocks 0 (size from memory_budget_bytes), the shared top-k buffer,
 * no external buffer, unit-scale overlays refused. */
QSAKV_API qsakv_status qsakv_cache_options_init(qsakv_cache_options* options);
/* The same defaults as an initializer. */
#define QSAKV_CACHE_OPTIONS_INIT                                                                  \
  {                                                                                               \
    sizeof(qsakv_cache_options), QSAKV_CACHE_OPTIONS_VERSION, 0, 0, 1, NULL, QSAKV_DTYPE_INVALID, \
        0, 0, 0                                                                                   \
  }

/* Allocates every cache of this rank: main K/V per QSA layer, raw index-key rings,
 * compressed index-key caches, and the top-k workspace. E4M3 needs an overlay that
 * qsakv_overlay_validate accepted for an equal config (else OVERLAY_MISSING or
 * OVERLAY_NOT_VALIDATED) and that holds calibrated scales (a unit-scale overlay only with
 * options.allow_unit_scales, else OVERLAY_UNIT_SCALES); 16-bit caches take overlay == NULL. A BF16
 * cache on an SM 7.5 GPU is UNSUPPORTED (its tensor cores have no BF16 MMAs; FP16 and E4M3 run
 * there). The scales are copied to device memory; the overlay may be destroyed afterwards.
 * Blocking, allocates. Cache contents start zeroed. The context must outlive the cache. options
 * NULL: the defaults of qsakv_cache_options_init, which size nothing, so the call is refused (set
 * num_blocks or memory_budget_bytes). */
QSAKV_API qsakv_status qsakv_cache_create(qsakv_cache** out, qsakv_context* context,
                                          const qsakv_model_config* config,
                                          const qsakv_overlay* overlay,
                                          const qsakv_cache_options* options);
/* Releases a cache and the memory the library allocated for it (never the caller's
 * buffers of qsakv_cache_create_with_memory or an external top-k buffer). Destroy its plans
 * first, and make sure no work that uses it is still queued on a stream (the device memory
 * is freed at once). NULL is a no-op. */
QSAKV_API void qsakv_cache_destroy(qsakv_cache* cache);

#define QSAKV_CACHE_LAYOUT_VERSION 1
typedef struct qsakv_cache_layout {
  size_t struct_size;
  uint32_t version;
  qsakv_dtype kv_dtype;
  int64_t num_blocks;
  int32_t block_size;
  int32_t kv_heads;
  int32_t head_dim;
  int32_t num_qsa_layers;
  /* Main cache per layer: [num_blocks, 2, block_size, kv_heads, head_dim], strides in
   * elements. */
  int64_t kv_stride_block;
  int64_t kv_stride_kv;
  int64_t kv_stride_token;
  int64_t kv_stride_head;
  uint64_t kv_bytes_per_layer;
  /* Compressed index keys per layer: num_blocks pages of compressed_stride_block bytes
   * (see the fields appended below); FP16: [num_blocks, block_size / ratio,
   * index_head_dim]. */
  uint64_t compressed_bytes_per_layer;
  /* Raw index-key ring per layer: [max_requests, ring_length, index_head_dim] FP16. */
  int32_t ring_length;
  uint64_t ring_bytes_per_layer;
  /* Top-k workspace: int32 [topk_rows, topk_cols]. */
  int64_t topk_rows;
  int64_t topk_cols;
  int32_t topk_shared; /* 1 when one buffer serves every layer */
  int32_t topk_external;
  uint64_t total_bytes; /* everything the library allocated for the cache */
  /* Appended (a caller's older, shorter struct simply does not receive them): the
   * compressed index-key pages. Page b (one per cache block) starts at byte
   * b * compressed_stride_block and holds compressed_keys_per_block keys:
   *   FP16: keys [compressed_keys_per_block, index_head_dim] FP16, nothing else
   *         (compressed_scales_offset = -1);
   *   E4M3: codes [compressed_keys_per_block, index_head_dim] bytes, then at
   *         compressed_scales_offset one FP32 scale per key, then padding to 16 bytes.
   * Key j of a page is x = scale[j] * e4m3(codes[j]). */
  qsakv_dtype index_key_dtype;
  int32_t index_head_dim;
  int32_t compressed_keys_per_block; /* block_size / compress_ratio */
  int64_t compressed_stride_block;   /* bytes per page (a multiple of 16) */
  int64_t compressed_scales_offset;  /* bytes from the page's start; -1 for FP16 keys */
} qsakv_cache_layout;
/* The cache's layout (strides, bytes per layer, top-k shape). Set out->struct_size
 * first. Host only. */
QSAKV_API qsakv_status qsakv_cache_get_layout(const qsakv_cache* cache, qsakv_cache_layout* out);

/* Device pointers of one QSA layer (model-layer id), for interoperability. Writing into
 * `kv` yourself (a swap-in, a prefix-cache copy): call qsakv_cache_note_external_codes
 * afterwards, or NaN codes you wrote may decode as finite values with the software
 * decoder, and a NaN (or infinite) V value may reach rows of its grouped-route tile that
 * do not select it (both check only layers where the store saw one). */
#define QSAKV_LAYER_BUFFERS_VERSION 1
typedef struct qsakv_layer_buffers {
  size_t struct_size;
  uint32_t version;
  void* kv;              /* main cache */
  void* compressed_keys; /* index_key_dtype pages (qsakv_cache_layout) */
  void* ring_keys;       /* FP16 */
  int32_t* topk;         /* this layer's top-k buffer (the shared one when shared) */
  const float* scales;   /* device float[2]: k_scale, v_scale (1, 1 for 16-bit caches) */
} qsakv_layer_buffers;
/* The device pointers of QSA layer `layer` (model-layer id); valid while the cache lives.
 * Set out->struct_size first. Host only. */
QSAKV_API qsakv_status qsakv_cache_get_layer_buffers(const qsakv_cache* cache, int32_t layer,
                                                     qsakv_layer_buffers* out);

/* Marks that `layer`'s cache bytes were written outside qsakv_store_kv, so the kernels
 * check them for NaN codes (E4M3 software decoder) and non-finite V values (grouped
 * route) from now on (a one-way switch; costs some speed in that layer). Async on
 * `stream`. */
QSAKV_API qsakv_status qsakv_cache_note_external_codes(qsakv_cache* cache, int32_t layer,
                                                       qsakv_stream_t stream);

/* Caller-owned cache memory, for engines that allocate and profile their KV memory
 * themselves. One entry per QSA layer, in config.qsa_layers order; each buffer device
 * memory of the context's GPU (host memory on the CPU backend), 16-byte aligned, at least
 * the bytes qsakv_cache_layout_for reports, and no two buffers overlapping. The top-k
 * buffer can be the caller's too (qsakv_cache_options.external_topk). */
typedef struct qsakv_layer_memory {
  void* kv; /* main K/V cache: >= layout.kv_bytes_per_layer bytes */
  uint64_t kv_bytes;
  void* compressed_keys; /* compressed index keys: >= compressed_bytes_per_layer */
  uint64_t compressed_bytes;
  void* ring_keys; /* raw index-key ring: >= ring_bytes_per_layer */
  uint64_t ring_bytes;
} qsakv_layer_memory;

#define QSAKV_CACHE_MEMORY_VERSION 1
typedef struct qsakv_cache_memory {
  size_t struct_size;
  uint32_t version;
  int32_t num_layers;               /* == config.num_qsa_layers */
  const qsakv_layer_memory* layers; /* [num_layers] */
} qsakv_cache_memory;
/* struct_size and version set, no layers yet: fill num_layers and layers. */
#define QSAKV_CACHE_MEMORY_INIT \
  { sizeof(qsakv_cache_memory), QSAKV_CACHE_MEMORY_VERSION, 0, NULL }

/* The layout (strides and bytes per layer) a cache of this config and options has, without
 * creating one: what to allocate for qsakv_cache_create_with_memory. options.num_blocks
 * must be set (> 0). Host only; no allocation. */
QSAKV_API qsakv_status qsakv_cache_layout_for(const qsakv_model_config* config,
                                              const qsakv_cache_options* options,
                                              qsakv_cache_layout* out);

/* qsakv_cache_create over the caller's memory (options.num_blocks > 0 sets its size). Each
 * buffer is checked (NULL, size, alignment, device, overlap) with a message naming it,
 * e.g. "memory.layers[2].kv (layer 11) is 1048576 bytes; needs 2097152". The library
 * never frees the buffers; they must outlive the cache. Their contents are used as they
 * are (not zeroed), so every layer starts with the NaN checks on (as after
 * qsakv_cache_note_external_codes). The library still allocates the per-layer
 * scales, NaN flags and (unless external) the top-k buffer; layout.total_bytes counts only
 * those. Blocking. */
QSAKV_API qsakv_status qsakv_cache_create_with_memory(qsakv_cache** out, qsakv_context* context,
                                                      const qsakv_model_config* config,
                                                      const qsakv_overlay* overlay,
                                                      const qsakv_cache_options* options,
                                                      const qsakv_cache_memory* memory);

/* ---------------------------------------------------------------------------------- */
/* Store                                                                               */
/* ---------------------------------------------------------------------------------- */

/* Quantises (E4M3: e4m3(fp32(x) / scale), round-to-nearest-even, saturating to +-448,
 * NaN stays NaN) or copies (16-bit caches) K and V into the main cache of `layer`.
 * k, v: device, activation dtype, [num_tokens, kv_heads, head_dim] contiguous.
 * slot_mapping: device int64 [num_tokens]; slot = block * block_size + offset, -1 skips
 * (so do slots beyond the cache). Async on `stream`; run: no allocation, no
 * synchronisation, capturable; a captured store replays with the captured num_tokens, so
 * capture the padded size and mark padding with -1 slots. */
QSAKV_API qsakv_status qsakv_store_kv(qsakv_cache* cache, int32_t layer, const void* k,
                                      const void* v, const int64_t* slot_mapping,
                                      int64_t num_tokens, qsakv_stream_t stream);

/* Raw index keys (device FP16 [num_tokens, index_head_dim]) into the per-request ring:
 * entry (request_slots[i], positions[i] % ring_length). request_slots: device int32,
 * positions: device int64; a negative position, and a request slot outside
 * 0..max_requests-1, skips the key. Async; run. */
QSAKV_API qsakv_status qsakv_store_index_keys(qsakv_cache* cache, int32_t layer, const void* keys,
                                              const int32_t* request_slots,
                                              const int64_t* positions, int64_t num_tokens,
                                              qsakv_stream_t stream);

/* Finished compressed index keys (device FP16 [num_keys, index_head_dim]) into the
 * compressed cache: entry slot_mapping[i] / compress_ratio, where slot_mapping[i] is
 * the slot of any token of the group (-1 skips, and so does a slot beyond the cache).
 * With index_key_dtype E4M3 each key is
 * quantised on its own: m = max |x_d| (in FP32); scale = m / 448 (FP32 division) and
 * code_d = e4m3(fp32(x_d) / scale) (round-to-nearest-even, saturating), so the largest
 * element is +-448 x scale; a key with m = 0 or with a NaN or infinite element is stored
 * as scale 0 and all codes 0 (it scores 0, as an FP16 key with a NaN element does). The
 * same bytes on every backend. Async; run. */
QSAKV_API qsakv_status qsakv_store_compressed_keys(qsakv_cache* cache, int32_t layer,
                                                   const void* keys, const int64_t* slot_mapping,
                                                   int64_t num_keys, qsakv_stream_t stream);

/* One step's stores of `layer` together: the K/V of qsakv_store_kv, the raw index keys of
 * qsakv_store_index_keys and the compressed keys of qsakv_store_compressed_keys, each part
 * with that call's arguments, checks and effects; a part whose count is 0 is skipped and
 * its pointers are not read. Every part is checked before anything is enqueued, so a
 * refused call stores nothing. The parts run at the same time, not in order: no part's
 * input may lie in the cache's buffers (e.g. compressed keys read from the ring). On the
 * GPU they take one kernel launch instead of three (a K/V part too large for one launch,
 * e.g. a long prefill's, takes its own, the others one together). Async on `stream`;
 * run: no allocation, no synchronisation, capturable. */
#define QSAKV_STEP_STORES_VERSION 1
typedef struct qsakv_step_stores {
  size_t struct_size;
  uint32_t version;
  /* qsakv_store_kv's k, v, slot_mapping and num_tokens */
  const void* k;
  const void* v;
  const int64_t* kv_slot_mapping;
  int64_t num_tokens;
  /* qsakv_store_index_keys' keys, request_slots, positions and num_tokens */
  const void* index_keys;
  const int32_t* index_request_slots;
  const int64_t* index_positions;
  int64_t num_index_keys;
  /* qsakv_store_compressed_keys' keys, slot_mapping and num_keys */
  const void* compressed_keys;
  const int64_t* compressed_slot_mapping;
  int64_t num_compressed_keys;
} qsakv_step_stores;
/* struct_size and version set, every part empty. */
#define QSAKV_STEP_STORES_INIT                                                                   \
  {                                                                                              \
    sizeof(qsakv_step_stores), QSAKV_STEP_STORES_VERSION, NULL, NULL, NULL, 0, NULL, NULL, NULL, \
        0, NULL, NULL, 0                                                                         \
  }
QSAKV_API qsakv_status qsakv_store_step(qsakv_cache* cache, int32_t layer,
                                        const qsakv_step_stores* stores, qsakv_stream_t stream);

/* ---------------------------------------------------------------------------------- */
/* Plan: a batch's metadata, made on the host, consumed by select and attention         */
/* ---------------------------------------------------------------------------------- */

#define QSAKV_PLAN_OPTIONS_VERSION 2
typedef struct qsakv_plan_options {
  size_t struct_size;
  uint32_t version;
  int32_t max_rows;     /* query rows per batch this plan serves (0: max_batched_tokens) */
  int32_t max_requests; /* requests per batch (0: config max_requests) */
  /* [experimental] Split-K factor of the decode route; 0: from occupancy for a batch of
   * max_rows rows (fixed for the plan's life: a plan for 1024 rows runs a 1-row batch
   * unsplit, on a few CTAs; engines that capture graphs per batch-size bucket make a plan
   * per bucket). */
  int32_t num_splits;
  /* [experimental] Version 2. Requests with at least this many rows in a batch (prefill
   * chunks, verify rows) take the grouped multi-row route where the backend has one (CUDA,
   * SM75+): groups of up to 16 consecutive rows read each selected K/V tile once, on
   * tensor cores. 0: the library's measured crossover (docs/attention.md); -1: never
   * (every row on the decode route); n >= 1: from n rows. Results agree with the decode
   * route within the attention tolerances. The plan's workspace grows with the route
   * (plan_info). */
  int32_t multi_row_min_rows;
} qsakv_plan_options;
/* Fills defaults: max_rows and max_requests from the config, splits from occupancy. */
QSAKV_API qsakv_status qsakv_plan_options_init(qsakv_plan_options* options);
/* The same defaults as an initializer. */
#define QSAKV_PLAN_OPTIONS_INIT \
  { sizeof(qsakv_plan_options), QSAKV_PLAN_OPTIONS_VERSION, 0, 0, 0, 0 }

/* Makes a plan for batches up to the given maximum shape. Allocates its device metadata
 * and workspace (blocking). A CUDA graph captured with a plan stays valid across
 * qsakv_plan_update calls with other batches of at most that shape. The cache must
 * outlive the plan. options NULL: the defaults of qsakv_plan_options_init. */
QSAKV_API qsakv_status qsakv_plan_create(qsakv_plan** out, qsakv_cache* cache,
                                         const qsakv_plan_options* options);
/* Releases a plan. Waits for its last metadata copy to finish (host side only); make sure
 * no select or attention call that uses it is still queued on a stream, and that no CUDA
 * graph that captured it is replayed afterwards. NULL is a no-op. */
QSAKV_API void qsakv_plan_destroy(qsakv_plan* plan);

#define QSAKV_BATCH_VERSION 1
typedef struct qsakv_batch {
  size_t struct_size;
  uint32_t version;
  int32_t num_requests;
  /* Host int32 [num_requests + 1]: the rows of request r are [query_start[r],
   * query_start[r+1]), one row per new token (decode: 1; verify: 1 + spec; prefill: a
   * chunk). Rows are ordered by request. */
  const int32_t* query_start;
  /* Host int32 [num_requests]: tokens of request r after this step, the new rows
   * included: its rows sit at positions seq_lens[r] - n_r ... seq_lens[r] - 1. */
  const int32_t* seq_lens;
  /* Host int32 [num_requests]: raw-ring slot of each request; NULL: r. Checked (0 ..
   * max_requests - 1) and kept in the plan, but no call reads it today: the ring's keys are
   * placed by qsakv_store_index_keys' own request_slots and read by the engine, which
   * compresses them (qsakv_cache_get_layer_buffers). */
  const int32_t* request_slots;
  /* DEVICE int32 [num_requests, block_table_stride]: physical block of each logical
   * page. Read by select and attention at run time (not copied): keep it alive and
   * written until they ran. */
  const int32_t* block_table;
  int32_t block_table_stride;
} qsakv_batch;
/* struct_size and version set, every other field zero or NULL: fill them. */
#define QSAKV_BATCH_INIT \
  { sizeof(qsakv_batch), QSAKV_BATCH_VERSION, 0, NULL, NULL, NULL, NULL, 0 }

/* Describes the next batch: host work (validation, row maps) and an async copy of the
 * metadata to the plan's device buffers on `stream`. Enqueue the plan's select and
 * attention calls on the same stream (or order them after it): the copy overwrites what
 * earlier calls read, and attention calls of one plan share its split-K workspace, so
 * they must not run concurrently (one plan per stream). Blocking only while the previous update's
 * copy is still reading the staging buffer. Not capturable: an update on a stream being
 * captured (or on the legacy stream while a blocking stream of the device is) returns
 * QSAKV_ERROR_STATE and changes nothing; capture the calls that use the plan instead. */
QSAKV_API qsakv_status qsakv_plan_update(qsakv_plan* plan, const qsakv_batch* batch,
                                         qsakv_stream_t stream);

#define QSAKV_PLAN_INFO_VERSION 2
typedef struct qsakv_plan_info {
  size_t struct_size;
  uint32_t version;
  int32_t max_rows;
  int32_t max_requests;
  int32_t num_splits;
  int32_t num_rows;         /* of the last update */
  int32_t num_requests;     /* of the last update */
  uint64_t workspace_bytes; /* device memory the plan holds */
  /* [experimental] Version 2: the grouped multi-row route. */
  int32_t rows_per_group;     /* 0: the plan has no grouped route */
  int32_t multi_row_min_rows; /* requests with at least this many rows take it */
  int32_t num_groups;         /* row groups of the last update */
  int32_t grouped_rows;       /* rows of the last update on the grouped route */
} qsakv_plan_info;
/* The plan's limits, chosen split count, routes, last batch and device workspace. Set
 * info->struct_size first. Host only. */
QSAKV_API qsakv_status qsakv_plan_get_info(const qsakv_plan* plan, qsakv_plan_info* info);

/* ---------------------------------------------------------------------------------- */
/* Selection: indexer scoring, exact top-k, expansion                                  */
/* ---------------------------------------------------------------------------------- */

/* For every row of the last update: scores the visible compressed blocks of its request
 * (b < min((p+1)/ratio, L/ratio)), keeps the topk_blocks best (score descending, block
 * ascending on ties), expands each to its ratio tokens, appends the open group's tail
 * and pads with -1. index_q: device FP16 [rows, index_num_heads, index_head_dim].
 * topk: device int32 [rows, topk_stride] with topk_stride >= topk_width (the call writes
 * the batch's rows; a CUDA graph that captured it writes each replayed batch's, so size it
 * for the plan's max_rows there), or NULL for the layer's (shared) top-k buffer. Async; run.
 * The score of a block is sum over heads of ReLU(q_h . k_b) / sqrt(index_head_dim); with
 * E4M3 index keys k_b = scale_b x e4m3(codes_b), computed as (the head sum over the codes)
 * / sqrt(index_head_dim) x scale_b (codes 0x7F/0xFF, which the store never writes, read
 * as +-480).
 * Numerics: the CPU backend is the reference (FP32 scores). The CUDA backend scores on
 * tensor cores (FP32 accumulation in another order), so its selection equals the CPU's
 * except for blocks whose score lies within a stated tolerance of the row's k-th score
 * (docs/selection.md); with scores exact in FP32 (e.g. small-integer inputs) the two are
 * identical, ties included. Deterministic and batch-invariant on a given GPU: a row's
 * selection depends only on its own inputs. The CUDA backend supports 1..8 index heads,
 * index_head_dim 64, 128 or 256 and up to 1024 top-k blocks (QSAKV_ERROR_UNSUPPORTED
 * otherwise). */
QSAKV_API qsakv_status qsakv_select_topk(qsakv_plan* plan, int32_t layer, const void* index_q,
                                         int32_t* topk, int64_t topk_stride, qsakv_stream_t stream);

/* ---------------------------------------------------------------------------------- */
/* Attention                                                                           */
/* ---------------------------------------------------------------------------------- */

typedef enum qsakv_attention_mode {
  QSAKV_ATTENTION_SPARSE = 0,                /* over the top-k indices of each row */
  QSAKV_ATTENTION_DENSE = 1,                 /* over the block table, causal: tokens 0 .. p */
  QSAKV_ATTENTION_MODE_MAX_ENUM = 0x7FFFFFFF /* keeps any int32 a valid value of the type */
} qsakv_attention_mode;

/* Attention of every row of the last update for QSA layer `layer`:
 * softmax(q K^T * softmax_scale) V, the group's query heads sharing their KV head.
 * E4M3: the K scale is folded into the softmax factor, the V scale applied once to the
 * normalised output. q: device, activation dtype, [rows, q_heads, head_dim]. out: same
 * shape and dtype. topk (SPARSE): device int32 [rows, topk_stride] request-relative
 * token positions, -1 = none (as for qsakv_select_topk: the batch's rows are read; size it
 * for max_rows under graph replay); NULL reads the layer's top-k buffer. A row with no
 * selected token outputs zeros. Rows of requests with at least the plan's
 * multi_row_min_rows rows take the grouped route (plan options): a row's list must not
 * name a token twice there (the route takes the union of its rows' lists, so a repeat
 * counts once; the decode route and the CPU backend count it twice); the library's own
 * selection never repeats one. Async; run: no allocation, no synchronisation,
 * capturable. */
QSAKV_API qsakv_status qsakv_attention_run(qsakv_plan* plan, int32_t layer,
                                           qsakv_attention_mode mode, const void* q,
                                           const int32_t* topk, int64_t topk_stride, void* out,
                                           qsakv_stream_t stream);

/* ---------------------------------------------------------------------------------- */
/* Calibration: activation statistics, rank merging, scales, overlays                   */
/* ---------------------------------------------------------------------------------- */

/* A calibration handle accumulates, per QSA layer and per K/V, over every observed
 * activation x: count, finite count, nonzero count, max |x| over finite values, and a
 * log2 histogram of the finite nonzero |x|: QSAKV_CALIB_BINS bins over
 * [2^QSAKV_CALIB_LOG2_MIN, 2^QSAKV_CALIB_LOG2_MAX],
 *   bin = floor((log2|x| - QSAKV_CALIB_LOG2_MIN) * QSAKV_CALIB_BINS / 40), clamped to
 *   [0, QSAKV_CALIB_BINS - 1] (log2 evaluated in FP64; activations are 16-bit, so the
 *   library precomputes the bin of every bit pattern and both backends share it).
 * Zeros and non-finite values are counted, never binned.
 *
 * Two kinds of handle:
 * - live (qsakv_calib_create): statistics in device memory of a context, updated by
 *   qsakv_calib_observe on the caller's stream, reducible over NCCL;
 * - host (qsakv_calib_snapshot, qsakv_calib_load, qsakv_calib_merge): a host copy that
 *   can be queried, saved, merged, summarised and turned into an overlay.
 * A handle records the model config, a fingerprint of it, the TP size, which TP ranks
 * its statistics cover and how many calibration runs they pool. */
typedef struct qsakv_calib qsakv_calib;

#define QSAKV_CALIB_BINS 4096
#define QSAKV_CALIB_LOG2_MIN (-24)
#define QSAKV_CALIB_LOG2_MAX 16
/* The largest finite E4M3 value: scale = max_abs / QSAKV_E4M3_MAX, rounded up. */
#define QSAKV_E4M3_MAX 448.0f

typedef enum qsakv_calib_kind {
  QSAKV_CALIB_K = 0,
  QSAKV_CALIB_V = 1,
  QSAKV_CALIB_KIND_MAX_ENUM = 0x7FFFFFFF
} qsakv_calib_kind;

/* A live handle for `config` (validated; its activation dtype must be FP16 or BF16) on
 * `context`. Allocates its device statistics (zeroed) and a 128 KiB bin table; blocking.
 * It starts STOPPED: observe is a no-op until qsakv_calib_start. The context must
 * outlive the handle. */
QSAKV_API qsakv_status qsakv_calib_create(qsakv_calib** out, qsakv_context* context,
                                          const qsakv_model_config* config);
/* Releases a calibration handle (live or host copy). A live handle's queued observe calls
 * must have finished (synchronise their stream). NULL is a no-op. */
QSAKV_API void qsakv_calib_destroy(qsakv_calib* calib);

/* Start or stop counting (host-side flag; immediate, not ordered on any stream). Stop
 * around warm-up, profiling and graph-capture passes so that only real traffic counts.
 * Live handles only (QSAKV_ERROR_STATE otherwise). */
QSAKV_API qsakv_status qsakv_calib_start(qsakv_calib* calib);
QSAKV_API qsakv_status qsakv_calib_stop(qsakv_calib* calib);

/* Observes K and V of one QSA layer (model-layer id). k, v: device, the config's
 * activation dtype, [num_tokens, kv_heads (this rank), head_dim] contiguous, 16-byte
 * aligned on CUDA. While stopped this is a no-op that returns QSAKV_SUCCESS and reads
 * no data (its arguments are still checked, so warm-up passes catch wiring bugs: layer,
 * num_tokens, and for num_tokens > 0 k, v and their alignment).
 * Async on `stream`; run: no allocation, no synchronisation, capturable (a captured
 * observe counts at every replay, so capture only while stopped unless that is wanted).
 * Observing on several streams at once is safe (atomic updates). QSAKV_ERROR_STATE
 * after qsakv_calib_allreduce (the statistics are global then). */
QSAKV_API qsakv_status qsakv_calib_observe(qsakv_calib* calib, int32_t layer, const void* k,
                                           const void* v, int64_t num_tokens,
                                           qsakv_stream_t stream);

/* Reduces a live handle's statistics in place over an NCCL communicator of the TP
 * group (nccl_comm: an ncclComm_t whose size is the config's tp_size and whose rank is
 * its tp_rank): max for maxima, sum for counts and histograms. Collective: every rank
 * calls it, on the stream its observes ran on. NCCL is loaded at call time
 * (dlopen "libnccl.so.2", or the file QSAKV_NCCL_LIBRARY names); without it:
 * QSAKV_ERROR_NCCL, as for any NCCL failure. CPU
 * backend: QSAKV_ERROR_UNSUPPORTED (merge saved files instead). Once only per handle
 * (a second reduction would count twice: QSAKV_ERROR_STATE). Async on `stream`; does
 * not allocate. Afterwards the handle covers every rank. */
QSAKV_API qsakv_status qsakv_calib_allreduce(qsakv_calib* calib, void* nccl_comm,
                                             qsakv_stream_t stream);

/* A host copy of any handle. For a live handle: copies its device statistics after the
 * work enqueued on `stream` and waits for it (blocking). */
QSAKV_API qsakv_status qsakv_calib_snapshot(qsakv_calib** out, const qsakv_calib* calib,
                                            qsakv_stream_t stream);

#define QSAKV_CALIB_INFO_VERSION 1
typedef struct qsakv_calib_info {
  size_t struct_size;
  uint32_t version;
  int32_t live;    /* 1: device statistics (create); 0: host copy */
  int32_t started; /* live handles: 1 while counting */
  int32_t reduced; /* 1 after qsakv_calib_allreduce */
  int32_t tp_size;
  int32_t rank;          /* the rank that observed; -1 when several ranks are merged */
  int32_t ranks_covered; /* distinct TP ranks whose statistics are included */
  int32_t complete;      /* 1 when ranks_covered == tp_size */
  int32_t num_runs;      /* calibration runs pooled (envelope merges add them) */
  qsakv_dtype activation_dtype;
  int32_t num_qsa_layers;
  int32_t qsa_layers[QSAKV_MAX_LAYERS];
  char config_fingerprint[65]; /* SHA-256 hex of the calibration-relevant config */
} qsakv_calib_info;
/* A calibration handle's state: live or host copy, started, reduced, TP size and ranks
 * covered, runs pooled, layers, config fingerprint. Set info->struct_size first. */
QSAKV_API qsakv_status qsakv_calib_get_info(const qsakv_calib* calib, qsakv_calib_info* info);
/* The full model config the statistics were gathered for. */
QSAKV_API qsakv_status qsakv_calib_get_config(const qsakv_calib* calib, qsakv_model_config* config);

#define QSAKV_CALIB_STATS_VERSION 1
typedef struct qsakv_calib_stats {
  size_t struct_size;
  uint32_t version;
  uint64_t count;         /* every observed value */
  uint64_t finite_count;  /* count - non-finite (NaN, +-inf) */
  uint64_t nonzero_count; /* finite and nonzero: the histogram's total */
  float max_abs;          /* max |x| over finite values (0 when none) */
} qsakv_calib_stats;

/* Statistics of one QSA layer and kind of a HOST handle (QSAKV_ERROR_STATE for a live
 * one: snapshot it first). histogram: NULL, or uint64_t[QSAKV_CALIB_BINS]. Blocking. */
QSAKV_API qsakv_status qsakv_calib_get_stats(const qsakv_calib* calib, int32_t layer,
                                             qsakv_calib_kind kind, qsakv_calib_stats* stats,
                                             uint64_t* histogram);

/* Saves a host handle's statistics (format: docs/calibration.md; a safetensors file
 * whose metadata holds the schema version, config fingerprint, config, TP size, rank,
 * covered ranks and run count). Refuses an existing path (INVALID_ARGUMENT); writes a
 * temporary file beside it and renames it. Blocking. */
QSAKV_API qsakv_status qsakv_calib_save(const qsakv_calib* calib, const char* path);
/* Loads a statistics file into a host handle. Strict: QSAKV_ERROR_FORMAT naming the
 * field for anything malformed or inconsistent; a missing file is QSAKV_ERROR_IO. */
QSAKV_API qsakv_status qsakv_calib_load(qsakv_calib** out, const char* path);

typedef enum qsakv_calib_merge_mode {
  /* Statistics of distinct TP ranks of one run: same fingerprint, disjoint ranks, same
   * run count. Covered ranks are united. */
  QSAKV_CALIB_MERGE_RANKS = 0,
  /* Complete statistics (every rank) of several runs: same fingerprint. The envelope:
   * run counts add up. */
  QSAKV_CALIB_MERGE_ENVELOPE = 1,
  QSAKV_CALIB_MERGE_MODE_MAX_ENUM = 0x7FFFFFFF /* keeps any int32 a valid value of the type */
} qsakv_calib_merge_mode;

/* Merges host handles into a new one: max of maxima, sums of counts and histograms
 * (the same algebra in both modes; the mode decides what is checked and recorded). A
 * sum that would not fit in 64 bits is refused (QSAKV_ERROR_INVALID_ARGUMENT naming the
 * layer, K/V and field): counts never wrap.
 * Mismatched fingerprints or TP sizes are QSAKV_ERROR_INVALID_ARGUMENT naming both;
 * overlapping ranks (RANKS) or an incomplete input (ENVELOPE) too. With two or more
 * inputs, each must have observed every QSA layer's K and V (count > 0): summed, the
 * others' counts would hide the gap, and at TP > 1 the layer's scale would miss the KV
 * heads of the ranks that input covers. Such an input is QSAKV_ERROR_OVERLAY_INCOMPLETE
 * naming the input (index), its TP ranks, the layer and K/V (checked after the rules
 * above). A single input is copied as is (qsakv_calib_summarize refuses its gaps).
 * Blocking. */
QSAKV_API qsakv_status qsakv_calib_merge(qsakv_calib** out, const qsakv_calib* const* inputs,
                                         int32_t num_inputs, qsakv_calib_merge_mode mode);

/* The scale of a maximum: the smallest FP32 value s with s >= max_abs / 448 (the exact
 * quotient rounded up). Hence 448 * s >= max_abs exactly, so the FP32 product
 * 448.0f * s >= max_abs and the store's FP32 quotient max_abs / s <= 448: no calibration
 * value saturates. QSAKV_ERROR_OVERLAY_BAD_SCALE for max_abs that is not finite and > 0. */
QSAKV_API qsakv_status qsakv_calib_scale_from_max(float max_abs, float* scale);

#define QSAKV_CALIB_SUMMARY_VERSION 1
typedef struct qsakv_calib_summary {
  size_t struct_size;
  uint32_t version;
  uint64_t count;
  uint64_t finite_count;
  uint64_t nonzero_count;
  float max_abs;
  float scale;               /* qsakv_calib_scale_from_max(max_abs) */
  float p99_9;               /* |x| quantiles of the finite values (zeros included), from */
  float p99_99;              /* the histogram: upper edge of the bin, capped at max_abs */
  double saturate_fraction;  /* finite values with |x| > 448 * scale (0 by construction) */
  double underflow_fraction; /* nonzero values whose bins lie below scale * 2^-10: E4M3
                                stores them as zero (a lower bound) */
} qsakv_calib_summary;

/* Summarises one QSA layer and kind of a host handle, after checking the whole handle
 * (each refusal names the layer and K/V, first broken rule in this order):
 * - counts that contradict each other (e.g. a sum that wrapped: fewer nonzero values
 *   than max |x| implies, a histogram that does not add up): INVALID_ARGUMENT;
 * - the statistics do not cover every TP rank: QSAKV_ERROR_OVERLAY_INCOMPLETE;
 * - per layer (ascending), K then V: never observed (a missing layer, or a missing half
 *   of its K/V pair): QSAKV_ERROR_OVERLAY_INCOMPLETE; non-finite activations seen:
 *   QSAKV_ERROR_CALIB_NON_FINITE; max |x| is zero: QSAKV_ERROR_OVERLAY_BAD_SCALE.
 * Blocking. */
QSAKV_API qsakv_status qsakv_calib_summarize(const qsakv_calib* calib, int32_t layer,
                                             qsakv_calib_kind kind, qsakv_calib_summary* summary);

/* Summarises every QSA layer (all refusals above) and writes the scale pack with
 * qsakv_overlay_write(out_dir, ...) and `options`, bound by default to what was
 * calibrated: contract_tp_size 0 (unset) is the statistics' TP size and -1 asks for no TP
 * constraint; contract_activation_dtype INVALID (unset) is the statistics' activation
 * dtype (there is no unconstrained dtype here: write the scales of qsakv_calib_summarize
 * with qsakv_overlay_write for that). contract_speculative_tokens and contract_min_sm
 * are used as given (-1 and 0: not constrained): the statistics do not settle them (the
 * recorded config's speculative_tokens is no part of the fingerprint, so the inputs of a
 * merge may differ in it). A contract_tp_size outside -1..65536 is INVALID_ARGUMENT.
 * Blocking. */
QSAKV_API qsakv_status qsakv_calib_write_overlay(const qsakv_calib* calib, const char* out_dir,
                                                 const qsakv_overlay_write_options* options);

/* ---------------------------------------------------------------------------------- */
/* Tensor-parallel consensus                                                           */
/* ---------------------------------------------------------------------------------- */

/* Collective: every rank of the caller's NCCL communicator (an ncclComm_t, one rank per
 * process, numbered as tp_rank) calls it with its own config and overlay (NULL for 16-bit
 * caches), before an E4M3 cache is used. All ranks must agree on every config field but
 * tp_rank, on the overlay (scale-file SHA-256, layer prefix, validation state) and on
 * the numbering (communicator size = tp_size, communicator rank = tp_rank). On any
 * difference every rank returns QSAKV_ERROR_TP_MISMATCH with the same message, naming
 * each field that differs and which ranks hold which value. Blocking (synchronises
 * `stream`); allocates a small device buffer; CUDA backend only (UNSUPPORTED on the CPU
 * backend); NCCL is loaded at call time (QSAKV_ERROR_NCCL when absent). */
QSAKV_API qsakv_status qsakv_tp_consensus(qsakv_context* context, const qsakv_model_config* config,
                                          const qsakv_overlay* overlay, void* nccl_comm,
                                          qsakv_stream_t stream);

/* ---------------------------------------------------------------------------------- */
/* Checkpoint revision                                                                 */
/* ---------------------------------------------------------------------------------- */

/* The revision an overlay is bound to: the lower-case hex SHA-256 of a checkpoint's
 * model.safetensors.index.json. `path` is the checkpoint directory or the index file
 * itself. A directory that qsakv_overlay_materialize built (it holds
 * qsakv-provenance.json) answers with its base's revision, hashed now from the base
 * directory the record names: so the revision and the overlay can come from the one
 * calibrated directory, and a base changed since is a REVISION_MISMATCH at validation.
 * There, the base index unreadable is IO, and the directory's own index changed since it
 * was built is HASH_MISMATCH. Writes 64 hex digits and a NUL to out_hex (65 bytes).
 * Blocking. */
QSAKV_API qsakv_status qsakv_checkpoint_revision(const char* path, char out_hex[65]);

/* ---------------------------------------------------------------------------------- */
/* Memory helpers (for callers without their own allocator, e.g. tools and tests)       */
/* ---------------------------------------------------------------------------------- */

/* Device memory of the context's backend (host memory for CPU). Blocking. */
QSAKV_API qsakv_status qsakv_malloc(qsakv_context* context, void** out, size_t bytes);
/* Releases memory from qsakv_malloc on the same context; make sure no queued work still
 * uses it. A NULL context or ptr is a no-op. */
QSAKV_API void qsakv_free(qsakv_context* context, void* ptr);
typedef enum qsakv_copy_kind {
  QSAKV_COPY_HOST_TO_DEVICE = 1,
  QSAKV_COPY_DEVICE_TO_HOST = 2,
  QSAKV_COPY_DEVICE_TO_DEVICE = 3,
  QSAKV_COPY_KIND_MAX_ENUM = 0x7FFFFFFF /* keeps any int32 a valid value of the type */
} qsakv_copy_kind;
/* Async copy on `stream` (synchronous for the CPU backend). */
QSAKV_API qsakv_status qsakv_memcpy(qsakv_context* context, void* dst, const void* src,
                                    size_t bytes, qsakv_copy_kind kind, qsakv_stream_t stream);
/* Waits for `stream` (no-op on the CPU backend). */
QSAKV_API qsakv_status qsakv_stream_synchronize(qsakv_context* context, qsakv_stream_t stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* QSAKV_H */
