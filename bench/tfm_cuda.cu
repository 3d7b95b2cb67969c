/* bench/tfm_cuda.cu - the implementation of transformer.h for bench/bench_gpu.c, with the CUDA kernels:
   the one file of the program that nvcc builds (bench_gpu.c stays C). Under TFM_CUDA_EMULATION it is
   built by g++ as C++ (-x c++ -DTFM_CUDA -DTFM_CUDA_EMULATION) against the CPU emulation of CUDA. */
#if defined(TFM_CUDA_EMULATION)
#include "../tests/cuda_emu.h"
#endif
#ifndef TFM_IMPLEMENTATION
#define TFM_IMPLEMENTATION
#endif
#ifndef TFM_CUDA
#define TFM_CUDA
#endif
#include "../transformer.h"
