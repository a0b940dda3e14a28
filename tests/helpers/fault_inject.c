/* Test-only fault injector, loaded with LD_PRELOAD (no production code knows about it).
 *
 * It interposes the libc calls the eagle-io writer makes (open/open64, write/writev, fsync,
 * rename) and, once armed, acts on the Nth call whose path contains PATTERN:
 *
 *   spec = "ACTION:OP:PATTERN:N"   (PATTERN is a substring of the path; a trailing '$' makes it
 *                                  a suffix: "/shards$" is the shards directory itself)
 *   OP     write | fsync | open | rename_before | rename_after
 *          (write/fsync match the path of the fd, open the opened path, rename the new path)
 *   ACTION kill     SIGKILL the whole process at that call (before it runs; rename_after: after)
 *          tear     write: write the first half of the buffer, then SIGKILL (a torn write)
 *          ENOSPC | EFBIG | EACCES | EIO | EROFS
 *                   that call and every later matching call fail with this errno (sticky,
 *                   like a full disk)
 *
 * Armed from the EIO_FAULT environment variable at load time (for exec'd processes), or by
 * calling eio_fault_arm(spec) (through ctypes, e.g. in a forked child). eio_fault_hits()
 * returns how many matching calls were seen since arming.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

enum { OP_NONE, OP_WRITE, OP_FSYNC, OP_OPEN, OP_RENAME_BEFORE, OP_RENAME_AFTER };
enum { ACT_KILL = -1, ACT_TEAR = -2 };

static int g_op = OP_NONE;
static int g_action = 0; /* ACT_* or an errno value */
static long g_nth = 0;
static char g_pattern[256];
static int g_suffix = 0;
static long g_hits = 0;   /* matching calls seen */
static int g_failing = 0; /* sticky errno failure active */

static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_rename)(const char *, const char *);
static int (*real_open)(const char *, int, ...);
static int (*real_open64)(const char *, int, ...);

static void resolve(void) {
    if (real_write) return;
    real_writev = dlsym(RTLD_NEXT, "writev");
    real_fsync = dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    real_rename = dlsym(RTLD_NEXT, "rename");
    real_open = dlsym(RTLD_NEXT, "open");
    real_open64 = dlsym(RTLD_NEXT, "open64");
    real_write = dlsym(RTLD_NEXT, "write");
}

int eio_fault_arm(const char *spec) {
    char buf[400], *parts[4];
    int n = 0;
    resolve();
    g_op = OP_NONE;
    g_hits = 0;
    g_failing = 0;
    if (!spec || !*spec) return 0;
    snprintf(buf, sizeof buf, "%s", spec);
    for (char *s = buf, *tok; n < 4 && (tok = strsep(&s, ":")); ) parts[n++] = tok;
    if (n != 4) return -1;
    if (!strcmp(parts[0], "kill")) g_action = ACT_KILL;
    else if (!strcmp(parts[0], "tear")) g_action = ACT_TEAR;
    else if (!strcmp(parts[0], "ENOSPC")) g_action = ENOSPC;
    else if (!strcmp(parts[0], "EFBIG")) g_action = EFBIG;
    else if (!strcmp(parts[0], "EACCES")) g_action = EACCES;
    else if (!strcmp(parts[0], "EIO")) g_action = EIO;
    else if (!strcmp(parts[0], "EROFS")) g_action = EROFS;
    else return -1;
    snprintf(g_pattern, sizeof g_pattern, "%s", parts[2]);
    size_t plen = strlen(g_pattern);
    g_suffix = plen > 0 && g_pattern[plen - 1] == '$';
    if (g_suffix) g_pattern[plen - 1] = 0;
    g_nth = atol(parts[3]);
    if (!strcmp(parts[1], "write")) g_op = OP_WRITE;
    else if (!strcmp(parts[1], "fsync")) g_op = OP_FSYNC;
    else if (!strcmp(parts[1], "open")) g_op = OP_OPEN;
    else if (!strcmp(parts[1], "rename_before")) g_op = OP_RENAME_BEFORE;
    else if (!strcmp(parts[1], "rename_after")) g_op = OP_RENAME_AFTER;
    else return -1;
    return 0;
}

long eio_fault_hits(void) { return __atomic_load_n(&g_hits, __ATOMIC_SEQ_CST); }

__attribute__((constructor)) static void init(void) {
    resolve();
    eio_fault_arm(getenv("EIO_FAULT"));
}

static int path_matches(const char *path) {
    if (!path) return 0;
    if (!g_suffix) return strstr(path, g_pattern) != NULL;
    size_t n = strlen(path), m = strlen(g_pattern);
    return n >= m && strcmp(path + n - m, g_pattern) == 0;
}

static int fd_matches(int fd) {
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return 0;
    path[n] = 0;
    return path_matches(path);
}

/* 0: proceed normally; 1: this call is the trigger (or failing sticky). */
static int triggered(int op, int matches) {
    if (g_op != op || !matches) return 0;
    long hit = __atomic_add_fetch(&g_hits, 1, __ATOMIC_SEQ_CST);
    if (g_action > 0 && g_failing) return 1;
    if (hit != g_nth) return 0;
    if (g_action > 0) g_failing = 1;
    return 1;
}

static void die(void) { kill(getpid(), SIGKILL); for (;;) pause(); }

ssize_t write(int fd, const void *buf, size_t count) {
    resolve();
    if (g_op == OP_WRITE && triggered(OP_WRITE, fd_matches(fd))) {
        if (g_action == ACT_TEAR) { real_write(fd, buf, count / 2); die(); }
        if (g_action == ACT_KILL) die();
        errno = g_action;
        return -1;
    }
    return real_write(fd, buf, count);
}

ssize_t writev(int fd, const struct iovec *iov, int iovcnt) {
    resolve();
    if (g_op == OP_WRITE && triggered(OP_WRITE, fd_matches(fd))) {
        if (g_action == ACT_TEAR) {
            if (iovcnt > 0) real_write(fd, iov[0].iov_base, iov[0].iov_len / 2);
            die();
        }
        if (g_action == ACT_KILL) die();
        errno = g_action;
        return -1;
    }
    return real_writev(fd, iov, iovcnt);
}

static int sync_common(int fd, int (*real)(int)) {
    resolve();
    if (g_op == OP_FSYNC && triggered(OP_FSYNC, fd_matches(fd))) {
        if (g_action < 0) die();
        errno = g_action;
        return -1;
    }
    return real(fd);
}

int fsync(int fd) { return sync_common(fd, real_fsync); }
int fdatasync(int fd) { return sync_common(fd, real_fdatasync); }

int rename(const char *old, const char *new) {
    resolve();
    int m = g_op != OP_NONE && path_matches(new);
    if (g_op == OP_RENAME_BEFORE && triggered(OP_RENAME_BEFORE, m)) {
        if (g_action < 0) die();
        errno = g_action;
        return -1;
    }
    int rc = real_rename(old, new);
    if (g_op == OP_RENAME_AFTER && triggered(OP_RENAME_AFTER, m)) die();
    return rc;
}

static int open_common(int (*real)(const char *, int, ...), const char *path, int flags, mode_t mode) {
    if (g_op == OP_OPEN && triggered(OP_OPEN, path_matches(path))) {
        if (g_action < 0) die();
        errno = g_action;
        return -1;
    }
    return real(path, flags, mode);
}

int open(const char *path, int flags, ...) {
    mode_t mode = 0;
    resolve();
    if (flags & (O_CREAT | O_TMPFILE)) { va_list ap; va_start(ap, flags); mode = va_arg(ap, int); va_end(ap); }
    return open_common(real_open, path, flags, mode);
}

int open64(const char *path, int flags, ...) {
    mode_t mode = 0;
    resolve();
    if (flags & (O_CREAT | O_TMPFILE)) { va_list ap; va_start(ap, flags); mode = va_arg(ap, int); va_end(ap); }
    return open_common(real_open64, path, flags, mode);
}
