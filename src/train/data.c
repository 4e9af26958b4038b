#include "train/data.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>
#include <zlib.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/pool.h"
#include "base/rng.h"
#include "serve/api.h"
#include "serve/tools.h"

/* Whether a data file's name ends in suf, a ".gz" after it aside (nv_file_map_data decompresses it). */
static int has_suffix(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    if (nv_file_gz(s)) a -= 3;
    return a >= b && strncmp(s + a - b, suf, b) == 0;
}

int nv_data_named_text(const char *path) {
    return !has_suffix(path, ".bin") && !has_suffix(path, ".u32") && !has_suffix(path, ".jsonl");
}

/* The capacity a growing array needs for need elements: cap doubled (from first) until it holds them. */
static uint64_t grown_cap(uint64_t cap, uint64_t need, uint64_t first) {
    uint64_t nc = cap ? cap * 2 : first;
    while (nc < need) nc *= 2;
    return nc;
}

/* A NUL-terminated copy of text[0, len) (malloc'd; NULL when out of memory). */
static char *terminated(const char *text, size_t len) {
    char *copy = malloc(len + 1);
    if (copy) {
        memcpy(copy, text, len);
        copy[len] = '\0';
    }
    return copy;
}

/* Appends the tokens of one document (BOS first; EOS last instead for a vocabulary that prepends
 * no BOS, such as Qwen's, so documents stay apart) to a growing array. */
static nv_err append_doc(const nv_tokenizer *tok, const char *text, size_t len, uint32_t **arr, uint64_t *n,
                         uint64_t *cap) {
    while (len && (*text == '\n' || *text == ' ' || *text == '\r')) text++, len--;
    while (len && (text[len - 1] == '\n' || text[len - 1] == ' ' || text[len - 1] == '\r')) len--;
    if (!len) return NV_OK;
    char *doc = terminated(text, len);
    if (!doc) return nv_fail(NV_ENOMEM, "out of memory");
    int *ids = NULL, nids = 0;
    nv_err e = nv_tokenizer_encode(tok, doc, 1, !nv_tokenizer_adds_bos(tok), &ids, &nids); /* no EOS id: nothing apart */
    free(doc);
    if (e) return e;
    if (*n + (uint64_t)nids > *cap) {
        const uint64_t nc = grown_cap(*cap, *n + (uint64_t)nids, 1 << 16);
        uint32_t *na = realloc(*arr, nc * sizeof(uint32_t));
        if (!na) {
            free(ids);
            return nv_fail(NV_ENOMEM, "out of memory tokenizing text");
        }
        *arr = na;
        *cap = nc;
    }
    for (int i = 0; i < nids; i++) (*arr)[(*n)++] = (uint32_t)ids[i];
    free(ids);
    return NV_OK;
}

/* Text is tokenized in groups of whole documents, one pool task each, and the groups' tokens joined
 * in order: the same tokens as one pass, a core's worth faster. */
#define TEXT_GROUPS_PER_THREAD 4

typedef struct {
    const nv_tokenizer *tok;
    const char *text;
    const size_t (*docs)[2]; /* [n][offset, length] */
    const size_t *first;     /* [groups + 1]: group g holds docs first[g] .. first[g + 1] - 1 */
    uint32_t **ids;          /* [groups] */
    uint64_t *n_ids, *caps;
    nv_err *err;
    char (*msg)[256];
} text_job;

static void tokenize_group(void *arg, int g, int n_groups) {
    (void)n_groups;
    text_job *j = arg;
    for (size_t d = j->first[g]; d < j->first[g + 1] && !j->err[g]; d++)
        j->err[g] = append_doc(j->tok, j->text + j->docs[d][0], j->docs[d][1], &j->ids[g], &j->n_ids[g], &j->caps[g]);
    if (j->err[g]) snprintf(j->msg[g], sizeof j->msg[g], "%s", nv_errmsg()); /* the message is the thread's own */
}

/* The tokens of documents docs[0, n_docs) of text into s (one BOS-started run each, as
 * append_doc), tokenized in groups on the pool. */
static nv_err tokenize_docs(nv_source *s, const nv_tokenizer *tok, const char *t, size_t len, const size_t (*docs)[2],
                            size_t n_docs) {
    /* groups of about equal bytes, several per thread so that an uneven one does not hold the rest up */
    const int groups = (int)(n_docs < (size_t)(nv_pool_threads() * TEXT_GROUPS_PER_THREAD) ? (n_docs ? n_docs : 1)
                                                                                          : (size_t)(nv_pool_threads() * TEXT_GROUPS_PER_THREAD));
    size_t *first = calloc((size_t)groups + 1, sizeof *first);
    uint32_t **ids = calloc((size_t)groups, sizeof *ids);
    uint64_t *n_ids = calloc((size_t)groups, sizeof *n_ids), *caps = calloc((size_t)groups, sizeof *caps);
    nv_err *errs = calloc((size_t)groups, sizeof *errs);
    char(*msg)[256] = calloc((size_t)groups, sizeof *msg);
    nv_err e = NV_OK;
    if (!first || !ids || !n_ids || !caps || !errs || !msg) e = nv_fail(NV_ENOMEM, "out of memory reading %s", s->path);
    if (e == NV_OK) {
        for (int g = 1, d = 0; g < groups; g++) { /* group g starts at the first document past g / groups of the bytes */
            const size_t target = (size_t)((double)len * g / groups);
            while ((size_t)d < n_docs && docs[d][0] < target) d++;
            first[g] = (size_t)d;
        }
        first[groups] = n_docs;
        text_job j = {tok, t, docs, first, ids, n_ids, caps, errs, msg};
        nv_pool_run(tokenize_group, &j, groups);
        uint64_t total = 0;
        for (int g = 0; g < groups && e == NV_OK; g++) {
            if (errs[g]) e = nv_fail(errs[g], "%s", msg[g]);
            total += n_ids[g];
        }
        if (e == NV_OK && !(s->owned = malloc((total ? total : 1) * sizeof *s->owned))) e = nv_fail(NV_ENOMEM, "out of memory reading %s", s->path);
        for (int g = 0; g < groups && e == NV_OK; g++) {
            if (n_ids[g]) memcpy(s->owned + s->n_tokens, ids[g], n_ids[g] * sizeof *s->owned);
            s->n_tokens += n_ids[g];
        }
    }
    for (int g = 0; ids && g < groups; g++) free(ids[g]);
    free(first), free(ids), free(n_ids), free(caps), free(errs), free(msg);
    s->width = 4;
    return e;
}

/* Grows a [n][offset, length] list by one. */
static nv_err push_doc(size_t (**docs)[2], size_t *n, size_t *cap, size_t at, size_t len, const char *path) {
    if (*n == *cap) {
        *cap = grown_cap(*cap, *n + 1, 1024);
        size_t(*nd)[2] = realloc(*docs, *cap * sizeof **docs);
        if (!nd) return nv_fail(NV_ENOMEM, "out of memory reading %s", path);
        *docs = nd;
    }
    (*docs)[*n][0] = at, (*docs)[*n][1] = len, (*n)++;
    return NV_OK;
}

/* The documents of one text file's bytes t[0, len), which lie at `base` in the text being
 * tokenized, onto the list: split at <|endoftext|>, at blank lines, or at every line break when the
 * file marks documents neither way (a marked story keeps its single line breaks). */
static nv_err split_docs(const char *t, size_t len, size_t base, size_t (**docs)[2], size_t *n_docs, size_t *cap_docs,
                         const char *path) {
    static const char eot[] = "<|endoftext|>";
    int blank_lines = len && memmem(t, len, eot, sizeof eot - 1) != NULL;
    for (size_t i = 0; i + 1 < len && !blank_lines; i++) blank_lines = t[i] == '\n' && t[i + 1] == '\n';
    size_t start = 0;
    nv_err e = NV_OK;
    for (size_t i = 0; i <= len && e == NV_OK; i++) {
        size_t cut = 0, skip = 0;
        if (i == len) cut = 1;
        else if (t[i] == '<' && len - i >= sizeof eot - 1 && memcmp(t + i, eot, sizeof eot - 1) == 0) cut = 1, skip = sizeof eot - 1;
        else if (t[i] == '\n' && (!blank_lines || (i + 1 < len && t[i + 1] == '\n'))) cut = 1, skip = 1;
        if (!cut) continue;
        e = push_doc(docs, n_docs, cap_docs, base + start, i - start, path);
        i += skip ? skip - 1 : 0;
        start = i + 1;
    }
    return e;
}

static nv_err load_text(nv_source *s, const nv_tokenizer *tok) {
    if (!tok) return nv_fail(NV_EINVAL, "%s: a text file needs a tokenizer (-z)", s->path);
    nv_mapped m;
    NV_TRY(nv_file_map_data(s->path, &m));
    size_t (*docs)[2] = NULL, n_docs = 0, cap_docs = 0;
    nv_err e = split_docs((const char *)m.data, m.len, 0, &docs, &n_docs, &cap_docs, s->path);
    if (e == NV_OK) e = tokenize_docs(s, tok, (const char *)m.data, m.len, (const size_t(*)[2])docs, n_docs);
    free(docs);
    nv_file_unmap(&m);
    s->width = 4;
    return e;
}

/* ---- a folder of text files ---- */

void nv_text_files_free(nv_text_files *f) {
    for (size_t i = 0; i < f->n; i++) free(f->paths[i]);
    free(f->paths);
    memset(f, 0, sizeof *f);
}

/* 1 when the file's first 8000 bytes (decompressed, a .gz's) hold a NUL byte (or it cannot be read:
 * the reader says why). */
static int looks_binary(const char *path) {
    gzFile f = gzopen(path, "rb"); /* (a file that is not gzip reads as it is) */
    if (!f) return 0;
    char head[8000];
    const int n = gzread(f, head, sizeof head);
    gzclose(f);
    return n > 0 && memchr(head, '\0', (size_t)n) != NULL;
}

/* The files under dir onto l (nv_data_text_files' rules). */
static nv_err walk_files(const char *dir, int depth, nv_text_files *l) {
    if (depth > 32) return nv_fail(NV_EINVAL, "%s: folders nested more than 32 deep", dir);
    DIR *d = opendir(dir);
    if (!d) return nv_fail(NV_EIO, "%s: cannot read the folder", dir);
    nv_err e = NV_OK;
    for (struct dirent *ent; e == NV_OK && (ent = readdir(d));) {
        if (ent->d_name[0] == '.') continue;
        const size_t len = strlen(dir) + strlen(ent->d_name) + 2;
        char *path = malloc(len);
        if (!path) {
            e = nv_fail(NV_ENOMEM, "out of memory listing %s", dir);
            break;
        }
        snprintf(path, len, "%s/%s", dir, ent->d_name);
        struct stat st;
        const int seen = lstat(path, &st) == 0;
        if (seen && S_ISDIR(st.st_mode)) e = walk_files(path, depth + 1, l);
        int keep = seen && S_ISREG(st.st_mode);
        if (keep && !nv_data_named_text(path)) keep = 0, l->other++;
        else if (keep && looks_binary(path)) keep = 0, l->binary++;
        if (keep && l->n == l->cap) {
            l->cap = grown_cap(l->cap, l->n + 1, 64);
            char **np = realloc(l->paths, l->cap * sizeof *np);
            if (!np) e = nv_fail(NV_ENOMEM, "out of memory listing %s", dir), keep = 0;
            else l->paths = np;
        }
        if (keep) l->paths[l->n++] = path;
        else free(path);
    }
    closedir(d);
    return e;
}

nv_err nv_data_text_files(const char *dir, nv_text_files *out) {
    memset(out, 0, sizeof *out);
    nv_err e = walk_files(dir, 0, out);
    if (e == NV_OK && !out->n)
        e = nv_fail(NV_EINVAL, "%s holds no text file (%zu of the other data formats, %zu binary: give those by name)", dir,
                    out->other, out->binary);
    if (e != NV_OK) nv_text_files_free(out);
    else qsort(out->paths, out->n, sizeof *out->paths, nv_strcmp_ptrs);
    return e;
}

/* A folder as one text source: its text files (nv_data_text_files) in order, each read as a text
 * file is (its documents split the same way). */
static nv_err load_text_dir(nv_source *s, const nv_tokenizer *tok) {
    if (!tok) return nv_fail(NV_EINVAL, "%s: a folder of text needs a tokenizer (-z)", s->path);
    nv_text_files l;
    NV_TRY(nv_data_text_files(s->path, &l));
    nv_buf all = {0};
    size_t (*docs)[2] = NULL, n_docs = 0, cap_docs = 0;
    nv_err e = NV_OK;
    for (size_t i = 0; i < l.n && e == NV_OK; i++) {
        nv_mapped m;
        if ((e = nv_file_map_data(l.paths[i], &m)) != NV_OK) break;
        if (m.len && memchr(m.data, '\0', m.len)) {
            e = nv_fail(NV_EFORMAT, "%s: a NUL byte in text", l.paths[i]);
        } else {
            const size_t at = all.len;
            nv_buf_append(&all, m.data, m.len);
            e = all.oom ? nv_fail(NV_ENOMEM, "out of memory reading %s", l.paths[i])
                        : split_docs(all.data + at, m.len, at, &docs, &n_docs, &cap_docs, l.paths[i]);
        }
        nv_file_unmap(&m);
    }
    if (e == NV_OK) e = tokenize_docs(s, tok, all.data ? all.data : "", all.len, (const size_t(*)[2])docs, n_docs);
    if (e == NV_OK)
        nv_info("data: %s: %zu text file%s%s", s->path, l.n, l.n == 1 ? "" : "s",
                l.other || l.binary ? " (files of the other data formats, or binary, left out)" : "");
    free(docs);
    nv_buf_free(&all);
    nv_text_files_free(&l);
    s->width = 4;
    return e;
}


/* The next line of t[0, len) from *at that is not blank: *line, *n bytes (without its '\n'), its
   number in *line_no (blank lines counted); 0 at the end. */
static int next_line(const char *t, size_t len, size_t *at, long *line_no, const char **line, size_t *n) {
    while (*at < len) {
        const char *nl = memchr(t + *at, '\n', len - *at);
        const size_t from = *at, end = nl ? (size_t)(nl - t) : len;
        size_t k = from;
        while (k < end && (t[k] == ' ' || t[k] == '\t' || t[k] == '\r')) k++;
        *at = end + 1;
        ++*line_no;
        if (k < end) {
            *line = t + from, *n = end - from;
            return 1;
        }
    }
    return 0;
}

/* The first non-blank line of a .jsonl file as JSON (NULL: none, or not JSON), read only as far as
 * that line (a .gz's decompressed so far: not the whole file, which its loader reads after). */
static cJSON *first_jsonl_object(const char *path) {
    gzFile f = gzopen(path, "rb"); /* (a file that is not gzip reads as it is) */
    if (!f) return NULL;
    nv_buf b = {0};
    char chunk[65536];
    cJSON *root = NULL;
    for (int end = 0; !end && !b.oom;) {
        const int got = gzread(f, chunk, sizeof chunk);
        end = got <= 0;
        if (got > 0) nv_buf_append(&b, chunk, (size_t)got);
        size_t at = 0, n = 0;
        long line_no = 0;
        const char *line;
        if (next_line(b.data, b.len, &at, &line_no, &line, &n) && (end || line + n < b.data + b.len)) { /* (whole: its '\n' came) */
            root = nv_json_parse_whole(line, n);
            break;
        }
    }
    gzclose(f);
    nv_buf_free(&b);
    return root;
}

int nv_data_jsonl_is_text(const char *path) {
    if (!has_suffix(path, ".jsonl")) return 0;
    cJSON *root = first_jsonl_object(path);
    const int text = cJSON_IsString(cJSON_GetObjectItemCaseSensitive(root, "text")) &&
                     !cJSON_GetObjectItemCaseSensitive(root, "messages") && !cJSON_GetObjectItemCaseSensitive(root, "input") &&
                     !cJSON_GetObjectItemCaseSensitive(root, "prompt");
    cJSON_Delete(root);
    return text;
}

nv_err nv_data_jsonl_each_text(const char *path, nv_err (*fn)(void *ctx, const char *text, size_t n), void *ctx) {
    nv_mapped m;
    NV_TRY(nv_file_map_data(path, &m));
    const char *t = (const char *)m.data;
    nv_err e = NV_OK;
    long line_no = 0, lines = 0;
    size_t at = 0, len = 0;
    const char *line;
    while (e == NV_OK && next_line(t, m.len, &at, &line_no, &line, &len)) {
        cJSON *root = nv_json_parse_whole(line, len);
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text");
        if (!cJSON_IsObject(root) || !cJSON_IsString(text))
            e = nv_fail(NV_EFORMAT, "%s:%ld: not a JSON object with a \"text\" string (a file of text lines has one a line)", path,
                        line_no);
        else e = fn(ctx, text->valuestring, strlen(text->valuestring)), lines++;
        cJSON_Delete(root);
    }
    nv_file_unmap(&m);
    if (e == NV_OK && !lines) e = nv_fail(NV_EFORMAT, "%s: no text lines", path);
    return e;
}

/* load_jsonl_text's documents as they are read: their texts apart (terminated strings) and where each is. */
typedef struct {
    nv_buf texts;
    size_t (*docs)[2], n_docs, cap_docs;
    const char *path;
} jsonl_docs;

static nv_err jsonl_doc(void *ctx, const char *text, size_t n) {
    jsonl_docs *d = ctx;
    const size_t from = d->texts.len;
    nv_buf_append(&d->texts, text, n);
    nv_buf_append(&d->texts, "", 1);
    return d->texts.oom ? nv_fail(NV_ENOMEM, "out of memory reading %s", d->path)
                        : push_doc(&d->docs, &d->n_docs, &d->cap_docs, from, n, d->path);
}

int nv_data_jsonl_is_turns(const char *path) { return has_suffix(path, ".jsonl") && !nv_data_jsonl_is_text(path); }

/* A .jsonl file of {"text": ...} lines: each line's text one document, as a text file's. */
static nv_err load_jsonl_text(nv_source *s, const nv_tokenizer *tok) {
    if (!tok) return nv_fail(NV_EINVAL, "%s: a text file needs a tokenizer (-z)", s->path);
    jsonl_docs d = {.path = s->path};
    nv_err e = nv_data_jsonl_each_text(s->path, jsonl_doc, &d);
    if (e == NV_OK) e = tokenize_docs(s, tok, d.texts.data, d.texts.len, (const size_t(*)[2])d.docs, d.n_docs);
    free(d.docs);
    nv_buf_free(&d.texts);
    return e;
}

/* A chat source as it grows: tokens, their trained flags, the turns' starts, and which turns begin
   a conversation (the split falls between conversations). */
typedef struct {
    uint64_t cap, cap_turns;
    uint8_t *first; /* [turn]: 1 where a conversation begins */
    long merged;    /* answers left out: their first token merges with the prompt's last */
    int kind;       /* the file's lines: 0 chat, 1 preference, 2 prompt/completion */
} chat_build;

static nv_err chat_append_turn(nv_source *s, chat_build *cb, const int *ids, int n, int n_prompt, int first) {
    if (s->n_tokens + (uint64_t)n > cb->cap) {
        const uint64_t nc = grown_cap(cb->cap, s->n_tokens + (uint64_t)n, 1 << 16);
        uint32_t *t = realloc(s->owned, nc * sizeof *t);
        if (t) s->owned = t;
        uint8_t *f = realloc(s->trained, nc);
        if (f) s->trained = f;
        if (!t || !f) return nv_fail(NV_ENOMEM, "out of memory reading %s", s->path);
        cb->cap = nc;
    }
    if (s->n_starts + 2 > cb->cap_turns) {
        const uint64_t nc = grown_cap(cb->cap_turns, s->n_starts + 2, 1024);
        uint64_t *st = realloc(s->starts, nc * sizeof *st);
        if (st) s->starts = st;
        uint8_t *fi = realloc(cb->first, nc);
        if (fi) cb->first = fi;
        if (!st || !fi) return nv_fail(NV_ENOMEM, "out of memory reading %s", s->path);
        cb->cap_turns = nc;
    }
    s->starts[s->n_starts] = s->n_tokens;
    cb->first[s->n_starts++] = (uint8_t)first;
    for (int i = 0; i < n; i++) {
        s->owned[s->n_tokens] = (uint32_t)ids[i];
        s->trained[s->n_tokens++] = i >= n_prompt && i > 0; /* the first token is never a target */
    }
    s->starts[s->n_starts] = s->n_tokens;
    return NV_OK;
}

/* The legacy "functions" of an object (a line, or its "input") refused, as the server refuses them. */
static nv_err no_functions(const nv_source *s, const cJSON *obj, long line_no) {
    if (!cJSON_GetObjectItemCaseSensitive(obj, "functions")) return NV_OK;
    return nv_fail(NV_EFORMAT, "%s:%ld: the legacy 'functions' are not read: give 'tools' (and 'tool_calls')", s->path,
                   line_no);
}

/* A line's "tools" as the chat template prints them (the server puts them in the system prompt). */
static nv_err line_tools(const nv_source *s, const cJSON *obj, nv_chat_template tmpl, long line_no, char ***tools,
                         int *n_tools) {
    nv_api_error err = {0};
    if (nv_api_tool_texts(cJSON_GetObjectItemCaseSensitive(obj, "tools"), nv_chat_tool_text_style(tmpl, s->jinja), tools, n_tools, &err))
        return nv_fail(err.status == 500 ? NV_ENOMEM : NV_EFORMAT, "%s:%ld: %s", s->path, line_no, err.message);
    return NV_OK;
}

/* Messages [0, n) of m rendered as one turn whose last message is the answer; a template's refusal
   gets the line's place (NV_EUNSUPPORTED, an answer that would merge with its prompt, is passed on
   for the caller to count). */
static nv_err render_answer(const nv_source *s, const nv_tokenizer *tok, nv_chat_template tmpl, const nv_api_messages *m,
                            int n, char **tools, int n_tools, long line_no, int **ids, int *n_ids, int *n_prompt) {
    nv_chat_opts o = {.tools = (const char *const *)tools, .n_tools = n_tools, .jinja = s->jinja};
    nv_err e = nv_chat_render_turn(tmpl, tok, m->m, n, &o, ids, n_ids, n_prompt);
    if (e == NV_EFORMAT || e == NV_EINVAL) e = nv_fail(NV_EFORMAT, "%s:%ld: %s", s->path, line_no, nv_errmsg()); /* the template's reason, with the line */
    return e;
}

/* An assistant message checked: no legacy function_call, and with trained (an answer to train on)
   content or tool calls. */
static nv_err check_answer(const nv_source *s, const cJSON *msg, const char *where, long line_no, int has_calls,
                           int trained) {
    if (cJSON_GetObjectItemCaseSensitive(msg, "function_call"))
        return nv_fail(NV_EFORMAT, "%s:%ld: '%s.function_call' (legacy) is not read: give 'tool_calls'", s->path, line_no,
                       where);
    if (!trained) return NV_OK;
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
    if ((!content || cJSON_IsNull(content)) && !has_calls)
        return nv_fail(NV_EFORMAT, "%s:%ld: '%s' has neither content nor tool_calls to train on", s->path, line_no, where);
    return NV_OK;
}

/* One line of chat data: its assistant answers (weight 1) as turns. */
static nv_err chat_line(nv_source *s, chat_build *cb, const nv_tokenizer *tok, nv_chat_template tmpl, cJSON *root,
                        long line_no) {
    char **tools = NULL;
    int n_tools = 0;
    s->templated = 1;
    NV_TRY(line_tools(s, root, tmpl, line_no, &tools, &n_tools));
    nv_api_error err = {0};
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    nv_api_messages m;
    if (nv_api_messages_parse(msgs && !cJSON_IsNull(msgs) ? msgs : NULL, &m, &err)) {
        nv_api_tool_texts_free(tools, n_tools);
        return nv_fail(err.status == 500 ? NV_ENOMEM : NV_EFORMAT, "%s:%ld: %s", s->path, line_no, err.message);
    }
    nv_err e = NV_OK;
    int turns = 0, merged = 0, i = 0;
    for (const cJSON *msg = msgs->child; msg && e == NV_OK; msg = msg->next, i++) {
        if (strcmp(m.m[i].role, "assistant") != 0) continue;
        const cJSON *w = cJSON_GetObjectItemCaseSensitive(msg, "weight");
        if (w && !(cJSON_IsNumber(w) && (w->valuedouble == 0 || w->valuedouble == 1))) {
            e = nv_fail(NV_EFORMAT, "%s:%ld: 'messages[%d].weight' must be 0 or 1", s->path, line_no, i);
            break;
        }
        char where[32];
        snprintf(where, sizeof where, "messages[%d]", i);
        const int trained = !w || w->valuedouble == 1; /* weight 0, OpenAI's: shown to the model, not trained on */
        if ((e = check_answer(s, msg, where, line_no, m.m[i].n_calls, trained)) || !trained) continue;
        int *ids = NULL, n = 0, n_prompt = 0;
        e = render_answer(s, tok, tmpl, &m, i + 1, tools, n_tools, line_no, &ids, &n, &n_prompt);
        if (e == NV_EUNSUPPORTED) { /* cannot be shown as the server would: left out, counted */
            merged++;
            cb->merged++;
            e = NV_OK;
            continue;
        }
        if (e == NV_OK) e = chat_append_turn(s, cb, ids, n, n_prompt, turns == 0);
        free(ids);
        turns++;
    }
    if (e == NV_OK && !turns && !merged)
        e = nv_fail(NV_EFORMAT, "%s:%ld: no assistant message to train on (each line needs one with weight 1)", s->path,
                    line_no);
    nv_api_messages_free(&m);
    nv_api_tool_texts_free(tools, n_tools);
    return e;
}

/* A message object {"role": role, "content": text} (NULL when out of memory). */
static cJSON *text_message(const char *role, const char *text) {
    cJSON *m = cJSON_CreateObject();
    if (m && (!cJSON_AddStringToObject(m, "role", role) || !cJSON_AddStringToObject(m, "content", text))) {
        cJSON_Delete(m);
        m = NULL;
    }
    return m;
}

static int is_assistant(const cJSON *msg) {
    const cJSON *role = cJSON_IsObject(msg) ? cJSON_GetObjectItemCaseSensitive(msg, "role") : NULL;
    return cJSON_IsString(role) && !strcmp(role->valuestring, "assistant");
}

/* A preference line as one conversation and its two answers (*conv, answers[0] preferred, [1] the
   other: new objects the caller deletes) and the object whose "tools" it offers (*tools_of). Reads
   OpenAI's format ({"input": {"messages", "tools"}, "preferred_output": [answer],
   "non_preferred_output": [answer]}) and TRL's: {"prompt", "chosen", "rejected"}, each a string (the
   prompt a user message, the answers assistant ones) or messages, or without "prompt" two whole
   conversations that differ only in their last message, an answer. keys[] receives the answers' names. */
static nv_err pref_parts(const nv_source *s, const cJSON *root, long line_no, cJSON **conv, cJSON *answers[2],
                         const cJSON **tools_of, const char *keys[2]) {
    *conv = answers[0] = answers[1] = NULL;
    const int openai = !cJSON_GetObjectItemCaseSensitive(root, "chosen") && !cJSON_GetObjectItemCaseSensitive(root, "rejected");
    keys[0] = openai ? "preferred_output" : "chosen";
    keys[1] = openai ? "non_preferred_output" : "rejected";
    const cJSON *out[2] = {cJSON_GetObjectItemCaseSensitive(root, keys[0]), cJSON_GetObjectItemCaseSensitive(root, keys[1])};
    const cJSON *msgs = NULL;
    *tools_of = root;
    if (openai) {
        const cJSON *input = cJSON_GetObjectItemCaseSensitive(root, "input");
        if (!cJSON_IsObject(input))
            return nv_fail(NV_EFORMAT, "%s:%ld: 'input' must be an object holding the conversation's 'messages'", s->path,
                           line_no);
        msgs = cJSON_GetObjectItemCaseSensitive(input, "messages");
        if (!cJSON_IsArray(msgs) || !cJSON_GetArraySize(msgs))
            return nv_fail(NV_EFORMAT, "%s:%ld: 'input.messages' must be a non-empty array", s->path, line_no);
        *tools_of = input;
        NV_TRY(no_functions(s, input, line_no));
    }
    const cJSON *prompt = openai ? NULL : cJSON_GetObjectItemCaseSensitive(root, "prompt");
    const int implicit = !openai && !prompt; /* TRL: the prompt is what the two conversations share */
    for (int k = 0; k < 2; k++) {
        const int n = cJSON_GetArraySize(out[k]);
        const cJSON *last = cJSON_IsArray(out[k]) && n > 0 ? cJSON_GetArrayItem(out[k], n - 1) : NULL;
        if (!openai && cJSON_IsString(out[k]) && !implicit) continue;
        if (implicit ? !is_assistant(last) : !(n == 1 && is_assistant(last)))
            return nv_fail(NV_EFORMAT, "%s:%ld: '%s' must be %s", s->path, line_no, keys[k],
                           implicit ? "a conversation ending in an assistant message (or give 'prompt')"
                                    : openai ? "a list of one assistant message"
                                             : "a string or a list of one assistant message");
    }
    if (implicit) {
        const int n = cJSON_GetArraySize(out[0]);
        int same = n > 1 && n == cJSON_GetArraySize(out[1]);
        for (int i = 0; same && i < n - 1; i++)
            same = cJSON_Compare(cJSON_GetArrayItem(out[0], i), cJSON_GetArrayItem(out[1], i), 1);
        if (!same)
            return nv_fail(NV_EFORMAT, "%s:%ld: without 'prompt', 'chosen' and 'rejected' must be the same conversation up "
                                       "to their last message, the answer", s->path, line_no);
        msgs = out[0];
    } else if (!openai) {
        if (!(cJSON_IsString(prompt) || (cJSON_IsArray(prompt) && cJSON_GetArraySize(prompt) > 0)))
            return nv_fail(NV_EFORMAT, "%s:%ld: 'prompt' must be a string or a non-empty list of messages", s->path,
                           line_no);
        msgs = cJSON_IsArray(prompt) ? prompt : NULL;
    }
    if (msgs) {
        if ((*conv = cJSON_Duplicate(msgs, 1)) && implicit) cJSON_Delete(cJSON_DetachItemFromArray(*conv, cJSON_GetArraySize(*conv) - 1));
    } else if ((*conv = cJSON_CreateArray())) {
        cJSON *user = text_message("user", prompt->valuestring);
        if (user) cJSON_AddItemToArray(*conv, user);
        else cJSON_Delete(*conv), *conv = NULL;
    }
    for (int k = 0; k < 2 && *conv; k++)
        answers[k] = cJSON_IsString(out[k]) ? text_message("assistant", out[k]->valuestring)
                                            : cJSON_Duplicate(cJSON_GetArrayItem(out[k], cJSON_GetArraySize(out[k]) - 1), 1);
    if (!*conv || !answers[0] || !answers[1]) {
        cJSON_Delete(*conv), cJSON_Delete(answers[0]), cJSON_Delete(answers[1]);
        *conv = answers[0] = answers[1] = NULL;
        return nv_fail(NV_ENOMEM, "out of memory reading %s", s->path);
    }
    return NV_OK;
}

/* One line of preference data (pref_parts' formats): the two answers after the same conversation as
   two turns, the preferred first (one pair). */
static nv_err pref_line(nv_source *s, chat_build *cb, const nv_tokenizer *tok, nv_chat_template tmpl, cJSON *root,
                        long line_no) {
    s->templated = 1;
    cJSON *conv, *answers[2];
    const cJSON *tools_of;
    const char *keys[2];
    NV_TRY(pref_parts(s, root, line_no, &conv, answers, &tools_of, keys));
    char **tools = NULL;
    int n_tools = 0;
    nv_err e = line_tools(s, tools_of, tmpl, line_no, &tools, &n_tools);
    /* each answer after the conversation, parsed and checked as a request's messages */
    int *ids[2] = {NULL, NULL}, n[2] = {0, 0}, n_prompt[2] = {0, 0};
    for (int k = 0; k < 2 && e == NV_OK; k++) {
        cJSON_AddItemToArray(conv, answers[k]);
        nv_api_messages m;
        nv_api_error err = {0};
        if (nv_api_messages_parse(conv, &m, &err)) { /* its places are the conversation's with this answer */
            e = nv_fail(err.status == 500 ? NV_ENOMEM : NV_EFORMAT, "%s:%ld: the conversation with '%s': %s", s->path, line_no,
                        keys[k], err.message);
        } else {
            char where[48];
            snprintf(where, sizeof where, "%s (its answer)", keys[k]);
            e = check_answer(s, answers[k], where, line_no, m.m[m.n - 1].n_calls, 1);
            if (e == NV_OK)
                e = render_answer(s, tok, tmpl, &m, m.n, tools, n_tools, line_no, &ids[k], &n[k], &n_prompt[k]);
            nv_api_messages_free(&m);
        }
        cJSON_Delete(cJSON_DetachItemFromArray(conv, cJSON_GetArraySize(conv) - 1));
        answers[k] = NULL;
    }
    cJSON_Delete(conv), cJSON_Delete(answers[0]), cJSON_Delete(answers[1]);
    if (e == NV_EUNSUPPORTED) { /* an answer that cannot be shown as the server would: the pair is left out */
        cb->merged++;
        e = NV_OK;
    } else if (e == NV_OK) {
        e = chat_append_turn(s, cb, ids[0], n[0], n_prompt[0], 1);
        if (e == NV_OK) e = chat_append_turn(s, cb, ids[1], n[1], n_prompt[1], 0);
    }
    free(ids[0]);
    free(ids[1]);
    nv_api_tool_texts_free(tools, n_tools);
    return e;
}

/* A prompt/completion line (TRL's format): two strings joined as they are, the completion's tokens
   trained; or two lists of messages, one conversation whose completion alone is trained (the
   prompt's assistant messages get weight 0), rendered as chat data. */
static nv_err completion_line(nv_source *s, chat_build *cb, const nv_tokenizer *tok, nv_chat_template tmpl, cJSON *root,
                              long line_no) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt"), *c = cJSON_GetObjectItemCaseSensitive(root, "completion");
    if (cJSON_IsArray(p) && cJSON_IsArray(c)) {
        cJSON *conv = cJSON_CreateObject(), *msgs = conv ? cJSON_AddArrayToObject(conv, "messages") : NULL;
        const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
        int ok = msgs && (!tools || cJSON_AddItemToObject(conv, "tools", cJSON_Duplicate(tools, 1)));
        for (int part = 0; part < 2 && ok; part++)
            for (const cJSON *m = (part ? c : p)->child; m && ok; m = m->next) {
                cJSON *copy = cJSON_Duplicate(m, 1);
                ok = copy && cJSON_AddItemToArray(msgs, copy);
                if (ok && !part && is_assistant(copy)) { /* shown, not trained on */
                    cJSON_DeleteItemFromObjectCaseSensitive(copy, "weight");
                    ok = cJSON_AddNumberToObject(copy, "weight", 0) != NULL;
                }
            }
        nv_err e = ok ? chat_line(s, cb, tok, tmpl, conv, line_no) : nv_fail(NV_ENOMEM, "out of memory reading %s", s->path);
        cJSON_Delete(conv);
        return e;
    }
    if (!cJSON_IsString(p) || !cJSON_IsString(c))
        return nv_fail(NV_EFORMAT, "%s:%ld: 'prompt' and 'completion' must both be strings, or both lists of messages", s->path,
                       line_no);
    if (!*c->valuestring) return nv_fail(NV_EFORMAT, "%s:%ld: the completion is empty", s->path, line_no);
    nv_buf both = {0};
    nv_buf_puts(&both, p->valuestring);
    nv_buf_puts(&both, c->valuestring);
    int *ids = NULL, n = 0, *pids = NULL, np = 0;
    nv_err e = both.oom ? nv_fail(NV_ENOMEM, "out of memory reading %s", s->path)
                        : nv_tokenizer_encode(tok, both.data, 1, 1, &ids, &n);
    if (e == NV_OK) e = nv_tokenizer_encode(tok, p->valuestring, 1, 0, &pids, &np);
    int k = 0; /* the prompt: the tokens its own encoding shares with the whole's */
    while (e == NV_OK && k < np && k < n - 1 && pids[k] == ids[k]) k++;
    if (e == NV_OK) e = chat_append_turn(s, cb, ids, n, k, 1);
    s->completions = 1;
    free(ids);
    free(pids);
    nv_buf_free(&both);
    return e;
}

/* One line of a .jsonl source: chat data, preference data, or prompt/completion data (every line of
   a file the same kind as its first). */
static nv_err jsonl_line(nv_source *s, chat_build *cb, const nv_tokenizer *tok, nv_chat_template tmpl, const char *line,
                         size_t len, long line_no, int first_line) {
    char *text = terminated(line, len); /* the parser never reads to the mapped file's end */
    if (!text) return nv_fail(NV_ENOMEM, "out of memory reading %s", s->path);
    cJSON *root = nv_json_parse_whole(text, len);
    free(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return nv_fail(NV_EFORMAT, "%s:%ld: not a JSON object (each line is {\"messages\": [...]}, or for preference data "
                                   "{\"input\": ..., \"preferred_output\": ..., \"non_preferred_output\": ...} or "
                                   "{\"prompt\": ..., \"chosen\": ..., \"rejected\": ...})",
                       s->path, line_no);
    }
    nv_err e = no_functions(s, root, line_no);
    if (e) {
        cJSON_Delete(root);
        return e;
    }
    const int pref = cJSON_GetObjectItemCaseSensitive(root, "preferred_output") ||
                     cJSON_GetObjectItemCaseSensitive(root, "non_preferred_output") ||
                     cJSON_GetObjectItemCaseSensitive(root, "chosen") || cJSON_GetObjectItemCaseSensitive(root, "rejected");
    const int kind = pref ? 1 : cJSON_GetObjectItemCaseSensitive(root, "completion") ? 2 : 0;
    static const char *const kinds[] = {"chat", "preference", "prompt/completion"};
    if (first_line) s->pairs = (uint8_t)pref, cb->kind = kind;
    if (kind != cb->kind)
        e = nv_fail(NV_EFORMAT, "%s:%ld: a %s line in a file of %s lines: one kind a file", s->path, line_no, kinds[kind],
                    kinds[cb->kind]);
    else
        e = (kind == 1 ? pref_line : kind == 2 ? completion_line : chat_line)(s, cb, tok, tmpl, root, line_no);
    cJSON_Delete(root);
    return e;
}

static nv_err load_chat(nv_source *s, const nv_tokenizer *tok, nv_chat_template tmpl, float val_frac) {
    if (!tok) return nv_fail(NV_EINVAL, "%s: chat data needs a tokenizer (-z)", s->path);
    nv_mapped map;
    NV_TRY(nv_file_map_data(s->path, &map));
    const char *t = (const char *)map.data;
    chat_build cb = {0};
    nv_err e = NV_OK;
    long line_no = 0;
    size_t at = 0, len = 0;
    const char *line;
    for (int first = 1; e == NV_OK && next_line(t, map.len, &at, &line_no, &line, &len); first = 0)
        e = jsonl_line(s, &cb, tok, tmpl, line, len, line_no, first);
    nv_file_unmap(&map);
    s->width = 4;
    if (e == NV_OK && cb.merged)
        nv_warn("%s: %ld %s left out: their first token would merge with the prompt's last in this vocabulary",
                s->path, cb.merged, s->pairs ? "pairs (an answer of each)" : "answers");
    if (e == NV_OK && !s->n_starts) e = nv_fail(NV_EFORMAT, "%s: no conversations", s->path);
    if (e == NV_OK) { /* the last val_frac of the conversations validate */
        uint64_t convs = 0;
        for (uint64_t i = 0; i < s->n_starts; i++) convs += cb.first[i];
        uint64_t val = (uint64_t)((double)convs * val_frac), seen = 0;
        s->n_train_starts = s->n_starts;
        for (uint64_t i = 0; i < s->n_starts && val; i++) {
            seen += cb.first[i];
            if (cb.first[i] && seen == convs - val + 1) {
                s->n_train_starts = i;
                break;
            }
        }
        s->n_train = s->starts[s->n_train_starts];
    }
    free(cb.first);
    return e;
}

/* llm.c's shards: a header of 256 int32s (its magic, its version, the token count), then the tokens:
 * magic 20240520 version 1 GPT-2's uint16 ones, 20240801 version 7 Llama 3's uint32 ones. */
enum { LLMC_HEADER = 1024, LLMC_U16 = 20240520, LLMC_U32 = 20240801, LLMC_U16_VERSION = 1, LLMC_U32_VERSION = 7 };

/* A token shard: flat little-endian tokens (uint16 in a .bin, uint32 in a .u32), or llm.c's. */
static nv_err open_shard(nv_source *s) {
    s->width = has_suffix(s->path, ".u32") ? 4 : 2;
    NV_TRY(nv_file_map_data(s->path, &s->map));
    s->tokens = s->map.data;
    int32_t h[3] = {0, 0, 0};
    if (s->map.len >= LLMC_HEADER) memcpy(h, s->map.data, sizeof h);
    /* (a flat shard would have to begin with the tokens 55432, 308 or 55713, 308, or a u32 one with an id past 20 million) */
    if (h[0] == LLMC_U16 || h[0] == LLMC_U32) {
        const int version = h[0] == LLMC_U16 ? LLMC_U16_VERSION : LLMC_U32_VERSION;
        if (h[1] != version)
            return nv_fail(NV_EFORMAT, "%s: an llm.c shard of version %d, not %d (the one its magic %d has)", s->path, h[1], version, h[0]);
        s->width = h[0] == LLMC_U16 ? 2 : 4;
        if (h[2] < 0 || s->map.len - LLMC_HEADER != (size_t)h[2] * (size_t)s->width)
            return nv_fail(NV_EFORMAT, "%s: an llm.c shard of %d %d-byte tokens is %zu bytes, not %zu (truncated?)", s->path, h[2], s->width,
                           (size_t)LLMC_HEADER + (size_t)(h[2] < 0 ? 0 : h[2]) * (size_t)s->width, s->map.len);
        s->tokens = s->map.data + LLMC_HEADER;
        s->n_tokens = (uint64_t)h[2];
        return NV_OK;
    }
    if (s->map.len % (size_t)s->width)
        return nv_fail(NV_EFORMAT, "%s: %zu bytes is not a whole number of %d-byte tokens", s->path, s->map.len, s->width);
    s->n_tokens = s->map.len / (size_t)s->width;
    return NV_OK;
}

nv_err nv_dataset_open(nv_dataset *ds, const char *const *paths, int n, const nv_tokenizer *tok, int vocab_size,
                       float val_frac) {
    return nv_dataset_open_chat(ds, paths, n, tok, vocab_size, val_frac, NV_CHAT_CHATML);
}

nv_err nv_dataset_open_chat(nv_dataset *ds, const char *const *paths, int n, const nv_tokenizer *tok, int vocab_size,
                            float val_frac, nv_chat_template tmpl) {
    return nv_dataset_open_jinja(ds, paths, n, tok, vocab_size, val_frac, tmpl, NULL);
}

nv_err nv_dataset_open_jinja(nv_dataset *ds, const char *const *paths, int n, const nv_tokenizer *tok, int vocab_size,
                             float val_frac, nv_chat_template tmpl, const nv_jinja *jinja) {
    memset(ds, 0, sizeof *ds);
    if (n < 1) return nv_fail(NV_EINVAL, "no training data given (--data PATH)");
    if (!(val_frac >= 0.0f && val_frac < 1.0f)) return nv_fail(NV_EINVAL, "validation fraction must be in [0, 1)");
    ds->src = calloc((size_t)n, sizeof *ds->src);
    if (!ds->src) return nv_fail(NV_ENOMEM, "out of memory");
    ds->n_src = n;
    for (int i = 0; i < n; i++) {
        nv_source *s = &ds->src[i];
        s->jinja = jinja;
        if (snprintf(s->path, sizeof s->path, "%s", paths[i]) >= (int)sizeof s->path) {
            nv_dataset_close(ds);
            return nv_fail(NV_EINVAL, "data path too long: %.80s...", paths[i]);
        }
        nv_err e;
        if (has_suffix(s->path, ".bin") || has_suffix(s->path, ".u32")) {
            e = open_shard(s);
        } else if (nv_data_jsonl_is_text(s->path)) {
            e = load_jsonl_text(s, tok);
        } else if (has_suffix(s->path, ".jsonl")) {
            e = load_chat(s, tok, tmpl, val_frac);
            ds->chat = 1;
        } else if (nv_file_is_dir(s->path)) {
            e = load_text_dir(s, tok);
        } else {
            e = load_text(s, tok);
        }
        for (uint64_t j = 0; !e && j < s->n_tokens; j++)
            if (nv_source_token(s, j) >= (uint32_t)vocab_size)
                e = nv_fail(NV_EFORMAT, "%s: token %u at position %llu is outside the vocabulary of %d", s->path,
                            nv_source_token(s, j), (unsigned long long)j, vocab_size);
        if (e) {
            nv_dataset_close(ds);
            return e;
        }
        if (!s->starts) s->n_train = s->n_tokens - (uint64_t)((double)s->n_tokens * val_frac);
        ds->train_tokens += s->n_train;
        ds->val_tokens += s->n_tokens - s->n_train;
        ds->pref |= s->pairs;
        ds->templated |= s->templated;
    }
    for (int i = 0; i < n && ds->pref; i++)
        if (!ds->src[i].pairs) {
            char path[sizeof ds->src[i].path];
            memcpy(path, ds->src[i].path, sizeof path); /* closing frees it */
            nv_dataset_close(ds);
            return nv_fail(NV_EINVAL, "%s is not preference data: preference pairs train alone (give every --data file "
                                      "in the preference format, or train on the others first)",
                           path);
        }
    return NV_OK;
}

void nv_dataset_split_at(nv_dataset *ds, int first_val) {
    ds->train_tokens = ds->val_tokens = 0;
    for (int i = 0; i < ds->n_src; i++) {
        nv_source *s = &ds->src[i];
        const int train = i < first_val;
        s->n_train = train ? s->n_tokens : 0;
        if (s->starts) { /* chat data: whole turns; the split point is a turn's start */
            s->n_train_starts = train ? s->n_starts : 0;
            s->n_train = train ? s->n_tokens : s->starts[0];
        }
        ds->train_tokens += s->n_train;
        ds->val_tokens += s->n_tokens - s->n_train;
    }
}

nv_err nv_dataset_set_weights(nv_dataset *ds, const float *w, int n) {
    if (n < 1 || n > ds->n_src) return nv_fail(NV_EINVAL, "%d data weights for %d training files", n, ds->n_src);
    double sum = 0;
    for (int i = 0; i < n; i++) {
        if (!(w[i] >= 0.0f) || !isfinite(w[i])) return nv_fail(NV_EINVAL, "data weight %g: want a finite value >= 0", (double)w[i]);
        sum += w[i];
    }
    if (!(sum > 0)) return nv_fail(NV_EINVAL, "the data weights are all 0: nothing would train");
    double *shares = calloc((size_t)ds->n_src, sizeof *shares);
    if (!shares) return nv_fail(NV_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++) shares[i] = w[i] / sum;
    free(ds->weights);
    ds->weights = shares;
    return NV_OK;
}

void nv_dataset_close(nv_dataset *ds) {
    free(ds->weights);
    for (int i = 0; i < ds->n_src; i++) {
        nv_file_unmap(&ds->src[i].map);
        free(ds->src[i].owned);
        free(ds->src[i].trained);
        free(ds->src[i].starts);
    }
    free(ds->src);
    memset(ds, 0, sizeof *ds);
}

void nv_data_cursor_init(nv_data_cursor *c, uint64_t seed) {
    nv_rng r;
    nv_rng_seed(&r, seed ^ 0x5eedda7aull);
    c->rng = r.state;
    c->windows = 0;
}

static uint64_t rand_below(uint64_t *state, uint64_t n) {
    uint64_t hi = nv_xorshift_u32(state), lo = nv_xorshift_u32(state);
    return ((hi << 32) | lo) % n;
}

/* The training windows a source offers: a chat source's training turns, else every start of T + 1
   tokens in its training split. */
static uint64_t train_windows(const nv_source *s, int T) {
    if (s->starts) return s->n_train_starts;
    return s->n_train > (uint64_t)T ? s->n_train - (uint64_t)T : 0;
}

/* A weighted draw of the source of the next training window (nv_dataset_set_weights). */
static int weighted_source(const nv_dataset *ds, uint64_t *rng) {
    const double u = (double)rand_below(rng, 1ull << 53) / 9007199254740992.0; /* [0, 1) */
    double at = 0;
    int last = 0;
    for (int i = 0; i < ds->n_src; i++) {
        if (ds->weights[i] <= 0) continue;
        last = i;
        if (u < (at += ds->weights[i])) return i;
    }
    return last; /* (rounding: the shares' sum fell short of u) */
}

/* A weighted mixture: every source with a share must offer a window (or pair: count). */
static nv_err check_weighted(const nv_dataset *ds, uint64_t (*count)(const nv_source *, int), int T, const char *what) {
    for (int i = 0; i < ds->n_src; i++)
        if (ds->weights[i] > 0 && !count(&ds->src[i], T))
            return nv_fail(NV_EINVAL, "%s holds no training %s%s: give it weight 0, or more data", ds->src[i].path, what,
                           count == train_windows ? " of the window's length (or a shorter --seq)" : "");
    return NV_OK;
}

/* Window number w of a source's training or validation part into in/tg [T]. A chat turn starts the
   window and is cut after T + 1 tokens; past its end, padding whose targets are -1, as are its
   prompt's (packed: the training turns after it instead of padding, each from its start). */
static void fill_window(const nv_source *s, uint64_t first, int T, int pack, int *in, int *tg, int *seg) {
    if (seg) memset(seg, 0, (size_t)T * sizeof(int));
    if (!s->starts) {
        for (int t = 0; t < T; t++) {
            in[t] = (int)nv_source_token(s, first + (uint64_t)t);
            tg[t] = (int)nv_source_token(s, first + (uint64_t)t + 1);
        }
        return;
    }
    /* packed: the turns after it too, up to the end of the training part, each its own document */
    const uint64_t from = s->starts[first], end = s->starts[pack ? s->n_train_starts : first + 1];
    uint64_t next = first + 1; /* the next turn's start */
    int doc = 0;
    for (int t = 0; t < T; t++) {
        const uint64_t p = from + (uint64_t)t;
        while (pack && next < s->n_train_starts && s->starts[next] <= p) doc = (int)(s->starts[next++] - from);
        if (seg) seg[t] = doc;
        if (p + 1 < end) {
            in[t] = (int)nv_source_token(s, p);
            tg[t] = s->trained[p + 1] ? (int)nv_source_token(s, p + 1) : -1;
        } else {
            in[t] = 0;
            tg[t] = -1;
        }
    }
}

nv_err nv_data_next_batch(const nv_dataset *ds, nv_data_cursor *c, int B, int T, int *inputs, int *targets, int *seg) {
    if (ds->weights) {
        NV_TRY(check_weighted(ds, train_windows, T, ds->chat ? "turn" : "window"));
        for (int b = 0; b < B; b++) {
            const nv_source *s = &ds->src[weighted_source(ds, &c->rng)];
            fill_window(s, rand_below(&c->rng, train_windows(s, T)), T, ds->pack, inputs + (size_t)b * T, targets + (size_t)b * T,
                        seg ? seg + (size_t)b * T : NULL);
            c->windows++;
        }
        return NV_OK;
    }
    uint64_t total = 0;
    for (int i = 0; i < ds->n_src; i++) total += train_windows(&ds->src[i], T);
    if (!total)
        return nv_fail(NV_EINVAL, "training data is too short for a window of %d tokens (have %llu)%s", T + 1,
                       (unsigned long long)ds->train_tokens, ds->chat ? ", or holds no training conversation" : "");
    for (int b = 0; b < B; b++) {
        uint64_t r = rand_below(&c->rng, total);
        const nv_source *s = ds->src;
        for (int i = 0; i < ds->n_src; i++) {
            uint64_t starts = train_windows(&ds->src[i], T);
            if (r < starts) {
                s = &ds->src[i];
                break;
            }
            r -= starts;
        }
        fill_window(s, r, T, ds->pack, inputs + (size_t)b * T, targets + (size_t)b * T, seg ? seg + (size_t)b * T : NULL);
        c->windows++;
    }
    return NV_OK;
}

/* A source's validation windows of T: its held-out turns (chat data), or its held-out text cut into
   windows of T + 1 tokens overlapping by one. */
static uint64_t val_windows_of(const nv_source *src, int T) {
    const uint64_t len = src->n_tokens - src->n_train;
    return src->starts ? src->n_starts - src->n_train_starts : len > (uint64_t)T ? (len - 1) / (uint64_t)T : 0;
}

uint64_t nv_data_val_windows(const nv_dataset *ds, int T) {
    uint64_t total = 0;
    for (int s = 0; s < ds->n_src; s++) total += val_windows_of(&ds->src[s], T);
    return total;
}

int nv_data_val_batch(const nv_dataset *ds, uint64_t i, int B, int T, int *inputs, int *targets) {
    /* windows tile each source's validation split (a chat source's: its turns), in order across sources */
    const uint64_t total = nv_data_val_windows(ds, T);
    if (!total) return 0;
    for (int b = 0; b < B; b++) {
        uint64_t w = (i * (uint64_t)B + (uint64_t)b) % total;
        int s = 0;
        while (w >= val_windows_of(&ds->src[s], T)) w -= val_windows_of(&ds->src[s++], T);
        const nv_source *src = &ds->src[s];
        fill_window(src, src->starts ? src->n_train_starts + w : src->n_train + w * (uint64_t)T, T, 0,
                    inputs + (size_t)b * T, targets + (size_t)b * T, NULL);
    }
    return 1;
}

uint64_t nv_data_pairs(const nv_dataset *ds) {
    uint64_t n = 0;
    for (int i = 0; i < ds->n_src; i++) n += ds->src[i].n_starts / 2;
    return n;
}

/* Pair p's source and its pair number there. */
static const nv_source *pair_source(const nv_dataset *ds, uint64_t *p) {
    for (int i = 0; i < ds->n_src; i++) {
        if (*p < ds->src[i].n_starts / 2) return &ds->src[i];
        *p -= ds->src[i].n_starts / 2;
    }
    return NULL;
}

void nv_data_pair(const nv_dataset *ds, uint64_t p, int T, int *in, int *tg) {
    const nv_source *s = pair_source(ds, &p);
    for (int k = 0; k < 2; k++) {
        if (s) {
            fill_window(s, 2 * p + (uint64_t)k, T, 0, in + (size_t)k * T, tg + (size_t)k * T, NULL);
        } else { /* past the last pair: nothing to score */
            memset(in + (size_t)k * T, 0, (size_t)T * sizeof(int));
            for (int t = 0; t < T; t++) tg[(size_t)k * T + t] = -1;
        }
    }
}

/* A source's training pairs (val 0) or validation pairs (val 1), and the global number of its first. */
static uint64_t pairs_in(const nv_source *s, int val) {
    return val ? (s->n_starts - s->n_train_starts) / 2 : s->n_train_starts / 2;
}

/* The global number of the w-th training (val 0) or validation (val 1) pair, sources in order. */
static uint64_t nth_pair(const nv_dataset *ds, uint64_t w, int val) {
    uint64_t base = 0;
    int i = 0;
    for (uint64_t here; w >= (here = pairs_in(&ds->src[i], val)); i++) w -= here, base += ds->src[i].n_starts / 2;
    return base + (val ? ds->src[i].n_train_starts / 2 : 0) + w;
}

static uint64_t train_pairs(const nv_source *s, int T) {
    (void)T;
    return pairs_in(s, 0);
}

static uint64_t total_pairs(const nv_dataset *ds, int val) {
    uint64_t total = 0;
    for (int i = 0; i < ds->n_src; i++) total += pairs_in(&ds->src[i], val);
    return total;
}

nv_err nv_data_next_pairs(const nv_dataset *ds, nv_data_cursor *c, int B, int T, int *inputs, int *targets,
                          uint64_t *ids) {
    if (B % 2) return nv_fail(NV_EINVAL, "preference pairs need an even batch (each pair is two windows)");
    const uint64_t total = total_pairs(ds, 0);
    if (!total) return nv_fail(NV_EINVAL, "the preference data holds no training pair");
    if (ds->weights) NV_TRY(check_weighted(ds, train_pairs, T, "pair"));
    for (int b = 0; b < B / 2; b++) {
        if (ds->weights) { /* a source by its share, then one of its training pairs (numbered first in it) */
            const int i = weighted_source(ds, &c->rng);
            uint64_t base = 0;
            for (int k = 0; k < i; k++) base += ds->src[k].n_starts / 2;
            ids[b] = base + rand_below(&c->rng, train_pairs(&ds->src[i], T));
        } else {
            ids[b] = nth_pair(ds, rand_below(&c->rng, total), 0);
        }
        nv_data_pair(ds, ids[b], T, inputs + (size_t)b * 2 * T, targets + (size_t)b * 2 * T);
        c->windows += 2;
    }
    return NV_OK;
}

int nv_data_val_pairs(const nv_dataset *ds, int i, int B, int T, int *inputs, int *targets, uint64_t *ids) {
    const uint64_t total = total_pairs(ds, 1);
    if (!total || B < 2) return 0;
    for (int b = 0; b < B / 2; b++) {
        ids[b] = nth_pair(ds, ((uint64_t)i * (uint64_t)(B / 2) + (uint64_t)b) % total, 1);
        nv_data_pair(ds, ids[b], T, inputs + (size_t)b * 2 * T, targets + (size_t)b * 2 * T);
    }
    return 1;
}

double nv_data_epoch_windows(const nv_dataset *ds, int T) {
    double n = 0;
    for (int i = 0; i < ds->n_src; i++) {
        const nv_source *s = &ds->src[i];
        if (ds->weights && ds->weights[i] <= 0) continue; /* a source a mixture leaves out */
        n += s->starts ? (double)s->n_train_starts : (double)s->n_train / T;
    }
    return n;
}

double nv_dataset_unigram_loss(const nv_dataset *ds, int vocab_size) {
    double *cnt = calloc((size_t)vocab_size, sizeof(double));
    if (!cnt) return 0.0;
    double n = 0;
    for (int i = 0; i < ds->n_src; i++) {
        const nv_source *s = &ds->src[i];
        double scale = 1; /* a mixture's: each source's tokens weighted to its share */
        if (ds->weights) {
            uint64_t k = 0;
            for (uint64_t j = 0; j < s->n_train; j++) k += !s->trained || s->trained[j];
            scale = k ? ds->weights[i] / (double)k : 0;
        }
        for (uint64_t j = 0; j < s->n_train; j++) {
            if (s->trained && !s->trained[j]) continue; /* chat: the answers' tokens only */
            uint32_t t = nv_source_token(s, j);
            if (t < (uint32_t)vocab_size) cnt[t] += scale, n += scale;
        }
    }
    double h = 0;
    for (int v = 0; v < vocab_size; v++)
        if (cnt[v] > 0) h -= cnt[v] / n * log(cnt[v] / n);
    free(cnt);
    return h;
}
