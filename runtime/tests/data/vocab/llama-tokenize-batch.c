// llama-tokenize-batch: tokenizes many texts with llama.cpp's own tokenizer
// (libllama, vocabulary only), for vocab-cases.py. Not built by CI.
//
// Usage: llama-tokenize-batch VOCAB.gguf [--parse-special] < texts.bin > ids.txt
// Input: texts, each a little-endian u32 byte length followed by the UTF-8
// bytes. Output, per text: one line with the ids of
// llama_tokenize(add_special = false, parse_special = whether --parse-special
// is given), space-separated,
// then one line with the hex bytes of the ids' pieces joined
// (llama_token_to_piece, lstrip 0, special false).
//
// Build against a llama.cpp checkout with a CMake build dir:
//   cc -O1 -o llama-tokenize-batch llama-tokenize-batch.c -I$LLAMA/include \
//      -I$LLAMA/ggml/include -L$LLAMA/build/bin -lllama -Wl,-rpath,$LLAMA/build/bin
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char * text, void * data) {
    (void) level;
    (void) text;
    (void) data;
}

int main(int argc, char ** argv) {
    if (argc < 2 || argc > 3 || (argc == 3 && strcmp(argv[2], "--parse-special") != 0)) {
        fprintf(stderr, "usage: %s VOCAB.gguf [--parse-special] < texts.bin\n", argv[0]);
        return 2;
    }
    const bool parse_special = argc == 3;
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    uint8_t len_le[4];
    while (fread(len_le, 1, 4, stdin) == 4) {
        uint32_t n = len_le[0] | (len_le[1] << 8) | (len_le[2] << 16) | ((uint32_t) len_le[3] << 24);
        char * text = malloc(n + 1);
        if (fread(text, 1, n, stdin) != n) {
            fprintf(stderr, "truncated input\n");
            return 1;
        }
        int32_t cap = (int32_t) n + 16;
        llama_token * ids = malloc(sizeof(llama_token) * cap);
        int32_t k = llama_tokenize(vocab, text, (int32_t) n, ids, cap, false, parse_special);
        if (k < 0) {
            fprintf(stderr, "llama_tokenize failed (%d)\n", k);
            return 1;
        }
        for (int32_t i = 0; i < k; i++) {
            printf(i ? " %d" : "%d", ids[i]);
        }
        printf("\n");
        char piece[4096];
        for (int32_t i = 0; i < k; i++) {
            int32_t m = llama_token_to_piece(vocab, ids[i], piece, sizeof piece, 0, false);
            if (m < 0) {
                fprintf(stderr, "llama_token_to_piece failed (%d)\n", m);
                return 1;
            }
            for (int32_t j = 0; j < m; j++) {
                printf("%02x", (uint8_t) piece[j]);
            }
        }
        printf("\n");
        free(ids);
        free(text);
    }
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
