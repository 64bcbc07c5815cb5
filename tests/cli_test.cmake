# End-to-end checks of the `stof` command: exit codes, output and error text.
# Run by ctest as: cmake -DSTOF=... -DSRC=... -DWORK=... -P cli_test.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
set(failures 0)
set(passes 0)

# expect(NAME RC_EXPECTED "regex on stdout+stderr" ARGS...)
function(expect name want_rc pattern)
  execute_process(COMMAND ${STOF} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err WORKING_DIRECTORY ${SRC})
  set(all "${out}${err}")
  if(NOT rc STREQUAL "${want_rc}")
    message(SEND_ERROR "${name}: exit code ${rc}, expected ${want_rc}\n${all}")
    math(EXPR f "${failures} + 1")
    set(failures ${f} PARENT_SCOPE)
  elseif(NOT all MATCHES "${pattern}")
    message(SEND_ERROR "${name}: output does not match '${pattern}'\n${all}")
    math(EXPR f "${failures} + 1")
    set(failures ${f} PARENT_SCOPE)
  else()
    math(EXPR p "${passes} + 1")
    set(passes ${p} PARENT_SCOPE)
  endif()
  set(last_output "${all}" PARENT_SCOPE)
endfunction()

# same_tokens(WHAT A B): two runs' "sequence N: ..." lines are the same (and not empty)
function(same_tokens what a b)
  if(NOT a STREQUAL b OR a STREQUAL "")
    message(SEND_ERROR "${what}: ${a} != ${b}")
    math(EXPR f "${failures} + 1")
    set(failures ${f} PARENT_SCOPE)
  endif()
endfunction()

expect(version 0 "stof [0-9]+\\.[0-9]+\\.[0-9]+" version)
expect(help 0 "usage" help)
expect(no_command 2 "usage")
expect(help_tune 0 "usage:\n  stof tune SCRIPT.DIR" help tune)
expect(run_help 0 "usage:\n  stof run SCRIPT.DIR.*VALUES: --weights" run --help)
expect(plan_help 0 "usage:\n  stof plan show PLAN.json" plan show x.json -h)
expect(help_unknown 2 "no command 'frob' \\(stof help lists them\\)" help frob)
expect(unknown_command 2 "unknown command 'frobnicate'" frobnicate)
expect(info 0 "GPU" info)

set(small --set preset=small --set batch=1 --set seq=64)
expect(graph_bert 0 "attention.*total: [0-9.]+ GFLOP" graph scripts/bert.lua ${small})
expect(graph_gpt2 0 "attention" graph scripts/gpt2.lua --set batch=1 --set seq=32)
expect(graph_t5 0 "attention" graph scripts/t5.lua --set preset=t5-small --set batch=1 --set seq=32)

expect(run_cpu 0 "checksum: sum ([-+0-9.e]+)" run --cpu scripts/bert.lua ${small} --seed 3)
string(REGEX MATCH "checksum: [^\n]*" first "${last_output}")
expect(run_cpu_again 0 "checksum" run --cpu scripts/bert.lua ${small} --seed 3)
string(REGEX MATCH "checksum: [^\n]*" second "${last_output}")
if(NOT first STREQUAL second OR first STREQUAL "")
  message(SEND_ERROR "the same seed gave different checksums: '${first}' vs '${second}'")
  math(EXPR failures "${failures} + 1")
endif()
expect(run_other_seed 0 "checksum" run --cpu scripts/bert.lua ${small} --seed 4)
string(REGEX MATCH "checksum: [^\n]*" third "${last_output}")
if(first STREQUAL third)
  message(SEND_ERROR "different seeds gave the same checksum: '${first}'")
  math(EXPR failures "${failures} + 1")
endif()
# `stof run` without --cpu runs on the GPU; where there is none it says so.
execute_process(COMMAND ${STOF} info OUTPUT_VARIABLE info_out ERROR_QUIET WORKING_DIRECTORY ${SRC})
if(info_out MATCHES "GPU: none")
  expect(run_needs_gpu 1 "GPU execution needs a GPU.*stof run --cpu" run scripts/bert.lua ${small})
else()
  set(graph_line "CUDA graph: [0-9]+ dependencies, [0-9]+ of them programmatic")
  expect(run_profile 0
         "${graph_line}.*layers 0-3:\n  #[0-9]+ .* x4 .*profile: segments add up to [0-9.]+ ms"
         run scripts/bert.lua ${small} --profile --reps 3 --no-check)
endif()
expect(run_profile_cpu 1 "--profile times the GPU's kernels: it does not go with --cpu"
       run --cpu scripts/bert.lua ${small} --profile)
# Schemes are checked before the GPU is touched: the validator's reason on any machine.
expect(run_scheme_length 1 "--scheme 3:0 for layers 0-3 \\(14 ops\\):.*has 3 ops but the sequence has 14"
       run scripts/bert.lua ${small} --scheme 3:0)
expect(run_scheme_bad_hex 1 "--scheme 14:zzzz" run scripts/bert.lua ${small} --scheme 14:zzzz)
expect(run_scheme_invalid 1 "compute-intensive ops \\(at most 2\\)"
       run scripts/bert.lua ${small} --scheme 00000000000000)
expect(run_scheme_count 1 "3 --scheme options, but model t5-small has 2 layer classes"
       run scripts/t5.lua --set layers=1 --set batch=1 --set seq=32
       --scheme default --scheme unfused --scheme default)
expect(run_scheme_per_class 1 "--scheme 14:2238 for layers 0-1 \\(10 ops\\)"
       run scripts/t5.lua --set layers=2 --set batch=1 --set seq=32 --scheme 14:2238)
expect(run_fp32 1 "f16 or bf16" run scripts/gpt2.lua --set layers=1 --set dtype=fp32)
expect(run_bad_reps 2 "--reps expects an integer" run scripts/bert.lua --reps 0)

expect(mask_png 0 "density.*wrote" mask scripts/bert.lua --set mask=bigbird --set seq=1024
       --set batch=1 --png ${WORK}/mask.png --px 256)
if(NOT EXISTS ${WORK}/mask.png)
  message(SEND_ERROR "stof mask --png wrote no file")
  math(EXPR failures "${failures} + 1")
endif()

# Bad input: a clear message naming the file and line, a non-zero exit, no crash.
file(WRITE ${WORK}/syntax.lua "local m = stof.model{name = 'x'}\nlocal y = = 3\nreturn m\n")
expect(syntax_error 1 "syntax.lua:2:" graph ${WORK}/syntax.lua)
file(WRITE ${WORK}/shape.lua
  "local m = stof.model{name = 'x'}\n"
  "local x = m:input('x', {2, 8})\n"
  "local w = m:weight('w', {4, 6})\n"
  "local y = m:gemm(x, w)\n"
  "m:output(y)\nreturn m\n")
expect(shape_error 1 "shape.lua:4:.*gemm" graph ${WORK}/shape.lua)
expect(unknown_param 1 "nosuch" graph scripts/bert.lua --set nosuch=1)
expect(bad_param 1 "batch" graph scripts/bert.lua --set batch=abc)
expect(missing_script 1 "does-not-exist.lua" graph ${WORK}/does-not-exist.lua)
expect(bad_option 2 "unknown option" graph scripts/bert.lua --frob)
expect(set_without_value 2 "key=value" graph scripts/bert.lua --set batch)

# ---- values from safetensors files: --save-output, --weights, --inputs --------------------------
# The output of one run (a safetensors file with tensor "output" [2, 4]) is
# the weight and the input of the next.
file(WRITE ${WORK}/split.lua
  "local m = stof.model{name = 'split', dtype = 'fp32'}\n"
  "local x = m:input('x', {2, 4})\n"
  "local w = m:weight('w', {4, 4}, {from = {'a', 'b'}})\n"
  "m:output(m:gemm(x, w))\nreturn m\n")
file(WRITE ${WORK}/reload.lua
  "local m = stof.model{name = 'reload', dtype = 'fp32'}\n"
  "local x = m:input('output', {2, 4})\n"
  "local w = m:weight('w', {2, 4}, {from = {'output'}})\n"
  "m:output(m:gemm(x, w))\nreturn m\n")
file(WRITE ${WORK}/reshaped.lua
  "local m = stof.model{name = 'reshaped', dtype = 'fp32'}\n"
  "local x = m:input('output', {4, 2})\n"
  "m:output(m:relu(x))\nreturn m\n")
file(WRITE ${WORK}/junk.safetensors "not a safetensors file at all")
expect(save_output 0 "wrote .*out.safetensors \\(\"output\" \\[2, 4\\] fp32\\)"
       run --cpu ${WORK}/split.lua --save-output ${WORK}/out.safetensors)
expect(weights_reload 0 "weights: 1 tensors from .*out.safetensors \\(fp32\\).*inputs: 1 from"
       run --cpu ${WORK}/reload.lua --weights ${WORK}/out.safetensors
       --inputs ${WORK}/out.safetensors)
expect(weights_missing 1 "stof: .*out.safetensors: tensor 'a' missing \\(part 1 of 2 of weight 'w'\\)"
       run --cpu ${WORK}/split.lua --weights ${WORK}/out.safetensors)
expect(inputs_shape 1 "out.safetensors: tensor 'output' is \\[2, 4\\], expected \\[4, 2\\]"
       run --cpu ${WORK}/reshaped.lua --inputs ${WORK}/out.safetensors)
expect(weights_malformed 1 "junk.safetensors: header length [0-9]+ is not in"
       run --cpu ${WORK}/split.lua --weights ${WORK}/junk.safetensors)
expect(weights_no_file 1 "cannot read the safetensors file .*nothing.safetensors"
       run --cpu ${WORK}/split.lua --weights ${WORK}/nothing.safetensors)
# checked before the GPU is touched: the file's problem on any machine
expect(weights_gpu_missing 1 "out.safetensors: [0-9]+ problems: tensor 'embeddings.word_embeddings.weight' missing"
       run scripts/bert.lua ${small} --weights ${WORK}/out.safetensors)
expect(weights_bert_missing 1 "out.safetensors: [0-9]+ problems: tensor 'embeddings.word_embeddings.weight' missing"
       run --cpu scripts/bert.lua ${small} --weights ${WORK}/out.safetensors)

# ---- tune, plans -------------------------------------------------------------------------------
# A plan for an architecture other than the GPU's (or without a GPU) is made
# offline: the initial scheme, default settings, marked unmeasured.
expect(tune_offline_arch 0 "planning offline for sm_86.*wrote .*plan86.json: an UNMEASURED plan"
       tune scripts/bert.lua ${small} --arch sm_86 -o ${WORK}/plan86.json)
expect(plan_show_offline 0 "planned offline for sm_86: UNMEASURED.*scheme 14:[0-9a-f]+.*(attention_block|attention_row)"
       plan show ${WORK}/plan86.json)
if(info_out MATCHES "GPU: none")
  expect(tune_no_gpu 0 "no GPU to measure on.*UNMEASURED.*kernels for sm_90.*Nothing was measured"
         tune scripts/bert.lua ${small} -o ${WORK}/plan.json)
  expect(plan_show 0 "device: none, planned offline for sm_90.*bert.lua.*batch=1.*seq=64.*latency: unmeasured"
         plan show ${WORK}/plan.json)
  expect(run_plan_needs_gpu 1 "GPU execution needs a GPU" run ${WORK}/plan.json)
  expect(run_plan86_needs_gpu 1 "GPU execution needs a GPU" run ${WORK}/plan86.json)
else()
  expect(run_plan_other_arch 1 "does not fit this GPU: the plan was made offline for sm_86"
         run ${WORK}/plan86.json)
endif()
# The plan names its script; --script finds it elsewhere; a plan that does
# not fit its script (other shapes) is refused before the GPU is touched.
file(READ ${WORK}/plan86.json plan_text)
string(REGEX REPLACE "\"seq\":[ \t]*\"64\"" "\"seq\": \"32\"" other_seq "${plan_text}")
file(WRITE ${WORK}/other-seq.json "${other_seq}")
expect(run_plan_mismatch 1 "other-seq.json does not fit .*bert.lua: input input_ids is \\[1, 32\\]"
       run ${WORK}/other-seq.json)
expect(run_plan_wrong_script 1 "the plan is for script bert.lua, not gpt2.lua|gpt2.lua.*unknown parameter"
       run ${WORK}/plan86.json --script scripts/gpt2.lua)
expect(run_plan_set 2 "--set, --scheme and --cpu do not go with" run ${WORK}/plan86.json --set batch=2)
# Broken plan files: a format error naming the file, exit 1.
string(SUBSTRING "${plan_text}" 0 400 truncated)
file(WRITE ${WORK}/truncated.json "${truncated}")
expect(plan_show_truncated 1 "truncated.json: not valid JSON \\(line [0-9]+" plan show ${WORK}/truncated.json)
expect(run_plan_truncated 1 "truncated.json: not valid JSON" run ${WORK}/truncated.json)
expect(plan_show_missing 1 "cannot read the plan .*missing.json" plan show ${WORK}/missing.json)
expect(tune_needs_output 2 "needs -o PLAN.json" tune scripts/bert.lua ${small})
expect(tune_bad_budget 2 "--budget expects an integer" tune scripts/bert.lua --budget 0 -o ${WORK}/x.json)
expect(tune_bad_arch 1 "sm_12" tune scripts/bert.lua ${small} --arch sm_12 -o ${WORK}/x.json)
expect(plan_no_sub 2 "stof plan show PLAN.json" plan)
expect(plan_bad_sub 2 "unknown plan subcommand 'frob'" plan frob ${WORK}/plan86.json)

# ---- bad input: refused at once, with the path and what it is; nothing overwritten ----------------
expect(seed_negative 2 "--seed expects a non-negative integer, got '-1'"
       run --cpu scripts/bert.lua ${small} --seed -1)
expect(weights_twice 2 "--weights given twice" run --cpu scripts/bert.lua --weights a --weights b)
expect(script_is_dir 1 "scripts: a directory, not a script" graph scripts)
expect(script_is_device 1 "/dev/zero: a character device, not a script" graph /dev/zero)
expect(plan_is_device 1 "/dev/zero: a character device, not a plan" plan show /dev/zero)
execute_process(COMMAND mkfifo ${WORK}/fifo RESULT_VARIABLE fifo_rc)
if(fifo_rc EQUAL 0)
  expect(script_is_fifo 1 "fifo: a FIFO, not a script" graph ${WORK}/fifo)
  expect(weights_is_fifo 1 "fifo: a FIFO, not a safetensors file"
         run --cpu scripts/bert.lua ${small} --weights ${WORK}/fifo)
endif()
# --save-output over the checkpoint it reads: refused, the checkpoint kept
file(WRITE ${WORK}/keep.safetensors "the checkpoint")
expect(save_over_weights 2 "--save-output .*keep.safetensors is the file of --weights"
       run --cpu scripts/bert.lua ${small} --weights ${WORK}/keep.safetensors
       --save-output ${WORK}/./keep.safetensors)
file(READ ${WORK}/keep.safetensors kept)
if(NOT kept STREQUAL "the checkpoint")
  message(SEND_ERROR "save_over_weights: the checkpoint was changed")
  math(EXPR failures "${failures} + 1")
endif()
# a device as --save-output: refused, the device left in place
expect(save_to_device 1 "/dev/full: a character device, not a file stof may write"
       run --cpu scripts/bert.lua ${small} --save-output /dev/full)
if(NOT EXISTS /dev/full)
  message(SEND_ERROR "save_to_device: /dev/full is gone")
  math(EXPR failures "${failures} + 1")
endif()
# the plan's script is checked against the plan's hash before it runs
file(READ ${SRC}/scripts/bert.lua bert_text)
file(MAKE_DIRECTORY ${WORK}/changed)
file(WRITE ${WORK}/changed/bert.lua "${bert_text}\n-- changed\n")
expect(run_plan_changed_script 1 "changed/bert.lua is not the script the plan was made for"
       run ${WORK}/plan86.json --script ${WORK}/changed/bert.lua)

# ---- Hugging Face model directories ---------------------------------------------------------------
file(MAKE_DIRECTORY ${WORK}/hf-bert)
file(WRITE ${WORK}/hf-bert/config.json "{\"model_type\": \"bert\", \"architectures\": [\"BertModel\"],
  \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 2,
  \"intermediate_size\": 128, \"vocab_size\": 50, \"type_vocab_size\": 2,
  \"max_position_embeddings\": 32, \"layer_norm_eps\": 1e-12, \"hidden_act\": \"gelu\"}")
file(WRITE ${WORK}/hf-bert/model.safetensors "")
expect(dir_graph 0 "model bert.*encoder.layer.1.output.LayerNorm" graph ${WORK}/hf-bert --set batch=2 --set seq=16)
expect(dir_graph_masks 0 "attention masks: layers 0-1 dense" graph ${WORK}/hf-bert --set batch=2 --set seq=16)
expect(graph_masks_t5 0 "attention masks: layers 0-5 dense; layers 6-11 causal, cross dense" graph scripts/t5.lua)
expect(dir_seq_too_long 1 "seq 64 is longer than the model's 32 positions" graph ${WORK}/hf-bert --set seq=64)
expect(dir_preset 1 "preset: a model directory's config.json gives the sizes"
       graph ${WORK}/hf-bert --set preset=small)
# its weights are read from the folder: an empty model.safetensors is refused by name
expect(dir_weights_read 1 "hf-bert/model.safetensors: 0 bytes is too short"
       run --cpu ${WORK}/hf-bert --set batch=1 --set seq=8)
# an output over the directory's own files: refused, the checkpoint kept
expect(dir_save_over_weights 2 "--save-output .*hf-bert/model.safetensors is the file of the model directory"
       run --cpu ${WORK}/hf-bert --set batch=1 --set seq=8 --save-output ${WORK}/hf-bert/model.safetensors)
expect(dir_save_over_config 2 "is the file of the model directory's config"
       run --cpu ${WORK}/hf-bert --set batch=1 --set seq=8 --save-output ${WORK}/hf-bert/config.json)
file(MAKE_DIRECTORY ${WORK}/hf-falcon)
file(WRITE ${WORK}/hf-falcon/config.json "{\"model_type\": \"falcon\"}")
file(WRITE ${WORK}/hf-falcon/model.safetensors "")
expect(dir_unknown_type 1 "model_type 'falcon' is not one stof has a script for \\(it has: bert, roberta"
       graph ${WORK}/hf-falcon)
file(MAKE_DIRECTORY ${WORK}/hf-none)
file(COPY ${WORK}/hf-bert/config.json DESTINATION ${WORK}/hf-none)
expect(dir_no_weights 1 "has no model.safetensors or model.safetensors.index.json"
       run --cpu ${WORK}/hf-none --set batch=1 --set seq=8)
expect(dir_graph_no_weights 0 "model bert" graph ${WORK}/hf-none --set batch=1 --set seq=8)

# stof generate: the cached decode gives the tokens of recomputing every pass; sampling
# repeats from its seed; ragged prompts from a file; the errors a user meets
set(gen generate --cpu scripts/gpt2.lua --set layers=1 --set head=true --set padding=true
    --max-new-tokens 4)
expect(gen_cached 0 "sequence 0: 1,2,3 \\| [0-9]+,[0-9]+,[0-9]+,[0-9]+\n.*KV cache"
       ${gen} --prompt "1,2,3" --prompt "7 8")
string(REGEX MATCHALL "sequence [0-9]: [^\n]*" gen_tokens "${last_output}")
expect(gen_recompute 0 "no cache" ${gen} --prompt "1,2,3" --prompt "7 8" --recompute)
string(REGEX MATCHALL "sequence [0-9]: [^\n]*" gen_tokens_full "${last_output}")
same_tokens("gen: cached != recomputed" "${gen_tokens}" "${gen_tokens_full}")
file(WRITE ${WORK}/prompts.txt "# two prompts\n1, 2, 3\n\n7 8\n")
expect(gen_file 0 "sequence 1: 7,8 \\|" ${gen} --prompt-ids ${WORK}/prompts.txt)
string(REGEX MATCHALL "sequence [0-9]: [^\n]*" gen_tokens_file "${last_output}")
same_tokens("gen: --prompt != --prompt-ids" "${gen_tokens}" "${gen_tokens_file}")
expect(gen_sampled 0 "sampled \\(temperature 0.8, top-k 20, top-p 0.9, seed 5\\)"
       ${gen} --prompt "1,2" --temperature 0.8 --top-k 20 --top-p 0.9 --seed 5)
set(gen_sampled_once "${last_output}")
expect(gen_sampled_again 0 "sampled" ${gen} --prompt "1,2" --temperature 0.8 --top-k 20
       --top-p 0.9 --seed 5)
if(NOT gen_sampled_once STREQUAL last_output)
  string(REGEX REPLACE "in [0-9.]+ s \\([^)]*\\)" "" a "${gen_sampled_once}")
  string(REGEX REPLACE "in [0-9.]+ s \\([^)]*\\)" "" b "${last_output}")
  if(NOT a STREQUAL b)
    message(SEND_ERROR "gen: one seed, two samples:\n${a}\n${b}")
    math(EXPR failures "${failures} + 1")
  endif()
endif()
expect(gen_no_gpu 1 "no GPU .*--cpu runs the generation on the CPU reference"
       generate scripts/gpt2.lua --prompt 1)
expect(gen_recompute_gpu 1 "--recompute is the CPU reference.s" generate scripts/gpt2.lua
       --prompt 1 --recompute)
expect(gen_tune_cpu 1 "--tune-step tunes the GPU.s decode step" generate --cpu scripts/gpt2.lua
       --prompt 1 --tune-step 5)
expect(gen_tune_bad 2 "--tune-step expects seconds above 0, got '0'" generate --cpu
       scripts/gpt2.lua --prompt 1 --tune-step 0)
expect(gen_no_prompt 1 "needs prompts" ${gen})
expect(gen_bad_id 1 "--prompt 1: 'x' is not a token id" ${gen} --prompt "1,x")
file(WRITE ${WORK}/prompts.bad "1 2\n4 -3\n")
expect(gen_bad_file_id 1 "prompts.bad:2: '-3' is not a token id" ${gen}
       --prompt-ids ${WORK}/prompts.bad)
expect(gen_vocab 1 "prompt 0: token 50257 at 1 is outside the vocabulary \\[0, 50257\\)"
       ${gen} --prompt "1,50257")
expect(gen_no_head 1 "--set head=true" generate --cpu scripts/gpt2.lua --set layers=1
       --prompt "1,2")
expect(gen_ragged_no_mask 1 "need its attention_mask input \\(--set padding=true\\)"
       generate --cpu scripts/gpt2.lua --set layers=1 --set head=true --prompt "1,2"
       --prompt 3)
expect(gen_top_p 2 "--top-p expects a number" ${gen} --prompt 1 --top-p 0)

# stof tune --decode-batch: a decoder's decode steps kept in its plan (planned offline here),
# stof plan show lists them, stof generate PLAN.json runs the plan's model
set(tiny_dec scripts/gpt2.lua --set layers=1 --set head=true --set padding=true --set batch=2
    --set seq=16)
expect(tune_decode 0 "decode step, batch 1: planned offline for sm_90, unmeasured.*decode step, batch 2: planned offline.*wrote"
       tune ${tiny_dec} --decode-batch 1,2 -o ${WORK}/decode.json)
expect(plan_show_decode 0 "decode step, batch 1, caches of 16 positions: unmeasured\n.*attention_decode +SPLITS=1.*decode step, batch 2, caches of 16 positions"
       plan show ${WORK}/decode.json)
expect(gen_plan_cpu 0 "the plan.s decode steps are the GPU.s; the CPU reference runs its model.*sequence 1: 7,8 \\|"
       generate --cpu ${WORK}/decode.json --prompt "1,2,3" --prompt "7 8" --max-new-tokens 4)
string(REGEX MATCHALL "sequence [0-9]: [^\n]*" gen_tokens_plan "${last_output}")
same_tokens("gen: the script != the plan's model" "${gen_tokens}" "${gen_tokens_plan}")
expect(gen_plan_set 2 "a plan fixes the model.s parameters: --set does not go with"
       generate --cpu ${WORK}/decode.json --set layers=2 --prompt 1)
expect(gen_plan_gpu 1 "no GPU" generate ${WORK}/decode.json --prompt 1)
expect(tune_decode_list 2 "--decode-batch expects batch sizes from 1 to 65536 separated by commas"
       tune ${tiny_dec} --decode-batch 0 -o ${WORK}/x.json)
expect(tune_decode_sign 2 "--decode-batch expects batch sizes from 1 to 65536"
       tune ${tiny_dec} --decode-batch "+8" -o ${WORK}/x.json)
expect(tune_decode_twice 2 "--decode-batch names batch 8 twice"
       tune ${tiny_dec} --decode-batch 8,1,8 -o ${WORK}/x.json)
expect(tune_decode_context 2 "--decode-context sizes the caches of --decode-batch.s steps"
       tune ${tiny_dec} --decode-context 8 -o ${WORK}/x.json)
expect(tune_decode_no_head 1 "--decode-batch 1: the output 'ln_f' has 768 features for a vocabulary of 50257: not logits"
       tune scripts/gpt2.lua --set layers=1 --set batch=1 --set seq=16 --decode-batch 1
       -o ${WORK}/x.json)

message(STATUS "cli: ${passes} passed, ${failures} failed")
if(failures GREATER 0)
  message(FATAL_ERROR "cli: ${failures} checks failed")
endif()
