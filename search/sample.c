/* Stage 2 (paper §4.4): reward-based parameter sampling on the chosen
 * schemes.
 *
 * Every segment of every sequence joins one pool, since the reward is time
 * saved in the whole forward pass. Each round measures a fixed number of
 * settings (round_samples): the first round splits it equally; later rounds
 * give half equally and half in proportion to each segment's reward, the
 * time its best setting saved in the round before (times the occurrences of
 * its sequence). A segment that keeps improving is worth sampling more; one
 * that stalled keeps a share, so it can still surprise. Settings are drawn
 * without replacement, continuing each segment's seeded order where stage 1
 * left it, and every draw goes through the cache. The stage stops at the
 * budget, at the time limit, after `patience` rounds without a gain (a
 * round whose savings stay under min_gain of the forward latency is none),
 * or when every segment has run out of settings. */
#include <math.h>
#include <stdlib.h>

#include "core/base/error.h"
#include "search/search_internal.h"

/* ---- shares --------------------------------------------------------------------- */

static int active_count(const int *room, int n) {
    int a = 0;
    for (int i = 0; i < n; i++)
        a += room[i] > 0;
    return a;
}

/* Spreads amount over the segments with room, one at a time starting at
 * `start`, so that remainders rotate between rounds. */
static void split_equal(const int *room, int n, int amount, int start, int *share) {
    int active = active_count(room, n);
    if (active == 0)
        return;
    int each = amount / active, rest = amount % active;
    for (int k = 0; k < n; k++) {
        int i = (start + k) % n;
        if (room[i] <= 0)
            continue;
        share[i] += each + (rest > 0);
        rest -= rest > 0;
    }
}

/* The place of segment i when the rewarded segments are ordered by reward,
 * largest first, the lower index first on ties. */
static int reward_rank(const double *reward, const int *room, int n, int i) {
    int rank = 0;
    for (int j = 0; j < n; j++)
        if (j != i && room[j] > 0 && reward[j] > 0 &&
            (reward[j] > reward[i] || (reward[j] == reward[i] && j < i)))
            rank++;
    return rank;
}

/* Floors of amount x reward / sum; the few units the floors leave go one
 * each to the most rewarded segments. */
static void split_reward(const double *reward, const int *room, int n, int amount, double sum,
                         int *share) {
    int given = 0;
    for (int i = 0; i < n; i++) {
        if (room[i] <= 0 || reward[i] <= 0)
            continue;
        int units = (int)floor(amount * (reward[i] / sum));
        share[i] += units;
        given += units;
    }
    int left = amount - given;
    for (int i = 0; i < n && left > 0; i++)
        if (room[i] > 0 && reward[i] > 0 && reward_rank(reward, room, n, i) < left)
            share[i]++;
}

/* Shares above a segment's room go to the others with room, the most
 * rewarded first. */
static void spill(const double *reward, const int *room, int n, int *share) {
    int excess = 0;
    for (int i = 0; i < n; i++) {
        if (share[i] > room[i]) {
            excess += share[i] - (room[i] > 0 ? room[i] : 0);
            share[i] = room[i] > 0 ? room[i] : 0;
        }
    }
    while (excess > 0) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if (share[i] < room[i] && (best < 0 || reward[i] > reward[best]))
                best = i;
        if (best < 0)
            return;
        int give = room[best] - share[best] < excess ? room[best] - share[best] : excess;
        share[best] += give;
        excess -= give;
    }
}

void search_allocate(const double *reward, const int *room, int n, int total, int round,
                     int *share) {
    double sum = 0;
    for (int i = 0; i < n; i++) {
        share[i] = 0;
        if (room[i] > 0 && reward[i] > 0)
            sum += reward[i];
    }
    if (n <= 0 || total <= 0 || active_count(room, n) == 0)
        return;
    int start = round % n;
    if (sum <= 0) {
        split_equal(room, n, total, start, share);
    } else {
        int equal = total / 2;
        split_equal(room, n, equal, start, share);
        split_reward(reward, room, n, total - equal, sum, share);
    }
    spill(reward, room, n, share);
}

/* ---- the rounds ------------------------------------------------------------------ */

typedef struct pool {
    int n;
    int *seq;          /* sequence of each segment */
    search_seg **seg;
    double *reward;
    int *room, *share;
} pool;

static void pool_free(pool *p) {
    free(p->seq);
    free(p->seg);
    free(p->reward);
    free(p->room);
    free(p->share);
}

static int pool_init(const search_ctx *c, search_state *states, pool *p, stof_error *err) {
    *p = (pool){0};
    for (int q = 0; q < c->n_seqs; q++)
        p->n += states[q].n_segs;
    size_t n = (size_t)(p->n ? p->n : 1);
    p->seq = err_malloc(sizeof *p->seq * n, err);
    p->seg = err_malloc(sizeof *p->seg * n, err);
    p->reward = err_calloc(n, sizeof *p->reward, err);
    p->room = err_malloc(sizeof *p->room * n, err);
    p->share = err_malloc(sizeof *p->share * n, err);
    if (!p->seq || !p->seg || !p->reward || !p->room || !p->share) {
        pool_free(p);
        return STOF_ERR_NOMEM;
    }
    int i = 0;
    for (int q = 0; q < c->n_seqs; q++)
        for (int k = 0; k < states[q].n_segs; k++, i++) {
            p->seq[i] = q;
            p->seg[i] = states[q].segs[k];
        }
    return STOF_OK;
}

/* Time saved by a segment in one round, in the whole forward pass. A
 * segment whose first setting ran only now saved what it costs. */
static double round_reward(double before, double after, int count) {
    if (isinf(after) || after >= before)
        return 0;
    return (isinf(before) ? after : before - after) * count;
}

/* The round's settings, every segment's share, in one call; after them a
 * guess at the next round's, so that the backend works on them while this
 * round is measured: each segment's next settings, as many as its share
 * now (rewards tend to last) and at least an equal share. The next round's
 * call replaces the guess. */
static int prepare_round(search_ctx *c, const pool *p, int total, stof_error *err) {
    search_prep *items = err_malloc(sizeof *items * (size_t)(2 * p->n + 1), err);
    if (!items)
        return STOF_ERR_NOMEM;
    int n = 0, active = active_count(p->room, p->n);
    int equal = active > 0 ? (total + active - 1) / active : 0;
    for (int i = 0; i < p->n; i++)
        if (p->share[i] > 0)
            items[n++] = (search_prep){p->seq[i], p->seg[i], p->seg[i]->cursor,
                                       p->seg[i]->cursor + p->share[i]};
    for (int i = 0; i < p->n; i++) {
        int from = p->seg[i]->cursor + p->share[i];
        int ahead = p->share[i] > equal ? p->share[i] : equal;
        if (p->room[i] > p->share[i])
            items[n++] = (search_prep){p->seq[i], p->seg[i], from, from + ahead};
    }
    int rc = search_prepare(c, items, n, err);
    free(items);
    return rc;
}

/* One round: the shares, then the samples. *gained when the segments' best
 * times fell by min_gain of the forward latency or more (any fall when
 * min_gain < 0). */
static int sample_round(search_ctx *c, pool *p, int round, int total, int *gained,
                        stof_error *err) {
    for (int i = 0; i < p->n; i++)
        p->room[i] = p->seg[i]->n_order - p->seg[i]->cursor;
    search_allocate(p->reward, p->room, p->n, total, round, p->share);
    int rc = prepare_round(c, p, total, err);
    if (rc)
        return rc;
    *gained = 0;
    double before_ms = search_total_ms(c), saved = 0;
    for (int i = 0; i < p->n; i++) {
        search_seg *s = p->seg[i];
        double before = s->best_ms;
        rc = search_seg_sample_to(c, p->seq[i], s, s->cursor + p->share[i], err);
        if (rc)
            return rc;
        p->reward[i] = round_reward(before, s->best_ms, c->seqs[p->seq[i]].count);
        saved += p->reward[i];
    }
    *gained = saved > 0 && (c->opt.min_gain < 0 || !isfinite(before_ms) ||
                            saved >= c->opt.min_gain * before_ms);
    return STOF_OK;
}

static int pool_has_room(const pool *p) {
    for (int i = 0; i < p->n; i++)
        if (p->seg[i]->cursor < p->seg[i]->n_order)
            return 1;
    return 0;
}

int search_sample(search_ctx *c, search_state *states, stof_error *err) {
    pool p;
    int rc = pool_init(c, states, &p, err);
    if (rc)
        return rc;
    int total = c->opt.round_samples > 0 ? c->opt.round_samples : 2 * p.n;
    for (int round = 0, idle = 0; !rc && idle < c->opt.patience; round++) {
        if (!pool_has_room(&p) || search_exhausted(c))
            break;
        int gained = 0;
        rc = sample_round(c, &p, round, total, &gained, err);
        c->stats.rounds++;
        idle = gained ? 0 : idle + 1;
        search_report(c);
    }
    pool_free(&p);
    return rc;
}
