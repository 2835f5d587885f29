# SPDX-License-Identifier: GPL-2.0
#
# neuron-udma: module build and project entry points.
#
#   make                 build the module against the project's cached test kernel (built on first
#                        use inside the toolchain root), or against KDIR=/path/to/kernel/build
#   make CLIPPY=1        the same, with clippy on every Rust object
#   make check           the gate: shellcheck, parser and layout tests, cargo test, per model (trn1,
#                        trn2) a main, a multi-device and a NUMA VM pass (KUnit + kselftests), DKMS
#   make demo            boot the trn1 model; udmactl copies a 64 MiB file host -> HBM -> host, twice
#   make bench           boot the trn1 model on the production-config bench kernel and print the
#                        benchmark table (Documentation/benchmarks.rst); KERNEL=debug: the test kernel
#   make vm MODEL=trn2 CMD='...'   run a guest command with the module loaded
#   make fuzz [MODEL=trn1] [SEED=n] [OPS=n] [KERNEL=bench]   a long run of the ABI fuzzer on the
#                        debug kernel, or the production one (Documentation/udma-fuzz.rst)
#   make fmt / fmt-check rustfmt on the module and the tools workspace
#   make toolchain       resolve the toolchain root's package versions and build it if new
#                        (scripts/toolchain-root; its path is printed)
#   make kernel          build only the test kernel (cached; its path is printed)
#   make dkms-src [DKMS_SRC=DIR]   copy the DKMS source tree (dkms.conf and what the module build
#                        needs) to DIR, by default /usr/src/neuron-udma-<version> (as root: it
#                        writes the host's /usr/src; README: "Install on a Neuron host")
#   make dkms-install [KVER=...] [BLACKLIST_NEURON=1] [UDEV=0] [LOAD=0] [DESTDIR=DIR]   on a Neuron
#                        host, as root: the DKMS source tree, dkms add/build/install, the udev rule,
#                        with BLACKLIST_NEURON=1 AWS's neuron driver blacklisted, then modprobe; with
#                        DESTDIR everything under DIR, nothing of the host touched (scripts/dkms-install;
#                        Documentation/operator.rst). Elsewhere make dkms-check tries it safely
#   make dkms-uninstall [DESTDIR=DIR]   undo all of it: unload, dkms remove, the source tree, the
#                        udev rule, the blacklist and the CDI spec removed
#   make dkms-check      build, install and load the module through DKMS against the test kernel,
#                        then run the demo copy with it in a trn1 guest (Documentation/dkms.rst)
#   make boot-soak [MODEL=trn1] [BOOTS=40] [LA57=1]   boot the debug kernel BOOTS times and count
#                        kernel splats (Documentation/test-platform.rst)
#   make clean           remove the module objects, build/kselftests, build/examples, build/demo, build/dkms
#   make help            list these targets

# Build against this kernel build tree. Empty: the project's test kernel (scripts/build-kernel).
KDIR ?=
# Compile the KUnit suites into the module (the test kernel has CONFIG_KUNIT=y).
KUNIT ?= $(if $(KDIR),0,1)
MODEL ?= trn1
# The kernel of make bench and make fuzz: bench (production config) or debug (the test kernel).
# make bench defaults to bench; make fuzz to debug (FUZZ_KERNEL below).
KERNEL ?= bench
CMD ?= true
# The package version: defined once, in dkms.conf.
PKG_VERSION := $(shell sed -n 's/^PACKAGE_VERSION="\(.*\)"$$/\1/p' $(CURDIR)/dkms.conf)

# What kbuild's `M=... clean` removes, for `make clean` without a kernel build tree.
MODULE_CLEAN := cd $(CURDIR) && rm -f $(foreach d,. rust rust/kfac,$(addprefix $(d)/,*.o *.ko *.mod *.mod.c \
	*.mod.o .*.cmd .*.o *.a *.rmeta *.d .*.d *.symvers)) modules.order Module.symvers \
	rust/uapi_generated.rs rust/kfac/*_generated.rs && \
	rm -rf .tmp_versions

KBUILD_ARGS := M=$(CURDIR) $(if $(filter 1,$(KUNIT)),NEURON_UDMA_KUNIT=y) $(if $(CLIPPY),CLIPPY=$(CLIPPY)) \
	$(if $(filter y,$(NEURON_UDMA_BENCH)),NEURON_UDMA_BENCH=y)

.PHONY: all modules clean check demo bench vm fuzz fmt fmt-check kernel toolchain dkms-src dkms-check \
	dkms-install dkms-uninstall boot-soak help

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
	rm -rf build/kselftests build/examples build/demo build/dkms
else
# An external kernel build tree (e.g. /lib/modules/$(uname -r)/build on a Neuron host, or DKMS's
# MAKE line). LLVM=1 when that kernel's config says it was built with clang (the module must be
# built with the kernel's compiler); LLVM=... on the command line overrides it.
LLVM ?= $(if $(shell grep -s -h '^CONFIG_CC_IS_CLANG=y' $(KDIR)/include/config/auto.conf $(KDIR)/.config),1)
modules:
	$(MAKE) -C $(KDIR) $(if $(LLVM),LLVM=$(LLVM)) $(KBUILD_ARGS) modules
clean:
	$(MAKE) -C $(KDIR) $(if $(LLVM),LLVM=$(LLVM)) M=$(CURDIR) clean
endif

kernel:
	scripts/build-kernel
toolchain:
	scripts/toolchain-root

check:
	scripts/check

demo:
	@scripts/demo

BOOTS ?= 40
LA57 ?=
boot-soak:
	scripts/boot-soak --model $(MODEL) --boots $(BOOTS) $(if $(LA57),--la57)

# The targets and what they do: the comment block at the head of this file.
help:
	@sed -n '/^#   make/,/^$$/p' $(firstword $(MAKEFILE_LIST)) | sed -n '/^#/s/^# \{0,1\}//p'

bench:
	KERNEL=$(KERNEL) scripts/bench

vm:
	scripts/vm-run --model $(MODEL) -- '$(CMD)'

# Long fuzzer runs: OPS operations (half of them with fault storms) from SEED (default: the
# clock), on the guest of `make vm` (debug kernel, the module as `make` builds it), or with
# KERNEL=bench on the production-config bench kernel with the production module (no KUnit
# suites; about 3.7x the operations per second under TCG, no sanitizers); the guest may run for
# up to 12 hours. Logs in build/fuzz/MODEL/ (build/fuzz/MODEL-bench/); the run fails on a
# kernel splat too.
OPS ?= 1000000
SEED ?=
FUZZ_KERNEL := $(if $(filter command line environment,$(origin KERNEL)),$(KERNEL),debug)
ifneq ($(filter fuzz,$(MAKECMDGOALS)),)
ifeq ($(filter bench debug,$(FUZZ_KERNEL)),)
$(error make fuzz: KERNEL=$(FUZZ_KERNEL): use KERNEL=bench (production) or KERNEL=debug (the test kernel, the default))
endif
endif
FUZZ_LOG := build/fuzz/$(MODEL)$(if $(filter bench,$(FUZZ_KERNEL)),-bench)
SPLATS := BUG:|WARNING:|KASAN|possible (circular|recursive)|INFO: task .* blocked|soft lockup|rcu_.*stall|Oops|Kernel panic
fuzz:
ifeq ($(FUZZ_KERNEL),bench)
	mkdir -p build/fuzz
	@# The production module for the bench kernel, copied out; then the clone's module is the
	@# test build again (as scripts/bench does), all under vm-run's build lock.
	kdir=$$(scripts/build-kernel --kind bench) && { flock 8; \
	  scripts/in-root make -s --no-print-directory -C "$$kdir" LLVM=1 M=$(CURDIR) modules && \
	  cp neuron_udma.ko build/fuzz/neuron_udma-bench.ko && \
	  make -s --no-print-directory -C $(CURDIR) modules && scripts/build-guest-tools udma-fuzz; \
	  } 8>build/.build.lock
	scripts/vm-run --model $(MODEL) --timeout 43200 --log-dir $(FUZZ_LOG) --kernel bench \
	  --module build/fuzz/neuron_udma-bench.ko -- 'udma-fuzz --ops $(OPS) $(if $(SEED),--seed $(SEED))'
else
	scripts/vm-run --model $(MODEL) --timeout 43200 --log-dir $(FUZZ_LOG) -- \
	  'udma-fuzz --ops $(OPS) $(if $(SEED),--seed $(SEED))'
endif
	@if grep -E '$(SPLATS)' $(FUZZ_LOG)/console.log; then \
	  echo "kernel splat during the fuzz run ($(FUZZ_LOG)/console.log)"; exit 1; fi

RUSTFMT := scripts/in-root rustfmt --edition 2021 --config-path /usr/src/linux/.rustfmt.toml
# Without the files Kbuild generates with bindgen (rust/uapi_generated.rs, rust/kfac/*_generated.rs).
RUST_SRCS := $(filter-out %_generated.rs,$(wildcard rust/*.rs rust/*/*.rs))

fmt:
	$(RUSTFMT) $(RUST_SRCS)
	cd tools && cargo fmt

fmt-check:
	$(RUSTFMT) --check $(RUST_SRCS)
	cd tools && cargo fmt --check

# The DKMS source tree: dkms.conf and what `make KDIR=...` needs to build the module (this
# Makefile, Kbuild, the module's sources, the headers bindgen reads) and the udev rule of the
# device nodes (udev/, which the operator installs: Documentation/dkms.rst); no build products,
# no tools or tests. Which suites a build compiles in is chosen by the build (dkms.conf: none).
DKMS_SRC ?= /usr/src/neuron-udma-$(PKG_VERSION)
DKMS_FILES := dkms.conf Makefile Kbuild $(RUST_SRCS) $(wildcard rust/*.c rust/*.h rust/*/*.c rust/*/*.h) \
	$(wildcard include/uapi/linux/*.h) udev/60-neuron-udma.rules

# A tree make dkms-src made before (its marker, .neuron-udma-dkms-src) at DKMS_SRC is replaced; any
# other non-empty directory is refused, and so are this clone, a directory holding it or inside it
# (but build/), and a directory holding a .git (scripts/lib.sh, nu_dkms_src).
dkms-src:
	@bash -c 'set -euo pipefail; . "$(CURDIR)/scripts/lib.sh"; nu_dkms_src "$$@"' dkms-src "$(DKMS_SRC)" "$(PKG_VERSION)" $(DKMS_FILES)

dkms-check:
	scripts/dkms-check

# The install on a Neuron host and its undoing (scripts/dkms-install --help). DESTDIR=DIR puts
# everything under DIR, DKMS's tree (DIR/var/lib/dkms) and the module (DIR/lib/modules) included,
# and runs no modprobe, depmod or udevadm (scripts/dkms-check does so in the toolchain root).
KVER ?=
BLACKLIST_NEURON ?=
UDEV ?= 1
LOAD ?= 1
DKMS_INSTALL_ARGS := $(if $(DESTDIR),--destdir $(DESTDIR))
dkms-install:
	scripts/dkms-install $(DKMS_INSTALL_ARGS) $(if $(KVER),--kernel $(KVER)) \
	  $(if $(filter 1,$(BLACKLIST_NEURON)),--blacklist-neuron) $(if $(filter 0,$(UDEV)),--no-udev) \
	  $(if $(filter 0,$(LOAD)),--no-load)
dkms-uninstall:
	scripts/dkms-install --uninstall $(DKMS_INSTALL_ARGS)
