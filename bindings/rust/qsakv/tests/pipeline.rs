//! The pipeline through the safe crate on the CPU backend (context, config, cache,
//! store, plan, select, sparse and dense attention) against an FP64 reference; errors
//! carrying status and message (handles freed on drop: tests/leaks.rs).
use qsakv::*;

fn to_half(x: f32) -> u16 {
    // Exact for the values used here (normal or zero).
    let u = x.to_bits();
    if u & 0x7fff_ffff == 0 {
        return (u >> 16) as u16;
    }
    let sign = (u >> 16) & 0x8000;
    let exp = ((u >> 23) & 0xff) as i32 - 127 + 15;
    (sign | ((exp as u32) << 10) | ((u >> 13) & 0x3ff)) as u16
}

fn from_half(h: u16) -> f64 {
    let e = ((h >> 10) & 0x1f) as i32;
    let m = (h & 0x3ff) as f64;
    let v = if e == 0 { m * 2f64.powi(-24) } else { (1024.0 + m) * 2f64.powi(e - 25) };
    if h & 0x8000 != 0 { -v } else { v }
}

/// The reference model at TP4 with an FP16 cache, sized for a few tokens.
fn small_fp16_config() -> Result<ModelConfig> {
    let mut cfg = ModelConfig::preset("qwen4_exp")?;
    cfg.tp_size = 4;
    cfg.kv_dtype = Dtype::QSAKV_DTYPE_FP16;
    cfg.max_batched_tokens = 8;
    cfg.max_requests = 2;
    cfg.max_model_len = 256;
    Ok(cfg)
}

#[test]
fn pipeline_matches_fp64_on_the_cpu_backend() -> Result<()> {
    pipeline(Dtype::QSAKV_DTYPE_FP16)
}

/// The same with E4M3 compressed index keys: keys of 0.5 are stored as scale 0.5 / 448
/// and codes 448, which select exactly as the FP16 keys do.
#[test]
fn pipeline_with_e4m3_index_keys() -> Result<()> {
    pipeline(Dtype::QSAKV_DTYPE_E4M3)
}

fn pipeline(index_key_dtype: Dtype) -> Result<()> {
    assert!(library_matches_bindings());
    let ctx = Context::new(Backend::QSAKV_BACKEND_CPU)?;
    assert_eq!(ctx.info()?.backend(), Backend::QSAKV_BACKEND_CPU);

    let mut cfg = small_fp16_config()?;
    cfg.index_key_dtype = index_key_dtype;
    let g = cfg.rank_geometry()?;
    let (d, h, l, hot, block) = (cfg.head_dim as usize, g.q_heads as usize, 37usize, 5usize, 1i32);
    assert_eq!(g.kv_heads, 1);

    let mut opts = CacheOptions::new()?;
    opts.num_blocks = 2;
    let cache = Cache::new(&ctx, &cfg, None, &opts)?;
    let layer = cfg.qsa_layers()[0];
    assert_eq!(cache.layout()?.index_key_dtype, index_key_dtype);

    // K is zero except at token `hot`; q = 1/16: score 1 at `hot`, 0 elsewhere.
    let mut k = vec![0u16; l * d];
    let mut v = vec![0u16; l * d];
    let q = vec![to_half(0.0625); h * d];
    let mut slots = vec![0i64; l];
    let mut cslots = Vec::new();
    let ratio = cfg.compress_ratio as usize;
    for t in 0..l {
        slots[t] = block as i64 * cfg.block_size as i64 + t as i64;
        for j in 0..d {
            v[t * d + j] = to_half(0.25 * ((t + j) % 8) as f32);
            if t == hot {
                k[t * d + j] = to_half(1.0);
            }
        }
        if t % ratio == ratio - 1 {
            cslots.push(slots[t]);
        }
    }
    let ck = vec![to_half(0.5); cslots.len() * cfg.index_head_dim as usize];
    let iq = vec![to_half(0.25); (cfg.index_num_heads * cfg.index_head_dim) as usize];

    let dk = DeviceBuffer::from_slice(&ctx, &k)?;
    let dv = DeviceBuffer::from_slice(&ctx, &v)?;
    let ds = DeviceBuffer::from_slice(&ctx, &slots)?;
    let dcs = DeviceBuffer::from_slice(&ctx, &cslots)?;
    let dck = DeviceBuffer::from_slice(&ctx, &ck)?;
    let diq = DeviceBuffer::from_slice(&ctx, &iq)?;
    let dq = DeviceBuffer::from_slice(&ctx, &q)?;
    let dbt = DeviceBuffer::from_slice(&ctx, &[block, -1])?;
    let mut dout = DeviceBuffer::new(&ctx, q.len() * 2)?;

    cache.store_kv(layer, &dk, &dv, &ds, l)?;
    cache.store_compressed_keys(layer, &dck, &dcs, cslots.len())?;
    let mut plan = Plan::new(&cache, 1, 1)?;
    let mut batch = plan.update(&[0, 1], &[l as i32], &dbt, 2)?;
    assert_eq!(batch.info()?.num_rows, 1);
    assert_eq!(batch.rows(), 1);
    batch.select_topk(layer, &diq)?;

    let e = std::f64::consts::E;
    for mode in [AttentionMode::QSAKV_ATTENTION_SPARSE, AttentionMode::QSAKV_ATTENTION_DENSE] {
        batch.attention(layer, mode, &dq, &mut dout)?;
        let out: Vec<u16> = dout.to_vec()?;
        let mut worst = 0f64;
        for hh in 0..h {
            for j in 0..d {
                let num: f64 = (0..l)
                    .map(|t| if t == hot { e } else { 1.0 } * 0.25 * ((t + j) % 8) as f64)
                    .sum();
                let want = num / (e + (l - 1) as f64);
                worst = worst.max((from_half(out[hh * d + j]) - want).abs());
            }
        }
        println!("{mode:?}: max |out - fp64| = {worst:.3e}");
        assert!(worst < 4e-3, "{mode:?}: max error {worst}");
    }

    // A buffer too small for the batch is refused before the call, naming it.
    let small = DeviceBuffer::new(&ctx, 8)?;
    let err = batch.attention(layer, AttentionMode::QSAKV_ATTENTION_DENSE, &small, &mut dout)
        .unwrap_err();
    assert_eq!(err.status(), Status::QSAKV_ERROR_INVALID_ARGUMENT);
    assert!(err.message().starts_with("q: needs"), "{err}");
    Ok(())
}

/// A selection that matters (the pipeline above sees fewer blocks than the top-k keeps):
/// 650 compressed keys of which the top-k keeps 512. The 138 blocks it must drop score 0
/// (their keys are -0.5: every head's q.k < 0, which the ReLU zeroes), the others score
/// above 0; V is 1 on the dropped blocks' tokens and 0 elsewhere and K is 0 (uniform
/// weights), so sparse attention must give 0 and dense attention 552 / 2600 (ratio 4).
#[test]
fn selection_drops_the_lowest_scoring_blocks() -> Result<()> {
    for index_key_dtype in [Dtype::QSAKV_DTYPE_FP16, Dtype::QSAKV_DTYPE_E4M3] {
        let ctx = Context::new(Backend::QSAKV_BACKEND_CPU)?;
        let mut cfg = small_fp16_config()?;
        cfg.max_model_len = 4096;
        cfg.index_key_dtype = index_key_dtype;
        let g = cfg.rank_geometry()?;
        let (d, h, ratio, bs) =
            (cfg.head_dim as usize, g.q_heads as usize, cfg.compress_ratio as usize, cfg.block_size as usize);
        let keep = g.topk_blocks as usize;
        let l = 2600usize;
        let n_blocks = l / ratio;
        assert_eq!(n_blocks * ratio, l, "no open group: the row attends to selected blocks only");
        let dropped = n_blocks - keep;
        assert!(dropped > 0 && 4 * dropped <= n_blocks, "{n_blocks} blocks, top-{keep}");
        let is_dropped = |b: usize| b % 4 == 1 && b < 4 * dropped;

        let pages = (l + bs - 1) / bs;
        let mut opts = CacheOptions::new()?;
        opts.num_blocks = pages as i64 + 1;
        let cache = Cache::new(&ctx, &cfg, None, &opts)?;
        let layer = cfg.qsa_layers()[0];
        let table: Vec<i32> = (1..=pages as i32).collect();
        let slot = |t: usize| (table[t / bs] as usize * bs + t % bs) as i64;

        let k = vec![0u16; l * d];
        let mut v = vec![0u16; l * d];
        for t in 0..l {
            if is_dropped(t / ratio) {
                v[t * d..(t + 1) * d].fill(to_half(1.0));
            }
        }
        let slots: Vec<i64> = (0..l).map(slot).collect();
        let cslots: Vec<i64> = (0..n_blocks).map(|b| slot(b * ratio + ratio - 1)).collect();
        let id = cfg.index_head_dim as usize;
        let mut ck = vec![0u16; n_blocks * id];
        for b in 0..n_blocks {
            ck[b * id..(b + 1) * id].fill(to_half(if is_dropped(b) { -0.5 } else { 0.5 }));
        }
        let iq = vec![to_half(0.25); (cfg.index_num_heads * cfg.index_head_dim) as usize];
        let q = vec![to_half(0.0625); h * d];

        cache.store_kv(layer, &DeviceBuffer::from_slice(&ctx, &k)?, &DeviceBuffer::from_slice(&ctx, &v)?,
                       &DeviceBuffer::from_slice(&ctx, &slots)?, l)?;
        cache.store_compressed_keys(layer, &DeviceBuffer::from_slice(&ctx, &ck)?,
                                    &DeviceBuffer::from_slice(&ctx, &cslots)?, n_blocks)?;
        let dbt = DeviceBuffer::from_slice(&ctx, &table)?;
        let diq = DeviceBuffer::from_slice(&ctx, &iq)?;
        let dq = DeviceBuffer::from_slice(&ctx, &q)?;
        let mut dout = DeviceBuffer::new(&ctx, q.len() * 2)?;
        let mut plan = Plan::new(&cache, 1, 1)?;
        let mut batch = plan.update(&[0, 1], &[l as i32], &dbt, pages as i32)?;
        batch.select_topk(layer, &diq)?;
        let dense_want = (ratio * dropped) as f64 / l as f64; // the dropped blocks' tokens
        for (mode, want) in [(AttentionMode::QSAKV_ATTENTION_SPARSE, 0.0),
                             (AttentionMode::QSAKV_ATTENTION_DENSE, dense_want)] {
            dout.upload(&vec![0x7E00u16; q.len()])?; // NaN: every output must be written
            batch.attention(layer, mode, &dq, &mut dout)?;
            let out: Vec<u16> = dout.to_vec()?;
            // (f64::max skips NaN: a NaN error counts as infinite.)
            let err = |o: u16| {
                let e = (from_half(o) - want).abs();
                if e.is_nan() { f64::INFINITY } else { e }
            };
            let worst = out.iter().map(|&o| err(o)).fold(0f64, f64::max);
            println!("{index_key_dtype:?} {mode:?}: want {want:.4}, max |out - want| = {worst:.3e}");
            assert!(worst < 1e-3, "{index_key_dtype:?} {mode:?}: max error {worst}");
        }
        // The raw variants with an engine-owned top-k array: the kept blocks' tokens, no
        // dropped one, then -1; sparse attention over it gives 0 again.
        let width = g.topk_width as usize;
        let topk_buf = DeviceBuffer::from_slice(&ctx, &vec![i32::MIN; width])?;
        dout.upload(&vec![0x7E00u16; q.len()])?;
        unsafe {
            batch.select_topk_raw(layer, diq.as_ptr(), topk_buf.as_ptr() as *mut i32, width as i64,
                                 std::ptr::null_mut())?;
            batch.attention_raw(layer, AttentionMode::QSAKV_ATTENTION_SPARSE, dq.as_ptr(),
                               topk_buf.as_ptr() as *const i32, width as i64, dout.as_ptr(),
                               std::ptr::null_mut())?;
        }
        let topk: Vec<i32> = topk_buf.to_vec()?;
        let kept: Vec<i32> = topk.iter().copied().filter(|&t| t >= 0).collect();
        assert_eq!(kept.len(), keep * ratio, "{index_key_dtype:?}: {} tokens selected", kept.len());
        assert!(kept.iter().all(|&t| (t as usize) < l && !is_dropped(t as usize / ratio)));
        assert!(topk[kept.len()..].iter().all(|&t| t == -1), "{index_key_dtype:?}: padding");
        let out: Vec<u16> = dout.to_vec()?;
        assert!(out.iter().all(|&o| from_half(o) == 0.0), "{index_key_dtype:?}: raw sparse output");
    }
    Ok(())
}

/// The wrappers of consensus (the CPU backend refuses it by status), a checkpoint's
/// config (the preset's geometry from a config.json) and a bare scale file.
#[test]
fn consensus_checkpoint_config_and_scale_file() -> Result<()> {
    let ctx = Context::new(Backend::QSAKV_BACKEND_CPU)?;
    let preset = ModelConfig::preset("qwen4_exp")?;
    let comm = 0x1234 as *mut std::os::raw::c_void; // never dereferenced: refused first
    let err = unsafe { tp_consensus(&ctx, &preset, None, comm, std::ptr::null_mut()) }.unwrap_err();
    assert_eq!(err.status(), Status::QSAKV_ERROR_UNSUPPORTED);

    let dir = std::env::temp_dir().join(format!("qsakv-rust-ckpt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        r#"{"num_hidden_layers": 48, "num_attention_heads": 24, "num_key_value_heads": 2,
            "head_dim": 256, "full_attention_interval": 4, "index_n_heads": 4,
            "index_head_dim": 128, "index_compress_ratio": 4, "index_topk": 2048}"#,
    )
    .unwrap();
    let cfg = ModelConfig::from_checkpoint(&dir)?;
    assert_eq!(cfg.qsa_layers(), preset.qsa_layers());
    assert_eq!((cfg.num_q_heads, cfg.head_dim, cfg.index_num_heads), (24, 256, 4));

    let index = dir.join("model.safetensors.index.json");
    std::fs::write(&index, r#"{"metadata": {}, "weight_map": {"w": "a.safetensors"}}"#).unwrap();
    Overlay::write(&dir.join("pack"), &[3, 7], &[0.5, 2.0], &[0.25, 1.0], &index)?;
    let (scales, sha) = Overlay::read_scale_file(&dir.join("pack/model-kvscales.safetensors"))?;
    assert_eq!(scales, vec![(3, 0.5, 0.25), (7, 2.0, 1.0)]);
    assert_eq!(sha.len(), 64);
    std::fs::remove_dir_all(&dir).unwrap();
    Ok(())
}

#[test]
fn errors_carry_status_and_message() {
    let err = ModelConfig::preset("no_such_preset").err().expect("an error");
    assert_eq!(err.status(), Status::QSAKV_ERROR_INVALID_ARGUMENT);
    assert_eq!(err.status_name(), "QSAKV_ERROR_INVALID_ARGUMENT");
    assert!(err.message().contains("no_such_preset"), "{err}");
    assert!(err.to_string().starts_with("QSAKV_ERROR_INVALID_ARGUMENT: "));
    // Copied and cleared in this thread.
    let left = unsafe { std::ffi::CStr::from_ptr(sys::qsakv_last_error()) };
    assert!(left.to_bytes().is_empty());

    let mut cfg = ModelConfig::preset("qwen4_exp").unwrap();
    cfg.head_dim = 100;
    let err = cfg.validate().unwrap_err();
    assert_eq!(err.status(), Status::QSAKV_ERROR_INVALID_CONFIG);
    assert!(err.message().contains("head_dim"), "{err}");

    let err = Overlay::load(std::path::Path::new("/nonexistent/qsakv"), None).err().expect("an error");
    assert_ne!(err.status(), Status::QSAKV_SUCCESS);
    assert!(!err.message().is_empty());

    // An E4M3 cache without an overlay is refused (fail closed).
    let ctx = Context::new(Backend::QSAKV_BACKEND_CPU).unwrap();
    let mut cfg = ModelConfig::preset("qwen4_exp").unwrap();
    cfg.tp_size = 4;
    let mut opts = CacheOptions::new().unwrap();
    opts.num_blocks = 2;
    let err = Cache::new(&ctx, &cfg, None, &opts).err().expect("an error");
    assert_ne!(err.status(), Status::QSAKV_SUCCESS);
    println!("E4M3 cache without overlay: {err}");
}

#[test]
fn errors_stay_in_their_thread() {
    // Raw calls, which leave the library's last error set (the safe wrappers copy and
    // clear it): each thread must then read its own failure's message, not the other's.
    fn fail_raw(preset: &str) -> String {
        let name = std::ffi::CString::new(preset).unwrap();
        let mut c: sys::qsakv_model_config = unsafe { std::mem::zeroed() };
        let status = unsafe { sys::qsakv_model_config_preset(&mut c, name.as_ptr()) };
        assert_eq!(status, Status::QSAKV_ERROR_INVALID_ARGUMENT);
        last_error()
    }
    fn last_error() -> String {
        unsafe { std::ffi::CStr::from_ptr(sys::qsakv_last_error()) }.to_string_lossy().into_owned()
    }
    assert!(fail_raw("in_the_main_thread").contains("in_the_main_thread"));
    // The other thread starts with no error of its own, then fails.
    let other = std::thread::spawn(|| (last_error(), fail_raw("in_another_thread")));
    let (theirs_before, theirs) = other.join().unwrap();
    assert!(theirs_before.is_empty(), "{theirs_before}");
    assert!(theirs.contains("in_another_thread"), "{theirs}");
    let mine = last_error();
    assert!(mine.contains("in_the_main_thread") && !mine.contains("in_another_thread"), "{mine}");
}

#[test]
fn plan_options_reach_the_library() -> Result<()> {
    let ctx = Context::new(Backend::QSAKV_BACKEND_CPU)?;
    let cfg = small_fp16_config()?;
    let mut opts = CacheOptions::new()?;
    opts.num_blocks = 2;
    let cache = Cache::new(&ctx, &cfg, None, &opts)?;
    let o = PlanOptions { max_rows: 4, max_requests: 2, num_splits: 5, multi_row_min_rows: 3 };
    let info = Plan::with_options(&cache, &o)?.info()?;
    assert_eq!((info.max_rows, info.max_requests, info.num_splits), (4, 2, 5));
    // The CPU backend has no grouped route: the rule in force is "never".
    assert_eq!(info.multi_row_min_rows, -1);
    let err = Plan::with_options(&cache, &PlanOptions { multi_row_min_rows: -2, ..o }).err().unwrap();
    assert_eq!(err.status(), Status::QSAKV_ERROR_INVALID_ARGUMENT);
    assert!(err.message().contains("multi_row_min_rows"), "{}", err.message());
    Ok(())
}

#[test]
fn index_key_dtype_config_layout_and_capacity() -> Result<()> {
    let cfg = ModelConfig::preset("qwen4_exp")?;
    assert_eq!(cfg.index_key_dtype, Dtype::QSAKV_DTYPE_FP16); // the default
    let mut e4 = small_fp16_config()?;
    e4.index_key_dtype = Dtype::QSAKV_DTYPE_E4M3;
    e4.validate()?;
    let mut bad = e4;
    bad.index_key_dtype = Dtype::QSAKV_DTYPE_BF16;
    let err = bad.validate().unwrap_err();
    assert_eq!(err.status(), Status::QSAKV_ERROR_INVALID_CONFIG);
    assert!(err.message().contains("index_key_dtype"), "{err}");

    // The reference preset's E4M3 page: 16 keys x 128 codes, then 16 FP32 scales.
    let ctx = Context::new(Backend::QSAKV_BACKEND_CPU)?;
    let mut opts = CacheOptions::new()?;
    opts.num_blocks = 4;
    let l = Cache::new(&ctx, &e4, None, &opts)?.layout()?;
    assert_eq!(l.index_key_dtype, Dtype::QSAKV_DTYPE_E4M3);
    assert_eq!((l.index_head_dim, l.compressed_keys_per_block), (128, 16));
    assert_eq!((l.compressed_stride_block, l.compressed_scales_offset), (2112, 2048));
    assert_eq!(l.compressed_bytes_per_layer, 4 * 2112);
    let f = Cache::new(&ctx, &small_fp16_config()?, None, &opts)?.layout()?;
    assert_eq!((f.compressed_stride_block, f.compressed_scales_offset), (4096, -1));

    // Capacity: 33 bytes per token per layer for the index keys; about 2x at TP4.
    let mut tp4 = ModelConfig::preset("qwen4_exp")?;
    tp4.tp_size = 4;
    tp4.index_key_dtype = Dtype::QSAKV_DTYPE_E4M3;
    let c = tp4.capacity_plan(40 << 30)?;
    assert_eq!((c.bytes_per_token, c.fp16_bytes_per_token), (6540, 13056));
    assert!(c.ideal_ratio >= 1.99, "ideal ratio {}", c.ideal_ratio);
    assert!(c.capacity_ratio >= 1.99, "capacity ratio {}", c.capacity_ratio);
    Ok(())
}

#[test]
fn enum_values_the_bindings_do_not_know_are_plain_values() {
    // A newer library may write an enum value these bindings do not name (into a struct
    // it fills, or as a status). The enums are newtypes over their integers, so such a
    // value is a value like any other (in a Rust enum it would be undefined behaviour):
    // it compares unequal to every named one and goes back to the library intact.
    let unknown = Dtype(99);
    for known in [Dtype::QSAKV_DTYPE_FP16, Dtype::QSAKV_DTYPE_BF16, Dtype::QSAKV_DTYPE_E4M3] {
        assert_ne!(unknown, known);
    }
    assert_eq!(unsafe { sys::qsakv_dtype_size(unknown) }, 0);
    let name = unsafe { std::ffi::CStr::from_ptr(sys::qsakv_dtype_name(unknown)) };
    assert_eq!(name.to_str().unwrap(), "invalid");
    assert_eq!(unsafe { sys::qsakv_dtype_size(Dtype::QSAKV_DTYPE_E4M3) }, 1);
    assert_ne!(Backend(7), Backend::QSAKV_BACKEND_CUDA);
    assert_eq!(Backend(7).0, 7);
}

#[test]
fn crate_version_equals_the_library_version() {
    // The library's version is CMakeLists.txt's project(VERSION): the one place.
    assert_eq!(env!("CARGO_PKG_VERSION"), version_string(), "bindings/rust/*/Cargo.toml version");
}

/// The bytes of a layer's three buffers (host memory on the CPU backend).
fn layer_bytes(cache: &Cache, layer: i32) -> Result<[Vec<u8>; 3]> {
    let l = cache.layout()?;
    let mut b: sys::qsakv_layer_buffers = unsafe { std::mem::zeroed() };
    b.struct_size = std::mem::size_of::<sys::qsakv_layer_buffers>();
    let status = unsafe { sys::qsakv_cache_get_layer_buffers(cache.as_ptr(), layer, &mut b) };
    assert_eq!(status, sys::qsakv_status::QSAKV_SUCCESS);
    let read = |p: *mut std::os::raw::c_void, n: u64| unsafe {
        std::slice::from_raw_parts(p as *const u8, n as usize).to_vec()
    };
    Ok([
        read(b.kv, l.kv_bytes_per_layer),
        read(b.ring_keys, l.ring_bytes_per_layer),
        read(b.compressed_keys, l.compressed_bytes_per_layer),
    ])
}

#[test]
fn store_step_equals_the_three_stores() -> Result<()> {
    let ctx = Context::new(Backend::QSAKV_BACKEND_CPU)?;
    let cfg = small_fp16_config()?;
    let mut opts = CacheOptions::new()?;
    opts.num_blocks = 4;
    let n = 8usize;
    let row = cfg.head_dim as usize; // one KV head at TP4
    let ihd = cfg.index_head_dim as usize;
    // Distinct inputs for every field, so that a swap of two shows.
    let half = |n: usize, a: f32, m: usize| -> Vec<u16> {
        (0..n).map(|i| to_half(a * (i % m) as f32)).collect()
    };
    let (k, v) = (half(n * row, 0.125, 13), half(n * row, -0.25, 11));
    let (ring_keys, ckeys) = (half(n * ihd, 0.25, 7), half(n * ihd, 0.5, 5));
    let slots: Vec<i64> = (0..n as i64).map(|t| 3 * t + 1).collect();
    let cslots: Vec<i64> = (0..n as i64).map(|t| 4 * t + 2).collect();
    let req: Vec<i32> = (0..n as i32).map(|t| t % 2).collect();
    let pos: Vec<i64> = (0..n as i64).map(|t| 10 + t / 2).collect();
    let up16 = |x: &Vec<u16>| DeviceBuffer::from_slice(&ctx, x);
    let (dk, dv, drk, dck) = (up16(&k)?, up16(&v)?, up16(&ring_keys)?, up16(&ckeys)?);
    let (ds, dcs) = (DeviceBuffer::from_slice(&ctx, &slots)?, DeviceBuffer::from_slice(&ctx, &cslots)?);
    let (dr, dp) = (DeviceBuffer::from_slice(&ctx, &req)?, DeviceBuffer::from_slice(&ctx, &pos)?);
    let layer = cfg.qsa_layers()[0];
    // Each part alone, then all three, against the separate stores.
    for parts in [1u32, 2, 4, 7] {
        let calls = Cache::new(&ctx, &cfg, None, &opts)?;
        let step = Cache::new(&ctx, &cfg, None, &opts)?;
        if parts & 1 != 0 {
            calls.store_kv(layer, &dk, &dv, &ds, n)?;
        }
        if parts & 2 != 0 {
            // The raw index-key store has no safe wrapper of its own: the C call.
            let status = unsafe {
                sys::qsakv_store_index_keys(calls.as_ptr(), layer, drk.as_ptr(),
                                            dr.as_ptr() as *const i32, dp.as_ptr() as *const i64,
                                            n as i64, std::ptr::null_mut())
            };
            assert_eq!(status, sys::qsakv_status::QSAKV_SUCCESS);
        }
        if parts & 4 != 0 {
            calls.store_compressed_keys(layer, &dck, &dcs, n)?;
        }
        step.store_step(layer, &StepStores {
            kv: (parts & 1 != 0).then(|| KvStore { k: &dk, v: &dv, slot_mapping: &ds, num_tokens: n }),
            index_keys: (parts & 2 != 0).then(|| IndexKeyStore {
                keys: &drk, request_slots: &dr, positions: &dp, num_keys: n }),
            compressed_keys: (parts & 4 != 0)
                .then(|| CompressedKeyStore { keys: &dck, slot_mapping: &dcs, num_keys: n }),
        })?;
        assert!(layer_bytes(&calls, layer)? == layer_bytes(&step, layer)?, "parts {parts}");
        // The same parts as the C API takes them, through store_step_raw (its stream
        // reaching the call: tests/passthrough.rs).
        let raw = Cache::new(&ctx, &cfg, None, &opts)?;
        let mut s: sys::qsakv_step_stores = unsafe { std::mem::zeroed() }; // sizes set by the call
        if parts & 1 != 0 {
            (s.k, s.v, s.kv_slot_mapping, s.num_tokens) =
                (dk.as_ptr(), dv.as_ptr(), ds.as_ptr() as *const i64, n as i64);
        }
        if parts & 2 != 0 {
            (s.index_keys, s.index_request_slots, s.index_positions, s.num_index_keys) =
                (drk.as_ptr(), dr.as_ptr() as *const i32, dp.as_ptr() as *const i64, n as i64);
        }
        if parts & 4 != 0 {
            (s.compressed_keys, s.compressed_slot_mapping, s.num_compressed_keys) =
                (dck.as_ptr(), dcs.as_ptr() as *const i64, n as i64);
        }
        unsafe { raw.store_step_raw(layer, &s, std::ptr::null_mut())? };
        assert!(layer_bytes(&calls, layer)? == layer_bytes(&raw, layer)?, "raw, parts {parts}");
    }
    // Nothing present: nothing to do.
    let cache = Cache::new(&ctx, &cfg, None, &opts)?;
    cache.store_step(layer, &StepStores::default())?;
    Ok(())
}

/// From the crate's review: a raw external top-k pointer made the library write through
/// any address from safe code, and a non-UTF-8 path was rewritten (U+FFFD) into another
/// file's name.
#[test]
fn safe_code_cannot_pass_raw_pointers_or_lose_path_bytes() -> Result<()> {
    let ctx = Context::new(Backend::QSAKV_BACKEND_CPU)?;
    let cfg = small_fp16_config()?;
    let mut opts = CacheOptions::new()?;
    opts.num_blocks = 4;
    let mut sink = [0i32; 4];
    opts.external_topk = sink.as_mut_ptr().cast();
    let err = Cache::new(&ctx, &cfg, None, &opts).err().expect("refused");
    assert_eq!(err.status(), Status::QSAKV_ERROR_INVALID_ARGUMENT);
    assert!(err.message().contains("options.external_topk"), "{}", err.message());
    opts.external_topk = std::ptr::null_mut();
    opts.struct_size += 8;
    let err = Cache::new(&ctx, &cfg, None, &opts).err().expect("refused");
    assert!(err.message().contains("options.struct_size"), "{}", err.message());
    opts.struct_size -= 8;
    Cache::new(&ctx, &cfg, None, &opts)?;

    use std::os::unix::ffi::OsStrExt;
    let dir = std::env::temp_dir().join(format!("qsakv-rust-bytes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let index = dir.join("model.safetensors.index.json");
    std::fs::write(&index, r#"{"weight_map": {"w": "a.safetensors"}}"#).unwrap();
    let odd = dir.join(std::ffi::OsStr::from_bytes(b"pack-\xff"));
    Overlay::write(&odd, &[3], &[0.5], &[0.25], &index)?;
    assert!(odd.join("qsakv-overlay.json").exists(), "written under its own name");
    assert!(!dir.join("pack-\u{fffd}").exists());
    assert_eq!(Overlay::read_scale_file(&odd.join("model-kvscales.safetensors"))?.0.len(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
    Ok(())
}

#[test]
fn counts_whose_byte_size_overflows_are_refused() -> Result<()> {
    // A count * row that wrapped around (release builds do not panic on it) would pass the
    // size check and the C call would read past the buffer.
    let ctx = Context::new(Backend::QSAKV_BACKEND_CPU)?;
    let cfg = small_fp16_config()?;
    let mut opts = CacheOptions::new()?;
    opts.num_blocks = 2;
    let cache = Cache::new(&ctx, &cfg, None, &opts)?;
    let layer = cfg.qsa_layers()[0];
    let buf = DeviceBuffer::new(&ctx, 4096)?;
    let row = cfg.rank_geometry()?.kv_heads as usize * cfg.head_dim as usize * 2;
    assert!(row.is_power_of_two());
    let wrapping = (usize::MAX / row + 1) * 2; // count * row wraps to exactly 0
    assert_eq!(wrapping.wrapping_mul(row), 0);
    for n in [wrapping, usize::MAX] {
        let err = cache.store_kv(layer, &buf, &buf, &buf, n).unwrap_err();
        assert_eq!(err.status(), Status::QSAKV_ERROR_INVALID_ARGUMENT);
        assert!(err.message().starts_with("k: "), "{err}");
        let err = cache.store_compressed_keys(layer, &buf, &buf, n).unwrap_err();
        assert_eq!(err.status(), Status::QSAKV_ERROR_INVALID_ARGUMENT, "{err}");
    }
    Ok(())
}

#[test]
fn buffers_of_another_context_are_refused() -> Result<()> {
    // Another context's memory may be on another GPU, where the kernel's access would be
    // a fault that poisons the CUDA context; the safe API takes its cache's context's.
    let ctx = Context::new(Backend::QSAKV_BACKEND_CPU)?;
    let other = Context::new(Backend::QSAKV_BACKEND_CPU)?;
    let cfg = small_fp16_config()?;
    let mut opts = CacheOptions::new()?;
    opts.num_blocks = 2;
    let cache = Cache::new(&ctx, &cfg, None, &opts)?;
    let layer = cfg.qsa_layers()[0];
    let mine = DeviceBuffer::new(&ctx, 1 << 16)?;
    let foreign = DeviceBuffer::new(&other, 1 << 16)?;
    cache.store_kv(layer, &mine, &mine, &DeviceBuffer::from_slice(&ctx, &[-1i64])?, 1)?;
    let err = cache.store_kv(layer, &mine, &foreign, &mine, 1).unwrap_err();
    assert_eq!(err.status(), Status::QSAKV_ERROR_INVALID_ARGUMENT);
    assert!(err.message().starts_with("v: a buffer of another context"), "{err}");
    let table = DeviceBuffer::from_slice(&other, &[1i32, -1])?;
    let mut plan = Plan::new(&cache, 1, 1)?;
    let err = plan.update(&[0, 1], &[5], &table, 2).unwrap_err();
    assert!(err.message().starts_with("block_table: a buffer of another context"), "{err}");
    Ok(())
}

#[test]
fn a_block_table_is_rewritten_between_steps() -> Result<()> {
    // The batch borrows its block table only while it runs: the engine rewrites the same
    // buffer for the next step. Blocks 1 and 2 hold V = 1 and V = 2 (K = 0: uniform
    // weights), so dense attention reads 1 through table [1] and 2 through table [2].
    let ctx = Context::new(Backend::QSAKV_BACKEND_CPU)?;
    let cfg = small_fp16_config()?;
    let g = cfg.rank_geometry()?;
    let (d, h, bs, l) = (cfg.head_dim as usize, g.q_heads as usize, cfg.block_size as usize, 5usize);
    let mut opts = CacheOptions::new()?;
    opts.num_blocks = 3;
    let cache = Cache::new(&ctx, &cfg, None, &opts)?;
    let layer = cfg.qsa_layers()[0];
    for (block, value) in [(1usize, 1.0f32), (2, 2.0)] {
        let slots: Vec<i64> = (0..l).map(|t| (block * bs + t) as i64).collect();
        cache.store_kv(layer, &DeviceBuffer::from_slice(&ctx, &vec![0u16; l * d])?,
                       &DeviceBuffer::from_slice(&ctx, &vec![to_half(value); l * d])?,
                       &DeviceBuffer::from_slice(&ctx, &slots)?, l)?;
    }
    let q = DeviceBuffer::from_slice(&ctx, &vec![to_half(0.0625); h * d])?;
    let mut out = DeviceBuffer::new(&ctx, h * d * 2)?;
    let mut table = DeviceBuffer::from_slice(&ctx, &[1i32])?;
    let mut plan = Plan::new(&cache, 1, 1)?;
    for (block, want) in [(1i32, 1.0f64), (2, 2.0), (1, 1.0)] {
        table.upload(&[block])?; // the previous step's batch is gone: the table is free
        let mut batch = plan.update(&[0, 1], &[l as i32], &table, 1)?;
        batch.attention(layer, AttentionMode::QSAKV_ATTENTION_DENSE, &q, &mut out)?;
        let got: Vec<u16> = out.to_vec()?;
        assert!(got.iter().all(|&o| from_half(o) == want), "table [{block}]: {}", from_half(got[0]));
    }
    // An engine-owned table through update_raw (here the buffer's own pointer).
    table.upload(&[2i32])?;
    let mut batch = unsafe {
        plan.update_raw(&[0, 1], &[l as i32], None, table.as_ptr() as *const i32, 1,
                        std::ptr::null_mut())?
    };
    batch.attention(layer, AttentionMode::QSAKV_ATTENTION_DENSE, &q, &mut out)?;
    let got: Vec<u16> = out.to_vec()?;
    assert!(got.iter().all(|&o| from_half(o) == 2.0), "update_raw: {}", from_half(got[0]));
    let err = unsafe { plan.update_raw(&[0], &[l as i32], None, table.as_ptr() as *const i32, 1,
                                       std::ptr::null_mut()) }.unwrap_err();
    assert!(err.message().starts_with("query_start: 1 entries for 1 requests"), "{err}");
    Ok(())
}

/// Each request's raw-ring slot reaches the library (update_raw and the safe
/// update_with_request_slots): a slot beyond max_requests is refused by the library, naming
/// the field; a list of the wrong length by the crate, before the call.
#[test]
fn request_slots_reach_the_library() -> Result<()> {
    let ctx = Context::new(Backend::QSAKV_BACKEND_CPU)?;
    let cfg = small_fp16_config()?; // max_requests 2
    let mut opts = CacheOptions::new()?;
    opts.num_blocks = 3;
    let cache = Cache::new(&ctx, &cfg, None, &opts)?;
    let table = DeviceBuffer::from_slice(&ctx, &[1i32, 2])?;
    let mut plan = Plan::new(&cache, 2, 2)?;
    let (qs, lens) = ([0, 1, 2], [5, 7]);
    assert_eq!(plan.update_with_request_slots(&qs, &lens, Some(&[1, 0]), &table, 1)?.rows(), 2);
    let err = plan.update_with_request_slots(&qs, &lens, Some(&[0, 2]), &table, 1).unwrap_err();
    assert_eq!(err.status(), Status::QSAKV_ERROR_INVALID_ARGUMENT);
    assert!(err.message().contains("batch.request_slots[1] is 2"), "{err}");
    let err = plan.update_with_request_slots(&qs, &lens, Some(&[0]), &table, 1).unwrap_err();
    assert!(err.message().starts_with("request_slots: 1 entries for 2 requests"), "{err}");
    let (t, none) = (table.as_ptr() as *const i32, std::ptr::null_mut());
    unsafe {
        plan.update_raw(&qs, &lens, Some(&[1, 1]), t, 1, none)?;
        let err = plan.update_raw(&qs, &lens, Some(&[-1, 0]), t, 1, none).unwrap_err();
        assert!(err.message().contains("batch.request_slots[0] is -1"), "{err}");
        let err = plan.update_raw(&qs, &lens, Some(&[0, 1, 1]), t, 1, none).unwrap_err();
        assert!(err.message().starts_with("request_slots: 3 entries for 2 requests"), "{err}");
    }
    plan.update(&qs, &lens, &table, 1)?; // None: request r in slot r
    Ok(())
}

/// Overlay::write_with_options records every field of qsakv_overlay_write_options in the
/// manifest (read back through the loaded overlay's info); Overlay::write none of them.
#[test]
fn overlay_write_options_reach_the_manifest() -> Result<()> {
    let dir = std::env::temp_dir().join(format!("qsakv-rust-write-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let index = dir.join("model.safetensors.index.json");
    std::fs::write(&index, r#"{"weight_map": {"w": "a.safetensors"}}"#).unwrap();
    let info = |pack: &str| -> Result<sys::qsakv_overlay_info> {
        Overlay::load(&dir.join(pack).join("model-kvscales.safetensors"), None)?.info()
    };
    Overlay::write(&dir.join("plain"), &[3], &[0.5], &[0.25], &index)?;
    let i = info("plain")?;
    assert_eq!((i.contract_tp_size, i.contract_speculative_tokens, i.contract_min_sm,
                i.unit_scale_control), (0, -1, 0, 0));
    assert_eq!(i.contract_activation_dtype, Dtype::QSAKV_DTYPE_INVALID);
    assert_eq!(unsafe { std::ffi::CStr::from_ptr(i.layer_prefix.as_ptr()) }.to_str().unwrap(),
               "model.layers");
    let opts = OverlayWriteOptions {
        layer_prefix: Some("model.language_model.layers".into()),
        contract_tp_size: 4,
        contract_speculative_tokens: 3,
        contract_activation_dtype: Dtype::QSAKV_DTYPE_BF16,
        contract_min_sm: 90,
        unit_scale_control: true,
    };
    Overlay::write_with_options(&dir.join("contract"), &[3, 7], &[1.0, 1.0], &[1.0, 1.0], &index,
                                &opts)?;
    let i = info("contract")?;
    assert_eq!((i.contract_tp_size, i.contract_speculative_tokens, i.contract_min_sm,
                i.unit_scale_control), (4, 3, 90, 1));
    assert_eq!(i.contract_activation_dtype, Dtype::QSAKV_DTYPE_BF16);
    assert_eq!(unsafe { std::ffi::CStr::from_ptr(i.layer_prefix.as_ptr()) }.to_str().unwrap(),
               "model.language_model.layers");
    // The library's checks still apply, and a prefix with a NUL byte is refused here.
    let bad = OverlayWriteOptions { contract_tp_size: -2, ..Default::default() };
    let err = Overlay::write_with_options(&dir.join("bad"), &[3], &[1.0], &[1.0], &index, &bad)
        .unwrap_err();
    assert!(err.message().contains("contract_tp_size"), "{err}");
    let nul = OverlayWriteOptions { layer_prefix: Some("a\0b".into()), ..Default::default() };
    let err = Overlay::write_with_options(&dir.join("nul"), &[3], &[1.0], &[1.0], &index, &nul)
        .unwrap_err();
    assert!(err.message().starts_with("layer_prefix: contains a NUL byte"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
    Ok(())
}
