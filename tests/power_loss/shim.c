/*
 * A disk with a volatile write cache, for tests/power_loss.rs: an LD_PRELOAD shim.
 *
 * Every regular file directly in the directory named by TSR_SHIM_DIR (except `*-shm`, which
 * SQLite rebuilds on recovery and writes through mmap anyway) is tracked per inode. Each
 * tracked inode has a "durable shadow", the file TSR_SHIM_DURABLE/<basename> (what the file
 * holds after a power loss), and a list of the byte ranges written since its last sync:
 *
 *   - write, pwrite, writev, pwritev, ftruncate, open with O_TRUNC (any descriptor of the
 *     inode): the range written, truncated or extended is dirty for the inode, as in Linux's
 *     page cache (an fsync of one descriptor flushes the inode);
 *   - fsync / fdatasync (any descriptor of the inode): every dirty range is copied from the
 *     real file into the shadow, the shadow gets the real file's size, the list is cleared,
 *     then the real fsync runs and its result is returned;
 *   - a file the process creates has no shadow until its first sync (it does not exist after
 *     a power loss); a file that existed before the shim first saw it and has no shadow is
 *     taken as durable (its shadow is made a copy of it);
 *   - unlink of a tracked file removes its shadow at once.
 *
 * Not simulated: directory-entry durability (creating, unlinking a file is durable at once;
 * rename is not interposed at all), writes through mmap, descriptors made by dup/fcntl (their
 * writes are not seen), torn sector writes. The power loss itself is the test's: it SIGKILLs
 * the process, then copies every shadow over its real file, deletes the real files that have
 * no shadow, and deletes `-shm`.
 *
 * Fault injection, with Linux's errseq semantics: opening TSR_SHIM_DIR/.ctl/<command> runs the
 * command and fails with ENOENT (EINVAL: unknown command; ENXIO: no such tracked file):
 *   writeback-error:<basename>  a writeback error now: the inode's dirty ranges are dropped
 *                               (they never reach the shadow) and its error sequence is bumped;
 *                               every descriptor open now reports EIO once, on its next fsync;
 *                               one opened later reports it only if no descriptor had yet.
 *   fail-next-fsync:<basename>  the next fsync/fdatasync of the file (any descriptor) is such an
 *                               error, and that fsync reports it.
 *
 * TSR_SHIM_FSYNC_DELAY_US=n sleeps n µs in each fsync of a tracked file (a slower disk).
 * TSR_SHIM_SHARED=<dir>: several processes write the same files (each under the shim): every
 * dirty range is also appended to a journal per file in <dir>, and a sync by any process makes
 * every process's ranges durable (as Linux's page cache is the inode's), the whole sync under
 * the journal's lock. Writeback errors stay per process (the fault commands are for one).
 * TSR_SHIM_DEBUG set: `shim:` lines on stderr. Nothing is ever written to stdout.
 */
#undef _FORTIFY_SOURCE
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_FDS 65536
/* A shadow's path: the shadow directory, a slash, a basename. */
#define SHADOW_MAX (PATH_MAX + NAME_MAX + 2)

struct range {
    uint64_t start, end; /* [start, end) */
};

struct inode {
    dev_t dev;
    ino_t ino;
    int linked; /* still at its name: the shadow of its name is its own */
    char name[NAME_MAX + 1];
    struct range *dirty; /* sorted, disjoint, not adjacent */
    size_t ndirty, cap;
    uint64_t err_seq; /* writeback errors so far */
    int seen;         /* the latest one was reported to some descriptor */
    int fail_next;    /* fail-next-fsync pending */
};

struct fdent {
    int inode; /* index + 1 into `inodes`; 0: untracked. Read without the lock (atomic). */
    uint64_t sampled;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct fdent fds[MAX_FDS];
static struct inode *inodes;
static size_t ninodes, inodes_cap;

static char dir[PATH_MAX];
static size_t dir_len;
static char durable[PATH_MAX];
static int debug;
static long delay_us;
/* TSR_SHIM_SHARED: a directory of dirty-range journals shared by every process under the shim
 * (empty: each process keeps its own ranges only). */
static char shared[PATH_MAX];

typedef int (*open_fn)(const char *, int, ...);
typedef int (*openat_fn)(int, const char *, int, ...);
typedef int (*open2_fn)(const char *, int);
typedef int (*openat2_fn)(int, const char *, int);
typedef int (*close_fn)(int);
typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);
typedef ssize_t (*pwrite64_fn)(int, const void *, size_t, off64_t);
typedef ssize_t (*writev_fn)(int, const struct iovec *, int);
typedef ssize_t (*pwritev_fn)(int, const struct iovec *, int, off_t);
typedef ssize_t (*pwritev64_fn)(int, const struct iovec *, int, off64_t);
typedef int (*ftruncate_fn)(int, off_t);
typedef int (*ftruncate64_fn)(int, off64_t);
typedef int (*sync_fn)(int);
typedef int (*unlink_fn)(const char *);
typedef int (*unlinkat_fn)(int, const char *, int);

/* The next definition of `name` (libc's), looked up once. */
#define REAL(type, name)                                                                      \
    static type real_##name(void) {                                                           \
        static type f;                                                                        \
        type g = __atomic_load_n(&f, __ATOMIC_ACQUIRE);                                       \
        if (!g) {                                                                             \
            g = (type)dlsym(RTLD_NEXT, #name);                                                \
            if (!g) {                                                                         \
                static const char msg[] = "shim: libc has no " #name "\n";                   \
                syscall(SYS_write, 2, msg, sizeof msg - 1);                                   \
                abort();                                                                      \
            }                                                                                 \
            __atomic_store_n(&f, g, __ATOMIC_RELEASE);                                        \
        }                                                                                     \
        return g;                                                                             \
    }

REAL(open_fn, open)
REAL(open_fn, open64)
REAL(openat_fn, openat)
REAL(openat_fn, openat64)
REAL(open2_fn, __open_2)
REAL(open2_fn, __open64_2)
REAL(openat2_fn, __openat_2)
REAL(openat2_fn, __openat64_2)
REAL(close_fn, close)
REAL(write_fn, write)
REAL(pwrite_fn, pwrite)
REAL(pwrite64_fn, pwrite64)
REAL(writev_fn, writev)
REAL(pwritev_fn, pwritev)
REAL(pwritev64_fn, pwritev64)
REAL(ftruncate_fn, ftruncate)
REAL(ftruncate64_fn, ftruncate64)
REAL(sync_fn, fsync)
REAL(sync_fn, fdatasync)
REAL(unlink_fn, unlink)
REAL(unlinkat_fn, unlinkat)

static void say(const char *fmt, ...) {
    if (!debug)
        return;
    char buf[1024];
    int n = snprintf(buf, sizeof buf, "shim: ");
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(buf + n, sizeof buf - n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof buf - 2)
        n = sizeof buf - 2;
    buf[n++] = '\n';
    syscall(SYS_write, 2, buf, (size_t)n);
}

static void init(void) {
    const char *d = getenv("TSR_SHIM_DIR");
    if (d && d[0] == '/' && strlen(d) < sizeof dir) {
        strcpy(dir, d);
        dir_len = strlen(dir);
        while (dir_len > 1 && dir[dir_len - 1] == '/')
            dir[--dir_len] = 0;
    }
    const char *s = getenv("TSR_SHIM_DURABLE");
    if (s && s[0] == '/' && strlen(s) < sizeof durable)
        strcpy(durable, s);
    else if (dir_len && dir_len + 9 < sizeof durable)
        snprintf(durable, sizeof durable, "%s.durable", dir);
    debug = getenv("TSR_SHIM_DEBUG") != NULL;
    const char *sh = getenv("TSR_SHIM_SHARED");
    if (sh && sh[0] == '/' && strlen(sh) < sizeof shared)
        strcpy(shared, sh);
    const char *us = getenv("TSR_SHIM_FSYNC_DELAY_US");
    delay_us = us ? atol(us) : 0;
    if (dir_len)
        say("tracking %s/*, shadows in %s, fsync delay %ld us", dir, durable, delay_us);
}

static int active(void) {
    pthread_once(&once, init);
    return dir_len != 0;
}

/* `path` (relative to `dirfd`) made absolute into `out`: 0, or -1 when it cannot be. */
static int absolute(int dirfd, const char *path, char *out, size_t n) {
    if (!path)
        return -1;
    if (path[0] == '/') {
        if (strlen(path) >= n)
            return -1;
        strcpy(out, path);
        return 0;
    }
    char base[PATH_MAX];
    if (dirfd == AT_FDCWD) {
        if (!getcwd(base, sizeof base))
            return -1;
    } else {
        char proc[64];
        snprintf(proc, sizeof proc, "/proc/self/fd/%d", dirfd);
        ssize_t len = readlink(proc, base, sizeof base - 1);
        if (len < 0)
            return -1;
        base[len] = 0;
    }
    if ((size_t)snprintf(out, n, "%s/%s", base, path) >= n)
        return -1;
    return 0;
}

/* Whether `abs` is under the tracked directory: 1 a tracked file, 2 a command, 0 neither. */
static int classify(const char *abs) {
    if (strncmp(abs, dir, dir_len) != 0 || abs[dir_len] != '/')
        return 0;
    const char *rest = abs + dir_len + 1;
    if (strncmp(rest, ".ctl/", 5) == 0)
        return 2;
    if (!rest[0] || strchr(rest, '/'))
        return 0;
    size_t len = strlen(rest);
    if (len >= 4 && strcmp(rest + len - 4, "-shm") == 0)
        return 0;
    if (len > NAME_MAX)
        return 0;
    return 1;
}

static void shadow_path(const char *name, char *out, size_t n) {
    snprintf(out, n, "%s/%s", durable, name);
}

static int fd_inode(int fd) {
    if (fd < 0 || fd >= MAX_FDS)
        return 0;
    return __atomic_load_n(&fds[fd].inode, __ATOMIC_ACQUIRE);
}

/* The live inode (dev, ino), or -1. Under the lock. */
static long find_inode(dev_t dev, ino_t ino) {
    for (size_t i = ninodes; i-- > 0;)
        if (inodes[i].linked && inodes[i].dev == dev && inodes[i].ino == ino)
            return (long)i;
    return -1;
}

/* The live inode at `name`, or -1. Under the lock. */
static long find_name(const char *name) {
    for (size_t i = ninodes; i-- > 0;)
        if (inodes[i].linked && strcmp(inodes[i].name, name) == 0)
            return (long)i;
    return -1;
}

static long new_inode(dev_t dev, ino_t ino, const char *name) {
    if (ninodes == inodes_cap) {
        size_t cap = inodes_cap ? inodes_cap * 2 : 16;
        struct inode *grown = realloc(inodes, cap * sizeof *grown);
        if (!grown)
            abort();
        inodes = grown;
        inodes_cap = cap;
    }
    struct inode *in = &inodes[ninodes];
    memset(in, 0, sizeof *in);
    in->dev = dev;
    in->ino = ino;
    in->linked = 1;
    strcpy(in->name, name);
    return (long)ninodes++;
}

/* Marks [start, end) dirty. Under the lock. */
static void add_range(struct inode *in, uint64_t start, uint64_t end) {
    if (start >= end)
        return;
    /* The first range that ends at or after `start` (those before are left alone). */
    size_t lo = 0, hi = in->ndirty;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (in->dirty[mid].end < start)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t j = lo, k = lo;
    while (k < in->ndirty && in->dirty[k].start <= end) {
        if (in->dirty[k].start < start)
            start = in->dirty[k].start;
        if (in->dirty[k].end > end)
            end = in->dirty[k].end;
        k++;
    }
    if (k == j) {
        if (in->ndirty == in->cap) {
            size_t cap = in->cap ? in->cap * 2 : 16;
            struct range *grown = realloc(in->dirty, cap * sizeof *grown);
            if (!grown)
                abort();
            in->dirty = grown;
            in->cap = cap;
        }
        memmove(&in->dirty[j + 1], &in->dirty[j], (in->ndirty - j) * sizeof *in->dirty);
        in->ndirty++;
    } else {
        memmove(&in->dirty[j + 1], &in->dirty[k], (in->ndirty - k) * sizeof *in->dirty);
        in->ndirty -= k - j - 1;
    }
    in->dirty[j].start = start;
    in->dirty[j].end = end;
}

/* The shared journal of `name`'s dirty ranges (TSR_SHIM_SHARED), opened for appending; -1 when
 * there is none. */
static int journal_open(const char *name) {
    if (!shared[0])
        return -1;
    char jp[SHADOW_MAX];
    snprintf(jp, sizeof jp, "%s/%s", shared, name);
    return real_open()(jp, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

/* Appends [start, end) to `name`'s shared journal, under its lock: the range is dirty for every
 * process, which a sync by any of them makes durable (Linux's page cache is the inode's, not
 * the writer's). */
static void journal_add(const char *name, uint64_t start, uint64_t end) {
    int j = journal_open(name);
    if (j < 0)
        return;
    uint64_t rec[2] = {start, end};
    flock(j, LOCK_EX);
    if (real_write()(j, rec, sizeof rec) != (ssize_t)sizeof rec)
        say("%s: a dirty range could not reach the shared journal", name);
    flock(j, LOCK_UN);
    real_close()(j);
}

static void dirty(int fd, uint64_t start, uint64_t end) {
    int idx = fd_inode(fd);
    if (!idx)
        return;
    pthread_mutex_lock(&lock);
    if (fds[fd].inode == idx) {
        add_range(&inodes[idx - 1], start, end);
        journal_add(inodes[idx - 1].name, start, end);
    }
    pthread_mutex_unlock(&lock);
}

/* Copies bytes [start, end) of `src` to `dst`. */
static void copy_range(int src, int dst, uint64_t start, uint64_t end) {
    char buf[65536];
    while (start < end) {
        size_t want = end - start < sizeof buf ? (size_t)(end - start) : sizeof buf;
        ssize_t got = pread(src, buf, want, (off_t)start);
        if (got <= 0)
            return;
        ssize_t off = 0;
        while (off < got) {
            ssize_t put = real_pwrite()(dst, buf + off, (size_t)(got - off), (off_t)start + off);
            if (put <= 0)
                return;
            off += put;
        }
        start += (uint64_t)got;
    }
}

/* The real file behind `fd`, opened afresh for reading (whatever `fd`'s own mode). */
static int reopen(int fd) {
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    return real_open()(proc, O_RDONLY | O_CLOEXEC);
}

/* The shadow of `in` made a copy of the whole file behind `fd`. Under the lock. */
static void snapshot(struct inode *in, int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0)
        return;
    int src = reopen(fd);
    char sp[SHADOW_MAX];
    shadow_path(in->name, sp, sizeof sp);
    int dst = real_open()(sp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (src >= 0 && dst >= 0)
        copy_range(src, dst, 0, (uint64_t)st.st_size);
    if (src >= 0)
        real_close()(src);
    if (dst >= 0)
        real_close()(dst);
    say("%s existed without a shadow: taken as durable (%lld bytes)", in->name,
        (long long)st.st_size);
}

/* The sync: every dirty range of `in` into its shadow, the shadow at the file's size. Under the
 * lock. */
static void flush(struct inode *in, int fd) {
    size_t ranges = in->ndirty;
    /* Shared: every process's ranges (its own among them), the whole sync under the journal's
     * lock, so that two processes' syncs of one file never interleave (a stale size would cut
     * what the other made durable). */
    int journal = journal_open(in->name);
    if (journal >= 0)
        flock(journal, LOCK_EX);
    if (in->linked) {
        struct stat st;
        int src = -1, dst = -1;
        char sp[SHADOW_MAX];
        shadow_path(in->name, sp, sizeof sp);
        if (fstat(fd, &st) == 0 && (src = reopen(fd)) >= 0 &&
            (dst = real_open()(sp, O_WRONLY | O_CREAT | O_CLOEXEC, 0644)) >= 0) {
            uint64_t size = (uint64_t)st.st_size;
            for (size_t i = 0; i < in->ndirty; i++) {
                uint64_t end = in->dirty[i].end < size ? in->dirty[i].end : size;
                if (in->dirty[i].start < end)
                    copy_range(src, dst, in->dirty[i].start, end);
            }
            struct stat js;
            if (journal >= 0 && fstat(journal, &js) == 0 && js.st_size >= 16) {
                size_t n = (size_t)js.st_size / 16;
                uint64_t *recs = malloc(n * 16);
                if (recs && pread(journal, recs, n * 16, 0) == (ssize_t)(n * 16)) {
                    for (size_t i = 0; i < n; i++) {
                        uint64_t end = recs[2 * i + 1] < size ? recs[2 * i + 1] : size;
                        if (recs[2 * i] < end)
                            copy_range(src, dst, recs[2 * i], end);
                    }
                    ranges += n;
                }
                free(recs);
            }
            real_ftruncate()(dst, st.st_size);
        } else {
            say("%s: the sync could not reach its shadow (errno %d)", in->name, errno);
        }
        if (src >= 0)
            real_close()(src);
        if (dst >= 0)
            real_close()(dst);
    }
    in->ndirty = 0;
    if (journal >= 0) {
        real_ftruncate()(journal, 0);
        flock(journal, LOCK_UN);
        real_close()(journal);
    }
    say("sync of %s: %zu dirty ranges made durable", in->name, ranges);
}

/* A writeback error on `in` now. Under the lock. */
static void writeback_error(struct inode *in) {
    say("writeback error on %s: %zu dirty ranges dropped", in->name, in->ndirty);
    in->ndirty = 0;
    in->err_seq++;
    in->seen = 0;
}

/* Runs a `.ctl/` command: the errno the open fails with. */
static int command(const char *abs) {
    const char *cmd = strrchr(abs, '/') + 1;
    const char *colon = strchr(cmd, ':');
    if (!colon)
        return EINVAL;
    size_t verb = (size_t)(colon - cmd);
    const char *name = colon + 1;
    int which;
    if (verb == strlen("writeback-error") && strncmp(cmd, "writeback-error", verb) == 0)
        which = 1;
    else if (verb == strlen("fail-next-fsync") && strncmp(cmd, "fail-next-fsync", verb) == 0)
        which = 2;
    else
        return EINVAL;
    int result = ENOENT;
    pthread_mutex_lock(&lock);
    long i = find_name(name);
    if (i < 0)
        result = ENXIO;
    else if (which == 1)
        writeback_error(&inodes[i]);
    else
        inodes[i].fail_next = 1;
    pthread_mutex_unlock(&lock);
    say("command %s: %s", cmd, result == ENOENT ? "done" : "no such tracked file");
    return result;
}

/* After the real open of a tracked file: registers the descriptor. */
static void opened(int fd, const char *abs, int existed, int flags, off_t old_size) {
    struct stat st;
    if (fd < 0 || fd >= MAX_FDS || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        return;
    const char *name = strrchr(abs, '/') + 1;
    pthread_mutex_lock(&lock);
    long i = find_inode(st.st_dev, st.st_ino);
    if (i < 0) {
        i = new_inode(st.st_dev, st.st_ino, name);
        char sp[SHADOW_MAX];
        shadow_path(name, sp, sizeof sp);
        struct stat shadow;
        int has_shadow = stat(sp, &shadow) == 0;
        if (!existed) {
            /* Made now: nothing of it is durable yet. */
            if (has_shadow)
                real_unlink()(sp);
            say("%s created: no shadow until its first sync", name);
        } else if (!has_shadow) {
            snapshot(&inodes[i], fd);
        }
    }
    struct inode *in = &inodes[i];
    if (existed && (flags & O_TRUNC) && old_size > 0)
        add_range(in, 0, (uint64_t)old_size);
    /* errseq_sample: an error nobody has reported yet is reported to this descriptor too. */
    fds[fd].sampled = in->seen ? in->err_seq : 0;
    __atomic_store_n(&fds[fd].inode, (int)i + 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&lock);
}

/* The shared open: `kind` picks the real function. */
enum kind { OPEN, OPEN64, OPENAT, OPENAT64, OPEN_2, OPEN64_2, OPENAT_2, OPENAT64_2 };

static int call_real(enum kind kind, int dirfd, const char *path, int flags, mode_t mode) {
    switch (kind) {
    case OPEN: return real_open()(path, flags, mode);
    case OPEN64: return real_open64()(path, flags, mode);
    case OPENAT: return real_openat()(dirfd, path, flags, mode);
    case OPENAT64: return real_openat64()(dirfd, path, flags, mode);
    case OPEN_2: return real___open_2()(path, flags);
    case OPEN64_2: return real___open64_2()(path, flags);
    case OPENAT_2: return real___openat_2()(dirfd, path, flags);
    case OPENAT64_2: return real___openat64_2()(dirfd, path, flags);
    }
    return -1;
}

static int do_open(enum kind kind, int dirfd, const char *path, int flags, mode_t mode) {
    char abs[PATH_MAX];
    int what = 0;
    if (active() && absolute(dirfd, path, abs, sizeof abs) == 0)
        what = classify(abs);
    if (what == 2) {
        errno = command(abs);
        return -1;
    }
    if (what == 0)
        return call_real(kind, dirfd, path, flags, mode);
    struct stat before;
    int existed = stat(abs, &before) == 0 && S_ISREG(before.st_mode);
    int fd = call_real(kind, dirfd, path, flags, mode);
    if (fd >= 0) {
        int saved = errno;
        opened(fd, abs, existed, flags, existed ? before.st_size : 0);
        errno = saved;
    }
    return fd;
}

static int needs_mode(int flags) {
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE;
}

int open(const char *path, int flags, ...) {
    mode_t mode = 0;
    if (needs_mode(flags)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    return do_open(OPEN, AT_FDCWD, path, flags, mode);
}

int open64(const char *path, int flags, ...) {
    mode_t mode = 0;
    if (needs_mode(flags)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    return do_open(OPEN64, AT_FDCWD, path, flags, mode);
}

int openat(int dirfd, const char *path, int flags, ...) {
    mode_t mode = 0;
    if (needs_mode(flags)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    return do_open(OPENAT, dirfd, path, flags, mode);
}

int openat64(int dirfd, const char *path, int flags, ...) {
    mode_t mode = 0;
    if (needs_mode(flags)) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    return do_open(OPENAT64, dirfd, path, flags, mode);
}

int __open_2(const char *path, int flags) { return do_open(OPEN_2, AT_FDCWD, path, flags, 0); }
int __open64_2(const char *path, int flags) {
    return do_open(OPEN64_2, AT_FDCWD, path, flags, 0);
}
int __openat_2(int dirfd, const char *path, int flags) {
    return do_open(OPENAT_2, dirfd, path, flags, 0);
}
int __openat64_2(int dirfd, const char *path, int flags) {
    return do_open(OPENAT64_2, dirfd, path, flags, 0);
}

int close(int fd) {
    if (fd_inode(fd)) {
        pthread_mutex_lock(&lock);
        __atomic_store_n(&fds[fd].inode, 0, __ATOMIC_RELEASE);
        fds[fd].sampled = 0;
        pthread_mutex_unlock(&lock);
    }
    return real_close()(fd);
}

/* A write at the descriptor's position: the range is known from the position after it. */
static void dirty_before_position(int fd, ssize_t written) {
    if (written <= 0 || !fd_inode(fd))
        return;
    int saved = errno;
    off_t pos = lseek(fd, 0, SEEK_CUR);
    if (pos >= written)
        dirty(fd, (uint64_t)(pos - written), (uint64_t)pos);
    errno = saved;
}

ssize_t write(int fd, const void *buf, size_t n) {
    ssize_t r = real_write()(fd, buf, n);
    dirty_before_position(fd, r);
    return r;
}

ssize_t writev(int fd, const struct iovec *iov, int count) {
    ssize_t r = real_writev()(fd, iov, count);
    dirty_before_position(fd, r);
    return r;
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t offset) {
    ssize_t r = real_pwrite()(fd, buf, n, offset);
    if (r > 0)
        dirty(fd, (uint64_t)offset, (uint64_t)offset + (uint64_t)r);
    return r;
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t offset) {
    ssize_t r = real_pwrite64()(fd, buf, n, offset);
    if (r > 0)
        dirty(fd, (uint64_t)offset, (uint64_t)offset + (uint64_t)r);
    return r;
}

ssize_t pwritev(int fd, const struct iovec *iov, int count, off_t offset) {
    ssize_t r = real_pwritev()(fd, iov, count, offset);
    if (r > 0)
        dirty(fd, (uint64_t)offset, (uint64_t)offset + (uint64_t)r);
    return r;
}

ssize_t pwritev64(int fd, const struct iovec *iov, int count, off64_t offset) {
    ssize_t r = real_pwritev64()(fd, iov, count, offset);
    if (r > 0)
        dirty(fd, (uint64_t)offset, (uint64_t)offset + (uint64_t)r);
    return r;
}

/* A size change: the bytes between the old and the new size are dirty (gone, or zeros). */
static int truncated(int fd, off64_t length, int wide) {
    struct stat st;
    int tracked = fd_inode(fd) && fstat(fd, &st) == 0;
    int r = wide ? real_ftruncate64()(fd, length) : real_ftruncate()(fd, (off_t)length);
    if (r == 0 && tracked && length >= 0) {
        uint64_t a = (uint64_t)length, b = (uint64_t)st.st_size;
        dirty(fd, a < b ? a : b, a < b ? b : a);
    }
    return r;
}

int ftruncate(int fd, off_t length) { return truncated(fd, length, 0); }
int ftruncate64(int fd, off64_t length) { return truncated(fd, length, 1); }

static int do_sync(int fd, int data_only) {
    int idx = fd_inode(fd);
    sync_fn real = data_only ? real_fdatasync() : real_fsync();
    if (!idx)
        return real(fd);
    if (delay_us > 0) {
        struct timespec ts = {delay_us / 1000000, (delay_us % 1000000) * 1000};
        nanosleep(&ts, NULL);
    }
    int report = 0;
    pthread_mutex_lock(&lock);
    idx = fds[fd].inode;
    if (idx) {
        struct inode *in = &inodes[idx - 1];
        if (in->fail_next) {
            in->fail_next = 0;
            writeback_error(in);
        }
        /* Linux writes back what is dirty, then reports an error this descriptor has not
         * seen (file_check_and_advance_wb_err). */
        flush(in, fd);
        if (fds[fd].sampled != in->err_seq) {
            fds[fd].sampled = in->err_seq;
            in->seen = 1;
            report = 1;
            say("fsync of %s (fd %d): reports EIO", in->name, fd);
        }
    }
    pthread_mutex_unlock(&lock);
    int r = real(fd);
    if (report) {
        errno = EIO;
        return -1;
    }
    return r;
}

int fsync(int fd) { return do_sync(fd, 0); }
int fdatasync(int fd) { return do_sync(fd, 1); }

/* After an unlink of a tracked file: its inode is no longer at its name, its shadow goes. */
static void unlinked(const char *abs, const struct stat *before) {
    const char *name = strrchr(abs, '/') + 1;
    char sp[SHADOW_MAX];
    shadow_path(name, sp, sizeof sp);
    pthread_mutex_lock(&lock);
    long i = find_inode(before->st_dev, before->st_ino);
    if (i >= 0)
        inodes[i].linked = 0;
    real_unlink()(sp);
    pthread_mutex_unlock(&lock);
    say("%s unlinked: its shadow too", name);
}

static int do_unlink(int dirfd, const char *path, int flags, int at) {
    char abs[PATH_MAX];
    struct stat before;
    int tracked = active() && !(flags & AT_REMOVEDIR) &&
                  absolute(dirfd, path, abs, sizeof abs) == 0 && classify(abs) == 1 &&
                  lstat(abs, &before) == 0 && S_ISREG(before.st_mode);
    int r = at ? real_unlinkat()(dirfd, path, flags) : real_unlink()(path);
    if (r == 0 && tracked) {
        int saved = errno;
        unlinked(abs, &before);
        errno = saved;
    }
    return r;
}

int unlink(const char *path) { return do_unlink(AT_FDCWD, path, 0, 0); }
int unlinkat(int dirfd, const char *path, int flags) { return do_unlink(dirfd, path, flags, 1); }
