// SPDX-License-Identifier: GPL-2.0
/*
 * PCI error recovery, function-level reset and shutdown of a bound device, and its NUMA node
 * (rust/kfac/pci.h):
 * Linux 7.3's Rust pci::Driver fills in probe and remove only, so probe adds the rest to the
 * struct pci_driver the Rust adapter registered. The callbacks stop the device's queues and
 * start them again through Rust (rust/device/reset.rs).
 */
#include <linux/device.h>
#include <linux/pci.h>

#include "pci.h"

/*
 * PCI error recovery (Documentation/PCI/pci-error-recovery.rst): the queues stop, their fences
 * in flight fail with EIO, new work gets EIO until resume. A frozen link asks for a reset; on
 * a working one (a non-fatal error, which the AER core recovers without a reset) the queues
 * are programmed again at resume; a permanent failure disconnects (remove follows).
 */
static pci_ers_result_t neuron_udma_error_detected(struct pci_dev *pdev,
						    pci_channel_state_t state)
{
	neuron_udma_pci_stop(&pdev->dev, NEURON_UDMA_PCI_STOP_ERROR);
	switch (state) {
	case pci_channel_io_normal:
		return PCI_ERS_RESULT_CAN_RECOVER;
	case pci_channel_io_perm_failure:
		return PCI_ERS_RESULT_DISCONNECT;
	default:
		return PCI_ERS_RESULT_NEED_RESET;
	}
}

static pci_ers_result_t neuron_udma_slot_reset(struct pci_dev *pdev)
{
	/* The reset cleared the config space: BARs, memory decoding, bus mastering. */
	pci_restore_state(pdev);
	pci_save_state(pdev);
	return PCI_ERS_RESULT_RECOVERED;
}

static void neuron_udma_resume(struct pci_dev *pdev)
{
	if (neuron_udma_pci_restart(&pdev->dev, NEURON_UDMA_PCI_STOP_ERROR))
		pci_err(pdev, "not restarted after error recovery; unbind and bind it again\n");
}

/*
 * A function-level reset (sysfs reset, VFIO, the reset of a bus): the PCI core saves the config
 * space after reset_prepare and restores it before reset_done.
 */
static void neuron_udma_reset_prepare(struct pci_dev *pdev)
{
	neuron_udma_pci_stop(&pdev->dev, NEURON_UDMA_PCI_STOP_RESET);
}

static void neuron_udma_reset_done(struct pci_dev *pdev)
{
	if (neuron_udma_pci_restart(&pdev->dev, NEURON_UDMA_PCI_STOP_RESET))
		pci_err(pdev, "not restarted after reset; unbind and bind it again\n");
}

static const struct pci_error_handlers neuron_udma_err_handler = {
	.error_detected = neuron_udma_error_detected,
	.slot_reset = neuron_udma_slot_reset,
	.resume = neuron_udma_resume,
	.reset_prepare = neuron_udma_reset_prepare,
	.reset_done = neuron_udma_reset_done,
};

/* Reboot, poweroff or kexec: no engine may DMA into memory the next kernel owns. */
static void neuron_udma_shutdown(struct pci_dev *pdev)
{
	neuron_udma_pci_stop(&pdev->dev, NEURON_UDMA_PCI_STOP_SHUTDOWN);
	pci_clear_master(pdev);
}

int neuron_udma_dev_node(struct device *dev)
{
	return dev_to_node(dev);
}

void neuron_udma_pci_hooks(struct device *dev)
{
	struct pci_dev *pdev = to_pci_dev(dev);
	struct pci_driver *drv = pdev->driver;

	/* What slot_reset restores. */
	pci_save_state(pdev);
	/*
	 * The PCI core reads these only for a device this driver has bound, so setting them in
	 * probe, before it returns, is in time for this device; later probes store the same
	 * values.
	 */
	WRITE_ONCE(drv->err_handler, &neuron_udma_err_handler);
	WRITE_ONCE(drv->shutdown, neuron_udma_shutdown);
}
