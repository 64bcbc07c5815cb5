# The structure check (structure.cmake) itself: on a small tree that breaks
# each rule once it must fail and name every break; on the same tree made
# right it must pass.
# Run as: cmake -DCHECK=<structure.cmake> -DWORK=<scratch folder> -P structure_selftest.cmake
file(REMOVE_RECURSE ${WORK})
file(WRITE ${WORK}/include/stof.h "/* public */\n")
file(WRITE ${WORK}/core/base/error.h "#include \"stof.h\"\n")
file(WRITE ${WORK}/core/graph/graph.h "#include \"core/base/error.h\"\n#include \"core/exec/exec.h\"\n")
file(WRITE ${WORK}/core/exec/exec.h "#include \"core/graph/graph.h\"\n")
file(WRITE ${WORK}/core/exec/exec_impl.h "#include \"core/exec/exec.h\"\n")
file(WRITE ${WORK}/core/tune/tune.c "#include \"core/exec/exec_impl.h\"\n")
file(WRITE ${WORK}/core/stray/x.c "#include \"stof.h\"\n")
file(WRITE ${WORK}/kernels/a.cu "#include \"common.cuh\"\n")
file(WRITE ${WORK}/kernels/common.cuh "\n")

function(run_check out_rc out_text)
  execute_process(COMMAND ${CMAKE_COMMAND} -DSRC=${WORK} -P ${CHECK}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(${out_rc} ${rc} PARENT_SCOPE)
  set(${out_text} "${out}${err}" PARENT_SCOPE)
endfunction()

set(failures 0)
run_check(rc text)
if(rc EQUAL 0)
  message(SEND_ERROR "a tree that breaks the rules passed:\n${text}")
  math(EXPR failures "${failures} + 1")
endif()
foreach(want
    "core/graph/graph.h: includes core/exec/exec.h of core/exec/, a room above core/graph/"
    "core/tune/tune.c: includes core/exec/exec_impl.h, the executor's private header"
    "core/stray/x.c: in no room")
  string(FIND "${text}" "${want}" at)
  if(at LESS 0)
    message(SEND_ERROR "not reported: '${want}'\n${text}")
    math(EXPR failures "${failures} + 1")
  endif()
endforeach()

# Made right: the graph no longer reaches up, the tuner uses the public
# header, the stray file is gone.
file(WRITE ${WORK}/core/graph/graph.h "#include \"core/base/error.h\"\n")
file(WRITE ${WORK}/core/tune/tune.c "#include \"core/exec/exec.h\"\n")
file(REMOVE_RECURSE ${WORK}/core/stray)
run_check(rc text)
if(NOT rc EQUAL 0)
  message(SEND_ERROR "a tree in order failed:\n${text}")
  math(EXPR failures "${failures} + 1")
endif()

if(failures GREATER 0)
  message(FATAL_ERROR "${failures} failed, 0 passed")
endif()
message(STATUS "4 passed, 0 failed")
