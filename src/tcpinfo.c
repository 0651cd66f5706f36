/*
 * tcpinfo.c -- what the kernel counts of a TCP connection (tcpinfo.h).  <linux/tcp.h>, not
 * glibc's <netinet/tcp.h>, which has no tcpi_bytes_received: the two cannot be included in
 * one file, hence this one.
 */
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include "tcpinfo.h"

int esx_tcp_consumed(int fd, unsigned long long *out)
{
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    int unread = 0;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received ||
        ioctl(fd, SIOCINQ, &unread) != 0 || unread < 0 ||
        (unsigned long long)unread > ti.tcpi_bytes_received)
        return -1;
    *out = ti.tcpi_bytes_received - (unsigned long long)unread;
    return 0;
}
