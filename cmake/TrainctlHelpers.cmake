# Small helpers shared by every component's CMakeLists.txt.

# Warnings for our own code (never for generated code).
function(trainctl_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  # Clang checks the locking annotations (ABSL_GUARDED_BY, ...) that GCC
  # ignores: a violation fails the build (the sanitizer build uses clang).
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    target_compile_options(${target} PRIVATE -Wthread-safety -Werror=thread-safety)
  endif()
endfunction()

# trainctl_test(NAME name SOURCES a_test.cc ... LIBS lib ... [LABELS l ...] [TIMEOUT s] [ARGS arg ...])
# One executable per *_test.cc, linked with GoogleTest's main, registered with CTest.
function(trainctl_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;LIBS;LABELS;ARGS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  # A test's files keep their own file-local helpers (TRAINCTL_UNITY).
  set_target_properties(${T_NAME} PROPERTIES UNITY_BUILD OFF)
  target_link_libraries(${T_NAME} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  trainctl_warnings(${T_NAME})
  add_test(NAME ${T_NAME} COMMAND ${T_NAME} ${T_ARGS})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set_tests_properties(${T_NAME} PROPERTIES TIMEOUT ${T_TIMEOUT}
    ENVIRONMENT "TRAINCTL_SOURCE_DIR=${PROJECT_SOURCE_DIR};TRAINCTL_BINARY_DIR=${PROJECT_BINARY_DIR}")
  if(T_LABELS)
    set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()
