/* gz_write: the writer's file output at native speed (part of libgz_native.so).
 *
 *   gz_write_files   create many files, each from a list of (pointer, length) pieces
 *
 * Spread over N pthreads, no Python per file: each thread takes the next file, creates it
 * with O_CREAT|O_EXCL (the writer writes into its own fresh temporary folder, so an existing
 * file is an error, never overwritten), writes its pieces with pwritev (at most IOV_MAX pieces
 * a call, short writes resumed), and closes it (a failed close is a failed write: NFS reports
 * a full disk there). A missing parent folder is created (mkdir -p) and the open retried.
 * Each file gets a status (gz_strerror's codes: ok, open failed, write failed) and its errno.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

enum { WR_OK = 0, WR_OPEN = 1, WR_IO = 3 }; /* the same codes (and words) as gz_native.c's S_OK, S_OPEN, S_IO */

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

typedef struct {
    const char *const *paths;
    int64_t n;
    const int64_t *first;  /* file i's pieces are [first[i], first[i + 1]) */
    const uint64_t *ptrs;  /* piece addresses */
    const int64_t *lens;   /* piece lengths */
    int32_t *status;
    int64_t *detail;       /* errno of a failed file, else its bytes written */
    int64_t next;          /* atomic: the next file to take */
} WriteJob;

/* mkdir -p of `path`'s parent folder; 0, or the errno of the mkdir that failed */
static int make_parents(const char *path) {
    char buf[PATH_MAX];
    size_t len = strlen(path);
    if (len >= sizeof buf) return ENAMETOOLONG;
    memcpy(buf, path, len + 1);
    char *slash = strrchr(buf, '/');
    if (!slash || slash == buf) return 0;
    *slash = '\0';
    if (mkdir(buf, 0777) == 0 || errno == EEXIST) return 0;
    if (errno != ENOENT) return errno;
    int e = make_parents(buf);
    if (e) return e;
    return (mkdir(buf, 0777) == 0 || errno == EEXIST) ? 0 : errno;
}

static int open_new(const char *path) {
    int flags = O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC;
    int fd = open(path, flags, 0666);
    if (fd < 0 && errno == ENOENT) {
        int e = make_parents(path);
        if (e) {
            errno = e;
            return -1;
        }
        fd = open(path, flags, 0666);
    }
    return fd;
}

/* write pieces [p0, p1) to fd from offset 0; 0, or the errno of the failed write */
static int write_pieces(int fd, const WriteJob *j, int64_t p0, int64_t p1, int64_t *written) {
    struct iovec iov[IOV_MAX];
    int64_t off = 0, p = p0, skip = 0; /* skip: bytes of piece p already written */
    while (p < p1) {
        int k = 0;
        for (int64_t q = p; q < p1 && k < IOV_MAX; q++) {
            int64_t len = j->lens[q] - (q == p ? skip : 0);
            if (len <= 0) continue;
            iov[k].iov_base = (void *)(uintptr_t)(j->ptrs[q] + (uint64_t)(q == p ? skip : 0));
            iov[k].iov_len = (size_t)len;
            k++;
        }
        if (k == 0) break;
        ssize_t w = pwritev(fd, iov, k, off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (w == 0) return EIO;
        off += w;
        /* step past what went out; keep the rest of a short write */
        int64_t left = w;
        while (p < p1 && left >= j->lens[p] - skip) {
            left -= j->lens[p] - skip;
            skip = 0;
            p++;
        }
        skip += left;
    }
    *written = off;
    return 0;
}

static void write_one(WriteJob *j, int64_t i) {
    int fd = open_new(j->paths[i]);
    if (fd < 0) {
        j->status[i] = WR_OPEN;
        j->detail[i] = errno;
        return;
    }
    int64_t written = 0;
    int e = write_pieces(fd, j, j->first[i], j->first[i + 1], &written);
    if (close(fd) != 0 && !e) e = errno;
    j->status[i] = e ? WR_IO : WR_OK;
    j->detail[i] = e ? e : written;
}

static void *write_worker(void *p) {
    WriteJob *j = p;
    for (;;) {
        int64_t i = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (i >= j->n) break;
        write_one(j, i);
    }
    return NULL;
}

/* Write file i (paths[i]) from pieces [first[i], first[i + 1]) of (ptrs, lens) on `threads`
 * threads (the caller's included). Returns the files whose status is not ok. */
API int64_t gz_write_files(const char *const *paths, int64_t n, const int64_t *first, const uint64_t *ptrs,
                           const int64_t *lens, int threads, int32_t *status, int64_t *detail) {
    WriteJob j = {paths, n, first, ptrs, lens, status, detail, 0};
    for (int64_t i = 0; i < n; i++) { /* overwritten by each file written */
        status[i] = WR_IO;
        detail[i] = ECANCELED;
    }
    if (threads > n) threads = (int)n;
    if (threads > 256) threads = 256;
    pthread_t t[256];
    int started = 0;
    for (int k = 1; k < threads; k++)
        if (pthread_create(&t[started], NULL, write_worker, &j) == 0) started++;
    write_worker(&j);
    for (int k = 0; k < started; k++) pthread_join(t[k], NULL);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += status[i] != WR_OK;
    return bad;
}
