// SPDX-License-Identifier: GPL-2.0

//! neuron_udma: driver for the memory-to-memory DMA engines (UDMA) of AWS Neuron devices
//! (Trainium1 / Inferentia2: arch v2; Trainium2: arch v3).
//!
//! The crate root only wires the parts together; see `Documentation/neuron-udma.rst`.

mod arch;
mod desc;
mod driver;
mod engine;
mod queue;
mod regs;
mod ring;

kernel::module_pci_driver! {
    type: driver::NeuronUdmaDriver,
    name: "neuron_udma",
    authors: ["The neuron-udma developers"],
    description: "AWS Neuron UDMA memory-to-memory DMA driver",
    license: "GPL v2",
}
