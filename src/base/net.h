/* Loopback TCP for the programs that drive `nerve serve` from outside: the serve bench and the
 * tests. The server itself listens through libmicrohttpd. */
#ifndef NV_NET_H
#define NV_NET_H

/* A blocking connection to 127.0.0.1:port whose sends and receives time out after timeout_s
 * seconds (close-on-exec), or -1. */
int nv_loopback_connect(int port, int timeout_s);

#endif
