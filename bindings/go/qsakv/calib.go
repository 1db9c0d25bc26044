package qsakv

/*
#include <stdlib.h>
#include <qsakv.h>
*/
import "C"

import (
	"runtime"
	"unsafe"
)

// ---------------------------------------------------------------------------------
// Calibration
// ---------------------------------------------------------------------------------

// The calibration histogram's shape: CalibBins log2 bins of |x| over
// [2^CalibLog2Min, 2^CalibLog2Max] (bin = floor((log2|x| - CalibLog2Min) * CalibBins /
// 40), clamped), and E4M3Max, the largest finite E4M3 value.
const (
	CalibBins    = C.QSAKV_CALIB_BINS
	CalibLog2Min = C.QSAKV_CALIB_LOG2_MIN
	CalibLog2Max = C.QSAKV_CALIB_LOG2_MAX
	E4M3Max      = float32(C.QSAKV_E4M3_MAX)
)

// CalibKind picks K or V statistics; CalibMergeMode how MergeCalib combines handles.
type (
	CalibKind      int32
	CalibMergeMode int32
)

const (
	CalibK CalibKind = C.QSAKV_CALIB_K
	CalibV CalibKind = C.QSAKV_CALIB_V

	// CalibMergeRanks merges statistics of distinct TP ranks of one run (same
	// fingerprint, disjoint ranks, same run count); the covered ranks are united.
	CalibMergeRanks CalibMergeMode = C.QSAKV_CALIB_MERGE_RANKS
	// CalibMergeEnvelope merges complete statistics (every rank) of several runs; their
	// run counts add up.
	CalibMergeEnvelope CalibMergeMode = C.QSAKV_CALIB_MERGE_ENVELOPE
)

// Calib is a calibration handle (qsakv_calib): per QSA layer and K/V, the count, finite
// and nonzero counts, max |x| and a log2 histogram of the activations observed. A live
// handle (NewCalib) keeps them in its context's device memory and counts what Observe
// sees while started; a host copy (Snapshot, LoadCalib, MergeCalib) can be queried,
// saved, merged, summarised and turned into a scale pack (WriteOverlay).
type Calib struct {
	ptr *C.qsakv_calib
	ctx *Context // a live handle's context (nil for host copies)
	row int      // bytes of one token's K (or V) on this rank: kv_heads x head_dim x activation
}

// NewCalib makes a live handle for config m (validated; FP16 or BF16 activations) on
// ctx, stopped: Observe counts nothing until Start. The context refuses to close while the
// handle is open.
func NewCalib(ctx *Context, m *ModelConfig) (*Calib, error) {
	if err := ctx.live(); err != nil {
		return nil, err
	}
	cfg := m.c()
	c := &Calib{ctx: ctx}
	if err := call(func() C.qsakv_status { return C.qsakv_calib_create(&c.ptr, ctx.ptr, &cfg) }, ctx); err != nil {
		return nil, err
	}
	geo, _ := m.RankGeometry() // the config was validated by the create call
	c.row = int(geo.KVHeads) * int(cfg.head_dim) * int(C.qsakv_dtype_size(cfg.activation_dtype))
	ctx.children.Add(1)
	runtime.SetFinalizer(c, (*Calib).Close)
	return c, nil
}

// hostCalib owns a host copy the library made.
func hostCalib(ptr *C.qsakv_calib) *Calib {
	c := &Calib{ptr: ptr}
	runtime.SetFinalizer(c, (*Calib).Close)
	return c
}

// Close frees the handle. Idempotent. A live handle's queued Observe calls must have run
// (synchronise their stream).
func (c *Calib) Close() error {
	if c.ptr != nil {
		C.qsakv_calib_destroy(c.ptr)
		c.ptr = nil
		if c.ctx != nil {
			c.ctx.children.Add(-1)
		}
		runtime.SetFinalizer(c, nil)
	}
	return nil
}

func (c *Calib) live() error {
	if c == nil || c.ptr == nil {
		return &Error{Status: ErrState, Message: "calib: closed"}
	}
	return nil
}

// Start starts counting (a host-side flag, immediate). Live handles only (ErrState).
func (c *Calib) Start() error {
	if err := c.live(); err != nil {
		return err
	}
	return call(func() C.qsakv_status { return C.qsakv_calib_start(c.ptr) }, c)
}

// Stop stops counting: stop around warm-up, profiling and graph-capture passes so that only
// real traffic counts. Live handles only (ErrState).
func (c *Calib) Stop() error {
	if err := c.live(); err != nil {
		return err
	}
	return call(func() C.qsakv_status { return C.qsakv_calib_stop(c.ptr) }, c)
}

// Observe counts K and V of one QSA layer (a model-layer id): activation dtype,
// [numTokens, kv_heads (this rank), head_dim]. While stopped it checks its arguments and
// counts nothing. ErrState after AllReduce.
func (c *Calib) Observe(layer int32, k, v *DeviceBuffer, numTokens int) error {
	return c.ObserveOn(layer, k, v, numTokens, DefaultStream)
}

// ObserveOn is Observe enqueued on stream (capturable; a captured observe counts at every
// replay while started).
func (c *Calib) ObserveOn(layer int32, k, v *DeviceBuffer, numTokens int, stream Stream) error {
	if err := c.live(); err != nil {
		return err
	}
	if c.ctx == nil {
		return &Error{Status: ErrState, Message: "calib: Observe needs a live handle (NewCalib); this one is a host copy"}
	}
	var kp, vp unsafe.Pointer
	if numTokens != 0 { // as in C: with no tokens the buffers are not read
		if err := k.need("k", c.ctx, numTokens, c.row); err != nil {
			return err
		}
		if err := v.need("v", c.ctx, numTokens, c.row); err != nil {
			return err
		}
		kp, vp = k.ptr, v.ptr
	}
	return call(func() C.qsakv_status {
		return C.qsakv_calib_observe(c.ptr, C.int32_t(layer), kp, vp, C.int64_t(numTokens), stream.c())
	}, c, k, v)
}

// AllReduce reduces a live handle's statistics in place over the TP group's NCCL
// communicator (an ncclComm_t of the config's tp_size, rank tp_rank): collective, once per
// handle, on the default stream. ErrUnsupported on the CPU backend (merge saved files
// instead), ErrNCCL without libnccl.so.2.
func (c *Calib) AllReduce(ncclComm unsafe.Pointer) error {
	return c.AllReduceOn(ncclComm, DefaultStream)
}

// AllReduceOn is AllReduce on stream (the stream the observes ran on).
func (c *Calib) AllReduceOn(ncclComm unsafe.Pointer, stream Stream) error {
	if err := c.live(); err != nil {
		return err
	}
	return call(func() C.qsakv_status { return C.qsakv_calib_allreduce(c.ptr, ncclComm, stream.c()) }, c)
}

// Snapshot is a host copy of the handle; of a live one after the default stream's work.
func (c *Calib) Snapshot() (*Calib, error) { return c.SnapshotOn(DefaultStream) }

// SnapshotOn is a host copy of the handle; of a live one after the work enqueued on
// stream, which it waits for.
func (c *Calib) SnapshotOn(stream Stream) (*Calib, error) {
	if err := c.live(); err != nil {
		return nil, err
	}
	var out *C.qsakv_calib
	if err := call(func() C.qsakv_status { return C.qsakv_calib_snapshot(&out, c.ptr, stream.c()) }, c); err != nil {
		return nil, err
	}
	return hostCalib(out), nil
}

// CalibInfo is a handle's state (qsakv_calib_info).
type CalibInfo struct {
	Live, Started, Reduced bool
	TPSize                 int32
	Rank                   int32 // the rank that observed; -1 when several are merged
	RanksCovered           int32
	Complete               bool  // every rank covered
	NumRuns                int32 // calibration runs pooled
	ActivationDtype        Dtype
	QSALayers              []int32
	ConfigFingerprint      string // SHA-256 hex of the calibration-relevant config
}

// Info describes the handle.
func (c *Calib) Info() (CalibInfo, error) {
	if err := c.live(); err != nil {
		return CalibInfo{}, err
	}
	var i C.qsakv_calib_info
	i.struct_size = C.size_t(unsafe.Sizeof(i))
	i.version = C.QSAKV_CALIB_INFO_VERSION
	if err := call(func() C.qsakv_status { return C.qsakv_calib_get_info(c.ptr, &i) }, c); err != nil {
		return CalibInfo{}, err
	}
	layers := make([]int32, int(i.num_qsa_layers))
	for j := range layers {
		layers[j] = int32(i.qsa_layers[j])
	}
	return CalibInfo{Live: i.live != 0, Started: i.started != 0, Reduced: i.reduced != 0,
		TPSize: int32(i.tp_size), Rank: int32(i.rank), RanksCovered: int32(i.ranks_covered),
		Complete: i.complete != 0, NumRuns: int32(i.num_runs), ActivationDtype: Dtype(i.activation_dtype),
		QSALayers: layers, ConfigFingerprint: C.GoString(&i.config_fingerprint[0])}, nil
}

// Config is the model config the statistics were gathered for.
func (c *Calib) Config() (*ModelConfig, error) {
	if err := c.live(); err != nil {
		return nil, err
	}
	m := &ModelConfig{}
	m.base.struct_size = C.size_t(unsafe.Sizeof(m.base))
	m.base.version = C.QSAKV_MODEL_CONFIG_VERSION
	if err := call(func() C.qsakv_status { return C.qsakv_calib_get_config(c.ptr, &m.base) }, c); err != nil {
		return nil, err
	}
	m.takeRuntimeFields()
	return m, nil
}

// CalibStats are one layer's K or V counts (qsakv_calib_stats).
type CalibStats struct {
	Count, FiniteCount, NonzeroCount uint64
	MaxAbs                           float32 // over finite values (0 when none)
}

// Stats are the statistics of one QSA layer and kind of a host copy (ErrState for a live
// handle: Snapshot it first).
func (c *Calib) Stats(layer int32, kind CalibKind) (CalibStats, error) {
	return c.stats(layer, kind, nil)
}

// Histogram is the CalibBins-bin log2 histogram of one QSA layer and kind of a host copy
// (the finite nonzero values).
func (c *Calib) Histogram(layer int32, kind CalibKind) ([]uint64, error) {
	h := make([]uint64, CalibBins)
	if _, err := c.stats(layer, kind, h); err != nil {
		return nil, err
	}
	return h, nil
}

func (c *Calib) stats(layer int32, kind CalibKind, histogram []uint64) (CalibStats, error) {
	if err := c.live(); err != nil {
		return CalibStats{}, err
	}
	var s C.qsakv_calib_stats
	s.struct_size = C.size_t(unsafe.Sizeof(s))
	s.version = C.QSAKV_CALIB_STATS_VERSION
	var h *C.uint64_t
	if histogram != nil {
		h = (*C.uint64_t)(unsafe.Pointer(&histogram[0]))
	}
	if err := call(func() C.qsakv_status {
		return C.qsakv_calib_get_stats(c.ptr, C.int32_t(layer), C.qsakv_calib_kind(kind), &s, h)
	}, c); err != nil {
		return CalibStats{}, err
	}
	return CalibStats{Count: uint64(s.count), FiniteCount: uint64(s.finite_count),
		NonzeroCount: uint64(s.nonzero_count), MaxAbs: float32(s.max_abs)}, nil
}

// Save writes a host copy's statistics to path (which must not exist).
func (c *Calib) Save(path string) error {
	if err := c.live(); err != nil {
		return err
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	return call(func() C.qsakv_status { return C.qsakv_calib_save(c.ptr, cpath) }, c)
}

// LoadCalib loads a statistics file into a host copy (ErrFormat naming the field, ErrIO for
// a missing file).
func LoadCalib(path string) (*Calib, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var out *C.qsakv_calib
	if err := call(func() C.qsakv_status { return C.qsakv_calib_load(&out, cpath) }); err != nil {
		return nil, err
	}
	return hostCalib(out), nil
}

// MergeCalib merges host copies into a new one (max of maxima, sums of counts and
// histograms); the mode decides what is checked and recorded.
func MergeCalib(mode CalibMergeMode, inputs ...*Calib) (*Calib, error) {
	if len(inputs) == 0 {
		return nil, invalid("inputs: none to merge")
	}
	ptrs := make([]*C.qsakv_calib, len(inputs)) // C pointers in Go memory: allowed
	for i, in := range inputs {
		if err := in.live(); err != nil {
			return nil, err
		}
		ptrs[i] = in.ptr
	}
	var out *C.qsakv_calib
	if err := call(func() C.qsakv_status {
		return C.qsakv_calib_merge(&out, &ptrs[0], C.int32_t(len(ptrs)), C.qsakv_calib_merge_mode(mode))
	}, inputs); err != nil {
		return nil, err
	}
	return hostCalib(out), nil
}

// CalibScaleFromMax is the scale of a maximum: the smallest FP32 s with s >= maxAbs / 448,
// so that no value up to maxAbs saturates. ErrOverlayBadScale unless maxAbs is finite and
// > 0.
func CalibScaleFromMax(maxAbs float32) (float32, error) {
	var s C.float
	err := call(func() C.qsakv_status { return C.qsakv_calib_scale_from_max(C.float(maxAbs), &s) })
	return float32(s), err
}

// CalibSummary summarises one layer's K or V (qsakv_calib_summary).
type CalibSummary struct {
	Count, FiniteCount, NonzeroCount uint64
	MaxAbs, Scale                    float32
	P99_9, P99_99                    float32 // |x| quantiles from the histogram
	SaturateFraction                 float64 // values above 448 x Scale (0 by construction)
	UnderflowFraction                float64 // nonzero values E4M3 stores as zero (a lower bound)
}

// Summarize summarises one QSA layer and kind of a host copy, after checking the whole
// handle: ErrOverlayIncomplete when a rank, layer or K/V half is missing,
// ErrCalibNonFinite when NaN or infinite activations were seen, ErrOverlayBadScale for a
// maximum of 0.
func (c *Calib) Summarize(layer int32, kind CalibKind) (CalibSummary, error) {
	if err := c.live(); err != nil {
		return CalibSummary{}, err
	}
	var s C.qsakv_calib_summary
	s.struct_size = C.size_t(unsafe.Sizeof(s))
	s.version = C.QSAKV_CALIB_SUMMARY_VERSION
	if err := call(func() C.qsakv_status {
		return C.qsakv_calib_summarize(c.ptr, C.int32_t(layer), C.qsakv_calib_kind(kind), &s)
	}, c); err != nil {
		return CalibSummary{}, err
	}
	return CalibSummary{Count: uint64(s.count), FiniteCount: uint64(s.finite_count),
		NonzeroCount: uint64(s.nonzero_count), MaxAbs: float32(s.max_abs), Scale: float32(s.scale),
		P99_9: float32(s.p99_9), P99_99: float32(s.p99_99), SaturateFraction: float64(s.saturate_fraction),
		UnderflowFraction: float64(s.underflow_fraction)}, nil
}

// WriteOverlay summarises every QSA layer of a host copy (all of Summarize's refusals) and
// writes the scale pack into outDir (which must not exist), with opts' base index and
// contract. Unlike WriteOverlayWithOptions, a zero ContractTPSize or ContractActivationDtype
// takes the statistics' TP size or activation dtype; ContractTPSize -1 lifts the TP
// constraint.
func (c *Calib) WriteOverlay(outDir string, opts OverlayWriteOptions) error {
	if err := c.live(); err != nil {
		return err
	}
	cout := C.CString(outDir)
	defer C.free(unsafe.Pointer(cout))
	o, free := opts.c()
	defer free()
	return call(func() C.qsakv_status { return C.qsakv_calib_write_overlay(c.ptr, cout, &o) }, c)
}
