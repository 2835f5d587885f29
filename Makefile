# SPDX-License-Identifier: GPL-2.0
#
# neuron-udma: module build and project entry points.
#
#   make                 build the module against the project's cached test kernel (built on first
#                        use inside the toolchain root), or against KDIR=/path/to/kernel/build
#   make CLIPPY=1        the same, with clippy on every Rust object
#   make check           cargo test + VM runs on the trn1 and trn2 models (KUnit + kselftests)
#   make demo            boot the trn1 model; udmactl copies a 64 MiB file host -> HBM -> host
#   make bench           boot the trn1 model on the production-config bench kernel and print the
#                        benchmark table (Documentation/benchmarks.rst); KERNEL=debug: the test kernel
#   make vm MODEL=trn2 CMD='...'   run a guest command with the module loaded
#   make fuzz [MODEL=trn1] [SEED=n] [OPS=n]   a long run of the ABI fuzzer (Documentation/udma-fuzz.rst)
#   make fmt / fmt-check rustfmt on the module and the tools workspace
#   make clean

# Build against this kernel build tree. Empty: the project's test kernel (scripts/build-kernel).
KDIR ?=
# Compile the KUnit suites into the module (the test kernel has CONFIG_KUNIT=y).
KUNIT ?= $(if $(KDIR),0,1)
MODEL ?= trn1
# The kernel of make bench: bench (production config, the default) or debug (the test kernel).
KERNEL ?= bench
CMD ?= true

# What kbuild's `M=... clean` removes, for `make clean` without a kernel build tree.
MODULE_CLEAN := cd $(CURDIR) && rm -f $(foreach d,. rust,$(addprefix $(d)/,*.o *.ko *.mod *.mod.c *.mod.o \
	.*.cmd .*.o *.a *.rmeta *.d .*.d *.symvers)) modules.order Module.symvers rust/uapi_generated.rs && \
	rm -rf .tmp_versions

KBUILD_ARGS := M=$(CURDIR) $(if $(filter 1,$(KUNIT)),NEURON_UDMA_KUNIT=y) $(if $(CLIPPY),CLIPPY=$(CLIPPY)) \
	$(if $(filter y,$(NEURON_UDMA_BENCH)),NEURON_UDMA_BENCH=y)

.PHONY: all modules clean check demo bench vm fuzz fmt fmt-check kernel toolchain

all: modules

ifeq ($(KDIR),)
modules:
	@kdir=$$(scripts/build-kernel) && \
	  scripts/in-root make --no-print-directory -C "$$kdir" LLVM=1 $(KBUILD_ARGS) modules
# Builds nothing: with the cached test kernel, kbuild's clean; without one (nothing was built
# against it, or the cache is gone), the module's kbuild outputs are removed directly.
clean:
	@if kdir=$$(scripts/build-kernel --existing); then \
	  scripts/in-root make -C "$$kdir" LLVM=1 M=$(CURDIR) clean; \
	else \
	  echo "no test kernel in the cache: removing the module's build outputs directly"; \
	  $(MODULE_CLEAN); \
	fi
	rm -rf build/kselftests build/demo
else
# An external kernel build tree (e.g. /lib/modules/$(uname -r)/build on a Neuron host). Pass
# LLVM=1 when that kernel was built with clang.
modules:
	$(MAKE) -C $(KDIR) $(KBUILD_ARGS) modules
clean:
	$(MAKE) -C $(KDIR) M=$(CURDIR) clean
endif

kernel:
	scripts/build-kernel
toolchain:
	scripts/toolchain-root

check:
	scripts/check

demo:
	scripts/demo

bench:
	KERNEL=$(KERNEL) scripts/bench

vm:
	scripts/vm-run --model $(MODEL) -- '$(CMD)'

# Long fuzzer runs: OPS operations (half of them with fault storms) from SEED (default: the
# clock), on the guest of `make vm` (debug kernel, the module as `make` builds it); the guest may
# run for up to 12 hours. Logs in build/fuzz/MODEL/; the run fails on a kernel splat too.
OPS ?= 1000000
SEED ?=
SPLATS := BUG:|WARNING:|KASAN|possible (circular|recursive)|INFO: task .* blocked|soft lockup|rcu_.*stall|Oops|Kernel panic
fuzz:
	scripts/vm-run --model $(MODEL) --timeout 43200 --log-dir build/fuzz/$(MODEL) -- \
	  'udma-fuzz --ops $(OPS) $(if $(SEED),--seed $(SEED))'
	@if grep -E '$(SPLATS)' build/fuzz/$(MODEL)/console.log; then \
	  echo "kernel splat during the fuzz run (build/fuzz/$(MODEL)/console.log)"; exit 1; fi

RUSTFMT := scripts/in-root rustfmt --edition 2021 --config-path /usr/src/linux/.rustfmt.toml
RUST_SRCS := $(filter-out rust/uapi_generated.rs,$(wildcard rust/*.rs))

fmt:
	$(RUSTFMT) $(RUST_SRCS)
	cd tools && cargo fmt

fmt-check:
	$(RUSTFMT) --check $(RUST_SRCS)
	cd tools && cargo fmt --check
