# Finds LibTorch and sets TORCH_LIBRARIES and TRAINER_TORCH_CXX_FLAGS.
#
# Order: Torch_DIR or CMAKE_PREFIX_PATH when the user gives them (e.g. the official LibTorch
# zip), else the `torch` Python package of TRAINER_PYTHON (default: the project's .venv, then
# python3), through torch.utils.cmake_prefix_path.

if(NOT Torch_DIR AND NOT DEFINED ENV{Torch_DIR})
  set(_trainer_prefix_has_torch FALSE)
  foreach(_p IN LISTS CMAKE_PREFIX_PATH)
    if(EXISTS "${_p}/share/cmake/Torch/TorchConfig.cmake" OR EXISTS "${_p}/Torch/TorchConfig.cmake")
      set(_trainer_prefix_has_torch TRUE)
    endif()
  endforeach()
  if(NOT _trainer_prefix_has_torch)
    if(NOT TRAINER_PYTHON)
      if(EXISTS "${CMAKE_SOURCE_DIR}/.venv/bin/python")
        set(TRAINER_PYTHON "${CMAKE_SOURCE_DIR}/.venv/bin/python")
      else()
        find_program(TRAINER_PYTHON NAMES python3 python)
      endif()
    endif()
    if(TRAINER_PYTHON)
      execute_process(
        COMMAND "${TRAINER_PYTHON}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
        OUTPUT_VARIABLE _trainer_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
        ERROR_QUIET RESULT_VARIABLE _trainer_rc)
      if(_trainer_rc EQUAL 0 AND _trainer_torch_prefix)
        list(APPEND CMAKE_PREFIX_PATH "${_trainer_torch_prefix}")
      endif()
    endif()
  endif()
endif()

# A CUDA build of LibTorch looks for the CUDA toolkit; point it at the usual place.
if(NOT CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CUDAToolkit_ROOT /usr/local/cuda)
endif()

find_package(Torch QUIET)
if(NOT Torch_FOUND)
  message(FATAL_ERROR
    "LibTorch not found. Run scripts/setup.sh (installs the pinned torch wheel into .venv), "
    "or pass -DTorch_DIR=<libtorch>/share/cmake/Torch for an unpacked LibTorch zip.")
endif()

# TorchConfigVersion.cmake sets PACKAGE_VERSION; Torch_VERSION mirrors it.
set(_trainer_torch_version "${Torch_VERSION}")
if(NOT _trainer_torch_version)
  set(_trainer_torch_version "${PACKAGE_VERSION}")
endif()
if(_trainer_torch_version AND _trainer_torch_version VERSION_LESS TRAINER_MIN_TORCH_VERSION)
  message(FATAL_ERROR
    "LibTorch ${_trainer_torch_version} found at ${Torch_DIR} is older than the minimum "
    "${TRAINER_MIN_TORCH_VERSION} that trainer supports. Install a newer one (scripts/setup.sh "
    "pins a supported version) or point Torch_DIR at it.")
endif()
message(STATUS "LibTorch ${_trainer_torch_version} at ${Torch_DIR}")

# TORCH_CXX_FLAGS is a space-separated string (e.g. the _GLIBCXX_USE_CXX11_ABI define).
separate_arguments(TRAINER_TORCH_CXX_FLAGS UNIX_COMMAND "${TORCH_CXX_FLAGS}")
