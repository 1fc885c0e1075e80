# Expert parallelism over MPI (included by CMakeLists.txt): libmxfp8_mpi (src/mpi, include/mxfp8_mpi.h) on the
# public API of libmxfp8, built only when find_package(MPI) finds a C MPI; its C tests under mpiexec (ctest label
# "mpi"); and MXFP8_HAVE_MPI for the CLI. Without MPI the label holds one test that says why it is skipped.
find_package(MPI COMPONENTS C)

if(NOT MPI_C_FOUND)
  message(STATUS "mxfp8: MPI not found: libmxfp8_mpi, its tests and `mxfp8 ... --expert-parallel` are not built")
  if(MXFP8_BUILD_TESTS)
    add_test(NAME mpi_not_found COMMAND ${CMAKE_COMMAND} -E echo
             "SKIP: MPI was not found at configure time (Debian: apt-get install openmpi-bin libopenmpi-dev)")
    set_tests_properties(mpi_not_found PROPERTIES LABELS mpi SKIP_REGULAR_EXPRESSION "SKIP:")
  endif()
  return()
endif()

file(GLOB MXFP8_MPI_SRC CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/mpi/*.c)
add_library(mxfp8_mpi SHARED ${MXFP8_MPI_SRC})
target_include_directories(mxfp8_mpi PUBLIC ${PROJECT_SOURCE_DIR}/include)
# -ffp-contract=off: the per-token sums must be plain FP32 additions, as in the single-process kernels.
target_compile_options(mxfp8_mpi PRIVATE ${MXFP8_WARN} -fvisibility=hidden -ffp-contract=off)
target_link_libraries(mxfp8_mpi PUBLIC mxfp8 MPI::MPI_C PRIVATE OpenMP::OpenMP_C)
set_target_properties(mxfp8_mpi PROPERTIES VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR})
message(STATUS "mxfp8: MPI found (${MPI_C_LIBRARIES}); building libmxfp8_mpi")

# The wheel's CLI (SKBUILD) stays without MPI: it ships beside libmxfp8.so only; --expert-parallel is for builds
# from source.
if(TARGET mxfp8_cli AND NOT SKBUILD)
  target_compile_definitions(mxfp8_cli PRIVATE MXFP8_HAVE_MPI=1)
  target_link_libraries(mxfp8_cli PRIVATE mxfp8_mpi)
endif()

if(NOT MXFP8_BUILD_TESTS)
  return()
endif()

# mpiexec flags: Open MPI as root needs OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM), and more ranks than cores need
# --oversubscribe (CI machines have 2 cores). Every run is bounded by `timeout`, so a hang fails the test.
find_program(MXFP8_TIMEOUT timeout REQUIRED)
execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _mpiexec_version ERROR_QUIET)
set(MXFP8_MPIEXEC_FLAGS "")
set(MXFP8_OPEN_MPI OFF)
if(_mpiexec_version MATCHES "Open MPI|OpenRTE")
  set(MXFP8_OPEN_MPI ON)
  set(MXFP8_MPIEXEC_FLAGS --oversubscribe)
endif()
set(MXFP8_MPI_TEST_ENV OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none)
if(MXFP8_SANITIZE)
  # Open MPI keeps allocations until exit, many in MCA plugins it has unloaded by then (their stacks show no module,
  # so no suppression can name them): memory errors stay on, leak detection is off for these tests.
  list(APPEND MXFP8_MPI_TEST_ENV ASAN_OPTIONS=detect_leaks=0)
endif()

foreach(t test_mpi_moe test_mpi_faults)
  add_executable(${t} ${PROJECT_SOURCE_DIR}/tests/mpi/${t}.c)
  target_include_directories(${t} PRIVATE ${PROJECT_SOURCE_DIR}/tests/c ${PROJECT_SOURCE_DIR}/tests/mpi)
  target_compile_options(${t} PRIVATE ${MXFP8_WARN})
  target_link_libraries(${t} PRIVATE mxfp8_mpi mxfp8 MPI::MPI_C m)
endforeach()

# Not a ctest: tests/python/test_struct_layout.py runs it to compare mxfp8.mpi's ctypes mirrors with the C structs.
add_executable(struct_layout_mpi ${PROJECT_SOURCE_DIR}/tests/mpi/struct_layout_mpi.c)
target_compile_options(struct_layout_mpi PRIVATE ${MXFP8_WARN})
target_link_libraries(struct_layout_mpi PRIVATE mxfp8_mpi)

# mxfp8_add_mpi_test(NAME RANKS LIMIT_SECONDS EXE [extra mpiexec flags...])
function(mxfp8_add_mpi_test name ranks limit exe)
  add_test(NAME ${name}
           COMMAND ${MXFP8_TIMEOUT} -k 10 ${limit} ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks}
                   ${MXFP8_MPIEXEC_FLAGS} ${ARGN} ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${exe}> ${MPIEXEC_POSTFLAGS})
  set_tests_properties(${name} PROPERTIES LABELS mpi ENVIRONMENT "${MXFP8_MPI_TEST_ENV}" TIMEOUT 600
                                          PROCESSORS 2 RUN_SERIAL ON)
endfunction()

foreach(np 1 2 3 4)
  mxfp8_add_mpi_test(mpi_moe_np${np} ${np} 300 test_mpi_moe)
endforeach()
foreach(np 2 3 4)
  mxfp8_add_mpi_test(mpi_faults_np${np} ${np} 120 test_mpi_faults)
endforeach()
if(MXFP8_OPEN_MPI)
  # the TCP transport, as between machines
  mxfp8_add_mpi_test(mpi_moe_np3_tcp 3 300 test_mpi_moe --mca btl tcp,self)
  mxfp8_add_mpi_test(mpi_moe_np4_tcp 4 300 test_mpi_moe --mca btl tcp,self)
  mxfp8_add_mpi_test(mpi_faults_np3_tcp 3 120 test_mpi_faults --mca btl tcp,self)
endif()
