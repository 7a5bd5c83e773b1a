// SPDX-License-Identifier: GPL-2.0
/*
 * A stand-in for Tenstorrent's tt-kmd in the tests: a module named tenstorrent
 * with a character device at /dev/tenstorrent/0 (devtmpfs makes the node) owned
 * by this module, so an open file pins it as a workload pins the real driver.
 * It drives no hardware. Its one attribute, tt_fw_bundle_ver under
 * /sys/class/misc/tenstorrent0/, is the firmware bundle version the "chip" runs:
 * the tools' stand-ins (tt-smi reads it, tt-flash writes it) flash this device.
 */
#include <linux/device.h>
#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/string.h>

/* What a chip that was never flashed by the tests reports. */
#define FACTORY_FW_BUNDLE_VERSION "80.10.0.0"

static char fw_bundle_ver[32] = FACTORY_FW_BUNDLE_VERSION;
static DEFINE_MUTEX(fw_lock);

static ssize_t tt_fw_bundle_ver_show(struct device *dev,
				     struct device_attribute *attr, char *buf)
{
	ssize_t n;

	mutex_lock(&fw_lock);
	n = sysfs_emit(buf, "%s\n", fw_bundle_ver);
	mutex_unlock(&fw_lock);
	return n;
}

/* A write is a flash: the version written (one line, digits and dots) is what the chip runs. */
static ssize_t tt_fw_bundle_ver_store(struct device *dev,
				      struct device_attribute *attr,
				      const char *buf, size_t count)
{
	size_t len = count;
	size_t i;

	if (len && buf[len - 1] == '\n')
		len--;
	if (!len || len >= sizeof(fw_bundle_ver))
		return -EINVAL;
	for (i = 0; i < len; i++)
		if (buf[i] != '.' && (buf[i] < '0' || buf[i] > '9'))
			return -EINVAL;
	mutex_lock(&fw_lock);
	memcpy(fw_bundle_ver, buf, len);
	fw_bundle_ver[len] = '\0';
	mutex_unlock(&fw_lock);
	return count;
}

static DEVICE_ATTR_RW(tt_fw_bundle_ver);

static struct attribute *tenstorrent_attrs[] = {
	&dev_attr_tt_fw_bundle_ver.attr,
	NULL,
};
ATTRIBUTE_GROUPS(tenstorrent);

static const struct file_operations tenstorrent_fops = {
	.owner = THIS_MODULE,
};

static struct miscdevice tenstorrent_device = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "tenstorrent0",
	.nodename = "tenstorrent/0",
	.fops = &tenstorrent_fops,
	.groups = tenstorrent_groups,
	.mode = 0666,
};

static int __init tenstorrent_init(void)
{
	return misc_register(&tenstorrent_device);
}

static void __exit tenstorrent_exit(void)
{
	misc_deregister(&tenstorrent_device);
}

module_init(tenstorrent_init);
module_exit(tenstorrent_exit);

MODULE_LICENSE("GPL");
MODULE_VERSION("2.0.0");
MODULE_DESCRIPTION("kmodkit test stand-in for tt-kmd: a /dev/tenstorrent/0 device with a firmware version");
