// SPDX-License-Identifier: GPL-2.0
//! Peer-to-peer DMA between the device models of one guest (Documentation/udma-sim.rst,
//! "Peer-to-peer DMA").
//!
//! vfio-user gives a server the guest's RAM as DMA_MAP regions with a file descriptor, but the
//! BAR of another vfio-user device arrives *without* one (QEMU has only its own mapping of it),
//! so a model cannot reach another model's BAR4 by itself. The models of one guest share a
//! directory instead: each publishes where the guest put its BAR4 (the bus address from its
//! config space) and how to open its device memory (its pid and the memfd's descriptor number,
//! opened again through `/proc/PID/fd/N`, as a debugger would). A DMA_MAP without a descriptor
//! that falls inside a peer's published BAR4 is then mapped onto that peer's memfd, so a
//! descriptor addressing the peer's BAR reads and writes its device memory directly, as a PCIe
//! switch routes a peer-to-peer write to the other device's BAR.

use std::fs::{File, OpenOptions};
use std::path::PathBuf;

/// The shared directory of the models of one guest, and this model's entry in it.
pub struct PeerDir {
    dir: PathBuf,
    pid: u32,
    hbm_fd: i32,
    hbm_len: u64,
}

/// One peer's published BAR4: bus address and size (bytes), and how to open its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    pid: u32,
    fd: i32,
    bar4: u64,
    len: u64,
}

impl Entry {
    fn parse(s: &str) -> Option<Entry> {
        let mut it = s.split_whitespace();
        let pid = it.next()?.parse().ok()?;
        let fd = it.next()?.parse().ok()?;
        let bar4 = u64::from_str_radix(it.next()?.strip_prefix("0x")?, 16).ok()?;
        let len = it.next()?.parse().ok()?;
        Some(Entry { pid, fd, bar4, len })
    }

    fn format(&self) -> String {
        format!("{} {} 0x{:x} {}\n", self.pid, self.fd, self.bar4, self.len)
    }

    /// The offset of `[addr, addr + size)` in this BAR4, if it lies inside.
    fn offset_of(&self, addr: u64, size: u64) -> Option<u64> {
        let off = addr.checked_sub(self.bar4)?;
        (self.bar4 != 0 && off.checked_add(size)? <= self.len).then_some(off)
    }
}

impl PeerDir {
    /// This model's entry in `dir`: device memory of `hbm_len` bytes behind descriptor `hbm_fd`
    /// (the memfd of [`crate::mem::FlatMemory::memfd`]).
    pub fn new(dir: PathBuf, hbm_fd: i32, hbm_len: u64) -> PeerDir {
        PeerDir { dir, pid: std::process::id(), hbm_fd, hbm_len }
    }

    /// Publishes `bar4` as this model's BAR4 bus address (0: not placed). Written to a temporary
    /// name and renamed, so a peer reads the old line or the new one, never half of one.
    pub fn publish(&self, bar4: u64) -> std::io::Result<()> {
        let e = Entry { pid: self.pid, fd: self.hbm_fd, bar4, len: self.hbm_len };
        let tmp = self.dir.join(format!(".{}", self.pid));
        std::fs::write(&tmp, e.format())?;
        std::fs::rename(&tmp, self.dir.join(self.pid.to_string()))
    }

    /// The device memory of the peer whose BAR4 holds `[addr, addr + size)`: its memfd opened
    /// again (read-write if `writable`) and the offset of `addr` in it. `None` if no other model
    /// published such a BAR4, if two did (ambiguous: logged), or if its memory cannot be opened
    /// as what it published (a memfd of its size: the process may be gone, its pid reused).
    pub fn find(&self, addr: u64, size: u64, writable: bool) -> Option<(File, u64)> {
        let mut found = None;
        for d in std::fs::read_dir(&self.dir).ok()?.flatten() {
            let name = d.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with('.') || name == self.pid.to_string() {
                continue;
            }
            let Some(e) = std::fs::read_to_string(d.path()).ok().and_then(|s| Entry::parse(&s)) else {
                continue;
            };
            let Some(off) = e.offset_of(addr, size) else { continue };
            if let Some((other, _)) = found.replace((e, off)) {
                log::warn!("DMA_MAP 0x{addr:x}+0x{size:x}: two peers decode it ({other:?}, {e:?}); unreachable");
                return None;
            }
        }
        let (e, off) = found?;
        let path = format!("/proc/{}/fd/{}", e.pid, e.fd);
        let is_memfd = std::fs::read_link(&path).is_ok_and(|t| t.to_string_lossy().starts_with("/memfd:"));
        match OpenOptions::new().read(true).write(writable).open(&path) {
            Ok(f) if is_memfd && f.metadata().is_ok_and(|m| m.len() == e.len) => Some((f, off)),
            Ok(_) => {
                log::warn!("peer BAR4 0x{:x}: {path} is not its device memory (gone?)", e.bar4);
                None
            }
            Err(err) => {
                log::warn!("peer BAR4 0x{:x}: {path}: {err}", e.bar4);
                None
            }
        }
    }
}

impl Drop for PeerDir {
    /// A model that ends takes its entry away (one that is killed leaves it: [`PeerDir::find`]
    /// checks what it opens).
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.dir.join(self.pid.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_round_trip_and_range() {
        let e = Entry { pid: 42, fd: 7, bar4: 0xff_0400_0000, len: 64 << 20 };
        assert_eq!(Entry::parse(&e.format()), Some(e));
        assert_eq!(e.offset_of(0xff_0400_0000, 64 << 20), Some(0));
        assert_eq!(e.offset_of(0xff_0400_1000, 4096), Some(4096));
        assert_eq!(e.offset_of(0xff_0400_1000, 64 << 20), None);
        assert_eq!(e.offset_of(0xff_03ff_f000, 4096), None);
        assert_eq!(Entry { bar4: 0, ..e }.offset_of(0, 4096), None);
        assert_eq!(Entry::parse("1 2 ff 3"), None);
    }

    #[test]
    fn a_peer_is_found_and_itself_is_not() {
        let dir = std::env::temp_dir().join(format!("udma-sim-peer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mem = crate::mem::FlatMemory::memfd(0, 1 << 20, "peer-test").unwrap();
        let fd = mem.raw_fd().unwrap();
        let me = PeerDir::new(dir.clone(), fd, 1 << 20);
        me.publish(0x1000_0000).unwrap();
        // Its own BAR is not a peer.
        assert!(me.find(0x1000_0000, 4096, true).is_none());
        // Another model (here: an entry under another pid naming the same memfd) is.
        let other = Entry { pid: std::process::id(), fd, bar4: 0x2000_0000, len: 1 << 20 };
        std::fs::write(dir.join("1"), other.format()).unwrap();
        let (f, off) = me.find(0x2000_3000, 4096, true).expect("peer found");
        assert_eq!(off, 0x3000);
        assert_eq!(f.metadata().unwrap().len(), 1 << 20);
        assert!(me.find(0x2010_0000, 4096, true).is_none());
        // Two peers decoding the same range: ambiguous, none.
        std::fs::write(dir.join("2"), other.format()).unwrap();
        assert!(me.find(0x2000_3000, 4096, true).is_none());
        std::fs::remove_file(dir.join("2")).unwrap();
        // An entry whose descriptor is not a memfd of the published size: refused.
        let wrong = Entry { len: 2 << 20, ..other };
        std::fs::write(dir.join("1"), wrong.format()).unwrap();
        assert!(me.find(0x2000_3000, 4096, true).is_none());
        // The model's own entry goes with it.
        drop(me);
        assert!(!dir.join(std::process::id().to_string()).exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
