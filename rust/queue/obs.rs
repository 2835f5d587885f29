// SPDX-License-Identifier: GPL-2.0

//! What a queue reports to, besides its callers: its device's activity counters and its
//! tracepoints ([`QueueObs`], set by the queue instance that wraps the queue, `channel.rs`).

use super::Queue;
use crate::{counters::QueueObs, kfac::trace::QueueTrace};

impl Queue {
    /// Sets what the queue reports to (`channel.rs`, when its instance wraps it).
    pub(crate) fn set_obs(&mut self, obs: QueueObs) {
        self.obs = Some(obs);
    }

    /// What the queue reports to, if set.
    pub(crate) fn obs_mut(&mut self) -> Option<&mut QueueObs> {
        self.obs.as_mut()
    }

    /// Its tracepoints, if set.
    pub(super) fn trace(&self) -> Option<&QueueTrace> {
        self.obs.as_ref().map(QueueObs::trace)
    }

    /// The `neuron_udma_submit` event of `pairs` pairs of `bytes` bytes just written.
    pub(crate) fn trace_submit(&self, pairs: u32, bytes: u64) {
        if let Some(t) = self.trace() {
            t.submit(pairs, bytes);
        }
    }

    /// Reports that the queue found its engine aborted: the directions' `(state, cause)`
    /// registers.
    pub(crate) fn engine_aborted(&self, m2s: (u32, u32), s2m: (u32, u32)) {
        if let Some(o) = &self.obs {
            o.engine_abort(m2s, s2m);
        }
    }
}
