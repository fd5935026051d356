/* gz_http: many HTTP(S) GETs in flight from one native call (libcurl's multi interface).
 *
 *   gz_http_fetch   GET whole objects, byte ranges or suffixes of many URLs, each body
 *                   written straight into its caller-given buffer; retries with backoff
 *                   (429, 5xx, resets, timeouts, answers cut short); a callback per
 *                   finished request so the caller decodes while the rest arrive; a whole
 *                   shard's inner chunks can be handed to a decode set as its bytes pass
 *                   each one's end (its index known before: gz_http_parts).
 *
 * Hostile servers: every body is written into its caller-given buffer and stopped at its end
 * (nothing is held beyond what was asked for); every answer is checked against its request
 * (status, Content-Range start, end and total) before it counts; each request has a deadline,
 * its retries included, and a minimum transfer rate; redirects are followed here, not by
 * libcurl: only to http(s), never from https to http, a bounded number of hops, and the
 * caller's headers are dropped once the host changes.
 *
 * libcurl is loaded at run time with dlopen (libcurl.so.4: no -dev package needed); when it
 * is missing, gz_http_available() says why and the Python side uses obstore instead.
 * Connections are kept between calls: finished calls return their multi handle (and its
 * connection cache) to a small pool, so a viewer's next plane pays no new handshake.
 * Part of libgz_native.so (built together with gz_native.c).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <ctype.h>
#include <time.h>

#define API __attribute__((visibility("default")))

/* libcurl's ABI (curl/curl.h, stable since 7.x; checked against curl_easy_option_by_name in the tests) */
enum {
    O_WRITEDATA = 10001, O_URL = 10002, O_RANGE = 10007, O_ERRORBUFFER = 10010, O_USERAGENT = 10018,
    O_HTTPHEADER = 10023, O_HEADERDATA = 10029, O_PRIVATE = 10103, O_WRITEFUNCTION = 20011,
    O_HEADERFUNCTION = 20079, O_LOW_SPEED_LIMIT = 19, O_LOW_SPEED_TIME = 20, O_FOLLOWLOCATION = 52,
    O_MAXREDIRS = 68, O_FILETIME = 69, O_BUFFERSIZE = 98, O_NOSIGNAL = 99, O_TCP_NODELAY = 121,
    O_CONNECTTIMEOUT_MS = 156, O_TIMEOUT_MS = 155,
};
enum { I_RESPONSE_CODE = 0x200002, I_PRIVATE = 0x100015, I_FILETIME_T = 0x60000E, I_REDIRECT_URL = 0x10001F };
enum { M_MAXCONNECTS = 6 };
enum { MSG_DONE = 1 };
typedef void CURL;
typedef void CURLM;
typedef struct { int msg; CURL *easy; union { void *whatever; int result; } data; } CURLMsg;
struct curl_slist;

static struct {
    int ok;
    char why[300];
    int (*global_init)(long);
    CURL *(*easy_init)(void);
    int (*easy_setopt)(CURL *, int, ...);
    int (*easy_getinfo)(CURL *, int, ...);
    void (*easy_cleanup)(CURL *);
    const char *(*easy_strerror)(int);
    CURLM *(*multi_init)(void);
    int (*multi_add)(CURLM *, CURL *);
    int (*multi_remove)(CURLM *, CURL *);
    int (*multi_perform)(CURLM *, int *);
    int (*multi_poll)(CURLM *, void *, unsigned, int, int *);
    CURLMsg *(*multi_info_read)(CURLM *, int *);
    int (*multi_setopt)(CURLM *, int, ...);
    void (*multi_cleanup)(CURLM *);
    struct curl_slist *(*slist_append)(struct curl_slist *, const char *);
    void (*slist_free_all)(struct curl_slist *);
    const char *(*version)(void);
    int (*easy_pause)(CURL *, int);
    int (*multi_wakeup)(CURLM *);  /* curl >= 7.68; without it a fetch runs on one thread */
    long (*getdate)(const char *, const long *);  /* curl_getdate: Last-Modified; without it no parts are handed */
} C;
static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void curl_load(void) {
    void *h = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libcurl.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) { snprintf(C.why, sizeof C.why, "%s", dlerror()); return; }
#define S(f, n) if (!(*(void **)&C.f = dlsym(h, n))) { snprintf(C.why, sizeof C.why, "libcurl has no %s", n); return; }
    S(global_init, "curl_global_init") S(easy_init, "curl_easy_init") S(easy_setopt, "curl_easy_setopt")
    S(easy_getinfo, "curl_easy_getinfo") S(easy_cleanup, "curl_easy_cleanup") S(easy_strerror, "curl_easy_strerror")
    S(multi_init, "curl_multi_init") S(multi_add, "curl_multi_add_handle") S(multi_remove, "curl_multi_remove_handle")
    S(multi_perform, "curl_multi_perform") S(multi_poll, "curl_multi_poll") S(multi_info_read, "curl_multi_info_read")
    S(multi_setopt, "curl_multi_setopt") S(multi_cleanup, "curl_multi_cleanup") S(slist_append, "curl_slist_append")
    S(slist_free_all, "curl_slist_free_all") S(version, "curl_version") S(easy_pause, "curl_easy_pause")
#undef S
    *(void **)&C.multi_wakeup = dlsym(h, "curl_multi_wakeup");
    *(void **)&C.getdate = dlsym(h, "curl_getdate");
    if (C.global_init(3 /* CURL_GLOBAL_ALL */) != 0) { snprintf(C.why, sizeof C.why, "curl_global_init failed"); return; }
    C.ok = 1;
}

/* 1: libcurl loaded; else 0 and *why says why */
API int gz_http_available(const char **why, const char **version) {
    pthread_once(&curl_once, curl_load);
    if (why) *why = C.why;
    if (version) *version = C.ok ? C.version() : "";
    return C.ok;
}

/* one request: in = url index, range, destination; out = what came back */
typedef struct {
    int64_t start, end;    /* end > start: bytes [start, end); end < 0: the whole object; start < 0, end == 0: the last -start bytes */
    uint8_t *dest;         /* the body goes here */
    int64_t cap;           /* bytes dest holds (a longer body fails with status -2) */
    int64_t got;           /* out: body bytes written */
    int64_t size;          /* out: the object's size (Content-Range total, or a 200's length), -1 unknown */
    int64_t mtime;         /* out: Last-Modified, seconds since the epoch, -1 unknown */
    int64_t range_start;   /* out: first byte of a 206's Content-Range, -1 none */
    int64_t range_end;     /* out: last byte of a 206's Content-Range, -1 none */
    int32_t status;        /* out: HTTP status of the last attempt; -1 no answer (see curl); -2 body longer than cap;
                              -7 a redirect refused (err says why) */
    int32_t curl;          /* out: libcurl's code of the last attempt (0 ok) */
    int32_t attempts;      /* out */
    int32_t added;         /* out: 1 when the body was handed to the fetch's decode set (gz_http_fetch's sink);
                              with parts: how many of its parts were handed (the first ones, in their order) */
    char etag[96];         /* out */
    char err[128];         /* out: libcurl's words for a failed last attempt */
} gz_http_req;

typedef void (*gz_http_done_fn)(int64_t i);

/* Parts of whole-object requests handed to the fetch's decode set (the sink's) as the body's
 * bytes pass each part's end, before the body is complete: a whole shard whose index is known.
 * Request i's parts are rows at[i] .. at[i+1]-1 of `rows` (chunk in the set, offset in the
 * body, bytes), in the order of their ends. They are handed only when the answer is the object
 * the index belongs to: a 200 whose size, Last-Modified (seconds) and ETag are expect[2i],
 * expect[2i+1] (-1: the answer must have none) and etags[96i..] (empty: not compared, as when
 * the answer has none). A retry after parts were handed must be that object too, else the
 * request ends with status CHANGED and nothing more is written into its destination.
 * late (NULL: none): per request a slot where the caller publishes, while the fetch runs, the
 * address of a gz_http_parts of that one request (as its request 0; gz_http_publish) once it
 * knows them (a shard whose index comes in a request of the same fetch): from then on its
 * bytes hand them, those already in first. */
typedef struct gz_http_parts {
    const int64_t *at;
    const int64_t *rows;
    const int64_t *expect;
    const char *etags;
    volatile int64_t *late;
} gz_http_parts;
#define CHANGED (-6)
#define REFUSED (-7)

/* gz_native.c (the same library): queue chunk i of a decode set (gz_arrivals_open) */
int gz_arrivals_add(void *h, int64_t i, const uint8_t *src, int64_t nb);

/* multi handles kept between calls with their easy handles: the connection cache, and each easy
 * handle's receive buffer, already touched (fresh buffers cost page faults on every call) */
typedef struct { CURLM *m; CURL **easy; int n; } agent_t;
#define POOL 16
#define MAX_AGENTS 8
static agent_t pool[POOL];
static int pooled;
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;

static agent_t take_agent(int need) {
    agent_t a = {NULL, NULL, 0};
    pthread_mutex_lock(&pool_lock);
    if (pooled) a = pool[--pooled];
    pthread_mutex_unlock(&pool_lock);
    if (!a.m) a.m = C.multi_init();
    if (a.n < need) {
        CURL **e = realloc(a.easy, (size_t)need * sizeof *e);
        if (e) {
            for (int k = a.n; k < need; k++) e[k] = NULL;
            a.easy = e;
            a.n = need;
        }
    }
    return a;
}

static void give_agent(agent_t a) {
    if (!a.m) { free(a.easy); return; }
    pthread_mutex_lock(&pool_lock);
    if (pooled < POOL) { pool[pooled++] = a; a.m = NULL; }
    pthread_mutex_unlock(&pool_lock);
    if (a.m) {
        for (int k = 0; k < a.n; k++) if (a.easy[k]) C.easy_cleanup(a.easy[k]);
        free(a.easy);
        C.multi_cleanup(a.m);
    }
}

typedef struct {
    gz_http_req *r;
    int64_t i;
    const gz_http_parts *parts;   /* this request's parts (NULL: none) */
    int64_t pi;                   /* this request's row in them (its own index, or 0 for late parts) */
    const gz_http_parts *all;     /* the fetch's parts (their late slots), or NULL */
    volatile int64_t *set;        /* the decode set they go to (its handle; 0: not open yet) */
    int http;          /* the status line's code */
    int64_t lm;        /* Last-Modified, seconds (-1 none, -2 not understood) */
    int valid;         /* parts: -1 not judged yet (headers still coming), 1 the expected object, 0 not */
    int changed;       /* a retry brought another object after parts were handed: stopped */
    int over;          /* the body ran past cap */
    const int *armed;  /* 0 while the destinations are not set: a body that comes sooner waits (paused) */
    int paused;
    int redirect;      /* the answer is a redirect (3xx): its body is not kept */
    char range[64];
    char err[256];
} slot_t;

#define WRITEFUNC_PAUSE 0x10000001  /* CURL_WRITEFUNC_PAUSE: libcurl keeps the data and gives it again once unpaused */

/* worth another attempt: connection trouble, a timeout, a body cut short, 429 and 5xx */
static int transient(int code, int status) {
    switch (code) {
    case 7: case 16: case 18: case 28: case 52: case 55: case 56: case 92: return 1;
    case 0: return status == 429 || status == 500 || status == 502 || status == 503 || status == 504;
    }
    return 0;
}

/* the answer is the object the parts' index belongs to (judged once its headers are in) */
static int expected(const slot_t *s) {
    const gz_http_parts *P = s->parts;
    int64_t i = s->pi;
    if (s->http != 200 || s->r->size != P->expect[2 * i] || s->lm == -2) return 0;
    if (s->lm != P->expect[2 * i + 1]) return 0;
    const char *want = P->etags + 96 * i;
    return !want[0] || !s->r->etag[0] || strncmp(want, s->r->etag, 95) == 0;
}

/* hand the parts whose bytes are all in (the first ones not handed yet, in order) */
static void hand_parts(slot_t *s) {
    gz_http_req *r = s->r;
    void *set = (void *)(intptr_t)__atomic_load_n(s->set, __ATOMIC_ACQUIRE);
    if (!set || s->valid != 1) return;
    const gz_http_parts *P = s->parts;
    for (int64_t k = P->at[s->pi] + r->added; k < P->at[s->pi + 1]; k++) {
        const int64_t *row = P->rows + 3 * k;
        if (row[1] + row[2] > r->got) return;
        if (gz_arrivals_add(set, row[0], r->dest + row[1], row[2]) != 0) { s->valid = 0; return; }
        r->added++;
    }
}

static size_t on_body(char *p, size_t sz, size_t n, void *u) {
    slot_t *s = u;
    size_t len = sz * n;
    if (!*s->armed) { s->paused = 1; return WRITEFUNC_PAUSE; }
    if (s->redirect) return len;  /* a redirect's body: not kept (the deadline bounds it) */
    if (!s->parts && s->all && s->all->late) {  /* parts published since: taken from now on */
        int64_t p = __atomic_load_n(&s->all->late[s->i], __ATOMIC_ACQUIRE);
        if (p) { s->parts = (const gz_http_parts *)(intptr_t)p; s->pi = 0; s->valid = -1; }
    }
    if (s->parts && s->valid < 0) s->valid = expected(s);
    if (s->parts && !s->valid && s->r->added > 0) {
        /* parts of an earlier attempt are being decoded from this destination: nothing else is
         * written over them. A busy server's answer is dropped (and retried); another object stops */
        if (transient(0, s->http)) return len;
        s->changed = 1;
        return 0;
    }
    if (s->r->got + (int64_t)len > s->r->cap) { s->over = 1; return 0; }
    memcpy(s->r->dest + s->r->got, p, len);
    s->r->got += (int64_t)len;
    if (s->parts) hand_parts(s);
    return len;
}

static int starts(const char *line, size_t len, const char *name) {
    size_t k = strlen(name);
    return len > k && strncasecmp(line, name, k) == 0;
}

static size_t on_header(char *p, size_t sz, size_t n, void *u) {
    slot_t *s = u;
    size_t len = sz * n;
    char buf[256];
    size_t m = len < sizeof buf - 1 ? len : sizeof buf - 1;
    memcpy(buf, p, m);
    buf[m] = 0;
    while (m && (buf[m - 1] == '\r' || buf[m - 1] == '\n')) buf[--m] = 0;
    if (starts(buf, m, "HTTP/")) {  /* a new answer (after a redirect or a 100): forget the last one's */
        s->r->size = -1; s->r->range_start = -1; s->r->range_end = -1; s->r->etag[0] = 0; s->r->got = 0;
        s->over = 0; s->lm = -1; s->valid = -1; s->http = 0;
        const char *v = memchr(buf, ' ', m);
        if (v) s->http = atoi(v + 1);
        s->redirect = s->http >= 300 && s->http < 400;
    } else if (starts(buf, m, "last-modified:")) {
        const char *v = buf + 14;
        while (*v == ' ') v++;
        long t = C.getdate ? C.getdate(v, NULL) : -1;
        s->lm = t >= 0 ? (int64_t)t : -2;
    } else if (starts(buf, m, "content-range:")) {
        long long a = -1, b = -1, t = -1;
        const char *v = buf + 14;
        while (*v == ' ') v++;
        if (sscanf(v, "bytes %lld-%lld/%lld", &a, &b, &t) == 3) {
            s->r->range_start = a; s->r->range_end = b; s->r->size = t;
        }
    } else if (starts(buf, m, "content-length:") && s->r->end < 0 && s->r->start >= 0) {
        long long t = -1;
        if (sscanf(buf + 15, " %lld", &t) == 1) s->r->size = t;  /* a whole object's size */
    } else if (starts(buf, m, "etag:")) {
        const char *v = buf + 5;
        while (*v == ' ') v++;
        snprintf(s->r->etag, sizeof s->r->etag, "%.95s", v);
    }
    return len;
}

static int64_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}


/* a finished answer is complete: its status, Content-Range (start, end, total) and length are
 * what was asked for (a suffix's range ends at the object's end) */
static int complete(const gz_http_req *r) {
    if (r->end < 0 && r->start >= 0) return r->status == 200 && (r->size < 0 || r->got == r->size);
    if (r->status != 206 || r->got <= 0) return 0;
    if (r->start < 0) {
        int64_t want = r->size < -r->start ? r->size : -r->start;
        return r->size > 0 && r->got == want && r->range_start == r->size - want && r->range_end == r->size - 1;
    }
    return r->range_start == r->start && r->range_end == r->end - 1 && r->got == r->end - r->start &&
           r->size >= r->end;
}

/* One fetch's state shared by its agents (each a thread with a multi handle of its own): one
 * thread receiving every body was the limit of big reads (81 MiB of shards on the H200 VM: 46 ms
 * at 20 ms a request with one thread, 32 with four; 31 and 13 ms at 0 ms). Requests are handed
 * out from one queue as an agent has room, so big and small answers spread by themselves. */
typedef struct {
    const char **urls;
    gz_http_req *reqs;
    int64_t n;
    struct curl_slist *hdr;
    int64_t connect_timeout_ms, low_speed_s, backoff_ms;
    int64_t timeout_ms, min_rate;  /* per request: deadline (retries and redirects included; 0 none), bytes/s */
    int tick_ms, max_redirs;       /* done(-2) every tick_ms on the caller's thread (0: never); redirect hops */
    int64_t *deadline;             /* per request: when it must have finished (ms, now_ms's clock; -1 none) */
    char **moved;                  /* per request: the URL it was redirected to (NULL: its own) */
    unsigned char *hops, *bare;    /* per request: redirects followed; 1: the host changed (no caller headers) */
    int attempts;
    volatile int32_t *cancel;
    pthread_mutex_t mu;
    int64_t *queue, qhead, qn;   /* requests to start (a ring of n) */
    int64_t *retry_at, waiting;  /* per request: when its backoff ends (-1: not waiting); how many wait */
    int64_t finished;            /* requests finished for good */
    int64_t *done_q, done_head, done_tail;  /* finished by helpers, reported by the caller's agent */
    CURLM *caller_m;             /* the caller's multi: woken when a helper finishes a request */
    volatile int64_t *sink_set;  /* the decode set complete whole bodies go to (0: not open yet), or NULL */
    const int64_t *sink;         /* per request: its chunk in that set, -1 none */
    int64_t *late, nlate;        /* handed to the set by the caller's agent: reported when it has nothing to receive */
    int tell_sent;               /* the caller's agent calls done(-1) once its first requests are on their way */
    int armed;                   /* the destinations are set (0 until done(-1) returns, for tell_sent 2) */
    const gz_http_parts *parts;  /* parts handed to the sink's set as bodies arrive, or NULL */
} fetch_t;

typedef struct {
    fetch_t *f;
    agent_t a;
    int cap;                     /* requests in flight on this agent */
    int main;                    /* the caller's agent: it reports every request (done) */
    gz_http_done_fn done;
    int rc;
    pthread_t th;
} runner_t;

static void start_one(runner_t *ag, slot_t *s, CURL *e, int64_t i) {
    fetch_t *f = ag->f;
    gz_http_req *r = &f->reqs[i];
    memset(s, 0, sizeof *s);
    s->r = r; s->i = i; s->armed = &f->armed; s->lm = -1; s->valid = -1;
    if (f->parts && f->sink_set) {
        s->all = f->parts; s->set = f->sink_set;
        if (f->parts->at[i + 1] > f->parts->at[i]) { s->parts = f->parts; s->pi = i; }
    }
    r->got = 0; r->size = -1; r->range_start = -1; r->range_end = -1; r->etag[0] = 0; r->attempts++;
    int64_t t0 = now_ms();
    if (f->deadline[i] < 0 && f->timeout_ms > 0) f->deadline[i] = t0 + f->timeout_ms;
    C.easy_setopt(e, O_URL, f->moved[i] ? f->moved[i] : f->urls[i]);
    C.easy_setopt(e, O_WRITEFUNCTION, on_body);
    C.easy_setopt(e, O_WRITEDATA, (void *)s);
    C.easy_setopt(e, O_HEADERFUNCTION, on_header);
    C.easy_setopt(e, O_HEADERDATA, (void *)s);
    C.easy_setopt(e, O_PRIVATE, (void *)s);
    C.easy_setopt(e, O_ERRORBUFFER, s->err);
    C.easy_setopt(e, O_FOLLOWLOCATION, 0L);  /* followed by follow() (checked), not by libcurl */
    C.easy_setopt(e, O_FILETIME, 1L);
    C.easy_setopt(e, O_NOSIGNAL, 1L);
    C.easy_setopt(e, O_TCP_NODELAY, 1L);
    /* libcurl allocates its receive buffer per transfer: 512 KiB for big answers (81 MiB of
     * whole shards: 16 ms of CPU against 28 with the default 16 KiB, fewer calls), the default
     * for the rest (a fresh 512 KiB buffer cost ~120 page faults per 512 KiB chunk) */
    C.easy_setopt(e, O_BUFFERSIZE, r->cap >= (2 << 20) ? 512L * 1024 : 16L * 1024);
    C.easy_setopt(e, O_CONNECTTIMEOUT_MS, (long)f->connect_timeout_ms);
    /* under min_rate B/s for low_speed_s: timed out (a body dripped slowly ends too) */
    C.easy_setopt(e, O_LOW_SPEED_LIMIT, (long)(f->min_rate > 0 ? f->min_rate : 1));
    C.easy_setopt(e, O_LOW_SPEED_TIME, (long)f->low_speed_s);
    /* what is left of the request's deadline (its earlier attempts and redirects spent the rest) */
    int64_t left = f->deadline[i] >= 0 ? f->deadline[i] - t0 : 0;
    C.easy_setopt(e, O_TIMEOUT_MS, (long)(f->deadline[i] < 0 ? 0 : left > 1 ? left : 1));
    C.easy_setopt(e, O_USERAGENT, "gpu-zarr");
    C.easy_setopt(e, O_HTTPHEADER, f->bare[i] ? NULL : f->hdr);
    if (r->end >= 0 && r->start >= 0) {
        snprintf(s->range, sizeof s->range, "%lld-%lld", (long long)r->start, (long long)r->end - 1);
        C.easy_setopt(e, O_RANGE, s->range);
    } else if (r->start < 0) {
        snprintf(s->range, sizeof s->range, "-%lld", (long long)-r->start);
        C.easy_setopt(e, O_RANGE, s->range);
    } else {
        C.easy_setopt(e, O_RANGE, (char *)NULL);
    }
}

/* a finished transfer: retry it (1) or not (0) */
static int again_after(int code, const slot_t *s, int attempts, int64_t deadline) {
    const gz_http_req *r = s->r;
    if (deadline >= 0 && now_ms() >= deadline) return 0;  /* its time is spent: it fails as it is */
    int ranged = r->end >= 0 || r->start < 0;
    int again;
    if (code == 0 && complete(r)) again = 0;
    else if (s->over || s->changed) again = 0;                          /* longer than asked for: the caller decides */
    else if (code != 0) again = transient(code, 0);
    else if (transient(0, r->status)) again = 1;          /* 429, 5xx */
    else if (r->status == 206 && r->start >= 0 && r->size >= 0 && r->end > r->size) again = 0;  /* shorter now */
    else if (r->status == 206 || (r->status == 200 && !ranged)) again = 1;  /* cut short or misplaced */
    else again = 0;                                       /* 404, 403, 416, a 200 to a range: final */
    return again && r->attempts < attempts;
}

/* "scheme://host[:port]" of url, lower case, into out (empty when it has none) */
static void origin_of(const char *url, char *out, size_t cap) {
    out[0] = 0;
    const char *p = strstr(url, "://");
    if (!p) return;
    p += 3;
    size_t k = (size_t)(p - url);
    while (p[0] && p[0] != '/' && p[0] != '?' && p[0] != '#') p++;
    const char *at = NULL;  /* user info is not part of the host */
    for (const char *q = url + k; q < p; q++) if (*q == '@') at = q;
    size_t n = 0;
    for (const char *q = url; q < url + k && n + 1 < cap; q++) out[n++] = (char)tolower((unsigned char)*q);
    for (const char *q = at ? at + 1 : url + k; q < p && n + 1 < cap; q++) out[n++] = (char)tolower((unsigned char)*q);
    out[n] = 0;
}

/* A redirect answer of request i: 1 when it is followed (its next attempt asks the new URL),
 * else 0 with the request failed as REFUSED and err saying why. Only http(s), never from https to
 * http, at most max_redirs hops; the caller's headers are not sent once the host changed. */
static int follow(fetch_t *f, CURL *e, int64_t i) {
    gz_http_req *r = &f->reqs[i];
    const char *from = f->moved[i] ? f->moved[i] : f->urls[i];
    char *to = NULL;
    if (C.easy_getinfo(e, I_REDIRECT_URL, &to) != 0 || !to || !to[0]) return 0;  /* no Location: the 3xx stands */
    const char *why = NULL;
    int https_from = strncasecmp(from, "https://", 8) == 0;
    if (strncasecmp(to, "https://", 8) != 0 && strncasecmp(to, "http://", 7) != 0) why = "not an http(s) URL";
    else if (https_from && strncasecmp(to, "https://", 8) != 0) why = "from https to plain http";
    else if (f->hops[i] >= f->max_redirs) why = "too many redirects";
    if (why) {
        r->status = REFUSED;
        snprintf(r->err, sizeof r->err, "redirect to %.60s refused: %s", to, why);
        return 0;
    }
    char a[256], b[256];
    origin_of(from, a, sizeof a);
    origin_of(to, b, sizeof b);
    char *copy = strdup(to);
    if (!copy) return 0;
    if (strcmp(a, b) != 0) f->bare[i] = 1;  /* another host: storage_options' headers stay behind */
    free(f->moved[i]);
    f->moved[i] = copy;
    f->hops[i]++;
    r->attempts--;  /* a hop is not an attempt */
    return 1;
}

/* the caller's agent reports what helpers finished (on the caller's thread, in their order) */
static void report_helpers(runner_t *ag) {
    fetch_t *f = ag->f;
    for (;;) {
        pthread_mutex_lock(&f->mu);
        int64_t h = f->done_head, t = f->done_tail;
        f->done_head = t;
        pthread_mutex_unlock(&f->mu);
        if (h == t) return;
        for (int64_t k = h; k < t; k++) if (ag->done) ag->done(f->done_q[k]);
    }
}

/* a request finished for good with a complete body: hand it to the fetch's decode set (the
 * sink) when it has one for it, so decoding starts without a trip through the caller's callback;
 * 1 when handed (its `added` says so) */
static int handed(fetch_t *f, int64_t i, int code) {
    gz_http_req *r = &f->reqs[i];
    if (!f->sink_set || !f->sink || f->sink[i] < 0) return 0;  /* (a request with parts keeps its count) */
    r->added = 0;
    if (code != 0 || r->got <= 0 || !complete(r)) return 0;
    void *set = (void *)(intptr_t)__atomic_load_n(f->sink_set, __ATOMIC_ACQUIRE);
    if (!set || gz_arrivals_add(set, f->sink[i], r->dest, r->got) != 0) return 0;
    r->added = 1;
    return 1;
}

/* the caller's agent reports what it handed to the decode set (when nothing else is readable) */
static void report_late(runner_t *ag) {
    fetch_t *f = ag->f;
    for (int64_t k = 0; k < f->nlate; k++) {
        if (f->cancel && *f->cancel) break;  /* (the caller stopped: what is left goes unreported) */
        if (ag->done) ag->done(f->late[k]);
    }
    f->nlate = 0;
}

static void *run_agent(void *p) {
    runner_t *ag = p;
    fetch_t *f = ag->f;
    int cap = ag->cap;
    CURLM *m = ag->a.m;
    CURL **easy = ag->a.easy;
    slot_t *slots = calloc((size_t)cap, sizeof *slots);
    int *free_slots = calloc((size_t)cap, sizeof *free_slots);
    int64_t *take = malloc((size_t)cap * sizeof *take);
    if (!slots || !free_slots || !take) {  /* a helper that cannot start leaves its share to the others */
        if (ag->main) ag->rc = -4;
        goto out;
    }
    long maxconn = cap > 64 ? cap : 64;
    C.multi_setopt(m, M_MAXCONNECTS, maxconn);
    int nfree = cap, active = 0;
    for (int k = 0; k < cap; k++) free_slots[k] = cap - 1 - k;
    int64_t ticked = now_ms();
    for (;;) {
        if (ag->main) report_helpers(ag);
        if (ag->main && f->tick_ms > 0 && ag->done && now_ms() - ticked >= f->tick_ms) {
            ticked = now_ms();
            ag->done(-2);  /* the caller looks at its cancel event (and Python at Ctrl-C) */
        }
        if (f->cancel && *f->cancel) { ag->rc = -3; break; }
        int64_t t = now_ms(), soonest = INT64_MAX;
        int ntake = 0;
        pthread_mutex_lock(&f->mu);
        int64_t finished = f->finished;
        if (finished < f->n) {
            /* requests whose backoff is over go back to the queue's end (it never holds more than n) */
            if (f->waiting) {
                for (int64_t i = 0; i < f->n; i++) {
                    if (f->retry_at[i] >= 0 && f->retry_at[i] <= t) {
                        f->retry_at[i] = -1; f->waiting--;
                        f->queue[(f->qhead + f->qn) % f->n] = i; f->qn++;
                    } else if (f->retry_at[i] >= 0 && f->retry_at[i] < soonest) {
                        soonest = f->retry_at[i];
                    }
                }
            }
            while (f->qn && ntake < nfree) { take[ntake++] = f->queue[f->qhead]; f->qhead = (f->qhead + 1) % f->n; f->qn--; }
        }
        int64_t waiting = f->waiting, queued = f->qn;
        pthread_mutex_unlock(&f->mu);
        if (finished >= f->n) {
            if (ag->main) { report_helpers(ag); report_late(ag); }  /* (a helper's last one, pushed before `finished` grew) */
            break;
        }
        /* a helper with nothing in flight and nothing to take leaves; the caller's agent stays
         * until every request has finished (it takes what helpers leave for a retry) */
        if (!ag->main && !active && !ntake && !waiting && !queued) break;
        for (int j = 0; j < ntake; j++) {
            int k = free_slots[--nfree];
            if (!easy[k]) easy[k] = C.easy_init();
            start_one(ag, &slots[k], easy[k], take[j]);
            C.multi_add(m, easy[k]);
            active++;
        }
        int running = 0;
        C.multi_perform(m, &running);
        if (ag->main && f->tell_sent) {
            /* its first requests are written (on kept connections: one perform sends them):
             * the caller sets up what it needs for the answers while they travel */
            f->tell_sent = 0;
            if (ag->done) ag->done(-1);
            if (f->cancel && *f->cancel) { ag->rc = -3; break; }
            if (!f->armed) {  /* the destinations are set now: a body that came during the first perform goes on */
                f->armed = 1;
                for (int k = 0; k < cap; k++)
                    if (slots[k].paused) { slots[k].paused = 0; C.easy_pause(easy[k], 0 /* CURLPAUSE_CONT */); }
            }
        }
        CURLMsg *msg;
        int left;
        while ((msg = C.multi_info_read(m, &left))) {
            if (msg->msg != MSG_DONE) continue;
            CURL *e = msg->easy;
            int code = msg->data.result;
            slot_t *s = NULL;
            C.easy_getinfo(e, I_PRIVATE, (char **)&s);
            gz_http_req *r = s->r;
            long status = 0;
            C.easy_getinfo(e, I_RESPONSE_CODE, &status);
            int64_t ft = -1;
            if (C.easy_getinfo(e, I_FILETIME_T, &ft) == 0) r->mtime = ft;
            C.multi_remove(m, e);
            active--;
            s->paused = 0;
            r->curl = code;
            snprintf(r->err, sizeof r->err, "%.127s", code ? (s->err[0] ? s->err : C.easy_strerror(code)) : "");
            r->status = s->changed ? CHANGED : s->over ? -2 : (status ? (int32_t)status : -1);
            free_slots[nfree++] = (int)(s - slots);
            int moved = 0, again;
            if (code == 0 && s->redirect && !s->changed && (f->deadline[s->i] < 0 || now_ms() < f->deadline[s->i])) {
                pthread_mutex_lock(&f->mu);  /* (moved, hops and bare are read by start_one under the queue's lock) */
                moved = follow(f, e, s->i);
                pthread_mutex_unlock(&f->mu);
            }
            again = moved || (r->status != REFUSED && again_after(code, s, f->attempts, f->deadline[s->i]));
            pthread_mutex_lock(&f->mu);
            if (moved) {  /* at once, not after a backoff */
                f->retry_at[s->i] = now_ms();
                f->waiting++;
            } else if (again) {
                int64_t wait = f->backoff_ms << (r->attempts - 1 < 7 ? r->attempts - 1 : 7);
                int64_t at = now_ms() + (wait < 5000 ? wait : 5000), dl = f->deadline[s->i];
                f->retry_at[s->i] = dl >= 0 && at > dl ? dl : at;  /* (its last attempt gets what is left) */
                f->waiting++;
            } else if (!ag->main) {
                handed(f, s->i, code);
                f->done_q[f->done_tail++] = s->i;
            }
            if (!again) f->finished++;
            pthread_mutex_unlock(&f->mu);
            if (again) continue;
            if (ag->main && handed(f, s->i, code)) { f->late[f->nlate++] = s->i; continue; }  /* reported later */
            if (ag->main) { if (ag->done) ag->done(s->i); }
            else if (C.multi_wakeup) C.multi_wakeup(f->caller_m);
        }
        pthread_mutex_lock(&f->mu);
        finished = f->finished;
        waiting = f->waiting;
        pthread_mutex_unlock(&f->mu);
        if (finished >= f->n) continue;  /* all in: no wait (the top reports and leaves) */
        int timeout = 100;
        if (soonest != INT64_MAX) {
            int64_t d = soonest - now_ms();
            timeout = d < 0 ? 0 : (d < 100 ? (int)d : 100);
        }
        if (ag->main && f->nlate) {  /* answers handed to the decode set wait for their report while others arrive */
            int ready = 0;
            if (active) C.multi_poll(m, NULL, 0, 0, &ready);
            if (!ready) report_late(ag);
            if (ready || (f->cancel && *f->cancel)) continue;
        }
        if (active || (ag->main && C.multi_wakeup)) C.multi_poll(m, NULL, 0, timeout, NULL);  /* (woken by helpers) */
        else if (waiting && timeout > 0) {  /* only backoffs are left to wait for (else: the top takes or leaves) */
            struct timespec ts = {0, (long)timeout * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
out:
    for (int k = 0; k < ag->a.n; k++) {
        if (!easy || !easy[k]) continue;
        C.multi_remove(m, easy[k]);  /* a no-op for handles not in the multi */
        if (slots && k < cap && slots[k].paused) {  /* (stopped while paused: not kept, no state carried over) */
            C.easy_cleanup(easy[k]);
            easy[k] = NULL;
            continue;
        }
        /* kept for the next call; nothing of this call may stay attached to it */
        C.easy_setopt(easy[k], O_HTTPHEADER, (void *)NULL);
        C.easy_setopt(easy[k], O_WRITEDATA, (void *)NULL);
        C.easy_setopt(easy[k], O_HEADERDATA, (void *)NULL);
        C.easy_setopt(easy[k], O_PRIVATE, (void *)NULL);
        C.easy_setopt(easy[k], O_ERRORBUFFER, (char *)NULL);
    }
    free(slots); free(free_slots); free(take);
    return NULL;
}

/* GET every request (request i of the i-th of the n NUL-terminated strings in urls, urls_len
 * bytes in all: one buffer, not an array of pointers made per call), up to in_flight at once
 * over `agents` threads (the caller's and agents - 1 more; 1 where libcurl has no
 * curl_multi_wakeup), each request at most attempts times (backoff_ms, doubled per attempt, at
 * most 5 s); done(i) is called on the caller's
 * thread as request i finishes for good (complete, or failed: its status and curl code say
 * how). *cancel != 0 stops the call early. Returns 0, or -1 when libcurl is missing, -3 when
 * cancelled, -4 out of memory, -5 urls that are not n strings.
 * The sink (both NULL: none): request i's complete body goes to chunk sink[i] (>= 0) of the
 * decode set whose handle is in *sink_set (gz_arrivals_open; 0 while it is not open, and those
 * answers are only reported) the moment it is in; such a request has `added` 1, and the caller's
 * agent reports it when nothing else is readable or at the end (so its callback runs while
 * the set decodes, not between the answers). The set must stay open until this returns.
 * tell_sent != 0: done(-1) is called once, on the caller's thread, right after its agent's first
 * requests are written, before any answer is taken (the caller's setup overlaps the round trip).
 * tell_sent == 2: besides, the destinations (each request's dest) are set by done(-1): no body is
 * written before it returns (one that comes sooner is paused until then), and one agent runs.
 * parts (NULL: none; needs the sink's set): see gz_http_parts; such a request's sink entry is -1,
 * its `added` counts the parts handed, and it is reported as usual when it finishes. */
API int gz_http_fetch(const char *urls, int64_t urls_len, gz_http_req *reqs, int64_t n, int in_flight, const char **headers,
                      int nheaders, int64_t connect_timeout_ms, int64_t low_speed_s, int attempts, int64_t backoff_ms,
                      gz_http_done_fn done, volatile int32_t *cancel, int agents, volatile int64_t *sink_set,
                      const int64_t *sink, int tell_sent, const gz_http_parts *parts, int64_t timeout_ms,
                      int64_t min_rate, int tick_ms, int max_redirs) {
    pthread_once(&curl_once, curl_load);
    if (!C.ok) return -1;
    if (n <= 0) return 0;
    if (in_flight < 1) in_flight = 1;
    if (in_flight > n) in_flight = (int)n;
    if (attempts < 1) attempts = 1;
    if (agents > MAX_AGENTS) agents = MAX_AGENTS;
    if (agents > in_flight) agents = in_flight;
    if (agents < 1 || !C.multi_wakeup || tell_sent == 2) agents = 1;
    fetch_t f;
    memset(&f, 0, sizeof f);
    f.reqs = reqs; f.n = n; f.connect_timeout_ms = connect_timeout_ms; f.low_speed_s = low_speed_s;
    f.backoff_ms = backoff_ms; f.attempts = attempts; f.cancel = cancel;
    f.timeout_ms = timeout_ms > 0 ? timeout_ms : 0; f.min_rate = min_rate; f.tick_ms = tick_ms;
    f.max_redirs = max_redirs < 0 ? 0 : max_redirs > 50 ? 50 : max_redirs;
    if (sink_set && sink) { f.sink_set = sink_set; f.sink = sink; f.parts = parts; }
    f.tell_sent = tell_sent != 0;
    f.armed = tell_sent != 2;
    for (int k = 0; k < nheaders; k++) f.hdr = C.slist_append(f.hdr, headers[k]);
    f.queue = malloc((size_t)n * sizeof *f.queue);
    f.retry_at = malloc((size_t)n * sizeof *f.retry_at);
    f.done_q = malloc((size_t)n * sizeof *f.done_q);
    f.late = malloc((size_t)n * sizeof *f.late);
    f.urls = malloc((size_t)n * sizeof *f.urls);
    f.deadline = malloc((size_t)n * sizeof *f.deadline);
    f.moved = calloc((size_t)n, sizeof *f.moved);
    f.hops = calloc((size_t)n, 1);
    f.bare = calloc((size_t)n, 1);
    runner_t ag[MAX_AGENTS];
    memset(ag, 0, sizeof ag);
    int rc = 0, made = 0;
    if (!f.queue || !f.retry_at || !f.done_q || !f.late || !f.urls || !f.deadline || !f.moved || !f.hops || !f.bare) {
        rc = -4;
        goto out;
    }
    {  /* the URLs: n NUL-terminated strings back to back, urls_len bytes in all, nothing left over */
        const char *p = urls, *end = urls + urls_len;
        for (int64_t i = 0; i < n; i++) {
            const char *z = p < end ? memchr(p, 0, (size_t)(end - p)) : NULL;
            if (!z) { rc = -5; goto out; }
            f.urls[i] = p;
            p = z + 1;
        }
        if (p != end) { rc = -5; goto out; }
    }
    pthread_mutex_init(&f.mu, NULL);
    f.qn = n;
    for (int64_t i = 0; i < n; i++) {
        f.queue[i] = i; f.retry_at[i] = -1; f.deadline[i] = -1;
        reqs[i].attempts = 0; reqs[i].range_end = -1; reqs[i].status = -1; reqs[i].curl = 0; reqs[i].got = 0; reqs[i].added = 0;
        reqs[i].size = -1; reqs[i].mtime = -1; reqs[i].range_start = -1; reqs[i].etag[0] = 0; reqs[i].err[0] = 0;
    }
    for (int k = 0; k < agents; k++) {
        int cap = in_flight / agents + (k < in_flight % agents);
        ag[k].f = &f; ag[k].cap = cap; ag[k].main = k == 0; ag[k].done = done;
        ag[k].a = take_agent(cap);
        if (!ag[k].a.m || ag[k].a.n < cap) { give_agent(ag[k].a); ag[k].a.m = NULL; break; }
        made++;
    }
    if (!made) { rc = -4; goto out; }  /* (agents that could not be had leave their share to the others) */
    f.caller_m = ag[0].a.m;
    int started = 1;
    for (int k = 1; k < made; k++)
        if (pthread_create(&ag[k].th, NULL, run_agent, &ag[k]) == 0) started = k + 1; else break;
    /* agents that could not start leave their share to the others (the queue is shared) */
    for (int k = started; k < made; k++) { give_agent(ag[k].a); ag[k].a.m = NULL; }
    run_agent(&ag[0]);
    if (ag[0].rc == -3) {  /* cancelled: the helpers see it at their next look; wake them now */
        for (int k = 1; k < started; k++) if (C.multi_wakeup) C.multi_wakeup(ag[k].a.m);
    }
    for (int k = 1; k < started; k++) pthread_join(ag[k].th, NULL);
    for (int k = 0; k < started; k++) {
        if (ag[k].rc && !rc) rc = ag[k].rc;
        give_agent(ag[k].a);
    }
    if (!rc) { report_helpers(&ag[0]); report_late(&ag[0]); }  /* (nothing is left: every request was reported above) */
    pthread_mutex_destroy(&f.mu);
out:
    if (f.hdr) C.slist_free_all(f.hdr);
    if (f.moved) for (int64_t i = 0; i < n; i++) free(f.moved[i]);
    free(f.queue); free(f.retry_at); free(f.done_q); free(f.late); free((void *)f.urls);
    free(f.deadline); free(f.moved); free(f.hops); free(f.bare);
    return rc;
}

/* *slot = value, released: a receiving thread that reads the slot sees what value points to */
API void gz_http_publish(volatile int64_t *slot, int64_t value) { __atomic_store_n(slot, value, __ATOMIC_RELEASE); }

API const char *gz_http_strerror(int code) {
    pthread_once(&curl_once, curl_load);
    return C.ok ? C.easy_strerror(code) : C.why;
}
