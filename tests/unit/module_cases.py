"""Invalid Module bodies, with the field each must be rejected at.

Shared by the offline validator's unit tests and by the integration test that
sends the same bodies to a real apiserver, so both layers are held to the
same cases.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.unit.examples import minimal

C = "spec.moduleLoader.container"


@dataclass(frozen=True)
class Case:
    id: str
    build: Callable[[str], dict[str, Any]]
    """The body, given the namespace it is created in."""
    path: str
    """Field path the offline validator names."""
    admission_path: str | None = None
    """Field path the apiserver names, if it differs; None when the same."""
    admission: bool = True
    """Whether the apiserver can reject it (False: only CEL-inexpressible checks catch it)."""

    @property
    def expected_admission_path(self) -> str:
        return self.admission_path or self.path


def _body(namespace: str, **container: Any) -> dict[str, Any]:
    body = minimal(**container)
    body["metadata"]["namespace"] = namespace
    return body


def _container(change: Callable[[dict[str, Any]], None]) -> Callable[[str], dict[str, Any]]:
    def build(namespace: str) -> dict[str, Any]:
        body = _body(namespace)
        change(body["spec"]["moduleLoader"]["container"])
        return body

    return build


def _spec(change: Callable[[dict[str, Any]], None]) -> Callable[[str], dict[str, Any]]:
    def build(namespace: str) -> dict[str, Any]:
        body = _body(namespace)
        change(body["spec"])
        return body

    return build


def _mapping(**fields: Any) -> Callable[[str], dict[str, Any]]:
    def change(container: dict[str, Any]) -> None:
        mapping = container["kernelMappings"][0]
        mapping.update(fields)
        for key, value in fields.items():
            if value is None:
                del mapping[key]

    return _container(change)


def _modprobe(**fields: Any) -> Callable[[str], dict[str, Any]]:
    def change(container: dict[str, Any]) -> None:
        modprobe = container["modprobe"]
        modprobe.update(fields)
        for key, value in fields.items():
            if value is None:
                del modprobe[key]

    return _container(change)


def _toleration(**toleration: Any) -> Callable[[str], dict[str, Any]]:
    return _spec(lambda spec: spec.update(tolerations=[toleration]))


def _named(name: Callable[[str], str]) -> Callable[[str], dict[str, Any]]:
    def build(namespace: str) -> dict[str, Any]:
        body = _body(namespace)
        body["metadata"]["name"] = name(namespace)
        return body

    return build


RAW = {"load": ["-v", "mod"], "unload": ["-rv", "mod"]}


def sign(**fields: Any) -> dict[str, Any]:
    """A valid sign section (from an unsigned image); ``fields`` override or (None) remove."""
    section: dict[str, Any] = {
        "unsignedImage": "quay.io/org/mod-unsigned:${KERNEL_FULL_VERSION}",
        "keySecret": {"name": "signing-key"},
        "certSecret": {"name": "signing-cert"},
        "filesToSign": ["/opt/lib/modules/${KERNEL_FULL_VERSION}/extra/mod.ko"],
    }
    section.update(fields)
    return {k: v for k, v in section.items() if v is not None}


CASES = [
    Case("regexp-and-literal", _mapping(literal="6.8.0"), f"{C}.kernelMappings[0].literal"),
    Case("neither-regexp-nor-literal", _mapping(regexp=None), f"{C}.kernelMappings[0]"),
    Case(
        "container-image-port-no-tag",
        _container(lambda c: c.update(containerImage="registry:5000/mod")),
        f"{C}.containerImage",
    ),
    Case(
        "mapping-image-no-tag",
        _mapping(containerImage="quay.io/org/mod"),
        f"{C}.kernelMappings[0].containerImage",
    ),
    Case(
        "no-image-anywhere",
        _mapping(containerImage=""),
        f"{C}.kernelMappings[0].containerImage",
        admission_path=f"{C}.kernelMappings",
    ),
    Case(
        "no-image-anywhere-key-unset",
        _mapping(containerImage=None),
        f"{C}.kernelMappings[0].containerImage",
        admission_path=f"{C}.kernelMappings",
    ),
    Case(
        "dir-name-not-a-plain-path",
        _modprobe(dirName="/opt a; echo hi"),
        f"{C}.modprobe.dirName",
    ),
    Case(
        "firmware-path-relative",
        _modprobe(firmwarePath="firmware"),
        f"{C}.modprobe.firmwarePath",
    ),
    Case(
        "in-tree-single-and-list",
        _mapping(inTreeModuleToRemove="xe", inTreeModulesToRemove=["i915"]),
        f"{C}.kernelMappings[0].inTreeModuleToRemove",
    ),
    Case(
        "unload-args-force",
        _modprobe(args={"load": ["-v"], "unload": ["-rf"]}),
        f"{C}.modprobe.args.unload",
    ),
    Case(
        "device-plugin-host-path-outside",
        _spec(
            lambda spec: spec.update(
                devicePlugin={
                    "container": {"image": "r.io/dp:1"},
                    "volumes": [{"name": "etc", "hostPath": {"path": "/etc"}}],
                }
            )
        ),
        "spec.devicePlugin.volumes[0].hostPath.path",
    ),
    Case("nothing-to-run", _spec(lambda spec: spec.pop("moduleLoader")), "spec"),
    Case(
        "no-kernel-mappings",
        _container(lambda c: c.update(kernelMappings=[])),
        f"{C}.kernelMappings",
    ),
    Case(
        "loading-order-too-short",
        _modprobe(modulesLoadingOrder=["mod"]),
        f"{C}.modprobe.modulesLoadingOrder",
    ),
    Case(
        "loading-order-wrong-first",
        _modprobe(modulesLoadingOrder=["dep", "mod"]),
        f"{C}.modprobe.modulesLoadingOrder",
    ),
    Case(
        "loading-order-duplicates",
        _modprobe(modulesLoadingOrder=["mod", "dep", "dep"]),
        f"{C}.modprobe.modulesLoadingOrder",
    ),
    Case("raw-args-with-module-name", _modprobe(rawArgs=RAW), f"{C}.modprobe.rawArgs"),
    Case(
        "neither-module-name-nor-raw-args",
        _modprobe(moduleName=None),
        f"{C}.modprobe.moduleName",
    ),
    Case(
        "args-load-empty",
        _modprobe(args={"load": [], "unload": ["-r"]}),
        f"{C}.modprobe.args.load",
    ),
    Case(
        "toleration-bad-operator",
        _toleration(key="k", operator="In"),
        "spec.tolerations[0].operator",
    ),
    Case(
        "toleration-bad-effect",
        _toleration(key="k", operator="Exists", effect="Sometimes"),
        "spec.tolerations[0].effect",
    ),
    Case(
        "toleration-exists-with-value",
        _toleration(key="k", operator="Exists", value="v"),
        "spec.tolerations[0].value",
    ),
    Case(
        "toleration-empty-key-equal",
        _toleration(operator="Equal", value="v"),
        "spec.tolerations[0].operator",
    ),
    Case(
        "toleration-seconds-without-noexecute",
        _toleration(key="k", operator="Exists", effect="NoSchedule", tolerationSeconds=5),
        "spec.tolerations[0].tolerationSeconds",
    ),
    Case(
        "toleration-bad-key",
        _toleration(key="bad key", operator="Exists"),
        "spec.tolerations[0].key",
    ),
    Case(
        "toleration-bad-value",
        _toleration(key="k", operator="Equal", value="not a label value"),
        "spec.tolerations[0].value",
    ),
    Case(
        "name-and-namespace-too-long",
        _named(lambda namespace: "m" * (42 - len(namespace))),
        "metadata.name",
    ),
    Case("name-not-dns", _named(lambda _: "Mod_1"), "metadata.name"),
    Case(
        "max-unavailable-zero",
        _spec(lambda spec: spec.update(rollout={"maxUnavailable": 0})),
        "spec.rollout.maxUnavailable",
    ),
    Case(
        "max-unavailable-over-100-percent",
        _spec(lambda spec: spec.update(rollout={"maxUnavailable": "150%"})),
        "spec.rollout.maxUnavailable",
    ),
    Case("selector-missing", _spec(lambda spec: spec.pop("selector")), "spec.selector"),
    Case(
        "image-pull-policy-unknown",
        _container(lambda c: c.update(imagePullPolicy="Sometimes")),
        f"{C}.imagePullPolicy",
    ),
    # Checked by CEL as far as it can: an RE2 pattern that does not compile, an
    # image naming a variable nobody knows.
    Case(
        "regexp-lookahead",
        _mapping(regexp="^6(?=\\.8)"),
        f"{C}.kernelMappings[0].regexp",
    ),
    Case(
        "image-unknown-variable",
        _mapping(containerImage="quay.io/org/mod:${KERNEL_VER}"),
        f"{C}.kernelMappings[0].containerImage",
    ),
    Case(
        "build-arg-unknown-variable",
        _container(
            lambda c: c.update(
                build={
                    "dockerfileConfigMap": {"name": "df"},
                    "buildArgs": [{"name": "K", "value": "$KERNEL"}],
                }
            )
        ),
        f"{C}.build.buildArgs[0].value",
    ),
    Case(
        "sign-no-files",
        _container(lambda c: c.update(sign=sign(filesToSign=[]))),
        f"{C}.sign.filesToSign",
    ),
    Case(
        "sign-file-relative",
        _container(lambda c: c.update(sign=sign(filesToSign=["lib/modules/mod.ko"]))),
        f"{C}.sign.filesToSign[0]",
    ),
    Case(
        "sign-file-outside-dir-name",
        _container(lambda c: c.update(sign=sign(filesToSign=["/usr/lib/modules/mod.ko"]))),
        f"{C}.sign.filesToSign[0]",
        admission_path=f"{C}.sign.filesToSign",
    ),
    Case(
        "sign-file-shell-characters",
        _container(lambda c: c.update(sign=sign(filesToSign=["/opt/mod.ko; rm -rf /"]))),
        f"{C}.sign.filesToSign[0]",
    ),
    Case(
        "sign-file-unknown-variable",
        _container(lambda c: c.update(sign=sign(filesToSign=["/opt/lib/modules/${KERNEL}/m.ko"]))),
        f"{C}.sign.filesToSign[0]",
    ),
    Case(
        "mapping-sign-file-outside-dir-name",
        _mapping(sign=sign(filesToSign=["/lib/modules/mod.ko"])),
        f"{C}.kernelMappings[0].sign.filesToSign[0]",
        admission_path=f"{C}.kernelMappings",
    ),
    Case(
        "sign-without-key-secret",
        _container(lambda c: c.update(sign=sign(keySecret=None))),
        f"{C}.sign.keySecret",
    ),
    Case(
        "sign-nothing-to-sign",
        _container(lambda c: c.update(sign=sign(unsignedImage=None))),
        f"{C}.kernelMappings[0].sign",
        admission_path=f"{C}.kernelMappings",
    ),
    Case(
        "sign-unsigned-image-no-tag",
        _mapping(sign=sign(unsignedImage="quay.io/org/mod-unsigned")),
        f"{C}.kernelMappings[0].sign.unsignedImage",
    ),
    Case(
        "sign-image-pinned-by-digest",
        _mapping(containerImage="quay.io/org/mod@sha256:" + "a" * 64, sign=sign()),
        f"{C}.kernelMappings[0].containerImage",
        admission_path=f"{C}.kernelMappings",
    ),
    # What CEL cannot check; admission lets these through and kmodkit's own
    # validation (and the engine) reject them.
    Case(
        "image-unclosed-brace",
        _mapping(containerImage="quay.io/org/mod:${KERNEL_XYZ"),
        f"{C}.kernelMappings[0].containerImage",
        admission=False,
    ),
    Case(
        "image-uppercase-repository",
        _mapping(containerImage="quay.io/Org/mod:v1"),
        f"{C}.kernelMappings[0].containerImage",
        admission=False,
    ),
]
