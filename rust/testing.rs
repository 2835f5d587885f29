// SPDX-License-Identifier: GPL-2.0

//! Test hooks, compiled only into KUnit builds: the device model's control window (BAR2 of
//! `tools/udma-sim`, absent on real devices) and the faults the suites inject through it
//! (`Documentation/udma-sim.rst`).

use crate::regs::{self, model::*};
use kernel::{device::Core, io::Io, pci, prelude::*};

/// The mapped control window of the device model.
pub(crate) struct ModelCtl(pci::DevresBar<{ regs::MODEL_CTL_SIZE }>);

impl ModelCtl {
    /// Maps BAR2 of `pdev` if the device is the model (checked by its magic value).
    pub(crate) fn map(pdev: &pci::Device<Core<'_>>) -> Option<Self> {
        let bar = pdev
            .iomap_region_sized::<{ regs::MODEL_CTL_SIZE }>(2, c"neuron_udma/model")
            .ok()?;
        if bar.read(MAGIC).into_raw() != MAGIC_UDMA {
            return None;
        }
        bar.into_devres().ok().map(Self)
    }

    /// Asks the model to fail the `n`-th next Tx descriptor of queue `qid` of engine `eng`
    /// with a bad address.
    ///
    /// # Errors
    ///
    /// `ENODEV` after unbind, `EIO` if the model rejects the fault.
    pub(crate) fn inject_fail_nth(&self, eng: u32, qid: u32, n: u32) -> Result {
        self.inject(FAULT_FAIL_NTH, eng, qid, n)
    }

    /// Asks the model not to process queue `qid` of engine `eng` for `ms` milliseconds (a
    /// device reset ends the stall).
    ///
    /// # Errors
    ///
    /// `ENODEV` after unbind, `EIO` if the model rejects the fault.
    pub(crate) fn inject_stall(&self, eng: u32, qid: u32, ms: u32) -> Result {
        self.inject(FAULT_STALL, eng, qid, ms)
    }

    /// Stages fault `kind` for queue `qid` of engine `eng` with argument `arg`, and applies it.
    fn inject(&self, kind: u32, eng: u32, qid: u32, arg: u32) -> Result {
        let bar = self.0.try_access().ok_or(ENODEV)?;
        let io = &*bar;
        io.write_reg(FAULT_KIND::from(kind));
        io.write_reg(FAULT_ENGINE::from(eng));
        io.write_reg(FAULT_QUEUE::from(qid));
        io.write_reg(FAULT_ARG::from(arg));
        io.write_reg(FAULT_COMMIT::from(1));
        if io.read(FAULT_COMMIT).into_raw() != 0 {
            return Err(EIO);
        }
        Ok(())
    }
}
