# tsar_tests: writer, loader and CLI tests against real Python-made fixtures.
# The fixtures are made at test time by TSAR_PYTHON (the .venv) (ctest fixture "models").
set(TSAR_FIXTURES_DIR ${CMAKE_BINARY_DIR}/fixtures)

add_executable(tsar_tests
  cli/cli_test.cc
  cli/destination_test.cc
  cli/diff_residency_test.cc
  loader/archive_test.cc
  loader/bind_test.cc
  loader/live_test.cc
  loader/sharing_test.cc
  writer/writer_test.cc)
target_link_libraries(tsar_tests PRIVATE tsar_lib tsar_format GTest::gtest_main nlohmann_json::nlohmann_json)
add_dependencies(tsar_tests tsar_cli)
target_include_directories(tsar_tests PRIVATE ${PROJECT_SOURCE_DIR})
add_executable(tsar_test_worker loader/worker_main.cc)
target_link_libraries(tsar_test_worker PRIVATE tsar_lib)
add_dependencies(tsar_tests tsar_test_worker tsar_worker)
# Makes mmap of files fail (ENODEV) under LD_PRELOAD, for the read-fallback test.
add_library(tsar_refuse_mmap MODULE loader/refuse_mmap_shim.c)
target_link_libraries(tsar_refuse_mmap PRIVATE dl)
add_dependencies(tsar_tests tsar_refuse_mmap)
# The paths these tests use, in tsar_test_paths.txt beside the test programs
# (tests/CMakeLists.txt writes it; tests/test_env.h reads it).
set(TSAR_TEST_PATHS_TORCH
"TSAR_FIXTURES_DIR=${TSAR_FIXTURES_DIR}
TSAR_TEST_WORKER=$<TARGET_FILE:tsar_test_worker>
TSAR_SAMPLE_WORKER=$<TARGET_FILE:tsar_worker>
TSAR_REFUSE_MMAP=$<TARGET_FILE:tsar_refuse_mmap>
TSAR_IMPORT_FIXTURES_DIR=${CMAKE_BINARY_DIR}/import_fixtures
TSAR_CLI=$<TARGET_FILE:tsar_cli>
TSAR_PYTHON_EXE=${TSAR_PYTHON}
")

add_test(NAME fixtures.models
  COMMAND ${TSAR_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/make_fixtures.py ${TSAR_FIXTURES_DIR})
set_tests_properties(fixtures.models PROPERTIES FIXTURES_SETUP models TIMEOUT 300)

gtest_discover_tests(tsar_tests DISCOVERY_TIMEOUT 60
  PROPERTIES FIXTURES_REQUIRED "models;imports" TIMEOUT 300)

# GPU loading (issue 29): no fixtures, so scripts/gpu-check.sh can build and
# run it alone on a GPU machine; its GPU cases skip here.
add_executable(tsar_device_tests loader/device_test.cc)
target_link_libraries(tsar_device_tests PRIVATE tsar_lib tsar_format GTest::gtest_main)
target_include_directories(tsar_device_tests PRIVATE ${PROJECT_SOURCE_DIR})
gtest_discover_tests(tsar_device_tests DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300)

# A GoogleTest suite on fixtures a Python script makes at test time into
# DIR, which the tests find in the environment variable ENV.
function(tsar_fixture_suite target source fixture script dir env)
  add_executable(${target} ${source})
  target_link_libraries(${target} PRIVATE tsar_lib tsar_format GTest::gtest_main nlohmann_json::nlohmann_json)
  target_include_directories(${target} PRIVATE ${PROJECT_SOURCE_DIR})
  add_test(NAME fixtures.${fixture} COMMAND ${TSAR_PYTHON} ${script} ${dir})
  set_tests_properties(fixtures.${fixture} PROPERTIES FIXTURES_SETUP ${fixture} TIMEOUT 300)
  gtest_discover_tests(${target} DISCOVERY_TIMEOUT 60
    PROPERTIES FIXTURES_REQUIRED ${fixture} ENVIRONMENT ${env}=${dir})
endfunction()

# The restricted pickle reader; the safetensors and HDF5 importers.
tsar_fixture_suite(tsar_pickle_tests writer/pickle_test.cc pickles
  ${CMAKE_CURRENT_SOURCE_DIR}/writer/make_pickle_fixtures.py ${CMAKE_BINARY_DIR}/pickle_fixtures TSAR_PICKLE_FIXTURES)
# torchao's tensors in hand-written pickles (no fixture: in the same suite).
target_sources(tsar_pickle_tests PRIVATE writer/pickle_torchao_test.cc)
# AOTInductor programs stored in an archive (issue 60; the fixture compiles one).
tsar_fixture_suite(tsar_aoti_tests loader/aoti_test.cc aoti
  ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/make_aoti_fixtures.py ${CMAKE_BINARY_DIR}/aoti_fixtures TSAR_AOTI_FIXTURES)
tsar_fixture_suite(tsar_import_tests writer/import_test.cc imports
  ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/make_import_fixtures.py ${CMAKE_BINARY_DIR}/import_fixtures TSAR_IMPORT_FIXTURES)

# An installed tsar used by a user project (find_package and pkg-config). Not
# in sanitizer builds: the user project is built without the sanitizer runtime.
if(NOT TSAR_SANITIZE)
  add_test(NAME install.consumer
    COMMAND ${PROJECT_SOURCE_DIR}/scripts/test_install.sh ${CMAKE_BINARY_DIR} ${PROJECT_SOURCE_DIR}
            ${PROJECT_SOURCE_DIR}/samples/valid/minimal.tsar)
  set_tests_properties(install.consumer PROPERTIES TIMEOUT 300)
endif()

# The spec's independent Python reference decoder agrees with every sample.
add_test(NAME spec.reference_decoder
  COMMAND ${TSAR_PYTHON} ${PROJECT_SOURCE_DIR}/spec/reference/check_samples.py ${PROJECT_SOURCE_DIR}/samples)

# samples/container: the Containerfiles' sources are what build.sh makes, the
# k8s manifests parse and mount the images read-only.
add_test(NAME samples.container
  COMMAND ${TSAR_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/samples/container_test.py)
set_tests_properties(samples.container PROPERTIES TIMEOUT 300 ENVIRONMENT
  "TSAR_CLI=$<TARGET_FILE:tsar_cli>;TSAR_WORKER=$<TARGET_FILE:tsar_worker_cpu>;TSAR_PYTHON=${TSAR_PYTHON}")
# ... and for real (samples/container/run.sh): images built, pushed to a
# registry on loopback, pulled by a second storage, 4 workers in read-only
# containers; skipped (exit 77, reason printed) where podman cannot run one.
if(NOT TSAR_SANITIZE AND NOT TSAR_FUZZ)
  add_test(NAME samples.container_run COMMAND ${PROJECT_SOURCE_DIR}/samples/container/run.sh)
  set_tests_properties(samples.container_run PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600 ENVIRONMENT
    "TSAR_CLI=$<TARGET_FILE:tsar_cli>;TSAR_WORKER=$<TARGET_FILE:tsar_worker_cpu>;TSAR_PYTHON=${TSAR_PYTHON}")
endif()

# The hostile modules (tests/python/test_hostile_modules.py) on the portable
# path under ASan + UBSan: the sanitizer build's tsar._tsar_portable (the
# module walk and the bind over the Python C API) in an interpreter with the
# ASan runtime preloaded and Python's allocator off (PYTHONMALLOC=malloc), so
# that a read of a freed Python object is ASan's heap-use-after-free. ASan
# leaves SIGSEGV to tsar's fault handler (the training test expects it).
if(TSAR_SANITIZE AND TARGET tsar_python_portable AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/python)
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libclang_rt.asan-x86_64.so
    OUTPUT_VARIABLE tsar_asan_runtime OUTPUT_STRIP_TRAILING_WHITESPACE)
  add_test(NAME python.hostile_asan
    COMMAND ${TSAR_PYTHON} -m pytest ${CMAKE_CURRENT_SOURCE_DIR}/python/test_hostile_modules.py
            -q -p no:cacheprovider
    WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(python.hostile_asan PROPERTIES TIMEOUT 900 ENVIRONMENT
    "PYTHONPATH=${CMAKE_BINARY_DIR}/python;TSAR_PORTABLE=1;LD_PRELOAD=${tsar_asan_runtime};ASAN_OPTIONS=detect_leaks=0:handle_segv=0:handle_sigbus=0:allow_user_segv_handler=1;TSAR_TEST_PYTHONMALLOC=malloc;PYTHONMALLOC=malloc")
endif()

# The Python package (tests/python, pytest): against the build tree's package.
if(TARGET tsar_python AND EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/python)
  add_test(NAME python.pytest
    COMMAND ${TSAR_PYTHON} -m pytest ${CMAKE_CURRENT_SOURCE_DIR}/python -q -p no:cacheprovider
    WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(python.pytest PROPERTIES TIMEOUT 1500 ENVIRONMENT
    "PYTHONPATH=${CMAKE_BINARY_DIR}/python;TSAR_CLI=$<TARGET_FILE:tsar_cli>;TSAR_SAMPLES=${PROJECT_SOURCE_DIR}/samples")
endif()

# pip wheel of the source tree, installed into a fresh venv beside the same
# torch: import, save, bind, the tsar command and tsar-torch, the version check.
if(TARGET tsar_python)
  add_test(NAME python.wheel
    COMMAND ${PROJECT_SOURCE_DIR}/scripts/check-wheel.sh ${TSAR_PYTHON} ${PROJECT_SOURCE_DIR}
            ${CMAKE_BINARY_DIR}/wheel-build)
  set_tests_properties(python.wheel PROPERTIES TIMEOUT 1200)
endif()
