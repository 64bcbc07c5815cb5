/* Plans: what a plan owns. Writing is in plan_write.c, strict reading in
 * plan_read.c, the fit checks in plan_fits.c, a search result as a plan in
 * plan_from_search.c. */
#include <stdlib.h>
#include <string.h>

#include "core/plan/plan.h"

void plan_free(plan *p) {
    if (!p)
        return;
    for (int i = 0; p->masks && i < p->n_masks; i++)
        free(p->masks[i].description);
    for (int i = 0; p->sequences && i < p->n_sequences; i++) {
        free(p->sequences[i].instances);
        free(p->sequences[i].segments);
    }
    free(p->inputs);
    free(p->masks);
    free(p->sequences);
    memset(p, 0, sizeof *p);
}
