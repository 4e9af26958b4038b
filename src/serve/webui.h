/* The chat page `nerve serve` answers GET / with (llama-server's web UI, in one file): a
 * conversation streamed from /v1/chat/completions, the model chosen from /v1/models, a system
 * message, temperature, max_tokens and the API key kept in the browser's local storage. Text is
 * shown as text, never as HTML. The page is src/serve/webui.html, built into the binary as it is. */
#ifndef NV_SERVE_WEBUI_H
#define NV_SERVE_WEBUI_H

/* The page, NUL-terminated. */
extern const char nv_webui_page[];

#endif
