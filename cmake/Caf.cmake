# CAF 0.17 ships no CMake or pkg-config files (DEPENDENCIES.md trap 1): import it by hand.
# The target names CAF::core / CAF::io match upstream CAF's own package.
find_path(CAF_INCLUDE_DIR caf/all.hpp REQUIRED)
find_library(CAF_CORE_LIB caf_core REQUIRED)
find_library(CAF_IO_LIB caf_io REQUIRED)
if(NOT TARGET CAF::core)
  add_library(CAF::core UNKNOWN IMPORTED)
  set_target_properties(CAF::core PROPERTIES IMPORTED_LOCATION ${CAF_CORE_LIB}
    INTERFACE_INCLUDE_DIRECTORIES ${CAF_INCLUDE_DIR} INTERFACE_LINK_LIBRARIES Threads::Threads)
  add_library(CAF::io UNKNOWN IMPORTED)
  set_target_properties(CAF::io PROPERTIES IMPORTED_LOCATION ${CAF_IO_LIB}
    INTERFACE_LINK_LIBRARIES CAF::core)
endif()
