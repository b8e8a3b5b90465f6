/* tests/unit/stage_fixture.h — for tests that run a job's stages through job_run: a job
 * store and an artifact store in a fresh temporary folder (dir, st, as), opened by
 * stage_fixture_open and removed by stage_fixture_close. Header-only: static functions.
 */
#ifndef AC_TESTS_STAGE_FIXTURE_H
#define AC_TESTS_STAGE_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>

#include "storage/artstore.h"
#include "storage/fileio.h"
#include "storage/store.h"

static char dir[64];
static store *st;
static artstore *as;

/* A folder made from tmpl ("/tmp/NAME-XXXXXX") holding t.db and art/. 0, or -1. */
static inline int stage_fixture_open(const char *tmpl)
{
    snprintf(dir, sizeof dir, "%s", tmpl);
    if (!mkdtemp(dir))
        return -1;
    char db[128], ad[128], err[256];
    snprintf(db, sizeof db, "%s/t.db", dir);
    snprintf(ad, sizeof ad, "%s/art", dir);
    st = store_open(db, err, sizeof err);
    as = art_open(ad, err, sizeof err);
    return st && as ? 0 : -1;
}

static inline int stage_fixture_close(void)
{
    store_close(st);
    art_close(as);
    return fio_remove_tree(dir);
}

#endif
