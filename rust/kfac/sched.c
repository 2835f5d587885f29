// SPDX-License-Identifier: GPL-2.0
/*
 * The current task's fatal signals and the waiting for a work item (rust/kfac/sched.h): static
 * inlines and functions that Linux 7.3's Rust does not wrap.
 */
#include <linux/sched/signal.h>
#include <linux/workqueue.h>

#include "sched.h"

/*
 * No fatal_signal_pending() in Rust: whether the current task was killed, for waits that must
 * not be interrupted by other signals but must end on SIGKILL.
 */
bool neuron_udma_fatal_signal_pending(void)
{
	return fatal_signal_pending(current);
}

/* No flush_work() in Rust: wait until @work is neither queued nor running. */
void neuron_udma_flush_work(struct work_struct *work)
{
	flush_work(work);
}
