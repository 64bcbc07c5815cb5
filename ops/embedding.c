/* The embedding gather: out[b, s] = word[ids[b, s]] + type[t] + pos[p], t the
 * token's type (type_ids[b, s]; without them row 0, single-segment inputs), p
 * its position (position_ids[b, s]: a decode step's tokens sit past the
 * cached ones; without them s).
 * BERT adds a token-type row and positions; GPT-2 adds positions only; T5
 * has word rows alone. */
#include <math.h>

#include "core/base/error.h"
#include "ops/ops_impl.h"

/* Input slots: ids, word, then the optional tables in this order. */
static int position_slot(const graph_op *op) {
    return op->attr.embedding.has_position ? 2 : -1;
}

static int type_slot(const graph_op *op) {
    return op->attr.embedding.has_type ? 2 + (op->attr.embedding.has_position != 0) : -1;
}

static int type_ids_slot(const graph_op *op) {
    return op->attr.embedding.has_type_ids ? type_slot(op) + 1 : -1;
}

static int expected_inputs(const graph_op *op) {
    return 2 + (op->attr.embedding.has_position != 0) + (op->attr.embedding.has_type != 0) +
           (op->attr.embedding.has_type_ids != 0 && op->attr.embedding.has_type != 0) +
           (op->attr.embedding.has_position_ids != 0 && op->attr.embedding.has_position != 0);
}

/* The position ids come last. */
static int position_ids_slot(const graph_op *op) {
    return op->attr.embedding.has_position_ids ? expected_inputs(op) - 1 : -1;
}

/* int32 in the shape of the ids. */
static int check_id_tensor(const graph_op *op, const graph_tensor *ids, const graph_tensor *t,
                           const char *role, stof_error *err) {
    if (t->dtype == STOF_I32 && t->ndim == 2 && t->shape[0] == ids->shape[0] &&
        t->shape[1] == ids->shape[1])
        return STOF_OK;
    char ts[OPS_TENSOR_STR_MAX], is[OPS_TENSOR_STR_MAX];
    return ops_fail(op, err, STOF_ERR_SHAPE, "%s %s must be int32 in the shape of the ids %s",
                    role, ops_tensor_str(t, ts, sizeof ts), ops_tensor_str(ids, is, sizeof is));
}

/* An optional table [rows, H] next to word [V, H]. */
static int check_table(const graph_op *op, const graph_tensor *word, const graph_tensor *t,
                       const char *role, stof_error *err) {
    int rc;
    if ((rc = ops_require_float(op, t, role, err)) ||
        (rc = ops_require_same_dtype(op, word, "word", t, role, err)) ||
        (rc = ops_require_rank(op, t, role, 2, 2, err)))
        return rc;
    if (t->shape[1] != word->shape[1]) {
        char ts[OPS_TENSOR_STR_MAX], ws[OPS_TENSOR_STR_MAX];
        return ops_fail(op, err, STOF_ERR_SHAPE,
                        "%s table %s has width %lld but word table %s has %lld", role,
                        ops_tensor_str(t, ts, sizeof ts), (long long)t->shape[1],
                        ops_tensor_str(word, ws, sizeof ws), (long long)word->shape[1]);
    }
    return STOF_OK;
}

static int check_positions_fit(const graph_op *op, const graph_tensor *ids,
                               const graph_tensor *pos, stof_error *err) {
    if (ids->shape[1] <= pos->shape[0])
        return STOF_OK;
    char is[OPS_TENSOR_STR_MAX], ps[OPS_TENSOR_STR_MAX];
    return ops_fail(op, err, STOF_ERR_SHAPE,
                    "ids %s have %lld positions but the position table %s holds %lld",
                    ops_tensor_str(ids, is, sizeof is), (long long)ids->shape[1],
                    ops_tensor_str(pos, ps, sizeof ps), (long long)pos->shape[0]);
}

static int check_ids(const graph_op *op, const graph_tensor *ids, stof_error *err) {
    if (ids->dtype != STOF_I32)
        return ops_fail(op, err, STOF_ERR_INVALID, "ids '%s' must be int32, got %s", ids->name,
                        stof_dtype_name(ids->dtype));
    return ops_require_rank(op, ids, "ids", 2, 2, err);
}

int ops_embedding_infer(OPS_INFER_ARGS) {
    if (op->n_inputs != expected_inputs(op))
        return ops_fail(op, err, STOF_ERR_INVALID,
                        "has_position = %d and has_type = %d call for %d inputs (ids, word%s%s), "
                        "got %d",
                        op->attr.embedding.has_position, op->attr.embedding.has_type,
                        expected_inputs(op), position_slot(op) >= 0 ? ", pos" : "",
                        type_slot(op) >= 0 ? ", type" : "", op->n_inputs);
    const graph_tensor *ids = ops_input(g, op, 0), *word = ops_input(g, op, 1);
    int rc;
    if ((rc = check_ids(op, ids, err)) || (rc = ops_require_float(op, word, "word", err)) ||
        (rc = ops_require_rank(op, word, "word", 2, 2, err)))
        return rc;
    if (position_slot(op) >= 0) {
        const graph_tensor *pos = ops_input(g, op, position_slot(op));
        if ((rc = check_table(op, word, pos, "position", err)) ||
            (!op->attr.embedding.has_position_ids &&
             (rc = check_positions_fit(op, ids, pos, err))))
            return rc;
    }
    if (op->attr.embedding.has_position_ids && position_slot(op) < 0)
        return ops_fail(op, err, STOF_ERR_INVALID, "position ids need the position table");
    if (position_ids_slot(op) >= 0 &&
        (rc = check_id_tensor(op, ids, ops_input(g, op, position_ids_slot(op)), "position ids",
                              err)))
        return rc;
    if (type_slot(op) >= 0 &&
        (rc = check_table(op, word, ops_input(g, op, type_slot(op)), "type", err)))
        return rc;
    if (op->attr.embedding.has_type_ids && type_slot(op) < 0)
        return ops_fail(op, err, STOF_ERR_INVALID, "token type ids need the token type table");
    if (type_ids_slot(op) >= 0 &&
        (rc = check_id_tensor(op, ids, ops_input(g, op, type_ids_slot(op)), "token type ids",
                              err)))
        return rc;
    out->dtype = word->dtype;
    out->ndim = 3;
    out->shape[0] = ids->shape[0];
    out->shape[1] = ids->shape[1];
    out->shape[2] = word->shape[1];
    return STOF_OK;
}

/* Bytes: the ids, the rows actually gathered (at most one read per distinct
 * row, not the whole vocabulary) and the output. */
void ops_embedding_cost(OPS_COST_ARGS) {
    const graph_tensor *ids = ops_input(g, op, 0), *word = ops_input(g, op, 1);
    double tokens = (double)graph_tensor_numel(ids), seq = (double)ids->shape[1];
    double width = (double)word->shape[1], vocab = (double)word->shape[0];
    double row_bytes = width * (double)stof_dtype_size(word->dtype);
    double rows = tokens < vocab ? tokens : vocab;
    int extra_tables = 0;
    if (position_slot(op) >= 0) {
        rows += seq; /* positions 0..S-1 */
        extra_tables++;
    }
    if (type_slot(op) >= 0) {
        rows += 1; /* type row 0 */
        extra_tables++;
    }
    const graph_tensor *y = ops_output(g, op);
    *flops = extra_tables * (double)graph_tensor_numel(y);
    *bytes = (double)graph_tensor_bytes(ids) + rows * row_bytes + (double)graph_tensor_bytes(y);
}

/* ids arrive as floats (see op_desc.ref): they must be exact integers in
 * [0, V). */
static int check_id(const graph_op *op, float id, int64_t b, int64_t s, int64_t vocab,
                    stof_error *err) {
    if (!isfinite(id) || id != floorf(id))
        return ops_fail(op, err, STOF_ERR_INVALID, "id %g at [%lld, %lld] is not an integer",
                        (double)id, (long long)b, (long long)s);
    if (id < 0.0f || id >= (float)vocab)
        return ops_fail(op, err, STOF_ERR_INVALID,
                        "id %.0f at [%lld, %lld] is outside the vocabulary [0, %lld)", (double)id,
                        (long long)b, (long long)s, (long long)vocab);
    return STOF_OK;
}

int ops_embedding_ref(OPS_REF_ARGS) {
    const graph_tensor *ids = ops_input(g, op, 0), *word = ops_input(g, op, 1);
    int64_t batch = ids->shape[0], seq = ids->shape[1];
    int64_t vocab = word->shape[0], width = word->shape[1];
    const float *pos = position_slot(op) >= 0 ? in[position_slot(op)] : NULL;
    const float *types = type_slot(op) >= 0 ? in[type_slot(op)] : NULL;
    const float *type_ids = type_ids_slot(op) >= 0 ? in[type_ids_slot(op)] : NULL;
    const float *pos_ids = position_ids_slot(op) >= 0 ? in[position_ids_slot(op)] : NULL;
    int64_t n_types = types ? ops_input(g, op, type_slot(op))->shape[0] : 0;
    int64_t n_pos = pos ? ops_input(g, op, position_slot(op))->shape[0] : 0;
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t s = 0; s < seq; s++) {
            float id = in[0][b * seq + s];
            int rc = check_id(op, id, b, s, vocab, err);
            if (!rc && type_ids)
                rc = check_id(op, type_ids[b * seq + s], b, s, n_types, err);
            if (!rc && pos_ids)
                rc = check_id(op, pos_ids[b * seq + s], b, s, n_pos, err);
            if (rc)
                return rc;
            int64_t p = pos_ids ? (int64_t)pos_ids[b * seq + s] : s;
            const float *w_row = in[1] + (int64_t)id * width;
            const float *type_row = types ? types + (type_ids ? (int64_t)type_ids[b * seq + s] : 0) *
                                                        width
                                          : NULL;
            float *y = out + (b * seq + s) * width;
            /* Hugging Face BERT's order: word + type, then + position. */
            for (int64_t j = 0; j < width; j++) {
                float v = w_row[j];
                if (type_row)
                    v += type_row[j];
                if (pos)
                    v += pos[p * width + j];
                y[j] = v;
            }
        }
    }
    return STOF_OK;
}
