/* engine/tok_internal.h — private to the tokenizer's files in engine/ (tokenizer.c,
 * tok_table.c): the tokenizer's fields and its piece and merge tables. engine/tokenizer.h
 * is the public contract.
 */
#ifndef AC_ENGINE_TOK_INTERNAL_H
#define AC_ENGINE_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdint.h>

#include "engine/tokenizer.h"

#define TOK_MAX_REGEX 8

struct tok_tokenizer {
    tok_kind kind;
    int n_vocab;
    tok_config cfg;
    char **piece;             /* [n_vocab] NUL-terminated copies (may contain NUL bytes: use plen) */
    uint32_t *plen;
    float *score;
    uint8_t *type;
    int32_t *htab;            /* piece -> the id that took it last, open addressing, -1 empty */
    uint32_t hcap;
    int32_t *dup_next, *dup_prev; /* [n_vocab] ids sharing a piece, the later set first, -1 ends */
    uint64_t hkey[2];         /* SipHash key of the piece table, drawn per tokenizer */
    uint64_t mseed;           /* mixed into the merge table's keys, drawn per tokenizer */
    uint64_t *mkey;           /* merge (left id, right id) -> rank, result id */
    int32_t *mrank, *mres;
    uint32_t mcap, mcount;
    int32_t next_rank;
    pcre2_code *re[TOK_MAX_REGEX];
    int n_re;
    int byte_id[256];         /* id of the token for each raw byte (byte-level char or <0xNN>) */
    int *special;             /* ids matched literally in text, longest first */
    int n_special;
    uint8_t special_first[256];
    int finalized;
};

/* The tables of t->n_vocab ids, empty, under keys drawn from the kernel. Returns 0, or -1
 * (out of memory, or no random key): tok_tables_free releases what was made. */
int tok_tables_init(tok_tokenizer *t);
void tok_tables_free(tok_tokenizer *t);

/* Enter id under its current piece, first in the piece's chain. Returns 0, or -1 when no
 * slot is free (impossible while entries <= n_vocab). */
int tok_htab_insert(tok_tokenizer *t, int id);

/* Remove id, found under its current piece: set it again only after this. */
void tok_htab_remove(tok_tokenizer *t, int id);

/* The rule merging ids a and b: its rank, its result in *res; -1 when there is none. */
int tok_merge_find(const tok_tokenizer *t, int a, int b, int *res);

/* Add the rule (a, b) -> res at rank; a rule already there keeps its (lower) rank.
 * Returns 0, or -1 out of memory. */
int tok_merge_insert(tok_tokenizer *t, int a, int b, int rank, int res);

#endif
