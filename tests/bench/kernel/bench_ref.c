// SPDX-License-Identifier: GPL-2.0
/*
 * Bench-only (built when NEURON_UDMA_BENCH=y, never in the driver): the reference driver's
 * descriptor-pair sequence re-expressed in C from the hardware description
 * (Documentation/hardware.rst, sections 4.1-4.7), so that tests/bench/kernel/bench.rs can time the driver's
 * prepare_one against it, side by side, on the same ring memory.
 *
 * Per pair, as the reference does it: check both rings for a free slot (keeping the 16-slot
 * reserve), take the Rx slot then the Tx slot, read each ring's id (flipping it when the slot
 * index wrapped to 0), build each descriptor in a zeroed stack union and copy the 16 bytes into
 * its slot. The pair builder is a separate, non-inlined function, as it is a separate function
 * called once per pair by the reference's copy loop; a second loop inlines it, to compare with
 * the driver's builder inlined in the same way.
 */
#include <linux/bits.h>
#include <linux/compiler.h>
#include <linux/errno.h>
#include <linux/string.h>
#include <linux/types.h>
#include <asm/byteorder.h>

/*
 * The timed functions live in a section of their own that starts a 4 KiB page (the .balign
 * raises the section's alignment wherever the assembler puts it): under TCG a jump or call to
 * another guest page is not chained and costs a lookup, so a fill loop or its builder straddling
 * a page would be timed slower for where the linker happened to put it. bench.rs does the same
 * for the driver's side.
 */
#define NU_REF_TEXT __section(".text.nu_bench_ref")
asm(".pushsection .text.nu_bench_ref,\"ax\",@progbits\n\t.balign 4096\n\t.popsection");

#define NU_REF_DESC_SIZE	16
#define NU_REF_RESERVE		16	/* slots kept free per ring (section 4.7) */
#define NU_REF_MAX_LEN		65536	/* encoded as 0 in the 16-bit length field */
#define NU_REF_LEN_MASK		GENMASK(15, 0)
#define NU_REF_RING_ID_SHIFT	24
#define NU_REF_RING_ID_MASK	0x3U
#define NU_REF_FIRST		BIT(26)
#define NU_REF_LAST		BIT(27)
#define NU_REF_INT_EN		BIT(28)
#define NU_REF_DMB		BIT(30)
#define NU_REF_META_COPY	0x01080003U	/* meta_ctrl of every Tx descriptor (4.3) */
#define NU_REF_META_WB		BIT(26)		/* write barrier, in meta_ctrl */

/* Barrier modes of a pair (section 4.4). */
enum nu_ref_barrier {
	NU_REF_BARRIER_NONE = 0,
	NU_REF_BARRIER_DMB = 1,
	NU_REF_BARRIER_WRITE = 2,
};

/*
 * Software state of one ring; tests/bench/kernel/bench.rs has the same layout (#[repr(C)] RefRing).
 * @slots: the ring memory, @size descriptors of 16 bytes
 * @size: descriptors in the ring, a power of two
 * @next: next slot to hand out
 * @ack: first slot not yet completed
 * @ring_id: id (phase) stamped into the next slot, 2 bits
 */
struct nu_ref_ring {
	void *slots;
	u32 size;
	u32 next;
	u32 ack;
	u32 ring_id;
};

/* One 16-byte descriptor, in its Tx and Rx views (section 4.1). */
union nu_ref_desc {
	struct {
		__le32 len_ctrl;
		__le32 meta_ctrl;
		__le64 buf_ptr;
	} tx;
	struct {
		__le32 len_ctrl;
		__le32 buf2_ptr_lo;
		__le64 buf1_ptr;
	} rx;
};

int neuron_udma_bench_ref_fill(struct nu_ref_ring *tx, struct nu_ref_ring *rx, u32 pairs,
			       u64 src, u64 dst, u32 len, bool inlined);

static inline u32 nu_ref_available(const struct nu_ref_ring *r)
{
	return (r->ack - (r->next + NU_REF_RESERVE)) & (r->size - 1);
}

/* Hands out the next slot of @r and advances. */
static inline void *nu_ref_slot_get(struct nu_ref_ring *r)
{
	void *slot = r->slots + (size_t)r->next * NU_REF_DESC_SIZE;

	r->next = (r->next + 1) & (r->size - 1);
	return slot;
}

/* The id of the slot just handed out; flips the ring's id when that slot was the last one. */
static inline u32 nu_ref_ring_id_get(struct nu_ref_ring *r)
{
	u32 id = r->ring_id;

	if (!r->next)
		r->ring_id = (r->ring_id + 1) & NU_REF_RING_ID_MASK;
	return id;
}

static __always_inline int nu_ref_prep(struct nu_ref_ring *tx, struct nu_ref_ring *rx,
				       u64 src, u64 dst, u32 len,
				       enum nu_ref_barrier barrier, bool int_en)
{
	union nu_ref_desc d;
	void *tx_slot, *rx_slot;
	u32 tx_id, rx_id, flags = 0, meta = NU_REF_META_COPY;

	if (!len || len > NU_REF_MAX_LEN)
		return -EINVAL;
	switch (barrier) {
	case NU_REF_BARRIER_NONE:
		break;
	case NU_REF_BARRIER_DMB:
		flags |= NU_REF_DMB;
		break;
	case NU_REF_BARRIER_WRITE:
		meta |= NU_REF_META_WB;
		break;
	default:
		return -EINVAL;
	}
	if (nu_ref_available(tx) < 1 || nu_ref_available(rx) < 1)
		return -ENOMEM;

	rx_slot = nu_ref_slot_get(rx);
	tx_slot = nu_ref_slot_get(tx);
	rx_id = nu_ref_ring_id_get(rx);
	tx_id = nu_ref_ring_id_get(tx);
	len &= NU_REF_LEN_MASK;

	memset(&d, 0, sizeof(d));
	d.rx.len_ctrl = cpu_to_le32((int_en ? NU_REF_INT_EN : 0) |
				    rx_id << NU_REF_RING_ID_SHIFT | len);
	d.rx.buf1_ptr = cpu_to_le64(dst);
	memcpy(rx_slot, &d, sizeof(d));

	memset(&d, 0, sizeof(d));
	d.tx.len_ctrl = cpu_to_le32(NU_REF_FIRST | NU_REF_LAST | flags |
				    tx_id << NU_REF_RING_ID_SHIFT | len);
	d.tx.meta_ctrl = cpu_to_le32(meta);
	d.tx.buf_ptr = cpu_to_le64(src);
	memcpy(tx_slot, &d, sizeof(d));
	return 0;
}

/* The pair builder as the reference calls it: a separate function, once per pair. */
static noinline NU_REF_TEXT int nu_ref_prepare_one(struct nu_ref_ring *tx,
						   struct nu_ref_ring *rx, u64 src, u64 dst,
						   u32 len, enum nu_ref_barrier barrier,
						   bool int_en)
{
	return nu_ref_prep(tx, rx, src, dst, len, barrier, int_en);
}

/*
 * Prepares @pairs copies of @len bytes, pair i from @src + i * @len to @dst + i * @len, no
 * barrier, no interrupt: the loop tests/bench/kernel/bench.rs times against the driver's prepare_one.
 * @inlined: the pair builder inlined in the loop instead of called once per pair.
 * Returns 0, or the first pair's error (-ENOMEM when a ring is full, -EINVAL for a bad length).
 */
NU_REF_TEXT int neuron_udma_bench_ref_fill(struct nu_ref_ring *tx, struct nu_ref_ring *rx,
					   u32 pairs, u64 src, u64 dst, u32 len, bool inlined)
{
	u64 off = 0;
	u32 i;
	int ret;

	for (i = 0; i < pairs; i++, off += len) {
		if (inlined)
			ret = nu_ref_prep(tx, rx, src + off, dst + off, len, NU_REF_BARRIER_NONE,
					  false);
		else
			ret = nu_ref_prepare_one(tx, rx, src + off, dst + off, len,
						 NU_REF_BARRIER_NONE, false);
		if (ret)
			return ret;
	}
	return 0;
}
