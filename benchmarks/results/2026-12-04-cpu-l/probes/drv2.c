#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef struct { int64_t start, end; uint8_t *dest; int64_t cap, got, size, mtime, range_start; int32_t status, curl, attempts, added; char etag[96]; char err[128]; } req_t;
typedef int (*fetch_fn)(const char **, req_t *, int64_t, int, const char **, int, int64_t, int64_t, int, int64_t, void (*)(int64_t), volatile int32_t *, int, volatile int64_t *, const int64_t *, int);
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static double t_sent;
static int SPIN; static void done(int64_t i) { if (i < 0) { t_sent = now(); double e = t_sent + SPIN * 1e-6; while (now() < e); } }
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW);
    fetch_fn f = (fetch_fn)dlsym(h, "gz_http_fetch");
    const char *base = argv[2];
    int N = atoi(argv[3]); SPIN = atoi(argv[4]);
    static uint8_t buf[4][1 << 21];
    for (int k = 0; k < N; k++) {
        int z = (7 * k + 3) % 64;
        char u[4][256]; const char *urls[4];
        for (int j = 0; j < 4; j++) { snprintf(u[j], 256, "%s/c/%d/%d/%d", base, z, j / 2, j % 2); urls[j] = u[j]; }
        req_t r[4]; memset(r, 0, sizeof r);
        for (int j = 0; j < 4; j++) { r[j].end = -1; r[j].dest = buf[j]; r[j].cap = 1 << 21; }
        struct timespec ts = {0, 10000000}; nanosleep(&ts, NULL);
        double t0 = now();
        int rc = f(urls, r, 4, 64, NULL, 0, 10000, 60, 9, 50, done, NULL, 1, NULL, NULL, 1);
        double t1 = now();
        printf("%.9f %.9f %.9f %d %d\n", t0, t_sent, t1, rc, r[0].status);
        fflush(stdout);
    }
    return 0;
}
