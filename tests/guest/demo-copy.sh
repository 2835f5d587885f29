#!/bin/sh
# shellcheck shell=busybox
# SPDX-License-Identifier: GPL-2.0
#
# The demo copy, in the guest (make demo, make dkms-check): the production module is loaded and
# bound; udmactl copies a generated 64 MiB file host -> HBM -> host through a user queue and
# through the driver's MEMCPY, verifying every byte and a checksum. Exits non-zero on any failure,
# or when the loaded module carries KUnit suites (it is then not the production build).
set -e
# The guest's output is a serial log, not a screen: no progress bar, one line per copy and
# udmactl's verdict line (scripts/demo reads the verdicts).
export TERM=dumb
dev=
for d in /sys/bus/pci/drivers/neuron_udma/0000:*; do
	[ -e "$d" ] && dev=$d && break
done
if [ -z "$dev" ]; then
	echo "demo-copy: no device bound to neuron_udma" >&2
	exit 1
fi
echo "== $(basename "$dev"): vendor $(cat "$dev/vendor") device $(cat "$dev/device"), bound to neuron_udma"
for s in /sys/kernel/debug/kunit/neuron_udma*; do
	[ -e "$s" ] || continue
	echo "demo-copy: the loaded module carries KUnit suites ($s): not the production build" >&2
	exit 1
done
echo "== kernel log of the driver (production module, no test suites)"
dmesg | grep neuron_udma
echo "== udmactl info"
udmactl info
echo "== generating a 64 MiB file"
dd if=/dev/urandom of=/tmp/data.bin bs=1M count=64 2>/dev/null
echo "== udmactl copy (user queue: the first host-connected engine from INFO, queue 1, batched COPY_PREPARE; every byte verified)"
udmactl copy /tmp/data.bin
echo "== udmactl copy --memcpy (the driver's H2T queue, NEURON_UDMA_MEMCPY)"
udmactl copy --memcpy /tmp/data.bin
