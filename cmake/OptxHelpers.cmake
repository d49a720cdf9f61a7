# optx_add_op(): wires one op family from its own folder.
#
#   optx_add_op(<family>
#     SOURCES      generic sources (validate / plan / dispatch / reference / packing)
#     AVX2         sources built with AVX2+FMA flags
#     AVX512       sources built with AVX-512 F/BW/VL/DQ flags
#     AVX512_BF16  sources built with AVX-512 + BF16 flags
#     AMX          sources built with AVX-512 + BF16 + AMX-TILE/AMX-BF16 flags
#     TESTS        GoogleTest sources (one test binary per family)
#     TOOLS        verify / bench registrations, linked into the optx CLI)
#
# The family's C API binding and its test join SOURCES and TESTS by their names,
# <family>_c_api.cpp and <family>_c_api_test.cpp, where the folder has them.
function(optx_add_op family)
  cmake_parse_arguments(OP "" "" "SOURCES;AVX2;AVX512;AVX512_BF16;AMX;TESTS;TOOLS" ${ARGN})
  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${family}_c_api.cpp)
    list(APPEND OP_SOURCES ${family}_c_api.cpp)
  endif()
  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${family}_c_api_test.cpp)
    list(APPEND OP_TESTS ${family}_c_api_test.cpp)
  endif()
  target_sources(optx_generic PRIVATE ${OP_SOURCES})
  target_sources(optx_isa_avx2 PRIVATE ${OP_AVX2})
  target_sources(optx_isa_avx512 PRIVATE ${OP_AVX512})
  target_sources(optx_isa_avx512_bf16 PRIVATE ${OP_AVX512_BF16})
  target_sources(optx_isa_amx PRIVATE ${OP_AMX})
  foreach(f ${OP_TOOLS})
    set_property(GLOBAL APPEND PROPERTY OPTX_TOOL_SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/${f})
  endforeach()
  if(OPTX_BUILD_TESTS AND OP_TESTS)
    set(srcs)
    foreach(f ${OP_TESTS})
      list(APPEND srcs ${CMAKE_CURRENT_SOURCE_DIR}/${f})
    endforeach()
    set_property(GLOBAL APPEND PROPERTY OPTX_TEST_FAMILIES ${family})
    set_property(GLOBAL PROPERTY OPTX_TEST_SOURCES_${family} ${srcs})
  endif()
endfunction()

# Test binaries are created once the library exists (they link it).
function(optx_finalize_tests)
  get_property(families GLOBAL PROPERTY OPTX_TEST_FAMILIES)
  foreach(family ${families})
    get_property(srcs GLOBAL PROPERTY OPTX_TEST_SOURCES_${family})
    add_executable(optx_${family}_test ${srcs} ${PROJECT_SOURCE_DIR}/testing/test_isolation.cpp
                   ${PROJECT_SOURCE_DIR}/testing/alloc_count.cpp)
    target_link_libraries(optx_${family}_test PRIVATE optx_testing optx GTest::gtest_main)
    # Each binary runs every implementation the host can run against the reference; the
    # capped runs check dispatch itself picks and runs the lower ISA paths.
    add_test(NAME ${family} COMMAND optx_${family}_test)
    if(family STREQUAL "core")
      add_test(NAME core_thread_limit COMMAND optx_core_test --gtest_filter=*ThreadLimit*)
      set_tests_properties(core_thread_limit PROPERTIES ENVIRONMENT "OMP_THREAD_LIMIT=2")
      continue()
    endif()
    foreach(cap scalar avx2)
      add_test(NAME ${family}_max_isa_${cap} COMMAND optx_${family}_test --gtest_filter=*Dispatch*:*Selected*)
      set_tests_properties(${family}_max_isa_${cap} PROPERTIES ENVIRONMENT "OPTX_MAX_ISA=${cap}")
    endforeach()
  endforeach()
endfunction()
