/* compress/child.h — a measuring program run as a child of its own: the llama.cpp helper
 * (`ac-llama`, compress/llamacpp.h) and `autocompress measure` (the built-in engine served
 * in a fresh process, compress/measure.h). argv in, one JSON object on its stdout out, the
 * last line of its stderr the reason when it fails. The child dies with the thread that
 * started it, gets the default signal dispositions, and is killed when the measurement's
 * cancel hook says stop, when it says nothing on stdout or stderr for longer than its
 * time limit (hung), or when it lingers after closing its output.
 */
#ifndef AC_COMPRESS_CHILD_H
#define AC_COMPRESS_CHILD_H

#include <stddef.h>
#include <jansson.h>

#include "compress/measure.h"

/* What a child is, for its messages and its time limit. */
typedef struct {
    const char *what;     /* "llama.cpp helper": messages read "WHAT ARGV1: ..." */
    const char *engine;   /* "llama.cpp": a JSON {"error": E} it answers reads "ENGINE: E" */
    double timeout_s;     /* the longest it may say nothing: a child serving a large model
                             for long writes a newline on stdout now and then (its
                             heartbeat; JSON allows the whitespace) */
} ch_kind;

/* Run argv (argv[0] = its path) and parse its stdout as one JSON object into *out (NEW).
 * o (may be NULL): its cancel hook is asked every 100 ms while the child runs; when it
 * says stop, the child is killed and the run fails with err "cancelled". 0, or -1 with
 * err. */
int ch_run_json(const ch_kind *k, char *const argv[], const ms_opts *o, json_t **out, char *err, size_t errlen);

/* The executable `name`: the path in environment variable env (may be NULL) when set
 * (which must be executable), else beside this program, else one folder above it (a test
 * binary in build/tests finds build/NAME). 0 with the path in out, or -1. */
int ch_find_program(const char *env, const char *name, char *out, size_t cap);

#endif
