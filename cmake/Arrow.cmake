# Finds Apache Arrow's and Parquet's C++ libraries and headers where the pinned `pyarrow` wheel
# ships them (site-packages/pyarrow: include/, libarrow.so.N, libparquet.so.N), as
# FindTorchSomewhere.cmake finds LibTorch in the `torch` wheel, and defines
#
#   trainer::arrow      the headers and both libraries (for a target that includes Arrow anywhere)
#   trainer::parquet    the libraries only (libparquet, then libarrow), with their sonames
#   trainer_arrow_sources(TARGET <target> SOURCES <files>...)
#                       the files that include Arrow's headers: only they get the include folder
#                       and compile as C++20 (below); <target> links the libraries
#   TRAINER_ARROW_VERSION, TRAINER_ARROW_INCLUDE_DIR, TRAINER_ARROW_LIBRARY_DIR
#
# The python asked: TRAINER_PYARROW_DIR (a pyarrow package folder) when given, else
# TRAINER_PYTHON (default: the project's .venv, then python3): pyarrow.get_include() and
# pyarrow.get_library_dirs().
#
# Arrow's headers need C++20 (std::span, std::bit_width); the rest of the tree is C++17. The
# files of trainer_arrow_sources compile with -std=c++20 and without the precompiled torch header
# (compiled as C++17); their interfaces to the rest are C++17 headers that include no Arrow header.
# The wheel's libraries use the C++11 string ABI (std::__cxx11), as LibTorch 2.x does.

set(TRAINER_MIN_ARROW_VERSION 25.0)

if(NOT TRAINER_PYARROW_DIR)
  if(NOT TRAINER_PYTHON)
    if(EXISTS "${CMAKE_SOURCE_DIR}/.venv/bin/python")
      set(TRAINER_PYTHON "${CMAKE_SOURCE_DIR}/.venv/bin/python")
    else()
      find_program(TRAINER_PYTHON NAMES python3 python)
    endif()
  endif()
  set(_trainer_pyarrow_rc 1)
  if(TRAINER_PYTHON)
    execute_process(
      COMMAND "${TRAINER_PYTHON}" -c
              "import pyarrow; print(pyarrow.get_include()); print(pyarrow.get_library_dirs()[0])"
      OUTPUT_VARIABLE _trainer_pyarrow_out OUTPUT_STRIP_TRAILING_WHITESPACE
      ERROR_QUIET RESULT_VARIABLE _trainer_pyarrow_rc)
  endif()
  if(NOT _trainer_pyarrow_rc EQUAL 0)
    message(FATAL_ERROR "pyarrow (Arrow's and Parquet's C++ libraries, for .parquet and .arrow data files) not found by ${TRAINER_PYTHON}: run scripts/setup.sh, or pass -DTRAINER_PYARROW_DIR=<site-packages>/pyarrow")
  endif()
  string(REPLACE "\n" ";" _trainer_pyarrow_out "${_trainer_pyarrow_out}")
  list(GET _trainer_pyarrow_out 0 TRAINER_ARROW_INCLUDE_DIR)
  list(GET _trainer_pyarrow_out 1 TRAINER_ARROW_LIBRARY_DIR)
else()
  set(TRAINER_ARROW_INCLUDE_DIR "${TRAINER_PYARROW_DIR}/include")
  set(TRAINER_ARROW_LIBRARY_DIR "${TRAINER_PYARROW_DIR}")
endif()

# The wheel has versioned libraries only (libarrow.so.2500; no libarrow.so link).
file(GLOB _trainer_libarrow "${TRAINER_ARROW_LIBRARY_DIR}/libarrow.so.[0-9]*")
file(GLOB _trainer_libparquet "${TRAINER_ARROW_LIBRARY_DIR}/libparquet.so.[0-9]*")
list(FILTER _trainer_libarrow EXCLUDE REGEX "\\.so\\.[0-9]+\\.[0-9]")
list(FILTER _trainer_libparquet EXCLUDE REGEX "\\.so\\.[0-9]+\\.[0-9]")
if(NOT EXISTS "${TRAINER_ARROW_INCLUDE_DIR}/arrow/api.h" OR
   NOT EXISTS "${TRAINER_ARROW_INCLUDE_DIR}/parquet/arrow/reader.h" OR
   NOT _trainer_libarrow OR NOT _trainer_libparquet)
  message(FATAL_ERROR "pyarrow at ${TRAINER_ARROW_LIBRARY_DIR} lacks Arrow's C++ headers or libarrow.so.N/libparquet.so.N: run scripts/setup.sh (it installs the pinned pyarrow wheel)")
endif()
list(GET _trainer_libarrow 0 _trainer_libarrow)
list(GET _trainer_libparquet 0 _trainer_libparquet)

file(STRINGS "${TRAINER_ARROW_INCLUDE_DIR}/arrow/util/config.h" _trainer_arrow_version_line
     REGEX "#define ARROW_VERSION_STRING")
string(REGEX MATCH "[0-9]+\\.[0-9]+\\.[0-9]+" TRAINER_ARROW_VERSION "${_trainer_arrow_version_line}")
if(TRAINER_ARROW_VERSION VERSION_LESS TRAINER_MIN_ARROW_VERSION)
  message(FATAL_ERROR "Arrow ${TRAINER_ARROW_VERSION} (pyarrow at ${TRAINER_ARROW_LIBRARY_DIR}) is older than the ${TRAINER_MIN_ARROW_VERSION} trainer is written against: run scripts/setup.sh (it pins pyarrow)")
endif()
if(NOT "cxx_std_20" IN_LIST CMAKE_CXX_COMPILE_FEATURES)
  message(FATAL_ERROR "Arrow's headers need C++20 and ${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION} has no C++20 mode: use GCC 11 or newer, or Clang 14 or newer")
endif()
if(TRAINER_TORCH_CXX_FLAGS MATCHES "_GLIBCXX_USE_CXX11_ABI=0")
  message(FATAL_ERROR "LibTorch uses the pre-C++11 std::string ABI and pyarrow's libraries the C++11 one: use a LibTorch built with the C++11 ABI (the torch wheel, or the cxx11-abi LibTorch zip)")
endif()
message(STATUS "Arrow ${TRAINER_ARROW_VERSION} at ${TRAINER_ARROW_LIBRARY_DIR}")

get_filename_component(_trainer_soname "${_trainer_libarrow}" NAME)
add_library(trainer::arrow_lib SHARED IMPORTED)
set_target_properties(trainer::arrow_lib PROPERTIES IMPORTED_LOCATION "${_trainer_libarrow}"
                      IMPORTED_SONAME "${_trainer_soname}")
get_filename_component(_trainer_soname "${_trainer_libparquet}" NAME)
add_library(trainer::parquet SHARED IMPORTED)
set_target_properties(trainer::parquet PROPERTIES IMPORTED_LOCATION "${_trainer_libparquet}"
                      IMPORTED_SONAME "${_trainer_soname}"
                      INTERFACE_LINK_LIBRARIES trainer::arrow_lib)
add_library(trainer::arrow INTERFACE IMPORTED)
set_target_properties(trainer::arrow PROPERTIES
                      INTERFACE_INCLUDE_DIRECTORIES "${TRAINER_ARROW_INCLUDE_DIR}"
                      INTERFACE_LINK_LIBRARIES trainer::parquet)

# Installed binaries find the libraries where they were built against (cmake --install).
set(TRAINER_ARROW_RPATH "${TRAINER_ARROW_LIBRARY_DIR}")

function(trainer_arrow_sources)
  cmake_parse_arguments(ARG "" "TARGET" "SOURCES" ${ARGN})
  # -isystem: Arrow's headers are not held to the project's warnings (-Wall -Wextra, -Werror).
  set_source_files_properties(${ARG_SOURCES} TARGET_DIRECTORY ${ARG_TARGET} PROPERTIES
    COMPILE_OPTIONS "-std=c++20;-isystem;${TRAINER_ARROW_INCLUDE_DIR}"
    SKIP_PRECOMPILE_HEADERS ON)
  target_link_libraries(${ARG_TARGET} PRIVATE trainer::parquet)
endfunction()
