# tessera: developer and CI entry points. `make help` lists the targets.
#
# Every cargo call runs with target/tools/env sourced (written by .ci/setup):
# it sets LLVM_SYS_221_PREFIX for inkwell/llvm-sys and PTXAS (also on PATH).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

ENV_FILE := target/tools/env
CARGO := source $(ENV_FILE) && cargo
# Use the lock file as given when there is one; otherwise let cargo create it.
LOCKED := $(if $(wildcard Cargo.lock),--locked)

# Snapshot tests fail on a mismatch instead of writing .snap.new files.
export INSTA_UPDATE := no
export RUST_BACKTRACE ?= 1
export CARGO_TERM_COLOR ?= auto

.PHONY: help setup model vocab kquant-models test run fmt clippy clean deps-check synth-models golden-tool golden-synth golden-kquant

help:
	@echo "make run     main job: install what is missing, fetch the model, build, generate text"
	@echo "             (on the GPU, else natively on the CPU)"
	@echo "make test    what CI runs: rustfmt check, clippy -D warnings, all tests (host-check included)"
	@echo "make setup   install missing tools only (quiet when all are present)"
	@echo "make model   fetch and verify the reference model into models/"
	@echo "make vocab   fetch and verify the tokenizer tests' vocabulary files into models/vocab/"
	@echo "make kquant-models  requantize the model with llama.cpp to Q4_K_M, Q5_K_M, Q6_K, Q8_0, F16"
	@echo "make synth-models  write the synthetic Llama 3 / Mistral / Qwen2.5 / Qwen3 files into models/synth/"
	@echo "make golden-synth  llama.cpp goldens of those files into runtime/tests/data/synth-*.json"
	@echo "make golden-kquant llama.cpp goldens of the requantized files into runtime/tests/data/smollm2-135m-*.json"
	@echo "                   (needs libllama: LLAMA_CPP=/path/to/llama.cpp with build/bin, see ../shared/bench/llama-cpp.sh)"
	@echo "make fmt     format the workspace"
	@echo "make clippy  lint the workspace"
	@echo "make clean   remove target/ (the next setup reinstalls target/tools)"

setup:
	@bash .ci/setup

# The bundled reference model (SmolLM2-135M-Instruct, GGUF Q4_1), fetched and
# sha256-verified into models/ (quiet when already there).
model:
	@bash .ci/fetch-model

# Vocabulary-only GGUF files of llama.cpp's tokenizer tests (Llama 3, Qwen2,
# Qwen3.5, DeepSeek LLM and Coder, GPT-2, MPT, StarCoder, Refact, Llama 2
# SentencePiece, Phi-3) with llama.cpp's
# inputs and ids, fetched and sha256-verified into models/vocab/ (quiet when
# already there); runtime's tokenizer tests read them.
vocab:
	@bash .ci/fetch-vocab

# The reference model requantized by llama.cpp's llama-quantize to Q4_K_M,
# Q5_K_M, Q6_K, Q8_0 and F16 into models/ (git-ignored), for the K-quant
# tests; builds llama-quantize from llama.cpp's source when needed, skips
# with a message without cmake.
kquant-models: model
	@bash .ci/requantize

# Small random-weight models of each supported architecture with real
# vocabularies (`tessera synth --shape NAME`, deterministic), into models/synth/.
SYNTH_ARCHS := llama3:llama-bpe mistral:llama-spm qwen2.5:qwen2 qwen3:qwen2
synth-models: setup vocab
	$(CARGO) build $(LOCKED) -p runtime --bin tessera
	@mkdir -p models/synth
	@for a in $(SYNTH_ARCHS); do \
		target/debug/tessera synth --shape $${a%%:*} --vocab-from models/vocab/ggml-vocab-$${a#*:}.gguf \
			--out models/synth/$${a%%:*}.gguf; \
	done

# The golden tool (.ci/golden/golden.cpp) against a CPU build of llama.cpp.
LLAMA_CPP ?= /tmp/lcpp-work/llama.cpp
GOLDEN := target/golden/golden
golden-tool:
	@mkdir -p target/golden
	g++ -O2 -std=c++17 -I $(LLAMA_CPP)/include -I $(LLAMA_CPP)/ggml/include .ci/golden/golden.cpp \
		-L $(LLAMA_CPP)/build/bin -lllama -lggml -lggml-base -Wl,-rpath,$(LLAMA_CPP)/build/bin -o $(GOLDEN)

# llama.cpp's greedy continuations and top-2 gaps on the synthetic models, the
# test data of runtime's parity test (committed; rerun after changing them).
GOLDEN_PROMPTS := "The capital of France is" "def fibonacci(n):" "Once upon a time, 3 cats"
# llama.cpp's greedy continuations and top-2 gaps on the requantized SmolLM2
# files of `make kquant-models` (the same prompts), runtime's test data for
# the K-quant parity test (committed; rerun after requantizing).
KQUANT_TYPES := Q4_K_M Q5_K_M Q6_K Q8_0 F16
golden-kquant: kquant-models golden-tool
	@for t in $(KQUANT_TYPES); do l=$$(echo $$t | tr A-Z a-z); \
		$(GOLDEN) models/SmolLM2-135M-Instruct.$$t.gguf runtime/tests/data/smollm2-135m-$$l.json 24 $(GOLDEN_PROMPTS) 2>/dev/null; \
		echo "wrote runtime/tests/data/smollm2-135m-$$l.json"; \
	done

golden-synth: synth-models golden-tool
	@for a in $(SYNTH_ARCHS); do n=$${a%%:*}; \
		$(GOLDEN) models/synth/$$n.gguf runtime/tests/data/synth-$$n.json 24 $(GOLDEN_PROMPTS) 2>/dev/null; \
		echo "wrote runtime/tests/data/synth-$$n.json"; \
	done

test: setup model vocab deps-check
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets $(LOCKED) -- -D warnings
	$(CARGO) test --workspace --no-fail-fast $(LOCKED)

# Main job: fetch and verify SmolLM2-135M-Instruct (GGUF Q4_1), build the
# release `tessera` binary and generate text from a chat prompt, on the GPU
# when one is usable and with the native CPU backend otherwise (the kernels
# compiled by LLVM for this CPU; the binary says which, and `--device interp`
# runs the interpreter). PROMPT and MAX_TOKENS can be overridden:
# make run PROMPT="..."
PROMPT ?= What is the capital of France? Answer in one sentence.
MAX_TOKENS ?= 48
run: setup model
	$(CARGO) build --release $(LOCKED) -p runtime --bin tessera
	target/release/tessera generate --chat --max-tokens $(MAX_TOKENS) --prompt "$(PROMPT)"

fmt: setup
	$(CARGO) fmt --all

clippy: setup
	$(CARGO) clippy --workspace --all-targets $(LOCKED) -- -D warnings

clean:
	cargo clean

# Architecture invariants on the dependency graph (see ARCHITECTURE.md):
# dsl-core links neither LLVM nor the CUDA driver; codegen never touches cudarc.
deps-check: setup
	@! ( $(CARGO) tree -q -e normal -p dsl-core $(LOCKED) | grep -E 'inkwell|cudarc|llvm-sys' ) \
		|| { echo "dsl-core must not depend on inkwell/cudarc" >&2; exit 1; }
	@! ( $(CARGO) tree -q -e normal -p codegen $(LOCKED) | grep -E 'cudarc' ) \
		|| { echo "codegen must not depend on cudarc" >&2; exit 1; }
