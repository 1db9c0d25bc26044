// SPDX-License-Identifier: Apache-2.0
#include "core/nccl.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "core/error.hpp"

namespace qsakv {

namespace {

// From nccl.h (stable since NCCL 2.0; not included so that no NCCL header is needed to
// build): ncclResult_t is an int enum with ncclSuccess = 0; data types and operations.
using nccl_result = int;
constexpr int kNcclSuccess = 0;
constexpr int kNcclUint8 = 1;
constexpr int kNcclUint64 = 5;
constexpr int kNcclFloat32 = 7;
constexpr int kNcclSum = 0;
constexpr int kNcclMax = 2;

struct Nccl {
  nccl_result (*all_reduce)(const void*, void*, size_t, int, int, void*, void*) = nullptr;
  nccl_result (*all_gather)(const void*, void*, size_t, int, void*, void*) = nullptr;
  const char* (*error_string)(nccl_result) = nullptr;
  nccl_result (*comm_count)(const void*, int*) = nullptr;
  nccl_result (*comm_user_rank)(const void*, int*) = nullptr;
  std::string why;  // non-empty when loading failed
};

// QSAKV_NCCL_LIBRARY overrides the name (a path to a particular NCCL). A successful load
// is kept for the process and never unloaded (NCCL keeps threads and state alive); a
// failed one is retried at the next call, so fixing the environment needs no restart.
Nccl load_nccl() {
  Nccl n;
  const char* env = std::getenv("QSAKV_NCCL_LIBRARY");
  const std::string name = env && *env ? env : "libnccl.so.2";
  void* h = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = ::dlerror();
    n.why = "cannot load " + name + " (" + (e ? e : "unknown error") +
            "); install NCCL 2, add its directory to LD_LIBRARY_PATH or set QSAKV_NCCL_LIBRARY";
    return n;
  }
  const auto sym = [&](const char* s) -> void* {
    void* p = ::dlsym(h, s);
    if (!p && n.why.empty()) n.why = name + " lacks the symbol " + s;
    return p;
  };
  n.all_reduce = reinterpret_cast<decltype(n.all_reduce)>(sym("ncclAllReduce"));
  n.all_gather = reinterpret_cast<decltype(n.all_gather)>(sym("ncclAllGather"));
  n.error_string = reinterpret_cast<decltype(n.error_string)>(sym("ncclGetErrorString"));
  n.comm_count = reinterpret_cast<decltype(n.comm_count)>(sym("ncclCommCount"));
  n.comm_user_rank = reinterpret_cast<decltype(n.comm_user_rank)>(sym("ncclCommUserRank"));
  if (!n.why.empty()) ::dlclose(h);
  return n;
}

Nccl nccl() {
  static std::mutex mu;
  static Nccl loaded;
  std::lock_guard<std::mutex> lock(mu);
  if (loaded.why.empty() && loaded.all_reduce) return loaded;
  Nccl n = load_nccl();
  if (n.why.empty()) loaded = n;
  return n;
}

void check(const Nccl& n, nccl_result r, const char* what) {
  if (r != kNcclSuccess)
    fail(QSAKV_ERROR_NCCL, "%s failed: %s (ncclResult_t %d)", what, n.error_string(r), r);
}

}  // namespace

void nccl_allreduce_stats(uint64_t* words, size_t num_words, float* maxima, size_t num_maxima,
                          void* comm, int expected_size, int expected_rank, qsakv_stream_t stream) {
  const Nccl n = nccl();
  if (!n.why.empty()) fail(QSAKV_ERROR_NCCL, "NCCL is unavailable: %s", n.why.c_str());
  int size = 0, rank = -1;
  check(n, n.comm_count(comm, &size), "ncclCommCount");
  check(n, n.comm_user_rank(comm, &rank), "ncclCommUserRank");
  if (size != expected_size || rank != expected_rank)
    fail(QSAKV_ERROR_INVALID_ARGUMENT,
         "the NCCL communicator has %d rank(s) and this is rank "
         "%d; the calibration config is tp_size %d, tp_rank %d: pass the TP group's "
         "communicator",
         size, rank, expected_size, expected_rank);
  check(n, n.all_reduce(words, words, num_words, kNcclUint64, kNcclSum, comm, stream),
        "ncclAllReduce (sum of counts and histograms)");
  check(n, n.all_reduce(maxima, maxima, num_maxima, kNcclFloat32, kNcclMax, comm, stream),
        "ncclAllReduce (max of maxima)");
}

void nccl_comm_shape(void* comm, int* size, int* rank) {
  const Nccl n = nccl();
  if (!n.why.empty()) fail(QSAKV_ERROR_NCCL, "NCCL is unavailable: %s", n.why.c_str());
  check(n, n.comm_count(comm, size), "ncclCommCount");
  check(n, n.comm_user_rank(comm, rank), "ncclCommUserRank");
}

void nccl_allgather(const void* send, void* recv, size_t bytes, void* comm, qsakv_stream_t stream) {
  const Nccl n = nccl();
  if (!n.why.empty()) fail(QSAKV_ERROR_NCCL, "NCCL is unavailable: %s", n.why.c_str());
  check(n, n.all_gather(send, recv, bytes, kNcclUint8, comm, stream), "ncclAllGather");
}

}  // namespace qsakv
