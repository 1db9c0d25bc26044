// SPDX-License-Identifier: Apache-2.0
// The E4M3 codec header (shared by the CPU backend and the kernels) against the FP64
// oracle of testutil: every code decodes exactly; every FP16 input at several scales
// encodes bit-identically (FP32 division, RNE, saturation, NaN).
#include <cmath>
#include <cstring>

#include "e4m3.cuh"
#include "half_bits.cuh"
#include "testutil.h"

static void test_decode_all_codes(void** state) {
  (void)state;
  for (int c = 0; c < 256; ++c) {
    const float got = qsakv::e4m3::decode(static_cast<uint8_t>(c));
    const double want = tu_e4m3_value(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      assert_true(std::isnan(got));
      assert_int_equal(std::signbit(got), c >> 7);
    } else {
      if (static_cast<double>(got) != want) fail_msg("code 0x%02x: %.9g != %.9g", c, got, want);
      assert_int_equal(std::signbit(got), c >> 7);  // -0 stays -0
    }
  }
  assert_true(qsakv::e4m3::decode(0x7E) == 448.0f);
  assert_true(qsakv::e4m3::decode(0x01) == 0.001953125f);
}

static void test_encode_every_fp16_at_scales(void** state) {
  (void)state;
  const float scales[] = {1.0f, 0.5f, 1.0f / 448.0f, 0.0123f, 3.7f, 1e-3f, 100.0f, 2.0f / 3.0f};
  long mismatches = 0, checked = 0;
  for (float scale : scales) {
    for (uint32_t h = 0; h < 65536; ++h) {
      const float x = tu_fp16_to_f32(static_cast<uint16_t>(h));
      const float q = x / scale;  // FP32 division: the contract
      const uint8_t got = qsakv::e4m3::encode(q);
      const uint8_t want = tu_e4m3_encode(q);
      ++checked;
      if (got != want && !(std::isnan(q) && (got & 0x7F) == 0x7F && (want & 0x7F) == 0x7F)) {
        if (mismatches++ < 5)
          print_error("fp16 0x%04x / %g = %.9g: got 0x%02x want 0x%02x\n", h, scale, q, got, want);
      }
    }
  }
  assert_int_equal(checked, 8 * 65536);
  assert_int_equal(mismatches, 0);
}

static void test_encode_edges(void** state) {
  (void)state;
  using qsakv::e4m3::encode;
  assert_int_equal(encode(INFINITY), 0x7E);  // saturates
  assert_int_equal(encode(-INFINITY), 0xFE);
  assert_int_equal(encode(1e30f), 0x7E);
  assert_int_equal(encode(464.0f), 0x7E);      // would round to 480 (NaN): saturates
  assert_int_equal(encode(NAN) & 0x7F, 0x7F);  // NaN stays NaN
  assert_int_equal(encode(-0.0f), 0x80);
  assert_int_equal(encode(0.0f), 0x00);
  assert_int_equal(encode(0.0009765625f), 0x00);  // 2^-10: tie between 0 and 2^-9 -> even 0
  assert_int_equal(encode(0.0029296875f), 0x02);  // 1.5 * 2^-9: tie -> even code 2
  assert_int_equal(encode(1e-40f), 0x00);         // FP32 subnormal
  assert_int_equal(encode(1.0625f), 0x38);        // tie between 1 and 1.125 -> 1
  assert_int_equal(encode(1.1875f), 0x3A);        // tie between 1.125 and 1.25 -> 1.25
}

static void test_random_fp32_quotients(void** state) {
  (void)state;
  tu_seed();
  for (int i = 0; i < 200000; ++i) {
    const float q = static_cast<float>(tu_normal() * std::pow(2.0, tu_uniform(-14, 10)));
    assert_int_equal(qsakv::e4m3::encode(q), tu_e4m3_encode(q));
  }
}

static void test_half_bits_match_compiler(void** state) {
  (void)state;
  // The host FP16/BF16 helpers the CPU backend uses, against _Float16 and the test's BF16.
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = qsakv::halfbits::fp16_to_f32(static_cast<uint16_t>(h));
    const float b = tu_fp16_to_f32(static_cast<uint16_t>(h));
    assert_true((std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0);
  }
  for (int i = 0; i < 200000; ++i) {
    const float x = static_cast<float>(tu_normal() * std::pow(2.0, tu_uniform(-30, 20)));
    assert_int_equal(qsakv::halfbits::f32_to_fp16(x), tu_f32_to_fp16(x));
    assert_int_equal(qsakv::halfbits::f32_to_bf16(x), tu_f32_to_bf16(x));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decode_all_codes),
      cmocka_unit_test(test_encode_every_fp16_at_scales),
      cmocka_unit_test(test_encode_edges),
      cmocka_unit_test(test_random_fp32_quotients),
      cmocka_unit_test(test_half_bits_match_compiler),
  };
  return cmocka_run_group_tests_name("codec", tests, NULL, NULL);
}
