# nerve — one binary, built for x86-64-v3 with run-time dispatch to AVX-512 and AMX kernels.
#   make          build/nerve
#   make test     install missing packages, build, run the tests, then again under ASan+UBSan
#   make demo     install missing packages, build, and run the demo
#   make bench-peers  build/peers/nerve-peer: the OpenBLAS/oneDNN peers of `nerve bench matmul`
#                 (after scripts/deps.sh --bench); nerve itself never links them
.DEFAULT_GOAL := all
CC      ?= gcc
WARN    := -Wall -Wextra -Werror
BASE    := -std=c11 -D_GNU_SOURCE -Isrc -ffp-contract=off -fno-math-errno -pthread -MMD -MP
OPT     := -O2 -march=x86-64-v3 -g
SAN     := -O2 -march=x86-64-v3 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
LDLIBS  := -lm -lpthread -lmicrohttpd -lcjson -lpcre2-8 -lunistring -lnettle -lz -lcurl
# OpenMPI, for `mpirun -np N nerve train` (src/train/dist.c); without its headers nerve builds for
# one process and says so when a launcher starts it
MPI_LIBS := $(shell pkg-config --libs ompi-c 2>/dev/null)
ifneq ($(MPI_LIBS),)
MPI_CFLAGS := -DNV_HAVE_MPI $(shell pkg-config --cflags ompi-c)
LDLIBS  += $(MPI_LIBS)
endif
# named after whether OpenMPI was found: dist.c is rebuilt when that changes (OpenMPI installed later)
MPI_STAMP := build/mpi-$(if $(MPI_LIBS),on,off).stamp
$(MPI_STAMP):
	@mkdir -p build && rm -f build/mpi-*.stamp && touch $@

# the commit the binary is built from (`nerve --version`): build/version.h, rewritten only when it
# changes, so that main.c alone is compiled again after a commit
NV_COMMIT := $(shell git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)
build/version.h: FORCE
	@mkdir -p build && printf '#define NV_COMMIT "%s"\n' '$(NV_COMMIT)' > $@.tmp && \
	  { cmp -s $@.tmp $@ && rm -f $@.tmp || mv -f $@.tmp $@; }
FORCE:

LIB_SRC  := $(sort $(wildcard src/base/*.c src/engine/*.c src/model/*.c src/train/*.c src/serve/*.c))
CLI_SRC  := $(sort $(wildcard src/cli/*.c))
TEST_SRC := $(sort $(wildcard tests/test_*.c))

# $(call objs,variant,sources)
objs = $(patsubst %.c,build/$(1)/obj/%.o,$(2))

.PHONY: all test demo deps clean bench-peers FORCE
# the test programs' objects are intermediate files of a chain of pattern rules: kept, so that the
# next make does not compile them again
.SECONDARY:
all: build/nerve

define variant
build/$(1)/obj/%.o: %.c
	@mkdir -p $$(dir $$@)
	$$(CC) $$(BASE) $$(WARN) $(2) $$(OBJ_EXTRA) -c $$< -o $$@

build/$(1)/obj/src/serve/webui.o: src/serve/webui.html
build/$(1)/obj/src/cli/main.o build/$(1)/obj/src/cli/cmd_info.o: build/version.h
build/$(1)/obj/src/cli/main.o build/$(1)/obj/src/cli/cmd_info.o: BASE += -Ibuild
build/$(1)/obj/src/train/dist.o: $(MPI_STAMP)
build/$(1)/obj/src/train/dist.o: BASE += $(MPI_CFLAGS)

build/$(1)/libnerve.a: $$(call objs,$(1),$$(LIB_SRC))
	@rm -f $$@
	ar rcs $$@ $$^

build/$(1)/nerve: $$(call objs,$(1),$$(CLI_SRC)) build/$(1)/libnerve.a
	$$(CC) $(2) $$^ $$(LDLIBS) -o $$@

build/$(1)/tests/%: build/$(1)/obj/tests/%.o build/$(1)/libnerve.a
	@mkdir -p $$(dir $$@)
	$$(CC) $(2) $$^ $$(LDLIBS) -o $$@

-include $$(shell find build/$(1)/obj -name '*.d' 2>/dev/null)
endef
$(eval $(call variant,release,$(OPT)))
$(eval $(call variant,asan,$(SAN)))
# The sanitizer build at -O2 runs the suite twice as fast as at -O1, but the kernels' unrolled
# micro-kernels take minutes to compile so: -O1 for them, but for the AVX2 kernels every machine
# runs (the fine-tunes of the sanitizer's pass spend most of their time there).
build/asan/obj/src/engine/kern_%.o: OBJ_EXTRA := -O1
build/asan/obj/src/engine/kern_avx2.o: OBJ_EXTRA :=

build/nerve: build/release/nerve
	cp $< $@

TESTS_release := $(patsubst tests/%.c,build/release/tests/%,$(TEST_SRC))
TESTS_asan    := $(patsubst tests/%.c,build/asan/tests/%,$(TEST_SRC))

deps:
	@scripts/deps.sh

test: deps
	@$(MAKE) --no-print-directory -j$$(nproc) build/nerve $(TESTS_release) build/asan/nerve $(TESTS_asan)
	@rm -f build/results.txt
	@RESULTS_FILE=build/results.txt tests/run.sh release build/release/tests build/release/nerve
	@RESULTS_FILE=build/results.txt ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  tests/run.sh asan+ubsan build/asan/tests build/asan/nerve
	@awk '{p+=$$1; f+=$$2; s+=$$3} END {printf "%d passed, %d failed", p, f; if (s) printf ", %d skipped", s; printf "\n"; exit (f > 0)}' build/results.txt

demo: deps
	@$(MAKE) --no-print-directory -j$$(nproc) build/nerve
	@scripts/demo.sh

# The peers, built with whichever of OpenBLAS (cblas.h, via pkg-config when it knows openblas) and
# oneDNN (dnnl.h) is installed.
PEER_PC   := $(shell pkg-config --exists openblas 2>/dev/null && echo yes)
PEER_CBLAS := $(firstword $(wildcard /usr/include/*/openblas-pthread/cblas.h /usr/include/*/openblas*/cblas.h /usr/include/openblas/cblas.h))
PEER_BLAS := $(or $(PEER_PC),$(PEER_CBLAS))
PEER_DNNL := $(wildcard /usr/include/dnnl.h)
PEER_CFLAGS := $(if $(PEER_BLAS),-DHAVE_OPENBLAS $(if $(PEER_PC),$(shell pkg-config --cflags openblas),-I$(dir $(PEER_CBLAS)))) \
               $(if $(PEER_DNNL),-DHAVE_DNNL)
PEER_LIBS := $(if $(PEER_BLAS),$(if $(PEER_PC),$(shell pkg-config --libs openblas),-lopenblas)) $(if $(PEER_DNNL),-ldnnl)

bench-peers: build/peers/nerve-peer

build/peers/nerve-peer: bench/peers.c
	@if [ -z "$(PEER_BLAS)$(PEER_DNNL)" ]; then \
	  echo "bench-peers: neither OpenBLAS nor oneDNN is installed: run scripts/deps.sh --bench" >&2; exit 1; fi
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -D_GNU_SOURCE $(WARN) $(OPT) $(PEER_CFLAGS) $< $(PEER_LIBS) -o $@

clean:
	rm -rf build

# ---- fuzzing (clang + libFuzzer; never part of `make test`) ---------------------------------------
#   make fuzz        build/fuzz/fuzz_{model,tokenizer,hf,ckpt,api,chat,gbnf,choice,batch,jinja}: libFuzzer + ASan + UBSan (docs/fuzzing.md)
#   make fuzz-run    runs each for FUZZ_SECONDS (default 60) on a fresh copy of fuzz/corpus/NAME
#   make fuzz-seeds  regenerates fuzz/corpus from fuzz/gen_seeds.c
# clang ignores `#pragma GCC target`, so the files whose kernels gcc compiles under that pragma get
# the same features on their command line (their code only runs after the engine probe says so).
FUZZ_CC      ?= clang
FUZZ_NAMES   := model tokenizer hf ckpt api chat gbnf choice batch jinja
FUZZ_SECONDS ?= 60
FUZZ_SAN     := -fsanitize=fuzzer,address,undefined
FUZZ_FLAGS   := $(FUZZ_SAN) -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1 \
                -std=c11 -D_GNU_SOURCE -Isrc -pthread -march=x86-64-v3 -ffp-contract=off -fno-math-errno
# The vector int8 kernels' unrolled loops (src/engine/kern_qdot_tmpl.h's cases) take clang's coverage
# and UBSan instrumentation over ten minutes a file; fixed SIMD loops give the fuzzers nothing to
# steer by: ASan alone there (the tests run them under ASan and UBSan through gcc).
FUZZ_ASAN_ONLY := kern_avx512int8 kern_avxvnni kern_vdot_emu
FUZZ_TARGET_kern_avx512 := -mavx512f -mavx512bw -mavx512vl -mavx512dq
FUZZ_TARGET_kern_amx    := -mamx-tile -mamx-bf16 -mamx-int8
FUZZ_TARGET_kern_avx512bf16 := -mavx512f -mavx512bw -mavx512vl -mavx512bf16
FUZZ_TARGET_kern_avx512int8 := -mavx512f -mavx512bw -mavx512vl -mavx512vnni
FUZZ_TARGET_kern_avxvnni := -mavxvnni
FUZZ_TARGET_peak        := -mavx512f -mavx512bw -mavx512bf16 -mavx512vnni -mamx-tile -mamx-bf16 -mamx-int8
FUZZ_BINS    := $(patsubst %,build/fuzz/fuzz_%,$(FUZZ_NAMES))

.PHONY: fuzz fuzz-run fuzz-seeds
fuzz: $(FUZZ_BINS)

build/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(if $(filter $(basename $(notdir $<)),$(FUZZ_ASAN_ONLY)),$(subst $(FUZZ_SAN),-fsanitize=address,$(FUZZ_FLAGS)),$(FUZZ_FLAGS)) \
	  -MMD -MP -Wno-unknown-pragmas $(FUZZ_TARGET_$(basename $(notdir $<))) -c $< -o $@

build/fuzz/obj/src/serve/webui.o: src/serve/webui.html

build/fuzz/libnerve.a: $(call objs,fuzz,$(LIB_SRC))
	@rm -f $@
	ar rcs $@ $^

build/fuzz/fuzz_%: fuzz/fuzz_%.c fuzz/fuzz_util.h build/fuzz/libnerve.a
	$(FUZZ_CC) $(FUZZ_FLAGS) $(WARN) $< build/fuzz/libnerve.a $(LDLIBS) -o $@

-include $(shell find build/fuzz/obj -name '*.d' 2>/dev/null)

fuzz-run: fuzz
	@set -e; tmp=$${TMPDIR:-/tmp}; [ -w /dev/shm ] && tmp=/dev/shm; \
	for n in $(FUZZ_NAMES); do \
	  dir=$$(mktemp -d "$$tmp/nerve-corpus-$$n-XXXXXX"); cp fuzz/corpus/$$n/* "$$dir"/; \
	  dict=; [ -f fuzz/$$n.dict ] && dict=-dict=fuzz/$$n.dict; \
	  echo "== fuzz_$$n: $(FUZZ_SECONDS)s on a copy of fuzz/corpus/$$n"; \
	  TMPDIR=$$tmp build/fuzz/fuzz_$$n -max_total_time=$(FUZZ_SECONDS) -rss_limit_mb=2048 -timeout=10 \
	    -print_final_stats=1 -artifact_prefix=build/fuzz/$$n- $$dict "$$dir" || { echo "fuzz_$$n: failed, input saved under build/fuzz/"; exit 1; }; \
	  rm -rf "$$dir"; \
	done

fuzz-seeds: build/release/libnerve.a
	@mkdir -p build/fuzz
	$(CC) $(BASE) $(WARN) $(OPT) fuzz/gen_seeds.c build/release/libnerve.a $(LDLIBS) -o build/fuzz/gen_seeds
	build/fuzz/gen_seeds fuzz/corpus
