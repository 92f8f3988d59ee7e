/* Shared-memory all-reduce for the ranks of one host (sum; float32 and bfloat16; in place).
 *
 * One POSIX shared-memory segment holds, for every rank, a cache-line-separated pair of
 * counters and NSLOTS data slots of CHUNK_BYTES each:
 *
 *   header | flags[rank] = {posted, done, pid} | data[slot][rank][CHUNK_BYTES]
 *
 * All ranks issue all-reduces in the same order, so they agree on a round number n = 1, 2, ...
 * A round uses slot n % NSLOTS and carries at most CHUNK_BYTES per rank:
 *
 *   issue(n):  wait until every rank's done >= n - NSLOTS (nobody still reads slot n % NSLOTS),
 *              copy this rank's partial into its slot, then posted = n (release store).
 *   reduce(n): wait until every rank's posted >= n (acquire loads), sum the slots of all ranks
 *              in rank order 0, 1, ..., N-1 into the output, then done = n (release store).
 *
 * Every rank sums the same values in the same order, so all ranks get bit-identical results:
 * float32 as ((x0 + x1) + x2) + ...; bfloat16 is summed in float32 in the same order and
 * rounded once to bfloat16 (nearest even). Between issue and reduce the rank is free to
 * compute: the peers' data lands in their slots meanwhile (ladder's overlap). The caller
 * keeps fewer than NSLOTS rounds outstanding and reduces them in order (shm.py does).
 *
 * Waiting spins with a pause instruction for `spin_us` microseconds (the peer is usually a
 * few microseconds away when every rank has its own core), then sleeps on a futex of the
 * counter it waits for; a rank that bumps a counter wakes the sleepers (only when someone
 * sleeps: a Dekker-style check of a waiter count, both sides sequentially consistent). So
 * oversubscribed ranks (more ranks than cores) hand their core to the rank they wait for.
 * Counters are 32-bit (futex words) and compared modulo 2^32. Waits return after
 * `slice_ms` so that Python can handle signals and time limits, and return LZ_PEER_DEAD
 * when a peer's process is gone.
 *
 * Built by ladderize/runtime/shm.py with the machine's C compiler (the helper in gemv.py).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <sched.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() __asm__ __volatile__("" ::: "memory")
#endif

#define MAGIC 0x6c61646465727368ULL /* "laddersh" */
#define NSLOTS 4
#define CHUNK_BYTES (512 * 1024)
#define MAX_RANKS 64
#define LINE 128

#define LZ_OK 0
#define LZ_TIMEOUT 1
#define LZ_PEER_DEAD 2

typedef struct {
    uint32_t posted;  /* last round this rank has copied in */
    uint32_t posted_waiters;
    char pad0[LINE - 2 * sizeof(uint32_t)];
    uint32_t done;  /* last round this rank has summed (its reads of the slots are over) */
    uint32_t done_waiters;
    int64_t pid;
    char pad1[LINE - 2 * sizeof(uint32_t) - sizeof(int64_t)];
} rank_flags;

typedef struct {
    uint64_t magic;
    int64_t world;
    char pad[LINE - 2 * sizeof(uint64_t)];
    rank_flags flags[MAX_RANKS];
} header;

int64_t lz_chunk_bytes(void) { return CHUNK_BYTES; }
int64_t lz_nslots(void) { return NSLOTS; }
int64_t lz_max_ranks(void) { return MAX_RANKS; }

int64_t lz_segment_bytes(int64_t world) { return (int64_t)sizeof(header) + (int64_t)NSLOTS * world * CHUNK_BYTES; }

static inline char *slot(void *base, int64_t world, uint64_t round, int64_t rank) {
    return (char *)base + sizeof(header) + ((int64_t)(round % NSLOTS) * world + rank) * (int64_t)CHUNK_BYTES;
}

/* Create (create != 0: exclusively, mode 0600, sized) or open a segment and map it; NULL and errno on failure. */
void *lz_map(const char *name, int64_t world, int create) {
    int64_t bytes = lz_segment_bytes(world);
    int fd = shm_open(name, create ? (O_CREAT | O_EXCL | O_RDWR) : O_RDWR, 0600);
    if (fd < 0) return NULL;
    if (create && ftruncate(fd, bytes) != 0) {
        int saved = errno;
        close(fd);
        shm_unlink(name);
        errno = saved;
        return NULL;
    }
    void *base = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int saved = errno;
    close(fd); /* the mapping keeps the memory */
    if (base == MAP_FAILED) {
        if (create) shm_unlink(name);
        errno = saved;
        return NULL;
    }
    if (create) {
        header *h = (header *)base;
        h->world = world;
        __atomic_store_n(&h->magic, MAGIC, __ATOMIC_RELEASE);
    }
    return base;
}

/* 0 when the segment is a ladderize segment for `world` ranks. */
int lz_check(void *base, int64_t world) {
    header *h = (header *)base;
    return (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == MAGIC && h->world == world) ? 0 : -1;
}

void lz_register(void *base, int64_t rank, int64_t pid) {
    header *h = (header *)base;
    __atomic_store_n(&h->flags[rank].pid, pid, __ATOMIC_RELEASE);
}

int lz_unmap(void *base, int64_t world) { return munmap(base, (size_t)lz_segment_bytes(world)); }

int lz_unlink(const char *name) { return shm_unlink(name); }

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* A rank is gone when its process no longer exists or is a zombie (dead, not yet reaped by its parent). */
static int peer_dead(header *h, int64_t world) {
    for (int64_t r = 0; r < world; ++r) {
        int64_t pid = __atomic_load_n(&h->flags[r].pid, __ATOMIC_ACQUIRE);
        if (pid <= 0) continue;
        if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return 1;
        char path[64], text[512];
        snprintf(path, sizeof path, "/proc/%lld/stat", (long long)pid);
        int fd = open(path, O_RDONLY);
        if (fd < 0) continue;
        ssize_t n = read(fd, text, sizeof text - 1);
        close(fd);
        if (n <= 0) continue;
        text[n] = 0;
        char *paren = strrchr(text, ')'); /* "pid (comm) S ...": the state follows the last parenthesis */
        if (paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X')) return 1;
    }
    return 0;
}

static long futex(uint32_t *word, int op, uint32_t value, const struct timespec *timeout) {
    return syscall(SYS_futex, word, op, value, timeout, NULL, 0);
}

static inline int reached(uint32_t value, uint32_t target) { return (int32_t)(value - target) >= 0; }

/* Bump this rank's counter and wake whoever sleeps on it. */
static inline void publish(uint32_t *counter, uint32_t *waiters, uint32_t value) {
    __atomic_store_n(counter, value, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(waiters, __ATOMIC_SEQ_CST) != 0) futex(counter, FUTEX_WAKE, INT32_MAX, NULL);
}

/* Wait until every rank's counter (posted, or done when `use_done`) reaches `target`. */
static int wait_all(header *h, int64_t world, uint32_t target, int use_done, double spin_us, double slice_ms) {
    double start = now_ms();
    int64_t iterations = 0;
    for (int64_t r = 0; r < world; ++r) {
        uint32_t *counter = use_done ? &h->flags[r].done : &h->flags[r].posted;
        uint32_t *waiters = use_done ? &h->flags[r].done_waiters : &h->flags[r].posted_waiters;
        uint32_t value = __atomic_load_n(counter, __ATOMIC_ACQUIRE);
        while (!reached(value, target)) {
            CPU_RELAX();
            if ((++iterations & 63) == 0 && (now_ms() - start) * 1e3 >= spin_us) {
                /* sleep on the counter: announce, re-check, then wait while it still holds `value` */
                __atomic_add_fetch(waiters, 1, __ATOMIC_SEQ_CST);
                for (;;) {
                    value = __atomic_load_n(counter, __ATOMIC_SEQ_CST);
                    if (reached(value, target)) break;
                    double left = slice_ms - (now_ms() - start);
                    if (left <= 0) {
                        __atomic_sub_fetch(waiters, 1, __ATOMIC_SEQ_CST);
                        return peer_dead(h, world) ? LZ_PEER_DEAD : LZ_TIMEOUT;
                    }
                    if (left > 10.0) left = 10.0;
                    struct timespec ts = {0, (long)(left * 1e6)};
                    futex(counter, FUTEX_WAIT, value, &ts);
                }
                __atomic_sub_fetch(waiters, 1, __ATOMIC_SEQ_CST);
            }
            value = __atomic_load_n(counter, __ATOMIC_ACQUIRE);
        }
    }
    return LZ_OK;
}

/* Post this rank's `nbytes` (<= CHUNK_BYTES) of round `round`. LZ_TIMEOUT leaves nothing done: call again. */
int lz_issue(void *base, int64_t world, int64_t rank, uint64_t round, const void *src, int64_t nbytes, double spin_us,
             double slice_ms) {
    header *h = (header *)base;
    if (round > NSLOTS) {
        int status = wait_all(h, world, (uint32_t)(round - NSLOTS), 1, spin_us, slice_ms);
        if (status != LZ_OK) return status;
    }
    memcpy(slot(base, world, round, rank), src, (size_t)nbytes);
    publish(&h->flags[rank].posted, &h->flags[rank].posted_waiters, (uint32_t)round);
    return LZ_OK;
}

static inline float from_bf16(uint16_t value) {
    uint32_t bits = (uint32_t)value << 16;
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

static inline uint16_t to_bf16(float value) {
    uint32_t bits;
    memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* NaN stays NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);                                          /* round to nearest even */
    return (uint16_t)(bits >> 16);
}

static void sum_f32(void *base, int64_t world, uint64_t round, float *dst, int64_t count) {
    const float *s0 = (const float *)slot(base, world, round, 0);
    for (int64_t i = 0; i < count; ++i) dst[i] = s0[i];
    for (int64_t r = 1; r < world; ++r) {
        const float *s = (const float *)slot(base, world, round, r);
        for (int64_t i = 0; i < count; ++i) dst[i] += s[i];
    }
}

static void sum_bf16(void *base, int64_t world, uint64_t round, uint16_t *dst, int64_t count) {
    float acc[1024];
    for (int64_t lo = 0; lo < count; lo += 1024) {
        int64_t n = count - lo < 1024 ? count - lo : 1024;
        const uint16_t *s0 = (const uint16_t *)slot(base, world, round, 0) + lo;
        for (int64_t i = 0; i < n; ++i) acc[i] = from_bf16(s0[i]);
        for (int64_t r = 1; r < world; ++r) {
            const uint16_t *s = (const uint16_t *)slot(base, world, round, r) + lo;
            for (int64_t i = 0; i < n; ++i) acc[i] += from_bf16(s[i]);
        }
        for (int64_t i = 0; i < n; ++i) dst[lo + i] = to_bf16(acc[i]);
    }
}

/* Wait for every rank's data of round `round` and sum it into `dst` (count elements; dtype 0 = float32,
 * 1 = bfloat16). LZ_TIMEOUT leaves nothing done: call again. */
int lz_reduce(void *base, int64_t world, int64_t rank, uint64_t round, void *dst, int64_t count, int dtype,
              double spin_us, double slice_ms) {
    header *h = (header *)base;
    int status = wait_all(h, world, (uint32_t)round, 0, spin_us, slice_ms);
    if (status != LZ_OK) return status;
    if (dtype == 0) sum_f32(base, world, round, (float *)dst, count);
    else sum_bf16(base, world, round, (uint16_t *)dst, count);
    publish(&h->flags[rank].done, &h->flags[rank].done_waiters, (uint32_t)round);
    return LZ_OK;
}
