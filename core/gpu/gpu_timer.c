/* The one GPU timer (gpu_timer.h). */
#include "core/gpu/gpu_timer.h"

#include <stdlib.h>

#include "core/base/error.h"
#include "core/base/util.h"

int gpu_timer_create(const cuda_driver *drv, gpu_timer *t, stof_error *err) {
    *t = (gpu_timer){.drv = drv};
    int rc = cuda_check(drv, drv->EventCreate(&t->start, CU_EVENT_DEFAULT), "cuEventCreate", err);
    if (!rc)
        rc = cuda_check(drv, drv->EventCreate(&t->stop, CU_EVENT_DEFAULT), "cuEventCreate", err);
    if (rc)
        gpu_timer_free(t);
    return rc;
}

void gpu_timer_free(gpu_timer *t) {
    if (t->drv && t->start)
        t->drv->EventDestroy(t->start);
    if (t->drv && t->stop)
        t->drv->EventDestroy(t->stop);
    t->start = t->stop = NULL;
}

int gpu_timer_once(gpu_timer *t, CUstream st, gpu_timer_work work, void *ud, double *ms,
                   stof_error *err) {
    const cuda_driver *drv = t->drv;
    float elapsed = 0;
    *ms = 0;
    int rc = cuda_check(drv, drv->EventRecord(t->start, st), "cuEventRecord", err);
    if (!rc)
        rc = work(ud, st, err);
    if (!rc)
        rc = cuda_check(drv, drv->EventRecord(t->stop, st), "cuEventRecord", err);
    if (!rc)
        rc = cuda_check(drv, drv->EventSynchronize(t->stop), "cuEventSynchronize", err);
    if (!rc)
        rc = cuda_check(drv, drv->EventElapsedTime(&elapsed, t->start, t->stop),
                        "cuEventElapsedTime", err);
    *ms = elapsed;
    return rc;
}

int gpu_timer_median(gpu_timer *t, CUstream st, int warmup, int reps, gpu_timer_work work,
                     void *ud, double *median_ms, double *runs, stof_error *err) {
    *median_ms = 0;
    if (reps < 1)
        return err_set(err, STOF_ERR_INVALID, "timing needs at least one run, got %d", reps);
    double *ms = err_malloc(sizeof *ms * (size_t)reps, err);
    if (!ms)
        return STOF_ERR_NOMEM;
    int rc = STOF_OK;
    for (int i = 0; !rc && i < warmup; i++)
        rc = work(ud, st, err);
    for (int r = 0; !rc && r < reps; r++)
        rc = gpu_timer_once(t, st, work, ud, &ms[r], err);
    if (!rc) {
        for (int r = 0; runs && r < reps; r++)
            runs[r] = ms[r];
        *median_ms = util_median(ms, reps);
    }
    free(ms);
    return rc;
}
