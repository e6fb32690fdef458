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
#
# TSAR_SELF_CONTAINED (the wheel: pyproject.toml sets it): what tsar needs
# beyond glibc, libstdc++ and torch goes into tsar's own files, so that the
# wheel runs on a machine without these packages (scripts/build-wheel.sh
# repairs and tags it manylinux, scripts/check_wheel_libs.py checks it):
# xxHash inlined (XXH_INLINE_ALL), minizip and zlib from their static
# archives, hidden inside each shared object (--exclude-libs), and no HDF5
# (whose library brings about 30 others: curl, TLS, Kerberos, LDAP): HDF5
# files are packed by a tsar built from source, which says so. Two functions
# are bound to their older symbol versions (cmake/symbol_versions.h): the
# wheel is manylinux_2_34, not 2_35.
set(TSAR_DEPS_DIR "" CACHE PATH "Headers and sources from scripts/gpu-deps.sh instead of Debian's packages")
option(TSAR_SELF_CONTAINED "Inline xxHash, link minizip and zlib statically, leave HDF5 out (the wheel)" OFF)
option(TSAR_WITH_ZIP "Read torch.save and TorchScript zips (minizip)" ON)
option(TSAR_WITH_HDF5 "Pack from and export to HDF5 (libhdf5)" ON)
if(TSAR_SELF_CONTAINED)
  set(TSAR_WITH_HDF5 OFF CACHE BOOL "Pack from and export to HDF5 (libhdf5)" FORCE)
  # Static archives' symbols stay inside each shared object that links them.
  add_link_options($<$<STREQUAL:$<TARGET_PROPERTY:TYPE>,SHARED_LIBRARY>:-Wl,--exclude-libs,ALL>
                   $<$<STREQUAL:$<TARGET_PROPERTY:TYPE>,MODULE_LIBRARY>:-Wl,--exclude-libs,ALL>)
  # The older versions of the two functions that would raise the wheel's
  # tag to manylinux_2_35 (cmake/symbol_versions.h says which and why).
  add_compile_options("$<$<COMPILE_LANGUAGE:CXX>:SHELL:-include ${PROJECT_SOURCE_DIR}/cmake/symbol_versions.h>")
endif()

# A library that is missing stops the configure with one line naming it and
# the package that provides it (Debian/Ubuntu names; scripts/setup.sh installs
# them all), not CMake's page about package configuration files.
function(tsar_missing what package)
  message(FATAL_ERROR "tsar: ${what} not found: install ${package} (apt-get install ${package}; "
    "scripts/setup.sh installs every package tsar needs)")
endfunction()

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
  find_package(PkgConfig QUIET)
  if(NOT PkgConfig_FOUND)
    tsar_missing("pkg-config" "pkg-config")
  endif()
  if(TSAR_SELF_CONTAINED)
    find_path(TSAR_XXHASH_INCLUDE xxhash.h)
    if(NOT TSAR_XXHASH_INCLUDE)
      tsar_missing("xxHash (xxhash.h)" "libxxhash-dev")
    endif()
    add_library(PkgConfig::XXHASH INTERFACE IMPORTED)
    set_target_properties(PkgConfig::XXHASH PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES ${TSAR_XXHASH_INCLUDE} INTERFACE_COMPILE_DEFINITIONS XXH_INLINE_ALL)
  else()
    pkg_check_modules(XXHASH QUIET IMPORTED_TARGET libxxhash)
    if(NOT XXHASH_FOUND)
      tsar_missing("xxHash (libxxhash)" "libxxhash-dev")
    endif()
  endif()
  find_package(nlohmann_json QUIET)
  if(NOT nlohmann_json_FOUND)
    tsar_missing("nlohmann-json" "nlohmann-json3-dev")
  endif()
  find_package(CLI11 QUIET)
  if(NOT CLI11_FOUND)
    tsar_missing("CLI11" "libcli11-dev")
  endif()
endif()

# DLPack's header (the portable path hands tensors to torch through DLPack:
# python/src/portable_bind.cc). Header only: nothing to link.
find_path(TSAR_DLPACK_INCLUDE dlpack/dlpack.h HINTS ${TSAR_DEPS_DIR}/include)
if(NOT TSAR_DLPACK_INCLUDE)
  tsar_missing("DLPack (dlpack/dlpack.h)" "libdlpack-dev")
endif()
add_library(tsar_dlpack INTERFACE)
target_include_directories(tsar_dlpack INTERFACE ${TSAR_DLPACK_INCLUDE})

if(TSAR_WITH_ZIP)
  # torch.save zips are read with minizip (writer/zip_reader.h), not LibTorch.
  find_package(PkgConfig QUIET)
  if(TSAR_SELF_CONTAINED)
    find_path(TSAR_MINIZIP_INCLUDE unzip.h PATH_SUFFIXES minizip)
    find_library(TSAR_MINIZIP_ARCHIVE libminizip.a)
    find_library(TSAR_ZLIB_ARCHIVE libz.a)
    if(NOT TSAR_MINIZIP_INCLUDE OR NOT TSAR_MINIZIP_ARCHIVE)
      tsar_missing("minizip's static library (libminizip.a)" "libminizip-dev")
    endif()
    if(NOT TSAR_ZLIB_ARCHIVE)
      tsar_missing("zlib's static library (libz.a)" "zlib1g-dev")
    endif()
    add_library(PkgConfig::MINIZIP INTERFACE IMPORTED)
    set_target_properties(PkgConfig::MINIZIP PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${TSAR_MINIZIP_INCLUDE}
      INTERFACE_LINK_LIBRARIES "${TSAR_MINIZIP_ARCHIVE};${TSAR_ZLIB_ARCHIVE}")
  else()
    pkg_check_modules(MINIZIP QUIET IMPORTED_TARGET minizip)
    if(NOT MINIZIP_FOUND)
      tsar_missing("minizip" "libminizip-dev (or configure with -DTSAR_WITH_ZIP=OFF)")
    endif()
  endif()
  set(TSAR_ZIP_SOURCES ${PROJECT_SOURCE_DIR}/writer/zip_reader.cc)
else()
  add_library(PkgConfig::MINIZIP INTERFACE IMPORTED)
  set(TSAR_ZIP_SOURCES ${PROJECT_SOURCE_DIR}/writer/zip_reader_none.cc)
endif()

if(TSAR_WITH_HDF5)
  find_package(HDF5 QUIET COMPONENTS C)
  if(NOT HDF5_FOUND)
    tsar_missing("HDF5" "libhdf5-dev (or configure with -DTSAR_WITH_HDF5=OFF)")
  endif()
  set(TSAR_HDF5_SOURCES ${PROJECT_SOURCE_DIR}/writer/export_hdf5.cc ${PROJECT_SOURCE_DIR}/writer/import_hdf5.cc)
else()
  add_library(hdf5::hdf5 INTERFACE IMPORTED)
  set(TSAR_HDF5_SOURCES ${PROJECT_SOURCE_DIR}/writer/hdf5_none.cc)
endif()
