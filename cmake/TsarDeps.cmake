# tsar's small libraries: xxHash, minizip, HDF5, nlohmann-json, CLI11 (and
# GoogleTest in tests/), from Debian's packages by default. Each is a target
# of the name its own package gives (PkgConfig::XXHASH, PkgConfig::MINIZIP,
# hdf5::hdf5, nlohmann_json::nlohmann_json, CLI11::CLI11), so the rest of the
# build names them the same way whatever provides them.
#
# TSAR_DEPS_DIR: a folder made by scripts/gpu-deps.sh, for a machine with
# torch but without Debian's libraries (a GPU machine, scripts/gpu-check.sh):
# xxHash, nlohmann-json and CLI11 as headers (xxHash inlined, XXH_INLINE_ALL),
# GoogleTest as source. minizip and HDF5 have no such form: turn them off
# there (TSAR_WITH_ZIP, TSAR_WITH_HDF5), and the importers that need them
# refuse, saying so.
set(TSAR_DEPS_DIR "" CACHE PATH "Headers and sources from scripts/gpu-deps.sh instead of Debian's packages")
option(TSAR_WITH_ZIP "Read torch.save and TorchScript zips (minizip)" ON)
option(TSAR_WITH_HDF5 "Pack from and export to HDF5 (libhdf5)" ON)

if(TSAR_DEPS_DIR)
  if(NOT EXISTS ${TSAR_DEPS_DIR}/include/xxhash.h)
    message(FATAL_ERROR "tsar: TSAR_DEPS_DIR=${TSAR_DEPS_DIR} holds no include/xxhash.h: make it with scripts/gpu-deps.sh")
  endif()
  add_library(PkgConfig::XXHASH INTERFACE IMPORTED)
  set_target_properties(PkgConfig::XXHASH PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES ${TSAR_DEPS_DIR}/include INTERFACE_COMPILE_DEFINITIONS XXH_INLINE_ALL)
  add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED)
  set_target_properties(nlohmann_json::nlohmann_json PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${TSAR_DEPS_DIR}/include)
  set(nlohmann_json_FOUND TRUE)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  set_target_properties(CLI11::CLI11 PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${TSAR_DEPS_DIR}/include)
  set(CLI11_FOUND TRUE)
else()
  find_package(PkgConfig REQUIRED)
  pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
  find_package(nlohmann_json REQUIRED)
  find_package(CLI11 REQUIRED)
endif()

if(TSAR_WITH_ZIP)
  # torch.save zips are read with minizip (writer/zip_reader.h), not LibTorch.
  find_package(PkgConfig REQUIRED)
  pkg_check_modules(MINIZIP REQUIRED IMPORTED_TARGET minizip)
  set(TSAR_ZIP_SOURCES ${PROJECT_SOURCE_DIR}/writer/zip_reader.cc)
else()
  add_library(PkgConfig::MINIZIP INTERFACE IMPORTED)
  set(TSAR_ZIP_SOURCES ${PROJECT_SOURCE_DIR}/writer/zip_reader_none.cc)
endif()

if(TSAR_WITH_HDF5)
  find_package(HDF5 REQUIRED COMPONENTS C)
  set(TSAR_HDF5_SOURCES ${PROJECT_SOURCE_DIR}/writer/export_hdf5.cc ${PROJECT_SOURCE_DIR}/writer/import_hdf5.cc)
else()
  add_library(hdf5::hdf5 INTERFACE IMPORTED)
  set(TSAR_HDF5_SOURCES ${PROJECT_SOURCE_DIR}/writer/hdf5_none.cc)
endif()
