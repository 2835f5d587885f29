// SPDX-License-Identifier: GPL-2.0
//! `MEM_IMPORT`: the process's own memory as buffers. Each test case maps five regions (4 KiB
//! pages of anonymous memory, a 2 MiB-aligned transparent huge page, a memfd's shared pages,
//! a read-only mapping, and a `PROT_NONE` one); imports take any byte range of them, so two
//! imports (of either file) may view the same bytes, and the CPU's writes to a region are
//! writes to its imports. The physically contiguous runs of each import are read from
//! `/proc/self/pagemap`: they must be what `segments` says, and they say how many pairs a copy
//! with `COPY_SPLIT` takes (`model::pieces`).
//!
//! A sixth region, a udmabuf's memfd, is imported only as a dma-buf (`DMABUF_IMPORT`, `dmabuf.rs`):
//! those imports view it as `MEM_IMPORT`s view theirs.
//!
//! Also `fork()` with live imports: the child copies from or into an import and may scribble
//! on its own copy of the memory first; the pinned pages stay the parent's.

use crate::dev::{ioctl_raw, phys_runs, Region, RegionKind};
use crate::fuzz::{ctx, expect, fact, fail, name, note_handle, Sut, PATTERN_SEQ};
use crate::model::*;
use crate::workers::Child;
use libc::{EFAULT, EINVAL};
use neuron_udma::sys;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;
use std::time::Duration;

/// The regions of a test case: (kind, bytes).
const REGIONS: [(RegionKind, usize); 6] = [
    (RegionKind::Anon, 256 << 10),
    (RegionKind::Thp, 2 << 20),
    (RegionKind::Memfd, 128 << 10),
    (RegionKind::ReadOnly, 64 << 10),
    (RegionKind::NoAccess, 8 << 10),
    (RegionKind::Udmabuf, 192 << 10),
];
/// The region that cannot be pinned.
const NO_ACCESS: usize = 4;
/// The read-only region.
const READ_ONLY: usize = 3;
/// The udmabuf region (`DMABUF_IMPORT`, `dmabuf.rs`; `MEM_IMPORT` does not take it).
pub(crate) const UDMABUF: usize = 5;

fn kind_name(k: RegionKind) -> &'static str {
    match k {
        RegionKind::Anon => "anonymous 4K",
        RegionKind::Thp => "THP",
        RegionKind::Memfd => "memfd",
        RegionKind::ReadOnly => "read-only",
        RegionKind::NoAccess => "PROT_NONE",
        RegionKind::Udmabuf => "udmabuf",
    }
}

/// The regions and their model bytes between test cases: mapping and filling them for every
/// case would cost more than the case under emulation. A case that ends normally gives them
/// back (the copies it left in flight made their destinations unknown); a failed one unmaps
/// them.
struct RegionPool {
    regions: Vec<Region>,
    bytes: Vec<Vec<Option<u8>>>,
}

static POOL: Mutex<Option<RegionPool>> = Mutex::new(None);

/// Fresh bytes for region `r`: a new pattern in the memory and the model.
fn refill(r: &Region) -> Vec<Option<u8>> {
    if r.kind == RegionKind::NoAccess {
        return vec![None; r.len];
    }
    let seed = PATTERN_SEQ.fetch_add(1, Relaxed) as u32;
    let data: Vec<u8> = (0..r.len).map(|j| pattern(seed, j)).collect();
    if r.kind != RegionKind::ReadOnly {
        r.write(0, &data);
    }
    data.into_iter().map(Some).collect()
}

impl Sut {
    /// Takes the regions of the previous case (refilling those whose bytes the model lost
    /// track of) or maps new ones, into the model.
    pub(crate) fn map_regions(&mut self) {
        let pool = POOL.lock().unwrap_or_else(|e| e.into_inner()).take();
        let (regions, mut bytes) = match pool {
            Some(p) => (p.regions, p.bytes),
            None => {
                let mut regions = vec![];
                let mut bytes = vec![];
                for &(kind, len) in REGIONS.iter() {
                    let seed = PATTERN_SEQ.fetch_add(1, Relaxed) as u32;
                    let r = Region::new(kind, len, |j| pattern(seed, j))
                        .unwrap_or_else(|e| fail!("mapping a {} region: {}", kind_name(kind), name(e)));
                    if kind == RegionKind::Udmabuf && r.dmabuf().is_none() {
                        fact("udmabuf regions without /dev/udmabuf (no DMABUF_IMPORT of one)", 1);
                    }
                    bytes.push(if kind == RegionKind::NoAccess {
                        vec![None; r.len]
                    } else {
                        (0..r.len).map(|j| Some(pattern(seed, j))).collect()
                    });
                    regions.push(r);
                }
                (regions, bytes)
            }
        };
        for (r, b) in regions.iter().zip(bytes.iter_mut()) {
            if r.kind != RegionKind::NoAccess
                && r.kind != RegionKind::ReadOnly
                && b.iter().filter(|v| v.is_none()).count() > r.len / 4
            {
                *b = crate::fuzz::part("open: refill", || refill(r));
            }
        }
        for r in regions.iter().filter(|r| r.kind == RegionKind::Thp) {
            // A fork while the page was pinned, or a write racing a child, may have split it.
            fact(
                if crate::fuzz::part("open: collapse", || r.collapse()) {
                    "THP regions one huge page"
                } else {
                    "THP regions not one huge page"
                },
                1,
            );
        }
        for (i, b) in bytes.into_iter().enumerate() {
            self.mem.insert(REGION_SPACE + i as u64, b);
        }
        self.regions = regions;
    }

    /// Gives the regions back for the next case (`Sut`'s drop, unless it failed).
    pub(crate) fn keep_regions(&mut self) {
        for q in 0..QUEUE_SLOTS {
            // Copies in flight may still land until the files are closed.
            self.forget_queue(q);
        }
        let regions = std::mem::take(&mut self.regions);
        let bytes = (0..regions.len()).map(|i| self.mem.take(REGION_SPACE + i as u64)).collect();
        *POOL.lock().unwrap_or_else(|e| e.into_inner()) = Some(RegionPool { regions, bytes });
    }

    /// Whether the CPU may write region `r` (and so an import of it may be written with
    /// `IMPORT_WRITE`).
    pub(crate) fn region_writable(&self, r: usize) -> bool {
        matches!(self.regions[r].kind, RegionKind::Anon | RegionKind::Thp | RegionKind::Memfd | RegionKind::Udmabuf)
    }

    /// `MEM_IMPORT` of part of region `region` into slot `slot` of file `f`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn import(&mut self, f: usize, slot: usize, region: u8, off: u16, len: u8, write: bool, how: u8) {
        const LENS: [usize; 8] = [1, 100, 4096, 5000, 65536 + 7, 200_000, usize::MAX, 12289];
        let how = how % 9;
        let mut r = match how {
            6 => NO_ACCESS,
            7 => READ_ONLY,
            _ => region as usize % 4,
        };
        let mut write = write || how == 7;
        let (mut o, l) = {
            let reg = &self.regions[r];
            // The whole region now and then (the THP region: one 2 MiB-aligned huge page).
            let o = if len % 16 == 6 { 0 } else { (off as usize * reg.len) >> 16 };
            (o, LENS[len as usize % 8].min(reg.len - o))
        };
        let mut a = sys::neuron_udma_mem_import {
            addr: self.regions[r].addr(o),
            size: l as u64,
            flags: if write { sys::NEURON_UDMA_IMPORT_WRITE } else { 0 },
            ..Default::default()
        };
        let mut errs = vec![];
        match how {
            1 => a.size = 0,
            2 => a.flags |= 2,
            3 => a.reserved[0] = 1,
            4 => a.size = ctx().info.max_import_size + 1,
            5 => {
                a.addr = u64::MAX - 100;
                a.size = 4096;
            }
            8 => {
                // The driver's own buffer mapping (VM_PFNMAP): not pinnable.
                match self.files[f].all().find_map(|b| b.map.as_ref()) {
                    Some(m) => {
                        a.addr = m.addr();
                        a.size = 4096;
                    }
                    None => {
                        r = NO_ACCESS;
                        o = 0;
                        a.addr = self.regions[r].addr(0);
                        a.size = 4096;
                    }
                }
                errs.push(EFAULT);
            }
            _ => {}
        }
        if matches!(how, 1..=5) {
            errs.push(EINVAL);
        }
        if r == NO_ACCESS || (r == READ_ONLY && write) {
            errs.push(EFAULT);
        }
        errs.dedup();
        let what = format!(
            "MEM_IMPORT of {} bytes at offset {o} of the {} region{}",
            a.size,
            kind_name(self.regions[r].kind),
            if write { " (IMPORT_WRITE)" } else { "" }
        );
        let res = self.devs[f].ioctl(sys::NEURON_UDMA_MEM_IMPORT, &mut a);
        if expect(&what, res, errs.is_empty(), &errs).is_err() {
            return;
        }
        note_handle(a.handle);
        write = a.flags & sys::NEURON_UDMA_IMPORT_WRITE != 0;
        let runs = phys_runs(a.addr, l).unwrap_or_else(|e| fail!("{what}: {e}"));
        if a.segments as usize != runs.len() + 1 {
            fail!(
                "{what}: segments {}, but /proc/self/pagemap shows {} physically contiguous runs (new runs at {runs:?})",
                a.segments,
                runs.len() + 1
            );
        }
        let k = kind_name(self.regions[r].kind);
        fact(&format!("imports of {k} memory"), 1);
        fact(&format!("runs of {k} imports"), u64::from(a.segments));
        let b = BufM {
            handle: a.handle,
            size: l,
            kind: Kind::Import { region: r, writable: write, runs },
            mmap_offset: 0,
            map: None,
            at: (REGION_SPACE + r as u64, o),
        };
        self.put(f, slot, b);
    }

    /// `fork()` with live imports: the child runs one `MEMCPY` from an import of file `f` (or,
    /// with `how` 2 and 3, into one), after scribbling on its own copy of the imported memory
    /// (`how` 1 and 3, private 4 KiB pages only). The parent then checks the import's memory and the
    /// destination: the pinned pages are the parent's, the child's writes went to its copies.
    pub(crate) fn fork_import(&mut self, f: usize, src: u8, dst: u8, soff: u16, size: u8, how: u8) {
        let into = how % 4 >= 2;
        let scribble = how % 2 == 1;
        // The import: the first slot from `src` holding one (writable when copied into).
        let Some(is) = (0..BUF_SLOTS).map(|i| (src as usize + i) % BUF_SLOTS).find(|&s| {
            self.files[f].bufs[s]
                .as_ref()
                .is_some_and(|b| matches!(b.kind, Kind::Import { .. }) && (!into || b.writable()))
        }) else {
            return;
        };
        // The other side: the first other slot from `dst` with a buffer.
        let Some(os) = (0..BUF_SLOTS)
            .map(|i| (dst as usize + i) % BUF_SLOTS)
            .find(|&s| s != is && self.files[f].bufs[s].is_some())
        else {
            return;
        };
        let (s_slot, d_slot) = if into { (os, is) } else { (is, os) };
        let plan = self.memcpy_plan(f, s_slot as u8, d_slot as u8, soff, 0, size, 0);
        let b = self.files[f].bufs[is].as_ref().expect("import");
        let Kind::Import { region, .. } = b.kind else { unreachable!("an import") };
        // The child scribbles on its own copy of private memory (the THP region is not mapped
        // in children: MADV_DONTFORK; a memfd's pages are shared).
        let private = self.regions[region].kind == RegionKind::Anon;
        let (at, len) = (b.at, b.size);
        let reg = &self.regions[region];
        let fd = self.devs[f].raw();
        let mut arg = plan.arg;
        let child = Child::spawn_code(Some(fd), || {
            if scribble && private {
                reg.write(at.1, &vec![0xA5; len]);
            }
            match ioctl_raw(fd, sys::NEURON_UDMA_MEMCPY, (&mut arg as *mut sys::neuron_udma_memcpy).cast()) {
                Ok(()) => 0,
                Err(e) => 100 + e,
            }
        });
        let r = match child.join(Duration::from_secs(30)) {
            Ok(0) => Ok(()),
            Ok(c) if c >= 100 => Err(c - 100),
            r => fail!("fork with a live import: the child {r:?}"),
        };
        fact("forks with live imports", 1);
        if expect("MEMCPY of a forked child with a live import", r, plan.ok, &plan.errs).is_ok() {
            self.memcpy_apply(&plan);
        }
        // The parent's memory is the model's: the child's scribbles went to its own copies.
        let got = self.regions[region].read(at.1, len);
        self.compare(at, len, &got, "the parent's imported memory after a child copied with it");
        let other = if into { s_slot } else { d_slot };
        self.check_slot(f, other);
    }

    /// Checks the bytes of slot `slot` of file `f` (as the `Check` operation).
    pub(crate) fn check_slot(&mut self, f: usize, slot: usize) {
        crate::fuzz::CUR_OP.store(5, Relaxed);
        self.check(f, slot);
        crate::fuzz::CUR_OP.store(26, Relaxed);
    }
}
