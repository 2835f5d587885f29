// SPDX-License-Identifier: GPL-2.0
/*
 * eventfd for Rust (rust/kfac/eventfd.h): Linux 7.3's Rust has no eventfd abstraction.
 */
#include <linux/err.h>
#include <linux/eventfd.h>

#include "eventfd.h"

/* No eventfd in Rust: the eventfd of @fd (a counted reference), or an error pointer. */
struct eventfd_ctx *neuron_udma_eventfd_get(int fd)
{
	return eventfd_ctx_fdget(fd);
}

/* Adds 1 to @ctx's counter, waking its readers. */
void neuron_udma_eventfd_signal(struct eventfd_ctx *ctx)
{
	eventfd_signal(ctx);
}

/* Gives back a reference of neuron_udma_eventfd_get(). */
void neuron_udma_eventfd_put(struct eventfd_ctx *ctx)
{
	eventfd_ctx_put(ctx);
}
