# SPDX-License-Identifier: GPL-2.0
# shellcheck shell=bash
# Shared settings for the neuron-udma scripts. Source it (after `set -euo pipefail`); do not run it.
#
# Every failure exit says what failed: nu_die for the failures a script expects, and an ERR trap
# for any other command that fails under `set -e` (it names the script, the line and the command).
# Commands whose non-zero status is normal (a glob matching nothing, `grep -q` finding nothing,
# `ls` of a missing path) must not run bare under `set -e`: use nu_count / nu_first or `|| ...`.

# Repository root (absolute).
NU_TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Heavy artefacts live outside the repository, keyed by their inputs.
NU_CACHE=${NEURON_UDMA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/neuron-udma}

nu_log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
nu_die() { nu_log "error: $*"; exit 1; }

# What to do when a command fails unexpectedly; scripts set it for their long phases.
NU_HINT=${NU_HINT:-"see the messages above"}
nu_on_err() {
	local rc=$1 line=$2 src=$3 cmd=$4
	# A failing subshell or command substitution is reported once, by the command that ran it.
	[ "$BASH_SUBSHELL" = 0 ] || return 0
	nu_log "error: ${src#"$NU_TOP"/}, line $line: '$cmd' failed (exit status $rc); $NU_HINT"
}
set -o errtrace
trap 'nu_on_err "$?" "$LINENO" "${BASH_SOURCE[0]}" "$BASH_COMMAND"' ERR

# Number of existing paths among the arguments (pass an unquoted glob: nu_count "$d"/kernel-*/.x).
nu_count() {
	local n=0 f
	for f in "$@"; do
		if [ -e "$f" ]; then n=$((n + 1)); fi
	done
	echo "$n"
}

# The first existing path among the arguments; fails (status 1, no output) when none exists.
nu_first() {
	local f
	for f in "$@"; do
		if [ -e "$f" ]; then
			echo "$f"
			return 0
		fi
	done
	return 1
}

# Hash of files and strings: nu_hash FILE... -- STRING...
nu_hash() {
	{
		while [ $# -gt 0 ] && [ "$1" != "--" ]; do cat "$1"; shift; done
		[ "${1:-}" = "--" ] && shift
		printf '%s\n' "$@"
	} | sha256sum | cut -c1-16
}

# The Debian mirror the host's apt already uses (never written into the repo).
nu_mirror() {
	local uri=""
	if [ -r /etc/apt/sources.list.d/debian.sources ]; then
		uri=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' \
			/etc/apt/sources.list.d/debian.sources)
	fi
	if [ -z "$uri" ] && [ -r /etc/apt/sources.list ]; then
		uri=$(awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) { print $i; exit } }' \
			/etc/apt/sources.list)
	fi
	[ -n "$uri" ] || nu_die "no Debian mirror found in the host's apt configuration"
	printf '%s\n' "${uri%/}"
}

# The toolchain root of the last version resolution (scripts/toolchain-root), without resolving
# again (no network): the path in $NU_CACHE/root-current, if that root is complete. Fails (status
# 1, no output) when there is none.
nu_current_root() {
	local r
	r=$(cat "$NU_CACHE/root-current" 2>/dev/null) || return 1
	[ -e "$r/.complete" ] || return 1
	echo "$r"
}

# The packages whose versions make a kernel build what it is (the source, the compilers and
# linker, bindgen, the build tools): a kernel's cache key covers their exact versions.
NU_KERNEL_INPUTS="linux-source-7.3 clang-19 lld-19 llvm-19 libclang1-19 rustc rust-src libstd-rust-dev bindgen make bison flex"

# "pkg version" lines of the NU_KERNEL_INPUTS in the versions file $1 of a toolchain root.
nu_kernel_input_versions() {
	local p
	for p in $NU_KERNEL_INPUTS; do
		grep -m1 "^$p " "$1" || echo "$p (not in the root)"
	done
}

# Dies unless FILE can run in the test guest (busybox, no C library): a static ELF executable (no
# program interpreter: static or static-pie) or a script run by /bin/sh. Says how to build one.
nu_guest_program() {
	local f=$1 magic phoff phentsize phnum i type interp
	[ -f "$f" ] || nu_die "--bin $f: no such file"
	[ -r "$f" ] || nu_die "--bin $f: not readable"
	magic=$(head -c 4 "$f" | od -An -c | tr -d ' ')
	case "$magic" in
	'#!'*)
		case "$(head -n1 "$f")" in
		'#!/bin/sh'* | '#!/bin/busybox'*) return 0 ;;
		*) nu_die "--bin $f: a script for $(head -n1 "$f" | cut -c3-); the guest has only busybox: use #!/bin/sh" ;;
		esac
		;;
	'177ELF') ;;
	*) nu_die "--bin $f: not an executable (neither ELF nor a #!/bin/sh script)" ;;
	esac
	[ "$(od -An -t u1 -j 4 -N 1 "$f" | tr -d ' ')" = 2 ] ||
		nu_die "--bin $f: a 32-bit ELF file; the guest is x86-64"
	phoff=$(od -An -t u8 -j 32 -N 8 "$f" | tr -d ' ')
	phentsize=$(od -An -t u2 -j 54 -N 2 "$f" | tr -d ' ')
	phnum=$(od -An -t u2 -j 56 -N 2 "$f" | tr -d ' ')
	for ((i = 0; i < phnum; i++)); do
		type=$(od -An -t u4 -j $((phoff + i * phentsize)) -N 4 "$f" | tr -d ' ')
		if [ "$type" = 3 ]; then # PT_INTERP: dynamically linked
			interp=$(grep -a -o -m1 '/lib[a-z0-9_/]*/ld-[a-zA-Z0-9_.-]*' "$f" | head -n1 || true)
			nu_die "--bin $f: dynamically linked (it asks for ${interp:-a dynamic loader}); the guest has no C library: build it statically, C: gcc -static -I include/uapi -o PROG PROG.c; Rust: RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --target x86_64-unknown-linux-gnu"
		fi
	done
}
