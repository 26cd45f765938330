# Generates smollm2-tokenizer-cases.json: llama.cpp's own tokenization and
# detokenization of SmolLM2 (llama-cpp-python, vocabulary only) on varied text,
# which runtime/src/tokenizer/tests.rs compares against exactly. Not run by CI.
#
#   python3 -m venv venv && venv/bin/pip install llama-cpp-python==0.3.36
#   venv/bin/python smollm2-tokenizer-cases.py \
#       ../../../models/SmolLM2-135M-Instruct.Q4_1.gguf smollm2-tokenizer-cases.json
import json, random, sys
import llama_cpp
from llama_cpp import Llama

model = sys.argv[1]
llm = Llama(model_path=model, vocab_only=True, verbose=False)
texts = [
    "Hello world", "Hello, world!", " leading space", "trailing space ", "  two leading",
    "a  b   c    d", "tab\there", "\t\tindented\n\t\tcode", "line1\nline2\r\nline3\n\n\nend",
    "   ", "\n", "\n\n", " \n ", "x\n\n  y", "a \t b  ",
    "12345", "3.14159", "1,000,000", "in 2024!", "v1.25 is", "0x7f 0b1010 1e-5", "٣٤٥ ⅷ ²³ ½",
    "I'm, you're, they've, we'll, she'd, it's, DON'T, 'quoted'", "don't", "it''s",
    "Здравствуй, мир!", "你好，世界。", "こんにちは、世界", "안녕하세요", "مرحبا بالعالم", "שלום עולם", "Ελληνικά", "हिन्दी",
    "emoji 🙂👍🏽 👨‍👩‍👧 🇫🇷 ❤️", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "café naïve résumé", "Straße", "ﬁ ligature",
    "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n", "def f(x):\n    return x**2  # square\n",
    "<html><body class=\"x\">Hi</body></html>", "SELECT * FROM t WHERE a >= 10;", "$$E=mc^2$$", "C++ && C# || F#",
    "https://example.com/path?q=1&r=2#frag", "user@example.com", "!!!???...---", "((([[[{{{",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>", "text<|im_end|>more", "<|im_start",
    "<repo_name>tessera<file_sep>main.rs", " " * 40, "a" + " " * 100 + "b", "\u00a0nbsp\u2009thin\u3000ideographic",
    "\u200bzero\u200cwidth\u200d", "\ufeffbom", "mixed ABC abc ÀÉÎ àéî", "CamelCaseIdentifier snake_case_name kebab-case",
]
# Bytes without a token of their own (0x04, 0xF1), and long runs (regex backtracking).
texts += ["a\x04b \U00040000", " " * 3000 + "x", "a" + " \t" * 400 + "\n", "word " * 500]
rng = random.Random(12345)
pool = list("abcdefghijklmnopqrstuvwxyz ABCXYZ 0123456789 \t\n\n  .,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`") + \
    list("éüßñçøåλπΩжщ中文日本語한국어ÿ€™°±√∞≈≠") + ["🙂", "👍🏽", "🇫🇷", "\u0301", "'s", "'ll", "  ", "\r\n", "٣", "Ⅻ", "¼"]
for _ in range(150):
    texts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 40))))
cases = []
for t in texts:
    for special in (False, True):
        ids = llm.tokenize(t.encode("utf-8"), add_bos=False, special=special)
        cases.append({"text": t, "parse_special": special, "ids": ids})
# Detokenization of the special-parsed ids, rendering specials and not.
# llama-cpp-python's detokenize uses a 32-byte piece buffer and drops longer
# pieces (whitespace-run tokens), so call llama_token_to_piece with a large one.
import ctypes
def detokenize(ids):
    out = b""
    buf = (ctypes.c_char * 1024)()
    for i in ids:
        n = llama_cpp.llama_token_to_piece(llm._model.vocab, llama_cpp.llama_token(i), buf, 1024, 0, False)
        assert 0 <= n <= 1024
        out += bytes(buf[:n])
    return out
for c in cases:
    c["detok"] = detokenize(c["ids"]).decode("utf-8", errors="replace")
meta = {
    "producer": f"llama-cpp-python {llama_cpp.__version__} (llama.cpp), vocab_only, tokenize(add_bos=False, special=parse_special); detok: llama_token_to_piece(special=False) of ids, joined, UTF-8 with errors replaced",
    "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
}
with open(sys.argv[2], "w") as f:
    # One case per line: readable diffs without an id per line.
    f.write(json.dumps(meta, ensure_ascii=False)[:-1] + ', "cases": [\n')
    f.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in cases))
    f.write("\n]}\n")
print(len(cases))
