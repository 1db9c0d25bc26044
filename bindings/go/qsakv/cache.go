package qsakv

/*
#include <stdlib.h>
#include <string.h>
#include <qsakv.h>

// As the header's QSAKV_*_INIT macros make them (see qsakv.go).
static qsakv_cache_options qsakv_go_cache_options(void) {
  qsakv_cache_options o = QSAKV_CACHE_OPTIONS_INIT;
  return o;
}
static qsakv_plan_options qsakv_go_plan_options(void) {
  qsakv_plan_options o = QSAKV_PLAN_OPTIONS_INIT;
  return o;
}
*/
import "C"

import (
	"fmt"
	"math"
	"runtime"
	"sync/atomic"
	"unsafe"
)

// ---------------------------------------------------------------------------------
// Device memory
// ---------------------------------------------------------------------------------

// Element is a plain numeric type that can be copied to and from device memory.
type Element interface {
	~int8 | ~uint8 | ~int16 | ~uint16 | ~int32 | ~uint32 | ~int64 | ~uint64 | ~float32 | ~float64
}

// DeviceBuffer is device memory of a context's backend (host memory on the CPU
// backend).
type DeviceBuffer struct {
	ctx   *Context
	ptr   unsafe.Pointer
	bytes int
	users atomic.Int32 // open caches that use it as their memory (NewCacheWithMemory, external top-k)
}

// NewDeviceBuffer allocates bytes of device memory.
func NewDeviceBuffer(ctx *Context, bytes int) (*DeviceBuffer, error) {
	if err := ctx.live(); err != nil {
		return nil, err
	}
	if bytes < 0 {
		return nil, invalid("bytes: %d", bytes)
	}
	b := &DeviceBuffer{ctx: ctx, bytes: bytes}
	if err := call(func() C.qsakv_status { return C.qsakv_malloc(ctx.ptr, &b.ptr, C.size_t(bytes)) }, ctx); err != nil {
		return nil, err
	}
	ctx.children.Add(1)
	runtime.SetFinalizer(b, (*DeviceBuffer).Close)
	return b, nil
}

// BufferFrom allocates a buffer holding a copy of data.
func BufferFrom[T Element](ctx *Context, data []T) (*DeviceBuffer, error) {
	var zero T
	b, err := NewDeviceBuffer(ctx, len(data)*int(unsafe.Sizeof(zero)))
	if err != nil {
		return nil, err
	}
	if err := Upload(b, data); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

// Len is the buffer's size in bytes.
func (b *DeviceBuffer) Len() int { return b.bytes }

// Pointer is the device address (for calls this package does not wrap).
func (b *DeviceBuffer) Pointer() unsafe.Pointer { return b.ptr }

// Close frees the buffer. Idempotent. While an open cache uses it as its memory
// (NewCacheWithMemory, an external top-k buffer) it refuses (ErrState) and frees nothing.
func (b *DeviceBuffer) Close() error {
	if n := b.users.Load(); n > 0 {
		return &Error{Status: ErrState, Message: fmt.Sprintf("buffer: %d open caches use it as their memory", n)}
	}
	if b.ptr != nil {
		C.qsakv_free(b.ctx.ptr, b.ptr)
		b.ptr = nil
		b.ctx.children.Add(-1)
		runtime.SetFinalizer(b, nil)
	}
	return nil
}

// need checks that the buffer is of ctx (nil: any; another context's memory may be on
// another GPU, where the kernel's access is a fault that poisons the CUDA context) and
// holds count elements of unit bytes, without forming count * unit (a huge count would
// wrap to a size that passes and the C call would read past the buffer); a negative
// count is refused.
func (b *DeviceBuffer) need(what string, ctx *Context, count, unit int) error {
	if b == nil || b.ptr == nil {
		return &Error{Status: ErrState, Message: what + ": closed or nil buffer"}
	}
	if ctx != nil && b.ctx != ctx {
		return invalid("%s: a buffer of another context (the cache's context's buffers only)", what)
	}
	if count < 0 {
		return invalid("%s: a count of %d", what, count)
	}
	if unit > 0 && count > b.bytes/unit {
		if count > math.MaxInt/unit {
			return invalid("%s: needs %d elements of %d bytes (more than an int holds), the buffer has %d bytes", what, count, unit, b.bytes)
		}
		return invalid("%s: needs %d bytes, the buffer has %d", what, count*unit, b.bytes)
	}
	return nil
}

func copyBytes[T Element](data []T) int {
	var zero T
	return len(data) * int(unsafe.Sizeof(zero))
}

// Upload copies data to the start of the buffer and waits for the copy.
func Upload[T Element](b *DeviceBuffer, data []T) error { return UploadOn(b, data, DefaultStream) }

// UploadOn copies data to the start of the buffer on stream, after the work enqueued
// there, and waits for the stream (data is Go memory: the copy must end before it
// returns).
func UploadOn[T Element](b *DeviceBuffer, data []T, stream Stream) error {
	n := copyBytes(data)
	if err := b.need("upload", nil, n, 1); err != nil || n == 0 {
		return err
	}
	err := call(func() C.qsakv_status {
		return C.qsakv_memcpy(b.ctx.ptr, b.ptr, unsafe.Pointer(&data[0]), C.size_t(n), C.QSAKV_COPY_HOST_TO_DEVICE, stream.c())
	}, b)
	if err != nil {
		return err
	}
	return b.ctx.SynchronizeOn(stream)
}

// Download copies the start of the buffer into out after the default stream's work.
func Download[T Element](b *DeviceBuffer, out []T) error { return DownloadOn(b, out, DefaultStream) }

// DownloadOn copies the start of the buffer into out on stream, after the work enqueued
// there (e.g. the attention that wrote it), and waits for the stream.
func DownloadOn[T Element](b *DeviceBuffer, out []T, stream Stream) error {
	n := copyBytes(out)
	if err := b.need("download", nil, n, 1); err != nil || n == 0 {
		return err
	}
	err := call(func() C.qsakv_status {
		return C.qsakv_memcpy(b.ctx.ptr, unsafe.Pointer(&out[0]), b.ptr, C.size_t(n), C.QSAKV_COPY_DEVICE_TO_HOST, stream.c())
	}, b)
	if err != nil {
		return err
	}
	return b.ctx.SynchronizeOn(stream)
}

// ---------------------------------------------------------------------------------
// Cache
// ---------------------------------------------------------------------------------

// CacheOptions are qsakv_cache_options: the size (NumBlocks per QSA layer, or, with
// NumBlocks 0, a memory budget) and the top-k workspace.
type CacheOptions struct {
	NumBlocks         int64
	MemoryBudgetBytes uint64
	// PrivateTopk gives every layer a top-k buffer of its own (share_topk = 0) instead of
	// the one model-level buffer that all layers share (the default).
	PrivateTopk bool
	// ExternalTopk is the caller's buffer for the shared top-k workspace (int32
	// [ExternalTopkRows, top-k width], of the cache's context), used instead of one the
	// library allocates; nil: allocate. The cache keeps it: its Close refuses (ErrState)
	// while the cache is open.
	ExternalTopk *DeviceBuffer
	// ExternalTopkRows are its rows, at least the config's MaxBatchedTokens (0: that).
	ExternalTopkRows int64
	// AllowUnitScales lets an E4M3 cache run on a unit-scale overlay (a negative control:
	// marked unit_scale_control, or every scale 1.0); without it such an overlay is
	// refused (ErrOverlayUnitScales).
	AllowUnitScales bool
}

// c fills qsakv_cache_options for config m of geometry geo; an external top-k buffer
// must be of ctx (nil: any) and hold its rows.
func (opts CacheOptions) c(ctx *Context, m *ModelConfig, geo RankGeometry) (C.qsakv_cache_options, error) {
	o := C.qsakv_go_cache_options()
	o.num_blocks = C.int64_t(opts.NumBlocks)
	o.memory_budget_bytes = C.uint64_t(opts.MemoryBudgetBytes)
	if opts.PrivateTopk {
		o.share_topk = 0
	}
	if opts.AllowUnitScales {
		o.allow_unit_scales = 1
	}
	if opts.ExternalTopk == nil {
		if opts.ExternalTopkRows != 0 {
			return o, invalid("external_topk_rows: %d without an external_topk buffer", opts.ExternalTopkRows)
		}
		return o, nil
	}
	rows := opts.ExternalTopkRows
	if rows == 0 {
		rows = int64(m.MaxBatchedTokens)
	}
	if rows < 0 || rows > math.MaxInt {
		return o, invalid("external_topk_rows: %d", rows)
	}
	if err := opts.ExternalTopk.need("external_topk", ctx, int(rows), int(geo.TopkWidth)*4); err != nil {
		return o, err
	}
	o.external_topk = opts.ExternalTopk.ptr
	o.external_topk_dtype = C.QSAKV_DTYPE_INT32
	o.external_topk_rows = C.int64_t(rows)
	o.external_topk_cols = C.int64_t(geo.TopkWidth)
	return o, nil
}

// Cache is the KV caches of every QSA layer of a rank.
type Cache struct {
	ptr      *C.qsakv_cache
	ctx      *Context
	cfg      C.qsakv_model_config
	geo      RankGeometry
	children atomic.Int32    // open plans
	memory   []*DeviceBuffer // the caller's buffers it uses (its memory, external top-k), kept open
}

// NewCache allocates the caches; overlay is required for E4M3 (validated) and nil for
// 16-bit caches.
func NewCache(ctx *Context, m *ModelConfig, overlay *Overlay, opts CacheOptions) (*Cache, error) {
	if err := ctx.live(); err != nil {
		return nil, err
	}
	geo, err := m.RankGeometry()
	if err != nil {
		return nil, err
	}
	o, err := opts.c(ctx, m, geo)
	if err != nil {
		return nil, err
	}
	cc := &Cache{ctx: ctx, cfg: m.c(), geo: geo}
	var ov *C.qsakv_overlay
	if overlay != nil {
		ov = overlay.ptr
	}
	if err := call(func() C.qsakv_status { return C.qsakv_cache_create(&cc.ptr, ctx.ptr, &cc.cfg, ov, &o) },
		ctx, overlay, opts.ExternalTopk); err != nil {
		return nil, err
	}
	// The cache copied the overlay's scales: the overlay may be closed from now on (as
	// in C), so the cache neither counts on it nor keeps it reachable.
	cc.opened(opts.ExternalTopk)
	return cc, nil
}

// CacheLayoutFor is the layout (strides, bytes per layer, top-k shape) that a cache of
// config m and opts would have, without making one (qsakv_cache_layout_for): what to
// allocate for NewCacheWithMemory. opts.NumBlocks must be set (> 0). No allocation.
func CacheLayoutFor(m *ModelConfig, opts CacheOptions) (CacheLayout, error) {
	geo, err := m.RankGeometry()
	if err != nil {
		return CacheLayout{}, err
	}
	o, err := opts.c(nil, m, geo)
	if err != nil {
		return CacheLayout{}, err
	}
	cfg := m.c()
	var l C.qsakv_cache_layout
	l.struct_size = C.size_t(unsafe.Sizeof(l))
	l.version = C.QSAKV_CACHE_LAYOUT_VERSION
	if err := call(func() C.qsakv_status { return C.qsakv_cache_layout_for(&cfg, &o, &l) }, opts.ExternalTopk); err != nil {
		return CacheLayout{}, err
	}
	return layoutFrom(&l), nil
}

// LayerMemory is one QSA layer's caches in the caller's memory (qsakv_layer_memory):
// buffers of the cache's context of at least CacheLayoutFor's KVBytesPerLayer,
// CompressedBytesPerLayer and RingBytesPerLayer bytes, none overlapping another.
type LayerMemory struct {
	KV, CompressedKeys, RingKeys *DeviceBuffer
}

// NewCacheWithMemory is NewCache over the caller's memory (qsakv_cache_create_with_memory),
// for engines that allocate and profile their KV memory themselves: one LayerMemory per
// QSA layer, in QSALayers order; opts.NumBlocks (> 0) sets the size. The library checks
// each buffer (size, alignment, overlap) with a message naming it, uses the contents as
// they are (not zeroed; every layer starts with the NaN checks of NoteExternalCodes on)
// and still allocates the scales, NaN flags and (unless opts.ExternalTopk) the top-k
// buffer, which are all the layout's TotalBytes counts. The cache keeps the buffers: their
// Close refuses (ErrState) while it is open.
func NewCacheWithMemory(ctx *Context, m *ModelConfig, overlay *Overlay, opts CacheOptions, layers []LayerMemory) (*Cache, error) {
	if err := ctx.live(); err != nil {
		return nil, err
	}
	geo, err := m.RankGeometry()
	if err != nil {
		return nil, err
	}
	o, err := opts.c(ctx, m, geo)
	if err != nil {
		return nil, err
	}
	var held []*DeviceBuffer
	for i, l := range layers {
		for _, x := range []struct {
			name string
			b    *DeviceBuffer
		}{{"kv", l.KV}, {"compressed_keys", l.CompressedKeys}, {"ring_keys", l.RingKeys}} {
			if err := x.b.need(fmt.Sprintf("memory[%d].%s", i, x.name), ctx, 0, 1); err != nil {
				return nil, err
			}
			held = append(held, x.b)
		}
	}
	// The layer array in C memory (cgo: a struct passed to C holds no Go pointers).
	n := len(layers)
	arr := (*C.qsakv_layer_memory)(C.calloc(C.size_t(n+1), C.size_t(unsafe.Sizeof(C.qsakv_layer_memory{}))))
	defer C.free(unsafe.Pointer(arr))
	for i, l := range layers {
		e := &unsafe.Slice(arr, n)[i]
		e.kv, e.kv_bytes = l.KV.ptr, C.uint64_t(l.KV.bytes)
		e.compressed_keys, e.compressed_bytes = l.CompressedKeys.ptr, C.uint64_t(l.CompressedKeys.bytes)
		e.ring_keys, e.ring_bytes = l.RingKeys.ptr, C.uint64_t(l.RingKeys.bytes)
	}
	mem := C.qsakv_cache_memory{struct_size: C.size_t(unsafe.Sizeof(C.qsakv_cache_memory{})),
		version: C.QSAKV_CACHE_MEMORY_VERSION, num_layers: C.int32_t(n), layers: arr}
	cc := &Cache{ctx: ctx, cfg: m.c(), geo: geo}
	var ov *C.qsakv_overlay
	if overlay != nil {
		ov = overlay.ptr
	}
	if err := call(func() C.qsakv_status {
		return C.qsakv_cache_create_with_memory(&cc.ptr, ctx.ptr, &cc.cfg, ov, &o, &mem)
	}, ctx, overlay, opts.ExternalTopk, layers); err != nil {
		return nil, err
	}
	cc.opened(append(held, opts.ExternalTopk)...)
	return cc, nil
}

// opened counts a new cache as its context's child and as a user of the caller's
// buffers it was made with (nil ones skipped), and sets its finalizer.
func (c *Cache) opened(memory ...*DeviceBuffer) {
	c.ctx.children.Add(1)
	for _, b := range memory {
		if b != nil {
			b.users.Add(1)
			c.memory = append(c.memory, b)
		}
	}
	runtime.SetFinalizer(c, (*Cache).Close)
}

// Close frees the cache. Idempotent; refuses (ErrState) while a plan uses it.
func (c *Cache) Close() error {
	if n := c.children.Load(); n > 0 {
		return &Error{Status: ErrState, Message: fmt.Sprintf("cache: %d plans using it are still open", n)}
	}
	if c.ptr != nil {
		C.qsakv_cache_destroy(c.ptr)
		c.ptr = nil
		c.ctx.children.Add(-1)
		for _, b := range c.memory {
			b.users.Add(-1)
		}
		c.memory = nil
		runtime.SetFinalizer(c, nil)
	}
	return nil
}

func (c *Cache) live() error {
	if c == nil || c.ptr == nil {
		return &Error{Status: ErrState, Message: "cache: closed"}
	}
	return nil
}

// Geometry is the cache's rank geometry.
func (c *Cache) Geometry() RankGeometry { return c.geo }

// CacheLayout is the shape of a cache (qsakv_cache_layout): the main K/V cache per
// layer [NumBlocks, 2, BlockSize, KVHeads, HeadDim] in KVDtype, the bytes per layer of
// each cache, and the compressed index-key pages: NumBlocks pages of
// CompressedStrideBlock bytes, each holding CompressedKeysPerBlock keys of IndexHeadDim
// dims; FP16 keys fill the page; E4M3 keys are codes (one byte per dim) followed, at
// CompressedScalesOffset bytes from the page's start, by one FP32 scale per key (key =
// scale * e4m3(code)); CompressedScalesOffset is -1 for FP16 keys. KVStride* are the
// main cache's strides in elements; the top-k workspace is int32 [TopkRows, TopkCols],
// one for every layer when TopkShared, the caller's when TopkExternal.
type CacheLayout struct {
	KVDtype                                                Dtype
	NumBlocks                                              int64
	BlockSize, KVHeads, HeadDim                            int32
	KVBytesPerLayer                                        uint64
	CompressedBytesPerLayer                                uint64
	RingLength                                             int32
	RingBytesPerLayer                                      uint64
	TotalBytes                                             uint64
	IndexKeyDtype                                          Dtype
	IndexHeadDim, CompressedKeysPerBlock                   int32
	CompressedStrideBlock, CompressedScalesOffset          int64
	NumQSALayers                                           int32
	KVStrideBlock, KVStrideKV, KVStrideToken, KVStrideHead int64
	TopkRows, TopkCols                                     int64
	TopkShared, TopkExternal                               bool
}

// Layout describes the cache.
func (c *Cache) Layout() (CacheLayout, error) {
	if err := c.live(); err != nil {
		return CacheLayout{}, err
	}
	var l C.qsakv_cache_layout
	l.struct_size = C.size_t(unsafe.Sizeof(l))
	l.version = C.QSAKV_CACHE_LAYOUT_VERSION
	if err := call(func() C.qsakv_status { return C.qsakv_cache_get_layout(c.ptr, &l) }, c); err != nil {
		return CacheLayout{}, err
	}
	return layoutFrom(&l), nil
}

func layoutFrom(l *C.qsakv_cache_layout) CacheLayout {
	return CacheLayout{
		KVDtype: Dtype(l.kv_dtype), NumBlocks: int64(l.num_blocks), BlockSize: int32(l.block_size),
		KVHeads: int32(l.kv_heads), HeadDim: int32(l.head_dim), KVBytesPerLayer: uint64(l.kv_bytes_per_layer),
		CompressedBytesPerLayer: uint64(l.compressed_bytes_per_layer), RingLength: int32(l.ring_length),
		RingBytesPerLayer: uint64(l.ring_bytes_per_layer), TotalBytes: uint64(l.total_bytes),
		IndexKeyDtype: Dtype(l.index_key_dtype), IndexHeadDim: int32(l.index_head_dim),
		CompressedKeysPerBlock: int32(l.compressed_keys_per_block),
		CompressedStrideBlock:  int64(l.compressed_stride_block), CompressedScalesOffset: int64(l.compressed_scales_offset),
		NumQSALayers:  int32(l.num_qsa_layers),
		KVStrideBlock: int64(l.kv_stride_block), KVStrideKV: int64(l.kv_stride_kv),
		KVStrideToken: int64(l.kv_stride_token), KVStrideHead: int64(l.kv_stride_head),
		TopkRows: int64(l.topk_rows), TopkCols: int64(l.topk_cols),
		TopkShared: l.topk_shared != 0, TopkExternal: l.topk_external != 0,
	}
}

// LayerBuffers are the device pointers of one QSA layer's caches (qsakv_layer_buffers),
// for interoperability (an engine's own kernels, a swap-in, a prefix-cache copy); valid
// while the cache is open. With the CPU backend they are host memory. After writing into
// KV yourself, call NoteExternalCodes (the kernels then check the layer for NaN codes).
type LayerBuffers struct {
	// KV is the main cache: KVDtype [NumBlocks, 2, BlockSize, KVHeads, HeadDim] at the
	// CacheLayout's strides.
	KV unsafe.Pointer
	// CompressedKeys are the compressed index-key pages (CacheLayout's
	// CompressedStrideBlock, CompressedScalesOffset).
	CompressedKeys unsafe.Pointer
	// RingKeys is the raw index-key ring: FP16 [max_requests, RingLength, IndexHeadDim].
	RingKeys unsafe.Pointer
	// Topk is the layer's top-k buffer, int32 [TopkRows, TopkCols] (the shared one when
	// the layout's TopkShared).
	Topk unsafe.Pointer
	// Scales is device float[2]: the layer's K and V scale (1, 1 for 16-bit caches).
	Scales unsafe.Pointer
}

// LayerBuffers returns the device pointers of QSA layer `layer` (a model-layer id).
func (c *Cache) LayerBuffers(layer int32) (LayerBuffers, error) {
	if err := c.live(); err != nil {
		return LayerBuffers{}, err
	}
	var b C.qsakv_layer_buffers
	b.struct_size = C.size_t(unsafe.Sizeof(b))
	b.version = C.QSAKV_LAYER_BUFFERS_VERSION
	if err := call(func() C.qsakv_status { return C.qsakv_cache_get_layer_buffers(c.ptr, C.int32_t(layer), &b) }, c); err != nil {
		return LayerBuffers{}, err
	}
	return LayerBuffers{KV: b.kv, CompressedKeys: b.compressed_keys, RingKeys: b.ring_keys,
		Topk: unsafe.Pointer(b.topk), Scales: unsafe.Pointer(b.scales)}, nil
}

// NoteExternalCodes marks that layer's cache bytes were written outside the store calls
// (through LayerBuffers), so the kernels check them for NaN codes (E4M3 software
// decoder) and non-finite V values (grouped route) from now on: a one-way switch that
// costs some speed in that layer.
func (c *Cache) NoteExternalCodes(layer int32) error {
	return c.NoteExternalCodesOn(layer, DefaultStream)
}

// NoteExternalCodesOn is NoteExternalCodes enqueued on stream (after the writes there).
func (c *Cache) NoteExternalCodesOn(layer int32, stream Stream) error {
	if err := c.live(); err != nil {
		return err
	}
	return call(func() C.qsakv_status {
		return C.qsakv_cache_note_external_codes(c.ptr, C.int32_t(layer), stream.c())
	}, c)
}

// TotalBytes is everything the cache allocated.
func (c *Cache) TotalBytes() (uint64, error) {
	l, err := c.Layout()
	return l.TotalBytes, err
}

func (c *Cache) actBytes() int { return int(C.qsakv_dtype_size(c.cfg.activation_dtype)) }

// StoreKV stores numTokens rows of K and V (activation dtype, [n, kv_heads, head_dim])
// at slotMapping (int64 [n]; -1 skips).
func (c *Cache) StoreKV(layer int32, k, v, slotMapping *DeviceBuffer, numTokens int) error {
	return c.StoreKVOn(layer, k, v, slotMapping, numTokens, DefaultStream)
}

// StoreKVOn is StoreKV enqueued on stream (capturable in a CUDA graph).
func (c *Cache) StoreKVOn(layer int32, k, v, slotMapping *DeviceBuffer, numTokens int, stream Stream) error {
	if err := c.live(); err != nil {
		return err
	}
	row := int(c.geo.KVHeads) * int(c.cfg.head_dim) * c.actBytes()
	for _, x := range []struct {
		name string
		b    *DeviceBuffer
		unit int
	}{{"k", k, row}, {"v", v, row}, {"slot_mapping", slotMapping, 8}} {
		if err := x.b.need(x.name, c.ctx, numTokens, x.unit); err != nil {
			return err
		}
	}
	return call(func() C.qsakv_status {
		return C.qsakv_store_kv(c.ptr, C.int32_t(layer), k.ptr, v.ptr, (*C.int64_t)(slotMapping.ptr), C.int64_t(numTokens), stream.c())
	}, c, k, v, slotMapping)
}

// StoreIndexKeys stores raw index keys (FP16 [n, index_head_dim]) into the per-request
// ring: key i at entry (requestSlots[i] (int32 [n]), positions[i] (int64 [n]) %
// ring_length); a negative position skips.
func (c *Cache) StoreIndexKeys(layer int32, keys, requestSlots, positions *DeviceBuffer, numTokens int) error {
	return c.StoreIndexKeysOn(layer, keys, requestSlots, positions, numTokens, DefaultStream)
}

// StoreIndexKeysOn is StoreIndexKeys enqueued on stream.
func (c *Cache) StoreIndexKeysOn(layer int32, keys, requestSlots, positions *DeviceBuffer, numTokens int, stream Stream) error {
	if err := c.live(); err != nil {
		return err
	}
	for _, x := range []struct {
		name string
		b    *DeviceBuffer
		unit int
	}{{"keys", keys, int(c.cfg.index_head_dim) * 2}, {"request_slots", requestSlots, 4}, {"positions", positions, 8}} {
		if err := x.b.need(x.name, c.ctx, numTokens, x.unit); err != nil {
			return err
		}
	}
	return call(func() C.qsakv_status {
		return C.qsakv_store_index_keys(c.ptr, C.int32_t(layer), keys.ptr, (*C.int32_t)(requestSlots.ptr),
			(*C.int64_t)(positions.ptr), C.int64_t(numTokens), stream.c())
	}, c, keys, requestSlots, positions)
}

// StoreCompressedKeys stores finished compressed index keys (FP16 [n, index_head_dim];
// with IndexKeyDtype E4M3 each is quantised on its own into the layout's page) for the
// groups of the slots in slotMapping (int64 [n]).
func (c *Cache) StoreCompressedKeys(layer int32, keys, slotMapping *DeviceBuffer, numKeys int) error {
	return c.StoreCompressedKeysOn(layer, keys, slotMapping, numKeys, DefaultStream)
}

// StoreCompressedKeysOn is StoreCompressedKeys enqueued on stream.
func (c *Cache) StoreCompressedKeysOn(layer int32, keys, slotMapping *DeviceBuffer, numKeys int, stream Stream) error {
	if err := c.live(); err != nil {
		return err
	}
	if err := keys.need("keys", c.ctx, numKeys, int(c.cfg.index_head_dim)*2); err != nil {
		return err
	}
	if err := slotMapping.need("slot_mapping", c.ctx, numKeys, 8); err != nil {
		return err
	}
	return call(func() C.qsakv_status {
		return C.qsakv_store_compressed_keys(c.ptr, C.int32_t(layer), keys.ptr, (*C.int64_t)(slotMapping.ptr), C.int64_t(numKeys), stream.c())
	}, c, keys, slotMapping)
}

// StepStores is a step's stores for StoreStep: each part as its own call takes it, a
// part with a count of 0 skipped (its buffers are not read).
type StepStores struct {
	// K/V: as StoreKV.
	K, V, KVSlotMapping *DeviceBuffer
	NumTokens           int
	// Raw index keys (FP16 [n, index_head_dim]) into the per-request ring: entry
	// (IndexRequestSlots[i] (int32), IndexPositions[i] (int64) % ring_length); a
	// negative position skips.
	IndexKeys, IndexRequestSlots, IndexPositions *DeviceBuffer
	NumIndexKeys                                 int
	// Compressed keys: as StoreCompressedKeys.
	CompressedKeys, CompressedSlotMapping *DeviceBuffer
	NumCompressedKeys                     int
}

// StoreStep makes a step's stores together (qsakv_store_step): every part is checked
// before anything is stored, and on a GPU the parts take one kernel launch.
func (c *Cache) StoreStep(layer int32, s StepStores) error {
	return c.StoreStepOn(layer, s, DefaultStream)
}

// StoreStepOn is StoreStep enqueued on stream.
func (c *Cache) StoreStepOn(layer int32, s StepStores, stream Stream) error {
	if err := c.live(); err != nil {
		return err
	}
	for _, n := range []struct {
		name  string
		count int
	}{{"NumTokens", s.NumTokens}, {"NumIndexKeys", s.NumIndexKeys}, {"NumCompressedKeys", s.NumCompressedKeys}} {
		if n.count < 0 {
			return invalid("stores.%s is %d; must be >= 0", n.name, n.count)
		}
	}
	st := C.qsakv_step_stores{struct_size: C.size_t(unsafe.Sizeof(C.qsakv_step_stores{})),
		version: C.QSAKV_STEP_STORES_VERSION}
	keyRow := int(c.cfg.index_head_dim) * 2
	type need struct {
		name  string
		b     *DeviceBuffer
		count int
		unit  int
	}
	check := func(ns []need) error {
		for _, x := range ns {
			if err := x.b.need(x.name, c.ctx, x.count, x.unit); err != nil {
				return err
			}
		}
		return nil
	}
	if s.NumTokens > 0 {
		row := int(c.geo.KVHeads) * int(c.cfg.head_dim) * c.actBytes()
		if err := check([]need{{"k", s.K, s.NumTokens, row}, {"v", s.V, s.NumTokens, row},
			{"kv slot_mapping", s.KVSlotMapping, s.NumTokens, 8}}); err != nil {
			return err
		}
		st.k, st.v = s.K.ptr, s.V.ptr
		st.kv_slot_mapping = (*C.int64_t)(s.KVSlotMapping.ptr)
		st.num_tokens = C.int64_t(s.NumTokens)
	}
	if s.NumIndexKeys > 0 {
		if err := check([]need{{"index keys", s.IndexKeys, s.NumIndexKeys, keyRow},
			{"request_slots", s.IndexRequestSlots, s.NumIndexKeys, 4},
			{"positions", s.IndexPositions, s.NumIndexKeys, 8}}); err != nil {
			return err
		}
		st.index_keys = s.IndexKeys.ptr
		st.index_request_slots = (*C.int32_t)(s.IndexRequestSlots.ptr)
		st.index_positions = (*C.int64_t)(s.IndexPositions.ptr)
		st.num_index_keys = C.int64_t(s.NumIndexKeys)
	}
	if s.NumCompressedKeys > 0 {
		if err := check([]need{{"compressed keys", s.CompressedKeys, s.NumCompressedKeys, keyRow},
			{"compressed slot_mapping", s.CompressedSlotMapping, s.NumCompressedKeys, 8}}); err != nil {
			return err
		}
		st.compressed_keys = s.CompressedKeys.ptr
		st.compressed_slot_mapping = (*C.int64_t)(s.CompressedSlotMapping.ptr)
		st.num_compressed_keys = C.int64_t(s.NumCompressedKeys)
	}
	// The buffers' finalizers must not free them while the call reads them.
	return call(func() C.qsakv_status { return C.qsakv_store_step(c.ptr, C.int32_t(layer), &st, stream.c()) }, c, s)
}

// ---------------------------------------------------------------------------------
// Plan, selection, attention
// ---------------------------------------------------------------------------------

// Plan is a batch's metadata, consumed by select and attention.
type Plan struct {
	ptr        *C.qsakv_plan
	cache      *Cache
	rows       int
	blockTable *DeviceBuffer // read when select/attention run: kept reachable
}

// PlanOptions are qsakv_plan_options; each zero takes the library's default.
type PlanOptions struct {
	MaxRows, MaxRequests int32 // the largest batch (0: the config's maxima)
	NumSplits            int32 // split-K of the decode route, 1..256 (0: from occupancy)
	// Rows of one request from which they take the grouped multi-row route: 0 automatic,
	// -1 never, n >= 1 from n rows (PlanInfo reports the rule in force).
	MultiRowMinRows int32
}

// PlanInfo is qsakv_plan_info: the plan's limits, split count, routes and last batch.
type PlanInfo struct {
	MaxRows, MaxRequests, NumSplits, NumRows, NumRequests int32
	WorkspaceBytes                                        uint64
	RowsPerGroup, MultiRowMinRows, NumGroups, GroupedRows int32
}

// NewPlan makes a plan for batches of at most maxRows rows and maxRequests requests
// (0: the config's maxima), every other option its default.
func NewPlan(cache *Cache, maxRows, maxRequests int32) (*Plan, error) {
	return NewPlanWithOptions(cache, PlanOptions{MaxRows: maxRows, MaxRequests: maxRequests})
}

// NewPlanWithOptions makes a plan with all of qsakv_plan_options.
func NewPlanWithOptions(cache *Cache, opts PlanOptions) (*Plan, error) {
	if err := cache.live(); err != nil {
		return nil, err
	}
	o := C.qsakv_go_plan_options()
	o.max_rows, o.max_requests = C.int32_t(opts.MaxRows), C.int32_t(opts.MaxRequests)
	o.num_splits, o.multi_row_min_rows = C.int32_t(opts.NumSplits), C.int32_t(opts.MultiRowMinRows)
	p := &Plan{cache: cache}
	if err := call(func() C.qsakv_status { return C.qsakv_plan_create(&p.ptr, cache.ptr, &o) }, cache); err != nil {
		return nil, err
	}
	cache.children.Add(1)
	runtime.SetFinalizer(p, (*Plan).Close)
	return p, nil
}

// Close frees the plan. Idempotent.
func (p *Plan) Close() error {
	if p.ptr != nil {
		C.qsakv_plan_destroy(p.ptr)
		p.ptr = nil
		p.cache.children.Add(-1)
		runtime.SetFinalizer(p, nil)
	}
	return nil
}

// Batch is qsakv_batch: the next batch, for Plan.UpdateOn. The host arrays are copied;
// the block table is read when select and attention run (not copied).
type Batch struct {
	// QueryStart [requests+1]: the rows of request r are [QueryStart[r], QueryStart[r+1]),
	// one row per new token, ordered by request.
	QueryStart []int32
	// SeqLens [requests]: the tokens of request r after this step, its new rows included.
	SeqLens []int32
	// RequestSlots [requests]: the raw index-key ring slot of each request (the slot its
	// index keys were stored at, 0 .. max_requests-1); nil: request r uses slot r.
	RequestSlots []int32
	// BlockTable: device int32 [requests, BlockTableStride], the physical block of each
	// logical page.
	BlockTable       *DeviceBuffer
	BlockTableStride int32
}

// Update describes the next batch: queryStart [requests+1] (the rows of each request),
// seqLens [requests], and the device block table (int32 [requests, stride]); request r
// uses ring slot r. UpdateOn takes the whole Batch (request slots) and a stream.
func (p *Plan) Update(queryStart, seqLens []int32, blockTable *DeviceBuffer, stride int32) error {
	return p.UpdateOn(Batch{QueryStart: queryStart, SeqLens: seqLens, BlockTable: blockTable,
		BlockTableStride: stride}, DefaultStream)
}

// UpdateOn describes the next batch and copies its metadata to the plan on stream.
// Enqueue the plan's SelectTopKOn and AttentionOn on the same stream (one plan per
// stream): the copy overwrites what earlier calls read. Not capturable in a CUDA graph
// (capture the calls that use the plan instead).
func (p *Plan) UpdateOn(batch Batch, stream Stream) error {
	if err := p.live(); err != nil {
		return err
	}
	queryStart, seqLens, slots, stride := batch.QueryStart, batch.SeqLens, batch.RequestSlots, batch.BlockTableStride
	blockTable := batch.BlockTable
	n := len(seqLens)
	if len(queryStart) != n+1 {
		return invalid("query_start: %d entries for %d requests (needs requests + 1)", len(queryStart), n)
	}
	if slots != nil && len(slots) != n {
		return invalid("request_slots: %d entries for %d requests (needs one per request, or nil)", len(slots), n)
	}
	if stride < 0 {
		return invalid("block_table_stride: %d", stride)
	}
	if err := blockTable.need("block_table", p.cache.ctx, n, int(stride)*4); err != nil {
		return err
	}
	// The batch and its host arrays in C memory (cgo: no Go pointers inside C structs).
	qs := (*C.int32_t)(C.malloc(C.size_t(4 * (n + 1))))
	defer C.free(unsafe.Pointer(qs))
	sl := (*C.int32_t)(C.malloc(C.size_t(4*n + 4)))
	defer C.free(unsafe.Pointer(sl))
	copy(unsafe.Slice(qs, n+1), unsafe.Slice((*C.int32_t)(unsafe.Pointer(&queryStart[0])), n+1))
	if n > 0 {
		copy(unsafe.Slice(sl, n), unsafe.Slice((*C.int32_t)(unsafe.Pointer(&seqLens[0])), n))
	}
	b := (*C.qsakv_batch)(C.calloc(1, C.size_t(unsafe.Sizeof(C.qsakv_batch{}))))
	defer C.free(unsafe.Pointer(b))
	if slots != nil {
		rs := (*C.int32_t)(C.malloc(C.size_t(4*n + 4)))
		defer C.free(unsafe.Pointer(rs))
		if n > 0 {
			copy(unsafe.Slice(rs, n), unsafe.Slice((*C.int32_t)(unsafe.Pointer(&slots[0])), n))
		}
		b.request_slots = rs
	}
	b.struct_size = C.size_t(unsafe.Sizeof(*b))
	b.version = C.QSAKV_BATCH_VERSION
	b.num_requests = C.int32_t(n)
	b.query_start, b.seq_lens = qs, sl
	b.block_table = (*C.int32_t)(blockTable.ptr)
	b.block_table_stride = C.int32_t(stride)
	if err := call(func() C.qsakv_status { return C.qsakv_plan_update(p.ptr, b, stream.c()) }, p, blockTable); err != nil {
		return err
	}
	p.blockTable = blockTable
	info, err := p.Info()
	if err != nil {
		return err
	}
	p.rows = int(info.NumRows)
	return nil
}

func (p *Plan) live() error {
	if p == nil || p.ptr == nil {
		return &Error{Status: ErrState, Message: "plan: closed"}
	}
	return nil
}

// blockTableLive refuses a run after the last Update's block table was closed: the kernels
// read the table when they run (it is not copied), so they would read freed memory.
func (p *Plan) blockTableLive() error {
	if p.blockTable != nil && p.blockTable.ptr == nil {
		return &Error{Status: ErrState, Message: "plan: the block table of the last Update was closed; " +
			"select and attention read it when they run: Update with a live one"}
	}
	return nil
}

// Info returns the plan's qsakv_plan_info.
func (p *Plan) Info() (PlanInfo, error) {
	if err := p.live(); err != nil {
		return PlanInfo{}, err
	}
	var i C.qsakv_plan_info
	i.struct_size = C.size_t(unsafe.Sizeof(i))
	i.version = C.QSAKV_PLAN_INFO_VERSION
	if err := call(func() C.qsakv_status { return C.qsakv_plan_get_info(p.ptr, &i) }, p); err != nil {
		return PlanInfo{}, err
	}
	return PlanInfo{
		MaxRows: int32(i.max_rows), MaxRequests: int32(i.max_requests),
		NumSplits: int32(i.num_splits), NumRows: int32(i.num_rows),
		NumRequests: int32(i.num_requests), WorkspaceBytes: uint64(i.workspace_bytes),
		RowsPerGroup: int32(i.rows_per_group), MultiRowMinRows: int32(i.multi_row_min_rows),
		NumGroups: int32(i.num_groups), GroupedRows: int32(i.grouped_rows),
	}, nil
}

// Rows is the number of query rows of the last update.
func (p *Plan) Rows() int { return p.rows }

// topkArg is a caller's top-k buffer for the rows of the last update (nil: the layer's
// own buffer; the stride is then not used): int32 [rows, stride], stride 0 meaning the
// top-k width. The buffer must hold (rows - 1) * stride + width entries, counted without
// overflow.
func (p *Plan) topkArg(topk *DeviceBuffer, stride int64) (*C.int32_t, C.int64_t, error) {
	if topk == nil {
		return nil, 0, nil
	}
	width := int64(p.cache.geo.TopkWidth)
	if stride == 0 {
		stride = width
	}
	if stride < width {
		return nil, 0, invalid("topk_stride: %d; must be >= the top-k width %d (0: the width)", stride, width)
	}
	entries := 0
	if p.rows > 0 {
		if rows := int64(p.rows - 1); rows > 0 && stride > (math.MaxInt-width)/rows {
			return nil, 0, invalid("topk: %d rows at a stride of %d entries are more than an int holds", p.rows, stride)
		}
		entries = int(int64(p.rows-1)*stride + width)
	}
	if err := topk.need("topk", p.cache.ctx, entries, 4); err != nil {
		return nil, 0, err
	}
	return (*C.int32_t)(topk.ptr), C.int64_t(stride), nil
}

// SelectTopK selects every row's top-k tokens into the layer's top-k buffer (the shared
// one unless the cache has private ones). indexQ: FP16 [rows, index_num_heads,
// index_head_dim].
func (p *Plan) SelectTopK(layer int32, indexQ *DeviceBuffer) error {
	return p.SelectTopKOn(layer, indexQ, nil, 0, DefaultStream)
}

// SelectTopKOn is SelectTopK into the caller's top-k buffer topk (int32 [rows,
// topkStride], topkStride >= the top-k width, 0: the width; nil: the layer's buffer),
// enqueued on stream. Each row's list is its request-relative token positions, padded
// with -1; the entries past the width are not written.
func (p *Plan) SelectTopKOn(layer int32, indexQ, topk *DeviceBuffer, topkStride int64, stream Stream) error {
	if err := p.live(); err != nil {
		return err
	}
	if err := p.blockTableLive(); err != nil {
		return err
	}
	c := p.cache
	if err := indexQ.need("index_q", p.cache.ctx, p.rows, int(c.cfg.index_num_heads)*int(c.cfg.index_head_dim)*2); err != nil {
		return err
	}
	tk, stride, err := p.topkArg(topk, topkStride)
	if err != nil {
		return err
	}
	return call(func() C.qsakv_status {
		return C.qsakv_select_topk(p.ptr, C.int32_t(layer), indexQ.ptr, tk, stride, stream.c())
	}, p, indexQ, topk, p.blockTable)
}

// Attention runs attention for every row: q and out in the activation dtype,
// [rows, q_heads, head_dim]; sparse mode reads the layer's top-k buffer.
func (p *Plan) Attention(layer int32, mode AttentionMode, q, out *DeviceBuffer) error {
	return p.AttentionOn(layer, mode, q, nil, 0, out, DefaultStream)
}

// AttentionOn is Attention enqueued on stream, sparse mode over the caller's top-k lists
// topk (int32 [rows, topkStride] request-relative token positions, -1 = none;
// topkStride 0: the top-k width; nil: the layer's buffer; dense mode does not read it).
func (p *Plan) AttentionOn(layer int32, mode AttentionMode, q, topk *DeviceBuffer, topkStride int64, out *DeviceBuffer, stream Stream) error {
	if err := p.live(); err != nil {
		return err
	}
	if err := p.blockTableLive(); err != nil {
		return err
	}
	c := p.cache
	row := int(c.geo.QHeads) * int(c.cfg.head_dim) * c.actBytes()
	if err := q.need("q", p.cache.ctx, p.rows, row); err != nil {
		return err
	}
	if err := out.need("out", p.cache.ctx, p.rows, row); err != nil {
		return err
	}
	tk, stride, err := p.topkArg(topk, topkStride)
	if err != nil {
		return err
	}
	return call(func() C.qsakv_status {
		return C.qsakv_attention_run(p.ptr, C.int32_t(layer), C.qsakv_attention_mode(mode), q.ptr, tk, stride, out.ptr, stream.c())
	}, p, q, topk, out, p.blockTable)
}
