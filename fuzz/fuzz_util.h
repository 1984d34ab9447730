// Helpers shared by the fuzz targets (one libFuzzer executable per fuzz_*.cpp; docs/fuzzing.md).
//
// The rule every target checks: bad input may only ever be answered by a cemfrac::Error (the one
// clear line the CLI prints). Anything else is a finding and ends the run: an ASan/UBSan report, a
// crash, an exception of another type escaping (the CLI would print "internal error"), an
// allocation beyond libFuzzer's -malloc_limit_mb, a hang, or a broken invariant (FUZZ_REQUIRE).
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "cemfrac/core/check.h"

namespace cemfrac::fuzz {

// A private directory for the files a parser that only takes paths reads; removed at exit. Under
// /dev/shm when it exists, so the file round trip stays in memory. The string is never destroyed:
// the atexit handler that removes the directory runs after static destructors would have.
inline const std::string& scratch_dir() {
  static const std::string& dir = *new std::string([] {
    const char* base = std::getenv("CEMFRAC_FUZZ_TMP");
    std::string root =
        base && *base ? base : (std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : "/tmp");
    std::string pattern = root + "/cemfrac-fuzz-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror("cemfrac fuzz: mkdtemp");
      std::abort();
    }
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return pattern;
  }());
  return dir;
}

inline void write_bytes(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.good()) {
    std::fprintf(stderr, "cemfrac fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

// Runs f; a cemfrac::Error is the expected answer to bad input, so it is swallowed. Every other
// exception propagates and aborts the run as a finding. With CEMFRAC_FUZZ_ONE_LINE=1 an error whose
// message is empty or spans lines (input text quoted raw) is a finding too.
template <typename F>
void expect_clean(F&& f) {
  static const bool one_line = [] {
    const char* v = std::getenv("CEMFRAC_FUZZ_ONE_LINE");
    return v != nullptr && std::string_view(v) == "1";
  }();
  try {
    f();
  } catch (const cemfrac::Error& e) {
    const std::string_view what(e.what());
    if (one_line && (what.empty() || what.find('\n') != std::string_view::npos)) {
      std::fprintf(stderr, "cemfrac fuzz: error message is not one line: [%s]\n", e.what());
      std::abort();
    }
  }
}

}  // namespace cemfrac::fuzz

// An invariant of the code under test; prints the condition and aborts (a libFuzzer finding).
#define FUZZ_REQUIRE(cond)                                                                   \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)
