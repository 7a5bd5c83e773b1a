// SPDX-License-Identifier: GPL-2.0
/*
 * The device half of the kernel-tier test pair: a misc character device
 * (/dev/kmodkit_test) owned by this module, so an open file pins the module
 * the way a workload pins a real accelerator driver. It links against
 * kmodkit_test_dep and reads a firmware file at init, so it loads only after
 * its dependency and only once the firmware is in place.
 */
#include <linux/firmware.h>
#include <linux/fs.h>
#include <linux/miscdevice.h>
#include <linux/module.h>

int kmodkit_test_dep_answer(void);

static char *firmware = "kmodkit-test/fw.bin";
module_param(firmware, charp, 0444);
MODULE_PARM_DESC(firmware, "firmware file requested at init");

static unsigned int firmware_size;
module_param(firmware_size, uint, 0444);
MODULE_PARM_DESC(firmware_size, "size of the firmware read at init");

static const struct file_operations kmodkit_test_fops = {
	.owner = THIS_MODULE,
};

static struct miscdevice kmodkit_test_device = {
	.minor = MISC_DYNAMIC_MINOR,
	.name = "kmodkit_test",
	.fops = &kmodkit_test_fops,
	.mode = 0666,
};

static int __init kmodkit_test_init(void)
{
	const struct firmware *fw;
	int err;

	if (kmodkit_test_dep_answer() != 42)
		return -EINVAL;
	err = misc_register(&kmodkit_test_device);
	if (err)
		return err;
	/* _direct: no user-mode helper fallback, so a missing file fails at once. */
	err = request_firmware_direct(&fw, firmware, kmodkit_test_device.this_device);
	if (err) {
		misc_deregister(&kmodkit_test_device);
		return err;
	}
	firmware_size = fw->size;
	release_firmware(fw);
	return 0;
}

static void __exit kmodkit_test_exit(void)
{
	misc_deregister(&kmodkit_test_device);
}

module_init(kmodkit_test_init);
module_exit(kmodkit_test_exit);

MODULE_LICENSE("GPL");
MODULE_VERSION("1.2.3");
MODULE_DESCRIPTION("kmodkit kernel-tier test: character device");
