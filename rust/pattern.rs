// SPDX-License-Identifier: GPL-2.0

//! Fill patterns: blocks of coherent host memory holding one byte value, the sources of the
//! engine's fills (the `MEMSET` ioctl and the dmaengine provider's `DMA_MEMSET`). A fill is a
//! copy whose every descriptor reads the same block ([`Span::Repeat`](crate::span::Span)), as
//! the scrub reads its zeroed block; the engine has no fill of its own (the reference driver
//! fills a host buffer and copies it too: hardware.rst §4).
//!
//! A block is made on first use of its value and shared by every fill of that value on the
//! device; [`PatternRef`] counts its users. Blocks nobody uses are kept up to [`IDLE_KEPT`]
//! and freed by a later [`Patterns::get`], so a user cycling through values costs at most that
//! many blocks beyond the ones in flight. Giving a reference back never takes a lock or frees
//! memory, so a reference may be dropped anywhere (under the dmaengine channel's spinlock too);
//! every block is freed at unbind, after the queues stopped, while the device is bound.

use crate::arch::Arch;
use kernel::{
    dma::{Coherent, CoherentBox},
    new_mutex, pci,
    prelude::*,
    sync::{
        aref::ARef,
        atomic::{Atomic, Relaxed},
        Arc, Mutex,
    },
};

/// Bytes of a fill block: one descriptor of the largest size reads it whole
/// ([`REPEAT_BYTES`](crate::split::REPEAT_BYTES)).
pub(crate) const PATTERN_BYTES: usize = crate::split::REPEAT_BYTES;
/// Unused blocks kept for the next fill of their value.
const IDLE_KEPT: usize = 4;

struct Block {
    value: u8,
    mem: Coherent<[u8]>,
}

struct Table {
    /// False from unbind on: no block is made, the blocks are gone.
    alive: bool,
    blocks: KVec<Block>,
}

/// The fill blocks of one device.
#[pin_data]
pub(crate) struct Patterns {
    pdev: ARef<pci::Device>,
    arch: &'static Arch,
    /// Users of each value's block: references handed out and not dropped.
    users: [Atomic<u32>; 256],
    #[pin]
    table: Mutex<Table>,
}

/// A user of the block of one value: the block stays while this lives (or until unbind, after
/// which no engine reads it).
pub(crate) struct PatternRef {
    patterns: Arc<Patterns>,
    value: u8,
    addr: u64,
}

impl PatternRef {
    /// Device-fabric address of the block ([`PATTERN_BYTES`] bytes of the value).
    pub(crate) fn addr(&self) -> u64 {
        self.addr
    }
}

impl Drop for PatternRef {
    fn drop(&mut self) {
        // No lock: the count only lets a later `get` free the block.
        self.patterns.users[usize::from(self.value)].fetch_sub(1, Relaxed);
    }
}

impl Patterns {
    /// The fill blocks of the device `pdev` of generation `arch` (none made yet).
    ///
    /// # Errors
    ///
    /// `ENOMEM`.
    pub(crate) fn new(pdev: ARef<pci::Device>, arch: &'static Arch) -> Result<Arc<Self>> {
        Arc::pin_init(
            pin_init!(Self {
                pdev,
                arch,
                users: [const { Atomic::new(0) }; 256],
                table <- new_mutex!(Table {
                    alive: true,
                    blocks: KVec::new(),
                }),
            }),
            GFP_KERNEL,
        )
    }

    /// The block of `value`, made if needed ([`PATTERN_BYTES`] of coherent memory).
    ///
    /// # Errors
    ///
    /// `ENOMEM`, `ENODEV` once the device is unbound.
    pub(crate) fn get(self: &Arc<Self>, value: u8) -> Result<PatternRef> {
        let users = &self.users[usize::from(value)];
        let mut t = self.table.lock();
        if !t.alive {
            return Err(ENODEV);
        }
        // Counted under the lock: a block with users is never freed below.
        users.fetch_add(1, Relaxed);
        let r = Self::find_or_make(self, &mut t, value);
        if r.is_err() {
            users.fetch_sub(1, Relaxed);
        }
        r
    }

    fn find_or_make(this: &Arc<Self>, t: &mut Table, value: u8) -> Result<PatternRef> {
        let addr = match t.blocks.iter().find(|b| b.value == value) {
            Some(b) => this.arch.host_addr(b.mem.dma_address()),
            None => {
                this.trim(t);
                t.blocks.reserve(1, GFP_KERNEL)?;
                // SAFETY: `alive` is true under the table lock, and `shutdown`, which the unbind
                // callback calls before the device is unbound, takes this lock to clear it: the
                // device is bound while `dev` is used, and `dev` does not leave this scope.
                let dev = unsafe { this.pdev.as_ref().as_bound() };
                let mut mem = CoherentBox::<[u8]>::zeroed_slice(
                    dev,
                    PATTERN_BYTES,
                    GFP_KERNEL | __GFP_NOWARN,
                )?;
                mem.fill(value);
                let mem: Coherent<[u8]> = mem.into();
                let addr = this.arch.host_addr(mem.dma_address());
                // Cannot fail: capacity was reserved.
                let _ = t.blocks.push_within_capacity(Block { value, mem });
                addr
            }
        };
        Ok(PatternRef {
            patterns: this.clone(),
            value,
            addr,
        })
    }

    /// Frees unused blocks beyond [`IDLE_KEPT`], oldest first.
    fn trim(&self, t: &mut Table) {
        let mut idle = t
            .blocks
            .iter()
            .filter(|b| self.users[usize::from(b.value)].load(Relaxed) == 0)
            .count();
        let mut i = 0;
        while idle > IDLE_KEPT && i < t.blocks.len() {
            if self.users[usize::from(t.blocks[i].value)].load(Relaxed) == 0 {
                drop(t.blocks.remove(i));
                idle -= 1;
            } else {
                i += 1;
            }
        }
    }

    /// Frees every block (unbind, after every queue stopped: no engine reads them).
    pub(crate) fn shutdown(&self) {
        let blocks = {
            let mut t = self.table.lock();
            t.alive = false;
            core::mem::replace(&mut t.blocks, KVec::new())
        };
        drop(blocks);
    }

    /// Blocks made and not freed.
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn blocks(&self) -> usize {
        self.table.lock().blocks.len()
    }
}
