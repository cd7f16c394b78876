# One libstdc++ per process.
#
# A compiler that links libstdc++ statically into shared libraries (a g++
# wrapper that adds -static-libstdc++, or a toolchain that ships only
# libstdc++.a) puts a second copy of it into _C. torch has already loaded
# the shared libstdc++.so.6 into the global scope, so the dynamic loader binds
# some of _C's references to that one and leaves others on the private copy:
# the two halves disagree on the locale's facet ids, and the first integer
# written to a std::ostream prints nothing or crashes. That crashed every
# smddp log line on a lent GPU machine whose CXX was such a g++.
#
# smddp_use_shared_libstdcxx(target) links a probe module the way the target
# will be linked and looks for std::locale::classic() among its exported
# symbols, which only a static copy defines. Where it finds one, it links the
# target against the shared libstdc++.so.6 the compiler names (-nostdlib++,
# GCC 13 and clang), or, where that cannot link, keeps the copy private to the
# target (--exclude-libs), so every reference binds inside it. Where neither
# works, the configure fails and says why.
#
# tests/python/test_static_libstdcxx.py builds a module with such a wrapper,
# with and without this, and loads it after torch.

set(SMDDP_LIBSTDCXX_PROBE_SOURCE "${CMAKE_CURRENT_LIST_DIR}/libstdcxx_probe.cc")

# Sets ${out} to TRUE when the probe links with these extra flags and
# exports no libstdc++ of its own, FALSE when it links but exports one, and
# to "" when it does not link.
function(_smddp_probe_libstdcxx out name)
  set(dir "${CMAKE_BINARY_DIR}/libstdcxx-probe")
  file(MAKE_DIRECTORY "${dir}")
  separate_arguments(flags UNIX_COMMAND "${CMAKE_CXX_FLAGS} ${CMAKE_SHARED_LINKER_FLAGS}")
  execute_process(
    COMMAND ${CMAKE_CXX_COMPILER} ${flags} -shared -fPIC "${SMDDP_LIBSTDCXX_PROBE_SOURCE}" ${ARGN}
            -o "${dir}/${name}.so"
    RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT rc EQUAL 0)
    set(${out} "" PARENT_SCOPE)
    return()
  endif()
  execute_process(COMMAND ${CMAKE_NM} -D --defined-only "${dir}/${name}.so"
                  OUTPUT_VARIABLE syms RESULT_VARIABLE rc ERROR_QUIET)
  if(NOT rc EQUAL 0)
    set(${out} "" PARENT_SCOPE)
  elseif(syms MATCHES "_ZNSt6locale7classicEv")
    set(${out} FALSE PARENT_SCOPE)
  else()
    set(${out} TRUE PARENT_SCOPE)
  endif()
endfunction()

function(smddp_use_shared_libstdcxx target)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang" OR NOT CMAKE_NM)
    return()
  endif()
  _smddp_probe_libstdcxx(plain plain)
  if(NOT plain STREQUAL "FALSE")
    return()  # shared already (or the probe could not tell: the build will)
  endif()
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so.6
                  OUTPUT_VARIABLE so6 OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(IS_ABSOLUTE "${so6}" AND EXISTS "${so6}")
    _smddp_probe_libstdcxx(shared shared -nostdlib++ "${so6}")
    if(shared STREQUAL "TRUE")
      message(STATUS "torch-smddp build: ${CMAKE_CXX_COMPILER} links libstdc++ statically into "
                     "shared libraries; ${target} links ${so6} instead")
      target_link_options(${target} PRIVATE -nostdlib++)
      target_link_libraries(${target} PRIVATE "${so6}")
      return()
    endif()
  endif()
  set(private "-Wl,--exclude-libs,libstdc++.a:libsupc++.a")
  _smddp_probe_libstdcxx(hidden hidden "${private}")
  if(hidden STREQUAL "TRUE")
    message(STATUS "torch-smddp build: ${CMAKE_CXX_COMPILER} links libstdc++ statically into "
                   "shared libraries; ${target} keeps its copy private (--exclude-libs)")
    target_link_options(${target} PRIVATE "${private}")
    return()
  endif()
  message(FATAL_ERROR
    "torch-smddp: ${CMAKE_CXX_COMPILER} links libstdc++ statically into shared libraries, "
    "and neither -nostdlib++ with the shared libstdc++.so.6 nor --exclude-libs links: a second "
    "libstdc++ beside torch's breaks every std::ostream in ${target}. Build with a compiler "
    "that links libstdc++ dynamically (CXX=g++, the system's).")
endfunction()
