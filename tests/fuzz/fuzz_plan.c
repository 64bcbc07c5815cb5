/* Fuzz target: the plan reader (core/plan/plan_read.c). Whatever the text,
 * it reads or says why; a plan that reads writes back to text that reads
 * again, and to the same text a second time (the writer and the strict
 * reader agree). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/plan/plan.h"
#include "fuzz.h"

/* An offline plan of a one-layer model: an attention segment and a GEMM
 * with its bias and GELU, a causal mask. */
static const char tiny_plan[] =
    "{\"format\":\"stof-plan\",\"version\":1,\"stof\":{\"version\":\"0.1.0\",\"commit\":\""
    "0123456789ab\"},\"device\":{\"name\":\"unmeasured\",\"arch\":\"sm_80\"},\"script\":"
    "{\"name\":\"tiny.lua\",\"hash\":\"0xb4a31f2f8dabde74\",\"params\":{},\"path\":\"tin"
    "y.lua\"},\"shapes\":{\"batch\":1,\"seq\":16,\"inputs\":[{\"name\":\"x\",\"shape\":[1,"
    "16,192]}]},\"masks\":[{\"description\":\"causal\",\"fingerprint\":\"0x4a20d94b6"
    "95ca124\",\"batch\":1,\"q_len\":16,\"k_len\":16}],\"sequences\":[{\"layer\":0,\"op"
    "s\":4,\"instances\":[0],\"scheme\":{\"binary\":\"0111\",\"hex\":\"4:7\"},\"ms\":0,\"se"
    "gments\":[{\"first\":0,\"last\":0,\"ops\":[\"attention\"],\"template\":\"attention"
    "_row\",\"params\":{\"ROWS_PER_WARP\":1,\"WARPS_PER_BLOCK\":4},\"kernel\":\"atten"
    "tion_row.cu\",\"ms\":0},{\"first\":1,\"last\":3,\"ops\":[\"gemm\",\"bias\",\"gelu\"],"
    "\"template\":\"gemm_epilogue\",\"params\":{\"BLOCK_M\":64,\"BLOCK_N\":128,\"BLOCK"
    "_K\":32,\"WARPS\":4,\"STAGES\":3,\"SPLIT_K\":1},\"kernel\":\"gemm_epilogue.cu\",\""
    "ms\":0}]}],\"latency_ms\":0,\"tuning_s\":0,\"search\":{\"settings_measured\":0,"
    "\"cache_hits\":0,\"schemes_tried\":0,\"schemes_kept\":0,\"rounds\":0}}";

const char *const fuzz_seeds[] = {tiny_plan, "{}", "{\"format\":\"stof-plan\",\"version\":1}",
                                  NULL};

const char *const fuzz_words[] = {"\"format\"", "\"version\"", "\"sequences\"", "\"segments\"",
                                  "\"masks\"", "\"params\"", "\"template\"", "\"first\"",
                                  "\"last\"", "\"ops\"", "\"instances\"", "\"binary\"",
                                  "\"gemm_ln\"", "\"attention_block\"", "\"cublaslt\"", "[]",
                                  "{}", ",", ":", "-1", "0", "1e400", "2147483648", "null",
                                  "true", "\"0x\"", NULL};

size_t fuzz_seed_bytes(int k, uint8_t *buf, size_t cap) {
    (void)k, (void)buf, (void)cap;
    return 0;
}

static int fail(const char *what, const char *detail) {
    fprintf(stderr, "fuzz_plan: %s: %s\n", what, detail);
    return 1;
}

int fuzz_one(const uint8_t *data, size_t size) {
    plan p, again;
    stof_error err = {0};
    if (plan_from_json((const char *)data, size, "fuzz.json", &p, &err) != STOF_OK)
        return err.msg[0] ? 0 : fail("an error without a message", "");
    char *t1 = NULL, *t2 = NULL;
    int bad = 0;
    if (plan_to_json(&p, &t1, &err) != STOF_OK)
        bad = fail("a plan that reads does not write", err.msg);
    else if (plan_from_json(t1, strlen(t1), "written.json", &again, &err) != STOF_OK)
        bad = fail("what the writer wrote does not read", err.msg);
    else {
        if (plan_to_json(&again, &t2, &err) != STOF_OK || strcmp(t1, t2) != 0)
            bad = fail("writing what was read back changes it", t2 ? t2 : err.msg);
        plan_free(&again);
    }
    free(t1);
    free(t2);
    plan_free(&p);
    return bad;
}
