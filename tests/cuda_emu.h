/* tests/cuda_emu.h - a CPU emulation of the CUDA runtime and cuBLAS, for tests only (C++14 or later).

   It lets the kernels of transformer.h's >>impl-cuda section compile with g++ or clang++ and run on the
   CPU, so a machine without a GPU (CI) runs every kernel. Include it first, in one C++ file:

       #include "cuda_emu.h"               defines TFM_CUDA_EMULATION; declares tfm_sgemm
       #define TFM_IMPLEMENTATION          gives tfm_sgemm, which cublasSgemm computes with
       #define TFM_CUDA
       #include "../transformer.h"

       g++ -std=c++17 -x c++ -DTFM_CUDA -DTFM_CUDA_EMULATION -fopenmp -O1 -g tests/test_cuda.cu -lm

   HOW KERNELS RUN
   A launch (TFM__LAUNCH -> tfm_emu_launch) validates the configuration, checks the pointer arguments,
   then runs the blocks one after another (x fastest, then y, then z) on the calling thread. A block's
   threads are fibers (ucontext): thread 0 runs until it blocks (a barrier, a warp op) or returns, then
   the next thread of its warp, so a warp runs ahead of the others until all its threads wait at a
   __syncthreads (then the next warp runs): a missing barrier between warps shows. Blocks whose
   x + y + z is odd take the threads the other way round (the last first), so it shows whichever side of
   it the early warps are on. The order is fixed, so results are deterministic. A thread that starts
   after one that returned takes over its stack, so a kernel without barriers costs no switch per
   thread; each wait at a barrier or warp op costs one switch (on x86-64 a few registers saved and
   restored, tfm_emu__swap; elsewhere swapcontext, a system call). Each warp keeps a mask of its lanes
   in each state and, while all its waiting lanes wait at the same warp op, one of them to check a new
   arrival against. threadIdx, blockIdx,
   blockDim and gridDim are read-only references to the running thread's coordinates (a local of the
   same name shadows them, as with nvcc's built-ins); warpSize is 32. A warp is the threads tid/32 of
   the block, tid = x + y*bx + z*bx*by. The emulated device: compute capability 9.0, 4 SMs (so that
   grid-stride loops run several rounds), 48 KiB of shared memory per block, 227 KiB by opt-in.
   Warp matrix products (<mma.h>'s nvcuda::wmma, with <cuda_bf16.h>'s __nv_bfloat16 as a 2-byte type for
   pointers): fragment<matrix_a | matrix_b, 16, 16, 16, __nv_bfloat16, row_major | col_major>,
   fragment<accumulator, 16, 16, 16, float>, fill_fragment (accumulators), load_matrix_sync,
   store_matrix_sync and mma_sync, nothing else. Each is a warp op (macros, so that messages name the
   site) and every lane holds the whole 16 x 16 tile: the first lane past a load reads the tile for the
   warp (one snapshot, as a GPU's warp-wide load), the first past mma_sync computes D = A B + C for the
   warp in fp32 (bf16 products exact; for each element c + the 16 products in order of k), the others
   take the result; a store's elements are written spread over the lanes (lane l the 8 elements
   16 r + c with (13 (16 r + c) + 5) % 32 == l), so reading the tile back before a __syncwarp or
   __syncthreads finds most of it not yet written.
   The register-level tensor-core product mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (what the
   header's inline PTX runs on a GPU) is tfm_emu_mma16816(d, a, b, c): a warp op whose lanes each hold their
   registers of A, B, C by the PTX ISA's layout; the first lane past computes D for the warp from what
   every lane left (as mma_sync does) and each takes its own 4 elements, so a kernel that puts an element
   in the wrong lane or register gets a wrong sum, as on a GPU; ldmatrix's x4 forms likewise
   (tfm_emu_ldsm), and Hopper's warpgroup product (wgmma: tfm_emu_wgmma, over a block of 128 threads, its B
   read from shared memory through the descriptor as the PTX ISA lays it out; its registers NaN until the
   thread waits for it). Asynchronous copies to shared memory
   (cp.async: tfm_emu_cp_async16, _commit, _wait) are done as late as a GPU may do them (below).

   WHAT IT CHECKS (an abort prints "tfm_emu: ..." with the kernel, block and thread)
   - configuration: threads per block in [1,1024], block.x,y <= 1024, block.z <= 64, grid.x in
     [1,2^31-1], grid.y,z in [1,65535], dynamic shared memory <= 48 KiB or what cudaFuncSetAttribute
     allowed. A bad one does not run and sets cudaErrorInvalidConfiguration.
   - every pointer-typed kernel argument: non-NULL and not inside (or one past the end of) a live
     cudaMalloc block aborts, naming the argument and the address (a GPU would fault). A literal 0 or
     NULL passes for a pointer, as in a call.
   - __syncthreads: released when every thread that has not returned waits at one (returned threads
     count as arrived); threads waiting at different __syncthreads sites at once abort (divergence).
   - warp ops (__syncwarp, shuffles, __ballot/__any/__all_sync): released when every lane of the mask
     that exists and has not returned waits at one; lanes of one group waiting at different ops, masks
     or widths, or a lane of the mask waiting at a __syncthreads, abort. A lane missing from its own
     mask, or a width that is not a power of two in [1,32], aborts. A shuffle whose source lane does not
     exist, has returned or is outside the mask yields all bits 1 (NaN for floats, -1 for ints).
   - wmma calls and tfm_emu_mma16816: the whole warp (32 lanes; none may have returned) at the same call
     (site), wmma calls with the same pointer, ldm, layout or fill value, else it aborts naming the
     function, file and line, as do a
     pointer not 32-byte aligned, an ldm not a multiple of 16 bytes (8 bf16, 4 floats), a layout_t other
     than mem_row_major and mem_col_major, and a tile (15 ldm + 16 elements from p) not inside one shared
     array, the dynamic shared memory or one live cudaMalloc block. Fragments start as NaN bits; a lane
     whose operands at mma_sync or fragment at store_matrix_sync differ from the warp's first lane aborts.
   - shared memory: a TFM__SHARED array belongs to its declaration site (function and line), so all
     threads, in loops and helpers too, get the same array, as with __shared__. Each is an allocation of
     its exact size, 128-byte aligned (AddressSanitizer sees overruns), filled with 0xFF bytes (NaN) in
     every block; so is the dynamic region. Static shared memory over 48 KiB, or static + dynamic over
     the limit, aborts.
   - device memory: cudaMalloc blocks are malloc'd at their exact size (ASan sees overruns) and filled
     with 0xFF bytes, so a read of device memory nobody wrote shows up (a GPU gives no such guarantee
     either). Copies and memsets check the kind against the pointers and the ranges against the block.
     cuBLAS checks its arguments as cuBLAS does and aborts on a matrix not wholly in device memory.
   - no thread can go on while some have not returned: abort (deadlock).
   Under ASan the fiber switches are annotated (no false positives; stack overruns in kernels are found;
   with swapcontext, off x86-64, ASan prints one "doesn't fully support makecontext/swapcontext"
   warning); under valgrind the fiber stacks are registered when <valgrind/valgrind.h> is there.

   WHAT IT DOES NOT
   - no memory model: blocks run one at a time, so races between blocks, a missing __threadfence or a
     non-atomic update that a GPU would lose go unseen; atomics are plain read-modify-writes.
   - warp lanes do not run in lockstep: code that relies on implicit warp synchrony (no __syncwarp) is
     not modelled; __activemask() gives the lanes that have not returned.
   - wmma: only the 16 x 16 x 16 bf16 -> fp32 shapes above; no x[] / num_elements (the fragments' register
     layout is not modelled: a kernel must not depend on it, so uses of them do not compile here), no
     satf, no fill_fragment of bf16 fragments. The sums' order and rounding differ from a tensor core's
     (which may add in another order, or with wider or truncated intermediate sums), so tests compare with
     error bounds, not bits. A static shared array is 128-byte aligned here, but on a GPU only to its
     type: a tile in one needs __align__(32) there (or a 32-byte-aligned offset in the dynamic region).
   - a host pointer inside a struct argument, or an access outside what a pointer argument points at but
     inside its cudaMalloc block, is not caught. cudaMallocHost memory is not mapped for kernels: a
     pinned pointer as a kernel argument aborts.
   - template kernels must be named with their template arguments (nvcc would deduce them), in
     parentheses inside TFM__LAUNCH: TFM__LAUNCH((k<float, 4>), grid, block, 0, ...).
   - __CUDA_ARCH__ is not defined; no __constant__, textures, cooperative groups, device-side launches.
     Graphs only by stream capture (section "stream capture and graphs"): no graph built node by node,
     no graph inside a graph; cudaGraphGetNodes gives the count only (nodes NULL).
   - streams: the legacy stream and blocking streams run their work at the call. A non-blocking stream's
     work (kernels, copies, memsets, cuBLAS and NCCL calls) is queued and runs when something waits for it
     (cudaStreamWaitEvent or cudaEventSynchronize/Query on an event recorded after it, cudaStreamSynchronize
     or Query, cudaDeviceSynchronize, cudaFree, cudaStreamDestroy): as late as a GPU may run it, so work
     that reads its results without waiting reads them unwritten. tfm_emu_set_streams_eager(1) runs it at
     the call instead: as early as it may run, so work queued before its producer finished (a collective
     sent before the kernels that write its buffer) reads their inputs unfinished. The emulation does not
     know what a kernel writes, so it asks more than a GPU of an NCCL call on a non-blocking stream: the
     stream must wait (an event) for everything the legacy stream was given before the call, or it aborts.
   - one host thread at a time may call the runtime. A fiber stack is TFM_EMU_STACK bytes (default 64
     KiB, 256 KiB under ASan); overflowing it hits a guard page: SIGSEGV.

   ERRORS AND FAULT INJECTION
   Runtime calls return CUDA's codes and set the last error (cudaGetLastError returns and clears it,
   cudaPeekAtLastError returns it). tfm_emu_fail_next(api, code, skip) makes the (skip+1)-th next call
   of `api` fail with `code`: a runtime function's name ("cudaMalloc", "cudaMemcpyAsync", ...), "launch"
   (the kernel does not run, the last error is set; a captured kernel's launch fails when its graph runs) or a cuBLAS function's name (which returns the
   cublasStatus_t `code`). A sticky code (cudaErrorIllegalAddress 700, cudaErrorLaunchFailure 719, and
   214, 702, 710, 714-718) stays, as on a GPU: every later runtime call but cudaGetDeviceCount returns
   it, kernels do not run and cuBLAS products return CUBLAS_STATUS_EXECUTION_FAILED, until tfm_emu_reset()
   (which frees nothing and clears the last and the sticky error). cudaFree, cudaFreeHost and the destroy
   calls still release under a sticky error (and return it), so leak checks work after a fault.
   tfm_emu_set_device_count(0) makes the process look like a machine without a GPU.

   NCCL (with TFM_NCCL defined before this file is included; then the program is an MPI program, built
   with mpicxx): the calls transformer.h makes (ncclGetUniqueId, ncclCommInitRank, ncclReduceScatter,
   ncclAllGather, ncclBroadcast of fp32 sums, ncclGroupStart/End, ncclCommGetAsyncError, ncclCommDestroy,
   ncclCommAbort, ncclGetErrorString) served by MPI on the emulated device memory. Each collective runs at
   the call, or on a non-blocking stream when its stream's work runs (grouped ones one after another,
   which every rank issues in the same order), in place where
   NCCL allows it; a buffer not wholly inside one live cudaMalloc block aborts, as does a count past
   INT_MAX. ncclCommInitRank splits MPI_COMM_WORLD by the id: every process of the job must call it; each
   process counts as a GPU of its own (NCCL refuses two ranks on one GPU: ncclInvalidUsage). A
   call fails under a sticky CUDA error (ncclUnhandledCudaError) or by tfm_emu_fail_next with its name
   (ncclSystemError).

   STATE: everything the emulation keeps is in the one object tfm_emu__g (section "state"). */
#ifndef TFM_CUDA_EMU_H
#define TFM_CUDA_EMU_H

#ifndef __cplusplus
#error "cuda_emu.h is C++: compile the file that includes it with g++ -x c++ (C++14 or later)"
#endif
#ifndef TFM_CUDA_EMULATION
#define TFM_CUDA_EMULATION
#endif

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory> /* before __noinline__ is defined: libstdc++ spells __attribute__((__noinline__)) */
#include <set>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../transformer.h" /* tfm_sgemm's declaration, for cuBLAS */

#if defined(__SANITIZE_ADDRESS__)
#define TFM_EMU__ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TFM_EMU__ASAN 1
#endif
#endif
#ifdef TFM_EMU__ASAN
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h> /* fiber stacks are registered, so that memcheck follows the switches */
#endif
#endif
#ifndef VALGRIND_STACK_REGISTER
#define VALGRIND_STACK_REGISTER(lo, hi) 0
#endif

/* How fibers switch: on x86-64 (ELF, gcc or clang) tfm_emu__swap below, which saves and restores the
   callee-saved registers and the FPU control words on the fibers' stacks (swapcontext also sets the
   signal mask, a system call: most of an emulated barrier's cost, with or without ASan); elsewhere
   ucontext's swapcontext. A process with x86's user shadow stacks turned on (CET) would refuse
   tfm_emu__swap's return into another stack: build it with -DTFM_EMU__ASM=0 there. */
#ifndef TFM_EMU__ASM
#if defined(__x86_64__) && defined(__ELF__) && defined(__GNUC__)
#define TFM_EMU__ASM 1
#else
#define TFM_EMU__ASM 0
#endif
#endif

#ifndef TFM_EMU_STACK
#ifdef TFM_EMU__ASAN
#define TFM_EMU_STACK (256 * 1024)
#else
#define TFM_EMU_STACK (64 * 1024)
#endif
#endif

/* ==== qualifiers and built-in types ==== (no __shared__: use TFM__SHARED) */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
    dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

/* ==== error codes: CUDA's names, values and texts ==== */

#define TFM_EMU__ERRORS(X)                                                                            \
    X(cudaSuccess, 0, "no error")                                                                     \
    X(cudaErrorInvalidValue, 1, "invalid argument")                                                   \
    X(cudaErrorMemoryAllocation, 2, "out of memory")                                                  \
    X(cudaErrorInitializationError, 3, "initialization error")                                        \
    X(cudaErrorCudartUnloading, 4, "driver shutting down")                                            \
    X(cudaErrorInvalidConfiguration, 9, "invalid configuration argument")                             \
    X(cudaErrorInvalidPitchValue, 12, "invalid pitch argument")                                       \
    X(cudaErrorInvalidSymbol, 13, "invalid device symbol")                                            \
    X(cudaErrorInvalidDevicePointer, 17, "invalid device pointer")                                    \
    X(cudaErrorInvalidMemcpyDirection, 21, "invalid copy direction for memcpy")                       \
    X(cudaErrorInsufficientDriver, 35, "CUDA driver version is insufficient for CUDA runtime version") \
    X(cudaErrorInvalidDeviceFunction, 98, "invalid device function")                                  \
    X(cudaErrorNoDevice, 100, "no CUDA-capable device is detected")                                   \
    X(cudaErrorInvalidDevice, 101, "invalid device ordinal")                                          \
    X(cudaErrorECCUncorrectable, 214, "uncorrectable ECC error encountered")                          \
    X(cudaErrorInvalidResourceHandle, 400, "invalid resource handle")                                 \
    X(cudaErrorIllegalState, 401, "the operation cannot be performed in the present state")           \
    X(cudaErrorNotReady, 600, "device not ready")                                                     \
    X(cudaErrorIllegalAddress, 700, "an illegal memory access was encountered")                       \
    X(cudaErrorLaunchOutOfResources, 701, "too many resources requested for launch")                  \
    X(cudaErrorLaunchTimeout, 702, "the launch timed out and was terminated")                         \
    X(cudaErrorAssert, 710, "device-side assert triggered")                                           \
    X(cudaErrorHardwareStackError, 714, "hardware stack error")                                       \
    X(cudaErrorIllegalInstruction, 715, "an illegal instruction was encountered")                     \
    X(cudaErrorMisalignedAddress, 716, "misaligned address")                                          \
    X(cudaErrorInvalidAddressSpace, 717, "operation not supported on global/shared address space")    \
    X(cudaErrorInvalidPc, 718, "invalid program counter")                                             \
    X(cudaErrorLaunchFailure, 719, "unspecified launch failure")                                      \
    X(cudaErrorNotSupported, 801, "operation not supported")                                          \
    X(cudaErrorStreamCaptureUnsupported, 900, "operation not permitted when stream is capturing")     \
    X(cudaErrorStreamCaptureInvalidated, 901, "operation failed due to a previous error during capture") \
    X(cudaErrorStreamCaptureUnmatched, 903, "capture was not initiated in this stream")              \
    X(cudaErrorGraphExecUpdateFailure, 910, "the graph update was not performed because it included " \
                                            "changes which violated constraints specific to instantiated graph update") \
    X(cudaErrorUnknown, 999, "unknown error")

/* the tables' rows as enum values, and as the texts and names of a value e; enums have int underneath
   (here and below), so any value a caller passes is valid to read */
#define TFM_EMU__ENUM(name, value, text) name = value,
#define TFM_EMU__TEXT(name, value, text) if ((int)e == value) return text;
#define TFM_EMU__NAME(name, value, text) if ((int)e == value) return #name;
typedef enum cudaError : int { TFM_EMU__ERRORS(TFM_EMU__ENUM) } cudaError_t;
static inline const char *cudaGetErrorString(cudaError_t e) {
    TFM_EMU__ERRORS(TFM_EMU__TEXT)
    return "unrecognized error code";
}
static inline const char *cudaGetErrorName(cudaError_t e) {
    TFM_EMU__ERRORS(TFM_EMU__NAME)
    return "unrecognized error code";
}
/* errors after which the context is unusable on a GPU */
static inline bool tfm_emu__is_sticky(int e) {
    return e == 214 || e == 700 || e == 702 || e == 710 || (e >= 714 && e <= 719);
}

/* ==== runtime types and constants ==== */

typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
#define cudaStreamLegacy ((cudaStream_t)0x1)
#define cudaStreamPerThread ((cudaStream_t)0x2)
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventBlockingSync 0x01
#define cudaEventDisableTiming 0x02
#define cudaInvalidDeviceId ((int)-2)

enum cudaMemcpyKind : int {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4
};
enum cudaMemoryType : int {
    cudaMemoryTypeUnregistered = 0,
    cudaMemoryTypeHost = 1,
    cudaMemoryTypeDevice = 2,
    cudaMemoryTypeManaged = 3
};
struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;
    void *devicePointer;
    void *hostPointer;
};
enum cudaFuncAttribute : int {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9
};
enum cudaDeviceAttr : int {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxBlockDimX = 2,
    cudaDevAttrMaxBlockDimY = 3,
    cudaDevAttrMaxBlockDimZ = 4,
    cudaDevAttrMaxGridDimX = 5,
    cudaDevAttrMaxGridDimY = 6,
    cudaDevAttrMaxGridDimZ = 7,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrWarpSize = 10,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem, sharedMemPerBlock, sharedMemPerBlockOptin, sharedMemPerMultiprocessor, totalConstMem;
    int regsPerBlock, warpSize, maxThreadsPerBlock, maxThreadsDim[3], maxGridSize[3];
    int major, minor, multiProcessorCount, maxThreadsPerMultiProcessor, l2CacheSize, unifiedAddressing;
};

/* the emulated device */
#define TFM_EMU__SMEM_STATIC (48 * 1024)  /* static shared memory per block; default dynamic limit */
#define TFM_EMU__SMEM_OPTIN (227 * 1024)  /* what cudaFuncSetAttribute may allow */
#define TFM_EMU__SMS 4                    /* few SMs: grid-stride loops run several rounds */

/* ==== state ==== everything the emulation keeps, in one object */

enum { TFM_EMU__RUN, TFM_EMU__SYNC, TFM_EMU__WARP, TFM_EMU__DONE };               /* fiber states */
enum { TFM_EMU__B_SYNC, TFM_EMU__B_COUNT, TFM_EMU__B_AND, TFM_EMU__B_OR,            /* __syncthreads kinds, */
       TFM_EMU__B_WGMMA };                                                       /* and a warpgroup's wgmma */
enum { TFM_EMU__W_SYNC, TFM_EMU__W_IDX, TFM_EMU__W_UP, TFM_EMU__W_DOWN, TFM_EMU__W_XOR, /* warp ops */
       TFM_EMU__W_BALLOT, TFM_EMU__W_ANY, TFM_EMU__W_ALL,
       TFM_EMU__W_FILL, TFM_EMU__W_LOAD, TFM_EMU__W_STORE, TFM_EMU__W_MMA, /* from W_FILL: nvcuda::wmma */
       TFM_EMU__W_MMA16816, TFM_EMU__W_LDSM };                /* and mma.sync's m16n8k16, ldmatrix */
static const char *const tfm_emu__wname[] = {"__syncwarp", "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                                             "__shfl_xor_sync", "__ballot_sync", "__any_sync", "__all_sync",
                                             "nvcuda::wmma::fill_fragment", "nvcuda::wmma::load_matrix_sync",
                                             "nvcuda::wmma::store_matrix_sync", "nvcuda::wmma::mma_sync",
                                             "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
                                             "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"};

struct tfm_emu__fiber {   /* one thread of the running block */
    ucontext_t uc;        /* where it switched out, or its start (!TFM_EMU__ASM) */
    void *sp;             /* its saved stack pointer: where it switched out, or its start (TFM_EMU__ASM) */
    char *stack;          /* its own TFM_EMU_STACK bytes above a guard page, mapped at first use, kept */
    char *run_stack;      /* the stack it runs on: its own, or that of the thread it followed */
    bool started;
    int state;
    uint3 tid;
    const char *file;     /* where it waits (__syncthreads or a warp op) */
    int line, op, width;
    unsigned mask, arg;   /* warp op: mask; lane, delta or lane mask */
    uint64_t val, res;    /* the value it contributes, the value it gets back */
    uint64_t wa, wb;      /* wmma: the arguments the whole warp must pass alike (pointer or value; ldm, layout) */
    void *fake;           /* ASan's fake stack while switched out */
};
/* a warpgroup product (wgmma) of the running block: the call's site and operands (B read from shared memory
   by the first thread to arrive), each thread's registers of A and C, and D (computed by the first past) */
struct tfm_emu__wg_stage {
    int left;                      /* threads still to take D (0: the next thread past is the first) */
    const char *file;
    int line, n, trans, a_smem;
    uint64_t desc, desc_a;
    uint16_t b[16][256];           /* B, K 16 x N */
    uint16_t as[64][16];           /* A from shared memory (a_smem) */
    uint32_t a[128][4];
    float c[128][128], d[128][128];
};
/* a thread's wgmma whose D it has not waited for: its registers (d, n / 2 of them), their values then, and
   the commit group it belongs to */
struct tfm_emu__wg_pending { float *d; int n; unsigned group; float v[128]; };
struct tfm_emu__alloc { size_t size; bool pinned; };          /* cudaMalloc / cudaMallocHost block */
struct tfm_emu__cp { unsigned group; void *dst; const void *src; }; /* a cp.async of 16 bytes */
struct tfm_emu__fault { std::string api; int code, skip; };
struct tfm_emu__piece { const char *fn; int line; size_t bytes; void *p; };  /* a TFM__SHARED array */
struct tfm_emu__wmma_stage {  /* a warp's wmma call: what the first lane past it read or computed, for the rest */
    int left;                 /* lanes still to take it (0: the next lane past a wmma call is the first) */
    uint16_t a[256], b[256];  /* bf16 tiles: a load's, or mma_sync's operands */
    float c[256], d[256];     /* mma_sync's addend and result; an accumulator load's or store's tile */
    uint32_t ra[32][4], rb[32][2]; /* m16n8k16: each lane's registers of A and B, */
    float rc[32][4], rd[32][4];    /* of C, and of D (computed by the first lane past for the warp) */
    const void *rp[32];            /* ldmatrix: each lane's row address, */
    bool rt[32];                   /* its form (.trans or not), */
    uint32_t rl[32][4];            /* and each lane's registers (read by the first lane past) */
};
/* an operation captured into a graph or queued on a non-blocking stream: a kernel (fn: the kernel), a copy
   (mem: which sides are device memory), a memset, a cuBLAS call or an NCCL collective; run() does it as the
   call would have */
struct tfm_emu__node { int kind; uintptr_t fn; int mem; std::function<void()> run; };
/* a stream: its flags; a non-blocking one's queued work (nodes: q[done..] not yet run; base: nodes run and
   dropped before q[0]) and the legacy stream's work it waits for (after: tfm_emu__state::legacy_ops) */
struct CUstream_st {
    unsigned flags;
    std::vector<tfm_emu__node> q;
    size_t done = 0, base = 0;
    unsigned long long after = 0;
};
struct CUgraph_st { std::vector<tfm_emu__node> nodes; };
struct CUgraphExec_st { std::vector<tfm_emu__node> nodes; };
/* an event: recorded on the legacy stream after its first `ops` operations, or on a non-blocking stream
   `on` after its first `mark` nodes */
struct CUevent_st {
    unsigned flags;
    bool recorded;
    double ms;
    cudaStream_t on;
    size_t mark;
    unsigned long long ops;
};
struct cublasContext { cudaStream_t stream; int math; void *ws; size_t ws_bytes; };

struct tfm_emu__state {
    /* what threadIdx, blockIdx, blockDim, gridDim read */
    uint3 tid, bid;
    dim3 bdim, gdim;
    /* device, memory and errors */
    int ndev = 1, dev = 0;
    size_t capacity = (size_t)16 << 30, in_use = 0;
    int last = 0, sticky = 0;                         /* last error; sticky error (0: none) */
    unsigned long long launches = 0;                  /* kernels that ran */
    unsigned long long copies = 0;                    /* copies and memsets that ran (of at least one byte) */
    unsigned long long gemm_ex_bf16 = 0;              /* cublasGemmEx calls on bf16 operands */
    unsigned long long lt_bias = 0;                   /* cublasLtMatmul calls with the bias epilogue that ran */
    unsigned long long lt_bf16_out = 0;               /* cublasLtMatmul calls with a bf16 result that ran */
    unsigned long long wgmma = 0;                     /* warpgroup products (wgmma) that ran */
    std::vector<tfm_emu__fault> faults;
    std::map<uintptr_t, tfm_emu__alloc> allocs;       /* by base address */
    std::set<const void *> streams, events, handles;  /* live CUstream_st, CUevent_st, cublasContext,
                                                         cublasLtContext */
    std::set<const void *> graphs, execs;             /* live CUgraph_st, CUgraphExec_st */
    /* stream capture (one stream at a time): what it has queued, and whether an unsafe call broke it */
    cudaStream_t cap = nullptr;
    bool cap_bad = false, replaying = false;
    std::vector<tfm_emu__node> cap_nodes;
    unsigned long long graph_launches = 0;            /* cudaGraphLaunch calls that ran */
    std::vector<tfm_emu__node> *rec = nullptr;        /* where tfm_emu__record puts the next operation */
    unsigned long long legacy_ops = 0;                /* operations given to the legacy stream */
    bool eager = false;                               /* non-blocking streams run their work at the call */
    std::map<uintptr_t, int> dyn_limit;               /* kernel -> cudaFuncAttributeMaxDynamicSharedMemorySize */
    /* the running launch and block */
    bool in_kernel = false;
    const char *kernel = "";
    void (*invoke)(void *) = nullptr;                 /* runs the kernel with the launch's arguments */
    void *args = nullptr;
    tfm_emu__fiber *fibers = nullptr;                 /* 1024, allocated at the first launch; never move */
    int nthreads = 0, cur = -1, n_live = 0, n_sync = 0, sync_first = -1;
    unsigned lanes[4][32] = {};                       /* per warp, the lanes in each fiber state (tfm_emu__set) */
    int warp_rep[32] = {};                            /* per warp, a lane at a warp op all its waiting lanes wait at
                                                         alike (-1: they wait at different ones, or none waits) */
    int order = 1;                                    /* +1: threads run 0, 1, 2...; -1: from the last down */
    ucontext_t host;                                  /* the launching host thread, while a block runs */
    void *host_sp = nullptr;                          /* (the same with TFM_EMU__ASM) */
    bool from_host = false;                           /* the next fiber entered comes from it */
    void *host_fake = nullptr;                        /* ASan: its fake stack, its stack */
    const void *host_lo = nullptr;
    size_t host_size = 0;
    std::vector<tfm_emu__piece> pieces;               /* this block's static shared arrays */
    size_t static_bytes = 0, dyn_bytes = 0, smem_limit = 0;
    void *dyn = nullptr;                              /* this block's dynamic shared memory */
    tfm_emu__wmma_stage wmma[32];                     /* one per warp of the running block */
    std::vector<tfm_emu__cp> cp[1024];                /* per thread, its asynchronous copies not yet done */
    unsigned cp_groups[1024] = {};                    /* per thread, the groups of them it has committed */
    tfm_emu__wg_stage wg;                             /* the block's warpgroup product under way */
    std::vector<tfm_emu__wg_pending> wgp[128];        /* per thread, its wgmma results not yet waited for */
    unsigned wg_groups[128] = {};                     /* per thread, the wgmma groups it has committed */
    ~tfm_emu__state() {
        if (in_kernel) return; /* exit() from a kernel: the stacks stay, it runs on one */
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        for (int i = 0; fibers && i < 1024; i++)
            if (fibers[i].stack) munmap(fibers[i].stack - page, TFM_EMU_STACK + page);
        free(fibers);
    }
};
static tfm_emu__state tfm_emu__g;

/* the kernels' built-in variables */
static const uint3 &threadIdx __attribute__((unused)) = tfm_emu__g.tid;
static const uint3 &blockIdx __attribute__((unused)) = tfm_emu__g.bid;
static const dim3 &blockDim __attribute__((unused)) = tfm_emu__g.bdim;
static const dim3 &gridDim __attribute__((unused)) = tfm_emu__g.gdim;
static const int warpSize __attribute__((unused)) = 32;

__attribute__((format(printf, 1, 2), noreturn)) static inline void tfm_emu__fatal(const char *fmt, ...) {
    tfm_emu__state &g = tfm_emu__g;
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "tfm_emu: ");
    if (g.in_kernel) {
        fprintf(stderr, "kernel %s, block (%u,%u,%u)", g.kernel, g.bid.x, g.bid.y, g.bid.z);
        if (g.cur >= 0) fprintf(stderr, ", thread (%u,%u,%u)", g.tid.x, g.tid.y, g.tid.z);
        fprintf(stderr, ": ");
    }
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    abort();
}

/* ==== the emulation's own controls ==== */

/* Device memory that cudaMalloc may hand out in all (default 16 GiB). */
static inline void tfm_emu_set_device_memory(size_t bytes) { tfm_emu__g.capacity = bytes; }
/* Number of devices (default 1); 0: cudaGetDeviceCount and every other runtime call fail with
   cudaErrorNoDevice, cublasCreate with CUBLAS_STATUS_NOT_INITIALIZED. */
static inline void tfm_emu_set_device_count(int n) { tfm_emu__g.ndev = n < 0 ? 0 : n; tfm_emu__g.dev = 0; }
/* 1: a non-blocking stream's work runs at the call; 0 (the default): when something waits for it (see the
   top: streams). */
static inline void tfm_emu_set_streams_eager(int eager) { tfm_emu__g.eager = eager != 0; }
/* Bytes of device memory allocated and not freed. */
static inline size_t tfm_emu_bytes_in_use(void) { return tfm_emu__g.in_use; }
/* cudaMallocHost blocks, streams, events and cuBLAS handles not yet freed or destroyed. */
static inline size_t tfm_emu_objects_in_use(void) {
    const tfm_emu__state &g = tfm_emu__g;
    size_t pinned = 0;
    for (const auto &a : g.allocs) pinned += a.second.pinned;
    return pinned + g.streams.size() + g.events.size() + g.handles.size() + g.graphs.size() + g.execs.size();
}
/* cudaGraphLaunch calls that ran their graph. */
static inline unsigned long long tfm_emu_graph_launches(void) { return tfm_emu__g.graph_launches; }
/* Kernels run so far (launches that failed are not counted). */
static inline unsigned long long tfm_emu_launches(void) { return tfm_emu__g.launches; }
/* Copies (cudaMemcpy*, host to device, device to host or device to device) and memsets so far, those of at
   least one byte that ran: with the launches, the operations a GPU would have queued but cuBLAS's */
static inline unsigned long long tfm_emu_copies(void) { return tfm_emu__g.copies; }
/* cublasGemmEx and cublasGemmStridedBatchedEx calls with bf16 operands so far */
static inline unsigned long long tfm_emu_gemm_bf16_calls(void) { return tfm_emu__g.gemm_ex_bf16; }
/* warpgroup products (wgmma, a warpgroup's one instruction) that ran so far */
static inline unsigned long long tfm_emu_wgmma_calls(void) { return tfm_emu__g.wgmma; }
/* cublasLtMatmul calls with the bias epilogue that ran so far (a graph's replays included) */
static inline unsigned long long tfm_emu_lt_bias_calls(void) { return tfm_emu__g.lt_bias; }
/* ... and those of them with a bf16 result (CUDA_R_16BF D) */
static inline unsigned long long tfm_emu_lt_bf16_out_calls(void) { return tfm_emu__g.lt_bf16_out; }
/* The (skip+1)-th next call of `api` fails with `code` (see the top). */
static inline void tfm_emu_fail_next(const char *api, int code, int skip) {
    tfm_emu__fault f;
    f.api = api ? api : "";
    f.code = code;
    f.skip = skip < 0 ? 0 : skip;
    tfm_emu__g.faults.push_back(f);
}
static inline void tfm_emu_fail_clear(void) { tfm_emu__g.faults.clear(); }
/* Faults armed and not yet reached. */
static inline size_t tfm_emu_fail_pending(void) { return tfm_emu__g.faults.size(); }
/* Clear the last and the sticky error. Frees nothing. */
static inline void tfm_emu_reset(void) { tfm_emu__g.last = tfm_emu__g.sticky = 0; }

/* ==== runtime bookkeeping: errors, faults, pointer classification ==== */

static inline cudaError_t tfm_emu__err(int e) {
    if (e) tfm_emu__g.last = e;
    if (tfm_emu__is_sticky(e)) tfm_emu__g.sticky = e;
    return (cudaError_t)e;
}
/* an injected fault for this call of `api`, or 0 */
static inline int tfm_emu__take_fault(const char *api) {
    std::vector<tfm_emu__fault> &fs = tfm_emu__g.faults;
    int code = 0;
    for (size_t i = 0; i < fs.size(); i++) {
        if (fs[i].api != api) continue;
        if (fs[i].skip > 0) {
            fs[i].skip--;
        } else if (!code) {
            code = fs[i].code;
            fs.erase(fs.begin() + (long)i--);
        }
    }
    return code;
}
/* the prologue of every runtime call: no device, an injected fault, a sticky error (release calls go
   on under a sticky error: they return it at the end) */
static inline cudaError_t tfm_emu__enter(const char *api, bool release = false) {
    if (tfm_emu__g.ndev == 0) return tfm_emu__err(cudaErrorNoDevice);
    if (int code = tfm_emu__take_fault(api)) return tfm_emu__err(code);
    if (!release && tfm_emu__g.sticky) return (cudaError_t)tfm_emu__g.sticky;
    return cudaSuccess;
}
static inline cudaError_t tfm_emu__done(void) { return (cudaError_t)tfm_emu__g.sticky; }

/* the live block containing [p, p+n) (n == 0: p may be one past its end), or NULL */
/* (only p's address is read: GCC 12, where these are called rather than inlined, would take a pointer to
   memory nobody wrote yet, the host side of a copy, for a read of it) */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define TFM_EMU__ADDRESS_ONLY __attribute__((access(none, 1)))
#else
#define TFM_EMU__ADDRESS_ONLY
#endif
TFM_EMU__ADDRESS_ONLY static inline const tfm_emu__alloc *tfm_emu__find(const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p;
    auto it = tfm_emu__g.allocs.upper_bound(a);
    if (!p || it == tfm_emu__g.allocs.begin()) return nullptr;
    --it;
    uintptr_t end = it->first + it->second.size;
    if (a > end || (n > 0 && (a == end || n > end - a))) return nullptr;
    return &it->second;
}
TFM_EMU__ADDRESS_ONLY static inline bool tfm_emu__is_device(const void *p) {
    const tfm_emu__alloc *a = tfm_emu__find(p, 1);
    return a && !a->pinned;
}
TFM_EMU__ADDRESS_ONLY static inline bool tfm_emu__device_range(const void *p, size_t n) {
    const tfm_emu__alloc *a = tfm_emu__find(p, n);
    return a && !a->pinned;
}
static inline bool tfm_emu__stream_ok(cudaStream_t s) {
    return !s || s == cudaStreamLegacy || s == cudaStreamPerThread || tfm_emu__g.streams.count(s);
}

static inline bool tfm_emu__legacy(cudaStream_t s) { return !s || s == cudaStreamLegacy || s == cudaStreamPerThread; }
/* Whether work given to s is to be kept (captured, or queued on a non-blocking stream: tfm_emu__record
   then puts it there), not run now. Work on the legacy stream while another stream captures aborts: on a
   GPU it would run at once, before the captured work it was meant to follow. */
static inline bool tfm_emu__recording(cudaStream_t s, const char *api) {
    tfm_emu__state &g = tfm_emu__g;
    if (g.replaying) return false;
    if (g.cap && s == g.cap) {
        g.rec = &g.cap_nodes;
        return true;
    }
    if (tfm_emu__legacy(s)) {
        if (g.cap)
            tfm_emu__fatal("%s on the legacy stream while stream %p captures: on a GPU it would run now, before the "
                           "captured work queued ahead of it", api, (void *)g.cap);
        g.legacy_ops++;
        return false;
    }
    if (g.eager || !(s->flags & cudaStreamNonBlocking)) return false;
    g.rec = &s->q;
    return true;
}
/* Run s's queued work up to its node `mark` (counted from its first ever; SIZE_MAX: all of it). */
static inline void tfm_emu__drain(cudaStream_t s, size_t mark) {
    tfm_emu__state &g = tfm_emu__g;
    if (tfm_emu__legacy(s) || !g.streams.count(s) || g.replaying) return;
    g.replaying = true;
    while (s->done < s->q.size() && s->base + s->done < mark) {
        std::function<void()> run = std::move(s->q[s->done++].run);
        run();
    }
    g.replaying = false;
    if (s->done == s->q.size()) {
        s->base += s->done;
        s->done = 0;
        s->q.clear();
    }
}
static inline void tfm_emu__drain_all(void) {
    for (const void *s : std::vector<const void *>(tfm_emu__g.streams.begin(), tfm_emu__g.streams.end()))
        tfm_emu__drain((cudaStream_t)s, SIZE_MAX);
}
/* A call that may not run while a stream captures (it allocates, frees or waits): it fails with
   cudaErrorStreamCaptureUnsupported and breaks the capture, as under cudaStreamCaptureModeThreadLocal. */
static inline cudaError_t tfm_emu__unsafe(void) {
    if (!tfm_emu__g.cap) return cudaSuccess;
    tfm_emu__g.cap_bad = true;
    return tfm_emu__err(cudaErrorStreamCaptureUnsupported);
}
static inline void tfm_emu__record(int kind, uintptr_t fn, int mem, std::function<void()> run) {
    tfm_emu__g.rec->push_back(tfm_emu__node{kind, fn, mem, std::move(run)});
}
/* a captured cuBLAS call: when the graph runs, call() on the live handle in the math mode it had at the capture */
static inline void tfm_emu__record_blas(const char *api, cublasContext *h, std::function<void()> call) {
    int math = h->math;
    tfm_emu__record(3, 0, 0, [api, h, math, call] {
        if (!tfm_emu__g.handles.count(h)) tfm_emu__fatal("a graph ran %s on a destroyed cuBLAS handle", api);
        int was = h->math;
        h->math = math;
        call();
        h->math = was;
    });
}

/* ==== fibers and the scheduler ==== */

#ifdef TFM_EMU__ASAN
#define TFM_EMU__SWITCH_START(save, lo, size) __sanitizer_start_switch_fiber(save, lo, size)
#define TFM_EMU__SWITCH_FINISH(save, lo, size) __sanitizer_finish_switch_fiber(save, lo, size)
#else
#define TFM_EMU__SWITCH_START(save, lo, size) ((void)(lo), (void)(size))
#define TFM_EMU__SWITCH_FINISH(save, lo, size) ((void)(save))
#endif

static inline void tfm_emu__describe(char *buf, size_t size, int i);
/* whether two lanes wait at the same warp op (the kind, the mask and the width) */
static inline bool tfm_emu__same_wait(const tfm_emu__fiber &a, const tfm_emu__fiber &b) {
    return a.op == b.op && a.mask == b.mask && a.width == b.width;
}
/* Thread i's state becomes s (the lanes' masks follow). */
static inline void tfm_emu__set(int i, int s) {
    tfm_emu__state &g = tfm_emu__g;
    tfm_emu__fiber &f = g.fibers[i];
    g.lanes[f.state][i >> 5] &= ~(1u << (i & 31));
    g.lanes[s][i >> 5] |= 1u << (i & 31);
    f.state = s;
}
/* the lanes of warp w that have not returned */
static inline unsigned tfm_emu__live(int w) {
    const tfm_emu__state &g = tfm_emu__g;
    return g.lanes[TFM_EMU__RUN][w] | g.lanes[TFM_EMU__SYNC][w] | g.lanes[TFM_EMU__WARP][w];
}
/* Release the waiting groups of the warp starting at thread w0 whose lanes have all arrived. A group
   is the lanes of a mask that exist and have not returned; they all wait with that mask (checked on
   arrival). */
static inline void tfm_emu__release_warp(int w0) {
    tfm_emu__state &g = tfm_emu__g;
    int n = g.nthreads - w0 < 32 ? g.nthreads - w0 : 32, w = w0 >> 5;
    unsigned waiting = g.lanes[TFM_EMU__WARP][w], released = 0, live = tfm_emu__live(w);
    for (unsigned todo = waiting; todo;) { /* a group at a time */
        int l = __builtin_ctz(todo);
        const tfm_emu__fiber &f0 = g.fibers[w0 + l];
        unsigned grp = f0.mask & live, votes = 0;
        todo &= ~(grp | 1u << l);
        if (f0.op >= TFM_EMU__W_FILL && grp != f0.mask) { /* wmma: the whole warp, none may have returned */
            char a[256];
            const tfm_emu__fiber &gone = g.fibers[w0 + __builtin_ctz(f0.mask & ~live)];
            tfm_emu__describe(a, sizeof a, w0 + l);
            tfm_emu__fatal("divergent warp: %s, which every lane of the warp must call, but thread (%u,%u,%u) of the "
                           "warp has returned", a, gone.tid.x, gone.tid.y, gone.tid.z);
        }
        if ((grp & waiting) != grp) continue;
        for (int j = 0; j < n; j++)
            if ((grp >> j & 1) && g.fibers[w0 + j].val) votes |= 1u << j;
        for (int j = 0; j < n; j++) {
            if (!(grp >> j & 1)) continue;
            tfm_emu__fiber &f = g.fibers[w0 + j];
            unsigned w = (unsigned)f.width, seg = (unsigned)j & ~(w - 1), src = (unsigned)j;
            switch (f.op) {
            case TFM_EMU__W_SYNC: f.res = 0; continue;
            case TFM_EMU__W_BALLOT: f.res = votes; continue;
            case TFM_EMU__W_ANY: f.res = votes != 0; continue;
            case TFM_EMU__W_ALL: f.res = votes == grp; continue;
            case TFM_EMU__W_FILL: case TFM_EMU__W_LOAD: case TFM_EMU__W_STORE: case TFM_EMU__W_MMA:
            case TFM_EMU__W_MMA16816: case TFM_EMU__W_LDSM: f.res = 0; continue;
            case TFM_EMU__W_IDX: src = seg + (f.arg & (w - 1)); break;
            case TFM_EMU__W_UP: src = (unsigned)j - seg >= f.arg ? (unsigned)j - f.arg : (unsigned)j; break;
            case TFM_EMU__W_DOWN: src = (uint64_t)j - seg + f.arg < w ? (unsigned)j + f.arg : (unsigned)j; break;
            case TFM_EMU__W_XOR: /* a later segment gives the lane's own value, an earlier one is read */
                src = (unsigned)j ^ (f.arg & 31u);
                if (src > seg + w - 1) src = (unsigned)j;
                break;
            }
            f.res = (grp >> src & 1) ? g.fibers[w0 + (int)src].val : ~(uint64_t)0; /* poison: no such lane */
        }
        for (int j = 0; j < n; j++)
            if (grp >> j & 1) tfm_emu__set(w0 + j, TFM_EMU__RUN);
        released |= grp;
    }
    if (released) { /* the lanes still waiting: one kind of wait (its first lane), or several (-1) */
        unsigned left = g.lanes[TFM_EMU__WARP][w];
        g.warp_rep[w] = left ? w0 + __builtin_ctz(left) : -1;
        for (unsigned todo = left; todo && g.warp_rep[w] >= 0; todo &= todo - 1)
            if (!tfm_emu__same_wait(g.fibers[w0 + __builtin_ctz(todo)], g.fibers[g.warp_rep[w]])) g.warp_rep[w] = -1;
    }
}
/* Release __syncthreads when every thread that has not returned waits at it. */
static inline void tfm_emu__release_block(void) {
    tfm_emu__state &g = tfm_emu__g;
    if (!g.n_sync || g.n_sync != g.n_live) return;
    uint64_t count = 0;
    for (int i = 0; i < g.nthreads; i++)
        if (g.fibers[i].state == TFM_EMU__SYNC) count += g.fibers[i].val;
    for (int i = 0; i < g.nthreads; i++) {
        tfm_emu__fiber &f = g.fibers[i];
        if (f.state != TFM_EMU__SYNC) continue;
        f.res = f.op == TFM_EMU__B_COUNT ? count : f.op == TFM_EMU__B_AND ? count == (uint64_t)g.n_sync : count > 0;
        tfm_emu__set(i, TFM_EMU__RUN);
    }
    g.n_sync = 0;
    g.sync_first = -1;
}
static inline void tfm_emu__describe(char *buf, size_t size, int i) {
    const tfm_emu__fiber &f = tfm_emu__g.fibers[i];
    const char *what = f.state != TFM_EMU__SYNC ? tfm_emu__wname[f.op] : f.op == TFM_EMU__B_WGMMA ? "wgmma" : "__syncthreads";
    snprintf(buf, size, "thread (%u,%u,%u) waits at %s at %s:%d", f.tid.x, f.tid.y, f.tid.z, what, f.file, f.line);
}

/* the running fiber (`what` names the device call made outside a kernel) */
static inline tfm_emu__fiber &tfm_emu__self(const char *what) {
    if (tfm_emu__g.cur < 0) tfm_emu__fatal("%s called outside a kernel", what);
    return tfm_emu__g.fibers[tfm_emu__g.cur];
}
/* Threads switch to one another directly, in round-robin order, and back to the launching host
   thread when the block is done. A fresh thread gets a fiber on its own stack; one that follows a
   thread that returned runs on that stack, without a switch (so a kernel without barriers costs one
   switch in and one out per block). */
static inline void tfm_emu__fiber_main(void);
#if TFM_EMU__ASM
/* tfm_emu__swap(save, to): push the callee-saved registers (rbp, rbx, r12-r15) and the control words
   (MXCSR, x87) on the running stack, store the stack pointer in *save, take `to` as the stack pointer and
   pop the same from it: back in the fiber that saved it, or at tfm_emu__start in a fresh one
   (tfm_emu__enter_thread lays out its stack), which calls tfm_emu__fiber_main on a 16-byte aligned stack.
   Local symbols: the emulation lives in one file of a program. */
extern "C" void tfm_emu__swap(void **save, void *to);
extern "C" void tfm_emu__start(void);
extern "C" __attribute__((used, visibility("hidden"))) void tfm_emu__fiber_entry(void) { tfm_emu__fiber_main(); }
__asm__(".text\n"
        ".p2align 4\n"
        ".type tfm_emu__swap, @function\n"
        "tfm_emu__swap:\n"
        "    pushq %rbp\n    pushq %rbx\n    pushq %r12\n    pushq %r13\n    pushq %r14\n    pushq %r15\n"
        "    subq $8, %rsp\n    stmxcsr (%rsp)\n    fnstcw 4(%rsp)\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    ldmxcsr (%rsp)\n    fldcw 4(%rsp)\n    addq $8, %rsp\n"
        "    popq %r15\n    popq %r14\n    popq %r13\n    popq %r12\n    popq %rbx\n    popq %rbp\n"
        "    ret\n"
        ".size tfm_emu__swap, .-tfm_emu__swap\n"
        ".p2align 4\n"
        ".type tfm_emu__start, @function\n"
        "tfm_emu__start:\n"
        "    andq $-16, %rsp\n"
        "    call tfm_emu__fiber_entry\n"
        "    ud2\n"
        ".size tfm_emu__start, .-tfm_emu__start\n");
#endif
/* the thread to run after thread i blocked or returned (i itself if it may go on), -1 if none may */
static inline int tfm_emu__next(int i) {
    tfm_emu__state &g = tfm_emu__g;
    int w = i >> 5, lane = i & 31, nw = (g.nthreads + 31) >> 5;
    unsigned run = g.lanes[TFM_EMU__RUN][w];
    if (run) { /* i's warp first, the lanes after i in the block's order, then round to i: it runs ahead until the
                  whole warp waits at a barrier */
        unsigned after = g.order > 0 ? run & ~((2u << lane) - 1u) : run & ((1u << lane) - 1u);
        unsigned from = after ? after : run;
        return (w << 5) + (g.order > 0 ? __builtin_ctz(from) : 31 - __builtin_clz(from));
    }
    for (int k = 1; k < nw; k++) { /* then the next warp in that order with a thread that may run: its first */
        int v = ((w + k * g.order) % nw + nw) % nw;
        run = g.lanes[TFM_EMU__RUN][v];
        if (run) return (v << 5) + (g.order > 0 ? __builtin_ctz(run) : 31 - __builtin_clz(run));
    }
    return -1;
}
/* make thread i current; a fresh fiber on its own stack unless it starts on `stack` */
static inline void tfm_emu__enter_thread(int i, char *stack) {
    tfm_emu__state &g = tfm_emu__g;
    tfm_emu__fiber &f = g.fibers[i];
    g.cur = i;
    g.tid = f.tid;
    if (f.started) return;
    f.started = true;
    if ((f.run_stack = stack) != nullptr) return;
    if (!f.stack) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE);
        void *m = mmap(nullptr, TFM_EMU_STACK + page, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) tfm_emu__fatal("cannot map a fiber stack of %d bytes", (int)TFM_EMU_STACK);
        mprotect(m, page, PROT_NONE); /* guard page: an overflowing fiber stack faults */
        f.stack = (char *)m + page;
        (void)VALGRIND_STACK_REGISTER(f.stack, f.stack + TFM_EMU_STACK);
#if !TFM_EMU__ASM
        getcontext(&f.uc); /* once: makecontext needs a context to start from */
#endif
    }
    f.run_stack = f.stack;
#if TFM_EMU__ASM
    { /* what tfm_emu__swap pops, at the top of the stack: the control words (the running thread's), six
         registers, and tfm_emu__start as the return address */
        void **sp = (void **)(f.stack + TFM_EMU_STACK);
        uint32_t csr;
        uint16_t cw;
        __asm__ volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(csr), "=m"(cw));
        *--sp = nullptr;
        *--sp = (void *)tfm_emu__start;
        for (int k = 0; k < 6; k++) *--sp = nullptr;
        *--sp = (void *)(uintptr_t)(csr | (uint64_t)cw << 32);
        f.sp = sp;
    }
#else
    f.uc.uc_stack.ss_sp = f.stack;
    f.uc.uc_stack.ss_size = TFM_EMU_STACK;
    f.uc.uc_link = nullptr;
    makecontext(&f.uc, tfm_emu__fiber_main, 0);
#ifdef TFM_EMU__ASAN
    f.uc.uc_stack.ss_sp = nullptr; /* keep ASan's swapcontext interceptor off the stack's shadow */
    f.uc.uc_stack.ss_size = 0;
#endif
#endif
}
__attribute__((noreturn)) static inline void tfm_emu__deadlock(void) {
    tfm_emu__state &g = tfm_emu__g;
    char a[256] = "", b[256] = "";
    int first = -1;
    for (int i = 0; i < g.nthreads; i++) {
        if (g.fibers[i].state == TFM_EMU__DONE) continue;
        if (first < 0) tfm_emu__describe(a, sizeof a, first = i);
        else if (!b[0] && g.fibers[i].op != g.fibers[first].op) tfm_emu__describe(b, sizeof b, i);
    }
    tfm_emu__fatal("deadlock: no thread can go on (%d have not returned); %s%s%s", g.n_live, a, b[0] ? "; " : "", b);
}
/* the running thread waits (its state says at what): release what its arrival completes, run others */
static inline void tfm_emu__yield(void) {
    tfm_emu__state &g = tfm_emu__g;
    int me = g.cur;
    tfm_emu__fiber &f = g.fibers[me];
    if (f.state == TFM_EMU__WARP) tfm_emu__release_warp(me & ~31);
    else tfm_emu__release_block();
    int nx = tfm_emu__next(me);
    if (nx == me) return;
    if (nx < 0) tfm_emu__deadlock();
    tfm_emu__enter_thread(nx, nullptr);
    TFM_EMU__SWITCH_START(&f.fake, g.fibers[nx].run_stack, TFM_EMU_STACK);
#if TFM_EMU__ASM
    tfm_emu__swap(&f.sp, g.fibers[nx].sp);
#else
    swapcontext(&f.uc, &g.fibers[nx].uc);
#endif
    TFM_EMU__SWITCH_FINISH(f.fake, nullptr, nullptr);
}
static inline void tfm_emu__fiber_main(void) {
    tfm_emu__state &g = tfm_emu__g;
    TFM_EMU__SWITCH_FINISH(nullptr, g.from_host ? &g.host_lo : nullptr, g.from_host ? &g.host_size : nullptr);
    g.from_host = false;
    for (;;) {
        g.invoke(g.args);
        tfm_emu__fiber &f = g.fibers[g.cur];
        tfm_emu__set(g.cur, TFM_EMU__DONE);
        g.n_live--;
        tfm_emu__release_warp(g.cur & ~31);
        tfm_emu__release_block();
        int nx = tfm_emu__next(g.cur);
        if (nx >= 0 && !g.fibers[nx].started) { /* it runs here, on this stack */
            tfm_emu__enter_thread(nx, f.run_stack);
            continue;
        }
        if (nx < 0 && g.n_live > 0) tfm_emu__deadlock();
        if (nx >= 0) tfm_emu__enter_thread(nx, nullptr); /* (started: it switched out at a wait) */
        TFM_EMU__SWITCH_START(nullptr, nx < 0 ? g.host_lo : g.fibers[nx].run_stack,
                              nx < 0 ? g.host_size : TFM_EMU_STACK);
        /* this fiber is done: its fake stack dies with it */
#if TFM_EMU__ASM
        tfm_emu__swap(&f.sp, nx < 0 ? g.host_sp : g.fibers[nx].sp);
#else
        setcontext(nx < 0 ? &g.host : &g.fibers[nx].uc);
#endif
    }
}

static inline void tfm_emu__run_block(void) {
    tfm_emu__state &g = tfm_emu__g;
    if (g.dyn_bytes) {
        if (posix_memalign(&g.dyn, 128, g.dyn_bytes) != 0) g.dyn = nullptr;
        if (!g.dyn) tfm_emu__fatal("out of host memory for %zu bytes of dynamic shared memory", g.dyn_bytes);
        memset(g.dyn, 0xFF, g.dyn_bytes);
    }
    memset(g.lanes, 0, sizeof g.lanes);
    memset(g.cp_groups, 0, sizeof g.cp_groups);
    memset(g.wg_groups, 0, sizeof g.wg_groups);
    g.wg.left = 0;
    for (int i = 0; i < g.nthreads; i++) {
        tfm_emu__fiber &f = g.fibers[i];
        f.state = TFM_EMU__RUN;
        g.lanes[TFM_EMU__RUN][i >> 5] |= 1u << (i & 31);
        g.warp_rep[i >> 5] = -1;
        f.started = false;
        f.tid.x = (unsigned)i % g.bdim.x;
        f.tid.y = (unsigned)i / g.bdim.x % g.bdim.y;
        f.tid.z = (unsigned)i / (g.bdim.x * g.bdim.y);
    }
    g.n_live = g.nthreads;
    g.n_sync = 0;
    g.sync_first = -1;
    int first = g.order > 0 ? 0 : g.nthreads - 1;
    tfm_emu__enter_thread(first, nullptr);
    g.from_host = true;
    TFM_EMU__SWITCH_START(&g.host_fake, g.fibers[first].run_stack, TFM_EMU_STACK);
#if TFM_EMU__ASM
    tfm_emu__swap(&g.host_sp, g.fibers[first].sp); /* back when every thread has returned */
#else
    swapcontext(&g.host, &g.fibers[first].uc); /* back when every thread has returned */
#endif
    TFM_EMU__SWITCH_FINISH(g.host_fake, nullptr, nullptr);
    g.cur = -1;
    for (int i = 0; i < g.nthreads; i++)
        if (!g.cp[i].empty())
            tfm_emu__fatal("thread (%u,%u,%u) returned with an asynchronous copy (cp.async) it never waited for",
                           g.fibers[i].tid.x, g.fibers[i].tid.y, g.fibers[i].tid.z);
    for (int i = 0; i < g.nthreads && i < 128; i++)
        if (!g.wgp[i].empty()) {
            g.wgp[i].clear();
            tfm_emu__fatal("thread (%u,%u,%u) returned with a warpgroup product (wgmma) it never waited for",
                           g.fibers[i].tid.x, g.fibers[i].tid.y, g.fibers[i].tid.z);
        }
    for (size_t i = 0; i < g.pieces.size(); i++) free(g.pieces[i].p);
    g.pieces.clear();
    g.static_bytes = 0;
    free(g.dyn);
    g.dyn = nullptr;
}

/* Run every block of the launch set up in g. */
static inline void tfm_emu__run_grid(void) {
    tfm_emu__state &g = tfm_emu__g;
    if (!g.fibers) {
        g.fibers = (tfm_emu__fiber *)calloc(1024, sizeof(tfm_emu__fiber));
        if (!g.fibers) tfm_emu__fatal("out of host memory for fibers");
    }
    g.in_kernel = true;
    for (unsigned z = 0; z < g.gdim.z; z++)
        for (unsigned y = 0; y < g.gdim.y; y++)
            for (unsigned x = 0; x < g.gdim.x; x++) {
                g.bid.x = x;
                g.bid.y = y;
                g.bid.z = z;
                /* even blocks run their threads upwards, odd ones downwards: a missing barrier shows whichever
                   side of it the threads that run first are on */
                g.order = ((x + y + z) & 1) ? -1 : 1;
                tfm_emu__run_block();
            }
    g.in_kernel = false;
    g.launches++;
}

/* ==== device built-ins: barriers, warp ops, shared memory ==== */

static inline int tfm_emu__barrier(const char *file, int line, int kind, int pred) {
    tfm_emu__state &g = tfm_emu__g;
    tfm_emu__fiber &f = tfm_emu__self("__syncthreads");
    int i = g.cur, w0 = i & ~31, lane = i & 31;
    char a[256], b[256];
    f.file = file;
    f.line = line;
    f.op = kind;
    tfm_emu__set(i, TFM_EMU__SYNC);
    if (g.n_sync > 0) {
        const tfm_emu__fiber &o = g.fibers[g.sync_first];
        if (o.line != line || o.op != kind || strcmp(o.file, file) != 0) {
            tfm_emu__describe(a, sizeof a, g.sync_first);
            tfm_emu__describe(b, sizeof b, i);
            tfm_emu__fatal("divergent __syncthreads: %s, while %s", a, b);
        }
    }
    for (unsigned todo = g.lanes[TFM_EMU__WARP][w0 >> 5]; todo; todo &= todo - 1) {
        int j = w0 + __builtin_ctz(todo);
        const tfm_emu__fiber &o = g.fibers[j];
        if (o.mask >> lane & 1) {
            tfm_emu__describe(a, sizeof a, j);
            tfm_emu__describe(b, sizeof b, i);
            tfm_emu__fatal("divergent warp: %s (its mask names lane %d), while %s", a, lane, b);
        }
    }
    f.val = pred != 0;
    if (g.n_sync++ == 0) g.sync_first = i;
    tfm_emu__yield();
    return (int)f.res;
}

/* a wmma call's arguments, for a message */
static inline void tfm_emu__wmma_args(char *buf, size_t size, const tfm_emu__fiber &f) {
    static const char *const lay[4] = {", mem_row_major", ", mem_col_major", "", ""}; /* 2, 3: the fragment's */
    float v;
    uint32_t u = (uint32_t)f.wa;
    memcpy(&v, &u, 4);
    if (f.op == TFM_EMU__W_FILL) snprintf(buf, size, "value %.9g (bits 0x%08x)", (double)v, u);
    else snprintf(buf, size, "p = %p, ldm = %u%s", (void *)(uintptr_t)f.wa, (unsigned)f.wb, lay[(f.wb >> 32) & 3]);
}
/* a wmma call (op from W_FILL) must be the same one, with the same arguments, in every lane: checked
   against the lanes of thread i's warp that wait at one already */
static inline void tfm_emu__wmma_agree(int i) {
    tfm_emu__state &g = tfm_emu__g;
    const tfm_emu__fiber &f = g.fibers[i];
    char a[256], b[256], x[128], y[128];
    for (unsigned todo = g.lanes[TFM_EMU__WARP][i >> 5]; todo; todo &= todo - 1) {
        int j = (i & ~31) + __builtin_ctz(todo);
        const tfm_emu__fiber &o = g.fibers[j];
        if (j == i || o.op != f.op) continue;
        if (o.line != f.line || strcmp(o.file, f.file) != 0) {
            tfm_emu__describe(a, sizeof a, j);
            tfm_emu__describe(b, sizeof b, i);
            tfm_emu__fatal("divergent warp: %s, while %s (a wmma call is made by the whole warp at once)", a, b);
        }
        if (o.wa != f.wa || o.wb != f.wb) {
            tfm_emu__wmma_args(x, sizeof x, o);
            tfm_emu__wmma_args(y, sizeof y, f);
            tfm_emu__fatal("%s:%d: %s: the lanes of a warp pass different arguments: thread (%u,%u,%u) %s, thread "
                           "(%u,%u,%u) %s (every lane must pass the same)", f.file, f.line, tfm_emu__wname[f.op],
                           o.tid.x, o.tid.y, o.tid.z, x, f.tid.x, f.tid.y, f.tid.z, y);
        }
    }
}

static inline uint64_t tfm_emu__warp(const char *file, int line, int op, unsigned mask, uint64_t val, unsigned arg,
                                     int width) {
    tfm_emu__state &g = tfm_emu__g;
    tfm_emu__fiber &f = tfm_emu__self(tfm_emu__wname[op]);
    int i = g.cur, w0 = i & ~31, lane = i & 31;
    char a[256], b[256];
    if (!(mask >> lane & 1))
        tfm_emu__fatal("%s:%d: %s with mask 0x%08x, which leaves out the calling lane %d", file, line,
                       tfm_emu__wname[op], mask, lane);
    if (width < 1 || width > 32 || (width & (width - 1)))
        tfm_emu__fatal("%s:%d: %s width %d is not a power of two in [1, 32]", file, line, tfm_emu__wname[op], width);
    f.file = file;
    f.line = line;
    f.op = op;
    f.mask = mask;
    f.width = width;
    f.arg = arg;
    f.val = val;
    unsigned others = g.lanes[TFM_EMU__WARP][w0 >> 5], todo = g.lanes[TFM_EMU__SYNC][w0 >> 5] & mask;
    int &rep = g.warp_rep[w0 >> 5];
    tfm_emu__set(i, TFM_EMU__WARP);
    /* the lanes waiting already that share a group with this one, at a __syncthreads or another warp op. The
       waiting lanes that share a group wait alike (checked as each arrived), so where all wait alike (rep) and
       this one as they do, none differs: the usual case, one check */
    if (!others) rep = i;
    else if (rep < 0 || !tfm_emu__same_wait(f, g.fibers[rep])) {
        todo |= others;
        rep = -1;
    }
    for (; todo; todo &= todo - 1) {
        int j = w0 + __builtin_ctz(todo);
        const tfm_emu__fiber &o = g.fibers[j];
        bool shared = (mask >> (j & 31) & 1) || (o.mask >> lane & 1);
        if (j == i || !shared) continue;
        if ((o.state == TFM_EMU__SYNC && (mask >> (j & 31) & 1)) ||
            (o.state == TFM_EMU__WARP && (o.op != op || o.mask != mask || o.width != width))) {
            tfm_emu__describe(a, sizeof a, j);
            tfm_emu__describe(b, sizeof b, i);
            tfm_emu__fatal("divergent warp: %s (mask 0x%08x, width %d), while %s (mask 0x%08x, width %d)", a,
                           o.state == TFM_EMU__WARP ? o.mask : 0u, o.state == TFM_EMU__WARP ? o.width : 0, b, mask,
                           width);
        }
    }
    if (op >= TFM_EMU__W_FILL) tfm_emu__wmma_agree(i);
    tfm_emu__yield();
    return f.res;
}

/* a call site, so that divergence messages can name it */
struct tfm_emu__at {
    const char *file;
    int line;
    template <class T> T op(int kind, unsigned mask, T v, unsigned arg, int width) const {
        static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffles move 1 to 8 bytes");
        uint64_t bits = 0, r;
        T out;
        memcpy(&bits, &v, sizeof v);
        r = tfm_emu__warp(file, line, kind, mask, bits, arg, width);
        memcpy(&out, &r, sizeof out);
        return out;
    }
    template <class T> T shfl(unsigned mask, T v, int src, int width = 32) const {
        return op(TFM_EMU__W_IDX, mask, v, (unsigned)src, width);
    }
    template <class T> T shfl_up(unsigned mask, T v, unsigned d, int width = 32) const {
        return op(TFM_EMU__W_UP, mask, v, d, width);
    }
    template <class T> T shfl_down(unsigned mask, T v, unsigned d, int width = 32) const {
        return op(TFM_EMU__W_DOWN, mask, v, d, width);
    }
    template <class T> T shfl_xor(unsigned mask, T v, int m, int width = 32) const {
        return op(TFM_EMU__W_XOR, mask, v, (unsigned)m, width);
    }
    void syncwarp(unsigned mask = 0xffffffffu) const { tfm_emu__warp(file, line, TFM_EMU__W_SYNC, mask, 0, 0, 32); }
    unsigned ballot(unsigned mask, int p) const {
        return (unsigned)tfm_emu__warp(file, line, TFM_EMU__W_BALLOT, mask, p != 0, 0, 32);
    }
    int any(unsigned mask, int p) const { return (int)tfm_emu__warp(file, line, TFM_EMU__W_ANY, mask, p != 0, 0, 32); }
    int all(unsigned mask, int p) const { return (int)tfm_emu__warp(file, line, TFM_EMU__W_ALL, mask, p != 0, 0, 32); }
};
#define __syncthreads() tfm_emu__barrier(__FILE__, __LINE__, TFM_EMU__B_SYNC, 0)
#define __syncthreads_count(p) tfm_emu__barrier(__FILE__, __LINE__, TFM_EMU__B_COUNT, (p) != 0)
#define __syncthreads_and(p) tfm_emu__barrier(__FILE__, __LINE__, TFM_EMU__B_AND, (p) != 0)
#define __syncthreads_or(p) tfm_emu__barrier(__FILE__, __LINE__, TFM_EMU__B_OR, (p) != 0)
#define __syncwarp(...) (tfm_emu__at{__FILE__, __LINE__}.syncwarp(__VA_ARGS__))
#define __shfl_sync(...) (tfm_emu__at{__FILE__, __LINE__}.shfl(__VA_ARGS__))
#define __shfl_up_sync(...) (tfm_emu__at{__FILE__, __LINE__}.shfl_up(__VA_ARGS__))
#define __shfl_down_sync(...) (tfm_emu__at{__FILE__, __LINE__}.shfl_down(__VA_ARGS__))
#define __shfl_xor_sync(...) (tfm_emu__at{__FILE__, __LINE__}.shfl_xor(__VA_ARGS__))
#define __ballot_sync(...) (tfm_emu__at{__FILE__, __LINE__}.ballot(__VA_ARGS__))
#define __any_sync(...) (tfm_emu__at{__FILE__, __LINE__}.any(__VA_ARGS__))
#define __all_sync(...) (tfm_emu__at{__FILE__, __LINE__}.all(__VA_ARGS__))
static inline unsigned __activemask(void) {
    (void)tfm_emu__self("__activemask");
    return tfm_emu__live(tfm_emu__g.cur >> 5);
}

/* Static shared memory (TFM__SHARED): the array of this declaration site in this block. */
static inline void *tfm_emu__shared(size_t bytes, const char *fn, int line) {
    tfm_emu__state &g = tfm_emu__g;
    (void)tfm_emu__self("TFM__SHARED");
    for (size_t i = 0; i < g.pieces.size(); i++) {
        const tfm_emu__piece &p = g.pieces[i];
        if (p.line != line || (p.fn != fn && strcmp(p.fn, fn) != 0)) continue;
        if (p.bytes != bytes)
            tfm_emu__fatal("%s, line %d: a shared array of %zu bytes was %zu bytes for another thread", fn, line, bytes,
                           p.bytes);
        return p.p;
    }
    g.static_bytes += (bytes + 15) & ~(size_t)15;
    if (g.static_bytes > TFM_EMU__SMEM_STATIC)
        tfm_emu__fatal("%s, line %d: static shared memory reaches %zu bytes, over the %d bytes a block may have", fn,
                       line, g.static_bytes, TFM_EMU__SMEM_STATIC);
    if (g.static_bytes + g.dyn_bytes > g.smem_limit)
        tfm_emu__fatal("%s, line %d: static (%zu) + dynamic (%zu) shared memory exceed the kernel's limit of %zu bytes",
                       fn, line, g.static_bytes, g.dyn_bytes, g.smem_limit);
    tfm_emu__piece p = {fn, line, bytes, nullptr};
    if (posix_memalign(&p.p, 128, bytes ? bytes : 1) != 0) tfm_emu__fatal("out of host memory for shared memory");
    memset(p.p, 0xFF, bytes);
    g.pieces.push_back(p);
    return p.p;
}
#define tfm_emu_shared(bytes) tfm_emu__shared((bytes), __PRETTY_FUNCTION__, __LINE__)
/* Dynamic shared memory (TFM__SHARED_DYN): the launch's smem bytes, NULL when 0. */
static inline void *tfm_emu_dyn_shared(void) {
    (void)tfm_emu__self("TFM__SHARED_DYN");
    return tfm_emu__g.dyn;
}

/* whether the n bytes at p lie in one of the running block's shared arrays or its dynamic shared memory */
static inline bool tfm_emu__in_shared(const void *p, size_t n) {
    tfm_emu__state &g = tfm_emu__g;
    uintptr_t d = (uintptr_t)p;
    if (g.dyn && d >= (uintptr_t)g.dyn && d + n <= (uintptr_t)g.dyn + g.dyn_bytes) return true;
    for (size_t i = 0; i < g.pieces.size(); i++)
        if (d >= (uintptr_t)g.pieces[i].p && d + n <= (uintptr_t)g.pieces[i].p + g.pieces[i].bytes) return true;
    return false;
}

/* ==== device built-ins: asynchronous copies to shared memory (PTX's cp.async, sm_80 on) ====
   What the header's inline PTX runs on a GPU: tfm_emu_cp_async16(dst, src) is cp.async.cg.shared.global of
   16 bytes (dst in shared memory, src in device memory, both 16-byte aligned, else it aborts),
   tfm_emu_cp_commit() cp.async.commit_group, tfm_emu_cp_wait(n) cp.async.wait_group n. A copy is done as
   late as a GPU may do it: its 16 bytes of shared memory turn to 0xFF (NaN) when it is issued and get the
   source's bytes only when the thread that issued it waits for its group (every group it committed but its
   n most recent ones), so a read before the wait, or by another thread before the barrier after it, finds
   NaN; a block whose thread returns with a copy not waited for aborts. */
static inline void tfm_emu_cp_async16(void *dst, const void *src) {
    tfm_emu__state &g = tfm_emu__g;
    (void)tfm_emu__self("cp.async");
    if ((((uintptr_t)dst | (uintptr_t)src) & 15) || !tfm_emu__in_shared(dst, 16) || !tfm_emu__device_range(src, 16))
        tfm_emu__fatal("cp.async of 16 bytes from %p to %p: the source must be device memory, the destination shared "
                       "memory, both 16-byte aligned (a GPU faults)", src, dst);
    memset(dst, 0xFF, 16);
    g.cp[g.cur].push_back(tfm_emu__cp{g.cp_groups[g.cur], dst, src});
}
static inline void tfm_emu_cp_commit(void) {
    (void)tfm_emu__self("cp.async.commit_group");
    tfm_emu__g.cp_groups[tfm_emu__g.cur]++;
}
static inline void tfm_emu_cp_wait(unsigned n) {
    tfm_emu__state &g = tfm_emu__g;
    (void)tfm_emu__self("cp.async.wait_group");
    unsigned done = g.cp_groups[g.cur] > n ? g.cp_groups[g.cur] - n : 0; /* groups below this one complete */
    std::vector<tfm_emu__cp> &q = g.cp[g.cur];
    size_t k = 0;
    for (size_t i = 0; i < q.size(); i++) {
        if (q[i].group < done) memcpy(q[i].dst, q[i].src, 16);
        else q[k++] = q[i];
    }
    q.resize(k);
}

/* ==== device built-ins: warp matrix products (<mma.h>'s nvcuda::wmma) and <cuda_bf16.h>'s __nv_bfloat16 ====
   Only 16 x 16 x 16 tiles of bf16 operands with fp32 accumulators. Each lane holds the whole tile; the
   warp meets at every call (a warp op: the whole warp, the same call site and arguments); the first lane
   past a load reads the tile for the warp (one snapshot), the first past mma_sync computes it for the warp
   (the others check that they hold the same operands); a store's elements are written spread over the
   lanes. Calls are macros below, so that messages can name the site. */

/* the 16 bits of a bf16 (a float's upper half); the kernels use it only as the pointee of bf16 arrays */
struct alignas(2) __nv_bfloat16 {
  protected:
    unsigned short __x;
};
static_assert(sizeof(__nv_bfloat16) == 2, "__nv_bfloat16 is 2 bytes");

/* the start of every wmma call: in a kernel, in a whole warp */
static inline void tfm_emu__wmma_enter(const tfm_emu__at &at, int op) {
    tfm_emu__state &g = tfm_emu__g;
    (void)tfm_emu__self(tfm_emu__wname[op]);
    int w0 = g.cur & ~31;
    if (g.nthreads - w0 < 32)
        tfm_emu__fatal("%s:%d: %s needs a whole warp of 32 lanes, but the block's %d threads leave warp %d with %d",
                       at.file, at.line, tfm_emu__wname[op], g.nthreads, w0 / 32, g.nthreads - w0);
}
/* where a matrix load or store reads or writes: a 16 x 16 tile of elem-byte elements at p, ldm apart, must
   be 32-byte aligned, ldm a multiple of 16 bytes, the tile inside one shared array, the dynamic shared
   memory or one live cudaMalloc block */
static inline void tfm_emu__wmma_mem(const tfm_emu__at &at, int op, const void *p, unsigned ldm, size_t elem) {
    tfm_emu__state &g = tfm_emu__g;
    const char *fn = tfm_emu__wname[op];
    size_t bytes = (15 * (size_t)ldm + 16) * elem;
    uintptr_t a = (uintptr_t)p;
    if (a % 32)
        tfm_emu__fatal("%s:%d: %s: p = %p is not 32-byte (256-bit) aligned (a GPU faults: misaligned address)",
                       at.file, at.line, fn, p);
    if (ldm % (16 / elem))
        tfm_emu__fatal("%s:%d: %s: ldm = %u is not a multiple of %zu (16 bytes of %s)", at.file, at.line, fn, ldm,
                       16 / elem, elem == 2 ? "__nv_bfloat16" : "float");
    const char *past = nullptr;
    for (size_t i = 0; i <= g.pieces.size(); i++) { /* the static arrays, then the dynamic region */
        uintptr_t lo = i < g.pieces.size() ? (uintptr_t)g.pieces[i].p : (uintptr_t)g.dyn;
        size_t n = i < g.pieces.size() ? g.pieces[i].bytes : g.dyn_bytes;
        if (!lo || a < lo || a >= lo + n) continue;
        if (bytes <= lo + n - a) return;
        past = i < g.pieces.size() ? "its shared array" : "the dynamic shared memory";
    }
    if (!past && tfm_emu__device_range(p, bytes)) return;
    if (!past && tfm_emu__is_device(p)) past = "its cudaMalloc block";
    if (past)
        tfm_emu__fatal("%s:%d: %s: the 16 x 16 tile at p = %p with ldm = %u (%zu bytes) runs past the end of %s",
                       at.file, at.line, fn, p, ldm, bytes, past);
    tfm_emu__fatal("%s:%d: %s: p = %p is neither shared memory nor live device memory (a host or local array, "
                   "or a freed block?): a GPU would fault", at.file, at.line, fn, p);
}
/* the warp meets at a wmma call (wa, wb: the arguments every lane must pass alike); *first: this lane is the
   first past it, the one that reads or computes for the warp in the stage that it returns */
static inline tfm_emu__wmma_stage &tfm_emu__wmma_meet(const tfm_emu__at &at, int op, uint64_t wa, uint64_t wb,
                                                     bool *first) {
    tfm_emu__state &g = tfm_emu__g;
    tfm_emu__fiber &f = g.fibers[g.cur];
    f.wa = wa;
    f.wb = wb;
    tfm_emu__warp(at.file, at.line, op, 0xffffffffu, 0, 0, 32);
    tfm_emu__wmma_stage &s = g.wmma[g.cur >> 5]; /* every lane passes once before any meets again */
    *first = s.left == 0;
    s.left = *first ? 31 : s.left - 1;
    return s;
}
__attribute__((noreturn)) static inline void tfm_emu__wmma_differ(const tfm_emu__at &at, int op, const char *what) {
    tfm_emu__fatal("%s:%d: %s: this lane's %s differs from the first lane's of its warp: a fragment must be one "
                   "for the whole warp (the same variable in every lane, changed only by wmma calls)", at.file,
                   at.line, tfm_emu__wname[op], what);
}
static inline float tfm_emu__bf16_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

/* Only fragment<matrix_a or matrix_b, 16, 16, 16, __nv_bfloat16, row_major or col_major> and
   fragment<accumulator, 16, 16, 16, float>. Each lane holds the whole tile, element (r, c) at [16 r + c],
   filled with NaN bits until a call writes it. No x[] or num_elements, as CUDA has: which lane holds which
   element is the GPU's business, so code that touches elements must go through memory (a store, then
   __syncwarp) and uses of x fail to compile here. */
template <typename Use, int m, int n, int k, typename T, typename Layout = void> class fragment;
template <typename Use, typename Layout> class fragment<Use, 16, 16, 16, __nv_bfloat16, Layout> {
    static_assert(std::is_same<Use, matrix_a>::value || std::is_same<Use, matrix_b>::value,
                  "a bf16 fragment is a matrix_a or a matrix_b");
    static_assert(std::is_same<Layout, row_major>::value || std::is_same<Layout, col_major>::value,
                  "a matrix_a or matrix_b fragment has the layout row_major or col_major");

  public:
    uint16_t tfm_emu__v[256]; /* the emulation's, not CUDA's */
    fragment() { memset(tfm_emu__v, 0xFF, sizeof tfm_emu__v); }
};
template <> class fragment<accumulator, 16, 16, 16, float, void> {
  public:
    float tfm_emu__v[256]; /* the emulation's, not CUDA's */
    fragment() { memset(tfm_emu__v, 0xFF, sizeof tfm_emu__v); }
};
typedef fragment<accumulator, 16, 16, 16, float, void> tfm_emu__acc;

static inline void fill_fragment(const tfm_emu__at &at, tfm_emu__acc &f, float v) {
    uint32_t u;
    bool first;
    memcpy(&u, &v, 4);
    tfm_emu__wmma_enter(at, TFM_EMU__W_FILL);
    (void)tfm_emu__wmma_meet(at, TFM_EMU__W_FILL, u, 0, &first);
    for (int e = 0; e < 256; e++) f.tfm_emu__v[e] = v;
}
/* A (16 x 16, m x k) or B (16 x 16, k x n): element (r, c) at p[r ldm + c] (row_major), p[c ldm + r] (col_major) */
template <typename Use, typename Layout>
static inline void load_matrix_sync(const tfm_emu__at &at, fragment<Use, 16, 16, 16, __nv_bfloat16, Layout> &f,
                                    const __nv_bfloat16 *p, unsigned ldm) {
    bool col = std::is_same<Layout, col_major>::value, first;
    tfm_emu__wmma_enter(at, TFM_EMU__W_LOAD);
    tfm_emu__wmma_mem(at, TFM_EMU__W_LOAD, p, ldm, 2);
    tfm_emu__wmma_stage &s = tfm_emu__wmma_meet(at, TFM_EMU__W_LOAD, (uintptr_t)p, ldm | (uint64_t)(col ? 3 : 2) << 32,
                                                &first);
    if (first)
        for (size_t r = 0; r < 16; r++)
            for (size_t c = 0; c < 16; c++)
                memcpy(&s.a[16 * r + c], (const char *)p + 2 * (col ? c * ldm + r : r * ldm + c), 2);
    memcpy(f.tfm_emu__v, s.a, sizeof s.a);
}
static inline void tfm_emu__check_layout(const tfm_emu__at &at, int op, layout_t layout) {
    if ((int)layout != mem_row_major && (int)layout != mem_col_major)
        tfm_emu__fatal("%s:%d: %s: layout %d is neither mem_row_major nor mem_col_major", at.file, at.line,
                       tfm_emu__wname[op], (int)layout);
}
/* C (16 x 16): element (r, c) at p[r ldm + c] (mem_row_major), p[c ldm + r] (mem_col_major) */
static inline void load_matrix_sync(const tfm_emu__at &at, tfm_emu__acc &f, const float *p, unsigned ldm,
                                    layout_t layout) {
    bool first;
    tfm_emu__wmma_enter(at, TFM_EMU__W_LOAD);
    tfm_emu__check_layout(at, TFM_EMU__W_LOAD, layout);
    tfm_emu__wmma_mem(at, TFM_EMU__W_LOAD, p, ldm, 4);
    tfm_emu__wmma_stage &s = tfm_emu__wmma_meet(at, TFM_EMU__W_LOAD, (uintptr_t)p, ldm | (uint64_t)layout << 32, &first);
    bool col = layout == mem_col_major;
    if (first)
        for (size_t r = 0; r < 16; r++)
            for (size_t c = 0; c < 16; c++)
                memcpy(&s.d[16 * r + c], (const char *)p + 4 * (col ? c * ldm + r : r * ldm + c), 4);
    memcpy(f.tfm_emu__v, s.d, sizeof s.d);
}
/* Lane l writes the 8 elements e = 16 r + c with (13 e + 5) % 32 == l: a lane that reads the tile back
   before a __syncwarp finds most of it not yet written (on a GPU, too, other lanes' stores need one). */
static inline void store_matrix_sync(const tfm_emu__at &at, float *p, const tfm_emu__acc &f, unsigned ldm,
                                     layout_t layout) {
    bool first;
    tfm_emu__wmma_enter(at, TFM_EMU__W_STORE);
    tfm_emu__check_layout(at, TFM_EMU__W_STORE, layout);
    tfm_emu__wmma_mem(at, TFM_EMU__W_STORE, p, ldm, 4);
    tfm_emu__wmma_stage &s = tfm_emu__wmma_meet(at, TFM_EMU__W_STORE, (uintptr_t)p, ldm | (uint64_t)layout << 32, &first);
    if (first) memcpy(s.d, f.tfm_emu__v, sizeof s.d);
    else if (memcmp(s.d, f.tfm_emu__v, sizeof s.d) != 0) tfm_emu__wmma_differ(at, TFM_EMU__W_STORE, "fragment");
    bool col = layout == mem_col_major;
    unsigned lane = (unsigned)tfm_emu__g.cur & 31u;
    for (size_t r = 0; r < 16; r++)
        for (size_t c = 0; c < 16; c++)
            if (((13 * (16 * r + c) + 5) & 31) == lane)
                memcpy((char *)p + 4 * (col ? c * ldm + r : r * ldm + c), &f.tfm_emu__v[16 * r + c], 4);
}
/* d = a b + c (d may be c): for each (i, j), c_ij + a_i0 b_0j + a_i1 b_1j + ... + a_i15 b_15j in that order, in
   fp32; the products of bf16 values are exact */
template <typename LA, typename LB>
static inline void mma_sync(const tfm_emu__at &at, tfm_emu__acc &d, const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA> &a,
                            const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB> &b, const tfm_emu__acc &c) {
    bool first;
    tfm_emu__wmma_enter(at, TFM_EMU__W_MMA);
    tfm_emu__wmma_stage &s = tfm_emu__wmma_meet(at, TFM_EMU__W_MMA, 0, 0, &first);
    if (first) {
        float bw[256], row[16];
        memcpy(s.a, a.tfm_emu__v, sizeof s.a);
        memcpy(s.b, b.tfm_emu__v, sizeof s.b);
        memcpy(s.c, c.tfm_emu__v, sizeof s.c);
        for (int e = 0; e < 256; e++) bw[e] = tfm_emu__bf16_float(s.b[e]);
        for (int i = 0; i < 16; i++) {
            memcpy(row, &s.c[16 * i], sizeof row);
            for (int k = 0; k < 16; k++) {
                float aik = tfm_emu__bf16_float(s.a[16 * i + k]);
                for (int j = 0; j < 16; j++) row[j] += aik * bw[16 * k + j];
            }
            memcpy(&s.d[16 * i], row, sizeof row);
        }
    } else {
        if (memcmp(s.a, a.tfm_emu__v, sizeof s.a) != 0) tfm_emu__wmma_differ(at, TFM_EMU__W_MMA, "fragment a");
        if (memcmp(s.b, b.tfm_emu__v, sizeof s.b) != 0) tfm_emu__wmma_differ(at, TFM_EMU__W_MMA, "fragment b");
        if (memcmp(s.c, c.tfm_emu__v, sizeof s.c) != 0) tfm_emu__wmma_differ(at, TFM_EMU__W_MMA, "fragment c");
    }
    memcpy(d.tfm_emu__v, s.d, sizeof s.d);
}
} /* namespace wmma */
} /* namespace nvcuda */
/* each call names its site: nvcuda::wmma::mma_sync(d, a, b, c) becomes nvcuda::wmma::mma_sync(site, d, a, b, c) */
#define fill_fragment(...) fill_fragment(::tfm_emu__at{__FILE__, __LINE__}, __VA_ARGS__)
#define load_matrix_sync(...) load_matrix_sync(::tfm_emu__at{__FILE__, __LINE__}, __VA_ARGS__)
#define store_matrix_sync(...) store_matrix_sync(::tfm_emu__at{__FILE__, __LINE__}, __VA_ARGS__)
#define mma_sync(...) mma_sync(::tfm_emu__at{__FILE__, __LINE__}, __VA_ARGS__)

/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {d}, {a}, {b}, {c} (the header's tfm__cu_mma16816): D = A B
   + C for the warp, A 16 x 16 and B 16 x 8 of bf16, C and D 16 x 8 of fp32, spread over the lanes as the PTX
   ISA lays them out. With g = lane / 4 and t = lane % 4, a lane's registers hold (the lower column or row in a
   register's lower 16 bits): a[0] A[g][2t, 2t+1], a[1] A[g+8][2t, 2t+1], a[2] A[g][2t+8, 2t+9], a[3] A[g+8][2t+8,
   2t+9]; b[0] B[2t, 2t+1][g], b[1] B[2t+8, 2t+9][g]; c and d C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]. A
   warp op (the whole warp at the same call): each lane leaves its registers in the warp's stage, the first
   lane past computes D for the warp (each element c + the 16 products in order of k, in fp32; the products
   of bf16 values are exact), each lane takes its 4. A kernel that gets the layout wrong gets wrong sums. */
static inline void tfm_emu__mma16816(const tfm_emu__at &at, float d[4], const uint32_t a[4], const uint32_t b[2],
                                     const float c[4]) {
    tfm_emu__state &g = tfm_emu__g;
    bool first;
    tfm_emu__wmma_enter(at, TFM_EMU__W_MMA16816);
    int lane = g.cur & 31;
    tfm_emu__wmma_stage &s = g.wmma[g.cur >> 5];
    memcpy(s.ra[lane], a, sizeof s.ra[lane]); /* the stage's D is the last call's until every lane is here */
    memcpy(s.rb[lane], b, sizeof s.rb[lane]);
    memcpy(s.rc[lane], c, sizeof s.rc[lane]);
    (void)tfm_emu__wmma_meet(at, TFM_EMU__W_MMA16816, 0, 0, &first);
    if (first) {
        float A[16][16], B[16][8], C[16][8];
        for (int l = 0; l < 32; l++) {
            int r = l >> 2, k = 2 * (l & 3);
            for (int h = 0; h < 2; h++) {
                A[r][k + h] = tfm_emu__bf16_float((uint16_t)(s.ra[l][0] >> 16 * h));
                A[r + 8][k + h] = tfm_emu__bf16_float((uint16_t)(s.ra[l][1] >> 16 * h));
                A[r][k + 8 + h] = tfm_emu__bf16_float((uint16_t)(s.ra[l][2] >> 16 * h));
                A[r + 8][k + 8 + h] = tfm_emu__bf16_float((uint16_t)(s.ra[l][3] >> 16 * h));
                B[k + h][r] = tfm_emu__bf16_float((uint16_t)(s.rb[l][0] >> 16 * h));
                B[k + 8 + h][r] = tfm_emu__bf16_float((uint16_t)(s.rb[l][1] >> 16 * h));
                C[r][k + h] = s.rc[l][h];
                C[r + 8][k + h] = s.rc[l][2 + h];
            }
        }
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 8; j++)
                for (int k = 0; k < 16; k++) C[i][j] += A[i][k] * B[k][j];
        for (int l = 0; l < 32; l++) {
            int r = l >> 2, k = 2 * (l & 3);
            s.rd[l][0] = C[r][k], s.rd[l][1] = C[r][k + 1], s.rd[l][2] = C[r + 8][k], s.rd[l][3] = C[r + 8][k + 1];
        }
    }
    memcpy(d, s.rd[lane], sizeof s.rd[lane]);
}
#define tfm_emu_mma16816(d, a, b, c) tfm_emu__mma16816(tfm_emu__at{__FILE__, __LINE__}, d, a, b, c)

/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 {r}, [p] (the header's tfm__cu_ldsm): four 8 x 8 matrices
   of 16-bit elements, lanes 8 i .. 8 i + 7 giving the addresses of matrix i's 8 rows (16 bytes each, 16-byte
   aligned, in shared memory), each lane getting in r[i] two elements of matrix i by the PTX ISA's layout:
   row lane / 4, columns 2 (lane % 4) and 2 (lane % 4) + 1; with .trans (trans != 0), matrix i transposed:
   rows 2 (lane % 4) and 2 (lane % 4) + 1 of column lane / 4 (the lower column or row in the lower 16 bits).
   A warp op; the first lane past reads the rows for the warp. */
static inline void tfm_emu__ldsm(const tfm_emu__at &at, uint32_t r[4], const void *p, int trans) {
    tfm_emu__state &g = tfm_emu__g;
    bool first;
    tfm_emu__wmma_enter(at, TFM_EMU__W_LDSM);
    int lane = g.cur & 31;
    tfm_emu__wmma_stage &s = g.wmma[g.cur >> 5];
    if (((uintptr_t)p & 15) || !tfm_emu__in_shared(p, 16))
        tfm_emu__fatal("%s:%d: ldmatrix: lane %d's row address %p is not 16 bytes of shared memory on a 16-byte boundary "
                       "(a GPU faults)", at.file, at.line, lane, p);
    s.rp[lane] = p;
    s.rt[lane] = trans != 0;
    (void)tfm_emu__wmma_meet(at, TFM_EMU__W_LDSM, 0, 0, &first);
    if (first) {
        uint16_t m[4][8][8];
        for (int l = 1; l < 32; l++)
            if (s.rt[l] != s.rt[0])
                tfm_emu__fatal("%s:%d: ldmatrix: lanes 0 and %d of the warp ask for different forms (.trans and not)",
                               at.file, at.line, l);
        for (int l = 0; l < 32; l++) memcpy(m[l >> 3][l & 7], s.rp[l], 16);
        for (int l = 0; l < 32; l++)
            for (int i = 0; i < 4; i++) {
                int g4 = l >> 2, t2 = 2 * (l & 3);
                s.rl[l][i] = s.rt[0] ? m[i][t2][g4] | (uint32_t)m[i][t2 + 1][g4] << 16
                                     : m[i][g4][t2] | (uint32_t)m[i][g4][t2 + 1] << 16;
            }
    }
    memcpy(r, s.rl[lane], sizeof s.rl[lane]);
}
#define tfm_emu_ldsm(r, p, trans) tfm_emu__ldsm(tfm_emu__at{__FILE__, __LINE__}, r, p, trans)

/* ==== device built-ins: Hopper's warpgroup products (wgmma, sm_90a) ====
   What the header's inline PTX runs on a GPU built for sm_90a:
   - tfm_emu_smem_addr(p): a shared-memory address as __cvta_generic_to_shared gives it; here p's offset in
     the dynamic shared memory (the only shared memory a descriptor may point into here, else it aborts);
   - tfm_emu_wgmma(d, n, a, desc, trans): wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 with A from
     registers, scale-d 1 (D = A B + D), n a multiple of 8 up to 256; tfm_emu_wgmma_ss(d, n, desc_a, desc,
     trans) the same with A from shared memory, K-major (imm-trans-a 0), through its own descriptor (read as
     B's K-major form with m for n). A warpgroup op: the block must be one
     warpgroup (128 threads, none returned) and all of them at the same call, with the same n, trans and
     descriptor. A (64 x 16) and D (64 x n) are spread over the threads as mma.sync's m16n8k16 spreads its
     16 rows over a warp, warp w holding rows 16 w .. 16 w + 15 (D: n / 8 tiles of 8 columns, 4 registers
     each); B (16 x n, bf16) is read from shared memory through the descriptor, as the PTX ISA lays out its
     canonical forms without swizzling: bits 0-13 the start address / 16, 16-29 the leading byte offset / 16
     (LBO: from one 8 x 8 core matrix to the next along K), 32-45 the stride byte offset / 16 (SBO: along
     N), the base offset (49-51) and the swizzle mode (62-63) 0, else it aborts. A core matrix is 8 rows of
     16 contiguous bytes, 128 contiguous bytes in all: B[k][n] at start + (n % 8) 16 + (n / 8) SBO + (k % 8)
     2 + (k / 8) LBO (trans 0: K-major, a column's 8 elements along K side by side), or at start + (n % 8) 2
     + (n / 8) SBO + (k % 8) 16 + (k / 8) LBO (trans 1: N-major, a row's 8 along N side by side). B is read
     when the first thread arrives (an operand another warp writes must be there before a barrier that
     comes earlier); D is computed when all have (each element c + the 16 products in order of k, in fp32,
     as tfm_emu_mma16816 sums: the products of bf16 values are exact), and a thread's registers d turn NaN
     until it waits for the product: tfm_emu_wgmma_commit() closes a group (wgmma.commit_group),
     tfm_emu_wgmma_wait() (wgmma.wait_group 0) completes every group committed. A product on registers
     whose earlier product is still pending adds to that one's result, as a GPU chains products on the same
     accumulators. A thread that returns with one pending aborts. Not modelled: wgmma.fence (a register
     written between products without one, and shared memory written without fence.proxy.async, pass here).
*/
static inline uint32_t tfm_emu_smem_addr(const void *p) {
    tfm_emu__state &g = tfm_emu__g;
    (void)tfm_emu__self("__cvta_generic_to_shared");
    if (!g.dyn || (uintptr_t)p < (uintptr_t)g.dyn || (uintptr_t)p >= (uintptr_t)g.dyn + g.dyn_bytes)
        tfm_emu__fatal("__cvta_generic_to_shared(%p): only the dynamic shared memory has shared addresses here", p);
    return (uint32_t)((uintptr_t)p - (uintptr_t)g.dyn);
}
static inline void tfm_emu_wgmma_fence(void) { (void)tfm_emu__self("wgmma.fence"); }
static inline void tfm_emu_wgmma_commit(void) {
    (void)tfm_emu__self("wgmma.commit_group");
    tfm_emu__g.wg_groups[tfm_emu__g.cur]++;
}
static inline void tfm_emu_wgmma_wait(void) {
    tfm_emu__state &g = tfm_emu__g;
    (void)tfm_emu__self("wgmma.wait_group");
    std::vector<tfm_emu__wg_pending> &q = g.wgp[g.cur];
    size_t k = 0;
    for (size_t i = 0; i < q.size(); i++) {
        if (q[i].group < g.wg_groups[g.cur]) memcpy(q[i].d, q[i].v, (size_t)q[i].n / 2 * sizeof(float));
        else q[k++] = q[i];
    }
    q.resize(k);
}
/* B's element (k, n) of the product at the stage's descriptor, read from the dynamic shared memory */
static inline uint16_t tfm_emu__wg_b(const tfm_emu__at &at, const tfm_emu__wg_stage &s, int k, int n, uint64_t d,
                                     int trans) {
    tfm_emu__state &g = tfm_emu__g;
    uint64_t start = (d & 0x3FFF) << 4, lbo = (d >> 16 & 0x3FFF) << 4, sbo = (d >> 32 & 0x3FFF) << 4;
    uint64_t off = start + (uint64_t)(n / 8) * sbo + (uint64_t)(k / 8) * lbo +
                   (trans ? (uint64_t)(n % 8) * 2 + (uint64_t)(k % 8) * 16 : (uint64_t)(n % 8) * 16 + (uint64_t)(k % 8) * 2);
    uint16_t v;
    (void)s;
    if (off + 2 > g.dyn_bytes)
        tfm_emu__fatal("%s:%d: wgmma: %s's element (%d, %d) lies at shared address %llu, past the %zu bytes of dynamic shared "
                       "memory (descriptor 0x%016llx)", at.file, at.line, d == s.desc_a && s.a_smem ? "A" : "B", k, n,
                       (unsigned long long)off, g.dyn_bytes, (unsigned long long)d);
    memcpy(&v, (const char *)g.dyn + off, 2);
    return v;
}
static inline void tfm_emu__wgmma(const tfm_emu__at &at, float *d, int n, const uint32_t *a, uint64_t desc_a, uint64_t desc,
                                  int trans) {
    tfm_emu__state &g = tfm_emu__g;
    (void)tfm_emu__self("wgmma.mma_async");
    tfm_emu__wg_stage &s = g.wg;
    int i = g.cur, first = g.n_sync == 0;
    if (g.nthreads != 128 || g.n_live != 128)
        tfm_emu__fatal("%s:%d: wgmma: the emulation runs warpgroup products in blocks of one warpgroup, 128 threads none "
                       "of which has returned (%d threads, %d live)", at.file, at.line, g.nthreads, g.n_live);
    if (n < 8 || n > 256 || n % 8 || ((desc | (a ? 0 : desc_a)) & (0x7ull << 49 | 0x3ull << 62)))
        tfm_emu__fatal("%s:%d: wgmma: n = %d (a multiple of 8 in [8, 256]), descriptor 0x%016llx (base offset and swizzle "
                       "must be 0 here)", at.file, at.line, n, (unsigned long long)(a ? desc : desc | desc_a));
    if (first) {
        s.file = at.file, s.line = at.line, s.n = n, s.trans = trans != 0, s.desc = desc, s.a_smem = !a, s.desc_a = a ? 0 : desc_a;
        for (int k = 0; k < 16; k++)
            for (int c = 0; c < n; c++) s.b[k][c] = tfm_emu__wg_b(at, s, k, c, desc, s.trans);
        for (int r = 0; !a && r < 64; r++)
            for (int k = 0; k < 16; k++) s.as[r][k] = tfm_emu__wg_b(at, s, k, r, desc_a, 0);
    } else if (s.n != n || s.trans != (trans != 0) || s.desc != desc || s.a_smem != !a || (!a && s.desc_a != desc_a))
        tfm_emu__fatal("%s:%d: wgmma: thread %d asks for n = %d, trans %d, descriptor 0x%016llx (A's 0x%016llx) where the "
                       "warpgroup's first asked for n = %d, trans %d, descriptor 0x%016llx (A's 0x%016llx)", at.file, at.line,
                       i, n, trans, (unsigned long long)desc, (unsigned long long)(a ? 0 : desc_a), s.n, s.trans,
                       (unsigned long long)s.desc, (unsigned long long)s.desc_a);
    if (a) memcpy(s.a[i], a, sizeof s.a[i]);
    memcpy(s.c[i], d, (size_t)n / 2 * sizeof(float));
    std::vector<tfm_emu__wg_pending> &q = g.wgp[i];
    for (size_t e = 0; e < q.size(); e++) /* chained on a pending product's registers: its result is C */
        if (q[e].d == d) {
            memcpy(s.c[i], q[e].v, (size_t)n / 2 * sizeof(float));
            q.erase(q.begin() + (long)e);
            break;
        }
    (void)tfm_emu__barrier(at.file, at.line, TFM_EMU__B_WGMMA, 0);
    if (s.left == 0) { /* the first past: D for the warpgroup */
        static float A[64][16], B[16][256], C[64][256];
        for (int t = 0; t < 128; t++) {
            int w = t >> 5, l = t & 31, r = 16 * w + (l >> 2), k = 2 * (l & 3);
            for (int h = 0; h < 2 && !s.a_smem; h++) {
                A[r][k + h] = tfm_emu__bf16_float((uint16_t)(s.a[t][0] >> 16 * h));
                A[r + 8][k + h] = tfm_emu__bf16_float((uint16_t)(s.a[t][1] >> 16 * h));
                A[r][k + 8 + h] = tfm_emu__bf16_float((uint16_t)(s.a[t][2] >> 16 * h));
                A[r + 8][k + 8 + h] = tfm_emu__bf16_float((uint16_t)(s.a[t][3] >> 16 * h));
            }
            for (int j = 0; j < s.n / 8; j++)
                for (int h = 0; h < 2; h++) C[r][8 * j + k + h] = s.c[t][4 * j + h], C[r + 8][8 * j + k + h] = s.c[t][4 * j + 2 + h];
        }
        for (int k = 0; k < 16; k++)
            for (int c = 0; c < s.n; c++) B[k][c] = tfm_emu__bf16_float(s.b[k][c]);
        for (int r = 0; s.a_smem && r < 64; r++)
            for (int k = 0; k < 16; k++) A[r][k] = tfm_emu__bf16_float(s.as[r][k]);
        for (int r = 0; r < 64; r++)
            for (int c = 0; c < s.n; c++)
                for (int k = 0; k < 16; k++) C[r][c] += A[r][k] * B[k][c];
        for (int t = 0; t < 128; t++) {
            int w = t >> 5, l = t & 31, r = 16 * w + (l >> 2), k = 2 * (l & 3);
            for (int j = 0; j < s.n / 8; j++)
                for (int h = 0; h < 2; h++) s.d[t][4 * j + h] = C[r][8 * j + k + h], s.d[t][4 * j + 2 + h] = C[r + 8][8 * j + k + h];
        }
        s.left = 128;
        g.wgmma++;
    }
    s.left--;
    tfm_emu__wg_pending p;
    p.d = d, p.n = n, p.group = g.wg_groups[i];
    memcpy(p.v, s.d[i], (size_t)n / 2 * sizeof(float));
    q.push_back(p);
    memset(d, 0xFF, (size_t)n / 2 * sizeof(float)); /* NaN until the thread waits */
}
#define tfm_emu_wgmma(d, n, a, desc, trans) tfm_emu__wgmma(tfm_emu__at{__FILE__, __LINE__}, d, n, a, 0, desc, trans)
#define tfm_emu_wgmma_ss(d, n, desc_a, desc, trans) \
    tfm_emu__wgmma(tfm_emu__at{__FILE__, __LINE__}, d, n, nullptr, desc_a, desc, trans)

/* ==== device built-ins: atomics, math, bit tricks ==== (blocks run one at a time: plain updates) */

#define TFM_EMU__ATOMICS(T)                                                                      \
    static inline T atomicAdd(T *p, T v) { T o = *p; *p = (T)(o + v); return o; }               \
    static inline T atomicExch(T *p, T v) { T o = *p; *p = v; return o; }                        \
    static inline T atomicMax(T *p, T v) { T o = *p; *p = o > v ? o : v; return o; }             \
    static inline T atomicMin(T *p, T v) { T o = *p; *p = o < v ? o : v; return o; }
TFM_EMU__ATOMICS(int)
TFM_EMU__ATOMICS(unsigned)
TFM_EMU__ATOMICS(unsigned long long)
TFM_EMU__ATOMICS(long long)
TFM_EMU__ATOMICS(float)
TFM_EMU__ATOMICS(double)
#define TFM_EMU__CAS(T) \
    static inline T atomicCAS(T *p, T cmp, T v) { T o = *p; if (o == cmp) *p = v; return o; }
TFM_EMU__CAS(int)
TFM_EMU__CAS(unsigned)
TFM_EMU__CAS(unsigned long long)
static inline int atomicSub(int *p, int v) { int o = *p; *p = o - v; return o; }
static inline unsigned atomicSub(unsigned *p, unsigned v) { unsigned o = *p; *p = o - v; return o; }

static inline void __threadfence(void) {}
static inline void __threadfence_block(void) {}
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
#define __expf(x) expf(x) /* glibc declares these names for itself: macros, not functions */
#define __logf(x) logf(x)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __powf(x, y) powf(x, y)
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; } /* NaN -> 0 */
static inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
static inline int __float_as_int(float x) { int i; memcpy(&i, &x, 4); return i; }
static inline unsigned __float_as_uint(float x) { unsigned i; memcpy(&i, &x, 4); return i; }
static inline float __int_as_float(int i) { float x; memcpy(&x, &i, 4); return x; }
static inline float __uint_as_float(unsigned i) { float x; memcpy(&x, &i, 4); return x; }
/* CUDA's 16-byte vector types, 16-byte aligned as there: a kernel's load or store through one at an address
   that is not is undefined behaviour here, which the sanitized runs (-fsanitize=undefined) report, as a GPU
   faults (misaligned address) */
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(16) float4 { float x, y, z, w; };
static inline long long __double_as_longlong(double x) { long long i; memcpy(&i, &x, 8); return i; }
static inline double __longlong_as_double(long long i) { double x; memcpy(&x, &i, 8); return x; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __ffs(int x) { return __builtin_ffs(x); }
template <class T> static inline T __ldg(const T *p) { return *p; }
/* min/max of device code, for any two arithmetic types (CUDA's overloads: the usual conversions) */
template <class A, class B>
using tfm_emu__common = typename std::enable_if<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value,
                                                typename std::common_type<A, B>::type>::type;
template <class A, class B, class R = tfm_emu__common<A, B>> static inline R min(A a, B b) {
    return (R)a < (R)b ? (R)a : (R)b;
}
template <class A, class B, class R = tfm_emu__common<A, B>> static inline R max(A a, B b) {
    return (R)a > (R)b ? (R)a : (R)b;
}

/* ==== kernel launch ==== */

template <class... P> struct tfm_emu__call {
    void (*k)(P...);
    std::tuple<P...> args;
};
template <class... P, size_t... I> static void tfm_emu__invoke_seq(tfm_emu__call<P...> *c, std::index_sequence<I...>) {
    c->k(std::get<I>(c->args)...); /* each thread gets its own copies */
}
template <class... P> static void tfm_emu__invoke(void *c) {
    tfm_emu__invoke_seq((tfm_emu__call<P...> *)c, std::index_sequence_for<P...>());
}
/* an argument becomes the parameter's type as in a call; a literal 0 or NULL may stand for a pointer */
template <class P, class A> static inline P tfm_emu__convert(A &&a, std::false_type) { return std::forward<A>(a); }
template <class P, class A> static inline P tfm_emu__convert(A &&a, std::true_type) {
    if (a != 0) tfm_emu__fatal("an integer other than 0 passed for a kernel's pointer parameter");
    return nullptr;
}
template <class P, class A>
using tfm_emu__int_for_ptr =
    std::integral_constant<bool, std::is_pointer<P>::value && std::is_integral<typename std::decay<A>::type>::value>;

/* the address a kernel argument would be dereferenced at (0 for non-pointers and function pointers) */
template <class T> static inline uintptr_t tfm_emu__addr(T *p) { return (uintptr_t)p; }
template <class R, class... A> static inline uintptr_t tfm_emu__addr(R (*)(A...)) { return 0; }
template <class T> static inline uintptr_t tfm_emu__addr(const T &) { return 0; }

static inline void tfm_emu__check_arg(const char *kernel, int i, int n, uintptr_t a) {
    const tfm_emu__alloc *al = tfm_emu__find((const void *)a, 0); /* inside a block or one past its end */
    if (!a || (al && !al->pinned)) return;
    fprintf(stderr,
            "tfm_emu: kernel %s, argument %d of %d: %p is not device memory (%s); on a GPU the kernel would fault\n",
            kernel, i + 1, n, (const void *)a,
            al ? "it is cudaMallocHost memory" : "not inside any live cudaMalloc block: a host pointer or a freed one");
    fflush(stderr);
    abort();
}
template <class... P, size_t... I>
static inline void tfm_emu__check_args(const char *kernel, const std::tuple<P...> &t, std::index_sequence<I...>) {
    int dummy[] = {0, (tfm_emu__check_arg(kernel, (int)I, (int)sizeof...(P), tfm_emu__addr(std::get<I>(t))), 0)...};
    (void)dummy;
}

/* validate the launch; false: it does not run (the last error says why) */
static inline bool tfm_emu__launch_ok(const char *kernel, uintptr_t k, dim3 grid, dim3 block, size_t smem,
                                      bool capture = false) {
    tfm_emu__state &g = tfm_emu__g;
    if (g.in_kernel)
        tfm_emu__fatal("kernel %s launched from inside a kernel (dynamic parallelism is not emulated)", kernel);
    if (capture) { /* an injected "launch" failure hits the kernel when it runs, not when it is captured */
        if (g.ndev == 0 || g.sticky) return tfm_emu__err(g.ndev ? g.sticky : (int)cudaErrorNoDevice), false;
    } else if (tfm_emu__enter("launch") != cudaSuccess)
        return false;
    auto lim = g.dyn_limit.find(k);
    size_t limit = lim != g.dyn_limit.end() && (size_t)lim->second > TFM_EMU__SMEM_STATIC ? (size_t)lim->second
                                                                                          : TFM_EMU__SMEM_STATIC;
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (threads < 1 || threads > 1024 || block.x > 1024 || block.y > 1024 || block.z > 64 || grid.x < 1 ||
        grid.x > 0x7fffffffu || grid.y < 1 || grid.y > 65535 || grid.z < 1 || grid.z > 65535 || smem > limit) {
        tfm_emu__err(cudaErrorInvalidConfiguration);
        return false;
    }
    g.kernel = kernel;
    g.gdim = grid;
    g.bdim = block;
    g.nthreads = (int)threads;
    g.dyn_bytes = smem;
    g.smem_limit = limit;
    return true;
}

template <class... P>
static inline void tfm_emu__run_call(const char *kernel, tfm_emu__call<P...> c, dim3 grid, dim3 block, size_t smem) {
    if (!tfm_emu__launch_ok(kernel, (uintptr_t)c.k, grid, block, smem)) return;
    tfm_emu__check_args(kernel, c.args, std::index_sequence_for<P...>());
    tfm_emu__g.invoke = &tfm_emu__invoke<P...>;
    tfm_emu__g.args = &c;
    tfm_emu__run_grid();
}
template <class... P, class... A>
static inline void tfm_emu__launch(const char *kernel, void (*k)(P...), cudaStream_t s, dim3 grid, dim3 block,
                                   size_t smem, A &&...a) {
    tfm_emu__call<P...> c = {
        k, std::tuple<P...>(tfm_emu__convert<P>(std::forward<A>(a), tfm_emu__int_for_ptr<P, A>())...)};
    if (!tfm_emu__stream_ok(s)) {
        tfm_emu__err(cudaErrorInvalidResourceHandle);
        return;
    }
    if (tfm_emu__recording(s, kernel)) { /* checked now, run when the graph runs */
        if (!tfm_emu__launch_ok(kernel, (uintptr_t)k, grid, block, smem, true)) return;
        tfm_emu__check_args(kernel, c.args, std::index_sequence_for<P...>());
        tfm_emu__record(0, (uintptr_t)k, 0, [kernel, c, grid, block, smem] { tfm_emu__run_call(kernel, c, grid, block, smem); });
        return;
    }
    tfm_emu__run_call(kernel, std::move(c), grid, block, smem);
}
/* tfm_emu_launch(kernel, stream, grid, block, smem_bytes, args...): what TFM__LAUNCH expands to */
#define tfm_emu_launch(k, ...) tfm_emu__launch(#k, k, __VA_ARGS__)

/* ==== runtime: errors, devices, attributes ==== */

static inline cudaError_t cudaGetLastError(void) {
    tfm_emu__state &g = tfm_emu__g;
    if (g.ndev == 0) return tfm_emu__err(cudaErrorNoDevice);
    if (g.sticky) return (cudaError_t)g.sticky;
    int e = g.last;
    g.last = 0;
    return (cudaError_t)e;
}
static inline cudaError_t cudaPeekAtLastError(void) {
    if (tfm_emu__g.ndev == 0) return tfm_emu__err(cudaErrorNoDevice);
    return (cudaError_t)(tfm_emu__g.sticky ? tfm_emu__g.sticky : tfm_emu__g.last);
}
static inline cudaError_t cudaGetDeviceCount(int *count) {
    int code = tfm_emu__g.ndev == 0 ? (int)cudaErrorNoDevice : tfm_emu__take_fault("cudaGetDeviceCount");
    if (!count) return tfm_emu__err(cudaErrorInvalidValue);
    *count = code ? 0 : tfm_emu__g.ndev;
    return tfm_emu__err(code);
}
static inline cudaError_t cudaGetDevice(int *d) {
    if (cudaError_t e = tfm_emu__enter("cudaGetDevice")) return e;
    if (!d) return tfm_emu__err(cudaErrorInvalidValue);
    *d = tfm_emu__g.dev;
    return cudaSuccess;
}
static inline cudaError_t cudaSetDevice(int d) {
    if (cudaError_t e = tfm_emu__enter("cudaSetDevice")) return e;
    if (d < 0 || d >= tfm_emu__g.ndev) return tfm_emu__err(cudaErrorInvalidDevice);
    tfm_emu__g.dev = d;
    return cudaSuccess;
}
static inline cudaError_t cudaDeviceSynchronize(void) {
    if (cudaError_t e = tfm_emu__enter("cudaDeviceSynchronize")) return e;
    if (cudaError_t e = tfm_emu__unsafe()) return e;
    tfm_emu__drain_all();
    return cudaSuccess;
}
static inline cudaError_t cudaRuntimeGetVersion(int *v) {
    if (!v) return tfm_emu__err(cudaErrorInvalidValue);
    *v = 12040;
    return cudaSuccess;
}
static inline cudaError_t cudaDriverGetVersion(int *v) { return cudaRuntimeGetVersion(v); }
static inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d) {
    if (cudaError_t e = tfm_emu__enter("cudaGetDeviceProperties")) return e;
    if (!p) return tfm_emu__err(cudaErrorInvalidValue);
    if (d < 0 || d >= tfm_emu__g.ndev) return tfm_emu__err(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "CPU emulation of CUDA");
    p->totalGlobalMem = tfm_emu__g.capacity;
    p->sharedMemPerBlock = TFM_EMU__SMEM_STATIC;
    p->sharedMemPerBlockOptin = TFM_EMU__SMEM_OPTIN;
    p->sharedMemPerMultiprocessor = 228 * 1024;
    p->totalConstMem = 64 * 1024;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = TFM_EMU__SMS;
    p->maxThreadsPerMultiProcessor = 2048;
    p->l2CacheSize = 50 << 20;
    p->unifiedAddressing = 1;
    return cudaSuccess;
}
static inline cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr attr, int d) {
    cudaDeviceProp p;
    if (cudaError_t e = tfm_emu__enter("cudaDeviceGetAttribute")) return e;
    if (!v) return tfm_emu__err(cudaErrorInvalidValue);
    if (cudaError_t e = cudaGetDeviceProperties(&p, d)) return e;
    switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *v = p.maxThreadsPerBlock; break;
    case cudaDevAttrMaxBlockDimX: *v = p.maxThreadsDim[0]; break;
    case cudaDevAttrMaxBlockDimY: *v = p.maxThreadsDim[1]; break;
    case cudaDevAttrMaxBlockDimZ: *v = p.maxThreadsDim[2]; break;
    case cudaDevAttrMaxGridDimX: *v = p.maxGridSize[0]; break;
    case cudaDevAttrMaxGridDimY: *v = p.maxGridSize[1]; break;
    case cudaDevAttrMaxGridDimZ: *v = p.maxGridSize[2]; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = (int)p.sharedMemPerBlock; break;
    case cudaDevAttrWarpSize: *v = p.warpSize; break;
    case cudaDevAttrMultiProcessorCount: *v = p.multiProcessorCount; break;
    case cudaDevAttrComputeCapabilityMajor: *v = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *v = p.minor; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = (int)p.sharedMemPerMultiprocessor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)p.sharedMemPerBlockOptin; break;
    default: return tfm_emu__err(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}
static inline cudaError_t tfm_emu__func_set(uintptr_t k, cudaFuncAttribute attr, int value) {
    if (cudaError_t e = tfm_emu__enter("cudaFuncSetAttribute")) return e;
    if (!k) return tfm_emu__err(cudaErrorInvalidDeviceFunction);
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || value > TFM_EMU__SMEM_OPTIN) return tfm_emu__err(cudaErrorInvalidValue);
        tfm_emu__g.dyn_limit[k] = value;
    } else if (attr != cudaFuncAttributePreferredSharedMemoryCarveout || value < -1 || value > 100) {
        return tfm_emu__err(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}
template <class F> static inline cudaError_t cudaFuncSetAttribute(F *kernel, cudaFuncAttribute attr, int value) {
    return tfm_emu__func_set((uintptr_t)kernel, attr, value);
}

/* ==== runtime: memory ==== */

static inline cudaError_t cudaMalloc(void **p, size_t n) {
    tfm_emu__state &g = tfm_emu__g;
    void *q = nullptr;
    if (cudaError_t e = tfm_emu__enter("cudaMalloc")) return e;
    if (cudaError_t e = tfm_emu__unsafe()) return e;
    if (!p) return tfm_emu__err(cudaErrorInvalidValue);
    *p = nullptr;
    if (n == 0) return cudaSuccess;
    if (n > g.capacity - (g.in_use < g.capacity ? g.in_use : g.capacity) || posix_memalign(&q, 256, n) != 0)
        return tfm_emu__err(cudaErrorMemoryAllocation);
    memset(q, 0xFF, n); /* poison: a read of device memory nobody wrote gives NaN */
    g.allocs[(uintptr_t)q] = tfm_emu__alloc{n, false};
    g.in_use += n;
    *p = q;
    return cudaSuccess;
}
template <class T> static inline cudaError_t cudaMalloc(T **p, size_t n) { return cudaMalloc((void **)p, n); }
static inline cudaError_t cudaMallocHost(void **p, size_t n) {
    void *q = nullptr;
    if (cudaError_t e = tfm_emu__enter("cudaMallocHost")) return e;
    if (cudaError_t e = tfm_emu__unsafe()) return e;
    if (!p) return tfm_emu__err(cudaErrorInvalidValue);
    *p = nullptr;
    if (n == 0) return cudaSuccess;
    if (posix_memalign(&q, 256, n) != 0) return tfm_emu__err(cudaErrorMemoryAllocation);
    tfm_emu__g.allocs[(uintptr_t)q] = tfm_emu__alloc{n, true};
    *p = q;
    return cudaSuccess;
}
template <class T> static inline cudaError_t cudaMallocHost(T **p, size_t n) { return cudaMallocHost((void **)p, n); }
static inline cudaError_t tfm_emu__free(const char *api, void *p, bool pinned) {
    if (cudaError_t e = tfm_emu__enter(api, true)) return e;
    if (cudaError_t e = tfm_emu__unsafe()) return e;
    if (!p) return tfm_emu__done();
    tfm_emu__drain_all(); /* (cudaFree waits for the device) */
    auto it = tfm_emu__g.allocs.find((uintptr_t)p);
    if (it == tfm_emu__g.allocs.end() || it->second.pinned != pinned) return tfm_emu__err(cudaErrorInvalidValue);
    if (!pinned) tfm_emu__g.in_use -= it->second.size;
    free((void *)it->first); /* == p */
    tfm_emu__g.allocs.erase(it);
    return tfm_emu__done();
}
static inline cudaError_t cudaFree(void *p) { return tfm_emu__free("cudaFree", p, false); }
static inline cudaError_t cudaFreeHost(void *p) { return tfm_emu__free("cudaFreeHost", p, true); }
static inline cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    tfm_emu__state &g = tfm_emu__g;
    if (cudaError_t e = tfm_emu__enter("cudaMemGetInfo")) return e;
    if (!free_bytes || !total) return tfm_emu__err(cudaErrorInvalidValue);
    *total = g.capacity;
    *free_bytes = g.in_use < g.capacity ? g.capacity - g.in_use : 0;
    return cudaSuccess;
}
static inline cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *at, const void *p) {
    if (cudaError_t e = tfm_emu__enter("cudaPointerGetAttributes")) return e;
    if (!at) return tfm_emu__err(cudaErrorInvalidValue);
    const tfm_emu__alloc *a = tfm_emu__find(p, 1);
    at->type = !a ? cudaMemoryTypeUnregistered : a->pinned ? cudaMemoryTypeHost : cudaMemoryTypeDevice;
    at->device = a ? tfm_emu__g.dev : cudaInvalidDeviceId;
    at->devicePointer = a ? (void *)p : nullptr;
    at->hostPointer = a && a->pinned ? (void *)p : nullptr;
    return cudaSuccess;
}

/* every copy: height rows of width bytes, checked as the runtime does */
static inline cudaError_t tfm_emu__copy(const char *api, void *dst, size_t dpitch, const void *src, size_t spitch,
                                        size_t width, size_t height, cudaMemcpyKind kind, cudaStream_t s,
                                        bool sync = false) {
    if (cudaError_t e = tfm_emu__enter(api)) return e;
    if (sync)
        if (cudaError_t e = tfm_emu__unsafe()) return e;
    if (!tfm_emu__stream_ok(s)) return tfm_emu__err(cudaErrorInvalidResourceHandle);
    if ((unsigned)kind > (unsigned)cudaMemcpyDefault) return tfm_emu__err(cudaErrorInvalidMemcpyDirection);
    if (dpitch < width || spitch < width) return tfm_emu__err(cudaErrorInvalidPitchValue);
    if (width == 0 || height == 0) return cudaSuccess;
    if (!dst || !src) return tfm_emu__err(cudaErrorInvalidValue);
    bool dd = tfm_emu__is_device(dst), sd = tfm_emu__is_device(src);
    bool want_dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool want_sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind != cudaMemcpyDefault && (dd != want_dd || sd != want_sd)) return tfm_emu__err(cudaErrorInvalidValue);
    if ((dd && !tfm_emu__device_range(dst, (height - 1) * dpitch + width)) ||
        (sd && !tfm_emu__device_range(src, (height - 1) * spitch + width)))
        return tfm_emu__err(cudaErrorInvalidValue);
    if (sync) tfm_emu__g.legacy_ops++;
    const tfm_emu__alloc *hd = dd ? tfm_emu__find(src, 1) : tfm_emu__find(dst, 1);
    if (!sync && !(dd && sd) && !(hd && hd->pinned) && !tfm_emu__legacy(s) && s != tfm_emu__g.cap) {
        /* pageable host memory on a non-blocking stream: CUDA stages it before the call returns; here it
           runs at the call, after the stream's queued work */
        tfm_emu__drain(s, SIZE_MAX);
    } else if (!sync && tfm_emu__recording(s, api)) {
        /* a captured copy reads its host side when the graph runs: it must be pinned (a pageable one
           would need the host to wait) */
        if (!(dd && sd) && !(hd && hd->pinned)) {
            tfm_emu__g.cap_bad = true;
            return tfm_emu__err(cudaErrorStreamCaptureUnsupported);
        }
        tfm_emu__record(1, 0, dd * 2 + sd, [=] {
            tfm_emu__copy(api, dst, dpitch, src, spitch, width, height, kind, nullptr);
        });
        return cudaSuccess;
    }
    for (size_t r = 0; r < height; r++) memmove((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
    tfm_emu__g.copies++;
    return cudaSuccess;
}
static inline cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind) {
    return tfm_emu__copy("cudaMemcpy", dst, n, src, n, n, 1, kind, nullptr, true);
}
static inline cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                                          cudaStream_t s = 0) {
    return tfm_emu__copy("cudaMemcpyAsync", dst, n, src, n, n, 1, kind, s);
}
static inline cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                       size_t height, cudaMemcpyKind kind) {
    return tfm_emu__copy("cudaMemcpy2D", dst, dpitch, src, spitch, width, height, kind, nullptr, true);
}
static inline cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                            size_t height, cudaMemcpyKind kind, cudaStream_t s = 0) {
    return tfm_emu__copy("cudaMemcpy2DAsync", dst, dpitch, src, spitch, width, height, kind, s);
}
static inline cudaError_t tfm_emu__memset(const char *api, void *p, int value, size_t n, cudaStream_t s,
                                          bool sync = false) {
    if (cudaError_t e = tfm_emu__enter(api)) return e;
    if (sync)
        if (cudaError_t e = tfm_emu__unsafe()) return e;
    if (!tfm_emu__stream_ok(s)) return tfm_emu__err(cudaErrorInvalidResourceHandle);
    if (n == 0) return cudaSuccess;
    if (!tfm_emu__device_range(p, n)) return tfm_emu__err(cudaErrorInvalidValue);
    if (sync) tfm_emu__g.legacy_ops++;
    if (!sync && tfm_emu__recording(s, api)) {
        tfm_emu__record(2, 0, 2, [=] { tfm_emu__memset(api, p, value, n, nullptr); });
        return cudaSuccess;
    }
    memset(p, value, n);
    tfm_emu__g.copies++;
    return cudaSuccess;
}
static inline cudaError_t cudaMemset(void *p, int value, size_t n) {
    return tfm_emu__memset("cudaMemset", p, value, n, nullptr, true);
}
static inline cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s = 0) {
    return tfm_emu__memset("cudaMemsetAsync", p, value, n, s);
}

/* ==== runtime: streams and events (a non-blocking stream's work runs when something waits for it) ==== */

static inline cudaError_t tfm_emu__stream_create(const char *api, cudaStream_t *s, unsigned flags) {
    if (cudaError_t e = tfm_emu__enter(api)) return e;
    if (!s || flags > 1) return tfm_emu__err(cudaErrorInvalidValue);
    *s = new CUstream_st();
    (*s)->flags = flags;
    tfm_emu__g.streams.insert(*s);
    return cudaSuccess;
}
static inline cudaError_t cudaStreamCreate(cudaStream_t *s) { return tfm_emu__stream_create("cudaStreamCreate", s, 0); }
static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    return tfm_emu__stream_create("cudaStreamCreateWithFlags", s, flags);
}
static inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (cudaError_t e = tfm_emu__enter("cudaStreamDestroy", true)) return e;
    if (s && s == tfm_emu__g.cap) tfm_emu__fatal("cudaStreamDestroy of stream %p while it captures", (void *)s);
    tfm_emu__drain(s, SIZE_MAX); /* (its work still runs) */
    if (!tfm_emu__g.streams.erase(s)) return tfm_emu__err(cudaErrorInvalidResourceHandle);
    delete s;
    return tfm_emu__done();
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    if (cudaError_t e = tfm_emu__enter("cudaStreamSynchronize")) return e;
    if (cudaError_t e = tfm_emu__unsafe()) return e;
    tfm_emu__drain(s, SIZE_MAX);
    return tfm_emu__stream_ok(s) ? cudaSuccess : tfm_emu__err(cudaErrorInvalidResourceHandle);
}
static inline cudaError_t cudaStreamQuery(cudaStream_t s) {
    if (cudaError_t e = tfm_emu__enter("cudaStreamQuery")) return e;
    if (s && s == tfm_emu__g.cap) return tfm_emu__unsafe();
    tfm_emu__drain(s, SIZE_MAX); /* (a GPU may say cudaErrorNotReady instead) */
    return tfm_emu__stream_ok(s) ? cudaSuccess : tfm_emu__err(cudaErrorInvalidResourceHandle);
}
static inline cudaError_t tfm_emu__event_create(const char *api, cudaEvent_t *ev, unsigned flags) {
    if (cudaError_t e = tfm_emu__enter(api)) return e;
    if (!ev || flags > 3) return tfm_emu__err(cudaErrorInvalidValue);
    *ev = new CUevent_st{flags, false, 0.0, nullptr, 0, 0};
    tfm_emu__g.events.insert(*ev);
    return cudaSuccess;
}
static inline cudaError_t cudaEventCreate(cudaEvent_t *ev) { return tfm_emu__event_create("cudaEventCreate", ev, 0); }
static inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned flags) {
    return tfm_emu__event_create("cudaEventCreateWithFlags", ev, flags);
}
static inline cudaError_t cudaEventDestroy(cudaEvent_t ev) {
    if (cudaError_t e = tfm_emu__enter("cudaEventDestroy", true)) return e;
    if (!tfm_emu__g.events.erase(ev)) return tfm_emu__err(cudaErrorInvalidResourceHandle);
    delete ev;
    return tfm_emu__done();
}
static inline cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s = 0) {
    if (cudaError_t e = tfm_emu__enter("cudaEventRecord")) return e;
    if (!tfm_emu__g.events.count(ev) || !tfm_emu__stream_ok(s)) return tfm_emu__err(cudaErrorInvalidResourceHandle);
    ev->recorded = true;
    ev->on = tfm_emu__legacy(s) ? nullptr : s;
    ev->mark = ev->on ? s->base + s->q.size() : 0;
    ev->ops = tfm_emu__g.legacy_ops;
    ev->ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
    return cudaSuccess;
}
static inline cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
    if (cudaError_t e = tfm_emu__enter("cudaEventSynchronize")) return e;
    if (cudaError_t e = tfm_emu__unsafe()) return e;
    if (!tfm_emu__g.events.count(ev)) return tfm_emu__err(cudaErrorInvalidResourceHandle);
    tfm_emu__drain(ev->on, ev->mark);
    return cudaSuccess;
}
static inline cudaError_t cudaEventQuery(cudaEvent_t ev) {
    if (cudaError_t e = tfm_emu__enter("cudaEventQuery")) return e;
    if (!tfm_emu__g.events.count(ev)) return tfm_emu__err(cudaErrorInvalidResourceHandle);
    tfm_emu__drain(ev->on, ev->mark); /* (a GPU may say cudaErrorNotReady instead) */
    return cudaSuccess;
}
static inline cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    if (cudaError_t e = tfm_emu__enter("cudaEventElapsedTime")) return e;
    if (!ms) return tfm_emu__err(cudaErrorInvalidValue);
    if (!tfm_emu__g.events.count(a) || !tfm_emu__g.events.count(b) || !a->recorded || !b->recorded ||
        ((a->flags | b->flags) & cudaEventDisableTiming))
        return tfm_emu__err(cudaErrorInvalidResourceHandle);
    *ms = (float)(b->ms - a->ms);
    return cudaSuccess;
}
static inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned flags = 0) {
    if (cudaError_t e = tfm_emu__enter("cudaStreamWaitEvent")) return e;
    if (!tfm_emu__stream_ok(s) || !tfm_emu__g.events.count(ev)) return tfm_emu__err(cudaErrorInvalidResourceHandle);
    if (flags) return tfm_emu__err(cudaErrorInvalidValue);
    /* the work before ev runs now (s's later work, queued or not, comes after it); a non-blocking stream
       waiting for the legacy stream's event follows the legacy work before it */
    tfm_emu__drain(ev->on, ev->mark);
    if (!ev->on && !tfm_emu__legacy(s) && ev->ops > s->after) s->after = ev->ops;
    return cudaSuccess;
}

/* ==== runtime: stream capture and graphs ====
   A capturing stream's kernels, copies, memsets and cuBLAS calls are checked at the call and kept, not
   run; cudaGraphLaunch runs them in order (a chain: the one stream's order). While a stream captures,
   the calls that allocate, free or wait fail with cudaErrorStreamCaptureUnsupported and break the
   capture (cudaStreamEndCapture then fails with cudaErrorStreamCaptureInvalidated), as do copies to or
   from pageable host memory on the capturing stream; work queued on the legacy stream aborts (on a GPU
   it would run before the captured work). One stream captures at a time. cudaGraphExecUpdate takes a
   graph of the same operations (kind, kernel, a copy's memory kinds) and their new arguments. */

typedef struct CUgraph_st *cudaGraph_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef struct CUgraphNode_st *cudaGraphNode_t;
enum cudaStreamCaptureMode : int {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2
};
enum cudaStreamCaptureStatus : int {
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2
};
enum cudaGraphExecUpdateResult : int {
    cudaGraphExecUpdateSuccess = 0,
    cudaGraphExecUpdateError = 1,
    cudaGraphExecUpdateErrorTopologyChanged = 2,
    cudaGraphExecUpdateErrorNodeTypeChanged = 3,
    cudaGraphExecUpdateErrorFunctionChanged = 4,
    cudaGraphExecUpdateErrorParametersChanged = 5
};
struct cudaGraphExecUpdateResultInfo {
    enum cudaGraphExecUpdateResult result;
    cudaGraphNode_t errorNode, errorFromNode;
};

static inline cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode) {
    tfm_emu__state &g = tfm_emu__g;
    if (cudaError_t e = tfm_emu__enter("cudaStreamBeginCapture")) return e;
    if ((unsigned)mode > cudaStreamCaptureModeRelaxed) return tfm_emu__err(cudaErrorInvalidValue);
    if (!s || s == cudaStreamLegacy || s == cudaStreamPerThread) return tfm_emu__err(cudaErrorStreamCaptureUnsupported);
    if (!g.streams.count(s)) return tfm_emu__err(cudaErrorInvalidResourceHandle);
    if (g.cap) return tfm_emu__err(cudaErrorIllegalState); /* one at a time here */
    g.cap = s;
    g.cap_bad = false;
    g.cap_nodes.clear();
    return cudaSuccess;
}
static inline cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph) {
    tfm_emu__state &g = tfm_emu__g;
    if (!graph) return tfm_emu__err(cudaErrorInvalidValue);
    *graph = nullptr;
    if (!s || s != g.cap) return tfm_emu__err(g.cap ? cudaErrorStreamCaptureUnmatched : cudaErrorIllegalState);
    g.cap = nullptr;
    int code = tfm_emu__take_fault("cudaStreamEndCapture");
    if (g.cap_bad || code || g.sticky) {
        g.cap_nodes.clear();
        return tfm_emu__err(code ? code : g.sticky ? g.sticky : (int)cudaErrorStreamCaptureInvalidated);
    }
    *graph = new CUgraph_st{std::move(g.cap_nodes)};
    g.cap_nodes.clear();
    g.graphs.insert(*graph);
    return cudaSuccess;
}
static inline cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status) {
    if (cudaError_t e = tfm_emu__enter("cudaStreamIsCapturing")) return e;
    if (!status) return tfm_emu__err(cudaErrorInvalidValue);
    if (!tfm_emu__stream_ok(s)) return tfm_emu__err(cudaErrorInvalidResourceHandle);
    *status = s && s == tfm_emu__g.cap ? (tfm_emu__g.cap_bad ? cudaStreamCaptureStatusInvalidated
                                                             : cudaStreamCaptureStatusActive)
                                       : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}
static inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags = 0) {
    if (cudaError_t e = tfm_emu__enter("cudaGraphInstantiate")) return e;
    if (!exec || !tfm_emu__g.graphs.count(graph) || flags) return tfm_emu__err(cudaErrorInvalidValue);
    *exec = new CUgraphExec_st{graph->nodes};
    tfm_emu__g.execs.insert(*exec);
    return cudaSuccess;
}
static inline cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph,
                                              cudaGraphExecUpdateResultInfo *info) {
    if (info) *info = cudaGraphExecUpdateResultInfo{cudaGraphExecUpdateError, nullptr, nullptr};
    if (cudaError_t e = tfm_emu__enter("cudaGraphExecUpdate")) return e;
    if (!info || !tfm_emu__g.execs.count(exec) || !tfm_emu__g.graphs.count(graph))
        return tfm_emu__err(cudaErrorInvalidValue);
    const std::vector<tfm_emu__node> &a = exec->nodes, &b = graph->nodes;
    enum cudaGraphExecUpdateResult r = cudaGraphExecUpdateSuccess;
    if (a.size() != b.size()) r = cudaGraphExecUpdateErrorTopologyChanged;
    for (size_t i = 0; !r && i < a.size(); i++)
        if (a[i].kind != b[i].kind) r = cudaGraphExecUpdateErrorNodeTypeChanged;
        else if (a[i].mem != b[i].mem) r = cudaGraphExecUpdateErrorParametersChanged;
    info->result = r;
    if (r) return tfm_emu__err(cudaErrorGraphExecUpdateFailure);
    exec->nodes = b;
    return cudaSuccess;
}
static inline cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
    tfm_emu__state &g = tfm_emu__g;
    if (cudaError_t e = tfm_emu__enter("cudaGraphLaunch")) return e;
    if (!g.execs.count(exec)) return tfm_emu__err(cudaErrorInvalidValue);
    if (!tfm_emu__stream_ok(s)) return tfm_emu__err(cudaErrorInvalidResourceHandle);
    if (!tfm_emu__legacy(s) && s != g.cap) tfm_emu__drain(s, SIZE_MAX); /* a non-blocking stream: at the call, after its queue */
    else if (tfm_emu__recording(s, "cudaGraphLaunch")) return tfm_emu__unsafe(); /* inside a capture: not emulated */
    int first = 0, was = g.last;
    g.graph_launches++;
    g.replaying = true;
    g.last = 0;
    for (const tfm_emu__node &n : exec->nodes) {
        n.run();
        if (!first) first = g.last;
    }
    g.replaying = false;
    g.last = first ? first : was;
    return (cudaError_t)(g.sticky ? g.sticky : first); /* the first operation that failed says why */
}
static inline cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    if (cudaError_t e = tfm_emu__enter("cudaGraphDestroy", true)) return e;
    if (!tfm_emu__g.graphs.erase(graph)) return tfm_emu__err(cudaErrorInvalidValue);
    delete graph;
    return tfm_emu__done();
}
/* The number of a graph's nodes (nodes: NULL; handles to them are not emulated). */
static inline cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *num) {
    if (cudaError_t e = tfm_emu__enter("cudaGraphGetNodes")) return e;
    if (!num || nodes || !tfm_emu__g.graphs.count(graph)) return tfm_emu__err(cudaErrorInvalidValue);
    *num = graph->nodes.size();
    return cudaSuccess;
}
static inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    if (cudaError_t e = tfm_emu__enter("cudaGraphExecDestroy", true)) return e;
    if (!tfm_emu__g.execs.erase(exec)) return tfm_emu__err(cudaErrorInvalidValue);
    delete exec;
    return tfm_emu__done();
}

/* ==== cuBLAS: column-major products through tfm_sgemm ==== */

#define TFM_EMU__BLAS_STATUS(X)                                                                      \
    X(CUBLAS_STATUS_SUCCESS, 0, "success")                                                           \
    X(CUBLAS_STATUS_NOT_INITIALIZED, 1, "the library was not initialized")                           \
    X(CUBLAS_STATUS_ALLOC_FAILED, 3, "the resource allocation failed")                               \
    X(CUBLAS_STATUS_INVALID_VALUE, 7, "an invalid numeric value was used as an argument")            \
    X(CUBLAS_STATUS_ARCH_MISMATCH, 8, "an absent device architectural feature is required")          \
    X(CUBLAS_STATUS_MAPPING_ERROR, 11, "an access to GPU memory space failed")                       \
    X(CUBLAS_STATUS_EXECUTION_FAILED, 13, "the GPU program failed to execute")                       \
    X(CUBLAS_STATUS_INTERNAL_ERROR, 14, "an internal operation failed")                              \
    X(CUBLAS_STATUS_NOT_SUPPORTED, 15, "the functionality requested is not supported")               \
    X(CUBLAS_STATUS_LICENSE_ERROR, 16, "the functionality requested requires some license and an "   \
                                       "error was detected when trying to check the current licensing")
typedef enum cublasStatus_t : int { TFM_EMU__BLAS_STATUS(TFM_EMU__ENUM) } cublasStatus_t;
typedef enum cublasOperation_t : int { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;
typedef enum cublasMath_t : int {
    CUBLAS_DEFAULT_MATH = 0,
    CUBLAS_TENSOR_OP_MATH = 1,
    CUBLAS_PEDANTIC_MATH = 2,
    CUBLAS_TF32_TENSOR_OP_MATH = 3,
    CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16
} cublasMath_t;
typedef struct cublasContext *cublasHandle_t;
/* the element types and compute types of cublasGemmEx that the emulation serves (library_types.h, cublas_api.h) */
typedef enum cudaDataType_t : int { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType_t;
typedef cudaDataType_t cudaDataType;
typedef enum cublasComputeType_t : int { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77 } cublasComputeType_t;
typedef enum cublasGemmAlgo_t : int { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

static inline const char *cublasGetStatusString(cublasStatus_t e) {
    TFM_EMU__BLAS_STATUS(TFM_EMU__TEXT)
    return "unknown error";
}
static inline const char *cublasGetStatusName(cublasStatus_t e) {
    TFM_EMU__BLAS_STATUS(TFM_EMU__NAME)
    return "<unknown>";
}

/* the prologue of every cuBLAS call on a handle */
static inline cublasStatus_t tfm_emu__blas_enter(const char *api, cublasHandle_t h) {
    if (tfm_emu__g.ndev == 0 || !tfm_emu__g.handles.count(h)) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (int code = tfm_emu__take_fault(api)) return (cublasStatus_t)code;
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasCreate(cublasHandle_t *h) {
    if (!h) return CUBLAS_STATUS_INVALID_VALUE;
    if (tfm_emu__g.ndev == 0 || tfm_emu__g.sticky) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (int code = tfm_emu__take_fault("cublasCreate")) return (cublasStatus_t)code;
    *h = new cublasContext{nullptr, CUBLAS_DEFAULT_MATH, nullptr, 0};
    tfm_emu__g.handles.insert(*h);
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasDestroy(cublasHandle_t h) {
    if (cublasStatus_t s = tfm_emu__blas_enter("cublasDestroy", h)) return s;
    tfm_emu__g.handles.erase(h);
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    if (cublasStatus_t st = tfm_emu__blas_enter("cublasSetStream", h)) return st;
    if (!tfm_emu__stream_ok(s)) return CUBLAS_STATUS_INVALID_VALUE;
    h->stream = s;
    h->ws = nullptr; /* as cuBLAS: back to its own work space */
    h->ws_bytes = 0;
    return CUBLAS_STATUS_SUCCESS;
}
/* the handle's work space from now on (its kernels' scratch; nothing here needs it) */
static inline cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes) {
    if (cublasStatus_t st = tfm_emu__blas_enter("cublasSetWorkspace", h)) return st;
    if (bytes && !tfm_emu__device_range(ws, bytes)) return CUBLAS_STATUS_INVALID_VALUE;
    h->ws = ws;
    h->ws_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasGetStream(cublasHandle_t h, cudaStream_t *s) {
    if (cublasStatus_t st = tfm_emu__blas_enter("cublasGetStream", h)) return st;
    if (!s) return CUBLAS_STATUS_INVALID_VALUE;
    *s = h->stream;
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t mode) {
    if (cublasStatus_t st = tfm_emu__blas_enter("cublasSetMathMode", h)) return st;
    if ((mode & ~CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION) > CUBLAS_TF32_TENSOR_OP_MATH)
        return CUBLAS_STATUS_INVALID_VALUE;
    h->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasGetMathMode(cublasHandle_t h, cublasMath_t *mode) {
    if (cublasStatus_t st = tfm_emu__blas_enter("cublasGetMathMode", h)) return st;
    if (!mode) return CUBLAS_STATUS_INVALID_VALUE;
    *mode = (cublasMath_t)h->math;
    return CUBLAS_STATUS_SUCCESS;
}

/* float -> TF32: keep 10 mantissa bits, round to nearest even */
static inline float tfm_emu__tf32(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0xfffu + ((u >> 13) & 1u)) & 0xffffe000u;
    memcpy(&x, &u, 4);
    return x;
}
/* a column-major rows x cols matrix of `elem`-byte elements with leading dimension ld must lie inside one
   device block */
static inline void tfm_emu__check_matrix(const char *api, const char *name, const void *p, int rows, int cols, int ld,
                                         size_t elem = sizeof(float)) {
    size_t bytes = ((size_t)(cols - 1) * (size_t)ld + (size_t)rows) * elem;
    if (rows <= 0 || cols <= 0 || tfm_emu__device_range(p, bytes)) return;
    tfm_emu__fatal("%s: %s = %p (%d x %d, leading dimension %d, %zu bytes) is %s", api, name, (const void *)p, rows,
                   cols, ld, bytes,
                   tfm_emu__is_device(p) ? "not inside its cudaMalloc block: it runs past the end"
                                         : "not device memory: a GPU would fault");
}
/* the column-major rows x cols matrix at p (bf16: 16-bit elements, each a float's upper half) as floats with
   the same leading dimension */
static inline void tfm_emu__widen(std::vector<float> &out, const void *p, bool bf16, int rows, int cols, int ld) {
    size_t n = (size_t)(cols - 1) * ld + rows;
    if (!bf16) {
        out.assign((const float *)p, (const float *)p + n);
        return;
    }
    out.resize(n);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
        memcpy(&out[i], &u, 4);
    }
}
/* C = alpha op(A) op(B) + beta C, column-major, `batch` times with the strides (in elements); A and B are
   fp32 or (bf16 set: cublasGemmEx with CUDA_R_16BF) bf16, whose products are exact in fp32 */
static inline cublasStatus_t tfm_emu__gemm(const char *api, cublasHandle_t h, cublasOperation_t ta,
                                           cublasOperation_t tb, int m, int n, int k, const float *alpha,
                                           const void *A, int lda, long long sA, const void *B, int ldb, long long sB,
                                           const float *beta, float *C, int ldc, long long sC, int batch,
                                           bool bf16 = false, int tf32_sums = -1) {
    if (cublasStatus_t st = tfm_emu__blas_enter(api, h)) return st;
    if (tfm_emu__g.sticky) return CUBLAS_STATUS_EXECUTION_FAILED;
    if ((unsigned)ta > CUBLAS_OP_C || (unsigned)tb > CUBLAS_OP_C || m < 0 || n < 0 || k < 0 || batch < 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m; /* A and B as stored */
    int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
    if (lda < (ar > 1 ? ar : 1) || ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1) || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (tfm_emu__is_device(alpha) || tfm_emu__is_device(beta))
        tfm_emu__fatal("%s: alpha or beta is device memory, but the pointer mode is host", api);
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
    if (tfm_emu__recording(h->stream, api)) {
        /* alpha and beta are read now, the matrices when the graph runs, in this call's math mode */
        float al = *alpha, be = *beta;
        tfm_emu__record_blas(api, h, [=] {
            tfm_emu__gemm(api, h, ta, tb, m, n, k, &al, A, lda, sA, B, ldb, sB, &be, C, ldc, sC, batch, bf16, tf32_sums);
        });
        return CUBLAS_STATUS_SUCCESS;
    }
    bool scale_only = *alpha == 0.0f || k == 0; /* cuBLAS reads neither A nor B then */
    size_t es = bf16 ? 2 : sizeof(float);
    for (int i = 0; i < batch; i++) {
        tfm_emu__check_matrix(api, "C", C + i * sC, m, n, ldc);
        if (scale_only) continue;
        tfm_emu__check_matrix(api, "A", (const char *)A + i * sA * es, ar, ac, lda, es);
        tfm_emu__check_matrix(api, "B", (const char *)B + i * sB * es, br, bc, ldb, es);
    }
    bool tf32 = !bf16 && (tf32_sums >= 0 ? tf32_sums == 1 : (h->math & 15) == CUBLAS_TF32_TENSOR_OP_MATH);
    std::vector<float> ta32, tb32;
    for (int i = 0; i < batch; i++) {
        const float *a = (const float *)((const char *)A + i * sA * es), *b = (const float *)((const char *)B + i * sB * es);
        float *c = C + i * sC;
        if (scale_only) {
            for (int j = 0; j < n; j++)
                for (int r = 0; r < m; r++)
                    c[(size_t)j * ldc + r] = *beta == 0.0f ? 0.0f : *beta * c[(size_t)j * ldc + r];
            continue;
        }
        if (tf32 || bf16) {
            tfm_emu__widen(ta32, a, bf16, ar, ac, lda);
            tfm_emu__widen(tb32, b, bf16, br, bc, ldb);
            if (tf32) {
                for (float &x : ta32) x = tfm_emu__tf32(x);
                for (float &x : tb32) x = tfm_emu__tf32(x);
            }
            a = ta32.data();
            b = tb32.data();
        }
        /* column-major C = op(A) op(B) is row-major C^T = op(B)^T op(A)^T */
        if (tfm_sgemm(tb != CUBLAS_OP_N, ta != CUBLAS_OP_N, n, m, k, *alpha, b, ldb, a, lda, *beta, c, ldc) != TFM_OK)
            return CUBLAS_STATUS_INTERNAL_ERROR;
    }
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                         int k, const float *alpha, const float *A, int lda, const float *B, int ldb,
                                         const float *beta, float *C, int ldc) {
    return tfm_emu__gemm("cublasSgemm", h, ta, tb, m, n, k, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}
static inline cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                                       int m, int n, int k, const float *alpha, const float *A, int lda,
                                                       long long sA, const float *B, int ldb, long long sB,
                                                       const float *beta, float *C, int ldc, long long sC, int batch) {
    return tfm_emu__gemm("cublasSgemmStridedBatched", h, ta, tb, m, n, k, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc,
                         sC, batch);
}
/* cublasGemmEx and its strided batch for what the header asks: A and B both CUDA_R_32F or both CUDA_R_16BF, C
   CUDA_R_32F, fp32 alpha, beta and sums (CUBLAS_COMPUTE_32F); anything else is CUBLAS_STATUS_NOT_SUPPORTED
   here (cuBLAS serves more). */
static inline cublasStatus_t tfm_emu__gemm_ex(const char *api, cublasHandle_t h, cublasOperation_t ta,
                                              cublasOperation_t tb, int m, int n, int k, const void *alpha,
                                              const void *A, cudaDataType at, int lda, long long sA, const void *B,
                                              cudaDataType bt, int ldb, long long sB, const void *beta, void *C,
                                              cudaDataType ct, int ldc, long long sC, int batch,
                                              cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    if (at != bt || (at != CUDA_R_32F && at != CUDA_R_16BF) || ct != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F ||
        algo != CUBLAS_GEMM_DEFAULT) {
        if (cublasStatus_t st = tfm_emu__blas_enter(api, h)) return st;
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    tfm_emu__g.gemm_ex_bf16 += at == CUDA_R_16BF;
    return tfm_emu__gemm(api, h, ta, tb, m, n, k, (const float *)alpha, A, lda, sA, B, ldb, sB, (const float *)beta,
                         (float *)C, ldc, sC, batch, at == CUDA_R_16BF);
}
static inline cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType at, int lda,
                                          const void *B, cudaDataType bt, int ldb, const void *beta, void *C,
                                          cudaDataType ct, int ldc, cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    return tfm_emu__gemm_ex("cublasGemmEx", h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0,
                            1, compute, algo);
}
/* cublasGemmBatchedEx: the batch's pointers in device arrays */
static inline cublasStatus_t cublasGemmBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                                                 int n, int k, const void *alpha, const void *const A[], cudaDataType at,
                                                 int lda, const void *const B[], cudaDataType bt, int ldb,
                                                 const void *beta, void *const C[], cudaDataType ct, int ldc, int batch,
                                                 cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    if (batch < 0) return CUBLAS_STATUS_INVALID_VALUE;
    for (const void *arr : {(const void *)A, (const void *)B, (const void *)C})
        if (batch > 0 && !tfm_emu__device_range(arr, (size_t)batch * sizeof(void *)))
            tfm_emu__fatal("cublasGemmBatchedEx: a pointer array (%p, %d entries) is not device memory", arr, batch);
    if (batch > 0 && tfm_emu__recording(h->stream, "cublasGemmBatchedEx")) {
        /* the pointer arrays are device memory: read when the graph runs */
        if (cublasStatus_t st = tfm_emu__blas_enter("cublasGemmBatchedEx", h)) return st;
        float al = *(const float *)alpha, be = *(const float *)beta;
        tfm_emu__record_blas("cublasGemmBatchedEx", h, [=] {
            cublasGemmBatchedEx(h, ta, tb, m, n, k, &al, A, at, lda, B, bt, ldb, &be, C, ct, ldc, batch, compute, algo);
        });
        return CUBLAS_STATUS_SUCCESS;
    }
    for (int i = 0; i < batch; i++)
        if (cublasStatus_t st = tfm_emu__gemm_ex("cublasGemmBatchedEx", h, ta, tb, m, n, k, alpha, A[i], at, lda, 0, B[i],
                                                 bt, ldb, 0, beta, C[i], ct, ldc, 0, 1, compute, algo))
            return st;
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
                                                        int m, int n, int k, const void *alpha, const void *A,
                                                        cudaDataType at, int lda, long long sA, const void *B,
                                                        cudaDataType bt, int ldb, long long sB, const void *beta,
                                                        void *C, cudaDataType ct, int ldc, long long sC, int batch,
                                                        cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    return tfm_emu__gemm_ex("cublasGemmStridedBatchedEx", h, ta, tb, m, n, k, alpha, A, at, lda, sA, B, bt, ldb, sB, beta,
                            C, ct, ldc, sC, batch, compute, algo);
}

/* ==== cuBLASLt: one product with a bias epilogue ====
   What the header asks of it: D = alpha op(A) op(B) (+ bias, CUBLASLT_EPILOGUE_BIAS: D's rows long, added
   to every column), beta 0, C and D the same matrix with one layout, column-major layouts of one matrix,
   A and B both CUDA_R_32F or both CUDA_R_16BF, C and D CUDA_R_32F (or, with bf16 A and B, CUDA_R_16BF: the
   fp32 result rounded to nearest even once), the bias CUDA_R_32F, scale type CUDA_R_32F,
   compute CUBLAS_COMPUTE_32F or CUBLAS_COMPUTE_32F_FAST_TF32. Anything else: the heuristic offers no
   algorithm (CUBLAS_STATUS_NOT_SUPPORTED), as cuBLASLt may. The bias is added in fp32 to the fp32 sums:
   here as D filled with it and a product with beta 1 (the header's own way without cuBLASLt: the same
   bits here; a GPU's epilogue adds once to its own sums). The heuristic's algorithm keeps the alignments
   it was picked for (the preference's, 256 bytes unless set, and the bias pointer's in the descriptor, as
   cuBLASLt's heuristic reads them): a product run with a less aligned pointer aborts, as a GPU's kernel
   may fault on it. The descriptors are host objects (new and delete: AddressSanitizer sees a leak). */
struct cublasLtContext { cublasContext blas; }; /* its products run through the cuBLAS emulation's */
typedef struct cublasLtContext *cublasLtHandle_t;
typedef enum cublasLtMatmulDescAttributes_t : int {
    CUBLASLT_MATMUL_DESC_TRANSA = 3,
    CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
    CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26
} cublasLtMatmulDescAttributes_t;
typedef enum cublasLtEpilogue_t : int { CUBLASLT_EPILOGUE_DEFAULT = 1, CUBLASLT_EPILOGUE_BIAS = 4 } cublasLtEpilogue_t;
typedef enum cublasLtMatmulPreferenceAttributes_t : int {
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8
} cublasLtMatmulPreferenceAttributes_t;
struct tfm_emu__lt_desc {
    int compute, scale, ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void *bias = nullptr;
    int32_t bias_type = -1;
};
struct tfm_emu__lt_layout { int type; uint64_t rows, cols; int64_t ld; };
struct tfm_emu__lt_pref { uint64_t ws = 0; uint32_t align[4] = {256, 256, 256, 256}; };
typedef tfm_emu__lt_desc *cublasLtMatmulDesc_t;
typedef tfm_emu__lt_layout *cublasLtMatrixLayout_t;
typedef tfm_emu__lt_pref *cublasLtMatmulPreference_t;
typedef struct { uint64_t data[8]; } cublasLtMatmulAlgo_t;
typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;
#define TFM_EMU__LT_ALGO 0x746c2d656d75ull /* the emulation's one algorithm, in data[0] */

static inline cublasStatus_t tfm_emu__lt_enter(const char *api, cublasLtHandle_t h) {
    return tfm_emu__blas_enter(api, h ? &h->blas : nullptr);
}
static inline cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    if (!h) return CUBLAS_STATUS_INVALID_VALUE;
    if (tfm_emu__g.ndev == 0 || tfm_emu__g.sticky) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (int code = tfm_emu__take_fault("cublasLtCreate")) return (cublasStatus_t)code;
    *h = new cublasLtContext{{nullptr, CUBLAS_DEFAULT_MATH, nullptr, 0}};
    tfm_emu__g.handles.insert(&(*h)->blas);
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    if (cublasStatus_t s = tfm_emu__lt_enter("cublasLtDestroy", h)) return s;
    tfm_emu__g.handles.erase(&h->blas);
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute,
                                                      cudaDataType_t scale) {
    if (!d) return CUBLAS_STATUS_INVALID_VALUE;
    if (int code = tfm_emu__take_fault("cublasLtMatmulDescCreate")) return (cublasStatus_t)code;
    *d = new tfm_emu__lt_desc();
    (*d)->compute = compute;
    (*d)->scale = scale;
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}
/* an attribute's value of the size its type has (as cuBLASLt checks sizeInBytes) */
template <typename T> static inline bool tfm_emu__lt_attr(T *to, const void *buf, size_t size) {
    if (!buf || size != sizeof(T)) return false;
    memcpy(to, buf, sizeof(T));
    return true;
}
static inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a,
                                                            const void *buf, size_t size) {
    int32_t v = 0;
    bool ok;
    if (!d) return CUBLAS_STATUS_INVALID_VALUE;
    switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
        if ((ok = tfm_emu__lt_attr(&v, buf, size) && (v == CUBLAS_OP_N || v == CUBLAS_OP_T)))
            (a == CUBLASLT_MATMUL_DESC_TRANSA ? d->ta : d->tb) = v;
        break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: ok = tfm_emu__lt_attr(&d->epilogue, buf, size); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: ok = tfm_emu__lt_attr(&d->bias, buf, size); break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: ok = tfm_emu__lt_attr(&d->bias_type, buf, size); break;
    default: ok = false;
    }
    return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}
static inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows,
                                                        uint64_t cols, int64_t ld) {
    if (!l) return CUBLAS_STATUS_INVALID_VALUE;
    if (int code = tfm_emu__take_fault("cublasLtMatrixLayoutCreate")) return (cublasStatus_t)code;
    *l = new tfm_emu__lt_layout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    if (!p) return CUBLAS_STATUS_INVALID_VALUE;
    *p = new tfm_emu__lt_pref();
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                                  cublasLtMatmulPreferenceAttributes_t a,
                                                                  const void *buf, size_t size) {
    bool ok;
    if (!p) return CUBLAS_STATUS_INVALID_VALUE;
    if (a == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES)
        ok = tfm_emu__lt_attr(&p->ws, buf, size);
    else if (a >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && a <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES)
        ok = tfm_emu__lt_attr(&p->align[a - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, size);
    else
        ok = false;
    return ok ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}
/* The largest power of two up to 256 that divides p's address */
static inline uint32_t tfm_emu__lt_align(const void *p) {
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a) a >>= 1;
    return a;
}
/* Whether the product is one the emulation serves (see above); m, n, k its sizes */
static inline bool tfm_emu__lt_served(const tfm_emu__lt_desc *d, const tfm_emu__lt_layout *A,
                                      const tfm_emu__lt_layout *B, const tfm_emu__lt_layout *C,
                                      const tfm_emu__lt_layout *D, int *m, int *n, int *k) {
    uint64_t am = d->ta == CUBLAS_OP_N ? A->rows : A->cols, ak = d->ta == CUBLAS_OP_N ? A->cols : A->rows;
    uint64_t bk = d->tb == CUBLAS_OP_N ? B->rows : B->cols, bn = d->tb == CUBLAS_OP_N ? B->cols : B->rows;
    if (A->type != B->type || (A->type != CUDA_R_32F && A->type != CUDA_R_16BF) || C->type != D->type ||
        (D->type != CUDA_R_32F && !(D->type == CUDA_R_16BF && A->type == CUDA_R_16BF)) || d->scale != CUDA_R_32F ||
        (d->compute != CUBLAS_COMPUTE_32F && !(d->compute == CUBLAS_COMPUTE_32F_FAST_TF32 && A->type == CUDA_R_32F)) ||
        (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT && d->epilogue != CUBLASLT_EPILOGUE_BIAS) ||
        (d->bias_type != -1 && d->bias_type != CUDA_R_32F))
        return false;
    if (ak != bk || am != D->rows || bn != D->cols || C->rows != D->rows || C->cols != D->cols || C->ld != D->ld ||
        am > 0x7fffffff || bn > 0x7fffffff || ak > 0x7fffffff || A->ld < (int64_t)(A->rows > 1 ? A->rows : 1) ||
        B->ld < (int64_t)(B->rows > 1 ? B->rows : 1) || D->ld < (int64_t)(D->rows > 1 ? D->rows : 1) ||
        A->ld > 0x7fffffff || B->ld > 0x7fffffff || D->ld > 0x7fffffff)
        return false;
    *m = (int)am, *n = (int)bn, *k = (int)ak;
    return true;
}
static inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d,
                                                            cublasLtMatrixLayout_t A, cublasLtMatrixLayout_t B,
                                                            cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D,
                                                            cublasLtMatmulPreference_t p, int requested,
                                                            cublasLtMatmulHeuristicResult_t results[], int *got) {
    int m, n, k;
    if (cublasStatus_t st = tfm_emu__lt_enter("cublasLtMatmulAlgoGetHeuristic", h)) return st;
    if (!d || !A || !B || !C || !D || !p || requested < 1 || !results || !got) return CUBLAS_STATUS_INVALID_VALUE;
    *got = 0;
    if (!tfm_emu__lt_served(d, A, B, C, D, &m, &n, &k)) return CUBLAS_STATUS_NOT_SUPPORTED;
    memset(&results[0], 0, sizeof results[0]);
    results[0].algo.data[0] = TFM_EMU__LT_ALGO;
    for (int i = 0; i < 4; i++) results[0].algo.data[1 + i] = p->align[i] < 256 ? p->align[i] : 256;
    results[0].algo.data[5] = d->epilogue == CUBLASLT_EPILOGUE_BIAS ? tfm_emu__lt_align(d->bias) : 256;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *got = 1;
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha,
                                            const void *A, cublasLtMatrixLayout_t Al, const void *B,
                                            cublasLtMatrixLayout_t Bl, const void *beta, const void *C,
                                            cublasLtMatrixLayout_t Cl, void *D, cublasLtMatrixLayout_t Dl,
                                            const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes,
                                            cudaStream_t stream) {
    static const char *api = "cublasLtMatmul";
    int m, n, k;
    if (cublasStatus_t st = tfm_emu__lt_enter(api, h)) return st;
    if (tfm_emu__g.sticky) return CUBLAS_STATUS_EXECUTION_FAILED;
    if (!d || !Al || !Bl || !Cl || !Dl || !alpha || !beta || !algo || algo->data[0] != TFM_EMU__LT_ALGO)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (!tfm_emu__lt_served(d, Al, Bl, Cl, Dl, &m, &n, &k) || C != D || *(const float *)beta != 0.0f)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!tfm_emu__stream_ok(stream)) tfm_emu__fatal("%s: stream %p is not a live stream", api, (void *)stream);
    if (tfm_emu__is_device(alpha) || tfm_emu__is_device(beta))
        tfm_emu__fatal("%s: alpha or beta is device memory, but the pointer mode is host", api);
    if (ws_bytes && !tfm_emu__device_range(ws, ws_bytes))
        tfm_emu__fatal("%s: the work space (%p, %zu bytes) is not device memory", api, ws, ws_bytes);
    const void *ptr[5] = {A, B, C, D, d->epilogue == CUBLASLT_EPILOGUE_BIAS ? d->bias : nullptr};
    for (int i = 0; i < 5; i++)
        if (ptr[i] && tfm_emu__lt_align(ptr[i]) < algo->data[1 + i])
            tfm_emu__fatal("%s: %s (%p) is aligned to %u bytes, but the algorithm was picked for %llu: a GPU may fault "
                           "(set the preference's CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES)", api,
                           i == 4 ? "the bias" : i == 0 ? "A" : i == 1 ? "B" : i == 2 ? "C" : "D", ptr[i],
                           tfm_emu__lt_align(ptr[i]), (unsigned long long)algo->data[1 + i]);
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    float al = *(const float *)alpha;
    bool bf16 = Al->type == CUDA_R_16BF, tf32 = d->compute == CUBLAS_COMPUTE_32F_FAST_TF32, dbf = Dl->type == CUDA_R_16BF;
    cublasOperation_t ta = (cublasOperation_t)d->ta, tb = (cublasOperation_t)d->tb;
    const float *bias = (const float *)ptr[4];
    int lda = (int)Al->ld, ldb = (int)Bl->ld, ldd = (int)Dl->ld;
    auto run = [=] {
        float one = 1.0f, zero = 0.0f;
        if (bias && !tfm_emu__device_range(bias, (size_t)m * sizeof(float)))
            tfm_emu__fatal("%s: the bias (%p, %d floats) is not device memory", api, (const void *)bias, m);
        if (dbf) { /* the fp32 result (as below, from the widened operands), rounded to nearest even into D */
            int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m, br = tb == CUBLAS_OP_N ? k : n;
            int bc = tb == CUBLAS_OP_N ? n : k;
            std::vector<float> wa, wb, acc((size_t)m * n);
            tfm_emu__check_matrix(api, "A", A, ar, ac, lda, 2);
            tfm_emu__check_matrix(api, "B", B, br, bc, ldb, 2);
            tfm_emu__check_matrix(api, "D", D, m, n, ldd, 2);
            tfm_emu__widen(wa, A, true, ar, ac, lda);
            tfm_emu__widen(wb, B, true, br, bc, ldb);
            for (int j = 0; j < n; j++)
                for (int r = 0; r < m; r++) acc[(size_t)j * m + r] = bias ? bias[r] : 0.0f;
            if (tfm_sgemm(tb != CUBLAS_OP_N, ta != CUBLAS_OP_N, n, m, k, al, wb.data(), ldb, wa.data(), lda, bias ? 1.0f : 0.0f,
                          acc.data(), m) != TFM_OK)
                tfm_emu__fatal("%s: the sums failed", api);
            for (int j = 0; j < n; j++)
                for (int r = 0; r < m; r++) {
                    uint32_t u;
                    memcpy(&u, &acc[(size_t)j * m + r], 4);
                    u = (u & 0x7fffffffu) > 0x7f800000u ? (u | 0x00400000u) >> 16 : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
                    ((uint16_t *)D)[(size_t)j * ldd + r] = (uint16_t)u;
                }
        } else {
            float *out = (float *)D;
            if (bias) { /* the bias in every column of D, then the sums added to it */
                tfm_emu__check_matrix(api, "D", out, m, n, ldd);
                for (int j = 0; j < n; j++)
                    for (int r = 0; r < m; r++) out[(size_t)j * ldd + r] = bias[r];
            }
            h->blas.stream = stream; /* (replaying, or as the call's own stream: run now) */
            (void)tfm_emu__gemm("cublasLtMatmul (its sums)", &h->blas, ta, tb, m, n, k, &al, A, lda, 0, B, ldb, 0,
                                bias ? &one : &zero, out, ldd, 0, 1, bf16, tf32 ? 1 : 0);
        }
        tfm_emu__g.lt_bias += bias != nullptr;
        tfm_emu__g.lt_bf16_out += dbf != 0;
    };
    if (tfm_emu__recording(stream, api)) {
        tfm_emu__record(3, 0, 0, [h, run] {
            if (!tfm_emu__g.handles.count(&h->blas)) tfm_emu__fatal("a graph ran cublasLtMatmul on a destroyed handle");
            run();
        });
        return CUBLAS_STATUS_SUCCESS;
    }
    run();
    return CUBLAS_STATUS_SUCCESS;
}

/* ==== NCCL over MPI (TFM_NCCL) ==== */

#if defined(TFM_NCCL)
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7
} ncclResult_t;
typedef struct {
    char internal[128];
} ncclUniqueId;
typedef enum { ncclFloat32 = 7, ncclFloat = 7 } ncclDataType_t;
typedef enum { ncclSum = 0 } ncclRedOp_t;
struct tfm_emu__nccl {
    MPI_Comm comm;
    int rank, size;
};
typedef struct tfm_emu__nccl *ncclComm_t;

static inline const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    }
    return "unknown result code";
}
/* the checks every call makes: sticky CUDA errors and injected faults */
static inline ncclResult_t tfm_emu__nccl_enter(const char *api) {
    if (tfm_emu__take_fault(api)) return ncclSystemError;
    return tfm_emu__g.sticky ? ncclUnhandledCudaError : ncclSuccess;
}
/* a collective's arguments: buffers of n floats inside device memory, fp32, a live stream */
static inline ncclResult_t tfm_emu__nccl_args(const char *api, ncclComm_t c, const void *send, size_t ns, const void *recv,
                                              size_t nr, ncclDataType_t t, cudaStream_t s) {
    if (ncclResult_t r = tfm_emu__nccl_enter(api)) return r;
    if (!c || t != ncclFloat || !tfm_emu__stream_ok(s)) return ncclInvalidArgument;
    if (ns > (size_t)INT32_MAX || nr > (size_t)INT32_MAX) tfm_emu__fatal("%s: a count past INT_MAX (%zu, %zu)", api, ns, nr);
    if ((ns && !tfm_emu__device_range(send, ns * sizeof(float))) || (nr && !tfm_emu__device_range(recv, nr * sizeof(float))))
        tfm_emu__fatal("%s: a buffer (send %p of %zu floats, recv %p of %zu) is not inside one live cudaMalloc block", api,
                       send, ns, recv, nr);
    if (!tfm_emu__legacy(s) && s != tfm_emu__g.cap && s->after < tfm_emu__g.legacy_ops)
        tfm_emu__fatal("%s on stream %p, which does not wait for the legacy stream's last %llu operations (record an event "
                       "after them and cudaStreamWaitEvent): the emulation cannot tell whether they write its buffers", api,
                       (void *)s, tfm_emu__g.legacy_ops - s->after);
    return ncclSuccess;
}
/* A collective's MPI call: now, or queued on s (a failure there aborts: it has no caller to return to). */
static inline ncclResult_t tfm_emu__nccl_run(const char *api, cudaStream_t s, std::function<int()> mpi) {
    if (!tfm_emu__recording(s, api)) return mpi() == MPI_SUCCESS ? ncclSuccess : ncclSystemError;
    tfm_emu__record(4, 0, 2, [api, mpi] {
        if (mpi() != MPI_SUCCESS) tfm_emu__fatal("%s queued on a stream failed in MPI", api);
    });
    return ncclSuccess;
}

static inline ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    static unsigned n;
    if (ncclResult_t r = tfm_emu__nccl_enter("ncclGetUniqueId")) return r;
    if (!id) return ncclInvalidArgument;
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "tfm_emu %ld %u %lld", (long)getpid(), ++n,
             (long long)std::chrono::steady_clock::now().time_since_epoch().count());
    return ncclSuccess;
}
static inline ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    uint32_t h = 2166136261u;
    MPI_Comm c;
    int size = 0, me = 0;
    if (ncclResult_t r = tfm_emu__nccl_enter("ncclCommInitRank")) return r;
    if (!comm || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    for (size_t i = 0; i < sizeof id.internal; i++) h = (h ^ (unsigned char)id.internal[i]) * 16777619u;
    if (MPI_Comm_split(MPI_COMM_WORLD, (int)(h & 0x7fffffff), rank, &c) != MPI_SUCCESS) return ncclSystemError;
    MPI_Comm_size(c, &size);
    MPI_Comm_rank(c, &me);
    if (size != nranks || me != rank) {
        MPI_Comm_free(&c);
        return ncclInvalidUsage;
    }
    *comm = new tfm_emu__nccl{c, rank, nranks};
    return ncclSuccess;
}
static inline ncclResult_t ncclCommDestroy(ncclComm_t c) {
    int finalized = 0;
    if (!c) return ncclInvalidArgument;
    tfm_emu__drain_all(); /* its queued collectives first */
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&c->comm);
    delete c;
    return ncclSuccess;
}
static inline ncclResult_t ncclCommAbort(ncclComm_t c) { return ncclCommDestroy(c); }
static inline ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *async) {
    if (!c || !async) return ncclInvalidArgument;
    *async = ncclSuccess; /* the work happened at the call */
    return ncclSuccess;
}
static inline ncclResult_t ncclGroupStart(void) { return tfm_emu__nccl_enter("ncclGroupStart"); }
static inline ncclResult_t ncclGroupEnd(void) { return tfm_emu__nccl_enter("ncclGroupEnd"); }
/* recv (count) = the sum over the ranks of their send[rank * count, (rank + 1) * count) */
static inline ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                                             ncclComm_t c, cudaStream_t s) {
    if (ncclResult_t r = tfm_emu__nccl_args("ncclReduceScatter", c, send, c ? count * (size_t)c->size : 0, recv, count, t, s))
        return r;
    if (op != ncclSum) return ncclInvalidArgument;
    MPI_Comm mc = c->comm;
    int size = c->size;
    return tfm_emu__nccl_run("ncclReduceScatter", s, [=] {
        std::vector<float> in((const float *)send, (const float *)send + count * (size_t)size); /* recv may lie in send */
        return MPI_Reduce_scatter_block(in.data(), recv, (int)count, MPI_FLOAT, MPI_SUM, mc);
    });
}
/* recv (count * size) = every rank's send (count), in rank order */
static inline ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t, ncclComm_t c,
                                         cudaStream_t s) {
    if (ncclResult_t r = tfm_emu__nccl_args("ncclAllGather", c, send, count, recv, c ? count * (size_t)c->size : 0, t, s))
        return r;
    MPI_Comm mc = c->comm;
    return tfm_emu__nccl_run("ncclAllGather", s, [=] {
        std::vector<float> in((const float *)send, (const float *)send + count); /* send may lie in recv */
        return MPI_Allgather(in.data(), (int)count, MPI_FLOAT, recv, (int)count, MPI_FLOAT, mc);
    });
}
static inline ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                                         ncclComm_t c, cudaStream_t s) {
    if (ncclResult_t r = tfm_emu__nccl_args("ncclBroadcast", c, send, c && c->rank == root ? count : 0, recv, count, t, s))
        return r;
    if (root < 0 || root >= c->size) return ncclInvalidArgument;
    MPI_Comm mc = c->comm;
    bool mine = c->rank == root;
    return tfm_emu__nccl_run("ncclBroadcast", s, [=] {
        if (mine && send != recv) memmove(recv, send, count * sizeof(float));
        return MPI_Bcast(recv, (int)count, MPI_FLOAT, root, mc);
    });
}
#endif

#endif /* TFM_CUDA_EMU_H */
