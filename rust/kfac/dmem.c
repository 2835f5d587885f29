// SPDX-License-Identifier: GPL-2.0
/*
 * The device-memory cgroup controller (rust/kfac/dmem.h): <linux/cgroup_dmem.h> behind opaque
 * pointers. Without CONFIG_CGROUP_DMEM the header's stubs register no region (NULL) and charge
 * nothing (a NULL pool).
 */
#include <linux/cgroup_dmem.h>
#include <linux/err.h>

#include "dmem.h"

int neuron_udma_dmem_register(u64 size, const char *name, void **region)
{
	struct dmem_cgroup_init init = { .size = size };
	struct dmem_cgroup_region *r;

	r = dmem_cgroup_register_region(&init, "%s", name);
	if (IS_ERR(r))
		return PTR_ERR(r);
	*region = r;
	return 0;
}

void neuron_udma_dmem_unregister(void *region)
{
	dmem_cgroup_unregister_region(region);
}

int neuron_udma_dmem_try_charge(void *region, u64 size, void **pool)
{
	struct dmem_cgroup_pool_state *p = NULL;
	int ret;

	/* No limiting pool asked for: the driver does not evict, so it needs no reference. */
	ret = dmem_cgroup_try_charge(region, size, &p, NULL);
	if (ret == -EAGAIN)
		return -EDQUOT;
	if (ret)
		return ret;
	*pool = p;
	return 0;
}

void neuron_udma_dmem_uncharge(void *pool, u64 size)
{
	dmem_cgroup_uncharge(pool, size);
}
