// SPDX-License-Identifier: GPL-2.0
/*
 * PCI binding of neuron_udma: the driver binds the Neuron device, enables memory decoding and bus
 * mastering, maps BAR0 and BAR4, and clears bus mastering when it is unbound; rebinding works.
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kselftest_harness.h"
#include "udma_util.h"

#define PCI_COMMAND 0x04
#define PCI_COMMAND_MEMORY 0x2
#define PCI_COMMAND_MASTER 0x4

static int read_command(const char *bdf)
{
	char path[256];
	unsigned char cfg[2];
	int fd, n;

	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/config", bdf);
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return -1;
	n = pread(fd, cfg, sizeof(cfg), PCI_COMMAND);
	close(fd);
	if (n != (int)sizeof(cfg))
		return -1;
	return cfg[0] | cfg[1] << 8;
}

/* BAR n's size from the sysfs resource table: "start end flags" per line. */
static unsigned long long bar_size(const char *bdf, int bar)
{
	char path[256];
	unsigned long long start, end, flags;
	FILE *f;
	int i;

	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/resource", bdf);
	f = fopen(path, "r");
	if (!f)
		return 0;
	for (i = 0; i <= bar; i++) {
		if (fscanf(f, "%llx %llx %llx", &start, &end, &flags) != 3) {
			fclose(f);
			return 0;
		}
	}
	fclose(f);
	return end > start ? end - start + 1 : 0;
}

FIXTURE(bound) {
	char bdf[64];
};

FIXTURE_SETUP(bound)
{
	ASSERT_EQ(0, udma_bdf(self->bdf, sizeof(self->bdf)))
		TH_LOG("no device bound to neuron_udma");
}

FIXTURE_TEARDOWN(bound)
{
	char path[256];

	/* Leave the device bound for the tests that follow. */
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/driver", self->bdf);
	if (access(path, F_OK))
		sysfs_write(UDMA_DRV_DIR "/bind", self->bdf);
}

TEST_F(bound, identity)
{
	unsigned long dev = pci_attr_hex(self->bdf, "device");

	EXPECT_EQ(0x1d0fUL, pci_attr_hex(self->bdf, "vendor"));
	EXPECT_TRUE(dev == 0x7164 || dev == 0x7264 || dev == 0x7364)
		TH_LOG("device id %#lx", dev);
}

TEST_F(bound, enabled_and_mastering)
{
	int cmd = read_command(self->bdf);

	ASSERT_GE(cmd, 0);
	EXPECT_TRUE(cmd & PCI_COMMAND_MEMORY);
	EXPECT_TRUE(cmd & PCI_COMMAND_MASTER);
}

TEST_F(bound, bars)
{
	unsigned long dev = pci_attr_hex(self->bdf, "device");
	unsigned long long bar0 = bar_size(self->bdf, 0);

	/* hardware.rst §1.2: v2 engines end below 0x3100_0000, v3 engines reach 0xB6xx_xxxx. */
	if (dev == 0x7364) {
		EXPECT_GE(bar0, 0xB6000000ULL);
	} else {
		EXPECT_GE(bar0, 0x31000000ULL);
	}
	EXPECT_GT(bar_size(self->bdf, 4), 0ULL);
}

TEST_F(bound, unbind_clears_master_and_rebind)
{
	char path[256];

	ASSERT_EQ(0, sysfs_write(UDMA_DRV_DIR "/unbind", self->bdf));
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/driver", self->bdf);
	EXPECT_NE(0, access(path, F_OK));
	EXPECT_EQ(0, read_command(self->bdf) & PCI_COMMAND_MASTER);

	ASSERT_EQ(0, sysfs_write(UDMA_DRV_DIR "/bind", self->bdf));
	EXPECT_EQ(0, access(path, F_OK));
	EXPECT_TRUE(read_command(self->bdf) & PCI_COMMAND_MASTER);
}

TEST_HARNESS_MAIN
