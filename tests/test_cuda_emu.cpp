/* tests/test_cuda_emu.cpp - a self-test of the CPU emulation of CUDA (tests/cuda_emu.h): small kernels
   that show each behaviour, checked against host references; ends with "N passed, N failed".

       g++     -std=c++17 -Wall -Wextra -Werror -fopenmp -O1 -g tests/test_cuda_emu.cpp -o build/test_cuda_emu -lm
       clang++ -std=c++17 -Wall -Wextra -Werror -fopenmp -O1 -g tests/test_cuda_emu.cpp -o build/test_cuda_emu -lm
       (either, plus -fsanitize=address,undefined: the overrun tests then run too)

   -DDROP_BARRIER removes a barrier from the reduction that should be right: its test then fails.
   A check that a kernel aborts runs it in a fork()ed child and reads the child's stderr. */
#include "cuda_emu.h"
#define TFM_IMPLEMENTATION /* tfm_sgemm, which cublasSgemm computes with */
#if defined(__clang__) /* transformer.h's own: clang 14 without OpenMP sees a counter set but not used */
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wunused-but-set-variable"
#endif
#include "../transformer.h"
#if defined(__clang__)
#pragma clang diagnostic pop
#endif

#include <signal.h>
#include <sys/wait.h>

#include <string>

/* the kernels' spellings, as transformer.h defines them under TFM_CUDA_EMULATION */
#ifndef TFM__LAUNCH
#define TFM__LAUNCH(k, grid, block, smem, ...) tfm_emu_launch(k, 0, (grid), (block), (smem), __VA_ARGS__)
#define TFM__SHARED(T, name, n) T *name = (T *)tfm_emu_shared(sizeof(T) * (size_t)(n))
#define TFM__SHARED_DYN(T, name) T *name = (T *)tfm_emu_dyn_shared()
#endif

/* ==== harness ==== */

static int checks_failed, tests_passed, tests_failed;
#define CHECK(cond)                                                               \
    do {                                                                          \
        if (!(cond)) {                                                            \
            checks_failed++;                                                      \
            printf("    FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);            \
        }                                                                         \
    } while (0)
#define CHECK_CU(expr, want)                                                      \
    do {                                                                          \
        int got__ = (int)(expr);                                                  \
        if (got__ != (int)(want)) {                                               \
            checks_failed++;                                                      \
            printf("    FAIL %s:%d: %s returned %d, want %d (%s)\n", __FILE__,    \
                   __LINE__, #expr, got__, (int)(want), #want);                   \
        }                                                                         \
    } while (0)

static void run(const char *name, void (*fn)(void)) {
    checks_failed = 0;
    fn();
    CHECK(tfm_emu_bytes_in_use() == 0); /* every test frees what it allocated */
    CHECK(tfm_emu_objects_in_use() == 0);
    tfm_emu_fail_clear();
    tfm_emu_reset();
    if (checks_failed) {
        tests_failed++;
        printf("FAIL %s\n", name);
    } else {
        tests_passed++;
        printf("ok   %s\n", name);
    }
    fflush(stdout);
}

/* Run fn in a child; true when it died (abort, or a sanitizer's exit) and its stderr holds every needle. */
static bool dies_with(void (*fn)(void), const char *n1, const char *n2 = "", const char *n3 = "") {
    int fd[2];
    std::string msg;
    char buf[512];
    ssize_t got;
    int status = 0;
    if (pipe(fd) != 0) return false;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        close(fd[1]);
        fn();
        _exit(0);
    }
    close(fd[1]);
    while ((got = read(fd[0], buf, sizeof buf)) > 0) msg.append(buf, (size_t)got);
    close(fd[0]);
    waitpid(pid, &status, 0);
    bool died = WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0); /* abort, or ASan's exit */
    bool ok = died && msg.find(n1) != std::string::npos &&
              msg.find(n2) != std::string::npos && msg.find(n3) != std::string::npos;
    if (!ok) printf("    child (status 0x%x) said: %s\n", status, msg.c_str());
    return ok;
}

static uint32_t bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
/* a device copy of n host floats */
static float *to_device(const float *h, size_t n) {
    float *d = nullptr;
    if (cudaMalloc(&d, n * sizeof(float)) != cudaSuccess) return nullptr;
    cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice);
    return d;
}
static std::vector<float> to_host(const float *d, size_t n) {
    std::vector<float> h(n);
    cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost);
    return h;
}
static const unsigned FULL = 0xffffffffu;

/* ==== block reduction with __syncthreads, and two mutants ==== */

#ifdef DROP_BARRIER
#define REDUCE_GOOD 2 /* the "right" kernel loses its loop barrier: its test must fail */
#else
#define REDUCE_GOOD 0
#endif
/* out[block] = sum of x over a grid-stride; DROP 1 removes the barrier after the stores, 2 the loop's */
template <int DROP> static __global__ void k_block_sum(const float *x, float *out, int n) {
    TFM__SHARED(float, sh, 256);
    int t = threadIdx.x;
    float v = 0.0f;
    for (int i = blockIdx.x * blockDim.x + t; i < n; i += gridDim.x * blockDim.x) v += x[i];
    sh[t] = v;
    if (DROP != 1) __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) sh[t] += sh[t + s];
        if (DROP != 2) __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = sh[0];
}
static void reduce_with(void (*k)(const float *, float *, int), float *total) {
    const int n = 1000, blocks = 3;
    std::vector<float> h(n);
    for (int i = 0; i < n; i++) h[i] = (float)(i % 17);
    float *x = to_device(h.data(), n), *out = nullptr;
    cudaMalloc(&out, blocks * sizeof(float));
    TFM__LAUNCH(k, blocks, 256, 0, x, out, n);
    CHECK_CU(cudaGetLastError(), cudaSuccess);
    std::vector<float> r = to_host(out, blocks);
    *total = r[0] + r[1] + r[2];
    cudaFree(x);
    cudaFree(out);
}
static void test_reduce_barrier(void) {
    float want = 0.0f, good, no_store_barrier, no_loop_barrier;
    for (int i = 0; i < 1000; i++) want += (float)(i % 17);
    reduce_with((k_block_sum<REDUCE_GOOD>), &good);
    reduce_with((k_block_sum<1>), &no_store_barrier);
    reduce_with((k_block_sum<2>), &no_loop_barrier);
    CHECK(good == want);
    CHECK(isnan(no_store_barrier)); /* reads shared memory nobody wrote yet: poison */
    CHECK(no_loop_barrier != want); /* thread 0 runs ahead of the others */
}

/* ==== warp reductions and shuffle semantics ==== */

/* out[i] = x[i] reduced by shuffles with offsets start, start/2, ..., 1 in segments of width */
template <int XOR> static __global__ void k_warp_sum(const float *x, float *out, int start, int width) {
    int i = threadIdx.x;
    float v = x[i];
    for (int o = start; o > 0; o >>= 1)
        v += XOR ? __shfl_xor_sync(FULL, v, o, width) : __shfl_down_sync(FULL, v, o, width);
    out[i] = v;
}
static void test_warp_reduce(void) {
    const int n = 64;
    float h[n];
    for (int i = 0; i < n; i++) h[i] = (float)(i + 1);
    float *x = to_device(h, n), *out = nullptr;
    cudaMalloc(&out, n * sizeof(float));
    for (int width = 32; width >= 8; width /= 2) {
        for (int use_xor = 0; use_xor < 2; use_xor++) {
            if (use_xor) TFM__LAUNCH((k_warp_sum<1>), 1, n, 0, x, out, width / 2, width);
            else TFM__LAUNCH((k_warp_sum<0>), 1, n, 0, x, out, width / 2, width);
            std::vector<float> r = to_host(out, n);
            for (int seg = 0; seg < n; seg += width) {
                float want = 0.0f;
                for (int j = seg; j < seg + width; j++) want += h[j];
                CHECK(r[seg] == want);
                if (use_xor)
                    for (int j = seg; j < seg + width; j++) CHECK(r[j] == want); /* every lane has the sum */
            }
        }
    }
    /* a full-warp reduction (offsets from 16) run with width 16 is wrong */
    TFM__LAUNCH((k_warp_sum<0>), 1, n, 0, x, out, 16, 16);
    float full = 0.0f;
    for (int j = 0; j < 32; j++) full += h[j];
    CHECK(to_host(out, 1)[0] != full);
    TFM__LAUNCH((k_warp_sum<1>), 1, n, 0, x, out, 16, 16);
    CHECK(to_host(out, 1)[0] != full);
    cudaFree(x);
    cudaFree(out);
}

/* out[4 i + 0..3] = up, down, xor, idx shuffles of a lane-specific value */
static __global__ void k_shuffles(int *out, unsigned arg, int width) {
    int i = threadIdx.x, v = 1000 * (i / 32) + i % 32;
    out[4 * i + 0] = __shfl_up_sync(FULL, v, arg, width);
    out[4 * i + 1] = __shfl_down_sync(FULL, v, arg, width);
    out[4 * i + 2] = __shfl_xor_sync(FULL, v, (int)arg, width);
    out[4 * i + 3] = __shfl_sync(FULL, v, (int)arg, width);
}
/* CUDA programming guide, warp shuffle functions; -1: the source lane does not exist */
static int want_shuffle(int which, int i, int n, unsigned arg, int width) {
    int lane = i % 32, w0 = i - lane, seg = lane / width * width, src;
    if (which == 0) src = lane - (int)arg >= seg ? lane - (int)arg : lane;            /* up: own value below */
    else if (which == 1) src = lane + (int)arg < seg + width ? lane + (int)arg : lane; /* down: own value past */
    else if (which == 2) src = (lane ^ (int)arg) < seg + width ? lane ^ (int)arg : lane; /* xor: later group: own */
    else src = seg + (int)arg % width;                                               /* idx: modulo width */
    return w0 + src < n ? 1000 * (i / 32) + src : -1;
}
static void test_shuffle_semantics(void) {
    const int sizes[2] = {64, 48}; /* 48: the second warp has 16 lanes */
    int *out = nullptr, bad = 0;
    cudaMalloc(&out, 4 * 64 * sizeof(int));
    for (int s = 0; s < 2; s++)
        for (int width = 1; width <= 32; width *= 2)
            for (unsigned arg = 0; arg < 32; arg++) {
                int n = sizes[s], h[4 * 64];
                TFM__LAUNCH(k_shuffles, 1, n, 0, out, arg, width);
                cudaMemcpy(h, out, 4 * (size_t)n * sizeof(int), cudaMemcpyDeviceToHost);
                for (int i = 0; i < n; i++)
                    for (int w = 0; w < 4; w++)
                        if (h[4 * i + w] != want_shuffle(w, i, n, arg, width) && bad++ < 5)
                            printf("    n %d width %d arg %u thread %d op %d: %d, want %d\n", n, width, arg, i, w,
                                   h[4 * i + w], want_shuffle(w, i, n, arg, width));
            }
    CHECK(bad == 0);
    /* spot checks from the guide's wording, width 8: xor 8 from lane 3 reaches a later group (own value),
       from lane 11 an earlier one (lane 3's); down 1 at a group's last lane keeps its own value */
    int h[4 * 64];
    TFM__LAUNCH(k_shuffles, 1, 64, 0, out, 8u, 8);
    cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
    CHECK(h[4 * 3 + 2] == 3 && h[4 * 11 + 2] == 3);
    TFM__LAUNCH(k_shuffles, 1, 64, 0, out, 1u, 8);
    cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
    CHECK(h[4 * 7 + 1] == 7 && h[4 * 6 + 1] == 7 && h[4 * 8 + 0] == 8 && h[4 * 9 + 0] == 8);
    CHECK(h[4 * 40 + 1] == 1009); /* second warp: lane 8 -> lane 9 */
    cudaFree(out);
}

/* odd lanes return first: a shuffle from them yields poison, with the full mask or without them */
static __global__ void k_returned_lane(float *out, unsigned mask) {
    int i = threadIdx.x;
    if (i & 1) return;
    out[i] = __shfl_xor_sync(mask, (float)i, 1);
    out[i + 1] = __shfl_xor_sync(mask, (float)i, 2);
}
static void test_shuffle_poison(void) {
    float *out = nullptr;
    cudaMalloc(&out, 32 * sizeof(float));
    const unsigned masks[2] = {FULL, 0x55555555u};
    for (int m = 0; m < 2; m++) {
        TFM__LAUNCH(k_returned_lane, 1, 32, 0, out, masks[m]);
        CHECK_CU(cudaGetLastError(), cudaSuccess);
        std::vector<float> r = to_host(out, 32);
        for (int i = 0; i < 32; i += 2) {
            CHECK(bits(r[i]) == 0xffffffffu);        /* from an odd lane */
            CHECK(r[i + 1] == (float)(i ^ 2));       /* from an even lane */
        }
    }
    cudaFree(out);
}

/* ==== shared memory: dynamic, poison, declaration sites, limits ==== */

static __global__ void k_reverse(float *x, int n) {
    TFM__SHARED_DYN(float, s);
    int t = threadIdx.x;
    s[t] = x[t];
    __syncthreads();
    x[t] = s[n - 1 - t];
}
static __global__ void k_big_dyn(float *out, int n) {
    TFM__SHARED_DYN(float, s);
    s[n - 1] = 5.0f;
    out[0] = s[n - 1];
}
static void test_dynamic_shared(void) {
    const int n = 200;
    float h[n];
    for (int i = 0; i < n; i++) h[i] = (float)i;
    float *x = to_device(h, n);
    TFM__LAUNCH(k_reverse, 1, n, n * sizeof(float), x, n);
    CHECK_CU(cudaGetLastError(), cudaSuccess);
    std::vector<float> r = to_host(x, n);
    for (int i = 0; i < n; i++) CHECK(r[i] == (float)(n - 1 - i));
    /* 64 KiB of dynamic shared memory needs the opt-in */
    const int big = 16384;
    r[0] = 0.0f;
    cudaMemcpy(x, r.data(), sizeof(float), cudaMemcpyHostToDevice);
    TFM__LAUNCH(k_big_dyn, 1, 1, big * sizeof(float), x, big);
    CHECK_CU(cudaGetLastError(), cudaErrorInvalidConfiguration);
    CHECK(to_host(x, 1)[0] == 0.0f);
    CHECK_CU(cudaFuncSetAttribute(k_big_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize, 300 * 1024),
             cudaErrorInvalidValue);
    CHECK_CU(cudaGetLastError(), cudaErrorInvalidValue); /* a failed call sets the last error */
    CHECK_CU(cudaFuncSetAttribute(k_big_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize, big * 4), cudaSuccess);
    TFM__LAUNCH(k_big_dyn, 1, 1, big * sizeof(float), x, big);
    CHECK_CU(cudaGetLastError(), cudaSuccess);
    CHECK(to_host(x, 1)[0] == 5.0f);
    cudaFree(x);
}

/* out[4 b + 0..1]: static and dynamic shared memory read before anyone wrote it; then it is written */
static __global__ void k_read_unwritten(float *out) {
    TFM__SHARED(float, st, 4);
    TFM__SHARED_DYN(float, dy);
    if (threadIdx.x == 0) {
        out[4 * blockIdx.x + 0] = st[1];
        out[4 * blockIdx.x + 1] = dy[1];
        st[1] = dy[1] = 1.0f;
    }
}
/* the same declaration in a loop and in a helper is one array, as a __shared__ variable is */
static __device__ int *helper_array(void) {
    TFM__SHARED(int, a, 8);
    return a;
}
static __global__ void k_sites(int *out) {
    int t = threadIdx.x;
    for (int i = 0; i < 3; i++) {
        TFM__SHARED(int, s, 4);
        if (t == i) s[i] = 10 + i;
        __syncthreads();
        if (t == 0 && i == 2) out[0] = s[0] + s[1] + s[2];
    }
    int *a = helper_array(), *b = helper_array();
    if (t == 0) out[1] = a == b;
}
static void test_shared_poison_and_sites(void) {
    float *out = nullptr, h[8];
    cudaMalloc(&out, 8 * sizeof(float));
    cudaMemset(out, 0, 8 * sizeof(float));
    TFM__LAUNCH(k_read_unwritten, 2, 32, 16, out);
    cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
    for (int b = 0; b < 2; b++) CHECK(bits(h[4 * b]) == 0xffffffffu && bits(h[4 * b + 1]) == 0xffffffffu);
    int *io = nullptr, hi[2];
    cudaMalloc(&io, 2 * sizeof(int));
    TFM__LAUNCH(k_sites, 1, 32, 0, io);
    cudaMemcpy(hi, io, sizeof hi, cudaMemcpyDeviceToHost);
    CHECK(hi[0] == 33 && hi[1] == 1);
    /* fresh device memory is poison too */
    float *fresh = nullptr;
    cudaMalloc(&fresh, 4 * sizeof(float));
    CHECK(bits(to_host(fresh, 4)[3]) == 0xffffffffu);
    cudaFree(fresh);
    cudaFree(out);
    cudaFree(io);
}

/* ==== atomics, barrier and warp votes ==== */

static __global__ void k_atomics(float *f, int *i, double *d, unsigned long long *u, int *mx) {
    atomicAdd(f, 1.0f);
    atomicAdd(i, 2);
    atomicAdd(d, 0.5);
    atomicAdd(u, 3ull);
    atomicMax(mx, (int)(blockIdx.x * blockDim.x + threadIdx.x));
}
static __global__ void k_votes(int *out) {
    int t = threadIdx.x, lane = t % 32;
    int c = __syncthreads_count(t % 3 == 0), a = __syncthreads_and(t < 1000), o = __syncthreads_or(t == 5);
    unsigned b = __ballot_sync(FULL, lane % 4 == 0);
    int any = __any_sync(FULL, lane == 31), all = __all_sync(FULL, lane < 31);
    if (t == 0) {
        out[0] = c;
        out[1] = a;
        out[2] = o;
        out[3] = (int)b;
        out[4] = any;
        out[5] = all;
    }
}
static void test_atomics_and_votes(void) {
    struct Acc { float f; int i; double d; unsigned long long u; int mx; } h = {0, 0, 0, 0, -1}, *d = nullptr;
    cudaMalloc(&d, sizeof h);
    cudaMemcpy(d, &h, sizeof h, cudaMemcpyHostToDevice);
    TFM__LAUNCH(k_atomics, 10, 128, 0, &d->f, &d->i, &d->d, &d->u, &d->mx);
    cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);
    CHECK(h.f == 1280.0f && h.i == 2560 && h.d == 640.0 && h.u == 3840ull && h.mx == 1279);
    int *out = nullptr, r[6];
    cudaMalloc(&out, sizeof r);
    TFM__LAUNCH(k_votes, 1, 96, 0, out);
    cudaMemcpy(r, out, sizeof r, cudaMemcpyDeviceToHost);
    CHECK(r[0] == 32 && r[1] == 1 && r[2] == 1 && (unsigned)r[3] == 0x11111111u && r[4] == 1 && r[5] == 0);
    cudaFree(d);
    cudaFree(out);
}

/* ==== 2-D and 3-D grids and blocks ==== */

static __global__ void k_coords(int *out, int *order, int *counter, int *dims) {
    unsigned b = blockIdx.x + blockIdx.y * gridDim.x + blockIdx.z * gridDim.x * gridDim.y;
    unsigned t = threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y;
    unsigned nt = blockDim.x * blockDim.y * blockDim.z;
    out[b * nt + t] =
        (int)(((((blockIdx.z * 4 + blockIdx.y) * 4 + blockIdx.x) * 8 + threadIdx.z) * 8 + threadIdx.y) * 8 +
              threadIdx.x);
    if (t == 0) order[b] = atomicAdd(counter, 1);
    if (b == 0 && t == 0) {
        dims[0] = (int)gridDim.x, dims[1] = (int)gridDim.y, dims[2] = (int)gridDim.z;
        dims[3] = (int)blockDim.x, dims[4] = (int)blockDim.y, dims[5] = (int)blockDim.z;
    }
}
static void test_grid_3d(void) {
    dim3 grid(3, 2, 2), block(4, 3, 2);
    const int nb = 12, nt = 24;
    int *out = nullptr, *order = nullptr, *counter = nullptr, *dims = nullptr, h[nb * nt], ho[nb], hd[6];
    cudaMalloc(&out, sizeof h);
    cudaMalloc(&order, sizeof ho);
    cudaMalloc(&counter, sizeof(int));
    cudaMalloc(&dims, sizeof hd);
    cudaMemset(counter, 0, sizeof(int));
    TFM__LAUNCH(k_coords, grid, block, 0, out, order, counter, dims);
    cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
    cudaMemcpy(ho, order, sizeof ho, cudaMemcpyDeviceToHost);
    cudaMemcpy(hd, dims, sizeof hd, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int bz = 0; bz < 2; bz++)
        for (int by = 0; by < 2; by++)
            for (int bx = 0; bx < 3; bx++)
                for (int tz = 0; tz < 2; tz++)
                    for (int ty = 0; ty < 3; ty++)
                        for (int tx = 0; tx < 4; tx++) {
                            int b = bx + by * 3 + bz * 6, t = tx + ty * 4 + tz * 12;
                            bad += h[b * nt + t] != ((((bz * 4 + by) * 4 + bx) * 8 + tz) * 8 + ty) * 8 + tx;
                        }
    CHECK(bad == 0);
    for (int b = 0; b < nb; b++) CHECK(ho[b] == b); /* blocks run in order, x fastest */
    CHECK(hd[0] == 3 && hd[1] == 2 && hd[2] == 2 && hd[3] == 4 && hd[4] == 3 && hd[5] == 2);
    cudaFree(out);
    cudaFree(order);
    cudaFree(counter);
    cudaFree(dims);
}

/* ==== launch configurations ==== */

static __global__ void k_count(int *n) { atomicAdd(n, 1); }
static void test_launch_config(void) {
    int *n = nullptr, h = 0;
    cudaMalloc(&n, sizeof(int));
    cudaMemset(n, 0, sizeof(int));
    struct { dim3 grid, block; size_t smem; } bad[] = {
        {dim3(1), dim3(0), 0},           {dim3(1), dim3(1025), 0},         {dim3(1), dim3(32, 32, 2), 0},
        {dim3(1), dim3(1, 1, 65), 0},    {dim3(1), dim3(1, 1025, 1), 0},   {dim3(0), dim3(32), 0},
        {dim3(1, 65536), dim3(32), 0},   {dim3(1, 1, 0), dim3(32), 0},     {dim3(1u << 31), dim3(32), 0},
        {dim3(1), dim3(32), 48 * 1024 + 1},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        TFM__LAUNCH(k_count, bad[i].grid, bad[i].block, bad[i].smem, n);
        CHECK_CU(cudaPeekAtLastError(), cudaErrorInvalidConfiguration);
        CHECK_CU(cudaGetLastError(), cudaErrorInvalidConfiguration);
        CHECK_CU(cudaGetLastError(), cudaSuccess); /* not sticky */
    }
    cudaMemcpy(&h, n, sizeof h, cudaMemcpyDeviceToHost);
    CHECK(h == 0);
    TFM__LAUNCH(k_count, dim3(2, 1, 3), dim3(1, 1, 64), 48 * 1024, n);
    TFM__LAUNCH(k_count, 1, dim3(32, 32), 0, n);
    CHECK_CU(cudaGetLastError(), cudaSuccess);
    cudaMemcpy(&h, n, sizeof h, cudaMemcpyDeviceToHost);
    CHECK(h == 6 * 64 + 1024);
    cudaFree(n);
}

/* ==== what aborts: divergence, host pointers, overflowing shared memory ==== */

enum { kLineA = __LINE__ + 3, kLineB = __LINE__ + 5 };
static __global__ void k_divergent(int *out) {
    if (threadIdx.x % 2)
        __syncthreads();
    else
        __syncthreads();
    out[threadIdx.x] = 1;
}
static __global__ void k_warp_divergent(float *out) {
    float v = (float)threadIdx.x;
    if (threadIdx.x < 16) v = __shfl_down_sync(FULL, v, 1);
    __syncthreads();
    out[threadIdx.x] = v;
}
static __global__ void k_mask_without_me(float *out) { out[threadIdx.x] = __shfl_down_sync(0x1u, 1.0f, 1); }
static __global__ void k_too_much_shared(float *out) {
    TFM__SHARED(float, a, 8192);
    TFM__SHARED(float, b, 8192);
    a[0] = b[0] = 0.0f;
    out[0] = a[0];
}
static __global__ void k_writes(float *a, const float *b, int n) {
    if ((int)threadIdx.x < n) a[threadIdx.x] = b[threadIdx.x];
}
static int *dev_ints(void) {
    int *d = nullptr;
    cudaMalloc(&d, 64 * sizeof(int));
    return d;
}
static void child_divergent(void) { TFM__LAUNCH(k_divergent, 1, 32, 0, dev_ints()); }
static void child_warp_divergent(void) { TFM__LAUNCH(k_warp_divergent, 1, 32, 0, (float *)dev_ints()); }
static void child_mask(void) { TFM__LAUNCH(k_mask_without_me, 1, 32, 0, (float *)dev_ints()); }
static void child_shared(void) { TFM__LAUNCH(k_too_much_shared, 1, 1, 0, (float *)dev_ints()); }
static float host_floats[16];
static void child_host_arg(void) { TFM__LAUNCH(k_writes, 1, 16, 0, (float *)dev_ints(), host_floats, 16); }
static void child_freed_arg(void) {
    float *d = (float *)dev_ints(), *e = (float *)dev_ints();
    cudaFree(d);
    TFM__LAUNCH(k_writes, 1, 16, 0, d, e, 16);
}
static void test_aborts(void) {
    char a[64], b[64], addr[64];
    snprintf(a, sizeof a, "test_cuda_emu.cpp:%d", (int)kLineA);
    snprintf(b, sizeof b, "test_cuda_emu.cpp:%d", (int)kLineB);
    CHECK(dies_with(child_divergent, "divergent __syncthreads", a, b));
    CHECK(dies_with(child_warp_divergent, "divergent warp", "__shfl_down_sync", "__syncthreads"));
    CHECK(dies_with(child_mask, "leaves out the calling lane 1"));
    CHECK(dies_with(child_shared, "static shared memory reaches 65536 bytes"));
    snprintf(addr, sizeof addr, "argument 2 of 3: %p is not device memory", (void *)host_floats);
    CHECK(dies_with(child_host_arg, "kernel k_writes", addr));
    CHECK(dies_with(child_freed_arg, "argument 1 of 3", "a host pointer or a freed one"));
}

/* ==== under AddressSanitizer: overruns of device, shared and fiber-stack memory are reported ==== */

#ifdef TFM_EMU__ASAN
static __global__ void k_overruns(float *x, int n, int which) {
    TFM__SHARED(float, sh, 32);
    volatile float local[8];
    int t = threadIdx.x;
    local[t % 8] = 1.0f;
    sh[t] = x[t];
    __syncthreads(); /* the fibers have switched: ASan must still know each one's stack */
    if (t == 5 && which == 0) x[n] = local[t % 8];
    if (t == 5 && which == 1) sh[32] = local[t % 8];
    if (t == 5 && which == 2) local[t + 3] = sh[t];
}
static int overrun_case;
static void child_overrun(void) {
    float *x = (float *)dev_ints(); /* 64 floats */
    TFM__LAUNCH(k_overruns, 1, 32, 0, x, 64, overrun_case);
}
static void test_asan_overruns(void) {
    const char *want[3] = {"heap-buffer-overflow", "heap-buffer-overflow", "stack-buffer-overflow"};
    for (overrun_case = 0; overrun_case < 3; overrun_case++) CHECK(dies_with(child_overrun, want[overrun_case]));
}
#endif

/* ==== memory: copies, kinds and their errors, attributes, capacity ==== */

static void test_memcpy(void) {
    float h[64], back[64], *d = nullptr, *d2 = nullptr, *pinned = nullptr;
    for (int i = 0; i < 64; i++) h[i] = (float)i;
    CHECK_CU(cudaMalloc(&d, sizeof h), cudaSuccess);
    CHECK_CU(cudaMalloc(&d2, sizeof h), cudaSuccess);
    CHECK_CU(cudaMallocHost(&pinned, sizeof h), cudaSuccess);
    CHECK(((uintptr_t)d & 255) == 0);
    /* every kind, and the default */
    CHECK_CU(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice), cudaSuccess);
    CHECK_CU(cudaMemcpy(d2, d, sizeof h, cudaMemcpyDeviceToDevice), cudaSuccess);
    CHECK_CU(cudaMemcpy(pinned, d2, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    CHECK_CU(cudaMemcpy(back, pinned, sizeof h, cudaMemcpyHostToHost), cudaSuccess);
    CHECK(memcmp(back, h, sizeof h) == 0);
    CHECK_CU(cudaMemcpy(d + 8, h, 8 * sizeof(float), cudaMemcpyDefault), cudaSuccess);
    CHECK_CU(cudaMemcpy(back, d, sizeof h, cudaMemcpyDefault), cudaSuccess);
    CHECK(back[8] == 0.0f && back[15] == 7.0f && back[16] == 16.0f);
    /* kinds that contradict the pointers, ranges past the end */
    CHECK_CU(cudaMemcpy(back, h, sizeof h, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    CHECK_CU(cudaMemcpy(back, h, sizeof h, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    CHECK_CU(cudaMemcpy(d, h, sizeof h, cudaMemcpyDeviceToDevice), cudaErrorInvalidValue);
    CHECK_CU(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToHost), cudaErrorInvalidValue);
    CHECK_CU(cudaMemcpy(pinned, h, sizeof h, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    CHECK_CU(cudaMemcpy(d, h, sizeof h, (cudaMemcpyKind)7), cudaErrorInvalidMemcpyDirection);
    CHECK_CU(cudaMemcpy(d + 60, h, 5 * sizeof(float), cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    CHECK_CU(cudaMemcpy(back, d2 + 1, sizeof h, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    CHECK_CU(cudaMemcpy(d, nullptr, 4, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    CHECK_CU(cudaMemcpy(d, nullptr, 0, cudaMemcpyHostToDevice), cudaSuccess);
    CHECK_CU(cudaGetLastError(), cudaErrorInvalidValue); /* the last failure */
    CHECK_CU(cudaGetLastError(), cudaSuccess);
    /* 2-D: 5 rows of 8 floats into a device pitch of 12 */
    CHECK_CU(cudaMemset(d, 0, sizeof h), cudaSuccess);
    CHECK_CU(cudaMemcpy2D(d, 12 * sizeof(float), h, 8 * sizeof(float), 8 * sizeof(float), 5, cudaMemcpyHostToDevice),
             cudaSuccess);
    CHECK_CU(cudaMemcpy(back, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    CHECK(back[12 * 4 + 7] == h[8 * 4 + 7] && back[12 * 4 + 8] == 0.0f && back[8] == 0.0f);
    CHECK_CU(cudaMemcpy2D(d, 4, h, 32, 8, 2, cudaMemcpyHostToDevice), cudaErrorInvalidPitchValue);
    CHECK_CU(cudaMemcpy2D(d, 32, h, 4, 8, 2, cudaMemcpyHostToDevice), cudaErrorInvalidPitchValue);
    CHECK_CU(cudaMemcpy2D(d, 64, h, 32, 32, 5, cudaMemcpyHostToDevice), cudaErrorInvalidValue); /* 288 > 256 bytes */
    /* async forms, streams */
    cudaStream_t s = nullptr;
    CHECK_CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CU(cudaMemcpyAsync(d, h, sizeof h, cudaMemcpyHostToDevice, s), cudaSuccess);
    CHECK_CU(cudaMemsetAsync(d2, 0, sizeof h, s), cudaSuccess);
    CHECK_CU(cudaMemcpy2DAsync(d2, 8, d, 16, 8, 4, cudaMemcpyDeviceToDevice, s), cudaSuccess);
    CHECK_CU(cudaStreamSynchronize(s), cudaSuccess);
    CHECK_CU(cudaMemcpy(back, d2, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    CHECK(back[0] == 0.0f && back[1] == 1.0f && back[2] == 4.0f && back[7] == 13.0f && back[8] == 0.0f);
    CHECK_CU(cudaStreamDestroy(s), cudaSuccess);
    CHECK_CU(cudaMemcpyAsync(d, h, sizeof h, cudaMemcpyHostToDevice, s), cudaErrorInvalidResourceHandle);
    CHECK_CU(cudaStreamSynchronize(cudaStreamPerThread), cudaSuccess);
    /* memset */
    CHECK_CU(cudaMemset(d, 0xFF, 4), cudaSuccess);
    CHECK_CU(cudaMemset(back, 0, 4), cudaErrorInvalidValue);
    CHECK_CU(cudaMemset(d + 63, 0, 8), cudaErrorInvalidValue);
    /* attributes */
    cudaPointerAttributes at = {};
    CHECK_CU(cudaPointerGetAttributes(&at, d + 3), cudaSuccess);
    CHECK(at.type == cudaMemoryTypeDevice && at.devicePointer == d + 3 && !at.hostPointer && at.device == 0);
    CHECK_CU(cudaPointerGetAttributes(&at, pinned), cudaSuccess);
    CHECK(at.type == cudaMemoryTypeHost && at.hostPointer == pinned);
    CHECK_CU(cudaPointerGetAttributes(&at, back), cudaSuccess);
    CHECK(at.type == cudaMemoryTypeUnregistered && !at.devicePointer);
    /* frees */
    CHECK_CU(cudaFree(nullptr), cudaSuccess);
    CHECK_CU(cudaFree(back), cudaErrorInvalidValue);
    CHECK_CU(cudaFree(d + 1), cudaErrorInvalidValue);
    CHECK_CU(cudaFree(pinned), cudaErrorInvalidValue);
    CHECK_CU(cudaFreeHost(d), cudaErrorInvalidValue);
    CHECK_CU(cudaFree(d), cudaSuccess);
    CHECK_CU(cudaFree(d), cudaErrorInvalidValue);
    CHECK_CU(cudaFree(d2), cudaSuccess);
    CHECK_CU(cudaFreeHost(pinned), cudaSuccess);
    cudaGetLastError();
}

static void test_capacity(void) {
    void *a = nullptr, *b = (void *)1, *z = (void *)1;
    size_t fr = 0, total = 0;
    tfm_emu_set_device_memory(1 << 20);
    CHECK_CU(cudaMalloc(&a, 600 << 10), cudaSuccess);
    CHECK_CU(cudaMalloc(&b, 600 << 10), cudaErrorMemoryAllocation);
    CHECK(b == nullptr);
    CHECK_CU(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK_CU(cudaMalloc(&z, 0), cudaSuccess);
    CHECK(z == nullptr);
    CHECK(tfm_emu_bytes_in_use() == (600 << 10));
    CHECK_CU(cudaMemGetInfo(&fr, &total), cudaSuccess);
    CHECK(total == (1 << 20) && fr == (1 << 20) - (600 << 10));
    CHECK_CU(cudaFree(a), cudaSuccess);
    CHECK(tfm_emu_bytes_in_use() == 0);
    tfm_emu_set_device_memory((size_t)16 << 30);
}

/* ==== errors: fault injection, sticky errors, no device ==== */

static void test_faults(void) {
    void *a = nullptr, *b = nullptr, *c = nullptr;
    int *n = nullptr, h = 0, count = -1;
    tfm_emu_fail_next("cudaMalloc", cudaErrorMemoryAllocation, 1);
    CHECK_CU(cudaMalloc(&a, 16), cudaSuccess);
    CHECK_CU(cudaMalloc(&b, 16), cudaErrorMemoryAllocation);
    CHECK_CU(cudaMalloc(&b, 16), cudaSuccess);
    CHECK_CU(cudaGetLastError(), cudaErrorMemoryAllocation);
    tfm_emu_fail_next("cudaMemcpyAsync", cudaErrorInvalidValue, 0);
    CHECK_CU(cudaMemcpyAsync(a, b, 16, cudaMemcpyDeviceToDevice, 0), cudaErrorInvalidValue);
    tfm_emu_fail_next("cudaMemsetAsync", cudaErrorInvalidValue, 0);
    CHECK_CU(cudaMemsetAsync(a, 0, 16, 0), cudaErrorInvalidValue);
    tfm_emu_fail_next("cudaStreamSynchronize", cudaErrorLaunchOutOfResources, 0);
    CHECK_CU(cudaStreamSynchronize(0), cudaErrorLaunchOutOfResources);
    CHECK_CU(cudaGetLastError(), cudaErrorLaunchOutOfResources);
    CHECK_CU(cudaGetLastError(), cudaSuccess);
    tfm_emu_fail_next("cudaGetDeviceCount", cudaErrorInsufficientDriver, 0);
    CHECK_CU(cudaGetDeviceCount(&count), cudaErrorInsufficientDriver);
    CHECK(count == 0);
    tfm_emu_fail_next("cudaDeviceSynchronize", cudaErrorUnknown, 2);
    CHECK(tfm_emu_fail_pending() == 1);
    tfm_emu_fail_clear();
    CHECK(tfm_emu_fail_pending() == 0);
    for (int i = 0; i < 4; i++) CHECK_CU(cudaDeviceSynchronize(), cudaSuccess);
    cudaGetLastError();
    /* a failed launch: does not run; non-sticky */
    CHECK_CU(cudaMalloc(&n, sizeof(int)), cudaSuccess);
    cudaMemset(n, 0, sizeof(int));
    tfm_emu_fail_next("launch", cudaErrorLaunchOutOfResources, 1);
    TFM__LAUNCH(k_count, 1, 1, 0, n);
    TFM__LAUNCH(k_count, 1, 1, 0, n);
    CHECK_CU(cudaGetLastError(), cudaErrorLaunchOutOfResources);
    CHECK_CU(cudaMemcpy(&h, n, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    CHECK(h == 1);
    /* a sticky fault: everything fails until tfm_emu_reset; frees still free */
    tfm_emu_fail_next("launch", cudaErrorIllegalAddress, 0);
    TFM__LAUNCH(k_count, 1, 1, 0, n);
    CHECK_CU(cudaGetLastError(), cudaErrorIllegalAddress);
    CHECK_CU(cudaGetLastError(), cudaErrorIllegalAddress);
    CHECK_CU(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
    CHECK_CU(cudaMalloc(&c, 16), cudaErrorIllegalAddress);
    TFM__LAUNCH(k_count, 1, 1, 0, n);
    CHECK(tfm_emu_launches() > 0);
    CHECK_CU(cudaFree(a), cudaErrorIllegalAddress);
    CHECK(tfm_emu_bytes_in_use() == 16 + sizeof(int));
    CHECK(strcmp(cudaGetErrorString(cudaErrorIllegalAddress), "an illegal memory access was encountered") == 0);
    CHECK(strcmp(cudaGetErrorName(cudaErrorIllegalAddress), "cudaErrorIllegalAddress") == 0);
    tfm_emu_reset();
    CHECK_CU(cudaGetLastError(), cudaSuccess);
    CHECK_CU(cudaMemcpy(&h, n, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    CHECK(h == 1); /* neither launch under the sticky error ran */
    /* no device */
    tfm_emu_set_device_count(0);
    cublasHandle_t hb = nullptr;
    CHECK_CU(cudaGetDeviceCount(&count), cudaErrorNoDevice);
    CHECK(count == 0);
    CHECK_CU(cudaMalloc(&c, 16), cudaErrorNoDevice);
    CHECK_CU(cudaGetLastError(), cudaErrorNoDevice);
    CHECK_CU(cublasCreate(&hb), CUBLAS_STATUS_NOT_INITIALIZED);
    CHECK(strcmp(cudaGetErrorString(cudaErrorNoDevice), "no CUDA-capable device is detected") == 0);
    tfm_emu_set_device_count(1);
    CHECK_CU(cudaGetDeviceCount(&count), cudaSuccess);
    CHECK(count == 1);
    cudaFree(b);
    cudaFree(n);
}

/* ==== devices, streams, events ==== */

static void test_device_and_events(void) {
    cudaDeviceProp p;
    int v = 0, dev = -1;
    CHECK_CU(cudaGetDeviceProperties(&p, 0), cudaSuccess);
    CHECK(strcmp(p.name, "CPU emulation of CUDA") == 0 && p.major == 9 && p.minor == 0 && p.warpSize == 32);
    CHECK(p.sharedMemPerBlock == 48 * 1024 && p.maxThreadsPerBlock == 1024 && p.totalGlobalMem == (size_t)16 << 30);
    CHECK_CU(cudaDeviceGetAttribute(&v, cudaDevAttrWarpSize, 0), cudaSuccess);
    CHECK(v == 32);
    CHECK_CU(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0), cudaSuccess);
    CHECK(v == 227 * 1024);
    CHECK_CU(cudaDeviceGetAttribute(&v, (cudaDeviceAttr)12345, 0), cudaErrorInvalidValue);
    CHECK_CU(cudaSetDevice(1), cudaErrorInvalidDevice);
    tfm_emu_set_device_count(2);
    CHECK_CU(cudaSetDevice(1), cudaSuccess);
    CHECK_CU(cudaGetDevice(&dev), cudaSuccess);
    CHECK(dev == 1);
    tfm_emu_set_device_count(1);
    cudaEvent_t a = nullptr, b = nullptr, c = nullptr;
    float ms = -1.0f;
    CHECK_CU(cudaEventCreate(&a), cudaSuccess);
    CHECK_CU(cudaEventCreate(&b), cudaSuccess);
    CHECK_CU(cudaEventCreateWithFlags(&c, cudaEventDisableTiming), cudaSuccess);
    CHECK_CU(cudaEventElapsedTime(&ms, a, b), cudaErrorInvalidResourceHandle); /* not recorded */
    CHECK_CU(cudaEventRecord(a, 0), cudaSuccess);
    CHECK_CU(cudaEventRecord(b), cudaSuccess);
    CHECK_CU(cudaEventRecord(c), cudaSuccess);
    CHECK_CU(cudaEventSynchronize(b), cudaSuccess);
    CHECK_CU(cudaEventElapsedTime(&ms, a, b), cudaSuccess);
    CHECK(ms >= 0.0f);
    CHECK_CU(cudaEventElapsedTime(&ms, a, c), cudaErrorInvalidResourceHandle);
    CHECK_CU(cudaEventDestroy(a), cudaSuccess);
    CHECK_CU(cudaEventDestroy(b), cudaSuccess);
    CHECK_CU(cudaEventDestroy(c), cudaSuccess);
    CHECK_CU(cudaEventDestroy(c), cudaErrorInvalidResourceHandle);
    cudaGetLastError();
}

/* A non-blocking stream's work runs when something waits for it (as late as a GPU may run it), or with
   tfm_emu_set_streams_eager(1) at the call (as early). k_reverse reverses x in place, so running it twice
   gives x back: the order and the count show. */
static void test_stream_order(void) {
    float h[4] = {1, 2, 3, 4}, back[4], *d = nullptr;
    cudaStream_t s = nullptr;
    cudaEvent_t e1 = nullptr, e2 = nullptr;
    CHECK_CU(cudaMalloc((void **)&d, sizeof h), cudaSuccess);
    CHECK_CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CU(cudaEventCreateWithFlags(&e1, cudaEventDisableTiming), cudaSuccess);
    CHECK_CU(cudaEventCreateWithFlags(&e2, cudaEventDisableTiming), cudaSuccess);
    CHECK_CU(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice), cudaSuccess);
    for (int eager = 0; eager < 2; eager++) {
        tfm_emu_set_streams_eager(eager);
        unsigned long long k0 = tfm_emu_launches();
        tfm_emu_launch(k_reverse, s, 1, 4, 4 * sizeof(float), d, 4);
        CHECK_CU(cudaEventRecord(e1, s), cudaSuccess);
        tfm_emu_launch(k_reverse, s, 1, 4, 4 * sizeof(float), d, 4);
        CHECK_CU(cudaEventRecord(e2, s), cudaSuccess);
        CHECK(tfm_emu_launches() - k0 == (eager ? 2u : 0u)); /* queued, or run */
        CHECK_CU(cudaMemcpy(back, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess); /* does not wait for s */
        CHECK(back[0] == 1.0f); /* both reversals, or none */
        CHECK_CU(cudaStreamWaitEvent(0, e1, 0), cudaSuccess); /* the legacy stream waits for the first */
        CHECK(tfm_emu_launches() - k0 == (eager ? 2u : 1u));
        CHECK_CU(cudaMemcpy(back, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
        CHECK(back[0] == (eager ? 1.0f : 4.0f));
        CHECK_CU(cudaEventSynchronize(e2), cudaSuccess);
        CHECK(tfm_emu_launches() - k0 == 2u);
        CHECK_CU(cudaMemcpy(back, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
        CHECK(back[0] == 1.0f && back[3] == 4.0f);
        /* queued work runs at cudaStreamSynchronize, at cudaDeviceSynchronize and before a free */
        tfm_emu_launch(k_reverse, s, 1, 4, 4 * sizeof(float), d, 4);
        CHECK_CU(cudaStreamSynchronize(s), cudaSuccess);
        tfm_emu_launch(k_reverse, s, 1, 4, 4 * sizeof(float), d, 4);
        CHECK_CU(cudaDeviceSynchronize(), cudaSuccess);
        CHECK(tfm_emu_launches() - k0 == 4u);
    }
    tfm_emu_set_streams_eager(0);
    { /* a graph launched on s runs after s's queued work */
        cudaStream_t c = nullptr;
        cudaGraph_t g = nullptr;
        cudaGraphExec_t x = nullptr;
        CHECK_CU(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking), cudaSuccess);
        CHECK_CU(cudaStreamBeginCapture(c, cudaStreamCaptureModeThreadLocal), cudaSuccess);
        tfm_emu_launch(k_reverse, c, 1, 4, 4 * sizeof(float), d, 4);
        CHECK_CU(cudaStreamEndCapture(c, &g), cudaSuccess);
        CHECK_CU(cudaGraphInstantiate(&x, g, 0), cudaSuccess);
        unsigned long long k0 = tfm_emu_launches();
        tfm_emu_launch(k_reverse, s, 1, 4, 4 * sizeof(float), d, 4);
        CHECK_CU(cudaGraphLaunch(x, s), cudaSuccess);
        CHECK(tfm_emu_launches() - k0 == 2u);
        CHECK_CU(cudaMemcpy(back, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
        CHECK(back[0] == 1.0f && back[3] == 4.0f);
        CHECK_CU(cudaGraphExecDestroy(x), cudaSuccess);
        CHECK_CU(cudaGraphDestroy(g), cudaSuccess);
        CHECK_CU(cudaStreamDestroy(c), cudaSuccess);
    }
    tfm_emu_launch(k_reverse, s, 1, 4, 4 * sizeof(float), d, 4);
    CHECK_CU(cudaFree(d), cudaSuccess); /* (after the kernel) */
    CHECK_CU(cudaEventDestroy(e1), cudaSuccess);
    CHECK_CU(cudaEventDestroy(e2), cudaSuccess);
    CHECK_CU(cudaStreamDestroy(s), cudaSuccess);
    cudaGetLastError();
}

/* ==== cuBLAS against a naive column-major product in double ==== */

static float randf(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}
/* C (m x n, ldc) = alpha op(A) op(B) + beta C, column-major, in double */
static void ref_gemm(int ta, int tb, int m, int n, int k, float alpha, const float *A, int lda, const float *B, int ldb,
                     float beta, const float *C, int ldc, double *out) {
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0.0;
            for (int p = 0; p < k; p++)
                s += (double)(ta ? A[p + (size_t)i * lda] : A[i + (size_t)p * lda]) *
                     (double)(tb ? B[j + (size_t)p * ldb] : B[p + (size_t)j * ldb]);
            out[i + (size_t)j * ldc] = alpha * s + (beta == 0.0f ? 0.0 : (double)beta * C[i + (size_t)j * ldc]);
        }
}
/* one product through cublasSgemm(StridedBatched when batch > 1); max relative error over C */
static double gemm_err(cublasHandle_t hb, int ta, int tb, int m, int n, int k, int pad, float alpha, float beta,
                       int batch, bool tf32_ref = false) {
    int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    int lda = ar + pad, ldb = br + pad, ldc = m + pad;
    size_t sa = (size_t)lda * ac + 3, sb = (size_t)ldb * bc + 5, sc = (size_t)ldc * n + 7;
    std::vector<float> A(sa * batch), B(sb * batch), C(sc * batch);
    std::vector<double> want(sc * batch, 0.0);
    uint32_t seed = 12345u + (unsigned)(m * 7 + n * 11 + k * 13);
    for (float &x : A) x = randf(&seed);
    for (float &x : B) x = randf(&seed);
    for (float &x : C) x = randf(&seed);
    std::vector<float> Ar = A, Br = B;
    if (tf32_ref) {
        for (float &x : Ar) x = tfm_emu__tf32(x);
        for (float &x : Br) x = tfm_emu__tf32(x);
    }
    for (int b = 0; b < batch; b++)
        ref_gemm(ta, tb, m, n, k, alpha, &Ar[b * sa], lda, &Br[b * sb], ldb, beta, &C[b * sc], ldc, &want[b * sc]);
    float *dA = to_device(A.data(), A.size()), *dB = to_device(B.data(), B.size()), *dC = to_device(C.data(), C.size());
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_C : CUBLAS_OP_N;
    cublasStatus_t st = batch == 1
                            ? cublasSgemm(hb, oa, ob, m, n, k, &alpha, dA, lda, dB, ldb, &beta, dC, ldc)
                            : cublasSgemmStridedBatched(hb, oa, ob, m, n, k, &alpha, dA, lda, (long long)sa, dB, ldb,
                                                        (long long)sb, &beta, dC, ldc, (long long)sc, batch);
    std::vector<float> got = to_host(dC, C.size());
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
    if (st != CUBLAS_STATUS_SUCCESS) return 1e30;
    double err = 0.0, scale = 1e-30;
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                size_t at = b * sc + i + (size_t)j * ldc;
                err = fmax(err, fabs(got[at] - want[at]));
                scale = fmax(scale, fabs(want[at]));
            }
    for (int b = 0; b < batch; b++) /* padding between columns and matrices stays untouched */
        for (size_t at = 0; at < sc; at++)
            if ((at % ldc >= (size_t)m || at >= (size_t)ldc * n) && got[b * sc + at] != C[b * sc + at]) err = 1e30;
    return err / scale;
}
static void test_cublas(void) {
    cublasHandle_t hb = nullptr;
    CHECK_CU(cublasCreate(&hb), CUBLAS_STATUS_SUCCESS);
    const int sizes[][3] = {{7, 5, 3}, {33, 17, 9}, {1, 1, 1}, {64, 48, 40}};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (const auto &s : sizes) {
                CHECK(gemm_err(hb, ta, tb, s[0], s[1], s[2], 0, 1.0f, 0.0f, 1) < 1e-5);
                CHECK(gemm_err(hb, ta, tb, s[0], s[1], s[2], 3, 0.75f, -0.5f, 1) < 1e-5);
                CHECK(gemm_err(hb, ta, tb, s[0], s[1], s[2], 2, -1.25f, 1.0f, 3) < 1e-5);
            }
    CHECK(gemm_err(hb, 0, 0, 5, 4, 0, 1, 1.0f, 2.0f, 1) < 1e-6); /* k == 0: C = beta C */
    /* beta 0 does not read C; alpha 0 reads neither A nor B */
    float nan = nanf(""), one = 1.0f, zero = 0.0f, two = 2.0f, h[4] = {nan, nan, nan, nan}, hc[4] = {1, 2, 3, 4};
    float *dA = to_device(h, 4), *dC = to_device(h, 4);
    cudaMemcpy(dA, hc, sizeof hc, cudaMemcpyHostToDevice);
    CHECK_CU(cublasSgemm(hb, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, dA, 2, dA, 2, &zero, dC, 2),
             CUBLAS_STATUS_SUCCESS);
    std::vector<float> r = to_host(dC, 4);
    CHECK(r[0] == 7.0f && r[3] == 22.0f);
    cudaMemcpy(dA, h, sizeof h, cudaMemcpyHostToDevice);
    CHECK_CU(cublasSgemm(hb, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &zero, dA, 2, dA, 2, &two, dC, 2),
             CUBLAS_STATUS_SUCCESS);
    r = to_host(dC, 4);
    CHECK(r[0] == 14.0f && r[3] == 44.0f);
    /* argument checks */
    CHECK_CU(cublasSgemm(hb, CUBLAS_OP_N, CUBLAS_OP_N, -1, 2, 2, &one, dA, 2, dA, 2, &zero, dC, 2),
             CUBLAS_STATUS_INVALID_VALUE);
    CHECK_CU(cublasSgemm(hb, CUBLAS_OP_N, CUBLAS_OP_N, 3, 1, 1, &one, dA, 2, dA, 1, &zero, dC, 3),
             CUBLAS_STATUS_INVALID_VALUE);
    CHECK_CU(cublasSgemm(hb, CUBLAS_OP_N, CUBLAS_OP_T, 1, 3, 1, &one, dA, 1, dA, 2, &zero, dC, 1),
             CUBLAS_STATUS_INVALID_VALUE);
    CHECK_CU(cublasSgemm(hb, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, dA, 2, dA, 2, &zero, dC, 1),
             CUBLAS_STATUS_INVALID_VALUE);
    CHECK_CU(cublasSgemm(hb, (cublasOperation_t)5, CUBLAS_OP_N, 2, 2, 2, &one, dA, 2, dA, 2, &zero, dC, 2),
             CUBLAS_STATUS_INVALID_VALUE);
    CHECK_CU(cublasSgemm(hb, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, nullptr, dA, 2, dA, 2, &zero, dC, 2),
             CUBLAS_STATUS_INVALID_VALUE);
    CHECK_CU(
        cublasSgemmStridedBatched(hb, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, dA, 2, 0, dA, 2, 0, &zero, dC, 2, 4, -1),
        CUBLAS_STATUS_INVALID_VALUE);
    tfm_emu_fail_next("cublasSgemm", CUBLAS_STATUS_EXECUTION_FAILED, 0);
    CHECK_CU(cublasSgemm(hb, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, dA, 2, dA, 2, &zero, dC, 2),
             CUBLAS_STATUS_EXECUTION_FAILED);
    tfm_emu_fail_next("cublasSgemmStridedBatched", CUBLAS_STATUS_INTERNAL_ERROR, 0);
    CHECK_CU(
        cublasSgemmStridedBatched(hb, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, dA, 2, 0, dA, 2, 0, &zero, dC, 2, 4, 1),
        CUBLAS_STATUS_INTERNAL_ERROR);
    cudaFree(dA);
    cudaFree(dC);
    /* TF32: the switch rounds the inputs to 10 mantissa bits */
    cublasMath_t mode = CUBLAS_DEFAULT_MATH;
    CHECK_CU(cublasSetMathMode(hb, CUBLAS_TF32_TENSOR_OP_MATH), CUBLAS_STATUS_SUCCESS);
    CHECK_CU(cublasGetMathMode(hb, &mode), CUBLAS_STATUS_SUCCESS);
    CHECK(mode == CUBLAS_TF32_TENSOR_OP_MATH);
    CHECK(gemm_err(hb, 0, 1, 33, 17, 64, 1, 1.0f, 0.0f, 1, true) < 1e-5);
    CHECK(gemm_err(hb, 0, 1, 33, 17, 64, 1, 1.0f, 0.0f, 1, false) > 1e-5);
    CHECK_CU(cublasSetMathMode(hb, CUBLAS_DEFAULT_MATH), CUBLAS_STATUS_SUCCESS);
    CHECK(tfm_emu__tf32(1.0f + 1.0f / 2048) == 1.0f && tfm_emu__tf32(1.0f + 3.0f / 2048) == 1.0f + 2.0f / 1024);
    /* streams and names */
    cudaStream_t s = nullptr, got = cudaStreamLegacy;
    cudaStreamCreate(&s);
    CHECK_CU(cublasSetStream(hb, s), CUBLAS_STATUS_SUCCESS);
    CHECK_CU(cublasGetStream(hb, &got), CUBLAS_STATUS_SUCCESS);
    CHECK(got == s);
    cudaStreamDestroy(s);
    CHECK(strcmp(cublasGetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE") == 0);
    CHECK(strcmp(cublasGetStatusString(CUBLAS_STATUS_NOT_INITIALIZED), "the library was not initialized") == 0);
    CHECK_CU(cublasDestroy(hb), CUBLAS_STATUS_SUCCESS);
    CHECK_CU(cublasSgemm(hb, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, nullptr, 1, nullptr, 1, &zero, nullptr, 1),
             CUBLAS_STATUS_NOT_INITIALIZED);
    tfm_emu_fail_next("cublasCreate", CUBLAS_STATUS_ALLOC_FAILED, 0);
    CHECK_CU(cublasCreate(&hb), CUBLAS_STATUS_ALLOC_FAILED);
}

static float host_matrix[64];
static void child_cublas_host(void) {
    cublasHandle_t hb = nullptr;
    float one = 1.0f, *d = (float *)dev_ints();
    cublasCreate(&hb);
    cublasSgemm(hb, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, d, 4, host_matrix, 4, &one, d, 4);
}
static void child_cublas_past_end(void) {
    cublasHandle_t hb = nullptr;
    float one = 1.0f, *d = (float *)dev_ints(); /* 64 floats */
    cublasCreate(&hb);
    cublasSgemm(hb, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, d, 8, d, 9, &one, d, 8);
}
static void test_cublas_aborts(void) {
    CHECK(dies_with(child_cublas_host, "cublasSgemm: B = ", "not device memory"));
    CHECK(dies_with(child_cublas_past_end, "cublasSgemm: B = ", "runs past the end"));
}

/* ==== warp matrix products (nvcuda::wmma) against a host reference in double ==== */

namespace wmma = nvcuda::wmma;
/* float -> bf16 bits, to nearest even (finite values) */
static uint16_t to_bf16(float x) {
    uint32_t u = bits(x);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static double from_bf16(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}
enum { WM_LDH = 24, WM_LDF = 20, WM_AB = 16 * WM_LDH, WM_CD = 16 * WM_LDF }; /* strides: 48 and 80 bytes */

/* Warp w: D_w = A_w B_w + C_w, A_w and B_w 16 x 16 bf16 tiles (layouts LA, LB, row stride WM_LDH) copied by the
   block to shared memory, C_w and D_w fp32 in device memory (stride WM_LDF, layouts lc and ld). mode 0: d is a
   fragment of its own; 1: d is c; 2: c = fill_fragment(0.75), d its own. */
template <class LA, class LB>
static __global__ void k_wmma(const uint16_t *A, const uint16_t *B, const float *C, float *D, int lc, int ld, int mode) {
    TFM__SHARED(uint16_t, sa, 2 * WM_AB);
    TFM__SHARED(uint16_t, sb, 2 * WM_AB);
    int t = (int)threadIdx.x, w = t / 32;
    for (int x = t; x < (int)blockDim.x / 32 * WM_AB; x += (int)blockDim.x) sa[x] = A[x], sb[x] = B[x];
    __syncthreads();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, LA> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, LB> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c, d;
    wmma::load_matrix_sync(a, (const __nv_bfloat16 *)(sa + w * WM_AB), WM_LDH);
    wmma::load_matrix_sync(b, (const __nv_bfloat16 *)(sb + w * WM_AB), WM_LDH);
    if (mode == 2) wmma::fill_fragment(c, 0.75f);
    else wmma::load_matrix_sync(c, C + w * WM_CD, WM_LDF, (wmma::layout_t)lc);
    if (mode == 1) {
        wmma::mma_sync(c, a, b, c);
        wmma::store_matrix_sync(D + w * WM_CD, c, WM_LDF, (wmma::layout_t)ld);
    } else {
        wmma::mma_sync(d, a, b, c);
        wmma::store_matrix_sync(D + w * WM_CD, d, WM_LDF, (wmma::layout_t)ld);
    }
}
typedef void (*wmma_kernel)(const uint16_t *, const uint16_t *, const float *, float *, int, int, int);
static const wmma_kernel wmma_kernels[4] = {k_wmma<wmma::row_major, wmma::row_major>, k_wmma<wmma::row_major, wmma::col_major>,
                                            k_wmma<wmma::col_major, wmma::row_major>, k_wmma<wmma::col_major, wmma::col_major>};
/* element (r, c) of a 16 x 16 tile with stride ld, column-major or not */
static size_t at_rc(int r, int c, int ld, int col) { return col ? (size_t)c * ld + r : (size_t)r * ld + c; }

/* Every layout of A, B, C and D, with one warp and with two (each its own tiles); d its own fragment, d = c,
   and c from fill_fragment. Each element of D is c + 16 products of bf16 values, exact in fp32 (8 + 8
   significant bits), summed in fp32: 16 roundings, so |D - exact| <= g16 (|c| + sum |a_ik b_kj|) with
   g16 = 16 u / (1 - 16 u), u = 2^-24 (Higham, Accuracy and Stability, (4.4)); the reference, summed in double,
   adds at most 16 u_d / (1 - 16 u_d) of the same, u_d = 2^-53. The columns between tiles stay untouched. */
static void test_wmma(void) {
    const double u = ldexp(1.0, -24), ud = ldexp(1.0, -53);
    const double bound = 16 * u / (1 - 16 * u) + 16 * ud / (1 - 16 * ud);
    uint32_t seed = 777u;
    int bad = 0, runs = 0;
    double worst = 0.0; /* the largest error as a share of its bound */
    uint16_t *dA = nullptr, *dB = nullptr;
    float *dC = nullptr, *dD = nullptr;
    cudaMalloc(&dA, 2 * WM_AB * sizeof(uint16_t));
    cudaMalloc(&dB, 2 * WM_AB * sizeof(uint16_t));
    cudaMalloc(&dC, 2 * WM_CD * sizeof(float));
    cudaMalloc(&dD, 2 * WM_CD * sizeof(float));
    for (int warps = 1; warps <= 2; warps++)
        for (int k = 0; k < 4; k++)
            for (int lc = 0; lc < 2; lc++)
                for (int ld = 0; ld < 2; ld++)
                    for (int mode = 0; mode < 3; mode++) {
                        int la = k >> 1, lb = k & 1;
                        std::vector<uint16_t> hA(2 * WM_AB, 0xFFFF), hB(2 * WM_AB, 0xFFFF); /* padding: NaN */
                        std::vector<float> hC(2 * WM_CD, nanf("")), hD(2 * WM_CD, nanf(""));
                        double a[2][16][16], b[2][16][16], c[2][16][16];
                        for (int w = 0; w < warps; w++)
                            for (int r = 0; r < 16; r++)
                                for (int q = 0; q < 16; q++) {
                                    uint16_t ha = to_bf16(2.0f * randf(&seed)), hb = to_bf16(2.0f * randf(&seed));
                                    float hc = 4.0f * randf(&seed);
                                    hA[w * WM_AB + at_rc(r, q, WM_LDH, la)] = ha;
                                    hB[w * WM_AB + at_rc(r, q, WM_LDH, lb)] = hb;
                                    hC[w * WM_CD + at_rc(r, q, WM_LDF, lc)] = hc;
                                    a[w][r][q] = from_bf16(ha);
                                    b[w][r][q] = from_bf16(hb);
                                    c[w][r][q] = mode == 2 ? 0.75 : hc;
                                }
                        cudaMemcpy(dA, hA.data(), hA.size() * sizeof(uint16_t), cudaMemcpyHostToDevice);
                        cudaMemcpy(dB, hB.data(), hB.size() * sizeof(uint16_t), cudaMemcpyHostToDevice);
                        cudaMemcpy(dC, hC.data(), hC.size() * sizeof(float), cudaMemcpyHostToDevice);
                        cudaMemcpy(dD, hD.data(), hD.size() * sizeof(float), cudaMemcpyHostToDevice);
                        TFM__LAUNCH(wmma_kernels[k], 1, 32 * warps, 0, dA, dB, dC, dD, lc, ld, mode);
                        CHECK_CU(cudaGetLastError(), cudaSuccess);
                        hD = to_host(dD, hD.size());
                        runs++;
                        for (int w = 0; w < 2; w++)
                            for (int r = 0; r < 16; r++)
                                for (int q = 0; q < 16; q++) {
                                    double want = c[w][r][q], mag = fabs(want);
                                    for (int j = 0; j < 16; j++) {
                                        want += a[w][r][j] * b[w][j][q];
                                        mag += fabs(a[w][r][j] * b[w][j][q]);
                                    }
                                    float got = hD[w * WM_CD + at_rc(r, q, WM_LDF, ld)];
                                    if (w >= warps) { /* no second warp: its tile stays untouched */
                                        bad += !isnan(got);
                                        continue;
                                    }
                                    double err = fabs((double)got - want);
                                    worst = fmax(worst, err / (bound * mag));
                                    if (!(err <= bound * mag) && bad++ < 5)
                                        printf("    warps %d layouts %d%d%d%d mode %d: D[%d][%d][%d] = %.9g, want %.17g\n",
                                               warps, la, lb, lc, ld, mode, w, r, q, (double)got, want);
                                }
                        for (int w = 0; w < 2; w++) /* the 4 padding columns (rows) of each tile */
                            for (int r = 0; r < 16; r++)
                                for (int q = 16; q < WM_LDF; q++) bad += !isnan(hD[w * WM_CD + (size_t)r * WM_LDF + q]);
                    }
    CHECK(bad == 0);
    CHECK(runs == 96);
    CHECK(worst > 0.0 && worst <= 1.0); /* some sums round: the bound is met, not vacuous */
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
    cudaFree(dD);
}

/* A load is one snapshot for the warp: lanes that overwrite its source right after do not change what the
   others load. A store is spread over the lanes: before a __syncwarp a lane finds some of the tile unwritten
   (out[256 + lane]: the elements it sees), after it all of it (out[0..255] = A I = A). */
static __global__ void k_wmma_visibility(const uint16_t *A, float *out) {
    TFM__SHARED(uint16_t, sa, 256);
    TFM__SHARED(uint16_t, sb, 256);
    TFM__SHARED(float, sc, 256);
    int lane = (int)threadIdx.x, e, seen = 0;
    for (e = lane; e < 256; e += 32) sa[e] = A[e], sb[e] = e / 16 == e % 16 ? 0x3f80 : 0; /* B = I */
    __syncwarp();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
    wmma::load_matrix_sync(a, (const __nv_bfloat16 *)sa, 16);
    wmma::load_matrix_sync(b, (const __nv_bfloat16 *)sb, 16);
    for (e = lane; e < 256; e += 32) sb[e] = 0x3f80; /* all ones: the loads above keep I */
    wmma::fill_fragment(c, 0.0f);
    wmma::mma_sync(c, a, b, c);
    wmma::store_matrix_sync(sc, c, 16, wmma::mem_row_major);
    for (e = 0; e < 256; e++) seen += !isnan(sc[e]); /* no __syncwarp yet */
    out[256 + lane] = (float)seen;
    __syncwarp();
    for (e = lane; e < 256; e += 32) out[e] = sc[e];
}
static void test_wmma_visibility(void) {
    uint16_t h[256];
    uint32_t seed = 99u;
    for (int e = 0; e < 256; e++) h[e] = to_bf16(randf(&seed));
    uint16_t *dA = nullptr;
    float *out = nullptr;
    cudaMalloc(&dA, sizeof h);
    cudaMalloc(&out, (256 + 32) * sizeof(float));
    cudaMemcpy(dA, h, sizeof h, cudaMemcpyHostToDevice);
    TFM__LAUNCH(k_wmma_visibility, 1, 32, 0, dA, out);
    CHECK_CU(cudaGetLastError(), cudaSuccess);
    std::vector<float> r = to_host(out, 256 + 32);
    int exact = 0;
    float lo = 256.0f, hi = 0.0f;
    for (int e = 0; e < 256; e++) exact += r[e] == (float)from_bf16(h[e]);
    for (int l = 0; l < 32; l++) lo = fmin(lo, r[256 + l]), hi = fmax(hi, r[256 + l]);
    CHECK(exact == 256);
    CHECK(lo < 256.0f && hi == 256.0f);
    cudaFree(dA);
    cudaFree(out);
}

/* What aborts; `which` picks the fault. kWmmaFill: the line of the fill_fragment that lane 3 skips. */
alignas(32) static uint16_t wmma_host_tile[256];
enum { kWmmaFill = __LINE__ + 15 };
static __global__ void k_wmma_bad(float *dst, int which) {
    TFM__SHARED(uint16_t, sa, 512);
    int lane = (int)threadIdx.x % 32;
    for (int e = (int)threadIdx.x; e < 512; e += (int)blockDim.x) sa[e] = 0;
    __syncthreads();
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    const __nv_bfloat16 *p = (const __nv_bfloat16 *)sa;
    if (which == 0) wmma::load_matrix_sync(a, p + 8, 16);                       /* 16 bytes off */
    if (which == 1) wmma::load_matrix_sync(a, p, 12);                           /* ldm not a multiple of 8 */
    if (which == 2) wmma::store_matrix_sync(dst, acc, 6, wmma::mem_row_major);  /* nor of 4 */
    if (which == 3) wmma::store_matrix_sync(dst, acc, 16, (wmma::layout_t)2);
    if (which == 4) wmma::load_matrix_sync(a, p, lane < 16 ? 16 : 24);          /* lanes disagree */
    if (which == 5) {
        if (lane != 3) wmma::fill_fragment(acc, 0.0f);                         /* kWmmaFill */
        wmma::store_matrix_sync(dst, acc, 16, wmma::mem_row_major);
    }
    if (which == 6) {
        if (lane == 7) return;
        wmma::fill_fragment(acc, 0.0f);
    }
    if (which == 7) wmma::load_matrix_sync(a, (const __nv_bfloat16 *)wmma_host_tile, 16);
    if (which == 8) wmma::store_matrix_sync(dst + 64, acc, 16, wmma::mem_col_major); /* 256 floats: 64 + 256 */
    if (which == 9) wmma::fill_fragment(acc, 0.0f);                             /* with 48 threads */
    if (which == 10) wmma::load_matrix_sync(a, p + 16 * 16, 17 * 16);           /* past the shared array */
    if (which == 11) {                                                          /* the same call, two sites */
        if (lane < 16) wmma::fill_fragment(acc, 0.0f);
        else wmma::fill_fragment(acc, 0.0f);
    }
}
static int wmma_case;
static void child_wmma(void) {
    float *d = nullptr;
    cudaMalloc(&d, 256 * sizeof(float));
    TFM__LAUNCH(k_wmma_bad, 1, wmma_case == 9 ? 48 : 32, 0, d, wmma_case);
}
static void test_wmma_aborts(void) {
    const char *want[12][2] = {
        {"load_matrix_sync: p = ", "is not 32-byte (256-bit) aligned"},
        {"load_matrix_sync: ldm = 12", "not a multiple of 8"},
        {"store_matrix_sync: ldm = 6", "not a multiple of 4"},
        {"store_matrix_sync: layout 2", "neither mem_row_major nor mem_col_major"},
        {"load_matrix_sync: the lanes of a warp pass different arguments", "ldm = 24"},
        {"divergent warp", "nvcuda::wmma::store_matrix_sync"},
        {"nvcuda::wmma::fill_fragment", "thread (7,0,0) of the warp has returned"},
        {"neither shared memory nor live device memory", "load_matrix_sync"},
        {"store_matrix_sync: the 16 x 16 tile", "runs past the end of its cudaMalloc block"},
        {"fill_fragment needs a whole warp", "leave warp 1 with 16"},
        {"load_matrix_sync: the 16 x 16 tile", "runs past the end of its shared array"},
        {"thread (16,0,0) waits at nvcuda::wmma::fill_fragment", "a wmma call is made by the whole warp at once"},
    };
    char site[64];
    snprintf(site, sizeof site, "nvcuda::wmma::fill_fragment at %s:%d", __FILE__, (int)kWmmaFill);
    for (wmma_case = 0; wmma_case < 12; wmma_case++) {
        bool ok = dies_with(child_wmma, "tfm_emu: kernel k_wmma_bad", want[wmma_case][0], want[wmma_case][1]);
        if (!ok) printf("    case %d\n", wmma_case);
        CHECK(ok);
    }
    wmma_case = 5; /* the skipped call's site is named */
    CHECK(dies_with(child_wmma, site));
}

/* ==== mma.sync m16n8k16 (tfm_emu_mma16816) ==== */

/* Each warp: D = C + A B + A B, two calls (the second's C the first's D), each lane's registers loaded from
   the warp's own A (16 x 16), B (16 x 8, row-major) and C (16 x 8) by the PTX ISA's layout, D stored so */
static __global__ void k_mma16816(const uint16_t *A, const uint16_t *B, const float *C, float *D) {
    int w = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const uint16_t *A_ = A + 256 * w, *B_ = B + 128 * w;
    const float *C_ = C + 128 * w;
    float *D_ = D + 128 * w;
    uint32_t a[4] = {0u, 0u, 0u, 0u}, b[2] = {0u, 0u};
    float d[4] = {C_[g * 8 + 2 * t], C_[g * 8 + 2 * t + 1], C_[(g + 8) * 8 + 2 * t], C_[(g + 8) * 8 + 2 * t + 1]};
    for (int h = 0; h < 2; h++) {
        a[0] |= (uint32_t)A_[g * 16 + 2 * t + h] << 16 * h;
        a[1] |= (uint32_t)A_[(g + 8) * 16 + 2 * t + h] << 16 * h;
        a[2] |= (uint32_t)A_[g * 16 + 2 * t + 8 + h] << 16 * h;
        a[3] |= (uint32_t)A_[(g + 8) * 16 + 2 * t + 8 + h] << 16 * h;
        b[0] |= (uint32_t)B_[(2 * t + h) * 8 + g] << 16 * h;
        b[1] |= (uint32_t)B_[(2 * t + 8 + h) * 8 + g] << 16 * h;
    }
    tfm_emu_mma16816(d, a, b, d);
    tfm_emu_mma16816(d, a, b, d);
    D_[g * 8 + 2 * t] = d[0], D_[g * 8 + 2 * t + 1] = d[1], D_[(g + 8) * 8 + 2 * t] = d[2], D_[(g + 8) * 8 + 2 * t + 1] = d[3];
}
/* Two warps, each with its own small integers (exact in bf16; every sum exact in fp32, so the reference in
   double must match to the bit), each element distinct so that one in the wrong lane or register shows. */
static void test_mma16816(void) {
    uint16_t hA[512], hB[256], *dA = nullptr, *dB = nullptr;
    float hC[256], hD[256], *dC = nullptr, *dD = nullptr;
    int bad = 0;
    for (int i = 0; i < 512; i++) hA[i] = tfm__bf16((float)((i * 7) % 23 - 11));
    for (int i = 0; i < 256; i++) hB[i] = tfm__bf16((float)((i * 5) % 19 - 9)), hC[i] = (float)(i * 3 - 300);
    CHECK_CU(cudaMalloc(&dA, sizeof hA), cudaSuccess);
    CHECK_CU(cudaMalloc(&dB, sizeof hB), cudaSuccess);
    CHECK_CU(cudaMalloc(&dC, sizeof hC), cudaSuccess);
    CHECK_CU(cudaMalloc(&dD, sizeof hD), cudaSuccess);
    cudaMemcpy(dA, hA, sizeof hA, cudaMemcpyHostToDevice);
    cudaMemcpy(dB, hB, sizeof hB, cudaMemcpyHostToDevice);
    cudaMemcpy(dC, hC, sizeof hC, cudaMemcpyHostToDevice);
    TFM__LAUNCH(k_mma16816, 1, 64, 0, (const uint16_t *)dA, (const uint16_t *)dB, (const float *)dC, dD);
    CHECK_CU(cudaDeviceSynchronize(), cudaSuccess);
    cudaMemcpy(hD, dD, sizeof hD, cudaMemcpyDeviceToHost);
    for (int w = 0; w < 2; w++)
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 8; j++) {
                double want = hC[128 * w + 8 * i + j];
                for (int k = 0; k < 16; k++)
                    want += 2.0 * tfm__bf16_value(hA[256 * w + 16 * i + k]) * tfm__bf16_value(hB[128 * w + 8 * k + j]);
                if ((double)hD[128 * w + 8 * i + j] != want && bad++ < 3)
                    printf("    warp %d D[%d][%d] = %g, want %g\n", w, i, j, (double)hD[128 * w + 8 * i + j], want);
            }
    CHECK(bad == 0);
    cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dD);
}
/* ldmatrix's x4 forms (tfm_emu_ldsm): four 8 x 8 matrices of distinct 16-bit values (256 i + 16 row + col)
   in shared memory, rows 24 elements apart and the matrices in the order 2, 0, 3, 1 there, so that a row
   read from another lane's address or the wrong matrix shows; each lane's registers, plain then .trans */
static __global__ void k_ldsm(uint32_t *out) {
    TFM__SHARED(uint16_t, sh, 4 * 8 * 24);
    int lane = (int)threadIdx.x, place[4] = {1, 3, 0, 2};
    uint32_t r[4];
    for (int x = lane; x < 4 * 8 * 8; x += 32) {
        int i = x / 64, row = x / 8 % 8, col = x % 8;
        sh[(place[i] * 8 + row) * 24 + col] = (uint16_t)(256 * i + 16 * row + col);
    }
    __syncthreads();
    for (int trans = 0; trans < 2; trans++) {
        tfm_emu_ldsm(r, sh + (place[lane >> 3] * 8 + (lane & 7)) * 24, trans);
        for (int i = 0; i < 4; i++) out[(trans * 32 + lane) * 4 + i] = r[i];
    }
}
/* Against the PTX ISA's layout: lane 4 g + t holds matrix i's row g, columns 2t and 2t + 1 (plain), or its
   rows 2t and 2t + 1 of column g (.trans), the lower one in the lower 16 bits */
static void test_ldsm(void) {
    uint32_t h[2 * 32 * 4], *d = nullptr;
    int bad = 0;
    CHECK_CU(cudaMalloc(&d, sizeof h), cudaSuccess);
    TFM__LAUNCH(k_ldsm, 1, 32, 0, d);
    CHECK_CU(cudaDeviceSynchronize(), cudaSuccess);
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    for (int trans = 0; trans < 2; trans++)
        for (int l = 0; l < 32; l++)
            for (int i = 0; i < 4; i++) {
                int g = l >> 2, t = l & 3;
                uint32_t lo = trans ? 256u * i + 16u * (2 * t) + g : 256u * i + 16u * g + 2 * t;
                uint32_t hi = trans ? lo + 16u : lo + 1u, want = lo | hi << 16, got = h[(trans * 32 + l) * 4 + i];
                if (got != want && bad++ < 3)
                    printf("    %s lane %d r[%d] = 0x%08x, want 0x%08x\n", trans ? ".trans" : "plain", l, i, got, want);
            }
    CHECK(bad == 0);
    cudaFree(d);
}
static __global__ void k_mma16816_bad(float *dst, int which) {
    uint32_t a[4] = {0u, 0u, 0u, 0u}, b[2] = {0u, 0u};
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (which == 0 && threadIdx.x >= 16) return; /* half the warp */
    if (which == 2) {                             /* ldmatrix: a row 8 bytes off */
        TFM__SHARED(uint16_t, sh, 512);
        tfm_emu_ldsm(a, sh + 16 * (threadIdx.x % 32) + (threadIdx.x == 5 ? 4 : 0), 1);
    }
    if (which == 3) { /* ldmatrix: lane 7 asks for the other form */
        TFM__SHARED(uint16_t, sh, 512);
        tfm_emu_ldsm(a, sh + 16 * (threadIdx.x % 32), threadIdx.x == 7);
    }
    tfm_emu_mma16816(d, a, b, d);
    dst[threadIdx.x % 32] = d[0];
}
static int mma16816_case;
static void child_mma16816(void) {
    float *d = nullptr;
    cudaMalloc(&d, 32 * sizeof(float));
    TFM__LAUNCH(k_mma16816_bad, 1, mma16816_case == 1 ? 48 : 32, 0, d, mma16816_case);
}
static void test_mma16816_aborts(void) {
    mma16816_case = 0;
    CHECK(dies_with(child_mma16816, "tfm_emu: kernel k_mma16816_bad", "mma.sync.aligned.m16n8k16", "has returned"));
    mma16816_case = 1;
    CHECK(dies_with(child_mma16816, "tfm_emu: kernel k_mma16816_bad", "needs a whole warp", "leave warp 1 with 16"));
    mma16816_case = 2;
    CHECK(dies_with(child_mma16816, "tfm_emu: kernel k_mma16816_bad", "ldmatrix: lane 5's row address",
                    "16-byte boundary"));
    mma16816_case = 3;
    CHECK(dies_with(child_mma16816, "tfm_emu: kernel k_mma16816_bad", "ldmatrix: lanes 0 and 7",
                    "different forms"));
}

/* ==== asynchronous copies (tfm_emu_cp_async16 and its groups) ==== */

/* 64 threads each copy 16 bytes of src into shared memory in two groups (its first 8 floats' halves); what
   each sees of its own copies before any wait, after waiting for all but the newest group and after waiting
   for all, and what thread 0 sees of thread 63's copies before and after the barrier that follows them */
static __global__ void k_cp_async(const float *src, float *seen) {
    TFM__SHARED(float, sh, 64 * 8);
    int i = (int)threadIdx.x;
    tfm_emu_cp_async16(sh + 8 * i, src + 8 * i);
    tfm_emu_cp_commit();
    tfm_emu_cp_async16(sh + 8 * i + 4, src + 8 * i + 4);
    tfm_emu_cp_commit();
    seen[5 * i] = sh[8 * i];                       /* NaN: not waited for */
    tfm_emu_cp_wait(1);
    seen[5 * i + 1] = sh[8 * i] + sh[8 * i + 4];   /* the first group's, + NaN */
    tfm_emu_cp_wait(0);
    seen[5 * i + 2] = sh[8 * i] + sh[8 * i + 4];
    if (i == 0) seen[5 * i + 3] = sh[8 * 63];      /* thread 63's, before the barrier: NaN (63 has not run yet) */
    __syncthreads();
    if (i == 0) seen[5 * i + 4] = sh[8 * 63];
}
static void test_cp_async(void) {
    float h[512], seen[320], *d_src = nullptr, *d_seen = nullptr;
    for (int i = 0; i < 512; i++) h[i] = (float)i;
    CHECK_CU(cudaMalloc(&d_src, sizeof h), cudaSuccess);
    CHECK_CU(cudaMalloc(&d_seen, sizeof seen), cudaSuccess);
    cudaMemcpy(d_src, h, sizeof h, cudaMemcpyHostToDevice);
    cudaMemset(d_seen, 0, sizeof seen);
    TFM__LAUNCH(k_cp_async, 1, 64, 0, (const float *)d_src, d_seen);
    CHECK_CU(cudaDeviceSynchronize(), cudaSuccess);
    cudaMemcpy(seen, d_seen, sizeof seen, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int i = 0; i < 64; i++)
        bad += !isnan(seen[5 * i]) + !isnan(seen[5 * i + 1]) + (seen[5 * i + 2] != (float)(16 * i + 4));
    CHECK(bad == 0);
    CHECK(isnan(seen[3]) && seen[4] == (float)(8 * 63));
    cudaFree(d_src), cudaFree(d_seen);
}
static __global__ void k_cp_async_bad(float *dev, int which) {
    TFM__SHARED(float, sh, 64);
    if (which == 0) tfm_emu_cp_async16(sh + 2, dev);      /* 8 bytes off */
    if (which == 1) tfm_emu_cp_async16(dev + 16, dev);    /* not shared memory */
    if (which == 2) tfm_emu_cp_async16(sh, dev);          /* never waited for */
    if (which == 3) {                                     /* waited for, but not its group: committed after */
        tfm_emu_cp_async16(sh, dev);
        tfm_emu_cp_wait(0);
        tfm_emu_cp_commit();
    }
}
static int cp_case;
static void child_cp_async(void) {
    float *d = nullptr;
    cudaMalloc(&d, 64 * sizeof(float));
    TFM__LAUNCH(k_cp_async_bad, 1, 1, 0, d, cp_case);
    cudaDeviceSynchronize();
}
static void test_cp_async_aborts(void) {
    const char *want[4] = {"16-byte aligned", "the destination shared memory", "never waited for", "never waited for"};
    for (cp_case = 0; cp_case < 4; cp_case++) {
        bool ok = dies_with(child_cp_async, "tfm_emu: kernel k_cp_async_bad", want[cp_case]);
        if (!ok) printf("    case %d\n", cp_case);
        CHECK(ok);
    }
}

/* ==== stream capture and graphs ==== */

static __global__ void k_axpy(float *y, const float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
static cudaStream_t capturing_stream;
static void child_legacy_in_capture(void) {
    float *d = (float *)dev_ints();
    cudaStreamBeginCapture(capturing_stream, cudaStreamCaptureModeThreadLocal);
    cudaMemsetAsync(d, 0, 16, 0);
}
/* A capture keeps its work (a copy from pinned memory, a kernel, a memset, a cuBLAS product) without running
   it; each launch of the graph runs it in order, reading host memory and device memory as they are then and
   alpha as it was at the capture; an update takes new arguments for the same operations and refuses others;
   allocating, waiting, a pageable copy and a graph launch inside a capture break it; legacy-stream work
   during one aborts. */
static void test_graphs(void) {
    cudaStream_t s = nullptr;
    cudaGraph_t g = nullptr, g2 = nullptr;
    cudaGraphExec_t x = nullptr;
    cudaGraphExecUpdateResultInfo info;
    cudaStreamCaptureStatus st;
    cublasHandle_t h = nullptr;
    float zero[8] = {0}, *y = to_device(zero, 8), *m = to_device(zero, 4), *pinned = nullptr, host[8], alpha = 2.0f, beta = 0.0f;
    void *p = nullptr;
    unsigned long long k0 = tfm_emu_launches();
    CHECK_CU(cudaMallocHost(&pinned, 8 * sizeof(float)), cudaSuccess);
    CHECK_CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    CHECK_CU(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    CHECK_CU(cublasSetStream(h, s), CUBLAS_STATUS_SUCCESS);
    CHECK_CU(cudaStreamBeginCapture(0, cudaStreamCaptureModeThreadLocal), cudaErrorStreamCaptureUnsupported);
    for (int i = 0; i < 8; i++) pinned[i] = (float)(i + 1);
    CHECK_CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    CHECK_CU(cudaStreamIsCapturing(s, &st), cudaSuccess);
    CHECK(st == cudaStreamCaptureStatusActive);
    CHECK_CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaErrorIllegalState);
    CHECK_CU(cudaGetLastError(), cudaErrorIllegalState);
    CHECK_CU(cudaMemsetAsync(y, 0, 8 * sizeof(float), s), cudaSuccess);
    CHECK_CU(cudaMemcpyAsync(y, pinned, 8 * sizeof(float), cudaMemcpyHostToDevice, s), cudaSuccess);
    tfm_emu_launch(k_axpy, s, 1, 8, 0, y, y, 1.0f, 8); /* y = 2 * pinned */
    /* m (2 x 2, column-major) = alpha * y[0:4] (2 x 2) * y[4:8] (2 x 2) */
    CHECK_CU(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &alpha, y, 2, y + 4, 2, &beta, m, 2), CUBLAS_STATUS_SUCCESS);
    alpha = 100.0f; /* read at the capture */
    CHECK(tfm_emu_launches() == k0 && y[0] == 0.0f); /* nothing ran: y is still the zeros it was given */
    CHECK_CU(cudaStreamEndCapture(s, &g), cudaSuccess);
    CHECK(g != nullptr);
    {
        size_t nodes = 0;
        cudaGraphNode_t handle[4];
        cudaGraph_t empty = nullptr;
        CHECK_CU(cudaGraphGetNodes(g, NULL, &nodes), cudaSuccess);
        CHECK(nodes == 4); /* the memset, the copy, the kernel, the product */
        CHECK_CU(cudaGraphGetNodes(g, handle, &nodes), cudaErrorInvalidValue); /* handles: not emulated */
        CHECK_CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
        CHECK_CU(cudaStreamEndCapture(s, &empty), cudaSuccess);
        CHECK_CU(cudaGraphGetNodes(empty, NULL, &nodes), cudaSuccess);
        CHECK(nodes == 0);
        CHECK_CU(cudaGraphDestroy(empty), cudaSuccess);
    }
    CHECK_CU(cudaGraphInstantiate(&x, g, 0), cudaSuccess);
    for (int round = 0; round < 2; round++) {
        CHECK_CU(cudaGraphLaunch(x, 0), cudaSuccess);
        memcpy(host, y, sizeof host);
        CHECK(host[0] == 2.0f * (float)(1 + round) && host[7] == 16.0f * (float)(1 + round));
        /* m = 2 [[y0 y2] [y1 y3]] [[y4 y6] [y5 y7]], column 0 row 0: 2 (y0 y4 + y2 y5) */
        CHECK(m[0] == 2.0f * (host[0] * host[4] + host[2] * host[5]));
        for (int i = 0; i < 8; i++) pinned[i] *= 2.0f; /* read again at the next launch */
    }
    CHECK(tfm_emu_graph_launches() >= 2);
    /* an update: the same operations with new arguments, then a graph of other operations */
    CHECK_CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    CHECK_CU(cudaMemsetAsync(m, 0, 4 * sizeof(float), s), cudaSuccess);
    CHECK_CU(cudaMemcpyAsync(y, pinned, 8 * sizeof(float), cudaMemcpyHostToDevice, s), cudaSuccess);
    tfm_emu_launch(k_axpy, s, 1, 8, 0, y, y, 0.0f, 8);
    CHECK_CU(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &alpha, y, 2, y + 4, 2, &beta, m, 2), CUBLAS_STATUS_SUCCESS);
    CHECK_CU(cudaStreamEndCapture(s, &g2), cudaSuccess);
    CHECK_CU(cudaGraphExecUpdate(x, g2, &info), cudaSuccess);
    CHECK(info.result == cudaGraphExecUpdateSuccess);
    CHECK_CU(cudaGraphLaunch(x, 0), cudaSuccess);
    CHECK(y[0] == pinned[0] && m[0] == 100.0f * (y[0] * y[4] + y[2] * y[5]));
    CHECK_CU(cudaGraphDestroy(g2), cudaSuccess);
    CHECK_CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    tfm_emu_launch(k_axpy, s, 1, 8, 0, y, y, 0.0f, 8);
    CHECK_CU(cudaMemsetAsync(m, 0, 4 * sizeof(float), s), cudaSuccess);
    CHECK_CU(cudaMemcpyAsync(y, pinned, 8 * sizeof(float), cudaMemcpyHostToDevice, s), cudaSuccess);
    CHECK_CU(cudaStreamEndCapture(s, &g2), cudaSuccess);
    CHECK_CU(cudaGraphExecUpdate(x, g2, &info), cudaErrorGraphExecUpdateFailure); /* 3 operations, not 4 */
    CHECK(info.result == cudaGraphExecUpdateErrorTopologyChanged);
    CHECK_CU(cudaGetLastError(), cudaErrorGraphExecUpdateFailure);
    CHECK_CU(cudaMemcpyAsync(y, pinned, 8 * sizeof(float), cudaMemcpyHostToDevice, s), cudaSuccess); /* not capturing */
    CHECK(y[0] == pinned[0]);
    CHECK_CU(cudaGraphDestroy(g2), cudaSuccess);
    /* calls that break a capture */
    for (int which = 0; which < 5; which++) {
        CHECK_CU(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
        if (which == 0) CHECK_CU(cudaMalloc(&p, 16), cudaErrorStreamCaptureUnsupported);
        if (which == 1) CHECK_CU(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
        if (which == 2) CHECK_CU(cudaMemcpy(host, y, 16, cudaMemcpyDeviceToHost), cudaErrorStreamCaptureUnsupported);
        if (which == 3) CHECK_CU(cudaMemcpyAsync(y, host, 16, cudaMemcpyHostToDevice, s), cudaErrorStreamCaptureUnsupported);
        if (which == 4) CHECK_CU(cudaGraphLaunch(x, s), cudaErrorStreamCaptureUnsupported);
        CHECK_CU(cudaStreamIsCapturing(s, &st), cudaSuccess);
        CHECK(st == cudaStreamCaptureStatusInvalidated);
        CHECK_CU(cudaStreamEndCapture(s, &g2), cudaErrorStreamCaptureInvalidated);
        CHECK(g2 == nullptr && p == nullptr);
        (void)cudaGetLastError();
    }
    CHECK_CU(cudaStreamEndCapture(s, &g2), cudaErrorIllegalState); /* none begun */
    (void)cudaGetLastError();
    capturing_stream = s;
    CHECK(dies_with(child_legacy_in_capture, "cudaMemsetAsync on the legacy stream while stream"));
    CHECK_CU(cudaGraphExecDestroy(x), cudaSuccess);
    CHECK_CU(cudaGraphDestroy(g), cudaSuccess);
    CHECK_CU(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
    CHECK_CU(cudaStreamDestroy(s), cudaSuccess);
    cudaFreeHost(pinned);
    cudaFree(y);
    cudaFree(m);
}

/* ==== Hopper's warpgroup products (tfm_emu_wgmma) ==== */

/* B[k][n] (16 x 24) in the dynamic shared memory by the PTX ISA's canonical layouts without swizzling, from
   byte `at`, with offsets of the test's own choosing (not those the header uses): K-major (trans 0) with LBO
   256 and SBO 384, N-major (trans 1) with LBO 1024 and SBO 160 */
static size_t wg_at(int trans, int k, int n) {
    return trans ? 2048 + (size_t)(n % 8) * 2 + (size_t)(n / 8) * 160 + (size_t)(k % 8) * 16 + (size_t)(k / 8) * 1024
                 : (size_t)(n % 8) * 16 + (size_t)(n / 8) * 384 + (size_t)(k % 8) * 2 + (size_t)(k / 8) * 256;
}
/* The warpgroup: D = C + A B + A B (two products on the same registers, the second chained on the first
   before any wait), A 64 x 16 in each lane's registers as mma.sync's m16n8k16 spreads 16 rows over a warp
   (warp w rows 16 w ..), or (a_smem) from shared memory, K-major from byte 4096 with LBO 1280 and SBO 160
   (tfm_emu_wgmma_ss), D in the same registers, 3 tiles of 8 columns; first[t] is what thread t read of
   its first register between the products and the wait (NaN: not yet there) */
static __global__ void k_wgmma(const uint16_t *A, const uint16_t *B, const float *C, float *D, float *first, int trans,
                               int a_smem) {
    unsigned char *sh = (unsigned char *)tfm_emu_dyn_shared();
    int tid = (int)threadIdx.x, lane = tid & 31, r = 16 * (tid >> 5) + (lane >> 2), t = lane & 3;
    uint32_t a[4] = {0u, 0u, 0u, 0u};
    float d[3][4];
    for (int x = tid; x < 16 * 24; x += 128) memcpy(sh + wg_at(trans, x / 24, x % 24), &B[x], 2);
    for (int x = tid; x < 64 * 16; x += 128) {
        int m = x / 16, k = x % 16;
        memcpy(sh + 4096 + (m % 8) * 16 + (m / 8) * 160 + (k % 8) * 2 + (k / 8) * 1280, &A[x], 2);
    }
    __syncthreads();
    for (int h = 0; h < 2; h++) {
        a[0] |= (uint32_t)A[r * 16 + 2 * t + h] << 16 * h;
        a[1] |= (uint32_t)A[(r + 8) * 16 + 2 * t + h] << 16 * h;
        a[2] |= (uint32_t)A[r * 16 + 2 * t + 8 + h] << 16 * h;
        a[3] |= (uint32_t)A[(r + 8) * 16 + 2 * t + 8 + h] << 16 * h;
    }
    for (int n = 0; n < 3; n++)
        for (int h = 0; h < 4; h++) d[n][h] = C[(r + 8 * (h >> 1)) * 24 + 8 * n + 2 * t + (h & 1)];
    uint64_t desc = (uint64_t)((trans ? 2048 : 0) >> 4) | (uint64_t)((trans ? 1024 : 256) >> 4) << 16 |
                    (uint64_t)((trans ? 160 : 384) >> 4) << 32;
    uint64_t da = (uint64_t)(4096 >> 4) | (uint64_t)(1280 >> 4) << 16 | (uint64_t)(160 >> 4) << 32;
    tfm_emu_wgmma_fence();
    if (a_smem) tfm_emu_wgmma_ss(&d[0][0], 24, da, desc, trans);
    else tfm_emu_wgmma(&d[0][0], 24, a, desc, trans);
    tfm_emu_wgmma(&d[0][0], 24, a, desc, trans);
    tfm_emu_wgmma_commit();
    first[tid] = d[0][0];
    tfm_emu_wgmma_wait();
    for (int n = 0; n < 3; n++)
        for (int h = 0; h < 4; h++) D[(r + 8 * (h >> 1)) * 24 + 8 * n + 2 * t + (h & 1)] = d[n][h];
}
static void test_wgmma(void) {
    uint16_t hA[64 * 16], hB[16 * 24], *dA = nullptr, *dB = nullptr;
    float hC[64 * 24], hD[64 * 24], hf[128], *dC = nullptr, *dD = nullptr, *df = nullptr;
    for (int i = 0; i < 64 * 16; i++) hA[i] = tfm__bf16((float)((i * 7) % 23 - 11));
    for (int i = 0; i < 16 * 24; i++) hB[i] = tfm__bf16((float)((i * 5) % 19 - 9));
    for (int i = 0; i < 64 * 24; i++) hC[i] = (float)(3 * i - 2000);
    CHECK_CU(cudaMalloc(&dA, sizeof hA), cudaSuccess);
    CHECK_CU(cudaMalloc(&dB, sizeof hB), cudaSuccess);
    CHECK_CU(cudaMalloc(&dC, sizeof hC), cudaSuccess);
    CHECK_CU(cudaMalloc(&dD, sizeof hD), cudaSuccess);
    CHECK_CU(cudaMalloc(&df, sizeof hf), cudaSuccess);
    cudaMemcpy(dA, hA, sizeof hA, cudaMemcpyHostToDevice);
    cudaMemcpy(dB, hB, sizeof hB, cudaMemcpyHostToDevice);
    cudaMemcpy(dC, hC, sizeof hC, cudaMemcpyHostToDevice);
    unsigned long long n0 = tfm_emu_wgmma_calls();
    for (int run = 0; run < 3; run++) {
        int trans = run & 1, bad = 0, early = 0;
        TFM__LAUNCH(k_wgmma, 1, 128, 8192, dA, dB, dC, dD, df, trans, run == 2);
        CHECK_CU(cudaDeviceSynchronize(), cudaSuccess);
        cudaMemcpy(hD, dD, sizeof hD, cudaMemcpyDeviceToHost);
        cudaMemcpy(hf, df, sizeof hf, cudaMemcpyDeviceToHost);
        for (int i = 0; i < 64; i++)
            for (int j = 0; j < 24; j++) {
                double want = hC[i * 24 + j];
                for (int k = 0; k < 16; k++) want += 2.0 * tfm__bf16_value(hA[i * 16 + k]) * tfm__bf16_value(hB[k * 24 + j]);
                if ((double)hD[i * 24 + j] != want && bad++ < 3)
                    printf("    run %d: D[%d][%d] = %g, want %g\n", run, i, j, (double)hD[i * 24 + j], want);
            }
        for (int x = 0; x < 128; x++) early += !std::isnan(hf[x]);
        CHECK(bad == 0);
        CHECK(early == 0); /* the registers are NaN until the wait */
    }
    CHECK(tfm_emu_wgmma_calls() == n0 + 6);
    cudaFree(dA), cudaFree(dB), cudaFree(dC), cudaFree(dD), cudaFree(df);
}
/* what aborts: a block of 64 threads; a thread returning with a product not waited for; thread 5 with another
   descriptor; a swizzled descriptor; B past the dynamic shared memory */
static __global__ void k_wgmma_bad(int which) {
    uint32_t a[4] = {0u, 0u, 0u, 0u};
    float d[2][4] = {};
    uint64_t desc = which == 2 && threadIdx.x == 5 ? 2 : which == 3 ? 1ull << 62 : which == 4 ? 60 : 0;
    (void)tfm_emu_dyn_shared();
    tfm_emu_wgmma(&d[0][0], 16, a, desc, 0);
    tfm_emu_wgmma_commit();
    if (which != 1) tfm_emu_wgmma_wait();
}
static int wgmma_case;
static void child_wgmma(void) { TFM__LAUNCH(k_wgmma_bad, 1, wgmma_case == 0 ? 64 : 128, 1024, wgmma_case); }
static void test_wgmma_aborts(void) {
    static const char *const want[5][2] = {
        {"wgmma: the emulation runs warpgroup products in blocks of one warpgroup", "(64 threads, 64 live)"},
        {"returned with a warpgroup product (wgmma) it never waited for", ""},
        {"wgmma: thread 5 asks for n = 16, trans 0, descriptor 0x0000000000000002", "the warpgroup's first"},
        {"wgmma: n = 16", "base offset and swizzle must be 0 here"},
        {"wgmma: B's element", "past the 1024 bytes of dynamic shared memory"},
    };
    for (wgmma_case = 0; wgmma_case < 5; wgmma_case++) {
        bool ok = dies_with(child_wgmma, "tfm_emu: kernel k_wgmma_bad", want[wgmma_case][0], want[wgmma_case][1]);
        if (!ok) printf("    case %d\n", wgmma_case);
        CHECK(ok);
    }
}

/* ==== compile-time odds and ends: conversions, templates, math ==== */

template <typename T, int N> static __global__ void k_scale(T *x, T s) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N) x[i] = max(x[i] * s, (T)0) + min(threadIdx.x, 3u) * 0 + rsqrtf(1.0f) - 1.0f;
}
static void test_kernel_arguments(void) {
    float h[5] = {1, -2, 3, -4, 5}, *d = to_device(h, 5);
    TFM__LAUNCH((k_scale<float, 5>), 2, 4, 0, d, 2); /* an int converts to the float parameter */
    std::vector<float> r = to_host(d, 5);
    CHECK(r[0] == 2.0f && r[1] == 0.0f && r[4] == 10.0f);
    TFM__LAUNCH((k_writes), 1, 4, 0, nullptr, nullptr, 0); /* NULL is fine */
    CHECK_CU(cudaGetLastError(), cudaSuccess);
    CHECK(__saturatef(nanf("")) == 0.0f && __float_as_int(1.0f) == 0x3f800000 && __int_as_float(0x40000000) == 2.0f);
    CHECK(max(2, 3.5f) == 3.5f && min(-1, 2u) == 2u); /* CUDA's usual conversions: -1 -> UINT_MAX */
    cudaFree(d);
}

int main(void) {
    run("reduce_barrier", test_reduce_barrier);
    run("warp_reduce", test_warp_reduce);
    run("shuffle_semantics", test_shuffle_semantics);
    run("shuffle_poison", test_shuffle_poison);
    run("dynamic_shared", test_dynamic_shared);
    run("shared_poison_and_sites", test_shared_poison_and_sites);
    run("atomics_and_votes", test_atomics_and_votes);
    run("grid_3d", test_grid_3d);
    run("launch_config", test_launch_config);
    run("aborts", test_aborts);
    run("cublas_aborts", test_cublas_aborts);
    run("wmma", test_wmma);
    run("wmma_visibility", test_wmma_visibility);
    run("wmma_aborts", test_wmma_aborts);
    run("mma16816", test_mma16816);
    run("ldsm", test_ldsm);
    run("mma16816_aborts", test_mma16816_aborts);
    run("cp_async", test_cp_async);
    run("cp_async_aborts", test_cp_async_aborts);
    run("wgmma", test_wgmma);
    run("wgmma_aborts", test_wgmma_aborts);
#ifdef TFM_EMU__ASAN
    run("asan_overruns", test_asan_overruns);
#endif
    run("memcpy", test_memcpy);
    run("capacity", test_capacity);
    run("faults", test_faults);
    run("device_and_events", test_device_and_events);
    run("stream_order", test_stream_order);
    run("cublas", test_cublas);
    run("kernel_arguments", test_kernel_arguments);
    run("graphs", test_graphs);
    printf("%d passed, %d failed\n", tests_passed, tests_failed);
    return tests_failed != 0;
}
