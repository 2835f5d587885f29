# SPDX-License-Identifier: GPL-2.0
# Shared settings for the neuron-udma scripts. Source it; do not run it.

# Repository root (absolute).
NU_TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# Heavy artefacts live outside the repository, keyed by their inputs.
NU_CACHE=${NEURON_UDMA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/neuron-udma}

nu_log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
nu_die() { nu_log "error: $*"; exit 1; }

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

# Path of the toolchain root for the current package list.
nu_root_dir() {
	echo "$NU_CACHE/root-$(nu_hash "$NU_TOP/scripts/root-packages")"
}
