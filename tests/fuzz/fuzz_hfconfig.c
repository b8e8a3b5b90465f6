/* tests/fuzz/fuzz_hfconfig.c — libFuzzer target: bytes as an HF config.json through the
 * arch reader (storage/hfconfig.c). Besides crashes and sanitizer reports, these are
 * bugs: an accepted config whose arch does not validate, and a uniform arch that does
 * not come back unchanged through hfconfig_from_arch and the reader again. */
#include <stdint.h>
#include <stdlib.h>
#include <jansson.h>

#include "storage/hfconfig.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t je;
    json_t *j = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &je);
    if (!j)
        return 0;
    arch a;
    char err[256];
    if (hfconfig_to_arch(j, &a, err, sizeof err) == 0) {
        if (arch_validate(&a, err, sizeof err))
            abort();   /* accepted an invalid arch */
        json_t *back = hfconfig_from_arch(&a, "bfloat16", err, sizeof err);
        if (back) {
            arch b;
            if (hfconfig_to_arch(back, &b, err, sizeof err) || !arch_equal(&a, &b))
                abort();   /* our own config.json does not read back as the same arch */
            arch_free(&b);
            json_decref(back);
        }
        arch_free(&a);
    }
    json_decref(j);
    return 0;
}
