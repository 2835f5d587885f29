// SPDX-License-Identifier: GPL-2.0

//! The splitter: the one place that knows how a copy becomes descriptor pairs. A pair moves at
//! most [`PAIR_BYTES`] (64 KiB, which its length field encodes as 0: hardware.rst §4.2, 4.8)
//! between two ranges that are each contiguous in the device-fabric address space (`span.rs`
//! walks the runs of imported buffers). Where the barriers go depends on who copies:
//!
//! * a user's copy (`COPY_PREPARE_ONE`, `COPY_PREPARE`, `COPY_SPLIT`, `URING_COPY`): at most
//!   one pair's worth of bytes ([`copy_len`]); one pair, or with `COPY_SPLIT` one per piece
//!   within one run of each side ([`UserPairs`]), each carrying the copy's own barrier;
//! * the driver's copies (`MEMCPY`, `MEMSET`, the device-memory scrub, the device-ring fill,
//!   dmaengine memcpy and memset): any size, a [`Cut`] handed out one submission at a time
//!   ([`submission`]): no barrier on any pair but the submission's last, which carries the
//!   generation's final barrier (hardware.rst §6.1).
//!
//! Nothing here touches a queue: the submission engine (`submit.rs`) writes the pairs.

pub(crate) use crate::span::Move;
use crate::{
    desc::{Barrier, DescLen, MAX_DESC_BYTES},
    queue::Copy,
    span::{Pieces, Span},
};
use kernel::prelude::*;

/// Most bytes one pair moves: the largest copy a user prepares (`INFO`'s `max_copy_size`).
pub(crate) const PAIR_BYTES: u32 = MAX_DESC_BYTES;
/// Bytes a repeated source block ([`Span::Repeat`]: a fill block, the scrub's zeros) holds:
/// every pair reads it from its start, so one pair's worth.
pub(crate) const REPEAT_BYTES: usize = MAX_DESC_BYTES as usize;

/// What one copy moves: `size` bytes from `src` to `dst`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Job<'a> {
    /// Where the bytes come from.
    pub(crate) src: Span<'a>,
    /// Where they go.
    pub(crate) dst: Span<'a>,
    /// Bytes.
    pub(crate) size: u64,
}

impl<'a> Job<'a> {
    /// Bytes `[off, off + size)` of the job (both sides from `off` on, [`Span::skip`]).
    pub(crate) fn part(&self, off: u64, size: u64) -> Job<'a> {
        Job {
            src: self.src.skip(off),
            dst: self.dst.skip(off),
            size,
        }
    }
}

impl Job<'static> {
    /// Nothing to move (a placeholder in arrays of jobs).
    pub(crate) const EMPTY: Self = Self {
        src: Span::Linear(0),
        dst: Span::Linear(0),
        size: 0,
    };
}

/// The pieces of `job`, in order: `(source, destination, bytes)`, each at most one pair and
/// within one run of each side ([`Cut::job`]).
fn pieces<'a>(job: &Job<'a>) -> Pieces<'a> {
    Pieces::new(job.src, job.dst, job.size, MAX_DESC_BYTES)
}

/// Bytes each of `n` parts of a copy of `size` bytes takes, a whole number of pairs (the last
/// part takes the rest): a scrub run on several queues at once.
pub(crate) fn share(size: u64, n: u64) -> u64 {
    let unit = u64::from(MAX_DESC_BYTES);
    size.div_ceil(n.max(1)).div_ceil(unit) * unit
}

/// Validates the size of a user's copy: at most one pair.
///
/// # Errors
///
/// `EINVAL` for 0 and for sizes above [`PAIR_BYTES`].
#[inline]
pub(crate) fn copy_len(size: u32) -> Result<DescLen> {
    DescLen::new(size)
}

/// The pairs of a user's copy of `len` bytes ([`copy_len`]) from `src` to `dst`, each carrying
/// the copy's `barrier`: items are the pairs, or `ERANGE` once if a side ends before the copy
/// (the callers checked the ranges).
#[derive(Clone)]
pub(crate) enum UserPairs<'a> {
    /// Both sides contiguous (driver-allocated buffers): the one pair, until taken.
    One(Option<Copy>),
    /// A side made of runs (an import): one pair per piece.
    Runs {
        /// The pieces left.
        pieces: Pieces<'a>,
        /// The copy's barrier.
        barrier: Barrier,
    },
}

impl<'a> UserPairs<'a> {
    /// The pairs of the copy.
    #[inline]
    pub(crate) fn new(src: Span<'a>, dst: Span<'a>, len: DescLen, barrier: Barrier) -> Self {
        match (src, dst) {
            (Span::Linear(src), Span::Linear(dst)) => Self::One(Some(Copy {
                src,
                dst,
                len,
                barrier,
            })),
            _ => Self::Runs {
                pieces: Pieces::new(src, dst, u64::from(len.bytes()), MAX_DESC_BYTES),
                barrier,
            },
        }
    }

    /// How many pairs the copy takes (the pairs are not taken).
    ///
    /// # Errors
    ///
    /// `ERANGE` if a side ends before the copy.
    pub(crate) fn count_pairs(&self) -> Result<u32> {
        let mut n = 0;
        for p in self.clone() {
            p?;
            n += 1;
        }
        Ok(n)
    }
}

impl Iterator for UserPairs<'_> {
    type Item = Result<Copy>;

    #[inline]
    fn next(&mut self) -> Option<Result<Copy>> {
        match self {
            Self::One(c) => c.take().map(Ok),
            Self::Runs { pieces, barrier } => {
                if pieces.remaining() == 0 {
                    return None;
                }
                let Some((src, dst, n)) = pieces.next() else {
                    // A side ends early: report it once.
                    *pieces = Pieces::new(Span::Linear(0), Span::Linear(0), 0, 1);
                    return Some(Err(ERANGE));
                };
                Some(DescLen::new(n).map(|len| Copy {
                    src,
                    dst,
                    len,
                    barrier: *barrier,
                }))
            }
        }
    }
}

/// A driver copy being cut into pairs, one submission at a time ([`submission`]).
#[derive(Clone, Debug)]
pub(crate) struct Cut<'a>(Kind<'a>);

#[derive(Clone, Debug)]
enum Kind<'a> {
    /// One copy between two spans.
    Job(Pieces<'a>),
    /// Moves in order: the next one, the bytes of it already cut, and the bytes left of all.
    Moves {
        moves: &'a [Move],
        i: usize,
        off: u64,
        left: u64,
    },
}

impl<'a> Cut<'a> {
    /// Nothing to cut.
    pub(crate) const EMPTY: Self = Self(Kind::Moves {
        moves: &[],
        i: 0,
        off: 0,
        left: 0,
    });

    /// The pairs of `job`.
    pub(crate) fn job(job: &Job<'a>) -> Self {
        Self(Kind::Job(pieces(job)))
    }

    /// The pairs of `moves`, in order: the moves of a device ring's descriptors (`devring.rs`),
    /// the issued descriptors of a dmaengine channel (`dmaengine.rs`).
    pub(crate) fn moves(moves: &'a [Move]) -> Self {
        let left = moves.iter().map(|m| m.bytes).sum();
        Self(Kind::Moves {
            moves,
            i: 0,
            off: 0,
            left,
        })
    }

    /// Bytes not cut yet.
    pub(crate) fn remaining(&self) -> u64 {
        match &self.0 {
            Kind::Job(p) => p.remaining(),
            Kind::Moves { left, .. } => *left,
        }
    }

    /// Whether everything was cut.
    pub(crate) fn is_done(&self) -> bool {
        self.remaining() == 0
    }

    /// The next piece `(source, destination, bytes)`, at most one pair; `None` when done, or
    /// when a side has no address for the next byte (then [`Self::is_done`] stays `false`).
    fn next_piece(&mut self) -> Option<(u64, u64, u32)> {
        match &mut self.0 {
            Kind::Job(p) => p.next(),
            Kind::Moves {
                moves,
                i,
                off,
                left,
            } => loop {
                if *left == 0 {
                    return None;
                }
                let m = moves.get(*i)?;
                let n = (m.bytes - *off).min(u64::from(MAX_DESC_BYTES));
                let at = *off;
                *off += n;
                if *off == m.bytes {
                    (*i, *off) = (*i + 1, 0);
                }
                if n != 0 {
                    *left -= n;
                    let src = if m.repeat { m.src } else { m.src + at };
                    // CAST: at most MAX_DESC_BYTES.
                    return Some((src, m.dst + at, n as u32));
                }
            },
        }
    }
}

/// Cuts the next submission of at most `room` pairs from `cut` and hands each pair to `write`,
/// in order: no barrier on any but the last (the copy ends with it, or the room does), which
/// carries `last`, the generation's final barrier (hardware.rst §6.1). Returns the pairs handed
/// out.
///
/// # Errors
///
/// `ERANGE` if a side of the copy ends before it does (the callers check the ranges), those of
/// `write`; the cut has moved on then (the copy fails as a whole).
pub(crate) fn submission(
    cut: &mut Cut<'_>,
    room: u32,
    last: Barrier,
    mut write: impl FnMut(&Copy) -> Result,
) -> Result<u32> {
    let mut pairs = 0;
    while pairs < room && !cut.is_done() {
        let (src, dst, n) = cut.next_piece().ok_or(ERANGE)?;
        let end = cut.is_done() || pairs + 1 == room;
        write(&Copy {
            src,
            dst,
            len: DescLen::new(n)?,
            barrier: if end { last } else { Barrier::None },
        })?;
        pairs += 1;
    }
    Ok(pairs)
}

#[cfg(neuron_udma_kunit)]
#[kunit_tests(neuron_udma_split)]
mod tests {
    use super::*;
    use crate::span::Segment;

    /// One submission of at most `room` pairs of `cut`: `(source, destination, bytes, barrier)`.
    fn take(cut: &mut Cut<'_>, room: u32) -> Result<KVec<(u64, u64, u32, Barrier)>> {
        let mut v = KVec::new();
        submission(cut, room, Barrier::Write, |c| {
            v.push((c.src, c.dst, c.len.bytes(), c.barrier), GFP_KERNEL)?;
            Ok(())
        })?;
        Ok(v)
    }

    #[test]
    fn the_final_barrier_goes_on_the_last_pair_of_each_submission() -> Result {
        let job = Job {
            src: Span::Linear(0x1000),
            dst: Span::Linear(0x9000_0000),
            size: 150_000,
        };
        let mut cut = Cut::job(&job);
        // The room ends the first submission, the copy the second.
        let v = take(&mut cut, 2)?;
        assert_eq!(
            &v[..],
            &[
                (0x1000, 0x9000_0000, 65536, Barrier::None),
                (0x11000, 0x9001_0000, 65536, Barrier::Write),
            ]
        );
        assert!(!cut.is_done());
        let v = take(&mut cut, 2032)?;
        assert_eq!(
            &v[..],
            &[(0x21000, 0x9002_0000, 150_000 - 131_072, Barrier::Write)]
        );
        assert!(cut.is_done());
        assert_eq!(take(&mut cut, 2032)?.len(), 0);
        // A scrub's source repeats.
        let job = Job {
            src: Span::Repeat(0x5000),
            dst: Span::Linear(0),
            size: 70_000,
        };
        let v = take(&mut Cut::job(&job), 2032)?;
        assert_eq!(
            &v[..],
            &[
                (0x5000, 0, 65536, Barrier::None),
                (0x5000, 65536, 70_000 - 65536, Barrier::Write),
            ]
        );
        Ok(())
    }

    fn mv(src: u64, dst: u64, bytes: u64, repeat: bool) -> Move {
        Move {
            src,
            dst,
            bytes,
            repeat,
        }
    }

    #[test]
    fn moves_are_cut_in_order_and_empty_ones_skipped() -> Result {
        let moves = [
            mv(0x1000, 0x9000, 70_000, false),
            mv(0x7000, 0x8000, 0, false),
            mv(0x5_0000, 0x6_0000, 10, false),
        ];
        let mut cut = Cut::moves(&moves);
        assert_eq!(cut.remaining(), 70_010);
        let v = take(&mut cut, 2)?;
        assert_eq!(
            &v[..],
            &[
                (0x1000, 0x9000, 65536, Barrier::None),
                (
                    0x1000 + 65536,
                    0x9000 + 65536,
                    70_000 - 65536,
                    Barrier::Write
                ),
            ]
        );
        assert_eq!(cut.remaining(), 10);
        let v = take(&mut cut, 2032)?;
        assert_eq!(&v[..], &[(0x5_0000, 0x6_0000, 10, Barrier::Write)]);
        assert!(cut.is_done());
        assert!(Cut::moves(&[]).is_done());
        assert!(Cut::EMPTY.is_done());
        Ok(())
    }

    /// A fill's move reads its block from the start for every pair; the destination goes on.
    #[test]
    fn a_repeated_source_is_read_from_its_start() -> Result {
        let moves = [
            mv(0xF000, 0x10_0000, 2 * 65536 + 1, true),
            mv(0x2000, 0x3000, 4, false),
        ];
        let v = take(&mut Cut::moves(&moves), 2032)?;
        assert_eq!(
            &v[..],
            &[
                (0xF000, 0x10_0000, 65536, Barrier::None),
                (0xF000, 0x11_0000, 65536, Barrier::None),
                (0xF000, 0x12_0000, 1, Barrier::None),
                (0x2000, 0x3000, 4, Barrier::Write),
            ]
        );
        Ok(())
    }

    #[test]
    fn a_users_copy_is_one_pair_or_one_per_run() -> Result {
        assert_eq!(copy_len(0), Err(EINVAL));
        assert_eq!(copy_len(PAIR_BYTES + 1), Err(EINVAL));
        let len = copy_len(8192)?;
        let mut one = UserPairs::new(
            Span::Linear(0x1000),
            Span::Linear(0x2000),
            len,
            Barrier::Dmb,
        );
        assert_eq!(one.count_pairs()?, 1);
        let c = one.next().ok_or(EINVAL)??;
        assert_eq!(
            (c.src, c.dst, c.len.bytes(), c.barrier),
            (0x1000, 0x2000, 8192, Barrier::Dmb)
        );
        assert!(one.next().is_none());
        // An import of two runs: one pair per run, each with the copy's barrier.
        let segs = [
            Segment {
                offset: 0,
                addr: 0x10000,
                len: 4096,
            },
            Segment {
                offset: 4096,
                addr: 0x30000,
                len: 4096,
            },
        ];
        let src = Span::Runs {
            segs: &segs,
            start: 0,
            route: 0,
        };
        let runs = UserPairs::new(src, Span::Linear(0x9000), len, Barrier::Write);
        assert_eq!(runs.count_pairs()?, 2);
        let mut got = KVec::new();
        for p in runs {
            let c = p?;
            got.push((c.src, c.dst, c.len.bytes(), c.barrier), GFP_KERNEL)?;
        }
        assert_eq!(
            &got[..],
            &[
                (0x10000, 0x9000, 4096, Barrier::Write),
                (0x30000, 0xa000, 4096, Barrier::Write),
            ]
        );
        // A span shorter than the copy: ERANGE.
        let short = Span::Runs {
            segs: &segs[..1],
            start: 0,
            route: 0,
        };
        let mut bad = UserPairs::new(short, Span::Linear(0), len, Barrier::None);
        assert_eq!(bad.count_pairs(), Err(ERANGE));
        assert!(matches!(bad.next(), Some(Ok(_))));
        assert!(matches!(bad.next(), Some(Err(_))));
        assert!(bad.next().is_none());
        Ok(())
    }

    #[test]
    fn scrub_parts_are_whole_pairs() {
        let unit = u64::from(PAIR_BYTES);
        assert_eq!(share(4 << 20, 2), 2 << 20);
        assert_eq!(share(10 * unit + 1, 4), 3 * unit);
        assert_eq!(share(unit, 4), unit);
        assert_eq!(share(0, 4), 0);
    }
}
