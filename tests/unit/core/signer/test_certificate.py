"""The signing certificate's names and serial, read as modinfo shows them."""

from __future__ import annotations

import base64
import re

import pytest

from kmodkit.core.signer.certificate import CertificateError, read_certificate

# Self-signed, X.509 v3 (openssl req -x509 -subj "/CN=kmodkit test signer/O=kmodkit tests").
SELF_SIGNED = b"""-----BEGIN CERTIFICATE-----
MIIDTzCCAjegAwIBAgIUN1lsTkTWEVmmaZ6BaeRkzH9JpeEwDQYJKoZIhvcNAQEL
BQAwNjEcMBoGA1UEAwwTa21vZGtpdCB0ZXN0IHNpZ25lcjEWMBQGA1UECgwNa21v
ZGtpdCB0ZXN0czAgFw0yNjEyMDIwNjIyNDBaGA8yMTI2MTEwODA2MjI0MFowNjEc
MBoGA1UEAwwTa21vZGtpdCB0ZXN0IHNpZ25lcjEWMBQGA1UECgwNa21vZGtpdCB0
ZXN0czCCASIwDQYJKoZIhvcNAQEBBQADggEPADCCAQoCggEBAKeGpVhJZC39i+xv
Brjz1Rx9Rl9zIdgOoT9Y//ioJySnOJgDZRRkYwgBVVs+xhekKwmwP9JpJMWpx9xw
7t3IBCBfWqa8ZHWq7TLiEL9v32j3ERj3+K8ZDa91SJvqFZG7EEK5C5INtyAd9G8R
QedGeYa7IBx9r5hKitUmqAQrY9pBvFlbWLWWPIbyYJipYeiPA2LIWcH8wQ9c/XM5
Lpx6cPuHaDN9x4NKBXU/Hp9YmivdqKppAzHgpOwFmGmaitT+Pdvil61ra+As3U+y
Z/SYakrBcJKICfapSJh9FY6en1spjqPkFmUv42kdJilj7OUMljZwgvozGK20jK0X
q4J+Y4MCAwEAAaNTMFEwHQYDVR0OBBYEFE/JceCWHG7Cq7aoSODGb3ab6r0BMB8G
A1UdIwQYMBaAFE/JceCWHG7Cq7aoSODGb3ab6r0BMA8GA1UdEwEB/wQFMAMBAf8w
DQYJKoZIhvcNAQELBQADggEBAG0S6voKGd9v+e1GvH9v7ZuTfzaZd0SgvyU58WhI
PZZ+sfwWrj1lCeplUZ44GjpLb63JssD9fvXAGsQCGrXvOOgczyUXaXtUAK3lZar8
Hn2Ff2pqqkk/Opao7ZiN0aVQYBzA/+uWDLMUlal51nTwE2Zv3MBQx78lu7qPdnfu
KvNAJ8tcxXZXuo2YNjcEgx+6slStoQbNSB0QBwNmFCz64GKL9st0SHLyxNi4KPyn
h8yC36J/cxdOLS0WehRvmqzk4ob5lXaSlqgr+wFQhr8/KipAyjmZZ63HXu9AQHYR
ePYsKe3kJ00v694FYFZS89BS4okmHDv77XQVciC4+x/uSdY=
-----END CERTIFICATE-----
"""

# Issued by "CN=Build CA, O=Example", X.509 v1 (no version field), serial 0x80a1b2 (DER
# writes it with a leading zero byte).
ISSUED = b"""-----BEGIN CERTIFICATE-----
MIIC1jCCAb4CBACAobIwDQYJKoZIhvcNAQELBQAwJTERMA8GA1UEAwwIQnVpbGQg
Q0ExEDAOBgNVBAoMB0V4YW1wbGUwIBcNMjYxMjAyMDYyOTE3WhgPMjEyNjExMDgw
NjI5MTdaMDgxCzAJBgNVBAYTAkRFMRAwDgYDVQQKDAdFeGFtcGxlMRcwFQYDVQQD
DA5Nb2R1bGUgc2lnbmluZzCCASIwDQYJKoZIhvcNAQEBBQADggEPADCCAQoCggEB
ALDsh+ULn8b+0+QUo2H0kiygESSOMcPisM3/wm/M0sklp9zgnz2njMhhLrcrtGC7
3JcQkKp7Mjqe4ehTLkTI/zTJrC4Je6eefmKk6KyDRs0+sZ/hus9ac6Hi/o29VG2N
qvxWUWFyb2qt4CNM3NmYO0Zw5z9E4pggUJjvjUmmOybJXEAgree+Rug0wjJv1bNr
3AM7PIWYTn6FGkW4Bz/Gnln3CRBz3cdpw+0VLrUzWJ5xBETko/4fqaOByaD2xE7w
GltoJlw6NfzV12IyByTyn9jlg83n1esMzCbVx3nhgD5R3KhBr0yJ/33qT3/jsApz
UMyPb818htLE4GQ1rR7cNVsCAwEAATANBgkqhkiG9w0BAQsFAAOCAQEAPsA5EM0A
IlBGv55SJwpSl+epmI1upXE56YgSSr29V3U/zzrIUCQbNpa6e5ZKbcluGHLv/cBr
mwwawPC3qVQEoMADp9Arp3BK6WkocfkXwTK7HfvIHx/+D0lLE49EHz69s5EzrNpe
y8df2nK6qOrsk8PyYqksQcLrlKL9DDz86oz0W3Avy6d6G5O1c9zAUT12FaNjEsFn
Su/ASgHEq2ezaDCfnySsz9kLkGS9f2dr5IIMpQx0/h/lr1xsOuQ5yYFRN5t1Mv5A
0kFMtG11EbQ+HOMVDjEmOP3ckFNgL9Qg+Gi09bsAScc6pVhgDN+kCsWKIvounsEy
AkfGs0XU0G9y8Q==
-----END CERTIFICATE-----
"""


def _der(pem: bytes) -> bytes:
    body = re.search(rb"-----BEGIN CERTIFICATE-----(.+)-----END", pem, re.DOTALL)
    assert body is not None
    return base64.b64decode(b"".join(body[1].split()))


def test_a_self_signed_certificate_gives_its_names_and_serial() -> None:
    cert = read_certificate(SELF_SIGNED)
    assert cert.subject == "CN=kmodkit test signer, O=kmodkit tests"
    assert cert.issuer == cert.subject
    assert cert.issuer_common_name == "kmodkit test signer"
    assert cert.serial == "37:59:6C:4E:44:D6:11:59:A6:69:9E:81:69:E4:64:CC:7F:49:A5:E1"


def test_an_issued_v1_certificate_names_its_issuer_as_signer_and_drops_the_sign_byte() -> None:
    cert = read_certificate(ISSUED)
    assert cert.subject == "C=DE, O=Example, CN=Module signing"
    assert cert.issuer == "CN=Build CA, O=Example"
    assert cert.issuer_common_name == "Build CA"
    assert cert.serial == "80:A1:B2"


def test_der_reads_as_pem_does() -> None:
    assert read_certificate(_der(SELF_SIGNED)) == read_certificate(SELF_SIGNED)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n", "no CERTIFICATE"),
        (b"not a certificate", "not an X.509 certificate"),
        (b"\n".join([*SELF_SIGNED.splitlines()[:6], b"-----END CERTIFICATE-----"]), "not an X.509"),
        (SELF_SIGNED.replace(b"MIID", b"M!ID"), "not base64"),
        (_der(SELF_SIGNED)[:200], "not an X.509 certificate"),
    ],
)
def test_what_is_not_a_certificate_is_refused(data: bytes, message: str) -> None:
    with pytest.raises(CertificateError, match=message):
        read_certificate(data)
