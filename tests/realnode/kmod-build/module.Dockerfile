# What a user's Dockerfile ConfigMap holds for the in-cluster build: the test module pair
# compiled against the node kernel's headers (KERNEL_FULL_VERSION, which the build
# passes), depmod run, its firmware beside it, on a small run image.
ARG BUILD_BASE
ARG RUN_BASE
FROM ${BUILD_BASE} AS build
ARG KERNEL_FULL_VERSION
RUN cp -R /usr/src/kmodkit-test /tmp/src \
    && make -s -C "/usr/src/linux-headers-${KERNEL_FULL_VERSION}" M=/tmp/src modules \
    && mkdir -p "/opt/lib/modules/${KERNEL_FULL_VERSION}/extra" /firmware/kmodkit-test \
    && cp /tmp/src/*.ko "/opt/lib/modules/${KERNEL_FULL_VERSION}/extra/" \
    && depmod -b /opt "${KERNEL_FULL_VERSION}" \
    && printf 'kmodkit test firmware\n' >/firmware/kmodkit-test/fw.bin

FROM ${RUN_BASE}
COPY --from=build /opt /opt
COPY --from=build /firmware /firmware
