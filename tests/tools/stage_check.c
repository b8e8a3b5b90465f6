/* tests/tools/stage_check.c — `autocompress run` with the rank, prune and distill stages
 * registered (and load/search from jobs/stage_search.c), plus one test-only stage,
 * "test_fixed_arch", that stands in for the search: it copies the arch JSON named by
 * $AC_TEST_ARCH to <job>/search/arch.json. Lets tests/oracle/test_prune_stages.sh run
 * load -> rank -> prune -> distill as a real job. Not part of the product.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <jansson.h>

#include "jobs/stage.h"
#include "jobs/stages.h"
#include "server/cli.h"

void stage_rank_register(void);
void stage_prune_register(void);
void stage_distill_register(void);

static int file_exists_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int fixed_arch(job_ctx *ctx, char *err, size_t errlen)
{
    const char *src = getenv("AC_TEST_ARCH");
    json_error_t je;
    json_t *j = src ? json_load_file(src, JSON_REJECT_DUPLICATES, &je) : NULL;
    if (!j) {
        snprintf(err, errlen, "test_fixed_arch: $AC_TEST_ARCH unset or unreadable");
        return -1;
    }
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/search", job_ctx_dir(ctx));
    snprintf(path, sizeof path, "%s/arch.json", dir);
    int rc = (mkdir(dir, 0755) == 0 || file_exists_dir(dir)) && json_dump_file(j, path, JSON_SORT_KEYS) == 0 ? 0 : -1;
    json_decref(j);
    if (rc)
        snprintf(err, errlen, "test_fixed_arch: cannot write %s", path);
    return rc;
}

int main(int argc, char **argv)
{
    stages_search_register();
    stage_rank_register();
    stage_prune_register();
    stage_distill_register();
    stage_register("test_fixed_arch", fixed_arch);
    if (argc < 2) {
        fprintf(stderr, "usage: stage_check SPEC.json --out DIR (as autocompress run)\n");
        return 2;
    }
    return cli_run(argc, argv);
}
