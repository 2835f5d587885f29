/* SPDX-License-Identifier: GPL-2.0 */
/*
 * eventfd, which Linux 7.3's Rust does not wrap: a counted reference to the eventfd of a file
 * descriptor, and its signal. Implemented in rust/kfac/eventfd.c; bindgen generates the Rust
 * declarations (Kbuild), wrapped by rust/kfac/eventfd.rs.
 */
#ifndef NEURON_UDMA_KFAC_EVENTFD_H
#define NEURON_UDMA_KFAC_EVENTFD_H

struct eventfd_ctx;

struct eventfd_ctx *neuron_udma_eventfd_get(int fd);
void neuron_udma_eventfd_signal(struct eventfd_ctx *ctx);
void neuron_udma_eventfd_put(struct eventfd_ctx *ctx);

#endif /* NEURON_UDMA_KFAC_EVENTFD_H */
