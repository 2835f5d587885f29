// SPDX-License-Identifier: GPL-2.0

//! A dmaengine provider, which Linux 7.3's Rust has no abstraction for (C in
//! `rust/kfac/dmaengine.c`): the registered `dma_device` ([`DmaRegistration`]), whose operations
//! are trampolines into `rust/dmaengine.rs`, the client descriptors ([`Txd`]) and their cookies
//! (the dmaengine core's `dma_cookie_*()`).

use kernel::prelude::*;

super::generated! { include!("dmaengine_generated.rs"); }

/// A dmaengine client descriptor as C passes it (`struct dma_async_tx_descriptor`, opaque).
pub(crate) use ffi::dma_async_tx_descriptor as RawTxd;

/// A dmaengine client descriptor (`struct dma_async_tx_descriptor`, allocated by
/// `device_prep_dma_memcpy`); freed on drop.
///
/// # Invariants
///
/// The pointer is a descriptor of `neuron_udma_prep_memcpy`, not freed, owned by this value.
pub(crate) struct Txd(core::ptr::NonNull<RawTxd>);

// SAFETY: a descriptor may be completed and freed from any task; the client does not touch it
// concurrently (dmaengine's rules: after submit the provider owns it until completion).
unsafe impl Send for Txd {}
// SAFETY: the methods taking `&self` are read-only or called by one owner at a time.
unsafe impl Sync for Txd {}

/// Outcome of a transfer (`enum dmaengine_tx_result`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TxResult {
    /// The copy completed.
    NoError = 0,
    /// The copy was aborted (engine error, timeout, unbind): the destination is undefined.
    Aborted = 3,
}

impl Txd {
    /// Takes ownership of `ptr`.
    ///
    /// # Safety
    ///
    /// `ptr` is the descriptor `neuron_udma_prep_memcpy` is preparing, owned by nobody else.
    pub(crate) unsafe fn from_raw(ptr: *mut RawTxd) -> Option<Self> {
        // INVARIANT: per the function's contract.
        core::ptr::NonNull::new(ptr).map(Self)
    }

    /// Assigns the next cookie of the descriptor's channel (`dma_cookie_assign()`) and returns
    /// it. The caller serialises the submissions of a channel.
    pub(crate) fn assign_cookie(&self) -> i32 {
        // SAFETY: by the type invariant the descriptor is alive.
        unsafe { ffi::neuron_udma_txd_assign_cookie(self.0.as_ptr()) }
    }

    /// Marks the descriptor's cookie complete on its channel (`dma_cookie_complete()`): called
    /// in cookie order, under the lock that serialises the channel's cookies.
    pub(crate) fn cookie_complete(&self) {
        // SAFETY: by the type invariant the descriptor is alive.
        unsafe { ffi::neuron_udma_txd_cookie_complete(self.0.as_ptr()) }
    }

    /// Whether the client acked the descriptor (`DMA_CTRL_ACK`): it may be freed once done.
    pub(crate) fn acked(&self) -> bool {
        // SAFETY: by the type invariant the descriptor is alive.
        unsafe { ffi::neuron_udma_txd_acked(self.0.as_ptr()) }
    }

    /// A handle to complete the descriptor while its owner keeps it.
    pub(crate) fn handle(&self) -> TxdRef {
        TxdRef(self.0)
    }
}

/// A borrowed [`Txd`], to complete it without the lock that guards its owner.
#[derive(Clone, Copy)]
pub(crate) struct TxdRef(core::ptr::NonNull<RawTxd>);

impl TxdRef {
    /// Unmaps the client's unmap data and runs its callback if it asked for one
    /// (`DMA_PREP_INTERRUPT`), with `result` and `residue` bytes not copied; returns whether
    /// the client has acked the descriptor by now ([`Txd::acked`]). Must be called without any
    /// driver lock held (the callback may submit more work), once.
    ///
    /// # Safety
    ///
    /// The [`Txd`] is alive until this returns.
    pub(crate) unsafe fn complete(self, result: TxResult, residue: u32) -> bool {
        // SAFETY: per the function's contract the descriptor is alive.
        unsafe { ffi::neuron_udma_txd_callback(self.0.as_ptr(), result as u32, residue) }
    }
}

impl Drop for Txd {
    fn drop(&mut self) {
        // SAFETY: by the type invariant the descriptor is alive and ours; not used again.
        unsafe { ffi::neuron_udma_txd_free(self.0.as_ptr()) }
    }
}

/// A registered `dma_device` (see `rust/dmaengine.rs`).
///
/// # Invariants
///
/// The pointer is a `neuron_udma_dma_register` result, registered until [`Self::unregister`].
pub(crate) struct DmaRegistration(core::ptr::NonNull<ffi::neuron_udma_dma>);

// SAFETY: the registration is an address; unregistering works from any task.
unsafe impl Send for DmaRegistration {}
// SAFETY: no method takes `&self`.
unsafe impl Sync for DmaRegistration {}

impl DmaRegistration {
    /// Registers a `DMA_MEMCPY` `dma_device` of `dev` with one channel per entry of `chans`;
    /// each is a counted reference (`Arc::into_raw`) that the `dma_device` owns from now on and
    /// gives back through `neuron_udma_dma_put_chan` when it is released.
    ///
    /// # Errors
    ///
    /// `ENOMEM`, or the error of `dma_async_device_register()`; the references stay the
    /// caller's then.
    ///
    /// # Safety
    ///
    /// Each entry of `chans` is a reference the trampolines of `rust/dmaengine.rs` accept.
    pub(crate) unsafe fn register<T>(
        dev: &kernel::device::Device<kernel::device::Bound>,
        chans: &[*const T],
    ) -> Result<Self> {
        let nr = u32::try_from(chans.len()).map_err(|_| EINVAL)?;
        let raw = super::raw_device(dev);
        // SAFETY: `raw` is the bound device `dev`; `chans` holds `nr` valid entries (per the
        // contract), passed to C as its opaque channel type.
        let p = unsafe { ffi::neuron_udma_dma_register(raw, chans.as_ptr().cast(), nr) };
        let p = kernel::error::from_err_ptr(p)?;
        // INVARIANT: registered now.
        core::ptr::NonNull::new(p).map(Self).ok_or(ENOMEM)
    }

    /// Unregisters the `dma_device`: no client finds its channels any more; the release gives
    /// the channels back once the last client let go of its channel.
    pub(crate) fn unregister(self) {
        // SAFETY: by the type invariant registered, and `self` is consumed.
        unsafe { ffi::neuron_udma_dma_unregister(self.0.as_ptr()) }
    }
}

/// Frees the `dma_device`s released so far (module unload, once no client can hold a channel:
/// each holds a module reference).
pub(crate) fn dma_free_released() {
    // SAFETY: plain call; the C side frees only released `dma_device`s.
    unsafe { ffi::neuron_udma_dma_free_released() }
}

/// KUnit builds only: a burst of `n` memcpy descriptors of `len` bytes each on a channel of the
/// bound device `dev`, submitted and issued at once by an in-kernel client
/// (`rust/kfac/dmaengine_kunit.c`); `before` runs with the channel's number once it is taken.
/// Returns the callbacks and `tx_status` results the client counted.
///
/// # Errors
///
/// `EBUSY` if no channel is free, `before`'s error, `ENOMEM`, `ETIMEDOUT` (a callback missing
/// after 120 s).
#[cfg(neuron_udma_kunit)]
pub(crate) fn kunit_burst(
    dev: &kernel::device::Device<kernel::device::Bound>,
    n: u32,
    len: u64,
    before: impl FnOnce(u32) -> Result,
) -> Result<ffi::neuron_udma_kunit_burst> {
    let mut id = 0u32;
    // SAFETY: `dev` is bound; `id` is written before the call returns.
    let chan = unsafe { ffi::neuron_udma_kunit_dma_get(super::raw_device(dev), &mut id) };
    if chan.is_null() {
        return Err(EBUSY);
    }
    let mut r = ffi::neuron_udma_kunit_burst::default();
    let ret = before(id).and_then(|()| {
        // SAFETY: `chan` is the channel taken above, `r` outlives the call.
        kernel::error::to_result(unsafe { ffi::neuron_udma_kunit_dma_burst(chan, n, len, &mut r) })
    });
    // SAFETY: the channel taken above, given back once.
    unsafe { ffi::neuron_udma_kunit_dma_put(chan) };
    ret.map(|()| r)
}
