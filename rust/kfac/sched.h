/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The current task's fatal signals and voluntary rescheduling, which Linux 7.3's Rust does not
 * wrap (fatal_signal_pending() is a static inline, cond_resched() a macro). Implemented in rust/kfac/sched.c; bindgen generates the Rust declarations
 * (Kbuild), wrapped by rust/kfac/sched.rs.
 */
#ifndef NEURON_UDMA_KFAC_SCHED_H
#define NEURON_UDMA_KFAC_SCHED_H

#include <linux/types.h>

struct workqueue_struct;

/* No fatal_signal_pending() in Rust. */
bool neuron_udma_fatal_signal_pending(void);
/* No cond_resched() in Rust. */
void neuron_udma_cond_resched(void);
/* Whether another task wants this CPU (for polling loops; see sched.c). */
bool neuron_udma_cpu_wanted(void);

/*
 * The driver's release workqueue (alloc_workqueue() and flush_workqueue() are macros): created at
 * module load, destroyed (after draining it) at unload; see sched.c.
 */
int neuron_udma_release_wq_init(void);
void neuron_udma_release_wq_exit(void);
struct workqueue_struct *neuron_udma_release_wq(void);
void neuron_udma_release_wq_flush(void);

#endif /* NEURON_UDMA_KFAC_SCHED_H */
