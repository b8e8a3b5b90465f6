/* compress/servecheck.h — a search checked where the result will be served: the parent
 * served at the start anchors the tables to the machine's speed now, and the archs the
 * search settles on are served beside the parent before they are returned
 * (compress/dnas.h repairs one the measurement puts over a limit). A llama.cpp target
 * serves each model in fresh helper processes, the built-in engine in fresh processes of
 * its own (`autocompress measure`, compress/measure.h ms_measure_fresh), as the measure
 * stage does. Tables imported from another engine are not checked here
 * (method_served_target).
 *
 * Why: a calibration's tables are right in their ratios (an arch against the parent)
 * far more often than in their level. A shared or burstable host runs 10-40% faster or
 * slower from one half hour to the next (bench/results/llamacpp_target.md), and a job
 * may reuse a calibration made days before. The anchor scales each phase of the tables
 * by the parent's measured over predicted time, divided by the parent's bias (the tables'
 * parent_bias: how much further from the tables its calibration served the parent than the
 * fit archs, which a search's archs resemble); a check serves the arch and the parent
 * alternating, round by round, and prices the arch as the median of its ratios to
 * the parent times the parent's latency at the anchor, so a machine whose speed moves
 * between the anchor and the check moves both sides alike.
 */
#ifndef AC_COMPRESS_SERVECHECK_H
#define AC_COMPRESS_SERVECHECK_H

#include <stddef.h>
#include <jansson.h>

#include "compress/costmodel.h"
#include "engine/arch.h"
#include "engine/backend.h"

#define SC_ROUNDS 3   /* servings per model at the anchor and at each check, each a fresh
                         process (a warm-up and 3 requests) */

typedef struct {
    cm_target t;                /* the target (llama.cpp: resolved) */
    const arch *parent;         /* borrowed */
    int builtin;                /* 1: the built-in engine (autocompress measure), 0: llama.cpp */
    char dir[4096], ppath[4400];/* llama.cpp: scratch folder, the parent's GGUF */
    double parent_ms, parent_prefill_ms, parent_decode_ms;   /* the anchor's medians */
    double quiet_wait_s;        /* sc_open: MS_QUIET_WAIT_S (sc_anchor's ms_run_quiet) */
    json_t *doc;                /* {anchor, anchor_tries, checks, check_tries} */
    /* Optional (sc_open's): non-zero stops a serving under way (ms_opts), and the anchor
     * or check then fails with err "cancelled". */
    int (*cancelled)(void *ud);
    void *cancel_ud;
} sc_check;

/* Ready a check of target t for `parent`: for llama.cpp its GGUF at the target's weight
 * type (random weights) in a scratch folder; the built-in engine needs nothing ready. cancelled (may be NULL) with cancel_ud: the job's
 * cancel hook, asked in every serving and in writing a GGUF. 0, or -1 with err (sc_close
 * anyway). */
int sc_open(sc_check *c, const arch *parent, const cm_target *t, int (*cancelled)(void *ud), void *cancel_ud,
            char *err, size_t errlen);

/* Serve the parent SC_ROUNDS times and write into *out a copy of tb whose prefill and
 * decode times are scaled so that it predicts the parent's medians divided by tb's parent
 * bias (1 when tb has none).
 *
 * A serving beside other work (ms_host_contended over the serving) is slow by however
 * much the other work took, and an anchor taken from it would price every arch of the
 * search at that speed: it is set aside, and after a wait of up to c->quiet_wait_s for a
 * second in which the machine leaves the target's cores to it (asking the cancel hook
 * every 50 ms), the parent is served again, MS_QUIET_TRIES servings in all
 * (ms_run_quiet). A serving already contended after one of its SC_ROUNDS processes stops
 * there (ms_rounds_tick), except the last try. The
 * servings set aside are the document's "anchor_tries" ({parent_measured_ms, host_load,
 * and for llama.cpp process_latencies_ms} each). A serving too short to judge (under MS_HOST_MIN_S) is used.
 *
 * An earlier anchor of c is dropped first (a check needs this one).
 *
 * 0; 1 with the reason in err and no anchor when every serving was contended, or when,
 * on the built-in engine, the device's free memory (eng_device_free_bytes) is below the
 * parent's predicted serving memory (it would be a second copy beside the search's;
 * nothing served): the tables as calibrated then decide; or -1 with err. */
int sc_anchor(sc_check *c, const cm_tables *tb, cm_tables *out, char *err, size_t errlen);

/* Serve `a` (random weights) and the parent SC_ROUNDS times each, alternating, and fill
 * *m as measured: latency_ms and decode_ms priced from a's ratios to the parent at the
 * anchor's level, total = the highest of a's peaks (the measure stage's rule), params. The check and
 * the tables' prediction `pred` (may be NULL) join the document. Servings beside other
 * work are set aside and served again as the anchor's are (ms_run_quiet; the document's
 * "check_tries": {arch, host_load, process_latencies_ms, parent_process_latencies_ms}
 * each); when every try was contended the last is kept, its host_load saying so.
 * 0, or -1 with err. */
int sc_measure(sc_check *c, const arch *a, const cm_prediction *pred, cm_prediction *m, char *err, size_t errlen);

/* The document (borrowed; NULL before sc_open). */
json_t *sc_doc(const sc_check *c);

void sc_close(sc_check *c);

#endif
