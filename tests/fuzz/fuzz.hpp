// The fuzz targets' common shape. Each target defines LLVMFuzzerTestOneInput (the libFuzzer
// entry point, so a clang build can link one with -fsanitize=fuzzer) and fuzz_seeds(), the
// inputs the stand-alone driver (driver.cpp, any compiler) mutates. A target aborts
// (FUZZ_CHECK) when a property fails; the sanitizers abort on memory and UB errors.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);
const std::vector<std::string>& fuzz_seeds();
// Prints the input being run (the stand-alone driver defines it; under libFuzzer, which
// saves a failing input itself, this weak default does nothing).
void fuzz_print_input();
#ifndef FUZZ_DRIVER
__attribute__((weak)) void fuzz_print_input() {}
#endif

// A heap copy of exactly `size` bytes (one byte when empty), so that ASan sees any read
// past the end of the input.
inline std::unique_ptr<char[]> exact_copy(const std::uint8_t* data, std::size_t size) {
  std::unique_ptr<char[]> copy(new char[size == 0 ? 1 : size]);
  std::copy(data, data + size, copy.get());
  return copy;
}

#define FUZZ_CHECK(condition)                                                               \
  do {                                                                                      \
    if (!(condition)) {                                                                     \
      std::fprintf(stderr, "%s:%d: property failed: %s\n", __FILE__, __LINE__, #condition); \
      fuzz_print_input();                                                                   \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)
