/* Loopback TCP and a small HTTP/1.1 client for the programs that drive a nerve server from
 * outside or beside it: `nerve batch`, the serve bench and the tests. The server itself listens
 * through libmicrohttpd. */
#ifndef NV_NET_H
#define NV_NET_H

#include <stddef.h>

/* A blocking connection to 127.0.0.1:port whose sends and receives time out after timeout_s
 * seconds (close-on-exec), or -1. */
int nv_loopback_connect(int port, int timeout_s);

/* n bytes sent whole (no SIGPIPE): 1, or 0 when the connection failed. */
int nv_send_all(int fd, const char *p, size_t n);
/* Everything the peer sends until it closes (or a receive times out): *out NUL-terminated and
 * malloc'd (also when nothing came), *n its bytes; 1 when something came. */
int nv_recv_all(int fd, char **out, size_t *n);

/* An HTTP/1.1 answer: its status, the status line and headers, and the body (de-chunked,
 * NUL-terminated). */
typedef struct {
    int status;
    char *head;
    char *body;
    size_t body_len;
} nv_http_answer;
void nv_http_answer_free(nv_http_answer *a);
/* "METHOD path HTTP/1.1" with Host, Connection: close, the header lines given (each ending in
 * \r\n, or NULL) and, with a body, its JSON Content-Type and Content-Length; malloc'd, *len its
 * bytes (NULL when out of memory). */
char *nv_http_request_text(const char *method, const char *path, const char *headers, const char *body, size_t *len);
/* Parses raw[0..n) (NUL-terminated) as a whole answer: 1, or 0 when it has no status line and
 * headers (a chunked body cut short keeps what came). */
int nv_http_answer_parse(const char *raw, size_t n, nv_http_answer *a);
/* One exchange with 127.0.0.1:port (Connection: close): 1 with *a filled, or 0 when no answer
 * came (no connection, a timeout before the headers). */
int nv_loopback_http(int port, int timeout_s, const char *method, const char *path, const char *headers, const char *body,
                     nv_http_answer *a);

/* The value of the line "name value" (name exact, labels included) of the server's GET /metrics,
 * or -1 when there is none or no answer came. */
double nv_loopback_metric(int port, const char *name);

#endif
