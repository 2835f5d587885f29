//! Guest memory abstraction.
//!
//! The engine reaches two address spaces (hardware.rst §1.3): host memory (guest RAM,
//! made available by vfio-user DMA_MAP messages, or an in-memory buffer in
//! tests) and device memory (HBM, backing BAR4). Both implement
//! [`GuestMemory`], which resolves an address to a contiguous host span. The
//! copy loop moves bytes directly between two spans with `ptr::copy`, so it is
//! memcpy-bound and allocates nothing per descriptor.
//!
//! Guest memory is shared with a running guest, so the model never forms Rust
//! references to it: all accesses go through raw pointers.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::{Arc, RwLock};

/// A mapping of host memory (anonymous or a file), unmapped on drop.
pub struct MmapRegion {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the region is plain memory; all accesses use raw pointers and the
// model tolerates concurrent modification by the guest (like real DMA).
unsafe impl Send for MmapRegion {}
// SAFETY: see above.
unsafe impl Sync for MmapRegion {}

impl MmapRegion {
    /// Maps `len` bytes of zeroed anonymous private memory.
    pub fn anonymous(len: usize) -> std::io::Result<MmapRegion> {
        Self::map(None, 0, len, true)
    }

    /// Maps `len` bytes of `file` starting at `offset` (bytes), shared.
    pub fn from_file(file: &File, offset: u64, len: usize, writable: bool) -> std::io::Result<MmapRegion> {
        Self::map(Some(file.as_raw_fd()), offset, len, writable)
    }

    fn map(fd: Option<i32>, offset: u64, len: usize, writable: bool) -> std::io::Result<MmapRegion> {
        if len == 0 {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let off = libc::off_t::try_from(offset).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        let prot = libc::PROT_READ | if writable { libc::PROT_WRITE } else { 0 };
        let (flags, fd) = match fd {
            Some(fd) => (libc::MAP_SHARED, fd),
            None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1),
        };
        // SAFETY: a fresh mapping chosen by the kernel; arguments are checked by mmap.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, off) };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOMEM))?;
        Ok(MmapRegion { ptr, len })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the region is empty (never, mappings are non-empty).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for MmapRegion {
    fn drop(&mut self) {
        // SAFETY: ptr/len came from a successful mmap and are unmapped once.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// A contiguous, currently mapped piece of guest memory. The pointer stays
/// valid while the span is alive (it keeps its mapping referenced).
pub struct Span<'a> {
    ptr: *mut u8,
    len: usize,
    _keep: Option<Arc<MmapRegion>>,
    _life: std::marker::PhantomData<&'a ()>,
}

impl Span<'_> {
    /// Number of bytes available from the requested address.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if no bytes are available.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A guest-physical (or device) address space.
pub trait GuestMemory: Send + Sync {
    /// Resolves `addr` to a contiguous span of at most `max_len` bytes (shorter
    /// if a mapping ends first). `None` if `addr` is not mapped.
    fn span(&self, addr: u64, max_len: usize) -> Option<Span<'_>>;

    /// True if all of `[addr, addr+len)` is mapped.
    fn is_mapped(&self, addr: u64, len: usize) -> bool {
        let (mut a, mut left) = (addr, len);
        while left > 0 {
            match self.span(a, left) {
                Some(s) if !s.is_empty() => {
                    left -= s.len();
                    a = match a.checked_add(s.len() as u64) {
                        Some(v) => v,
                        None => return left == 0,
                    };
                }
                _ => return false,
            }
        }
        true
    }

    /// Reads `buf.len()` bytes at `addr`; `false` (buffer partly filled) if unmapped.
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        let mut done = 0;
        while done < buf.len() {
            let Some(s) = addr.checked_add(done as u64).and_then(|a| self.span(a, buf.len() - done)) else {
                return false;
            };
            if s.is_empty() {
                return false;
            }
            // SAFETY: the span is mapped for s.len bytes and kept alive; buf is a distinct Rust buffer.
            unsafe { std::ptr::copy_nonoverlapping(s.ptr, buf[done..].as_mut_ptr(), s.len) };
            done += s.len;
        }
        true
    }

    /// Writes `data` at `addr`; `false` (partly written) if unmapped.
    fn write(&self, addr: u64, data: &[u8]) -> bool {
        let mut done = 0;
        while done < data.len() {
            let Some(s) = addr.checked_add(done as u64).and_then(|a| self.span(a, data.len() - done)) else {
                return false;
            };
            if s.is_empty() {
                return false;
            }
            // SAFETY: as in `read`.
            unsafe { std::ptr::copy_nonoverlapping(data[done..].as_ptr(), s.ptr, s.len) };
            done += s.len;
        }
        true
    }
}

/// Copies `len` bytes from `src`@`sa` to `dst`@`da` span by span (memmove
/// semantics inside one space). Returns `false` if some part is unmapped.
pub fn copy(src: &dyn GuestMemory, sa: u64, dst: &dyn GuestMemory, da: u64, len: usize) -> bool {
    let mut done = 0usize;
    while done < len {
        let (Some(s_addr), Some(d_addr)) = (sa.checked_add(done as u64), da.checked_add(done as u64)) else {
            return false;
        };
        let Some(s) = src.span(s_addr, len - done) else { return false };
        let Some(d) = dst.span(d_addr, s.len()) else { return false };
        let n = s.len().min(d.len());
        if n == 0 {
            return false;
        }
        // SAFETY: both spans are mapped for at least n bytes and kept alive for the call.
        unsafe { std::ptr::copy(s.ptr, d.ptr, n) };
        done += n;
    }
    true
}

/// One flat range `[base, base+len)` backed by a mapping. Used for HBM (BAR4)
/// and for guest RAM in tests.
pub struct FlatMemory {
    base: u64,
    region: MmapRegion,
    fd: Option<OwnedFd>,
}

impl FlatMemory {
    /// Zeroed anonymous memory of `len` bytes at addresses `base..`.
    pub fn anonymous(base: u64, len: usize) -> std::io::Result<FlatMemory> {
        Ok(FlatMemory { base, region: MmapRegion::anonymous(len)?, fd: None })
    }

    /// Zeroed memory of `len` bytes backed by a memfd (so a vfio-user client can
    /// mmap it too), at addresses `base..`.
    pub fn memfd(base: u64, len: usize, name: &str) -> std::io::Result<FlatMemory> {
        let cname = std::ffi::CString::new(name).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: valid C string; returns a new fd or -1.
        let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is a freshly created descriptor we own.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        let file = File::from(owned);
        file.set_len(len as u64)?;
        let region = MmapRegion::from_file(&file, 0, len, true)?;
        Ok(FlatMemory { base, region, fd: Some(OwnedFd::from(file)) })
    }

    /// The memfd, if this memory was created with [`FlatMemory::memfd`].
    pub fn raw_fd(&self) -> Option<i32> {
        self.fd.as_ref().map(|f| f.as_raw_fd())
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.region.len()
    }

    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.region.is_empty()
    }
}

impl GuestMemory for FlatMemory {
    fn span(&self, addr: u64, max_len: usize) -> Option<Span<'_>> {
        let off = usize::try_from(addr.checked_sub(self.base)?).ok()?;
        if off >= self.region.len() {
            return None;
        }
        Some(Span {
            // SAFETY: off < len, inside the mapping.
            ptr: unsafe { self.region.as_ptr().add(off) },
            len: max_len.min(self.region.len() - off),
            _keep: None,
            _life: std::marker::PhantomData,
        })
    }
}

/// Device memory as the engines address it: the HBM windows of the generation
/// ([`crate::layout::Gen::hbm_windows`]) over the BAR4 backing. A device address outside every
/// window is unmapped; a span never crosses a window's end.
pub struct HbmMap {
    bar4: Arc<FlatMemory>,
    /// `(device address, BAR4 offset, length)`, sorted by device address.
    windows: Vec<(u64, u64, u64)>,
}

impl HbmMap {
    /// The map of `gen` over `bar4`.
    pub fn new(gen: crate::layout::Gen, bar4: Arc<FlatMemory>) -> HbmMap {
        let windows = gen.hbm_windows(bar4.len() as u64);
        HbmMap { bar4, windows }
    }

    /// BAR4 offset of device address `addr` and the bytes left in its window.
    pub fn bar4_offset(&self, addr: u64) -> Option<(u64, u64)> {
        self.windows
            .iter()
            .find(|&&(d, _, l)| addr >= d && addr - d < l)
            .map(|&(d, o, l)| (o + (addr - d), l - (addr - d)))
    }
}

impl GuestMemory for HbmMap {
    fn span(&self, addr: u64, max_len: usize) -> Option<Span<'_>> {
        let (off, left) = self.bar4_offset(addr)?;
        let n = usize::try_from(left).map_or(max_len, |l| max_len.min(l));
        self.bar4.span(off, n)
    }
}

/// One DMA_MAP entry.
#[derive(Clone)]
struct DmaEntry {
    iova: u64,
    region: Arc<MmapRegion>,
}

/// The vfio-user DMA map table: guest RAM as announced by DMA_MAP/DMA_UNMAP.
///
/// Readers take a snapshot (`Arc` of the entry list); an unmapped region is
/// munmap'ed only when the last in-flight span referencing it is gone, so an
/// UNMAP racing with a copy never faults the model.
#[derive(Default)]
pub struct DmaTable {
    entries: RwLock<Arc<Vec<DmaEntry>>>,
}

impl DmaTable {
    /// Empty table.
    pub fn new() -> DmaTable {
        DmaTable::default()
    }

    /// Adds a mapping of `size` bytes of `file` at `offset` for IOVA `iova`.
    /// Overlapping older entries are dropped first.
    pub fn map(&self, iova: u64, size: u64, file: &File, offset: u64, writable: bool) -> std::io::Result<()> {
        let len = usize::try_from(size).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        iova.checked_add(size).ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        let region = Arc::new(MmapRegion::from_file(file, offset, len, writable)?);
        let mut g = self.entries.write().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<DmaEntry> =
            g.iter().filter(|e| !overlaps(e.iova, e.region.len() as u64, iova, size)).cloned().collect();
        v.push(DmaEntry { iova, region });
        v.sort_by_key(|e| e.iova);
        *g = Arc::new(v);
        Ok(())
    }

    /// Removes every entry overlapping `[iova, iova+size)`; returns how many.
    pub fn unmap(&self, iova: u64, size: u64) -> usize {
        let mut g = self.entries.write().unwrap_or_else(|e| e.into_inner());
        let before = g.len();
        let v: Vec<DmaEntry> =
            g.iter().filter(|e| !overlaps(e.iova, e.region.len() as u64, iova, size)).cloned().collect();
        let removed = before - v.len();
        *g = Arc::new(v);
        removed
    }

    /// Removes all entries.
    pub fn clear(&self) {
        *self.entries.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(Vec::new());
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// True if no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn overlaps(a: u64, alen: u64, b: u64, blen: u64) -> bool {
    a < b.saturating_add(blen) && b < a.saturating_add(alen)
}

impl GuestMemory for DmaTable {
    fn span(&self, addr: u64, max_len: usize) -> Option<Span<'_>> {
        let snap = self.entries.read().unwrap_or_else(|e| e.into_inner()).clone();
        let idx = snap.partition_point(|e| e.iova <= addr).checked_sub(1)?;
        let e = &snap[idx];
        let off = usize::try_from(addr - e.iova).ok()?;
        if off >= e.region.len() {
            return None;
        }
        Some(Span {
            // SAFETY: off < len, inside the mapping, kept alive by `_keep`.
            ptr: unsafe { e.region.as_ptr().add(off) },
            len: max_len.min(e.region.len() - off),
            _keep: Some(e.region.clone()),
            _life: std::marker::PhantomData,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_read_write_and_bounds() {
        let m = FlatMemory::anonymous(0x1000, 0x2000).unwrap();
        assert!(m.write(0x1ff0, &[1, 2, 3, 4]));
        let mut b = [0u8; 4];
        assert!(m.read(0x1ff0, &mut b));
        assert_eq!(b, [1, 2, 3, 4]);
        assert!(!m.read(0xfff, &mut b));
        assert!(!m.read(0x2ffe, &mut b));
        assert!(m.is_mapped(0x1000, 0x2000));
        assert!(!m.is_mapped(0x1000, 0x2001));
        assert!(!m.is_mapped(u64::MAX, 2));
    }

    #[test]
    fn dma_table_split_mappings_and_unmap() {
        let f = FlatMemory::memfd(0, 0x4000, "t").unwrap();
        // SAFETY: duplicate the memfd so that the table can map it.
        let file = unsafe { File::from_raw_fd(libc::dup(f.raw_fd().unwrap())) };
        let t = DmaTable::new();
        t.map(0x10000, 0x2000, &file, 0, true).unwrap();
        t.map(0x12000, 0x2000, &file, 0x2000, true).unwrap();
        assert_eq!(t.len(), 2);
        let data: Vec<u8> = (0..0x100u32).map(|i| i as u8).collect();
        assert!(t.write(0x11f80, &data)); // crosses the two entries
        let mut back = vec![0u8; 0x100];
        assert!(f.read(0x1f80, &mut back));
        assert_eq!(back, data);
        assert!(copy(&t, 0x11f80, &f, 0x3000, 0x100));
        assert!(f.read(0x3000, &mut back));
        assert_eq!(back, data);
        assert_eq!(t.unmap(0x12000, 0x1000), 1);
        assert!(!t.is_mapped(0x11f80, 0x100));
        assert!(!copy(&t, 0x11f80, &f, 0, 0x100));
        t.clear();
        assert!(t.is_empty());
    }
}
