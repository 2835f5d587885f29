// SPDX-License-Identifier: GPL-2.0
//! Unbind and rebind mid-run (`--unbind`, as root): the device
//! behind the fuzzer's node is unbound through sysfs with whatever the sequence left in flight;
//! every later call on the old files must fail with `ENODEV` (`poll()`: `EPOLLERR | EPOLLHUP`),
//! and after the rebind the node belongs to the same device again and a new file works.

use crate::dev::{abi3, ioctl_ret, node_bdf, poll, sysfs_write, Dev, Mapping};
use crate::fuzz::{ctx, engines, expect, fact, fail, name, open_file, slot_queue, Sut};
use crate::model::*;
use libc::ENODEV;
use neuron_udma::sys;
use std::time::{Duration, Instant};

const DRIVER: &str = "/sys/bus/pci/drivers/neuron_udma";

impl Sut {
    /// Unbinds the device, checks the old files, rebinds it and opens new files. `how` 1 first
    /// starts a copy on every queue (work in flight at the unbind).
    pub(crate) fn unbind(&mut self, how: u8) {
        let Some(bdf) = ctx().bdf.clone() else { return };
        // The second process's file would see ENODEV too: it must be done first.
        self.second(true);
        for q in 0..QUEUE_SLOTS {
            self.ghost_room(q);
        }
        if how == 1 {
            for q in 0..QUEUE_SLOTS {
                if let Some(m) = self.queues[q].as_ref() {
                    let (engine, queue, _) = slot_queue(q);
                    let mut a = sys::neuron_udma_copy_submit { engine, queue, ..Default::default() };
                    let _ = ioctl_ret(self.devs[m.owner].raw(), abi3::COPY_SUBMIT, &mut a);
                }
            }
        }
        if let Some(w) = ctx().window.as_ref() {
            // Faults armed in the device model would outlive the driver's instance.
            w.clear();
            engines().iter_mut().for_each(|e| e.armed = false);
        }
        let t = Instant::now();
        if let Err(e) = sysfs_write(&format!("{DRIVER}/unbind"), &bdf) {
            fail!("unbind of {bdf}: {}", name(e));
        }
        fact("unbinds", 1);
        for f in 0..FILES {
            self.check_gone(f);
        }
        let mut i = sys::neuron_udma_info::default();
        expect(
            "INFO on the read-only file after unbind",
            self.ro.ioctl(sys::NEURON_UDMA_INFO, &mut i),
            false,
            &[ENODEV],
        )
        .ok();
        let mut s = sys::neuron_udma_queue_state::default();
        expect(
            "QUEUE_STATE on the read-only file after unbind",
            self.ro.ioctl(sys::NEURON_UDMA_QUEUE_STATE, &mut s),
            false,
            &[ENODEV],
        )
        .ok();
        let mut a = sys::neuron_udma_mem_alloc { size: 4096, ..Default::default() };
        expect(
            "MEM_ALLOC on the read-only file after unbind",
            self.ro.ioctl(sys::NEURON_UDMA_MEM_ALLOC, &mut a),
            false,
            &[ENODEV],
        )
        .ok();
        if let Err(e) = sysfs_write(&format!("{DRIVER}/bind"), &bdf) {
            fail!("bind of {bdf} after the unbind: {}", name(e));
        }
        let back = Instant::now();
        while node_bdf(&ctx().path).as_deref() != Some(bdf.as_str()) {
            if back.elapsed() > Duration::from_secs(20) {
                fail!("{} is not {bdf}'s node 20 s after the rebind", ctx().path.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Everything of the old files is gone with the device; the exports were revoked (they
        // attach nothing any more).
        self.exports.clear();
        // Every queue instance ended with the device (S4: its io_uring commands complete with
        // ECANCELED), the closed files' ones too: no queue id is held any more.
        for m in self.queues[QUEUE_SLOTS..].iter_mut().flatten() {
            if m.gone == Some(Gone::Closed) {
                m.gone = Some(Gone::Unbound);
            }
            m.former = usize::MAX;
        }
        for g in QUEUE_SLOTS..QUEUE_ENTRIES {
            if self.queues[g].is_some() && !self.cmds_on_entry(g) {
                self.forget_queue(g);
            }
        }
        for f in 0..FILES {
            self.forget_file(f, Gone::Unbound);
            let (dev, scratch) = open_file();
            self.devs[f] = dev;
            self.scratch[f] = scratch;
        }
        self.ro =
            Dev::open(&ctx().path, true).unwrap_or_else(|e| fail!("open read-only after the rebind: {}", name(e)));
        let mut i = sys::neuron_udma_info::default();
        expect("INFO on a file opened after the rebind", self.devs[0].ioctl(sys::NEURON_UDMA_INFO, &mut i), true, &[])
            .ok();
        fact("unbind and rebind cycles (ms)", t.elapsed().as_millis() as u64);
    }

    /// After the unbind, every call on file `f` fails with `ENODEV`.
    fn check_gone(&mut self, f: usize) {
        let d = &self.devs[f];
        let gone = |what: &str, r: Result<i32, i32>| {
            expect(&format!("{what} after unbind"), r, false, &[ENODEV]).ok();
        };
        let mut i = sys::neuron_udma_info::default();
        gone("INFO", ioctl_ret(d.raw(), sys::NEURON_UDMA_INFO, &mut i));
        let mut a = sys::neuron_udma_mem_alloc { size: 4096, type_: sys::NEURON_UDMA_MEM_HOST, ..Default::default() };
        gone("MEM_ALLOC", ioctl_ret(d.raw(), sys::NEURON_UDMA_MEM_ALLOC, &mut a));
        let mut im = sys::neuron_udma_mem_import { addr: self.regions[0].addr(0), size: 4096, ..Default::default() };
        gone("MEM_IMPORT", ioctl_ret(d.raw(), sys::NEURON_UDMA_MEM_IMPORT, &mut im));
        for b in self.files[f].all() {
            let mut fr = sys::neuron_udma_mem_free { handle: b.handle, reserved: 0 };
            gone("MEM_FREE", ioctl_ret(d.raw(), sys::NEURON_UDMA_MEM_FREE, &mut fr));
            let mut m =
                sys::neuron_udma_memcpy { src_handle: b.handle, dst_handle: b.handle, size: 1, ..Default::default() };
            gone("MEMCPY", ioctl_ret(d.raw(), sys::NEURON_UDMA_MEMCPY, &mut m));
            let mut ms = sys::neuron_udma_memset { handle: b.handle, size: 1, ..Default::default() };
            gone("MEMSET", ioctl_ret(d.raw(), sys::NEURON_UDMA_MEMSET, &mut ms));
            if b.host() {
                let r =
                    Mapping::new(d.raw(), b.size, b.mmap_offset, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED);
                gone("mmap", r.map(|_| 0));
            }
        }
        for q in 0..QUEUE_SLOTS {
            let (engine, queue, _) = slot_queue(q);
            let mut s = sys::neuron_udma_queue_state { engine, queue, ..Default::default() };
            gone("QUEUE_STATE", ioctl_ret(d.raw(), sys::NEURON_UDMA_QUEUE_STATE, &mut s));
            let mut w = sys::neuron_udma_copy_wait { engine, queue, ..Default::default() };
            gone("COPY_WAIT", ioctl_ret(d.raw(), sys::NEURON_UDMA_COPY_WAIT, &mut w));
            let mut c = sys::neuron_udma_copy_submit { engine, queue, ..Default::default() };
            gone("COPY_SUBMIT", ioctl_ret(d.raw(), abi3::COPY_SUBMIT, &mut c));
            let mut st = sys::neuron_udma_fence_status { engine, queue, fence: 1, ..Default::default() };
            gone("FENCE_STATUS", ioctl_ret(d.raw(), abi3::FENCE_STATUS, &mut st));
            let mut qi =
                sys::neuron_udma_queue_init { engine, queue, tx_descs: 32, rx_descs: 32, ..Default::default() };
            gone("QUEUE_INIT", ioctl_ret(d.raw(), sys::NEURON_UDMA_QUEUE_INIT, &mut qi));
        }
        let mut ev = sys::neuron_udma_events::default();
        gone("QUEUE_EVENTS", ioctl_ret(d.raw(), abi3::QUEUE_EVENTS, &mut ev));
        let revents = poll(d.raw(), 0).unwrap_or_else(|e| fail!("poll after unbind: {}", name(e)));
        crate::fuzz::count(Ok(()));
        if revents & (libc::POLLERR | libc::POLLHUP) != libc::POLLERR | libc::POLLHUP {
            fail!("poll after unbind: revents {revents:#x}, expected EPOLLERR | EPOLLHUP");
        }
    }
}
