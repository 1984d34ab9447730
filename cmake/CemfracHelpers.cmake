# Shared helpers: warning flags for our own targets only, the torch precompiled header, test registration.

function(cemfrac_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
endfunction()

# Every target that includes torch reuses the library's precompiled header, so the heavy headers are
# parsed once per build directory. Targets that reuse it must keep the library's compile flags.
function(cemfrac_use_pch target)
  if(CEMFRAC_USE_PCH)
    target_precompile_headers(${target} REUSE_FROM cemfrac_lib)
  endif()
endfunction()

# cemfrac_add_test(NAME name SOURCES a.cpp b.cpp LABELS unit ...): one executable from the sources,
# each of its gtest tests a ctest test of its own.
function(cemfrac_add_test)
  cmake_parse_arguments(T "" "NAME" "SOURCES;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE cemfrac_test_main)
  cemfrac_warnings(${T_NAME})
  cemfrac_use_pch(${T_NAME})
  gtest_discover_tests(${T_NAME}
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}
    PROPERTIES LABELS "${T_LABELS}"
    DISCOVERY_TIMEOUT 120)
endfunction()
