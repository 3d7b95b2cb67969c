/* tests/test_compile_wordpiece.c - examples/wordpiece.h compiles warning-free as C99 and as C++11
   (-Wall -Wextra -Werror -pedantic), with and without WP_STATIC, included before and after the
   implementation is asked for and twice with it; every public function is linked and runs once.
   Built and run by `make test-compile` (no data needed). */
#include "../examples/wordpiece.h" /* declarations alone first */
#define WORDPIECE_IMPLEMENTATION
#include "../examples/wordpiece.h"
#include "../examples/wordpiece.h" /* again: the implementation is compiled once */

#include <stdio.h>
#include <string.h>

int main(void) {
    static const char vocab[] = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\n##s\n,\n";
    const char *texts[2] = {"hellos, [MASK]", ""};
    int32_t ids[2 * 8], lens[2];
    int n = 0, width = 0, bad = 0;
    wp_tokenizer *wp = NULL, *none = NULL;
    wp_config cfg;
    wp_info info;
    if (wp_load_memory(vocab, sizeof vocab - 1, "vocab.txt", &wp) != WP_OK) {
        printf("wp_load_memory: %s\n", wp_last_error());
        return 1;
    }
    info = wp_get_info(wp);
    cfg = wp_get_config(wp);
    bad |= wp_set_config(wp, &cfg) != WP_OK;
    bad |= wp_encode(wp, texts[0], strlen(texts[0]), 8, ids, &n) != WP_OK || n != 6 || ids[1] != 5 || ids[2] != 6 ||
           ids[3] != 7 || ids[4] != 4;
    bad |= wp_encode_batch(wp, texts, NULL, 2, 8, ids, lens, &width) != WP_OK || width != 6 || lens[1] != 2;
    bad |= info.vocab_size != 8 || wp_token_id(wp, "##s", 3) != 6 || strcmp(wp_id_token(wp, 5), "hello") != 0;
    bad |= wp_load("no/such/file.json", &none) != WP_E_IO || none != NULL || wp_result_string(WP_E_IO)[0] == 0;
    wp_clear_error();
    bad |= wp_last_error()[0] != 0;
    wp_free(wp);
    printf("wordpiece.h: %s\n", bad ? "FAILED" : "ok");
    return bad;
}
