/*
 * libFuzzer target: the IPC handle decoders (core/policy/ipc.c), which read bytes from another process.
 * Each input goes to xseg_ipc_deserialize (the flat form), and to xseg_ipc_recv three ways: over
 * a stream socket, as one seqpacket message, and as seqpacket messages of the wire format's
 * first part (the 48-byte header) and then the rest; the sending end is shut after the input, so
 * a receive that waits for more must fail, never hang. Any input must give a handle whose
 * description is consistent (the flat form round-trips) or XSEG_ERROR_INVALID_VALUE /
 * XSEG_ERROR_OUT_OF_MEMORY with the call's name in the message and no handle, never a crash or
 * a leak (ASan's leak check covers the handles; descriptors: none arrive here).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "xseg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define IPC_HEADER_BYTES 48 /* the wire header (core/policy/ipc.c struct ipc_wire) */

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_ipc: %s (last error: %s)\n", what, xseg_last_error());
        abort();
    }
}

/* A decoded handle: its description holds together. */
static void check_handle(const xseg_ipc_handle *h)
{
    xseg_ipc_info info;
    check(xseg_ipc_handle_info(h, &info) == XSEG_SUCCESS, "handle_info failed");
    check(info.nchunks >= 1 && info.size > 0, "empty handle accepted");
    check(info.offset < info.span && info.size <= info.span - info.offset, "block outside its chunks");
}

static void check_failure(xseg_status st, const xseg_ipc_handle *h, const char *fn)
{
    check(st == XSEG_ERROR_INVALID_VALUE || st == XSEG_ERROR_OUT_OF_MEMORY, "unexpected status");
    check(h == NULL, "a handle left after a failure");
    check(strncmp(xseg_last_error(), fn, strlen(fn)) == 0, "the message does not name the call");
}

/* Send @p data as messages of @p first bytes, then the rest (0: one message), shut the sending
 * end, and receive. Inputs the socket cannot take whole without waiting are skipped. */
static void recv_from(int type, const uint8_t *data, size_t size, size_t first)
{
    int sv[2];
    if (socketpair(AF_UNIX, type, 0, sv) != 0)
        return;
    size_t at = 0;
    bool whole = true;
    while (whole && at < size) {
        size_t n = first && at == 0 && first < size ? first : size - at;
        ssize_t r = send(sv[0], data + at, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        whole = r == (ssize_t)n;
        at += n;
    }
    shutdown(sv[0], SHUT_WR);
    if (whole) {
        xseg_ipc_handle *h = NULL;
        xseg_status st = xseg_ipc_recv(sv[1], &h);
        if (st == XSEG_SUCCESS) {
            check_handle(h);
            xseg_ipc_handle_free(h);
        } else {
            check_failure(st, h, "xseg_ipc_recv");
        }
    }
    close(sv[0]);
    close(sv[1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 65536)
        return 0;
    xseg_ipc_handle *h = NULL;
    xseg_status st = xseg_ipc_deserialize(data, size, &h);
    if (st == XSEG_SUCCESS) {
        check_handle(h);
        size_t len = 0;
        check(xseg_ipc_serialize(h, NULL, 0, &len) == XSEG_SUCCESS && len == size, "flat size differs");
        uint8_t *back = malloc(len);
        check(back != NULL, "out of memory");
        check(xseg_ipc_serialize(h, back, len, &len) == XSEG_SUCCESS, "serialize failed");
        /* The header's reserved word is written as zero; the rest comes back as it was. */
        check(memcmp(back, data, 20) == 0 && memcmp(back + 24, data + 24, size - 24) == 0,
              "the flat form does not round-trip");
        free(back);
        xseg_ipc_handle_free(h);
    } else {
        check_failure(st, h, "xseg_ipc_deserialize");
    }
    recv_from(SOCK_STREAM, data, size, 0);
    if (size > 0) {
        recv_from(SOCK_SEQPACKET, data, size, 0);
        recv_from(SOCK_SEQPACKET, data, size, IPC_HEADER_BYTES);
    }
    return 0;
}
