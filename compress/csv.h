/* compress/csv.h — an RFC-4180 CSV reader for benchmark files (MMLU, SciQ).
 *
 * Handles quoted fields with doubled quotes, embedded commas and newlines, LF and CRLF
 * record ends, a missing final newline. Whole-buffer parsing: benchmark files are small
 * (MB), so the table is held in memory. No header handling: row 0 is just a row.
 */
#ifndef AC_COMPRESS_CSV_H
#define AC_COMPRESS_CSV_H

#include <stddef.h>

typedef struct {
    int line;        /* 1-based line of the file where the record starts */
    int n_fields;
    char **fields;   /* n_fields NUL-terminated strings, owned by the table */
} csv_record;

typedef struct {
    int n_records;
    csv_record *records;
} csv_table;

/* Parse buf[0..len) into t (overwritten). An empty line between records is skipped.
 * Returns 0, or -1 with "line N: reason" in err (unterminated quote, a quote inside an
 * unquoted field, text after a closing quote, out of memory); t is then empty.
 * Free with csv_free. */
int csv_parse(const char *buf, size_t len, csv_table *t, char *err, size_t errlen);

/* Read and parse a file; errors are "PATH: line N: reason" (or the open/read error). */
int csv_parse_file(const char *path, csv_table *t, char *err, size_t errlen);

/* Free every record; t becomes empty. Safe on a zeroed or already freed table. */
void csv_free(csv_table *t);

#endif
