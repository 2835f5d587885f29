// SPDX-License-Identifier: GPL-2.0

//! The dmaengine operations of a channel, called by the dmaengine core through
//! `rust/kfac/dmaengine.c` (driver-api/dmaengine/provider.rst): prep, submit and issue put
//! descriptors on the channel's list for the completion engine (`dmaengine.rs`); status,
//! terminate and synchronize read or stop it. All but `synchronize` and `free_chan_resources`
//! may run in atomic context: they take only the channel's state lock, never the queue's.

use super::{Desc, DmaChan, Stage, State, FAILED_RANGES};
use crate::{
    completion::Completer,
    kfac::dmaengine::{RawTxd, Txd},
};
use kernel::{
    prelude::*,
    sync::{Arc, ArcBorrow},
};

impl DmaChan {
    /// Has the completion engine look at the channel (called under the lock; never sleeps).
    pub(super) fn kick(&self, st: &mut State) {
        if !st.running {
            st.running = true;
            Completer::kick(&self.completer);
        }
    }

    /// The channel behind a pointer `rust/kfac/dmaengine.c` passes to a callback.
    ///
    /// # Safety
    ///
    /// `ptr` is one of the references `DmaProvider::register` gave the `dma_device`
    /// (`Arc::into_raw`), which it owns until it gives it back in `neuron_udma_dma_put_chan`;
    /// the borrow does not outlive the callback.
    unsafe fn from_raw<'a>(ptr: *const Self) -> ArcBorrow<'a, Self> {
        // SAFETY: per the function's contract `ptr` is an `Arc::into_raw` reference that stays
        // alive for `'a`.
        unsafe { ArcBorrow::from_raw(ptr) }
    }
}

/// `device_alloc_chan_resources`: a client takes the channel (`rust/kfac/dmaengine.c` restarts
/// its cookies).
///
/// # Safety
///
/// `chan` is a channel reference of the `dma_device` (see `DmaChan::from_raw`), called by the
/// dmaengine core through `rust/kfac/dmaengine.c` under its rules for this operation.
#[no_mangle]
unsafe extern "C" fn neuron_udma_dma_alloc_chan(chan: *const DmaChan) -> c_int {
    // SAFETY: per the function's contract.
    let this = unsafe { DmaChan::from_raw(chan) };
    let mut st = this.state.lock();
    if st.dead {
        return ENODEV.to_errno();
    }
    st.failed = [(0, 0); FAILED_RANGES];
    st.client = true;
    0
}

/// `device_free_chan_resources`: the client let go; everything left is stopped and freed.
///
/// # Safety
///
/// `chan` as for [`neuron_udma_dma_alloc_chan`].
#[no_mangle]
unsafe extern "C" fn neuron_udma_dma_free_chan(chan: *const DmaChan) {
    // SAFETY: the same channel, per this function's contract.
    unsafe { neuron_udma_dma_terminate(chan) };
    // SAFETY: as above.
    unsafe { neuron_udma_dma_sync(chan) };
    // SAFETY: per the function's contract.
    let this = unsafe { DmaChan::from_raw(chan) };
    let old = {
        let mut st = this.state.lock();
        st.client = false;
        core::mem::take(&mut st.descs)
    };
    drop(old);
}

/// `device_prep_dma_memcpy`: a descriptor of `len` bytes from `src` to `dst` (host DMA
/// addresses); `NULL` for length 0, no memory, or after unbind.
///
/// # Safety
///
/// `chan` is a channel reference of the `dma_device` (see `DmaChan::from_raw`); `txd` is the
/// client descriptor `rust/kfac/dmaengine.c` is preparing, which this function owns from now on
/// (it is freed here on a null return).
#[no_mangle]
unsafe extern "C" fn neuron_udma_dma_prep(
    chan: *const DmaChan,
    txd: *mut RawTxd,
    dst: u64,
    src: u64,
    len: u64,
) -> *mut Desc {
    // SAFETY: per the function's contract the descriptor is ours from now on (the C side frees
    // nothing on a null return: dropping the `Txd` frees it).
    let Some(txd) = (unsafe { Txd::from_raw(txd) }) else {
        return core::ptr::null_mut();
    };
    // SAFETY: per the function's contract.
    let this = unsafe { DmaChan::from_raw(chan) };
    if len == 0 || this.state.lock().dead {
        return core::ptr::null_mut();
    }
    let desc = Desc {
        txd,
        src,
        dst,
        len,
        fill: None,
        pattern: None,
        cookie: 0,
        stage: Stage::Submitted,
        written: 0,
        fence: None,
    };
    match KBox::new(desc, GFP_NOWAIT) {
        Ok(d) => KBox::into_raw(d),
        Err(_) => core::ptr::null_mut(),
    }
}

/// `device_prep_dma_memset`: a descriptor that fills `len` bytes at `dst` (a host DMA address)
/// with `value`; `NULL` for length 0, no memory, or after unbind.
///
/// # Safety
///
/// As [`neuron_udma_dma_prep`].
#[no_mangle]
unsafe extern "C" fn neuron_udma_dma_prep_memset(
    chan: *const DmaChan,
    txd: *mut RawTxd,
    dst: u64,
    value: u8,
    len: u64,
) -> *mut Desc {
    // SAFETY: per this function's contract, which is `neuron_udma_dma_prep`'s.
    let d = unsafe { neuron_udma_dma_prep(chan, txd, dst, 0, len) };
    if !d.is_null() {
        // SAFETY: `d` was just made by `neuron_udma_dma_prep` and is not shared yet.
        unsafe { (*d).fill = Some(value) };
    }
    d
}

/// `tx_submit`: queues `desc` (from [`neuron_udma_dma_prep`]) and returns its cookie
/// (`dma_cookie_assign()`), or a negative errno (`ENODEV` after unbind, `ENOMEM`) after freeing
/// it.
///
/// # Safety
///
/// `chan` is a channel reference of the `dma_device` (see `DmaChan::from_raw`); `desc` is the
/// `KBox::into_raw` of [`neuron_udma_dma_prep`] for that channel, submitted once (a client
/// submits a descriptor once, dmaengine's rule).
#[no_mangle]
unsafe extern "C" fn neuron_udma_dma_submit(chan: *const DmaChan, desc: *mut Desc) -> i32 {
    // SAFETY: per the function's contract `desc` is an unsubmitted `KBox::into_raw`.
    let mut d = unsafe { KBox::from_raw(desc) };
    // SAFETY: per the function's contract.
    let this = unsafe { DmaChan::from_raw(chan) };
    let mut st = this.state.lock();
    if st.dead {
        return ENODEV.to_errno();
    }
    if st.descs.reserve(1, GFP_NOWAIT).is_err() {
        return ENOMEM.to_errno();
    }
    // Under the state lock: the channel's cookies are assigned and completed in order.
    let cookie = d.txd.assign_cookie();
    d.cookie = cookie;
    // Cannot fail: capacity was reserved.
    let _ = st.descs.push_within_capacity(KBox::into_inner(d));
    cookie
}

/// `device_issue_pending`: the submitted descriptors go to the ring (from the completion work).
///
/// # Safety
///
/// `chan` as for [`neuron_udma_dma_alloc_chan`].
#[no_mangle]
unsafe extern "C" fn neuron_udma_dma_issue(chan: *const DmaChan) {
    // SAFETY: per the function's contract.
    let this = unsafe { DmaChan::from_raw(chan) };
    let mut st = this.state.lock();
    if st.dead {
        return;
    }
    let mut any = false;
    for d in st.descs.iter_mut().filter(|d| d.stage == Stage::Submitted) {
        d.stage = Stage::Issued;
        any = true;
    }
    if any {
        this.kick(&mut st);
    }
}

/// `device_tx_status` of a cookie the core reports complete: whether its transfer was aborted
/// (`DMA_ERROR`; the last [`FAILED_RANGES`] failed ranges are remembered).
///
/// # Safety
///
/// `chan` as for [`neuron_udma_dma_alloc_chan`].
#[no_mangle]
unsafe extern "C" fn neuron_udma_dma_failed(chan: *const DmaChan, cookie: i32) -> bool {
    // SAFETY: per the function's contract.
    unsafe { DmaChan::from_raw(chan) }
        .state
        .lock()
        .is_failed(cookie)
}

/// `device_tx_status` of a cookie in progress: its residue, the whole length of its descriptor
/// (descriptor granularity; 0 for an unknown cookie).
///
/// # Safety
///
/// `chan` as for [`neuron_udma_dma_alloc_chan`].
#[no_mangle]
unsafe extern "C" fn neuron_udma_dma_residue(chan: *const DmaChan, cookie: i32) -> u32 {
    // SAFETY: per the function's contract.
    let this = unsafe { DmaChan::from_raw(chan) };
    let st = this.state.lock();
    let left = st
        .descs
        .iter()
        .find(|d| d.cookie == cookie)
        .map_or(0, |d| d.len.min(u64::from(u32::MAX)));
    // CAST: clamped to u32 above.
    left as u32
}

/// `device_terminate_all`: drops every descriptor that did not complete, without callbacks
/// (their cookies complete and read `DMA_ERROR` from now on); those on the ring are dropped once
/// the completion work stopped the queue (`device_synchronize` waits for it).
///
/// # Safety
///
/// `chan` as for [`neuron_udma_dma_alloc_chan`].
#[no_mangle]
unsafe extern "C" fn neuron_udma_dma_terminate(chan: *const DmaChan) {
    // SAFETY: per the function's contract.
    let this = unsafe { DmaChan::from_raw(chan) };
    let mut st = this.state.lock();
    let mut on_ring = false;
    let mut range: Option<(i32, i32)> = None;
    for d in st.descs.iter_mut() {
        match d.stage {
            Stage::Active | Stage::Failed => {
                d.stage = Stage::Terminated;
                on_ring = true;
            }
            Stage::Submitted | Stage::Issued => {}
            _ => continue,
        }
        d.txd.cookie_complete();
        range = Some((range.map_or(d.cookie, |r| r.0), d.cookie));
    }
    st.descs
        .retain(|d| !matches!(d.stage, Stage::Submitted | Stage::Issued));
    if let Some((first, last)) = range {
        st.record_failed(first, last);
    }
    if on_ring && !st.dead {
        st.terminate = true;
        this.kick(&mut st);
    }
}

/// `device_synchronize`: waits until the completion engine is done with the channel
/// (terminated transfers stopped, no callback running).
///
/// # Safety
///
/// `chan` as for [`neuron_udma_dma_alloc_chan`].
#[no_mangle]
unsafe extern "C" fn neuron_udma_dma_sync(chan: *const DmaChan) {
    // SAFETY: per the function's contract.
    unsafe { DmaChan::from_raw(chan) }.wait_idle();
}

/// The `dma_device` was released: gives back its reference of the channel.
///
/// # Safety
///
/// `chan` is a channel reference `DmaProvider::register` gave the `dma_device`, given back once
/// (its release), not used by C afterwards.
#[no_mangle]
pub(super) unsafe extern "C" fn neuron_udma_dma_put_chan(chan: *const DmaChan) {
    // SAFETY: per the function's contract, the `Arc::into_raw` reference given back once.
    drop(unsafe { Arc::<DmaChan>::from_raw(chan) });
}
