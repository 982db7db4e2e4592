// A stand-alone fuzz driver for compilers without libFuzzer (g++): mutates the target's
// seeds with a seeded generator for a bounded number of runs.
//   fuzz_<target> [runs] [seed]
// An input that breaks a property is printed in hex before the target aborts; a run
// reproduces from its seed.
#include <random>

#define FUZZ_DRIVER
#include "fuzz.hpp"

namespace {

std::string current;  // the input being run

const char* const interesting =
    "0123456789abcdefABCDEF-_=' \\\"%@:/?&[]#.\t\n\x01\x7f\xc2\xa9\xe0\xa0\x80\xed\xa0\x80"
    "\xf0\x9f\x98\x80\xf4\x90\x80\x80\xc0\xaf\xff";

std::string mutate(std::string s, std::mt19937_64& rng) {
  const std::string alphabet(interesting, std::char_traits<char>::length(interesting));
  const int steps = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < steps; ++i) {
    const std::size_t at = s.empty() ? 0 : rng() % (s.size() + 1);
    const char c =
        rng() % 4 == 0 ? static_cast<char>(rng() % 256) : alphabet[rng() % alphabet.size()];
    switch (rng() % 6) {
      case 0:
        s.insert(s.begin() + static_cast<std::ptrdiff_t>(at), c);
        break;
      case 1:
        if (at < s.size()) s.erase(at, 1);
        break;
      case 2:
        if (at < s.size()) s[at] = c;
        break;
      case 3:
        s.resize(at);
        break;
      case 4:
        s += s.substr(at, 8);
        break;
      default:
        s.insert(at, std::string(1 + rng() % 3, c));
        break;
    }
    if (s.size() > 512) s.resize(512);
  }
  return s;
}

}  // namespace

void fuzz_print_input() {
  static const char digits[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : current) {
    hex += digits[c >> 4];
    hex += digits[c & 15];
  }
  std::fprintf(stderr, "failing input (hex): %s\n", hex.c_str());
}

int main(int argc, char** argv) {
  const long runs = argc > 1 ? std::strtol(argv[1], nullptr, 10) : 100000;
  const unsigned long long seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1;
  std::mt19937_64 rng(seed);
  const std::vector<std::string>& seeds = fuzz_seeds();
  for (long run = 0; run < runs; ++run) {
    // Each seed once as it is, then mutations of them.
    current = run < static_cast<long>(seeds.size()) ? seeds[static_cast<std::size_t>(run)]
                                                    : mutate(seeds[rng() % seeds.size()], rng);
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(current.data()), current.size());
  }
  std::printf("%ld runs, seed %llu: no property failed\n", runs, seed);
  return 0;
}
