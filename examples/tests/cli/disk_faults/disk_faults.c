/* Disk faults for one process, preloaded by the tests (LD_PRELOAD), each set by a variable:
 *
 * - HLAT_TEST_DISK_BYTES=N: a full disk. Once the writes to regular files have used N bytes,
 *   every further write to a regular file fails with ENOSPC, as on a file system that has run
 *   out of space.
 * - HLAT_TEST_FAIL_PATH=TEXT: a failing folder. Every write to a regular file whose path contains
 *   TEXT fails with ENOSPC.
 * - HLAT_TEST_STALL_PATH=TEXT and HLAT_TEST_STALL_MARKER=FILE: a write that never ends. The first
 *   write to a regular file whose path contains TEXT creates FILE and then blocks its thread for
 *   good (until the test kills the process); the process's other threads go on.
 * - HLAT_TEST_STALL_RENAME=TEXT and HLAT_TEST_STALL_MARKER=FILE: the same at the first rename of
 *   a path ending with TEXT.
 * - HLAT_TEST_SLOW_PATH=TEXT and HLAT_TEST_SLOW_MS=N: a slow disk. Every write to a regular file
 *   whose path contains TEXT first waits N milliseconds. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static long long space_left = -1;
static int stalled = 0;

/* Whether `path` contains the text of the variable `name` (set and not empty). */
static int names(const char *path, const char *name) {
    const char *text = getenv(name);
    return text && *text && path && strstr(path, text);
}

/* Creates the stall marker, then blocks the calling thread for good. */
static void stall(void) {
    const char *marker = getenv("HLAT_TEST_STALL_MARKER");
    if (marker) {
        int fd = open(marker, O_CREAT | O_WRONLY, 0644);
        if (fd >= 0) close(fd);
    }
    for (;;) pause();
}

/* Before a rename of `path`: stalls when HLAT_TEST_STALL_RENAME ends it. */
static void before_rename(const char *path) {
    const char *text = getenv("HLAT_TEST_STALL_RENAME");
    size_t length = path ? strlen(path) : 0, ending = text ? strlen(text) : 0;
    if (!stalled && ending > 0 && length >= ending && strcmp(path + length - ending, text) == 0) {
        stalled = 1;
        stall();
    }
}

/* Whether `count` more bytes may be written to `fd` (always, unless it is a regular file); takes
 * them from the disk's space when they may. Sets errno when they may not. */
static int fits(int fd, size_t count) {
    struct stat status;
    if (fstat(fd, &status) != 0 || !S_ISREG(status.st_mode)) {
        return 1;
    }
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t length = readlink(link, path, sizeof path - 1);
    path[length > 0 ? length : 0] = '\0';
    if (!stalled && names(path, "HLAT_TEST_STALL_PATH")) {
        stalled = 1;
        stall();
    }
    if (names(path, "HLAT_TEST_SLOW_PATH")) {
        const char *millis = getenv("HLAT_TEST_SLOW_MS");
        usleep((useconds_t)(millis ? atoll(millis) : 0) * 1000);
    }
    if (names(path, "HLAT_TEST_FAIL_PATH")) {
        errno = ENOSPC;
        return 0;
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

int rename(const char *old_path, const char *new_path) {
    static int (*next)(const char *, const char *);
    if (!next) next = (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename");
    before_rename(old_path);
    return next(old_path, new_path);
}

int renameat(int old_dir, const char *old_path, int new_dir, const char *new_path) {
    static int (*next)(int, const char *, int, const char *);
    if (!next) next = (int (*)(int, const char *, int, const char *))dlsym(RTLD_NEXT, "renameat");
    before_rename(old_path);
    return next(old_dir, old_path, new_dir, new_path);
}

int renameat2(int old_dir, const char *old_path, int new_dir, const char *new_path,
              unsigned int flags) {
    static int (*next)(int, const char *, int, const char *, unsigned int);
    if (!next)
        next = (int (*)(int, const char *, int, const char *, unsigned int))dlsym(RTLD_NEXT,
                                                                                "renameat2");
    before_rename(old_path);
    return next(old_dir, old_path, new_dir, new_path, flags);
}
