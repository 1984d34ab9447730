# CEMFRAC_BUILD_FUZZ=ON: everything this build directory compiles (the library and the fuzz targets)
# gets AddressSanitizer, UndefinedBehaviorSanitizer (every finding aborts, so libFuzzer reports it)
# and libFuzzer's coverage instrumentation. LibTorch, fmt and PCRE2 stay as Debian built them
# (uninstrumented, same libstdc++ ABI). The fuzz targets themselves link -fsanitize=fuzzer (fuzz/).
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  message(FATAL_ERROR "CEMFRAC_BUILD_FUZZ needs clang (libFuzzer): configure with "
                      "-DCMAKE_CXX_COMPILER=clang++ in a build directory of its own (scripts/fuzz.sh)")
endif()
set(CEMFRAC_SANITIZE_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)
add_compile_options(${CEMFRAC_SANITIZE_FLAGS} -fsanitize=fuzzer-no-link -g)
add_link_options(-fsanitize=address,undefined)
message(STATUS "cemfrac: fuzz build (ASan + UBSan + libFuzzer coverage on every target)")
