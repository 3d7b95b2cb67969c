/* transformer.h - v0.1.0 - build, train and run transformers in C. MIT license (see end of file).

   QUICK START
   -----------
   In exactly one C file of your program:

       #define TFM_IMPLEMENTATION
       #define TFM_BLAS                 (optional: matrix products through cblas_sgemm)
       #include "transformer.h"

   Every other file just includes "transformer.h". A character language model, trained, saved, loaded
   and sampled (every call returns a tfm_result; check it, tfm_last_error() says what went wrong):

       tfm_config cfg = {0};                          zero means default
       cfg.kind = TFM_MODEL_DECODER_LM;
       cfg.vocab_size = 256; cfg.d_model = 128; cfg.n_heads = 4; cfg.n_layers = 4;
       cfg.max_len = 128; cfg.max_batch = 16; cfg.dropout = 0.1f; cfg.seed = 1;
       tfm_model m;
       tfm_model_init(&m, &cfg, NULL, 0);             one allocation; nothing more while training

       tfm_optim opt = {0}; opt.lr = 3e-4f; opt.warmup_steps = 100; opt.clip_norm = 1.0f;
       tfm_batch b = {0}; b.batch = 16; b.len = 128; b.tokens = ids; b.targets = next_ids;
       for (step = 0; step < 5000; step++) {
           float loss;
           ... fill ids (B,T) and next_ids (B,T) ...
           tfm_model_zero_grad(&m);
           tfm_model_forward(&m, &b, &loss, NULL);
           tfm_model_backward(&m, 1.0f);
           tfm_model_step(&m, &opt, NULL);           AdamW, clipping, warmup
       }                                              (or the four as one: tfm_model_train_step)
       tfm_kv kv = {"vocab", "..."};                  your own metadata travels with the weights
       tfm_model_save(&m, "lm.safetensors", 0, &kv, 1);  atomic; torch's safetensors reads it
       tfm_model_free(&m);

       tfm_config_load("lm.safetensors", &cfg);       build the model the file describes ...
       cfg.inference_only = 1; cfg.max_batch = 1;
       tfm_model_init(&m, &cfg, NULL, 0);
       tfm_model_load(&m, "lm.safetensors");          ... and fill it (all or nothing)
       tfm_gen_opts g = {0}; g.max_new = 200; g.temperature = 0.8f; g.top_k = 40; g.seed = 7;
       tfm_model_generate(&m, NULL, 0, prompt, n_prompt, &g, out, &n_out);   KV-cached decoding

   Classifiers (TFM_MODEL_ENCODER_CLASSIFIER: labels per sequence, cfg.input_dim for continuous
   inputs such as image patches, cfg.cls_token for ViT's class vector) and encoder-decoders
   (TFM_MODEL_ENCODER_DECODER: batch.tgt_in and per-position targets) use the same calls. BERT's
   layout is config too: cfg.type_vocab_size (a token-type table, batch.token_types), cfg.emb_norm (a
   layernorm over the embedding sum), exact GELU, post-LN, cfg.ln_eps 1e-12. So is LLaMA's decoder
   block: cfg.norm = TFM_NORM_RMS (every norm an RMSNorm), cfg.act = TFM_ACT_SWIGLU (the gated
   feed-forward), cfg.pos = TFM_POS_ROPE (rotary positions inside attention and the cache),
   cfg.n_kv_heads (grouped-query attention), cfg.attn_window (Mistral's sliding window, a rolling
   cache), cfg.no_bias = 1, cfg.norm_first = 1; tfm_llama_name_map reads and writes Hugging Face's
   LLaMA checkpoints.

   Models of your own come from layers: linear maps, layernorms, multi-head attention and whole
   transformer blocks, each counted, allocated and carved from a tfm_mem, each a forward/backward pair,
   trained with tfm_adamw_step over any list of parameters:

       tfm_mem mem = {0};                             measuring arenas: init only counts bytes
       tfm_block_desc d = {0};
       d.d_model = 64; d.n_heads = 4; d.max_batch = 8; d.max_len = 32;
       tfm_linear in; tfm_block blk;
       tfm_linear_init(&in, 16, 64, 0, &mem); tfm_block_init(&blk, &d, &mem);
       tfm_mem_alloc(&mem);                          one allocation per arena, sized by the count
       tfm_linear_init(&in, 16, 64, 0, &mem); tfm_block_init(&blk, &d, &mem);   now carves memory
       tfm_linear_init_params(&in, &rng); tfm_block_init_params(&blk, &rng);
       tfm_attn_opts o = {0}; o.causal = 1; o.training = 1; o.seed = step;
       tfm_linear_layer_forward(&in, &h, &x);
       tfm_block_forward(&blk, &y, &h, NULL, &o);
       ... loss, dy ...
       tfm_mem_zero_grad(&mem);
       tfm_block_backward(&blk, &dh, NULL, &dy);      gradients ADD into dh and the layer's own
       tfm_linear_layer_backward(&in, NULL, &dh, &x);
       tfm_block_param(&blk, "self_attn.in_proj_weight", &w, &dw);   torch's names
       tfm_mem_free(&mem);

   Build: cc -O3 -march=native -fopenmp prog.c -lm            (built-in sgemm)
          cc -O3 -march=native -fopenmp prog.c -lopenblas -lm (with TFM_BLAS)

   On an NVIDIA GPU the same program runs with cfg.device = TFM_DEVICE_CUDA (batches, prompts and outputs
   stay in host memory; copies are the library's business). The implementation file becomes a .cu:

       tfm_impl.cu:  #define TFM_IMPLEMENTATION
                     #define TFM_CUDA
                     #include "transformer.h"
       nvcc -O3 -arch=sm_90a -c tfm_impl.cu && cc -O3 prog.c tfm_impl.o -lcublas -lcublasLt -lcudart -lstdc++ -lm

   CONFIG MACROS (define before the include, in the implementation file)
   -------------
   TFM_BLAS            matrix products go through cblas_sgemm. Prefer an OpenMP build of OpenBLAS
                       (Debian: libopenblas-openmp-dev): it shares one thread pool with this file's
                       loops, so the two never oversubscribe the cores. The fused attention's small block
                       products stay on the built-in AVX2 kernel where that is the chosen one (faster).
   TFM_BLAS_HEADER     the header that declares cblas_sgemm (default <cblas.h>; <blis.h> for BLIS).
   TFM_SGEMM(ta,tb,M,N,K,alpha,A,lda,B,ldb,beta,C,ldc)
                       your own row-major sgemm (ta, tb are 0 or 1); wins over TFM_BLAS.
   TFM_MALLOC(sz,u) / TFM_FREE(p,u)
                       allocator, both or neither (default malloc/free). u is the model's cfg.user for
                       its memory, caches and checkpoint buffers, NULL for everything else.
   TFM_ASSERT(x)       internal invariants only (default assert); never fired by bad user input.
   TFM_ABORT_ON_ERROR  every failure prints its message to stderr and aborts (for tests and tools).
   TFM_NO_STDIO        leaves out everything that uses FILE* (checkpoints): no <stdio.h> I/O.
   TFM_NO_VECTOR_EXT   no GCC/Clang vector extensions: AdamW runs its scalar loop (the built-in sgemm
                       picks its intrinsics micro-kernel from the target ISA either way).
   TFM_STATIC          every function static, for a private copy in one translation unit.
   TFMDEF              storage class of every public function (default extern).
   TFM_CUDA            CUDA kernels and cuBLAS products (>>api-cuda): the implementation file must then be a
                       .cu built by nvcc (or nvcc -x cu), linked with -lcublas -lcublasLt; every other file of
                       the program stays plain C. Without it the CUDA calls exist and return TFM_E_NO_CUDA.
   TFM_MPI             the data-parallel calls (>>api-dist) run over MPI: include <mpi.h>, build with
                       mpicc. Without it they serve a single process and the header needs no MPI.
   TFM_NCCL            with TFM_MPI and TFM_CUDA: a CUDA model's gradients (and ZeRO-1's parameter shares)
                       go between the ranks through NCCL on device memory instead of through the host
                       over MPI; MPI still forms the group. Link with -lnccl.

   Without TFM_BLAS the header multiplies matrices with its own cache-blocked sgemm, parallel over
   OpenMP threads when compiled with -fopenmp: no dependency at all.

   MEMORY
   ------
   Nothing here allocates on the hot path. A layer takes its memory from a tfm_mem: four arenas,
       params | grads | acts | scratch
   params and grads are carved in the same order, so a parameter and its gradient sit at the same
   offset of their arenas; acts holds what forward saves for backward; scratch holds temporaries that
   layers share (it is rewound after each layer, so its size is the largest single need). An arena
   with no buffer only counts: run a layer's init on a zeroed tfm_mem, then tfm_mem_alloc, then init
   again on the same tfm_mem. Caller memory can back an arena (tfm_arena_init with your buffer).
   Every block starts 64-byte aligned. tfm_tensor is a view and never owns memory.
   A model is one block, sized by tfm_model_memory_size (which allocates nothing) and given by you or
   allocated by tfm_model_init:
       params | grads | adam_m | adam_v | acts | scratch
   the first four laid out alike, so tfm_model_flat hands out the parameters and the gradients as one
   float array each (for your own optimizer, or an all-reduce across processes). Decoding keeps its
   keys and values in a tfm_kv_cache of its own (max_batch rows of max_len positions per layer; with a
   sliding window, attn_sinks + attn_window rows in ring order).
   On the GPU (cfg.device, or tfm_mem.device for layers) the block has a device twin of the same size
   and layout, one cudaMalloc: every float (tensors) lives there at the offset it has on the host, while
   the host block keeps what the CPU reads (the layers' structs, the batch's ids and lengths) and serves
   as the staging area of checkpoints (its activations' bytes are never written: no host memory is
   committed for them). tfm_model_flat, tfm_model_param and tfm_model_logits then hand
   out device memory (tensor.device says so; tfm_tensor_copy brings it to the host).

   ERRORS
   ------
   Functions that can fail on their input return tfm_result (TFM_OK is 0). tfm_last_error() gives a
   thread-local message that names the function and the mismatch, e.g.
       tfm_linear_forward: x is (4,384) but weight is (256,256): x has 384 columns, weight expects 256
   A call that fails leaves your state as it was (a failed load leaves the model untouched, a failed
   save leaves the old file). The library never exits, aborts or prints (unless TFM_ABORT_ON_ERROR).
   Every public backward ADDS into the gradient buffers it is given (so residual branches and tied
   weights sum); clear them first (tfm_model_zero_grad, tfm_mem_zero_grad).

   THREADING
   ---------
   Loops run on OpenMP threads (compile with -fopenmp); tfm_set_num_threads sets the count for this
   file's loops and, with OpenBLAS or with BLIS (through <blis.h>), for BLAS. A layer is not
   thread-safe; separate layers are.
   Results are deterministic for a given thread count; dropout masks do not depend on it at all.
   Each thread that runs products or attention keeps a scratch on the heap, so no call needs a large
   stack; a thread of yours frees its own with tfm_scratch_release before it exits.
   On the GPU every call queues its work on CUDA's default stream and returns when the results it hands
   back (a loss, a gradient norm, generated ids) are on the host; a decoding step of generation or beam
   search, tfm_model_train_step's whole step and tfm_model_forward's pass go there as one CUDA graph
   (tfm_cuda_set_graphs). Each thread that runs CUDA work keeps a cuBLAS handle, a capture stream, its
   last graph of each kind (for training steps and forward passes, of each of the last 4 models to run
   them), the device memory of its last generation call's cache (kept for the next call) and small
   device buffers (and, once it has run generation with a bf16 model, that model's weights in bf16: 2
   bytes a parameter), which tfm_scratch_release frees too (from a generation call's on_token callback,
   all but what that call holds). Products are exact fp32
   unless tfm_cuda_set_tf32 turns tensor-core TF32 on (for the calling thread), or a model's
   cfg.precision asks for TF32 or bf16 (mixed precision: bf16 operands, fp32 sums) in its own calls.

   CONTENTS (grep for the tags)
   --------
   >>api-types >>api-tensor >>api-rng >>api-sgemm >>api-ops >>api-attention >>api-block >>api-model
   >>api-io >>api-cuda >>api-dist
   >>impl-config >>impl-util >>impl-sgemm >>impl-cpu >>impl-attention >>impl-cuda >>impl-dispatch
   >>impl-ops >>impl-mha >>impl-layers >>impl-block >>impl-model >>impl-optim >>impl-kv >>impl-generate
   >>impl-safetensors >>impl-io >>impl-dist >>license
*/
#ifndef TFM_INCLUDE_TRANSFORMER_H
#define TFM_INCLUDE_TRANSFORMER_H

#include <stddef.h>
#include <stdint.h>

#define TFM_VERSION_MAJOR 0
#define TFM_VERSION_MINOR 1
#define TFM_VERSION_PATCH 0

#ifndef TFMDEF
#if defined(TFM_STATIC) && (defined(__GNUC__) || defined(__clang__))
#define TFMDEF static __attribute__((unused))
#elif defined(TFM_STATIC)
#define TFMDEF static
#else
#define TFMDEF extern
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ==== >>api-types ==== */

typedef enum tfm_result {
    TFM_OK = 0,
    TFM_E_ARG = -1,     /* a bad argument: NULL pointer, out-of-range value or id */
    TFM_E_SHAPE = -2,   /* tensor shapes do not fit together, or exceed what memory was sized for */
    TFM_E_NOMEM = -3,   /* an allocation failed, or an arena is too small */
    TFM_E_IO = -4,      /* a file could not be read or written */
    TFM_E_FORMAT = -5,  /* a file's contents are malformed */
    TFM_E_NO_CUDA = -6, /* CUDA asked for in a build without TFM_CUDA */
    TFM_E_CUDA = -7,    /* a CUDA call failed */
    TFM_E_COMM = -8     /* a collective across processes failed (MPI's error, a rank gone) */
} tfm_result;

/* A short description of a result code: "shape mismatch". Never NULL. */
TFMDEF const char *tfm_result_string(tfm_result r);
/* The detail of the last failure on this thread ("" if none). Valid until the next failing call. */
TFMDEF const char *tfm_last_error(void);
/* Forget the last failure on this thread. */
TFMDEF void tfm_clear_error(void);

/* Set the number of threads for this file's loops (and BLAS's, with OpenBLAS). n <= 0: all cores. */
TFMDEF void tfm_set_num_threads(int n);
TFMDEF int tfm_get_num_threads(void);

/* Where a tensor's data lives. (TFM_CUDA, without DEVICE, is the build macro.) */
typedef enum tfm_device { TFM_DEVICE_CPU = 0, TFM_DEVICE_CUDA = 1 } tfm_device;

/* How a GPU model computes its products (cfg.precision): fp32 (0), TF32 tensor cores, or bf16 operands on
   tensor cores with fp32 sums. Everything else stays fp32 either way. */
typedef enum tfm_precision { TFM_PREC_FP32 = 0, TFM_PREC_TF32 = 1, TFM_PREC_BF16 = 2 } tfm_precision;

#define TFM_MAX_DIMS 4

/* A view of row-major float32 data: it never owns its memory. Zero-initialised means empty. */
typedef struct tfm_tensor {
    float *data;
    int ndim;                      /* 1..TFM_MAX_DIMS */
    int64_t shape[TFM_MAX_DIMS];   /* shape[ndim-1] is the fastest-moving index */
    tfm_device device;
} tfm_tensor;

/* Seeded random numbers (xoshiro256**). Same seed, same sequence, on every platform. */
typedef struct tfm_rng { uint64_t s[4]; } tfm_rng;

/* ==== >>api-tensor ==== */

TFMDEF tfm_tensor tfm_tensor1(float *data, int64_t d0);
TFMDEF tfm_tensor tfm_tensor2(float *data, int64_t d0, int64_t d1);
TFMDEF tfm_tensor tfm_tensor3(float *data, int64_t d0, int64_t d1, int64_t d2);
TFMDEF tfm_tensor tfm_tensor4(float *data, int64_t d0, int64_t d1, int64_t d2, int64_t d3);
/* Number of elements (product of the shape); 0 for an empty tensor. */
TFMDEF int64_t tfm_numel(const tfm_tensor *t);
/* Writes "(2,8,64)" into buf (always NUL-terminated) and returns buf. */
TFMDEF const char *tfm_shape_str(const tfm_tensor *t, char *buf, size_t n);
/* Fill every element with v, with N(mean, std^2) or with U[lo, hi). tfm_fill_normal draws from rng
   directly up to 65536 elements; a larger tensor takes one draw from rng and fills fixed chunks on
   threads, with the same values whatever the thread count. */
TFMDEF tfm_result tfm_fill(tfm_tensor *t, float v);
TFMDEF tfm_result tfm_fill_normal(tfm_tensor *t, tfm_rng *rng, float mean, float std);
TFMDEF tfm_result tfm_fill_uniform(tfm_tensor *t, tfm_rng *rng, float lo, float hi);
/* dst = src element by element (equal element counts, shapes may differ), between any two devices.
   TFM_E_NO_CUDA for a CUDA tensor without CUDA; TFM_E_CUDA if the copy fails. */
TFMDEF tfm_result tfm_tensor_copy(tfm_tensor *dst, const tfm_tensor *src);

/* An arena hands out 64-byte aligned blocks from one buffer. A zeroed arena has no buffer and only
   counts: allocations return NULL, and `peak` grows to the bytes a real arena would need. */
typedef struct tfm_arena {
    unsigned char *base;  /* NULL: counting only */
    size_t size;          /* bytes available at base */
    size_t used;          /* bytes handed out so far */
    size_t peak;          /* the most `used` has been: the size to allocate */
    int owned;            /* base came from TFM_MALLOC and tfm_arena_free releases it */
    int overflow;         /* an allocation did not fit (a real arena smaller than its count) */
    unsigned char *dev;   /* NULL, or a CUDA twin of base's `size` bytes: then tfm_arena_tensor hands out its
                             tensors there (at the offset they would have at base), tfm_arena_alloc its
                             raw blocks at base (tfm_mem_alloc sets it for device mems) */
} tfm_arena;

/* Back an arena with `size` bytes at mem (yours, kept alive by you) or, when mem is NULL, with a new
   allocation. TFM_E_NOMEM if that fails. */
TFMDEF tfm_result tfm_arena_init(tfm_arena *a, void *mem, size_t size);
/* Release what tfm_arena_init allocated; leaves a zeroed (counting) arena. */
TFMDEF void tfm_arena_free(tfm_arena *a);
/* `bytes` bytes, 64-byte aligned. NULL when counting or when the arena is full (overflow is set). Zeroed
   in an arena with a device twin. */
TFMDEF void *tfm_arena_alloc(tfm_arena *a, size_t bytes);
/* A tensor of the given shape carved from the arena (data NULL when counting); in the device twin when
   the arena has one (then tensor.device is TFM_DEVICE_CUDA). */
TFMDEF tfm_tensor tfm_arena_tensor(tfm_arena *a, int ndim, const int64_t *shape);

/* The four regions a layer or model draws on. Set no_grad before the first init for inference:
   then nothing is carved from grads, and scratch and acts hold only what forward needs. */
typedef struct tfm_mem {
    tfm_arena params, grads, acts, scratch;
    int no_grad;
    tfm_device device;  /* where the layers' tensors live and run: TFM_DEVICE_CUDA gives each arena a device
                           twin at tfm_mem_alloc (the layers' own structs stay on the host) */
} tfm_mem;

/* Allocate each arena of a counted tfm_mem at its peak size (and, for a CUDA mem, its device twin) and
   rewind it for the real init. TFM_E_NOMEM if an allocation fails (nothing is left allocated then);
   TFM_E_NO_CUDA for a CUDA mem in a build or on a machine without CUDA. */
TFMDEF tfm_result tfm_mem_alloc(tfm_mem *m);
/* Rewind the arenas (keep their buffers) so a second init carves the same blocks again. */
TFMDEF void tfm_mem_rewind(tfm_mem *m);
/* Free what tfm_mem_alloc allocated. */
TFMDEF void tfm_mem_free(tfm_mem *m);
/* TFM_OK when no arena of m overflowed; otherwise TFM_E_NOMEM naming the arena. */
TFMDEF tfm_result tfm_mem_check(const tfm_mem *m);
/* Zero every gradient carved from m so far (the grads arena), before a backward pass. */
TFMDEF void tfm_mem_zero_grad(tfm_mem *m);

/* ==== >>api-rng ==== */

TFMDEF void tfm_rng_seed(tfm_rng *rng, uint64_t seed);
TFMDEF uint64_t tfm_rng_u64(tfm_rng *rng);
/* Uniform in [0, 1), 24 random bits. */
TFMDEF float tfm_rng_uniform(tfm_rng *rng);
/* Standard normal (Box-Muller; uses two uniforms per call). */
TFMDEF float tfm_rng_normal(tfm_rng *rng);

/* ==== >>api-sgemm ==== */

/* C = alpha * op(A) op(B) + beta * C, row-major. op(A) is (M,K): A is (M,K) with row stride lda, or
   (K,M) when transA. op(B) is (K,N). C is (M,N) with row stride ldc. This is the one choke point every
   matrix product goes through (built-in, BLAS or TFM_SGEMM). With beta == 0, C is not read. The
   built-in one packs its operands into the scratch of each thread that runs it (see tfm_scratch_release). */
TFMDEF tfm_result tfm_sgemm(int transA, int transB, int M, int N, int K, float alpha,
                            const float *A, int lda, const float *B, int ldb,
                            float beta, float *C, int ldc);
/* `batch` independent products; matrix i starts at A + i*strideA, B + i*strideB, C + i*strideC.
   Spread over threads batch-wise when there are enough matrices, else each product is threaded. */
TFMDEF tfm_result tfm_sgemm_batched(int transA, int transB, int M, int N, int K, float alpha,
                                    const float *A, int lda, int64_t strideA,
                                    const float *B, int ldb, int64_t strideB, float beta,
                                    float *C, int ldc, int64_t strideC, int batch);
/* Every thread that runs products or attention keeps a scratch on the heap, allocated by its first use
   and reused by the next ones (so a training step allocates nothing after the first, and no call needs
   a large stack): the built-in sgemm's packing space (1.1 MiB; none with BLAS or TFM_SGEMM) and the
   attention's block buffers (128.5 KiB). This frees the calling thread's and, called outside a parallel
   region, those of the OpenMP threads that run this file's loops (for a team as large as the thread
   count or the number of processors, whichever is larger). A thread of yours that ran products or
   attention calls it before it exits (else its scratch leaks); anyone may call it to give the memory
   back, and the next call allocates again. A child process that fork() makes keeps only the forking
   thread: the other threads' scratch stays allocated in it, owned by no one, unless this ran before
   the fork. When a thread cannot allocate its scratch, the layer and model calls return TFM_E_NOMEM
   (the built-in sgemm alone computes without packing). */
TFMDEF void tfm_scratch_release(void);
/* The same, under its former name. */
#define tfm_sgemm_release tfm_scratch_release
/* Which sgemm this build uses: "built-in", "cblas" or "TFM_SGEMM". */
TFMDEF const char *tfm_sgemm_backend(void);
/* The built-in sgemm's micro-kernel (compiled beside BLAS or TFM_SGEMM too): the widest this build
   targets ("avx512 8x32", "avx2+fma 6x16", "neon 8x12" or "portable ..."), unless the environment
   variable TFM_SGEMM_KERNEL names another one of this build (avx512, avx2, neon, portable) when the
   first product runs; an unknown name there is reported on stderr once and the widest kept.
   tfm_sgemm_set_kernel(name) chooses one by that short name (NULL: the widest again); an unknown
   name is TFM_E_ARG, listing this build's kernels, and changes nothing. Not while products run on
   other threads. Each kernel gives the same bits at any thread count; different kernels may differ
   in the last bits.
   "amx bf16x3 32x32" (key amx; x86-64 Linux, compiled for a CPU with AMX-BF16, e.g. -march=native on
   an Intel Xeon since Sapphire Rapids) is never the default: it multiplies on the AMX tile unit, each
   float split into two bf16, and each element of its products is within (4.6e-5 + 3K * 6e-8) sum |a b|
   (the fp32 kernels: K * 6e-8), at about twice the fp32 kernels' speed. Choosing it asks Linux for the tiles;
   where they are refused it is TFM_E_ARG (TFM_SGEMM_KERNEL=amx: a line on stderr, the widest kept).
   Chosen, it runs the products of a TFM_BLAS build too (not those of TFM_SGEMM's); the fused
   attention's block products stay in fp32. */
TFMDEF const char *tfm_sgemm_kernel(void);
TFMDEF tfm_result tfm_sgemm_set_kernel(const char *name);

/* ==== >>api-ops ====
   Letters: B batch, T time, C channels, H heads, D head dim (C/H), V vocabulary, N rows (B*T).
   A tensor of shape (B,T,C) may be passed where (N,C) is expected: leading dims are flattened.
   Backward functions ADD into each gradient they are given; where a backward takes several
   gradients, a NULL one is skipped (a function with a single gradient requires it). */

/* c = op(a) op(b). a, b, c are 2-D, or 3-D with equal batch: (L,M,K) (L,K,N) -> (L,M,N). */
TFMDEF tfm_result tfm_matmul_forward(tfm_tensor *c, const tfm_tensor *a, const tfm_tensor *b,
                                     int transA, int transB);
TFMDEF tfm_result tfm_matmul_backward(tfm_tensor *da, tfm_tensor *db, const tfm_tensor *dc,
                                      const tfm_tensor *a, const tfm_tensor *b, int transA, int transB);

/* y = x w^T + b. x (N,I), w (O,I) stored as torch.nn.Linear, b (O) or NULL, y (N,O). */
TFMDEF tfm_result tfm_linear_forward(tfm_tensor *y, const tfm_tensor *x, const tfm_tensor *w,
                                     const tfm_tensor *b);
TFMDEF tfm_result tfm_linear_backward(tfm_tensor *dx, tfm_tensor *dw, tfm_tensor *db,
                                      const tfm_tensor *dy, const tfm_tensor *x, const tfm_tensor *w);

/* Row-wise softmax over the last dim, max-subtracted. y may alias x. */
TFMDEF tfm_result tfm_softmax_forward(tfm_tensor *y, const tfm_tensor *x);
TFMDEF tfm_result tfm_softmax_backward(tfm_tensor *dx, const tfm_tensor *dy, const tfm_tensor *y);

/* Row-wise log-softmax over the last dim. y may alias x. */
TFMDEF tfm_result tfm_log_softmax_forward(tfm_tensor *y, const tfm_tensor *x);
TFMDEF tfm_result tfm_log_softmax_backward(tfm_tensor *dx, const tfm_tensor *dy, const tfm_tensor *y);

/* Fused log-softmax + cross-entropy as torch.nn.functional.cross_entropy: the mean over rows whose
   target is not ignore_index of (1-s)*(-log p[target]) + s*mean_v(-log p[v]), s = label_smoothing.
   logits (N,V); targets N ids in [0,V) or == ignore_index; lse (N) saves each row's log-sum-exp.
   All rows ignored: loss 0 and zero gradient (torch gives NaN). */
TFMDEF tfm_result tfm_cross_entropy_forward(float *loss, tfm_tensor *lse, const tfm_tensor *logits,
                                            const int32_t *targets, int ignore_index,
                                            float label_smoothing);
/* dlogits += dloss * d(loss)/d(logits). */
TFMDEF tfm_result tfm_cross_entropy_backward(tfm_tensor *dlogits, float dloss,
                                             const tfm_tensor *logits, const tfm_tensor *lse,
                                             const int32_t *targets, int ignore_index,
                                             float label_smoothing);

/* y = (x - mean) * rstd * g + b over the last dim (biased variance, eps inside the sqrt).
   x, y (N,C); g, b (C); mean, rstd (N) saved for backward. y may alias x. */
TFMDEF tfm_result tfm_layernorm_forward(tfm_tensor *y, tfm_tensor *mean, tfm_tensor *rstd,
                                        const tfm_tensor *x, const tfm_tensor *g,
                                        const tfm_tensor *b, float eps);
TFMDEF tfm_result tfm_layernorm_backward(tfm_tensor *dx, tfm_tensor *dg, tfm_tensor *db,
                                         const tfm_tensor *dy, const tfm_tensor *x,
                                         const tfm_tensor *g, const tfm_tensor *mean,
                                         const tfm_tensor *rstd);
/* RMSNorm (LLaMA's, torch.nn.RMSNorm's): y = x * rstd * g over the last dim, rstd = 1 / sqrt(mean(x^2) +
   eps); no centering, no bias. x, y (N,C); g (C) or NULL (1); rstd (N) saved for backward. y may alias x. */
TFMDEF tfm_result tfm_rmsnorm_forward(tfm_tensor *y, tfm_tensor *rstd, const tfm_tensor *x, const tfm_tensor *g,
                                      float eps);
/* Adds into dx and dg (either may be NULL); x, g and rstd as the forward had them. */
TFMDEF tfm_result tfm_rmsnorm_backward(tfm_tensor *dx, tfm_tensor *dg, const tfm_tensor *dy, const tfm_tensor *x,
                                       const tfm_tensor *g, const tfm_tensor *rstd);

/* Rotary position embedding (RoFormer; the half-split layout of GPT-NeoX and LLaMA) on x (B,T,C) as
   n_heads heads of D = C / n_heads channels: in each head, channels j and j + rot/2 (j < rot/2; rot =
   rot_dims, even, <= D; channels from rot on pass through) turn by the angle p * base^(-2j/rot) at position
   p = pos0[b] + t (pos0: B integers in host memory, or NULL: t): (a, b) -> (a cos - b sin, b cos + a sin). Angles and their sines are
   formed in double, so long positions keep their accuracy. y may alias x. Self-attention applies it to
   its queries and keys when asked (tfm_mha_desc.rope_dims, cfg.pos TFM_POS_ROPE). */
TFMDEF tfm_result tfm_rope_forward(tfm_tensor *y, const tfm_tensor *x, int n_heads, int rot_dims, float base,
                                   const int32_t *pos0);
/* Adds the rotation's transpose (the turn by -angle) of dy into dx; dx must not alias dy. */
TFMDEF tfm_result tfm_rope_backward(tfm_tensor *dx, const tfm_tensor *dy, int n_heads, int rot_dims, float base,
                                    const int32_t *pos0);

typedef enum tfm_gelu_kind {
    TFM_GELU_ERF = 0,  /* exact: x * Phi(x), torch's default */
    TFM_GELU_TANH = 1  /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), torch approximate='tanh' */
} tfm_gelu_kind;
/* Element-wise; y may alias x. Backward reads the forward's input x. */
TFMDEF tfm_result tfm_gelu_forward(tfm_tensor *y, const tfm_tensor *x, tfm_gelu_kind kind);
TFMDEF tfm_result tfm_gelu_backward(tfm_tensor *dx, const tfm_tensor *dy, const tfm_tensor *x,
                                    tfm_gelu_kind kind);
TFMDEF tfm_result tfm_relu_forward(tfm_tensor *y, const tfm_tensor *x);
/* x may be the forward's input or its output (same sign pattern). */
TFMDEF tfm_result tfm_relu_backward(tfm_tensor *dx, const tfm_tensor *dy, const tfm_tensor *x);

/* Inverted dropout: each element is kept with probability 1-p and scaled by 1/(1-p). The mask is a
   hash of (seed, element index): backward regenerates it from the same seed, nothing is stored, and
   it does not depend on the thread count. training == 0 or p == 0: y = x. p in [0, 1]. */
TFMDEF tfm_result tfm_dropout_forward(tfm_tensor *y, const tfm_tensor *x, float p, uint64_t seed,
                                      int training);
TFMDEF tfm_result tfm_dropout_backward(tfm_tensor *dx, const tfm_tensor *dy, float p, uint64_t seed,
                                       int training);

/* y[i] = w[ids[i]] * scale. w (V,C); y (N,C) or (B,T,C) with N = B*T ids, each checked in [0,V). */
TFMDEF tfm_result tfm_embedding_forward(tfm_tensor *y, const int32_t *ids, const tfm_tensor *w,
                                        float scale);
TFMDEF tfm_result tfm_embedding_backward(tfm_tensor *dw, const tfm_tensor *dy, const int32_t *ids,
                                         float scale);

/* Learned positions: y[b,t] = x[b,t] + w[t]. x, y (B,T,C); w (P,C) with P >= T. y may alias x. */
TFMDEF tfm_result tfm_pos_embedding_forward(tfm_tensor *y, const tfm_tensor *x, const tfm_tensor *w);
/* dx += dy (if dx), dw[t] += sum over b of dy[b,t] (if dw). */
TFMDEF tfm_result tfm_pos_embedding_backward(tfm_tensor *dx, tfm_tensor *dw, const tfm_tensor *dy);

/* Sinusoidal positions (Vaswani et al.): pe[t,2i] = sin(t / 10000^(2i/C)), pe[t,2i+1] = cos(same).
   tfm_sinusoidal_table fills pe (P,C); forward adds it: y[b,t] = x[b,t] + pe[t], y may alias x. */
TFMDEF tfm_result tfm_sinusoidal_table(tfm_tensor *pe);
TFMDEF tfm_result tfm_sinusoidal_forward(tfm_tensor *y, const tfm_tensor *x);
TFMDEF tfm_result tfm_sinusoidal_backward(tfm_tensor *dx, const tfm_tensor *dy);

/* Residual add y = a + b, any equal shapes; y may alias a or b. Backward: da += dy, db += dy. */
TFMDEF tfm_result tfm_add_forward(tfm_tensor *y, const tfm_tensor *a, const tfm_tensor *b);
TFMDEF tfm_result tfm_add_backward(tfm_tensor *da, tfm_tensor *db, const tfm_tensor *dy);

/* Mean over the first lens[b] positions: x (B,T,C) -> y (B,C). lens NULL: all T. lens[b] in [0,T];
   a length of 0 gives a zero row. */
TFMDEF tfm_result tfm_mean_pool_forward(tfm_tensor *y, const tfm_tensor *x, const int32_t *lens);
TFMDEF tfm_result tfm_mean_pool_backward(tfm_tensor *dx, const tfm_tensor *dy, const int32_t *lens);
/* First-token ([CLS]) pooling: y[b] = x[b,0]. x (B,T,C) -> y (B,C). */
TFMDEF tfm_result tfm_cls_pool_forward(tfm_tensor *y, const tfm_tensor *x);
TFMDEF tfm_result tfm_cls_pool_backward(tfm_tensor *dx, const tfm_tensor *dy);

/* ==== >>api-attention ==== */

/* Masks and options of one call of attention, multi-head attention or a block (tfm_block_forward); zeroed
   means: no mask, no dropout, scale 1/sqrt(D). The masks combine: a key is visible when every mask given
   allows it; a query that sees no key gets a zero row. */
typedef struct tfm_attn_opts {
    int causal;               /* query i sees keys j <= i (top-left aligned when Tq != Tk) */
    int window;               /* causal only: > 0 lets query i see keys i - window < j <= i (a sliding window;
                                 the keys outside it cost nothing); 0: every key j <= i. A layer's own
                                 attn_window (tfm_mha_desc, tfm_block_desc) applies without it */
    int sinks;                /* with window: keys j < sinks are visible to every query too (attention sinks) */
    const int32_t *key_lens;  /* B lengths in [0,Tk]: keys j >= key_lens[b] are masked; NULL: none. A block
                                 applies them to its self-attention: the valid lengths of x */
    const int32_t *kv_lens;   /* blocks: B lengths of xkv for the cross-attention; NULL: none */
    const float *mask;        /* additive mask, added to the scaled scores: (Tq,Tk), or (B,Tq,Tk) with
                                 mask_per_batch; -INFINITY hides a key (torch's float attn_mask). A block
                                 applies it to its self-attention. NaN and +inf are refused */
    int mask_per_batch;
    float dropout;            /* attention, mha: probability of dropping an attention weight (training only) */
    uint64_t dropout_seed;    /* attention, mha: seed of the dropout mask; pass the same one to backward */
    float scale;              /* 0: 1/sqrt(D) */
    int training;             /* blocks: dropout on (at the rates of the block's desc) */
    uint64_t seed;            /* blocks: every dropout site of the call derives its mask from this */
    int64_t batch_offset;     /* draw dropout masks as if these B rows were rows batch_offset.. of a larger
                                 batch of the same length (data parallel: masks then match one process) */
    int n_kv_heads;           /* tfm_attention_forward/_backward: key and value heads, dividing n_heads (grouped-
                                 query attention; 1: multi-query); 0 -> n_heads. Attention layers and blocks
                                 take theirs from their desc and refuse another value here */
} tfm_attn_opts;

/* Scaled dot-product attention over H heads of a (B,T,C) layout (head h owns channels h*D..h*D+D):
   out = softmax(scale * q k^T + mask) v per batch and head. q (B,Tq,C), k and v (B,Tk,C), out
   (B,Tq,C). With opts.n_kv_heads = Hkv < H (grouped-query attention), k and v are (B,Tk,Hkv*D) and query
   head h reads key/value head h / (H/Hkv), in place (LLaMA's repeat_kv order). Fused: the probabilities
   are never stored; lse (B,H,Tq) receives each query's log-sum-exp of its masked scores (-inf for a
   query with no visible key, whose output row is zeros, never NaN), which backward reads with out.
   Memory O(B H Tq) besides the inputs; each thread's stack holds the block buffers (128 KB in
   backward). */
TFMDEF tfm_result tfm_attention_forward(tfm_tensor *out, tfm_tensor *lse, const tfm_tensor *q,
                                        const tfm_tensor *k, const tfm_tensor *v, int n_heads,
                                        const tfm_attn_opts *opts);
/* Adds into dq, dk, dv (any may be NULL), recomputing the probabilities block by block from lse:
   dS = P * (dP - rowsum(dout * out)). out and lse as the forward with the same opts left them. A query
   that sees exactly one key (Tk 1, a key length of 1, the first causal query, or a mask leaving one key)
   has a one-hot softmax and adds exactly zero to dq and dk, as torch's unfused attention does. */
TFMDEF tfm_result tfm_attention_backward(tfm_tensor *dq, tfm_tensor *dk, tfm_tensor *dv,
                                         const tfm_tensor *dout, const tfm_tensor *q,
                                         const tfm_tensor *k, const tfm_tensor *v,
                                         const tfm_tensor *out, const tfm_tensor *lse, int n_heads,
                                         const tfm_attn_opts *opts);

/* Multi-head attention as torch.nn.MultiheadAttention (batch_first): in_proj_weight (3C,C) holds the
   query rows, then key, then value; in_proj_bias (3C); out_proj.weight (C,C); out_proj.bias (C).
   Self-attention projects one input with all of in_proj (one fused product); cross-attention projects
   the queries from x with the query rows and keys and values from xkv with the key and value rows.
   Grouped-query attention (n_kv_heads = Hkv < H, head size D = C/H): in_proj_weight is (C + 2*Ckv, C),
   Ckv = Hkv*D: the C query rows, then Ckv key rows, then Ckv value rows (in_proj_bias likewise), and query
   head h attends with key/value head h / (H/Hkv), as LLaMA's repeat_kv. */
typedef struct tfm_mha_desc {
    int d_model;     /* C, required */
    int n_heads;     /* H, required, divides C */
    int cross;       /* 0: self-attention; 1: keys and values from a second input */
    int no_bias;     /* 0: in_proj_bias and out_proj.bias exist (torch's default) */
    int max_batch;   /* 0 -> 1 */
    int max_len;     /* required: longest query sequence */
    int max_kv_len;  /* 0 -> max_len; the longest key sequence (cross) */
    int rope_dims;   /* self-attention: > 0 turns the first rope_dims channels of each query and key head by
                        their position (tfm_rope_forward, positions from 0 or, decoding, after the cached
                        ones) after the projection; even, at most the head size. 0: none */
    float rope_base; /* with rope_dims: the rotary base, > 1; 0 -> 10000 */
    int n_kv_heads;  /* key/value heads, dividing n_heads (1: multi-query); 0 -> n_heads */
    int attn_window; /* self-attention: > 0 makes every causal call a sliding window of this many keys
                        (tfm_attn_opts.window); a call that is not causal, or names another window or
                        other sinks, is refused. 0: none */
    int attn_sinks;  /* with attn_window: the first attn_sinks keys stay visible (tfm_attn_opts.sinks) */
} tfm_mha_desc;

typedef struct tfm_mha {
    tfm_mha_desc desc;                  /* with defaults applied */
    /* parameters, torch layout; the biases have data NULL when no_bias */
    tfm_tensor in_proj_weight, in_proj_bias, out_proj_weight, out_proj_bias;
    /* their gradients, same shapes; data NULL when the tfm_mem had no_grad */
    tfm_tensor d_in_proj_weight, d_in_proj_bias, d_out_proj_weight, d_out_proj_bias;
    /* saved by forward for backward (acts) */
    float *q;          /* self: (B,Tq,C+2Ckv) fused q|k|v; cross: (B,Tq,C) (Ckv = C with n_kv_heads = H) */
    float *kv;         /* cross: (B,Tk,2Ckv) fused k|v; self: NULL */
    float *lse;        /* (B,H,Tq) log-sum-exp of each query's attention scores */
    float *ctx;        /* (B,Tq,C) attention output before out_proj */
    int32_t *key_lens; /* (max_batch) copy of the forward's lengths */
    /* scratch (shared between layers) */
    float *dctx;       /* (B,Tq,C) */
    float *dq;         /* like q */
    float *dkv;        /* like kv */
    /* the last forward call */
    const float *x, *xkv;
    int xbf;           /* x was a bf16 activation (a bf16 model's pre-LN block) */
    int qbf;           /* q|k|v are bf16 (rows of C+2Ckv bf16 elements: a bf16 model's flash attention) */
    int obf;           /* ctx is bf16 (rows of tfm__bf16_ld(C) elements: the same calls, where those fit) */
    int B, Tq, Tk, has_lens, has_grad;
    tfm_attn_opts opts;
    tfm_device device;
} tfm_mha;

/* Carve an attention layer's memory from mem (or, with counting arenas, count it). Checks desc:
   TFM_E_ARG names the field at fault. */
TFMDEF tfm_result tfm_mha_init(tfm_mha *m, const tfm_mha_desc *desc, tfm_mem *mem);
/* torch's initialisation: xavier_uniform in_proj_weight, U(+-1/sqrt(C)) out_proj.weight, zero biases.
   TFM_E_ARG if the layer has no memory yet. */
TFMDEF tfm_result tfm_mha_init_params(tfm_mha *m, tfm_rng *rng);
/* The parameter of torch name `name` ("in_proj_weight", "out_proj.bias", ...): *value and *grad
   (either may be NULL; grad.data NULL without gradients). TFM_E_ARG names an unknown one. */
TFMDEF tfm_result tfm_mha_param(tfm_mha *m, const char *name, tfm_tensor *value, tfm_tensor *grad);
/* y (B,Tq,C) = attention of x (B,Tq,C) over xkv (B,Tk,C) (cross) or over x itself (xkv NULL, self).
   x and xkv are read again by backward: keep them unchanged until then. y must not alias x. */
TFMDEF tfm_result tfm_mha_forward(tfm_mha *m, tfm_tensor *y, const tfm_tensor *x,
                                  const tfm_tensor *xkv, const tfm_attn_opts *opts);
/* Adds into dx (B,Tq,C), dxkv (B,Tk,C) (cross; NULL to skip) and the four parameter gradients. */
TFMDEF tfm_result tfm_mha_backward(tfm_mha *m, tfm_tensor *dx, tfm_tensor *dxkv,
                                   const tfm_tensor *dy);

/* ==== >>api-block ====
   One transformer layer: self-attention, optional cross-attention over a second sequence, and a
   feed-forward network, each a sub-layer with a residual connection and a layernorm, placed after
   the residual sum (post-LN, the original paper and torch's default) or before the sub-layer
   (pre-LN, norm_first); desc.norm makes every norm an RMSNorm and act TFM_ACT_SWIGLU the feed-forward a
   SwiGLU (LLaMA's). Names and layouts follow torch.nn.TransformerEncoderLayer (cross == 0:
   self_attn, linear1, linear2, norm1, norm2) and torch.nn.TransformerDecoderLayer (cross == 1:
   self_attn, multihead_attn, linear1, linear2, norm1, norm2, norm3). */

typedef enum tfm_activation {
    TFM_ACT_RELU = 0,     /* torch's default */
    TFM_ACT_GELU = 1,     /* exact (erf) GELU */
    TFM_ACT_GELU_TANH = 2, /* tanh approximation */
    TFM_ACT_SWIGLU = 3     /* the feed-forward is linear2(silu(x W1^T) * (x W3^T)) (LLaMA's): linear1 holds
                              W1 (gate) and W3 (up) stacked, (2F,C) like in_proj_weight's q|k|v */
} tfm_activation;

/* The norm of a block and of a stack's end: torch's LayerNorm, or RMSNorm (weight only, no centering) */
typedef enum tfm_norm_kind { TFM_NORM_LAYER = 0, TFM_NORM_RMS = 1 } tfm_norm_kind;

/* A linear map (torch.nn.Linear): weight (O,I), bias (O) (data NULL without bias), and gradients. */
typedef struct tfm_linear { tfm_tensor weight, bias, d_weight, d_bias; } tfm_linear;
/* A layernorm (torch.nn.LayerNorm): weight (C), bias (C), gradients, and the per-row statistics of the
   last forward (up to max_rows rows). With rms, an RMSNorm (tfm_rmsnorm_forward): no bias, mean NULL. */
typedef struct tfm_layernorm {
    tfm_tensor weight, bias, d_weight, d_bias;
    float *mean, *rstd;
    float eps;
    int64_t max_rows, rows;
    int rms;
} tfm_layernorm;

/* Layers to build models of your own from, with tfm_mem as the other layers (count, tfm_mem_alloc, init
   again). A linear map of in_features -> out_features, with a bias unless no_bias. */
TFMDEF tfm_result tfm_linear_init(tfm_linear *l, int in_features, int out_features, int no_bias, tfm_mem *mem);
/* nn.Linear's initialisation: weight and bias U(+-1/sqrt(in_features)). */
TFMDEF tfm_result tfm_linear_init_params(tfm_linear *l, tfm_rng *rng);
/* y (N,O) = x (N,I) weight^T + bias; leading dims of x are flattened (see >>api-ops). */
TFMDEF tfm_result tfm_linear_layer_forward(const tfm_linear *l, tfm_tensor *y, const tfm_tensor *x);
/* Adds into dx (NULL to skip), d_weight and d_bias; x is the forward's input. */
TFMDEF tfm_result tfm_linear_layer_backward(tfm_linear *l, tfm_tensor *dx, const tfm_tensor *dy, const tfm_tensor *x);
/* A layernorm over C channels (weight and bias, or weight only with no_bias) for up to max_rows rows per
   call; eps 0 -> 1e-5. */
TFMDEF tfm_result tfm_layernorm_init(tfm_layernorm *ln, int C, int no_bias, float eps, int64_t max_rows, tfm_mem *mem);
/* An RMSNorm over C channels (weight only) in the same struct; the layernorm's calls below run it. */
TFMDEF tfm_result tfm_rmsnorm_init(tfm_layernorm *ln, int C, float eps, int64_t max_rows, tfm_mem *mem);
/* weight 1, bias 0 (torch's). */
TFMDEF tfm_result tfm_layernorm_init_params(tfm_layernorm *ln);
/* y = layernorm(x), x (N,C) (leading dims flattened, N <= max_rows); keeps the row statistics for backward.
   y may alias x only if backward will not be called (backward reads x). */
TFMDEF tfm_result tfm_layernorm_layer_forward(tfm_layernorm *ln, tfm_tensor *y, const tfm_tensor *x);
/* Adds into dx (NULL to skip), d_weight and d_bias; x is the last forward's input. */
TFMDEF tfm_result tfm_layernorm_layer_backward(tfm_layernorm *ln, tfm_tensor *dx, const tfm_tensor *dy,
                                               const tfm_tensor *x);

typedef struct tfm_block_desc {
    int d_model;         /* C, required */
    int n_heads;         /* H, required, divides C */
    int d_ff;            /* 0 -> 4 * d_model */
    int cross;           /* 1: decoder layer with cross-attention (multihead_attn, norm3). Causal masking
                            is a per-call option (tfm_attn_opts.causal), as torch's tgt_mask */
    int norm_first;      /* 0: post-LN; 1: pre-LN */
    tfm_activation act;  /* feed-forward activation, default ReLU */
    float dropout;       /* on each sub-layer's output before the residual sum (training only) */
    float attn_dropout;  /* on the attention weights (training only) */
    float ln_eps;        /* 0 -> 1e-5 (the eps of RMSNorm too) */
    int no_bias;         /* 0: every linear map has a bias */
    tfm_norm_kind norm;  /* 0: layernorm; TFM_NORM_RMS: every norm is an RMSNorm (weight only) */
    int max_batch;       /* 0 -> 1 */
    int max_len;         /* required: longest input sequence */
    int max_kv_len;      /* cross: longest sequence attended over; 0 -> max_len */
    int rope_dims;       /* rotary positions in the self-attention (tfm_mha_desc.rope_dims); 0: none */
    float rope_base;     /* with rope_dims: 0 -> 10000 */
    int n_kv_heads;      /* key/value heads of both attentions (tfm_mha_desc.n_kv_heads); 0 -> n_heads */
    int attn_window;     /* sliding-window self-attention (tfm_mha_desc.attn_window); 0: none */
    int attn_sinks;      /* with attn_window: attention sinks (tfm_mha_desc.attn_sinks) */
} tfm_block_desc;

/* Sub-layer s (0 self-attention, then cross-attention, then feed-forward) reads stream[s] and writes
   stream[s+1]; stream[0] is the caller's input, the last one the caller's output. */
#define TFM__MAX_SUB 3
typedef struct tfm_block {
    tfm_block_desc desc;                   /* with defaults applied */
    int n_sub;                             /* 2, or 3 with cross-attention */
    tfm_mha self_attn, cross_attn;
    tfm_linear linear1, linear2;           /* (F,C) ((2F,C) with SwiGLU) and (C,F) */
    tfm_layernorm norm[TFM__MAX_SUB];      /* norm1, norm2 (, norm3) */
    /* saved by forward */
    const float *stream[TFM__MAX_SUB];     /* input of each sub-layer */
    float *buf_stream[TFM__MAX_SUB];       /* internal streams 1..n_sub-1 */
    float *ln_io[TFM__MAX_SUB];            /* pre-LN: the layernorm's output; post-LN: its input */
    float *ff_pre, *ff_act;                /* (B,T,F) before and after the activation ((B,T,2F) before SwiGLU) */
    int bf_u, bf_h;                        /* pre-LN ln_io, ff_act held bf16 activations (tfm__bf16_store) */
    int bf_pre;                            /* ff_pre held bf16 (rows of tfm__bf16_ld(F1): tfm__op_linear_act) */
    const float *xkv;
    tfm_attn_opts opts;                    /* the last call's options */
    /* scratch */
    float *sub_out, *d_a, *d_b, *d_u, *d_ff1, *d_ff2;
    int B, T, Tk, has_grad;
    tfm_device device;
} tfm_block;

/* Carve a layer from mem (or count it, with counting arenas). TFM_E_ARG names a bad desc field. */
TFMDEF tfm_result tfm_block_init(tfm_block *blk, const tfm_block_desc *desc, tfm_mem *mem);
/* torch's initialisation of the same layer (attention as tfm_mha_init_params, linear maps
   U(+-1/sqrt(fan_in)), layernorm weight 1 and bias 0). TFM_E_ARG if the layer has no memory yet. */
TFMDEF tfm_result tfm_block_init_params(tfm_block *blk, tfm_rng *rng);
/* The parameter of torch name `name` (nn.TransformerEncoderLayer's or DecoderLayer's:
   "self_attn.in_proj_weight", "linear1.bias", "norm2.weight", ...): *value and *grad (either may be
   NULL). TFM_E_ARG names an unknown one. */
TFMDEF tfm_result tfm_block_param(tfm_block *blk, const char *name, tfm_tensor *value, tfm_tensor *grad);
/* y (B,T,C) = layer(x (B,T,C)); cross: over xkv (B,Tk,C), else xkv must be NULL. opts (NULL: none): causal,
   key_lens (lengths of x), mask (additive, self-attention), kv_lens (lengths of xkv), training (dropout
   at the desc's rates, masks drawn from seed). x and xkv are read again by backward; y must not alias them. */
TFMDEF tfm_result tfm_block_forward(tfm_block *blk, tfm_tensor *y, const tfm_tensor *x, const tfm_tensor *xkv,
                                    const tfm_attn_opts *opts);
/* Adds into dx (B,T,C), dxkv (B,Tk,C) (cross; NULL to skip) and every parameter gradient. */
TFMDEF tfm_result tfm_block_backward(tfm_block *blk, tfm_tensor *dx, tfm_tensor *dxkv, const tfm_tensor *dy);

/* ==== >>api-model ==== */

typedef enum tfm_model_kind {
    TFM_MODEL_NONE = 0,
    TFM_MODEL_ENCODER_CLASSIFIER = 1, /* encoder, pooling, classification head; one label per sequence */
    TFM_MODEL_DECODER_LM = 2,         /* causal decoder-only language model; a target per position */
    TFM_MODEL_ENCODER_DECODER = 3     /* encoder over the source, decoder over the target (teacher forcing) */
} tfm_model_kind;

/* Positions: a learned table or the sinusoidal one added to the embeddings, none, or rotary (RoFormer's, in
   GPT-NeoX's and LLaMA's half-split layout): no table, every self-attention turns its queries and keys by
   their positions (cfg.rope_dims, cfg.rope_base) */
typedef enum tfm_pos_kind { TFM_POS_LEARNED = 0, TFM_POS_SINUSOIDAL = 1, TFM_POS_NONE = 2, TFM_POS_ROPE = 3 } tfm_pos_kind;
typedef enum tfm_pool_kind { TFM_POOL_MEAN = 0, TFM_POOL_CLS = 1 } tfm_pool_kind;
typedef enum tfm_init_kind { TFM_INIT_NORMAL = 0, TFM_INIT_XAVIER = 1 } tfm_init_kind;

/* Zero means default; required fields left at 0 give TFM_E_ARG naming the field. */
typedef struct tfm_config {
    tfm_model_kind kind;     /* required */
    int vocab_size;          /* input tokens (classifier, LM) or source tokens (enc-dec); required but for a
                                classifier or encoder-decoder with input_dim (the LM's output needs it) */
    int input_dim;           /* > 0: continuous inputs. The classifier's encoder, the LM or the encoder of an
                                encoder-decoder reads batch.inputs (B,T,input_dim) through a learned projection
                                input_proj (d_model, input_dim) instead of token embeddings (ViT patches,
                                audio frames) */
    int cls_token;           /* classifier: 1 prepends a learned vector cls_token (d_model) to every sequence,
                                as ViT's [CLS]: the encoder runs on T+1 positions (max_len + 1 learned
                                positions), lens count inputs only, and TFM_POOL_CLS pools it */
    int type_vocab_size;     /* classifier or LM of tokens, no cls_token: > 0 adds a token-type table type_emb
                                (type_vocab_size, d_model), BERT's segment embedding: position t of row b adds
                                row batch.token_types[b,t] (0 everywhere when token_types is NULL) */
    int emb_norm;            /* classifier or LM: 1 normalises the embedding sum (tokens, positions, types) with a
                                layernorm emb_norm (eps ln_eps) before its dropout and the first block, as BERT */
    int tgt_vocab_size;      /* enc-dec: target tokens; 0 -> vocab_size */
    int n_classes;           /* classifier: required */
    int d_model;             /* required */
    int n_heads;             /* required, divides d_model */
    int n_layers;            /* 0 -> 2: encoder layers, or the LM's decoder layers */
    int n_dec_layers;        /* enc-dec: 0 -> n_layers */
    int d_ff;                /* 0 -> 4 * d_model */
    int max_len;         /* required: longest input (source) sequence */
    int max_tgt_len;         /* enc-dec: longest target sequence; 0 -> max_len */
    int max_batch;           /* 0 -> 1 */
    tfm_activation act;      /* 0 -> ReLU; TFM_ACT_SWIGLU: LLaMA's gated feed-forward of hidden size d_ff */
    int norm_first;          /* 0: post-LN (the paper); 1: pre-LN, with a final layernorm per stack */
    tfm_pos_kind pos;        /* 0 -> learned positions; TFM_POS_ROPE: rotary, below */
    int scale_emb;           /* 1: token embeddings times sqrt(d_model) */
    tfm_pool_kind pool;      /* classifier: 0 -> mean over valid positions; or first token */
    int tie_output;          /* LM, enc-dec: the output projection is the (target) token embedding */
    int share_emb;           /* enc-dec: one embedding for source and target (vocabularies equal) */
    int no_bias;             /* 0: linear maps have biases */
    float dropout;           /* embeddings and residual branches, training only */
    float attn_dropout;      /* attention weights, training only */
    float ln_eps;            /* 0 -> 1e-5 */
    float label_smoothing;   /* cross-entropy label smoothing, 0 -> none */
    int ignore_index;        /* targets equal to this are skipped; 0 -> -100 (has_ignore_index to use 0) */
    int has_ignore_index;    /* 1: ignore_index is used as given, even 0 */
    tfm_init_kind init;      /* 0 -> N(0, init_std) for matrices and embeddings; or Xavier uniform */
    float init_std;          /* 0 -> 0.02 */
    uint64_t seed;           /* initialisation and dropout */
    int inference_only;      /* 1: no gradients, optimizer state or backward scratch */
    int last_logits;         /* 1 (with inference_only; LM or enc-dec): logits for one position per row, so
                                the model holds B*V of them instead of B*T*V: tfm_model_forward (no
                                targets) computes each row's last position, tfm_model_logits is (B,1,V);
                                generation, scoring and beam search are unchanged. 0: every position */
    int moment_shards;       /* ZeRO-1 (>>api-dist): > 1 keeps the AdamW moments of one share only: the flat
                                parameters (tfm_model_flat) cut into moment_shards contiguous shares as
                                tfm_dist_shard cuts them, and this model holds share moment_shard, so each
                                rank of a group of that size holds 1/size of the moments. Such a model steps
                                with tfm_dist_step and is saved and loaded with tfm_dist_save/_load (not the
                                tfm_model_ calls). 0 or 1: all the moments */
    int moment_shard;        /* which share: the rank, in [0, moment_shards) */
    /* The LLaMA-style decoder's options; 0 keeps the model as above. */
    tfm_norm_kind norm;      /* TFM_NORM_RMS: every norm, the blocks', the stacks' final ones and emb_norm, is an
                                RMSNorm (weight only; eps ln_eps); saved in checkpoints */
    int rope_dims;           /* pos TFM_POS_ROPE: channels turned in each head, even; 0 -> the head size. Saved */
    float rope_base;         /* pos TFM_POS_ROPE: the rotary base, > 1; 0 -> 10000. Saved */
    int n_kv_heads;          /* grouped-query attention: key/value heads of every attention layer, dividing n_heads
                                (1: multi-query); the KV cache holds these only. 0 (or n_heads, kept as 0) -> n_heads.
                                Saved */
    int attn_window;         /* > 0: the decoder's self-attention is a sliding window: position p sees positions
                                p - attn_window < j <= p (training and scoring cost O(T attn_window)); the
                                cache then keeps attn_sinks + attn_window rows a row, rolling, and with
                                pos TFM_POS_ROPE generation goes on past max_len (max_tgt_len) in constant
                                memory. LMs and an encoder-decoder's decoder. 0: full causal. Saved */
    int attn_sinks;          /* with attn_window: positions j < attn_sinks stay visible to every position
                                (attention sinks, kept in the cache ahead of the ring). Saved */
    void *user;              /* passed to TFM_MALLOC / TFM_FREE for the model's memory, its caches and its
                                checkpoint buffers; not saved in checkpoints */
    tfm_device device;       /* 0 -> TFM_DEVICE_CPU; TFM_DEVICE_CUDA: the model lives and runs on the GPU
                                (parameters initialised on the host from seed, so both devices start alike);
                                not saved in checkpoints (tfm_model_to_device moves a built model) */
    tfm_precision precision; /* device TFM_DEVICE_CUDA only (refused on the CPU, which computes in fp32): the
                                products of the model's calls. 0 -> fp32, as the CPU; TFM_PREC_TF32: the
                                linear maps on TF32 tensor cores (10-bit mantissas); TFM_PREC_BF16: each
                                product's operands rounded to bf16 (8-bit mantissas), sums in fp32 on
                                tensor cores, the attention's scores and probabilities too (over whole
                                sequences, in flash kernels on sm_80 and later; decoding steps stay
                                fp32), while parameters, AdamW, the residual stream, norms' statistics,
                                softmax statistics and loss stay fp32 (mixed precision); a pre-LN block's
                                normalized inputs, the MLP's hidden layer and an LM head's logit,
                                the attention's output, the hidden layer's output and self-attention's
                                q|k|v gradients, which only products, the flash kernels (and a bias's
                                sums) read, are stored in bf16, and the MLP's pre-activations, the
                                attention's output, each sub-layer's output before the residual sum
                                (without dropout on it) and a training step's logits are rounded to
                                bf16 (as a bf16 product's or flash attention's output is, and PyTorch's
                                autocast gives them on). Not saved in checkpoints: a file loads into
                                either */
} tfm_config;

/* A batch: B rows of T positions, padding at the end of each row. Row b of tokens starts at
   tokens + b * stride, so one (B_max, T_max) buffer serves every shorter batch. Forward copies what it
   needs: the caller's buffers may change as soon as it returns. */
typedef struct tfm_batch {
    int batch;               /* B */
    int len;                 /* T: input (source) length */
    int stride;              /* row stride of tokens, inputs (in positions) and LM targets; 0 -> len */
    const int32_t *tokens;   /* (B,T) input ids (classifier, LM) or source ids (enc-dec); NULL with input_dim */
    const float *inputs;     /* cfg.input_dim: (B,T,input_dim) continuous inputs, row b at b*stride*input_dim */
    const int32_t *lens;     /* (B) valid lengths of tokens; NULL: all T */
    const int32_t *token_types; /* cfg.type_vocab_size: (B,T) token-type ids in [0, type_vocab_size), row stride
                                stride as tokens; NULL: type 0 everywhere */
    int tgt_len;             /* enc-dec: Tt */
    int tgt_stride;          /* enc-dec: row stride of tgt_in and targets; 0 -> tgt_len */
    const int32_t *tgt_in;   /* enc-dec: (B,Tt) decoder inputs (shifted right: start token first) */
    const int32_t *targets;  /* classifier (B) labels; LM (B,T); enc-dec (B,Tt); ignore_index to skip;
                                NULL: forward computes logits but no loss */
} tfm_batch;

typedef enum tfm_schedule {
    TFM_SCHED_CONSTANT = 0,  /* lr, after a linear warmup if warmup_steps */
    TFM_SCHED_COSINE = 1,    /* linear warmup, then cosine from lr to min_lr at total_steps; a step past
                                total_steps is refused (TFM_E_ARG): raise total_steps to go on (it may
                                change between steps: the rate is a function of the step and opt only) */
    TFM_SCHED_INV_SQRT = 2   /* lr * min(s^-0.5, s * warmup^-1.5) * sqrt(warmup) (the paper's, peak lr) */
} tfm_schedule;

/* AdamW with decoupled weight decay, global-norm clipping and a schedule. Zero means default. */
typedef struct tfm_optim {
    float lr;                /* required: peak learning rate */
    float beta1, beta2;      /* 0 -> 0.9, 0.999 */
    float eps;               /* 0 -> 1e-8 */
    float weight_decay;      /* 0 -> none */
    int decay_all;           /* 0: no decay on biases, layernorms and embeddings */
    float clip_norm;         /* > 0: scale gradients so their global L2 norm is at most this */
    tfm_schedule schedule;
    int warmup_steps;
    int total_steps;         /* cosine: required, > warmup_steps */
    float min_lr;            /* cosine: the rate at total_steps, in [0, lr] */
} tfm_optim;

/* A named parameter: torch state_dict name, the tensor, its gradient, whether AdamW decays it. */
typedef struct tfm_param {
    char name[64];
    tfm_tensor value, grad;   /* views into the model's memory; grad.data NULL when inference_only */
    int decay;
    int64_t offset;           /* where value (and grad) start in the flat arrays of tfm_model_flat */
} tfm_param;

/* The internals of a model (layers, activations, optimizer state): private, in the model's memory. */
struct tfm__model_impl;

typedef struct tfm_model {
    tfm_config cfg;                 /* the config, with defaults applied */
    tfm_param *params;              /* the parameter registry, in memory order */
    int n_params;
    int64_t n_weights;              /* number of trainable floats */
    int64_t step;                   /* optimizer steps taken */
    struct tfm__model_impl *impl;   /* everything else; NULL before init and after free */
} tfm_model;

/* Apply defaults to cfg and check it: the config a model built from cfg would use. */
TFMDEF tfm_result tfm_config_resolve(const tfm_config *cfg, tfm_config *out);
/* Bytes a model of this config needs (one block; nothing else is allocated). A CUDA model (cfg.device)
   takes as many again on the device: the block's twin. */
TFMDEF tfm_result tfm_model_memory_size(const tfm_config *cfg, size_t *bytes);
/* Build a model in mem (size bytes, from tfm_model_memory_size) or, when mem is NULL, in memory
   allocated here. Parameters are initialised from cfg.seed. TFM_E_ARG names a bad field. With
   cfg.device TFM_DEVICE_CUDA the block gets its device twin (one cudaMalloc): TFM_E_NOMEM when the device
   is short of memory, TFM_E_NO_CUDA without a device or TFM_CUDA; nothing stays allocated then. */
TFMDEF tfm_result tfm_model_init(tfm_model *m, const tfm_config *cfg, void *mem, size_t size);
/* Free what tfm_model_init allocated. */
TFMDEF void tfm_model_free(tfm_model *m);
/* Dropout on (1) or off (0). A new model is in training mode unless inference_only. */
TFMDEF void tfm_model_train(tfm_model *m, int training);
/* Run the model on a batch; with targets, *loss (may be NULL) receives the mean cross-entropy over the
   targets counted (not ignore_index, not past a row's length), and *n_counted (may be NULL) how many
   they were: sum loss * n_counted over batches and divide by the total for an exact mean. Logits stay
   in the model until the next forward (tfm_model_logits): every position's, or with cfg.last_logits
   each row's last one (lens[b] - 1, else the last) and no targets (TFM_E_ARG). TFM_E_SHAPE if the batch
   exceeds max_batch or the lengths; TFM_E_ARG for an id or label out of range. On a GPU model, after its
   first forward or training step, one CUDA graph (tfm_cuda_set_graphs). */
TFMDEF tfm_result tfm_model_forward(tfm_model *m, const tfm_batch *batch, float *loss, int64_t *n_counted);
/* Gradients of loss_scale * loss from the last forward, added into the gradients. Use
   loss_scale = 1/k to accumulate k micro-batches into one step. */
TFMDEF tfm_result tfm_model_backward(tfm_model *m, float loss_scale);
/* Clear every gradient. */
TFMDEF void tfm_model_zero_grad(tfm_model *m);
/* Clip (if opt->clip_norm), then one AdamW update at the scheduled learning rate; step += 1.
   *grad_norm (may be NULL) receives the global gradient norm before clipping. The model's own
   tfm_adamw_step over its parameters. */
TFMDEF tfm_result tfm_model_step(tfm_model *m, const tfm_optim *opt, float *grad_norm);
/* One whole training step on a batch with targets: tfm_model_forward, tfm_model_zero_grad,
   tfm_model_backward(m, 1) and tfm_model_step, with the same results; *loss, *n_counted and *grad_norm
   (each may be NULL) as those give them. On a GPU model every step after the first runs as one CUDA graph
   where it can (tfm_cuda_set_graphs), read back once at its end. Errors as those calls', under this name;
   checked before anything changes, but for a gradient norm that is not finite (TFM_E_ARG: the parameters,
   moments and step are as they were, the gradients the batch's). A model with cfg.moment_shards trains
   with the separate calls and tfm_dist_step. */
TFMDEF tfm_result tfm_model_train_step(tfm_model *m, const tfm_batch *batch, const tfm_optim *opt, float *loss,
                                       int64_t *n_counted, float *grad_norm);

/* One parameter for tfm_adamw_step: its value, gradient and the two moments AdamW keeps (all of one
   size, moments zeroed before the first step and kept between steps), and whether it is decayed. */
typedef struct tfm_adamw_param { tfm_tensor value, grad, m, v; int decay; } tfm_adamw_param;
/* AdamW over any list of parameters, as tfm_model_step does it: the global gradient norm over all of
   them (*grad_norm, may be NULL), clipping to opt->clip_norm, then one update at the rate the schedule
   gives for `step` (1-based: 1 on the first call, the caller counts). TFM_E_ARG for a non-finite norm
   (nothing is updated then) or a bad opt. Deterministic at any thread count. */
TFMDEF tfm_result tfm_adamw_step(const tfm_adamw_param *ps, int n, const tfm_optim *opt, int64_t step,
                                 float *grad_norm);
/* *lr = the learning rate the schedule gives for step s (1-based: the step about to be taken). Checks opt
   as tfm_model_step does: TFM_E_ARG for a bad field, or for a cosine step past total_steps. */
TFMDEF tfm_result tfm_optim_lr(const tfm_optim *opt, int64_t s, float *lr);
/* The last forward's logits: (B,n_classes), (B,T,V) or (B,Tt,Vt); (B,1,V) with cfg.last_logits. After a
   bf16 model's training step (cfg.precision) an LM's or encoder-decoder's are those its loss read, rounded
   to bf16 (kept so on the GPU and widened by this call; data NULL if that fails, tfm_last_error says why). */
TFMDEF tfm_tensor tfm_model_logits(const tfm_model *m);
/* A classifier's last forward: the pooled encoder output the head reads, (B,d_model) (cfg.pool: the mean
   over each row's valid positions, or its first); a sentence embedding. Data NULL for other kinds or
   before a forward. */
TFMDEF tfm_tensor tfm_model_pooled(const tfm_model *m);
/* Find a parameter by its torch name; NULL if none. */
TFMDEF const tfm_param *tfm_model_param(const tfm_model *m, const char *name);
/* Every parameter as one contiguous float array (grads 0), or every gradient as another with the same
   layout (grads 1; NULL for an inference_only model); *n (may be NULL) receives its length. Parameter i
   is at params[i].offset in both. The gaps the 64-byte alignment leaves between parameters hold zeros.
   For an optimizer of your own, or one all-reduce of the gradients across processes. */
TFMDEF float *tfm_model_flat(tfm_model *m, int grads, int64_t *n);
/* In data-parallel training, this process's rows are rows row0.. of the global batch: dropout masks are
   drawn as one process running the whole global batch would draw them (with the same pass seed, which
   every process has when all start from the same model). 0, the default, for a single process. */
TFMDEF tfm_result tfm_model_set_batch_offset(tfm_model *m, int64_t row0);

/* The keys and values a decoder has computed, kept between decoding calls so that each new position
   costs one row per layer: self-attention rows of every position decoded so far and, for an
   encoder-decoder, the projected source of the cross-attention. It has its own memory, sized by
   max_batch rows of max_len positions. Row b of a batch lives in cache slot slot[b] and holds lens[b]
   positions (rows may hold different numbers: uneven prompts); reordering rows (beam search) moves slots
   and copies only the rows that are duplicated. Layout, per layer l and slot s:
   2E floats (k then v) per position t at self_kv + ((l * max_batch + s) * max_len + t) * 2E, and the
   same for cross_kv with max_src_len; E = kv_dim, the key/value heads' channels (d_model, or
   d_model / n_heads * n_kv_heads with grouped-query attention). Its floats: n_layers * max_batch *
   (max_len + max_src_len) * 2E. A model with a sliding window (cfg.attn_window W, cfg.attn_sinks S)
   gets a rolling cache: max_len is at most S + W rows, position t < max_len sits in row t and a later one
   in row S + (t - S) % W (ring order after the sinks, overwriting the position that has left the
   window), so lens may pass max_len. */
typedef struct tfm_kv_cache {
    int n_layers, max_batch, max_len, max_src_len, d_model;
    int kv_dim;           /* E: channels of the keys (and of the values) per position */
    int window, sinks;    /* the model's cfg.attn_window and attn_sinks: the ring (0: positions in order) */
    int src_len;          /* encoder-decoder: source positions cached (0: none yet) */
    float *self_kv, *cross_kv;
    int32_t *slot;        /* (max_batch) the slot of each batch row */
    int32_t *lens;        /* (max_batch) positions cached in each batch row */
    int32_t *src_lens;    /* (max_batch) valid source length of each batch row */
    int has_src_lens;
    tfm_device device;
    void *owned, *user;   /* the allocation, and the allocator's user pointer (the model's cfg.user) */
    int kept;             /* internal: the keys and values are in the thread's space of a generation call */
} tfm_kv_cache;

/* A cache for model m's decoder: max_batch rows (0: cfg.max_batch; more rows than cfg.max_batch are
   decoded cfg.max_batch at a time) of up to max_len positions (0: the model's decoder length, cfg.max_len
   or cfg.max_tgt_len, which is also the most it may be, but for a windowed model with rotary positions:
   any). A windowed model's cache holds min(max_len, attn_sinks + attn_window) rows.
   TFM_E_NOMEM if the allocation fails. */
TFMDEF tfm_result tfm_kv_cache_init(tfm_kv_cache *c, const tfm_model *m, int max_batch, int max_len);
TFMDEF void tfm_kv_cache_free(tfm_kv_cache *c);
/* Forget every cached position and source (the memory is kept). */
TFMDEF void tfm_kv_cache_reset(tfm_kv_cache *c);
/* Batch row i continues what row from[i] held, for i < n (the rows of a beam search after pruning);
   from[i] in [0, n_old). Copies only rows taken by more than one new row. */
TFMDEF tfm_result tfm_kv_cache_reorder(tfm_kv_cache *c, const int32_t *from, int n);

/* Streaming: called with each token as it is chosen, for batch row `row` (beam search: never). A non-zero
   return stops that row after this token. */
typedef int (*tfm_token_fn)(void *user, int row, int32_t token);

/* Options of generation; zero means greedy decoding with no stop token. Sampling (temperature > 0)
   applies, in this order: the repetition penalty, temperature, top_k, top_p, min_p, then draws one
   uniform number u from the row's stream and takes the first token (in id order) at which the running
   sum of the kept probabilities exceeds u times their total. */
typedef struct tfm_gen_opts {
    int max_new;          /* required: most tokens to generate (per row) */
    float temperature;    /* 0: greedy (argmax, lowest id on ties); else sample from softmax(logits / temperature) */
    int top_k;            /* sampling: only the k likeliest tokens (and any tied with the k-th); 0 -> all */
    int stop_token;       /* with has_stop: a row ends after emitting this token */
    int has_stop;
    uint64_t seed;        /* sampling: batch row b draws from tfm_rng_seed(seed + b), so a row's text does not
                             depend on the other rows or the thread count */
    float top_p;          /* sampling, in [0,1]: keep the likeliest tokens until their probability reaches
                             top_p (after top_k; ties by lower id first); 0 -> 1 (all) */
    float min_p;          /* sampling, in [0,1]: drop tokens less likely than min_p times the likeliest; 0 -> none */
    float repetition_penalty; /* > 0 (CTRL's): the logit of a token already in the prompt or the output is divided
                             by it when positive, multiplied when negative; 0 -> 1 (none). Greedy too */
    const int32_t *stop_tokens; /* n_stop more stop tokens (may be NULL when n_stop is 0) */
    int n_stop;
    tfm_token_fn on_token;  /* streaming callback (may be NULL), called with on_token_user */
    void *on_token_user;
    int beam_width;       /* tfm_model_beam_search: beams kept per step, in [1, V]; 0 -> 4 */
    float length_penalty; /* tfm_model_beam_search: GNMT's alpha: hypotheses rank by logp / ((5 + n) / 6)^alpha,
                             n their length (stop token included); 0 -> none */
} tfm_gen_opts;

/* Autoregressive decoding with a key/value cache, batch 1. Decoder-only LM: continue prompt
   (n_prompt >= 1 ids; src NULL). Encoder-decoder: encode src (src_len ids), then decode from prompt
   (decoder start ids, e.g. a BOS token). out receives the new ids, *n_out how many (may be NULL).
   n_prompt + max_new must fit max_len (LM) or max_tgt_len (enc-dec), but for a model with a sliding
   window and rotary positions (cfg.attn_window, TFM_POS_ROPE), whose cache rolls: only n_prompt must
   fit, and the new ids go on past it in constant memory. Dropout is off meanwhile;
   the model's last forward state is replaced, so backward is not possible until the next forward.
   The same as tfm_model_generate_batch with one row. */
TFMDEF tfm_result tfm_model_generate(tfm_model *m, const int32_t *src, int src_len, const int32_t *prompt,
                                     int n_prompt, const tfm_gen_opts *opts, int32_t *out, int *n_out);
/* B rows decoded together (B <= cfg.max_batch), each as tfm_model_generate would decode it alone (with the
   seed opts->seed + b): prompts[b] (n_prompts[b] ids) and, for an encoder-decoder, srcs[b] (src_lens[b]
   ids; srcs and src_lens NULL for an LM). Row b's new ids go to out + b * out_stride (out_stride >=
   max_new), their count to n_out[b]. A row ends at a stop token, at max_new or when on_token returns
   non-zero; rows that end stop costing work. The prompts are read first (rows of similar lengths in
   one pass, padded); then each row decodes at its own positions. */
TFMDEF tfm_result tfm_model_generate_batch(tfm_model *m, int B, const int32_t *const *srcs, const int *src_lens,
                                           const int32_t *const *prompts, const int *n_prompts,
                                           const tfm_gen_opts *opts, int32_t *out, int out_stride, int *n_out);
/* Log-probabilities of target (n_target >= 1 ids) following prompt (n_prompt >= 1 ids; an encoder-decoder's
   decoder start ids, with src as in tfm_model_generate): logp[i] (may be NULL) = log p(target[i] |
   prompt, target[0..i-1]) and *total (may be NULL) their sum. One forward without dropout and without
   gradients; n_prompt + n_target - 1 must fit the decoder's length. Replaces the last forward's state. */
TFMDEF tfm_result tfm_model_score(tfm_model *m, const int32_t *src, int src_len, const int32_t *prompt, int n_prompt,
                                  const int32_t *target, int n_target, float *logp, float *total);
/* Beam search (opts: max_new, beam_width, length_penalty, the stop tokens; sampling fields are ignored)
   from one prompt (and src, as in tfm_model_generate). A hypothesis ends at a stop token (kept in its
   output) or at max_new tokens; the search ends when beam_width hypotheses have ended or at max_new.
   The n_best (in [1, beam_width]) best, by length-penalised score, go to out + i * out_stride (out_stride
   >= max_new), their lengths to lens[i] and their scores (sum of log-probabilities) to scores[i] (lens
   and scores may be NULL); *n_found (may be NULL) how many were found (n_best unless the vocabulary is
   exhausted). beam_width may exceed cfg.max_batch: the beams then run cfg.max_batch rows at a time. */
TFMDEF tfm_result tfm_model_beam_search(tfm_model *m, const int32_t *src, int src_len, const int32_t *prompt,
                                        int n_prompt, const tfm_gen_opts *opts, int n_best, int32_t *out,
                                        int out_stride, int *lens, float *scores, int *n_found);

/* ==== >>api-io ====
   Checkpoints are safetensors files: an 8-byte little-endian header length, a JSON header, the raw
   float32 data. One tensor per parameter under its torch name, so torch's safetensors loader (or
   tools/torch_models.py) reads them; "__metadata__" holds the config ("tfm.<field>") and the user's own
   key/values ("user.<key>"). With TFM_SAVE_TRAINING_STATE the AdamW moments go alongside as
   "optim.exp_avg.<name>" and "optim.exp_avg_sq.<name>", with the step count and the random generator's
   state in the metadata, so that training resumed from the file continues exactly as if it had never
   stopped. Saving is atomic (a temporary file in the same directory, flushed, synced and renamed over
   the old one): a save that fails leaves the previous file as it was. Loading trusts nothing in the
   file: every length, offset, shape and string is checked, and each defect is a TFM_E_FORMAT naming
   what was expected and what was found (TFM_E_IO when the file cannot be opened or read). */

#define TFM_SAVE_TRAINING_STATE 1

/* A user metadata entry for tfm_model_save: key (non-empty UTF-8, at most 256 bytes, unique) and value
   (UTF-8 text of any length the 100 MB header allows; store binary data encoded, e.g. as hex). */
typedef struct tfm_kv {
    const char *key;
    const char *value;
} tfm_kv;

#ifndef TFM_NO_STDIO
/* Write the parameters (with flags TFM_SAVE_TRAINING_STATE also the optimizer state) to path, and the
   n_meta user key/values of meta (NULL, 0: none) into its "__metadata__" as "user.<key>". */
TFMDEF tfm_result tfm_model_save(const tfm_model *m, const char *path, int flags, const tfm_kv *meta, int n_meta);
/* Read the config stored in a checkpoint, to build a model for it with tfm_model_init (adjust
   max_batch, inference_only, dropout... before). TFM_E_FORMAT if the file has no config. */
TFMDEF tfm_result tfm_config_load(const char *path, tfm_config *cfg);
/* Load a checkpoint into an initialised model. The file's architecture (kind, sizes, activation,
   norm placement, positions, tying...) must match the model's; the file must hold exactly the
   model's parameters, with the same shapes. Training state in the file is restored into a model that
   trains (the step, the moments and the random generator) and skipped by an inference_only model.
   The whole file is checked and read before anything is written to the model: on failure the model
   is exactly as it was. */
TFMDEF tfm_result tfm_model_load(tfm_model *m, const char *path);

/* One entry of a name map, for checkpoints named another way (Hugging Face's BERT or LLaMA, ...): the
   file's F32 tensor `file` is part `part` of the n_parts row blocks of the model's parameter `model`
   (n_parts 0 or 1: all of it; 3 with parts 0, 1, 2 puts a separate query, key and value into
   in_proj_weight or in_proj_bias). The parts are stacked in part order, each `rows` rows (0: the
   parameter's rows / n_parts, equal blocks), so parts of unequal size (a query of C rows, a key and a
   value of fewer) each start where the part before ends; the parts' rows must add up to the parameter's.
   file NULL: the model's parameter keeps its values (a fresh head), and is not saved. file_rows > 0: the
   file's tensor has that many rows (at least the part's), of which the first fill the part (a position
   table of 512 rows for a model of max_len 256); loading only. */
typedef struct tfm_name_map {
    const char *file;
    const char *model;
    int part, n_parts;
    int file_rows;
    int rows;
} tfm_name_map;
/* Load the parameters of a checkpoint in another naming convention (no config needed in the file)
   through map[0..n_map): every model parameter must be covered, wholly, by the map (its parts each
   once, or file NULL); every tensor of the file must be in the map, with the shape of its part, or be
   one of the n_skip names in skip, which are checked like the rest but not read and may have any of
   safetensors' dtypes (an I64 position_ids); anything else, a tensor the map names that the file lacks
   or a misshapen one is TFM_E_FORMAT naming it. All or nothing, as tfm_model_load; moments and step are
   left as they are. */
TFMDEF tfm_result tfm_model_load_mapped(tfm_model *m, const char *path, const tfm_name_map *map, int n_map,
                                        const char *const *skip, int n_skip);
/* Save the parameters under the names of map[0..n_map) (every parameter covered wholly, as for
   tfm_model_load_mapped; a file NULL entry's parameter is left out; file_rows must be 0): one F32 tensor
   per entry, in map order, a part holding its rows of the parameter, so the file is what PyTorch's
   state_dict of the model in that naming convention would be (safetensors.torch.load_file reads it).
   "__metadata__" holds "format": "pt" and the n_meta user key/values as "user.<key>" (tfm_checkpoint_meta
   reads them); no config, no optimizer state. Atomic as tfm_model_save; TFM_E_IO when it cannot write. */
TFMDEF tfm_result tfm_model_save_mapped(const tfm_model *m, const char *path, const tfm_name_map *map, int n_map,
                                        const tfm_kv *meta, int n_meta);
/* The map of Hugging Face's LLaMA names (LlamaForCausalLM's state_dict, in its order) for a LLaMA-shaped
   decoder LM: pre-norm (norm_first) RMSNorm blocks, SwiGLU, no biases, rotary positions over whole heads
   (cfg.pos TFM_POS_ROPE, rope_dims 0 or the head size), nothing LLaMA lacks (scale_emb, emb_norm,
   type_vocab_size, cls_token, input_dim); anything else is TFM_E_ARG naming the field. Per layer i:
     model.layers.i.self_attn.{q,k,v}_proj.weight  parts 0, 1, 2 of decoder.layers.i.self_attn.in_proj_weight
     model.layers.i.self_attn.o_proj.weight        decoder.layers.i.self_attn.out_proj.weight
     model.layers.i.mlp.{gate,up}_proj.weight      parts 0, 1 of decoder.layers.i.linear1.weight (SwiGLU's
                                                   silu(gate x) * up x: the gate is linear1's first rows)
     model.layers.i.mlp.down_proj.weight           decoder.layers.i.linear2.weight
     model.layers.i.input_layernorm.weight         decoder.layers.i.norm1.weight
     model.layers.i.post_attention_layernorm.weight decoder.layers.i.norm2.weight
   and model.embed_tokens.weight (tok_emb.weight), model.norm.weight (decoder.norm.weight), lm_head.weight
   (head.weight; none with tie_output, Hugging Face's tie_word_embeddings). The query part has C rows, the
   key and value parts the rest of in_proj_weight's rows, halved. map (cap entries) and names (cap strings
   of 64 bytes, the file names; the model names point into m->params) get the *n entries; map and names
   NULL with cap 0: *n only. For tfm_model_load_mapped (old files' self_attn.rotary_emb.inv_freq buffers go
   in its skip list) and tfm_model_save_mapped; config.json (rms_norm_eps = ln_eps, rope_theta =
   rope_base, ...) is the caller's. */
TFMDEF tfm_result tfm_llama_name_map(const tfm_model *m, tfm_name_map *map, char (*names)[64], int cap, int *n);
/* The value of user metadata `key` (as given to tfm_model_save) in the checkpoint at path: with buf,
   the value and a NUL into buf (size bytes); with buf NULL, nothing is written (a size query). *len (len
   may be NULL) gets the value's length in bytes, without the NUL, whenever the key is there. TFM_E_ARG
   when the key is absent ("... has no user metadata key 'vocab'") or the value does not fit in size bytes
   with its NUL; TFM_E_IO / TFM_E_FORMAT when the file cannot be read or is malformed. */
TFMDEF tfm_result tfm_checkpoint_meta(const char *path, const char *key, char *buf, size_t size, size_t *len);
#endif

/* ==== >>api-cuda ====
   Built with TFM_CUDA, models (cfg.device), layers (tfm_mem.device) and tensors (tensor.device with
   device memory) run on the current CUDA device; every other call is the same as on the CPU. Without
   TFM_CUDA these calls return TFM_E_NO_CUDA (tfm_cuda_free does nothing). A failing CUDA call makes the
   public call that ran it return TFM_E_CUDA with CUDA's own message (a call that returns nothing, like
   tfm_model_zero_grad, leaves it to the next call to report); no call exits or aborts. After an error that
   CUDA keeps (an illegal address, say) every later call fails too: the process must start again. */

/* TFM_OK when this build has CUDA and a device is present; TFM_E_NO_CUDA otherwise, saying which. */
TFMDEF tfm_result tfm_cuda_available(void);
/* One line about the current device into buf (NUL-terminated): "NVIDIA H100 80GB HBM3, 79.1 GiB, sm_90". */
TFMDEF tfm_result tfm_cuda_device_info(char *buf, size_t size);
/* Device memory for tensors of your own (tensor.device = TFM_DEVICE_CUDA). TFM_E_NOMEM when it fails. */
TFMDEF tfm_result tfm_cuda_malloc(void **ptr, size_t bytes);
TFMDEF void tfm_cuda_free(void *ptr);
/* Wait until the device has done all work queued so far (before reading a clock, say). */
TFMDEF tfm_result tfm_cuda_synchronize(void);
/* on != 0: this thread's fp32 products on the GPU may use TF32 tensor cores (10-bit mantissas in the
   products, fp32 sums: faster, about 1e-3 relative). Off by default, so results match the CPU's. */
TFMDEF tfm_result tfm_cuda_set_tf32(int on);
/* on != 0 (the default): this thread's decoding steps on the GPU (generation, beam search), training
   steps (tfm_model_train_step) and forward passes (tfm_model_forward) each run as one CUDA graph instead
   of a launch per kernel, after a model's first (which sizes its work spaces): captured, or, when a step
   would queue the same operations as the last captured step of its kind, that graph launched again
   (decoding steps after a call's first; training steps and forward passes on batches of the same
   shapes); 0: launch by launch. The same results either way; a step that cannot be captured
   runs launch by launch. */
TFMDEF tfm_result tfm_cuda_set_graphs(int on);
/* Move a built model to `device` with everything it holds: parameters, gradients, AdamW moments, the
   step, the generator, training mode. The model is rebuilt in new memory (the library's own, also when
   the old one was yours) and the old memory freed; on failure (TFM_E_NOMEM, TFM_E_NO_CUDA) the model is
   as it was. Caches made for it before (tfm_kv_cache) must be made again. */
TFMDEF tfm_result tfm_model_to_device(tfm_model *m, tfm_device device);

/* ==== >>api-dist ====
   Data-parallel training. Every process (a rank) holds the whole model and runs forward and backward on
   its own rows of each global batch; tfm_dist_allreduce_grads then averages the gradients over the
   ranks, and every rank takes the same tfm_model_step. The averaged gradient is bit-identical on every
   rank (each bucket is summed once, on one rank, and copied to the others), so clipping and AdamW run
   identically and the parameters stay bit-identical across ranks. One step:

       tfm_dist_shard(&d, global_B, &row0, &row1);     this rank's rows [row0, row1)
       tfm_model_set_batch_offset(&m, row0);           dropout masks as one process would draw them
       tfm_model_zero_grad(&m);
       tfm_model_forward(&m, &my_rows, &loss, &n);
       tfm_dist_reduce_loss(&d, loss, n, &global_loss, &global_n);   the global batch's loss
       tfm_model_backward(&m, (float)d.size * n / global_n);         1 when every rank counts alike
       tfm_dist_step(&d, &m, &opt, NULL);                            average the gradients, AdamW

   ZeRO-1: a model built with cfg.moment_shards = d.size and cfg.moment_shard = d.rank keeps the AdamW
   moments of its own 1/size share of the parameters only: two of the model's four parameter-sized
   arrays shrink to 1/size (tfm_model_memory_size counts it). tfm_dist_step all-reduces the gradients
   as without shards, takes the norm for clipping over all of them as tfm_model_step does, updates this
   rank's share and sends each share's new parameters from its rank to the others: the same bits as
   the unsharded run at any number of ranks, for 1.5 times its traffic (the parameters' all-gather on
   top of the all-reduce). tfm_dist_save/_load gather the moments whole on rank 0 for the call (rank 0
   then holds two more parameter-sized arrays), so a checkpoint does not depend on the sharding: resume
   it sharded, unsharded or in one process.

   With TFM_MPI (define it in the implementation file and build with mpicc) the group is an MPI
   communicator; the header includes <mpi.h> only then. Without it the same calls work for one process
   (rank 0 of 1), so a program written for several processes runs alone unchanged. Collectives must be
   called by every rank in the same order. A failed collective (a rank gone, a network error) returns
   TFM_E_COMM with MPI's message; the group is then unusable: stop (MPI_Abort). A CUDA model's
   gradients and ZeRO-1 shares go through the host for MPI, or with TFM_NCCL through NCCL on the
   device (a reduce-scatter and an all-gather in place, per bucket: the same bits on every rank), queued
   after its kernels, or with tfm_dist_backward on a stream of their own as the backward pass goes; MPI
   still carries what happens once (broadcast, checkpoints, checksums, losses). */

/* A process group. rank, size and bucket are for reading, timeout for setting; impl is private. */
typedef struct tfm_dist {
    int rank;           /* this process, in [0, size) */
    int size;           /* processes in the group */
    int64_t bucket;     /* floats per collective call (at most INT_MAX, so no count passes MPI's int) */
    double timeout;     /* 0 (tfm_dist_init's): collectives wait as long as MPI does. > 0: a collective not
                           done after this many seconds returns TFM_E_COMM (a rank has stalled or died and
                           the launcher did not end the job); you may set it after tfm_dist_init */
    int64_t early;      /* the last tfm_dist_backward's buckets that went out while its backward pass still ran
                           (a GPU model through NCCL; the rest went out after it) */
    void *impl;         /* the communicator and scratch; NULL for a group of one */
} tfm_dist;

/* Join a group. comm: a pointer to an MPI_Comm (MPI initialised by the caller), or NULL for
   MPI_COMM_WORLD; without TFM_MPI, NULL gives a group of one and anything else TFM_E_ARG. The
   communicator is duplicated (the caller's stays untouched and may be freed) and its errors return
   instead of aborting. bucket: floats reduced per call, 0 -> 1<<22 (16 MiB); at most INT_MAX.
   A collective: every rank of comm calls it. TFM_E_COMM if MPI fails, TFM_E_NOMEM. */
TFMDEF tfm_result tfm_dist_init(tfm_dist *d, const void *comm, int64_t bucket);
/* Leave the group: free the duplicated communicator (MPI_Comm_free: every rank calls it) and the
   scratch. */
TFMDEF void tfm_dist_free(tfm_dist *d);
/* Every rank takes rank 0's model: parameters and, for a model that trains, the AdamW moments (sharded
   ones stay each rank's own), the step and the random generator (which draws each forward's dropout
   seed). Ranks must have built the same architecture: a mismatch is TFM_E_ARG on every rank, before
   anything is copied. */
TFMDEF tfm_result tfm_dist_broadcast_model(tfm_dist *d, tfm_model *m);
/* Average the model's gradients over the ranks (the flat buffer of tfm_model_flat, in buckets); nothing
   when they are averaged already (by tfm_dist_backward, or this call, since the last backward or
   tfm_model_zero_grad). */
TFMDEF tfm_result tfm_dist_allreduce_grads(tfm_dist *d, tfm_model *m);
/* tfm_model_backward(m, loss_scale), then the gradients averaged as tfm_dist_allreduce_grads does, with
   the same bits. For a GPU model built with TFM_NCCL the buckets go out during the backward pass: each
   as soon as the layers whose gradients it holds are done (the flat buffer runs from the embeddings up
   through the layers, and backward comes down from the top), on a stream of its own beside the backward's
   kernels, so the all-reduce overlaps the rest of the backward; the model's later work waits for it.
   Elsewhere the two calls in turn. In gradient accumulation, call tfm_model_backward for every
   micro-batch but the last and this for the last. A backward that fails on one rank leaves the others
   waiting in their collectives: stop the job. */
TFMDEF tfm_result tfm_dist_backward(tfm_dist *d, tfm_model *m, float loss_scale);
/* tfm_dist_allreduce_grads, then tfm_model_step (clipping, AdamW, step += 1) with its *grad_norm; for a
   model with sharded moments the ZeRO-1 step (above), with the same results. A bad opt is refused before
   anything changes; a non-finite gradient norm (TFM_E_ARG on every rank) leaves the gradients averaged
   and the parameters as they were. */
TFMDEF tfm_result tfm_dist_step(tfm_dist *d, tfm_model *m, const tfm_optim *opt, float *grad_norm);
/* x (n floats, the same n on every rank) becomes the sum over ranks, or the mean with average;
   bit-identical on every rank. */
TFMDEF tfm_result tfm_dist_allreduce(tfm_dist *d, float *x, int64_t n, int average);
/* x (n doubles) becomes the sum over ranks: counts and metric sums (correct predictions, loss sums). */
TFMDEF tfm_result tfm_dist_sum(tfm_dist *d, double *x, int n);
/* The global batch's mean loss from each rank's mean loss and count of targets (tfm_model_forward's):
   sum(loss_r * n_r) / sum(n_r) into *global_loss, sum(n_r) into *global_n (either may be NULL). Ranks
   that count different numbers of targets (padding, ignore_index) get the global batch's exact gradient
   by calling it before backward and scaling backward by size * n_counted / global_n. */
TFMDEF tfm_result tfm_dist_reduce_loss(tfm_dist *d, float loss, int64_t n_counted, float *global_loss,
                                       int64_t *global_n);
/* This rank's share [*begin, *end) of n items (rows of a global batch, or a data set's indices):
   contiguous, in rank order, the first n % size ranks one item more. Not a collective. */
TFMDEF tfm_result tfm_dist_shard(const tfm_dist *d, int64_t n, int64_t *begin, int64_t *end);
/* A checksum of the model's state (parameters, moments unless sharded, step, generator) into *sum (may
   be NULL), compared across ranks: TFM_E_COMM naming the first rank whose state differs from rank 0's. */
TFMDEF tfm_result tfm_dist_check_model(tfm_dist *d, const tfm_model *m, uint64_t *sum);
#ifndef TFM_NO_STDIO
/* tfm_model_save on rank 0 (atomic, as always); every rank returns its result (and message). Sharded
   moments are gathered whole to rank 0 for TFM_SAVE_TRAINING_STATE. */
TFMDEF tfm_result tfm_dist_save(tfm_dist *d, const tfm_model *m, const char *path, int flags, const tfm_kv *meta,
                                int n_meta);
/* tfm_model_load on rank 0 (only rank 0 needs the file), then tfm_dist_broadcast_model: every rank
   resumes from the checkpoint. On a failed load no rank's model changes. */
TFMDEF tfm_result tfm_dist_load(tfm_dist *d, tfm_model *m, const char *path);
#endif

#ifdef __cplusplus
}
#endif
#endif /* TFM_INCLUDE_TRANSFORMER_H */

/* ========================================================================================== */
#if defined(TFM_IMPLEMENTATION) && !defined(TFM__IMPL_DONE)
#define TFM__IMPL_DONE

/* ==== >>impl-config ==== */

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(TFM_MALLOC) && !defined(TFM_FREE)
#error "transformer.h: define both TFM_MALLOC and TFM_FREE, or neither"
#endif
#if defined(TFM_FREE) && !defined(TFM_MALLOC)
#error "transformer.h: define both TFM_MALLOC and TFM_FREE, or neither"
#endif
#ifndef TFM_MALLOC
#define TFM_MALLOC(sz, u) ((void)(u), malloc(sz))
#define TFM_FREE(p, u) ((void)(u), free(p))
#endif
#ifndef TFM_ASSERT
#include <assert.h>
#define TFM_ASSERT(x) assert(x)
#endif

#if defined(TFM_BLAS) && !defined(TFM_SGEMM)
#ifndef TFM_BLAS_HEADER
#define TFM_BLAS_HEADER <cblas.h>
#endif
/* keep OpenBLAS from pulling <complex.h> (its macros I and complex) into this file */
#ifndef FORCE_OPENBLAS_COMPLEX_STRUCT
#define FORCE_OPENBLAS_COMPLEX_STRUCT
#endif
#include TFM_BLAS_HEADER
#endif

/* TFM_CUDA: nvcc compiles this file (kernels and host code alike); TFM__LAUNCH, TFM__SHARED and
   TFM__SHARED_DYN are the kernels' only spellings that differ from the CPU emulation of CUDA in the tests
   (tests/cuda_emu.h, included first, which defines TFM_CUDA_EMULATION and serves the runtime and cuBLAS
   on the CPU), so both read the same kernel source. TFM__HD marks the math both devices share. */
#if defined(TFM_CUDA)
#if defined(TFM_CUDA_EMULATION)
#define TFM__LAUNCH(k, grid, block, smem, ...)                                                                  \
    do {                                                                                                        \
        if (tfm__cu_op(#k, &k, (grid), (block), (smem), __VA_ARGS__))                                           \
            tfm_emu_launch(k, tfm__cu.stream, (grid), (block), (smem), __VA_ARGS__);                            \
    } while (0)
#define TFM__SHARED(T, name, n) T *name = (T *)tfm_emu_shared(sizeof(T) * (size_t)(n))
#define TFM__SHARED_DYN(T, name) T *name = (T *)tfm_emu_dyn_shared()
#define TFM__HD __host__ __device__
#define TFM__UNROLL
#elif defined(__CUDACC__)
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cublasLt.h>
#include <cuda_bf16.h>
#define TFM__LAUNCH(k, grid, block, smem, ...)                                                                  \
    do {                                                                                                        \
        if (tfm__cu_op(#k, &k, (grid), (block), (smem), __VA_ARGS__))                                           \
            k<<<(grid), (block), (smem), tfm__cu.stream>>>(__VA_ARGS__);                                        \
    } while (0)
#define TFM__SHARED(T, name, n) __shared__ T name[n]
#define TFM__SHARED_DYN(T, name) extern __shared__ T name[]
#define TFM__HD __host__ __device__
#define TFM__UNROLL _Pragma("unroll") /* a loop over a compile-time count: registers, not a stack array */
#else
#error "transformer.h: TFM_CUDA: the file that defines TFM_IMPLEMENTATION must be a .cu compiled by nvcc (or nvcc -x cu)"
#undef TFM_CUDA /* the rest compiles as a CPU build, so the message above is the only error */
#endif
#endif
#ifndef TFM__HD
#define TFM__HD
#endif

/* AMX (Intel Sapphire Rapids on): the built-in sgemm's "amx" kernel, chosen at run time, never the default */
#if (defined(__AMX_TILE__) || defined(__AMXTILE__)) && (defined(__AMX_BF16__) || defined(__AMXBF16__)) &&        \
    defined(__AVX512BF16__) && defined(__linux__) && !defined(TFM_NO_AMX) && !defined(TFM_CUDA)
#define TFM__HAVE_AMX 1
#endif
#if defined(__AVX__)
#include <immintrin.h>
#elif defined(__SSE2__)
#include <emmintrin.h>
#elif defined(__aarch64__) && defined(__ARM_NEON) && !defined(TFM_NO_NEON)
#include <arm_neon.h>
#endif
/* Fetches the cache line of p into the cache (L2) without waiting for it */
#if defined(__SSE2__)
#define TFM__PREFETCH(p) _mm_prefetch((const char *)(p), _MM_HINT_T1)
#elif defined(__GNUC__)
#define TFM__PREFETCH(p) __builtin_prefetch((p), 0, 2)
#else
#define TFM__PREFETCH(p) ((void)(p))
#endif

#ifdef _OPENMP
#include <omp.h>
#define TFM__OMP(x) _Pragma(#x)
#else
#define TFM__OMP(x)
#endif

#if defined(__cplusplus)
#define TFM_RESTRICT __restrict__
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 199901L
#define TFM_RESTRICT restrict
#else
#define TFM_RESTRICT
#endif

#if defined(__cplusplus) && __cplusplus >= 201103L
#define TFM__THREAD_LOCAL thread_local
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define TFM__THREAD_LOCAL _Thread_local
#elif defined(__GNUC__)
#define TFM__THREAD_LOCAL __thread
#elif defined(_MSC_VER)
#define TFM__THREAD_LOCAL __declspec(thread)
#else
#define TFM__THREAD_LOCAL
#define TFM__NO_THREAD_LOCAL 1
#endif

#if defined(__GNUC__)
#define TFM__UNUSED __attribute__((unused))
#else
#define TFM__UNUSED
#endif

#define TFM__ALIGN 64
#define TFM__MIN(a, b) ((a) < (b) ? (a) : (b))
#define TFM__MAX(a, b) ((a) > (b) ? (a) : (b))
#define TFM__TRY(x)                          \
    do {                                     \
        tfm_result tfm__r_ = (x);            \
        if (tfm__r_ != TFM_OK) return tfm__r_; \
    } while (0)
/* The same, the failure's message put under the name of public call fn. */
#define TFM__TRY_AS(fn, x)                                                           \
    do {                                                                             \
        tfm_result tfm__r_ = (x);                                                    \
        if (tfm__r_ != TFM_OK) return tfm__fail(tfm__r_, "%s: %s", fn, tfm_last_error()); \
    } while (0)

/* GCC treats a float compare as an operation that may trap (-ftrapping-math, its default), so it will
   not turn the clamps in exp, tanh and erf below into selects, and every element-wise loop that uses
   them stays scalar. No operation here relies on floating-point traps, and the flag changes no value
   (unlike -ffast-math): it only lets those loops vectorize. Clang assumes it already. */
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && !defined(__INTEL_COMPILER)
#define TFM__GCC_OPTIONS
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")
#endif

/* ==== >>impl-util ==== */

static TFM__THREAD_LOCAL char tfm__errbuf[512];

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static tfm_result tfm__fail(tfm_result r, const char *fmt, ...) {
    char msg[sizeof tfm__errbuf]; /* the arguments may include tfm_last_error() itself */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(tfm__errbuf, msg, sizeof msg);
#ifdef TFM_ABORT_ON_ERROR
    fprintf(stderr, "transformer.h: %s\n", tfm__errbuf);
    abort();
#endif
    return r;
}

/* TFM_E_CUDA naming fn when a CUDA call failed since the last check (>>impl-cuda; TFM_OK without CUDA), and
   the calling thread's CUDA resources given back. */
static tfm_result tfm__cuda_check(const char *fn);
static void tfm__cuda_release(void);

TFMDEF const char *tfm_result_string(tfm_result r) {
    switch (r) {
    case TFM_OK: return "ok";
    case TFM_E_ARG: return "bad argument";
    case TFM_E_SHAPE: return "shape mismatch";
    case TFM_E_NOMEM: return "out of memory";
    case TFM_E_IO: return "i/o error";
    case TFM_E_FORMAT: return "bad file format";
    case TFM_E_NO_CUDA: return "CUDA not available";
    case TFM_E_CUDA: return "CUDA error";
    case TFM_E_COMM: return "communication error";
    }
    return "unknown result code";
}

TFMDEF const char *tfm_last_error(void) { return tfm__errbuf; }
TFMDEF void tfm_clear_error(void) { tfm__errbuf[0] = 0; }

TFMDEF void tfm_set_num_threads(int n) {
#ifdef _OPENMP
    if (n <= 0) n = omp_get_num_procs();
    omp_set_num_threads(n);
#endif
#if defined(TFM_BLAS) && !defined(TFM_SGEMM) && defined(OPENBLAS_VERSION)
    if (n > 0) openblas_set_num_threads(n); /* n <= 0 without OpenMP: leave OpenBLAS's own default */
#endif
#if defined(TFM_BLAS) && !defined(TFM_SGEMM) && defined(BLIS_H)
    if (n > 0) bli_thread_set_num_threads(n); /* BLIS through <blis.h>: its own thread count */
#endif
    (void)n;
}

TFMDEF int tfm_get_num_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* Inside any parallel region, active or not: a region opened in an inactive one (an `if` that came out
   false, e.g. attention over one batch-head) is nested, and libgomp starts fresh threads for a nested team
   every time, each leaving its scratch behind when it exits; so work there stays on the calling thread. */
static int tfm__in_parallel(void) {
#ifdef _OPENMP
    return omp_get_level() > 0;
#else
    return 0;
#endif
}

/* Is a loop of n items worth a parallel region? */
#define TFM__PAR(n) ((n) > 4096 && !tfm__in_parallel())

/* Share k of n items cut into `parts` contiguous shares in order, the first n % parts one item longer:
   [*lo, *hi). tfm_dist_shard's rule, and the moment shares of cfg.moment_shards. */
static void tfm__share(int64_t n, int parts, int k, int64_t *lo, int64_t *hi) {
    int64_t q = n / parts, r = n % parts;
    *lo = q * k + TFM__MIN((int64_t)k, r);
    *hi = *lo + q + (k < r);
}

/* -- tensors -- */

static tfm_tensor tfm__tensor(float *data, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    tfm_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.ndim = ndim;
    t.shape[0] = d0;
    t.shape[1] = d1;
    t.shape[2] = d2;
    t.shape[3] = d3;
    t.device = TFM_DEVICE_CPU;
    return t;
}
TFMDEF tfm_tensor tfm_tensor1(float *data, int64_t d0) { return tfm__tensor(data, 1, d0, 0, 0, 0); }
TFMDEF tfm_tensor tfm_tensor2(float *data, int64_t d0, int64_t d1) {
    return tfm__tensor(data, 2, d0, d1, 0, 0);
}
TFMDEF tfm_tensor tfm_tensor3(float *data, int64_t d0, int64_t d1, int64_t d2) {
    return tfm__tensor(data, 3, d0, d1, d2, 0);
}
TFMDEF tfm_tensor tfm_tensor4(float *data, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    return tfm__tensor(data, 4, d0, d1, d2, d3);
}

TFMDEF int64_t tfm_numel(const tfm_tensor *t) {
    int64_t n = 1;
    int i;
    if (!t || t->ndim < 1 || t->ndim > TFM_MAX_DIMS) return 0;
    for (i = 0; i < t->ndim; i++) {
        int64_t d = t->shape[i] > 0 ? t->shape[i] : 0;
        if (d && n > INT64_MAX / d) return INT64_MAX; /* saturate rather than wrap */
        n *= d;
    }
    return n;
}

TFMDEF const char *tfm_shape_str(const tfm_tensor *t, char *buf, size_t n) {
    size_t used = 0;
    int i;
    if (!buf || n == 0) return buf;
    buf[0] = 0;
    if (!t) {
        snprintf(buf, n, "(null)");
        return buf;
    }
    if (t->ndim < 1 || t->ndim > TFM_MAX_DIMS) {
        snprintf(buf, n, "(ndim=%d)", t->ndim);
        return buf;
    }
    for (i = 0; i < t->ndim && used < n; i++) {
        int w = snprintf(buf + used, n - used, "%s%lld", i ? "," : "(", (long long)t->shape[i]);
        if (w < 0) break;
        used += (size_t)w;
    }
    if (used < n) snprintf(buf + used, n - used, ")");
    return buf;
}

/* Shape strings for messages: a few rotating buffers so one message can print several shapes. */
static TFM__THREAD_LOCAL char tfm__shapebufs[4][64];
static TFM__THREAD_LOCAL int tfm__shapenext;
static const char *tfm__shp(const tfm_tensor *t) {
    char *b = tfm__shapebufs[tfm__shapenext++ & 3];
    return tfm_shape_str(t, b, 64);
}

/* A tensor argument is usable: present, 1..4 positive dims, data, on the CPU. */
static tfm_result tfm__chk(const char *fn, const char *name, const tfm_tensor *t) {
    int i;
    if (!t) return tfm__fail(TFM_E_ARG, "%s: %s is NULL", fn, name);
    if (t->ndim < 1 || t->ndim > TFM_MAX_DIMS)
        return tfm__fail(TFM_E_ARG, "%s: %s has %d dims (want 1..%d)", fn, name, t->ndim, TFM_MAX_DIMS);
    {
        int64_t n = 1;
        for (i = 0; i < t->ndim; i++) {
            if (t->shape[i] < 1)
                return tfm__fail(TFM_E_SHAPE, "%s: %s is %s: every dim must be >= 1", fn, name, tfm__shp(t));
            if (t->shape[i] > ((int64_t)1 << 40) / n)
                return tfm__fail(TFM_E_SHAPE, "%s: %s is %s: more than 2^40 elements", fn, name, tfm__shp(t));
            n *= t->shape[i];
        }
    }
    if (!t->data) return tfm__fail(TFM_E_ARG, "%s: %s %s has no data (NULL)", fn, name, tfm__shp(t));
#if defined(TFM_CUDA)
    if (t->device != TFM_DEVICE_CPU && t->device != TFM_DEVICE_CUDA)
        return tfm__fail(TFM_E_ARG, "%s: %s has device %d, not a tfm_device", fn, name, (int)t->device);
#else
    if (t->device != TFM_DEVICE_CPU)
        return tfm__fail(TFM_E_NO_CUDA, "%s: %s lives on a CUDA device, but this build has no TFM_CUDA",
                         fn, name);
#endif
    return TFM_OK;
}
/* The n tensors of one call (NULL ones skipped) all live on one device: dev, or (dev -1) the first's. */
static tfm_result tfm__same_device(const char *fn, int dev, int n, ...) {
    va_list ap;
    const tfm_tensor *t;
    int other = -1, i;
    va_start(ap, n);
    for (i = 0; i < n; i++)
        if ((t = va_arg(ap, const tfm_tensor *)) != NULL) {
            if (dev < 0) dev = (int)t->device;
            if ((int)t->device != dev) other = (int)t->device;
        }
    va_end(ap);
    if (other < 0) return TFM_OK;
    return tfm__fail(TFM_E_ARG, "%s: one tensor is on the %s, another (or the layer) on the %s: a call's tensors and "
                     "layer must share a device", fn, dev == TFM_DEVICE_CUDA ? "GPU" : "CPU",
                     other == TFM_DEVICE_CUDA ? "GPU" : "CPU");
}
/* Same, but NULL is allowed (an optional gradient). */
static tfm_result tfm__chk_opt(const char *fn, const char *name, const tfm_tensor *t) {
    return t ? tfm__chk(fn, name, t) : TFM_OK;
}

static int tfm__same_shape(const tfm_tensor *a, const tfm_tensor *b) {
    int i;
    if (a->ndim != b->ndim) return 0;
    for (i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}
/* b must have a's shape (b may be NULL: nothing to check). */
static tfm_result tfm__chk_same(const char *fn, const char *an, const tfm_tensor *a, const char *bn,
                                const tfm_tensor *b) {
    if (!b) return TFM_OK;
    if (!tfm__same_shape(a, b))
        return tfm__fail(TFM_E_SHAPE, "%s: %s is %s but %s is %s: shapes must match", fn, an,
                         tfm__shp(a), bn, tfm__shp(b));
    return TFM_OK;
}
static int64_t tfm__cols(const tfm_tensor *t) {
    return t->ndim >= 1 && t->ndim <= TFM_MAX_DIMS ? t->shape[t->ndim - 1] : 1;
}
static int64_t tfm__rows(const tfm_tensor *t) { return tfm_numel(t) / tfm__cols(t); }

static tfm_result tfm__chk_int(const char *fn, const char *name, const tfm_tensor *t) {
    if (tfm_numel(t) > 2147483647)
        return tfm__fail(TFM_E_SHAPE, "%s: %s is %s: more than 2^31 elements", fn, name, tfm__shp(t));
    return TFM_OK;
}

static void tfm__op_transfer(tfm_device ddev, float *dst, tfm_device sdev, const float *src, int64_t n);

/* The floats a tfm_fill* call writes: t's own, or for a CUDA tensor a host buffer that tfm__fill_end copies
   to it (NULL, with TFM_E_NOMEM, when it cannot be had). */
static float *tfm__fill_begin(const char *fn, const tfm_tensor *t) {
    float *p;
    if (t->device == TFM_DEVICE_CPU) return t->data;
    p = (float *)TFM_MALLOC((size_t)tfm_numel(t) * sizeof(float), NULL);
    if (!p) tfm__fail(TFM_E_NOMEM, "%s: could not allocate a host buffer of %lld floats", fn, (long long)tfm_numel(t));
    return p;
}
static tfm_result tfm__fill_end(const char *fn, tfm_tensor *t, float *p) {
    if (p == t->data) return TFM_OK;
    tfm__op_transfer(t->device, t->data, TFM_DEVICE_CPU, p, tfm_numel(t));
    TFM_FREE(p, NULL);
    return tfm__cuda_check(fn);
}

TFMDEF tfm_result tfm_fill(tfm_tensor *t, float v) {
    int64_t i, n;
    float *p;
    TFM__TRY(tfm__chk("tfm_fill", "t", t));
    if (!(p = tfm__fill_begin("tfm_fill", t))) return TFM_E_NOMEM;
    n = tfm_numel(t);
    for (i = 0; i < n; i++) p[i] = v;
    return tfm__fill_end("tfm_fill", t, p);
}

static double tfm__box_muller(tfm_rng *rng, double *other);
#define TFM__NORMAL_CHUNK 65536
TFMDEF tfm_result tfm_fill_normal(tfm_tensor *t, tfm_rng *rng, float mean, float std) {
    int64_t i, n;
    float *p;
    TFM__TRY(tfm__chk("tfm_fill_normal", "t", t));
    if (!rng) return tfm__fail(TFM_E_ARG, "tfm_fill_normal: rng is NULL");
    if (!(std >= 0) || !isfinite(mean) || !isfinite(std))
        return tfm__fail(TFM_E_ARG, "tfm_fill_normal: mean %g, std %g: want finite, std >= 0",
                         (double)mean, (double)std);
    if (!(p = tfm__fill_begin("tfm_fill_normal", t))) return TFM_E_NOMEM;
    n = tfm_numel(t);
    if (n <= TFM__NORMAL_CHUNK) { /* small tensors: the stream of tfm_rng_normal itself */
        for (i = 0; i < n; i++) p[i] = mean + std * tfm_rng_normal(rng);
        return tfm__fill_end("tfm_fill_normal", t, p);
    }
    {
        /* large ones in fixed chunks, each from its own generator seeded by one draw and the chunk
           index, on threads: the values depend on rng and n only, never on the thread count */
        uint64_t base = tfm_rng_u64(rng);
        int64_t nchunk = (n + TFM__NORMAL_CHUNK - 1) / TFM__NORMAL_CHUNK, c;
        TFM__OMP(omp parallel for schedule(static) if (!tfm__in_parallel()))
        for (c = 0; c < nchunk; c++) {
            tfm_rng r;
            int64_t j = c * TFM__NORMAL_CHUNK, end = TFM__MIN(n, j + TFM__NORMAL_CHUNK);
            tfm_rng_seed(&r, base ^ ((uint64_t)(c + 1) * 0xD1B54A32D192ED03ull));
            for (; j + 1 < end; j += 2) { /* both normals of each Box-Muller pair */
                double z1, z0 = tfm__box_muller(&r, &z1);
                p[j] = (float)(mean + std * z0);
                p[j + 1] = (float)(mean + std * z1);
            }
            if (j < end) p[j] = (float)(mean + std * tfm__box_muller(&r, NULL));
        }
    }
    return tfm__fill_end("tfm_fill_normal", t, p);
}

TFMDEF tfm_result tfm_fill_uniform(tfm_tensor *t, tfm_rng *rng, float lo, float hi) {
    int64_t i, n;
    float *p;
    TFM__TRY(tfm__chk("tfm_fill_uniform", "t", t));
    if (!rng) return tfm__fail(TFM_E_ARG, "tfm_fill_uniform: rng is NULL");
    if (!(lo <= hi) || !isfinite(lo) || !isfinite(hi))
        return tfm__fail(TFM_E_ARG, "tfm_fill_uniform: range [%g, %g) is not a finite interval",
                         (double)lo, (double)hi);
    if (!(p = tfm__fill_begin("tfm_fill_uniform", t))) return TFM_E_NOMEM;
    n = tfm_numel(t);
    for (i = 0; i < n; i++) p[i] = lo + (hi - lo) * tfm_rng_uniform(rng);
    return tfm__fill_end("tfm_fill_uniform", t, p);
}

/* -- arenas -- */

static size_t tfm__align_up(size_t n) { return (n + (TFM__ALIGN - 1)) & ~(size_t)(TFM__ALIGN - 1); }

TFMDEF tfm_result tfm_arena_init(tfm_arena *a, void *mem, size_t size) {
    if (!a) return tfm__fail(TFM_E_ARG, "tfm_arena_init: arena is NULL");
    memset(a, 0, sizeof *a);
    if (size == 0) return TFM_OK;
    if (mem) {
        /* align the caller's buffer; the slack comes out of its size */
        size_t off = (size_t)((TFM__ALIGN - ((uintptr_t)mem & (TFM__ALIGN - 1))) & (TFM__ALIGN - 1));
        if (off >= size) return tfm__fail(TFM_E_NOMEM, "tfm_arena_init: %zu bytes is too small", size);
        a->base = (unsigned char *)mem + off;
        a->size = size - off;
        return TFM_OK;
    }
    {
        /* over-allocate to align; the original pointer is kept just before the aligned base */
        size_t total = size + TFM__ALIGN + sizeof(void *);
        unsigned char *raw;
        uintptr_t p;
        if (total < size) return tfm__fail(TFM_E_NOMEM, "tfm_arena_init: %zu bytes overflows", size);
        raw = (unsigned char *)TFM_MALLOC(total, NULL);
        if (!raw) return tfm__fail(TFM_E_NOMEM, "tfm_arena_init: could not allocate %zu bytes", size);
        p = ((uintptr_t)(raw + sizeof(void *)) + TFM__ALIGN - 1) & ~(uintptr_t)(TFM__ALIGN - 1);
        memcpy((unsigned char *)p - sizeof(void *), &raw, sizeof raw);
        a->base = (unsigned char *)p;
        a->size = size;
        a->owned = 1;
    }
    return TFM_OK;
}

TFMDEF void tfm_arena_free(tfm_arena *a) {
    if (!a) return;
    if (a->owned && a->base) {
        void *raw;
        memcpy(&raw, a->base - sizeof(void *), sizeof raw);
        TFM_FREE(raw, NULL);
    }
    memset(a, 0, sizeof *a);
}

/* tfm_arena_alloc without its zeroing (tensors in a twin arena: their host bytes are never touched). */
static void *tfm__arena_take(tfm_arena *a, size_t bytes) {
    size_t start, need;
    void *p = NULL;
    if (!a) return NULL;
    start = a->used;
    need = tfm__align_up(bytes ? bytes : 1);
    if (need < bytes || start + need < start) { /* size_t overflow */
        a->overflow = 1;
        return NULL;
    }
    a->used = start + need;
    if (a->used > a->peak) a->peak = a->used;
    if (a->base) {
        if (a->used > a->size) {
            a->overflow = 1;
            return NULL;
        }
        p = a->base + start;
    }
    return p;
}

TFMDEF void *tfm_arena_alloc(tfm_arena *a, size_t bytes) {
    void *p = tfm__arena_take(a, bytes);
    if (p && a->dev) memset(p, 0, bytes); /* a twin arena's host bytes start untouched (see tfm_model_init) */
    return p;
}

/* n floats from the arena: at base, or at the same offset of its device twin. */
static float *tfm__carve(tfm_arena *a, size_t n) {
    unsigned char *p = (unsigned char *)tfm__arena_take(a, n * sizeof(float));
    return (float *)(p && a->dev ? a->dev + (p - a->base) : p);
}

TFMDEF tfm_tensor tfm_arena_tensor(tfm_arena *a, int ndim, const int64_t *shape) {
    tfm_tensor t;
    int i;
    size_t n = 1;
    memset(&t, 0, sizeof t);
    if (!shape || ndim < 1 || ndim > TFM_MAX_DIMS) return t;
    t.ndim = ndim;
    for (i = 0; i < ndim; i++) {
        t.shape[i] = shape[i];
        n *= (size_t)(shape[i] > 0 ? shape[i] : 0);
    }
    t.data = tfm__carve(a, n);
    t.device = a && a->dev ? TFM_DEVICE_CUDA : TFM_DEVICE_CPU;
    return t;
}

static tfm_arena *tfm__mem_arena(tfm_mem *m, int i) {
    return i == 0 ? &m->params : i == 1 ? &m->grads : i == 2 ? &m->acts : &m->scratch;
}
static const char *tfm__mem_name(int i) {
    return i == 0 ? "params" : i == 1 ? "grads" : i == 2 ? "acts" : "scratch";
}

/* Device memory for the twins of arenas, models and caches (>>impl-cuda): TFM_E_NOMEM, or TFM_E_NO_CUDA
   without a device or without TFM_CUDA. */
static tfm_result tfm__dev_alloc(const char *fn, void **p, size_t bytes);
static void tfm__dev_free(void *p);

TFMDEF tfm_result tfm_mem_alloc(tfm_mem *m) {
    const char *fn = "tfm_mem_alloc";
    tfm_result r = TFM_OK;
    int i;
    if (!m) return tfm__fail(TFM_E_ARG, "%s: mem is NULL", fn);
    if (m->device != TFM_DEVICE_CPU && m->device != TFM_DEVICE_CUDA)
        return tfm__fail(TFM_E_ARG, "%s: mem.device %d is not a tfm_device", fn, (int)m->device);
    for (i = 0; i < 4; i++)
        if (tfm__mem_arena(m, i)->base)
            return tfm__fail(TFM_E_ARG, "%s: the %s arena already has memory", fn, tfm__mem_name(i));
    for (i = 0; i < 4 && r == TFM_OK; i++) {
        tfm_arena *a = tfm__mem_arena(m, i);
        size_t need = a->peak;
        if (need == 0) continue;
        if (tfm_arena_init(a, NULL, need) != TFM_OK)
            r = tfm__fail(TFM_E_NOMEM, "%s: could not allocate %zu bytes for %s", fn, need, tfm__mem_name(i));
        else if (m->device == TFM_DEVICE_CUDA)
            r = tfm__dev_alloc(fn, (void **)&a->dev, need);
    }
    if (r != TFM_OK) tfm_mem_free(m); /* nothing stays allocated */
    return r;
}

TFMDEF void tfm_mem_rewind(tfm_mem *m) {
    int i;
    if (!m) return;
    for (i = 0; i < 4; i++) {
        tfm__mem_arena(m, i)->used = 0;
        tfm__mem_arena(m, i)->overflow = 0;
    }
}

TFMDEF void tfm_mem_free(tfm_mem *m) {
    int i, no_grad;
    tfm_device dev;
    if (!m) return;
    no_grad = m->no_grad;
    dev = m->device;
    for (i = 0; i < 4; i++) {
        tfm_arena *a = tfm__mem_arena(m, i);
        if (a->dev) tfm__dev_free(a->dev);
        tfm_arena_free(a);
    }
    m->no_grad = no_grad;
    m->device = dev;
}

TFMDEF tfm_result tfm_mem_check(const tfm_mem *m) {
    int i;
    if (!m) return tfm__fail(TFM_E_ARG, "tfm_mem_check: mem is NULL");
    for (i = 0; i < 4; i++) {
        tfm_arena *a = tfm__mem_arena((tfm_mem *)m, i);
        if (a->overflow)
            return tfm__fail(TFM_E_NOMEM, "tfm_mem_check: the %s arena holds %zu bytes but needs %zu",
                             tfm__mem_name(i), a->size, a->peak);
    }
    return TFM_OK;
}

/* -- random numbers: xoshiro256** seeded through splitmix64 -- */

static uint64_t tfm__splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static uint64_t tfm__rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

TFMDEF void tfm_rng_seed(tfm_rng *rng, uint64_t seed) {
    int i;
    if (!rng) return;
    for (i = 0; i < 4; i++) rng->s[i] = tfm__splitmix64(&seed);
}

TFMDEF uint64_t tfm_rng_u64(tfm_rng *rng) {
    uint64_t *s = rng->s;
    uint64_t r = tfm__rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = tfm__rotl(s[3], 45);
    return r;
}

TFMDEF float tfm_rng_uniform(tfm_rng *rng) { return (float)(tfm_rng_u64(rng) >> 40) * (1.0f / 16777216.0f); }

/* Box-Muller from two uniforms: a standard normal, and its independent partner in *other (or NULL). */
static double tfm__box_muller(tfm_rng *rng, double *other) {
    double u1 = ((double)(tfm_rng_u64(rng) >> 11) + 1.0) * (1.0 / 9007199254740992.0); /* (0,1] */
    double u2 = (double)(tfm_rng_u64(rng) >> 11) * (1.0 / 9007199254740992.0);
    double rad = sqrt(-2.0 * log(u1)), th = 6.283185307179586 * u2;
    if (other) *other = rad * sin(th);
    return rad * cos(th);
}

TFMDEF float tfm_rng_normal(tfm_rng *rng) { return (float)tfm__box_muller(rng, NULL); }

/* Stateless hash of (seed, index) -> 24 uniform bits: the dropout mask. Independent of threads. */
static TFM__HD uint32_t tfm__hash24(uint64_t seed, uint64_t i) {
    uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (uint32_t)(z >> 40);
}
/* Elements whose hash is below this are dropped. (p 2^24 is exact in float: no double, which a GPU kernel
   would run for every element it asks.) */
static TFM__HD uint32_t tfm__drop_threshold(float p) {
    float t = p * 16777216.0f;
    return t >= 16777216.0f ? 16777216u : (uint32_t)t;
}

/* Branch-free exp, tanh and erf that the compiler can vectorize (libm's are scalar calls).
   exp: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two for exactness), e^r by its degree-7 Taylor
   polynomial (error < 1e-8 relative), 2^n put in the exponent bits: about 1 ulp over [-87, 88]; 0 below
   -87 (so e^-inf, a masked score's, is exactly 0), e^88 above 88. On a GPU (device code, not the
   emulation) CUDA's expf instead: about 8 instructions around the special-function unit's 2^x where the
   polynomial takes some 23, within 2 ulp (the CUDA guide's bound), e^-inf exactly 0, inf above 88.7 (every
   caller takes e^x of x <= 0, or divides by 1 + e^x). tfm__div1: a / b for b >= 1, on a GPU by __fdividef
   (the unit's reciprocal and a multiply, 2 ulp; 0 for b above 2^126, where a / b is below 2^-125) where a
   division takes some ten instructions and a branch.
   tanh(u) = 1 - 2 / (1 + e^(2u)): absolute error ~1e-7. erf: Abramowitz & Stegun 7.1.26 with this exp,
   absolute error < 2e-7. */
static TFM__HD inline float tfm__div1(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fdividef(a, b);
#else
    return a / b;
#endif
}
static TFM__HD inline float tfm__exp(float x) {
#if defined(__CUDA_ARCH__)
    return expf(x);
#else
    float kf, r, p, s, under = x < -87.0f ? 0.0f : 1.0f;
    int32_t bits;
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    kf = (x * 1.4426950408889634f + 12582912.0f) - 12582912.0f; /* round to nearest */
    r = x - kf * 0.693145751953125f;
    r = r - kf * 1.428606765330187e-06f;
    p = 1.0f + r * (1.0f + r * (0.5f + r * (1.6666667e-1f + r * (4.1666668e-2f + r * (8.3333338e-3f +
        r * (1.3888889e-3f + r * 1.9841270e-4f))))));
    bits = (int32_t)((uint32_t)((int32_t)kf + 127) << 23); /* (unsigned: no shift of a negative for a NaN x) */
    memcpy(&s, &bits, sizeof s);
    return p * s * under;
#endif
}
static TFM__HD inline float tfm__tanh(float u) { return 1.0f - tfm__div1(2.0f, 1.0f + tfm__exp(2.0f * u)); }
static TFM__HD inline float tfm__erf(float x) {
    float ax = x < 0.0f ? -x : x, t = tfm__div1(1.0f, 1.0f + 0.3275911f * ax), y;
    y = 1.0f - t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f)))) *
                   tfm__exp(-ax * ax);
    return x < 0.0f ? -y : y;
}

/* ==== >>impl-sgemm ====
   The built-in sgemm, a GEMM in the Goto/BLIS sense: op(B) is packed one KC x NC panel at a time (in
   slivers of NR columns, k-major) and op(A) one MC x KC block at a time (slivers of MR rows, k-major),
   each once per panel; a register-blocked MR x NR micro-kernel (AVX-512, AVX2+FMA, NEON or portable:
   the widest the compiler targets, or another of them chosen at run time, tfm_sgemm_set_kernel)
   multiplies a sliver pair. Every element of C is summed over
   K in the same order whatever the thread count, so results are bit-identical across thread counts. */

#if defined(__GNUC__) && !defined(TFM_NO_VECTOR_EXT)
#define TFM__VEC 1
#if defined(__AVX512F__)
#define TFM__VW 16
#elif defined(__AVX__)
#define TFM__VW 8
#else
#define TFM__VW 4
#endif
typedef float tfm__vf __attribute__((vector_size(TFM__VW * 4)));
static inline tfm__vf tfm__vload(const float *p) {
    tfm__vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void tfm__vstore(float *p, tfm__vf v) { memcpy(p, &v, sizeof v); }
/* Lane-wise square root (no errno, so it vectorizes), where the ISA has one at this width. */
#if defined(__AVX512F__)
/* the zero-masked form: _mm512_sqrt_ps starts from _mm512_undefined_ps, which GCC 12 reports as
   used uninitialized (-Wmaybe-uninitialized) wherever it is inlined */
#define TFM__VSQRT(v) ((tfm__vf)_mm512_maskz_sqrt_ps((__mmask16)0xFFFF, (__m512)(v)))
#elif defined(__AVX__)
#define TFM__VSQRT(v) ((tfm__vf)_mm256_sqrt_ps((__m256)(v)))
#elif defined(__SSE2__)
#define TFM__VSQRT(v) ((tfm__vf)_mm_sqrt_ps((__m128)(v)))
#endif
#else
#define TFM__VEC 0
#define TFM__VW 8
#endif

/* Micro-kernels. Each computes one MR x NR tile of C from an A sliver (element (i, p) of op(A) at
   a[i*rsa + p*csa]: packed, rsa = 1 and csa = MR) and a B sliver (element (p, j) at b[p*rsb + j]:
   packed, rsb = NR), keeping the whole tile in registers: C = alpha * acc + beta * C, and with beta == 0 C is not read. Each output element is one
   accumulator, summed p = 0, 1, ..., kc-1 with one fused multiply-add per step (one multiply and one add
   in the portable kernels), so its value depends neither on where the tile sits nor on the threads. */

#if defined(__AVX512F__)
#define TFM__HAVE_KERNEL_AVX512 1
#define TFM__MR_AVX512 8
#define TFM__NR_AVX512 32
#define TFM__K512_ROW(o, r0, r1)                 \
    ai = _mm512_set1_ps(a[o]);                   \
    r0 = _mm512_fmadd_ps(ai, b0, r0);            \
    r1 = _mm512_fmadd_ps(ai, b1, r1);
#define TFM__K512_STEP                                                                                    \
    b0 = _mm512_loadu_ps(b);                                                                              \
    b1 = _mm512_loadu_ps(b + 16);                                                                         \
    TFM__K512_ROW(0, c00, c01) TFM__K512_ROW(o1, c10, c11) TFM__K512_ROW(o2, c20, c21)                    \
    TFM__K512_ROW(o3, c30, c31) TFM__K512_ROW(o4, c40, c41) TFM__K512_ROW(o5, c50, c51)                   \
    TFM__K512_ROW(o6, c60, c61) TFM__K512_ROW(o7, c70, c71)                                               \
    a += csa;                                                                                             \
    b += rsb;
#define TFM__K512_STORE(i, r0, r1)                                                                        \
    {                                                                                                     \
        float *ci = c + (size_t)(i) * ldc;                                                                \
        __m512 v0 = _mm512_mul_ps(va, r0), v1 = _mm512_mul_ps(va, r1);                                    \
        if (beta != 0.0f) {                                                                               \
            v0 = _mm512_fmadd_ps(vb, _mm512_loadu_ps(ci), v0);                                            \
            v1 = _mm512_fmadd_ps(vb, _mm512_loadu_ps(ci + 16), v1);                                       \
        }                                                                                                 \
        _mm512_storeu_ps(ci, v0);                                                                         \
        _mm512_storeu_ps(ci + 16, v1);                                                                    \
    }
/* AVX-512F: 8 x 32, 16 zmm registers accumulate. 12 x 32 (24 accumulators) ran as fast on packed data
   but wastes a third of the last sliver of a 32-row product (attention's heads: 0.62 of OpenBLAS's rate
   at 32 x 64 x 32 with 12 rows, 0.99 with 8). */
static TFM__UNUSED void tfm__kernel_avx512(int kc, const float *TFM_RESTRICT a, int rsa, int csa,
                                          const float *TFM_RESTRICT b, int rsb, float *c, int ldc, float alpha,
                                          float beta) {
    const size_t o1 = (size_t)rsa, o2 = 2 * o1, o3 = 3 * o1, o4 = 4 * o1, o5 = 5 * o1, o6 = 6 * o1, o7 = 7 * o1;
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00;
    __m512 c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
    __m512 b0, b1, ai, va, vb;
    int p;
    for (p = 0; p < TFM__MR_AVX512; p++) { /* C's tile arrives while the loop runs */
        _mm_prefetch((const char *)(c + (size_t)p * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + (size_t)p * ldc + 31), _MM_HINT_T0);
    }
    for (p = 0; p < kc; p++) {
        TFM__K512_STEP
    }
    va = _mm512_set1_ps(alpha);
    vb = _mm512_set1_ps(beta);
    TFM__K512_STORE(0, c00, c01) TFM__K512_STORE(1, c10, c11) TFM__K512_STORE(2, c20, c21)
    TFM__K512_STORE(3, c30, c31) TFM__K512_STORE(4, c40, c41) TFM__K512_STORE(5, c50, c51)
    TFM__K512_STORE(6, c60, c61) TFM__K512_STORE(7, c70, c71)
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
#define TFM__HAVE_KERNEL_AVX2 1
#define TFM__MR_AVX2 6
#define TFM__NR_AVX2 16
#define TFM__K256_ROW(o, r0, r1)                 \
    ai = _mm256_broadcast_ss(a + (o));           \
    r0 = _mm256_fmadd_ps(ai, b0, r0);            \
    r1 = _mm256_fmadd_ps(ai, b1, r1);
#define TFM__K256_STEP(s1, cs)                                                                            \
    b0 = _mm256_loadu_ps(b);                                                                              \
    b1 = _mm256_loadu_ps(b + 8);                                                                          \
    TFM__K256_ROW(0, c00, c01) TFM__K256_ROW(s1, c10, c11) TFM__K256_ROW(2 * (s1), c20, c21)              \
    TFM__K256_ROW(3 * (s1), c30, c31) TFM__K256_ROW(4 * (s1), c40, c41) TFM__K256_ROW(5 * (s1), c50, c51) \
    a += cs;                                                                                              \
    b += rsb;
#define TFM__K256_STORE(i, r0, r1)                                                                        \
    {                                                                                                     \
        float *ci = c + (size_t)(i) * ldc;                                                                \
        __m256 v0 = _mm256_mul_ps(va, r0), v1 = _mm256_mul_ps(va, r1);                                    \
        if (beta != 0.0f) {                                                                               \
            v0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(ci), v0);                                            \
            v1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(ci + 8), v1);                                        \
        }                                                                                                 \
        _mm256_storeu_ps(ci, v0);                                                                         \
        _mm256_storeu_ps(ci + 8, v1);                                                                     \
    }
/* AVX2 + FMA: 6 x 16, 12 of the 16 ymm registers accumulate. A packed A sliver (rsa = 1, csa = 6) gets a
   loop of its own whose broadcasts have constant offsets: with the strides as variables, GCC kept the 24
   offsets of its four-step unrolled loop in spare vector registers and on the stack and moved them back
   into address registers inside the loop (about 20 extra moves and loads per 48 multiply-adds), and the
   AVX2 GEMM ran at 0.8 of OpenBLAS's Haswell kernel. One step per iteration, as the AVX-512 kernel: with
   four, GCC 12 (-O2 and -O3) ran out of registers in its interleaving of the steps and folded B's two
   loads into the multiply-adds of two of them (12 loads of B a step, not 2), 90% of the FMA peak on packed
   data in L1 on a Zen 3 core against 99.5% with one (clang: 100% either way). */
static TFM__UNUSED void tfm__kernel_avx2(int kc, const float *TFM_RESTRICT a, int rsa, int csa,
                                        const float *TFM_RESTRICT b, int rsb, float *c, int ldc, float alpha,
                                        float beta) {
    const size_t o1 = (size_t)rsa;
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    __m256 b0, b1, ai, va, vb;
    int p;
    for (p = 0; p < TFM__MR_AVX2; p++) {
        _mm_prefetch((const char *)(c + (size_t)p * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + (size_t)p * ldc + 15), _MM_HINT_T0);
    }
    if (rsa == 1 && csa == TFM__MR_AVX2) {
        for (p = 0; p < kc; p++) {
            TFM__K256_STEP(1, TFM__MR_AVX2)
        }
    } else {
        for (p = 0; p < kc; p++) {
            TFM__K256_STEP(o1, csa)
        }
    }
    va = _mm256_set1_ps(alpha);
    vb = _mm256_set1_ps(beta);
    TFM__K256_STORE(0, c00, c01) TFM__K256_STORE(1, c10, c11) TFM__K256_STORE(2, c20, c21)
    TFM__K256_STORE(3, c30, c31) TFM__K256_STORE(4, c40, c41) TFM__K256_STORE(5, c50, c51)
}
#endif

#if defined(__aarch64__) && defined(__ARM_NEON) && !defined(TFM_NO_NEON)
#define TFM__HAVE_KERNEL_NEON 1
#define TFM__MR_NEON 8
#define TFM__NR_NEON 12
/* One k step: rows 0-3 of the A column in a0's lanes, rows 4-7 in a1's, each row one fused multiply-add
   per B vector (fmla by element: no broadcast instruction). */
#define TFM__KN_ROW(r0, r1, r2, av, l)           \
    r0 = vfmaq_laneq_f32(r0, b0, av, l);         \
    r1 = vfmaq_laneq_f32(r1, b1, av, l);         \
    r2 = vfmaq_laneq_f32(r2, b2, av, l);
#define TFM__KN_FMAS                                                                                      \
    b0 = vld1q_f32(b);                                                                                    \
    b1 = vld1q_f32(b + 4);                                                                                \
    b2 = vld1q_f32(b + 8);                                                                                \
    TFM__KN_ROW(c00, c01, c02, a0, 0) TFM__KN_ROW(c10, c11, c12, a0, 1) TFM__KN_ROW(c20, c21, c22, a0, 2)   \
    TFM__KN_ROW(c30, c31, c32, a0, 3) TFM__KN_ROW(c40, c41, c42, a1, 0) TFM__KN_ROW(c50, c51, c52, a1, 1)   \
    TFM__KN_ROW(c60, c61, c62, a1, 2) TFM__KN_ROW(c70, c71, c72, a1, 3)                                   \
    a += csa;                                                                                             \
    b += rsb;
#define TFM__KN_STORE(i, r0, r1, r2)                                                                      \
    {                                                                                                     \
        float *ci = c + (size_t)(i) * ldc;                                                                \
        float32x4_t v0 = vmulq_n_f32(r0, alpha), v1 = vmulq_n_f32(r1, alpha), v2 = vmulq_n_f32(r2, alpha); \
        if (beta != 0.0f) {                                                                               \
            v0 = vfmaq_n_f32(v0, vld1q_f32(ci), beta);                                                    \
            v1 = vfmaq_n_f32(v1, vld1q_f32(ci + 4), beta);                                                \
            v2 = vfmaq_n_f32(v2, vld1q_f32(ci + 8), beta);                                                \
        }                                                                                                 \
        vst1q_f32(ci, v0);                                                                                \
        vst1q_f32(ci + 4, v1);                                                                            \
        vst1q_f32(ci + 8, v2);                                                                            \
    }
/* AdvSIMD (every ARM64 CPU): 8 x 12, 24 of the 32 q registers accumulate; a k step loads 2 A and 3 B
   vectors for 24 fused multiply-adds. A packed A sliver (rsa = 1) loads its column as two vectors; one
   read in place gathers it lane by lane (the same multiply-adds, so the same bits). */
static TFM__UNUSED void tfm__kernel_neon(int kc, const float *TFM_RESTRICT a, int rsa, int csa,
                                        const float *TFM_RESTRICT b, int rsb, float *c, int ldc, float alpha,
                                        float beta) {
    const size_t o1 = (size_t)rsa;
    float32x4_t c00 = vdupq_n_f32(0.0f), c01 = c00, c02 = c00, c10 = c00, c11 = c00, c12 = c00;
    float32x4_t c20 = c00, c21 = c00, c22 = c00, c30 = c00, c31 = c00, c32 = c00;
    float32x4_t c40 = c00, c41 = c00, c42 = c00, c50 = c00, c51 = c00, c52 = c00;
    float32x4_t c60 = c00, c61 = c00, c62 = c00, c70 = c00, c71 = c00, c72 = c00;
    float32x4_t a0, a1, b0, b1, b2;
    int p;
    if (rsa == 1) {
        for (p = 0; p < kc; p++) {
            a0 = vld1q_f32(a);
            a1 = vld1q_f32(a + 4);
            TFM__KN_FMAS
        }
    } else {
        for (p = 0; p < kc; p++) {
            float col[8];
            int i;
            for (i = 0; i < 8; i++) col[i] = a[i * o1];
            a0 = vld1q_f32(col);
            a1 = vld1q_f32(col + 4);
            TFM__KN_FMAS
        }
    }
    TFM__KN_STORE(0, c00, c01, c02) TFM__KN_STORE(1, c10, c11, c12) TFM__KN_STORE(2, c20, c21, c22)
    TFM__KN_STORE(3, c30, c31, c32) TFM__KN_STORE(4, c40, c41, c42) TFM__KN_STORE(5, c50, c51, c52)
    TFM__KN_STORE(6, c60, c61, c62) TFM__KN_STORE(7, c70, c71, c72)
}
#endif

/* Portable: 6 x (2 vectors) over the compiler's vector extension (SSE2 4 lanes, AVX 8, NEON 4), or
   6 x 16 in plain C without it. */
#define TFM__MR_PORT 6
#define TFM__NR_PORT (2 * TFM__VW)
static TFM__UNUSED void tfm__kernel_port(int kc, const float *TFM_RESTRICT a, int rsa, int csa,
                                        const float *TFM_RESTRICT b, int rsb, float *c, int ldc, float alpha,
                                        float beta) {
    const size_t o1 = (size_t)rsa;
    int i, p;
#if TFM__VEC
    const size_t o2 = 2 * o1, o3 = 3 * o1, o4 = 4 * o1, o5 = 5 * o1;
    tfm__vf acc[2 * TFM__MR_PORT];
    tfm__vf c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0};
    tfm__vf c30 = {0}, c31 = {0}, c40 = {0}, c41 = {0}, c50 = {0}, c51 = {0};
    for (p = 0; p < kc; p++) {
        tfm__vf b0 = tfm__vload(b), b1 = tfm__vload(b + TFM__VW);
        c00 += a[0] * b0; c01 += a[0] * b1;
        c10 += a[o1] * b0; c11 += a[o1] * b1;
        c20 += a[o2] * b0; c21 += a[o2] * b1;
        c30 += a[o3] * b0; c31 += a[o3] * b1;
        c40 += a[o4] * b0; c41 += a[o4] * b1;
        c50 += a[o5] * b0; c51 += a[o5] * b1;
        a += csa;
        b += rsb;
    }
    acc[0] = c00; acc[1] = c01; acc[2] = c10; acc[3] = c11; acc[4] = c20; acc[5] = c21;
    acc[6] = c30; acc[7] = c31; acc[8] = c40; acc[9] = c41; acc[10] = c50; acc[11] = c51;
    for (i = 0; i < TFM__MR_PORT; i++) {
        float *ci = c + (size_t)i * ldc;
        tfm__vf v0 = alpha * acc[2 * i], v1 = alpha * acc[2 * i + 1];
        if (beta != 0.0f) {
            v0 += beta * tfm__vload(ci);
            v1 += beta * tfm__vload(ci + TFM__VW);
        }
        tfm__vstore(ci, v0);
        tfm__vstore(ci + TFM__VW, v1);
    }
#else
    float acc[TFM__MR_PORT * TFM__NR_PORT];
    int j;
    for (i = 0; i < TFM__MR_PORT * TFM__NR_PORT; i++) acc[i] = 0.0f;
    for (p = 0; p < kc; p++) {
        for (i = 0; i < TFM__MR_PORT; i++)
            for (j = 0; j < TFM__NR_PORT; j++) acc[i * TFM__NR_PORT + j] += a[i * o1] * b[j];
        a += csa;
        b += rsb;
    }
    for (i = 0; i < TFM__MR_PORT; i++)
        for (j = 0; j < TFM__NR_PORT; j++) {
            float *cij = c + (size_t)i * ldc + j, v = alpha * acc[i * TFM__NR_PORT + j];
            *cij = beta != 0.0f ? v + beta * *cij : v;
        }
#endif
}

/* The kernels this build compiles, widest first (the default), each with its blocking (Goto & van de
   Geijn): a B panel of kc x nc is packed once per K block and swept by every A block of mc x kc packed
   against it; then either a B sliver (kc x NR) stays in L1 while the A slivers stream past it from L2,
   or (wide products, tfm__sgemm_serial) an A sliver stays in L1 while the B slivers stream from L2. None
   of these depends on the thread count. fused: the kernel sums with fused multiply-adds. */
typedef void (*tfm__kernel_fn)(int kc, const float *a, int rsa, int csa, const float *b, int rsb, float *c, int ldc,
                               float alpha, float beta);
typedef struct tfm__gemm_kernel {
    const char *key, *name;
    tfm__kernel_fn fn;
    int mr, nr, kc, mc, nc, fused;
    int amx; /* the AMX products (tfm__sgemm_amx): fn unused, blocks of bf16 */
} tfm__gemm_kernel;
#define TFM__KC 256
#define TFM__MC 144
#define TFM__NC 1024 /* a B panel of 1 MiB (KC 256), which stays in L2 while the A slivers sweep it */
#define TFM__WIDE 512 /* op(B) wider than this: the tiles go row of slivers by row (tfm__sgemm_serial) */
#define TFM__TILE_MAX 256 /* the largest MR x NR */
static const tfm__gemm_kernel tfm__gemm_kernels[] = {
#if defined(TFM__HAVE_KERNEL_AVX512)
    {"avx512", "avx512 8x32", tfm__kernel_avx512, TFM__MR_AVX512, TFM__NR_AVX512, TFM__KC, TFM__MC, TFM__NC, 1, 0},
#endif
#if defined(TFM__HAVE_KERNEL_AVX2)
    {"avx2", "avx2+fma 6x16", tfm__kernel_avx2, TFM__MR_AVX2, TFM__NR_AVX2, TFM__KC, TFM__MC, TFM__NC, 1, 0},
#endif
#if defined(TFM__HAVE_KERNEL_NEON)
    {"neon", "neon 8x12", tfm__kernel_neon, TFM__MR_NEON, TFM__NR_NEON, TFM__KC, TFM__MC, TFM__NC, 1, 0},
#endif
#if TFM__VEC
    {"portable", TFM__VW == 16 ? "portable 6x32" : TFM__VW == 8 ? "portable 6x16" : "portable 6x8", tfm__kernel_port,
     TFM__MR_PORT, TFM__NR_PORT, TFM__KC, TFM__MC, TFM__NC, 0, 0},
#else
    {"portable", "portable 6x16 (scalar)", tfm__kernel_port, TFM__MR_PORT, TFM__NR_PORT, TFM__KC, TFM__MC, TFM__NC, 0, 0},
#endif
#if defined(TFM__HAVE_AMX) /* last: never the default (it rounds more than fp32, see tfm__sgemm_amx) */
    {"amx", "amx bf16x3 32x32", NULL, 32, 32, 512, 32, 512, 1, 1},
#endif
};
#define TFM__N_KERNELS ((int)(sizeof tfm__gemm_kernels / sizeof tfm__gemm_kernels[0]))

static const tfm__gemm_kernel *tfm__gemm_kernel_by_key(const char *key) {
    int i;
    for (i = 0; i < TFM__N_KERNELS; i++)
        if (strcmp(tfm__gemm_kernels[i].key, key) == 0) return &tfm__gemm_kernels[i];
    return NULL;
}

/* "avx512, avx2, portable": the keys of this build's kernels, into buf. */
static const char *tfm__gemm_kernel_keys(char *buf, size_t n) {
    int i;
    buf[0] = '\0';
    for (i = 0; i < TFM__N_KERNELS; i++)
        snprintf(buf + strlen(buf), n - strlen(buf), "%s%s", i ? ", " : "", tfm__gemm_kernels[i].key);
    return buf;
}

static const tfm__gemm_kernel *tfm__gemm_kernel_chosen; /* NULL until the first product or a choice */

/* Whether kernel k can run here: the AMX one only once Linux lets this process use the tile registers
   (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA, asked once; refused where the CPU has no AMX). */
static int tfm__gemm_kernel_usable(const tfm__gemm_kernel *k) {
#if defined(TFM__HAVE_AMX)
    static int amx; /* 0 not asked yet, 1 granted, -1 refused */
    if (k->amx && !amx) { /* the system call itself (arch_prctl is 158 on x86-64): glibc's syscall() needs
                             _GNU_SOURCE defined before the program's first #include */
        long r;
        __asm__ volatile("syscall" : "=a"(r) : "a"(158L), "D"(0x1023L), "S"(18L) : "rcx", "r11", "memory");
        amx = r == 0 ? 1 : -1;
    }
    return !k->amx || amx > 0;
#else
    return k != NULL;
#endif
}

/* The kernel in use: on first use the one TFM_SGEMM_KERNEL names, else the widest. */
static const tfm__gemm_kernel *tfm__gemm_kernel_get(void) {
    const tfm__gemm_kernel *k = tfm__gemm_kernel_chosen;
    if (k) return k;
    TFM__OMP(omp critical(tfm__gemm_kernel_init))
    {
        if (!tfm__gemm_kernel_chosen) {
            const char *env = getenv("TFM_SGEMM_KERNEL");
            k = env && *env ? tfm__gemm_kernel_by_key(env) : NULL;
            if (env && *env && !k) {
                char keys[64];
                fprintf(stderr, "transformer.h: TFM_SGEMM_KERNEL=%s is not a kernel of this build (%s); using %s\n", env,
                        tfm__gemm_kernel_keys(keys, sizeof keys), tfm__gemm_kernels[0].key);
            } else if (k && !tfm__gemm_kernel_usable(k)) {
                fprintf(stderr, "transformer.h: TFM_SGEMM_KERNEL=%s: the OS refused this process the AMX tiles; "
                        "using %s\n", env, tfm__gemm_kernels[0].key);
                k = NULL;
            }
            tfm__gemm_kernel_chosen = k ? k : &tfm__gemm_kernels[0];
        }
        k = tfm__gemm_kernel_chosen;
    }
    return k;
}

TFMDEF const char *tfm_sgemm_kernel(void) { return tfm__gemm_kernel_get()->name; }

TFMDEF tfm_result tfm_sgemm_set_kernel(const char *name) {
    const tfm__gemm_kernel *k = name ? tfm__gemm_kernel_by_key(name) : &tfm__gemm_kernels[0];
    char keys[64];
    if (!k)
        return tfm__fail(TFM_E_ARG, "tfm_sgemm_set_kernel: '%s' is not a kernel of this build (%s)", name,
                         tfm__gemm_kernel_keys(keys, sizeof keys));
    if (!tfm__gemm_kernel_usable(k))
        return tfm__fail(TFM_E_ARG, "tfm_sgemm_set_kernel: '%s': the OS refused this process the AMX tiles "
                         "(arch_prctl ARCH_REQ_XCOMP_PERM)", name);
    tfm__gemm_kernel_chosen = k;
    return TFM_OK;
}

/* Packing. Both operands reduce to two moves into a k-major sliver of width W (MR for A, NR for B):
   a copy, where the source already runs along the sliver's width (op(A) = A^T, op(B) = B), and a
   transpose, where it runs along k (op(A) = A, op(B) = B^T). Widths past w are zero. */

/* dst[p*W + i] = src[p*ld + i] for i < w, 0 for w <= i < W; p < kc. A full sliver is copied with W a
   constant of each kernel's widths, so that a row becomes a few vector moves (with W a variable, GCC
   copied a 6-float row of the AVX2 kernel's A element by element). */
#define TFM__PACK_ROWS(WC)                                                                                \
    for (p = 0; p < kc; p++)                                                                              \
        for (i = 0; i < (WC); i++) dst[(size_t)p * (WC) + i] = src[(size_t)p * ld + i];
static void tfm__pack_copy(const float *src, int ld, int w, int kc, float *dst, int W) {
    int i, p;
    if (w == W) {
        switch (W) {
        case 6: TFM__PACK_ROWS(6) break;
        case 8: TFM__PACK_ROWS(8) break;
        case 12: TFM__PACK_ROWS(12) break;
        case 16: TFM__PACK_ROWS(16) break;
        case 32: TFM__PACK_ROWS(32) break;
        default: TFM__PACK_ROWS(W) break;
        }
    } else {
        memset(dst, 0, (size_t)kc * W * sizeof(float)); /* once, not a call per row */
        for (p = 0; p < kc; p++)
            for (i = 0; i < w; i++) dst[(size_t)p * W + i] = src[(size_t)p * ld + i];
    }
}

/* dst[p*W + i] = src[i*ld + p] for i < w, 0 for w <= i < W; p < kc. In 8 x 8 blocks (AVX) and 4 x 4
   blocks (SSE) of registers; what is left, element by element. */
static void tfm__pack_transpose(const float *src, int ld, int w, int kc, float *dst, int W) {
    int i = 0, p;
    if (w < W) memset(dst, 0, (size_t)kc * W * sizeof(float));
#if defined(__AVX__)
    for (; i + 8 <= w; i += 8) {
        const float *s = src + (size_t)i * ld;
        float *d = dst + i;
        for (p = 0; p + 8 <= kc; p += 8) {
            __m256 r0 = _mm256_loadu_ps(s + p), r1 = _mm256_loadu_ps(s + ld + p);
            __m256 r2 = _mm256_loadu_ps(s + 2 * (size_t)ld + p), r3 = _mm256_loadu_ps(s + 3 * (size_t)ld + p);
            __m256 r4 = _mm256_loadu_ps(s + 4 * (size_t)ld + p), r5 = _mm256_loadu_ps(s + 5 * (size_t)ld + p);
            __m256 r6 = _mm256_loadu_ps(s + 6 * (size_t)ld + p), r7 = _mm256_loadu_ps(s + 7 * (size_t)ld + p);
            __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
            __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
            __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
            __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
            __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
            __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
            __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
            __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
            float *q = d + (size_t)p * W;
            _mm256_storeu_ps(q, _mm256_permute2f128_ps(u0, u4, 0x20));
            _mm256_storeu_ps(q + W, _mm256_permute2f128_ps(u1, u5, 0x20));
            _mm256_storeu_ps(q + 2 * W, _mm256_permute2f128_ps(u2, u6, 0x20));
            _mm256_storeu_ps(q + 3 * W, _mm256_permute2f128_ps(u3, u7, 0x20));
            _mm256_storeu_ps(q + 4 * W, _mm256_permute2f128_ps(u0, u4, 0x31));
            _mm256_storeu_ps(q + 5 * W, _mm256_permute2f128_ps(u1, u5, 0x31));
            _mm256_storeu_ps(q + 6 * W, _mm256_permute2f128_ps(u2, u6, 0x31));
            _mm256_storeu_ps(q + 7 * W, _mm256_permute2f128_ps(u3, u7, 0x31));
        }
        for (; p < kc; p++) {
            int r;
            for (r = 0; r < 8; r++) d[(size_t)p * W + r] = s[(size_t)r * ld + p];
        }
    }
#endif
#if defined(__SSE2__)
    for (; i + 4 <= w; i += 4) {
        const float *s = src + (size_t)i * ld;
        float *d = dst + i;
        for (p = 0; p + 4 <= kc; p += 4) {
            __m128 r0 = _mm_loadu_ps(s + p), r1 = _mm_loadu_ps(s + ld + p);
            __m128 r2 = _mm_loadu_ps(s + 2 * (size_t)ld + p), r3 = _mm_loadu_ps(s + 3 * (size_t)ld + p);
            __m128 t0 = _mm_unpacklo_ps(r0, r1), t1 = _mm_unpackhi_ps(r0, r1);
            __m128 t2 = _mm_unpacklo_ps(r2, r3), t3 = _mm_unpackhi_ps(r2, r3);
            float *q = d + (size_t)p * W;
            _mm_storeu_ps(q, _mm_movelh_ps(t0, t2));
            _mm_storeu_ps(q + W, _mm_movehl_ps(t2, t0));
            _mm_storeu_ps(q + 2 * W, _mm_movelh_ps(t1, t3));
            _mm_storeu_ps(q + 3 * W, _mm_movehl_ps(t3, t1));
        }
        for (; p < kc; p++) {
            int r;
            for (r = 0; r < 4; r++) d[(size_t)p * W + r] = s[(size_t)r * ld + p];
        }
    }
    for (; i + 2 <= w; i += 2) { /* a pair of rows (the AVX2 kernel's 6 = 4 + 2) */
        const float *s = src + (size_t)i * ld;
        float *d = dst + i;
        for (p = 0; p + 4 <= kc; p += 4) {
            __m128 r0 = _mm_loadu_ps(s + p), r1 = _mm_loadu_ps(s + ld + p);
            __m128 t0 = _mm_unpacklo_ps(r0, r1), t1 = _mm_unpackhi_ps(r0, r1);
            float *q = d + (size_t)p * W;
            _mm_storel_pi((__m64 *)q, t0);
            _mm_storeh_pi((__m64 *)(q + W), t0);
            _mm_storel_pi((__m64 *)(q + 2 * W), t1);
            _mm_storeh_pi((__m64 *)(q + 3 * W), t1);
        }
        for (; p < kc; p++) {
            d[(size_t)p * W] = s[p];
            d[(size_t)p * W + 1] = s[(size_t)ld + p];
        }
    }
#endif
    if (i < w) {
        const float *s = src + (size_t)i * ld;
        int r, rest = w - i;
        for (p = 0; p < kc; p++)
            for (r = 0; r < rest; r++) dst[(size_t)p * W + i + r] = s[(size_t)r * ld + p];
    }
}

/* One MR-row sliver of op(A): rows i0..i0+mr-1, columns p0..p0+kc-1, into dst (kc x MR, k-major). */
static void tfm__pack_a(int MR, int mr, int kc, const float *A, int lda, int transA, int i0, int p0, float *dst) {
    if (transA)
        tfm__pack_copy(A + (size_t)p0 * lda + i0, lda, mr, kc, dst, MR);
    else
        tfm__pack_transpose(A + (size_t)i0 * lda + p0, lda, mr, kc, dst, MR);
}

/* One NR-column sliver of op(B): rows p0..p0+kc-1, columns j0..j0+nr-1, into dst (kc x NR, k-major). */
static void tfm__pack_b(int NR, int kc, int nr, const float *B, int ldb, int transB, int p0, int j0, float *dst) {
    if (transB)
        tfm__pack_transpose(B + (size_t)j0 * ldb + p0, ldb, nr, kc, dst, NR);
    else
        tfm__pack_copy(B + (size_t)p0 * ldb + j0, ldb, nr, kc, dst, NR);
}

/* The full NR-column slivers of a B panel copied from op(B) = B (columns j0..j0+n-1, n a multiple of
   NR), row by row: each row of B is read once and in order. Sliver by sliver, the rows were read 64
   bytes at a time at a stride of ldb, and the copy ran at memory latency where K is large and M small
   (128 x 512 x 8192, TN: packing was 16% of the time). The same values as tfm__pack_b. */
#define TFM__PACK_B_ROWS(WC)                                                                              \
    for (p = 0; p < kc; p++) {                                                                            \
        const float *s = B + (size_t)(p0 + p) * ldb + j0;                                                 \
        float *d = dst + (size_t)p * (WC);                                                                \
        for (jr = 0; jr < n; jr += (WC), d += (size_t)kc * (WC))                                          \
            memcpy(d, s + jr, (WC) * sizeof(float));                                                      \
    }
static void tfm__pack_b_rows(int NR, int kc, int n, const float *B, int ldb, int p0, int j0, float *dst) {
    int p, jr;
    switch (NR) { /* the kernels' widths as constants: each row copy is a memcpy of a constant size, which
                     becomes whole-vector moves (as a loop, which GCC could not prove free of overlap, it
                     became 16 scalar moves of the AVX2 kernel's sliver) */
    case 12: TFM__PACK_B_ROWS(12) break;
    case 16: TFM__PACK_B_ROWS(16) break;
    case 32: TFM__PACK_B_ROWS(32) break;
    default: TFM__PACK_B_ROWS(NR) break;
    }
}

/* One tile: kernel k straight into C, or, for an edge tile (mr < MR or nr < NR), into a full tile on
   the stack that is copied in and out, so edge elements go through the same instructions. */
static void tfm__gemm_tile(const tfm__gemm_kernel *k, int kc, const float *a, int rsa, int csa, const float *b,
                           int rsb, float *c, int ldc, int mr, int nr, float alpha, float beta) {
    float tile[TFM__TILE_MAX];
    int i, j, MR = k->mr, NR = k->nr;
    if (mr == MR && nr == NR) {
        k->fn(kc, a, rsa, csa, b, rsb, c, ldc, alpha, beta);
        return;
    }
    if (beta != 0.0f)
        for (i = 0; i < MR; i++)
            for (j = 0; j < NR; j++) tile[i * NR + j] = i < mr && j < nr ? c[(size_t)i * ldc + j] : 0.0f;
    k->fn(kc, a, rsa, csa, b, rsb, tile, NR, alpha, beta);
    for (i = 0; i < mr; i++)
        for (j = 0; j < nr; j++) c[(size_t)i * ldc + j] = tile[i * NR + j];
}

/* Each of the M rows of C (row stride ldc) = the N floats of bias; on threads when large (par), else
   without a parallel region (even one that an `if` turns off costs a call into OpenMP: a tile's worth
   of kernel time). */
static void tfm__bias_rows(float *C, int64_t ldc, const float *bias, int64_t M, int64_t N, int par) {
    int64_t r;
    if (!par || !TFM__PAR(M * N)) {
        for (r = 0; r < M; r++) memcpy(C + r * ldc, bias, (size_t)N * sizeof(float));
        return;
    }
    TFM__OMP(omp parallel for schedule(static))
    for (r = 0; r < M; r++) memcpy(C + r * ldc, bias, (size_t)N * sizeof(float));
}

/* C = beta * C (beta == 0 writes zeros without reading C). */
static void tfm__scale_c(int M, int N, float beta, float *C, int ldc) {
    int i, j;
    for (i = 0; i < M; i++)
        for (j = 0; j < N; j++) C[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[(size_t)i * ldc + j];
}

static int tfm__ceil_div(int a, int b) { return (a + b - 1) / b; }

/* The depth of the K blocks: K cut into balanced blocks of at most KC (300 is two blocks of 150, not
   256 + 44). Where they end is where a partial sum is rounded into C, so it alone depends on K. */
static int tfm__kc_step(int K, int KC) { return tfm__ceil_div(K, tfm__ceil_div(K, KC)); }

/* The scratch of one thread, heap memory (a thread with a small stack runs products and attention)
   allocated by the thread's first use and kept in a thread-local pointer for the next ones, so a
   training step allocates nothing after its first; tfm_scratch_release frees it. Two regions, 64-byte
   aligned: the fused attention's block buffers (>>impl-attention: two TFM__ATT_QB x TFM__ATT_KB blocks
   and two rows of TFM__ATT_QB, 128.5 KiB), then the built-in sgemm's packing space (a KC x NC panel of
   op(B) and an MC x KC block of op(A), 1.1 MiB). Attention asks for both when its products run on the
   built-in sgemm (so they never grow the scratch under it), as in a BLAS build that has the AVX2 kernel,
   which may take them (tfm__sgemm_fp32); for its own region alone with TFM_SGEMM or another BLAS build.
   Without thread-local storage each product and each attention call allocates its own and frees it. */
#define TFM__ATT_QB 64
#define TFM__ATT_KB 256
#define TFM__ATT_FLOATS ((size_t)2 * TFM__ATT_QB * TFM__ATT_KB + 2 * TFM__ATT_QB + 16)
#define TFM__PACK_FLOATS ((size_t)TFM__KC * TFM__NC + (size_t)TFM__MC * TFM__KC + 32) /* any kernel's blocks */
#if defined(TFM_SGEMM) || (defined(TFM_BLAS) && !defined(TFM__HAVE_KERNEL_AVX2)) /* see tfm__sgemm_fp32 */
#define TFM__ATT_SCRATCH TFM__ATT_FLOATS
#else
#define TFM__ATT_SCRATCH (TFM__ATT_FLOATS + TFM__PACK_FLOATS)
#endif
#if !defined(TFM__NO_THREAD_LOCAL)
static TFM__THREAD_LOCAL float *tfm__scratchbuf;
static TFM__THREAD_LOCAL size_t tfm__scratchlen; /* floats */
#endif

#ifdef TFM__TESTING
static int tfm__scratch_refuse; /* tests: non-zero fails every allocation of a scratch */
#endif

static float *tfm__scratch_alloc(size_t n) {
#ifdef TFM__TESTING
    if (tfm__scratch_refuse) return NULL;
#endif
    return (float *)TFM_MALLOC(n * sizeof(float), NULL);
}

static void tfm__scratch_free(void) {
#if !defined(TFM__NO_THREAD_LOCAL)
    if (tfm__scratchbuf) TFM_FREE(tfm__scratchbuf, NULL);
    tfm__scratchbuf = NULL;
    tfm__scratchlen = 0;
#endif
}

/* This thread's scratch of at least n floats, or NULL when it cannot be allocated. */
static float *tfm__scratch_acquire(size_t n) {
#if defined(TFM__NO_THREAD_LOCAL)
    return tfm__scratch_alloc(n);
#else
    if (tfm__scratchlen < n) {
        tfm__scratch_free();
        if ((tfm__scratchbuf = tfm__scratch_alloc(n)) != NULL) tfm__scratchlen = n;
    }
    return tfm__scratchbuf;
#endif
}

/* The end of a use of p = tfm__scratch_acquire() (NULL is fine). */
static void tfm__scratch_done(float *p) {
#if defined(TFM__NO_THREAD_LOCAL)
    if (p) TFM_FREE(p, NULL);
#else
    (void)p;
#endif
}

static float *tfm__align64(float *p) { return (float *)(((uintptr_t)p + 63) & ~(uintptr_t)63); }

/* Set on the calling thread by an attention that ran on a thread without scratch (it then wrote nothing);
   the layer and model calls clear it on entry and fail with TFM_E_NOMEM when they find it set. */
static TFM__THREAD_LOCAL int tfm__scratch_failed;

/* Gives the calling thread and, outside a parallel region, the threads of this file's loops their
   scratch, before a layer or model call changes anything: TFM_E_NOMEM naming fn when one cannot. */
static tfm_result tfm__scratch_reserve(const char *fn) {
    int missing = 0;
    tfm__scratch_failed = 0;
#if !defined(TFM__NO_THREAD_LOCAL)
    missing = tfm__scratch_acquire(TFM__ATT_SCRATCH) == NULL;
#ifdef _OPENMP
    if (!missing && !tfm__in_parallel() && tfm_get_num_threads() > 1) {
        int t, n = tfm_get_num_threads();
        TFM__OMP(omp parallel for num_threads(n) schedule(static, 1) reduction(+ : missing))
        for (t = 0; t < n; t++) missing += tfm__scratch_acquire(TFM__ATT_SCRATCH) == NULL;
    }
#endif
#endif
    if (missing)
        return tfm__fail(TFM_E_NOMEM, "%s: %d thread(s) could not allocate their scratch (%zu bytes each)", fn, missing,
                         TFM__ATT_SCRATCH * sizeof(float));
    return TFM_OK;
}

/* TFM_E_NOMEM naming fn when an attention since tfm__scratch_reserve ran without scratch; TFM_E_CUDA when
   a CUDA call failed (>>impl-cuda). The end of every layer and model call. */
static tfm_result tfm__scratch_check(const char *fn) {
    TFM__TRY(tfm__cuda_check(fn));
    if (!tfm__scratch_failed) return TFM_OK;
    tfm__scratch_failed = 0;
    return tfm__fail(TFM_E_NOMEM, "%s: a thread could not allocate its scratch (%zu bytes); the attention did not run", fn,
                     TFM__ATT_SCRATCH * sizeof(float));
}

TFMDEF void tfm_scratch_release(void) {
    tfm__scratch_free();
    tfm__cuda_release();
#ifdef _OPENMP
    if (!tfm__in_parallel()) { /* a team as large as any this file starts, so every pooled thread runs */
        int t, n = TFM__MAX(tfm_get_num_threads(), omp_get_num_procs());
        TFM__OMP(omp parallel for num_threads(n) schedule(static, 1))
        for (t = 0; t < n; t++) tfm__scratch_free();
    }
#endif
}

/* The sums of the kernels without their packing space (its allocation failed): element by element,
   each K block of kc_step summed p = 0, 1, ... with the kernel's multiply-adds (fused where the kernel
   fuses them), then alpha * sum + beta * C, so the result has the same bits as the packed path's. */
static float tfm__kernel_madd(int fused, float x, float y, float z) { return fused ? fmaf(x, y, z) : x * y + z; }
static void tfm__sgemm_nopack(const tfm__gemm_kernel *k, int transA, int transB, int M, int N, int K, float alpha,
                              const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    int i, j, p, pc, kc_step = tfm__kc_step(K, k->kc), fused = k->fused;
    for (pc = 0; pc < K; pc += kc_step) {
        int kc = TFM__MIN(kc_step, K - pc);
        float b_eff = pc == 0 ? beta : 1.0f;
        for (i = 0; i < M; i++)
            for (j = 0; j < N; j++) {
                float acc = 0.0f, v, *c = C + (size_t)i * ldc + j;
                for (p = pc; p < pc + kc; p++) {
                    float a = transA ? A[(size_t)p * lda + i] : A[(size_t)i * lda + p];
                    float b = transB ? B[(size_t)j * ldb + p] : B[(size_t)p * ldb + j];
                    acc = tfm__kernel_madd(fused, a, b, acc);
                }
                v = alpha * acc;
                *c = b_eff != 0.0f ? tfm__kernel_madd(fused, b_eff, *c, v) : v;
            }
    }
}

#if defined(TFM__HAVE_AMX)
/* The "amx" kernel: float products on the AMX tile unit, which multiplies bf16 (8 significant bits)
   into fp32 sums, 16 x 16 outputs by 32 k per instruction (16 times the FMA rate of AVX-512 on a
   Sapphire Rapids core). Each float is split into two bf16, x = hi + lo + e with |e| <= 2^-16 |x|, both
   packed (tfm__amx_pack_a, tfm__amx_pack_b), and for every 32 k the tiles sum hi*hi, hi*lo and lo*hi:
   three tile products for one (oneMKL's "bf16x3" mode does the same). Each product is then within about
   3 * 2^-16 of its fp32 value (lo*lo and the split's remainders are dropped), so results differ from the
   fp32 kernels from the fifth significant digit, not only in the last bits; hence a choice, never the
   default. An infinite or NaN input (or one beyond bf16's largest, 3.39e38) makes the sums it enters
   NaN, where fp32 could give +-inf (hi * lo of the other operand is inf * 0). Blocks as the other
   kernels (K blocks of at most KC, tfm__kc_step): every element of C summed in the same order whatever
   the thread count. */
typedef struct tfm__amx_cfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tfm__amx_cfg;

/* The AVX-512 moves below are the masked forms with every lane on: the unmasked ones take an undefined
   vector in GCC 12's headers, which g++ -Wall reports as uninitialised. */
static inline __m512 tfm__bf16_to_ps(__m256i h) {
    return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, h), 16));
}

/* 32 floats (x0, x1) into hi, their bf16 roundings, and lo, the bf16 roundings of x - hi: 32 bf16 each,
   x0's first. */
static inline void tfm__amx_split(__m512 x0, __m512 x1, __m512i *hi, __m512i *lo) {
    __m512i h = (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
    __m512 d0 = _mm512_sub_ps(x0, tfm__bf16_to_ps(_mm512_maskz_extracti64x4_epi64(0xf, h, 0)));
    __m512 d1 = _mm512_sub_ps(x1, tfm__bf16_to_ps(_mm512_maskz_extracti64x4_epi64(0xf, h, 1)));
    *hi = h;
    *lo = (__m512i)_mm512_cvtne2ps_pbh(d1, d0);
}

static inline __mmask16 tfm__mask16(int n) {
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

/* 16 floats at p, the first n of them (zeros after; none read when n <= 0 or p is NULL). */
static inline __m512 tfm__load16(const float *p, int n) {
    return p && n > 0 ? _mm512_maskz_loadu_ps(tfm__mask16(n), p) : _mm512_setzero_ps();
}

/* Transposes 16 x 16 32-bit values in place: r[i] element j becomes r[j] element i. */
static inline void tfm__t16(__m512i *r) {
    __m512i t[16], u[16];
    int i, j;
    for (i = 0; i < 8; i++) {
        t[2 * i] = _mm512_maskz_unpacklo_epi32(0xffff, r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_maskz_unpackhi_epi32(0xffff, r[2 * i], r[2 * i + 1]);
    }
    for (i = 0; i < 4; i++) {
        u[4 * i] = _mm512_maskz_unpacklo_epi64(0xff, t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_maskz_unpackhi_epi64(0xff, t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_maskz_unpacklo_epi64(0xff, t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_maskz_unpackhi_epi64(0xff, t[4 * i + 1], t[4 * i + 3]);
    }
    for (i = 0; i < 2; i++)
        for (j = 0; j < 4; j++) {
            t[8 * i + j] = _mm512_maskz_shuffle_i32x4(0xffff, u[8 * i + j], u[8 * i + 4 + j], 0x88);
            t[8 * i + 4 + j] = _mm512_maskz_shuffle_i32x4(0xffff, u[8 * i + j], u[8 * i + 4 + j], 0xdd);
        }
    for (j = 0; j < 8; j++) {
        r[j] = _mm512_maskz_shuffle_i32x4(0xffff, t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_maskz_shuffle_i32x4(0xffff, t[j], t[j + 8], 0xdd);
    }
}

/* The A block: rows i0..i0+mc-1, columns p0..p0+kc-1 of op(A), in slivers of 32 rows (zero-padded);
   each holds, for every 32 columns c, two 32 x 32 bf16 tiles, hi then lo, a row per 64 bytes. op(A) =
   A^T is read 16 x 16 floats at a time and transposed in registers. */
static void tfm__amx_pack_a(int mc, int kc, const float *A, int lda, int transA, int i0, int p0, uint16_t *dst) {
    int nch = (kc + 31) / 32, rows = (mc + 31) / 32 * 32, c, g, i;
    __m512i h, l, v[32];
    for (c = 0; c < nch; c++) {
        int n = TFM__MIN(32, kc - 32 * c);
        for (g = 0; g < rows; g += 16) {
            if (transA) {
                for (i = 0; i < 32; i++)
                    v[i] = _mm512_castps_si512(
                        tfm__load16(i < n ? A + (size_t)(p0 + 32 * c + i) * lda + i0 + g : NULL, mc - g));
                tfm__t16(v), tfm__t16(v + 16);
            }
            for (i = 0; i < 16; i++) {
                uint16_t *d = dst + (size_t)((g + i) / 32 * nch + c) * 2048 + (size_t)((g + i) % 32) * 32;
                const float *s = !transA && g + i < mc ? A + (size_t)(i0 + g + i) * lda + p0 + 32 * c : NULL;
                if (transA) tfm__amx_split(_mm512_castsi512_ps(v[i]), _mm512_castsi512_ps(v[16 + i]), &h, &l);
                else tfm__amx_split(tfm__load16(s, n), tfm__load16(s ? s + 16 : NULL, n - 16), &h, &l);
                _mm512_store_si512(d, h), _mm512_store_si512(d + 1024, l);
            }
        }
    }
}

/* The B panel: columns j0..j0+nc-1, rows p0..p0+kc-1 of op(B), in slivers of 32 columns (zero-padded);
   each holds, for every 32 rows c, two tiles, hi then lo, in the layout the tile product reads B in:
   two 16-column halves, each 16 rows of (k, k+1) pairs of 16 columns. op(B) = B^T (a row of B a column
   of op(B)) is split a row at a time and its pairs transposed in registers; op(B) = B two rows at a
   time, interleaved. */
static void tfm__amx_pack_b(int nc, int kc, const float *B, int ldb, int transB, int p0, int j0, uint16_t *dst) {
    static const short pairs[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                    8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    int nch = (kc + 31) / 32, cols = (nc + 31) / 32 * 32, g, c, r;
    const __m512i inter = _mm512_loadu_si512(pairs);
    __m512i h[16], l[16];
    for (g = 0; g < cols; g += 16)
        for (c = 0; c < nch; c++) {
            int n = TFM__MIN(32, kc - 32 * c), w = nc - g;
            uint16_t *d = dst + (size_t)(g / 32 * nch + c) * 2048 + (size_t)(g % 32) / 16 * 512;
            for (r = 0; r < 16; r++) {
                if (transB) { /* r: a column of op(B) */
                    const float *s = r < w ? B + (size_t)(j0 + g + r) * ldb + p0 + 32 * c : NULL;
                    tfm__amx_split(tfm__load16(s, n), tfm__load16(s ? s + 16 : NULL, n - 16), &h[r], &l[r]);
                } else { /* r: rows 2r and 2r + 1 of op(B) */
                    const float *s = B + (size_t)(p0 + 32 * c + 2 * r) * ldb + j0 + g;
                    tfm__amx_split(tfm__load16(2 * r < n ? s : NULL, w), tfm__load16(2 * r + 1 < n ? s + ldb : NULL, w),
                                   &h[r], &l[r]);
                    h[r] = _mm512_permutexvar_epi16(inter, h[r]), l[r] = _mm512_permutexvar_epi16(inter, l[r]);
                }
            }
            if (transB) tfm__t16(h), tfm__t16(l);
            for (r = 0; r < 16; r++) {
                _mm512_store_si512(d + 32 * r, h[r]), _mm512_store_si512(d + 1024 + 32 * r, l[r]);
            }
        }
}

/* One thread's product on the tiles: the Goto loops of tfm__sgemm_serial over 32 x 32 blocks of C,
   each four 16 x 16 fp32 tiles that stay in the tile registers over a K block. Where alpha is 1 and
   the block is whole they start from C itself (after the bias or beta is applied to it) and are stored
   back; otherwise they start at zero and alpha * sum + beta * C is formed from a copy. */
static void tfm__sgemm_amx(const tfm__gemm_kernel *k, int transA, int transB, int M, int N, int K, float alpha,
                           const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc,
                           const float *bias) {
    float *buf = tfm__scratch_acquire(TFM__ATT_FLOATS + TFM__PACK_FLOATS);
    int kc_step = tfm__kc_step(K, k->kc);
    int n_jc = tfm__ceil_div(N, k->nc), nc_step = tfm__ceil_div(tfm__ceil_div(N, n_jc), 32) * 32;
    int n_ic = tfm__ceil_div(M, k->mc), mc_step = tfm__ceil_div(tfm__ceil_div(M, n_ic), 32) * 32;
    int jc, pc, ic, jr, ir, q, i, j;
    uint16_t *Bp, *Ap;
    tfm__amx_cfg cfg;
    float t[32 * 32] __attribute__((aligned(64)));
    if (bias) beta = 1.0f;
    if (!buf) {
        if (bias) tfm__bias_rows(C, ldc, bias, M, N, 0);
        tfm__sgemm_nopack(k, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    Bp = (uint16_t *)tfm__align64(buf + TFM__ATT_FLOATS);
    Ap = Bp + (size_t)2 * k->kc * k->nc;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (i = 0; i < 8; i++) cfg.rows[i] = 16, cfg.colsb[i] = 64;
    _tile_loadconfig(&cfg);
    for (jc = 0; jc < N; jc += nc_step) {
        int nc = TFM__MIN(nc_step, N - jc);
        for (pc = 0; pc < K; pc += kc_step) {
            int kc = TFM__MIN(kc_step, K - pc), nch = tfm__ceil_div(kc, 32), first = pc == 0;
            float b_eff = first ? beta : 1.0f;
            tfm__amx_pack_b(nc, kc, B, ldb, transB, pc, jc, Bp);
            for (ic = 0; ic < M; ic += mc_step) {
                int mc = TFM__MIN(mc_step, M - ic);
                tfm__amx_pack_a(mc, kc, A, lda, transA, ic, pc, Ap);
                for (jr = 0; jr < nc; jr += 32)
                    for (ir = 0; ir < mc; ir += 32) {
                        const uint16_t *a = Ap + (size_t)(ir / 32) * nch * 2048;
                        const uint16_t *b = Bp + (size_t)(jr / 32) * nch * 2048;
                        int mr = TFM__MIN(32, mc - ir), nr = TFM__MIN(32, nc - jr);
                        int whole = mr == 32 && nr == 32 && alpha == 1.0f;
                        float *c = C + (size_t)(ic + ir) * ldc + jc + jr;
                        const size_t ldcb = (size_t)ldc * sizeof(float);
                        if (whole && first && bias) tfm__bias_rows(c, ldc, bias + jc + jr, 32, 32, 0);
                        else if (whole && first && b_eff != 1.0f && b_eff != 0.0f) tfm__scale_c(32, 32, b_eff, c, ldc);
                        if (!whole || (first && !bias && b_eff == 0.0f)) {
                            _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
                        } else {
                            _tile_loadd(0, c, ldcb); _tile_loadd(1, c + 16, ldcb);
                            _tile_loadd(2, c + 16 * (size_t)ldc, ldcb); _tile_loadd(3, c + 16 * (size_t)ldc + 16, ldcb);
                        }
                        for (q = 0; q < nch; q++, a += 2048, b += 2048) { /* hi*hi, hi*lo, lo*hi */
                            _tile_loadd(4, a, 64); _tile_loadd(5, a + 512, 64);
                            _tile_loadd(6, b, 64); _tile_loadd(7, b + 512, 64);
                            _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
                            _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
                            _tile_loadd(6, b + 1024, 64); _tile_loadd(7, b + 1536, 64);
                            _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
                            _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
                            _tile_loadd(4, a + 1024, 64); _tile_loadd(5, a + 1536, 64);
                            _tile_loadd(6, b, 64); _tile_loadd(7, b + 512, 64);
                            _tile_dpbf16ps(0, 4, 6); _tile_dpbf16ps(1, 4, 7);
                            _tile_dpbf16ps(2, 5, 6); _tile_dpbf16ps(3, 5, 7);
                        }
                        if (whole) {
                            _tile_stored(0, c, ldcb); _tile_stored(1, c + 16, ldcb);
                            _tile_stored(2, c + 16 * (size_t)ldc, ldcb);
                            _tile_stored(3, c + 16 * (size_t)ldc + 16, ldcb);
                            continue;
                        }
                        _tile_stored(0, t, 128); _tile_stored(1, t + 16, 128);
                        _tile_stored(2, t + 512, 128); _tile_stored(3, t + 528, 128);
                        for (i = 0; i < mr; i++)
                            for (j = 0; j < nr; j++) {
                                float v = alpha * t[i * 32 + j], *cij = c + (size_t)i * ldc + j;
                                *cij = first && bias ? bias[jc + jr + j] + v : b_eff != 0.0f ? b_eff * *cij + v : v;
                            }
                    }
            }
        }
    }
    _tile_release();
    tfm__scratch_done(buf);
}
#endif

/* The Goto loops on one thread: column panels jc (NC wide), K blocks pc (KC deep: the B panel is packed
   here), row blocks ic (MC high: the A block is packed here), then the block's tiles. Narrow products
   run them a column of slivers at a time (a B sliver in L1, the A slivers streaming from L2 past it);
   wide ones (N > TFM__WIDE) a row at a time (an A sliver in L1, the B panel streaming from L2), so that
   consecutive tiles also write along C's rows instead of down its columns. On the Intel Xeon, one
   thread, AVX-512 kernel (bench/RESULTS.md), the rows took 2048^2 from 0.92 of OpenBLAS to 0.94, LM
   heads (N 8192, 50257) from 0.86-0.88 to 0.97-0.98, a 4096 x 4096 x 32 product (K = 32: C's traffic
   dominates) from 0.71 to 2.4; products up to 512 columns ran 5-8% faster by columns. Blocks are balanced (like the K blocks,
   tfm__kc_step) and depend only on the shape; the tile order changes no sum.
   bias (N floats, or NULL): C starts as the bias in every row instead of beta C, each tile written just
   before its first kernel call (in cache) rather than by a pass over C ahead of the product; the same
   sums as that pass followed by beta 1. */
static void tfm__sgemm_serial(const tfm__gemm_kernel *k, int transA, int transB, int M, int N, int K, float alpha,
                              const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc,
                              const float *bias) {
    float *buf, *Bp, *Ap;
    const int MR = k->mr, NR = k->nr;
    int kc_step = tfm__kc_step(K, k->kc);
    int n_jc = tfm__ceil_div(N, k->nc), nc_step = tfm__ceil_div(tfm__ceil_div(N, n_jc), NR) * NR;
    int n_ic = tfm__ceil_div(M, k->mc), mc_step = tfm__ceil_div(tfm__ceil_div(M, n_ic), MR) * MR;
    /* Small products read an operand in place when packing it would not pay: op(A) when each A sliver
       meets at most two B slivers, op(B) = B (rows already run along NR) when each B sliver meets at
       most four A slivers or B has at most 4096 elements (16 KiB: it stays in L1 as it is; attention's
       32 x 64 x 32 heads went from 0.93 to 0.96 of OpenBLAS with the AVX2 kernel). Edge slivers are
       always packed (they are zero-padded). */
    int direct_a = N <= 2 * NR, direct_b = !transB && (M <= 4 * MR || (int64_t)K * N <= 4096);
    int jc, pc, ic, jr, ir, wide = N > TFM__WIDE;
#if defined(TFM__HAVE_AMX)
    if (k->amx) { /* (its own packing and scratch) */
        tfm__sgemm_amx(k, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
        return;
    }
#endif
    buf = tfm__scratch_acquire(TFM__ATT_FLOATS + TFM__PACK_FLOATS);
    if (bias) beta = 1.0f;
    if (!buf) {
        if (bias) tfm__bias_rows(C, ldc, bias, M, N, 0);
        tfm__sgemm_nopack(k, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    Bp = tfm__align64(buf + TFM__ATT_FLOATS); /* after the attention's region (it may be in use) */
    Ap = tfm__align64(Bp + (size_t)k->kc * k->nc);
    for (jc = 0; jc < N; jc += nc_step) {
        int nc = TFM__MIN(nc_step, N - jc);
        for (pc = 0; pc < K; pc += kc_step) {
            int kc = TFM__MIN(kc_step, K - pc);
            float b_eff = pc == 0 ? beta : 1.0f;
            if (!transB && !direct_b) { /* the full slivers row by row, then the edge sliver */
                int full = nc / NR * NR;
                tfm__pack_b_rows(NR, kc, full, B, ldb, pc, jc, Bp);
                if (full < nc) tfm__pack_b(NR, kc, nc - full, B, ldb, transB, pc, jc + full, Bp + (size_t)full * kc);
            } else {
                for (jr = 0; jr < nc; jr += NR)
                    if (!(direct_b && nc - jr >= NR))
                        tfm__pack_b(NR, kc, TFM__MIN(NR, nc - jr), B, ldb, transB, pc, jc + jr, Bp + (size_t)jr * kc);
            }
            for (ic = 0; ic < M; ic += mc_step) {
                int mc = TFM__MIN(mc_step, M - ic), n_ir = tfm__ceil_div(mc, MR), n_jr = tfm__ceil_div(nc, NR);
                int n_tiles = n_ir * n_jr, t;
                /* op(A) = A^T (the weight gradients, with K the tokens): the next A block's rows of the stored A
                   (kc2 rows of mc2 floats from A2) are fetched a share per tile while this block's kernels run.
                   Its packing waited on memory: 19% of the time of 384 x 128 x 8192 TN, whose A streams from
                   memory once; fetched ahead, 5-9% faster with the AVX2 kernel. */
                const float *A2 = NULL;
                int kc2 = 0, mc2 = 0;
                if (transA && !direct_a) {
                    if (ic + mc_step < M) {
                        A2 = A + (size_t)pc * lda + ic + mc_step;
                        kc2 = kc, mc2 = TFM__MIN(mc_step, M - ic - mc_step);
                    } else if (pc + kc_step < K) {
                        A2 = A + (size_t)(pc + kc_step) * lda;
                        kc2 = TFM__MIN(kc_step, K - pc - kc_step), mc2 = TFM__MIN(mc_step, M);
                    }
                }
                for (ir = 0; ir < mc; ir += MR)
                    if (!(direct_a && mc - ir >= MR))
                        tfm__pack_a(MR, TFM__MIN(MR, mc - ir), kc, A, lda, transA, ic + ir, pc, Ap + (size_t)ir * kc);
                for (t = 0; t < n_tiles; t++) { /* ir, jr: the tile's first row and column in the block */
                    int da, db;
                    const float *a, *b;
                    ir = (wide ? t / n_jr : t % n_ir) * MR, jr = (wide ? t % n_jr : t / n_ir) * NR;
                    da = direct_a && mc - ir >= MR, db = direct_b && nc - jr >= NR;
                    b = db ? B + (size_t)pc * ldb + jc + jr : Bp + (size_t)jr * kc;
                    a = !da ? Ap + (size_t)ir * kc : transA ? A + (size_t)pc * lda + ic + ir : A + (size_t)(ic + ir) * lda + pc;
                    if (bias && pc == 0)
                        tfm__bias_rows(C + (size_t)(ic + ir) * ldc + jc + jr, ldc, bias + jc + jr, TFM__MIN(MR, mc - ir),
                                       TFM__MIN(NR, nc - jr), 0);
                    tfm__gemm_tile(k, kc, a, !da || transA ? 1 : lda, !da ? MR : transA ? lda : 1, b, db ? ldb : NR,
                                   C + (size_t)(ic + ir) * ldc + jc + jr, ldc, TFM__MIN(MR, mc - ir), TFM__MIN(NR, nc - jr),
                                   alpha, b_eff);
                    if (A2) { /* this tile's share of the next block's cache lines */
                        int per_row = mc2 / 16 + 2, n = kc2 * per_row, l = (int)((int64_t)n * t / n_tiles);
                        int l1 = (int)((int64_t)n * (t + 1) / n_tiles);
                        for (; l < l1; l++)
                            TFM__PREFETCH(A2 + (size_t)(l / per_row) * lda + TFM__MIN((l % per_row) * 16, mc2 - 1));
                    }
                }
            }
        }
    }
    tfm__scratch_done(buf);
}

/* The built-in sgemm. With several threads, C is cut into one rectangle per thread (column ranges in
   whole NR slivers when op(B) has at least as many slivers as op(A), else row ranges in whole MR
   slivers) and each thread runs the Goto loops on its own, packing its own panels: the only
   synchronisation is the end of the parallel region, so a thread that the OS preempts delays nobody
   until then (on a shared machine, a barrier per K block cost more than the duplicated packing, which
   is about M*K/NC or N*K/MC extra copies). Each element of C is summed over K in the same order
   whatever the rectangle, so the result does not depend on the thread count. */
static TFM__UNUSED void tfm__sgemm_builtin_k(const tfm__gemm_kernel *k, int transA, int transB, int M, int N, int K,
                                            float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                                            float *C, int ldc, const float *bias) {
    int nth = 1, t;
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || alpha == 0.0f) {
        if (bias) tfm__bias_rows(C, ldc, bias, M, N, 1);
        else tfm__scale_c(M, N, beta, C, ldc);
        return;
    }
#ifdef _OPENMP
    if (!tfm__in_parallel() && (double)M * N * K > 2e5) nth = tfm_get_num_threads();
#endif
    {
        int s_m = tfm__ceil_div(M, k->mr), s_n = tfm__ceil_div(N, k->nr), by_cols = s_n >= s_m;
        int units = by_cols ? s_n : s_m;
        if (nth > units) nth = units;
        if (nth <= 1) {
            tfm__sgemm_serial(k, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
            return;
        }
        TFM__OMP(omp parallel for num_threads(nth) schedule(static, 1))
        for (t = 0; t < nth; t++) {
            int u0 = (int)((int64_t)units * t / nth), u1 = (int)((int64_t)units * (t + 1) / nth);
            if (by_cols) {
                int j0 = u0 * k->nr, j1 = TFM__MIN(N, u1 * k->nr);
                tfm__sgemm_serial(k, transA, transB, M, j1 - j0, K, alpha, A, lda,
                                  transB ? B + (size_t)j0 * ldb : B + j0, ldb, beta, C + j0, ldc, bias ? bias + j0 : NULL);
            } else {
                int i0 = u0 * k->mr, i1 = TFM__MIN(M, u1 * k->mr);
                tfm__sgemm_serial(k, transA, transB, i1 - i0, N, K, alpha, transA ? A + i0 : A + (size_t)i0 * lda, lda,
                                  B, ldb, beta, C + (size_t)i0 * ldc, ldc, bias);
            }
        }
    }
}
static TFM__UNUSED void tfm__sgemm_builtin_bias(int transA, int transB, int M, int N, int K, float alpha,
                                               const float *A, int lda, const float *B, int ldb, float beta,
                                               float *C, int ldc, const float *bias) {
    tfm__sgemm_builtin_k(tfm__gemm_kernel_get(), transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
}
static TFM__UNUSED void tfm__sgemm_builtin(int transA, int transB, int M, int N, int K, float alpha,
                                          const float *A, int lda, const float *B, int ldb, float beta,
                                          float *C, int ldc) {
    tfm__sgemm_builtin_bias(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL);
}

static inline float tfm__dot(const float *a, const float *b, int64_t n);

/* One row times a row-major matrix's transpose: c[j] = alpha * dot(a, B[j,:]) + beta * c[j]. The
   case of every linear map during generation (batch 1, one position): vectorized dot products,
   threaded over the output when it is large; BLAS's general kernels are slow at it. */
static TFM__UNUSED void tfm__gemv_nt(int N, int K, float alpha, const float *a, const float *B, int ldb, float beta, float *c) {
    int j;
    TFM__OMP(omp parallel for schedule(static) if ((int64_t)N * K > (1 << 18) && !tfm__in_parallel()))
    for (j = 0; j < N; j++) {
        float v = alpha * tfm__dot(a, B + (int64_t)j * ldb, K);
        c[j] = beta != 0.0f ? v + beta * c[j] : v;
    }
}

/* The choke point every product goes through; arguments are already valid. amx 0: the attention's block
   products (tfm__sgemm_fp32): never on the AMX kernel even where it is chosen, and in a BLAS build on the
   AVX2 kernel where that is the chosen one. */
static void tfm__sgemm_on(int amx, int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                          const float *B, int ldb, float beta, float *C, int ldc) {
    (void)amx;
    if (M <= 0 || N <= 0) return;
#if !defined(TFM_SGEMM)
    /* One row of A, stored contiguously (op(A) = A, or A^T with lda 1), times B^T. */
    if (M == 1 && transB && K > 0 && (!transA || lda == 1)) {
        tfm__gemv_nt(N, K, alpha, A, B, ldb, beta, C);
        return;
    }
#endif
#if defined(TFM_SGEMM)
    TFM_SGEMM(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#elif defined(TFM_BLAS)
    if (K <= 0) {
        tfm__scale_c(M, N, beta, C, ldc);
        return;
    }
#if defined(TFM__HAVE_AMX)
    if (amx && tfm__gemm_kernel_get()->amx) { /* chosen by name (or TFM_SGEMM_KERNEL): it runs the products */
        tfm__sgemm_builtin(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#endif
#if defined(TFM__HAVE_KERNEL_AVX2)
    if (!amx && tfm__gemm_kernel_get()->fn == tfm__kernel_avx2) { /* the attention's, see tfm__sgemm_fp32 */
        tfm__sgemm_builtin(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
#endif
    {
        /* Inside a region that is not active (an `if` that came out false: attention over one batch-head), the
           product stays on the calling thread, as the built-in sgemm's does (tfm__in_parallel). An OpenMP BLAS
           asks omp_in_parallel(), which such a region leaves false, and would start a nested team of its own;
           and its results can depend on its thread count (OpenBLAS 0.3.21 on a Zen 3: 64 x 300 x 64 on one
           thread and on two differ in the last bits), so one batch-head's attention differed from the same head
           in a call over two. The thread count it reads is the calling task's own, set back after the call. */
#ifdef _OPENMP
        int nt = tfm__in_parallel() && !omp_in_parallel() ? omp_get_max_threads() : 1;
        if (nt > 1) omp_set_num_threads(1);
#endif
        cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans, M, N,
                    K, alpha, A, lda, B, ldb, beta, C, ldc);
#ifdef _OPENMP
        if (nt > 1) omp_set_num_threads(nt);
#endif
    }
#else
    tfm__sgemm_builtin_k(!amx && tfm__gemm_kernel_get()->amx ? &tfm__gemm_kernels[0] : tfm__gemm_kernel_get(), transA,
                         transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL);
#endif
}
static void tfm__sgemm(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc) {
    tfm__sgemm_on(1, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
/* The fused attention's products (a query block against a key block, D deep): never on the AMX kernel,
   whose packing costs more than such a product, and whose rounding would break the backward's exact
   zeros (dP - D for a one-hot softmax row, >>impl-attention). In a BLAS build they run on the built-in
   AVX2 kernel where that is the chosen one: at these shapes (64 queries by up to 256 keys, 32 deep) it
   beat OpenBLAS's Zen kernels by 6-14% on a Zen 3 (bench/RESULTS.md), and the attention's scratch then
   holds the packing space too (TFM__ATT_SCRATCH). The AVX-512 kernel's side is not measured: there they
   stay with the BLAS. */
static void tfm__sgemm_fp32(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                            const float *B, int ldb, float beta, float *C, int ldc) {
    tfm__sgemm_on(0, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* C = alpha op(A) op(B) + bias in every row (bias: N floats). The built-in sgemm writes the bias tile by
   tile as it goes; otherwise (BLAS, TFM_SGEMM, one row) a pass writes it into C first and the product adds
   to it: the same sums either way. */
static void tfm__sgemm_bias(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                            const float *B, int ldb, const float *bias, float *C, int ldc) {
#if !defined(TFM_SGEMM) && !defined(TFM_BLAS)
    const int builtin = 1;
#elif !defined(TFM_SGEMM) && defined(TFM__HAVE_AMX)
    const int builtin = tfm__gemm_kernel_get()->amx;
#else
    const int builtin = 0;
#endif
    if (builtin && M > 1) {
        tfm__sgemm_builtin_bias(transA, transB, M, N, K, alpha, A, lda, B, ldb, 1.0f, C, ldc, bias);
        return;
    }
    tfm__bias_rows(C, ldc, bias, M, N, 1);
    tfm__sgemm(transA, transB, M, N, K, alpha, A, lda, B, ldb, 1.0f, C, ldc);
}

TFMDEF const char *tfm_sgemm_backend(void) {
#if defined(TFM_SGEMM)
    return "TFM_SGEMM";
#elif defined(TFM_BLAS)
    return "cblas";
#else
    return "built-in";
#endif
}

static tfm_result tfm__chk_gemm(const char *fn, int transA, int transB, int M, int N, int K,
                                const float *A, int lda, const float *B, int ldb, const float *C,
                                int ldc) {
    if (M < 0 || N < 0 || K < 0)
        return tfm__fail(TFM_E_ARG, "%s: sizes M=%d N=%d K=%d must not be negative", fn, M, N, K);
    if ((M > 0 && N > 0 && !C) || (M > 0 && K > 0 && !A) || (N > 0 && K > 0 && !B))
        return tfm__fail(TFM_E_ARG, "%s: A, B or C is NULL", fn);
    if (lda < TFM__MAX(1, transA ? M : K))
        return tfm__fail(TFM_E_ARG, "%s: lda %d is less than op(A)'s %s %d", fn, lda, transA ? "rows" : "columns",
                         transA ? M : K);
    if (ldb < TFM__MAX(1, transB ? K : N))
        return tfm__fail(TFM_E_ARG, "%s: ldb %d is less than op(B)'s %s %d", fn, ldb, transB ? "rows" : "columns",
                         transB ? K : N);
    if (ldc < TFM__MAX(1, N)) return tfm__fail(TFM_E_ARG, "%s: ldc %d is less than N=%d", fn, ldc, N);
    return TFM_OK;
}

TFMDEF tfm_result tfm_sgemm(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                            const float *B, int ldb, float beta, float *C, int ldc) {
    TFM__TRY(tfm__chk_gemm("tfm_sgemm", transA, transB, M, N, K, A, lda, B, ldb, C, ldc));
    tfm__sgemm(transA != 0, transB != 0, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return TFM_OK;
}

typedef void (*tfm__sgemm_fn)(int transA, int transB, int M, int N, int K, float alpha, const float *A, int lda,
                              const float *B, int ldb, float beta, float *C, int ldc);

/* Batched products through gemm (tfm__sgemm, or one engine in the bench): parallel over the batch when
   there is at least one matrix per thread, each product then on one thread with its operands packed
   once; otherwise one product after the other, each threaded. */
static void tfm__sgemm_batched_with(tfm__sgemm_fn gemm, int transA, int transB, int M, int N, int K, float alpha,
                                    const float *A, int lda, int64_t sA, const float *B, int ldb, int64_t sB,
                                    float beta, float *C, int ldc, int64_t sC, int batch) {
    int i;
    if (batch >= tfm_get_num_threads() && batch > 1 && !tfm__in_parallel()) {
        TFM__OMP(omp parallel for schedule(static))
        for (i = 0; i < batch; i++)
            gemm(transA, transB, M, N, K, alpha, A + i * sA, lda, B + i * sB, ldb, beta, C + i * sC, ldc);
    } else {
        for (i = 0; i < batch; i++)
            gemm(transA, transB, M, N, K, alpha, A + i * sA, lda, B + i * sB, ldb, beta, C + i * sC, ldc);
    }
}

static void tfm__sgemm_batched(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                               int lda, int64_t sA, const float *B, int ldb, int64_t sB, float beta,
                               float *C, int ldc, int64_t sC, int batch) {
    tfm__sgemm_batched_with(tfm__sgemm, transA, transB, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC,
                            batch);
}

TFMDEF tfm_result tfm_sgemm_batched(int transA, int transB, int M, int N, int K, float alpha, const float *A,
                                    int lda, int64_t strideA, const float *B, int ldb, int64_t strideB,
                                    float beta, float *C, int ldc, int64_t strideC, int batch) {
    TFM__TRY(tfm__chk_gemm("tfm_sgemm_batched", transA, transB, M, N, K, A, lda, B, ldb, C, ldc));
    if (batch < 0) return tfm__fail(TFM_E_ARG, "tfm_sgemm_batched: batch %d is negative", batch);
    if (strideA < 0 || strideB < 0 || strideC < 0)
        return tfm__fail(TFM_E_ARG, "tfm_sgemm_batched: strides %lld %lld %lld must not be negative",
                         (long long)strideA, (long long)strideB, (long long)strideC);
    if (batch > 1 && M > 0 && N > 0 && strideC < (int64_t)(M - 1) * ldc + N)
        return tfm__fail(TFM_E_ARG, "tfm_sgemm_batched: strideC %lld makes output matrices overlap (need >= %lld)",
                         (long long)strideC, (long long)((int64_t)(M - 1) * ldc + N));
    tfm__sgemm_batched(transA != 0, transB != 0, M, N, K, alpha, A, lda, strideA, B, ldb, strideB, beta, C, ldc,
                       strideC, batch);
    return TFM_OK;
}

/* ==== >>impl-cpu ==== */
/* Kernels over raw row-major arrays; arguments were checked by the public functions. Loops over rows
   run on OpenMP threads; reductions over rows (bias and gain gradients) are split by column, so every
   sum runs in the same order whatever the thread count. */

/* dst[c] += sum over rows of src[r, c]; src (N, C). */
static void tfm__colsum_add(float *dst, const float *src, int64_t N, int64_t C) {
    int64_t c0;
    const int64_t W = 64;
    TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(N * C)))
    for (c0 = 0; c0 < C; c0 += W) {
        int64_t c1 = TFM__MIN(c0 + W, C), r, c;
        float acc[64];
        for (c = c0; c < c1; c++) acc[c - c0] = 0.0f;
        for (r = 0; r < N; r++) {
            const float *s = src + r * C;
            for (c = c0; c < c1; c++) acc[c - c0] += s[c];
        }
        for (c = c0; c < c1; c++) dst[c] += acc[c - c0];
    }
}

/* y (N,O) = x (N,I) w^T + b. ldy is y's row stride (>= O). */
static void tfm__linear_forward_cpu(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                                    const float *b, int64_t N, int64_t NI, int64_t O) {
    if (b) tfm__sgemm_bias(0, 1, (int)N, (int)O, (int)NI, 1.0f, x, (int)ldx, w, (int)NI, b, y, (int)ldy);
    else tfm__sgemm(0, 1, (int)N, (int)O, (int)NI, 1.0f, x, (int)ldx, w, (int)NI, 0.0f, y, (int)ldy);
}

/* dx = dx_beta * dx + dy w (dx_beta 0: dx is overwritten, not read); dw += dy^T x; db += colsum(dy).
   dy (N,O) with row stride lddy. */
static void tfm__linear_backward_cpu(float *dx, int64_t lddx, float dx_beta, float *dw, float *db, const float *dy,
                                    int64_t lddy, const float *x, int64_t ldx, const float *w, int64_t N, int64_t NI,
                                    int64_t O) {
    if (dx) tfm__sgemm(0, 0, (int)N, (int)NI, (int)O, 1.0f, dy, (int)lddy, w, (int)NI, dx_beta, dx, (int)lddx);
    if (dw) tfm__sgemm(1, 0, (int)O, (int)NI, (int)N, 1.0f, dy, (int)lddy, x, (int)ldx, 1.0f, dw, (int)NI);
    if (db) {
        if (lddy == O) {
            tfm__colsum_add(db, dy, N, O);
        } else {
            int64_t r, c;
            for (r = 0; r < N; r++)
                for (c = 0; c < O; c++) db[c] += dy[r * lddy + c];
        }
    }
}

/* Reductions in a fixed order that vectorizes: 16 partial results, lane k taking elements
   k, k+16, k+32..., combined at the end; the same order on every thread count. (A plain running sum
   would stay scalar: reordering float additions needs -ffast-math, which this file never uses.) */
static inline float tfm__sum(const float *x, int64_t n) {
    float acc[16] = {0}, s = 0.0f;
    int64_t j = 0;
    int k;
    for (; j + 16 <= n; j += 16)
        for (k = 0; k < 16; k++) acc[k] += x[j + k];
    for (k = 0; k < 16; k++) s += acc[k];
    for (; j < n; j++) s += x[j];
    return s;
}
static inline float tfm__dot(const float *a, const float *b, int64_t n) {
    float acc[16] = {0}, s = 0.0f;
    int64_t j = 0;
    int k;
    for (; j + 16 <= n; j += 16)
        for (k = 0; k < 16; k++) acc[k] += a[j + k] * b[j + k];
    for (k = 0; k < 16; k++) s += acc[k];
    for (; j < n; j++) s += a[j] * b[j];
    return s;
}
static inline float tfm__max(const float *x, int64_t n) {
    float acc[16], m = x[0];
    int64_t j = 0;
    int k;
    for (k = 0; k < 16; k++) acc[k] = x[0];
    for (; j + 16 <= n; j += 16)
        for (k = 0; k < 16; k++) acc[k] = x[j + k] > acc[k] ? x[j + k] : acc[k];
    for (k = 0; k < 16; k++) m = acc[k] > m ? acc[k] : m;
    for (; j < n; j++) m = x[j] > m ? x[j] : m;
    return m;
}

static void tfm__softmax_row(float *y, const float *x, int64_t n) {
    float mx = tfm__max(x, n), inv;
    int64_t j;
    for (j = 0; j < n; j++) y[j] = tfm__exp(x[j] - mx);
    inv = 1.0f / tfm__sum(y, n);
    for (j = 0; j < n; j++) y[j] *= inv;
}

static void tfm__softmax_forward_cpu(float *y, const float *x, int64_t N, int64_t C) {
    int64_t r;
    TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(N * C)))
    for (r = 0; r < N; r++) tfm__softmax_row(y + r * C, x + r * C, C);
}

/* dx += y * (dy - sum(y * dy)) */
static void tfm__softmax_backward_cpu(float *dx, const float *dy, const float *y, int64_t N, int64_t C) {
    int64_t r;
    TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(N * C)))
    for (r = 0; r < N; r++) {
        const float *yr = y + r * C, *gr = dy + r * C;
        float *dr = dx + r * C, dot = tfm__dot(yr, gr, C);
        int64_t j;
        for (j = 0; j < C; j++) dr[j] += yr[j] * (gr[j] - dot);
    }
}

/* log-sum-exp of a row, max-subtracted */
static float tfm__lse_row(const float *x, int64_t n) {
    float mx = tfm__max(x, n), acc[16] = {0}, sum = 0.0f;
    int64_t j = 0;
    int k;
    for (; j + 16 <= n; j += 16)
        for (k = 0; k < 16; k++) acc[k] += tfm__exp(x[j + k] - mx);
    for (k = 0; k < 16; k++) sum += acc[k];
    for (; j < n; j++) sum += tfm__exp(x[j] - mx);
    return mx + logf(sum);
}

static void tfm__log_softmax_forward_cpu(float *y, const float *x, int64_t N, int64_t C) {
    int64_t r;
    TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(N * C)))
    for (r = 0; r < N; r++) {
        float lse = tfm__lse_row(x + r * C, C);
        int64_t j;
        for (j = 0; j < C; j++) y[r * C + j] = x[r * C + j] - lse;
    }
}

/* dx += dy - exp(y) * sum(dy) */
static void tfm__log_softmax_backward_cpu(float *dx, const float *dy, const float *y, int64_t N, int64_t C) {
    int64_t r;
    TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(N * C)))
    for (r = 0; r < N; r++) {
        float s = tfm__sum(dy + r * C, C);
        int64_t j;
        for (j = 0; j < C; j++) dx[r * C + j] += dy[r * C + j] - tfm__exp(y[r * C + j]) * s;
    }
}

/* The first index of the greatest of x[0..V-1]; NaN is never greater, so a row whose first value is NaN
   gives 0 (greedy decoding's choice, the same on both devices) */
static int64_t tfm__argmax_cpu(const float *x, int64_t V) {
    int64_t j, best = 0;
    for (j = 1; j < V; j++)
        if (x[j] > x[best]) best = j;
    return best;
}

/* Returns the mean loss over valid rows (*counted: how many); lse[r] = log-sum-exp of every row r. */
static float tfm__cross_entropy_forward_cpu(float *lse, const float *x, const int32_t *t, int ignore, float s,
                                            int64_t N, int64_t V, int64_t *counted) {
    double total = 0.0;
    int64_t r, nvalid = 0;
    TFM__OMP(omp parallel for schedule(static) reduction(+ : total, nvalid) if (TFM__PAR(N * V)))
    for (r = 0; r < N; r++) {
        const float *xr = x + r * V;
        float l, loss;
        l = tfm__lse_row(xr, V);
        lse[r] = l;
        if (t[r] == ignore) continue;
        loss = (1.0f - s) * (l - xr[t[r]]);
        if (s != 0.0f) {
            double mean = 0.0;
            int64_t j;
            for (j = 0; j < V; j++) mean += xr[j];
            loss += s * (l - (float)(mean / (double)V));
        }
        total += loss;
        nvalid++;
    }
    if (counted) *counted = nvalid;
    return nvalid ? (float)(total / (double)nvalid) : 0.0f;
}

/* dx += dloss/nvalid * (softmax(x) - (1-s) onehot(t) - s/V) on valid rows; the target's element in one
   expression, so a gradient that is exactly 0 (V = 1) comes out 0 under any contraction into fused
   multiply-adds */
static void tfm__cross_entropy_backward_cpu(float *dx, float dloss, const float *x, const float *lse,
                                            const int32_t *t, int ignore, float s, int64_t N, int64_t V) {
    int64_t r, nvalid = 0;
    float g, sv = s / (float)V;
    for (r = 0; r < N; r++) nvalid += t[r] != ignore;
    if (!nvalid) return;
    g = dloss / (float)nvalid;
    TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(N * V)))
    for (r = 0; r < N; r++) {
        const float *xr = x + r * V;
        float *dr = dx + r * V, l = lse[r];
        int64_t j, tr = t[r];
        if (tr == ignore) continue;
        for (j = 0; j < V; j++) dr[j] += g * (tfm__exp(xr[j] - l) - sv - (j == tr ? 1.0f - s : 0.0f));
    }
}

/* rms: RMSNorm, the layernorm without centering (the mean taken as 0): y = x * rstd * g, rstd from the mean
   of the squares. */
static void tfm__layernorm_forward_cpu(float *y, float *mean, float *rstd, const float *x, const float *g,
                                       const float *b, float eps, int64_t N, int64_t C, int rms) {
    int64_t r;
    TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(N * C)))
    for (r = 0; r < N; r++) {
        const float *xr = x + r * C;
        float *yr = y + r * C, m, v, rs, acc[16] = {0};
        int64_t j = 0;
        int k;
        m = rms ? 0.0f : tfm__sum(xr, C) / (float)C;
        v = 0.0f;
        for (; j + 16 <= C; j += 16)
            for (k = 0; k < 16; k++) acc[k] += (xr[j + k] - m) * (xr[j + k] - m);
        for (k = 0; k < 16; k++) v += acc[k];
        for (; j < C; j++) v += (xr[j] - m) * (xr[j] - m);
        v /= (float)C;
        rs = 1.0f / sqrtf(v + eps);
        for (j = 0; j < C; j++) yr[j] = (xr[j] - m) * rs * (g ? g[j] : 1.0f) + (b ? b[j] : 0.0f);
        if (mean) mean[r] = m;
        if (rstd) rstd[r] = rs;
    }
}

/* With xhat = (x - mean) * rstd and dn = dy * g:
   dx = res + rstd * (dn - mean(dn) - xhat * mean(dn * xhat));  dg += sum_rows dy * xhat;  db += sum_rows dy.
   res: a residual gradient added in the same pass; it may be dx itself (accumulate), or NULL (dx is
   overwritten, not read). rms: RMSNorm's (mean NULL, taken as 0, and no mean(dn) term). */
static void tfm__layernorm_backward_cpu(float *dx, const float *res, float *dg, float *db, const float *dy,
                                        const float *x, const float *g, const float *mean, const float *rstd,
                                        int64_t N, int64_t C, int rms) {
    int64_t r;
    if (dx) {
        TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(N * C)))
        for (r = 0; r < N; r++) {
            const float *xr = x + r * C, *gr = dy + r * C, *rr = res ? res + r * C : NULL;
            float *dr = dx + r * C, m = rms ? 0.0f : mean[r], rs = rstd[r], a = 0.0f, bsum = 0.0f, aa[16] = {0},
                  bb[16] = {0};
            int64_t j = 0;
            int k;
            for (; j + 16 <= C; j += 16)
                for (k = 0; k < 16; k++) {
                    float dn = gr[j + k] * (g ? g[j + k] : 1.0f);
                    aa[k] += dn;
                    bb[k] += dn * (xr[j + k] - m) * rs;
                }
            for (k = 0; k < 16; k++) {
                a += aa[k];
                bsum += bb[k];
            }
            for (; j < C; j++) {
                float dn = gr[j] * (g ? g[j] : 1.0f);
                a += dn;
                bsum += dn * (xr[j] - m) * rs;
            }
            a = rms ? 0.0f : a / (float)C;
            bsum /= (float)C;
            if (rr) {
                for (j = 0; j < C; j++) dr[j] = rr[j] + rs * (gr[j] * (g ? g[j] : 1.0f) - a - (xr[j] - m) * rs * bsum);
            } else {
                for (j = 0; j < C; j++) dr[j] = rs * (gr[j] * (g ? g[j] : 1.0f) - a - (xr[j] - m) * rs * bsum);
            }
        }
    }
    if (dg || db) {
        int64_t c0;
        const int64_t W = 64;
        TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(N * C)))
        for (c0 = 0; c0 < C; c0 += W) {
            int64_t c1 = TFM__MIN(c0 + W, C), rr, c;
            float ag[64], ab[64];
            for (c = c0; c < c1; c++) ag[c - c0] = ab[c - c0] = 0.0f;
            for (rr = 0; rr < N; rr++) {
                const float *xr = x + rr * C, *gr = dy + rr * C;
                float m = rms ? 0.0f : mean[rr], rs = rstd[rr];
                for (c = c0; c < c1; c++) {
                    ag[c - c0] += gr[c] * (xr[c] - m) * rs;
                    ab[c - c0] += gr[c];
                }
            }
            for (c = c0; c < c1; c++) {
                if (dg) dg[c] += ag[c - c0];
                if (db) db[c] += ab[c - c0];
            }
        }
    }
}

#define TFM__SQRT_2_OVER_PI 0.7978845608028654f
#define TFM__INV_SQRT_2 0.7071067811865476f
#define TFM__INV_SQRT_2PI 0.3989422804014327f

static TFM__HD inline float tfm__gelu_tanh(float v) {
    return 0.5f * v * (1.0f + tfm__tanh(TFM__SQRT_2_OVER_PI * (v + 0.044715f * v * v * v)));
}
static TFM__HD inline float tfm__gelu_erf(float v) { return 0.5f * v * (1.0f + tfm__erf(v * TFM__INV_SQRT_2)); }

/* The kind is tested outside the loops, so each vectorized loop evaluates one form only. */
static void tfm__gelu_forward_cpu(float *y, const float *x, int64_t n, int kind) {
    int64_t i;
    if (kind == TFM_GELU_TANH) {
        TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(n)))
        for (i = 0; i < n; i++) y[i] = tfm__gelu_tanh(x[i]);
    } else {
        TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(n)))
        for (i = 0; i < n; i++) y[i] = tfm__gelu_erf(x[i]);
    }
}

static TFM__HD inline float tfm__gelu_tanh_grad(float v) {
    float th = tfm__tanh(TFM__SQRT_2_OVER_PI * (v + 0.044715f * v * v * v));
    return 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * TFM__SQRT_2_OVER_PI * (1.0f + 3.0f * 0.044715f * v * v);
}
static TFM__HD inline float tfm__gelu_erf_grad(float v) {
    return 0.5f * (1.0f + tfm__erf(v * TFM__INV_SQRT_2)) + v * TFM__INV_SQRT_2PI * tfm__exp(-0.5f * v * v);
}

/* dx += dy * gelu'(x) (acc != 0), or dx = dy * gelu'(x) without reading dx (acc == 0). */
static void tfm__gelu_backward_cpu(float *dx, const float *dy, const float *x, int64_t n, int kind, float acc) {
    int64_t i;
    int tanh_form = kind == TFM_GELU_TANH;
    if (tanh_form && acc != 0.0f) {
        TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(n)))
        for (i = 0; i < n; i++) dx[i] += dy[i] * tfm__gelu_tanh_grad(x[i]);
    } else if (tanh_form) {
        TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(n)))
        for (i = 0; i < n; i++) dx[i] = dy[i] * tfm__gelu_tanh_grad(x[i]);
    } else if (acc != 0.0f) {
        TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(n)))
        for (i = 0; i < n; i++) dx[i] += dy[i] * tfm__gelu_erf_grad(x[i]);
    } else {
        TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(n)))
        for (i = 0; i < n; i++) dx[i] = dy[i] * tfm__gelu_erf_grad(x[i]);
    }
}

static void tfm__relu_forward_cpu(float *y, const float *x, int64_t n) {
    int64_t i;
    TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(n)))
    for (i = 0; i < n; i++) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

/* dx = acc * dx + (x > 0 ? dy : 0) */
static void tfm__relu_backward_cpu(float *dx, const float *dy, const float *x, int64_t n, float acc) {
    int64_t i;
    if (acc != 0.0f) {
        TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(n)))
        for (i = 0; i < n; i++) dx[i] += x[i] > 0.0f ? dy[i] : 0.0f;
    } else {
        TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(n)))
        for (i = 0; i < n; i++) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
    }
}

/* SwiGLU over rows of 2F: y[r,j] = silu(h[r,j]) * h[r,F+j], silu(g) = g sigmoid(g); h (N,2F), y (N,F).
   Backward: dh[r,j] = dy u silu'(g), silu'(g) = s (1 + g (1 - s)); dh[r,F+j] = dy silu(g) (dh written). */
static TFM__HD inline float tfm__sigmoid(float g) { return tfm__div1(1.0f, 1.0f + tfm__exp(-g)); }
static void tfm__swiglu_forward_cpu(float *y, const float *h, int64_t N, int64_t F) {
    int64_t r;
    TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(N * F)))
    for (r = 0; r < N; r++) {
        const float *g = h + r * 2 * F, *u = g + F;
        float *yr = y + r * F;
        int64_t j;
        for (j = 0; j < F; j++) yr[j] = g[j] * tfm__sigmoid(g[j]) * u[j];
    }
}
static void tfm__swiglu_backward_cpu(float *dh, const float *dy, const float *h, int64_t N, int64_t F) {
    int64_t r;
    TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(N * F)))
    for (r = 0; r < N; r++) {
        const float *g = h + r * 2 * F, *u = g + F, *dyr = dy + r * F;
        float *dg = dh + r * 2 * F, *du = dg + F;
        int64_t j;
        for (j = 0; j < F; j++) {
            float sg = tfm__sigmoid(g[j]);
            du[j] = dyr[j] * g[j] * sg;
            dg[j] = dyr[j] * u[j] * sg * (1.0f + g[j] * (1.0f - sg));
        }
    }
}

/* Rotary embedding of rows r = b*T + t (row stride ld) of H heads of D: y = R(p) x, or with inverse
   R(p)^T x; acc: y += instead of y = (y not aliasing x then); acc 2 (CUDA): y as bf16 elements (rows of ld
   of them), each rounded once, y not x. The angle of pair j at position p is
   p base^(-2j/rot), formed in double (float angles drift at long positions). */
static TFM__HD inline void tfm__rope_angle(double p, int j, int rot, double base, int inverse, float *c, float *sn) {
    double a = p * pow(base, -2.0 * (double)j / (double)rot);
    *c = (float)cos(a);
    *sn = (float)(inverse ? -sin(a) : sin(a));
}
/* Pairs whose angles the CPU forms at a time (on the stack) */
#define TFM__ROPE_PAIRS 32
/* Each position's angles are formed once for every batch row and head that stands there (rows of their
   own with pos0, where each batch row has its own offset): a task is a position t of every batch row,
   or with pos0 one row. */
static void tfm__rope_cpu(float *y, const float *x, int64_t ld, int64_t B, int64_t T, int H, int D, int rot, float base,
                          const int32_t *pos0, int inverse, int acc) {
    int64_t i, n = pos0 ? B * T : T;
    int half = rot / 2;
    TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(B * T * H * D)))
    for (i = 0; i < n; i++) {
        int64_t t = i % T, b0 = pos0 ? i / T : 0, b1 = pos0 ? b0 + 1 : B, b;
        double p = (double)t + (pos0 ? (double)pos0[b0] : 0.0);
        float c[TFM__ROPE_PAIRS], sn[TFM__ROPE_PAIRS];
        int h, j, j0, nj;
        for (j0 = 0; j0 < half; j0 += nj) {
            nj = TFM__MIN(TFM__ROPE_PAIRS, half - j0);
            for (j = 0; j < nj; j++) tfm__rope_angle(p, j0 + j, rot, (double)base, inverse, &c[j], &sn[j]);
            for (b = b0; b < b1; b++)
                for (h = 0; h < H; h++) {
                    const float *xa = x + (b * T + t) * ld + (int64_t)h * D + j0, *xb = xa + half;
                    float *ya = y + (b * T + t) * ld + (int64_t)h * D + j0, *yb = ya + half;
                    for (j = 0; j < nj; j++) {
                        float u = xa[j], v = xb[j], ru = u * c[j] - v * sn[j], rv = v * c[j] + u * sn[j];
                        ya[j] = acc ? ya[j] + ru : ru;
                        yb[j] = acc ? yb[j] + rv : rv;
                    }
                }
        }
        for (b = b0; b < b1; b++)
            for (h = 0; h < H; h++) {
                const float *xr = x + (b * T + t) * ld + (int64_t)h * D;
                float *yr = y + (b * T + t) * ld + (int64_t)h * D;
                for (j = rot; j < D; j++) yr[j] = acc ? yr[j] + xr[j] : xr[j];
            }
    }
}

/* y = x * keep / (1-p), keep = hash(seed, i0 + i) >= p * 2^24. backward: the same with dy, added to dx. */
static void tfm__dropout_cpu(float *y, const float *x, int64_t n, float p, uint64_t seed, uint64_t i0, int accumulate) {
    uint32_t thr = tfm__drop_threshold(p);
    float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    int64_t i;
    TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(n)))
    for (i = 0; i < n; i++) {
        float v = tfm__hash24(seed, i0 + (uint64_t)i) >= thr ? x[i] * scale : 0.0f;
        if (accumulate) y[i] += v;
        else y[i] = v;
    }
}

static void tfm__embedding_forward_cpu(float *y, const int32_t *ids, const float *w, float scale, int64_t N,
                                       int64_t C) {
    int64_t r;
    TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(N * C)))
    for (r = 0; r < N; r++) {
        const float *wr = w + (int64_t)ids[r] * C;
        float *yr = y + r * C;
        int64_t j;
        for (j = 0; j < C; j++) yr[j] = wr[j] * scale;
    }
}

/* dw[ids[r]] += scale * dy[r]; split by column so rows sharing an id never race. */
static void tfm__embedding_backward_cpu(float *dw, const float *dy, const int32_t *ids, float scale, int64_t N,
                                        int64_t C) {
    int64_t c0;
    const int64_t W = 64;
    TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(N * C)))
    for (c0 = 0; c0 < C; c0 += W) {
        int64_t c1 = TFM__MIN(c0 + W, C), r, c;
        for (r = 0; r < N; r++) {
            float *dr = dw + (int64_t)ids[r] * C;
            const float *gr = dy + r * C;
            for (c = c0; c < c1; c++) dr[c] += scale * gr[c];
        }
    }
}

/* y[b,t] = x[b,t] + w[t] */
static void tfm__pos_add_cpu(float *y, const float *x, const float *w, const int32_t *p0, int64_t B, int64_t T,
                             int64_t C) {
    int64_t bt;
    TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(B * T * C)))
    for (bt = 0; bt < B * T; bt++) {
        const float *xr = x + bt * C, *wr = w + ((p0 ? p0[bt / T] : 0) + bt % T) * C;
        float *yr = y + bt * C;
        int64_t j;
        for (j = 0; j < C; j++) yr[j] = xr[j] + wr[j];
    }
}

/* dw[t] += sum over b of dy[b,t] */
static void tfm__pos_embedding_backward_cpu(float *dw, const float *dy, int64_t B, int64_t T, int64_t C) {
    int64_t t;
    TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(B * T * C)))
    for (t = 0; t < T; t++) {
        int64_t b, j;
        for (b = 0; b < B; b++)
            for (j = 0; j < C; j++) dw[t * C + j] += dy[(b * T + t) * C + j];
    }
}

/* pe[t, 2i] = sin(t * 10000^(-2i/C)), pe[t, 2i+1] = cos(same), computed in double */
static TFM__HD float tfm__sinusoid(int64_t t, int64_t c, int64_t C) {
    double freq = exp(-(double)(c & ~(int64_t)1) / (double)C * 9.210340371976184); /* ln 10000 */
    double a = (double)t * freq;
    return (float)((c & 1) ? cos(a) : sin(a));
}

static void tfm__sinusoidal_add_cpu(float *y, const float *x, int64_t B, int64_t T, int64_t C) {
    int64_t bt;
    TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(B * T * C)))
    for (bt = 0; bt < B * T; bt++) {
        int64_t j, t = bt % T;
        for (j = 0; j < C; j++) y[bt * C + j] = (x ? x[bt * C + j] : 0.0f) + tfm__sinusoid(t, j, C);
    }
}

static void tfm__add_cpu(float *y, const float *a, const float *b, int64_t n) {
    int64_t i;
    TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(n)))
    for (i = 0; i < n; i++) y[i] = a[i] + b[i];
}

/* n rows of C: dst row r (stride ldd) = src row r (stride lds) */
static void tfm__copy_rows_cpu(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t n, int64_t C) {
    int64_t r;
    if (ldd == C && lds == C) {
        memcpy(dst, src, (size_t)(n * C) * sizeof(float));
        return;
    }
    for (r = 0; r < n; r++) memcpy(dst + r * ldd, src + r * lds, (size_t)C * sizeof(float));
}

/* dst row r (stride ldd) += src row r (stride lds) */
static void tfm__add_rows_cpu(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t n, int64_t C) {
    int64_t r, j;
    for (r = 0; r < n; r++)
        for (j = 0; j < C; j++) dst[r * ldd + j] += src[r * lds + j];
}

static void tfm__mean_pool_forward_cpu(float *y, const float *x, const int32_t *lens, int64_t B, int64_t T,
                                       int64_t C) {
    int64_t b;
    TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(B * T * C)))
    for (b = 0; b < B; b++) {
        int64_t L = lens ? lens[b] : T, t, j;
        float *yr = y + b * C;
        for (j = 0; j < C; j++) yr[j] = 0.0f;
        for (t = 0; t < L; t++)
            for (j = 0; j < C; j++) yr[j] += x[(b * T + t) * C + j];
        if (L > 0)
            for (j = 0; j < C; j++) yr[j] /= (float)L;
    }
}

static void tfm__mean_pool_backward_cpu(float *dx, const float *dy, const int32_t *lens, int64_t B, int64_t T,
                                        int64_t C) {
    int64_t b;
    TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(B * T * C)))
    for (b = 0; b < B; b++) {
        int64_t L = lens ? lens[b] : T, t, j;
        float inv;
        if (L <= 0) continue;
        inv = 1.0f / (float)L;
        for (t = 0; t < L; t++)
            for (j = 0; j < C; j++) dx[(b * T + t) * C + j] += dy[b * C + j] * inv;
    }
}

/* One AdamW update of n consecutive parameters:
       g = grad * scale;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
       w = w * decay - step_size * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
   sqrtf must be able to set errno (C's default), which keeps GCC from vectorizing a loop that calls it;
   on x86 the body runs TFM__VW at a time (SSE2 4, AVX 8, AVX-512 16) with the same operations in the
   same order, the square root by intrinsic. The spans the optimizer hands to threads are fixed (not
   per thread count), so results never depend on threads. */
#define TFM__ADAMW_SPAN 2048
/* The update of one element (the scalar form of the loop below; the GPU's kernel too). */
/* The factor clipping multiplies the gradients by for a squared global norm sumsq: clip / (norm + 1e-6)
   when that is below 1 (clip > 0), else 1. The host's and the GPU's AdamW alike (the GPU reads sumsq from
   device memory, so that a captured step needs no read-back between the norm and the update). */
static TFM__HD inline float tfm__clip_scale(double sumsq, float clip) {
    double total = sqrt(sumsq), s;
    if (!(clip > 0.0f && total > 0.0)) return 1.0f;
    s = (double)clip / (total + 1e-6);
    return s < 1.0 ? (float)s : 1.0f;
}

static TFM__HD inline void tfm__adamw_one(float *w, float g, float *m, float *v, float b1, float b2, float eps,
                                          float step_size, float bc2s, float decay) {
    *m = b1 * *m + (1.0f - b1) * g;
    *v = b2 * *v + (1.0f - b2) * g * g;
    *w = *w * decay - step_size * *m / (sqrtf(*v) / bc2s + eps);
}
static void tfm__adamw_span(float *w, const float *gr, float *mm, float *vv, int64_t n, float scale, float b1,
                            float b2, float eps, float step_size, float bc2s, float decay) {
    int64_t j = 0;
#if defined(TFM__VSQRT)
    for (; j + TFM__VW <= n; j += TFM__VW) {
        tfm__vf g = tfm__vload(gr + j) * scale;
        tfm__vf m1 = b1 * tfm__vload(mm + j) + (1.0f - b1) * g;
        tfm__vf v1 = b2 * tfm__vload(vv + j) + (1.0f - b2) * g * g;
        tfm__vf w1 = tfm__vload(w + j) * decay - step_size * m1 / (TFM__VSQRT(v1) / bc2s + eps);
        tfm__vstore(mm + j, m1);
        tfm__vstore(vv + j, v1);
        tfm__vstore(w + j, w1);
    }
#endif
    for (; j < n; j++) tfm__adamw_one(w + j, gr[j] * scale, mm + j, vv + j, b1, b2, eps, step_size, bc2s, decay);
}

/* AdamW over n floats in the fixed spans above, spread over threads. */
static void tfm__adamw_cpu(float *w, const float *g, float *mm, float *vv, int64_t n, float scale, float b1, float b2,
                           float eps, float step_size, float bc2s, float decay) {
    int64_t c;
    TFM__OMP(omp parallel for schedule(static) if (TFM__PAR(n)))
    for (c = 0; c < n; c += TFM__ADAMW_SPAN)
        tfm__adamw_span(w + c, g + c, mm + c, vv + c, TFM__MIN(TFM__ADAMW_SPAN, n - c), scale, b1, b2, eps, step_size,
                        bc2s, decay);
}

/* sum of g[i]^2 in double over 8 interleaved partial sums (a fixed order that vectorizes) */
static double tfm__sumsq_cpu(const float *g, int64_t n) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, sum = 0.0;
    int64_t j = 0;
    int k;
    for (; j + 8 <= n; j += 8)
        for (k = 0; k < 8; k++) acc[k] += (double)g[j + k] * (double)g[j + k];
    for (; j < n; j++) acc[0] += (double)g[j] * (double)g[j];
    for (k = 0; k < 8; k++) sum += acc[k];
    return sum;
}

/* ==== >>impl-attention ====
   Heads live in a (B,T,C) layout: head h of batch b is the (T,D) sub-matrix starting at
   base + b*T*ld + h*D with row stride ld, so the fused q|k|v projection is read in place, with no
   transposing copies. Each (batch, head) pair is one task on one thread; its products are single
   sgemm calls (run serially inside the parallel loop). With grouped-query attention (Hkv key/value
   heads), query head h reads key/value head h / (H/Hkv) in place; backward takes one task per (batch,
   key/value head), whose group of query heads adds into that head's dk and dv in turn. With the causal
   and padding masks, the keys visible to query i are the prefix j < min(len_b, i+1), so the mask is a
   per-row count. A sliding window hides the keys [sinks, i - window] of that prefix: the key loop
   starts each query block at the sinks and jumps to its first query's window (so a block never spans
   the gap, and the cost is O(T window)), and inside a block the rows' own gaps are scored -inf.

   The attention is fused: queries run in blocks of TFM__ATT_QB rows against keys in blocks of
   TFM__ATT_KB, and nothing of size Tq x Tk is stored. Forward keeps, per query row, the running maximum
   m of its scores and the sum l of e^(s - m) (an online softmax): a key block that raises the maximum
   rescales the row's partial output and sum by e^(m_old - m_new). Each row's output is divided by l at
   the end, and lse = m + log l is saved (-inf for a row that sees no key, whose output is zeros).
   Backward recomputes each block of probabilities as P = e^(S - lse) and uses
   D = rowsum(dout * out) = rowsum(P * dP) for the softmax's gradient. The block buffers are the
   attention's region of the scratch of the thread that runs the task (>>impl-sgemm), on the heap: the
   stack holds only scalars. Every thread of the loop takes its scratch before any task runs; if one
   cannot, nothing is written, tfm__scratch_failed is set and the kernel returns 0. */

typedef struct tfm__attn_args {
    int B, H, Tq, Tk, D;
    int Hkv;                 /* key/value heads (grouped-query), dividing H; 0: H */
    const float *q, *k, *v;  /* head 0 of batch 0 */
    int ldq, ldk, ldv;
    float *out;              /* (B,Tq,*) with row stride ldo; backward reads it */
    int ldo;
    float *lse;              /* (B,H,Tq) log-sum-exp of each query's scores; backward reads it */
    int causal;
    int window, sinks;       /* causal: query at position p sees keys p - window < j <= p, and j < sinks (the
                                attention sinks); window 0: every earlier key */
    int ring;                /* decoding against a rolling cache of this many rows (tfm_kv_cache): a query at
                                position >= ring sees every row (the ring holds its window); 0: none */
    const int32_t *lens;     /* B key lengths or NULL */
    float dropout, scale;
    uint64_t seed;
    /* decoding against a cache: keys of batch b start at k + rows[b] * bsk (rows NULL: b; bsk 0: Tk * ldk),
       and its query i sits at position q_off[b] + i (for the causal mask; q_off NULL: i) */
    int64_t bsk;
    const int32_t *kv_rows, *q_off;
    const float *mask;       /* additive (Tq,Tk) scores mask, batch b's at mask + b * mask_bs */
    int64_t mask_bs;
    uint64_t drop_i0;        /* dropout masks as if these were elements drop_i0.. of a larger batch */
    const uint64_t *seed_at; /* CUDA kernels: the seed in device memory, read in place of seed (a recorded
                                step stages it: tfm__cu_attn_stage); NULL: seed. Set by the launchers. */
    int overwrite;           /* backward: dq, dk and dv are written, not added into (set only where
                                tfm__op_attention_flash says the call does) */
    int qkv_bf;              /* q, k and v are bf16 elements behind their float pointers (ldq, ldk, ldv in
                                them): only the flash kernels' calls (tfm__op_attention_flash) */
    int out_bf;              /* out likewise (ldo in bf16 elements): the flash forward writes it rounded */
    int d_bf;                /* backward (overwrite): 1, dq, dk and dv rounded to bf16 as written (0 + the value, as
                                fp32 floats); 2, written so as bf16 elements behind their float pointers (lddq,
                                lddk, lddv in them) */
    int dout_bf;             /* backward, the flash kernels' (which round dout to bf16 as they load it): 1, D =
                                rowsum(dout * out) takes dout rounded too; 2, dout is bf16 (lddo in its elements) */
} tfm__attn_args;

/* The key/value head of query head h: heads come in H/Hkv groups of consecutive query heads (repeat_kv). */
static TFM__HD int tfm__attn_kv_head(const tfm__attn_args *a, int h) {
    return a->Hkv ? h / (a->H / a->Hkv) : h;
}

/* Number of keys query i of batch b may see. */
static TFM__HD int tfm__attn_visible(const tfm__attn_args *a, int b, int i) {
    int n = a->lens ? a->lens[b] : a->Tk, p = a->q_off ? a->q_off[b] + i : i;
    if (a->causal && p + 1 < n) n = p + 1;
    return n < 0 ? 0 : n;
}

/* With a window, the keys [sinks, lo) of the visible prefix are hidden from query i of batch b: lo is
   the window's first key (0: none hidden). */
static TFM__HD int tfm__attn_window_lo(const tfm__attn_args *a, int b, int i) {
    int p = a->q_off ? a->q_off[b] + i : i;
    if (!a->window || (a->ring && p >= a->ring)) return 0;
    return p - a->window + 1;
}

/* The first key at or after j that a query of window start lo may see: j itself, or lo past the gap
   between the sinks and the window. */
static TFM__HD int tfm__attn_skip(const tfm__attn_args *a, int j, int lo) {
    return j >= a->sinks && j < lo ? lo : j;
}

/* The length of a key block starting at j0, at most nk: one that starts among the sinks ends with them
   when a gap follows (lo, the window start of the block's first query, is past the sinks). */
static TFM__HD int tfm__attn_block_len(const tfm__attn_args *a, int j0, int nk, int lo) {
    return j0 < a->sinks && lo > a->sinks && a->sinks - j0 < nk ? a->sinks - j0 : nk;
}

/* Keys of query i of batch b visible inside the key block [j0, j0 + nk): a prefix of the block, but for
   the window's gap, whose scores s (when given) are set to -inf. */
static int tfm__attn_block_visible(const tfm__attn_args *a, int b, int i, int j0, int nk, float *s) {
    int n = tfm__attn_visible(a, b, i) - j0, lo, j;
    n = n < 0 ? 0 : n > nk ? nk : n;
    if (s && a->window && (lo = tfm__attn_window_lo(a, b, i)) > a->sinks)
        for (j = TFM__MAX(a->sinks - j0, 0); j < n && j0 + j < lo; j++) s[j] = -INFINITY;
    return n;
}

/* s[0..n) += the additive mask of query i of batch b at keys j0.. */
static void tfm__attn_add_mask(float *s, const tfm__attn_args *a, int b, int i, int j0, int n) {
    const float *mr = a->mask + b * a->mask_bs + (int64_t)i * a->Tk + j0;
    int j;
    for (j = 0; j < n; j++) s[j] += mr[j];
}

/* dst[j] = src[j] * dropout mask of element row0 + j (inverted scaling), j < n */
static void tfm__attn_drop_row(float *dst, const float *src, const tfm__attn_args *a, int64_t row0, int n) {
    uint32_t thr = tfm__drop_threshold(a->dropout);
    float scale = a->dropout < 1.0f ? 1.0f / (1.0f - a->dropout) : 0.0f;
    int j;
    for (j = 0; j < n; j++) dst[j] = tfm__hash24(a->seed, (uint64_t)(row0 + j)) >= thr ? src[j] * scale : 0.0f;
}

/* Index of the dropout element of (batch-head bh, query i, key j): the place it had in (B,H,Tq,Tk). */
static TFM__HD int64_t tfm__attn_drop_index(const tfm__attn_args *a, int bh, int i, int j) {
    return (int64_t)a->drop_i0 + ((int64_t)bh * a->Tq + i) * a->Tk + j;
}

/* The start of an attention kernel's parallel region: this thread's scratch in *buf (NULL: none), and
   whether every thread of the team has one (after a barrier, so all threads agree). */
static int tfm__attn_scratch(float **buf, int *failed) {
    int f;
    *buf = tfm__scratch_acquire(TFM__ATT_SCRATCH);
    if (!*buf) {
        TFM__OMP(omp atomic write)
        *failed = 1;
    }
    TFM__OMP(omp barrier)
    TFM__OMP(omp atomic read)
    f = *failed;
    return !f;
}

/* Batch-head bh of the forward, with the block buffers S (QB x KB), m and l (QB each). */
static void tfm__attn_fwd_head(const tfm__attn_args *a, int bh, float *S, float *m, float *l) {
    int Tq = a->Tq, D = a->D;
    int b = bh / a->H, h = bh % a->H, kh = tfm__attn_kv_head(a, h), i, j, d, i0, j0;
    const float *q = a->q + (int64_t)b * Tq * a->ldq + h * D;
    int64_t kb = a->kv_rows ? a->kv_rows[b] : b;
    const float *k = a->k + kb * (a->bsk ? a->bsk : (int64_t)a->Tk * a->ldk) + kh * D;
    const float *v = a->v + kb * (a->bsk ? a->bsk : (int64_t)a->Tk * a->ldv) + kh * D;
    float *o = a->out + (int64_t)b * Tq * a->ldo + h * D, *lse = a->lse + (int64_t)bh * Tq;
    for (i0 = 0; i0 < Tq; i0 += TFM__ATT_QB) {
        int nq = TFM__MIN(TFM__ATT_QB, Tq - i0), kn = tfm__attn_visible(a, b, i0 + nq - 1), nk;
        int lo = tfm__attn_window_lo(a, b, i0); /* the block's first query starts the earliest window */
        float *ob = o + (int64_t)i0 * a->ldo;
        for (i = 0; i < nq; i++) {
            m[i] = -INFINITY;
            l[i] = 0.0f;
            for (d = 0; d < D; d++) ob[(int64_t)i * a->ldo + d] = 0.0f;
        }
        for (j0 = tfm__attn_skip(a, 0, lo); j0 < kn; j0 = tfm__attn_skip(a, j0 + nk, lo)) {
            nk = tfm__attn_block_len(a, j0, TFM__MIN(TFM__ATT_KB, kn - j0), lo);
            /* S = scale * q k^T over the block, then each row's exponentials against its running max */
            tfm__sgemm_fp32(0, 1, nq, nk, D, a->scale, q + (int64_t)i0 * a->ldq, a->ldq, k + (int64_t)j0 * a->ldk,
                            a->ldk, 0.0f, S, TFM__ATT_KB);
            for (i = 0; i < nq; i++) {
                float *s = S + (int64_t)i * TFM__ATT_KB, *orow = ob + (int64_t)i * a->ldo, bm, mn, alpha;
                int n = tfm__attn_block_visible(a, b, i0 + i, j0, nk, s);
                if (n > 0 && a->mask) tfm__attn_add_mask(s, a, b, i0 + i, j0, n);
                bm = n > 0 ? tfm__max(s, n) : -INFINITY;
                if (bm == -INFINITY) n = 0; /* nothing visible here (an additive mask may hide it all) */
                for (j = n; j < nk; j++) s[j] = 0.0f;
                if (n == 0) continue;
                mn = bm > m[i] ? bm : m[i];
                alpha = m[i] == -INFINITY ? 0.0f : tfm__exp(m[i] - mn);
                for (j = 0; j < n; j++) s[j] = tfm__exp(s[j] - mn);
                l[i] = l[i] * alpha + tfm__sum(s, n);
                if (alpha != 1.0f)
                    for (d = 0; d < D; d++) orow[d] *= alpha;
                m[i] = mn;
                if (a->dropout > 0.0f) tfm__attn_drop_row(s, s, a, tfm__attn_drop_index(a, bh, i0 + i, j0), n);
            }
            /* out += P v; one query row (a decoding step) as a weighted sum of the value rows, which a
               general product would pack first */
            if (nq == 1) {
                for (j = 0; j < nk; j++) {
                    const float *vj = v + (int64_t)(j0 + j) * a->ldv;
                    float p = S[j];
                    for (d = 0; d < D; d++) ob[d] += p * vj[d];
                }
            } else {
                tfm__sgemm_fp32(0, 0, nq, D, nk, 1.0f, S, TFM__ATT_KB, v + (int64_t)j0 * a->ldv, a->ldv, 1.0f, ob,
                                a->ldo);
            }
        }
        for (i = 0; i < nq; i++) {
            float *orow = ob + (int64_t)i * a->ldo, inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
            for (d = 0; d < D; d++) orow[d] *= inv;
            lse[i0 + i] = l[i] > 0.0f ? m[i] + logf(l[i]) : -INFINITY;
        }
    }
}

static int tfm__attention_forward_cpu(const tfm__attn_args *a) {
    int nbh = a->B * a->H, failed = 0;
    TFM__OMP(omp parallel if (nbh > 1 && !tfm__in_parallel()))
    {
        float *buf, *S;
        int bh;
        if (tfm__attn_scratch(&buf, &failed)) {
            S = tfm__align64(buf);
            TFM__OMP(omp for schedule(static))
            for (bh = 0; bh < nbh; bh++)
                tfm__attn_fwd_head(a, bh, S, S + TFM__ATT_QB * TFM__ATT_KB, S + TFM__ATT_QB * TFM__ATT_KB + TFM__ATT_QB);
        }
        tfm__scratch_done(buf);
    }
    if (failed) tfm__scratch_failed = 1;
    return !failed;
}

/* Whether query i of batch b sees exactly one key: one visible, or one that the additive mask leaves
   finite. Its softmax row is then one-hot whatever the scores. */
static TFM__HD int tfm__attn_one_key(const tfm__attn_args *a, int b, int i) {
    int n = tfm__attn_visible(a, b, i), lo = tfm__attn_window_lo(a, b, i), j, c = 0;
    const float *mr;
    if (lo > a->sinks) n -= TFM__MIN(lo, n) - TFM__MIN(a->sinks, n); /* the window's gap */
    if (!a->mask || n <= 1) return n == 1;
    n = tfm__attn_visible(a, b, i);
    mr = a->mask + b * a->mask_bs + (int64_t)i * a->Tk;
    for (j = 0; j < n && c < 2; j++) c += mr[j] != -INFINITY && tfm__attn_skip(a, j, lo) == j;
    return c == 1;
}

/* Per block, with P = e^(S - lse), M the dropout mask and Pd = P*M:
   dv += Pd^T dout;  dP = (dout v^T) * M;  dS = P * (dP - D), D = rowsum(dout * out);
   dq += scale * dS k;  dk += scale * dS^T q.  All O(T^2 D) per head, over the visible keys only.
   D is rowsum(P * dP) by another route: the two agree but for rounding, as dP comes from a product and
   D from a dot product. Where it matters, a query that sees one key (tfm__attn_one_key: cross-attention
   to a one-token source, a key length of 1, the first causal query), P is one-hot, D is that key's dP
   exactly and dS exactly zero, as in the unfused softmax: the row's dS is written as those zeros, so no
   rounding residue reaches dq or dk. */
/* Batch-head bh of the backward, with the block buffers P and G (QB x KB each), Dr and one (QB each). */
static void tfm__attn_bwd_head(const tfm__attn_args *a, int bh, float *P, float *G, float *Dr, float *one, float *dq,
                               int lddq, float *dk, int lddk, float *dv, int lddv, const float *dout, int lddo) {
    int Tq = a->Tq, Tk = a->Tk, D = a->D;
    int b = bh / a->H, h = bh % a->H, kh = tfm__attn_kv_head(a, h), i, j, i0, j0;
    const float *q = a->q + (int64_t)b * Tq * a->ldq + h * D;
    const float *k = a->k + (int64_t)b * Tk * a->ldk + kh * D;
    const float *v = a->v + (int64_t)b * Tk * a->ldv + kh * D;
    const float *o = a->out + (int64_t)b * Tq * a->ldo + h * D;
    const float *go = dout + (int64_t)b * Tq * lddo + h * D, *lse = a->lse + (int64_t)bh * Tq;
    float *dvb = dv ? dv + (int64_t)b * Tk * lddv + kh * D : NULL;
    float *dqb = dq ? dq + (int64_t)b * Tq * lddq + h * D : NULL;
    float *dkb = dk ? dk + (int64_t)b * Tk * lddk + kh * D : NULL;
    for (i0 = 0; i0 < Tq; i0 += TFM__ATT_QB) {
        int nq = TFM__MIN(TFM__ATT_QB, Tq - i0), kn = tfm__attn_visible(a, b, i0 + nq - 1), nk;
        int lo = tfm__attn_window_lo(a, b, i0);
        const float *gob = go + (int64_t)i0 * lddo;
        for (i = 0; i < nq; i++) {
            Dr[i] = tfm__dot(gob + (int64_t)i * lddo, o + (int64_t)(i0 + i) * a->ldo, D);
            one[i] = (float)tfm__attn_one_key(a, b, i0 + i);
        }
        for (j0 = tfm__attn_skip(a, 0, lo); j0 < kn; j0 = tfm__attn_skip(a, j0 + nk, lo)) {
            const float *Pd = P;
            nk = tfm__attn_block_len(a, j0, TFM__MIN(TFM__ATT_KB, kn - j0), lo);
            tfm__sgemm_fp32(0, 1, nq, nk, D, a->scale, q + (int64_t)i0 * a->ldq, a->ldq, k + (int64_t)j0 * a->ldk,
                            a->ldk, 0.0f, P, TFM__ATT_KB);
            for (i = 0; i < nq; i++) {
                float *p = P + (int64_t)i * TFM__ATT_KB, L = lse[i0 + i];
                int n = L == -INFINITY ? 0 : tfm__attn_block_visible(a, b, i0 + i, j0, nk, p);
                if (n > 0 && a->mask) tfm__attn_add_mask(p, a, b, i0 + i, j0, n);
                for (j = 0; j < n; j++) p[j] = tfm__exp(p[j] - L);
                for (j = n; j < nk; j++) p[j] = 0.0f;
            }
            if (dvb) {
                if (a->dropout > 0.0f) {
                    for (i = 0; i < nq; i++)
                        tfm__attn_drop_row(G + (int64_t)i * TFM__ATT_KB, P + (int64_t)i * TFM__ATT_KB, a,
                                           tfm__attn_drop_index(a, bh, i0 + i, j0), nk);
                    Pd = G;
                }
                tfm__sgemm_fp32(1, 0, nk, D, nq, 1.0f, Pd, TFM__ATT_KB, gob, lddo, 1.0f, dvb + (int64_t)j0 * lddv, lddv);
            }
            if (!dqb && !dkb) continue;
            tfm__sgemm_fp32(0, 1, nq, nk, D, 1.0f, gob, lddo, v + (int64_t)j0 * a->ldv, a->ldv, 0.0f, G, TFM__ATT_KB);
            for (i = 0; i < nq; i++) {
                float *g = G + (int64_t)i * TFM__ATT_KB;
                const float *p = P + (int64_t)i * TFM__ATT_KB;
                if (one[i] != 0.0f) {
                    for (j = 0; j < nk; j++) g[j] = 0.0f;
                    continue;
                }
                if (a->dropout > 0.0f) tfm__attn_drop_row(g, g, a, tfm__attn_drop_index(a, bh, i0 + i, j0), nk);
                for (j = 0; j < nk; j++) g[j] = p[j] * (g[j] - Dr[i]);
            }
            if (dqb)
                tfm__sgemm_fp32(0, 0, nq, D, nk, a->scale, G, TFM__ATT_KB, k + (int64_t)j0 * a->ldk, a->ldk, 1.0f,
                                dqb + (int64_t)i0 * lddq, lddq);
            if (dkb)
                tfm__sgemm_fp32(1, 0, nk, D, nq, a->scale, G, TFM__ATT_KB, q + (int64_t)i0 * a->ldq, a->ldq, 1.0f,
                                dkb + (int64_t)j0 * lddk, lddk);
        }
    }
}

/* One task per (batch, key/value head): the query heads of its group run in turn, so the dk and dv they
   share are summed in one order by one thread. */
static int tfm__attention_backward_cpu(const tfm__attn_args *a, float *dq, int lddq, float *dk, int lddk,
                                       float *dv, int lddv, const float *dout, int lddo) {
    int G = a->Hkv ? a->H / a->Hkv : 1, ntask = a->B * a->H / G, failed = 0;
    TFM__OMP(omp parallel if (ntask > 1 && !tfm__in_parallel()))
    {
        float *buf, *P;
        int t, bh;
        if (tfm__attn_scratch(&buf, &failed)) {
            P = tfm__align64(buf);
            TFM__OMP(omp for schedule(static))
            for (t = 0; t < ntask; t++)
                for (bh = t * G; bh < t * G + G; bh++)
                    tfm__attn_bwd_head(a, bh, P, P + TFM__ATT_QB * TFM__ATT_KB, P + 2 * TFM__ATT_QB * TFM__ATT_KB,
                                       P + 2 * TFM__ATT_QB * TFM__ATT_KB + TFM__ATT_QB, dq, lddq, dk, lddk, dv, lddv,
                                       dout, lddo);
        }
        tfm__scratch_done(buf);
    }
    if (failed) tfm__scratch_failed = 1;
    return !failed;
}

/* The products' precision (a tfm_precision) of the model call running on this thread: that model's
   cfg.precision for the call's length (tfm__prec_enter, tfm__prec_done); 0 outside model calls, where
   tfm_cuda_set_tf32 decides. Only the GPU's products read it. */
static TFM__THREAD_LOCAL int tfm__model_prec;
static int tfm__prec_enter(const tfm_model *m) {
    int prev = tfm__model_prec;
    if (m && m->impl) tfm__model_prec = (int)m->cfg.precision;
    return prev;
}
static tfm_result tfm__prec_done(int prev, tfm_result r) {
    tfm__model_prec = prev;
    return r;
}

/* bf16 activations: in a bf16 model call on the GPU, the activations that only products read (a pre-LN
   block's normalized inputs, ln_io, the MLP's hidden layer, ff_act, and its gradient, d_ff1 (SwiGLU's only
   without a bias), and an LM head's logit gradients) are stored in bf16 by the kernel that computes them
   (the layernorm's, the bias and activation's, the bias gradient's column sums, which run the activation's
   backward, SwiGLU's backward, the cross-entropy's backward), as rows of tfm__bf16_ld(cols) elements in the
   same float buffers, and the products take them as their operands as they are. Each product used to round
   an fp32 copy first: the same bits (one rounding to nearest even of the same value), at under a third of
   the bytes (a bf16 write and reads, where an fp32 write, a rounding pass a product and the reads were).
   The bf16 rows must fit in the float buffer (cols >= 4). A self-attention layer's q|k|v likewise, where
   the flash kernels read them (which round them as they load them) and no rotation follows (tfm_mha.qbf:
   their product writes them in bf16 through cuBLASLt). And the MLP's pre-activations, which a bf16 model
   rounds to bf16 (tfm__linear_act_cuda), where their product writes them so (blk->bf_pre): its activation's
   kernels read them as they are; and the attention's output where the flash forward writes it (tfm_mha.obf),
   which the output projection reads and the backward's D = rowsum(dout * out) takes rounded (tfm__k_attn_dr,
   in every bf16 model call); the attention's output gradient, which the flash backward reads and D takes
   rounded (tfm__attn_args.dout_bf); the MLP's hidden-layer output gradient, which only the activation's
   backward reads (tfm__block_sub_bwd's dybf); the gradients of self-attention's q|k|v, which the flash
   backward writes for the in-projection's products (tfm__attn_args.d_bf); a sub-layer's output, which its
   residual add reads (tfm__block_fwd's vbf); and a training step's logits, which its loss reads
   (tfm__model_forward's logits_bf). tfm__bf16_acts_off: the rounding before each product instead (and in a
   linear map's backward, of its output gradient once a product; the pre-activations, attention output,
   hidden-layer output and q|k|v gradients, sub-layer outputs and logits rounded in fp32), for this thread:
   the tests compare. */
static TFM__THREAD_LOCAL int tfm__bf16_acts_off;
static int64_t tfm__bf16_ld(int64_t cols) { return (cols + 7) & ~(int64_t)7; }

/* bf16 weights in generation: each product of a bf16 model call rounds its fp32 operands to bf16 first,
   so a decoding step would round every weight once a token (6 bytes a parameter moved besides the
   product's 2). A generation call of a bf16 model on the GPU (tfm__gen_enter) rounds the parameters
   once at its start into the thread's device space, and its products take the weights from there as
   they are (tfm__bf16_w_of): the same bits, one rounding to nearest even of the same values. The twin
   holds the n floats from lo, as bf16 at bf; bf NULL: none (outside such a call, inside a nested one,
   with tfm__bf16_acts_off, or when the space cannot be had). A weight changed during the call (from an
   on_token callback) is not seen by its products. */
typedef struct tfm__bf16_twin { const float *lo; int64_t n; const uint16_t *bf; } tfm__bf16_twin;
static TFM__THREAD_LOCAL tfm__bf16_twin tfm__bf16_w;
/* whether a bf16 model call's activation of cols a row may be kept in bf16 (tfm__bf16_fits: the rows fit in
   the float buffer) */
static int tfm__bf16_fits(tfm_device dev, int64_t cols) {
    return dev == TFM_DEVICE_CUDA && tfm__model_prec == TFM_PREC_BF16 && tfm__bf16_ld(cols) <= 2 * cols;
}
static int tfm__bf16_store(tfm_device dev, int64_t cols) {
    return tfm__bf16_fits(dev, cols) && !tfm__bf16_acts_off;
}

/* ==== >>impl-cuda ====
   The same ops as >>impl-cpu, as CUDA kernels, with cuBLAS for the products (cuBLASLt for a linear map's
   with a bias, which its epilogue adds: tfm__gemm_bias_lt); the dispatch entries below
   call the tfm__<op>_cuda launchers. Everything runs on CUDA's legacy default stream, so kernels, copies
   and cuBLAS calls run in the order they are issued and a host read of a result (cudaMemcpy to the host)
   waits for what came before; a decoding step is captured on a stream of the thread's own (queued, not
   run) and then runs on the legacy stream as one CUDA graph (tfm__cuda_capture_begin). Floats live in
   device memory; the integer arrays the ops take (ids, targets, lengths, cache slots) and additive masks
   stay on the host and are copied into the calling thread's device work space when an op needs them (the
   stream order keeps a later op from overwriting them before the kernel that reads them has run); the
   small ones a decoding step stages alike for every layer are kept on the device by their bytes and cross
   once a step. One block per row for row-wise ops, grid-stride loops for element-wise ones (an MLP's bias
   and activation fused after its product, a residual add with the layernorm after it), one launch per 256
   parameters for AdamW and the gradient norm; attention in shared-memory tiles of 16 rows against running
   tiles of 32 for heads of up to 128 channels, else as batched cuBLAS products over chunks of scores kept
   in device memory; in a bf16 model's calls (cfg.precision) the products take bf16 operands on tensor
   cores, the attention's too (flash attention in register-level tensor-core products, mma.sync, for heads
   of up to 128 channels, else the batched products); sums in a fixed order (no atomics), so results are deterministic. Errors:
   the first failing CUDA or cuBLAS call of a public call is kept (tfm__cu.err) and reported by that call's
   tfm__scratch_check as TFM_E_CUDA. */

#if defined(TFM_CUDA)

#define TFM__CU_KEEP 8
#define TFM__CU_KEEP_BYTES 4096
#define TFM__CU_STEP_BYTES ((size_t)64 << 10) /* a recorded step's staged arrays: the space made at first */
#define TFM__CU_STEP_MAX ((size_t)16 << 20)   /* ... and the most it grows to */
#define TFM__CU_STEP_PUTS 16
/* The kinds of step that run as CUDA graphs ("a step as one CUDA graph"), each in slots of its own (a
   graph, its record and its backing off): one for decoding steps, TFM__CU_MODEL_GRAPHS for training steps
   and as many for forward passes, one a model (tfm__cuda_slot) */
#define TFM__CU_MODEL_GRAPHS 4
#define TFM__CU_GRAPH_DECODE 0
#define TFM__CU_GRAPH_TRAIN 1
#define TFM__CU_GRAPH_FORWARD (TFM__CU_GRAPH_TRAIN + TFM__CU_MODEL_GRAPHS)
#define TFM__CU_GRAPHS (TFM__CU_GRAPH_FORWARD + TFM__CU_MODEL_GRAPHS)
/* The algorithm cuBLASLt's heuristic picked for a product with a bias (tfm__gemm_bias_lt): its shapes,
   strides and pointers' alignments (key), and whether there was one (ok) */
#define TFM__CU_LT_PICKS 32
typedef struct tfm__cu_lt_pick { int key[15]; int ok; cublasLtMatmulAlgo_t algo; } tfm__cu_lt_pick;
/* What a thread keeps for its CUDA work: its cuBLAS handle, its device work space and the first error. */
typedef struct tfm__cuda_ctx {
    cublasHandle_t blas;
    int has_blas, tf32, blas_tf32;
    cublasLtHandle_t lt;  /* cuBLASLt, for the products whose epilogue adds a bias */
    int has_lt, lt_off;   /* made; could not be made (those products add the bias as before) */
    tfm__cu_lt_pick lt_pick[TFM__CU_LT_PICKS];
    int lt_next;          /* the pick replaced next */
    void *bf;           /* device space for a bf16 product's operands (tfm__gemm_cuda) */
    size_t bf_size;     /* its bytes */
    void *wbf;          /* device space for a generation call's bf16 weights (tfm__bf16_w) */
    size_t wbf_size;    /* its bytes */
    void *kv;           /* device space for a generation call's cache (tfm__cuda_kv_space) */
    size_t kv_size;     /* its bytes */
    int kv_busy;        /* a call's cache is in it */
    void *ws;           /* device work space: staged host arrays, partial sums */
    size_t ws_size;     /* its bytes */
    float *host;        /* pinned host buffer for results read back (the rows' losses) */
    size_t host_size;
    double *pin;        /* pinned: the squared gradient norm a captured training step reads back */
    unsigned char *stage; /* pinned ring the host arrays (ids, lengths, masks) pass through on their way to
                             the device, so that their copies do not wait for the GPU */
    size_t stage_off;
    unsigned char *kept;  /* device: small host arrays kept as staged (tfm__cuda_put), TFM__CU_KEEP of them */
    size_t kept_size;
    size_t kept_n[TFM__CU_KEEP]; /* the bytes each holds (0: none) */
    uint64_t kept_use[TFM__CU_KEEP], kept_clock; /* when each was last asked for */
    unsigned char kept_host[TFM__CU_KEEP][TFM__CU_KEEP_BYTES]; /* what each holds */
    cudaStream_t stream;  /* where the work goes: 0 (the legacy stream), or cap while a step is captured */
    cudaStream_t cap;     /* a non-blocking stream that steps are captured on (tfm__cuda_capture_begin) */
    cudaGraphExec_t graph[TFM__CU_GRAPHS]; /* the last captured step's executable graph in each slot
                                              (TFM__CU_GRAPH_*), updated to each new one */
    const void *slot_owner[TFM__CU_GRAPHS]; /* the model whose steps a slot holds (NULL: none yet) */
    unsigned long long slot_use[TFM__CU_GRAPHS], slot_clock; /* when each was last taken */
    void *blas_ws;        /* device work space for cuBLAS while capturing */
    int capturing, cap_failed, graphs_off, graph_fails[TFM__CU_GRAPHS], graph_skip[TFM__CU_GRAPHS],
        dry_fails[TFM__CU_GRAPHS], dry_skip[TFM__CU_GRAPHS];
    int cap_grow;         /* the capture failed (or would) because a space must grow: not a failure of its own */
    int grow_fails[TFM__CU_GRAPHS]; /* captures in a slot in a row that failed so */
    /* a step's operations, recorded so that the next step of its kind replays its graph without a capture
       when its operations are the same ("a step as one CUDA graph" below) */
    int recording;        /* 1 while a step's operations are recorded (its capture, or its dry run) */
    int kind;             /* ... and the step's slot (TFM__CU_GRAPH_DECODE, tfm__cuda_slot) */
    int dry;              /* 1 in a dry run: operations are checked against rec[1 + kind], not queued */
    unsigned char *rec[1 + TFM__CU_GRAPHS]; /* [0] the record being made, [1 + kind] the graph of that slot's
                                               (rec_n 0: none) */
    size_t rec_n[1 + TFM__CU_GRAPHS], rec_cap[1 + TFM__CU_GRAPHS];
    size_t rec_at;        /* how much of the graph's record a dry run has matched */
    int rec_bad;          /* a dry run's operation differed, or the record could not grow */
    unsigned char *step_host; /* pinned: the host arrays a recorded step stages, at the same places every step */
    unsigned char *step_dev;  /* device: their copies, in the same places */
    size_t step_size;     /* the bytes of each (TFM__CU_STEP_BYTES at first, up to TFM__CU_STEP_MAX) */
    size_t step_need;     /* the most a step has asked for (the next capture's staging grows to it) */
    size_t step_off;      /* bytes of both used by the step so far */
    size_t step_puts[TFM__CU_STEP_PUTS][2]; /* the step's staged arrays (offset, bytes) and where they came from: */
    const void *step_src[TFM__CU_STEP_PUTS]; /* the same bytes from the same place again are the same copy */
    int n_step_puts;
    cudaEvent_t step_done; /* recorded after each graph: its copies out of step_host are done */
    unsigned long long replays; /* steps run by replaying their graph */
    int failed;
    char err[320];
} tfm__cuda_ctx;
static TFM__THREAD_LOCAL tfm__cuda_ctx tfm__cu;

/* 1 outside a capture; inside one 0, and the capture is marked failed: nothing may allocate or wait
   while a step is captured, and a failure there is not reported (the step runs again without capture,
   which reports a real error). */
static int tfm__cuda_uncaptured(void) {
    if (!tfm__cu.capturing) return 1;
    tfm__cu.cap_failed = 1;
    return 0;
}
/* The same for a space that must grow: the step, run again without capture, grows it, so the next
   capture need not back off (tfm__cuda_capture_end). */
static int tfm__cuda_uncaptured_grow(void) {
    if (!tfm__cu.capturing) return 1;
    tfm__cu.cap_grow = 1;
    return 0;
}

/* Record the first failure (what: the call) and say whether e was a success. */
static int tfm__cuda_ok(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 1;
    if (!tfm__cuda_uncaptured()) return 0;
    if (!tfm__cu.failed) {
        tfm__cu.failed = 1;
        snprintf(tfm__cu.err, sizeof tfm__cu.err, "%s failed: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    }
    return 0;
}
static int tfm__cublas_ok(cublasStatus_t st, const char *what) {
    if (st == CUBLAS_STATUS_SUCCESS) return 1;
    if (!tfm__cuda_uncaptured()) return 0;
    if (!tfm__cu.failed) {
        tfm__cu.failed = 1;
        snprintf(tfm__cu.err, sizeof tfm__cu.err, "%s failed: %s (%s)", what, cublasGetStatusString(st),
                 cublasGetStatusName(st));
    }
    return 0;
}
/* After a kernel launch: a bad configuration or a failure before it shows here. */
#define TFM__CU_LAUNCHED(name) (void)tfm__cuda_ok(cudaGetLastError(), "kernel " name)

static tfm_result tfm__cuda_check(const char *fn) {
    if (!tfm__cu.failed) return TFM_OK;
    tfm__cu.failed = 0;
    return tfm__fail(TFM_E_CUDA, "%s: %s", fn, tfm__cu.err);
}

/* A failed allocation or device query as a result: TFM_E_NOMEM for out of memory, TFM_E_NO_CUDA when
   there is no device or driver, TFM_E_CUDA else. The runtime's last error is cleared. */
static tfm_result tfm__cuda_result(const char *fn, cudaError_t e, const char *what) {
    (void)cudaGetLastError();
    if (e == cudaErrorMemoryAllocation) return tfm__fail(TFM_E_NOMEM, "%s: %s: out of device memory", fn, what);
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver)
        return tfm__fail(TFM_E_NO_CUDA, "%s: %s: %s (no usable CUDA device)", fn, what, cudaGetErrorString(e));
    return tfm__fail(TFM_E_CUDA, "%s: %s failed: %s (%s)", fn, what, cudaGetErrorString(e), cudaGetErrorName(e));
}

static tfm_result tfm__dev_alloc(const char *fn, void **p, size_t bytes) {
    cudaError_t e;
    *p = NULL;
    e = cudaMalloc(p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *p = NULL;
        return tfm__cuda_result(fn, e, "cudaMalloc");
    }
    return TFM_OK;
}
static void tfm__dev_free(void *p) {
    if (p) (void)cudaFree(p);
}

/* *buf (of *size bytes) made `bytes` when short, the old one freed first: cudaFree waits for the work
   queued on it. Not while capturing (tfm__cuda_grow checks). */
static cudaError_t tfm__cuda_regrow(void **buf, size_t *size, size_t bytes) {
    void *p = NULL;
    cudaError_t e;
    if (*size >= bytes) return cudaSuccess;
    if (*buf) {
        (void)cudaDeviceSynchronize(); /* the work queued on the old one is done */
        (void)cudaFree(*buf);
    }
    *buf = NULL;
    *size = 0;
    if ((e = cudaMalloc(&p, bytes)) != cudaSuccess) return e;
    *buf = p;
    *size = bytes;
    return cudaSuccess;
}

/* The thread's device space of `bytes` for a generation call's cache in *p, kept from call to call (grown
   when short), so that a call neither allocates nor frees it, and the graph of its first decoding step
   finds the cache where the last call's step had it; *p NULL (nothing taken) while a call's cache holds
   it (a call from an on_token callback makes its own). tfm__cuda_kv_done gives it back. */
static tfm_result tfm__cuda_kv_space(const char *fn, void **p, size_t bytes) {
    tfm__cuda_ctx *c = &tfm__cu;
    cudaError_t e;
    *p = NULL;
    if (c->kv_busy) return TFM_OK;
    if ((e = tfm__cuda_regrow(&c->kv, &c->kv_size, bytes)) != cudaSuccess)
        return tfm__cuda_result(fn, e, "cudaMalloc (generation cache)");
    c->kv_busy = 1;
    *p = c->kv;
    return TFM_OK;
}
static void tfm__cuda_kv_done(void) { tfm__cu.kv_busy = 0; }

/* Everything the thread keeps for CUDA, but what a generation call running on it holds (a release from
   its on_token callback): its cache's space and its bf16 weights, which stay. */
static void tfm__cuda_release(void) {
    int i;
    void *kv = tfm__cu.kv_busy ? tfm__cu.kv : NULL, *wbf = tfm__bf16_w.bf ? tfm__cu.wbf : NULL;
    size_t kv_size = tfm__cu.kv_size, wbf_size = tfm__cu.wbf_size;
    if (tfm__cu.has_blas) cublasDestroy(tfm__cu.blas);
    if (tfm__cu.has_lt) cublasLtDestroy(tfm__cu.lt);
    if (tfm__cu.ws) cudaFree(tfm__cu.ws);
    if (tfm__cu.bf) cudaFree(tfm__cu.bf);
    if (tfm__cu.wbf && !wbf) cudaFree(tfm__cu.wbf);
    if (tfm__cu.kv && !kv) cudaFree(tfm__cu.kv);
    if (tfm__cu.host) cudaFreeHost(tfm__cu.host);
    if (tfm__cu.stage) cudaFreeHost(tfm__cu.stage);
    if (tfm__cu.kept) cudaFree(tfm__cu.kept);
    if (tfm__cu.pin) cudaFreeHost(tfm__cu.pin);
    for (i = 0; i < TFM__CU_GRAPHS; i++)
        if (tfm__cu.graph[i]) cudaGraphExecDestroy(tfm__cu.graph[i]);
    if (tfm__cu.cap) cudaStreamDestroy(tfm__cu.cap);
    if (tfm__cu.blas_ws) cudaFree(tfm__cu.blas_ws);
    if (tfm__cu.step_host) cudaFreeHost(tfm__cu.step_host);
    if (tfm__cu.step_dev) cudaFree(tfm__cu.step_dev);
    if (tfm__cu.step_done) cudaEventDestroy(tfm__cu.step_done);
    for (i = 0; i <= TFM__CU_GRAPHS; i++) TFM_FREE(tfm__cu.rec[i], NULL);
    memset(&tfm__cu, 0, sizeof tfm__cu);
    tfm__cu.kv = kv, tfm__cu.kv_size = kv ? kv_size : 0, tfm__cu.kv_busy = kv != NULL;
    tfm__cu.wbf = wbf, tfm__cu.wbf_size = wbf ? wbf_size : 0;
}

/* The thread's cuBLAS handle, with TF32 tensor cores for its fp32 products or not (NULL when it cannot be
   made: error kept). */
static cublasHandle_t tfm__cuda_blas(int tf32) {
    if (!tfm__cu.has_blas) {
        if (!tfm__cuda_uncaptured() || !tfm__cublas_ok(cublasCreate(&tfm__cu.blas), "cublasCreate")) return NULL;
        tfm__cu.has_blas = 1;
        tfm__cu.blas_tf32 = -1;
    }
    if (tfm__cu.blas_tf32 != tf32) {
        if (!tfm__cublas_ok(cublasSetMathMode(tfm__cu.blas, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
                            "cublasSetMathMode"))
            return NULL;
        tfm__cu.blas_tf32 = tf32;
    }
    return tfm__cu.blas;
}
/* The thread's cuBLASLt handle; NULL when it cannot be made (not an error: tfm__gemm_bias_lt's products
   take cuBLAS instead). Made outside a capture only (tfm__cuda_capture_begin makes it first). */
static cublasLtHandle_t tfm__cuda_lt(void) {
    if (!tfm__cu.has_lt && !tfm__cu.lt_off && !tfm__cu.capturing) {
        if (cublasLtCreate(&tfm__cu.lt) == CUBLAS_STATUS_SUCCESS)
            tfm__cu.has_lt = 1;
        else
            tfm__cu.lt_off = 1;
    }
    return tfm__cu.has_lt ? tfm__cu.lt : NULL;
}

/* *buf (of *size bytes), grown to `bytes` when short: cudaFree waits for the work queued on the old one.
   NULL when it cannot be had (error kept, naming `what`). */
static void *tfm__cuda_grow(void **buf, size_t *size, size_t bytes, const char *what) {
    if (*size < bytes && (!tfm__cuda_uncaptured_grow() || !tfm__cuda_ok(tfm__cuda_regrow(buf, size, bytes), what)))
        return NULL;
    return *buf;
}

/* The thread's device work space, at least `bytes` (and 1 MiB); NULL when it cannot be had. */
static unsigned char *tfm__cuda_ws(size_t bytes) {
    return (unsigned char *)tfm__cuda_grow(&tfm__cu.ws, &tfm__cu.ws_size, TFM__MAX(bytes, (size_t)1 << 20),
                                           "cudaMalloc (work space)");
}

/* The thread's device space for n bf16 operand elements; NULL when it cannot be had. */
static uint16_t *tfm__cuda_bf(size_t n) {
    return (uint16_t *)tfm__cuda_grow(&tfm__cu.bf, &tfm__cu.bf_size, n * sizeof(uint16_t), "cudaMalloc (bf16 operands)");
}

/* The thread's pinned host buffer of at least n floats (grown when short); NULL when it cannot be had. */
static float *tfm__cuda_host(size_t n) {
    if (tfm__cu.host_size < n) {
        void *p = NULL;
        if (!tfm__cuda_uncaptured_grow()) return NULL;
        if (tfm__cu.host) cudaFreeHost(tfm__cu.host);
        tfm__cu.host = NULL;
        tfm__cu.host_size = 0;
        if (!tfm__cuda_ok(cudaMallocHost(&p, n * sizeof(float)), "cudaMallocHost")) return NULL;
        tfm__cu.host = (float *)p;
        tfm__cu.host_size = n;
    }
    return tfm__cu.host;
}

#define TFM__CU_ROUND(n) (((size_t)(n) + 255) & ~(size_t)255)
#define TFM__CU_STAGE ((size_t)4 << 20)

/* n bytes (at most a quarter of the ring) of the thread's pinned staging ring, allocated at the first
   use; NULL when it cannot be had (error kept). A copy from pageable memory waits for all the GPU's
   queued work before it starts; one from the ring does not, so the host runs ahead of the GPU. When
   the ring is used up, the host waits for the GPU once (every copy out of the ring is then done) and
   starts over at its beginning. A recorded step stages in step_host instead, from its start each
   step; past its step_size the step's capture fails, and the next capture's staging grows to what it
   asked for (tfm__cuda_step_ready). */
static unsigned char *tfm__cuda_stage(size_t n) {
    unsigned char *p;
    n = TFM__CU_ROUND(n);
    if (tfm__cu.recording) { /* a recorded step: its own buffer, from its start every step */
        if (tfm__cu.step_off + n > tfm__cu.step_size) {
            tfm__cu.step_need = TFM__MAX(tfm__cu.step_need, tfm__cu.step_off + n);
            if (tfm__cu.step_need > TFM__CU_STEP_MAX) tfm__cu.cap_failed = 1; /* (it cannot grow so far) */
            else tfm__cu.cap_grow = 1;
            return NULL;
        }
        p = tfm__cu.step_host + tfm__cu.step_off;
        tfm__cu.step_off += n;
        return p;
    }
    if ((!tfm__cu.stage || tfm__cu.stage_off + n > TFM__CU_STAGE) && !tfm__cuda_uncaptured()) return NULL;
    if (!tfm__cu.stage) {
        void *q = NULL;
        if (!tfm__cuda_ok(cudaMallocHost(&q, TFM__CU_STAGE), "cudaMallocHost (staging)")) return NULL;
        tfm__cu.stage = (unsigned char *)q;
        tfm__cu.stage_off = 0;
    }
    if (tfm__cu.stage_off + n > TFM__CU_STAGE) {
        if (!tfm__cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize (staging)")) return NULL;
        tfm__cu.stage_off = 0;
    }
    p = tfm__cu.stage + tfm__cu.stage_off;
    tfm__cu.stage_off += n;
    return p;
}

/* The device space of the kept arrays and, after them, the squared gradient norm (tfm__cu_sumsq),
   allocated at the first use; NULL when it cannot be had (error kept). */
static void *tfm__cuda_kept_space(void) {
    return tfm__cuda_grow((void **)&tfm__cu.kept, &tfm__cu.kept_size, (size_t)TFM__CU_KEEP * TFM__CU_KEEP_BYTES + 256,
                          "cudaMalloc (kept arrays)");
}

/* The device copy of n <= TFM__CU_KEEP_BYTES bytes at src among the kept ones: one that holds the same
   bytes, else the one asked for least recently takes them (a copy through the ring). Reuse is safe on the
   one stream: no kernel writes into a staged array, and a copy over a kept one runs after every kernel
   queued before it; a pointer handed out stays valid until TFM__CU_KEEP others have been asked for. NULL
   when the kept space cannot be had (error kept). */
static void *tfm__cuda_kept(const void *src, size_t n) {
    unsigned char *d, *st;
    int i, k = 0;
    if (!tfm__cuda_kept_space()) return NULL;
    for (i = 0; i < TFM__CU_KEEP; i++) {
        if (tfm__cu.kept_n[i] == n && !memcmp(tfm__cu.kept_host[i], src, n)) {
            tfm__cu.kept_use[i] = ++tfm__cu.kept_clock;
            return tfm__cu.kept + (size_t)i * TFM__CU_KEEP_BYTES;
        }
        if (tfm__cu.kept_use[i] < tfm__cu.kept_use[k]) k = i;
    }
    d = tfm__cu.kept + (size_t)k * TFM__CU_KEEP_BYTES;
    tfm__cu.kept_n[k] = 0; /* nothing, until its copy is queued */
    tfm__cu.kept_use[k] = ++tfm__cu.kept_clock;
    if (!(st = tfm__cuda_stage(n))) return d;
    memcpy(st, src, n);
    if (tfm__cuda_ok(cudaMemcpyAsync(d, st, n, cudaMemcpyHostToDevice, tfm__cu.stream), "cudaMemcpyAsync (host to device)")) {
        memcpy(tfm__cu.kept_host[k], src, n);
        tfm__cu.kept_n[k] = n;
    }
    return d;
}

/* -- a step's record (see "a step as one CUDA graph" below) -- */

/* n bytes at p that describe an operation of a recorded step: appended to rec[0] (the step is captured),
   or checked against its graph's record where the dry run has got to. */
static void tfm__cu_note_bytes(const void *p, size_t n) {
    tfm__cuda_ctx *c = &tfm__cu;
    if (c->dry) {
        const unsigned char *g = c->rec[1 + c->kind];
        if (!c->rec_bad && (c->rec_at + n > c->rec_n[1 + c->kind] || memcmp(g + c->rec_at, p, n))) c->rec_bad = 1;
        c->rec_at += n;
        return;
    }
    if (c->rec_n[0] + n > c->rec_cap[0]) {
        size_t cap = TFM__MAX(2 * c->rec_cap[0], c->rec_n[0] + n + 4096);
        unsigned char *q = (unsigned char *)TFM_MALLOC(cap, NULL);
        if (!q) {
            c->rec_bad = 1;
            return;
        }
        if (c->rec_n[0]) memcpy(q, c->rec[0], c->rec_n[0]);
        TFM_FREE(c->rec[0], NULL);
        c->rec[0] = q;
        c->rec_cap[0] = cap;
    }
    memcpy(c->rec[0] + c->rec_n[0], p, n);
    c->rec_n[0] += n;
}

/* Every operation a step queues passes here first (the launch macro, the products, the copies): what
   (the call's name, a string constant) and the arguments it is queued with. While a step is
   recorded they are noted by their bytes; returns whether the operation is to be queued (not in a dry
   run). The arguments' bytes include any padding of a struct, which the callers clear. */
static inline void tfm__cu_note_args(void) {}
template <typename A, typename... R> static inline void tfm__cu_note_args(const A &a, const R &...r) {
    tfm__cu_note_bytes(&a, sizeof a);
    tfm__cu_note_args(r...);
}
template <typename... A> static inline int tfm__cu_op(const char *what, const A &...a) {
    if (tfm__cu.recording) {
        tfm__cu_note_bytes(&what, sizeof what);
        tfm__cu_note_args(a...);
    }
    return !tfm__cu.dry;
}

/* n bytes of host memory src staged for a recorded step: its copy in step_dev, at the offset its
   bytes take in step_host (tfm__cuda_stage), so that a step that stages the same sizes in the same order
   queues the same copies. Bytes the step has staged already from the same place are that copy (the
   lengths, slots and positions each layer stages again); not those of another array that happen to be
   equal (an id and a position), which would make the steps' copies differ by chance. */
static void *tfm__cuda_step_put(const void *src, size_t n) {
    tfm__cuda_ctx *c = &tfm__cu;
    unsigned char *st;
    size_t o;
    int i;
    for (i = 0; i < c->n_step_puts; i++)
        if (c->step_src[i] == src && c->step_puts[i][1] == n && !memcmp(c->step_host + c->step_puts[i][0], src, n))
            return c->step_dev + c->step_puts[i][0];
    if (!(st = tfm__cuda_stage(n))) return c->step_dev; /* (the capture has failed: nothing runs) */
    o = (size_t)(st - c->step_host);
    memcpy(st, src, n);
    if (c->n_step_puts < TFM__CU_STEP_PUTS) {
        c->step_src[c->n_step_puts] = src;
        c->step_puts[c->n_step_puts][0] = o;
        c->step_puts[c->n_step_puts++][1] = n;
    }
    if (tfm__cu_op("cudaMemcpyAsync (step)", c->step_dev + o, st, n))
        (void)tfm__cuda_ok(cudaMemcpyAsync(c->step_dev + o, st, n, cudaMemcpyHostToDevice, c->stream),
                           "cudaMemcpyAsync (host to device)");
    return c->step_dev + o;
}

/* A kernel argument of n bytes at v that changes from step to step (a dropout seed, the loss's factor):
   while a step is recorded, its staged copy, which the kernel reads in its place so that the step's
   graph replays with the next step's value; else NULL (the kernel takes the argument). */
static const void *tfm__cuda_step_scalar(const void *v, size_t n) {
    return tfm__cu.recording ? tfm__cuda_step_put(v, n) : NULL;
}

/* n bytes from host memory src into the work space at *off (advanced by n rounded up to 256): the device
   copy, or NULL when src is NULL. Up to a quarter of TFM__CU_STAGE the bytes go through the pinned ring
   (tfm__cuda_stage: the host does not wait), larger arrays (a big attention mask) straight from src; in
   a recorded step, through its own staging instead (tfm__cuda_step_put). A launcher checks
   tfm__cu.failed after its copies: a kernel never runs on ids or lengths that did not arrive (stale ones
   could index out of bounds). */
static void *tfm__cuda_put(unsigned char *ws, size_t *off, const void *src, size_t n) {
    unsigned char *d = ws + *off, *st = NULL;
    if (!src) return NULL;
    *off += (n + 255) & ~(size_t)255;
    if (!n) return d;
    if (tfm__cu.recording) return tfm__cuda_step_put(src, n);
    if (n <= TFM__CU_STAGE / 4) {
        if (!(st = tfm__cuda_stage(n))) return d;
        memcpy(st, src, n);
    }
    (void)tfm__cuda_ok(cudaMemcpyAsync(d, st ? st : src, n, cudaMemcpyHostToDevice, tfm__cu.stream), "cudaMemcpyAsync (host to device)");
    return d;
}

/* tfm__cuda_put of an array that a decoding step stages alike for every layer (lengths, cache slots and
   rows, positions): a small one is kept on the device (tfm__cuda_kept), so that it crosses once a step.
   A launcher puts at most 3 such arrays, all before its launches, so none is replaced while it runs. */
static void *tfm__cuda_put_kept(unsigned char *ws, size_t *off, const void *src, size_t n) {
    unsigned char *d = ws + *off;
    void *k;
    if (!src || !n || n > TFM__CU_KEEP_BYTES || tfm__cu.recording) return tfm__cuda_put(ws, off, src, n);
    *off += (n + 255) & ~(size_t)255;
    k = tfm__cuda_kept(src, n);
    return k ? k : d;
}

/* n bytes between any two places (cudaMemcpyDefault: the runtime knows which pointer is where) */
static void tfm__cuda_copy(void *dst, const void *src, size_t n) {
    if (n && dst != src) (void)tfm__cuda_ok(cudaMemcpy(dst, src, n, cudaMemcpyDefault), "cudaMemcpy");
}

/* -- a step as one CUDA graph: a decoding step, a training step (tfm_model_train_step), a forward pass --
   A decoding step queues about 9 kernels and copies a layer besides 4 cuBLAS products, each a few
   microseconds of GPU work at batch 1, so launching them one by one costs more than running them; a training
   step or a forward pass of a small model likewise. Instead the step's work is captured (queued on the
   thread's own non-blocking stream while it captures: kept, not run), and the graph runs in one launch on the
   legacy stream, in order with everything else. The thread's executable graph of that kind (for training
   steps and forward passes, of that model: tfm__cuda_slot) is updated to each new capture
   (cudaGraphExecUpdate: the same operations with new arguments, as a new batch comes) and made anew when the
   operations differ. Nothing may allocate or wait while capturing: a step that would (a work space too small,
   the staging ring used up, a result read back) fails its capture, nothing of it has run, and the caller runs
   it again as usual (tfm__decode_step, tfm__model_graph). After a failure the next 2, 4, ... 64 steps of that
   kind (and model) run without capture; not after one that only needed a space to grow (the step run again
   grows it) when the capture before did not fail so. A step's graph is replayed by the next step of its kind
   (and model) when that would queue the same operations with the same arguments: the step's host arrays are
   staged at the same places every step (step_host, copied by the graph to step_dev: tfm__cuda_step_put), and
   nothing else a step passes changes from step to step. For decoding that is the rule once a call's first
   step is captured (nothing grows with the cache's lengths); for training steps and forward passes, a new
   batch of the same shapes (its ids, targets and lengths are staged), a new learning rate (AdamW reads its
   step's scalars from its staged jobs) and new dropout masks (their seeds are staged too) replay. Each
   operation of a captured step is noted (tfm__cu_op: its name and arguments' bytes); the next step first runs
   dry, inside an empty capture, checking its operations against that record instead of queuing them, and
   launches the graph again when all of it matched and nothing was captured; else it is captured. After two
   training steps (or forward passes) in a row whose dry runs did not match (batches whose shapes keep
   changing), the next 2, 4, ... 64 are captured without one. A decoding call's first step matches the last
   call's last one when the calls have the same shapes: its cache is in the thread's kept space
   (tfm__cuda_kv_space) and the kernels see only staged copies of the call's host arrays (tfm__cu_attn_stage). */
#define TFM__CU_BLAS_WS ((size_t)32 << 20) /* what cuBLAS asks for on Hopper */

/* A recorded step's staging (step_host, step_dev: step_size bytes each, grown to the step_need of a step
   that ran out, by doubling, up to TFM__CU_STEP_MAX) and the event after each graph, made at the first
   use; 0 when they cannot be had. Staging that cannot grow stays as it is (a step that needs more fails
   its captures, and backs off). The step is to write step_host, which the last graph copied from: waits
   until it has run (mostly it has: the host read that step's logits or losses). */
static int tfm__cuda_step_ready(void) {
    tfm__cuda_ctx *c = &tfm__cu;
    void *p = NULL, *q = NULL;
    size_t want = c->step_size ? c->step_size : TFM__CU_STEP_BYTES;
    while (want < c->step_need && c->step_need <= TFM__CU_STEP_MAX) want *= 2; /* (powers of 2 up to the most) */
    if ((!c->step_done && cudaEventCreateWithFlags(&c->step_done, cudaEventDisableTiming) != cudaSuccess) ||
        cudaEventSynchronize(c->step_done) != cudaSuccess)
        return 0;
    if (want != c->step_size) {
        if (cudaMallocHost(&p, want) == cudaSuccess && cudaMalloc(&q, want) == cudaSuccess) {
            if (c->step_host) (void)cudaFreeHost(c->step_host);
            if (c->step_dev) (void)cudaFree(c->step_dev);
            c->step_host = (unsigned char *)p;
            c->step_dev = (unsigned char *)q;
            c->step_size = want;
        } else {
            if (p) (void)cudaFreeHost(p);
            (void)cudaGetLastError();
            c->step_need = c->step_size; /* (not tried again) */
        }
    }
    if (!c->step_size) return 0;
    c->step_off = 0;
    c->n_step_puts = 0;
    return 1;
}

/* The slot of `kind` (TFM__CU_GRAPH_TRAIN or _FORWARD) for the steps of that kind of the model `owner`:
   the one it has, else a free one, else the one taken least recently, its record forgotten and its
   backing off too (its executable graph is updated by the next capture, as any). So models that take
   turns (a generator and a discriminator, a teacher's forward and a student's) each replay their own
   graph, up to TFM__CU_MODEL_GRAPHS of them. With graphs off: the first (nothing taken). */
static int tfm__cuda_slot(int kind, const void *owner) {
    tfm__cuda_ctx *c = &tfm__cu;
    int i, s = -1;
    if (c->graphs_off) return kind;
    for (i = kind; i < kind + TFM__CU_MODEL_GRAPHS && s < 0; i++)
        if (c->slot_owner[i] == owner) s = i;
    if (s < 0) {
        s = kind;
        for (i = kind + 1; i < kind + TFM__CU_MODEL_GRAPHS; i++)
            if (c->slot_use[i] < c->slot_use[s]) s = i; /* (a free one's is 0) */
        c->slot_owner[s] = owner;
        c->rec_n[1 + s] = 0;
        c->graph_fails[s] = c->graph_skip[s] = c->dry_fails[s] = c->dry_skip[s] = c->grow_fails[s] = 0;
    }
    c->slot_use[s] = ++c->slot_clock;
    return s;
}

/* Begin capturing this thread's work for a step in slot `kind` (TFM__CU_GRAPH_DECODE, tfm__cuda_slot),
   its operations recorded; 0 (nothing begun) when graphs are off, backing off, or a part cannot be had.
   dry: the step's dry run, checked against the record of the slot's graph (0 when there is none, or the
   slot's dry runs back off). */
static int tfm__cuda_capture_begin(int kind, int dry) {
    tfm__cuda_ctx *c = &tfm__cu;
    int wrap = c->stage_off > TFM__CU_STAGE / 4 * 3; /* a step gets a quarter of the ring: start over first */
    if (c->graphs_off || c->failed) return 0;
    if (c->graph_skip[kind] > 0) {
        if (!dry) c->graph_skip[kind]--;
        return 0;
    }
    if (dry && (!c->graph[kind] || !c->rec_n[1 + kind])) return 0;
    if (dry && c->dry_skip[kind] > 0) {
        c->dry_skip[kind]--;
        return 0;
    }
    /* what the step might otherwise allocate while capturing: the stream, cuBLAS and its work space, the
       kept arrays, the pinned read-back, room in the staging ring, the step's own staging */
    if ((!c->cap && cudaStreamCreateWithFlags(&c->cap, cudaStreamNonBlocking) != cudaSuccess) ||
        (!c->blas_ws && cudaMalloc(&c->blas_ws, TFM__CU_BLAS_WS) != cudaSuccess) || !tfm__cuda_blas(c->tf32) ||
        (!c->pin && cudaMallocHost(&c->pin, 256) != cudaSuccess) || (tfm__cuda_lt(), 0) ||
        !tfm__cuda_kept_space() || !tfm__cuda_stage(wrap ? TFM__CU_STAGE / 4 : 0) || !tfm__cuda_step_ready() ||
        cublasSetStream(c->blas, c->cap) != CUBLAS_STATUS_SUCCESS ||
        cublasSetWorkspace(c->blas, c->blas_ws, TFM__CU_BLAS_WS) != CUBLAS_STATUS_SUCCESS ||
        cudaStreamBeginCapture(c->cap, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        (void)cudaGetLastError();
        if (c->has_blas) (void)cublasSetStream(c->blas, 0);
        c->graphs_off = 1; /* this thread's CUDA cannot capture: steps run as usual */
        return 0;
    }
    if (wrap) c->stage_off = 0; /* the wrap above waited for the GPU */
    c->stream = c->cap;
    c->capturing = 1;
    c->cap_failed = 0;
    c->cap_grow = 0;
    c->recording = 1;
    c->kind = kind;
    c->dry = dry;
    c->rec_bad = 0;
    c->rec_at = 0;
    if (!dry) c->rec_n[0] = 0;
    return 1;
}

/* Launch the graph of `kind`, followed by step_done */
static void tfm__cuda_graph_launch(int kind) {
    tfm__cuda_ctx *c = &tfm__cu;
    const char *what = kind == TFM__CU_GRAPH_DECODE ? "cudaGraphLaunch (a decoding step)"
                       : kind < TFM__CU_GRAPH_FORWARD ? "cudaGraphLaunch (a training step)"
                                                      : "cudaGraphLaunch (a forward pass)";
    (void)tfm__cuda_ok(cudaGraphLaunch(c->graph[kind], 0), what);
    (void)tfm__cuda_ok(cudaEventRecord(c->step_done, 0), "cudaEventRecord");
}

/* End the capture of a step of `kind` and launch its graph: 1 when the step's work has been queued, 0
   when none of it was (the kept arrays are then forgotten: their copies were captured, not run). A dry
   run's capture must be empty (every operation was checked, none queued) and its record all of the
   graph's: then that graph is launched again, with the step's arrays in step_host; else 0, and the step
   is captured. A capture that failed only because a space was too small (a work space, the step's
   staging: cap_grow) does not back off, the first time in a row: the step, run again without capture,
   grows it (the staging grows at the next capture), and the next capture has it. A dry run that failed
   so is no miss. */
static int tfm__cuda_capture_end(int kind) {
    tfm__cuda_ctx *c = &tfm__cu;
    cudaGraph_t g = NULL;
    cudaGraphExec_t *x = &c->graph[kind];
    cudaGraphExecUpdateResultInfo info;
    int ok = cudaStreamEndCapture(c->cap, &g) == cudaSuccess && g && !c->cap_failed, i, dry = c->dry;
    int grow = ok && c->cap_grow; /* failed only for a space to grow */
    ok = ok && !c->cap_grow;
    c->capturing = 0;
    c->recording = 0;
    c->dry = 0;
    c->stream = 0;
    (void)cublasSetStream(c->blas, 0); /* and cuBLAS's own work space again */
    if (dry) {
        size_t nodes = 1;
        ok = ok && !c->rec_bad && c->rec_at == c->rec_n[1 + kind] && cudaGraphGetNodes(g, NULL, &nodes) == cudaSuccess && !nodes;
        if (g) (void)cudaGraphDestroy(g);
        (void)cudaGetLastError();
        if (kind != TFM__CU_GRAPH_DECODE && !grow) { /* (a decoding call's first step misses when shapes change) */
            c->dry_fails[kind] = ok ? 0 : TFM__MIN(c->dry_fails[kind] + 1, 7);
            c->dry_skip[kind] = c->dry_fails[kind] >= 2 ? 1 << (c->dry_fails[kind] - 1) : 0;
        }
        if (!ok) return 0;
        c->replays++;
        tfm__cuda_graph_launch(kind);
        return 1;
    }
    if (ok && *x && cudaGraphExecUpdate(*x, g, &info) != cudaSuccess) {
        (void)cudaGetLastError(); /* not an error: the operations differ */
        (void)cudaGraphExecDestroy(*x);
        *x = NULL;
    }
    if (ok && !*x && cudaGraphInstantiate(x, g, 0) != cudaSuccess) *x = NULL;
    if (g) (void)cudaGraphDestroy(g);
    if (ok && *x) { /* queued: a failure now is the step's own, reported as any launch's */
        { /* the graph's record: rec[0] */
            unsigned char *r = c->rec[1 + kind];
            size_t cap = c->rec_cap[1 + kind];
            c->rec[1 + kind] = c->rec[0], c->rec_cap[1 + kind] = c->rec_cap[0], c->rec_n[1 + kind] = c->rec_bad ? 0 : c->rec_n[0];
            c->rec[0] = r, c->rec_cap[0] = cap, c->rec_n[0] = 0;
        }
        tfm__cuda_graph_launch(kind);
        c->graph_fails[kind] = 0;
        c->grow_fails[kind] = 0;
        return 1;
    }
    (void)cudaGetLastError();
    for (i = 0; i < TFM__CU_KEEP; i++) c->kept_n[i] = 0;
    if (grow && !c->grow_fails[kind]) { /* (the next capture has the space) */
        c->grow_fails[kind] = 1;
        return 0;
    }
    c->grow_fails[kind] = grow;
    c->graph_fails[kind] = TFM__MIN(c->graph_fails[kind] + 1, 6);
    c->graph_skip[kind] = 1 << c->graph_fails[kind];
    return 0;
}

/* -- kernels -- */

#define TFM__CU_THREADS 256
/* Blocks for a grid-stride loop over n items. */
static unsigned tfm__cu_grid(int64_t n) {
    int64_t g = (n + TFM__CU_THREADS - 1) / TFM__CU_THREADS;
    return (unsigned)(g < 1 ? 1 : g > 4096 ? 4096 : g);
}
/* Threads for one block per row of C: a multiple of 32 in [32, 512]. */
static unsigned tfm__cu_row_threads(int64_t C) {
    int64_t t = (C + 31) / 32 * 32;
    return (unsigned)(t < 32 ? 32 : t > 512 ? 512 : t);
}
#define TFM__CU_LOOP(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)
/* The memory-bound kernels' loops take TFM__CU_U items a thread at a time: i0 the first, the others
   tfm__cu_step() apart (TFM__CU_EACH), all loaded before any is worked on. With one load in flight a thread
   (the plain loop's: the next load waits behind the work on this one), 2048 threads an SM keep 4-8 KB in
   flight, where the memory's latency at full bandwidth needs some 29 KB (an H200: 4.8 TB/s x ~0.8 us over
   132 SMs): the cross-entropy over fp32 logits so ran at 0.6 TB/s (H200, 2026-11-27). 4, not more: at 8
   the items' addresses took up to 207 registers a thread (nvcc 13, sm_90a), so that few threads fit an SM,
   at 4 31-72 (the kernels whose activations inline three forms bounded to fit 3-4 blocks). TFM__CU_LOOP_U: n
   items, tfm__cu_grid_u(n) blocks of TFM__CU_THREADS. TFM__CU_ROWS: n rows of C items with no division an
   item (an item's row and column from a flat index cost a 64-bit division, some 20 instructions or more, a
   memory-bound kernel's whole budget), the grid's y stepping the rows, x the items of a row: tfm__cu_grid2
   blocks of tfm__cu_block2 threads (up to 4096 blocks, as tfm__cu_grid). */
#define TFM__CU_U 4
static __device__ int64_t tfm__cu_step(void) { return (int64_t)gridDim.x * blockDim.x; }
#define TFM__CU_LOOP_U(i0, n) \
    for (int64_t i0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i0 < (n); i0 += TFM__CU_U * tfm__cu_step())
#define TFM__CU_ROWS(r, n, j0, C)                          \
    for (int64_t r = blockIdx.y; r < (n); r += gridDim.y)  \
        for (int64_t j0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j0 < (C); j0 += TFM__CU_U * tfm__cu_step())
#define TFM__CU_EACH(u, i, i0) for (u = 0, i = (i0); u < TFM__CU_U; u++, i += tfm__cu_step())
static unsigned tfm__cu_grid_u(int64_t n) { return tfm__cu_grid((n + TFM__CU_U - 1) / TFM__CU_U); }
/* A TFM__CU_LOOP_U round's items of p (p NULL, or past n: 0) */
static __device__ void tfm__cu_load_u(float (&v)[TFM__CU_U], const float *p, int64_t i0, int64_t n) {
    int64_t i;
    int u;
    TFM__UNROLL
    TFM__CU_EACH(u, i, i0) v[u] = p && i < n ? p[i] : 0.0f;
}
static unsigned tfm__cu_block2(int64_t C) {
    return C >= TFM__CU_THREADS ? TFM__CU_THREADS : tfm__cu_row_threads(C);
}
static dim3 tfm__cu_grid2(int64_t n, int64_t C) {
    int64_t t = (int64_t)tfm__cu_block2(C) * TFM__CU_U, x = TFM__MIN((C + t - 1) / t, 4096);
    return dim3((unsigned)x, (unsigned)TFM__MAX(TFM__MIN(n, TFM__MAX(4096 / x, 1)), 1));
}
/* A block's thread over its share of a row (or a chunk: [lo, C)), TFM__CU_U elements a round
   (TFM__CU_ROUNDS): j = j0 + u blockDim.x in slot u. The row kernels hold a row whose C fits one round
   (tfm__cu_held) in registers, slot by slot, loaded at once: read from memory once, where each pass over it
   would wait on its loads again. */
#define TFM__CU_ROUNDS(j0, lo, C) for (j0 = (lo) + threadIdx.x; j0 < (C); j0 += TFM__CU_U * (int64_t)blockDim.x)
#define TFM__CU_SLOTS(j0, u, j, C) for (u = 0, j = j0; u < TFM__CU_U && j < (C); u++, j += blockDim.x)
#define TFM__CU_ROW_EACH(j0, u, j, C) TFM__CU_ROUNDS(j0, 0, C) TFM__UNROLL TFM__CU_SLOTS(j0, u, j, C)
static __device__ int tfm__cu_held(int64_t C) { return C <= TFM__CU_U * (int64_t)blockDim.x; }
/* A row kernel's block (layernorm, softmax): TFM__CU_U elements a thread where the row allows (192 threads for
   768 channels, where one a thread took 512 and left a thread's share of the row 1-2 loads), so that several
   rows share an SM */
static unsigned tfm__cu_held_threads(int64_t C) { return tfm__cu_row_threads((C + TFM__CU_U - 1) / TFM__CU_U); }

/* The sum (or, with is_max, the maximum) of v over the block, in every thread. blockDim.x is a multiple
   of 32; sh holds 32 values of shared memory. Lanes combine by shuffles, then the warps' results. Every
   lane gets the same value (a NaN among the maxima makes every lane's NaN), so that a branch on it keeps
   the warp together. */
template <typename T> static __device__ T tfm__cu_warp_reduce(T v, int is_max) { /* over the warp, in every lane */
    int o;
    for (o = 16; o > 0; o >>= 1) {
        T u = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? (u > v || u != u ? u : v) : v + u;
    }
    return v;
}
template <typename T> static __device__ T tfm__cu_reduce(T v, T *sh, int is_max) {
    int lane = (int)(threadIdx.x & 31), w = (int)(threadIdx.x >> 5), nw = (int)(blockDim.x >> 5);
    v = tfm__cu_warp_reduce(v, is_max);
    __syncthreads(); /* sh may still be read by the previous reduction */
    if (lane == 0) sh[w] = v;
    __syncthreads();
    return tfm__cu_warp_reduce(lane < nw ? sh[lane] : (is_max ? (T)-INFINITY : (T)0), is_max);
}

/* x rounded to bf16 (bfloat16: a float's upper 16 bits, 8 significant bits), to nearest with ties to even,
   as __float2bfloat16_rn; a NaN stays a (quiet) NaN. */
static TFM__HD inline uint16_t tfm__bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
/* The float a bf16 value stands for, exactly */
static TFM__HD inline float tfm__bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
/* x rounded to bf16 to nearest even, as a float: a value a bf16 activation holds */
static TFM__HD inline float tfm__bf16_round(float x) {
    return tfm__bf16_value(tfm__bf16(x));
}
/* Element c of row r of x: fp32 rows of C (ldb 0) or bf16 rows of ldb elements (a bf16 activation) */
static TFM__HD inline float tfm__cu_at(const float *x, int64_t r, int64_t c, int64_t C, int64_t ldb) {
    return ldb ? tfm__bf16_value(((const uint16_t *)(const void *)x)[r * ldb + c]) : x[r * C + c];
}

/* tfm__bf16_operand_cuda: element i of n = nb matrices of rows x cols; flat: source and destination are
   both the n elements in a row (no gaps), as most operands are, and need no index arithmetic */
static __global__ void tfm__k_to_bf16(uint16_t *dst, int64_t ldd, const float *src, int64_t lds, int64_t ss,
                                      int64_t rows, int64_t cols, int64_t n, int flat) {
    float v[TFM__CU_U];
    int64_t i;
    int u;
    if (flat) {
        TFM__CU_LOOP_U(i0, n) {
            tfm__cu_load_u(v, src, i0, n);
            TFM__UNROLL
            TFM__CU_EACH(u, i, i0) if (i < n) dst[i] = tfm__bf16(v[u]);
        }
    } else {
        TFM__CU_ROWS(br, n / cols, c0, cols) { /* (row br % rows of matrix br / rows) */
            const float *sr = src + br / rows * ss + br % rows * lds;
            TFM__UNROLL
            TFM__CU_EACH(u, i, c0) v[u] = i < cols ? sr[i] : 0.0f;
            TFM__UNROLL
            TFM__CU_EACH(u, i, c0) if (i < cols) dst[br * ldd + i] = tfm__bf16(v[u]);
        }
    }
}

/* src row r to dst row r, or with drow to dst row drow[r / per] + r % per (groups of per rows); how: bit 1
   added into dst, bit 2 rounded to bf16 (tfm__bf16_round); ldsb > 0: src is bf16 rows of ldsb (tfm__cu_at) */
#define TFM__COPY_ADD 1
#define TFM__COPY_ROUND 2
static __global__ void tfm__k_copy_rows(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t ldsb, int64_t n,
                                        int64_t C, int how, const int64_t *drow, int64_t per) {
    TFM__CU_ROWS(r, n, c0, C) {
        int64_t rd = drow ? drow[r / per] + r % per : r, c;
        float v[TFM__CU_U], d[TFM__CU_U];
        int u;
        TFM__UNROLL
        TFM__CU_EACH(u, c, c0) {
            v[u] = c < C ? tfm__cu_at(src, r, c, lds, ldsb) : 0.0f;
            d[u] = c < C && (how & TFM__COPY_ADD) ? dst[rd * ldd + c] : 0.0f;
        }
        TFM__UNROLL
        TFM__CU_EACH(u, c, c0) if (c < C) {
            float x = how & TFM__COPY_ROUND ? tfm__bf16_round(v[u]) : v[u];
            dst[rd * ldd + c] = how & TFM__COPY_ADD ? d[u] + x : x;
        }
    }
}

/* Column sums over N rows (bias, position and layernorm gradients), in two passes so that every SM has
   work and the sums do not depend on timing: a block of 8 warps takes 32 columns of `rows` rows (128, or
   more for over 8 M rows: the grid's y dimension), warp w the rows w, w + 8, ..., and adds its warps'
   sums in warp order into one partial per column; then one thread per column adds the partials in row
   order. Each partial is two sums: of dy = src[r * lds + c], and (layernorm, x given) of dy * xhat,
   xhat = (x - mean[r]) * rstd[r] (rms: no mean). part holds 2 C floats per block of rows. out (not NULL): an
   activation's backward instead, dy = tfm__cu_act_grad(act, src, x) (x its input, rows of C), written to out in
   bf16 (rows of ldo) as well as summed. */
static __device__ float tfm__cu_act_grad(int act, float dy, float v) {
    return act == TFM_ACT_RELU ? (v > 0.0f ? dy : 0.0f)
                               : dy * (act == TFM_ACT_GELU_TANH ? tfm__gelu_tanh_grad(v) : tfm__gelu_erf_grad(v));
}
static __global__ void __launch_bounds__(TFM__CU_THREADS, 3)
    tfm__k_colsum_part(float *part, const float *src, int64_t lds, int64_t ldsb, const float *x, int64_t ldxb,
                       const float *mean, const float *rstd, int rms, int act, uint16_t *out, int64_t ldo, int64_t N,
                       int64_t C, int64_t rows) {
    TFM__SHARED(float, sh, 2 * 8 * 32);
    int lane = (int)(threadIdx.x & 31), w = (int)(threadIdx.x >> 5), k;
    int64_t c = (int64_t)blockIdx.x * 32 + lane, r0 = (int64_t)blockIdx.y * rows, r, rw;
    int64_t r1 = r0 + rows < N ? r0 + rows : N;
    float a = 0.0f, b = 0.0f;
    int u;
    if (c < C)
        for (rw = r0 + w; rw < r1; rw += 8 * TFM__CU_U) { /* TFM__CU_U rows' elements loaded first */
            float dy[TFM__CU_U], xv[TFM__CU_U], mr[TFM__CU_U], rs[TFM__CU_U];
            TFM__UNROLL
            for (u = 0, r = rw; u < TFM__CU_U; u++, r += 8) {
                dy[u] = r < r1 ? tfm__cu_at(src, r, c, lds, ldsb) : 0.0f;
                xv[u] = r < r1 && x ? tfm__cu_at(x, r, c, C, out ? ldxb : 0) : 0.0f;
                mr[u] = r < r1 && x && !out && !rms ? mean[r] : 0.0f;
                rs[u] = r < r1 && x && !out ? rstd[r] : 0.0f;
            }
            TFM__UNROLL
            for (u = 0, r = rw; u < TFM__CU_U && r < r1; u++, r += 8) {
                float d = dy[u];
                if (out) {
                    if (x) d = tfm__cu_act_grad(act, d, xv[u]);
                    out[r * ldo + c] = tfm__bf16(d);
                } else if (x)
                    a += d * (xv[u] - mr[u]) * rs[u];
                b += d;
            }
        }
    sh[w * 32 + lane] = a;
    sh[256 + w * 32 + lane] = b;
    __syncthreads();
    if (w == 0 && c < C) {
        float *p = part + (int64_t)blockIdx.y * 2 * C;
        a = b = 0.0f;
        for (k = 0; k < 8; k++) a += sh[k * 32 + lane], b += sh[256 + k * 32 + lane];
        p[c] = a;
        p[C + c] = b;
    }
}

/* dst_a[c] += the partials' first sums, dst_b[c] += their second (either may be NULL): a block of 8 warps
   takes 32 columns, warp w the partials w, w + 8, .. in order, then warp 0 adds the 8 warps' sums in warp
   order (a fixed order: the same bits every run). A thread a column (C threads: 3 blocks for
   768 columns) waited on its n_part (128 at 16,384 rows) loads one after the other. */
static __global__ void tfm__k_colsum_fin(float *dst_a, float *dst_b, const float *part, int64_t n_part, int64_t C) {
    TFM__SHARED(float, sh, 2 * 8 * 32);
    int lane = (int)(threadIdx.x & 31), w = (int)(threadIdx.x >> 5);
    int64_t c = (int64_t)blockIdx.x * 32 + lane, k;
    float a = 0.0f, b = 0.0f;
    if (c < C)
        for (k = w; k < n_part; k += 8) a += part[k * 2 * C + c], b += part[k * 2 * C + C + c];
    sh[w * 32 + lane] = a;
    sh[256 + w * 32 + lane] = b;
    __syncthreads();
    if (w == 0 && c < C) {
        a = b = 0.0f;
        for (k = 0; k < 8; k++) a += sh[k * 32 + lane], b += sh[256 + k * 32 + lane];
        if (dst_a) dst_a[c] += a;
        if (dst_b) dst_b[c] += b;
    }
}

/* One block per row: softmax (log 0) or log-softmax (log 1) */
static __global__ void tfm__k_softmax(float *y, const float *x, int64_t C, int log) {
    TFM__SHARED(float, sh, 32);
    const float *xr = x + (int64_t)blockIdx.x * C;
    float *yr = y + (int64_t)blockIdx.x * C, m = -INFINITY, s = 0.0f, lse, xv[TFM__CU_U] = {0.0f};
    int64_t j0, j;
    int held = tfm__cu_held(C), u;
    if (held) TFM__CU_ROW_EACH(j0, u, j, C) xv[u] = xr[j]; /* (the row read once: tfm__cu_held) */
    TFM__CU_ROW_EACH(j0, u, j, C) {
        float v = held ? xv[u] : xr[j];
        m = v > m ? v : m;
    }
    m = tfm__cu_reduce(m, sh, 1);
    TFM__CU_ROW_EACH(j0, u, j, C) s += tfm__exp((held ? xv[u] : xr[j]) - m);
    s = tfm__cu_reduce(s, sh, 0);
    lse = m + logf(s);
    TFM__CU_ROW_EACH(j0, u, j, C) {
        float v = held ? xv[u] : xr[j];
        yr[j] = log ? v - lse : tfm__exp(v - m) * (1.0f / s);
    }
}

/* softmax: dx += y (dy - sum(y dy)); log-softmax: dx += dy - exp(y) sum(dy) */
static __global__ void tfm__k_softmax_bwd(float *dx, const float *dy, const float *y, int64_t C, int log) {
    TFM__SHARED(float, sh, 32);
    int64_t o = (int64_t)blockIdx.x * C, j0, j;
    float s = 0.0f, yv[TFM__CU_U] = {0.0f}, dv[TFM__CU_U] = {0.0f}, xv[TFM__CU_U] = {0.0f};
    int held = tfm__cu_held(C), u;
    if (held) /* (y, dy and dx read once: tfm__cu_held) */
        TFM__CU_ROW_EACH(j0, u, j, C) {
            yv[u] = y[o + j];
            dv[u] = dy[o + j];
            xv[u] = dx[o + j];
        }
    TFM__CU_ROW_EACH(j0, u, j, C) {
        float a = held ? yv[u] : y[o + j], d = held ? dv[u] : dy[o + j];
        s += log ? d : a * d;
    }
    s = tfm__cu_reduce(s, sh, 0);
    TFM__CU_ROW_EACH(j0, u, j, C) {
        float a = held ? yv[u] : y[o + j], d = held ? dv[u] : dy[o + j];
        dx[o + j] = (held ? xv[u] : dx[o + j]) + (log ? d - tfm__exp(a) * s : a * (d - s));
    }
}

/* One block per row: ids[r] = tfm__argmax_cpu of row r (the greatest value, NaN skipped, then its first
   index, as a maximum of -index: exact while V <= 2^24) */
static __global__ void tfm__k_argmax(int32_t *ids, const float *x, int64_t V) {
    TFM__SHARED(float, sh, 32);
    const float *xr = x + (int64_t)blockIdx.x * V;
    float m = -INFINITY, first = -INFINITY;
    int64_t j;
    for (j = threadIdx.x; j < V; j += blockDim.x) m = xr[j] > m ? xr[j] : m;
    m = tfm__cu_reduce(m, sh, 1);
    for (j = threadIdx.x; j < V; j += blockDim.x)
        if (xr[j] == m) {
            first = -(float)j;
            break;
        }
    first = tfm__cu_reduce(first, sh, 1);
    if (threadIdx.x == 0) ids[blockIdx.x] = xr[0] != xr[0] || first == -INFINITY ? 0 : (int32_t)-first;
}

/* The cross-entropy's loops take a row's logits in groups of 4 (logits 4 q .. 4 q + 3), 2 groups a thread at
   a time: tfm__cu_at4 loads group q of row r (tfm__cu_at's x and ldxb; pad at and past V), a bf16 group whose
   8 bytes are aligned in one load (so 2 loads a thread keep 16 bytes in flight, where single bf16 loads kept
   4 an item), else one load a logit, the same values in the same order either way (a bf16 row and its
   values widened to fp32 rows give the same bits) */
static __device__ void tfm__cu_at4(float *v, const float *x, int64_t r, int64_t q, int64_t V, int64_t ldxb, float pad) {
    const uint16_t *xb = (const uint16_t *)(const void *)x + r * ldxb + 4 * q;
    int e;
    if (ldxb && 4 * q + 4 <= V && !((uintptr_t)xb & 7)) {
        uint64_t w = *(const uint64_t *)(const void *)xb;
        TFM__UNROLL
        for (e = 0; e < 4; e++) v[e] = tfm__bf16_value((uint16_t)(w >> 16 * e));
    } else {
        TFM__UNROLL
        for (e = 0; e < 4; e++) v[e] = 4 * q + e < V ? tfm__cu_at(x, r, 4 * q + e, V, ldxb) : pad;
    }
}

/* Row r's part of the loss's gradient, g (softmax(x) - (1-s) onehot(t) - s/V) from its log-sum-exp l,
   on a row whose target is not ignored (as the CPU's): added into dx, or (ldb > 0) written instead as bf16
   rows of ldb elements (0 + the value, rounded: the bits a zeroed dx added into and then rounded would
   have), an ignored row's zero. x: fp32 rows of V, or (ldxb > 0) bf16 rows of ldxb (tfm__cu_at). */
static __device__ void tfm__cu_xent_grad(float *dx, float g, const float *x, int64_t ldxb, float l, const int32_t *t,
                                         int ignore, float s, int64_t V, int64_t ldb, int64_t r) {
    int64_t j, q0, bd = blockDim.x, tr = t[r];
    float sv = s / (float)V;
    uint16_t *db = (uint16_t *)(void *)dx + r * ldb;
    int u, e;
    if (tr == ignore) {
        for (j = threadIdx.x; ldb && j < V; j += bd) db[j] = 0;
        return;
    }
    for (q0 = threadIdx.x; q0 < (V + 3) / 4; q0 += 2 * bd) { /* 2 groups (tfm__cu_at4; dx to add into) loaded first */
        float v[8], a[8];
        TFM__UNROLL
        for (u = 0; u < 2; u++) {
            tfm__cu_at4(v + 4 * u, x, r, q0 + u * bd, V, ldxb, 0.0f);
            TFM__UNROLL
            for (e = 0, j = 4 * (q0 + u * bd); e < 4; e++, j++) a[4 * u + e] = j < V && !ldb ? dx[r * V + j] : 0.0f;
        }
        TFM__UNROLL
        for (u = 0; u < 2; u++) {
            uint64_t h = 0u;
            int64_t j4 = 4 * (q0 + u * bd);
            TFM__UNROLL
            for (e = 0, j = j4; e < 4 && j < V; e++, j++) {
                float d = g * (tfm__exp(v[4 * u + e] - l) - sv - (j == tr ? 1.0f - s : 0.0f));
                if (ldb) h |= (uint64_t)tfm__bf16(0.0f + d) << 16 * e;
                else dx[r * V + j] = a[4 * u + e] + d;
            }
            if (!ldb || j4 >= V) continue;
            if (j4 + 4 <= V && !((uintptr_t)(db + j4) & 7)) /* a whole group: one store */
                *(uint64_t *)(void *)(db + j4) = h;
            else
                for (e = 0, j = j4; j < V && e < 4; e++, j++) db[j] = (uint16_t)(h >> 16 * e);
        }
    }
}

/* One block per row: lse[r], and the row's loss (0 for an ignored row) into rowloss[r]. One pass over
   the row (the logits are the largest array of an LM's step): each thread keeps its running maximum m
   and the sum of e^(x - m) over its elements, rescaled when m grows, then the block's maximum M and the
   sum of each thread's sum times e^(m - M). A NaN logit makes the loss NaN, a -inf one adds nothing, an
   all -inf row or an inf logit gives NaN, as the two passes did. A thread loads 2 groups of 4 logits
   (tfm__cu_at4), then takes their maximum into m and their terms into the sum. dx (not NULL): also
   the row's gradient (tfm__cu_xent_grad; g read from g_at when that is not NULL), from the row as the
   loss read it, in the same launch (a training step's: one read of the logits fewer). x: fp32 rows of V,
   or (ldxb > 0) bf16 rows of ldxb (a bf16 training step's logits). SMOOTH: s != 0, where the row's mean is
   summed too (in double, so left out of the loop where it is not needed). */
template <int SMOOTH>
static __global__ void tfm__k_xent(float *rowloss, float *lse, const float *x, int64_t ldxb, const int32_t *t, int ignore,
                                   float s, int64_t V, float *dx, float g, const float *g_at, int64_t ldb) {
    TFM__SHARED(float, sh, 32);
    TFM__SHARED(double, shd, 32);
    int64_t r = blockIdx.x, j0, bd = blockDim.x;
    float m = -INFINITY, sum = 0.0f, l, M;
    double mean = 0.0;
    int u;
    for (j0 = threadIdx.x; j0 < (V + 3) / 4; j0 += 2 * bd) { /* 2 groups of 4 logits (tfm__cu_at4) */
        float v[8], bm = -INFINITY;
        TFM__UNROLL
        for (u = 0; u < 2; u++) tfm__cu_at4(v + 4 * u, x, r, j0 + u * bd, V, ldxb, -INFINITY);
        TFM__UNROLL
        for (u = 0; u < 8; u++) bm = v[u] > bm ? v[u] : bm; /* (a NaN is left out here; its term makes the sum NaN) */
        if (bm > m) {
            sum *= tfm__exp(m - bm);
            m = bm;
        }
        TFM__UNROLL
        for (u = 0; u < 8; u++) {
            if (v[u] != -INFINITY) sum += tfm__exp(v[u] - m);
            if (SMOOTH && 4 * (j0 + u / 4 * bd) + u % 4 < V) mean += v[u];
        }
    }
    M = tfm__cu_reduce(m, sh, 1);
    sum = tfm__cu_reduce(sum * tfm__exp(m - M), sh, 0);
    if (SMOOTH) mean = tfm__cu_reduce(mean, shd, 0);
    l = M + logf(sum);
    if (threadIdx.x == 0) {
        float loss = 0.0f;
        lse[r] = l;
        if (t[r] != ignore) {
            loss = (1.0f - s) * (l - tfm__cu_at(x, r, t[r], V, ldxb));
            if (SMOOTH) loss += s * (l - (float)(mean / (double)V));
        }
        rowloss[r] = loss;
    }
    if (dx) tfm__cu_xent_grad(dx, g_at ? *g_at : g, x, ldxb, l, t, ignore, s, V, ldb, r);
}

/* tfm__cu_xent_grad of every row from the saved log-sum-exps */
static __global__ void tfm__k_xent_bwd(float *dx, float g, const float *g_at, const float *x, int64_t ldxb,
                                       const float *lse, const int32_t *t, int ignore, float s, int64_t V, int64_t ldb) {
    int64_t r = blockIdx.x;
    tfm__cu_xent_grad(dx, g_at ? *g_at : g, x, ldxb, lse[r], t, ignore, s, V, ldb, r);
}

/* Row r of a layernorm (rms: RMSNorm) by the whole block, x and y at the row; y may alias x (each thread
   reads only the elements it writes); held: the row is in xv (tfm__cu_held; x is not read); yb (not NULL):
   the row in bf16 there instead of y (bf16 activations); sh: the block's 32 floats for the sums */
static __device__ void tfm__cu_ln_row(float *y, uint16_t *yb, float *mean, float *rstd, const float *x,
                                      const float (&xv)[TFM__CU_U], int held, const float *g, const float *b, float eps,
                                      int64_t C, int rms, int64_t r, float *sh) {
    int64_t j0, j;
    float m = 0.0f, v = 0.0f, rs;
    int u;
    if (!rms) {
        TFM__CU_ROW_EACH(j0, u, j, C) m += held ? xv[u] : x[j];
        m = tfm__cu_reduce(m, sh, 0) / (float)C;
    }
    TFM__CU_ROW_EACH(j0, u, j, C) {
        float d = (held ? xv[u] : x[j]) - m;
        v += d * d;
    }
    v = tfm__cu_reduce(v, sh, 0) / (float)C;
    rs = 1.0f / sqrtf(v + eps);
    TFM__CU_ROW_EACH(j0, u, j, C) {
        float o = ((held ? xv[u] : x[j]) - m) * rs * (g ? g[j] : 1.0f) + (b ? b[j] : 0.0f);
        if (yb) yb[j] = tfm__bf16(o);
        else y[j] = o;
    }
    if (threadIdx.x == 0 && mean) mean[r] = m;
    if (threadIdx.x == 0 && rstd) rstd[r] = rs;
}

/* One block per row; ldb > 0: y holds bf16 rows of ldb elements */
static __global__ void tfm__k_layernorm(float *y, float *mean, float *rstd, const float *x, const float *g,
                                        const float *b, float eps, int64_t C, int rms, int64_t ldb) {
    TFM__SHARED(float, sh, 32);
    int64_t o = (int64_t)blockIdx.x * C, j0, j;
    float xv[TFM__CU_U] = {0.0f};
    int held = tfm__cu_held(C), u;
    if (held) TFM__CU_ROW_EACH(j0, u, j, C) xv[u] = x[o + j];
    tfm__cu_ln_row(y + o, ldb ? (uint16_t *)(void *)y + blockIdx.x * ldb : NULL, mean, rstd, x + o, xv, held, g, b, eps, C,
                   rms, blockIdx.x, sh);
}

/* One block per row: dx = res + rstd (dn - mean(dn) - xhat mean(dn xhat)), dn = dy g (res may be dx, or NULL) */
static __global__ void tfm__k_layernorm_bwd(float *dx, const float *res, const float *dy, const float *x, const float *g,
                                            const float *mean, const float *rstd, int64_t C, int rms) {
    TFM__SHARED(float, sh, 32);
    int64_t r = blockIdx.x, o = r * C, j0, j;
    float m = rms ? 0.0f : mean[r], rs = rstd[r], a = 0.0f, bs = 0.0f, dv[TFM__CU_U] = {0.0f}, xv[TFM__CU_U] = {0.0f},
          rv[TFM__CU_U] = {0.0f};
    int held = tfm__cu_held(C), u;
    if (held) /* the row's dy, x and res in registers (tfm__cu_held) */
        TFM__CU_ROW_EACH(j0, u, j, C) {
            dv[u] = dy[o + j];
            xv[u] = x[o + j];
            rv[u] = res ? res[o + j] : 0.0f;
        }
    TFM__CU_ROW_EACH(j0, u, j, C) {
        float dn = (held ? dv[u] : dy[o + j]) * (g ? g[j] : 1.0f);
        a += dn;
        bs += dn * ((held ? xv[u] : x[o + j]) - m) * rs;
    }
    a = tfm__cu_reduce(a, sh, 0) / (float)C;
    if (rms) a = 0.0f;
    bs = tfm__cu_reduce(bs, sh, 0) / (float)C;
    TFM__CU_ROW_EACH(j0, u, j, C) {
        float d = rs * ((held ? dv[u] : dy[o + j]) * (g ? g[j] : 1.0f) - a - ((held ? xv[u] : x[o + j]) - m) * rs * bs);
        dx[o + j] = res ? (held ? rv[u] : res[o + j]) + d : d;
    }
}

/* An MLP's first linear map, bias and activation fused after the product: pre (N, F1) += b (b NULL: its bias
   added by the product's epilogue or none), then y (N, F) = act(pre) (F1 = 2F for SwiGLU: gate and up halves,
   one thread for both); ldb > 0: y as bf16 rows of ldb elements. ldp > 0: pre is bf16 rows of ldp elements,
   read only (the product wrote them, with the bias); else rnd (a bf16 model): pre rounded to bf16 after the
   bias, written back in fp32, before the activation reads it. */
static __global__ void __launch_bounds__(TFM__CU_THREADS, 4)
    tfm__k_bias_act(int act, float *y, float *pre, const float *b, int64_t N, int64_t F, int64_t ldb, int64_t ldp,
                    int rnd) {
    int64_t F1 = act == TFM_ACT_SWIGLU ? 2 * F : F;
    int nk = act == TFM_ACT_SWIGLU ? 2 : 1, k, u;
    TFM__CU_ROWS(r, N, j0, F) {
        int64_t j;
        float v[TFM__CU_U][2];
        TFM__UNROLL
        TFM__CU_EACH(u, j, j0)
            for (k = 0; k < 2; k++) { /* (gate, up) */
                v[u][k] = j < F && k < nk ? tfm__cu_at(pre, r, j + k * F, F1, ldp) : 0.0f;
                if (j < F && k < nk && b && !ldp) v[u][k] += b[j + k * F];
            }
        TFM__UNROLL
        TFM__CU_EACH(u, j, j0) if (j < F) {
            float h;
            for (k = 0; k < nk && !ldp; k++) {
                if (rnd) v[u][k] = tfm__bf16_round(v[u][k]);
                if (b || rnd) pre[r * F1 + j + k * F] = v[u][k];
            }
            if (act == TFM_ACT_SWIGLU) h = v[u][0] * tfm__sigmoid(v[u][0]) * v[u][1];
            else
                h = act == TFM_ACT_RELU        ? (v[u][0] > 0.0f ? v[u][0] : 0.0f)
                    : act == TFM_ACT_GELU_TANH ? tfm__gelu_tanh(v[u][0])
                                               : tfm__gelu_erf(v[u][0]);
            if (ldb) ((uint16_t *)(void *)y)[r * ldb + j] = tfm__bf16(h);
            else y[r * F + j] = h;
        }
    }
}

/* The residual add and the layernorm after it, one block per row: s = a + b is written, then y = LN(s)
   (from the sums held in registers, tfm__cu_held, else each thread re-reads the sums it wrote); ldb > 0: y
   as bf16 rows of ldb elements */
static __global__ void tfm__k_add_layernorm(float *s, float *y, float *mean, float *rstd, const float *a, const float *b,
                                            int64_t ldbb, int brnd, const float *g, const float *bias, float eps, int64_t C,
                                            int rms, int64_t ldb) {
    TFM__SHARED(float, sh, 32);
    int64_t o = (int64_t)blockIdx.x * C, j0, j;
    float av[TFM__CU_U] = {0.0f}, bv[TFM__CU_U] = {0.0f};
    int held = tfm__cu_held(C), u;
    TFM__CU_ROUNDS(j0, 0, C) { /* a round's a and b loaded, then summed */
        TFM__UNROLL
        TFM__CU_SLOTS(j0, u, j, C) {
            av[u] = a[o + j];
            bv[u] = tfm__cu_at(b, blockIdx.x, j, C, ldbb);
        }
        TFM__UNROLL
        TFM__CU_SLOTS(j0, u, j, C) {
            av[u] += brnd ? tfm__bf16_round(bv[u]) : bv[u];
            s[o + j] = av[u]; /* (the row's sums stay in av where it is held) */
        }
    }
    tfm__cu_ln_row(y + o, ldb ? (uint16_t *)(void *)y + blockIdx.x * ldb : NULL, mean, rstd, s + o, av, held, g, bias, eps, C,
                   rms, blockIdx.x, sh);
}

/* act: a tfm_activation. Backward: dx = acc * dx + dy act'(x) (acc 0: dx not read) */
static __global__ void tfm__k_act(int act, float *y, const float *x, int64_t n) {
    float v[TFM__CU_U];
    int64_t i;
    int u;
    TFM__CU_LOOP_U(i0, n) {
        tfm__cu_load_u(v, x, i0, n);
        TFM__UNROLL
        TFM__CU_EACH(u, i, i0) if (i < n) {
            y[i] = act == TFM_ACT_RELU        ? (v[u] > 0.0f ? v[u] : 0.0f)
                   : act == TFM_ACT_GELU_TANH ? tfm__gelu_tanh(v[u])
                                              : tfm__gelu_erf(v[u]);
        }
    }
}
static __global__ void tfm__k_act_bwd(int act, float *dx, const float *dy, const float *x, int64_t n, float acc) {
    float v[TFM__CU_U], d[TFM__CU_U], a[TFM__CU_U];
    int64_t i;
    int u;
    TFM__CU_LOOP_U(i0, n) {
        tfm__cu_load_u(v, x, i0, n);
        tfm__cu_load_u(d, dy, i0, n);
        tfm__cu_load_u(a, acc != 0.0f ? dx : NULL, i0, n);
        TFM__UNROLL
        TFM__CU_EACH(u, i, i0) if (i < n) {
            float g = tfm__cu_act_grad(act, d[u], v[u]);
            dx[i] = acc != 0.0f ? a[u] + g : g;
        }
    }
}
/* SwiGLU's backward, as the CPU's: one thread per output element; ldb (not 0): dh in bf16, rows of ldb; ldh
   (not 0): h is bf16, rows of ldh; lddy (not 0): dy is bf16, rows of lddy */
static __global__ void __launch_bounds__(TFM__CU_THREADS, 4)
    tfm__k_swiglu_bwd(float *dh, const float *dy, int64_t lddy, const float *h, int64_t N, int64_t F, int64_t ldb,
                      int64_t ldh) {
    int k;
    TFM__CU_ROWS(r, N, j0, F) {
        float gt[TFM__CU_U], up[TFM__CU_U], d[TFM__CU_U];
        int64_t j;
        TFM__UNROLL
        TFM__CU_EACH(k, j, j0) {
            gt[k] = j < F ? tfm__cu_at(h, r, j, 2 * F, ldh) : 0.0f;
            up[k] = j < F ? tfm__cu_at(h, r, F + j, 2 * F, ldh) : 0.0f;
            d[k] = j < F ? tfm__cu_at(dy, r, j, F, lddy) : 0.0f;
        }
        TFM__UNROLL
        TFM__CU_EACH(k, j, j0) if (j < F) {
            float g = gt[k], u = up[k], sg = tfm__sigmoid(g), du = d[k] * g * sg;
            float dg = d[k] * u * sg * (1.0f + g * (1.0f - sg));
            if (ldb) {
                uint16_t *hb = (uint16_t *)(void *)dh + r * ldb;
                hb[j] = tfm__bf16(dg);
                hb[F + j] = tfm__bf16(du);
            } else {
                dh[r * 2 * F + F + j] = du;
                dh[r * 2 * F + j] = dg;
            }
        }
    }
}
/* rotary embedding, as the CPU's. First the angles, as the CPU forms them: cs[2i], cs[2i + 1] the cosine
   and sine of pair j = i % half at the position of q = i / half, position q of every batch row (pos0
   NULL), or row q at its own offset; then one thread per (row, head, channel of the first half or a
   pass-through one) turns its pair. */
static __global__ void tfm__k_rope_angles(float *cs, int64_t T, int half, int rot, float base, const int32_t *pos0,
                                          int inverse, int64_t n) {
    TFM__CU_LOOP(i, n) {
        int64_t q = i / half;
        tfm__rope_angle((double)(q % T) + (pos0 ? (double)pos0[q / T] : 0.0), (int)(i % half), rot, (double)base, inverse,
                        &cs[2 * i], &cs[2 * i + 1]);
    }
}
/* y[at] = v (acc 0), += v (1), or v rounded to bf16 into y's bf16 elements (2) */
static __device__ void tfm__cu_rope_put(float *y, int64_t at, float v, int acc) {
    if (acc == 2)
        ((uint16_t *)(void *)y)[at] = tfm__bf16(v);
    else
        y[at] = acc ? y[at] + v : v;
}
static __global__ void tfm__k_rope(float *y, const float *x, int64_t ld, int64_t T, int H, int D, int rot,
                                   const float *cs, int own, int acc, int64_t rows) {
    int half = rot / 2, w = D - half, u, k[TFM__CU_U]; /* per head: half pairs, then D - rot pass-through channels */
    float a[TFM__CU_U], b[TFM__CU_U], c[TFM__CU_U], sn[TFM__CU_U];
    int64_t j, o[TFM__CU_U];
    TFM__CU_ROWS(r, rows, j0, (int64_t)H * w) { /* row r's (head, channel) pairs j: loaded, then turned */
        const float *a2 = cs + 2 * (own ? r : r % T) * half;
        TFM__UNROLL
        TFM__CU_EACH(u, j, j0) if (j < (int64_t)H * w) {
            int h = (int)j / w;
            k[u] = (int)j - h * w;
            o[u] = r * ld + (int64_t)h * D;
            if (k[u] < half) {
                a[u] = x[o[u] + k[u]], b[u] = x[o[u] + k[u] + half];
                c[u] = a2[2 * k[u]], sn[u] = a2[2 * k[u] + 1];
            } else {
                a[u] = x[o[u] + k[u] + half]; /* rot <= k + half < D */
            }
        }
        TFM__UNROLL
        TFM__CU_EACH(u, j, j0) if (j < (int64_t)H * w) {
            if (k[u] < half) {
                tfm__cu_rope_put(y, o[u] + k[u], a[u] * c[u] - b[u] * sn[u], acc);
                tfm__cu_rope_put(y, o[u] + k[u] + half, b[u] * c[u] + a[u] * sn[u], acc);
            } else {
                tfm__cu_rope_put(y, o[u] + k[u] + half, a[u], acc);
            }
        }
    }
}

/* The CPU's mask: element i kept when hash(seed, i0 + i) >= thr, scaled by 1/(1-p); seed_at (not NULL):
   the seed is there instead (a recorded step's, staged) */
static __global__ void tfm__k_dropout(float *y, const float *x, int64_t n, uint32_t thr, float scale, uint64_t seed,
                                      const uint64_t *seed_at, uint64_t i0, int acc) {
    float v[TFM__CU_U], a[TFM__CU_U];
    int64_t i;
    int u;
    if (seed_at) seed = *seed_at;
    TFM__CU_LOOP_U(e0, n) {
        tfm__cu_load_u(v, x, e0, n);
        tfm__cu_load_u(a, acc ? y : NULL, e0, n);
        TFM__UNROLL
        TFM__CU_EACH(u, i, e0) if (i < n) {
            float d = tfm__hash24(seed, i0 + (uint64_t)i) >= thr ? v[u] * scale : 0.0f;
            y[i] = acc ? a[u] + d : d;
        }
    }
}

static __global__ void tfm__k_embedding(float *y, const int32_t *ids, const float *w, float scale, int64_t N, int64_t C) {
    float v[TFM__CU_U];
    int64_t j;
    int u;
    TFM__CU_ROWS(r, N, j0, C) {
        tfm__cu_load_u(v, w + (int64_t)ids[r] * C, j0, C);
        TFM__UNROLL
        TFM__CU_EACH(u, j, j0) if (j < C) y[r * C + j] = v[u] * scale;
    }
}
/* dw[uid[u], c] += scale * dy[rows[k], c] for k in [ustart[u], ustart[u + 1]), in that order: one thread per
   (distinct id, column), the N rows grouped by id on the host into h (tfm__group_ids: rows, uid and
   ustart at h, h + N and h + 2 N, the count U of distinct ids at h[3 N + 1]; staged whole, so that only
   the data differs from batch to batch) */
static __global__ void tfm__k_embedding_bwd(float *dw, const float *dy, const int32_t *h, float scale, int64_t N, int64_t C) {
    const int32_t *rows = h, *uid = h + N, *ustart = h + 2 * N;
    int64_t U = h[3 * N + 1];
    TFM__CU_LOOP(i, U * C) {
        int64_t u = i / C, c = i % C;
        float *d = dw + (int64_t)uid[u] * C + c, acc = *d;
        int32_t k;
        for (k = ustart[u]; k < ustart[u + 1]; k++) acc += scale * dy[(int64_t)rows[k] * C + c];
        *d = acc;
    }
}

/* y[b,t] = x[b,t] + w[p0[b] + t] (w NULL: the sinusoidal table; x NULL: zeros; p0 NULL: 0) */
static __global__ void tfm__k_pos_add(float *y, const float *x, const float *w, const int32_t *p0, int64_t B, int64_t T,
                                      int64_t C) {
    float v[TFM__CU_U], p[TFM__CU_U];
    int64_t j;
    int u;
    TFM__CU_ROWS(r, B * T, j0, C) {
        int64_t t = r % T + (p0 ? p0[r / T] : 0);
        tfm__cu_load_u(v, x ? x + r * C : NULL, j0, C);
        tfm__cu_load_u(p, w ? w + t * C : NULL, j0, C);
        TFM__UNROLL
        TFM__CU_EACH(u, j, j0) if (j < C) y[r * C + j] = v[u] + (w ? p[u] : tfm__sinusoid(t, j, C));
    }
}

static __global__ void tfm__k_add(float *y, const float *a, const float *b, int64_t n) {
    float va[TFM__CU_U], vb[TFM__CU_U];
    int64_t i;
    int u;
    TFM__CU_LOOP_U(i0, n) {
        tfm__cu_load_u(va, a, i0, n);
        tfm__cu_load_u(vb, b, i0, n);
        TFM__UNROLL
        TFM__CU_EACH(u, i, i0) if (i < n) y[i] = va[u] + vb[u];
    }
}

/* Mean over the first lens[b] positions: a thread per (b, c); backward a thread per element */
static __global__ void tfm__k_mean_pool(float *y, const float *x, const int32_t *lens, int64_t B, int64_t T, int64_t C) {
    TFM__CU_LOOP(i, B * C) {
        int64_t b = i / C, c = i % C, L = lens ? lens[b] : T, t;
        float acc = 0.0f;
        for (t = 0; t < L; t++) acc += x[(b * T + t) * C + c];
        y[i] = L > 0 ? acc / (float)L : 0.0f;
    }
}
static __global__ void tfm__k_mean_pool_bwd(float *dx, const float *dy, const int32_t *lens, int64_t B, int64_t T,
                                            int64_t C) {
    TFM__CU_LOOP(i, B * T * C) {
        int64_t b = i / (T * C), t = (i / C) % T, L = lens ? lens[b] : T;
        if (t < L) dx[i] += dy[b * C + i % C] * (1.0f / (float)L);
    }
}

/* One parameter of a multi-tensor launch: its arrays and length, its weight-decay factor, and c0, the
   first of its chunks (TFM__CU_CHUNK floats each, a block's share); a launch covers every chunk of its
   list, so a step is one launch for AdamW and one for the gradient norm per 256 parameters. AdamW's
   step size and bias correction, which change every step, are here too (not kernel arguments), so that a
   training step's graph replays with the next step's (tfm__cuda_capture_end). */
typedef struct tfm__cu_job {
    float *w, *m, *v;
    const float *g;
    int64_t n, c0;
    float decay, step_size, bc2s;
} tfm__cu_job;
#define TFM__CU_CHUNK 4096

/* The job of this block (the last of jobs[0..n) with c0 <= blockIdx.x: an empty one owns no chunk) and
   the block's range [*lo, *hi) in it */
static __device__ const tfm__cu_job *tfm__cu_job_of(const tfm__cu_job *jobs, int n, int64_t *lo, int64_t *hi) {
    int a = 0, b = n - 1;
    int64_t blk = (int64_t)blockIdx.x;
    while (a < b) {
        int mid = (a + b + 1) / 2;
        if (jobs[mid].c0 <= blk) a = mid;
        else b = mid - 1;
    }
    *lo = (blk - jobs[a].c0) * TFM__CU_CHUNK;
    *hi = TFM__MIN(jobs[a].n, *lo + TFM__CU_CHUNK);
    return jobs + a;
}

/* The update of each chunk, its gradients clipped by the squared norm *sumsq (tfm__k_sumsq_total left it
   there); none when that is not finite. A thread's TFM__CU_U elements of a round (the four arrays of each)
   are loaded before any is updated, as in the memory-bound kernels above: 16 loads in flight a thread. */
static __global__ void tfm__k_adamw(const tfm__cu_job *jobs, int n, const double *sumsq, float clip, float b1, float b2,
                                    float eps) {
    int64_t lo, hi, j0, j;
    const tfm__cu_job *p = tfm__cu_job_of(jobs, n, &lo, &hi);
    double ss = *sumsq;
    float scale = tfm__clip_scale(ss, clip), w[TFM__CU_U], g[TFM__CU_U], m[TFM__CU_U], v[TFM__CU_U];
    tfm__cu_job jb = *p; /* (in registers: the stores below may not alias it) */
    int u;
    if (!isfinite(ss)) return;
    TFM__CU_ROUNDS(j0, lo, hi) {
        TFM__UNROLL
        TFM__CU_SLOTS(j0, u, j, hi) {
            w[u] = jb.w[j];
            g[u] = jb.g[j];
            m[u] = jb.m[j];
            v[u] = jb.v[j];
        }
        TFM__UNROLL
        TFM__CU_SLOTS(j0, u, j, hi) {
            tfm__adamw_one(&w[u], g[u] * scale, &m[u], &v[u], b1, b2, eps, jb.step_size, jb.bc2s, jb.decay);
            jb.w[j] = w[u];
            jb.m[j] = m[u];
            jb.v[j] = v[u];
        }
    }
}

/* part[block] = the sum of g^2 over the block's chunk, in double: each thread's elements in the order of a
   plain loop (j0, j0 + blockDim.x, ...), TFM__CU_U loaded at a time */
static __global__ void tfm__k_sumsq(double *part, const tfm__cu_job *jobs, int n) {
    TFM__SHARED(double, sh, 32);
    int64_t lo, hi, j0, j;
    const tfm__cu_job *p = tfm__cu_job_of(jobs, n, &lo, &hi);
    const float *gr = p->g;
    double s = 0.0;
    float g[TFM__CU_U];
    int u;
    TFM__CU_ROUNDS(j0, lo, hi) {
        TFM__UNROLL
        TFM__CU_SLOTS(j0, u, j, hi) g[u] = gr[j];
        TFM__UNROLL
        TFM__CU_SLOTS(j0, u, j, hi) s += (double)g[u] * (double)g[u];
    }
    s = tfm__cu_reduce(s, sh, 0);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

/* *total (0 first when `first`) += the sums of squares of jobs[0..n) (n <= 256, a thread each), from
   their chunks' partial sums in order, added in list order by thread 0: the same bits on every run. */
static __global__ void tfm__k_sumsq_total(double *total, const double *part, const tfm__cu_job *jobs, int n,
                                          int64_t chunks, int first) {
    TFM__SHARED(double, sh, 256);
    int i = (int)threadIdx.x;
    if (i < n) {
        double s = 0.0;
        int64_t k, end = i + 1 < n ? jobs[i + 1].c0 : chunks;
        for (k = jobs[i].c0; k < end; k++) s += part[k];
        sh[i] = s;
    }
    __syncthreads();
    if (i == 0) {
        double t = first ? 0.0 : *total;
        for (i = 0; i < n; i++) t += sh[i];
        *total = t;
    }
}

/* -- attention: the CPU's tfm__attn_args with device pointers. Heads of up to TFM__CU_TD channels run in
   the tiled kernels below (fp32, the scores on chip), or in a bf16 model's calls the flash kernels (bf16
   tensor-core products, the scores in registers); wider heads through batched products (after the tiled
   kernels). All recompute the probabilities in backward from the
   saved log-sum-exp and D = rowsum(dout * out) (tfm__k_attn_dr). -- */
#define TFM__CU_ATT_MAX_D 2048

/* The args with the device copies of its pointers (kernel arguments, so the emulation can check them) */
static __device__ void tfm__cu_attn_ptrs(tfm__attn_args *a, const float *q, const float *k, const float *v, float *out,
                                         float *lse, const int32_t *lens, const int32_t *rows, const int32_t *qoff,
                                         const float *mask) {
    a->q = q;
    a->k = k;
    a->v = v;
    a->out = out;
    a->lse = lse;
    a->lens = lens;
    a->kv_rows = rows;
    a->q_off = qoff;
    a->mask = mask;
    if (a->seed_at) a->seed = *a->seed_at;
}

/* The factor of dropout's kept elements, 1 / (1 - p) (1 without dropout). The bf16 paths round the kept
   probabilities to bf16 unscaled and apply it to their products' fp32 sums: a probability of 1 (a row's
   running maximum in the flash forward, a query that sees one key) times 1.111 (p = 0.1) rounds to bf16
   0.16% low every time, a bias that does not average out. */
static TFM__HD float tfm__cu_drop_scale(const tfm__attn_args *a) {
    return a->dropout > 0.0f ? 1.0f / (1.0f - a->dropout) : 1.0f;
}

/* e^x by the GPU's special-function unit: ex2.approx.ftz of x log2(e), as CUDA's __expf (whose error the
   CUDA guide bounds by 2 + 1.17 |x| ulp: under 2^-16 relative over the [-87, 0] a softmax takes, and 0 for
   -inf), one instruction where tfm__exp's polynomial is some twenty. The flash kernels' probabilities take
   it, rounded to bf16 (2^-8 relative) afterwards; the forward's as e^(s - m) = 2^(s log2(e) - m log2(e)), the
   exponent one fma (tfm__cu_fexp2), which adds m log2(e)'s rounding: P off by |m| 2^-24 relative at most
   (2^-16 for scores up to |m| = 256). The emulation computes it with the host's exp2f (subnormal results
   flushed to 0, as .ftz does). */
static __device__ float tfm__cu_fexp2(float x) { /* 2^x */
    float y;
#if defined(__CUDA_ARCH__)
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
#else
    y = exp2f(x);
    y = y < 1.17549435e-38f ? 0.0f : y; /* below FLT_MIN */
#endif
    return y;
}
#define TFM__CU_LOG2E 1.4426950408889634f
static __device__ float tfm__cu_fexp(float x) { return tfm__cu_fexp2(x * TFM__CU_LOG2E); }

/* The dropout factor of query i, key j of batch-head bh: 1 without dropout, else 0 or 1/(1 - p) */
static __device__ float tfm__cu_attn_keep(const tfm__attn_args *a, int bh, int i, int j) {
    if (!(a->dropout > 0.0f)) return 1.0f;
    return tfm__hash24(a->seed, (uint64_t)tfm__attn_drop_index(a, bh, i, j)) >= tfm__drop_threshold(a->dropout)
               ? tfm__cu_drop_scale(a)
               : 0.0f;
}

/* rnd (a bf16 model's call): D from out rounded to bf16, as it is stored there (a.out_bf) or as the next
   product reads it */
static __global__ void tfm__k_attn_dr(float *Dr, float *one, tfm__attn_args a, const float *out, const float *dout,
                                      int lddo, const int32_t *lens, const float *mask, int rnd) {
    int64_t n = (int64_t)a.B * a.H * a.Tq, r, d, w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = (int)threadIdx.x & 31;
    tfm__cu_attn_ptrs(&a, NULL, NULL, NULL, NULL, NULL, lens, NULL, NULL, mask);
    /* a warp a row (row r of head h: lane l takes channels l, l + 32, .., so that each load of the warp's is
       one run of the row, where a thread a row read 32 rows' lines at once), then a shuffle's sum */
    for (r = w; r < n; r += ((int64_t)gridDim.x * blockDim.x) >> 5) {
        int64_t bh = r / a.Tq, i = r % a.Tq, b = bh / a.H, h = bh % a.H;
        float s = 0.0f;
        for (d = lane; d < a.D; d += 32) {
            float o = tfm__cu_at(out, b * a.Tq + i, h * a.D + d, a.ldo, a.out_bf ? a.ldo : 0);
            float g = tfm__cu_at(dout, b * a.Tq + i, h * a.D + d, lddo, a.dout_bf == 2 ? lddo : 0);
            s += (a.dout_bf == 1 ? tfm__bf16_round(g) : g) * (rnd ? tfm__bf16_round(o) : o);
        }
        s = tfm__cu_warp_reduce(s, 0);
        if (lane == 0) {
            Dr[r] = s;
            one[r] = (float)tfm__attn_one_key(&a, (int)b, (int)i);
        }
    }
}

/* The score of query i, key j of batch row b from qk = q_i.k_j: scaled, the additive mask's term added */
static __device__ float tfm__cu_attn_score(const tfm__attn_args *a, int b, int i, int j, float qk) {
    float s = a->scale * qk;
    if (a->mask) s += a->mask[b * a->mask_bs + (int64_t)i * a->Tk + j];
    return s;
}

/* The probability and score gradient of a visible (query, key) from its score s (tfm__cu_attn_score), its
   dropout factor keep (tfm__cu_attn_keep) and dov = dout_i.v_j: P = e^(s - L), pd = P keep, ds = P (keep dov -
   Dr_i), or exactly 0 where the query sees one key. The flash kernels' form (flash): e^ by the
   special-function unit, as their forward took it, and pd unscaled (P where kept, else 0). (Not the
   forward's one fma, 2^(s log2(e) - L log2(e)): with L a column's in dk/dv, 16 of them a lane, it spilled
   there, 12 bytes to 112 at 128 channels.) tfm__cu_attn_grad: from qk = q_i.k_j, for query i and key j. */
static __device__ void tfm__cu_attn_pds(float s, float keep, float dov, float L, float Dri, float onei, int flash,
                                        float *pd, float *ds) {
    float p;
    p = s == -INFINITY ? 0.0f : flash ? tfm__cu_fexp(s - L) : tfm__exp(s - L); /* (tfm__exp clamps: e^-inf would be 1e-38) */
    *pd = flash && keep != 0.0f ? p : p * keep; /* unscaled: p where kept (tfm__cu_drop_scale) */
    *ds = onei != 0.0f ? 0.0f : p * (keep * dov - Dri);
}
static __device__ void tfm__cu_attn_grad(const tfm__attn_args *a, int b, int bh, int i, int j, float qk, float dov,
                                         float L, float Dri, float onei, int flash, float *pd, float *ds) {
    float keep = tfm__cu_attn_keep(a, bh, i, j), s = tfm__cu_attn_score(a, b, i, j, qk);
    tfm__cu_attn_pds(s, keep, dov, L, Dri, onei, flash, pd, ds);
}

/* -- tiled attention, for heads of up to TFM__CU_TD channels (wider ones take the batched products): a block
   of 4 warps holds a tile of 4R rows of one side in shared memory (R = 4, or 2 above 64 channels, so that
   every tile fits the default 48 KB) and runs over the other side in tiles of 32, lane l on row l of the
   running tile for the dot products and on channels l, l + 32, .. for the sums it accumulates, which stay
   in registers. Forward and dq: the block's rows are queries, the running tiles keys; dk and dv: the
   block's rows are keys, the running tiles queries. Every sum has one owner and a fixed order. -- */
#define TFM__CU_TD 128
#define TFM__CU_TW 32 /* the running tile: one row per lane */

/* Whether a query that sees n keys from window start lo (tfm__attn_visible, tfm__attn_window_lo) sees key j;
   every key of j0 .. j0 + nk - 1 (none in the gap between the sinks and the window) */
static __device__ int tfm__cu_attn_sees(const tfm__attn_args *a, int j, int n, int lo) {
    return j < n && tfm__attn_skip(a, j, lo) == j;
}
static __device__ int tfm__cu_attn_sees_all(const tfm__attn_args *a, int j0, int nk, int n, int lo) {
    return j0 + nk <= n && (lo <= a->sinks || j0 >= lo || j0 + nk <= a->sinks);
}

/* n rows of D floats from src (row stride ld) into shared dst (row stride lds) by the whole block */
static __device__ void tfm__cu_tile_load(float *dst, int lds, const float *src, int64_t ld, int n, int D) {
    int x;
    for (x = (int)threadIdx.x; x < n * D; x += (int)blockDim.x)
        dst[(x / D) * lds + x % D] = src[(int64_t)(x / D) * ld + x % D];
}

/* This lane's dot products with the block's rows: d1[r] = x1 . y1_r and, with TWO, d2[r] = x2 . y2_r, for
   r < R; x a row of the running tile (row stride D + 1, so the lanes' rows sit in different banks), y_r
   the rows of this warp in the block's tile (row stride D). Zeros where the lane is not active. */
template <int R, int TWO>
static __device__ void tfm__cu_tile_dots(int active, float *d1, const float *x1, const float *y1, float *d2,
                                         const float *x2, const float *y2, int D) {
    int d, r;
    TFM__UNROLL
    for (r = 0; r < R; r++) {
        d1[r] = 0.0f;
        if (TWO) d2[r] = 0.0f;
    }
    for (d = 0; active && d < D; d++) {
        float a = x1[d], c = TWO ? x2[d] : 0.0f;
        TFM__UNROLL
        for (r = 0; r < R; r++) {
            d1[r] += y1[r * D + d] * a;
            if (TWO) d2[r] += y2[r * D + d] * c;
        }
    }
}

/* The block's query rows i0.. (nq of them): the most keys any of them sees, and the lowest window start */
static __device__ void tfm__cu_attn_span(const tfm__attn_args *a, int b, int i0, int nq, int *n_max, int *lo_min) {
    int r;
    *n_max = 0;
    *lo_min = 2147483647;
    for (r = 0; r < nq; r++) {
        *n_max = TFM__MAX(*n_max, tfm__attn_visible(a, b, i0 + r));
        *lo_min = TFM__MIN(*lo_min, tfm__attn_window_lo(a, b, i0 + r));
    }
}

/* Forward: block (tile, bh) at bh * tiles + tile; online softmax per query row, as the row kernel. */
template <int R>
static __global__ void tfm__k_attn_fwd_tiled(tfm__attn_args a, const float *q, const float *k, const float *v,
                                             float *out, float *lse, const int32_t *lens, const int32_t *rows,
                                             const int32_t *qoff, const float *mask) {
    TFM__SHARED_DYN(float, sm);
    int D = a.D, QB = 4 * R, tiles = (a.Tq + QB - 1) / QB, bh = (int)blockIdx.x / tiles, b = bh / a.H, h = bh % a.H;
    int i0 = ((int)blockIdx.x % tiles) * QB, nq = TFM__MIN(QB, a.Tq - i0), lane = (int)threadIdx.x & 31;
    int w = (int)threadIdx.x >> 5, n[R], lo[R], n_max, lo_min, r, c, j0, jj;
    float *sq = sm, *sk = sq + QB * D, *sv = sk + TFM__CU_TW * (D + 1), o[R][TFM__CU_TD / 32], m[R], l[R], dot[R];
    const float *kh, *vh;
    int64_t kb;
    tfm__cu_attn_ptrs(&a, q, k, v, out, lse, lens, rows, qoff, mask);
    kb = rows ? rows[b] : b;
    kh = k + kb * (a.bsk ? a.bsk : (int64_t)a.Tk * a.ldk) + tfm__attn_kv_head(&a, h) * D;
    vh = v + kb * (a.bsk ? a.bsk : (int64_t)a.Tk * a.ldv) + tfm__attn_kv_head(&a, h) * D;
    TFM__UNROLL
    for (r = 0; r < R; r++) {
        int i = i0 + w * R + r;
        n[r] = i < a.Tq ? tfm__attn_visible(&a, b, i) : 0;
        lo[r] = i < a.Tq ? tfm__attn_window_lo(&a, b, i) : 0;
        m[r] = -INFINITY;
        l[r] = 0.0f;
        TFM__UNROLL
        for (c = 0; c < TFM__CU_TD / 32; c++) o[r][c] = 0.0f;
    }
    tfm__cu_attn_span(&a, b, i0, nq, &n_max, &lo_min);
    tfm__cu_tile_load(sq, D, q + ((int64_t)b * a.Tq + i0) * a.ldq + h * D, a.ldq, nq, D);
    for (j0 = 0; j0 < n_max; j0 += TFM__CU_TW) {
        int nk = TFM__MIN(TFM__CU_TW, n_max - j0);
        if (j0 >= a.sinks && j0 + nk <= lo_min) continue; /* in every row's window gap */
        tfm__cu_tile_load(sk, D + 1, kh + (int64_t)j0 * a.ldk, a.ldk, nk, D);
        tfm__cu_tile_load(sv, D, vh + (int64_t)j0 * a.ldv, a.ldv, nk, D);
        __syncthreads();
        tfm__cu_tile_dots<R, 0>(lane < nk, dot, sk + lane * (D + 1), sq + w * R * D, NULL, NULL, NULL, D);
        TFM__UNROLL
        for (r = 0; r < R; r++) {
            int i = i0 + w * R + r, j = j0 + lane;
            float s = -INFINITY, p, bm, mn, alpha;
            if (lane < nk && tfm__cu_attn_sees(&a, j, n[r], lo[r])) s = tfm__cu_attn_score(&a, b, i, j, dot[r]);
            bm = tfm__cu_warp_reduce(s, 1);
            if (bm == -INFINITY) continue; /* every key of the tile hidden from this row (the whole warp agrees) */
            mn = bm > m[r] ? bm : m[r];
            alpha = m[r] == -INFINITY ? 0.0f : tfm__exp(m[r] - mn);
            p = s == -INFINITY ? 0.0f : tfm__exp(s - mn);
            l[r] = l[r] * alpha + tfm__cu_warp_reduce(p, 0);
            if (p != 0.0f) p *= tfm__cu_attn_keep(&a, bh, i, j);
            TFM__UNROLL
            for (c = 0; c < TFM__CU_TD / 32; c++) o[r][c] *= alpha;
            for (jj = 0; jj < nk; jj++) {
                float pj = __shfl_sync(0xffffffffu, p, jj);
                TFM__UNROLL
                for (c = 0; c < TFM__CU_TD / 32; c++)
                    if (lane + 32 * c < D) o[r][c] += pj * sv[jj * D + lane + 32 * c];
            }
            m[r] = mn;
        }
        __syncthreads(); /* before the next tile overwrites sk and sv */
    }
    TFM__UNROLL
    for (r = 0; r < R; r++) {
        int i = i0 + w * R + r;
        float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        if (i >= a.Tq) continue;
        TFM__UNROLL
        for (c = 0; c < TFM__CU_TD / 32 && lane + 32 * c < D; c++)
            out[((int64_t)b * a.Tq + i) * a.ldo + h * D + lane + 32 * c] = o[r][c] * inv;
        if (lane == 0) lse[(int64_t)bh * a.Tq + i] = l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
    }
}

/* dq_i += scale sum_j ds_ij k_j: block (tile, bh) as in forward */
template <int R>
static __global__ void tfm__k_attn_dq_tiled(tfm__attn_args a, const float *q, const float *k, const float *v,
                                            const float *lse, const int32_t *lens, const float *mask, const float *Dr,
                                            const float *one, float *dq, int lddq, const float *dout, int lddo) {
    TFM__SHARED_DYN(float, sm);
    int D = a.D, QB = 4 * R, tiles = (a.Tq + QB - 1) / QB, bh = (int)blockIdx.x / tiles, b = bh / a.H, h = bh % a.H;
    int i0 = ((int)blockIdx.x % tiles) * QB, nq = TFM__MIN(QB, a.Tq - i0), lane = (int)threadIdx.x & 31;
    int w = (int)threadIdx.x >> 5, n[R], lo[R], n_max, lo_min, r, c, j0, jj;
    float *sq = sm, *sdo = sq + QB * D, *sk = sdo + QB * D, *sv = sk + TFM__CU_TW * (D + 1);
    float acc[R][TFM__CU_TD / 32], L[R], dqk[R], ddv[R];
    const float *kh = k + (int64_t)b * a.Tk * a.ldk + tfm__attn_kv_head(&a, h) * D;
    const float *vh = v + (int64_t)b * a.Tk * a.ldv + tfm__attn_kv_head(&a, h) * D;
    tfm__cu_attn_ptrs(&a, q, k, v, NULL, NULL, lens, NULL, NULL, mask);
    TFM__UNROLL
    for (r = 0; r < R; r++) {
        int i = i0 + w * R + r;
        L[r] = i < a.Tq ? lse[(int64_t)bh * a.Tq + i] : -INFINITY;
        n[r] = L[r] == -INFINITY ? 0 : tfm__attn_visible(&a, b, i);
        lo[r] = n[r] ? tfm__attn_window_lo(&a, b, i) : 0;
        TFM__UNROLL
        for (c = 0; c < TFM__CU_TD / 32; c++) acc[r][c] = 0.0f;
    }
    tfm__cu_attn_span(&a, b, i0, nq, &n_max, &lo_min);
    tfm__cu_tile_load(sq, D, q + ((int64_t)b * a.Tq + i0) * a.ldq + h * D, a.ldq, nq, D);
    tfm__cu_tile_load(sdo, D, dout + ((int64_t)b * a.Tq + i0) * lddo + h * D, lddo, nq, D);
    for (j0 = 0; j0 < n_max; j0 += TFM__CU_TW) {
        int nk = TFM__MIN(TFM__CU_TW, n_max - j0);
        if (j0 >= a.sinks && j0 + nk <= lo_min) continue;
        tfm__cu_tile_load(sk, D + 1, kh + (int64_t)j0 * a.ldk, a.ldk, nk, D);
        tfm__cu_tile_load(sv, D + 1, vh + (int64_t)j0 * a.ldv, a.ldv, nk, D);
        __syncthreads();
        tfm__cu_tile_dots<R, 1>(lane < nk, dqk, sk + lane * (D + 1), sq + w * R * D, ddv, sv + lane * (D + 1),
                                sdo + w * R * D, D);
        TFM__UNROLL
        for (r = 0; r < R; r++) {
            int i = i0 + w * R + r, j = j0 + lane;
            float pd = 0.0f, ds = 0.0f;
            if (lane < nk && tfm__cu_attn_sees(&a, j, n[r], lo[r]))
                tfm__cu_attn_grad(&a, b, bh, i, j, dqk[r], ddv[r], L[r], Dr[(int64_t)bh * a.Tq + i],
                                  one[(int64_t)bh * a.Tq + i], 0, &pd, &ds);
            for (jj = 0; jj < nk; jj++) {
                float dsj = __shfl_sync(0xffffffffu, ds, jj);
                TFM__UNROLL
                for (c = 0; c < TFM__CU_TD / 32; c++)
                    if (lane + 32 * c < D) acc[r][c] += dsj * sk[jj * (D + 1) + lane + 32 * c];
            }
        }
        __syncthreads();
    }
    TFM__UNROLL
    for (r = 0; r < R; r++) {
        int i = i0 + w * R + r;
        if (i >= a.Tq) continue;
        TFM__UNROLL
        for (c = 0; c < TFM__CU_TD / 32 && lane + 32 * c < D; c++)
            dq[((int64_t)b * a.Tq + i) * lddq + h * D + lane + 32 * c] += a.scale * acc[r][c];
    }
}

/* dv_j += sum_i pd_ij dout_i, dk_j += scale sum_i ds_ij q_i: block (tile, b * Hkv + g) holds 4R keys of key/value
   head g and runs over the queries of each head of g's group in turn, in tiles of 32 (dk or dv may be NULL) */
template <int R>
static __global__ void tfm__k_attn_dkv_tiled(tfm__attn_args a, const float *q, const float *k, const float *v,
                                             const float *lse, const int32_t *lens, const float *mask, const float *Dr,
                                             const float *one, float *dk, int lddk, float *dv, int lddv,
                                             const float *dout, int lddo) {
    TFM__SHARED_DYN(float, sm);
    TFM__SHARED(int, sn, TFM__CU_TW);
    TFM__SHARED(int, slo, TFM__CU_TW);
    int Hkv = a.Hkv ? a.Hkv : a.H, G = a.H / Hkv, D = a.D, KB = 4 * R, tiles = (a.Tk + KB - 1) / KB;
    int bg = (int)blockIdx.x / tiles, b = bg / Hkv, g = bg % Hkv, j0 = ((int)blockIdx.x % tiles) * KB;
    int nk = TFM__MIN(KB, a.Tk - j0), lane = (int)threadIdx.x & 31, w = (int)threadIdx.x >> 5;
    int i_lo = 0, i1 = a.Tq, q0, r, c, h, ii;
    float *sk = sm, *sv = sk + KB * D, *sq = sv + KB * D, *sdo = sq + TFM__CU_TW * (D + 1);
    float adk[R][TFM__CU_TD / 32], adv[R][TFM__CU_TD / 32], dqk[R], ddv[R], L = 0.0f, Dri = 0.0f, onei = 0.0f;
    tfm__cu_attn_ptrs(&a, q, k, v, NULL, NULL, lens, NULL, NULL, mask);
    TFM__UNROLL
    for (r = 0; r < R; r++)
        TFM__UNROLL
        for (c = 0; c < TFM__CU_TD / 32; c++) adk[r][c] = adv[r][c] = 0.0f;
    tfm__cu_tile_load(sk, D, k + ((int64_t)b * a.Tk + j0) * a.ldk + g * D, a.ldk, nk, D);
    tfm__cu_tile_load(sv, D, v + ((int64_t)b * a.Tk + j0) * a.ldv + g * D, a.ldv, nk, D);
    /* causal: only the queries from key j0 on see these keys; with a window, only up to the last key's window
       (a sink: every query from it on) */
    if (a.causal && !a.q_off) i_lo = TFM__MIN(j0, a.Tq);
    if (a.window && a.causal && !a.q_off && j0 >= a.sinks)
        i1 = TFM__MIN(a.Tq, j0 + nk - 1 + a.window);
    for (h = g * G; h < g * G + G; h++) {
        int bh = b * a.H + h;
        const float *qh = q + (int64_t)b * a.Tq * a.ldq + h * D, *doh = dout + (int64_t)b * a.Tq * lddo + h * D;
        for (q0 = i_lo; q0 < i1; q0 += TFM__CU_TW) {
            int nq = TFM__MIN(TFM__CU_TW, i1 - q0), i = q0 + lane;
            __syncthreads(); /* the last tile is read */
            tfm__cu_tile_load(sq, D + 1, qh + (int64_t)q0 * a.ldq, a.ldq, nq, D);
            tfm__cu_tile_load(sdo, D + 1, doh + (int64_t)q0 * lddo, lddo, nq, D);
            if (threadIdx.x < (unsigned)nq) {
                int t = (int)threadIdx.x, it = q0 + t;
                sn[t] = lse[(int64_t)bh * a.Tq + it] == -INFINITY ? 0 : tfm__attn_visible(&a, b, it);
                slo[t] = tfm__attn_window_lo(&a, b, it);
            }
            if (lane < nq) {
                L = lse[(int64_t)bh * a.Tq + i];
                Dri = Dr[(int64_t)bh * a.Tq + i];
                onei = one[(int64_t)bh * a.Tq + i];
            }
            __syncthreads();
            tfm__cu_tile_dots<R, 1>(lane < nq, dqk, sq + lane * (D + 1), sk + w * R * D, ddv, sdo + lane * (D + 1),
                                    sv + w * R * D, D);
            TFM__UNROLL
            for (r = 0; r < R; r++) {
                int j = j0 + w * R + r;
                float pd = 0.0f, ds = 0.0f;
                if (w * R + r < nk && lane < nq && tfm__cu_attn_sees(&a, j, sn[lane], slo[lane]))
                    tfm__cu_attn_grad(&a, b, bh, i, j, dqk[r], ddv[r], L, Dri, onei, 0, &pd, &ds);
                for (ii = 0; ii < nq; ii++) {
                    float pdi = __shfl_sync(0xffffffffu, pd, ii), dsi = __shfl_sync(0xffffffffu, ds, ii);
                    TFM__UNROLL
                    for (c = 0; c < TFM__CU_TD / 32; c++)
                        if (lane + 32 * c < D) {
                            adv[r][c] += pdi * sdo[ii * (D + 1) + lane + 32 * c];
                            adk[r][c] += dsi * sq[ii * (D + 1) + lane + 32 * c];
                        }
                }
            }
        }
    }
    TFM__UNROLL
    for (r = 0; r < R; r++) {
        int j = j0 + w * R + r;
        if (w * R + r >= nk) continue;
        TFM__UNROLL
        for (c = 0; c < TFM__CU_TD / 32 && lane + 32 * c < D; c++) {
            if (dv) dv[((int64_t)b * a.Tk + j) * lddv + g * D + lane + 32 * c] += adv[r][c];
            if (dk) dk[((int64_t)b * a.Tk + j) * lddk + g * D + lane + 32 * c] += a.scale * adk[r][c];
        }
    }
}

/* -- launchers: the dispatch entries' CUDA side (arguments checked by the public functions) -- */

static void tfm__zero_cuda(float *x, int64_t n) {
    if (n > 0 && tfm__cu_op("cudaMemsetAsync", x, n))
        (void)tfm__cuda_ok(cudaMemsetAsync(x, 0, (size_t)n * sizeof(float), tfm__cu.stream), "cudaMemsetAsync");
}

/* Whether p is host memory (pageable or pinned) and not the device's. */
static int tfm__cuda_is_host(const void *p) {
    cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return at.type == cudaMemoryTypeUnregistered || at.type == cudaMemoryTypeHost;
}

/* Either side may be host memory (a batch's inputs, a tensor copy); a broadcast row (lds 0) or an add is
   a kernel on device memory. Rows from host memory of up to a quarter of the staging ring go through it
   (tfm__cuda_stage), packed: their copy does not wait for the GPU, and a captured step may hold it. */
static void tfm__copy_rows_cuda(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t n, int64_t C, int add) {
    size_t row = (size_t)C * sizeof(float);
    if (n <= 0 || C <= 0) return;
    if (!add && lds >= C && (size_t)n * row <= TFM__CU_STAGE / 4 && tfm__cuda_is_host(src)) {
        unsigned char *st = tfm__cuda_stage((size_t)n * row);
        int64_t r;
        if (!st) return;
        for (r = 0; r < n; r++) memcpy(st + (size_t)r * row, src + r * lds, row);
        if (tfm__cu_op("cudaMemcpy2DAsync (host to device)", dst, ldd, st, row, n))
            (void)tfm__cuda_ok(cudaMemcpy2DAsync(dst, (size_t)ldd * sizeof(float), st, row, row, (size_t)n,
                                                 cudaMemcpyHostToDevice, tfm__cu.stream),
                               "cudaMemcpy2DAsync (host to device)");
        return;
    }
    if (!add && lds == C && ldd == C) {
        if (tfm__cu_op("cudaMemcpyAsync", dst, src, n, C))
            (void)tfm__cuda_ok(cudaMemcpyAsync(dst, src, (size_t)(n * C) * sizeof(float), cudaMemcpyDefault, tfm__cu.stream),
                               "cudaMemcpyAsync");
        return;
    }
    if (!add && lds >= C && ldd >= C) {
        if (tfm__cu_op("cudaMemcpy2DAsync", dst, ldd, src, lds, n, C))
            (void)tfm__cuda_ok(cudaMemcpy2DAsync(dst, (size_t)ldd * sizeof(float), src, (size_t)lds * sizeof(float),
                                                 (size_t)C * sizeof(float), (size_t)n, cudaMemcpyDefault, tfm__cu.stream),
                               "cudaMemcpy2DAsync");
        return;
    }
    TFM__LAUNCH(tfm__k_copy_rows, tfm__cu_grid2(n, C), tfm__cu_block2(C), 0, dst, ldd, src, lds, (int64_t)0, n, C,
                add ? TFM__COPY_ADD : 0, (const int64_t *)NULL, (int64_t)1);
    TFM__CU_LAUNCHED("tfm__k_copy_rows");
}

/* drow (host memory, B row offsets) staged on the device: one launch for every group, where a copy per
   group would cost one call each (a decoding step's cache store, B rows a layer) */
static void tfm__scatter_rows_cuda(float *dst, int64_t ldd, const int64_t *drow, const float *src, int64_t lds, int64_t B,
                                   int64_t n, int64_t C) {
    size_t off = 0;
    unsigned char *ws;
    const int64_t *d;
    if (B <= 0 || n <= 0 || C <= 0) return;
    if (B == 1 && !tfm__cu.recording) { /* (a recorded step's offsets are staged, so that its copy is the same) */
        tfm__copy_rows_cuda(dst + drow[0] * ldd, ldd, src, lds, n, C, 0);
        return;
    }
    if (!(ws = tfm__cuda_ws(TFM__CU_ROUND(B * sizeof(int64_t))))) return;
    d = (const int64_t *)tfm__cuda_put_kept(ws, &off, drow, (size_t)B * sizeof(int64_t));
    if (tfm__cu.failed) return; /* never write through offsets that did not arrive */
    TFM__LAUNCH(tfm__k_copy_rows, tfm__cu_grid2(B * n, C), tfm__cu_block2(C), 0, dst, ldd, src, lds, (int64_t)0, B * n, C, 0,
                d, n);
    TFM__CU_LAUNCHED("tfm__k_copy_rows");
}

/* n rows of C into dst (rows of ldd): ldsb 0, src's fp32 rows (of ldd; src may be dst) rounded to bf16; else
   src's bf16 rows of ldsb, widened */
static void tfm__bf16_rows_cuda(float *dst, int64_t ldd, const float *src, int64_t ldsb, int64_t n, int64_t C) {
    if (n <= 0 || C <= 0) return;
    TFM__LAUNCH(tfm__k_copy_rows, tfm__cu_grid2(n, C), tfm__cu_block2(C), 0, dst, ldd, src, ldd, ldsb, n, C,
                ldsb ? 0 : TFM__COPY_ROUND, (const int64_t *)NULL, (int64_t)1);
    TFM__CU_LAUNCHED("tfm__k_copy_rows");
}

/* bf16 operands of a product: batch matrices of rows x cols floats (stride ss, rows of lds; ss 0: one
   matrix for all) into bf16 rows of ldd (a multiple of 8 elements, so that the tensor cores' loads stay
   aligned), matrix after matrix. Returns the stride between them (0 for a shared one). */
static int64_t tfm__bf16_operand_cuda(uint16_t *dst, int64_t ldd, const float *src, int64_t lds, int64_t ss, int64_t rows,
                                      int64_t cols, int batch) {
    int64_t nb = ss ? batch : 1, n = nb * rows * cols;
    int flat = lds == cols && ldd == cols && (nb == 1 || ss == rows * cols);
    TFM__LAUNCH(tfm__k_to_bf16, flat ? dim3(tfm__cu_grid_u(n)) : tfm__cu_grid2(n / cols, cols),
                flat ? TFM__CU_THREADS : tfm__cu_block2(cols), 0, dst, ldd, src, lds, ss, rows, cols, n, flat);
    TFM__CU_LAUNCHED("tfm__k_to_bf16");
    return ss ? rows * ldd : 0;
}

/* An operand of bf16 products for tfm__bf16_operands_cuda: batch matrices of rows x cols floats at src (stride ss,
   rows of lds; ss 0: one matrix for all), or, bf set, one matrix already bf16 (rows of lds bf16 elements). It
   fills in the bf16 operand: out (bf16 elements behind a float pointer, as tfm__gemm_cuda takes them), its
   rows' ld and its stride between matrices. room (one matrix): only the room for it is made, and the caller
   writes the rounded rows (a kernel that reads src anyway). */
typedef struct {
    const float *src;
    int64_t lds, ss, rows, cols;
    int bf;
    const float *out;
    int64_t ld, stride;
    int room;
} tfm__bf16_op;

/* Rounds the n operands not bf16 already into one tfm__cuda_bf buffer, one after another; those that are
   stay where they are. 0 when the buffer cannot be had. */
static int tfm__bf16_operands_cuda(tfm__bf16_op *op, int n, int batch) {
    size_t total = 0, off = 0;
    uint16_t *buf = NULL;
    int i;
    for (i = 0; i < n; i++) {
        op[i].ld = op[i].bf ? op[i].lds : tfm__bf16_ld(op[i].cols);
        if (!op[i].bf) total += TFM__CU_ROUND((op[i].ss ? batch : 1) * op[i].rows * op[i].ld);
    }
    if (total && !(buf = tfm__cuda_bf(total))) return 0;
    for (i = 0; i < n; i++) {
        op[i].out = op[i].src;
        op[i].stride = 0;
        if (op[i].bf) continue;
        op[i].out = (const float *)(void *)(buf + off);
        TFM_ASSERT(!op[i].room || !op[i].ss);
        if (!op[i].room)
            op[i].stride = tfm__bf16_operand_cuda(buf + off, op[i].ld, op[i].src, op[i].lds, op[i].ss, op[i].rows,
                                                  op[i].cols, batch);
        off += TFM__CU_ROUND((op[i].ss ? batch : 1) * op[i].rows * op[i].ld);
    }
    return 1;
}

/* The n floats of device memory at lo (a model's parameters) rounded to bf16 for a generation call
   (tfm__bf16_w): the twin, or one with bf NULL when the thread's space for it cannot be had (the products
   then round their operands as usual; not an error). The space grows here, outside any capture. */
static tfm__bf16_twin tfm__bf16_weights_cuda(const float *lo, int64_t n) {
    tfm__bf16_twin w = {lo, n, NULL};
    size_t bytes = (size_t)n * sizeof(uint16_t);
    if (n <= 0 || tfm__cu.failed || tfm__cu.capturing) return w;
    if (!tfm__cuda_grow(&tfm__cu.wbf, &tfm__cu.wbf_size, bytes, "cudaMalloc (bf16 weights)")) {
        tfm__cu.failed = 0; /* (it was 0 before: the products round as usual, no error) */
        (void)cudaGetLastError();
        return w;
    }
    (void)tfm__bf16_operand_cuda((uint16_t *)tfm__cu.wbf, n, lo, n, 0, 1, n, 1);
    w.bf = (const uint16_t *)tfm__cu.wbf;
    return w;
}

/* The bf16 twin of a product's operand at src (rows x cols, rows of ld floats, stride s between matrices)
   when a generation call holds the weights' (tfm__bf16_w) and the operand is one matrix inside them whose
   rows start on 16 bytes, as the tensor cores load them; NULL else. */
static const float *tfm__bf16_w_of(const float *src, int64_t ld, int64_t s, int64_t rows, int64_t cols) {
    const tfm__bf16_twin *w = &tfm__bf16_w;
    int64_t o;
    if (!w->bf || s || src < w->lo || src >= w->lo + w->n) return NULL;
    o = src - w->lo;
    if (o % 8 || ld % 8 || o + (rows - 1) * ld + cols > w->n) return NULL;
    return (const float *)(const void *)(w->bf + o);
}

/* The alignment of p in bytes, up to 256: cuBLASLt's heuristic assumes 256 unless told less */
static uint32_t tfm__cu_align(const void *p) {
    uint32_t a = 256;
    while (a > 1 && (uintptr_t)p % a) a >>= 1;
    return a;
}

/* Column-major D = op(A) op(B) + bias, m x n (as cuBLAS takes a row-major product: tfm__gemm_cuda), the bias's
   m floats added to every column, as one cuBLASLt product whose epilogue adds it (CUBLASLT_EPILOGUE_BIAS) in
   fp32 to the fp32 sums: D is written once, where a fill with the bias and a product adding to it (beta 1)
   wrote it twice and read it once (8 bytes an element: a linear map's output, q|k|v's included). A and B
   bf16 (bf) or fp32; prec TFM_PREC_TF32: TF32 sums. dbf: D is bf16 (ldd in its elements), the sum with the
   bias rounded to it once (bf16 A and B only); only then may bias be NULL (no epilogue: the sums rounded).
   The algorithm cuBLASLt's heuristic picks for the
   shapes, strides, pointers' alignments and work space is kept, and so is an answer of none
   (TFM__CU_LT_PICKS a thread, the oldest replaced). Returns 0, having queued nothing, when cuBLASLt or an
   algorithm cannot be had (the caller adds the bias its own way); 1 when the product is queued (or is in
   a dry run's record; a failure is the thread's error). */
static int tfm__gemm_bias_lt(cublasOperation_t oa, cublasOperation_t ob, int m, int n, int k, const void *A, int lda,
                             const void *B, int ldb, void *D, int ldd, const float *bias, int prec, int bf, int dbf) {
    tfm__cuda_ctx *c = &tfm__cu;
    cublasLtHandle_t h = tfm__cuda_lt();
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cudaDataType_t t = bf ? CUDA_R_16BF : CUDA_R_32F, td = dbf ? CUDA_R_16BF : CUDA_R_32F;
    int32_t ta = (int32_t)oa, tb = (int32_t)ob, bt = (int32_t)CUDA_R_32F;
    uint32_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, al[4];
    uint64_t ws;
    int key[15], i, pick = -1, ok = 0;
    float one = 1.0f, zero = 0.0f;
    TFM_ASSERT(bias || dbf);
    if (!h || m <= 0 || n <= 0 || k <= 0) return 0;
    if (!c->blas_ws && !c->capturing && cudaMalloc(&c->blas_ws, TFM__CU_BLAS_WS) != cudaSuccess) {
        c->blas_ws = NULL; /* the products take no work space */
        (void)cudaGetLastError();
    }
    ws = c->blas_ws ? TFM__CU_BLAS_WS : 0;
    al[0] = tfm__cu_align(A), al[1] = tfm__cu_align(B), al[2] = tfm__cu_align(D), al[3] = tfm__cu_align(bias);
    key[0] = prec, key[1] = ta, key[2] = tb, key[3] = m, key[4] = n, key[5] = k, key[6] = lda, key[7] = ldb;
    key[8] = ldd, key[9] = (int)al[0], key[10] = (int)al[1], key[11] = (int)al[2], key[12] = (int)al[3], key[13] = ws != 0;
    key[14] = dbf;
    for (i = 0; i < TFM__CU_LT_PICKS && pick < 0; i++)
        if (!memcmp(c->lt_pick[i].key, key, sizeof key)) pick = i;
    if (pick >= 0 && !c->lt_pick[pick].ok) return 0;
    if (cublasLtMatmulDescCreate(&op, prec == TFM_PREC_TF32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                                 CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) {
        op = NULL;
        goto done;
    }
    if (cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) != CUBLAS_STATUS_SUCCESS ||
        (bias && (cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias) != CUBLAS_STATUS_SUCCESS ||
                  cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt) != CUBLAS_STATUS_SUCCESS)))
        goto done;
    /* the layouts as stored: op(A) is m x k, op(B) k x n */
    if (cublasLtMatrixLayoutCreate(&la, t, oa == CUBLAS_OP_N ? m : k, oa == CUBLAS_OP_N ? k : m, lda) != CUBLAS_STATUS_SUCCESS)
        la = NULL;
    if (cublasLtMatrixLayoutCreate(&lb, t, ob == CUBLAS_OP_N ? k : n, ob == CUBLAS_OP_N ? n : k, ldb) != CUBLAS_STATUS_SUCCESS)
        lb = NULL;
    if (cublasLtMatrixLayoutCreate(&ld, td, (uint64_t)m, (uint64_t)n, ldd) != CUBLAS_STATUS_SUCCESS) ld = NULL;
    if (!la || !lb || !ld) goto done;
    if (pick < 0) { /* ask the heuristic once for these */
        cublasLtMatmulHeuristicResult_t r;
        int got = 0;
        tfm__cu_lt_pick *p = &c->lt_pick[c->lt_next];
        if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) {
            pref = NULL;
            goto done;
        }
        memset(&r, 0, sizeof r);
        if (cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) ||
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al[0], sizeof al[0]) ||
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al[1], sizeof al[1]) ||
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al[2], sizeof al[2]) ||
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al[2], sizeof al[2]))
            goto done;
        c->lt_next = (c->lt_next + 1) % TFM__CU_LT_PICKS;
        memcpy(p->key, key, sizeof key);
        p->ok = cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, ld, ld, pref, 1, &r, &got) == CUBLAS_STATUS_SUCCESS && got > 0 &&
                r.state == CUBLAS_STATUS_SUCCESS && r.workspaceSize <= ws;
        p->algo = r.algo;
        pick = (int)(p - c->lt_pick);
        if (!p->ok) goto done;
    }
    ok = 1;
    if (tfm__cu_op("cublasLtMatmul", ta, tb, m, n, k, A, lda, B, ldb, D, ldd, bias, prec, bf, dbf, ws))
        (void)tfm__cublas_ok(cublasLtMatmul(h, op, &one, A, la, B, lb, &zero, D, ld, D, ld, &c->lt_pick[pick].algo,
                                            ws ? c->blas_ws : NULL, (size_t)ws, c->stream),
                             "cublasLtMatmul");
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (op) cublasLtMatmulDescDestroy(op);
    return ok;
}

/* Row-major C = alpha op(A) op(B) + beta C (batch of them, strided) is column-major C^T = op(B)^T op(A)^T:
   cuBLAS gets B first. In a model call of cfg.precision TFM_PREC_BF16 the operands are first rounded to
   bf16 (tfm__bf16_operand_cuda) and cuBLAS sums their products in fp32 on tensor cores (cublasGemmEx,
   CUBLAS_COMPUTE_32F); C stays fp32. bf: bit 1, A is bf16 already (a bf16 activation: rows of lda bf16
   elements, one matrix), bit 2 the same for B; only in such a call. A weight in a generation call is
   taken from its bf16 twin (tfm__bf16_w_of) and not rounded again. bias (N floats, or NULL; alpha 1, beta
   0, one matrix): C = op(A) op(B) + bias, each row, in one product where cuBLASLt serves it
   (tfm__gemm_bias_lt), else C filled with the bias and the product added to it; with bf's bit
   TFM__GEMM_LT_ONLY, else the product alone, and the caller adds the bias; with TFM__GEMM_OUT_BF16 (a bf16 model
   call, one matrix, alpha 1, beta 0), C is bf16 (rows of ldc bf16 elements; the sum with the bias, if any,
   rounded once) through cuBLASLt only, else nothing is written. Returns 1 when the bias is in C (with
   TFM__GEMM_OUT_BF16: when C is written). */
#define TFM__GEMM_LT_ONLY 4
#define TFM__GEMM_OUT_BF16 8
static int tfm__gemm_cuda(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda, int64_t sA,
                          const float *B, int ldb, int64_t sB, float beta, float *C, int ldc, int64_t sC, int batch,
                          int bf, const float *bias) {
    cublasHandle_t h;
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    int prec = tfm__model_prec ? tfm__model_prec : tfm__cu.tf32 ? TFM_PREC_TF32 : TFM_PREC_FP32;
    int lt_only = bf & TFM__GEMM_LT_ONLY, out_bf = (bf & TFM__GEMM_OUT_BF16) != 0;
    bf &= 3;
    TFM_ASSERT(!out_bf || (prec == TFM_PREC_BF16 && alpha == 1.0f && beta == 0.0f && batch == 1));
    TFM_ASSERT(!bf || (prec == TFM_PREC_BF16 && !(bf & 1 && sA) && !(bf & 2 && sB)));
    TFM_ASSERT(!bias || (alpha == 1.0f && beta == 0.0f && batch == 1));
    if (M <= 0 || N <= 0 || batch <= 0 || !(h = tfm__cuda_blas(prec == TFM_PREC_TF32))) return 0;
    if (prec == TFM_PREC_BF16 && K > 0) {
        const float *wa = bf & 1 ? NULL : tfm__bf16_w_of(A, lda, batch > 1 ? sA : 0, ta ? K : M, ta ? M : K);
        const float *wb = bf & 2 ? NULL : tfm__bf16_w_of(B, ldb, batch > 1 ? sB : 0, tb ? N : K, tb ? K : N);
        if (wa) A = wa, bf |= 1; /* a weight's bf16 twin (a generation call) */
        if (wb) B = wb, bf |= 2;
        tfm__bf16_op op[2] = {{A, lda, sA, ta ? K : M, ta ? M : K, bf & 1, NULL, 0, 0, 0}, /* A and B as stored */
                              {B, ldb, sB, tb ? N : K, tb ? K : N, bf & 2, NULL, 0, 0, 0}};
        if (!tfm__bf16_operands_cuda(op, 2, batch)) return 0;
        if ((bias || out_bf) && tfm__gemm_bias_lt(ob, oa, N, M, K, op[1].out, (int)op[1].ld, op[0].out, (int)op[0].ld, C, ldc,
                                                  bias, prec, 1, out_bf))
            return 1;
        if (out_bf) return 0;
        if (bias && !lt_only) tfm__copy_rows_cuda(C, ldc, bias, 0, M, N, 0), beta = 1.0f;
        if (!tfm__cu_op("cublasGemmEx", h, ob, oa, N, M, K, alpha, op[1].out, op[1].ld, op[1].stride, op[0].out, op[0].ld,
                        op[0].stride, beta, C, ldc, sC, batch))
            return bias && !lt_only;
        if (batch == 1)
            (void)tfm__cublas_ok(cublasGemmEx(h, ob, oa, N, M, K, &alpha, op[1].out, CUDA_R_16BF, (int)op[1].ld, op[0].out,
                                              CUDA_R_16BF, (int)op[0].ld, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                              CUBLAS_GEMM_DEFAULT),
                                 "cublasGemmEx");
        else
            (void)tfm__cublas_ok(cublasGemmStridedBatchedEx(h, ob, oa, N, M, K, &alpha, op[1].out, CUDA_R_16BF, (int)op[1].ld,
                                                            (long long)op[1].stride, op[0].out, CUDA_R_16BF, (int)op[0].ld,
                                                            (long long)op[0].stride, &beta, C, CUDA_R_32F, ldc, (long long)sC,
                                                            batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                                 "cublasGemmStridedBatchedEx");
        return bias && !lt_only;
    }
    if (out_bf) return 0;
    if (bias && tfm__gemm_bias_lt(ob, oa, N, M, K, B, ldb, A, lda, C, ldc, bias, prec, 0, 0)) return 1;
    if (bias && !lt_only) tfm__copy_rows_cuda(C, ldc, bias, 0, M, N, 0), beta = 1.0f;
    if (!tfm__cu_op("cublasSgemm", h, tfm__cu.blas_tf32, ob, oa, N, M, K, alpha, B, ldb, sB, A, lda, sA, beta, C, ldc, sC,
                    batch))
        return bias && !lt_only;
    if (batch == 1)
        (void)tfm__cublas_ok(cublasSgemm(h, ob, oa, N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc), "cublasSgemm");
    else
        (void)tfm__cublas_ok(cublasSgemmStridedBatched(h, ob, oa, N, M, K, &alpha, B, ldb, (long long)sB, A, lda,
                                                       (long long)sA, &beta, C, ldc, (long long)sC, batch),
                             "cublasSgemmStridedBatched");
    return bias && !lt_only;
}

/* da[c] += sum_r dy xhat (x given: layernorm's weight gradient), db[c] += sum_r dy, for dy = src (N rows of
   stride lds; ldsb > 0: bf16 rows of ldsb) through tfm__k_colsum_part and tfm__k_colsum_fin; either of da, db may
   be NULL. out (not NULL; da
   NULL): dy is an activation's backward (act, x its input: rows of C, or bf16 rows of ldxb when that is not 0),
   written to out in bf16 too (tfm__k_colsum_part). */
static void tfm__colsums_cuda(float *da, float *db, const float *src, int64_t lds, int64_t ldsb, const float *x, int64_t ldxb,
                              const float *mean, const float *rstd, int rms, int act, uint16_t *out, int64_t ldo, int64_t N,
                              int64_t C) {
    int64_t rows = TFM__MAX((int64_t)128, (N + 65534) / 65535), n_part = (N + rows - 1) / rows;
    float *part;
    TFM_ASSERT(!(out && da));
    if (N <= 0 || C <= 0 || (!da && !db && !out)) return;
    part = (float *)(void *)tfm__cuda_ws((size_t)n_part * 2 * (size_t)C * sizeof(float));
    if (!part) return;
    TFM__LAUNCH(tfm__k_colsum_part, dim3((unsigned)((C + 31) / 32), (unsigned)n_part), 256, 0, part, src, lds, ldsb, x, ldxb,
                mean, rstd, rms, act, out, ldo, N, C, rows);
    TFM__CU_LAUNCHED("tfm__k_colsum_part");
    if (!da && !db) return;
    TFM__LAUNCH(tfm__k_colsum_fin, (unsigned)((C + 31) / 32), 256, 0, da, db, part, n_part, C);
    TFM__CU_LAUNCHED("tfm__k_colsum_fin");
}

/* xbf: x is a bf16 activation (rows of ldx bf16 elements) */
static void tfm__linear_forward_cuda(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w, const float *b,
                                     int64_t N, int64_t I, int64_t O, int xbf) {
    tfm__gemm_cuda(0, 1, (int)N, (int)O, (int)I, 1.0f, x, (int)ldx, 0, w, (int)I, 0, 0.0f, y, (int)ldy, 0, 1, xbf ? 1 : 0, b);
}

/* bf: bit 1, x is a bf16 activation (rows of ldx bf16 elements); bit 2, dy is (rows of lddy; the bias's sums
   read it so). In a bf16 model call dy is an operand of both products: it is rounded once, with w and x, and
   both take the rounded operands (each rounded dy itself before: the same bits); with a bias and an fp32
   dy, the pass of its column sums, which reads dy anyway, writes the rounded copy (one read of dy and a
   launch fewer: the same bits). Bit 4 (dx_beta 0): there, dx may be written as a bf16 activation (rows of
   tfm__bf16_ld(I)) through cuBLASLt; returns 1 when it was (else it is fp32, rows of lddx). */
static int tfm__linear_backward_cuda(float *dx, int64_t lddx, float dx_beta, float *dw, float *db, const float *dy,
                                     int64_t lddy, const float *x, int64_t ldx, const float *w, int64_t N, int64_t I,
                                     int64_t O, int bf) {
    int dxbf = 0;
    TFM_ASSERT(!(bf & 4) || dx_beta == 0.0f);
    if (dx && dw && N > 0 && I > 0 && O > 0 && tfm__model_prec == TFM_PREC_BF16 && !tfm__bf16_acts_off) {
        int sums = db && !(bf & 2);
        tfm__bf16_op op[3] = {{dy, lddy, 0, N, O, bf & 2, NULL, 0, 0, sums}, {w, I, 0, O, I, 0, NULL, 0, 0, 0},
                              {x, ldx, 0, N, I, bf & 1, NULL, 0, 0, 0}};
        if (!tfm__bf16_operands_cuda(op, 3, 1)) return 0;
        if (sums) tfm__colsums_cuda(NULL, db, dy, lddy, 0, NULL, 0, NULL, NULL, 0, 0, (uint16_t *)(void *)op[0].out, op[0].ld, N, O);
        if (sums) db = NULL;
        if (bf & 4)
            dxbf = tfm__gemm_cuda(0, 0, (int)N, (int)I, (int)O, 1.0f, op[0].out, (int)op[0].ld, 0, op[1].out, (int)op[1].ld, 0,
                                  0.0f, dx, (int)tfm__bf16_ld(I), 0, 1, 3 | TFM__GEMM_OUT_BF16, NULL);
        if (!dxbf)
            tfm__gemm_cuda(0, 0, (int)N, (int)I, (int)O, 1.0f, op[0].out, (int)op[0].ld, 0, op[1].out, (int)op[1].ld, 0, dx_beta,
                           dx, (int)lddx, 0, 1, 3, NULL);
        tfm__gemm_cuda(1, 0, (int)O, (int)I, (int)N, 1.0f, op[0].out, (int)op[0].ld, 0, op[2].out, (int)op[2].ld, 0, 1.0f, dw,
                       (int)I, 0, 1, 3, NULL);
    } else {
        if (dx)
            tfm__gemm_cuda(0, 0, (int)N, (int)I, (int)O, 1.0f, dy, (int)lddy, 0, w, (int)I, 0, dx_beta, dx, (int)lddx, 0, 1,
                           bf & 2 ? 1 : 0, NULL);
        if (dw)
            tfm__gemm_cuda(1, 0, (int)O, (int)I, (int)N, 1.0f, dy, (int)lddy, 0, x, (int)ldx, 0, 1.0f, dw, (int)I, 0, 1,
                           (bf & 2 ? 1 : 0) | (bf & 1 ? 2 : 0), NULL);
    }
    if (db) tfm__colsums_cuda(NULL, db, dy, lddy, bf & 2 ? lddy : 0, NULL, 0, NULL, NULL, 0, 0, NULL, 0, N, O);
    return dxbf;
}

static void tfm__softmax_cuda(float *y, const float *x, int64_t N, int64_t C, int log) {
    if (N <= 0) return;
    TFM__LAUNCH(tfm__k_softmax, (unsigned)N, tfm__cu_held_threads(C), 0, y, x, C, log);
    TFM__CU_LAUNCHED("tfm__k_softmax");
}
static void tfm__softmax_bwd_cuda(float *dx, const float *dy, const float *y, int64_t N, int64_t C, int log) {
    if (N <= 0) return;
    TFM__LAUNCH(tfm__k_softmax_bwd, (unsigned)N, tfm__cu_held_threads(C), 0, dx, dy, y, C, log);
    TFM__CU_LAUNCHED("tfm__k_softmax_bwd");
}

/* The mean of the rows' losses (host memory; NULL: none yet) over the counted rows (t[r] != ignore),
   summed in row order in double; *counted (may be NULL) their number. */
static float tfm__cu_loss_mean(const float *rowloss, const int32_t *t, int ignore, int64_t N, int64_t *counted) {
    double total = 0.0;
    int64_t r, nvalid = 0;
    for (r = 0; r < N; r++)
        if (t[r] != ignore) {
            if (rowloss) total += rowloss[r];
            nvalid++;
        }
    if (counted) *counted = nvalid;
    return nvalid ? (float)(total / (double)nvalid) : 0.0f;
}

/* The loss's gradient factor dloss / (nvalid, the counted rows, at least 1) in *g; its staged copy while a
   step is recorded (tfm__cuda_step_scalar: it changes with the batch's count), else NULL. */
static const float *tfm__cu_xent_factor(float *g, float dloss, int64_t nvalid) {
    *g = dloss / (float)(nvalid ? nvalid : 1);
    return (const float *)tfm__cuda_step_scalar(g, sizeof *g);
}

/* The mean loss over the counted rows (tfm__cu_loss_mean). While a training step is captured 0: the rows'
   losses are queued to the pinned tfm__cu.host, for the mean once the graph has run. dxbf (not NULL): in the
   same launch, the gradient for a loss scale of 1 there, as tfm__cross_entropy_bwd_cuda writes it with
   dxbf (one read of the logits fewer than the loss and then the gradient). xbf: x is a bf16 activation (rows of
   tfm__bf16_ld(V)), here and in tfm__cross_entropy_bwd_cuda. */
static float tfm__cross_entropy_cuda(float *lse, const float *x, int xbf, const int32_t *t, int ignore, float s,
                                     int64_t N, int64_t V, int64_t *counted, float *dxbf) {
    size_t off = 0;
    unsigned char *ws = tfm__cuda_ws(TFM__CU_ROUND(N * sizeof(int32_t)) + TFM__CU_ROUND(N * sizeof(float)));
    float *rowloss, *host, g = 0.0f;
    const float *g_at = NULL;
    int32_t *dt;
    if (counted) *counted = 0;
    if (!ws || N <= 0) return 0.0f;
    dt = (int32_t *)tfm__cuda_put(ws, &off, t, (size_t)N * sizeof(int32_t));
    rowloss = (float *)(ws + off);
    if (dxbf) {
        int64_t nvalid;
        (void)tfm__cu_loss_mean(NULL, t, ignore, N, &nvalid);
        g_at = tfm__cu_xent_factor(&g, 1.0f, nvalid);
    }
    if (tfm__cu.failed) return 0.0f; /* never index with ids that did not arrive */
    if (s != 0.0f)
        TFM__LAUNCH(tfm__k_xent<1>, (unsigned)N, tfm__cu_row_threads(V), 0, rowloss, lse, x, xbf ? tfm__bf16_ld(V) : 0, dt, ignore,
                    s, V, dxbf, g_at ? 0.0f : g, g_at, dxbf ? tfm__bf16_ld(V) : 0);
    else
        TFM__LAUNCH(tfm__k_xent<0>, (unsigned)N, tfm__cu_row_threads(V), 0, rowloss, lse, x, xbf ? tfm__bf16_ld(V) : 0, dt, ignore,
                    s, V, dxbf, g_at ? 0.0f : g, g_at, dxbf ? tfm__bf16_ld(V) : 0);
    TFM__CU_LAUNCHED("tfm__k_xent");
    if (!(host = tfm__cuda_host((size_t)N))) return 0.0f;
    if (tfm__cu.capturing) {
        if (tfm__cu_op("cudaMemcpyAsync (loss)", host, rowloss, N))
            (void)tfm__cuda_ok(cudaMemcpyAsync(host, rowloss, (size_t)N * sizeof(float), cudaMemcpyDeviceToHost, tfm__cu.stream),
                               "cudaMemcpyAsync (loss)");
        return tfm__cu_loss_mean(NULL, t, ignore, N, counted);
    }
    if (!tfm__cuda_ok(cudaMemcpy(host, rowloss, (size_t)N * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy (loss)"))
        return 0.0f;
    return tfm__cu_loss_mean(host, t, ignore, N, counted);
}

/* ids (host memory) = the argmax of each of the N rows of x; zeros when the GPU fails (error kept) */
static void tfm__argmax_cuda(int32_t *ids, const float *x, int64_t N, int64_t V) {
    unsigned char *ws;
    memset(ids, 0, (size_t)N * sizeof(int32_t));
    if (N <= 0 || !(ws = tfm__cuda_ws(TFM__CU_ROUND(N * sizeof(int32_t))))) return;
    TFM__LAUNCH(tfm__k_argmax, (unsigned)N, tfm__cu_row_threads(V), 0, (int32_t *)ws, x, V);
    TFM__CU_LAUNCHED("tfm__k_argmax");
    if (!tfm__cu.failed &&
        !tfm__cuda_ok(cudaMemcpy(ids, ws, (size_t)N * sizeof(int32_t), cudaMemcpyDeviceToHost), "cudaMemcpy (argmax)"))
        memset(ids, 0, (size_t)N * sizeof(int32_t));
}

/* dxbf: dx is written as a bf16 activation (rows of tfm__bf16_ld(V)), not added into */
static void tfm__cross_entropy_bwd_cuda(float *dx, float dloss, const float *x, int xbf, const float *lse, const int32_t *t,
                                        int ignore, float s, int64_t N, int64_t V, int dxbf) {
    size_t off = 0;
    unsigned char *ws;
    int32_t *dt;
    float g;
    const float *g_at;
    int64_t nvalid;
    (void)tfm__cu_loss_mean(NULL, t, ignore, N, &nvalid);
    if ((!nvalid && !dxbf) || N <= 0 || !(ws = tfm__cuda_ws(TFM__CU_ROUND(N * sizeof(int32_t))))) return;
    dt = (int32_t *)tfm__cuda_put(ws, &off, t, (size_t)N * sizeof(int32_t));
    g_at = tfm__cu_xent_factor(&g, dloss, nvalid);
    if (tfm__cu.failed) return;
    TFM__LAUNCH(tfm__k_xent_bwd, (unsigned)N, tfm__cu_row_threads(V), 0, dx, g_at ? 0.0f : g, g_at, x,
                xbf ? tfm__bf16_ld(V) : 0, lse, dt, ignore, s, V, dxbf ? tfm__bf16_ld(V) : 0);
    TFM__CU_LAUNCHED("tfm__k_xent_bwd");
}

/* ybf: y as a bf16 activation (rows of tfm__bf16_ld(C)), here and in tfm__add_layernorm_cuda */
static void tfm__layernorm_cuda(float *y, float *mean, float *rstd, const float *x, const float *g, const float *b,
                                float eps, int64_t N, int64_t C, int rms, int ybf) {
    if (N <= 0) return;
    TFM__LAUNCH(tfm__k_layernorm, (unsigned)N, tfm__cu_held_threads(C), 0, y, mean, rstd, x, g, b, eps, C, rms,
                ybf ? tfm__bf16_ld(C) : 0);
    TFM__CU_LAUNCHED("tfm__k_layernorm");
}

static void tfm__add_layernorm_cuda(float *sum, float *y, float *mean, float *rstd, const float *a, const float *b,
                                   int bbf, const float *g, const float *bias, float eps, int64_t N, int64_t C, int rms,
                                   int ybf) {
    if (N <= 0) return;
    TFM__LAUNCH(tfm__k_add_layernorm, (unsigned)N, tfm__cu_held_threads(C), 0, sum, y, mean, rstd, a, b,
                bbf == 1 ? tfm__bf16_ld(C) : 0, bbf == 2, g, bias, eps, C, rms, ybf ? tfm__bf16_ld(C) : 0);
    TFM__CU_LAUNCHED("tfm__k_add_layernorm");
}

/* pre = x w^T (the product alone), then the bias and the activation in one pass; xbf, ybf: x, y are bf16
   activations (rows of tfm__bf16_ld(C), tfm__bf16_ld(F)). In a bf16 model call pre is rounded to bf16 after
   the bias, as a bf16 product's output is (PyTorch's autocast too): with ybf, where cuBLASLt serves it, the
   product writes pre in bf16 (rows of tfm__bf16_ld(F1), the sum with the bias rounded once) and the kernel
   reads it; else pre is fp32 and the kernel rounds it, writing it back. Returns 1 when pre is bf16. */
static int tfm__linear_act_cuda(int act, float *y, float *pre, const float *x, const float *w, const float *b, int64_t N,
                                int64_t C, int64_t F, int xbf, int ybf) {
    int64_t F1 = act == TFM_ACT_SWIGLU ? 2 * F : F, ldp = 0;
    int bfm = tfm__model_prec == TFM_PREC_BF16, xb = xbf ? 1 : 0, ldx = (int)(xbf ? tfm__bf16_ld(C) : C);
    if (N * F <= 0) return 0;
    if (ybf && tfm__bf16_store(TFM_DEVICE_CUDA, F1) && /* (ybf: a bf16 model's call) */
        tfm__gemm_cuda(0, 1, (int)N, (int)F1, (int)C, 1.0f, x, ldx, 0, w, (int)C, 0, 0.0f, pre, (int)tfm__bf16_ld(F1), 0, 1,
                       xb | TFM__GEMM_OUT_BF16, b))
        ldp = tfm__bf16_ld(F1), b = NULL;
    /* else the bias through the product's epilogue where cuBLASLt serves it (pre then stays as the product
       wrote it), or added by the activation's kernel */
    else if (tfm__gemm_cuda(0, 1, (int)N, (int)F1, (int)C, 1.0f, x, ldx, 0, w, (int)C, 0, 0.0f, pre, (int)F1, 0, 1,
                            xb | TFM__GEMM_LT_ONLY, b))
        b = NULL;
    TFM__LAUNCH(tfm__k_bias_act, tfm__cu_grid2(N, F), tfm__cu_block2(F), 0, act, y, pre, b, N, F, ybf ? tfm__bf16_ld(F) : 0,
                ldp, bfm);
    TFM__CU_LAUNCHED("tfm__k_bias_act");
    return ldp != 0;
}

static void tfm__layernorm_bwd_cuda(float *dx, const float *res, float *dg, float *db, const float *dy, const float *x,
                                    const float *g, const float *mean, const float *rstd, int64_t N, int64_t C, int rms) {
    if (N <= 0) return;
    if (dx) {
        TFM__LAUNCH(tfm__k_layernorm_bwd, (unsigned)N, tfm__cu_held_threads(C), 0, dx, res, dy, x, g, mean, rstd, C, rms);
        TFM__CU_LAUNCHED("tfm__k_layernorm_bwd");
    }
    if (dg || db) tfm__colsums_cuda(dg, db, dy, C, 0, x, 0, mean, rstd, rms, 0, NULL, 0, N, C);
}

static void tfm__act_cuda(int act, float *y, const float *x, int64_t n) {
    if (n <= 0) return;
    TFM__LAUNCH(tfm__k_act, tfm__cu_grid_u(n), TFM__CU_THREADS, 0, act, y, x, n);
    TFM__CU_LAUNCHED("tfm__k_act");
}
static void tfm__act_bwd_cuda(int act, float *dx, const float *dy, const float *x, int64_t n, float acc) {
    if (n <= 0) return;
    TFM__LAUNCH(tfm__k_act_bwd, tfm__cu_grid_u(n), TFM__CU_THREADS, 0, act, dx, dy, x, n, acc);
    TFM__CU_LAUNCHED("tfm__k_act_bwd");
}
static void tfm__swiglu_bwd_cuda(float *dh, const float *dy, int dybf, const float *h, int64_t N, int64_t F, int dhbf,
                                 int hbf) {
    if (N * F <= 0) return;
    TFM__LAUNCH(tfm__k_swiglu_bwd, tfm__cu_grid2(N, F), tfm__cu_block2(F), 0, dh, dy, dybf ? tfm__bf16_ld(F) : 0, h, N, F,
                dhbf ? tfm__bf16_ld(2 * F) : 0, hbf ? tfm__bf16_ld(2 * F) : 0);
    TFM__CU_LAUNCHED("tfm__k_swiglu_bwd");
}
static void tfm__rope_cuda(float *y, const float *x, int64_t ld, int64_t B, int64_t T, int H, int D, int rot, float base,
                           const int32_t *pos0, int inverse, int acc) {
    size_t off = 0;
    unsigned char *ws;
    const int32_t *d = NULL;
    int w = D - rot / 2; /* a head's pairs and pass-through channels */
    int64_t n = B * T * H * w, na = (pos0 ? B * T : T) * (rot / 2);
    float *cs;
    if (n <= 0) return;
    if (!(ws = tfm__cuda_ws((pos0 ? TFM__CU_ROUND(B * sizeof(int32_t)) : 0) + TFM__CU_ROUND(na * 2 * sizeof(float)))))
        return;
    if (pos0) {
        d = (const int32_t *)tfm__cuda_put_kept(ws, &off, pos0, (size_t)B * sizeof(int32_t));
        if (tfm__cu.failed) return;
    }
    cs = (float *)(ws + off);
    TFM__LAUNCH(tfm__k_rope_angles, tfm__cu_grid(na), TFM__CU_THREADS, 0, cs, T, rot / 2, rot, base, d, inverse, na);
    TFM__CU_LAUNCHED("tfm__k_rope_angles");
    if (tfm__cu.failed) return;
    TFM__LAUNCH(tfm__k_rope, tfm__cu_grid2(B * T, (int64_t)H * w), tfm__cu_block2((int64_t)H * w), 0, y, x, ld, T, H, D, rot,
                cs, pos0 != NULL, acc, B * T);
    TFM__CU_LAUNCHED("tfm__k_rope");
}

static void tfm__dropout_cuda(float *y, const float *x, int64_t n, float p, uint64_t seed, uint64_t i0, int acc) {
    const uint64_t *at;
    if (n <= 0) return;
    at = (const uint64_t *)tfm__cuda_step_scalar(&seed, sizeof seed); /* (a new seed every step) */
    if (at) seed = 0;
    TFM__LAUNCH(tfm__k_dropout, tfm__cu_grid_u(n), TFM__CU_THREADS, 0, y, x, n, tfm__drop_threshold(p),
                p < 1.0f ? 1.0f / (1.0f - p) : 0.0f, seed, at, i0, acc);
    TFM__CU_LAUNCHED("tfm__k_dropout");
}

/* The rows 0..N-1 grouped by id (a stable counting sort over [min id, max id]): rows[] in id order, the
   U distinct ids in uid[] and where each one's rows start in ustart[] (U + 1 entries), all in one host
   array h (3 N + 2 ints, U the last); U is returned, -1 when the counts cannot be allocated. */
static int64_t tfm__group_ids(const int32_t *ids, int64_t N, int32_t *h) {
    int32_t lo = ids[0], hi = ids[0], *rows = h, *uid = h + N, *ustart = h + 2 * N, *cnt;
    int64_t r, k, U = 0;
    for (r = 1; r < N; r++) lo = ids[r] < lo ? ids[r] : lo, hi = ids[r] > hi ? ids[r] : hi;
    cnt = (int32_t *)TFM_MALLOC(((size_t)hi - (size_t)lo + 2) * sizeof(int32_t), NULL);
    if (!cnt) return -1;
    memset(cnt, 0, ((size_t)hi - (size_t)lo + 2) * sizeof(int32_t));
    for (r = 0; r < N; r++) cnt[ids[r] - lo + 1]++;
    for (k = 0; k <= (int64_t)hi - lo; k++) {
        if (cnt[k + 1]) uid[U] = (int32_t)(k + lo), ustart[U++] = cnt[k];
        cnt[k + 1] += cnt[k];
    }
    ustart[U] = (int32_t)N;
    h[3 * N + 1] = (int32_t)U;
    for (r = 0; r < N; r++) rows[cnt[ids[r] - lo]++] = (int32_t)r;
    TFM_FREE(cnt, NULL);
    return U;
}

static void tfm__embedding_cuda(float *y, const int32_t *ids, const float *w, float scale, int64_t N, int64_t C, int bwd) {
    size_t off = 0;
    unsigned char *ws;
    int32_t *d;
    if (N <= 0 || !(ws = tfm__cuda_ws(TFM__CU_ROUND((3 * N + 2) * sizeof(int32_t))))) return;
    if (bwd) { /* y is dw (V,C), w is dy (N,C) */
        size_t hn = (size_t)(3 * N + 2) * sizeof(int32_t);
        int32_t *h = (int32_t *)TFM_MALLOC(hn, NULL), *dh;
        if (h) memset(h, 0, hn); /* (the entries past U too: every byte is staged) */
        if (!h || tfm__group_ids(ids, N, h) < 0) {
            TFM_FREE(h, NULL);
            (void)tfm__cuda_ok(cudaErrorMemoryAllocation, "embedding backward (grouping the rows by id on the host)");
            return;
        }
        dh = (int32_t *)tfm__cuda_put(ws, &off, h, hn);
        TFM_FREE(h, NULL); /* the put has taken its bytes */
        if (tfm__cu.failed) return;
        TFM__LAUNCH(tfm__k_embedding_bwd, tfm__cu_grid(N * C), TFM__CU_THREADS, 0, y, w, (const int32_t *)dh, scale, N, C);
        TFM__CU_LAUNCHED("tfm__k_embedding_bwd");
    } else {
        d = (int32_t *)tfm__cuda_put(ws, &off, ids, (size_t)N * sizeof(int32_t));
        if (tfm__cu.failed) return;
        TFM__LAUNCH(tfm__k_embedding, tfm__cu_grid2(N, C), tfm__cu_block2(C), 0, y, d, w, scale, N, C);
        TFM__CU_LAUNCHED("tfm__k_embedding");
    }
}

/* p0 (host memory, B offsets) staged on the device: one launch for rows at their own positions */
static void tfm__pos_add_cuda(float *y, const float *x, const float *w, const int32_t *p0, int64_t B, int64_t T,
                              int64_t C) {
    const int32_t *dp0 = NULL;
    if (B * T * C <= 0) return;
    if (p0) {
        size_t off = 0;
        unsigned char *ws = tfm__cuda_ws(TFM__CU_ROUND(B * sizeof(int32_t)));
        if (!ws) return;
        dp0 = (const int32_t *)tfm__cuda_put_kept(ws, &off, p0, (size_t)B * sizeof(int32_t));
        if (tfm__cu.failed) return; /* never index with offsets that did not arrive */
    }
    TFM__LAUNCH(tfm__k_pos_add, tfm__cu_grid2(B * T, C), tfm__cu_block2(C), 0, y, x, w, dp0, B, T, C);
    TFM__CU_LAUNCHED("tfm__k_pos_add");
}

static void tfm__colsum_cuda(float *dst, const float *src, int64_t lds, int64_t N, int64_t C) {
    tfm__colsums_cuda(NULL, dst, src, lds, 0, NULL, 0, NULL, NULL, 0, 0, NULL, 0, N, C);
}

static void tfm__add_cuda(float *y, const float *a, const float *b, int64_t n) {
    if (n <= 0) return;
    TFM__LAUNCH(tfm__k_add, tfm__cu_grid_u(n), TFM__CU_THREADS, 0, y, a, b, n);
    TFM__CU_LAUNCHED("tfm__k_add");
}

static void tfm__mean_pool_cuda(float *y, const float *x, const int32_t *lens, int64_t B, int64_t T, int64_t C, int bwd) {
    size_t off = 0;
    unsigned char *ws = tfm__cuda_ws(TFM__CU_ROUND(B * sizeof(int32_t)));
    int32_t *d;
    if (!ws) return;
    d = (int32_t *)tfm__cuda_put(ws, &off, lens, (size_t)B * sizeof(int32_t));
    if (tfm__cu.failed) return;
    if (bwd) { /* y is dx (B,T,C), x is dy (B,C) */
        TFM__LAUNCH(tfm__k_mean_pool_bwd, tfm__cu_grid(B * T * C), TFM__CU_THREADS, 0, y, x, d, B, T, C);
        TFM__CU_LAUNCHED("tfm__k_mean_pool_bwd");
    } else {
        TFM__LAUNCH(tfm__k_mean_pool, tfm__cu_grid(B * C), TFM__CU_THREADS, 0, y, x, d, B, T, C);
        TFM__CU_LAUNCHED("tfm__k_mean_pool");
    }
}

/* The jobs of ps[0..n) (n <= 256) in jt, the decay factor where ps[i].decay or decay_all (else 1), AdamW's
   step size and bias correction; returns their chunks */
static int64_t tfm__cu_jobs(tfm__cu_job *jt, const tfm_adamw_param *ps, int n, float decay, int decay_all, float step_size,
                            float bc2s) {
    int64_t c = 0;
    int i;
    memset(jt, 0, (size_t)n * sizeof *jt); /* (and the padding: the bytes are staged) */
    for (i = 0; i < n; i++) {
        jt[i].w = ps[i].value.data;
        jt[i].g = ps[i].grad.data;
        jt[i].m = ps[i].m.data;
        jt[i].v = ps[i].v.data;
        jt[i].n = tfm_numel(&ps[i].grad);
        jt[i].c0 = c;
        jt[i].decay = ps[i].decay || decay_all ? decay : 1.0f;
        jt[i].step_size = step_size;
        jt[i].bc2s = bc2s;
        c += (jt[i].n + TFM__CU_CHUNK - 1) / TFM__CU_CHUNK;
    }
    return c;
}

/* The thread's squared gradient norm on the device (tfm__sumsq_cuda), after the kept arrays */
static double *tfm__cu_sumsq(void) {
    return (double *)(void *)(tfm__cu.kept + (size_t)TFM__CU_KEEP * TFM__CU_KEEP_BYTES);
}

static void tfm__adamw_cuda(const tfm_adamw_param *ps, int n, float clip, float b1, float b2, float eps,
                            float step_size, float bc2s, float decay, int decay_all) {
    tfm__cu_job jt[256];
    int g0;
    if (!tfm__cuda_kept_space()) return; /* (tfm__cu_sumsq's slot: tfm__sumsq_cuda ran just before) */
    for (g0 = 0; g0 < n; g0 += 256) {
        int gn = TFM__MIN(256, n - g0);
        int64_t chunks = tfm__cu_jobs(jt, ps + g0, gn, decay, decay_all, step_size, bc2s);
        size_t off = 0;
        unsigned char *ws;
        const tfm__cu_job *dj;
        if (chunks == 0) continue;
        if (!(ws = tfm__cuda_ws(TFM__CU_ROUND(gn * sizeof *jt)))) return;
        dj = (const tfm__cu_job *)tfm__cuda_put(ws, &off, jt, gn * sizeof *jt);
        if (tfm__cu.failed) return;
        TFM__LAUNCH(tfm__k_adamw, (unsigned)chunks, TFM__CU_THREADS, 0, dj, gn, (const double *)tfm__cu_sumsq(), clip, b1,
                    b2, eps);
        TFM__CU_LAUNCHED("tfm__k_adamw");
    }
}

/* The sum of squares of the gradients of ps[0..n), left in the thread's device slot (tfm__cu_sumsq) for
   AdamW to read: per 256 parameters, one launch writes every chunk's partial sum (in double) and one
   adds them, each parameter's chunks in order, then the parameters in list order. Returns it read back;
   while a step is captured 0, its copy queued to the pinned tfm__cu.pin (read once the graph has run). */
static double tfm__sumsq_cuda(const tfm_adamw_param *ps, int n) {
    tfm__cu_job jt[256];
    double *dsum, total = 0.0;
    int g0;
    if (!tfm__cuda_kept_space()) return 0.0;
    dsum = tfm__cu_sumsq();
    for (g0 = 0; g0 < n; g0 += 256) {
        int gn = TFM__MIN(256, n - g0);
        int64_t chunks = tfm__cu_jobs(jt, ps + g0, gn, 1.0f, 0, 0.0f, 0.0f);
        size_t off = 0;
        unsigned char *ws = tfm__cuda_ws(TFM__CU_ROUND(gn * sizeof *jt) + (size_t)TFM__MAX(chunks, 1) * sizeof(double));
        const tfm__cu_job *dj;
        double *dpart;
        if (!ws) return 0.0;
        dj = (const tfm__cu_job *)tfm__cuda_put(ws, &off, jt, gn * sizeof *jt);
        dpart = (double *)(void *)(ws + off);
        if (tfm__cu.failed) return 0.0;
        if (chunks > 0) {
            TFM__LAUNCH(tfm__k_sumsq, (unsigned)chunks, TFM__CU_THREADS, 0, dpart, dj, gn);
            TFM__CU_LAUNCHED("tfm__k_sumsq");
        }
        TFM__LAUNCH(tfm__k_sumsq_total, 1, 256, 0, dsum, (const double *)dpart, dj, gn, chunks, g0 == 0);
        TFM__CU_LAUNCHED("tfm__k_sumsq_total");
    }
    if (tfm__cu.capturing) {
        if (tfm__cu_op("cudaMemcpyAsync (norm)", tfm__cu.pin, dsum))
            (void)tfm__cuda_ok(cudaMemcpyAsync(tfm__cu.pin, dsum, sizeof(double), cudaMemcpyDeviceToHost, tfm__cu.stream),
                               "cudaMemcpyAsync (norm)");
        return 0.0;
    }
    (void)tfm__cuda_ok(cudaMemcpy(&total, dsum, sizeof(double), cudaMemcpyDeviceToHost), "cudaMemcpy (norm)");
    return total;
}

/* The host arrays of an attention call (lengths, cache slots and offsets, mask) staged on the device, and
   in a recorded step its dropout seed (so that the step's graph replays with the next step's seed):
   t = *a with the seed's place (seed_at) and the arrays' staged copies in place of the host ones (what
   the kernels read of those is whether they are there), the args to launch with: no host address goes
   into a launch, so a generation call's steps replay the last call's graph though its host arrays are
   new. hrows: the cache's slots in host memory (the batched products' pointers). */
typedef struct tfm__cu_attn_io {
    const int32_t *lens, *rows, *qoff, *hrows;
    const float *mask;
    float *Dr;
} tfm__cu_attn_io;
static int tfm__cu_attn_stage(const tfm__attn_args *a, tfm__cu_attn_io *io, size_t extra, tfm__attn_args *t) {
    size_t B = (size_t)a->B, nmask = a->mask ? (a->mask_bs ? B : 1) * (size_t)a->Tq * (size_t)a->Tk : 0, off = 0;
    unsigned char *ws;
    memset(io, 0, sizeof *io);
    if (a->D > TFM__CU_ATT_MAX_D) {
        (void)tfm__cuda_ok(cudaErrorInvalidValue, "attention (head dimension above 2048)");
        return 0;
    }
    memcpy(t, a, sizeof *t);
    t->seed_at = NULL;
    ws = tfm__cuda_ws(3 * TFM__CU_ROUND(B * sizeof(int32_t)) + TFM__CU_ROUND(nmask * sizeof(float)) + TFM__CU_ROUND(extra));
    if (!ws) return 0;
    io->lens = (const int32_t *)tfm__cuda_put_kept(ws, &off, a->lens, B * sizeof(int32_t));
    io->rows = (const int32_t *)tfm__cuda_put_kept(ws, &off, a->kv_rows, B * sizeof(int32_t));
    io->qoff = (const int32_t *)tfm__cuda_put_kept(ws, &off, a->q_off, B * sizeof(int32_t));
    io->mask = (const float *)tfm__cuda_put(ws, &off, a->mask, nmask * sizeof(float));
    io->hrows = a->kv_rows;
    t->lens = io->lens, t->kv_rows = io->rows, t->q_off = io->qoff, t->mask = io->mask;
    if (a->dropout > 0.0f && (t->seed_at = (const uint64_t *)tfm__cuda_step_scalar(&a->seed, sizeof a->seed))) t->seed = 0;
    io->Dr = (float *)(ws + off);
    return !tfm__cu.failed;
}

/* -- attention through batched products: for heads wider than TFM__CU_TD (fp32, decoding steps included;
   or a bf16 model's calls over whole sequences), and a bf16 model's calls on a GPU without the flash
   kernels' bf16 tensor cores (before sm_80). The scores of a
   chunk of query rows against every key they may see are one cublasGemmBatchedEx over the batch-heads
   (bf16 operands on tensor cores, or fp32; fp32 sums), kept in device memory (fp32); one block per row
   applies the visibility, the mask and the softmax from its log-sum-exp, and P (bf16 or fp32) meets the
   values in a second product. Backward recomputes the chunk's P from the saved log-sum-exp and forms dv,
   dP, dS, dq and dk the same way. Chunks hold at most TFM__CU_ATT_BF_BYTES of scores (and a quarter of
   the free device memory). Causal calls stop
   each chunk's keys at its last query; a window's hidden keys are computed and then masked (O(T^2) here,
   unlike the tiled kernels). -- */
#ifndef TFM__CU_ATT_BF_BYTES
#define TFM__CU_ATT_BF_BYTES ((size_t)1 << 30)
#endif

/* A probability or score gradient into a product's operand: rounded to bf16, or kept fp32 */
static __device__ void tfm__cu_put(uint16_t *p, float v) { *p = tfm__bf16(v); }
static __device__ void tfm__cu_put(float *p, float v) { *p = v; }

/* Row r of a chunk of nq query rows from i0 (batch-head r / nq, query i0 + r % nq), kn keys, row stride
   ld: the visible scores S (the additive mask added, the rest -inf), then P = e^(S - L) in place (fp32)
   and P where dropout keeps it in pd (bf16 or fp32; the factor tfm__cu_drop_scale is the products' alpha).
   fwd: L, the row's log-sum-exp, is formed and written to lse; else read from it (backward). */
template <typename T>
static __global__ void tfm__k_attn_bp(tfm__attn_args a, float *S, T *pd, int64_t ld, int i0, int nq, int kn, float *lse,
                                      int fwd, const int32_t *lens, const int32_t *qoff, const float *mask) {
    TFM__SHARED(float, sh, 32);
    int r = (int)blockIdx.x, bh = r / nq, i = i0 + r % nq, b = bh / a.H, n, lo, j;
    float *s = S + (int64_t)r * ld, m = -INFINITY, l = 0.0f, L;
    T *p = pd + (int64_t)r * ld;
    tfm__cu_attn_ptrs(&a, NULL, NULL, NULL, NULL, NULL, lens, NULL, qoff, mask);
    n = tfm__attn_visible(&a, b, i);
    lo = tfm__attn_window_lo(&a, b, i);
    for (j = (int)threadIdx.x; j < kn; j += (int)blockDim.x) {
        float v = -INFINITY;
        if (tfm__cu_attn_sees(&a, j, n, lo)) v = s[j] + (mask ? mask[b * a.mask_bs + (int64_t)i * a.Tk + j] : 0.0f);
        s[j] = v;
        m = v > m ? v : m;
    }
    if (fwd) {
        m = tfm__cu_reduce(m, sh, 1);
        for (j = (int)threadIdx.x; j < kn; j += (int)blockDim.x)
            if (s[j] != -INFINITY) l += tfm__exp(s[j] - m);
        l = tfm__cu_reduce(l, sh, 0);
        L = l > 0.0f ? m + logf(l) : -INFINITY;
        if (threadIdx.x == 0) lse[(int64_t)bh * a.Tq + i] = L;
    } else {
        L = lse[(int64_t)bh * a.Tq + i];
    }
    for (j = (int)threadIdx.x; j < kn; j += (int)blockDim.x) {
        float e = L == -INFINITY || s[j] == -INFINITY ? 0.0f : tfm__exp(s[j] - L);
        s[j] = e;
        tfm__cu_put(p + j, tfm__cu_attn_keep(&a, bh, i, j) != 0.0f ? e : 0.0f); /* dropout's factor: on the products */
    }
}

/* The chunk's score gradients dS = P (dP keep - D_i), exactly 0 where the query sees one key (P fp32 in S,
   dP in G; rows as tfm__k_attn_bp's). */
template <typename T>
static __global__ void tfm__k_attn_bds(tfm__attn_args a, const float *S, const float *G, T *ds, int64_t ld, int i0, int nq,
                                       int kn, const float *Dr, const float *one) {
    int r = (int)blockIdx.x, bh = r / nq, i = i0 + r % nq, j;
    if (a.seed_at) a.seed = *a.seed_at;
    float Di = Dr[(int64_t)bh * a.Tq + i], on = one[(int64_t)bh * a.Tq + i];
    for (j = (int)threadIdx.x; j < kn; j += (int)blockDim.x) {
        int64_t x = (int64_t)r * ld + j;
        tfm__cu_put(ds + x, on != 0.0f ? 0.0f : S[x] * (G[x] * tfm__cu_attn_keep(&a, bh, i, j) - Di));
    }
}

/* Threads for a block that runs over a row of n: whole warps, at most 128. */
static unsigned tfm__cu_row_threads(int n) { return (unsigned)TFM__MIN(128, TFM__MAX(32, (n + 31) / 32 * 32)); }

/* One operand of a batch of products: entry e = b Hn + h (b < B, h < Hn) at base + b' sb + (h / div) sh
   elements of es bytes, rows of ld, where b' = rows[b] (a cache's slots; host memory) or b. */
typedef struct tfm__cu_bfp { const void *base; size_t es; int64_t sb, sh; int div, ld; const int32_t *rows; } tfm__cu_bfp;
static tfm__cu_bfp tfm__cu_bfp_make(const void *base, size_t es, int64_t sb, int64_t sh, int div, int ld) {
    tfm__cu_bfp o;
    o.base = base, o.es = es, o.sb = sb, o.sh = sh, o.div = div, o.ld = ld, o.rows = NULL;
    return o;
}
static const void *tfm__cu_bfp_at(const tfm__cu_bfp *o, int e, int Hn) {
    int64_t b = o->rows ? o->rows[e / Hn] : e / Hn;
    return (const char *)o->base + (b * o->sb + (int64_t)(e % Hn / o->div) * o->sh) * (int64_t)o->es;
}

/* C_e = alpha op(A_e) op(B_e) + beta C_e (row-major, as tfm__gemm_cuda) for the B Hn entries, A and B of
   type et (bf16 or fp32), C fp32, fp32 sums (no TF32): cublasGemmBatchedEx, 128 entries a call, their
   pointer arrays staged into the device space at dptr (3 x 128 pointers; the stream order keeps a later
   call from overwriting them early). */
static void tfm__gemm_batch_cuda(unsigned char *dptr, cudaDataType et, int ta, int tb, int M, int N, int K, float alpha,
                                 const tfm__cu_bfp *A, const tfm__cu_bfp *B, float beta, const tfm__cu_bfp *C, int Bn,
                                 int Hn) {
    cublasHandle_t h;
    cublasOperation_t oa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, ob = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    const void *pa[128], *pb[128];
    void *pc[128];
    int e0, e, n = Bn * Hn;
    if (M <= 0 || N <= 0 || n <= 0 || !(h = tfm__cuda_blas(0))) return;
    for (e0 = 0; e0 < n; e0 += 128) {
        int c = TFM__MIN(128, n - e0);
        size_t off = 0, bytes = (size_t)c * sizeof(void *);
        const void **da, **db;
        void **dc;
        for (e = 0; e < c; e++) {
            pa[e] = tfm__cu_bfp_at(A, e0 + e, Hn);
            pb[e] = tfm__cu_bfp_at(B, e0 + e, Hn);
            pc[e] = (void *)(uintptr_t)tfm__cu_bfp_at(C, e0 + e, Hn);
        }
        da = (const void **)tfm__cuda_put(dptr, &off, pa, bytes);
        db = (const void **)tfm__cuda_put(dptr, &off, pb, bytes);
        dc = (void **)tfm__cuda_put(dptr, &off, pc, bytes);
        if (tfm__cu.failed ||
            !tfm__cu_op("cublasGemmBatchedEx", h, tfm__cu.blas_tf32, ob, oa, N, M, K, alpha, db, da, dc, beta, c))
            return;
        (void)tfm__cublas_ok(cublasGemmBatchedEx(h, ob, oa, N, M, K, &alpha, db, et, B->ld, da, et, A->ld, &beta, dc,
                                                 CUDA_R_32F, C->ld, c, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                             "cublasGemmBatchedEx");
    }
}
#define TFM__CU_BFA_PTRS (3 * TFM__CU_ROUND(128 * sizeof(void *)))

/* The batched attention's operands and device space: q, k, v and dout as the products read them (bf16
   copies in rows of H D or Hkv D, or the caller's fp32 rows), then a chunk's scores S and score gradients G
   (fp32), P and dS (of T: bf16 or fp32), nq rows of kp (a multiple of 8) a batch-head. */
typedef struct tfm__cu_bfa {
    tfm__cu_bfp q, k, v, dout; /* entry b H + h: batch b, head h (k and v: its key/value head) */
    float *S, *G;
    void *P, *dS;
    int nq, kp, es;            /* es: bytes of an element of P, dS and the operands (2: bf16, 4: fp32) */
    cudaDataType et;
} tfm__cu_bfa;

/* Sets up w for a (dout: backward's, else NULL: no dout copy, no G or dS); bf16: the operands rounded to
   bf16 copies. 0 when the space cannot be had (error kept). */
static int tfm__cu_bfa_init(const tfm__attn_args *a, const tfm__cu_attn_io *io, tfm__cu_bfa *w, int bf16, const float *dout,
                            int lddo) {
    int Hkv = a->Hkv ? a->Hkv : a->H, G = a->H / Hkv, HD = a->H * a->D, KD = Hkv * a->D, bwd = dout != NULL;
    size_t nqd = bf16 ? TFM__CU_ROUND((size_t)a->B * a->Tq * HD * 2) : 0, nkd = bf16 ? TFM__CU_ROUND((size_t)a->B * a->Tk * KD * 2) : 0;
    size_t ndo = bwd ? nqd : 0, per, rowb, nS, nP, fixed, cap = TFM__CU_ATT_BF_BYTES, fr = 0, tot = 0;
    int64_t sbk = a->bsk ? a->bsk : (int64_t)a->Tk * a->ldk, sbv = a->bsk ? a->bsk : (int64_t)a->Tk * a->ldv;
    unsigned char *base;
    w->es = bf16 ? 2 : 4;
    w->et = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    w->kp = (a->Tk + 7) & ~7;
    per = (size_t)a->B * a->H * (size_t)w->kp; /* elements of one query row of every batch-head: S, P (G, dS) */
    rowb = (bwd ? 2 : 1) * (4 + (size_t)w->es) * per;
    fixed = nqd + ndo + 2 * nkd + 4 * 256;
    w->nq = (int)TFM__MAX((size_t)1, TFM__MIN((size_t)a->Tq, cap / rowb));
    /* chunks that do not fit the space this thread has take at most a quarter of the device memory free
       (with that space, which a larger one replaces), so that a small GPU runs more, shorter chunks */
    if (fixed + (size_t)w->nq * rowb > tfm__cu.bf_size) {
        if (!tfm__cuda_ok(cudaMemGetInfo(&fr, &tot), "cudaMemGetInfo")) return 0;
        cap = TFM__MIN(cap, (fr + tfm__cu.bf_size) / 4);
        w->nq = (int)TFM__MAX((size_t)1, TFM__MIN((size_t)a->Tq, cap / rowb));
    }
    nS = TFM__CU_ROUND(per * (size_t)w->nq * sizeof(float));
    nP = TFM__CU_ROUND(per * (size_t)w->nq * (size_t)w->es);
    if (!(base = (unsigned char *)tfm__cuda_bf((nqd + ndo + 2 * nkd + (bwd ? 2 : 1) * (nS + nP)) / 2))) return 0;
    w->S = (float *)(void *)(base + nqd + ndo + 2 * nkd);
    w->G = bwd ? w->S + nS / sizeof(float) : NULL;
    w->P = (unsigned char *)w->S + (bwd ? 2 : 1) * nS;
    w->dS = bwd ? (unsigned char *)w->P + nP : NULL;
    if (!bf16) {
        w->q = tfm__cu_bfp_make(a->q, 4, (int64_t)a->Tq * a->ldq, a->D, 1, a->ldq);
        w->k = tfm__cu_bfp_make(a->k, 4, sbk, a->D, G, a->ldk);
        w->v = tfm__cu_bfp_make(a->v, 4, sbv, a->D, G, a->ldv);
        w->dout = tfm__cu_bfp_make(dout, 4, (int64_t)a->Tq * lddo, a->D, 1, lddo);
        w->k.rows = w->v.rows = io->hrows;
        return 1;
    }
    w->q = tfm__cu_bfp_make(base, 2, (int64_t)a->Tq * HD, a->D, 1, HD);
    w->dout = tfm__cu_bfp_make(base + nqd, 2, (int64_t)a->Tq * HD, a->D, 1, HD);
    w->k = tfm__cu_bfp_make(base + nqd + ndo, 2, (int64_t)a->Tk * KD, a->D, G, KD);
    w->v = tfm__cu_bfp_make(base + nqd + ndo + nkd, 2, (int64_t)a->Tk * KD, a->D, G, KD);
    (void)tfm__bf16_operand_cuda((uint16_t *)base, HD, a->q, a->ldq, 0, (int64_t)a->B * a->Tq, HD, 1);
    (void)tfm__bf16_operand_cuda((uint16_t *)(base + nqd + ndo), KD, a->k, a->ldk, 0, (int64_t)a->B * a->Tk, KD, 1);
    (void)tfm__bf16_operand_cuda((uint16_t *)(base + nqd + ndo + nkd), KD, a->v, a->ldv, 0, (int64_t)a->B * a->Tk, KD, 1);
    if (dout) (void)tfm__bf16_operand_cuda((uint16_t *)(base + nqd), HD, dout, lddo, 0, (int64_t)a->B * a->Tq, HD, 1);
    return !tfm__cu.failed;
}

/* Operand o moved on by i0 query rows (q, dout) and to member g of each key/value head's group: entry
   b Hkv + kh of a call over the key/value heads is query head kh G + g (dv and dk, so that no two entries
   of a call add into the same rows). */
static tfm__cu_bfp tfm__cu_bfp_rows(tfm__cu_bfp o, int i0, int g, int G) {
    o.base = (const char *)o.base + ((int64_t)i0 * o.ld + (int64_t)g * o.sh) * (int64_t)o.es;
    o.sh *= G;
    return o;
}

/* The keys a chunk of nq queries from i0 may see at most: up to its last query when causal (without
   decoding offsets). */
static int tfm__cu_bfa_keys(const tfm__attn_args *a, int i0, int nq) {
    return a->causal && !a->q_off ? TFM__MIN(a->Tk, i0 + nq) : a->Tk;
}

/* S = scale q k^T for the chunk's rows of every batch-head, kn keys; then tfm__k_attn_bp (fwd: writes lse) */
static void tfm__cu_bfa_probs(const tfm__attn_args *a, const tfm__cu_bfa *w, const tfm__cu_attn_io *io, unsigned char *ptrs,
                              int i0, int nq, int kn, int fwd) {
    tfm__cu_bfp Q = tfm__cu_bfp_rows(w->q, i0, 0, 1);
    tfm__cu_bfp C = tfm__cu_bfp_make(w->S, 4, (int64_t)a->H * nq * w->kp, (int64_t)nq * w->kp, 1, w->kp);
    unsigned grid = (unsigned)(a->B * a->H * nq);
    tfm__gemm_batch_cuda(ptrs, w->et, 0, 1, nq, kn, a->D, a->scale, &Q, &w->k, 0.0f, &C, a->B, a->H);
    if (w->es == 2)
        TFM__LAUNCH(tfm__k_attn_bp<uint16_t>, grid, tfm__cu_row_threads(kn), 0, *a, w->S, (uint16_t *)w->P, (int64_t)w->kp,
                    i0, nq, kn, a->lse, fwd, io->lens, io->qoff, io->mask);
    else
        TFM__LAUNCH(tfm__k_attn_bp<float>, grid, tfm__cu_row_threads(kn), 0, *a, w->S, (float *)w->P, (int64_t)w->kp, i0, nq,
                    kn, a->lse, fwd, io->lens, io->qoff, io->mask);
    TFM__CU_LAUNCHED("tfm__k_attn_bp");
}

static int tfm__attn_batched_forward_cuda(const tfm__attn_args *a, const tfm__cu_attn_io *io, unsigned char *ptrs, int bf16) {
    tfm__cu_bfa w;
    int i0;
    if (!tfm__cu_bfa_init(a, io, &w, bf16, NULL, 0)) return 1;
    for (i0 = 0; i0 < a->Tq && !tfm__cu.failed; i0 += w.nq) {
        int nq = TFM__MIN(w.nq, a->Tq - i0), kn = tfm__cu_bfa_keys(a, i0, nq);
        tfm__cu_bfp P = tfm__cu_bfp_make(w.P, (size_t)w.es, (int64_t)a->H * nq * w.kp, (int64_t)nq * w.kp, 1, w.kp);
        tfm__cu_bfp O = tfm__cu_bfp_make(a->out + (int64_t)i0 * a->ldo, 4, (int64_t)a->Tq * a->ldo, a->D, 1, a->ldo);
        tfm__cu_bfa_probs(a, &w, io, ptrs, i0, nq, kn, 1);
        tfm__gemm_batch_cuda(ptrs, w.et, 0, 0, nq, a->D, kn, tfm__cu_drop_scale(a), &P, &w.v, 0.0f, &O, a->B, a->H);
    }
    return 1;
}

static int tfm__attn_batched_backward_cuda(const tfm__attn_args *a, const tfm__cu_attn_io *io, unsigned char *ptrs, int bf16,
                                           const float *one, float *dq, int lddq, float *dk, int lddk, float *dv, int lddv,
                                           const float *dout, int lddo) {
    tfm__cu_bfa w;
    int i0, g, Hkv = a->Hkv ? a->Hkv : a->H, G = a->H / Hkv;
    if (!tfm__cu_bfa_init(a, io, &w, bf16, dout, lddo)) return 1;
    for (i0 = 0; i0 < a->Tq && !tfm__cu.failed; i0 += w.nq) {
        int nq = TFM__MIN(w.nq, a->Tq - i0), kn = tfm__cu_bfa_keys(a, i0, nq);
        int64_t sbh = (int64_t)nq * w.kp; /* one batch-head's share of a chunk buffer */
        unsigned grid = (unsigned)(a->B * a->H * nq);
        tfm__cu_bfp P = tfm__cu_bfp_make(w.P, (size_t)w.es, a->H * sbh, sbh, 1, w.kp);
        tfm__cu_bfp dS = tfm__cu_bfp_make(w.dS, (size_t)w.es, a->H * sbh, sbh, 1, w.kp);
        tfm__cu_bfp Gp = tfm__cu_bfp_make(w.G, 4, a->H * sbh, sbh, 1, w.kp);
        tfm__cu_bfp Do = tfm__cu_bfp_rows(w.dout, i0, 0, 1);
        tfm__cu_bfa_probs(a, &w, io, ptrs, i0, nq, kn, 0);
        for (g = 0; g < G && dv; g++) { /* dv += Pd^T dout (Pd: P kept, times the factor), one call per member of each group */
            tfm__cu_bfp A = tfm__cu_bfp_rows(P, 0, g, G), B = tfm__cu_bfp_rows(w.dout, i0, g, G);
            tfm__cu_bfp C = tfm__cu_bfp_make(dv, 4, (int64_t)a->Tk * lddv, a->D, 1, lddv);
            tfm__gemm_batch_cuda(ptrs, w.et, 1, 0, kn, a->D, nq, tfm__cu_drop_scale(a), &A, &B, 1.0f, &C, a->B, Hkv);
        }
        if (!dq && !dk) continue;
        tfm__gemm_batch_cuda(ptrs, w.et, 0, 1, nq, kn, a->D, 1.0f, &Do, &w.v, 0.0f, &Gp, a->B, a->H); /* dP = dout v^T */
        if (w.es == 2)
            TFM__LAUNCH(tfm__k_attn_bds<uint16_t>, grid, tfm__cu_row_threads(kn), 0, *a, w.S, w.G, (uint16_t *)w.dS,
                        (int64_t)w.kp, i0, nq, kn, io->Dr, one);
        else
            TFM__LAUNCH(tfm__k_attn_bds<float>, grid, tfm__cu_row_threads(kn), 0, *a, w.S, w.G, (float *)w.dS, (int64_t)w.kp,
                        i0, nq, kn, io->Dr, one);
        TFM__CU_LAUNCHED("tfm__k_attn_bds");
        if (dq) {
            tfm__cu_bfp C = tfm__cu_bfp_make(dq + (int64_t)i0 * lddq, 4, (int64_t)a->Tq * lddq, a->D, 1, lddq);
            tfm__gemm_batch_cuda(ptrs, w.et, 0, 0, nq, a->D, kn, a->scale, &dS, &w.k, 1.0f, &C, a->B, a->H);
        }
        for (g = 0; g < G && dk; g++) { /* dk += scale dS^T q, likewise */
            tfm__cu_bfp A = tfm__cu_bfp_rows(dS, 0, g, G), B = tfm__cu_bfp_rows(w.q, i0, g, G);
            tfm__cu_bfp C = tfm__cu_bfp_make(dk, 4, (int64_t)a->Tk * lddk, a->D, 1, lddk);
            tfm__gemm_batch_cuda(ptrs, w.et, 1, 0, kn, a->D, nq, a->scale, &A, &B, 1.0f, &C, a->B, Hkv);
        }
    }
    return 1;
}

/* -- flash attention on tensor cores: a bf16 model's calls over whole sequences with heads of up to
   TFM__CU_TD channels (cfg.precision TFM_PREC_BF16; GPUs of compute capability 8.0 and later). The
   products are the tensor cores' register-level ones (mma.sync's m16n8k16: bf16 operands, fp32 sums) in
   blocks of 4 warps. Forward and dq: the block holds TFM__CU_FB query rows of one batch-head (16 a warp) and
   runs over the keys in tiles of TFM__CU_FB, with the online softmax of the tiled kernels; dk and dv: the
   block holds TFM__CU_FB keys of a key/value head (16 a warp) and runs over the queries of each head of its
   group. The operands go to shared memory rounded to bf16 (channels padded with zeros to a multiple of 16);
   scores, probabilities, softmax statistics and every sum stay in the warp's registers, the accumulators of
   one product becoming the A operand of the next; operands come from shared memory by ldmatrix
   (tfm__cu_ldsm). Visibility, mask, dropout and the score gradient are the tiled kernels'
   (tfm__cu_attn_sees, tfm__cu_attn_grad, so a query that sees one key gives exactly zero), the exponential
   the special-function unit's (tfm__cu_fexp); no scores in device memory, no atomics: every sum has one
   owner. -- */
#define TFM__CU_FB 64 /* rows of a block's tile and of its running tiles */
#if defined(TFM_CUDA_EMULATION) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800)
#define TFM__CU_MMA 1
#else
#define TFM__CU_MMA 0 /* (the host pass, and GPUs before sm_80: the kernels are empty and never launched) */
#endif

/* The shared memory of a flash kernel (0 forward, 1 dq, 2 dk and dv) for heads of D channels: bf16 tiles of
   TFM__CU_FB rows of D rounded up to 16, plus 8 (ldh), their scores and sums staying in registers: the
   block's own (the forward's queries; dq's queries and dout; dk/dv's keys and values) and two sets of the
   running tiles (keys and values; dk/dv's queries and dout, with 5 floats a query), the next set loading
   while the block works on the other; 128 bytes of room to align the start. */
static TFM__HD size_t tfm__cu_flash_smem(int kind, int D) {
    size_t Dp = (size_t)(D + 15) & ~(size_t)15, F = TFM__CU_FB;
    return 128 + (kind ? 6 : 5) * F * (Dp + 8) * 2 + (kind == 2 ? 10 * F * 4 : 0);
}

/* 16 bytes from device memory at src to shared memory at dst, both 16-byte aligned, without the thread
   waiting for them (cp.async, sm_80 on): they are there for this thread after a tfm__cu_cp_wait that covers
   their group (tfm__cu_cp_commit closes one), and for the block after a barrier that follows it. Waiting
   leaves the newest group (newest 1) or none (0) in flight. */
static __device__ void tfm__cu_cp16(void *dst, const void *src) {
#if defined(TFM_CUDA_EMULATION)
    tfm_emu_cp_async16(dst, src);
#elif TFM__CU_MMA
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
#else
    (void)dst, (void)src;
#endif
}
static __device__ void tfm__cu_cp_commit(void) {
#if defined(TFM_CUDA_EMULATION)
    tfm_emu_cp_commit();
#elif TFM__CU_MMA
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
static __device__ void tfm__cu_cp_wait(int newest) {
#if defined(TFM_CUDA_EMULATION)
    tfm_emu_cp_wait((unsigned)newest);
#elif TFM__CU_MMA
    if (newest) asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    else asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#else
    (void)newest;
#endif
}

/* Where element (r, d) of a flash kernel's bf16 tile of Dp channels lies: in rows of ldh (what ldmatrix
   reads), or (cm) in the wgmma products' core matrices: 8 rows of 8 channels in 128 contiguous bytes, the Dp / 8
   of 8 rows side by side, then those of the next 8 rows (tfm__cu_wg_rows, tfm__cu_wg_sum) */
static __device__ int tfm__cu_tile_at(int r, int d, int ldh, int Dp, int cm) {
    return cm ? (r >> 3) * 8 * Dp + (d >> 3) * 64 + (r & 7) * 8 + (d & 7) : r * ldh + d;
}

/* n rows of D elements from element off of src (row stride ld) into the bf16 tile dst (tfm__cu_tile_at's
   layout: rows of ldh, or cm, Dp channels) by the whole block: floats rounded to bf16, or (bf) bf16 elements
   as they are; zeros past row n and channel D. Where every row starts on 16 bytes (D and ld multiples of 8
   bf16s or 4 floats), each thread moves 8 channels at a time, in 16-byte loads and stores (bf16 rows with
   async: copies that the thread does not wait for, tfm__cu_cp16, which the caller commits and waits for;
   with cm, 8 threads in a row fill a core matrix, so that their stores meet no bank twice); elsewhere one
   element at a time. */
static __device__ void tfm__cu_ftile(uint16_t *dst, int ldh, const float *src, int64_t off, int64_t ld, int n, int D,
                                     int Dp, int bf, int async, int cm) {
    const uint16_t *sb = (const uint16_t *)(const void *)src + off;
    int x, per = Dp / 8, m = bf ? 7 : 3;
    if ((D & m) || (ld & m) || ((uintptr_t)(bf ? (const void *)sb : (const void *)(src + off)) & 15)) {
        for (x = (int)threadIdx.x; x < TFM__CU_FB * Dp; x += (int)blockDim.x) {
            int r = x / Dp, d = x % Dp;
            int64_t i = off + (int64_t)r * ld + d;
            dst[tfm__cu_tile_at(r, d, ldh, Dp, cm)] =
                r < n && d < D ? (bf ? ((const uint16_t *)(const void *)src)[i] : tfm__bf16(src[i])) : (uint16_t)0;
        }
        return;
    }
    for (x = (int)threadIdx.x; x < TFM__CU_FB * per; x += (int)blockDim.x) {
        int r = cm ? (x & 7) + x / (8 * per) * 8 : x / per, d = (cm ? (x >> 3) % per : x % per) * 8, e;
        uint16_t *to = dst + tfm__cu_tile_at(r, d, ldh, Dp, cm);
        uint4 o = {0u, 0u, 0u, 0u};
        if (r < n && bf && d < D && async) {
            tfm__cu_cp16(to, sb + (int64_t)r * ld + d);
            continue;
        }
        if (r < n && bf && d < D) o = *(const uint4 *)(const void *)(sb + (int64_t)r * ld + d);
        else if (r < n && d < D) { /* two runs of 4 floats (the second past D where D is 4 more than a multiple of 8) */
            uint32_t h[4] = {0u, 0u, 0u, 0u};
            for (e = 0; e < 2 && d + 4 * e < D; e++) {
                float4 f = *(const float4 *)(const void *)(src + off + (int64_t)r * ld + d + 4 * e);
                h[2 * e] = tfm__bf16(f.x) | (uint32_t)tfm__bf16(f.y) << 16;
                h[2 * e + 1] = tfm__bf16(f.z) | (uint32_t)tfm__bf16(f.w) << 16;
            }
            o.x = h[0], o.y = h[1], o.z = h[2], o.w = h[3];
        }
        *(uint4 *)(void *)to = o;
    }
}

/* The warp's d += A B on the tensor cores, mma.sync's m16n8k16 shape: A 16 x 16 and B 16 x 8 of bf16, d 16 x 8
   of fp32, each lane holding the registers of the PTX ISA's layout (lane = 4 g + t): a[0] A[g][2t, 2t+1], a[1]
   A[g+8][2t, 2t+1], a[2] A[g][2t+8, 2t+9], a[3] A[g+8][2t+8, 2t+9]; b[0] B[2t, 2t+1][g], b[1] B[2t+8, 2t+9][g]
   (the lower column or row in the lower 16 bits); d C[g][2t, 2t+1], C[g+8][2t, 2t+1]. The whole warp calls it. */
static __device__ void tfm__cu_mma16816(float d[4], const uint32_t a[4], const uint32_t b[2]) {
#if defined(TFM_CUDA_EMULATION)
    tfm_emu_mma16816(d, a, b, d);
#elif TFM__CU_MMA
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    (void)d, (void)a, (void)b;
#endif
}

/* The warp's ldmatrix.x4 of a 16 x 16 bf16 tile in shared memory, p its top left, rows of ld elements (16-byte
   aligned): r[0] its rows 0-7, columns 0-7; r[1] rows 8-15, columns 0-7; r[2] rows 0-7, columns 8-15; r[3]
   rows 8-15, columns 8-15 (lanes 8 i .. 8 i + 7 give the addresses of r[i]'s 8 rows), each lane (lane = 4 g
   + t) getting in r[i] that 8 x 8 matrix's row g, columns 2t and 2t + 1, or with trans, its rows 2t and 2t +
   1 of column g (the lower one in the lower 16 bits). The registers of tfm__cu_mma16816's operands: an A
   operand as it is (r in order); two B operands whose columns are the tile's rows (a key's channels for Q
   K^T: {r[0], r[2]} for rows 0-7, {r[1], r[3]} for rows 8-15); two B operands stored as they are (trans: the
   channels of keys for P V, {r[0], r[1]} for columns 0-7, {r[2], r[3]} for 8-15). The whole warp calls it. */
static __device__ void tfm__cu_ldsm(uint32_t r[4], const uint16_t *p, int ld, int trans) {
    int lane = (int)threadIdx.x & 31;
    p += ((lane & 7) + (lane & 8)) * ld + (lane & 16) / 2;
#if defined(TFM_CUDA_EMULATION)
    tfm_emu_ldsm(r, p, trans);
#elif TFM__CU_MMA
    if (trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"((unsigned)__cvta_generic_to_shared(p)));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"((unsigned)__cvta_generic_to_shared(p)));
#else
    r[0] = r[1] = r[2] = r[3] = 0u, (void)p, (void)trans;
#endif
}

/* A lane's registers for tfm__cu_mma16816 from the 16 x 16 bf16 tile at p (its top left, rows of ld; by
   tfm__cu_ldsm): an A operand; two B operands whose columns are stored as rows (b0 the tile's rows 0-7, b1
   rows 8-15); two B operands stored as they are (b0 columns 0-7, b1 8-15); and an A operand from two
   accumulator tiles (columns 0-7 and 8-15 of 16), rounded to bf16: the sums of one product become the
   operand of the next as they are. */
static __device__ void tfm__cu_mma_a(uint32_t a[4], const uint16_t *p, int ld) {
    tfm__cu_ldsm(a, p, ld, 0);
}
static __device__ void tfm__cu_mma_b_rows(uint32_t b0[2], uint32_t b1[2], const uint16_t *p, int ld) {
    uint32_t r[4];
    tfm__cu_ldsm(r, p, ld, 0);
    b0[0] = r[0], b0[1] = r[2], b1[0] = r[1], b1[1] = r[3];
}
static __device__ void tfm__cu_mma_b_cols(uint32_t b0[2], uint32_t b1[2], const uint16_t *p, int ld) {
    uint32_t r[4];
    tfm__cu_ldsm(r, p, ld, 1);
    b0[0] = r[0], b0[1] = r[1], b1[0] = r[2], b1[1] = r[3];
}
static __device__ void tfm__cu_mma_a_acc(uint32_t a[4], const float lo[4], const float hi[4]) {
    a[0] = tfm__bf16(lo[0]) | (uint32_t)tfm__bf16(lo[1]) << 16;
    a[1] = tfm__bf16(lo[2]) | (uint32_t)tfm__bf16(lo[3]) << 16;
    a[2] = tfm__bf16(hi[0]) | (uint32_t)tfm__bf16(hi[1]) << 16;
    a[3] = tfm__bf16(hi[2]) | (uint32_t)tfm__bf16(hi[3]) << 16;
}

/* The warp's acc += P B for its 16 rows, P the 16 columns of the accumulator tiles lo and hi rounded to bf16
   (tfm__cu_mma_a_acc), B 16 rows of Dp channels stored as they are from p (rows of ld): each of the Dp / 8
   tiles of 8 channels in acc */
template <int TD>
static __device__ void tfm__cu_mma_sum(float acc[TD / 8][4], const float lo[4], const float hi[4], const uint16_t *p, int ld,
                                       int Dp) {
    uint32_t pa[4];
    int n;
    tfm__cu_mma_a_acc(pa, lo, hi);
    TFM__UNROLL
    for (n = 0; n < TD / 8; n += 2)
        if (8 * n < Dp) {
            uint32_t b0[2], b1[2];
            tfm__cu_mma_b_cols(b0, b1, p + 8 * n, ld);
            tfm__cu_mma16816(acc[n], pa, b0);
            tfm__cu_mma16816(acc[n + 1], pa, b1);
        }
}

/* The warp's s = A B^T for its 16 rows: A those rows of Dp channels from pa (the warp's own tile rows,
   rows of ld), B^T TFM__CU_FB stored rows of the same channels from p (the running tile: B's columns are
   its rows, as keys for Q K^T), both bf16 in shared memory, 16 channels at a time; s the 8 tiles of 8
   columns of tfm__cu_mma16816's accumulators, overwritten */
template <int TD>
static __device__ void tfm__cu_mma_rows(float s[TFM__CU_FB / 8][4], const uint16_t *pa, const uint16_t *p, int ld, int Dp) {
    int n, kk;
    TFM__UNROLL
    for (n = 0; n < TFM__CU_FB / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    TFM__UNROLL
    for (kk = 0; kk < TD / 16; kk++)
        if (16 * kk < Dp) {
            uint32_t a[4];
            tfm__cu_mma_a(a, pa + 16 * kk, ld);
            TFM__UNROLL
            for (n = 0; n < TFM__CU_FB / 8; n += 2) {
                uint32_t b0[2], b1[2];
                tfm__cu_mma_b_rows(b0, b1, p + 8 * n * ld + 16 * kk, ld);
                tfm__cu_mma16816(s[n], a, b0);
                tfm__cu_mma16816(s[n + 1], a, b1);
            }
        }
}

/* -- Hopper's warpgroup products (wgmma; device code built for sm_90a: nvcc -arch=sm_90a) for the flash
   kernels' products: the block's 4 warps are one warpgroup, and one instruction multiplies all 64 of its
   rows (A 64 x 16 from the warps' registers or from shared memory, B 16 x 64 from shared memory, each
   through a descriptor) where mma.sync takes 16 rows by 8 columns a warp. A in registers and the fp32 sums
   lie as for tfm__cu_mma16816 (warp w's rows 16 w .., its accumulators tiles of 8 columns), so the
   kernel's softmax is the same either way. Operands in shared memory lie in the core matrices of the PTX
   ISA's canonical layout without swizzling (tfm__cu_tile_at's cm). The product runs asynchronously: registers it writes or reads are fenced
   before it (tfm__cu_wg_fence) and read only after tfm__cu_wg_done; shared memory written by the threads
   is made visible to it by tfm__cu_wg_proxy before the barrier. TFM__CU_WG: whether the device code has
   them (a build for sm_90a, or the emulation). Each flash kernel is instantiated with WG 0 (mma.sync) and 1
   (wgmma where the build has it, mma.sync elsewhere), the latter launched only for heads whose channels
   pad to exactly its TD (49-64, 113-128: tfm__cu_flash_wg); its tiles are then in core matrices. -- */
#if defined(TFM_CUDA_EMULATION) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TFM__CU_WG 1
#else
#define TFM__CU_WG 0
#endif

/* A shared-memory matrix descriptor without swizzling for the operand whose first core matrix is at p
   (16-byte aligned): lbo bytes from one core matrix to the next along K, sbo along M or N */
static __device__ uint64_t tfm__cu_wg_desc(const void *p, uint32_t lbo, uint32_t sbo) {
#if defined(TFM_CUDA_EMULATION)
    uint32_t at = tfm_emu_smem_addr(p);
#elif TFM__CU_MMA
    uint32_t at = (uint32_t)__cvta_generic_to_shared(p);
#else
    uint32_t at = 0u;
    (void)p;
#endif
    return (uint64_t)((at & 0x3FFFFu) >> 4) | (uint64_t)((lbo >> 4) & 0x3FFFu) << 16 | (uint64_t)((sbo >> 4) & 0x3FFFu) << 32;
}

/* wgmma.fence (before products whose registers the threads wrote); tfm__cu_wg_done(d, n): wgmma.commit_group
   and wgmma.wait_group 0, after which the products issued since the last hold their sums, d being n
   accumulator tiles of them; tfm__cu_wg_hold(d, n) tells the compiler that d's registers change there (an
   empty asm on each; tfm__cu_wg_done does it for its own), so that none of their reads moves above it */
static __device__ void tfm__cu_wg_hold(float (*d)[4], int n) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) && !defined(TFM_CUDA_EMULATION)
    int i;
    TFM__UNROLL
    for (i = 0; i < n; i++) asm volatile("" : "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])::"memory");
#else
    (void)d, (void)n;
#endif
}
static __device__ void tfm__cu_wg_fence(void) {
#if defined(TFM_CUDA_EMULATION)
    tfm_emu_wgmma_fence();
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
static __device__ void tfm__cu_wg_done(float (*d)[4], int n) {
#if defined(TFM_CUDA_EMULATION)
    tfm_emu_wgmma_commit();
    tfm_emu_wgmma_wait();
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
    tfm__cu_wg_hold(d, n);
}
/* fence.proxy.async for shared memory: this thread's writes to it, before the barrier after them, are seen
   by the products (which read through the async proxy) */
static __device__ void tfm__cu_wg_proxy(void) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL) && !defined(TFM_CUDA_EMULATION)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* The warpgroup's d += A B, m64n64k16: a the warp's registers of A (tfm__cu_mma_a's), B from the descriptor b,
   K-major (TRANS 0: B's columns stored as rows, as keys for Q K^T) or N-major (TRANS 1: B's rows stored as they
   are, as values for P V); d 8 accumulator tiles. The whole warpgroup calls it, with the same b. */
#define TFM__WG_D(i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
template <int TRANS>
static __device__ void tfm__cu_wgmma64(float d[8][4], const uint32_t a[4], uint64_t b) {
#if defined(TFM_CUDA_EMULATION)
    tfm_emu_wgmma(&d[0][0], 64, a, b, TRANS);
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
                 "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "{%32, %33, %34, %35}, %36, p, 1, 1, %37;\n}\n"
                 : TFM__WG_D(0), TFM__WG_D(1), TFM__WG_D(2), TFM__WG_D(3), TFM__WG_D(4), TFM__WG_D(5), TFM__WG_D(6),
                   TFM__WG_D(7)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(TRANS), "r"(1));
#else
    (void)d, (void)a, (void)b;
#endif
}
/* The same with A from shared memory too, K-major, through the descriptor a (64 rows: the warpgroup's) */
template <int TRANS>
static __device__ void tfm__cu_wgmma64_ss(float d[8][4], uint64_t a, uint64_t b) {
#if defined(TFM_CUDA_EMULATION)
    tfm_emu_wgmma_ss(&d[0][0], 64, a, b, TRANS);
#elif defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %35, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
                 "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "%32, %33, p, 1, 1, 0, %34;\n}\n"
                 : TFM__WG_D(0), TFM__WG_D(1), TFM__WG_D(2), TFM__WG_D(3), TFM__WG_D(4), TFM__WG_D(5), TFM__WG_D(6),
                   TFM__WG_D(7)
                 : "l"(a), "l"(b), "n"(TRANS), "r"(1));
#else
    (void)d, (void)a, (void)b;
#endif
}
#undef TFM__WG_D

/* The block's s = A B^T for its 64 rows on the warpgroup (tfm__cu_mma_rows' product, heads of exactly TD
   padded channels: a sequence of products that the channels' count could cut short makes ptxas serialize
   them): A the block's 64 rows of TD channels in the core-matrix tile at (tfm__cu_tile_at's cm: K-major, 128
   bytes from 8 channels to the next, 16 TD from 8 rows to the next), B^T the TFM__CU_FB rows (keys for Q K^T)
   of the core-matrix tile kt, likewise; s overwritten once the caller's tfm__cu_wg_done has waited (a
   second product issued before it runs while this one does). No operand passes through registers. */
template <int TD>
static __device__ void tfm__cu_wg_rows(float s[TFM__CU_FB / 8][4], const uint16_t *at, const uint16_t *kt) {
    int n, kk;
    TFM__UNROLL
    for (n = 0; n < TFM__CU_FB / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    tfm__cu_wg_fence();
    tfm__cu_wg_hold(s, TFM__CU_FB / 8);
    TFM__UNROLL
    for (kk = 0; kk < TD / 16; kk++)
        tfm__cu_wgmma64_ss<0>(s, tfm__cu_wg_desc(at + 128 * kk, 128u, 16u * TD), tfm__cu_wg_desc(kt + 128 * kk, 128u, 16u * TD));
}

/* The block's acc += P B on the warpgroup (tfm__cu_mma_sum's product over the TFM__CU_FB keys of a tile): P the
   accumulator tiles sc rounded to bf16, B the keys' TD channels in the core-matrix tile vt (N-major: 16 TD
   bytes from 8 keys to the next, 128 from 8 channels to the next); 64 channels an instruction; acc summed
   once the caller's tfm__cu_wg_done has waited */
template <int TD>
static __device__ void tfm__cu_wg_sum(float acc[TD / 8][4], const float (*sc)[4], const uint16_t *vt) {
    uint32_t pa[TFM__CU_FB / 16][4];
    int n, kk;
    TFM__UNROLL
    for (kk = 0; kk < TFM__CU_FB / 16; kk++) tfm__cu_mma_a_acc(pa[kk], sc[2 * kk], sc[2 * kk + 1]);
    tfm__cu_wg_fence();
    tfm__cu_wg_hold(acc, TD / 8);
    TFM__UNROLL
    for (kk = 0; kk < TFM__CU_FB / 16; kk++)
        TFM__UNROLL
        for (n = 0; n < TD; n += 64) tfm__cu_wgmma64<1>(acc + n / 8, pa[kk], tfm__cu_wg_desc(vt + 16 * kk * TD + 8 * n, 16u * TD, 128u));
}

/* The dynamic shared memory from its first 128-byte boundary */
static __device__ unsigned char *tfm__cu_flash_base(unsigned char *raw) {
    return (unsigned char *)(((uintptr_t)raw + 127) & ~(uintptr_t)127);
}

/* A forward or dq block's place: batch-head bh (batch b, head h), query rows [i0, i0 + nq), the most keys
   they see (n_max) and their lowest window start, and where the rows of their key/value head start in a->k and
   a->v (elements; a's pointers set) */
typedef struct tfm__cu_fq { int bh, b, h, i0, nq, n_max, lo_min; int64_t kh, vh; } tfm__cu_fq;
static __device__ tfm__cu_fq tfm__cu_fq_at(const tfm__attn_args *a) {
    tfm__cu_fq f;
    int tiles = (a->Tq + TFM__CU_FB - 1) / TFM__CU_FB;
    f.bh = (int)blockIdx.x / tiles, f.b = f.bh / a->H, f.h = f.bh % a->H;
    f.i0 = ((int)blockIdx.x % tiles) * TFM__CU_FB, f.nq = TFM__MIN(TFM__CU_FB, a->Tq - f.i0);
    f.kh = (int64_t)f.b * a->Tk * a->ldk + tfm__attn_kv_head(a, f.h) * a->D;
    f.vh = (int64_t)f.b * a->Tk * a->ldv + tfm__attn_kv_head(a, f.h) * a->D;
    tfm__cu_attn_span(a, f.b, f.i0, f.nq, &f.n_max, &f.lo_min);
    return f;
}

/* The key/value tile of a forward or dq block from key j on that some row of the block sees (tiles in every
   row's window gap skipped) into dst (K's tile, then V's, TFM__CU_FB rows of ldh apart; cm: in core matrices),
   copied without waiting (tfm__cu_ftile's async) and committed as one group (an empty one past the last tile);
   returns its first key, or f->n_max */
static __device__ int tfm__cu_flash_kv(const tfm__attn_args *a, const tfm__cu_fq *f, uint16_t *dst, const float *k,
                                       const float *v, int j, int ldh, int Dp, int cm) {
    while (j < f->n_max && j >= a->sinks && j + TFM__MIN(TFM__CU_FB, f->n_max - j) <= f->lo_min) j += TFM__CU_FB;
    if (j < f->n_max) {
        int nk = TFM__MIN(TFM__CU_FB, f->n_max - j);
        tfm__cu_ftile(dst, ldh, k, f->kh + (int64_t)j * a->ldk, a->ldk, nk, a->D, Dp, a->qkv_bf, 1, cm);
        tfm__cu_ftile(dst + TFM__CU_FB * ldh, ldh, v, f->vh + (int64_t)j * a->ldv, a->ldv, nk, a->D, Dp, a->qkv_bf, 1, cm);
    }
    tfm__cu_cp_commit();
    return j;
}

/* Row r of a forward or dq block's tiles (keys j0 .. j0 + nk - 1; this lane's 16 of the row's, in sc as
   tfm__cu_mma16816 left them) for query i (n keys, window start lo) of batch row b, batch-head bh:
   - forward (dp NULL): made what the online softmax takes, in place: scaled, the mask added, -inf where the
     query does not see the key; returns the largest;
   - dq: the score gradients in place (tfm__cu_attn_pds, from the output gradient's products in dp; L the
     row's log-sum-exp, Dri its D, onei its one-key flag), 0 where the query does not see the key.
   ALL: the query sees all TFM__CU_FB keys from j0 (tfm__cu_attn_sees_all; then nk is TFM__CU_FB), so no key
   is checked: called with ALL where it holds, the check (most of an element's work otherwise) is compiled
   out. The mask and dropout are tested once a row, each a pass of its own, not once an element. */
template <int ALL>
static __device__ float tfm__cu_flash_row(const tfm__attn_args *a, float sc[TFM__CU_FB / 8][4], const float (*dp)[4], int r,
                                          int t, int j0, int nk, int b, int bh, int i, int n, int lo, float L, float Dri,
                                          float onei) {
    float bm = -INFINITY, pd;
    unsigned seen = 0; /* bit 2 x + c: key j0 + 8 x + 2 t + c */
    int x, c;
    TFM__UNROLL
    for (x = 0; x < TFM__CU_FB / 8; x++)
        TFM__UNROLL
        for (c = 0; c < 2; c++) {
            int j = j0 + 8 * x + 2 * t + c;
            if (ALL || (j < j0 + nk && tfm__cu_attn_sees(a, j, n, lo))) seen |= 1u << (2 * x + c);
            sc[x][2 * r + c] = seen >> (2 * x + c) & 1 ? a->scale * sc[x][2 * r + c] : dp ? 0.0f : -INFINITY;
        }
    if (a->mask) { /* (tfm__cu_attn_score's terms) */
        const float *mrow = a->mask + b * a->mask_bs + (int64_t)i * a->Tk + j0 + 2 * t;
        TFM__UNROLL
        for (x = 0; x < TFM__CU_FB / 8; x++)
            TFM__UNROLL
            for (c = 0; c < 2; c++)
                if (seen >> (2 * x + c) & 1) sc[x][2 * r + c] += mrow[8 * x + c];
    }
    if (!dp) {
        TFM__UNROLL
        for (x = 0; x < TFM__CU_FB / 8; x++)
            TFM__UNROLL
            for (c = 0; c < 2; c++) bm = fmaxf(bm, sc[x][2 * r + c]);
        return bm;
    }
    if (a->dropout > 0.0f) {
        TFM__UNROLL
        for (x = 0; x < TFM__CU_FB / 8; x++)
            TFM__UNROLL
            for (c = 0; c < 2; c++)
                if (seen >> (2 * x + c) & 1)
                    tfm__cu_attn_pds(sc[x][2 * r + c], tfm__cu_attn_keep(a, bh, i, j0 + 8 * x + 2 * t + c),
                                     dp[x][2 * r + c], L, Dri, onei, 1, &pd, &sc[x][2 * r + c]);
    } else {
        TFM__UNROLL
        for (x = 0; x < TFM__CU_FB / 8; x++)
            TFM__UNROLL
            for (c = 0; c < 2; c++)
                if (seen >> (2 * x + c) & 1)
                    tfm__cu_attn_pds(sc[x][2 * r + c], 1.0f, dp[x][2 * r + c], L, Dri, onei, 1, &pd, &sc[x][2 * r + c]);
    }
    return 0.0f;
}

/* Forward: block (tile, bh) at bh * tiles + tile, heads of up to TD channels (64, or TFM__CU_TD: the
   registers each lane holds for them). Warp w's 16 query rows run through the register-level
   products (tfm__cu_mma16816): the scores S = Q K^T of a key tile land in accumulator registers, the online
   softmax runs on them there (a row's 4 lanes meet by shuffles), and the probabilities, rounded to bf16, are
   the A operand of O += P V as they are, the accumulators' layout being the A operand's for 16 of the keys;
   O stays in registers to the end. A lane holds rows 16 w + g and 16 w + g + 8 (g = lane / 4), keys and
   channels 8 n + 2 t, 8 n + 2 t + 1 of each 8 (t = lane % 4); its share of a row's sum of probabilities is
   added over its 4 lanes at the end. With WG, built for sm_90a (TFM__CU_WG) and for heads whose channels pad
   to exactly TD (49-64, 113-128: the launch's part), the products are the warpgroup's (tfm__cu_wg_rows,
   tfm__cu_wg_sum; every tile in core matrices), the sums in the same registers; so in dq and dk/dv. */
template <int TD, int WG>
static __global__ void tfm__k_attn_flash_fwd(tfm__attn_args a, const float *q, const float *k, const float *v, float *out,
                                             float *lse, const int32_t *lens, const float *mask) {
#if TFM__CU_MMA
    TFM__SHARED_DYN(unsigned char, raw);
    int D = a.D, Dp = (D + 15) & ~15, ldh = Dp + 8, F = TFM__CU_FB, lane = (int)threadIdx.x & 31;
    int w = (int)threadIdx.x >> 5, g = lane >> 2, t = lane & 3, r, x, c, n, kk, j0, bh, b, h, i0, n_max;
    int jn, buf, cm = WG && TFM__CU_WG;
    uint16_t *sq = (uint16_t *)(void *)tfm__cu_flash_base(raw), *skv = sq + F * ldh; /* then 2 x (K, V) */
    float o[TD / 8][4], sc[TFM__CU_FB / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    int iq[2], nv[2], lo[2];
    tfm__cu_fq f;
    tfm__cu_attn_ptrs(&a, q, k, v, out, lse, lens, NULL, NULL, mask);
    f = tfm__cu_fq_at(&a);
    bh = f.bh, b = f.b, h = f.h, i0 = f.i0, n_max = f.n_max;
    TFM__UNROLL
    for (r = 0; r < 2; r++) { /* this lane's two rows: the keys each sees */
        iq[r] = i0 + 16 * w + g + 8 * r;
        nv[r] = iq[r] < a.Tq ? tfm__attn_visible(&a, b, iq[r]) : 0;
        lo[r] = nv[r] ? tfm__attn_window_lo(&a, b, iq[r]) : 0;
    }
    TFM__UNROLL
    for (n = 0; n < TD / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    j0 = tfm__cu_flash_kv(&a, &f, skv, k, v, 0, ldh, Dp, cm);
    tfm__cu_ftile(sq, ldh, q, ((int64_t)b * a.Tq + i0) * a.ldq + h * D, a.ldq, f.nq, D, Dp, a.qkv_bf, 0, cm);
    for (buf = 0; j0 < n_max; j0 = jn, buf ^= 1) {
        int nk = TFM__MIN(F, n_max - j0);
        const uint16_t *sk = skv + 2 * buf * F * ldh, *sv = sk + F * ldh;
        __syncthreads(); /* every warp is done with the other buffer: the next tile goes there as this one runs */
        jn = tfm__cu_flash_kv(&a, &f, skv + 2 * (buf ^ 1) * F * ldh, k, v, j0 + F, ldh, Dp, cm);
        tfm__cu_cp_wait(1);
        if (cm) tfm__cu_wg_proxy();
        __syncthreads();
        if (cm) { /* S = Q K^T for the tile's keys */
            tfm__cu_wg_rows<TD>(sc, sq, sk);
            tfm__cu_wg_done(sc, TFM__CU_FB / 8);
        } else tfm__cu_mma_rows<TD>(sc, sq + 16 * w * ldh, sk, ldh, Dp);
        TFM__UNROLL
        for (r = 0; r < 2; r++) { /* the online softmax of each row: scores to probabilities in place */
            float bm, mn, alpha = 1.0f;
            int i = iq[r];
            bm = tfm__cu_attn_sees_all(&a, j0, TFM__CU_FB, nv[r], lo[r])
                     ? tfm__cu_flash_row<1>(&a, sc, NULL, r, t, j0, nk, b, bh, i, nv[r], lo[r], 0.0f, 0.0f, 0.0f)
                     : tfm__cu_flash_row<0>(&a, sc, NULL, r, t, j0, nk, b, bh, i, nv[r], lo[r], 0.0f, 0.0f, 0.0f);
            bm = fmaxf(bm, __shfl_xor_sync(0xffffffffu, bm, 1));
            bm = fmaxf(bm, __shfl_xor_sync(0xffffffffu, bm, 2));
            mn = bm > m[r] ? bm : m[r];
            if (bm != -INFINITY && m[r] != -INFINITY) alpha = tfm__cu_fexp(m[r] - mn);
            m[r] = mn, l[r] *= alpha;
            /* e^(s - m) as 2^(s log2(e) - m log2(e)), the exponent one fma; m -inf: every score is, and 2^-inf is 0 */
            mn = mn == -INFINITY ? 0.0f : -mn * TFM__CU_LOG2E;
            TFM__UNROLL
            for (n = 0; n < TFM__CU_FB / 8; n++)
                TFM__UNROLL
                for (c = 0; c < 2; c++) {
                    float p = tfm__cu_fexp2(fmaf(sc[n][2 * r + c], TFM__CU_LOG2E, mn));
                    l[r] += p;
                    sc[n][2 * r + c] = p;
                }
            if (a.dropout > 0.0f) { /* P where dropout keeps it goes on to the product with V (its factor at the end) */
                TFM__UNROLL
                for (n = 0; n < TFM__CU_FB / 8; n++)
                    TFM__UNROLL
                    for (c = 0; c < 2; c++)
                        if (sc[n][2 * r + c] != 0.0f && tfm__cu_attn_keep(&a, bh, i, j0 + 8 * n + 2 * t + c) == 0.0f)
                            sc[n][2 * r + c] = 0.0f;
            }
            if (alpha != 1.0f) {
                TFM__UNROLL
                for (n = 0; n < TD / 8; n++) o[n][2 * r] *= alpha, o[n][2 * r + 1] *= alpha;
            }
        }
        if (cm) { /* O += P V: P's A operand from S's registers */
            tfm__cu_wg_sum<TD>(o, sc, sv);
            tfm__cu_wg_done(o, TD / 8);
        } else {
            TFM__UNROLL
            for (kk = 0; kk < TFM__CU_FB / 16; kk++) /* (over keys 16 kk ..) */
                tfm__cu_mma_sum<TD>(o, sc[2 * kk], sc[2 * kk + 1], sv + 16 * kk * ldh, ldh, Dp);
        }
    }
    TFM__UNROLL
    for (r = 0; r < 2; r++) {
        int i = iq[r];
        float sum = l[r], inv;
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        inv = sum > 0.0f ? tfm__cu_drop_scale(&a) / sum : 0.0f;
        if (i >= a.Tq) continue;
        TFM__UNROLL
        for (n = 0; n < TD / 8; n++)
            TFM__UNROLL
            for (c = 0; c < 2; c++) {
                int64_t e = ((int64_t)b * a.Tq + i) * a.ldo + h * D + 8 * n + 2 * t + c;
                x = 8 * n + 2 * t + c;
                if (x >= D) continue;
                if (a.out_bf) ((uint16_t *)(void *)out)[e] = tfm__bf16(o[n][2 * r + c] * inv);
                else out[e] = o[n][2 * r + c] * inv;
            }
        if (t == 0) lse[(int64_t)bh * a.Tq + i] = sum > 0.0f ? m[r] + logf(sum) : -INFINITY;
    }
#else
    (void)a, (void)q, (void)k, (void)v, (void)out, (void)lse, (void)lens, (void)mask;
#endif
}

/* Element o of a flash backward's gradient d (rows of its ld from d): v added into it, or written (a.overwrite), as
   a.d_bf asks */
static __device__ void tfm__cu_flash_put(const tfm__attn_args *a, float *d, int64_t o, float v) {
    if (a->d_bf == 2) ((uint16_t *)(void *)d)[o] = tfm__bf16(0.0f + v);
    else if (a->d_bf == 1) d[o] = tfm__bf16_round(0.0f + v);
    else d[o] = (a->overwrite ? 0.0f : d[o]) + v;
}

/* dq_i += scale sum_j ds_ij k_j (a.overwrite: dq_i =): blocks as forward's, heads of up to TD channels. As in
   the forward, warp w's 16 rows run through tfm__cu_mma16816 with everything in registers: S = Q K^T and
   dP = dout V^T for a key tile, each element's score gradient (tfm__cu_attn_grad) in place, rounded to bf16
   as the A operand of dq += dS K. */
template <int TD, int WG>
static __global__ void tfm__k_attn_flash_dq(tfm__attn_args a, const float *q, const float *k, const float *v,
                                            const float *lse, const int32_t *lens, const float *mask, const float *Dr,
                                            const float *one, float *dq, int lddq, const float *dout, int lddo) {
#if TFM__CU_MMA
    TFM__SHARED_DYN(unsigned char, raw);
    int D = a.D, Dp = (D + 15) & ~15, ldh = Dp + 8, F = TFM__CU_FB, lane = (int)threadIdx.x & 31;
    int w = (int)threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    int r, c, n, kk, j0, bh, b, h, i0, n_max, iq[2], nv[2], lo[2];
    int jn, buf, cm = WG && TFM__CU_WG;
    uint16_t *sq = (uint16_t *)(void *)tfm__cu_flash_base(raw), *sdo = sq + F * ldh, *skv = sdo + F * ldh; /* 2 x (K, V) */
    float acc[TD / 8][4], sc[TFM__CU_FB / 8][4], dp[TFM__CU_FB / 8][4], L[2], Dri[2], onei[2];
    tfm__cu_fq f;
    tfm__cu_attn_ptrs(&a, q, k, v, NULL, NULL, lens, NULL, NULL, mask);
    f = tfm__cu_fq_at(&a);
    bh = f.bh, b = f.b, h = f.h, i0 = f.i0, n_max = f.n_max;
    TFM__UNROLL
    for (r = 0; r < 2; r++) { /* this lane's two rows */
        int64_t e = (int64_t)bh * a.Tq + i0 + 16 * w + g + 8 * r;
        iq[r] = i0 + 16 * w + g + 8 * r;
        L[r] = iq[r] < a.Tq ? lse[e] : -INFINITY;
        nv[r] = L[r] == -INFINITY ? 0 : tfm__attn_visible(&a, b, iq[r]);
        lo[r] = nv[r] ? tfm__attn_window_lo(&a, b, iq[r]) : 0;
        Dri[r] = iq[r] < a.Tq ? Dr[e] : 0.0f;
        onei[r] = iq[r] < a.Tq ? one[e] : 0.0f;
    }
    TFM__UNROLL
    for (n = 0; n < TD / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    j0 = tfm__cu_flash_kv(&a, &f, skv, k, v, 0, ldh, Dp, cm);
    tfm__cu_ftile(sq, ldh, q, ((int64_t)b * a.Tq + i0) * a.ldq + h * D, a.ldq, f.nq, D, Dp, a.qkv_bf, 0, cm);
    tfm__cu_ftile(sdo, ldh, dout, ((int64_t)b * a.Tq + i0) * lddo + h * D, lddo, f.nq, D, Dp, a.dout_bf == 2, 0, cm);
    for (buf = 0; j0 < n_max; j0 = jn, buf ^= 1) {
        int nk = TFM__MIN(F, n_max - j0);
        const uint16_t *sk = skv + 2 * buf * F * ldh, *sv = sk + F * ldh;
        __syncthreads(); /* as the forward's */
        jn = tfm__cu_flash_kv(&a, &f, skv + 2 * (buf ^ 1) * F * ldh, k, v, j0 + F, ldh, Dp, cm);
        tfm__cu_cp_wait(1);
        if (cm) tfm__cu_wg_proxy();
        __syncthreads();
        if (cm) { /* S = Q K^T and dP = dout V^T for the tile's keys (one after the other: issued together, ptxas
                     puts a wait between them, its note C7517) */
            tfm__cu_wg_rows<TD>(sc, sq, sk);
            tfm__cu_wg_done(sc, TFM__CU_FB / 8);
            tfm__cu_wg_rows<TD>(dp, sdo, sv);
            tfm__cu_wg_done(dp, TFM__CU_FB / 8);
        } else {
            tfm__cu_mma_rows<TD>(sc, sq + 16 * w * ldh, sk, ldh, Dp);
            tfm__cu_mma_rows<TD>(dp, sdo + 16 * w * ldh, sv, ldh, Dp);
        }
        TFM__UNROLL
        for (r = 0; r < 2; r++) { /* dS in place of S */
            if (tfm__cu_attn_sees_all(&a, j0, TFM__CU_FB, nv[r], lo[r]))
                (void)tfm__cu_flash_row<1>(&a, sc, dp, r, t, j0, nk, b, bh, iq[r], nv[r], lo[r], L[r], Dri[r], onei[r]);
            else (void)tfm__cu_flash_row<0>(&a, sc, dp, r, t, j0, nk, b, bh, iq[r], nv[r], lo[r], L[r], Dri[r], onei[r]);
        }
        if (cm) { /* dq += dS K, K as stored */
            tfm__cu_wg_sum<TD>(acc, sc, sk);
            tfm__cu_wg_done(acc, TD / 8);
        } else {
            TFM__UNROLL
            for (kk = 0; kk < TFM__CU_FB / 16; kk++) /* (over keys 16 kk ..) */
                tfm__cu_mma_sum<TD>(acc, sc[2 * kk], sc[2 * kk + 1], sk + 16 * kk * ldh, ldh, Dp);
        }
    }
    TFM__UNROLL
    for (r = 0; r < 2; r++) {
        if (iq[r] >= a.Tq) continue;
        TFM__UNROLL
        for (n = 0; n < TD / 8; n++)
            TFM__UNROLL
            for (c = 0; c < 2; c++)
                if (8 * n + 2 * t + c < D)
                    tfm__cu_flash_put(&a, dq, ((int64_t)b * a.Tq + iq[r]) * lddq + h * D + 8 * n + 2 * t + c,
                                      a.scale * acc[n][2 * r + c]);
    }
#else
    (void)a, (void)q, (void)k, (void)v, (void)lse, (void)lens, (void)mask, (void)Dr, (void)one, (void)dq, (void)lddq;
    (void)dout, (void)lddo;
#endif
}

/* A dk/dv block's running tile: queries q0.. (to i1) of head h of batch row b into dst (q's tile, then
   dout's), copied without waiting (tfm__cu_ftile's async), and their statistics into st (5 rows of
   TFM__CU_FB: log-sum-exp, D, the one-key flag, then as ints the keys each sees and its window start) */
static __device__ void tfm__cu_flash_qd(const tfm__attn_args *a, uint16_t *dst, float *st, const float *q, const float *dout,
                                        int lddo, const float *lse, const float *Dr, const float *one, int b, int h, int q0,
                                        int i1, int ldh, int Dp, int cm) {
    int F = TFM__CU_FB, nq = TFM__MIN(F, i1 - q0), x = (int)threadIdx.x, it = q0 + x;
    int64_t e = (int64_t)(b * a->H + h) * a->Tq + it;
    tfm__cu_ftile(dst, ldh, q, ((int64_t)b * a->Tq + q0) * a->ldq + h * a->D, a->ldq, nq, a->D, Dp, a->qkv_bf, 1, cm);
    tfm__cu_ftile(dst + F * ldh, ldh, dout, ((int64_t)b * a->Tq + q0) * lddo + h * a->D, lddo, nq, a->D, Dp, a->dout_bf == 2,
                  1, cm);
    if (x < F) {
        int *sn = (int *)(void *)(st + 3 * F);
        st[x] = x < nq ? lse[e] : -INFINITY;
        sn[x] = st[x] == -INFINITY ? 0 : tfm__attn_visible(a, b, it);
        sn[F + x] = sn[x] ? tfm__attn_window_lo(a, b, it) : 0;
        st[F + x] = x < nq ? Dr[e] : 0.0f;
        st[2 * F + x] = x < nq ? one[e] : 0.0f;
    }
}

/* dk/dv's form of tfm__cu_flash_row: row r of a warp's tiles is key j0 + jr (nk keys in the block), this
   lane's 16 columns of it queries q0 + x (x = 8 n + 2 t + c) with their statistics in st (tfm__cu_flash_qd's
   5 rows); P (unscaled: dropout's factor goes on dv's sums) in place of S in sc, dS in place of dP in dp
   (tfm__cu_attn_grad), 0 where the query does not see the key. ALL: every query of the tile sees every key
   of the block, so none is checked. PLAIN (chosen here, -1): no mask and no dropout, compiled apart so that no
   element tests them (dq's way, a pass each, took dk/dv's spills at 128 channels from 12 bytes to 156). */
template <int ALL, int PLAIN = -1>
static __device__ void tfm__cu_flash_col(const tfm__attn_args *a, float sc[TFM__CU_FB / 8][4], float dp[TFM__CU_FB / 8][4],
                                         int r, int t, int jr, int nk, int j0, int b, int bh, int q0, const float *st) {
    const int F = TFM__CU_FB, *sn = (const int *)(const void *)(st + 3 * F), *slo = sn + F;
    int n, c;
    if (PLAIN < 0) {
        if (!a->mask && !(a->dropout > 0.0f)) tfm__cu_flash_col<ALL, 1>(a, sc, dp, r, t, jr, nk, j0, b, bh, q0, st);
        else tfm__cu_flash_col<ALL, 0>(a, sc, dp, r, t, jr, nk, j0, b, bh, q0, st);
    } else {
        TFM__UNROLL
        for (n = 0; n < TFM__CU_FB / 8; n++)
            TFM__UNROLL
            for (c = 0; c < 2; c++) {
                int x = 8 * n + 2 * t + c;
                float pd = 0.0f, ds = 0.0f;
                if (ALL || (jr < nk && tfm__cu_attn_sees(a, j0 + jr, sn[x], slo[x]))) {
                    if (PLAIN) /* (tfm__cu_attn_grad's, keep 1 and no mask's term) */
                        tfm__cu_attn_pds(a->scale * sc[n][2 * r + c], 1.0f, dp[n][2 * r + c], st[x], st[F + x],
                                         st[2 * F + x], 1, &pd, &ds);
                    else
                        tfm__cu_attn_grad(a, b, bh, q0 + x, j0 + jr, sc[n][2 * r + c], dp[n][2 * r + c], st[x],
                                          st[F + x], st[2 * F + x], 1, &pd, &ds);
                }
                sc[n][2 * r + c] = pd;
                dp[n][2 * r + c] = ds;
            }
    }
}

/* dv_j += sum_i pd_ij dout_i, dk_j += scale sum_i ds_ij q_i (a.overwrite: =): block (tile, b * Hkv + g) holds
   TFM__CU_FB keys of key/value head g and runs over the queries of each head of g's group (dk or dv may be
   NULL), heads of up to TD channels. Warp w's 16 keys run through tfm__cu_mma16816: S^T = K Q^T and dP^T = V
   dout^T for a query tile in registers (A from the warp's rows of K and V), each element's probability and
   score gradient in place (tfm__cu_attn_grad, with the tile's per-query statistics from shared memory),
   rounded to bf16 as the A operands of dv += P^T dout and dk += dS^T q, whose sums stay in registers. */
template <int TD, int WG>
static __global__ void tfm__k_attn_flash_dkv(tfm__attn_args a, const float *q, const float *k, const float *v,
                                             const float *lse, const int32_t *lens, const float *mask, const float *Dr,
                                             const float *one, float *dk, int lddk, float *dv, int lddv,
                                             const float *dout, int lddo) {
#if TFM__CU_MMA
    TFM__SHARED_DYN(unsigned char, raw);
    int Hkv = a.Hkv ? a.Hkv : a.H, G = a.H / Hkv, D = a.D, Dp = (D + 15) & ~15, ldh = Dp + 8;
    int F = TFM__CU_FB, tiles = (a.Tk + F - 1) / F, bg = (int)blockIdx.x / tiles, b = bg / Hkv, kvh = bg % Hkv;
    int j0 = ((int)blockIdx.x % tiles) * F, nk = TFM__MIN(F, a.Tk - j0), lane = (int)threadIdx.x & 31;
    int w = (int)threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    int i_lo = 0, i1 = a.Tq, nqt, np, p, buf, r, c, n, kk, cm = WG && TFM__CU_WG;
    uint16_t *sk = (uint16_t *)(void *)tfm__cu_flash_base(raw), *sv = sk + F * ldh, *sqd = sv + F * ldh; /* 2 x (q, dout) */
    float *sst = (float *)(void *)(sqd + 4 * F * ldh); /* 2 x the running tile's 5 statistics a query */
    float accv[TD / 8][4], acck[TD / 8][4], sc[TFM__CU_FB / 8][4], dp[TFM__CU_FB / 8][4];
    tfm__cu_attn_ptrs(&a, q, k, v, NULL, NULL, lens, NULL, NULL, mask);
    TFM__UNROLL
    for (n = 0; n < TD / 8; n++)
        TFM__UNROLL
        for (c = 0; c < 4; c++) accv[n][c] = acck[n][c] = 0.0f;
    /* causal: only the queries from key j0 on see these keys; with a window, only up to the last key's window
       (a sink: every query from it on). The block's running tiles: np = G x nqt (head, query tile) pairs */
    if (a.causal) i_lo = TFM__MIN(j0, a.Tq);
    if (a.window && a.causal && j0 >= a.sinks) i1 = TFM__MIN(a.Tq, j0 + nk - 1 + a.window);
    nqt = i1 > i_lo ? (i1 - i_lo + F - 1) / F : 0, np = G * nqt;
    if (np) tfm__cu_flash_qd(&a, sqd, sst, q, dout, lddo, lse, Dr, one, b, kvh * G, i_lo, i1, ldh, Dp, cm);
    tfm__cu_cp_commit();
    tfm__cu_ftile(sk, ldh, k, ((int64_t)b * a.Tk + j0) * a.ldk + kvh * D, a.ldk, nk, D, Dp, a.qkv_bf, 0, cm);
    tfm__cu_ftile(sv, ldh, v, ((int64_t)b * a.Tk + j0) * a.ldv + kvh * D, a.ldv, nk, D, Dp, a.qkv_bf, 0, cm);
    for (p = 0, buf = 0; p < np; p++, buf ^= 1) {
        int h = kvh * G + p / nqt, bh = b * a.H + h, q0 = i_lo + p % nqt * F;
        const uint16_t *sq = sqd + 2 * buf * F * ldh, *sdo = sq + F * ldh;
        const float *sL = sst + 5 * buf * F;
        const int *sn = (const int *)(const void *)(sL + 3 * F), *slo = sn + F;
        int all, x = (int)threadIdx.x;
        __syncthreads(); /* every warp is done with the other buffer: the next pair's tiles go there as this one runs */
        if (p + 1 < np)
            tfm__cu_flash_qd(&a, sqd + 2 * (buf ^ 1) * F * ldh, sst + 5 * (buf ^ 1) * F, q, dout, lddo, lse, Dr, one, b,
                             kvh * G + (p + 1) / nqt, i_lo + (p + 1) % nqt * F, i1, ldh, Dp, cm);
        tfm__cu_cp_commit();
        tfm__cu_cp_wait(1);
        if (cm) tfm__cu_wg_proxy();
        /* the barrier; and whether every query of the tile sees every key of the block (thread x < F asks
           for query x, whose statistics it wrote itself) */
        all = __syncthreads_and(x >= F || tfm__cu_attn_sees_all(&a, j0, F, sn[x], slo[x]));
        if (cm) { /* this warp's 16 keys against the tile's queries: S^T = K q^T and dP^T = V dout^T */
            tfm__cu_wg_rows<TD>(sc, sk, sq); /* (one after the other, as dq's) */
            tfm__cu_wg_done(sc, TFM__CU_FB / 8);
            tfm__cu_wg_rows<TD>(dp, sv, sdo);
            tfm__cu_wg_done(dp, TFM__CU_FB / 8);
        } else {
            tfm__cu_mma_rows<TD>(sc, sk + 16 * w * ldh, sq, ldh, Dp);
            tfm__cu_mma_rows<TD>(dp, sv + 16 * w * ldh, sdo, ldh, Dp);
        }
        TFM__UNROLL
        for (r = 0; r < 2; r++) { /* P (unscaled: dropout's factor goes on dv's sums) and dS in place */
            if (all) tfm__cu_flash_col<1>(&a, sc, dp, r, t, 16 * w + g + 8 * r, nk, j0, b, bh, q0, sL);
            else tfm__cu_flash_col<0>(&a, sc, dp, r, t, 16 * w + g + 8 * r, nk, j0, b, bh, q0, sL);
        }
        if (cm) { /* dv += P^T dout, dk += dS^T q: dout and q as stored, both in flight at once */
            tfm__cu_wg_sum<TD>(accv, sc, sdo);
            tfm__cu_wg_sum<TD>(acck, dp, sq);
            tfm__cu_wg_done(accv, TD / 8);
            tfm__cu_wg_hold(acck, TD / 8);
        } else {
            TFM__UNROLL
            for (kk = 0; kk < TFM__CU_FB / 16; kk++) { /* (over queries 16 kk ..) */
                tfm__cu_mma_sum<TD>(accv, sc[2 * kk], sc[2 * kk + 1], sdo + 16 * kk * ldh, ldh, Dp);
                tfm__cu_mma_sum<TD>(acck, dp[2 * kk], dp[2 * kk + 1], sq + 16 * kk * ldh, ldh, Dp);
            }
        }
    }
    TFM__UNROLL
    for (r = 0; r < 2; r++) {
        int jr = 16 * w + g + 8 * r;
        if (jr >= nk) continue;
        TFM__UNROLL
        for (n = 0; n < TD / 8; n++)
            TFM__UNROLL
            for (c = 0; c < 2; c++) {
                int x = 8 * n + 2 * t + c;
                if (x >= D) continue;
                if (dv) tfm__cu_flash_put(&a, dv, ((int64_t)b * a.Tk + j0 + jr) * lddv + kvh * D + x,
                                          tfm__cu_drop_scale(&a) * accv[n][2 * r + c]);
                if (dk) tfm__cu_flash_put(&a, dk, ((int64_t)b * a.Tk + j0 + jr) * lddk + kvh * D + x, a.scale * acck[n][2 * r + c]);
            }
    }
#else
    (void)a, (void)q, (void)k, (void)v, (void)lse, (void)lens, (void)mask, (void)Dr, (void)one, (void)dk, (void)lddk;
    (void)dv, (void)lddv, (void)dout, (void)lddo;
#endif
}

/* Lets kernel k (slot: 0 forward, 1 dq, 2 dk and dv; 3, 4, 5 the same for heads over 64 channels; 6-11 the
   same with WG) take bytes of dynamic shared memory (past the default 48 KiB: an opt-in, made once a size) */
static TFM__THREAD_LOCAL size_t tfm__cu_optin[12];
static int tfm__cu_optin_set(int slot, size_t bytes, cudaError_t e) {
    if (!tfm__cuda_ok(e, "cudaFuncSetAttribute (flash attention's shared memory)")) return 0;
    tfm__cu_optin[slot] = bytes;
    return 1;
}
#define TFM__CU_OPTIN(k, slot, bytes)                                                                                     \
    ((bytes) <= tfm__cu_optin[slot] ||                                                                                    \
     tfm__cu_optin_set(slot, bytes, cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(bytes))))

/* Whether this thread's flash kernels for heads of D channels take Hopper's warpgroup products: the heads pad
   to exactly a kernel's width (64 or TFM__CU_TD), and tfm__cu_wg_off (the tests' and the bench's switch) is
   0. The WG kernels run mma.sync where the build has no wgmma. */
static TFM__THREAD_LOCAL int tfm__cu_wg_off;
static int tfm__cu_flash_wg(int D) {
    int Dp = (D + 15) & ~15;
    return !tfm__cu_wg_off && (Dp == 64 || Dp == TFM__CU_TD);
}

/* Launches flash kernel K (slot kind: 0 forward, 1 dq, 2 dk/dv) for heads of D channels: K<64, wg> up to 64
   channels, else K<TFM__CU_TD, wg>, each after its shared-memory opt-in */
#define TFM__CU_FLASH(K, kind, D, wg, grid, smem, ...)                                                                     \
    do {                                                                                                                  \
        if ((D) <= 64 && (wg) && TFM__CU_OPTIN((K<64, 1>), (kind) + 6, smem))                                          \
            TFM__LAUNCH((K<64, 1>), grid, 128, smem, __VA_ARGS__);                                                        \
        else if ((D) <= 64 && !(wg) && TFM__CU_OPTIN((K<64, 0>), (kind), smem))                                        \
            TFM__LAUNCH((K<64, 0>), grid, 128, smem, __VA_ARGS__);                                                        \
        else if ((D) > 64 && (wg) && TFM__CU_OPTIN((K<TFM__CU_TD, 1>), (kind) + 9, smem))                              \
            TFM__LAUNCH((K<TFM__CU_TD, 1>), grid, 128, smem, __VA_ARGS__);                                                \
        else if ((D) > 64 && !(wg) && TFM__CU_OPTIN((K<TFM__CU_TD, 0>), (kind) + 3, smem))                             \
            TFM__LAUNCH((K<TFM__CU_TD, 0>), grid, 128, smem, __VA_ARGS__);                                                \
    } while (0)

/* Whether this thread's GPU runs the flash kernels for heads of D channels: bf16 tensor cores (compute
   capability 8.0 on) and the shared memory the largest of them needs (dk/dv's: 105 KiB at 128 channels,
   so sm_80 and sm_90 up to 128; GPUs with 99 KiB a block: up to 112) */
static int tfm__cu_flash_ok(int D) {
    static TFM__THREAD_LOCAL int major = -1, optin = 0;
    int dev = 0;
    if (major < 0 && (cudaGetDevice(&dev) != cudaSuccess ||
                      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
                      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess))
        major = 0;
    return major >= 8 && tfm__cu_flash_smem(2, D) <= (size_t)optin;
}

/* Which way a call goes: 3 the flash kernels (a bf16 model's call over whole sequences, not a decoding step
   against a cache, with heads of up to TFM__CU_TD channels on a GPU with bf16 tensor cores and the shared
   memory: tfm__cu_flash_ok); 2 bf16 batched products (the same calls otherwise); 1 fp32 batched products (fp32
   heads wider than TFM__CU_TD, decoding steps included); 0 the tiled fp32 kernels. */
static int tfm__attn_path(const tfm__attn_args *a) {
    if (a->Tk <= 0) return 0;
    if (tfm__model_prec == TFM_PREC_BF16 && !a->kv_rows && !a->q_off && !a->ring && !a->bsk)
        return a->D <= TFM__CU_TD && tfm__cu_flash_ok(a->D) ? 3 : 2;
    return a->D > TFM__CU_TD;
}

static int tfm__attention_forward_cuda(const tfm__attn_args *a) {
    tfm__cu_attn_io io;
    tfm__attn_args t;
    int path = tfm__attn_path(a), bm = path == 1 || path == 2, R = a->D <= 64 ? 4 : 2;
    size_t smem = (4 * (size_t)R * a->D + TFM__CU_TW * (2 * (size_t)a->D + 1)) * sizeof(float);
    unsigned grid = (unsigned)((a->Tq + 4 * R - 1) / (4 * R)) * (unsigned)(a->B * a->H);
    if (a->Tq <= 0 || a->B * a->H <= 0 || !tfm__cu_attn_stage(a, &io, bm ? TFM__CU_BFA_PTRS : 0, &t)) return 1;
    if (bm) return tfm__attn_batched_forward_cuda(&t, &io, (unsigned char *)io.Dr, path == 2);
    if (path == 3) {
        smem = tfm__cu_flash_smem(0, a->D);
        grid = (unsigned)((a->Tq + TFM__CU_FB - 1) / TFM__CU_FB) * (unsigned)(a->B * a->H);
        TFM__CU_FLASH(tfm__k_attn_flash_fwd, 0, a->D, tfm__cu_flash_wg(a->D), grid, smem, t, a->q, a->k, a->v, a->out,
                      a->lse, io.lens, io.mask);
        TFM__CU_LAUNCHED("tfm__k_attn_flash_fwd");
        return 1;
    }
    /* decoding against a cache: no row reads a key past its own position, so the keys' count can be the
       cache's rows, and a step's launch is the same at every length (a decoding graph replays) */
    if (a->q_off && a->bsk && a->causal && !a->mask && a->dropout == 0.0f) t.Tk = (int)(a->bsk / a->ldk);
    if (R == 4)
        TFM__LAUNCH(tfm__k_attn_fwd_tiled<4>, grid, 128, smem, t, a->q, a->k, a->v, a->out, a->lse, io.lens, io.rows, io.qoff,
                    io.mask);
    else
        TFM__LAUNCH(tfm__k_attn_fwd_tiled<2>, grid, 128, smem, t, a->q, a->k, a->v, a->out, a->lse, io.lens, io.rows, io.qoff,
                    io.mask);
    TFM__CU_LAUNCHED("tfm__k_attn_fwd_tiled");
    return 1;
}

static int tfm__attention_backward_cuda(const tfm__attn_args *a, float *dq, int lddq, float *dk, int lddk, float *dv,
                                        int lddv, const float *dout, int lddo) {
    tfm__cu_attn_io io;
    tfm__attn_args t;
    int64_t nrow = (int64_t)a->B * a->H * a->Tq;
    float *one;
    int path = tfm__attn_path(a), bm = path == 1 || path == 2, R = a->D <= 64 ? 4 : 2, Hkv = a->Hkv ? a->Hkv : a->H;
    size_t smem = (8 * (size_t)R * a->D + 2 * (size_t)TFM__CU_TW * (a->D + 1)) * sizeof(float);
    unsigned gq = (unsigned)((a->Tq + 4 * R - 1) / (4 * R)) * (unsigned)(a->B * a->H);
    unsigned gk = (unsigned)((a->Tk + 4 * R - 1) / (4 * R)) * (unsigned)(a->B * Hkv);
    if (nrow <= 0 || a->Tk <= 0 || !tfm__cu_attn_stage(a, &io, 2 * (size_t)nrow * sizeof(float) + (bm ? TFM__CU_BFA_PTRS : 0), &t))
        return 1;
    one = io.Dr + nrow;
    TFM__LAUNCH(tfm__k_attn_dr, tfm__cu_grid(32 * nrow), TFM__CU_THREADS, 0, io.Dr, one, t, a->out, dout, lddo, io.lens,
                io.mask, path >= 2);
    TFM__CU_LAUNCHED("tfm__k_attn_dr");
    if (bm)
        return tfm__attn_batched_backward_cuda(&t, &io, (unsigned char *)(one + nrow), path == 2, one, dq, lddq, dk, lddk, dv,
                                               lddv, dout, lddo);
    if (path == 3) {
        size_t s1 = tfm__cu_flash_smem(1, a->D), s2 = tfm__cu_flash_smem(2, a->D);
        gq = (unsigned)((a->Tq + TFM__CU_FB - 1) / TFM__CU_FB) * (unsigned)(a->B * a->H);
        gk = (unsigned)((a->Tk + TFM__CU_FB - 1) / TFM__CU_FB) * (unsigned)(a->B * Hkv);
        int wg = tfm__cu_flash_wg(a->D);
        if (dq) {
            TFM__CU_FLASH(tfm__k_attn_flash_dq, 1, a->D, wg, gq, s1, t, a->q, a->k, a->v, a->lse, io.lens, io.mask, io.Dr, one,
                          dq, lddq, dout, lddo);
            TFM__CU_LAUNCHED("tfm__k_attn_flash_dq");
        }
        if (dk || dv) {
            TFM__CU_FLASH(tfm__k_attn_flash_dkv, 2, a->D, wg, gk, s2, t, a->q, a->k, a->v, a->lse, io.lens, io.mask, io.Dr,
                          one, dk, lddk, dv, lddv, dout, lddo);
            TFM__CU_LAUNCHED("tfm__k_attn_flash_dkv");
        }
        return 1;
    }
    if (dq) { /* the tiled kernels: 4R rows a block */
        if (R == 4)
            TFM__LAUNCH(tfm__k_attn_dq_tiled<4>, gq, 128, smem, t, a->q, a->k, a->v, a->lse, io.lens, io.mask, io.Dr, one, dq,
                        lddq, dout, lddo);
        else
            TFM__LAUNCH(tfm__k_attn_dq_tiled<2>, gq, 128, smem, t, a->q, a->k, a->v, a->lse, io.lens, io.mask, io.Dr, one, dq,
                        lddq, dout, lddo);
        TFM__CU_LAUNCHED("tfm__k_attn_dq_tiled");
    }
    if (dk || dv) {
        if (R == 4)
            TFM__LAUNCH(tfm__k_attn_dkv_tiled<4>, gk, 128, smem, t, a->q, a->k, a->v, a->lse, io.lens, io.mask, io.Dr, one, dk,
                        lddk, dv, lddv, dout, lddo);
        else
            TFM__LAUNCH(tfm__k_attn_dkv_tiled<2>, gk, 128, smem, t, a->q, a->k, a->v, a->lse, io.lens, io.mask, io.Dr, one, dk,
                        lddk, dv, lddv, dout, lddo);
        TFM__CU_LAUNCHED("tfm__k_attn_dkv_tiled");
    }
    return 1;
}

/* -- the public CUDA calls -- */

TFMDEF tfm_result tfm_cuda_available(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return tfm__cuda_result("tfm_cuda_available", e, "cudaGetDeviceCount");
    if (n < 1) return tfm__fail(TFM_E_NO_CUDA, "tfm_cuda_available: no CUDA device is present");
    return TFM_OK;
}

TFMDEF tfm_result tfm_cuda_device_info(char *buf, size_t size) {
    const char *fn = "tfm_cuda_device_info";
    cudaDeviceProp p;
    cudaError_t e;
    int dev = 0;
    if (!buf || !size) return tfm__fail(TFM_E_ARG, "%s: buf is NULL or size 0", fn);
    buf[0] = 0;
    TFM__TRY(tfm_cuda_available());
    if ((e = cudaGetDevice(&dev)) != cudaSuccess) return tfm__cuda_result(fn, e, "cudaGetDevice");
    memset(&p, 0, sizeof p);
    if ((e = cudaGetDeviceProperties(&p, dev)) != cudaSuccess) return tfm__cuda_result(fn, e, "cudaGetDeviceProperties");
    snprintf(buf, size, "%s, %.1f GiB, sm_%d%d, %d SMs", p.name, (double)p.totalGlobalMem / 1073741824.0, p.major, p.minor,
             p.multiProcessorCount);
    return TFM_OK;
}

TFMDEF tfm_result tfm_cuda_malloc(void **ptr, size_t bytes) {
    if (!ptr) return tfm__fail(TFM_E_ARG, "tfm_cuda_malloc: ptr is NULL");
    return tfm__dev_alloc("tfm_cuda_malloc", ptr, bytes);
}

TFMDEF void tfm_cuda_free(void *ptr) { tfm__dev_free(ptr); }

TFMDEF tfm_result tfm_cuda_synchronize(void) {
    (void)tfm__cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    return tfm__cuda_check("tfm_cuda_synchronize");
}

TFMDEF tfm_result tfm_cuda_set_tf32(int on) {
    tfm__cu.tf32 = on != 0;
    return TFM_OK;
}

TFMDEF tfm_result tfm_cuda_set_graphs(int on) {
    tfm__cu.graphs_off = on == 0;
    return TFM_OK;
}

#else /* no TFM_CUDA: the calls exist and say so */

static tfm_result tfm__cuda_check(const char *fn) {
    (void)fn;
    return TFM_OK;
}
static void tfm__cuda_release(void) {}
static tfm_result tfm__dev_alloc(const char *fn, void **p, size_t bytes) {
    (void)bytes;
    *p = NULL;
    return tfm__fail(TFM_E_NO_CUDA, "%s: CUDA memory asked for, but this build has no TFM_CUDA", fn);
}
static void tfm__dev_free(void *p) { (void)p; }

TFMDEF tfm_result tfm_cuda_available(void) {
    return tfm__fail(TFM_E_NO_CUDA, "tfm_cuda_available: this build has no TFM_CUDA");
}
TFMDEF tfm_result tfm_cuda_device_info(char *buf, size_t size) {
    if (buf && size) buf[0] = 0;
    return tfm__fail(TFM_E_NO_CUDA, "tfm_cuda_device_info: this build has no TFM_CUDA");
}
TFMDEF tfm_result tfm_cuda_malloc(void **ptr, size_t bytes) {
    (void)bytes;
    if (ptr) *ptr = NULL;
    return tfm__fail(TFM_E_NO_CUDA, "tfm_cuda_malloc: this build has no TFM_CUDA");
}
TFMDEF void tfm_cuda_free(void *ptr) { (void)ptr; }
TFMDEF tfm_result tfm_cuda_synchronize(void) {
    return tfm__fail(TFM_E_NO_CUDA, "tfm_cuda_synchronize: this build has no TFM_CUDA");
}
TFMDEF tfm_result tfm_cuda_set_tf32(int on) {
    (void)on;
    return tfm__fail(TFM_E_NO_CUDA, "tfm_cuda_set_tf32: this build has no TFM_CUDA");
}
TFMDEF tfm_result tfm_cuda_set_graphs(int on) {
    (void)on;
    return tfm__fail(TFM_E_NO_CUDA, "tfm_cuda_set_graphs: this build has no TFM_CUDA");
}

#endif /* TFM_CUDA */

/* ==== >>impl-dispatch ====
   One entry per op between the layers and the kernels: tfm__op_<op>(device, ...) picks the kernel for
   the device the data lives on. Layers, blocks, models and generation call only these (never a _cpu or
   _cuda kernel, never memset or memcpy on activations), so a device is added by adding kernels here.
   Floats are on `dev`; integer arrays (ids, targets, lengths) are host memory on either device. A build
   without TFM_CUDA refuses CUDA tensors and models at the public boundary, so reaching here with one is
   an internal error. */

#if defined(TFM_CUDA)
/* the CUDA launcher when the data lives on the GPU: TFM__CUDA(dev, launcher(...); return) */
#define TFM__CUDA(dev, stmt)           \
    if ((dev) == TFM_DEVICE_CUDA) {    \
        stmt;                          \
    }
#else
#define TFM__CUDA(dev, stmt) TFM_ASSERT((dev) == TFM_DEVICE_CPU)
#endif

static void tfm__op_zero(tfm_device dev, float *x, int64_t n) {
    TFM__CUDA(dev, tfm__zero_cuda(x, n); return);
    if (n > 0) memset(x, 0, (size_t)n * sizeof(float));
}
/* n rows of C floats: dst row r at dst + r*ldd, src row r at src + r*lds (lds 0: one row to every row).
   On CUDA, src or dst may be host memory (a batch's inputs) when lds, ldd >= C. */
static void tfm__op_copy_rows(tfm_device dev, float *dst, int64_t ldd, const float *src, int64_t lds, int64_t n,
                              int64_t C) {
    TFM__CUDA(dev, tfm__copy_rows_cuda(dst, ldd, src, lds, n, C, 0); return);
    tfm__copy_rows_cpu(dst, ldd, src, lds, n, C);
}
/* B groups of n rows of C floats: group b's row r (src + (b n + r) lds) to dst row drow[b] + r (stride ldd);
   drow in host memory. Device memory on both sides on CUDA, where it is one launch. */
static void tfm__op_scatter_rows(tfm_device dev, float *dst, int64_t ldd, const int64_t *drow, const float *src,
                                 int64_t lds, int64_t B, int64_t n, int64_t C) {
    int64_t b;
    TFM__CUDA(dev, tfm__scatter_rows_cuda(dst, ldd, drow, src, lds, B, n, C); return);
    for (b = 0; b < B; b++) tfm__copy_rows_cpu(dst + drow[b] * ldd, ldd, src + b * n * lds, lds, n, C);
}
static void tfm__op_copy(tfm_device dev, float *dst, const float *src, int64_t n) {
    tfm__op_copy_rows(dev, dst, n, src, n, 1, n);
}
/* dst row r (stride ldd) += src row r (stride lds) */
static void tfm__op_add_rows(tfm_device dev, float *dst, int64_t ldd, const float *src, int64_t lds, int64_t n,
                             int64_t C) {
    TFM__CUDA(dev, tfm__copy_rows_cuda(dst, ldd, src, lds, n, C, 1); return);
    tfm__add_rows_cpu(dst, ldd, src, lds, n, C);
}
static void tfm__op_gemm_batched(tfm_device dev, int ta, int tb, int M, int N, int K, float alpha, const float *A,
                                 int lda, int64_t sA, const float *B, int ldb, int64_t sB, float beta, float *C, int ldc,
                                 int64_t sC, int batch) {
    TFM__CUDA(dev, tfm__gemm_cuda(ta, tb, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch, 0, NULL); return);
    tfm__sgemm_batched(ta, tb, M, N, K, alpha, A, lda, sA, B, ldb, sB, beta, C, ldc, sC, batch);
}
/* xbf (here and below): x is a bf16 activation (tfm__bf16_store; rows of ldx bf16 elements), on the GPU only;
   tfm__op_linear_bwd's a bit mask: 1 x, 2 dy (rows of lddy bf16 elements; db's sums read them so) */
static void tfm__op_linear(tfm_device dev, float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                           const float *b, int64_t N, int64_t I, int64_t O, int xbf) {
    TFM__CUDA(dev, tfm__linear_forward_cuda(y, ldy, x, ldx, w, b, N, I, O, xbf); return);
    TFM_ASSERT(!xbf);
    tfm__linear_forward_cpu(y, ldy, x, ldx, w, b, N, I, O);
}
/* y = x w^T + b (b may be NULL) written as bf16 rows of ldy elements, in one product whose epilogue adds the bias
   (cuBLASLt): a bf16 model's q|k|v for the flash kernels (tfm__op_attention_flash), the same bits they rounded
   the fp32 ones to; a bf16 training step's logits. Returns 0, having written nothing, where it cannot be (the
   CPU, no cuBLASLt algorithm): the caller runs tfm__op_linear. */
static int tfm__op_linear_to_bf16(tfm_device dev, float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                                  const float *b, int64_t N, int64_t I, int64_t O, int xbf) {
    TFM__CUDA(dev, return tfm__gemm_cuda(0, 1, (int)N, (int)O, (int)I, 1.0f, x, (int)ldx, 0, w, (int)I, 0, 0.0f, y, (int)ldy,
                                         0, 1, (xbf ? 1 : 0) | TFM__GEMM_OUT_BF16, b));
    (void)y, (void)ldy, (void)x, (void)ldx, (void)w, (void)b, (void)N, (void)I, (void)O, (void)xbf;
    return 0;
}
/* n rows of C into dst (rows of ldd): ldsb 0, src's rows (of ldd; src may be dst) rounded to bf16 and kept as
   floats; else src's bf16 rows of ldsb (a bf16 activation), widened. The GPU only. */
static void tfm__op_bf16_rows(tfm_device dev, float *dst, int64_t ldd, const float *src, int64_t ldsb, int64_t n, int64_t C) {
    TFM__CUDA(dev, tfm__bf16_rows_cuda(dst, ldd, src, ldsb, n, C); return);
    (void)dst, (void)ldd, (void)src, (void)ldsb, (void)n, (void)C;
    TFM_ASSERT(0);
}
/* rows x cols floats at src (rows of lds) rounded to bf16, into dst's bf16 elements from element off (rows of
   ldd of them): a GPU's bf16 activations only */
static void tfm__op_to_bf16(tfm_device dev, float *dst, int64_t ldd, int64_t off, const float *src, int64_t lds,
                            int64_t rows, int64_t cols) {
    TFM__CUDA(dev, (void)tfm__bf16_operand_cuda((uint16_t *)(void *)dst + off, ldd, src, lds, 0, rows, cols, 1); return);
    (void)dst, (void)ldd, (void)off, (void)src, (void)lds, (void)rows, (void)cols;
    TFM_ASSERT(0);
}
/* returns 1 where dx was written in bf16 (xbf's bit 4, on the GPU: tfm__linear_backward_cuda) */
static int tfm__op_linear_bwd(tfm_device dev, float *dx, int64_t lddx, float dx_beta, float *dw, float *db,
                              const float *dy, int64_t lddy, const float *x, int64_t ldx, const float *w, int64_t N,
                              int64_t I, int64_t O, int xbf) {
    TFM__CUDA(dev, return tfm__linear_backward_cuda(dx, lddx, dx_beta, dw, db, dy, lddy, x, ldx, w, N, I, O, xbf));
    TFM_ASSERT(!xbf);
    tfm__linear_backward_cpu(dx, lddx, dx_beta, dw, db, dy, lddy, x, ldx, w, N, I, O);
    return 0;
}
static void tfm__op_softmax(tfm_device dev, float *y, const float *x, int64_t N, int64_t C, int log) {
    TFM__CUDA(dev, tfm__softmax_cuda(y, x, N, C, log); return);
    if (log) tfm__log_softmax_forward_cpu(y, x, N, C);
    else tfm__softmax_forward_cpu(y, x, N, C);
}
static void tfm__op_softmax_bwd(tfm_device dev, float *dx, const float *dy, const float *y, int64_t N, int64_t C,
                                int log) {
    TFM__CUDA(dev, tfm__softmax_bwd_cuda(dx, dy, y, N, C, log); return);
    if (log) tfm__log_softmax_backward_cpu(dx, dy, y, N, C);
    else tfm__softmax_backward_cpu(dx, dy, y, N, C);
}
/* dxbf (on the GPU only; else NULL): also the gradient for a loss scale of 1, as tfm__op_cross_entropy_bwd
   writes it with dxbf, in the same pass. xbf (here and in tfm__op_cross_entropy_bwd): x is a bf16 activation
   (rows of tfm__bf16_ld(V)), on the GPU only. */
static float tfm__op_cross_entropy(tfm_device dev, float *lse, const float *x, int xbf, const int32_t *t, int ignore,
                                   float s, int64_t N, int64_t V, int64_t *counted, float *dxbf) {
    TFM__CUDA(dev, return tfm__cross_entropy_cuda(lse, x, xbf, t, ignore, s, N, V, counted, dxbf));
    TFM_ASSERT(!dxbf && !xbf);
    return tfm__cross_entropy_forward_cpu(lse, x, t, ignore, s, N, V, counted);
}
/* ids[r] (host memory) = tfm__argmax_cpu of row r of x, N rows of V <= 2^24 */
static void tfm__op_argmax(tfm_device dev, int32_t *ids, const float *x, int64_t N, int64_t V) {
    int64_t r;
    TFM__CUDA(dev, tfm__argmax_cuda(ids, x, N, V); return);
    for (r = 0; r < N; r++) ids[r] = (int32_t)tfm__argmax_cpu(x + r * V, V);
}
/* dx += the gradient; dxbf: dx written as a bf16 activation instead (tfm__bf16_store), on the GPU only */
static void tfm__op_cross_entropy_bwd(tfm_device dev, float *dx, float dloss, const float *x, int xbf, const float *lse,
                                      const int32_t *t, int ignore, float s, int64_t N, int64_t V, int dxbf) {
    TFM__CUDA(dev, tfm__cross_entropy_bwd_cuda(dx, dloss, x, xbf, lse, t, ignore, s, N, V, dxbf); return);
    TFM_ASSERT(!dxbf && !xbf);
    tfm__cross_entropy_backward_cpu(dx, dloss, x, lse, t, ignore, s, N, V);
}
/* rms: RMSNorm (no centering, mean unused); ybf: y a bf16 activation (rows of tfm__bf16_ld(C)), on the GPU only */
static void tfm__op_layernorm(tfm_device dev, float *y, float *mean, float *rstd, const float *x, const float *g,
                              const float *b, float eps, int64_t N, int64_t C, int rms, int ybf) {
    TFM__CUDA(dev, tfm__layernorm_cuda(y, mean, rstd, x, g, b, eps, N, C, rms, ybf); return);
    TFM_ASSERT(!ybf);
    tfm__layernorm_forward_cpu(y, mean, rstd, x, g, b, eps, N, C, rms);
}
/* dx = res + the layernorm's input gradient; res may be dx (accumulate) or NULL (dx only written) */
static void tfm__op_layernorm_bwd(tfm_device dev, float *dx, const float *res, float *dg, float *db, const float *dy,
                                  const float *x, const float *g, const float *mean, const float *rstd, int64_t N,
                                  int64_t C, int rms) {
    TFM__CUDA(dev, tfm__layernorm_bwd_cuda(dx, res, dg, db, dy, x, g, mean, rstd, N, C, rms); return);
    tfm__layernorm_backward_cpu(dx, res, dg, db, dy, x, g, mean, rstd, N, C, rms);
}
/* sum = a + b (n rows of C), then y = LN(sum) as tfm__op_layernorm: a residual add and the norm after it. bbf (on
   the GPU only): 1, b is a bf16 activation (rows of tfm__bf16_ld(C)); 2, b's floats rounded to bf16 as read (the
   same values). */
static void tfm__op_add_layernorm(tfm_device dev, float *sum, float *y, float *mean, float *rstd, const float *a,
                                  const float *b, int bbf, const float *g, const float *bias, float eps, int64_t N,
                                  int64_t C, int rms, int ybf) {
    TFM__CUDA(dev, tfm__add_layernorm_cuda(sum, y, mean, rstd, a, b, bbf, g, bias, eps, N, C, rms, ybf); return);
    TFM_ASSERT(!ybf && !bbf);
    tfm__add_cpu(sum, a, b, N * C);
    tfm__layernorm_forward_cpu(y, mean, rstd, sum, g, bias, eps, N, C, rms);
}
/* act: a tfm_activation */
static void tfm__op_act(tfm_device dev, int act, float *y, const float *x, int64_t n) {
    TFM__CUDA(dev, tfm__act_cuda(act, y, x, n); return);
    if (act == TFM_ACT_RELU) tfm__relu_forward_cpu(y, x, n);
    else tfm__gelu_forward_cpu(y, x, n, act == TFM_ACT_GELU_TANH ? TFM_GELU_TANH : TFM_GELU_ERF);
}
/* dx = acc * dx + dy * act'(x) (acc 0: dx is not read) */
static void tfm__op_act_bwd(tfm_device dev, int act, float *dx, const float *dy, const float *x, int64_t n, float acc) {
    TFM__CUDA(dev, tfm__act_bwd_cuda(act, dx, dy, x, n, acc); return);
    if (act == TFM_ACT_RELU) tfm__relu_backward_cpu(dx, dy, x, n, acc);
    else tfm__gelu_backward_cpu(dx, dy, x, n, act == TFM_ACT_GELU_TANH ? TFM_GELU_TANH : TFM_GELU_ERF, acc);
}
/* The same for a bf16 model's hidden layer on the GPU (blk->bf_h; act not SwiGLU): dx written in bf16 (rows of
   tfm__bf16_ld(F)), as only products read it, and db += dx's column sums in fp32 (may be NULL), in one pass:
   the same bits as tfm__op_act_bwd then tfm__op_linear_bwd's rounding of dx and its bias sums. xbf, dybf: x, dy
   are bf16 too (rows of tfm__bf16_ld(F): tfm__op_linear_act's pre, the second map's input gradient). */
static void tfm__op_act_bwd_bf16(tfm_device dev, int act, float *dx, float *db, const float *dy, int dybf, const float *x,
                                 int64_t N, int64_t F, int xbf) {
    TFM__CUDA(dev, tfm__colsums_cuda(NULL, db, dy, F, dybf ? tfm__bf16_ld(F) : 0, x, xbf ? tfm__bf16_ld(F) : 0, NULL, NULL, 0,
                                     act, (uint16_t *)(void *)dx, tfm__bf16_ld(F), N, F);
              return);
    (void)act, (void)dx, (void)db, (void)dy, (void)dybf, (void)x, (void)N, (void)F, (void)xbf; /* the GPU only: never reached on the CPU */
    TFM_ASSERT(dev == TFM_DEVICE_CUDA);
}
/* SwiGLU's backward: dh (N,2F) written from dy (N,F) and h (N,2F); its forward is tfm__op_linear_act's. dhbf
   (the GPU, a bf16 model's hidden layer without a bias): dh in bf16, rows of tfm__bf16_ld(2F), as only the first
   map's products read it; hbf, dybf (the GPU): h, dy are bf16 too (rows of tfm__bf16_ld(2F): tfm__op_linear_act's
   pre; of tfm__bf16_ld(F): the second map's input gradient). */
static void tfm__op_swiglu_bwd(tfm_device dev, float *dh, const float *dy, int dybf, const float *h, int64_t N, int64_t F,
                               int dhbf, int hbf) {
    TFM__CUDA(dev, tfm__swiglu_bwd_cuda(dh, dy, dybf, h, N, F, dhbf, hbf); return);
    TFM_ASSERT(!dhbf && !hbf && !dybf);
    tfm__swiglu_backward_cpu(dh, dy, h, N, F);
}
/* An MLP's first linear map and its activation: pre = x w^T + b (N rows of F1 = F, or 2F for SwiGLU), y =
   act(pre) (N rows of F); x rows of C; xbf, ybf: x, y bf16 activations (rows of tfm__bf16_ld(C),
   tfm__bf16_ld(F)), on the GPU only. Returns 1 when pre is bf16 (rows of tfm__bf16_ld(F1):
   tfm__linear_act_cuda), 0 when fp32. */
static int tfm__op_linear_act(tfm_device dev, int act, float *y, float *pre, const float *x, const float *w,
                              const float *b, int64_t N, int64_t C, int64_t F, int xbf, int ybf) {
    TFM__CUDA(dev, return tfm__linear_act_cuda(act, y, pre, x, w, b, N, C, F, xbf, ybf));
    TFM_ASSERT(!xbf && !ybf);
    tfm__linear_forward_cpu(pre, act == TFM_ACT_SWIGLU ? 2 * F : F, x, C, w, b, N, C, act == TFM_ACT_SWIGLU ? 2 * F : F);
    if (act == TFM_ACT_SWIGLU) tfm__swiglu_forward_cpu(y, pre, N, F);
    else tfm__op_act(dev, act, y, pre, N * F);
    return 0;
}
/* rotary embedding (pos0: B host integers or NULL); inverse: the transpose; acc: y += */
static void tfm__op_rope(tfm_device dev, float *y, const float *x, int64_t ld, int64_t B, int64_t T, int H, int D, int rot,
                         float base, const int32_t *pos0, int inverse, int acc) {
    TFM__CUDA(dev, tfm__rope_cuda(y, x, ld, B, T, H, D, rot, base, pos0, inverse, acc); return);
    TFM_ASSERT(acc != 2);
    tfm__rope_cpu(y, x, ld, B, T, H, D, rot, base, pos0, inverse, acc);
}
/* element i's mask is hash(seed, i0 + i) */
static void tfm__op_dropout(tfm_device dev, float *y, const float *x, int64_t n, float p, uint64_t seed, uint64_t i0,
                            int acc) {
    TFM__CUDA(dev, tfm__dropout_cuda(y, x, n, p, seed, i0, acc); return);
    tfm__dropout_cpu(y, x, n, p, seed, i0, acc);
}
static void tfm__op_embedding(tfm_device dev, float *y, const int32_t *ids, const float *w, float scale, int64_t N,
                              int64_t C) {
    TFM__CUDA(dev, tfm__embedding_cuda(y, ids, w, scale, N, C, 0); return);
    tfm__embedding_forward_cpu(y, ids, w, scale, N, C);
}
static void tfm__op_embedding_bwd(tfm_device dev, float *dw, const float *dy, const int32_t *ids, float scale,
                                  int64_t N, int64_t C) {
    TFM__CUDA(dev, tfm__embedding_cuda(dw, ids, dy, scale, N, C, 1); return);
    tfm__embedding_backward_cpu(dw, dy, ids, scale, N, C);
}
/* y[b,t] = x[b,t] + w[p0[b] + t]; p0 (host memory) NULL: y[b,t] = x[b,t] + w[t] */
static void tfm__op_pos_add(tfm_device dev, float *y, const float *x, const float *w, const int32_t *p0, int64_t B,
                            int64_t T, int64_t C) {
    TFM__CUDA(dev, tfm__pos_add_cuda(y, x, w, p0, B, T, C); return);
    tfm__pos_add_cpu(y, x, w, p0, B, T, C);
}
static void tfm__op_pos_bwd(tfm_device dev, float *dw, const float *dy, int64_t B, int64_t T, int64_t C) {
    TFM__CUDA(dev, tfm__colsum_cuda(dw, dy, T * C, B, T * C); return);
    tfm__pos_embedding_backward_cpu(dw, dy, B, T, C);
}
/* y = x + the sinusoidal table (x NULL: the table itself) */
static void tfm__op_sinusoid_add(tfm_device dev, float *y, const float *x, int64_t B, int64_t T, int64_t C) {
    TFM__CUDA(dev, tfm__pos_add_cuda(y, x, NULL, NULL, B, T, C); return);
    tfm__sinusoidal_add_cpu(y, x, B, T, C);
}
/* y = a + b; y may alias a or b (y += x is add(y, y, x)) */
static void tfm__op_add(tfm_device dev, float *y, const float *a, const float *b, int64_t n) {
    TFM__CUDA(dev, tfm__add_cuda(y, a, b, n); return);
    tfm__add_cpu(y, a, b, n);
}
/* pool: a tfm_pool_kind. x (B,T,C) -> y (B,C) */
static void tfm__op_pool(tfm_device dev, int pool, float *y, const float *x, const int32_t *lens, int64_t B, int64_t T,
                         int64_t C) {
    if (pool == TFM_POOL_CLS) {
        tfm__op_copy_rows(dev, y, C, x, T * C, B, C);
        return;
    }
    TFM__CUDA(dev, tfm__mean_pool_cuda(y, x, lens, B, T, C, 0); return);
    tfm__mean_pool_forward_cpu(y, x, lens, B, T, C);
}
static void tfm__op_pool_bwd(tfm_device dev, int pool, float *dx, const float *dy, const int32_t *lens, int64_t B,
                             int64_t T, int64_t C) {
    if (pool == TFM_POOL_CLS) {
        tfm__op_add_rows(dev, dx, T * C, dy, C, B, C);
        return;
    }
    TFM__CUDA(dev, tfm__mean_pool_cuda(dx, dy, lens, B, T, C, 1); return);
    tfm__mean_pool_backward_cpu(dx, dy, lens, B, T, C);
}
/* One AdamW update of each of ps[0..n) (all on dev), the gradients clipped to norm clip (0: not) by the
   squared global norm sumsq (tfm__clip_scale), the weight-decay factor `decay` where ps[i].decay or
   decay_all, else none: on the CPU one parameter after another; on the GPU one launch per 256, which read
   the squared norm that the thread's last tfm__op_sumsq left on the device (sumsq's value, which the host
   does not have yet while a training step is captured) and update nothing when it is not finite. */
static void tfm__op_adamw(tfm_device dev, const tfm_adamw_param *ps, int n, float clip, double sumsq, float b1, float b2,
                          float eps, float step_size, float bc2s, float decay, int decay_all) {
    float scale = tfm__clip_scale(sumsq, clip);
    int i;
    TFM__CUDA(dev, tfm__adamw_cuda(ps, n, clip, b1, b2, eps, step_size, bc2s, decay, decay_all); return);
    for (i = 0; i < n; i++)
        tfm__adamw_cpu(ps[i].value.data, ps[i].grad.data, ps[i].m.data, ps[i].v.data, tfm_numel(&ps[i].value), scale,
                       b1, b2, eps, step_size, bc2s, ps[i].decay || decay_all ? decay : 1.0f);
}
/* The sum of squares (in double) of the gradients of ps[0..n) (n >= 1, all on dev): each parameter's, then
   the parameters added in list order. On the CPU a task per parameter, on threads, in groups of 256; on
   the GPU kept on the device for AdamW and read back once (tfm__sumsq_cuda). */
static double tfm__op_sumsq(tfm_device dev, const tfm_adamw_param *ps, int n) {
    double total = 0.0, part[256];
    int i, g0;
    TFM__CUDA(dev, return tfm__sumsq_cuda(ps, n));
    for (g0 = 0; g0 < n; g0 += 256) {
        int gn = TFM__MIN(256, n - g0);
#ifdef _OPENMP
        int64_t work = 0;
        for (i = 0; i < gn; i++) work += tfm_numel(&ps[g0 + i].grad);
#endif
        TFM__OMP(omp parallel for schedule(dynamic) if (work > 65536 && !tfm__in_parallel()))
        for (i = 0; i < gn; i++) part[i] = tfm__sumsq_cpu(ps[g0 + i].grad.data, tfm_numel(&ps[g0 + i].grad));
        for (i = 0; i < gn; i++) total += part[i];
    }
    return total;
}
/* Whether call a runs the flash kernels. Their backward writes every element of dq, dk and dv (each has one
   owner), so that a caller who would zero them first may set a->overwrite instead (one pass over them, and a
   read of each in the kernels, fewer; the same bits: 0 + the sum, as the zeroed buffer gave) and a->d_bf with it;
   and they take q, k and v in bf16 (a->qkv_bf), as they round them to bf16 anyway. */
static int tfm__op_attention_flash(tfm_device dev, const tfm__attn_args *a) {
    TFM__CUDA(dev, return tfm__attn_path(a) == 3);
    (void)a;
    return 0;
}
/* The attention kernels return 0 when a thread had no scratch (then nothing was written). */
static int tfm__op_attention(tfm_device dev, const tfm__attn_args *a) {
    TFM_ASSERT(!a->qkv_bf || tfm__op_attention_flash(dev, a));
    TFM__CUDA(dev, return tfm__attention_forward_cuda(a));
    return tfm__attention_forward_cpu(a);
}
static int tfm__op_attention_bwd(tfm_device dev, const tfm__attn_args *a, float *dq, int lddq, float *dk, int lddk,
                                 float *dv, int lddv, const float *dout, int lddo) {
    TFM_ASSERT(!(a->overwrite || a->qkv_bf) || tfm__op_attention_flash(dev, a));
    TFM_ASSERT(!(a->d_bf || a->dout_bf) || a->overwrite);
    TFM__CUDA(dev, return tfm__attention_backward_cuda(a, dq, lddq, dk, lddk, dv, lddv, dout, lddo));
    return tfm__attention_backward_cpu(a, dq, lddq, dk, lddk, dv, lddv, dout, lddo);
}
/* n floats from src on device sdev to dst on device ddev (the two may differ) */
static void tfm__op_transfer(tfm_device ddev, float *dst, tfm_device sdev, const float *src, int64_t n) {
    if (n <= 0 || dst == src) return;
#if defined(TFM_CUDA)
    if (ddev == TFM_DEVICE_CUDA || sdev == TFM_DEVICE_CUDA) {
        tfm__cuda_copy(dst, src, (size_t)n * sizeof(float));
        return;
    }
#endif
    (void)ddev, (void)sdev;
    memmove(dst, src, (size_t)n * sizeof(float));
}

TFMDEF tfm_result tfm_tensor_copy(tfm_tensor *dst, const tfm_tensor *src) {
    const char *fn = "tfm_tensor_copy";
    TFM__TRY(tfm__chk(fn, "dst", dst));
    TFM__TRY(tfm__chk(fn, "src", src));
    if (tfm_numel(dst) != tfm_numel(src))
        return tfm__fail(TFM_E_SHAPE, "%s: dst is %s but src is %s: element counts differ", fn, tfm__shp(dst), tfm__shp(src));
    tfm__op_transfer(dst->device, dst->data, src->device, src->data, tfm_numel(src));
    return tfm__cuda_check(fn);
}

/* ==== >>impl-ops ==== the ops' public entry points: each checks its arguments, then calls the dispatch above */

/* -- matmul -- */

/* Dims of op(a) op(b) for 2-D or equal-batch 3-D tensors: L batches of (M,K)(K,N). */
static tfm_result tfm__mm_dims(const char *fn, const tfm_tensor *a, const tfm_tensor *b, int ta, int tb, int64_t *L,
                               int64_t *M, int64_t *N, int64_t *K) {
    int nd = a->ndim;
    int64_t ka, kb;
    if ((nd != 2 && nd != 3) || b->ndim != nd)
        return tfm__fail(TFM_E_SHAPE, "%s: a is %s and b is %s: want both 2-D or both 3-D", fn, tfm__shp(a), tfm__shp(b));
    if (nd == 3 && a->shape[0] != b->shape[0])
        return tfm__fail(TFM_E_SHAPE, "%s: a is %s and b is %s: batch sizes differ", fn, tfm__shp(a), tfm__shp(b));
    *L = nd == 3 ? a->shape[0] : 1;
    *M = ta ? a->shape[nd - 1] : a->shape[nd - 2];
    ka = ta ? a->shape[nd - 2] : a->shape[nd - 1];
    kb = tb ? b->shape[nd - 1] : b->shape[nd - 2];
    *N = tb ? b->shape[nd - 2] : b->shape[nd - 1];
    if (ka != kb)
        return tfm__fail(TFM_E_SHAPE, "%s: a is %s%s and b is %s%s: inner dims %lld and %lld differ", fn, tfm__shp(a),
                         ta ? " (transposed)" : "", tfm__shp(b), tb ? " (transposed)" : "", (long long)ka, (long long)kb);
    *K = ka;
    if (*M > 2147483647 || *N > 2147483647 || *K > 2147483647 || *L > 2147483647)
        return tfm__fail(TFM_E_SHAPE, "%s: a is %s, b is %s: dims beyond 2^31", fn, tfm__shp(a), tfm__shp(b));
    return TFM_OK;
}

static tfm_result tfm__chk_c(const char *fn, const char *cn, const tfm_tensor *c, int nd, int64_t L, int64_t M,
                             int64_t N) {
    int ok = c->ndim == nd && c->shape[nd - 2] == M && c->shape[nd - 1] == N && (nd == 2 || c->shape[0] == L);
    if (!ok) {
        if (nd == 3)
            return tfm__fail(TFM_E_SHAPE, "%s: %s is %s, want (%lld,%lld,%lld)", fn, cn, tfm__shp(c), (long long)L,
                             (long long)M, (long long)N);
        return tfm__fail(TFM_E_SHAPE, "%s: %s is %s, want (%lld,%lld)", fn, cn, tfm__shp(c), (long long)M, (long long)N);
    }
    return TFM_OK;
}

TFMDEF tfm_result tfm_matmul_forward(tfm_tensor *c, const tfm_tensor *a, const tfm_tensor *b, int transA, int transB) {
    const char *fn = "tfm_matmul_forward";
    int64_t L, M, N, K;
    int ta = transA != 0, tb = transB != 0;
    TFM__TRY(tfm__chk(fn, "c", c));
    TFM__TRY(tfm__chk(fn, "a", a));
    TFM__TRY(tfm__chk(fn, "b", b));
    TFM__TRY(tfm__mm_dims(fn, a, b, ta, tb, &L, &M, &N, &K));
    TFM__TRY(tfm__chk_c(fn, "c", c, a->ndim, L, M, N));
    TFM__TRY(tfm__same_device("tfm_matmul_forward", -1, 3, c, a, b));
    if (c->data == a->data || c->data == b->data) return tfm__fail(TFM_E_ARG, "%s: c must not alias a or b", fn);
    tfm__op_gemm_batched(a->device, ta, tb, (int)M, (int)N, (int)K, 1.0f, a->data, (int)(ta ? M : K), M * K, b->data, (int)(tb ? K : N), K * N, 0.0f, c->data, (int)N, M * N, (int)L);
    return tfm__cuda_check("tfm_matmul_forward");
}

TFMDEF tfm_result tfm_matmul_backward(tfm_tensor *da, tfm_tensor *db, const tfm_tensor *dc, const tfm_tensor *a,
                                      const tfm_tensor *b, int transA, int transB) {
    const char *fn = "tfm_matmul_backward";
    int64_t L, M, N, K;
    int ta = transA != 0, tb = transB != 0, lda, ldb;
    TFM__TRY(tfm__chk(fn, "dc", dc));
    TFM__TRY(tfm__chk(fn, "a", a));
    TFM__TRY(tfm__chk(fn, "b", b));
    TFM__TRY(tfm__chk_opt(fn, "da", da));
    TFM__TRY(tfm__chk_opt(fn, "db", db));
    TFM__TRY(tfm__mm_dims(fn, a, b, ta, tb, &L, &M, &N, &K));
    TFM__TRY(tfm__chk_c(fn, "dc", dc, a->ndim, L, M, N));
    TFM__TRY(tfm__chk_same(fn, "a", a, "da", da));
    TFM__TRY(tfm__chk_same(fn, "b", b, "db", db));
    TFM__TRY(tfm__same_device("tfm_matmul_backward", -1, 5, da, db, dc, a, b));
    lda = (int)(ta ? M : K);
    ldb = (int)(tb ? K : N);
    if (da) {
        if (!ta) /* da (M,K) += dc op(b)^T */
            tfm__op_gemm_batched(dc->device, 0, !tb, (int)M, (int)K, (int)N, 1.0f, dc->data, (int)N, M * N, b->data, ldb, K * N, 1.0f, da->data, (int)K, M * K, (int)L);
        else /* da (K,M) += op(b) dc^T */
            tfm__op_gemm_batched(b->device, tb, 1, (int)K, (int)M, (int)N, 1.0f, b->data, ldb, K * N, dc->data, (int)N, M * N, 1.0f, da->data, (int)M, M * K, (int)L);
    }
    if (db) {
        if (!tb) /* db (K,N) += op(a)^T dc */
            tfm__op_gemm_batched(a->device, !ta, 0, (int)K, (int)N, (int)M, 1.0f, a->data, lda, M * K, dc->data, (int)N, M * N, 1.0f, db->data, (int)N, K * N, (int)L);
        else /* db (N,K) += dc^T op(a) */
            tfm__op_gemm_batched(dc->device, 1, ta, (int)N, (int)K, (int)M, 1.0f, dc->data, (int)N, M * N, a->data, lda, M * K, 1.0f, db->data, (int)K, K * N, (int)L);
    }
    return tfm__cuda_check("tfm_matmul_backward");
}

/* -- linear -- */

/* y's shape must be x's with the last dim replaced by O */
static tfm_result tfm__chk_rows_as(const char *fn, const char *yn, const tfm_tensor *y, const char *xn,
                                   const tfm_tensor *x, int64_t O) {
    int i, ok = y->ndim == x->ndim && tfm__cols(y) == O;
    for (i = 0; ok && i < x->ndim - 1; i++) ok = y->shape[i] == x->shape[i];
    if (!ok)
        return tfm__fail(TFM_E_SHAPE, "%s: %s is %s but %s is %s: want %s's leading dims and %lld columns", fn, yn,
                         tfm__shp(y), xn, tfm__shp(x), xn, (long long)O);
    return TFM_OK;
}

static tfm_result tfm__chk_linear(const char *fn, const tfm_tensor *x, const tfm_tensor *w, const tfm_tensor *b) {
    if (w->ndim != 2) return tfm__fail(TFM_E_SHAPE, "%s: weight is %s, want 2-D (out, in)", fn, tfm__shp(w));
    if (tfm__cols(x) != w->shape[1])
        return tfm__fail(TFM_E_SHAPE, "%s: x is %s but weight is %s: x has %lld columns, weight expects %lld", fn,
                         tfm__shp(x), tfm__shp(w), (long long)tfm__cols(x), (long long)w->shape[1]);
    if (b && (b->ndim != 1 || b->shape[0] != w->shape[0]))
        return tfm__fail(TFM_E_SHAPE, "%s: bias is %s but weight is %s: want (%lld)", fn, tfm__shp(b), tfm__shp(w),
                         (long long)w->shape[0]);
    TFM__TRY(tfm__chk_int(fn, "x", x));
    TFM__TRY(tfm__chk_int(fn, "weight", w));
    return TFM_OK;
}

TFMDEF tfm_result tfm_linear_forward(tfm_tensor *y, const tfm_tensor *x, const tfm_tensor *w, const tfm_tensor *b) {
    const char *fn = "tfm_linear_forward";
    TFM__TRY(tfm__chk(fn, "y", y));
    TFM__TRY(tfm__chk(fn, "x", x));
    TFM__TRY(tfm__chk(fn, "weight", w));
    TFM__TRY(tfm__chk_opt(fn, "bias", b));
    TFM__TRY(tfm__chk_linear(fn, x, w, b));
    TFM__TRY(tfm__chk_rows_as(fn, "y", y, "x", x, w->shape[0]));
    TFM__TRY(tfm__chk_int(fn, "y", y));
    TFM__TRY(tfm__same_device("tfm_linear_forward", -1, 4, y, x, w, b));
    if (y->data == x->data) return tfm__fail(TFM_E_ARG, "%s: y must not alias x", fn);
    tfm__op_linear(y->device, y->data, w->shape[0], x->data, w->shape[1], w->data, b ? b->data : NULL, tfm__rows(x), w->shape[1], w->shape[0], 0);
    return tfm__cuda_check("tfm_linear_forward");
}

TFMDEF tfm_result tfm_linear_backward(tfm_tensor *dx, tfm_tensor *dw, tfm_tensor *db, const tfm_tensor *dy,
                                      const tfm_tensor *x, const tfm_tensor *w) {
    const char *fn = "tfm_linear_backward";
    TFM__TRY(tfm__chk(fn, "dy", dy));
    TFM__TRY(tfm__chk(fn, "x", x));
    TFM__TRY(tfm__chk(fn, "weight", w));
    TFM__TRY(tfm__chk_opt(fn, "dx", dx));
    TFM__TRY(tfm__chk_opt(fn, "dweight", dw));
    TFM__TRY(tfm__chk_opt(fn, "dbias", db));
    TFM__TRY(tfm__chk_linear(fn, x, w, NULL));
    TFM__TRY(tfm__chk_rows_as(fn, "dy", dy, "x", x, w->shape[0]));
    TFM__TRY(tfm__chk_same(fn, "x", x, "dx", dx));
    TFM__TRY(tfm__chk_same(fn, "weight", w, "dweight", dw));
    TFM__TRY(tfm__same_device("tfm_linear_backward", -1, 6, dx, dw, db, dy, x, w));
    if (db && (db->ndim != 1 || db->shape[0] != w->shape[0]))
        return tfm__fail(TFM_E_SHAPE, "%s: dbias is %s but weight is %s: want (%lld)", fn, tfm__shp(db), tfm__shp(w),
                         (long long)w->shape[0]);
    tfm__op_linear_bwd(dy->device, dx ? dx->data : NULL, w->shape[1], 1.0f, dw ? dw->data : NULL, db ? db->data : NULL, dy->data, w->shape[0], x->data, w->shape[1], w->data, tfm__rows(x), w->shape[1], w->shape[0], 0);
    return tfm__cuda_check("tfm_linear_backward");
}

/* -- row-wise ops -- */

/* y and x present and of one shape; dx optional of that shape too */
static tfm_result tfm__chk_pair(const char *fn, const char *yn, const tfm_tensor *y, const char *xn, const tfm_tensor *x) {
    TFM__TRY(tfm__chk(fn, yn, y));
    TFM__TRY(tfm__chk(fn, xn, x));
    return tfm__chk_same(fn, xn, x, yn, y);
}

TFMDEF tfm_result tfm_softmax_forward(tfm_tensor *y, const tfm_tensor *x) {
    TFM__TRY(tfm__chk_pair("tfm_softmax_forward", "y", y, "x", x));
    TFM__TRY(tfm__same_device("tfm_softmax_forward", -1, 2, y, x));
    tfm__op_softmax(y->device, y->data, x->data, tfm__rows(x), tfm__cols(x), 0);
    return tfm__cuda_check("tfm_softmax_forward");
}

TFMDEF tfm_result tfm_softmax_backward(tfm_tensor *dx, const tfm_tensor *dy, const tfm_tensor *y) {
    const char *fn = "tfm_softmax_backward";
    TFM__TRY(tfm__chk_pair(fn, "dy", dy, "y", y));
    TFM__TRY(tfm__chk_opt(fn, "dx", dx));
    TFM__TRY(tfm__chk_same(fn, "y", y, "dx", dx));
    TFM__TRY(tfm__same_device("tfm_softmax_backward", -1, 3, dx, dy, y));
    if (dx) tfm__op_softmax_bwd(dx->device, dx->data, dy->data, y->data, tfm__rows(y), tfm__cols(y), 0);
    return tfm__cuda_check("tfm_softmax_backward");
}

TFMDEF tfm_result tfm_log_softmax_forward(tfm_tensor *y, const tfm_tensor *x) {
    TFM__TRY(tfm__chk_pair("tfm_log_softmax_forward", "y", y, "x", x));
    TFM__TRY(tfm__same_device("tfm_log_softmax_forward", -1, 2, y, x));
    tfm__op_softmax(y->device, y->data, x->data, tfm__rows(x), tfm__cols(x), 1);
    return tfm__cuda_check("tfm_log_softmax_forward");
}

TFMDEF tfm_result tfm_log_softmax_backward(tfm_tensor *dx, const tfm_tensor *dy, const tfm_tensor *y) {
    const char *fn = "tfm_log_softmax_backward";
    TFM__TRY(tfm__chk_pair(fn, "dy", dy, "y", y));
    TFM__TRY(tfm__chk_opt(fn, "dx", dx));
    TFM__TRY(tfm__chk_same(fn, "y", y, "dx", dx));
    TFM__TRY(tfm__same_device("tfm_log_softmax_backward", -1, 3, dx, dy, y));
    if (dx) tfm__op_softmax_bwd(dx->device, dx->data, dy->data, y->data, tfm__rows(y), tfm__cols(y), 1);
    return tfm__cuda_check("tfm_log_softmax_backward");
}

static tfm_result tfm__chk_ce(const char *fn, const tfm_tensor *lse, const tfm_tensor *logits, const int32_t *targets,
                              int ignore_index, float s) {
    int64_t N, V, r;
    TFM__TRY(tfm__chk(fn, "logits", logits));
    TFM__TRY(tfm__chk(fn, "lse", lse));
    N = tfm__rows(logits);
    V = tfm__cols(logits);
    if (tfm_numel(lse) != N)
        return tfm__fail(TFM_E_SHAPE, "%s: lse is %s but logits is %s: want %lld elements, one per row", fn,
                         tfm__shp(lse), tfm__shp(logits), (long long)N);
    if (!targets) return tfm__fail(TFM_E_ARG, "%s: targets is NULL", fn);
    if (!(s >= 0.0f && s <= 1.0f))
        return tfm__fail(TFM_E_ARG, "%s: label_smoothing %g is outside [0,1]", fn, (double)s);
    for (r = 0; r < N; r++)
        if (targets[r] != ignore_index && (targets[r] < 0 || targets[r] >= V))
            return tfm__fail(TFM_E_ARG, "%s: target %d at row %lld is outside [0,%lld) and is not ignore_index %d", fn,
                             (int)targets[r], (long long)r, (long long)V, ignore_index);
    return TFM_OK;
}

TFMDEF tfm_result tfm_cross_entropy_forward(float *loss, tfm_tensor *lse, const tfm_tensor *logits,
                                            const int32_t *targets, int ignore_index, float label_smoothing) {
    const char *fn = "tfm_cross_entropy_forward";
    if (!loss) return tfm__fail(TFM_E_ARG, "%s: loss is NULL", fn);
    TFM__TRY(tfm__chk_ce(fn, lse, logits, targets, ignore_index, label_smoothing));
    TFM__TRY(tfm__same_device("tfm_cross_entropy_forward", -1, 2, lse, logits));
    *loss = tfm__op_cross_entropy(lse->device, lse->data, logits->data, 0, targets, ignore_index, label_smoothing, tfm__rows(logits), tfm__cols(logits), NULL, NULL);
    return tfm__cuda_check("tfm_cross_entropy_forward");
}

TFMDEF tfm_result tfm_cross_entropy_backward(tfm_tensor *dlogits, float dloss, const tfm_tensor *logits,
                                             const tfm_tensor *lse, const int32_t *targets, int ignore_index,
                                             float label_smoothing) {
    const char *fn = "tfm_cross_entropy_backward";
    TFM__TRY(tfm__chk_ce(fn, lse, logits, targets, ignore_index, label_smoothing));
    TFM__TRY(tfm__chk_opt(fn, "dlogits", dlogits));
    TFM__TRY(tfm__chk_same(fn, "logits", logits, "dlogits", dlogits));
    TFM__TRY(tfm__same_device("tfm_cross_entropy_backward", -1, 3, dlogits, logits, lse));
    if (!isfinite(dloss)) return tfm__fail(TFM_E_ARG, "%s: dloss %g is not finite", fn, (double)dloss);
    if (dlogits)
        tfm__op_cross_entropy_bwd(dlogits->device, dlogits->data, dloss, logits->data, 0, lse->data, targets, ignore_index, label_smoothing, tfm__rows(logits), tfm__cols(logits), 0);
    return tfm__cuda_check("tfm_cross_entropy_backward");
}

static tfm_result tfm__chk_vec(const char *fn, const char *vn, const tfm_tensor *v, const char *xn,
                               const tfm_tensor *x, int64_t n) {
    if (v && tfm_numel(v) != n)
        return tfm__fail(TFM_E_SHAPE, "%s: %s is %s but %s is %s: want %lld elements", fn, vn, tfm__shp(v), xn,
                         tfm__shp(x), (long long)n);
    return TFM_OK;
}

TFMDEF tfm_result tfm_layernorm_forward(tfm_tensor *y, tfm_tensor *mean, tfm_tensor *rstd, const tfm_tensor *x,
                                        const tfm_tensor *g, const tfm_tensor *b, float eps) {
    const char *fn = "tfm_layernorm_forward";
    TFM__TRY(tfm__chk_pair(fn, "y", y, "x", x));
    TFM__TRY(tfm__chk_opt(fn, "mean", mean));
    TFM__TRY(tfm__chk_opt(fn, "rstd", rstd));
    TFM__TRY(tfm__chk_opt(fn, "weight", g));
    TFM__TRY(tfm__chk_opt(fn, "bias", b));
    TFM__TRY(tfm__chk_vec(fn, "weight", g, "x", x, tfm__cols(x)));
    TFM__TRY(tfm__chk_vec(fn, "bias", b, "x", x, tfm__cols(x)));
    TFM__TRY(tfm__chk_vec(fn, "mean", mean, "x", x, tfm__rows(x)));
    TFM__TRY(tfm__chk_vec(fn, "rstd", rstd, "x", x, tfm__rows(x)));
    TFM__TRY(tfm__same_device("tfm_layernorm_forward", -1, 6, y, mean, rstd, x, g, b));
    if (!(eps >= 0.0f) || !isfinite(eps)) return tfm__fail(TFM_E_ARG, "%s: eps %g must be finite and >= 0", fn, (double)eps);
    tfm__op_layernorm(y->device, y->data, mean ? mean->data : NULL, rstd ? rstd->data : NULL, x->data, g ? g->data : NULL, b ? b->data : NULL, eps, tfm__rows(x), tfm__cols(x), 0, 0);
    return tfm__cuda_check("tfm_layernorm_forward");
}

TFMDEF tfm_result tfm_layernorm_backward(tfm_tensor *dx, tfm_tensor *dg, tfm_tensor *db, const tfm_tensor *dy,
                                         const tfm_tensor *x, const tfm_tensor *g, const tfm_tensor *mean,
                                         const tfm_tensor *rstd) {
    const char *fn = "tfm_layernorm_backward";
    TFM__TRY(tfm__chk_pair(fn, "dy", dy, "x", x));
    TFM__TRY(tfm__chk(fn, "mean", mean));
    TFM__TRY(tfm__chk(fn, "rstd", rstd));
    TFM__TRY(tfm__chk_opt(fn, "weight", g));
    TFM__TRY(tfm__chk_opt(fn, "dx", dx));
    TFM__TRY(tfm__chk_opt(fn, "dweight", dg));
    TFM__TRY(tfm__chk_opt(fn, "dbias", db));
    TFM__TRY(tfm__chk_same(fn, "x", x, "dx", dx));
    TFM__TRY(tfm__chk_vec(fn, "weight", g, "x", x, tfm__cols(x)));
    TFM__TRY(tfm__chk_vec(fn, "dweight", dg, "x", x, tfm__cols(x)));
    TFM__TRY(tfm__chk_vec(fn, "dbias", db, "x", x, tfm__cols(x)));
    TFM__TRY(tfm__chk_vec(fn, "mean", mean, "x", x, tfm__rows(x)));
    TFM__TRY(tfm__chk_vec(fn, "rstd", rstd, "x", x, tfm__rows(x)));
    TFM__TRY(tfm__same_device("tfm_layernorm_backward", -1, 8, dx, dg, db, dy, x, g, mean, rstd));
    tfm__op_layernorm_bwd(dy->device, dx ? dx->data : NULL, dx ? dx->data : NULL, dg ? dg->data : NULL, db ? db->data : NULL, dy->data, x->data, g ? g->data : NULL, mean->data, rstd->data, tfm__rows(x), tfm__cols(x), 0);
    return tfm__cuda_check("tfm_layernorm_backward");
}

/* The checks of tfm_rope_forward/backward: y and x (B,T,C) alike, heads and rotated channels. */
static tfm_result tfm__rope_check(const char *fn, const tfm_tensor *y, const char *yn, const tfm_tensor *x, const char *xn,
                                  int n_heads, int rot_dims, float base) {
    int64_t C;
    TFM__TRY(tfm__chk_pair(fn, yn, y, xn, x));
    TFM__TRY(tfm__same_device(fn, -1, 2, y, x));
    if (x->ndim != 3) return tfm__fail(TFM_E_SHAPE, "%s: %s is %s: want (B,T,C)", fn, xn, tfm__shp(x));
    C = x->shape[2];
    if (n_heads < 1 || C % n_heads)
        return tfm__fail(TFM_E_ARG, "%s: n_heads %d must be >= 1 and divide C %lld", fn, n_heads, (long long)C);
    if (rot_dims < 2 || rot_dims % 2 || rot_dims > C / n_heads)
        return tfm__fail(TFM_E_ARG, "%s: rot_dims %d must be even, >= 2 and at most the head size %lld", fn, rot_dims,
                         (long long)(C / n_heads));
    if (!(base > 1.0f) || !isfinite(base)) return tfm__fail(TFM_E_ARG, "%s: base %g must be finite and > 1", fn, (double)base);
    return TFM_OK;
}

TFMDEF tfm_result tfm_rope_forward(tfm_tensor *y, const tfm_tensor *x, int n_heads, int rot_dims, float base,
                                   const int32_t *pos0) {
    const char *fn = "tfm_rope_forward";
    TFM__TRY(tfm__rope_check(fn, y, "y", x, "x", n_heads, rot_dims, base));
    tfm__op_rope(y->device, y->data, x->data, x->shape[2], x->shape[0], x->shape[1], n_heads, (int)(x->shape[2] / n_heads),
                 rot_dims, base, pos0, 0, 0);
    return tfm__cuda_check(fn);
}

TFMDEF tfm_result tfm_rope_backward(tfm_tensor *dx, const tfm_tensor *dy, int n_heads, int rot_dims, float base,
                                    const int32_t *pos0) {
    const char *fn = "tfm_rope_backward";
    TFM__TRY(tfm__rope_check(fn, dx, "dx", dy, "dy", n_heads, rot_dims, base));
    if (dx->data == dy->data) return tfm__fail(TFM_E_ARG, "%s: dx must not alias dy (backward adds into dx)", fn);
    tfm__op_rope(dy->device, dx->data, dy->data, dy->shape[2], dy->shape[0], dy->shape[1], n_heads,
                 (int)(dy->shape[2] / n_heads), rot_dims, base, pos0, 1, 1);
    return tfm__cuda_check(fn);
}

/* RMSNorm runs on the layernorm's kernels, without the centering (their rms flag). */
TFMDEF tfm_result tfm_rmsnorm_forward(tfm_tensor *y, tfm_tensor *rstd, const tfm_tensor *x, const tfm_tensor *g,
                                      float eps) {
    const char *fn = "tfm_rmsnorm_forward";
    TFM__TRY(tfm__chk_pair(fn, "y", y, "x", x));
    TFM__TRY(tfm__chk_opt(fn, "rstd", rstd));
    TFM__TRY(tfm__chk_opt(fn, "weight", g));
    TFM__TRY(tfm__chk_vec(fn, "weight", g, "x", x, tfm__cols(x)));
    TFM__TRY(tfm__chk_vec(fn, "rstd", rstd, "x", x, tfm__rows(x)));
    TFM__TRY(tfm__same_device(fn, -1, 4, y, rstd, x, g));
    if (!(eps >= 0.0f) || !isfinite(eps)) return tfm__fail(TFM_E_ARG, "%s: eps %g must be finite and >= 0", fn, (double)eps);
    tfm__op_layernorm(y->device, y->data, NULL, rstd ? rstd->data : NULL, x->data, g ? g->data : NULL, NULL, eps,
                      tfm__rows(x), tfm__cols(x), 1, 0);
    return tfm__cuda_check(fn);
}

TFMDEF tfm_result tfm_rmsnorm_backward(tfm_tensor *dx, tfm_tensor *dg, const tfm_tensor *dy, const tfm_tensor *x,
                                       const tfm_tensor *g, const tfm_tensor *rstd) {
    const char *fn = "tfm_rmsnorm_backward";
    TFM__TRY(tfm__chk_pair(fn, "dy", dy, "x", x));
    TFM__TRY(tfm__chk(fn, "rstd", rstd));
    TFM__TRY(tfm__chk_opt(fn, "weight", g));
    TFM__TRY(tfm__chk_opt(fn, "dx", dx));
    TFM__TRY(tfm__chk_opt(fn, "dweight", dg));
    TFM__TRY(tfm__chk_same(fn, "x", x, "dx", dx));
    TFM__TRY(tfm__chk_vec(fn, "weight", g, "x", x, tfm__cols(x)));
    TFM__TRY(tfm__chk_vec(fn, "dweight", dg, "x", x, tfm__cols(x)));
    TFM__TRY(tfm__chk_vec(fn, "rstd", rstd, "x", x, tfm__rows(x)));
    TFM__TRY(tfm__same_device(fn, -1, 6, dx, dg, dy, x, g, rstd));
    tfm__op_layernorm_bwd(dy->device, dx ? dx->data : NULL, dx ? dx->data : NULL, dg ? dg->data : NULL, NULL, dy->data,
                          x->data, g ? g->data : NULL, NULL, rstd->data, tfm__rows(x), tfm__cols(x), 1);
    return tfm__cuda_check(fn);
}

/* -- element-wise -- */

static tfm_result tfm__chk_gelu_kind(const char *fn, tfm_gelu_kind kind) {
    if (kind != TFM_GELU_ERF && kind != TFM_GELU_TANH)
        return tfm__fail(TFM_E_ARG, "%s: kind %d is neither TFM_GELU_ERF nor TFM_GELU_TANH", fn, (int)kind);
    return TFM_OK;
}

TFMDEF tfm_result tfm_gelu_forward(tfm_tensor *y, const tfm_tensor *x, tfm_gelu_kind kind) {
    TFM__TRY(tfm__chk_pair("tfm_gelu_forward", "y", y, "x", x));
    TFM__TRY(tfm__chk_gelu_kind("tfm_gelu_forward", kind));
    TFM__TRY(tfm__same_device("tfm_gelu_forward", -1, 2, y, x));
    tfm__op_act(y->device, ((int)kind) == TFM_GELU_TANH ? TFM_ACT_GELU_TANH : TFM_ACT_GELU, y->data, x->data, tfm_numel(x));
    return tfm__cuda_check("tfm_gelu_forward");
}

TFMDEF tfm_result tfm_gelu_backward(tfm_tensor *dx, const tfm_tensor *dy, const tfm_tensor *x, tfm_gelu_kind kind) {
    const char *fn = "tfm_gelu_backward";
    TFM__TRY(tfm__chk_pair(fn, "dy", dy, "x", x));
    TFM__TRY(tfm__chk_opt(fn, "dx", dx));
    TFM__TRY(tfm__chk_same(fn, "x", x, "dx", dx));
    TFM__TRY(tfm__chk_gelu_kind(fn, kind));
    TFM__TRY(tfm__same_device("tfm_gelu_backward", -1, 3, dx, dy, x));
    if (dx) tfm__op_act_bwd(dx->device, ((int)kind) == TFM_GELU_TANH ? TFM_ACT_GELU_TANH : TFM_ACT_GELU, dx->data, dy->data, x->data, tfm_numel(x), 1.0f);
    return tfm__cuda_check("tfm_gelu_backward");
}

TFMDEF tfm_result tfm_relu_forward(tfm_tensor *y, const tfm_tensor *x) {
    TFM__TRY(tfm__chk_pair("tfm_relu_forward", "y", y, "x", x));
    TFM__TRY(tfm__same_device("tfm_relu_forward", -1, 2, y, x));
    tfm__op_act(y->device, TFM_ACT_RELU, y->data, x->data, tfm_numel(x));
    return tfm__cuda_check("tfm_relu_forward");
}

TFMDEF tfm_result tfm_relu_backward(tfm_tensor *dx, const tfm_tensor *dy, const tfm_tensor *x) {
    const char *fn = "tfm_relu_backward";
    TFM__TRY(tfm__chk_pair(fn, "dy", dy, "x", x));
    TFM__TRY(tfm__chk_opt(fn, "dx", dx));
    TFM__TRY(tfm__chk_same(fn, "x", x, "dx", dx));
    TFM__TRY(tfm__same_device("tfm_relu_backward", -1, 3, dx, dy, x));
    if (dx) tfm__op_act_bwd(dx->device, TFM_ACT_RELU, dx->data, dy->data, x->data, tfm_numel(x), 1.0f);
    return tfm__cuda_check("tfm_relu_backward");
}

static tfm_result tfm__chk_p(const char *fn, float p) {
    if (!(p >= 0.0f && p <= 1.0f)) return tfm__fail(TFM_E_ARG, "%s: p %g is outside [0,1]", fn, (double)p);
    return TFM_OK;
}

TFMDEF tfm_result tfm_dropout_forward(tfm_tensor *y, const tfm_tensor *x, float p, uint64_t seed, int training) {
    const char *fn = "tfm_dropout_forward";
    TFM__TRY(tfm__chk_pair(fn, "y", y, "x", x));
    TFM__TRY(tfm__chk_p(fn, p));
    TFM__TRY(tfm__same_device("tfm_dropout_forward", -1, 2, y, x));
    if (!training || p == 0.0f) {
        if (y->data != x->data) tfm__op_copy(y->device, y->data, x->data, tfm_numel(x));
    } else {
        tfm__op_dropout(y->device, y->data, x->data, tfm_numel(x), p, seed, 0, 0);
    }
    return tfm__cuda_check("tfm_dropout_forward");
}

TFMDEF tfm_result tfm_dropout_backward(tfm_tensor *dx, const tfm_tensor *dy, float p, uint64_t seed, int training) {
    const char *fn = "tfm_dropout_backward";
    TFM__TRY(tfm__chk(fn, "dy", dy));
    TFM__TRY(tfm__chk_opt(fn, "dx", dx));
    TFM__TRY(tfm__chk_same(fn, "dy", dy, "dx", dx));
    TFM__TRY(tfm__chk_p(fn, p));
    TFM__TRY(tfm__same_device("tfm_dropout_backward", -1, 2, dx, dy));
    if (!dx) return TFM_OK;
    if (!training || p == 0.0f) tfm__op_add(dx->device, dx->data, dx->data, dy->data, tfm_numel(dy));
    else tfm__op_dropout(dx->device, dx->data, dy->data, tfm_numel(dy), p, seed, 0, 1);
    return tfm__cuda_check("tfm_dropout_backward");
}

/* -- embeddings and positions -- */

static tfm_result tfm__chk_ids(const char *fn, const int32_t *ids, int64_t n, int64_t V) {
    int64_t i;
    if (!ids) return tfm__fail(TFM_E_ARG, "%s: ids is NULL", fn);
    for (i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return tfm__fail(TFM_E_ARG, "%s: id %d at position %lld is outside [0,%lld)", fn, (int)ids[i], (long long)i,
                             (long long)V);
    return TFM_OK;
}

static tfm_result tfm__chk_emb(const char *fn, const char *yn, const tfm_tensor *y, const char *wn, const tfm_tensor *w,
                               float scale) {
    if (w->ndim != 2) return tfm__fail(TFM_E_SHAPE, "%s: %s is %s, want 2-D (V,C)", fn, wn, tfm__shp(w));
    if (tfm__cols(y) != w->shape[1])
        return tfm__fail(TFM_E_SHAPE, "%s: %s is %s but %s is %s: %lld channels vs %lld", fn, yn, tfm__shp(y), wn,
                         tfm__shp(w), (long long)tfm__cols(y), (long long)w->shape[1]);
    if (!isfinite(scale)) return tfm__fail(TFM_E_ARG, "%s: scale %g is not finite", fn, (double)scale);
    return TFM_OK;
}

TFMDEF tfm_result tfm_embedding_forward(tfm_tensor *y, const int32_t *ids, const tfm_tensor *w, float scale) {
    const char *fn = "tfm_embedding_forward";
    TFM__TRY(tfm__chk(fn, "y", y));
    TFM__TRY(tfm__chk(fn, "weight", w));
    TFM__TRY(tfm__chk_emb(fn, "y", y, "weight", w, scale));
    TFM__TRY(tfm__chk_ids(fn, ids, tfm__rows(y), w->shape[0]));
    TFM__TRY(tfm__same_device("tfm_embedding_forward", -1, 2, y, w));
    tfm__op_embedding(y->device, y->data, ids, w->data, scale, tfm__rows(y), w->shape[1]);
    return tfm__cuda_check("tfm_embedding_forward");
}

TFMDEF tfm_result tfm_embedding_backward(tfm_tensor *dw, const tfm_tensor *dy, const int32_t *ids, float scale) {
    const char *fn = "tfm_embedding_backward";
    TFM__TRY(tfm__chk(fn, "dweight", dw));
    TFM__TRY(tfm__chk(fn, "dy", dy));
    TFM__TRY(tfm__chk_emb(fn, "dy", dy, "dweight", dw, scale));
    TFM__TRY(tfm__chk_ids(fn, ids, tfm__rows(dy), dw->shape[0]));
    TFM__TRY(tfm__same_device("tfm_embedding_backward", -1, 2, dw, dy));
    tfm__op_embedding_bwd(dw->device, dw->data, dy->data, ids, scale, tfm__rows(dy), dw->shape[1]);
    return tfm__cuda_check("tfm_embedding_backward");
}

/* x is (B,T,C) or (T,C) (B = 1) */
static tfm_result tfm__btc(const char *fn, const char *xn, const tfm_tensor *x, int64_t *B, int64_t *T, int64_t *C) {
    if (x->ndim != 2 && x->ndim != 3)
        return tfm__fail(TFM_E_SHAPE, "%s: %s is %s, want (B,T,C) or (T,C)", fn, xn, tfm__shp(x));
    *B = x->ndim == 3 ? x->shape[0] : 1;
    *T = x->shape[x->ndim - 2];
    *C = x->shape[x->ndim - 1];
    return TFM_OK;
}

static tfm_result tfm__chk_table(const char *fn, const char *wn, const tfm_tensor *w, const tfm_tensor *x, int64_t T,
                                 int64_t C) {
    if (w->ndim != 2 || w->shape[1] != C || w->shape[0] < T)
        return tfm__fail(TFM_E_SHAPE, "%s: %s is %s but x is %s: want (P,%lld) with P >= %lld", fn, wn, tfm__shp(w),
                         tfm__shp(x), (long long)C, (long long)T);
    return TFM_OK;
}

TFMDEF tfm_result tfm_pos_embedding_forward(tfm_tensor *y, const tfm_tensor *x, const tfm_tensor *w) {
    const char *fn = "tfm_pos_embedding_forward";
    int64_t B = 0, T = 0, C = 0;
    TFM__TRY(tfm__chk_pair(fn, "y", y, "x", x));
    TFM__TRY(tfm__chk(fn, "weight", w));
    TFM__TRY(tfm__btc(fn, "x", x, &B, &T, &C));
    TFM__TRY(tfm__chk_table(fn, "weight", w, x, T, C));
    TFM__TRY(tfm__same_device("tfm_pos_embedding_forward", -1, 3, y, x, w));
    tfm__op_pos_add(y->device, y->data, x->data, w->data, NULL, B, T, C);
    return tfm__cuda_check("tfm_pos_embedding_forward");
}

TFMDEF tfm_result tfm_pos_embedding_backward(tfm_tensor *dx, tfm_tensor *dw, const tfm_tensor *dy) {
    const char *fn = "tfm_pos_embedding_backward";
    int64_t B = 0, T = 0, C = 0;
    TFM__TRY(tfm__chk(fn, "dy", dy));
    TFM__TRY(tfm__chk_opt(fn, "dx", dx));
    TFM__TRY(tfm__chk_opt(fn, "dweight", dw));
    TFM__TRY(tfm__btc(fn, "dy", dy, &B, &T, &C));
    TFM__TRY(tfm__chk_same(fn, "dy", dy, "dx", dx));
    TFM__TRY(tfm__same_device("tfm_pos_embedding_backward", -1, 3, dx, dw, dy));
    if (dw) TFM__TRY(tfm__chk_table(fn, "dweight", dw, dy, T, C));
    if (dx) tfm__op_add(dx->device, dx->data, dx->data, dy->data, tfm_numel(dy));
    if (dw) tfm__op_pos_bwd(dw->device, dw->data, dy->data, B, T, C);
    return tfm__cuda_check("tfm_pos_embedding_backward");
}

TFMDEF tfm_result tfm_sinusoidal_table(tfm_tensor *pe) {
    const char *fn = "tfm_sinusoidal_table";
    TFM__TRY(tfm__chk(fn, "pe", pe));
    if (pe->ndim != 2) return tfm__fail(TFM_E_SHAPE, "%s: pe is %s, want (P,C)", fn, tfm__shp(pe));
    tfm__op_sinusoid_add(pe->device, pe->data, NULL, 1, pe->shape[0], pe->shape[1]);
    return tfm__cuda_check("tfm_sinusoidal_table");
}

TFMDEF tfm_result tfm_sinusoidal_forward(tfm_tensor *y, const tfm_tensor *x) {
    const char *fn = "tfm_sinusoidal_forward";
    int64_t B = 0, T = 0, C = 0;
    TFM__TRY(tfm__chk_pair(fn, "y", y, "x", x));
    TFM__TRY(tfm__same_device("tfm_sinusoidal_forward", -1, 2, y, x));
    TFM__TRY(tfm__btc(fn, "x", x, &B, &T, &C));
    tfm__op_sinusoid_add(y->device, y->data, x->data, B, T, C);
    return tfm__cuda_check("tfm_sinusoidal_forward");
}

TFMDEF tfm_result tfm_sinusoidal_backward(tfm_tensor *dx, const tfm_tensor *dy) {
    const char *fn = "tfm_sinusoidal_backward";
    int64_t B = 0, T = 0, C = 0;
    TFM__TRY(tfm__chk(fn, "dy", dy));
    TFM__TRY(tfm__chk_opt(fn, "dx", dx));
    TFM__TRY(tfm__btc(fn, "dy", dy, &B, &T, &C));
    TFM__TRY(tfm__chk_same(fn, "dy", dy, "dx", dx));
    TFM__TRY(tfm__same_device("tfm_sinusoidal_backward", -1, 2, dx, dy));
    if (dx) tfm__op_add(dx->device, dx->data, dx->data, dy->data, tfm_numel(dy));
    return tfm__cuda_check("tfm_sinusoidal_backward");
}

TFMDEF tfm_result tfm_add_forward(tfm_tensor *y, const tfm_tensor *a, const tfm_tensor *b) {
    const char *fn = "tfm_add_forward";
    TFM__TRY(tfm__chk_pair(fn, "y", y, "a", a));
    TFM__TRY(tfm__chk(fn, "b", b));
    TFM__TRY(tfm__chk_same(fn, "a", a, "b", b));
    TFM__TRY(tfm__same_device("tfm_add_forward", -1, 3, y, a, b));
    tfm__op_add(y->device, y->data, a->data, b->data, tfm_numel(a));
    return tfm__cuda_check("tfm_add_forward");
}

TFMDEF tfm_result tfm_add_backward(tfm_tensor *da, tfm_tensor *db, const tfm_tensor *dy) {
    const char *fn = "tfm_add_backward";
    TFM__TRY(tfm__chk(fn, "dy", dy));
    TFM__TRY(tfm__chk_opt(fn, "da", da));
    TFM__TRY(tfm__chk_opt(fn, "db", db));
    TFM__TRY(tfm__chk_same(fn, "dy", dy, "da", da));
    TFM__TRY(tfm__chk_same(fn, "dy", dy, "db", db));
    TFM__TRY(tfm__same_device("tfm_add_backward", -1, 3, da, db, dy));
    if (da) tfm__op_add(da->device, da->data, da->data, dy->data, tfm_numel(dy));
    if (db) tfm__op_add(db->device, db->data, db->data, dy->data, tfm_numel(dy));
    return tfm__cuda_check("tfm_add_backward");
}

/* -- pooling -- */

static tfm_result tfm__chk_pool(const char *fn, const char *xn, const tfm_tensor *x, const char *yn,
                                const tfm_tensor *y) {
    if (x->ndim != 3) return tfm__fail(TFM_E_SHAPE, "%s: %s is %s, want (B,T,C)", fn, xn, tfm__shp(x));
    if (y->ndim != 2 || y->shape[0] != x->shape[0] || y->shape[1] != x->shape[2])
        return tfm__fail(TFM_E_SHAPE, "%s: %s is %s but %s is %s: want (%lld,%lld)", fn, yn, tfm__shp(y), xn, tfm__shp(x),
                         (long long)x->shape[0], (long long)x->shape[2]);
    return TFM_OK;
}

static tfm_result tfm__chk_lens(const char *fn, const char *name, const int32_t *lens, int64_t B, int64_t T) {
    int64_t b;
    if (!lens) return TFM_OK;
    for (b = 0; b < B; b++)
        if (lens[b] < 0 || lens[b] > T)
            return tfm__fail(TFM_E_ARG, "%s: %s[%lld] = %d is outside [0,%lld]", fn, name, (long long)b, (int)lens[b],
                             (long long)T);
    return TFM_OK;
}

TFMDEF tfm_result tfm_mean_pool_forward(tfm_tensor *y, const tfm_tensor *x, const int32_t *lens) {
    const char *fn = "tfm_mean_pool_forward";
    TFM__TRY(tfm__chk(fn, "y", y));
    TFM__TRY(tfm__chk(fn, "x", x));
    TFM__TRY(tfm__chk_pool(fn, "x", x, "y", y));
    TFM__TRY(tfm__chk_lens(fn, "lens", lens, x->shape[0], x->shape[1]));
    TFM__TRY(tfm__same_device("tfm_mean_pool_forward", -1, 2, y, x));
    tfm__op_pool(y->device, TFM_POOL_MEAN, y->data, x->data, lens, x->shape[0], x->shape[1], x->shape[2]);
    return tfm__cuda_check("tfm_mean_pool_forward");
}

TFMDEF tfm_result tfm_mean_pool_backward(tfm_tensor *dx, const tfm_tensor *dy, const int32_t *lens) {
    const char *fn = "tfm_mean_pool_backward";
    TFM__TRY(tfm__chk(fn, "dx", dx));
    TFM__TRY(tfm__chk(fn, "dy", dy));
    TFM__TRY(tfm__chk_pool(fn, "dx", dx, "dy", dy));
    TFM__TRY(tfm__chk_lens(fn, "lens", lens, dx->shape[0], dx->shape[1]));
    TFM__TRY(tfm__same_device("tfm_mean_pool_backward", -1, 2, dx, dy));
    tfm__op_pool_bwd(dx->device, TFM_POOL_MEAN, dx->data, dy->data, lens, dx->shape[0], dx->shape[1], dx->shape[2]);
    return tfm__cuda_check("tfm_mean_pool_backward");
}

TFMDEF tfm_result tfm_cls_pool_forward(tfm_tensor *y, const tfm_tensor *x) {
    const char *fn = "tfm_cls_pool_forward";
    TFM__TRY(tfm__chk(fn, "y", y));
    TFM__TRY(tfm__chk(fn, "x", x));
    TFM__TRY(tfm__chk_pool(fn, "x", x, "y", y));
    TFM__TRY(tfm__same_device("tfm_cls_pool_forward", -1, 2, y, x));
    tfm__op_pool(y->device, TFM_POOL_CLS, y->data, x->data, NULL, x->shape[0], x->shape[1], x->shape[2]);
    return tfm__cuda_check("tfm_cls_pool_forward");
}

TFMDEF tfm_result tfm_cls_pool_backward(tfm_tensor *dx, const tfm_tensor *dy) {
    const char *fn = "tfm_cls_pool_backward";
    TFM__TRY(tfm__chk(fn, "dx", dx));
    TFM__TRY(tfm__chk(fn, "dy", dy));
    TFM__TRY(tfm__chk_pool(fn, "dx", dx, "dy", dy));
    TFM__TRY(tfm__same_device("tfm_cls_pool_backward", -1, 2, dx, dy));
    tfm__op_pool_bwd(dx->device, TFM_POOL_CLS, dx->data, dy->data, NULL, dx->shape[0], dx->shape[1], dx->shape[2]);
    return tfm__cuda_check("tfm_cls_pool_backward");
}

/* ==== >>impl-mha ==== attention's entry points and the multi-head attention layer */

/* -- attention -- */

/* A window and its sinks (named wname and sname): both >= 0, sinks only with a window. */
static tfm_result tfm__window_fields(const char *fn, const char *wname, const char *sname, int window, int sinks) {
    if (window < 0 || sinks < 0 || (sinks && !window))
        return tfm__fail(TFM_E_ARG, "%s: %s %d and %s %d must be >= 0, %s only with %s", fn, wname, window, sname, sinks,
                         sname, wname);
    return TFM_OK;
}

static tfm_result tfm__chk_attn_opts(const char *fn, const tfm_attn_opts *o, int64_t B, int64_t Tq, int64_t Tk) {
    if (!o) return TFM_OK;
    TFM__TRY(tfm__chk_lens(fn, "opts.key_lens", o->key_lens, B, Tk));
    if (o->batch_offset < 0) return tfm__fail(TFM_E_ARG, "%s: opts.batch_offset %lld is negative", fn, (long long)o->batch_offset);
    if (o->mask) {
        int64_t i, n = (o->mask_per_batch ? B : 1) * Tq * Tk;
        for (i = 0; i < n; i++)
            if (!(o->mask[i] < INFINITY))
                return tfm__fail(TFM_E_ARG, "%s: opts.mask[%lld] is %g: want finite values or -INFINITY", fn, (long long)i,
                                 (double)o->mask[i]);
    }
    if (!(o->dropout >= 0.0f && o->dropout < 1.0f))
        return tfm__fail(TFM_E_ARG, "%s: opts.dropout %g is outside [0,1)", fn, (double)o->dropout);
    if (!isfinite(o->scale)) return tfm__fail(TFM_E_ARG, "%s: opts.scale %g is not finite", fn, (double)o->scale);
    TFM__TRY(tfm__window_fields(fn, "opts.window", "opts.sinks", o->window, o->sinks));
    if (o->window && !o->causal)
        return tfm__fail(TFM_E_ARG, "%s: opts.window %d needs opts.causal (the window looks back from each query)", fn,
                         o->window);
    return TFM_OK;
}

static void tfm__attn_setup(tfm__attn_args *a, int B, int H, int Tq, int Tk, int C, const tfm_attn_opts *o) {
    memset(a, 0, sizeof *a);
    a->B = B;
    a->H = H;
    a->Tq = Tq;
    a->Tk = Tk;
    a->D = C / H;
    a->Hkv = o && o->n_kv_heads ? o->n_kv_heads : H;
    if (o) {
        a->causal = o->causal != 0;
        a->window = o->window;
        a->sinks = o->sinks;
        a->lens = o->key_lens;
        a->dropout = o->dropout;
        a->seed = o->dropout_seed;
        a->scale = o->scale;
        a->mask = o->mask;
        a->mask_bs = o->mask_per_batch ? (int64_t)Tq * Tk : 0;
        a->drop_i0 = (uint64_t)(o->batch_offset * H * Tq * Tk);
    }
    if (a->scale == 0.0f) a->scale = 1.0f / sqrtf((float)a->D);
}

/* q (B,Tq,C), k and v (B,Tk,Ckv), heads dividing C, lse (B,H,Tq); Ckv = C / H * opts.n_kv_heads (C without) */
static tfm_result tfm__chk_attn(const char *fn, const tfm_tensor *q, const tfm_tensor *k, const tfm_tensor *v,
                                const tfm_tensor *lse, int n_heads, const tfm_attn_opts *opts) {
    int64_t B, C, Ckv;
    int n_kv = opts ? opts->n_kv_heads : 0;
    if (q->ndim != 3) return tfm__fail(TFM_E_SHAPE, "%s: q is %s, want (B,Tq,C)", fn, tfm__shp(q));
    B = q->shape[0];
    C = q->shape[2];
    if (n_heads < 1 || C % n_heads)
        return tfm__fail(TFM_E_ARG, "%s: n_heads %d does not divide the %lld channels of q %s", fn, n_heads,
                         (long long)C, tfm__shp(q));
    if (n_kv < 0 || (n_kv && n_heads % n_kv))
        return tfm__fail(TFM_E_ARG, "%s: opts.n_kv_heads %d must be 0 or divide n_heads %d", fn, n_kv, n_heads);
    Ckv = n_kv ? C / n_heads * n_kv : C;
    if (k->ndim != 3 || k->shape[0] != B || k->shape[2] != Ckv)
        return tfm__fail(TFM_E_SHAPE, "%s: q is %s but k is %s: want (%lld,Tk,%lld) for %d key/value heads", fn, tfm__shp(q),
                         tfm__shp(k), (long long)B, (long long)Ckv, n_kv ? n_kv : n_heads);
    TFM__TRY(tfm__chk_same(fn, "k", k, "v", v));
    if (lse->ndim != 3 || lse->shape[0] != B || lse->shape[1] != n_heads || lse->shape[2] != q->shape[1])
        return tfm__fail(TFM_E_SHAPE, "%s: lse is %s, want (%lld,%d,%lld) for q %s", fn, tfm__shp(lse),
                         (long long)B, n_heads, (long long)q->shape[1], tfm__shp(q));
    TFM__TRY(tfm__chk_int(fn, "lse", lse));
    TFM__TRY(tfm__chk_int(fn, "q", q));
    TFM__TRY(tfm__chk_int(fn, "k", k));
    return TFM_OK;
}

TFMDEF tfm_result tfm_attention_forward(tfm_tensor *out, tfm_tensor *lse, const tfm_tensor *q, const tfm_tensor *k,
                                        const tfm_tensor *v, int n_heads, const tfm_attn_opts *opts) {
    const char *fn = "tfm_attention_forward";
    tfm__attn_args a;
    TFM__TRY(tfm__chk(fn, "out", out));
    TFM__TRY(tfm__chk(fn, "lse", lse));
    TFM__TRY(tfm__chk(fn, "q", q));
    TFM__TRY(tfm__chk(fn, "k", k));
    TFM__TRY(tfm__chk(fn, "v", v));
    TFM__TRY(tfm__chk_attn(fn, q, k, v, lse, n_heads, opts));
    TFM__TRY(tfm__chk_same(fn, "q", q, "out", out));
    TFM__TRY(tfm__chk_attn_opts(fn, opts, q->shape[0], q->shape[1], k->shape[1]));
    TFM__TRY(tfm__same_device("tfm_attention_forward", -1, 5, out, lse, q, k, v));
    if (out->data == q->data || out->data == k->data || out->data == v->data)
        return tfm__fail(TFM_E_ARG, "%s: out must not alias q, k or v", fn);
    tfm__attn_setup(&a, (int)q->shape[0], n_heads, (int)q->shape[1], (int)k->shape[1], (int)q->shape[2], opts);
    a.q = q->data;
    a.k = k->data;
    a.v = v->data;
    a.ldq = a.ldo = (int)q->shape[2];
    a.ldk = a.ldv = (int)k->shape[2];
    a.out = out->data;
    a.lse = lse->data;
    tfm__scratch_failed = 0;
    if (!tfm__op_attention(out->device, &a)) return tfm__scratch_check(fn);
    return tfm__cuda_check("tfm_attention_forward");
}

TFMDEF tfm_result tfm_attention_backward(tfm_tensor *dq, tfm_tensor *dk, tfm_tensor *dv, const tfm_tensor *dout,
                                         const tfm_tensor *q, const tfm_tensor *k, const tfm_tensor *v,
                                         const tfm_tensor *out, const tfm_tensor *lse, int n_heads,
                                         const tfm_attn_opts *opts) {
    const char *fn = "tfm_attention_backward";
    tfm__attn_args a;
    int C;
    TFM__TRY(tfm__chk(fn, "dout", dout));
    TFM__TRY(tfm__chk(fn, "out", out));
    TFM__TRY(tfm__chk(fn, "lse", lse));
    TFM__TRY(tfm__chk(fn, "q", q));
    TFM__TRY(tfm__chk(fn, "k", k));
    TFM__TRY(tfm__chk(fn, "v", v));
    TFM__TRY(tfm__chk_opt(fn, "dq", dq));
    TFM__TRY(tfm__chk_opt(fn, "dk", dk));
    TFM__TRY(tfm__chk_opt(fn, "dv", dv));
    TFM__TRY(tfm__chk_attn(fn, q, k, v, lse, n_heads, opts));
    TFM__TRY(tfm__chk_same(fn, "q", q, "dout", dout));
    TFM__TRY(tfm__chk_same(fn, "q", q, "out", out));
    TFM__TRY(tfm__chk_same(fn, "q", q, "dq", dq));
    TFM__TRY(tfm__chk_same(fn, "k", k, "dk", dk));
    TFM__TRY(tfm__chk_same(fn, "v", v, "dv", dv));
    TFM__TRY(tfm__chk_attn_opts(fn, opts, q->shape[0], q->shape[1], k->shape[1]));
    TFM__TRY(tfm__same_device("tfm_attention_backward", -1, 9, dq, dk, dv, dout, q, k, v, out, lse));
    C = (int)q->shape[2];
    tfm__attn_setup(&a, (int)q->shape[0], n_heads, (int)q->shape[1], (int)k->shape[1], C, opts);
    a.q = q->data;
    a.k = k->data;
    a.v = v->data;
    a.ldq = a.ldo = C;
    a.ldk = a.ldv = (int)k->shape[2];
    a.out = out->data;
    a.lse = lse->data;
    tfm__scratch_failed = 0;
    if (!tfm__op_attention_bwd(dout->device, &a, dq ? dq->data : NULL, C, dk ? dk->data : NULL, a.ldk,
                               dv ? dv->data : NULL, a.ldv, dout->data, C))
        return tfm__scratch_check(fn);
    return tfm__cuda_check("tfm_attention_backward");
}

/* -- multi-head attention layer -- */

/* The rotary fields of a desc or config (pre names them: "desc." or "cfg."): *dims 0 (then base must be 0 too)
   or even in [2, head]; *base 0 -> 10000, else finite and > 1. */
static tfm_result tfm__rope_fields(const char *fn, const char *pre, int dims, float *base, int head) {
    if (!dims && *base == 0.0f) return TFM_OK;
    if (dims < 2 || dims % 2 || dims > head)
        return tfm__fail(TFM_E_ARG, "%s: %srope_dims %d must be even, >= 2 and at most the head size %d (with %srope_base %g)",
                         fn, pre, dims, head, pre, (double)*base);
    if (*base == 0.0f) *base = 10000.0f;
    if (!(*base > 1.0f) || !isfinite(*base))
        return tfm__fail(TFM_E_ARG, "%s: %srope_base %g must be finite and > 1", fn, pre, (double)*base);
    return TFM_OK;
}

/* The key/value heads of a desc or config (pre: "desc." or "cfg."): 0, or >= 1 and dividing n_heads. */
static tfm_result tfm__kv_heads_field(const char *fn, const char *pre, int n_kv_heads, int n_heads) {
    if (n_kv_heads < 0 || (n_kv_heads && n_heads % n_kv_heads))
        return tfm__fail(TFM_E_ARG, "%s: %sn_kv_heads %d must be 0 or divide %sn_heads %d", fn, pre, n_kv_heads, pre, n_heads);
    return TFM_OK;
}

/* Channels of the keys (and of the values) of an attention layer: n_kv_heads heads of d_model / n_heads. */
static int64_t tfm__mha_kv_dim(const tfm_mha *m) {
    return (int64_t)m->desc.d_model / m->desc.n_heads * m->desc.n_kv_heads;
}

TFMDEF tfm_result tfm_mha_init(tfm_mha *m, const tfm_mha_desc *desc, tfm_mem *mem) {
    const char *fn = "tfm_mha_init";
    tfm_mha_desc d;
    size_t B, Tq, Tk, C, H, E, mark;
    int64_t sh[2];
    if (!m || !desc || !mem) return tfm__fail(TFM_E_ARG, "%s: layer, desc or mem is NULL", fn);
    d = *desc;
    if (d.d_model <= 0) return tfm__fail(TFM_E_ARG, "%s: desc.d_model is %d: required, > 0", fn, d.d_model);
    if (d.n_heads <= 0) return tfm__fail(TFM_E_ARG, "%s: desc.n_heads is %d: required, > 0", fn, d.n_heads);
    if (d.d_model % d.n_heads)
        return tfm__fail(TFM_E_ARG, "%s: desc.n_heads %d does not divide desc.d_model %d", fn, d.n_heads, d.d_model);
    if (d.max_len <= 0) return tfm__fail(TFM_E_ARG, "%s: desc.max_len is %d: required, > 0", fn, d.max_len);
    if (d.max_batch < 0) return tfm__fail(TFM_E_ARG, "%s: desc.max_batch is %d: must be >= 0", fn, d.max_batch);
    if (d.max_kv_len < 0) return tfm__fail(TFM_E_ARG, "%s: desc.max_kv_len is %d: must be >= 0", fn, d.max_kv_len);
    if (d.max_batch == 0) d.max_batch = 1;
    if (!d.cross && d.max_kv_len && d.max_kv_len != d.max_len)
        return tfm__fail(TFM_E_ARG, "%s: desc.max_kv_len %d differs from desc.max_len %d in self-attention", fn, d.max_kv_len,
                         d.max_len);
    if (d.max_kv_len == 0) d.max_kv_len = d.max_len;
    d.cross = d.cross != 0;
    d.no_bias = d.no_bias != 0;
    if (d.cross && (d.rope_dims || d.rope_base != 0.0f))
        return tfm__fail(TFM_E_ARG, "%s: desc.rope_dims %d: rotary positions are for self-attention, not cross", fn, d.rope_dims);
    TFM__TRY(tfm__rope_fields(fn, "desc.", d.rope_dims, &d.rope_base, d.d_model / d.n_heads));
    TFM__TRY(tfm__kv_heads_field(fn, "desc.", d.n_kv_heads, d.n_heads));
    if (d.n_kv_heads == 0) d.n_kv_heads = d.n_heads;
    TFM__TRY(tfm__window_fields(fn, "desc.attn_window", "desc.attn_sinks", d.attn_window, d.attn_sinks));
    if (d.cross && d.attn_window)
        return tfm__fail(TFM_E_ARG, "%s: desc.attn_window %d: a sliding window is for causal self-attention, not cross", fn,
                         d.attn_window);
    B = (size_t)d.max_batch;
    Tq = (size_t)d.max_len;
    Tk = (size_t)d.max_kv_len;
    C = (size_t)d.d_model;
    H = (size_t)d.n_heads;
    E = C / H * (size_t)d.n_kv_heads;
    if ((double)B * Tq * 3 * C > 2147483647.0 ||
        (double)B * Tk * 3 * C > 2147483647.0 || 3.0 * C * C > 2147483647.0)
        return tfm__fail(TFM_E_ARG, "%s: max_batch %d, max_len %d, max_kv_len %d, d_model %d, n_heads %d: buffers beyond 2^31 elements",
                         fn, d.max_batch, d.max_len, d.max_kv_len, d.d_model, d.n_heads);
    memset(m, 0, sizeof *m);
    m->desc = d;
    sh[0] = (int64_t)(C + 2 * E);
    sh[1] = (int64_t)C;
    m->in_proj_weight = tfm_arena_tensor(&mem->params, 2, sh);
    if (!d.no_bias) m->in_proj_bias = tfm_arena_tensor(&mem->params, 1, sh);
    sh[0] = (int64_t)C;
    m->out_proj_weight = tfm_arena_tensor(&mem->params, 2, sh);
    if (!d.no_bias) m->out_proj_bias = tfm_arena_tensor(&mem->params, 1, sh);
    if (!mem->no_grad) {
        sh[0] = (int64_t)(C + 2 * E);
        m->d_in_proj_weight = tfm_arena_tensor(&mem->grads, 2, sh);
        if (!d.no_bias) m->d_in_proj_bias = tfm_arena_tensor(&mem->grads, 1, sh);
        sh[0] = (int64_t)C;
        m->d_out_proj_weight = tfm_arena_tensor(&mem->grads, 2, sh);
        if (!d.no_bias) m->d_out_proj_bias = tfm_arena_tensor(&mem->grads, 1, sh);
    }
    m->q = tfm__carve(&mem->acts, B * Tq * (d.cross ? C : C + 2 * E));
    if (d.cross) m->kv = tfm__carve(&mem->acts, B * Tk * 2 * E);
    m->lse = tfm__carve(&mem->acts, B * H * Tq);
    m->ctx = tfm__carve(&mem->acts, B * Tq * C);
    m->key_lens = (int32_t *)tfm_arena_alloc(&mem->acts, B * sizeof(int32_t));
    mark = mem->scratch.used;
    if (!mem->no_grad) {
        m->dctx = tfm__carve(&mem->scratch, B * Tq * C);
        m->dq = tfm__carve(&mem->scratch, B * Tq * (d.cross ? C : C + 2 * E));
        if (d.cross) m->dkv = tfm__carve(&mem->scratch, B * Tk * 2 * E);
    }
    mem->scratch.used = mark;
    m->has_grad = !mem->no_grad;
    m->device = mem->device;
    return tfm_mem_check(mem) == TFM_OK ? TFM_OK
                                        : tfm__fail(TFM_E_NOMEM, "%s: %s", fn, tfm_last_error());
}

TFMDEF tfm_result tfm_mha_init_params(tfm_mha *m, tfm_rng *rng) {
    const char *fn = "tfm_mha_init_params";
    float C, E;
    if (!m || !rng) return tfm__fail(TFM_E_ARG, "tfm_mha_init_params: layer or rng is NULL");
    if (!m->in_proj_weight.data || !m->out_proj_weight.data)
        return tfm__fail(TFM_E_ARG, "tfm_mha_init_params: the layer has no memory (run tfm_mha_init after tfm_mem_alloc)");
    C = (float)m->desc.d_model;
    E = (float)tfm__mha_kv_dim(m);
    /* xavier_uniform over (C + 2E, C): bound sqrt(6 / (fan_in + fan_out)) */
    TFM__TRY_AS(fn, tfm_fill_uniform(&m->in_proj_weight, rng, -sqrtf(6.0f / (2.0f * (C + E))), sqrtf(6.0f / (2.0f * (C + E)))));
    /* nn.Linear's kaiming_uniform(a=sqrt(5)) is U(-1/sqrt(fan_in), 1/sqrt(fan_in)) */
    TFM__TRY_AS(fn, tfm_fill_uniform(&m->out_proj_weight, rng, -1.0f / sqrtf(C), 1.0f / sqrtf(C)));
    if (m->in_proj_bias.data) TFM__TRY_AS(fn, tfm_fill(&m->in_proj_bias, 0.0f));
    if (m->out_proj_bias.data) TFM__TRY_AS(fn, tfm_fill(&m->out_proj_bias, 0.0f));
    return TFM_OK;
}

/* A layer's own window (pre names its desc) asks for causal calls; a call's window and sinks, if it names
   a window, must be the layer's. */
static tfm_result tfm__chk_layer_window(const char *fn, const char *pre, int window, int sinks, const tfm_attn_opts *o) {
    if (!window) return TFM_OK;
    if (!o || !o->causal)
        return tfm__fail(TFM_E_ARG, "%s: %sattn_window %d needs causal calls (opts.causal)", fn, pre, window);
    if (o->window && o->window != window)
        return tfm__fail(TFM_E_ARG, "%s: opts.window %d differs from the layer's %sattn_window %d", fn, o->window, pre, window);
    if (o->window && o->sinks != sinks)
        return tfm__fail(TFM_E_ARG, "%s: opts.sinks %d differs from the layer's %sattn_sinks %d", fn, o->sinks, pre, sinks);
    return TFM_OK;
}

/* The attention arguments over the layer's saved projections. */
static void tfm__mha_args(const tfm_mha *m, tfm__attn_args *a) {
    int C = m->desc.d_model, E = (int)tfm__mha_kv_dim(m);
    tfm__attn_setup(a, m->B, m->desc.n_heads, m->Tq, m->Tk, C, &m->opts);
    a->Hkv = m->desc.n_kv_heads;
    if (m->desc.attn_window) { /* the layer's own window (its calls are causal: checked) */
        a->window = m->desc.attn_window;
        a->sinks = m->desc.attn_sinks;
    }
    if (m->desc.cross) {
        a->q = m->q;
        a->ldq = C;
        a->k = m->kv;
        a->v = m->kv + E;
        a->ldk = a->ldv = 2 * E;
    } else if (m->qbf) { /* bf16 elements */
        a->q = m->q;
        a->k = (const float *)(const void *)((const uint16_t *)(const void *)m->q + C);
        a->v = (const float *)(const void *)((const uint16_t *)(const void *)m->q + C + E);
        a->ldq = a->ldk = a->ldv = C + 2 * E;
        a->qkv_bf = 1;
    } else {
        a->q = m->q;
        a->k = m->q + C;
        a->v = m->q + C + E;
        a->ldq = a->ldk = a->ldv = C + 2 * E;
    }
    a->out = m->ctx;
    a->ldo = m->obf ? (int)tfm__bf16_ld(C) : C;
    a->out_bf = m->obf;
    a->lse = m->lse;
}

/* The cache row of position t: t itself, or past a rolling cache's rows its place in the ring. */
static int64_t tfm__kv_row(const tfm_kv_cache *kc, int t) {
    return t < kc->max_len ? t : kc->sinks + (t - kc->sinks) % kc->window;
}

/* Rows n of k|v (ld ldkv) of each batch row into layer `layer` of the cache: self-attention's after the
   row's cached positions (a rolling cache's ring takes one at a time once full: tfm__decode_into),
   cross-attention's from position 0. */
static void tfm__kv_store(tfm_kv_cache *kc, int layer, int cross, const float *kv, int64_t ldkv, int B, int n) {
    int64_t C2 = 2 * (int64_t)kc->kv_dim, L = cross ? kc->max_src_len : kc->max_len, drow[64];
    float *base = (cross ? kc->cross_kv : kc->self_kv) + (int64_t)layer * kc->max_batch * L * C2;
    int b0, nb, i;
    for (b0 = 0; b0 < B; b0 += nb) { /* up to 64 rows a call: one launch on CUDA */
        nb = TFM__MIN(B - b0, (int)(sizeof drow / sizeof *drow));
        for (i = 0; i < nb; i++) {
            int b = b0 + i;
            TFM_ASSERT(cross || n == 1 || kc->lens[b] + n <= kc->max_len);
            drow[i] = (int64_t)kc->slot[b] * L + (cross ? 0 : tfm__kv_row(kc, kc->lens[b]));
        }
        tfm__op_scatter_rows(kc->device, base, C2, drow, kv + (int64_t)b0 * n * ldkv, ldkv, nb, n, C2);
    }
}

/* The forward pass of a checked layer call. With a cache (decoding): self-attention appends each row's
   new keys and values after its kc->lens[b] cached positions and attends over them; cross-attention
   projects xkv into the cache on the first call (kc->src_len 0) and attends over the cached source. ybf:
   y may be written in bf16 (rows of tfm__bf16_ld(C)); returns 1 when it was (else it is fp32). */
static int tfm__mha_fwd(tfm_mha *m, float *y, const float *x, int xbf, const float *xkv, int B, int Tq, int Tk,
                        const tfm_attn_opts *opts, tfm_kv_cache *kc, int layer, int ybf) {
    tfm__attn_args a;
    int64_t C = m->desc.d_model, E = tfm__mha_kv_dim(m), ldx = xbf ? tfm__bf16_ld(C) : C;
    m->B = B;
    m->Tq = Tq;
    m->Tk = Tk;
    m->x = x;
    m->xbf = xbf;
    m->qbf = m->obf = 0;
    m->xkv = xkv;
    memset(&m->opts, 0, sizeof m->opts);
    if (opts) m->opts = *opts;
    m->has_lens = opts && opts->key_lens;
    if (m->has_lens) {
        memcpy(m->key_lens, opts->key_lens, (size_t)B * sizeof(int32_t));
        m->opts.key_lens = m->key_lens;
    }
    {
        const float *w = m->in_proj_weight.data, *b = m->in_proj_bias.data;
        if (m->desc.cross) {
            tfm__op_linear(m->device, m->q, C, x, ldx, w, b, (int64_t)B * Tq, C, C, xbf);
            if (!kc || !kc->src_len)
                tfm__op_linear(m->device, m->kv, 2 * E, xkv, C, w + C * C, b ? b + C : NULL, (int64_t)B * Tk, C, 2 * E, 0);
            if (kc && !kc->src_len) tfm__kv_store(kc, layer, 1, m->kv, 2 * E, B, Tk);
        } else {
            /* q|k|v in bf16 (the same bits the flash kernels rounded them to) where those kernels will read them,
               without rotary positions (which rotate fp32) */
            int flash = 0, nh = m->desc.n_heads + m->desc.n_kv_heads, D = (int)C / m->desc.n_heads;
            if (!kc && tfm__bf16_store(m->device, C + 2 * E)) {
                tfm__attn_args t;
                tfm__mha_args(m, &t);
                flash = tfm__op_attention_flash(m->device, &t);
            }
            m->obf = flash && tfm__bf16_store(m->device, C); /* the flash forward writes ctx in bf16 */
            if (flash && !m->desc.rope_dims)
                m->qbf = tfm__op_linear_to_bf16(m->device, m->q, C + 2 * E, x, ldx, w, b, (int64_t)B * Tq, C, C + 2 * E, xbf);
            if (flash && m->desc.rope_dims && m->dq) {
                /* with rotary positions: the product into the backward's scratch (free until then), the rotation
                   from there rounding q and k to bf16 as it writes them, and v rounded */
                tfm__op_linear(m->device, m->dq, C + 2 * E, x, ldx, w, b, (int64_t)B * Tq, C, C + 2 * E, xbf);
                tfm__op_rope(m->device, m->q, m->dq, C + 2 * E, B, Tq, nh, D, m->desc.rope_dims, m->desc.rope_base, NULL, 0, 2);
                tfm__op_to_bf16(m->device, m->q, C + 2 * E, C + E, m->dq + C + E, C + 2 * E, (int64_t)B * Tq, E);
                m->qbf = 1;
            }
            if (!m->qbf) tfm__op_linear(m->device, m->q, C + 2 * E, x, ldx, w, b, (int64_t)B * Tq, C, C + 2 * E, xbf);
            if (m->desc.rope_dims && !m->qbf) /* q and k, side by side: H + Hkv heads of each row; cached rows at their positions */
                tfm__op_rope(m->device, m->q, m->q, C + 2 * E, B, Tq, nh, D, m->desc.rope_dims, m->desc.rope_base,
                             kc ? kc->lens : NULL, 0, 0);
            if (kc) tfm__kv_store(kc, layer, 0, m->q + C, C + 2 * E, B, Tq);
        }
    }
    tfm__mha_args(m, &a);
    if (kc) { /* keys and values from the cache */
        int cross = m->desc.cross;
        int64_t L = cross ? kc->max_src_len : kc->max_len;
        a.k = (cross ? kc->cross_kv : kc->self_kv) + (int64_t)layer * kc->max_batch * L * 2 * E;
        a.v = a.k + E;
        a.ldk = a.ldv = (int)(2 * E);
        a.bsk = L * 2 * E;
        a.kv_rows = kc->slot;
        if (!cross) {
            int b, longest = 0;
            for (b = 0; b < B; b++) longest = TFM__MAX(longest, kc->lens[b]);
            a.q_off = kc->lens;
            a.Tk = TFM__MIN(longest + Tq, kc->max_len); /* less only in a rolling cache */
            a.ring = kc->window ? kc->max_len : 0;
        } else if (kc->src_len) {
            a.Tk = kc->src_len;
        }
        m->Tk = a.Tk;
    }
    (void)tfm__op_attention(m->device, &a); /* a failure is in tfm__scratch_failed */
    if (ybf && tfm__op_linear_to_bf16(m->device, y, tfm__bf16_ld(C), m->ctx, m->obf ? tfm__bf16_ld(C) : C,
                                      m->out_proj_weight.data, m->out_proj_bias.data, (int64_t)B * Tq, C, C, m->obf))
        return 1;
    tfm__op_linear(m->device, y, C, m->ctx, m->obf ? tfm__bf16_ld(C) : C, m->out_proj_weight.data, m->out_proj_bias.data,
                   (int64_t)B * Tq, C, C, m->obf);
    return 0;
}

/* The backward pass of a checked layer call: dx = dx_beta * dx + the input gradient (dx_beta 0: dx is
   only written); adds into dxkv (may be NULL) and the gradients. */
static void tfm__mha_bwd(tfm_mha *m, float *dx, float dx_beta, float *dxkv, const float *dy) {
    tfm__attn_args a;
    int64_t B = m->B, Tq = m->Tq, Tk = m->Tk, C = m->desc.d_model, E = tfm__mha_kv_dim(m);
    int64_t ldx = m->xbf ? tfm__bf16_ld(C) : C, ldd = C + 2 * E, lddo;
    int cross = m->desc.cross, dbf;
    tfm__mha_args(m, &a);
    a.overwrite = tfm__op_attention_flash(m->device, &a);
    /* out_proj: dW += dy^T ctx, db += colsum(dy), dctx = dy W. dctx, which the flash kernels round to bf16 as they
       load it, rounded in D = rowsum(dout * out) too (as FlashAttention's bf16 backward takes it), and written in
       bf16 where it fits (dbf) */
    dbf = tfm__op_linear_bwd(m->device, m->dctx, C, 0.0f, m->d_out_proj_weight.data, m->d_out_proj_bias.data, dy, C, m->ctx,
                             m->obf ? tfm__bf16_ld(C) : C, m->out_proj_weight.data, B * Tq, C, C,
                             m->obf | (a.overwrite && tfm__bf16_store(m->device, C) ? 4 : 0));
    a.dout_bf = dbf ? 2 : a.overwrite && tfm__bf16_fits(m->device, C) ? 1 : 0;
    lddo = dbf ? tfm__bf16_ld(C) : C;
    /* attention: gradients of the projected q, k, v */
    /* self-attention's dq|dk|dv from the flash kernels, where no rotation follows, rounded to bf16 (the
       in-projection's products round them anyway; its bias's sums take them rounded, as autocast's do), and
       written so where they fit (ldd in bf16 elements) */
    if (a.overwrite && !cross && !m->desc.rope_dims && tfm__bf16_fits(m->device, C + 2 * E))
        a.d_bf = tfm__bf16_store(m->device, C + 2 * E) ? 2 : 1;
    if (!a.overwrite) tfm__op_zero(m->device, m->dq, B * Tq * (cross ? C : C + 2 * E));
    if (cross) {
        if (!a.overwrite) tfm__op_zero(m->device, m->dkv, B * Tk * 2 * E);
        (void)tfm__op_attention_bwd(m->device, &a, m->dq, (int)C, m->dkv, (int)(2 * E), m->dkv + E, (int)(2 * E), m->dctx, (int)lddo);
    } else if (a.d_bf == 2) {
        uint16_t *d = (uint16_t *)(void *)m->dq;
        ldd = tfm__bf16_ld(C + 2 * E);
        (void)tfm__op_attention_bwd(m->device, &a, m->dq, (int)ldd, (float *)(void *)(d + C), (int)ldd,
                                    (float *)(void *)(d + C + E), (int)ldd, m->dctx, (int)lddo);
    } else {
        (void)tfm__op_attention_bwd(m->device, &a, m->dq, (int)(C + 2 * E), m->dq + C, (int)(C + 2 * E), m->dq + C + E,
                                    (int)(C + 2 * E), m->dctx, (int)lddo);
        if (m->desc.rope_dims) /* back through the rotation of q and k: its transpose, in place */
            tfm__op_rope(m->device, m->dq, m->dq, C + 2 * E, B, Tq, m->desc.n_heads + m->desc.n_kv_heads,
                         (int)C / m->desc.n_heads, m->desc.rope_dims, m->desc.rope_base, NULL, 1, 0);
    }
    /* in_proj */
    {
        const float *w = m->in_proj_weight.data;
        float *dw = m->d_in_proj_weight.data, *db = m->d_in_proj_bias.data;
        if (cross) {
            tfm__op_linear_bwd(m->device, dx, C, dx_beta, dw, db, m->dq, C, m->x, ldx, w, B * Tq, C, C, m->xbf);
            tfm__op_linear_bwd(m->device, dxkv, C, 1.0f, dw + C * C, db ? db + C : NULL, m->dkv, 2 * E, m->xkv, C, w + C * C, B * Tk, C, 2 * E, 0);
        } else {
            tfm__op_linear_bwd(m->device, dx, C, dx_beta, dw, db, m->dq, ldd, m->x, ldx, w, B * Tq, C, C + 2 * E,
                               m->xbf | (a.d_bf == 2 ? 2 : 0));
        }
    }
}

TFMDEF tfm_result tfm_mha_forward(tfm_mha *m, tfm_tensor *y, const tfm_tensor *x, const tfm_tensor *xkv,
                                  const tfm_attn_opts *opts) {
    const char *fn = "tfm_mha_forward";
    int64_t B, Tq, Tk, C;
    if (!m) return tfm__fail(TFM_E_ARG, "%s: layer is NULL", fn);
    if (!m->in_proj_weight.data || !m->lse || !m->q || !m->ctx || !m->key_lens)
        return tfm__fail(TFM_E_ARG, "%s: the layer has no memory (run tfm_mha_init after tfm_mem_alloc)", fn);
    TFM__TRY(tfm__chk(fn, "y", y));
    TFM__TRY(tfm__chk(fn, "x", x));
    TFM__TRY(tfm__chk_opt(fn, "xkv", xkv));
    TFM__TRY(tfm__same_device(fn, (int)m->device, 3, y, x, xkv));
    C = m->desc.d_model;
    if (x->ndim != 3 || x->shape[2] != C)
        return tfm__fail(TFM_E_SHAPE, "%s: x is %s, want (B,T,%lld)", fn, tfm__shp(x), (long long)C);
    B = x->shape[0];
    Tq = x->shape[1];
    if (B > m->desc.max_batch || Tq > m->desc.max_len)
        return tfm__fail(TFM_E_SHAPE, "%s: x is %s but the layer was sized for batch %d and length %d", fn, tfm__shp(x),
                         m->desc.max_batch, m->desc.max_len);
    if (!m->desc.cross && xkv) return tfm__fail(TFM_E_ARG, "%s: xkv given to a self-attention layer", fn);
    if (m->desc.cross && !xkv) return tfm__fail(TFM_E_ARG, "%s: a cross-attention layer needs xkv", fn);
    Tk = Tq;
    if (xkv) {
        if (xkv->ndim != 3 || xkv->shape[0] != B || xkv->shape[2] != C)
            return tfm__fail(TFM_E_SHAPE, "%s: x is %s but xkv is %s: want (%lld,Tk,%lld)", fn, tfm__shp(x),
                             tfm__shp(xkv), (long long)B, (long long)C);
        Tk = xkv->shape[1];
        if (Tk > m->desc.max_kv_len)
            return tfm__fail(TFM_E_SHAPE, "%s: xkv is %s but the layer was sized for key length %d", fn, tfm__shp(xkv),
                             m->desc.max_kv_len);
    }
    TFM__TRY(tfm__chk_same(fn, "x", x, "y", y));
    if (y->data == x->data || (xkv && y->data == xkv->data))
        return tfm__fail(TFM_E_ARG, "%s: y must not alias x or xkv (backward reads them)", fn);
    TFM__TRY(tfm__chk_attn_opts(fn, opts, B, Tq, Tk));
    TFM__TRY(tfm__chk_layer_window(fn, "desc.", m->desc.attn_window, m->desc.attn_sinks, opts));
    if (opts && opts->dropout > 0.0f && !m->has_grad)
        return tfm__fail(TFM_E_ARG, "%s: opts.dropout > 0 in a layer built with no_grad", fn);
    if (opts && opts->n_kv_heads && opts->n_kv_heads != m->desc.n_kv_heads)
        return tfm__fail(TFM_E_ARG, "%s: opts.n_kv_heads %d differs from the layer's desc.n_kv_heads %d", fn, opts->n_kv_heads,
                         m->desc.n_kv_heads);

    TFM__TRY(tfm__scratch_reserve(fn));
    (void)tfm__mha_fwd(m, y->data, x->data, 0, xkv ? xkv->data : NULL, (int)B, (int)Tq, (int)Tk, opts, NULL, 0, 0);
    return tfm__scratch_check(fn);
}

TFMDEF tfm_result tfm_mha_backward(tfm_mha *m, tfm_tensor *dx, tfm_tensor *dxkv, const tfm_tensor *dy) {
    const char *fn = "tfm_mha_backward";
    int64_t B, Tq, Tk, C;
    int cross;
    if (!m) return tfm__fail(TFM_E_ARG, "%s: layer is NULL", fn);
    if (!m->has_grad || !m->d_in_proj_weight.data)
        return tfm__fail(TFM_E_ARG, "%s: the layer has no gradient memory (built with no_grad, or not allocated)", fn);
    if (!m->B) return tfm__fail(TFM_E_ARG, "%s: no forward pass to go back through", fn);
    TFM__TRY(tfm__chk(fn, "dy", dy));
    TFM__TRY(tfm__chk_opt(fn, "dx", dx));
    TFM__TRY(tfm__chk_opt(fn, "dxkv", dxkv));
    TFM__TRY(tfm__same_device(fn, (int)m->device, 3, dy, dx, dxkv));
    B = m->B;
    Tq = m->Tq;
    Tk = m->Tk;
    C = m->desc.d_model;
    cross = m->desc.cross;
    if (dy->ndim != 3 || dy->shape[0] != B || dy->shape[1] != Tq || dy->shape[2] != C)
        return tfm__fail(TFM_E_SHAPE, "%s: dy is %s but the last forward made (%lld,%lld,%lld)", fn, tfm__shp(dy),
                         (long long)B, (long long)Tq, (long long)C);
    if (dx && (dx->ndim != 3 || dx->shape[0] != B || dx->shape[1] != Tq || dx->shape[2] != C))
        return tfm__fail(TFM_E_SHAPE, "%s: dx is %s but the last forward's x was (%lld,%lld,%lld)", fn, tfm__shp(dx),
                         (long long)B, (long long)Tq, (long long)C);
    if (dxkv && !cross) return tfm__fail(TFM_E_ARG, "%s: dxkv given to a self-attention layer", fn);
    if (dxkv && (dxkv->ndim != 3 || dxkv->shape[0] != B || dxkv->shape[1] != Tk || dxkv->shape[2] != C))
        return tfm__fail(TFM_E_SHAPE, "%s: dxkv is %s but the last forward's xkv was (%lld,%lld,%lld)", fn,
                         tfm__shp(dxkv), (long long)B, (long long)Tk, (long long)C);

    TFM__TRY(tfm__scratch_reserve(fn));
    tfm__mha_bwd(m, dx ? dx->data : NULL, 1.0f, dxkv ? dxkv->data : NULL, dy->data);
    return tfm__scratch_check(fn);
}

/* ==== >>impl-layers ==== the linear and layernorm layers: carved from a tfm_mem, a forward/backward pair each */

/* Dropout sites. Every dropout mask is a hash of (seed_mix(pass seed, site), element index), so a mask
   depends only on the seed of the forward pass and where it is drawn; exact resume from a checkpoint
   depends on these values, which must never change. A model's training forward draws one pass seed
   from its generator (tfm_model_set_stream mixes in a process's stream); from it, the embeddings draw
   at SRC_EMB / TGT_EMB and layer l of a stack gets the block seed seed_mix(pass, STACK + l) (an
   encoder-decoder's decoder: DEC_STACK + l). Inside a block, sub-layer s (self-attention, then
   cross-attention, then feed-forward) drops its output at RESIDUAL + s and its attention weights at
   ATTN + s. */
enum {
    TFM__SITE_RESIDUAL = 0,
    TFM__SITE_SRC_EMB = 1,
    TFM__SITE_TGT_EMB = 2,
    TFM__SITE_ATTN = 100,
    TFM__SITE_STACK = 1000,
    TFM__SITE_DEC_STACK = 2000
};

/* Seed of dropout site `site` in a pass drawn with `seed`. */
static uint64_t tfm__seed_mix(uint64_t seed, uint64_t site) {
    uint64_t x = seed ^ (site * 0xD1B54A32D192ED03ull);
    return tfm__splitmix64(&x);
}

static void tfm__linear_carve(tfm_linear *l, int64_t out, int64_t in, int bias, tfm_mem *mem) {
    int64_t sh[2];
    sh[0] = out;
    sh[1] = in;
    memset(l, 0, sizeof *l);
    l->weight = tfm_arena_tensor(&mem->params, 2, sh);
    if (bias) l->bias = tfm_arena_tensor(&mem->params, 1, sh);
    if (!mem->no_grad) {
        l->d_weight = tfm_arena_tensor(&mem->grads, 2, sh);
        if (bias) l->d_bias = tfm_arena_tensor(&mem->grads, 1, sh);
    }
}

/* rms: an RMSNorm (no bias, no mean) */
static void tfm__layernorm_carve(tfm_layernorm *ln, int64_t C, int bias, size_t rows, tfm_mem *mem, int rms) {
    memset(ln, 0, sizeof *ln);
    bias = bias && !rms;
    ln->rms = rms;
    ln->weight = tfm_arena_tensor(&mem->params, 1, &C);
    if (bias) ln->bias = tfm_arena_tensor(&mem->params, 1, &C);
    if (!mem->no_grad) {
        ln->d_weight = tfm_arena_tensor(&mem->grads, 1, &C);
        if (bias) ln->d_bias = tfm_arena_tensor(&mem->grads, 1, &C);
    }
    if (!rms) ln->mean = tfm__carve(&mem->acts, rows);
    ln->rstd = tfm__carve(&mem->acts, rows);
    ln->max_rows = (int64_t)rows;
}

static tfm_result tfm__layernorm_reset(tfm_layernorm *ln) {
    if (ln->weight.data) TFM__TRY(tfm_fill(&ln->weight, 1.0f));
    if (ln->bias.data) TFM__TRY(tfm_fill(&ln->bias, 0.0f));
    return TFM_OK;
}

/* nn.Linear's default: U(+-1/sqrt(fan_in)) for weight and bias */
static tfm_result tfm__linear_reset(tfm_linear *l, tfm_rng *rng) {
    float bound;
    if (!l->weight.data) return TFM_OK;
    bound = 1.0f / sqrtf((float)l->weight.shape[1]);
    TFM__TRY(tfm_fill_uniform(&l->weight, rng, -bound, bound));
    if (l->bias.data) TFM__TRY(tfm_fill_uniform(&l->bias, rng, -bound, bound));
    return TFM_OK;
}

TFMDEF void tfm_mem_zero_grad(tfm_mem *m) {
    if (m && m->grads.base && m->grads.used)
        tfm__op_zero(m->grads.dev ? TFM_DEVICE_CUDA : TFM_DEVICE_CPU, (float *)(m->grads.dev ? m->grads.dev : m->grads.base),
                     (int64_t)(TFM__MIN(m->grads.used, m->grads.size) / sizeof(float)));
}

TFMDEF tfm_result tfm_linear_init(tfm_linear *l, int in_features, int out_features, int no_bias, tfm_mem *mem) {
    const char *fn = "tfm_linear_init";
    if (!l || !mem) return tfm__fail(TFM_E_ARG, "%s: layer or mem is NULL", fn);
    if (in_features < 1 || out_features < 1 || (double)in_features * out_features > 2147483647.0)
        return tfm__fail(TFM_E_ARG, "%s: in_features %d and out_features %d must be >= 1, their product < 2^31", fn,
                         in_features, out_features);
    tfm__linear_carve(l, out_features, in_features, !no_bias, mem);
    return tfm_mem_check(mem) == TFM_OK ? TFM_OK : tfm__fail(TFM_E_NOMEM, "%s: %s", fn, tfm_last_error());
}

TFMDEF tfm_result tfm_linear_init_params(tfm_linear *l, tfm_rng *rng) {
    if (!l || !rng || !l->weight.data)
        return tfm__fail(TFM_E_ARG, "tfm_linear_init_params: layer or rng is NULL, or the layer has no memory");
    TFM__TRY_AS("tfm_linear_init_params", tfm__linear_reset(l, rng));
    return TFM_OK;
}

TFMDEF tfm_result tfm_linear_layer_forward(const tfm_linear *l, tfm_tensor *y, const tfm_tensor *x) {
    if (!l || !l->weight.data) return tfm__fail(TFM_E_ARG, "tfm_linear_layer_forward: layer is NULL or has no memory");
    return tfm_linear_forward(y, x, &l->weight, l->bias.data ? &l->bias : NULL);
}

TFMDEF tfm_result tfm_linear_layer_backward(tfm_linear *l, tfm_tensor *dx, const tfm_tensor *dy, const tfm_tensor *x) {
    if (!l || !l->weight.data || !l->d_weight.data)
        return tfm__fail(TFM_E_ARG, "tfm_linear_layer_backward: layer is NULL or has no gradient memory");
    return tfm_linear_backward(dx, &l->d_weight, l->d_bias.data ? &l->d_bias : NULL, dy, x, &l->weight);
}

TFMDEF tfm_result tfm_layernorm_init(tfm_layernorm *ln, int C, int no_bias, float eps, int64_t max_rows, tfm_mem *mem) {
    const char *fn = "tfm_layernorm_init";
    if (!ln || !mem) return tfm__fail(TFM_E_ARG, "%s: layer or mem is NULL", fn);
    if (C < 1 || max_rows < 1 || max_rows > ((int64_t)1 << 31) || !(eps >= 0.0f) || !isfinite(eps))
        return tfm__fail(TFM_E_ARG, "%s: C %d and max_rows %lld must be >= 1 (max_rows < 2^31), eps %g finite and >= 0", fn,
                         C, (long long)max_rows, (double)eps);
    tfm__layernorm_carve(ln, C, !no_bias, (size_t)max_rows, mem, 0);
    ln->eps = eps == 0.0f ? 1e-5f : eps;
    return tfm_mem_check(mem) == TFM_OK ? TFM_OK : tfm__fail(TFM_E_NOMEM, "%s: %s", fn, tfm_last_error());
}

TFMDEF tfm_result tfm_rmsnorm_init(tfm_layernorm *ln, int C, float eps, int64_t max_rows, tfm_mem *mem) {
    const char *fn = "tfm_rmsnorm_init";
    if (!ln || !mem) return tfm__fail(TFM_E_ARG, "%s: layer or mem is NULL", fn);
    if (C < 1 || max_rows < 1 || max_rows > ((int64_t)1 << 31) || !(eps >= 0.0f) || !isfinite(eps))
        return tfm__fail(TFM_E_ARG, "%s: C %d and max_rows %lld must be >= 1 (max_rows < 2^31), eps %g finite and >= 0", fn,
                         C, (long long)max_rows, (double)eps);
    tfm__layernorm_carve(ln, C, 0, (size_t)max_rows, mem, 1);
    ln->eps = eps == 0.0f ? 1e-5f : eps;
    return tfm_mem_check(mem) == TFM_OK ? TFM_OK : tfm__fail(TFM_E_NOMEM, "%s: %s", fn, tfm_last_error());
}

TFMDEF tfm_result tfm_layernorm_init_params(tfm_layernorm *ln) {
    if (!ln || !ln->weight.data) return tfm__fail(TFM_E_ARG, "tfm_layernorm_init_params: layer is NULL or has no memory");
    TFM__TRY_AS("tfm_layernorm_init_params", tfm__layernorm_reset(ln));
    return TFM_OK;
}

TFMDEF tfm_result tfm_layernorm_layer_forward(tfm_layernorm *ln, tfm_tensor *y, const tfm_tensor *x) {
    const char *fn = "tfm_layernorm_layer_forward";
    tfm_tensor mean, rstd;
    int64_t rows;
    if (!ln || !ln->weight.data || !ln->rstd) return tfm__fail(TFM_E_ARG, "%s: layer is NULL or has no memory", fn);
    TFM__TRY(tfm__chk(fn, "x", x));
    rows = tfm__rows(x);
    if (rows > ln->max_rows)
        return tfm__fail(TFM_E_SHAPE, "%s: x is %s: %lld rows, the layer was sized for %lld", fn, tfm__shp(x), (long long)rows,
                         (long long)ln->max_rows);
    mean = tfm_tensor1(ln->mean, rows);
    rstd = tfm_tensor1(ln->rstd, rows);
    mean.device = rstd.device = ln->weight.device;
    if (ln->rms) TFM__TRY(tfm_rmsnorm_forward(y, &rstd, x, &ln->weight, ln->eps));
    else TFM__TRY(tfm_layernorm_forward(y, &mean, &rstd, x, &ln->weight, ln->bias.data ? &ln->bias : NULL, ln->eps));
    ln->rows = rows;
    return TFM_OK;
}

TFMDEF tfm_result tfm_layernorm_layer_backward(tfm_layernorm *ln, tfm_tensor *dx, const tfm_tensor *dy,
                                               const tfm_tensor *x) {
    const char *fn = "tfm_layernorm_layer_backward";
    tfm_tensor mean, rstd;
    if (!ln || !ln->weight.data || !ln->d_weight.data)
        return tfm__fail(TFM_E_ARG, "%s: layer is NULL or has no gradient memory", fn);
    TFM__TRY(tfm__chk(fn, "x", x));
    if (!ln->rows || tfm__rows(x) != ln->rows)
        return tfm__fail(TFM_E_ARG, "%s: x is %s but the last forward had %lld rows", fn, tfm__shp(x), (long long)ln->rows);
    mean = tfm_tensor1(ln->mean, ln->rows);
    rstd = tfm_tensor1(ln->rstd, ln->rows);
    mean.device = rstd.device = ln->weight.device;
    if (ln->rms) return tfm_rmsnorm_backward(dx, &ln->d_weight, dy, x, &ln->weight, &rstd);
    return tfm_layernorm_backward(dx, &ln->d_weight, ln->d_bias.data ? &ln->d_bias : NULL, dy, x, &ln->weight, &mean,
                                  &rstd);
}

/* ==== >>impl-block ==== the transformer block: attention and MLP sublayers, pre- or post-norm */

static tfm_result tfm__block_desc_resolve(const char *fn, const tfm_block_desc *in, tfm_block_desc *d) {
    *d = *in;
    if (d->d_model <= 0) return tfm__fail(TFM_E_ARG, "%s: desc.d_model is %d: required, > 0", fn, d->d_model);
    if (d->n_heads <= 0) return tfm__fail(TFM_E_ARG, "%s: desc.n_heads is %d: required, > 0", fn, d->n_heads);
    if (d->d_model % d->n_heads)
        return tfm__fail(TFM_E_ARG, "%s: desc.n_heads %d does not divide desc.d_model %d", fn, d->n_heads, d->d_model);
    if (d->d_ff < 0) return tfm__fail(TFM_E_ARG, "%s: desc.d_ff is %d: must be >= 0", fn, d->d_ff);
    if (d->max_len <= 0) return tfm__fail(TFM_E_ARG, "%s: desc.max_len is %d: required, > 0", fn, d->max_len);
    if (d->max_batch < 0 || d->max_kv_len < 0)
        return tfm__fail(TFM_E_ARG, "%s: desc.max_batch %d and desc.max_kv_len %d must be >= 0", fn, d->max_batch, d->max_kv_len);
    if ((int)d->act < 0 || (int)d->act > 3) return tfm__fail(TFM_E_ARG, "%s: desc.act %d is not a tfm_activation", fn, (int)d->act);
    if (!(d->dropout >= 0.0f && d->dropout < 1.0f) || !(d->attn_dropout >= 0.0f && d->attn_dropout < 1.0f))
        return tfm__fail(TFM_E_ARG, "%s: desc.dropout %g and desc.attn_dropout %g must be in [0,1)", fn,
                         (double)d->dropout, (double)d->attn_dropout);
    if (!(d->ln_eps >= 0.0f) || !isfinite(d->ln_eps))
        return tfm__fail(TFM_E_ARG, "%s: desc.ln_eps %g must be finite and >= 0", fn, (double)d->ln_eps);
    if ((int)d->norm < 0 || (int)d->norm > 1) return tfm__fail(TFM_E_ARG, "%s: desc.norm %d is not a tfm_norm_kind", fn, (int)d->norm);
    TFM__TRY(tfm__rope_fields(fn, "desc.", d->rope_dims, &d->rope_base, d->d_model / d->n_heads));
    TFM__TRY(tfm__kv_heads_field(fn, "desc.", d->n_kv_heads, d->n_heads));
    if (d->n_kv_heads == 0) d->n_kv_heads = d->n_heads;
    TFM__TRY(tfm__window_fields(fn, "desc.attn_window", "desc.attn_sinks", d->attn_window, d->attn_sinks));
    if (d->d_ff == 0) d->d_ff = 4 * d->d_model;
    if (d->max_batch == 0) d->max_batch = 1;
    if (d->max_kv_len == 0) d->max_kv_len = d->max_len;
    if (d->ln_eps == 0.0f) d->ln_eps = 1e-5f;
    d->cross = d->cross != 0;
    d->norm_first = d->norm_first != 0;
    d->no_bias = d->no_bias != 0;
    if ((double)d->max_batch * d->max_len * d->d_ff * (d->act == TFM_ACT_SWIGLU ? 2 : 1) > 2147483647.0)
        return tfm__fail(TFM_E_ARG, "%s: max_batch %d x max_len %d x d_ff %d is beyond 2^31 elements", fn, d->max_batch,
                         d->max_len, d->d_ff);
    return TFM_OK;
}

TFMDEF tfm_result tfm_block_init(tfm_block *blk, const tfm_block_desc *desc, tfm_mem *mem) {
    const char *fn = "tfm_block_init";
    tfm_block_desc d;
    tfm_mha_desc md;
    size_t BT, BTF, BTF1, mark;
    int s;
    if (!blk || !desc || !mem) return tfm__fail(TFM_E_ARG, "%s: block, desc or mem is NULL", fn);
    TFM__TRY(tfm__block_desc_resolve(fn, desc, &d));
    memset(blk, 0, sizeof *blk);
    blk->desc = d;
    blk->n_sub = d.cross ? 3 : 2;
    blk->has_grad = !mem->no_grad;
    blk->device = mem->device;
    BT = (size_t)d.max_batch * d.max_len * d.d_model;
    BTF = (size_t)d.max_batch * d.max_len * d.d_ff;
    BTF1 = d.act == TFM_ACT_SWIGLU ? 2 * BTF : BTF; /* linear1's outputs: gate and up with SwiGLU */
    /* this layer's scratch first: it stays live while the attention layers use theirs */
    mark = mem->scratch.used;
    blk->sub_out = tfm__carve(&mem->scratch, BT);
    if (!mem->no_grad) {
        blk->d_a = tfm__carve(&mem->scratch, BT);
        blk->d_b = tfm__carve(&mem->scratch, BT);
        blk->d_u = tfm__carve(&mem->scratch, BT);
        blk->d_ff1 = tfm__carve(&mem->scratch, BTF1);
        blk->d_ff2 = tfm__carve(&mem->scratch, BTF);
    }
    memset(&md, 0, sizeof md);
    md.d_model = d.d_model;
    md.n_heads = d.n_heads;
    md.no_bias = d.no_bias;
    md.max_batch = d.max_batch;
    md.max_len = d.max_len;
    md.rope_dims = d.rope_dims;
    md.rope_base = d.rope_base;
    md.n_kv_heads = d.n_kv_heads;
    md.attn_window = d.attn_window;
    md.attn_sinks = d.attn_sinks;
    TFM__TRY(tfm_mha_init(&blk->self_attn, &md, mem));
    if (d.cross) {
        md.cross = 1;
        md.rope_dims = 0;
        md.rope_base = 0.0f;
        md.attn_window = md.attn_sinks = 0;
        md.max_kv_len = d.max_kv_len;
        TFM__TRY(tfm_mha_init(&blk->cross_attn, &md, mem));
    }
    tfm__linear_carve(&blk->linear1, d.act == TFM_ACT_SWIGLU ? 2 * d.d_ff : d.d_ff, d.d_model, !d.no_bias, mem);
    tfm__linear_carve(&blk->linear2, d.d_model, d.d_ff, !d.no_bias, mem);
    for (s = 0; s < blk->n_sub; s++)
        tfm__layernorm_carve(&blk->norm[s], d.d_model, !d.no_bias, (size_t)d.max_batch * d.max_len, mem, d.norm == TFM_NORM_RMS);
    for (s = 1; s < blk->n_sub; s++) blk->buf_stream[s] = tfm__carve(&mem->acts, BT);
    for (s = 0; s < blk->n_sub; s++) blk->ln_io[s] = tfm__carve(&mem->acts, BT);
    blk->ff_pre = tfm__carve(&mem->acts, BTF1);
    blk->ff_act = tfm__carve(&mem->acts, BTF);
    mem->scratch.used = mark;
    if (tfm_mem_check(mem) != TFM_OK) return tfm__fail(TFM_E_NOMEM, "%s: %s", fn, tfm_last_error());
    return TFM_OK;
}

TFMDEF tfm_result tfm_block_init_params(tfm_block *blk, tfm_rng *rng) {
    int s;
    if (!blk || !rng) return tfm__fail(TFM_E_ARG, "tfm_block_init_params: block or rng is NULL");
    if (!blk->linear1.weight.data)
        return tfm__fail(TFM_E_ARG, "tfm_block_init_params: the block has no memory (run tfm_block_init after tfm_mem_alloc)");
    TFM__TRY_AS("tfm_block_init_params", tfm_mha_init_params(&blk->self_attn, rng));
    if (blk->desc.cross) TFM__TRY_AS("tfm_block_init_params", tfm_mha_init_params(&blk->cross_attn, rng));
    TFM__TRY_AS("tfm_block_init_params", tfm__linear_reset(&blk->linear1, rng));
    TFM__TRY_AS("tfm_block_init_params", tfm__linear_reset(&blk->linear2, rng));
    for (s = 0; s < blk->n_sub; s++) TFM__TRY_AS("tfm_block_init_params", tfm__layernorm_reset(&blk->norm[s]));
    return TFM_OK;
}

/* A layer's parameters under their torch names (part + name): value, gradient, how a model
   initialises it and whether AdamW decays it. The model's registry and the layers' lookups read it. */
enum { TFM__INIT_ZERO, TFM__INIT_ONE, TFM__INIT_MATRIX, TFM__INIT_EMB };
typedef struct tfm__named { const char *part, *name; tfm_tensor *value, *grad; int init, decay; } tfm__named;
#define TFM__MAX_NAMED (2 * 4 + 2 * 2 + TFM__MAX_SUB * 2)

static void tfm__name(tfm__named *e, const char *part, const char *name, tfm_tensor *v, tfm_tensor *g, int init,
                      int decay) {
    e->part = part;
    e->name = name;
    e->value = v;
    e->grad = g;
    e->init = init;
    e->decay = decay;
}

static int tfm__mha_named(tfm_mha *a, const char *part, tfm__named *out) {
    tfm__name(&out[0], part, "in_proj_weight", &a->in_proj_weight, &a->d_in_proj_weight, TFM__INIT_MATRIX, 1);
    tfm__name(&out[1], part, "in_proj_bias", &a->in_proj_bias, &a->d_in_proj_bias, TFM__INIT_ZERO, 0);
    tfm__name(&out[2], part, "out_proj.weight", &a->out_proj_weight, &a->d_out_proj_weight, TFM__INIT_MATRIX, 1);
    tfm__name(&out[3], part, "out_proj.bias", &a->out_proj_bias, &a->d_out_proj_bias, TFM__INIT_ZERO, 0);
    return 4;
}

static int tfm__block_named(tfm_block *b, tfm__named *out) {
    static const char *const norms[TFM__MAX_SUB] = {"norm1.", "norm2.", "norm3."};
    int n = tfm__mha_named(&b->self_attn, "self_attn.", out), s;
    if (b->desc.cross) n += tfm__mha_named(&b->cross_attn, "multihead_attn.", out + n);
    tfm__name(&out[n++], "linear1.", "weight", &b->linear1.weight, &b->linear1.d_weight, TFM__INIT_MATRIX, 1);
    tfm__name(&out[n++], "linear1.", "bias", &b->linear1.bias, &b->linear1.d_bias, TFM__INIT_ZERO, 0);
    tfm__name(&out[n++], "linear2.", "weight", &b->linear2.weight, &b->linear2.d_weight, TFM__INIT_MATRIX, 1);
    tfm__name(&out[n++], "linear2.", "bias", &b->linear2.bias, &b->linear2.d_bias, TFM__INIT_ZERO, 0);
    for (s = 0; s < b->n_sub; s++) {
        tfm__name(&out[n++], norms[s], "weight", &b->norm[s].weight, &b->norm[s].d_weight, TFM__INIT_ONE, 0);
        tfm__name(&out[n++], norms[s], "bias", &b->norm[s].bias, &b->norm[s].d_bias, TFM__INIT_ZERO, 0);
    }
    return n;
}

/* The lowest address of a block's parameter gradients (tfm_dist_backward: they are final from there up). */
static const float *tfm__block_grad_lo(tfm_block *b) {
    tfm__named e[TFM__MAX_NAMED];
    const float *lo = NULL;
    int k, n = tfm__block_named(b, e);
    for (k = 0; k < n; k++)
        if (e[k].grad && e[k].grad->data && (!lo || e[k].grad->data < lo)) lo = e[k].grad->data;
    return lo;
}

/* The entry of torch name `name` among n, into *value and *grad; fn names the caller in the error. */
static tfm_result tfm__named_find(const char *fn, const tfm__named *e, int n, const char *name, tfm_tensor *value,
                                  tfm_tensor *grad) {
    int i;
    if (!name) return tfm__fail(TFM_E_ARG, "%s: name is NULL", fn);
    for (i = 0; i < n; i++) {
        size_t k = strlen(e[i].part);
        if (e[i].value->data && !strncmp(name, e[i].part, k) && !strcmp(name + k, e[i].name)) {
            if (value) *value = *e[i].value;
            if (grad) *grad = *e[i].grad;
            return TFM_OK;
        }
    }
    return tfm__fail(TFM_E_ARG, "%s: the layer has no parameter \"%s\"", fn, name);
}

TFMDEF tfm_result tfm_block_param(tfm_block *blk, const char *name, tfm_tensor *value, tfm_tensor *grad) {
    tfm__named e[TFM__MAX_NAMED];
    if (!blk || !blk->linear1.weight.data) return tfm__fail(TFM_E_ARG, "tfm_block_param: block is NULL or has no memory");
    return tfm__named_find("tfm_block_param", e, tfm__block_named(blk, e), name, value, grad);
}

TFMDEF tfm_result tfm_mha_param(tfm_mha *m, const char *name, tfm_tensor *value, tfm_tensor *grad) {
    tfm__named e[4];
    if (!m || !m->in_proj_weight.data) return tfm__fail(TFM_E_ARG, "tfm_mha_param: layer is NULL or has no memory");
    return tfm__named_find("tfm_mha_param", e, tfm__mha_named(m, "", e), name, value, grad);
}

/* Sub-layer s of a block: v = F_s(u) (ubf: u is a bf16 activation). vbf: v may be written in bf16 by its
   product (rows of tfm__bf16_ld(C)); returns 1 when it was. */
static int tfm__block_sub_fwd(tfm_block *blk, int s, float *v, const float *u, int ubf, tfm_kv_cache *kc, int layer,
                              int vbf) {
    const tfm_block_desc *d = &blk->desc;
    const tfm_attn_opts *bo = &blk->opts;
    int64_t N = (int64_t)blk->B * blk->T, C = d->d_model, F = d->d_ff;
    tfm_attn_opts o;
    memset(&o, 0, sizeof o);
    if (bo->training && d->attn_dropout > 0.0f) {
        o.dropout = d->attn_dropout;
        o.dropout_seed = tfm__seed_mix(bo->seed, TFM__SITE_ATTN + (uint64_t)s);
    }
    if (s == 0) {
        o.causal = bo->causal;
        o.window = bo->window;
        o.sinks = bo->sinks;
        o.key_lens = bo->key_lens;
        o.mask = bo->mask;
        o.batch_offset = bo->batch_offset;
        o.mask_per_batch = bo->mask_per_batch;
        return tfm__mha_fwd(&blk->self_attn, v, u, ubf, NULL, blk->B, blk->T, blk->T, &o, kc, layer, vbf);
    } else if (s == 1 && d->cross) {
        o.key_lens = bo->kv_lens;
        o.batch_offset = bo->batch_offset;
        return tfm__mha_fwd(&blk->cross_attn, v, u, ubf, blk->xkv, blk->B, blk->T, blk->Tk, &o, kc, layer, vbf);
    } else {
        int64_t ldh = blk->bf_h ? tfm__bf16_ld(F) : F;
        blk->bf_pre = tfm__op_linear_act(blk->device, d->act, blk->ff_act, blk->ff_pre, u, blk->linear1.weight.data, blk->linear1.bias.data, N, C, F, ubf, blk->bf_h);
        if (vbf && tfm__op_linear_to_bf16(blk->device, v, tfm__bf16_ld(C), blk->ff_act, ldh, blk->linear2.weight.data,
                                          blk->linear2.bias.data, N, F, C, blk->bf_h))
            return 1;
        tfm__op_linear(blk->device, v, C, blk->ff_act, ldh, blk->linear2.weight.data, blk->linear2.bias.data, N, F, C, blk->bf_h);
    }
    return 0;
}

/* Sub-layer s backward: du = du_beta * du + dF_s/du (dv) (du_beta 0: du is only written); parameter
   gradients added. */
static void tfm__block_sub_bwd(tfm_block *blk, int s, float *du, float du_beta, const float *dv, float *dxkv) {
    const tfm_block_desc *d = &blk->desc;
    int64_t N = (int64_t)blk->B * blk->T, C = d->d_model, F = d->d_ff;
    if (s == 0) {
        tfm__mha_bwd(&blk->self_attn, du, du_beta, NULL, dv);
    } else if (s == 1 && d->cross) {
        tfm__mha_bwd(&blk->cross_attn, du, du_beta, dxkv, dv);
    } else {
        const float *u = d->norm_first ? blk->ln_io[s] : blk->stream[s];
        int64_t F1 = d->act == TFM_ACT_SWIGLU ? 2 * F : F;
        /* d_ff2, which only the activation's backward reads, rounded to bf16 in a bf16 model call (as autocast's
           bf16 activation takes its output gradient), written so by the product where it can (dybf), else
           rounded in place */
        int dyr = tfm__bf16_fits(blk->device, F);
        int dybf = tfm__op_linear_bwd(blk->device, blk->d_ff2, F, 0.0f, blk->linear2.d_weight.data, blk->linear2.d_bias.data,
                                      dv, C, blk->ff_act, blk->bf_h ? tfm__bf16_ld(F) : F, blk->linear2.weight.data, N, F, C,
                                      blk->bf_h | (dyr && tfm__bf16_store(blk->device, F) ? 4 : 0));
        if (dyr && !dybf) tfm__op_bf16_rows(blk->device, blk->d_ff2, F, blk->d_ff2, 0, N, F);
        /* hbf: d_ff1 in bf16 (SwiGLU's where no bias sums read it) */
        int ubf = d->norm_first && blk->bf_u, hbf = blk->bf_h && (d->act != TFM_ACT_SWIGLU || !blk->linear1.bias.data);
        TFM_ASSERT(!blk->bf_pre || hbf || d->act == TFM_ACT_SWIGLU);
        if (d->act == TFM_ACT_SWIGLU) tfm__op_swiglu_bwd(blk->device, blk->d_ff1, blk->d_ff2, dybf, blk->ff_pre, N, F, hbf, blk->bf_pre);
        else if (hbf) tfm__op_act_bwd_bf16(blk->device, d->act, blk->d_ff1, blk->linear1.d_bias.data, blk->d_ff2, dybf, blk->ff_pre, N, F, blk->bf_pre);
        else tfm__op_act_bwd(blk->device, d->act, blk->d_ff1, blk->d_ff2, blk->ff_pre, N * F, 0.0f);
        tfm__op_linear_bwd(blk->device, du, C, du_beta, blk->linear1.d_weight.data, hbf ? NULL : blk->linear1.d_bias.data, blk->d_ff1, hbf ? tfm__bf16_ld(F1) : F1, u, ubf ? tfm__bf16_ld(C) : C, blk->linear1.weight.data, N, C, F1, ubf | (hbf ? 2 : 0));
    }
}

/* pre-LN:  u = LN_s(x_s);  x_{s+1} = x_s + drop(F_s(u))
   post-LN: r = x_s + drop(F_s(x_s));  x_{s+1} = LN_s(r)       (ln_io[s] holds u or r) */
/* A norm that a pre-LN block runs in the same pass as its last residual add (tfm__block_fwd): the next
   block's first (its output that block's ln_io[0], bf: a bf16 activation as that block's bf_u) or the
   stack's final one. */
typedef struct tfm__norm_after { tfm_layernorm *ln; float *out; float eps; int bf; } tfm__norm_after;

/* in_normed (pre-LN): x's first norm already ran, with the residual add of the block below (its output
   in blk->ln_io[0], its statistics in blk->norm[0]); after (pre-LN, may be NULL): the norm to run on y
   with the last residual add. */
static void tfm__block_fwd(tfm_block *blk, float *y, const float *x, const float *xkv, int B, int T, int Tk,
                           const tfm_attn_opts *opts, tfm_kv_cache *kc, int layer, int in_normed,
                           const tfm__norm_after *after) {
    const tfm_block_desc *d = &blk->desc;
    int64_t N = (int64_t)B * T, C = d->d_model;
    int s;
    blk->B = B;
    blk->T = T;
    blk->Tk = Tk;
    blk->xkv = xkv;
    blk->opts = *opts;
    blk->stream[0] = x;
    blk->bf_u = d->norm_first && tfm__bf16_store(blk->device, C); /* (the block below wrote ln_io[0] so: after->bf) */
    blk->bf_h = tfm__bf16_store(blk->device, d->d_ff);
    for (s = 0; s < blk->n_sub; s++) {
        const float *xs = blk->stream[s];
        float *out = s == blk->n_sub - 1 ? y : blk->buf_stream[s + 1];
        float *v = blk->sub_out;
        tfm_layernorm *ln = &blk->norm[s];
        int drop = opts->training && d->dropout > 0.0f;
        /* v, which only the residual add with the norm after it reads, rounded to bf16 in a bf16 model call (as
           autocast's nn.Linear output is; not under dropout): vbf 1, written so by its product; 2, rounded as read */
        int vbf = !drop && (!d->norm_first || s + 1 < blk->n_sub || after) && tfm__bf16_fits(blk->device, C) ? 2 : 0;
        if (d->norm_first) {
            if (s == 0 && !in_normed) /* (the later sub-layers' norms ran with the residual add before them) */
                tfm__op_layernorm(blk->device, blk->ln_io[0], ln->mean, ln->rstd, xs, ln->weight.data, ln->bias.data, d->ln_eps, N, C, ln->rms, blk->bf_u);
            if (tfm__block_sub_fwd(blk, s, v, blk->ln_io[s], blk->bf_u, kc, layer, vbf && tfm__bf16_store(blk->device, C))) vbf = 1;
        } else {
            if (tfm__block_sub_fwd(blk, s, v, xs, 0, kc, layer, vbf && tfm__bf16_store(blk->device, C))) vbf = 1;
        }
        if (drop)
            tfm__op_dropout(blk->device, v, v, N * C, d->dropout, tfm__seed_mix(opts->seed, TFM__SITE_RESIDUAL + (uint64_t)s),
                            (uint64_t)(opts->batch_offset * T * C), 0);
        if (d->norm_first && s + 1 < blk->n_sub) { /* x_{s+1} and the next sub-layer's u in one pass */
            tfm_layernorm *nx = &blk->norm[s + 1];
            tfm__op_add_layernorm(blk->device, out, blk->ln_io[s + 1], nx->mean, nx->rstd, xs, v, vbf, nx->weight.data,
                                  nx->bias.data, d->ln_eps, N, C, nx->rms, blk->bf_u);
        } else if (d->norm_first && after) { /* y and the next norm's output */
            tfm__op_add_layernorm(blk->device, out, after->out, after->ln->mean, after->ln->rstd, xs, v, vbf,
                                  after->ln->weight.data, after->ln->bias.data, after->eps, N, C, after->ln->rms, after->bf);
        } else if (d->norm_first) {
            tfm__op_add(blk->device, out, xs, v, N * C);
        } else {
            tfm__op_add_layernorm(blk->device, blk->ln_io[s], out, ln->mean, ln->rstd, xs, v, vbf, ln->weight.data,
                                  ln->bias.data, d->ln_eps, N, C, ln->rms, 0);
        }
        if (s + 1 < blk->n_sub) blk->stream[s + 1] = out;
    }
}

/* Walks the sub-layers backwards with two stream-gradient buffers (d_a, d_b). dx = dx_beta * dx + the
   input gradient; with dx_beta 0 the first sub-layer writes it in place (dx must not be dy). The residual
   paths are added inside the layernorm's backward pass and the sub-layers write (not add into) d_u. */
static void tfm__block_bwd(tfm_block *blk, float *dx, float dx_beta, float *dxkv, const float *dy) {
    const tfm_block_desc *d = &blk->desc;
    int64_t N = (int64_t)blk->B * blk->T, C = d->d_model;
    const float *g = dy;
    float *bufs[2];
    int s, which = 0;
    bufs[0] = blk->d_a;
    bufs[1] = blk->d_b;
    for (s = blk->n_sub - 1; s >= 0; s--) {
        float *dprev = s == 0 && dx && dx_beta == 0.0f ? dx : bufs[which];
        const float *dv;
        tfm_layernorm *ln = &blk->norm[s];
        int drop = blk->opts.training && d->dropout > 0.0f;
        uint64_t seed = tfm__seed_mix(blk->opts.seed, TFM__SITE_RESIDUAL + (uint64_t)s);
        uint64_t i0 = (uint64_t)(blk->opts.batch_offset * blk->T * C);
        which ^= 1;
        if (d->norm_first) {
            dv = g;
            if (drop) {
                tfm__op_dropout(blk->device, blk->sub_out, g, N * C, d->dropout, seed, i0, 0);
                dv = blk->sub_out;
            }
            tfm__block_sub_bwd(blk, s, blk->d_u, 0.0f, dv, dxkv);
            /* dprev = g (residual) + LN's gradient */
            tfm__op_layernorm_bwd(blk->device, dprev, g, ln->d_weight.data, ln->d_bias.data, blk->d_u, blk->stream[s], ln->weight.data, ln->mean, ln->rstd, N, C, ln->rms);
        } else {
            tfm__op_layernorm_bwd(blk->device, blk->d_u, NULL, ln->d_weight.data, ln->d_bias.data, g, blk->ln_io[s], ln->weight.data, ln->mean, ln->rstd, N, C, ln->rms);
            tfm__op_copy(blk->device, dprev, blk->d_u, N * C); /* residual */
            dv = blk->d_u;
            if (drop) {
                tfm__op_dropout(blk->device, blk->sub_out, blk->d_u, N * C, d->dropout, seed, i0, 0);
                dv = blk->sub_out;
            }
            tfm__block_sub_bwd(blk, s, dprev, 1.0f, dv, dxkv);
        }
        g = dprev;
    }
    if (dx && dx_beta != 0.0f) tfm__op_add(blk->device, dx, dx, g, N * C);
}

TFMDEF tfm_result tfm_block_forward(tfm_block *blk, tfm_tensor *y, const tfm_tensor *x, const tfm_tensor *xkv,
                                    const tfm_attn_opts *opts) {
    const char *fn = "tfm_block_forward";
    const tfm_block_desc *d;
    tfm_attn_opts o;
    int64_t B, T, Tk;
    if (!blk) return tfm__fail(TFM_E_ARG, "%s: block is NULL", fn);
    d = &blk->desc;
    if (!blk->ff_act || !blk->sub_out || !blk->linear1.weight.data)
        return tfm__fail(TFM_E_ARG, "%s: the block has no memory (run tfm_block_init after tfm_mem_alloc)", fn);
    TFM__TRY(tfm__chk(fn, "y", y));
    TFM__TRY(tfm__chk(fn, "x", x));
    TFM__TRY(tfm__chk_opt(fn, "xkv", xkv));
    TFM__TRY(tfm__same_device(fn, (int)blk->device, 3, y, x, xkv));
    if (x->ndim != 3 || x->shape[2] != d->d_model)
        return tfm__fail(TFM_E_SHAPE, "%s: x is %s, want (B,T,%d)", fn, tfm__shp(x), d->d_model);
    B = x->shape[0];
    T = x->shape[1];
    if (B > d->max_batch || T > d->max_len)
        return tfm__fail(TFM_E_SHAPE, "%s: x is %s but the block was sized for batch %d and length %d", fn, tfm__shp(x),
                         d->max_batch, d->max_len);
    TFM__TRY(tfm__chk_same(fn, "x", x, "y", y));
    if (!d->cross && xkv) return tfm__fail(TFM_E_ARG, "%s: xkv given to a block without cross-attention", fn);
    if (d->cross && !xkv) return tfm__fail(TFM_E_ARG, "%s: a block with cross-attention needs xkv", fn);
    Tk = T;
    if (xkv) {
        if (xkv->ndim != 3 || xkv->shape[0] != B || xkv->shape[2] != d->d_model)
            return tfm__fail(TFM_E_SHAPE, "%s: x is %s but xkv is %s: want (%lld,Tk,%d)", fn, tfm__shp(x), tfm__shp(xkv),
                             (long long)B, d->d_model);
        Tk = xkv->shape[1];
        if (Tk > d->max_kv_len)
            return tfm__fail(TFM_E_SHAPE, "%s: xkv is %s but the block was sized for length %d", fn, tfm__shp(xkv),
                             d->max_kv_len);
    }
    if (y->data == x->data || (xkv && y->data == xkv->data))
        return tfm__fail(TFM_E_ARG, "%s: y must not alias x or xkv (backward reads them)", fn);
    memset(&o, 0, sizeof o);
    if (opts) o = *opts;
    TFM__TRY(tfm__chk_attn_opts(fn, &o, B, T, T));
    TFM__TRY(tfm__chk_layer_window(fn, "desc.", d->attn_window, d->attn_sinks, &o));
    TFM__TRY(tfm__chk_lens(fn, "opts.kv_lens", o.kv_lens, B, Tk));
    if (o.kv_lens && !d->cross) return tfm__fail(TFM_E_ARG, "%s: opts.kv_lens given to a block without cross-attention", fn);
    if (o.dropout != 0.0f || o.dropout_seed != 0 || o.scale != 0.0f)
        return tfm__fail(TFM_E_ARG, "%s: opts.dropout, dropout_seed and scale are attention options; a block takes its "
                         "rates from its desc and its masks from opts.seed", fn);
    if (o.n_kv_heads && o.n_kv_heads != d->n_kv_heads)
        return tfm__fail(TFM_E_ARG, "%s: opts.n_kv_heads %d differs from the block's desc.n_kv_heads %d", fn, o.n_kv_heads,
                         d->n_kv_heads);
    o.training = o.training != 0;
    if (o.training && (d->dropout > 0.0f || d->attn_dropout > 0.0f) && !blk->has_grad)
        return tfm__fail(TFM_E_ARG, "%s: dropout while training needs a block built with gradients", fn);
    TFM__TRY(tfm__scratch_reserve(fn));
    tfm__block_fwd(blk, y->data, x->data, xkv ? xkv->data : NULL, (int)B, (int)T, (int)Tk, &o, NULL, 0, 0, NULL);
    return tfm__scratch_check(fn);
}

TFMDEF tfm_result tfm_block_backward(tfm_block *blk, tfm_tensor *dx, tfm_tensor *dxkv, const tfm_tensor *dy) {
    const char *fn = "tfm_block_backward";
    int64_t B, T, C;
    if (!blk) return tfm__fail(TFM_E_ARG, "%s: block is NULL", fn);
    if (!blk->has_grad || !blk->d_a) return tfm__fail(TFM_E_ARG, "%s: the block has no gradient memory", fn);
    if (!blk->B) return tfm__fail(TFM_E_ARG, "%s: no forward pass to go back through", fn);
    TFM__TRY(tfm__chk(fn, "dy", dy));
    TFM__TRY(tfm__chk_opt(fn, "dx", dx));
    TFM__TRY(tfm__chk_opt(fn, "dxkv", dxkv));
    TFM__TRY(tfm__same_device(fn, (int)blk->device, 3, dy, dx, dxkv));
    B = blk->B;
    T = blk->T;
    C = blk->desc.d_model;
    if (dy->ndim != 3 || dy->shape[0] != B || dy->shape[1] != T || dy->shape[2] != C)
        return tfm__fail(TFM_E_SHAPE, "%s: dy is %s but the last forward made (%lld,%lld,%lld)", fn, tfm__shp(dy),
                         (long long)B, (long long)T, (long long)C);
    TFM__TRY(tfm__chk_same(fn, "dy", dy, "dx", dx));
    if (dxkv && !blk->desc.cross) return tfm__fail(TFM_E_ARG, "%s: dxkv given to a block without cross-attention", fn);
    if (dxkv && (dxkv->ndim != 3 || dxkv->shape[0] != B || dxkv->shape[1] != blk->Tk || dxkv->shape[2] != C))
        return tfm__fail(TFM_E_SHAPE, "%s: dxkv is %s but the last forward's xkv was (%lld,%d,%lld)", fn, tfm__shp(dxkv),
                         (long long)B, blk->Tk, (long long)C);
    TFM__TRY(tfm__scratch_reserve(fn));
    tfm__block_bwd(blk, dx ? dx->data : NULL, 1.0f, dxkv ? dxkv->data : NULL, dy->data);
    return tfm__scratch_check(fn);
}

/* ==== >>impl-model ==== models: config, one memory block, embeddings, the stacks, forward and backward */

/* A model's internals, carved at the start of its activations region. The memory block is
   params | grads | adam_m | adam_v | acts | scratch; grads mirror params offset for offset, so the flat
   buffers of tfm_model_flat share one indexing, and the two AdamW moments hold the flat floats
   [mom_lo, mom_hi): all of them, or with cfg.moment_shards one share. */
struct tfm__model_impl {
    unsigned char *mem_base;        /* the whole block (64-byte aligned) */
    unsigned char *dev_mem;         /* a CUDA model: the block's device twin, whose byte k is the host block's byte
                                       off_params + k; every float the model computes with lives there */
    size_t dev_size;                /* its bytes */
    size_t off_params, off_grads, n_param_bytes;
    float *mom_m, *mom_v;           /* the moments of flat floats mom_lo.. (exp_avg, exp_avg_sq) */
    int64_t mom_lo, mom_hi;
    /* embeddings and head; the gradients have data NULL when inference_only */
    tfm_tensor src_emb, d_src_emb;  /* (V,C) tok_emb (classifier, LM) or src_tok_emb (enc-dec) */
    tfm_tensor tgt_emb, d_tgt_emb;  /* enc-dec: (Vt,C) tgt_tok_emb (aliases src_emb when shared) */
    tfm_tensor pos_emb, d_pos_emb;  /* (P,C) learned positions, or the sinusoidal table */
    tfm_tensor tgt_pos_emb, d_tgt_pos_emb;
    tfm_block *enc, *dec;           /* layer arrays (in acts) */
    int n_enc, n_dec;
    tfm_layernorm enc_norm, dec_norm; /* pre-LN final norms */
    tfm_linear head;                /* classifier (n_classes,C) or output (V,C); weight aliases an embedding when tied */
    tfm_linear input_proj;          /* input_dim: (C, input_dim) */
    tfm_tensor cls, d_cls;          /* cls_token: (C) */
    tfm_tensor type_emb, d_type_emb; /* type_vocab_size: (type_vocab_size, C) */
    tfm_layernorm emb_norm;         /* emb_norm: over the embedding sum */
    float *emb_sum, *type_x;        /* emb_norm: the sum before the norm (B,Te,C); types: their rows (B,T,C) */
    int32_t *type_ids;              /* types: the batch's token types (NULL in the batch: none copied) */
    float *inputs;                  /* input_dim: the batch's inputs, packed (B,T,input_dim) */
    /* activations: embedded inputs, per-layer outputs, final norms, pooling, logits */
    float *enc_x, *dec_x, *enc_buf, *dec_buf, *enc_ln, *dec_ln, *pooled, *logits, *lse;
    int32_t *lens, *targets, *ids, *tgt_ids; /* copies of the batch's lengths, targets and ids */
    /* backward scratch */
    float *d_enc_x, *d_enc_y, *d_dec_x, *d_dec_y, *d_pooled, *d_logits;
    tfm_adamw_param *adam;          /* AdamW's list: each parameter's value, grad and moments (moments
                                       NULL when sharded: then the list serves the gradient norm only) */
    tfm_adamw_param *share;         /* sharded moments: the parts of parameters in [mom_lo, mom_hi) */
    int n_share;
    /* the last forward */
    const float *memory, *top;      /* the encoder's output (enc-dec) and the top stack's output */
    const int32_t *tokens, *tgt_in; /* its inputs (read by backward) */
    int B, T, Tt, has_lens, has_types, has_targets, gen_replaced;
    int xent_done;                  /* its loss's pass wrote d_logits for a loss scale of 1 (tfm__model_forward) */
    int logits_bf;                  /* its logits are bf16 rows of tfm__bf16_ld (a bf16 training step's) */
    int warm;                       /* a forward pass or training step ran: the next may be a CUDA graph */
    float last_loss;
    uint64_t fwd_seed;
    /* state */
    int training, has_grad;
    tfm_rng rng;                    /* draws each training forward's dropout seed */
    int64_t batch_offset;           /* this process's first row in a data-parallel global batch */
    tfm_device device;
    void *owned;                    /* memory the library allocated */
    /* tfm_dist_backward: called by backward as each layer's gradients are done, with the lowest gradient
       address that is final now (every gradient at or past it: the flat layout puts the layers after the
       embeddings and each stack's blocks in order, and backward runs from the top); grads_mean: the
       gradients are the group's mean since (cleared by anything that changes them) */
    void (*on_grads)(void *ctx, const float *lo);
    void *on_grads_ctx;
    int grads_mean;
};
typedef struct tfm__model_impl tfm__model_impl;


static tfm_result tfm__config_resolve(const char *fn, const tfm_config *cfg, tfm_config *out) {
    tfm_config c;
    double big;
    if (!cfg || !out) return tfm__fail(TFM_E_ARG, "%s: cfg or out is NULL", fn);
    c = *cfg;
    if (c.kind != TFM_MODEL_ENCODER_CLASSIFIER && c.kind != TFM_MODEL_DECODER_LM && c.kind != TFM_MODEL_ENCODER_DECODER)
        return tfm__fail(TFM_E_ARG, "%s: cfg.kind is %d: required (TFM_MODEL_ENCODER_CLASSIFIER, TFM_MODEL_DECODER_LM or TFM_MODEL_ENCODER_DECODER)",
                         fn, (int)c.kind);
    if (c.input_dim < 0 || c.vocab_size < 0)
        return tfm__fail(TFM_E_ARG, "%s: cfg.input_dim %d and cfg.vocab_size %d must be >= 0", fn, c.input_dim, c.vocab_size);
    if (c.vocab_size == 0 && !(c.input_dim > 0 && (c.kind == TFM_MODEL_ENCODER_CLASSIFIER ||
                                                   (c.kind == TFM_MODEL_ENCODER_DECODER && c.tgt_vocab_size > 0))))
        return tfm__fail(TFM_E_ARG, "%s: cfg.vocab_size is 0: required, > 0 (only a classifier, or an encoder-decoder "
                         "with tgt_vocab_size, with input_dim needs none)", fn);
    if (c.cls_token && c.kind != TFM_MODEL_ENCODER_CLASSIFIER)
        return tfm__fail(TFM_E_ARG, "%s: cfg.cls_token is for classifiers", fn);
    if (c.type_vocab_size < 0 || (c.type_vocab_size && (c.kind == TFM_MODEL_ENCODER_DECODER || c.input_dim || c.cls_token)))
        return tfm__fail(TFM_E_ARG, "%s: cfg.type_vocab_size %d: want >= 0, and a token type needs a classifier or LM "
                         "of tokens (no input_dim, no cls_token)", fn, c.type_vocab_size);
    if (c.emb_norm && c.kind == TFM_MODEL_ENCODER_DECODER)
        return tfm__fail(TFM_E_ARG, "%s: cfg.emb_norm is for classifiers and LMs", fn);
    c.emb_norm = c.emb_norm != 0;
    if (c.input_dim > 0 && (c.share_emb || (c.tie_output && c.kind == TFM_MODEL_DECODER_LM)))
        return tfm__fail(TFM_E_ARG, "%s: cfg.input_dim: the input has no token embedding to share or tie", fn);
    c.cls_token = c.cls_token != 0;
    if (c.d_model <= 0) return tfm__fail(TFM_E_ARG, "%s: cfg.d_model is %d: required, > 0", fn, c.d_model);
    if (c.n_heads <= 0) return tfm__fail(TFM_E_ARG, "%s: cfg.n_heads is %d: required, > 0", fn, c.n_heads);
    if (c.d_model % c.n_heads)
        return tfm__fail(TFM_E_ARG, "%s: cfg.n_heads %d does not divide cfg.d_model %d", fn, c.n_heads, c.d_model);
    if (c.max_len <= 0) return tfm__fail(TFM_E_ARG, "%s: cfg.max_len is %d: required, > 0", fn, c.max_len);
    if (c.kind == TFM_MODEL_ENCODER_CLASSIFIER && c.n_classes <= 0)
        return tfm__fail(TFM_E_ARG, "%s: cfg.n_classes is %d: required for a classifier, > 0", fn, c.n_classes);
    if (c.tgt_vocab_size < 0 || c.n_layers < 0 || c.n_dec_layers < 0 || c.d_ff < 0 || c.max_tgt_len < 0 ||
        c.max_batch < 0 || c.n_classes < 0)
        return tfm__fail(TFM_E_ARG, "%s: a size field of cfg is negative (tgt_vocab_size %d, n_layers %d, n_dec_layers %d, d_ff %d, "
                         "max_tgt_len %d, max_batch %d, n_classes %d)", fn, c.tgt_vocab_size, c.n_layers, c.n_dec_layers,
                         c.d_ff, c.max_tgt_len, c.max_batch, c.n_classes);
    if ((int)c.act < 0 || (int)c.act > 3) return tfm__fail(TFM_E_ARG, "%s: cfg.act %d is not a tfm_activation", fn, (int)c.act);
    if ((int)c.pos < 0 || (int)c.pos > 3) return tfm__fail(TFM_E_ARG, "%s: cfg.pos %d is not a tfm_pos_kind", fn, (int)c.pos);
    if ((int)c.pool < 0 || (int)c.pool > 1) return tfm__fail(TFM_E_ARG, "%s: cfg.pool %d is not a tfm_pool_kind", fn, (int)c.pool);
    if ((int)c.init < 0 || (int)c.init > 1) return tfm__fail(TFM_E_ARG, "%s: cfg.init %d is not a tfm_init_kind", fn, (int)c.init);
    if (c.device != TFM_DEVICE_CPU && c.device != TFM_DEVICE_CUDA)
        return tfm__fail(TFM_E_ARG, "%s: cfg.device %d is not a tfm_device", fn, (int)c.device);
    if ((int)c.precision < 0 || (int)c.precision > 2)
        return tfm__fail(TFM_E_ARG, "%s: cfg.precision %d is not a tfm_precision", fn, (int)c.precision);
    if (c.precision != TFM_PREC_FP32 && c.device != TFM_DEVICE_CUDA)
        return tfm__fail(TFM_E_ARG, "%s: cfg.precision %s runs on the GPU only (cfg.device TFM_DEVICE_CUDA); the CPU "
                         "computes in fp32 (TFM_PREC_FP32): checkpoints are fp32 and load into either", fn,
                         c.precision == TFM_PREC_TF32 ? "TFM_PREC_TF32" : "TFM_PREC_BF16");
    if (c.device == TFM_DEVICE_CUDA && c.d_model / c.n_heads > 2048)
        return tfm__fail(TFM_E_ARG, "%s: cfg.d_model / cfg.n_heads is %d: the CUDA attention takes heads of at most 2048 "
                         "channels", fn, c.d_model / c.n_heads);
    if (!(c.dropout >= 0.0f && c.dropout < 1.0f) || !(c.attn_dropout >= 0.0f && c.attn_dropout < 1.0f))
        return tfm__fail(TFM_E_ARG, "%s: cfg.dropout %g and cfg.attn_dropout %g must be in [0,1)", fn, (double)c.dropout,
                         (double)c.attn_dropout);
    if (!(c.label_smoothing >= 0.0f && c.label_smoothing <= 1.0f))
        return tfm__fail(TFM_E_ARG, "%s: cfg.label_smoothing %g is outside [0,1]", fn, (double)c.label_smoothing);
    if (!(c.ln_eps >= 0.0f) || !isfinite(c.ln_eps) || !(c.init_std >= 0.0f) || !isfinite(c.init_std))
        return tfm__fail(TFM_E_ARG, "%s: cfg.ln_eps %g and cfg.init_std %g must be finite and >= 0", fn, (double)c.ln_eps,
                         (double)c.init_std);
    if ((int)c.norm < 0 || (int)c.norm > 1) return tfm__fail(TFM_E_ARG, "%s: cfg.norm %d is not a tfm_norm_kind", fn, (int)c.norm);
    if (c.pos != TFM_POS_ROPE && (c.rope_dims || c.rope_base != 0.0f))
        return tfm__fail(TFM_E_ARG, "%s: cfg.rope_dims %d and cfg.rope_base %g are for cfg.pos TFM_POS_ROPE", fn, c.rope_dims,
                         (double)c.rope_base);
    if (c.pos == TFM_POS_ROPE) {
        if (c.rope_dims < 0) return tfm__fail(TFM_E_ARG, "%s: cfg.rope_dims %d must be >= 0", fn, c.rope_dims);
        if (c.rope_dims == 0) c.rope_dims = c.d_model / c.n_heads;
        TFM__TRY(tfm__rope_fields(fn, "cfg.", c.rope_dims, &c.rope_base, c.d_model / c.n_heads));
    }
    TFM__TRY(tfm__kv_heads_field(fn, "cfg.", c.n_kv_heads, c.n_heads));
    if (c.n_kv_heads == c.n_heads) c.n_kv_heads = 0; /* one key/value head per query head: the plain model */
    TFM__TRY(tfm__window_fields(fn, "cfg.attn_window", "cfg.attn_sinks", c.attn_window, c.attn_sinks));
    if (c.attn_window && c.kind == TFM_MODEL_ENCODER_CLASSIFIER)
        return tfm__fail(TFM_E_ARG, "%s: cfg.attn_window %d: a sliding window is for causal self-attention (an LM's, or an "
                         "encoder-decoder's decoder), not a classifier's encoder", fn, c.attn_window);
    if (c.tie_output && c.kind == TFM_MODEL_ENCODER_CLASSIFIER)
        return tfm__fail(TFM_E_ARG, "%s: cfg.tie_output needs an LM or encoder-decoder (a classifier's head is not a vocabulary)", fn);
    if (c.share_emb && c.kind != TFM_MODEL_ENCODER_DECODER)
        return tfm__fail(TFM_E_ARG, "%s: cfg.share_emb is for encoder-decoders", fn);
    if (c.n_layers == 0) c.n_layers = 2;
    if (c.n_dec_layers == 0) c.n_dec_layers = c.n_layers;
    if (c.d_ff == 0) c.d_ff = 4 * c.d_model;
    if (c.max_batch == 0) c.max_batch = 1;
    if (c.ln_eps == 0.0f) c.ln_eps = 1e-5f;
    if (c.init_std == 0.0f) c.init_std = 0.02f;
    if (!c.has_ignore_index) c.ignore_index = -100;
    c.has_ignore_index = 1;
    if (c.kind == TFM_MODEL_ENCODER_DECODER) {
        if (c.tgt_vocab_size == 0) c.tgt_vocab_size = c.vocab_size;
        if (c.max_tgt_len == 0) c.max_tgt_len = c.max_len;
        if (c.share_emb && c.tgt_vocab_size != c.vocab_size)
            return tfm__fail(TFM_E_ARG, "%s: cfg.share_emb needs equal vocabularies, got %d and %d", fn, c.vocab_size,
                             c.tgt_vocab_size);
    } else {
        c.tgt_vocab_size = 0;
        c.max_tgt_len = 0;
        c.n_dec_layers = c.kind == TFM_MODEL_DECODER_LM ? c.n_layers : 0;
    }
    if (c.kind != TFM_MODEL_ENCODER_CLASSIFIER) c.n_classes = 0;
    if (c.last_logits && (!c.inference_only || c.kind == TFM_MODEL_ENCODER_CLASSIFIER))
        return tfm__fail(TFM_E_ARG, "%s: cfg.last_logits is for inference_only LMs and encoder-decoders (a model that "
                         "trains needs every position's logits; a classifier has one row per sequence)", fn);
    c.last_logits = c.last_logits != 0;
    if (c.moment_shards < 0 || c.moment_shard < 0 || c.moment_shard >= TFM__MAX(c.moment_shards, 1) ||
        (c.moment_shards > 1 && c.inference_only))
        return tfm__fail(TFM_E_ARG, "%s: cfg.moment_shards %d and cfg.moment_shard %d: want 0 <= moment_shard < "
                         "moment_shards, and a model that trains (not inference_only) to shard", fn, c.moment_shards,
                         c.moment_shard);
    if (c.moment_shards <= 1) c.moment_shards = 1;
    big = (double)c.max_batch * TFM__MAX(c.max_len, c.max_tgt_len);
    if (big * TFM__MAX(c.d_ff, c.d_model) > 2147483647.0 ||
        big * TFM__MAX(c.vocab_size, c.tgt_vocab_size) > 2147483647.0 ||
        (double)c.vocab_size * c.d_model > 2147483647.0 || (double)c.tgt_vocab_size * c.d_model > 2147483647.0 ||
        big * c.n_heads * TFM__MAX(c.max_len, c.max_tgt_len) > 2147483647.0)
        return tfm__fail(TFM_E_ARG, "%s: max_batch %d x sequence length %d with d_model %d, d_ff %d, vocabulary %d: a buffer "
                         "would exceed 2^31 elements", fn, c.max_batch, TFM__MAX(c.max_len, c.max_tgt_len), c.d_model,
                         c.d_ff, TFM__MAX(c.vocab_size, c.tgt_vocab_size));
    *out = c;
    return TFM_OK;
}

TFMDEF tfm_result tfm_config_resolve(const tfm_config *cfg, tfm_config *out) {
    return tfm__config_resolve("tfm_config_resolve", cfg, out);
}

/* A CUDA model's device address of host block address p, and back; a CPU model's p itself. The host block
   holds the layers' structs and the batch's integers, and is the staging place of the device's floats. */
static void *tfm__model_dev(const tfm__model_impl *im, const void *p) {
    const unsigned char *h0 = im->mem_base + im->off_params, *q = (const unsigned char *)p;
    return im->dev_mem && q >= h0 && q < h0 + im->dev_size ? im->dev_mem + (q - h0) : (void *)p;
}
static void *tfm__model_host(const tfm__model_impl *im, const void *p) {
    const unsigned char *q = (const unsigned char *)p;
    return im->dev_mem && q >= im->dev_mem && q < im->dev_mem + im->dev_size ? im->mem_base + im->off_params + (q - im->dev_mem)
                                                                             : (void *)p;
}
/* n floats of the device twin at device address p to (down) or from its host staging place (nothing for a
   CPU model, or for p outside the twin). */
static void tfm__model_stage(const tfm__model_impl *im, const float *p, int64_t n, int down) {
    float *h = (float *)tfm__model_host(im, p);
    if (!im->dev_mem || h == p) return;
    if (down) tfm__op_transfer(TFM_DEVICE_CPU, h, TFM_DEVICE_CUDA, p, n);
    else tfm__op_transfer(TFM_DEVICE_CUDA, (float *)p, TFM_DEVICE_CPU, h, n);
}
/* A CUDA model's parameters (and, with moments, the AdamW moments it holds) to their host staging places
   (down) or back. */
static void tfm__model_stage_state(const tfm__model_impl *im, int moments, int down) {
    int64_t nm = im->mom_hi - im->mom_lo;
    tfm__model_stage(im, (const float *)(void *)im->dev_mem, (int64_t)(im->n_param_bytes / sizeof(float)), down);
    if (moments && im->has_grad) {
        tfm__model_stage(im, im->mom_m, nm, down);
        tfm__model_stage(im, im->mom_v, nm, down);
    }
}

/* Record a parameter (and, in a real build, initialise it). Counting builds only count. */
static void tfm__reg(tfm_model *m, tfm_rng *rng, const tfm_tensor *value, const tfm_tensor *grad, int init, int decay,
                     const char *fmt, ...) {
    va_list ap;
    tfm_param *p;
    tfm_tensor hv;
    if (!value->data && m->params) return; /* an optional parameter that is absent (no bias) */
    if (!m->params) {
        if (value->ndim) m->n_params++;
        return;
    }
    p = &m->params[m->n_params++];
    memset(p, 0, sizeof *p);
    va_start(ap, fmt);
    vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    p->value = *value;
    hv = *value; /* initialised on the host (a CUDA model's block is copied to the device after the build) */
    hv.data = (float *)tfm__model_host(m->impl, value->data);
    hv.device = TFM_DEVICE_CPU;
    p->offset = (int64_t)((unsigned char *)hv.data - (m->impl->mem_base + m->impl->off_params)) / (int64_t)sizeof(float);
    if (grad) p->grad = *grad;
    p->decay = decay;
    m->n_weights += tfm_numel(value);
    switch (init) {
    case TFM__INIT_ZERO: tfm_fill(&hv, 0.0f); break;
    case TFM__INIT_ONE: tfm_fill(&hv, 1.0f); break;
    case TFM__INIT_EMB:
        tfm_fill_normal(&hv, rng, 0.0f, m->cfg.init == TFM_INIT_XAVIER ? 1.0f / sqrtf((float)m->cfg.d_model) : m->cfg.init_std);
        break;
    default:
        if (m->cfg.init == TFM_INIT_XAVIER) {
            float bound = sqrtf(6.0f / (float)(value->shape[0] + value->shape[1]));
            tfm_fill_uniform(&hv, rng, -bound, bound);
        } else {
            tfm_fill_normal(&hv, rng, 0.0f, m->cfg.init_std);
        }
    }
}

static void tfm__reg_linear(tfm_model *m, tfm_rng *rng, tfm_linear *l, const char *pre, const char *name) {
    tfm__reg(m, rng, &l->weight, &l->d_weight, TFM__INIT_MATRIX, 1, "%s%s.weight", pre, name);
    tfm__reg(m, rng, &l->bias, &l->d_bias, TFM__INIT_ZERO, 0, "%s%s.bias", pre, name);
}

static void tfm__reg_norm(tfm_model *m, tfm_rng *rng, tfm_layernorm *n, const char *pre, const char *name) {
    tfm__reg(m, rng, &n->weight, &n->d_weight, TFM__INIT_ONE, 0, "%s%s.weight", pre, name);
    tfm__reg(m, rng, &n->bias, &n->d_bias, TFM__INIT_ZERO, 0, "%s%s.bias", pre, name);
}


/* How many layer outputs a stack of n layers keeps: all of them for backward, else two in turn. */
static int tfm__stack_bufs(int n, int grad) { return grad || n < 2 ? n : 2; }

/* A stack of n layers named "<prefix>.layers.<i>.", and the outputs of its layers in *outbuf: one
   (max_batch, max_len, C) buffer per layer for backward, or (no_grad) two that alternate. Without
   gradients nothing a layer saves is read after the layer returns, so every layer of the stack carves
   its activations over the same bytes: a stack's activations are one layer's, whatever its depth. */
static tfm_result tfm__build_stack(tfm_model *m, tfm_rng *rng, tfm_mem *mem, tfm_block **out, float **outbuf, int n,
                                   const tfm_block_desc *d, const char *prefix) {
    tfm_block tmp, *blks;
    int i;
    size_t BTC = (size_t)d->max_batch * d->max_len * d->d_model;
    blks = (tfm_block *)tfm_arena_alloc(&mem->acts, (size_t)n * sizeof(tfm_block));
    *out = blks;
    *outbuf = tfm__carve(&mem->acts, (size_t)tfm__stack_bufs(n, !mem->no_grad) * BTC);
    for (i = 0; i < n; i++) {
        tfm_block *b = blks ? &blks[i] : &tmp;
        char pre[48];
        size_t mark = mem->acts.used;
        TFM__TRY(tfm_block_init(b, d, mem));
        if (mem->no_grad && i + 1 < n) mem->acts.used = mark; /* the next layer reuses these activations */
        snprintf(pre, sizeof pre, "%s.layers.%d.", prefix, i);
        tfm__named e[TFM__MAX_NAMED];
        int k, ne = tfm__block_named(b, e);
        for (k = 0; k < ne; k++) tfm__reg(m, rng, e[k].value, e[k].grad, e[k].init, e[k].decay, "%s%s%s", pre, e[k].part, e[k].name);
    }
    return TFM_OK;
}

static tfm_tensor tfm__carve_t2(tfm_arena *a, int64_t d0, int64_t d1) {
    int64_t sh[2];
    sh[0] = d0;
    sh[1] = d1;
    return tfm_arena_tensor(a, 2, sh);
}

/* Carve (or count) every buffer of a model whose cfg is resolved. m->params NULL: counting. */
static tfm_result tfm__model_build(tfm_model *m, tfm_mem *mem, tfm_rng *rng) {
    const tfm_config *c = &m->cfg;
    int64_t C = c->d_model, B = c->max_batch, T = c->max_len, Tt = c->max_tgt_len, V = c->vocab_size;
    int64_t Te = T + c->cls_token, Vt = c->tgt_vocab_size, Tm = TFM__MAX(Te, Tt); /* Te: the encoder's positions */
    int kind = c->kind, grad = !mem->no_grad, enc = kind != TFM_MODEL_DECODER_LM, encdec = kind == TFM_MODEL_ENCODER_DECODER;
    int64_t rows_out = kind == TFM_MODEL_ENCODER_CLASSIFIER || c->last_logits ? B : encdec ? B * Tt : B * T;
    int64_t n_out = kind == TFM_MODEL_ENCODER_CLASSIFIER ? c->n_classes : encdec ? Vt : V;
    tfm_block_desc d;
    size_t mark;
    const char *emb_name = encdec ? "src_tok_emb" : "tok_emb";

    m->n_params = 0;
    m->n_weights = 0;
    /* scratch the model needs during backward, carved before the layers' (which they share) */
    mark = mem->scratch.used;
    if (grad) {
        m->impl->d_logits = tfm__carve(&mem->scratch, (size_t)(rows_out * n_out));
        m->impl->d_pooled = tfm__carve(&mem->scratch, (size_t)(B * C));
        m->impl->d_enc_x = tfm__carve(&mem->scratch, (size_t)(B * Tm * C)); /* gradient at a stack's top */
        m->impl->d_enc_y = tfm__carve(&mem->scratch, (size_t)(B * Tm * C)); /* ping */
        m->impl->d_dec_x = tfm__carve(&mem->scratch, (size_t)(B * Tm * C)); /* pong */
        if (encdec) m->impl->d_dec_y = tfm__carve(&mem->scratch, (size_t)(B * Te * C)); /* gradient of the memory */
    }
    /* embeddings, or the projection of continuous inputs; the class vector */
    if (c->input_dim) {
        tfm__linear_carve(&m->impl->input_proj, C, c->input_dim, !c->no_bias, mem);
        tfm__reg_linear(m, rng, &m->impl->input_proj, "", "input_proj");
    } else {
        m->impl->src_emb = tfm__carve_t2(&mem->params, V, C);
        if (grad) m->impl->d_src_emb = tfm__carve_t2(&mem->grads, V, C);
        tfm__reg(m, rng, &m->impl->src_emb, &m->impl->d_src_emb, TFM__INIT_EMB, 0, "%s.weight", emb_name);
    }
    if (c->cls_token) {
        m->impl->cls = tfm_arena_tensor(&mem->params, 1, &C);
        if (grad) m->impl->d_cls = tfm_arena_tensor(&mem->grads, 1, &C);
        tfm__reg(m, rng, &m->impl->cls, &m->impl->d_cls, TFM__INIT_EMB, 0, "cls_token");
    }
    if (encdec) {
        if (c->share_emb) {
            m->impl->tgt_emb = m->impl->src_emb;
            m->impl->d_tgt_emb = m->impl->d_src_emb;
        } else {
            m->impl->tgt_emb = tfm__carve_t2(&mem->params, Vt, C);
            if (grad) m->impl->d_tgt_emb = tfm__carve_t2(&mem->grads, Vt, C);
            tfm__reg(m, rng, &m->impl->tgt_emb, &m->impl->d_tgt_emb, TFM__INIT_EMB, 0, "tgt_tok_emb.weight");
        }
    }
    if (c->type_vocab_size) {
        m->impl->type_emb = tfm__carve_t2(&mem->params, c->type_vocab_size, C);
        if (grad) m->impl->d_type_emb = tfm__carve_t2(&mem->grads, c->type_vocab_size, C);
        tfm__reg(m, rng, &m->impl->type_emb, &m->impl->d_type_emb, TFM__INIT_EMB, 0, "type_emb.weight");
    }
    memset(&m->impl->pos_emb, 0, sizeof m->impl->pos_emb);
    memset(&m->impl->tgt_pos_emb, 0, sizeof m->impl->tgt_pos_emb);
    if (c->pos == TFM_POS_LEARNED) {
        m->impl->pos_emb = tfm__carve_t2(&mem->params, Te, C);
        if (grad) m->impl->d_pos_emb = tfm__carve_t2(&mem->grads, Te, C);
        tfm__reg(m, rng, &m->impl->pos_emb, &m->impl->d_pos_emb, TFM__INIT_EMB, 0, "%s.weight", encdec ? "src_pos_emb" : "pos_emb");
        if (encdec) {
            m->impl->tgt_pos_emb = tfm__carve_t2(&mem->params, Tt, C);
            if (grad) m->impl->d_tgt_pos_emb = tfm__carve_t2(&mem->grads, Tt, C);
            tfm__reg(m, rng, &m->impl->tgt_pos_emb, &m->impl->d_tgt_pos_emb, TFM__INIT_EMB, 0, "tgt_pos_emb.weight");
        }
    } else if (c->pos == TFM_POS_SINUSOIDAL) {
        m->impl->pos_emb = tfm__carve_t2(&mem->acts, Tm, C); /* a fixed table, not a parameter */
        if (m->impl->pos_emb.data) tfm__op_sinusoid_add(m->impl->device, m->impl->pos_emb.data, NULL, 1, Tm, C);
        m->impl->tgt_pos_emb = m->impl->pos_emb;
    }
    if (c->emb_norm) {
        tfm__layernorm_carve(&m->impl->emb_norm, C, !c->no_bias, (size_t)(B * Te), mem, c->norm == TFM_NORM_RMS);
        tfm__reg_norm(m, rng, &m->impl->emb_norm, "", "emb_norm");
        m->impl->emb_sum = tfm__carve(&mem->acts, (size_t)(B * Te * C));
    }
    /* layers */
    memset(&d, 0, sizeof d);
    d.d_model = c->d_model;
    d.n_heads = c->n_heads;
    d.d_ff = c->d_ff;
    d.norm_first = c->norm_first;
    d.act = c->act;
    d.dropout = c->dropout;
    d.attn_dropout = c->attn_dropout;
    d.ln_eps = c->ln_eps;
    d.no_bias = c->no_bias;
    d.norm = c->norm;
    d.rope_dims = c->rope_dims;
    d.rope_base = c->rope_base;
    d.n_kv_heads = c->n_kv_heads;
    d.max_batch = c->max_batch;
    m->impl->n_enc = enc ? c->n_layers : 0;
    m->impl->n_dec = kind == TFM_MODEL_DECODER_LM ? c->n_layers : encdec ? c->n_dec_layers : 0;
    if (enc) {
        d.max_len = (int)Te;
        TFM__TRY(tfm__build_stack(m, rng, mem, &m->impl->enc, &m->impl->enc_buf, m->impl->n_enc, &d, "encoder"));
        if (c->norm_first) {
            tfm__layernorm_carve(&m->impl->enc_norm, C, !c->no_bias, (size_t)(B * Te), mem, c->norm == TFM_NORM_RMS);
            tfm__reg_norm(m, rng, &m->impl->enc_norm, "encoder.", "norm");
            m->impl->enc_ln = tfm__carve(&mem->acts, (size_t)(B * Te * C));
        }
    }
    if (m->impl->n_dec) {
        d.cross = encdec;
        d.attn_window = c->attn_window; /* causal self-attention: the decoder's only */
        d.attn_sinks = c->attn_sinks;
        d.max_len = (int)(encdec ? Tt : T);
        d.max_kv_len = (int)Te;
        TFM__TRY(tfm__build_stack(m, rng, mem, &m->impl->dec, &m->impl->dec_buf, m->impl->n_dec, &d, "decoder"));
        if (c->norm_first) {
            tfm__layernorm_carve(&m->impl->dec_norm, C, !c->no_bias, (size_t)(B * d.max_len), mem, c->norm == TFM_NORM_RMS);
            tfm__reg_norm(m, rng, &m->impl->dec_norm, "decoder.", "norm");
            m->impl->dec_ln = tfm__carve(&mem->acts, (size_t)(B * d.max_len * C));
        }
    }
    /* head */
    memset(&m->impl->head, 0, sizeof m->impl->head);
    if (c->tie_output) {
        m->impl->head.weight = encdec ? m->impl->tgt_emb : m->impl->src_emb;
        m->impl->head.d_weight = encdec ? m->impl->d_tgt_emb : m->impl->d_src_emb;
    } else {
        tfm__linear_carve(&m->impl->head, n_out, C, kind == TFM_MODEL_ENCODER_CLASSIFIER && !c->no_bias, mem);
        tfm__reg_linear(m, rng, &m->impl->head, "", "head");
    }
    /* activations */
    m->impl->enc_x = tfm__carve(&mem->acts, (size_t)(B * Te * C)); /* the embedded input (every kind) */
    if (c->input_dim) m->impl->inputs = tfm__carve(&mem->acts, (size_t)(B * T * c->input_dim));
    if (encdec) m->impl->dec_x = tfm__carve(&mem->acts, (size_t)(B * Tt * C));
    if (kind == TFM_MODEL_ENCODER_CLASSIFIER) m->impl->pooled = tfm__carve(&mem->acts, (size_t)(B * C));
    m->impl->logits = tfm__carve(&mem->acts, (size_t)(rows_out * n_out));
    m->impl->lse = tfm__carve(&mem->acts, (size_t)rows_out);
    m->impl->targets = (int32_t *)tfm_arena_alloc(&mem->acts, (size_t)rows_out * sizeof(int32_t));
    m->impl->ids = (int32_t *)tfm_arena_alloc(&mem->acts, (size_t)(B * T) * sizeof(int32_t));
    if (c->type_vocab_size) {
        m->impl->type_x = tfm__carve(&mem->acts, (size_t)(B * T * C));
        m->impl->type_ids = (int32_t *)tfm_arena_alloc(&mem->acts, (size_t)(B * T) * sizeof(int32_t));
    }
    if (encdec) m->impl->tgt_ids = (int32_t *)tfm_arena_alloc(&mem->acts, (size_t)(B * Tt) * sizeof(int32_t));
    m->impl->lens = (int32_t *)tfm_arena_alloc(&mem->acts, (size_t)B * sizeof(int32_t));
    mem->scratch.used = mark;
    return TFM_OK;
}

/* Lay out a model: the counting pass. sizes: params, grads, acts, scratch (bytes); *n_params. */
/* Lay out a model: the counting pass, on the stack (nothing is allocated). sizes: params, grads, acts,
   scratch (bytes); *n_params. The real pass carves in the same order: the internals and the registry
   first in acts, then whatever tfm__model_build carves. */
static tfm_result tfm__model_layout(const tfm_config *cfg, size_t sizes[4], int *n_params) {
    tfm_mem mem;
    tfm_model m;
    tfm__model_impl impl;
    memset(&mem, 0, sizeof mem);
    memset(&m, 0, sizeof m);
    memset(&impl, 0, sizeof impl);
    mem.no_grad = cfg->inference_only != 0;
    m.cfg = *cfg;
    m.impl = &impl;
    tfm_arena_alloc(&mem.acts, sizeof(tfm__model_impl));
    TFM__TRY(tfm__model_build(&m, &mem, NULL));
    tfm_arena_alloc(&mem.acts, (size_t)m.n_params * sizeof(tfm_param));
    if (!cfg->inference_only) tfm_arena_alloc(&mem.acts, (size_t)m.n_params * sizeof(tfm_adamw_param)); /* AdamW's list */
    if (!cfg->inference_only && cfg->moment_shards > 1) /* with sharded moments, the list of this share's parts */
        tfm_arena_alloc(&mem.acts, (size_t)m.n_params * sizeof(tfm_adamw_param));
    sizes[0] = mem.params.peak;
    sizes[1] = mem.grads.peak;
    sizes[2] = mem.acts.peak;
    sizes[3] = mem.scratch.peak;
    *n_params = m.n_params;
    return TFM_OK;
}

/* The flat floats [*lo, *hi) whose AdamW moments a model keeps (cfg.moment_shards), from the bytes of its
   parameters; and the bytes each of its two moment arrays takes. */
static size_t tfm__moment_range(const tfm_config *c, size_t param_bytes, int64_t *lo, int64_t *hi) {
    tfm__share((int64_t)(param_bytes / sizeof(float)), c->moment_shards, c->moment_shard, lo, hi);
    return ((size_t)(*hi - *lo) * sizeof(float) + TFM__ALIGN - 1) / TFM__ALIGN * TFM__ALIGN;
}

static size_t tfm__model_total(const tfm_config *c, const size_t sizes[4]) {
    /* params | grads | adam_m | adam_v | acts | scratch, each 64-byte aligned, plus slack to align the base */
    int64_t lo, hi;
    size_t mom = tfm__moment_range(c, sizes[0], &lo, &hi);
    return sizes[0] + (c->inference_only ? 0 : sizes[0] + 2 * mom) + sizes[2] + sizes[3] + TFM__ALIGN;
}

TFMDEF tfm_result tfm_model_memory_size(const tfm_config *cfg, size_t *bytes) {
    tfm_config c;
    size_t sizes[4];
    int n;
    if (!bytes) return tfm__fail(TFM_E_ARG, "tfm_model_memory_size: bytes is NULL");
    TFM__TRY(tfm__config_resolve("tfm_model_memory_size", cfg, &c));
    TFM__TRY(tfm__model_layout(&c, sizes, &n));
    *bytes = tfm__model_total(&c, sizes);
    return TFM_OK;
}

TFMDEF tfm_result tfm_model_init(tfm_model *m, const tfm_config *cfg, void *mem, size_t size) {
    const char *fn = "tfm_model_init";
    tfm_config c;
    size_t sizes[4], total, off, offs[4], mom;
    int64_t lo, hi;
    int n_params, train, i;
    tfm_mem am;
    unsigned char *base, *owned = NULL, *dev = NULL;
    tfm__model_impl *impl;
    tfm_rng rng;
    tfm_result r;
    if (!m) return tfm__fail(TFM_E_ARG, "%s: model is NULL", fn);
    TFM__TRY(tfm__config_resolve(fn, cfg, &c));
    TFM__TRY(tfm__model_layout(&c, sizes, &n_params));
    train = !c.inference_only;
    total = tfm__model_total(&c, sizes);
    mom = tfm__moment_range(&c, sizes[0], &lo, &hi);
    if (mem && size < total)
        return tfm__fail(TFM_E_NOMEM, "%s: %zu bytes given, the model needs %zu (tfm_model_memory_size)", fn, size, total);
    if (c.device == TFM_DEVICE_CUDA) TFM__TRY(tfm__dev_alloc(fn, (void **)&dev, total)); /* the block's device twin */
    if (mem) {
        base = (unsigned char *)mem;
    } else {
        base = owned = (unsigned char *)TFM_MALLOC(total, c.user);
        if (!base) {
            tfm__dev_free(dev);
            return tfm__fail(TFM_E_NOMEM, "%s: could not allocate %zu bytes", fn, total);
        }
    }
    off = (size_t)((TFM__ALIGN - ((uintptr_t)base & (TFM__ALIGN - 1))) & (TFM__ALIGN - 1));
    /* a CUDA model's host block is read for its parameters and moments (initialised here, staged for
       checkpoints) and for what tfm_arena_alloc carves (zeroed then); its activations live on the device,
       so their host bytes are never touched (no memory is committed for them) */
    memset(base, 0, dev ? off + sizes[0] + (train ? sizes[0] + 2 * mom : 0) : total);
#ifdef TFM__TESTING
    if (dev) memset(base + off + sizes[0] + (train ? sizes[0] + 2 * mom : 0), 0xFF, sizes[2] + sizes[3]); /* must not matter */
#endif
    memset(&am, 0, sizeof am);
    am.no_grad = !train;
    offs[0] = off; /* params, then (training) grads of the same size and the two moments of [lo, hi) */
    offs[1] = offs[2] = offs[3] = 0;
    off += sizes[0];
    if (train) {
        offs[1] = off;
        offs[2] = off + sizes[0];
        offs[3] = off + sizes[0] + mom;
        off += sizes[0] + 2 * mom;
    }
    tfm_arena_init(&am.params, base + offs[0], sizes[0]);
    if (train) tfm_arena_init(&am.grads, base + offs[1], sizes[1]);
    tfm_arena_init(&am.acts, base + off, sizes[2]);
    tfm_arena_init(&am.scratch, base + off + sizes[2], sizes[3]);
    if (dev) { /* the twin mirrors the block from its params on: tensors are carved there */
        tfm__op_zero(TFM_DEVICE_CUDA, (float *)(void *)dev, (int64_t)((total - offs[0]) / sizeof(float)));
        for (i = 0; i < 4; i++)
            if (tfm__mem_arena(&am, i)->base) tfm__mem_arena(&am, i)->dev = dev + (tfm__mem_arena(&am, i)->base - (base + offs[0]));
        am.device = TFM_DEVICE_CUDA;
    }
    memset(m, 0, sizeof *m);
    m->cfg = c;
    impl = m->impl = (tfm__model_impl *)tfm_arena_alloc(&am.acts, sizeof(tfm__model_impl));
    impl->mem_base = base;
    impl->dev_mem = dev;
    impl->dev_size = dev ? total - offs[0] : 0;
    impl->device = c.device;
    impl->off_params = offs[0];
    impl->off_grads = offs[1];
    impl->mom_m = train ? (float *)tfm__model_dev(impl, base + offs[2]) : NULL;
    impl->mom_v = train ? (float *)tfm__model_dev(impl, base + offs[3]) : NULL;
    impl->mom_lo = train ? lo : 0;
    impl->mom_hi = train ? hi : 0;
    impl->n_param_bytes = sizes[0];
    impl->owned = owned;
    m->params = (tfm_param *)tfm_arena_alloc(&am.acts, (size_t)n_params * sizeof(tfm_param));
    if (train) impl->adam = (tfm_adamw_param *)tfm_arena_alloc(&am.acts, (size_t)n_params * sizeof(tfm_adamw_param));
    if (train && c.moment_shards > 1)
        impl->share = (tfm_adamw_param *)tfm_arena_alloc(&am.acts, (size_t)n_params * sizeof(tfm_adamw_param));
    tfm_rng_seed(&rng, c.seed);
    r = tfm__model_build(m, &am, &rng);
    if (r == TFM_OK && (tfm_mem_check(&am) != TFM_OK || m->n_params != n_params))
        r = tfm__fail(TFM_E_NOMEM, "%s: internal layout mismatch", fn);
    if (r == TFM_OK && dev) { /* the parameters, initialised on the host, to the device */
        tfm__model_stage(impl, (const float *)(void *)dev, (int64_t)(sizes[0] / sizeof(float)), 0);
        r = tfm__cuda_check(fn);
    }
    if (r != TFM_OK) {
        if (owned) TFM_FREE(owned, c.user);
        tfm__dev_free(dev);
        memset(m, 0, sizeof *m);
        return r;
    }
    for (i = 0; train && i < n_params; i++) { /* the moments mirror the parameters offset for offset */
        const tfm_param *p = &m->params[i];
        int64_t a = TFM__MAX(p->offset, lo), b = TFM__MIN(p->offset + tfm_numel(&p->value), hi);
        tfm_adamw_param *e = &impl->adam[i];
        e->value = p->value;
        e->grad = p->grad;
        e->m = e->v = e->value;
        e->m.data = impl->share ? NULL : impl->mom_m + p->offset;
        e->v.data = impl->share ? NULL : impl->mom_v + p->offset;
        e->decay = p->decay;
        if (!impl->share || a >= b) continue;
        e = &impl->share[impl->n_share++]; /* sharded: the part in [lo, hi), as flat views */
        *e = impl->adam[i];
        e->value.ndim = e->grad.ndim = e->m.ndim = e->v.ndim = 1;
        e->value.shape[0] = e->grad.shape[0] = e->m.shape[0] = e->v.shape[0] = b - a;
        e->value.data += a - p->offset;
        e->grad.data += a - p->offset;
        e->m.data = impl->mom_m + (a - lo);
        e->v.data = impl->mom_v + (a - lo);
    }
    impl->has_grad = train;
    impl->training = train;
    impl->rng = rng;
    return TFM_OK;
}

TFMDEF void tfm_model_free(tfm_model *m) {
    void *owned, *dev;
    if (!m || !m->impl) return;
    owned = m->impl->owned; /* the impl lives in the block freed here */
    dev = m->impl->dev_mem;
    if (owned) TFM_FREE(owned, m->cfg.user);
    tfm__dev_free(dev);
    memset(m, 0, sizeof *m);
}

TFMDEF tfm_result tfm_model_to_device(tfm_model *m, tfm_device device) {
    const char *fn = "tfm_model_to_device";
    tfm_config c;
    tfm_model n;
    tfm__model_impl *a, *b;
    int64_t nf;
    tfm_result r;
    if (!m || !m->impl) return tfm__fail(TFM_E_ARG, "%s: model is NULL or not initialised", fn);
    if (device != TFM_DEVICE_CPU && device != TFM_DEVICE_CUDA)
        return tfm__fail(TFM_E_ARG, "%s: device %d is not a tfm_device", fn, (int)device);
    if (device == m->impl->device) return TFM_OK;
    c = m->cfg;
    c.device = device;
    if ((r = tfm_model_init(&n, &c, NULL, 0)) != TFM_OK) return tfm__fail(r, "%s: %s", fn, tfm_last_error());
    a = m->impl;
    b = n.impl;
    nf = (int64_t)(a->n_param_bytes / sizeof(float));
    tfm__op_transfer(device, tfm_model_flat(&n, 0, NULL), a->device, tfm_model_flat(m, 0, NULL), nf);
    if (a->has_grad) {
        int64_t nm = a->mom_hi - a->mom_lo;
        tfm__op_transfer(device, tfm_model_flat(&n, 1, NULL), a->device, tfm_model_flat(m, 1, NULL), nf);
        tfm__op_transfer(device, b->mom_m, a->device, a->mom_m, nm);
        tfm__op_transfer(device, b->mom_v, a->device, a->mom_v, nm);
    }
    if ((r = tfm__cuda_check(fn)) != TFM_OK) {
        tfm_model_free(&n);
        return r;
    }
    n.step = m->step;
    b->rng = a->rng;
    b->training = a->training;
    b->batch_offset = a->batch_offset;
    tfm_model_free(m);
    *m = n;
    return TFM_OK;
}

TFMDEF void tfm_model_train(tfm_model *m, int training) {
    if (m && m->impl) m->impl->training = training && m->impl->has_grad;
}

TFMDEF void tfm_model_zero_grad(tfm_model *m) {
    if (!m || !m->impl || !m->impl->has_grad) return;
    m->impl->grads_mean = 0;
    tfm__op_zero(m->impl->device, (float *)tfm__model_dev(m->impl, m->impl->mem_base + m->impl->off_grads),
                 (int64_t)(m->impl->n_param_bytes / sizeof(float)));
}

TFMDEF const tfm_param *tfm_model_param(const tfm_model *m, const char *name) {
    int i;
    if (!m || !name || !m->params) return NULL;
    for (i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i].name, name)) return &m->params[i];
    return NULL;
}

TFMDEF float *tfm_model_flat(tfm_model *m, int grads, int64_t *n) {
    if (n) *n = 0;
    if (!m || !m->impl || (grads && !m->impl->has_grad)) return NULL;
    if (n) *n = (int64_t)(m->impl->n_param_bytes / sizeof(float));
    return (float *)tfm__model_dev(m->impl, m->impl->mem_base + (grads ? m->impl->off_grads : m->impl->off_params));
}

TFMDEF tfm_result tfm_model_set_batch_offset(tfm_model *m, int64_t row0) {
    if (!m || !m->impl) return tfm__fail(TFM_E_ARG, "tfm_model_set_batch_offset: model is NULL or not initialised");
    if (row0 < 0) return tfm__fail(TFM_E_ARG, "tfm_model_set_batch_offset: row0 %lld is negative", (long long)row0);
    m->impl->batch_offset = row0;
    return TFM_OK;
}

TFMDEF tfm_tensor tfm_model_logits(const tfm_model *m) {
    tfm_tensor t;
    memset(&t, 0, sizeof t);
    if (!m || !m->impl || !m->impl->B) return t;
    if (m->impl->logits_bf) { /* a bf16 training step's (the last forward is an LM's or encoder-decoder's) */
        int64_t V = m->cfg.kind == TFM_MODEL_DECODER_LM ? m->cfg.vocab_size : m->cfg.tgt_vocab_size;
        int64_t rows = (int64_t)m->impl->B * (m->cfg.kind == TFM_MODEL_DECODER_LM ? m->impl->T : m->impl->Tt);
        /* widened through the logit gradients' space, which the step's backward has read (a backward called
           after this recomputes them) */
        tfm__op_bf16_rows(m->impl->device, m->impl->d_logits, V, m->impl->logits, tfm__bf16_ld(V), rows, V);
        tfm__op_copy(m->impl->device, m->impl->logits, m->impl->d_logits, rows * V);
        m->impl->logits_bf = 0;
        m->impl->xent_done = 0;
        if (tfm__scratch_check("tfm_model_logits") != TFM_OK) return t;
    }
    if (m->cfg.kind == TFM_MODEL_ENCODER_CLASSIFIER) t = tfm_tensor2(m->impl->logits, m->impl->B, m->cfg.n_classes);
    else if (m->cfg.kind == TFM_MODEL_DECODER_LM)
        t = tfm_tensor3(m->impl->logits, m->impl->B, m->cfg.last_logits ? 1 : m->impl->T, m->cfg.vocab_size);
    else t = tfm_tensor3(m->impl->logits, m->impl->B, m->cfg.last_logits ? 1 : m->impl->Tt, m->cfg.tgt_vocab_size);
    t.device = m->impl->device;
    return t;
}

TFMDEF tfm_tensor tfm_model_pooled(const tfm_model *m) {
    tfm_tensor t;
    memset(&t, 0, sizeof t);
    if (!m || !m->impl || !m->impl->B || m->cfg.kind != TFM_MODEL_ENCODER_CLASSIFIER) return t;
    t = tfm_tensor2(m->impl->pooled, m->impl->B, m->cfg.d_model);
    t.device = m->impl->device;
    return t;
}

/* B rows of n ids, row stride ld, each in [0,V) (or ignore when allow_ignore). */
static tfm_result tfm__chk_rows(const char *fn, const char *name, const int32_t *ids, int64_t B, int64_t n, int64_t ld,
                                int64_t V, int allow_ignore, int ignore) {
    int64_t b, i;
    if (!ids) return tfm__fail(TFM_E_ARG, "%s: %s is NULL", fn, name);
    for (b = 0; b < B; b++)
        for (i = 0; i < n; i++) {
            int32_t v = ids[b * ld + i];
            if ((v < 0 || v >= V) && !(allow_ignore && v == ignore))
                return tfm__fail(TFM_E_ARG, "%s: %s[%lld][%lld] = %d is outside [0,%lld)%s", fn, name, (long long)b,
                                 (long long)i, (int)v, (long long)V, allow_ignore ? " and is not ignore_index" : "");
        }
    return TFM_OK;
}

static tfm_result tfm__chk_batch(const char *fn, const tfm_model *m, const tfm_batch *b) {
    const tfm_config *c = &m->cfg;
    int kind = c->kind;
    if (!b) return tfm__fail(TFM_E_ARG, "%s: batch is NULL", fn);
    if (b->batch < 1 || b->batch > c->max_batch)
        return tfm__fail(TFM_E_SHAPE, "%s: batch.batch %d is outside [1,%d] (cfg.max_batch)", fn, b->batch, c->max_batch);
    if (b->len < 1 || b->len > c->max_len)
        return tfm__fail(TFM_E_SHAPE, "%s: batch.len %d is outside [1,%d] (cfg.max_len)", fn, b->len, c->max_len);
    if (b->stride != 0 && b->stride < b->len)
        return tfm__fail(TFM_E_ARG, "%s: batch.stride %d is less than batch.len %d", fn, b->stride, b->len);
    if (c->input_dim) {
        int64_t r, i, n = (int64_t)b->len * c->input_dim, ld = (int64_t)(b->stride ? b->stride : b->len) * c->input_dim;
        if (!b->inputs) return tfm__fail(TFM_E_ARG, "%s: batch.inputs is NULL (cfg.input_dim %d)", fn, c->input_dim);
        if (b->tokens) return tfm__fail(TFM_E_ARG, "%s: batch.tokens given to a model of continuous inputs", fn);
        for (r = 0; r < b->batch; r++)
            for (i = 0; i < n; i++)
                if (!isfinite(b->inputs[r * ld + i]))
                    return tfm__fail(TFM_E_ARG, "%s: batch.inputs of row %lld holds %g at %lld", fn, (long long)r,
                                     (double)b->inputs[r * ld + i], (long long)i);
    } else {
        if (b->inputs) return tfm__fail(TFM_E_ARG, "%s: batch.inputs given to a model of tokens (cfg.input_dim 0)", fn);
        TFM__TRY(tfm__chk_rows(fn, "batch.tokens", b->tokens, b->batch, b->len, b->stride ? b->stride : b->len,
                               c->vocab_size, 0, 0));
    }
    TFM__TRY(tfm__chk_lens(fn, "batch.lens", b->lens, b->batch, b->len));
    if (b->token_types && !c->type_vocab_size)
        return tfm__fail(TFM_E_ARG, "%s: batch.token_types given to a model without a type table (cfg.type_vocab_size 0)", fn);
    if (b->token_types)
        TFM__TRY(tfm__chk_rows(fn, "batch.token_types", b->token_types, b->batch, b->len, b->stride ? b->stride : b->len,
                               c->type_vocab_size, 0, 0));
    if (kind == TFM_MODEL_ENCODER_DECODER) {
        if (b->tgt_len < 1 || b->tgt_len > c->max_tgt_len)
            return tfm__fail(TFM_E_SHAPE, "%s: batch.tgt_len %d is outside [1,%d] (cfg.max_tgt_len)", fn, b->tgt_len,
                             c->max_tgt_len);
        if (b->tgt_stride != 0 && b->tgt_stride < b->tgt_len)
            return tfm__fail(TFM_E_ARG, "%s: batch.tgt_stride %d is less than batch.tgt_len %d", fn, b->tgt_stride, b->tgt_len);
        if (!b->tgt_in) return tfm__fail(TFM_E_ARG, "%s: batch.tgt_in is NULL (an encoder-decoder needs decoder inputs)", fn);
        TFM__TRY(tfm__chk_rows(fn, "batch.tgt_in", b->tgt_in, b->batch, b->tgt_len,
                               b->tgt_stride ? b->tgt_stride : b->tgt_len, c->tgt_vocab_size, 0, 0));
    }
    if (b->targets) {
        if (kind == TFM_MODEL_ENCODER_CLASSIFIER)
            TFM__TRY(tfm__chk_rows(fn, "batch.targets", b->targets, 1, b->batch, b->batch, c->n_classes, 1, c->ignore_index));
        else if (kind == TFM_MODEL_DECODER_LM)
            TFM__TRY(tfm__chk_rows(fn, "batch.targets", b->targets, b->batch, b->len, b->stride ? b->stride : b->len,
                                   c->vocab_size, 1, c->ignore_index));
        else
            TFM__TRY(tfm__chk_rows(fn, "batch.targets", b->targets, b->batch, b->tgt_len,
                                   b->tgt_stride ? b->tgt_stride : b->tgt_len, c->tgt_vocab_size, 1, c->ignore_index));
    }
    return TFM_OK;
}

/* n rows of len ids, row stride ld, into a packed (n, len) copy. */
static void tfm__copy_ids(int32_t *dst, const int32_t *src, int64_t n, int64_t len, int64_t ld) {
    int64_t r;
    for (r = 0; r < n; r++) memcpy(dst + r * len, src + r * ld, (size_t)len * sizeof(int32_t));
}

/* The input rows x (B,Te,C), Te = T + cls: the class vector (cls_token) when cls, then each position's
   token embedding (times sqrt(C) with scale_emb) or, when inputs, its projected input; then positions
   0.. (p0 NULL) or, decoding, row b's from p0[b]; then, with a type table, the rows of types (B,T) (NULL:
   type 0); then emb_norm over the sum (kept in emb_sum for backward); then dropout. */
static void tfm__embed_fwd(tfm_model *m, float *x, const int32_t *ids, const float *inputs, const int32_t *types, int B,
                           int T, int cls, const tfm_tensor *emb, const tfm_tensor *pos, const int32_t *p0, uint64_t site) {
    tfm__model_impl *im = m->impl;
    int64_t C = m->cfg.d_model, I = m->cfg.input_dim, Te = T + cls, b;
    float scale = m->cfg.scale_emb ? sqrtf((float)C) : 1.0f;
    float *s = m->cfg.emb_norm ? im->emb_sum : x; /* the sum */
    tfm_linear *ip = &im->input_proj;
    if (!cls && inputs) tfm__op_linear(im->device, s, C, inputs, I, ip->weight.data, ip->bias.data, (int64_t)B * T, I, C, 0);
    else if (!cls) tfm__op_embedding(im->device, s, ids, emb->data, scale, (int64_t)B * T, C);
    for (b = 0; cls && b < B; b++) { /* one call per row: the class vector sits between the rows */
        float *sb = s + (b * Te + 1) * C;
        if (inputs) tfm__op_linear(im->device, sb, C, inputs + b * T * I, I, ip->weight.data, ip->bias.data, T, I, C, 0);
        else tfm__op_embedding(im->device, sb, ids + b * T, emb->data, scale, T, C);
    }
    if (cls) tfm__op_copy_rows(im->device, s, Te * C, im->cls.data, 0, B, C);
    if (pos->data) tfm__op_pos_add(im->device, s, s, pos->data, p0, B, Te, C);
    if (im->type_emb.data && types) { /* no class vector with types: Te == T */
        tfm__op_embedding(im->device, im->type_x, types, im->type_emb.data, 1.0f, (int64_t)B * T, C);
        tfm__op_add(im->device, s, s, im->type_x, (int64_t)B * T * C);
    } else if (im->type_emb.data) { /* type 0's row added to every position */
        tfm__op_pos_add(im->device, s, s, im->type_emb.data, NULL, (int64_t)B * T, 1, C);
    }
    if (m->cfg.emb_norm)
        tfm__op_layernorm(im->device, x, im->emb_norm.mean, im->emb_norm.rstd, s, im->emb_norm.weight.data,
                          im->emb_norm.bias.data, m->cfg.ln_eps, (int64_t)B * Te, C, im->emb_norm.rms, 0);
    if (im->training && m->cfg.dropout > 0.0f)
        tfm__op_dropout(im->device, x, x, B * Te * C, m->cfg.dropout, tfm__seed_mix(im->fwd_seed, site),
                        (uint64_t)(im->batch_offset * Te * C), 0);
}

/* Backward of tfm__embed_fwd from g (B,Te,C), which it clobbers: the gradients of the embedding (or of
   input_proj), the positions, the token types, emb_norm and the class vector. */
static void tfm__embed_bwd(tfm_model *m, float *g, const int32_t *ids, const float *inputs, const int32_t *types, int B,
                           int T, int cls, const tfm_tensor *demb, const tfm_tensor *dpos, uint64_t site) {
    tfm__model_impl *im = m->impl;
    int64_t C = m->cfg.d_model, I = m->cfg.input_dim, Te = T + cls, b;
    float scale = m->cfg.scale_emb ? sqrtf((float)C) : 1.0f;
    tfm_linear *ip = &im->input_proj;
    if (im->training && m->cfg.dropout > 0.0f)
        tfm__op_dropout(im->device, g, g, B * Te * C, m->cfg.dropout, tfm__seed_mix(im->fwd_seed, site),
                        (uint64_t)(im->batch_offset * Te * C), 0);
    if (m->cfg.emb_norm) { /* into a backward buffer that g is not (each holds B * max(Te, Tt) * C) */
        float *gs = g == im->d_enc_y ? im->d_dec_x : im->d_enc_y;
        tfm__op_layernorm_bwd(im->device, gs, NULL, im->emb_norm.d_weight.data, im->emb_norm.d_bias.data, g, im->emb_sum,
                              im->emb_norm.weight.data, im->emb_norm.mean, im->emb_norm.rstd, (int64_t)B * Te, C,
                              im->emb_norm.rms);
        g = gs;
    }
    if (im->d_type_emb.data && types) tfm__op_embedding_bwd(im->device, im->d_type_emb.data, g, types, 1.0f, (int64_t)B * T, C);
    else if (im->d_type_emb.data) tfm__op_pos_bwd(im->device, im->d_type_emb.data, g, (int64_t)B * T, 1, C);
    if (dpos && dpos->data) tfm__op_pos_bwd(im->device, dpos->data, g, B, Te, C);
    if (!cls && inputs)
        tfm__op_linear_bwd(im->device, NULL, 0, 0.0f, ip->d_weight.data, ip->d_bias.data, g, C, inputs, I, ip->weight.data,
                           (int64_t)B * T, I, C, 0);
    else if (!cls) tfm__op_embedding_bwd(im->device, demb->data, g, ids, scale, (int64_t)B * T, C);
    for (b = 0; cls && b < B; b++) {
        const float *gb = g + (b * Te + 1) * C;
        if (inputs)
            tfm__op_linear_bwd(im->device, NULL, 0, 0.0f, ip->d_weight.data, ip->d_bias.data, gb, C, inputs + b * T * I, I,
                               ip->weight.data, T, I, C, 0);
        else tfm__op_embedding_bwd(im->device, demb->data, gb, ids + b * T, scale, T, C);
        tfm__op_add(im->device, im->d_cls.data, im->d_cls.data, g + b * Te * C, C);
    }
}

/* Runs n layers from x; returns the stack's output (after the final norm when pre-LN). */
static const float *tfm__stack_fwd(tfm_model *m, tfm_block *blks, float *buf, int n, tfm_layernorm *norm, float *ln_out,
                                   const float *x, const float *mem, int B, int T, int Tk, int causal,
                                   const int32_t *lens, const int32_t *mem_lens, uint64_t site, tfm_kv_cache *kc) {
    int64_t BTC = (int64_t)blks[0].desc.max_batch * blks[0].desc.max_len * m->cfg.d_model;
    const float *cur = x;
    tfm_attn_opts o;
    int l;
    memset(&o, 0, sizeof o);
    o.causal = causal;
    o.key_lens = lens;
    o.kv_lens = mem_lens;
    o.training = m->impl->training;
    o.batch_offset = m->impl->batch_offset;
    for (l = 0; l < n; l++) { /* pre-LN: each block's last residual add runs the norm after it */
        float *out = buf + (l % tfm__stack_bufs(n, m->impl->has_grad)) * BTC;
        tfm__norm_after after;
        after.ln = l + 1 < n ? &blks[l + 1].norm[0] : norm;
        after.out = l + 1 < n ? blks[l + 1].ln_io[0] : ln_out;
        after.eps = l + 1 < n ? blks[l + 1].desc.ln_eps : m->cfg.ln_eps;
        after.bf = l + 1 < n && tfm__bf16_store(blks[l + 1].device, blks[l + 1].desc.d_model);
        o.seed = tfm__seed_mix(m->impl->fwd_seed, site + (uint64_t)l);
        tfm__block_fwd(&blks[l], out, cur, mem, B, T, Tk, &o, kc, l, m->cfg.norm_first && l > 0,
                       m->cfg.norm_first ? &after : NULL);
        cur = out;
    }
    if (m->cfg.norm_first && n == 0)
        tfm__op_layernorm(m->impl->device, ln_out, norm->mean, norm->rstd, cur, norm->weight.data, norm->bias.data, m->cfg.ln_eps, (int64_t)B * T, m->cfg.d_model, norm->rms, 0);
    return m->cfg.norm_first ? ln_out : cur;
}

/* g: gradient of the stack's output (clobbered). Returns the gradient of its input (d_enc_y or d_dec_x). */
static float *tfm__stack_bwd(tfm_model *m, tfm_block *blks, float *buf, int n, tfm_layernorm *norm, float *g, float *dmem,
                             int B, int T) {
    int64_t C = m->cfg.d_model, BTC = (int64_t)blks[0].desc.max_batch * blks[0].desc.max_len * C;
    float *bufs[2];
    int l, which = 0;
    bufs[0] = m->impl->d_enc_y;
    bufs[1] = m->impl->d_dec_x;
    if (m->cfg.norm_first) {
        const float *top = buf + (n - 1) * BTC;
        tfm__op_layernorm_bwd(m->impl->device, bufs[which], NULL, norm->d_weight.data, norm->d_bias.data, g, top, norm->weight.data, norm->mean, norm->rstd, (int64_t)B * T, C, norm->rms);
        g = bufs[which];
        which ^= 1;
    }
    for (l = n - 1; l >= 0; l--) {
        float *dprev = bufs[which];
        tfm__block_bwd(&blks[l], dprev, 0.0f, dmem, g);
        if (m->impl->on_grads) m->impl->on_grads(m->impl->on_grads_ctx, tfm__block_grad_lo(&blks[l]));
        g = dprev;
        which ^= 1;
    }
    return g;
}

/* The encoder over ids or inputs (B,T) (and token types, NULL: none): embedding, the stack; returns its output (B,Te,C), Te = T +
   cfg.cls_token. lens: valid lengths of the Te positions. */
static const float *tfm__encoder_fwd(tfm_model *m, const int32_t *ids, const float *inputs, const int32_t *types,
                                     int B, int T, const int32_t *lens) {
    int Te = T + m->cfg.cls_token;
    tfm__embed_fwd(m, m->impl->enc_x, ids, inputs, types, B, T, m->cfg.cls_token, &m->impl->src_emb, &m->impl->pos_emb, NULL,
                   TFM__SITE_SRC_EMB);
    return tfm__stack_fwd(m, m->impl->enc, m->impl->enc_buf, m->impl->n_enc, &m->impl->enc_norm, m->impl->enc_ln,
                          m->impl->enc_x, NULL, B, Te, Te, 0, lens, NULL, TFM__SITE_STACK, NULL);
}

/* The decoder (the LM's stack, or an encoder-decoder's over memory (B,S,C)) on ids (B,T), row b at
   positions kc->lens[b].. when decoding against a cache (kc NULL: from 0, no cache), with token types
   (NULL: none). Returns its output (B,T,C). */
static const float *tfm__decoder_fwd(tfm_model *m, const int32_t *ids, const float *inputs, const int32_t *types, int B,
                                     int T, const float *memory, int S, const int32_t *mem_lens, tfm_kv_cache *kc) {
    int encdec = m->cfg.kind == TFM_MODEL_ENCODER_DECODER;
    float *x = encdec ? m->impl->dec_x : m->impl->enc_x;
    tfm__embed_fwd(m, x, ids, inputs, types, B, T, 0, encdec ? &m->impl->tgt_emb : &m->impl->src_emb,
                   encdec ? &m->impl->tgt_pos_emb : &m->impl->pos_emb, kc ? kc->lens : NULL,
                   encdec ? TFM__SITE_TGT_EMB : TFM__SITE_SRC_EMB);
    return tfm__stack_fwd(m, m->impl->dec, m->impl->dec_buf, m->impl->n_dec, &m->impl->dec_norm, m->impl->dec_ln, x,
                          memory, B, T, S, 1, NULL, mem_lens, encdec ? TFM__SITE_DEC_STACK : TFM__SITE_STACK, kc);
}

/* dlogits: a training step's forward (tfm__train_step_run, tfm__model_graph), whose backward takes a loss scale
   of 1: where the logits' gradients are a bf16 activation (an LM head on a GPU), the loss's pass writes them
   too (xent_done) and the backward does not read the logits again */
static tfm_result tfm__model_forward(tfm_model *m, const tfm_batch *b, float *loss, int64_t *n_counted, int dlogits) {
    const tfm_config *c;
    tfm_rng rng0;
    tfm_result r;
    int B, T, Te, Tt = 0, kind;
    int64_t C, i, rows, n_out, counted = 0;
    const float *h, *inputs;
    const int32_t *lens, *types;
    if (!m || !m->impl) return tfm__fail(TFM_E_ARG, "tfm_model_forward: model is NULL or not initialised");
    c = &m->cfg;
    TFM__TRY(tfm__chk_batch("tfm_model_forward", m, b));
    if (c->last_logits && b->targets)
        return tfm__fail(TFM_E_ARG, "tfm_model_forward: batch.targets given to a model built with cfg.last_logits (its "
                         "logits are each row's last position only; a loss needs every position)");
    TFM__TRY(tfm__scratch_reserve("tfm_model_forward"));
    kind = c->kind;
    B = b->batch;
    T = b->len;
    C = c->d_model;
    if (kind == TFM_MODEL_ENCODER_DECODER) Tt = b->tgt_len;
    m->impl->B = B;
    m->impl->T = T;
    m->impl->Tt = Tt;
    m->impl->has_lens = b->lens != NULL;
    for (i = 0; b->lens && i < B; i++) m->impl->lens[i] = b->lens[i] + c->cls_token; /* lengths of the Te positions */
    lens = b->lens ? m->impl->lens : NULL;
    Te = T + c->cls_token;
    if (c->input_dim) {
        tfm__op_copy_rows(m->impl->device, m->impl->inputs, (int64_t)T * c->input_dim, b->inputs,
                          (int64_t)(b->stride ? b->stride : T) * c->input_dim, B, (int64_t)T * c->input_dim);
    } else {
        tfm__copy_ids(m->impl->ids, b->tokens, B, T, b->stride ? b->stride : T);
    }
    m->impl->tokens = c->input_dim ? NULL : m->impl->ids;
    inputs = c->input_dim ? m->impl->inputs : NULL;
    if (b->token_types) tfm__copy_ids(m->impl->type_ids, b->token_types, B, T, b->stride ? b->stride : T);
    m->impl->has_types = b->token_types != NULL;
    types = b->token_types ? m->impl->type_ids : NULL;
    if (kind == TFM_MODEL_ENCODER_DECODER) {
        tfm__copy_ids(m->impl->tgt_ids, b->tgt_in, B, Tt, b->tgt_stride ? b->tgt_stride : Tt);
        m->impl->tgt_in = m->impl->tgt_ids;
    }
    m->impl->gen_replaced = 0;
    rng0 = m->impl->rng;
    if (m->impl->training) m->impl->fwd_seed = tfm_rng_u64(&m->impl->rng);

    if (kind == TFM_MODEL_DECODER_LM) {
        h = tfm__decoder_fwd(m, m->impl->tokens, inputs, types, B, T, NULL, 0, NULL, NULL);
    } else {
        h = tfm__encoder_fwd(m, m->impl->tokens, inputs, types, B, T, lens);
        if (kind == TFM_MODEL_ENCODER_DECODER) {
            m->impl->memory = h;
            h = tfm__decoder_fwd(m, m->impl->tgt_in, NULL, NULL, B, Tt, m->impl->memory, Te, lens, NULL);
        }
    }
    m->impl->top = h;
    m->impl->logits_bf = 0;
    if (kind == TFM_MODEL_ENCODER_CLASSIFIER) {
        tfm__op_pool(m->impl->device, c->pool, m->impl->pooled, h, lens, B, Te, C);
        rows = B;
        n_out = c->n_classes;
        tfm__op_linear(m->impl->device, m->impl->logits, n_out, m->impl->pooled, C, m->impl->head.weight.data, m->impl->head.bias.data, rows, C, n_out, 0);
    } else if (c->last_logits) { /* each row's last position: lens[b] - 1 (an LM with lens), else T - 1 */
        int Th = kind == TFM_MODEL_DECODER_LM ? T : Tt;
        n_out = kind == TFM_MODEL_DECODER_LM ? c->vocab_size : c->tgt_vocab_size;
        rows = B;
        for (i = 0; i < B; i++) {
            int64_t last = kind == TFM_MODEL_DECODER_LM && b->lens ? TFM__MAX(b->lens[i], 1) - 1 : Th - 1;
            tfm__op_linear(m->impl->device, m->impl->logits + i * n_out, n_out, h + (i * Th + last) * C, C,
                           m->impl->head.weight.data, NULL, 1, C, n_out, 0);
        }
    } else {
        /* a bf16 training step's logits are rounded to bf16 (as autocast's are), and written so where the product
           can (logits_bf): only its loss's pass reads them, and tfm_model_logits widens them if asked */
        int lrnd;
        rows = (int64_t)B * (kind == TFM_MODEL_DECODER_LM ? T : Tt);
        n_out = kind == TFM_MODEL_DECODER_LM ? c->vocab_size : c->tgt_vocab_size;
        lrnd = dlogits && b->targets && tfm__bf16_fits(m->impl->device, n_out);
        m->impl->logits_bf = lrnd && tfm__bf16_store(m->impl->device, n_out) &&
                             tfm__op_linear_to_bf16(m->impl->device, m->impl->logits, tfm__bf16_ld(n_out), h, C,
                                                    m->impl->head.weight.data, NULL, rows, C, n_out, 0);
        if (!m->impl->logits_bf) {
            tfm__op_linear(m->impl->device, m->impl->logits, n_out, h, C, m->impl->head.weight.data, NULL, rows, C, n_out, 0);
            if (lrnd) tfm__op_bf16_rows(m->impl->device, m->impl->logits, n_out, m->impl->logits, 0, rows, n_out);
        }
    }
    m->impl->has_targets = b->targets != NULL;
    m->impl->xent_done = 0;
    m->impl->last_loss = 0.0f;
    if (b->targets) {
        if (kind == TFM_MODEL_ENCODER_CLASSIFIER) tfm__copy_ids(m->impl->targets, b->targets, 1, B, B);
        else if (kind == TFM_MODEL_DECODER_LM) tfm__copy_ids(m->impl->targets, b->targets, B, T, b->stride ? b->stride : T);
        else tfm__copy_ids(m->impl->targets, b->targets, B, Tt, b->tgt_stride ? b->tgt_stride : Tt);
        if (kind == TFM_MODEL_DECODER_LM && b->lens) /* positions past a sequence's length do not count */
            for (i = 0; i < rows; i++)
                if (i % T >= b->lens[i / T]) m->impl->targets[i] = c->ignore_index;
        m->impl->xent_done = dlogits && kind != TFM_MODEL_ENCODER_CLASSIFIER && tfm__bf16_store(m->impl->device, n_out);
        m->impl->last_loss = tfm__op_cross_entropy(m->impl->device, m->impl->lse, m->impl->logits, m->impl->logits_bf, m->impl->targets,
                                                   c->ignore_index, c->label_smoothing, rows, n_out, &counted,
                                                   m->impl->xent_done ? m->impl->d_logits : NULL);
    }
    if (loss) *loss = m->impl->last_loss;
    if (n_counted) *n_counted = counted;
    r = tfm__scratch_check("tfm_model_forward");
    if (r != TFM_OK) { /* the random stream as it was, and no forward for backward to use */
        m->impl->rng = rng0;
        m->impl->B = 0;
        m->impl->has_targets = 0;
        m->impl->xent_done = 0;
    }
    return r;
}

#if defined(TFM_CUDA)
static int tfm__model_graph(tfm_model *m, const tfm_batch *b, const tfm_optim *o, float *loss, int64_t *n_counted,
                            float *grad_norm, tfm_result *r);
#endif

/* On the GPU, after the model's first forward or training step, one CUDA graph (tfm__model_graph) */
TFMDEF tfm_result tfm_model_forward(tfm_model *m, const tfm_batch *b, float *loss, int64_t *n_counted) {
    int prev = tfm__prec_enter(m), ran = 0;
    tfm_result r = TFM_OK;
#if defined(TFM_CUDA)
    if (m && m->impl && m->impl->device == TFM_DEVICE_CUDA && m->impl->warm && tfm__chk_batch("tfm_model_forward", m, b) == TFM_OK)
        ran = tfm__model_graph(m, b, NULL, loss, n_counted, NULL, &r);
#endif
    if (!ran) r = tfm__model_forward(m, b, loss, n_counted, 0);
    if (r == TFM_OK) m->impl->warm = 1;
    return tfm__prec_done(prev, r);
}

static tfm_result tfm__model_backward(tfm_model *m, float loss_scale) {
    const char *fn = "tfm_model_backward";
    const tfm_config *c;
    int B, T, Te, Tt, kind, lbf;
    int64_t C, rows, n_out;
    float *g;
    const float *inputs;
    const int32_t *types;
    if (!m || !m->impl) return tfm__fail(TFM_E_ARG, "%s: model is NULL or not initialised", fn);
    if (!m->impl->has_grad) return tfm__fail(TFM_E_ARG, "%s: the model was built inference_only", fn);
    if (m->impl->gen_replaced)
        return tfm__fail(TFM_E_ARG, "%s: tfm_model_generate ran after the last forward and replaced its saved state; "
                         "run tfm_model_forward again", fn);
    if (!m->impl->B || !m->impl->has_targets) return tfm__fail(TFM_E_ARG, "%s: the last forward had no targets, so there is no loss", fn);
    if (!isfinite(loss_scale)) return tfm__fail(TFM_E_ARG, "%s: loss_scale %g is not finite", fn, (double)loss_scale);
    TFM__TRY(tfm__scratch_reserve(fn));
    m->impl->grads_mean = 0;
    c = &m->cfg;
    kind = c->kind;
    B = m->impl->B;
    T = m->impl->T;
    Tt = m->impl->Tt;
    Te = T + c->cls_token;
    C = c->d_model;
    inputs = c->input_dim ? m->impl->inputs : NULL;
    types = m->impl->has_types ? m->impl->type_ids : NULL;
    rows = kind == TFM_MODEL_ENCODER_CLASSIFIER ? B : (int64_t)B * (kind == TFM_MODEL_DECODER_LM ? T : Tt);
    n_out = kind == TFM_MODEL_ENCODER_CLASSIFIER ? c->n_classes : kind == TFM_MODEL_DECODER_LM ? c->vocab_size : c->tgt_vocab_size;
    /* an LM head's logit gradients, which only its products read, as a bf16 activation (tfm__bf16_store) */
    lbf = kind != TFM_MODEL_ENCODER_CLASSIFIER && tfm__bf16_store(m->impl->device, n_out);
    if (!lbf) tfm__op_zero(m->impl->device, m->impl->d_logits, rows * n_out);
    if (!(m->impl->xent_done && loss_scale == 1.0f)) /* (xent_done: lbf, in the forward's) */
        tfm__op_cross_entropy_bwd(m->impl->device, m->impl->d_logits, loss_scale, m->impl->logits, m->impl->logits_bf, m->impl->lse, m->impl->targets, c->ignore_index, c->label_smoothing, rows, n_out, lbf);
    g = m->impl->d_enc_x; /* gradient of the top stack's output */
    if (kind == TFM_MODEL_ENCODER_CLASSIFIER) {
        const int32_t *lens = m->impl->has_lens ? m->impl->lens : NULL;
        tfm__op_linear_bwd(m->impl->device, m->impl->d_pooled, C, 0.0f, m->impl->head.d_weight.data, m->impl->head.d_bias.data, m->impl->d_logits, n_out, m->impl->pooled, C, m->impl->head.weight.data, rows, C, n_out, 0);
        tfm__op_zero(m->impl->device, g, (int64_t)B * Te * C);
        tfm__op_pool_bwd(m->impl->device, c->pool, g, m->impl->d_pooled, lens, B, Te, C);
    } else {
        tfm__op_linear_bwd(m->impl->device, g, C, 0.0f, m->impl->head.d_weight.data, NULL, m->impl->d_logits, lbf ? tfm__bf16_ld(n_out) : n_out, m->impl->top, C, m->impl->head.weight.data, rows, C, n_out, lbf ? 2 : 0);
    }
    if (kind == TFM_MODEL_DECODER_LM) {
        g = tfm__stack_bwd(m, m->impl->dec, m->impl->dec_buf, m->impl->n_dec, &m->impl->dec_norm, g, NULL, B, T);
        tfm__embed_bwd(m, g, m->impl->tokens, inputs, types, B, T, 0, &m->impl->d_src_emb, &m->impl->d_pos_emb,
                       TFM__SITE_SRC_EMB);
        return tfm__scratch_check(fn);
    }
    if (kind == TFM_MODEL_ENCODER_DECODER) {
        tfm__op_zero(m->impl->device, m->impl->d_dec_y, (int64_t)B * T * C);
        g = tfm__stack_bwd(m, m->impl->dec, m->impl->dec_buf, m->impl->n_dec, &m->impl->dec_norm, g, m->impl->d_dec_y, B, Tt);
        tfm__embed_bwd(m, g, m->impl->tgt_in, NULL, NULL, B, Tt, 0, &m->impl->d_tgt_emb,
                       c->pos == TFM_POS_LEARNED ? &m->impl->d_tgt_pos_emb : NULL, TFM__SITE_TGT_EMB);
        g = m->impl->d_enc_x;
        tfm__op_copy(m->impl->device, g, m->impl->d_dec_y, (int64_t)B * T * C);
    }
    g = tfm__stack_bwd(m, m->impl->enc, m->impl->enc_buf, m->impl->n_enc, &m->impl->enc_norm, g, NULL, B, Te);
    tfm__embed_bwd(m, g, m->impl->tokens, inputs, types, B, T, c->cls_token, &m->impl->d_src_emb, &m->impl->d_pos_emb,
                   TFM__SITE_SRC_EMB);
    return tfm__scratch_check(fn);
}

TFMDEF tfm_result tfm_model_backward(tfm_model *m, float loss_scale) {
    int prev = tfm__prec_enter(m);
    return tfm__prec_done(prev, tfm__model_backward(m, loss_scale));
}

/* ==== >>impl-optim ==== AdamW, the learning-rate schedule, clipping and tfm_model_step */

/* opt with defaults applied and checked (*out), for step s; the one check of tfm_model_step and
   tfm_optim_lr. */
static tfm_result tfm__optim_resolve(const char *fn, const tfm_optim *opt, int64_t s, tfm_optim *out) {
    tfm_optim o;
    if (!opt) return tfm__fail(TFM_E_ARG, "%s: opt is NULL", fn);
    o = *opt;
    if (!(o.lr > 0.0f) || !isfinite(o.lr)) return tfm__fail(TFM_E_ARG, "%s: opt.lr %g: required, finite and > 0", fn, (double)o.lr);
    if (o.beta1 == 0.0f) o.beta1 = 0.9f;
    if (o.beta2 == 0.0f) o.beta2 = 0.999f;
    if (o.eps == 0.0f) o.eps = 1e-8f;
    if (!(o.beta1 > 0.0f && o.beta1 < 1.0f) || !(o.beta2 > 0.0f && o.beta2 < 1.0f) || !(o.eps > 0.0f) ||
        !(o.weight_decay >= 0.0f) || !(o.clip_norm >= 0.0f) || !(o.min_lr >= 0.0f && o.min_lr <= o.lr) ||
        !isfinite(o.weight_decay) || !isfinite(o.clip_norm) || !isfinite(o.eps))
        return tfm__fail(TFM_E_ARG, "%s: opt has beta1 %g, beta2 %g, eps %g, weight_decay %g, clip_norm %g, min_lr %g: want "
                         "betas in (0,1), eps > 0, min_lr in [0, lr], the rest finite and >= 0", fn, (double)o.beta1,
                         (double)o.beta2, (double)o.eps, (double)o.weight_decay, (double)o.clip_norm, (double)o.min_lr);
    if ((int)o.schedule < 0 || (int)o.schedule > 2)
        return tfm__fail(TFM_E_ARG, "%s: opt.schedule %d is not a tfm_schedule", fn, (int)o.schedule);
    if (o.warmup_steps < 0 || o.total_steps < 0)
        return tfm__fail(TFM_E_ARG, "%s: opt.warmup_steps %d and opt.total_steps %d must be >= 0", fn, o.warmup_steps,
                         o.total_steps);
    if (s < 1) return tfm__fail(TFM_E_ARG, "%s: step %lld: steps count from 1", fn, (long long)s);
    if (o.schedule == TFM_SCHED_COSINE) {
        if (o.total_steps <= o.warmup_steps)
            return tfm__fail(TFM_E_ARG, "%s: opt.total_steps %d must exceed opt.warmup_steps %d for the cosine schedule", fn,
                             o.total_steps, o.warmup_steps);
        if (s > o.total_steps)
            return tfm__fail(TFM_E_ARG, "%s: step %lld is past opt.total_steps %d: the cosine schedule has ended (raise "
                             "total_steps to go on)", fn, (long long)s, o.total_steps);
    }
    *out = o;
    return TFM_OK;
}

/* The rate of step s (>= 1) under a resolved opt. */
static float tfm__lr(const tfm_optim *o, int64_t s) {
    double lr = o->lr, w = o->warmup_steps > 0 ? o->warmup_steps : 0;
    switch (o->schedule) {
    case TFM_SCHED_COSINE: {
        double p;
        if (w > 0 && s <= w) return (float)(lr * (double)s / w);
        p = ((double)s - w) / ((double)o->total_steps - w);
        return (float)(o->min_lr + 0.5 * (lr - o->min_lr) * (1.0 + cos(3.141592653589793 * p)));
    }
    case TFM_SCHED_INV_SQRT: {
        double ww = w > 0 ? w : 1.0, a = 1.0 / sqrt((double)s), b = (double)s / (ww * sqrt(ww));
        return (float)(lr * sqrt(ww) * (a < b ? a : b));
    }
    default:
        if (w > 0 && s < w) return (float)(lr * (double)s / w);
        return (float)lr;
    }
}

TFMDEF tfm_result tfm_optim_lr(const tfm_optim *opt, int64_t s, float *lr) {
    tfm_optim o;
    memset(&o, 0, sizeof o);
    if (!lr) return tfm__fail(TFM_E_ARG, "tfm_optim_lr: lr is NULL");
    TFM__TRY(tfm__optim_resolve("tfm_optim_lr", opt, s, &o));
    *lr = tfm__lr(&o, s);
    return TFM_OK;
}

/* Whether this thread is capturing a step for a CUDA graph (>>impl-cuda): results are not read back then. */
static int tfm__capturing(void) {
#if defined(TFM_CUDA)
    return tfm__cu.capturing;
#else
    return 0;
#endif
}

/* TFM_E_ARG naming fn for a gradient norm that is not finite (no update is made then). */
static tfm_result tfm__norm_check(const char *fn, double norm) {
    if (isfinite(norm)) return TFM_OK;
    return tfm__fail(TFM_E_ARG, "%s: the gradient norm is %g (not finite); no update made", fn, norm);
}

/* One AdamW update of ps under a resolved o, for `step`, with sumsq the squared global gradient norm
   (tfm__op_sumsq, just before): clipping to o->clip_norm, then the update. TFM_E_ARG (nothing updated)
   for a non-finite norm; while a training step is captured the norm is checked once its graph has run. */
static tfm_result tfm__adamw_apply(const char *fn, const tfm_optim *o, const tfm_adamw_param *ps, int n, int64_t step,
                                   double sumsq, float *grad_norm) {
    double bc1, bc2;
    float lr;
    if (grad_norm) *grad_norm = (float)sqrt(sumsq);
    TFM__TRY(tfm__cuda_check(fn)); /* the norm's kernels failed: no update by a wrong norm */
    if (!tfm__capturing()) TFM__TRY(tfm__norm_check(fn, sqrt(sumsq)));
    lr = tfm__lr(o, step);
    bc1 = 1.0 - pow((double)o->beta1, (double)step);
    bc2 = 1.0 - pow((double)o->beta2, (double)step);
    if (n > 0)
        tfm__op_adamw(ps[0].value.device, ps, n, o->clip_norm, sumsq, o->beta1, o->beta2, o->eps, (float)(lr / bc1),
                      (float)sqrt(bc2), 1.0f - lr * o->weight_decay, o->decay_all);
    return TFM_OK;
}

/* tfm_adamw_step, with errors under the name fn */
static tfm_result tfm__adamw_step(const char *fn, const tfm_adamw_param *ps, int n, const tfm_optim *opt, int64_t step,
                                  float *grad_norm) {
    tfm_optim o;
    int i;
    memset(&o, 0, sizeof o);
    if (grad_norm) *grad_norm = 0.0f;
    if (!ps || n < 1) return tfm__fail(TFM_E_ARG, "%s: %d parameters at %p: want a list of at least one", fn, n, (const void *)ps);
    for (i = 0; i < n; i++) {
        const tfm_adamw_param *p = &ps[i];
        if (tfm__chk(fn, "ps[i].value", &p->value) != TFM_OK || tfm__chk(fn, "ps[i].grad", &p->grad) != TFM_OK ||
            tfm__chk(fn, "ps[i].m", &p->m) != TFM_OK || tfm__chk(fn, "ps[i].v", &p->v) != TFM_OK)
            return tfm__fail(TFM_E_ARG, "%s: parameter %d: %s", fn, i, tfm_last_error());
        TFM__TRY(tfm__same_device(fn, (int)ps[0].value.device, 4, &p->value, &p->grad, &p->m, &p->v));
        if (tfm_numel(&p->grad) != tfm_numel(&p->value) || tfm_numel(&p->m) != tfm_numel(&p->value) ||
            tfm_numel(&p->v) != tfm_numel(&p->value))
            return tfm__fail(TFM_E_SHAPE, "%s: parameter %d: value %s, grad %s, m %s and v %s differ in size", fn, i,
                             tfm__shp(&p->value), tfm__shp(&p->grad), tfm__shp(&p->m), tfm__shp(&p->v));
    }
    TFM__TRY(tfm__optim_resolve(fn, opt, step, &o));
    TFM__TRY(tfm__adamw_apply(fn, &o, ps, n, step, tfm__op_sumsq(ps[0].grad.device, ps, n), grad_norm));
    return tfm__cuda_check(fn);
}

TFMDEF tfm_result tfm_adamw_step(const tfm_adamw_param *ps, int n, const tfm_optim *opt, int64_t step,
                                 float *grad_norm) {
    return tfm__adamw_step("tfm_adamw_step", ps, n, opt, step, grad_norm);
}

/* Whether a model that trains keeps only a share of the AdamW moments (cfg.moment_shards). */
static int tfm__model_sharded(const tfm_model *m) {
    return m->impl->has_grad && m->impl->mom_hi - m->impl->mom_lo < (int64_t)(m->impl->n_param_bytes / sizeof(float));
}

/* TFM_E_ARG naming fn unless m is a built model that trains on its own (gradients, every moment); a
   model with sharded moments takes `instead` */
static tfm_result tfm__chk_trains(const char *fn, const tfm_model *m, const char *instead) {
    if (!m || !m->impl) return tfm__fail(TFM_E_ARG, "%s: model is NULL or not initialised", fn);
    if (!m->impl->has_grad) return tfm__fail(TFM_E_ARG, "%s: the model was built inference_only", fn);
    if (tfm__model_sharded(m))
        return tfm__fail(TFM_E_ARG, "%s: the model keeps a share of the moments (cfg.moment_shards %d): %s", fn,
                         m->cfg.moment_shards, instead);
    return TFM_OK;
}

TFMDEF tfm_result tfm_model_step(tfm_model *m, const tfm_optim *opt, float *grad_norm) {
    const char *fn = "tfm_model_step";
    if (grad_norm) *grad_norm = 0.0f;
    TFM__TRY(tfm__chk_trains(fn, m, "step it with tfm_dist_step"));
    TFM__TRY(tfm__adamw_step(fn, m->impl->adam, m->n_params, opt, m->step + 1, grad_norm));
    m->step++;
    return TFM_OK;
}

/* tfm_model_train_step launch by launch, under a resolved o: the forward, the gradients zeroed, the
   backward, the norm and AdamW (step not yet counted). */
static tfm_result tfm__train_step_run(tfm_model *m, const tfm_batch *b, const tfm_optim *o, float *loss, int64_t *n_counted,
                                      float *grad_norm) {
    const char *fn = "tfm_model_train_step";
    tfm__model_impl *mi = m->impl;
    tfm_result r = tfm__model_forward(m, b, loss, n_counted, 1);
    if (r == TFM_OK) {
        tfm_model_zero_grad(m);
        r = tfm__model_backward(m, 1.0f);
    }
    if (r != TFM_OK) return tfm__fail(r, "%s: %s", fn, tfm_last_error());
    TFM__TRY(tfm__adamw_apply(fn, o, mi->adam, m->n_params, m->step + 1, tfm__op_sumsq(mi->device, mi->adam, m->n_params),
                              grad_norm));
    return tfm__cuda_check(fn);
}

#if defined(TFM_CUDA)
/* tfm_model_train_step (o: its resolved optimizer) or tfm_model_forward (o NULL) on the GPU as one CUDA
   graph of that kind, in the model's slot: the last one's replayed after a dry run that matches its
   record, else a new capture (tfm__cuda_capture_begin); 1 when it ran, its result in *r; 0 when neither
   could be had (none of it has run, the model is as it was). The rows' losses and the squared norm come
   back once the graph has run: the same sums as launch by launch. */
static int tfm__model_graph(tfm_model *m, const tfm_batch *b, const tfm_optim *o, float *loss, int64_t *n_counted,
                            float *grad_norm, tfm_result *r) {
    const char *fn = o ? "tfm_model_train_step" : "tfm_model_forward";
    tfm__model_impl *mi = m->impl;
    tfm_rng rng0 = mi->rng;
    int kind = m->cfg.kind, gk = tfm__cuda_slot(o ? TFM__CU_GRAPH_TRAIN : TFM__CU_GRAPH_FORWARD, mi), ok, dry;
    int64_t rows = !b->targets ? 0 : (int64_t)b->batch * (kind == TFM_MODEL_ENCODER_CLASSIFIER ? 1 : kind == TFM_MODEL_DECODER_LM ? b->len : b->tgt_len);
    double ss;
    if (rows && !tfm__cuda_host((size_t)rows)) return 0;
    for (dry = 1; dry >= 0; dry--) { /* a dry run (replay), else a capture */
        if (!tfm__cuda_capture_begin(gk, dry)) continue;
        ok = tfm__model_forward(m, b, NULL, NULL, o != NULL) == TFM_OK;
        if (ok && o) {
            tfm_model_zero_grad(m);
            ok = tfm__model_backward(m, 1.0f) == TFM_OK &&
                 tfm__adamw_apply(fn, o, mi->adam, m->n_params, m->step + 1, tfm__op_sumsq(mi->device, mi->adam, m->n_params),
                                  NULL) == TFM_OK;
        }
        if (!ok) tfm__cu.cap_failed = 1;
        if (tfm__cuda_capture_end(gk)) break;
        mi->rng = rng0;
    }
    if (dry < 0) return 0;
    (void)tfm__cuda_ok(cudaStreamSynchronize(0), o ? "cudaStreamSynchronize (a training step)" : "cudaStreamSynchronize (a forward pass)");
    if ((*r = tfm__cuda_check(fn)) != TFM_OK) {
        if (!o) mi->rng = rng0, mi->B = 0, mi->has_targets = 0; /* as tfm__model_forward's failure */
        return 1;
    }
    mi->last_loss = rows ? tfm__cu_loss_mean(tfm__cu.host, mi->targets, m->cfg.ignore_index, rows, n_counted) : 0.0f;
    if (!rows && n_counted) *n_counted = 0;
    if (loss) *loss = mi->last_loss;
    if (!o) return 1;
    ss = *tfm__cu.pin;
    if (grad_norm) *grad_norm = (float)sqrt(ss);
    *r = tfm__norm_check(fn, sqrt(ss)); /* not finite: the update kernels skipped it */
    return 1;
}
#endif

TFMDEF tfm_result tfm_model_train_step(tfm_model *m, const tfm_batch *batch, const tfm_optim *opt, float *loss,
                                       int64_t *n_counted, float *grad_norm) {
    const char *fn = "tfm_model_train_step";
    tfm_optim o;
    tfm_result r = TFM_OK;
    int prev, ran = 0;
    if (loss) *loss = 0.0f;
    if (n_counted) *n_counted = 0;
    if (grad_norm) *grad_norm = 0.0f;
    TFM__TRY(tfm__chk_trains(fn, m, "train it with tfm_model_forward, tfm_model_backward and tfm_dist_step"));
    TFM__TRY(tfm__chk_batch(fn, m, batch));
    if (!batch->targets) return tfm__fail(TFM_E_ARG, "%s: batch.targets is NULL: a training step needs a loss", fn);
    memset(&o, 0, sizeof o);
    TFM__TRY(tfm__optim_resolve(fn, opt, m->step + 1, &o));
    m->impl->grads_mean = 0; /* (the step's own gradients) */
    prev = tfm__prec_enter(m);
#if defined(TFM_CUDA)
    if (m->impl->device == TFM_DEVICE_CUDA && m->impl->warm)
        ran = tfm__model_graph(m, batch, &o, loss, n_counted, grad_norm, &r);
#endif
    if (!ran) r = tfm__train_step_run(m, batch, &o, loss, n_counted, grad_norm);
    if (r == TFM_OK) {
        m->step++;
        m->impl->warm = 1;
    }
    return tfm__prec_done(prev, r);
}

/* ==== >>impl-kv ==== the KV cache: sized per model, reset, reordered for beams */

/* Whether a model's decoder may go past its length when generating: a window keeps its cache's rows, and
   rotary positions need no table. */
static int tfm__rolls(const tfm_config *c) {
    return c->attn_window > 0 && c->pos == TFM_POS_ROPE;
}

/* tfm_kv_cache_init; kept: a generation call's own cache, on a GPU in the thread's space for it when that
   is free (tfm__cuda_kv_space). On a GPU, extra floats of device memory for the caller after the cache's
   (*xp; NULL on a CPU or with none), freed with it. */
static tfm_result tfm__kv_cache_make(tfm_kv_cache *c, const tfm_model *m, int max_batch, int max_len, int kept,
                                     int64_t extra, float **xp) {
    const char *fn = "tfm_kv_cache_init";
    int encdec, limit;
    size_t n_self, n_cross, bytes, fbytes, dbytes;
    unsigned char *p;
    void *dev = NULL;
    if (xp) *xp = NULL;
    if (!c || !m || !m->impl) return tfm__fail(TFM_E_ARG, "%s: cache or model is NULL, or the model is not initialised", fn);
    if (m->cfg.kind == TFM_MODEL_ENCODER_CLASSIFIER) return tfm__fail(TFM_E_ARG, "%s: a classifier has no decoder", fn);
    encdec = m->cfg.kind == TFM_MODEL_ENCODER_DECODER;
    limit = encdec ? m->cfg.max_tgt_len : m->cfg.max_len;
    if (max_batch < 0 || max_len < 0 || (max_len > limit && !tfm__rolls(&m->cfg)))
        return tfm__fail(TFM_E_ARG, "%s: max_batch %d must be >= 0 and max_len %d in [0,%d] (the model's limit; past it "
                         "only with cfg.attn_window and cfg.pos TFM_POS_ROPE)", fn, max_batch, max_len, limit);
    memset(c, 0, sizeof *c);
    c->n_layers = m->impl->n_dec;
    c->max_batch = max_batch ? max_batch : m->cfg.max_batch;
    c->max_len = max_len ? max_len : limit;
    if (m->cfg.attn_window) { /* the rolling cache: the sinks, then a ring of the window's rows */
        c->window = m->cfg.attn_window;
        c->sinks = m->cfg.attn_sinks;
        if ((int64_t)c->max_len > (int64_t)c->sinks + c->window) c->max_len = c->sinks + c->window;
    }
    c->max_src_len = encdec ? m->cfg.max_len : 0;
    c->d_model = m->cfg.d_model;
    c->kv_dim = m->cfg.n_kv_heads ? m->cfg.d_model / m->cfg.n_heads * m->cfg.n_kv_heads : m->cfg.d_model;
    c->device = m->impl->device;
    c->user = m->cfg.user;
    n_self = (size_t)c->n_layers * c->max_batch * c->max_len * 2 * c->kv_dim;
    n_cross = (size_t)c->n_layers * c->max_batch * c->max_src_len * 2 * c->kv_dim;
    /* the keys and values, then the rows' slots and lengths (+ reorder's scratch); on a GPU the floats are
       a device allocation of their own */
    fbytes = c->device == TFM_DEVICE_CUDA ? 0 : (n_self + n_cross) * sizeof(float);
    bytes = fbytes + 6 * (size_t)c->max_batch * sizeof(int32_t);
    dbytes = (n_self + n_cross + (size_t)extra) * sizeof(float); /* the caller's floats after the cache's */
    if (c->device == TFM_DEVICE_CUDA) {
        tfm_result r = TFM_OK;
#if defined(TFM_CUDA)
        if (kept) r = tfm__cuda_kv_space(fn, &dev, dbytes);
        c->kept = dev != NULL;
#else
        (void)kept;
#endif
        if (r == TFM_OK && !dev) r = tfm__dev_alloc(fn, &dev, dbytes);
        if (r != TFM_OK) {
            memset(c, 0, sizeof *c);
            return r;
        }
    }
    p = (unsigned char *)TFM_MALLOC(bytes, m->cfg.user);
    if (!p) {
        c->self_kv = (float *)dev;
        tfm_kv_cache_free(c); /* (its device memory freed, or the thread's space given back) */
        return tfm__fail(TFM_E_NOMEM, "%s: could not allocate %zu bytes", fn, bytes);
    }
    c->owned = p;
    c->self_kv = dev ? (float *)dev : (float *)p;
    c->cross_kv = n_cross ? c->self_kv + n_self : NULL;
    if (xp && dev && extra > 0) *xp = (float *)dev + n_self + n_cross;
    c->slot = (int32_t *)(p + fbytes);
    c->lens = c->slot + c->max_batch;
    c->src_lens = c->lens + c->max_batch;
    tfm_kv_cache_reset(c);
    return TFM_OK;
}

TFMDEF tfm_result tfm_kv_cache_init(tfm_kv_cache *c, const tfm_model *m, int max_batch, int max_len) {
    return tfm__kv_cache_make(c, m, max_batch, max_len, 0, 0, NULL);
}

TFMDEF void tfm_kv_cache_free(tfm_kv_cache *c) {
    if (!c) return;
    if (c->owned) TFM_FREE(c->owned, c->user);
#if defined(TFM_CUDA)
    if (c->kept) tfm__cuda_kv_done();
    else
#endif
    if (c->device == TFM_DEVICE_CUDA) tfm__dev_free(c->self_kv);
    memset(c, 0, sizeof *c);
}

TFMDEF void tfm_kv_cache_reset(tfm_kv_cache *c) {
    int b;
    if (!c || !c->slot) return;
    c->src_len = c->has_src_lens = 0;
    for (b = 0; b < c->max_batch; b++) {
        c->slot[b] = b;
        c->lens[b] = 0;
    }
}

/* tfm_kv_cache_reorder, leaving a CUDA failure for the caller's check (generation's calls). */
static tfm_result tfm__kv_reorder(tfm_kv_cache *c, const int32_t *from, int n) {
    const char *fn = "tfm_kv_cache_reorder";
    int32_t *old_slot, *old_lens, *old_src_lens, *used;
    int i, j, L, free_slot = 0;
    if (!c || !c->slot || !from) return tfm__fail(TFM_E_ARG, "%s: cache or from is NULL", fn);
    if (n < 1 || n > c->max_batch) return tfm__fail(TFM_E_ARG, "%s: n %d must be in [1,%d] (max_batch)", fn, n, c->max_batch);
    for (i = 0; i < n; i++)
        if (from[i] < 0 || from[i] >= c->max_batch)
            return tfm__fail(TFM_E_ARG, "%s: from[%d] = %d is outside [0,%d)", fn, i, (int)from[i], c->max_batch);
    old_slot = c->src_lens + c->max_batch; /* scratch after the lengths, in the cache's own allocation */
    old_lens = old_slot + c->max_batch;
    old_src_lens = old_lens + c->max_batch;
    memcpy(old_slot, c->slot, (size_t)c->max_batch * sizeof(int32_t));
    memcpy(old_lens, c->lens, (size_t)c->max_batch * sizeof(int32_t));
    memcpy(old_src_lens, c->src_lens, (size_t)c->max_batch * sizeof(int32_t));
    used = c->src_lens; /* reused as a flag per slot until the lengths are written back below */
    for (j = 0; j < c->max_batch; j++) used[j] = 0;
    /* the first row to take a slot keeps it; later rows copy it into a slot no new row uses */
    for (i = 0; i < n; i++) {
        int32_t s = old_slot[from[i]];
        if (!used[s]) {
            used[s] = 1;
            c->slot[i] = s;
        } else {
            c->slot[i] = -1;
        }
    }
    for (i = 0; i < n; i++) {
        int32_t s = old_slot[from[i]];
        if (c->slot[i] >= 0) continue;
        while (used[free_slot]) free_slot++;
        used[free_slot] = 1;
        c->slot[i] = free_slot;
        for (L = 0; L < c->n_layers; L++) {
            int64_t C2 = 2 * (int64_t)c->kv_dim, sz = (int64_t)c->max_len * C2, szc = (int64_t)c->max_src_len * C2;
            float *self = c->self_kv + (int64_t)L * c->max_batch * sz;
            tfm__op_copy(c->device, self + free_slot * sz, self + s * sz, TFM__MIN(old_lens[from[i]], c->max_len) * C2);
            if (c->cross_kv) {
                float *cr = c->cross_kv + (int64_t)L * c->max_batch * szc;
                tfm__op_copy(c->device, cr + free_slot * szc, cr + s * szc, (int64_t)c->src_len * C2);
            }
        }
    }
    /* slots no row uses (rows dropped) go after the n live rows */
    for (j = 0, i = n; i < c->max_batch; j++)
        if (!used[j]) c->slot[i++] = j;
    for (i = 0; i < c->max_batch; i++) {
        c->lens[i] = i < n ? old_lens[from[i]] : 0;
        c->src_lens[i] = i < n ? old_src_lens[from[i]] : 0;
    }
    return TFM_OK;
}

TFMDEF tfm_result tfm_kv_cache_reorder(tfm_kv_cache *c, const int32_t *from, int n) {
    TFM__TRY(tfm__kv_reorder(c, from, n));
    return tfm__cuda_check("tfm_kv_cache_reorder");
}

/* Rows r0.. of a cache as a cache of their own, over the same memory: the rows one decoding call takes. */
static tfm_kv_cache tfm__kv_rows(const tfm_kv_cache *kc, int r0) {
    tfm_kv_cache v = *kc;
    v.slot += r0;
    v.lens += r0;
    v.src_lens += r0;
    return v;
}

/* ==== >>impl-generate ==== decoding with the cache: sampling, batched generation, scoring and beam search */

/* Decode ids (B,n) with every layer's cache, row b at positions kc->lens[b]..: the same block code as
   training, on the new rows only. n_ids (NULL: n for every row): row b holds n_ids[b] ids, padded to n
   (an uneven prompt; the padding's keys land past the row's positions, where the next ids overwrite
   them). memory (B,S,C): an encoder-decoder's source, read on the first call. Writes the logits of
   each row's last id to logits (B,V) and advances kc->lens[b] by its ids. A cache of more rows than
   cfg.max_batch (a wide beam) is decoded max_batch rows at a time, each chunk through a view of the
   cache whose slots start at its first row; memory is then already in the cache.
   A rolling cache's ring holds one window: several new positions at once must fit its rows, else each
   query would find keys of the window of later ones in their place. So when some row would pass them,
   the rows go one by one, the ids that fill the rows in one call, then the rest one call each. */
static void tfm__decode_into(tfm_model *m, tfm_kv_cache *kc, const int32_t *ids, int B, int n, const int *n_ids,
                             const float *memory, int S, float *logits) {
    const tfm_config *c = &m->cfg;
    int encdec = c->kind == TFM_MODEL_ENCODER_DECODER, r0, nb, b;
    int64_t C = c->d_model, V = encdec ? c->tgt_vocab_size : c->vocab_size;
    for (b = 0; kc->window && n > 1 && b < B && kc->lens[b] + n <= kc->max_len; b++) {}
    if (b < B && kc->window && n > 1) {
        for (b = 0; b < B; b++) {
            tfm_kv_cache one = tfm__kv_rows(kc, b);
            int nb_ids = n_ids ? n_ids[b] : n, c0, np;
            for (c0 = 0; c0 < nb_ids; c0 += np) {
                np = one.lens[0] < one.max_len ? TFM__MIN(nb_ids - c0, one.max_len - one.lens[0]) : 1;
                tfm__decode_into(m, &one, ids + (int64_t)b * n + c0, 1, np, NULL, memory ? memory + (int64_t)b * S * C : NULL,
                                 S, logits + (int64_t)b * V);
            }
        }
        if (encdec && !kc->src_len) kc->src_len = S;
        return;
    }
    for (r0 = 0; r0 < B; r0 += nb) {
        tfm_kv_cache part = tfm__kv_rows(kc, r0);
        float *h;
        nb = TFM__MIN(B - r0, c->max_batch);
        /* the decoder's output is this call's own buffer, which nothing reads after it (see below) */
        h = (float *)tfm__decoder_fwd(m, ids + (int64_t)r0 * n, NULL, NULL, nb, n, memory ? memory + (int64_t)r0 * S * C : NULL,
                                      kc->src_len ? kc->src_len : S, kc->has_src_lens ? part.src_lens : NULL, &part);
        /* the head on each row's last id, as rows of stride n*C from row n-1: a shorter row's last id is
           first moved there, over its padding's output */
        for (b = r0; n_ids && b < r0 + nb; b++)
            if (n_ids[b] < n)
                tfm__op_copy(m->impl->device, h + ((int64_t)(b - r0) * n + n - 1) * C,
                             h + ((int64_t)(b - r0) * n + n_ids[b] - 1) * C, C);
        tfm__op_linear(m->impl->device, logits + (int64_t)r0 * V, V, h + (n - 1) * C, n * C, m->impl->head.weight.data,
                       NULL, nb, C, V, 0);
    }
    for (b = 0; b < B; b++) kc->lens[b] += n_ids ? n_ids[b] : n;
    if (encdec && !kc->src_len) kc->src_len = S;
}

/* The model's first n logits where the host reads them: its own (CPU) or their staging copy (CUDA). */
static float *tfm__host_logits(tfm_model *m, int64_t n) {
    tfm__model_stage(m->impl, m->impl->logits, n, 1);
    return (float *)tfm__model_host(m->impl, m->impl->logits);
}

/* One decoding step: tfm__decode_into of one id for each of B rows. On the GPU as one CUDA graph where
   it can be: the last step's replayed after a dry run that matches its record, else a new capture
   (tfm__cuda_capture_begin); when either fails none of it has run, and the step goes on from the
   cache's lengths before it. */
static void tfm__decode_step(tfm_model *m, tfm_kv_cache *kc, const int32_t *ids, int B, const float *memory, int S,
                             float *logits) {
#if defined(TFM_CUDA)
    int src_len = kc->src_len, b, dry;
    for (dry = 1; m->impl->device == TFM_DEVICE_CUDA && dry >= 0; dry--) { /* a dry run (replay), else a capture */
        if (!tfm__cuda_capture_begin(TFM__CU_GRAPH_DECODE, dry)) continue;
        tfm__decode_into(m, kc, ids, B, 1, NULL, memory, S, logits);
        if (tfm__cuda_capture_end(TFM__CU_GRAPH_DECODE)) return;
        for (b = 0; b < B; b++) kc->lens[b]--;
        kc->src_len = src_len;
    }
#endif
    tfm__decode_into(m, kc, ids, B, 1, NULL, memory, S, logits);
}

/* One sampling candidate: a token's probability and id (top-k and top-p sort these). */
typedef struct tfm__cand { double p; int32_t id; } tfm__cand;

/* likelier first; equal probabilities: lower id first */
static int tfm__cand_cmp(const void *a, const void *b) {
    const tfm__cand *x = (const tfm__cand *)a, *y = (const tfm__cand *)b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int tfm__is_stop(const tfm_gen_opts *o, int32_t t) {
    int i;
    if (o->has_stop && t == o->stop_token) return 1;
    for (i = 0; i < o->n_stop; i++)
        if (o->stop_tokens[i] == t) return 1;
    return 0;
}

/* The next token from one row's logits (V, clobbered): the repetition penalty on the tokens seen
   (seen may be NULL), then the argmax (temperature 0) or a sample as tfm_gen_opts describes it, in
   double precision. p (V) and cand (V) are work space. */
static int32_t tfm__pick(float *logits, int64_t V, const tfm_gen_opts *o, tfm_rng *rng, const unsigned char *seen,
                         double *p, tfm__cand *cand) {
    int64_t j, best, n_keep;
    double mx, sum = 0.0, cum = 0.0, r;
    float rp = o->repetition_penalty;
    int topk = o->top_k > 0 && o->top_k < V, topp = o->top_p > 0.0f && o->top_p < 1.0f;
    if (seen && rp > 0.0f && rp != 1.0f)
        for (j = 0; j < V; j++)
            if (seen[j]) logits[j] = logits[j] > 0.0f ? logits[j] / rp : logits[j] * rp;
    best = tfm__argmax_cpu(logits, V);
    if (o->temperature <= 0.0f) return (int32_t)best;
    mx = logits[best];
    for (j = 0; j < V; j++) p[j] = exp(((double)logits[j] - mx) / (double)o->temperature);
    if (topk || topp) {
        /* sort only the tokens of p >= 1e-4 (the likeliest has 1) when they hold what the filters keep: the
           k likeliest, or (top_p alone) the mass top_p asks for; else every token */
        int64_t n = 0;
        double all = 0.0, mass = 0.0;
        for (j = 0; j < V; j++) {
            all += p[j];
            if (p[j] >= 1e-4) {
                cand[n].p = p[j];
                cand[n++].id = (int32_t)j;
                mass += p[j];
            }
        }
        if (topk ? n < o->top_k : mass < (double)o->top_p * all) {
            for (j = 0; j < V; j++) {
                cand[j].p = p[j];
                cand[j].id = (int32_t)j;
            }
            n = V;
        }
        qsort(cand, (size_t)n, sizeof *cand, tfm__cand_cmp);
        n_keep = n;
        if (topk) { /* the k likeliest, and any tied with the k-th */
            n_keep = o->top_k;
            while (n_keep < n && cand[n_keep].p == cand[o->top_k - 1].p) n_keep++;
        }
        if (topp) { /* the shortest prefix whose mass reaches top_p of the mass kept so far */
            double tot = 0.0, acc = 0.0, want;
            if (topk)
                for (j = 0; j < n_keep; j++) tot += cand[j].p;
            else tot = all;
            want = (double)o->top_p * tot;
            for (j = 0; j < n_keep; j++) {
                acc += cand[j].p;
                if (acc >= want) break;
            }
            if (j < n_keep) n_keep = j + 1;
        }
        for (j = 0; j < V; j++) p[j] = 0.0;
        for (j = 0; j < n_keep; j++) p[cand[j].id] = cand[j].p;
    }
    if (o->min_p > 0.0f) /* the likeliest token has p = 1 */
        for (j = 0; j < V; j++)
            if (p[j] < (double)o->min_p) p[j] = 0.0;
    for (j = 0; j < V; j++) sum += p[j];
    r = (double)tfm_rng_uniform(rng) * sum;
    for (j = 0; j < V; j++) {
        cum += p[j];
        if (p[j] > 0.0 && cum > r) return (int32_t)j;
    }
    for (j = V - 1; j > 0 && p[j] == 0.0; j--) {}
    return (int32_t)j; /* rounding left r at the total: the last kept token */
}

/* Checks shared by the generation calls: the model, opts and the decoder's vocabulary *V. */
static tfm_result tfm__chk_gen(const char *fn, const tfm_model *m, const tfm_gen_opts *o, int64_t *V) {
    const tfm_config *c;
    int i;
    if (!m || !m->impl) return tfm__fail(TFM_E_ARG, "%s: model is NULL or not initialised", fn);
    c = &m->cfg;
    if (c->kind == TFM_MODEL_ENCODER_CLASSIFIER) return tfm__fail(TFM_E_ARG, "%s: a classifier does not generate", fn);
    if (c->input_dim)
        return tfm__fail(TFM_E_ARG, "%s: the model reads continuous inputs (cfg.input_dim); generation takes token ids", fn);
    *V = c->kind == TFM_MODEL_ENCODER_DECODER ? c->tgt_vocab_size : c->vocab_size;
    if (!o) return tfm__fail(TFM_E_ARG, "%s: opts is NULL", fn);
    if (o->max_new <= 0) return tfm__fail(TFM_E_ARG, "%s: opts.max_new is %d: required, > 0", fn, o->max_new);
    if (!(o->temperature >= 0.0f) || !isfinite(o->temperature))
        return tfm__fail(TFM_E_ARG, "%s: opts.temperature %g must be finite and >= 0", fn, (double)o->temperature);
    if (o->top_k < 0 || o->top_k > *V)
        return tfm__fail(TFM_E_ARG, "%s: opts.top_k %d is outside [0,%lld] (the vocabulary)", fn, o->top_k, (long long)*V);
    if (!(o->top_p >= 0.0f && o->top_p <= 1.0f))
        return tfm__fail(TFM_E_ARG, "%s: opts.top_p %g is outside [0,1]", fn, (double)o->top_p);
    if (!(o->min_p >= 0.0f && o->min_p <= 1.0f))
        return tfm__fail(TFM_E_ARG, "%s: opts.min_p %g is outside [0,1]", fn, (double)o->min_p);
    if (!(o->repetition_penalty >= 0.0f) || !isfinite(o->repetition_penalty))
        return tfm__fail(TFM_E_ARG, "%s: opts.repetition_penalty %g must be finite and >= 0", fn, (double)o->repetition_penalty);
    if (!isfinite(o->length_penalty))
        return tfm__fail(TFM_E_ARG, "%s: opts.length_penalty %g is not finite", fn, (double)o->length_penalty);
    if (o->has_stop && (o->stop_token < 0 || o->stop_token >= *V))
        return tfm__fail(TFM_E_ARG, "%s: opts.stop_token %d is outside [0,%lld)", fn, o->stop_token, (long long)*V);
    if (o->n_stop < 0 || (o->n_stop > 0 && !o->stop_tokens))
        return tfm__fail(TFM_E_ARG, "%s: opts.n_stop %d with stop_tokens %s", fn, o->n_stop, o->stop_tokens ? "set" : "NULL");
    for (i = 0; i < o->n_stop; i++)
        if (o->stop_tokens[i] < 0 || o->stop_tokens[i] >= *V)
            return tfm__fail(TFM_E_ARG, "%s: opts.stop_tokens[%d] = %d is outside [0,%lld)", fn, i, (int)o->stop_tokens[i],
                             (long long)*V);
    return TFM_OK;
}

/* Checks B rows of decoder prompts (and, for an encoder-decoder, sources) as generation takes them; each
   prompt plus `extra` positions must fit the decoder, or with `cached` (decoding with a cache) a model
   that rolls (tfm__rolls) may pass its length: the prompt itself still fits it. */
static tfm_result tfm__chk_gen_rows(const char *fn, const tfm_model *m, int B, const int32_t *const *srcs,
                                    const int *src_lens, const int32_t *const *prompts, const int *n_prompts, int extra,
                                    int cached) {
    const tfm_config *c = &m->cfg;
    int encdec = c->kind == TFM_MODEL_ENCODER_DECODER, limit = encdec ? c->max_tgt_len : c->max_len, b;
    int64_t V = encdec ? c->tgt_vocab_size : c->vocab_size, most = cached && tfm__rolls(c) ? 2147483647 : limit;
    if (!prompts || !n_prompts) return tfm__fail(TFM_E_ARG, "%s: prompt is NULL", fn);
    if (encdec && (!srcs || !src_lens)) return tfm__fail(TFM_E_ARG, "%s: an encoder-decoder needs src", fn);
    if (!encdec && srcs) return tfm__fail(TFM_E_ARG, "%s: src given to a decoder-only model", fn);
    for (b = 0; b < B; b++) {
        if (n_prompts[b] < 1 || n_prompts[b] > limit || (int64_t)n_prompts[b] + extra > most)
            return tfm__fail(TFM_E_ARG, "%s: row %d: %d prompt ids + %d new must be in [1,%lld] (cfg.%s%s)", fn, b,
                             n_prompts[b], extra, (long long)most, encdec ? "max_tgt_len" : "max_len",
                             most > limit ? ": a rolling window cache; the prompt within the length"
                             : cached && c->attn_window ? "; a windowed model generates past it only with cfg.pos "
                               "TFM_POS_ROPE, not a learned position table" : "");
        TFM__TRY(tfm__chk_rows(fn, "prompt", prompts[b], 1, n_prompts[b], n_prompts[b], V, 0, 0));
        if (encdec) {
            if (src_lens[b] < 1 || src_lens[b] > c->max_len)
                return tfm__fail(TFM_E_ARG, "%s: row %d: src_len %d is outside [1,%d] (cfg.max_len)", fn, b, src_lens[b],
                                 c->max_len);
            TFM__TRY(tfm__chk_rows(fn, "src", srcs[b], 1, src_lens[b], src_lens[b], c->vocab_size, 0, 0));
        }
    }
    return TFM_OK;
}

/* Encode B sources of different lengths into a cache, row b from source order[b] (padded to the longest,
   with per-row key lengths): returns the encoder's output (B,S,C), *S its length. ids (B*S) and lens (B)
   are work space. */
static const float *tfm__gen_encode(tfm_model *m, tfm_kv_cache *kc, int B, const int32_t *const *srcs,
                                    const int *src_lens, const int32_t *order, int32_t *ids, int32_t *lens, int *S) {
    int b, i, s = 0;
    for (b = 0; b < B; b++) s = TFM__MAX(s, src_lens[b]);
    for (b = 0; b < B; b++) {
        int r = order[b];
        for (i = 0; i < s; i++) ids[(int64_t)b * s + i] = i < src_lens[r] ? srcs[r][i] : 0;
        lens[b] = kc->src_lens[b] = src_lens[r];
    }
    kc->has_src_lens = 1;
    *S = s;
    return tfm__encoder_fwd(m, ids, NULL, NULL, B, s, lens);
}

static void tfm__gen_begin(tfm_model *m, int *was_training) {
    *was_training = m->impl->training;
    m->impl->logits_bf = 0; /* (the call writes its own logits, in fp32) */
    m->impl->training = 0;
}

static void tfm__gen_end(tfm_model *m, int was_training) {
    m->impl->training = was_training;
    m->impl->gen_replaced = 1; /* the layers' saved activations are the last decoding step's now */
    m->impl->has_targets = 0;
}

static tfm_result tfm__generate_run(const char *fn, tfm_model *m, int B, const int32_t *const *srcs,
                                    const int *src_lens, const int32_t *const *prompts, const int *n_prompts,
                                    const tfm_gen_opts *opts, int32_t *out, int out_stride, int *n_out) {
    tfm_gen_opts o;
    tfm_kv_cache kc;
    const float *memory = NULL;
    int encdec, b, i, j, g0, g1, S = 0, p_max = 0, nact, was_training, penal, greedy;
    int64_t V = 0, src_max = 0;
    size_t bytes;
    unsigned char *work, *seen = NULL;
    double *p;
    tfm__cand *cand;
    tfm_rng *rng;
    int32_t *ids, *act, *from, *tok, *lens, *n_ids, *picked;
    tfm_result r;
    if (n_out && B > 0)
        for (b = 0; b < B; b++) n_out[b] = 0;
    TFM__TRY(tfm__chk_gen(fn, m, opts, &V));
    o = *opts;
    encdec = m->cfg.kind == TFM_MODEL_ENCODER_DECODER;
    if (B < 1 || B > m->cfg.max_batch)
        return tfm__fail(B < 1 ? TFM_E_ARG : TFM_E_SHAPE, "%s: %d rows is outside [1,%d] (cfg.max_batch)", fn, B,
                         m->cfg.max_batch);
    if (!out || !n_out) return tfm__fail(TFM_E_ARG, "%s: out or n_out is NULL", fn);
    if (out_stride < o.max_new)
        return tfm__fail(TFM_E_ARG, "%s: out_stride %d is less than opts.max_new %d", fn, out_stride, o.max_new);
    TFM__TRY(tfm__chk_gen_rows(fn, m, B, srcs, src_lens, prompts, n_prompts, o.max_new, 1));
    TFM__TRY(tfm__scratch_reserve(fn));
    for (b = 0; b < B; b++) {
        p_max = TFM__MAX(p_max, n_prompts[b]);
        if (encdec) src_max = TFM__MAX(src_max, src_lens[b]);
    }
    penal = o.repetition_penalty > 0.0f && o.repetition_penalty != 1.0f;
    /* greedy without a penalty: each row's argmax where the logits are, and only the ids come back */
    greedy = o.temperature <= 0.0f && !penal && V <= ((int64_t)1 << 24);
    bytes = (size_t)V * (sizeof(double) + sizeof(tfm__cand)) + (size_t)B * sizeof(tfm_rng) +
            ((size_t)B * TFM__MAX(p_max, src_max) + 6 * (size_t)B) * sizeof(int32_t) + (penal ? (size_t)B * V : 0);
    work = (unsigned char *)TFM_MALLOC(bytes, m->cfg.user);
    if (!work) return tfm__fail(TFM_E_NOMEM, "%s: could not allocate %zu bytes", fn, bytes);
    p = (double *)work;
    cand = (tfm__cand *)(p + V);
    rng = (tfm_rng *)(cand + V);
    ids = (int32_t *)(rng + B);
    act = ids + (size_t)B * TFM__MAX(p_max, src_max);
    from = act + B;
    tok = from + B;
    lens = tok + B;
    n_ids = lens + B;
    picked = n_ids + B;
    if (penal) seen = (unsigned char *)(picked + B);
    r = tfm__kv_cache_make(&kc, m, B, p_max + o.max_new - 1, 1, 0, NULL);
    if (r != TFM_OK) {
        TFM_FREE(work, m->cfg.user);
        return tfm__fail(r, "%s: %s", fn, tfm_last_error());
    }
    tfm__gen_begin(m, &was_training);
    /* the cache's row i decodes the request act[i]: shortest prompt first */
    for (b = 0; b < B; b++) {
        for (i = b; i > 0 && n_prompts[act[i - 1]] > n_prompts[b]; i--) act[i] = act[i - 1];
        act[i] = b;
        tfm_rng_seed(&rng[b], o.seed + (uint64_t)b);
        if (seen) {
            memset(seen + (size_t)b * V, 0, (size_t)V);
            for (i = 0; i < n_prompts[b]; i++) seen[(size_t)b * V + prompts[b][i]] = 1;
        }
    }
    for (i = 0; i < B; i++) n_ids[i] = n_prompts[act[i]];
    if (encdec) memory = tfm__gen_encode(m, &kc, B, srcs, src_lens, act, ids, lens, &S);
    /* the prompts in groups of rows, each group's padded to its longest (a group grows while its padding
       is at most its ids), then one new token per row and step, each row at its own positions */
    for (g0 = 0; g0 < B; g0 = g1) {
        tfm_kv_cache part = tfm__kv_rows(&kc, g0);
        int64_t real = 0, n;
        for (g1 = g0; g1 < B && (int64_t)(g1 - g0 + 1) * n_ids[g1] <= 2 * (real + n_ids[g1]); g1++) real += n_ids[g1];
        n = n_ids[g1 - 1];
        for (i = g0; i < g1; i++)
            for (j = 0; j < n; j++) ids[(i - g0) * n + j] = j < n_ids[i] ? prompts[act[i]][j] : 0;
        tfm__decode_into(m, &part, ids, g1 - g0, (int)n, n_ids + g0, memory ? memory + (int64_t)g0 * S * m->cfg.d_model : NULL,
                         S, m->impl->logits + (int64_t)g0 * V);
    }
    if (encdec) kc.src_len = S;
    nact = B;
    for (;;) {
        int nn = 0, dropped = 0;
        float *lg = NULL;
        if (greedy) tfm__op_argmax(m->impl->device, picked, m->impl->logits, nact, V);
        else lg = tfm__host_logits(m, (int64_t)nact * V);
        for (i = 0; i < nact; i++) {
            int32_t t;
            int stop;
            b = act[i];
            t = lg ? tfm__pick(lg + (int64_t)i * V, V, &o, &rng[b], seen ? seen + (size_t)b * V : NULL, p, cand)
                   : picked[i];
            out[(int64_t)b * out_stride + n_out[b]++] = t;
            if (seen) seen[(size_t)b * V + t] = 1;
            stop = tfm__is_stop(&o, t) || n_out[b] == o.max_new;
            if (o.on_token && o.on_token(o.on_token_user, b, t)) stop = 1;
            if (stop) {
                dropped = 1;
                continue;
            }
            from[nn] = i;
            tok[nn] = t;
            act[nn++] = b;
        }
        if (nn == 0) break;
        if (dropped) tfm__kv_reorder(&kc, from, nn); /* the rows that go on, in place */
        nact = nn;
        tfm__decode_step(m, &kc, tok, nact, memory, S, m->impl->logits);
    }
    tfm_kv_cache_free(&kc);
    TFM_FREE(work, m->cfg.user);
    tfm__gen_end(m, was_training);
    return tfm__scratch_check(fn);
}

/* A generation call's scope: the model's precision (tfm__prec_enter) and a bf16 model's weights on the
   GPU rounded once for the call's products (tfm__bf16_w); tfm__gen_done restores both. */
typedef struct tfm__gen_scope { int prec; tfm__bf16_twin w; } tfm__gen_scope;
static tfm__gen_scope tfm__gen_enter(const tfm_model *m) {
    tfm__gen_scope s;
    s.prec = tfm__prec_enter(m);
    s.w = tfm__bf16_w;
#if defined(TFM_CUDA)
    if (m && m->impl && m->impl->device == TFM_DEVICE_CUDA && m->cfg.precision == TFM_PREC_BF16 && !tfm__bf16_acts_off &&
        !tfm__bf16_w.bf)
        tfm__bf16_w = tfm__bf16_weights_cuda((const float *)(const void *)m->impl->dev_mem,
                                             (int64_t)(m->impl->n_param_bytes / sizeof(float)));
#endif
    return s;
}
static tfm_result tfm__gen_done(tfm__gen_scope s, tfm_result r) {
    tfm__bf16_w = s.w;
    return tfm__prec_done(s.prec, r);
}

static tfm_result tfm__generate(const char *fn, tfm_model *m, int B, const int32_t *const *srcs, const int *src_lens,
                                const int32_t *const *prompts, const int *n_prompts, const tfm_gen_opts *opts,
                                int32_t *out, int out_stride, int *n_out) {
    tfm__gen_scope s = tfm__gen_enter(m);
    return tfm__gen_done(s, tfm__generate_run(fn, m, B, srcs, src_lens, prompts, n_prompts, opts, out, out_stride, n_out));
}

TFMDEF tfm_result tfm_model_generate(tfm_model *m, const int32_t *src, int src_len, const int32_t *prompt, int n_prompt,
                                     const tfm_gen_opts *opts, int32_t *out, int *n_out) {
    int n = 0;
    tfm_result r;
    if (n_out) *n_out = 0;
    if (!prompt) return tfm__fail(TFM_E_ARG, "tfm_model_generate: prompt is NULL");
    r = tfm__generate("tfm_model_generate", m, 1, src ? &src : NULL, src ? &src_len : NULL, &prompt, &n_prompt, opts,
                      out, opts ? opts->max_new : 0, &n);
    if (n_out) *n_out = n;
    return r;
}

TFMDEF tfm_result tfm_model_generate_batch(tfm_model *m, int B, const int32_t *const *srcs, const int *src_lens,
                                           const int32_t *const *prompts, const int *n_prompts,
                                           const tfm_gen_opts *opts, int32_t *out, int out_stride, int *n_out) {
    return tfm__generate("tfm_model_generate_batch", m, B, srcs, src_lens, prompts, n_prompts, opts, out, out_stride, n_out);
}

/* log-softmax of one row of logits at index t, in double */
static double tfm__logp(const float *x, int64_t V, int64_t t) {
    double mx = x[0], s = 0.0;
    int64_t j;
    for (j = 1; j < V; j++)
        if (x[j] > mx) mx = x[j];
    for (j = 0; j < V; j++) s += exp((double)x[j] - mx);
    return (double)x[t] - mx - log(s);
}

static tfm_result tfm__model_score(tfm_model *m, const int32_t *src, int src_len, const int32_t *prompt, int n_prompt,
                                   const int32_t *target, int n_target, float *logp, float *total) {
    const char *fn = "tfm_model_score";
    const float *memory = NULL, *h, *lg;
    int encdec, was_training, T, i, i0, nr, S = 0;
    int64_t V, C;
    int32_t *seq;
    double sum = 0.0;
    if (total) *total = 0.0f;
    if (!m || !m->impl) return tfm__fail(TFM_E_ARG, "%s: model is NULL or not initialised", fn);
    if (m->cfg.kind == TFM_MODEL_ENCODER_CLASSIFIER) return tfm__fail(TFM_E_ARG, "%s: a classifier has no decoder", fn);
    if (m->cfg.input_dim)
        return tfm__fail(TFM_E_ARG, "%s: the model reads continuous inputs (cfg.input_dim); scoring takes token ids", fn);
    encdec = m->cfg.kind == TFM_MODEL_ENCODER_DECODER;
    V = encdec ? m->cfg.tgt_vocab_size : m->cfg.vocab_size;
    C = m->cfg.d_model;
    if (!target || n_target < 1) return tfm__fail(TFM_E_ARG, "%s: target is NULL or n_target %d < 1", fn, n_target);
    TFM__TRY(tfm__chk_gen_rows(fn, m, 1, src ? &src : NULL, src ? &src_len : NULL, prompt ? &prompt : NULL, &n_prompt,
                               n_target - 1, 0));
    TFM__TRY(tfm__chk_rows(fn, "target", target, 1, n_target, n_target, V, 0, 0));
    TFM__TRY(tfm__scratch_reserve(fn));
    T = n_prompt + n_target - 1;
    seq = (int32_t *)TFM_MALLOC((size_t)T * sizeof(int32_t), m->cfg.user);
    if (!seq) return tfm__fail(TFM_E_NOMEM, "%s: could not allocate %zu bytes", fn, (size_t)T * sizeof(int32_t));
    memcpy(seq, prompt, (size_t)n_prompt * sizeof(int32_t));
    if (n_target > 1) memcpy(seq + n_prompt, target, (size_t)(n_target - 1) * sizeof(int32_t));
    tfm__gen_begin(m, &was_training);
    if (encdec) {
        memory = tfm__encoder_fwd(m, src, NULL, NULL, 1, src_len, NULL);
        S = src_len;
    }
    h = tfm__decoder_fwd(m, seq, NULL, NULL, 1, T, memory, S, NULL, NULL);
    /* the head on the rows that predict the target: n_prompt-1 .. T-1, max_batch rows at a time when the
       model holds only that many (cfg.last_logits) */
    for (i0 = 0; i0 < n_target; i0 += nr) {
        nr = m->cfg.last_logits ? TFM__MIN(n_target - i0, m->cfg.max_batch) : n_target;
        tfm__op_linear(m->impl->device, m->impl->logits, V, h + (int64_t)(n_prompt - 1 + i0) * C, C,
                       m->impl->head.weight.data, NULL, nr, C, V, 0);
        lg = tfm__host_logits(m, (int64_t)nr * V);
        for (i = i0; i < i0 + nr; i++) {
            double lp = tfm__logp(lg + (int64_t)(i - i0) * V, V, target[i]);
            if (logp) logp[i] = (float)lp;
            sum += lp;
        }
    }
    if (total) *total = (float)sum;
    TFM_FREE(seq, m->cfg.user);
    tfm__gen_end(m, was_training);
    return tfm__scratch_check(fn);
}

TFMDEF tfm_result tfm_model_score(tfm_model *m, const int32_t *src, int src_len, const int32_t *prompt, int n_prompt,
                                  const int32_t *target, int n_target, float *logp, float *total) {
    int prev = tfm__prec_enter(m);
    return tfm__prec_done(prev, tfm__model_score(m, src, src_len, prompt, n_prompt, target, n_target, logp, total));
}

/* The ended hypotheses of a beam search: the best K by length-penalised score (norm). */
typedef struct tfm__hyps {
    int K, max_new, n, n_ended;
    float alpha;
    int32_t *tok, *len; /* (K, max_new), (K) */
    double *score, *norm;
} tfm__hyps;

/* A hypothesis ends: prefix (n ids) then last, of total log-probability score. */
static void tfm__hyps_add(tfm__hyps *h, const int32_t *prefix, int n, int32_t last, double score) {
    double norm = h->alpha != 0.0f ? score / pow((5.0 + (n + 1)) / 6.0, (double)h->alpha) : score;
    int i, at = h->n;
    h->n_ended++;
    if (h->n == h->K) { /* full: replace the worst, if this one is better */
        at = 0;
        for (i = 1; i < h->K; i++)
            if (h->norm[i] < h->norm[at]) at = i;
        if (!(norm > h->norm[at])) return;
    } else {
        h->n++;
    }
    if (n) memcpy(h->tok + (int64_t)at * h->max_new, prefix, (size_t)n * sizeof(int32_t));
    h->tok[(int64_t)at * h->max_new + n] = last;
    h->len[at] = n + 1;
    h->score[at] = score;
    h->norm[at] = norm;
}

static tfm_result tfm__model_beam_search(tfm_model *m, const int32_t *src, int src_len, const int32_t *prompt,
                                         int n_prompt, const tfm_gen_opts *opts, int n_best, int32_t *out,
                                         int out_stride, int *lens, float *scores, int *n_found) {
    const char *fn = "tfm_model_beam_search";
    tfm_kv_cache kc;
    tfm__hyps hy;
    const float *memory = NULL;
    int K, encdec, t, i, c, n_live = 1, N2, S = 0, was_training, max_new;
    int64_t V = 0, v;
    size_t bytes;
    unsigned char *work;
    double *live_score, *new_score, *cs;
    float *logits, *dlog; /* the beams' logits on the host, and where the model writes them (the same on a CPU) */
    int32_t *live_tok, *new_tok, *cpar, *ctok, *from, *next, *sw;
    tfm_result r;
    if (n_found) *n_found = 0;
    TFM__TRY(tfm__chk_gen(fn, m, opts, &V));
    encdec = m->cfg.kind == TFM_MODEL_ENCODER_DECODER;
    max_new = opts->max_new;
    K = opts->beam_width ? opts->beam_width : 4;
    if (K < 1 || K > V)
        return tfm__fail(TFM_E_ARG, "%s: opts.beam_width %d is outside [1,%lld] (the vocabulary)", fn, K, (long long)V);
    if (n_best < 1 || n_best > K) return tfm__fail(TFM_E_ARG, "%s: n_best %d is outside [1,%d] (the beam width)", fn, n_best, K);
    if (!out) return tfm__fail(TFM_E_ARG, "%s: out is NULL", fn);
    if (out_stride < max_new) return tfm__fail(TFM_E_ARG, "%s: out_stride %d is less than opts.max_new %d", fn, out_stride, max_new);
    TFM__TRY(tfm__chk_gen_rows(fn, m, 1, src ? &src : NULL, src ? &src_len : NULL, prompt ? &prompt : NULL, &n_prompt,
                               max_new, 1));
    TFM__TRY(tfm__scratch_reserve(fn));
    bytes = (size_t)K * (3 * max_new + 7) * sizeof(int32_t) + (size_t)K * 6 * sizeof(double) + (size_t)K * V * sizeof(float);
    work = (unsigned char *)TFM_MALLOC(bytes, m->cfg.user);
    if (!work) return tfm__fail(TFM_E_NOMEM, "%s: could not allocate %zu bytes", fn, bytes);
    live_score = (double *)work;
    new_score = live_score + K;
    cs = new_score + K;           /* (2K) candidate scores, best first */
    hy.score = cs + 2 * K;
    hy.norm = hy.score + K;
    logits = (float *)(hy.norm + K); /* (K,V): every beam's next-token logits, however many rows a step runs */
    live_tok = (int32_t *)(logits + (size_t)K * V);
    new_tok = live_tok + (size_t)K * max_new;
    hy.tok = new_tok + (size_t)K * max_new;
    hy.len = hy.tok + (size_t)K * max_new;
    cpar = hy.len + K;            /* (2K) candidates' parent rows and tokens */
    ctok = cpar + 2 * K;
    from = ctok + 2 * K;
    next = from + K;
    hy.K = K;
    hy.max_new = max_new;
    hy.n = hy.n_ended = 0;
    hy.alpha = opts->length_penalty;
    /* on a GPU the beams' logits go to device floats after the cache's (the thread's kept space: nothing
       allocated or freed a call) */
    if ((r = tfm__kv_cache_make(&kc, m, K, n_prompt + max_new - 1, 1, (int64_t)K * V, &dlog)) != TFM_OK) {
        TFM_FREE(work, m->cfg.user);
        return tfm__fail(r, "%s: %s", fn, tfm_last_error());
    }
    if (!dlog) dlog = logits;
    tfm__gen_begin(m, &was_training);
    if (encdec) {
        memory = tfm__encoder_fwd(m, src, NULL, NULL, 1, src_len, NULL);
        S = src_len;
    }
    tfm__decode_into(m, &kc, prompt, 1, n_prompt, NULL, memory, S, dlog);
    tfm__op_transfer(TFM_DEVICE_CPU, logits, m->impl->device, dlog, V);
    live_score[0] = 0.0;
    for (t = 0; t < max_new; t++) {
        int n_new = 0, nc = 0;
        /* the 2K best continuations of the live beams, by total log-probability; ties: lower row, then id */
        N2 = (int)TFM__MIN((int64_t)2 * K, (int64_t)n_live * V);
        for (i = 0; i < n_live; i++) {
            const float *x = logits + (int64_t)i * V;
            double mx = x[0], s = 0.0, base;
            for (v = 1; v < V; v++)
                if (x[v] > mx) mx = x[v];
            for (v = 0; v < V; v++) s += exp((double)x[v] - mx);
            base = live_score[i] - mx - log(s);
            for (v = 0; v < V; v++) {
                double sc = base + (double)x[v];
                int at;
                if (nc == N2 && !(sc > cs[nc - 1])) continue;
                if (nc < N2) nc++;
                for (at = nc - 1; at > 0 && sc > cs[at - 1]; at--) {
                    cs[at] = cs[at - 1];
                    cpar[at] = cpar[at - 1];
                    ctok[at] = ctok[at - 1];
                }
                cs[at] = sc;
                cpar[at] = i;
                ctok[at] = (int32_t)v;
            }
        }
        /* a stop token among the K best ends a hypothesis; the other candidates, best first, fill the beam */
        for (c = 0; c < nc && n_new < K; c++) {
            const int32_t *prefix = live_tok + (int64_t)cpar[c] * max_new;
            if (tfm__is_stop(opts, ctok[c])) {
                if (c < K) tfm__hyps_add(&hy, prefix, t, ctok[c], cs[c]);
                continue;
            }
            if (t) memcpy(new_tok + (int64_t)n_new * max_new, prefix, (size_t)t * sizeof(int32_t));
            new_tok[(int64_t)n_new * max_new + t] = ctok[c];
            new_score[n_new] = cs[c];
            from[n_new] = cpar[c];
            next[n_new++] = ctok[c];
        }
        if (t == max_new - 1) { /* out of length: the live beams end here */
            for (i = 0; i < n_new; i++) tfm__hyps_add(&hy, new_tok + (int64_t)i * max_new, t, next[i], new_score[i]);
            break;
        }
        if (hy.n_ended >= K || n_new == 0) break; /* every beam has ended */
        sw = live_tok;
        live_tok = new_tok;
        new_tok = sw;
        memcpy(live_score, new_score, (size_t)n_new * sizeof(double));
        n_live = n_new;
        tfm__kv_reorder(&kc, from, n_live); /* in place: only rows taken twice are copied */
        tfm__decode_step(m, &kc, next, n_live, memory, S, dlog);
        tfm__op_transfer(TFM_DEVICE_CPU, logits, m->impl->device, dlog, (int64_t)n_live * V);
    }
    /* the n_best by length-penalised score, best first (a selection sort) */
    for (i = 0; i < hy.n && i < n_best; i++) {
        int best = i, j;
        for (j = i + 1; j < hy.n; j++)
            if (hy.norm[j] > hy.norm[best]) best = j;
        if (best != i) { /* swap i and best */
            double ts = hy.score[i], tn = hy.norm[i];
            int32_t tl = hy.len[i];
            for (j = 0; j < max_new; j++) {
                int32_t tt = hy.tok[(int64_t)i * max_new + j];
                hy.tok[(int64_t)i * max_new + j] = hy.tok[(int64_t)best * max_new + j];
                hy.tok[(int64_t)best * max_new + j] = tt;
            }
            hy.score[i] = hy.score[best];
            hy.norm[i] = hy.norm[best];
            hy.len[i] = hy.len[best];
            hy.score[best] = ts;
            hy.norm[best] = tn;
            hy.len[best] = tl;
        }
        memcpy(out + (int64_t)i * out_stride, hy.tok + (int64_t)i * max_new, (size_t)hy.len[i] * sizeof(int32_t));
        if (lens) lens[i] = hy.len[i];
        if (scores) scores[i] = (float)hy.score[i];
    }
    if (n_found) *n_found = i;
    tfm_kv_cache_free(&kc); /* (the logits' device floats with it) */
    TFM_FREE(work, m->cfg.user);
    tfm__gen_end(m, was_training);
    return tfm__scratch_check(fn);
}

TFMDEF tfm_result tfm_model_beam_search(tfm_model *m, const int32_t *src, int src_len, const int32_t *prompt,
                                        int n_prompt, const tfm_gen_opts *opts, int n_best, int32_t *out,
                                        int out_stride, int *lens, float *scores, int *n_found) {
    tfm__gen_scope s = tfm__gen_enter(m);
    return tfm__gen_done(s, tfm__model_beam_search(m, src, src_len, prompt, n_prompt, opts, n_best, out, out_stride, lens,
                                                   scores, n_found));
}

/* ==== >>impl-safetensors ==== */

/* safetensors: a u64 little-endian N, N bytes of UTF-8 JSON header, the data. The header maps each tensor
   name to {"dtype": "F32", "shape": [d0, ...], "data_offsets": [begin, end]} (bytes into the data, end
   exclusive); "__metadata__" (optional) maps strings to strings. Only F32 is written and read here
   (a tensor of another dtype passes only when the reader was told to skip it by name).
   Reading trusts nothing: lengths and offsets are checked against the bytes that exist before use, the
   JSON is parsed strictly (RFC 8259, UTF-8 checked, nesting at most TFM__ST_MAX_DEPTH), the tensors must
   cover the data exactly, and allocation is bounded by the header's size, never by a number in the file.
   Defects are TFM_E_FORMAT saying what was expected and what was found (TFM_E_IO: the file cannot be
   opened or read), after the file's name. Files go through stdio; POSIX adds the exclusive create and the
   syncs. Built with the private TFM__TESTING, tfm__st_write_hook can fail any step of a save or a read. */

#ifndef TFM_NO_STDIO
#include <errno.h>
#include <time.h>
#if defined(__unix__) || defined(__unix) || (defined(__APPLE__) && defined(__MACH__))
#include <unistd.h>
#if defined(_POSIX_VERSION)
#define TFM__ST_POSIX 1
#include <fcntl.h>
#include <sys/stat.h>
#ifndef O_CLOEXEC
#define O_CLOEXEC 0
#endif
#endif
#elif defined(_WIN32)
#include <io.h>
#endif

#define TFM__ST_MAX_HEADER (100u * 1024u * 1024u) /* largest JSON header accepted (bytes) */
#define TFM__ST_MAX_ITEMS 100000                  /* most tensors, and most __metadata__ entries, in one file */
#define TFM__ST_MAX_DEPTH 16                      /* deepest JSON nesting (the root is level 1) */

/* A tensor to save (data) or to load (into data, the name and exact shape it must have in the file; data
   NULL: it must be there, but is not read). */
typedef struct tfm__st_tensor {
    const char *name;
    int ndim;
    int64_t shape[TFM_MAX_DIMS];
    float *data;
} tfm__st_tensor;
/* A tensor as a checked header gives it (F32, end - begin == numel * 4; the name owned by the header). */
typedef struct tfm__st_entry {
    const char *name;
    int ndim;
    int64_t shape[TFM_MAX_DIMS];
    uint64_t begin, end; /* bytes in the data buffer */
    int skipped;         /* named in the reader's skip list: checked, matched to nothing, never read (its dtype
                            may then be any of safetensors', not only F32) */
} tfm__st_entry;
/* A parsed, checked header: entries in data order, contiguous from data byte 0; meta_kv: key, value, ...
   in header order; strings: the storage behind them all. tfm__st_header_free frees it. */
typedef struct tfm__st_header {
    tfm__st_entry *entries;
    int n, n_meta;
    const char **meta_kv;
    uint64_t data_start, data_size; /* file offset and size of the data buffer */
    char *strings;
} tfm__st_header;
/* A file being read (or, mem set, a file image in memory; name "<memory>") or written. */
typedef struct tfm__st_file {
    const char *name;
    const unsigned char *mem;
    uint64_t size, pos;
    FILE *fp;
} tfm__st_file;

#ifdef TFM__TESTING
enum { TFM__ST_STAGE_OPEN, TFM__ST_STAGE_WRITE, TFM__ST_STAGE_FLUSH, TFM__ST_STAGE_SYNC, TFM__ST_STAGE_CLOSE,
       TFM__ST_STAGE_RENAME, TFM__ST_STAGE_SYNCDIR, TFM__ST_STAGE_READ, TFM__ST_STAGE_COUNT };
/* Called before each step of a save (each write) and each read of a file: non-zero fails that step as if
   the system call had failed with that errno. */
static int (*tfm__st_write_hook)(int stage) = NULL;
#define TFM__ST_HOOK(stage) (tfm__st_write_hook && (errno = tfm__st_write_hook(TFM__ST_STAGE_##stage)) != 0 ? errno : 0)
#else
#define TFM__ST_HOOK(stage) 0
#endif

/* "prefix: " in front of the pending message, unless it starts so already. */
static tfm_result tfm__io_prefix(tfm_result r, const char *prefix) {
    const char *e = tfm_last_error();
    size_t n = strlen(prefix);
    return r == TFM_OK || (!strncmp(e, prefix, n) && e[n] == ':') ? r : tfm__fail(r, "%s: %s", prefix, e);
}

/* s (n bytes) quoted for a message, in a shape-string buffer: control bytes, quotes and backslashes as
   \xNN, cut at a UTF-8 boundary after about 48 bytes. */
static const char *tfm__st_qn(const char *s, size_t n) {
    char *b = tfm__shapebufs[tfm__shapenext++ & 3];
    size_t o = 1, i;
    for (b[0] = '\'', i = 0; i < n && o < 48; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f || c == '\'' || c == '\\') o += (size_t)snprintf(b + o, 5, "\\x%02x", c);
        else b[o++] = (char)c;
    }
    if (i < n) {
        while (o > 1 && ((unsigned char)b[o - 1] & 0xC0) == 0x80) o--;
        if (o > 1 && (unsigned char)b[o - 1] >= 0xC0) o--;
        memcpy(b + o, "...", 3), o += 3;
    }
    b[o] = '\'', b[o + 1] = 0;
    return b;
}
static const char *tfm__st_q(const char *s) { return tfm__st_qn(s, strlen(s)); }

/* A shape for messages, by the public shape printer. */
static const char *tfm__st_shape(int ndim, const int64_t *shape) {
    tfm_tensor t;
    memset(&t, 0, sizeof t);
    t.ndim = ndim;
    if (ndim > 0 && ndim <= TFM_MAX_DIMS) memcpy(t.shape, shape, (size_t)ndim * sizeof *shape);
    return tfm__shp(&t);
}

/* Length (1..4) of the well-formed UTF-8 sequence at p (n >= 1 bytes), or 0 (overlong, surrogate, too big). */
static int tfm__st_utf8_seq(const unsigned char *p, size_t n) {
    unsigned c = p[0], lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80, hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    int len = c < 0x80 ? 1 : c < 0xC2 || c > 0xF4 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4, k;
    if (len < 2) return len;
    if (n < (size_t)len || p[1] < lo || p[1] > hi) return 0;
    for (k = 2; k < len; k++)
        if (p[k] < 0x80 || p[k] > 0xBF) return 0;
    return len;
}
static int tfm__st_utf8_valid(const char *s) {
    size_t n = strlen(s), i = 0, k;
    while (i < n && (k = (size_t)tfm__st_utf8_seq((const unsigned char *)s + i, n - i)) != 0) i += k;
    return i == n;
}

/* Bytes of data of a shape (dims >= 0) of esize-byte elements into *bytes: 0, or -1 past 2^64 - 1. */
static int tfm__st_nbytes(int ndim, const int64_t *shape, uint64_t esize, uint64_t *bytes) {
    int i;
    for (*bytes = esize, i = 0; i < ndim; i++) *bytes = shape[i] ? *bytes : 0;
    for (i = 0; i < ndim && *bytes; *bytes *= (uint64_t)shape[i++])
        if (*bytes > UINT64_MAX / (uint64_t)shape[i]) return -1;
    return 0;
}

static int tfm__st_little_endian(void) {
    const uint16_t one = 1;
    return *(const unsigned char *)&one == 1;
}
/* Reverse each of n 4-byte words (float32 on a big-endian host). */
static void tfm__st_bswap32(unsigned char *p, size_t n) {
    unsigned char t;
    for (; n; n--, p += 4) t = p[0], p[0] = p[3], p[3] = t, t = p[1], p[1] = p[2], p[2] = t;
}

static int tfm__st_cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }
/* The first name n records hold twice (a name pointer at the start of each stride-byte record): "" for
   none, NULL when out of memory. */
static const char *tfm__st_dup(const void *base, int n, size_t stride) {
    const char **s, *d = "";
    int i;
    if (n < 2) return d;
    if (!(s = (const char **)TFM_MALLOC((size_t)n * sizeof *s, NULL))) return NULL;
    for (i = 0; i < n; i++) memcpy((void *)&s[i], (const char *)base + (size_t)i * stride, sizeof *s);
    qsort((void *)s, (size_t)n, sizeof *s, tfm__st_cmp_str);
    for (i = 1; i < n && !*d; i++)
        if (!strcmp(s[i - 1], s[i])) d = s[i];
    TFM_FREE((void *)s, NULL);
    return d;
}

/* The parser: the header bytes, a cursor, and the storage strings are decoded to (len + 1 bytes: a
   decoded string and its NUL are shorter than its JSON form, so the strings kept always fit). */
typedef struct tfm__st_json {
    const unsigned char *p;
    size_t n, i, used;
    char *str;
    int cap[2];
    uint64_t data_size;
    tfm__st_header *h;
    const char *const *skip; /* tensors the reader skips: n_skip names */
    int n_skip;
} tfm__st_json;

#define TFM__ST_DIGIT(j) ((j)->i < (j)->n && (j)->p[(j)->i] >= '0' && (j)->p[(j)->i] <= '9')
static int tfm__st_at(const tfm__st_json *j, char c) { return j->i < j->n && j->p[j->i] == (unsigned char)c; }
static void tfm__st_ws(tfm__st_json *j) {
    while (tfm__st_at(j, ' ') || tfm__st_at(j, '\t') || tfm__st_at(j, '\n') || tfm__st_at(j, '\r')) j->i++;
}

/* "header offset N: [ctx: ]expected E but found F". */
static tfm_result tfm__st_jerr(const tfm__st_json *j, const char *ctx, const char *expected) {
    char found[24];
    unsigned c = j->i < j->n ? j->p[j->i] : 0;
    if (j->i >= j->n) snprintf(found, sizeof found, "the end of the header");
    else snprintf(found, sizeof found, c >= 0x20 && c < 0x7f ? "'%c'" : "byte 0x%02x", c);
    return tfm__fail(TFM_E_FORMAT, "header offset %llu: %s%sexpected %s but found %s", (unsigned long long)j->i,
                     ctx ? ctx : "", ctx ? ": " : "", expected, found);
}

static long tfm__st_hex4(const tfm__st_json *j, size_t at) {
    char d[5] = {0, 0, 0, 0, 0};
    if (at < j->n) memcpy(d, j->p + at, j->n - at < 4 ? j->n - at : 4);
    return strspn(d, "0123456789abcdefABCDEF") == 4 ? strtol(d, NULL, 16) : -1;
}

/* The string at the cursor, decoded into the storage: *out (NUL-terminated, *len bytes; a \u0000 puts a
   NUL inside). */
static tfm_result tfm__st_jstring(tfm__st_json *j, char **out, size_t *len) {
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    unsigned long long at0 = j->i;
    char *s = j->str + j->used, *o = s;
    if (!tfm__st_at(j, '"')) return tfm__st_jerr(j, NULL, "a string");
    for (j->i++; !tfm__st_at(j, '"');) {
        unsigned long long at = j->i;
        unsigned c = j->i < j->n ? j->p[j->i] : 0, x = j->i + 1 < j->n ? j->p[j->i + 1] : 0;
        long cp, lo = -1;
        int k, m;
        if (j->i >= j->n || (c == '\\' && j->i + 1 >= j->n))
            return tfm__fail(TFM_E_FORMAT, "header offset %llu: unterminated string", at0);
        if (c < 0x20)
            return tfm__fail(TFM_E_FORMAT, "header offset %llu: control character 0x%02x inside a string (it must be escaped)", at, c);
        if (c == '\\' && x != 'u') {
            const char *e = x ? strchr(from, (int)x) : NULL;
            if (!e)
                return tfm__fail(TFM_E_FORMAT, "header offset %llu: invalid escape: a backslash followed by %s (want one of "
                                 "\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)", at,
                                 x >= 0x20 && x < 0x7f ? tfm__st_qn((const char *)j->p + j->i + 1, 1) : "a control byte");
            *o++ = to[e - from];
            j->i += 2;
        } else if (c == '\\') { /* \uXXXX, a surrogate pair for U+10000 and above: as UTF-8 */
            if ((cp = tfm__st_hex4(j, j->i + 2)) < 0)
                return tfm__fail(TFM_E_FORMAT, "header offset %llu: \\u must be followed by 4 hex digits", at);
            if (cp >= 0xDC00 && cp <= 0xDFFF)
                return tfm__fail(TFM_E_FORMAT, "header offset %llu: \\u%04lX is a low surrogate with no high surrogate "
                                 "before it", at, cp);
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (j->i + 7 < j->n && j->p[j->i + 6] == '\\' && j->p[j->i + 7] == 'u') lo = tfm__st_hex4(j, j->i + 8);
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return tfm__fail(TFM_E_FORMAT, "header offset %llu: high surrogate \\u%04lX is not followed by a low "
                                     "surrogate \\uDC00..\\uDFFF", at, cp);
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                j->i += 6;
            }
            j->i += 6;
            k = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
            for (m = k; --m > 0; cp >>= 6) o[m] = (char)(0x80 | (cp & 0x3F));
            o[0] = (char)(unsigned char)(k == 1 ? cp : ((0xF00 >> k) & 0xFF) | cp);
            o += k;
        } else {
            if (!(k = tfm__st_utf8_seq(j->p + j->i, j->n - j->i)))
                return tfm__fail(TFM_E_FORMAT, "header offset %llu: invalid UTF-8 (byte 0x%02x) inside a string", at, c);
            memcpy(o, j->p + j->i, (size_t)k);
            o += k, j->i += (size_t)k;
        }
    }
    j->i++, *o = 0, *out = s, *len = (size_t)(o - s), j->used += *len + 1;
    return TFM_OK;
}

/* The one loop over JSON lists, called with k = 0, 1, ...: at k = 0 the opening bracket `open` must be
   there (else "ctx: expected ..."). *more is 1 when another element follows, the cursor on it (in an
   object after its key, decoded into *key, *klen, and the ':'), 0 once the closing bracket was read. */
static tfm_result tfm__st_jnext(tfm__st_json *j, char open, int k, const char *ctx, const char *expected, char **key,
                                size_t *klen, int *more) {
    char close = open == '{' ? '}' : ']';
    tfm__st_ws(j);
    *more = 0;
    if (k == 0 && !tfm__st_at(j, open)) return tfm__st_jerr(j, ctx, expected);
    if (k > 0 && !tfm__st_at(j, ',') && !tfm__st_at(j, close))
        return tfm__st_jerr(j, NULL, open == '{' ? "',' or '}'" : "',' or ']'");
    if (k > 0 && tfm__st_at(j, close)) return j->i++, TFM_OK;
    j->i++; /* the opening bracket or the comma */
    tfm__st_ws(j);
    if (k == 0 && tfm__st_at(j, close)) return j->i++, TFM_OK;
    *more = 1;
    if (open != '{') return TFM_OK;
    TFM__TRY(tfm__st_jstring(j, key, klen));
    tfm__st_ws(j);
    if (!tfm__st_at(j, ':')) return tfm__st_jerr(j, NULL, "':'");
    j->i++;
    tfm__st_ws(j);
    return TFM_OK;
}

/* The number at the cursor, by the JSON grammar. With out, a non-negative integer that fits in 64 bits
   (ctx names it in messages); without, any number, checked and skipped. */
static tfm_result tfm__st_jnumber(tfm__st_json *j, const char *ctx, uint64_t *out) {
    size_t s = j->i;
    int plain = 1, ovf = 0;
    uint64_t v = 0;
    if (out && !tfm__st_at(j, '-') && !TFM__ST_DIGIT(j)) return tfm__st_jerr(j, ctx, "a non-negative integer");
    if (tfm__st_at(j, '-')) j->i++, plain = 0;
    if (!TFM__ST_DIGIT(j)) return tfm__st_jerr(j, NULL, "a digit");
    if (j->p[j->i] == '0' && j->i + 1 < j->n && j->p[j->i + 1] >= '0' && j->p[j->i + 1] <= '9')
        return tfm__fail(TFM_E_FORMAT, "header offset %llu: number with a leading zero", (unsigned long long)s);
    for (; TFM__ST_DIGIT(j); j->i++) {
        unsigned d = (unsigned)(j->p[j->i] - '0');
        ovf |= v > (UINT64_MAX - d) / 10;
        v = v * 10 + d;
    }
    if (tfm__st_at(j, '.')) {
        j->i++, plain = 0;
        if (!TFM__ST_DIGIT(j)) return tfm__st_jerr(j, NULL, "a digit after '.'");
        while (TFM__ST_DIGIT(j)) j->i++;
    }
    if (tfm__st_at(j, 'e') || tfm__st_at(j, 'E')) {
        j->i++, plain = 0;
        if (tfm__st_at(j, '+') || tfm__st_at(j, '-')) j->i++;
        if (!TFM__ST_DIGIT(j)) return tfm__st_jerr(j, NULL, "a digit in the exponent");
        while (TFM__ST_DIGIT(j)) j->i++;
    }
    if (out && (!plain || ovf))
        return tfm__fail(TFM_E_FORMAT, plain ? "%s: %s does not fit in 64 bits" : "%s: expected a non-negative integer but "
                         "found %s", ctx, tfm__st_qn((const char *)j->p + s, j->i - s));
    if (out) *out = v;
    return TFM_OK;
}

/* Check and skip the value at the cursor; depth is the nesting level a container here opens. */
static tfm_result tfm__st_jskip(tfm__st_json *j, int depth) {
    static const char *const lit[3] = {"true", "false", "null"};
    size_t mark = j->used, len;
    char *s;
    int k, more;
    unsigned c;
    tfm__st_ws(j);
    c = j->i < j->n ? j->p[j->i] : 0;
    if ((c == '{' || c == '[') && depth > TFM__ST_MAX_DEPTH)
        return tfm__fail(TFM_E_FORMAT, "header offset %llu: JSON nested more than %d levels deep", (unsigned long long)j->i,
                         TFM__ST_MAX_DEPTH);
    for (k = 0; c == '{' || c == '['; k++, j->used = mark) {
        TFM__TRY(tfm__st_jnext(j, (char)c, k, NULL, "a value", &s, &len, &more));
        if (!more) return TFM_OK;
        TFM__TRY(tfm__st_jskip(j, depth + 1));
    }
    if (c == '"') return tfm__st_jstring(j, &s, &len); /* its storage goes back with the caller's element */
    if (c == '-' || (c >= '0' && c <= '9')) return tfm__st_jnumber(j, NULL, NULL);
    for (k = 0; k < 3; k++)
        if (j->n - j->i >= strlen(lit[k]) && !memcmp(j->p + j->i, lit[k], strlen(lit[k]))) {
            j->i += strlen(lit[k]);
            return TFM_OK;
        }
    return tfm__st_jerr(j, NULL, "a value");
}

/* An array of at most max non-negative integers into v; *count gets how many (max + 1: more). */
static tfm_result tfm__st_juints(tfm__st_json *j, const char *ctx, uint64_t *v, int max, int *count) {
    int more;
    for (*count = 0;; ++*count) {
        TFM__TRY(tfm__st_jnext(j, '[', *count, ctx, "an array of integers", NULL, NULL, &more));
        if (!more || *count == max) return *count += more, TFM_OK;
        TFM__TRY(tfm__st_jnumber(j, ctx, &v[*count]));
    }
}

/* Names, keys and values are C strings: a decoded \u0000 is refused. */
static tfm_result tfm__st_no_nul(const char *s, size_t len, const char *what) {
    return memchr(s, 0, len) ? tfm__fail(TFM_E_FORMAT, "%s %s contains a NUL character (\\u0000)", what, tfm__st_qn(s, len))
                             : TFM_OK;
}

/* A tensor's object into e (e->name set), checked against the size of the data buffer. Its dtype must be
   F32, or, for a tensor in the skip list, one of safetensors' dtypes (its size then sized from it). */
static tfm_result tfm__st_jentry(tfm__st_json *j, tfm__st_entry *e) {
    static const char *const keys[3] = {"dtype", "shape", "data_offsets"};
    static const char *const dtypes[15] = {"F32", "F64", "F16", "BF16", "I64", "I32", "I16", "I8", "U64", "U32",
                                           "U16", "U8", "BOOL", "F8_E4M3", "F8_E5M2"};
    static const unsigned char dsize[15] = {4, 8, 2, 2, 8, 4, 2, 1, 8, 4, 2, 1, 1, 1, 1};
    char ctx[72], fld[96], *key, *val = NULL;
    uint64_t dims[TFM_MAX_DIMS], off[2] = {0, 0}, bytes = 0;
    int have[3] = {0, 0, 0}, ndim = 0, noff = 0, k, f, more, dt = 0;
    size_t mark = j->used, klen, vlen = 0;
    snprintf(ctx, sizeof ctx, "tensor %s", tfm__st_q(e->name));
    for (k = 0; k < j->n_skip && strcmp(j->skip[k], e->name); k++) {}
    e->skipped = k < j->n_skip;
    for (k = 0;; k++, j->used = mark) { /* keys and the dtype are not kept */
        TFM__TRY(tfm__st_jnext(j, '{', k, ctx, "an object {\"dtype\", \"shape\", \"data_offsets\"}", &key, &klen, &more));
        if (!more) break;
        for (f = 0; f < 3 && (klen != strlen(keys[f]) || memcmp(key, keys[f], klen)); f++) {}
        if (f < 3 && have[f]++) return tfm__fail(TFM_E_FORMAT, "%s: \"%s\" appears twice", ctx, keys[f]);
        snprintf(fld, sizeof fld, "%s: %s", ctx, f < 3 ? keys[f] : "");
        if (f == 0 && !tfm__st_at(j, '"')) return tfm__st_jerr(j, fld, "a string");
        if (f == 0) TFM__TRY(tfm__st_jstring(j, &val, &vlen));
        if (f == 0)
            for (dt = 0; dt < 15 && (vlen != strlen(dtypes[dt]) || memcmp(val, dtypes[dt], vlen)); dt++) {}
        if (f == 0 && dt != 0 && !(e->skipped && dt < 15))
            return tfm__fail(TFM_E_FORMAT, "%s: dtype %s is not supported (only F32 is)", ctx, tfm__st_qn(val, vlen));
        if (f == 1) TFM__TRY(tfm__st_juints(j, fld, dims, TFM_MAX_DIMS, &ndim));
        if (f == 1 && ndim > TFM_MAX_DIMS)
            return tfm__fail(TFM_E_FORMAT, "%s: shape has more than %d dims (at most %d are supported)", ctx, TFM_MAX_DIMS,
                             TFM_MAX_DIMS);
        if (f == 2) TFM__TRY(tfm__st_juints(j, fld, off, 2, &noff));
        if (f == 2 && noff != 2)
            return tfm__fail(TFM_E_FORMAT, "%s: data_offsets must be [begin, end] but has %s", ctx,
                             noff > 2 ? "more than 2 numbers" : noff == 1 ? "1 number" : "none");
        if (f == 3) TFM__TRY(tfm__st_jskip(j, 3)); /* an unknown member: checked, then ignored */
    }
    for (f = 0; f < 3; f++)
        if (!have[f]) return tfm__fail(TFM_E_FORMAT, "%s: no \"%s\"", ctx, keys[f]);
    for (e->ndim = ndim, k = 0; k < ndim; e->shape[k] = (int64_t)dims[k], k++)
        if (dims[k] > (uint64_t)INT64_MAX)
            return tfm__fail(TFM_E_FORMAT, "%s: shape dim %d is %llu, more than 2^63 - 1", ctx, k, (unsigned long long)dims[k]);
    if (tfm__st_nbytes(ndim, e->shape, dsize[dt], &bytes))
        return tfm__fail(TFM_E_FORMAT, "%s: shape %s %s needs more than 2^64 - 1 bytes (overflow)", ctx,
                         tfm__st_shape(ndim, e->shape), dtypes[dt]);
    e->begin = off[0], e->end = off[1];
    if (off[0] > off[1] || off[1] - off[0] != bytes)
        return tfm__fail(TFM_E_FORMAT, "%s: data_offsets [%llu, %llu]%s but shape %s %s needs %llu bytes", ctx,
                         (unsigned long long)off[0], (unsigned long long)off[1], off[0] > off[1] ? ": begin is after end," : "",
                         tfm__st_shape(ndim, e->shape), dtypes[dt], (unsigned long long)bytes);
    if (off[1] > j->data_size)
        return tfm__fail(TFM_E_FORMAT, "%s: data_offsets [%llu, %llu] go past the end of the data buffer (%llu bytes): "
                         "truncated file?", ctx, (unsigned long long)off[0], (unsigned long long)off[1],
                         (unsigned long long)j->data_size);
    return TFM_OK;
}

/* arr (n elem-byte items, room for *cap) with room for one more, moved when full (doubling): NULL when out
   of memory (arr is then kept). */
static void *tfm__st_grow(void *arr, int n, int *cap, size_t elem) {
    void *na;
    if (n < *cap) return arr;
    if (!(na = TFM_MALLOC((size_t)(*cap ? 2 * *cap : 16) * elem, NULL))) return NULL;
    if (arr) memcpy(na, arr, (size_t)n * elem);
    if (arr) TFM_FREE(arr, NULL);
    *cap = *cap ? 2 * *cap : 16;
    return na;
}

/* The root object: "__metadata__" (an object of strings) and the tensors. */
static tfm_result tfm__st_jroot(tfm__st_json *j) {
    tfm__st_header *h = j->h;
    char *key, *val, ctx[96];
    size_t klen, vlen, mark;
    void *na;
    int k, m, more, mmore, have_meta = 0;
    for (k = 0;; k++) {
        mark = j->used;
        TFM__TRY(tfm__st_jnext(j, '{', k, NULL, "a JSON object", &key, &klen, &more));
        if (!more) break;
        if (klen == 12 && !memcmp(key, "__metadata__", 12)) {
            if (have_meta++) return tfm__fail(TFM_E_FORMAT, "\"__metadata__\" appears twice");
            for (j->used = mark, m = 0;; m++) {
                TFM__TRY(tfm__st_jnext(j, '{', m, "\"__metadata__\"", "an object of strings", &key, &klen, &mmore));
                if (!mmore) break;
                TFM__TRY(tfm__st_no_nul(key, klen, "__metadata__ key"));
                snprintf(ctx, sizeof ctx, "__metadata__ value for %s", tfm__st_qn(key, klen));
                if (!tfm__st_at(j, '"')) return tfm__st_jerr(j, ctx, "a string");
                TFM__TRY(tfm__st_jstring(j, &val, &vlen));
                TFM__TRY(tfm__st_no_nul(val, vlen, "__metadata__ value"));
                if (h->n_meta >= TFM__ST_MAX_ITEMS)
                    return tfm__fail(TFM_E_FORMAT, "__metadata__ has more than %d entries", TFM__ST_MAX_ITEMS);
                if (!(na = tfm__st_grow((void *)h->meta_kv, h->n_meta, &j->cap[1], 2 * sizeof *h->meta_kv)))
                    return tfm__fail(TFM_E_NOMEM, "out of memory reading __metadata__");
                h->meta_kv = (const char **)na;
                h->meta_kv[2 * h->n_meta] = key;
                h->meta_kv[2 * h->n_meta++ + 1] = val;
            }
            continue;
        }
        TFM__TRY(tfm__st_no_nul(key, klen, "tensor name"));
        if (h->n >= TFM__ST_MAX_ITEMS)
            return tfm__fail(TFM_E_FORMAT, "the header lists more than %d tensors", TFM__ST_MAX_ITEMS);
        if (!(na = tfm__st_grow((void *)h->entries, h->n, &j->cap[0], sizeof *h->entries)))
            return tfm__fail(TFM_E_NOMEM, "out of memory reading the header");
        h->entries = (tfm__st_entry *)na;
        memset(&h->entries[h->n], 0, sizeof *h->entries);
        h->entries[h->n].name = key;
        TFM__TRY(tfm__st_jentry(j, &h->entries[h->n++]));
    }
    tfm__st_ws(j);
    return j->i < j->n ? tfm__st_jerr(j, NULL, "only spaces after the header's closing '}'") : TFM_OK;
}

static int tfm__st_cmp_offset(const void *a, const void *b) {
    const tfm__st_entry *x = (const tfm__st_entry *)a, *y = (const tfm__st_entry *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end != y->end ? (x->end < y->end ? -1 : 1) : strcmp(x->name, y->name);
}

/* The header as a whole: names and keys unique; the tensors, in data order, cover the data exactly. */
static tfm_result tfm__st_check(tfm__st_header *h) {
    const char *dn = tfm__st_dup(h->entries, h->n, sizeof *h->entries), *dk = tfm__st_dup(h->meta_kv, h->n_meta, 2 * sizeof(char *));
    uint64_t at = 0;
    int i;
    if (!dn || !dk) return tfm__fail(TFM_E_NOMEM, "out of memory checking the header");
    if (*dn) return tfm__fail(TFM_E_FORMAT, "tensor %s appears twice in the header", tfm__st_q(dn));
    if (*dk) return tfm__fail(TFM_E_FORMAT, "__metadata__ key %s appears twice", tfm__st_q(dk));
    if (h->n > 1) qsort(h->entries, (size_t)h->n, sizeof *h->entries, tfm__st_cmp_offset);
    for (i = 0; i < h->n; at = h->entries[i++].end) {
        const tfm__st_entry *e = &h->entries[i], *p = i ? e - 1 : e;
        if (e->begin > at)
            return tfm__fail(TFM_E_FORMAT, "a %llu-byte hole: data bytes [%llu, %llu) belong to no tensor (tensor %s starts at "
                             "%llu)", (unsigned long long)(e->begin - at), (unsigned long long)at,
                             (unsigned long long)e->begin, tfm__st_q(e->name), (unsigned long long)e->begin);
        if (e->begin < at)
            return tfm__fail(TFM_E_FORMAT, "tensors %s [%llu, %llu] and %s [%llu, %llu] overlap", tfm__st_q(p->name),
                             (unsigned long long)p->begin, (unsigned long long)p->end, tfm__st_q(e->name),
                             (unsigned long long)e->begin, (unsigned long long)e->end);
    }
    if (at != h->data_size)
        return tfm__fail(TFM_E_FORMAT, "the tensors end at data byte %llu but the data buffer has %llu bytes: %llu bytes at "
                         "its end belong to no tensor", (unsigned long long)at, (unsigned long long)h->data_size,
                         (unsigned long long)(h->data_size - at));
    return TFM_OK;
}

/* Free what a header holds and zero it. */
static void tfm__st_header_free(tfm__st_header *h) {
    if (h->entries) TFM_FREE(h->entries, NULL);
    if (h->meta_kv) TFM_FREE((void *)h->meta_kv, NULL);
    if (h->strings) TFM_FREE(h->strings, NULL);
    memset(h, 0, sizeof *h);
}

/* Parse and check the len header bytes at buf of a file_size-byte file into *h (zeroed on failure); the
   caller checked len against TFM__ST_MAX_HEADER and file_size. The n_skip tensors named in skip are
   marked skipped (and may have any of safetensors' dtypes); tfm__st_parse skips none. */
static tfm_result tfm__st_parse_skip(const unsigned char *buf, size_t len, uint64_t file_size, const char *const *skip,
                                     int n_skip, tfm__st_header *h) {
    tfm__st_json j;
    tfm_result r;
    memset(h, 0, sizeof *h);
    if (len == 0) return tfm__fail(TFM_E_FORMAT, "the header is empty (length 0): expected a JSON object");
    memset(&j, 0, sizeof j);
    j.p = buf, j.n = len, j.h = h, j.skip = skip, j.n_skip = n_skip;
    j.data_size = h->data_size = file_size - 8 - (uint64_t)len;
    h->data_start = 8 + (uint64_t)len;
    if (!(j.str = h->strings = (char *)TFM_MALLOC(len + 1, NULL)))
        return tfm__fail(TFM_E_NOMEM, "out of memory reading a %llu-byte header", (unsigned long long)len);
    if ((r = tfm__st_jroot(&j)) == TFM_OK) r = tfm__st_check(h);
    if (r != TFM_OK) tfm__st_header_free(h);
    return r;
}

static TFM__UNUSED tfm_result tfm__st_parse(const unsigned char *buf, size_t len, uint64_t file_size, tfm__st_header *h) {
    return tfm__st_parse_skip(buf, len, file_size, NULL, 0, h);
}

/* The value of metadata key in h, or NULL. */
static const char *tfm__st_meta_get(const tfm__st_header *h, const char *key) {
    int i;
    for (i = 0; i < h->n_meta; i++)
        if (!strcmp(h->meta_kv[2 * i], key)) return h->meta_kv[2 * i + 1];
    return NULL;
}

/* Output that only counts while p is NULL. */
typedef struct tfm__st_out {
    char *p;
    size_t n;
} tfm__st_out;
static void tfm__st_put(tfm__st_out *o, const char *s, size_t n) {
    if (o->p) memcpy(o->p + o->n, s, n);
    o->n += n;
}

/* s as a JSON string, as Python's json module writes it (ensure_ascii=False): quotes, backslashes and
   control characters escaped, every other byte as it is. */
static void tfm__st_put_jstr(tfm__st_out *o, const char *s) {
    static const char from[] = "\"\\\b\f\n\r\t", to[] = "\"\\bfnrt";
    char esc[8];
    for (tfm__st_put(o, "\"", 1); *s; s++) {
        const char *e = strchr(from, *s);
        if (e) esc[0] = '\\', esc[1] = to[e - from];
        else snprintf(esc, sizeof esc, "\\u%04x", (unsigned)(unsigned char)*s);
        tfm__st_put(o, (unsigned char)*s >= 0x20 && !e ? s : esc, e ? 2 : (unsigned char)*s < 0x20 ? 6 : 1);
    }
    tfm__st_put(o, "\"", 1);
}

static void tfm__st_put_header(tfm__st_out *o, const tfm__st_tensor *items, int n, const char *const *meta_kv, int n_meta) {
    char num[64];
    uint64_t at = 0, bytes = 0;
    int i, k;
    for (i = 0; i < n_meta; i++) {
        tfm__st_put(o, i ? "," : "{\"__metadata__\":{", i ? 1 : 17);
        tfm__st_put_jstr(o, meta_kv[2 * i]);
        tfm__st_put(o, ":", 1);
        tfm__st_put_jstr(o, meta_kv[2 * i + 1]);
    }
    tfm__st_put(o, n_meta ? "}" : "{", 1);
    for (i = 0; i < n; i++, at += bytes) {
        tfm__st_nbytes(items[i].ndim, items[i].shape, 4, &bytes); /* checked by the caller */
        tfm__st_put(o, ",", i || n_meta ? 1 : 0);
        tfm__st_put_jstr(o, items[i].name);
        tfm__st_put(o, ":{\"dtype\":\"F32\",\"shape\":[", 25);
        for (k = 0; k < items[i].ndim; k++)
            tfm__st_put(o, num, (size_t)snprintf(num, sizeof num, &",%lld"[!k], (long long)items[i].shape[k]));
        tfm__st_put(o, num, (size_t)snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)at,
                                             (unsigned long long)(at + bytes)));
    }
    tfm__st_put(o, "}", 1);
}

/* The header tfm__st_save writes, padded with spaces to a multiple of 8 bytes, in a new allocation (*json,
   *len bytes; TFM_FREE it). TFM_E_ARG unless names and metadata are UTF-8 and unique ("__metadata__" no name). */
static tfm_result tfm__st_header_json(const tfm__st_tensor *items, int n, const char *const *meta_kv, int n_meta,
                                      char **json, size_t *len) {
    const char *dn = tfm__st_dup(items, n, sizeof *items), *dk = tfm__st_dup(meta_kv, n_meta, 2 * sizeof *meta_kv);
    tfm__st_out o;
    int i;
    for (i = 0; i < n; i++)
        if (!strcmp(items[i].name, "__metadata__") || !tfm__st_utf8_valid(items[i].name))
            return tfm__fail(TFM_E_ARG, "cannot save: tensor name %s is reserved or not valid UTF-8", tfm__st_q(items[i].name));
    for (i = 0; i < 2 * n_meta; i++)
        if (!tfm__st_utf8_valid(meta_kv[i]))
            return tfm__fail(TFM_E_ARG, "cannot save: metadata %s %s is not valid UTF-8", i % 2 ? "value" : "key",
                             tfm__st_q(meta_kv[i]));
    if (!dn || !dk) return tfm__fail(TFM_E_NOMEM, "cannot save: out of memory");
    if (*dn) return tfm__fail(TFM_E_ARG, "cannot save: two tensors are named %s", tfm__st_q(dn));
    if (*dk) return tfm__fail(TFM_E_ARG, "cannot save: metadata key %s appears twice", tfm__st_q(dk));
    o.p = NULL, o.n = 0;
    tfm__st_put_header(&o, items, n, meta_kv, n_meta);
    if (o.n > TFM__ST_MAX_HEADER - 8)
        return tfm__fail(TFM_E_ARG, "the header would be %llu bytes, over the %u-byte limit", (unsigned long long)o.n,
                         (unsigned)TFM__ST_MAX_HEADER);
    *len = (o.n + 7) / 8 * 8;
    if (!(o.p = (char *)TFM_MALLOC(*len, NULL)))
        return tfm__fail(TFM_E_NOMEM, "out of memory for a %llu-byte header", (unsigned long long)*len);
    o.n = 0;
    tfm__st_put_header(&o, items, n, meta_kv, n_meta);
    memset(o.p + o.n, ' ', *len - o.n);
    *json = o.p;
    return TFM_OK;
}

/* n bytes of s into dst: TFM_E_FORMAT ("truncated") or TFM_E_IO; what names them in messages. */
static tfm_result tfm__st_read(tfm__st_file *s, void *dst, uint64_t n, const char *what) {
    int e = 0;
    if (n > s->size - s->pos || (!s->mem && n && ((e = TFM__ST_HOOK(READ)) != 0 || fread(dst, 1, (size_t)n, s->fp) != n)))
        return e || (!s->mem && ferror(s->fp))
                   ? tfm__fail(TFM_E_IO, "%s: reading %s failed: %s", s->name, what, strerror(e ? e : errno ? errno : EIO))
                   : tfm__fail(TFM_E_FORMAT, "%s: truncated: the file ends inside %s", s->name, what);
    if (s->mem && n) memcpy(dst, s->mem + s->pos, (size_t)n);
    s->pos += n;
    return TFM_OK;
}

/* Open the file at path for reading (or, path NULL, take the size-byte image at mem) and read and check its
   header into *h; s is then at the data buffer. Errors: TFM_E_IO naming the path and the reason, or the
   header's. */
static tfm_result tfm__st_open_read(tfm__st_file *s, const char *path, const unsigned char *mem, size_t size,
                                    const char *const *skip, int n_skip, tfm__st_header *h) {
    unsigned char len8[8], *buf = NULL;
    uint64_t hlen = 0;
    tfm_result r;
    int i;
    memset(s, 0, sizeof *s);
    memset(h, 0, sizeof *h);
    s->name = path ? path : "<memory>";
    s->mem = path ? NULL : mem ? mem : (const unsigned char *)"";
    s->size = size;
    if (path && !(s->fp = fopen(path, "rb"))) return tfm__fail(TFM_E_IO, "%s: cannot open: %s", path, strerror(errno));
    if (path) {
#if defined(TFM__ST_POSIX)
        struct stat st;
        int ok = stat(path, &st) == 0 && S_ISREG(st.st_mode);
        s->size = ok ? (uint64_t)st.st_size : 0;
#else
        int ok = fseek(s->fp, 0, SEEK_END) == 0 && ftell(s->fp) >= 0;
        s->size = ok ? (uint64_t)ftell(s->fp) : 0;
        ok = ok && fseek(s->fp, 0, SEEK_SET) == 0;
#endif
        if (!ok) return tfm__fail(TFM_E_IO, "%s: cannot read: not a regular file, or its size is unknown", path);
    }
    if (s->size < 8)
        return tfm__fail(TFM_E_FORMAT, "%s: truncated: the file has %llu bytes, but a safetensors file starts with an 8-byte "
                         "header length", s->name, (unsigned long long)s->size);
    TFM__TRY(tfm__st_read(s, len8, 8, "the header length"));
    for (i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
    if (hlen > TFM__ST_MAX_HEADER)
        return tfm__fail(TFM_E_FORMAT, "%s: header length %llu is over the %u-byte limit (not a safetensors file, or a "
                         "corrupt one)", s->name, (unsigned long long)hlen, (unsigned)TFM__ST_MAX_HEADER);
    if (hlen > s->size - 8)
        return tfm__fail(TFM_E_FORMAT, "%s: truncated: the header length is %llu bytes but only %llu bytes follow it",
                         s->name, (unsigned long long)hlen, (unsigned long long)(s->size - 8));
    if (path && !(buf = (unsigned char *)TFM_MALLOC((size_t)hlen + 1, NULL)))
        return tfm__fail(TFM_E_NOMEM, "%s: out of memory for a %llu-byte header", s->name, (unsigned long long)hlen);
    r = buf ? tfm__st_read(s, buf, hlen, "the header") : (s->pos += hlen, TFM_OK);
    if (r == TFM_OK) r = tfm__io_prefix(tfm__st_parse_skip(buf ? buf : s->mem + 8, (size_t)hlen, s->size, skip, n_skip, h), s->name);
    if (buf) TFM_FREE(buf, NULL);
    return r;
}

static int tfm__st_cmp_entry(const void *a, const void *b) {
    return strcmp((*(const tfm__st_entry *const *)a)->name, (*(const tfm__st_entry *const *)b)->name);
}

/* Match want[0..n_want) (distinct names) against the header h of s: each must be there with its exact
   shape, and nothing else; then read their data, front to back. Nothing is read before all matched. */
static tfm_result tfm__st_read_wanted(tfm__st_file *s, const tfm__st_header *h, const tfm__st_tensor *want, int n_want) {
    size_t cnt = (size_t)h->n + 1;
    const tfm__st_entry **byname = (const tfm__st_entry **)TFM_MALLOC(cnt * (sizeof *byname + sizeof(int)), NULL), *e, **at;
    tfm__st_entry key;
    int *map, i;
    tfm_result r = TFM_OK;
    if (!byname) return tfm__fail(TFM_E_NOMEM, "%s: out of memory indexing %d tensors", s->name, h->n);
    for (map = (int *)(void *)(byname + cnt), i = 0; i < h->n; i++) byname[i] = &h->entries[i], map[i] = -1;
    qsort((void *)byname, (size_t)h->n, sizeof *byname, tfm__st_cmp_entry);
    for (i = 0, e = &key; i < n_want && r == TFM_OK; i++) {
        const tfm__st_tensor *w = &want[i];
        key.name = w->name;
        at = (const tfm__st_entry **)bsearch((const void *)&e, (const void *)byname, (size_t)h->n, sizeof *byname, tfm__st_cmp_entry);
        if (!at)
            r = tfm__fail(TFM_E_FORMAT, "%s: tensor %s not found (the file has %d tensors)", s->name, tfm__st_q(w->name), h->n);
        else if ((*at)->ndim != w->ndim || memcmp((*at)->shape, w->shape, (size_t)w->ndim * sizeof *w->shape))
            r = tfm__fail(TFM_E_FORMAT, "%s: tensor %s is %s in the file but %s is wanted", s->name, tfm__st_q(w->name),
                          tfm__st_shape((*at)->ndim, (*at)->shape), tfm__st_shape(w->ndim, w->shape));
        else
            map[*at - h->entries] = i;
    }
    for (i = 0; i < h->n && r == TFM_OK; i++)
        if (map[i] < 0 && !h->entries[i].skipped)
            r = tfm__fail(TFM_E_FORMAT, "%s: unexpected tensor %s in the file (it has %d tensors, %d are wanted)", s->name,
                          tfm__st_q(h->entries[i].name), h->n, n_want);
        else if (map[i] >= 0 && h->entries[i].skipped)
            r = tfm__fail(TFM_E_FORMAT, "%s: tensor %s is both wanted and skipped", s->name, tfm__st_q(h->entries[i].name));
    for (i = 0; i < h->n && r == TFM_OK; i++) { /* contiguous from data byte 0 */
        const tfm__st_tensor *w = map[i] >= 0 ? &want[map[i]] : NULL;
        uint64_t left = h->entries[i].end - h->entries[i].begin, piece;
        unsigned char sink[4096];
        char what[80];
        snprintf(what, sizeof what, "tensor %s", tfm__st_q(h->entries[i].name));
        if (w && w->data && (r = tfm__st_read(s, w->data, left, what)) == TFM_OK && !tfm__st_little_endian())
            tfm__st_bswap32((unsigned char *)w->data, (size_t)(left / 4));
        for (; !(w && w->data) && left && r == TFM_OK; left -= piece)
            r = tfm__st_read(s, sink, piece = left < sizeof sink ? left : sizeof sink, what);
    }
    TFM_FREE((void *)byname, NULL);
    return r;
}

/* Load want[0..n_want) from the safetensors file at path (path NULL: the size-byte image at mem); with
   header_only, only read and check the header. With h_out, *h_out gets the header (free it; zeroed on
   failure). A read error can leave dests partly written. */
static tfm_result tfm__st_load(const char *path, const unsigned char *mem, size_t size, const tfm__st_tensor *want,
                               int n_want, int header_only, tfm__st_header *h_out) {
    tfm__st_file s;
    tfm__st_header h;
    tfm_result r = tfm__st_open_read(&s, path, mem, size, NULL, 0, &h);
    if (r == TFM_OK && !header_only) r = tfm__st_read_wanted(&s, &h, want, n_want);
    if (s.fp) fclose(s.fp);
    if (r != TFM_OK || !h_out) tfm__st_header_free(&h);
    if (h_out) *h_out = h;
    return r;
}

/* fsync the file (or directory) at p, so that its data (or a rename in it) survives a crash: 0 or an errno
   (POSIX; EINVAL from a directory, on a file system that cannot sync one, is no error). Elsewhere stdio
   committed the file (_commit on Windows) and there is nothing to do. */
static int tfm__st_fsync(const char *p, int dir) {
#if defined(TFM__ST_POSIX)
    int fd = open(p, O_RDONLY | O_CLOEXEC), rc = -1;
    while (fd >= 0 && (rc = fsync(fd)) != 0 && errno == EINTR) {}
    rc = rc == 0 || (dir && fd >= 0 && errno == EINVAL) ? 0 : errno;
    if (fd >= 0) close(fd);
    return rc;
#else
    return (void)p, (void)dir, 0;
#endif
}

/* Replace path by tmp: 0 or an errno. POSIX rename(2) is atomic; Windows' rename fails when the target
   exists, so the old file is moved aside (tmp + "~") first, and put back if the second rename fails. */
static int tfm__st_rename(const char *tmp, const char *path) {
#if defined(_WIN32) && !defined(TFM__ST_POSIX)
    size_t n = strlen(tmp);
    char *old = (char *)TFM_MALLOC(n + 2, NULL);
    int moved, e = 0;
    if (!old) return ENOMEM;
    memcpy(old, tmp, n), old[n] = '~', old[n + 1] = 0;
    moved = rename(path, old) == 0;
    if (rename(tmp, path) != 0) e = errno ? errno : EIO;
    if (moved) e ? rename(old, path) : remove(old);
    TFM_FREE(old, NULL);
    return e;
#else
    return rename(tmp, path) == 0 ? 0 : errno ? errno : EIO;
#endif
}

/* Create tmp exclusively (a file of that name is never touched) and open it for writing: 0 or an errno. */
static int tfm__st_create(tfm__st_file *f, const char *tmp) {
#if defined(TFM__ST_POSIX)
    f->fp = fopen(tmp, "wbx"); /* "x": O_EXCL (C11, and in the C libraries of POSIX systems long before) */
#else
    if ((f->fp = fopen(tmp, "rb")) != NULL) return fclose(f->fp), f->fp = NULL, EEXIST; /* C99 has no "x" */
    f->fp = fopen(tmp, "wb");
#endif
    return f->fp ? 0 : errno ? errno : EIO;
}

/* n bytes (swap: as 4-byte words, little-endian whatever the host): 0 or an errno. */
static int tfm__st_write(tfm__st_file *f, const void *p, size_t n, int swap) {
    unsigned char tmp[4096];
    size_t chunk;
    for (errno = 0; swap && !tfm__st_little_endian() && n; n -= chunk, p = (const unsigned char *)p + chunk) {
        memcpy(tmp, p, chunk = n < sizeof tmp ? n : sizeof tmp);
        tfm__st_bswap32(tmp, chunk / 4);
        if (fwrite(tmp, 1, chunk, f->fp) != chunk) return errno ? errno : EIO;
    }
    return fwrite(p, 1, n, f->fp) == n ? 0 : errno ? errno : EIO;
}

/* mode 0: flush stdio's buffers; 1: and sync the file to the disk; 2: close it. 0 or an errno. */
static int tfm__st_flush(tfm__st_file *f, int mode) {
    FILE *fp = f->fp;
    errno = 0;
    if (mode == 2) f->fp = NULL;
    if (mode == 2 ? fclose(fp) != 0 : fflush(fp) != 0) return errno ? errno : EIO;
#if defined(_WIN32)
    if (mode == 1 && _commit(_fileno(fp))) return errno ? errno : EIO;
#endif
    return mode == 1 ? tfm__st_fsync(f->name, 0) : 0;
}

/* Save n tensors (in that order) and n_meta metadata pairs (meta_kv: key, value, ...) to a safetensors file at
   path, atomically (see the top of this section). Errors: TFM_E_ARG (bad names or metadata), TFM_E_IO (names
   path, the step that failed and why; path is unchanged, except when only the directory sync after the
   rename failed, as the message says), TFM_E_NOMEM. */
static tfm_result tfm__st_save(const char *path, const tfm__st_tensor *items, int n, const char *const *meta_kv, int n_meta) {
    tfm__st_file f;
    char *json = NULL, *tmp = NULL, what[96];
    size_t json_len = 0, tmp_cap;
    unsigned char len8[8];
    int e = 0, i, created = 0;
    uint64_t x = (uint64_t)time(NULL) ^ ((uint64_t)(uintptr_t)&f << 16) ^ (uint64_t)clock(), bytes = 0;
    const char *step = "creating the temporary file";
    tfm_result r;
    if (!path || !path[0]) return tfm__fail(TFM_E_ARG, "cannot save: the path is NULL or empty");
    TFM__TRY(tfm__io_prefix(tfm__st_header_json(items, n, meta_kv, n_meta, &json, &json_len), path));
    if (!(tmp = (char *)TFM_MALLOC(tmp_cap = strlen(path) + 32, NULL))) {
        TFM_FREE(json, NULL);
        return tfm__fail(TFM_E_NOMEM, "%s: cannot save: out of memory", path);
    }
    memset(&f, 0, sizeof f);
    f.name = tmp;
#if defined(TFM__ST_POSIX)
    x ^= (uint64_t)getpid() << 40;
#endif
    for (i = 0; i < 16 && (i == 0 || e == EEXIST); i++) { /* a name that differs per process, call and attempt */
        snprintf(tmp, tmp_cap, "%s.tmp.%016llx", path, (unsigned long long)tfm__splitmix64(&x));
        if ((e = TFM__ST_HOOK(OPEN)) == 0) e = tfm__st_create(&f, tmp);
    }
    if (e) goto fail;
    created = 1;
#define TFM__ST_STEP(stage, what, call)                                     \
    do {                                                                    \
        step = (what);                                                      \
        if ((e = TFM__ST_HOOK(stage)) != 0 || (e = (call)) != 0) goto fail; \
    } while (0)
    for (i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)json_len >> (8 * i));
    TFM__ST_STEP(WRITE, "writing the header length", tfm__st_write(&f, len8, 8, 0));
    TFM__ST_STEP(WRITE, "writing the header", tfm__st_write(&f, json, json_len, 0));
    for (i = 0; i < n; i++) {
        tfm__st_nbytes(items[i].ndim, items[i].shape, 4, &bytes);
        snprintf(what, sizeof what, "writing tensor %s", tfm__st_q(items[i].name));
        TFM__ST_STEP(WRITE, what, bytes ? tfm__st_write(&f, items[i].data, (size_t)bytes, 1) : 0);
    }
    TFM__ST_STEP(FLUSH, "flushing", tfm__st_flush(&f, 0));
    TFM__ST_STEP(SYNC, "syncing (fsync)", tfm__st_flush(&f, 1));
    TFM__ST_STEP(CLOSE, "closing", tfm__st_flush(&f, 2));
    TFM__ST_STEP(RENAME, "renaming the temporary file over it", tfm__st_rename(tmp, path));
#undef TFM__ST_STEP
    i = strrchr(path, '/') ? (int)(strrchr(path, '/') - path) : -1; /* the new file is in place: sync its directory */
    memcpy(tmp, i < 0 ? "." : path, i <= 0 ? 1 : (size_t)i);             /* ".", "/" or the directory's path */
    tmp[i <= 0 ? 1 : i] = 0;
    if ((e = TFM__ST_HOOK(SYNCDIR)) == 0) e = tfm__st_fsync(tmp, 1);
    r = e ? tfm__fail(TFM_E_IO, "%s: the file was replaced, but syncing its directory failed: %s (the new file may not "
                      "survive a crash)", path, strerror(e)) : TFM_OK;
    goto done;
fail:
    if (f.fp) fclose(f.fp);
    if (created) remove(tmp);
    r = tfm__fail(TFM_E_IO, "%s: cannot save: %s failed: %s (temporary file '%s'; '%s' is unchanged)", path, step,
                  strerror(e), tmp, path);
done:
    TFM_FREE(json, NULL);
    TFM_FREE(tmp, NULL);
    return r;
}
#endif /* !TFM_NO_STDIO */

/* ==== >>impl-io ==== model checkpoints over the safetensors layer above */

/* All that checkpoints touch of a model besides cfg, params, n_params and step. */
static TFM__UNUSED int tfm__model_ready(const tfm_model *m) { return m && m->impl; }
static TFM__UNUSED int tfm__model_trains(const tfm_model *m) { return m->impl->has_grad; }
static TFM__UNUSED tfm_rng *tfm__model_rng(tfm_model *m) { return &m->impl->rng; }
/* The AdamW moment of p (which 1: exp_avg, 2: exp_avg_sq), or NULL when m has no optimizer state (or a
   share of it only: checkpoints refuse such models). */
static TFM__UNUSED float *tfm__model_moment(const tfm_model *m, const tfm_param *p, int which) {
    const tfm__model_impl *im = m->impl;
    if (!im->has_grad || tfm__model_sharded(m)) return NULL;
    return (which == 1 ? im->mom_m : im->mom_v) + p->offset;
}
/* TFM_E_ARG from checkpoint call fn on a model with sharded moments. */
static TFM__UNUSED tfm_result tfm__io_unsharded(const char *fn, const tfm_model *m) {
    if (!tfm__model_sharded(m)) return TFM_OK;
    return tfm__fail(TFM_E_ARG, "%s: the model keeps a share of the moments (cfg.moment_shards %d): save and load it "
                     "with tfm_dist_save and tfm_dist_load", fn, m->cfg.moment_shards);
}

#ifndef TFM_NO_STDIO

/* The config fields a checkpoint records, in the order written; "arch" ones must match when loading. */
#define TFM__CFG_INT_FIELDS(X)                                                                     \
    X(kind, tfm_model_kind, 1) X(vocab_size, int, 1) X(tgt_vocab_size, int, 1) X(n_classes, int, 1) \
    X(d_model, int, 1) X(n_heads, int, 1) X(n_layers, int, 1) X(n_dec_layers, int, 1)              \
    X(d_ff, int, 1) X(max_len, int, 0) X(max_tgt_len, int, 0) X(max_batch, int, 0)            \
    X(act, tfm_activation, 1) X(norm_first, int, 1) X(pos, tfm_pos_kind, 1) X(scale_emb, int, 1)  \
    X(pool, tfm_pool_kind, 1) X(tie_output, int, 1) X(share_emb, int, 1) X(no_bias, int, 1)        \
    X(ignore_index, int, 0) X(init, tfm_init_kind, 0) X(input_dim, int, 1) X(cls_token, int, 1)    \
    X(type_vocab_size, int, 1) X(emb_norm, int, 1)
/* Fields written only where they are not 0 (a model without them saves the same file as before they came);
   a file without one reads 0. */
#define TFM__CFG_OPT_INT_FIELDS(X) X(norm, tfm_norm_kind, 1) X(rope_dims, int, 1) X(n_kv_heads, int, 1) X(attn_window, int, 1) \
    X(attn_sinks, int, 1)
#define TFM__CFG_OPT_FLOAT_FIELDS(X) X(rope_base, 1)
#define TFM__CFG_FLOAT_FIELDS(X) X(dropout, 0) X(attn_dropout, 0) X(ln_eps, 1) X(label_smoothing, 0) X(init_std, 0)
#define TFM__IO_N_CFG 41    /* "format", 31 config fields and 6 optional ones, the seed, the step and the generator */
#define TFM__IO_MAX_KEY 256 /* longest user metadata key, in bytes */

/* Tensor k of m's checkpoint (nk per parameter: the value, then with the training state exp_avg and exp_avg_sq)
   into t: its name (written to name, 96 bytes), shape, and floats in the model (NULL: m has no moments). */
static void tfm__io_tensor(const tfm_model *m, int k, int nk, char *name, tfm__st_tensor *t) {
    static const char *const pre[3] = {"", "optim.exp_avg.", "optim.exp_avg_sq."};
    const tfm_param *p = &m->params[k / nk];
    snprintf(name, 96, "%s%s", pre[k % nk], p->name);
    memset(t, 0, sizeof *t);
    t->name = name;
    t->ndim = p->value.ndim;
    memcpy(t->shape, p->value.shape, sizeof t->shape);
    t->data = (float *)tfm__model_host(m->impl, k % nk ? tfm__model_moment(m, p, k % nk) : p->value.data);
}

/* A user metadata key (non-empty UTF-8 of at most TFM__IO_MAX_KEY bytes) and its value (UTF-8). */
static tfm_result tfm__io_key(const char *fn, const char *key, const char *value) {
    if (key && key[0] && strlen(key) <= TFM__IO_MAX_KEY && tfm__st_utf8_valid(key) && value && tfm__st_utf8_valid(value))
        return TFM_OK;
    return tfm__fail(TFM_E_ARG, "%s: user metadata %s = %s: keys must be non-empty UTF-8 of at most %d bytes, values UTF-8", fn,
                     key ? tfm__st_q(key) : "NULL", value ? tfm__st_q(value) : "NULL", TFM__IO_MAX_KEY);
}

TFMDEF tfm_result tfm_model_save(const tfm_model *m, const char *path, int flags, const tfm_kv *meta, int n_meta) {
    const char *fn = "tfm_model_save", **kv;
    const uint64_t *s = tfm__model_ready(m) ? tfm__model_rng((tfm_model *)m)->s : NULL;
    int nk = flags & TFM_SAVE_TRAINING_STATE ? 3 : 1, n, i, nm = 0;
    size_t bytes, keys = 0;
    tfm__st_tensor *items;
    char *vals, *names, *uk;
    tfm_result r;
    if (!tfm__model_ready(m) || !path) return tfm__fail(TFM_E_ARG, "%s: the model (initialised) and path must be given", fn);
    if (flags & ~TFM_SAVE_TRAINING_STATE) return tfm__fail(TFM_E_ARG, "%s: unknown flags 0x%x", fn, (unsigned)flags);
    if (nk == 3) TFM__TRY(tfm__io_unsharded(fn, m));
    if (nk == 3 && !tfm__model_trains(m))
        return tfm__fail(TFM_E_ARG, "%s: TFM_SAVE_TRAINING_STATE on an inference_only model (it has no optimizer state)", fn);
    if (n_meta < 0 || n_meta > TFM__ST_MAX_ITEMS - TFM__IO_N_CFG || (n_meta && !meta))
        return tfm__fail(TFM_E_ARG, "%s: n_meta is %d (at most %d) and meta is %s", fn, n_meta, TFM__ST_MAX_ITEMS - TFM__IO_N_CFG,
                         meta ? "set" : "NULL");
    for (i = 0; i < n_meta; keys += strlen(meta[i++].key) + 6) TFM__TRY(tfm__io_key(fn, meta[i].key, meta[i].value));
    n = m->n_params * nk;
    bytes = (size_t)2 * (TFM__IO_N_CFG + (size_t)n_meta) * sizeof *kv + (size_t)n * (sizeof *items + 96) + 72 * TFM__IO_N_CFG + keys;
    if (!(kv = (const char **)TFM_MALLOC(bytes, m->cfg.user))) return tfm__fail(TFM_E_NOMEM, "%s: out of memory", fn);
    items = (tfm__st_tensor *)(void *)(kv + 2 * (TFM__IO_N_CFG + n_meta));
    vals = (char *)(items + n);
    names = vals + 72 * TFM__IO_N_CFG;
    uk = names + (size_t)n * 96;
#define TFM__PUT(key, ...) (kv[2 * nm] = (key), kv[2 * nm + 1] = vals + 72 * nm, snprintf(vals + 72 * nm, 72, __VA_ARGS__), nm++)
#define TFM__PUT_INT(f, type, arch) TFM__PUT("tfm." #f, "%d", (int)m->cfg.f);
#define TFM__PUT_FLOAT(f, arch) TFM__PUT("tfm." #f, "%.9g", (double)m->cfg.f);
#define TFM__PUT_OPT_INT(f, type, arch) if (m->cfg.f) TFM__PUT("tfm." #f, "%d", (int)m->cfg.f);
#define TFM__PUT_OPT_FLOAT(f, arch) if (m->cfg.f != 0.0f) TFM__PUT("tfm." #f, "%.9g", (double)m->cfg.f);
    TFM__PUT("format", "transformer.h");
    TFM__CFG_INT_FIELDS(TFM__PUT_INT)
    TFM__CFG_FLOAT_FIELDS(TFM__PUT_FLOAT)
    TFM__CFG_OPT_INT_FIELDS(TFM__PUT_OPT_INT)
    TFM__CFG_OPT_FLOAT_FIELDS(TFM__PUT_OPT_FLOAT)
    TFM__PUT("tfm.seed", "%llu", (unsigned long long)m->cfg.seed);
    if (nk == 3) TFM__PUT("tfm.step", "%lld", (long long)m->step);
    if (nk == 3) TFM__PUT("tfm.rng", "%016llx%016llx%016llx%016llx", (unsigned long long)s[0], (unsigned long long)s[1],
                          (unsigned long long)s[2], (unsigned long long)s[3]);
#undef TFM__PUT
#undef TFM__PUT_INT
#undef TFM__PUT_FLOAT
#undef TFM__PUT_OPT_INT
#undef TFM__PUT_OPT_FLOAT
    for (i = 0; i < n_meta; uk += strlen(uk) + 1, i++, nm++) {
        sprintf(uk, "user.%s", meta[i].key);
        kv[2 * nm] = uk;
        kv[2 * nm + 1] = meta[i].value;
    }
    tfm__model_stage_state(m->impl, nk == 3, 1); /* a CUDA model's floats to their host places */
    r = tfm__cuda_check(fn);
    for (i = 0; i < n; i++) tfm__io_tensor(m, i, nk, names + 96 * (size_t)i, &items[i]);
    if (r == TFM_OK) r = tfm__io_prefix(tfm__st_save(path, items, n, kv, nm), fn);
    TFM_FREE((void *)kv, m->cfg.user);
    return r;
}

/* The config recorded in a header (TFM_E_FORMAT if it has none or it is malformed); fn names the caller. */
static tfm_result tfm__io_config(const char *fn, const char *path, const tfm__st_header *h, tfm_config *cfg) {
    const char *v;
    char *end;
    double x;
    tfm_config rc;
    memset(cfg, 0, sizeof *cfg);
    if (!tfm__st_meta_get(h, "tfm.kind"))
        return tfm__fail(TFM_E_FORMAT, "%s: %s has no transformer.h config in its metadata (no tfm.kind)", fn, path);
#define TFM__GET(key, isint, set)                                                                                     \
    if ((v = tfm__st_meta_get(h, key)) != NULL) {                                                                     \
        x = strtod(v, &end);                                                                                          \
        if (!*v || *end || !isfinite(x))                                                                              \
            return tfm__fail(TFM_E_FORMAT, "%s: %s: metadata %s is \"%.40s\", want a number", fn, path, key, v);      \
        if (isint && (x != floor(x) || fabs(x) > 2147483647.0))                                                       \
            return tfm__fail(TFM_E_FORMAT, "%s: %s: metadata %s is %g, want an integer", fn, path, key, x);           \
        set;                                                                                                          \
    }
#define TFM__GET_INT(f, type, arch) TFM__GET("tfm." #f, 1, cfg->f = (type)(int)x)
#define TFM__GET_FLOAT(f, arch) TFM__GET("tfm." #f, 0, cfg->f = (float)x)
    TFM__CFG_INT_FIELDS(TFM__GET_INT)
    TFM__CFG_FLOAT_FIELDS(TFM__GET_FLOAT)
    TFM__CFG_OPT_INT_FIELDS(TFM__GET_INT)
    TFM__CFG_OPT_FLOAT_FIELDS(TFM__GET_FLOAT)
    /* files from before cfg.max_seq_len was renamed max_len */
    if (!tfm__st_meta_get(h, "tfm.max_len")) TFM__GET("tfm.max_seq_len", 1, cfg->max_len = (int)x)
#undef TFM__GET
#undef TFM__GET_INT
#undef TFM__GET_FLOAT
    cfg->has_ignore_index = tfm__st_meta_get(h, "tfm.ignore_index") != NULL;
    if ((v = tfm__st_meta_get(h, "tfm.seed")) != NULL && (cfg->seed = (uint64_t)strtoull(v, &end, 10), *v < '0' || *v > '9' || *end))
        return tfm__fail(TFM_E_FORMAT, "%s: %s: metadata tfm.seed is \"%.40s\"", fn, path, v);
    if (tfm__config_resolve(fn, cfg, &rc) != TFM_OK)
        return tfm__fail(TFM_E_FORMAT, "%s: %s: the stored config is invalid: %s", fn, path, tfm_last_error());
    return TFM_OK;
}

TFMDEF tfm_result tfm_config_load(const char *path, tfm_config *cfg) {
    tfm__st_header h;
    tfm_result r;
    if (!path || !cfg) return tfm__fail(TFM_E_ARG, "tfm_config_load: path or cfg is NULL");
    if ((r = tfm__st_load(path, NULL, 0, NULL, 0, 1, &h)) == TFM_OK) r = tfm__io_config("tfm_config_load", path, &h, cfg);
    tfm__st_header_free(&h);
    return tfm__io_prefix(r, "tfm_config_load");
}

/* The file's architecture, when it records one, must be the model's; with optimizer tensors it must hold
   the step and the generator (into *step, rng). */
static tfm_result tfm__io_check(const char *fn, const char *path, const tfm__st_header *h, const tfm_model *m,
                                int has_state, int64_t *step, uint64_t *rng) {
    const char *st = tfm__st_meta_get(h, "tfm.step"), *rs = tfm__st_meta_get(h, "tfm.rng");
    char *end = NULL, part[17];
    tfm_config fc, rc;
    int i;
    if (tfm__st_meta_get(h, "tfm.kind")) { /* else a plain checkpoint: the names and shapes decide */
        TFM__TRY(tfm__io_config(fn, path, h, &fc));
        TFM__TRY(tfm__config_resolve(fn, &fc, &rc));
#define TFM__CMP_INT(f, type, arch)                                                                                    \
    if ((arch) && (int)rc.f != (int)m->cfg.f)                                                                          \
        return tfm__fail(TFM_E_FORMAT, "%s: %s has " #f " %d but the model has %d", fn, path, (int)rc.f, (int)m->cfg.f);
#define TFM__CMP_FLOAT(f, arch)                                                                                        \
    if ((arch) && rc.f != m->cfg.f)                                                                                    \
        return tfm__fail(TFM_E_FORMAT, "%s: %s has " #f " %g but the model has %g", fn, path, (double)rc.f, (double)m->cfg.f);
        TFM__CFG_INT_FIELDS(TFM__CMP_INT)
        TFM__CFG_FLOAT_FIELDS(TFM__CMP_FLOAT)
        TFM__CFG_OPT_INT_FIELDS(TFM__CMP_INT)
        TFM__CFG_OPT_FLOAT_FIELDS(TFM__CMP_FLOAT)
#undef TFM__CMP_INT
#undef TFM__CMP_FLOAT
    }
    if (!has_state) return TFM_OK;
    if (!st || !rs || strlen(rs) != 64 || strspn(rs, "0123456789abcdefABCDEF") != 64)
        return tfm__fail(TFM_E_FORMAT, "%s: %s has optimizer tensors but no tfm.step or no tfm.rng of 64 hex digits", fn, path);
    *step = (int64_t)strtoll(st, &end, 10);
    if (*st < '0' || *st > '9' || *end || *step < 0)
        return tfm__fail(TFM_E_FORMAT, "%s: %s: metadata tfm.step is \"%.40s\"", fn, path, st);
    for (i = 0; i < 4; i++) memcpy(part, rs + 16 * i, 16), part[16] = 0, rng[i] = (uint64_t)strtoull(part, NULL, 16);
    return TFM_OK;
}

/* Nothing reaches the model before the whole file was checked against it and its data read: the header
   first (names, shapes, offsets, the file's size), then the data into a staging buffer sized by the
   model, then the model's parameters (and step, moments and generator) from the staging buffer. */
TFMDEF tfm_result tfm_model_load(tfm_model *m, const char *path) {
    const char *fn = "tfm_model_load";
    tfm__st_file s;
    tfm__st_header h;
    tfm__st_tensor *want = NULL, t;
    char *names = NULL;
    float *stage = NULL;
    int i, nk = 1, n = 0;
    int64_t step = 0;
    uint64_t rng[4] = {0, 0, 0, 0};
    size_t total = 0;
    tfm_result r;
    if (!tfm__model_ready(m) || !path) return tfm__fail(TFM_E_ARG, "%s: the model (initialised) and path must be given", fn);
    TFM__TRY(tfm__io_unsharded(fn, m));
    r = tfm__st_open_read(&s, path, NULL, 0, NULL, 0, &h);
    for (i = 0; r == TFM_OK && i < h.n && nk == 1; i++)
        if (!strncmp(h.entries[i].name, "optim.", 6)) nk = 3;
    if (r == TFM_OK) r = tfm__io_check(fn, path, &h, m, nk == 3, &step, rng);
    for (i = 0, n = m->n_params * nk; r == TFM_OK && i < n; i++)
        if (i % nk == 0 || tfm__model_trains(m)) total += (size_t)tfm_numel(&m->params[i / nk].value);
    if (r == TFM_OK && !(want = (tfm__st_tensor *)TFM_MALLOC((size_t)n * (sizeof *want + 96) + total * sizeof(float), m->cfg.user)))
        r = tfm__fail(TFM_E_NOMEM, "%s: out of memory for the %llu floats of the model", fn, (unsigned long long)total);
    if (r == TFM_OK) names = (char *)(want + n), stage = (float *)(void *)(names + 96 * (size_t)n);
    for (i = 0, total = 0; r == TFM_OK && i < n; i++) { /* the model's tensors, with their data to the staging buffer */
        tfm__io_tensor(m, i, nk, names + 96 * (size_t)i, &want[i]);
        if (want[i].data) want[i].data = stage + total, total += (size_t)tfm_numel(&m->params[i / nk].value);
    }
    if (r == TFM_OK) r = tfm__st_read_wanted(&s, &h, want, n);
    if (s.fp) fclose(s.fp);
    tfm__st_header_free(&h);
    for (i = 0; r == TFM_OK && i < n; i++) { /* commit */
        tfm__io_tensor(m, i, nk, names + 96 * (size_t)i, &t);
        if (t.data) memcpy(t.data, want[i].data, (size_t)tfm_numel(&m->params[i / nk].value) * sizeof(float));
    }
    if (r == TFM_OK) { /* a CUDA model's new floats from their host places to the device */
        tfm__model_stage_state(m->impl, nk == 3, 0);
        r = tfm__cuda_check(fn);
    }
    if (r == TFM_OK && nk == 3 && tfm__model_trains(m)) {
        m->step = step;
        memcpy(tfm__model_rng(m)->s, rng, sizeof rng);
    }
    if (want) TFM_FREE(want, m->cfg.user);
    return tfm__io_prefix(r, fn);
}

/* A name map against model m (fn names the caller): each entry names one of m's parameters; its parts,
   each mapped once, cover the parameter wholly and their rows add up to its rows. For entry i: pi[i] the
   parameter's index, row0[i] its part's first row, rows[i] its rows. parts, cover: m->n_params each. */
static tfm_result tfm__map_check(const char *fn, const tfm_model *m, const tfm_name_map *map, int n_map, int *pi,
                                 int64_t *row0, int64_t *rows, int *parts, uint32_t *cover) {
    int i, j;
    memset(parts, 0, (size_t)m->n_params * sizeof *parts);
    memset(cover, 0, (size_t)m->n_params * sizeof *cover);
    for (i = 0; i < n_map; i++) {
        const tfm_name_map *e = &map[i];
        const tfm_param *p = e->model ? tfm_model_param(m, e->model) : NULL;
        int np = e->n_parts ? e->n_parts : 1;
        int64_t R;
        if (!p)
            return tfm__fail(TFM_E_ARG, "%s: map[%d] (file %s) names model parameter %s, which the model does not have", fn, i,
                             e->file ? tfm__st_q(e->file) : "NULL", e->model ? tfm__st_q(e->model) : "NULL");
        R = p->value.shape[0];
        pi[i] = (int)(p - m->params);
        rows[i] = e->rows > 0 ? e->rows : np > 0 ? R / np : 0;
        if (np < 1 || np > 31 || e->part < 0 || e->part >= np || e->rows < 0 || (!e->rows && R % np) || rows[i] > R ||
            (!e->file && np != 1) || (parts[pi[i]] && parts[pi[i]] != np) || (e->file_rows && e->file_rows < rows[i]))
            return tfm__fail(TFM_E_ARG, "%s: map[%d]: part %d of %d of %s (%lld rows), rows %d, file_rows %d: want 0 <= part "
                             "< n_parts <= 31, the same n_parts for every entry of the parameter, 1 with file NULL, rows "
                             "0 (n_parts dividing the parameter's rows) or at most the parameter's, file_rows 0 or at "
                             "least the part's rows", fn, i, e->part, e->n_parts, p->name, (long long)R, e->rows, e->file_rows);
        if (cover[pi[i]] & (1u << e->part))
            return tfm__fail(TFM_E_ARG, "%s: map[%d]: %s part %d is mapped twice", fn, i, p->name, e->part);
        parts[pi[i]] = np;
        cover[pi[i]] |= 1u << e->part;
    }
    for (i = 0; i < m->n_params; i++)
        if (!parts[i] || cover[i] != (1u << parts[i]) - 1u)
            return tfm__fail(TFM_E_ARG, "%s: model parameter %s is not %s by the map", fn, m->params[i].name,
                             parts[i] ? "wholly covered (a part is missing)" : "covered");
    for (i = 0; i < n_map; i++) { /* each part starts where the parts before it end */
        const tfm_param *p = &m->params[pi[i]];
        for (row0[i] = 0, j = 0; parts[pi[i]] > 1 && j < n_map; j++)
            if (pi[j] == pi[i] && map[j].part < map[i].part) row0[i] += rows[j];
        if (map[i].part == parts[pi[i]] - 1 && row0[i] + rows[i] != p->value.shape[0])
            return tfm__fail(TFM_E_ARG, "%s: the %d parts of %s have %lld rows in all, the parameter has %lld", fn,
                             parts[pi[i]], p->name, (long long)(row0[i] + rows[i]), (long long)p->value.shape[0]);
    }
    return TFM_OK;
}

TFMDEF tfm_result tfm_model_load_mapped(tfm_model *m, const char *path, const tfm_name_map *map, int n_map,
                                        const char *const *skip, int n_skip) {
    const char *fn = "tfm_model_load_mapped";
    tfm__st_file s;
    tfm__st_header h;
    tfm__st_tensor *want = NULL; /* the file's tensors the map names, packed */
    float **dst = NULL;          /* where each goes in the model (host places) */
    int64_t *cnt = NULL;         /* and how many of its floats (the first ones) */
    int64_t *row0, *rows;        /* per map entry: its part's rows (tfm__map_check) */
    int *pi, *parts;             /* per map entry: the parameter; per model parameter: its n_parts */
    uint32_t *cover;             /* per model parameter: the parts mapped */
    float *stage = NULL;
    size_t total = 0;
    int i, k, n_file = 0;
    tfm_result r = TFM_OK;
    memset(&s, 0, sizeof s);
    memset(&h, 0, sizeof h);
    if (!tfm__model_ready(m) || !path || !map || n_map <= 0 || n_skip < 0 || (n_skip && !skip))
        return tfm__fail(TFM_E_ARG, "%s: the model (initialised), path and map (n_map > 0) must be given, and skip when "
                         "n_skip > 0 (n_map %d, n_skip %d)", fn, n_map, n_skip);
    want = (tfm__st_tensor *)TFM_MALLOC((size_t)n_map * (sizeof *want + sizeof *dst + 3 * sizeof *cnt + sizeof *pi) +
                                        (size_t)m->n_params * (sizeof *parts + sizeof *cover), m->cfg.user);
    if (!want) return tfm__fail(TFM_E_NOMEM, "%s: out of memory", fn);
    cnt = (int64_t *)(void *)(want + n_map);
    row0 = cnt + n_map;
    rows = row0 + n_map;
    dst = (float **)(void *)(rows + n_map);
    cover = (uint32_t *)(void *)(dst + n_map);
    parts = (int *)(void *)(cover + m->n_params);
    pi = parts + m->n_params;
    for (k = 0; r == TFM_OK && k < n_skip; k++)
        if (!skip[k]) r = tfm__fail(TFM_E_ARG, "%s: skip[%d] is NULL", fn, k);
    for (i = 0; r == TFM_OK && i < n_map; i++) {
        for (k = 0; map[i].file && k < n_skip && strcmp(skip[k], map[i].file); k++) {}
        if (map[i].file && k < n_skip) r = tfm__fail(TFM_E_ARG, "%s: map[%d]: file tensor %s is also in skip", fn, i, tfm__st_q(map[i].file));
    }
    if (r == TFM_OK) r = tfm__map_check(fn, m, map, n_map, pi, row0, rows, parts, cover);
    for (i = 0; r == TFM_OK && i < n_map; i++) { /* the file's tensors, with where they go */
        const tfm_param *p = &m->params[pi[i]];
        int64_t row = tfm_numel(&p->value) / p->value.shape[0];
        if (!map[i].file) continue;
        memset(&want[n_file], 0, sizeof want[n_file]);
        want[n_file].name = map[i].file;
        want[n_file].ndim = p->value.ndim;
        memcpy(want[n_file].shape, p->value.shape, sizeof want[n_file].shape);
        want[n_file].shape[0] = map[i].file_rows ? map[i].file_rows : rows[i];
        cnt[n_file] = rows[i] * row;
        dst[n_file++] = (float *)tfm__model_host(m->impl, p->value.data) + row0[i] * row;
    }
    for (i = 0; r == TFM_OK && i < n_file; i++) { /* the staging floats */
        uint64_t count;
        if (tfm__st_nbytes(want[i].ndim, want[i].shape, 1, &count) || count > ((uint64_t)SIZE_MAX >> 3) - total)
            r = tfm__fail(TFM_E_ARG, "%s: the map's tensors (%s with its file_rows) are too large", fn, tfm__st_q(want[i].name));
        else total += (size_t)count;
    }
    if (r == TFM_OK && !(stage = (float *)TFM_MALLOC(total * sizeof(float) + sizeof(float), m->cfg.user)))
        r = tfm__fail(TFM_E_NOMEM, "%s: out of memory for the %llu floats of the file", fn, (unsigned long long)total);
    for (i = 0, total = 0; r == TFM_OK && i < n_file; i++) {
        uint64_t count;
        tfm__st_nbytes(want[i].ndim, want[i].shape, 1, &count); /* checked above */
        want[i].data = stage + total;
        total += (size_t)count;
    }
    if (r == TFM_OK) r = tfm__st_open_read(&s, path, NULL, 0, skip, n_skip, &h);
    if (r == TFM_OK) r = tfm__st_read_wanted(&s, &h, want, n_file);
    if (s.fp) fclose(s.fp);
    tfm__st_header_free(&h);
    if (r == TFM_OK) { /* commit (a CUDA model's floats through their host places, kept ones included) */
        tfm__model_stage_state(m->impl, 0, 1);
        for (i = 0; i < n_file; i++) memcpy(dst[i], want[i].data, (size_t)cnt[i] * sizeof(float));
        tfm__model_stage_state(m->impl, 0, 0);
        r = tfm__cuda_check(fn);
    }
    if (stage) TFM_FREE(stage, m->cfg.user);
    TFM_FREE(want, m->cfg.user);
    return tfm__io_prefix(r, fn);
}

TFMDEF tfm_result tfm_model_save_mapped(const tfm_model *m, const char *path, const tfm_name_map *map, int n_map,
                                        const tfm_kv *meta, int n_meta) {
    const char *fn = "tfm_model_save_mapped", **kv;
    tfm__st_tensor *items;
    int64_t *row0, *rows;
    int *pi, *parts, i, n = 0, nm = 1;
    uint32_t *cover;
    size_t keys = 0;
    char *uk;
    tfm_result r = TFM_OK;
    if (!tfm__model_ready(m) || !path || !map || n_map <= 0)
        return tfm__fail(TFM_E_ARG, "%s: the model (initialised), path and map (n_map > 0, here %d) must be given", fn, n_map);
    if (n_meta < 0 || n_meta > TFM__ST_MAX_ITEMS - 1 || (n_meta && !meta))
        return tfm__fail(TFM_E_ARG, "%s: n_meta is %d (at most %d) and meta is %s", fn, n_meta, TFM__ST_MAX_ITEMS - 1,
                         meta ? "set" : "NULL");
    for (i = 0; i < n_meta; keys += strlen(meta[i++].key) + 6) TFM__TRY(tfm__io_key(fn, meta[i].key, meta[i].value));
    items = (tfm__st_tensor *)TFM_MALLOC((size_t)n_map * (sizeof *items + 2 * sizeof *rows + sizeof *pi) +
                                         (size_t)m->n_params * (sizeof *parts + sizeof *cover) +
                                         2 * (1 + (size_t)n_meta) * sizeof *kv + keys, m->cfg.user);
    if (!items) return tfm__fail(TFM_E_NOMEM, "%s: out of memory", fn);
    row0 = (int64_t *)(void *)(items + n_map);
    rows = row0 + n_map;
    kv = (const char **)(void *)(rows + n_map);
    cover = (uint32_t *)(void *)(kv + 2 * (1 + n_meta));
    parts = (int *)(void *)(cover + m->n_params);
    pi = parts + m->n_params;
    uk = (char *)(pi + n_map);
    r = tfm__map_check(fn, m, map, n_map, pi, row0, rows, parts, cover);
    for (i = 0; r == TFM_OK && i < n_map; i++)
        if (map[i].file_rows)
            r = tfm__fail(TFM_E_ARG, "%s: map[%d] (file %s): file_rows %d, but a saved tensor has the part's rows (%lld) "
                          "only: want file_rows 0", fn, i, tfm__st_q(map[i].file ? map[i].file : "NULL"), map[i].file_rows,
                          (long long)rows[i]);
    kv[0] = "format", kv[1] = "pt"; /* Hugging Face's save_pretrained writes it, and its loaders look for it */
    for (i = 0; i < n_meta; uk += strlen(uk) + 1, i++, nm++) {
        sprintf(uk, "user.%s", meta[i].key);
        kv[2 * nm] = uk;
        kv[2 * nm + 1] = meta[i].value;
    }
    if (r == TFM_OK) { /* a CUDA model's floats to their host places */
        tfm__model_stage_state(m->impl, 0, 1);
        r = tfm__cuda_check(fn);
    }
    for (i = 0; r == TFM_OK && i < n_map; i++) { /* each part: its rows of the parameter, contiguous */
        const tfm_param *p = &m->params[pi[i]];
        int64_t row = tfm_numel(&p->value) / p->value.shape[0];
        if (!map[i].file) continue;
        memset(&items[n], 0, sizeof items[n]);
        items[n].name = map[i].file;
        items[n].ndim = p->value.ndim;
        memcpy(items[n].shape, p->value.shape, sizeof items[n].shape);
        items[n].shape[0] = rows[i];
        items[n++].data = (float *)tfm__model_host(m->impl, p->value.data) + row0[i] * row;
    }
    if (r == TFM_OK) r = tfm__io_prefix(tfm__st_save(path, items, n, kv, nm), fn);
    TFM_FREE(items, m->cfg.user);
    return r;
}

/* Map entry e: file tensor `file` (copied to name, 64 bytes) is part `part` of n_parts (rows rows) of m's
   parameter `model` (e->model points at the parameter's own name). */
static void tfm__llama_put(const tfm_model *m, tfm_name_map *e, char *name, const char *file, const char *model, int part,
                           int n_parts, int rows) {
    const tfm_param *p = tfm_model_param(m, model);
    TFM_ASSERT(p); /* the shape checks of tfm_llama_name_map guarantee it */
    snprintf(name, 64, "%s", file);
    memset(e, 0, sizeof *e);
    e->file = name;
    e->model = p->name;
    e->part = part;
    e->n_parts = n_parts;
    e->rows = rows;
}

TFMDEF tfm_result tfm_llama_name_map(const tfm_model *m, tfm_name_map *map, char (*names)[64], int cap, int *n) {
    /* per layer, in Hugging Face's order: its module, the library's, the part and n_parts */
    static const char *const lay[9][2] = {
        {"self_attn.q_proj", "self_attn.in_proj_weight"}, {"self_attn.k_proj", "self_attn.in_proj_weight"},
        {"self_attn.v_proj", "self_attn.in_proj_weight"}, {"self_attn.o_proj", "self_attn.out_proj.weight"},
        {"mlp.gate_proj", "linear1.weight"},              {"mlp.up_proj", "linear1.weight"},
        {"mlp.down_proj", "linear2.weight"},              {"input_layernorm", "norm1.weight"},
        {"post_attention_layernorm", "norm2.weight"}};
    static const int part[9][2] = {{0, 3}, {1, 3}, {2, 3}, {0, 0}, {0, 2}, {1, 2}, {0, 0}, {0, 0}, {0, 0}};
    const char *fn = "tfm_llama_name_map", *why = NULL;
    const tfm_config *c = m ? &m->cfg : NULL;
    char model[64];
    int need, k = 0, l, j;
    if (!tfm__model_ready(m) || !n || cap < 0 || (cap && (!map || !names)))
        return tfm__fail(TFM_E_ARG, "%s: the model (initialised) and n must be given, map and names with cap > 0 (cap %d)",
                         fn, cap);
    why = c->kind != TFM_MODEL_DECODER_LM    ? "it is not a decoder LM (cfg.kind TFM_MODEL_DECODER_LM)"
          : !c->norm_first                   ? "its blocks are post-norm (LLaMA's normalise first: cfg.norm_first)"
          : c->norm != TFM_NORM_RMS          ? "its norms are layernorms (LLaMA's are RMSNorms: cfg.norm TFM_NORM_RMS)"
          : c->act != TFM_ACT_SWIGLU         ? "its feed-forward is not SwiGLU (cfg.act TFM_ACT_SWIGLU)"
          : !c->no_bias                      ? "it has biases (LLaMA has none: cfg.no_bias)"
          : c->pos != TFM_POS_ROPE           ? "its positions are not rotary (cfg.pos TFM_POS_ROPE)"
          : c->rope_dims != c->d_model / c->n_heads ? "it turns part of each head (LLaMA turns whole heads: cfg.rope_dims 0)"
          : c->scale_emb                     ? "it scales its embeddings (cfg.scale_emb)"
          : c->emb_norm                      ? "it normalises its embeddings (cfg.emb_norm)"
          : c->type_vocab_size               ? "it has token types (cfg.type_vocab_size)"
          : c->cls_token                     ? "it has a class token (cfg.cls_token)"
          : c->input_dim                     ? "it reads vectors, not tokens (cfg.input_dim)"
          : c->attn_window                   ? "it attends through a sliding window (LLaMA sees every earlier position: "
                                               "cfg.attn_window)" : NULL;
    if (why) return tfm__fail(TFM_E_ARG, "%s: the model is not LLaMA-shaped: %s", fn, why);
    need = 2 + 9 * c->n_layers + !c->tie_output;
    if (cap && cap < need)
        return tfm__fail(TFM_E_ARG, "%s: the model's map has %d entries, cap is %d", fn, need, cap);
    if (!cap) {
        *n = need;
        return TFM_OK;
    }
    tfm__llama_put(m, &map[k], names[k], "model.embed_tokens.weight", "tok_emb.weight", 0, 0, 0), k++;
    for (l = 0; l < c->n_layers; l++)
        for (j = 0; j < 9; j++, k++) {
            int64_t rows = 0;
            char file[64];
            snprintf(model, sizeof model, "decoder.layers.%d.%s", l, lay[j][1]);
            snprintf(file, sizeof file, "model.layers.%d.%s.weight", l, lay[j][0]);
            if (part[j][1] == 3) { /* query C rows, key and value halves of the rest (fewer with fewer kv heads) */
                int64_t R = tfm_model_param(m, model)->value.shape[0];
                rows = j == 0 ? c->d_model : (R - c->d_model) / 2;
            }
            tfm__llama_put(m, &map[k], names[k], file, model, part[j][0], part[j][1], (int)rows);
        }
    tfm__llama_put(m, &map[k], names[k], "model.norm.weight", "decoder.norm.weight", 0, 0, 0), k++;
    if (!c->tie_output) tfm__llama_put(m, &map[k], names[k], "lm_head.weight", "head.weight", 0, 0, 0), k++;
    *n = k;
    return TFM_OK;
}

TFMDEF tfm_result tfm_checkpoint_meta(const char *path, const char *key, char *buf, size_t size, size_t *len) {
    const char *fn = "tfm_checkpoint_meta", *v;
    char ukey[TFM__IO_MAX_KEY + 8];
    tfm__st_header h;
    tfm_result r = TFM_OK;
    size_t n;
    if (len) *len = 0;
    if (!path) return tfm__fail(TFM_E_ARG, "%s: path is NULL", fn);
    TFM__TRY(tfm__io_key(fn, key, ""));
    TFM__TRY(tfm__io_prefix(tfm__st_load(path, NULL, 0, NULL, 0, 1, &h), fn));
    sprintf(ukey, "user.%s", key);
    n = (v = tfm__st_meta_get(&h, ukey)) != NULL ? strlen(v) : 0;
    if (len) *len = n;
    if (!v)
        r = tfm__fail(TFM_E_ARG, "%s: %s has no user metadata key %s", fn, path, tfm__st_q(key));
    else if (buf && size <= n)
        r = tfm__fail(TFM_E_ARG, "%s: the value of %s in %s needs %llu bytes with its NUL, buf has %llu", fn, tfm__st_q(key),
                      path, (unsigned long long)n + 1, (unsigned long long)size);
    else if (buf)
        memcpy(buf, v, n + 1);
    tfm__st_header_free(&h);
    return r;
}

#endif /* TFM_NO_STDIO */

/* ==== >>impl-dist ==== data-parallel collectives: MPI with TFM_MPI, a group of one without */

#if defined(TFM_MPI)
/* the C API only: Open MPI's and MPICH's C++ bindings do not compile under -Wextra -Werror */
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#if defined(TFM_NCCL)
#if !defined(TFM_CUDA)
#error "transformer.h: TFM_NCCL needs TFM_CUDA (and TFM_MPI, which forms the group)"
#endif
#if !defined(TFM_CUDA_EMULATION)
#include <nccl.h>
#endif
#endif

typedef struct tfm__dist_impl {
    MPI_Comm comm;         /* the caller's communicator, duplicated, with MPI_ERRORS_RETURN */
    int *counts, *displs;  /* (size) each rank's share of the bucket being reduced, and where it starts */
    float *scratch;        /* the largest share of a bucket: this rank's reduced part */
#if defined(TFM_NCCL)
    ncclComm_t nccl;       /* made at the first collective on a CUDA model (NULL before, or after an abort) */
    float *pad;            /* device: a bucket rounded up to a multiple of size, for one that does not split evenly */
    int nccl_dead;         /* a collective timed out and the communicator was aborted */
    cudaStream_t side;     /* tfm_dist_backward's buckets: a non-blocking stream beside the backward's kernels */
    cudaEvent_t ev[2];     /* on the legacy stream: gradients done; on side: the buckets sent */
#endif
} tfm__dist_impl;

/* An MPI return code as a tfm_result: TFM_E_COMM with MPI's own words. */
static tfm_result tfm__mpi(int rc, const char *fn, const char *call) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (rc == MPI_SUCCESS) return TFM_OK;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "MPI error code %d", rc);
    return tfm__fail(TFM_E_COMM, "%s: %s failed: %s", fn, call, msg);
}
#define TFM__MPI_TRY(fn, name, call) TFM__TRY(tfm__mpi((call), (fn), (name)))

/* Wait for a non-blocking collective until d->timeout seconds have passed. A collective cannot be
   cancelled: after a timeout the group is unusable. */
static tfm_result tfm__dist_wait(const char *fn, const tfm_dist *d, MPI_Request *req, const char *call) {
    double t0 = MPI_Wtime();
    int done = 0;
    for (;;) {
        TFM__MPI_TRY(fn, call, MPI_Test(req, &done, MPI_STATUS_IGNORE));
        if (done) return TFM_OK;
        if (MPI_Wtime() - t0 > d->timeout)
            return tfm__fail(TFM_E_COMM, "%s: %s timed out after %g s: another rank has stopped or died (the group is "
                             "unusable now: free it and stop, e.g. MPI_Abort)", fn, call, d->timeout);
    }
}

/* One collective: the blocking call, or with d->timeout > 0 its non-blocking twin waited for with a
   deadline. Open MPI's blocking collectives are its tuned ones, so the default stays on them. */
#define TFM__MPI_COLL(fn, d, blocking, nonblocking, ...)                                               \
    do {                                                                                               \
        if ((d)->timeout > 0) {                                                                        \
            MPI_Request tfm__rq_;                                                                      \
            TFM__MPI_TRY(fn, #nonblocking, nonblocking(__VA_ARGS__, &tfm__rq_));                       \
            TFM__TRY(tfm__dist_wait(fn, d, &tfm__rq_, #nonblocking));                                  \
        } else {                                                                                       \
            TFM__MPI_TRY(fn, #blocking, blocking(__VA_ARGS__));                                        \
        }                                                                                              \
    } while (0)

/* Rank root's bytes to every rank, in calls of at most 1 GiB (MPI counts are int). */
static tfm_result tfm__dist_bcast(const char *fn, const tfm_dist *d, int root, void *buf, int64_t bytes) {
    tfm__dist_impl *im = (tfm__dist_impl *)d->impl;
    unsigned char *p = (unsigned char *)buf;
    while (bytes > 0) {
        int c = (int)TFM__MIN(bytes, (int64_t)1 << 30);
        TFM__MPI_COLL(fn, d, MPI_Bcast, MPI_Ibcast, p, c, MPI_BYTE, root, im->comm);
        p += c;
        bytes -= c;
    }
    return TFM_OK;
}

/* n floats from rank `from`'s x to rank `to`'s x (the other ranks do nothing), in messages of d->bucket. */
static tfm_result tfm__dist_move(const char *fn, const tfm_dist *d, int from, int to, float *x, int64_t n) {
    tfm__dist_impl *im = (tfm__dist_impl *)d->impl;
    int64_t off;
    if (d->rank != from && d->rank != to) return TFM_OK;
    for (off = 0; off < n; off += d->bucket) {
        int c = (int)TFM__MIN(d->bucket, n - off);
        if (d->rank == from && d->timeout > 0) {
            MPI_Request rq;
            TFM__MPI_TRY(fn, "MPI_Isend", MPI_Isend(x + off, c, MPI_FLOAT, to, 0, im->comm, &rq));
            TFM__TRY(tfm__dist_wait(fn, d, &rq, "MPI_Isend"));
        } else if (d->rank == from) {
            TFM__MPI_TRY(fn, "MPI_Send", MPI_Send(x + off, c, MPI_FLOAT, to, 0, im->comm));
        } else if (d->timeout > 0) {
            MPI_Request rq;
            TFM__MPI_TRY(fn, "MPI_Irecv", MPI_Irecv(x + off, c, MPI_FLOAT, from, 0, im->comm, &rq));
            TFM__TRY(tfm__dist_wait(fn, d, &rq, "MPI_Irecv"));
        } else {
            TFM__MPI_TRY(fn, "MPI_Recv", MPI_Recv(x + off, c, MPI_FLOAT, from, 0, im->comm, MPI_STATUS_IGNORE));
        }
    }
    return TFM_OK;
}
#endif

/* FNV-1a-style mixing of 8-byte words: a checksum, not a cryptographic hash. */
static uint64_t tfm__dist_hash(uint64_t h, const void *p, int64_t bytes) {
    const unsigned char *b = (const unsigned char *)p;
    int64_t i = 0;
    for (; i + 8 <= bytes; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x100000001B3ull;
        h ^= h >> 29;
    }
    for (; i < bytes; i++) h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

static tfm_result tfm__dist_chk(const char *fn, const tfm_dist *d) {
    if (!d) return tfm__fail(TFM_E_ARG, "%s: d is NULL", fn);
    if (d->size < 1 || d->rank < 0 || d->rank >= d->size || (d->size > 1 && !d->impl))
        return tfm__fail(TFM_E_ARG, "%s: the group is not initialised (rank %d of %d): call tfm_dist_init", fn, d->rank,
                         d->size);
    return TFM_OK;
}

static tfm_result tfm__dist_chk_model(const char *fn, const tfm_dist *d, const tfm_model *m) {
    TFM__TRY(tfm__dist_chk(fn, d));
    if (!m || !m->impl) return tfm__fail(TFM_E_ARG, "%s: model is NULL or not initialised", fn);
    if (m->cfg.moment_shards > 1 && (m->cfg.moment_shards != d->size || m->cfg.moment_shard != d->rank))
        return tfm__fail(TFM_E_ARG, "%s: the model keeps moment share %d of %d (cfg.moment_shard, moment_shards), but this is "
                         "rank %d of %d: set them to the rank and the group's size", fn, m->cfg.moment_shard,
                         m->cfg.moment_shards, d->rank, d->size);
    return TFM_OK;
}

/* What must agree between ranks before a model's state may be copied: its parameters' names, shapes
   and offsets, its dropout, whether it trains and how its moments are sharded. */
static uint64_t tfm__dist_model_sig(const tfm_model *m) {
    uint64_t h = 0xCBF29CE484222325ull;
    int64_t v[5];
    int i;
    v[0] = m->n_params;
    v[1] = m->n_weights;
    v[2] = (int64_t)m->impl->n_param_bytes;
    v[3] = m->impl->has_grad;
    v[4] = m->cfg.moment_shards;
    h = tfm__dist_hash(h, v, sizeof v);
    h = tfm__dist_hash(h, &m->cfg.dropout, sizeof(float));
    h = tfm__dist_hash(h, &m->cfg.attn_dropout, sizeof(float));
    for (i = 0; i < m->n_params; i++) {
        const tfm_param *p = &m->params[i];
        h = tfm__dist_hash(h, p->name, (int64_t)strlen(p->name));
        h = tfm__dist_hash(h, p->value.shape, sizeof p->value.shape);
        h = tfm__dist_hash(h, &p->offset, sizeof p->offset);
    }
    return h;
}

/* *bad = the highest rank whose h differs from rank 0's, or -1 when all agree (on every rank). */
static tfm_result tfm__dist_agree(const char *fn, tfm_dist *d, uint64_t h, int *bad) {
    *bad = -1;
#if defined(TFM_MPI)
    if (d->size > 1) {
        tfm__dist_impl *im = (tfm__dist_impl *)d->impl;
        uint64_t h0 = h;
        int mine;
        TFM__TRY(tfm__dist_bcast(fn, d, 0, &h0, sizeof h0));
        mine = h0 == h ? -1 : d->rank;
        TFM__MPI_COLL(fn, d, MPI_Allreduce, MPI_Iallreduce, &mine, bad, 1, MPI_INT, MPI_MAX, im->comm);
    }
#else
    (void)fn, (void)d, (void)h;
#endif
    return TFM_OK;
}

TFMDEF tfm_result tfm_dist_init(tfm_dist *d, const void *comm, int64_t bucket) {
    const char *fn = "tfm_dist_init";
    tfm_dist out;
    if (!d) return tfm__fail(TFM_E_ARG, "%s: d is NULL", fn);
    if (bucket < 0 || bucket > INT32_MAX)
        return tfm__fail(TFM_E_ARG, "%s: bucket %lld must be in [0, %d] (0: the default)", fn, (long long)bucket, INT32_MAX);
    memset(&out, 0, sizeof out);
    out.size = 1;
    out.bucket = bucket ? bucket : (int64_t)1 << 22;
#if defined(TFM_MPI)
    {
        int inited = 0, finalized = 0, size = 0, rank = 0;
        size_t head, share, bytes;
        unsigned char *p;
        tfm__dist_impl *im;
        MPI_Comm dup;
        MPI_Initialized(&inited);
        MPI_Finalized(&finalized);
        if (!inited || finalized)
            return tfm__fail(TFM_E_ARG, "%s: MPI is %s: call MPI_Init first", fn, finalized ? "finalized" : "not initialised");
        TFM__MPI_TRY(fn, "MPI_Comm_dup", MPI_Comm_dup(comm ? *(const MPI_Comm *)comm : MPI_COMM_WORLD, &dup));
        if (tfm__mpi(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN), fn, "MPI_Comm_set_errhandler") != TFM_OK ||
            tfm__mpi(MPI_Comm_size(dup, &size), fn, "MPI_Comm_size") != TFM_OK ||
            tfm__mpi(MPI_Comm_rank(dup, &rank), fn, "MPI_Comm_rank") != TFM_OK) {
            MPI_Comm_free(&dup);
            return TFM_E_COMM;
        }
        share = (size_t)((out.bucket + size - 1) / size);
        head = (sizeof(tfm__dist_impl) + 2 * (size_t)size * sizeof(int) + TFM__ALIGN - 1) / TFM__ALIGN * TFM__ALIGN;
        bytes = head + share * sizeof(float);
        p = (unsigned char *)TFM_MALLOC(bytes, NULL);
        if (!p) {
            MPI_Comm_free(&dup);
            return tfm__fail(TFM_E_NOMEM, "%s: could not allocate %zu bytes of scratch", fn, bytes);
        }
        im = (tfm__dist_impl *)p;
        im->comm = dup;
        im->counts = (int *)(p + sizeof(tfm__dist_impl));
        im->displs = im->counts + size;
        im->scratch = (float *)(p + head);
        out.rank = rank;
        out.size = size;
        out.impl = im;
    }
#else
    if (comm) return tfm__fail(TFM_E_ARG, "%s: a communicator was given, but this build has no TFM_MPI", fn);
#endif
    *d = out;
    return TFM_OK;
}

TFMDEF void tfm_dist_free(tfm_dist *d) {
    if (!d) return;
#if defined(TFM_MPI)
    if (d->impl) {
        tfm__dist_impl *im = (tfm__dist_impl *)d->impl;
        int finalized = 0;
        MPI_Finalized(&finalized);
#if defined(TFM_NCCL)
        if (im->nccl) (void)ncclCommDestroy(im->nccl);
        tfm__dev_free(im->pad);
        if (im->side) (void)cudaStreamDestroy(im->side);
        if (im->ev[0]) (void)cudaEventDestroy(im->ev[0]);
        if (im->ev[1]) (void)cudaEventDestroy(im->ev[1]);
#endif
        if (!finalized) MPI_Comm_free(&im->comm);
        TFM_FREE(d->impl, NULL);
    }
#endif
    memset(d, 0, sizeof *d);
}

/* x (n floats) summed (or averaged) over the ranks, bucket by bucket: a reduce-scatter leaves each
   rank the sum of its share of the bucket (summed once, on that rank), and an all-gather copies every
   share to every rank, so the result is bit-identical everywhere. */
static tfm_result tfm__dist_allreduce(const char *fn, tfm_dist *d, float *x, int64_t n, int average) {
#if defined(TFM_MPI)
    tfm__dist_impl *im = (tfm__dist_impl *)d->impl;
    int64_t off;
    if (d->size == 1) return TFM_OK;
    for (off = 0; off < n; off += d->bucket) {
        int64_t len = TFM__MIN(d->bucket, n - off), i;
        int r, mine;
        for (r = 0; r < d->size; r++) {
            int64_t lo = len * r / d->size, hi = len * (r + 1) / d->size;
            im->counts[r] = (int)(hi - lo);
            im->displs[r] = (int)lo;
        }
        mine = im->counts[d->rank];
        TFM__MPI_COLL(fn, d, MPI_Reduce_scatter, MPI_Ireduce_scatter, x + off, im->scratch, im->counts, MPI_FLOAT,
                      MPI_SUM, im->comm);
        if (average)
            for (i = 0; i < mine; i++) im->scratch[i] /= (float)d->size;
        TFM__MPI_COLL(fn, d, MPI_Allgatherv, MPI_Iallgatherv, im->scratch, mine, MPI_FLOAT, x + off, im->counts,
                      im->displs, MPI_FLOAT, im->comm);
    }
#else
    (void)fn, (void)d, (void)x, (void)n, (void)average;
#endif
    return TFM_OK;
}

TFMDEF tfm_result tfm_dist_allreduce(tfm_dist *d, float *x, int64_t n, int average) {
    const char *fn = "tfm_dist_allreduce";
    TFM__TRY(tfm__dist_chk(fn, d));
    if (n < 0 || (n > 0 && !x)) return tfm__fail(TFM_E_ARG, "%s: x is %p with n %lld: want n >= 0 floats", fn, (void *)x, (long long)n);
    return tfm__dist_allreduce(fn, d, x, n, average);
}

#if defined(TFM_NCCL)
/* An NCCL return code as a tfm_result: TFM_E_COMM with NCCL's own words. */
static tfm_result tfm__nccl(ncclResult_t rc, const char *fn, const char *call) {
    if (rc == ncclSuccess) return TFM_OK;
    return tfm__fail(TFM_E_COMM, "%s: %s failed: %s", fn, call, ncclGetErrorString(rc));
}
#define TFM__NCCL_TRY(fn, name, call) TFM__TRY(tfm__nccl((call), (fn), (name)))

/* The group's NCCL communicator, made at its first use (a collective: every rank is here): rank 0's id
   reaches the others over MPI, and the ranks agree that each has its id and scratch before any of them
   enters ncclCommInitRank (which waits for all). */
static tfm_result tfm__dist_nccl_comm(const char *fn, tfm_dist *d, ncclComm_t *comm) {
    tfm__dist_impl *im = (tfm__dist_impl *)d->impl;
    struct {
        int ok;
        ncclUniqueId id;
    } msg;
    tfm_result rc = TFM_OK;
    int ok, all = 0;
    *comm = NULL;
    if (im->nccl_dead)
        return tfm__fail(TFM_E_COMM, "%s: a collective timed out before and NCCL's communicator was aborted: the "
                         "group is unusable", fn);
    if (!im->nccl) {
        size_t pad = (size_t)((d->bucket + d->size - 1) / d->size) * (size_t)d->size;
        memset(&msg, 0, sizeof msg);
        if (d->rank == 0) msg.ok = tfm__nccl(ncclGetUniqueId(&msg.id), fn, "ncclGetUniqueId") == TFM_OK;
        TFM__TRY(tfm__dist_bcast(fn, d, 0, &msg, (int64_t)sizeof msg));
        if (!msg.ok) /* every rank knows it now */
            return d->rank == 0 ? TFM_E_COMM : tfm__fail(TFM_E_COMM, "%s: rank 0 could not make NCCL's id (see its error)", fn);
        if (!im->pad) rc = tfm__dev_alloc(fn, (void **)&im->pad, pad * sizeof(float));
        ok = rc == TFM_OK;
        TFM__MPI_COLL(fn, d, MPI_Allreduce, MPI_Iallreduce, &ok, &all, 1, MPI_INT, MPI_MIN, im->comm);
        if (!all) return ok ? tfm__fail(TFM_E_COMM, "%s: another rank could not allocate NCCL's scratch (see its error)", fn) : rc;
        rc = tfm__nccl(ncclCommInitRank(&im->nccl, d->size, msg.id, d->rank), fn, "ncclCommInitRank");
        if (rc != TFM_OK) {
            im->nccl = NULL;
            return tfm__fail(rc, "%s (NCCL wants one GPU per rank: cudaSetDevice before tfm_model_init; ranks that share "
                             "a GPU can build without TFM_NCCL)", tfm_last_error());
        }
    }
    *comm = im->nccl;
    return TFM_OK;
}

/* The collectives queued on the device run in order with the model's kernels, and nothing waits for
   them, unless d->timeout is set: then wait for them at most that long (a stalled rank would leave them
   waiting forever), and past it abort the communicator: TFM_E_COMM, and the group is unusable. */
static tfm_result tfm__dist_nccl_wait(const char *fn, tfm_dist *d) {
    tfm__dist_impl *im = (tfm__dist_impl *)d->impl;
    double t0 = MPI_Wtime();
    TFM__TRY(tfm__cuda_check(fn));
    while (d->timeout > 0) {
        ncclResult_t async = ncclSuccess;
        cudaError_t e = cudaStreamQuery(0);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) return tfm__cuda_result(fn, e, "cudaStreamQuery");
        TFM__NCCL_TRY(fn, "ncclCommGetAsyncError", ncclCommGetAsyncError(im->nccl, &async));
        if (async != ncclSuccess || MPI_Wtime() - t0 > d->timeout) {
            (void)ncclCommAbort(im->nccl);
            im->nccl = NULL;
            im->nccl_dead = 1;
            if (async != ncclSuccess) return tfm__nccl(async, fn, "an NCCL collective");
            return tfm__fail(TFM_E_COMM, "%s: an NCCL collective timed out after %g s: another rank has stopped or died "
                             "(the group is unusable now: free it and stop, e.g. MPI_Abort)", fn, d->timeout);
        }
    }
    return TFM_OK;
}

static __global__ void tfm__k_dist_div(float *x, float by, int64_t n) {
    TFM__CU_LOOP(i, n) x[i] /= by;
}

/* The mean over the ranks of the len floats at device address x, through NCCL, queued on the thread's
   current stream: a reduce-scatter in place leaves each rank the sum of its equal share (summed once, on
   that rank), the share is divided by the group's size, and an all-gather in place copies every share to
   every rank: the same bits everywhere, as over MPI. One that does not split evenly goes through the
   scratch, padded. */
static tfm_result tfm__dist_nccl_bucket(const char *fn, tfm_dist *d, ncclComm_t c, float *x, int64_t len) {
    tfm__dist_impl *im = (tfm__dist_impl *)d->impl;
    int64_t share = (len + d->size - 1) / d->size;
    float *b = share * d->size == len ? x : im->pad, *mine = b + share * d->rank;
    cudaStream_t s = tfm__cu.stream;
    if (b != x) tfm__op_copy(TFM_DEVICE_CUDA, b, x, len); /* (the padding's sums are not read) */
    TFM__NCCL_TRY(fn, "ncclReduceScatter", ncclReduceScatter(b, mine, (size_t)share, ncclFloat, ncclSum, c, s));
    TFM__LAUNCH(tfm__k_dist_div, tfm__cu_grid(share), TFM__CU_THREADS, 0, mine, (float)d->size, share);
    TFM__NCCL_TRY(fn, "ncclAllGather", ncclAllGather(mine, b, (size_t)share, ncclFloat, c, s));
    if (b != x) tfm__op_copy(TFM_DEVICE_CUDA, x, b, len);
    return TFM_OK;
}

/* The mean over the ranks of n floats at device address x, bucket by bucket (tfm__dist_nccl_bucket). */
static tfm_result tfm__dist_nccl_mean(const char *fn, tfm_dist *d, float *x, int64_t n) {
    ncclComm_t c;
    int64_t off;
    TFM__TRY(tfm__dist_nccl_comm(fn, d, &c));
    for (off = 0; off < n; off += d->bucket) TFM__TRY(tfm__dist_nccl_bucket(fn, d, c, x + off, TFM__MIN(d->bucket, n - off)));
    return tfm__dist_nccl_wait(fn, d);
}

/* ZeRO-1's new parameters: each rank's share of the n at device address w, from that rank to the others. */
static tfm_result tfm__dist_nccl_shares(const char *fn, tfm_dist *d, float *w, int64_t n) {
    ncclComm_t c;
    int64_t lo, hi;
    int r;
    TFM__TRY(tfm__dist_nccl_comm(fn, d, &c));
    TFM__NCCL_TRY(fn, "ncclGroupStart", ncclGroupStart());
    for (r = 0; r < d->size; r++) {
        tfm__share(n, d->size, r, &lo, &hi);
        if (tfm__nccl(ncclBroadcast(w + lo, w + lo, (size_t)(hi - lo), ncclFloat, r, c, 0), fn, "ncclBroadcast") != TFM_OK) {
            (void)ncclGroupEnd();
            return TFM_E_COMM;
        }
    }
    TFM__NCCL_TRY(fn, "ncclGroupEnd", ncclGroupEnd());
    return tfm__dist_nccl_wait(fn, d);
}
#endif

/* The mean over the ranks of n floats of model m at x: for a CUDA model through NCCL with TFM_NCCL, else
   staged through the host. */
static tfm_result tfm__dist_allreduce_model(const char *fn, tfm_dist *d, tfm_model *m, float *x, int64_t n) {
    if (d->size == 1) return TFM_OK;
#if defined(TFM_NCCL)
    if (m->impl->dev_mem) return tfm__dist_nccl_mean(fn, d, x, n);
#endif
    tfm__model_stage(m->impl, x, n, 1);
    TFM__TRY(tfm__cuda_check(fn));
    TFM__TRY(tfm__dist_allreduce(fn, d, (float *)tfm__model_host(m->impl, x), n, 1));
    tfm__model_stage(m->impl, x, n, 0);
    return tfm__cuda_check(fn);
}

/* The checks of the calls on a model's gradients: the group, the model's share, and gradients to reduce
   (*g, *n: the flat buffer). */
static tfm_result tfm__dist_chk_grads(const char *fn, const tfm_dist *d, tfm_model *m, float **g, int64_t *n) {
    TFM__TRY(tfm__dist_chk_model(fn, d, m));
    if (!(*g = tfm_model_flat(m, 1, n))) return tfm__fail(TFM_E_ARG, "%s: the model was built inference_only", fn);
    return TFM_OK;
}

/* The model's gradients g (n floats) as the group's mean, unless they are already (grads_mean). */
static tfm_result tfm__dist_mean_grads(const char *fn, tfm_dist *d, tfm_model *m, float *g, int64_t n) {
    if (!m->impl->grads_mean) TFM__TRY(tfm__dist_allreduce_model(fn, d, m, g, n));
    m->impl->grads_mean = 1;
    return TFM_OK;
}

TFMDEF tfm_result tfm_dist_allreduce_grads(tfm_dist *d, tfm_model *m) {
    const char *fn = "tfm_dist_allreduce_grads";
    int64_t n = 0;
    float *g;
    TFM__TRY(tfm__dist_chk_grads(fn, d, m, &g, &n));
    return tfm__dist_mean_grads(fn, d, m, g, n);
}

#if defined(TFM_NCCL)
/* tfm_dist_backward's side stream and its two events, made at its first call */
static tfm_result tfm__dist_nccl_side(const char *fn, tfm_dist *d) {
    tfm__dist_impl *im = (tfm__dist_impl *)d->impl;
    int i;
    if (!im->side && cudaStreamCreateWithFlags(&im->side, cudaStreamNonBlocking) != cudaSuccess) {
        im->side = NULL;
        return tfm__cuda_result(fn, cudaGetLastError(), "cudaStreamCreateWithFlags");
    }
    for (i = 0; i < 2; i++)
        if (!im->ev[i] && cudaEventCreateWithFlags(&im->ev[i], cudaEventDisableTiming) != cudaSuccess) {
            im->ev[i] = NULL;
            return tfm__cuda_result(fn, cudaGetLastError(), "cudaEventCreateWithFlags");
        }
    return TFM_OK;
}

/* tfm_dist_backward's gradients g (n floats): the buckets below `next` are not sent yet; r: the first error */
typedef struct tfm__dist_overlap {
    const char *fn;
    tfm_dist *d;
    ncclComm_t c;
    float *g;
    int64_t n, next;
    tfm_result r;
} tfm__dist_overlap;

/* The model's on_grads: send every bucket not yet sent whose floats are all final (at or past lo; NULL:
   all), from the top down, on the side stream after everything the legacy stream was given so far (the
   gradients' kernels), so that they travel while the backward goes on below them. */
static void tfm__dist_send(void *ctx, const float *lo) {
    tfm__dist_overlap *o = (tfm__dist_overlap *)ctx;
    tfm__dist_impl *im = (tfm__dist_impl *)o->d->impl;
    int64_t from = lo ? (int64_t)(lo - o->g) : 0, bk = o->d->bucket;
    cudaStream_t prev = tfm__cu.stream;
    if (o->r != TFM_OK || o->next == 0 || (o->next - 1) * bk < from) return;
    if (cudaEventRecord(im->ev[0], prev) != cudaSuccess || cudaStreamWaitEvent(im->side, im->ev[0], 0) != cudaSuccess) {
        o->r = tfm__cuda_result(o->fn, cudaGetLastError(), "cudaEventRecord/cudaStreamWaitEvent");
        return;
    }
    tfm__cu.stream = im->side;
    for (; o->r == TFM_OK && o->next > 0 && (o->next - 1) * bk >= from; o->next--)
        o->r = tfm__dist_nccl_bucket(o->fn, o->d, o->c, o->g + (o->next - 1) * bk, TFM__MIN(bk, o->n - (o->next - 1) * bk));
    tfm__cu.stream = prev;
}
#endif

TFMDEF tfm_result tfm_dist_backward(tfm_dist *d, tfm_model *m, float loss_scale) {
    const char *fn = "tfm_dist_backward";
    int64_t n = 0;
    float *g;
    TFM__TRY(tfm__dist_chk_grads(fn, d, m, &g, &n));
    d->early = 0;
#if defined(TFM_NCCL)
    if (d->size > 1 && m->impl->dev_mem) {
        tfm__dist_impl *im = (tfm__dist_impl *)d->impl;
        tfm__dist_overlap o;
        tfm_result r;
        int prev, sent;
        memset(&o, 0, sizeof o);
        TFM__TRY(tfm__dist_nccl_comm(fn, d, &o.c));
        TFM__TRY(tfm__dist_nccl_side(fn, d));
        o.fn = fn, o.d = d, o.g = g, o.n = n, o.next = (n + d->bucket - 1) / d->bucket;
        m->impl->on_grads = tfm__dist_send;
        m->impl->on_grads_ctx = &o;
        prev = tfm__prec_enter(m);
        r = tfm__prec_done(prev, tfm__model_backward(m, loss_scale));
        m->impl->on_grads = NULL;
        m->impl->on_grads_ctx = NULL;
        d->early = (n + d->bucket - 1) / d->bucket - o.next;
        if (r == TFM_OK) tfm__dist_send(&o, NULL); /* the rest: the embeddings' and the buckets they share */
        sent = o.next < (n + d->bucket - 1) / d->bucket;
        /* the legacy stream (the step, a read of the gradients) waits for every bucket sent */
        if (sent && (cudaEventRecord(im->ev[1], im->side) != cudaSuccess || cudaStreamWaitEvent(0, im->ev[1], 0) != cudaSuccess)) {
            tfm_result e = tfm__cuda_result(fn, cudaGetLastError(), "cudaEventRecord/cudaStreamWaitEvent");
            return r != TFM_OK ? r : e;
        }
        if (r != TFM_OK) return r;
        TFM__TRY(o.r);
        TFM__TRY(tfm__dist_nccl_wait(fn, d));
        m->impl->grads_mean = 1;
        return TFM_OK;
    }
#endif
    TFM__TRY_AS(fn, tfm_model_backward(m, loss_scale));
    return tfm__dist_mean_grads(fn, d, m, g, n);
}

/* Doubles summed on rank 0, in rank order, and sent back: the same bits on every rank. */
static tfm_result tfm__dist_sum(const char *fn, tfm_dist *d, double *x, int n) {
#if defined(TFM_MPI)
    if (d->size > 1 && n > 0) {
        tfm__dist_impl *im = (tfm__dist_impl *)d->impl;
        TFM__MPI_COLL(fn, d, MPI_Reduce, MPI_Ireduce, d->rank == 0 ? MPI_IN_PLACE : x, d->rank == 0 ? x : NULL, n,
                      MPI_DOUBLE, MPI_SUM, 0, im->comm);
        TFM__TRY(tfm__dist_bcast(fn, d, 0, x, (int64_t)n * (int64_t)sizeof(double)));
    }
#else
    (void)fn, (void)d, (void)x, (void)n;
#endif
    return TFM_OK;
}

TFMDEF tfm_result tfm_dist_sum(tfm_dist *d, double *x, int n) {
    const char *fn = "tfm_dist_sum";
    TFM__TRY(tfm__dist_chk(fn, d));
    if (n < 0 || (n > 0 && !x)) return tfm__fail(TFM_E_ARG, "%s: x is %p with n %d: want n >= 0 doubles", fn, (void *)x, n);
    return tfm__dist_sum(fn, d, x, n);
}

TFMDEF tfm_result tfm_dist_reduce_loss(tfm_dist *d, float loss, int64_t n_counted, float *global_loss, int64_t *global_n) {
    const char *fn = "tfm_dist_reduce_loss";
    double s[2];
    if (n_counted < 0) return tfm__fail(TFM_E_ARG, "%s: n_counted %lld is negative", fn, (long long)n_counted);
    s[0] = (double)loss * (double)n_counted;
    s[1] = (double)n_counted;
    TFM__TRY(tfm__dist_chk(fn, d));
    TFM__TRY(tfm__dist_sum(fn, d, s, 2));
    if (global_loss) *global_loss = s[1] > 0 ? (float)(s[0] / s[1]) : 0.0f;
    if (global_n) *global_n = (int64_t)s[1];
    return TFM_OK;
}

TFMDEF tfm_result tfm_dist_step(tfm_dist *d, tfm_model *m, const tfm_optim *opt, float *grad_norm) {
    const char *fn = "tfm_dist_step";
    tfm__model_impl *mi;
    tfm_optim o;
    int64_t n = 0;
    float *g;
    if (grad_norm) *grad_norm = 0.0f;
    TFM__TRY(tfm__dist_chk_grads(fn, d, m, &g, &n));
    mi = m->impl;
    memset(&o, 0, sizeof o);
    TFM__TRY(tfm__optim_resolve(fn, opt, m->step + 1, &o)); /* before anything changes */
    TFM__TRY(tfm__dist_mean_grads(fn, d, m, g, n));
    /* the norm over every parameter's gradient as tfm_model_step sums it; AdamW on all of them, or with
       sharded moments on this rank's share, after which every share's new parameters go from its rank */
    TFM__TRY(tfm__adamw_apply(fn, &o, mi->share ? mi->share : mi->adam, mi->share ? mi->n_share : m->n_params,
                              m->step + 1, tfm__op_sumsq(mi->device, mi->adam, m->n_params), grad_norm));
    TFM__TRY(tfm__cuda_check(fn));
#if defined(TFM_MPI) /* (a group of one never has sharded moments: tfm__dist_chk_model) */
    if (mi->share) {
        float *w = tfm_model_flat(m, 0, NULL);
        int64_t lo, hi;
        int r;
#if defined(TFM_NCCL)
        if (mi->dev_mem)
            TFM__TRY(tfm__dist_nccl_shares(fn, d, w, n));
        else
#endif
        {
            float *wh = (float *)tfm__model_host(mi, w);
            tfm__model_stage(mi, w, n, 1);
            for (r = 0; r < d->size; r++) {
                tfm__share(n, d->size, r, &lo, &hi);
                TFM__TRY(tfm__dist_bcast(fn, d, r, wh + lo, (hi - lo) * (int64_t)sizeof(float)));
            }
            tfm__model_stage(mi, w, n, 0);
            TFM__TRY(tfm__cuda_check(fn));
        }
    }
#endif
    m->step++;
    return TFM_OK;
}

TFMDEF tfm_result tfm_dist_shard(const tfm_dist *d, int64_t n, int64_t *begin, int64_t *end) {
    const char *fn = "tfm_dist_shard";
    TFM__TRY(tfm__dist_chk(fn, d));
    if (n < 0 || !begin || !end)
        return tfm__fail(TFM_E_ARG, "%s: n %lld (want >= 0), begin %p, end %p (want both)", fn, (long long)n, (void *)begin, (void *)end);
    tfm__share(n, d->size, d->rank, begin, end);
    return TFM_OK;
}

/* TFM_E_ARG on every rank when some rank's model is not built like rank 0's (a collective). */
static tfm_result tfm__dist_same_model(const char *fn, tfm_dist *d, const tfm_model *m) {
    int bad;
    TFM__TRY(tfm__dist_chk_model(fn, d, m));
    TFM__TRY(tfm__dist_agree(fn, d, tfm__dist_model_sig(m), &bad));
    if (bad >= 0)
        return tfm__fail(TFM_E_ARG, "%s: rank %d's model differs from rank 0's (parameters, shapes, dropout or "
                         "inference_only): every rank must build the same config", fn, bad);
    return TFM_OK;
}

/* Rank 0's model state to every rank (models already checked alike); sharded moments stay each rank's. */
static tfm_result tfm__dist_broadcast_state(const char *fn, tfm_dist *d, tfm_model *m) {
#if defined(TFM_MPI)
    if (d->size > 1) {
        tfm__model_impl *mi = m->impl;
        int whole = !tfm__model_sharded(m);
        tfm__model_stage_state(mi, whole, 1); /* a CUDA model's through the host */
        TFM__TRY(tfm__cuda_check(fn));
        TFM__TRY(tfm__dist_bcast(fn, d, 0, mi->mem_base + mi->off_params, (int64_t)mi->n_param_bytes));
        if (mi->has_grad) {
            if (whole) {
                TFM__TRY(tfm__dist_bcast(fn, d, 0, tfm__model_host(mi, mi->mom_m), (int64_t)mi->n_param_bytes));
                TFM__TRY(tfm__dist_bcast(fn, d, 0, tfm__model_host(mi, mi->mom_v), (int64_t)mi->n_param_bytes));
            }
            TFM__TRY(tfm__dist_bcast(fn, d, 0, &m->step, sizeof m->step));
            TFM__TRY(tfm__dist_bcast(fn, d, 0, &mi->rng, sizeof mi->rng));
        }
        tfm__model_stage_state(mi, whole, 0);
        TFM__TRY(tfm__cuda_check(fn));
    }
#else
    (void)fn, (void)d, (void)m;
#endif
    return TFM_OK;
}

TFMDEF tfm_result tfm_dist_broadcast_model(tfm_dist *d, tfm_model *m) {
    const char *fn = "tfm_dist_broadcast_model";
    TFM__TRY(tfm__dist_same_model(fn, d, m));
    return tfm__dist_broadcast_state(fn, d, m);
}

TFMDEF tfm_result tfm_dist_check_model(tfm_dist *d, const tfm_model *m, uint64_t *sum) {
    const char *fn = "tfm_dist_check_model";
    const tfm__model_impl *mi;
    uint64_t h;
    int bad;
    if (sum) *sum = 0;
    TFM__TRY(tfm__dist_chk_model(fn, d, m));
    mi = m->impl;
    tfm__model_stage_state(mi, !tfm__model_sharded(m), 1); /* a CUDA model's through the host */
    TFM__TRY(tfm__cuda_check(fn));
    h = tfm__dist_hash(tfm__dist_model_sig(m), mi->mem_base + mi->off_params, (int64_t)mi->n_param_bytes);
    if (mi->has_grad) {
        if (!tfm__model_sharded(m)) { /* sharded moments differ from rank to rank */
            h = tfm__dist_hash(h, tfm__model_host(mi, mi->mom_m), (int64_t)mi->n_param_bytes);
            h = tfm__dist_hash(h, tfm__model_host(mi, mi->mom_v), (int64_t)mi->n_param_bytes);
        }
        h = tfm__dist_hash(h, &m->step, sizeof m->step);
        h = tfm__dist_hash(h, &mi->rng, sizeof mi->rng);
    }
    if (sum) *sum = h;
    TFM__TRY(tfm__dist_agree(fn, d, h, &bad));
    if (bad >= 0)
        return tfm__fail(TFM_E_COMM, "%s: rank %d's model state (parameters, moments, step or generator) differs from "
                         "rank 0's", fn, bad);
    return TFM_OK;
}

#ifndef TFM_NO_STDIO
/* Rank 0's result and message (r, from a call made on rank 0 only) on every rank. */
static tfm_result tfm__dist_share_result(const char *fn, tfm_dist *d, tfm_result r) {
#if defined(TFM_MPI)
    if (d->size > 1) {
        char msg[sizeof tfm__errbuf];
        int code = (int)r;
        memcpy(msg, tfm__errbuf, sizeof msg);
        TFM__TRY(tfm__dist_bcast(fn, d, 0, &code, sizeof code));
        TFM__TRY(tfm__dist_bcast(fn, d, 0, msg, sizeof msg));
        msg[sizeof msg - 1] = 0;
        if (code != TFM_OK) return tfm__fail((tfm_result)code, "%s (on rank 0)", msg);
        return TFM_OK;
    }
#else
    (void)fn, (void)d;
#endif
    return r;
}

#if defined(TFM_MPI)
/* Sharded moments: every rank's share into rank 0's whole copy `full` (2n floats: exp_avg, then
   exp_avg_sq), or with scatter the whole copy's shares back to their ranks. */
static tfm_result tfm__dist_moments(const char *fn, tfm_dist *d, tfm_model *m, float *full, int scatter) {
    tfm__model_impl *mi = m->impl;
    int64_t n = (int64_t)(mi->n_param_bytes / sizeof(float)), lo, hi;
    int r, k;
    tfm__model_stage_state(mi, 1, 1); /* a CUDA model's through the host (scatter: back by the caller) */
    TFM__TRY(tfm__cuda_check(fn));
    for (k = 0; k < 2; k++) {
        float *mine = (float *)tfm__model_host(mi, k ? mi->mom_v : mi->mom_m);
        for (r = 0; r < d->size; r++) {
            tfm__share(n, d->size, r, &lo, &hi);
            if (r > 0)
                TFM__TRY(tfm__dist_move(fn, d, scatter ? 0 : r, scatter ? r : 0, d->rank == 0 ? full + k * n + lo : mine, hi - lo));
            else if (d->rank == 0 && scatter)
                memcpy(mine, full + k * n, (size_t)hi * sizeof(float));
            else if (d->rank == 0)
                memcpy(full + k * n, mine, (size_t)hi * sizeof(float));
        }
    }
    return TFM_OK;
}
#endif

/* tfm_model_save (load 0) or tfm_model_load (load 1) on rank 0, every rank getting its result; a model
   with sharded moments has them gathered whole on rank 0 for the call (and, loaded, sent back). */
static tfm_result tfm__dist_io(const char *fn, tfm_dist *d, tfm_model *m, int load, const char *path, int flags,
                               const tfm_kv *meta, int n_meta) {
    tfm__model_impl *mi = m->impl;
    int whole = !tfm__model_sharded(m) || (!load && !(flags & TFM_SAVE_TRAINING_STATE));
    int64_t n = (int64_t)(mi->n_param_bytes / sizeof(float));
    float *full = NULL;
    tfm_result r = TFM_OK;
#if defined(TFM_MPI)
    if (!whole) {
        if (d->rank == 0 && !(full = (float *)TFM_MALLOC((size_t)(2 * n) * sizeof(float), m->cfg.user)))
            r = tfm__fail(TFM_E_NOMEM, "%s: could not allocate the %lld floats of the whole moments on rank 0", fn,
                          (long long)(2 * n));
        r = tfm__dist_share_result(fn, d, r);
        if (r == TFM_OK) r = tfm__dist_moments(fn, d, m, full, 0);
        if (r != TFM_OK) {
            if (full) TFM_FREE(full, m->cfg.user);
            return r;
        }
    }
#endif
    if (d->rank == 0) {
        float *own_m = mi->mom_m, *own_v = mi->mom_v;
        int64_t lo = mi->mom_lo, hi = mi->mom_hi;
        if (!whole) mi->mom_m = full, mi->mom_v = full + n, mi->mom_lo = 0, mi->mom_hi = n;
        r = load ? tfm_model_load(m, path) : tfm_model_save(m, path, flags, meta, n_meta);
        mi->mom_m = own_m, mi->mom_v = own_v, mi->mom_lo = lo, mi->mom_hi = hi;
    }
    r = tfm__dist_share_result(fn, d, r);
#if defined(TFM_MPI)
    if (r == TFM_OK && load && !whole) {
        r = tfm__dist_moments(fn, d, m, full, 1);
        tfm__model_stage_state(mi, 1, 0);
        if (r == TFM_OK) r = tfm__cuda_check(fn);
    }
#endif
    if (full) TFM_FREE(full, m->cfg.user);
    if (r == TFM_OK && load) r = tfm__dist_broadcast_state(fn, d, m);
    return r;
}

TFMDEF tfm_result tfm_dist_save(tfm_dist *d, const tfm_model *m, const char *path, int flags, const tfm_kv *meta, int n_meta) {
    const char *fn = "tfm_dist_save";
    TFM__TRY(tfm__dist_chk_model(fn, d, m));
    return tfm__dist_io(fn, d, (tfm_model *)m, 0, path, flags, meta, n_meta);
}

TFMDEF tfm_result tfm_dist_load(tfm_dist *d, tfm_model *m, const char *path) {
    const char *fn = "tfm_dist_load";
    TFM__TRY(tfm__dist_same_model(fn, d, m));
    return tfm__dist_io(fn, d, m, 1, path, 0, NULL, 0);
}
#endif

#if defined(TFM__GCC_OPTIONS)
#pragma GCC pop_options
#endif

#endif /* TFM_IMPLEMENTATION */

/* ==== >>license ====
MIT License

Copyright (c) 2026 the transformer.h authors

Permission is hereby granted, free of charge, to any person obtaining a copy of this software and
associated documentation files (the "Software"), to deal in the Software without restriction,
including without limitation the rights to use, copy, modify, merge, publish, distribute, sublicense,
and/or sell copies of the Software, and to permit persons to whom the Software is furnished to do so,
subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or substantial
portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT NOT
LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN
NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY,
WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE
SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
*/
