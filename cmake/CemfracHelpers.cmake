# Shared helpers: warning flags for our own targets only, the torch precompiled header, test registration.

function(cemfrac_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
endfunction()

# Every target that includes torch reuses the library's precompiled header, so the heavy headers are
# parsed once per build directory. Targets that reuse it must keep the library's compile flags.
function(cemfrac_use_pch target)
  if(CEMFRAC_USE_PCH)
    target_precompile_headers(${target} REUSE_FROM cemfrac_lib)
    cemfrac_pch_only_where_torch(${target})
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

# The precompiled header holds the torch headers only. A file that never reaches a torch header (the
# data, tokenizer, config and compare code, many CLI tests) compiles 2-3x faster without it: loading
# the 400 MB header and emitting its inline functions costs more than such a file's own parsing
# (measured in docs/history/foundation.md, "CI cost"). _cemfrac_reaches_torch follows the file's quoted includes
# through the source tree and answers whether any of them, or the file itself, includes torch, ATen or
# c10. It only decides speed: a file that is misjudged still compiles correctly either way.
function(_cemfrac_reaches_torch file out)
  get_property(known GLOBAL PROPERTY "_cemfrac_torch:${file}" SET)
  if(known)
    get_property(answer GLOBAL PROPERTY "_cemfrac_torch:${file}")
    set(${out} ${answer} PARENT_SCOPE)
    return()
  endif()
  set_property(GLOBAL PROPERTY "_cemfrac_torch:${file}" OFF)  # breaks include cycles
  set(answer OFF)
  if(EXISTS "${file}")
    file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
    get_filename_component(dir "${file}" DIRECTORY)
    foreach(line IN LISTS lines)
      if(line MATCHES "#[ \t]*include[ \t]*<(torch|ATen|c10)/")
        set(answer ON)
        break()
      elseif(line MATCHES "#[ \t]*include[ \t]*\"([^\"]+)\"")
        set(inc "${CMAKE_MATCH_1}")
        set(next "")
        if(EXISTS "${dir}/${inc}")
          set(next "${dir}/${inc}")
        elseif(EXISTS "${PROJECT_SOURCE_DIR}/${inc}")
          set(next "${PROJECT_SOURCE_DIR}/${inc}")
        endif()
        if(next)
          get_filename_component(next "${next}" ABSOLUTE)
          _cemfrac_reaches_torch("${next}" sub)
          if(sub)
            set(answer ON)
            break()
          endif()
        endif()
      endif()
    endforeach()
  endif()
  set_property(GLOBAL PROPERTY "_cemfrac_torch:${file}" ${answer})
  set(${out} ${answer} PARENT_SCOPE)
endfunction()

# Marks the target's C++ sources that never reach a torch header SKIP_PRECOMPILE_HEADERS. Call it in
# the directory that creates the target (source file properties are per directory).
function(cemfrac_pch_only_where_torch target)
  if(NOT CEMFRAC_USE_PCH)
    return()
  endif()
  get_target_property(sources ${target} SOURCES)
  get_target_property(source_dir ${target} SOURCE_DIR)
  set(skipped 0)
  foreach(src IN LISTS sources)
    if(NOT src MATCHES "\\.(cpp|cc|cxx)$")
      continue()
    endif()
    get_filename_component(abs "${src}" ABSOLUTE BASE_DIR "${source_dir}")
    _cemfrac_reaches_torch("${abs}" uses_torch)
    if(NOT uses_torch)
      set_source_files_properties("${src}" PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
      math(EXPR skipped "${skipped} + 1")
    endif()
  endforeach()
  set_property(GLOBAL APPEND PROPERTY CEMFRAC_NO_PCH_COUNT "${target}:${skipped}")
endfunction()
