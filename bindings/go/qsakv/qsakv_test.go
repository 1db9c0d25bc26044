package qsakv

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"
)

// toHalf is exact for the values used here (normal or zero).
func toHalf(x float32) uint16 {
	u := math.Float32bits(x)
	if u&0x7fffffff == 0 {
		return uint16(u >> 16)
	}
	sign := (u >> 16) & 0x8000
	exp := int32((u>>23)&0xff) - 127 + 15
	return uint16(sign | uint32(exp)<<10 | (u>>13)&0x3ff)
}

func fromHalf(h uint16) float64 {
	e := int((h >> 10) & 0x1f)
	m := float64(h & 0x3ff)
	v := math.Ldexp(1024+m, e-25)
	if e == 0 {
		v = math.Ldexp(m, -24)
	}
	if h&0x8000 != 0 {
		return -v
	}
	return v
}

// must panics on an error: a panic fails the test with its stack.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func smallFP16Config(t *testing.T) *ModelConfig {
	cfg := must(Preset("qwen4_exp"))
	cfg.TPSize = 4
	cfg.KVDtype = DtypeFP16
	cfg.MaxBatchedTokens = 8
	cfg.MaxRequests = 2
	cfg.MaxModelLen = 256
	return cfg
}

// The pipeline on the CPU backend (store, plan, select, sparse and dense attention)
// against an FP64 reference, with FP16 and with E4M3 compressed index keys (keys of 0.5
// are stored as scale 0.5 / 448 and codes 448: the same selection).
func TestPipelineMatchesFP64(t *testing.T) {
	t.Run("fp16_index_keys", func(t *testing.T) { pipelineMatchesFP64(t, pipelineCase{indexKeyDtype: DtypeFP16}) })
	t.Run("e4m3_index_keys", func(t *testing.T) { pipelineMatchesFP64(t, pipelineCase{indexKeyDtype: DtypeE4M3}) })
	// The stores as one StoreStep (qsakv_store_step), with a raw index-key part too.
	t.Run("store_step", func(t *testing.T) {
		pipelineMatchesFP64(t, pipelineCase{indexKeyDtype: DtypeE4M3, storeStep: true})
	})
	// Every call through its XOn variant with a stream (the CPU backend ignores its value
	// and runs synchronously: the results must be the same).
	perThread := Stream(2) // cudaStreamPerThread
	t.Run("on_a_stream", func(t *testing.T) {
		pipelineMatchesFP64(t, pipelineCase{indexKeyDtype: DtypeFP16, stream: &perThread})
	})
	t.Run("store_step_on_a_stream", func(t *testing.T) {
		pipelineMatchesFP64(t, pipelineCase{indexKeyDtype: DtypeE4M3, storeStep: true, stream: &perThread})
	})
	// Selection into a top-k buffer of the caller's (a padded stride), attention over it.
	t.Run("caller_top_k", func(t *testing.T) {
		pipelineMatchesFP64(t, pipelineCase{indexKeyDtype: DtypeFP16, callerTopK: true})
	})
	t.Run("caller_top_k_e4m3_on_a_stream", func(t *testing.T) {
		pipelineMatchesFP64(t, pipelineCase{indexKeyDtype: DtypeE4M3, callerTopK: true, stream: &perThread})
	})
	// The cache's shared top-k workspace in a buffer of ours (CacheOptions.ExternalTopk).
	t.Run("external_top_k", func(t *testing.T) {
		pipelineMatchesFP64(t, pipelineCase{indexKeyDtype: DtypeFP16, externalTopk: true})
	})
	// The request's raw index keys in ring slot 1, and the batch naming that slot.
	t.Run("request_slots", func(t *testing.T) {
		pipelineMatchesFP64(t, pipelineCase{indexKeyDtype: DtypeFP16, storeStep: true, requestSlots: []int32{1}})
	})
}

// pipelineCase varies the pipeline test.
type pipelineCase struct {
	indexKeyDtype Dtype
	storeStep     bool    // the stores as one StoreStep
	stream        *Stream // nil: the calls without a stream; else their XOn variants on it
	requestSlots  []int32 // the batch's request slots (UpdateOn); nil: request r in slot r
	callerTopK    bool    // select into and attend over the caller's top-k buffer
	externalTopk  bool    // the cache's top-k workspace in a buffer of the caller's
}

// callersTopKIsRead: sparse attention over a caller's list naming only the hot token
// outputs that token's V exactly (the layer's own list names all 37 tokens); a stride of
// 0 means the width; a stride below the width and a buffer too small are refused.
func callersTopKIsRead(t *testing.T, plan *Plan, layer int32, dq, dout, dtopk *DeviceBuffer, stride int64,
	stream Stream, hot, h, d int) {
	width := int(plan.cache.Geometry().TopkWidth)
	for _, st := range []int64{stride, 0} {
		list := make([]int32, width)
		for i := range list {
			list[i] = -1
		}
		list[0] = int32(hot)
		if err := UploadOn(dtopk, list, stream); err != nil {
			t.Fatal(err)
		}
		if err := plan.AttentionOn(layer, AttentionSparse, dq, dtopk, st, dout, stream); err != nil {
			t.Fatal(err)
		}
		out := make([]uint16, h*d)
		if err := DownloadOn(dout, out, stream); err != nil {
			t.Fatal(err)
		}
		for i, o := range out {
			if want := 0.25 * float64((hot+i%d)%8); fromHalf(o) != want {
				t.Fatalf("stride %d: out[%d] = %g over the caller's list {%d}, want V = %g", st, i, fromHalf(o), hot, want)
			}
		}
	}
	var qe *Error
	if err := plan.AttentionOn(layer, AttentionSparse, dq, dtopk, int64(width-1), dout, stream); !errors.As(err, &qe) ||
		qe.Status != ErrInvalidArgument || !strings.HasPrefix(qe.Message, "topk_stride: ") {
		t.Fatalf("a stride below the width: %v", err)
	}
	small := must(NewDeviceBuffer(plan.cache.ctx, 4*(width-1)))
	defer small.Close()
	if err := plan.SelectTopKOn(layer, dq, small, 0, stream); !errors.As(err, &qe) || qe.Status != ErrInvalidArgument ||
		!strings.HasPrefix(qe.Message, "topk: needs") {
		t.Fatalf("a top-k buffer of width - 1 entries: %v", err)
	}
}

func pipelineMatchesFP64(t *testing.T, pc pipelineCase) {
	indexKeyDtype, storeStep := pc.indexKeyDtype, pc.storeStep
	on := pc.stream != nil
	var stream Stream
	if on {
		stream = *pc.stream
	}
	if !LibraryMatchesHeader() {
		t.Fatalf("library %s does not match the header", Version())
	}
	ctx := must(NewContext(BackendCPU))
	defer ctx.Close()
	if info := must(ctx.Info()); info.Backend != BackendCPU || info.KernelTier != 0 {
		t.Fatalf("backend %d, kernel tier %d (the CPU backend has none)", info.Backend, info.KernelTier)
	}
	cfg := smallFP16Config(t)
	cfg.IndexKeyDtype = indexKeyDtype
	g := must(cfg.RankGeometry())
	if g.KVHeads != 1 {
		t.Fatalf("kv_heads %d", g.KVHeads)
	}
	d, h, l, hot, block := int(cfg.HeadDim()), int(g.QHeads), 37, 5, int32(1)
	opts := CacheOptions{NumBlocks: 2}
	width := int(g.TopkWidth)
	const sentinel = int32(0x5a5a5a5a)
	if pc.externalTopk {
		// The cache's top-k workspace in a buffer of ours (closed after the cache: the
		// deferred calls run in reverse).
		fill := make([]int32, int(cfg.MaxBatchedTokens)*width)
		for i := range fill {
			fill[i] = sentinel
		}
		opts.ExternalTopk = must(BufferFrom(ctx, fill))
		defer func() {
			if err := opts.ExternalTopk.Close(); err != nil {
				t.Errorf("closing the external top-k buffer after its cache: %v", err)
			}
		}()
	}
	cache := must(NewCache(ctx, cfg, nil, opts))
	defer cache.Close()
	if lay := must(cache.Layout()); lay.IndexKeyDtype != indexKeyDtype || lay.TopkExternal != pc.externalTopk {
		t.Fatalf("layout index_key_dtype %d (config %d), top-k external %v", lay.IndexKeyDtype, indexKeyDtype,
			lay.TopkExternal)
	}
	if pc.externalTopk {
		if err := opts.ExternalTopk.Close(); !errors.Is(err, &Error{Status: ErrState}) {
			t.Fatalf("closing the external top-k buffer under its cache: %v", err)
		}
	}
	layer := cfg.QSALayers()[0]

	// K is zero except at token `hot`; q = 1/16: score 1 at `hot`, 0 elsewhere.
	k, v := make([]uint16, l*d), make([]uint16, l*d)
	q := make([]uint16, h*d)
	for i := range q {
		q[i] = toHalf(0.0625)
	}
	slots := make([]int64, l)
	var cslots []int64
	ratio := int(cfg.CompressRatio())
	for tok := 0; tok < l; tok++ {
		slots[tok] = int64(block)*int64(cfg.BlockSize) + int64(tok)
		for j := 0; j < d; j++ {
			v[tok*d+j] = toHalf(0.25 * float32((tok+j)%8))
			if tok == hot {
				k[tok*d+j] = toHalf(1)
			}
		}
		if tok%ratio == ratio-1 {
			cslots = append(cslots, slots[tok])
		}
	}
	ck := make([]uint16, len(cslots)*int(cfg.IndexHeadDim()))
	for i := range ck {
		ck[i] = toHalf(0.5)
	}
	iq := make([]uint16, cfg.IndexNumHeads()*cfg.IndexHeadDim())
	for i := range iq {
		iq[i] = toHalf(0.25)
	}
	dk, dv := must(BufferFrom(ctx, k)), must(BufferFrom(ctx, v))
	ds, dcs := must(BufferFrom(ctx, slots)), must(BufferFrom(ctx, cslots))
	dck, diq := must(BufferFrom(ctx, ck)), must(BufferFrom(ctx, iq))
	dq, dbt := must(BufferFrom(ctx, q)), must(BufferFrom(ctx, []int32{block, -1}))
	dout := must(NewDeviceBuffer(ctx, len(q)*2))
	bufs := []*DeviceBuffer{dk, dv, ds, dcs, dck, diq, dq, dbt, dout}
	defer func() {
		for _, b := range bufs {
			b.Close()
		}
	}()

	if storeStep {
		req := make([]int32, len(cslots))
		if pc.requestSlots != nil {
			for i := range req {
				req[i] = pc.requestSlots[0]
			}
		}
		pos := make([]int64, len(cslots))
		for i := range pos {
			pos[i] = int64(i)
		}
		dreq, dpos := must(BufferFrom(ctx, req)), must(BufferFrom(ctx, pos))
		bufs = append(bufs, dreq, dpos)
		stores := StepStores{K: dk, V: dv, KVSlotMapping: ds, NumTokens: l,
			IndexKeys: dck, IndexRequestSlots: dreq, IndexPositions: dpos, NumIndexKeys: len(cslots),
			CompressedKeys: dck, CompressedSlotMapping: dcs, NumCompressedKeys: len(cslots)}
		if on {
			if err := cache.StoreStepOn(layer, stores, stream); err != nil {
				t.Fatal(err)
			}
		} else if err := cache.StoreStep(layer, stores); err != nil {
			t.Fatal(err)
		}
		if err := cache.StoreStep(layer, StepStores{NumIndexKeys: 1}); err == nil {
			t.Fatal("StoreStep with a nil index-key buffer did not fail")
		}
		if err := cache.StoreStep(layer, StepStores{NumTokens: -1}); err == nil {
			t.Fatal("StoreStep with a negative count did not fail")
		}
	} else if on {
		if err := cache.StoreKVOn(layer, dk, dv, ds, l, stream); err != nil {
			t.Fatal(err)
		}
		if err := cache.StoreCompressedKeysOn(layer, dck, dcs, len(cslots), stream); err != nil {
			t.Fatal(err)
		}
	} else {
		if err := cache.StoreKV(layer, dk, dv, ds, l); err != nil {
			t.Fatal(err)
		}
		if err := cache.StoreCompressedKeys(layer, dck, dcs, len(cslots)); err != nil {
			t.Fatal(err)
		}
	}
	plan := must(NewPlan(cache, 1, 1))
	defer plan.Close()
	if on || pc.requestSlots != nil {
		batch := Batch{QueryStart: []int32{0, 1}, SeqLens: []int32{int32(l)}, RequestSlots: pc.requestSlots,
			BlockTable: dbt, BlockTableStride: 2}
		if err := plan.UpdateOn(batch, stream); err != nil {
			t.Fatal(err)
		}
	} else if err := plan.Update([]int32{0, 1}, []int32{int32(l)}, dbt, 2); err != nil {
		t.Fatal(err)
	}
	if plan.Rows() != 1 {
		t.Fatalf("rows %d", plan.Rows())
	}
	if pc.requestSlots != nil {
		// The slots reach the library: one beyond max_requests (2) is refused naming it,
		// and the Go side refuses a list of the wrong length. A refused update keeps the
		// plan's batch.
		var qe *Error
		bad := Batch{QueryStart: []int32{0, 1}, SeqLens: []int32{int32(l)}, RequestSlots: []int32{2},
			BlockTable: dbt, BlockTableStride: 2}
		if err := plan.UpdateOn(bad, stream); !errors.As(err, &qe) || qe.Status != ErrInvalidArgument ||
			!strings.Contains(qe.Message, "batch.request_slots[0] is 2; must be in 0..1") {
			t.Fatalf("request slot 2 of 2: %v", err)
		}
		bad.RequestSlots = []int32{1, 0}
		if err := plan.UpdateOn(bad, stream); !errors.As(err, &qe) || qe.Status != ErrInvalidArgument ||
			!strings.HasPrefix(qe.Message, "request_slots: 2 entries for 1 requests") {
			t.Fatalf("two request slots for one request: %v", err)
		}
	}
	// The caller's top-k buffer (callerTopK): one row at a stride of the width + 3, the
	// padding filled with a sentinel that selection must leave alone.
	var dtopk *DeviceBuffer
	stride := int64(width + 3)
	if pc.callerTopK {
		fill := make([]int32, stride)
		for i := range fill {
			fill[i] = sentinel
		}
		dtopk = must(BufferFrom(ctx, fill))
		bufs = append(bufs, dtopk)
	}
	if on || pc.callerTopK {
		if err := plan.SelectTopKOn(layer, diq, dtopk, stride, stream); err != nil {
			t.Fatal(err)
		}
	} else if err := plan.SelectTopK(layer, diq); err != nil {
		t.Fatal(err)
	}
	if pc.callerTopK || pc.externalTopk {
		// Every block ties (equal keys): the 9 whole groups' tokens ascending, then the open
		// group's tail (token 36), then -1 up to the width; the padding (of the caller's
		// buffer) or the next row (of the external workspace, which has one row per
		// max_batched_tokens) untouched.
		got, dst := make([]int32, stride), dtopk
		if pc.externalTopk {
			dst = opts.ExternalTopk
		}
		if err := DownloadOn(dst, got, stream); err != nil {
			t.Fatal(err)
		}
		for i, x := range got {
			want := int32(-1)
			switch {
			case i < l:
				want = int32(i)
			case i >= width:
				want = sentinel
			}
			if x != want {
				t.Fatalf("caller's top-k[%d] = %d, want %d", i, x, want)
			}
		}
	}
	for _, mode := range []AttentionMode{AttentionSparse, AttentionDense} {
		if on || pc.callerTopK {
			if err := plan.AttentionOn(layer, mode, dq, dtopk, stride, dout, stream); err != nil {
				t.Fatal(err)
			}
		} else if err := plan.Attention(layer, mode, dq, dout); err != nil {
			t.Fatal(err)
		}
		out := make([]uint16, len(q))
		if on {
			if err := DownloadOn(dout, out, stream); err != nil {
				t.Fatal(err)
			}
		} else if err := Download(dout, out); err != nil {
			t.Fatal(err)
		}
		worst := 0.0
		for hh := 0; hh < h; hh++ {
			for j := 0; j < d; j++ {
				num := 0.0
				for tok := 0; tok < l; tok++ {
					w := 1.0
					if tok == hot {
						w = math.E
					}
					num += w * 0.25 * float64((tok+j)%8)
				}
				want := num / (math.E + float64(l-1))
				worst = math.Max(worst, math.Abs(fromHalf(out[hh*d+j])-want))
			}
		}
		t.Logf("mode %d: max |out - fp64| = %.3g", mode, worst)
		if worst >= 4e-3 {
			t.Fatalf("mode %d: max error %g", mode, worst)
		}
	}

	if pc.callerTopK {
		callersTopKIsRead(t, plan, layer, dq, dout, dtopk, stride, stream, hot, h, d)
	}

	// A buffer too small for the batch is refused before the call, naming it.
	small := must(NewDeviceBuffer(ctx, 8))
	bufs = append(bufs, small)
	err := plan.Attention(layer, AttentionDense, small, dout)
	var qe *Error
	if !errors.As(err, &qe) || qe.Status != ErrInvalidArgument || !strings.HasPrefix(qe.Message, "q: needs") {
		t.Fatalf("small q: %v", err)
	}
	// Parents refuse to close under their children.
	if err := ctx.Close(); err == nil || !strings.Contains(err.Error(), "still open") {
		t.Fatalf("context closed under its cache: %v", err)
	}
	if err := cache.Close(); err == nil {
		t.Fatal("cache closed under its plan")
	}
}

func TestErrorsCarryStatusAndMessage(t *testing.T) {
	_, err := Preset("no_such_preset")
	var qe *Error
	if !errors.As(err, &qe) {
		t.Fatalf("not an *Error: %v", err)
	}
	if qe.Status != ErrInvalidArgument || qe.Status.String() != "QSAKV_ERROR_INVALID_ARGUMENT" ||
		!strings.Contains(qe.Message, "no_such_preset") {
		t.Fatalf("%#v", qe)
	}
	if !strings.HasPrefix(err.Error(), "QSAKV_ERROR_INVALID_ARGUMENT: ") {
		t.Fatal(err.Error())
	}
	if !errors.Is(err, &Error{Status: ErrInvalidArgument}) {
		t.Fatal("errors.Is by status")
	}

	cfg := must(Preset("qwen4_exp"))
	cfg.SetHeadDim(100)
	err = cfg.Validate()
	if !errors.As(err, &qe) || qe.Status != ErrInvalidConfig || !strings.Contains(qe.Message, "head_dim") {
		t.Fatalf("head_dim 100: %v", err)
	}

	if _, err := LoadOverlay("/nonexistent/qsakv", ""); !errors.As(err, &qe) || qe.Message == "" {
		t.Fatalf("missing overlay: %v", err)
	}

	// An E4M3 cache without an overlay is refused (fail closed).
	ctx := must(NewContext(BackendCPU))
	defer ctx.Close()
	e4 := must(Preset("qwen4_exp"))
	e4.TPSize = 4
	if _, err := NewCache(ctx, e4, nil, CacheOptions{NumBlocks: 2}); !errors.As(err, &qe) {
		t.Fatalf("E4M3 without overlay: %v", err)
	} else {
		t.Logf("E4M3 cache without overlay: %v", err)
	}
}

// index_key_dtype: FP16 by default, E4M3 validates and changes the layout's page and the
// capacity, another dtype is refused naming the field.
func TestIndexKeyDtype(t *testing.T) {
	if cfg := must(Preset("qwen4_exp")); cfg.IndexKeyDtype != DtypeFP16 {
		t.Fatalf("preset index_key_dtype %d", cfg.IndexKeyDtype)
	}
	cfg := smallFP16Config(t)
	cfg.IndexKeyDtype = DtypeE4M3
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := *cfg
	bad.IndexKeyDtype = DtypeBF16
	var qe *Error
	if err := bad.Validate(); !errors.As(err, &qe) || qe.Status != ErrInvalidConfig ||
		!strings.Contains(qe.Message, "index_key_dtype") {
		t.Fatalf("index_key_dtype bf16: %v", err)
	}

	ctx := must(NewContext(BackendCPU))
	defer ctx.Close()
	for _, c := range []struct {
		dtype          Dtype
		stride, scales int64
	}{{DtypeFP16, 4096, -1}, {DtypeE4M3, 2112, 2048}} {
		cfg.IndexKeyDtype = c.dtype
		cache := must(NewCache(ctx, cfg, nil, CacheOptions{NumBlocks: 4}))
		l := must(cache.Layout())
		cache.Close()
		if l.IndexKeyDtype != c.dtype || l.IndexHeadDim != 128 || l.CompressedKeysPerBlock != 16 ||
			l.CompressedStrideBlock != c.stride || l.CompressedScalesOffset != c.scales ||
			l.CompressedBytesPerLayer != uint64(4*c.stride) || l.NumBlocks != 4 {
			t.Fatalf("dtype %d: layout %+v", c.dtype, l)
		}
	}

	// 33 bytes per token per layer for E4M3 index keys: about 2x at TP4.
	tp4 := must(Preset("qwen4_exp"))
	tp4.TPSize = 4
	tp4.IndexKeyDtype = DtypeE4M3
	cap := must(tp4.Capacity(40 << 30))
	if cap.BytesPerToken != 6540 || cap.FP16BytesPerToken != 13056 || cap.CompressedBytesPerToken != 12*33 ||
		cap.IdealRatio < 1.99 || cap.CapacityRatio < 1.99 {
		t.Fatalf("capacity %+v", cap)
	}
	if n := must(tp4.CapacityTokens(40 << 30)); n != cap.NumTokens {
		t.Fatalf("CapacityTokens %d, Capacity %d", n, cap.NumTokens)
	}
}

// Messages are per OS thread; the package reads each on the thread that failed, so
// goroutines failing at once each get their own.
// The wrappers of consensus (the CPU backend refuses it by status), a checkpoint's config
// (the preset's geometry from a config.json) and a bare scale file.
func TestConsensusCheckpointConfigAndScaleFile(t *testing.T) {
	ctx, err := NewContext(BackendCPU)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	preset, err := Preset("qwen4_exp")
	if err != nil {
		t.Fatal(err)
	}
	comm := unsafe.Pointer(uintptr(0x1234)) // never dereferenced: refused first
	if err := TPConsensus(ctx, preset, nil, comm); !errors.Is(err, &Error{Status: ErrUnsupported}) {
		t.Fatalf("TPConsensus on the CPU backend: %v", err)
	}
	if err := TPConsensusOn(ctx, preset, nil, comm, Stream(2)); !errors.Is(err, &Error{Status: ErrUnsupported}) {
		t.Fatalf("TPConsensusOn on the CPU backend: %v", err)
	}
	dir := t.TempDir()
	cfgJSON := `{"num_hidden_layers": 48, "num_attention_heads": 24, "num_key_value_heads": 2,
		"head_dim": 256, "full_attention_interval": 4, "index_n_heads": 4,
		"index_head_dim": 128, "index_compress_ratio": 4, "index_topk": 2048}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfgJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := FromCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(m.QSALayers(), preset.QSALayers()) || m.HeadDim() != 256 || m.IndexNumHeads() != 4 {
		t.Fatalf("FromCheckpoint: layers %v head_dim %d index heads %d", m.QSALayers(), m.HeadDim(), m.IndexNumHeads())
	}
	if _, err := FromCheckpoint(filepath.Join(dir, "missing.json")); !errors.Is(err, &Error{Status: ErrIO}) {
		t.Fatalf("FromCheckpoint of a missing file: %v", err)
	}
	index := filepath.Join(dir, "model.safetensors.index.json")
	if err := os.WriteFile(index, []byte(`{"metadata": {}, "weight_map": {"w": "a.safetensors"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	pack := filepath.Join(dir, "pack")
	if err := WriteOverlay(pack, []int32{3, 7}, []float32{0.5, 2}, []float32{0.25, 1}, index); err != nil {
		t.Fatal(err)
	}
	scales, sha, err := ReadScaleFile(filepath.Join(pack, "model-kvscales.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	want := []LayerScales{{3, 0.5, 0.25}, {7, 2, 1}}
	if !reflect.DeepEqual(scales, want) || len(sha) != 64 {
		t.Fatalf("ReadScaleFile: %v %q", scales, sha)
	}
}

func TestErrorsFromManyGoroutines(t *testing.T) {
	var wg sync.WaitGroup
	errs := make([]error, 32)
	for i := range errs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			_, errs[i] = Preset(strings.Repeat("x", i+1))
		}(i)
	}
	wg.Wait()
	for i, err := range errs {
		var qe *Error
		if !errors.As(err, &qe) || !strings.Contains(qe.Message, "\""+strings.Repeat("x", i+1)+"\"") &&
			!strings.Contains(qe.Message, " "+strings.Repeat("x", i+1)) {
			t.Fatalf("goroutine %d: %v", i, err)
		}
	}
}

func TestPlanOptionsReachTheLibrary(t *testing.T) {
	ctx := must(NewContext(BackendCPU))
	defer ctx.Close()
	cache := must(NewCache(ctx, smallFP16Config(t), nil, CacheOptions{NumBlocks: 2}))
	defer cache.Close()
	o := PlanOptions{MaxRows: 4, MaxRequests: 2, NumSplits: 5, MultiRowMinRows: 3}
	plan := must(NewPlanWithOptions(cache, o))
	info := must(plan.Info())
	if info.MaxRows != 4 || info.MaxRequests != 2 || info.NumSplits != 5 {
		t.Fatalf("%+v", info)
	}
	// The CPU backend has no grouped route: the rule in force is "never".
	if info.MultiRowMinRows != -1 {
		t.Fatalf("multi_row_min_rows in force: %d", info.MultiRowMinRows)
	}
	if err := plan.Close(); err != nil {
		t.Fatal(err)
	}
	o.MultiRowMinRows = -2
	var qe *Error
	if _, err := NewPlanWithOptions(cache, o); !errors.As(err, &qe) || qe.Status != ErrInvalidArgument ||
		!strings.Contains(qe.Message, "multi_row_min_rows") {
		t.Fatalf("multi_row_min_rows -2: %v", err)
	}
}

func TestHandlesAreFreed(t *testing.T) {
	vmSize := func() int64 {
		s, err := os.ReadFile("/proc/self/status")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(s), "\n") {
			if strings.HasPrefix(line, "VmSize:") {
				kib, err := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return kib
			}
		}
		t.Fatal("no VmSize")
		return 0
	}
	cfg := smallFP16Config(t)
	cycle := func() uint64 {
		ctx := must(NewContext(BackendCPU))
		cache := must(NewCache(ctx, cfg, nil, CacheOptions{NumBlocks: 64}))
		plan := must(NewPlan(cache, 1, 1))
		buf := must(NewDeviceBuffer(ctx, 1<<20))
		total := must(cache.TotalBytes())
		for _, c := range []interface{ Close() error }{buf, plan, cache, ctx} {
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
		}
		// Close twice is harmless.
		if err := ctx.Close(); err != nil {
			t.Fatal(err)
		}
		return total
	}
	per := cycle()
	if per < 1<<20 {
		t.Fatalf("cache of %d bytes", per)
	}
	for i := 0; i < 20; i++ {
		cycle()
	}
	runtime.GC()
	before := vmSize()
	for i := 0; i < 200; i++ {
		cycle()
	}
	runtime.GC()
	grown := vmSize() - before
	t.Logf("cache %d bytes per cycle; virtual size grew %d KiB over 200 cycles", per, grown)
	// A leak grows it by 200 caches; the slack (20 caches) covers malloc arenas of the
	// OS threads cgo calls run on.
	if uint64(grown)*1024 > 20*per {
		t.Fatalf("virtual size grew %d KiB: handles leak", grown)
	}
}

func TestVersion(t *testing.T) {
	if !strings.HasPrefix(Version(), "0.") && !strings.Contains(Version(), ".") {
		t.Fatal(Version())
	}
	// The library's version is CMakeLists.txt's project(VERSION): compare with it.
	cmake, err := os.ReadFile("../../../CMakeLists.txt")
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Fields(strings.SplitN(string(cmake), "project(qsakv VERSION ", 2)[1])[0]
	if Version() != want {
		t.Fatalf("library %s, CMakeLists.txt %s", Version(), want)
	}
}

// A buffer made for one call and dropped after it, left to its finalizer (the backstop the
// README promises), must not be freed while the call still reads it: call keeps every
// object whose C pointer it passes alive until the C call returns. The probe finalizer
// records a free during the call; a goroutine forces collections meanwhile.
func TestFinalizersWaitForTheCallsThatUseTheirBuffers(t *testing.T) {
	ctx := must(NewContext(BackendCPU))
	defer ctx.Close()
	cfg := must(Preset("qwen4_exp"))
	cfg.TPSize, cfg.KVDtype = 4, DtypeFP16
	rows, seq := 128, 2048
	cfg.MaxBatchedTokens, cfg.MaxRequests, cfg.MaxModelLen = int32(rows), 1, int32(seq)
	cache := must(NewCache(ctx, cfg, nil, CacheOptions{NumBlocks: int64(seq) / 64}))
	defer cache.Close()
	plan := must(NewPlan(cache, int32(rows), 1))
	defer plan.Close()
	bt := make([]int32, seq/64)
	for i := range bt {
		bt[i] = int32(i)
	}
	dbt := must(BufferFrom(ctx, bt))
	defer dbt.Close()
	if err := plan.Update([]int32{0, int32(rows)}, []int32{int32(seq)}, dbt, int32(len(bt))); err != nil {
		t.Fatal(err)
	}
	g := cache.Geometry()
	qBytes := rows * int(g.QHeads) * int(cfg.HeadDim()) * 2
	out := must(NewDeviceBuffer(ctx, qBytes))
	defer out.Close()
	var freedInCall atomic.Bool
	attendOnce := func() error {
		q := must(NewDeviceBuffer(ctx, qBytes))
		inCall := new(atomic.Bool) // this buffer's own call, not a later one
		runtime.SetFinalizer(q, nil)
		runtime.SetFinalizer(q, func(b *DeviceBuffer) {
			if inCall.Load() {
				freedInCall.Store(true)
			}
			b.Close()
		})
		inCall.Store(true)
		err := plan.Attention(cfg.QSALayers()[0], AttentionDense, q, out)
		inCall.Store(false)
		return err // q is not used after the call: only call's KeepAlive holds it
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				runtime.GC()
			}
		}
	}()
	for i := 0; i < 4; i++ {
		if err := attendOnce(); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	<-done
	runtime.GC()
	if freedInCall.Load() {
		t.Fatal("a DeviceBuffer was freed by its finalizer while qsakv_attention_run read it")
	}
}

// The kernels read the last Update's block table when they run; closing it first is
// refused (ErrState), not a read of freed memory.
func TestRunsAfterTheBlockTableIsClosedAreRefused(t *testing.T) {
	ctx := must(NewContext(BackendCPU))
	defer ctx.Close()
	cfg := must(Preset("qwen4_exp"))
	cfg.TPSize, cfg.KVDtype, cfg.MaxBatchedTokens, cfg.MaxRequests, cfg.MaxModelLen = 4, DtypeFP16, 8, 2, 256
	cache := must(NewCache(ctx, cfg, nil, CacheOptions{NumBlocks: 4}))
	defer cache.Close()
	plan := must(NewPlan(cache, 1, 1))
	defer plan.Close()
	dbt := must(BufferFrom(ctx, []int32{0, 1, 2, 3}))
	if err := plan.Update([]int32{0, 1}, []int32{200}, dbt, 4); err != nil {
		t.Fatal(err)
	}
	dbt.Close()
	g := cache.Geometry()
	q := must(NewDeviceBuffer(ctx, int(g.QHeads)*int(cfg.HeadDim())*2))
	defer q.Close()
	out := must(NewDeviceBuffer(ctx, int(g.QHeads)*int(cfg.HeadDim())*2))
	defer out.Close()
	iq := must(NewDeviceBuffer(ctx, int(cfg.IndexNumHeads())*int(cfg.IndexHeadDim())*2))
	defer iq.Close()
	for name, err := range map[string]error{
		"Attention":  plan.Attention(cfg.QSALayers()[0], AttentionDense, q, out),
		"SelectTopK": plan.SelectTopK(cfg.QSALayers()[0], iq),
	} {
		if !errors.Is(err, &Error{Status: ErrState}) || !strings.Contains(err.Error(), "block table") {
			t.Fatalf("%s after the block table was closed: %v, want ErrState naming the block table", name, err)
		}
	}
}

// An overlay may be closed as soon as its caches exist (they copy its scales), as in C:
// its Close succeeds with an E4M3 cache open, and the cache then stores and attends with
// the overlay's V scale (V = 1.9 at scale 0.02 is code 96, read as 1.92; unit scales
// would read 1.875).
func TestOverlayClosesWhileItsCachesStayOpen(t *testing.T) {
	ctx := must(NewContext(BackendCPU))
	defer ctx.Close()
	cfg := smallFP16Config(t)
	cfg.KVDtype = DtypeE4M3
	layers := cfg.QSALayers()
	ks, vs := make([]float32, len(layers)), make([]float32, len(layers))
	for i := range layers {
		ks[i], vs[i] = 0.01, 0.02
	}
	ov := validatedOverlay(t, cfg, ks, vs)
	cache := must(NewCache(ctx, cfg, ov, CacheOptions{NumBlocks: 2}))
	defer cache.Close()
	if err := ov.Close(); err != nil {
		t.Fatalf("Overlay.Close with its cache open: %v", err)
	}
	runtime.GC()
	layer := layers[0]
	g := must(cfg.RankGeometry())
	d, h, l := int(cfg.HeadDim()), int(g.QHeads), 4
	k, v := make([]uint16, l*d), make([]uint16, l*d)
	slots := make([]int64, l)
	for tok := range slots {
		slots[tok] = int64(cfg.BlockSize) + int64(tok) // block 1
		for j := 0; j < d; j++ {
			v[tok*d+j] = toHalf(1.9)
		}
	}
	q := make([]uint16, h*d)
	bufs := []*DeviceBuffer{must(BufferFrom(ctx, k)), must(BufferFrom(ctx, v)), must(BufferFrom(ctx, slots)),
		must(BufferFrom(ctx, q)), must(BufferFrom(ctx, []int32{1, -1})), must(NewDeviceBuffer(ctx, len(q)*2))}
	defer func() {
		for _, b := range bufs {
			b.Close()
		}
	}()
	if err := cache.StoreKV(layer, bufs[0], bufs[1], bufs[2], l); err != nil {
		t.Fatal(err)
	}
	plan := must(NewPlan(cache, 1, 1))
	defer plan.Close()
	if err := plan.Update([]int32{0, 1}, []int32{int32(l)}, bufs[4], 2); err != nil {
		t.Fatal(err)
	}
	if err := plan.Attention(layer, AttentionDense, bufs[3], bufs[5]); err != nil {
		t.Fatal(err)
	}
	out := make([]uint16, len(q))
	if err := Download(bufs[5], out); err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		if got := fromHalf(o); math.Abs(got-1.92) > 0.01 {
			t.Fatalf("out[%d] = %g after the overlay closed, want 1.92 (V 1.9 at scale 0.02)", i, got)
		}
	}
}

// Counts whose byte size does not fit an int are refused before the call, as negative
// ones are: a count * row that wrapped around would pass the size check and the C call
// would read past the buffer.
func TestCountsThatOverflowAreRefused(t *testing.T) {
	ctx := must(NewContext(BackendCPU))
	defer ctx.Close()
	cfg := smallFP16Config(t)
	cache := must(NewCache(ctx, cfg, nil, CacheOptions{NumBlocks: 2}))
	defer cache.Close()
	buf := must(NewDeviceBuffer(ctx, 1<<12))
	defer buf.Close()
	layer := cfg.QSALayers()[0]
	row := int(must(cfg.RankGeometry()).KVHeads) * int(cfg.HeadDim()) * 2
	// A count whose byte size wraps to exactly 0 (row is a power of two here).
	wrapping := int(uint(1) << 63 / uint(row) * 2)
	if wrapping*row != 0 {
		t.Fatalf("test setup: %d * %d = %d, not a wrap to 0", wrapping, row, wrapping*row)
	}
	for _, n := range []int{wrapping, math.MaxInt, -1} {
		err := cache.StoreKV(layer, buf, buf, buf, n)
		var qe *Error
		if !errors.As(err, &qe) || qe.Status != ErrInvalidArgument || !strings.HasPrefix(qe.Message, "k: ") {
			t.Fatalf("StoreKV of %d tokens: %v, want ErrInvalidArgument naming k", n, err)
		}
		if err := cache.StoreCompressedKeys(layer, buf, buf, n); !errors.Is(err, &Error{Status: ErrInvalidArgument}) {
			t.Fatalf("StoreCompressedKeys of %d keys: %v", n, err)
		}
	}
}

// A buffer of another context is refused, naming the argument: another context's memory
// may be on another GPU, where the kernel's access would be a fault.
func TestBuffersOfAnotherContextAreRefused(t *testing.T) {
	ctx := must(NewContext(BackendCPU))
	defer ctx.Close()
	other := must(NewContext(BackendCPU))
	defer other.Close()
	cfg := smallFP16Config(t)
	cache := must(NewCache(ctx, cfg, nil, CacheOptions{NumBlocks: 2}))
	defer cache.Close()
	mine := must(NewDeviceBuffer(ctx, 1<<16))
	defer mine.Close()
	foreign := must(NewDeviceBuffer(other, 1<<16))
	defer foreign.Close()
	err := cache.StoreKV(cfg.QSALayers()[0], mine, foreign, mine, 1)
	var qe *Error
	if !errors.As(err, &qe) || qe.Status != ErrInvalidArgument || !strings.HasPrefix(qe.Message, "v: a buffer of another context") {
		t.Fatalf("StoreKV with another context's v: %v", err)
	}
}

// NewContextWithOptions passes the device and decoder: the library refuses a negative
// device and an unknown decoder by name, the CPU backend refuses the hardware decoder,
// and a context's info reports the decoder it chose and the CPU backend's device fields.
func TestContextOptionsReachTheLibrary(t *testing.T) {
	var qe *Error
	for _, c := range []struct {
		opts   ContextOptions
		status Status
		field  string
	}{
		{ContextOptions{Backend: BackendCPU, Device: -1}, ErrInvalidArgument, "options.device is -1"},
		{ContextOptions{Backend: BackendCPU, Decoder: 7}, ErrInvalidArgument, "options.decoder is 7"},
		{ContextOptions{Backend: BackendCPU, Decoder: DecoderHardware}, ErrUnsupported, "options.decoder is HARDWARE"},
		{ContextOptions{Backend: 9}, ErrInvalidArgument, "options.backend is 9"},
	} {
		ctx, err := NewContextWithOptions(c.opts)
		if ctx != nil || !errors.As(err, &qe) || qe.Status != c.status || !strings.Contains(qe.Message, c.field) {
			t.Fatalf("%+v: %v, want %v naming %q", c.opts, err, c.status, c.field)
		}
	}
	// A device that no GPU has: CUDA asked for, so ErrNoDevice (here and on a GPU host).
	if _, err := NewContextWithOptions(ContextOptions{Backend: BackendCUDA, Device: 1 << 20}); !errors.As(err, &qe) ||
		qe.Status != ErrNoDevice || qe.Message == "" {
		t.Fatalf("CUDA device 1<<20: %v, want ErrNoDevice", err)
	}
	// The CPU backend ignores the device ordinal and decodes E4M3 in software.
	ctx := must(NewContextWithOptions(ContextOptions{Backend: BackendCPU, Device: 3, Decoder: DecoderSoftware}))
	defer ctx.Close()
	info := must(ctx.Info())
	want := ContextInfo{Backend: BackendCPU, Decoder: DecoderSoftware, Device: -1,
		DeviceName: "CPU (reference backend)"}
	if info != want {
		t.Fatalf("info %+v, want %+v", info, want)
	}
	// NewContext is NewContextWithOptions with only the backend.
	auto := must(NewContext(BackendCPU))
	defer auto.Close()
	if a := must(auto.Info()); a != want {
		t.Fatalf("NewContext(BackendCPU): %+v", a)
	}
}

// A Stream reaches C as the cudaStream_t of the same bits (the CPU backend ignores it, so
// the conversion is checked here), and the stream calls of the memory helpers work on
// the CPU backend: a round trip through UploadOn and DownloadOn, then SynchronizeOn.
func TestStreams(t *testing.T) {
	for _, s := range []Stream{DefaultStream, 1, 2, 0x7f12345678} {
		if got := uintptr(unsafe.Pointer(s.c())); got != uintptr(s) {
			t.Fatalf("Stream %#x reaches C as %#x", uintptr(s), got)
		}
	}
	ctx := must(NewContext(BackendCPU))
	defer ctx.Close()
	want := []float32{1.5, -2, 3.25, 1e-3}
	b := must(NewDeviceBuffer(ctx, 16))
	defer b.Close()
	if err := UploadOn(b, want, Stream(2)); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, 4)
	if err := DownloadOn(b, got, Stream(2)); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip on a stream: %v, want %v", got, want)
	}
	if err := ctx.SynchronizeOn(Stream(2)); err != nil {
		t.Fatal(err)
	}
	// A closed context is refused before the stream is used.
	ctx2 := must(NewContext(BackendCPU))
	ctx2.Close()
	if err := ctx2.SynchronizeOn(DefaultStream); !errors.Is(err, &Error{Status: ErrState}) {
		t.Fatalf("SynchronizeOn a closed context: %v", err)
	}
}

// The records carry every field of their C struct: the rank geometry's first heads, the
// capacity plan's fixed costs and block size, the layout's strides and top-k shape, each
// against the arithmetic of the header.
func TestRecordsCarryEveryField(t *testing.T) {
	cfg := must(Preset("qwen4_exp")) // 24 query heads, 2 KV heads, 12 QSA layers
	for _, c := range []struct{ size, rank, q, kv, firstQ, firstKV int32 }{
		{1, 0, 24, 2, 0, 0}, {2, 1, 12, 1, 12, 1}, {4, 3, 6, 1, 18, 1}, {4, 1, 6, 1, 6, 0},
	} {
		cfg.TPSize, cfg.TPRank = c.size, c.rank
		g := must(cfg.RankGeometry())
		want := RankGeometry{QHeads: c.q, KVHeads: c.kv, GroupSize: c.q / c.kv, TopkWidth: 2051, TopkBlocks: 512,
			RingLength: 4, SoftmaxScale: 1.0 / 16, FirstQHead: c.firstQ, FirstKVHead: c.firstKV}
		if g != want {
			t.Fatalf("TP%d rank %d: %+v, want %+v", c.size, c.rank, g, want)
		}
	}

	cfg.TPSize, cfg.TPRank = 4, 0
	const budget = 40 << 30
	k := must(cfg.Capacity(budget))
	perRequest := uint64(12 * 4 * 128 * 2) // layers x ring length x index dims x FP16
	topk := uint64(8192 * 2051 * 4)        // max_batched_tokens x width x int32
	perBlock := uint64(64 * (12*2*256 + 12*256/4))
	if k.RingBytesPerRequest != perRequest || k.RingBytes != 256*perRequest || k.TopkBytes != topk ||
		k.TopkBytesUnshared != 12*topk || k.BudgetBytes != budget || k.BytesPerBlock != perBlock ||
		k.NumBlocks != int64((budget-256*perRequest-topk)/perBlock) {
		t.Fatalf("capacity %+v", k)
	}

	ctx := must(NewContext(BackendCPU))
	defer ctx.Close()
	small := smallFP16Config(t)
	cache := must(NewCache(ctx, small, nil, CacheOptions{NumBlocks: 4}))
	defer cache.Close()
	l := must(cache.Layout())
	if l.NumQSALayers != 12 || l.KVStrideHead != 256 || l.KVStrideToken != 256 || l.KVStrideKV != 64*256 ||
		l.KVStrideBlock != 2*64*256 || l.KVBytesPerLayer != uint64(4*l.KVStrideBlock*2) ||
		l.TopkRows != 8 || l.TopkCols != 2051 || !l.TopkShared || l.TopkExternal {
		t.Fatalf("layout %+v", l)
	}
}

// CacheOptions.PrivateTopk gives every layer its own top-k buffer: selection for one
// layer leaves another's list alone (zeroed at creation: token 0 at every entry, so that
// layer's sparse attention outputs token 0's V), where with the shared buffer the other
// layer reads the selection just made (tokens 0..3 of the reference mix). It costs a
// buffer per layer. The external buffer's refusals: one too small (in Go), one with
// private buffers (in the library).
func TestPrivateTopkBuffers(t *testing.T) {
	ctx := must(NewContext(BackendCPU))
	defer ctx.Close()
	cfg := smallFP16Config(t)
	g := must(cfg.RankGeometry())
	d, h, l := int(cfg.HeadDim()), int(g.QHeads), 4
	layers := cfg.QSALayers()
	v := make([]uint16, l*d)
	for i := range v {
		v[i] = toHalf(float32(i / d)) // token t's V is t at every dim
	}
	k := make([]uint16, l*d)
	slots := []int64{0, 1, 2, 3}
	iq := make([]uint16, cfg.IndexNumHeads()*cfg.IndexHeadDim())
	bufs := []*DeviceBuffer{must(BufferFrom(ctx, k)), must(BufferFrom(ctx, v)), must(BufferFrom(ctx, slots)),
		must(BufferFrom(ctx, iq)), must(BufferFrom(ctx, make([]uint16, h*d))), must(NewDeviceBuffer(ctx, h*d*2)),
		must(BufferFrom(ctx, []int32{0}))}
	defer func() {
		for _, b := range bufs {
			b.Close()
		}
	}()
	var totals [2]uint64
	for i, private := range []bool{false, true} {
		cache := must(NewCache(ctx, cfg, nil, CacheOptions{NumBlocks: 2, PrivateTopk: private}))
		lay := must(cache.Layout())
		if lay.TopkShared == private {
			t.Fatalf("private %v: layout says shared %v", private, lay.TopkShared)
		}
		totals[i] = lay.TotalBytes
		for _, layer := range layers[:2] {
			if err := cache.StoreKV(layer, bufs[0], bufs[1], bufs[2], l); err != nil {
				t.Fatal(err)
			}
		}
		plan := must(NewPlan(cache, 1, 1))
		if err := plan.Update([]int32{0, 1}, []int32{int32(l)}, bufs[6], 1); err != nil {
			t.Fatal(err)
		}
		if err := plan.SelectTopK(layers[0], bufs[3]); err != nil {
			t.Fatal(err)
		}
		if err := plan.Attention(layers[1], AttentionSparse, bufs[4], bufs[5]); err != nil {
			t.Fatal(err)
		}
		out := make([]uint16, h*d)
		if err := Download(bufs[5], out); err != nil {
			t.Fatal(err)
		}
		want := 1.5 // q = 0: the mean of tokens 0..3
		if private {
			want = 0 // 2051 entries of token 0
		}
		for j, o := range out {
			if fromHalf(o) != want {
				t.Fatalf("private %v: layer %d's out[%d] = %g, want %g", private, layers[1], j, fromHalf(o), want)
			}
		}
		plan.Close()
		cache.Close()
	}
	perLayer := uint64(cfg.MaxBatchedTokens) * uint64(g.TopkWidth) * 4
	if totals[1]-totals[0] != uint64(len(layers)-1)*perLayer {
		t.Fatalf("total bytes shared %d, private %d: not %d more buffers of %d", totals[0], totals[1], len(layers)-1, perLayer)
	}

	var qe *Error
	short := must(NewDeviceBuffer(ctx, int(cfg.MaxBatchedTokens)*int(g.TopkWidth)*4-4))
	bufs = append(bufs, short)
	if _, err := NewCache(ctx, cfg, nil, CacheOptions{NumBlocks: 2, ExternalTopk: short}); !errors.As(err, &qe) ||
		qe.Status != ErrInvalidArgument || !strings.HasPrefix(qe.Message, "external_topk: needs") {
		t.Fatalf("an external top-k buffer one entry short: %v", err)
	}
	rows := int64(cfg.MaxBatchedTokens) - 1
	if _, err := NewCache(ctx, cfg, nil, CacheOptions{NumBlocks: 2, ExternalTopk: short, ExternalTopkRows: rows}); !errors.As(err, &qe) ||
		qe.Status != ErrInvalidArgument || !strings.Contains(qe.Message, "options.external_topk_rows is 7") {
		t.Fatalf("an external top-k buffer of max_batched_tokens - 1 rows: %v", err)
	}
	if _, err := NewCache(ctx, cfg, nil, CacheOptions{NumBlocks: 2, ExternalTopk: short, ExternalTopkRows: 1, PrivateTopk: true}); !errors.As(err, &qe) ||
		qe.Status != ErrInvalidArgument || !strings.Contains(qe.Message, "share_topk = 0") {
		t.Fatalf("an external top-k buffer with private buffers: %v", err)
	}
	if short.users.Load() != 0 {
		t.Fatal("a refused cache left its buffers counted as used")
	}
}

// hostSlice views n elements at a device pointer of the CPU backend (host memory).
func hostSlice[T Element](p unsafe.Pointer, n int) []T { return unsafe.Slice((*T)(p), n) }

// LayerBuffers points at the layer's caches (on the CPU backend, host memory): StoreKV's
// values sit in KV at the layout's strides, StoreIndexKeys' (plain and On a stream) in the
// ring at (slot, position % ring length), a negative position skipped; the shared top-k
// buffer is one for all layers, private ones a buffer apart; the scales of a 16-bit cache
// are 1. NoteExternalCodes takes a QSA layer and refuses another.
func TestLayerBuffersAndIndexKeyStores(t *testing.T) {
	ctx := must(NewContext(BackendCPU))
	defer ctx.Close()
	cfg := smallFP16Config(t)
	g := must(cfg.RankGeometry())
	layers := cfg.QSALayers()
	cache := must(NewCache(ctx, cfg, nil, CacheOptions{NumBlocks: 2}))
	defer cache.Close()
	lay := must(cache.Layout())
	d, kvh := int(cfg.HeadDim()), int(g.KVHeads)
	k, v := make([]uint16, 2*kvh*d), make([]uint16, 2*kvh*d)
	for i := range k {
		k[i], v[i] = toHalf(float32(i%7)), toHalf(float32(-(i % 5)))
	}
	slots := []int64{int64(cfg.BlockSize) + 3, 5} // block 1 offset 3, block 0 offset 5
	dk, dv, ds := must(BufferFrom(ctx, k)), must(BufferFrom(ctx, v)), must(BufferFrom(ctx, slots))
	defer dk.Close()
	defer dv.Close()
	defer ds.Close()
	layer := layers[1]
	if err := cache.StoreKV(layer, dk, dv, ds, 2); err != nil {
		t.Fatal(err)
	}
	b := must(cache.LayerBuffers(layer))
	kv := hostSlice[uint16](b.KV, int(lay.KVBytesPerLayer/2))
	for tok, slot := range slots {
		blk, off := slot/int64(cfg.BlockSize), slot%int64(cfg.BlockSize)
		for hd := 0; hd < kvh; hd++ {
			for j := 0; j < d; j++ {
				at := blk*lay.KVStrideBlock + off*lay.KVStrideToken + int64(hd)*lay.KVStrideHead + int64(j)
				if got, want := kv[at], k[(tok*kvh+hd)*d+j]; got != want {
					t.Fatalf("K of token %d dim %d: %#x, want %#x", tok, j, got, want)
				}
				if got, want := kv[at+lay.KVStrideKV], v[(tok*kvh+hd)*d+j]; got != want {
					t.Fatalf("V of token %d dim %d: %#x, want %#x", tok, j, got, want)
				}
			}
		}
	}
	if sc := hostSlice[float32](b.Scales, 2); sc[0] != 1 || sc[1] != 1 {
		t.Fatalf("scales of a 16-bit cache: %v", sc)
	}

	// Raw index keys: request slot 1, positions 5 and 6 (ring entries 1 and 2) and -1.
	dim := int(cfg.IndexHeadDim())
	keys := make([]uint16, 3*dim)
	for i := range keys {
		keys[i] = toHalf(float32(1 + i/dim))
	}
	dkeys, dreq, dpos := must(BufferFrom(ctx, keys)), must(BufferFrom(ctx, []int32{1, 1, 1})), must(BufferFrom(ctx, []int64{5, -1, 6}))
	defer dkeys.Close()
	defer dreq.Close()
	defer dpos.Close()
	ring := hostSlice[uint16](b.RingKeys, int(lay.RingBytesPerLayer/2))
	entry := func(slot, pos int) []uint16 {
		at := (slot*int(lay.RingLength) + pos%int(lay.RingLength)) * dim
		return ring[at : at+dim]
	}
	for i, store := range []func() error{
		func() error { return cache.StoreIndexKeys(layer, dkeys, dreq, dpos, 2) },
		func() error { return cache.StoreIndexKeysOn(layer, dkeys, dreq, dpos, 3, Stream(2)) },
	} {
		if err := store(); err != nil {
			t.Fatal(err)
		}
		want6 := toHalf(0) // the plain call stored 2 keys: position 6 is the third
		if i == 1 {
			want6 = toHalf(3)
		}
		for j := 0; j < dim; j++ {
			if entry(1, 5)[j] != toHalf(1) || entry(1, 6)[j] != want6 || entry(1, 7)[j] != 0 || entry(0, 5)[j] != 0 {
				t.Fatalf("call %d: ring (1,5) %#x (1,6) %#x (1,7) %#x (0,5) %#x", i, entry(1, 5)[j], entry(1, 6)[j],
					entry(1, 7)[j], entry(0, 5)[j])
			}
		}
	}
	if err := cache.StoreIndexKeys(layer, dkeys, dreq, dpos, 4); !errors.Is(err, &Error{Status: ErrInvalidArgument}) {
		t.Fatalf("4 index keys from buffers of 3: %v", err)
	}

	// The top-k buffer: one for all layers, or one per layer a buffer apart.
	if other := must(cache.LayerBuffers(layers[0])); other.Topk != b.Topk || other.KV == b.KV {
		t.Fatalf("shared top-k: layer %d %p, layer %d %p", layers[0], other.Topk, layer, b.Topk)
	}
	private := must(NewCache(ctx, cfg, nil, CacheOptions{NumBlocks: 2, PrivateTopk: true}))
	defer private.Close()
	p0, p1 := must(private.LayerBuffers(layers[0])), must(private.LayerBuffers(layers[1]))
	if uintptr(p1.Topk)-uintptr(p0.Topk) != uintptr(lay.TopkRows*lay.TopkCols*4) {
		t.Fatalf("private top-k buffers at %p and %p", p0.Topk, p1.Topk)
	}

	var qe *Error
	if err := cache.NoteExternalCodesOn(layer, Stream(2)); err != nil {
		t.Fatal(err)
	}
	if err := cache.NoteExternalCodes(layer - 1); !errors.As(err, &qe) || qe.Status != ErrInvalidArgument ||
		!strings.Contains(qe.Message, strconv.Itoa(int(layer-1))) {
		t.Fatalf("NoteExternalCodes of layer %d (not QSA): %v", layer-1, err)
	}
	if _, err := cache.LayerBuffers(layer - 1); !errors.As(err, &qe) || qe.Status != ErrInvalidArgument {
		t.Fatalf("LayerBuffers of layer %d (not QSA): %v", layer-1, err)
	}
}

// CacheLayoutFor is the layout NewCache makes (without the allocation's total), and
// NewCacheWithMemory runs over buffers of ours: their contents are used as they are (V
// uploaded as 2 before the cache existed is what dense attention reads), LayerBuffers
// points into them, the library allocates only the small rest, the buffers refuse to
// close under the cache, and the library's refusals name the buffer or count at fault.
func TestCacheWithMemory(t *testing.T) {
	ctx := must(NewContext(BackendCPU))
	defer ctx.Close()
	cfg := smallFP16Config(t)
	layers := cfg.QSALayers()
	opts := CacheOptions{NumBlocks: 2}
	lay := must(CacheLayoutFor(cfg, opts))
	own := must(NewCache(ctx, cfg, nil, opts))
	full := must(own.Layout())
	own.Close()
	cmp := full
	cmp.TotalBytes = lay.TotalBytes
	if lay != cmp || lay.NumBlocks != 2 || lay.KVBytesPerLayer == 0 {
		t.Fatalf("CacheLayoutFor %+v, NewCache's layout %+v", lay, full)
	}
	var qe *Error
	if _, err := CacheLayoutFor(cfg, CacheOptions{MemoryBudgetBytes: 1 << 30}); !errors.As(err, &qe) ||
		qe.Status != ErrInvalidArgument || !strings.Contains(qe.Message, "options.num_blocks is 0") {
		t.Fatalf("CacheLayoutFor without num_blocks: %v", err)
	}

	twos := make([]uint16, lay.KVBytesPerLayer/2)
	for i := range twos {
		twos[i] = toHalf(2)
	}
	mem := make([]LayerMemory, len(layers))
	var all []*DeviceBuffer
	for i := range mem {
		mem[i] = LayerMemory{KV: must(BufferFrom(ctx, twos)),
			CompressedKeys: must(NewDeviceBuffer(ctx, int(lay.CompressedBytesPerLayer))),
			RingKeys:       must(NewDeviceBuffer(ctx, int(lay.RingBytesPerLayer)))}
		all = append(all, mem[i].KV, mem[i].CompressedKeys, mem[i].RingKeys)
	}
	defer func() {
		for _, b := range all {
			if err := b.Close(); err != nil {
				t.Errorf("closing a buffer after its cache: %v", err)
			}
		}
	}()
	small := must(NewDeviceBuffer(ctx, 1024))
	all = append(all, small)
	bad := append([]LayerMemory(nil), mem...)
	bad[2].KV = small
	if _, err := NewCacheWithMemory(ctx, cfg, nil, opts, bad); !errors.As(err, &qe) || qe.Status != ErrInvalidArgument ||
		!strings.Contains(qe.Message, "memory.layers[2].kv (layer 11) is 1024 bytes; needs") {
		t.Fatalf("a 1 KiB kv buffer: %v", err)
	}
	if _, err := NewCacheWithMemory(ctx, cfg, nil, opts, mem[1:]); !errors.As(err, &qe) || qe.Status != ErrInvalidArgument ||
		!strings.Contains(qe.Message, "memory.num_layers is 11") {
		t.Fatalf("11 layers of memory: %v", err)
	}
	if _, err := NewCacheWithMemory(ctx, cfg, nil, opts, []LayerMemory{{KV: small}}); !errors.As(err, &qe) ||
		qe.Status != ErrState || !strings.HasPrefix(qe.Message, "memory[0].compressed_keys: ") {
		t.Fatalf("a nil buffer: %v", err)
	}

	cache := must(NewCacheWithMemory(ctx, cfg, nil, opts, mem))
	defer cache.Close()
	got := must(cache.Layout())
	if perLayer := lay.KVBytesPerLayer + lay.CompressedBytesPerLayer + lay.RingBytesPerLayer; full.TotalBytes-got.TotalBytes !=
		uint64(len(layers))*perLayer {
		t.Fatalf("total bytes %d over the caller's memory, %d allocating (%d layers of %d)", got.TotalBytes,
			full.TotalBytes, len(layers), perLayer)
	}
	for i, layer := range layers {
		b := must(cache.LayerBuffers(layer))
		if b.KV != mem[i].KV.Pointer() || b.CompressedKeys != mem[i].CompressedKeys.Pointer() || b.RingKeys != mem[i].RingKeys.Pointer() {
			t.Fatalf("layer %d's buffers %+v are not ours", layer, b)
		}
	}
	if err := mem[0].KV.Close(); !errors.Is(err, &Error{Status: ErrState}) {
		t.Fatalf("closing a buffer under its cache: %v", err)
	}
	g := cache.Geometry()
	q := must(BufferFrom(ctx, make([]uint16, int(g.QHeads)*int(cfg.HeadDim()))))
	out := must(NewDeviceBuffer(ctx, q.Len()))
	bt := must(BufferFrom(ctx, []int32{1}))
	all = append(all, q, out, bt)
	plan := must(NewPlan(cache, 1, 1))
	defer plan.Close()
	if err := plan.Update([]int32{0, 1}, []int32{10}, bt, 1); err != nil {
		t.Fatal(err)
	}
	if err := plan.Attention(layers[3], AttentionDense, q, out); err != nil {
		t.Fatal(err)
	}
	res := make([]uint16, q.Len()/2)
	if err := Download(out, res); err != nil {
		t.Fatal(err)
	}
	for i, o := range res {
		if fromHalf(o) != 2 {
			t.Fatalf("out[%d] = %g over the V of 2 uploaded into our buffer", i, fromHalf(o))
		}
	}
}

// A scale pack written with a contract, materialised over a base checkpoint: the loaded
// overlay's info carries the contract, the base revision, the scale file's hash and the
// prefix, turns validated on Validate, and the contract refuses another TP size. The
// base's other files are linked; a second materialisation into the same directory and
// one over another base are refused.
func TestOverlayInfoAndMaterialize(t *testing.T) {
	cfg := smallFP16Config(t) // TP4
	cfg.KVDtype = DtypeE4M3
	dir := t.TempDir()
	base := filepath.Join(dir, "base")
	if err := os.Mkdir(base, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"model.safetensors.index.json": `{"metadata": {"total_size": 4}, "weight_map": {"w": "a.safetensors"}}`,
		"a.safetensors":                "weights",
		"config.json":                  "{}",
	} {
		if err := os.WriteFile(filepath.Join(base, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	layers := cfg.QSALayers()
	ks, vs := make([]float32, len(layers)), make([]float32, len(layers))
	for i := range layers {
		ks[i], vs[i] = 0.5, 0.25
	}
	spec := int32(0)
	pack := filepath.Join(dir, "pack")
	opts := OverlayWriteOptions{BaseIndexPath: filepath.Join(base, "model.safetensors.index.json"),
		ContractTPSize: 4, ContractSpeculativeTokens: &spec, ContractActivationDtype: DtypeFP16, ContractMinSM: 80}
	if err := WriteOverlayWithOptions(pack, layers, ks, vs, opts); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "calibrated")
	if err := MaterializeOverlay(out, base, pack); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(out, "a.safetensors")); err != nil || string(b) != "weights" {
		t.Fatalf("the base's weights in the materialised checkpoint: %q, %v", b, err)
	}
	rev := must(CheckpointRevision(base))
	if r := must(CheckpointRevision(out)); r != rev {
		t.Fatalf("the materialised checkpoint's revision %s, the base's %s", r, rev)
	}
	ov := must(LoadOverlay(out, ""))
	defer ov.Close()
	_, sha := must2(ReadScaleFile(filepath.Join(pack, "model-kvscales.safetensors")))
	want := OverlayInfo{NumScales: int32(2 * len(layers)), ContractTPSize: 4, ContractSpeculativeTokens: 0,
		ContractActivationDtype: DtypeFP16, ContractMinSM: 80, BaseIndexSHA256: rev, ScaleFileSHA256: sha,
		LayerPrefix: "model.layers"}
	if info := must(ov.Info()); info != want {
		t.Fatalf("overlay info %+v, want %+v", info, want)
	}
	tp2 := *cfg
	tp2.TPSize = 2
	if err := ov.Validate(&tp2, rev); !errors.Is(err, &Error{Status: ErrContract}) {
		t.Fatalf("a TP2 config against a TP4 contract: %v", err)
	}
	if err := ov.Validate(cfg, rev); err != nil {
		t.Fatal(err)
	}
	want.Validated = true
	if info := must(ov.Info()); info != want {
		t.Fatalf("validated overlay info %+v", info)
	}
	// The pack without a contract: unconstrained fields read 0, -1 and DtypeInvalid.
	free := filepath.Join(dir, "free")
	if err := WriteOverlayWithOptions(free, layers, ks, vs, OverlayWriteOptions{BaseIndexPath: opts.BaseIndexPath,
		LayerPrefix: "model.language_model.layers", UnitScaleControl: true}); err != nil {
		t.Fatal(err)
	}
	fo := must(LoadOverlay(filepath.Join(free, "model-kvscales.safetensors"), ""))
	defer fo.Close()
	if info := must(fo.Info()); info.ContractTPSize != 0 || info.ContractSpeculativeTokens != -1 ||
		info.ContractActivationDtype != DtypeInvalid || info.ContractMinSM != 0 || !info.UnitScaleControl ||
		info.LayerPrefix != "model.language_model.layers" {
		t.Fatalf("unconstrained overlay info %+v", info)
	}

	var qe *Error
	if err := MaterializeOverlay(out, base, pack); !errors.As(err, &qe) || qe.Status != ErrInvalidArgument {
		t.Fatalf("materialising into an existing directory: %v", err)
	}
	other := filepath.Join(dir, "other")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "model.safetensors.index.json"), []byte(`{"metadata": {}, "weight_map": {}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := MaterializeOverlay(filepath.Join(dir, "wrong"), other, pack); !errors.Is(err, &Error{Status: ErrRevisionMismatch}) {
		t.Fatalf("materialising over another base: %v", err)
	}
}

func must2[A, B any](a A, b B, err error) (A, B) {
	if err != nil {
		panic(err)
	}
	return a, b
}

// Dtype names and sizes are the library's.
func TestDtypeNamesAndSizes(t *testing.T) {
	for _, c := range []struct {
		d    Dtype
		name string
		size int
	}{{DtypeInvalid, "invalid", 0}, {DtypeFP16, "fp16", 2}, {DtypeBF16, "bf16", 2}, {DtypeE4M3, "e4m3", 1},
		{DtypeFP32, "fp32", 4}, {DtypeInt32, "int32", 4}, {DtypeInt64, "int64", 8}, {Dtype(42), "invalid", 0}} {
		if c.d.String() != c.name || c.d.Size() != c.size {
			t.Fatalf("dtype %d: %q of %d bytes, want %q of %d", int32(c.d), c.d.String(), c.d.Size(), c.name, c.size)
		}
	}
}

// The calibration API on the CPU backend, from observation to a loaded scale pack: a live
// handle counts only while started, its snapshot's statistics and histogram are those of
// the observed values, a saved and loaded copy is the same, an envelope merge adds runs
// and counts, the summary's and the pack's scales are max / 448, and every refusal has
// its status (live-only and host-only calls, layers, ranks, all-reduce on the CPU).
func TestCalibration(t *testing.T) {
	ctx := must(NewContext(BackendCPU))
	defer ctx.Close()
	cfg := smallFP16Config(t)
	cfg.TPSize = 1 // complete with one rank: 2 KV heads of 256 dims
	layers := cfg.QSALayers()
	live := must(NewCalib(ctx, cfg))
	defer live.Close()
	info := must(live.Info())
	if !info.Live || info.Started || info.Reduced || info.TPSize != 1 || info.Rank != 0 || info.RanksCovered != 1 ||
		!info.Complete || info.NumRuns != 1 || info.ActivationDtype != DtypeFP16 ||
		!reflect.DeepEqual(info.QSALayers, layers) || len(info.ConfigFingerprint) != 64 {
		t.Fatalf("live info %+v", info)
	}
	if err := ctx.Close(); !errors.Is(err, &Error{Status: ErrState}) {
		t.Fatalf("context closed under its calibration handle: %v", err)
	}

	// K: 0, 1, -2, 3.5 repeated; V: 0, -0.25, ..., -1.75 repeated; 2 tokens of 2 x 256.
	n := 2 * 2 * 256
	k, v := make([]uint16, n), make([]uint16, n)
	for i := range k {
		k[i] = toHalf([]float32{0, 1, -2, 3.5}[i%4])
		v[i] = toHalf(-0.25 * float32(i%8))
	}
	dk, dv := must(BufferFrom(ctx, k)), must(BufferFrom(ctx, v))
	defer dk.Close()
	defer dv.Close()
	if err := live.Observe(layers[0], dk, dv, 2); err != nil { // stopped: not counted
		t.Fatal(err)
	}
	early := must(live.Snapshot())
	if s := must(early.Stats(layers[0], CalibK)); s.Count != 0 {
		t.Fatalf("counted while stopped: %+v", s)
	}
	early.Close()
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	for i, layer := range layers {
		var err error
		if i%2 == 1 {
			err = live.ObserveOn(layer, dk, dv, 2, Stream(2))
		} else {
			err = live.Observe(layer, dk, dv, 2)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	var qe *Error
	if err := live.Observe(layers[0]-1, dk, dv, 2); !errors.As(err, &qe) || qe.Status != ErrInvalidArgument ||
		!strings.Contains(qe.Message, "not a QSA layer") {
		t.Fatalf("observing a layer that is not QSA: %v", err)
	}
	if err := live.Observe(layers[0], dk, dv, 3); !errors.As(err, &qe) || !strings.HasPrefix(qe.Message, "k: needs") {
		t.Fatalf("observing 3 tokens from buffers of 2: %v", err)
	}
	if err := live.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := live.Stats(layers[0], CalibK); !errors.Is(err, &Error{Status: ErrState}) {
		t.Fatalf("Stats of a live handle: %v", err)
	}
	var comm [8]byte // a stand-in communicator, never read: the CPU backend refuses first
	if err := live.AllReduceOn(unsafe.Pointer(&comm), Stream(2)); !errors.Is(err, &Error{Status: ErrUnsupported}) {
		t.Fatalf("AllReduce on the CPU backend: %v", err)
	}

	snap := must(live.SnapshotOn(Stream(2)))
	defer snap.Close()
	if err := snap.Start(); !errors.Is(err, &Error{Status: ErrState}) {
		t.Fatalf("Start of a host copy: %v", err)
	}
	if err := snap.Observe(layers[0], dk, dv, 2); !errors.Is(err, &Error{Status: ErrState}) {
		t.Fatalf("Observe on a host copy: %v", err)
	}
	wantK := CalibStats{Count: uint64(n), FiniteCount: uint64(n), NonzeroCount: uint64(n * 3 / 4), MaxAbs: 3.5}
	wantV := CalibStats{Count: uint64(n), FiniteCount: uint64(n), NonzeroCount: uint64(n * 7 / 8), MaxAbs: 1.75}
	for _, layer := range layers {
		if s := must(snap.Stats(layer, CalibK)); s != wantK {
			t.Fatalf("layer %d K: %+v, want %+v", layer, s, wantK)
		}
		if s := must(snap.Stats(layer, CalibV)); s != wantV {
			t.Fatalf("layer %d V: %+v, want %+v", layer, s, wantV)
		}
	}
	// |x| = 1, 2, 3.5 land in bins floor((log2|x| + 24) * 4096 / 40).
	hist := must(snap.Histogram(layers[0], CalibK))
	bin := func(x float64) int { return int(math.Floor((math.Log2(x) - CalibLog2Min) * CalibBins / 40)) }
	var sum uint64
	for _, c := range hist {
		sum += c
	}
	if len(hist) != CalibBins || sum != wantK.NonzeroCount || hist[bin(1)] != uint64(n/4) || hist[bin(2)] != uint64(n/4) ||
		hist[bin(3.5)] != uint64(n/4) {
		t.Fatalf("histogram: %d bins, total %d, bins of 1, 2, 3.5: %d %d %d", len(hist), sum, hist[bin(1)], hist[bin(2)], hist[bin(3.5)])
	}
	sum7 := must(snap.Summarize(layers[0], CalibK))
	if sum7.Scale != 3.5/448 || sum7.MaxAbs != 3.5 || sum7.Count != uint64(n) || sum7.SaturateFraction != 0 {
		t.Fatalf("summary %+v", sum7)
	}
	if c := must(snap.Config()); !reflect.DeepEqual(c.QSALayers(), layers) || c.HeadDim() != 256 || c.TPSize != 1 ||
		c.MaxModelLen != cfg.MaxModelLen || c.ActivationDtype != DtypeFP16 {
		t.Fatalf("config %+v", c)
	}

	dir := t.TempDir()
	path := filepath.Join(dir, "stats.safetensors")
	if err := snap.Save(path); err != nil {
		t.Fatal(err)
	}
	if err := snap.Save(path); !errors.Is(err, &Error{Status: ErrInvalidArgument}) {
		t.Fatalf("saving over an existing file: %v", err)
	}
	loaded := must(LoadCalib(path))
	defer loaded.Close()
	if li := must(loaded.Info()); li.Live || li.ConfigFingerprint != info.ConfigFingerprint || li.NumRuns != 1 {
		t.Fatalf("loaded info %+v", li)
	}
	if s := must(loaded.Stats(layers[5], CalibV)); s != wantV {
		t.Fatalf("loaded stats %+v", s)
	}
	if _, err := LoadCalib(filepath.Join(dir, "missing")); !errors.Is(err, &Error{Status: ErrIO}) {
		t.Fatalf("loading a missing file: %v", err)
	}
	env := must(MergeCalib(CalibMergeEnvelope, snap, loaded))
	defer env.Close()
	if ei, s := must(env.Info()), must(env.Stats(layers[0], CalibK)); ei.NumRuns != 2 || s.Count != 2*uint64(n) || s.MaxAbs != 3.5 {
		t.Fatalf("envelope: %+v, %+v", ei, s)
	}
	if _, err := MergeCalib(CalibMergeRanks, snap, loaded); !errors.Is(err, &Error{Status: ErrInvalidArgument}) {
		t.Fatalf("merging the same rank twice as ranks: %v", err)
	}

	// The scale pack from the statistics: max / 448 per layer.
	index := filepath.Join(dir, "model.safetensors.index.json")
	if err := os.WriteFile(index, []byte(`{"metadata": {}, "weight_map": {"w": "a.safetensors"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	pack := filepath.Join(dir, "pack")
	if err := env.WriteOverlay(pack, OverlayWriteOptions{BaseIndexPath: index}); err != nil {
		t.Fatal(err)
	}
	ov := must(LoadOverlay(filepath.Join(pack, "model-kvscales.safetensors"), ""))
	defer ov.Close()
	for _, layer := range layers {
		if ks, vs, err := ov.Scales(layer); err != nil || ks != 3.5/448 || vs != 1.75/448 {
			t.Fatalf("layer %d scales %g %g (%v), want %g %g", layer, ks, vs, err, 3.5/448, 1.75/448)
		}
	}

	// One rank of four covers too little to summarise.
	tp4 := smallFP16Config(t)
	part := must(NewCalib(ctx, tp4))
	defer part.Close()
	ps := must(part.Snapshot())
	defer ps.Close()
	if _, err := ps.Summarize(layers[0], CalibK); !errors.Is(err, &Error{Status: ErrOverlayIncomplete}) {
		t.Fatalf("summarising one rank of four: %v", err)
	}
	if s, err := CalibScaleFromMax(448); err != nil || s != 1 {
		t.Fatalf("scale of 448: %g, %v", s, err)
	}
	if _, err := CalibScaleFromMax(0); !errors.Is(err, &Error{Status: ErrOverlayBadScale}) {
		t.Fatalf("scale of 0: %v", err)
	}
}

// An overlay of nothing but unit scales backs an E4M3 cache only when CacheOptions asks
// for it (a negative control); otherwise ErrOverlayUnitScales, naming the option.
func TestUnitScaleOverlayNeedsAllowUnitScales(t *testing.T) {
	ctx := must(NewContext(BackendCPU))
	defer ctx.Close()
	cfg := smallFP16Config(t)
	cfg.KVDtype = DtypeE4M3
	ones := make([]float32, len(cfg.QSALayers()))
	for i := range ones {
		ones[i] = 1
	}
	ov := validatedOverlay(t, cfg, ones, ones)
	defer ov.Close()
	_, err := NewCache(ctx, cfg, ov, CacheOptions{NumBlocks: 2})
	var qe *Error
	if !errors.As(err, &qe) || qe.Status != ErrOverlayUnitScales || !strings.Contains(qe.Message, "allow_unit_scales") {
		t.Fatalf("unit scales without AllowUnitScales: %v, want ErrOverlayUnitScales naming allow_unit_scales", err)
	}
	cache, err := NewCache(ctx, cfg, ov, CacheOptions{NumBlocks: 2, AllowUnitScales: true})
	if err != nil {
		t.Fatalf("unit scales with AllowUnitScales: %v", err)
	}
	cache.Close()
}

// validatedOverlay writes a pack of cfg's QSA layers with scales ks, vs over a one-file
// base checkpoint, loads it and validates it for cfg.
func validatedOverlay(t *testing.T, cfg *ModelConfig, ks, vs []float32) *Overlay {
	t.Helper()
	dir := t.TempDir()
	index := filepath.Join(dir, "model.safetensors.index.json")
	if err := os.WriteFile(index, []byte(`{"metadata": {}, "weight_map": {"w": "a.safetensors"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	pack := filepath.Join(dir, "pack")
	if err := WriteOverlay(pack, cfg.QSALayers(), ks, vs, index); err != nil {
		t.Fatal(err)
	}
	ov := must(LoadOverlay(filepath.Join(pack, "model-kvscales.safetensors"), ""))
	if err := ov.Validate(cfg, must(CheckpointRevision(dir))); err != nil {
		t.Fatal(err)
	}
	return ov
}
