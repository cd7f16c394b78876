# Finds NCCL (the nvidia-nccl-cu13 wheel that CUDA builds of torch bring, or
# a system install) and defines NCCL::NCCL. Hints: NCCL_ROOT, and
# SMDDP_SITE_PACKAGES (the interpreter's site-packages, whose
# nvidia/nccl/{include,lib} the wheel fills).
set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT})
if(SMDDP_SITE_PACKAGES)
  list(APPEND _nccl_hints ${SMDDP_SITE_PACKAGES}/nvidia/nccl)
endif()
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include)
# The wheel ships libnccl.so.2 only (no libnccl.so link).
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nccl_hints} PATH_SUFFIXES lib lib64)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR)
if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
