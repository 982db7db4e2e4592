// Shared helpers of the GoogleTest suite.
#pragma once

#include <gtest/gtest.h>

#include "stockade/errors.hpp"

// Asserts that `statement` throws stockade::Error with `expected_code`.
#define EXPECT_STOCKADE_ERROR(statement, expected_code)                             \
  do {                                                                              \
    try {                                                                           \
      statement;                                                                    \
      ADD_FAILURE() << "expected " << ::stockade::error_code_name(expected_code)    \
                    << ", nothing was thrown";                                      \
    } catch (const ::stockade::Error& e_) {                                         \
      EXPECT_EQ(e_.code(), expected_code)                                           \
          << "got " << ::stockade::error_code_name(e_.code()) << ": " << e_.what(); \
    }                                                                               \
  } while (0)
