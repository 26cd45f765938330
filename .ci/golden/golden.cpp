// Writes a golden file (the format `tessera parity` reads, see
// runtime/src/parity.rs) from llama.cpp on the CPU: for each prompt, its ids
// (llama_tokenize with the file's special-token rules), the greedy
// continuation of N tokens and, per continuation position, the gap between
// the top-1 and top-2 logits; `must_match` is the first position whose gap
// is below the tie gap.
//
//   golden MODEL OUT.json N PROMPT...
//
// Built against libllama by `make golden-tool` (.ci/golden/Makefile).
#include "llama.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

static const double TIE_GAP = 0.35;

// `s` as a JSON string literal.
static std::string json_str(const std::string &s) {
    std::string out = "\"";
    for (unsigned char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    snprintf(buf, sizeof buf, "\\u%04x", c);
                    out += buf;
                } else {
                    out += (char) c;
                }
        }
    }
    return out + "\"";
}

// `s` with every byte that is not part of a valid UTF-8 sequence replaced
// by U+FFFD (a greedy continuation may stop inside a character).
static std::string valid_utf8(const std::string &s) {
    std::string out;
    size_t i = 0;
    while (i < s.size()) {
        unsigned char c = s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        bool ok = len > 0 && i + len <= s.size();
        for (size_t k = 1; ok && k < len; k++) ok = ((unsigned char) s[i + k] >> 6) == 2;
        if (ok) {
            out.append(s, i, len);
            i += len;
        } else {
            out += "\xEF\xBF\xBD";
            i += 1;
        }
    }
    return out;
}

static void die(const char *what) {
    fprintf(stderr, "golden: %s\n", what);
    exit(1);
}

int main(int argc, char **argv) {
    if (argc < 5) die("usage: golden MODEL OUT.json N PROMPT...");
    const char *model_path = argv[1], *out_path = argv[2];
    const int n_predict = atoi(argv[3]);
    if (n_predict <= 0) die("N must be positive");
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    // No repacked (AMX, AVX512 tile) weight buffers: plain ggml CPU kernels on every machine.
    mp.use_extra_bufts = false;
    llama_model *model = llama_model_load_from_file(model_path, mp);
    if (!model) die("cannot load the model");
    const llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);

    std::string cases;
    for (int a = 4; a < argc; a++) {
        const std::string prompt = argv[a];
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = 1024;
        cp.n_batch = 1024;
        cp.n_threads = 2;
        cp.n_threads_batch = 2;
        llama_context *ctx = llama_init_from_model(model, cp);
        if (!ctx) die("cannot create a context");
        std::vector<llama_token> ids(prompt.size() + 8);
        int n = llama_tokenize(vocab, prompt.c_str(), (int) prompt.size(), ids.data(), (int) ids.size(), true, false);
        if (n < 0) die("tokenize failed");
        ids.resize(n);
        std::vector<llama_token> cur = ids, out;
        std::vector<double> gaps;
        std::string text;
        llama_batch batch = llama_batch_get_one(cur.data(), (int) cur.size());
        for (int i = 0; i < n_predict; i++) {
            if (llama_decode(ctx, batch) != 0) die("decode failed");
            const float *logits = llama_get_logits_ith(ctx, -1);
            int best = 0;
            for (int v = 1; v < n_vocab; v++) if (logits[v] > logits[best]) best = v;
            float second = -INFINITY;
            for (int v = 0; v < n_vocab; v++) if (v != best && logits[v] > second) second = logits[v];
            gaps.push_back((double) logits[best] - (double) second);
            out.push_back(best);
            char piece[256];
            int len = llama_token_to_piece(vocab, best, piece, sizeof piece, 0, false);
            if (len > 0) text.append(piece, len);
            cur.assign(1, best);
            batch = llama_batch_get_one(cur.data(), 1);
        }
        llama_free(ctx);
        size_t must = gaps.size();
        for (size_t i = 0; i < gaps.size(); i++) if (gaps[i] < TIE_GAP) { must = i; break; }
        std::string c = "  {\n   \"prompt\": " + json_str(prompt) + ",\n   \"prompt_ids\": [";
        for (size_t i = 0; i < ids.size(); i++) c += (i ? ", " : "") + std::to_string(ids[i]);
        c += "],\n   \"token_ids\": [";
        for (size_t i = 0; i < out.size(); i++) c += (i ? ", " : "") + std::to_string(out[i]);
        c += "],\n   \"text\": " + json_str(valid_utf8(text)) + ",\n   \"top2_gaps\": [";
        for (size_t i = 0; i < gaps.size(); i++) {
            char buf[32];
            snprintf(buf, sizeof buf, "%s%.4f", i ? ", " : "", gaps[i]);
            c += buf;
        }
        c += "],\n   \"must_match\": " + std::to_string(must) + "\n  }";
        cases += (cases.empty() ? "" : ",\n") + c;
    }
    FILE *f = fopen(out_path, "w");
    if (!f) die("cannot write the output");
    fprintf(f,
            "{\n \"producer\": \"llama.cpp (libllama, .ci/golden/golden.cpp), CPU, greedy\",\n \"tie_gap\": %.2f,\n"
            " \"rule\": \"free-running greedy: token_ids[:must_match] must be equal (must_match = first position whose "
            "llama.cpp top-1/top-2 logit gap is below tie_gap). Teacher-forced: feeding prompt_ids + token_ids, the argmax "
            "at every generated position whose top2_gap >= tie_gap must equal token_ids there\",\n \"cases\": [\n%s\n ]\n}\n",
            TIE_GAP, cases.c_str());
    fclose(f);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
