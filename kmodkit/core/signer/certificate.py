"""The signing certificate's names and serial, read from its DER, for the log.

Pure and stdlib-only: the few fields a log line and ``modinfo`` show (the
subject, the issuer's common name as ``signer``, the serial as ``sig_key``),
read from the X.509 structure (RFC 5280 §4.1) with a minimal DER reader. The
certificate is public; the private key is never read here or anywhere else in
the signer: ``sign-file`` alone opens it.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

_PEM_RE = re.compile(rb"-----BEGIN CERTIFICATE-----(.+?)-----END CERTIFICATE-----", re.DOTALL)
_SEQUENCE, _SET, _INTEGER, _OID = 0x30, 0x31, 0x02, 0x06
_NAMES = {
    "2.5.4.3": "CN",
    "2.5.4.5": "serialNumber",
    "2.5.4.6": "C",
    "2.5.4.7": "L",
    "2.5.4.8": "ST",
    "2.5.4.10": "O",
    "2.5.4.11": "OU",
    "1.2.840.113549.1.9.1": "emailAddress",
}


@dataclass(frozen=True)
class Certificate:
    subject: str  # "CN=..., O=...", in the certificate's order
    issuer: str
    issuer_common_name: str  # what modinfo prints as ``signer``
    serial: str  # colon-separated upper-case hex, as modinfo prints ``sig_key``


class CertificateError(ValueError):
    pass


def read_certificate(data: bytes) -> Certificate:
    """Parse a PEM or DER X.509 certificate (the two forms sign-file takes)."""
    pem = _PEM_RE.search(data)
    if pem is not None:
        try:
            data = base64.b64decode(b"".join(pem[1].split()), validate=True)
        except binascii.Error:
            raise CertificateError("its PEM block is not base64") from None
    elif b"-----BEGIN" in data:
        raise CertificateError("it is PEM but holds no CERTIFICATE block")
    try:
        certificate, _ = _tlv(data, 0, _SEQUENCE)
        tbs, _ = _tlv(certificate, 0, _SEQUENCE)
        pos = 0
        if tbs[:1] == b"\xa0":  # [0] version, absent for v1
            _, pos = _tlv(tbs, pos, 0xA0)
        serial, pos = _tlv(tbs, pos, _INTEGER)
        _, pos = _tlv(tbs, pos, _SEQUENCE)  # signature algorithm
        issuer, pos = _tlv(tbs, pos, _SEQUENCE)
        _, pos = _tlv(tbs, pos, _SEQUENCE)  # validity
        subject, pos = _tlv(tbs, pos, _SEQUENCE)
        issuer_names, subject_names = _name(issuer), _name(subject)
    except (IndexError, ValueError):
        raise CertificateError("it is not an X.509 certificate (PEM or DER)") from None
    # DER keeps a leading zero byte on a positive serial whose top bit is set; the kernel
    # and modinfo drop it.
    serial = serial[1:] if len(serial) > 1 and serial[0] == 0 else serial
    return Certificate(
        subject=_render(subject_names),
        issuer=_render(issuer_names),
        issuer_common_name=next((v for k, v in issuer_names if k == "CN"), ""),
        serial=":".join(f"{b:02X}" for b in serial),
    )


def _tlv(data: bytes, pos: int, tag: int) -> tuple[bytes, int]:
    """The value of the DER element at ``pos`` (which must carry ``tag``), and where the
    next element starts."""
    if data[pos] != tag:
        raise ValueError(f"expected tag {tag:#x} at {pos}")
    length = data[pos + 1]
    pos += 2
    if length & 0x80:
        count = length & 0x7F
        if not 0 < count <= 4:
            raise ValueError("bad length")
        length = int.from_bytes(data[pos : pos + count], "big")
        pos += count
    end = pos + length
    if end > len(data):
        raise ValueError("truncated")
    return data[pos:end], end


def _name(der: bytes) -> list[tuple[str, str]]:
    names: list[tuple[str, str]] = []
    pos = 0
    while pos < len(der):
        rdn, pos = _tlv(der, pos, _SET)
        at = 0
        while at < len(rdn):
            pair, at = _tlv(rdn, at, _SEQUENCE)
            oid, after = _tlv(pair, 0, _OID)
            value, _ = _tlv(pair, after, pair[after])  # any string type: UTF8, Printable, IA5
            text = oid_text(oid)
            names.append((_NAMES.get(text, text), value.decode("utf-8", "replace")))
    return names


def oid_text(der: bytes) -> str:
    """An OBJECT IDENTIFIER's value in dotted form."""
    first = der[0]
    parts = [min(first // 40, 2), first - 40 * min(first // 40, 2)]
    value = 0
    for byte in der[1:]:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            parts.append(value)
            value = 0
    return ".".join(str(p) for p in parts)


def _render(names: list[tuple[str, str]]) -> str:
    return ", ".join(f"{k}={v}" for k, v in names)
