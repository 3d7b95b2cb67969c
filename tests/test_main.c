/* tests/test_main.c - the one implementation file of the test binary: includes every suite (so tests
   may reach private tfm__ functions), runs them all, ends with "N passed, N failed". */
#define TFM_IMPLEMENTATION
#define TFM__TESTING /* the test hooks of the checkpoint code (tfm__st_write_hook) */
#include "../transformer.h"
#include "test.h"

#include <stdlib.h>
#include <time.h>

#include "test_sgemm.c"
#include "test_ops.c"
#include "test_attention.c"
#include "test_torch.c"
#include "test_errors.c"
#include "test_generate.c"
#include "test_models_torch.c"
#include "test_models.c"
#include "test_layers.c"
#include "test_safetensors.c"
#include "test_io.c"
#include "test_dist.c"
#include "test_wordpiece.c"
#include "test_minilm.c"

/* -v: each test's processor time (clock: the process's, all threads'; single-threaded runs under valgrind
   or qemu read it as their time), to find the tests that make a slow configuration slow */
static clock_t main_t0;
static void main_begin(void) { main_t0 = clock(); }
static void main_note(void) { printf(" %7.2f s cpu", (double)(clock() - main_t0) / CLOCKS_PER_SEC); }

int main(int argc, char **argv) {
    test__begin = main_begin;
    test__note = main_note;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-v")) test__verbose = 1;
        else if (!strcmp(argv[i], "--shard") && i + 1 < argc) {
            if (!test_shard_arg(argv[++i])) return 2;
        } else test__filter = argv[i];
    }
    printf("transformer.h tests (sgemm: %s, built-in kernel: %s, threads: %d)\n", tfm_sgemm_backend(),
           tfm_sgemm_kernel(), tfm_get_num_threads());
    suite_sgemm();
    suite_ops();
    suite_attention();
    suite_torch();
    suite_errors();
    suite_generate();
    suite_models_torch();
    suite_models();
    suite_layers();
    suite_safetensors();
    suite_io();
    suite_dist();
    suite_wordpiece();
    suite_minilm();
    printf("%d passed, %d failed\n", test__passed, test__failed);
    return test__failed ? 1 : 0;
}
