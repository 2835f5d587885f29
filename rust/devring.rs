// SPDX-License-Identifier: GPL-2.0

//! A queue whose rings are in device memory (`NEURON_UDMA_QUEUE_DEVICE_RINGS`): the engine
//! fetches its descriptors from HBM and writes its completion markers to HBM, so an engine
//! without host connectivity (hardware.rst §2.5) can serve it.
//!
//! Layout of the queue's device memory (one allocation, 4 KiB aligned): the Tx ring, the Rx ring
//! (each 256-byte aligned, hardware.rst §4.8), then the completion slots.
//!
//! Descriptors are built as for every queue (`desc.rs`), into the queue's rings in host memory,
//! which here are *staging* rings: nothing fetches them. Before each doorbell, the slots written
//! since the last one are *published* into the device rings, either
//!
//! * by the CPU through BAR4 ([`Fill::Bar4`]: one `memcpy_toio()` per contiguous range), or
//! * by the engine ([`Fill::Engine`]: [`Staged::moves`] hands the ranges to the caller, which has
//!   the driver's shared H2T queue copy them from the staging ring and waits for that copy).
//!
//! So the descriptor writes stay the same for both placements (no branch per descriptor), and
//! only a doorbell asks where the rings are. Completion slots are written (armed, cleared) and
//! polled through BAR4.

use crate::{
    desc::DESC_SIZE,
    devmem::DevMem,
    ring::{Ring, RingSize},
    span::Move,
};
use kernel::{
    io::{io_read, io_write},
    prelude::*,
    sync::Arc,
};

/// How descriptors reach a ring in device memory (the `device_ring_fill` module parameter, read
/// when a queue is created).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fill {
    /// The CPU writes them through BAR4 before the doorbell.
    Bar4,
    /// The driver's H2T queue copies them from the host staging ring before the doorbell.
    Engine,
}

/// One completion slot in device memory: word 0 holds the marker (the marker pair's source),
/// word 1 receives it (hardware.rst §5.1).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct DevSlot {
    src: u32,
    dst: u32,
}

// SAFETY: `repr(C)`, two `u32`, no padding; every bit pattern is valid.
unsafe impl kernel::transmute::AsBytes for DevSlot {}
// SAFETY: As above.
unsafe impl kernel::transmute::FromBytes for DevSlot {}

/// Descriptor bytes to move from a staging ring into a device ring: at most two contiguous
/// ranges per ring (the written slots may wrap), in device-fabric addresses.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Moves {
    ranges: [Move; 4],
    len: usize,
}

impl Moves {
    /// The ranges, in order.
    pub(crate) fn ranges(&self) -> &[Move] {
        // PANIC: `len` is at most 4 (`push`).
        &self.ranges[..self.len]
    }

    fn push(&mut self, r: Move) {
        if let Some(slot) = self.ranges.get_mut(self.len) {
            *slot = r;
            self.len += 1;
        }
    }
}

/// What a doorbell must publish first, from [`DeviceRings::stage`]: descriptors the engine is to
/// move (for [`Fill::Engine`]), and the ring indices that count as published once the doorbell
/// rang ([`DeviceRings::published`]).
pub(crate) struct Staged {
    /// Moves the caller has the engine make before the doorbell (`None`: nothing to move).
    pub(crate) moves: Option<Moves>,
    upto: (u32, u32),
}

/// Device memory taken for a queue's rings: where, and how the rings are filled.
pub(crate) struct DeviceMemory {
    /// The device's BAR4.
    pub(crate) mem: Arc<DevMem>,
    /// Device address (4 KiB aligned, from the device-memory allocator).
    pub(crate) base: u64,
    /// Bytes.
    pub(crate) len: u64,
    /// How descriptors reach the rings.
    pub(crate) fill: Fill,
}

/// The device memory of a queue whose rings are in device memory, and what of its staging
/// rings was published.
pub(crate) struct DeviceRings {
    mem: Arc<DevMem>,
    /// Device address and bytes of the whole allocation.
    base: u64,
    len: u64,
    /// Device addresses of the Tx ring, the Rx ring and the completion slots.
    tx: u64,
    rx: u64,
    slots: u64,
    nslots: usize,
    fill: Fill,
    /// Staging-ring indices up to which the Tx and Rx slots were published.
    published: (u32, u32),
}

impl DeviceRings {
    /// Bytes of device memory a queue with rings of `tx` / `rx` descriptors and `slots`
    /// completion slots takes, in whole 4 KiB units.
    pub(crate) fn bytes(tx: RingSize, rx: RingSize, slots: usize) -> u64 {
        let b = |n: usize| n as u64;
        (b(tx.bytes()) + b(rx.bytes()) + b(slots * core::mem::size_of::<DevSlot>()))
            .next_multiple_of(4096)
    }

    /// Takes the device memory `m` (of at least [`Self::bytes`] of the same sizes) for rings of
    /// `tx` / `rx` descriptors and `slots` completion slots, and arms every slot's source word
    /// with `marker`.
    ///
    /// # Errors
    ///
    /// `EINVAL` if `m` is too small, `ERANGE` if it is not in BAR4, `ENODEV` after unbind.
    pub(crate) fn new(
        m: DeviceMemory,
        (tx, rx, slots): (RingSize, RingSize, usize),
        marker: u32,
    ) -> Result<Self> {
        if m.len < Self::bytes(tx, rx, slots) {
            return Err(EINVAL);
        }
        let d = Self {
            tx: m.base,
            rx: m.base + tx.bytes() as u64,
            slots: m.base + tx.bytes() as u64 + rx.bytes() as u64,
            nslots: slots,
            mem: m.mem,
            base: m.base,
            len: m.len,
            fill: m.fill,
            published: (0, 0),
        };
        {
            let io = d.mem.access()?;
            let view = io.slice::<DevSlot>(d.slots, slots)?;
            for i in 0..slots {
                io_write!(view, [panic: i].src, marker);
                io_write!(view, [panic: i].dst, 0);
            }
        }
        Ok(d)
    }

    /// Device address of the Tx ring.
    pub(crate) fn tx_base(&self) -> u64 {
        self.tx
    }

    /// Device address of the Rx ring.
    pub(crate) fn rx_base(&self) -> u64 {
        self.rx
    }

    /// The device memory of the queue: `(device address, bytes)`.
    pub(crate) fn range(&self) -> (u64, u64) {
        (self.base, self.len)
    }

    /// How descriptors reach the rings.
    pub(crate) fn fill(&self) -> Fill {
        self.fill
    }

    /// The staging rings were emptied (queue init, reset or pause): nothing is published.
    pub(crate) fn reset(&mut self) {
        self.published = (0, 0);
    }

    /// Gets the slots written to the staging rings `tx` / `rx` since the last doorbell to the
    /// device rings: writes them through BAR4 ([`Fill::Bar4`]), or returns the ranges the engine
    /// must move ([`Fill::Engine`]; `host_route` makes the staging rings' DMA addresses
    /// device-fabric addresses). Call [`Self::published`] once the doorbell rang.
    ///
    /// # Errors
    ///
    /// `ENODEV` after unbind (BAR4 revoked), `ERANGE`/`EINVAL` if the rings do not match the
    /// device memory (not reached).
    pub(crate) fn stage(&self, tx: &Ring, rx: &Ring, host_route: u64) -> Result<Staged> {
        let upto = (tx.state().next_index(), rx.state().next_index());
        let chunks = |r: &Ring, from: u32| -> [(u32, u32); 2] {
            let (size, to) = (r.state().size().descs(), r.state().next_index());
            if from <= to {
                [(from, to - from), (0, 0)]
            } else {
                [(from, size - from), (0, to)]
            }
        };
        let parts = [
            (tx, self.tx, chunks(tx, self.published.0)),
            (rx, self.rx, chunks(rx, self.published.1)),
        ];
        let slot = |i: u32| u64::from(i) * DESC_SIZE as u64;
        match self.fill {
            Fill::Bar4 => {
                let io = self.mem.access()?;
                for (ring, dst, ch) in parts {
                    for (from, n) in ch.into_iter().filter(|c| c.1 != 0) {
                        io.write(dst + slot(from), ring.slot_bytes(from, n)?)?;
                    }
                }
                Ok(Staged { moves: None, upto })
            }
            Fill::Engine => {
                let mut m = Moves::default();
                for (ring, dst, ch) in parts {
                    let src = ring.dma_address() | host_route;
                    for (from, n) in ch.into_iter().filter(|c| c.1 != 0) {
                        m.push(Move {
                            src: src + slot(from),
                            dst: dst + slot(from),
                            bytes: slot(n),
                            repeat: false,
                        });
                    }
                }
                Ok(Staged {
                    moves: (m.len != 0).then_some(m),
                    upto,
                })
            }
        }
    }

    /// The doorbell for `s` rang: its slots are published.
    pub(crate) fn published(&mut self, s: &Staged) {
        self.published = s.upto;
    }

    /// Device-fabric address of completion slot `slot`'s source word (the destination word is
    /// 4 bytes on).
    pub(crate) fn slot_addr(&self, slot: usize) -> u64 {
        self.slots + (slot * core::mem::size_of::<DevSlot>()) as u64
    }

    /// Arms slot `slot` for a fence: word 1 cleared, word 0 the marker.
    ///
    /// # Errors
    ///
    /// `ENODEV` after unbind, `ERANGE` for a slot out of range.
    pub(crate) fn arm(&self, slot: usize, marker: u32) -> Result {
        let io = self.mem.access()?;
        let view = io.slice::<DevSlot>(self.slots, self.nslots)?;
        io_write!(view, [try: slot].dst, 0);
        io_write!(view, [try: slot].src, marker);
        Ok(())
    }

    /// The first of the `(index, slot)` pairs `slots`, read from the last back, whose slot's word 1
    /// holds `marker`: the newest arrived fence when `slots` are the fences in flight, oldest
    /// first. `None` when no marker arrived (or after unbind).
    pub(crate) fn newest_arrived(
        &self,
        slots: impl DoubleEndedIterator<Item = (usize, usize)>,
        marker: u32,
    ) -> Option<usize> {
        let io = self.mem.access().ok()?;
        let view = io.slice::<DevSlot>(self.slots, self.nslots).ok()?;
        slots
            .rev()
            .find(|&(_, s)| s < self.nslots && io_read!(view, [panic: s].dst) == marker)
            .map(|(i, _)| i)
    }

    /// Clears word 1 of `slots` (retired fences).
    pub(crate) fn clear(&self, slots: impl Iterator<Item = usize>) {
        let Ok(io) = self.mem.access() else {
            return;
        };
        let Ok(view) = io.slice::<DevSlot>(self.slots, self.nslots) else {
            return;
        };
        for s in slots.filter(|&s| s < self.nslots) {
            io_write!(view, [panic: s].dst, 0);
        }
    }
}
