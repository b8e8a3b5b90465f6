/* server/scrub.h — the artifact scrub: a thread that re-hashes every blob of the artifact
 * store every interval (storage/artstore.h art_scrub), so content that rotted on disk is
 * set aside and refused instead of being served as good, and logs what it found.
 */
#ifndef AC_SERVER_SCRUB_H
#define AC_SERVER_SCRUB_H

#include "storage/artstore.h"

typedef struct scrubber scrubber;

/* Start scrubbing `as` (borrowed; must outlive the scrubber) every interval_s seconds,
 * the first pass one interval after the start. interval_s 0: no thread, returns NULL
 * with err empty. Returns a new scrubber, or NULL with err. */
scrubber *scrub_start(artstore *as, long interval_s, char *err, size_t errlen);
/* Stop (a pass in progress finishes its current blob first) and free. NULL is fine. */
void scrub_stop(scrubber *s);

#endif
