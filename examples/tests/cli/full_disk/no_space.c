/* A full disk for one process, preloaded by the full-disk tests (LD_PRELOAD): once the writes
 * to regular files have used HLAT_TEST_DISK_BYTES bytes, every further write to a regular file
 * fails with ENOSPC, as on a file system that has run out of space. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static long long space_left = -1;

/* Whether `count` more bytes fit on the "disk" of `fd` (always, unless it is a regular file);
 * takes them when they do. */
static int fits(int fd, size_t count) {
    struct stat status;
    if (fstat(fd, &status) != 0 || !S_ISREG(status.st_mode)) {
        return 1;
    }
    if (space_left < 0) {
        const char *bytes = getenv("HLAT_TEST_DISK_BYTES");
        space_left = bytes ? atoll(bytes) : LLONG_MAX;
    }
    if ((long long)count > space_left) {
        space_left = 0;
        errno = ENOSPC;
        return 0;
    }
    space_left -= (long long)count;
    return 1;
}

ssize_t write(int fd, const void *buffer, size_t count) {
    static ssize_t (*next)(int, const void *, size_t);
    if (!next) next = (ssize_t (*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    return fits(fd, count) ? next(fd, buffer, count) : -1;
}

ssize_t pwrite64(int fd, const void *buffer, size_t count, off_t offset) {
    static ssize_t (*next)(int, const void *, size_t, off_t);
    if (!next) next = (ssize_t (*)(int, const void *, size_t, off_t))dlsym(RTLD_NEXT, "pwrite64");
    return fits(fd, count) ? next(fd, buffer, count, offset) : -1;
}

ssize_t writev(int fd, const struct iovec *vectors, int count) {
    static ssize_t (*next)(int, const struct iovec *, int);
    if (!next) next = (ssize_t (*)(int, const struct iovec *, int))dlsym(RTLD_NEXT, "writev");
    size_t total = 0;
    for (int index = 0; index < count; index++) total += vectors[index].iov_len;
    return fits(fd, total) ? next(fd, vectors, count) : -1;
}

ssize_t copy_file_range(int in, off_t *in_offset, int out, off_t *out_offset, size_t count,
                        unsigned int flags) {
    static ssize_t (*next)(int, off_t *, int, off_t *, size_t, unsigned int);
    if (!next)
        next = (ssize_t (*)(int, off_t *, int, off_t *, size_t, unsigned int))dlsym(
            RTLD_NEXT, "copy_file_range");
    return fits(out, count) ? next(in, in_offset, out, out_offset, count, flags) : -1;
}
