// Package qsakv is the Go (cgo) binding of libqsakv: calibrated FP8 (E4M3) KV caches
// and sparse (QSA) / dense attention for LLM serving.
//
// Every C object is owned by a Go value with a Close method (idempotent; a finalizer is
// the backstop; Go runs finalizers on a goroutine of its own, so a handle left to its
// finalizer is freed there, at a time of Go's choosing); children keep their parents
// reachable (a Cache its Context, a Plan its Cache; an Overlay may be closed once its
// caches exist, as in C). Every failure is an *Error carrying the Status and the
// library's message. The library's message is per OS thread, so each call and the read
// of its message run with the goroutine locked to its thread.
//
// The package finds the library with pkg-config (qsakv.pc of an installed libqsakv, or
// the qsakv-uninstalled.pc a CMake build tree writes): set PKG_CONFIG_PATH accordingly.
// No outside Go modules are used.
package qsakv

/*
#cgo pkg-config: qsakv
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <qsakv.h>

// Option structs start as the header's QSAKV_*_INIT macros make them: this package's own
// struct_size and version, compiled in. A *_init function writes the whole struct as the
// library's header declares it, which a newer library's larger struct would overrun.
static qsakv_context_options qsakv_go_context_options(void) {
  qsakv_context_options o = QSAKV_CONTEXT_OPTIONS_INIT;
  return o;
}
static qsakv_overlay_write_options qsakv_go_overlay_write_options(void) {
  qsakv_overlay_write_options o = QSAKV_OVERLAY_WRITE_OPTIONS_INIT;
  return o;
}

// A preset or a checkpoint's config, which the library writes whole (no macro makes
// them): into a 4 KiB scratch, of which this package's struct is kept, with its own
// struct_size and version.
static qsakv_status qsakv_go_model_config(qsakv_model_config* config, const char* arg,
                                          int from_checkpoint) {
  union {
    max_align_t align;
    unsigned char bytes[4096];
  } scratch;
  _Static_assert(sizeof(qsakv_model_config) <= sizeof(scratch), "the scratch holds the config");
  memset(&scratch, 0, sizeof scratch);
  qsakv_model_config* filled = (qsakv_model_config*)&scratch;
  qsakv_status st = from_checkpoint ? qsakv_model_config_from_checkpoint(filled, arg)
                                    : qsakv_model_config_preset(filled, arg);
  if (st != QSAKV_SUCCESS) return st;
  memcpy(config, filled, sizeof *config);
  config->struct_size = sizeof *config;
  config->version = QSAKV_MODEL_CONFIG_VERSION;
  return st;
}
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"
)

// Status is a qsakv_status code.
type Status int32

// The status codes of include/qsakv.h.
const (
	Success                 Status = C.QSAKV_SUCCESS
	ErrInvalidArgument      Status = C.QSAKV_ERROR_INVALID_ARGUMENT
	ErrInvalidConfig        Status = C.QSAKV_ERROR_INVALID_CONFIG
	ErrUnsupported          Status = C.QSAKV_ERROR_UNSUPPORTED
	ErrNoDevice             Status = C.QSAKV_ERROR_NO_DEVICE
	ErrOutOfMemory          Status = C.QSAKV_ERROR_OUT_OF_MEMORY
	ErrCUDA                 Status = C.QSAKV_ERROR_CUDA
	ErrNCCL                 Status = C.QSAKV_ERROR_NCCL
	ErrIO                   Status = C.QSAKV_ERROR_IO
	ErrFormat               Status = C.QSAKV_ERROR_FORMAT
	ErrState                Status = C.QSAKV_ERROR_STATE
	ErrInternal             Status = C.QSAKV_ERROR_INTERNAL
	ErrOverlayMissing       Status = C.QSAKV_ERROR_OVERLAY_MISSING
	ErrOverlayIncomplete    Status = C.QSAKV_ERROR_OVERLAY_INCOMPLETE
	ErrOverlayBadScale      Status = C.QSAKV_ERROR_OVERLAY_BAD_SCALE
	ErrOverlayBadTensor     Status = C.QSAKV_ERROR_OVERLAY_BAD_TENSOR
	ErrOverlayDuplicate     Status = C.QSAKV_ERROR_OVERLAY_DUPLICATE
	ErrOverlayUnknownTensor Status = C.QSAKV_ERROR_OVERLAY_UNKNOWN_TENSOR
	ErrRevisionMismatch     Status = C.QSAKV_ERROR_REVISION_MISMATCH
	ErrHashMismatch         Status = C.QSAKV_ERROR_HASH_MISMATCH
	ErrContract             Status = C.QSAKV_ERROR_CONTRACT
	ErrOverlayNotValidated  Status = C.QSAKV_ERROR_OVERLAY_NOT_VALIDATED
	ErrCalibNonFinite       Status = C.QSAKV_ERROR_CALIB_NON_FINITE
	ErrTPMismatch           Status = C.QSAKV_ERROR_TP_MISMATCH
	ErrOverlayUnitScales    Status = C.QSAKV_ERROR_OVERLAY_UNIT_SCALES
)

// String is the status' name, e.g. "QSAKV_ERROR_INVALID_CONFIG".
func (s Status) String() string {
	return C.GoString(C.qsakv_status_string(C.qsakv_status(s)))
}

// Error is a failed call: its status and the library's message naming the field,
// layer, expected and actual values.
type Error struct {
	Status  Status
	Message string
}

func (e *Error) Error() string { return e.Status.String() + ": " + e.Message }

// Is makes errors.Is(err, &qsakv.Error{Status: qsakv.ErrInvalidConfig}) match by status.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Status == e.Status
}

// call runs f and, on failure, reads the message on the same OS thread. keep holds the
// Go objects (handles, buffers) whose C pointers f passes: once f has loaded a pointer
// the object may look unreachable, and its finalizer would free it while C still uses
// it (a buffer's last use in a caller's function is exactly that).
func call(f func() C.qsakv_status, keep ...any) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	s := f()
	runtime.KeepAlive(keep)
	if s == C.QSAKV_SUCCESS {
		return nil
	}
	msg := C.GoString(C.qsakv_last_error())
	C.qsakv_clear_error()
	return &Error{Status: Status(s), Message: msg}
}

func invalid(format string, args ...any) error {
	return &Error{Status: ErrInvalidArgument, Message: fmt.Sprintf(format, args...)}
}

// Version is "major.minor.patch" of the loaded library.
func Version() string { return C.GoString(C.qsakv_version_string()) }

// LibraryMatchesHeader says whether the loaded library has the version and ABI of the
// header this package was compiled against.
func LibraryMatchesHeader() bool {
	return C.qsakv_version() == C.QSAKV_VERSION_NUMBER && C.qsakv_abi_version() == C.QSAKV_ABI_VERSION
}

// BuiltWithCUDA says whether the library has the CUDA backend.
func BuiltWithCUDA() bool { return C.qsakv_built_with_cuda() != 0 }

// Backend, Decoder, Dtype and AttentionMode mirror the header's enums.
type (
	Backend       int32
	Decoder       int32
	Dtype         int32
	AttentionMode int32
)

const (
	BackendAuto Backend = C.QSAKV_BACKEND_AUTO
	BackendCPU  Backend = C.QSAKV_BACKEND_CPU
	BackendCUDA Backend = C.QSAKV_BACKEND_CUDA

	// DecoderAuto is the hardware E4M3 conversion on SM89+, the software one before.
	DecoderAuto Decoder = C.QSAKV_DECODER_AUTO
	// DecoderHardware is the FP8 conversion instructions: ErrUnsupported before SM89 and
	// on the CPU backend.
	DecoderHardware Decoder = C.QSAKV_DECODER_HARDWARE
	// DecoderSoftware is the exact bitcast decoder, on every GPU (and the CPU backend's).
	DecoderSoftware Decoder = C.QSAKV_DECODER_SOFTWARE

	DtypeInvalid Dtype = C.QSAKV_DTYPE_INVALID
	DtypeFP16    Dtype = C.QSAKV_DTYPE_FP16
	DtypeBF16    Dtype = C.QSAKV_DTYPE_BF16
	DtypeE4M3    Dtype = C.QSAKV_DTYPE_E4M3
	DtypeFP32    Dtype = C.QSAKV_DTYPE_FP32
	DtypeInt32   Dtype = C.QSAKV_DTYPE_INT32
	DtypeInt64   Dtype = C.QSAKV_DTYPE_INT64

	AttentionSparse AttentionMode = C.QSAKV_ATTENTION_SPARSE
	AttentionDense  AttentionMode = C.QSAKV_ATTENTION_DENSE
)

// String is the dtype's name (qsakv_dtype_name): "fp16", "bf16", "e4m3", "fp32", "int32",
// "int64", or "invalid" for DtypeInvalid and unknown values.
func (d Dtype) String() string { return C.GoString(C.qsakv_dtype_name(C.qsakv_dtype(d))) }

// Size is the bytes per element (qsakv_dtype_size); 0 for DtypeInvalid and unknown values.
func (d Dtype) Size() int { return int(C.qsakv_dtype_size(C.qsakv_dtype(d))) }

// ---------------------------------------------------------------------------------
// Streams
// ---------------------------------------------------------------------------------

// Stream is a CUDA stream (a cudaStream_t, as its address) for the calls that enqueue
// work: each such method X has a variant XOn whose last argument is the Stream, and X is
// XOn on DefaultStream. A cudaStream_t held as a C pointer p (another cgo package's)
// converts with Stream(uintptr(unsafe.Pointer(p))); cudaStreamPerThread is Stream(2).
// The CPU backend ignores the stream (it runs synchronously). The stream must belong to
// the context's device, and the buffers a call reads must stay open until the work
// enqueued on the stream has run (synchronise it before closing them).
type Stream uintptr

// DefaultStream is the legacy default stream (a NULL cudaStream_t), which CUDA graphs
// cannot capture: capture the XOn calls on a stream of your own.
const DefaultStream Stream = 0

// c is the stream as the C API takes it: the handle's bits as a pointer. A cudaStream_t
// is not Go memory, so there is nothing for the garbage collector to track.
func (s Stream) c() C.qsakv_stream_t { return *(*C.qsakv_stream_t)(unsafe.Pointer(&s)) }

// ---------------------------------------------------------------------------------
// Context
// ---------------------------------------------------------------------------------

// Context is a backend (CUDA or the CPU reference) and device.
type Context struct {
	ptr      *C.qsakv_context
	children atomic.Int32 // open caches and buffers made from it (finalizers run on their own goroutine)
}

// ContextOptions are qsakv_context_options; the zero value is the library's default
// (BackendAuto, device 0, DecoderAuto).
type ContextOptions struct {
	Backend Backend
	// Device is the CUDA device ordinal (CUDA backend only; the CPU backend ignores it,
	// but a negative one is refused with ErrInvalidArgument everywhere). Each
	// tensor-parallel rank makes its context on its own GPU.
	Device int32
	// Decoder is the E4M3 decoder the kernels use.
	Decoder Decoder
}

// NewContext creates a context on device 0 with the automatic decoder; BackendAuto picks
// CUDA when a GPU is usable. NewContextWithOptions chooses the device and decoder.
func NewContext(backend Backend) (*Context, error) {
	return NewContextWithOptions(ContextOptions{Backend: backend})
}

// NewContextWithOptions creates a context with all of qsakv_context_options: the backend,
// the CUDA device (ErrNoDevice when CUDA is asked for and there is no such device) and the
// E4M3 decoder. With BackendAuto and no usable GPU it picks the CPU backend and
// ContextInfo.FallbackReason says why.
func NewContextWithOptions(opts ContextOptions) (*Context, error) {
	o := C.qsakv_go_context_options()
	o.backend = C.qsakv_backend(opts.Backend)
	o.device = C.int32_t(opts.Device)
	o.decoder = C.qsakv_decoder(opts.Decoder)
	c := &Context{}
	if err := call(func() C.qsakv_status { return C.qsakv_context_create(&c.ptr, &o) }); err != nil {
		return nil, err
	}
	runtime.SetFinalizer(c, (*Context).Close)
	return c, nil
}

// Close frees the context. Idempotent. While a cache or buffer made from it is still
// open it refuses (ErrState) and frees nothing.
func (c *Context) Close() error {
	if n := c.children.Load(); n > 0 {
		return &Error{Status: ErrState, Message: fmt.Sprintf("context: %d caches or buffers made from it are still open", n)}
	}
	if c.ptr != nil {
		C.qsakv_context_destroy(c.ptr)
		c.ptr = nil
		runtime.SetFinalizer(c, nil)
	}
	return nil
}

func (c *Context) live() error {
	if c == nil || c.ptr == nil {
		return &Error{Status: ErrState, Message: "context: closed"}
	}
	return nil
}

// ContextInfo says what a context chose (qsakv_context_info).
type ContextInfo struct {
	Backend Backend // never BackendAuto
	Decoder Decoder // never DecoderAuto (DecoderSoftware on the CPU backend)
	Device  int32   // -1 for the CPU backend
	// SMVersion is e.g. 90 for SM 9.0; 0 for the CPU backend.
	SMVersion           int32
	MultiprocessorCount int32 // 0 for the CPU backend
	// HasFP8Conversion says whether the GPU has the hardware E4M3 conversion (SM89+).
	HasFP8Conversion  bool
	DeviceMemoryBytes uint64 // 0 for the CPU backend
	DeviceName        string
	FallbackReason    string
	// KernelTier is the CUDA kernel tier (70 or 75; 0 on the CPU backend).
	KernelTier int32
}

// Info describes the context.
func (c *Context) Info() (ContextInfo, error) {
	if err := c.live(); err != nil {
		return ContextInfo{}, err
	}
	var i C.qsakv_context_info
	i.struct_size = C.size_t(unsafe.Sizeof(i))
	i.version = C.QSAKV_CONTEXT_INFO_VERSION
	if err := call(func() C.qsakv_status { return C.qsakv_context_get_info(c.ptr, &i) }, c); err != nil {
		return ContextInfo{}, err
	}
	return ContextInfo{
		Backend: Backend(i.backend), Decoder: Decoder(i.decoder), Device: int32(i.device),
		SMVersion: int32(i.sm_version), MultiprocessorCount: int32(i.multiprocessor_count),
		HasFP8Conversion: i.has_fp8_conversion != 0, DeviceMemoryBytes: uint64(i.device_memory_bytes),
		DeviceName:     C.GoString(&i.device_name[0]),
		FallbackReason: C.GoString(&i.fallback_reason[0]),
		KernelTier:     int32(i.kernel_tier),
	}, nil
}

// Synchronize waits for the default stream (a no-op on the CPU backend).
func (c *Context) Synchronize() error { return c.SynchronizeOn(DefaultStream) }

// SynchronizeOn waits for the work enqueued on stream (a no-op on the CPU backend).
func (c *Context) SynchronizeOn(stream Stream) error {
	if err := c.live(); err != nil {
		return err
	}
	return call(func() C.qsakv_status { return C.qsakv_stream_synchronize(c.ptr, stream.c()) }, c)
}

// ---------------------------------------------------------------------------------
// Model config
// ---------------------------------------------------------------------------------

// ModelConfig is a model's geometry (read through methods) and its runtime fields
// (exported, settable).
type ModelConfig struct {
	base C.qsakv_model_config

	TPSize, TPRank    int32
	SpeculativeTokens int32
	ActivationDtype   Dtype
	KVDtype           Dtype
	BlockSize         int32
	MaxRequests       int32
	MaxBatchedTokens  int32
	MaxModelLen       int32
	// IndexKeyDtype is the compressed index keys' dtype: DtypeFP16 (the default) or
	// DtypeE4M3 (E4M3 codes with one FP32 scale per key, max |x| / 448: 132 instead of
	// 256 bytes per key of 128 dims). The raw index-key ring and the index queries stay
	// FP16.
	IndexKeyDtype Dtype
}

// Preset returns a named preset, e.g. "qwen4_exp" (the reference model).
func Preset(name string) (*ModelConfig, error) {
	return configFrom(name, 0)
}

// FromCheckpoint returns the geometry of a Hugging Face checkpoint (its directory, or its
// config.json); the runtime fields are the qwen4_exp preset's, for the caller to set.
// ErrFormat names the key, ErrIO the file.
func FromCheckpoint(dirOrConfigJSON string) (*ModelConfig, error) {
	return configFrom(dirOrConfigJSON, 1)
}

// configFrom fills a config whole from a preset's name (fromCheckpoint 0) or a
// checkpoint's path (1).
func configFrom(arg string, fromCheckpoint C.int) (*ModelConfig, error) {
	carg := C.CString(arg)
	defer C.free(unsafe.Pointer(carg))
	m := &ModelConfig{}
	if err := call(func() C.qsakv_status { return C.qsakv_go_model_config(&m.base, carg, fromCheckpoint) }); err != nil {
		return nil, err
	}
	m.takeRuntimeFields()
	return m, nil
}

// takeRuntimeFields copies the runtime fields of base into the exported ones.
func (m *ModelConfig) takeRuntimeFields() {
	b := &m.base
	m.TPSize, m.TPRank, m.SpeculativeTokens = int32(b.tp_size), int32(b.tp_rank), int32(b.speculative_tokens)
	m.ActivationDtype, m.KVDtype = Dtype(b.activation_dtype), Dtype(b.kv_dtype)
	m.BlockSize, m.MaxRequests = int32(b.block_size), int32(b.max_requests)
	m.MaxBatchedTokens, m.MaxModelLen = int32(b.max_batched_tokens), int32(b.max_model_len)
	m.IndexKeyDtype = Dtype(b.index_key_dtype)
}

func (m *ModelConfig) c() C.qsakv_model_config {
	b := m.base
	b.tp_size, b.tp_rank, b.speculative_tokens = C.int32_t(m.TPSize), C.int32_t(m.TPRank), C.int32_t(m.SpeculativeTokens)
	b.activation_dtype, b.kv_dtype = C.qsakv_dtype(m.ActivationDtype), C.qsakv_dtype(m.KVDtype)
	b.block_size, b.max_requests = C.int32_t(m.BlockSize), C.int32_t(m.MaxRequests)
	b.max_batched_tokens, b.max_model_len = C.int32_t(m.MaxBatchedTokens), C.int32_t(m.MaxModelLen)
	b.index_key_dtype = C.qsakv_dtype(m.IndexKeyDtype)
	return b
}

// SetHeadDim changes the head dimension (64, 128 or 256).
func (m *ModelConfig) SetHeadDim(d int32) { m.base.head_dim = C.int32_t(d) }

func (m *ModelConfig) HeadDim() int32       { return int32(m.base.head_dim) }
func (m *ModelConfig) IndexNumHeads() int32 { return int32(m.base.index_num_heads) }
func (m *ModelConfig) IndexHeadDim() int32  { return int32(m.base.index_head_dim) }
func (m *ModelConfig) CompressRatio() int32 { return int32(m.base.compress_ratio) }

// QSALayers are the model-layer ids of the QSA layers.
func (m *ModelConfig) QSALayers() []int32 {
	n := int(m.base.num_qsa_layers)
	out := make([]int32, n)
	for i := 0; i < n; i++ {
		out[i] = int32(m.base.qsa_layers[i])
	}
	return out
}

// Validate checks every field: ErrInvalidConfig naming the field and value.
func (m *ModelConfig) Validate() error {
	c := m.c()
	return call(func() C.qsakv_status { return C.qsakv_model_config_validate(&c) })
}

// RankGeometry is this rank's share of the model (qsakv_rank_geometry): its query and KV
// heads (FirstQHead and FirstKVHead are the global ids of its first ones), the top-k
// width and blocks, the raw index-key ring's length and the effective softmax scale.
type RankGeometry struct {
	QHeads, KVHeads, GroupSize, TopkWidth, TopkBlocks, RingLength int32
	SoftmaxScale                                                  float32
	FirstQHead, FirstKVHead                                       int32
}

// RankGeometry validates, then derives this rank's geometry.
func (m *ModelConfig) RankGeometry() (RankGeometry, error) {
	c := m.c()
	var g C.qsakv_rank_geometry
	g.struct_size = C.size_t(unsafe.Sizeof(g))
	g.version = C.QSAKV_RANK_GEOMETRY_VERSION
	if err := call(func() C.qsakv_status { return C.qsakv_model_config_rank_geometry(&c, &g) }); err != nil {
		return RankGeometry{}, err
	}
	return RankGeometry{QHeads: int32(g.q_heads), KVHeads: int32(g.kv_heads), GroupSize: int32(g.group_size),
		TopkWidth: int32(g.topk_width), TopkBlocks: int32(g.topk_blocks), RingLength: int32(g.ring_length),
		SoftmaxScale: float32(g.softmax_scale), FirstQHead: int32(g.first_q_head), FirstKVHead: int32(g.first_kv_head)}, nil
}

// CapacityTokens is how many tokens fit in budgetBytes per rank.
func (m *ModelConfig) CapacityTokens(budgetBytes uint64) (int64, error) {
	cap, err := m.Capacity(budgetBytes)
	return cap.NumTokens, err
}

// Capacity is the capacity plan of a config for a memory budget per rank
// (qsakv_capacity): bytes per token (all QSA layers), the same for the all-FP16 baseline
// (16-bit main cache, FP16 index keys), the fixed costs (the raw index-key rings of all
// requests, the shared top-k workspace and what one per layer would cost), and the blocks
// and tokens that fit BudgetBytes after them.
type Capacity struct {
	MainBytesPerToken, CompressedBytesPerToken, BytesPerToken, FP16BytesPerToken uint64
	NumBlocks, NumTokens, FP16NumTokens                                          int64
	CapacityRatio, IdealRatio                                                    float64
	RingBytes, RingBytesPerRequest, TopkBytes, TopkBytesUnshared                 uint64
	BudgetBytes, BytesPerBlock                                                   uint64
}

// Capacity plans budgetBytes per rank (qsakv_capacity_plan; no allocation).
func (m *ModelConfig) Capacity(budgetBytes uint64) (Capacity, error) {
	c := m.c()
	var k C.qsakv_capacity
	k.struct_size = C.size_t(unsafe.Sizeof(k))
	k.version = C.QSAKV_CAPACITY_VERSION
	if err := call(func() C.qsakv_status { return C.qsakv_capacity_plan(&c, C.uint64_t(budgetBytes), &k) }); err != nil {
		return Capacity{}, err
	}
	return Capacity{
		MainBytesPerToken: uint64(k.main_bytes_per_token), CompressedBytesPerToken: uint64(k.compressed_bytes_per_token),
		BytesPerToken: uint64(k.bytes_per_token), FP16BytesPerToken: uint64(k.fp16_bytes_per_token),
		NumBlocks: int64(k.num_blocks), NumTokens: int64(k.num_tokens), FP16NumTokens: int64(k.fp16_num_tokens),
		CapacityRatio: float64(k.capacity_ratio), IdealRatio: float64(k.ideal_ratio),
		RingBytes: uint64(k.ring_bytes), RingBytesPerRequest: uint64(k.ring_bytes_per_request),
		TopkBytes: uint64(k.topk_bytes), TopkBytesUnshared: uint64(k.topk_bytes_unshared),
		BudgetBytes: uint64(k.budget_bytes), BytesPerBlock: uint64(k.bytes_per_block),
	}, nil
}

// CheckpointRevision is the revision an overlay binds to: the SHA-256 (hex) of a
// checkpoint's model.safetensors.index.json (path: the directory or the file); a
// materialised checkpoint answers with its base's, hashed now (qsakv_checkpoint_revision).
func CheckpointRevision(path string) (string, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var hex [65]C.char
	if err := call(func() C.qsakv_status { return C.qsakv_checkpoint_revision(cpath, &hex[0]) }); err != nil {
		return "", err
	}
	return C.GoString(&hex[0]), nil
}

// TPConsensus is a collective over the TP group's NCCL communicator (an ncclComm_t):
// every rank, before an E4M3 cache is used, with its own config and overlay (nil for
// 16-bit caches). ErrTPMismatch on every rank, with the same message, when the ranks
// differ; CUDA backend only (ErrUnsupported on the CPU backend). It runs on the default
// stream and synchronises it.
func TPConsensus(ctx *Context, m *ModelConfig, o *Overlay, ncclComm unsafe.Pointer) error {
	return TPConsensusOn(ctx, m, o, ncclComm, DefaultStream)
}

// TPConsensusOn is TPConsensus on stream (it synchronises the stream).
func TPConsensusOn(ctx *Context, m *ModelConfig, o *Overlay, ncclComm unsafe.Pointer, stream Stream) error {
	if err := ctx.live(); err != nil {
		return err
	}
	var ov *C.qsakv_overlay
	if o != nil {
		if o.ptr == nil {
			return &Error{Status: ErrState, Message: "overlay: closed"}
		}
		ov = o.ptr
	}
	c := m.c()
	return call(func() C.qsakv_status { return C.qsakv_tp_consensus(ctx.ptr, &c, ov, ncclComm, stream.c()) }, ctx, o)
}

// ---------------------------------------------------------------------------------
// Overlay
// ---------------------------------------------------------------------------------

// Overlay holds calibrated K/V scales bound to a checkpoint revision. A cache copies the
// scales it needs when it is made, so an overlay may be closed as soon as its caches
// exist.
type Overlay struct {
	ptr *C.qsakv_overlay
}

// LoadOverlay loads a checkpoint directory, or a scale file with its manifest
// (manifest "": the default next to it).
func LoadOverlay(path, manifest string) (*Overlay, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var cman *C.char
	if manifest != "" {
		cman = C.CString(manifest)
		defer C.free(unsafe.Pointer(cman))
	}
	o := &Overlay{}
	if err := call(func() C.qsakv_status { return C.qsakv_overlay_load(&o.ptr, cpath, cman) }); err != nil {
		return nil, err
	}
	runtime.SetFinalizer(o, (*Overlay).Close)
	return o, nil
}

// Close frees the overlay. Idempotent. Caches made with it stay usable (they hold copies
// of its scales).
func (o *Overlay) Close() error {
	if o.ptr != nil {
		C.qsakv_overlay_destroy(o.ptr)
		o.ptr = nil
		runtime.SetFinalizer(o, nil)
	}
	return nil
}

// Validate applies every fail-closed rule against the config and the revision.
func (o *Overlay) Validate(m *ModelConfig, revision string) error {
	if o.ptr == nil {
		return &Error{Status: ErrState, Message: "overlay: closed"}
	}
	c := m.c()
	crev := C.CString(revision)
	defer C.free(unsafe.Pointer(crev))
	return call(func() C.qsakv_status { return C.qsakv_overlay_validate(o.ptr, &c, crev) }, o)
}

// OverlayInfo is what an overlay holds (qsakv_overlay_info): its K and V scales, whether
// Validate accepted it, the contract its manifest records (0, -1 or DtypeInvalid where
// not constrained), the checkpoint revision it is bound to, its scale file's SHA-256 and
// the tensor names' layer prefix.
type OverlayInfo struct {
	NumScales                 int32
	Validated                 bool
	UnitScaleControl          bool // the metadata marks a unit-scale negative control
	ContractTPSize            int32
	ContractSpeculativeTokens int32
	ContractActivationDtype   Dtype
	ContractMinSM             int32
	BaseIndexSHA256           string
	ScaleFileSHA256           string
	LayerPrefix               string
}

// Info describes the overlay.
func (o *Overlay) Info() (OverlayInfo, error) {
	if o.ptr == nil {
		return OverlayInfo{}, &Error{Status: ErrState, Message: "overlay: closed"}
	}
	var i C.qsakv_overlay_info
	i.struct_size = C.size_t(unsafe.Sizeof(i))
	i.version = C.QSAKV_OVERLAY_INFO_VERSION
	if err := call(func() C.qsakv_status { return C.qsakv_overlay_get_info(o.ptr, &i) }, o); err != nil {
		return OverlayInfo{}, err
	}
	return OverlayInfo{
		NumScales: int32(i.num_scales), Validated: i.validated != 0, UnitScaleControl: i.unit_scale_control != 0,
		ContractTPSize: int32(i.contract_tp_size), ContractSpeculativeTokens: int32(i.contract_speculative_tokens),
		ContractActivationDtype: Dtype(i.contract_activation_dtype), ContractMinSM: int32(i.contract_min_sm),
		BaseIndexSHA256: C.GoString(&i.base_index_sha256[0]), ScaleFileSHA256: C.GoString(&i.scale_file_sha256[0]),
		LayerPrefix: C.GoString(&i.layer_prefix[0]),
	}, nil
}

// Scales returns the K and V scale of a model layer.
func (o *Overlay) Scales(layer int32) (k, v float32, err error) {
	if o.ptr == nil {
		return 0, 0, &Error{Status: ErrState, Message: "overlay: closed"}
	}
	var ck, cv C.float
	err = call(func() C.qsakv_status { return C.qsakv_overlay_get_scales(o.ptr, C.int32_t(layer), &ck, &cv) }, o)
	return float32(ck), float32(cv), err
}

// LayerScales are one layer's scales in a scale file (NaN for a half it does not give).
type LayerScales struct {
	Layer int32
	K, V  float32
}

// ReadScaleFile returns the scales of a bare scale file by ascending layer, for
// inspection (no manifest, no validation), and the file's SHA-256 (hex).
func ReadScaleFile(path string) ([]LayerScales, string, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	// One read for any file of a model's layers; a larger one is read again, sized.
	for capacity := C.int32_t(C.QSAKV_MAX_LAYERS); ; {
		layers, ks, vs := make([]C.int32_t, capacity), make([]C.float, capacity), make([]C.float, capacity)
		var hex [65]C.char
		var n C.int32_t
		if err := call(func() C.qsakv_status {
			return C.qsakv_overlay_read_scale_file(cpath, capacity, &layers[0], &ks[0], &vs[0], &n, &hex[0])
		}); err != nil {
			return nil, "", err
		}
		if n > capacity {
			capacity = n
			continue
		}
		out := make([]LayerScales, 0, n)
		for i := 0; i < int(n); i++ {
			out = append(out, LayerScales{int32(layers[i]), float32(ks[i]), float32(vs[i])})
		}
		return out, C.GoString(&hex[0]), nil
	}
}

// OverlayWriteOptions are qsakv_overlay_write_options: what a scale pack's manifest
// records. The zero value binds to no base index and constrains nothing.
type OverlayWriteOptions struct {
	LayerPrefix   string // the tensor names' layer prefix ("": "model.layers")
	BaseIndexPath string // the base checkpoint's model.safetensors.index.json
	// The contract a runtime must meet: 0 (DtypeInvalid, nil) where not constrained
	// (Calib.WriteOverlay: 0 TP size and DtypeInvalid are the statistics', -1 TP size
	// is not constrained).
	ContractTPSize            int32  // 1..65536
	ContractSpeculativeTokens *int32 // 0..64
	ContractActivationDtype   Dtype
	ContractMinSM             int32 // 1..10000 (70: SM 7.0)
	UnitScaleControl          bool  // marks a unit-scale negative control in the metadata
}

// c is the options in C, with the C strings it holds; free releases them.
func (w OverlayWriteOptions) c() (o C.qsakv_overlay_write_options, free func()) {
	o = C.qsakv_go_overlay_write_options()
	var strs []*C.char
	if w.LayerPrefix != "" {
		o.layer_prefix = C.CString(w.LayerPrefix)
		strs = append(strs, o.layer_prefix)
	}
	if w.BaseIndexPath != "" {
		o.base_index_path = C.CString(w.BaseIndexPath)
		strs = append(strs, o.base_index_path)
	}
	o.contract_tp_size = C.int32_t(w.ContractTPSize)
	if w.ContractSpeculativeTokens != nil {
		o.contract_speculative_tokens = C.int32_t(*w.ContractSpeculativeTokens)
	}
	o.contract_activation_dtype = C.qsakv_dtype(w.ContractActivationDtype)
	o.contract_min_sm = C.int32_t(w.ContractMinSM)
	if w.UnitScaleControl {
		o.unit_scale_control = 1
	}
	return o, func() {
		for _, p := range strs {
			C.free(unsafe.Pointer(p))
		}
	}
}

// WriteOverlay writes a scale pack into outDir (which must not exist) for the given
// layers' scales, bound to the checkpoint index file baseIndexPath.
func WriteOverlay(outDir string, layers []int32, kScales, vScales []float32, baseIndexPath string) error {
	return WriteOverlayWithOptions(outDir, layers, kScales, vScales, OverlayWriteOptions{BaseIndexPath: baseIndexPath})
}

// WriteOverlayWithOptions is WriteOverlay with all of qsakv_overlay_write_options (the
// layer prefix and the contract).
func WriteOverlayWithOptions(outDir string, layers []int32, kScales, vScales []float32, opts OverlayWriteOptions) error {
	if len(kScales) != len(layers) || len(vScales) != len(layers) || len(layers) == 0 {
		return invalid("scales: %d layers, %d K and %d V scales", len(layers), len(kScales), len(vScales))
	}
	cout := C.CString(outDir)
	defer C.free(unsafe.Pointer(cout))
	o, free := opts.c()
	defer free()
	return call(func() C.qsakv_status {
		return C.qsakv_overlay_write(cout, (*C.int32_t)(unsafe.Pointer(&layers[0])),
			(*C.float)(unsafe.Pointer(&kScales[0])), (*C.float)(unsafe.Pointer(&vScales[0])),
			C.int32_t(len(layers)), &o)
	})
}

// MaterializeOverlay builds a calibrated checkpoint directory outDir (which must not
// exist) from a base checkpoint directory and a scale pack written by WriteOverlay
// (qsakv_overlay_materialize): a merged index, links to the base's files, the scale file
// and manifest, and a provenance record. ErrRevisionMismatch when the base is not the one
// the pack is bound to, ErrOverlayDuplicate when the base already has a scale's name.
func MaterializeOverlay(outDir, baseCheckpointDir, scalePackDir string) error {
	cout, cbase, cpack := C.CString(outDir), C.CString(baseCheckpointDir), C.CString(scalePackDir)
	defer C.free(unsafe.Pointer(cout))
	defer C.free(unsafe.Pointer(cbase))
	defer C.free(unsafe.Pointer(cpack))
	return call(func() C.qsakv_status { return C.qsakv_overlay_materialize(cout, cbase, cpack) })
}
