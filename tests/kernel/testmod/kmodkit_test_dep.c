// SPDX-License-Identifier: GPL-2.0
/*
 * The provider half of the kernel-tier test pair. Its only job is to be a
 * module another module links against, so that loading out of order fails
 * and its refcount reflects the user.
 */
#include <linux/module.h>

int kmodkit_test_dep_answer(void)
{
	return 42;
}
EXPORT_SYMBOL_GPL(kmodkit_test_dep_answer);

MODULE_LICENSE("GPL");
MODULE_VERSION("1.0.0");
MODULE_DESCRIPTION("kmodkit kernel-tier test: symbol provider");
