// SPDX-License-Identifier: GPL-2.0
/*
 * KUnit builds only: the PCI error recovery of a frozen link as the AER core drives it, for
 * rust/live_tests.rs (the test kernel's QEMU device sits on the root complex, where no AER error
 * can be injected). Declared in pci.h.
 */
#include <linux/pci.h>

#include "pci.h"

int neuron_udma_pci_recover_frozen(struct device *dev)
{
	struct pci_dev *pdev = to_pci_dev(dev);
	const struct pci_error_handlers *eh;
	int ret = 0;

	/* The AER core holds the device lock across each callback; the reset needs it too. */
	pci_dev_lock(pdev);
	eh = pdev->driver ? pdev->driver->err_handler : NULL;
	if (!eh) {
		ret = -EIO;
		goto out;
	}
	if (eh->error_detected(pdev, pci_channel_io_frozen) != PCI_ERS_RESULT_NEED_RESET)
		ret = -EIO;
	/*
	 * Reset as a slot reset does, without the PCI core's save and restore: slot_reset
	 * restores the config space itself. The device is brought back whatever failed before.
	 */
	if (__pci_reset_function_locked(pdev))
		ret = -EIO;
	if (eh->slot_reset(pdev) != PCI_ERS_RESULT_RECOVERED)
		ret = -EIO;
	eh->resume(pdev);
out:
	pci_dev_unlock(pdev);
	return ret;
}
