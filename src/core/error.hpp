// SPDX-License-Identifier: Apache-2.0
// Errors inside the library: one exception type carrying a public status and a message
// a person can act on. Only src/api converts it (and every other exception) to a status.
#pragma once

#include <stdexcept>
#include <string>

#include "qsakv.h"

namespace qsakv {

class Error : public std::runtime_error {
 public:
  Error(qsakv_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  qsakv_status status() const noexcept { return status_; }

 private:
  qsakv_status status_;
};

// printf-style formatting into a std::string.
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Throws Error(status, formatted message).
[[noreturn]] void fail(qsakv_status status, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));

}  // namespace qsakv
