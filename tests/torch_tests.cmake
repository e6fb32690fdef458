# tsar_tests: writer, loader and CLI tests against real Python-made fixtures.
# The fixtures are made at test time by /usr/bin/python3 (ctest fixture "models").
set(TSAR_PYTHON /usr/bin/python3 CACHE FILEPATH "Python with torch, torchvision and h5py, for test fixtures")
set(TSAR_FIXTURES_DIR ${CMAKE_BINARY_DIR}/fixtures)

add_executable(tsar_tests
  loader/archive_test.cc
  loader/bind_test.cc
  loader/sharing_test.cc
  writer/writer_test.cc)
target_link_libraries(tsar_tests PRIVATE tsar_lib tsar_format GTest::gtest_main)
target_include_directories(tsar_tests PRIVATE ${PROJECT_SOURCE_DIR})
add_executable(tsar_test_worker loader/worker_main.cc)
target_link_libraries(tsar_test_worker PRIVATE tsar_lib)
add_dependencies(tsar_tests tsar_test_worker)
target_compile_definitions(tsar_tests PRIVATE
  TSAR_FIXTURES_DIR="${TSAR_FIXTURES_DIR}"
  TSAR_TEST_WORKER="$<TARGET_FILE:tsar_test_worker>"
  TSAR_CLI="$<TARGET_FILE:tsar_cli>")

add_test(NAME fixtures.models
  COMMAND ${TSAR_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/make_fixtures.py ${TSAR_FIXTURES_DIR})
set_tests_properties(fixtures.models PROPERTIES FIXTURES_SETUP models TIMEOUT 300)

gtest_discover_tests(tsar_tests DISCOVERY_TIMEOUT 60
  PROPERTIES FIXTURES_REQUIRED models TIMEOUT 300)
