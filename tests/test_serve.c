/* nerve serve end to end: the real binary on a free loopback port, driven over plain sockets.
 * Whole and streamed responses, llama2.c's golden text through the API, 8 concurrent greedy
 * requests equal to each alone, 16 concurrent clients, a table of bad requests, disconnects,
 * 429 with a tiny KV budget, timeouts, auth and CORS, and a clean exit 0 on SIGTERM. */
#include <ctype.h>
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <math.h>

#include "engine/engine.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "serve/chat.h"
#include "serve_util.h"
#include "t.h"

static char tmpdir[256];
static const char *model_path, *tok_path;

/* ---- server processes ----------------------------------------------------------------------- */

/* Starts `nerve serve -m MODEL -z TOK --port 0 ARGS` with env (NAME=VALUE or NULL). */
static int server_start(server *s, const char *name, const char *args, const char *env) {
    return server_spawn(s, name, NULL, env, model_path, tok_path, args, 30);
}

static int server_stop(server *s) { return server_stop_within(s, 20); }

static int connect_to(int port) { return connect_to_within(port, 60); }


/* ---- OpenAI response helpers ----------------------------------------------------------------- */

typedef struct {
    int status;
    char text[8192];
    char finish[32];
    char stop_reason[300]; /* vLLM's, as JSON, from the choice that finished ("" when absent) */
    int prompt_tokens, completion_tokens;
    int pred_accepted, pred_rejected; /* usage.completion_tokens_details' (0 when absent) */
    int events, done, error_event, usage_chunk;
} result;

/* Word 4-grams of a text that appeared before in it (a repetition count). */
static int repeated_4grams(const char *text) {
    char words[512][32];
    int n = 0, rep = 0;
    for (const char *p = text; *p && n < 512;) {
        while (*p && isspace((unsigned char)*p)) p++;
        int k = 0;
        while (*p && !isspace((unsigned char)*p)) {
            if (k < 31) words[n][k++] = *p;
            p++;
        }
        words[n][k] = '\0';
        if (k) n++;
    }
    for (int i = 3; i < n; i++)
        for (int j = 3; j < i; j++)
            if (!strcmp(words[i], words[j]) && !strcmp(words[i - 1], words[j - 1]) && !strcmp(words[i - 2], words[j - 2]) &&
                !strcmp(words[i - 3], words[j - 3])) {
                rep++;
                break;
            }
    return rep;
}

static void copy_text(result *out, const cJSON *choice, int chat, int stream) {
    const cJSON *t = NULL;
    if (!chat) t = cJSON_GetObjectItem(choice, "text");
    else t = cJSON_GetObjectItem(cJSON_GetObjectItem(choice, stream ? "delta" : "message"), "content");
    if (cJSON_IsString(t)) strncat(out->text, t->valuestring, sizeof out->text - strlen(out->text) - 1);
    const cJSON *f = cJSON_GetObjectItem(choice, "finish_reason");
    if (cJSON_IsString(f)) snprintf(out->finish, sizeof out->finish, "%s", f->valuestring);
    char *why = cJSON_IsString(f) && cJSON_GetObjectItem(choice, "stop_reason") ? cJSON_PrintUnformatted(cJSON_GetObjectItem(choice, "stop_reason")) : NULL;
    if (why) snprintf(out->stop_reason, sizeof out->stop_reason, "%s", why);
    free(why);
}

static void copy_usage(result *out, const cJSON *root) {
    const cJSON *u = cJSON_GetObjectItem(root, "usage");
    if (!cJSON_IsObject(u)) return;
    out->prompt_tokens = cJSON_GetObjectItem(u, "prompt_tokens")->valueint;
    out->completion_tokens = cJSON_GetObjectItem(u, "completion_tokens")->valueint;
    const cJSON *d = cJSON_GetObjectItem(u, "completion_tokens_details");
    out->pred_accepted = cJSON_GetNumberValue(cJSON_GetObjectItem(d, "accepted_prediction_tokens")) > 0
                             ? cJSON_GetObjectItem(d, "accepted_prediction_tokens")->valueint : 0;
    out->pred_rejected = cJSON_GetNumberValue(cJSON_GetObjectItem(d, "rejected_prediction_tokens")) > 0
                             ? cJSON_GetObjectItem(d, "rejected_prediction_tokens")->valueint : 0;
}

/* POSTs body to the endpoint and collects text, finish reason and usage (streamed or not). */
static int complete(int port, int chat, const char *headers, const char *body, result *out);

/* A completion with logprobs: 1 when its records' tokens, in order, spell its text and each record's
 * text_offset is where its token begins. */
static int records_spell_text(int port, const char *body) {
    resp r;
    if (!http(port, "POST", "/v1/completions", NULL, body, &r) || r.status != 200) {
        fprintf(stderr, "    %d %s\n", r.status, r.body ? r.body : "");
        resp_free(&r);
        return 0;
    }
    cJSON *j = cJSON_Parse(r.body);
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), *lp = cJSON_GetObjectItem(ch, "logprobs");
    const char *text = cJSON_GetStringValue(cJSON_GetObjectItem(ch, "text"));
    const cJSON *toks = cJSON_GetObjectItem(lp, "tokens"), *offs = cJSON_GetObjectItem(lp, "text_offset");
    nv_buf spelled = {0};
    int ok = text && cJSON_GetArraySize(toks) == cJSON_GetArraySize(offs) && cJSON_GetArraySize(toks) > 0;
    for (int i = 0; ok && i < cJSON_GetArraySize(toks); i++) {
        ok = cJSON_GetArrayItem(offs, i)->valueint == (int)spelled.len;
        nv_buf_puts(&spelled, cJSON_GetStringValue(cJSON_GetArrayItem(toks, i)));
    }
    ok = ok && spelled.data && !strcmp(spelled.data, text);
    if (!ok) fprintf(stderr, "    the records spell '%s', the text is '%s'\n", spelled.data ? spelled.data : "", text ? text : "");
    nv_buf_free(&spelled);
    cJSON_Delete(j);
    resp_free(&r);
    return ok;
}

static int complete(int port, int chat, const char *headers, const char *body, result *out) {
    memset(out, 0, sizeof *out);
    resp r;
    if (!http(port, "POST", chat ? "/v1/chat/completions" : "/v1/completions", headers, body, &r)) return 0;
    out->status = r.status;
    int ok = 1;
    if (r.status == 200 && strstr(r.head, "text/event-stream")) {
        char *save = NULL;
        for (char *ev = strtok_r(r.body, "\n", &save); ev; ev = strtok_r(NULL, "\n", &save)) {
            if (strncmp(ev, "data: ", 6) != 0) {
                ok = 0;
                continue;
            }
            ev += 6;
            out->events++;
            if (!strcmp(ev, "[DONE]")) {
                out->done++;
                continue;
            }
            cJSON *root = cJSON_Parse(ev);
            if (!root) {
                ok = 0;
                continue;
            }
            if (cJSON_GetObjectItem(root, "error")) out->error_event++;
            const cJSON *choices = cJSON_GetObjectItem(root, "choices");
            if (cJSON_IsArray(choices) && cJSON_GetArraySize(choices) == 0) out->usage_chunk++;
            if (cJSON_IsArray(choices) && cJSON_GetArraySize(choices) == 1)
                copy_text(out, cJSON_GetArrayItem(choices, 0), chat, 1);
            copy_usage(out, root);
            cJSON_Delete(root);
        }
    } else if (r.status == 200) {
        cJSON *root = cJSON_Parse(r.body);
        const cJSON *choices = root ? cJSON_GetObjectItem(root, "choices") : NULL;
        ok = cJSON_IsArray(choices) && cJSON_GetArraySize(choices) == 1;
        if (ok) copy_text(out, cJSON_GetArrayItem(choices, 0), chat, 0);
        if (root) copy_usage(out, root);
        cJSON_Delete(root);
    }
    resp_free(&r);
    return ok;
}

/* An error body must be exactly {"error":{"message":str,"type":str,"param":str|null,"code":str|null}}. */
static int error_body_ok(const char *body, const char *param, const char *code, char *why, size_t cap) {
    cJSON *root = cJSON_Parse(body);
    const cJSON *e = root ? cJSON_GetObjectItem(root, "error") : NULL;
    int ok = 0;
    if (!cJSON_IsObject(e) || cJSON_GetArraySize(root) != 1) snprintf(why, cap, "no error object");
    else if (cJSON_GetArraySize(e) != 4) snprintf(why, cap, "error object has %d fields", cJSON_GetArraySize(e));
    else {
        const cJSON *m = cJSON_GetObjectItem(e, "message"), *t = cJSON_GetObjectItem(e, "type"),
                    *p = cJSON_GetObjectItem(e, "param"), *c = cJSON_GetObjectItem(e, "code");
        if (!cJSON_IsString(m) || !*m->valuestring || !cJSON_IsString(t) || !p || !c ||
            !(cJSON_IsString(p) || cJSON_IsNull(p)) || !(cJSON_IsString(c) || cJSON_IsNull(c)))
            snprintf(why, cap, "fields of the wrong type");
        else if (param && (!cJSON_IsString(p) || strcmp(p->valuestring, param)))
            snprintf(why, cap, "param is %s, want %s", cJSON_IsString(p) ? p->valuestring : "null", param);
        else if (code && (!cJSON_IsString(c) || strcmp(c->valuestring, code)))
            snprintf(why, cap, "code is %s, want %s", cJSON_IsString(c) ? c->valuestring : "null", code);
        else ok = 1;
    }
    cJSON_Delete(root);
    return ok;
}

/* ---- the main server ------------------------------------------------------------------------- */

static server main_srv;
static int main_up;

static void test_basic_endpoints(void) {
    if (!main_up) return t_skip("the main server did not start");
    int port = main_srv.port;
    resp r;
    T_CHECK(http(port, "GET", "/health", NULL, NULL, &r) && r.status == 200 && strstr(r.body, "ok"), "health %d", r.status);
    resp_free(&r);
    T_CHECK(http(port, "GET", "/v1/models", NULL, NULL, &r) && r.status == 200, "models %d", r.status);
    cJSON *m = cJSON_Parse(r.body);
    const cJSON *d0 = cJSON_GetArrayItem(cJSON_GetObjectItem(m, "data"), 0);
    T_CHECK(d0 && !strcmp(cJSON_GetObjectItem(d0, "id")->valuestring, "tiny-stories") &&
                !strcmp(cJSON_GetObjectItem(m, "object")->valuestring, "list") &&
                cJSON_GetObjectItem(d0, "max_model_len") && cJSON_GetObjectItem(d0, "max_model_len")->valueint == 512 &&
                !strcmp(cJSON_GetObjectItem(d0, "root")->valuestring, "tiny-stories"),
            "models body %s", r.body);
    cJSON_Delete(m);
    T_CHECK(!strcasestr(r.head, "Access-Control-Allow-Origin"), "CORS header without --cors");
    resp_free(&r);
    T_CHECK(http(port, "GET", "/v1/models/tiny-stories", NULL, NULL, &r) && r.status == 200, "model %d", r.status);
    resp_free(&r);
    /* token counting: /tokenize and /detokenize (llama.cpp's and vLLM's paths) */
    T_CHECK(http(port, "POST", "/tokenize", NULL, "{\"content\":\"Once upon a time\"}", &r) && r.status == 200 &&
                strstr(r.body, "\"tokens\":[403,407,261,378]") && strstr(r.body, "\"count\":4"),
            "tokenize %d %s", r.status, r.body);
    resp_free(&r);
    T_CHECK(http(port, "POST", "/v1/detokenize", NULL, "{\"tokens\":[403,407]}", &r) && r.status == 200 &&
                strstr(r.body, "\"content\":\"Once upon\""),
            "detokenize %d %s", r.status, r.body);
    resp_free(&r);

    /* the prompt a chat request becomes, as text (llama.cpp's /apply-template); plain for a llama2.c model */
    T_CHECK(http(port, "POST", "/apply-template", NULL,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Once\"},{\"role\":\"user\",\"content\":\"upon\"}]}", &r) &&
                r.status == 200 && !strcmp(r.body, "{\"prompt\":\"<s>Once\\nupon\"}"),
            "apply-template %d %s", r.status, r.body);
    resp_free(&r);
    T_CHECK(http(port, "POST", "/apply-template", NULL, "{\"messages\":\"Once\"}", &r) && r.status == 400 &&
                strstr(r.body, "\"param\":\"messages\""),
            "apply-template without messages %d %s", r.status, r.body);
    resp_free(&r);

    /* a whole completion: every field OpenAI clients read */
    T_CHECK(http(port, "POST", "/v1/completions", NULL, "{\"model\":\"tiny-stories\",\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"temperature\":0}", &r) &&
                r.status == 200,
            "completion %d %s", r.status, r.body);
    cJSON *c = cJSON_Parse(r.body);
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(c, "choices"), 0), *u = cJSON_GetObjectItem(c, "usage");
    T_CHECK(c && !strncmp(cJSON_GetObjectItem(c, "id")->valuestring, "cmpl-", 5) &&
                !strcmp(cJSON_GetObjectItem(c, "object")->valuestring, "text_completion") &&
                cJSON_IsNumber(cJSON_GetObjectItem(c, "created")) &&
                !strcmp(cJSON_GetObjectItem(c, "model")->valuestring, "tiny-stories") && ch &&
                cJSON_GetObjectItem(ch, "index")->valueint == 0 && cJSON_IsString(cJSON_GetObjectItem(ch, "text")) &&
                !strcmp(cJSON_GetObjectItem(ch, "finish_reason")->valuestring, "length") && u &&
                cJSON_GetObjectItem(u, "completion_tokens")->valueint == 24 &&
                cJSON_GetObjectItem(u, "prompt_tokens")->valueint == 5 &&
                cJSON_GetObjectItem(u, "total_tokens")->valueint == 29,
            "completion body %s", r.body);
    cJSON_Delete(c);
    resp_free(&r);

    /* the same as a stream, as chat, and as a streamed chat with usage: the same text */
    result whole, s, chat, schat;
    complete(port, 0, NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"temperature\":0}", &whole);
    T_CHECK(complete(port, 0, NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"temperature\":0,\"stream\":true}", &s),
            "bad stream");
    T_CHECK(s.status == 200 && s.done == 1 && !strcmp(s.text, whole.text) && !strcmp(s.finish, "length") && s.usage_chunk == 0,
            "stream: status %d done %d finish %s text '%s' vs '%s'", s.status, s.done, s.finish, s.text, whole.text);
    T_CHECK(strlen(whole.text) > 20, "short completion '%s'", whole.text);
    T_CHECK(complete(port, 1, NULL, "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"max_tokens\":24,\"temperature\":0}", &chat),
            "bad chat");
    T_CHECK(chat.status == 200 && !strcmp(chat.text, whole.text) && chat.prompt_tokens == 5, "chat (plain template): '%s'", chat.text);
    T_CHECK(complete(port, 1, NULL,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"max_completion_tokens\":24,"
                     "\"temperature\":0,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
                     &schat),
            "bad chat stream");
    T_CHECK(schat.status == 200 && schat.done == 1 && schat.usage_chunk == 1 && !strcmp(schat.text, whole.text) &&
                schat.completion_tokens == 24 && schat.prompt_tokens == 5 && !strcmp(schat.finish, "length"),
            "chat stream: done %d usage %d completion %d '%s'", schat.done, schat.usage_chunk, schat.completion_tokens,
            schat.text);

    /* echo, token-id prompts */
    result echo, ids;
    complete(port, 0, NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"temperature\":0,\"echo\":true}", &echo);
    char want[9000];
    snprintf(want, sizeof want, "Once upon a time%s", whole.text);
    T_CHECK(echo.status == 200 && !strcmp(echo.text, want), "echo: '%s'", echo.text);
    complete(port, 0, NULL, "{\"prompt\":[1,403,407,261,378],\"max_tokens\":4,\"temperature\":0}", &ids);
    T_CHECK(ids.status == 200 && ids.prompt_tokens == 5 && ids.completion_tokens == 4, "token prompt: %d", ids.status);
}

static void test_stop_strings_and_sampling(void) {
    if (!main_up) return t_skip("the main server did not start");
    int port = main_srv.port;
    result whole, cut, list, a, b, c;
    complete(port, 0, NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0}", &whole);
    /* stop at a word from the greedy text: the text before it, finish "stop" */
    const char *w = strstr(whole.text, "girl");
    T_CHECK(w != NULL, "greedy text lacks 'girl': %s", whole.text);
    if (!w) return;
    complete(port, 0, NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0,\"stop\":\"girl\"}", &cut);
    T_CHECK(cut.status == 200 && !strcmp(cut.finish, "stop") && strlen(cut.text) == (size_t)(w - whole.text) &&
                !strncmp(cut.text, whole.text, strlen(cut.text)),
            "stop: finish %s text '%s'", cut.finish, cut.text);
    /* vLLM's stop_reason: the stop string that ended it, whole and streamed; null at a limit */
    T_CHECK(!strcmp(cut.stop_reason, "\"girl\"") && !strcmp(whole.stop_reason, "null"), "stop_reason: %s, at the limit %s",
            cut.stop_reason, whole.stop_reason);
    complete(port, 0, NULL,
             "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0,\"stop\":[\"zzz\",\"girl\"],\"stream\":true}", &list);
    T_CHECK(list.status == 200 && !strcmp(list.finish, "stop") && !strcmp(list.text, cut.text) && !strcmp(list.stop_reason, "\"girl\""),
            "streamed stop list: '%s' (stop_reason %s)", list.text, list.stop_reason);
    /* the same seed gives the same sample; another seed (almost surely) another */
    const char *fmt = "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":1.0,\"top_p\":0.9,\"seed\":%d}";
    char body[256];
    snprintf(body, sizeof body, fmt, 1234);
    complete(port, 0, NULL, body, &a);
    complete(port, 0, NULL, body, &b);
    snprintf(body, sizeof body, fmt, 99);
    complete(port, 0, NULL, body, &c);
    T_CHECK(a.status == 200 && !strcmp(a.text, b.text), "same seed, different text");
    T_CHECK(strcmp(a.text, c.text) != 0, "different seeds, same text");
    /* ignore_eos: the greedy story, which ends by itself (EOS; 246 tokens on the vector engines), goes
     * on to max_tokens; min_tokens holds its end off until then */
    result story, ign, mint;
    complete(port, 0, NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":400,\"temperature\":0}", &story);
    T_CHECK(story.status == 200 && !strcmp(story.finish, "stop") && story.completion_tokens < 380 && !strcmp(story.stop_reason, "null"),
            "the greedy story should end by itself: %d tokens, %s (stop_reason %s: an end token is none)", story.completion_tokens,
            story.finish, story.stop_reason);
    complete(port, 0, NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":400,\"temperature\":0,\"ignore_eos\":true}", &ign);
    T_CHECK(ign.status == 200 && !strcmp(ign.finish, "length") && ign.completion_tokens == 400 &&
                !strncmp(ign.text, story.text, strlen(story.text)) && strlen(ign.text) > strlen(story.text),
            "ignore_eos: %d tokens, %s", ign.completion_tokens, ign.finish);
    snprintf(body, sizeof body, "{\"prompt\":\"Once upon a time\",\"max_tokens\":400,\"temperature\":0,\"min_tokens\":%d}",
             story.completion_tokens + 20);
    complete(port, 0, NULL, body, &mint);
    T_CHECK(mint.status == 200 && mint.completion_tokens >= story.completion_tokens + 20, "min_tokens %d: %d tokens",
            story.completion_tokens + 20, mint.completion_tokens);
    /* top_k 1 samples the most likely token: greedy's text at any temperature */
    result k1, greedy40;
    complete(port, 0, NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0}", &greedy40);
    complete(port, 0, NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":1.5,\"top_k\":1,\"seed\":3}", &k1);
    T_CHECK(k1.status == 200 && greedy40.status == 200 && !strcmp(k1.text, greedy40.text), "top_k 1: '%s' against greedy '%s'",
            k1.text, greedy40.text);
    /* logit_bias: +100 on one token makes greedy repeat it; a frequency penalty changes the
     * greedy text (stories260K repeats itself within 60 tokens), neutral values change nothing */
    result forced, pen, neutral, plain;
    nv_tokenizer *t_tok = NULL;
    T_CHECK(nv_tokenizer_load(tok_path, 512, &t_tok) == NV_OK, "%s", nv_errmsg());
    if (!t_tok) return;
    int t_id = nv_tokenizer_lookup(t_tok, "ing"); /* a plain text piece of tok512 */
    T_CHECK(t_id > 2, "tok512 has no piece 'ing'");
    snprintf(body, sizeof body, "{\"prompt\":\"Once\",\"max_tokens\":5,\"temperature\":0,\"logit_bias\":{\"%d\":100}}", t_id);
    complete(port, 0, NULL, body, &forced);
    const char *piece = nv_tokenizer_decode(t_tok, t_id, t_id);
    char five[256] = "";
    for (int i = 0; i < 5; i++) strncat(five, piece, sizeof five - strlen(five) - 1);
    T_CHECK(forced.status == 200 && !strcmp(forced.text, five), "logit_bias +100: '%s', want '%s'", forced.text, five);
    /* vLLM's allowed_token_ids: one token allowed, five of it; bad_words: the greedy story's "girl" and
       "Lily" never come, the text the same up to the first */
    result only, banned, base;
    snprintf(body, sizeof body, "{\"prompt\":\"Once\",\"max_tokens\":5,\"temperature\":0.8,\"allowed_token_ids\":[%d]}", t_id);
    complete(port, 0, NULL, body, &only);
    T_CHECK(only.status == 200 && !strcmp(only.text, five), "allowed_token_ids: '%s', want '%s'", only.text, five);
    complete(port, 0, NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":60,\"temperature\":0}", &base);
    complete(port, 0, NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":60,\"temperature\":0,\"bad_words\":[\"girl\", \" Lily\"]}", &banned);
    const char *g = strstr(base.text, " girl"), *l = strstr(base.text, " Lily");
    const char *first_bad = g && (!l || g < l) ? g : l;
    const size_t same = first_bad ? (size_t)(first_bad - base.text) : 0;
    T_CHECK(g && l && banned.status == 200 && !strstr(banned.text, " girl") && !strstr(banned.text, " Lily") && same > 0 &&
                !strncmp(banned.text, base.text, same) && strcmp(banned.text, base.text) != 0,
            "bad_words: '%s' against '%s'", banned.text, base.text);
    result at_start; /* a word of two tokens whose first begins the answer: its second never follows */
    complete(port, 0, NULL, "{\"prompt\":\"Once upon a time,\",\"max_tokens\":8,\"temperature\":0,\"bad_words\":[\"there was\"]}", &at_start);
    T_CHECK(at_start.status == 200 && !strncmp(at_start.text, " there", 6) && strncmp(at_start.text, " there was", 10) != 0,
            "bad_words at the answer's start: '%s'", at_start.text);
    static const char *const bad_filters[] = {"\"allowed_token_ids\":[]", "\"allowed_token_ids\":[512]", "\"allowed_token_ids\":[1.5]",
                                              "\"allowed_token_ids\":3", "\"bad_words\":[\" \"]", "\"bad_words\":\"girl\"", "\"bad_words\":[1]",
                                              "\"stop_token_ids\":[-1]", "\"stop_token_ids\":7", "\"include_stop_str_in_output\":1",
                                              "\"skip_special_tokens\":\"no\"", "\"truncate_prompt_tokens\":0", "\"truncate_prompt_tokens\":2,\"echo\":true",
                                              "\"priority\":1.5", "\"priority\":3", "\"allowed_token_ids\":[383],\"bad_words\":[\"there\"]",
                                              "\"allowed_token_ids\":[2],\"min_tokens\":1", "\"truncate_prompt_tokens\":100000",
                                              "\"truncate_prompt_tokens\":3,\"suffix\":\"x\""};
    for (size_t i = 0; i < sizeof bad_filters / sizeof *bad_filters; i++) {
        result e;
        snprintf(body, sizeof body, "{\"prompt\":\"Once\",\"max_tokens\":2,%s}", bad_filters[i]);
        complete(port, 0, NULL, body, &e);
        T_CHECK(e.status == 400, "%s: %d", bad_filters[i], e.status);
    }
    /* return_tokens_as_token_ids: each record's token as its id */
    resp ids_r;
    snprintf(body, sizeof body, "{\"prompt\":\"Once\",\"max_tokens\":3,\"temperature\":0,\"logprobs\":1,\"return_tokens_as_token_ids\":true,\"logit_bias\":{\"%d\":100}}", t_id);
    char want_ids[64];
    snprintf(want_ids, sizeof want_ids, "\"tokens\":[\"token_id:%d\",\"token_id:%d\",\"token_id:%d\"]", t_id, t_id, t_id);
    T_CHECK(http(port, "POST", "/v1/completions", NULL, body, &ids_r) && ids_r.status == 200 && strstr(ids_r.body, want_ids),
            "return_tokens_as_token_ids: %s", ids_r.body ? ids_r.body : "");
    resp_free(&ids_r);
    /* vLLM's include_stop_str_in_output, stop_token_ids (held off by min_tokens), skip_special_tokens,
       truncate_prompt_tokens */
    result kept, by_id, by_id_kept, held, special, trunc, by_ids;
    char want[9000];
    complete(port, 0, NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0,\"stop\":\"girl\",\"include_stop_str_in_output\":true}", &kept);
    snprintf(want, sizeof want, "%sgirl", cut.text);
    T_CHECK(kept.status == 200 && !strcmp(kept.finish, "stop") && !strcmp(kept.text, want) && !strcmp(kept.stop_reason, "\"girl\""),
            "include_stop_str_in_output: '%s' (stop_reason %s)", kept.text, kept.stop_reason);
    int *was = NULL, n_was = 0;
    T_CHECK(nv_tokenizer_encode(t_tok, "was", 0, 0, &was, &n_was) == NV_OK && n_was == 1, "' was' is one token");
    const char *w_at = strstr(whole.text, " was");
    if (n_was == 1 && w_at) {
        snprintf(body, sizeof body, "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0,\"stop_token_ids\":[%d]}", was[0]);
        complete(port, 0, NULL, body, &by_id);
        char id_text[16];
        snprintf(id_text, sizeof id_text, "%d", was[0]);
        T_CHECK(by_id.status == 200 && !strcmp(by_id.finish, "stop") && strlen(by_id.text) == (size_t)(w_at - whole.text) &&
                    !strncmp(by_id.text, whole.text, strlen(by_id.text)) && !strcmp(by_id.stop_reason, id_text),
                "stop_token_ids: '%s' (stop_reason %s)", by_id.text, by_id.stop_reason);
        snprintf(body, sizeof body, "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0,\"stop_token_ids\":[%d],"
                                    "\"include_stop_str_in_output\":true}", was[0]);
        complete(port, 0, NULL, body, &by_id_kept);
        snprintf(want, sizeof want, "%s was", by_id.text);
        T_CHECK(by_id_kept.status == 200 && !strcmp(by_id_kept.text, want) && !strcmp(by_id_kept.stop_reason, id_text),
                "stop_token_ids kept: '%s' (stop_reason %s)", by_id_kept.text, by_id_kept.stop_reason);
        snprintf(body, sizeof body, "{\"prompt\":\"Once upon a time\",\"max_tokens\":12,\"temperature\":0,\"stop_token_ids\":[%d],\"min_tokens\":12}", was[0]);
        complete(port, 0, NULL, body, &held);
        T_CHECK(held.status == 200 && held.completion_tokens == 12 && !strstr(held.text, " was"), "min_tokens holds a stop token off: '%s'", held.text);
    }
    const int was_id = n_was == 1 ? was[0] : -1;
    free(was);
    complete(port, 0, NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":400,\"temperature\":0,\"ignore_eos\":true,\"skip_special_tokens\":false}", &special);
    const char *bos_text = nv_tokenizer_special_text(t_tok, nv_tokenizer_bos(t_tok));
    T_CHECK(special.status == 200 && bos_text && *bos_text && strstr(special.text, bos_text) && !strstr(ign.text, bos_text),
            "skip_special_tokens false: the end token's text shows: '%s'", special.text);
    int *p_ids = NULL, n_p = 0;
    T_CHECK(nv_tokenizer_encode(t_tok, "Once upon a time there was a big dog", 1, 0, &p_ids, &n_p) == NV_OK && n_p > 4, "encode");
    if (n_p > 4) {
        complete(port, 0, NULL, "{\"prompt\":\"Once upon a time there was a big dog\",\"max_tokens\":6,\"temperature\":0,\"truncate_prompt_tokens\":3}", &trunc);
        snprintf(body, sizeof body, "{\"prompt\":[%d,%d,%d],\"max_tokens\":6,\"temperature\":0}", p_ids[n_p - 3], p_ids[n_p - 2], p_ids[n_p - 1]);
        complete(port, 0, NULL, body, &by_ids);
        T_CHECK(trunc.status == 200 && trunc.prompt_tokens == 3 && by_ids.status == 200 && !strcmp(trunc.text, by_ids.text),
                "truncate_prompt_tokens 3: %d tokens, '%s' against '%s'", trunc.prompt_tokens, trunc.text, by_ids.text);
    }
    free(p_ids);
    /* the log-probability records spell the answer whatever it keeps: a control token's text, a kept stop token */
    if (was_id >= 0) {
        snprintf(body, sizeof body, "{\"prompt\":\"Once upon a time\",\"max_tokens\":400,\"temperature\":0,\"ignore_eos\":true,"
                                    "\"skip_special_tokens\":false,\"logprobs\":0}");
        T_CHECK(records_spell_text(port, body), "skip_special_tokens false with logprobs");
        snprintf(body, sizeof body, "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0,\"stop_token_ids\":[%d],"
                                    "\"include_stop_str_in_output\":true,\"logprobs\":0}", was_id);
        T_CHECK(records_spell_text(port, body), "include_stop_str_in_output with logprobs");
    }
    complete(port, 0, NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":60,\"temperature\":0}", &plain);
    complete(port, 0, NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":60,\"temperature\":0,\"frequency_penalty\":2}", &pen);
    complete(port, 0, NULL,
             "{\"prompt\":\"Once upon a time\",\"max_tokens\":60,\"temperature\":0,\"frequency_penalty\":0,\"presence_penalty\":0,\"logit_bias\":{}}",
             &neutral);
    T_CHECK(pen.status == 200 && strcmp(pen.text, plain.text) != 0, "frequency_penalty 2 left the greedy text unchanged");
    T_CHECK(neutral.status == 200 && !strcmp(neutral.text, plain.text), "neutral penalties changed the text");
    result rep, rep1;
    complete(port, 0, NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":60,\"temperature\":0,\"repetition_penalty\":1.5}", &rep);
    complete(port, 0, NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":60,\"temperature\":0,\"repetition_penalty\":1}", &rep1);
    T_CHECK(rep.status == 200 && strcmp(rep.text, plain.text) != 0, "repetition_penalty 1.5 left the greedy text unchanged");
    T_CHECK(rep1.status == 200 && !strcmp(rep1.text, plain.text), "repetition_penalty 1 changed the text");
    /* DRY: stories260K's greedy story repeats whole phrases; with DRY it repeats fewer word 4-grams,
       and DRY off (multiplier 0, or a window of 0) changes nothing; llama.cpp's /completion reads the
       same fields to the same text */
    result long_plain, dry, dry_off, dry_window0;
    complete(port, 0, NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":200,\"temperature\":0}", &long_plain);
    complete(port, 0, NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":200,\"temperature\":0,\"dry_multiplier\":0.8}", &dry);
    complete(port, 0, NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":200,\"temperature\":0,\"dry_multiplier\":0}", &dry_off);
    complete(port, 0, NULL,
             "{\"prompt\":\"Once upon a time\",\"max_tokens\":200,\"temperature\":0,\"dry_multiplier\":0.8,\"dry_penalty_last_n\":0}",
             &dry_window0);
    const int rep_plain = repeated_4grams(long_plain.text), rep_dry = repeated_4grams(dry.text);
    T_CHECK(dry.status == 200 && rep_dry < rep_plain, "DRY: %d repeated word 4-grams, %d without", rep_dry, rep_plain);
    T_CHECK(!strcmp(dry_off.text, long_plain.text) && !strcmp(dry_window0.text, long_plain.text), "DRY off changed the text");
    resp r;
    T_CHECK(http(port, "POST", "/completion", NULL,
                 "{\"prompt\":\"Once upon a time\",\"n_predict\":200,\"temperature\":0,\"dry_multiplier\":0.8}", &r) &&
                r.status == 200,
            "/completion with DRY: %d %s", r.status, r.body ? r.body : "");
    cJSON *o = r.body ? cJSON_Parse(r.body) : NULL;
    const cJSON *content = cJSON_GetObjectItem(o, "content");
    T_CHECK(cJSON_IsString(content) && !strcmp(content->valuestring, dry.text), "/completion's DRY text differs");
    cJSON_Delete(o);
    resp_free(&r);
    /* llama.cpp's other samplers: top_n_sigma tiny keeps the largest logit alone (greedy's text at
       any temperature); neutral values change nothing; bad ones are a 400; /completion takes them */
    result sig, seeded, seeded_neutral;
    complete(port, 0, NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":1.5,\"seed\":5,\"top_n_sigma\":0.001}",
             &sig);
    T_CHECK(sig.status == 200 && !strcmp(sig.text, greedy40.text), "top_n_sigma 0.001: '%s' against greedy '%s'", sig.text,
            greedy40.text);
    result miro;
    complete(port, 0, NULL,
             "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":1,\"seed\":5,\"mirostat\":2,\"mirostat_tau\":0.01}",
             &miro);
    T_CHECK(miro.status == 200 && !strcmp(miro.text, greedy40.text), "mirostat 2, tau 0.01: '%s' against greedy '%s'", miro.text,
            greedy40.text);
    complete(port, 0, NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":1,\"seed\":5}", &seeded);
    complete(port, 0, NULL,
             "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":1,\"seed\":5,\"typical_p\":1,\"top_n_sigma\":-1,"
             "\"xtc_probability\":0,\"xtc_threshold\":0.2}",
             &seeded_neutral);
    T_CHECK(seeded.status == 200 && !strcmp(seeded.text, seeded_neutral.text), "neutral llama.cpp samplers changed the text");
    T_CHECK(http(port, "POST", "/completion", NULL,
                 "{\"prompt\":\"Once upon a time\",\"n_predict\":8,\"typical_p\":0.9,\"xtc_probability\":0.5,\"top_n_sigma\":2,\"mirostat\":1,\"mirostat_tau\":4,\"mirostat_eta\":0.2}", &r) &&
                r.status == 200,
            "/completion with typical_p, XTC, top_n_sigma: %d %s", r.status, r.body ? r.body : "");
    resp_free(&r);
    /* llama.cpp's samplers' bad values are a 400 (DRY's with DRY on) */
    static const char *const bad_samplers[] = {"\"typical_p\":0", "\"xtc_probability\":2", "\"top_n_sigma\":-5",
                                               "\"xtc_threshold\":-1", "\"mirostat\":3", "\"mirostat_tau\":-1",
                                               "\"dry_multiplier\":1,\"dry_base\":0.5", "\"dry_multiplier\":1,\"dry_allowed_length\":0",
                                               "\"dry_multiplier\":1,\"dry_penalty_last_n\":-2",
                                               "\"dry_multiplier\":1,\"dry_sequence_breakers\":[1]",
                                               "\"dry_multiplier\":1,\"dry_allowed_length\":2.5"};
    for (size_t i = 0; i < sizeof bad_samplers / sizeof bad_samplers[0]; i++) {
        snprintf(body, sizeof body, "{\"prompt\":\"Once\",\"max_tokens\":5,%s}", bad_samplers[i]);
        result bad;
        complete(port, 0, NULL, body, &bad);
        T_CHECK(bad.status == 400, "%s: status %d", bad_samplers[i], bad.status);
    }
    nv_tokenizer_free(t_tok);
}

/* The next "data: {...}" event of an SSE body at *p, parsed (NULL at the end); *p moves past it. */
static cJSON *next_sse_json(const char **p) {
    const char *json = *p ? strstr(*p, "data: {") : NULL;
    if (!json) return NULL;
    json += 6;
    const char *end = strstr(json, "\n\n");
    size_t n = end ? (size_t)(end - json) : strlen(json);
    char *one = strndup(json, n);
    cJSON *ev = cJSON_Parse(one);
    free(one);
    *p = json + n;
    return ev;
}

static void append_chat_logprobs(cJSON *all, const cJSON *root) {
    const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0);
    const cJSON *content = cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "logprobs"), "content"), *e;
    cJSON_ArrayForEach(e, content) cJSON_AddItemToArray(all, cJSON_Duplicate(e, 1));
}

/* The chat shape's logprobs.content records of one response body or SSE stream, flattened. */
static cJSON *chat_logprobs(const char *body, int stream) {
    cJSON *all = cJSON_CreateArray(), *ev;
    if (!stream) {
        ev = cJSON_Parse(body);
        append_chat_logprobs(all, ev);
        cJSON_Delete(ev);
        return all;
    }
    for (const char *p = body; (ev = next_sse_json(&p)); cJSON_Delete(ev)) append_chat_logprobs(all, ev);
    return all;
}

/* POSTs body_fmt (one %s) to path twice: as it is, and with stream_extra in the %s; both 200. */
static int post_whole_and_streamed(int port, const char *path, const char *body_fmt, const char *stream_extra, resp *whole,
                                   resp *streamed) {
    char b1[1024], b2[1024];
    snprintf(b1, sizeof b1, body_fmt, "");
    snprintf(b2, sizeof b2, body_fmt, stream_extra);
    int ok = http(port, "POST", path, NULL, b1, whole) && whole->status == 200;
    return http(port, "POST", path, NULL, b2, streamed) && streamed->status == 200 && ok;
}

static void test_logprobs(void) {
    if (!main_up) return t_skip("the main server did not start");
    int port = main_srv.port;
    const char *body = "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"max_tokens\":12,"
                       "\"temperature\":0,\"logprobs\":true,\"top_logprobs\":3%s}";
    resp whole, streamed;
    T_CHECK(post_whole_and_streamed(port, "/v1/chat/completions", body, ",\"stream\":true", &whole, &streamed),
            "chat logprobs %d / streamed %d", whole.status, streamed.status);
    cJSON *root = cJSON_Parse(whole.body);
    const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0);
    const char *text = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "message"), "content"));
    int completion = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "usage"), "completion_tokens")->valueint;
    cJSON *a = chat_logprobs(whole.body, 0), *b = chat_logprobs(streamed.body, 1);
    T_CHECK(cJSON_GetArraySize(a) == completion && completion == 12, "%d records for %d tokens", cJSON_GetArraySize(a), completion);
    char joined[2048] = "";
    int ok = 1;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) {
        const char *tok = cJSON_GetStringValue(cJSON_GetObjectItem(e, "token"));
        double lp = cJSON_GetNumberValue(cJSON_GetObjectItem(e, "logprob"));
        const cJSON *tops = cJSON_GetObjectItem(e, "top_logprobs"), *t0 = cJSON_GetArrayItem(tops, 0);
        strncat(joined, tok ? tok : "", sizeof joined - strlen(joined) - 1);
        ok &= lp <= 0 && cJSON_GetArraySize(tops) == 3 && cJSON_GetArraySize(cJSON_GetObjectItem(e, "bytes")) == (int)strlen(tok);
        /* greedy: the chosen token is the most likely one */
        ok &= t0 && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(t0, "token")), tok) &&
              cJSON_GetNumberValue(cJSON_GetObjectItem(t0, "logprob")) == lp;
        for (int j = 1; j < 3; j++)
            ok &= cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetArrayItem(tops, j - 1), "logprob")) >=
                  cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetArrayItem(tops, j), "logprob"));
    }
    T_CHECK(ok, "a record is not a greedy log-probability with 3 sorted alternatives: %s", whole.body);
    T_CHECK(text && !strcmp(joined, text), "tokens '%s' do not spell the text '%s'", joined, text ? text : "");
    T_CHECK(cJSON_Compare(a, b, 1), "streamed records differ from the whole response's");
    cJSON_Delete(a), cJSON_Delete(b), cJSON_Delete(root);
    resp_free(&whole), resp_free(&streamed);

    /* completions: tokens, token_logprobs, top_logprobs, text_offset; a stop string drops the
     * tokens that only spelled it (a token that starts inside the text and runs into it stays) */
    resp r;
    T_CHECK(http(port, "POST", "/v1/completions", NULL,
                 "{\"prompt\":\"Once upon a time\",\"max_tokens\":30,\"temperature\":0,\"logprobs\":2,\"stop\":\"girl\"}", &r) &&
                r.status == 200,
            "completion logprobs %d", r.status);
    root = cJSON_Parse(r.body);
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0);
    text = cJSON_GetStringValue(cJSON_GetObjectItem(c0, "text"));
    const cJSON *lp = cJSON_GetObjectItem(c0, "logprobs"), *toks = cJSON_GetObjectItem(lp, "tokens");
    const cJSON *offs = cJSON_GetObjectItem(lp, "text_offset"), *tl = cJSON_GetObjectItem(lp, "token_logprobs");
    int n = cJSON_GetArraySize(toks);
    joined[0] = '\0';
    ok = n > 0 && cJSON_GetArraySize(offs) == n && cJSON_GetArraySize(tl) == n &&
         cJSON_GetArraySize(cJSON_GetObjectItem(lp, "top_logprobs")) == n;
    for (int i = 0; ok && i < n; i++) {
        ok &= cJSON_GetArrayItem(offs, i)->valueint == (int)strlen(joined);
        strncat(joined, cJSON_GetStringValue(cJSON_GetArrayItem(toks, i)), sizeof joined - strlen(joined) - 1);
    }
    T_CHECK(ok && text && !strncmp(joined, text, strlen(text)) &&
                cJSON_GetArrayItem(offs, n - 1)->valueint < (int)strlen(text) &&
                !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(c0, "finish_reason")), "stop"),
            "completions logprobs: tokens '%s' text '%s' body %s", joined, text ? text : "", r.body);
    cJSON_Delete(root);
    resp_free(&r);
    /* after BOS alone (an empty prompt) the first token's text drops its leading space, and so
     * does its record */
    T_CHECK(http(port, "POST", "/v1/completions", NULL, "{\"prompt\":\"\",\"max_tokens\":6,\"temperature\":0,\"logprobs\":0}", &r) &&
                r.status == 200,
            "empty prompt %d", r.status);
    root = cJSON_Parse(r.body);
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0);
    text = cJSON_GetStringValue(cJSON_GetObjectItem(c0, "text"));
    toks = cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "logprobs"), "tokens");
    joined[0] = '\0';
    const cJSON *t;
    cJSON_ArrayForEach(t, toks) strncat(joined, cJSON_GetStringValue(t), sizeof joined - strlen(joined) - 1);
    T_CHECK(text && !strcmp(joined, text), "empty prompt: tokens '%s', text '%s'", joined, text ? text : "");
    cJSON_Delete(root);
    resp_free(&r);
}

/* n choices: greedy choices are all the alone text; seeded sampled ones differ from each other,
 * and a stream carries every choice's chunks under its index, spelling the same texts. */
static void test_n_choices(void) {
    if (!main_up) return t_skip("the main server did not start");
    int port = main_srv.port;
    result alone;
    complete(port, 0, NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":16,\"temperature\":0}", &alone);
    resp r;
    T_CHECK(http(port, "POST", "/v1/completions", NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":16,\"temperature\":0,\"n\":3}", &r) &&
                r.status == 200,
            "n=3 %d", r.status);
    cJSON *root = cJSON_Parse(r.body);
    const cJSON *ch = cJSON_GetObjectItem(root, "choices");
    int ok = cJSON_GetArraySize(ch) == 3 && cJSON_GetObjectItem(cJSON_GetObjectItem(root, "usage"), "completion_tokens")->valueint == 48;
    for (int i = 0; ok && i < 3; i++) {
        const cJSON *c = cJSON_GetArrayItem(ch, i);
        ok &= cJSON_GetObjectItem(c, "index")->valueint == i && !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(c, "text")), alone.text);
    }
    T_CHECK(ok, "greedy n=3: %s", r.body);
    cJSON_Delete(root);
    resp_free(&r);

    const char *sampled = "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"max_tokens\":24,\"temperature\":1,"
                          "\"seed\":7,\"n\":2%s}";
    resp whole, streamed;
    T_CHECK(post_whole_and_streamed(port, "/v1/chat/completions", sampled, ",\"stream\":true,\"stream_options\":{\"include_usage\":true}",
                                    &whole, &streamed),
            "n=2 %d / streamed %d", whole.status, streamed.status);
    root = cJSON_Parse(whole.body);
    ch = cJSON_GetObjectItem(root, "choices");
    const char *t0 = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(ch, 0), "message"), "content"));
    const char *t1 = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(ch, 1), "message"), "content"));
    T_CHECK(t0 && t1 && strcmp(t0, t1) != 0, "two sampled choices are the same text");
    /* the stream: each event's choices[0] has an index; concatenate per index */
    char got[2][1024] = {"", ""};
    int finishes = 0, usage_tokens = -1;
    cJSON *ev;
    for (const char *p = streamed.body; (ev = next_sse_json(&p)); cJSON_Delete(ev)) {
        const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(ev, "choices"), 0);
        const cJSON *u = cJSON_GetObjectItem(ev, "usage");
        if (cJSON_IsObject(u)) usage_tokens = cJSON_GetObjectItem(u, "completion_tokens")->valueint;
        if (c) {
            int i = cJSON_GetObjectItem(c, "index")->valueint;
            const char *d = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "delta"), "content"));
            if (i >= 0 && i < 2 && d) strncat(got[i], d, sizeof got[i] - strlen(got[i]) - 1);
            if (cJSON_IsString(cJSON_GetObjectItem(c, "finish_reason"))) finishes++;
        }
    }
    T_CHECK(t0 && t1 && !strcmp(got[0], t0) && !strcmp(got[1], t1), "streamed choices '%s' / '%s' differ from '%s' / '%s'", got[0],
            got[1], t0 ? t0 : "", t1 ? t1 : "");
    T_CHECK(finishes == 2 && usage_tokens == cJSON_GetObjectItem(cJSON_GetObjectItem(root, "usage"), "completion_tokens")->valueint,
            "finishes %d, usage %d", finishes, usage_tokens);
    cJSON_Delete(root);
    resp_free(&whole), resp_free(&streamed);

    /* a list of prompts x n: choice k is prompt k / n; greedy, each is that prompt's alone text */
    result other;
    complete(port, 0, NULL, "{\"prompt\":\"Lily and Ben\",\"max_tokens\":16,\"temperature\":0}", &other);
    T_CHECK(http(port, "POST", "/v1/completions", NULL,
                 "{\"prompt\":[\"Once upon a time\",\"Lily and Ben\"],\"max_tokens\":16,\"temperature\":0,\"n\":2}", &r) &&
                r.status == 200,
            "two prompts %d", r.status);
    root = cJSON_Parse(r.body);
    ch = cJSON_GetObjectItem(root, "choices");
    const cJSON *u = cJSON_GetObjectItem(root, "usage");
    ok = cJSON_GetArraySize(ch) == 4 &&
         cJSON_GetObjectItem(u, "prompt_tokens")->valueint == alone.prompt_tokens + other.prompt_tokens &&
         cJSON_GetObjectItem(u, "completion_tokens")->valueint == 64;
    for (int i = 0; ok && i < 4; i++) {
        const cJSON *c = cJSON_GetArrayItem(ch, i);
        ok &= cJSON_GetObjectItem(c, "index")->valueint == i &&
              !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(c, "text")), i < 2 ? alone.text : other.text);
    }
    T_CHECK(ok, "two prompts x 2: %s", r.body);
    cJSON_Delete(root);
    resp_free(&r);
}

/* Structured outputs: whatever the seed, the tiny story model's answers parse as JSON and hold
 * to the schema, whole and streamed (the same text), for n choices, and through each field name
 * (OpenAI's response_format, llama.cpp's json_schema, vLLM's guided_json). */
static int check_person(const char *text, char *why, size_t n) {
    cJSON *j = cJSON_Parse(text);
    const cJSON *name = cJSON_GetObjectItem(j, "name"), *age = cJSON_GetObjectItem(j, "age");
    const cJSON *pet = cJSON_GetObjectItem(j, "pet"), *tags = cJSON_GetObjectItem(j, "tags");
    int ok = cJSON_IsObject(j) && cJSON_IsString(name) && strlen(name->valuestring) <= 4 * 12 && cJSON_IsNumber(age) &&
             age->valuedouble == floor(age->valuedouble) && age->valuedouble >= 0 && age->valuedouble <= 120 &&
             (!pet || (cJSON_IsString(pet) && (!strcmp(pet->valuestring, "cat") || !strcmp(pet->valuestring, "dog")))) &&
             cJSON_IsArray(tags) && cJSON_GetArraySize(tags) <= 2 && cJSON_GetArraySize(j) == 3 + !!pet;
    for (const cJSON *t = tags ? tags->child : NULL; ok && t; t = t->next) ok = cJSON_IsBool(t);
    snprintf(why, n, "%s", ok ? "" : text);
    cJSON_Delete(j);
    return ok;
}

/* ^[A-Z][a-z]{1,8}-\d{2}$ */
static int pattern_ok(const char *v) {
    size_t n = strlen(v), i = 1;
    if (n < 5 || !(v[0] >= 'A' && v[0] <= 'Z')) return 0;
    while (i < n && v[i] >= 'a' && v[i] <= 'z') i++;
    return i >= 2 && i <= 9 && v[i] == '-' && n == i + 3 && isdigit((unsigned char)v[i + 1]) && isdigit((unsigned char)v[i + 2]);
}

/* One structured-output request from a thread (the concurrent part of test_structured_outputs). */
typedef struct {
    int port, seed;
    result res;
} json_job;

static void *run_json_job(void *arg) {
    json_job *j = arg;
    char body[512];
    snprintf(body, sizeof body,
             "{\"prompt\":\"Once upon a time\",\"max_tokens\":100,\"seed\":%d,\"response_format\":{\"type\":\"json_schema\","
             "\"json_schema\":{\"name\":\"k\",\"schema\":{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":0,"
             "\"maximum\":99},\"maxItems\":3}}}}",
             j->seed);
    complete(j->port, 0, NULL, body, &j->res);
    return NULL;
}

static void test_structured_outputs(void) {
    if (!main_up) return t_skip("the main server did not start");
    int port = main_srv.port;
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
                         "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},\"pet\":{\"enum\":[\"cat\",\"dog\"]},"
                         "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"maxItems\":2}},"
                         "\"required\":[\"name\",\"age\",\"tags\"],\"additionalProperties\":false}";
    char body[2048], why[1024];
    int stops = 0;
    for (int seed = 1; seed <= 6; seed++) {
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"max_tokens\":160,\"temperature\":1,"
                 "\"seed\":%d,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"person\",\"strict\":true,"
                 "\"schema\":%s}}%%s}",
                 seed, schema);
        resp whole, streamed;
        T_CHECK(post_whole_and_streamed(port, "/v1/chat/completions", body, ",\"stream\":true", &whole, &streamed), "seed %d: %d / %d",
                seed, whole.status, streamed.status);
        cJSON *root = cJSON_Parse(whole.body);
        const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0);
        const char *text = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "message"), "content"));
        const char *fin = cJSON_GetStringValue(cJSON_GetObjectItem(c0, "finish_reason"));
        if (text && fin && !strcmp(fin, "stop")) {
            stops++;
            T_CHECK(check_person(text, why, sizeof why), "seed %d: the answer breaks the schema: %s", seed, why);
        }
        /* the streamed deltas spell the same answer */
        char got[4096] = "";
        cJSON *ev;
        for (const char *p = streamed.body; (ev = next_sse_json(&p)); cJSON_Delete(ev)) {
            const char *d = cJSON_GetStringValue(
                cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(ev, "choices"), 0), "delta"), "content"));
            if (d) strncat(got, d, sizeof got - strlen(got) - 1);
        }
        T_CHECK(text && !strcmp(got, text), "seed %d: streamed '%s' vs '%s'", seed, got, text ? text : "");
        cJSON_Delete(root);
        resp_free(&whole), resp_free(&streamed);
    }
    /* a 260K-parameter story model still closes most answers within 160 tokens */
    T_CHECK(stops >= 3, "only %d of 6 answers were whole", stops);

    /* the metrics count the constrained tokens and the masks */
    resp mr;
    T_CHECK(http(port, "GET", "/metrics", NULL, NULL, &mr) && mr.status == 200, "metrics %d", mr.status);
    const char *gt = mr.body ? strstr(mr.body, "\nnerve_grammar_tokens_total ") : NULL;
    const char *gm = mr.body ? strstr(mr.body, "\nnerve_grammar_masks_total ") : NULL;
    T_CHECK(gt && atol(gt + 28) > 0 && gm && strstr(mr.body, "nerve_grammar_mask_seconds_total "), "grammar metrics: %.300s",
            gt ? gt : "(none)");
    resp_free(&mr);

    /* six at once: batched together, each sampled in its own grammar on the pool's threads */
    json_job jobs[6];
    pthread_t th[6];
    for (int i = 0; i < 6; i++) {
        jobs[i] = (json_job){.port = port, .seed = 100 + i};
        pthread_create(&th[i], NULL, run_json_job, &jobs[i]);
    }
    for (int i = 0; i < 6; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 6; i++) {
        cJSON *j = cJSON_Parse(jobs[i].res.text);
        int ok = jobs[i].res.status == 200 && (strcmp(jobs[i].res.finish, "stop") || (cJSON_IsArray(j) && cJSON_GetArraySize(j) <= 3));
        for (const cJSON *e = cJSON_IsArray(j) ? j->child : NULL; ok && e; e = e->next)
            ok = cJSON_IsNumber(e) && e->valuedouble >= 0 && e->valuedouble <= 99 && e->valuedouble == floor(e->valuedouble);
        T_CHECK(ok, "concurrent %d: %d %s '%s'", i, jobs[i].res.status, jobs[i].res.finish, jobs[i].res.text);
        cJSON_Delete(j);
    }

    /* json_object mode, n = 3, and the other servers' field names: every whole answer parses */
    const char *forms[] = {
        "{\"prompt\":\"Lily\",\"max_tokens\":120,\"seed\":3,\"n\":3,\"response_format\":{\"type\":\"json_object\"}}",
        "{\"prompt\":\"Ben\",\"max_tokens\":120,\"seed\":4,\"json_schema\":{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,\"maxItems\":4}}",
        "{\"prompt\":\"Ben\",\"max_tokens\":120,\"seed\":5,\"guided_json\":\"{\\\"type\\\":\\\"boolean\\\"}\"}",
        "{\"prompt\":\"Tom\",\"max_tokens\":120,\"temperature\":0,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"d\",\"schema\":{\"type\":\"string\",\"format\":\"date\"}}}}",
        "{\"prompt\":\"Sue\",\"max_tokens\":60,\"seed\":9,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"p\",\"schema\":{\"type\":\"string\",\"pattern\":\"^[A-Z][a-z]{1,8}-\\\\d{2}$\"}}}}",
    };
    for (size_t f = 0; f < sizeof forms / sizeof forms[0]; f++) {
        resp r;
        T_CHECK(http(port, "POST", "/v1/completions", NULL, forms[f], &r) && r.status == 200, "form %zu: %d %s", f, r.status, r.body);
        cJSON *root = cJSON_Parse(r.body);
        const cJSON *ch = cJSON_GetObjectItem(root, "choices");
        T_CHECK(cJSON_GetArraySize(ch) == (f == 0 ? 3 : 1), "form %zu: %d choices", f, cJSON_GetArraySize(ch));
        for (const cJSON *c = ch ? ch->child : NULL; c; c = c->next) {
            const char *text = cJSON_GetStringValue(cJSON_GetObjectItem(c, "text"));
            if (strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(c, "finish_reason")), "stop")) continue;
            cJSON *j = text ? cJSON_Parse(text) : NULL;
            int ok = f == 0 ? cJSON_IsObject(j)
                   : f == 1 ? cJSON_IsArray(j) && cJSON_GetArraySize(j) >= 2 && cJSON_GetArraySize(j) <= 4
                   : f == 2 ? cJSON_IsBool(j)
                   : f == 3 ? cJSON_IsString(j) && strlen(j->valuestring) == 10 && j->valuestring[4] == '-'
                            : cJSON_IsString(j) && pattern_ok(j->valuestring);
            T_CHECK(ok, "form %zu: '%s' does not fit", f, text ? text : "");
            cJSON_Delete(j);
        }
        cJSON_Delete(root);
        resp_free(&r);
    }
}

/* tool_choice "required" and a named tool ("play"), seeds 1..n_seeds each, on the server at port:
 * calls whose arguments fit the tools' schemas (those of test_tool_calls), whole and streamed
 * alike, finish_reason "tool_calls", content null, ids OpenAI's "call_..." (short: Mistral's 9
 * letters and digits). Returns the calls seen. */
/* The tool-call servers' flags: the exact engine, whose sampled answers (and so how many of them are
 * calls) are the same on every CPU. */
#define TOOLS_ARGS "--kv-memory 64M --engine avx2"

/* short_ids: 0 OpenAI's ids, 1 Mistral's, 2 the model's own (Mistral's [CALL_ID]): the same ids whole
 * and streamed under the same seed, as no id the server makes up would be. */
static int required_calls(int port, const char *tools, int n_seeds, int short_ids) {
    const char *choices[] = {"\"required\"", "{\"type\":\"function\",\"function\":{\"name\":\"play\"}}"};
    char body[4096];
    int calls_seen = 0;
    for (int c = 0; c < 2; c++)
        for (int seed = 1; seed <= n_seeds; seed++) {
            snprintf(body, sizeof body,
                     "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Oslo?\"}],\"max_tokens\":400,\"seed\":%d,%s,"
                     "\"tool_choice\":%s%%s}",
                     seed, tools, choices[c]);
            resp whole, streamed;
            T_CHECK(post_whole_and_streamed(port, "/v1/chat/completions", body, ",\"stream\":true", &whole, &streamed),
                    "choice %d seed %d: %d / %d", c, seed, whole.status, streamed.status);
            cJSON *root = cJSON_Parse(whole.body);
            const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0);
            const cJSON *msg = cJSON_GetObjectItem(c0, "message");
            const cJSON *calls = cJSON_GetObjectItem(msg, "tool_calls");
            const char *fin = cJSON_GetStringValue(cJSON_GetObjectItem(c0, "finish_reason"));
            if (fin && !strcmp(fin, "length")) { /* cut short: nothing to check but the shape */
                cJSON_Delete(root);
                resp_free(&whole), resp_free(&streamed);
                continue;
            }
            T_CHECK(fin && !strcmp(fin, "tool_calls") && cJSON_IsNull(cJSON_GetObjectItem(msg, "content")) &&
                        cJSON_GetArraySize(calls) >= 1 && (c == 0 || cJSON_GetArraySize(calls) == 1),
                    "choice %d seed %d: %s", c, seed, whole.body);
            char joined[2048] = "";
            for (const cJSON *tc = calls ? calls->child : NULL; tc; tc = tc->next) {
                const cJSON *fn = cJSON_GetObjectItem(tc, "function");
                const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(fn, "name"));
                cJSON *a = cJSON_Parse(cJSON_GetStringValue(cJSON_GetObjectItem(fn, "arguments")));
                const char *id = cJSON_GetStringValue(cJSON_GetObjectItem(tc, "id"));
                int ok = name && cJSON_IsObject(a) && id && (short_ids ? strlen(id) == 9 : !strncmp(id, "call_", 5));
                if (ok && !strcmp(name, "play")) {
                    const char *toy = cJSON_GetStringValue(cJSON_GetObjectItem(a, "toy"));
                    ok = toy && (!strcmp(toy, "ball") || !strcmp(toy, "car")) && cJSON_GetArraySize(a) == 1;
                } else if (ok) {
                    const cJSON *days = cJSON_GetObjectItem(a, "days");
                    ok = c == 0 && !strcmp(name, "get_weather") && cJSON_IsString(cJSON_GetObjectItem(a, "city")) &&
                         cJSON_IsNumber(days) && days->valueint >= 1 && days->valueint <= 7;
                }
                T_CHECK(ok, "choice %d seed %d: a call that breaks its tool's schema: %s", c, seed, whole.body);
                if (short_ids == 2) strncat(joined, id ? id : "", sizeof joined - strlen(joined) - 1);
                strncat(joined, name ? name : "", sizeof joined - strlen(joined) - 1);
                strncat(joined, cJSON_GetStringValue(cJSON_GetObjectItem(fn, "arguments")) ?: "", sizeof joined - strlen(joined) - 1);
                cJSON_Delete(a);
                calls_seen++;
            }
            /* the stream: the same calls, as tool_calls deltas, and the same finish */
            char got[2048] = "", sfin[32] = "";
            cJSON *ev;
            for (const char *p = streamed.body; (ev = next_sse_json(&p)); cJSON_Delete(ev)) {
                const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(ev, "choices"), 0);
                const cJSON *tcs = cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "delta"), "tool_calls");
                for (const cJSON *tc = tcs ? tcs->child : NULL; tc; tc = tc->next) {
                    const cJSON *fn = cJSON_GetObjectItem(tc, "function");
                    if (short_ids == 2) strncat(got, cJSON_GetStringValue(cJSON_GetObjectItem(tc, "id")) ?: "", sizeof got - strlen(got) - 1);
                    strncat(got, cJSON_GetStringValue(cJSON_GetObjectItem(fn, "name")) ?: "", sizeof got - strlen(got) - 1);
                    strncat(got, cJSON_GetStringValue(cJSON_GetObjectItem(fn, "arguments")) ?: "", sizeof got - strlen(got) - 1);
                }
                const char *f = cJSON_GetStringValue(cJSON_GetObjectItem(ch, "finish_reason"));
                if (f) snprintf(sfin, sizeof sfin, "%s", f);
            }
            T_CHECK(!strcmp(got, joined) && !strcmp(sfin, "tool_calls"), "choice %d seed %d: streamed '%s' (%s) vs '%s'", c, seed,
                    got, sfin, joined);
            cJSON_Delete(root);
            resp_free(&whole), resp_free(&streamed);
        }
    return calls_seen;
}

/* A server of model under chat template tmpl: required calls come back as calls (short_ids: Mistral's
 * ids), and the conversation (JSON with a %s for the tools) renders with want and want2 in its
 * prompt (/apply-template's JSON: its quotes and line breaks escaped). */
static void template_tools(const char *model, const char *tools, const char *tmpl, int short_ids, const char *conversation,
                           const char *want, const char *want2) {
    server s;
    char flags[128], name[64], body[4096];
    snprintf(flags, sizeof flags, TOOLS_ARGS " --chat-template %s", tmpl);
    snprintf(name, sizeof name, "tools-%s", tmpl);
    if (!server_spawn(&s, name, NULL, NULL, model, tok_path, flags, 30)) {
        T_CHECK(0, "the %s tools server did not start", tmpl);
        return;
    }
    const int calls = required_calls(s.port, tools, 2, short_ids);
    T_CHECK(calls >= 3, "%s: only %d calls in 4 answers", tmpl, calls);
    snprintf(body, sizeof body, conversation, tools);
    resp r;
    T_CHECK(http(s.port, "POST", "/apply-template", NULL, body, &r) && r.status == 200 && strstr(r.body, want) && strstr(r.body, want2),
            "%s apply-template: %d %s", tmpl, r.status, r.body);
    resp_free(&r);
    const int rc = server_stop(&s);
    T_CHECK(rc == 0, "%s tools server exit %d", tmpl, rc);
}

/* The tools of the tool-calling tests (required_calls checks calls against their schemas). */
static const char weather_tools[] =
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":12},"
    "\"days\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":7}},\"required\":[\"city\",\"days\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"play\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"toy\":{\"enum\":[\"ball\",\"car\"]}},\"required\":[\"toy\"]}}}]";

/* Tool calling end to end, on a stories260K-shaped model with a 2,048-token context (the tools'
 * description alone outgrows stories260K's 512 with its 512-token vocabulary): tool_choice
 * "required" and a named tool give calls whose arguments fit the tool's schema, whole and
 * streamed alike, with finish_reason "tool_calls" and content null; "auto" leaves the random
 * model's text as content; a conversation with a call and its result is accepted. */
static void test_tool_calls(void) {
    char model[700], args[1024];
    snprintf(model, sizeof model, "%s/tools-2k.bin", tmpdir);
    snprintf(args, sizeof args, "init --preset stories260K --seq-len 2048 --seed 7 -o '%s'", model);
    if (t_nerve(args) != 0) {
        T_CHECK(0, "init: %s", t_err);
        return;
    }
    server s;
    if (!server_spawn(&s, "tools", NULL, NULL, model, tok_path, TOOLS_ARGS, 30)) {
        T_CHECK(0, "the tools server did not start");
        return;
    }
    const char *tools = weather_tools;
    char body[4096];
    const int calls_seen = required_calls(s.port, tools, 3, 0);
    T_CHECK(calls_seen >= 4, "only %d calls in 6 answers", calls_seen);

    /* auto: this random model writes text, which stays content; a whole conversation renders */
    resp r;
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":"
             "[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"play\",\"arguments\":\"{\\\"toy\\\":\\\"car\\\"}\"}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"sunny\"}],\"max_tokens\":8,\"seed\":1,%s}",
             tools);
    T_CHECK(http(s.port, "POST", "/v1/chat/completions", NULL, body, &r) && r.status == 200 && strstr(r.body, "\"content\":\"") &&
                strstr(r.body, "\"finish_reason\":\"length\""),
            "auto: %d %s", r.status, r.body);
    /* the deprecated "function" role (LangChain's FunctionMessage) is a tool's result: the same prompt
       (its length in tokens and the answer from the same seed) */
    const char *pt = r.body ? strstr(r.body, "\"prompt_tokens\":") : NULL;
    const int tool_prompt = pt ? atoi(pt + 16) : -1;
    char *tool_answer = r.body ? strdup(strstr(r.body, "\"content\":\"") ? strstr(r.body, "\"content\":\"") : "") : NULL;
    resp_free(&r);
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather?\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":"
             "[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"play\",\"arguments\":\"{\\\"toy\\\":\\\"car\\\"}\"}}]},"
             "{\"role\":\"function\",\"name\":\"play\",\"content\":\"sunny\"}],\"max_tokens\":8,\"seed\":1,%s}",
             tools);
    T_CHECK(http(s.port, "POST", "/v1/chat/completions", NULL, body, &r) && r.status == 200 && tool_answer &&
                strstr(r.body, "\"content\":\"") && !strncmp(strstr(r.body, "\"content\":\""), tool_answer, strcspn(tool_answer, "}")) &&
                strstr(r.body, "\"prompt_tokens\":") && atoi(strstr(r.body, "\"prompt_tokens\":") + 16) == tool_prompt,
            "role function: %d %s (the tool message's prompt: %d tokens)", r.status, r.body, tool_prompt);
    free(tool_answer);
    resp_free(&r);
    /* auto beside a JSON response_format: each answer is calls or the answer in the format (this random
       model under the grammar), never text around them */
    int shapes[2] = {0, 0};
    for (int seed = 1; seed <= 4; seed++) {
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Oslo?\"}],\"max_tokens\":300,\"seed\":%d,%s,"
                 "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"w\",\"schema\":{\"type\":\"object\","
                 "\"properties\":{\"sky\":{\"enum\":[\"sun\",\"rain\"]}},\"required\":[\"sky\"],\"additionalProperties\":false}}}}",
                 seed, tools);
        T_CHECK(http(s.port, "POST", "/v1/chat/completions", NULL, body, &r) && r.status == 200, "format and tools %d: %s", r.status, r.body);
        cJSON *root = cJSON_Parse(r.body);
        const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0), *msg = cJSON_GetObjectItem(c0, "message");
        const char *fin = cJSON_GetStringValue(cJSON_GetObjectItem(c0, "finish_reason"));
        const char *content = cJSON_GetStringValue(cJSON_GetObjectItem(msg, "content"));
        cJSON *answer = content ? cJSON_Parse(content) : NULL;
        const char *sky = cJSON_GetStringValue(cJSON_GetObjectItem(answer, "sky"));
        if (fin && !strcmp(fin, "tool_calls")) {
            shapes[0]++;
            T_CHECK(!content && cJSON_GetArraySize(cJSON_GetObjectItem(msg, "tool_calls")) >= 1, "%s", r.body);
        } else if (fin && !strcmp(fin, "stop")) {
            shapes[1]++;
            T_CHECK(sky && cJSON_GetArraySize(answer) == 1, "not the format: %s", r.body);
        }
        cJSON_Delete(answer);
        cJSON_Delete(root);
        resp_free(&r);
    }
    T_CHECK(shapes[0] + shapes[1] >= 2, "format and tools: %d calls, %d answers in the format of 4", shapes[0], shapes[1]);
    int rc = server_stop(&s);
    T_CHECK(rc == 0, "tools server exit %d", rc);

    /* auto, Llama 3's format: a call that begins the answer is held to the schema (a lazy grammar
     * that comes on at its "{"). logit_bias makes this random model open with "{"; unconstrained
     * it would go on with noise, constrained it can only finish a call */
    if (!server_spawn(&s, "tools-llama3", NULL, NULL, model, tok_path, "--kv-memory 64M --chat-template llama3", 30)) {
        T_CHECK(0, "the llama3 tools server did not start");
        return;
    }
    T_CHECK(http(s.port, "POST", "/tokenize", NULL, "{\"content\":\"{\"}", &r) && r.status == 200, "tokenize %d", r.status);
    cJSON *tk = cJSON_Parse(r.body);
    const cJSON *ids = cJSON_GetObjectItem(tk, "tokens");
    int brace = cJSON_GetArraySize(ids) ? cJSON_GetArrayItem(ids, cJSON_GetArraySize(ids) - 1)->valueint : -1;
    cJSON_Delete(tk);
    resp_free(&r);
    for (int seed = 1; seed <= 3; seed++) {
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Play?\"}],\"max_tokens\":300,\"seed\":%d,"
                 "\"logit_bias\":{\"%d\":100},%s}",
                 seed, brace, tools);
        T_CHECK(http(s.port, "POST", "/v1/chat/completions", NULL, body, &r) && r.status == 200, "llama3 auto %d", r.status);
        cJSON *root = cJSON_Parse(r.body);
        const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0);
        const cJSON *tc = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "message"), "tool_calls"), 0);
        const cJSON *fn = cJSON_GetObjectItem(tc, "function");
        cJSON *a = cJSON_Parse(cJSON_GetStringValue(cJSON_GetObjectItem(fn, "arguments")));
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(fn, "name"));
        T_CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(c0, "finish_reason")), "tool_calls") && name && cJSON_IsObject(a) &&
                    (strcmp(name, "play") || cJSON_IsString(cJSON_GetObjectItem(a, "toy"))),
                "llama3 auto seed %d: %s", seed, r.body);
        cJSON_Delete(a);
        cJSON_Delete(root);
        resp_free(&r);
    }
    rc = server_stop(&s);
    T_CHECK(rc == 0, "llama3 tools server exit %d", rc);

    /* Granite's format: the calls come as <|tool_call|>[...] and are read back as calls; a
     * conversation with a call and its result is shown in Granite's turns (/apply-template) */
    template_tools(model, tools, "granite", 0,
                   "{\"messages\":[{\"role\":\"user\",\"content\":\"Play?\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":"
                   "[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"play\",\"arguments\":\"{\\\"toy\\\":\\\"car\\\"}\"}}]},"
                   "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"done\"}],%s}",
                   "<|start_of_role|>available_tools<|end_of_role|>[\\n    {\\n        \\\"type\\\": \\\"function\\\",",
                   "<|start_of_role|>assistant<|end_of_role|><|tool_call|>[{\\\"name\\\": \\\"play\\\", \\\"arguments\\\": "
                   "{\\\"toy\\\":\\\"car\\\"}}]<|end_of_text|>\\n<|start_of_role|>tool_response<|end_of_role|>done");
    /* Mistral's v3 format: [TOOL_CALLS] [...] read back as calls with 9-character ids; a conversation
       with a call and its result in Mistral's turns */
    template_tools(model, tools, "mistral", 1,
                   "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Play?\"},"
                   "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"k3Xb9Qz1a\",\"type\":\"function\",\"function\":"
                   "{\"name\":\"play\",\"arguments\":\"{\\\"toy\\\":\\\"car\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"k3Xb9Qz1a\","
                   "\"content\":\"done\"}],%s}",
                   "[AVAILABLE_TOOLS] [{\\\"type\\\": \\\"function\\\", \\\"function\\\": {\\\"name\\\": \\\"get_weather\\\"",
                   "[/AVAILABLE_TOOLS][INST] Be brief.\\n\\nPlay?[/INST][TOOL_CALLS] [{\\\"name\\\": \\\"play\\\", "
                   "\\\"arguments\\\": {\\\"toy\\\":\\\"car\\\"}, \\\"id\\\": \\\"k3Xb9Qz1a\\\"}]</s>[TOOL_RESULTS] "
                   "{\\\"content\\\": done, \\\"call_id\\\": \\\"k3Xb9Qz1a\\\"}[/TOOL_RESULTS]");
    /* Phi-4-mini's: the tools' functions in the system turn, the calls Granite's list closed by
       <|/tool_call|>, the result a tool turn, no line breaks */
    template_tools(model, tools, "phi4-mini", 0,
                   "{\"messages\":[{\"role\":\"user\",\"content\":\"Play?\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":"
                   "[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"play\",\"arguments\":\"{\\\"toy\\\":\\\"car\\\"}\"}}]},"
                   "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"done\"}],%s}",
                   "<|system|><|tool|>[{\\\"name\\\": \\\"get_weather\\\", \\\"description\\\": \\\"Weather\\\"",
                   "<|user|>Play?<|end|><|assistant|><|tool_call|>[{\\\"name\\\": \\\"play\\\", \\\"arguments\\\": "
                   "{\\\"toy\\\":\\\"car\\\"}}]<|/tool_call|><|end|><|tool|>done<|end|><|assistant|>");
}

/* A server running a Mistral template run as Jinja that writes each call as [TOOL_CALLS]NAME, then
 * call_id (a call's id: Mistral Small 3.2's form), then [ARGS] and its arguments, each result after
 * [TOOL_RESULTS] and result_id: the start line names the form (note), required calls come back as
 * calls (short_ids as required_calls), and conversation renders with want in its prompt. */
static void mistral_form(const char *model, const char *name, const char *note, const char *call_id, const char *result_id,
                         int short_ids, const char *conversation, const char *want) {
    char text[2048], server_name[64], file[64];
    snprintf(text, sizeof text,
             "{%%- if tools %%}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{%% endif %%}"
             "{%%- for m in messages %%}{%% if m.role == 'user' %%}[INST]{{ m.content }}[/INST]"
             "{%% elif m.tool_calls %%}{%% for tc in m.tool_calls %%}[TOOL_CALLS]{{ tc.function.name }}%s[ARGS]"
             "{{ tc.function.arguments | tojson }}{%% endfor %%}</s>"
             "{%% elif m.role == 'tool' %%}[TOOL_RESULTS]%s{{ m.content }}[/TOOL_RESULTS]{%% else %%}{{ m.content }}</s>{%% endif %%}"
             "{%% endfor %%}",
             call_id, result_id);
    snprintf(server_name, sizeof server_name, "tools-%s", name);
    snprintf(file, sizeof file, "%s_tools.jinja", name);
    server s;
    if (!template_server(&s, server_name, model, tok_path, file, text, TOOLS_ARGS, note)) return;
    const int calls = required_calls(s.port, weather_tools, 2, short_ids);
    T_CHECK(calls >= 3, "%s: only %d calls in 4 answers", name, calls);
    resp r;
    T_CHECK(http(s.port, "POST", "/apply-template", NULL, conversation, &r) && r.status == 200 && strstr(r.body, want),
            "%s apply-template: %d %s", name, r.status, r.body);
    resp_free(&r);
    const int rc = server_stop(&s);
    T_CHECK(rc == 0, "%s tools server exit %d", name, rc);
}

/* A server on model (--kv-memory 64M) running text, written to file, as its Jinja chat template,
 * whose start line says how it writes calls (note); 1 when it is up and says so. */
/* Calls written as XML (Qwen3-Coder's form) by a template run as Jinja that writes them so: the
 * server reads that from the template, holds required calls to the form and the schemas (a string
 * as it is, an integer as its digits) and gives them back as OpenAI's calls, whole and streamed; a
 * conversation's call reaches the template with its arguments as an object. */
static void test_xml_tool_calls(void) {
    char model[700], args[1024];
    snprintf(model, sizeof model, "%s/tools-2k.bin", tmpdir);
    snprintf(args, sizeof args, "init --preset stories260K --seq-len 2048 --seed 7 -o '%s'", model);
    if (access(model, R_OK) != 0 && t_nerve(args) != 0) {
        T_CHECK(0, "init: %s", t_err);
        return;
    }
    static const char xml_template[] =
        "{%- if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t.function.name }}{% endfor %}. Call one as "
        "<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call><|im_end|>\n{% endif %}"
        "{%- for m in messages %}<|im_start|>{{ m.role }}\n{% if m.tool_calls %}{% for tc in m.tool_calls %}<tool_call>\n"
        "<function={{ tc.function.name }}>\n{% for k, v in tc.function.arguments | items %}<parameter={{ k }}>\n"
        "{{ v | tojson if v is mapping or (v is sequence and v is not string) else v | string }}\n</parameter>\n{% endfor %}"
        "</function>\n</tool_call>{% endfor %}"
        "{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    server s;
    if (!template_server(&s, "tools-xml", model, tok_path, "xml_tools.jinja", xml_template, TOOLS_ARGS, "the calls written as XML")) return;
    const int calls = required_calls(s.port, weather_tools, 2, 0);
    T_CHECK(calls >= 3, "XML: only %d calls in 4 answers", calls);
    /* a conversation's call as the template writes it: its arguments an object, each in its block */
    char body[4096], conv[4096];
    snprintf(conv, sizeof conv,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Play?\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":"
             "[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":"
             "\"{\\\"city\\\":\\\"Oslo\\\",\\\"days\\\":3,\\\"hourly\\\":true,\\\"at\\\":null,\\\"o\\\":{\\\"a\\\":[1]}}\"}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"done\"}],%s}",
             weather_tools);
    resp r;
    T_CHECK(http(s.port, "POST", "/apply-template", NULL, conv, &r) && r.status == 200 &&
                strstr(r.body, "<|im_start|>assistant\\n<tool_call>\\n<function=get_weather>\\n<parameter=city>\\nOslo\\n</parameter>\\n"
                               "<parameter=days>\\n3\\n</parameter>\\n<parameter=hourly>\\nTrue\\n</parameter>\\n<parameter=at>\\nNone\\n"
                               "</parameter>\\n<parameter=o>\\n{\\\"a\\\": [1]}\\n</parameter>\\n</function>\\n</tool_call><|im_end|>"),
            "XML apply-template: %d %s", r.status, r.body);
    resp_free(&r);
    /* a schema the form cannot hold is a 400 when the call is required */
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
             "\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{\"anyOf\":[{\"type\":\"string\",\"pattern\":\"a+\"},"
             "{\"type\":\"integer\"}]}}}}}],\"tool_choice\":\"required\"}");
    T_CHECK(http(s.port, "POST", "/v1/chat/completions", NULL, body, &r) && r.status == 400 && strstr(r.body, "written as XML"),
            "XML unsupported schema: %d %s", r.status, r.body);
    resp_free(&r);
    int rc = server_stop(&s);
    T_CHECK(rc == 0, "XML tools server exit %d", rc);

    /* Mistral's later form (Ministral 3's): [TOOL_CALLS]NAME[ARGS]{...}, read from a
       template that writes [ARGS]; calls get Mistral's 9-character ids */
    mistral_form(model, "args", "the calls written as [TOOL_CALLS]NAME[ARGS]{...}", "", "", 1, conv,
                 "[INST]Play?[/INST][TOOL_CALLS]get_weather[ARGS]{\\\"city\\\": \\\"Oslo\\\", \\\"days\\\": 3, ");
    /* Mistral Small 3.2's form: the model names each call, [TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...};
       the server keeps its ids (which the template writes again with the results) */
    snprintf(conv, sizeof conv,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Play?\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":"
             "[{\"id\":\"k3Xb9Qz1a\",\"type\":\"function\",\"function\":{\"name\":\"play\",\"arguments\":\"{\\\"toy\\\":\\\"car\\\"}\"}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"k3Xb9Qz1a\",\"content\":\"done\"}],%s}",
             weather_tools);
    mistral_form(model, "call-id", "the calls written as [TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}",
                 "{% if tc.id is not string or tc.id | length != 9 %}{{ raise_exception('Tool call IDs should be 9 characters') }}"
                 "{% endif %}[CALL_ID]{{ tc.id }}",
                 "{{ m.tool_call_id }}[TOOL_CONTENT]", 2, conv,
                 "[INST]Play?[/INST][TOOL_CALLS]play[CALL_ID]k3Xb9Qz1a[ARGS]{\\\"toy\\\": \\\"car\\\"}</s>"
                 "[TOOL_RESULTS]k3Xb9Qz1a[TOOL_CONTENT]done[/TOOL_RESULTS]");
}

#define NCONC 8
static const char *prompts[NCONC] = {"Once upon a time",  "Lily and Ben",  "The dog",      "One day, a little",
                                     "Tom had a big red", "The sun was",   "A cat named",  "She wanted to"};

typedef struct {
    int port, chat, stream, max_tokens;
    const char *prompt;
    result res;
} job;

static void *run_job(void *arg) {
    job *j = arg;
    char body[1024];
    if (j->chat)
        snprintf(body, sizeof body,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":%d,\"temperature\":0,\"stream\":%s}",
                 j->prompt, j->max_tokens, j->stream ? "true" : "false");
    else
        snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0,\"stream\":%s}", j->prompt,
                 j->max_tokens, j->stream ? "true" : "false");
    complete(j->port, j->chat, NULL, body, &j->res);
    return NULL;
}

static void test_eight_concurrent_greedy_equal_alone(void) {
    if (!main_up) return t_skip("the main server did not start");
    job alone[NCONC], together[NCONC];
    for (int i = 0; i < NCONC; i++) {
        alone[i] = (job){main_srv.port, 0, 0, 48 + 3 * i, prompts[i], {0}};
        run_job(&alone[i]);
        T_CHECK(alone[i].res.status == 200 && alone[i].res.text[0], "alone %d: %d", i, alone[i].res.status);
    }
    pthread_t th[NCONC];
    for (int i = 0; i < NCONC; i++) {
        together[i] = alone[i];
        together[i].stream = i & 1;
        together[i].chat = (i >> 1) & 1;
        memset(&together[i].res, 0, sizeof together[i].res);
        pthread_create(&th[i], NULL, run_job, &together[i]);
    }
    for (int i = 0; i < NCONC; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < NCONC; i++)
        T_CHECK(together[i].res.status == 200 && !strcmp(together[i].res.text, alone[i].res.text) &&
                    !strcmp(together[i].res.finish, alone[i].res.finish),
                "request %d (chat %d stream %d) differs in a batch:\n      alone    '%s'\n      together '%s'", i,
                together[i].chat, together[i].stream, alone[i].res.text, together[i].res.text);
    T_CHECK(metric(main_srv.port, "nerve_step_rows_total") > metric(main_srv.port, "nerve_steps_total"),
            "no step ever batched more than one row");
    T_CHECK(wait_pool_idle(main_srv.port), "blocks still in use after the requests ended");
}

/* body (a JSON object's text) with "prediction": {"type": "content", "content": pred} (pred NULL:
 * none) POSTed to path: the answer without id, created and usage.completion_tokens_details, whose
 * counts go to acc and rej (-1 when it has none; how many depends on the lookup's n-grams); its
 * first choice's text to text (NULL: not asked). */
static char *predicted_core(int port, const char *path, const char *body, const char *pred, int *acc, int *rej, char *text,
                            size_t cap) {
    char *with = NULL, *out = NULL; /* the body with the prediction */
    if (pred) {
        cJSON *b = cJSON_Parse(body), *p = cJSON_AddObjectToObject(b, "prediction");
        cJSON_AddStringToObject(p, "type", "content");
        cJSON_AddStringToObject(p, "content", pred);
        with = cJSON_PrintUnformatted(b);
        cJSON_Delete(b);
    }
    resp r;
    *acc = *rej = -1;
    if (text) text[0] = '\0';
    if (http(port, "POST", path, NULL, with ? with : body, &r) && r.status == 200) {
        cJSON *root = cJSON_Parse(r.body);
        cJSON_DeleteItemFromObject(root, "id");
        cJSON_DeleteItemFromObject(root, "created");
        cJSON *d = cJSON_DetachItemFromObject(cJSON_GetObjectItem(root, "usage"), "completion_tokens_details");
        if (d) {
            *acc = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(d, "accepted_prediction_tokens"));
            *rej = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(d, "rejected_prediction_tokens"));
        }
        cJSON_Delete(d);
        const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0);
        const cJSON *t = cJSON_GetObjectItem(c0, "text");
        if (!t) t = cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "message"), "content");
        if (text && cJSON_IsString(t)) snprintf(text, cap, "%s", t->valuestring);
        out = cJSON_PrintUnformatted(root);
        cJSON_Delete(root);
    }
    resp_free(&r);
    free(with);
    return out;
}

/* The body of a 200 answer without its id and created (which differ between any two answers) and
 * usage.completion_tokens_details. */
static char *answer_core(int port, const char *path, const char *body) {
    int acc, rej;
    return predicted_core(port, path, body, NULL, &acc, &rej, NULL, 0);
}

/* The main server's flags (the speculative servers compare their answers with its). */
#define MAIN_ARGS "--alias tiny-stories --max-batch 8 --prefill-chunk 8 --kv-memory 4M --max-body 64K --engine avx2"

/* Speculative decoding checks drafts without changing a bit of the answer: the same text,
 * log-probabilities, finish and usage as the main server (same model, pool and settings, no drafts)
 * for greedy and seeded sampling with penalties, bias, stop strings, n, structured output and short
 * limits; alone and eight at once; and it saves steps. `drafts` are the server's flags beside the
 * main server's; at least min_accepted drafts are accepted over the requests. */
static void check_drafts_change_nothing(const char *name, const char *drafts, double min_accepted) {
    if (!main_up) return t_skip("the main server did not start");
    server sp;
    char args[1200];
    snprintf(args, sizeof args, MAIN_ARGS " %s", drafts);
    if (!server_start(&sp, name, args, NULL)) {
        T_CHECK(0, "the speculative server did not start");
        return;
    }
    static const char *const bodies[][2] = {
        {"/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":200,\"temperature\":0}"},
        {"/v1/completions", "{\"prompt\":\"Lily and Ben\",\"max_tokens\":150,\"temperature\":0.8,\"top_p\":0.9,\"seed\":7}"},
        {"/v1/completions", "{\"prompt\":\"The dog\",\"max_tokens\":120,\"temperature\":1,\"seed\":3,\"frequency_penalty\":0.5,"
                            "\"presence_penalty\":0.3,\"logprobs\":3}"},
        {"/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":200,\"temperature\":0,\"stop\":[\"park. They\"]}"},
        {"/v1/completions", "{\"prompt\":\"Tom had a big red\",\"max_tokens\":80,\"temperature\":1,\"seed\":11,\"n\":3}"},
        {"/v1/completions", "{\"prompt\":\"The sun was\",\"max_tokens\":100,\"temperature\":0,\"logit_bias\":{\"280\":-100}}"},
        {"/v1/completions", "{\"prompt\":\"Once upon a time, there was a little girl named Lily. Once upon a time\","
                            "\"max_tokens\":3,\"temperature\":0}"},
        {"/v1/completions", "{\"prompt\":\"Lily and Lily and Lily and\",\"max_tokens\":1,\"temperature\":0,\"echo\":true,\"logprobs\":1}"},
        {"/v1/completions", "{\"prompt\":\"A cat named\",\"max_tokens\":90,\"temperature\":0.7,\"seed\":2,"
                            "\"response_format\":{\"type\":\"json_object\"}}"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"She wanted to\"}],\"max_tokens\":120,"
                                 "\"temperature\":0.9,\"seed\":5,\"logprobs\":true,\"top_logprobs\":2}"},
        /* a prediction's drafts beside the server's own (a draft model never drafts for it) */
        {"/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":60,\"temperature\":0,\"prediction\":{\"type\":"
                            "\"content\",\"content\":\", there was a little girl named Lily. She loved to play in the sun.\"}}"},
    };
    const int n_bodies = (int)(sizeof bodies / sizeof bodies[0]);
    double steps0 = metric(sp.port, "nerve_steps_total");
    for (int i = 0; i < n_bodies; i++) {
        char *want = answer_core(main_srv.port, bodies[i][0], bodies[i][1]);
        char *got = answer_core(sp.port, bodies[i][0], bodies[i][1]);
        T_CHECK(want && got && !strcmp(want, got), "request %d differs with drafts:\n      without %.300s\n      with    %.300s", i,
                want ? want : "(failed)", got ? got : "(failed)");
        free(want);
        free(got);
    }
    double steps = metric(sp.port, "nerve_steps_total") - steps0, accepted = metric(sp.port, "nerve_spec_accepted_tokens_total");
    double drafted = metric(sp.port, "nerve_spec_draft_tokens_total");
    T_CHECK(accepted > min_accepted && drafted >= accepted, "drafts: %.0f proposed, %.0f accepted", drafted, accepted);
    /* the greedy 200-token story alone: fewer steps than tokens */
    steps0 = metric(sp.port, "nerve_steps_total");
    char *a = answer_core(sp.port, bodies[0][0], bodies[0][1]);
    steps = metric(sp.port, "nerve_steps_total") - steps0;
    T_CHECK(a && steps < 0.9 * 200, "%.0f steps for 200 tokens", steps);
    free(a);
    /* eight at once, streamed and not, chat and not: each equal to the main server's answer alone */
    job alone[NCONC], together[NCONC];
    pthread_t th[NCONC];
    for (int i = 0; i < NCONC; i++) {
        alone[i] = (job){main_srv.port, (i >> 1) & 1, 0, 60 + 5 * i, prompts[i], {0}};
        run_job(&alone[i]);
        together[i] = alone[i];
        together[i].port = sp.port;
        together[i].stream = i & 1;
        memset(&together[i].res, 0, sizeof together[i].res);
    }
    for (int i = 0; i < NCONC; i++) pthread_create(&th[i], NULL, run_job, &together[i]);
    for (int i = 0; i < NCONC; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < NCONC; i++)
        T_CHECK(alone[i].res.status == 200 && together[i].res.status == 200 && !strcmp(together[i].res.text, alone[i].res.text) &&
                    !strcmp(together[i].res.finish, alone[i].res.finish) &&
                    (together[i].stream || together[i].res.completion_tokens == alone[i].res.completion_tokens),
                "request %d (chat %d stream %d) differs:\n      without drafts '%s'\n      with            '%s'", i,
                together[i].chat, together[i].stream, alone[i].res.text, together[i].res.text);
    T_CHECK(wait_pool_idle(sp.port), "blocks still in use after the requests ended");
    int rc = server_stop(&sp);
    T_CHECK(rc == 0, "speculative server exit %d", rc);
}

static void test_speculative_decoding(void) { check_drafts_change_nothing("spec", "--spec-tokens 6 --spec-lookup-min 1", 50); }


typedef struct {
    int port;
    const char *body, *pred;
    char *core;
    int acc, rej;
    char text[4096];
} pred_job;

static void *run_pred_job(void *arg) {
    pred_job *j = arg;
    j->core = predicted_core(j->port, "/v1/completions", j->body, j->pred, &j->acc, &j->rej, j->text, sizeof j->text);
    return NULL;
}

/* OpenAI's Predicted Outputs on the main server (no --spec-tokens): a prediction changes nothing in
 * the answer (text, log-probabilities, finish, usage; greedy and sampled, chat and not, n, a stop
 * string), whether it is the answer, an edit of it or unrelated; the answer itself as prediction
 * saves most steps; usage counts the drafts taken and refused, streamed too. */
static void test_prediction(void) {
    if (!main_up) return t_skip("the main server did not start");
    const int port = main_srv.port;
    static const char *const bodies[][2] = {
        {"/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":150,\"temperature\":0}"},
        {"/v1/completions", "{\"prompt\":\"Lily and Ben\",\"max_tokens\":120,\"temperature\":0.8,\"top_p\":0.9,\"seed\":7,\"logprobs\":2}"},
        {"/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"She wanted to\"}],\"max_tokens\":100,"
                                 "\"temperature\":0.9,\"seed\":5,\"logprobs\":true,\"top_logprobs\":2}"},
        {"/v1/completions", "{\"prompt\":\"Tom had a big red\",\"max_tokens\":80,\"temperature\":1,\"seed\":11,\"n\":2}"},
        {"/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":200,\"temperature\":0,\"stop\":[\"park. They\"]}"},
    };
    static char text[8192], edited[8192], unused[8192];
    int acc, rej;
    for (int i = 0; i < (int)(sizeof bodies / sizeof bodies[0]); i++) {
        char *want = predicted_core(port, bodies[i][0], bodies[i][1], NULL, &acc, &rej, text, sizeof text);
        T_CHECK(want && acc == -1, "request %d without a prediction: %s, details %d", i, want ? "ok" : "failed", acc);
        /* the answer itself; an edit of it (a word in the middle replaced, a piece cut out); unrelated text */
        snprintf(edited, sizeof edited, "%s", text);
        const size_t len = strlen(edited);
        if (len > 60) {
            memcpy(edited + len / 3, "purple", 6);
            memmove(edited + len / 2, edited + len / 2 + 15, len - len / 2 - 15 + 1);
        }
        const char *preds[] = {text, edited, "The end. 12345 and then something else entirely."};
        for (int k = 0; k < 3; k++) {
            const double steps0 = metric(port, "nerve_steps_total");
            char *got = predicted_core(port, bodies[i][0], bodies[i][1], preds[k], &acc, &rej, unused, sizeof unused);
            const double steps = metric(port, "nerve_steps_total") - steps0;
            T_CHECK(want && got && !strcmp(want, got), "request %d, prediction %d, changes the answer:\n      without %.300s\n      with    %.300s",
                    i, k, want ? want : "(failed)", got ? got : "(failed)");
            T_CHECK(acc >= 0 && rej >= 0, "request %d, prediction %d: no completion_tokens_details (%d %d)", i, k, acc, rej);
            if (i == 0 && k == 0) /* greedy, 150 tokens, exactly predicted: most taken as drafts, steps saved */
                T_CHECK(acc >= 120 && rej == 0 && steps < 40, "the answer predicted: %d taken, %d refused, %.0f steps", acc, rej, steps);
            if (i == 0 && k == 1) T_CHECK(acc >= 80 && rej > 0, "an edit predicted: %d taken, %d refused", acc, rej);
            free(got);
        }
        free(want);
    }
    /* streamed, with usage: the same text, and the counts in the usage chunk */
    result plain, streamed;
    free(predicted_core(port, bodies[0][0], bodies[0][1], NULL, &acc, &rej, text, sizeof text));
    cJSON *b = cJSON_Parse(bodies[0][1]);
    cJSON_AddTrueToObject(b, "stream");
    cJSON_AddTrueToObject(cJSON_AddObjectToObject(b, "stream_options"), "include_usage");
    cJSON *p = cJSON_AddObjectToObject(b, "prediction");
    cJSON_AddStringToObject(p, "type", "content");
    cJSON *parts = cJSON_AddArrayToObject(p, "content"), *part = cJSON_CreateObject();
    cJSON_AddStringToObject(part, "type", "text");
    cJSON_AddStringToObject(part, "text", text);
    cJSON_AddItemToArray(parts, part);
    char *sb = cJSON_PrintUnformatted(b);
    cJSON_Delete(b);
    T_CHECK(complete(port, 0, NULL, sb, &streamed) && streamed.usage_chunk == 1 && !strcmp(streamed.text, text) &&
                streamed.pred_accepted >= 120 && streamed.completion_tokens == 150,
            "streamed with a prediction: usage %d, %d taken, %d tokens, '%.80s'", streamed.usage_chunk, streamed.pred_accepted,
            streamed.completion_tokens, streamed.text);
    free(sb);
    /* eight at once in the same steps, every other one with its answer (a word changed) as prediction: each
       the answer it gives alone */
    static char bodies8[NCONC][256], preds8[NCONC][4096];
    pred_job alone[NCONC], together[NCONC];
    pthread_t th[NCONC];
    for (int i = 0; i < NCONC; i++) {
        snprintf(bodies8[i], sizeof bodies8[i], "{\"prompt\":\"%s\",\"max_tokens\":%d,\"temperature\":0}", prompts[i], 60 + 7 * i);
        alone[i] = (pred_job){port, bodies8[i], NULL, NULL, 0, 0, ""};
        run_pred_job(&alone[i]);
        snprintf(preds8[i], sizeof preds8[i], "%s", alone[i].text);
        if (strlen(preds8[i]) > 30) memcpy(preds8[i] + strlen(preds8[i]) / 2, "purple", 6);
        together[i] = (pred_job){port, bodies8[i], i % 2 ? preds8[i] : NULL, NULL, 0, 0, ""};
    }
    for (int i = 0; i < NCONC; i++) pthread_create(&th[i], NULL, run_pred_job, &together[i]);
    for (int i = 0; i < NCONC; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < NCONC; i++) {
        T_CHECK(alone[i].core && together[i].core && !strcmp(alone[i].core, together[i].core) && (i % 2 ? together[i].acc > 0 : together[i].acc == -1),
                "request %d of eight (prediction %d, %d taken): '%.120s' against '%.120s' alone", i, i % 2, together[i].acc, together[i].text,
                alone[i].text);
        free(alone[i].core), free(together[i].core);
    }
    /* an empty prediction is no prediction's drafts, but the counts are there */
    T_CHECK(complete(port, 0, NULL, "{\"prompt\":\"Once\",\"max_tokens\":8,\"prediction\":{\"type\":\"content\",\"content\":\"\"}}", &plain) &&
                plain.status == 200 && plain.completion_tokens == 8,
            "an empty prediction: %d", plain.status);
    T_CHECK(wait_pool_idle(port), "blocks still in use after the requests ended");
}

/* Drafts from a draft model (a Q4_0 export of the model: most drafts right, some refused), the
 * main server's engine for the model and the fastest for the draft. */
static void test_draft_model(void) {
    char q4[600], cmd[2048], flags[800];
    snprintf(q4, sizeof q4, "%s/draft_q4.gguf", tmpdir);
    snprintf(cmd, sizeof cmd, "export %s -z %s -o %s --type q4_0", model_path, tok_path, q4);
    if (!main_up) return t_skip("the main server did not start");
    T_CHECK(t_nerve(cmd) == 0, "export: %s", t_err);
    snprintf(flags, sizeof flags, "--model-draft %s --spec-tokens 5", q4);
    check_drafts_change_nothing("draft", flags, 300);
}

/* llama.cpp's native /completion and /infill (serve/llamacpp.h): the same tokens as /v1/completions
 * with the same settings (greedy, and seeded under llama-server's default samplers), its response
 * and stream shapes (the stream's content joined is the whole response's, its last event carries
 * the settlement, no [DONE]), stop words, n_predict 0 warming the prefix cache, token-id prompts,
 * /props, and its refusals. */
static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItem(o, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}

static double jnum(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItem(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static void test_llamacpp_native(void) {
    if (!main_up) return t_skip("the main server did not start");
    const int port = main_srv.port;
    static const struct {
        const char *native, *openai;
    } same[] = {
        {"{\"prompt\":\"Once upon a time\",\"n_predict\":40,\"temperature\":0}",
         "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0}"},
        {"{\"prompt\":\"Lily and Ben\",\"n_predict\":60,\"seed\":9}", /* llama-server's defaults */
         "{\"prompt\":\"Lily and Ben\",\"max_tokens\":60,\"seed\":9,\"temperature\":0.8,\"top_k\":40,\"top_p\":0.95,\"min_p\":0.05}"},
        {"{\"prompt\":[1,403,407],\"n_predict\":30,\"temperature\":0.7,\"seed\":4,\"repeat_penalty\":1.3,\"cache_prompt\":true,"
         "\"samplers\":[\"top_k\"],\"logit_bias\":[[280,false]]}",
         "{\"prompt\":[1,403,407],\"max_tokens\":30,\"temperature\":0.7,\"seed\":4,\"repetition_penalty\":1.3,\"top_k\":40,"
         "\"top_p\":0.95,\"min_p\":0.05,\"logit_bias\":{\"280\":-100}}"},
        /* the penalties over the last 4 tokens, llama.cpp's repeat_last_n (its field on /v1/completions too) */
        {"{\"prompt\":\"Once upon a time\",\"n_predict\":50,\"temperature\":0,\"repeat_penalty\":1.6,\"frequency_penalty\":0.5,"
         "\"repeat_last_n\":4}",
         "{\"prompt\":\"Once upon a time\",\"max_tokens\":50,\"temperature\":0,\"repetition_penalty\":1.6,\"frequency_penalty\":0.5,"
         "\"repeat_last_n\":4}"},
    };
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        int st1, st2;
        cJSON *a = post_json_status(port, "/completion", same[i].native, &st1), *b = post_json_status(port, "/v1/completions", same[i].openai, &st2);
        const char *want = jstr(cJSON_GetArrayItem(cJSON_GetObjectItem(b, "choices"), 0), "text");
        T_CHECK(st1 == 200 && st2 == 200 && *want && !strcmp(jstr(a, "content"), want), "case %zu: native '%s', openai '%s'", i,
                jstr(a, "content"), want);
        T_CHECK(cJSON_IsTrue(cJSON_GetObjectItem(a, "stop")) && jnum(a, "tokens_predicted") > 0 && jnum(a, "tokens_evaluated") > 0 &&
                    !strcmp(jstr(a, "model"), "tiny-stories") && cJSON_IsObject(cJSON_GetObjectItem(a, "timings")) &&
                    jnum(cJSON_GetObjectItem(a, "timings"), "predicted_n") == jnum(a, "tokens_predicted") &&
                    cJSON_IsObject(cJSON_GetObjectItem(a, "generation_settings")),
                "case %zu: the response's fields", i);
        cJSON_Delete(a), cJSON_Delete(b);
    }
    /* vLLM's prompt_logprobs has no place in this API: dropped (not a streaming 400) */
    {
        resp pr;
        T_CHECK(http(port, "POST", "/completion", NULL, "{\"prompt\":\"Once\",\"n_predict\":2,\"prompt_logprobs\":1,\"stream\":true}", &pr) &&
                    pr.status == 200,
                "/completion with prompt_logprobs: %d %s", pr.status, pr.body);
        resp_free(&pr);
    }
    /* a window is not the whole text: llama-server's default 64 differs from OpenAI's and vLLM's
       penalties over all of it once the answer is longer */
    {
        int s1, s2, s3;
        cJSON *win = post_json_status(port, "/completion", "{\"prompt\":\"Once upon a time\",\"n_predict\":120,\"temperature\":0,"
                                                           "\"repeat_penalty\":1.3,\"frequency_penalty\":0.3}", &s1);
        cJSON *all = post_json_status(port, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":120,\"temperature\":0,"
                                                                "\"repetition_penalty\":1.3,\"frequency_penalty\":0.3}", &s2);
        cJSON *w64 = post_json_status(port, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":120,\"temperature\":0,"
                                                                "\"repetition_penalty\":1.3,\"frequency_penalty\":0.3,\"repeat_last_n\":64}", &s3);
        const char *t_all = jstr(cJSON_GetArrayItem(cJSON_GetObjectItem(all, "choices"), 0), "text"),
                   *t_w64 = jstr(cJSON_GetArrayItem(cJSON_GetObjectItem(w64, "choices"), 0), "text");
        T_CHECK(s1 == 200 && s2 == 200 && s3 == 200 && !strcmp(jstr(win, "content"), t_w64) && strcmp(t_w64, t_all),
                "repeat_last_n 64 by default: native '%.80s', windowed '%.80s', whole '%.80s'", jstr(win, "content"), t_w64, t_all);
        cJSON_Delete(win), cJSON_Delete(all), cJSON_Delete(w64);
    }
    /* n_probs: a record a generated token, whose texts spell the content, with n alternatives; the
       values /v1/completions' logprobs give; post_sampling_probs as probabilities */
    int st1, st2, st3;
    cJSON *np = post_json_status(port, "/completion", "{\"prompt\":\"Once upon a time\",\"n_predict\":12,\"temperature\":0,\"n_probs\":3}", &st1);
    cJSON *op = post_json_status(port, "/v1/completions", "{\"prompt\":\"Once upon a time\",\"max_tokens\":12,\"temperature\":0,\"logprobs\":3}", &st2);
    cJSON *pp = post_json_status(port, "/completion",
                          "{\"prompt\":\"Once upon a time\",\"n_predict\":12,\"temperature\":0,\"n_probs\":3,\"post_sampling_probs\":true}", &st3);
    const cJSON *cp = cJSON_GetObjectItem(np, "completion_probabilities"), *pcp = cJSON_GetObjectItem(pp, "completion_probabilities");
    const cJSON *olp = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(op, "choices"), 0), "logprobs"),
                                           "token_logprobs");
    char spelled[1024] = "";
    int ok = st1 == 200 && st2 == 200 && st3 == 200 && cJSON_GetArraySize(cp) == (int)jnum(np, "tokens_predicted") &&
             cJSON_GetArraySize(cp) == cJSON_GetArraySize(olp) && cJSON_GetArraySize(pcp) == cJSON_GetArraySize(cp);
    for (int i = 0; ok && i < cJSON_GetArraySize(cp); i++) {
        const cJSON *e = cJSON_GetArrayItem(cp, i), *pe = cJSON_GetArrayItem(pcp, i), *tops = cJSON_GetObjectItem(e, "top_logprobs");
        strncat(spelled, jstr(e, "token"), sizeof spelled - strlen(spelled) - 1);
        ok = cJSON_GetArraySize(tops) == 3 && jnum(cJSON_GetArrayItem(tops, 0), "id") == jnum(e, "id") &&
             fabs(jnum(e, "logprob") - cJSON_GetArrayItem(olp, i)->valuedouble) < 1e-6 &&
             fabs(jnum(pe, "prob") - exp(jnum(e, "logprob"))) < 1e-6 && cJSON_GetArraySize(cJSON_GetObjectItem(pe, "top_probs")) == 3 &&
             cJSON_GetArraySize(cJSON_GetObjectItem(e, "bytes")) == (int)strlen(jstr(e, "token"));
    }
    T_CHECK(ok && !strcmp(spelled, jstr(np, "content")), "n_probs: %d %d %d '%s' vs '%s'", st1, st2, st3, spelled, jstr(np, "content"));
    cJSON_Delete(np), cJSON_Delete(op), cJSON_Delete(pp);
    resp sp;
    int records = 0;
    T_CHECK(http(port, "POST", "/completion", NULL, "{\"prompt\":\"Once upon a time\",\"n_predict\":12,\"temperature\":0,\"n_probs\":2,"
                 "\"stream\":true}", &sp) && sp.status == 200, "streamed n_probs: %d", sp.status);
    for (const char *at = sp.body ? sp.body : ""; (at = strstr(at, "\"top_logprobs\"")) != NULL; at++) records++;
    T_CHECK(records == 12 && strstr(sp.body ? sp.body : "", "\"tokens_predicted\":12"), "streamed n_probs: %d records", records);
    resp_free(&sp);
    /* streamed: the events' content joined is the whole response's; the last one settles, no [DONE] */
    resp whole, streamed;
    const char *fmt = "{\"prompt\":\"The dog\",\"n_predict\":50,\"seed\":2%s}";
    if (post_whole_and_streamed(port, "/completion", fmt, ",\"stream\":true", &whole, &streamed)) {
        cJSON *w = cJSON_Parse(whole.body), *ev, *last = NULL;
        char joined[4096] = "";
        int events = 0, stops = 0;
        for (const char *p = streamed.body; (ev = next_sse_json(&p)); events++) {
            strncat(joined, jstr(ev, "content"), sizeof joined - strlen(joined) - 1);
            stops += cJSON_IsTrue(cJSON_GetObjectItem(ev, "stop"));
            cJSON_Delete(last);
            last = ev;
        }
        T_CHECK(events >= 2 && stops == 1 && last && cJSON_IsTrue(cJSON_GetObjectItem(last, "stop")) &&
                    cJSON_GetObjectItem(last, "timings") && !strstr(streamed.body, "[DONE]") && !strcmp(joined, jstr(w, "content")),
                "stream: %d events, %d stops, joined '%s', whole '%s'", events, stops, joined, jstr(w, "content"));
        cJSON_Delete(last), cJSON_Delete(w);
    } else {
        T_CHECK(0, "POST /completion: %d %d", whole.status, streamed.status);
    }
    resp_free(&whole), resp_free(&streamed);
    /* a stop word */
    int st;
    cJSON *a = post_json_status(port, "/completion", "{\"prompt\":\"Once upon a time\",\"n_predict\":100,\"temperature\":0,\"stop\":[\"park\",\"zz\"]}", &st);
    T_CHECK(st == 200 && !strcmp(jstr(a, "stop_type"), "word") && !strcmp(jstr(a, "stopping_word"), "park") && !strstr(jstr(a, "content"), "park"),
            "stop word: %s / %s", jstr(a, "stop_type"), jstr(a, "stopping_word"));
    cJSON_Delete(a);
    a = post_json_status(port, "/completion", "{\"prompt\":\"Once upon a time\",\"n_predict\":7,\"temperature\":0}", &st);
    T_CHECK(st == 200 && !strcmp(jstr(a, "stop_type"), "limit") && jnum(a, "tokens_predicted") == 7, "limit: %s", jstr(a, "stop_type"));
    cJSON_Delete(a);
    /* n_predict 0: the prompt alone, nothing back; then the same prompt finds its blocks cached */
    const char *warm = "{\"prompt\":\"Tom and his sister Mia went to the big park by the lake to fly a red kite with their dad\",\"n_predict\":0}";
    a = post_json_status(port, "/completion", warm, &st);
    const double evaluated = jnum(a, "tokens_evaluated");
    T_CHECK(st == 200 && !*jstr(a, "content") && jnum(a, "tokens_predicted") == 0 && evaluated > 16, "n_predict 0: %g evaluated", evaluated);
    cJSON_Delete(a);
    a = post_json_status(port, "/completion",
                  "{\"prompt\":\"Tom and his sister Mia went to the big park by the lake to fly a red kite with their dad\",\"n_predict\":4}", &st);
    T_CHECK(st == 200 && jnum(a, "tokens_cached") >= 16, "after warming: %g cached", jnum(a, "tokens_cached"));
    cJSON_Delete(a);
    /* GET /props: the context, the slots (--max-batch 8), the defaults a request gets */
    resp pr;
    cJSON *props = http(port, "GET", "/props", NULL, NULL, &pr) && pr.status == 200 ? cJSON_Parse(pr.body) : NULL;
    const cJSON *gs = cJSON_GetObjectItem(props, "default_generation_settings");
    T_CHECK(props && jnum(gs, "n_ctx") == 512 && jnum(props, "total_slots") == 8 && !strcmp(jstr(props, "model_alias"), "tiny-stories") &&
                jnum(cJSON_GetObjectItem(gs, "params"), "temperature") == 0.8 && jnum(cJSON_GetObjectItem(gs, "params"), "top_k") == 40,
            "/props: %d %s", pr.status, pr.body ? pr.body : "");
    cJSON_Delete(props);
    resp_free(&pr);
    T_CHECK(http(port, "POST", "/props", NULL, "{}", &pr) && pr.status == 405, "POST /props: %d", pr.status);
    resp_free(&pr);
    /* dynamic temperature, as llama.cpp's web UI sends it */
    T_CHECK(http(port, "POST", "/completion", NULL, "{\"prompt\":\"Once\",\"n_predict\":8,\"dynatemp_range\":0.5,\"dynatemp_exponent\":1.2}",
                 &pr) && pr.status == 200 && strstr(pr.body, "\"content\""),
            "dynatemp: %d %s", pr.status, pr.body ? pr.body : "");
    resp_free(&pr);
    static const struct {
        const char *path, *body, *says;
    } bad[] = {{"/completion", "{\"prompt\":\"x\",\"tfs_z\":0.5}", "tfs_z"},
               {"/completion", "{\"prompt\":\"x\",\"dynatemp_range\":-0.5}", "dynatemp_range"},
               {"/completion", "{\"prompt\":\"x\",\"n_probs\":21}", "n_probs"},
               {"/completion", "{\"prompt\":\"x\",\"post_sampling_probs\":1}", "post_sampling_probs"},
               {"/v1/completions", "{\"prompt\":\"x\",\"dynatemp_exponent\":\"1\"}", "dynatemp_exponent"},
               {"/completion", "{\"prompt\":[\"a\",\"b\"]}", "list of token ids"},
               {"/completion", "{\"prompt\":\"x\",\"n_predict\":-3}", "n_predict"},
               {"/completion", "{\"prompt\":\"x\",\"lora\":[{\"id\":0,\"scale\":1}]}", "lora"},
               {"/completion", "{\"prompt\":\"x\",\"logit_bias\":[[1]]}", "logit_bias"},
               {"/completion", "{\"n_predict\":3}", "prompt"},
               {"/completion", "[1,2]", "JSON object"},
               {"/infill", "{\"input_prefix\":\"def f(\",\"input_suffix\":\")\"}", "fill-in-the-middle"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        resp r;
        T_CHECK(http(port, "POST", bad[i].path, NULL, bad[i].body, &r) && r.status == 400 && r.body && strstr(r.body, bad[i].says) &&
                    strstr(r.body, "\"error\""),
                "%s %s: %d %s", bad[i].path, bad[i].body, r.status, r.body ? r.body : "");
        resp_free(&r);
    }
}

static void test_sixteen_clients(void) {
    if (!main_up) return t_skip("the main server did not start");
    enum { N = 16 };
    job jobs[N];
    pthread_t th[N];
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++) {
            jobs[i] = (job){main_srv.port, i % 3 == 0, (i + round) & 1, 12 + i, prompts[i % NCONC], {0}};
            pthread_create(&th[i], NULL, run_job, &jobs[i]);
        }
        for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < N; i++)
            T_CHECK(jobs[i].res.status == 200 && jobs[i].res.text[0] &&
                        (jobs[i].res.completion_tokens == 0 || jobs[i].res.completion_tokens <= 12 + i),
                    "client %d round %d: status %d text '%s'", i, round, jobs[i].res.status, jobs[i].res.text);
    }
    T_CHECK(wait_pool_idle(main_srv.port), "blocks still in use after 16 clients");
}

typedef struct {
    const char *method, *path, *body;
    int status;
    const char *param, *code;
} bad_case;

static void test_bad_requests_table(void) {
    if (!main_up) return t_skip("the main server did not start");
    int port = main_srv.port;
    static char long_prompt[20000];
    strcpy(long_prompt, "{\"prompt\":\"");
    for (int i = 0; i < 700; i++) strcat(long_prompt, "Once upon a ");
    strcat(long_prompt, "\"}");
    static char deep[60000]; /* nested 25000 deep: refused by the parser's depth limit, not a crash */
    strcpy(deep, "{\"prompt\":");
    memset(deep + strlen(deep), '[', 25000);
    strcat(deep, "}");
    const char *C = "/v1/completions", *H = "/v1/chat/completions";
    const bad_case cases[] = {
        {"POST", C, "{", 400, NULL, "invalid_json"},
        {"POST", C, "", 400, NULL, "invalid_json"},
        {"POST", C, "[]", 400, NULL, "invalid_json"},
        {"POST", C, "\"hi\"", 400, NULL, "invalid_json"},
        {"POST", C, "{\"prompt\":\"x\"} trailing", 400, NULL, "invalid_json"},
        {"POST", C, deep, 400, NULL, "invalid_json"},
        {"POST", C, "{\"prompt\":\"caf\xe9\"}", 400, NULL, "invalid_json"}, /* Latin-1, not UTF-8 */
        {"POST", H, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xed\xa0\x80\"}]}", 400, NULL, "invalid_json"}, /* a surrogate's bytes */
        {"POST", C, "{}", 400, "prompt", NULL},
        {"POST", C, "{\"prompt\":5}", 400, "prompt", NULL},
        {"POST", C, "{\"prompt\":[]}", 400, "prompt", NULL},
        {"POST", C, "{\"prompt\":[1,2,99999]}", 400, "prompt", NULL},
        {"POST", C, "{\"prompt\":[\"a\",5]}", 400, "prompt", NULL},
        {"POST", C, "{\"prompt\":\"def f(\",\"suffix\":\"return 1\"}", 400, "suffix", NULL}, /* tok512: no fill-in-the-middle markers */
        {"POST", H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"suffix\":\"y\"}", 400, "suffix", "unsupported_parameter"},
        {"POST", H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"modalities\":[\"text\",\"audio\"]}", 400, "modalities",
         "unsupported_parameter"},
        {"POST", H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"audio\":{\"voice\":\"alloy\"}}", 400, "audio", "unsupported_parameter"},
        {"POST", H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"web_search_options\":{}}", 400, "web_search_options",
         "unsupported_parameter"},
        {"POST", C, "{\"prompt\":\"x\",\"prediction\":\"text\"}", 400, "prediction", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"prediction\":{\"type\":\"text\",\"content\":\"a\"}}", 400, "prediction", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"prediction\":{\"type\":\"content\"}}", 400, "prediction", "missing_required_parameter"},
        {"POST", H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"prediction\":{\"type\":\"content\",\"content\":5}}", 400,
         "prediction", NULL},
        {"POST", H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"prediction\":{\"type\":\"content\",\"content\":[{\"type\":"
                    "\"image_url\"}]}}", 400, "prediction", NULL},
        {"POST", C, "{\"prompt\":[\"a\",\"b\"],\"n\":9}", 400, "n", NULL},
        {"POST", C, "{\"prompt\":[\"a\",[1,2,99999]]}", 400, "prompt", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"max_tokens\":\"10\"}", 400, "max_tokens", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"max_tokens\":0}", 400, "max_tokens", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"max_tokens\":-5}", 400, "max_tokens", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"max_tokens\":1.5}", 400, "max_tokens", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"max_tokens\":600}", 400, "max_tokens", "context_length_exceeded"},
        {"POST", C, long_prompt, 400, "prompt", "context_length_exceeded"},
        {"POST", C, "{\"prompt\":\"x\",\"temperature\":\"hot\"}", 400, "temperature", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"temperature\":-1}", 400, "temperature", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"temperature\":3}", 400, "temperature", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"top_p\":-0.1}", 400, "top_p", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"top_p\":1.5}", 400, "top_p", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"top_k\":2.5}", 400, "top_k", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"top_k\":-2}", 400, "top_k", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"min_p\":1.5}", 400, "min_p", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"repetition_penalty\":0}", 400, "repetition_penalty", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"repetition_penalty\":11}", 400, "repetition_penalty", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"min_p\":\"some\"}", 400, "min_p", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"ignore_eos\":1}", 400, "ignore_eos", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"min_tokens\":-1}", 400, "min_tokens", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"min_tokens\":20,\"max_tokens\":10}", 400, "min_tokens", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"min_tokens\":2,\"response_format\":{\"type\":\"json_object\"}}", 400, "min_tokens", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"n\":17}", 400, "n", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"stop\":5}", 400, "stop", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "stop", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"stop\":[\"a\",7]}", 400, "stop", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"stream\":\"yes\"}", 400, "stream", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true}}", 400, "stream_options", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"model\":\"gpt-4\"}", 404, "model", "model_not_found"},
        {"POST", C, "{\"prompt\":\"x\",\"model\":7}", 400, "model", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"seed\":\"abc\"}", 400, "seed", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"seed\":1.5}", 400, "seed", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"logprobs\":21}", 400, "logprobs", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"logprobs\":true}", 400, "logprobs", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"echo\":true,\"max_tokens\":-2}", 400, "max_tokens", NULL},
        {"POST", H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":3}", 400, "logprobs", NULL},
        {"POST", H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", 400, "top_logprobs", NULL},
        {"POST", H, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":21}", 400, "top_logprobs", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"presence_penalty\":2.5}", 400, "presence_penalty", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"frequency_penalty\":\"high\"}", 400, "frequency_penalty", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"logit_bias\":[1,2]}", 400, "logit_bias", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"logit_bias\":{\"abc\":1}}", 400, "logit_bias", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"logit_bias\":{\"512\":1}}", 400, "logit_bias", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"logit_bias\":{\"5\":101}}", 400, "logit_bias", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"logit_bias\":{\"5\":\"ban\"}}", 400, "logit_bias", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"echo\":1}", 400, "echo", NULL},
        {"POST", H, "{}", 400, "messages", NULL},
        {"POST", H, "{\"messages\":\"hi\"}", 400, "messages", NULL},
        {"POST", H, "{\"messages\":[]}", 400, "messages", NULL},
        {"POST", H, "{\"messages\":[5]}", 400, "messages", NULL},
        {"POST", H, "{\"messages\":[{\"content\":\"hi\"}]}", 400, "messages", NULL},
        {"POST", H, "{\"messages\":[{\"role\":\"robot\",\"content\":\"hi\"}]}", 400, "messages", NULL},
        {"POST", H, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "messages", NULL},
        {"POST", H, "{\"messages\":[{\"role\":\"user\"}]}", 400, "messages", NULL},
        {"POST", H, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\",\"image_url\":{\"url\":\"x\"}}]}]}", 400, "messages", NULL},
        {"POST", H, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_completion_tokens\":0}", 400, "max_completion_tokens", NULL},
        {"POST", H, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tools\":[{\"type\":\"function\"}]}", 400, "tools", NULL},
        {"POST", H, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"response_format\":{\"type\":\"xml\"}}", 400, "response_format.type", NULL},
        {"POST", H, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"response_format\":\"json\"}", 400, "response_format", NULL},
        {"POST", H, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"response_format\":{\"type\":\"json_schema\"}}", 400, "response_format.json_schema", NULL},
        {"POST", H, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":{\"type\":\"string\",\"pattern\":\"(?=a)\"}}}}", 400, "response_format.json_schema.schema", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"guided_json\":\"{not json\"}", 400, "guided_json", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"json_schema\":{\"$ref\":\"#/nope\"}}", 400, "json_schema", NULL},
        {"POST", C, "{\"prompt\":\"x\",\"json_schema\":{},\"guided_json\":{}}", 400, "json_schema", NULL},
        {"POST", H, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"n\":0}", 400, "n", NULL},
        {"POST", H, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"model\":\"nope\"}", 404, "model", "model_not_found"},
        {"GET", C, NULL, 405, NULL, "method_not_allowed"},
        {"GET", H, NULL, 405, NULL, "method_not_allowed"},
        {"POST", "/health", "{}", 405, NULL, "method_not_allowed"},
        {"DELETE", "/v1/models", NULL, 405, NULL, "method_not_allowed"},
        {"GET", "/tokenize", NULL, 405, NULL, "method_not_allowed"},
        {"POST", "/detokenize", "{\"tokens\":[-1]}", 400, "tokens", NULL},
        {"GET", "/nope", NULL, 404, NULL, "not_found"},
        {"GET", "/v1/models/gpt-4", NULL, 404, "model", "model_not_found"},
        {"OPTIONS", C, NULL, 405, NULL, "method_not_allowed"},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    T_CHECK(n >= 30, "only %d cases", n);
    for (int i = 0; i < n; i++) {
        const bad_case *k = &cases[i];
        resp r;
        int ok = http(port, k->method, k->path, NULL, k->body, &r);
        char why[200] = "";
        T_CHECK(ok && r.status == k->status && error_body_ok(r.body, k->param, k->code, why, sizeof why),
                "case %d: %s %s %.60s -> %d (want %d) %s body %.300s", i, k->method, k->path, k->body ? k->body : "",
                r.status, k->status, why, r.body ? r.body : "");
        resp_free(&r);
    }
    /* bodies over --max-body: announced by Content-Length (refused before reading), and chunked */
    const char *big = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      "Content-Length: 10000000\r\n\r\n";
    resp r;
    char why[200] = "";
    T_CHECK(http_raw(port, big, strlen(big), &r) && r.status == 413 &&
                error_body_ok(r.body, NULL, "request_too_large", why, sizeof why),
            "Content-Length over the limit: %d %s", r.status, why);
    resp_free(&r);
    size_t cap = 200000, len = 0;
    char *chunked = malloc(cap);
    len += (size_t)snprintf(chunked, cap, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                          "Transfer-Encoding: chunked\r\n\r\n");
    for (int i = 0; i < 20; i++) {
        len += (size_t)snprintf(chunked + len, cap - len, "1000\r\n");
        memset(chunked + len, 'a', 4096);
        len += 4096;
        len += (size_t)snprintf(chunked + len, cap - len, "\r\n");
    }
    len += (size_t)snprintf(chunked + len, cap - len, "0\r\n\r\n");
    T_CHECK(http_raw(port, chunked, len, &r) && r.status == 413, "chunked body over the limit: %d", r.status);
    resp_free(&r);
    free(chunked);
    /* still serving */
    result ok;
    T_CHECK(http(port, "GET", "/health", NULL, NULL, &r) && r.status == 200, "health after bad requests: %d", r.status);
    resp_free(&r);
    complete(port, 0, NULL, "{\"prompt\":\"Once\",\"max_tokens\":5}", &ok);
    T_CHECK(ok.status == 200 && ok.completion_tokens >= 1, "completion after bad requests: %d", ok.status);
    T_CHECK(metric(port, "nerve_requests_total{status=\"400\"}") >= 40, "400s not counted in /metrics");
}

/* Option errors exit 2, bad files and an address in use exit 1, each with one line on stderr. */
static void test_cli_errors(void) {
    if (!main_up) return t_skip("the main server did not start");
    struct {
        const char *args;
        int rc;
    } cases[] = {
        {"serve", 2},
        {"serve -m M -z Z --bogus", 2},
        {"serve -m M -z Z --kv-memory lots", 2},
        {"serve -m M -z Z --chat-template jinja", 2},
        {"serve -m M -z Z --kv-cache-dtype q4_0", 2},
        {"serve -m M -z Z --port 70000", 2},
        {"serve -m M -z Z --max-batch 0", 2},
        {"serve -m /nonexistent/model.bin -z Z --port 0", 1},
        {"serve -m M -z Z --port 0 --kv-memory 1K", 1},
        {"serve -m M -z Z --port PORT", 1},
        {"serve --help", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[2048] = "", port[16];
        snprintf(port, sizeof port, "%d", main_srv.port);
        /* substitute M, Z and PORT */
        for (const char *p = cases[i].args; *p;) {
            const char *sub = NULL;
            size_t skip = 1;
            if (!strncmp(p, "PORT", 4)) sub = port, skip = 4;
            else if (p[0] == 'M' && (p[1] == ' ' || !p[1])) sub = model_path;
            else if (p[0] == 'Z' && (p[1] == ' ' || !p[1])) sub = tok_path;
            if (sub) strncat(args, sub, sizeof args - strlen(args) - 1);
            else strncat(args, p, 1);
            p += skip;
        }
        char cmd[4096], errp[600], *err = NULL;
        snprintf(errp, sizeof errp, "%s/cli.err", tmpdir);
        snprintf(cmd, sizeof cmd, "timeout 30 '%s' %s >/dev/null 2>'%s' </dev/null", t_nerve_bin(), args, errp);
        int st = system(cmd), rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        nv_file_read_all(errp, &err, NULL);
        int lines = 0;
        for (const char *q = err ? err : ""; *q; q++) lines += *q == '\n';
        T_CHECK(rc == cases[i].rc && (rc == 0 || (lines == 1 && strstr(err, "nerve serve:"))), "'%s': exit %d, stderr '%s'",
                cases[i].args, rc, err ? err : "");
        free(err);
    }
}

/* ---- llama2.c's text through the API (scalar engine) ------------------------------------------- */

static void test_golden_through_api(void) {
    const char *want_path = t_data("models/stories260K_greedy200.expected.txt");
    if (!want_path) return;
    server s;
    if (!server_start(&s, "golden", "--engine scalar --kv-cache-dtype f32 --served-model-name karpathy/stories260K --prefill-chunk 3 --kv-block 32",
                      NULL)) {
        T_CHECK(0, "server did not start");
        return;
    }
    char *want = NULL;
    nv_file_read_all(want_path, &want, NULL);
    result r;
    complete(s.port, 0, NULL, "{\"prompt\":\"\",\"max_tokens\":200,\"temperature\":0}", &r);
    T_CHECK(r.status == 200 && want && !strcmp(r.text, want), "greedy from BOS differs from llama2.c:\n%s", r.text);
    /* top_p 0 (OpenAI's range is [0, 1]) keeps only the most likely token: greedy */
    result r0;
    complete(s.port, 0, NULL, "{\"prompt\":\"\",\"max_tokens\":200,\"temperature\":1,\"top_p\":0,\"seed\":3}", &r0);
    T_CHECK(r0.status == 200 && want && !strcmp(r0.text, want), "top_p 0: status %d, not greedy:\n%s", r0.status, r0.text);
    /* an id holding '/' (an "org/name" alias) is found whole */
    resp mr;
    T_CHECK(http(s.port, "GET", "/v1/models/karpathy/stories260K", NULL, NULL, &mr) && mr.status == 200 &&
                strstr(mr.body, "\"id\":\"karpathy/stories260K\""),
            "GET /v1/models/karpathy/stories260K: %d %s", mr.status, mr.body ? mr.body : "");
    resp_free(&mr);
    T_CHECK(http(s.port, "GET", "/v1/models/stories260K", NULL, NULL, &mr) && mr.status == 404, "the id's last part alone: %d",
            mr.status);
    resp_free(&mr);
    /* sampling with a seed: exactly what `nerve generate -s` (llama2.c's run -s) prints */
    complete(s.port, 0, NULL,
             "{\"prompt\":\"Once upon a time\",\"max_tokens\":60,\"temperature\":0.8,\"top_p\":0.9,\"seed\":42}", &r);
    char cmd[4096], out[600], *gen = NULL;
    snprintf(out, sizeof out, "%s/generate.txt", tmpdir);
    snprintf(cmd, sizeof cmd, "'%s' generate -m '%s' -z '%s' --engine scalar -p 'Once upon a time' -n %d -t 0.8 --top-p 0.9 -s 42 >'%s' 2>/dev/null",
             t_nerve_bin(), model_path, tok_path, r.prompt_tokens + 60 - 1, out);
    T_CHECK(system(cmd) == 0 && nv_file_read_all(out, &gen, NULL) == NV_OK, "generate failed");
    char expect[9000];
    snprintf(expect, sizeof expect, "Once upon a time%s", r.text);
    T_CHECK(gen && r.status == 200 && !strcmp(gen, expect), "seeded sample differs from generate:\n  api:      %s\n  generate: %s",
            expect, gen ? gen : "");
    free(gen);
    free(want);
    T_CHECK(server_stop(&s) == 0, "server did not exit 0 on SIGTERM");
}

/* ---- echo with logprobs: the prompt's own log-probabilities ----------------------------------- */

/* The completions records of a whole body or an SSE stream, flattened: tokens, token_logprobs,
 * top_logprobs into three arrays, the text into text. */
static void completion_records(const char *body, int stream, cJSON *tokens, cJSON *lps, cJSON *tops, char *text, size_t cap) {
    cJSON *ev = NULL;
    const char *p = body;
    text[0] = '\0';
    for (int first = 1; (ev = stream ? next_sse_json(&p) : first ? cJSON_Parse(body) : NULL); first = 0, cJSON_Delete(ev)) {
        const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(ev, "choices"), 0);
        const char *t = cJSON_GetStringValue(cJSON_GetObjectItem(c0, "text"));
        if (t) strncat(text, t, cap - strlen(text) - 1);
        const cJSON *lp = cJSON_GetObjectItem(c0, "logprobs"), *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItem(lp, "tokens")) cJSON_AddItemToArray(tokens, cJSON_Duplicate(e, 1));
        cJSON_ArrayForEach(e, cJSON_GetObjectItem(lp, "token_logprobs")) cJSON_AddItemToArray(lps, cJSON_Duplicate(e, 1));
        cJSON_ArrayForEach(e, cJSON_GetObjectItem(lp, "top_logprobs")) cJSON_AddItemToArray(tops, cJSON_Duplicate(e, 1));
    }
}

/* log-softmax(raw)[tok], computed as the server computes it */
static float ref_logprob(const float *raw, int n, int tok) {
    float maxv = raw[0];
    for (int i = 1; i < n; i++)
        if (raw[i] > maxv) maxv = raw[i];
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += expf(raw[i] - maxv);
    return raw[tok] - (maxv + (float)log(sum));
}

static int cached_tokens(const char *body) {
    cJSON *root = cJSON_Parse(body);
    const cJSON *c = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "usage"), "prompt_tokens_details"),
                                         "cached_tokens");
    int v = cJSON_IsNumber(c) ? c->valueint : -1;
    cJSON_Delete(root);
    return v;
}

/* A scalar-engine server with fp32 pages, prompts split across steps (chunks of 3) and blocks of 4
 * positions, beside the same model in this process with nv_forward run over `text` whole (the
 * reference; with all_logits, every row's logits). 0 when something did not start (reported). */
typedef struct {
    server s;
    nv_tokenizer *tok;
    nv_model m;
    nv_state st;
    int *ids, n;
} ref_run;

static int ref_start(ref_run *rr, const char *name, const char *text, int all_logits) {
    memset(rr, 0, sizeof *rr);
    if (!server_start(&rr->s, name, "--engine scalar --kv-cache-dtype f32 --prefill-chunk 3 --kv-block 4", NULL)) {
        T_CHECK(0, "server did not start");
        return 0;
    }
    T_CHECK(nv_model_load(model_path, &rr->m) == NV_OK && nv_model_build_plans(&rr->m, NV_ENGINE_SCALAR) == NV_OK, "%s",
            nv_errmsg());
    T_CHECK(nv_tokenizer_load_for_model(tok_path, rr->m.config.vocab_size, &rr->tok) == NV_OK &&
                nv_tokenizer_encode(rr->tok, text, 1, 0, &rr->ids, &rr->n) == NV_OK,
            "%s", nv_errmsg());
    T_CHECK(nv_state_init(&rr->st, &rr->m.config, rr->n, rr->m.config.seq_len, all_logits) == NV_OK &&
                nv_forward(&rr->m, &rr->st, rr->ids, rr->n, 0) == NV_OK,
            "%s", nv_errmsg());
    return 1;
}

static void ref_stop(ref_run *rr) {
    free(rr->ids);
    nv_state_free(&rr->st);
    nv_tokenizer_free(rr->tok);
    nv_model_free(&rr->m);
    T_CHECK(server_stop(&rr->s) == 0, "server did not exit 0 on SIGTERM");
}

/* Scalar engine, prompts split across steps (chunks of 3) and blocks of 4 positions: every
 * record is the model's own log-softmax of the prompt, bit for bit (nv_forward over the whole
 * prompt is the reference); the echoed text, the records and the generated tail agree whole and
 * streamed; a scored prompt never takes its blocks from the prefix cache, but leaves them there. */
static void test_prompt_logprobs(void) {
    ref_run rr;
    if (!ref_start(&rr, "prompt-logprobs", "Once upon a time there was a little girl named Lily", 1)) return;
    server s = rr.s;
    nv_tokenizer *tok = rr.tok;
    nv_model m = rr.m;
    nv_state st = rr.st;
    int *ids = rr.ids, n = rr.n;
    const int V = m.config.vocab_size;
    char list[1024] = "", body[1400];
    for (int i = 0; i < n; i++) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", i ? "," : "", ids[i]);

    /* max_tokens 0: the prompt alone */
    resp r;
    snprintf(body, sizeof body, "{\"prompt\":[%s],\"max_tokens\":0,\"echo\":true,\"logprobs\":3}", list);
    T_CHECK(http(s.port, "POST", "/v1/completions", NULL, body, &r) && r.status == 200, "prompt only: %d %s", r.status, r.body);
    cJSON *toks = cJSON_CreateArray(), *lps = cJSON_CreateArray(), *tops = cJSON_CreateArray();
    char text[4096], joined[4096] = "";
    completion_records(r.body, 0, toks, lps, tops, text, sizeof text);
    int ok = cJSON_GetArraySize(toks) == n && cJSON_GetArraySize(lps) == n && cJSON_GetArraySize(tops) == n &&
             cJSON_IsNull(cJSON_GetArrayItem(lps, 0)) && cJSON_IsNull(cJSON_GetArrayItem(tops, 0));
    for (int i = 1; ok && i < n; i++) {
        const cJSON *lp = cJSON_GetArrayItem(lps, i), *top = cJSON_GetArrayItem(tops, i), *alt;
        float want = ref_logprob(st.logits + (size_t)(i - 1) * V, V, ids[i]);
        ok &= cJSON_IsNumber(lp) && (float)lp->valuedouble == want;
        double best = -INFINITY;
        cJSON_ArrayForEach(alt, top) best = alt->valuedouble > best ? alt->valuedouble : best;
        ok &= cJSON_GetArraySize(top) >= 1 && cJSON_GetArraySize(top) <= 3 && best >= lp->valuedouble;
        if (!ok) fprintf(stderr, "    record %d: %s, want %.9g\n", i, cJSON_PrintUnformatted(lp), (double)want);
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, toks) strncat(joined, cJSON_GetStringValue(e), sizeof joined - strlen(joined) - 1);
    T_CHECK(ok, "prompt records are not the model's log-probabilities: %s", r.body);
    T_CHECK(!strcmp(joined, text) && strstr(r.body, "\"finish_reason\":\"length\"") &&
                strstr(r.body, "\"completion_tokens\":0") && cached_tokens(r.body) == 0,
            "prompt only: tokens '%s' text '%s' body %s", joined, text, r.body);
    char echo_text[4096];
    snprintf(echo_text, sizeof echo_text, "%s", text);
    cJSON *prompt_lps = lps;
    cJSON_Delete(toks), cJSON_Delete(tops);
    resp_free(&r);

    /* with a greedy tail, whole and streamed: the prompt's records, then the tail's */
    resp whole, streamed;
    char fmt[1400];
    snprintf(fmt, sizeof fmt, "{\"prompt\":[%s],\"max_tokens\":5,\"temperature\":0,\"echo\":true,\"logprobs\":3%%s}", list);
    T_CHECK(post_whole_and_streamed(s.port, "/v1/completions", fmt, ",\"stream\":true", &whole, &streamed), "echo+logprobs %d / %d",
            whole.status, streamed.status);
    cJSON *wt = cJSON_CreateArray(), *wl = cJSON_CreateArray(), *wtop = cJSON_CreateArray();
    cJSON *st_t = cJSON_CreateArray(), *st_l = cJSON_CreateArray(), *st_top = cJSON_CreateArray();
    char wtext[4096], stext[4096];
    completion_records(whole.body, 0, wt, wl, wtop, wtext, sizeof wtext);
    completion_records(streamed.body, 1, st_t, st_l, st_top, stext, sizeof stext);
    ok = cJSON_GetArraySize(wl) == n + 5 && !strncmp(wtext, echo_text, strlen(echo_text)) && strlen(wtext) > strlen(echo_text);
    for (int i = 0; ok && i < n; i++) ok &= cJSON_Compare(cJSON_GetArrayItem(wl, i), cJSON_GetArrayItem(prompt_lps, i), 1);
    T_CHECK(ok, "echo with a tail: %s", whole.body);
    T_CHECK(cJSON_Compare(wt, st_t, 1) && cJSON_Compare(wl, st_l, 1) && cJSON_Compare(wtop, st_top, 1) && !strcmp(wtext, stext),
            "streamed records or text differ from the whole response's:\n%s\n%s", whole.body, streamed.body);
    cJSON_Delete(wt), cJSON_Delete(wl), cJSON_Delete(wtop), cJSON_Delete(st_t), cJSON_Delete(st_l), cJSON_Delete(st_top);
    resp_free(&whole), resp_free(&streamed);

    /* the prefix cache: a plain request reuses the scored prompts' blocks; a scored one does not */
    snprintf(body, sizeof body, "{\"prompt\":[%s],\"max_tokens\":1}", list);
    T_CHECK(http(s.port, "POST", "/v1/completions", NULL, body, &r) && r.status == 200 && cached_tokens(r.body) > 0,
            "a plain request did not reuse the cached prompt: %s", r.body);
    resp_free(&r);
    snprintf(body, sizeof body, "{\"prompt\":[%s],\"max_tokens\":0,\"echo\":true,\"logprobs\":3}", list);
    T_CHECK(http(s.port, "POST", "/v1/completions", NULL, body, &r) && r.status == 200 && cached_tokens(r.body) == 0,
            "a scored prompt came from the cache: %s", r.body);
    toks = cJSON_CreateArray(), lps = cJSON_CreateArray(), tops = cJSON_CreateArray();
    completion_records(r.body, 0, toks, lps, tops, text, sizeof text);
    T_CHECK(cJSON_Compare(lps, prompt_lps, 1), "the same prompt scored twice differs");
    cJSON_Delete(toks), cJSON_Delete(lps), cJSON_Delete(tops), cJSON_Delete(prompt_lps);
    resp_free(&r);
    /* echo alone with max_tokens 0: the text, nothing generated */
    T_CHECK(http(s.port, "POST", "/v1/completions", NULL, "{\"prompt\":\"Once upon\",\"max_tokens\":0,\"echo\":true}", &r) &&
                r.status == 200 && strstr(r.body, "\"text\":\"Once upon\"") && strstr(r.body, "\"logprobs\":null"),
            "echo, max_tokens 0: %s", r.body);
    resp_free(&r);
    /* vLLM's prompt_logprobs, on completions (each choice's) and chat (the response's): null, then each
       token's log-probability and rank, with its alternatives (as many as it asks, whatever the answer's
       top_logprobs) */
    snprintf(body, sizeof body, "{\"prompt\":[%s],\"max_tokens\":3,\"temperature\":0,\"prompt_logprobs\":2}", list);
    T_CHECK(http(s.port, "POST", "/v1/completions", NULL, body, &r) && r.status == 200, "prompt_logprobs: %d %s", r.status, r.body);
    cJSON *root = cJSON_Parse(r.body);
    const cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0), *pl = cJSON_GetObjectItem(c0, "prompt_logprobs");
    ok = cJSON_GetArraySize(pl) == n && cJSON_IsNull(cJSON_GetArrayItem(pl, 0)) && cJSON_IsNull(cJSON_GetObjectItem(c0, "logprobs"));
    for (int i = 1; ok && i < n; i++) {
        const float *raw = st.logits + (size_t)(i - 1) * V;
        int rank = 1;
        for (int v = 0; v < V; v++) rank += raw[v] > raw[ids[i]];
        char id[16];
        snprintf(id, sizeof id, "%d", ids[i]);
        const cJSON *rec = cJSON_GetArrayItem(pl, i), *own = cJSON_GetObjectItem(rec, id);
        ok &= (float)cJSON_GetNumberValue(cJSON_GetObjectItem(own, "logprob")) == ref_logprob(raw, V, ids[i]) &&
              cJSON_GetNumberValue(cJSON_GetObjectItem(own, "rank")) == rank && cJSON_IsString(cJSON_GetObjectItem(own, "decoded_token")) &&
              cJSON_GetArraySize(rec) == (rank <= 2 ? 2 : 3) && rec->child == own; /* its own first, then the other likeliest */
        const cJSON *alt;
        cJSON_ArrayForEach(alt, rec) ok &= alt == own || cJSON_GetNumberValue(cJSON_GetObjectItem(alt, "rank")) <= 2;
        if (!ok) fprintf(stderr, "    prompt_logprobs[%d] = %s (rank %d)\n", i, cJSON_PrintUnformatted(rec), rank);
    }
    T_CHECK(ok, "prompt_logprobs are not the model's: %s", r.body);
    cJSON_Delete(root);
    resp_free(&r);
    T_CHECK(http(s.port, "POST", "/v1/chat/completions", NULL,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"max_tokens\":2,\"prompt_logprobs\":0,"
                 "\"logprobs\":true,\"top_logprobs\":3}",
                 &r) &&
                r.status == 200,
            "chat prompt_logprobs: %d %s", r.status, r.body);
    root = cJSON_Parse(r.body);
    pl = cJSON_GetObjectItem(root, "prompt_logprobs");
    const cJSON *usage = cJSON_GetObjectItem(root, "usage"),
                *content = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), 0), "logprobs"), "content");
    T_CHECK(cJSON_GetArraySize(pl) == (int)cJSON_GetNumberValue(cJSON_GetObjectItem(usage, "prompt_tokens")) &&
                cJSON_IsNull(cJSON_GetArrayItem(pl, 0)) && cJSON_GetArraySize(cJSON_GetArrayItem(pl, 1)) == 1 &&
                cJSON_GetArraySize(content) == 2,
            "chat: the response's prompt_logprobs, the answer's own logprobs: %s", r.body);
    cJSON_Delete(root);
    resp_free(&r);
    /* with echo and logprobs (the same records serve both), for two choices */
    snprintf(body, sizeof body, "{\"prompt\":[%s],\"max_tokens\":2,\"temperature\":0,\"prompt_logprobs\":1,\"echo\":true,\"logprobs\":1,\"n\":2}",
             list);
    T_CHECK(http(s.port, "POST", "/v1/completions", NULL, body, &r) && r.status == 200, "echo and prompt_logprobs: %d %s", r.status, r.body);
    root = cJSON_Parse(r.body);
    for (int c = 0; c < 2; c++) {
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(root, "choices"), c);
        T_CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(ch, "prompt_logprobs")) == n &&
                    cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetObjectItem(ch, "logprobs"), "token_logprobs")) == n + 2,
                "choice %d: %s", c, r.body);
    }
    cJSON_Delete(root);
    resp_free(&r);
    static const char *const pl_bad[][2] = {{"{\"prompt\":\"a\",\"prompt_logprobs\":21}", "prompt_logprobs"},
                                            {"{\"prompt\":\"a\",\"prompt_logprobs\":1,\"stream\":true}", "streaming"},
                                            {"{\"prompt\":\"a\",\"prompt_logprobs\":1,\"echo\":true,\"logprobs\":2}", "must equal"}};
    for (size_t i = 0; i < sizeof pl_bad / sizeof pl_bad[0]; i++) {
        T_CHECK(http(s.port, "POST", "/v1/completions", NULL, pl_bad[i][0], &r) && r.status == 400 && strstr(r.body, pl_bad[i][1]), "%s: %d %s",
                pl_bad[i][0], r.status, r.body);
        resp_free(&r);
    }
    T_CHECK(wait_pool_idle(s.port), "blocks still in use");
    (void)tok, (void)ids;
    ref_stop(&rr);
}

/* ---- a `nerve train` run folder as the model ------------------------------------------------- */

/* The embedding of resp's data[i] (float or base64) into v[dim]; 0 when absent or of another length. */
static int embedding_of(const char *body, int i, float *v, int dim) {
    cJSON *root = cJSON_Parse(body);
    const cJSON *e = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "data"), i), "embedding");
    int ok = 0;
    if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == dim) {
        int j = 0;
        for (const cJSON *x = e->child; x; x = x->next) v[j++] = (float)x->valuedouble;
        ok = 1;
    } else if (cJSON_IsString(e)) { /* base64 of the little-endian floats */
        static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        unsigned char bytes[4096];
        size_t nb = 0, len = strlen(e->valuestring);
        for (size_t k = 0; k + 3 < len + 0 && nb + 3 <= sizeof bytes; k += 4) {
            unsigned q[4];
            for (int t = 0; t < 4; t++) {
                const char *f = e->valuestring[k + t] == '=' ? NULL : strchr(a, e->valuestring[k + t]);
                q[t] = f ? (unsigned)(f - a) : 0;
            }
            unsigned w = q[0] << 18 | q[1] << 12 | q[2] << 6 | q[3];
            bytes[nb++] = (unsigned char)(w >> 16), bytes[nb++] = (unsigned char)(w >> 8), bytes[nb++] = (unsigned char)w;
        }
        if (len % 4 == 0 && len >= 4) nb -= (e->valuestring[len - 1] == '=') + (e->valuestring[len - 2] == '=');
        if (nb == (size_t)dim * 4) memcpy(v, bytes, nb), ok = 1;
    }
    cJSON_Delete(root);
    return ok;
}

/* /v1/embeddings on the scalar engine with fp32 pages and prompts split across steps: an input's
 * embedding is the mean of the final norm's output over its tokens, unit length, as the model
 * computes it alone (nv_forward over the whole prompt); lists (past one wave of 16) keep their
 * order and equal each input alone; token ids equal their text; base64 the same floats; the prefix
 * cache changes nothing; bad inputs are 400s. */
static void test_embeddings(void) {
    ref_run rr;
    if (!ref_start(&rr, "embeddings", "Once upon a time there was a little girl named Lily", 0)) return;
    server s = rr.s;
    const nv_model m = rr.m;
    const nv_state st = rr.st;
    const int *ids = rr.ids, n = rr.n;
    const int d = m.config.dim;
    double want[512] = {0}, norm = 0;
    float row[512], got[512], other[512];
    for (int t = 0; t < n; t++) {
        nv_rmsnorm(row, st.r.x + (size_t)t * d, m.w.rms_final, d, m.config.norm_eps);
        for (int j = 0; j < d; j++) want[j] += row[j] / n;
    }
    for (int j = 0; j < d; j++) norm += want[j] * want[j];
    norm = sqrt(norm);
    resp r;
    T_CHECK(http(s.port, "POST", "/v1/embeddings", NULL, "{\"input\":\"Once upon a time there was a little girl named Lily\"}", &r) &&
                r.status == 200 && embedding_of(r.body, 0, got, d),
            "%d %s", r.status, r.body);
    double worst = 0;
    for (int j = 0; j < d; j++) worst = fmax(worst, fabs(got[j] - want[j] / norm));
    T_CHECK(worst < 1e-6, "the embedding is %.3g from the model's own (nv_forward)", worst);
    cJSON *root = cJSON_Parse(r.body);
    const cJSON *u = cJSON_GetObjectItem(root, "usage");
    T_CHECK(!strcmp(cJSON_GetObjectItem(root, "object")->valuestring, "list") &&
                cJSON_GetObjectItem(u, "prompt_tokens")->valueint == n && cJSON_GetObjectItem(u, "total_tokens")->valueint == n &&
                !strcmp(cJSON_GetObjectItem(root, "model")->valuestring, "stories260K"),
            "shape: %s", r.body);
    cJSON_Delete(root);
    resp_free(&r);
    /* token ids and base64: the same floats */
    char list[1024] = "", body[8192];
    for (int i = 0; i < n; i++) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", i ? "," : "", ids[i]);
    snprintf(body, sizeof body, "{\"input\":[%s],\"encoding_format\":\"base64\",\"model\":\"stories260K\"}", list);
    T_CHECK(http(s.port, "POST", "/embeddings", NULL, body, &r) && r.status == 200 && embedding_of(r.body, 0, other, d) &&
                !memcmp(other, got, sizeof(float) * d),
            "token ids / base64 differ: %d %.300s", r.status, r.body);
    resp_free(&r);
    /* llama-server's native /embedding: [{"index", "embedding": [[...]]}], the same vectors; embd_normalize's norms */
    const char *native[] = {"{\"content\":\"Once upon a time there was a little girl named Lily\"}",
                            "{\"content\":\"Once upon a time there was a little girl named Lily\",\"embd_normalize\":1}",
                            "{\"input\":[\"Once upon a time there was a little girl named Lily\",\"A cat\"],\"embd_normalize\":0}",
                            "{\"content\":\"Once upon a time there was a little girl named Lily\",\"embd_normalize\":5}"};
    const int norms[] = {2, 1, 0, 5};
    for (int k = 0; k < 4; k++) {
        T_CHECK(http(s.port, "POST", "/embedding", NULL, native[k], &r) && r.status == 200, "/embedding %d: %d %.200s", k, r.status, r.body);
        cJSON *arr = r.body ? cJSON_Parse(r.body) : NULL;
        const cJSON *e0 = cJSON_GetArrayItem(arr, 0), *vec = cJSON_GetArrayItem(cJSON_GetObjectItem(e0, "embedding"), 0);
        T_CHECK(cJSON_IsArray(arr) && cJSON_GetArraySize(arr) == (k == 2 ? 2 : 1) && cJSON_GetObjectItem(e0, "index")->valueint == 0 &&
                    cJSON_GetArraySize(cJSON_GetObjectItem(e0, "embedding")) == 1 && cJSON_GetArraySize(vec) == d,
                "/embedding %d's shape: %.200s", k, r.body);
        double size = 0, top = 0, off = 0, ratio = 0, big = 0;
        for (int j = 0; j < d && cJSON_GetArraySize(vec) == d; j++) /* the ratio to /v1/embeddings' at its largest entry */
            if (fabs(got[j]) > big) big = fabs(got[j]), ratio = cJSON_GetArrayItem(vec, j)->valuedouble / got[j];
        for (int j = 0; j < d && cJSON_GetArraySize(vec) == d; j++) {
            const double x = cJSON_GetArrayItem(vec, j)->valuedouble;
            top = fmax(top, fabs(x));
            size += norms[k] == 0 ? 0 : pow(fabs(x), norms[k]);
            off = fmax(off, fabs(x - ratio * got[j]));
        }
        T_CHECK(off <= 1e-6 * top && (norms[k] != 2 || fabs(ratio - 1) < 1e-7), "/embedding %d is not /v1/embeddings' vector scaled (%.3g, ratio %g)",
                k, off, ratio);
        T_CHECK(norms[k] == 0 ? fabs(top - 32760) < 1e-3 : fabs(size - 1) < 1e-5, "/embedding with embd_normalize %d: max %g, sum %g", norms[k],
                top, size);
        if (k == 2) T_CHECK(cJSON_GetObjectItem(cJSON_GetArrayItem(arr, 1), "index")->valueint == 1, "the second's index");
        cJSON_Delete(arr);
        resp_free(&r);
    }
    const char *native_bad[][2] = {{"{}", "content"}, {"{\"content\":\"a\",\"embd_normalize\":-1}", "not supported"},
                                   {"{\"content\":\"a\",\"embd_normalize\":1.5}", "embd_normalize"}, {"{\"content\":\"\"}", "empty"},
                                   {"{\"content\":\"a\",\"model\":\"nope\"}", "does not exist"}};
    for (size_t i = 0; i < sizeof native_bad / sizeof native_bad[0]; i++) {
        T_CHECK(http(s.port, "POST", "/embedding", NULL, native_bad[i][0], &r) && r.status >= 400 && r.status < 500 &&
                    strstr(r.body, native_bad[i][1]),
                "/embedding %s: %d %s", native_bad[i][0], r.status, r.body);
        resp_free(&r);
    }
    /* twenty inputs (two waves), each equal to itself alone, in order */
    static const char *const texts[4] = {"Lily and Ben", "The dog ran to the park", "A cat", "Tom had a big red ball"};
    size_t len = (size_t)snprintf(body, sizeof body, "{\"input\":[");
    for (int i = 0; i < 20; i++) len += (size_t)snprintf(body + len, sizeof body - len, "%s\"%s\"", i ? "," : "", texts[i % 4]);
    snprintf(body + len, sizeof body - len, "]}");
    float alone[4][512];
    for (int k = 0; k < 4; k++) {
        char one[256];
        snprintf(one, sizeof one, "{\"input\":\"%s\"}", texts[k]);
        T_CHECK(http(s.port, "POST", "/v1/embeddings", NULL, one, &r) && r.status == 200 && embedding_of(r.body, 0, alone[k], d),
                "%s: %d", texts[k], r.status);
        resp_free(&r);
    }
    T_CHECK(http(s.port, "POST", "/v1/embeddings", NULL, body, &r) && r.status == 200, "list: %d %.200s", r.status, r.body);
    for (int i = 0; i < 20 && r.status == 200; i++)
        T_CHECK(embedding_of(r.body, i, other, d) && !memcmp(other, alone[i % 4], sizeof(float) * d), "input %d differs from alone", i);
    resp_free(&r);
    double dot = 0;
    for (int j = 0; j < d; j++) dot += alone[0][j] * alone[1][j];
    T_CHECK(dot < 0.9999, "two different texts have the same embedding (cosine %g)", dot);
    /* the prefix was cached by the requests above: still the model's own value */
    T_CHECK(http(s.port, "POST", "/v1/embeddings", NULL, "{\"input\":\"Once upon a time there was a little girl named Lily\"}", &r) &&
                r.status == 200 && embedding_of(r.body, 0, other, d) && !memcmp(other, got, sizeof(float) * d),
            "again: %d", r.status);
    resp_free(&r);
    static const char *const bad[][2] = {
        {"{}", "missing_required_parameter"},           {"{\"input\":\"\"}", NULL},
        {"{\"input\":[]}", NULL},                          {"{\"input\":[[]]}", NULL},
        {"{\"input\":[1,2,512]}", NULL},                   {"{\"input\":3}", NULL},
        {"{\"input\":\"a\",\"encoding_format\":\"hex\"}", NULL}, {"{\"input\":\"a\",\"dimensions\":8}", "unsupported_value"},
        {"[1]", "invalid_json"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        T_CHECK(http(s.port, "POST", "/v1/embeddings", NULL, bad[i][0], &r) && r.status == 400 &&
                    (!bad[i][1] || strstr(r.body, bad[i][1])),
                "%s: %d %s", bad[i][0], r.status, r.body);
        resp_free(&r);
    }
    char big[8192];
    len = (size_t)snprintf(big, sizeof big, "{\"input\":[");
    for (int i = 0; i < 600; i++) len += (size_t)snprintf(big + len, sizeof big - len, "%s5", i ? "," : "");
    snprintf(big + len, sizeof big - len, "]}");
    T_CHECK(http(s.port, "POST", "/v1/embeddings", NULL, big, &r) && r.status == 400 && strstr(r.body, "context_length_exceeded"),
            "600 tokens: %d %s", r.status, r.body);
    resp_free(&r);
    T_CHECK(http(s.port, "POST", "/v1/embeddings", NULL, "{\"input\":\"a\",\"model\":\"nope\"}", &r) && r.status == 404, "model: %d",
            r.status);
    resp_free(&r);
    T_CHECK(http(s.port, "GET", "/v1/embeddings", NULL, NULL, &r) && r.status == 405, "GET: %d", r.status);
    resp_free(&r);
    T_CHECK(wait_pool_idle(s.port), "blocks still in use after the requests ended");
    ref_stop(&rr);
}

static void test_run_folder(void) {
    const char *want_path = t_data("models/stories260K_greedy200.expected.txt");
    char *model = NULL, *tok = NULL, *want = NULL;
    size_t model_len = 0, tok_len = 0;
    if (!want_path || nv_file_read_all(model_path, &model, &model_len) != NV_OK ||
        nv_file_read_all(tok_path, &tok, &tok_len) != NV_OK || nv_file_read_all(want_path, &want, NULL) != NV_OK) {
        T_CHECK(0, "cannot read the shared model files");
        free(model), free(tok), free(want);
        return;
    }
    char dir[700];
    snprintf(dir, sizeof dir, "%s", t_path("my-run"));
    T_CHECK(mkdir(dir, 0755) == 0, "mkdir %s", dir);
    t_write("my-run/model.bin", model, model_len);
    t_write("my-run/tokenizer.bin", tok, tok_len);
    char slash[710];
    snprintf(slash, sizeof slash, "%s/", dir); /* the id is the folder's name, trailing slash or not */
    server s;
    if (!server_spawn(&s, "run-folder", NULL, NULL, slash, NULL, "--engine scalar", 30)) {
        T_CHECK(0, "server on a run folder did not start");
    } else {
        resp r;
        T_CHECK(http(s.port, "GET", "/v1/models", NULL, NULL, &r) && r.status == 200 && strstr(r.body, "\"id\":\"my-run\""),
                "models %d %s", r.status, r.body ? r.body : "");
        resp_free(&r);
        result c;
        complete(s.port, 0, NULL, "{\"model\":\"my-run\",\"prompt\":\"\",\"max_tokens\":40,\"temperature\":0}", &c);
        T_CHECK(c.status == 200 && c.text[0] && !strncmp(want, c.text, strlen(c.text)),
                "greedy from the run folder's model and tokenizer is not llama2.c's: %s", c.text);
        T_CHECK(server_stop(&s) == 0, "server did not exit 0 on SIGTERM");
    }
    free(model), free(tok), free(want);
}

/* ---- a tiny KV pool: queueing, 429, disconnects, SIGTERM with a request in flight ------------- */

/* Opens a stream and reads until the first generated text arrives; returns the socket. */
static int open_stream(int port, const char *body) {
    size_t len;
    char *req = build_request("POST", "/v1/completions", NULL, body, &len);
    int fd = connect_to(port);
    if (fd >= 0 && !send_all(fd, req, len)) {
        close(fd);
        fd = -1;
    }
    free(req);
    if (fd < 0) return -1;
    char buf[8192];
    size_t got = 0;
    while (got < sizeof buf - 1) {
        ssize_t k = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        if (k <= 0) break;
        got += (size_t)k;
        buf[got] = '\0';
        if (strstr(buf, "\"text\":\"") && !strstr(buf, "\"text\":\"\"")) return fd;
    }
    close(fd);
    return -1;
}

static void test_tiny_pool_queue_429_disconnect(void) {
    server s;
    /* stories260K: one block of 16 positions is 5 layers x 2 x 16 x 32 fp16 values = 10 KiB; 30K = 3 blocks */
    if (!server_start(&s, "tiny", "--kv-memory 30K --max-batch 1 --max-queue 1", "NERVE_TEST_STEP_DELAY_MS=80")) {
        T_CHECK(0, "server did not start");
        return;
    }
    int port = s.port;
    T_CHECK(metric(port, "nerve_kv_blocks_total") == 3, "pool of %g blocks", metric(port, "nerve_kv_blocks_total"));
    /* r1 takes the whole pool (5 + 40 - 1 positions = 3 blocks) */
    const char *long_req = "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0,\"stream\":true}";
    int fd1 = open_stream(port, long_req);
    T_CHECK(fd1 >= 0, "first stream did not start");
    /* r2 waits in the queue */
    job r2 = {port, 0, 0, 3, "Once", {0}};
    pthread_t th;
    pthread_create(&th, NULL, run_job, &r2);
    T_CHECK(wait_metric(port, "nerve_queue_depth", 1), "second request not queued");
    /* r3: queue and pool full -> 429 with Retry-After */
    resp r;
    T_CHECK(http(port, "POST", "/v1/completions", NULL, "{\"prompt\":\"Once\",\"max_tokens\":3}", &r) && r.status == 429 &&
                strcasestr(r.head, "Retry-After:") && error_body_ok(r.body, NULL, "rate_limit_exceeded", (char[200]){0}, 200),
            "third request: %d %s", r.status, r.body);
    resp_free(&r);
    /* a request that could never fit the pool is a 400, not a 429 */
    T_CHECK(http(port, "POST", "/v1/completions", NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":45}", &r) &&
                r.status == 400 && error_body_ok(r.body, "max_tokens", "context_length_exceeded", (char[200]){0}, 200),
            "oversized request: %d %s", r.status, r.body);
    resp_free(&r);
    /* r1's client goes away mid-stream: cancelled, its blocks return, r2 runs */
    double cancelled0 = metric(port, "nerve_sequences_finished_total{reason=\"cancelled\"}");
    if (fd1 >= 0) close(fd1);
    pthread_join(th, NULL);
    T_CHECK(r2.res.status == 200 && r2.res.completion_tokens == 3, "queued request: %d", r2.res.status);
    T_CHECK(wait_pool_idle(port), "blocks not free after the disconnect");
    T_CHECK(metric(port, "nerve_sequences_finished_total{reason=\"cancelled\"}") == cancelled0 + 1,
            "the disconnected stream was not cancelled");

    /* a non-streaming client that disconnects while waiting */
    size_t len;
    char *req = build_request("POST", "/v1/completions", NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":40}", &len);
    int fd = connect_to(port);
    T_CHECK(fd >= 0 && send_all(fd, req, len), "send");
    free(req);
    T_CHECK(wait_metric(port, "nerve_running_sequences", 1), "request did not start");
    if (fd >= 0) close(fd);
    T_CHECK(wait_pool_idle(port), "blocks not free after a non-streaming disconnect");
    T_CHECK(metric(port, "nerve_sequences_finished_total{reason=\"cancelled\"}") == cancelled0 + 2,
            "the disconnected request was not cancelled");

    /* SIGTERM while a stream runs: it finishes (grace), then exit 0 */
    job last = {port, 0, 1, 10, "Once upon a time", {0}};
    pthread_create(&th, NULL, run_job, &last);
    T_CHECK(wait_metric(port, "nerve_running_sequences", 1), "last request did not start");
    T_CHECK(server_stop(&s) == 0, "server did not exit 0 on SIGTERM");
    pthread_join(th, NULL);
    T_CHECK(last.res.status == 200 && last.res.done == 1 && last.res.completion_tokens == 0 && !strcmp(last.res.finish, "length"),
            "stream during shutdown: status %d done %d finish '%s'", last.res.status, last.res.done, last.res.finish);
}

/* llama-server's GET /slots: --max-batch slots, the running sequences first with their prompt, what
 * they were asked and how far they are, then the idle ones; ?fail_on_no_slot is a 503 while every
 * slot is taken (a load balancer's probe), a 200 otherwise. */
static void test_slots(void) {
    server s;
    if (!server_start(&s, "slots", "--max-batch 2", "NERVE_TEST_STEP_DELAY_MS=30")) {
        T_CHECK(0, "server did not start");
        return;
    }
    const int port = s.port;
    resp r;
    T_CHECK(http(port, "GET", "/slots", NULL, NULL, &r) && r.status == 200, "/slots: %d", r.status);
    cJSON *list = r.body ? cJSON_Parse(r.body) : NULL;
    T_CHECK(cJSON_GetArraySize(list) == 2 && !cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetArrayItem(list, 1), "is_processing")) &&
                cJSON_GetObjectItem(cJSON_GetArrayItem(list, 0), "id_task")->valueint == -1 &&
                cJSON_GetObjectItem(cJSON_GetArrayItem(list, 0), "n_ctx")->valueint == 512,
            "idle: %s", r.body);
    cJSON_Delete(list);
    resp_free(&r);
    const int fd1 = open_stream(port, "{\"prompt\":\"Once upon a time\",\"max_tokens\":60,\"temperature\":0.5,\"top_k\":7,\"seed\":42,\"stream\":true}");
    T_CHECK(fd1 >= 0, "the first request did not start");
    T_CHECK(http(port, "GET", "/slots?fail_on_no_slot=1", NULL, NULL, &r) && r.status == 200, "one slot free: %d", r.status);
    list = r.body ? cJSON_Parse(r.body) : NULL;
    const cJSON *s0 = cJSON_GetArrayItem(list, 0), *params = cJSON_GetObjectItem(s0, "params");
    const cJSON *next = cJSON_GetArrayItem(cJSON_GetObjectItem(s0, "next_token"), 0);
    const int decoded = next ? cJSON_GetObjectItem(next, "n_decoded")->valueint : -1;
    T_CHECK(cJSON_IsTrue(cJSON_GetObjectItem(s0, "is_processing")) && cJSON_GetObjectItem(s0, "id_task")->valueint >= 1 &&
                cJSON_GetObjectItem(s0, "n_prompt_tokens")->valueint == 5 && cJSON_GetObjectItem(params, "n_predict")->valueint == 60 &&
                cJSON_GetObjectItem(params, "top_k")->valueint == 7 && cJSON_GetObjectItem(params, "seed")->valueint == 42 &&
                fabs(cJSON_GetObjectItem(params, "temperature")->valuedouble - 0.5) < 1e-6 && decoded >= 1 && decoded < 60 &&
                cJSON_GetObjectItem(next, "n_remain")->valueint == 60 - decoded &&
                cJSON_GetObjectItem(s0, "n_past")->valueint == 5 + decoded &&
                !cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetArrayItem(list, 1), "is_processing")),
            "one running: %s", r.body);
    cJSON_Delete(list);
    resp_free(&r);
    const int fd2 = open_stream(port, "{\"prompt\":\"Lily\",\"max_tokens\":60,\"stream\":true}");
    T_CHECK(fd2 >= 0, "the second request did not start");
    T_CHECK(http(port, "GET", "/slots?fail_on_no_slot=1", NULL, NULL, &r) && r.status == 503 && strstr(r.body, "no slot available"),
            "every slot taken: %d %s", r.status, r.body);
    resp_free(&r);
    T_CHECK(http(port, "GET", "/slots", NULL, NULL, &r) && r.status == 200 && strstr(r.body, "\"n_prompt_tokens\":2,"), "two running: %s",
            r.body);
    resp_free(&r);
    if (fd1 >= 0) close(fd1);
    if (fd2 >= 0) close(fd2);
    T_CHECK(wait_metric(port, "nerve_running_sequences", 0), "the requests did not end");
    T_CHECK(http(port, "GET", "/slots?fail_on_no_slot=1", NULL, NULL, &r) && r.status == 200 && !strstr(r.body, "\"is_processing\":true"),
            "idle again: %s", r.body);
    resp_free(&r);
    T_CHECK(http(port, "POST", "/slots", NULL, "{}", &r) && r.status == 405, "POST /slots: %d", r.status);
    resp_free(&r);
    T_CHECK(server_stop(&s) == 0, "server did not exit 0");
}

/* A request run from a thread: its result, when it ended. */
typedef struct {
    int port;
    const char *body;
    result res;
    double t_done;
    char *choice; /* its choice as JSON (text, log-probabilities, finish), when the body is not streamed */
} req_job;

/* A completion's first choice as JSON (the caller frees it), or NULL. */
static char *choice_of(int port, const char *body) {
    resp r;
    char *out = NULL;
    if (http(port, "POST", "/v1/completions", NULL, body, &r) && r.status == 200) {
        cJSON *j = cJSON_Parse(r.body);
        out = cJSON_PrintUnformatted(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0));
        cJSON_Delete(j);
    }
    resp_free(&r);
    return out;
}

static void *run_req_job(void *arg) {
    req_job *j = arg;
    if (strstr(j->body, "\"logprobs\"")) j->choice = choice_of(j->port, j->body);
    else complete(j->port, 0, NULL, j->body, &j->res);
    j->t_done = now_s();
    return NULL;
}

/* --ctx-size (llama.cpp's -c, vLLM's --max-model-len): requests fill at most that many positions, as
 * the model's context would bound them; past the model's own context it is refused at start. */
static void test_ctx_size(void) {
    server s;
    if (!server_start(&s, "ctx-size", "--ctx-size 64", NULL)) {
        T_CHECK(0, "server did not start");
        return;
    }
    resp r;
    T_CHECK(http(s.port, "GET", "/v1/models", NULL, NULL, &r) && r.status == 200 && strstr(r.body, "\"max_model_len\":64"), "%s", r.body);
    resp_free(&r);
    T_CHECK(http(s.port, "GET", "/props", NULL, NULL, &r) && r.status == 200 && strstr(r.body, "\"n_ctx\":64"), "/props: %s", r.body);
    resp_free(&r);
    char body[1200] = "{\"prompt\":\"";
    for (int i = 0; i < 40; i++) strcat(body, "dog ");
    strcat(body, "\",\"max_tokens\":4}");
    result open_ended;
    T_CHECK(http(s.port, "POST", "/v1/completions", NULL, body, &r) && r.status == 400 && strstr(r.body, "context_length_exceeded") &&
                strstr(r.body, " 64 "),
            "a prompt past 64: %d %s", r.status, r.body);
    resp_free(&r);
    /* without max_tokens, a chat answer stops at the context's end */
    complete(s.port, 1, NULL, "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"ignore_eos\":true}", &open_ended);
    T_CHECK(open_ended.status == 200 && open_ended.prompt_tokens + open_ended.completion_tokens == 64, "%d + %d positions (status %d)",
            open_ended.prompt_tokens, open_ended.completion_tokens, open_ended.status);
    T_CHECK(server_stop(&s) == 0, "server did not exit 0");
    char args[2400];
    snprintf(args, sizeof args, "serve -m '%s' -z '%s' --port 0 --ctx-size 1000", model_path, tok_path);
    T_CHECK(t_nerve(args) == 1 && strstr(t_err, "--ctx-size 1000 is past the model's context of 512"), "--ctx-size 1000: %s", t_err);
}

/* llama-server's flags in scripts written for it: -ctk/-ctv (one type for both: q8_0 is q8), -np as
 * --max-batch, -t as --threads, -ngl accepted and ignored with a warning. */
static void test_llamacpp_flags(void) {
    server s;
    if (!server_start(&s, "lcpp-flags", "-ctk q8_0 -ctv q8_0 -np 3 -t 1 -ngl 99", NULL)) {
        T_CHECK(0, "server did not start");
        return;
    }
    char *log = read_log(&s);
    T_CHECK(strstr(log, "KV q8 ") && strstr(log, "max batch 3") && strstr(log, "-ngl 99: nerve runs on the CPU's engines; ignored"), "%s", log);
    free(log);
    T_CHECK(server_stop(&s) == 0, "server did not exit 0");
    char args[2400];
    snprintf(args, sizeof args, "serve -m '%s' -z '%s' --port 0 --cache-type-k f16 --cache-type-v q8_0", model_path, tok_path);
    T_CHECK(t_nerve(args) == 2 && strstr(t_err, "must be the same here (f16 and q8)"), "-ctk f16 -ctv q8_0: %s", t_err);
}

/* vLLM's request-side template: a chat request's chat_template, run for it alone where the server
 * trusts requests' templates (else a 400), and documents, the template's 'documents'. */
static void test_request_template(void) {
    server s;
    if (!server_start(&s, "req-template", "--trust-request-chat-template", NULL)) {
        T_CHECK(0, "server did not start");
        return;
    }
    resp r;
    T_CHECK(http(s.port, "POST", "/apply-template", NULL,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"chat_template\":\"{% for m in messages %}<<{{ m.content }}>>{% endfor %}\"}",
                 &r) &&
                r.status == 200 && strstr(r.body, "\"prompt\":\"<<hi>>\""),
            "the request's template: %d %s", r.status, r.body);
    resp_free(&r);
    T_CHECK(http(s.port, "POST", "/apply-template", NULL,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"documents\":[{\"title\":\"A\"},{\"title\":\"B\"}],"
                 "\"chat_template\":\"{% for d in documents %}[{{ d.title }}]{% endfor %}{{ messages[0].content }}\"}",
                 &r) &&
                r.status == 200 && strstr(r.body, "\"prompt\":\"[A][B]hi\""),
            "documents: %d %s", r.status, r.body);
    resp_free(&r);
    /* the chat answers from that prompt: its usage counts the template's tokens */
    result same, other;
    complete(s.port, 1, NULL,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"max_tokens\":4,\"temperature\":0,"
             "\"chat_template\":\"{{ bos_token }}{{ messages[0].content }}\"}",
             &same);
    complete(s.port, 0, NULL, "{\"prompt\":\"Once upon a time\",\"max_tokens\":4,\"temperature\":0}", &other);
    T_CHECK(same.status == 200 && other.status == 200 && !strcmp(same.text, other.text) && same.prompt_tokens == other.prompt_tokens,
            "a chat through a bare template: '%s' (%d) against '%s' (%d)", same.text, same.prompt_tokens, other.text, other.prompt_tokens);
    T_CHECK(http(s.port, "POST", "/v1/chat/completions", NULL,
                 "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"chat_template\":\"{% if %}\"}", &r) &&
                r.status == 400 && strstr(r.body, "chat_template") && strstr(r.body, "line 1"),
            "a template that does not parse: %d %s", r.status, r.body);
    resp_free(&r);
    T_CHECK(server_stop(&s) == 0, "server did not exit 0");
    if (!server_start(&s, "req-template-off", "", NULL)) {
        T_CHECK(0, "server did not start");
        return;
    }
    static const char *const refused[][2] = {
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"chat_template\":\"{{ 1 }}\"}", "--trust-request-chat-template"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"documents\":[{\"title\":\"A\"}]}", "run as Jinja"}};
    for (int k = 0; k < 2; k++) {
        T_CHECK(http(s.port, "POST", "/v1/chat/completions", NULL, refused[k][0], &r) && r.status == 400 && strstr(r.body, refused[k][1]),
                "%s: %d %s", refused[k][0], r.status, r.body);
        resp_free(&r);
    }
    T_CHECK(server_stop(&s) == 0, "server did not exit 0");
}

/* vLLM's priority: of two requests waiting for the only sequence, the one of lower priority value
 * runs first, whatever their order of arrival. */
static void test_priority_order(void) {
    server s;
    if (!server_start(&s, "priority", "--kv-memory 30K --max-batch 1 --max-queue 4 --scheduling-policy priority", "NERVE_TEST_STEP_DELAY_MS=40")) {
        T_CHECK(0, "server did not start");
        return;
    }
    const int port = s.port;
    /* (the first outranks them all: none preempts it) */
    const int fd1 = open_stream(port, "{\"prompt\":\"Once upon a time\",\"max_tokens\":20,\"temperature\":0,\"stream\":true,\"priority\":-10}");
    T_CHECK(fd1 >= 0 && wait_metric(port, "nerve_running_sequences", 1), "the first request did not start");
    static const char *p0 = "{\"prompt\":\"Once\",\"max_tokens\":3,\"temperature\":0,\"priority\":0}",
                      *p5 = "{\"prompt\":\"Once\",\"max_tokens\":3,\"temperature\":0,\"priority\":-5}";
    req_job later = {.port = port, .body = p0}, sooner = {.port = port, .body = p5}, last = {.port = port, .body = p0};
    pthread_t t_later, t_sooner, t_last;
    pthread_create(&t_later, NULL, run_req_job, &later);
    T_CHECK(wait_metric(port, "nerve_queue_depth", 1), "the second request is not queued");
    pthread_create(&t_sooner, NULL, run_req_job, &sooner);
    T_CHECK(wait_metric(port, "nerve_queue_depth", 2), "the third request is not queued");
    pthread_create(&t_last, NULL, run_req_job, &last);
    T_CHECK(wait_metric(port, "nerve_queue_depth", 3), "the fourth request is not queued");
    if (fd1 >= 0) close(fd1); /* the first goes: the queue runs */
    pthread_join(t_later, NULL);
    pthread_join(t_sooner, NULL);
    pthread_join(t_last, NULL);
    T_CHECK(later.res.status == 200 && sooner.res.status == 200 && sooner.t_done < later.t_done,
            "priority -5 (arrived second) done at %.3f, priority 0 at %.3f", sooner.t_done, later.t_done);
    T_CHECK(last.res.status == 200 && later.t_done < last.t_done, "equal priorities out of their order: %.3f, %.3f", later.t_done,
            last.t_done);
    /* truncate_prompt_tokens -1: a prompt past this pool's 48 positions keeps what it holds */
    char body[1200] = "{\"prompt\":\"";
    for (int i = 0; i < 60; i++) strcat(body, "dog ");
    strcat(body, "\",\"max_tokens\":1,\"truncate_prompt_tokens\":-1}");
    result cut;
    complete(port, 0, NULL, body, &cut);
    T_CHECK(cut.status == 200 && cut.prompt_tokens == 48, "truncate_prompt_tokens -1: %d, %d prompt tokens", cut.status, cut.prompt_tokens);
    T_CHECK(server_stop(&s) == 0, "server did not exit 0");
}

/* Preemption: a request that outranks a running one and finds no room (no sequence free, or not
 * enough KV blocks) sends it back to the queue; it goes on once the other has finished and its
 * answer is the one it gives alone (greedy or seeded), its positions computed again. */
/* Starts low, then (once it has run `after_ms`) high beside it; 0 when low did not start. */
static int preempt_start(int port, req_job *low, req_job *high, int after_ms, pthread_t *tl, pthread_t *th) {
    low->port = high->port = port;
    pthread_create(tl, NULL, run_req_job, low);
    int ok = wait_metric(port, "nerve_running_sequences", 1);
    sleep_ms(after_ms);
    pthread_create(th, NULL, run_req_job, high);
    return ok;
}

/* Runs low, then high beside it (preempt_start); 1 when high finished first. */
static int preempt_pair(int port, req_job *low, req_job *high, int after_ms) {
    pthread_t tl, th;
    int ok = preempt_start(port, low, high, after_ms, &tl, &th);
    pthread_join(th, NULL);
    pthread_join(tl, NULL);
    return ok && high->res.status == 200 && low->res.status == 200 && high->t_done < low->t_done;
}

static void test_preemption(void) {
    /* the only sequence taken: a lower priority value preempts it (its blocks stay cached, so most of its
       positions are found again) */
    static const char *greedy = "{\"prompt\":\"Once upon a time\",\"max_tokens\":120,\"temperature\":0,\"ignore_eos\":true,\"priority\":3}",
                      *seeded = "{\"prompt\":\"Once upon a time\",\"max_tokens\":120,\"temperature\":1,\"seed\":7,\"ignore_eos\":true,"
                                "\"stream\":true,\"priority\":3}",
                      *urgent = "{\"prompt\":\"The dog\",\"max_tokens\":4,\"temperature\":0,\"priority\":-1}",
                      *fits = "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0,\"ignore_eos\":true,\"priority\":3}",
                      *equal = "{\"prompt\":\"The dog\",\"max_tokens\":4,\"temperature\":0,\"priority\":3}";
    server s;
    if (!server_start(&s, "preempt", "--max-batch 1 --scheduling-policy priority", "NERVE_TEST_STEP_DELAY_MS=15")) {
        T_CHECK(0, "server did not start");
        return;
    }
    int port = s.port;
    result alone_greedy, alone_seeded;
    complete(port, 0, NULL, greedy, &alone_greedy);
    complete(port, 0, NULL, seeded, &alone_seeded);
    T_CHECK(alone_greedy.status == 200 && alone_seeded.status == 200 && alone_greedy.completion_tokens == 120,
            "alone: %d %d", alone_greedy.status, alone_seeded.status);
    const char *low_bodies[2] = {greedy, seeded};
    const result *alone[2] = {&alone_greedy, &alone_seeded};
    for (int k = 0; k < 2; k++) {
        req_job low = {.body = low_bodies[k]}, high = {.body = urgent};
        T_CHECK(preempt_pair(port, &low, &high, 400), "%s: priority -1 was not done first", k ? "seeded" : "greedy");
        T_CHECK(!strcmp(low.res.text, alone[k]->text) && low.res.completion_tokens == alone[k]->completion_tokens,
                "%s: the preempted answer differs from its own alone:\n    %s\n    %s", k ? "seeded" : "greedy", low.res.text,
                alone[k]->text);
        T_CHECK(metric(port, "nerve_preemptions_total") == k + 1, "%g preemptions", metric(port, "nerve_preemptions_total"));
    }
    /* an equal priority waits its turn */
    req_job low = {.body = greedy}, same = {.body = equal};
    T_CHECK(!preempt_pair(port, &low, &same, 400) && same.res.status == 200 && same.t_done > low.t_done &&
                !strcmp(low.res.text, alone_greedy.text),
            "an equal priority went first (%d, %d)", low.res.status, same.res.status);
    T_CHECK(metric(port, "nerve_preemptions_total") == 2, "an equal priority preempted");
    T_CHECK(wait_metric(port, "nerve_kv_blocks_in_use", 0), "blocks still in use");
    /* SIGTERM while the preempted one waits: it was running, so it finishes with the one that preempted it
       (within the 5 s a drain gives: some 60 steps of 15 ms in all) */
    result alone_short;
    complete(port, 0, NULL, fits, &alone_short);
    req_job low4 = {.body = fits}, high4 = {.body = "{\"prompt\":\"The dog\",\"max_tokens\":20,\"priority\":-1}"};
    pthread_t tl, th;
    T_CHECK(preempt_start(port, &low4, &high4, 200, &tl, &th) && wait_metric(port, "nerve_preemptions_total", 3),
            "no preemption before the SIGTERM");
    T_CHECK(server_stop(&s) == 0, "server did not exit 0");
    pthread_join(th, NULL);
    pthread_join(tl, NULL);
    T_CHECK(high4.res.status == 200 && low4.res.status == 200 && alone_short.status == 200 && !strcmp(low4.res.text, alone_short.text),
            "drained: %d, %d '%s'", high4.res.status, low4.res.status, low4.res.text);

    /* two sequences free but KV room for one (3 blocks of 16 positions): the room is made, the preempted
       one's blocks are taken by the other, and it computes them all again */
    /* (prompt rows one a step: a chunk of its recomputed positions ends where its prompt does) */
    if (!server_start(&s, "preempt-kv", "--kv-memory 30K --max-batch 2 --max-queue 1 --prefill-chunk 1 --scheduling-policy priority",
                      "NERVE_TEST_STEP_DELAY_MS=15")) {
        T_CHECK(0, "server did not start");
        return;
    }
    port = s.port;
    static const char *big = "{\"prompt\":\"The dog\",\"max_tokens\":30,\"temperature\":0,\"priority\":-1}";
    result ref;
    complete(port, 0, NULL, fits, &ref);
    req_job low2 = {.body = fits}, high2 = {.body = big};
    pthread_t t_low2, t_high2;
    T_CHECK(preempt_start(port, &low2, &high2, 150, &t_low2, &t_high2) && wait_metric(port, "nerve_preemptions_total", 1),
            "the KV room was not made");
    /* the preempted one waits, but was running: it does not take the queue's one place (--max-queue 1) */
    result third;
    complete(port, 0, NULL, "{\"prompt\":\"A cat\",\"max_tokens\":2,\"priority\":5}", &third);
    T_CHECK(third.status == 200, "a request beside a preempted one: %d", third.status);
    pthread_join(t_high2, NULL);
    pthread_join(t_low2, NULL);
    T_CHECK(high2.res.status == 200 && low2.res.status == 200 && high2.t_done < low2.t_done, "the KV room was not made");
    T_CHECK(ref.status == 200 && !strcmp(low2.res.text, ref.text) && low2.res.completion_tokens == 40,
            "after its blocks went: '%s' against '%s'", low2.res.text, ref.text);
    T_CHECK(metric(port, "nerve_preemptions_total") == 1, "%g preemptions", metric(port, "nerve_preemptions_total"));
    T_CHECK(wait_metric(port, "nerve_kv_blocks_in_use", 0), "blocks still in use");
    T_CHECK(server_stop(&s) == 0, "server did not exit 0");

    /* room that only preempting two sequences makes, one block of it shared by the two (their common
       prompt's): 6 blocks of 16 positions, two running ones of 2 blocks each, sharing their first; one
       that needs all 6 preempts both */
    if (!server_start(&s, "preempt-shared", "--kv-memory 60K --max-batch 3 --scheduling-policy priority", "NERVE_TEST_STEP_DELAY_MS=60")) {
        T_CHECK(0, "server did not start");
        return;
    }
    static const char *twin = "{\"prompt\":\"Once upon a time, there was a little girl named Lily. She loved to play\",\"max_tokens\":10,"
                              "\"temperature\":0,\"ignore_eos\":true,\"priority\":3}",
                      *whole = "{\"prompt\":\"The dog\",\"max_tokens\":93,\"temperature\":0,\"ignore_eos\":true,\"priority\":-1}";
    T_CHECK(metric(s.port, "nerve_kv_blocks_total") == 6, "%g blocks", metric(s.port, "nerve_kv_blocks_total"));
    result twin_alone;
    complete(s.port, 0, NULL, twin, &twin_alone);
    T_CHECK(wait_metric(s.port, "nerve_kv_blocks_in_use", 0), "blocks in use");
    {
        /* (the first's blocks stay idle in the cache from the run alone: the two share them) */
        req_job t1 = {.port = s.port, .body = twin}, t2 = {.port = s.port, .body = twin}, big = {.port = s.port, .body = whole};
        pthread_t a, b, c;
        pthread_create(&a, NULL, run_req_job, &t1);
        T_CHECK(wait_metric(s.port, "nerve_running_sequences", 1), "the first did not start");
        pthread_create(&b, NULL, run_req_job, &t2);
        T_CHECK(wait_metric(s.port, "nerve_running_sequences", 2), "the second did not start");
        sleep_ms(60);
        pthread_create(&c, NULL, run_req_job, &big);
        pthread_join(c, NULL);
        pthread_join(a, NULL);
        pthread_join(b, NULL);
        T_CHECK(big.res.status == 200 && big.res.completion_tokens == 93 && big.t_done < t1.t_done && big.t_done < t2.t_done,
                "the one needing the whole pool: %d, %d tokens", big.res.status, big.res.completion_tokens);
        T_CHECK(!strcmp(t1.res.text, twin_alone.text) && !strcmp(t2.res.text, twin_alone.text), "the twins' answers changed");
        T_CHECK(metric(s.port, "nerve_preemptions_total") == 2, "%g preemptions", metric(s.port, "nerve_preemptions_total"));
    }
    T_CHECK(server_stop(&s) == 0, "server did not exit 0");

    /* --no-preemption: the running one finishes first */
    if (!server_start(&s, "no-preempt", "--max-batch 1 --scheduling-policy priority --no-preemption", "NERVE_TEST_STEP_DELAY_MS=15")) {
        T_CHECK(0, "server did not start");
        return;
    }
    req_job low3 = {.body = greedy}, high3 = {.body = urgent};
    T_CHECK(!preempt_pair(s.port, &low3, &high3, 400) && high3.res.status == 200 && high3.t_done > low3.t_done,
            "--no-preemption: the running request was overtaken");
    T_CHECK(metric(s.port, "nerve_preemptions_total") == 0, "--no-preemption preempted");
    T_CHECK(server_stop(&s) == 0, "server did not exit 0");
}

/* --kv-overcommit: two requests whose prompt and max_tokens each take the whole pool (3 blocks) run
 * at once, each holding only what it has written; when the pool runs short the later one goes back
 * to the queue (one echoing its prompt with log-probabilities too), and both answers are the ones
 * they give alone. */
static void test_kv_overcommit(void) {
    server s;
    /* (with drafts: a decode row's drafts take only the room the pool has without preempting) */
    if (!server_start(&s, "overcommit", "--kv-memory 30K --max-batch 2 --kv-overcommit --scheduling-policy priority --spec-tokens 4",
                      "NERVE_TEST_STEP_DELAY_MS=40")) {
        T_CHECK(0, "server did not start");
        return;
    }
    static const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0,\"ignore_eos\":true}",
                      *seeded = "{\"prompt\":\"Lily and Ben\",\"max_tokens\":40,\"temperature\":1,\"seed\":3,\"ignore_eos\":true,"
                                "\"echo\":true,\"logprobs\":1}"; /* (its prompt's log-probabilities computed once) */
    result alone;
    complete(s.port, 0, NULL, body, &alone);
    char *alone_choice = choice_of(s.port, seeded);
    req_job first = {.body = body}, second = {.body = seeded};
    pthread_t t1, t2;
    T_CHECK(preempt_start(s.port, &first, &second, 30, &t1, &t2) && wait_metric(s.port, "nerve_running_sequences", 2),
            "the two did not run at once");
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    T_CHECK(alone.status == 200 && first.res.status == 200 && first.res.completion_tokens == 40 && !strcmp(first.res.text, alone.text),
            "the first: %d, %d tokens, '%s' against '%s'", first.res.status, first.res.completion_tokens, first.res.text, alone.text);
    /* the preempted one: its text, its prompt's log-probabilities and its answer's, as alone */
    T_CHECK(alone_choice && second.choice && !strcmp(second.choice, alone_choice), "the second:\n    %s\n    %s",
            second.choice ? second.choice : "(failed)", alone_choice ? alone_choice : "(failed)");
    free(alone_choice);
    free(second.choice);
    T_CHECK(metric(s.port, "nerve_preemptions_total") >= 1 && first.t_done < second.t_done,
            "the pool never ran short (%g preemptions), or the later one went on", metric(s.port, "nerve_preemptions_total"));
    T_CHECK(wait_metric(s.port, "nerve_kv_blocks_in_use", 0) && metric(s.port, "nerve_kv_blocks_reserved") == 0, "blocks still held");
    /* a higher priority whose prompt needs the whole pool while a lower one holds two blocks of it: the
       lower one's block of headroom counts as room its preemption makes */
    const double before = metric(s.port, "nerve_preemptions_total");
    req_job low = {.body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0,\"ignore_eos\":true,\"priority\":3}"},
                high = {.body = "{\"prompt\":\"Once upon a time, there was a little girl named Lily. She loved to play. Once upon a time, "
                                "there was a little girl named Lily. She loved to play\",\"max_tokens\":4,\"priority\":-1}"};
    T_CHECK(preempt_pair(s.port, &low, &high, 700) && !strcmp(low.res.text, alone.text) &&
                metric(s.port, "nerve_preemptions_total") == before + 1,
            "the whole pool's prompt waited (%g preemptions)", metric(s.port, "nerve_preemptions_total") - before);
    T_CHECK(server_stop(&s) == 0, "server did not exit 0");

    /* the earlier sequence needs a block while a later one, still prefilling its 40-token prompt a row a
       step, holds the rest of the pool (5 blocks): the later one goes back, the earlier goes on */
    /* (no SSD tier: the prompt's blocks from the case above are not found there) */
    if (!server_start(&s, "overcommit-lower", "--kv-memory 50K --max-batch 2 --kv-overcommit --prefill-chunk 1 --kv-disk-cache 0",
                      "NERVE_TEST_STEP_DELAY_MS=40")) {
        T_CHECK(0, "server did not start");
        return;
    }
    static const char *prefilling = "{\"prompt\":\"Once upon a time, there was a little girl named Lily. She loved to play. Once upon a "
                                    "time, there was a little girl named Lily. She loved to play\",\"max_tokens\":4,\"temperature\":0}";
    req_job earlier = {.body = body}, later = {.body = prefilling};
    pthread_t te, tl;
    T_CHECK(preempt_start(s.port, &earlier, &later, 30, &te, &tl), "the earlier did not start");
    pthread_join(te, NULL);
    pthread_join(tl, NULL);
    result alone_long; /* (afterwards: run first, its prompt's blocks would be in the cache) */
    complete(s.port, 0, NULL, prefilling, &alone_long);
    T_CHECK(earlier.res.status == 200 && !strcmp(earlier.res.text, alone.text) && later.res.status == 200 &&
                !strcmp(later.res.text, alone_long.text) && earlier.t_done < later.t_done && metric(s.port, "nerve_preemptions_total") == 1,
            "the earlier one waited for the later (%g preemptions)", metric(s.port, "nerve_preemptions_total"));
    T_CHECK(server_stop(&s) == 0, "server did not exit 0");
}

/* The JSON of file name in dir (NULL when it cannot be read or parsed; the caller deletes it). */
static cJSON *json_in(const char *dir, const char *name) {
    char path[800], *text = NULL;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cJSON *j = nv_file_read_all(path, &text, NULL) == NV_OK ? cJSON_Parse(text) : NULL;
    free(text);
    return j;
}

/* Writes j as the test's file name, and deletes it. */
static void json_put(const char *name, cJSON *j) {
    char *text = cJSON_Print(j);
    if (text) t_write(name, text, strlen(text));
    free(text);
    cJSON_Delete(j);
}

/* The final norm's output of rows [0, n) of ids run through m (scalar engine), into rows [n][dim]. */
static void final_rows(const nv_model *m, const int *ids, int n, float *rows) {
    nv_state st;
    const int d = m->config.dim;
    T_CHECK(nv_state_init(&st, &m->config, n, m->config.seq_len, 0) == NV_OK && nv_forward(m, &st, ids, n, 0) == NV_OK, "%s", nv_errmsg());
    for (int t = 0; t < n; t++) nv_rmsnorm(rows + (size_t)t * d, st.r.x + (size_t)t * d, m->w.rms_final, d, m->config.norm_eps);
    nv_state_free(&st);
}

/* A server's /v1/embeddings vector of text is row `row` of rows made unit length (within 1e-5), with
 * `tokens` prompt tokens; name says which. */
static void check_pooled(const char *name, const char *model, const char *flags, const char *text, const float *rows, int row,
                         int tokens, int dim) {
    server s;
    if (!server_spawn(&s, name, NULL, NULL, model, NULL, flags, 30)) {
        T_CHECK(0, "%s: the server did not start", name);
        return;
    }
    char body[512];
    snprintf(body, sizeof body, "{\"input\":\"%s\"}", text);
    resp r;
    float got[512];
    T_CHECK(http(s.port, "POST", "/v1/embeddings", NULL, body, &r) && r.status == 200 && embedding_of(r.body, 0, got, dim), "%s: %d %s",
            name, r.status, r.body);
    const char *pt = r.body ? strstr(r.body, "\"prompt_tokens\":") : NULL;
    T_CHECK(pt && atoi(pt + 16) == tokens, "%s: %s prompt tokens, not %d", name, pt ? pt + 16 : "no", tokens);
    resp_free(&r);
    double norm = 0, worst = 0;
    for (int j = 0; j < dim; j++) norm += (double)rows[(size_t)row * dim + j] * rows[(size_t)row * dim + j];
    for (int j = 0; j < dim; j++) worst = fmax(worst, fabs(got[j] - rows[(size_t)row * dim + j] / sqrt(norm)));
    T_CHECK(worst < 1e-5, "%s: the embedding is %.3g from row %d of the model's own", name, worst, row);
    char *log = read_log(&s);
    if (row > 0 && !strstr(flags, "--pooling")) T_CHECK(strstr(log, "embeddings pool the last token (the model's pooling type)"), "%s: %s", name, log);
    free(log);
    T_CHECK(server_stop(&s) == 0, "%s: the server did not exit 0", name);
}

/* Pooling other than the mean: --pooling cls takes the first row, last the last (a decoder embedding
 * model's: Qwen3-Embedding's); a GGUF's pooling_type says so itself, and so does a sentence-
 * transformers folder's 1_Pooling, which `nerve export` writes and reads back; a vocabulary whose
 * tokenizer ends an input with EOS (add_eos_token) has it appended to embeddings' inputs, and keeps
 * it through both formats. Max pooling is refused at load. */
static void test_embedding_pooling(void) {
    static const char *text = "Once upon a time there was a little girl named Lily";
    nv_model m;
    nv_tokenizer *tok = NULL;
    int *ids = NULL, n = 0;
    if (nv_model_load(model_path, &m) != NV_OK || nv_model_build_plans(&m, NV_ENGINE_SCALAR) != NV_OK ||
        nv_tokenizer_load_for_model(tok_path, m.config.vocab_size, &tok) != NV_OK || nv_tokenizer_encode(tok, text, 1, 0, &ids, &n) != NV_OK) {
        T_CHECK(0, "%s", nv_errmsg());
        return;
    }
    const int d = m.config.dim;
    int *with_eos = malloc((size_t)(n + 1) * sizeof *with_eos);
    float *rows = malloc((size_t)(n + 1) * d * sizeof *rows), *rows_eos = malloc((size_t)(n + 1) * d * sizeof *rows_eos);
    memcpy(with_eos, ids, (size_t)n * sizeof *ids);
    with_eos[n] = nv_tokenizer_eos(tok);
    final_rows(&m, ids, n, rows);
    final_rows(&m, with_eos, n + 1, rows_eos);
    char flags[1200];
    const char *exact = "--engine scalar --kv-cache-dtype f32 --prefill-chunk 3 --kv-block 4 --kv-disk-cache 0";
    for (int k = 0; k < 2; k++) { /* (the llama2.c file with its tokenizer) */
        snprintf(flags, sizeof flags, "%s -z '%s' --pooling %s", exact, tok_path, k ? "last" : "cls");
        check_pooled(k ? "pool-last" : "pool-cls", model_path, flags, text, rows, k ? n - 1 : 0, n, d);
    }
    /* the file says it: a GGUF's pooling_type, then the Hugging Face folder exported from it */
    char gguf[700], dir[700], gguf2[700], args[2200];
    snprintf(gguf, sizeof gguf, "%s", t_path("pool.gguf"));
    snprintf(dir, sizeof dir, "%s", t_path("pool-hf"));
    snprintf(gguf2, sizeof gguf2, "%s", t_path("pool2.gguf"));
    m.pooling = NV_POOLING_LAST;
    T_CHECK(nv_gguf_save(&m, tok, "pool", gguf, NV_GGUF_F32, NULL, NULL) == NV_OK, "%s", nv_errmsg());
    check_pooled("pool-gguf", gguf, exact, text, rows, n - 1, n, d);
    snprintf(args, sizeof args, "export '%s' -o '%s/'", gguf, dir);
    T_CHECK(t_nerve(args) == 0, "export to a folder: %s", t_err);
    cJSON *j = json_in(dir, "1_Pooling/config.json");
    T_CHECK(cJSON_IsTrue(cJSON_GetObjectItem(j, "pooling_mode_lasttoken")) && cJSON_IsFalse(cJSON_GetObjectItem(j, "pooling_mode_mean_tokens")),
            "1_Pooling/config.json");
    cJSON_Delete(j);
    check_pooled("pool-hf", dir, exact, text, rows, n - 1, n, d);
    /* the tokenizer adds EOS: its config says so (the template stays BOS's), then the GGUF made of it */
    j = json_in(dir, "tokenizer_config.json");
    T_CHECK(cJSON_IsFalse(cJSON_GetObjectItem(j, "add_eos_token")), "tokenizer_config.json's add_eos_token");
    cJSON_ReplaceItemInObject(j, "add_eos_token", cJSON_CreateTrue());
    json_put("pool-hf/tokenizer_config.json", j);
    check_pooled("pool-hf-eos", dir, exact, text, rows_eos, n, n + 1, d);
    snprintf(args, sizeof args, "export '%s/' -o '%s'", dir, gguf2);
    T_CHECK(t_nerve(args) == 0, "export to GGUF: %s", t_err);
    check_pooled("pool-gguf-eos", gguf2, exact, text, rows_eos, n, n + 1, d);
    /* or its tokenizer.json's template puts EOS after a text (Qwen3-Embedding's way), the config silent */
    j = json_in(dir, "tokenizer.json");
    cJSON *single = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "post_processor"), "single");
    T_CHECK(cJSON_GetArraySize(single) == 2, "the template's parts: %d", cJSON_GetArraySize(single));
    cJSON_AddItemToArray(single, cJSON_Parse("{\"SpecialToken\": {\"id\": \"</s>\", \"type_id\": 0}}"));
    json_put("pool-hf/tokenizer.json", j);
    j = json_in(dir, "tokenizer_config.json");
    cJSON_DeleteItemFromObject(j, "add_eos_token");
    json_put("pool-hf/tokenizer_config.json", j);
    check_pooled("pool-hf-template", dir, exact, text, rows_eos, n, n + 1, d);
    j = json_in(dir, "tokenizer_config.json"); /* the config's word wins over the template's */
    cJSON_AddFalseToObject(j, "add_eos_token");
    json_put("pool-hf/tokenizer_config.json", j);
    check_pooled("pool-hf-config-false", dir, exact, text, rows, n - 1, n, d);
    /* max pooling: refused */
    static const char max_cfg[] = "{\"word_embedding_dimension\": 64, \"pooling_mode_max_tokens\": true}";
    t_write("pool-hf/1_Pooling/config.json", max_cfg, strlen(max_cfg));
    snprintf(args, sizeof args, "generate -m '%s/' -n 1", dir);
    T_CHECK(t_nerve(args) == 1 && strstr(t_err, "pooling_mode_max_tokens"), "max pooling: %s", t_err);
    free(rows), free(rows_eos), free(ids), free(with_eos);
    nv_tokenizer_free(tok);
    nv_model_free(&m);
}

/* The length of the embedding list data[0] of body holds (-1: none), its floats in v. */
static int embedding_len(const char *body, float *v, int cap) {
    cJSON *root = cJSON_Parse(body);
    const cJSON *e = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "data"), 0), "embedding");
    int n = cJSON_IsArray(e) ? cJSON_GetArraySize(e) : -1;
    for (int j = 0; j < n && j < cap; j++) v[j] = (float)cJSON_GetArrayItem(e, j)->valuedouble;
    cJSON_Delete(root);
    return n;
}

/* Matryoshka embeddings: with --matryoshka (or a folder whose config.json says is_matryoshka) a
 * request's 'dimensions' cuts each vector to its first N values made unit length again, as OpenAI's
 * text-embedding-3 models do; another model's vectors are whole ('dimensions' its width or a 400). */
static void test_matryoshka(void) {
    static const char *whole = "{\"input\":\"Once upon a time\"}", *cut = "{\"input\":\"Once upon a time\",\"dimensions\":16}";
    server s;
    if (!server_start(&s, "mrl", "--matryoshka", NULL)) {
        T_CHECK(0, "server did not start");
        return;
    }
    resp r;
    float full[64], part[64];
    T_CHECK(http(s.port, "POST", "/v1/embeddings", NULL, whole, &r) && r.status == 200 && embedding_len(r.body, full, 64) == 64, "%s", r.body);
    resp_free(&r);
    T_CHECK(http(s.port, "POST", "/v1/embeddings", NULL, cut, &r) && r.status == 200 && embedding_len(r.body, part, 64) == 16, "%s", r.body);
    resp_free(&r);
    double norm = 0, worst = 0;
    for (int j = 0; j < 16; j++) norm += (double)full[j] * full[j];
    for (int j = 0; j < 16; j++) worst = fmax(worst, fabs(part[j] - full[j] / sqrt(norm)));
    T_CHECK(worst < 1e-6, "the cut vector is %.3g from the whole one's first 16 made unit length", worst);
    T_CHECK(http(s.port, "POST", "/api/embed", NULL, "{\"model\":\"stories260K\",\"input\":\"Once upon a time\",\"dimensions\":8}", &r) &&
                r.status == 200,
            "Ollama's dimensions: %d %s", r.status, r.body);
    cJSON *olla = cJSON_Parse(r.body);
    T_CHECK(cJSON_GetArraySize(cJSON_GetArrayItem(cJSON_GetObjectItem(olla, "embeddings"), 0)) == 8, "Ollama's dimensions: %s", r.body);
    cJSON_Delete(olla);
    resp_free(&r);
    static const char *const bad[] = {"{\"input\":\"a\",\"dimensions\":0}", "{\"input\":\"a\",\"dimensions\":65}",
                                      "{\"input\":\"a\",\"dimensions\":2.5}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        T_CHECK(http(s.port, "POST", "/v1/embeddings", NULL, bad[i], &r) && r.status == 400 && strstr(r.body, "from 1 to 64"), "%s: %d %s",
                bad[i], r.status, r.body);
        resp_free(&r);
    }
    T_CHECK(server_stop(&s) == 0, "server did not exit 0");
    /* another model: whole vectors only; a folder that says it is one needs no flag */
    if (server_start(&s, "mrl-off", "", NULL)) {
        T_CHECK(http(s.port, "POST", "/v1/embeddings", NULL, cut, &r) && r.status == 400 && strstr(r.body, "Matryoshka"), "%d %s", r.status, r.body);
        resp_free(&r);
        T_CHECK(server_stop(&s) == 0, "server did not exit 0");
    } else {
        T_CHECK(0, "the server without --matryoshka did not start");
    }
    char dir[700], args[2400];
    snprintf(dir, sizeof dir, "%s", t_path("mrl-hf"));
    snprintf(args, sizeof args, "export '%s' -z '%s' -o '%s/'", model_path, tok_path, dir);
    T_CHECK(t_nerve(args) == 0, "export: %s", t_err);
    cJSON *cfg = json_in(dir, "config.json");
    cJSON_AddTrueToObject(cfg, "is_matryoshka");
    cJSON_AddItemToObject(cfg, "matryoshka_dimensions", cJSON_Parse("[16, 32]")); /* (the widths it was trained at, alone) */
    json_put("mrl-hf/config.json", cfg);
    snprintf(args, sizeof args, "export '%s/' -o '%s/'", dir, t_path("mrl-hf2")); /* (and it says so again when exported) */
    T_CHECK(t_nerve(args) == 0, "export: %s", t_err);
    cfg = json_in(t_path("mrl-hf2"), "config.json");
    T_CHECK(cJSON_IsTrue(cJSON_GetObjectItem(cfg, "is_matryoshka")) && cJSON_GetArraySize(cJSON_GetObjectItem(cfg, "matryoshka_dimensions")) == 2,
            "the export's config.json lost is_matryoshka or its widths");
    cJSON_Delete(cfg);
    if (server_spawn(&s, "mrl-hf", NULL, NULL, dir, NULL, "", 30)) {
        T_CHECK(http(s.port, "POST", "/v1/embeddings", NULL, cut, &r) && r.status == 200 && embedding_len(r.body, part, 64) == 16, "%d %s",
                r.status, r.body);
        resp_free(&r);
        T_CHECK(http(s.port, "POST", "/v1/embeddings", NULL, "{\"input\":\"Once\",\"dimensions\":8}", &r) && r.status == 400 &&
                    strstr(r.body, "matryoshka_dimensions"),
                "a width the model does not list: %d %s", r.status, r.body);
        resp_free(&r);
        T_CHECK(server_stop(&s) == 0, "server did not exit 0");
    } else {
        T_CHECK(0, "the folder's server did not start");
    }
    /* a malformed flag is warned of: the model still loads, its embeddings whole */
    cfg = json_in(dir, "config.json");
    cJSON_ReplaceItemInObject(cfg, "is_matryoshka", cJSON_CreateString("true"));
    json_put("mrl-hf/config.json", cfg);
    if (server_spawn(&s, "mrl-bad", NULL, NULL, dir, NULL, "", 30)) {
        char *log = read_log(&s);
        T_CHECK(strstr(log, "is malformed: ignored"), "no warning: %s", log);
        free(log);
        T_CHECK(http(s.port, "POST", "/v1/embeddings", NULL, cut, &r) && r.status == 400, "%d %s", r.status, r.body);
        resp_free(&r);
        T_CHECK(server_stop(&s) == 0, "server did not exit 0");
    } else {
        T_CHECK(0, "a folder with a malformed is_matryoshka did not load");
    }
}

/* ---- auth, CORS, timeouts ----------------------------------------------------------------------- */

static void test_auth_cors_timeout(void) {
    server s;
    if (!server_start(&s, "auth", "--cors --timeout 1", "NERVE_API_KEY=sekret NERVE_TEST_STEP_DELAY_MS=15")) {
        T_CHECK(0, "server did not start");
        return;
    }
    int port = s.port;
    const char *good = "Authorization: Bearer sekret\r\n";
    const char *bad[] = {NULL, "Authorization: Bearer sekreT\r\n", "Authorization: Bearer sekret2\r\n",
                         "Authorization: Bearer sekre\r\n", "Authorization: Basic sekret\r\n", "Authorization: sekret\r\n"};
    resp r;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char why[200] = "";
        T_CHECK(http(port, "GET", "/v1/models", bad[i], NULL, &r) && r.status == 401 &&
                    error_body_ok(r.body, NULL, "invalid_api_key", why, sizeof why) && strcasestr(r.head, "WWW-Authenticate"),
                "auth case %zu: %d %s", i, r.status, why);
        resp_free(&r);
    }
    T_CHECK(http(port, "POST", "/v1/completions", NULL, "{\"prompt\":\"x\"}", &r) && r.status == 401, "completion without key: %d",
            r.status);
    resp_free(&r);
    T_CHECK(http(port, "GET", "/metrics", NULL, NULL, &r) && r.status == 401, "metrics without key: %d", r.status);
    resp_free(&r);
    T_CHECK(http(port, "GET", "/health", NULL, NULL, &r) && r.status == 200, "health needs no key: %d", r.status);
    resp_free(&r);
    T_CHECK(http(port, "GET", "/v1/models", good, NULL, &r) && r.status == 200 &&
                strcasestr(r.head, "Access-Control-Allow-Origin: *"),
            "with the key: %d", r.status);
    resp_free(&r);
    result ok;
    complete(port, 0, good, "{\"prompt\":\"Once\",\"max_tokens\":3}", &ok);
    T_CHECK(ok.status == 200 && ok.completion_tokens == 3, "completion with the key: %d", ok.status);
    T_CHECK(http(port, "OPTIONS", "/v1/chat/completions", "Origin: http://example.com\r\nAccess-Control-Request-Method: POST\r\n",
                 NULL, &r) &&
                r.status == 204 && strcasestr(r.head, "Access-Control-Allow-Origin: *") &&
                strcasestr(r.head, "Access-Control-Allow-Headers: Authorization, Content-Type"),
            "CORS preflight: %d", r.status);
    resp_free(&r);
    /* the headers a browser asks for are allowed (the OpenAI SDKs send X-Stainless-* ones); a list that
       is not plain header names gets the default */
    T_CHECK(http(port, "OPTIONS", "/v1/chat/completions",
                 "Origin: http://example.com\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: "
                 "authorization, content-type, x-stainless-os, x-stainless-retry-count\r\n",
                 NULL, &r) &&
                r.status == 204 &&
                strcasestr(r.head, "Access-Control-Allow-Headers: authorization, content-type, x-stainless-os, x-stainless-retry-count"),
            "CORS preflight asking for SDK headers: %d %s", r.status, r.head);
    resp_free(&r);
    T_CHECK(http(port, "OPTIONS", "/v1/chat/completions",
                 "Origin: http://example.com\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: x-a;b=c\r\n",
                 NULL, &r) &&
                r.status == 204 && strcasestr(r.head, "Access-Control-Allow-Headers: Authorization, Content-Type") &&
                !strstr(r.head, "x-a;b"),
            "CORS preflight with an odd header list: %d %s", r.status, r.head);
    resp_free(&r);

    /* --timeout 1: a request needing ~3 s ends with 408 (whole) or an error event (stream) */
    result t1, t2;
    complete(port, 0, good, "{\"prompt\":\"Once\",\"max_tokens\":200,\"temperature\":0}", &t1);
    T_CHECK(t1.status == 408, "timeout: status %d", t1.status);
    complete(port, 1, good,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Once\"}],\"max_tokens\":200,\"temperature\":0,\"stream\":true}", &t2);
    T_CHECK(t2.status == 200 && t2.error_event == 1 && t2.done == 1, "streamed timeout: status %d error events %d done %d",
            t2.status, t2.error_event, t2.done);
    for (double t0 = now_s(); now_s() - t0 < 10; sleep_ms(20)) {
        resp m;
        int idle = 0;
        if (http(port, "GET", "/metrics", good, NULL, &m) && m.status == 200)
            idle = strstr(m.body, "\nnerve_kv_blocks_in_use 0\n") && strstr(m.body, "reason=\"timeout\"} 2\n");
        resp_free(&m);
        if (idle) break;
        T_CHECK(now_s() - t0 < 9.9, "timed-out requests not retired / blocks not free");
    }
    T_CHECK(server_stop(&s) == 0, "server did not exit 0 on SIGTERM");
}

static void test_serve_data(void) {
    t_data("models/stories260K.bin");
    t_data("models/tok512.bin");
}

/* The chat templates' Jinja forms (what `nerve export` writes for transformers, vLLM and llama.cpp)
 * render what the server feeds the model, conversation for conversation, in jinja2 as transformers
 * runs it: scripts/chat_template_check.py (python3-jinja2, from scripts/deps.sh). */
static void test_chat_templates_in_jinja(void) {
    if (system("/usr/bin/python3 -c 'import jinja2' 2>/dev/null") != 0) return t_skip("no python3-jinja2 (scripts/deps.sh)");
    char cmd[20000], work[4300];
    snprintf(work, sizeof work, "%s/jinja", tmpdir);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && /usr/bin/python3 scripts/chat_template_check.py '%s' '%s' '%s' '%s' 2>&1", work,
             t_nerve_bin(), model_path, tok_path, work);
    FILE *p = popen(cmd, "r");
    char out[16384] = "";
    size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[n] = 0;
    const int rc = p ? pclose(p) : -1;
    /* every template (by its name) rendered every conversation alike */
    int all = rc == 0;
    for (int t = NV_CHAT_PLAIN; t <= NV_CHAT_SMOLLM3 && all; t++) {
        char line[96];
        snprintf(line, sizeof line, "chat_template_check: %s: 22/22 ", nv_chat_template_name((nv_chat_template)t));
        all = strstr(out, line) != NULL;
    }
    T_CHECK(all, "chat_template_check.py (exit %d):\n%s", rc, out);
}

/* HTTPS (--ssl-key-file, --ssl-cert-file) with a self-signed certificate made by openssl, and API
 * keys from a file (--api-key-file: two keys, a comment and a blank line): curl, checking the
 * certificate, gets a completion with either key (Bearer or x-api-key) and /health without one, 401
 * without a key or with the comment line as one; a plain HTTP request to it gets no HTTP answer; a key that is not one, a key without its certificate, a key of another certificate and a
 * missing file are refused in one line before anything listens. */
/* An Ollama answer, whole or as JSON lines: its text (content or response), thinking aside, and the
 * last object's fields. Returns the status (0 when a line is not JSON or no done object came). */
typedef struct {
    char text[4096], done_reason[16];
    int lines, done, eval_count, prompt_eval_count, ndjson, calls;
    char call_args[256];
    char context[8192]; /* the done object's context as JSON ("" when absent) */
    int n_context;
} olla_result;

static int olla_post(int port, const char *path, const char *body, olla_result *o) {
    memset(o, 0, sizeof *o);
    resp r;
    if (!http(port, "POST", path, NULL, body, &r)) return 0;
    int status = r.status;
    o->ndjson = r.head && strstr(r.head, "application/x-ndjson") != NULL;
    char *save = NULL;
    for (char *line = status == 200 ? strtok_r(r.body, "\n", &save) : NULL; line; line = strtok_r(NULL, "\n", &save)) {
        cJSON *root = cJSON_Parse(line);
        if (!root) {
            status = 0;
            break;
        }
        o->lines++;
        const cJSON *msg = cJSON_GetObjectItem(root, "message");
        const cJSON *t = msg ? cJSON_GetObjectItem(msg, "content") : cJSON_GetObjectItem(root, "response");
        if (cJSON_IsString(t)) strncat(o->text, t->valuestring, sizeof o->text - strlen(o->text) - 1);
        const cJSON *calls = msg ? cJSON_GetObjectItem(msg, "tool_calls") : NULL;
        if (cJSON_IsArray(calls) && calls->child) {
            o->calls += cJSON_GetArraySize(calls);
            char *args = cJSON_PrintUnformatted(cJSON_GetObjectItem(cJSON_GetObjectItem(calls->child, "function"), "arguments"));
            snprintf(o->call_args, sizeof o->call_args, "%s", args ? args : "");
            free(args);
        }
        if (cJSON_IsTrue(cJSON_GetObjectItem(root, "done"))) {
            o->done++;
            const cJSON *dr = cJSON_GetObjectItem(root, "done_reason");
            snprintf(o->done_reason, sizeof o->done_reason, "%s", cJSON_IsString(dr) ? dr->valuestring : "");
            o->eval_count = cJSON_GetObjectItem(root, "eval_count") ? cJSON_GetObjectItem(root, "eval_count")->valueint : -1;
            o->prompt_eval_count =
                cJSON_GetObjectItem(root, "prompt_eval_count") ? cJSON_GetObjectItem(root, "prompt_eval_count")->valueint : -1;
            const cJSON *ctx = cJSON_GetObjectItem(root, "context");
            char *ids = ctx ? cJSON_PrintUnformatted(ctx) : NULL;
            snprintf(o->context, sizeof o->context, "%s", ids ? ids : "");
            o->n_context = cJSON_GetArraySize(ctx);
            free(ids);
        }
        cJSON_Delete(root);
    }
    if (status == 200 && o->done != 1) status = 0;
    resp_free(&r);
    return status;
}

/* /api/generate's answer to olla_body (into o) is the text of the OpenAI request openai_body (chat:
 * /v1/chat/completions; into want). */
static int olla_generates(int port, const char *olla_body, int chat, const char *openai_body, olla_result *o, result *want) {
    return olla_post(port, "/api/generate", olla_body, o) == 200 && complete(port, chat, NULL, openai_body, want) && o->text[0] &&
           !strcmp(o->text, want->text);
}

/* Ollama's API: its requests give the same text as the OpenAI requests they stand for (chat with
 * history and a tool call, generate through the template and raw), streamed as JSON lines or whole
 * with Ollama's counts; /api/tags, /api/ps, /api/show and /api/version; a format's schema; the
 * embeddings /v1/embeddings gives; a request with nothing to answer "loads" the model; the
 * refusals in Ollama's error shape. */
static void test_ollama_api(void) {
    server s;
    if (!server_start(&s, "ollama", "--kv-disk-cache 0 --chat-template chatml", NULL)) {
        T_CHECK(0, "the server did not start");
        return;
    }
    resp r;
    T_CHECK(http(s.port, "GET", "/api/version", NULL, NULL, &r) && r.status == 200 && strstr(r.body, "\"version\""), "/api/version: %d",
            r.status);
    resp_free(&r);
    T_CHECK(http(s.port, "GET", "/api/tags", NULL, NULL, &r) && r.status == 200 && strstr(r.body, "\"name\":\"stories260K:latest\"") &&
                strstr(r.body, "\"parameter_size\":\"260K\"") && strstr(r.body, "\"format\":\"llama2.c\""),
            "/api/tags: %d %s", r.status, r.body ? r.body : "");
    resp_free(&r);
    T_CHECK(http(s.port, "GET", "/api/ps", NULL, NULL, &r) && r.status == 200 && strstr(r.body, "\"context_length\":512"), "/api/ps: %s",
            r.body ? r.body : "");
    resp_free(&r);
    T_CHECK(http(s.port, "POST", "/api/show", NULL, "{\"model\":\"stories260K\"}", &r) && r.status == 200 &&
                strstr(r.body, "\"template\":\"chatml\"") && strstr(r.body, "\"llama.context_length\":512"),
            "/api/show: %s", r.body ? r.body : "");
    resp_free(&r);
    T_CHECK(http(s.port, "POST", "/api/show", NULL, "{\"model\":\"nope\"}", &r) && r.status == 404 && !strcmp(r.body, "{\"error\":\"model 'nope' not found\"}"),
            "/api/show of another model: %d %s", r.status, r.body ? r.body : "");
    resp_free(&r);

    /* chat with history and a tool call, streamed by default, against the OpenAI request it stands for */
    static const char olla_msgs[] =
        "[{\"role\":\"system\",\"content\":\"Tell stories.\"},{\"role\":\"user\",\"content\":\"Weather in Oslo?\"},"
        "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"weather\",\"arguments\":{\"city\":\"Oslo\"}}}]},"
        "{\"role\":\"tool\",\"content\":\"Sunny\",\"tool_name\":\"weather\"},{\"role\":\"user\",\"content\":\"Once upon a time\"}]";
    static const char openai_msgs[] =
        "[{\"role\":\"system\",\"content\":\"Tell stories.\"},{\"role\":\"user\",\"content\":\"Weather in Oslo?\"},"
        "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"weather\","
        "\"arguments\":\"{\\\"city\\\":\\\"Oslo\\\"}\"}}]},{\"role\":\"tool\",\"content\":\"Sunny\",\"tool_call_id\":\"c1\"},"
        "{\"role\":\"user\",\"content\":\"Once upon a time\"}]";
    char body[12288];
    olla_result o, w;
    result want;
    snprintf(body, sizeof body, "{\"model\":\"stories260K:latest\",\"messages\":%s,\"options\":{\"num_predict\":12,\"temperature\":0}}", olla_msgs);
    /* one line per poll of the request: a token apiece when the reader keeps up, fewer when tokens come
     * faster than it reads (a loaded machine), never more than the 12 tokens and the done line */
    T_CHECK(olla_post(s.port, "/api/chat", body, &o) == 200 && o.ndjson && o.lines >= 2 && o.lines <= 13 && o.eval_count == 12 &&
                o.prompt_eval_count > 20 &&
                !strcmp(o.done_reason, "length"),
            "streamed chat: %d lines, eval_count %d, prompt_eval_count %d, done_reason %s", o.lines, o.eval_count, o.prompt_eval_count,
            o.done_reason);
    snprintf(body, sizeof body, "{\"model\":\"stories260K\",\"messages\":%s,\"stream\":false,\"options\":{\"num_predict\":12,\"temperature\":0}}",
             olla_msgs);
    T_CHECK(olla_post(s.port, "/api/chat", body, &w) == 200 && !w.ndjson && w.lines == 1 && !strcmp(w.text, o.text),
            "whole chat '%s' against streamed '%s'", w.text, o.text);
    snprintf(body, sizeof body, "{\"messages\":%s,\"max_tokens\":12,\"temperature\":0}", openai_msgs);
    T_CHECK(complete(s.port, 1, NULL, body, &want) && want.status == 200 && o.text[0] && !strcmp(o.text, want.text),
            "/api/chat '%s' against /v1/chat/completions '%s'", o.text, want.text);

    /* generate: through the template (one user message), and raw (the prompt as it is) */
    T_CHECK(olla_generates(s.port,
                           "{\"model\":\"stories260K\",\"prompt\":\"Once upon a time\",\"system\":\"Tell stories.\",\"stream\":false,"
                           "\"options\":{\"num_predict\":10,\"temperature\":0}}",
                           1,
                           "{\"messages\":[{\"role\":\"system\",\"content\":\"Tell stories.\"},{\"role\":\"user\",\"content\":\"Once upon a "
                           "time\"}],\"max_tokens\":10,\"temperature\":0}",
                           &o, &want),
            "/api/generate '%s' against chat '%s'", o.text, want.text);
    /* its context, sent back with the next prompt: the conversation so far before that prompt's turn
       (whose BOS goes), the same whether the answer is streamed or not, and it begins the next context */
    olla_result alone, s2;
    char first_context[8192];
    snprintf(first_context, sizeof first_context, "%s", o.context);
    const int n_first = o.n_context;
    T_CHECK(n_first > o.prompt_eval_count + 10 && o.prompt_eval_count > 0, "context of %d ids for a prompt of %d and 10 tokens",
            n_first, o.prompt_eval_count);
    T_CHECK(olla_post(s.port, "/api/generate", "{\"model\":\"stories260K\",\"prompt\":\"And then?\",\"stream\":false,"
                                                "\"options\":{\"num_predict\":8,\"temperature\":0}}", &alone) == 200,
            "generate without a context");
    snprintf(body, sizeof body, "{\"model\":\"stories260K\",\"prompt\":\"And then?\",\"context\":%s,\"stream\":false,"
                                "\"options\":{\"num_predict\":8,\"temperature\":0}}", first_context);
    T_CHECK(olla_post(s.port, "/api/generate", body, &w) == 200 && w.prompt_eval_count == n_first + alone.prompt_eval_count - 1 &&
                !strncmp(w.context, first_context, strlen(first_context) - 1) && w.n_context > w.prompt_eval_count,
            "with the context: %d prompt ids (want %d + %d - 1), context %.80s", w.prompt_eval_count, n_first, alone.prompt_eval_count,
            w.context);
    snprintf(body, sizeof body, "{\"model\":\"stories260K\",\"prompt\":\"And then?\",\"context\":%s,"
                                "\"options\":{\"num_predict\":8,\"temperature\":0}}", first_context);
    T_CHECK(olla_post(s.port, "/api/generate", body, &s2) == 200 && s2.ndjson && !strcmp(s2.text, w.text) && !strcmp(s2.context, w.context),
            "streamed with the context: '%s' against '%s'", s2.text, w.text);
    T_CHECK(olla_generates(s.port,
                           "{\"model\":\"stories260K\",\"prompt\":\"Once upon a time\",\"raw\":true,\"options\":{\"num_predict\":10,"
                           "\"temperature\":0}}",
                           0, "{\"prompt\":\"Once upon a time\",\"max_tokens\":10,\"temperature\":0}", &o, &want) &&
                o.ndjson,
            "raw /api/generate '%s' against /v1/completions '%s'", o.text, want.text);
    /* repeat_penalty over Ollama's window of the last 64 tokens */
    T_CHECK(olla_generates(s.port,
                           "{\"model\":\"stories260K\",\"prompt\":\"Once upon a time\",\"raw\":true,\"stream\":false,"
                           "\"options\":{\"num_predict\":100,\"temperature\":0,\"repeat_penalty\":1.3,\"frequency_penalty\":0.3}}",
                           0,
                           "{\"prompt\":\"Once upon a time\",\"max_tokens\":100,\"temperature\":0,\"repetition_penalty\":1.3,"
                           "\"frequency_penalty\":0.3,\"repeat_last_n\":64}",
                           &o, &want),
            "/api/generate's penalties '%s' against the window of 64 '%s'", o.text, want.text);
    /* no num_predict: until the end of the context or the turn, not OpenAI's 16 */
    T_CHECK(olla_post(s.port, "/api/generate", "{\"model\":\"stories260K\",\"prompt\":\"Once\",\"raw\":true,\"stream\":false,"
                                                "\"options\":{\"temperature\":0}}",
                      &o) == 200 &&
                o.eval_count > 16,
            "raw generate without num_predict: %d tokens", o.eval_count);
    /* format, a JSON schema: an object it accepts */
    T_CHECK(olla_post(s.port, "/api/chat",
                      "{\"model\":\"stories260K\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"stream\":false,"
                      "\"format\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
                      "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120}},\"required\":[\"name\",\"age\"]},\"options\":{\"temperature\":0}}",
                      &o) == 200 &&
                !strcmp(o.done_reason, "stop"),
            "format: %s (%s)", o.text, o.done_reason);
    cJSON *j = cJSON_Parse(o.text);
    T_CHECK(cJSON_IsObject(j) && cJSON_IsString(cJSON_GetObjectItem(j, "name")) && cJSON_IsNumber(cJSON_GetObjectItem(j, "age")),
            "format gave '%s'", o.text);
    cJSON_Delete(j);
    /* embeddings: /api/embed's vectors are /v1/embeddings' for the same texts; /api/embeddings's one */
    resp e1, e2;
    T_CHECK(http(s.port, "POST", "/api/embed", NULL, "{\"model\":\"stories260K:latest\",\"input\":[\"Once upon a time\",\"Hi\"]}", &e1) &&
                e1.status == 200 &&
                http(s.port, "POST", "/v1/embeddings", NULL, "{\"input\":[\"Once upon a time\",\"Hi\"]}", &e2) && e2.status == 200,
            "embeddings: %d %d", e1.status, e2.status);
    cJSON *ja = cJSON_Parse(e1.body), *jb = cJSON_Parse(e2.body);
    const cJSON *va = cJSON_GetObjectItem(ja, "embeddings"), *vb = cJSON_GetObjectItem(jb, "data");
    int same = cJSON_GetArraySize(va) == 2 && cJSON_GetArraySize(vb) == 2 && cJSON_GetObjectItem(ja, "prompt_eval_count");
    for (int i = 0; same && i < 2; i++) {
        const cJSON *x = cJSON_GetArrayItem(va, i), *y = cJSON_GetObjectItem(cJSON_GetArrayItem(vb, i), "embedding");
        same = cJSON_GetArraySize(x) == 64 && cJSON_GetArraySize(y) == 64;
        for (int k = 0; same && k < 64; k++)
            same = fabs(cJSON_GetArrayItem(x, k)->valuedouble - cJSON_GetArrayItem(y, k)->valuedouble) < 1e-6;
    }
    T_CHECK(same, "/api/embed against /v1/embeddings: %.200s", e1.body ? e1.body : "");
    cJSON_Delete(ja), cJSON_Delete(jb), resp_free(&e1), resp_free(&e2);
    T_CHECK(http(s.port, "POST", "/api/embeddings", NULL, "{\"model\":\"stories260K\",\"prompt\":\"Hi\"}", &e1) && e1.status == 200,
            "/api/embeddings: %d", e1.status);
    ja = cJSON_Parse(e1.body);
    T_CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(ja, "embedding")) == 64, "/api/embeddings: %.200s", e1.body ? e1.body : "");
    cJSON_Delete(ja), resp_free(&e1);
    /* nothing to answer: the model "loads" */
    T_CHECK(olla_post(s.port, "/api/chat", "{\"model\":\"stories260K\",\"messages\":[]}", &o) == 200 && !strcmp(o.done_reason, "load"),
            "load: %s", o.done_reason);
    T_CHECK(olla_post(s.port, "/api/generate", "{\"model\":\"stories260K:latest\"}", &o) == 200 && !strcmp(o.done_reason, "load"),
            "load by generate without a prompt: %s", o.done_reason);
    /* refusals, in Ollama's shape */
    static const struct {
        const char *path, *body, *want;
        int status;
    } bad[] = {{"/api/chat", "{\"model\":\"x\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", "{\"error\":\"model 'x' not found\"}", 404},
               {"/api/chat", "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", "{\"error\":\"model is required\"}", 400},
               {"/api/chat", "{\"model\":\"stories260K\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\",\"images\":[\"aGk=\"]}]}", "images", 400},
               {"/api/generate", "{\"model\":\"stories260K\",\"prompt\":\"Hi\",\"options\":{\"num_predict\":0}}", "num_predict", 400},
               {"/api/generate", "{\"model\":\"stories260K\",\"prompt\":\"Hi\",\"context\":[1,512]}", "context: item 1", 400},
               {"/api/generate", "{\"model\":\"stories260K\",\"prompt\":\"Hi\",\"context\":[1.5]}", "context: item 0", 400},
               {"/api/generate", "{\"model\":\"stories260K\",\"prompt\":\"Hi\",\"context\":\"1 2\"}", "context", 400},
               {"/api/generate", "{\"model\":\"stories260K\",\"prompt\":\"Hi\",\"raw\":true,\"context\":[1]}", "context", 400},
               {"/api/chat", "{\"model\":\"stories260K\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"context\":[1]}",
                "context", 400},
               {"/api/chat", "{\"model\":\"stories260K\",\"messages\":[{\"role\":\"tool\",\"content\":\"Hi\"}]}", "tool", 400},
               {"/api/chat", "not json", "\"error\"", 400},
               {"/api/embed", "{\"model\":\"stories260K\"}", "input", 400},
               {"/api/embed", "{\"model\":\"y\",\"input\":\"Hi\"}", "{\"error\":\"model 'y' not found\"}", 404}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        T_CHECK(http(s.port, "POST", bad[i].path, NULL, bad[i].body, &r) && r.status == bad[i].status && !strncmp(r.body, "{\"error\":\"", 10) &&
                    strstr(r.body, bad[i].want),
                "refusal %zu: %d %s", i, r.status, r.body ? r.body : "");
        resp_free(&r);
    }
    /* contexts of 500, 512 and 700 ids with the prompt after them do not fit the context of 512: truncated
       as Ollama does (num_keep 4 by default: [1 300 301 302], then the last (511 - 4) / 2 tokens), so their
       prompts are the same and so are the greedy answers; num_keep 0 keeps (511 - 0) / 2 */
    static char big[8192];
    olla_result cut[5];
    const int lens[5] = {500, 512, 700, 700, 512};
    for (int k = 0; k < 5; k++) { /* the last: another prompt after the same context (the prompt's end is kept) */
        int at = snprintf(big, sizeof big, "{\"model\":\"stories260K\",\"prompt\":\"%s\",\"stream\":false,\"options\":"
                                           "{\"temperature\":0,\"num_predict\":20%s},\"context\":[1",
                          k == 4 ? "Once upon a time, there was a big dog" : "Hi", k == 3 ? ",\"num_keep\":0" : "");
        /* 300 301 302, then ids counted from the context's end, so that the tails of any two are alike */
        for (int i = 1; i < lens[k]; i++) at += snprintf(big + at, sizeof big - (size_t)at, ",%d", i < 4 ? 299 + i : 300 + (lens[k] - i) % 200);
        snprintf(big + at, sizeof big - (size_t)at, "]}");
        T_CHECK(olla_post(s.port, "/api/generate", big, &cut[k]) == 200 && cut[k].done && cut[k].eval_count >= 1 &&
                    cut[k].prompt_eval_count == (k == 3 ? 255 : 4 + 253),
                "a context of %d ids: %d prompt tokens, %d answered", lens[k], cut[k].prompt_eval_count, cut[k].eval_count);
        if (k > 0 && k < 3) T_CHECK(!strcmp(cut[k].text, cut[0].text), "truncated alike, answered otherwise: '%s' / '%s'", cut[k].text, cut[0].text);
    }
    T_CHECK(strcmp(cut[4].text, cut[1].text) != 0, "another prompt after the context, the same answer: '%s'", cut[4].text);
    snprintf(big, sizeof big, "{\"model\":\"stories260K\",\"prompt\":\"Hi\",\"options\":{\"num_keep\":-1}}");
    T_CHECK(http(s.port, "POST", "/api/generate", NULL, big, &r) && r.status == 400 && strstr(r.body, "num_keep"), "num_keep -1: %d", r.status);
    resp_free(&r);
    server_stop(&s);
}

/* GET / answers the chat page (public, with its security headers) and --no-webui takes it away;
 * the page's script, run by node against the server on a stand-in DOM (tests/webui_check.js),
 * lists the model, streams an answer with its usage line, keeps the conversation, and shows a
 * refusal as an error without keeping the refused question. */
static void test_webui(void) {
    server s;
    if (!server_start(&s, "webui", "--kv-disk-cache 0 --api-key page-key", NULL)) {
        T_CHECK(0, "the server did not start");
        return;
    }
    resp r;
    T_CHECK(http(s.port, "GET", "/", NULL, NULL, &r) && r.status == 200 && strstr(r.head, "text/html") &&
                strstr(r.head, "Content-Security-Policy: default-src 'none'") && strstr(r.body, "<title>nerve</title>") &&
                strstr(r.body, "/v1/chat/completions"),
            "GET / without a key: %d %s", r.status, r.head ? r.head : "");
    resp_free(&r);
    T_CHECK(http(s.port, "GET", "/v1/models", NULL, NULL, &r) && r.status == 401, "/v1/models without a key: %d", r.status);
    resp_free(&r);
    T_CHECK(http(s.port, "POST", "/", NULL, "{}", &r) && r.status == 405, "POST /: %d", r.status);
    resp_free(&r);
    if (system("command -v node >/dev/null 2>&1") == 0) {
        char cmd[1024], out[700], *text = NULL;
        snprintf(out, sizeof out, "%s/webui-check.txt", tmpdir);
        snprintf(cmd, sizeof cmd, "node --no-warnings tests/webui_check.js http://127.0.0.1:%d page-key >'%s' 2>&1", s.port, out);
        const int rc = system(cmd);
        nv_file_read_all(out, &text, NULL);
        T_CHECK(rc == 0 && text && !strcmp(text, "ok\n"), "the page's script: %s", text ? text : "(no output)");
        free(text);
    } else {
        t_skip("node is not installed (scripts/deps.sh installs nodejs): the page's script is not run");
    }
    server_stop(&s);
    if (!server_start(&s, "no-webui", "--kv-disk-cache 0 --no-webui", NULL)) {
        T_CHECK(0, "the server did not start");
        return;
    }
    T_CHECK(http(s.port, "GET", "/", NULL, NULL, &r) && r.status == 404, "GET / with --no-webui: %d", r.status);
    resp_free(&r);
    server_stop(&s);
}

static void test_https(void) {
    if (system("command -v openssl >/dev/null 2>&1 && command -v curl >/dev/null 2>&1") != 0) {
        t_skip("openssl or curl is not installed (scripts/deps.sh installs them)");
        return;
    }
    char key[700], cert[700], other[700], cmd[4096];
    snprintf(key, sizeof key, "%s/tls-key.pem", tmpdir);
    snprintf(cert, sizeof cert, "%s/tls-cert.pem", tmpdir);
    snprintf(other, sizeof other, "%s/tls-other.pem", tmpdir);
    snprintf(cmd, sizeof cmd,
             "openssl req -x509 -newkey rsa:2048 -nodes -keyout '%s' -out '%s' -days 2 -subj /CN=localhost "
             "-addext subjectAltName=IP:127.0.0.1 >/dev/null 2>&1 && openssl genrsa -out '%s' 2048 >/dev/null 2>&1",
             key, cert, other);
    if (system(cmd) != 0) {
        t_skip("openssl could not make a certificate");
        return;
    }
    char keys[700];
    static const char key_lines[] = "# keys\n  alpha-key  \n\nbeta-key\n";
    snprintf(keys, sizeof keys, "%s", t_write("keys.txt", key_lines, sizeof key_lines - 1));
    char args[3000];
    snprintf(args, sizeof args, "--kv-disk-cache 0 --ssl-key-file '%s' --ssl-cert-file '%s' --api-key-file '%s'", key, cert, keys);
    server s;
    if (!server_start(&s, "https", args, NULL)) {
        T_CHECK(0, "the HTTPS server did not start");
        return;
    }
    char *log = read_log(&s);
    T_CHECK(strstr(log, "listening on https://127.0.0.1:") != NULL, "no https in the log: %s", log);
    free(log);
    char out[700], *body = NULL;
    snprintf(out, sizeof out, "%s/https-out.json", tmpdir);
    snprintf(cmd, sizeof cmd,
             "curl -sS --max-time 60 --cacert '%s' -H 'Authorization: Bearer alpha-key' https://127.0.0.1:%d/v1/completions -d "
             "'{\"prompt\":\"Once upon a time\",\"max_tokens\":8,\"temperature\":0}' >'%s' 2>&1 && "
             "curl -sS --max-time 20 --cacert '%s' https://127.0.0.1:%d/health >>'%s' 2>&1",
             cert, s.port, out, cert, s.port, out);
    const int rc = system(cmd);
    nv_file_read_all(out, &body, NULL);
    T_CHECK(rc == 0 && body && strstr(body, "\"text_completion\"") && strstr(body, "\"completion_tokens\":8") && strstr(body, "\"status\""),
            "over HTTPS: rc %d, %s", rc, body ? body : "(nothing)");
    free(body);
    const struct {
        const char *header;
        int status;
    } auth[] = {{"x-api-key: beta-key", 200}, {"Authorization: Bearer beta-key", 200}, {"X-None: 1", 401},
                {"Authorization: Bearer # keys", 401}, {"Authorization: Bearer alpha-key  ", 200}};
    for (size_t i = 0; i < sizeof auth / sizeof auth[0]; i++) {
        snprintf(cmd, sizeof cmd, "curl -s -o /dev/null -w '%%{http_code}' --max-time 20 --cacert '%s' -H '%s' https://127.0.0.1:%d/v1/models >'%s'",
                 cert, auth[i].header, s.port, out);
        body = NULL;
        T_CHECK(system(cmd) == 0 && nv_file_read_all(out, &body, NULL) == NV_OK && atoi(body) == auth[i].status, "'%s': %s (want %d)",
                auth[i].header, body ? body : "?", auth[i].status);
        free(body);
    }
    resp r = {0};
    T_CHECK(!http(s.port, "GET", "/health", NULL, NULL, &r) || r.status != 200, "plain HTTP was answered on the HTTPS port");
    resp_free(&r);
    T_CHECK(server_stop(&s) == 0, "the HTTPS server did not stop cleanly");

    const struct {
        const char *k, *c, *want;
        int rc;
    } bad[] = {{cert, cert, "is not a PEM PRIVATE KEY", 1},
               {key, NULL, "go together", 2},
               {other, cert, "cannot serve HTTPS", 1},
               {"/nonexistent/key.pem", cert, "--ssl-key-file: /nonexistent/key.pem", 1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char extra[2000] = "";
        if (bad[i].c) snprintf(extra, sizeof extra, "--ssl-cert-file '%s'", bad[i].c);
        /* (a server that starts after all is stopped by the timeout: exit 0, a failure, not a hang) */
        snprintf(cmd, sizeof cmd, "timeout 60 '%s' serve -m %s -z %s --port 0 --kv-disk-cache 0 --ssl-key-file '%s' %s 2>'%s' </dev/null",
                 t_nerve_bin(), model_path, tok_path, bad[i].k, extra, out);
        const int st = system(cmd), code = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
        char *err = NULL;
        nv_file_read_all(out, &err, NULL);
        T_CHECK(code == bad[i].rc && err && strstr(err, bad[i].want) && strchr(err, '\n') == strrchr(err, '\n'), "case %zu: exit %d, '%s'", i,
                code, err ? err : "");
        free(err);
    }
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    snprintf(tmpdir, sizeof tmpdir, "%s", t_tmpdir());
    model_path = t_data("models/stories260K.bin");
    tok_path = t_data("models/tok512.bin");
    if (model_path && tok_path) {
        static char mp[4096], tp[4096];
        snprintf(mp, sizeof mp, "%s", model_path);
        snprintf(tp, sizeof tp, "%s", tok_path);
        model_path = mp;
        tok_path = tp;
        /* the exact fp32 engine: its text is the same on every machine, so the tests that read the
           greedy story (where it ends, which words it holds) hold on any CPU; the low-precision
           engines' rounding differs between AMX, AVX512_BF16 and neither */
        main_up = server_start(&main_srv, "main", MAIN_ARGS, NULL);
        if (!main_up) fprintf(stderr, "    the main server did not start\n");
    }
    if (!model_path || !tok_path) {
        T_RUN(test_serve_data); /* reports the skip */
        return t_done();
    }
    T_RUN(test_basic_endpoints);
    T_RUN(test_stop_strings_and_sampling);
    T_RUN(test_logprobs);
    T_RUN(test_n_choices);
    T_RUN(test_structured_outputs);
    T_RUN(test_eight_concurrent_greedy_equal_alone);
    T_RUN(test_speculative_decoding);
    T_RUN(test_prediction);
    T_RUN(test_draft_model);
    T_RUN(test_llamacpp_native);
    T_RUN(test_sixteen_clients);
    T_RUN(test_bad_requests_table);
    T_RUN(test_cli_errors);
    if (main_up) {
        int rc = server_stop(&main_srv);
        if (rc != 0) {
            fprintf(stderr, "    main server exit %d\n", rc);
            t_failed++;
        }
    }
    T_RUN(test_golden_through_api);
    T_RUN(test_prompt_logprobs);
    T_RUN(test_embeddings);
    T_RUN(test_embedding_pooling);
    T_RUN(test_ctx_size);
    T_RUN(test_matryoshka);
    T_RUN(test_llamacpp_flags);
    T_RUN(test_request_template);
    T_RUN(test_tool_calls);
    T_RUN(test_xml_tool_calls);
    T_RUN(test_run_folder);
    T_RUN(test_tiny_pool_queue_429_disconnect);
    T_RUN(test_priority_order);
    T_RUN(test_preemption);
    T_RUN(test_kv_overcommit);
    T_RUN(test_slots);
    T_RUN(test_auth_cors_timeout);
    T_RUN(test_https);
    T_RUN(test_webui);
    T_RUN(test_ollama_api);
    T_RUN(test_chat_templates_in_jinja);
    return t_done();
}
