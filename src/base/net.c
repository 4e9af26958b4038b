#include "base/net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

int nv_loopback_connect(int port, int timeout_s) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    struct timeval tv = {timeout_s, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int nv_send_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return 0;
        p += k;
        n -= (size_t)k;
    }
    return 1;
}

int nv_recv_all(int fd, char **out, size_t *n) {
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        if (len + 4096 + 1 > cap) {
            char *b = realloc(buf, cap * 2);
            if (!b) break;
            buf = b, cap *= 2;
        }
        ssize_t k = recv(fd, buf + len, cap - len - 1, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        len += (size_t)k;
    }
    if (!buf) buf = calloc(1, 1), len = 0;
    if (buf) buf[len] = '\0';
    *out = buf;
    *n = len;
    return len > 0;
}

void nv_http_answer_free(nv_http_answer *a) {
    free(a->head);
    free(a->body);
    memset(a, 0, sizeof *a);
}

char *nv_http_request_text(const char *method, const char *path, const char *headers, const char *body, size_t *len) {
    const size_t blen = body ? strlen(body) : 0, cap = blen + strlen(method) + strlen(path) + 1024 + (headers ? strlen(headers) : 0);
    char *req = malloc(cap);
    if (!req) return NULL;
    int n = snprintf(req, cap, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s", method, path,
                     headers ? headers : "");
    if (body) n += snprintf(req + n, cap - (size_t)n, "Content-Type: application/json\r\nContent-Length: %zu\r\n", blen);
    n += snprintf(req + n, cap - (size_t)n, "\r\n");
    if (body) memcpy(req + n, body, blen);
    *len = (size_t)n + blen;
    return req;
}

int nv_http_answer_parse(const char *raw, size_t n, nv_http_answer *a) {
    memset(a, 0, sizeof *a);
    const char *sep = strstr(raw, "\r\n\r\n");
    if (!sep || sscanf(raw, "HTTP/1.%*d %d", &a->status) != 1) return 0;
    const size_t hl = (size_t)(sep - raw);
    const char *b = sep + 4, *end = raw + n;
    a->head = malloc(hl + 1);
    a->body = malloc((size_t)(end - b) + 1);
    if (!a->head || !a->body) {
        nv_http_answer_free(a);
        return 0;
    }
    memcpy(a->head, raw, hl);
    a->head[hl] = '\0';
    if (strcasestr(a->head, "Transfer-Encoding: chunked")) {
        while (b < end) { /* size line, data, CRLF; a size of 0 ends it */
            char *after;
            unsigned long sz = strtoul(b, &after, 16);
            const char *crlf = strstr(b, "\r\n");
            if (!crlf || after == b || sz == 0) break;
            b = crlf + 2;
            if (sz > (size_t)(end - b)) sz = (size_t)(end - b);
            memcpy(a->body + a->body_len, b, sz);
            a->body_len += sz;
            b += sz;
            b = (size_t)(end - b) >= 2 ? b + 2 : end;
        }
    } else {
        memcpy(a->body, b, (size_t)(end - b));
        a->body_len = (size_t)(end - b);
    }
    a->body[a->body_len] = '\0';
    return 1;
}

int nv_loopback_http(int port, int timeout_s, const char *method, const char *path, const char *headers, const char *body,
                     nv_http_answer *a) {
    memset(a, 0, sizeof *a);
    size_t len;
    char *req = nv_http_request_text(method, path, headers, body, &len);
    int fd = req ? nv_loopback_connect(port, timeout_s) : -1, ok = 0;
    if (fd >= 0 && nv_send_all(fd, req, len)) {
        char *raw;
        size_t n;
        ok = nv_recv_all(fd, &raw, &n) && nv_http_answer_parse(raw, n, a);
        free(raw);
    }
    if (fd >= 0) close(fd);
    free(req);
    return ok;
}

double nv_loopback_metric(int port, const char *name) {
    nv_http_answer r;
    double v = -1;
    if (nv_loopback_http(port, 60, "GET", "/metrics", NULL, NULL, &r) && r.status == 200) {
        const size_t nl = strlen(name);
        for (const char *p = r.body; *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : "")
            if (!strncmp(p, name, nl) && p[nl] == ' ') {
                v = atof(p + nl + 1);
                break;
            }
    }
    nv_http_answer_free(&r);
    return v;
}
