// SPDX-License-Identifier: Apache-2.0
// Tensor-parallel consensus, the comparison every rank runs on the all-gathered records
// (compiled in from src/core: the NCCL part needs GPUs and is in test_calib_nccl.c).
// Each case breaks one thing on one rank of four and checks the verdict names it.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/overlay/overlay.hpp"
#include "core/tp_consensus.hpp"
#include "testutil.h"

namespace {

qsakv_model_config reference(int rank) {
  qsakv_model_config c;
  qsakv_model_config_preset(&c, "qwen4_exp");
  c.tp_size = 4;
  c.tp_rank = rank;
  return c;
}

qsakv_overlay make_overlay(const std::string& sha, bool validated) {
  qsakv_overlay o;
  o.scale_file_sha256 = sha;
  o.manifest.layer_prefix = "model.layers";
  o.validated = validated;
  return o;
}

const std::string kSha(64, 'a'), kOther(64, 'b');

std::vector<qsakv::RankRecord> records(void (*tweak)(int, qsakv_model_config&),
                                       const qsakv_overlay* ov[4]) {
  std::vector<qsakv::RankRecord> out;
  for (int r = 0; r < 4; ++r) {
    qsakv_model_config c = reference(r);
    if (tweak) tweak(r, c);
    out.push_back(qsakv::make_rank_record(c, ov[r], r, 4));
  }
  return out;
}

bool has(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

}  // namespace

static void test_agreement(void** state) {
  (void)state;
  const qsakv_overlay o = make_overlay(kSha, true);
  const qsakv_overlay* ov[4] = {&o, &o, &o, &o};
  assert_string_equal(qsakv::compare_rank_records(records(nullptr, ov)).c_str(), "");
  const qsakv_overlay* none[4] = {nullptr, nullptr, nullptr, nullptr};
  assert_string_equal(qsakv::compare_rank_records(records(nullptr, none)).c_str(), "");
}

static void test_config_field_differs(void** state) {
  (void)state;
  const qsakv_overlay o = make_overlay(kSha, true);
  const qsakv_overlay* ov[4] = {&o, &o, &o, &o};
  const std::string m = qsakv::compare_rank_records(records(
      [](int r, qsakv_model_config& c) {
        if (r == 2) c.block_size = 16;
      },
      ov));
  print_message("%s\n", m.c_str());
  assert_true(has(m, "config.block_size differs"));
  assert_true(has(m, "rank 2 has 16"));
  assert_true(has(m, "ranks 0, 1, 3 have 64"));
  const std::string d = qsakv::compare_rank_records(records(
      [](int r, qsakv_model_config& c) {
        if (r == 1) c.kv_dtype = QSAKV_DTYPE_FP16;
      },
      ov));
  assert_true(has(d, "config.kv_dtype differs") && has(d, "rank 1 has fp16") && has(d, "e4m3"));
  /* Ranks selecting on keys of other types pick other tokens. */
  const std::string k = qsakv::compare_rank_records(records(
      [](int r, qsakv_model_config& c) {
        if (r == 2) c.index_key_dtype = QSAKV_DTYPE_E4M3;
      },
      ov));
  assert_true(has(k, "config.index_key_dtype differs") && has(k, "rank 2 has e4m3") &&
              has(k, "ranks 0, 1, 3 have fp16"));
  /* A softmax scale one float step apart is a difference, and is shown as one. */
  const std::string s = qsakv::compare_rank_records(records(
      [](int r, qsakv_model_config& c) {
        c.softmax_scale = 0.0625f;
        if (r == 1) c.softmax_scale = std::nextafter(0.0625f, 1.0f);
      },
      ov));
  assert_true(has(s, "config.softmax_scale differs") && has(s, "rank 1 has 0.0625000075") &&
              has(s, "ranks 0, 2, 3 have 0.0625"));
  const std::string l = qsakv::compare_rank_records(records(
      [](int r, qsakv_model_config& c) {
        if (r == 3) c.qsa_layers[11] = 46;
      },
      ov));
  assert_true(has(l, "config.qsa_layers differs") && has(l, "rank 3"));
}

static void test_overlay_differs(void** state) {
  (void)state;
  const qsakv_overlay a = make_overlay(kSha, true), b = make_overlay(kOther, true);
  const qsakv_overlay* ov[4] = {&a, &b, &a, &a};
  const std::string m = qsakv::compare_rank_records(records(nullptr, ov));
  print_message("%s\n", m.c_str());
  assert_true(has(m, "the overlay differs"));
  assert_true(has(m, ("rank 1 has scale file sha256 " + kOther).c_str()));
  const qsakv_overlay* missing[4] = {&a, &a, nullptr, &a};
  const std::string n = qsakv::compare_rank_records(records(nullptr, missing));
  assert_true(has(n, "rank 2 has none"));
  const qsakv_overlay u = make_overlay(kSha, false);
  const qsakv_overlay* unvalidated[4] = {&a, &a, &a, &u};
  assert_true(has(qsakv::compare_rank_records(records(nullptr, unvalidated)),
                  "rank 3 has scale file sha256 "));
}

static void test_numbering(void** state) {
  (void)state;
  const qsakv_overlay* none[4] = {nullptr, nullptr, nullptr, nullptr};
  std::vector<qsakv::RankRecord> recs = records(nullptr, none);
  std::swap(recs[1].tp_rank, recs[2].tp_rank);  // ranks 1 and 2 think they are 2 and 1
  const std::string m = qsakv::compare_rank_records(recs);
  assert_true(has(m, "communicator rank 1 has tp_rank 2"));
  assert_true(has(m, "communicator rank 2 has tp_rank 1"));
  recs = records([](int, qsakv_model_config& c) { c.tp_size = 8; }, none);
  assert_true(has(qsakv::compare_rank_records(recs),
                  "the communicator has 4 ranks but rank 0 has tp_size 8"));
  recs = records(nullptr, none);
  recs[3].magic = 0;  // a rank of another library version
  assert_true(has(qsakv::compare_rank_records(recs), "rank 3 sent no consensus record"));
}

static void test_cpu_backend_refuses(void** state) {
  (void)state;
  qsakv_context* ctx = tu_context(QSAKV_BACKEND_CPU);
  qsakv_model_config c = reference(0);
  int fake_comm = 0;
  TU_EXPECT_STATUS(qsakv_tp_consensus(ctx, &c, nullptr, &fake_comm, nullptr),
                   QSAKV_ERROR_UNSUPPORTED);
  TU_EXPECT_STATUS(qsakv_tp_consensus(ctx, &c, nullptr, nullptr, nullptr),
                   QSAKV_ERROR_INVALID_ARGUMENT);
  qsakv_context_destroy(ctx);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_agreement),           cmocka_unit_test(test_config_field_differs),
      cmocka_unit_test(test_overlay_differs),     cmocka_unit_test(test_numbering),
      cmocka_unit_test(test_cpu_backend_refuses),
  };
  return cmocka_run_group_tests_name("tp_consensus", tests, NULL, NULL);
}
