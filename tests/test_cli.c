/* The nerve command end to end: generate's golden output, init, tokenize, info, and errors. */
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/file.h"
#include "t.h"


/* Runs `nerve ARGS` (args already shell-quoted); captures stdout/stderr; returns the exit code. */
static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static void test_generate_reproduces_llama2c_greedy(void) {
    const char *m = t_data("models/stories260K.bin"), *z = t_data("models/tok512.bin");
    const char *want_path = t_data("models/stories260K_greedy200.expected.txt");
    if (!m || !z || !want_path) return;
    char args[2048], *want = NULL;
    snprintf(args, sizeof args, "generate -m %s -z %s -t 0 -n 200", m, z);
    int rc = t_nerve(args);
    T_CHECK(rc == 0, "exit %d: %s", rc, t_err);
    nv_file_read_all(want_path, &want, NULL);
    T_CHECK(want && strcmp(t_out, want) == 0, "stdout differs from the llama2.c golden:\n%s", t_out);
    T_CHECK(strstr(t_err, "tok/s") != NULL, "no tok/s summary on stderr");
    free(want);
}

/* Every fp32 engine keeps the golden; an engine that is off on this machine is reported, not failed. */
static void test_generate_fp32_engines_match_golden(void) {
    const char *m = t_data("models/stories260K.bin"), *z = t_data("models/tok512.bin");
    const char *want_path = t_data("models/stories260K_greedy200.expected.txt");
    if (!m || !z || !want_path) return;
    char *want = NULL, args[2048];
    nv_file_read_all(want_path, &want, NULL);
    const char *engines[] = {"scalar", "avx2", "avx512"};
    int ran = 0;
    for (size_t i = 0; i < sizeof engines / sizeof engines[0]; i++) {
        snprintf(args, sizeof args, "generate -m %s -z %s -t 0 -n 200 --engine %s", m, z, engines[i]);
        int rc = t_nerve(args);
        if (rc == 1 && strstr(t_err, "is off")) {
            printf("    %s: off on this machine (%s)", engines[i], t_err);
            continue;
        }
        ran++;
        T_CHECK(rc == 0 && want && strcmp(t_out, want) == 0, "engine %s: rc %d, stdout differs: %s", engines[i], rc, t_out);
    }
    T_CHECK(ran >= 1, "no engine ran");
    free(want);
}

static void test_generate_seeded_and_prompted(void) {
    const char *m = t_data("models/stories260K.bin"), *z = t_data("models/tok512.bin");
    if (!m || !z) return;
    char args[2048], first[4096];
    snprintf(args, sizeof args, "generate -m %s -z %s -p 'Once upon a time' -n 80 -t 0.9 --top-p 0.9 -s 42", m, z);
    T_CHECK(t_nerve(args) == 0, "%s", t_err);
    snprintf(first, sizeof first, "%s", t_out);
    T_CHECK(strncmp(first, "Once upon a time", 16) == 0, "prompt not echoed: %s", first);
    T_CHECK(t_nerve(args) == 0 && strcmp(first, t_out) == 0, "same seed, different text");
    snprintf(args, sizeof args, "generate -m %s -z %s -p 'Once upon a time' -n 80 -t 0.9 --top-p 0.9 -s 43", m, z);
    T_CHECK(t_nerve(args) == 0 && strcmp(first, t_out) != 0, "different seeds, same text");
    /* fewer steps than prompt tokens: only the prompt's first pieces, no sampling */
    snprintf(args, sizeof args, "generate -m %s -z %s -p 'Once upon a time there was' -n 3 -t 0", m, z);
    T_CHECK(t_nerve(args) == 0, "%s", t_err);
    T_CHECK(strlen(t_out) > 0 && strlen(t_out) < 16, "steps < prompt printed '%s'", t_out);
    /* -f: the prompt from a file gives the same text as -p; with -p it is a usage error; a NUL byte refused */
    const char *pf = t_write("prompt.txt", "Once upon a time", 16);
    char pfile[700];
    snprintf(pfile, sizeof pfile, "%s", pf);
    snprintf(args, sizeof args, "generate -m %s -z %s -f %s -n 80 -t 0.9 --top-p 0.9 -s 42", m, z, pfile);
    T_CHECK(t_nerve(args) == 0 && strcmp(first, t_out) == 0, "-f gave other text: %s", t_out);
    snprintf(args, sizeof args, "generate -m %s -z %s -f %s -p x", m, z, pfile);
    T_CHECK(t_nerve(args) == 2 && strstr(t_err, "one or the other"), "-f and -p: %s", t_err);
    snprintf(args, sizeof args, "generate -m %s -z %s -f %s", m, z, t_write("nul.txt", "a\0b", 3));
    T_CHECK(t_nerve(args) == 1 && strstr(t_err, "NUL byte"), "a NUL byte: %s", t_err);
}

/* `generate -m m -z z run` and the same with `extra` print the same text. */
static void check_same_text(const char *m, const char *z, const char *run, const char *extra) {
    char args[4096], plain[8192];
    snprintf(args, sizeof args, "generate -m %s -z %s %s", m, z, run);
    T_CHECK(t_nerve(args) == 0, "%s: %s", run, t_err);
    snprintf(plain, sizeof plain, "%s", t_out);
    snprintf(args, sizeof args, "generate -m %s -z %s %s %s", m, z, run, extra);
    T_CHECK(t_nerve(args) == 0 && strcmp(plain, t_out) == 0, "%s: with %s:\n%s\nwithout:\n%s", run, extra, t_out, plain);
}

/* --spec-tokens: drafts checked in one forward pass change no byte of the output: llama2.c's golden
 * on every fp32 engine, seeded sampling with penalties and a prompt, JSON-constrained output, and a
 * run that ends at -n inside a draft; the summary counts the drafts (some accepted on the golden). */
static void test_generate_speculative(void) {
    const char *m = t_data("models/stories260K.bin"), *z = t_data("models/tok512.bin");
    const char *want_path = t_data("models/stories260K_greedy200.expected.txt");
    if (!m || !z || !want_path) return;
    char *want = NULL, args[2048];
    nv_file_read_all(want_path, &want, NULL);
    const char *engines[] = {"scalar", "avx512"};
    for (size_t i = 0; i < sizeof engines / sizeof engines[0]; i++) {
        snprintf(args, sizeof args, "generate -m %s -z %s -t 0 -n 200 --spec-tokens 8 --engine %s", m, z, engines[i]);
        int rc = t_nerve(args);
        if (rc == 1 && strstr(t_err, "is off")) continue;
        T_CHECK(rc == 0 && want && strcmp(t_out, want) == 0, "engine %s: rc %d, stdout differs: %s", engines[i], rc, t_out);
        int acc = -1, drafted = -1;
        const char *sum = strstr(t_err, "speculative decoding: ");
        if (sum) sscanf(sum, "speculative decoding: %d of %d", &acc, &drafted);
        T_CHECK(acc > 0 && drafted >= acc, "engine %s: summary '%s'", engines[i], t_err);
    }
    static const char *const runs[] = {
        "-p 'Once upon a time' -n 150 -t 0.8 --top-p 0.9 -s 7 --frequency-penalty 0.4 --presence-penalty 0.2",
        "-p 'Lily and Ben' -n 97 -t 1 -s 3",
        "-p 'The dog' -n 120 -t 0.9 -s 5 --json",
        "-n 256 -t 0 --spec-lookup-min 1 --spec-lookup-max 1",
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        char extra[64];
        snprintf(extra, sizeof extra, "--spec-tokens %d", i % 2 ? 16 : 3);
        check_same_text(m, z, runs[i], extra);
    }
    /* the low-precision engines that are on here: the same text with drafts as without */
    const char *lowp[] = {"avx512-bf16", "amx-bf16", "avx2-int8", "avx512-int8", "amx-int8"};
    for (size_t i = 0; i < sizeof lowp / sizeof lowp[0]; i++) {
        char plain[8192];
        snprintf(args, sizeof args, "generate -m %s -z %s -n 200 -t 0.9 -s 11 --engine %s", m, z, lowp[i]);
        int rc = t_nerve(args);
        if (rc == 1 && strstr(t_err, "is off")) continue;
        T_CHECK(rc == 0, "%s: %s", lowp[i], t_err);
        snprintf(plain, sizeof plain, "%s", t_out);
        snprintf(args, sizeof args, "generate -m %s -z %s -n 200 -t 0.9 -s 11 --engine %s --spec-tokens 8 --spec-lookup-min 1", m,
                 z, lowp[i]);
        T_CHECK(t_nerve(args) == 0 && !strcmp(plain, t_out), "%s: with drafts:\n%s\nwithout:\n%s", lowp[i], t_out, plain);
    }
    snprintf(args, sizeof args, "generate -m %s -z %s --spec-tokens 17", m, z);
    T_CHECK(t_nerve(args) == 2, "--spec-tokens 17 accepted");
    snprintf(args, sizeof args, "generate -m %s -z %s --spec-tokens 4 --spec-lookup-min 3 --spec-lookup-max 2", m, z);
    T_CHECK(t_nerve(args) == 2 && strstr(t_err, "--spec-lookup-min"), "min > max accepted: %s", t_err);
    free(want);
}

/* --model-draft: drafts from another model change no byte of the output either. The model as its own
 * draft on the same engine: llama2.c's golden, every draft accepted but where the run ends inside
 * one (so the draft's cache holds exactly the text's keys and values, across catching up after
 * refusals and after full acceptances); a Q4_0 export of it as the draft: the golden and seeded
 * sampling, with drafts refused; the usage errors and the drafts refused for another vocabulary or
 * tokenizer, each one line. */
static int spec_summary(int *acc, int *drafted) {
    const char *sum = strstr(t_err, "speculative decoding: ");
    *acc = *drafted = -1;
    return sum && sscanf(sum, "speculative decoding: %d of %d", acc, drafted) == 2;
}

static void test_generate_draft_model(void) {
    const char *m = t_data("models/stories260K.bin"), *z = t_data("models/tok512.bin");
    const char *want_path = t_data("models/stories260K_greedy200.expected.txt"), *big = t_data("gguf/llama-2-tiny-random.gguf");
    const char *corpus = t_data("corpus/tinystories_valid_head.txt");
    if (!m || !z || !want_path || !big || !corpus) return;
    char *want = NULL, args[4096], q4[512], other[512], othertok[512];
    nv_file_read_all(want_path, &want, NULL);
    int acc, drafted;
    for (int k = 1; k <= 16; k *= 4) {
        snprintf(args, sizeof args, "generate -m %s -z %s -t 0 -n 200 --engine avx2 --model-draft %s --draft-engine avx2 --spec-tokens %d --draft-p-min 0",
                 m, z, m, k);
        T_CHECK(t_nerve(args) == 0 && want && !strcmp(t_out, want), "self draft, k %d: %s%s", k, t_out, t_err);
        T_CHECK(spec_summary(&acc, &drafted) && acc > 90 && drafted - acc < k, "self draft, k %d: %s", k, t_err);
    }
    snprintf(q4, sizeof q4, "%s", t_path("draft_q4.gguf"));
    snprintf(args, sizeof args, "export %s -z %s -o %s --type q4_0", m, z, q4);
    T_CHECK(t_nerve(args) == 0, "export: %s", t_err);
    snprintf(args, sizeof args, "generate -m %s -z %s -t 0 -n 200 --model-draft %s", m, z, q4);
    T_CHECK(t_nerve(args) == 0 && want && !strcmp(t_out, want), "Q4_0 draft: %s", t_out);
    T_CHECK(spec_summary(&acc, &drafted) && acc > 50 && drafted >= acc, "Q4_0 draft: %s", t_err);
    /* --draft-p-min: a draft the draft model doubts is not proposed: fewer drafts, more of them accepted */
    int acc0, drafted0;
    snprintf(args, sizeof args, "generate -m %s -z %s -t 0 -n 200 --model-draft %s --draft-p-min 0", m, z, q4);
    T_CHECK(t_nerve(args) == 0 && want && !strcmp(t_out, want) && spec_summary(&acc0, &drafted0), "p-min 0: %s", t_err);
    snprintf(args, sizeof args, "generate -m %s -z %s -t 0 -n 200 --model-draft %s --draft-p-min 0.95", m, z, q4);
    T_CHECK(t_nerve(args) == 0 && want && !strcmp(t_out, want) && spec_summary(&acc, &drafted), "p-min 0.95: %s", t_err);
    T_CHECK(drafted < drafted0 && (double)acc / drafted > (double)acc0 / drafted0, "p-min 0.95: %d of %d; 0: %d of %d", acc,
            drafted, acc0, drafted0);
    static const char *const runs[] = {
        "-p 'Once upon a time' -n 150 -t 0.8 --top-p 0.9 -s 7 --frequency-penalty 0.4 --presence-penalty 0.2",
        "-p 'The dog' -n 120 -t 0.9 -s 5 --json",
        "-p 'Lily and Ben' -n 97 -t 1 -s 3 --engine scalar",
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        char extra[700];
        snprintf(extra, sizeof extra, "-md %s --spec-tokens %d", q4, i ? 5 : 12);
        check_same_text(m, z, runs[i], extra);
    }
    /* a GGUF draft with 512 tokens of another tokenizer */
    snprintf(othertok, sizeof othertok, "%s", t_path("other512.bin"));
    snprintf(other, sizeof other, "%s", t_path("draft_other.gguf"));
    snprintf(args, sizeof args, "tokenizer train --vocab 512 %s -o %s", corpus, othertok);
    T_CHECK(t_nerve(args) == 0, "tokenizer train: %s", t_err);
    snprintf(args, sizeof args, "export %s -z %s -o %s", m, othertok, other);
    T_CHECK(t_nerve(args) == 0, "export: %s", t_err);
    struct {
        const char *flags;
        int rc;
        const char *says;
    } bad[] = {
        {"--model-draft %s", 1, "tokenizer differs from the model's"},
        {"--model-draft %s", 1, "vocabulary of 32000 tokens"},
        {"--model-draft %s", 1, "--model-draft"},
        {"--model-draft %s --spec-lookup-min 1", 2, "not with --model-draft"},
        {"--model-draft %s --spec-tokens 0", 2, "at least 1"},
        {"--draft-engine avx2 --spec-tokens 2%.0s", 2, "--draft-engine needs --model-draft"},
        {"--draft-p-min 0.5%.0s", 2, "--draft-p-min needs --model-draft"},
        {"--model-draft %s --draft-p-min 1.5", 2, "--draft-p-min"},
        {"--model-draft %s --draft-engine warp9", 2, "warp9"},
    };
    const char *files[] = {other, big, z, q4, q4, "", "", q4, q4};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char flags[1024];
        snprintf(flags, sizeof flags, bad[i].flags, files[i]);
        snprintf(args, sizeof args, "generate -m %s -z %s -n 20 %s", m, z, flags);
        int rc = t_nerve(args), lines = 0;
        for (const char *p = t_err; *p; p++) lines += *p == '\n';
        T_CHECK(rc == bad[i].rc && strstr(t_err, bad[i].says) && lines == 1, "%s: rc %d, '%s'", flags, rc, t_err);
    }
    free(want);
}

/* --json-schema / --json: what generate prints after the prompt is JSON the schema accepts (the
 * run ends when it is whole), for every seed; conflicting or bad schemas are one-line errors. */
static void test_generate_json(void) {
    const char *m = t_data("models/stories260K.bin"), *z = t_data("models/tok512.bin");
    if (!m || !z) return;
    char args[2048], path[600];
    snprintf(path, sizeof path, "%s/schema.json", t_tmpdir());
    FILE *f = fopen(path, "w");
    fputs("{\"type\":\"object\",\"properties\":{\"mood\":{\"enum\":[\"happy\",\"sad\"]},"
          "\"count\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":9}},\"required\":[\"mood\",\"count\"]}", f);
    fclose(f);
    int whole = 0;
    for (int seed = 1; seed <= 4; seed++) {
        snprintf(args, sizeof args, "generate -m %s -z %s -p 'Lily was' -n 120 -t 1 -s %d --json-schema %s", m, z, seed, path);
        T_CHECK(t_nerve(args) == 0, "seed %d: %s", seed, t_err);
        T_CHECK(!strncmp(t_out, "Lily was", 8), "the prompt is printed first: %s", t_out);
        cJSON *j = cJSON_Parse(t_out + 8);
        if (!j) continue; /* cut by -n before it closed */
        whole++;
        const cJSON *mood = cJSON_GetObjectItem(j, "mood"), *count = cJSON_GetObjectItem(j, "count");
        T_CHECK(cJSON_IsString(mood) && (!strcmp(mood->valuestring, "happy") || !strcmp(mood->valuestring, "sad")) &&
                    cJSON_IsNumber(count) && count->valuedouble >= 1 && count->valuedouble <= 9 && cJSON_GetArraySize(j) == 2,
                "seed %d: %s", seed, t_out);
        cJSON_Delete(j);
    }
    T_CHECK(whole >= 3, "only %d of 4 answers were whole", whole);
    /* --json: an object (this story model fills its members with stories and rarely closes one
     * within the context, so: it opens one, and if it parses it is an object) */
    snprintf(args, sizeof args, "generate -m %s -z %s -n 60 -t 1 -s 1 --json", m, z);
    T_CHECK(t_nerve(args) == 0, "%s", t_err);
    const char *p = t_out + strspn(t_out, " \n\t");
    cJSON *j = cJSON_Parse(t_out);
    T_CHECK(*p == '{' && (j == NULL || cJSON_IsObject(j)), "--json: '%s'", t_out);
    cJSON_Delete(j);
    snprintf(args, sizeof args, "generate -m %s -z %s --json --json-schema %s", m, z, path);
    T_CHECK(t_nerve(args) == 2 && count_lines(t_err) == 1, "both: '%s'", t_err);
    snprintf(args, sizeof args, "generate -m %s -z %s --json-schema '{\"type\":\"string\",\"pattern\":\"\\\\bx\"}'", m, z);
    T_CHECK(t_nerve(args) == 1 && count_lines(t_err) == 1 && strstr(t_err, "'pattern'"), "pattern: '%s'", t_err);
    snprintf(args, sizeof args, "generate -m %s -z %s --json-schema %s/none.json", m, z, t_tmpdir());
    T_CHECK(t_nerve(args) == 1 && count_lines(t_err) == 1, "missing schema file: '%s'", t_err);
}

/* nerve chat: each line a user turn, the answers on stdout one a line. A later turn reuses the
 * cache's tokens and gives exactly the continuation a fresh run of the whole conversation gives
 * (the plain template: the turns are lines of one text, so generate of that text is the same
 * prompt); a '\' joins lines; /reset starts over (the first answer again); the cut is reported. */
static void test_chat(void) {
    const char *m = t_data("models/stories260K.bin"), *z = t_data("models/tok512.bin");
    if (!m || !z) return;
    char args[2048], want[4096];
    static const char turns[] = "Once upon a time\nThe dog\\\nran\n/reset\nOnce upon a time\n";
    const char *in = t_write("chat_in.txt", turns, strlen(turns));
    snprintf(args, sizeof args, "chat -m %s -z %s -t 0 -n 30 --engine avx2", m, z);
    T_CHECK(t_nerve_stdin(args, in) == 0 && count_lines(t_out) == 3, "chat: %s%s", t_out, t_err);
    char *first = strdup(t_out), *nl = strchr(first, '\n');
    char *second = nl ? nl + 1 : first, *nl2 = strchr(second, '\n');
    if (nl) *nl = 0;
    if (nl2) *nl2 = 0;
    T_CHECK(nl2 && !strncmp(nl2 + 1, first, strlen(first)), "/reset: the first answer again: %s", t_out);
    T_CHECK(strstr(t_err, "the answer was cut at 30 tokens (-n)") && strstr(t_err, "3 answers, 90 tokens"), "%s", t_err);
    /* the second turn, in full: "Once upon a time\n" + answer 1 + "\nThe dog\nran", continued */
    snprintf(want, sizeof want, "Once upon a time\n%s\nThe dog\nran", first);
    char *text_path = strdup(t_write("chat_prompt.txt", want, strlen(want)));
    char *prompt = NULL;
    nv_file_read_all(text_path, &prompt, NULL);
    snprintf(args, sizeof args, "generate -m %s -z %s -t 0 -n %zu --engine avx2 -p \"$(cat '%s')\"", m, z, (size_t)200, text_path);
    T_CHECK(t_nerve(args) == 0 && !strncmp(t_out, want, strlen(want)) && !strncmp(t_out + strlen(want), second, strlen(second)),
            "a later turn is not the continuation of the whole conversation:\n  chat:     %s\n  generate: %s", second,
            t_out + (strlen(t_out) > strlen(want) ? strlen(want) : 0));
    free(prompt);
    free(text_path);
    /* -p: one message, the same answer as the first line read, no input needed */
    snprintf(args, sizeof args, "chat -m %s -z %s -t 0 -n 30 --engine avx2 -p 'Once upon a time'", m, z);
    T_CHECK(t_nerve(args) == 0 && !strncmp(t_out, first, strlen(first)) && count_lines(t_out) == 1, "-p: '%s' %s", t_out, t_err);
    /* --system-file: the same answer as --system with the file's text (its last line break dropped) */
    snprintf(args, sizeof args, "chat -m %s -z %s -t 0 -n 30 --engine avx2 --system 'You tell stories.' -p 'Once upon a time'", m, z);
    T_CHECK(t_nerve(args) == 0, "--system: %s", t_err);
    char *with_system = strdup(t_out);
    snprintf(args, sizeof args, "chat -m %s -z %s -t 0 -n 30 --engine avx2 --system-file %s -p 'Once upon a time'", m, z,
             t_write("system.txt", "You tell stories.\n", 18));
    T_CHECK(t_nerve(args) == 0 && !strcmp(t_out, with_system) && strcmp(t_out, first) != 0, "--system-file: '%s' against '%s'", t_out,
            with_system);
    free(with_system);
    snprintf(args, sizeof args, "chat -m %s -z %s --system x --system-file %s -p Hi", m, z, t_path("system.txt"));
    T_CHECK(t_nerve(args) == 2 && strstr(t_err, "one or the other"), "both: %s", t_err);
    free(first);
    snprintf(args, sizeof args, "chat -m %s -z %s --ctx 16 -p 'a b c d e f g h i j k l m n o p q r s t u v w x y z'", m, z);
    T_CHECK(t_nerve(args) == 1 && strstr(t_err, "more than the context"), "-p too long: %s", t_err);
    /* --chat-template-file: a Jinja text recognised by its markers, as serve's; another one run as Jinja (the same
       prompt, so the same answer, as the plain template's text with the BOS it writes); one that does not parse
       refused in one line naming its line */
    const char *jt = t_write("chatml.jinja", "{% for m in messages %}{{ '<|im_start|>' + m.role }}{% endfor %}", 64);
    const char *ju = t_write("other.jinja", "{{ bos_token }}{{ messages[0].content }}", 40);
    const char *jbad = t_write("bad.jinja", "{{ bos_token }}\n{% if %}", 24);
    snprintf(args, sizeof args, "chat -m %s -z %s -t 0 -n 4 --chat-template-file %s -p Hi", m, z, jt);
    T_CHECK(t_nerve(args) == 0, "--chat-template-file: %s", t_err);
    snprintf(args, sizeof args, "chat -m %s -z %s -t 0 -n 8 --chat-template plain -p 'Once upon a time'", m, z);
    T_CHECK(t_nerve(args) == 0, "plain: %s", t_err);
    char *plain = strdup(t_out);
    snprintf(args, sizeof args, "chat -m %s -z %s -t 0 -n 8 --chat-template-file %s -p 'Once upon a time'", m, z, ju);
    T_CHECK(t_nerve(args) == 0 && !strcmp(t_out, plain) && strstr(t_err, "run as Jinja"), "run: '%s' against '%s': %s", t_out, plain, t_err);
    snprintf(args, sizeof args, "chat -m %s -z %s -t 0 -n 8 --chat-template plain --jinja -p 'Once upon a time'", m, z);
    T_CHECK(t_nerve(args) == 0 && !strcmp(t_out, plain), "--jinja: '%s' against '%s': %s", t_out, plain, t_err);
    /* a template whose prompt opens the answer's think block: shown before the answer (the same tokens) */
    static const char think_tmpl[] = "{{ bos_token }}{{ messages[0].content }}<think>\n";
    const char *jthink = t_write("think.jinja", think_tmpl, sizeof think_tmpl - 1);
    /* (the exact engine: the same words after <think> on any CPU) */
    snprintf(args, sizeof args, "chat -m %s -z %s -t 0 -n 8 --engine avx2 --chat-template-file %s -p 'Once upon a time'", m, z, jthink);
    T_CHECK(t_nerve(args) == 0 && !strncmp(t_out, "<think>\n", 8) && strlen(t_out) > 9, "think: '%s': %s", t_out, t_err);
    free(plain);
    snprintf(args, sizeof args, "chat -m %s -z %s --chat-template-file %s -p Hi", m, z, jbad);
    T_CHECK(t_nerve(args) == 1 && count_lines(t_err) == 1 && strstr(t_err, "bad.jinja") && strstr(t_err, "line 2"), "%s", t_err);
    snprintf(args, sizeof args, "serve -m %s -z %s --chat-template-file /nonexistent/t.jinja", m, z);
    T_CHECK(t_nerve(args) == 1 && count_lines(t_err) == 1 && strstr(t_err, "--chat-template-file"), "serve: %s", t_err);
    snprintf(args, sizeof args, "chat -m %s -z %s --chat-template jinja", m, z);
    T_CHECK(t_nerve(args) == 2 && count_lines(t_err) == 1 && strstr(t_err, "unknown chat template"), "%s", t_err);
    T_CHECK(t_nerve("chat -z x") == 2 && count_lines(t_err) == 1, "no -m: %s", t_err);
    snprintf(args, sizeof args, "chat -m %s -z %s --ctx 16 -t 0", m, z);
    static const char long_turn[] = "a b c d e f g h i j k l m n o p q r s t u v w x y z\n";
    const char *long_in = t_write("chat_long.txt", long_turn, strlen(long_turn));
    T_CHECK(t_nerve_stdin(args, long_in) == 0 && strstr(t_err, "more than the context of 16 holds"), "%s", t_err);
}

static void test_init_then_generate(void) {
    const char *z = t_data("models/tok512.bin");
    if (!z) return;
    char args[2048];
    snprintf(args, sizeof args, "init --preset stories260K --seq-len 128 --seed 5 -o %s/init.bin", t_tmpdir());
    T_CHECK(t_nerve(args) == 0, "init failed: %s", t_err);
    snprintf(args, sizeof args, "generate -m %s/init.bin -z %s -n 20 -t 0", t_tmpdir(), z);
    T_CHECK(t_nerve(args) == 0, "generate from init failed: %s", t_err);
    snprintf(args, sizeof args, "init --preset nope -o %s/x.bin", t_tmpdir());
    T_CHECK(t_nerve(args) == 2 && count_lines(t_err) == 1, "bad preset: %s", t_err);
}

/* Files written whole: the mode of the file replaced is kept, a link planted at the temporary name is
 * not followed, and a writing command stopped by SIGINT part way leaves neither its temporary file
 * nor a part of its output. */
static void test_atomic_writes(void) {
    char path[700], tmpname[760], victim[700];
    snprintf(path, sizeof path, "%s/atomic.txt", t_tmpdir());
    snprintf(victim, sizeof victim, "%s/victim.txt", t_tmpdir());
    FILE *f = fopen(path, "w");
    if (f) fputs("old", f), fclose(f);
    chmod(path, 0660); /* (group write: a umask of 022 would take it from a new file) */
    f = fopen(victim, "w");
    if (f) fputs("keep", f), fclose(f);
    snprintf(tmpname, sizeof tmpname, "%s.tmp.%ld", path, (long)getpid());
    T_CHECK(symlink(victim, tmpname) == 0, "a link at %s", tmpname);
    const mode_t mask = umask(022);
    T_CHECK(nv_file_write_atomic(path, &(nv_iov){"new", 3}, 1) == NV_OK, "%s", nv_errmsg());
    umask(mask);
    struct stat st;
    char *text = NULL, *kept = NULL;
    nv_file_read_all(path, &text, NULL);
    nv_file_read_all(victim, &kept, NULL);
    T_CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0660 && text && !strcmp(text, "new") && kept && !strcmp(kept, "keep") &&
                lstat(tmpname, &st) != 0,
            "mode %o, '%s', the link's target '%s'", (unsigned)(st.st_mode & 0777), text ? text : "", kept ? kept : "");
    free(text), free(kept);
    /* a rename that fails (a folder where the file goes) leaves no temporary file */
    char folder[700], folder_tmp[760];
    snprintf(folder, sizeof folder, "%s/a_folder", t_tmpdir());
    snprintf(folder_tmp, sizeof folder_tmp, "%s.tmp.%ld", folder, (long)getpid());
    T_CHECK(mkdir(folder, 0700) == 0 && nv_file_write_atomic(folder, &(nv_iov){"x", 1}, 1) == NV_EIO && access(folder_tmp, F_OK) != 0,
            "writing over a folder: %s, its temporary file %s", nv_errmsg(), access(folder_tmp, F_OK) ? "removed" : "left");
    /* nerve init of a large model, stopped while it writes (its temporary file seen) */
    char out[700], cmd[2048];
    snprintf(out, sizeof out, "%s/big.bin", t_tmpdir());
    snprintf(cmd, sizeof cmd, "exec '%s' init --preset stories110M -o '%s' 2>/dev/null", t_nerve_bin(), out);
    const pid_t pid = fork();
    if (pid == 0) {
        signal(SIGINT, SIG_DFL); /* (a shell may have started the tests with it ignored) */
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    snprintf(tmpname, sizeof tmpname, "%s.tmp.%ld", out, (long)pid);
    int seen = 0;
    for (int i = 0; i < 60000 && !seen && waitpid(pid, NULL, WNOHANG) == 0; i++) {
        seen = access(tmpname, F_OK) == 0;
        if (!seen) usleep(500);
    }
    if (seen) kill(pid, SIGINT);
    int wst = 0;
    waitpid(pid, &wst, 0);
    T_CHECK(seen && WIFSIGNALED(wst) && WTERMSIG(wst) == SIGINT && access(tmpname, F_OK) != 0 && access(out, F_OK) != 0,
            "init stopped while writing: temporary file %s, status %d, it %s, the output %s", seen ? "seen" : "never seen", wst,
            access(tmpname, F_OK) ? "removed" : "left", access(out, F_OK) ? "absent" : "there");
    /* an export in split files stopped while the second is written: the first, whole by then, is
       removed with it, and no file takes its name */
    char model[700], base[700], first[760], second[760];
    snprintf(model, sizeof model, "%s/s15.bin", t_tmpdir());
    snprintf(base, sizeof base, "%s/s15.gguf", t_tmpdir());
    snprintf(cmd, sizeof cmd, "init --preset stories15M -o %s", model);
    T_CHECK(t_nerve(cmd) == 0, "init: %s", t_err);
    /* the files' count, from a whole export of the same under another name */
    snprintf(cmd, sizeof cmd, "export %s -o %s/whole15.gguf --split-max-size 6M", model, t_tmpdir());
    int n_files = 0;
    T_CHECK(t_nerve(cmd) == 0 && strstr(t_err, "nerve: wrote ") && sscanf(strstr(t_err, "nerve: wrote "), "nerve: wrote %d files", &n_files) == 1 &&
                n_files >= 4,
            "export: %s", t_err);
    snprintf(cmd, sizeof cmd, "exec '%s' export '%s' -o '%s' --split-max-size 6M 2>/dev/null", t_nerve_bin(), model, base);
    const pid_t ex = fork();
    if (ex == 0) {
        signal(SIGINT, SIG_DFL);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    snprintf(first, sizeof first, "%s/s15-00001-of-%05d.gguf", t_tmpdir(), n_files);
    snprintf(second, sizeof second, "%s/s15-00002-of-%05d.gguf.tmp.%ld", t_tmpdir(), n_files, (long)ex);
    seen = 0;
    for (int i = 0; i < 60000 && n_files && !seen && waitpid(ex, NULL, WNOHANG) == 0; i++) {
        seen = access(second, F_OK) == 0;
        if (!seen) usleep(200);
    }
    if (seen) kill(ex, SIGINT);
    waitpid(ex, &wst, 0);
    snprintf(tmpname, sizeof tmpname, "%s/s15-00001-of-%05d.gguf.tmp.%ld", t_tmpdir(), n_files, (long)ex);
    T_CHECK(seen && WIFSIGNALED(wst) && WTERMSIG(wst) == SIGINT && access(tmpname, F_OK) != 0 && access(second, F_OK) != 0 &&
                access(first, F_OK) != 0,
            "export stopped while writing its second file (of %d): %s, status %d", n_files, seen ? "seen" : "never seen", wst);
}

static void test_tokenize(void) {
    const char *z = t_data("tokenizers/tokenizer.bin");
    if (!z) return;
    char args[2048];
    snprintf(args, sizeof args, "tokenize -z %s 'Hello world'", z);
    T_CHECK(t_nerve(args) == 0 && strcmp(t_out, "15043 3186\n") == 0, "got '%s' %s", t_out, t_err);
    snprintf(args, sizeof args, "tokenize -z %s --bos 'Hello world'", z);
    T_CHECK(t_nerve(args) == 0 && strcmp(t_out, "1 15043 3186\n") == 0, "got '%s' %s", t_out, t_err);
    /* NUL-separated texts on stdin, one line each: the last without its NUL, an empty one */
    snprintf(args, sizeof args, "tokenize -z %s --null-separated", z);
    char path[600];
    snprintf(path, sizeof path, "%s/texts", t_tmpdir());
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite("Hello world\0\0Hello", 1, 19, f);
        fclose(f);
    }
    T_CHECK(t_nerve_stdin(args, path) == 0 && strcmp(t_out, "15043 3186\n\n15043\n") == 0, "got '%s' %s", t_out, t_err);
    snprintf(args, sizeof args, "tokenize -z %s --null-separated 'Hello'", z);
    T_CHECK(t_nerve(args) == 2 && count_lines(t_err) == 1, "TEXT with --null-separated: %s", t_err);
}

static void test_bad_input_one_line_errors(void) {
    const char *z = t_data("models/tok512.bin");
    if (!z) return;
    char args[2048], path[600];
    snprintf(path, sizeof path, "%s/garbage.bin", t_tmpdir());
    FILE *f = fopen(path, "wb");
    for (int i = 0; i < 1000; i++) fputc((i * 7919) & 0xff, f);
    fclose(f);
    snprintf(args, sizeof args, "generate -m %s -z %s", path, z);
    int rc = t_nerve(args);
    T_CHECK(rc == 1 && count_lines(t_err) == 1 && strstr(t_err, "nerve generate:"), "garbage model: rc %d '%s'", rc, t_err);
    snprintf(args, sizeof args, "generate -m %s/missing.bin -z %s", t_tmpdir(), z);
    T_CHECK(t_nerve(args) == 1 && count_lines(t_err) == 1, "missing model: '%s'", t_err);
    const char *m = t_data("models/stories260K.bin");
    if (!m) return;
    /* a tokenizer with a different vocabulary size than the model */
    const char *big = t_data("tokenizers/tokenizer.bin");
    if (big) {
        snprintf(args, sizeof args, "generate -m %s -z %s -n 5", m, big);
        T_CHECK(t_nerve(args) != 0 && count_lines(t_err) == 1, "mismatched tokenizer: '%s'", t_err);
    }
    const char *bad_args[] = {"generate", "generate -m", "generate -m x -n -3", "generate -m x -t abc",
                              "generate -m x --top-p 2", "generate -m x --bogus 1", "frobnicate", "init -o"};
    for (size_t i = 0; i < sizeof bad_args / sizeof bad_args[0]; i++) {
        rc = t_nerve(bad_args[i]);
        T_CHECK(rc == 2, "'%s' exit %d", bad_args[i], rc);
    }
    snprintf(args, sizeof args, "generate -m %s -z %s --engine warp-drive", m, z);
    T_CHECK(t_nerve(args) == 2 && count_lines(t_err) == 1, "bad engine: '%s'", t_err);
}

static void test_info(void) {
    /* the build: "nerve COMMIT (...)", one line, by either spelling; an unknown command is a 2 */
    T_CHECK(t_nerve("--version") == 0 && !strncmp(t_out, "nerve ", 6) && count_lines(t_out) == 1 && !strstr(t_out, "nerve  "),
            "--version: '%s'", t_out);
    T_CHECK(t_nerve("version") == 0 && !strncmp(t_out, "nerve ", 6), "version: '%s'", t_out);
    T_CHECK(t_nerve("--versions") == 2, "an unknown command accepted");
    T_CHECK(t_nerve("info") == 0, "info failed: %s", t_err);
    /* its output into a full disk: a failure, said in one line */
    char full[1200], err_path[700], *said = NULL;
    snprintf(err_path, sizeof err_path, "%s/full_err.txt", t_tmpdir());
    snprintf(full, sizeof full, "'%s' info > /dev/full 2> '%s'", t_nerve_bin(), err_path);
    const int full_st = system(full);
    nv_file_read_all(err_path, &said, NULL);
    T_CHECK(WIFEXITED(full_st) && WEXITSTATUS(full_st) == 1 && said && count_lines(said) == 1 && strstr(said, "writing its output failed"),
            "info into /dev/full: status %d, '%s'", full_st, said ? said : "");
    free(said);
    const char *want[] = {"nerve:", "cpu:", "cores:", "memory:", "AVX2", "AVX-512F", "AVX512-BF16", "AMX-TILE", "AMX-BF16", "AMX-INT8",
                          "amx:", "scalar"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        T_CHECK(strstr(t_out, want[i]) != NULL, "info lacks '%s'", want[i]);
    /* -m: what a model is; a GGUF file's tensors by type (stories260K's Q8_0 export: rows of 64 are whole
       blocks, the norms stay F32; 8.5 bits per Q8_0 value: 34 bytes a block of 32) */
    const char *m = t_data("models/stories260K.bin"), *z = t_data("models/tok512.bin");
    if (!m || !z) return;
    char args[1400], out[700];
    snprintf(out, sizeof out, "%s/info_q8.gguf", t_tmpdir());
    snprintf(args, sizeof args, "export %s -z %s -o %s --type q8_0", m, z, out);
    T_CHECK(t_nerve(args) == 0, "export: %s", t_err);
    snprintf(args, sizeof args, "info -m %s", out);
    T_CHECK(t_nerve(args) == 0 && strstr(t_out, "dim 64, layers 5, heads 8/4 x 8, hidden 172, vocab 512") && strstr(t_out, "GGUF v3") &&
                strstr(t_out, "params:   0.26 M") && strstr(t_out, "F32 ") && strstr(t_out, "8.50 bits per value"),
            "info -m: %s%s", t_out, t_err);
    const char *q8 = strstr(t_out, "Q8_0");
    T_CHECK(q8 && strstr(q8, "8.50 bits per value"), "info -m: no Q8_0 line: %s", t_out);
    /* in llama-gguf-split's files: info from the first gives the whole model; the flags want a GGUF
       output and a size */
    snprintf(args, sizeof args, "export %s -z %s -o %s/info_split.gguf --type q8_0 --split-max-tensors 20", m, z, t_tmpdir());
    T_CHECK(t_nerve(args) == 0 && strstr(t_err, "wrote 3 files") && strstr(t_err, "info_split-00001-of-00003.gguf to ") &&
                strstr(t_err, "info_split-00003-of-00003.gguf"),
            "export in split files: %s", t_err);
    snprintf(args, sizeof args, "info -m %s/info_split-00001-of-00003.gguf", t_tmpdir());
    T_CHECK(t_nerve(args) == 0 && strstr(t_out, "split in 3 files") && strstr(t_out, "tensors:  47,"), "info -m of split files: %s%s", t_out, t_err);
    snprintf(args, sizeof args, "export %s -o %s/x.bin --split-max-size 1G", m, t_tmpdir());
    T_CHECK(t_nerve(args) == 2 && strstr(t_err, "GGUF output") && count_lines(t_err) == 1, "split flags on a llama2.c output: %s", t_err);
    snprintf(args, sizeof args, "export %s -o %s/x.gguf --split-max-size 0", m, t_tmpdir());
    T_CHECK(t_nerve(args) == 2 && count_lines(t_err) == 1, "--split-max-size 0: %s", t_err);
    snprintf(args, sizeof args, "info -m %s/absent.gguf", t_tmpdir());
    const int rc = t_nerve(args);
    T_CHECK(rc == 1 && count_lines(t_err) == 1, "info -m of a missing file: exit %d, '%s'", rc, t_err);
}

int main(void) {
    T_RUN(test_generate_reproduces_llama2c_greedy);
    T_RUN(test_generate_fp32_engines_match_golden);
    T_RUN(test_generate_seeded_and_prompted);
    T_RUN(test_generate_speculative);
    T_RUN(test_generate_draft_model);
    T_RUN(test_generate_json);
    T_RUN(test_chat);
    T_RUN(test_init_then_generate);
    T_RUN(test_tokenize);
    T_RUN(test_atomic_writes);
    T_RUN(test_bad_input_one_line_errors);
    T_RUN(test_info);
    return t_done();
}
