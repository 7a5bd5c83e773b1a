"""``kmodkit-sign``: sign the kernel modules of a pushed image, without a builder.

It pulls the unsigned image, signs copies of the listed ``.ko`` files with the
kernel's ``sign-file`` and pushes the unsigned image's layers (reused, never
re-uploaded when the registry has them) plus one layer holding only the signed
files. It needs no container builder, no privileges and no root; the private
key is read by ``sign-file`` alone.
"""
