/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The current task's fatal signals and the waiting for a work item, which Linux 7.3's Rust does
 * not wrap (fatal_signal_pending(), flush_work()). Implemented in rust/kfac/sched.c; bindgen
 * generates the Rust declarations (Kbuild), wrapped by rust/kfac/sched.rs.
 */
#ifndef NEURON_UDMA_KFAC_SCHED_H
#define NEURON_UDMA_KFAC_SCHED_H

#include <linux/types.h>

struct work_struct;

/* No fatal_signal_pending() in Rust. */
bool neuron_udma_fatal_signal_pending(void);
/* No flush_work() in Rust. */
void neuron_udma_flush_work(struct work_struct *work);

#endif /* NEURON_UDMA_KFAC_SCHED_H */
