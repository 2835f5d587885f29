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

# The Debian mirror the host's apt already uses (never written into the repo), or
# $NEURON_UDMA_MIRROR when set (a URL such as http://deb.debian.org/debian).
nu_mirror() {
	local uri=${NEURON_UDMA_MIRROR:-}
	if [ -n "$uri" ]; then
		printf '%s\n' "${uri%/}"
		return 0
	fi
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

# The sudo line of the README's quick start: root, keeping the caller's cargo.
# shellcheck disable=SC2016 # printed for the user to run, not expanded here
NU_SUDO_LINE='sudo env PATH="$PATH" RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}" bash'

# PATH, or its nearest existing parent.
nu_existing() {
	local d=$1
	while [ ! -e "$d" ]; do d=$(dirname "$d"); done
	echo "$d"
}

# Free space (MiB) of the file system holding PATH (or its nearest existing parent).
nu_free_mb() {
	df -Pm "$(nu_existing "$1")" | awk 'NR == 2 { print $4 }'
}

# Before anything is downloaded or built, what make demo, make check and scripts/vm-run need of
# the host; the first unmet need prints one verdict line `PREFIX FAILED: <what>; <the fix>` on
# stdout and exits 1 (PREFIX: "demo:" for make demo, else empty). Checked, in order:
#   - root: the toolchain root is made with mmdebstrap (as another user it falls back to its
#     fakechroot mode, which fails on trixie's glibc after downloading the packages) and every
#     build and guest enters it with unshare --mount and chroot (CAP_SYS_ADMIN, CAP_SYS_CHROOT);
#   - cargo, at least the rust-version of tools/neuron-udma/Cargo.toml (the host's cargo builds
#     the tools workspace; under sudo a rustup cargo needs PATH and RUSTUP_HOME kept);
#   - free disk where the cache and the clone live, for what is missing (measured: the
#     toolchain root 4.6 GB and its packages while it is built, the test kernel 0.7 GB, the
#     clone's tools/target 0.45-0.55 GB), plus 500 MB on each file system for what every run
#     writes (a warm make check: build/ about 50 MB, build/dkms, logs); a warm cache and built
#     tools need only the 500 MB; NU_PREFLIGHT_FREE_MB=N pretends N MiB are free (to try the
#     check);
#   - the Debian mirror (nu_mirror; a host whose apt names none fails here too) answering within
#     NU_PREFLIGHT_MIRROR_TIMEOUT seconds (10), through the host's apt (its proxies), only when
#     there is no complete toolchain root yet: a warm cache needs no network.
# Passes once per run: it exports NU_PREFLIGHT_DONE=1 for the scripts it starts.
nu_preflight() {
	local prefix=${1:+$1 } need want have root_ok=1 kernel_ok=1 cache_mb clone_mb cache_free clone_free
	local margin=500
	local mirror tmp timeout=${NU_PREFLIGHT_MIRROR_TIMEOUT:-10}
	local -a fails=()
	[ -z "${NU_PREFLIGHT_DONE:-}" ] || return 0
	# Every unmet need is one FAILED line; they are printed together (a user who is neither root
	# nor has cargo learns both at once), and the run stops.
	nu_verdict() { fails+=("${prefix}FAILED: $*"); }
	nu_preflight_stop() {
		[ ${#fails[@]} = 0 ] || {
			printf '%s\n' "${fails[@]}"
			exit 1
		}
	}

	[ "$(id -u)" = 0 ] || nu_verdict "running as $(id -un 2>/dev/null || id -u) (uid $(id -u)), not root:" \
		"the toolchain root is built with mmdebstrap and entered with unshare and chroot, which need" \
		"root; become root keeping your cargo, then run the command again: $NU_SUDO_LINE"

	want=$(sed -n 's/^rust-version *= *"\(.*\)"/\1/p' "$NU_TOP/tools/neuron-udma/Cargo.toml")
	if ! command -v cargo >/dev/null; then
		nu_verdict "no cargo in PATH ($PATH): install a Rust toolchain" \
			"(cargo ${want:-1.95} or newer, e.g. rustup: https://rustup.rs); under sudo keep your PATH" \
			"and RUSTUP_HOME: $NU_SUDO_LINE"
	else
		have=$(cargo --version 2>/dev/null | sed -n 's/^cargo \([0-9][0-9.]*\).*/\1/p' | head -n1 || true)
		if [ -z "$have" ]; then
			nu_verdict "cargo --version failed ($(cargo --version 2>&1 | head -n1)):" \
				"a rustup cargo without its toolchain? under sudo keep RUSTUP_HOME: $NU_SUDO_LINE"
		elif [ -n "$want" ] && [ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -n1)" != "$want" ]; then
			nu_verdict "cargo $have is older than $want (rust-version of tools/neuron-udma/Cargo.toml):" \
				"update the Rust toolchain (rustup update stable)"
		fi
	fi

	nu_current_root >/dev/null || root_ok=0
	"$NU_TOP/scripts/build-kernel" --existing >/dev/null 2>&1 || kernel_ok=0
	# What is missing, and a margin per file system for what every run writes.
	cache_mb=$(((1 - root_ok) * 5500 + (1 - kernel_ok) * 1000))
	clone_mb=0
	[ -d "$NU_TOP/tools/target/release" ] || clone_mb=1000
	cache_free=${NU_PREFLIGHT_FREE_MB:-$(nu_free_mb "$NU_CACHE")}
	clone_free=${NU_PREFLIGHT_FREE_MB:-$(nu_free_mb "$NU_TOP")}
	if [ "$(stat -c %d "$(nu_existing "$NU_CACHE")")" = "$(stat -c %d "$NU_TOP")" ]; then
		need=$((cache_mb + clone_mb + margin))
		[ "$cache_free" -ge "$need" ] || nu_verdict "$cache_free MiB free on the file system of $NU_CACHE" \
			"and $NU_TOP, $need MiB needed ($(nu_need_text "$root_ok" "$kernel_ok"), $(nu_clone_text "$clone_mb")," \
			"$margin MB margin): free space there, or put the cache elsewhere with NEURON_UDMA_CACHE=DIR"
	else
		[ "$cache_free" -ge "$((cache_mb + margin))" ] || nu_verdict "$cache_free MiB free for $NU_CACHE," \
			"$((cache_mb + margin)) MiB needed ($(nu_need_text "$root_ok" "$kernel_ok"), $margin MB margin):" \
			"free space there, or put the cache elsewhere with NEURON_UDMA_CACHE=DIR"
		[ "$clone_free" -ge "$((clone_mb + margin))" ] || nu_verdict "$clone_free MiB free for the clone" \
			"$NU_TOP, $((clone_mb + margin)) MiB needed ($(nu_clone_text "$clone_mb"), $margin MB margin):" \
			"free space there"
	fi

	# The mirror only once the rest holds (its check downloads).
	nu_preflight_stop
	if [ "$root_ok" = 0 ]; then
		if ! mirror=$(nu_mirror 2>/dev/null); then
			nu_verdict "no Debian mirror in the host's apt configuration" \
				"(/etc/apt/sources.list.d/debian.sources, /etc/apt/sources.list), and there is no toolchain" \
				"root yet to build without one: name a mirror with NEURON_UDMA_MIRROR=URL"
			nu_preflight_stop
		fi
		tmp=$(mktemp -d "${TMPDIR:-/tmp}/nu-preflight.XXXXXX")
		if ! timeout "$((timeout + 5))" /usr/lib/apt/apt-helper -o APT::Sandbox::User=root \
			-o Acquire::http::Timeout="$timeout" -o Acquire::https::Timeout="$timeout" \
			-o Acquire::Retries=0 download-file "$mirror/dists/trixie/InRelease" "$tmp/InRelease" \
			>"$tmp/log" 2>&1; then
			local why
			why=$(sed -n 's/^E: Failed to fetch [^ ]* *//p' "$tmp/log" | head -n1 | cut -c1-160)
			rm -rf "$tmp"
			nu_verdict "the Debian mirror $mirror gave no trixie index within $timeout s (${why:-no answer})," \
				"and there is no toolchain root yet to build without it: check the network or the" \
				"host's apt proxy, or name a reachable mirror with NEURON_UDMA_MIRROR=URL"
		fi
		rm -rf "$tmp"
	fi
	nu_preflight_stop
	export NU_PREFLIGHT_DONE=1
}

# What a cold cache still needs, for nu_preflight's message: nu_need_text ROOT_OK KERNEL_OK.
nu_need_text() {
	local parts=()
	[ "$1" = 1 ] || parts+=("the toolchain root: 5.5 GB while it is built")
	[ "$2" = 1 ] || parts+=("the test kernel: 1 GB")
	[ ${#parts[@]} != 0 ] || parts+=("nothing more for the cache")
	local IFS=,
	local joined="${parts[*]}"
	echo "${joined//,/, }"
}

# What the clone still needs, for nu_preflight's message: nu_clone_text CLONE_MB.
nu_clone_text() {
	if [ "$1" = 0 ]; then echo "the tools built already"; else echo "tools/target: 1 GB"; fi
}

# The DKMS source trees of the package (make dkms-src makes them, make dkms-uninstall removes
# them). Only a tree carrying the marker file NU_DKMS_MARKER, which make dkms-src writes into every
# tree it makes, is ever removed, and never one where a clone could be: not this clone, nor a
# directory holding it or inside it (but its build/: scripts/dkms-check's trees), nor one holding
# a .git at any depth (a clone or work tree).
NU_DKMS_MARKER=.neuron-udma-dkms-src

# nu_dkms_src_unsafe DIR: prints why DIR must not be made or removed as a DKMS source tree and
# succeeds; fails, printing nothing, when it may be.
nu_dkms_src_unsafe() {
	local d top git
	d=$(realpath -m -- "$1")
	top=$(realpath -- "$NU_TOP")
	if [ "$d" = "$top" ]; then
		echo "it is this clone"
	elif [ "$d" = / ] || [ "${top#"$d"/}" != "$top" ]; then
		echo "it holds this clone ($top)"
	elif [ "${d#"$top"/}" != "$d" ] && [ "${d#"$top"/build/}" = "$d" ]; then
		echo "it is inside this clone ($top), not in its build/"
	elif git=$(find "$d" -name .git -print -quit 2>/dev/null) && [ -n "$git" ]; then
		echo "it holds $git (a clone or work tree)"
	else
		return 1
	fi
}

# nu_dkms_src_ours DIR: whether DIR is a DKMS source tree make dkms-src made (its marker) and may
# be removed; prints why not when not.
nu_dkms_src_ours() {
	local why
	if why=$(nu_dkms_src_unsafe "$1"); then
		echo "$why"
		return 1
	fi
	if [ -L "$1" ]; then
		echo "it is a symbolic link"
		return 1
	fi
	if ! grep -qs '^neuron-udma .*DKMS source tree' "$1/$NU_DKMS_MARKER"; then
		echo "it has no $NU_DKMS_MARKER (make dkms-src writes it into every tree it makes)"
		return 1
	fi
}

# nu_dkms_src DIR VERSION FILE...: make dkms-src: copies FILE... (paths in the clone) to DIR with
# their paths, and the marker. DIR must be missing, empty or a tree make dkms-src made (which is
# replaced).
nu_dkms_src() {
	local dir=$1 ver=$2 why rev
	shift 2
	[ -n "$ver" ] || nu_die "dkms.conf has no PACKAGE_VERSION=\"...\" line"
	if why=$(nu_dkms_src_unsafe "$dir"); then
		nu_die "refusing to make the DKMS source tree $dir: $why"
	fi
	if [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
		why=$(nu_dkms_src_ours "$dir") ||
			nu_die "$dir is not empty and not a tree make dkms-src made ($why): not overwriting it (remove it yourself if it is an old tree of the package)"
		rm -rf "$dir"
	fi
	mkdir -p "$dir"
	(cd "$NU_TOP" && cp --parents "$@" "$dir/")
	rev=$(git -C "$NU_TOP" describe --always --dirty 2>/dev/null) || rev="no git revision"
	printf '%s\n' "neuron-udma $ver DKMS source tree, made by make dkms-src from $NU_TOP ($rev) on $(date -u +%FT%TZ)." \
		"make dkms-uninstall removes this directory; nothing removes a tree without this file." >"$dir/$NU_DKMS_MARKER"
	echo "neuron-udma $ver: DKMS source tree in $dir"
}
