// SPDX-License-Identifier: Apache-2.0
// The CUDA backend: device memory, staging fences, capability detection, launches.
// Every launch is asynchronous on the caller's stream; nothing here allocates or
// synchronises on the run path.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>

#include "core/backend.hpp"
#include "core/error.hpp"
#include "core/kernel_tier.hpp"
#include "cuda/launch.hpp"
#include "limits.hpp"
#include "core/nccl.hpp"

namespace qsakv {
namespace {

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear the sticky-free error state
  if (e == cudaErrorMemoryAllocation)
    fail(QSAKV_ERROR_OUT_OF_MEMORY, "%s: %s", what, cudaGetErrorString(e));
  fail(QSAKV_ERROR_CUDA, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

// Runs a call's launches (`what` names them in an error): a launch the kernels refuse
// (cuda::LaunchError: no kernel for the shape, a failed attribute call or launch) becomes
// the library's error with its status. The thread's last CUDA error is never read here: a
// successful call leaves an error the caller's own earlier runtime call left pending as it
// was, and a failed launch has cleared its own (dependent_launch.cuh).
template <class Launches>
void launching(const char* what, Launches&& launches) {
  try {
    launches();
  } catch (const cuda::LaunchError& e) {
    fail(e.status(), "%s: %s", what, e.what());
  }
}

void require_aligned(const void* p, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0)
    fail(QSAKV_ERROR_INVALID_ARGUMENT, "%s (%p) must be 16-byte aligned on the CUDA backend", what,
         p);
}

// Makes the context's device current for the duration of a call, restoring the caller's.
// The nothrow form, for the release paths (noexcept: a plan destroyed at process exit or
// after a device fault), makes a failure to switch a no-op. Either form clears the error of
// a call of its own that failed, so that none stays pending on the caller's thread.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) { enter(device, true); }
  DeviceGuard(int device, std::nothrow_t) noexcept { enter(device, false); }
  ~DeviceGuard() {
    if (previous_ >= 0 && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  void enter(int device, bool throwing) {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess) {
      (void)cudaGetLastError();
      current = -1;  // nothing to restore
    }
    if (current == device) return;
    const cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) {
      previous_ = current;
      return;
    }
    if (throwing) check(e, "cudaSetDevice");
    (void)cudaGetLastError();
  }
  int previous_ = -1;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, const cudaDeviceProp& prop, qsakv_decoder decoder, qsakv_kernel_tier tier,
              MmaChoice grouped_mma, MmaChoice select_mma, unsigned dependent_launch,
              bool compiled_for_sm90, bool select_score_only, SortChoice select_sort)
      : grouped_mma_(grouped_mma),
        select_mma_(select_mma == MmaChoice::kWgmma  ? cuda::SelectScorerMma::kWarpgroup
                    : select_mma == MmaChoice::kSync ? cuda::SelectScorerMma::kSync
                                                     : cuda::SelectScorerMma::kAuto),
        select_score_only_(select_score_only),
        // (On the SM70 tier the launcher sorts by runs whatever is asked: select.cu.)
        select_sort_(select_sort == SortChoice::kRuns      ? cuda::SelectSort::kRuns
                     : select_sort == SortChoice::kBuckets ? cuda::SelectSort::kBuckets
                                                           : cuda::SelectSort::kAuto) {
    info_.kind = QSAKV_BACKEND_CUDA;
    info_.device = device;
    info_.sm_version = prop.major * 10 + prop.minor;
    info_.multiprocessor_count = prop.multiProcessorCount;
    info_.has_fp8_conversion = info_.sm_version >= kSmFp8Convert;
    info_.device_memory_bytes = prop.totalGlobalMem;
    info_.device_name = prop.name;
    info_.decoder = decoder;
    info_.tier = tier;
    // The SM70 tier launches as on a V100, which has no programmatic launch; and only code
    // built for SM90+ has the waits that make it safe.
    if (info_.sm_version >= kSmProgrammaticLaunch && tier != QSAKV_KERNEL_TIER_SM70 &&
        compiled_for_sm90)
      programmatic_ = dependent_launch;
  }
  const BackendInfo& info() const override { return info_; }

  void* alloc(size_t bytes) override {
    DeviceGuard g(info_.device);
    void* p = nullptr;
    check(cudaMalloc(&p, bytes), "cudaMalloc");
    const cudaError_t e = cudaMemset(p, 0, bytes);
    if (e == cudaSuccess)
      check(cudaDeviceSynchronize(), "cudaMemset");
    else {
      if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
      check(e, "cudaMemset");
    }
    return p;
  }
  void release(void* ptr) noexcept override {
    DeviceGuard g(info_.device, std::nothrow);
    if (cudaFree(ptr) != cudaSuccess) (void)cudaGetLastError();
  }
  // On the context's device: cudaHostAlloc on a thread whose current device has no
  // context yet would create one there.
  void* alloc_host(size_t bytes) override {
    DeviceGuard g(info_.device);
    void* p = nullptr;
    check(cudaHostAlloc(&p, bytes, cudaHostAllocDefault), "cudaHostAlloc");
    return p;
  }
  void release_host(void* ptr) noexcept override {
    DeviceGuard g(info_.device, std::nothrow);
    if (cudaFreeHost(ptr) != cudaSuccess) (void)cudaGetLastError();
  }
  void copy(void* dst, const void* src, size_t bytes, qsakv_copy_kind kind,
            qsakv_stream_t stream) override {
    DeviceGuard g(info_.device);
    const cudaMemcpyKind k = kind == QSAKV_COPY_HOST_TO_DEVICE   ? cudaMemcpyHostToDevice
                             : kind == QSAKV_COPY_DEVICE_TO_HOST ? cudaMemcpyDeviceToHost
                                                                 : cudaMemcpyDeviceToDevice;
    check(cudaMemcpyAsync(dst, src, bytes, k, stream), "cudaMemcpyAsync");
  }
  void check_caller_memory(const void* p, uint64_t bytes, const char* what) const override {
    cudaPointerAttributes a;
    const cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
      cudaGetLastError();
      fail(QSAKV_ERROR_INVALID_ARGUMENT, "%s (%p) is not memory the CUDA runtime knows (%s)", what,
           p, cudaGetErrorName(e));
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
      fail(QSAKV_ERROR_INVALID_ARGUMENT,
           "%s (%p) is %s memory; the CUDA backend needs device "
           "(or managed) memory",
           what, p, a.type == cudaMemoryTypeHost ? "pinned host" : "host");
    if (a.type == cudaMemoryTypeDevice && a.device != info_.device)
      fail(QSAKV_ERROR_INVALID_ARGUMENT, "%s (%p) is on GPU %d; the context uses GPU %d", what, p,
           a.device, info_.device);
    (void)bytes;  // the runtime does not report an allocation's extent
  }
  // cudaErrorStreamCaptureImplicit: the legacy stream while a blocking stream of the
  // device is being captured (any mode, any thread), which work enqueued there would join.
  void require_not_capturing(qsakv_stream_t stream, const char* call) const override {
    DeviceGuard g(info_.device);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t e = cudaStreamIsCapturing(stream, &status);
    if (e == cudaErrorStreamCaptureImplicit) {
      cudaGetLastError();
      fail(QSAKV_ERROR_STATE,
           "%s on the legacy default stream while a blocking stream of the device is being "
           "captured: its work would join that capture; call it outside the capture",
           call);
    }
    check(e, "cudaStreamIsCapturing");
    if (status != cudaStreamCaptureStatusNone)
      fail(QSAKV_ERROR_STATE,
           "%s cannot be captured into a CUDA graph (stream %p is %s): a replay would repeat "
           "its work with this call's data; call it before capturing, and capture the calls "
           "that use its result",
           call, static_cast<void*>(stream),
           status == cudaStreamCaptureStatusActive ? "capturing" : "in an invalidated capture");
  }
  void synchronize(qsakv_stream_t stream) override {
    DeviceGuard g(info_.device);
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
  void* create_fence() override {
    DeviceGuard g(info_.device);
    cudaEvent_t e;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    return e;
  }
  void destroy_fence(void* fence) noexcept override {
    if (fence && cudaEventDestroy(static_cast<cudaEvent_t>(fence)) != cudaSuccess)
      (void)cudaGetLastError();
  }
  // On the context's device, as copy() is: with a NULL stream both then name that
  // device's legacy stream, whichever device the calling thread has current.
  void record_fence(void* fence, qsakv_stream_t stream) override {
    DeviceGuard g(info_.device);
    check(cudaEventRecord(static_cast<cudaEvent_t>(fence), stream), "cudaEventRecord");
  }
  void wait_fence(void* fence) override {
    DeviceGuard g(info_.device);
    check(cudaEventSynchronize(static_cast<cudaEvent_t>(fence)), "cudaEventSynchronize");
  }

  // As many splits as fit in one wave of two CTAs per multiprocessor without starting a
  // second, mostly empty one: groups * splits <= slots. Small batches split the token
  // list, large ones do not. At most one split per 128 list entries: two 16-token tiles
  // per warp, and fewer partials for the last CTA to merge. (E4M3 kernels fit three CTAs
  // per SM, but filling the third slot with more splits measured slower on an H200: 16
  // rows +14%, 64 rows +2%, 256 and 1024 rows +10-15% with 2-3 splits; docs/perf.md.)
  // Batches small enough for one CTA per SM with at least kOneCtaMinSplits splits take
  // that instead (tensor-core tier): there a call is a chain of dependent round trips per
  // CTA, a second CTA on an SM lengthens it, and the last CTA's merge grows with the
  // splits. Measured on an H200 (run 24): 16 rows 8 splits instead of 16, 21.7 -> 20.8 us
  // one call with L2 flushed; 32 rows, where one per SM leaves 4 splits, stays at 8 (4:
  // 27.4 us against 25.1).
  int choose_splits(int row_groups, int topk_width) const override {
    constexpr int kOneCtaMinSplits = 8;
    const int groups = std::max(1, row_groups);
    const int sms = info_.multiprocessor_count;
    int want = kAttentionCtasPerSm * sms / groups;
    if (!sm70_tier() && sms / groups >= kOneCtaMinSplits) want = sms / groups;
    const int cap = std::max(1, (topk_width + 127) / 128);
    return std::max(1, std::min(want, cap));
  }
  // The tensor-core tier only (the SM70 tier has no grouped kernels).
  int grouped_rows_per_group(int group_size, int head_dim) const override {
    return sm70_tier() ? 0 : cuda::grouped_rows_per_group(group_size, head_dim);
  }
  int grouped_max_items() const override { return kGroupedCtasPerSm * info_.multiprocessor_count; }
  size_t select_workspace_bytes(int max_rows, int64_t max_blocks) const override {
    return cuda::select_workspace_bytes(max_rows, max_blocks);
  }

  void store_kv(const StoreKvParams& p, qsakv_stream_t stream) override {
    require_aligned(p.k, "k");
    require_aligned(p.v, "v");
    DeviceGuard g(info_.device);
    launching("store_kv kernel launch", [&] {
      cuda::launch_store_kv(p, !sm70_tier(), programmatic(kDependentStore), stream);
    });
  }
  void store_ring(const StoreRowsParams& p, qsakv_stream_t stream) override {
    require_aligned(p.src, "keys");
    DeviceGuard g(info_.device);
    launching("store_index_keys kernel launch", [&] {
      cuda::launch_store_ring(p, info_.multiprocessor_count, programmatic(kDependentStore), stream);
    });
  }
  void store_compressed(const StoreCompressedParams& p, qsakv_stream_t stream) override {
    require_aligned(p.src, "keys");
    DeviceGuard g(info_.device);
    launching("store_compressed_keys kernel launch", [&] {
      cuda::launch_store_compressed(p, info_.multiprocessor_count, programmatic(kDependentStore),
                                    stream);
    });
  }
  void store_step(const StoreStepParams& p, qsakv_stream_t stream) override {
    if (p.has_kv) {
      require_aligned(p.kv.k, "stores.k");
      require_aligned(p.kv.v, "stores.v");
    }
    if (p.has_ring) require_aligned(p.ring.src, "stores.index_keys");
    if (p.has_compressed) require_aligned(p.compressed.src, "stores.compressed_keys");
    DeviceGuard g(info_.device);
    bool launched = false;
    launching("store_step kernel launch", [&] {
      launched = cuda::launch_store_step(p, !sm70_tier(), info_.multiprocessor_count,
                                         programmatic(kDependentStore), stream);
    });
    if (launched) return;
    // A K/V part too large for one launch's thread indices (a long prefill's): its own
    // launches, then the other parts together.
    store_kv(p.kv, stream);
    StoreStepParams rest = p;
    rest.has_kv = false;
    launching("store_step kernel launch", [&] {
      cuda::launch_store_step(rest, !sm70_tier(), info_.multiprocessor_count,
                              programmatic(kDependentStore), stream);
    });
  }
  void select_topk(const SelectParams& p, qsakv_stream_t stream) override {
    if (!cuda::select_supports(p.index_heads, p.index_dim, p.topk_blocks))
      fail(QSAKV_ERROR_UNSUPPORTED,
           "the CUDA selection supports 1..%d index heads, index_head_dim "
           "64, 128 or 256, and up to %d top-k blocks (got %d heads, dim %d, %d blocks); the "
           "CPU backend supports every valid config",
           kSelectMaxHeads, kSelectMaxTopkBlocks, p.index_heads, p.index_dim, p.topk_blocks);
    require_aligned(p.index_q, "index_q");
    DeviceGuard g(info_.device);
    // The selection launcher picks its kernels by SM version: the SM70 tier is SM 70.
    launching("select_topk kernel launch", [&] {
      cuda::launch_select_topk(p, sm70_tier() ? kSmSimtTier : info_.sm_version,
                               info_.multiprocessor_count, programmatic(kDependentSelect),
                               select_mma_, select_sort_, select_score_only_, stream);
    });
  }
  void attention(const AttentionParams& p, qsakv_stream_t stream) override {
    require_aligned(p.q, "q");
    require_aligned(p.out, "out");
    // Cache creation refuses such caches already; the launch keeps the same rule as its
    // own guard (kernel_tier.hpp).
    require_cuda_cache_dtype(info_.tier, info_.sm_version, p.cache.dtype);
    DeviceGuard g(info_.device);
    const bool hw = info_.decoder == QSAKV_DECODER_HARDWARE;
    // The warpgroup-MMA kernel (one CTA per SM) is the faster one for batches of at least
    // two waves of groups (H200, docs/perf.md run 30: 513 groups 7-9% faster than mma.sync
    // at f >= 0.75, 129 groups 0-3% slower, 32 groups ~15% slower); the choice is the
    // host's, from the last update, like the grouped launch itself.
    const bool wgmma = grouped_mma_ == MmaChoice::kWgmma ||
                       (grouped_mma_ == MmaChoice::kAuto &&
                        p.grouped.num_groups >= kGroupedCtasPerSm * info_.multiprocessor_count);
    launching("grouped attention kernel launch", [&] {
      cuda::launch_grouped_attention(p, hw, wgmma, programmatic(kDependentAttention), stream);
    });
    launching("attention kernel launch", [&] {
      cuda::launch_decode_attention(
          p, hw, sm70_tier(), info_.sm_version >= kSmCopyRing ? info_.multiprocessor_count : 0,
          programmatic(kDependentAttention), stream);
    });
  }
  void calib_observe(const CalibObserveParams& p, qsakv_stream_t stream) override {
    require_aligned(p.k, "k");
    require_aligned(p.v, "v");
    DeviceGuard g(info_.device);
    launching("calib_observe kernel launch",
              [&] { cuda::launch_calib_observe(p, info_.multiprocessor_count, stream); });
  }
  void calib_allreduce(uint64_t* words, size_t num_words, float* maxima, size_t num_maxima,
                       void* comm, int expected_size, int expected_rank,
                       qsakv_stream_t stream) override {
    DeviceGuard g(info_.device);
    nccl_allreduce_stats(words, num_words, maxima, num_maxima, comm, expected_size, expected_rank,
                         stream);
  }

 private:
  bool sm70_tier() const { return info_.tier == QSAKV_KERNEL_TIER_SM70; }
  // The grouped route's MMA: kSync, kWgmma (forced), or kAuto where both exist (the
  // warpgroup MMA for large batches of groups).
  MmaChoice grouped_mma_;
  // The multi-row scorer's MMA (QSAKV_SELECT_MMA): kSync where the warpgroup scorer is not
  // available, else as asked (kAuto: large prefill batches, select.cu).
  cuda::SelectScorerMma select_mma_;
  bool select_score_only_;        // QSAKV_SELECT_STAGES=score (kernel_tier.hpp)
  cuda::SelectSort select_sort_;  // QSAKV_SELECT_SORT (kernel_tier.hpp)
  // The kernel families (DependentLaunch bits) launched as programmatic dependents of the
  // stream's previous kernel: SM90+, not the SM70 tier, as QSAKV_DEPENDENT_LAUNCH says
  // (kernels/cuda/dependent_launch.cuh).
  unsigned programmatic_ = 0;
  bool programmatic(DependentLaunch family) const { return (programmatic_ & family) != 0; }
  BackendInfo info_;
};

}  // namespace

namespace {
// Why there is no usable GPU, in a sentence a user can act on; the CUDA error name stays
// in parentheses for searching. The runtime reports a machine without any NVIDIA driver
// as cudaErrorInsufficientDriver ("CUDA driver version is insufficient"), which reads as
// "update your driver": cudaDriverGetVersion tells the two apart (0: no driver).
std::string no_gpu_reason(cudaError_t e) {
  const std::string name = std::string(" (") + cudaGetErrorName(e) + ")";
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0)
    return "no NVIDIA driver found" + name;
  if (e == cudaErrorInsufficientDriver)
    return "the NVIDIA driver supports CUDA " + std::to_string(driver / 1000) + "." +
           std::to_string(driver % 1000 / 10) + "; this build's CUDA runtime needs " +
           std::to_string(CUDART_VERSION / 1000) + "." +
           std::to_string(CUDART_VERSION % 1000 / 10) + ": update the driver" + name;
  if (e == cudaErrorNoDevice) return "no NVIDIA GPU found" + name;
  return std::string("no usable CUDA GPU: ") + cudaGetErrorString(e) + name;
}
}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device, qsakv_decoder decoder,
                                           const KernelHooks& hooks, std::string* why) {
  const qsakv_kernel_tier forced = hooks.tier;
  const MmaChoice mma = hooks.grouped_mma;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    *why = e != cudaSuccess ? no_gpu_reason(e) : no_gpu_reason(cudaErrorNoDevice);
    cudaGetLastError();
    return nullptr;
  }
  if (device >= count)
    fail(QSAKV_ERROR_NO_DEVICE, "CUDA device %d does not exist; %d CUDA device(s)", device, count);
  cudaDeviceProp prop;
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  const int sm = prop.major * 10 + prop.minor;
  const qsakv_kernel_tier natural = default_cuda_tier(sm);
  if (natural == QSAKV_KERNEL_TIER_NONE) {
    *why = "GPU " + std::string(prop.name) + " is SM " + std::to_string(sm) +
           "; the CUDA kernels need SM70+";
    return nullptr;
  }
  // A forced tier may only go down: the SM70 tier uses nothing newer than SM70.
  if (forced == QSAKV_KERNEL_TIER_SM75 && sm < kSmTensorCoreTier)
    fail(QSAKV_ERROR_UNSUPPORTED,
         "%s=sm75 asks for the tensor-core kernels (SM75+); GPU %s is SM %d: unset it or use "
         "sm70",
         kCudaTierEnv, prop.name, sm);
  const qsakv_kernel_tier tier = forced != QSAKV_KERNEL_TIER_NONE ? forced : natural;
  if (decoder == QSAKV_DECODER_HARDWARE && sm < kSmFp8Convert)
    fail(QSAKV_ERROR_UNSUPPORTED,
         "the hardware E4M3 decoder needs SM89+; GPU %s is SM %d: "
         "use QSAKV_DECODER_SOFTWARE or AUTO",
         prop.name, sm);
  // The SM70 tier is the V100 code path: no FP8 instructions, whatever the GPU has.
  if (decoder == QSAKV_DECODER_HARDWARE && tier == QSAKV_KERNEL_TIER_SM70)
    fail(QSAKV_ERROR_UNSUPPORTED,
         "the hardware E4M3 decoder is not part of the SM70 kernel tier (%s=sm70): use "
         "QSAKV_DECODER_SOFTWARE or AUTO",
         kCudaTierEnv);
  const qsakv_decoder chosen =
      decoder == QSAKV_DECODER_AUTO
          ? (sm >= kSmFp8Convert && tier != QSAKV_KERNEL_TIER_SM70 ? QSAKV_DECODER_HARDWARE
                                                                   : QSAKV_DECODER_SOFTWARE)
          : decoder;
  // sm_90a code runs on SM 9.0 alone; the SM70 tier has no grouped route and no multi-row
  // scorer. A hook that forces a warpgroup-MMA kernel where it cannot run is refused.
  const auto warpgroup_available = [&](bool built, MmaChoice asked, const char* env,
                                       const char* what) {
    const bool available = built && sm == kSmWarpgroupMma && tier == QSAKV_KERNEL_TIER_SM75;
    if (!available && asked == MmaChoice::kWgmma)
      fail(QSAKV_ERROR_UNSUPPORTED,
           "%s=wgmma asks for %s, which needs an SM 9.0 GPU on the tensor-core tier and a build "
           "with sm_90a code (QSAKV_CUDA_ARCHS with 90); GPU %s is SM %d, the kernel tier is "
           "%s, this build %s sm_90a code",
           env, what, prop.name, sm, tier == QSAKV_KERNEL_TIER_SM70 ? "sm70" : "sm75",
           built ? "has" : "has no");
    return available;
  };
  const bool wgmma_available =
      warpgroup_available(cuda::grouped_warpgroup_mma_built(), mma, kGroupedMmaEnv,
                          "the grouped route's warpgroup-MMA kernel");
  const bool select_wgmma_available =
      warpgroup_available(cuda::select_warpgroup_mma_built(), hooks.select_mma, kSelectMmaEnv,
                          "the selection's warpgroup-MMA scorer");
  bool pdl_code = false;
  {
    DeviceGuard g(device);
    pdl_code = cuda::dependent_launch_compiled();
  }
  return std::make_unique<CudaBackend>(
      device, prop, chosen, tier, wgmma_available ? mma : MmaChoice::kSync,
      select_wgmma_available ? hooks.select_mma : MmaChoice::kSync, hooks.dependent_launch,
      pdl_code, hooks.select_score_only, hooks.select_sort);
}

}  // namespace qsakv
