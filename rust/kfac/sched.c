// SPDX-License-Identifier: GPL-2.0
/*
 * The current task's fatal signals and voluntary rescheduling (rust/kfac/sched.h): a static
 * inline and a macro that Linux 7.3's Rust does not wrap.
 */
#include <linux/sched.h>
#include <linux/sched/signal.h>
#include <linux/sched/stat.h>
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

/* No cond_resched() in Rust: a point where a long loop lets other tasks run. */
void neuron_udma_cond_resched(void)
{
	cond_resched();
}

/*
 * Whether another task wants this CPU: one is runnable here besides the current task, or the
 * scheduler asked the current task to give the CPU up. Under PREEMPT_LAZY (the default on x86)
 * a waking task of the fair class only sets the lazy flag, acted upon at the next tick or
 * return to user space, which a polling loop in the kernel does not reach: it would keep a
 * task it just woke waiting for the rest of its spin. A polling loop spins only while this is
 * false, as KVM's halt polling (single_task_running()) and the block layer's polling
 * (need_resched()) do.
 */
bool neuron_udma_cpu_wanted(void)
{
	return !single_task_running() || need_resched() ||
	       tif_test_bit(TIF_NEED_RESCHED_LAZY);
}

/*
 * The driver's own workqueue for what must be released in process context but may be let go of
 * where sleeping is not allowed (rust/buffer.rs: an io_uring command's registered buffer range,
 * whose last hold may drop under a queue's register access). A workqueue of the module's, not a
 * system one: destroying it at unload waits for every release queued, so no work of this
 * module's runs after its code is gone.
 */
static struct workqueue_struct *neuron_udma_release;

int neuron_udma_release_wq_init(void)
{
	neuron_udma_release = alloc_workqueue("neuron_udma_release", WQ_UNBOUND, 0);
	return neuron_udma_release ? 0 : -ENOMEM;
}

void neuron_udma_release_wq_exit(void)
{
	destroy_workqueue(neuron_udma_release);
}

struct workqueue_struct *neuron_udma_release_wq(void)
{
	return neuron_udma_release;
}

/* Waits until every release queued so far has run. */
void neuron_udma_release_wq_flush(void)
{
	flush_workqueue(neuron_udma_release);
}
