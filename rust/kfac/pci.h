/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The PCI callbacks that Linux 7.3's Rust pci::Driver does not offer (it has probe and remove
 * only): the error handlers (PCI error recovery, function-level reset) and shutdown, and the
 * saved config space they restore. Implemented in rust/kfac/pci.c; bindgen generates the Rust
 * declarations (Kbuild), wrapped by rust/kfac/pci.rs.
 */
#ifndef NEURON_UDMA_KFAC_PCI_H
#define NEURON_UDMA_KFAC_PCI_H

#include <linux/types.h>

struct device;

/* Why the device stops (neuron_udma_pci_stop()). */
enum neuron_udma_pci_stop {
	/* A function-level reset begins (reset_prepare). */
	NEURON_UDMA_PCI_STOP_RESET = 0,
	/* PCI error recovery begins (error_detected). */
	NEURON_UDMA_PCI_STOP_ERROR = 1,
	/* The system shuts down or kexecs (shutdown): the device stays stopped. */
	NEURON_UDMA_PCI_STOP_SHUTDOWN = 2,
};

/* The NUMA node of @dev, NUMA_NO_NODE (-1) if none (dev_to_node() is a static inline). */
int neuron_udma_dev_node(struct device *dev);
/* Saves the config space and sets the driver's error handlers and shutdown; from probe. */
void neuron_udma_pci_hooks(struct device *dev);
/*
 * KUnit builds only (rust/kfac/pci_kunit.c): the PCI error recovery of a frozen link as the
 * AER core drives it, on a bound device: error_detected, a reset of the function, slot_reset,
 * resume. Returns 0, or -EIO if a step failed or a callback did not answer as the recovery
 * needs.
 */
int neuron_udma_pci_recover_frozen(struct device *dev);

#ifndef __BINDGEN__
/*
 * Defined in Rust (rust/device/reset.rs): the PCI device @dev stops, or the stop of kind @why
 * (RESET: reset_done, ERROR: resume) ends and the device starts again if no other is left.
 */
void neuron_udma_pci_stop(struct device *dev, enum neuron_udma_pci_stop why);
int neuron_udma_pci_restart(struct device *dev, enum neuron_udma_pci_stop why);
#endif

#endif /* NEURON_UDMA_KFAC_PCI_H */
