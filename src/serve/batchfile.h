/* OpenAI's batch files, as `nerve batch` reads them.
 *
 * Input: a JSON object a line, {"custom_id": a non-empty string unique in the file, "method":
 * "POST", "url": /v1/chat/completions, /v1/completions, /v1/embeddings or /v1/responses (also
 * without /v1), "body": the request object, not streamed}. nv_batch_add_line checks one line and
 * keeps it, its body as the line's own text (the bytes between the braces, so a number cJSON would
 * print otherwise reaches the server as written). Output: a line per answer, {"id", "custom_id",
 * "response": {"status_code", "request_id", "body"} | null, "error"}; nv_batch_output_line reads
 * one back (for --resume).
 *
 * Or Anthropic's Message Batches, a file of one kind or the other: {"custom_id", "params": the
 * /v1/messages request}, answered {"custom_id", "result": {"type": "succeeded", "message"} or
 * {"type": "errored", "error"}}. */
#ifndef NV_BATCHFILE_H
#define NV_BATCHFILE_H

#include "base/err.h"
#include "base/hash.h"

typedef struct {
    char *custom_id;
    const char *url; /* one of the endpoints, with /v1 */
    char *body;      /* the body's text as the line has it */
    int line_no;
    int anthropic;   /* a Message Batches line (its params the body of /v1/messages) */
} nv_batch_req;

typedef struct {
    nv_batch_req *reqs;
    int n, cap;
    nv_map64 ids; /* nv_hash64(custom_id), the next keys probed where ids collide -> index */
    int kind;     /* the file's format, by its first request: 0 none yet, 1 OpenAI's, 2 Anthropic's */
} nv_batch_set;

nv_err nv_batch_set_init(nv_batch_set *s);
void nv_batch_set_free(nv_batch_set *s);
/* The index of the request with this custom_id, or -1. */
int nv_batch_find(const nv_batch_set *s, const char *custom_id);

/* Line line_no of an input file (NUL-terminated, no newline) checked and added to s: NV_OK, or
 * NV_EINVAL with the reason (nv_errmsg, one line: "not a JSON object", "custom_id repeats line N's",
 * ...) and s unchanged; NV_ENOMEM. */
nv_err nv_batch_add_line(nv_batch_set *s, const char *line, int line_no);

/* A line of a former output: NV_OK with *index the request of s it answers and *ok 1 when its
 * status is 2xx (Anthropic's: its result succeeded); NV_EINVAL (nv_errmsg says why) when it is not a batch output's line or answers a
 * custom_id s does not hold. */
nv_err nv_batch_output_line(const nv_batch_set *s, const char *line, int *index, int *ok);

/* Splits text into lines in place (the newline, and a CR before it, made NUL) and calls fn on each
 * that is not blank with its 1-based number; stops at fn's first nonzero return, which it returns. */
int nv_batch_for_lines(char *text, int (*fn)(void *ctx, char *line, int no), void *ctx);

#endif
