/* libFuzzer harness: a model's chat template (src/serve/jinja.h) on untrusted input.
 *
 * The input, up to 64 KB, is the template's text (NULs and all). It is parsed; a failure must carry
 * one line of message and leave no program. A program is rendered twice with a conversation of
 * every kind (a system message, tool calls with object and text arguments, a tool result, tools,
 * BOS and EOS, a kwarg): each render succeeds or fails with a message, its limits keeping it
 * within the harness's time, and two renders of the same program give the same text (the
 * program keeps nothing of a render; strftime_now's minute aside, which the seeds do not call). */
#include <cjson/cJSON.h>

#include "fuzz_util.h"
#include "serve/jinja.h"

#define FZ_MAX_INPUT (64u << 10)

static const char vars_json[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \" Hi \\u00e9 \"},"
    "{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"f\","
    "\"arguments\": {\"a\": 1, \"b\": [true, null, 2.5]}}}, {\"type\": \"function\", \"function\": {\"name\": \"g\", \"arguments\": \"x\"}}]},"
    "{\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"42\"}, {\"role\": \"user\", \"content\": \"<think>x</think>y\"}],"
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\"}}}],"
    "\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true, \"enable_thinking\": false, \"n\": 3}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > FZ_MAX_INPUT) return 0;
    static cJSON *vars;
    if (!vars) vars = cJSON_Parse(vars_json);
    FZ_CHECK(vars != NULL, "the variables");
    nv_jinja *j = (nv_jinja *)1;
    fz_clear_error();
    nv_err e = nv_jinja_parse((const char *)data, size, &j);
    fz_check_error(e, "nv_jinja_parse");
    FZ_CHECK((e == NV_OK) == (j != NULL), "a program without success or the reverse");
    if (!j) return 0;
    nv_buf a = {0}, b = {0};
    fz_clear_error();
    const nv_err ea = nv_jinja_render(j, vars, &a);
    fz_check_error(ea, "nv_jinja_render");
    const nv_err eb = nv_jinja_render(j, vars, &b);
    FZ_CHECK(ea == eb && a.len == b.len && (!a.len || !memcmp(a.data, b.data, a.len)), "two renders differ (%d, %d)", ea, eb);
    nv_buf_free(&a);
    nv_buf_free(&b);
    nv_jinja_free(j);
    return 0;
}
