"""KMM's ``spec.devicePlugin``: the device plugin a Module runs where its driver is loaded.

The shape is KMM's (``container``, ``initContainer``, ``serviceAccountName``,
``volumes``, ``automountServiceAccountToken``), narrowed to what a device
plugin needs: environment values are literal or taken from a field, a ConfigMap
key or a Secret key; volumes are hostPath (under /dev, /sys, /var, /opt or /run, as
KMM's webhook allows), ConfigMap, Secret or emptyDir.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from kmodkit.core.api.base import ImageRef, KubeModel, ObjectName, ShortName, Text, cel, cel_rules
from kmodkit.core.api.common import LocalObjectReference

# A path segment that is not "." or "..", spelt without lookaround (RE2).
_SEGMENT = r"(?:[^/.][^/]*|[.][^/.][^/]*|[.][.][^/]+)"
HOST_PATH_RE = rf"^/(?:dev|sys|var|opt|run)(?:/{_SEGMENT}?)*$"
HOST_PATH_MSG = (
    "must be /dev, /sys, /var, /opt or /run, or a path beneath one, without '.' or '..' "
    "segments (as KMM allows for device plugins)"
)

VOLUME_SOURCE_MSG = "give exactly one of hostPath, configMap, secret, emptyDir"


class FieldRef(KubeModel):
    field_path: Text


class KeyRef(KubeModel):
    name: ObjectName
    key: ShortName


class EnvVarSource(KubeModel):
    field_ref: FieldRef | None = None
    config_map_key_ref: KeyRef | None = None
    secret_key_ref: KeyRef | None = None


class EnvVar(KubeModel):
    """An environment variable: a literal value, or one the kubelet fills in."""

    name: ShortName
    value: Text | None = None
    value_from: EnvVarSource | None = None


class VolumeMount(KubeModel):
    name: ShortName
    mount_path: Text
    read_only: bool | None = None
    sub_path: Text | None = None


class Resources(KubeModel):
    limits: dict[str, Annotated[str, Field(max_length=64)]] | None = Field(
        default=None, max_length=16
    )
    requests: dict[str, Annotated[str, Field(max_length=64)]] | None = Field(
        default=None, max_length=16
    )


class DevicePluginContainer(KubeModel):
    """KMM's CommonContainerSpec."""

    image: ImageRef = Field(min_length=1)
    command: list[Text] | None = Field(default=None, max_length=64)
    args: list[Text] | None = Field(default=None, max_length=64)
    env: list[EnvVar] | None = Field(default=None, max_length=64)
    image_pull_policy: Literal["", "Always", "IfNotPresent", "Never"] | None = None
    resources: Resources | None = None
    volume_mounts: list[VolumeMount] | None = Field(default=None, max_length=32)
    """Added to the kubelet's device-plugin directory, which is always mounted."""


class HostPath(KubeModel):
    path: Annotated[
        str,
        Field(
            max_length=1024,
            json_schema_extra=cel_rules(
                cel(f"self.matches('{HOST_PATH_RE}')", HOST_PATH_MSG, subject="path")
            ),
        ),
    ]
    type: ShortName | None = None


class SecretVolume(KubeModel):
    secret_name: ObjectName


class EmptyDir(KubeModel):
    medium: Literal["", "Memory"] | None = None


class Volume(KubeModel):
    """One volume of the device plugin's pods: exactly one source."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            cel(
                "[has(self.hostPath), has(self.configMap), has(self.secret), "
                "has(self.emptyDir)].filter(x, x).size() == 1",
                VOLUME_SOURCE_MSG,
            )
        )
    )

    name: ShortName
    host_path: HostPath | None = None
    config_map: LocalObjectReference | None = None
    secret: SecretVolume | None = None
    empty_dir: EmptyDir | None = None


class DevicePlugin(KubeModel):
    """The device plugin, run as a DaemonSet on the nodes where the module is ready."""

    container: DevicePluginContainer
    init_container: DevicePluginContainer | None = None
    service_account_name: ShortName | None = None
    volumes: list[Volume] | None = Field(default=None, max_length=32)
    automount_service_account_token: bool | None = None
