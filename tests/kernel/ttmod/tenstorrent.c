// SPDX-License-Identifier: GPL-2.0
/*
 * A stand-in for Tenstorrent's tt-kmd in the tests: a module named tenstorrent
 * with a character device at /dev/tenstorrent/0 (devtmpfs makes the node) owned
 * by this module, so an open file pins it as a workload pins the real driver.
 * It drives no hardware.
 */
#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/module.h>

static const struct file_operations tenstorrent_fops = {
	.owner = THIS_MODULE,
};

static struct miscdevice tenstorrent_device = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "tenstorrent0",
	.nodename = "tenstorrent/0",
	.fops = &tenstorrent_fops,
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
MODULE_DESCRIPTION("kmodkit test stand-in for tt-kmd: a /dev/tenstorrent/0 device");
