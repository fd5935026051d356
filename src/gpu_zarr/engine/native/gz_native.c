/* gz_native: the host side of gpu_zarr at native speed (loaded with ctypes).
 *
 * Batched calls, each spread over N pthreads, no Python per file or chunk:
 *   gz_read      read byte ranges of many files into one buffer
 *   gz_decode    decode many chunks (zstd, LZ4 block, numcodecs' sized LZ4, zlib, gzip, raw deflate, Blosc 1.x)
 *   gz_place     scatter decoded C-order chunks into an n-d output (strided copy)
 *   gz_fused     read + decode + place per chunk (the small-read path)
 *   gz_delta     the Delta filter's decode: a running sum per chunk
 *   gz_unshuffle the Shuffle filter's decode: each chunk's byte planes back into elements
 *   gz_stat      size, modification time and kind of many files (locating chunk files)
 * Codec libraries are loaded at run time with dlopen (no -dev packages needed); every
 * destination and size is checked, and each item gets a status (see gz_strerror).
 * Build: cc -O3 -shared -fPIC -pthread gz_native.c -o libgz_native.so -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

enum { C_RAW = 0, C_ZSTD = 1, C_LZ4 = 2, C_ZLIB = 3, C_GZIP = 4, C_DEFLATE = 5, C_BLOSC = 6, C_LZ4_SIZED = 7 };
enum {
    S_OK = 0, S_OPEN = 1, S_SHORT = 2, S_IO = 3, S_BOUNDS = 4,
    S_CORRUPT = 10, S_SIZE = 11, S_HEADER = 12, S_BLOCKS = 13, S_STREAM = 14, S_MEMORY = 15,
    S_CRC32 = 16, S_ADLER32 = 17, S_CRC32C = 18,
    S_UNSUP_NOLIB = 20, S_UNSUP_BLOSCLZ = 21, S_UNSUP_SNAPPY = 22, S_UNSUP_BLOSC2 = 23, S_UNSUP_CODEC = 24,
    S_NOT_ADDED = 30, /* gz_arrivals: the chunk was never added */
};

API const char *gz_strerror(int s) {
    switch (s) {
    case S_OK: return "ok";
    case S_OPEN: return "the file could not be opened";
    case S_SHORT: return "the file ends before the bytes the read needs";
    case S_IO: return "the read failed";
    case S_BOUNDS: return "a range lies outside its buffer";
    case S_CORRUPT: return "the decoder rejected the stream";
    case S_SIZE: return "it decodes to another size than the array's chunks hold";
    case S_HEADER: return "its Blosc header is invalid";
    case S_BLOCKS: return "its Blosc block table points outside the chunk";
    case S_STREAM: return "a Blosc stream size is invalid or runs past the chunk";
    case S_MEMORY: return "out of memory";
    case S_CRC32: return "the gzip trailer's CRC-32 does not match the decoded bytes";
    case S_ADLER32: return "the zlib trailer's Adler-32 does not match the decoded bytes";
    case S_CRC32C: return "its crc32c checksum does not match its bytes";
    case S_UNSUP_NOLIB: return "the codec library is not loaded";
    case S_UNSUP_BLOSCLZ: return "Blosc inner codec blosclz";
    case S_UNSUP_SNAPPY: return "Blosc inner codec snappy";
    case S_UNSUP_BLOSC2: return "a Blosc2-format chunk";
    case S_UNSUP_CODEC: return "unknown codec";
    case S_NOT_ADDED: return "its bytes never arrived";
    }
    return "unknown status";
}

/* ---------------------------------------------------------------- codec libraries */
typedef size_t (*zstd_dec_t)(void *, void *, size_t, const void *, size_t);
typedef void *(*zstd_new_t)(void);
typedef unsigned (*zstd_iserr_t)(size_t);
typedef int (*lz4_dec_t)(const char *, char *, int, int);
typedef struct {
    const uint8_t *next_in; unsigned avail_in; unsigned long total_in;
    uint8_t *next_out; unsigned avail_out; unsigned long total_out;
    const char *msg; void *state; void *zalloc, *zfree, *opaque;
    int data_type; unsigned long adler, reserved;
} z_stream;
typedef int (*z_init2_t)(z_stream *, int, const char *, int);
typedef int (*z_reset2_t)(z_stream *, int);
typedef int (*z_inflate_t)(z_stream *, int);
typedef int (*z_end_t)(z_stream *);
typedef const char *(*z_version_t)(void);
typedef unsigned long (*z_sum_t)(unsigned long, const uint8_t *, unsigned);
typedef uint32_t (*ld_sum_t)(uint32_t, const void *, size_t);
typedef void *(*ld_new_t)(void);
typedef int (*ld_dec_t)(void *, const void *, size_t, void *, size_t, size_t *, size_t *);

static struct {
    int ok[4]; /* zstd, lz4, zlib, libdeflate */
    char why[4][200];
    zstd_dec_t zstd_dec; zstd_new_t zstd_new; zstd_iserr_t zstd_iserr;
    lz4_dec_t lz4_dec;
    z_init2_t z_init2; z_reset2_t z_reset2; z_inflate_t z_inflate; z_end_t z_end; const char *z_ver;
    ld_new_t ld_new; ld_dec_t ld_deflate, ld_zlib, ld_gzip;
    z_sum_t z_crc32, z_adler32; ld_sum_t ld_crc32, ld_adler32;
} L;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void *sym(void *h, const char *name, int k) {
    void *p = h ? dlsym(h, name) : NULL;
    if (h && !p && L.ok[k]) { L.ok[k] = 0; snprintf(L.why[k], sizeof L.why[k], "no symbol %s", name); }
    return p;
}

static void *lib(int k, const char *a, const char *b) {
    void *h = dlopen(a, RTLD_NOW | RTLD_LOCAL);
    if (!h && b) h = dlopen(b, RTLD_NOW | RTLD_LOCAL);
    L.ok[k] = h != NULL;
    if (!h) snprintf(L.why[k], sizeof L.why[k], "%s", dlerror());
    return h;
}

static void load(void) {
    void *h = lib(0, "libzstd.so.1", "libzstd.so");
    L.zstd_dec = (zstd_dec_t)sym(h, "ZSTD_decompressDCtx", 0);
    L.zstd_new = (zstd_new_t)sym(h, "ZSTD_createDCtx", 0);
    L.zstd_iserr = (zstd_iserr_t)sym(h, "ZSTD_isError", 0);
    h = lib(1, "liblz4.so.1", "liblz4.so");
    L.lz4_dec = (lz4_dec_t)sym(h, "LZ4_decompress_safe", 1);
    h = lib(2, "libz.so.1", "libz.so");
    L.z_init2 = (z_init2_t)sym(h, "inflateInit2_", 2);
    L.z_reset2 = (z_reset2_t)sym(h, "inflateReset2", 2);
    L.z_inflate = (z_inflate_t)sym(h, "inflate", 2);
    L.z_end = (z_end_t)sym(h, "inflateEnd", 2);
    L.z_crc32 = (z_sum_t)sym(h, "crc32", 2);
    L.z_adler32 = (z_sum_t)sym(h, "adler32", 2);
    z_version_t ver = (z_version_t)sym(h, "zlibVersion", 2);
    if (L.ok[2]) L.z_ver = ver();
    h = lib(3, "libdeflate.so.0", "libdeflate.so");
    L.ld_new = (ld_new_t)sym(h, "libdeflate_alloc_decompressor", 3);
    L.ld_deflate = (ld_dec_t)sym(h, "libdeflate_deflate_decompress_ex", 3);
    L.ld_zlib = (ld_dec_t)sym(h, "libdeflate_zlib_decompress_ex", 3);
    L.ld_gzip = (ld_dec_t)sym(h, "libdeflate_gzip_decompress_ex", 3);
    L.ld_crc32 = (ld_sum_t)sym(h, "libdeflate_crc32", 3);
    L.ld_adler32 = (ld_sum_t)sym(h, "libdeflate_adler32", 3);
    for (int k = 0; k < 4; k++) if (L.ok[k]) L.why[k][0] = 0;
}

/* bit k set: library k loaded (0 zstd, 1 lz4, 2 zlib, 3 libdeflate) */
API int gz_libraries(void) {
    pthread_once(&once, load);
    return L.ok[0] | L.ok[1] << 1 | L.ok[2] << 2 | L.ok[3] << 3;
}

API const char *gz_library_error(int k) {
    pthread_once(&once, load);
    return (k >= 0 && k < 4) ? L.why[k] : "";
}

API int gz_version(void) { return 14; }

/* ---------------------------------------------------------------- decoder contexts
 * One per worker for the call's duration, taken from and returned to a small global pool
 * (creating a zstd or zlib context allocates and touches fresh memory). */
typedef struct Ctx {
    void *zstd, *ld; z_stream *z; int z_bits;
    uint8_t *tmp; size_t tmp_cap;
    int64_t slot; /* gz_fused: this worker's slot of the caller's scratch */
    struct Ctx *next;
} Ctx;
static Ctx *free_ctx;
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;

static Ctx *ctx_get(void) {
    pthread_mutex_lock(&ctx_lock);
    Ctx *c = free_ctx;
    if (c) free_ctx = c->next;
    pthread_mutex_unlock(&ctx_lock);
    return c ? c : calloc(1, sizeof(Ctx));
}

static void ctx_put(Ctx *c) {
    if (!c) return;
    pthread_mutex_lock(&ctx_lock);
    c->next = free_ctx;
    free_ctx = c;
    pthread_mutex_unlock(&ctx_lock);
}

static uint8_t *ctx_tmp(Ctx *c, size_t n) {
    if (c->tmp_cap < n) {
        free(c->tmp);
        c->tmp = malloc(n);
        c->tmp_cap = c->tmp ? n : 0;
    }
    return c->tmp;
}

/* ---------------------------------------------------------------- stream decoders
 * Each decodes src[0:n] to exactly cap bytes at dst, consuming all of src; else an error. */
static int dec_zstd(Ctx *c, const uint8_t *s, size_t n, uint8_t *d, size_t cap) {
    if (!L.ok[0]) return S_UNSUP_NOLIB;
    if (!c->zstd && !(c->zstd = L.zstd_new())) return S_MEMORY;
    size_t r = L.zstd_dec(c->zstd, d, cap, s, n);
    if (L.zstd_iserr(r)) return S_CORRUPT;
    return r == cap ? S_OK : S_SIZE;
}

static int dec_lz4(const uint8_t *s, size_t n, uint8_t *d, size_t cap) {
    if (!L.ok[1]) return S_UNSUP_NOLIB;
    if (n > 0x7E000000u || cap > 0x7E000000u) return S_UNSUP_CODEC;
    int r = L.lz4_dec((const char *)s, (char *)d, (int)n, (int)cap);
    if (r < 0) return S_CORRUPT;
    return (size_t)r == cap ? S_OK : S_SIZE;
}

/* wrapper: C_DEFLATE (raw), C_ZLIB, C_GZIP; both libraries verify the trailers' checksums */
static int dec_inflate(Ctx *c, int wrapper, const uint8_t *s, size_t n, uint8_t *d, size_t cap) {
    if (L.ok[3]) {
        if (!c->ld && !(c->ld = L.ld_new())) return S_MEMORY;
        ld_dec_t f = wrapper == C_GZIP ? L.ld_gzip : wrapper == C_ZLIB ? L.ld_zlib : L.ld_deflate;
        size_t in = 0, out = 0;
        int r = f(c->ld, s, n, d, cap, &in, &out);
        if (r == 3) return S_SIZE;          /* more output than cap */
        if (r != 0) return S_CORRUPT;
        if (in != n) return S_CORRUPT;      /* bytes after the stream */
        return out == cap ? S_OK : S_SIZE;
    }
    if (!L.ok[2]) return S_UNSUP_NOLIB;
    if (n > 0xFFFFFFFFu || cap > 0xFFFFFFFFu) return S_UNSUP_CODEC;
    int bits = wrapper == C_GZIP ? 31 : wrapper == C_ZLIB ? 15 : -15;
    if (!c->z) {
        c->z = calloc(1, sizeof(z_stream));
        if (!c->z) return S_MEMORY;
        if (L.z_init2(c->z, bits, L.z_ver, (int)sizeof(z_stream)) != 0) { free(c->z); c->z = NULL; return S_MEMORY; }
        c->z_bits = bits;
    } else if (L.z_reset2(c->z, bits) != 0) {
        return S_MEMORY;
    }
    c->z_bits = bits;
    z_stream *z = c->z;
    z->next_in = s; z->avail_in = (unsigned)n; z->next_out = d; z->avail_out = (unsigned)cap;
    int r = L.z_inflate(z, 4 /* Z_FINISH */);
    if (r == 1 /* Z_STREAM_END */) {
        if (z->avail_in) return S_CORRUPT;
        return z->total_out == cap ? S_OK : S_SIZE;
    }
    if (r == -5 /* Z_BUF_ERROR */ && z->avail_out == 0) return S_SIZE;
    if (r == -3 /* Z_DATA_ERROR */ && z->msg && strcmp(z->msg, "incorrect data check") == 0)
        return wrapper == C_GZIP ? S_CRC32 : S_ADLER32;
    return S_CORRUPT;
}

/* ---------------------------------------------------------------- Blosc 1.x */
static int32_t rd32(const uint8_t *p) { int32_t v; memcpy(&v, p, 4); return v; }

/* AVX2 where the CPU has it (the loops below vectorise twice as wide: c-blosc's own SIMD unshuffle
 * made numcodecs' Blosc decode 2x ours with SSE2 only), chosen once at load time */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
static void unshuffle_bytes(const uint8_t *restrict s, uint8_t *restrict d, int64_t size, int ts) {
    int64_t n = size / ts;
    /* whole elements assembled in a register, then stored (the compiler vectorises these) */
    if (ts == 2) {
        const uint8_t *p0 = s, *p1 = s + n;
        for (int64_t i = 0; i < n; i++) {
            uint16_t v = (uint16_t)(p0[i] | p1[i] << 8);
            memcpy(d + 2 * i, &v, 2);
        }
    } else if (ts == 4) {
        const uint8_t *p0 = s, *p1 = s + n, *p2 = s + 2 * n, *p3 = s + 3 * n;
        for (int64_t i = 0; i < n; i++) {
            uint32_t v = (uint32_t)p0[i] | (uint32_t)p1[i] << 8 | (uint32_t)p2[i] << 16 | (uint32_t)p3[i] << 24;
            memcpy(d + 4 * i, &v, 4);
        }
    } else if (ts == 8) {
        for (int64_t i = 0; i < n; i++) {
            uint64_t v = 0;
            for (int j = 0; j < 8; j++) v |= (uint64_t)s[j * n + i] << (8 * j);
            memcpy(d + 8 * i, &v, 8);
        }
    } else {
        for (int j = 0; j < ts; j++)
            for (int64_t i = 0; i < n; i++) d[i * ts + j] = s[j * n + i];
    }
    memcpy(d + n * ts, s + n * ts, (size_t)(size - n * ts));
}

/* transpose an 8x8 bit matrix held as 8 bytes (row r = byte r) */
static uint64_t transpose8(uint64_t x) {
    uint64_t t;
    t = (x ^ (x >> 7)) & 0x00AA00AA00AA00AAull; x ^= t ^ (t << 7);
    t = (x ^ (x >> 14)) & 0x0000CCCC0000CCCCull; x ^= t ^ (t << 14);
    t = (x ^ (x >> 28)) & 0x00000000F0F0F0F0ull; x ^= t ^ (t << 28);
    return x;
}

/* bitshuffle's untranspose: rows 8*j+b of n/8 bytes hold bit b of byte j of each element */
static void unshuffle_bits(const uint8_t *s, uint8_t *d, int64_t size, int ts) {
    int64_t n = size / ts, rb = n / 8;
    for (int j = 0; j < ts; j++) {
        const uint8_t *rows = s + (int64_t)j * 8 * rb;
        for (int64_t g = 0; g < rb; g++) {
            uint64_t x = 0;
            for (int b = 0; b < 8; b++) x |= (uint64_t)rows[b * rb + g] << (8 * b);
            x = transpose8(x);
            for (int e = 0; e < 8; e++) d[(g * 8 + e) * ts + j] = (uint8_t)(x >> (8 * e));
        }
    }
    memcpy(d + n * ts, s + n * ts, (size_t)(size - n * ts));
}

/* a Blosc 1.x chunk's header, checked against the chunk's n bytes and its decoded size cap */
typedef struct {
    int ts, flags, comp, memcpyed;
    int64_t nbytes, block, cbytes, nblocks, leftover;
} BloscHdr;

static int blosc_hdr(const uint8_t *s, int64_t n, int64_t cap, BloscHdr *h, int64_t *detail) {
    memset(h, 0, sizeof *h);
    if (n < 16) return S_HEADER;
    int version = s[0], flags = s[2], ts = s[3];
    int64_t nbytes = rd32(s + 4), block = rd32(s + 8), cbytes = rd32(s + 12);
    if (version == 0) return S_HEADER;
    if (version >= 3 || (flags & 0x05) == 0x05) return S_UNSUP_BLOSC2;
    if (nbytes != cap) { *detail = nbytes; return S_SIZE; }
    if (cbytes < 16 || cbytes > n) return S_HEADER;
    if (ts < 1) return S_HEADER; /* c-blosc refuses typesize 0 for every chunk, memcpyed ones too */
    h->ts = ts; h->flags = flags; h->nbytes = nbytes; h->block = block; h->cbytes = cbytes;
    if (flags & 0x02) { /* memcpyed */
        if (cbytes != nbytes + 16) return S_HEADER;
        h->memcpyed = 1;
        return S_OK;
    }
    int comp = flags >> 5;
    if (comp == 0) return S_UNSUP_BLOSCLZ;
    if (comp == 2) return S_UNSUP_SNAPPY;
    if (comp != 1 && comp != 3 && comp != 4) return S_HEADER;
    if (block < 1) return S_HEADER;
    h->comp = comp;
    h->nblocks = (nbytes + block - 1) / block;
    h->leftover = nbytes % block;
    if (16 + 4 * h->nblocks > cbytes) return S_BLOCKS;
    return S_OK;
}

/* blocks [j0, j1) of a chunk whose header h checked (not memcpyed) into d (the whole chunk's
 * nbytes): blocks are independent, so one chunk's may be decoded by several workers at once */
static int blosc_blocks(Ctx *c, const BloscHdr *h, const uint8_t *s, uint8_t *d, int64_t j0, int64_t j1) {
    int flags = h->flags, ts = h->ts, comp = h->comp;
    int64_t nbytes = h->nbytes, block = h->block, cbytes = h->cbytes, nblocks = h->nblocks, leftover = h->leftover;
    int byte_sh = (flags & 0x01) && ts > 1, bit_sh = (flags & 0x04) != 0;
    uint8_t *tmp = NULL;
    if (byte_sh || bit_sh) {
        tmp = ctx_tmp(c, (size_t)(block < nbytes ? block : nbytes));
        if (!tmp && nbytes) return S_MEMORY;
    }
    for (int64_t j = j0; j < j1; j++) {
        int64_t bstart = rd32(s + 16 + 4 * j);
        if (bstart < 16 + 4 * nblocks || bstart + 4 > cbytes) return S_BLOCKS;
        int last = (j == nblocks - 1) && leftover > 0;
        int64_t bsize = last ? leftover : block;
        int split = !(flags & 0x10) && ts <= 16 && bsize / ts >= 128 && !last;
        int nsplit = split ? ts : 1;
        if (bsize % nsplit) return S_BLOCKS;
        int64_t ne = bsize / nsplit, nel = bsize / ts;
        int mode = byte_sh ? 1 : (bit_sh && nel % 8 == 0) ? 2 : 0;
        uint8_t *out = mode ? tmp : d + j * block;
        int64_t pos = bstart;
        for (int k = 0; k < nsplit; k++) {
            if (pos + 4 > cbytes) return S_STREAM;
            int64_t cs = rd32(s + pos);
            if (cs <= 0 || cs > ne || pos + 4 + cs > cbytes) return S_STREAM;
            const uint8_t *in = s + pos + 4;
            uint8_t *o = out + k * ne;
            int r = S_OK;
            if (cs == ne) memcpy(o, in, (size_t)ne);
            else if (comp == 1) r = dec_lz4(in, (size_t)cs, o, (size_t)ne);
            else if (comp == 4) r = dec_zstd(c, in, (size_t)cs, o, (size_t)ne);
            else r = dec_inflate(c, C_ZLIB, in, (size_t)cs, o, (size_t)ne);
            if (r != S_OK) return r == S_SIZE ? S_CORRUPT : r;
            pos += 4 + cs;
        }
        if (mode == 1) unshuffle_bytes(tmp, d + j * block, bsize, ts);
        else if (mode == 2) unshuffle_bits(tmp, d + j * block, bsize, ts);
    }
    return S_OK;
}

static int dec_blosc(Ctx *c, const uint8_t *s, int64_t n, uint8_t *d, int64_t cap, int64_t *detail) {
    BloscHdr h;
    int st = blosc_hdr(s, n, cap, &h, detail);
    if (st != S_OK) return st;
    if (h.memcpyed) {
        memcpy(d, s + 16, (size_t)h.nbytes);
        return S_OK;
    }
    return blosc_blocks(c, &h, s, d, 0, h.nblocks);
}

static int decode_one(Ctx *c, int codec, const uint8_t *s, int64_t n, uint8_t *d, int64_t cap, int64_t *detail) {
    switch (codec) {
    case C_RAW:
        if (n != cap) { *detail = n; return S_SIZE; }
        memcpy(d, s, (size_t)n);
        return S_OK;
    case C_ZSTD: return dec_zstd(c, s, (size_t)n, d, (size_t)cap);
    case C_LZ4: return dec_lz4(s, (size_t)n, d, (size_t)cap);
    case C_ZLIB: case C_GZIP: case C_DEFLATE: return dec_inflate(c, codec, s, (size_t)n, d, (size_t)cap);
    case C_BLOSC: return dec_blosc(c, s, n, d, cap, detail);
    case C_LZ4_SIZED: { /* numcodecs' LZ4: the decoded size (4 bytes, little-endian), then one block */
        if (n < 5) return S_CORRUPT;
        int64_t stated = (int64_t)s[0] | (int64_t)s[1] << 8 | (int64_t)s[2] << 16 | (int64_t)s[3] << 24;
        if (stated != cap) { *detail = stated; return S_SIZE; }
        return dec_lz4(s + 4, (size_t)(n - 4), d, (size_t)cap);
    }
    }
    return S_UNSUP_CODEC;
}

/* ---------------------------------------------------------------- parallel for */
/* items whose status is not S_OK: what every batch call returns */
static int64_t count_bad(const int32_t *status, int64_t n) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += status[i] != S_OK;
    return bad;
}

static void not_run(int32_t *status, int64_t n) {
    for (int64_t i = 0; i < n; i++) status[i] = S_MEMORY; /* overwritten by each item that runs */
}

typedef struct {
    void (*fn)(void *, int64_t, Ctx *);
    void *arg;
    int64_t n;
    int64_t next; /* atomic */
} Job;

static void *worker(void *p) {
    Job *j = p;
    Ctx *c = ctx_get();
    if (!c) return NULL;
    for (;;) {
        int64_t i = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (i >= j->n) break;
        j->fn(j->arg, i, c);
    }
    ctx_put(c);
    return NULL;
}

/* ---------------------------------------------------------------- a persistent team of threads
 * Creating and joining a call's threads cost 0.05 ms (2 threads) to 2.1 ms (16 threads) per
 * call on a 2-core VM: a large share of a viewer's plane read there (on 16 cores: within the
 * noise, benchmarks/results/2026-12-02-gpu/team/ab.txt). The team's threads are created
 * once (grown on demand, detached) and wait on a condition variable between calls. One call
 * uses the team at a time; a concurrent call (another Python thread) starts threads of its own
 * as before. The calling thread always works too. */
#define TEAM_MAX 255
static struct {
    pthread_mutex_t busy;   /* held by the call that uses the team */
    pthread_mutex_t m;      /* guards the fields below */
    pthread_cond_t go, done;
    int size;               /* threads started */
    unsigned long gen;      /* calls so far: a thread runs the call whose generation it has not seen */
    int want;               /* threads 0 .. want-1 may take part in this call */
    int open;               /* the call takes helpers still: its caller has not finished its own part */
    int running;            /* helpers that joined the call and are still working */
    void *(*wk)(void *);
    void *job;
} team = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, 0, NULL, NULL};
static unsigned long team_born[TEAM_MAX]; /* the generation when thread k was started */

static void *team_main(void *p) {
    int id = (int)(intptr_t)p;
    unsigned long seen = team_born[id];
    for (;;) {
        pthread_mutex_lock(&team.m);
        while (team.gen == seen) pthread_cond_wait(&team.go, &team.m);
        seen = team.gen;
        /* a helper that wakes after the caller finished its own part stays out: the call does
         * not wait for its wake-up (on a busy or virtual machine that can take longer than the
         * whole read) */
        int mine = id < team.want && team.open;
        if (mine) team.running++;
        void *(*wk)(void *) = team.wk;
        void *job = team.job;
        pthread_mutex_unlock(&team.m);
        if (!mine) continue;
        wk(job);
        pthread_mutex_lock(&team.m);
        if (--team.running == 0) pthread_cond_signal(&team.done);
        pthread_mutex_unlock(&team.m);
    }
    return NULL;
}

/* after fork() only the forking thread exists in the child: start a new team there */
static void team_after_fork_child(void) {
    pthread_mutex_init(&team.busy, NULL);
    pthread_mutex_init(&team.m, NULL);
    pthread_cond_init(&team.go, NULL);
    pthread_cond_init(&team.done, NULL);
    team.size = 0;
    team.open = 0;
    team.running = 0;
}

static void spawn_run(void *(*wk)(void *), void *job, int threads) {
    pthread_t t[256];
    int started = 0;
    for (int k = 1; k < threads; k++)
        if (pthread_create(&t[started], NULL, wk, job) == 0) started++;
    wk(job);
    for (int k = 0; k < started; k++) pthread_join(t[k], NULL);
}

static pthread_once_t team_once = PTHREAD_ONCE_INIT;

static void team_init(void) {
    pthread_atfork(NULL, NULL, team_after_fork_child);
}

/* wk(job) on `threads` threads (the caller's included); returns when all have returned */
static void team_run(void *(*wk)(void *), void *job, int threads) {
    int helpers = threads - 1;
    if (helpers <= 0) {
        wk(job);
        return;
    }
    pthread_once(&team_once, team_init);
    if (pthread_mutex_trylock(&team.busy) != 0) {
        spawn_run(wk, job, threads);
        return;
    }
    if (team.size < helpers) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 1 << 20);
        while (team.size < helpers && team.size < TEAM_MAX) {
            pthread_t t;
            team_born[team.size] = team.gen; /* gen changes only under busy, which this call holds */
            if (pthread_create(&t, &attr, team_main, (void *)(intptr_t)team.size) != 0) break;
            team.size++;
        }
        pthread_attr_destroy(&attr);
    }
    if (helpers > team.size) helpers = team.size;
    pthread_mutex_lock(&team.m);
    team.wk = wk;
    team.job = job;
    team.want = helpers;
    team.open = 1;
    team.running = 0;
    team.gen++;
    pthread_cond_broadcast(&team.go);
    pthread_mutex_unlock(&team.m);
    wk(job); /* the calling thread works too: when it returns, every item is taken */
    pthread_mutex_lock(&team.m);
    team.open = 0; /* helpers not awake yet stay out; those that joined finish their items */
    while (team.running > 0) pthread_cond_wait(&team.done, &team.m);
    pthread_mutex_unlock(&team.m);
    pthread_mutex_unlock(&team.busy);
}

static void parallel(int64_t n, int threads, void (*fn)(void *, int64_t, Ctx *), void *arg) {
    Job j = {fn, arg, n, 0};
    if (threads > n) threads = (int)n;
    if (threads > 256) threads = 256;
    team_run(worker, &j, threads);
}

/* ---------------------------------------------------------------- read */

typedef struct {
    const char *const *paths; int64_t npaths;
    const int64_t *fid, *foff, *size, *doff;
    uint8_t *dst; int64_t dst_len;
    int32_t *status; int64_t *detail;
    const int64_t *group; /* group g is items [group[g], group[g + 1]) */
} ReadArgs;

static int read_fd(int fd, int64_t off, int64_t size, uint8_t *d, int64_t *detail) {
    int64_t got = 0;
    while (got < size) {
        ssize_t r = pread(fd, d + got, (size_t)(size - got), (off_t)(off + got));
        if (r < 0) { if (errno == EINTR) continue; *detail = errno; return S_IO; }
        if (r == 0) { *detail = got; return S_SHORT; }
        got += r;
    }
    return S_OK;
}

static int read_at(const char *path, int64_t off, int64_t size, uint8_t *d, int64_t *detail) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { *detail = errno; return S_OPEN; }
    int st = read_fd(fd, off, size, d, detail);
    close(fd);
    return st;
}

/* one group: items of one file, the file opened once */
static void read_group(void *p, int64_t g, Ctx *c) {
    (void)c;
    ReadArgs *a = p;
    int fd = -1, open_err = 0;
    for (int64_t i = a->group[g]; i < a->group[g + 1]; i++) {
        a->detail[i] = 0;
        if (a->fid[i] < 0 || a->fid[i] >= a->npaths || a->size[i] < 0 || a->doff[i] < 0 || a->foff[i] < 0
            || a->doff[i] + a->size[i] > a->dst_len) { a->status[i] = S_BOUNDS; continue; }
        if (fd < 0 && !open_err) {
            fd = open(a->paths[a->fid[i]], O_RDONLY | O_CLOEXEC);
            if (fd < 0) open_err = errno;
        }
        if (fd < 0) { a->status[i] = S_OPEN; a->detail[i] = open_err; continue; }
        a->status[i] = read_fd(fd, a->foff[i], a->size[i], a->dst + a->doff[i], &a->detail[i]);
    }
    if (fd >= 0) close(fd);
}

/* Read item i: size[i] bytes at foff[i] of paths[fid[i]] into dst[doff[i]:]. Consecutive
 * items of one file form a group of at most group_bytes (one open per group, one thread).
 * Returns the number of items whose status is not ok. */
API int64_t gz_read(const char *const *paths, int64_t npaths, int64_t n, const int64_t *fid, const int64_t *foff,
                    const int64_t *size, const int64_t *doff, uint8_t *dst, int64_t dst_len, int64_t group_bytes,
                    int threads, int32_t *status, int64_t *detail) {
    int64_t *group = malloc(sizeof(int64_t) * (size_t)(n + 1));
    if (!group) { not_run(status, n); return n; }
    int64_t ng = 0, used = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i == 0 || fid[i] != fid[i - 1] || used + size[i] > group_bytes) { group[ng++] = i; used = 0; }
        used += size[i] > 0 ? size[i] : 0;
    }
    group[ng] = n;
    ReadArgs a = {paths, npaths, fid, foff, size, doff, dst, dst_len, status, detail, group};
    not_run(status, n);
    parallel(ng, threads, read_group, &a);
    free(group);
    return count_bad(status, n);
}

/* ---------------------------------------------------------------- decode */
typedef struct {
    int codec;
    const uint8_t *src; int64_t src_len; const int64_t *soff, *ssize;
    uint8_t *dst; int64_t dst_len; const int64_t *doff, *dsize;
    int32_t *status; int64_t *detail;
} DecArgs;

static void dec_item(void *p, int64_t i, Ctx *c) {
    DecArgs *a = p;
    a->detail[i] = 0;
    if (a->soff[i] < 0 || a->ssize[i] < 0 || a->soff[i] + a->ssize[i] > a->src_len || a->doff[i] < 0
        || a->dsize[i] < 0 || a->doff[i] + a->dsize[i] > a->dst_len) { a->status[i] = S_BOUNDS; return; }
    a->status[i] = decode_one(c, a->codec, a->src + a->soff[i], a->ssize[i], a->dst + a->doff[i], a->dsize[i],
                              &a->detail[i]);
}

/* Decode item i: src[soff[i]:+ssize[i]] to exactly dsize[i] bytes at dst[doff[i]:]. */
API int64_t gz_decode(int codec, int64_t n, const uint8_t *src, int64_t src_len, const int64_t *soff,
                      const int64_t *ssize, uint8_t *dst, int64_t dst_len, const int64_t *doff, const int64_t *dsize,
                      int threads, int32_t *status, int64_t *detail) {
    pthread_once(&once, load);
    DecArgs a = {codec, src, src_len, soff, ssize, dst, dst_len, doff, dsize, status, detail};
    not_run(status, n);
    parallel(n, threads, dec_item, &a);
    return count_bad(status, n);
}

/* ---------------------------------------------------------------- place
 * table: per piece and dimension (chunk extent, start in chunk, length, start in output),
 * in units of `unit` bytes; the chunk is C-ordered along the table's dimensions; ostride
 * (units) per dimension of the output. swap: reverse the bytes of each unit. */
typedef struct {
    int ndim, unit, swap;
    const int64_t *ostride;
    uint8_t *out; int64_t out_len;
} PlaceGeom;

/* one unit's bytes reversed: fixed-size byte swaps the compiler turns into vector shuffles */
#define SWAP_ROW(T, BSWAP) \
    for (int64_t i = 0; i < len; i++) { T v; memcpy(&v, s + i * (int64_t)sizeof(T), sizeof(T)); v = BSWAP(v); \
                                         memcpy(d + i * os * (int64_t)sizeof(T), &v, sizeof(T)); }

static void copy_row(const uint8_t *s, uint8_t *d, int64_t len, int64_t os, int unit, int swap) {
    if (!swap && os == 1) { memcpy(d, s, (size_t)(len * unit)); return; }
    if (swap && unit == 2) { SWAP_ROW(uint16_t, __builtin_bswap16) return; }
    if (swap && unit == 4) { SWAP_ROW(uint32_t, __builtin_bswap32) return; }
    if (swap && unit == 8) { SWAP_ROW(uint64_t, __builtin_bswap64) return; }
    for (int64_t i = 0; i < len; i++) {
        const uint8_t *a = s + i * unit;
        uint8_t *b = d + i * os * unit;
        if (swap) for (int k = 0; k < unit; k++) b[k] = a[unit - 1 - k];
        else memcpy(b, a, (size_t)unit);
    }
}

static int place_one(const PlaceGeom *g, const uint8_t *chunk, int64_t chunk_len, const int64_t *t) {
    int L1 = g->ndim - 1;
    int64_t rows = 1, hi_s = 0, hi_d = 0, sstride = 1;
    /* bounds: the last element touched in the chunk and in the output */
    for (int dd = L1; dd >= 0; dd--) {
        const int64_t *e = t + 4 * dd;
        if (e[1] < 0 || e[2] < 0 || e[3] < 0 || e[1] + e[2] > e[0]) return S_BOUNDS;
        if (e[2] == 0) return S_OK;
        hi_s += (e[1] + e[2] - 1) * sstride;
        hi_d += (e[3] + e[2] - 1) * g->ostride[dd];
        sstride *= e[0];
        if (dd < L1) rows *= e[2];
    }
    if ((hi_s + 1) * g->unit > chunk_len || (hi_d + 1) * g->unit > g->out_len) return S_BOUNDS;
    const int64_t *last = t + 4 * L1;
    for (int64_t r = 0; r < rows; r++) {
        int64_t rem = r, so = last[1], dof = last[3] * g->ostride[L1], ss = last[0];
        for (int dd = L1 - 1; dd >= 0; dd--) {
            const int64_t *e = t + 4 * dd;
            int64_t cidx = rem % e[2];
            rem /= e[2];
            so += (e[1] + cidx) * ss;
            ss *= e[0];
            dof += (e[3] + cidx) * g->ostride[dd];
        }
        copy_row(chunk + so * g->unit, g->out + dof * g->unit, last[2], g->ostride[L1], g->unit, g->swap);
    }
    return S_OK;
}

typedef struct {
    PlaceGeom g;
    const uint8_t *src; int64_t src_len; const int64_t *soff; int64_t chunk_len;
    const int64_t *table;
    int32_t *status;
} PlaceArgs;

static void place_item(void *p, int64_t i, Ctx *c) {
    (void)c;
    PlaceArgs *a = p;
    const uint8_t *chunk;
    if (!a->src) { /* soff holds the chunks' addresses: buffers of chunk_len bytes the caller holds */
        chunk = (const uint8_t *)(uintptr_t)a->soff[i];
        if (!chunk) { a->status[i] = S_BOUNDS; return; }
    } else {
        if (a->soff[i] < 0 || a->soff[i] + a->chunk_len > a->src_len) { a->status[i] = S_BOUNDS; return; }
        chunk = a->src + a->soff[i];
    }
    a->status[i] = place_one(&a->g, chunk, a->chunk_len, a->table + (int64_t)i * 4 * a->g.ndim);
}

/* Place n decoded chunks of chunk_len bytes, chunk i at src[soff[i]:]; with src NULL, chunk i
 * is at the address soff[i] (chunks held in buffers of their own: the chunk cache's). */
API int64_t gz_place(int64_t n, const uint8_t *src, int64_t src_len, const int64_t *soff, int64_t chunk_len,
                     const int64_t *table, int ndim, const int64_t *ostride, int unit, int swap, uint8_t *out,
                     int64_t out_len, int threads, int32_t *status) {
    PlaceArgs a = {{ndim, unit, swap, ostride, out, out_len}, src, src_len, soff, chunk_len, table, status};
    not_run(status, n);
    parallel(n, threads, place_item, &a);
    return count_bad(status, n);
}

/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as zarr v3's crc32c codec computes it:
   the SSE4.2 instruction where the processor has it, else a slicing-by-8 table (no library needed). */
static uint32_t crc32c_table[8][256];
static pthread_once_t crc32c_once = PTHREAD_ONCE_INIT;

static void crc32c_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc32c_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) crc32c_table[t][i] = (crc32c_table[t - 1][i] >> 8) ^ crc32c_table[0][crc32c_table[t - 1][i] & 0xFF];
}

static uint32_t crc32c_sw(uint32_t c, const uint8_t *p, int64_t n) {
    pthread_once(&crc32c_once, crc32c_init);
    while (n >= 8) {
        uint64_t w; memcpy(&w, p, 8);
        w ^= c;
        c = crc32c_table[7][w & 0xFF] ^ crc32c_table[6][(w >> 8) & 0xFF] ^ crc32c_table[5][(w >> 16) & 0xFF]
            ^ crc32c_table[4][(w >> 24) & 0xFF] ^ crc32c_table[3][(w >> 32) & 0xFF] ^ crc32c_table[2][(w >> 40) & 0xFF]
            ^ crc32c_table[1][(w >> 48) & 0xFF] ^ crc32c_table[0][w >> 56];
        p += 8; n -= 8;
    }
    while (n--) c = (c >> 8) ^ crc32c_table[0][(c ^ *p++) & 0xFF];
    return c;
}

#if defined(__x86_64__)
#include <nmmintrin.h>
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t c, const uint8_t *p, int64_t n) {
    uint64_t v = c;
    while (n >= 8) { uint64_t w; memcpy(&w, p, 8); v = _mm_crc32_u64(v, w); p += 8; n -= 8; }
    while (n--) v = _mm_crc32_u8((uint32_t)v, *p++);
    return (uint32_t)v;
}
#endif

static uint32_t crc32c(const uint8_t *p, int64_t n) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.2")) return crc32c_hw(0xFFFFFFFFu, p, n) ^ 0xFFFFFFFFu;
#endif
    return crc32c_sw(0xFFFFFFFFu, p, n) ^ 0xFFFFFFFFu;
}

/* ---------------------------------------------------------------- fused read + decode + place */
typedef struct {
    int codec;
    const char *const *paths; int64_t npaths;
    const int64_t *fid, *foff, *size;
    int64_t chunk_len;
    PlaceGeom g; const int64_t *table;
    uint8_t *const *keep;          /* per chunk: decode into this buffer and keep it there (NULL: scratch) */
    uint8_t *scratch; int64_t per_thread; int64_t next_slot; /* atomic */
    int32_t *status; int64_t *detail;
    int crc32c_frames;             /* crc32c checksums after the codec's bytes: verified, then stripped */
} FusedArgs;

static void fused_item(void *p, int64_t i, Ctx *c) {
    FusedArgs *a = p;
    uint8_t *enc = a->scratch + c->slot * a->per_thread;
    int64_t n = a->size[i];
    a->detail[i] = 0;
    if (a->fid[i] < 0 || a->fid[i] >= a->npaths || n < 0 || a->foff[i] < 0) { a->status[i] = S_BOUNDS; return; }
    int64_t enc_cap = a->per_thread - (a->codec == C_RAW ? 0 : a->chunk_len);
    if (n > enc_cap) { a->status[i] = S_BOUNDS; return; }
    int st = read_at(a->paths[a->fid[i]], a->foff[i], n, enc, &a->detail[i]);
    if (st != S_OK) { a->status[i] = st; return; }
    for (int f = 0; f < a->crc32c_frames; f++) { /* the outermost checksum is the last 4 bytes */
        if (n < 4) { a->detail[i] = n; a->status[i] = S_CRC32C; return; }
        const uint8_t *t = enc + n - 4;
        uint32_t want = (uint32_t)t[0] | (uint32_t)t[1] << 8 | (uint32_t)t[2] << 16 | (uint32_t)t[3] << 24;
        n -= 4;
        if (crc32c(enc, n) != want) { a->status[i] = S_CRC32C; return; }
    }
    const uint8_t *dec = enc;
    if (a->codec != C_RAW) {
        uint8_t *d = a->keep && a->keep[i] ? a->keep[i] : enc + enc_cap;
        st = decode_one(c, a->codec, enc, n, d, a->chunk_len, &a->detail[i]);
        if (st != S_OK) { a->status[i] = st; return; }
        dec = d;
    } else {
        if (n != a->chunk_len) { a->detail[i] = n; a->status[i] = S_SIZE; return; }
        if (a->keep && a->keep[i]) memcpy(a->keep[i], enc, (size_t)n);
    }
    a->status[i] = place_one(&a->g, dec, a->chunk_len, a->table + i * 4 * a->g.ndim);
}

static void *fused_worker(void *p) {
    Job *j = p;
    Ctx *c = ctx_get();
    if (!c) return NULL;
    /* one slot of the caller's scratch per worker (at most `threads` workers run) */
    c->slot = __atomic_fetch_add(&((FusedArgs *)j->arg)->next_slot, 1, __ATOMIC_RELAXED);
    for (;;) {
        int64_t i = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED);
        if (i >= j->n) break;
        fused_item(j->arg, i, c);
    }
    ctx_put(c);
    return NULL;
}

/* Chunk i: read size[i] bytes at foff[i] of paths[fid[i]], decode to chunk_len bytes, place
 * it with table row i. scratch: `threads` slots of per_thread bytes (encoded bytes, then the
 * decoded chunk unless keep[i] gives its own buffer). */
API int64_t gz_fused(int codec, const char *const *paths, int64_t npaths, int64_t n, const int64_t *fid,
                     const int64_t *foff, const int64_t *size, int64_t chunk_len, const int64_t *table, int ndim,
                     const int64_t *ostride, int unit, int swap, uint8_t *out, int64_t out_len, uint8_t *const *keep,
                     uint8_t *scratch, int64_t per_thread, int threads, int32_t *status, int64_t *detail,
                     int crc32c_frames) {
    pthread_once(&once, load);
    if (threads > n) threads = (int)n;
    if (threads > 256) threads = 256;
    if (threads < 1) threads = 1;
    FusedArgs a = {codec, paths, npaths, fid, foff, size, chunk_len, {ndim, unit, swap, ostride, out, out_len},
                   table, keep, scratch, per_thread, 0, status, detail, crc32c_frames};
    Job j = {NULL, &a, n, 0};
    not_run(status, n);
    team_run(fused_worker, &j, threads);
    return count_bad(status, n);
}

/* ---------------------------------------------------------------- decode + place as answers arrive
 * A remote read's chunks arrive one answer at a time. gz_arrivals_open makes a set of n chunks;
 * gz_arrivals_add queues chunk i (its encoded bytes, valid until close), and a worker decodes it
 * (into keep[i], or a slot of scratch) and places it into out while the rest are still on the
 * way; gz_arrivals_close waits until every chunk added is placed (or failed), then frees the
 * set. Each chunk is added at most once; one never added keeps the status S_NOT_ADDED.
 * The workers are the library's, kept between sets (waiting on a condition variable): making
 * and joining a set's own threads cost ~0.1-0.15 ms after the last chunk of a viewer's plane
 * on the 2-core machine, cold -- the plane's tail. At most `threads` of them work on one set.
 * A Blosc chunk of several blocks is decoded by several workers at once, a run of its blocks
 * each (blocks are independent), and placed by the one that finishes last: the last chunk of a
 * plane to arrive was decoded by one thread while the others waited. A chunk holds one slot of
 * scratch from its first part's start to its place; a worker starts a chunk only once every
 * part of the chunks before it was taken (those still held are being decoded or placed by the
 * set's other workers), so at most min(threads, n) chunks hold slots at once.
 * One lock (the pool's) guards every set's queue and counters. */
typedef struct Arrivals {
    int codec; int64_t n, chunk_len;
    PlaceGeom g; const int64_t *table;
    uint8_t *const *keep; uint8_t *scratch;
    int32_t *status; int64_t *detail;
    /* chunk k (in the order added): its index, bytes, header, parts left, where it is decoded */
    int64_t *qi, *qn; const uint8_t **qs; BloscHdr *hdr; int32_t *left, *kst, *kslot; int64_t *kdet;
    uint8_t **dest; int64_t tail;
    /* the parts to run: chunk k, part p of parts[k] (blocks [p*nb/parts, (p+1)*nb/parts)) */
    int64_t *pk; int32_t *pp, *parts; int64_t phead, ptail;
    int32_t *free_slot; int nfree, slots;
    int limit, active;           /* workers allowed on the set at once; working on it now */
    int64_t finished;            /* chunks placed or failed */
    int closing, split;          /* split: the most parts a Blosc chunk is split into (runs of its blocks) */
    pthread_cond_t idle;         /* close() waits on it */
    struct Arrivals *next;       /* the pool's open sets */
} Arrivals;

static struct {
    pthread_mutex_t m;
    pthread_cond_t more;         /* parts were queued */
    Arrivals *sets;              /* open sets, oldest first */
    int size;                    /* workers started */
} ap = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0};

/* after fork() only the forking thread exists in the child: no workers, no sets there */
static void ap_after_fork_child(void) {
    pthread_mutex_init(&ap.m, NULL);
    pthread_cond_init(&ap.more, NULL);
    ap.sets = NULL;
    ap.size = 0;
}

/* a set with a part to run and room for another worker (under ap.m), or NULL */
static Arrivals *ap_pick(void) {
    for (Arrivals *a = ap.sets; a; a = a->next)
        if (a->phead < a->ptail && a->active < a->limit) return a;
    return NULL;
}

/* run one part of set a (under ap.m; released while decoding and placing): decode it (its run
 * of blocks, or the whole chunk), and if it was the chunk's last, place the chunk */
static void ap_run_part(Arrivals *a, Ctx *c) {
    int64_t e = a->phead++, k = a->pk[e];
    int32_t part = a->pp[e];
    int64_t i = a->qi[k];
    if (!a->dest[k] && a->codec != C_RAW) {  /* the chunk's first part: where it is decoded */
        if (a->keep && a->keep[i]) a->dest[k] = a->keep[i];
        else if (a->nfree > 0) {  /* (never empty: see above; else the chunk fails, S_MEMORY) */
            a->kslot[k] = a->free_slot[--a->nfree];
            a->dest[k] = a->scratch + a->kslot[k] * a->chunk_len;
        }
    }
    a->active++;
    pthread_mutex_unlock(&ap.m);
    int64_t nb = a->qn[k];
    const uint8_t *src = a->qs[k];
    uint8_t *d = a->dest[k];
    int st = S_OK;
    int64_t det = 0;
    if (!c || (!d && a->codec != C_RAW)) st = S_MEMORY;
    else if (a->codec == C_RAW) {
        if (nb != a->chunk_len) { det = nb; st = S_SIZE; }
        else if (a->keep && a->keep[i]) memcpy(a->keep[i], src, (size_t)nb);
    } else if (a->parts[k] == 1) {
        st = decode_one(c, a->codec, src, nb, d, a->chunk_len, &det);
    } else {
        const BloscHdr *h = &a->hdr[k];
        int32_t np = a->parts[k];
        st = blosc_blocks(c, h, src, d, h->nblocks * part / np, h->nblocks * (part + 1) / np);
    }
    pthread_mutex_lock(&ap.m);
    if (st != S_OK && a->kst[k] == S_OK) { a->kst[k] = st; a->kdet[k] = det; }
    if (--a->left[k] == 0) {
        int kst = a->kst[k];
        a->detail[i] = a->kdet[k];
        pthread_mutex_unlock(&ap.m);
        int placed = kst != S_OK ? kst
                                 : place_one(&a->g, a->codec == C_RAW ? src : d, a->chunk_len, a->table + i * 4 * a->g.ndim);
        pthread_mutex_lock(&ap.m);
        a->status[i] = placed;
        if (a->kslot[k] >= 0) a->free_slot[a->nfree++] = a->kslot[k];
        a->finished++;
    }
    a->active--;
    if (a->closing && a->active == 0 && a->finished == a->tail) pthread_cond_broadcast(&a->idle);
}

static void *ap_main(void *unused) {
    (void)unused;
    Ctx *c = ctx_get();
    pthread_mutex_lock(&ap.m);
    for (;;) {
        Arrivals *a = ap_pick();
        if (!a) { pthread_cond_wait(&ap.more, &ap.m); continue; }
        ap_run_part(a, c);
    }
    return NULL;
}

static pthread_once_t ap_once = PTHREAD_ONCE_INIT;
static void ap_init(void) { pthread_atfork(NULL, NULL, ap_after_fork_child); }

/* at least `want` workers (at most 64), started once and kept (detached); the workers there are */
static int ap_grow(int want) {
    pthread_once(&ap_once, ap_init);
    if (want > 64) want = 64;
    pthread_mutex_lock(&ap.m);
    if (ap.size < want) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 1 << 20);
        while (ap.size < want) {
            pthread_t t;
            if (pthread_create(&t, &attr, ap_main, NULL) != 0) break;
            ap.size++;
        }
        pthread_attr_destroy(&attr);
    }
    int size = ap.size;
    pthread_mutex_unlock(&ap.m);
    return size;
}

static void arrivals_free(Arrivals *a) {
    free(a->qi); free(a->qn); free(a->qs); free(a->hdr); free(a->left); free(a->kst); free(a->kslot);
    free(a->kdet); free(a->dest); free(a->pk); free(a->pp); free(a->parts); free(a->free_slot); free(a);
}

/* threads: workers at most on the set at once; split: workers at most on one Blosc chunk (its
 * blocks; 1: a chunk is one worker's); scratch: min(threads, n) slots of chunk_len bytes (a
 * chunk decoded before it is placed) */
API void *gz_arrivals_open(int codec, int64_t n, int64_t chunk_len, const int64_t *table, int ndim,
                           const int64_t *ostride, int unit, int swap, uint8_t *out, int64_t out_len,
                           uint8_t *const *keep, uint8_t *scratch, int threads, int split, int32_t *status,
                           int64_t *detail) {
    pthread_once(&once, load);
    if (n < 1 || chunk_len < 0) return NULL;
    if (threads > 64) threads = 64;
    if (threads < 1) threads = 1;
    Arrivals *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    size_t nn = (size_t)n;
    a->slots = threads < n ? threads : (int)n;
    a->qi = malloc(nn * sizeof *a->qi); a->qn = malloc(nn * sizeof *a->qn); a->qs = malloc(nn * sizeof *a->qs);
    a->hdr = malloc(nn * sizeof *a->hdr); a->left = malloc(nn * sizeof *a->left); a->kst = malloc(nn * sizeof *a->kst);
    a->kslot = malloc(nn * sizeof *a->kslot); a->kdet = malloc(nn * sizeof *a->kdet);
    a->dest = calloc(nn, sizeof *a->dest); a->parts = malloc(nn * sizeof *a->parts);
    a->pk = malloc(nn * (size_t)threads * sizeof *a->pk); a->pp = malloc(nn * (size_t)threads * sizeof *a->pp);
    a->free_slot = malloc((size_t)a->slots * sizeof *a->free_slot);
    if (!a->qi || !a->qn || !a->qs || !a->hdr || !a->left || !a->kst || !a->kslot || !a->kdet || !a->dest || !a->parts
        || !a->pk || !a->pp || !a->free_slot) { arrivals_free(a); return NULL; }
    a->codec = codec; a->n = n; a->chunk_len = chunk_len;
    a->g = (PlaceGeom){ndim, unit, swap, ostride, out, out_len};
    a->table = table; a->keep = keep; a->scratch = scratch; a->status = status; a->detail = detail;
    for (int64_t i = 0; i < n; i++) { status[i] = S_NOT_ADDED; detail[i] = 0; }
    for (int k = 0; k < a->slots; k++) a->free_slot[k] = a->slots - 1 - k;
    a->nfree = a->slots;
    pthread_cond_init(&a->idle, NULL);
    /* (more workers than chunks help only with a chunk's blocks) */
    if (split < 1 || codec != C_BLOSC) split = 1;
    int want = split > 1 ? threads : a->slots;
    int have = ap_grow(want);
    a->limit = have < want ? have : want;  /* (0: no worker could start; close() decodes on the caller's thread) */
    a->split = split < a->limit ? split : a->limit;
    pthread_mutex_lock(&ap.m);
    Arrivals **at = &ap.sets;
    while (*at) at = &(*at)->next;
    *at = a;
    pthread_mutex_unlock(&ap.m);
    return a;
}

/* queue chunk i (nb encoded bytes at src); 0, or S_BOUNDS for a bad index or one added before */
API int gz_arrivals_add(void *h, int64_t i, const uint8_t *src, int64_t nb) {
    Arrivals *a = h;
    if (!a || i < 0 || i >= a->n || nb < 0 || (nb > 0 && !src)) return S_BOUNDS;
    /* a Blosc chunk of several blocks is split into runs of blocks (its header checked here, once) */
    BloscHdr hd;
    int64_t det = 0;
    int32_t parts = 1;
    if (a->split > 1 && blosc_hdr(src, nb, a->chunk_len, &hd, &det) == S_OK && !hd.memcpyed && hd.nblocks > 1)
        parts = (int32_t)(hd.nblocks < a->split ? hd.nblocks : a->split);
    pthread_mutex_lock(&ap.m);
    if (a->status[i] != S_NOT_ADDED || a->tail >= a->n || a->closing) { pthread_mutex_unlock(&ap.m); return S_BOUNDS; }
    a->status[i] = S_MEMORY; /* queued: overwritten once placed or failed */
    int64_t k = a->tail++;
    a->qi[k] = i; a->qn[k] = nb; a->qs[k] = src; a->parts[k] = parts; a->left[k] = parts;
    a->kst[k] = S_OK; a->kdet[k] = 0; a->kslot[k] = -1; a->dest[k] = NULL;
    if (parts > 1) a->hdr[k] = hd;
    for (int32_t p = 0; p < parts; p++) { a->pk[a->ptail] = k; a->pp[a->ptail] = p; a->ptail++; }
    pthread_mutex_unlock(&ap.m);
    /* after the unlock: the woken workers find the lock free */
    if (parts > 1) pthread_cond_broadcast(&ap.more); else pthread_cond_signal(&ap.more);
    return S_OK;
}

/* wait until every chunk added is placed or failed (the caller's thread runs what is left if no
 * worker could start), then free the set: no worker touches the caller's buffers after this
 * returns; returns the chunks added that failed */
API int64_t gz_arrivals_close(void *h) {
    Arrivals *a = h;
    if (!a) return -1;
    Ctx *c = a->limit == 0 ? ctx_get() : NULL;
    pthread_mutex_lock(&ap.m);
    a->closing = 1;
    if (a->limit == 0)
        while (a->phead < a->ptail) ap_run_part(a, c);
    while (a->finished < a->tail || a->active > 0) pthread_cond_wait(&a->idle, &ap.m);
    Arrivals **at = &ap.sets;
    while (*at != a) at = &(*at)->next;
    *at = a->next;
    pthread_mutex_unlock(&ap.m);
    ctx_put(c);
    int64_t bad = 0;
    for (int64_t i = 0; i < a->n; i++) bad += a->status[i] != S_OK && a->status[i] != S_NOT_ADDED;
    pthread_cond_destroy(&a->idle);
    arrivals_free(a);
    return bad;
}

/* ---------------------------------------------------------------- checksums */
typedef struct {
    int kind; const uint8_t *buf; int64_t len; const int64_t *off, *size; uint32_t *out; int32_t *status;
} SumArgs;

static uint32_t checksum(int kind, const uint8_t *p, int64_t n) {
    if (kind == 2) return crc32c(p, n);
    if (L.ok[3]) return (kind ? L.ld_adler32 : L.ld_crc32)(kind ? 1 : 0, p, (size_t)n);
    unsigned long v = kind ? 1 : 0;
    for (int64_t done = 0; done < n;) { /* zlib takes unsigned lengths */
        unsigned step = (unsigned)((n - done) > (1 << 30) ? (1 << 30) : (n - done));
        v = (kind ? L.z_adler32 : L.z_crc32)(v, p + done, step);
        done += step;
    }
    return (uint32_t)v;
}

static void sum_item(void *p, int64_t i, Ctx *c) {
    (void)c;
    SumArgs *a = p;
    if (a->off[i] < 0 || a->size[i] < 0 || a->off[i] + a->size[i] > a->len) { a->status[i] = S_BOUNDS; return; }
    a->out[i] = checksum(a->kind, a->buf + a->off[i], a->size[i]);
    a->status[i] = S_OK;
}

/* CRC-32 (kind 0), Adler-32 (kind 1) or CRC-32C (kind 2, needs no library) of buf[off[i]:+size[i]] into out[i]. */
API int64_t gz_checksum(int kind, int64_t n, const uint8_t *buf, int64_t len, const int64_t *off, const int64_t *size,
                        int threads, uint32_t *out, int32_t *status) {
    pthread_once(&once, load);
    if (kind != 2 && !L.ok[3] && !L.ok[2]) { not_run(status, n); for (int64_t i = 0; i < n; i++) status[i] = S_UNSUP_NOLIB; return n; }
    SumArgs a = {kind, buf, len, off, size, out, status};
    not_run(status, n);
    parallel(n, threads, sum_item, &a);
    return count_bad(status, n);
}

/* The Delta filter's decode (numcodecs Delta, astype == dtype): each of n rows of m integers of
 * `size` bytes (1, 2, 4 or 8), stored end to end in src, becomes its running sum in dst, wrapping
 * as numpy's integers do (unsigned arithmetic: the same bits for signed types). The caller
 * splits rows over its threads. Returns 0, or -1 for another size. */
#define GZ_DELTA(T)                                                                                      \
    do {                                                                                                 \
        const T *s = (const T *)src;                                                                     \
        T *d = (T *)dst;                                                                                 \
        for (int64_t r = 0; r < n; r++, s += m, d += m) {                                                \
            T acc = 0;                                                                                   \
            for (int64_t i = 0; i < m; i++) { acc = (T)(acc + s[i]); d[i] = acc; }                       \
        }                                                                                                \
    } while (0)

API int gz_delta(const void *src, void *dst, int64_t n, int64_t m, int size) {
    switch (size) {
    case 1: GZ_DELTA(uint8_t); return 0;
    case 2: GZ_DELTA(uint16_t); return 0;
    case 4: GZ_DELTA(uint32_t); return 0;
    case 8: GZ_DELTA(uint64_t); return 0;
    }
    return -1;
}

/* Size, modification time (ns) and kind of each of n files, on `threads` threads: kind 0 a
 * regular file, 1 no such file, 2 something else (a FIFO, a directory...: never opened), 3 the
 * stat failed otherwise (errno in size). What a read's locate stage asks of every chunk file. */
typedef struct {
    const char **paths;
    int64_t *size, *mtime_ns;
    int32_t *kind;
} StatArgs;

static void stat_item(void *p, int64_t i, Ctx *c) {
    (void)c;
    StatArgs *a = p;
    struct stat st;
    a->size[i] = -1;
    a->mtime_ns[i] = -1;
    if (stat(a->paths[i], &st) != 0) {
        a->kind[i] = errno == ENOENT || errno == ENOTDIR ? 1 : 3;
        if (a->kind[i] == 3) a->size[i] = errno;
        return;
    }
    if (!S_ISREG(st.st_mode)) { a->kind[i] = 2; return; }
    a->kind[i] = 0;
    a->size[i] = (int64_t)st.st_size;
    a->mtime_ns[i] = (int64_t)st.st_mtim.tv_sec * 1000000000 + (int64_t)st.st_mtim.tv_nsec;
}

API void gz_stat(const char **paths, int64_t n, int threads, int64_t *size, int64_t *mtime_ns, int32_t *kind) {
    StatArgs a = {paths, size, mtime_ns, kind};
    parallel(n, threads, stat_item, &a);
}

/* The Shuffle filter's decode (numcodecs Shuffle, as Blosc's byte shuffle over a whole chunk):
 * each of n rows of `row_bytes` bytes, end to end in src, gathered from its `ts` byte planes into
 * dst. The caller splits rows over its threads. */
API void gz_unshuffle(const uint8_t *src, uint8_t *dst, int64_t n, int64_t row_bytes, int ts) {
    for (int64_t r = 0; r < n; r++) unshuffle_bytes(src + r * row_bytes, dst + r * row_bytes, row_bytes, ts);
}

/* An LZ4 block checked without decoding it: the walk of LZ4_decompress_safe (lz4 1.9) over its
 * sequences, copying nothing. Accepted exactly when that decoder decodes src[0:n] to exactly cap
 * bytes: literal runs and matches inside both buffers, offsets inside the bytes decoded so far
 * (0 refused), a match ending at least 5 bytes before the end, a literal run that is not the
 * last ending at least 12 bytes before it, the last literal run ending the input (an empty block:
 * one zero byte). What the
 * stages run before nvCOMP's LZ4, which is undefined on a block that breaks these. */
static int lz4_walk(const uint8_t *s, int64_t n, int64_t cap) {
    const uint8_t *ip = s, *end = s + n;
    int64_t op = 0;
    if (cap == 0) return n == 1 && s[0] == 0 ? S_OK : S_CORRUPT; /* as the decoder: one empty token */
    for (;;) {
        if (ip >= end) return S_CORRUPT;
        unsigned token = *ip++;
        int64_t len = token >> 4;
        if (len == 15) {
            unsigned b;
            do {
                if (ip >= end) return S_CORRUPT;
                b = *ip++;
                len += b;
            } while (b == 255 && len < (int64_t)1 << 40);
        }
        int64_t left = end - ip;
        if (len > left) return S_CORRUPT;
        if (op + len > cap - 12 || len > left - 8) { /* the last literals: they must end the block */
            if (len != left || op + len > cap) return S_CORRUPT;
            return op + len == cap ? S_OK : S_SIZE;
        }
        ip += len;
        op += len;
        int64_t off = (int64_t)ip[0] | (int64_t)ip[1] << 8; /* inside: at least 8 bytes were left */
        ip += 2;
        if (off == 0 || off > op) return S_CORRUPT;
        int64_t ml = token & 15;
        if (ml == 15) {
            unsigned b;
            do {
                if (ip >= end - 5) return S_CORRUPT;
                b = *ip++;
                ml += b;
            } while (b == 255 && ml < (int64_t)1 << 40);
        }
        ml += 4;
        if (op + ml > cap - 5) return S_CORRUPT;
        op += ml;
    }
}

typedef struct { const uint8_t *buf; int64_t len; const int64_t *off, *size, *dsize; int32_t *status; } Lz4Args;

static void lz4_item(void *p, int64_t i, Ctx *c) {
    (void)c;
    Lz4Args *a = p;
    if (a->off[i] < 0 || a->size[i] <= 0 || a->off[i] + a->size[i] > a->len || a->dsize[i] < 0) {
        a->status[i] = S_BOUNDS;
        return;
    }
    a->status[i] = lz4_walk(a->buf + a->off[i], a->size[i], a->dsize[i]);
}

/* Check n LZ4 blocks buf[off[i]:+size[i]], each to decode to dsize[i] bytes, on `threads` threads
 * (needs no library). Returns how many fail; status[i] says why. */
API int64_t gz_lz4_check(int64_t n, const uint8_t *buf, int64_t len, const int64_t *off, const int64_t *size,
                         const int64_t *dsize, int threads, int32_t *status) {
    Lz4Args a = {buf, len, off, size, dsize, status};
    not_run(status, n);
    parallel(n, threads, lz4_item, &a);
    return count_bad(status, n);
}
