# Test registration helpers.
#
# distckpt_add_unit_test(NAME SOURCES...)  : a GoogleTest binary run directly.
# distckpt_add_mpi_test(NAME SOURCES... NP n1 n2 ...)
#   : one GoogleTest binary (with an MPI main) registered once per rank count as
#     NAME.npN under `mpirun -np N`, with PROCESSORS, TIMEOUT and LABELS set.

set(DISTCKPT_MPIEXEC_FLAGS --allow-run-as-root --oversubscribe --bind-to none
    CACHE STRING "Extra flags for mpirun in tests")

# distckpt_add_unit_test(name sources... [FLOOR floor]): with FLOOR, the test links that
# floor's library (and so the floors below it) and nothing above: a test of a floor that
# needs a higher one fails to link. Without, the whole library.
function(distckpt_add_unit_test name)
  cmake_parse_arguments(ARG "" "FLOOR" "" ${ARGN})
  add_executable(${name} ${ARG_UNPARSED_ARGUMENTS})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/src ${PROJECT_BINARY_DIR}/proto)
  if(ARG_FLOOR)
    target_link_libraries(${name} PRIVATE distckpt_floor_${ARG_FLOOR} GTest::gtest GTest::gtest_main)
  else()
    target_link_libraries(${name} PRIVATE distckpt distckpt_proto GTest::gtest GTest::gtest_main)
  endif()
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

# Call at the end of each CMakeLists.txt that registers tests.
#
# Once a rank exits with a non-zero status, Open MPI's mpirun signals the job and waits
# odls_base_sigkill_timeout (1 s) before SIGKILL, once or twice: every run that fails
# costs 1-2 s more. The tests fail more than a hundred runs on purpose (full disks,
# crashes, refused options). None relies on that grace: the breakpoint tests send
# SIGUSR1, which mpirun forwards to the ranks without it, and Slurm's signals come
# through srun.
# Not under the sanitizers: there the other ranks may still be in LeakSanitizer's exit
# check when the first one exits with the error it was meant to, and the grace lets
# their reports out.
function(distckpt_finish_tests)
  get_property(tests DIRECTORY PROPERTY TESTS)
  if(tests AND NOT DISTCKPT_SANITIZE)
    set_property(TEST ${tests} APPEND PROPERTY ENVIRONMENT OMPI_MCA_odls_base_sigkill_timeout=0)
  endif()
endfunction()
