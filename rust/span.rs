// SPDX-License-Identifier: GPL-2.0

//! Where the bytes of one side of a copy are ([`Span`]), and the pieces of a copy ([`Pieces`]):
//! ranges that are each contiguous in the device-fabric address space on both sides, no longer
//! than the bound the caller gives (the splitter, `split.rs`, gives the pair limit and is the only
//! caller). Driver-allocated buffers are contiguous; an imported buffer (`MEM_IMPORT`, pinned
//! user pages) is a list of runs ([`Segment`]), and a copy that crosses from one run to the next
//! takes one pair per piece.

use kernel::prelude::*;

/// One part of a driver copy made of several (`split::Cut::moves`): `bytes` bytes to the
/// device-fabric address `dst` from `src`, where every pair reads from `src` itself when
/// `repeat` (a fill block, `split::REPEAT_BYTES`) and from the same offset as it writes otherwise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Move {
    /// Source address.
    pub(crate) src: u64,
    /// Destination address.
    pub(crate) dst: u64,
    /// Bytes (0: skipped).
    pub(crate) bytes: u64,
    /// The source is a block every pair reads from its start.
    pub(crate) repeat: bool,
}

/// One physically contiguous run of an imported buffer: its bytes `[offset, offset + len)` are
/// at DMA address `addr` (the host route not included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    /// Offset of the run's first byte in the buffer, in bytes.
    pub(crate) offset: u64,
    /// DMA address of that byte.
    pub(crate) addr: u64,
    /// Length of the run in bytes (never 0).
    pub(crate) len: u64,
}

/// Builds the runs of a buffer from its DMA segments `(address, length)` in buffer order:
/// segments that continue each other are merged, empty ones skipped.
///
/// # Errors
///
/// `ENOMEM`.
pub(crate) fn runs(dma: impl Iterator<Item = (u64, u64)>) -> Result<KVVec<Segment>> {
    let mut v: KVVec<Segment> = KVVec::new();
    let mut offset = 0u64;
    for (addr, len) in dma.filter(|&(_, l)| l != 0) {
        match v.last_mut() {
            Some(last) if last.addr.checked_add(last.len) == Some(addr) => last.len += len,
            _ => v.push(Segment { offset, addr, len }, GFP_KERNEL_ACCOUNT)?,
        }
        offset += len;
    }
    Ok(v)
}

/// One side of a copy: where its byte `i` is in the device-fabric address space.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Span<'a> {
    /// Consecutive bytes from this device-fabric address.
    Linear(u64),
    /// The same block at this address for every piece, holding at least one pair's worth
    /// (`split::REPEAT_BYTES`): the zeroed source of a device-memory scrub, a fill block.
    Repeat(u64),
    /// Bytes from offset `start` of a buffer made of the runs `segs`; `route` is OR-ed onto
    /// every run address (the generation's host route, hardware.rst §1.3: run addresses lie
    /// below it, as the DMA mask guarantees).
    Runs {
        /// The buffer's runs, in offset order, covering it without gaps.
        segs: &'a [Segment],
        /// Offset of byte 0 of the span in the buffer, in bytes.
        start: u64,
        /// Host route bits.
        route: u64,
    },
}

impl Span<'_> {
    /// The span from its byte `off` on: for a [`Span::Repeat`] block the same block (`off` a
    /// whole number of pairs, as [`split::share`](crate::split::share) cuts).
    pub(crate) fn skip(self, off: u64) -> Self {
        match self {
            Span::Linear(a) => Span::Linear(a + off),
            Span::Repeat(a) => Span::Repeat(a),
            Span::Runs { segs, start, route } => Span::Runs {
                segs,
                start: start + off,
                route,
            },
        }
    }

    /// Device-fabric address of byte `off` of the span, and how many bytes from there are
    /// contiguous (`u64::MAX`: no limit). `None` past the end of a [`Span::Runs`] buffer (the
    /// callers checked the range before).
    pub(crate) fn at(&self, off: u64) -> Option<(u64, u64)> {
        match *self {
            Span::Linear(a) => Some((a.checked_add(off)?, u64::MAX)),
            Span::Repeat(a) => Some((a, u64::MAX)),
            Span::Runs { segs, start, route } => {
                let pos = start.checked_add(off)?;
                let i = segs.partition_point(|s| s.offset + s.len <= pos);
                let s = segs.get(i)?;
                let into = pos.checked_sub(s.offset)?;
                Some((route | (s.addr + into), s.len - into))
            }
        }
    }
}

/// The pieces of a copy of `len` bytes from `src` to `dst`, in order: each at most `max`
/// bytes and within one run of each side. Items are `(source address, destination address,
/// bytes)`.
#[derive(Clone, Debug)]
pub(crate) struct Pieces<'a> {
    src: Span<'a>,
    dst: Span<'a>,
    len: u64,
    max: u64,
    off: u64,
}

impl<'a> Pieces<'a> {
    /// The pieces of `len` bytes, each at most `max` bytes (`max` > 0).
    pub(crate) fn new(src: Span<'a>, dst: Span<'a>, len: u64, max: u32) -> Self {
        Self {
            src,
            dst,
            len,
            max: u64::from(max.max(1)),
            off: 0,
        }
    }

    /// Bytes not yet returned.
    pub(crate) fn remaining(&self) -> u64 {
        self.len - self.off
    }
}

impl Iterator for Pieces<'_> {
    type Item = (u64, u64, u32);

    /// `None` when all bytes were returned, or when a side has no address for the next byte
    /// (a span shorter than the copy: then [`Pieces::remaining`] stays non-zero).
    fn next(&mut self) -> Option<Self::Item> {
        if self.off >= self.len {
            return None;
        }
        let (s, s_run) = self.src.at(self.off)?;
        let (d, d_run) = self.dst.at(self.off)?;
        let n = self.remaining().min(self.max).min(s_run).min(d_run);
        self.off += n;
        // CAST: at most `max`, a `u32`.
        Some((s, d, n as u32))
    }
}

#[cfg(neuron_udma_kunit)]
#[kunit_tests(neuron_udma_span)]
mod tests {
    use super::*;

    const K: u64 = 4096;

    fn collect(p: Pieces<'_>) -> Result<KVec<(u64, u64, u32)>> {
        let mut v = KVec::new();
        for x in p {
            v.push(x, GFP_KERNEL)?;
        }
        Ok(v)
    }

    #[test]
    fn runs_merge_contiguous_segments() -> Result {
        let dma = [
            (0x10000, K),
            (0x11000, K),
            (0x30000, 100),
            (0, 0),
            (0x40000, K),
        ];
        let r = runs(dma.into_iter())?;
        assert_eq!(r.len(), 3);
        assert_eq!(
            r[0],
            Segment {
                offset: 0,
                addr: 0x10000,
                len: 2 * K
            }
        );
        assert_eq!(
            r[1],
            Segment {
                offset: 2 * K,
                addr: 0x30000,
                len: 100
            }
        );
        assert_eq!(
            r[2],
            Segment {
                offset: 2 * K + 100,
                addr: 0x40000,
                len: K
            }
        );
        Ok(())
    }

    #[test]
    fn linear_copies_split_only_at_the_descriptor_limit() -> Result {
        let p = Pieces::new(
            Span::Linear(0x1000),
            Span::Linear(0x9000_0000),
            150_000,
            65536,
        );
        let v = collect(p)?;
        assert_eq!(
            &v[..],
            &[
                (0x1000, 0x9000_0000, 65536),
                (0x1000 + 65536, 0x9000_0000 + 65536, 65536),
                (0x1000 + 131072, 0x9000_0000 + 131072, 150_000 - 131072),
            ]
        );
        // A scrub source repeats.
        let v = collect(Pieces::new(
            Span::Repeat(0x5000),
            Span::Linear(0),
            70_000,
            65536,
        ))?;
        assert_eq!(
            &v[..],
            &[(0x5000, 0, 65536), (0x5000, 65536, 70_000 - 65536)]
        );
        Ok(())
    }

    #[test]
    fn runs_split_at_every_boundary_of_either_side() -> Result {
        // Source: an import starting 100 bytes into its first page, three runs.
        let src = [
            Segment {
                offset: 0,
                addr: 0x10064,
                len: K - 100,
            },
            Segment {
                offset: K - 100,
                addr: 0x50000,
                len: 2 * K,
            },
            Segment {
                offset: 3 * K - 100,
                addr: 0x20000,
                len: K,
            },
        ];
        let dst = [
            Segment {
                offset: 0,
                addr: 0x70000,
                len: 5000,
            },
            Segment {
                offset: 5000,
                addr: 0x80000,
                len: 100_000,
            },
        ];
        let route = 1 << 60;
        let s = Span::Runs {
            segs: &src,
            start: 10,
            route,
        };
        let d = Span::Runs {
            segs: &dst,
            start: 0,
            route: 0,
        };
        // Contiguous for K - 110 bytes from the start, not for K.
        assert_eq!(s.at(0).map(|(_, n)| n), Some(K - 110));
        let v = collect(Pieces::new(s, d, 3 * K - 110, 65536))?;
        assert_eq!(
            &v[..],
            &[
                (route | 0x1006e, 0x70000, (K - 110) as u32),
                (
                    route | 0x50000,
                    0x70000 + K - 110,
                    (5000 - (K - 110)) as u32
                ),
                (
                    route | (0x50000 + 5000 - (K - 110)),
                    0x80000,
                    (2 * K - (5000 - (K - 110))) as u32
                ),
            ]
        );
        let total: u64 = v.iter().map(|x| u64::from(x.2)).sum();
        assert_eq!(total, 3 * K - 110);
        // Past the end of the runs there is no address.
        assert_eq!(s.at(4 * K), None);
        Ok(())
    }
}
