/* Reranking: how relevant each of a list of documents is to a query, scored by the served model
 * itself (/rerank, /v1/rerank, /v2/rerank, /score, /v1/score; no HTTP here).
 *
 * A pair (query, document) becomes one prompt; the model reads it to its end and the score is the
 * probability it gives its "yes" token against its "no" token at that position:
 * sigmoid(logit(yes) - logit(no)) (with one token alone, sigmoid(logit(yes))). This is how
 * Qwen3-Reranker is meant to be run (vLLM's from_2_way_softmax, llama.cpp's rank head made of
 * those two rows), and it turns any instruction-following model into an LLM-as-judge reranker.
 *
 * A GGUF reranker with a classification head (llama.cpp's cls.output: Qwen3-Reranker's two rows)
 * scores with that head on the prompt's last position the same way (2 outputs: the softmax's
 * first; 1: its sigmoid).
 *
 * The prompt is, in this order of preference: a template text with {query}, {document} and
 * {instruction} in it (--rerank-template, or a GGUF's tokenizer.chat_template.rerank), encoded as a
 * completion's prompt is; else the model's chat template on a system message telling the model to
 * answer "yes" or "no" and a user message "<Instruct>: I\n<Query>: Q\n<Document>: D", with the
 * generation prompt and thinking off: exactly Qwen3-Reranker's prompt on its own template.
 *
 * Request shapes: Jina's and vLLM's /rerank (query, documents as strings or {"text"}, top_n,
 * return_documents: true by default), text-embeddings-inference's /rerank (query, texts,
 * return_text, raw_scores; the answer a list), Cohere's /v2/rerank (the same, documents' text not
 * returned unless asked, max_tokens_per_doc) and vLLM's /score (text_1 and text_2: one against many
 * or pair by pair, scores in input order). */
#ifndef NV_SERVE_RERANK_H
#define NV_SERVE_RERANK_H

#include "serve/api.h"

/* Documents (or pairs) one request may score, and the tokens of all their prompts. */
#define NV_RERANK_MAX_DOCS 1000
#define NV_RERANK_MAX_TOKENS (1 << 22)

/* NV_RERANK_TEI: a /rerank body with "texts" in place of "documents" (Hugging Face's
 * text-embeddings-inference, as llama.cpp's server takes it) */
typedef enum { NV_RERANK_JINA = 0, NV_RERANK_COHERE, NV_RERANK_SCORE, NV_RERANK_TEI } nv_rerank_api;

typedef struct {
    int tok[NV_MAX_SCORE]; /* the tokens whose logits give the score: yes, then no */
    int n_tok;             /* 0: reranking is off, for the reason in off */
    char off[320];
    char *tmpl;        /* a prompt template with {query}, {document}, {instruction}; NULL: the chat template */
    char *instruction; /* what {instruction} and the chat prompt's <Instruct> say */
} nv_rerank;

/* tokens "YES[,NO]" (NULL: "yes,no", each the text of one token of the vocabulary: with the
 * default, a vocabulary without them leaves reranking off, saying why; given, it is an error);
 * a model with a classification head of head_rows outputs (a GGUF reranker's; 0: none) scores with
 * its first one against its second (or its only one) instead, and takes no tokens; tmpl (copied;
 * NULL: the chat template) must hold {query} and {document}; instruction NULL: the default (a web
 * search query's passages). */
nv_err nv_rerank_init(nv_rerank *rk, const nv_tokenizer *tok, int head_rows, const char *tokens, const char *tmpl,
                      const char *instruction);
void nv_rerank_free(nv_rerank *rk);
/* The relevance a scored prompt's logits (rk->n_tok of them) give: a probability; raw (TEI's
 * raw_scores): its logit, yes's less no's (or yes's alone). */
float nv_rerank_relevance(const nv_rerank *rk, const float *logits, int raw);

typedef struct {
    nv_rerank_api api;
    int n;            /* prompts (pairs) */
    int **ids, *n_ids; /* each pair's prompt */
    char **docs;      /* each pair's document as given, for return_documents */
    int one_query;    /* every pair's query is the same (its prompts open alike) */
    int raw;          /* TEI's raw_scores: logits, not probabilities */
    int top_n;        /* results kept, best first (n: all) */
    int return_documents;
    nv_adapter_mix lora;
    char model[NV_API_MODEL_ID];
} nv_rerank_req;

/* A request's body checked whole and its prompts made (0), or the error's status with err set. */
int nv_rerank_parse(const nv_api_ctx *ctx, const nv_rerank *rk, nv_rerank_api api, const char *body, size_t len,
                    nv_rerank_req *out, nv_api_error *err);
void nv_rerank_req_free(nv_rerank_req *r);
/* The response for relevance[i] of each prompt (NULL when out of memory): results best first
 * (ties in input order), or /score's data in input order. */
char *nv_rerank_response(const nv_rerank_req *r, const float *relevance, int prompt_tokens);

#endif
