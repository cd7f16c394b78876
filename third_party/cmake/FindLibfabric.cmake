# Finds libfabric and defines Libfabric::Libfabric, looking in this order
# (docs/install.md, "libfabric"):
#   1. SMDDP_LIBFABRIC_ROOT, then LIBFABRIC_ROOT (a CMake variable or an
#      environment variable of that name): a prefix the user names, which
#      must hold include/rdma/fabric.h and lib64/ or lib/libfabric.so; a
#      named prefix without them is an error, never a silent fallback;
#   2. /opt/amazon/efa, where AWS's EFA installer puts the libfabric that
#      has the efa provider;
#   3. pkg-config (Debian: libfabric-dev), then the compiler's default paths.
# Sets Libfabric_ORIGIN (which of these it took), Libfabric_LIBRARY (the
# file linked) and Libfabric_VERSION (from fabric.h).
# Found afresh at every configure (it is cheap): the user may have named
# another prefix, or none, since the cache was written.
unset(Libfabric_INCLUDE_DIR CACHE)
unset(Libfabric_LIBRARY CACHE)
set(_lf_root "")
foreach(_lf_var SMDDP_LIBFABRIC_ROOT LIBFABRIC_ROOT)
  if(NOT _lf_root)
    if(${_lf_var})
      set(_lf_root "${${_lf_var}}")
      set(Libfabric_ORIGIN "${_lf_var}=${${_lf_var}}")
    elseif(DEFINED ENV{${_lf_var}} AND NOT "$ENV{${_lf_var}}" STREQUAL "")
      set(_lf_root "$ENV{${_lf_var}}")
      set(Libfabric_ORIGIN "${_lf_var}=$ENV{${_lf_var}}")
    endif()
  endif()
endforeach()
if(NOT _lf_root AND EXISTS /opt/amazon/efa/include/rdma/fabric.h)
  set(_lf_root /opt/amazon/efa)
  set(Libfabric_ORIGIN "/opt/amazon/efa (AWS's EFA installer)")
endif()

if(_lf_root)
  # Only this prefix: a libfabric the user named must not lose to the system's.
  find_path(Libfabric_INCLUDE_DIR rdma/fabric.h PATHS ${_lf_root}/include NO_DEFAULT_PATH)
  find_library(Libfabric_LIBRARY NAMES fabric libfabric.so.1
               PATHS ${_lf_root}/lib64 ${_lf_root}/lib ${_lf_root}/lib/${CMAKE_LIBRARY_ARCHITECTURE}
               NO_DEFAULT_PATH)
  if(NOT Libfabric_INCLUDE_DIR OR NOT Libfabric_LIBRARY)
    message(FATAL_ERROR "libfabric: ${Libfabric_ORIGIN} holds no usable libfabric: it needs "
            "${_lf_root}/include/rdma/fabric.h (found: ${Libfabric_INCLUDE_DIR}) and "
            "libfabric.so in ${_lf_root}/lib64 or ${_lf_root}/lib (found: ${Libfabric_LIBRARY}). "
            "Point it at the prefix that holds both (the EFA installer's is /opt/amazon/efa), "
            "or unset it to use pkg-config's libfabric.")
  endif()
else()
  set(Libfabric_ORIGIN "pkg-config")
  find_package(PkgConfig QUIET)
  if(PKG_CONFIG_FOUND)
    pkg_check_modules(PC_LIBFABRIC QUIET libfabric)
  endif()
  if(NOT PC_LIBFABRIC_FOUND)
    set(Libfabric_ORIGIN "the compiler's default paths")
  endif()
  find_path(Libfabric_INCLUDE_DIR rdma/fabric.h HINTS ${PC_LIBFABRIC_INCLUDE_DIRS})
  find_library(Libfabric_LIBRARY NAMES fabric HINTS ${PC_LIBFABRIC_LIBRARY_DIRS})
endif()

set(Libfabric_VERSION "")
if(Libfabric_INCLUDE_DIR AND EXISTS ${Libfabric_INCLUDE_DIR}/rdma/fabric.h)
  file(STRINGS ${Libfabric_INCLUDE_DIR}/rdma/fabric.h _lf_lines
       REGEX "^#define FI_(MAJOR|MINOR)_VERSION[ \t]+[0-9]+")
  foreach(_lf_line ${_lf_lines})
    if(_lf_line MATCHES "FI_MAJOR_VERSION[ \t]+([0-9]+)")
      set(_lf_major ${CMAKE_MATCH_1})
    elseif(_lf_line MATCHES "FI_MINOR_VERSION[ \t]+([0-9]+)")
      set(_lf_minor ${CMAKE_MATCH_1})
    endif()
  endforeach()
  if(DEFINED _lf_major AND DEFINED _lf_minor)
    set(Libfabric_VERSION "${_lf_major}.${_lf_minor}")
  endif()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(Libfabric
  REQUIRED_VARS Libfabric_LIBRARY Libfabric_INCLUDE_DIR
  VERSION_VAR Libfabric_VERSION)
if(Libfabric_FOUND AND NOT TARGET Libfabric::Libfabric)
  add_library(Libfabric::Libfabric UNKNOWN IMPORTED)
  set_target_properties(Libfabric::Libfabric PROPERTIES
    IMPORTED_LOCATION "${Libfabric_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${Libfabric_INCLUDE_DIR}")
  message(STATUS "libfabric ${Libfabric_VERSION}: ${Libfabric_LIBRARY} (from ${Libfabric_ORIGIN})")
endif()
mark_as_advanced(Libfabric_INCLUDE_DIR Libfabric_LIBRARY)
