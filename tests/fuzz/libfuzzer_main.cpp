// The libFuzzer driver of one target (FSDPSIM_FUZZ_TARGET, set per program by CMake). InputError is
// a normal outcome; any other exception is reported with its message and aborts, which libFuzzer
// records as a crash (with the input that caused it saved as crash-<sha1>).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <typeinfo>

#include "common/errors.h"
#include "tests/fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const fsdpsim::fuzz::Target* target = fsdpsim::fuzz::find_target(FSDPSIM_FUZZ_TARGET);
  if (!target) {
    std::fprintf(stderr, "fuzz: unknown target %s\n", FSDPSIM_FUZZ_TARGET);
    std::abort();
  }
  const std::string input(reinterpret_cast<const char*>(data), size);
  try {
    target->run(input);
  } catch (const fsdpsim::InputError&) {
    // the reader rejected the input with a message naming the field: the expected outcome
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz %s: FINDING: an exception other than InputError escaped (%s): %s\n", target->name,
                 typeid(e).name(), e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "fuzz %s: FINDING: a non-std exception escaped\n", target->name);
    std::abort();
  }
  return 0;
}
