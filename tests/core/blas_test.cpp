// BLAS core choice: which OpenBLAS core a given set of CPU flags gets, and the sgemm check.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "cemfrac/core/blas.h"

namespace cemfrac {
namespace {

CpuFeatures cpu(const std::string& vendor, const std::string& flags) {
  return parse_cpu_features("vendor_id\t: " + vendor + "\nmodel name\t: test\nflags\t\t: " + flags +
                            "\n");
}

const char* kSse = "fpu sse sse2 ssse3 sse4_1 sse4_2 popcnt";
const std::string kAvx2 = std::string(kSse) + " avx f16c fma avx2 bmi2";
const std::string kAvx512 = kAvx2 + " avx512f avx512cd avx512bw avx512dq avx512vl";

TEST(BlasCore, ParsesCpuinfo) {
  auto c = parse_cpu_features(
      "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel Xeon\nflags\t\t: sse avx2\n\n"
      "processor\t: 1\nvendor_id\t: GenuineIntel\nflags\t\t: sse\n");
  EXPECT_EQ(c.vendor, "GenuineIntel");
  EXPECT_EQ(c.model_name, "Intel Xeon");
  EXPECT_EQ(c.flags.size(), 2u);  // first processor's flags only
  EXPECT_TRUE(c.flags.count("avx2"));
}

TEST(BlasCore, XeonWithAvx512GetsSkylakeX) {
  EXPECT_EQ(best_openblas_core(cpu("GenuineIntel", kAvx512)), "SkylakeX");
}

TEST(BlasCore, Avx512Bf16GetsCooperlake) {
  EXPECT_EQ(best_openblas_core(cpu("GenuineIntel", kAvx512 + " avx512_bf16")), "Cooperlake");
}

TEST(BlasCore, PartialAvx512IsNotEnough) {
  // Knights Landing style: avx512f and cd but no bw/dq/vl: SkylakeX kernels would fault.
  EXPECT_EQ(best_openblas_core(cpu("GenuineIntel", kAvx2 + " avx512f avx512cd")), "Haswell");
}

TEST(BlasCore, Avx2ByVendor) {
  EXPECT_EQ(best_openblas_core(cpu("GenuineIntel", kAvx2)), "Haswell");
  EXPECT_EQ(best_openblas_core(cpu("AuthenticAMD", kAvx2)), "Zen");
  EXPECT_EQ(best_openblas_core(cpu("AuthenticAMD", kAvx512)), "SkylakeX");  // Zen 4
}

TEST(BlasCore, OlderCpus) {
  EXPECT_EQ(best_openblas_core(cpu("GenuineIntel", std::string(kSse) + " avx")), "Sandybridge");
  EXPECT_EQ(best_openblas_core(cpu("GenuineIntel", kSse)), "Nehalem");
  EXPECT_EQ(best_openblas_core(cpu("GenuineIntel", "fpu sse sse2")), "Prescott");
  EXPECT_EQ(best_openblas_core(cpu("", "")), "Prescott");
}

TEST(BlasCore, RanksAndStepDown) {
  EXPECT_LT(openblas_core_rank("Prescott"), openblas_core_rank("Haswell"));
  EXPECT_EQ(openblas_core_rank("haswell"), openblas_core_rank("Zen"));
  EXPECT_LT(openblas_core_rank("Zen"), openblas_core_rank("SKYLAKEX"));
  EXPECT_EQ(openblas_core_rank("Pentium4000"), -1);
  const auto intel = cpu("GenuineIntel", kAvx512);
  const auto amd = cpu("AuthenticAMD", kAvx512);
  EXPECT_EQ(openblas_core_below("SkylakeX", intel), "Haswell");
  EXPECT_EQ(openblas_core_below("SkylakeX", amd), "Zen");
  EXPECT_EQ(openblas_core_below("Haswell", intel), "Sandybridge");
  EXPECT_EQ(openblas_core_below("Prescott", intel), "");
}

TEST(BlasCore, SgemmMatchesFloat64Reference) {
  EXPECT_LT(sgemm_check_error(), 1e-5);
  EXPECT_LT(sgemm_check_error(1, 1, 1), 1e-6);
}

// at::parallel_for is a header template: a library compiled without OpenMP runs every one of its
// kernels' parallel_for on the calling thread, and nothing else notices (the results are the same).
TEST(Threads, ParallelForOfTheLibraryUsesEveryIntraOpThread) {
  const int before = at::get_num_threads();
  set_threads(2);
  EXPECT_EQ(parallel_for_team(), 2);
  set_threads(1);
  EXPECT_EQ(parallel_for_team(), 1);
  set_threads(before);
}

// The build links OpenBLAS's OpenMP variant first when it is installed (cemfrac/CMakeLists.txt); if
// the loader picked the system pthreads build instead, its workers would compete with LibTorch's.
TEST(Threads, LoadsTheOpenBlasBuildTheLibraryWasLinkedFor) {
#ifdef CEMFRAC_EXPECT_BLAS_OPENMP
  EXPECT_EQ(blas_threading(), "OpenMP");
#else
  GTEST_SKIP() << CEMFRAC_BLAS_SKIP_REASON;
#endif
}

}  // namespace
}  // namespace cemfrac
