// SPDX-License-Identifier: GPL-2.0
//! `MEMSET`, `DMABUF_IMPORT` and `DMABUF_EXPORT`.
//!
//! `MEMSET` fills a range of a slot's buffer on the driver's shared queue, as `MEMCPY` copies:
//! it returns when the bytes are written (the fuzzer's calls use the default timeout, and no
//! fault reaches the shared queue), so the range holds the value afterwards, and the copies in
//! flight that read or write it race it (`model::fill`).
//!
//! `DMABUF_IMPORT` takes the dma-buf of the case's udmabuf region (`import.rs`, `UDMABUF`: a
//! sealed memfd the CPU writes through its mapping) or one of the case's own exports. A udmabuf
//! import views the region as a `MEM_IMPORT` of it would (its runs from `/proc/self/pagemap`,
//! which `segments` must match); an import of an export views the exported device buffer (one
//! run). `DMABUF_EXPORT` gives a device buffer as a dma-buf; the fuzzer keeps up to
//! [`MAX_EXPORTS`] of their descriptors per case. While a descriptor or an import of it is
//! open, `MEM_FREE` of the buffer is `EBUSY`.
//!
//! Not generated: `EACCES` (`IMPORT_WRITE` of a dma-buf not open for writing): udmabuf and this
//! driver both export with `O_RDWR`, and a dma-buf cannot be reopened read-only.

use crate::dev::{phys_runs, Errno};
use crate::fuzz::{expect, fact, fail, note_handle, Sut};
use crate::import::UDMABUF;
use crate::model::*;
use libc::{EBADF, EINVAL, ENOENT, EPERM, ERANGE};
use neuron_udma::sys;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Export descriptors the fuzzer holds at most (the oldest is closed for a new one).
pub(crate) const MAX_EXPORTS: usize = 4;

/// A `DMABUF_EXPORT` descriptor the fuzzer holds.
#[derive(Debug)]
pub(crate) struct ExportM {
    /// The dma-buf.
    pub(crate) fd: OwnedFd,
    /// The exported device buffer's handle (its space in the model).
    pub(crate) dev: u64,
    /// Its size (the dma-buf's).
    pub(crate) size: usize,
}

/// What a `MEMSET` will do and must answer.
pub(crate) struct MsPlan {
    pub(crate) arg: sys::neuron_udma_memset,
    pub(crate) ok: bool,
    pub(crate) errs: Vec<Errno>,
    pub(crate) at: Loc,
    pub(crate) n: usize,
}

impl Sut {
    /// Holders of device buffer `h` that keep it exported: the descriptors the fuzzer holds and
    /// the imports of them (of either file).
    pub(crate) fn export_holders(&self, h: u64) -> usize {
        let fds = self.exports.iter().filter(|e| e.dev == h).count();
        let imports = self
            .files
            .iter()
            .flat_map(|f| f.all())
            .filter(|b| matches!(b.kind, Kind::OwnExport { dev, .. } if dev == h))
            .count();
        fds + imports
    }

    /// What a `MEMSET` of slot `slot` of file `f` must answer. `how`: 0 valid, 1 size 0, 2 a
    /// value above 255 (`EINVAL`), 3 one byte past the end, 4 an offset that wraps (`ERANGE`),
    /// 5 another file's buffer, 6 a stale handle (`ENOENT`); an import without `IMPORT_WRITE`
    /// is `EPERM`.
    pub(crate) fn memset_plan(&self, f: usize, slot: u8, off: u16, size: u8, value: u8, how: u8) -> MsPlan {
        const SIZES: [usize; 8] = [4096, 1, 65536, 100, 65537, 8192, 3, 200_000];
        let s = match how {
            5 => 4,
            6 => 5,
            _ => slot % BUF_SLOTS as u8,
        };
        let h = self.handle(f, s);
        let b = h.and_then(|h| self.files[f].by_handle(h));
        let bsz = b.map_or(4096, |b| b.size);
        let o = (off as usize * bsz) >> 16;
        let n = SIZES[size as usize % 8].min(bsz - o);
        let mut arg = sys::neuron_udma_memset {
            handle: h.unwrap_or(self.stale_handle()),
            offset: o as u64,
            size: n as u64,
            value: u32::from(value),
            timeout_ms: 0,
        };
        match how {
            1 => arg.size = 0,
            2 => arg.value = 256 + u32::from(value),
            3 => arg.size = (bsz - o + 1) as u64,
            4 => arg.offset = u64::MAX - 1,
            _ => {}
        }
        let errs = memset_errs(how, b.map(|b| b.writable()));
        MsPlan { arg, ok: errs.is_empty(), errs, at: b.map_or((0, 0), |b| b.loc(o)), n }
    }

    /// `MEMSET` (`how` 7: on the read-only file, `EBADF`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn memset(&mut self, f: usize, slot: u8, off: u16, size: u8, value: u8, how: u8) {
        let how = how % 8;
        let p = self.memset_plan(f, slot, off, size, value, how);
        let mut a = p.arg;
        if how == 7 {
            let r = self.ro.ioctl(sys::NEURON_UDMA_MEMSET, &mut a);
            expect("MEMSET on a read-only file", r, false, &[EBADF]).ok();
            return;
        }
        let r = self.devs[f].ioctl(sys::NEURON_UDMA_MEMSET, &mut a);
        let what =
            format!("MEMSET of {} bytes at offset {} of buffer {} to {:#x}", a.size, a.offset, a.handle, a.value);
        if expect(&what, r, p.ok, &p.errs).is_ok() {
            fill(&mut self.mem, &mut self.queues, p.at, p.n, value);
            if p.n > 65536 {
                fact("MEMSETs of more than one 64 KiB pair", 1);
            }
        }
    }

    /// `DMABUF_IMPORT` into slot `slot` of file `f`. `how`: 0 the udmabuf (`src` even, or no
    /// export held) or an export the fuzzer holds, with `IMPORT_WRITE` if `write`; 1 no
    /// descriptor, 2 the udmabuf's memfd, 3 the device file (`EBADF`: not dma-bufs), 4 an
    /// unknown flag, 5 reserved set (`EINVAL`), 6 on the read-only file (`EBADF`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn dmabuf_import(&mut self, f: usize, slot: usize, src: u8, write: bool, how: u8) {
        let how = how % 7;
        let udmabuf = self.regions[UDMABUF].dmabuf();
        let export = (!self.exports.is_empty() && (src % 2 == 1 || udmabuf.is_none()))
            .then(|| (src as usize / 2) % self.exports.len());
        let fd: RawFd = match (export, udmabuf) {
            (Some(i), _) => self.exports[i].fd.as_raw_fd(),
            (None, Some(fd)) => fd,
            // Nothing to import: the invalid variants only.
            (None, None) if how == 0 => return,
            (None, None) => -1,
        };
        let mut a = sys::neuron_udma_dmabuf_import {
            fd,
            flags: if write { sys::NEURON_UDMA_IMPORT_WRITE } else { 0 },
            ..Default::default()
        };
        let mut dev = self.devs[f].raw();
        let errs: Vec<Errno> = match how {
            1 => {
                a.fd = if src.is_multiple_of(2) { -1 } else { 1_000_000 };
                vec![EBADF]
            }
            2 => {
                a.fd = self.regions[UDMABUF].memfd().unwrap_or(-1);
                vec![EBADF]
            }
            3 => {
                a.fd = dev;
                vec![EBADF]
            }
            4 => {
                a.flags |= 2;
                vec![EINVAL]
            }
            5 => {
                a.reserved = 1;
                vec![EINVAL]
            }
            6 => {
                dev = self.ro.raw();
                vec![EBADF]
            }
            _ => vec![],
        };
        let what = format!(
            "DMABUF_IMPORT of {}{}",
            match (how, export) {
                (1..=3, _) => "a descriptor that is not a dma-buf".to_string(),
                (_, Some(i)) => format!("the export of device buffer {}", self.exports[i].dev),
                _ => "the udmabuf".to_string(),
            },
            if write { " (IMPORT_WRITE)" } else { "" }
        );
        let r = crate::dev::ioctl_raw(
            dev,
            sys::NEURON_UDMA_DMABUF_IMPORT,
            (&mut a as *mut sys::neuron_udma_dmabuf_import).cast(),
        );
        if expect(&what, r, errs.is_empty(), &errs).is_err() {
            return;
        }
        note_handle(a.handle);
        let b = match export {
            Some(i) => {
                let e = &self.exports[i];
                if a.size != e.size as u64 || a.segments != 1 {
                    fail!("{what}: size {} segments {}, expected size {} in one run", a.size, a.segments, e.size);
                }
                fact("imports of own exports", 1);
                BufM {
                    handle: a.handle,
                    size: e.size,
                    kind: Kind::OwnExport { dev: e.dev, writable: write },
                    mmap_offset: 0,
                    map: None,
                    at: (e.dev, 0),
                }
            }
            None => {
                let reg = &self.regions[UDMABUF];
                let runs = phys_runs(reg.addr(0), reg.len).unwrap_or_else(|e| fail!("{what}: {e}"));
                if a.size != reg.len as u64 || a.segments as usize != runs.len() + 1 {
                    fail!(
                        "{what}: size {} segments {}; the udmabuf has {} bytes in {} physically contiguous runs (new runs at {runs:?})",
                        a.size,
                        a.segments,
                        reg.len,
                        runs.len() + 1
                    );
                }
                fact("imports of udmabufs", 1);
                fact("runs of udmabuf imports", u64::from(a.segments));
                BufM {
                    handle: a.handle,
                    size: reg.len,
                    kind: Kind::Import { region: UDMABUF, writable: write, runs },
                    mmap_offset: 0,
                    map: None,
                    at: (REGION_SPACE + UDMABUF as u64, 0),
                }
            }
        };
        self.put(f, slot, b);
    }

    /// `DMABUF_EXPORT` of a buffer of file `f` from slot `slot` (`O_CLOEXEC` if `cloexec`).
    /// `how`: 0 a device buffer (the descriptor is kept), 1 closes a kept descriptor, 2 a host
    /// buffer or an import (`EINVAL`), 3 an unknown flag, 4 reserved set (`EINVAL`), 5 another
    /// file's buffer (`ENOENT`), 6 on the read-only file (`EBADF`).
    pub(crate) fn dmabuf_export(&mut self, f: usize, slot: usize, cloexec: bool, how: u8) {
        let how = how % 7;
        if how == 1 {
            if !self.exports.is_empty() {
                self.exports.remove(slot % self.exports.len());
                crate::fuzz::succeeded();
            }
            return;
        }
        let pick = |want_dev: bool| {
            (0..BUF_SLOTS)
                .map(|i| (slot + i) % BUF_SLOTS)
                .find_map(|s| self.files[f].bufs[s].as_ref().filter(|b| (b.kind == Kind::Device) == want_dev))
        };
        let b = match how {
            2 => pick(false),
            5 => None,
            _ => pick(true),
        };
        let handle = match how {
            5 => self.handle(f, 4).unwrap_or(self.stale_handle()),
            _ => b.map_or(self.stale_handle(), |b| b.handle),
        };
        let mut a = sys::neuron_udma_dmabuf_export {
            handle,
            flags: if cloexec { libc::O_CLOEXEC as u32 } else { 0 },
            fd: -1,
            reserved: 0,
        };
        match how {
            3 => a.flags |= libc::O_NONBLOCK as u32,
            4 => a.reserved = 1,
            _ => {}
        }
        let errs = export_errs(how, b.map(|b| &b.kind));
        let size = b.map_or(0, |b| b.size);
        if how == 6 {
            let r = self.ro.ioctl(sys::NEURON_UDMA_DMABUF_EXPORT, &mut a);
            expect("DMABUF_EXPORT on a read-only file", r, false, &[EBADF]).ok();
            return;
        }
        let what = format!("DMABUF_EXPORT of buffer {handle} (flags {:#x})", a.flags);
        let r = self.devs[f].ioctl(sys::NEURON_UDMA_DMABUF_EXPORT, &mut a);
        if expect(&what, r, errs.is_empty(), &errs).is_err() {
            return;
        }
        if a.fd < 0 {
            fail!("{what}: succeeded with descriptor {}", a.fd);
        }
        // SAFETY: a new descriptor that only this value owns.
        let fd = unsafe { OwnedFd::from_raw_fd(a.fd) };
        // SAFETY: plain fcntl on a descriptor we own.
        let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
        if (fl & libc::FD_CLOEXEC != 0) != cloexec {
            fail!("{what}: descriptor flags {fl:#x}, FD_CLOEXEC should be {cloexec}");
        }
        if self.exports.len() >= MAX_EXPORTS {
            self.exports.remove(0);
        }
        self.exports.push(ExportM { fd, dev: handle, size });
    }

    /// Whether device buffer `h` is exported (`MEM_FREE`: `EBUSY`).
    pub(crate) fn exported(&self, h: u64) -> bool {
        self.export_holders(h) > 0
    }
}

/// The answers a `MEMSET` variant `how` (`Sut::memset_plan`) allows, for a buffer that is
/// writable by the engine (`Some(true)`), an import without `IMPORT_WRITE` (`Some(false)`), or
/// not the file's (`None`): every rule the call breaks (the driver reports one of them);
/// `EPERM` only for an otherwise valid call.
pub(crate) fn memset_errs(how: u8, buf: Option<bool>) -> Vec<Errno> {
    let mut errs = vec![];
    match how {
        1 | 2 => errs.push(EINVAL),
        3 | 4 => errs.push(ERANGE),
        _ => {}
    }
    match buf {
        None => errs.push(ENOENT),
        Some(false) if errs.is_empty() => errs.push(EPERM),
        Some(_) => {}
    }
    errs
}

/// The answers a `DMABUF_EXPORT` variant `how` (`Sut::dmabuf_export`) allows for a buffer of
/// kind `kind` of the file (`None`: not the file's).
pub(crate) fn export_errs(how: u8, kind: Option<&Kind>) -> Vec<Errno> {
    let mut errs = vec![];
    if matches!(how, 3 | 4) {
        errs.push(EINVAL);
    }
    match kind {
        None => errs.push(ENOENT),
        Some(Kind::Device) => {}
        Some(_) => errs.push(EINVAL),
    }
    errs.dedup();
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memset_answers() {
        assert_eq!(memset_errs(0, Some(true)), []);
        assert_eq!(memset_errs(0, Some(false)), [EPERM]);
        assert_eq!(memset_errs(0, None), [ENOENT]);
        // Bad arguments and a stale handle: either may be reported; never EPERM with them.
        assert_eq!(memset_errs(1, None), [EINVAL, ENOENT]);
        assert_eq!(memset_errs(2, Some(false)), [EINVAL]);
        assert_eq!(memset_errs(3, Some(true)), [ERANGE]);
        assert_eq!(memset_errs(4, Some(false)), [ERANGE]);
    }

    #[test]
    fn export_answers() {
        let own = Kind::OwnExport { dev: 1, writable: true };
        assert_eq!(export_errs(0, Some(&Kind::Device)), []);
        assert_eq!(export_errs(0, Some(&Kind::Host)), [EINVAL]);
        assert_eq!(export_errs(2, Some(&own)), [EINVAL]);
        assert_eq!(export_errs(0, None), [ENOENT]);
        assert_eq!(export_errs(3, Some(&Kind::Device)), [EINVAL]);
        assert_eq!(export_errs(4, Some(&Kind::Host)), [EINVAL]);
        assert_eq!(export_errs(3, None), [EINVAL, ENOENT]);
    }
}
