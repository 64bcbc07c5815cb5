# The installed stof, as a user gets it: `cmake --install` into a fresh
# prefix, then the example of docs/example built against it by
# find_package(stof) (shared and static) and by pkg-config, and run.
# Run as: cmake -DBUILD=<build dir> -DSRC=<source tree> -DWORK=<scratch> [-DSANITIZE=ON]
#   -P install_test.cmake
# A sanitized stof is used by a program built with the same sanitizers.
file(REMOVE_RECURSE ${WORK})
set(prefix ${WORK}/prefix)
set(san_flags "")
if(SANITIZE)
  set(san_flags "-fsanitize=address,undefined -fno-omit-frame-pointer")
endif()
set(failures 0)
set(passes 0)

function(step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(SEND_ERROR "${name}: exit ${rc}\n${out}${err}")
    math(EXPR f "${failures} + 1")
    set(failures ${f} PARENT_SCOPE)
  else()
    math(EXPR p "${passes} + 1")
    set(passes ${p} PARENT_SCOPE)
  endif()
  set(step_output "${out}${err}" PARENT_SCOPE)
endfunction()

function(expect_output name pattern)
  if(NOT step_output MATCHES "${pattern}")
    message(SEND_ERROR "${name}: output does not match '${pattern}'\n${step_output}")
    math(EXPR f "${failures} + 1")
    set(failures ${f} PARENT_SCOPE)
  endif()
endfunction()

step(install ${CMAKE_COMMAND} --install ${BUILD} --prefix ${prefix})
foreach(f include/stof.h lib/libstof.so lib/libstof.a bin/stof lib/cmake/stof/stofConfig.cmake
          lib/pkgconfig/stof.pc share/stof/scripts/bert.lua share/stof/scripts/hf.lua)
  if(NOT EXISTS ${prefix}/${f})
    message(SEND_ERROR "install: ${f} is missing")
    math(EXPR failures "${failures} + 1")
  endif()
endforeach()

# find_package(stof)
step(configure ${CMAKE_COMMAND} -S ${SRC}/docs/example -B ${WORK}/example
     -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release "-DCMAKE_C_FLAGS=${san_flags}"
     "-DCMAKE_EXE_LINKER_FLAGS=${san_flags}")
step(build ${CMAKE_COMMAND} --build ${WORK}/example)
foreach(exe example example_static)
  step(${exe} ${WORK}/example/${exe})
  expect_output(${exe} "stof [0-9]+\\.[0-9]+\\.[0-9]+.*bigbird at 1024 tokens: [0-9.]+% of the pairs")
endforeach()
# the whole-model API on the installed script
step(example_model ${WORK}/example/example ${prefix}/share/stof/scripts/bert.lua preset=small
     layers=1 batch=1 seq=16 dtype=fp32 padding=true)
expect_output(example_model "input input_ids: int32, 16 values\ninput attention_mask: int32, 16 values \\(optional\\)\noutput [^:]+: 8192 values, first -?[0-9]")

# pkg-config, where it is installed
find_program(PKG_CONFIG pkg-config)
if(PKG_CONFIG)
  set(ENV{PKG_CONFIG_PATH} ${prefix}/lib/pkgconfig)
  execute_process(COMMAND ${PKG_CONFIG} --cflags --libs stof OUTPUT_VARIABLE flags
                  OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc)
  separate_arguments(flags UNIX_COMMAND "${san_flags} ${flags}")
  step(pkg_config_build cc ${SRC}/docs/example/example.c -o ${WORK}/example_pc ${flags})
  step(pkg_config_run ${WORK}/example_pc)
  expect_output(pkg_config_run "bigbird at 1024 tokens")
else()
  message(STATUS "install: pkg-config is not installed: the pkg-config build was skipped")
endif()

# the installed command finds its installed scripts for a model directory
file(MAKE_DIRECTORY ${WORK}/hf)
file(WRITE ${WORK}/hf/config.json "{\"model_type\": \"gpt2\", \"n_embd\": 64, \"n_layer\": 1,
  \"n_head\": 2, \"vocab_size\": 50, \"n_positions\": 32, \"layer_norm_epsilon\": 1e-5}")
file(WRITE ${WORK}/hf/model.safetensors "")
step(installed_scripts ${prefix}/bin/stof graph ${WORK}/hf --set batch=1 --set seq=8)
expect_output(installed_scripts "model gpt2 \\(gpt2.lua\\): 1 layers.*script ${prefix}/bin/../share/stof/scripts/gpt2.lua")

message(STATUS "install: ${passes} passed, ${failures} failed")
if(failures GREATER 0)
  message(FATAL_ERROR "install: ${failures} checks failed")
endif()
