/* tests/tools/ac_st_copy.c — oracle helper: read a safetensors file (or sharded model
 * directory) with our reader and write every tensor with our writer in the given dtype.
 *   ac_st_copy IN OUT.safetensors F32|F16|BF16
 * Exit 1 with a message on any error. */
#include <stdio.h>
#include <stdlib.h>

#include "storage/safetensors.h"

int main(int argc, char **argv)
{
    char err[512];
    st_dtype dt;
    st_file f;
    if (argc != 4 || st_dtype_parse(argv[3], &dt)) {
        fprintf(stderr, "usage: ac_st_copy IN OUT.safetensors F32|F16|BF16\n");
        return 2;
    }
    if (st_open(&f, argv[1], err, sizeof err)) {
        fprintf(stderr, "ac_st_copy: %s\n", err);
        return 1;
    }
    st_write_tensor *ts = calloc((size_t)(f.n ? f.n : 1), sizeof *ts);
    int rc = ts ? 0 : 1;
    for (int i = 0; i < f.n && !rc; i++) {
        float *d = malloc((size_t)(f.t[i].numel ? f.t[i].numel : 1) * sizeof *d);
        if (!d || st_read_f32(&f, i, d, f.t[i].numel, err, sizeof err)) {
            fprintf(stderr, "ac_st_copy: %s\n", d ? err : "out of memory");
            free(d);
            rc = 1;
            break;
        }
        ts[i].name = f.t[i].name;
        ts[i].data = d;
        ts[i].ndim = f.t[i].ndim;
        for (int k = 0; k < f.t[i].ndim; k++)
            ts[i].shape[k] = f.t[i].shape[k];
    }
    if (!rc && st_write(argv[2], ts, f.n, dt, f.metadata, err, sizeof err)) {
        fprintf(stderr, "ac_st_copy: %s\n", err);
        rc = 1;
    }
    for (int i = 0; ts && i < f.n; i++)
        free((void *)ts[i].data);
    free(ts);
    st_close(&f);
    return rc;
}
