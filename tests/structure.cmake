# The house rules, checked on every build's tests (ctest `structure`):
#
#  1. Data flows one way. Every source file belongs to one room, and the
#     rooms stand in the order below, from the ground up: a file may include
#     headers of its own room and of rooms below it, never of a room above.
#     So no circle of files can run across rooms.
#  2. The executor has one public header (core/exec/exec.h): its private
#     header core/exec/exec_impl.h is included only inside core/exec/.
#  3. Every file is in a known room: a new folder is placed in this order on
#     purpose (and in ../DESIGN.md's picture), not by accident.
#
# Run as: cmake -DSRC=<source tree> -P structure.cmake

# From the ground up. A path belongs to the longest room that prefixes it.
set(STOF_ROOMS
  include        # the public header, stof.h
  core/base      # errors, utilities, task pool, memo
  kernels        # CUDA sources; their *_abi.cuh are shared with the host
  core/gpu       # CUDA driver, device, NVRTC and its workers, embedded kernels, timer
  core/graph     # the operator graph (IR)
  ops            # the operator table, CPU reference, masks and their formats
  core/io        # safetensors, weights
  core/ref       # the CPU reference executor
  fusion         # schemes, templates, matching
  search         # the two-stage search (measures through search_backend)
  core/plan      # JSON plans
  core/exec/gemm       # the GEMM-family kernel planner
  core/exec/cublaslt   # the cuBLASLt planner
  core/exec/attention  # the attention kernel planner
  core/exec      # the executor (exec.h public, exec_impl.h private)
  core/tune      # the GPU cost backend of the search
  core/gen       # generation: the decode step, the KV cache, sampling, the loop
  core/lua       # scripts -> graph (sandboxed Lua): the front end, that nothing below needs
  core/api       # the C API (include/stof.h)
  core/cli       # the stof command
  tests)         # may include any header but exec_impl.h

set(EXEC_PRIVATE core/exec/exec_impl.h)

# The rank of path's room into out (-1 when it is in no room).
function(room_rank path out)
  set(best -1)
  set(best_len 0)
  set(i 0)
  foreach(room IN LISTS STOF_ROOMS)
    string(LENGTH "${room}/" len)
    string(SUBSTRING "${path}" 0 ${len} head)
    if(head STREQUAL "${room}/" AND len GREATER best_len)
      set(best ${i})
      set(best_len ${len})
    endif()
    math(EXPR i "${i} + 1")
  endforeach()
  set(${out} ${best} PARENT_SCOPE)
endfunction()

# What `#include "name"` in file refers to, relative to the source tree:
# names with a folder are from the tree's root (or include/ for stof.h),
# bare names from the including file's own folder.
function(resolve_include file name out)
  if(name STREQUAL "stof.h")
    set(${out} include/stof.h PARENT_SCOPE)
  elseif(name MATCHES "/")
    set(${out} "${name}" PARENT_SCOPE)
  else()
    get_filename_component(dir "${file}" DIRECTORY)
    set(${out} "${dir}/${name}" PARENT_SCOPE)
  endif()
endfunction()

file(GLOB_RECURSE files RELATIVE ${SRC}
     ${SRC}/include/*.h ${SRC}/core/*.c ${SRC}/core/*.h ${SRC}/ops/*.c ${SRC}/ops/*.h
     ${SRC}/fusion/*.c ${SRC}/fusion/*.h ${SRC}/search/*.c ${SRC}/search/*.h
     ${SRC}/kernels/*.cu ${SRC}/kernels/*.cuh ${SRC}/tests/*.c ${SRC}/tests/*.h)

set(problems "")
set(n_includes 0)
foreach(file IN LISTS files)
  room_rank("${file}" rank)
  if(rank LESS 0)
    string(APPEND problems "  ${file}: in no room of tests/structure.cmake\n")
    continue()
  endif()
  list(GET STOF_ROOMS ${rank} room)
  file(STRINGS ${SRC}/${file} lines REGEX "^[ \t]*#[ \t]*include[ \t]*\"")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*" "\\1" name "${line}")
    resolve_include("${file}" "${name}" target)
    math(EXPR n_includes "${n_includes} + 1")
    if(target STREQUAL "${EXEC_PRIVATE}")
      string(SUBSTRING "${file}" 0 10 head)
      if(NOT head STREQUAL "core/exec/")
        string(APPEND problems
               "  ${file}: includes ${EXEC_PRIVATE}, the executor's private header "
               "(use core/exec/exec.h)\n")
      endif()
    endif()
    room_rank("${target}" target_rank)
    if(target_rank LESS 0)
      continue() # a test's own header, a generated file: no room, no rule
    endif()
    if(target_rank GREATER rank)
      list(GET STOF_ROOMS ${target_rank} target_room)
      string(APPEND problems
             "  ${file}: includes ${target} of ${target_room}/, a room above ${room}/ "
             "(data flows one way: see tests/structure.cmake)\n")
    endif()
  endforeach()
endforeach()

list(LENGTH files n_files)
if(problems)
  message(FATAL_ERROR "structure: the house rules are broken:\n${problems}")
endif()
message(STATUS "structure: ${n_files} files, ${n_includes} includes, every one in order")
