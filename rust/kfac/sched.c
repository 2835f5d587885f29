// SPDX-License-Identifier: GPL-2.0
/*
 * The current task's fatal signals and voluntary rescheduling (rust/kfac/sched.h): a static
 * inline and a macro that Linux 7.3's Rust does not wrap.
 */
#include <linux/sched.h>
#include <linux/sched/signal.h>

#include "sched.h"

/*
 * No fatal_signal_pending() in Rust: whether the current task was killed, for waits that must
 * not be interrupted by other signals but must end on SIGKILL.
 */
bool neuron_udma_fatal_signal_pending(void)
{
	return fatal_signal_pending(current);
}

/* No cond_resched() in Rust: a point where a long loop lets other tasks run. */
void neuron_udma_cond_resched(void)
{
	cond_resched();
}
