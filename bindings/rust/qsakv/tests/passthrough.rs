//! What the crate hands the C calls that take a stream: the CPU backend ignores streams, so
//! this test binary interposes `qsakv_store_step` and `qsakv_plan_update` (its own
//! definitions win over libqsakv's when linked), records their stream and batch, and
//! forwards to the library's (`dlsym(RTLD_NEXT)`). Its own binary, so that no other
//! test's calls go through the recorders. glibc only (RTLD_NEXT).
#![cfg(all(target_os = "linux", target_env = "gnu"))]
use qsakv::*;
use std::cell::RefCell;
use std::os::raw::{c_char, c_void};

extern "C" {
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
}
const RTLD_NEXT: *mut c_void = -1isize as *mut c_void;

#[derive(Debug, PartialEq)]
enum Call {
    StoreStep { stream: usize, num_tokens: i64 },
    PlanUpdate { stream: usize, request_slots: Option<Vec<i32>> },
}

thread_local! {
    static CALLS: RefCell<Vec<Call>> = const { RefCell::new(Vec::new()) };
}

fn calls() -> Vec<Call> {
    CALLS.with(|c| std::mem::take(&mut *c.borrow_mut()))
}

unsafe fn next(name: &[u8]) -> *mut c_void {
    let f = dlsym(RTLD_NEXT, name.as_ptr() as *const c_char);
    assert!(!f.is_null(), "the library's {}", String::from_utf8_lossy(name));
    f
}

/// Records, then the library's `qsakv_store_step`.
///
/// # Safety
/// As `qsakv_store_step`.
#[no_mangle]
pub unsafe extern "C" fn qsakv_store_step(
    cache: *mut sys::qsakv_cache,
    layer: i32,
    stores: *const sys::qsakv_step_stores,
    stream: sys::qsakv_stream_t,
) -> sys::qsakv_status {
    let num_tokens = if stores.is_null() { -1 } else { (*stores).num_tokens };
    CALLS.with(|c| c.borrow_mut().push(Call::StoreStep { stream: stream as usize, num_tokens }));
    type F = unsafe extern "C" fn(*mut sys::qsakv_cache, i32, *const sys::qsakv_step_stores,
                                  sys::qsakv_stream_t) -> sys::qsakv_status;
    std::mem::transmute::<*mut c_void, F>(next(b"qsakv_store_step\0"))(cache, layer, stores, stream)
}

/// Records, then the library's `qsakv_plan_update`.
///
/// # Safety
/// As `qsakv_plan_update`, with `batch` non-null.
#[no_mangle]
pub unsafe extern "C" fn qsakv_plan_update(
    plan: *mut sys::qsakv_plan,
    batch: *const sys::qsakv_batch,
    stream: sys::qsakv_stream_t,
) -> sys::qsakv_status {
    let b = &*batch;
    let request_slots = (!b.request_slots.is_null())
        .then(|| std::slice::from_raw_parts(b.request_slots, b.num_requests as usize).to_vec());
    CALLS.with(|c| c.borrow_mut().push(Call::PlanUpdate { stream: stream as usize, request_slots }));
    type F = unsafe extern "C" fn(*mut sys::qsakv_plan, *const sys::qsakv_batch,
                                  sys::qsakv_stream_t) -> sys::qsakv_status;
    std::mem::transmute::<*mut c_void, F>(next(b"qsakv_plan_update\0"))(plan, batch, stream)
}

/// A stream value the CPU backend ignores (the header: "ignored by the CPU backend"); it
/// only has to arrive.
const STREAM: usize = 0x5eed_0000;

#[test]
fn streams_and_request_slots_reach_the_c_calls() -> Result<()> {
    let ctx = Context::new(Backend::QSAKV_BACKEND_CPU)?;
    let mut cfg = ModelConfig::preset("qwen4_exp")?;
    cfg.tp_size = 4;
    cfg.kv_dtype = Dtype::QSAKV_DTYPE_FP16;
    cfg.max_batched_tokens = 8;
    cfg.max_requests = 2;
    cfg.max_model_len = 256;
    let mut opts = CacheOptions::new()?;
    opts.num_blocks = 3;
    let cache = Cache::new(&ctx, &cfg, None, &opts)?;
    let layer = cfg.qsa_layers()[0];
    let row = cfg.head_dim as usize;
    let kv = DeviceBuffer::from_slice(&ctx, &vec![0u16; 2 * row])?;
    let slots = DeviceBuffer::from_slice(&ctx, &[4i64, 5])?;
    calls();

    // store_step: the null stream; store_step_raw: the caller's.
    cache.store_step(layer, &StepStores {
        kv: Some(KvStore { k: &kv, v: &kv, slot_mapping: &slots, num_tokens: 2 }),
        ..Default::default()
    })?;
    let mut s: sys::qsakv_step_stores = unsafe { std::mem::zeroed() };
    (s.k, s.v, s.kv_slot_mapping, s.num_tokens) =
        (kv.as_ptr(), kv.as_ptr(), slots.as_ptr() as *const i64, 1);
    unsafe { cache.store_step_raw(layer, &s, STREAM as Stream)? };
    assert_eq!(calls(), vec![Call::StoreStep { stream: 0, num_tokens: 2 },
                             Call::StoreStep { stream: STREAM, num_tokens: 1 }]);

    // Plan updates: the safe ones on the null stream, update_raw on the caller's; request
    // slots as given, null by default.
    let table = DeviceBuffer::from_slice(&ctx, &[1i32, 2])?;
    let mut plan = Plan::new(&cache, 2, 2)?;
    let (qs, lens) = ([0, 1, 2], [5, 7]);
    plan.update(&qs, &lens, &table, 1)?;
    plan.update_with_request_slots(&qs, &lens, Some(&[1, 0]), &table, 1)?;
    unsafe {
        plan.update_raw(&qs, &lens, Some(&[0, 1]), table.as_ptr() as *const i32, 1,
                        STREAM as Stream)?;
        plan.update_raw(&qs, &lens, None, table.as_ptr() as *const i32, 1, STREAM as Stream)?;
    }
    assert_eq!(calls(), vec![
        Call::PlanUpdate { stream: 0, request_slots: None },
        Call::PlanUpdate { stream: 0, request_slots: Some(vec![1, 0]) },
        Call::PlanUpdate { stream: STREAM, request_slots: Some(vec![0, 1]) },
        Call::PlanUpdate { stream: STREAM, request_slots: None },
    ]);
    Ok(())
}
