// SPDX-License-Identifier: GPL-2.0

//! The device-memory (HBM) allocator: ranges of the device's memory handed out to device
//! buffers, in units of [`BUF_ALIGN`](crate::buffer::BUF_ALIGN) bytes.

use kernel::{
    prelude::*,
    rbtree::{RBTree, RBTreeNode},
};

/// Device memory kept by the driver at the start of HBM (as the reference keeps 16 MiB per HBM
/// for firmware, hardware.rst §1.3); the driver's own tests use it.
pub(crate) const DRAM_RESERVED: u64 = 16 << 20;

/// First-fit allocator of device-memory ranges: the free ranges (coalesced) and the
/// allocated ones in two red-black trees keyed by start address, so that freeing is
/// O(log n) and allocating walks only the free ranges (few, while allocations are not
/// fragmented): a file with tens of thousands of buffers allocates and closes in linear time.
pub(crate) struct DramAllocator {
    /// Free `start -> len` ranges, never adjacent (coalesced).
    free: RBTree<u64, u64>,
    /// Allocated `start -> len` ranges.
    used: RBTree<u64, u64>,
    start: u64,
    end: u64,
}

impl DramAllocator {
    /// Manages device addresses `start..end` (bytes).
    ///
    /// # Errors
    ///
    /// `ENOMEM` if the first free-range record cannot be allocated.
    pub(crate) fn new(start: u64, end: u64) -> Result<Self> {
        let mut free = RBTree::new();
        if end > start {
            free.try_create_and_insert(start, end - start, GFP_KERNEL)?;
        }
        Ok(Self {
            free,
            used: RBTree::new(),
            start,
            end,
        })
    }

    /// Bytes available to users.
    pub(crate) fn capacity(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// Allocates `len` bytes ([`BUF_ALIGN`](crate::buffer::BUF_ALIGN)-aligned) at the lowest address where they fit.
    ///
    /// # Errors
    ///
    /// `ENOMEM` if no free range is large enough (or a record cannot be allocated); nothing
    /// changes then.
    pub(crate) fn alloc(&mut self, len: u64) -> Result<u64> {
        let (at, have) = self
            .free
            .iter()
            .find(|(_, &l)| l >= len)
            .map(|(&s, &l)| (s, l))
            .ok_or(ENOMEM)?;
        let used = RBTreeNode::new(at, len, GFP_KERNEL)?;
        let node = self.free.remove_node(&at).ok_or(ENOMEM)?;
        if have > len {
            // The rest of the range stays free (the record is reused).
            self.free
                .insert(node.into_reservation().into_node(at + len, have - len));
        }
        self.used.insert(used);
        Ok(at)
    }

    /// Frees the range starting at `start` (a no-op for an unknown start), merging it with
    /// free neighbours.
    pub(crate) fn free(&mut self, start: u64) {
        let Some(&len) = self.used.get(&start) else {
            return;
        };
        let Some(node) = self.used.remove_node(&start) else {
            return;
        };
        let mut s = start;
        let mut e = s + len;
        // The free neighbour before this range (the last one starting below it) and the one
        // that starts where it ends.
        let prev = match self.free.cursor_lower_bound(&s) {
            Some(c) => c.peek_prev().map(|(&fs, &fl)| (fs, fl)),
            None => self.free.cursor_back().map(|c| {
                let (&fs, &fl) = c.current();
                (fs, fl)
            }),
        };
        if let Some((ps, pl)) = prev {
            if ps + pl == s {
                self.free.remove(&ps);
                s = ps;
            }
        }
        if let Some(nl) = self.free.remove(&e) {
            e += nl;
        }
        // The removed `used` record becomes the free record: nothing to allocate.
        self.free
            .insert(node.into_reservation().into_node(s, e - s));
    }
}

#[cfg(neuron_udma_kunit)]
#[kunit_tests(neuron_udma_mem)]
mod tests {
    use super::*;

    #[test]
    fn dram_first_fit_and_coalescing() -> Result {
        let mut d = DramAllocator::new(0x1000, 0x11000)?;
        assert_eq!(d.capacity(), 0x10000);
        let a = d.alloc(0x4000)?;
        let b = d.alloc(0x4000)?;
        let c = d.alloc(0x4000)?;
        assert_eq!((a, b, c), (0x1000, 0x5000, 0x9000));
        assert_eq!(d.alloc(0x8000), Err(ENOMEM));
        // A hole in the middle is reused first-fit; freeing both neighbours merges everything.
        d.free(b);
        assert_eq!(d.alloc(0x2000)?, 0x5000);
        d.free(0x5000);
        d.free(a);
        d.free(c);
        assert_eq!(d.alloc(0x10000)?, 0x1000);
        assert_eq!(d.alloc(0x1000), Err(ENOMEM));
        d.free(0x1000);
        // Unknown starts are ignored.
        d.free(0x2000);
        // Many small ranges freed in any order come back as one.
        let mut v = KVec::new();
        for _ in 0..16 {
            v.push(d.alloc(0x1000)?, GFP_KERNEL)?;
        }
        for i in Iterator::chain((0..16).step_by(2), (1..16).step_by(2)) {
            d.free(v[i]);
        }
        assert_eq!(d.alloc(0x10000)?, 0x1000);
        Ok(())
    }
}
