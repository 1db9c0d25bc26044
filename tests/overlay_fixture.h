// SPDX-License-Identifier: Apache-2.0
/* Fixtures for the overlay tests: temporary directories, a synthetic base checkpoint,
 * and hand-built scale files and manifests (malformed on purpose where a test says so).
 * Hashes come from OpenSSL, not from the library, so the tests do not trust the code
 * they test. Only the public header is used. */
#ifndef QSAKV_OVERLAY_FIXTURE_H
#define QSAKV_OVERLAY_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "qsakv.h"
#include "testutil.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Expects `call` to return `status`; on a mismatch prints the library's message. */
#define OVF_EXPECT(call, status) TU_EXPECT_STATUS(call, status)
#define OVF_OK(call) OVF_EXPECT(call, QSAKV_SUCCESS)
/* The calling thread's last message contains `text`. */
#define OVF_MESSAGE_HAS(text)                                              \
  do {                                                                     \
    if (!strstr(qsakv_last_error(), (text)))                               \
      fail_msg("message \"%s\" lacks \"%s\"", qsakv_last_error(), (text)); \
  } while (0)

#define OVF_MAX_TENSORS 64
#define OVF_PATH 512

/* One tensor of a hand-built safetensors file. shape is JSON ("[]", "[2]"); nbytes of
 * bytes follow in the data section; offsets are laid out contiguously. */
typedef struct ovf_tensor {
  char name[160];
  const char* dtype;
  const char* shape;
  unsigned char bytes[16];
  size_t nbytes;
} ovf_tensor;

typedef struct ovf_pack {
  char root[128];            /* mkdtemp; removed by ovf_cleanup */
  char base_dir[192];        /* root/base: a synthetic base checkpoint */
  char base_index[OVF_PATH]; /* base_dir/model.safetensors.index.json */
  char base_sha[65];         /* its SHA-256 */
  char pack_dir[192];        /* root/pack */
  char scale[OVF_PATH];      /* pack_dir/model-kvscales.safetensors */
  char manifest[OVF_PATH];   /* pack_dir/qsakv-overlay.json */
  int n;
  ovf_tensor t[OVF_MAX_TENSORS];
  const char* prefix;   /* manifest layer_prefix */
  const char* contract; /* manifest "contract" JSON */
  const char* metadata; /* scale file __metadata__ JSON, or NULL */
  int unit_scale_control;
} ovf_pack;

/* Creates root, base and pack dirs and the base index; fills the 24 canonical scale
 * tensors of the reference model (prefix model.layers) with k = 0.01 * (i + 1),
 * v = 0.02 * (i + 1) for QSA layer index i. Nothing is written to pack_dir yet. */
void ovf_init(ovf_pack* p);
void ovf_cleanup(ovf_pack* p);

/* Sets tensor i to an F32 scalar. */
void ovf_set_f32(ovf_pack* p, int i, const char* name, float value);
/* Appends a tensor; returns its index. */
int ovf_add(ovf_pack* p, const char* name, const char* dtype, const char* shape, const void* bytes,
            size_t nbytes);
/* Removes tensor i (later tensors move down). */
void ovf_remove(ovf_pack* p, int i);
/* Index of the canonical tensor of QSA layer `layer` (k: kind 'k', v: 'v'). */
int ovf_find(const ovf_pack* p, int layer, char kind);

/* Writes the scale file from p->t (well-formed container) and a matching manifest. */
void ovf_write_pack(ovf_pack* p);
/* Writes the scale file as given bytes, and a manifest listing p->t's names. */
void ovf_write_raw_pack(ovf_pack* p, const void* bytes, size_t n);
/* A well-formed image of p->t with the header text replaced by `header` (length as
 * given). The data section is p->t's bytes. Returns the size written to buf. */
size_t ovf_image_with_header(const ovf_pack* p, const char* header, char* buf, size_t cap);
/* The header JSON text p->t would get. */
void ovf_header(const ovf_pack* p, char* buf, size_t cap);
/* Rewrites the manifest (for p->t's names and the current scale file's hash). */
void ovf_write_manifest(ovf_pack* p);

/* File helpers. */
void ovf_write_file(const char* path, const void* data, size_t n);
void ovf_write_text(const char* path, const char* text);
char* ovf_read_text(const char* path); /* malloc'd; NULL if unreadable */
void ovf_sha256_file(const char* path, char out[65]);
void ovf_rmtree(const char* path);
int ovf_exists(const char* path);

/* The reference config ("qwen4_exp") with the given TP size (rank 0). */
void ovf_config(qsakv_model_config* c, int tp_size);

/* Loads p->scale (bare file form, NULL manifest) and returns the status; *out set. */
qsakv_status ovf_load(ovf_pack* p, qsakv_overlay** out);
/* Loads p->scale and validates it against the reference config at TP1 and p->base_sha;
 * on a refusal the handle must come back NULL, and validated must match the status. */
qsakv_status ovf_load_validate(ovf_pack* p);
/* The same for any path (a pack or checkpoint directory, a scale file). */
qsakv_status ovf_load_validate_path(ovf_pack* p, const char* path);

#ifdef __cplusplus
}
#endif

#endif
