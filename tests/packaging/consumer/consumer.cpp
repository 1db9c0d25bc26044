// SPDX-License-Identifier: Apache-2.0
// An out-of-tree C++ consumer of an installed libqsakv through find_package(qsakv) and
// the target qsakv::qsakv, using the installed qsakv.hpp. Prints "consumer ok".
#include <cstdio>
#include <cstring>

#include <qsakv.hpp>

int main() {
  if (!qsakv::library_matches_header()) return 1;
  qsakv::Context ctx(QSAKV_BACKEND_CPU);
  auto cfg = qsakv::ModelConfig::preset("qwen4_exp");
  cfg.tp_size = 4;
  const auto cap = qsakv::capacity_plan(cfg, 40ull << 30);
  try {
    qsakv::ModelConfig::preset("nope");
    return 2;
  } catch (const qsakv::Error& e) {
    if (e.status() != QSAKV_ERROR_INVALID_ARGUMENT) return 3;
  }
  std::printf("consumer ok: libqsakv %s (C++), %lld tokens\n", qsakv::version_string().c_str(),
              (long long)cap.num_tokens);
  return 0;
}
