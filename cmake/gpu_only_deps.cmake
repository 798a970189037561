# TROUPE_GPU_ONLY: GoogleTest and nlohmann_json on a machine without our Debian packages (the lent
# GPU machine: CUDA, CMake and ninja, nothing else, no network). Included by the top-level
# CMakeLists.txt. Each package is taken from find_package when installed, else from a source or
# include folder (scripts/device-deps copies Debian's into .device-deps/). The folders' own
# find_package(GTest REQUIRED) and find_package(nlohmann_json 3 REQUIRED) calls then find the
# targets made here through CMake's package redirects folder (CMAKE_FIND_PACKAGE_REDIRECTS_DIR,
# searched first by every find_package since CMake 3.24), so they stay as the normal build has
# them. TROUPE_USE_DEVICE_DEPS=ON skips find_package and takes the folders even where the
# packages are installed (bench/gpu/run.sh does, so that this machine builds what the GPU machine
# builds).

# Stale redirects of an earlier configure would make the find_package calls below succeed.
file(REMOVE "${CMAKE_FIND_PACKAGE_REDIRECTS_DIR}/gtest-config.cmake"
  "${CMAKE_FIND_PACKAGE_REDIRECTS_DIR}/nlohmann_json-config.cmake"
  "${CMAKE_FIND_PACKAGE_REDIRECTS_DIR}/nlohmann_json-config-version.cmake")

if(NOT TROUPE_USE_DEVICE_DEPS)
  find_package(GTest QUIET)
endif()
if(GTest_FOUND)
  message(STATUS "troupe: GoogleTest from find_package")
else()
  if(NOT TROUPE_GTEST_SOURCE OR NOT EXISTS "${TROUPE_GTEST_SOURCE}/googletest/CMakeLists.txt")
    message(FATAL_ERROR "TROUPE_GPU_ONLY: GoogleTest is not installed; give its source tree with "
      "-DTROUPE_GTEST_SOURCE=DIR (DIR/googletest/CMakeLists.txt; scripts/device-deps copies "
      "/usr/src/googletest to .device-deps/googletest). Got '${TROUPE_GTEST_SOURCE}'.")
  endif()
  set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  # SYSTEM: our -Wall -Wextra -Werror never apply to googletest's headers.
  add_subdirectory("${TROUPE_GTEST_SOURCE}" "${CMAKE_BINARY_DIR}/_deps/googletest"
    EXCLUDE_FROM_ALL SYSTEM)
  # googletest's CMakeLists.txt makes GTest::gtest and GTest::gtest_main (aliases, global).
  file(WRITE "${CMAKE_FIND_PACKAGE_REDIRECTS_DIR}/gtest-config.cmake"
    "# Written by cmake/gpu_only_deps.cmake: GTest::gtest and GTest::gtest_main are built from\n"
    "# ${TROUPE_GTEST_SOURCE}.\n")
  message(STATUS "troupe: GoogleTest built from ${TROUPE_GTEST_SOURCE}")
endif()

if(NOT TROUPE_USE_DEVICE_DEPS)
  find_package(nlohmann_json 3 QUIET)
endif()
if(nlohmann_json_FOUND)
  message(STATUS "troupe: nlohmann_json from find_package")
else()
  if(NOT TROUPE_JSON_INCLUDE OR NOT EXISTS "${TROUPE_JSON_INCLUDE}/nlohmann/json.hpp")
    message(FATAL_ERROR "TROUPE_GPU_ONLY: nlohmann_json is not installed; give the folder that "
      "holds nlohmann/json.hpp with -DTROUPE_JSON_INCLUDE=DIR (scripts/device-deps copies it to "
      ".device-deps/include). Got '${TROUPE_JSON_INCLUDE}'.")
  endif()
  # The version macros are in json.hpp up to 3.10, in detail/abi_macros.hpp from 3.11 on.
  set(troupe_json_major "")
  foreach(f json.hpp detail/abi_macros.hpp)
    if(NOT troupe_json_major AND EXISTS "${TROUPE_JSON_INCLUDE}/nlohmann/${f}")
      file(STRINGS "${TROUPE_JSON_INCLUDE}/nlohmann/${f}" troupe_json_major
        REGEX "^#define NLOHMANN_JSON_VERSION_MAJOR +[0-9]+")
      string(REGEX REPLACE "^#define NLOHMANN_JSON_VERSION_MAJOR +([0-9]+).*$" "\\1"
        troupe_json_major "${troupe_json_major}")
    endif()
  endforeach()
  if(NOT troupe_json_major STREQUAL "3")
    message(FATAL_ERROR "TROUPE_GPU_ONLY: ${TROUPE_JSON_INCLUDE}/nlohmann/json.hpp is not "
      "nlohmann_json 3 (major version '${troupe_json_major}')")
  endif()
  add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED GLOBAL)
  set_target_properties(nlohmann_json::nlohmann_json PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${TROUPE_JSON_INCLUDE}")
  file(WRITE "${CMAKE_FIND_PACKAGE_REDIRECTS_DIR}/nlohmann_json-config.cmake"
    "# Written by cmake/gpu_only_deps.cmake: nlohmann_json::nlohmann_json is the header folder\n"
    "# ${TROUPE_JSON_INCLUDE}.\n")
  file(WRITE "${CMAKE_FIND_PACKAGE_REDIRECTS_DIR}/nlohmann_json-config-version.cmake"
    "set(PACKAGE_VERSION ${troupe_json_major})\n"
    "if(PACKAGE_FIND_VERSION_MAJOR STREQUAL \"${troupe_json_major}\")\n"
    "  set(PACKAGE_VERSION_COMPATIBLE TRUE)\n"
    "endif()\n")
  message(STATUS "troupe: nlohmann_json headers from ${TROUPE_JSON_INCLUDE}")
endif()
