// SPDX-License-Identifier: GPL-2.0
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

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

    /// The view of this memory one engine worker thread uses (see [`MemReader`]). Default: the
    /// memory itself, for memories whose lookups take no lock.
    fn reader(&self) -> Box<dyn MemReader + '_> {
        Box::new(Direct(self))
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

/// An engine worker's view of a [`GuestMemory`]. The worker calls [`MemReader::enter`] before
/// it accesses memory for a packet (or for held writes) and [`MemReader::leave`] before it
/// blocks; between the two it uses the reader as the memory. A reader may keep per-thread state
/// (a snapshot of the DMA map, [`DmaReader`]) so that the per-packet path shares no lock or
/// reference count with other workers.
pub trait MemReader: GuestMemory {
    /// The worker is about to access memory: take a current view if the memory changed.
    fn enter(&mut self) {}
    /// The worker accesses no memory until the next [`MemReader::enter`].
    fn leave(&mut self) {}
}

/// The default reader: the memory itself.
struct Direct<'a, T: ?Sized>(&'a T);

impl<T: GuestMemory + ?Sized> GuestMemory for Direct<'_, T> {
    fn span(&self, addr: u64, max_len: usize) -> Option<Span<'_>> {
        self.0.span(addr, max_len)
    }

    fn reader(&self) -> Box<dyn MemReader + '_> {
        Box::new(Direct(self.0))
    }
}

impl<T: GuestMemory + ?Sized> MemReader for Direct<'_, T> {}

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

/// The entry `addr` falls in, as a span of at most `max_len` bytes; `keep` makes the span hold a
/// reference to the mapping (for callers without a snapshot that outlives the span).
fn entry_span<'a>(entries: &'a [DmaEntry], addr: u64, max_len: usize, keep: bool) -> Option<Span<'a>> {
    let idx = entries.partition_point(|e| e.iova <= addr).checked_sub(1)?;
    let e = &entries[idx];
    let off = usize::try_from(addr - e.iova).ok()?;
    if off >= e.region.len() {
        return None;
    }
    Some(Span {
        // SAFETY: off < len, inside the mapping, kept alive by `entries` (or `_keep`).
        ptr: unsafe { e.region.as_ptr().add(off) },
        len: max_len.min(e.region.len() - off),
        _keep: keep.then(|| e.region.clone()),
        _life: std::marker::PhantomData,
    })
}

/// What a [`DmaReader`] publishes in its slot while it holds no snapshot in use.
const READER_IDLE: u64 = u64::MAX;

/// The slot of one [`DmaReader`]: the generation of the snapshot it may be using, or
/// [`READER_IDLE`]. Written by its reader only (when the generation changes, or when the reader
/// goes idle or busy), read by a table update waiting for its grace period. Aligned so that no
/// other data shares its cache line.
#[repr(align(128))]
struct ReaderSlot {
    seen: AtomicU64,
}

/// The current entries and their generation.
struct Entries {
    list: Arc<Vec<DmaEntry>>,
    gen: u64,
}

/// The vfio-user DMA map table: guest RAM as announced by DMA_MAP/DMA_UNMAP.
///
/// Engine workers do not look entries up in the table: each has a [`DmaReader`], which keeps its
/// own snapshot of the entries and takes a new one only when the table's generation changed, so
/// the per-packet path reads one atomic that is written only by table updates (no lock, no
/// reference count). A table update (map, unmap, clear) replaces the entries, bumps the
/// generation and then waits for a **grace period**: until every reader is idle or has taken a
/// snapshot of that generation or later. Only then does it return, so the vfio-user reply to a
/// DMA_UNMAP is sent when no worker can touch the unmapped region any more, and every packet
/// that starts after it uses the new entries. A mapping is munmap'ed when the last snapshot
/// holding it is dropped.
///
/// Other users (the server thread, tests) can use the table itself as a [`GuestMemory`]: each
/// lookup then takes the table lock.
pub struct DmaTable {
    entries: Mutex<Entries>,
    /// Generation of `entries`; stored (SeqCst) after each replacement.
    gen: AtomicU64,
    /// Slots of the live readers.
    readers: Mutex<Vec<Arc<ReaderSlot>>>,
}

impl Default for DmaTable {
    fn default() -> DmaTable {
        DmaTable {
            entries: Mutex::new(Entries { list: Arc::new(Vec::new()), gen: 0 }),
            gen: AtomicU64::new(0),
            readers: Mutex::new(Vec::new()),
        }
    }
}

impl DmaTable {
    /// Empty table.
    pub fn new() -> DmaTable {
        DmaTable::default()
    }

    fn lock(&self) -> MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces the entries by `f(current)` and waits for the grace period (see [`DmaTable`]).
    /// Returns what `f` returned.
    fn update<R>(&self, f: impl FnOnce(&[DmaEntry]) -> (Vec<DmaEntry>, R)) -> R {
        let gen = {
            let mut g = self.lock();
            let (v, r) = f(&g.list);
            g.list = Arc::new(v);
            g.gen += 1;
            // SeqCst, then the SeqCst loads of the reader slots in `wait_readers`: a reader
            // whose slot still reads idle there has not yet made its SeqCst load of `gen` in
            // `DmaReader::enter`, so that load sees this store (or a later one).
            self.gen.store(g.gen, Ordering::SeqCst);
            (g.gen, r)
        };
        self.wait_readers(gen.0);
        gen.1
    }

    /// Waits until every reader is idle or uses a snapshot of generation `gen` or later.
    fn wait_readers(&self, gen: u64) {
        let slots: Vec<Arc<ReaderSlot>> = self.readers.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for s in slots {
            let mut spins = 0u32;
            loop {
                let v = s.seen.load(Ordering::SeqCst);
                if v == READER_IDLE || v >= gen {
                    break;
                }
                // A busy reader takes the new snapshot before its next packet: wait at most about
                // one packet.
                spins += 1;
                if spins < 100 {
                    std::hint::spin_loop();
                } else if spins < 200 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(std::time::Duration::from_micros(20));
                }
            }
        }
    }

    /// Adds a mapping of `size` bytes of `file` at `offset` for IOVA `iova`.
    /// Overlapping older entries are dropped first.
    pub fn map(&self, iova: u64, size: u64, file: &File, offset: u64, writable: bool) -> std::io::Result<()> {
        let len = usize::try_from(size).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        iova.checked_add(size).ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        let region = Arc::new(MmapRegion::from_file(file, offset, len, writable)?);
        self.update(|cur| {
            let mut v: Vec<DmaEntry> =
                cur.iter().filter(|e| !overlaps(e.iova, e.region.len() as u64, iova, size)).cloned().collect();
            v.push(DmaEntry { iova, region });
            v.sort_by_key(|e| e.iova);
            (v, ())
        });
        Ok(())
    }

    /// Removes every entry overlapping `[iova, iova+size)`; returns how many. When it returns,
    /// no engine worker can access the removed entries any more.
    pub fn unmap(&self, iova: u64, size: u64) -> usize {
        self.update(|cur| {
            let v: Vec<DmaEntry> =
                cur.iter().filter(|e| !overlaps(e.iova, e.region.len() as u64, iova, size)).cloned().collect();
            let removed = cur.len() - v.len();
            (v, removed)
        })
    }

    /// Removes all entries (with the same guarantee as [`DmaTable::unmap`]).
    pub fn clear(&self) {
        self.update(|_| (Vec::new(), ()));
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.lock().list.len()
    }

    /// True if no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A reader with its own snapshot of the entries, for one engine worker thread.
    pub fn worker_reader(&self) -> DmaReader<'_> {
        let slot = Arc::new(ReaderSlot { seen: AtomicU64::new(READER_IDLE) });
        self.readers.lock().unwrap_or_else(|e| e.into_inner()).push(slot.clone());
        let g = self.lock();
        DmaReader { table: self, slot, snap: g.list.clone(), gen: g.gen, busy: false }
    }
}

fn overlaps(a: u64, alen: u64, b: u64, blen: u64) -> bool {
    a < b.saturating_add(blen) && b < a.saturating_add(alen)
}

impl GuestMemory for DmaTable {
    fn span(&self, addr: u64, max_len: usize) -> Option<Span<'_>> {
        let list = self.lock().list.clone();
        let s = entry_span(&list, addr, max_len, true)?;
        // The span holds its mapping itself; it does not borrow the local snapshot.
        Some(Span { ptr: s.ptr, len: s.len, _keep: s._keep, _life: std::marker::PhantomData })
    }

    fn reader(&self) -> Box<dyn MemReader + '_> {
        Box::new(self.worker_reader())
    }
}

/// One engine worker's view of a [`DmaTable`]: a snapshot of its entries, renewed by
/// [`MemReader::enter`] when the table's generation changed.
///
/// Ordering (see [`DmaTable`] for the update side): [`MemReader::enter`] first publishes "busy"
/// (the snapshot's generation) in the reader's slot with a SeqCst store, then loads the table
/// generation with SeqCst. An update stores the new generation with SeqCst, then loads every
/// slot with SeqCst. In the single order of SeqCst operations, either the update's slot load
/// comes after the reader's store (the update sees the reader busy with an older generation and
/// waits until it takes the new snapshot or goes idle), or before it, and then the reader's
/// generation load comes after the update's store and sees the new generation. So no packet
/// uses a snapshot older than an update that had returned when the packet started. A reader
/// busy across many packets loads the generation before each one (a plain load on x86; the
/// line is written only by updates) and publishes only when it changes.
pub struct DmaReader<'a> {
    table: &'a DmaTable,
    slot: Arc<ReaderSlot>,
    snap: Arc<Vec<DmaEntry>>,
    gen: u64,
    busy: bool,
}

impl DmaReader<'_> {
    /// Takes the table's current snapshot and publishes its generation.
    fn refresh(&mut self) {
        let (list, gen) = {
            let g = self.table.lock();
            (g.list.clone(), g.gen)
        };
        // The old snapshot is dropped here (a mapping no snapshot holds is munmap'ed).
        self.snap = list;
        self.gen = gen;
        self.slot.seen.store(gen, Ordering::SeqCst);
    }
}

impl GuestMemory for DmaReader<'_> {
    fn span(&self, addr: u64, max_len: usize) -> Option<Span<'_>> {
        entry_span(&self.snap, addr, max_len, false)
    }

    fn reader(&self) -> Box<dyn MemReader + '_> {
        Box::new(self.table.worker_reader())
    }
}

impl MemReader for DmaReader<'_> {
    fn enter(&mut self) {
        if !self.busy {
            self.slot.seen.store(self.gen, Ordering::SeqCst);
            self.busy = true;
        }
        if self.table.gen.load(Ordering::SeqCst) != self.gen {
            self.refresh();
        }
    }

    fn leave(&mut self) {
        if self.busy {
            self.slot.seen.store(READER_IDLE, Ordering::SeqCst);
            self.busy = false;
        }
    }
}

impl Drop for DmaReader<'_> {
    fn drop(&mut self) {
        self.leave();
        let mut r = self.table.readers.lock().unwrap_or_else(|e| e.into_inner());
        r.retain(|s| !Arc::ptr_eq(s, &self.slot));
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

    #[test]
    fn dma_reader_keeps_a_snapshot_and_updates_wait_for_busy_readers() {
        use std::sync::atomic::AtomicBool;
        use std::time::Duration;
        let f = FlatMemory::memfd(0, 0x4000, "t").unwrap();
        // SAFETY: duplicate the memfd so that the table can map it.
        let file = unsafe { File::from_raw_fd(libc::dup(f.raw_fd().unwrap())) };
        let t = DmaTable::new();
        t.map(0x10000, 0x2000, &file, 0, true).unwrap();
        let mut r = t.worker_reader();
        r.enter();
        assert!(r.is_mapped(0x10000, 0x2000));
        // A busy reader keeps using its snapshot; the unmap does not return before the reader
        // has moved to the new one (its next packet).
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                assert_eq!(t.unmap(0x10000, 0x1000), 1);
                done.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(Duration::from_millis(50));
            assert!(!done.load(Ordering::SeqCst), "unmap returned while a reader used the old snapshot");
            assert!(r.is_mapped(0x10000, 0x2000));
            r.enter();
            assert!(!r.is_mapped(0x10000, 0x1000));
        });
        assert!(done.load(Ordering::SeqCst));
        // An idle reader does not hold an update up, and sees it when it next enters.
        r.leave();
        t.map(0x20000, 0x1000, &file, 0x1000, true).unwrap();
        r.enter();
        assert!(r.is_mapped(0x20000, 0x1000));
        // Dropping the reader deregisters it: later updates wait for nobody.
        drop(r);
        t.clear();
        assert!(t.is_empty());
    }
}
