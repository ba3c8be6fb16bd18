# Test registration helpers.
#
# distckpt_add_unit_test(NAME SOURCES...)  : a GoogleTest binary run directly.
# distckpt_add_mpi_test(NAME SOURCES... NP n1 n2 ...)
#   : one GoogleTest binary (with an MPI main) registered once per rank count as
#     NAME.npN under `mpirun -np N`, with PROCESSORS, TIMEOUT and LABELS set.

set(DISTCKPT_MPIEXEC_FLAGS --allow-run-as-root --oversubscribe --bind-to none
    CACHE STRING "Extra flags for mpirun in tests")

function(distckpt_add_unit_test name)
  add_executable(${name} ${ARGN})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_BINARY_DIR}/proto)
  target_link_libraries(${name} PRIVATE distckpt distckpt_proto GTest::gtest GTest::gtest_main)
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES TIMEOUT 300 LABELS unit)
endfunction()

function(distckpt_add_mpi_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;NP" ${ARGN})
  add_executable(${name} ${ARG_SOURCES} ${PROJECT_SOURCE_DIR}/mpi_tests/mpi_gtest_main.cc)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_BINARY_DIR}/proto
                                             ${PROJECT_SOURCE_DIR}/mpi_tests)
  target_link_libraries(${name} PRIVATE distckpt distckpt_proto GTest::gtest)
  foreach(np IN LISTS ARG_NP)
    add_test(NAME ${name}.np${np}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${DISTCKPT_MPIEXEC_FLAGS}
                     $<TARGET_FILE:${name}>)
    set_tests_properties(${name}.np${np} PROPERTIES PROCESSORS ${np} TIMEOUT 300 LABELS mpi
                         ENVIRONMENT "OMPI_MCA_rmaps_base_oversubscribe=1;DISTCKPT_TEST_TMP=${CMAKE_CURRENT_BINARY_DIR}/tmp")
  endforeach()
endfunction()
