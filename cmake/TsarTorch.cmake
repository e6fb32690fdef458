# find_package(Torch) for tsar: the LibTorch inside the torch wheel of
# TSAR_PYTHON's environment (the project's .venv, made by scripts/setup.sh), or
# whatever CMAKE_PREFIX_PATH / Torch_DIR already names.
#
# Two traps of the wheel's TorchConfig.cmake, measured on a Debian 12 machine
# (../shared/TOOLCHAIN.md):
#  1. its find_library(c10) searches the system folders before the wheel's, so
#     with Debian's libtorch-dev installed it picks Debian's libc10.so and the
#     program aborts at start (two c10s): c10_LIBRARY is pinned to the wheel's.
#  2. libtorch_cuda.so needs the wheel's nvidia-* libraries (NCCL, cuDNN...) at
#     link time: the linker is given every <site-packages>/nvidia/*/lib as an
#     -rpath-link folder (no run path is added: torch finds them itself).
#
# Sets TSAR_TORCH_VERSION (e.g. 2.15.0), TSAR_TORCH_LIBDIR, TSAR_TORCH_PYTHON_LIBRARY
# (libtorch_python.so, for the Python extension), TSAR_TORCH_HAS_CUDA and
# TSAR_TORCH_RPATH_LINK (the folders of trap 2).

# 2.7: the first torch whose PyPI wheel uses the C++11 std::string ABI, as
# Debian's C++ libraries and tsar's own torch-free objects do (up to 2.6 its
# TorchConfig passes -D_GLIBCXX_USE_CXX11_ABI=0 to every consumer, and linking
# fails on std::__cxx11::basic_string). CI tests 2.7 and the newest.
set(TSAR_TORCH_MIN_VERSION 2.7)

if(TSAR_PYTHON AND NOT Torch_DIR)
  # -I: a pip build-isolation overlay (PYTHONPATH) must not hide the torch the
  # environment has: tsar is built for that one.
  execute_process(
    COMMAND ${TSAR_PYTHON} -I -c "import torch, torch.utils; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE _tsar_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
    ERROR_VARIABLE _tsar_torch_err RESULT_VARIABLE _tsar_torch_rc)
  if(NOT _tsar_torch_rc EQUAL 0)
    message(FATAL_ERROR "tsar: ${TSAR_PYTHON} cannot import torch, whose LibTorch tsar builds "
      "against (scripts/setup.sh makes .venv with it; or pass -DTSAR_PYTHON=/path/to/python, "
      "or -DTSAR_WITH_TORCH=OFF):\n${_tsar_torch_err}")
  endif()
  list(PREPEND CMAKE_PREFIX_PATH "${_tsar_torch_prefix}")
  get_filename_component(_tsar_torch_root "${_tsar_torch_prefix}/../.." ABSOLUTE)  # .../site-packages/torch
  if(EXISTS "${_tsar_torch_root}/lib/libc10.so" AND NOT c10_LIBRARY)
    set(c10_LIBRARY "${_tsar_torch_root}/lib/libc10.so" CACHE FILEPATH "the wheel's c10 (not Debian's)")
  endif()
endif()

# Older TorchConfigs (2.6's Caffe2/public/cuda.cmake) run find_package(Python)
# themselves: without this they would settle on whatever python3 is on PATH,
# and the Python extension would then be built for that interpreter.
if(TSAR_PYTHON AND NOT Python_EXECUTABLE)
  set(Python_EXECUTABLE "${TSAR_PYTHON}")
endif()
find_package(Torch REQUIRED)
# LibTorch's headers need C++20 from torch 2.14 on (std::strong_ordering,
# starts_with, requires). torch 2.15's TorchConfig.cmake makes every consumer
# of `torch` compile as C++20 (target_compile_features(torch INTERFACE
# cxx_std_20)); 2.14's sets CXX_STANDARD 20 only on its own targets, so a
# C++17 project fails against it. Every target that links LibTorch here gets
# C++20 the same way, whatever the torch; the rest of tsar stays C++17.
if(TARGET torch)
  set_property(TARGET torch APPEND PROPERTY INTERFACE_COMPILE_FEATURES cxx_std_20)
endif()

set(TSAR_TORCH_VERSION "${Torch_VERSION}")
if(NOT TSAR_TORCH_VERSION)
  set(TSAR_TORCH_VERSION "${TORCH_VERSION}")
endif()
if(TSAR_TORCH_VERSION VERSION_LESS TSAR_TORCH_MIN_VERSION)
  message(FATAL_ERROR "tsar: LibTorch ${TSAR_TORCH_VERSION} found (${Torch_DIR}); tsar's C++ "
    "side needs ${TSAR_TORCH_MIN_VERSION} or newer (PyPI's torch up to 2.6 uses the pre-C++11 "
    "std::string ABI, which C++ libraries built the usual way cannot link with). Use a newer "
    "torch (scripts/setup.sh's .venv), or -DTSAR_WITH_TORCH=OFF for the Torch-free reader and "
    "CLI; a tsar package built beside another torch runs its portable path beside this one.")
endif()

get_filename_component(TSAR_TORCH_LIBDIR "${TORCH_LIBRARY}" DIRECTORY)
set(TSAR_TORCH_HAS_CUDA OFF)
if(TARGET torch_cuda OR EXISTS "${TSAR_TORCH_LIBDIR}/libtorch_cuda.so")
  set(TSAR_TORCH_HAS_CUDA ON)
endif()
find_library(TSAR_TORCH_PYTHON_LIBRARY torch_python HINTS "${TSAR_TORCH_LIBDIR}" NO_DEFAULT_PATH)

# Trap 2: the nvidia-* wheels beside torch.
get_filename_component(_tsar_site "${TSAR_TORCH_LIBDIR}/../.." ABSOLUTE)
file(GLOB _tsar_nvidia_libs LIST_DIRECTORIES true "${_tsar_site}/nvidia/*/lib" "${_tsar_site}/nvidia/cu*/lib")
set(TSAR_TORCH_RPATH_LINK "${TSAR_TORCH_LIBDIR}")
foreach(dir IN LISTS _tsar_nvidia_libs)
  if(IS_DIRECTORY "${dir}")
    list(APPEND TSAR_TORCH_RPATH_LINK "${dir}")
  endif()
endforeach()
foreach(dir IN LISTS TSAR_TORCH_RPATH_LINK)
  add_link_options("LINKER:-rpath-link,${dir}")
endforeach()

message(STATUS "tsar: LibTorch ${TSAR_TORCH_VERSION} in ${TSAR_TORCH_LIBDIR} (CUDA: ${TSAR_TORCH_HAS_CUDA})")
