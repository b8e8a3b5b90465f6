# AutoCompress build. One binary, build/autocompress, from the layers of DESIGN.md §2.
#
# Knobs:
#   OPT=-O2            optimisation flags
#   ARCH=-march=native instruction set (CPU kernels use AVX2/AVX-512 where present)
#   SANITIZE=address,undefined   build everything (and the tests) with sanitizers
#   CHECK_OPS=1        debug op check: a sync and an error check after every backend op
#                      (engine/backend.h eng_backend_check_ops; AC_CHECK_OPS=1 at run time too)
#   CUDA=1             also build the CUDA backend in cuda/ (needs nvcc, cuBLAS, NCCL)
#   BUILD=build        output folder (out of tree)
#   CUDA_ARCHS="80 89 90 120"    SM targets for CUDA=1
#   JOBS=N             parallel compiles of the builds that run, test and test-slow start (the
#                      machine's cores)
CC       ?= gcc
BUILD    ?= build
OPT      ?= -O2
ARCH     ?= -march=native
SANITIZE ?=
CUDA     ?= 0
NVCC     ?= nvcc
CUDA_HOME ?= /usr/local/cuda
CUDA_ARCHS ?= 80 89 90 120
JOBS     ?= $(shell nproc 2>/dev/null || echo 1)

# Package flags are read lazily, once, when a rule first needs them: the goals that
# install packages first (run, test, test-slow) build in a sub-make started after `deps`,
# so a fresh machine never compiles with the flags of packages it does not have yet.
PKGS := libmicrohttpd jansson sqlite3 libpq libcurl libpcre2-8 openssl
PKG_CFLAGS = $(eval PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null))$(PKG_CFLAGS)
PKG_LIBS   = $(eval PKG_LIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null))$(PKG_LIBS)

CFLAGS = -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -Wno-psabi -g $(OPT) $(ARCH) -fopenmp -fno-math-errno \
          -I. -I/usr/include/x86_64-linux-gnu/openblas-pthread $(PKG_CFLAGS)
LDLIBS = $(PKG_LIBS) -ldnnl -lopenblas -lm -lpthread -ldl -fopenmp
ifeq ($(CHECK_OPS),1)
  CFLAGS += -DAC_CHECK_OPS
endif
ifneq ($(SANITIZE),)
  CFLAGS += -fsanitize=$(SANITIZE) -fno-omit-frame-pointer -fno-sanitize-recover=undefined
  LDFLAGS += -fsanitize=$(SANITIZE)
  override BUILD := $(BUILD)-san
endif

# Library sources: every .c in the layer folders except the process entry.
LAYERS   := server api jobs compress storage engine
LIB_SRCS := $(filter-out server/main.c,$(foreach d,$(LAYERS),$(wildcard $(d)/*.c)))
LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/obj/%.o)

ifeq ($(CUDA),1)
  CU_SRCS  := $(wildcard cuda/*.cu)
  CU_OBJS  := $(CU_SRCS:%.cu=$(BUILD)/obj/%.o)
  CFLAGS   += -DAC_CUDA=1 -I$(CUDA_HOME)/include
  NVFLAGS  := -O2 -std=c++17 -I. -Xcompiler -Wall,-Wextra,-Werror $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a))
  LDLIBS   += -L$(CUDA_HOME)/lib64 -lcudart -lcublas -lcublasLt -lnccl -lstdc++
endif

TEST_SRCS := $(wildcard tests/unit/test_*.c)
TEST_BINS := $(TEST_SRCS:tests/unit/%.c=$(BUILD)/tests/%)
FUZZ_SRCS := $(wildcard tests/fuzz/fuzz_*.c)
# Helper programs for oracle tests and benchmarks: tests/tools/NAME.c and bench/*/NAME.c
# become build/tools/NAME (names must be unique), linked like the tests.
TOOL_SRCS := $(wildcard tests/tools/*.c bench/*/*.c)
TOOL_BINS := $(addprefix $(BUILD)/tools/,$(notdir $(TOOL_SRCS:.c=)))

# llama.cpp (the llama.cpp target engine): headers and libraries of the pinned PyPI
# llama-cpp-python in the project venv, found lazily by scripts/llamacpp.sh.
LLAMA_PREFIX = $(eval LLAMA_PREFIX := $(shell scripts/llamacpp.sh --prefix))$(LLAMA_PREFIX)
# Where ac-llama finds libllama and ggml at run time: the package's own folder, or where an
# image puts them (docker/Dockerfile: make LLAMA_RPATH=/usr/local/lib/autocompress/llama.cpp).
LLAMA_RPATH = $(LLAMA_PREFIX)/llama_cpp/lib

.PHONY: all run test test-slow test-sanitize deps clean fuzz lint llamacpp llamacpp-if-present
all: $(BUILD)/autocompress $(TEST_BINS) $(TOOL_BINS) llamacpp-if-present

deps:
	@scripts/install-deps.sh
	@scripts/llamacpp.sh install

# The helper program ac-llama (llamacpp/ac_llama.c) beside the binary, when llama.cpp is
# installed; without it the product reports llama.cpp as absent (GET /v1/engines).
llamacpp-if-present:
	@if [ -n "$(LLAMA_PREFIX)" ]; then $(MAKE) --no-print-directory $(BUILD)/ac-llama; fi
llamacpp:
	@[ -n "$(LLAMA_PREFIX)" ] || { echo "llama.cpp is not installed (run: scripts/llamacpp.sh install)" >&2; exit 1; }
	@$(MAKE) --no-print-directory $(BUILD)/ac-llama
# (rebuilt when llama.cpp is rebuilt with other flags: the helper reports them)
LLAMA_FLAGS_FILE = $(wildcard $(or $(AC_CACHE),$(HOME)/.cache/autocompress)/llamacpp-build-flags)
$(BUILD)/ac-llama: llamacpp/ac_llama.c engine/clock.c engine/clock.h engine/procstat.c engine/procstat.h engine/rng.h \
                   $(LLAMA_FLAGS_FILE) | $(BUILD)/.pkg-flags
	@echo "  LD    $@"
	@$(CC) $(CFLAGS) -I$(LLAMA_PREFIX)/include \
	    -DAC_LLAMA_PACKAGE_VERSION='"$(shell scripts/llamacpp.sh --version)"' \
	    -DAC_LLAMA_BUILD_FLAGS='"$(shell scripts/llamacpp.sh --build-flags)"' \
	    $(LDFLAGS) -o $@ llamacpp/ac_llama.c engine/clock.c engine/procstat.c -L$(LLAMA_PREFIX)/llama_cpp/lib \
	    -Wl,-rpath,$(LLAMA_RPATH) -lllama -lggml -lggml-base $(PKG_LIBS) -lm

# Every object waits for this check: without the packages' flags the build would fail
# later with a missing header or undefined references that do not say why.
$(BUILD)/.pkg-flags:
	@[ -n "$(strip $(PKG_LIBS))" ] || { echo "pkg-config knows none of: $(PKGS) (run: make deps)" >&2; exit 1; }
	@mkdir -p $(dir $@) && touch $@

$(BUILD)/obj/%.o: %.c | $(BUILD)/.pkg-flags
	@mkdir -p $(dir $@)
	@echo "  CC    $<"
	@$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	@echo "  NVCC  $<"
	@$(NVCC) $(NVFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libautocompress.a: $(LIB_OBJS) $(CU_OBJS)
	@rm -f $@
	@echo "  AR    $@"
	@ar rcs $@ $^

# The binary links the objects directly; the archive is for the tests and tools.
$(BUILD)/autocompress: $(BUILD)/obj/server/main.o $(LIB_OBJS) $(CU_OBJS)
	@echo "  LD    $@"
	@$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# (some tests measure in fresh autocompress processes: the program is built, and current, with them)
# A test's own link flags (e.g. -Wl,--wrap=SYMBOL to stand between the product's layers)
# sit in its source on a line of their own: / * ldflags: FLAGS * / (without the spaces).
$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/libautocompress.a $(BUILD)/autocompress
	@mkdir -p $(dir $@)
	@echo "  TEST  $@"
	@$(CC) $(CFLAGS) $(LDFLAGS) $$(sed -n 's|^/\* ldflags: \(.*\) \*/$$|\1|p' $<) -MMD -MP -o $@ $< \
		$(BUILD)/libautocompress.a $(LDLIBS) -lcmocka

define tool_rule
$(BUILD)/tools/$(notdir $(1:.c=)): $(1) $(BUILD)/libautocompress.a
	@mkdir -p $$(dir $$@)
	@echo "  TOOL  $$@"
	@$$(CC) $$(CFLAGS) $$(LDFLAGS) -MMD -MP -o $$@ $$< $(BUILD)/libautocompress.a $$(LDLIBS)
endef
$(foreach t,$(TOOL_SRCS),$(eval $(call tool_rule,$(t))))

# The goals below install packages first, then build in a sub-make, which reads the
# package flags only then (a fresh machine has none before `deps`).
# make run: build, then start the server with its embedded defaults and run the demo against it.
run: deps
	@$(MAKE) --no-print-directory -j$(JOBS) $(BUILD)/autocompress
	@scripts/run.sh $(BUILD)/autocompress

# make test: unit tests, black-box HTTP tests and numerical oracles; closes with "N passed, N failed".
test: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@BUILD=$(BUILD) tests/run_all.sh

# The slow tier too: llama.cpp (PyPI llama-cpp-python, built from source) and SmolLM2 checks.
test-slow: deps
	@$(MAKE) --no-print-directory -j$(JOBS) all
	@AC_SLOW=1 BUILD=$(BUILD) tests/run_all.sh

# (scripts marked "# sanitize: once" run in make test only: tests/run_all.sh)
test-sanitize:
	@AC_PG=store AC_SANITIZED=1 $(MAKE) --no-print-directory test SANITIZE=address,undefined OPT=-O1

fuzz:
	@tests/fuzz/build.sh

# Source rules: banned functions, the layering of DESIGN.md §2, file and function sizes,
# every source file in docs/layers.md (scripts/lint.py says which rule each fault breaks).
lint:
	@python3 scripts/lint.py
	@scripts/hadolint.sh

clean:
	rm -rf build build-san

# openapi.yaml is embedded into api_misc.o with .incbin.
$(BUILD)/obj/api/api_misc.o: openapi/openapi.yaml

-include $(LIB_OBJS:.o=.d) $(CU_OBJS:.o=.d) $(BUILD)/obj/server/main.d $(TEST_BINS:=.d) $(TOOL_BINS:=.d)
