# Finds libfabric (Debian: libfabric-dev) and defines Libfabric::Libfabric.
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(PC_LIBFABRIC QUIET libfabric)
endif()
find_path(Libfabric_INCLUDE_DIR rdma/fabric.h HINTS ${PC_LIBFABRIC_INCLUDE_DIRS})
find_library(Libfabric_LIBRARY NAMES fabric HINTS ${PC_LIBFABRIC_LIBRARY_DIRS})
set(Libfabric_VERSION ${PC_LIBFABRIC_VERSION})
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Libfabric
  REQUIRED_VARS Libfabric_LIBRARY Libfabric_INCLUDE_DIR
  VERSION_VAR Libfabric_VERSION)
if(Libfabric_FOUND AND NOT TARGET Libfabric::Libfabric)
  add_library(Libfabric::Libfabric UNKNOWN IMPORTED)
  set_target_properties(Libfabric::Libfabric PROPERTIES
    IMPORTED_LOCATION "${Libfabric_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${Libfabric_INCLUDE_DIR}")
endif()
mark_as_advanced(Libfabric_INCLUDE_DIR Libfabric_LIBRARY)
