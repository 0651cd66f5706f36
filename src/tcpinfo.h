/*
 * tcpinfo.h -- what the kernel counts of a TCP connection beyond glibc's <netinet/tcp.h>.
 */
#ifndef ESX_TCPINFO_H
#define ESX_TCPINFO_H

/* The bytes this process has read from TCP socket fd since it connected (received, less those
 * still waiting to be read).  Returns 0, or -1 when the kernel does not tell. */
int esx_tcp_consumed(int fd, unsigned long long *out);

#endif
